//! The fake mode's state: the trace a fake tensor belongs to ([`TraceCtx`]: the graph
//! being built, its shape environment and the trace's bookkeeping) and the trace
//! active on this thread. The state sits on the tensor's floor so that the tensor
//! handle and the dispatch can name it; starting a trace, creating its inputs and
//! collecting its outputs is `crate::trace`'s, above the dispatch.

use crate::decomp::table::DecompTable;
use crate::shape_env::ShapeEnv;
use aotgrad_ir::{Graph, Input, Node, Op, SourceLoc, StorageId, TensorMeta, ValueId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// One trace in progress: the graph being built and its shape environment.
pub(crate) struct TraceCtx {
    pub(crate) state: Mutex<TraceState>,
}

/// The mutable part of a trace.
pub(crate) struct TraceState {
    pub(crate) graph: Graph,
    pub(crate) shape_env: ShapeEnv,
    /// The trace's composite-op policies (from `TraceConfig::decomps`).
    pub(crate) decomps: DecompTable,
    pub(crate) next_value: u32,
    pub(crate) next_storage: u32,
    pub(crate) value_requires_grad: Vec<bool>,
    /// Element counts of fake storages where they are concrete (static inputs, fresh
    /// results of concrete shape): view ops are checked against them as eager's are.
    pub(crate) storage_len: HashMap<StorageId, usize>,
    /// In-place ops (data or metadata) on each fake storage so far: its version, as
    /// an eager storage counts them (for the checks on views made before).
    pub(crate) storage_version: HashMap<StorageId, u64>,
    /// The input handles' objects (their addresses, stable while the trace runs):
    /// `requires_grad_()` on one of them tracks that input; on any other tensor
    /// (a view of an input included) it makes a new leaf.
    pub(crate) input_handles: Vec<usize>,
    /// Values made by `detach` (an `alias` that is not a view for autograd).
    pub(crate) detach_values: Vec<ValueId>,
    /// Views made under no-grad of tensors requiring grad (and views of them): they
    /// require grad but have no history (a leaf to eager autograd).
    pub(crate) no_grad_views: Vec<ValueId>,
    /// In-place metadata ops run under no-grad (autograd's history keeps the old shape).
    pub(crate) hidden_meta: Vec<ValueId>,
    /// `(input value, node count)`: `requires_grad_()` made an input that did not
    /// require grad require it once that many nodes were traced.
    pub(crate) tracked_from: Vec<(ValueId, usize)>,
    /// `(value, storage)` of the `rng_seed` and `rng_base` inputs, once created.
    pub(crate) rng: Option<[(ValueId, StorageId); 2]>,
    pub(crate) rng_ops: u64,
}

impl TraceState {
    /// A storage id no value uses yet.
    pub(crate) fn fresh_storage(&mut self) -> StorageId {
        let s = StorageId(self.next_storage);
        self.next_storage += 1;
        s
    }
    pub(crate) fn fresh_value(&mut self, requires_grad: bool) -> ValueId {
        let v = ValueId(self.next_value);
        self.next_value += 1;
        self.value_requires_grad.push(requires_grad);
        v
    }
    pub(crate) fn add_input(
        &mut self,
        name: String,
        meta: TensorMeta,
        storage: StorageId,
        requires_grad: bool,
    ) -> ValueId {
        let id = self.fresh_value(requires_grad);
        self.graph.inputs.push(Input { id, name, meta, storage });
        id
    }
    /// Append a node (ids are allocated here in O(1); `storage` is the caller's choice:
    /// `args[0]`'s for views and mutations).
    pub(crate) fn add_node(
        &mut self,
        op: Op,
        args: Vec<ValueId>,
        meta: TensorMeta,
        storage: StorageId,
        loc: SourceLoc,
        requires_grad: bool,
    ) -> ValueId {
        let out = self.fresh_value(requires_grad);
        self.graph.nodes.push(Node { out, op, args, meta, storage, loc: Some(loc) });
        out
    }
}

impl TraceCtx {
    pub(crate) fn lock(&self) -> MutexGuard<'_, TraceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn set_value_requires_grad(&self, v: ValueId, requires_grad: bool) {
        if let Some(slot) = self.lock().value_requires_grad.get_mut(v.0 as usize) {
            *slot = requires_grad;
        }
    }

    /// `requires_grad_()` made the tensor with value `v` (storage `storage`) require
    /// grad: when it is an input (or the current value of one), note how many nodes
    /// came before, and that autograd sees the input from here.
    pub(crate) fn note_tracked_from(&self, v: ValueId, storage: StorageId) {
        let mut st = self.lock();
        let input = st
            .graph
            .inputs
            .iter()
            .find(|i| i.id == v)
            .or_else(|| st.graph.inputs.iter().find(|i| i.storage == storage));
        if let Some(id) = input.map(|i| i.id) {
            let n = st.graph.nodes.len();
            if !st.tracked_from.iter().any(|(x, _)| *x == id) {
                st.tracked_from.push((id, n));
            }
            if let Some(slot) = st.value_requires_grad.get_mut(id.0 as usize) {
                *slot = true;
            }
        }
    }
}

thread_local! {
    static ACTIVE: RefCell<Option<Arc<TraceCtx>>> = const { RefCell::new(None) };
}

/// The trace active on this thread, if any.
pub(crate) fn active_trace() -> Option<Arc<TraceCtx>> {
    ACTIVE.with(|a| a.borrow().clone())
}

/// Whether a trace is active on this thread (ops then record instead of computing).
pub fn is_tracing() -> bool {
    ACTIVE.with(|a| a.borrow().is_some())
}

/// Makes a trace active; restores the previous one when dropped.
pub(crate) struct ActiveGuard {
    prev: Option<Arc<TraceCtx>>,
}

impl ActiveGuard {
    pub(crate) fn enter(ctx: Arc<TraceCtx>) -> ActiveGuard {
        ActiveGuard { prev: ACTIVE.with(|a| a.borrow_mut().replace(ctx)) }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        ACTIVE.with(|a| *a.borrow_mut() = prev);
    }
}
