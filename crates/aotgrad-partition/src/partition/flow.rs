//! Maximum flow and minimum cut by Dinic's algorithm.
//!
//! Each phase labels the vertices by their breadth-first distance from the source in
//! the residual network, then saturates every shortest augmenting path at once (a
//! *blocking flow*) with a depth-first search that remembers, per vertex, the next arc
//! to try. A phase therefore costs one pass over the arcs plus the length of each
//! path it augments, and there are as many phases as distinct shortest-path lengths.
//! On the partitioner's networks (chains of forward ops, sometimes joined through a
//! value many steps read, like a weight) that is a small constant, so the solve is
//! near-linear in the network's size; Edmonds–Karp, which searches the whole network
//! again for every single augmenting path, is quadratic as soon as one component
//! spans the whole graph.
//!
//! The cut returned is the one the residual network of a maximum flow defines: the
//! arcs from the vertices the source still reaches to those it does not. That set of
//! vertices is the same for every maximum flow, so the cut does not depend on the
//! algorithm or on the order in which paths were found.

use std::collections::VecDeque;

/// Residual network over vertices `0..n`; arc `2k` is the `k`-th edge, `2k + 1` its
/// reverse (capacity 0 to start with).
struct Network {
    /// Head of each arc.
    to: Vec<u32>,
    /// Residual capacity of each arc.
    cap: Vec<i64>,
    /// Arcs leaving vertex `v`: `adj[start[v]..start[v + 1]]`.
    start: Vec<usize>,
    adj: Vec<u32>,
}

impl Network {
    fn new(n: usize, edges: &[(u32, u32, i64)]) -> Network {
        let mut to = Vec::with_capacity(2 * edges.len());
        let mut cap = Vec::with_capacity(2 * edges.len());
        let mut start = vec![0usize; n + 1];
        for &(a, b, c) in edges {
            to.push(b);
            cap.push(c);
            to.push(a);
            cap.push(0);
            start[a as usize + 1] += 1;
            start[b as usize + 1] += 1;
        }
        for v in 0..n {
            start[v + 1] += start[v];
        }
        let mut fill = start.clone();
        let mut adj = vec![0u32; 2 * edges.len()];
        for (k, &(a, b, _)) in edges.iter().enumerate() {
            adj[fill[a as usize]] = (2 * k) as u32;
            fill[a as usize] += 1;
            adj[fill[b as usize]] = (2 * k + 1) as u32;
            fill[b as usize] += 1;
        }
        Network { to, cap, start, adj }
    }

    /// Tail of arc `e` (the head of its reverse).
    fn from(&self, e: usize) -> usize {
        self.to[e ^ 1] as usize
    }

    /// Breadth-first distances from `source` over arcs with residual capacity
    /// (`u32::MAX` where unreached). True when `sink` is reached.
    fn levels(&self, source: usize, sink: usize, level: &mut [u32], queue: &mut VecDeque<usize>) -> bool {
        level.fill(u32::MAX);
        level[source] = 0;
        queue.clear();
        queue.push_back(source);
        while let Some(v) = queue.pop_front() {
            for &e in &self.adj[self.start[v]..self.start[v + 1]] {
                let (e, w) = (e as usize, self.to[e as usize] as usize);
                if self.cap[e] > 0 && level[w] == u32::MAX {
                    level[w] = level[v] + 1;
                    queue.push_back(w);
                }
            }
        }
        level[sink] != u32::MAX
    }

    /// Saturate every shortest augmenting path of the level graph (iteratively, so a
    /// path as long as the graph needs no call stack).
    fn blocking_flow(&mut self, source: usize, sink: usize, level: &[u32], next: &mut [usize], path: &mut Vec<usize>) {
        next.copy_from_slice(&self.start[..level.len()]);
        path.clear();
        let mut v = source;
        loop {
            if v == sink {
                let push = path.iter().map(|&e| self.cap[e]).min().unwrap_or(0);
                for &e in path.iter() {
                    self.cap[e] -= push;
                    self.cap[e ^ 1] += push;
                }
                // Resume from the tail of the first arc the push saturated.
                let k = path.iter().position(|&e| self.cap[e] == 0).unwrap_or(0);
                v = self.from(path[k]);
                path.truncate(k);
                continue;
            }
            let end = self.start[v + 1];
            let mut advanced = false;
            while next[v] < end {
                let e = self.adj[next[v]] as usize;
                let w = self.to[e] as usize;
                if self.cap[e] > 0 && level[w] == level[v] + 1 {
                    path.push(e);
                    v = w;
                    advanced = true;
                    break;
                }
                next[v] += 1;
            }
            if !advanced {
                // `v` leads nowhere in this phase: step back and skip the arc into it.
                let Some(e) = path.pop() else { return };
                v = self.from(e);
                next[v] += 1;
            }
        }
    }
}

