//! An imported program as an aotgrad [`Module`]: parameters and buffers by their
//! PyTorch names in a [`ParamStore`], `forward` interpreting the exported graph with
//! aotgrad's tensor ops.
//!
//! Because `forward` only calls `Tensor` methods, the module runs eagerly
//! ([`Module::forward_eager`], with eager autograd) and compiles with
//! [`aot_module`](aotgrad_runtime::aot_module) through the whole pipeline
//! (trace, functionalization, joint graph, partition, kernel plan, cache) like a
//! module written in Rust; checkpoints are `aotgrad::nn::checkpoint`'s. A program
//! exported with dynamic sizes is compiled at the concrete sizes of each call (one
//! specialization per shape): several ops need concrete sizes while tracing.

use crate::archive::{scalar_type, ExportedProgram};
use crate::error::{ImportError, Result};
use crate::ops::{self, Call, OpFn, Value};
use crate::schema::{Arg, InputSpec, Node, OutputSpec, SymDim};
use aotgrad_ir::{AttributeCalls, SourceLoc};
use aotgrad_runtime::params::{Module, ParamStore, Params};
use aotgrad_trace::{no_grad, Tensor};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

/// A `torch.export` program imported as an aotgrad module.
///
/// ```no_run
/// use aotgrad::import::ImportedModule;
/// use aotgrad::prelude::*;
/// use std::sync::Arc;
///
/// let m = ImportedModule::load("model.pt2")?;
/// println!("{}", m.signature_text());
/// let x = Tensor::randn(&[4, 784], DType::F32, 0)?;
/// let eager = m.forward_eager(std::slice::from_ref(&x))?;
/// let compiled = aot_module(Arc::new(m), AotConfig::default())?;
/// let (outs, pending) = compiled.forward(std::slice::from_ref(&x))?;
/// let grads = pending.backward(&[outs[0].ones_like()?])?; // by PyTorch parameter name
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ImportedModule {
    program: Arc<ExportedProgram>,
    store: ParamStore,
    steps: Arc<Vec<OpFn>>,
    /// Each node's PyTorch source line: the ops it runs are recorded there, so traced
    /// graphs and errors point at the user's model code.
    locs: Arc<Vec<Option<SourceLoc>>>,
    /// Each graph output's write-back (a mutated buffer, parameter or input) is
    /// recorded at the line of the node that computed the new value.
    output_locs: Arc<Vec<Option<SourceLoc>>>,
}

impl std::fmt::Debug for ImportedModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedModule")
            .field("name", &self.program.name)
            .field("nodes", &self.program.graph.nodes.len())
            .field("params", &self.store.params().len())
            .field("buffers", &self.store.buffers().len())
            .finish()
    }
}

fn node_err(p: &ExportedProgram, n: &Node, msg: impl Into<String>) -> ImportError {
    ImportError::Node {
        path: p.path.clone(),
        node: n.name.clone(),
        op: n.target.clone(),
        src: n.source_text(),
        msg: msg.into(),
    }
}

/// The names a node's outputs bind, one per value its op returns (`None`: a value
/// the export does not name).
fn output_slots(n: &Node) -> Vec<Option<&str>> {
    let mut v = Vec::new();
    for o in &n.outputs {
        match o {
            Arg::Tensor(name) | Arg::SymInt(crate::schema::SymRef::Name(name)) => v.push(Some(name.as_str())),
            Arg::Tensors(names) => v.extend(names.iter().map(|x| Some(x.as_str()))),
            Arg::OptionalTensors(names) => v.extend(names.iter().map(|x| x.as_deref())),
            _ => v.push(None),
        }
    }
    v
}

impl ImportedModule {
    /// Read `path` (a `torch.export.save` archive) and map every node onto aotgrad's
    /// ops. Errors name the archive and, for an op aotgrad does not run, the node, its
    /// op and the user's source line.
    pub fn load(path: impl AsRef<Path>) -> Result<ImportedModule> {
        ImportedModule::new(ExportedProgram::read(path)?)
    }

