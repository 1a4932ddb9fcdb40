//! The closed set of core ops, grouped into families.
//!
//! A node applies one [`Op`] to its argument values and produces one value. Ops whose
//! parameters mention sizes use [`Dim`], so symbolic shapes flow through unchanged.
//! In-place ops wrap the out-of-place op they apply (`InPlace(Binary(Mul))` is `mul_`),
//! which is exactly what functionalization later unwraps.

use crate::dtype::{DType, Scalar};
use crate::meta::Dims;
use crate::sym::{Dim, SymId};
use serde::{Deserialize, Serialize};

/// Pointwise functions of one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `|x|`
    Abs,
    /// `e^x`
    Exp,
    /// natural log
    Log,
    /// square root
    Sqrt,
    /// `1/sqrt(x)`
    Rsqrt,
    /// sine
    Sin,
    /// cosine
    Cos,
    /// hyperbolic tangent
    Tanh,
    /// `1/(1+e^-x)`
    Sigmoid,
    /// `max(x, 0)`
    Relu,
    /// error function
    Erf,
    /// `1/x`
    Reciprocal,
    /// sign: -1, 0 or 1
    Sign,
    /// logical not (result is bool)
    LogicalNot,
    /// largest integer `<= x` (integers unchanged)
    Floor,
    /// smallest integer `>= x` (integers unchanged)
    Ceil,
    /// nearest integer, halves to even as PyTorch's `round` (integers unchanged)
    Round,
    /// integer part, toward zero (integers unchanged)
    Trunc,
    /// `ln(1 + x)`, accurate for small `x`
    Log1p,
    /// `e^x - 1`, accurate for small `x`
    Expm1,
}

/// Pointwise functions of two tensors (broadcasting, type promotion).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// true division `a / b` (integers give the default float)
    Div,
    /// `a ^ b`
    Pow,
    /// elementwise max
    Maximum,
    /// elementwise min
    Minimum,
}

/// Comparisons (result is bool).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// Reductions over a set of dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    /// sum (integers and bool accumulate to i64)
    Sum,
    /// mean (floating inputs only)
    Mean,
    /// maximum value
    Amax,
    /// minimum value
    Amin,
}

/// Composite ops: kept whole in a graph only when the decomposition table says so;
/// by default tracing records their decomposition into core ops.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CompositeOp {
    /// `x @ w^T + b`; args `[x, w]` or `[x, w, b]`.
    Linear,
    /// `matmul` with broadcasting batch dims; args `[a, b]`.
    Matmul,
    /// GELU; `tanh` selects the tanh approximation.
    Gelu {
        /// Use the tanh approximation.
        tanh: bool,
    },
    /// `x * sigmoid(x)`.
    Silu,
    /// softmax over `dim`.
    Softmax {
        /// Reduced dim.
        dim: usize,
    },
    /// log-softmax over `dim`.
    LogSoftmax {
        /// Reduced dim.
        dim: usize,
    },
    /// Layer norm over the trailing `normalized_rank` dims; args `[x]`, `[x, w]` or `[x, w, b]`.
    LayerNorm {
        /// Number of trailing dims normalized.
        normalized_rank: usize,
        /// Added to the variance.
        eps: f64,
    },
    /// Dropout with probability `p` (training mode); randomness from `seed`/`offset`.
    Dropout {
        /// Probability of zeroing an element.
        p: f64,
        /// RNG seed.
        seed: u64,
        /// RNG offset.
        offset: u64,
    },
    /// `weight[indices]`; args `[weight, indices]`.
    Embedding,
    /// Mean squared error, mean-reduced; args `[input, target]`.
    MseLoss,
    /// Cross entropy over class dim 1 with integer targets, mean-reduced; args `[logits, target]`.
    CrossEntropy,
    /// `value` where the bool `mask` (broadcast against the input) is true, the input
    /// elsewhere; args `[x, mask]`.
    MaskedFill {
        /// The fill value.
        value: Scalar,
    },
    /// The lower triangle of the last two dims (`col - row <= diagonal` kept, the rest
    /// zero); args `[x]`.
    Tril {
        /// The diagonal's offset.
        diagonal: i64,
    },
    /// The upper triangle of the last two dims (`col - row >= diagonal` kept); args `[x]`.
    Triu {
        /// The diagonal's offset.
        diagonal: i64,
    },
    /// Variance over `dims` (wrapped, non-empty) with Bessel's `correction`; args `[x]`.
    Var {
        /// Reduced dims.
        dims: Vec<usize>,
        /// Subtracted from the count of reduced elements.
        correction: i64,
        /// Keep the reduced dims as size 1.
        keepdim: bool,
    },
    /// One-hot encoding in a new last dim of `num_classes` (i64); args `[indices]` (i64).
    OneHot {
        /// The new dim's size.
        num_classes: usize,
    },
}

