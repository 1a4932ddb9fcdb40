//! Build the forward and backward graphs once the saved set is chosen.

use super::joint::{reach, JointInfo};
use super::{PartitionReport, Partitioned, SavedValue};
use crate::cost::bytes_of;
use crate::error::{PartitionError, Result};
use crate::verify::verify_graph;
use aotgrad_ir::{Graph, Input};

/// Build the partition that saves (the needed part of) `saved` (slots, any order) and
/// recomputes in the backward every other forward value the backward needs.
pub(crate) fn build(info: &JointInfo<'_>, saved: &[usize]) -> Result<Partitioned> {
    let g = info.graph();
    let j = info.j;
    let n_in = info.n_inputs();
    let total = info.args.len();
    let mut is_saved = vec![false; total];
    for &s in saved {
        if !info.forward[s] {
            return Err(PartitionError::Internal(format!("cannot save the backward value {}", info.value(s))));
        }
        is_saved[s] = true;
    }
    let outs: Vec<usize> = g.outputs.iter().map(|o| info.slot[o]).collect();
    let (fw_outs, grads) = outs.split_at(j.num_fw_outputs);

    // Backward: everything the gradients need, stopping at saved values and inputs.
    let bw = reach(&info.args, grads.iter().copied(), |s| !is_saved[s] && s >= n_in);
    let mut saved_used: Vec<usize> = Vec::new();
    let mut bw_nodes: Vec<usize> = Vec::new();
    for s in 0..total {
        if !bw[s] {
            continue;
        }
        if is_saved[s] {
            saved_used.push(s);
        } else if info.is_primal(s) {
            return Err(PartitionError::Internal(format!(
                "the backward needs primal {} but it is not saved",
                info.describe(s)
            )));
        } else if s >= n_in {
            if info.forward[s] && info.is_banned(s) {
                return Err(PartitionError::Internal(format!(
                    "the backward would recompute {}, which must not be recomputed",
                    info.describe(s)
                )));
            }
            bw_nodes.push(s);
        }
    }

    // Forward: the forward outputs and the saved values.
    let fw = reach(&info.args, fw_outs.iter().chain(&saved_used).copied(), |_| true);
    let forward = Graph {
        inputs: g.inputs[..j.num_primals].to_vec(),
        nodes: (n_in..total).filter(|&s| fw[s]).map(|s| g.nodes[s - n_in].clone()).collect(),
        outputs: fw_outs.iter().chain(&saved_used).map(|&s| info.value(s)).collect(),
    };
    if forward.nodes.iter().any(|n| !info.forward[info.slot[&n.out]]) {
        return Err(PartitionError::Internal("the forward graph would use a tangent".into()));
    }

    let mut saved_values = Vec::with_capacity(saved_used.len());
    let mut inputs: Vec<Input> = Vec::with_capacity(saved_used.len() + j.num_tangents);
    for &s in &saved_used {
        let (name, storage) = if s < n_in {
            (g.inputs[s].name.clone(), g.inputs[s].storage)
        } else {
            (format!("saved_{}", info.value(s).0), g.nodes[s - n_in].storage)
        };
        let meta = info.meta(s).clone();
        saved_values.push(SavedValue {
            value: info.value(s),
            name: name.clone(),
            bytes: bytes_of(&meta),
            meta: meta.clone(),
            primal: info.is_primal(s).then_some(s),
        });
        inputs.push(Input { id: info.value(s), name, meta, storage });
    }
    inputs.extend_from_slice(&g.inputs[j.num_primals..]);
    let backward = Graph {
        inputs,
        nodes: bw_nodes.iter().map(|&s| g.nodes[s - n_in].clone()).collect(),
        outputs: grads.iter().map(|&s| info.value(s)).collect(),
    };
    verify_graph(&forward)?;
    verify_graph(&backward)?;

    let recomputed: Vec<usize> = bw_nodes.iter().copied().filter(|&s| info.forward[s]).collect();
    let report = PartitionReport {
        saved: saved_values.iter().map(|v| (describe_saved(info, v), v.meta.clone(), v.bytes)).collect(),
        saved_bytes: saved_values.iter().map(|v| v.bytes).sum(),
        activation_bytes: saved_values.iter().filter(|v| v.primal.is_none()).map(|v| v.bytes).sum(),
        recomputed_ops: recomputed.iter().map(|&s| info.describe(s)).collect(),
        recompute_flops: recomputed.iter().map(|&s| info.flops(s)).sum(),
    };
    Ok(Partitioned { forward, backward, saved: saved_values, report })
}

fn describe_saved(info: &JointInfo<'_>, v: &SavedValue) -> String {
    info.describe(info.slot[&v.value])
}
