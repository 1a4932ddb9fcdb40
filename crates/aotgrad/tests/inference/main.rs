//! Inference-path tests of `aot_function`: each core case of DESIGN.md's semantics
//! contract checked against eager mode with golden functional graphs, a property
//! test over random programs of views and in-place ops, and recompilation / bad-input
//! behaviour. Re-bless the goldens with
//! `UPDATE_EXPECT=1 cargo test -p aotgrad --test inference`.

mod aliasing;
mod contract;
mod dynamic;
mod edge;
mod layouts;
mod mutation;
mod props;
mod recompile;
#[path = "../shared/worlds.rs"]
mod worlds;
