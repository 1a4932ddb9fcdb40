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

use aotgrad_cache::BackwardError;
use aotgrad_ir::{Aliasing, Graph, Op, StorageId, TensorMeta, ValueId};
use aotgrad_trace::autograd::{derivative, node_name, saves_result, single_op_graph};
use aotgrad_trace::Traced;
use std::collections::{HashMap, HashSet};

/// The errors the backward of a call traced as `traced` may raise: one per recorded
/// node whose saved value changed, in the order eager's backward meets them, each
/// with the outputs and inputs whose gradients reach that node (the backward raises
/// the first one that a gradient it is given reaches).
pub(crate) fn saved_version_errors(
    traced: &Traced,
    input_is_leaf: &[bool],
    input_is_view: &[bool],
) -> Vec<BackwardError> {
    let g: &Graph = &traced.graph;
    // A write autograd does not see (under no-grad) leaves the tensor's history as it
    // was: its value stands for the one before. A metadata op under no-grad is no
    // recorded node, even of a tensor that keeps requiring grad.
    let hidden_meta: HashSet<ValueId> = traced.hidden_meta.iter().copied().collect();
    let rg = |v: ValueId| {
        traced.value_requires_grad.get(v.0 as usize).copied().unwrap_or(false) && !hidden_meta.contains(&v)
    };
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
    let resolve = |mut v: ValueId| loop {
        match def.get(&v).map(|&k| &g.nodes[k]) {
            Some(n)
                if ((!rg(v) && matches!(n.op.aliasing(), Aliasing::MutatesData | Aliasing::MutatesMeta))
                    || hidden_meta.contains(&v))
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
    // The outputs and inputs whose gradients reach value `v` (made by node `k0 - 1`,
    // or an input for `k0 == 0`): the roots among the values computed from it.
    let reach_from = |v: ValueId, k0: usize| -> (Vec<usize>, Vec<usize>) {
        let mut from: HashSet<ValueId> = HashSet::from([v]);
        for (m, n) in g.nodes.iter().enumerate().skip(k0) {
            let reached = n.args.iter().any(|&a| edges_of(a, m).into_iter().flatten().any(|e| from.contains(&e)));
            if reached && rg(resolve(n.out)) {
                from.insert(n.out);
            }
        }
        let reach = |roots: &[(usize, ValueId)]| -> Vec<usize> {
            let mut r: Vec<usize> = roots.iter().filter(|(_, v)| from.contains(v)).map(|&(i, _)| i).collect();
            r.dedup();
            r
        };
        (reach(&output_roots), reach(&input_roots))
    };
    // A tensor that is not a view keeps its history's shape when a metadata op changes
    // it under no-grad (a view's history is remade from its base).
    let input_index: HashMap<ValueId, usize> = g.inputs.iter().enumerate().map(|(i, inp)| (inp.id, i)).collect();
    let non_view = |mut v: ValueId| loop {
        if let Some(&i) = input_index.get(&v) {
            // (A leaf's gradient accumulates in its current shape: see below.)
            let leaf = input_is_leaf.get(i).copied().unwrap_or(false) && rg(v);
            return !input_is_view.get(i).copied().unwrap_or(true) && !leaf;
        }
        match def.get(&v).map(|&k| &g.nodes[k]) {
            Some(n) if matches!(n.op.aliasing(), Aliasing::MutatesData | Aliasing::MutatesMeta) => v = n.args[0],
            // (A view made in grad mode of a view taken under no-grad keeps its node.)
            Some(n) => return n.op.aliasing() == Aliasing::Fresh || (no_grad_views.contains(&v) && rg(v)),
            None => return false,
        }
    };
    let mut errors = Vec::new();
    let dedup = |mut v: Vec<usize>| {
        v.dedup();
        v
    };
    let all_outputs = dedup(output_roots.iter().map(|&(j, _)| j).collect());
    let all_inputs = dedup(input_roots.iter().map(|&(i, _)| i).collect());
    // An output whose shape a metadata op changed under no-grad, while its history (a
    // non-view's) kept the old shape: its gradient enters that history in the new one.
    for (j, &v) in g.outputs.iter().enumerate() {
        let r = resolve(v);
        let (Some(new), Some(old)) = (meta.get(&v), meta.get(&r)) else { continue };
        if r != v && rg(r) && non_view(r) && new.shape != old.shape && !broadcasts(&old.shape, &new.shape) {
            errors.push(BackwardError {
                msg: format!(
                    "invalid gradient: got {} but expected shape compatible with {}",
                    shape_str(&new.shape),
                    shape_str(&old.shape)
                ),
                loc: def.get(&r).and_then(|&d| g.nodes[d].loc.clone()),
                outputs: vec![j],
                inputs: Vec::new(),
            });
        }
    }
    for k in order {
        // (An operand written under no-grad still has its history, a view whose base
        // came to require grad has its base's, and a view taken under no-grad requires
        // grad as a leaf: all are saved.)
        let tracked = |v: ValueId| edges_of(v, k).iter().any(Option::is_some) || no_grad_views.contains(&resolve(v));
        let msg = shape_error(g, k, &non_view, &meta, &resolve, &rg)
            .or_else(|| node_error(g, k, &storage, &meta, &tracked, &before, &total));
        let Some(msg) = msg else { continue };
        let (outputs, inputs) = reach_from(g.nodes[k].out, k + 1);
        // One that every gradient reaches is always the first raised: nothing after
        // it matters (this keeps a long chain of failing nodes linear).
        let covers_all = outputs.len() == all_outputs.len() && inputs.len() == all_inputs.len();
        errors.push(BackwardError { msg, loc: g.nodes[k].loc.clone(), outputs, inputs });
        if covers_all {
            return errors;
        }
    }
    // A leaf argument whose shape a metadata op changed under no-grad: its gradient,
    // in its shape at the call, must broadcast to its new shape (eager's
    // accumulation; PyTorch's too).
    for (i, inp) in g.inputs.iter().enumerate() {
        if !input_is_leaf.get(i).copied().unwrap_or(false) || !rg(inp.id) {
            continue;
        }
        let meta_written = writes
            .get(&inp.storage)
            .is_some_and(|w| w.iter().any(|&k| g.nodes[k].op.aliasing() == Aliasing::MutatesMeta));
        if !meta_written {
            continue;
        }
        // (Eager refuses any in-place op on such a leaf in grad mode: these ran under
        // no-grad.)
        let of_input = |mut v: ValueId| loop {
            if v == inp.id {
                return true;
            }
            match def.get(&v).map(|&k| &g.nodes[k]) {
                Some(n) if matches!(n.op.aliasing(), Aliasing::MutatesMeta | Aliasing::MutatesData) => v = n.args[0],
                _ => return false,
            }
        };
        let last = g
            .nodes
            .iter()
            .rev()
            .find(|n| n.op.aliasing() == Aliasing::MutatesMeta && n.args.first().is_some_and(|&a| of_input(a)));
        let Some(last) = last else { continue };
        if broadcasts(&inp.meta.shape, &last.meta.shape) {
            continue;
        }
        // Gradients in the old shape come through what was computed from the input (or
        // a view of it) before the first change; a view used later has its history
        // remade from the leaf's new shape, and the input's own handle is returned in
        // its new shape.
        let first = g
            .nodes
            .iter()
            .position(|n| n.op.aliasing() == Aliasing::MutatesMeta && n.args.first().is_some_and(|&a| of_input(a)))
            .unwrap_or(g.nodes.len());
        let view_of_input = |mut v: ValueId| loop {
            if v == inp.id {
                return true;
            }
            match def.get(&v).map(|&k| &g.nodes[k]) {
                Some(n) if n.op.aliasing() == Aliasing::View => v = n.args[0],
                _ => return false,
            }
        };
        let mut from: HashSet<ValueId> = HashSet::new();
        for (m, n) in g.nodes.iter().enumerate() {
            if of_input(n.out) || (n.op.aliasing() == Aliasing::View && m < first && view_of_input(n.out)) {
                continue;
            }
            let starts = m < first && n.args.iter().any(|&a| view_of_input(a));
            let reached =
                starts || n.args.iter().any(|&a| edges_of(a, m).into_iter().flatten().any(|e| from.contains(&e)));
            if reached && rg(resolve(n.out)) {
                from.insert(n.out);
            }
        }
        let reach = |roots: &[(usize, ValueId)]| -> Vec<usize> {
            let mut r: Vec<usize> = roots.iter().filter(|(_, v)| from.contains(v)).map(|&(i, _)| i).collect();
            r.dedup();
            r
        };
        let (outputs, inputs) = (reach(&output_roots), reach(&input_roots));
        if outputs.is_empty() && inputs.is_empty() {
            continue;
        }
        errors.push(BackwardError {
            msg: format!("gradient of shape {} does not broadcast to its tensor {}", inp.meta, last.meta),
            loc: last.loc.clone(),
            outputs,
            inputs,
        });
    }
    errors
}

/// `[6, 4]`.
fn shape_str(shape: &[aotgrad_ir::Dim]) -> String {
    format!("[{}]", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

/// `old` broadcasts to `new` (a gradient of shape `old` can be expanded to `new`).
fn broadcasts(old: &[aotgrad_ir::Dim], new: &[aotgrad_ir::Dim]) -> bool {
    old.len() <= new.len()
        && old.iter().rev().zip(new.iter().rev()).all(|(o, n)| o == n || *o == aotgrad_ir::Dim::Const(1))
}

/// Eager's shape check at node `k`: an operand whose shape a metadata op changed under
/// no-grad, while its history (a non-view's) still has the old shape, receives a
/// gradient of the new shape that must be summable to the old one.
fn shape_error(
    g: &Graph,
    k: usize,
    non_view: &dyn Fn(ValueId) -> bool,
    meta: &HashMap<ValueId, &TensorMeta>,
    resolve: &dyn Fn(ValueId) -> ValueId,
    rg: &dyn Fn(ValueId) -> bool,
) -> Option<String> {
    let n = &g.nodes[k];
    n.args.iter().enumerate().find_map(|(i, &a)| {
        let r = resolve(a);
        let (new, old) = (meta.get(&a)?, meta.get(&r)?);
        (r != a && rg(r) && non_view(r) && new.shape != old.shape && !broadcasts(&old.shape, &new.shape)).then(|| {
            format!(
                "Function {} returned an invalid gradient at index {i} - got {} but expected shape compatible with {}",
                node_name(&n.op),
                shape_str(&new.shape),
                shape_str(&old.shape)
            )
        })
    })
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
