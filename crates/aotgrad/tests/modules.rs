//! `nn` building blocks and `aot_module` / `aot_module_simplified` on the inference
//! path: each block against a plain-Rust f64 reference, eager against compiled,
//! parameter naming, buffers updated through the compiled epilogue, and the
//! no-recompile contract of `aot_module_simplified`.

mod modules_util;

use aotgrad::nn::{
    Embedding, GeluMlp, LayerNorm, Linear, Mlp, Module, MultiHeadSelfAttention, ParamStore, Params, TransformerBlock,
};
use aotgrad::prelude::*;
use modules_util::{assert_close, attention_ref, data, gelu, layer_norm_ref, linear_ref, vals};
use std::sync::Arc;

fn param(m: &dyn Module, name: &str) -> Vec<f64> {
    vals(m.store().get(name).unwrap_or_else(|| panic!("no parameter {name}")))
}

/// Eager forward and compiled (inference path) forward agree.
fn eager_matches_compiled(m: Arc<dyn Module>, inputs: &[Tensor], tol: f64) -> Vec<Tensor> {
    let _g = NoGradGuard::new();
    let eager = m.forward_eager(inputs).expect("eager");
    let compiled = aot_module(m.clone(), AotConfig::default()).expect("aot_module");
    let out = compiled.call(inputs).expect("compiled call");
    assert_eq!(out.len(), eager.len());
    for (k, (a, b)) in out.iter().zip(&eager).enumerate() {
        assert_eq!(a.sizes().unwrap(), b.sizes().unwrap(), "output {k} shape");
        assert_close(&format!("output {k}"), &vals(a), &vals(b), tol, tol);
    }
    assert_eq!(compiled.function().num_compiled(), 1);
    eager
}

#[test]
fn linear_computes_x_wt_plus_b() {
    let lin = Linear::new(3, 4, true, DType::F64, 7).unwrap();
    let x = data(&[2, 3], DType::F64, 1, 1.0);
    let out = eager_matches_compiled(Arc::new(lin.clone()), std::slice::from_ref(&x), 1e-12);
    let want = linear_ref(&vals(&x), 2, 3, &param(&lin, "weight"), Some(&param(&lin, "bias")), 4);
    assert_close("linear", &vals(&out[0]), &want, 1e-12, 1e-12);
    // PyTorch's default init: weight and bias within ±1/sqrt(in_features), not all equal.
    let bound = 1.0 / 3f64.sqrt();
    let w = param(&lin, "weight");
    assert!(w.iter().chain(&param(&lin, "bias")).all(|v| v.abs() <= bound));
    assert!(w.iter().any(|&v| (v - w[0]).abs() > 1e-3));
    assert_eq!(lin.store().names(), vec!["weight", "bias"]);
    assert!(lin.store().params().iter().all(|(_, t)| t.is_requires_grad() && t.is_leaf()));
    let no_bias = Linear::new(3, 4, false, DType::F64, 7).unwrap();
    assert_eq!(no_bias.store().names(), vec!["weight"]);
}

#[test]
fn layer_norm_and_embedding_match_references() {
    let ln = LayerNorm::new(5, 1e-5, DType::F64).unwrap();
    {
        let _g = NoGradGuard::new();
        ln.store().get("weight").unwrap().copy_(&data(&[5], DType::F64, 3, 2.0)).unwrap();
        ln.store().get("bias").unwrap().copy_(&data(&[5], DType::F64, 4, 1.0)).unwrap();
    }
    let x = data(&[3, 5], DType::F64, 2, 3.0);
    let out = eager_matches_compiled(Arc::new(ln.clone()), std::slice::from_ref(&x), 1e-12);
    let want = layer_norm_ref(&vals(&x), 5, &param(&ln, "weight"), &param(&ln, "bias"), 1e-5);
    assert_close("layer_norm", &vals(&out[0]), &want, 1e-10, 1e-10);

    let emb = Embedding::new(6, 3, DType::F32, 9).unwrap();
    let idx = Tensor::from_i64(&[5, 0, 2, 2], &[2, 2]).unwrap();
    let out = eager_matches_compiled(Arc::new(emb.clone()), &[idx], 0.0);
    assert_eq!(out[0].sizes().unwrap(), vec![2, 2, 3]);
    let w = param(&emb, "weight");
    let want: Vec<f64> = [5, 0, 2, 2].iter().flat_map(|&r| w[r * 3..r * 3 + 3].to_vec()).collect();
    assert_eq!(vals(&out[0]), want);
}

