//! The min-cut choice of saved values, and the memory-budget trade-off.
//!
//! # Flow network
//!
//! Every live forward value `v` (primal or forward node) becomes two vertices `v_in`,
//! `v_out` joined by an edge of capacity `bytes(v) · 2^16 + penalty(v)`, the cost of
//! saving `v`. The penalty breaks ties between equally large values: 1 for a primal
//! (the caller keeps it alive anyway, and a view of it is free to recompute), else
//! `2 + min(d(v), 61)` where `d(v)` is the number of forward edges from `v` to the
//! nearest value the backward uses directly (closer means less recomputation). It
//! never outweighs a byte unless a cut has over a thousand edges.
//! Infinite-capacity edges (`2^60`):
//! - `source → v_in` for every primal (it exists before the forward runs) and every
//!   banned forward node (`mm`, `bmm`, random ops, composites: see
//!   [`is_banned`](super::is_banned)), which must be computed by the forward;
//! - `a_out → b_in` for every forward argument edge `a → b` between live forward values;
//! - `v_out → sink` for every forward value the backward uses directly (an argument of a
//!   live backward node, or a gradient output).
//!
//! A minimum cut (max flow by Dinic's algorithm, see `flow`) crosses only `v_in → v_out`
//! edges; those `v` are saved. Since `source → v_in` is infinite for primals and banned
//! nodes, their `v_in` is contracted into the source (their edges in vanish), which
//! splits the network at every such node; each connected component is solved on its
//! own (see `cut_by_component`). A primal the backward does not use directly keeps its
//! `v_out`, so every step that reads it (a bias added in each layer of a deep chain)
//! lands in one component; Dinic's phases each cost one pass over the component plus
//! the paths they saturate, so even then a deep network costs near-linear time.
//!
//! Two reductions keep the network small without changing the cut: only values both
//! reachable from a source-connected value and leading to a used value are included
//! (no flow passes through the others); and a primal or banned value the backward uses
//! directly is always saved (both its sides are pinned), so it is taken out of the
//! flow: saved up front, with `source → v_out` so its users see it as available. Every other forward value the backward needs lies on the
//! sink side: it has no path from a primal or banned node that avoids a saved value, so
//! it is recomputable from the saved values by recomputable ops alone.
//!
//! # Memory budget
//!
//! `activation_memory_budget = b`. *Activation bytes* of a saved set are the bytes of
//! its values that are not primals (primals are kept alive by the caller anyway).
//! - `b = 1`: the min-cut set `S1`;
//! - `b = 0`: `S0`, the primals and banned-node outputs the backward needs when every
//!   recomputable forward value is recomputed: walking back from the values the
//!   backward uses, through recomputable forward nodes, stopping at primals and banned
//!   nodes. Nothing recomputable is saved; the banned outputs are saved because they
//!   must be. (This maximizes recomputation; it is not always the fewest bytes.)
//! - `0 < b < 1`: start from `S1` and repeat, while its activation bytes exceed
//!   `b · activation_bytes(S1)`, the best *move*. Moving a saved value `v` (neither a
//!   primal nor banned) unsaves it and saves instead its recompute frontier: walking
//!   back from `v`'s arguments through unsaved recomputable forward nodes (which the
//!   backward will recompute along with `v`), stopping at saved values, primals and
//!   banned nodes (those not yet saved get saved). The best move has the largest
//!   (activation bytes removed) / (FLOPs recomputed, at least 1); only moves that
//!   remove bytes count; ties go to the earliest value. It stops when under the target
//!   or when no move removes bytes. Each move strictly lowers the activation bytes, so
//!   the result only shrinks as `b` falls.

use super::flow;
use super::joint::JointInfo;
use crate::cost::bytes_of;
use crate::error::{PartitionError, Result};
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

/// A capacity edge of the flow network.
type Edge = ((usize, usize), i64);

const SCALE: i64 = 1 << 16;
const MAX_BYTES: u64 = 1 << 40;
const INF: i64 = 1 << 60;