    /// Map a parsed program onto aotgrad's ops.
    pub fn new(program: ExportedProgram) -> Result<ImportedModule> {
        let sig = |msg: String| ImportError::Signature { path: program.path.clone(), msg };
        // Every op known, every value defined before it is read, no output aotgrad
        // does not compute ever read.
        let mut defined: HashSet<&str> = program.graph.inputs.iter().map(String::as_str).collect();
        let mut unavailable: HashMap<&str, &Node> = HashMap::new();
        let mut steps = Vec::with_capacity(program.graph.nodes.len());
        let mut locs = Vec::with_capacity(program.graph.nodes.len());
        for n in &program.graph.nodes {
            let def = ops::lookup(&n.target).ok_or_else(|| {
                node_err(
                    &program,
                    n,
                    "aotgrad does not know this op (see the list of covered ATen ops in aotgrad-import's docs)",
                )
            })?;
            for a in &n.inputs {
                for used in a.arg.tensor_names() {
                    if let Some(by) = unavailable.get(used) {
                        return Err(node_err(
                            &program,
                            n,
                            format!(
                                "reads `{used}`, an output of `{}` ({}) that aotgrad does not compute",
                                by.name, by.target
                            ),
                        ));
                    }
                    if !defined.contains(used) {
                        return Err(node_err(&program, n, format!("reads `{used}`, which no earlier node defines")));
                    }
                }
                if let Arg::Other(kind) = &a.arg {
                    return Err(node_err(
                        &program,
                        n,
                        format!("argument `{}` is of kind `{kind}`, which aotgrad does not import", a.name),
                    ));
                }
            }
            for (k, slot) in output_slots(n).into_iter().enumerate() {
                if let Some(name) = slot {
                    if def.unavailable.contains(&k) {
                        unavailable.insert(name, n);
                    }
                    defined.insert(name);
                }
            }
            steps.push(def.run);
            locs.push(n.source.as_deref().and_then(|s| {
                let (file, line) = s.rsplit_once(':')?;
                Some(SourceLoc { file: Arc::from(file), line: line.parse().ok()?, col: 1 })
            }));
        }
        for (o, spec) in program.graph.outputs.iter().zip(&program.outputs) {
            for used in o.tensor_names() {
                if let Some(by) = unavailable.get(used) {
                    return Err(node_err(
                        &program,
                        by,
                        format!("the program returns `{used}`, an output aotgrad does not compute"),
                    ));
                }
                if !defined.contains(used) {
                    return Err(sig(format!("the program returns `{used}`, which no node defines")));
                }
            }
            if matches!(spec, OutputSpec::User { .. } | OutputSpec::Loss { .. }) && !matches!(o, Arg::Tensor(_)) {
                return Err(sig(format!("a user output of kind `{}`; aotgrad imports tensor outputs", o.kind())));
            }
        }
        let mut store = ParamStore::new();
        let add = |store: &mut ParamStore, name: &str, param: bool| -> Result<()> {
            let w = program.weights.get(name).ok_or_else(|| sig(format!("the archive holds no `{name}`")))?;
            let added =
                if param { store.add_param(name, w.tensor.clone()) } else { store.add_buffer(name, w.tensor.clone()) };
            added.map(drop).map_err(|e| sig(format!("`{name}`: {e}")))
        };
        for spec in &program.inputs {
            match spec {
                InputSpec::Parameter { target, arg } => {
                    // A parameter PyTorch froze (requires_grad=False) stays without
                    // gradient: it is held as a buffer.
                    let w = program
                        .weights
                        .get(target.as_str())
                        .ok_or_else(|| sig(format!("the archive holds no `{target}`")))?;
                    let frozen =
                        !w.requires_grad || program.graph.tensor_values.get(arg).is_some_and(|m| !m.requires_grad);
                    add(&mut store, target, !frozen)?;
                }
                InputSpec::Buffer { target, .. } | InputSpec::Constant { target, .. } => {
                    if store.get(target).is_none() {
                        add(&mut store, target, false)?;
                    }
                }
                InputSpec::User { .. } | InputSpec::Unsupported { .. } => {}
            }
        }
        let mut loc_of: HashMap<&str, &Option<SourceLoc>> = HashMap::new();
        for (n, loc) in program.graph.nodes.iter().zip(&locs) {
            for name in n.output_names() {
                loc_of.insert(name, loc);
            }
        }
        let output_locs: Vec<Option<SourceLoc>> = program
            .graph
            .outputs
            .iter()
            .map(|o| o.tensor_names().first().and_then(|n| loc_of.get(n).and_then(|l| (*l).clone())))
            .collect();
        Ok(ImportedModule {
            program: Arc::new(program),
            store,
            steps: Arc::new(steps),
            locs: Arc::new(locs),
            output_locs: Arc::new(output_locs),
        })
    }

    /// The parsed program.
    pub fn program(&self) -> &ExportedProgram {
        &self.program
    }

    /// The program's name (the archive's top folder).
    pub fn name(&self) -> &str {
        &self.program.name
    }

    /// The user inputs' names, in call order.
    pub fn input_names(&self) -> Vec<String> {
        self.program.user_inputs().into_iter().map(str::to_string).collect()
    }

