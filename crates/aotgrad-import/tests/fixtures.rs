//! Every fixture exported by `fixtures/export_fixtures.py`, in both forms (the
//! training IR and core ATen), imported and run eagerly and compiled (the training
//! path, and the inference path under no-grad): outputs,
//! gradients of the loss `sum_k (output_k * cotangent_k).sum()` with respect to every
//! parameter, and buffers after the call, against PyTorch's values in
//! `NAME.ref.safetensors`.
//!
//! Tolerances (f32 models): values agree within `ATOL + RTOL * max|PyTorch's|`
//! element by element; PyTorch and aotgrad sum in different orders.

use aotgrad::import::ImportedModule;
use aotgrad::prelude::*;
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

const ATOL: f64 = 2e-5;
const RTOL: f64 = 2e-4;

const FORMS: &[&str] = &["", ".core"];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

struct Reference {
    tensors: HashMap<String, Tensor>,
}

impl Reference {
    fn load(model: &str) -> Reference {
        let bytes = std::fs::read(fixture(&format!("{model}.ref.safetensors"))).expect("reference file");
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        let mut tensors = HashMap::new();
        for (name, v) in st.tensors() {
            let shape = v.shape().to_vec();
            let d = v.data();
            let t = match v.dtype() {
                safetensors::Dtype::F32 => Tensor::from_vec(
                    d.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
                    &shape,
                ),
                safetensors::Dtype::I64 => Tensor::from_vec(
                    d.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
                    &shape,
                ),
                other => panic!("{name}: unexpected dtype {other:?}"),
            };
            tensors.insert(name, t.unwrap());
        }
        Reference { tensors }
    }

    fn numbered(&self, prefix: &str) -> Vec<Tensor> {
        (0..).map_while(|k| self.tensors.get(&format!("{prefix}.{k}")).cloned()).collect()
    }

    fn get(&self, key: &str) -> &Tensor {
        self.tensors.get(key).unwrap_or_else(|| panic!("no `{key}` in the reference"))
    }
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.sizes().unwrap(), want.sizes().unwrap(), "{what}: shape");
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let tol = ATOL + RTOL * scale;
    let mut worst = (0.0f64, 0usize);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let d = if a.is_nan() != b.is_nan() {
            f64::INFINITY
        } else if a.is_nan() {
            0.0
        } else {
            (a - b).abs()
        };
        if d > worst.0 {
            worst = (d, i);
        }
    }
    let (worst, at) = worst;
    assert!(
        worst <= tol,
        "{what}: element {at} differs by {worst:e} (got {}, PyTorch {}), tolerance {tol:e}",
        g[at],
        w[at]
    );
}

fn loss_of(outs: &[Tensor], cots: &[Tensor]) -> Tensor {
    let mut loss: Option<Tensor> = None;
    for (o, c) in outs.iter().zip(cots) {
        let term = o.mul(c).unwrap().sum_all().unwrap();
        loss = Some(match loss {
            None => term,
            Some(l) => l.add(&term).unwrap(),
        });
    }
    loss.expect("an output")
}

fn check_buffers(what: &str, m: &dyn Module, r: &Reference) {
    for (name, t) in m.store().buffers() {
        let want = r.get(&format!("buffer.{name}"));
        if t.dtype() == DType::I64 {
            assert_eq!(t.to_vec_i64().unwrap(), want.to_vec_i64().unwrap(), "{what}: buffer {name}");
        } else {
            assert_close(&format!("{what}: buffer {name}"), t, want);
        }
    }
}

fn check_eager(model: &str, form: &str) {
    let what = format!("{model}{form} eager");
    let r = Reference::load(model);
    let m = ImportedModule::load(fixture(&format!("{model}{form}.pt2"))).unwrap();
    let inputs = r.numbered("input");
    let outs = m.forward_eager(&inputs).unwrap();
    let want = r.numbered("output");
    assert_eq!(outs.len(), want.len(), "{what}: outputs");
    for (k, (o, w)) in outs.iter().zip(&want).enumerate() {
        assert_close(&format!("{what}: output {k}"), o, w);
    }
    loss_of(&outs, &r.numbered("cotangent")).backward().unwrap();
    for (name, p) in m.store().params() {
        let g = p.grad().unwrap_or_else(|| panic!("{what}: no gradient for {name}"));
        assert_close(&format!("{what}: gradient of {name}"), &g, r.get(&format!("grad.{name}")));
    }
    check_buffers(&what, &m, &r);
}

fn check_compiled(model: &str, form: &str) {
    let what = format!("{model}{form} compiled");
    let r = Reference::load(model);
    let m = Arc::new(ImportedModule::load(fixture(&format!("{model}{form}.pt2"))).unwrap());
    let compiled = aot_module(m.clone(), AotConfig::default().no_cache()).unwrap();
    let inputs = r.numbered("input");
    let (outs, pending) = compiled.forward(&inputs).unwrap();
    let want = r.numbered("output");
    assert_eq!(outs.len(), want.len(), "{what}: outputs");
    for (k, (o, w)) in outs.iter().zip(&want).enumerate() {
        assert_close(&format!("{what}: output {k}"), o, w);
    }
    let grads = pending.backward(&r.numbered("cotangent")).unwrap();
    for (name, _) in m.store().params() {
        let g = grads.param(name).unwrap_or_else(|| panic!("{what}: no gradient for {name}"));
        assert_close(&format!("{what}: gradient of {name}"), g, r.get(&format!("grad.{name}")));
    }
    check_buffers(&what, m.as_ref(), &r);
}

/// The inference path: the compiled call under no-grad on a fresh module.
fn check_compiled_inference(model: &str, form: &str) {
    let what = format!("{model}{form} compiled inference");
    let r = Reference::load(model);
    let m = Arc::new(ImportedModule::load(fixture(&format!("{model}{form}.pt2"))).unwrap());
    let compiled = aot_module(m.clone(), AotConfig::default().no_cache()).unwrap();
    let outs = no_grad(|| compiled.call(&r.numbered("input"))).unwrap();
    for (k, (o, w)) in outs.iter().zip(&r.numbered("output")).enumerate() {
        assert!(!o.is_requires_grad(), "{what}: output {k} requires grad under no_grad");
        assert_close(&format!("{what}: output {k}"), o, w);
    }
    check_buffers(&what, m.as_ref(), &r);
}

/// One test per model: both forms, eagerly and compiled.
macro_rules! fixture_tests {
    ($($model:ident),*) => {$(
        #[test]
        fn $model() {
            for form in FORMS {
                check_eager(stringify!($model), form);
                check_compiled(stringify!($model), form);
                check_compiled_inference(stringify!($model), form);
            }
        }
    )*};
}

fixture_tests!(mlp, cnn, resnet, mobilenet, encoder, gpt, ops);
