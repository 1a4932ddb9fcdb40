//! The reference interpreter: runs any [`Graph`] node by node with [`crate::execute`].
//!
//! 1. Shape symbols are bound from the concrete inputs: a size (then a stride or the
//!    offset) that is exactly one symbol binds it; every other size, stride, offset and
//!    the dtype must then evaluate to the concrete input's, else [`CpuError::Input`].
//! 2. Each node's op and metadata get the symbol values substituted; shape inference
//!    re-derives the metadata from the arguments' concrete metadata and must agree with
//!    the node's (a mismatch is a bug: [`CpuError::Internal`] naming the node).
//!    Errors of a node's op (inference, a kernel, a size that overflows i64 for these
//!    symbol values) come wrapped in [`CpuError::Node`], naming the node, its op and
//!    the user's source line.
//! 3. The node runs on the argument tensors themselves, so inputs that share storage
//!    (aliases, duplicates) see each other's mutations exactly as in eager mode.

use crate::exec::execute;
use crate::storage::CpuTensor;
use crate::{CpuError, Result};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{Dim, Graph, StaticOracle, SymId, TensorMeta, ValueId};
use std::collections::HashMap;

fn input_err(index: usize, msg: String) -> CpuError {
    CpuError::Input { index, msg }
}

/// Bind symbols from every dim in `dims` that is exactly one symbol; with `sizes`
/// (for strides), dims of size 1 are passed over.
fn bind_from(
    index: usize,
    what: &str,
    dims: &[Dim],
    values: &[i64],
    sizes: Option<&[i64]>,
    env: &mut HashMap<SymId, i64>,
) -> Result<()> {
    for (pos, (d, &v)) in dims.iter().zip(values).enumerate() {
        if sizes.is_some_and(|s| s.get(pos) == Some(&1)) {
            continue;
        }
        if let Some(s) = d.as_single_sym() {
            match env.get(&s) {
                Some(&old) if old != v => {
                    return Err(input_err(
                        index,
                        format!("{what} {pos} is {v}, but symbol {s} was already bound to {old} by an earlier dim"),
                    ))
                }
                Some(_) => {}
                None => {
                    env.insert(s, v);
                }
            }
        }
    }
    Ok(())
}

/// Check that every dim of `dims` evaluates to the concrete value; with `sizes` (for
/// strides), dims of size 1 are passed over.
fn check_dims(
    index: usize,
    what: &str,
    dims: &[Dim],
    values: &[i64],
    sizes: Option<&[i64]>,
    env: &HashMap<SymId, i64>,
) -> Result<()> {
    for (pos, (d, &v)) in dims.iter().zip(values).enumerate() {
        if sizes.is_some_and(|s| s.get(pos) == Some(&1)) {
            continue;
        }
        match d.eval(&|s| env.get(&s).copied()) {
            Some(e) if e == v => {}
            Some(e) => {
                return Err(input_err(index, format!("{what} {pos} is {v}, but the graph expects {d} = {e}")));
            }
            None => {
                return Err(input_err(
                    index,
                    format!("{what} {pos} ({d}) mentions a symbol that no input dim determines"),
                ))
            }
        }
    }
    Ok(())
}

fn concrete_values(index: usize, meta: &TensorMeta) -> Result<(Vec<i64>, Vec<i64>, i64)> {
    let c =
        |d: &Dim| d.as_const().ok_or_else(|| input_err(index, format!("concrete input has symbolic metadata {meta}")));
    Ok((
        meta.shape.iter().map(c).collect::<Result<_>>()?,
        meta.strides.iter().map(c).collect::<Result<_>>()?,
        c(&meta.offset)?,
    ))
}

