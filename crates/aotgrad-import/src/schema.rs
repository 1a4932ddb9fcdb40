//! The part of PyTorch's export schema (`torch/_export/serde/schema.py`, major
//! version 8) aotgrad reads, parsed from `models/model.json` into plain Rust values.
//!
//! Unions in the schema are JSON objects with one key naming the variant
//! (`{"as_tensor": {"name": "x"}}`); fields newer minor versions add are ignored.
//! Non-finite floats are the strings `"Infinity"`, `"-Infinity"` and `"NaN"`.

use indexmap::IndexMap;
use serde_json::Value;
use std::fmt;

/// A size, stride or offset: a number, or a symbolic expression (`s0`, `2*s0`).
#[derive(Clone, Debug, PartialEq)]
pub enum SymDim {
    /// A fixed number.
    Int(i64),
    /// A symbolic expression, with its example value when recorded.
    Expr(String, Option<i64>),
}

impl fmt::Display for SymDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SymDim::Int(v) => write!(f, "{v}"),
            SymDim::Expr(e, _) => write!(f, "{e}"),
        }
    }
}

/// A tensor's metadata as the export records it.
#[derive(Clone, Debug)]
pub struct TensorMeta {
    /// Export-schema `ScalarType` code (7 = float32, ...).
    pub dtype: i64,
    /// Sizes.
    pub sizes: Vec<SymDim>,
    /// Strides.
    pub strides: Vec<SymDim>,
    /// Storage offset (in elements).
    pub storage_offset: usize,
    /// Whether it requires grad.
    pub requires_grad: bool,
}

impl TensorMeta {
    /// The sizes, when all are numbers.
    pub fn concrete_sizes(&self) -> Result<Vec<usize>, String> {
        concrete(&self.sizes, "size")
    }
    /// The strides, when all are numbers.
    pub fn concrete_strides(&self) -> Result<Vec<usize>, String> {
        concrete(&self.strides, "stride")
    }
}

fn concrete(dims: &[SymDim], what: &str) -> Result<Vec<usize>, String> {
    dims.iter()
        .map(|d| match d {
            SymDim::Int(v) if *v >= 0 => Ok(*v as usize),
            SymDim::Int(v) => Err(format!("negative {what} {v}")),
            SymDim::Expr(e, _) => Err(format!("symbolic {what} `{e}`")),
        })
        .collect()
}

impl fmt::Display for TensorMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dtype = match crate::archive::scalar_type(self.dtype) {
            Ok(d) => format!("{d:?}").to_lowercase(),
            Err(e) => e,
        };
        let sizes: Vec<String> = self.sizes.iter().map(ToString::to_string).collect();
        write!(f, "{dtype}[{}]", sizes.join(", "))
    }
}

/// A reference to a symbolic int: a value another node computes, or a number.
#[derive(Clone, Debug, PartialEq)]
pub enum SymRef {
    /// The name of a value (`sym_size_int`).
    Name(String),
    /// A number.
    Int(i64),
}

/// A node argument or output.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// `None`.
    None,
    /// A tensor value by name.
    Tensor(String),
    /// A list of tensors.
    Tensors(Vec<String>),
    /// A list of optional tensors.
    OptionalTensors(Vec<Option<String>>),
    /// An int.
    Int(i64),
    /// A list of ints.
    Ints(Vec<i64>),
    /// A symbolic int.
    SymInt(SymRef),
    /// A list of symbolic ints.
    SymInts(Vec<SymRef>),
    /// A float.
    Float(f64),
    /// A list of floats.
    Floats(Vec<f64>),
    /// A bool.
    Bool(bool),
    /// A list of bools.
    Bools(Vec<bool>),
    /// A string.
    Str(String),
    /// A list of strings.
    Strs(Vec<String>),
    /// A dtype (export `ScalarType` code).
    ScalarType(i64),
    /// A memory format code.
    MemoryFormat(i64),
    /// A layout code.
    Layout(i64),
    /// A device (`cpu`, `cuda:0`).
    Device(String),
    /// A kind this reader does not model (`as_graph`, `as_custom_obj`, ...): an
    /// error if an op needs it.
    Other(String),
}