    /// The signature as text: every input (parameters and buffers by PyTorch name,
    /// user inputs) and output with its dtype and shape, and symbolic ranges.
    pub fn signature_text(&self) -> String {
        let p = &self.program;
        let mut s = String::new();
        let opset: Vec<String> = p.opset.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            s,
            "program `{}`: exported by torch {}, schema {}.{}, {} dialect{}, {} nodes",
            p.name,
            if p.torch_version.is_empty() { "?" } else { &p.torch_version },
            p.schema_version.0,
            p.schema_version.1,
            p.dialect,
            if opset.is_empty() { String::new() } else { format!(" (opset {})", opset.join(", ")) },
            p.graph.nodes.len()
        );
        let _ = writeln!(
            s,
            "{} parameter tensor(s), {} elements; {} buffer(s)",
            self.store.params().len(),
            self.store.num_param_elements(),
            self.store.buffers().len()
        );
        let _ = writeln!(s, "inputs:");
        for spec in &p.inputs {
            let (kind, name, arg) = match spec {
                InputSpec::User { arg } => ("user input", arg.as_str(), arg.as_str()),
                InputSpec::Parameter { arg, target } => ("parameter", target.as_str(), arg.as_str()),
                InputSpec::Buffer { arg, target, persistent } => {
                    (if *persistent { "buffer" } else { "buffer (non-persistent)" }, target.as_str(), arg.as_str())
                }
                InputSpec::Constant { arg, target } => ("constant", target.as_str(), arg.as_str()),
                InputSpec::Unsupported { kind } => (kind.as_str(), "", ""),
            };
            let _ = writeln!(s, "  {kind:<12} {name:<40} {}", p.describe(arg));
        }
        let _ = writeln!(s, "outputs:");
        for (o, spec) in p.graph.outputs.iter().zip(&p.outputs) {
            let name = o.tensor_names().first().map_or_else(|| o.kind().to_string(), |n| n.to_string());
            let kind = match spec {
                OutputSpec::User { .. } => "user output".to_string(),
                OutputSpec::Loss { .. } => "loss".to_string(),
                OutputSpec::BufferMutation { target, .. } => format!("new value of buffer {target}"),
                OutputSpec::ParameterMutation { target, .. } => format!("new value of parameter {target}"),
                OutputSpec::UserInputMutation { input, .. } => format!("new value of user input {input}"),
                OutputSpec::Unsupported { kind } => kind.clone(),
            };
            let _ = writeln!(s, "  {kind:<12} {name:<40} {}", p.describe(&name));
        }
        if !p.range_constraints.is_empty() {
            let _ = writeln!(s, "symbolic sizes:");
            for (sym, r) in &p.range_constraints {
                let b = |v: Option<i64>| v.map_or_else(|| "∞".to_string(), |v| v.to_string());
                let _ = writeln!(s, "  {sym} in [{}, {}]", b(r.min), b(r.max));
            }
        }
        s
    }

    /// Check one user input against what the export recorded: its dtype, its fixed
    /// sizes, and its symbolic sizes against their ranges and against the value the
    /// same symbol took in earlier inputs (`seen`). A size that is itself symbolic (a
    /// dynamic trace) is not checked here.
    fn check_input(&self, name: &str, t: &Tensor, seen: &mut HashMap<String, i64>) -> std::result::Result<(), String> {
        let Some(meta) = self.program.graph.tensor_values.get(name) else { return Ok(()) };
        if let Ok(d) = scalar_type(meta.dtype) {
            if d != t.dtype() {
                return Err(format!("input `{name}` is {:?}, the program was exported with {d:?} ({meta})", t.dtype()));
            }
        }
        let shape: Vec<Option<i64>> = t.shape().iter().map(|d| d.as_const()).collect();
        let shown: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
        let wrong = || format!("input `{name}` has shape [{}], the program was exported for {meta}", shown.join(", "));
        if shape.len() != meta.sizes.len() {
            return Err(wrong());
        }
        for (have, want) in shape.iter().zip(&meta.sizes) {
            let Some(have) = *have else { continue };
            match want {
                SymDim::Int(v) if *v != have => return Err(wrong()),
                SymDim::Expr(sym, _) if self.program.range_constraints.contains_key(sym) => {
                    let r = &self.program.range_constraints[sym];
                    if r.min.is_some_and(|m| have < m) || r.max.is_some_and(|m| have > m) {
                        return Err(format!(
                            "input `{name}` has {have} for `{sym}`, outside its exported range [{}, {}]",
                            r.min.map_or("-∞".into(), |v| v.to_string()),
                            r.max.map_or("∞".into(), |v| v.to_string())
                        ));
                    }
                    match seen.get(sym) {
                        Some(&before) if before != have => {
                            return Err(format!(
                                "input `{name}` has {have} for `{sym}`, which an earlier input has as {before}"
                            ))
                        }
                        _ => {
                            seen.insert(sym.clone(), have);
                        }
                    }
                }
                // An expression of symbols (`2*s0`) is left to the ops.
                _ => {}
            }
        }
        Ok(())
    }

    fn call_error(&self, msg: String) -> aotgrad_runtime::Error {
        aotgrad_runtime::Error::Call { name: format!("imported program `{}`", self.program.name), msg }
    }
}

