//! The functional-graph verifier. A graph passes when
//! - no node mutates, except (when input mutations are kept in the graph) trailing
//!   `copy_`s, each into a distinct graph input, whose results are not returned;
//! - every value is defined once, before its uses, and every output is defined;
//! - every node's metadata is what shape inference computes from its arguments;
//! - views share their argument's storage, and every other node gets a storage no
//!   earlier value uses (so aliasing in the graph is exactly its view ops).

use aotgrad_ir::infer::infer;
use aotgrad_ir::{Aliasing, DimOracle, Graph, Op, StorageId, TensorMeta, ValueId};
use std::collections::{HashMap, HashSet};

/// Check that `g` is a well-formed functional graph; the error says which node fails.
pub fn verify_functional(g: &Graph, allow_input_copies: bool, oracle: &mut dyn DimOracle) -> Result<(), String> {
    let mut defined: HashMap<ValueId, (TensorMeta, StorageId)> = HashMap::new();
    let mut storages: HashSet<StorageId> = HashSet::new();
    let mut inputs = HashSet::new();
    for i in &g.inputs {
        if defined.insert(i.id, (i.meta.clone(), i.storage)).is_some() {
            return Err(format!("input {} defined twice", i.id));
        }
        storages.insert(i.storage);
        inputs.insert(i.id);
    }
    let mut copied: HashSet<ValueId> = HashSet::new();
    let mut copies: HashSet<ValueId> = HashSet::new();
    for n in &g.nodes {
        let what = || format!("{} = {}", n.out, n.op.name());
        let mut metas = Vec::new();
        for a in &n.args {
            match defined.get(a) {
                Some((m, _)) => metas.push(m.clone()),
                None => return Err(format!("{}: argument {a} used before definition", what())),
            }
        }
        match n.op.aliasing() {
            Aliasing::MutatesData
                if allow_input_copies && matches!(&n.op, Op::InPlace(inner) if **inner == Op::Copy) =>
            {
                if !inputs.contains(&n.args[0]) {
                    return Err(format!("{}: target {} is not a graph input", what(), n.args[0]));
                }
                if !copied.insert(n.args[0]) {
                    return Err(format!("{}: graph input {} is written back twice", what(), n.args[0]));
                }
                copies.insert(n.out);
            }
            Aliasing::MutatesData | Aliasing::MutatesMeta => {
                return Err(format!("{}: in-place op in a functional graph", what()))
            }
            _ if !copies.is_empty() => return Err(format!("{}: node after the trailing input copies", what())),
            _ => {}
        }
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let want = infer(&n.op, &refs, oracle).map_err(|e| format!("{}: {e}", what()))?;
        if want != n.meta {
            return Err(format!("{}: recorded meta {} but inference gives {}", what(), n.meta, want));
        }
        match n.op.aliasing() {
            Aliasing::Fresh => {
                if !storages.insert(n.storage) {
                    return Err(format!("{}: a fresh result reuses storage {}", what(), n.storage));
                }
            }
            _ => {
                if defined[&n.args[0]].1 != n.storage {
                    return Err(format!("{}: a view must share its argument's storage", what()));
                }
            }
        }
        if defined.insert(n.out, (n.meta.clone(), n.storage)).is_some() {
            return Err(format!("{} defined twice", n.out));
        }
    }
    for o in &g.outputs {
        if !defined.contains_key(o) {
            return Err(format!("output {o} is not defined"));
        }
        if copies.contains(o) {
            return Err(format!("output {o} is the result of a trailing input copy"));
        }
    }
    Ok(())
}