impl CompositeOp {
    /// The PyTorch-style name.
    pub fn name(&self) -> &'static str {
        match self {
            CompositeOp::Linear => "linear",
            CompositeOp::Matmul => "matmul",
            CompositeOp::Gelu { .. } => "gelu",
            CompositeOp::Silu => "silu",
            CompositeOp::Softmax { .. } => "softmax",
            CompositeOp::LogSoftmax { .. } => "log_softmax",
            CompositeOp::LayerNorm { .. } => "layer_norm",
            CompositeOp::Dropout { .. } => "dropout",
            CompositeOp::Embedding => "embedding",
            CompositeOp::MseLoss => "mse_loss",
            CompositeOp::CrossEntropy => "cross_entropy",
            CompositeOp::MaskedFill { .. } => "masked_fill",
            CompositeOp::Tril { .. } => "tril",
            CompositeOp::Triu { .. } => "triu",
            CompositeOp::Var { .. } => "var",
            CompositeOp::OneHot { .. } => "one_hot",
        }
    }
}

/// Every core op. Argument conventions are given per variant; `self` is `args[0]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    // ---- pointwise -------------------------------------------------------------
    /// `[x]`
    Unary(UnaryOp),
    /// `[a, b]`, broadcasting.
    Binary(BinaryOp),
    /// `[a]`: `a op scalar` (the scalar is a weakly typed "wrapped number").
    BinaryScalar(BinaryOp, Scalar),
    /// `[a, b]`, broadcasting; bool result.
    Compare(CmpOp),
    /// `[a]`: `a cmp scalar`; bool result.
    CompareScalar(CmpOp, Scalar),
    /// `[cond, a, b]`, broadcasting; `cond` must be bool.
    Where,
    /// `[x]`: clamp into `[min, max]` (either bound optional).
    Clamp {
        /// Lower bound.
        min: Option<Scalar>,
        /// Upper bound.
        max: Option<Scalar>,
    },
    /// `[x]`: convert to `dtype`.
    Cast(DType),

    // ---- reductions ------------------------------------------------------------
    /// `[x]`: reduce over `dims` (sorted, distinct; empty means all dims).
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Reduced dims.
        dims: Vec<usize>,
        /// Keep reduced dims as size 1.
        keepdim: bool,
    },
    /// `[x]`: index of the maximum along `dim` (i64 result; first index on ties).
    ArgMax {
        /// Reduced dim.
        dim: usize,
        /// Keep it as size 1.
        keepdim: bool,
    },
    /// `[x]`: index of the minimum along `dim`.
    ArgMin {
        /// Reduced dim.
        dim: usize,
        /// Keep it as size 1.
        keepdim: bool,
    },
    /// `[x]`: cumulative sum along the dim (same shape; integer and bool inputs give
    /// i64, as in PyTorch).
    Cumsum(usize),
    /// `[x]`: the i64 indices that sort `x` along `dim`, stably (equal values keep
    /// their order); NaN sorts above every number, as in PyTorch. `sort` is
    /// `gather(x, dim, argsort(x))`.
    Argsort {
        /// Sorted dim.
        dim: usize,
        /// Largest first.
        descending: bool,
    },

    // ---- linear algebra ---------------------------------------------------------
    /// `[a: (n, k), b: (k, m)]` -> `(n, m)`.
    Mm,
    /// `[a: (b, n, k), b: (b, k, m)]` -> `(b, n, m)`.
    Bmm,

    // ---- views (the result shares storage with args[0]) ------------------------
    /// `[x]`: same elements, new shape (must be expressible with strides).
    View(Dims),
    /// `[x]`: reorder dims.
    Permute(Vec<usize>),
    /// `[x]`: swap two dims.
    Transpose(usize, usize),
    /// `[x]`: transpose of a tensor with at most 2 dims.
    T,
    /// `[x]`: broadcast size-1 dims (stride 0) to `shape`; new leading dims allowed.
    Expand(Dims),
    /// `[x]`: drop the listed size-1 dims (sorted, distinct).
    Squeeze(Vec<usize>),
    /// `[x]`: insert a size-1 dim at position `dim` of the result.
    Unsqueeze(usize),
    /// `[x]`: `x[start:end:step]` along `dim` (bounds already clamped, `step >= 1`).
    Slice {
        /// Sliced dim.
        dim: usize,
        /// First index.
        start: Dim,
        /// One past the last index.
        end: Dim,
        /// Step (>= 1).
        step: i64,
    },
    /// `[x]`: `x[..., index, ...]` at `dim` (index non-negative), dropping the dim.
    Select {
        /// Indexed dim.
        dim: usize,
        /// Index.
        index: Dim,
    },
    /// `[x]`: arbitrary view of the storage of `x`.
    AsStrided {
        /// Result shape.
        size: Vec<Dim>,
        /// Result strides.
        stride: Vec<Dim>,
        /// Result storage offset.
        offset: Dim,
    },
    /// `[x]`: the same metadata, a new tensor sharing storage.
    Alias,

    // ---- copies --------------------------------------------------------------
    /// `[x]`: contiguous copy.
    Clone,
    /// `[x]`: a fresh tensor holding `x`'s elements with a new shape (PyTorch's
    /// `_unsafe_view`). Shape rules are those of `view` of a contiguous `x`; the result
    /// is contiguous with its own storage, so it is not a view of `x`. Decompositions
    /// use it to reshape an intermediate they just produced (the result of `mm`, a
    /// copy), so the result does not alias that intermediate. Its gradient is the
    /// incoming gradient reshaped back to `x`'s shape.
    UnsafeView(Dims),
    /// `[dst, src]`: out-of-place copy: `src` broadcast to `dst`'s shape and cast to its dtype.
    Copy,

    // ---- mutation -------------------------------------------------------------
    /// In-place form of a pointwise op: computes `inner(args)` and writes it into
    /// `args[0]`'s storage through its strides. The value produced is `args[0]`, updated.
    InPlace(Box<Op>),
    /// In-place metadata change: `args[0]` gets the metadata of the view `inner(args[0])`
    /// (`t_`, `transpose_`, `unsqueeze_`, `squeeze_`, `as_strided_`).
    MetaInPlace(Box<Op>),

    // ---- creation ---------------------------------------------------------------
    /// `[]`: a tensor filled with `value`.
    Full {
        /// Shape.
        shape: Dims,
        /// Fill value.
        value: Scalar,
        /// Element type.
        dtype: DType,
    },
    /// `[x]`: a contiguous tensor of `x`'s shape filled with `value` (`zeros_like`, `fill_`).
    FullLike {
        /// Fill value.
        value: Scalar,
        /// Element type (`None`: `x`'s).
        dtype: Option<DType>,
    },
    /// `[]`: `start, start+step, ...` below `end`.
    Arange {
        /// First value.
        start: Scalar,
        /// Exclusive end.
        end: Scalar,
        /// Step (non-zero).
        step: Scalar,
        /// Element type.
        dtype: DType,
    },

    // ---- random (counter-based: the same seed/offset give the same values) ------
    // Each random op takes its regular arguments, optionally followed by the *RNG
    // state*: two 0-d i64 tensors `seed` and `base`. Without them the values come from
    // counter stream `(seed, offset)` of the op's parameters; with them from stream
    // `(seed tensor, base tensor + offset)`, so the generator state is a graph input
    // (functional RNG: a compiled graph draws fresh values each call, and forward and
    // backward agree because they see the same inputs).
    /// `[]` or `[seed, base]`: uniform in `[0, 1)`.
    Rand {
        /// Shape.
        shape: Dims,
        /// Floating dtype.
        dtype: DType,
        /// Seed.
        seed: u64,
        /// Counter offset.
        offset: u64,
    },
    /// `[]` or `[seed, base]`: standard normal.
    Randn {
        /// Shape.
        shape: Dims,
        /// Floating dtype.
        dtype: DType,
        /// Seed.
        seed: u64,
        /// Counter offset.
        offset: u64,
    },
    /// `[x]` or `[x, seed, base]`: 1 with probability `p`, else 0, with `x`'s shape and dtype.
    Bernoulli {
        /// Probability of 1.
        p: f64,
        /// Seed.
        seed: u64,
        /// Counter offset.
        offset: u64,
    },

    // ---- indexing ---------------------------------------------------------------
    /// `[x, index]`: pick entries along `dim` by a 1-D integer index.
    IndexSelect(usize),
    /// `[x, index]`: `out[i][j] = x[index[i][j]][j]` style gather along `dim`.
    Gather(usize),
    /// `[x, index, src]`: out-of-place scatter-add of `src` into `x` along `dim`.
    ScatterAdd(usize),
    /// `[x0, x1, ...]`: concatenate along `dim`.
    Cat(usize),
    /// `[base, src]`: `base` with `base[start:end:step]` along `dim` replaced by `src`.
    SliceScatter {
        /// Dim.
        dim: usize,
        /// First index.
        start: Dim,
        /// One past the last index.
        end: Dim,
        /// Step (>= 1).
        step: i64,
    },
    /// `[base, src]`: `base` with `base.select(dim, index)` replaced by `src`.
    SelectScatter {
        /// Dim.
        dim: usize,
        /// Index.
        index: Dim,
    },
    /// `[base, src]`: `base` (contiguous copy) with `as_strided(size, stride, offset)` replaced by `src`.
    AsStridedScatter {
        /// View shape.
        size: Vec<Dim>,
        /// View strides.
        stride: Vec<Dim>,
        /// View offset.
        offset: Dim,
    },

    // ---- convolution and pooling over (N, C, H, W) images ------------------------
    /// `[x: (N, C, H, W), w: (OC, C / groups, KH, KW)]` -> `(N, OC, OH, OW)`, with
    /// `OH = (H + 2 padding - dilation (KH - 1) - 1) / stride + 1` (likewise `OW`): 2-D
    /// cross-correlation (PyTorch's `conv2d` without its bias), zeros padded in.
    Conv2d(Conv2dParams),
    /// `[gy: (N, OC, OH, OW), w: (OC, C / groups, KH, KW)]` -> `(N, C, H, W)` with
    /// `(H, W) = input`: the gradient of [`Op::Conv2d`] with respect to its input
    /// (also PyTorch's `conv_transpose2d`, whose output size `input` names).
    Conv2dInputGrad {
        /// The convolution's geometry.
        conv: Conv2dParams,
        /// Spatial size of the convolution's input.
        input: [usize; 2],
    },
    /// `[gy: (N, OC, OH, OW), x: (N, C, H, W)]` -> `(OC, C / groups, KH, KW)` with
    /// `(KH, KW) = kernel`: the gradient of [`Op::Conv2d`] with respect to its weight.
    Conv2dWeightGrad {
        /// The convolution's geometry.
        conv: Conv2dParams,
        /// Spatial size of the weight.
        kernel: [usize; 2],
    },
    /// `[x: (N, C, H, W)]` -> `(N, C, OH, OW)`: the maximum of each window (padding
    /// counts as -inf; a window holding a NaN gives NaN), PyTorch's `max_pool2d` with
    /// `ceil_mode=False`.
    MaxPool2d(Pool2dParams),
    /// `[gy: (N, C, OH, OW), x: (N, C, H, W)]` -> `x`'s shape: each window's gradient
    /// added at the window's first maximum, or its last NaN when it holds one (the
    /// element PyTorch's max-pooling indices name).
    MaxPool2dGrad(Pool2dParams),

    /// A composite op kept whole (see [`CompositeOp`]).
    Composite(CompositeOp),
}

