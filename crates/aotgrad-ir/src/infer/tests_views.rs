//! Unit tests: view ops and the shared shape helpers, with hand-derived strides and
//! offsets (PyTorch's values), error kinds, and symbolic dims.

use super::test_util::*;
use super::*;
use crate::dtype::DType;
use crate::op::UnaryOp;
use crate::sym::StaticOracle;

fn slice(dim: usize, start: i64, end: i64, step: i64) -> Op {
    Op::Slice { dim, start: Dim::Const(start), end: Dim::Const(end), step }
}

fn select(dim: usize, index: i64) -> Op {
    Op::Select { dim, index: Dim::Const(index) }
}

#[test]
fn view_contiguous_and_strided() {
    let x = f(&[2, 3, 4]);
    assert_eq!(ok(&Op::View(dims(&[6, 4])), &[&x]), strided(&[6, 4], &[4, 1], 0, DType::F32));
    // x = [4, 6] contiguous, t() -> [6, 4] strides [1, 6]. Element (i, j, k) of the view
    // [6, 2, 2] is t[i][2j + k] = x[2j + k][i], flat (2j + k) * 6 + i.
    let t = ok(&Op::T, &[&f(&[4, 6])]);
    assert_eq!(t, strided(&[6, 4], &[1, 6], 0, DType::F32));
    assert_eq!(ok(&Op::View(dims(&[6, 2, 2])), &[&t]), strided(&[6, 2, 2], &[1, 12, 6], 0, DType::F32));
    // Size-1 dims may be inserted anywhere (PyTorch gives strides (1, 24, 6)).
    assert_eq!(ok(&Op::View(dims(&[6, 1, 4])), &[&t]), strided(&[6, 1, 4], &[1, 24, 6], 0, DType::F32));
    // Flattening the transposed tensor needs a copy.
    let e = err(&Op::View(dims(&[24])), &[&t], "view", &["view", "[6, 4]", "[24]", "use reshape"]);
    assert!(e.to_string().contains("not compatible with the input's size and stride"));
    err(&Op::View(dims(&[5, 5])), &[&x], "view", &["view", "[2, 3, 4]", "[5, 5]"]);
    err(&Op::View(dims(&[-1, 24])), &[&x], "invalid", &["view", "-1"]);
    // The offset is kept; an empty tensor takes contiguous-like strides.
    let off = strided(&[2, 3], &[3, 1], 5, DType::I64);
    assert_eq!(ok(&Op::View(dims(&[3, 2])), &[&off]), strided(&[3, 2], &[2, 1], 5, DType::I64));
    assert_eq!(ok(&Op::View(dims(&[3, 0])), &[&f(&[0, 3])]), strided(&[3, 0], &[1, 1], 0, DType::F32));
    // 0-d <-> size-1 views.
    assert_eq!(ok(&Op::View(crate::dims![]), &[&f(&[1, 1])]), f(&[]));
    assert_eq!(ok(&Op::View(dims(&[1, 1])), &[&f(&[])]), strided(&[1, 1], &[1, 1], 0, DType::F32));
}

