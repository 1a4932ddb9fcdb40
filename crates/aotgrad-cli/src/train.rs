//! `aotgrad train`: an image classifier on Fashion-MNIST, compiled once through
//! `aot_module` (the training step: traced, functionalized, differentiated,
//! simplified, partitioned, compiled) and evaluated through the inference path.
//!
//! Determinism: the initialization, every epoch's shuffle and the schedule derive from
//! `--seed` and the epoch/step index only, and the compiled CPU backend's results do
//! not depend on the thread count, so a run resumed from a checkpoint continues the
//! uninterrupted run's loss curve.

use crate::data::{Split, CLASSES};
use crate::models::{group, Classifier, ModelKind};
use aotgrad::nn::{checkpoint, AdamW, Module, Optimizer, WarmupCosine};
use aotgrad::prelude::*;
use aotgrad::{Cache, CompileReport, EntrySource};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Fashion-MNIST's pixel mean and standard deviation (of `pixel / 255`, training set).
const MEAN: f32 = 0.2860;
const STD: f32 = 0.3530;

/// Which backend compiles the graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The compiled CPU backend (fused kernels, gemm, threads).
    Cpu,
    /// The reference interpreter (the oracle; slow).
    Reference,
    /// The wgpu backend (fused WGSL kernels on a GPU adapter; needs a build with the
    /// `wgpu` feature: `cargo run --release -p aotgrad-cli --features wgpu`).
    Wgpu,
}

#[cfg(feature = "wgpu")]
fn wgpu_config() -> Result<AotConfig> {
    aotgrad::wgpu::adapter().map_err(|e| TrainError::Invalid(format!("--backend wgpu: {e}")))?;
    Ok(AotConfig::default().wgpu())
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_config() -> Result<AotConfig> {
    Err(TrainError::Invalid(
        "--backend wgpu: this aotgrad was built without the `wgpu` feature; build it with \
         `cargo run --release -p aotgrad-cli --features wgpu --bin aotgrad -- train --backend wgpu`"
            .into(),
    ))
}

#[cfg(feature = "wgpu")]
fn wgpu_description() -> String {
    match aotgrad::wgpu::adapter() {
        Ok(a) => format!("backend: wgpu on {} ({}, {}; {})", a.name, a.backend, a.driver, a.reason),
        Err(e) => format!("backend: wgpu ({e})"),
    }
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_description() -> String {
    "backend: wgpu (not built in)".into()
}

/// What to train and how; the hyperparameters are saved in checkpoints, and a resumed
/// run must agree with them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainOptions {
    /// The model.
    pub model: ModelKind,
    /// Epochs in all (a resumed run continues up to this many).
    pub epochs: usize,
    /// Training mini-batch size (the last partial batch of an epoch is dropped).
    pub batch_size: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Warmup steps (the rest of the run decays by a cosine to zero).
    pub warmup_steps: u64,
    /// Seed of the initialization and the shuffles.
    pub seed: u64,
    /// Use only the first this many training examples.
    pub train_limit: Option<usize>,
    /// Use only the first this many test examples.
    pub test_limit: Option<usize>,
    /// Threads of the compiled CPU backend (0: every core).
    pub threads: usize,
    /// The backend.
    pub backend: BackendChoice,
    /// Evaluation batch size.
    pub eval_batch: usize,
    /// The compiled-result cache directory (`None`: no cache). A rerun in a new
    /// process loads every specialization instead of compiling it.
    #[serde(default)]
    pub cache: Option<PathBuf>,
    /// Train a classifier imported from PyTorch (a `torch.export.save` archive)
    /// instead of `model`.
    #[serde(default)]
    pub model_file: Option<PathBuf>,
}

impl TrainOptions {
    /// The defaults for `model` (reach the targets: MLP ≥ 88%, ViT ≥ 89%).
    pub fn defaults(model: ModelKind) -> TrainOptions {
        let (epochs, lr, weight_decay) = match model {
            ModelKind::Mlp => (10, 2e-3, 0.05),
            ModelKind::Vit => (12, 3e-3, 0.05),
            ModelKind::Cnn => (5, 2e-3, 0.05),
        };
        TrainOptions {
            model,
            epochs,
            batch_size: 128,
            lr,
            weight_decay,
            warmup_steps: 200,
            seed: 0,
            train_limit: None,
            test_limit: None,
            threads: 0,
            backend: BackendChoice::Cpu,
            eval_batch: 1000,
            cache: None,
            model_file: None,
        }
    }

    /// The options that must match for a checkpoint to be resumed (everything that
    /// changes the loss curve).
    fn resume_key(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model, "batch_size": self.batch_size, "lr": self.lr,
            "weight_decay": self.weight_decay, "warmup_steps": self.warmup_steps, "seed": self.seed,
            "train_limit": self.train_limit, "epochs": self.epochs, "model_file": self.model_file,
        })
    }

    /// The model these options train: `model_file`'s imported classifier, else
    /// `model` initialized from `seed`.
    pub fn build_model(&self) -> Result<Classifier> {
        match &self.model_file {
            Some(path) => Classifier::imported(path).map_err(TrainError::Invalid),
            None => Ok(self.model.build(self.seed)?),
        }
    }
}