#[test]
fn mlps_match_references() {
    let mlp = Mlp::new(&[4, 6, 3], DType::F64, 11).unwrap();
    assert_eq!(mlp.store().names(), vec!["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]);
    let x = data(&[5, 4], DType::F64, 12, 2.0);
    let out = eager_matches_compiled(Arc::new(mlp.clone()), std::slice::from_ref(&x), 1e-12);
    let h: Vec<f64> =
        linear_ref(&vals(&x), 5, 4, &param(&mlp, "layers.0.weight"), Some(&param(&mlp, "layers.0.bias")), 6)
            .into_iter()
            .map(gelu)
            .collect();
    let want: Vec<f64> = linear_ref(&h, 5, 6, &param(&mlp, "layers.1.weight"), Some(&param(&mlp, "layers.1.bias")), 3)
        .into_iter()
        .map(gelu)
        .collect();
    assert_close("mlp", &vals(&out[0]), &want, 1e-12, 1e-12);

    let gm = GeluMlp::new(4, 8, 2, DType::F64, 13).unwrap();
    assert_eq!(gm.store().names(), vec!["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
    let out = eager_matches_compiled(Arc::new(gm.clone()), std::slice::from_ref(&x), 1e-12);
    let h: Vec<f64> = linear_ref(&vals(&x), 5, 4, &param(&gm, "fc1.weight"), Some(&param(&gm, "fc1.bias")), 8)
        .into_iter()
        .map(gelu)
        .collect();
    let want = linear_ref(&h, 5, 8, &param(&gm, "fc2.weight"), Some(&param(&gm, "fc2.bias")), 2);
    assert_close("gelu_mlp", &vals(&out[0]), &want, 1e-12, 1e-12);
}

/// Attention of `x` `(2, 4, 8)` through `m`, and the reference from its parameters.
fn check_attention(m: &MultiHeadSelfAttention, fused: bool) {
    let (b, s, d) = (2, 4, 8);
    let x = data(&[b, s, d], DType::F64, 21, 1.5);
    let out = eager_matches_compiled(Arc::new(m.clone()), std::slice::from_ref(&x), 1e-12);
    let xv = vals(&x);
    let proj = |name: &str, rows: usize| {
        linear_ref(&xv, b * s, d, &param(m, &format!("{name}.weight")), Some(&param(m, &format!("{name}.bias"))), rows)
    };
    let (q, k, v) = if fused {
        let y = proj("qkv", 3 * d);
        let part = |p: usize| y.chunks(3 * d).flat_map(|row| row[p * d..(p + 1) * d].to_vec()).collect::<Vec<_>>();
        (part(0), part(1), part(2))
    } else {
        (proj("q", d), proj("k", d), proj("v", d))
    };
    let ctx = attention_ref(&q, &k, &v, b, s, d, m.num_heads);
    let want = linear_ref(&ctx, b * s, d, &param(m, "out.weight"), Some(&param(m, "out.bias")), d);
    assert_close("attention", &vals(&out[0]), &want, 1e-12, 1e-10);
}

#[test]
fn attention_matches_reference_fused_and_separate() {
    let fused = MultiHeadSelfAttention::new(8, 2, true, DType::F64, 5).unwrap();
    assert_eq!(fused.store().names(), vec!["qkv.weight", "qkv.bias", "out.weight", "out.bias"]);
    check_attention(&fused, true);
    let sep = MultiHeadSelfAttention::new(8, 4, false, DType::F64, 6).unwrap();
    assert_eq!(
        sep.store().names(),
        vec!["q.weight", "q.bias", "k.weight", "k.bias", "v.weight", "v.bias", "out.weight", "out.bias"]
    );
    check_attention(&sep, false);
    let err = MultiHeadSelfAttention::new(10, 4, true, DType::F32, 0).unwrap_err();
    assert!(err.to_string().contains("d_model (10) must be a positive multiple of num_heads (4)"), "{err}");
    let err = fused.forward_eager(&[data(&[4, 8], DType::F64, 0, 1.0)]).unwrap_err();
    assert!(err.to_string().contains("expected an input of shape (batch, seq, 8), got rank 2"), "{err}");
}

#[test]
fn transformer_block_matches_reference() {
    let (b, s, d) = (2, 4, 16);
    let blk = TransformerBlock::new(d, 2, DType::F64, 31).unwrap();
    assert_eq!(
        blk.store().names().join(" "),
        "ln1.weight ln1.bias attn.qkv.weight attn.qkv.bias attn.out.weight attn.out.bias ln2.weight ln2.bias \
         mlp.fc1.weight mlp.fc1.bias mlp.fc2.weight mlp.fc2.bias"
    );
    {
        let _g = NoGradGuard::new();
        for (k, n) in ["ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"].iter().enumerate() {
            blk.store().get(n).unwrap().add_(&data(&[d], DType::F64, 40 + k as u64, 0.5)).unwrap();
        }
    }
    let x = data(&[b, s, d], DType::F64, 32, 1.0);
    let out = eager_matches_compiled(Arc::new(blk.clone()), std::slice::from_ref(&x), 1e-12);
    let p = |n: &str| param(&blk, n);
    let xv = vals(&x);
    let n1 = layer_norm_ref(&xv, d, &p("ln1.weight"), &p("ln1.bias"), 1e-5);
    let qkv = linear_ref(&n1, b * s, d, &p("attn.qkv.weight"), Some(&p("attn.qkv.bias")), 3 * d);
    let part = |k: usize| qkv.chunks(3 * d).flat_map(|row| row[k * d..(k + 1) * d].to_vec()).collect::<Vec<_>>();
    let ctx = attention_ref(&part(0), &part(1), &part(2), b, s, d, 2);
    let a = linear_ref(&ctx, b * s, d, &p("attn.out.weight"), Some(&p("attn.out.bias")), d);
    let h: Vec<f64> = xv.iter().zip(&a).map(|(x, a)| x + a).collect();
    let n2 = layer_norm_ref(&h, d, &p("ln2.weight"), &p("ln2.bias"), 1e-5);
    let f1: Vec<f64> = linear_ref(&n2, b * s, d, &p("mlp.fc1.weight"), Some(&p("mlp.fc1.bias")), 4 * d)
        .into_iter()
        .map(gelu)
        .collect();
    let f2 = linear_ref(&f1, b * s, 4 * d, &p("mlp.fc2.weight"), Some(&p("mlp.fc2.bias")), d);
    let want: Vec<f64> = h.iter().zip(&f2).map(|(h, m)| h + m).collect();
    assert_close("block", &vals(&out[0]), &want, 1e-10, 1e-10);
}

#[test]
fn f32_transformer_block_eager_equals_compiled() {
    let blk = TransformerBlock::new(16, 2, DType::F32, 3).unwrap();
    eager_matches_compiled(Arc::new(blk), &[data(&[2, 4, 16], DType::F32, 4, 1.0)], 1e-5);
    let mlp = Mlp::new(&[32; 5], DType::F32, 8).unwrap();
    eager_matches_compiled(Arc::new(mlp), &[data(&[8, 32], DType::F32, 9, 1.0)], 1e-5);
}

/// A module with a buffer updated under no-grad: `running_mean = 0.9 running_mean + 0.1 mean(x, 0)`.
struct RunningMean {
    store: ParamStore,
}

impl RunningMean {
    fn new() -> RunningMean {
        let mut store = ParamStore::new();
        store.add_param("scale", Tensor::from_f64(&[2.0, -1.0, 0.5], &[3], DType::F64).unwrap()).unwrap();
        store.add_buffer("running_mean", Tensor::zeros(&[3], DType::F64).unwrap()).unwrap();
        RunningMean { store }
    }
}

impl Module for RunningMean {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        let x = &inputs[0];
        let rm = p.get("running_mean")?;
        no_grad(|| -> aotgrad::Result<()> {
            rm.mul_(0.9)?;
            rm.add_(&x.mean(&[0], false)?.mul(0.1)?)?;
            Ok(())
        })?;
        Ok(vec![x.sub(rm)?.mul(p.get("scale")?)?])
    }
}

#[test]
fn buffer_mutation_is_written_back_like_eager() {
    let x = Tensor::from_f64(&[1.0, 2.0, 3.0, 3.0, 4.0, 5.0], &[2, 3], DType::F64).unwrap();
    let eager = RunningMean::new();
    let compiled_m = Arc::new(RunningMean::new());
    let compiled = aot_module(compiled_m.clone(), AotConfig::default()).unwrap();
    let _g = NoGradGuard::new();
    for step in 0..2 {
        let want = eager.forward_eager(std::slice::from_ref(&x)).unwrap();
        let got = compiled.call(std::slice::from_ref(&x)).unwrap();
        assert_close("output", &vals(&got[0]), &vals(&want[0]), 1e-12, 0.0);
        let rm = vals(compiled_m.store().get("running_mean").unwrap());
        // Hand-derived: mean over rows is [2, 3, 4]; after n steps rm = (1 - 0.9^n) * mean.
        let f = 1.0 - 0.9f64.powi(step + 1);
        assert_close("running_mean", &rm, &[2.0 * f, 3.0 * f, 4.0 * f], 1e-12, 0.0);
    }
    assert_eq!(compiled.function().num_compiled(), 1);
}

#[test]
fn param_store_and_params_errors() {
    let mut s = ParamStore::new();
    s.add_param("w", Tensor::zeros(&[2], DType::F32).unwrap()).unwrap();
    let err = s.add_buffer("w", Tensor::zeros(&[2], DType::F32).unwrap()).unwrap_err();
    assert!(err.to_string().contains("a tensor named `w` already exists"), "{err}");
    let err = s.add_param("i", Tensor::from_i64(&[1], &[1]).unwrap()).unwrap_err();
    assert!(err.to_string().contains("only tensors of floating point dtype can require gradients"), "{err}");
    let p = Params::from_store(&s).scope("block");
    let err = p.get("w").unwrap_err();
    assert!(err.to_string().contains("the module has no parameter or buffer named `block.w`"), "{err}");
    let lin = Linear::new(2, 2, true, DType::F32, 0).unwrap();
    let err = lin.forward_eager(&[]).unwrap_err();
    assert!(err.to_string().contains("Linear: expected 1 input(s), got 0"), "{err}");
}

#[test]
fn simplified_compiles_at_construction_and_refuses_other_metadata() {
    let _g = NoGradGuard::new();
    let m = Arc::new(RunningMean::new());
    let x = Tensor::from_f64(&[1.0, 2.0, 3.0, 3.0, 4.0, 5.0], &[2, 3], DType::F64).unwrap();
    let compiled = aot_module_simplified(m.clone(), std::slice::from_ref(&x), AotConfig::default()).unwrap();
    assert!(compiled.is_simplified());
    // Compiled ahead of time; compiling ran on private copies: the buffer is untouched.
    assert_eq!(compiled.function().num_compiled(), 1);
    assert_eq!(vals(m.store().get("running_mean").unwrap()), vec![0.0; 3]);
    let out = compiled.call(std::slice::from_ref(&x)).unwrap();
    assert_close("output", &vals(&out[0]), &[1.6, -1.7, 1.3, 5.6, -3.7, 2.3], 1e-12, 0.0);
    assert_close("running_mean", &vals(m.store().get("running_mean").unwrap()), &[0.2, 0.3, 0.4], 1e-12, 0.0);
    // Other data, same metadata: fine, still one compiled graph.
    compiled.call(&[x.add(1.0).unwrap()]).unwrap();
    assert_eq!(compiled.function().num_compiled(), 1);

    let err = compiled.call(&[Tensor::zeros(&[4, 3], DType::F64).unwrap()]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("input 0 has metadata f64[4, 3], compiled for f64[2, 3]"), "{msg}");
    assert!(msg.contains("aot_module_simplified compiled for its example inputs and does not recompile"), "{msg}");
    let err = compiled.call(&[x.t().unwrap()]).unwrap_err();
    assert!(err.to_string().contains("input 0 has metadata"), "{err}");
    let err = compiled.call(&[]).unwrap_err();
    assert!(err.to_string().contains("expected 1 input(s), got 0"), "{err}");
    drop(_g);
    let err = compiled.call(std::slice::from_ref(&x)).unwrap_err();
    assert!(err.to_string().contains("compiled with grad mode false, called with grad mode true"), "{err}");
    assert_eq!(compiled.function().num_compiled(), 1);

    // aot_module recompiles instead.
    let _g = NoGradGuard::new();
    let lazy = aot_module(m, AotConfig::default()).unwrap();
    assert_eq!(lazy.function().num_compiled(), 0);
    lazy.call(&[x]).unwrap();
    lazy.call(&[Tensor::zeros(&[4, 3], DType::F64).unwrap()]).unwrap();
    assert_eq!(lazy.function().num_compiled(), 2);
}

/// `dropout(x * scale, 0.5)` drawing from the global generator.
struct GlobalDropout {
    store: ParamStore,
}

impl Module for GlobalDropout {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        Ok(vec![inputs[0].mul(p.get("scale")?)?.dropout(0.5, true, aotgrad::trace::RngSeed::Global)?])
    }
}

#[test]
fn simplified_compiling_leaves_the_global_generator_alone() {
    let _g = NoGradGuard::new();
    let mut store = ParamStore::new();
    store.add_param("scale", Tensor::full(&[64], 3.0, DType::F32).unwrap()).unwrap();
    let m = Arc::new(GlobalDropout { store });
    let x = Tensor::ones(&[2, 64], DType::F32).unwrap();
    aotgrad::trace::manual_seed(5);
    let compiled = aot_module_simplified(m.clone(), std::slice::from_ref(&x), AotConfig::default()).unwrap();
    assert_eq!(aotgrad::trace::rng_state(), (5, 0));
    let got = vals(&compiled.call(std::slice::from_ref(&x)).unwrap()[0]);
    aotgrad::trace::manual_seed(5);
    let want = vals(&m.forward_eager(std::slice::from_ref(&x)).unwrap()[0]);
    assert_eq!(got, want, "the compiled call draws what the eager call draws");
    assert!(got.iter().all(|&v| v == 0.0 || v == 6.0));
    assert!(got.contains(&0.0) && got.contains(&6.0));
}

#[test]
fn aot_module_dynamic_dims_name_the_user_inputs() {
    // `(0, 0)`: the batch dim of the first *user* input, not of the first parameter.
    let lin = Arc::new(Linear::new(4, 3, true, DType::F32, 0).unwrap());
    let config = AotConfig { dynamic: vec![(0, 0)], ..AotConfig::default() };
    let m = aot_module(lin.clone(), config).unwrap();
    for batch in [2usize, 5, 7] {
        let x = Tensor::randn(&[batch, 4], DType::F32, batch as u64).unwrap();
        let out = no_grad(|| m.call(std::slice::from_ref(&x))).unwrap();
        let want = lin.forward_eager(&[x]).unwrap();
        assert_close("linear", &out[0].to_vec_f64().unwrap(), &want[0].to_vec_f64().unwrap(), 1e-6, 1e-5);
    }
    assert_eq!(m.function().num_compiled(), 1, "one entry with a symbolic batch serves every batch size");
    let traced = &m.function().traced_graphs()[0];
    assert!(traced.inputs[0].meta.is_concrete(), "the weight stays specialized: {}", traced.inputs[0].meta);
    assert!(!traced.inputs[2].meta.is_concrete(), "the input's batch is a symbol: {}", traced.inputs[2].meta);
}

#[test]
fn causal_attention_does_not_see_later_positions() {
    let attn = MultiHeadSelfAttention::new(8, 2, true, DType::F64, 3).unwrap();
    let causal = Arc::new(attn.clone().causal(true));
    let x = Tensor::randn(&[1, 4, 8], DType::F64, 1).unwrap();
    // Change only position 2.
    let mut v = x.to_vec_f64().unwrap();
    for e in &mut v[16..24] {
        *e += 1.0;
    }
    let x2 = Tensor::from_f64(&v, &[1, 4, 8], DType::F64).unwrap();
    let run = |m: &dyn Module, x: &Tensor| m.forward_eager(std::slice::from_ref(x)).unwrap()[0].to_vec_f64().unwrap();
    let (a, b) = (run(causal.as_ref(), &x), run(causal.as_ref(), &x2));
    assert_eq!(a[..16], b[..16], "positions 0 and 1 do not see position 2");
    assert_ne!(a[16..24], b[16..24]);
    let (c, d) = (run(&attn, &x), run(&attn, &x2));
    assert_ne!(c[..8], d[..8], "without the mask position 0 sees position 2");
    // Position 0 attends only to itself: its output is out(v_0), independent of the rest.
    let compiled = aot_module(causal.clone(), AotConfig::default()).unwrap();
    let out = no_grad(|| compiled.call(std::slice::from_ref(&x))).unwrap()[0].to_vec_f64().unwrap();
    assert_close("causal compiled", &out, &a, 1e-10, 1e-9);
    assert!(TransformerBlock::new(8, 2, DType::F64, 0).unwrap().causal(true).attn.causal);
}

/// A user module around built-in layers: a block, then a head.
struct Tagger {
    store: ParamStore,
    block: TransformerBlock,
    head: Linear,
}

/// The lines of `Tagger::forward`'s calls (asserted below).
const BLOCK_LINE: u32 = line!() + 14;
const HEAD_LINE: u32 = line!() + 14;
const OWN_LINE: u32 = line!() + 14;

impl Tagger {
    fn new() -> Tagger {
        let block = TransformerBlock::new(8, 2, DType::F64, 3).unwrap();
        let head = Linear::new(8, 3, true, DType::F64, 4).unwrap();
        let mut store = ParamStore::new();
        store.add_child("block", block.store()).unwrap();
        store.add_child("head", head.store()).unwrap();
        Tagger { store, block, head }
    }
    fn run(&self, p: &Params, x: &Tensor) -> aotgrad::Result<Tensor> {
        let h = self.block.forward(&p.scope("block"), std::slice::from_ref(x))?.remove(0);
        let y = self.head.apply(&p.scope("head"), &h)?;
        Ok(y.tanh()?)
    }
}

impl Module for Tagger {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        Ok(vec![self.run(p, &inputs[0])?])
    }
}

/// Traced graphs name their inputs after the parameters and the user's inputs, and
/// every node traced inside a built-in layer points at the user's line that called the
/// layer; the user's own ops keep their own lines.
#[test]
fn graph_inputs_are_named_and_nodes_point_at_the_users_lines() {
    let this = file!();
    let m = aot_module(Arc::new(Tagger::new()), AotConfig::default().no_cache()).unwrap();
    let x = data(&[2, 3, 8], DType::F64, 1, 1.0);
    no_grad(|| m.call(std::slice::from_ref(&x))).unwrap();
    let g = &m.function().traced_graphs()[0];
    let names: Vec<&str> = g.inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names.first(), Some(&"block.ln1.weight"), "{names:?}");
    assert!(names.contains(&"head.bias"), "{names:?}");
    assert_eq!(names.last(), Some(&"arg0"), "{names:?}");
    let mut lines = std::collections::BTreeMap::<u32, usize>::new();
    for n in &g.nodes {
        let loc = n.loc.as_ref().expect("every traced node has a location");
        assert_eq!(&*loc.file, this, "{} points into the library: {loc}", n.op.name());
        *lines.entry(loc.line).or_default() += 1;
    }
    assert_eq!(lines.keys().copied().collect::<Vec<_>>(), vec![BLOCK_LINE, HEAD_LINE, OWN_LINE], "{lines:?}");
    assert!(lines[&BLOCK_LINE] > 20, "{lines:?}");
    assert_eq!(lines[&OWN_LINE], 1);
    // A built-in layer compiled on its own points at the `aot_module` call.
    let block = Arc::new(TransformerBlock::new(8, 2, DType::F64, 3).unwrap());
    let line = line!() + 1;
    let blk = aot_module(block, AotConfig::default().no_cache()).unwrap();
    no_grad(|| blk.call(std::slice::from_ref(&x))).unwrap();
    let g = &blk.function().traced_graphs()[0];
    for n in &g.nodes {
        let loc = n.loc.as_ref().unwrap();
        assert!(&*loc.file == this && loc.line == line, "{} at {loc}, not line {line}", n.op.name());
    }
    // And so do its errors.
    let bad = data(&[2, 3, 5], DType::F64, 1, 1.0);
    let e = no_grad(|| blk.call(std::slice::from_ref(&bad))).unwrap_err().to_string();
    assert!(e.contains(&format!("{this}:{line}")), "{e}");
}

