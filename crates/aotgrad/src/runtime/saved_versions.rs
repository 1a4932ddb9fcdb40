//! PyTorch's saved-tensor version check for a compiled function's backward, decided
//! when it compiles. Eagerly, a node's backward fails when a value it saved (an
//! operand its derivative reads, or its result for ops like `tanh`) was changed in
//! place since: `b.mul_(b)`, or `y = x.tanh()` then `y.t_()` under no-grad. The traced
//! graph says all of it: which nodes autograd records and reaches from the outputs,
//! what each one's derivative reads (the same rules and the same derivative as eager
//! autograd's), every write to each storage after it, and which outputs' and inputs'
//! gradients reach each node. The compiled backward raises the first failure, in the
//! order eager's backward visits nodes, that a gradient it is given reaches; the
//! forward still runs, as in PyTorch.

use crate::autograd::derivative;
use aotgrad_cache::BackwardError;
use aotgrad_ir::{Aliasing, Graph, Op, StorageId, TensorMeta, ValueId};
use aotgrad_trace::autograd::{node_name, saves_result, single_op_graph};
use aotgrad_trace::Traced;
use std::collections::{HashMap, HashSet};

/// The errors the backward of a call traced as `traced` may raise: one per recorded
/// node whose saved value changed, in the order eager's backward meets them, each
/// with the outputs and inputs whose gradients reach that node (the backward raises
/// the first one that a gradient it is given reaches).
pub(crate) fn saved_version_errors(traced: &Traced) -> Vec<BackwardError> {
    let g: &Graph = &traced.graph;
    let rg = |v: ValueId| traced.value_requires_grad.get(v.0 as usize).copied().unwrap_or(false);
    let mut storage: HashMap<ValueId, StorageId> = g.inputs.iter().map(|i| (i.id, i.storage)).collect();
    let mut meta: HashMap<ValueId, &TensorMeta> = g.inputs.iter().map(|i| (i.id, &i.meta)).collect();
    let mut def: HashMap<ValueId, usize> = HashMap::new();
    // Node indices that change each storage (data, or metadata: PyTorch counts both).
    let mut writes: HashMap<StorageId, Vec<usize>> = HashMap::new();
    for (k, n) in g.nodes.iter().enumerate() {
        storage.insert(n.out, n.storage);
        meta.insert(n.out, &n.meta);
        def.insert(n.out, k);
        if matches!(n.op.aliasing(), Aliasing::MutatesData | Aliasing::MutatesMeta) {
            writes.entry(n.storage).or_default().push(k);
        }
    }
    if writes.is_empty() {
        return Vec::new();
    }
    // Writes to `s` before node index `k` (the lists are sorted), and in all.
    let before = |s: StorageId, k: usize| writes.get(&s).map_or(0, |w| w.partition_point(|&x| x < k));
    let total = |s: StorageId| writes.get(&s).map_or(0, Vec::len);
    // Where gradients enter: the outputs that require grad, and each input's new value
    // (writes to its storage; a write through a `detach`ed alias belongs to that
    // alias, not to the input).
    // Each value's autograd identity among those sharing its storage: the `detach` it
    // was viewed from (writes through one identity are hidden from the others).
    let detached: HashSet<ValueId> = traced.detach_values.iter().copied().collect();
    let mut family: HashMap<ValueId, ValueId> = HashMap::new();
    for n in &g.nodes {
        if detached.contains(&n.out) {
            family.insert(n.out, n.out);
        } else if n.op.aliasing() != Aliasing::Fresh {
            if let Some(&f) = n.args.first().and_then(|a| family.get(a)) {
                family.insert(n.out, f);
            }
        }
    }
    let same_identity = |a: ValueId, b: ValueId| family.get(&a) == family.get(&b);
    let through_detach = |v: ValueId| family.contains_key(&v);
    let no_grad_views: HashSet<ValueId> = traced.no_grad_views.iter().copied().collect();
    // A write autograd does not see (under no-grad) leaves the tensor's history as it
    // was: its value stands for the one before.
    let resolve = |mut v: ValueId| loop {
        match def.get(&v).map(|&k| &g.nodes[k]) {
            Some(n)
                if !rg(v)
                    && matches!(n.op.aliasing(), Aliasing::MutatesData | Aliasing::MutatesMeta)
                    && !n.args.is_empty() =>
            {
                v = n.args[0]
            }
            _ => return v,
        }
    };
    // An output sharing a storage that was written has its history remade from the
    // storage's latest one (eagerly, a view's is, at backward): those writes count too.
    let mut output_roots: Vec<(usize, ValueId)> = Vec::new();
    for (j, &v) in g.outputs.iter().enumerate() {
        let r = resolve(v);
        // (No history, e.g. a view taken under no-grad: a leaf to eager autograd.)
        if !rg(r) {
            continue;
        }
        output_roots.push((j, r));
        let s = storage.get(&v).copied();
        for &k in s.and_then(|s| writes.get(&s)).map_or(&[][..], Vec::as_slice) {
            let w = g.nodes[k].out;
            if rg(w) && same_identity(w, v) {
                output_roots.push((j, w));
            }
        }
    }
    // (Eagerly a view's history is remade from its base's after a write through any
    // alias, so every write to an input's storage counts for that input.)
    let mut input_roots: Vec<(usize, ValueId)> = Vec::new();
    for (i, inp) in g.inputs.iter().enumerate() {
        for &k in writes.get(&inp.storage).map_or(&[][..], Vec::as_slice) {
            let v = g.nodes[k].out;
            if rg(v) && !through_detach(v) {
                input_roots.push((i, v));
            }
        }
    }
    // What node `at` reaches through operand `a`: its history, and when `a`'s storage
    // was written since `a` was made (through another alias), the storage's latest
    // history (eagerly, a view's history is remade from its base's when used).
    let edges_of = |a: ValueId, at: usize| -> [Option<ValueId>; 2] {
        let own = Some(resolve(a)).filter(|&r| rg(r));
        let made = def.get(&a).map_or(0, |&d| d + 1);
        let remade = storage.get(&a).and_then(|s| writes.get(s)).and_then(|w| {
            let upto = w.partition_point(|&x| x < at);
            w[..upto]
                .iter()
                .rev()
                .take_while(|&&x| x >= made)
                .map(|&x| g.nodes[x].out)
                .find(|&o| rg(o) && same_identity(o, a))
        });
        [own, remade]
    };
    // The nodes eager's backward may run: recorded, and reached from some root.
    let mut stack: Vec<ValueId> = output_roots.iter().chain(&input_roots).map(|&(_, v)| v).collect();
    let mut executed: HashSet<usize> = HashSet::new();
    while let Some(v) = stack.pop() {
        let Some(&k) = def.get(&v) else { continue };
        if !rg(v) || !executed.insert(k) {
            continue;
        }
        for &a in &g.nodes[k].args {
            stack.extend(edges_of(a, k).into_iter().flatten());
        }
    }
    let mut order: Vec<usize> = executed.into_iter().collect();
    // Eager's backward meets later nodes first.
    order.sort_unstable_by(|a, b| b.cmp(a));
    let mut errors = Vec::new();
    for k in order {
        // (An operand written under no-grad still has its history, a view whose base
        // came to require grad has its base's, and a view taken under no-grad requires
        // grad as a leaf: all are saved.)
        let tracked = |v: ValueId| edges_of(v, k).iter().any(Option::is_some) || no_grad_views.contains(&resolve(v));
        let Some(msg) = node_error(g, k, &storage, &meta, &tracked, &before, &total) else { continue };
        // The roots whose gradients reach node `k`: the values computed from it.
        let mut from_k: HashSet<ValueId> = HashSet::from([g.nodes[k].out]);
        for (m, n) in g.nodes.iter().enumerate().skip(k + 1) {
            let reached = n.args.iter().any(|&a| edges_of(a, m).into_iter().flatten().any(|e| from_k.contains(&e)));
            if reached && rg(resolve(n.out)) {
                from_k.insert(n.out);
            }
        }
        let reach = |roots: &[(usize, ValueId)]| -> Vec<usize> {
            let mut r: Vec<usize> = roots.iter().filter(|(_, v)| from_k.contains(v)).map(|&(i, _)| i).collect();
            r.dedup();
            r
        };
        errors.push(BackwardError {
            msg,
            loc: g.nodes[k].loc.clone(),
            outputs: reach(&output_roots),
            inputs: reach(&input_roots),
        });
    }
    errors
}