/// One epoch's numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    /// 1-based.
    pub epoch: usize,
    /// Mean training loss over the epoch's steps.
    pub train_loss: f64,
    /// Mean test loss.
    pub test_loss: f64,
    /// Test accuracy in `[0, 1]`.
    pub test_accuracy: f64,
    /// Training wall time of the epoch (evaluation excluded).
    pub train_seconds: f64,
    /// Training throughput.
    pub samples_per_second: f64,
    /// The learning rate of the epoch's last step.
    pub lr: f64,
}

/// Everything a run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TrainReport {
    /// The options.
    pub options: Option<TrainOptions>,
    /// The model's description.
    pub model: String,
    /// Per epoch (a resumed run includes the epochs before the checkpoint).
    pub epochs: Vec<EpochMetrics>,
    /// Every training step's loss, in order.
    pub step_losses: Vec<f64>,
    /// Final test accuracy per class `(name, accuracy, examples)`.
    pub per_class: Vec<(String, f64, usize)>,
    /// How each specialization compiled (training step, evaluation batches).
    #[serde(skip)]
    pub compile: Vec<CompileReport>,
    /// The first compile's stages, `(stage, seconds)`.
    pub compile_stages: Vec<(String, f64)>,
    /// Whole run's wall time in seconds (this process only).
    pub wall_seconds: f64,
    /// Specializations loaded from the cache in this process (all compiled functions).
    #[serde(default)]
    pub cache_hits: u64,
    /// Cache lookups that missed in this process.
    #[serde(default)]
    pub cache_misses: u64,
}

impl TrainReport {
    /// The last epoch's test accuracy.
    pub fn final_accuracy(&self) -> Option<f64> {
        self.epochs.last().map(|e| e.test_accuracy)
    }
}