/// The geometry of a 2-D convolution (rows, columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Conv2dParams {
    /// Step between windows.
    pub stride: [usize; 2],
    /// Zeros added on each side.
    pub padding: [usize; 2],
    /// Step between a window's taps.
    pub dilation: [usize; 2],
    /// Channel groups.
    pub groups: usize,
}

/// The geometry of a 2-D pooling window (rows, columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pool2dParams {
    /// Window size.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Padding on each side.
    pub padding: [usize; 2],
    /// Step between a window's taps.
    pub dilation: [usize; 2],
}

/// Output size of a window of `kernel` taps `dilation` apart sliding `stride` over
/// `size` padded by `padding` on both sides (`None` when no window fits or a step is 0).
pub fn window_out(size: usize, kernel: usize, stride: usize, padding: usize, dilation: usize) -> Option<usize> {
    if stride == 0 || dilation == 0 || kernel == 0 {
        return None;
    }
    let span = dilation.checked_mul(kernel - 1)?.checked_add(1)?;
    let padded = size.checked_add(padding.checked_mul(2)?)?;
    (padded >= span).then(|| (padded - span) / stride + 1)
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 21] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Erf,
        UnaryOp::Reciprocal,
        UnaryOp::Sign,
        UnaryOp::LogicalNot,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Trunc,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
    ];
    /// PyTorch name.
    pub fn name(self) -> &'static str {
        use UnaryOp::*;
        match self {
            Neg => "neg",
            Abs => "abs",
            Exp => "exp",
            Log => "log",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Sin => "sin",
            Cos => "cos",
            Tanh => "tanh",
            Sigmoid => "sigmoid",
            Relu => "relu",
            Erf => "erf",
            Reciprocal => "reciprocal",
            Sign => "sign",
            LogicalNot => "logical_not",
            Floor => "floor",
            Ceil => "ceil",
            Round => "round",
            Trunc => "trunc",
            Log1p => "log1p",
            Expm1 => "expm1",
        }
    }
    /// Rounding ops: integer-valued results, zero derivative almost everywhere.
    pub fn is_rounding(self) -> bool {
        matches!(self, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc)
    }
    /// True when integer inputs are promoted to the default float.
    pub fn promotes_int_to_float(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Relu
                | UnaryOp::Sign
                | UnaryOp::LogicalNot
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::Trunc
        )
    }
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];
    /// PyTorch name.
    pub fn name(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
        }
    }
}

