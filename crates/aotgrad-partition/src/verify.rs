//! Structural and metadata verification of a graph this crate produced.

use crate::error::{PartitionError, Result};
use aotgrad_ir::infer::infer;
use aotgrad_ir::{Aliasing, Graph, StaticOracle, StorageId, TensorMeta, ValueId};
use std::collections::HashMap;

/// Check that `g` is well formed: every value is defined once, every node uses only
/// values defined before it, outputs are defined, views keep their argument's storage,
/// and every node's metadata equals what shape inference derives from its arguments.
///
/// Inference runs with [`StaticOracle`]; a node whose metadata mentions symbols and
/// whose inference needs a decision the static oracle cannot make (it then errors or
/// differs) is not reported, since the tracer that built it may have relied on a guard.
/// Any failure is an [`PartitionError::Internal`] naming the node.
pub fn verify_graph(g: &Graph) -> Result<()> {
    let mut defined: HashMap<ValueId, (&TensorMeta, StorageId)> = HashMap::new();
    for i in &g.inputs {
        if defined.insert(i.id, (&i.meta, i.storage)).is_some() {
            return Err(PartitionError::Internal(format!("input {} is defined twice", i.id)));
        }
    }
    for n in &g.nodes {
        let mut metas = Vec::with_capacity(n.args.len());
        for a in &n.args {
            match defined.get(a) {
                Some((m, _)) => metas.push(*m),
                None => {
                    return Err(PartitionError::Internal(format!(
                        "node {} ({}) uses {a} before it is defined",
                        n.out,
                        n.op.name()
                    )))
                }
            }
        }
        if n.op.aliasing() != Aliasing::Fresh {
            let base = n.args.first().and_then(|a| defined.get(a)).map(|(_, s)| *s);
            if base != Some(n.storage) {
                return Err(PartitionError::Internal(format!(
                    "node {} ({}) aliases its argument but has storage {}",
                    n.out,
                    n.op.name(),
                    n.storage
                )));
            }
        }
        let symbolic = !n.meta.is_concrete() || metas.iter().any(|m| !m.is_concrete());
        match infer(&n.op, &metas, &mut StaticOracle) {
            Ok(m) if m == n.meta => {}
            _ if symbolic => {}
            Ok(m) => {
                return Err(PartitionError::Internal(format!(
                    "node {} ({}): recorded metadata {} differs from the inferred {m}",
                    n.out,
                    n.op.name(),
                    n.meta
                )))
            }
            Err(e) => {
                return Err(PartitionError::Internal(format!(
                    "node {} ({}) fails shape inference: {e}",
                    n.out,
                    n.op.name()
                )))
            }
        }
        if defined.insert(n.out, (&n.meta, n.storage)).is_some() {
            return Err(PartitionError::Internal(format!("value {} is defined twice", n.out)));
        }
    }
    if let Some(o) = g.outputs.iter().find(|o| !defined.contains_key(o)) {
        return Err(PartitionError::Internal(format!("output {o} is never defined")));
    }
    Ok(())
}
