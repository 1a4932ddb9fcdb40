//! `aotgrad-import`: bring PyTorch models to aotgrad. Reads the programs
//! `torch.export.save` writes (`.pt2` archives, PyTorch's published export schema,
//! major version 8) and maps their ATen ops onto aotgrad's tensor ops, so an exported
//! model runs eagerly, compiles for inference and training through the whole
//! pipeline, caches, and checkpoints like a module written in Rust.
//!
//! - [`ExportedProgram`] is the archive parsed and checked: graph, signature
//!   (parameters, buffers, constants, user inputs; user outputs, loss, buffer and
//!   input mutations), symbolic size ranges, and the weights read from their raw
//!   bytes (dtype, shape, strides and offset checked against each other and the
//!   bytes present, byte order honoured). A damaged or truncated archive, a schema version other
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
//! **Covered ops.** [`runs_op`] answers for any overload. Of the 189 overloads
//! PyTorch 2.15 tags core ATen, 145 run and 3 run with an output left out
//! (`max_pool2d_with_indices`'s indices, `native_dropout`'s mask,
//! `native_group_norm`'s statistics); `docs/import-coverage.md` lists them all, kept
//! true by a test. Besides those, the training-IR ops `torch.export.export` writes
//! run: `linear`, `conv1d`/`conv2d` (`padding` strings too), `batch_norm`,
//! `layer_norm`, `group_norm`, `scaled_dot_product_attention` (masks, causal, scale;
//! fully masked rows give zeros), `softmax`/`log_softmax`, `dropout`, `flatten`,
//! `unflatten`, `reshape`, `contiguous`, `pad`, `matmul`, `silu`, `hardsigmoid`,
//! `hardswish`, `mish`, `softplus`, `logsumexp`, `chunk`, `unbind`, `stack`,
//! `split.Tensor`, `type_as`/`view_as`/`expand_as`, `new_*`, the in-place variants
//! (`relu_`, `add_`, `mul_`, `hardswish_`, `dropout_`, `clamp_`, `copy_`, `fill_`,
//! `zero_`, `masked_fill_`, ...), the Python operators on bools (`__and__`, ...) and
//! integer arithmetic on symbolic sizes. `index.Tensor` takes one index tensor
//! (negative indices count from the end); bitwise ops take bools.
//!
//! Not run (an import error names them): among others `prod`, `scatter`,
//! `index_put`, `upsample_bilinear2d`, inverse trigonometric functions, 3-d pooling,
//! random creation (`rand`, `randn`, `randperm`), data-dependent ops (`nonzero`,
//! `_local_scalar_dense`), the `*_backward` ops of joint exports, FFTs, complex and
//! 8/16-bit integer dtypes, higher-order ops (`cond`, `while_loop`), custom ops and
//! effect tokens.

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