impl Module for ImportedModule {
    fn store(&self) -> &ParamStore {
        &self.store
    }

    fn forward(&self, p: &Params, inputs: &[Tensor]) -> aotgrad_runtime::Result<Vec<Tensor>> {
        let prog = &self.program;
        let user = prog.user_inputs();
        if inputs.len() != user.len() {
            return Err(self.call_error(format!(
                "takes {} input(s) ({}), got {}",
                user.len(),
                user.join(", "),
                inputs.len()
            )));
        }
        let mut env: HashMap<String, Value> = HashMap::with_capacity(prog.graph.nodes.len() * 2);
        let mut next_user = 0;
        let mut user_tensors: HashMap<&str, Tensor> = HashMap::new();
        let mut symbols: HashMap<String, i64> = HashMap::new();
        for spec in &prog.inputs {
            let (arg, t) = match spec {
                InputSpec::User { arg } => {
                    let t = inputs[next_user].clone();
                    next_user += 1;
                    self.check_input(arg, &t, &mut symbols).map_err(|m| self.call_error(m))?;
                    user_tensors.insert(arg.as_str(), t.clone());
                    (arg, t)
                }
                InputSpec::Parameter { arg, target }
                | InputSpec::Buffer { arg, target, .. }
                | InputSpec::Constant { arg, target } => (arg, p.get(target)?.clone()),
                InputSpec::Unsupported { kind } => {
                    return Err(self.call_error(format!("input kind `{kind}` is not supported")))
                }
            };
            env.insert(arg.clone(), Value::Tensor(t));
        }
        for ((n, run), loc) in prog.graph.nodes.iter().zip(self.steps.iter()).zip(self.locs.iter()) {
            let _at = loc.as_ref().map(|l| AttributeCalls::to(file!(), l.clone()));
            let out = run(&Call { node: n, env: &env }).map_err(|msg| {
                self.call_error(format!("node `{}` ({}){}: {msg}", n.name, n.target, n.source_text()))
            })?;
            let mut values = out.into_iter();
            for slot in output_slots(n) {
                match (slot, values.next()) {
                    (Some(name), Some(v)) => {
                        env.insert(name.to_string(), v);
                    }
                    (Some(name), None) => {
                        return Err(self.call_error(format!(
                            "node `{}` ({}) made no value for its output `{name}`",
                            n.name, n.target
                        )))
                    }
                    (None, _) => {}
                }
            }
            if values.next().is_some() {
                return Err(self
                    .call_error(format!("node `{}` ({}) made more outputs than the export lists", n.name, n.target)));
            }
        }
        let get = |name: &str| -> aotgrad_runtime::Result<Tensor> {
            match env.get(name) {
                Some(Value::Tensor(t)) => Ok(t.clone()),
                _ => Err(self.call_error(format!("output `{name}` is not a tensor the program computed"))),
            }
        };
        let mut outs = Vec::new();
        for ((o, spec), loc) in prog.graph.outputs.iter().zip(&prog.outputs).zip(self.output_locs.iter()) {
            let _at = loc.as_ref().map(|l| AttributeCalls::to(file!(), l.clone()));
            match spec {
                OutputSpec::User { .. } | OutputSpec::Loss { .. } => {
                    let Arg::Tensor(name) = o else {
                        return Err(self.call_error(format!("output of kind `{}`", o.kind())));
                    };
                    outs.push(get(name)?);
                }
                OutputSpec::BufferMutation { arg, target } | OutputSpec::ParameterMutation { arg, target } => {
                    // A new value for a buffer (batch norm's running statistics) or
                    // parameter is written back in place, outside autograd, as
                    // PyTorch's functionalized program does.
                    let new = get(arg)?;
                    let dst = p.get(target)?.clone();
                    no_grad(|| dst.copy_(&new))?;
                }
                OutputSpec::UserInputMutation { arg, input } => {
                    let new = get(arg)?;
                    let dst = user_tensors
                        .get(input.as_str())
                        .ok_or_else(|| self.call_error(format!("no user input `{input}`")))?;
                    dst.copy_(&new)?;
                }
                OutputSpec::Unsupported { kind } => {
                    return Err(self.call_error(format!("output kind `{kind}` is not supported")))
                }
            }
        }
        Ok(outs)
    }
}
