//! The worker `tests/mpi.rs` launches under `mpirun` (and once without it, for the
//! one-process reference): a small GELU MLP classifier trained on synthetic data with
//! AdamW, data-parallel when launched by MPI.
//!
//! `aotgrad-dist-check MODE [--steps N] [--out DIR] [--det] [--bucket BYTES] [--at STEP]
//! [--width W] [--resume]`, MODE one of:
//! - `train`: train `--steps` steps of global batch 12 (`--zero`: with ZeRO-1's
//!   sharded AdamW, `--det`: deterministic allreduce, `--no-overlap`: buckets
//!   exchanged after the backward); write every parameter's f32
//!   bits to `DIR/params-rank{r}.txt` (`params-single.txt` without MPI); with
//!   `--checkpoint-at K` rank 0 also writes `DIR/checkpoint.safetensors` after step
//!   K, and `--resume` continues from it;
//! - `nosync`: gradient accumulation under `no_sync` equals the sum of separately
//!   averaged micro-batches;
//! - `mismatch`: rank 1 builds a wider model; wrapping must fail naming rank 1;
//! - `fail`: rank 1 returns an error at step `--at`;
//! - `kill`: rank 1 is killed (SIGKILL) at step `--at`.

use aotgrad_dist::{DdpConfig, DistributedDataParallel, DistributedSampler, World, ZeroAdamW};
use aotgrad_ir::DType;
use aotgrad_nn::{AdamW, Mlp, Module, Optimizer, ParamStore, Params};
use aotgrad_runtime::module::{aot_module, AotModule};
use aotgrad_runtime::AotConfig;
use aotgrad_trace::Tensor;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

const EXAMPLES: usize = 96;
const FEATURES: usize = 8;
const CLASSES: usize = 4;
const GLOBAL_BATCH: usize = 12;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Net {
    mlp: Mlp,
}

