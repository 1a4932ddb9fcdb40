//! Reading a `torch.export.save` archive: the zip members, the program in PyTorch's
//! published export schema (`models/model.json`), and the weights and constants from
//! their raw bytes and configs.
//!
//! The archive (PyTorch 2.15) holds, under one top folder named after the file:
//! `archive_format` (`pt2`), `archive_version`, `byteorder` (`little` or `big`),
//! `models/model.json`, `data/weights/model_weights_config.json` with one raw member
//! per weight, `data/constants/model_constants_config.json` likewise. Zip CRCs are
//! checked as members are read, so a damaged member is an error, not wrong weights.

use crate::error::{ImportError, Result};
use crate::schema::{self, Graph, InputSpec, OutputSpec, RangeConstraint, TensorMeta};
use aotgrad_ir::DType;
use aotgrad_trace::Tensor;
use indexmap::IndexMap;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The export schema major versions this reader reads (`schema_version.major`).
/// Minor versions only add fields, which are ignored.
pub const SCHEMA_MAJOR: i64 = 8;
/// The `archive_format` this reader reads.
pub const ARCHIVE_FORMAT: &str = "pt2";
/// The `archive_version`s this reader reads.
pub const ARCHIVE_VERSIONS: &[&str] = &["0", "1"];
/// The most elements one weight may hold (2^31: 8 GiB of f32).
pub const MAX_ELEMENTS: usize = 1 << 31;

/// A parsed exported program: its graph, signature and weights, before any op is
/// mapped (see [`crate::ImportedModule`] for the runnable module).
#[derive(Clone, Debug)]
pub struct ExportedProgram {
    /// The archive it was read from.
    pub path: PathBuf,
    /// The archive's top folder (the name the program was saved under).
    pub name: String,
    /// `schema_version` (major, minor).
    pub schema_version: (i64, i64),
    /// The PyTorch that exported it (`torch_version`).
    pub torch_version: String,
    /// The dialect the graph was verified in: `TRAINING` (what `torch.export.export`
    /// writes) or `ATEN` (core ATen, after `run_decompositions()`).
    pub dialect: String,
    /// Op set versions (`aten` → 10, ...).
    pub opset: IndexMap<String, i64>,
    /// The graph.
    pub graph: Graph,
    /// What each graph input and output is (parameter, buffer, user input, ...).
    pub inputs: Vec<InputSpec>,
    /// The graph outputs' roles, in the graph's output order.
    pub outputs: Vec<OutputSpec>,
    /// Symbolic sizes' ranges (`s0` → `[2, 64]`).
    pub range_constraints: IndexMap<String, RangeConstraint>,
    /// Parameters, buffers and constants by their PyTorch names, in the archive's
    /// config order.
    pub weights: IndexMap<String, Weight>,
}

/// A tensor read from the archive.
#[derive(Clone, Debug)]
pub struct Weight {
    /// Its values (a fresh, contiguous eager tensor).
    pub tensor: Tensor,
    /// Whether the archive marks it a parameter (`nn.Parameter`, frozen or not).
    pub is_param: bool,
    /// Whether it requires grad (`False` for a frozen parameter).
    pub requires_grad: bool,
}

fn archive_err(path: &Path, msg: impl Into<String>) -> ImportError {
    ImportError::Archive { path: path.to_path_buf(), msg: msg.into() }
}

fn schema_err(path: &Path, file: &str, msg: impl Into<String>) -> ImportError {
    ImportError::Schema { path: path.to_path_buf(), file: file.into(), msg: msg.into() }
}

struct Zip {
    path: PathBuf,
    zip: zip::ZipArchive<std::io::Cursor<Vec<u8>>>,
    prefix: String,
    /// The archive's length in bytes.
    len: u64,
}

