//! `aotgrad-import`: bring PyTorch models to aotgrad. Reads the programs
//! `torch.export.save` writes (`.pt2` archives, PyTorch's published export schema,
//! major version 8) and maps their ATen ops onto aotgrad's tensor ops, so an exported
//! model runs eagerly, compiles for inference and training through the whole
//! pipeline, caches, and checkpoints like a module written in Rust.
//!
//! - [`ExportedProgram`] is the archive parsed and checked: graph, signature
//!   (parameters, buffers, constants, user inputs; user outputs, loss, buffer and
//!   input mutations), symbolic size ranges, and the weights read from their raw
//!   bytes (dtype, shape, strides and offset checked against the bytes present,
//!   byte order honoured). A damaged or truncated archive, a schema version other
//!   than 8.x and a signature it cannot honour are [`ImportError`]s.
//! - [`ImportedModule`] is the program as an `aotgrad::nn::Module`: parameters and
//!   buffers by their PyTorch names (`layers.0.weight`), `forward` interpreting the
//!   graph. An op aotgrad does not run is an error naming the op, the node and the
//!   user's source line when the module is built, never a silent skip.
//!
//! Both forms a user gets are read: what `torch.export.export` writes (the training
//! IR: `aten.linear`, `aten.conv2d`, `aten.batch_norm`, `aten.layer_norm`,
//! `aten.scaled_dot_product_attention`, in-place ops such as `aten.relu_`,
//! `aten.add_`, `aten.hardswish_`, views such as `aten.view`, `aten.unflatten`,
//! `aten.select`) and what `ep.run_decompositions()` writes (core ATen: `addmm`,
//! `convolution`, `_native_batch_norm_legit_no_training`,
//! `_native_batch_norm_legit_functional`, `native_layer_norm`, `_softmax`, ...).
//! In-place and view ops keep their PyTorch semantics: they are aotgrad's in-place
//! and view ops, which functionalization and autograd handle as for any program.
//!
//! **Covered ops** (overloads in parentheses): `linear`, `addmm`, `mm`, `bmm`,
//! `matmul`; `conv1d`, `conv2d` (`default`, `padding`), `convolution` (1-d and
//! 2-d, transposed 2-d); `max_pool2d`, `max_pool2d_with_indices` (values only),
//! `avg_pool2d`, `adaptive_avg_pool2d`, `_adaptive_avg_pool2d`; `batch_norm`,
//! `_native_batch_norm_legit_no_training`, `_native_batch_norm_legit_functional`,
//! `_native_batch_norm_legit`, `layer_norm`, `native_layer_norm`, `group_norm`,
//! `native_group_norm` (output only); `scaled_dot_product_attention`, `embedding`,
//! `softmax`, `_softmax`, `log_softmax`, `_log_softmax`; `relu(_)`, `gelu(_)`,
//! `silu(_)`, `sigmoid(_)`, `tanh(_)`, `hardsigmoid(_)`, `hardswish(_)`,
//! `hardtanh(_)`, `leaky_relu(_)`, `dropout(_)`, `native_dropout` (output only);
//! `neg`, `abs`, `exp`, `log`, `log1p`, `expm1`, `sqrt`, `rsqrt`, `sin`, `cos`, `erf`,
//! `reciprocal`, `sign`, `floor`, `ceil`, `round`, `trunc`, `logical_not`,
//! `logical_and`, `logical_or`, `clamp(_)`, `clamp_min`, `clamp_max`; `add`, `sub`,
//! `mul`, `div` (`Tensor`, `Scalar`, in place, rounding modes), `rsub`, `pow`,
//! `maximum`, `minimum`, `eq`/`ne`/`lt`/`le`/`gt`/`ge`, `where.self`,
//! `masked_fill(_)`, `copy_`, `zero_`, `fill_`; `sum`, `mean`, `amax`, `amin`,
//! `var`, `std`, `any`, `all`, `argmax`, `max.dim`, `cumsum`; `view`,
//! `_unsafe_view`, `reshape`, `permute`, `transpose`, `t`, `expand`, `flatten`,
//! `unflatten`, `squeeze` (`default`, `dim`, `dims`), `unsqueeze`, `select`,
//! `slice`, `narrow`, `contiguous`, `clone`, `lift_fresh_copy`, `alias`, `detach`,
//! `_to_copy`, `to.dtype`, `cat`, `stack`, `split`, `split_with_sizes`, `chunk`,
//! `unbind`, `tril`, `triu`, `index_select`, `gather`, `index.Tensor` (one index
//! tensor); `arange`, `full`, `full_like`, `zeros`, `ones`, `zeros_like`,
//! `ones_like`, `empty_like` (zero-filled), `scalar_tensor`; `sym_size`, the
//! assertion ops, and integer arithmetic on symbolic sizes.
//!
//! Not covered (an import error names them): among others `nll_loss*`,
//! `max_pool2d_with_indices`'s indices and the `*_backward` ops (joint exports),
//! `upsample_*`, `pad`/`constant_pad_nd`, `scatter`, `index_put`, `sort`/`topk`,
//! `rand*` creation, complex and 8/16-bit integer dtypes, higher-order ops
//! (`cond`, `while_loop`), custom ops and effect tokens.

mod archive;
mod error;
mod module;
mod ops;
pub mod schema;

pub use archive::{scalar_type, ExportedProgram, Weight, ARCHIVE_FORMAT, ARCHIVE_VERSIONS, SCHEMA_MAJOR};
pub use error::{ImportError, Result};
pub use module::ImportedModule;

/// Whether aotgrad runs the ATen op overload `target` (`aten.addmm.default`, with or
/// without `torch.ops.`), and whether it computes every output: `Some(true)` for all,
/// `Some(false)` when an output is left out (such as `max_pool2d_with_indices`'s
/// indices: a program reading it is refused), `None` for an op it does not run.
pub fn runs_op(target: &str) -> Option<bool> {
    let target = target.strip_prefix("torch.ops.").unwrap_or(target);
    ops::lookup(target).map(|d| d.unavailable.is_empty())
}
