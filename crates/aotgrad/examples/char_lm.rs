//! A causal character-level language model, trained ahead of time and sampled with
//! `multinomial`: character embeddings plus learned positions, two causal pre-LN
//! transformer blocks, a LayerNorm and a linear head over the characters. Training
//! runs through `aot_module` (one compiled step for the fixed batch shape) with AdamW;
//! sampling runs eagerly, one character at a time, from the softmax of the last
//! position's logits.
//!
//! `cargo run --release -p aotgrad --example char_lm` (1,000 steps, about 16 s on
//! two cores; `STEPS=n` changes the number of steps). `tests/char_lm.rs` runs it
//! short.

use aotgrad::nn::{child_seed, expect_inputs, Embedding, LayerNorm, Linear, Module, Optimizer, ParamStore, Params};
use aotgrad::nn::{AdamW, TransformerBlock};
use aotgrad::prelude::*;
use aotgrad::trace::RngSeed;
use std::sync::Arc;

/// The corpus: a few lines of plain prose, repeated by the sampler of windows.
const TEXT: &str = "the cat sat on the mat. the dog sat on the log. \
the cat saw the dog and the dog saw the cat. \
a bird sang in the tree and the cat sat still. \
the sun was warm on the mat and the log. \
the dog ran to the tree and the bird flew away. ";

const CONTEXT: usize = 32;
const BATCH: usize = 16;
const D_MODEL: usize = 48;
const HEADS: usize = 4;
const BLOCKS: usize = 2;

struct CharLm {
    store: ParamStore,
    embed: Embedding,
    blocks: Vec<TransformerBlock>,
    norm: LayerNorm,
    head: Linear,
    vocab: usize,
}

impl CharLm {
    fn new(vocab: usize, seed: u64) -> aotgrad::Result<CharLm> {
        let mut store = ParamStore::new();
        let embed = Embedding::new(vocab, D_MODEL, DType::F32, child_seed(seed, 0))?;
        store.add_child("embed", embed.store())?;
        let pos = Tensor::randn(&[CONTEXT, D_MODEL], DType::F32, child_seed(seed, 1))?.mul(0.02)?;
        store.add_param("pos", pos)?;
        let mut blocks = Vec::new();
        for b in 0..BLOCKS {
            let block =
                TransformerBlock::new(D_MODEL, HEADS, DType::F32, child_seed(seed, 10 + b as u64))?.causal(true);
            store.add_child(&format!("blocks.{b}"), block.store())?;
            blocks.push(block);
        }
        let norm = LayerNorm::new(D_MODEL, 1e-5, DType::F32)?;
        store.add_child("norm", norm.store())?;
        let head = Linear::new(D_MODEL, vocab, true, DType::F32, child_seed(seed, 2))?;
        store.add_child("head", head.store())?;
        Ok(CharLm { store, embed, blocks, norm, head, vocab })
    }

    /// Logits `(batch, t, vocab)` of character indices `(batch, t)`, `t <= CONTEXT`.
    fn logits(&self, p: &Params, idx: &Tensor) -> aotgrad::Result<Tensor> {
        let t = idx.size(1)?.as_const().unwrap_or(CONTEXT as i64);
        let pos = p.get("pos")?.slice(0, Some(0), Some(t), 1)?;
        let mut h = self.embed.apply(&p.scope("embed"), idx)?.mul((D_MODEL as f64).sqrt())?.add(&pos)?;
        for (b, block) in self.blocks.iter().enumerate() {
            h = block.apply(&p.scope(&format!("blocks.{b}")), &h)?;
        }
        self.head.apply(&p.scope("head"), &self.norm.apply(&p.scope("norm"), &h)?)
    }
}

impl Module for CharLm {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    /// `[idx (batch, t), targets (batch, t)]` → `[mean cross-entropy of the next character]`.
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        let x = expect_inputs("CharLm", inputs, 2)?;
        let logits = self.logits(p, &x[0])?;
        let v = self.vocab as i64;
        Ok(vec![logits.reshape(&[-1, v])?.cross_entropy(&x[1].reshape(&[-1])?)?])
    }
}

