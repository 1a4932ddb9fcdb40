//! `aotgrad import MODEL.pt2`: what a `torch.export` archive holds and what aotgrad
//! makes of it — the signature (parameters and buffers by PyTorch name, user inputs
//! and outputs, symbolic ranges), the op histogram, then `explain` on the imported
//! module: every compile stage of its training step (or inference, with
//! `--inference`) on example inputs of the exported shapes.

use crate::explain::{explain_function, Explanation};
use aotgrad::import::schema::SymDim;
use aotgrad::import::{scalar_type, ImportedModule};
use aotgrad::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

/// What `aotgrad import` prints.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ImportReport {
    /// The signature as text.
    pub signature: String,
    /// `(op, nodes)`, most used first.
    pub ops: Vec<(String, usize)>,
    /// Every compile stage (absent with `explain` off).
    pub explanation: Option<Explanation>,
}

impl ImportReport {
    /// The text form.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "== signature ==\n{}", self.signature.trim_end());
        let _ = writeln!(
            s,
            "\n== ops ({} nodes, {} distinct) ==",
            self.ops.iter().map(|o| o.1).sum::<usize>(),
            self.ops.len()
        );
        for (op, n) in &self.ops {
            let _ = writeln!(s, "{n:>5}  {op}");
        }
        if let Some(ex) = &self.explanation {
            s.push_str(&ex.text());
        }
        s
    }
}

/// Example user inputs of the exported shapes: random floats, zeros for integers
/// (valid indices) and `false` for bools; a symbolic size takes its example value.
pub fn example_user_inputs(m: &ImportedModule, seed: u64) -> Result<Vec<Tensor>, String> {
    let p = m.program();
    let mut out = Vec::new();
    for (k, name) in p.user_inputs().into_iter().enumerate() {
        let meta = p.graph.tensor_values.get(name).ok_or_else(|| format!("no metadata for input `{name}`"))?;
        let dtype = scalar_type(meta.dtype).map_err(|e| format!("input `{name}`: {e}"))?;
        let shape: Vec<usize> = meta
            .sizes
            .iter()
            .map(|d| match d {
                SymDim::Int(v) => *v as usize,
                SymDim::Expr(_, hint) => hint.unwrap_or(2).max(0) as usize,
            })
            .collect();
        let t =
            if dtype.is_float() { Tensor::randn(&shape, dtype, seed + k as u64) } else { Tensor::zeros(&shape, dtype) };
        out.push(t.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// Read `path`, describe it, and (with `explain`) compile its training step (an
/// inference call with `inference`) and print every stage.
pub fn import_file(path: &Path, explain: bool, inference: bool) -> Result<ImportReport, String> {
    let m = ImportedModule::load(path).map_err(|e| e.to_string())?;
    let signature = m.signature_text();
    let ops = m.program().op_histogram();
    let explanation = if explain { Some(explain_module(&m, inference)?) } else { None };
    Ok(ImportReport { signature, ops, explanation })
}

/// `explain` on an imported module, as a function of its parameters, buffers and
/// user inputs (parameters require grad unless `inference`).
pub fn explain_module(m: &ImportedModule, inference: bool) -> Result<Explanation, String> {
    let store = m.store();
    let params: Vec<String> = store.params().iter().map(|(n, _)| n.clone()).collect();
    let state: Vec<String> = store.names();
    let users = m.input_names();
    let mut names = state.clone();
    names.extend(users.iter().cloned());
    let mut decl = String::new();
    for (i, name) in names.iter().enumerate() {
        let kind = if params.contains(name) {
            if inference {
                "parameter"
            } else {
                "parameter, requires grad"
            }
        } else if i < state.len() {
            "buffer"
        } else {
            "user input"
        };
        let meta = match store.get(name) {
            Some(t) => format!("{:?} {:?}", t.dtype(), t.sizes().unwrap_or_default()),
            None => m.program().describe(name),
        };
        let _ = writeln!(decl, "{i} \"{name}\": {meta} ({kind})");
    }
    let module = m.clone();
    let make = || -> Result<Vec<Tensor>, String> {
        // Fresh copies per compile: a training-mode program updates its buffers.
        let mut v = Vec::new();
        for name in &state {
            let t = store
                .get(name)
                .expect("a store name")
                .detach()
                .and_then(|t| t.clone_tensor())
                .map_err(|e| e.to_string())?;
            let t = if params.contains(name) && !inference {
                t.requires_grad(true).map_err(|e| e.to_string())?
            } else {
                t
            };
            v.push(t);
        }
        v.extend(example_user_inputs(m, 0)?);
        Ok(v)
    };
    let n_state = state.len();
    let state_names = state.clone();
    let f = move |args: &[Tensor]| -> aotgrad::Result<Vec<Tensor>> {
        let p = Params::new(state_names.iter().cloned().zip(args[..n_state].iter().cloned()));
        module.forward(&p, &args[n_state..])
    };
    let title = Some(format!("imported `{}` ({})", m.name(), m.program().path.display()));
    explain_function(title, names, decl, &make, f)
}
