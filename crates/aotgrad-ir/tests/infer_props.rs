//! Property tests for shape inference: broadcasting against an independent simple
//! implementation, and random chains of view ops against an element-address model
//! that composes the ops by index arithmetic alone (no strides).

use aotgrad_ir::infer::{broadcast_shapes, has_internal_overlap, infer};
use aotgrad_ir::{DType, Dim, Op, StaticOracle, TensorMeta};
use proptest::prelude::*;

fn dims(v: &[usize]) -> aotgrad_ir::Dims {
    v.iter().map(|&c| Dim::from(c)).collect()
}

/// Broadcasting the textbook way: pad with leading 1s, then per dim equal sizes stay,
/// a 1 takes the other size, anything else is incompatible.
fn simple_broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let pad = |v: &[usize]| {
        let mut p = vec![1; n - v.len()];
        p.extend_from_slice(v);
        p
    };
    let (a, b) = (pad(a), pad(b));
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Some(x),
            (1, _) => Some(y),
            (_, 1) => Some(x),
            _ => None,
        })
        .collect()
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![Just(1usize), Just(1), 0usize..4], 0..5)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn broadcast_matches_simple_model(a in shape_strategy(), b in shape_strategy()) {
        let ab = broadcast_shapes("add", &dims(&a), &dims(&b), &mut StaticOracle);
        let ba = broadcast_shapes("add", &dims(&b), &dims(&a), &mut StaticOracle);
        match simple_broadcast(&a, &b) {
            Some(want) => {
                prop_assert_eq!(ab.clone().unwrap(), dims(&want));
                prop_assert_eq!(ba.unwrap(), dims(&want));
                // Each result dim is the max of the inputs', or 0 when a 0 meets a 1.
                for (i, w) in want.iter().enumerate() {
                    let get = |v: &[usize]| (i + v.len()).checked_sub(want.len()).map_or(1, |j| v[j]);
                    let (x, y) = (get(&a), get(&b));
                    prop_assert_eq!(*w, if x == 0 || y == 0 { 0 } else { x.max(y) });
                }
            }
            None => {
                prop_assert_eq!(ab.unwrap_err().kind(), "broadcast");
                prop_assert_eq!(ba.unwrap_err().kind(), "broadcast");
            }
        }
    }
}

/// A view as the model sees it: its shape and, for every element in row-major
/// order, the flat index into the contiguous base it reads.
#[derive(Clone, Debug)]
struct Model {
    shape: Vec<usize>,
    addr: Vec<usize>,
}

/// All multi-indices of a shape, row-major.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &n in shape {
        out = out.into_iter().flat_map(|p| (0..n).map(move |i| [p.clone(), vec![i]].concat())).collect();
    }
    out
}

/// Row-major flat position of a multi-index.
fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (i, n)| acc * n + i)
}

impl Model {
    /// A new view whose element at index `j` is the old element at `src(j)`.
    fn remap(&self, shape: Vec<usize>, src: impl Fn(&[usize]) -> Vec<usize>) -> Model {
        let addr = indices(&shape).iter().map(|j| self.addr[ravel(&src(j), &self.shape)]).collect();
        Model { shape, addr }
    }
    fn reshape(&self, shape: Vec<usize>) -> Model {
        Model { shape, addr: self.addr.clone() }
    }
}