impl Arg {
    /// The schema's name for this kind of argument (`as_tensor`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Arg::None => "as_none",
            Arg::Tensor(_) => "as_tensor",
            Arg::Tensors(_) => "as_tensors",
            Arg::OptionalTensors(_) => "as_optional_tensors",
            Arg::Int(_) => "as_int",
            Arg::Ints(_) => "as_ints",
            Arg::SymInt(_) => "as_sym_int",
            Arg::SymInts(_) => "as_sym_ints",
            Arg::Float(_) => "as_float",
            Arg::Floats(_) => "as_floats",
            Arg::Bool(_) => "as_bool",
            Arg::Bools(_) => "as_bools",
            Arg::Str(_) => "as_string",
            Arg::Strs(_) => "as_strings",
            Arg::ScalarType(_) => "as_scalar_type",
            Arg::MemoryFormat(_) => "as_memory_format",
            Arg::Layout(_) => "as_layout",
            Arg::Device(_) => "as_device",
            Arg::Other(_) => "an unsupported argument kind",
        }
    }

    /// The tensor names this argument reads.
    pub fn tensor_names(&self) -> Vec<&str> {
        match self {
            Arg::Tensor(n) => vec![n],
            Arg::Tensors(v) => v.iter().map(String::as_str).collect(),
            Arg::OptionalTensors(v) => v.iter().flatten().map(String::as_str).collect(),
            Arg::SymInt(SymRef::Name(n)) => vec![n],
            Arg::SymInts(v) => v
                .iter()
                .filter_map(|s| match s {
                    SymRef::Name(n) => Some(n.as_str()),
                    SymRef::Int(_) => None,
                })
                .collect(),
            _ => vec![],
        }
    }
}

/// A node's argument with its schema name.
#[derive(Clone, Debug)]
pub struct NamedArg {
    /// The op schema's argument name (`input`, `weight`, `dim`).
    pub name: String,
    /// The value.
    pub arg: Arg,
}

/// One op call in the graph.
#[derive(Clone, Debug)]
pub struct Node {
    /// The node's name (its first output's name when the archive has none).
    pub name: String,
    /// The op, without `torch.ops.` (`aten.linear.default`).
    pub target: String,
    /// Its arguments in schema order.
    pub inputs: Vec<NamedArg>,
    /// What it defines.
    pub outputs: Vec<Arg>,
    /// The user's source line that made it (`model.py:12`), from the stack trace.
    pub source: Option<String>,
}

impl Node {
    /// The names of every value this node defines (tensor and symbolic outputs).
    pub fn output_names(&self) -> Vec<&str> {
        self.outputs.iter().flat_map(Arg::tensor_names).collect()
    }

    /// `, from model.py:12` or nothing.
    pub fn source_text(&self) -> String {
        self.source.as_ref().map(|s| format!(", from {s}")).unwrap_or_default()
    }
}

/// The graph of an exported program.
#[derive(Clone, Debug)]
pub struct Graph {
    /// Input names, in order.
    pub inputs: Vec<String>,
    /// Nodes in execution order.
    pub nodes: Vec<Node>,
    /// Output arguments, in order.
    pub outputs: Vec<Arg>,
    /// Every tensor value's metadata, by name.
    pub tensor_values: IndexMap<String, TensorMeta>,
}

/// What a graph input is.
#[derive(Clone, Debug, PartialEq)]
pub enum InputSpec {
    /// A user input: an argument of the call.
    User {
        /// The graph input's name.
        arg: String,
    },
    /// A parameter.
    Parameter {
        /// The graph input's name.
        arg: String,
        /// The PyTorch name (`layers.0.weight`).
        target: String,
    },
    /// A buffer.
    Buffer {
        /// The graph input's name.
        arg: String,
        /// The PyTorch name (`bn.running_mean`).
        target: String,
        /// Whether it is in the state dict.
        persistent: bool,
    },
    /// A lifted tensor constant.
    Constant {
        /// The graph input's name.
        arg: String,
        /// The constant's name in the archive.
        target: String,
    },
    /// A kind aotgrad does not import (`custom_obj`, `token`, `constant_input`).
    Unsupported {
        /// The kind.
        kind: String,
    },
}

