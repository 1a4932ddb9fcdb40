//! Comparing an eager run with a compiled run of the same function: outputs,
//! inputs after the call, and aliasing between outputs, inputs and each other. Shared
//! by the inference and training contract checkers (each passes its own per-tensor
//! state comparison).

use aotgrad::trace::Tensor;
use aotgrad::Arg;

/// Compares one tensor of each world; `Err` says how they differ.
pub type SameState = dyn Fn(&str, &Tensor, &Tensor) -> Result<(), String>;

/// The tensor arguments with their positions.
pub fn tensors(args: &[Arg]) -> Vec<(usize, &Tensor)> {
    args.iter().enumerate().filter_map(|(i, a)| a.tensor().map(|t| (i, t))).collect()
}

/// (a) outputs and (b) inputs compare equal with `same_state`; (c) every
/// (output, input) and (output, output) pair shares storage / is the same object in
/// the compiled world exactly when it does in the eager world.
pub fn compare_worlds(
    ctx: &str,
    same_state: &SameState,
    eager_in: &[Arg],
    eager_out: &[Tensor],
    comp_in: &[Arg],
    comp_out: &[Tensor],
) -> Result<(), String> {
    if eager_out.len() != comp_out.len() {
        return Err(format!("{ctx}{} outputs (compiled) != {} (eager)", comp_out.len(), eager_out.len()));
    }
    // (a) outputs
    for (j, (e, c)) in eager_out.iter().zip(comp_out).enumerate() {
        same_state(&format!("{ctx}output {j}"), e, c)?;
    }
    // (b) inputs
    let (ei, ci) = (tensors(eager_in), tensors(comp_in));
    for ((k, e), (_, c)) in ei.iter().zip(&ci) {
        same_state(&format!("{ctx}input {k} after the call"), e, c)?;
    }
    // (b') version counters: one per in-place op on the input's storage, as eager
    //      (and PyTorch's `_version`) counts them
    for ((k, e), (_, c)) in ei.iter().zip(&ci) {
        let (ve, vc) = (e.version(), c.version());
        if let (Ok(ve), Ok(vc)) = (ve, vc) {
            if ve != vc {
                return Err(format!("{ctx}input {k} after the call: version {vc} (compiled) != {ve} (eager)"));
            }
        }
    }
    // (c) aliasing
    let rel = |a: &Tensor, b: &Tensor| (a.shares_storage_with(b), a.same_object(b));
    for j in 0..eager_out.len() {
        for ((k, e), (_, c)) in ei.iter().zip(&ci) {
            let (re, rc) = (rel(&eager_out[j], e), rel(&comp_out[j], c));
            if re != rc {
                return Err(format!(
                    "{ctx}output {j} vs input {k}: (shares storage, same object) = {rc:?} (compiled) != {re:?} (eager)"
                ));
            }
        }
        for i in 0..j {
            let (re, rc) = (rel(&eager_out[j], &eager_out[i]), rel(&comp_out[j], &comp_out[i]));
            if re != rc {
                return Err(format!(
                    "{ctx}output {j} vs output {i}: (shares storage, same object) = {rc:?} (compiled) != {re:?} (eager)"
                ));
            }
        }
    }
    Ok(())
}