impl CmpOp {
    /// Every comparison.
    pub const ALL: [CmpOp; 6] = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge];
    /// PyTorch name.
    pub fn name(self) -> &'static str {
        use CmpOp::*;
        match self {
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
        }
    }
}

impl ReduceOp {
    /// PyTorch name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Amax => "amax",
            ReduceOp::Amin => "amin",
        }
    }
}

/// How an op's result relates to the storage of its first argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aliasing {
    /// Fresh storage.
    Fresh,
    /// A new view of `args[0]`'s storage.
    View,
    /// `args[0]` itself, with its data overwritten.
    MutatesData,
    /// `args[0]` itself, with its metadata changed.
    MutatesMeta,
}

impl Op {
    /// The PyTorch-style name (`mul`, `mul_`, `t_`, `slice`, ...).
    pub fn name(&self) -> String {
        match self {
            Op::InPlace(inner) | Op::MetaInPlace(inner) => format!("{}_", inner.name()),
            _ => self.base_name().to_string(),
        }
    }

    fn base_name(&self) -> &'static str {
        match self {
            Op::Unary(u) => u.name(),
            Op::Binary(b) | Op::BinaryScalar(b, _) => b.name(),
            Op::Compare(c) | Op::CompareScalar(c, _) => c.name(),
            Op::Where => "where",
            Op::Clamp { .. } => "clamp",
            Op::Cast(_) => "to",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgMax { .. } => "argmax",
            Op::ArgMin { .. } => "argmin",
            Op::Cumsum(_) => "cumsum",
            Op::Argsort { .. } => "argsort",
            Op::Mm => "mm",
            Op::Bmm => "bmm",
            Op::View(_) => "view",
            Op::Permute(_) => "permute",
            Op::Transpose(..) => "transpose",
            Op::T => "t",
            Op::Expand(_) => "expand",
            Op::Squeeze(_) => "squeeze",
            Op::Unsqueeze(_) => "unsqueeze",
            Op::Slice { .. } => "slice",
            Op::Select { .. } => "select",
            Op::AsStrided { .. } => "as_strided",
            Op::Alias => "alias",
            Op::Clone => "clone",
            Op::UnsafeView(_) => "_unsafe_view",
            Op::Copy => "copy",
            Op::InPlace(_) | Op::MetaInPlace(_) => "inplace",
            Op::Full { .. } => "full",
            Op::FullLike { .. } => "full_like",
            Op::Arange { .. } => "arange",
            Op::Rand { .. } => "rand",
            Op::Randn { .. } => "randn",
            Op::Bernoulli { .. } => "bernoulli",
            Op::IndexSelect(_) => "index_select",
            Op::Gather(_) => "gather",
            Op::ScatterAdd(_) => "scatter_add",
            Op::Cat(_) => "cat",
            Op::SliceScatter { .. } => "slice_scatter",
            Op::SelectScatter { .. } => "select_scatter",
            Op::AsStridedScatter { .. } => "as_strided_scatter",
            Op::Conv2d(_) => "conv2d",
            Op::Conv2dInputGrad { .. } => "conv2d_input_grad",
            Op::Conv2dWeightGrad { .. } => "conv2d_weight_grad",
            Op::MaxPool2d(_) => "max_pool2d",
            Op::MaxPool2dGrad(_) => "max_pool2d_grad",
            Op::Composite(c) => c.name(),
        }
    }

    /// How the result relates to `args[0]`'s storage.
    pub fn aliasing(&self) -> Aliasing {
        match self {
            Op::View(_)
            | Op::Permute(_)
            | Op::Transpose(..)
            | Op::T
            | Op::Expand(_)
            | Op::Squeeze(_)
            | Op::Unsqueeze(_)
            | Op::Slice { .. }
            | Op::Select { .. }
            | Op::AsStrided { .. }
            | Op::Alias => Aliasing::View,
            Op::InPlace(_) => Aliasing::MutatesData,
            Op::MetaInPlace(_) => Aliasing::MutatesMeta,
            _ => Aliasing::Fresh,
        }
    }
    /// True for view ops.
    pub fn is_view(&self) -> bool {
        self.aliasing() == Aliasing::View
    }
    /// True for ops that mutate `args[0]` (data or metadata).
    pub fn is_mutation(&self) -> bool {
        matches!(self.aliasing(), Aliasing::MutatesData | Aliasing::MutatesMeta)
    }
    /// True for elementwise ops (those an `InPlace` may wrap).
    pub fn is_pointwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::BinaryScalar(..)
                | Op::Compare(_)
                | Op::CompareScalar(..)
                | Op::Where
                | Op::Clamp { .. }
                | Op::Cast(_)
                | Op::Copy
                | Op::FullLike { .. }
                | Op::Bernoulli { .. }
        )
    }
    /// True for ops whose result depends on an RNG seed/offset.
    pub fn is_random(&self) -> bool {
        matches!(
            self,
            Op::Rand { .. } | Op::Randn { .. } | Op::Bernoulli { .. } | Op::Composite(CompositeOp::Dropout { .. })
        )
    }
    /// The same op with every [`Dim`] parameter passed through `f`.
    pub fn map_dims(&self, f: &dyn Fn(&Dim) -> Dim) -> Op {
        let v = |xs: &[Dim]| xs.iter().map(f).collect::<Dims>();
        let list = |xs: &[Dim]| xs.iter().map(f).collect::<Vec<_>>();
        match self {
            Op::View(s) => Op::View(v(s)),
            Op::UnsafeView(s) => Op::UnsafeView(v(s)),
            Op::Expand(s) => Op::Expand(v(s)),
            Op::Slice { dim, start, end, step } => Op::Slice { dim: *dim, start: f(start), end: f(end), step: *step },
            Op::Select { dim, index } => Op::Select { dim: *dim, index: f(index) },
            Op::AsStrided { size, stride, offset } => {
                Op::AsStrided { size: list(size), stride: list(stride), offset: f(offset) }
            }
            Op::Full { shape, value, dtype } => Op::Full { shape: v(shape), value: *value, dtype: *dtype },
            Op::Rand { shape, dtype, seed, offset } => {
                Op::Rand { shape: v(shape), dtype: *dtype, seed: *seed, offset: *offset }
            }
            Op::Randn { shape, dtype, seed, offset } => {
                Op::Randn { shape: v(shape), dtype: *dtype, seed: *seed, offset: *offset }
            }
            Op::SliceScatter { dim, start, end, step } => {
                Op::SliceScatter { dim: *dim, start: f(start), end: f(end), step: *step }
            }
            Op::SelectScatter { dim, index } => Op::SelectScatter { dim: *dim, index: f(index) },
            Op::AsStridedScatter { size, stride, offset } => {
                Op::AsStridedScatter { size: list(size), stride: list(stride), offset: f(offset) }
            }
            Op::InPlace(inner) => Op::InPlace(Box::new(inner.map_dims(f))),
            Op::MetaInPlace(inner) => Op::MetaInPlace(Box::new(inner.map_dims(f))),
            other => other.clone(),
        }
    }
    /// Substitute concrete values for bound symbols in every `Dim` parameter.
    pub fn subst(&self, env: &dyn Fn(SymId) -> Option<i64>) -> Op {
        self.map_dims(&|d| d.subst(env))
    }
}
