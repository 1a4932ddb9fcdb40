//! The training loop on a small synthetic image set: it learns, it is deterministic,
//! a resumed run continues the uninterrupted run's loss curve exactly, a checkpoint
//! from other options is refused, and both models compile and agree with eager.

use aotgrad::prelude::*;
use aotgrad_cli::data::Split;
use aotgrad_cli::models::{Classifier, ModelKind, VitConfig};
use aotgrad_cli::train::{self, checkpoint_path, Outputs, TrainOptions};
use std::path::PathBuf;

/// `n` 28×28 images: class `c` lights rows `2c..2c+3` on a noisy background.
fn synthetic(n: usize, seed: u64) -> Split {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    let mut images = Vec::with_capacity(n * 784);
    let mut labels = Vec::with_capacity(n);
    for i in 0..n {
        let c = i % 10;
        labels.push(c as u8);
        for r in 0..28 {
            for _ in 0..28 {
                let lit = r >= 2 * c && r < 2 * c + 3;
                images.push(if lit { 200 + (next() % 56) as u8 } else { (next() % 90) as u8 });
            }
        }
    }
    Split { images, labels, rows: 28, cols: 28 }
}

fn opts(model: ModelKind, epochs: usize) -> TrainOptions {
    TrainOptions {
        epochs,
        batch_size: 32,
        warmup_steps: 4,
        threads: 1,
        eval_batch: 64,
        ..TrainOptions::defaults(model)
    }
}