/// A run's failure.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The library failed.
    #[error(transparent)]
    Aot(#[from] aotgrad::Error),
    /// The tensor layer failed.
    #[error(transparent)]
    Trace(#[from] aotgrad::trace::Error),
    /// Options or a checkpoint do not fit.
    #[error("{0}")]
    Invalid(String),
    /// Writing an output failed.
    #[error("{path}: {msg}")]
    Output {
        /// The file.
        path: PathBuf,
        /// What failed.
        msg: String,
    },
}

type Result<T> = std::result::Result<T, TrainError>;

/// The processes one run trains with: this process alone, or (with the `mpi`
/// feature, when started by `mpirun -np N`) N ranks training data-parallel: each
/// global batch split into one shard per rank, gradients averaged across the ranks
/// (`aotgrad::dist::DistributedDataParallel`), evaluation sharded and summed, and
/// rank 0 alone printing and writing files.
pub struct Fleet {
    #[cfg(feature = "mpi")]
    world: Option<std::rc::Rc<aotgrad::dist::World>>,
    /// ZeRO-1: shard AdamW's state across the ranks (`aotgrad::dist::ZeroAdamW`).
    pub zero: bool,
    /// Sum gradients in rank order (bit-identical ranks, run to run).
    pub deterministic: bool,
}

impl Fleet {
    /// This process alone.
    pub fn single() -> Fleet {
        Fleet {
            #[cfg(feature = "mpi")]
            world: None,
            zero: false,
            deterministic: false,
        }
    }

    /// The MPI job this process belongs to when an MPI launcher started it (with the
    /// `mpi` feature), else this process alone.
    pub fn from_env() -> Result<Fleet> {
        #[cfg(feature = "mpi")]
        if aotgrad::dist::launched() {
            let world = aotgrad::dist::World::init().map_err(|e| TrainError::Invalid(e.to_string()))?;
            return Ok(Fleet { world: Some(std::rc::Rc::new(world)), ..Fleet::single() });
        }
        // Started as one of several processes, but unable to join them: N copies of
        // the same run would write the same files.
        #[cfg(not(feature = "mpi"))]
        {
            let ranks = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
                .iter()
                .filter_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
                .max()
                .unwrap_or(1);
            if ranks > 1 {
                return Err(TrainError::Invalid(format!(
                    "started as one of {ranks} MPI processes, but this aotgrad was built without the `mpi` \
                     feature: build it with `cargo build --release -p aotgrad-cli --features mpi` (or run `cargo \
                     xtask train --np {ranks}`)"
                )));
            }
        }
        Ok(Fleet::single())
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.world {
            return w.rank();
        }
        0
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.world {
            return w.size();
        }
        1
    }

    /// Whether this process prints and writes files (rank 0).
    pub fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// End every process of the job after this one failed (reported by the caller),
    /// so none waits for it; a no-op in one process.
    pub fn abort_others(&self) {
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.world {
            if w.size() > 1 {
                w.abort(1);
            }
        }
    }

    /// Sum `values` over the ranks, in place (rank order on every rank).
    fn sum(&self, values: &mut [f64], step: u64) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.world {
            return w.sum_f64(values, step).map_err(dist_error);
        }
        let _ = (values, step);
        Ok(())
    }

    /// This rank's shard of a global batch.
    fn shard<'a>(&self, global: &'a [usize]) -> &'a [usize] {
        let b = global.len() / self.size();
        &global[self.rank() * b..(self.rank() + 1) * b]
    }
}

#[cfg(feature = "mpi")]
fn dist_error(e: aotgrad::dist::Error) -> TrainError {
    match e {
        aotgrad::dist::Error::Aot(e) => TrainError::Aot(e),
        other => TrainError::Invalid(other.to_string()),
    }
}

/// The compiled training step: this process's module, or the module replicated
/// across the ranks.
enum Trainer {
    Local(Box<AotModule>),
    #[cfg(feature = "mpi")]
    Ddp(Box<aotgrad::dist::DistributedDataParallel>),
}

impl Trainer {
    /// Across processes, after the first step: which ranks compiled the step and
    /// which loaded it from the cache.
    fn compile_sources(&self) -> Option<String> {
        match self {
            Trainer::Local(_) => None,
            #[cfg(feature = "mpi")]
            Trainer::Ddp(d) => {
                let src = d.compile_sources();
                let ranks = |loaded: bool| -> Vec<String> {
                    src.iter().enumerate().filter(|(_, &l)| l == loaded).map(|(r, _)| r.to_string()).collect()
                };
                let (compiled, loaded) = (ranks(false), ranks(true));
                Some(match (compiled.is_empty(), loaded.is_empty()) {
                    (_, true) => {
                        format!("fleet: every rank compiled the step ({} of them; no shared cache)", src.len())
                    }
                    (true, _) => "fleet: every rank loaded the step from the cache".to_string(),
                    _ => format!(
                        "fleet: rank(s) {} compiled the step, rank(s) {} loaded it from the cache",
                        compiled.join(", "),
                        loaded.join(", ")
                    ),
                })
            }
        }
    }

    fn module(&self) -> &AotModule {
        match self {
            Trainer::Local(m) => m,
            #[cfg(feature = "mpi")]
            Trainer::Ddp(d) => d.module(),
        }
    }

    /// Forward and backward of one (local) batch: the outputs and the gradients
    /// (averaged across the ranks, except for ZeRO, whose optimizer reduces them).
    fn step(&self, x: Tensor, y: Tensor, one: &Tensor) -> Result<(Vec<Tensor>, aotgrad::ModuleGrads)> {
        match self {
            Trainer::Local(m) => {
                let (outs, back) = m.forward(&[x, y])?;
                let grads = back.backward_with(&[Some(one.clone()), None], &[])?;
                Ok((outs, grads))
            }
            #[cfg(feature = "mpi")]
            Trainer::Ddp(d) => {
                let (outs, back) = d.forward(&[x, y]).map_err(dist_error)?;
                let grads = back.backward_with(&[Some(one.clone()), None], &[]).map_err(dist_error)?;
                Ok((outs, grads))
            }
        }
    }
}

