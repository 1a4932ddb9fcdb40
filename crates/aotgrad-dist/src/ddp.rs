//! [`DistributedDataParallel`]: one [`AotModule`] replicated on every rank, its
//! gradients averaged across the ranks after each backward.
//!
//! - **Wrapping** broadcasts rank 0's parameters and buffers to every rank (after
//!   checking that every rank holds the same names, shapes and dtypes: an error names
//!   the first rank that differs), so each rank starts from the same model whatever
//!   seed it initialized with.
//! - **The first forward** compiles the module on every rank (loaded from the cache
//!   where one is configured); then the ranks compare a fingerprint of what they
//!   compiled (the traced graphs, the backend's identity) and refuse to train on
//!   different programs.
//! - **Each backward** lays the local gradients end to end in the [`BucketPlan`]'s
//!   buckets (reverse parameter order) and starts a non-blocking allreduce for each
//!   bucket as soon as it is packed, so a bucket travels while the next ones are
//!   packed; then it waits for all, divides by the number of ranks and hands back the
//!   averaged gradients, by parameter name, like [`ModuleBackward::backward_with`].
//! - **Deterministic mode** ([`DdpConfig::deterministic`]) replaces the allreduce by an
//!   allgather and sums the ranks' gradients in rank order on every rank: every rank
//!   gets bit-identical gradients, and so keeps bit-identical parameters, whatever
//!   MPI's reduction algorithm does (MPI does not promise every rank the same bits).
//! - **Gradient accumulation**: backwards run inside [`DistributedDataParallel::no_sync`]
//!   add their gradients to a local accumulator and return the local gradients
//!   unsynchronized; the next backward outside it adds its own, averages the sum
//!   across ranks and returns that (the sum over the micro-batches, averaged over the
//!   ranks, as PyTorch's `.grad` holds after DDP's `no_sync`).

use crate::bucket::BucketPlan;
use crate::error::{Error, Result};
use crate::flat::{add_into, Elem};
use crate::overlap::Exchange;
use crate::world::World;
use aotgrad_ir::DType;
use aotgrad_runtime::module::{AotModule, ModuleBackward, ModuleGrads};
use aotgrad_trace::{NoGradGuard, Tensor};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

/// How long the first forward's collectives wait at least: they cover another rank's
/// compile (rank 0 compiles first; the others compile when no cache is shared).
const COMPILE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// How [`DistributedDataParallel`] synchronizes gradients.
#[derive(Clone, Debug, PartialEq)]
pub struct DdpConfig {
    /// Largest bucket in bytes (default 25 MiB, as PyTorch's DDP).
    pub bucket_bytes: usize,
    /// Largest first bucket (the last layers' gradients) in bytes (default 1 MiB, as
    /// PyTorch's DDP), so that communication starts early in the backward.
    pub first_bucket_bytes: usize,
    /// Sum the ranks' gradients in rank order on every rank (bit-identical ranks).
    pub deterministic: bool,
    /// Start each bucket's exchange while the backward still runs, as soon as the
    /// compiled backward has finished its gradients (default; f32 buckets). `false`
    /// exchanges every bucket after the backward.
    pub overlap: bool,
    /// Average the gradients across ranks (default). `false` hands back this rank's
    /// own gradients, for an optimizer that reduces them itself ([`crate::ZeroAdamW`]
    /// reduce-scatters them).
    pub average_gradients: bool,
}

impl Default for DdpConfig {
    fn default() -> Self {
        DdpConfig {
            bucket_bytes: 25 << 20,
            first_bucket_bytes: 1 << 20,
            deterministic: false,
            overlap: true,
            average_gradients: true,
        }
    }
}

/// Counters of the gradient synchronizations so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DdpStats {
    /// Backwards whose gradients were averaged across ranks.
    pub syncs: u64,
    /// Backwards run under `no_sync` (accumulated locally).
    pub accumulated: u64,
    /// Gradient bytes this rank sent into allreduces (or allgathers).
    pub bytes: u64,
    /// Seconds from the end of the backward graph to the averaged gradients: what
    /// synchronization adds to a step.
    pub sync_seconds: f64,
    /// Seconds from the first bucket's exchange starting to the last one completing.
    pub comm_seconds: f64,
    /// Of `comm_seconds`, those after the backward graph ended: communication not
    /// hidden behind the backward.
    pub exposed_seconds: f64,
    /// Gradients that reached their bucket while the backward still ran.
    pub early_gradients: u64,
}