fn quiet(dir: Option<PathBuf>, stop_after: Option<usize>) -> Outputs {
    Outputs { dir, progress: false, stop_after }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("aotgrad-train-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn the_mlp_learns_and_reports() {
    let (tr, te) = (synthetic(320, 1), synthetic(100, 2));
    let mut log = Vec::new();
    let out = tmp("learns");
    let report =
        train::train(&tr, &te, &opts(ModelKind::Mlp, 3), None, &quiet(Some(out.clone()), None), &mut log).unwrap();
    let log = String::from_utf8(log).unwrap();
    assert!(log.contains("backend: compiled CPU, 1 thread(s)"), "{log}");
    assert!(log.contains("compiled the training step in"), "{log}");
    assert_eq!(report.epochs.len(), 3);
    assert_eq!(report.step_losses.len(), 3 * 10);
    let acc = report.final_accuracy().unwrap();
    assert!(acc > 0.9, "accuracy {acc} on an easy task; log:\n{log}");
    assert!(report.epochs[2].train_loss < 0.5 * report.epochs[0].train_loss, "{:?}", report.epochs);
    // Training step + one evaluation batch size (64) + the last partial batch (36).
    assert_eq!(report.compile.len(), 3);
    assert!(report.compile[0].training && !report.compile[1].training);
    assert_eq!(report.per_class.iter().map(|c| c.2).sum::<usize>(), 100);
    let table = train::per_class_table(&report);
    assert!(table.starts_with("class") && table.contains("Ankle boot"), "{table}");
    train::write_outputs(&out, &report).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("metrics.json")).unwrap()).unwrap();
    assert_eq!(json["epochs"].as_array().unwrap().len(), 3);
    let svg = std::fs::read_to_string(out.join("curves.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("test accuracy"), "{}", &svg[..200.min(svg.len())]);
    assert!(checkpoint_path(&out).is_file());
}

#[test]
fn resume_continues_the_same_loss_curve() {
    let (tr, te) = (synthetic(192, 3), synthetic(40, 4));
    let o = opts(ModelKind::Mlp, 3);
    let whole = train::train(&tr, &te, &o, None, &quiet(None, None), &mut Vec::new()).unwrap();
    // Again from scratch: deterministic.
    let again = train::train(&tr, &te, &o, None, &quiet(None, None), &mut Vec::new()).unwrap();
    assert_eq!(whole.step_losses, again.step_losses);

    let dir = tmp("resume");
    let first = train::train(&tr, &te, &o, None, &quiet(Some(dir.clone()), Some(1)), &mut Vec::new()).unwrap();
    assert_eq!(first.epochs.len(), 1);
    let mut log = Vec::new();
    let rest =
        train::train(&tr, &te, &o, Some(&checkpoint_path(&dir)), &quiet(Some(dir.clone()), None), &mut log).unwrap();
    assert!(String::from_utf8(log).unwrap().contains("resumed from"), "says so");
    assert_eq!(rest.step_losses, whole.step_losses, "the resumed run continues the uninterrupted curve exactly");
    let accs = |r: &train::TrainReport| r.epochs.iter().map(|e| (e.train_loss, e.test_accuracy)).collect::<Vec<_>>();
    assert_eq!(accs(&rest), accs(&whole));

    // A checkpoint of other options is refused.
    let other = TrainOptions { seed: 9, ..o };
    let e = train::train(&tr, &te, &other, Some(&checkpoint_path(&dir)), &quiet(None, None), &mut Vec::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("written with other options"), "{e}");
}

#[test]
fn the_vit_compiles_agrees_with_eager_and_trains() {
    let cfg = VitConfig { patch: 7, d_model: 16, heads: 2, blocks: 1 };
    let model = Classifier::vit(cfg, 5).unwrap();
    let split = synthetic(8, 6);
    let (x, y) = train::batch(&split, &(0..8).collect::<Vec<_>>()).unwrap();
    let eager = model.forward_eager(&[x.clone(), y.clone()]).unwrap();
    let compiled = aot_module(std::sync::Arc::new(model), AotConfig::default().threads(1)).unwrap();
    let outs = no_grad(|| compiled.call(&[x, y])).unwrap();
    for (e, c) in eager.iter().zip(&outs) {
        let (e, c) = (e.to_vec_f64().unwrap(), c.to_vec_f64().unwrap());
        for (a, b) in e.iter().zip(&c) {
            assert!((a - b).abs() < 1e-4 * (1.0 + a.abs()), "eager {a} vs compiled {b}");
        }
    }
    assert!(Classifier::vit(VitConfig { patch: 5, ..cfg }, 0).unwrap_err().to_string().contains("does not divide"));

    let (tr, te) = (synthetic(160, 7), synthetic(40, 8));
    let report = train::train(&tr, &te, &opts(ModelKind::Vit, 2), None, &quiet(None, None), &mut Vec::new()).unwrap();
    assert!(report.step_losses.iter().all(|l| l.is_finite()));
    assert!(report.epochs[1].train_loss < report.epochs[0].train_loss, "{:?}", report.epochs);
}

/// A rerun with the same cache loads every specialization (training step, evaluation,
/// AdamW update), compiles nothing, and trains exactly the same; `aotgrad cache`
/// sees the entries and clears them.
#[test]
fn a_rerun_hits_the_cache_for_every_specialization() {
    let (tr, te) = (synthetic(256, 1), synthetic(64, 2));
    let dir = tmp("cache-rerun");
    let o = TrainOptions { cache: Some(dir.clone()), ..opts(ModelKind::Mlp, 1) };
    let first = train::train(&tr, &te, &o, None, &quiet(None, None), &mut Vec::new()).unwrap();
    assert_eq!((first.cache_hits, first.cache_misses), (0, 3));
    let mut log = Vec::new();
    let second = train::train(&tr, &te, &o, None, &quiet(None, None), &mut log).unwrap();
    assert_eq!((second.cache_hits, second.cache_misses), (3, 0));
    assert_eq!(second.step_losses, first.step_losses);
    assert_eq!(second.epochs[0].test_accuracy, first.epochs[0].test_accuracy);
    let log = String::from_utf8(log).unwrap();
    assert!(log.contains("loaded the training step from the cache"), "{log}");
    assert!(log.contains("every specialization came from the cache"), "{log}");
    assert!(second.compile.iter().all(|r| r.source == aotgrad::EntrySource::Cache));

    use aotgrad_cli::cache::{run, Action};
    let stats = run(&dir, &Action::Stats).unwrap();
    assert!(stats.contains("3 key(s), 3 entries"), "{stats}");
    let list = run(&dir, &Action::List).unwrap();
    assert_eq!(list.lines().filter(|l| l.contains("train_step")).count(), 2, "{list}");
    assert_eq!(list.lines().filter(|l| l.contains("adamw_update")).count(), 1, "{list}");
    let key = list.lines().nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    let json: serde_json::Value = serde_json::from_str(&run(&dir, &Action::Inspect(key.clone())).unwrap()).unwrap();
    assert!(json["key"].as_str().unwrap().starts_with(&key));
    assert!(json["ingredients"]["graph"].is_string(), "{json}");
    assert_eq!(json["entries"].as_array().unwrap().len(), 1);
    // The stored graphs are shown printed, by name: a training entry (the step) has all
    // five, an inference one (evaluation, the optimizer update) the first two.
    let mut paths = Vec::new();
    for line in list.lines().skip(1) {
        let training = line.contains(" training ");
        let names: &[&str] = if training {
            &["traced", "functional", "joint", "forward", "backward"]
        } else {
            &["traced", "functional"]
        };
        let key = line.split_whitespace().next().unwrap();
        let json: serde_json::Value = serde_json::from_str(&run(&dir, &Action::Inspect(key.into())).unwrap()).unwrap();
        let graphs = &json["entries"][0]["result"]["graphs"];
        assert_eq!(graphs.as_object().unwrap().len(), names.len(), "{graphs}");
        for name in names {
            let text = graphs[name].as_str().unwrap_or_else(|| panic!("no {name} graph in {graphs}"));
            assert!(text.parse::<aotgrad::ir::Graph>().is_ok(), "{name}: {text}");
        }
        paths.push(training);
    }
    assert_eq!((paths.iter().filter(|t| **t).count(), paths.len()), (1, 3), "{list}");
    assert!(run(&dir, &Action::Inspect("zz".into())).unwrap_err().contains("no cache key"));
    // An entry whose file name is not ASCII is listed, not a panic.
    let key_dir = std::fs::read_dir(dir.join("v1/entries")).unwrap().next().unwrap().unwrap().path();
    let entry = std::fs::read_dir(&key_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "entry"))
        .unwrap();
    std::fs::rename(&entry, key_dir.join("aéééééééé.entry")).unwrap();
    let list = run(&dir, &Action::List).unwrap();
    assert!(list.contains("aééééééé "), "{list}");
    assert!(run(&dir, &Action::Clear).unwrap().starts_with("removed"));
    assert!(run(&dir, &Action::Stats).unwrap().contains("0 key(s)"));
    // Without a cache: nothing is read or counted.
    let off = train::train(&tr, &te, &opts(ModelKind::Mlp, 1), None, &quiet(None, None), &mut Vec::new()).unwrap();
    assert_eq!((off.cache_hits, off.cache_misses), (0, 0));
    assert_eq!(off.step_losses, first.step_losses);
}