/// AdamW, or AdamW with its state sharded across the ranks.
enum Opt {
    Adam(AdamW),
    #[cfg(feature = "mpi")]
    Zero(aotgrad::dist::ZeroAdamW),
}

impl Opt {
    fn get(&mut self) -> &mut dyn Optimizer {
        match self {
            Opt::Adam(a) => a,
            #[cfg(feature = "mpi")]
            Opt::Zero(z) => z,
        }
    }
    fn adamw(&self) -> &AdamW {
        match self {
            Opt::Adam(a) => a,
            #[cfg(feature = "mpi")]
            Opt::Zero(z) => z.inner(),
        }
    }
    /// Make [`Optimizer::state`] the whole state (ZeRO gathers it from every rank:
    /// every rank calls this before rank 0 writes a checkpoint).
    fn gather(&mut self) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let Opt::Zero(z) = self {
            z.gather().map_err(dist_error)?;
        }
        Ok(())
    }
}

/// splitmix64: the shuffles' generator.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The order of the training examples in `epoch` (0-based): a Fisher–Yates shuffle
/// seeded by the run's seed and the epoch.
pub fn epoch_order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut state = seed ^ (epoch as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// The normalized images `idx` of `split` as a `(len, rows·cols)` f32 tensor and
/// their labels as an i64 tensor.
pub fn batch(split: &Split, idx: &[usize]) -> Result<(Tensor, Tensor)> {
    let px = split.rows * split.cols;
    // The batch's memory comes from the recycling pool the previous step's batch went
    // back to (no page faults); the loop vectorizes.
    let mut x = match aotgrad::cpu::take_recycled(DType::F32, idx.len() * px) {
        aotgrad::cpu::Buffer::F32(v) => v,
        _ => vec![0.0; idx.len() * px],
    };
    for (row, &i) in x.chunks_exact_mut(px).zip(idx) {
        for (d, &p) in row.iter_mut().zip(&split.images[i * px..(i + 1) * px]) {
            *d = (p as f32 / 255.0 - MEAN) / STD;
        }
    }
    let y: Vec<i64> = idx.iter().map(|&i| split.labels[i] as i64).collect();
    Ok((Tensor::from_vec(x, &[idx.len(), px])?, Tensor::from_vec(y, &[idx.len()])?))
}

/// Per class: `(correct, total)`.
type ClassCounts = Vec<(usize, usize)>;

/// Test loss, accuracy and per-class counts through the compiled inference path; on
/// several ranks each evaluates its part of the test set and the sums are reduced.
fn evaluate(
    compiled: &AotModule,
    test: &Split,
    eval_batch: usize,
    fleet: &Fleet,
    step: u64,
) -> Result<(f64, f64, ClassCounts)> {
    let _no_grad = NoGradGuard::new();
    let mut per_class = vec![(0usize, 0usize); CLASSES.len()];
    let (mut loss_sum, mut correct) = (0.0, 0usize);
    let (n, ranks, rank) = (test.len(), fleet.size(), fleet.rank());
    let (base, extra) = (n / ranks, n % ranks);
    let start = rank * base + rank.min(extra);
    let all: Vec<usize> = (start..start + base + usize::from(rank < extra)).collect();
    for chunk in all.chunks(eval_batch.max(1)) {
        let (x, y) = batch(test, chunk)?;
        let outs = compiled.call(&[x, y])?;
        loss_sum += outs[0].item()? * chunk.len() as f64;
        let pred = outs[1].argmax(1, false)?.to_vec_i64()?;
        for (&i, &p) in chunk.iter().zip(&pred) {
            let label = test.labels[i] as usize;
            per_class[label].1 += 1;
            if p as usize == label {
                per_class[label].0 += 1;
                correct += 1;
            }
        }
    }
    if ranks > 1 {
        let mut sums = vec![loss_sum, correct as f64];
        sums.extend(per_class.iter().flat_map(|&(ok, total)| [ok as f64, total as f64]));
        fleet.sum(&mut sums, step)?;
        (loss_sum, correct) = (sums[0], sums[1] as usize);
        for (c, pair) in per_class.iter_mut().zip(sums[2..].chunks_exact(2)) {
            *c = (pair[0] as usize, pair[1] as usize);
        }
    }
    let n = n.max(1) as f64;
    Ok((loss_sum / n, correct as f64 / n, per_class))
}

fn fmt_stages(stages: &[(String, f64)]) -> String {
    stages.iter().map(|(s, t)| format!("{s} {:.1} ms", t * 1e3)).collect::<Vec<_>>().join(" · ")
}

/// Where the run writes its outputs.
pub struct Outputs {
    /// The directory (`metrics.json`, `curves.svg`, `checkpoint.safetensors`).
    pub dir: Option<PathBuf>,
    /// Show progress bars (on a terminal).
    pub progress: bool,
    /// Stop after this epoch (1-based) even if the run has more: the checkpoint then
    /// lets a later `--resume` continue it.
    pub stop_after: Option<usize>,
}

/// The checkpoint file under `dir`.
pub fn checkpoint_path(dir: &Path) -> PathBuf {
    dir.join("checkpoint.safetensors")
}

/// Train on `train`, evaluating on `test` after each epoch; `resume` continues from a
/// checkpoint written by an earlier run with the same options. Progress and results
/// are written to `log`. In this process alone: [`train_with`] trains across processes.
pub fn train(
    train: &Split,
    test: &Split,
    opts: &TrainOptions,
    resume: Option<&Path>,
    outputs: &Outputs,
    log: &mut dyn Write,
) -> Result<TrainReport> {
    train_with(train, test, opts, resume, outputs, log, &Fleet::single())
}

/// [`train`] on the processes of `fleet`: the same global batches, each rank on its
/// shard (`--batch-size` must divide by the number of processes); only rank 0 should
/// be given a visible `log` and write `outputs` (checkpoints are written by rank 0).
pub fn train_with(
    train: &Split,
    test: &Split,
    opts: &TrainOptions,
    resume: Option<&Path>,
    outputs: &Outputs,
    log: &mut dyn Write,
    fleet: &Fleet,
) -> Result<TrainReport> {
    let start = Instant::now();
    if opts.batch_size == 0 || opts.batch_size > train.len() {
        return Err(TrainError::Invalid(format!(
            "batch size {} does not fit {} training examples",
            opts.batch_size,
            train.len()
        )));
    }
    if !opts.batch_size.is_multiple_of(fleet.size()) {
        return Err(TrainError::Invalid(format!(
            "the batch of {} does not split evenly across {} processes: choose a --batch-size that is a multiple of {}",
            opts.batch_size,
            fleet.size(),
            fleet.size()
        )));
    }
    let model = Arc::new(opts.build_model()?);
    let steps_per_epoch = train.len() / opts.batch_size;
    let total_steps = (steps_per_epoch * opts.epochs) as u64;
    let schedule =
        WarmupCosine { peak_lr: opts.lr, final_lr: 0.0, warmup_steps: opts.warmup_steps.min(total_steps), total_steps };
    // The environment's key, size limit and Redis tier apply, as in any program
    // sharing the directory (a bad key setting is an error, not an unsigned cache).
    let cache = match &opts.cache {
        Some(d) => Some(Arc::new(
            Cache::disk_from_env(d).map_err(|e| TrainError::Invalid(format!("cache: {e}")))?.with_env_remote(),
        )),
        None => None,
    };
    let mut adamw = AdamW::with(opts.lr, (0.9, 0.999), 1e-8, opts.weight_decay)?.with_cache(cache.clone());
    let mut report =
        TrainReport { options: Some(opts.clone()), model: model.description.clone(), ..Default::default() };

    let say = |log: &mut dyn Write, line: String| {
        let _ = writeln!(log, "{line}");
    };
    say(log, format!("model: {}", model.description));
    let config = match opts.backend {
        BackendChoice::Cpu => AotConfig::default().threads(opts.threads),
        BackendChoice::Reference => AotConfig::default().reference_backend(),
        BackendChoice::Wgpu => wgpu_config()?,
    };
    let config = AotConfig { cache: cache.clone(), ..config };
    if opts.backend != BackendChoice::Reference {
        // The update runs where the gradients are: on the CPU with the step's thread
        // count (`--threads 1` is one thread throughout), on the device for wgpu
        // (parameters and moments stay there between steps).
        adamw = adamw.with_backend(config.backend.clone());
    }
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    } else {
        opts.threads
    };
    say(
        log,
        match opts.backend {
            BackendChoice::Cpu => format!(
                "backend: compiled CPU, {threads} thread(s) (the default; fused kernels from the aotgrad-fusion \
                 plan, gemm matmuls)"
            ),
            BackendChoice::Reference => "backend: reference interpreter (chosen with --backend reference)".into(),
            BackendChoice::Wgpu => wgpu_description(),
        },
    );
    say(
        log,
        format!(
            "optimizer: AdamW lr {} weight decay {}, {} warmup steps then cosine to 0 over {} steps; batch {}; seed {}",
            opts.lr,
            opts.weight_decay,
            schedule.warmup_steps,
            group(total_steps as usize),
            opts.batch_size,
            opts.seed
        ),
    );
    let compiled = aot_module(model.clone(), AotConfig { name: "train_step".into(), ..config })?;
    let (trainer, mut opt) = fleet_parts(fleet, compiled, adamw, model.store(), opts.batch_size, log)?;

    let mut first_epoch = 0;
    if let Some(path) = resume {
        let loaded = checkpoint::load(path, model.store(), Some(opt.get()))?;
        let saved: serde_json::Value =
            loaded.metadata.get("options").and_then(|s| serde_json::from_str(s).ok()).ok_or_else(|| {
                TrainError::Invalid(format!("{}: no training options in the checkpoint", path.display()))
            })?;
        if saved != opts.resume_key() {
            return Err(TrainError::Invalid(format!(
                "{}: the checkpoint was written with other options ({saved}); this run has {}",
                path.display(),
                opts.resume_key()
            )));
        }
        let prior: TrainReport = loaded
            .metadata
            .get("report")
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| TrainError::Invalid(format!("{}: no metrics in the checkpoint", path.display())))?;
        first_epoch = prior.epochs.len();
        report.epochs = prior.epochs;
        report.step_losses = prior.step_losses;
        say(log, format!("resumed from {} after epoch {first_epoch}", path.display()));
    }
    say(
        log,
        match &cache {
            Some(c) => format!("cache: {}", c.describe()),
            None => "cache: off (--no-cache): every run compiles afresh".to_string(),
        },
    );

    let one = Tensor::ones(&[], DType::F32)?;
    let last_epoch = outputs.stop_after.map_or(opts.epochs, |s| s.min(opts.epochs));
    for epoch in first_epoch..last_epoch {
        let order = epoch_order(train.len(), opts.seed, epoch);
        let bar = if outputs.progress {
            ProgressBar::new(steps_per_epoch as u64)
        } else {
            ProgressBar::with_draw_target(Some(steps_per_epoch as u64), ProgressDrawTarget::hidden())
        };
        bar.set_style(
            ProgressStyle::with_template("epoch {prefix:>2} [{bar:32}] {pos}/{len} {msg}")
                .map_err(|e| TrainError::Invalid(e.to_string()))?
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{}", epoch + 1));
        let t0 = Instant::now();
        let mut loss_sum = 0.0;
        let mut lr = opts.lr;
        let mut losses = Vec::with_capacity(steps_per_epoch);
        for s in 0..steps_per_epoch {
            let step = (epoch * steps_per_epoch + s) as u64;
            lr = schedule.lr_at(step);
            opt.get().set_lr(lr);
            let one_step = |opt: &mut Opt| -> Result<f64> {
                let (x, y) = batch(train, fleet.shard(&order[s * opts.batch_size..(s + 1) * opts.batch_size]))?;
                let (outs, grads) = trainer.step(x, y, &one)?;
                opt.get().step(model.store(), &grads.params)?;
                Ok(outs[0].item()?)
            };
            // Across processes an error names its step (the others stop at it too).
            let loss = one_step(&mut opt).map_err(|e| match e {
                e if fleet.size() == 1 => e,
                e => TrainError::Invalid(format!("step {step}: {e}")),
            })?;
            if !loss.is_finite() {
                return Err(TrainError::Invalid(format!("the loss became {loss} at step {step} (lr {lr})")));
            }
            if report.compile_stages.is_empty() {
                if let Some(r) = trainer.module().function().compile_reports().first() {
                    report.compile_stages = r.stages.iter().map(|(s, t)| (s.to_string(), *t)).collect();
                    let line = match r.source {
                        EntrySource::Compiled => format!(
                            "compiled the training step in {:.1} ms: {}",
                            r.total_seconds() * 1e3,
                            fmt_stages(&r.stages)
                        ),
                        _ => format!(
                            "loaded the training step from the cache in {:.2} ms (its compile took {:.1} ms)",
                            trainer.module().function().cache_stats().load_seconds * 1e3,
                            r.total_seconds() * 1e3
                        ),
                    };
                    bar.suspend(|| say(log, line));
                    if let Some(line) = trainer.compile_sources() {
                        bar.suspend(|| say(log, line));
                    }
                }
            }
            losses.push(loss);
            loss_sum += loss;
            let done = (s + 1) * opts.batch_size;
            bar.set_message(format!(
                "loss {:.4} · {:.0} samples/s",
                loss_sum / (s + 1) as f64,
                done as f64 / t0.elapsed().as_secs_f64()
            ));
            bar.inc(1);
        }
        bar.finish_and_clear();
        let train_seconds = t0.elapsed().as_secs_f64();
        // Every rank's mean loss of each step (one reduction per epoch).
        if fleet.size() > 1 {
            fleet.sum(&mut losses, (epoch * steps_per_epoch) as u64)?;
            for l in &mut losses {
                *l /= fleet.size() as f64;
            }
            loss_sum = losses.iter().sum();
        }
        report.step_losses.extend(&losses);
        let end = ((epoch + 1) * steps_per_epoch) as u64;
        let (test_loss, test_accuracy, per_class) = evaluate(trainer.module(), test, opts.eval_batch, fleet, end)?;
        let m = EpochMetrics {
            epoch: epoch + 1,
            train_loss: loss_sum / steps_per_epoch as f64,
            test_loss,
            test_accuracy,
            train_seconds,
            samples_per_second: (steps_per_epoch * opts.batch_size) as f64 / train_seconds,
            lr,
        };
        say(
            log,
            format!(
                "epoch {:>2}/{}: train loss {:.4} · test loss {:.4} · test accuracy {:.2}% · {:.1} s, {} samples/s",
                m.epoch,
                opts.epochs,
                m.train_loss,
                m.test_loss,
                100.0 * m.test_accuracy,
                m.train_seconds,
                group(m.samples_per_second as usize)
            ),
        );
        report.epochs.push(m);
        report.per_class = per_class
            .iter()
            .enumerate()
            .map(|(c, &(ok, n))| (CLASSES[c].to_string(), if n == 0 { 0.0 } else { ok as f64 / n as f64 }, n))
            .collect();
        if let Some(dir) = &outputs.dir {
            opt.gather()?;
            if fleet.is_root() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| TrainError::Output { path: dir.clone(), msg: e.to_string() })?;
                let meta = vec![
                    ("options".to_string(), opts.resume_key().to_string()),
                    ("report".to_string(), serde_json::to_string(&report).expect("plain data")),
                ];
                checkpoint::save(&checkpoint_path(dir), model.store(), Some(&*opt.get()), &meta)?;
            }
        }
    }
    report.compile = trainer.module().function().compile_reports();
    if cache.is_some() {
        let mut fns = vec![("training step and evaluation", trainer.module().function())];
        if let Some(u) = opt.adamw().update_function() {
            fns.push(("AdamW update", u));
        }
        let parts: Vec<String> = fns
            .iter()
            .map(|(what, f)| {
                let s = f.cache_stats();
                let loaded = f.compile_reports().iter().filter(|r| r.source != EntrySource::Compiled).count();
                format!(
                    "{what}: {loaded} of {} specialization(s) loaded ({} hit(s), {} miss(es), {} guard miss(es), {} \
                     rejected)",
                    f.num_compiled(),
                    s.hits,
                    s.misses,
                    s.guard_misses,
                    s.rejected
                )
            })
            .collect();
        let all_hit = fns.iter().all(|(_, f)| f.cache_stats().hits as usize == f.num_compiled());
        say(
            log,
            format!(
                "cache: {}{}",
                parts.join("; "),
                if all_hit { " — every specialization came from the cache" } else { "" }
            ),
        );
        report.cache_hits = fns.iter().map(|(_, f)| f.cache_stats().hits).sum();
        report.cache_misses = fns.iter().map(|(_, f)| f.cache_stats().misses + f.cache_stats().guard_misses).sum();
    }
    report.wall_seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// The training step and the optimizer for `fleet`: the module and AdamW as they are