/// The saved-version error of node `k`, if a value it saved changed later in the call.
fn node_error(
    g: &Graph,
    k: usize,
    storage: &HashMap<ValueId, StorageId>,
    meta: &HashMap<ValueId, &TensorMeta>,
    rg: &dyn Fn(ValueId) -> bool,
    before: &dyn Fn(StorageId, usize) -> usize,
    total: &dyn Fn(StorageId) -> usize,
) -> Option<String> {
    let n = &g.nodes[k];
    let aliasing = n.op.aliasing();
    let name = node_name(&n.op);
    if aliasing == Aliasing::Fresh && saves_result(&n.op) {
        // Saves its result (and, in eager autograd, a private copy of its input).
        let s = n.storage;
        let (then, now) = (before(s, k + 1), total(s));
        let short = name.strip_suffix("Backward0").unwrap_or(&name);
        return (now != then).then(|| {
            format!(
                "one of the variables needed for gradient computation has been modified by an inplace operation: \
                 [{}], which is output 0 of {short}, is at version {now}; expected version {then} instead \
                 (versions counted from the call)",
                n.meta
            )
        });
    }
    // Operands saved when the node ran (an in-place op's target is saved as a copy).
    let inplace = aliasing == Aliasing::MutatesData;
    let from = if inplace { k } else { k + 1 };
    let changed: Vec<usize> = n
        .args
        .iter()
        .enumerate()
        .filter(|&(i, a)| !(inplace && i == 0) && storage.get(a).is_some_and(|&s| total(s) > before(s, from)))
        .map(|(i, _)| i)
        .collect();
    if changed.is_empty() {
        return None;
    }
    let inner = match &n.op {
        Op::InPlace(inner) | Op::MetaInPlace(inner) => (**inner).clone(),
        op => op.clone(),
    };
    let ins = n.args.iter().map(|a| meta.get(a).copied()).collect::<Option<Vec<&TensorMeta>>>()?;
    let requires: Vec<bool> = n.args.iter().zip(&ins).map(|(&a, m)| rg(a) && m.dtype.is_float()).collect();
    let d = derivative(&single_op_graph(inner, &ins, &n.meta), &requires).ok()?;
    let i = changed.into_iter().find(|&i| d.reads.get(i).copied().unwrap_or(false))?;
    let s = storage[&n.args[i]];
    let (then, now) = (before(s, from), total(s));
    Some(format!(
        "one of the variables needed for gradient computation has been modified by an inplace operation: [{}], \
         input {i} of {name}, is at version {now}; expected version {then} instead (versions counted from the call)",
        ins[i]
    ))
}
