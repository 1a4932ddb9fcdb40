//! What importing refuses, and what an imported module keeps: clear errors for a
//! damaged or truncated archive, an unknown schema version, an unknown op, an output
//! aotgrad does not compute and wrong inputs; the signature as text; checkpoints and
//! the compiled-result cache round-tripping an imported module.

use aotgrad::import::{ExportedProgram, ImportError, ImportedModule};
use aotgrad::prelude::*;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

/// The members of a fixture archive, in order.
fn members(name: &str) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(fixture(name)).unwrap();
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).unwrap();
            let mut data = Vec::new();
            f.read_to_end(&mut data).unwrap();
            (f.name().to_string(), data)
        })
        .collect()
}

/// A new archive of `members`, stored as torch.export.save stores them.
fn archive(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, data) in members {
        w.start_file(name.as_str(), opts).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// `name`'s archive with its JSON member ending in `member` edited by `edit`.
fn with_json(name: &str, member: &str, edit: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
    let mut ms = members(name);
    for (n, data) in &mut ms {
        if n.ends_with(member) {
            let mut v: serde_json::Value = serde_json::from_slice(data).unwrap();
            edit(&mut v);
            *data = serde_json::to_vec(&v).unwrap();
        }
    }
    archive(&ms)
}

/// `name`'s archive with `models/model.json` edited by `edit`.
fn with_model_json(name: &str, edit: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
    with_json(name, "models/model.json", edit)
}

/// `name`'s archive with its weights config edited by `edit`.
fn with_weights_config(name: &str, edit: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
    with_json(name, "data/weights/model_weights_config.json", edit)
}

fn import(bytes: Vec<u8>) -> Result<ImportedModule, ImportError> {
    ImportedModule::new(ExportedProgram::from_bytes("edited.pt2", bytes)?)
}

#[test]
fn a_rebuilt_archive_imports_and_runs() {
    // The helper itself: an unedited copy imports and computes what the original does.
    let copy = import(archive(&members("mlp.pt2"))).unwrap();
    let original = ImportedModule::load(fixture("mlp.pt2")).unwrap();
    let x = Tensor::randn(&[8, 784], DType::F32, 3).unwrap();
    let a = no_grad(|| copy.forward_eager(std::slice::from_ref(&x))).unwrap();
    let b = no_grad(|| original.forward_eager(std::slice::from_ref(&x))).unwrap();
    assert_eq!(a[0].to_vec_f64().unwrap(), b[0].to_vec_f64().unwrap());
}

#[test]
fn a_truncated_archive_is_a_clear_error() {
    let bytes = std::fs::read(fixture("cnn.pt2")).unwrap();
    for keep in [0, 10, bytes.len() / 2, bytes.len() - 30] {
        let e = ExportedProgram::from_bytes("cut.pt2", bytes[..keep].to_vec()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ImportError::Archive { .. }), "{msg}");
        assert!(msg.starts_with("cut.pt2: "), "{msg}");
        assert!(msg.contains("truncated or damaged"), "{msg}");
    }
}

#[test]
fn a_damaged_weight_is_detected_not_loaded() {
    // Flip one byte inside a weight's data: the member's CRC no longer matches.
    let mut bytes = std::fs::read(fixture("cnn.pt2")).unwrap();
    let z = zip::ZipArchive::new(std::io::Cursor::new(bytes.clone())).unwrap();
    let name = z.file_names().find(|n| n.ends_with("data/weights/weight_0")).unwrap().to_string();
    let mut z = z;
    let start = z.by_name(&name).unwrap().data_start() as usize;
    bytes[start + 5] ^= 0x40;
    let e = ExportedProgram::from_bytes("damaged.pt2", bytes).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("weight_0") && msg.contains("damaged or truncated"), "{msg}");
}

#[test]
fn an_unknown_schema_version_names_the_versions_read() {
    let bytes = with_model_json("mlp.pt2", |v| v["schema_version"]["major"] = 9.into());
    let e = import(bytes).unwrap_err();
    assert!(matches!(e, ImportError::Version { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "edited.pt2: schema version 9.20 is not one this reader reads (it reads 8.x); \
         export with a PyTorch whose torch.export schema is 8.x"
    );
}

#[test]
fn another_archive_format_is_refused() {
    let mut ms = members("mlp.pt2");
    for (n, data) in &mut ms {
        if n.ends_with("/archive_format") {
            *data = b"pt3".to_vec();
        }
    }
    let e = import(archive(&ms)).unwrap_err();
    assert!(e.to_string().contains("archive format `pt3`"), "{e}");
}

#[test]
fn an_unknown_op_names_the_op_the_node_and_the_source_line() {
    let bytes = with_model_json("cnn.pt2", |v| {
        let nodes = v["graph_module"]["graph"]["nodes"].as_array_mut().unwrap();
        let relu = nodes.iter_mut().find(|n| n["target"] == "torch.ops.aten.relu.default").unwrap();
        relu["target"] = "torch.ops.aten.frobnicate.default".into();
    });
    let e = import(bytes).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ImportError::Node { .. }), "{msg}");
    assert!(msg.starts_with("edited.pt2: node `relu` (aten.frobnicate.default), from "), "{msg}");
    // The user's line in the export script, not PyTorch's own files.
    assert!(msg.contains("export_fixtures.py:"), "{msg}");
    assert!(
        msg.ends_with("aotgrad does not know this op (see the list of covered ATen ops in aotgrad-import's docs)"),
        "{msg}"
    );
}