/// The min-cut saved set (slots, ascending).
pub(crate) fn min_cut(info: &JointInfo<'_>) -> Result<Vec<usize>> {
    let total = info.args.len();
    let fw = |s: usize| info.forward[s] && info.live[s];
    let pinned = |s: usize| info.is_primal(s) || info.is_banned(s);
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); total];
    for s in (0..total).filter(|&s| fw(s)) {
        for &a in &info.args[s] {
            users[a].push(s);
        }
    }
    let mut used = vec![false; total];
    for &s in &info.bw_uses {
        used[s] = true;
    }
    // Distance (in forward edges) to the nearest directly used value; finite exactly for
    // the values that lead to one.
    let mut dist = vec![u32::MAX; total];
    let mut queue: VecDeque<usize> = info.bw_uses.iter().copied().collect();
    for &s in &info.bw_uses {
        dist[s] = 0;
    }
    while let Some(s) = queue.pop_front() {
        for &a in &info.args[s] {
            if fw(a) && dist[a] == u32::MAX {
                dist[a] = dist[s] + 1;
                queue.push_back(a);
            }
        }
    }
    // Values reachable from a pinned value (others are never saved: no flow reaches them).
    let mut from_src = vec![false; total];
    let mut stack: Vec<usize> = (0..total).filter(|&s| fw(s) && pinned(s)).collect();
    for &s in &stack {
        from_src[s] = true;
    }
    while let Some(s) = stack.pop() {
        for &u in &users[s] {
            if !from_src[u] {
                from_src[u] = true;
                stack.push(u);
            }
        }
    }
    let relevant = |s: usize| fw(s) && from_src[s] && dist[s] != u32::MAX;
    let forced = |s: usize| used[s] && pinned(s);
    let cap = |s: usize| -> i64 {
        let bytes = bytes_of(info.meta(s)).min(MAX_BYTES) as i64;
        let penalty = if info.is_primal(s) { 1 } else { 2 + i64::from(dist[s].min(61)) };
        bytes * SCALE + penalty
    };
    let (source, sink) = (0usize, 1usize);
    let vin = |s: usize| 2 + 2 * s;
    let vout = |s: usize| 3 + 2 * s;
    let mut saved: BTreeSet<usize> = BTreeSet::new();
    let mut vertices = vec![source, sink];
    let mut edges: Vec<Edge> = Vec::new();
    let mut finite_bound: i64 = 0;
    for s in (0..total).filter(|&s| relevant(s)) {
        vertices.push(vout(s));
        if forced(s) {
            saved.insert(s);
            edges.push(((source, vout(s)), INF));
        } else {
            if pinned(s) {
                // `source -> v_in` is infinite, so `v_in` is always on the source side:
                // contract it into the source (exact), which also drops the edges into
                // it and splits the network into independent components at every
                // primal and banned node.
                edges.push(((source, vout(s)), cap(s)));
            } else {
                vertices.push(vin(s));
                edges.push(((vin(s), vout(s)), cap(s)));
            }
            if used[s] {
                edges.push(((vout(s), sink), INF));
                finite_bound = finite_bound.saturating_add(cap(s));
            }
        }
        for &u in users[s].iter().filter(|&&u| relevant(u) && !forced(u) && !pinned(u)) {
            edges.push(((vout(s), vin(u)), INF));
        }
    }
    if finite_bound >= INF {
        return Err(PartitionError::Unsupported("saved values too large for the min-cut network".into()));
    }
    for ((a, b), _) in cut_by_component(&vertices, source, sink, edges) {
        // A cut edge is `v_in -> v_out`, or `source -> v_out` for a contracted `v_in`.
        let inner = a >= 2 && a % 2 == 0 && b == a + 1;
        let contracted = a == source && b >= 3 && b % 2 == 1 && pinned((b - 3) / 2);
        if !inner && !contracted {
            return Err(PartitionError::Internal(format!("min cut crosses an infinite edge ({a} -> {b})")));
        }
        saved.insert((b - 3) / 2);
    }
    Ok(saved.into_iter().collect())
}