/// What a run gives: the loss every 50 steps (and at the last), and the sampled text.
pub struct Run {
    /// `(step, loss)`.
    pub losses: Vec<(usize, f64)>,
    /// The prompt followed by the sampled characters.
    pub sample: String,
    /// The characters of the corpus.
    pub vocabulary: Vec<char>,
}

#[cfg_attr(test, allow(dead_code))]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::var("STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let run = run(steps, 120, true)?;
    println!("sample: {}", run.sample);
    Ok(())
}

/// Train for `steps` steps, then sample `chars_out` characters after the prompt.
pub fn run(steps: usize, chars_out: usize, verbose: bool) -> Result<Run, Box<dyn std::error::Error>> {
    let mut chars: Vec<char> = TEXT.chars().collect();
    chars.sort();
    chars.dedup();
    let code = |c: char| chars.binary_search(&c).expect("a character of the text") as i64;
    let data: Vec<i64> = TEXT.chars().map(code).collect();
    let model = Arc::new(CharLm::new(chars.len(), 0)?);
    if verbose {
        println!(
            "char-level LM: {} characters of text, vocabulary {}, {} parameters",
            data.len(),
            chars.len(),
            model.store().num_param_elements()
        );
    }
    let compiled = aot_module(model.clone(), AotConfig::default())?;
    let mut opt = AdamW::with(3e-3, (0.9, 0.99), 1e-8, 0.01)?;
    // Windows at pseudo-random offsets (a fixed LCG: the run is reproducible).
    let mut state = 7u64;
    let mut next = move |n: usize| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) as usize) % n
    };
    let started = std::time::Instant::now();
    let mut losses = Vec::new();
    for step in 0..steps {
        let (mut xs, mut ys) = (Vec::with_capacity(BATCH * CONTEXT), Vec::with_capacity(BATCH * CONTEXT));
        for _ in 0..BATCH {
            let o = next(data.len() - CONTEXT - 1);
            xs.extend_from_slice(&data[o..o + CONTEXT]);
            ys.extend_from_slice(&data[o + 1..o + CONTEXT + 1]);
        }
        let x = Tensor::from_i64(&xs, &[BATCH, CONTEXT])?;
        let y = Tensor::from_i64(&ys, &[BATCH, CONTEXT])?;
        let (outs, back) = compiled.forward(&[x.clone(), y.clone()])?;
        let grads = back.backward(&[Tensor::ones(&[], DType::F32)?])?;
        opt.step(model.store(), &grads.params)?;
        if step % 50 == 0 || step + 1 == steps {
            let loss = outs[0].item()?;
            losses.push((step, loss));
            if verbose {
                let eager = no_grad(|| model.forward_eager(&[x.clone(), y.clone()]))?[0].item()?;
                println!("step {step:>4}: loss {loss:.4} (eager, after the update: {eager:.4})");
            }
        }
    }
    if verbose {
        println!("trained {steps} steps in {:.1} s", started.elapsed().as_secs_f64());
    }
    // Sampling: the softmax of the last position's logits, one character at a time.
    let prompt = "the cat";
    let mut text: Vec<i64> = prompt.chars().map(code).collect();
    let p = Params::from_store(model.store());
    no_grad(|| -> Result<(), Box<dyn std::error::Error>> {
        for i in 0..chars_out as u64 {
            let ctx = &text[text.len().saturating_sub(CONTEXT)..];
            let idx = Tensor::from_i64(ctx, &[1, ctx.len()])?;
            let logits = model.logits(&p, &idx)?;
            let last = logits.select(1, ctx.len() as i64 - 1)?.div(0.8)?.softmax(-1)?;
            let next = last.multinomial(1, true, RngSeed::Fixed(1000 + i))?;
            text.push(next.to_vec_i64()?[0]);
        }
        Ok(())
    })?;
    let sample: String = text.iter().map(|&i| chars[i as usize]).collect();
    Ok(Run { losses, sample, vocabulary: chars })
}