#[test]
fn views_of_views_compose_strides_and_offset() {
    // x [4, 5, 6] strides [30, 6, 1]; transpose(0, 2) -> [6, 5, 4] strides [1, 6, 30];
    // [:, 1:5:2, :] -> [6, 2, 4] strides [1, 12, 30] offset 6; select(2, 3) -> [6, 2]
    // strides [1, 12] offset 96. Element (a, b) is x[3][1 + 2b][a] = 90 + 6 + 12b + a.
    let x = f(&[4, 5, 6]);
    let t = ok(&Op::Transpose(0, 2), &[&x]);
    assert_eq!(t, strided(&[6, 5, 4], &[1, 6, 30], 0, DType::F32));
    let s = ok(&slice(1, 1, 5, 2), &[&t]);
    assert_eq!(s, strided(&[6, 2, 4], &[1, 12, 30], 6, DType::F32));
    let v = ok(&select(2, 3), &[&s]);
    assert_eq!(v, strided(&[6, 2], &[1, 12], 96, DType::F32));
    // A slice whose length is not a multiple of the step rounds up: 1..6 step 2 -> 3.
    let s2 = ok(&slice(2, 1, 6, 2), &[&x]);
    assert_eq!(s2, strided(&[4, 5, 3], &[30, 6, 2], 1, DType::F32));
    // unsqueeze of a non-contiguous tensor: stride = size * stride of the dim it precedes.
    let u = ok(&Op::Unsqueeze(1), &[&ok(&Op::T, &[&f(&[2, 3])])]);
    assert_eq!(u, strided(&[3, 1, 2], &[1, 6, 3], 0, DType::F32));
    assert_eq!(ok(&Op::Unsqueeze(2), &[&f(&[2, 3])]), strided(&[2, 3, 1], &[3, 1, 1], 0, DType::F32));
    assert_eq!(ok(&Op::Unsqueeze(0), &[&f(&[2, 3])]), strided(&[1, 2, 3], &[6, 3, 1], 0, DType::F32));
    let p = ok(&Op::Permute(vec![2, 0, 1]), &[&x]);
    assert_eq!(p, strided(&[6, 4, 5], &[1, 30, 6], 0, DType::F32));
    let sq = ok(&Op::Squeeze(vec![1]), &[&strided(&[2, 1, 3], &[3, 3, 1], 4, DType::F32)]);
    assert_eq!(sq, strided(&[2, 3], &[3, 1], 4, DType::F32));
    let a = strided(&[2, 2], &[1, 0], 3, DType::F64);
    assert_eq!(ok(&Op::Alias, &[&a]), a);
    let as_ = Op::AsStrided { size: (dims(&[2, 2])).to_vec(), stride: (dims(&[1, 2])).to_vec(), offset: Dim::Const(1) };
    assert_eq!(ok(&as_, &[&f(&[6])]), strided(&[2, 2], &[1, 2], 1, DType::F32));
}

#[test]
fn expand_follows_infer_expand_geometry() {
    let x = strided(&[3, 1], &[1, 1], 2, DType::F32);
    assert_eq!(ok(&Op::Expand(dims(&[2, 3, 4])), &[&x]), strided(&[2, 3, 4], &[0, 1, 0], 2, DType::F32));
    // A new leading dim of size 1 gets size * stride of the next dim.
    assert_eq!(ok(&Op::Expand(dims(&[1, 3])), &[&f(&[3])]), strided(&[1, 3], &[3, 1], 0, DType::F32));
    // 0-d tensors expand with all-zero strides.
    assert_eq!(ok(&Op::Expand(dims(&[2, 1])), &[&f(&[])]), strided(&[2, 1], &[0, 0], 0, DType::F32));
    err(&Op::Expand(dims(&[3, 4])), &[&f(&[3, 2])], "broadcast", &["expand", "[3, 2]", "[3, 4]"]);
    err(&Op::Expand(dims(&[3])), &[&f(&[3, 1])], "invalid", &["expand", "[3]", "[3, 1]"]);
    let shape =
        resolve_expand_shape("expand", &dims(&[3, 1]), &[Some(2.into()), None, Some(4.into())], &mut StaticOracle);
    assert_eq!(shape.unwrap(), dims(&[2, 3, 4]));
    let e = resolve_expand_shape("expand", &dims(&[3]), &[None, Some(3.into())], &mut StaticOracle).unwrap_err();
    check_err(&e, "invalid", &["expand", "-1", "leading"]);
}

