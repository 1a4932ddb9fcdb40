//! Executing lowered kernels: block-wise evaluation of fused bodies (each instruction a
//! tight loop over up to [`BLK`](body::BLK) elements of a contiguous run, which the compiler
//! vectorizes), reductions with f64 accumulators, matmuls through the `gemm` crate with
//! the epilogue applied per row panel while it is hot, and extern ops through the
//! reference kernels.
//!
//! Buffers are raw pointers for the duration of one kernel. Safety rests on the
//! lowering's checks: every access stays inside its buffer (`Lowered::input_need`,
//! extents), a kernel never writes a buffer it reads (liveness in the buffer plan;
//! an epilogue only reads the matmul result element by element where it writes), and
//! parallel tasks write disjoint ranges of the output.
//!
//! Layout, each file above the ones it uses: [`tasks`] (buffers as a kernel sees them,
//! splitting work into tasks and how large a task is), [`simd`] (row reductions in
//! AVX-512 intrinsics), [`body`] (the block interpreter of a fused body: register
//! files, loads and stores of every dtype, instructions, tiles of the iteration
//! space), [`pointwise`] (pointwise kernels and dispatch groups), [`reduce`]
//! (reductions and row groups), [`matmul`] (products through `gemm`, their blocks and
//! epilogues).

/// Calls `$f` with `$raw`'s pointer cast to its dtype's element type.
macro_rules! by_dtype {
    ($raw:expr, $f:ident, $($args:expr),*) => {
        match $raw.dtype {
            ::aotgrad_ir::DType::F32 => $f($raw.ptr as *mut f32, $($args),*),
            ::aotgrad_ir::DType::F64 => $f($raw.ptr as *mut f64, $($args),*),
            ::aotgrad_ir::DType::F16 => $f($raw.ptr as *mut ::half::f16, $($args),*),
            ::aotgrad_ir::DType::BF16 => $f($raw.ptr as *mut ::half::bf16, $($args),*),
            ::aotgrad_ir::DType::Bool => $f($raw.ptr as *mut bool, $($args),*),
            ::aotgrad_ir::DType::I64 => $f($raw.ptr as *mut i64, $($args),*),
            ::aotgrad_ir::DType::I32 => $f($raw.ptr as *mut i32, $($args),*),
        }
    };
}

mod body;
mod matmul;
mod pointwise;
mod reduce;
#[cfg(target_arch = "x86_64")]
mod simd;
mod tasks;

pub(crate) use matmul::{matmul, SPLIT_MIN_WORK};
pub(crate) use pointwise::{group, pointwise};
pub(crate) use reduce::{reduce, rows};
pub(crate) use tasks::{task_elements, Raw, POINTWISE_TASK};
