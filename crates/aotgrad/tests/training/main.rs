//! Training-path tests of `aot_function`: every core case of DESIGN.md's semantics
//! contract that makes sense with inputs requiring grad, run through the compiled
//! forward and backward and checked against eager mode and central finite
//! differences, with the forward and backward graphs as golden text; plus backward
//! misuse errors and partitioner equivalence. Re-bless the goldens with
//! `UPDATE_EXPECT=1 cargo test -p aotgrad --test training`.

mod aliasing;
mod checker;
mod dynamic;
mod errors;
mod inputs;
mod mutation;
mod nograd;
mod parity;
mod parity33;
mod partition;
mod random;
#[path = "../shared/worlds.rs"]
mod worlds;