/// What a graph output is.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputSpec {
    /// Returned to the caller.
    User {
        /// The value.
        arg: Arg,
    },
    /// The loss (returned to the caller).
    Loss {
        /// The value.
        arg: Arg,
    },
    /// A buffer's new value (written back into the buffer after the call).
    BufferMutation {
        /// The value.
        arg: String,
        /// The buffer.
        target: String,
    },
    /// A parameter's new value (written back into the parameter).
    ParameterMutation {
        /// The value.
        arg: String,
        /// The parameter.
        target: String,
    },
    /// A user input's new value (written back into the caller's tensor).
    UserInputMutation {
        /// The value.
        arg: String,
        /// The graph input's name.
        input: String,
    },
    /// A kind aotgrad does not import (gradients of a joint export, tokens).
    Unsupported {
        /// The kind.
        kind: String,
    },
}

/// A symbol's range.
#[derive(Clone, Debug, PartialEq)]
pub struct RangeConstraint {
    /// Lower bound (`None`: unbounded).
    pub min: Option<i64>,
    /// Upper bound (`None`: unbounded).
    pub max: Option<i64>,
}

pub(crate) struct Parsed {
    pub opset: IndexMap<String, i64>,
    pub graph: Graph,
    pub inputs: Vec<InputSpec>,
    pub outputs: Vec<OutputSpec>,
    pub range_constraints: IndexMap<String, RangeConstraint>,
}

type R<T> = Result<T, String>;

fn field<'a>(v: &'a Value, key: &str, what: &str) -> R<&'a Value> {
    v.get(key).ok_or_else(|| format!("{what} has no `{key}`"))
}

fn str_field(v: &Value, key: &str, what: &str) -> R<String> {
    field(v, key, what)?.as_str().map(str::to_string).ok_or_else(|| format!("{what}'s `{key}` is not a string"))
}

fn union(v: &Value, what: &str) -> R<(String, Value)> {
    let obj = v.as_object().ok_or_else(|| format!("{what} is not an object"))?;
    // A union has one set key; some writers also emit the others as null.
    let mut set = obj.iter().filter(|(_, v)| !v.is_null());
    match (set.next(), set.next()) {
        (Some((k, v)), None) => Ok((k.clone(), v.clone())),
        (None, _) if obj.len() == 1 => {
            let (k, v) = obj.iter().next().expect("one key");
            Ok((k.clone(), v.clone()))
        }
        _ => Err(format!("{what} is not a one-key union: {}", short(v))),
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 120 {
        format!("{}…", &s[..s.char_indices().take_while(|(i, _)| *i < 120).last().map_or(0, |(i, _)| i)])
    } else {
        s
    }
}

fn int(v: &Value, what: &str) -> R<i64> {
    v.as_i64().ok_or_else(|| format!("{what} is not an integer: {}", short(v)))
}

fn float(v: &Value, what: &str) -> R<f64> {
    match v {
        Value::String(s) => match s.as_str() {
            "Infinity" | "inf" => Ok(f64::INFINITY),
            "-Infinity" | "-inf" => Ok(f64::NEG_INFINITY),
            "NaN" | "nan" => Ok(f64::NAN),
            _ => Err(format!("{what} is not a number: {s}")),
        },
        _ => v.as_f64().ok_or_else(|| format!("{what} is not a number: {}", short(v))),
    }
}

fn list<'a>(v: &'a Value, what: &str) -> R<&'a Vec<Value>> {
    v.as_array().ok_or_else(|| format!("{what} is not a list"))
}

fn tensor_name(v: &Value, what: &str) -> R<String> {
    str_field(v, "name", what)
}

fn sym_ref(v: &Value, what: &str) -> R<SymRef> {
    let (k, x) = union(v, what)?;
    match k.as_str() {
        "as_name" => Ok(SymRef::Name(x.as_str().ok_or_else(|| format!("{what}: as_name is not a string"))?.into())),
        "as_int" => Ok(SymRef::Int(int(&x, what)?)),
        other => Err(format!("{what}: unknown symbolic int kind `{other}`")),
    }
}

