//! Partitioning a joint graph into a forward graph and a backward graph.
//!
//! Both partitioners produce a [`Partitioned`]:
//! - `forward`: inputs = the primals (as in the joint graph); outputs = the forward
//!   outputs, then the saved values (in [`Partitioned::saved`] order);
//! - `backward`: inputs = the saved values (same order), then the tangents; outputs =
//!   the gradients, in the joint graph's order.
//!
//! Value ids, storage ids, metadata and source locations are the joint graph's, so a
//! value keeps its name across the three graphs; a saved value that is a view keeps its
//! strides and offset, and saved values sharing a storage share it in the backward
//! graph too. Saved values are listed in joint-graph order (primals first). Both graphs
//! pass [`verify_graph`](crate::verify_graph). Dead forward values are not computed.
//!
//! - [`default_partition`]: the forward computes every forward value that an output or
//!   the backward needs and saves every forward value (primals included) a live
//!   backward node uses or that is itself a gradient; the backward recomputes nothing.
//! - [`min_cut_partition`]: rematerialization: saves a minimum-bytes cut and
//!   recomputes the rest in the backward (see `mincut` for the exact network and the
//!   memory-budget rule).

mod build;
mod flow;
mod joint;
mod mincut;

pub use joint::is_banned;

use crate::error::{PartitionError, Result};
use aotgrad_autodiff::JointGraph;
use aotgrad_ir::{Graph, TensorMeta, ValueId};
use joint::JointInfo;
use std::fmt;

/// A value the forward saves for the backward.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedValue {
    /// Its id in the joint graph (also its id in the forward and backward graphs).
    pub value: ValueId,
    /// Its input name in the backward graph: the primal's name, or `saved_N`.
    pub name: String,
    /// Metadata (a view keeps its strides and offset).
    pub meta: TensorMeta,
    /// Bytes: `numel × dtype size` (see [`crate::cost::bytes_of`]).
    pub bytes: u64,
    /// The primal's position, when the saved value is a primal.
    pub primal: Option<usize>,
}

/// What a partition saves and recomputes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PartitionReport {
    /// Saved values: description (`%N "name"` for primals, `%N (op)` for nodes),
    /// metadata, bytes.
    pub saved: Vec<(String, TensorMeta, u64)>,
    /// Total bytes saved.
    pub saved_bytes: u64,
    /// Bytes saved that are not primals (what saving costs beyond the inputs the caller
    /// holds anyway; views of primals count).
    pub activation_bytes: u64,
    /// Forward nodes the backward computes (`%N (op)`), in order.
    pub recomputed_ops: Vec<String>,
    /// Estimated FLOPs of the recomputed nodes (see [`crate::cost::flops_of`]).
    pub recompute_flops: u64,
}

impl fmt::Display for PartitionReport {
    /// ```text
    /// saved 2 values, 96 bytes (48 activation bytes):
    ///   %0 "x": f32[4, 3] (48 bytes)
    ///   %5 (add): f32[4, 3] (48 bytes)
    /// recomputed 1 op, 12 FLOPs: %6 (mul)
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: usize, one: &str, many: &str| if n == 1 { one.to_string() } else { many.to_string() };
        writeln!(
            f,
            "saved {} {}, {} bytes ({} activation bytes):",
            self.saved.len(),
            plural(self.saved.len(), "value", "values"),
            self.saved_bytes,
            self.activation_bytes
        )?;
        for (name, meta, bytes) in &self.saved {
            writeln!(f, "  {name}: {meta} ({bytes} bytes)")?;
        }
        let n = self.recomputed_ops.len();
        write!(f, "recomputed {n} {}, {} FLOPs", plural(n, "op", "ops"), self.recompute_flops)?;
        if n > 0 {
            write!(f, ": {}", self.recomputed_ops.join(", "))?;
        }
        Ok(())
    }
}

/// A joint graph split into a forward and a backward graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Partitioned {
    /// Primals → forward outputs, then saved values.
    pub forward: Graph,
    /// Saved values, then tangents → gradients.
    pub backward: Graph,
    /// The saved values, in the order the forward returns them.
    pub saved: Vec<SavedValue>,
    /// What was saved and recomputed.
    pub report: PartitionReport,
}

/// Configuration of [`min_cut_partition`].
#[derive(Clone, Debug, PartialEq)]
pub struct MinCutConfig {
    /// In `[0, 1]`: 1 = the min-cut optimum; 0 = save only the primals and the banned
    /// ops' outputs the backward needs (recompute everything recomputable); in between,
    /// greedily trade activation memory for recomputation (see `mincut`).
    pub activation_memory_budget: f64,
}

impl Default for MinCutConfig {
    /// Budget 1: the min-cut optimum.
    fn default() -> Self {
        MinCutConfig { activation_memory_budget: 1.0 }
    }
}

/// Partition saving every forward value the backward uses (see the module docs).
pub fn default_partition(j: &JointGraph) -> Result<Partitioned> {
    let _span = tracing::debug_span!("default_partition", nodes = j.graph.nodes.len()).entered();
    let info = JointInfo::new(j)?;
    build::build(&info, &info.bw_uses)
}

/// Partition with min-cut rematerialization under a memory budget (see the module docs
/// and `mincut`).
pub fn min_cut_partition(j: &JointGraph, config: &MinCutConfig) -> Result<Partitioned> {
    let _span = tracing::debug_span!("min_cut_partition", nodes = j.graph.nodes.len()).entered();
    let b = config.activation_memory_budget;
    if !(0.0..=1.0).contains(&b) {
        return Err(PartitionError::Config(format!("activation_memory_budget must be in [0, 1], got {b}")));
    }
    let info = JointInfo::new(j)?;
    let saved = if b == 0.0 {
        mincut::recompute_all(&info)
    } else {
        let s1 = mincut::min_cut(&info)?;
        if b >= 1.0 {
            s1
        } else {
            let act = mincut::activation_bytes(&info, &s1.iter().copied().collect());
            mincut::shrink_to_budget(&info, &s1, b * act as f64)
        }
    };
    let p = build::build(&info, &saved)?;
    tracing::debug!(saved_bytes = p.report.saved_bytes, recompute_flops = p.report.recompute_flops, "partitioned");
    Ok(p)
}