#[test]
fn view_op_errors() {
    let x = f(&[2, 3, 4]);
    err(&Op::Permute(vec![0, 0, 1]), &[&x], "invalid", &["permute", "repeated"]);
    err(&Op::Permute(vec![0, 1, 3]), &[&x], "dim", &["permute", "3"]);
    err(&Op::Permute(vec![0, 1]), &[&x], "invalid", &["permute", "[2, 3, 4]"]);
    err(&Op::Transpose(0, 3), &[&x], "dim", &["transpose"]);
    err(&Op::T, &[&x], "invalid", &["t", "[2, 3, 4]"]);
    assert_eq!(ok(&Op::T, &[&f(&[5])]), f(&[5]));
    assert_eq!(ok(&Op::Transpose(0, 0), &[&f(&[])]), f(&[]));
    err(&Op::Squeeze(vec![0]), &[&x], "invalid", &["squeeze", "[2, 3, 4]"]);
    err(&Op::Squeeze(vec![1, 0]), &[&f(&[1, 1])], "invalid", &["squeeze"]);
    err(&Op::Unsqueeze(4), &[&x], "dim", &["unsqueeze"]);
    err(&slice(1, 0, 4, 1), &[&x], "invalid", &["slice", "[2, 3, 4]"]);
    err(&slice(1, 2, 1, 1), &[&x], "invalid", &["slice"]);
    err(&slice(1, 0, 2, 0), &[&x], "invalid", &["slice", "step"]);
    err(&slice(0, 0, 0, 1), &[&f(&[])], "invalid", &["slice", "0-dim"]);
    let e = err(&select(1, 3), &[&x], "index", &["select", "3"]);
    assert_eq!(e, ShapeError::IndexOutOfRange { op: "select".into(), index: "3".into(), dim: 1, size: "3".into() });
    err(&select(1, -1), &[&x], "index", &["select"]);
    err(&select(0, 0), &[&f(&[])], "invalid", &["select"]);
    let bad = Op::AsStrided { size: dims(&[2]).to_vec(), stride: (dims(&[-1])).to_vec(), offset: Dim::Const(0) };
    err(&bad, &[&x], "invalid", &["as_strided", "stride"]);
    let bad = Op::AsStrided { size: (dims(&[2, 2])).to_vec(), stride: dims(&[1]).to_vec(), offset: Dim::Const(0) };
    err(&bad, &[&x], "invalid", &["as_strided", "[2, 2]"]);
    err(&Op::View(dims(&[24])), &[&x, &x], "arity", &["view"]);
    let malformed = TensorMeta { shape: dims(&[2, 3]), strides: dims(&[1]), offset: Dim::Const(0), dtype: DType::F32 };
    err(&Op::Permute(vec![1, 0]), &[&malformed], "invalid", &["permute", "internal", "[2, 3]"]);
}

#[test]
fn meta_inplace_takes_the_view_meta() {
    let x = f(&[2, 3]);
    let t_ = Op::MetaInPlace(Box::new(Op::T));
    assert_eq!(ok(&t_, &[&x]), strided(&[3, 2], &[1, 3], 0, DType::F32));
    err(&Op::MetaInPlace(Box::new(Op::T)), &[&f(&[1, 2, 3])], "invalid", &["t_"]);
    err(&Op::MetaInPlace(Box::new(Op::Unary(UnaryOp::Neg))), &[&x], "invalid", &["neg_"]);
    err(&Op::MetaInPlace(Box::new(Op::View(dims(&[6])))), &[&x], "invalid", &["view_"]);
}

#[test]
fn resolve_view_shape_rules() {
    let o = &mut StaticOracle;
    let from = dims(&[2, 3, 4]);
    assert_eq!(resolve_view_shape("view", &from, &[None, Some(4.into())], o).unwrap(), dims(&[6, 4]));
    assert_eq!(resolve_view_shape("view", &from, &[Some(24.into())], o).unwrap(), dims(&[24]));
    let e = resolve_view_shape("view", &from, &[None, None], o).unwrap_err();
    check_err(&e, "invalid", &["view", "[-1, -1]"]);
    let e = resolve_view_shape("view", &from, &[Some(5.into()), None], o).unwrap_err();
    check_err(&e, "view", &["view", "[2, 3, 4]", "[5, -1]", "invalid for input of size 24"]);
    let e = resolve_view_shape("view", &from, &[Some(5.into())], o).unwrap_err();
    check_err(&e, "view", &["[5]"]);
    let e = resolve_view_shape("reshape", &dims(&[0, 3]), &[Some(0.into()), None], o).unwrap_err();
    check_err(&e, "view", &["reshape", "[0, -1]", "ambiguous"]);
    let e = resolve_view_shape("view", &from, &[Some((1i64 << 40).into()), Some((1i64 << 40).into()), None], o);
    check_err(&e.unwrap_err(), "invalid", &["view", "more elements"]);
    let e = resolve_view_shape("view", &from, &[Some((-2).into())], o).unwrap_err();
    check_err(&e, "invalid", &["-2"]);
    assert_eq!(resolve_view_shape("view", &dims(&[0, 3]), &[None, Some(3.into())], o).unwrap(), dims(&[0, 3]));
}

