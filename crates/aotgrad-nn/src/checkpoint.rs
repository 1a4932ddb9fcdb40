//! Checkpoints in the [safetensors](https://github.com/huggingface/safetensors) format:
//! a module's parameters and buffers, an optimizer's state, and free-form metadata
//! (training progress, configuration) in one file other tools can read.
//!
//! Tensor names: `param.<name>`, `buffer.<name>`, `optim.<key>`. The header metadata
//! holds `format` (`aotgrad-checkpoint/1`), the optimizer's kind and scalars as JSON
//! under `optim`, and the caller's own string pairs.

use crate::optim::{Optimizer, OptimizerState};
use crate::ParamStore;
use aotgrad_ir::DType;
use aotgrad_runtime::{Error, Result};
use aotgrad_trace::{NoGradGuard, Tensor};
use safetensors::tensor::{Dtype as StDtype, TensorView};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::Path;

const FORMAT: &str = "aotgrad-checkpoint/1";

fn ckpt_error(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Call { name: "checkpoint".into(), msg: format!("{}: {msg}", path.display()) }
}

/// A tensor's row-major bytes (little-endian) and its safetensors dtype.
fn tensor_bytes(name: &str, t: &Tensor) -> Result<(StDtype, Vec<usize>, Vec<u8>)> {
    let shape = t.sizes()?;
    let bytes = match t.dtype() {
        DType::F32 => t.to_vec_f64()?.into_iter().flat_map(|v| (v as f32).to_le_bytes()).collect(),
        DType::F64 => t.to_vec_f64()?.into_iter().flat_map(f64::to_le_bytes).collect(),
        DType::I64 => t.to_vec_i64()?.into_iter().flat_map(i64::to_le_bytes).collect(),
        DType::I32 => t.to_vec_i64()?.into_iter().flat_map(|v| (v as i32).to_le_bytes()).collect(),
        DType::Bool => t.to_vec_bool()?.into_iter().map(u8::from).collect(),
        other => {
            return Err(Error::Call {
                name: "checkpoint".into(),
                msg: format!("tensor `{name}` is {other:?}; checkpoints hold f32, f64, i64, i32 and bool"),
            })
        }
    };
    let dtype = match t.dtype() {
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::I64 => StDtype::I64,
        DType::I32 => StDtype::I32,
        _ => StDtype::BOOL,
    };
    Ok((dtype, shape, bytes))
}

