//! The image classifiers `aotgrad train` builds: a GELU MLP, a small vision
//! transformer, a small CNN, or a classifier imported from PyTorch (`--model-file`,
//! a `torch.export` archive). All are [`Module`]s whose forward takes `(images, labels)` —
//! images `(batch, 784)` f32, labels `(batch)` i64 — and returns
//! `[cross-entropy loss, logits (batch, 10)]`, so one compiled module serves the
//! training step (gradient of the loss) and evaluation (the inference path, under
//! no-grad).

use aotgrad::import::schema::SymDim;
use aotgrad::import::ImportedModule;
use aotgrad::nn::{
    child_seed, expect_inputs, Conv2d, Init, LayerNorm, Linear, Module, ParamStore, Params, TransformerBlock,
};
use aotgrad::prelude::*;

/// Image side (Fashion-MNIST: 28).
pub const SIDE: usize = 28;
/// Number of classes.
pub const CLASSES: usize = 10;

/// Which model to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// 784-256-128-10 with GELU.
    Mlp,
    /// A 2-block vision transformer over 7×7 patches.
    Vit,
    /// Two 3×3 convolutions (16 and 32 channels), each with ReLU and 2×2 max pooling,
    /// then a linear head.
    Cnn,
}

impl ModelKind {
    /// Build the model with its default sizes, initialized from `seed`.
    pub fn build(self, seed: u64) -> aotgrad::Result<Classifier> {
        match self {
            ModelKind::Mlp => Classifier::mlp(&[SIDE * SIDE, 256, 128, CLASSES], seed),
            ModelKind::Vit => Classifier::vit(VitConfig::default(), seed),
            ModelKind::Cnn => Classifier::cnn(seed),
        }
    }
}

/// The sizes of the vision transformer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VitConfig {
    /// Patch side (divides 28): 7 gives 16 tokens of 49 pixels, 4 gives 49 of 16.
    pub patch: usize,
    /// Token width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Transformer blocks.
    pub blocks: usize,
}

impl Default for VitConfig {
    fn default() -> Self {
        VitConfig { patch: 7, d_model: 64, heads: 4, blocks: 2 }
    }
}

#[derive(Debug)]
enum Arch {
    Mlp {
        layers: Vec<Linear>,
    },
    Vit(Box<Vit>),
    Cnn(Box<Cnn>),
    /// A PyTorch program (`torch.export`) and the image shape its input takes
    /// (`[-1, 784]`, `[-1, 1, 28, 28]`, ...).
    Imported(Box<ImportedModule>, Vec<i64>),
}

#[derive(Debug)]
struct Cnn {
    conv1: Conv2d,
    conv2: Conv2d,
    head: Linear,
}

#[derive(Debug)]
struct Vit {
    cfg: VitConfig,
    embed: Linear,
    blocks: Vec<TransformerBlock>,
    norm: LayerNorm,
    head: Linear,
}

/// A classifier: the architecture plus the cross-entropy loss.
#[derive(Debug)]
pub struct Classifier {
    store: ParamStore,
    arch: Arch,
    /// A one-line description (`784-256-128-10 GELU MLP, 235,146 parameters`).
    pub description: String,
}

impl Classifier {
    /// An MLP with GELU between layers (`sizes[0]` inputs, `sizes.last()` classes):
    /// Kaiming-uniform hidden layers, a Xavier-uniform head.
    pub fn mlp(sizes: &[usize], seed: u64) -> aotgrad::Result<Classifier> {
        let mut store = ParamStore::new();
        let mut layers = Vec::new();
        for (i, w) in sizes.windows(2).enumerate() {
            let init = if i + 2 == sizes.len() { Init::XavierUniform } else { Init::KaimingUniform };
            let l = Linear::with_init(w[0], w[1], true, init, DType::F32, child_seed(seed, i as u64))?;
            store.add_child(&format!("layers.{i}"), l.store())?;
            layers.push(l);
        }
        let shape = sizes.iter().map(usize::to_string).collect::<Vec<_>>().join("-");
        let description = format!("{shape} GELU MLP, {} parameters", group(store.num_param_elements()));
        Ok(Classifier { store, arch: Arch::Mlp { layers }, description })
    }