#[test]
fn normalize_slice_follows_python() {
    let o = &mut StaticOracle;
    let ten = Dim::Const(10);
    let n = |a: Option<i64>, b: Option<i64>, o: &mut StaticOracle| {
        let (s, e) = normalize_slice("slice", &ten, a, b, 1, o).unwrap();
        (s.as_const().unwrap(), e.as_const().unwrap())
    };
    assert_eq!(n(None, None, o), (0, 10));
    assert_eq!(n(Some(-3), None, o), (7, 10));
    assert_eq!(n(Some(2), Some(-1), o), (2, 9));
    assert_eq!(n(Some(-20), Some(20), o), (0, 10));
    assert_eq!(n(Some(8), Some(3), o), (8, 8));
    assert_eq!(n(Some(12), Some(15), o), (10, 10));
    assert_eq!(n(Some(3), Some(i64::MAX), o), (3, 10));
    assert_eq!(n(Some(i64::MIN), Some(-9), o), (0, 1));
    let e = normalize_slice("slice", &ten, None, None, 0, o).unwrap_err();
    check_err(&e, "invalid", &["slice", "slice step must be positive"]);
}

#[test]
fn symbolic_slices_and_views() {
    // s0 = 5: 2 <= s0 holds, 100 <= s0 does not, s0 < 2 does not.
    let mut o = RecOracle::new(&[5]);
    let (st, en) = normalize_slice("slice", &s(0), Some(2), Some(100), 1, &mut o).unwrap();
    assert_eq!((st, en.clone()), (Dim::Const(2), s(0)));
    assert_eq!(o.guard_text(), vec!["2 <= s0", "s0 < 100", "2 <= s0"]);
    let (st, en) = normalize_slice("slice", &s(0), Some(-2), None, 1, &mut o).unwrap();
    assert_eq!((st.to_string(), en), ("s0 - 2".to_string(), s(0)));
    // ceil(len / step) stays a polynomial when the step divides the non-constant part.
    let two_s0 = s(0).scale(2);
    assert_eq!(slice_len("slice", &Dim::Const(0), &two_s0.add(&Dim::Const(1)), 2).unwrap().to_string(), "s0 + 1");
    assert_eq!(slice_len("slice", &Dim::Const(0), &s(0).scale(4).sub(&Dim::Const(1)), 4).unwrap(), s(0));
    assert_eq!(slice_len("slice", &Dim::Const(0), &Dim::Const(10), 3).unwrap(), Dim::Const(4));
    assert_eq!(slice_len("slice", &Dim::Const(2), &Dim::Const(2), 3).unwrap(), Dim::Const(0));
    let e = slice_len("slice", &Dim::Const(1), &s(0), 2).unwrap_err();
    check_err(&e, "invalid", &["slice", "symbolic slice length not divisible by step"]);
    // view(-1) of [s0, 3] is [3*s0] with stride 1.
    let x = TensorMeta::contiguous(vec![s(0), Dim::Const(3)], DType::F32);
    let mut o = RecOracle::new(&[4]);
    let shape = resolve_view_shape("view", &x.shape, &[None], &mut o).unwrap();
    assert_eq!(shape, crate::dims![s(0).scale(3)]);
    assert!(o.guards.is_empty(), "no decision needed: {:?}", o.guard_text());
    let v = infer(&Op::View(shape), &[&x], &mut o).unwrap();
    assert_eq!(v.strides, dims(&[1]));
    assert_eq!(v.shape[0].to_string(), "3*s0");
    // Symbolic slice: offset and length are polynomials.
    let sl = Op::Slice { dim: 0, start: Dim::Const(1), end: s(0), step: 1 };
    let m = infer(&sl, &[&x], &mut RecOracle::new(&[4])).unwrap();
    assert_eq!((m.shape[0].to_string(), m.offset.clone()), ("s0 - 1".to_string(), Dim::Const(3)));
    // select with a symbolic bound checks through the oracle.
    let e = infer(&select(0, 4), &[&x], &mut RecOracle::new(&[4])).unwrap_err();
    check_err(&e, "index", &["select", "s0"]);
}