impl DdpStats {
    /// The share of communication time that overlapped the backward, in `[0, 1]`.
    pub fn overlap(&self) -> f64 {
        if self.comm_seconds <= 0.0 {
            return 0.0;
        }
        (1.0 - self.exposed_seconds / self.comm_seconds).clamp(0.0, 1.0)
    }
}

/// A flat buffer per bucket, of the bucket's dtype.
enum Flat {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// An [`AotModule`] trained data-parallel across the ranks of a [`World`]; see the
/// [module docs](self).
pub struct DistributedDataParallel {
    world: Rc<World>,
    module: AotModule,
    config: DdpConfig,
    plan: BucketPlan,
    /// `(name, shape)` of every parameter, in module order.
    params: Vec<(String, Vec<usize>)>,
    /// Each parameter's index in `params`, by name.
    index: std::collections::HashMap<String, usize>,
    sync: Cell<bool>,
    checked: Cell<bool>,
    sources: RefCell<Vec<bool>>,
    accumulator: RefCell<Option<Vec<Flat>>>,
    stats: Cell<DdpStats>,
}

/// The backward of one [`DistributedDataParallel::forward`] call.
pub struct DdpBackward<'a> {
    ddp: &'a DistributedDataParallel,
    back: ModuleBackward,
}

fn signature(store: &aotgrad_runtime::params::ParamStore) -> Result<String> {
    let mut s = String::new();
    for (kind, list) in [("param", store.params()), ("buffer", store.buffers())] {
        for (name, t) in list {
            s.push_str(&format!("{kind} {name} {:?} {:?}\n", t.sizes()?, t.dtype()));
        }
    }
    Ok(s)
}

/// The first line where `a` and `b` differ, for messages.
fn first_difference(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    for i in 0..la.len().max(lb.len()) {
        let (x, y) = (la.get(i).copied().unwrap_or("(nothing)"), lb.get(i).copied().unwrap_or("(nothing)"));
        if x != y {
            return format!("rank 0 has `{x}`, it has `{y}`");
        }
    }
    "they differ".into()
}