impl Zip {
    fn open(path: &Path, bytes: Vec<u8>) -> Result<Zip> {
        let len = bytes.len() as u64;
        let zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| {
            archive_err(path, format!("not a readable zip archive ({e}); is the file truncated or damaged?"))
        })?;
        let prefix = zip
            .file_names()
            .filter_map(|n| n.strip_suffix("archive_format"))
            .filter(|p| p.is_empty() || p.ends_with('/'))
            .min_by_key(|p| p.len())
            .map(str::to_string)
            .ok_or_else(|| {
                archive_err(
                    path,
                    "no `archive_format` member: not a whole archive written by torch.export.save (is the file truncated or damaged?)",
                )
            })?;
        Ok(Zip { path: path.to_path_buf(), zip, prefix, len })
    }

    fn has(&self, member: &str) -> bool {
        self.zip.index_for_name(&format!("{}{member}", self.prefix)).is_some()
    }

    fn read(&mut self, member: &str) -> Result<Vec<u8>> {
        let full = format!("{}{member}", self.prefix);
        let mut f = self.zip.by_name(&full).map_err(|e| match e {
            zip::result::ZipError::FileNotFound => archive_err(&self.path, format!("no member `{full}`")),
            e => archive_err(&self.path, format!("member `{full}`: {e}")),
        })?;
        // torch.export.save stores members uncompressed: none can be longer than the
        // archive, whatever its header says.
        let limit = self.len;
        if f.size() > limit {
            return Err(archive_err(
                &self.path,
                format!("member `{full}` claims {} bytes, more than the archive holds", f.size()),
            ));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(f.size() as usize)
            .map_err(|_| archive_err(&self.path, format!("member `{full}`: cannot allocate {} bytes", f.size())))?;
        (&mut f)
            .take(limit + 1)
            .read_to_end(&mut out)
            .map_err(|e| archive_err(&self.path, format!("member `{full}` is damaged or truncated: {e}")))?;
        if out.len() as u64 > limit {
            return Err(archive_err(&self.path, format!("member `{full}` is longer than the archive")));
        }
        Ok(out)
    }

    fn read_text(&mut self, member: &str) -> Result<String> {
        let bytes = self.read(member)?;
        String::from_utf8(bytes).map_err(|_| archive_err(&self.path, format!("member `{member}` is not UTF-8 text")))
    }

    fn read_json(&mut self, member: &str) -> Result<Value> {
        let text = self.read_text(member)?;
        serde_json::from_str(&text).map_err(|e| schema_err(&self.path, member, format!("not valid JSON: {e}")))
    }
}

/// The dtype of an export-schema `ScalarType` code, or what it is when aotgrad has
/// no such dtype.
pub fn scalar_type(code: i64) -> std::result::Result<DType, String> {
    Ok(match code {
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::F16,
        7 => DType::F32,
        8 => DType::F64,
        12 => DType::Bool,
        13 => DType::BF16,
        1 => return Err("uint8 (BYTE)".into()),
        2 => return Err("int8 (CHAR)".into()),
        3 => return Err("int16 (SHORT)".into()),
        9..=11 => return Err("a complex dtype".into()),
        28 | 34 | 35 => return Err("an unsigned integer dtype".into()),
        29..=33 => return Err("a float8 dtype".into()),
        other => return Err(format!("unknown ScalarType code {other}")),
    })
}

fn element_size(d: DType) -> usize {
    match d {
        DType::Bool => 1,
        DType::F16 | DType::BF16 => 2,
        DType::I32 | DType::F32 => 4,
        DType::I64 | DType::F64 => 8,
    }
}

