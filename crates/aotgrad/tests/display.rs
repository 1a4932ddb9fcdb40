//! Printing tensors as PyTorch lays them out (expected strings follow PyTorch 2.15's
//! `print` of the same values, with our dtype spelling).

use aotgrad::prelude::*;

fn f32t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape, DType::F32).unwrap()
}

#[test]
fn small_tensors_print_like_pytorch() {
    assert_eq!(f32t(&[1.0, 2.0, 3.0], &[3]).to_string(), "tensor([1., 2., 3.], dtype=f32)");
    assert_eq!(f32t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).to_string(), "tensor([[1., 2.],\n        [3., 4.]], dtype=f32)");
    assert_eq!(f32t(&[1.5, -2.25], &[2]).to_string(), "tensor([ 1.5000, -2.2500], dtype=f32)");
    assert_eq!(f32t(&[1e-5, 1.0], &[2]).to_string(), "tensor([1.0000e-05, 1.0000e+00], dtype=f32)");
    assert_eq!(Tensor::from_i64(&[3, -10], &[2]).unwrap().to_string(), "tensor([  3, -10], dtype=i64)");
    assert_eq!(Tensor::from_vec(vec![true, false], &[2]).unwrap().to_string(), "tensor([ True, False], dtype=bool)");
    assert_eq!(f32t(&[7.0], &[]).to_string(), "tensor(7., dtype=f32)");
    assert_eq!(f32t(&[f64::NAN, f64::INFINITY], &[2]).to_string(), "tensor([nan, inf], dtype=f32)");
    let x = f32t(&[1.0], &[1]).requires_grad(true).unwrap();
    assert_eq!(x.to_string(), "tensor([1.], dtype=f32, requires_grad=true)");
    // Views print their own elements.
    let t = f32t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).t().unwrap();
    assert_eq!(t.to_string(), "tensor([[1., 4.],\n        [2., 5.],\n        [3., 6.]], dtype=f32)");
    // Rank 3: blank lines between the outer blocks.
    let r3 = Tensor::arange(0, 8, 1, DType::I64).unwrap().view(&[2, 2, 2]).unwrap();
    assert_eq!(
        r3.to_string(),
        "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]], dtype=i64)"
    );
}

#[test]
fn large_tensors_are_summarized() {
    let x = Tensor::arange(0, 2000, 1, DType::I64).unwrap();
    assert_eq!(x.to_string(), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], dtype=i64)");
    let m = Tensor::arange(0, 1100, 1, DType::I64).unwrap().view(&[100, 11]).unwrap();
    let s = m.to_string();
    assert!(s.starts_with("tensor([[   0,    1,    2,  ...,    8,    9,   10],"), "{s}");
    assert!(s.contains("        ...,\n"), "{s}");
    assert!(s.ends_with("[1089, 1090, 1091,  ..., 1097, 1098, 1099]], dtype=i64)"), "{s}");
}