/// A minimum `source`–`sink` cut of the network on vertices `0..n` with the given
/// edges (`(from, to, capacity)`, capacities positive and their sum along any path
/// below `i64::MAX / 2`; parallel edges add up). Returns the indices (into `edges`) of
/// the cut edges, ascending: those from a vertex the source reaches in the residual
/// network of a maximum flow to one it does not.
pub(crate) fn min_cut(n: usize, source: usize, sink: usize, edges: &[(u32, u32, i64)]) -> Vec<usize> {
    if source == sink {
        return Vec::new();
    }
    let mut net = Network::new(n, edges);
    let mut level = vec![u32::MAX; n];
    let mut next = vec![0usize; n];
    let mut queue = VecDeque::new();
    let mut path = Vec::new();
    while net.levels(source, sink, &mut level, &mut queue) {
        net.blocking_flow(source, sink, &level, &mut next, &mut path);
    }
    // The last labelling is exactly the set the source reaches in the final residual
    // network.
    (0..edges.len())
        .filter(|&k| {
            let (a, b, _) = edges[k];
            level[a as usize] != u32::MAX && level[b as usize] == u32::MAX
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::min_cut;
    use pathfinding::directed::edmonds_karp::edmonds_karp_sparse;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// The cut by Edmonds–Karp (`pathfinding`), as a set of `(from, to)` pairs.
    fn reference(n: usize, source: usize, sink: usize, edges: &[(u32, u32, i64)]) -> BTreeSet<(u32, u32)> {
        let vs: Vec<u32> = (0..n as u32).collect();
        let caps = edges.iter().map(|&(a, b, c)| ((a, b), c));
        let (_, _, cut) = edmonds_karp_sparse(&vs, &(source as u32), &(sink as u32), caps);
        cut.into_iter().map(|(e, _)| e).collect()
    }

    fn dinic(n: usize, source: usize, sink: usize, edges: &[(u32, u32, i64)]) -> BTreeSet<(u32, u32)> {
        min_cut(n, source, sink, edges).into_iter().map(|k| (edges[k].0, edges[k].1)).collect()
    }

    #[test]
    fn textbook_network() {
        // CLRS figure 26.1: max flow 23, cut {(1,3), (4,3), (4,5)}.
        let edges =
            [(0, 1, 16), (0, 2, 13), (1, 3, 12), (2, 1, 4), (2, 4, 14), (3, 2, 9), (3, 5, 20), (4, 3, 7), (4, 5, 4)];
        let cut = dinic(6, 0, 5, &edges);
        assert_eq!(cut, BTreeSet::from([(1, 3), (4, 3), (4, 5)]));
        assert_eq!(cut.iter().map(|&(a, b)| edges.iter().find(|e| (e.0, e.1) == (a, b)).unwrap().2).sum::<i64>(), 23);
        assert_eq!(cut, reference(6, 0, 5, &edges));
    }

    #[test]
    fn long_chain_needs_no_call_stack() {
        let n = 200_000;
        let edges: Vec<(u32, u32, i64)> =
            (0..n - 1).map(|v| (v as u32, v as u32 + 1, 1 + (v as i64 * 7919) % 1000)).collect();
        let cut = dinic(n, 0, n - 1, &edges);
        assert_eq!(cut.len(), 1);
        let (a, _) = *cut.iter().next().unwrap();
        assert_eq!(edges[a as usize].2, 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Same cut as Edmonds–Karp on random networks (the residual-reachable set is
        /// unique, so the cuts agree edge for edge).
        #[test]
        fn agrees_with_edmonds_karp(
            n in 2usize..12,
            raw in proptest::collection::vec((0u32..12, 0u32..12, 1i64..20), 0..40),
        ) {
            let mut seen = BTreeSet::new();
            let edges: Vec<(u32, u32, i64)> = raw
                .into_iter()
                .map(|(a, b, c)| (a % n as u32, b % n as u32, c))
                .filter(|&(a, b, _)| a != b && seen.insert((a, b)))
                .collect();
            prop_assert_eq!(dinic(n, 0, n - 1, &edges), reference(n, 0, n - 1, &edges));
        }
    }
}
