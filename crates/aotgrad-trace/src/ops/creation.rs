//! Constructors: filled, ranged and random tensors. Called while a trace is active
//! they produce fake tensors (recorded as graph nodes), otherwise eager ones.
//! (Tensors from Rust data are in [`crate::tensor`]: `from_vec`, `from_f64`, ...)

use crate::error::Result;
use crate::ops::dispatch;
use crate::rng::RngSeed;
use crate::tensor::{dims_at, Tensor};
use aotgrad_ir::{BinaryOp, DType, Dim, Op, Scalar, SourceLoc};

/// **Creation**: filled, ranged and random tensors (`zeros`, `ones`, `full`, `arange`,
/// `rand`, `randn`, the `*_like` forms, `bernoulli`). Tensors from Rust data are
/// [`Tensor::from_vec`] and [`Tensor::from_f64`]. Inside a trace these make fake tensors
/// recorded as graph nodes; random ops take an explicit [`crate::RngSeed`].
///
/// ```
/// # use aotgrad_trace::{DType, Tensor};
/// let z = Tensor::zeros(&[2, 3], DType::F32)?;
/// assert_eq!(z.sizes()?, vec![2, 3]);
/// let r = Tensor::arange(0.0, 4.0, 1.0, DType::F64)?;
/// assert_eq!(r.to_vec_f64()?, vec![0.0, 1.0, 2.0, 3.0]);
/// let x = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64)?;
/// assert_eq!(x.full_like(7.0)?.to_vec_f64()?, vec![7.0; 4]);
/// # Ok::<(), aotgrad_trace::Error>(())
/// ```
impl Tensor {
    /// A tensor filled with `value`.
    #[track_caller]
    pub fn full(shape: &[usize], value: impl Into<Scalar>, dtype: DType) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        dispatch(Op::Full { shape: dims_at("full", shape, &loc)?, value: value.into(), dtype }, &[], &loc)
    }
    /// [`Tensor::full`] with possibly symbolic sizes.
    #[track_caller]
    pub fn full_dims(shape: &[Dim], value: impl Into<Scalar>, dtype: DType) -> Result<Tensor> {
        dispatch(Op::Full { shape: shape.into(), value: value.into(), dtype }, &[], &SourceLoc::caller())
    }
    /// A tensor of zeros.
    #[track_caller]
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        dispatch(Op::Full { shape: dims_at("zeros", shape, &loc)?, value: Scalar::Int(0), dtype }, &[], &loc)
    }
    /// [`Tensor::zeros`] with possibly symbolic sizes.
    #[track_caller]
    pub fn zeros_dims(shape: &[Dim], dtype: DType) -> Result<Tensor> {
        dispatch(Op::Full { shape: shape.into(), value: Scalar::Int(0), dtype }, &[], &SourceLoc::caller())
    }
    /// A tensor of ones.
    #[track_caller]
    pub fn ones(shape: &[usize], dtype: DType) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        dispatch(Op::Full { shape: dims_at("ones", shape, &loc)?, value: Scalar::Int(1), dtype }, &[], &loc)
    }
    /// [`Tensor::ones`] with possibly symbolic sizes.
    #[track_caller]
    pub fn ones_dims(shape: &[Dim], dtype: DType) -> Result<Tensor> {
        dispatch(Op::Full { shape: shape.into(), value: Scalar::Int(1), dtype }, &[], &SourceLoc::caller())
    }
    /// `start, start + step, ...` below `end` (1-D).
    #[track_caller]
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
        dtype: DType,
    ) -> Result<Tensor> {
        let op = Op::Arange { start: start.into(), end: end.into(), step: step.into(), dtype };
        dispatch(op, &[], &SourceLoc::caller())
    }
    /// `0, 1, ..., end - 1` (1-D, i64), where `end` may be a shape symbol (PyTorch's
    /// `arange(x.size(0))` under dynamic shapes): a concrete `end` is an `arange`, a
    /// symbolic one the running sum of `end` ones, minus one.
    #[track_caller]
    pub fn arange_dim(end: &Dim) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        match end.as_const() {
            Some(n) => dispatch(
                Op::Arange { start: Scalar::Int(0), end: Scalar::Int(n), step: Scalar::Int(1), dtype: DType::I64 },
                &[],
                &loc,
            ),
            None => {
                let ones = dispatch(
                    Op::Full { shape: aotgrad_ir::dims![end.clone()], value: Scalar::Int(1), dtype: DType::I64 },
                    &[],
                    &loc,
                )?;
                let run = dispatch(Op::Cumsum(0), &[&ones], &loc)?;
                dispatch(Op::BinaryScalar(BinaryOp::Sub, Scalar::Int(1)), &[&run], &loc)
            }
        }
    }
    /// Uniform values in `[0, 1)`; the same seed gives the same values.
    #[track_caller]
    pub fn rand(shape: &[usize], dtype: DType, seed: impl Into<RngSeed>) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let shape = dims_at("rand", shape, &loc)?;
        random(|seed, offset| Op::Rand { shape: shape.clone(), dtype, seed, offset }, &[], seed.into(), &loc)
    }
    /// [`Tensor::rand`] with possibly symbolic sizes.
    #[track_caller]
    pub fn rand_dims(shape: &[Dim], dtype: DType, seed: impl Into<RngSeed>) -> Result<Tensor> {
        random(
            |seed, offset| Op::Rand { shape: shape.into(), dtype, seed, offset },
            &[],
            seed.into(),
            &SourceLoc::caller(),
        )
    }
    /// Standard normal values; the same seed gives the same values.
    #[track_caller]
    pub fn randn(shape: &[usize], dtype: DType, seed: impl Into<RngSeed>) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let shape = dims_at("randn", shape, &loc)?;
        random(|seed, offset| Op::Randn { shape: shape.clone(), dtype, seed, offset }, &[], seed.into(), &loc)
    }
    /// [`Tensor::randn`] with possibly symbolic sizes.
    #[track_caller]
    pub fn randn_dims(shape: &[Dim], dtype: DType, seed: impl Into<RngSeed>) -> Result<Tensor> {
        random(
            |seed, offset| Op::Randn { shape: shape.into(), dtype, seed, offset },
            &[],
            seed.into(),
            &SourceLoc::caller(),
        )
    }
    /// Zeros shaped like `self` (same dtype).
    #[track_caller]
    pub fn zeros_like(&self) -> Result<Tensor> {
        dispatch(Op::FullLike { value: Scalar::Int(0), dtype: None }, &[self], &SourceLoc::caller())
    }
    /// Ones shaped like `self` (same dtype).
    #[track_caller]
    pub fn ones_like(&self) -> Result<Tensor> {
        dispatch(Op::FullLike { value: Scalar::Int(1), dtype: None }, &[self], &SourceLoc::caller())
    }
    /// `value` shaped like `self` (same dtype).
    #[track_caller]
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        dispatch(Op::FullLike { value: value.into(), dtype: None }, &[self], &SourceLoc::caller())
    }
    /// Uniform values in `[0, 1)` shaped like `self` (same dtype).
    #[track_caller]
    pub fn rand_like(&self, seed: impl Into<RngSeed>) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        self.mode("rand_like", &loc)?;
        let m = self.meta();
        random(|seed, offset| Op::Rand { shape: m.shape.clone(), dtype: m.dtype, seed, offset }, &[], seed.into(), &loc)
    }
    /// Standard normal values shaped like `self` (same dtype).
    #[track_caller]
    pub fn randn_like(&self, seed: impl Into<RngSeed>) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        self.mode("randn_like", &loc)?;
        let m = self.meta();
        random(
            |seed, offset| Op::Randn { shape: m.shape.clone(), dtype: m.dtype, seed, offset },
            &[],
            seed.into(),
            &loc,
        )
    }
    /// 1 with probability `p`, else 0, shaped like `self` (same dtype).
    #[track_caller]
    pub fn bernoulli(&self, p: f64, seed: impl Into<RngSeed>) -> Result<Tensor> {
        random(|seed, offset| Op::Bernoulli { p, seed, offset }, &[self], seed.into(), &SourceLoc::caller())
    }
}

/// Dispatch a random op built by `make(seed, offset)` over `args`, drawing its stream
/// as [`RngSeed`] says: a fixed seed, the thread's generator (eager), or the trace's
/// RNG-state inputs (tracing; see [`crate::rng`]).
pub(crate) fn random(
    make: impl Fn(u64, u64) -> Op,
    args: &[&Tensor],
    seed: RngSeed,
    loc: &SourceLoc,
) -> Result<Tensor> {
    let d = crate::rng::draw(seed);
    dispatch(make(d.seed, d.offset), &d.args(args), loc)
}
