//! A call of a lowered plan: its per-call memory (an arena of slots and reduction
//! scratch, pooled per plan), the inputs' storages locked and bound as raw buffers,
//! outputs allocated (recycled memory where they are overwritten whole), every kernel
//! run in plan order on the executor, and the results made into tensors over the
//! inputs', outputs' or extern kernels' storages.

use super::exec::{self, Raw};
use super::kernels::{self, CKernel, Loc, Lowered};
use super::lower::{finish, lower_with};
use crate::storage::{take_recycled, Buffer, CpuTensor, Storage};
use crate::CpuError;
use aotgrad_fusion::KernelPlan;
use aotgrad_ir::SymId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Allocation counters of a compiled graph (bytes of tensor memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Arena bytes allocated (slots and reduction scratch), over all calls.
    pub arena_bytes: usize,
    /// Output bytes allocated, over all calls.
    pub output_bytes: usize,
    /// Bytes allocated by extern ops' own kernels are not counted; this says how many
    /// extern kernels ran.
    pub extern_kernels: usize,
}

/// A lock held on an input or extern storage while a kernel runs.
enum StorageGuard<'a> {
    Read(std::sync::RwLockReadGuard<'a, Buffer>),
    Write(std::sync::RwLockWriteGuard<'a, Buffer>),
}

impl StorageGuard<'_> {
    /// A raw view of the locked elements.
    fn raw(&self) -> Raw {
        let b: &Buffer = match self {
            StorageGuard::Read(g) => g,
            StorageGuard::Write(g) => g,
        };
        macro_rules! r {
            ($v:expr, $d:ident) => {
                Raw { ptr: $v.as_ptr() as *mut u8, dtype: aotgrad_ir::DType::$d }
            };
        }
        match b {
            Buffer::Bool(v) => r!(v, Bool),
            Buffer::I32(v) => r!(v, I32),
            Buffer::I64(v) => r!(v, I64),
            Buffer::F16(v) => r!(v, F16),
            Buffer::BF16(v) => r!(v, BF16),
            Buffer::F32(v) => r!(v, F32),
            Buffer::F64(v) => r!(v, F64),
        }
    }
}

/// Reusable per-call memory of one lowered plan.
pub(super) struct Arena {
    slots: Vec<Buffer>,
    scratch: Vec<f64>,
}

/// A plan lowered for one binding, with its arena pool.
pub(super) struct Instance {
    pub(super) lowered: Lowered,
    pool: Mutex<Vec<Arena>>,
}

/// The symbol values of a call, sorted: the key of a lowered plan.
pub(super) type Binding = Vec<(SymId, i64)>;

impl Instance {
    /// `plan` lowered (with machine code for its pointwise kernels when `jit`).
    pub(super) fn lower(plan: &KernelPlan, jit: bool) -> Result<Instance, CpuError> {
        Ok(Instance::of(lower_with(plan, jit)?))
    }

    /// A lowered plan read from an artifact (checked), finished for this process.
    pub(super) fn loaded(low: Lowered, jit: bool) -> Instance {
        Instance::of(finish(low, jit))
    }

    fn of(lowered: Lowered) -> Instance {
        Instance { lowered, pool: Mutex::new(Vec::new()) }
    }