/// Children of a `Sequential` run through `dyn Module`: built-in ones still point at the
/// line that applied the sequence, user ones at their own lines.
#[test]
fn nodes_inside_a_sequential_point_at_the_users_lines() {
    struct Double {
        store: ParamStore,
    }
    impl Module for Double {
        fn store(&self) -> &ParamStore {
            &self.store
        }
        fn forward(&self, _p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
            Ok(vec![inputs[0].mul(2.0)?])
        }
    }
    let double_line = line!() - 3;
    let seq = aotgrad::nn::Sequential::new()
        .push(Linear::new(4, 4, true, DType::F64, 1).unwrap())
        .unwrap()
        .push(Double { store: ParamStore::new() })
        .unwrap()
        .push(LayerNorm::new(4, 1e-5, DType::F64).unwrap())
        .unwrap();
    let x = data(&[2, 4], DType::F64, 1, 1.0);
    let this = file!();
    let line = line!() + 1;
    let f = aot_module(Arc::new(seq), AotConfig::default().no_cache()).unwrap();
    no_grad(|| f.call(std::slice::from_ref(&x))).unwrap();
    for n in &f.function().traced_graphs()[0].nodes {
        let loc = n.loc.as_ref().unwrap();
        assert!(&*loc.file == this && (loc.line == line || loc.line == double_line), "{} at {loc}", n.op.name());
    }
}