impl DistributedDataParallel {
    /// Wrap `module` for data-parallel training on `world`: every rank must call this
    /// (it broadcasts rank 0's parameters and buffers; see the [module docs](self)).
    pub fn new(world: Rc<World>, module: AotModule, config: DdpConfig) -> Result<DistributedDataParallel> {
        let store = module.module().store();
        let sig = signature(store)?;
        let all = world.all_gather_bytes(sig.as_bytes(), 0)?;
        if let Some(r) = all.iter().position(|o| o != &all[0]) {
            let (root, theirs) = (String::from_utf8_lossy(&all[0]), String::from_utf8_lossy(&all[r]));
            return Err(Error::Mismatch {
                rank: r,
                what: format!("the module's parameters and buffers differ: {}", first_difference(&root, &theirs)),
            });
        }
        // Rank 0's values everywhere (as f64, exact for every dtype a module holds).
        let tensors: Vec<Tensor> = store.params().iter().chain(store.buffers()).map(|(_, t)| t.clone()).collect();
        let mut bytes = Vec::new();
        if world.is_root() {
            for t in &tensors {
                for v in t.to_vec_f64()? {
                    bytes.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        world.broadcast_bytes(0, &mut bytes, 0)?;
        if !world.is_root() {
            let _no_grad = NoGradGuard::new();
            let mut at = 0;
            for t in &tensors {
                let shape = t.sizes()?;
                let n: usize = shape.iter().product();
                let end = at + 8 * n;
                let chunk = bytes.get(at..end).ok_or_else(|| Error::Invalid("rank 0 sent too few values".into()))?;
                let values: Vec<f64> =
                    chunk.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
                t.copy_(&Tensor::from_f64(&values, &shape, t.dtype())?)?;
                at = end;
            }
        }
        let mut params = Vec::new();
        let mut layout = Vec::new();
        for (name, t) in store.params() {
            let shape = t.sizes()?;
            layout.push((name.clone(), t.dtype(), shape.iter().product()));
            params.push((name.clone(), shape));
        }
        let index =
            params.iter().enumerate().map(|(i, (n, _)): (usize, &(String, Vec<usize>))| (n.clone(), i)).collect();
        let plan = BucketPlan::new(&layout, config.first_bucket_bytes.min(config.bucket_bytes), config.bucket_bytes)?;
        Ok(DistributedDataParallel {
            world,
            module,
            config,
            plan,
            params,
            index,
            sync: Cell::new(true),
            checked: Cell::new(false),
            sources: RefCell::new(Vec::new()),
            accumulator: RefCell::new(None),
            stats: Cell::new(DdpStats::default()),
        })
    }

    /// The world.
    pub fn world(&self) -> &Rc<World> {
        &self.world
    }

    /// The wrapped module.
    pub fn module(&self) -> &AotModule {
        &self.module
    }

    /// The bucket plan.
    pub fn plan(&self) -> &BucketPlan {
        &self.plan
    }

    /// The configuration.
    pub fn config(&self) -> &DdpConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> DdpStats {
        self.stats.get()
    }

    /// Run `f` with gradient synchronization off: backwards inside it accumulate
    /// locally (see the [module docs](self)).
    pub fn no_sync<R>(&self, f: impl FnOnce() -> R) -> R {
        let before = self.sync.replace(false);
        let r = f();
        self.sync.set(before);
        r
    }

    /// The compiled training forward on this rank's inputs (a shard of the global
    /// batch); the returned backward averages the gradients across ranks.
    ///
    /// The first call compiles: rank 0 first (storing the result when a cache is
    /// configured), then the others (which load it from a shared cache instead of
    /// compiling; [`DistributedDataParallel::compile_sources`] says which did).
    pub fn forward(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, DdpBackward<'_>)> {
        if self.checked.get() {
            let (outs, back) = self.module.forward(inputs)?;
            return Ok((outs, DdpBackward { ddp: self, back }));
        }
        // Every rank takes this path once, whether or not its module compiled before:
        // the others wait for rank 0's compile (with a deadline long enough for one).
        let compile_wait = self.world.timeout().max(COMPILE_WAIT);
        if !self.world.is_root() {
            self.world.barrier_for(0, compile_wait)?;
        }
        let result = self.module.forward(inputs);
        if self.world.is_root() {
            // Rank 0 has compiled (and stored): the others may go, even if it failed
            // (they then fail on their own or at the check below).
            self.world.barrier_for(0, compile_wait)?;
        }
        let check = self.check_same_program(compile_wait);
        let (outs, back) = result?;
        check?;
        self.checked.set(true);
        Ok((outs, DdpBackward { ddp: self, back }))
    }

    /// After the first forward: for each rank, whether its first compiled entry was
    /// loaded from the cache (`true`) or compiled there (`false`).
    pub fn compile_sources(&self) -> Vec<bool> {
        self.sources.borrow().clone()
    }

    /// Every rank compiled the same program: compare a fingerprint of the traced
    /// graphs and the backend identity of every compiled entry.
    fn check_same_program(&self, wait: std::time::Duration) -> Result<()> {
        let f = self.module.function();
        let mut h = blake3::Hasher::new();
        for g in f.traced_graphs() {
            h.update(g.to_string().as_bytes());
        }
        for r in f.results() {
            h.update(r.meta.backend_identity.as_bytes());
        }
        let mine = h.finalize();
        let loaded = f.compile_reports().first().is_some_and(|r| r.source != aotgrad_runtime::EntrySource::Compiled);
        let mut msg = mine.as_bytes().to_vec();
        msg.push(u8::from(loaded));
        let all = self.world.all_gather_bytes_for(&msg, self.step(), wait)?;
        *self.sources.borrow_mut() = all.iter().map(|m| m.last() == Some(&1)).collect();
        let all: Vec<&[u8]> = all.iter().map(|m| &m[..m.len().saturating_sub(1)]).collect();
        if let Some(r) = all.iter().position(|o| *o != all[0]) {
            return Err(Error::Mismatch {
                rank: r,
                what: "it compiled another program (traced graphs or backend differ): every rank must run the same \
                       model on the same backend with inputs of the same shapes"
                    .into(),
            });
        }
        Ok(())
    }

    /// Synchronizations so far: the step number in messages.
    fn step(&self) -> u64 {
        self.stats.get().syncs
    }

    fn new_flats(&self) -> Vec<Flat> {
        self.plan
            .buckets
            .iter()
            .map(|b| match b.dtype {
                DType::F64 => Flat::F64(vec![0.0; b.elems]),
                _ => Flat::F32(vec![0.0; b.elems]),
            })
            .collect()
    }

    /// `grads`' gradients by parameter index (`None` where a parameter has none).
    fn by_index<'g>(&self, grads: &'g ModuleGrads) -> Result<Vec<Option<(&'g String, &'g Tensor)>>> {
        let mut out = vec![None; self.params.len()];
        for (name, g) in &grads.params {
            let &i = self
                .index
                .get(name)
                .ok_or_else(|| Error::Invalid(format!("a gradient for {name}, which is no parameter")))?;
            out[i] = Some((name, g));
        }
        Ok(out)
    }

    /// The averaged buckets back as tensors, for the parameters `local` has
    /// gradients for, in module order.
    fn averaged_grads(
        &self,
        f32s: &[(usize, Vec<f32>)],
        f64s: &[(usize, Vec<f64>)],
        local: &ModuleGrads,
    ) -> Result<ModuleGrads> {
        let mut by_param: Vec<Option<Tensor>> = vec![None; self.params.len()];
        for (k, v) in f32s {
            unpack(&self.plan.buckets[*k], v, &self.params, &mut by_param)?;
        }
        for (k, v) in f64s {
            unpack(&self.plan.buckets[*k], v, &self.params, &mut by_param)?;
        }
        let present = self.by_index(local)?;
        let params = self
            .params
            .iter()
            .zip(by_param)
            .zip(present)
            .filter_map(|(((name, _), g), had)| Some((name.clone(), g.filter(|_| had.is_some())?)))
            .collect();
        Ok(ModuleGrads { params, inputs: local.inputs.clone() })
    }

    /// Add `grads` into `flats` at their slots.
    fn add_grads(&self, flats: &mut [Flat], grads: &ModuleGrads) -> Result<()> {
        for (i, g) in self.by_index(grads)?.into_iter().enumerate() {
            let Some((name, g)) = g else { continue };
            let (k, s) = self.plan.place[i];
            let slot = &self.plan.buckets[k].slots[s];
            let range = slot.offset..slot.offset + slot.len;
            match &mut flats[k] {
                Flat::F32(v) => add_into(g, &mut v[range], name)?,
                Flat::F64(v) => add_into(g, &mut v[range], name)?,
            }
        }
        Ok(())
    }

    /// Whether this backward's gradients are exchanged while it runs.
    fn overlaps(&self) -> bool {
        self.config.overlap
            && self.config.average_gradients
            && self.sync.get()
            && self.plan.buckets.iter().all(|b| b.dtype == DType::F32)
    }

    /// The backward with the buckets exchanged as their gradients come out of it
    /// (the gradient hand-out of the `overlap` module), then averaged.
    fn overlapped(
        &self,
        back: &ModuleBackward,
        output_grads: &[Option<Tensor>],
        updated: &[(usize, Tensor)],
    ) -> Result<ModuleGrads> {
        let det = self.config.deterministic;
        let sends: Vec<Vec<f32>> = match self.accumulator.borrow_mut().take() {
            Some(acc) => acc.into_iter().map(|f| if let Flat::F32(v) = f { v } else { Vec::new() }).collect(),
            None => self.plan.buckets.iter().map(|b| vec![0.0; b.elems]).collect(),
        };
        let step = self.step();
        let mut ex = Exchange::new(&self.world, &self.plan, det, sends, step);
        let result = back.backward_streaming(output_grads, updated, &mut |p, o| ex.ready(p, o));
        let backward_end = Instant::now();
        // Whatever happened, every bucket is filled and exchanged: the other ranks
        // wait for them.
        let none = || vec![None; self.params.len()];
        let (got, mut late) = match result.as_ref().map(|g| self.by_index(g)) {
            Ok(Ok(got)) => (got, Ok(())),
            Ok(Err(e)) => (none(), Err(e)),
            Err(_) => (none(), Ok(())),
        };
        for (i, g) in got.into_iter().enumerate() {
            let r = ex.fill_late(i, |dst| match g {
                Some((name, t)) => add_into(t, dst, name),
                None => Ok(()),
            });
            if late.is_ok() {
                late = r;
            }
        }
        let early = ex.early;
        let finished = ex.finish();
        late?;
        let (averaged, first_start, last_done) = finished?;
        let grads = result?;
        let f32s: Vec<(usize, Vec<f32>)> = averaged.into_iter().enumerate().collect();
        let out = self.averaged_grads(&f32s, &[], &grads)?;
        let mut st = self.stats.get();
        st.syncs += 1;
        st.bytes += self.plan.bytes() as u64;
        st.sync_seconds += backward_end.elapsed().as_secs_f64();
        st.early_gradients += early;
        if let (Some(a), Some(z)) = (first_start, last_done) {
            st.comm_seconds += z.saturating_duration_since(a).as_secs_f64();
            st.exposed_seconds += z.saturating_duration_since(backward_end.max(a)).as_secs_f64();
        }
        self.stats.set(st);
        Ok(out)
    }

    fn finish(&self, grads: ModuleGrads) -> Result<ModuleGrads> {
        let t0 = Instant::now();
        let mut st = self.stats.get();
        if !self.config.average_gradients {
            if self.accumulator.borrow().is_some() || !self.sync.get() {
                return Err(Error::Invalid(
                    "no_sync accumulates averaged gradients; with average_gradients off, accumulate them yourself"
                        .into(),
                ));
            }
            st.syncs += 1;
            self.stats.set(st);
            return Ok(grads);
        }
        if !self.sync.get() {
            let mut acc = self.accumulator.borrow_mut();
            let flats = acc.get_or_insert_with(|| self.new_flats());
            self.add_grads(flats, &grads)?;
            st.accumulated += 1;
            self.stats.set(st);
            return Ok(grads);
        }
        let mut flats = self.accumulator.borrow_mut().take().unwrap_or_else(|| self.new_flats());
        // Exchanged even when adding failed: the other ranks wait for every bucket.
        let added = self.add_grads(&mut flats, &grads);
        // Every bucket of a dtype goes out in plan order, each exchange started as
        // soon as the bucket is ready.
        let mut f32s: Vec<(usize, Vec<f32>)> = Vec::new();
        let mut f64s: Vec<(usize, Vec<f64>)> = Vec::new();
        for (k, f) in flats.into_iter().enumerate() {
            match f {
                Flat::F32(v) => f32s.push((k, v)),
                Flat::F64(v) => f64s.push((k, v)),
            }
        }
        let step = self.step();
        let mut wait = exchange(&self.world, &mut f32s, self.config.deterministic, step)?;
        wait += exchange(&self.world, &mut f64s, self.config.deterministic, step)?;
        added?;
        st.comm_seconds += wait;
        st.exposed_seconds += wait;
        let out = self.averaged_grads(&f32s, &f64s, &grads)?;
        st.syncs += 1;
        st.bytes += self.plan.bytes() as u64;
        st.sync_seconds += t0.elapsed().as_secs_f64();
        self.stats.set(st);
        Ok(out)
    }
}

/// The averaged values of one bucket back into tensors shaped like its parameters.
fn unpack<T: Elem>(
    bucket: &crate::bucket::Bucket,
    v: &[T],
    params: &[(String, Vec<usize>)],
    out: &mut [Option<Tensor>],
) -> Result<()> {
    for slot in &bucket.slots {
        let shape = &params[slot.param].1;
        out[slot.param] = Some(T::tensor(v[slot.offset..slot.offset + slot.len].to_vec(), shape)?);
    }
    Ok(())
}

/// Average `bufs` across the ranks in place: one non-blocking exchange per bucket,
/// Average `bufs` across the ranks in place: every bucket submitted to the MPI thread
/// in order, then waited for. Returns the seconds spent waiting.
fn exchange<T: Elem + Send>(
    world: &World,
    bufs: &mut [(usize, Vec<T>)],
    deterministic: bool,
    step: u64,
) -> Result<f64> {
    let pending = bufs
        .iter_mut()
        .map(|(_, b)| world.submit_average(std::mem::take(b), deterministic, step))
        .collect::<Result<Vec<_>>>()?;
    let t = Instant::now();
    for ((_, b), p) in bufs.iter_mut().zip(pending) {
        *b = p.wait_checked(world)?.values;
    }
    Ok(t.elapsed().as_secs_f64())
}

impl DdpBackward<'_> {
    /// The backward for the outputs' gradients (as [`ModuleBackward::backward`]),
    /// averaged across the ranks (or accumulated locally under `no_sync`).
    pub fn backward(self, output_grads: &[Tensor]) -> Result<ModuleGrads> {
        let opt: Vec<Option<Tensor>> = output_grads.iter().cloned().map(Some).collect();
        self.backward_with(&opt, &[])
    }

    /// [`ModuleBackward::backward_with`], averaged across the ranks.
    pub fn backward_with(
        self,
        output_grads: &[Option<Tensor>],
        updated_input_grads: &[(usize, Tensor)],
    ) -> Result<ModuleGrads> {
        if self.ddp.overlaps() {
            return self.ddp.overlapped(&self.back, output_grads, updated_input_grads);
        }
        match self.back.backward_with(output_grads, updated_input_grads) {
            Ok(g) => self.ddp.finish(g),
            Err(e) => {
                // The other ranks still exchange this step's buckets: send zeros, so
                // that every rank reaches the error (or the next step) instead of a
                // timeout, then report it.
                self.ddp.finish(ModuleGrads::default())?;
                Err(e.into())
            }
        }
    }

    /// The forward outputs.
    pub fn outputs(&self) -> &[Tensor] {
        self.back.outputs()
    }
}