/// A minimum `source`–`sink` cut, computed per connected component of the network
/// without `source` and `sink`. Flow paths never cross components (every path leaves
/// the source, stays in one component, and enters the sink), so the max flow is the
/// sum of the components' and the union of their min cuts is a min cut. Each component
/// is solved by Dinic's algorithm (`flow`), which stays near-linear even when one
/// component spans the whole graph (a weight that every step of a deep chain reads,
/// and that the backward does not use directly, joins all the steps into one).
fn cut_by_component(vertices: &[usize], source: usize, sink: usize, edges: Vec<Edge>) -> Vec<Edge> {
    let size = vertices.iter().copied().max().map_or(0, |m| m + 1);
    let mut parent: Vec<usize> = (0..size).collect();
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    let terminal = |v: usize| v == source || v == sink;
    for &((a, b), _) in &edges {
        if !terminal(a) && !terminal(b) {
            let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
            if ra != rb {
                parent[ra] = rb;
            }
        }
    }
    // Group edges by the component of their non-terminal end.
    let mut groups: HashMap<usize, Vec<Edge>> = HashMap::new();
    for e in edges {
        let ((a, b), _) = e;
        let v = if terminal(a) { b } else { a };
        if terminal(v) {
            continue; // a source -> sink edge cannot occur (both ends finite-capacity free)
        }
        groups.entry(find(&mut parent, v)).or_default().push(e);
    }
    let mut roots: Vec<usize> = groups.keys().copied().collect();
    roots.sort_unstable();
    // Local vertex numbers of the component being solved (`u32::MAX` elsewhere).
    let mut local = vec![u32::MAX; size.max(source + 1).max(sink + 1)];
    let mut cut = Vec::new();
    for r in roots {
        let group = groups.remove(&r).unwrap_or_default();
        let touches = |t: usize| group.iter().any(|((a, b), _)| *a == t || *b == t);
        if !touches(source) || !touches(sink) {
            continue; // no source-to-sink path: nothing to cut
        }
        let mut verts: Vec<usize> = vec![source, sink];
        local[source] = 0;
        local[sink] = 1;
        for &((a, b), _) in &group {
            for v in [a, b] {
                if local[v] == u32::MAX {
                    local[v] = verts.len() as u32;
                    verts.push(v);
                }
            }
        }
        let numbered: Vec<(u32, u32, i64)> = group.iter().map(|&((a, b), c)| (local[a], local[b], c)).collect();
        cut.extend(flow::min_cut(verts.len(), 0, 1, &numbered).into_iter().map(|k| group[k]));
        for &v in &verts {
            local[v] = u32::MAX;
        }
    }
    cut
}

/// The budget-0 saved set: primals and banned outputs reached from the backward's uses
/// through recomputable forward nodes.
pub(crate) fn recompute_all(info: &JointInfo<'_>) -> Vec<usize> {
    let seen =
        super::joint::reach(&info.args, info.bw_uses.iter().copied(), |s| !info.is_primal(s) && !info.is_banned(s));
    (0..seen.len()).filter(|&s| seen[s] && (info.is_primal(s) || info.is_banned(s))).collect()
}

/// Activation bytes of a saved set (primals excluded).
pub(crate) fn activation_bytes(info: &JointInfo<'_>, saved: &BTreeSet<usize>) -> u64 {
    saved.iter().filter(|&&s| !info.is_primal(s)).map(|&s| bytes_of(info.meta(s))).sum()
}

/// Moving `v` (see the module docs): the values it newly saves (its recompute
/// frontier minus what is saved already) and the FLOPs it recomputes.
fn move_of(info: &JointInfo<'_>, saved: &BTreeSet<usize>, v: usize) -> (Vec<usize>, u64) {
    let mut added = Vec::new();
    let mut flops = info.flops(v);
    let mut seen: HashSet<usize> = HashSet::new();
    let mut stack: Vec<usize> = info.args[v].clone();
    while let Some(a) = stack.pop() {
        if !seen.insert(a) {
            continue;
        }
        if saved.contains(&a) {
            continue;
        }
        if info.is_primal(a) || info.is_banned(a) {
            added.push(a);
        } else {
            flops = flops.saturating_add(info.flops(a));
            stack.extend(info.args[a].iter().copied());
        }
    }
    (added, flops)
}

/// Greedily trade activation memory for recomputation, from `start` down to `target`
/// activation bytes (see the module docs). Each candidate move is scored from the bytes
/// it removes and adds, without building the saved set it would give.
pub(crate) fn shrink_to_budget(info: &JointInfo<'_>, start: &[usize], target: f64) -> Vec<usize> {
    let mut saved: BTreeSet<usize> = start.iter().copied().collect();
    let mut now = activation_bytes(info, &saved);
    let act = |s: usize| if info.is_primal(s) { 0 } else { bytes_of(info.meta(s)) };
    while now as f64 > target {
        let mut best: Option<(f64, usize, Vec<usize>, u64)> = None;
        for &v in &saved {
            if info.is_primal(v) || info.is_banned(v) || v < info.n_inputs() {
                continue;
            }
            let (added, flops) = move_of(info, &saved, v);
            let after = (now - act(v)).saturating_add(added.iter().map(|&a| act(a)).sum());
            if after >= now {
                continue;
            }
            let score = (now - after) as f64 / flops.max(1) as f64;
            if best.as_ref().is_none_or(|(b, ..)| score > *b) {
                best = Some((score, v, added, after));
            }
        }
        let Some((_, v, added, after)) = best else { break };
        saved.remove(&v);
        saved.extend(added);
        now = after;
    }
    saved.into_iter().collect()
}