/// One random view op, chosen relative to the current shape from raw numbers.
/// Returns the op and the model after it, or `None` when it does not apply.
fn pick(m: &Model, kind: u8, a: usize, b: usize, c: usize) -> Option<(Op, Model)> {
    let r = m.shape.len();
    match kind % 8 {
        0 if r > 0 => {
            // A permutation: rotate by a, then swap two entries.
            let mut perm: Vec<usize> = (0..r).map(|i| (i + a) % r).collect();
            perm.swap(b % r, c % r);
            let shape = perm.iter().map(|&p| m.shape[p]).collect();
            let p2 = perm.clone();
            let model = m.remap(shape, move |j| {
                let mut o = vec![0; r];
                for (k, &p) in p2.iter().enumerate() {
                    o[p] = j[k];
                }
                o
            });
            Some((Op::Permute(perm), model))
        }
        1 if r > 0 => {
            let (x, y) = (a % r, b % r);
            let mut shape = m.shape.clone();
            shape.swap(x, y);
            let model = m.remap(shape, |j| {
                let mut o = j.to_vec();
                o.swap(x, y);
                o
            });
            Some((Op::Transpose(x, y), model))
        }
        2 if r > 0 => {
            let d = a % r;
            let n = m.shape[d];
            let start = b % (n + 1);
            let end = start + c % (n - start + 1);
            let step = 1 + (a / 7) % 3;
            let mut shape = m.shape.clone();
            shape[d] = (end - start).div_ceil(step);
            let model = m.remap(shape, |j| {
                let mut o = j.to_vec();
                o[d] = start + j[d] * step;
                o
            });
            let op = Op::Slice { dim: d, start: start.into(), end: end.into(), step: step as i64 };
            Some((op, model))
        }
        3 if r > 0 && m.shape[a % r] > 0 => {
            let d = a % r;
            let index = b % m.shape[d];
            let mut shape = m.shape.clone();
            shape.remove(d);
            let model = m.remap(shape, |j| {
                let mut o = j.to_vec();
                o.insert(d, index);
                o
            });
            Some((Op::Select { dim: d, index: index.into() }, model))
        }
        4 => {
            // Stretch every size-1 dim (or not), maybe add a leading dim.
            let mut shape: Vec<usize> = m
                .shape
                .iter()
                .enumerate()
                .map(|(i, &n)| if n == 1 && (a >> i) & 1 == 1 { 1 + (b + i) % 3 } else { n })
                .collect();
            let lead = c % 3;
            for _ in 0..lead {
                shape.insert(0, 1 + (a + b) % 3);
            }
            let old = m.shape.clone();
            let model = m.remap(shape.clone(), move |j| {
                j[lead..].iter().zip(&old).map(|(&i, &n)| if n == 1 { 0 } else { i }).collect()
            });
            Some((Op::Expand(dims(&shape)), model))
        }
        5 => {
            let d = a % (r + 1);
            let mut shape = m.shape.clone();
            shape.insert(d, 1);
            Some((Op::Unsqueeze(d), m.reshape(shape)))
        }
        6 => {
            let ones: Vec<usize> = (0..r).filter(|&i| m.shape[i] == 1).collect();
            let keep = |i: &usize| !ones.contains(i);
            let shape = (0..r).filter(keep).map(|i| m.shape[i]).collect();
            Some((Op::Squeeze(ones), m.reshape(shape)))
        }
        7 if r > 0 => {
            // Merge two neighbouring dims, or split one into (f, n / f).
            let d = a % r;
            let mut shape = m.shape.clone();
            if d + 1 < r && b.is_multiple_of(2) {
                let merged = shape[d] * shape[d + 1];
                shape.splice(d..d + 2, [merged]);
            } else {
                let n = shape[d];
                let f = (1..=n.max(1)).filter(|&f| n.is_multiple_of(f)).nth(c % 3).unwrap_or(1);
                shape.splice(d..d + 1, [f, n / f.max(1)]);
            }
            Some((Op::View(dims(&shape)), m.reshape(shape)))
        }
        _ => None,
    }
}

fn concrete(meta: &TensorMeta) -> (Vec<usize>, Vec<usize>, usize) {
    (meta.concrete_shape().unwrap(), meta.concrete_strides().unwrap(), meta.concrete_offset().unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn view_chains_match_element_addresses(
        base in prop::collection::vec(0usize..5, 1..5),
        steps in prop::collection::vec((any::<u8>(), 0usize..64, 0usize..64, 0usize..64), 1..7),
    ) {
        let numel: usize = base.iter().product();
        let mut model = Model { shape: base.clone(), addr: (0..numel).collect() };
        let mut meta = TensorMeta::from_sizes(&base, DType::F32);
        for (kind, a, b, c) in steps {
            let Some((op, next)) = pick(&model, kind, a, b, c) else { continue };
            match infer(&op, &[&meta], &mut StaticOracle) {
                Ok(m) => {
                    meta = m;
                    model = next;
                }
                Err(e) => {
                    // Only a view of a non-contiguous layout may be refused (it needs a copy).
                    prop_assert!(matches!(op, Op::View(_)), "{} failed: {e}", op.name());
                    prop_assert_eq!(e.kind(), "view");
                    prop_assert!(!meta.is_contiguous(), "contiguous {meta} refused {e}");
                    continue;
                }
            }
            let (shape, strides, offset) = concrete(&meta);
            prop_assert_eq!(&shape, &model.shape, "after {}", op.name());
            for j in indices(&shape) {
                let at = offset + j.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>();
                prop_assert_eq!(at, model.addr[ravel(&j, &shape)], "element {:?} of {} after {}", j, meta, op.name());
            }
            let mut sorted = model.addr.clone();
            sorted.sort_unstable();
            let dup = sorted.windows(2).any(|w| w[0] == w[1]);
            // (Empty tensors have no elements to collide, but PyTorch still reports a
            // stride-0 dim of size > 1 as overlapping.)
            if !model.addr.is_empty() {
                prop_assert_eq!(has_internal_overlap(&meta), dup, "overlap of {}", meta);
            }
        }
    }
}