    /// A vision transformer: the image cut into `patch × patch` patches by views and a
    /// reshape, a linear patch embedding (Xavier) plus learned position embeddings
    /// (normal, std 0.02), pre-LN transformer blocks, mean pooling over the tokens, a
    /// LayerNorm and a linear head (Xavier).
    pub fn vit(cfg: VitConfig, seed: u64) -> aotgrad::Result<Classifier> {
        if cfg.patch == 0 || !SIDE.is_multiple_of(cfg.patch) {
            return Err(aotgrad::Error::Call {
                name: "vit".into(),
                msg: format!("patch size {} does not divide the image side {SIDE}", cfg.patch),
            });
        }
        let tokens = (SIDE / cfg.patch).pow(2);
        let mut store = ParamStore::new();
        let embed = Linear::with_init(
            cfg.patch * cfg.patch,
            cfg.d_model,
            true,
            Init::XavierUniform,
            DType::F32,
            child_seed(seed, 0),
        )?;
        store.add_child("embed", embed.store())?;
        store.add_param("pos", Tensor::randn(&[tokens, cfg.d_model], DType::F32, child_seed(seed, 1))?.mul(0.02)?)?;
        let mut blocks = Vec::new();
        for b in 0..cfg.blocks {
            let block = TransformerBlock::new(cfg.d_model, cfg.heads, DType::F32, child_seed(seed, 10 + b as u64))?;
            store.add_child(&format!("blocks.{b}"), block.store())?;
            blocks.push(block);
        }
        let norm = LayerNorm::new(cfg.d_model, 1e-5, DType::F32)?;
        store.add_child("norm", norm.store())?;
        let head = Linear::with_init(cfg.d_model, CLASSES, true, Init::XavierUniform, DType::F32, child_seed(seed, 2))?;
        store.add_child("head", head.store())?;
        let description = format!(
            "ViT ({}×{} patches → {tokens} tokens, d{} h{}, {} blocks), {} parameters",
            cfg.patch,
            cfg.patch,
            cfg.d_model,
            cfg.heads,
            cfg.blocks,
            group(store.num_param_elements())
        );
        Ok(Classifier { store, arch: Arch::Vit(Box::new(Vit { cfg, embed, blocks, norm, head })), description })
    }

    /// A small CNN: two 3×3 convolutions (padding 1; 1 → 16 → 32 channels, PyTorch's
    /// default initialization), each followed by ReLU and 2×2 max pooling, then a
    /// linear head (Xavier) over the 32×7×7 features.
    pub fn cnn(seed: u64) -> aotgrad::Result<Classifier> {
        let same = Conv2dOpts::default().padding(1);
        let conv1 = Conv2d::new(1, 16, [3, 3], same, true, DType::F32, child_seed(seed, 0))?;
        let conv2 = Conv2d::new(16, 32, [3, 3], same, true, DType::F32, child_seed(seed, 1))?;
        let feats = 32 * (SIDE / 4) * (SIDE / 4);
        let head = Linear::with_init(feats, CLASSES, true, Init::XavierUniform, DType::F32, child_seed(seed, 2))?;
        let mut store = ParamStore::new();
        store.add_child("conv1", conv1.store())?;
        store.add_child("conv2", conv2.store())?;
        store.add_child("head", head.store())?;
        let description = format!(
            "CNN (conv 3×3 16, pool, conv 3×3 32, pool, linear {feats}-{CLASSES}), {} parameters",
            group(store.num_param_elements())
        );
        Ok(Classifier { store, arch: Arch::Cnn(Box::new(Cnn { conv1, conv2, head })), description })
    }

