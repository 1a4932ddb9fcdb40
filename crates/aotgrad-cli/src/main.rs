//! `aotgrad`: train Fashion-MNIST through the compiler (`aotgrad train`), explain
//! every compile stage of a program (`aotgrad explain`), look into the compiled-result
//! cache (`aotgrad cache`), import a PyTorch `torch.export` archive (`aotgrad import`).

use aotgrad_cli::data;
use aotgrad_cli::explain::Explanation;
use aotgrad_cli::models::{group, ModelKind};
use aotgrad_cli::train::{self, BackendChoice, Outputs, TrainOptions};
use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "aotgrad", version, about = "aotgrad: an ahead-of-time autograd compiler for Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train an image classifier on Fashion-MNIST through aot_module (compiled training
    /// step, compiled evaluation), with AdamW and a warmup + cosine schedule.
    Train(Box<TrainArgs>),
    /// Print every stage of compiling PROGRAM (a graph in the IR text format, see
    /// examples/): traced, functional and joint graphs, view/mutation metadata,
    /// forward/backward partition with saved values, and the kernel plan.
    Explain(ExplainArgs),
    /// Look into the compiled-result cache: `stats`, `list`, `inspect KEY`, `clear`.
    Cache(CacheArgs),
    /// Import a PyTorch `torch.export` archive (MODEL.pt2, written by
    /// `torch.export.save`): print its signature and op histogram, then every stage
    /// of compiling its training step (as `explain` does).
    Import(ImportArgs),
}

#[derive(Args)]
struct ImportArgs {
    /// The archive.
    model: PathBuf,
    /// Print the signature and op histogram only (no compile).
    #[arg(long)]
    no_explain: bool,
    /// Explain the inference call instead of the training step.
    #[arg(long)]
    inference: bool,
    #[command(flatten)]
    show: ShowArgs,
}

/// How `explain` and `import` print what they found.
#[derive(Args)]
struct ShowArgs {
    /// Write Graphviz files here (joint.dot with the partition cut, forward.dot, backward.dot).
    #[arg(long)]
    dot: Option<PathBuf>,
    /// Print the same as JSON.
    #[arg(long)]
    json: bool,
    /// Also print each compile stage's time.
    #[arg(long)]
    timings: bool,
}

fn run_import(a: ImportArgs) -> Result<(), String> {
    let report = aotgrad_cli::import::import_file(&a.model, !a.no_explain, a.inference)?;
    a.show.print(&report, report.text(), report.explanation.as_ref())
}

impl ShowArgs {
    /// Print `value` as JSON, or `text` (with each compile stage's time when asked),
    /// and write the explanation's Graphviz files into `--dot`.
    fn print(&self, value: &impl serde::Serialize, text: String, ex: Option<&Explanation>) -> Result<(), String> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value).map_err(|e| e.to_string())?);
        } else {
            print!("{text}");
            if let (true, Some(ex)) = (self.timings, ex) {
                print!("{}", ex.stages_text());
            }
        }
        if let (Some(dir), Some(ex)) = (&self.dot, ex) {
            ex.write_dots(dir)?;
            let names: Vec<&str> = ex.dots.iter().map(|(n, _)| n.as_str()).collect();
            eprintln!("wrote {} in {}", names.join(", "), dir.display());
        }
        Ok(())
    }
}