/// in one process; across processes, the module wrapped for data-parallel training
/// (rank 0's parameters broadcast) and AdamW, or its ZeRO-1 sharding.
fn fleet_parts(
    fleet: &Fleet,
    compiled: AotModule,
    adamw: AdamW,
    store: &aotgrad::nn::ParamStore,
    batch: usize,
    log: &mut dyn Write,
) -> Result<(Trainer, Opt)> {
    if fleet.zero && fleet.deterministic {
        return Err(TrainError::Invalid(
            "--deterministic is for DDP's gradient allreduce; with --zero every rank holds bit-identical parameters \
             already (each value comes from one rank's update): choose one"
                .into(),
        ));
    }
    #[cfg(feature = "mpi")]
    if let Some(world) = &fleet.world {
        use aotgrad::dist::{DdpConfig, DistributedDataParallel, ZeroAdamW};
        let config =
            DdpConfig { deterministic: fleet.deterministic, average_gradients: !fleet.zero, ..DdpConfig::default() };
        let ddp = DistributedDataParallel::new(world.clone(), compiled, config).map_err(dist_error)?;
        let opt = if fleet.zero {
            Opt::Zero(ZeroAdamW::new(world.clone(), store, adamw).map_err(dist_error)?)
        } else {
            Opt::Adam(adamw)
        };
        let sync = match &opt {
            Opt::Zero(z) => format!(
                "ZeRO-1: gradients reduce-scattered, AdamW's state sharded ({} of {} parameter elements per rank)",
                group(z.shard_len()),
                group(store.num_param_elements())
            ),
            Opt::Adam(_) => format!(
                "gradients averaged in {} bucket(s) (the first up to {} KiB, the others {} MiB), each sent while \
                 the backward goes on{}",
                ddp.plan().buckets.len(),
                ddp.config().first_bucket_bytes >> 10,
                ddp.config().bucket_bytes >> 20,
                if fleet.deterministic { ", summed in rank order (deterministic)" } else { "" }
            ),
        };
        let _ = writeln!(
            log,
            "processes: {} (data-parallel over MPI), local batch {} of {}; {sync}",
            world.size(),
            batch / world.size(),
            batch
        );
        return Ok((Trainer::Ddp(Box::new(ddp)), opt));
    }
    if fleet.zero || fleet.deterministic {
        return Err(TrainError::Invalid(
            "--zero and --deterministic are for training on several processes: start it with `mpirun -np N aotgrad \
             train ...` (a build with the `mpi` feature)"
                .into(),
        ));
    }
    let _ = (store, batch, log);
    Ok((Trainer::Local(Box::new(compiled)), Opt::Adam(adamw)))
}

/// The final per-class table.
pub fn per_class_table(report: &TrainReport) -> String {
    let mut s = String::from("class         accuracy  examples\n");
    for (name, acc, n) in &report.per_class {
        s.push_str(&format!("{name:<13} {:>7.2}%  {n:>8}\n", 100.0 * acc));
    }
    s
}

/// Write `metrics.json` and `curves.svg` under `dir`.
pub fn write_outputs(dir: &Path, report: &TrainReport) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| TrainError::Output { path: dir.to_path_buf(), msg: e.to_string() })?;
    let json = dir.join("metrics.json");
    let text = serde_json::to_string_pretty(report).expect("plain data");
    std::fs::write(&json, text).map_err(|e| TrainError::Output { path: json.clone(), msg: e.to_string() })?;
    let svg = dir.join("curves.svg");
    crate::plot::curves(&svg, report).map_err(|msg| TrainError::Output { path: svg, msg })
}
