//! Attention: [`MultiHeadSelfAttention`] and the pre-LN [`TransformerBlock`].

use crate::util::attribute_to_caller;
use crate::{child_seed, expect_inputs, GeluMlp, LayerNorm, Linear, Module, ParamStore, Params};
use aotgrad_ir::{DType, Dim, SourceLoc};
use aotgrad_runtime::{Error, Result};
use aotgrad_trace::Tensor;

/// Multi-head scaled dot-product self-attention over `x` of shape
/// `(batch, seq, d_model)`: project to queries, keys and values (one fused `qkv`
/// projection, or separate `q`, `k`, `v` ones), split into heads, `softmax(q kᵀ /
/// sqrt(d_head)) v` per head, merge the heads and apply the output projection `out`.
#[derive(Clone, Debug)]
pub struct MultiHeadSelfAttention {
    store: ParamStore,
    /// Model width.
    pub d_model: usize,
    /// Number of heads (divides `d_model`).
    pub num_heads: usize,
    /// The query/key/value projections: one fused `d_model → 3·d_model` layer, or three.
    pub projections: Vec<Linear>,
    /// The output projection.
    pub out: Linear,
    /// Causal masking: position `i` attends to positions `<= i` only (a language
    /// model must not see the next token). Off by default; see [`Self::causal`].
    pub causal: bool,
}

impl MultiHeadSelfAttention {
    /// This attention with causal masking on or off.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// `fused_qkv` selects one `qkv` projection (parameters `qkv.weight`, `qkv.bias`)
    /// instead of `q`, `k`, `v`; the output projection is `out`.
    pub fn new(d_model: usize, num_heads: usize, fused_qkv: bool, dtype: DType, seed: u64) -> Result<Self> {
        if num_heads == 0 || !d_model.is_multiple_of(num_heads) {
            return Err(Error::Call {
                name: "MultiHeadSelfAttention".into(),
                msg: format!("d_model ({d_model}) must be a positive multiple of num_heads ({num_heads})"),
            });
        }
        let mut store = ParamStore::new();
        let mut projections = Vec::new();
        if fused_qkv {
            let qkv = Linear::new(d_model, 3 * d_model, true, dtype, child_seed(seed, 0))?;
            store.add_child("qkv", qkv.store())?;
            projections.push(qkv);
        } else {
            for (k, name) in ["q", "k", "v"].iter().enumerate() {
                let l = Linear::new(d_model, d_model, true, dtype, child_seed(seed, k as u64))?;
                store.add_child(name, l.store())?;
                projections.push(l);
            }
        }
        let out = Linear::new(d_model, d_model, true, dtype, child_seed(seed, 3))?;
        store.add_child("out", out.store())?;
        Ok(MultiHeadSelfAttention { store, d_model, num_heads, projections, out, causal: false })
    }

    /// Apply to `x` of shape `(batch, seq, d_model)`.
    #[track_caller]
    pub fn apply(&self, p: &Params, x: &Tensor) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let shape = x.shape();
        if shape.len() != 3 {
            return Err(aotgrad_trace::Error::Invalid {
                op: "MultiHeadSelfAttention".into(),
                loc,
                msg: format!("expected an input of shape (batch, seq, {}), got rank {}", self.d_model, shape.len()),
            }
            .into());
        }
        let (b, s) = (shape[0].clone(), shape[1].clone());
        let (h, dh) = (self.num_heads, self.d_model / self.num_heads);
        let (q, k, v) = if let [qkv] = self.projections.as_slice() {
            // (B, S, 3D) -> (B, S, 3, H, Dh) -> (3, B, H, S, Dh)
            let y = qkv.apply(&p.scope("qkv"), x)?;
            let y = y.reshape_dims(&[b.clone(), s.clone(), Dim::from(3usize), Dim::from(h), Dim::from(dh)])?;
            let y = y.permute(&[2, 0, 3, 1, 4])?;
            (y.select(0, 0)?, y.select(0, 1)?, y.select(0, 2)?)
        } else {
            let [lq, lk, lv] = self.projections.as_slice() else {
                return Err(Error::Internal("attention without q, k, v projections".into()));
            };
            let shape = [b.clone(), s.clone(), Dim::from(h), Dim::from(dh)];
            (
                heads(&p.scope("q"), lq, x, &shape)?,
                heads(&p.scope("k"), lk, x, &shape)?,
                heads(&p.scope("v"), lv, x, &shape)?,
            )
        };
        let scale = 1.0 / (dh as f64).sqrt();
        let mut scores = q.matmul(&k.transpose(-2, -1)?)?.mul(scale)?;
        if self.causal {
            // Key positions after the query's get -inf before the softmax (weight 0).
            let rows = Tensor::arange_dim(&s)?.unsqueeze(1)?;
            let cols = Tensor::arange_dim(&s)?.unsqueeze(0)?;
            scores = scores.masked_fill(&cols.gt(&rows)?, f64::NEG_INFINITY)?;
        }
        let ctx = scores.softmax(-1)?.matmul(&v)?; // (B, H, S, Dh)
        let merged = ctx.transpose(1, 2)?.reshape_dims(&[b, s, Dim::from(self.d_model)])?;
        self.out.apply(&p.scope("out"), &merged)
    }
}