/// Build a contiguous tensor of `meta`'s sizes from a storage's raw bytes, reading
/// the strided elements from `meta`'s offset and strides.
fn tensor_from_bytes(meta: &TensorMeta, bytes: &[u8], big_endian: bool) -> std::result::Result<Tensor, String> {
    let dtype = scalar_type(meta.dtype)?;
    let sizes = meta.concrete_sizes()?;
    let strides = meta.concrete_strides()?;
    let offset = meta.storage_offset;
    if sizes.len() != strides.len() {
        return Err(format!("{} sizes but {} strides", sizes.len(), strides.len()));
    }
    let esize = element_size(dtype);
    let numel = sizes.iter().try_fold(1usize, |n, &s| n.checked_mul(s)).ok_or("the sizes overflow")?;
    // Each element is copied out: bound what a stride-0 (expanded) storage may claim.
    if numel > MAX_ELEMENTS {
        return Err(format!("{numel} elements is more than the {MAX_ELEMENTS} a weight may hold"));
    }
    // The highest element index the view reaches, checked against the bytes present.
    let mut last = offset;
    if numel > 0 {
        for (s, st) in sizes.iter().zip(&strides) {
            last = last
                .checked_add((s - 1).checked_mul(*st).ok_or("sizes and strides overflow")?)
                .ok_or("sizes and strides overflow")?;
        }
    }
    let needed = if numel == 0 { 0 } else { (last + 1).checked_mul(esize).ok_or("sizes and strides overflow")? };
    if needed > bytes.len() {
        return Err(format!(
            "sizes {sizes:?}, strides {strides:?} and offset {offset} of {dtype:?} need {needed} bytes, the member holds {}",
            bytes.len()
        ));
    }
    // Element indices in row-major order of the view.
    let mut idx = Vec::new();
    idx.try_reserve_exact(numel).map_err(|_| format!("cannot allocate {numel} elements"))?;
    let mut pos = vec![0usize; sizes.len()];
    for _ in 0..numel {
        idx.push(offset + pos.iter().zip(&strides).map(|(p, s)| p * s).sum::<usize>());
        for d in (0..sizes.len()).rev() {
            pos[d] += 1;
            if pos[d] < sizes[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    fn word<const N: usize>(bytes: &[u8], i: usize, big: bool) -> [u8; N] {
        let mut w: [u8; N] = bytes[i * N..i * N + N].try_into().expect("length checked");
        if big {
            w.reverse();
        }
        w
    }
    let big = big_endian;
    let t = match dtype {
        DType::F32 => Tensor::from_vec(idx.iter().map(|&i| f32::from_le_bytes(word(bytes, i, big))).collect(), &sizes),
        DType::F64 => Tensor::from_vec(idx.iter().map(|&i| f64::from_le_bytes(word(bytes, i, big))).collect(), &sizes),
        DType::I64 => Tensor::from_vec(idx.iter().map(|&i| i64::from_le_bytes(word(bytes, i, big))).collect(), &sizes),
        DType::I32 => Tensor::from_vec(idx.iter().map(|&i| i32::from_le_bytes(word(bytes, i, big))).collect(), &sizes),
        DType::F16 => Tensor::from_vec(
            idx.iter().map(|&i| half::f16::from_bits(u16::from_le_bytes(word(bytes, i, big)))).collect(),
            &sizes,
        ),
        DType::BF16 => Tensor::from_vec(
            idx.iter().map(|&i| half::bf16::from_bits(u16::from_le_bytes(word(bytes, i, big)))).collect(),
            &sizes,
        ),
        DType::Bool => Tensor::from_vec(idx.iter().map(|&i| bytes[i] != 0).collect::<Vec<bool>>(), &sizes),
    };
    t.map_err(|e| e.to_string())
}

impl ExportedProgram {
    /// Read and check an archive written by `torch.export.save`.
    pub fn read(path: impl AsRef<Path>) -> Result<ExportedProgram> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| archive_err(path, format!("cannot read: {e}")))?;
        Self::from_bytes(path, bytes)
    }

    /// Read an archive from its bytes (`path` names it in errors).
    pub fn from_bytes(path: impl AsRef<Path>, bytes: Vec<u8>) -> Result<ExportedProgram> {
        let path = path.as_ref();
        let mut z = Zip::open(path, bytes)?;
        let format = z.read_text("archive_format")?;
        if format.trim() != ARCHIVE_FORMAT {
            return Err(ImportError::Version {
                path: path.into(),
                what: "archive format".into(),
                found: format!("`{}`", format.trim()),
                reads: format!("`{ARCHIVE_FORMAT}`"),
            });
        }
        if z.has("archive_version") {
            let v = z.read_text("archive_version")?;
            if !ARCHIVE_VERSIONS.contains(&v.trim()) {
                return Err(ImportError::Version {
                    path: path.into(),
                    what: "archive version".into(),
                    found: v.trim().into(),
                    reads: ARCHIVE_VERSIONS.join(", "),
                });
            }
        }
        let big_endian = if z.has("byteorder") {
            match z.read_text("byteorder")?.trim() {
                "little" => false,
                "big" => true,
                other => return Err(archive_err(path, format!("unknown byte order `{other}`"))),
            }
        } else {
            false
        };
        let models: Vec<String> = z
            .zip
            .file_names()
            .filter_map(|n| n.strip_prefix(&z.prefix))
            .filter(|n| n.starts_with("models/") && n.ends_with(".json"))
            .map(str::to_string)
            .collect();
        let model_file = match models.as_slice() {
            [] => return Err(archive_err(path, "no `models/*.json`: the archive holds no exported program")),
            [one] => one.clone(),
            many => match many.iter().find(|m| m.as_str() == "models/model.json") {
                Some(m) => m.clone(),
                None => {
                    return Err(archive_err(
                        path,
                        format!("the archive holds several programs ({}); aotgrad imports one", many.join(", ")),
                    ))
                }
            },
        };
        let json = z.read_json(&model_file)?;
        let serr = |msg: String| schema_err(path, &model_file, msg);
        let version = json.get("schema_version").ok_or_else(|| serr("no `schema_version`".into()))?;
        let major =
            version.get("major").and_then(Value::as_i64).ok_or_else(|| serr("no `schema_version.major`".into()))?;
        let minor = version.get("minor").and_then(Value::as_i64).unwrap_or(0);
        if major != SCHEMA_MAJOR {
            return Err(ImportError::Version {
                path: path.into(),
                what: "schema version".into(),
                found: format!("{major}.{minor}"),
                reads: format!("{SCHEMA_MAJOR}.x"),
            });
        }
        let parsed = schema::parse_program(&json).map_err(serr)?;
        let mut weights = IndexMap::new();
        // `models/NAME.json` keeps its weights in `data/weights/NAME_weights_config.json`.
        let model_name = model_file.trim_start_matches("models/").trim_end_matches(".json").to_string();
        if z.has(&format!("data/weights/{model_name}.pt")) {
            return Err(archive_err(
                path,
                "the weights are pickled (data/weights/*.pt, an older archive layout); re-save with torch.export.save from PyTorch 2.15",
            ));
        }
        for (dir, kind) in [("data/weights", "weights"), ("data/constants", "constants")] {
            let member = format!("{dir}/{model_name}_{kind}_config.json");
            if !z.has(&member) {
                continue;
            }
            let cfg = z.read_json(&member)?;
            let entries = cfg
                .get("config")
                .and_then(Value::as_object)
                .ok_or_else(|| schema_err(path, &member, "no `config` object"))?;
            for (name, e) in entries {
                let werr = |msg: String| schema_err(path, &member, format!("`{name}`: {msg}"));
                if e.get("use_pickle").and_then(Value::as_bool).unwrap_or(false) {
                    return Err(werr(
                        "is pickled (a tensor subclass or custom object); aotgrad reads raw tensors only".into(),
                    ));
                }
                let file = e.get("path_name").and_then(Value::as_str).ok_or_else(|| werr("no `path_name`".into()))?;
                let meta = e.get("tensor_meta").ok_or_else(|| werr("no `tensor_meta`".into()))?;
                let meta = schema::tensor_meta(meta).map_err(werr)?;
                let raw = z.read(&format!("{dir}/{file}"))?;
                let tensor = tensor_from_bytes(&meta, &raw, big_endian).map_err(werr)?;
                let is_param = e.get("is_param").and_then(Value::as_bool).unwrap_or(false);
                weights.insert(name.clone(), Weight { tensor, is_param, requires_grad: meta.requires_grad });
            }
        }
        let program = ExportedProgram {
            path: path.into(),
            name: z.prefix.trim_end_matches('/').to_string(),
            schema_version: (major, minor),
            torch_version: json.get("torch_version").and_then(Value::as_str).unwrap_or("").to_string(),
            dialect: json
                .get("verifiers")
                .and_then(Value::as_array)
                .and_then(|v| v.first())
                .and_then(Value::as_str)
                .or_else(|| json.get("dialect").and_then(Value::as_str))
                .unwrap_or("ATEN")
                .to_string(),
            opset: parsed.opset,
            graph: parsed.graph,
            inputs: parsed.inputs,
            outputs: parsed.outputs,
            range_constraints: parsed.range_constraints,
            weights,
        };
        program.check_signature()?;
        Ok(program)
    }

    /// Check that every input spec names a graph input, every weight it needs is in
    /// the archive with the graph's metadata, and the outputs line up.
    fn check_signature(&self) -> Result<()> {
        let sig = |msg: String| ImportError::Signature { path: self.path.clone(), msg };
        if self.inputs.len() != self.graph.inputs.len() {
            return Err(sig(format!(
                "the signature has {} input specs for {} graph inputs",
                self.inputs.len(),
                self.graph.inputs.len()
            )));
        }
        if self.outputs.len() != self.graph.outputs.len() {
            return Err(sig(format!(
                "the signature has {} output specs for {} graph outputs",
                self.outputs.len(),
                self.graph.outputs.len()
            )));
        }
        for spec in &self.inputs {
            match spec {
                InputSpec::Parameter { target, arg }
                | InputSpec::Buffer { target, arg, .. }
                | InputSpec::Constant { target, arg } => {
                    let w = self
                        .weights
                        .get(target)
                        .ok_or_else(|| sig(format!("input `{arg}` is `{target}`, which the archive does not hold")))?;
                    if let Some(meta) = self.graph.tensor_values.get(arg) {
                        let want = meta.concrete_sizes().ok();
                        let have = w.tensor.sizes().ok();
                        let dtype = scalar_type(meta.dtype).ok();
                        if want.is_some() && want != have || dtype.is_some_and(|d| d != w.tensor.dtype()) {
                            return Err(sig(format!(
                                "`{target}` is {:?} {:?} in the archive, the graph's `{arg}` is {:?} {:?}",
                                w.tensor.dtype(),
                                have.unwrap_or_default(),
                                dtype,
                                want.unwrap_or_default()
                            )));
                        }
                    }
                }
                InputSpec::User { .. } => {}
                InputSpec::Unsupported { kind } => {
                    return Err(sig(format!("input kind `{kind}` is not supported by aotgrad's importer")))
                }
            }
        }
        for spec in &self.outputs {
            match spec {
                OutputSpec::User { .. } | OutputSpec::Loss { .. } => {}
                OutputSpec::BufferMutation { target, .. } | OutputSpec::ParameterMutation { target, .. } => {
                    if !self.weights.contains_key(target) {
                        return Err(sig(format!("output mutates `{target}`, which the archive does not hold")));
                    }
                }
                OutputSpec::UserInputMutation { input, .. } => {
                    if !self.inputs.iter().any(|s| matches!(s, InputSpec::User { arg } if arg == input)) {
                        return Err(sig(format!("output mutates user input `{input}`, which is not one")));
                    }
                }
                OutputSpec::Unsupported { kind } => {
                    return Err(sig(format!(
                    "output kind `{kind}` is not supported (a joint or effectful export); export the forward program"
                )))
                }
            }
        }
        Ok(())
    }

    /// How many nodes call each op, most used first (ties by name).
    pub fn op_histogram(&self) -> Vec<(String, usize)> {
        let mut h: IndexMap<String, usize> = IndexMap::new();
        for n in &self.graph.nodes {
            *h.entry(n.target.clone()).or_default() += 1;
        }
        let mut v: Vec<(String, usize)> = h.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// The user inputs' names, in call order.
    pub fn user_inputs(&self) -> Vec<&str> {
        self.inputs
            .iter()
            .filter_map(|s| match s {
                InputSpec::User { arg } => Some(arg.as_str()),
                _ => None,
            })
            .collect()
    }

    /// An argument's text for signatures and errors.
    pub fn describe(&self, arg: &str) -> String {
        match self.graph.tensor_values.get(arg) {
            Some(m) => m.to_string(),
            None => "?".into(),
        }
    }
}