#[test]
fn squeeze_dims_and_overlap() {
    let o = &mut StaticOracle;
    let sh = dims(&[1, 3, 1]);
    assert_eq!(squeeze_dims("squeeze", &sh, None, o).unwrap(), vec![0, 2]);
    assert_eq!(squeeze_dims("squeeze", &sh, Some(1), o).unwrap(), Vec::<usize>::new());
    assert_eq!(squeeze_dims("squeeze", &sh, Some(-1), o).unwrap(), vec![2]);
    assert_eq!(squeeze_dims("squeeze", &[], Some(-1), o).unwrap(), Vec::<usize>::new());
    check_err(&squeeze_dims("squeeze", &sh, Some(3), o).unwrap_err(), "dim", &["squeeze", "3"]);
    assert!(has_internal_overlap(&strided(&[2, 3], &[0, 1], 0, DType::F32)));
    assert!(!has_internal_overlap(&strided(&[1, 3], &[0, 1], 0, DType::F32)));
    assert!(!has_internal_overlap(&f(&[2, 3])));
    let sym = TensorMeta { shape: crate::dims![s(0)], strides: dims(&[0]), offset: Dim::Const(0), dtype: DType::F32 };
    assert!(has_internal_overlap(&sym));
}

#[test]
fn view_strides_symbolic() {
    let mut o = RecOracle::new(&[4, 6]);
    let st = view_strides(&[s(0), Dim::Const(3)], &dims(&[3, 1]), &[s(0).scale(3)], &mut o);
    assert_eq!(st, Some(dims(&[1])));
    // [s0, s1] transposed cannot be flattened.
    let t = view_strides(&[s(1), s(0)], &[Dim::Const(1), s(1)], &[s(0).mul(&s(1))], &mut o);
    assert_eq!(t, None);
}