#[test]
fn an_output_aotgrad_does_not_compute_is_refused_when_read() {
    // Return max_pool2d_with_indices's indices in the core-ATen CNN.
    let bytes = with_model_json("cnn.core.pt2", |v| {
        let g = &mut v["graph_module"]["graph"];
        let unused = g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["target"] == "torch.ops.aten.max_pool2d_with_indices.default")
            .unwrap()["outputs"][1]["as_tensor"]["name"]
            .clone();
        g["outputs"].as_array_mut().unwrap().push(serde_json::json!({"as_tensor": {"name": unused}}));
        v["graph_module"]["signature"]["output_specs"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"user_output": {"arg": {"as_tensor": {"name": unused}}}}));
    });
    let msg = import(bytes).unwrap_err().to_string();
    assert!(msg.contains("(aten.max_pool2d_with_indices.default)"), "{msg}");
    assert!(msg.contains("an output aotgrad does not compute"), "{msg}");
}

#[test]
fn a_weight_too_short_for_its_shape_is_refused() {
    let mut ms = members("mlp.pt2");
    for (n, data) in &mut ms {
        if n.ends_with("data/weights/weight_1") {
            data.truncate(data.len() - 4);
        }
    }
    let msg = import(archive(&ms)).unwrap_err().to_string();
    assert!(msg.contains("model_weights_config.json") && msg.contains("need 256 bytes, the member holds 252"), "{msg}");
}

#[test]
fn wrong_inputs_are_errors_naming_the_input() {
    let m = ImportedModule::load(fixture("cnn.pt2")).unwrap();
    let bad = Tensor::randn(&[4, 100], DType::F32, 0).unwrap();
    let e = m.forward_eager(&[bad]).unwrap_err().to_string();
    assert!(e.contains("input `x` has shape [4, 100], the program was exported for f32[s77, 784]"), "{e}");
    // The batch is dynamic within the exported range [1, 4096].
    let big = Tensor::zeros(&[4097, 784], DType::F32).unwrap();
    let e = no_grad(|| m.forward_eager(&[big])).unwrap_err().to_string();
    assert!(e.contains("input `x` has 4097 for `s77`, outside its exported range [1, 4096]"), "{e}");
    let other_batch = Tensor::randn(&[3, 784], DType::F32, 0).unwrap();
    assert_eq!(no_grad(|| m.forward_eager(&[other_batch])).unwrap()[0].sizes().unwrap(), [3, 10]);
    let f64_input = Tensor::randn(&[4, 784], DType::F64, 0).unwrap();
    let e = m.forward_eager(&[f64_input]).unwrap_err().to_string();
    assert!(e.contains("input `x` is F64, the program was exported with F32"), "{e}");
    let e = m.forward_eager(&[]).unwrap_err().to_string();
    assert!(e.contains("takes 1 input(s) (x), got 0"), "{e}");
}