    /// A classifier exported from PyTorch (`torch.export.save`): one float input of
    /// 784 pixels per image after a dynamic batch dim (`[B, 784]`, `[B, 1, 28, 28]`,
    /// ...) and one output of 10 logits per image. Its weights are the archive's.
    pub fn imported(path: &std::path::Path) -> Result<Classifier, String> {
        let m = ImportedModule::load(path).map_err(|e| e.to_string())?;
        let p = m.program();
        let bad = |msg: String| format!("{}: not a Fashion-MNIST classifier: {msg}", path.display());
        let inputs = p.user_inputs();
        let [input] = inputs.as_slice() else {
            return Err(bad(format!("it takes {} inputs, a classifier takes one batch of images", inputs.len())));
        };
        let meta = p.graph.tensor_values.get(*input).ok_or_else(|| bad("no input metadata".into()))?;
        if !aotgrad::import::scalar_type(meta.dtype).is_ok_and(|d| d == DType::F32) {
            return Err(bad(format!("its input `{input}` is {meta}, the images are f32")));
        }
        let (batch, image) = meta.sizes.split_first().ok_or_else(|| bad(format!("its input `{input}` is a scalar")))?;
        if let SymDim::Int(b) = batch {
            return Err(bad(format!(
                "its input `{input}` is {meta}: the batch dim is fixed at {b}; export with \
                 dynamic_shapes={{\"{input}\": {{0: torch.export.Dim(\"batch\")}}}}"
            )));
        }
        let image: Vec<i64> = image
            .iter()
            .map(|d| match d {
                SymDim::Int(v) => Ok(*v),
                SymDim::Expr(e, _) => Err(bad(format!("its input `{input}` has a symbolic image dim `{e}`"))),
            })
            .collect::<Result<_, _>>()?;
        if image.iter().product::<i64>() != (SIDE * SIDE) as i64 {
            return Err(bad(format!("its input `{input}` is {meta}, not {} pixels per image", SIDE * SIDE)));
        }
        let outputs: Vec<String> = p
            .graph
            .outputs
            .iter()
            .zip(&p.outputs)
            .filter(|(_, spec)| matches!(spec, aotgrad::import::schema::OutputSpec::User { .. }))
            .flat_map(|(o, _)| o.tensor_names().into_iter().map(String::from))
            .collect();
        let user_outputs =
            p.outputs.iter().filter(|o| matches!(o, aotgrad::import::schema::OutputSpec::User { .. })).count();
        let logits = outputs.iter().find_map(|o| p.graph.tensor_values.get(o));
        if user_outputs != 1 || logits.is_none_or(|m| m.sizes.last() != Some(&SymDim::Int(CLASSES as i64))) {
            return Err(bad(format!("a classifier returns one output of {CLASSES} logits per image")));
        }
        let store = m.store().clone();
        let description = format!(
            "imported `{}` from {} (torch {}, {} dialect, {} nodes), {} parameters",
            m.name(),
            path.display(),
            p.torch_version,
            p.dialect,
            p.graph.nodes.len(),
            group(store.num_param_elements())
        );
        let mut shape = vec![-1];
        shape.extend(image);
        Ok(Classifier { store, arch: Arch::Imported(Box::new(m), shape), description })
    }

    /// The logits `(batch, 10)` of images `(batch, 784)`.
    pub fn logits(&self, p: &Params, x: &Tensor) -> aotgrad::Result<Tensor> {
        match &self.arch {
            Arch::Imported(m, shape) => {
                let outs = m.forward(p, &[x.reshape(shape)?])?;
                outs.into_iter()
                    .next()
                    .ok_or_else(|| aotgrad::Error::Internal("an imported classifier returned nothing".into()))
            }
            Arch::Mlp { layers } => {
                let mut h = x.clone();
                for (i, l) in layers.iter().enumerate() {
                    h = l.apply(&p.scope(&format!("layers.{i}")), &h)?;
                    if i + 1 < layers.len() {
                        h = h.gelu()?;
                    }
                }
                Ok(h)
            }
            Arch::Vit(vit) => {
                let Vit { cfg, embed, blocks, norm, head } = vit.as_ref();
                let (g, s) = ((SIDE / cfg.patch) as i64, cfg.patch as i64);
                // (B, 784) → (B, g, s, g, s) → (B, g, g, s, s) → (B, g·g, s·s): patches by views.
                let patches = x.reshape(&[-1, g, s, g, s])?.permute(&[0, 1, 3, 2, 4])?.reshape(&[-1, g * g, s * s])?;
                let mut h = embed.apply(&p.scope("embed"), &patches)?.add(p.get("pos")?)?;
                for (b, block) in blocks.iter().enumerate() {
                    h = block.apply(&p.scope(&format!("blocks.{b}")), &h)?;
                }
                let pooled = norm.apply(&p.scope("norm"), &h.mean(&[1], false)?)?;
                head.apply(&p.scope("head"), &pooled)
            }
            Arch::Cnn(cnn) => {
                let Cnn { conv1, conv2, head } = cnn.as_ref();
                let side = SIDE as i64;
                let img = x.reshape(&[-1, 1, side, side])?;
                let h = conv1.apply(&p.scope("conv1"), &img)?.relu()?.max_pool2d([2, 2], None, [0, 0], [1, 1])?;
                let h = conv2.apply(&p.scope("conv2"), &h)?.relu()?.max_pool2d([2, 2], None, [0, 0], [1, 1])?;
                let feats = 32 * (side / 4) * (side / 4);
                head.apply(&p.scope("head"), &h.reshape(&[-1, feats])?)
            }
        }
    }
}

impl Module for Classifier {
    fn store(&self) -> &ParamStore {
        &self.store
    }
    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
        let inputs = expect_inputs("classifier", inputs, 2)?;
        let logits = self.logits(p, &inputs[0])?;
        Ok(vec![logits.cross_entropy(&inputs[1])?, logits])
    }
}

/// `235146` → `235,146`.
pub fn group(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
