//! The functional-graph verifier: no mutation (but trailing `copy_`s into inputs when
//! input mutations are kept in the graph), every value defined before use, every
//! node's metadata equal to what inference computes, views sharing their argument's
//! storage, and outputs defined.

use aotgrad_ir::infer::infer;
use aotgrad_ir::{Aliasing, DimOracle, Graph, Op, StorageId, TensorMeta, ValueId};
use std::collections::HashMap;

/// Check that `g` is a well-formed functional graph; the error says which node fails.
pub fn verify_functional(g: &Graph, allow_input_copies: bool, oracle: &mut dyn DimOracle) -> Result<(), String> {
    let mut defined: HashMap<ValueId, (TensorMeta, StorageId)> = HashMap::new();
    let mut inputs = std::collections::HashSet::new();
    for i in &g.inputs {
        if defined.insert(i.id, (i.meta.clone(), i.storage)).is_some() {
            return Err(format!("input {} defined twice", i.id));
        }
        inputs.insert(i.id);
    }
    let mut seen_copy = false;
    for n in &g.nodes {
        let mut metas = Vec::new();
        for a in &n.args {
            match defined.get(a) {
                Some((m, _)) => metas.push(m.clone()),
                None => return Err(format!("{} = {}: argument {a} used before definition", n.out, n.op.name())),
            }
        }
        match n.op.aliasing() {
            Aliasing::MutatesData
                if allow_input_copies && matches!(&n.op, Op::InPlace(inner) if **inner == Op::Copy) =>
            {
                if !inputs.contains(&n.args[0]) {
                    return Err(format!("{} = copy_: target {} is not a graph input", n.out, n.args[0]));
                }
                seen_copy = true;
            }
            Aliasing::MutatesData | Aliasing::MutatesMeta => {
                return Err(format!("{} = {}: in-place op in a functional graph", n.out, n.op.name()))
            }
            _ if seen_copy => return Err(format!("{} = {}: node after the trailing input copies", n.out, n.op.name())),
            _ => {}
        }
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let want = infer(&n.op, &refs, oracle).map_err(|e| format!("{} = {}: {e}", n.out, n.op.name()))?;
        if want != n.meta {
            return Err(format!("{} = {}: recorded meta {} but inference gives {}", n.out, n.op.name(), n.meta, want));
        }
        if n.op.aliasing() != Aliasing::Fresh && defined[&n.args[0]].1 != n.storage {
            return Err(format!("{} = {}: a view must share its argument's storage", n.out, n.op.name()));
        }
        if defined.insert(n.out, (n.meta.clone(), n.storage)).is_some() {
            return Err(format!("{} defined twice", n.out));
        }
    }
    for o in &g.outputs {
        if !defined.contains_key(o) {
            return Err(format!("output {o} is not defined"));
        }
    }
    Ok(())
}