/// Sympy's `Symbol('s77', positive=True, integer=True)` as `s77` (and `Integer(2)`
/// as `2`), so expressions read as PyTorch prints them and match range names.
fn plain_symbols(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    loop {
        let sym = rest.find("Symbol('");
        let int = rest.find("Integer(");
        let (at, is_sym) = match (sym, int) {
            (Some(a), Some(b)) if b < a => (b, false),
            (Some(a), _) => (a, true),
            (None, Some(b)) => (b, false),
            (None, None) => break,
        };
        out.push_str(&rest[..at]);
        // `Symbol('` and `Integer(` are both 8 bytes.
        let body = &rest[at + 8..];
        let (name, after) = if is_sym {
            match body.find('\'') {
                Some(q) => (&body[..q], &body[q..]),
                None => break,
            }
        } else {
            match body.find(')') {
                Some(q) => (&body[..q], &body[q..]),
                None => break,
            }
        };
        out.push_str(name);
        match after.find(')') {
            Some(close) => rest = &after[close + 1..],
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

fn sym_dim(v: &Value, what: &str) -> R<SymDim> {
    let (k, x) = union(v, what)?;
    match k.as_str() {
        "as_int" => Ok(SymDim::Int(int(&x, what)?)),
        "as_expr" => {
            let expr = plain_symbols(&str_field(&x, "expr_str", what)?);
            let hint = x.get("hint").and_then(|h| h.get("as_int")).and_then(Value::as_i64);
            Ok(SymDim::Expr(expr, hint))
        }
        other => Err(format!("{what}: unknown size kind `{other}`")),
    }
}

/// A `TensorMeta` object.
pub(crate) fn tensor_meta(v: &Value) -> R<TensorMeta> {
    let what = "tensor_meta";
    let dims =
        |key: &str| -> R<Vec<SymDim>> { list(field(v, key, what)?, key)?.iter().map(|d| sym_dim(d, key)).collect() };
    let offset = match v.get("storage_offset") {
        None => 0,
        Some(o) => match sym_dim(o, "storage_offset")? {
            SymDim::Int(i) if i >= 0 => i as usize,
            other => return Err(format!("storage offset `{other}` is not a non-negative number")),
        },
    };
    Ok(TensorMeta {
        dtype: int(field(v, "dtype", what)?, "dtype")?,
        sizes: dims("sizes")?,
        strides: dims("strides")?,
        storage_offset: offset,
        requires_grad: v.get("requires_grad").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// An `Argument` union.
pub(crate) fn argument(v: &Value) -> R<Arg> {
    let (k, x) = union(v, "an argument")?;
    let ints = |x: &Value| -> R<Vec<i64>> { list(x, &k)?.iter().map(|i| int(i, &k)).collect() };
    Ok(match k.as_str() {
        "as_none" => Arg::None,
        "as_tensor" => Arg::Tensor(tensor_name(&x, "as_tensor")?),
        "as_tensors" => Arg::Tensors(list(&x, &k)?.iter().map(|t| tensor_name(t, "as_tensors")).collect::<R<_>>()?),
        "as_optional_tensors" => Arg::OptionalTensors(
            list(&x, &k)?
                .iter()
                .map(|t| {
                    let (tk, tv) = union(t, "an optional tensor")?;
                    match tk.as_str() {
                        "as_tensor" => Ok(Some(tensor_name(&tv, "as_tensor")?)),
                        "as_none" => Ok(None),
                        o => Err(format!("unknown optional tensor kind `{o}`")),
                    }
                })
                .collect::<R<_>>()?,
        ),
        "as_optional_tensor" => {
            let (tk, tv) = union(&x, "an optional tensor")?;
            match tk.as_str() {
                "as_tensor" => Arg::Tensor(tensor_name(&tv, "as_tensor")?),
                _ => Arg::None,
            }
        }
        "as_int" => Arg::Int(int(&x, &k)?),
        "as_ints" => Arg::Ints(ints(&x)?),
        "as_sym_int" => match sym_ref(&x, &k)? {
            SymRef::Int(i) => Arg::Int(i),
            r => Arg::SymInt(r),
        },
        "as_sym_ints" => {
            let refs: Vec<SymRef> = list(&x, &k)?.iter().map(|s| sym_ref(s, &k)).collect::<R<_>>()?;
            if refs.iter().all(|r| matches!(r, SymRef::Int(_))) {
                Arg::Ints(refs.iter().map(|r| if let SymRef::Int(i) = r { *i } else { 0 }).collect())
            } else {
                Arg::SymInts(refs)
            }
        }
        "as_float" => Arg::Float(float(&x, &k)?),
        "as_floats" => Arg::Floats(list(&x, &k)?.iter().map(|f| float(f, &k)).collect::<R<_>>()?),
        "as_bool" => Arg::Bool(x.as_bool().ok_or("as_bool is not a bool")?),
        "as_bools" => Arg::Bools(
            list(&x, &k)?.iter().map(|b| b.as_bool().ok_or("as_bools holds a non-bool")).collect::<Result<_, _>>()?,
        ),
        "as_string" => Arg::Str(x.as_str().ok_or("as_string is not a string")?.into()),
        "as_strings" => Arg::Strs(
            list(&x, &k)?
                .iter()
                .map(|s| s.as_str().map(str::to_string).ok_or("as_strings holds a non-string"))
                .collect::<Result<_, _>>()?,
        ),
        "as_scalar_type" => Arg::ScalarType(int(&x, &k)?),
        "as_memory_format" => Arg::MemoryFormat(int(&x, &k)?),
        "as_layout" => Arg::Layout(int(&x, &k)?),
        "as_device" => {
            let ty = str_field(&x, "type", "as_device")?;
            match x.get("index").and_then(Value::as_i64) {
                Some(i) => Arg::Device(format!("{ty}:{i}")),
                None => Arg::Device(ty),
            }
        }
        other => Arg::Other(other.to_string()),
    })
}

/// The user's source line from a node's `stack_trace` metadata: the first frame
/// outside PyTorch's own files, as `file:line`.
fn source_line(stack: &str) -> Option<String> {
    let frames = stack.lines().filter_map(|l| {
        let l = l.trim();
        let rest = l.strip_prefix("File \"")?;
        let (file, rest) = rest.split_once('"')?;
        let line = rest.trim_start_matches(", line ").split(|c: char| !c.is_ascii_digit()).next()?;
        Some((file.to_string(), line.to_string()))
    });
    let frames: Vec<(String, String)> = frames.collect();
    let user = frames.iter().rev().find(|(f, _)| !f.contains("/torch/") && !f.contains("/torchvision/"));
    user.or(frames.last()).map(|(f, l)| format!("{f}:{l}"))
}

fn node(v: &Value) -> R<Node> {
    let target = str_field(v, "target", "a node")?;
    let target = target.strip_prefix("torch.ops.").unwrap_or(&target).to_string();
    let inputs = list(field(v, "inputs", "a node")?, "a node's inputs")?
        .iter()
        .map(|a| {
            Ok(NamedArg {
                name: str_field(a, "name", "a node input")?,
                arg: argument(field(a, "arg", "a node input")?).map_err(|e| format!("node of `{target}`: {e}"))?,
            })
        })
        .collect::<R<Vec<_>>>()?;
    let outputs = list(field(v, "outputs", "a node")?, "a node's outputs")?
        .iter()
        .map(|o| argument(o).map_err(|e| format!("node of `{target}`: {e}")))
        .collect::<R<Vec<_>>>()?;
    let meta = v.get("metadata");
    let source = meta.and_then(|m| m.get("stack_trace")).and_then(Value::as_str).and_then(source_line);
    let mut n = Node { name: String::new(), target, inputs, outputs, source };
    n.name = match v.get("name").and_then(Value::as_str) {
        Some(s) => s.to_string(),
        None => n.output_names().first().map_or_else(|| n.target.clone(), |s| s.to_string()),
    };
    Ok(n)
}

fn input_spec(v: &Value) -> R<InputSpec> {
    let (k, x) = union(v, "an input spec")?;
    let arg_name = |x: &Value| -> R<String> {
        let a = field(x, "arg", &k)?;
        // `{"name": ...}` (TensorArgument) or `{"as_tensor": {"name": ...}}` (Argument).
        match a.get("name") {
            Some(n) => n.as_str().map(str::to_string).ok_or_else(|| format!("{k}: arg name is not a string")),
            None => match argument(a)? {
                Arg::Tensor(n) => Ok(n),
                other => {
                    Err(format!("{k}: a user input of kind `{}` (only tensor inputs are supported)", other.kind()))
                }
            },
        }
    };
    Ok(match k.as_str() {
        "user_input" => InputSpec::User { arg: arg_name(&x)? },
        "parameter" => InputSpec::Parameter { arg: arg_name(&x)?, target: str_field(&x, "parameter_name", &k)? },
        "buffer" => InputSpec::Buffer {
            arg: arg_name(&x)?,
            target: str_field(&x, "buffer_name", &k)?,
            persistent: x.get("persistent").and_then(Value::as_bool).unwrap_or(true),
        },
        "tensor_constant" => {
            InputSpec::Constant { arg: arg_name(&x)?, target: str_field(&x, "tensor_constant_name", &k)? }
        }
        other => InputSpec::Unsupported { kind: other.into() },
    })
}

fn output_spec(v: &Value) -> R<OutputSpec> {
    let (k, x) = union(v, "an output spec")?;
    let name = |x: &Value| -> R<String> { str_field(field(x, "arg", &k)?, "name", &k) };
    Ok(match k.as_str() {
        "user_output" => OutputSpec::User { arg: argument(field(&x, "arg", &k)?)? },
        "loss_output" => {
            let a = field(&x, "arg", &k)?;
            OutputSpec::Loss { arg: if a.get("name").is_some() { Arg::Tensor(name(&x)?) } else { argument(a)? } }
        }
        "buffer_mutation" => OutputSpec::BufferMutation { arg: name(&x)?, target: str_field(&x, "buffer_name", &k)? },
        "parameter_mutation" => {
            OutputSpec::ParameterMutation { arg: name(&x)?, target: str_field(&x, "parameter_name", &k)? }
        }
        "user_input_mutation" => {
            OutputSpec::UserInputMutation { arg: name(&x)?, input: str_field(&x, "user_input_name", &k)? }
        }
        other => OutputSpec::Unsupported { kind: other.into() },
    })
}

/// The whole `models/model.json` object (its schema version already checked).
pub(crate) fn parse_program(v: &Value) -> R<Parsed> {
    let gm = field(v, "graph_module", "the program")?;
    let g = field(gm, "graph", "graph_module")?;
    let inputs = list(field(g, "inputs", "the graph")?, "graph inputs")?
        .iter()
        .map(|a| match argument(a)? {
            Arg::Tensor(n) => Ok(n),
            Arg::SymInt(SymRef::Name(n)) => Ok(n),
            other => Err(format!("a graph input of kind `{}`", other.kind())),
        })
        .collect::<R<Vec<_>>>()?;
    let nodes = list(field(g, "nodes", "the graph")?, "graph nodes")?.iter().map(node).collect::<R<Vec<_>>>()?;
    let outputs =
        list(field(g, "outputs", "the graph")?, "graph outputs")?.iter().map(argument).collect::<R<Vec<_>>>()?;
    let mut tensor_values = IndexMap::new();
    if let Some(tv) = g.get("tensor_values").and_then(Value::as_object) {
        for (name, m) in tv {
            tensor_values.insert(name.clone(), tensor_meta(m).map_err(|e| format!("tensor `{name}`: {e}"))?);
        }
    }
    let sig = field(gm, "signature", "graph_module")?;
    let input_specs = list(field(sig, "input_specs", "the signature")?, "input_specs")?
        .iter()
        .map(input_spec)
        .collect::<R<Vec<_>>>()?;
    let output_specs = list(field(sig, "output_specs", "the signature")?, "output_specs")?
        .iter()
        .map(output_spec)
        .collect::<R<Vec<_>>>()?;
    let mut range_constraints = IndexMap::new();
    if let Some(rc) = v.get("range_constraints").and_then(Value::as_object) {
        for (sym, r) in rc {
            let bound = |k: &str| r.get(k).and_then(Value::as_i64);
            range_constraints.insert(sym.clone(), RangeConstraint { min: bound("min_val"), max: bound("max_val") });
        }
    }
    let mut opset = IndexMap::new();
    if let Some(o) = v.get("opset_version").and_then(Value::as_object) {
        for (k, x) in o {
            opset.insert(k.clone(), x.as_i64().unwrap_or(0));
        }
    }
    Ok(Parsed {
        opset,
        graph: Graph { inputs, nodes, outputs, tensor_values },
        inputs: input_specs,
        outputs: output_specs,
        range_constraints,
    })
}