impl Module for MultiHeadSelfAttention {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("MultiHeadSelfAttention", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

/// A pre-LN transformer block: `h = x + attn(ln1(x))`, `y = h + mlp(ln2(h))`, with a
/// 4× GELU MLP. Parameters: `ln1.*`, `attn.*`, `ln2.*`, `mlp.fc1.*`, `mlp.fc2.*`.
#[derive(Clone, Debug)]
pub struct TransformerBlock {
    store: ParamStore,
    /// Norm before attention.
    pub ln1: LayerNorm,
    /// Self-attention.
    pub attn: MultiHeadSelfAttention,
    /// Norm before the MLP.
    pub ln2: LayerNorm,
    /// The MLP (`d_model → 4·d_model → d_model`).
    pub mlp: GeluMlp,
}

impl TransformerBlock {
    /// This block with causal self-attention on or off.
    pub fn causal(mut self, causal: bool) -> Self {
        self.attn.causal = causal;
        self
    }
}

impl TransformerBlock {
    /// A block of width `d_model` with `num_heads` heads (fused QKV projection).
    pub fn new(d_model: usize, num_heads: usize, dtype: DType, seed: u64) -> Result<TransformerBlock> {
        let ln1 = LayerNorm::new(d_model, 1e-5, dtype)?;
        let attn = MultiHeadSelfAttention::new(d_model, num_heads, true, dtype, child_seed(seed, 0))?;
        let ln2 = LayerNorm::new(d_model, 1e-5, dtype)?;
        let mlp = GeluMlp::new(d_model, 4 * d_model, d_model, dtype, child_seed(seed, 1))?;
        let mut store = ParamStore::new();
        store.add_child("ln1", ln1.store())?;
        store.add_child("attn", attn.store())?;
        store.add_child("ln2", ln2.store())?;
        store.add_child("mlp", mlp.store())?;
        Ok(TransformerBlock { store, ln1, attn, ln2, mlp })
    }

    /// Apply to `x` of shape `(batch, seq, d_model)`.
    #[track_caller]
    pub fn apply(&self, p: &Params, x: &Tensor) -> Result<Tensor> {
        let a = self.attn.apply(&p.scope("attn"), &self.ln1.apply(&p.scope("ln1"), x)?)?;
        let h = x.add(&a)?;
        let m = self.mlp.apply(&p.scope("mlp"), &self.ln2.apply(&p.scope("ln2"), &h)?)?;
        Ok(h.add(&m)?)
    }
}

impl Module for TransformerBlock {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    #[track_caller]
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let _in_library = attribute_to_caller();
        let x = expect_inputs("TransformerBlock", inputs, 1)?;
        Ok(vec![self.apply(p, &x[0])?])
    }
}

/// One projection split into heads: `(B, S, D) -> (B, H, S, Dh)` for `shape = [B, S, H, Dh]`.
#[track_caller]
fn heads(p: &Params, l: &Linear, x: &Tensor, shape: &[Dim; 4]) -> Result<Tensor> {
    let y = l.apply(p, x)?;
    Ok(y.reshape_dims(shape)?.transpose(1, 2)?)
}