#[test]
fn huge_steps_strides_and_offsets_are_errors_not_overflows() {
    let x = f(&[3]);
    // x[::i64::MAX] has one element (ceil(3 / MAX)); the stride MAX * 1 still fits.
    assert_eq!(slice_len("slice", &Dim::Const(0), &Dim::Const(3), i64::MAX).unwrap(), Dim::Const(1));
    assert_eq!(slice_len("slice", &Dim::Const(3), &Dim::Const(3), i64::MAX).unwrap(), Dim::Const(0));
    assert_eq!(ok(&slice(0, 0, 3, i64::MAX), &[&x]), strided(&[1], &[i64::MAX], 0, DType::F32));
    // With stride 2 the new stride 2 * MAX does not fit.
    let wide = strided(&[2, 3], &[1, 2], 0, DType::F32);
    err(&slice(1, 0, 3, i64::MAX), &[&wide], "invalid", &["slice stride overflows i64"]);
    // A symbolic slice with a huge step: exact symbolic part, constant tail in i128.
    // len = 4*s0 + 3, step 2 -> 2*s0 + 2.
    let len_end = s(0).scale(4).add(&Dim::Const(3));
    assert_eq!(slice_len("slice", &Dim::Const(0), &len_end, 2).unwrap(), s(0).scale(2).add(&Dim::Const(2)));
    let e = slice_len("slice", &Dim::Const(0), &s(0), i64::MAX).unwrap_err();
    check_err(&e, "invalid", &["symbolic slice length not divisible by step"]);
    let e = slice_len("slice", &Dim::Const(i64::MIN), &s(0), 2).unwrap_err();
    check_err(&e, "invalid", &["slice length overflows i64"]);
    // as_strided whose last element does not fit in i64.
    let big = Op::AsStrided {
        size: dims(&[3]).to_vec(),
        stride: (dims(&[i64::MAX / 2 + 1])).to_vec(),
        offset: Dim::Const(0),
    };
    err(&big, &[&x], "invalid", &["as_strided", "the last element reached overflows i64"]);
    let off = Op::AsStrided { size: dims(&[2]).to_vec(), stride: dims(&[1]).to_vec(), offset: Dim::Const(i64::MAX) };
    err(&off, &[&x], "invalid", &["as_strided", "overflows i64"]);
    // ... but a size-1 dim with a huge stride reaches only its first element.
    let tall = ok(
        &Op::AsStrided {
            size: (dims(&[1, 2])).to_vec(),
            stride: (dims(&[i64::MAX, 1])).to_vec(),
            offset: Dim::Const(0),
        },
        &[&x],
    );
    // Views of it whose stride arithmetic overflows are rejected, not wrapped.
    err(&slice(0, 0, 1, 2), &[&tall], "invalid", &["slice stride overflows i64"]);
    let h = strided(&[2, 2], &[1, i64::MAX / 2 + 1], 0, DType::F32);
    err(&Op::Unsqueeze(1), &[&h], "invalid", &["unsqueeze", "unsqueezed stride overflows i64"]);
    err(&slice(1, 0, 2, 3), &[&h], "invalid", &["slice stride overflows i64"]);
    let o = strided(&[2, 2], &[1, i64::MAX / 2 + 1], i64::MAX / 2 + 1, DType::F32);
    err(&select(1, 1), &[&o], "invalid", &["select", "storage offset overflows i64"]);
    err(&slice(1, 1, 2, 1), &[&o], "invalid", &["slice", "storage offset overflows i64"]);
    // view: the contiguity product 2 * (MAX/2 + 1) overflows, so the chunk ends there.
    assert_eq!(view_strides(&h.shape, &h.strides, &dims(&[4]), &mut StaticOracle), None);
    assert_eq!(
        view_strides(&h.shape, &h.strides, &dims(&[1, 2, 2]), &mut StaticOracle),
        Some(dims(&[2, 1, i64::MAX / 2 + 1]))
    );
    // expand of a new leading size-1 dim multiplies size and stride of the next dim.
    err(
        &Op::Expand(dims(&[1, 2, 2])),
        &[&strided(&[2, 2], &[i64::MAX / 2 + 1, 1], 0, DType::F32)],
        "invalid",
        &["expand", "expanded stride overflows i64"],
    );
    // Select at an index far outside a symbolic size is decided, not overflowed.
    let sym = TensorMeta::contiguous(vec![s(0)], DType::F32);
    err(&Op::Select { dim: 0, index: Dim::Const(i64::MIN) }, &[&sym], "index", &["select"]);
}

#[test]
fn unsafe_view_is_a_fresh_contiguous_reshape() {
    // Any input layout: the result is contiguous at offset 0 (fresh storage).
    let t = strided(&[3, 2], &[1, 3], 4, DType::F16);
    assert_eq!(ok(&Op::UnsafeView(dims(&[2, 3])), &[&t]), c(&[2, 3], DType::F16));
    assert_eq!(ok(&Op::UnsafeView(dims(&[6, 1])), &[&t]), c(&[6, 1], DType::F16));
    assert_eq!(ok(&Op::UnsafeView(crate::dims![]), &[&f(&[1, 1])]), f(&[]));
    // `view`'s size rules, under its own name.
    err(&Op::UnsafeView(dims(&[4])), &[&t], "view", &["_unsafe_view", "[3, 2]", "[4]"]);
    err(&Op::UnsafeView(dims(&[-1, 6])), &[&t], "invalid", &["_unsafe_view", "-1"]);
    assert_eq!(Op::UnsafeView(dims(&[2])).aliasing(), crate::op::Aliasing::Fresh);
    // Symbolic sizes: s0 * 3 elements as [3, s0].
    let x = TensorMeta::contiguous(vec![s(0), Dim::Const(3)], DType::F32);
    let want = TensorMeta::contiguous(vec![Dim::Const(3), s(0)], DType::F32);
    assert_eq!(ok(&Op::UnsafeView(crate::dims![Dim::Const(3), s(0)]), &[&x]), want);
}