#[derive(Args)]
struct CacheArgs {
    #[command(subcommand)]
    action: CacheAction,
    /// The cache directory (default: $AOTGRAD_CACHE_DIR, else $XDG_CACHE_HOME/aotgrad,
    /// else ~/.cache/aotgrad).
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum CacheAction {
    /// Entries, artifacts and bytes held.
    Stats,
    /// Every entry: key, function, path (training or inference), backend, guards, size.
    List,
    /// One key's ingredients and entries as JSON (KEY: the key or a unique prefix).
    Inspect {
        /// The key (hex) or a unique prefix of it.
        key: String,
    },
    /// Remove every entry and artifact.
    Clear,
}

fn run_cache(a: CacheArgs) -> Result<(), String> {
    let dir = a.dir.unwrap_or_else(aotgrad::cache::DiskStore::default_dir);
    print!("{}", aotgrad_cli::cache::run(&dir, &a.action.into_cli())?);
    Ok(())
}

impl CacheAction {
    fn into_cli(self) -> aotgrad_cli::cache::Action {
        use aotgrad_cli::cache::Action;
        match self {
            CacheAction::Stats => Action::Stats,
            CacheAction::List => Action::List,
            CacheAction::Inspect { key } => Action::Inspect(key),
            CacheAction::Clear => Action::Clear,
        }
    }
}

#[derive(Args)]
struct ExplainArgs {
    /// The program file.
    program: PathBuf,
    #[command(flatten)]
    show: ShowArgs,
}

fn run_explain(a: ExplainArgs) -> Result<(), String> {
    let ex = aotgrad_cli::explain::explain_file(&a.program, None)?;
    a.show.print(&ex, ex.text(), Some(&ex))
}

#[derive(Args)]
struct TrainArgs {
    /// The model: `mlp` (784-256-128-10, GELU), `vit` (2-block vision transformer) or
    /// `cnn` (two 3×3 convolutions with ReLU and max pooling, a linear head).
    #[arg(long, value_enum, default_value = "mlp")]
    model: ModelKind,
    /// Train a classifier exported from PyTorch instead (a `torch.export.save`
    /// archive taking a dynamic batch of 784-pixel images and returning 10 logits per
    /// image; see `aotgrad import`). `--model` then only picks the defaults of
    /// --epochs and --lr.
    #[arg(long)]
    model_file: Option<PathBuf>,
    /// Directory with the four IDX files (else $AOTGRAD_DATA, else the
    /// dataset-fashion-mnist package's /usr/share/datasets/fashion-mnist).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Epochs (default: 10 for mlp, 12 for vit, 5 for cnn).
    #[arg(long)]
    epochs: Option<usize>,
    /// Mini-batch size.
    #[arg(long, default_value_t = 128)]
    batch_size: usize,
    /// Peak learning rate (default: 2e-3 for mlp and cnn, 3e-3 for vit).
    #[arg(long)]
    lr: Option<f64>,
    /// AdamW weight decay.
    #[arg(long)]
    weight_decay: Option<f64>,
    /// Linear warmup steps before the cosine decay.
    #[arg(long, default_value_t = 200)]
    warmup_steps: u64,
    /// Seed of the initialization and the shuffles.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Train on the first N training examples only.
    #[arg(long)]
    train_limit: Option<usize>,
    /// Evaluate on the first N test examples only.
    #[arg(long)]
    test_limit: Option<usize>,
    /// Threads of the compiled CPU backend (0: every core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The backend compiling the graphs.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendChoice,
    /// Write metrics.json, curves.svg and checkpoint.safetensors (after every epoch) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from a checkpoint (default: OUT/checkpoint.safetensors).
    #[arg(long, num_args = 0..=1)]
    resume: Option<Option<PathBuf>>,
    /// Stop after this epoch (the checkpoint in --out lets --resume continue the run).
    #[arg(long)]
    stop_after: Option<usize>,
    /// Exit with an error unless the final test accuracy reaches this fraction.
    #[arg(long)]
    min_accuracy: Option<f64>,
    /// Never draw progress bars.
    #[arg(long)]
    no_progress: bool,
    /// The compiled-result cache directory (default: $AOTGRAD_CACHE_DIR, else
    /// ~/.cache/aotgrad; none when AOTGRAD_CACHE=0): a rerun loads the compiled step
    /// instead of compiling it. Entries are signed and checked with AOTGRAD_CACHE_KEY
    /// (or AOTGRAD_CACHE_KEY_FILE) when set, and AOTGRAD_REDIS_URL adds a shared tier.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Compile everything afresh; read and write no cache.
    #[arg(long, conflicts_with = "cache_dir")]
    no_cache: bool,
    /// Exit with an error unless every specialization was loaded from the cache (a
    /// rerun's check that nothing compiled).
    #[arg(long, conflicts_with = "no_cache")]
    require_cache_hits: bool,
    /// With several processes (`mpirun -np N aotgrad train`, a build with the `mpi`
    /// feature): shard AdamW's state across them (ZeRO stage 1).
    #[arg(long)]
    zero: bool,
    /// With several processes: sum gradients in rank order, so every rank holds
    /// bit-identical parameters and a rerun repeats the run bit for bit.
    #[arg(long)]
    deterministic: bool,
}

fn run_train(a: TrainArgs, fleet: &mut train::Fleet) -> Result<(), String> {
    fleet.zero = a.zero;
    fleet.deterministic = a.deterministic;
    // Rank 0 alone prints and writes files; the others train in silence.
    let root = fleet.is_root();
    macro_rules! say {
        ($($t:tt)*) => { if root { println!($($t)*); } };
    }
    let mut opts = TrainOptions::defaults(a.model);
    opts.model_file = a.model_file.clone();
    opts.batch_size = a.batch_size;
    opts.warmup_steps = a.warmup_steps;
    opts.seed = a.seed;
    opts.train_limit = a.train_limit;
    opts.test_limit = a.test_limit;
    opts.threads = a.threads;
    opts.backend = a.backend;
    // `AOTGRAD_CACHE=0` turns the default cache off, as it does for the library.
    let env_off = std::env::var("AOTGRAD_CACHE").is_ok_and(|v| v == "0");
    opts.cache = match a.cache_dir {
        _ if a.no_cache => None,
        Some(d) => Some(d),
        None if env_off => None,
        None => Some(aotgrad::cache::DiskStore::default_dir()),
    };
    if let Some(e) = a.epochs {
        opts.epochs = e;
    }
    if let Some(lr) = a.lr {
        opts.lr = lr;
    }
    if let Some(wd) = a.weight_decay {
        opts.weight_decay = wd;
    }
    let resume = match a.resume {
        None => None,
        Some(Some(p)) => Some(p),
        Some(None) => match &a.out {
            Some(dir) => Some(train::checkpoint_path(dir)),
            None => return Err("--resume without a path needs --out DIR (it reads DIR/checkpoint.safetensors)".into()),
        },
    };
    let t = Instant::now();
    let dir = data::find_dir(a.data.as_deref()).map_err(|e| e.to_string())?;
    let ds = data::load(&dir).map_err(|e| e.to_string())?;
    let train_split = match opts.train_limit {
        Some(n) => ds.train.truncated(n),
        None => ds.train,
    };
    let test_split = match opts.test_limit {
        Some(n) => ds.test.truncated(n),
        None => ds.test,
    };
    say!(
        "aotgrad train: Fashion-MNIST from {} ({} train / {} test images, read in {:.2} s)",
        dir.display(),
        group(train_split.len()),
        group(test_split.len()),
        t.elapsed().as_secs_f64()
    );
    let outputs = Outputs {
        dir: a.out.clone(),
        progress: root && !a.no_progress && std::io::stderr().is_terminal(),
        stop_after: a.stop_after,
    };
    let mut log: Box<dyn std::io::Write> = if root { Box::new(std::io::stdout()) } else { Box::new(std::io::sink()) };
    let report = train::train_with(&train_split, &test_split, &opts, resume.as_deref(), &outputs, &mut log, fleet)
        .map_err(|e| e.to_string())?;
    if root {
        print!("{}", train::per_class_table(&report));
    }
    let acc = report.final_accuracy().unwrap_or(0.0);
    let loaded = report.compile.iter().filter(|r| r.source != aotgrad::EntrySource::Compiled).count();
    say!(
        "done: test accuracy {:.2}% after {} epochs; {} specialization(s) of the step, {} compiled and {} loaded from \
         the cache; {:.1} s in all",
        100.0 * acc,
        report.epochs.len(),
        report.compile.len(),
        report.compile.len() - loaded,
        loaded,
        report.wall_seconds
    );
    if let (Some(dir), true) = (&a.out, root) {
        train::write_outputs(dir, &report).map_err(|e| e.to_string())?;
        println!(
            "wrote {}, {} and {}",
            dir.join("metrics.json").display(),
            dir.join("curves.svg").display(),
            train::checkpoint_path(dir).display()
        );
    }
    if a.require_cache_hits && (report.cache_misses > 0 || loaded < report.compile.len()) {
        return Err(format!(
            "--require-cache-hits: {} cache miss(es); {} of {} specialization(s) of the step were loaded",
            report.cache_misses,
            loaded,
            report.compile.len()
        ));
    }
    if let Some(min) = a.min_accuracy {
        if acc < min {
            return Err(format!("test accuracy {:.2}% is below --min-accuracy {:.2}%", 100.0 * acc, 100.0 * min));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    aotgrad::init_logging();
    let cli = Cli::parse();
    let mut fleet = train::Fleet::single();
    let result = match cli.command {
        Command::Train(a) => match train::Fleet::from_env() {
            Ok(f) => {
                fleet = f;
                run_train(*a, &mut fleet)
            }
            Err(e) => Err(e.to_string()),
        },
        Command::Explain(a) => run_explain(a),
        Command::Cache(a) => run_cache(a),
        Command::Import(a) => run_import(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if fleet.size() > 1 => {
            // Name the rank, then end the job: the other ranks would wait for this one.
            eprintln!("error: rank {}: {e}", fleet.rank());
            fleet.abort_others();
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