#[test]
fn the_signature_names_parameters_and_buffers_as_pytorch_does() {
    let m = ImportedModule::load(fixture("resnet.core.pt2")).unwrap();
    assert_eq!(m.input_names(), ["x"]);
    let names = m.store().names();
    assert!(names.contains(&"block2.downsample.1.running_var".to_string()), "{names:?}");
    assert!(names.contains(&"stem.0.weight".to_string()), "{names:?}");
    let text = m.signature_text();
    let head: Vec<&str> = text.lines().take(5).collect();
    expect_test::expect![[r#"
        program `resnet.core`: exported by torch 2.15.0+cu132, schema 8.20, ATEN dialect (opset aten 10), 29 nodes
        20 parameter tensor(s), 5266 elements; 18 buffer(s)
        inputs:
          parameter    stem.0.weight                            f32[8, 3, 3, 3]
          parameter    stem.1.weight                            f32[8]"#]]
    .assert_eq(&head.join("\n"));
    assert!(text.contains("new value of buffer stem.1.running_mean"), "{text}");
    assert!(text.contains("user input   x                                        f32[4, 3, 16, 16]"), "{text}");
}

#[test]
fn a_checkpoint_of_an_imported_module_restores_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.safetensors");
    let a = ImportedModule::load(fixture("resnet.pt2")).unwrap();
    let x = Tensor::randn(&[4, 3, 16, 16], DType::F32, 1).unwrap();
    // Move the running statistics, change a parameter, then save.
    a.forward_eager(std::slice::from_ref(&x)).unwrap();
    no_grad(|| a.store().get("fc.bias").unwrap().add_(0.5)).unwrap();
    aotgrad::nn::checkpoint::save(&path, a.store(), None, &[]).unwrap();
    let b = ImportedModule::load(fixture("resnet.pt2")).unwrap();
    aotgrad::nn::checkpoint::load(&path, b.store(), None).unwrap();
    for ((na, ta), (nb, tb)) in
        a.store().params().iter().chain(a.store().buffers()).zip(b.store().params().iter().chain(b.store().buffers()))
    {
        assert_eq!(na, nb);
        assert_eq!(ta.to_vec_f64().unwrap(), tb.to_vec_f64().unwrap(), "{na}");
    }
}

#[test]
fn a_compiled_imported_module_is_cached_and_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let x = Tensor::arange(0, 32, 1, DType::I64).unwrap().reshape(&[2, 16]).unwrap();
    let run = || {
        let m = Arc::new(ImportedModule::load(fixture("gpt.core.pt2")).unwrap());
        let cache = Arc::new(aotgrad::Cache::disk(dir.path()));
        // One thread: the 2-thread backend's reductions may split differently from
        // run to run (last bits), and this test compares bit for bit.
        let compiled = aot_module(m.clone(), AotConfig::default().threads(1).cache(cache)).unwrap();
        let (outs, pending) = compiled.forward(std::slice::from_ref(&x)).unwrap();
        let grads = pending.backward(&[outs[0].ones_like().unwrap()]).unwrap();
        let g = grads.param("blocks.1.qkv.weight").unwrap().to_vec_f64().unwrap();
        (outs[0].to_vec_f64().unwrap(), g, compiled.function().cache_stats())
    };
    let (out1, g1, s1) = run();
    let (out2, g2, s2) = run();
    assert_eq!((s1.hits, s1.misses), (0, 1), "{s1:?}");
    assert_eq!((s2.hits, s2.misses), (1, 0), "{s2:?}");
    assert_eq!(out1, out2);
    assert_eq!(g1, g2);
}

#[test]
fn a_frozen_parameter_stays_without_gradient() {
    // nn.Parameter(requires_grad=False): the archive still says is_param.
    let bytes = with_weights_config("mlp.pt2", |v| {
        v["config"]["layers.0.bias"]["tensor_meta"]["requires_grad"] = false.into();
    });
    let m = import(bytes).unwrap();
    let params: Vec<&str> = m.store().params().iter().map(|(n, _)| n.as_str()).collect();
    let buffers: Vec<&str> = m.store().buffers().iter().map(|(n, _)| n.as_str()).collect();
    assert!(!params.contains(&"layers.0.bias") && buffers.contains(&"layers.0.bias"), "{params:?} {buffers:?}");
    assert!(!m.store().get("layers.0.bias").unwrap().is_requires_grad());
}

#[test]
fn hostile_weight_shapes_are_errors() {
    // Sizes whose element count overflows, a stride-0 storage claiming 2^62
    // elements from 4 bytes, and sizes without matching strides.
    let cases: [(serde_json::Value, serde_json::Value, &str); 3] = [
        (
            serde_json::json!([{"as_int": 1i64 << 40}, {"as_int": 1i64 << 40}]),
            serde_json::json!([{"as_int": 0}, {"as_int": 0}]),
            "the sizes overflow",
        ),
        (
            serde_json::json!([{"as_int": 1i64 << 31}, {"as_int": 1i64 << 31}]),
            serde_json::json!([{"as_int": 0}, {"as_int": 0}]),
            "a weight may hold",
        ),
        (serde_json::json!([{"as_int": 64}]), serde_json::json!([]), "1 sizes but 0 strides"),
    ];
    for (sizes, strides, want) in cases {
        let bytes = with_weights_config("mlp.pt2", |v| {
            let meta = &mut v["config"]["layers.0.bias"]["tensor_meta"];
            meta["sizes"] = sizes.clone();
            meta["strides"] = strides.clone();
        });
        let msg = import(bytes).unwrap_err().to_string();
        assert!(msg.contains("`layers.0.bias`") && msg.contains(want), "{msg}");
    }
}