/// A fresh tensor from a stored view.
fn view_tensor(path: &Path, name: &str, v: &TensorView<'_>) -> Result<Tensor> {
    let data = v.data();
    let shape = v.shape().to_vec();
    let words = |n: usize| data.chunks_exact(n);
    let t = match v.dtype() {
        StDtype::F32 => Tensor::from_vec(words(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(), &shape),
        StDtype::F64 => Tensor::from_vec(words(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(), &shape),
        StDtype::I64 => Tensor::from_vec(words(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(), &shape),
        StDtype::I32 => Tensor::from_vec(words(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect(), &shape),
        StDtype::BOOL => Tensor::from_vec(data.iter().map(|&b| b != 0).collect::<Vec<bool>>(), &shape),
        other => return Err(ckpt_error(path, format!("tensor `{name}` has unsupported dtype {other:?}"))),
    };
    t.map_err(|e| ckpt_error(path, format!("tensor `{name}`: {e}")))
}

/// Write `store`'s parameters and buffers, `optimizer`'s state (if any) and
/// `metadata` to `path` (written to a temporary file first, then renamed, so a crash
/// never leaves a half-written checkpoint).
pub fn save(
    path: &Path,
    store: &ParamStore,
    optimizer: Option<&dyn Optimizer>,
    metadata: &[(String, String)],
) -> Result<()> {
    let mut named: Vec<(String, Tensor)> = Vec::new();
    named.extend(store.params().iter().map(|(n, t)| (format!("param.{n}"), t.clone())));
    named.extend(store.buffers().iter().map(|(n, t)| (format!("buffer.{n}"), t.clone())));
    let mut meta: HashMap<String, String> = metadata.iter().cloned().collect();
    meta.insert("format".into(), FORMAT.into());
    if let Some(opt) = optimizer {
        let state = opt.state();
        named.extend(state.tensors.iter().map(|(k, t)| (format!("optim.{k}"), t.clone())));
        let scalars: serde_json::Map<String, serde_json::Value> =
            state.scalars.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect();
        meta.insert("optim".into(), serde_json::json!({ "kind": state.kind, "scalars": scalars }).to_string());
    }
    let mut raw = Vec::with_capacity(named.len());
    for (name, t) in &named {
        raw.push((name.clone(), tensor_bytes(name, t)?));
    }
    let mut views = Vec::with_capacity(raw.len());
    for (name, (dtype, shape, bytes)) in &raw {
        let v = TensorView::new(*dtype, shape.clone(), bytes).map_err(|e| ckpt_error(path, e))?;
        views.push((name.clone(), v));
    }
    let bytes = safetensors::serialize(views, &Some(meta)).map_err(|e| ckpt_error(path, e))?;
    let tmp = path.with_extension("safetensors.tmp");
    std::fs::write(&tmp, bytes).map_err(|e| ckpt_error(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| ckpt_error(path, e))
}

/// What [`load`] read besides the tensors it copied into the store.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// The caller's metadata pairs (the ones given to [`save`]).
    pub metadata: HashMap<String, String>,
}

/// Read a checkpoint written by [`save`]: copy every parameter and buffer into
/// `store`'s tensors in place (the handles stay the same objects; every tensor of the
/// store must be present with its shape and dtype), and restore `optimizer`'s state
/// when given. Errors name the file and the tensor for a missing, mis-shaped or
/// corrupt entry.
pub fn load(path: &Path, store: &ParamStore, optimizer: Option<&mut dyn Optimizer>) -> Result<Loaded> {
    let bytes = std::fs::read(path).map_err(|e| ckpt_error(path, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| ckpt_error(path, format!("not a safetensors file: {e}")))?;
    let (_, header) =
        SafeTensors::read_metadata(&bytes).map_err(|e| ckpt_error(path, format!("not a safetensors file: {e}")))?;
    let mut metadata = header.metadata().clone().unwrap_or_default();
    match metadata.remove("format").as_deref() {
        Some(FORMAT) => {}
        Some(other) => {
            return Err(ckpt_error(path, format!("unknown checkpoint format `{other}` (expected {FORMAT})")))
        }
        None => return Err(ckpt_error(path, "no `format` in the header: not an aotgrad checkpoint")),
    }
    let read = |key: &str| -> Result<Tensor> {
        let v = st.tensor(key).map_err(|_| ckpt_error(path, format!("no tensor `{key}`")))?;
        view_tensor(path, key, &v)
    };
    // Read and check everything before writing anything.
    let mut copies = Vec::new();
    for (prefix, list) in [("param", store.params()), ("buffer", store.buffers())] {
        for (name, t) in list {
            let key = format!("{prefix}.{name}");
            let v = read(&key)?;
            if v.sizes()? != t.sizes()? || v.dtype() != t.dtype() {
                return Err(ckpt_error(
                    path,
                    format!(
                        "`{key}` is {:?} {:?}, the module's is {:?} {:?}",
                        v.dtype(),
                        v.sizes()?,
                        t.dtype(),
                        t.sizes()?
                    ),
                ));
            }
            copies.push((t.clone(), v));
        }
    }
    let optim_meta = metadata.remove("optim");
    if let Some(opt) = optimizer {
        let meta = optim_meta.ok_or_else(|| ckpt_error(path, "the checkpoint holds no optimizer state"))?;
        let json: serde_json::Value =
            serde_json::from_str(&meta).map_err(|e| ckpt_error(path, format!("corrupt optimizer metadata: {e}")))?;
        let kind = json["kind"].as_str().ok_or_else(|| ckpt_error(path, "optimizer metadata without a kind"))?;
        let mut state = OptimizerState { kind: kind.into(), ..OptimizerState::default() };
        if let Some(map) = json["scalars"].as_object() {
            for (k, v) in map {
                let v =
                    v.as_f64().ok_or_else(|| ckpt_error(path, format!("optimizer scalar `{k}` is not a number")))?;
                state.scalars.push((k.clone(), v));
            }
        }
        for name in st.names() {
            if let Some(key) = name.strip_prefix("optim.") {
                state.tensors.push((key.to_string(), read(name)?));
            }
        }
        state.tensors.sort_by(|a, b| a.0.cmp(&b.0));
        opt.load_state(store, &state)?;
    }
    let _no_grad = NoGradGuard::new();
    for (dst, src) in copies {
        dst.copy_(&src)?;
    }
    Ok(Loaded { metadata })
}