/// Bind every graph symbol from the inputs (after the `given` ones) and check the
/// inputs against the graph.
pub(crate) fn bind_inputs(g: &Graph, inputs: &[CpuTensor], given: &[(SymId, i64)]) -> Result<HashMap<SymId, i64>> {
    if inputs.len() != g.inputs.len() {
        return Err(input_err(
            inputs.len().min(g.inputs.len()),
            format!("the graph takes {} inputs, got {}", g.inputs.len(), inputs.len()),
        ));
    }
    let mut vals = Vec::with_capacity(inputs.len());
    for (i, (gi, t)) in g.inputs.iter().zip(inputs).enumerate() {
        if gi.meta.rank() != t.meta.rank() {
            return Err(input_err(
                i,
                format!(
                    "`{}` has rank {} (shape {}), but the graph expects rank {} ({})",
                    gi.name,
                    t.meta.rank(),
                    t.meta,
                    gi.meta.rank(),
                    gi.meta
                ),
            ));
        }
        if gi.meta.dtype != t.meta.dtype {
            return Err(input_err(
                i,
                format!("`{}` has dtype {}, but the graph expects {}", gi.name, t.meta.dtype, gi.meta.dtype),
            ));
        }
        vals.push(concrete_values(i, &t.meta)?);
    }
    let mut env: HashMap<SymId, i64> = given.iter().copied().collect();
    // Sizes bind first (they are what users think of as the shape), then strides/offsets.
    for (i, (gi, (shape, _, _))) in g.inputs.iter().zip(&vals).enumerate() {
        bind_from(i, "size", &gi.meta.shape, shape, None, &mut env)?;
    }
    // The stride of a dim of size 1 never moves an index (PyTorch ignores it in
    // contiguity too): it need not match, and binds only a symbol nothing else binds.
    for (i, (gi, (shape, strides, offset))) in g.inputs.iter().zip(&vals).enumerate() {
        bind_from(i, "stride", &gi.meta.strides, strides, Some(shape), &mut env)?;
        bind_from(i, "offset", std::slice::from_ref(&gi.meta.offset), &[*offset], None, &mut env)?;
    }
    for (gi, (shape, strides, _)) in g.inputs.iter().zip(&vals) {
        for d in (0..strides.len()).filter(|&d| shape[d] == 1) {
            if let Some(s) = gi.meta.strides[d].as_single_sym() {
                env.entry(s).or_insert(strides[d]);
            }
        }
    }
    for (i, (gi, (shape, strides, offset))) in g.inputs.iter().zip(&vals).enumerate() {
        check_dims(i, "size", &gi.meta.shape, shape, None, &env)?;
        check_dims(i, "stride", &gi.meta.strides, strides, Some(shape), &env)?;
        check_dims(i, "offset", std::slice::from_ref(&gi.meta.offset), &[*offset], None, &env)?;
    }
    Ok(env)
}

/// Run `g` on `inputs`; returns the values of `g.outputs`, in order.
pub fn interpret(g: &Graph, inputs: &[CpuTensor]) -> Result<Vec<CpuTensor>> {
    interpret_with_symbols(g, inputs, &[])
}

/// [`interpret`] with the values of some shape symbols given (those no input dim
/// carries whole); an input dim must agree with a given value.
pub fn interpret_with_symbols(g: &Graph, inputs: &[CpuTensor], symbols: &[(SymId, i64)]) -> Result<Vec<CpuTensor>> {
    let _span = tracing::trace_span!("interpret", inputs = g.inputs.len(), nodes = g.nodes.len()).entered();
    let env = bind_inputs(g, inputs, symbols)?;
    let lookup = |s: SymId| env.get(&s).copied();
    let mut values: HashMap<ValueId, CpuTensor> = HashMap::with_capacity(g.inputs.len() + g.nodes.len());
    for (gi, t) in g.inputs.iter().zip(inputs) {
        values.insert(gi.id, t.clone());
    }
    for node in &g.nodes {
        let at_node = |e: CpuError| CpuError::Node {
            value: node.out,
            op: node.op.name(),
            loc: node.loc.clone(),
            source: Box::new(e),
        };
        // Every symbol is bound (`bind_inputs` checked the inputs); a dim that does not
        // substitute is one whose value overflows i64 for these inputs.
        let overflows = std::cell::Cell::new(None);
        let subst = |d: &Dim| match d.checked_subst(&lookup) {
            Some(c) => c,
            None => {
                overflows.set(Some(d.to_string()));
                d.clone()
            }
        };
        let op = node.op.map_dims(&subst);
        let meta = TensorMeta {
            shape: node.meta.shape.iter().map(subst).collect(),
            strides: node.meta.strides.iter().map(subst).collect(),
            offset: subst(&node.meta.offset),
            dtype: node.meta.dtype,
        };
        if let Some(d) = overflows.take() {
            return Err(at_node(CpuError::kernel(
                node.op.name(),
                format!("{d} overflows i64 for the symbol values of these inputs"),
            )));
        }
        if !meta.is_concrete() {
            return Err(CpuError::Internal(format!(
                "node {} ({}): metadata {meta} mentions a symbol no input determines",
                node.out,
                node.op.name()
            )));
        }
        let args = node
            .args
            .iter()
            .map(|a| {
                values.get(a).ok_or_else(|| {
                    CpuError::Internal(format!("node {} ({}) uses {a} before it is defined", node.out, node.op.name()))
                })
            })
            .collect::<Result<Vec<&CpuTensor>>>()?;
        let arg_metas: Vec<&TensorMeta> = args.iter().map(|t| &t.meta).collect();
        let inferred = infer(&op, &arg_metas, &mut StaticOracle).map_err(|e| at_node(e.into()))?;
        if inferred != meta {
            return Err(CpuError::Internal(format!(
                "node {} ({}): inferred metadata {inferred} differs from the recorded {meta}",
                node.out,
                node.op.name()
            )));
        }
        tracing::trace!(node = %node.out, op = %node.op.name(), meta = %meta, "execute");
        let result = execute(&op, &args, &meta).map_err(at_node)?;
        values.insert(node.out, result);
    }
    g.outputs
        .iter()
        .map(|o| values.get(o).cloned().ok_or_else(|| CpuError::Internal(format!("output {o} is never defined"))))
        .collect()
}