    /// Run the plan on `inputs` (bound by the caller) on up to `threads` threads,
    /// counting allocations into `stats` and kernel times into `profile`.
    pub(super) fn run(
        &self,
        inputs: &[CpuTensor],
        threads: usize,
        stats: &Mutex<AllocStats>,
        profile: Option<&Mutex<Vec<(f64, usize)>>>,
        ready: Option<&mut dyn FnMut(aotgrad_ir::ReadyOutput<'_>)>,
    ) -> Result<Vec<CpuTensor>, CpuError> {
        let inst = self;
        let low = &inst.lowered;
        for (i, (t, need)) in inputs.iter().zip(&low.input_need).enumerate() {
            let len = t.storage.len();
            if len < *need {
                return Err(CpuError::Input {
                    index: i,
                    msg: format!("its storage holds {len} elements, but the graph reads {need}"),
                });
            }
            if t.storage.dtype() != t.meta.dtype {
                return Err(CpuError::Input { index: i, msg: "storage dtype differs from its metadata".into() });
            }
        }
        let out_bytes: usize =
            low.out_bufs.iter().fold(0usize, |t, (d, n, _)| t.saturating_add(d.size_bytes().saturating_mul(*n)));
        let mut arena = inst.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        // What this call allocates, preflighted together (each part alone may fit when
        // all of them do not).
        let fresh_arena = if arena.is_none() { low.slots.arena_bytes as u128 + low.scratch as u128 * 8 } else { 0 };
        crate::storage::check_alloc_bytes("the compiled graph's outputs and buffers", out_bytes as u128 + fresh_arena)?;
        let mut allocated = (0usize, 0usize, 0usize);
        let mut arena = match arena.take() {
            Some(a) => a,
            None => {
                let slots: Vec<Buffer> = low.slots.slots.iter().map(|s| Buffer::zeros(s.dtype, s.elems)).collect();
                allocated.0 = low.slots.arena_bytes.saturating_add(low.scratch.saturating_mul(8));
                Arena { slots, scratch: vec![0.0; low.scratch] }
            }
        };
        // Dense outputs are overwritten completely: recycled memory will do.
        let mut outs: Vec<Buffer> = low
            .out_bufs
            .iter()
            .map(|(d, n, dense)| if *dense { take_recycled(*d, *n) } else { Buffer::zeros(*d, *n) })
            .collect();
        allocated.1 = out_bytes;
        let mut externs: HashMap<usize, Arc<Storage>> = HashMap::new();
        let result =
            run_kernels(low, inputs, &mut arena, &mut outs, &mut externs, &mut allocated.2, threads, profile, ready);
        inst.pool.lock().unwrap_or_else(|e| e.into_inner()).push(arena);
        {
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            s.arena_bytes += allocated.0;
            s.output_bytes += allocated.1;
            s.extern_kernels += allocated.2;
        }
        result?;
        let mut out_storages: Vec<Option<Arc<Storage>>> = vec![None; outs.len()];
        let mut outs: Vec<Option<Buffer>> = outs.into_iter().map(Some).collect();
        low.outputs
            .iter()
            .map(|(b, meta)| {
                let storage = match low.loc[*b] {
                    Loc::Input(i) | Loc::Updated(i) => inputs[i].storage.clone(),
                    Loc::Output(o) => out_storages[o]
                        .get_or_insert_with(|| Storage::new(outs[o].take().unwrap_or(Buffer::F32(Vec::new()))))
                        .clone(),
                    Loc::Extern => externs
                        .get(b)
                        .cloned()
                        .ok_or_else(|| CpuError::Internal(format!("output buffer b{b} was never computed")))?,
                    Loc::Slot(_) => return Err(CpuError::Internal(format!("output buffer b{b} lives in the arena"))),
                };
                Ok(CpuTensor { storage, meta: meta.clone() })
            })
            .collect()
    }
}

/// Per kernel, the graph outputs it writes last: outputs in the plan's own output
/// buffers, of f32 or f64, that some kernel writes (no later kernel writes them).
fn ready_outputs(low: &Lowered) -> Vec<Vec<usize>> {
    let mut last: HashMap<usize, usize> = HashMap::new();
    for (k, kernel) in low.kernels.iter().enumerate() {
        for b in kernel.stored() {
            last.insert(b, k);
        }
    }
    let mut by_kernel = vec![Vec::new(); low.kernels.len()];
    for (j, (b, meta)) in low.outputs.iter().enumerate() {
        let own = matches!(low.loc.get(*b), Some(Loc::Output(_)));
        let float = matches!(meta.dtype, aotgrad_ir::DType::F32 | aotgrad_ir::DType::F64);
        if let (true, true, Some(&k)) = (own, float, last.get(b)) {
            by_kernel[k].push(j);
        }
    }
    by_kernel
}

#[allow(clippy::too_many_arguments)]
fn run_kernels(
    low: &Lowered,
    inputs: &[CpuTensor],
    arena: &mut Arena,
    outs: &mut [Buffer],
    externs: &mut HashMap<usize, Arc<Storage>>,
    n_extern: &mut usize,
    threads: usize,
    profile: Option<&Mutex<Vec<(f64, usize)>>>,
    mut ready: Option<&mut dyn FnMut(aotgrad_ir::ReadyOutput<'_>)>,
) -> Result<(), CpuError> {
    // Graph outputs handed out early, by the kernel that writes them last.
    let ready_after = match ready {
        Some(_) => ready_outputs(low),
        None => Vec::new(),
    };
    // Off the pool (no kernel splits), every kernel runs single-threaded here.
    let threads = if low.parallel { threads } else { 1 };
    let mut bufs: Vec<Raw> = vec![Raw::NONE; low.loc.len()];
    let raw_of = |b: &mut Buffer| -> Raw {
        macro_rules! r {
            ($v:expr, $d:expr) => {
                Raw { ptr: $v.as_mut_ptr() as *mut u8, dtype: $d }
            };
        }
        match b {
            Buffer::Bool(v) => r!(v, aotgrad_ir::DType::Bool),
            Buffer::I32(v) => r!(v, aotgrad_ir::DType::I32),
            Buffer::I64(v) => r!(v, aotgrad_ir::DType::I64),
            Buffer::F16(v) => r!(v, aotgrad_ir::DType::F16),
            Buffer::BF16(v) => r!(v, aotgrad_ir::DType::BF16),
            Buffer::F32(v) => r!(v, aotgrad_ir::DType::F32),
            Buffer::F64(v) => r!(v, aotgrad_ir::DType::F64),
        }
    };
    let mut times: Vec<f64> = Vec::new();
    // Raw views of the arena and output buffers, made once: kernels write through
    // them in place, so they stay valid until an extern kernel moves a buffer (it
    // borrows them as storages and gives them back; only then are they made again).
    // Per kernel only the input and extern buffers it loads are set and cleared,
    // which keeps a long graph's run linear in its kernels.
    let mut raws_stale = true;
    // The next dispatch group, and the kernel the current group ends before.
    let mut groups = low.groups.iter().peekable();
    let mut skip_to = 0;
    for (i, k) in low.kernels.iter().enumerate() {
        if i < skip_to {
            continue;
        }
        let end = match groups.peek() {
            Some(&&(start, end)) if start == i => {
                groups.next();
                end
            }
            _ => i + 1,
        };
        skip_to = end;
        let members = &low.kernels[i..end];
        if raws_stale {
            for (b, loc) in low.loc.iter().enumerate() {
                bufs[b] = match loc {
                    Loc::Slot(s) => raw_of(&mut arena.slots[*s]),
                    Loc::Output(o) => raw_of(&mut outs[*o]),
                    Loc::Input(_) | Loc::Updated(_) | Loc::Extern => Raw::NONE,
                };
            }
            raws_stale = false;
        }
        let started = profile.map(|_| std::time::Instant::now());
        if let CKernel::Extern(e) = k {
            *n_extern += 1;
            // Lend arena and output buffers to the reference kernel as storages.
            let mut lent: Vec<(Loc, Arc<Storage>)> = Vec::new();
            let mut args = Vec::with_capacity(e.args.len());
            for (b, meta) in &e.args {
                let loc = low.loc[*b];
                let storage = match loc {
                    Loc::Input(i) | Loc::Updated(i) => inputs[i].storage.clone(),
                    Loc::Extern => externs
                        .get(b)
                        .cloned()
                        .ok_or_else(|| CpuError::Internal(format!("extern buffer b{b} read before it exists")))?,
                    Loc::Slot(_) | Loc::Output(_) => match lent.iter().find(|(l, _)| *l == loc) {
                        Some((_, s)) => s.clone(),
                        None => {
                            let buf = match loc {
                                Loc::Slot(s) => std::mem::replace(&mut arena.slots[s], Buffer::F32(Vec::new())),
                                Loc::Output(o) => std::mem::replace(&mut outs[o], Buffer::F32(Vec::new())),
                                _ => unreachable!("matched above"),
                            };
                            let s = Storage::new(buf);
                            lent.push((loc, s.clone()));
                            s
                        }
                    },
                };
                args.push(CpuTensor { storage, meta: meta.clone() });
            }
            let refs: Vec<&CpuTensor> = args.iter().collect();
            let res = crate::execute(&e.op, &refs, &e.meta).map_err(|err| CpuError::Node {
                value: e.at.0,
                op: e.op.name(),
                loc: e.at.1.clone(),
                source: Box::new(err),
            });
            drop(args);
            if !lent.is_empty() {
                raws_stale = true;
            }
            for (loc, s) in lent {
                let buf = Arc::try_unwrap(s)
                    .map_err(|_| CpuError::Internal("an extern kernel kept a lent buffer".into()))?
                    .into_buffer();
                match loc {
                    Loc::Slot(s) => arena.slots[s] = buf,
                    Loc::Output(o) => outs[o] = buf,
                    _ => {}
                }
            }
            externs.insert(e.out, res?.storage);
            if let Some(t) = started {
                times.push(t.elapsed().as_secs_f64());
            }
            continue;
        }
        // Raw views of every buffer this kernel touches: input storages are locked
        // for the kernel's duration, once each (two inputs may share a storage),
        // for writing when the kernel updates one of its buffers in place.
        let mut touched: Vec<(usize, &Arc<Storage>, bool)> = Vec::new();
        let stored: Vec<usize> = members.iter().flat_map(CKernel::stored).collect();
        for b in members.iter().flat_map(CKernel::loaded).chain(stored.iter().copied()) {
            let (storage, write) = match low.loc[b] {
                Loc::Input(i) => (&inputs[i].storage, false),
                Loc::Updated(i) => (&inputs[i].storage, stored.contains(&b)),
                Loc::Extern => (
                    externs
                        .get(&b)
                        .ok_or_else(|| CpuError::Internal(format!("extern buffer b{b} read before it exists")))?,
                    false,
                ),
                _ => continue,
            };
            touched.push((b, storage, write));
        }
        let mut guards: Vec<(*const Storage, StorageGuard<'_>)> = Vec::new();
        let mut set: Vec<usize> = Vec::new();
        for &(b, storage, _) in &touched {
            if !bufs[b].ptr.is_null() {
                continue;
            }
            let key = Arc::as_ptr(storage);
            let p = match guards.iter().find(|(s, _)| *s == key) {
                Some((_, g)) => g.raw(),
                None => {
                    let write = touched.iter().any(|&(_, s, w)| w && Arc::as_ptr(s) == key);
                    let g = if write {
                        StorageGuard::Write(storage.write_unversioned())
                    } else {
                        StorageGuard::Read(storage.read())
                    };
                    let p = g.raw();
                    guards.push((key, g));
                    p
                }
            };
            bufs[b] = p;
            set.push(b);
        }
        // SAFETY: the lowering checked every access against its buffer (inputs
        // against `input_need` above); kernels write only their own outputs.
        unsafe {
            match k {
                CKernel::Pointwise(_) if members.len() > 1 => {
                    let parts: Vec<&kernels::CPointwise> = members
                        .iter()
                        .filter_map(|m| match m {
                            CKernel::Pointwise(p) => Some(p),
                            _ => None,
                        })
                        .collect();
                    exec::group(&parts, &bufs, threads)
                }
                CKernel::Pointwise(p) => exec::pointwise(p, &bufs, threads),
                CKernel::Reduce(r) => exec::reduce(r, &bufs, &mut arena.scratch, threads).map_err(|err| {
                    CpuError::Node { value: r.at.0, op: r.op.name().into(), loc: r.at.1.clone(), source: Box::new(err) }
                })?,
                CKernel::Matmul(m) => exec::matmul(m, &bufs, threads),
                CKernel::Rows(g) => exec::rows(g, &bufs, &mut arena.scratch, threads)?,
                CKernel::Extern(_) => {}
            }
        }
        drop(guards);
        for b in set {
            bufs[b] = Raw::NONE;
        }
        if let Some(hook) = ready.as_deref_mut() {
            for kernel in i..end {
                for &j in ready_after.get(kernel).map_or(&[][..], Vec::as_slice) {
                    let (b, meta) = &low.outputs[j];
                    let Loc::Output(o) = low.loc[*b] else { continue };
                    let data = match &outs[o] {
                        Buffer::F32(v) => aotgrad_ir::HostData::F32(v),
                        Buffer::F64(v) => aotgrad_ir::HostData::F64(v),
                        _ => continue,
                    };
                    hook(aotgrad_ir::ReadyOutput { index: j, meta, data });
                }
            }
        }
        if let Some(t) = started {
            // A group's time goes to its kernels in proportion to their elements.
            let t = t.elapsed().as_secs_f64();
            let numel = |m: &CKernel| if let CKernel::Pointwise(p) = m { p.numel.max(1) } else { 1 };
            let total: usize = members.iter().map(numel).sum();
            times.extend(members.iter().map(|m| t * numel(m) as f64 / total as f64));
        }
    }
    if let Some(p) = profile {
        let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
        let len = times.len().max(p.len());
        p.resize(len, (0.0, 0));
        for (slot, t) in p.iter_mut().zip(times) {
            slot.0 += t;
            slot.1 += 1;
        }
    }
    Ok(())
}