impl Module for Net {
    fn store(&self) -> &ParamStore {
        self.mlp.store()
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad_runtime::Result<Vec<Tensor>> {
        let logits = self.mlp.apply(p, &inputs[0])?;
        Ok(vec![logits.cross_entropy(&inputs[1])?, logits])
    }
}

struct Args {
    mode: String,
    steps: usize,
    out: PathBuf,
    det: bool,
    bucket: usize,
    at: usize,
    width: usize,
    resume: bool,
    zero: bool,
    no_overlap: bool,
    checkpoint_at: usize,
}

fn args() -> Args {
    let mut a = Args {
        mode: String::new(),
        steps: 50,
        out: std::env::temp_dir(),
        det: false,
        bucket: 256,
        at: usize::MAX,
        width: 16,
        resume: false,
        zero: false,
        no_overlap: false,
        checkpoint_at: usize::MAX,
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        let mut val = || it.next().unwrap_or_default();
        match s.as_str() {
            "--steps" => a.steps = val().parse().unwrap_or(a.steps),
            "--out" => a.out = PathBuf::from(val()),
            "--det" => a.det = true,
            "--bucket" => a.bucket = val().parse().unwrap_or(a.bucket),
            "--at" => a.at = val().parse().unwrap_or(a.at),
            "--width" => a.width = val().parse().unwrap_or(a.width),
            "--resume" => a.resume = true,
            "--zero" => a.zero = true,
            "--no-overlap" => a.no_overlap = true,
            "--checkpoint-at" => a.checkpoint_at = val().parse().unwrap_or(a.checkpoint_at),
            m => a.mode = m.to_string(),
        }
    }
    a
}

/// The synthetic data: features from a seeded normal, labels from a fixed rule.
fn data() -> Res<(Vec<f32>, Vec<i64>)> {
    let x = Tensor::randn(&[EXAMPLES, FEATURES], DType::F32, 11)?.to_vec_f64()?;
    let y = (0..EXAMPLES)
        .map(|i| {
            let row = &x[i * FEATURES..(i + 1) * FEATURES];
            (if row[0] > 0.0 { 1 } else { 0 }) + (if row[1] + row[2] > 0.0 { 2 } else { 0 })
        })
        .collect();
    Ok((x.iter().map(|&v| v as f32).collect(), y))
}

fn batch(data: &(Vec<f32>, Vec<i64>), idx: &[usize]) -> Res<(Tensor, Tensor)> {
    let x: Vec<f32> = idx.iter().flat_map(|&i| data.0[i * FEATURES..(i + 1) * FEATURES].to_vec()).collect();
    let y: Vec<i64> = idx.iter().map(|&i| data.1[i]).collect();
    Ok((Tensor::from_vec(x, &[idx.len(), FEATURES])?, Tensor::from_vec(y, &[idx.len()])?))
}

/// The epoch's order: a fixed rotation and interleave per epoch (the same on every rank).
fn order(epoch: usize) -> Vec<usize> {
    (0..EXAMPLES).map(|i| (i * 37 + epoch * 11) % EXAMPLES).collect()
}

fn model(width: usize) -> Res<(Arc<Net>, AotModule)> {
    let net = Arc::new(Net { mlp: Mlp::new(&[FEATURES, width, CLASSES], DType::F32, 3)? });
    let compiled = aot_module(net.clone(), AotConfig::default().threads(1))?;
    Ok((net, compiled))
}

fn write_params(store: &ParamStore, path: &std::path::Path) -> Res<()> {
    let mut s = String::new();
    for (name, t) in store.params() {
        let bits: Vec<String> = t.to_vec_f64()?.iter().map(|&v| format!("{:08x}", (v as f32).to_bits())).collect();
        s.push_str(&format!("{name} {}\n", bits.join(" ")));
    }
    std::fs::write(path, s)?;
    Ok(())
}

fn train(a: &Args, world: Option<Rc<World>>) -> Res<()> {
    let data = data()?;
    let (net, compiled) = model(a.width)?;
    let (rank, ranks) = world.as_ref().map_or((0, 1), |w| (w.rank(), w.size()));
    let sampler = DistributedSampler::new(EXAMPLES, GLOBAL_BATCH, rank, ranks)?;
    let (ddp, single) = match &world {
        Some(w) => {
            let config = DdpConfig {
                bucket_bytes: a.bucket,
                first_bucket_bytes: a.bucket,
                deterministic: a.det,
                average_gradients: !a.zero,
                overlap: !a.no_overlap,
            };
            (Some(DistributedDataParallel::new(w.clone(), compiled, config)?), None)
        }
        None => (None, Some(compiled)),
    };
    let adamw = || AdamW::with(1e-2, (0.9, 0.999), 1e-8, 0.01);
    let mut zero = match (&world, a.zero) {
        (Some(w), true) => Some(ZeroAdamW::new(w.clone(), net.store(), adamw()?)?),
        _ => None,
    };
    let mut plain = adamw()?;
    fn pick<'a>(zero: &'a mut Option<ZeroAdamW>, plain: &'a mut AdamW) -> &'a mut dyn Optimizer {
        match zero {
            Some(z) => z,
            None => plain,
        }
    }
    let ckpt = a.out.join("checkpoint.safetensors");
    let mut first = 0;
    if a.resume {
        let loaded = aotgrad_nn::checkpoint::load(&ckpt, net.store(), Some(pick(&mut zero, &mut plain)))?;
        first = loaded.metadata.get("step").and_then(|s| s.parse().ok()).ok_or("no step in the checkpoint")?;
    }
    let one = Tensor::ones(&[], DType::F32)?;
    let per_epoch = sampler.steps_per_epoch();
    for step in first..a.steps {
        let order = order(step / per_epoch);
        let (x, y) = batch(&data, sampler.shard(&order, step % per_epoch)?)?;
        if a.mode == "fail" && rank == 1 && step == a.at {
            return Err(format!("a failure injected at step {step}").into());
        }
        if a.mode == "kill" && rank == 1 && step == a.at {
            let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
        let grads = match (&ddp, &single) {
            (Some(d), _) => {
                let (_, back) = d.forward(&[x, y])?;
                back.backward_with(&[Some(one.clone()), None], &[])?
            }
            (None, Some(m)) => {
                let (_, back) = m.forward(&[x, y])?;
                back.backward_with(&[Some(one.clone()), None], &[])?
            }
            (None, None) => unreachable!("one of the two is set above"),
        };
        pick(&mut zero, &mut plain).step(net.store(), &grads.params)?;
        if step + 1 == a.checkpoint_at {
            if let Some(z) = zero.as_mut() {
                z.gather()?;
            }
            if rank == 0 {
                let meta = vec![("step".to_string(), (step + 1).to_string())];
                aotgrad_nn::checkpoint::save(&ckpt, net.store(), Some(&*pick(&mut zero, &mut plain)), &meta)?;
            }
        }
    }
    let name = if world.is_some() { format!("params-rank{rank}.txt") } else { "params-single.txt".into() };
    write_params(net.store(), &a.out.join(name))?;
    if let Some(d) = &ddp {
        let s = d.stats();
        println!(
            "rank {rank}: {} syncs, {} buckets of {} bytes in all, {} gradients during the backward",
            s.syncs,
            d.plan().buckets.len(),
            d.plan().bytes(),
            s.early_gradients
        );
    }
    Ok(())
}

fn nosync(world: Rc<World>) -> Res<()> {
    let data = data()?;
    let (_net, compiled) = model(16)?;
    let rank = world.rank();
    let ddp = DistributedDataParallel::new(
        world.clone(),
        compiled,
        DdpConfig { bucket_bytes: 256, first_bucket_bytes: 256, deterministic: true, ..DdpConfig::default() },
    )?;
    let one = Tensor::ones(&[], DType::F32)?;
    let mb = |k: usize| batch(&data, &[rank * 6 + 3 * k, rank * 6 + 3 * k + 1, rank * 6 + 3 * k + 2]);
    let run = |k: usize| -> Res<aotgrad_runtime::module::ModuleGrads> {
        let (x, y) = mb(k)?;
        let (_, back) = ddp.forward(&[x, y])?;
        Ok(back.backward_with(&[Some(one.clone()), None], &[])?)
    };
    let local = ddp.no_sync(|| run(0))?;
    let (x, y) = mb(0)?;
    let (_, plain) = ddp.module().forward(&[x, y])?;
    let plain = plain.backward_with(&[Some(one.clone()), None], &[])?;
    for ((n, a), (_, b)) in local.params.iter().zip(&plain.params) {
        if a.to_vec_f64()? != b.to_vec_f64()? {
            return Err(format!("under no_sync the gradient of {n} is not the local one").into());
        }
    }
    let accumulated = run(1)?;
    let (a0, a1) = (run(0)?, run(1)?);
    for (((n, g), (_, x)), (_, y)) in accumulated.params.iter().zip(&a0.params).zip(&a1.params) {
        for ((g, x), y) in g.to_vec_f64()?.iter().zip(x.to_vec_f64()?).zip(y.to_vec_f64()?) {
            if (g - (x + y)).abs() > 1e-6 * (1.0 + g.abs()) {
                return Err(format!("accumulated gradient of {n}: {g} against {} + {}", x, y).into());
            }
        }
    }
    let s = ddp.stats();
    if s.accumulated != 1 || s.syncs != 3 {
        return Err(format!("stats {s:?}").into());
    }
    println!("rank {rank}: nosync ok");
    Ok(())
}

fn mismatch(world: Rc<World>) -> Res<()> {
    let width = if world.rank() == 1 { 17 } else { 16 };
    let (_net, compiled) = model(width)?;
    match DistributedDataParallel::new(world.clone(), compiled, DdpConfig::default()) {
        Err(e @ aotgrad_dist::Error::Mismatch { rank: 1, .. }) => {
            println!("rank {}: refused: {e}", world.rank());
            Ok(())
        }
        Err(e) => Err(format!("another error: {e}").into()),
        Ok(_) => Err("ranks with different models were accepted".into()),
    }
}

fn main() {
    let a = args();
    let world = if aotgrad_dist::launched() {
        match World::init() {
            Ok(w) => Some(Rc::new(w)),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(2);
            }
        }
    } else {
        None
    };
    let result = match (a.mode.as_str(), &world) {
        ("train" | "fail" | "kill", _) => train(&a, world.clone()),
        ("nosync", Some(w)) => nosync(w.clone()),
        ("mismatch", Some(w)) => mismatch(w.clone()),
        (m, _) => Err(format!("unknown mode {m:?} (or it needs mpirun)").into()),
    };
    if let Err(e) = result {
        let rank = world.as_ref().map_or(0, |w| w.rank());
        eprintln!("error: rank {rank}: {e}");
        match &world {
            Some(w) => w.abort(3),
            None => std::process::exit(1),
        }
    }
}
