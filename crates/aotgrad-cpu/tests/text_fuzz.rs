//! Graph text fed to parse and run: mutations of real programs (the example programs
//! of the repository) are parsed with the checking parser, and whatever parses is
//! compiled and run by the reference interpreter and the compiled backend on inputs
//! of its declared layouts. Nothing may panic: every failure is an error.

use aotgrad_cpu::{CpuBackend, CpuTensor, ReferenceBackend};
use aotgrad_ir::text::parse_graph;
use aotgrad_ir::{Backend, DType, Graph};
use proptest::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

static PARSED: AtomicUsize = AtomicUsize::new(0);
static RAN: AtomicUsize = AtomicUsize::new(0);

fn seeds() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "aot") {
            let text = std::fs::read_to_string(&p).unwrap();
            let body: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
            out.push(body.join("\n"));
        }
    }
    out.sort();
    out
}

/// Inputs for `g`'s declared layouts, when they are concrete and small.
fn inputs(g: &Graph) -> Option<Vec<CpuTensor>> {
    let mut v = Vec::new();
    for i in &g.inputs {
        let m = &i.meta;
        let shape = m.concrete_shape()?;
        let strides = m.concrete_strides()?;
        let off = m.concrete_offset()?;
        let mut extent = off.checked_add(1)?;
        for (s, st) in shape.iter().zip(&strides) {
            extent = extent.checked_add(s.saturating_sub(1).checked_mul(*st)?)?;
        }
        if extent > 1 << 14 {
            return None;
        }
        let vals: Vec<f64> = (0..extent).map(|k| ((k as f64) * 0.37).sin()).collect();
        let base = match m.dtype {
            DType::I32 | DType::I64 | DType::Bool => {
                CpuTensor::from_f64(&vec![0.0; extent], &[extent], m.dtype).ok()?
            }
            d => CpuTensor::from_f64(&vals, &[extent], d).ok()?,
        };
        v.push(CpuTensor { storage: base.storage, meta: m.clone() });
    }
    Some(v)
}

fn mutate(text: &str, edits: &[(usize, u8, u8)]) -> String {
    const ALPHABET: &[u8] = b"%#0123456789[],()=:.-+ siftxe_\n\"";
    let mut b = text.as_bytes().to_vec();
    for &(pos, kind, ch) in edits {
        if b.is_empty() {
            break;
        }
        let p = pos % b.len();
        let c = ALPHABET[ch as usize % ALPHABET.len()];
        match kind % 3 {
            0 => b[p] = c,
            1 => b.insert(p, c),
            _ => {
                b.remove(p);
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn mutated_programs_parse_and_run_without_panicking(
        seed in 0usize..64,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..4),
    ) {
        let seeds = seeds();
        let text = mutate(&seeds[seed % seeds.len()], &edits);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let Ok(g) = parse_graph(&text) else { return };
            PARSED.fetch_add(1, Ordering::Relaxed);
            let Some(ins) = inputs(&g) else { return };
            RAN.fetch_add(1, Ordering::Relaxed);
            if let Ok(c) = ReferenceBackend.compile(&g) {
                let _ = c.run(&ins);
            }
            if let Ok(c) = CpuBackend::new(1).compile(&g) {
                let _ = c.run(&ins);
            }
        }));
        prop_assert!(outcome.is_ok(), "panicked on:\n{text}");
        if std::env::var_os("FUZZ_STATS").is_some() {
            eprintln!("parsed {} ran {}", PARSED.load(Ordering::Relaxed), RAN.load(Ordering::Relaxed));
        }
    }
}