/// Loss and logits of 8 synthetic images: compiled inference against eager.
fn compiled_agrees_with_eager(what: &str, model: Classifier) {
    let split = synthetic(8, 6);
    let (x, y) = train::batch(&split, &(0..8).collect::<Vec<_>>()).unwrap();
    let eager = model.forward_eager(&[x.clone(), y.clone()]).unwrap();
    let compiled = aot_module(std::sync::Arc::new(model), AotConfig::default().threads(1)).unwrap();
    let outs = no_grad(|| compiled.call(&[x, y])).unwrap();
    for (e, c) in eager.iter().zip(&outs) {
        let (e, c) = (e.to_vec_f64().unwrap(), c.to_vec_f64().unwrap());
        for (a, b) in e.iter().zip(&c) {
            assert!((a - b).abs() < 1e-4 * (1.0 + a.abs()), "{what}: eager {a} vs compiled {b}");
        }
    }
}

#[test]
fn the_cnn_compiles_agrees_with_eager_and_trains() {
    let model = Classifier::cnn(5).unwrap();
    assert!(model.description.starts_with("CNN"), "{}", model.description);
    compiled_agrees_with_eager("the CNN", model);
    let (tr, te) = (synthetic(160, 7), synthetic(40, 8));
    let report = train::train(&tr, &te, &opts(ModelKind::Cnn, 2), None, &quiet(None, None), &mut Vec::new()).unwrap();
    assert!(report.step_losses.iter().all(|l| l.is_finite()));
    assert!(report.epochs[1].train_loss < report.epochs[0].train_loss, "{:?}", report.epochs);
}

#[test]
fn multi_process_options_need_several_processes() {
    let (tr, te) = (synthetic(64, 1), synthetic(20, 2));
    for (zero, deterministic) in [(true, false), (false, true), (true, true)] {
        let mut fleet = train::Fleet::single();
        (fleet.zero, fleet.deterministic) = (zero, deterministic);
        let e =
            train::train_with(&tr, &te, &opts(ModelKind::Mlp, 1), None, &quiet(None, None), &mut Vec::new(), &fleet)
                .unwrap_err()
                .to_string();
        let want = if zero && deterministic { "choose one" } else { "several processes" };
        assert!(e.contains(want), "{e}");
    }
}

/// Under `mpirun` a CLI built without the `mpi` feature would run N copies of one
/// training run over the same files: it refuses, saying how to build it.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_cli_without_mpi_refuses_to_run_as_one_of_several_processes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aotgrad"))
        .args(["train", "--epochs", "1"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("one of 2 MPI processes") && err.contains("--features mpi"), "{err}");
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../aotgrad-import/fixtures").join(name)
}

#[test]
fn an_imported_pytorch_cnn_compiles_agrees_with_eager_and_trains() {
    // Both forms of the main job's CNN exported from PyTorch (dynamic batch).
    for file in ["cnn.pt2", "cnn.core.pt2"] {
        let model = Classifier::imported(&fixture(file)).unwrap();
        assert!(model.description.starts_with("imported `cnn"), "{}", model.description);
        compiled_agrees_with_eager(file, model);
        let (tr, te) = (synthetic(160, 7), synthetic(40, 8));
        let o = TrainOptions { model_file: Some(fixture(file)), ..opts(ModelKind::Cnn, 2) };
        let report = train::train(&tr, &te, &o, None, &quiet(None, None), &mut Vec::new()).unwrap();
        assert!(report.model.starts_with("imported"), "{}", report.model);
        assert!(report.step_losses.iter().all(|l| l.is_finite()));
        assert!(report.epochs[1].train_loss < report.epochs[0].train_loss, "{file}: {:?}", report.epochs);
    }
}

#[test]
fn an_imported_model_that_is_no_classifier_is_refused() {
    // The MLP fixture was exported for a fixed batch of 8.
    let e = Classifier::imported(&fixture("mlp.pt2")).unwrap_err();
    assert!(e.contains("the batch dim is fixed at 8; export with dynamic_shapes="), "{e}");
    // The GPT takes token ids.
    let e = Classifier::imported(&fixture("gpt.pt2")).unwrap_err();
    assert!(e.contains("not a Fashion-MNIST classifier: its input `idx` is i64[2, 16], the images are f32"), "{e}");
    let e = Classifier::imported(&fixture("no-such.pt2")).unwrap_err();
    assert!(e.contains("no-such.pt2: cannot read"), "{e}");
}
