//! `aotgrad explain PROGRAM`: every stage of compiling one program.
//!
//! A program is a graph in the IR's text format ([`aotgrad::ir::text`]): its inputs
//! declare shapes, dtypes, strides and offsets, and inputs that share a storage id
//! (`#0`) alias each other. Directive comments before or inside it add what the
//! graph text does not say:
//!
//! ```text
//! # Input data mutation: `x` is doubled in place and the caller sees it.
//! #! requires_grad: w
//! graph(%0: f32[4, 3] #0 "x", %1: f32[3] #1 "w") {
//!   %2: f32[4, 3] #0 = inplace.mul(%0, 2.0)
//!   %3: f32[4, 3] #2 = mul(%2, %1)
//!   return (%3)
//! }
//! ```
//!
//! The program is *replayed* as a function (each node applied to tensors with
//! [`Tensor::apply_op`]) and compiled with `aot_function` on example inputs built from
//! the declarations (random values; aliasing inputs are views of one random base), so
//! what is printed is exactly what the library does with it: the traced graph, the
//! functional graph, the view/mutation metadata and calling convention, and — when an
//! input requires grad — the joint graph before and after simplification, the
//! forward and backward graphs, the saved values and recomputed ops; then the kernel
//! plan the compiled CPU backend runs for each graph.

use aotgrad::ir::text::{parse_graph, print_graph};
use aotgrad::ir::{DType, Dim, Graph, ValueId};
use aotgrad::meta::{ArgSlot, OutputKind};
use aotgrad::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

/// A program read from text.
#[derive(Clone, Debug)]
pub struct Program {
    /// The graph as written.
    pub graph: Graph,
    /// Names of the inputs that require grad.
    pub requires_grad: Vec<String>,
    /// The title: the file's first comment line, if any.
    pub title: Option<String>,
    /// The source location of each node (`file:line:col` of its line in the program),
    /// by the value it defines: what traced nodes and errors point at.
    pub node_locs: HashMap<u32, aotgrad::ir::SourceLoc>,
}

/// Parse a program: `#! requires_grad: a, b` directives, then the graph text.
/// Errors carry the file's line and column.
pub fn parse_program(text: &str, file: &str) -> Result<Program, String> {
    let mut requires_grad = Vec::new();
    let mut title = None;
    // The header's comment lines are blanked before the graph text is parsed (so
    // parse errors keep the file's line numbers).
    let mut body: Vec<&str> = text.lines().collect();
    let mut requires_grad_seen = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.starts_with('#') {
            body[i] = "";
        }
        if let Some(d) = t.strip_prefix("#!") {
            requires_grad_seen = true;
            let d = d.trim();
            match d.split_once(':') {
                Some(("requires_grad", names)) => {
                    requires_grad.extend(names.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()))
                }
                _ => {
                    return Err(format!(
                        "line {}, column 1: unknown directive `#! {d}` (known: `#! requires_grad: NAME, ...`)",
                        i + 1
                    ))
                }
            }
        } else if let Some(c) = t.strip_prefix('#') {
            // The leading comment lines form the title.
            let c = c.trim();
            match &mut title {
                None if !c.is_empty() => title = Some(c.to_string()),
                Some(t) if !c.is_empty() && !requires_grad_seen => {
                    t.push(' ');
                    t.push_str(c);
                }
                _ => {}
            }
        } else if !t.is_empty() {
            break;
        }
    }
    let graph = parse_graph(&body.join("\n")).map_err(|e| e.to_string())?;
    for n in &requires_grad {
        if !graph.inputs.iter().any(|i| &i.name == n) {
            let names: Vec<&str> = graph.inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(format!("`#! requires_grad: {n}`: the graph has no input named `{n}` (inputs: {names:?})"));
        }
    }
    let mut node_locs = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let id = t.strip_prefix('%').and_then(|r| r.split(':').next()).and_then(|n| n.parse::<u32>().ok());
        if let (Some(id), false) = (id, line.contains("graph(")) {
            let col = (line.len() - t.len() + 1) as u32;
            node_locs.insert(id, aotgrad::ir::SourceLoc { file: file.into(), line: i as u32 + 1, col });
        }
    }
    Ok(Program { graph, requires_grad, title, node_locs })
}

fn concrete(d: &Dim, what: &str) -> Result<usize, String> {
    match d {
        Dim::Const(v) if *v >= 0 => Ok(*v as usize),
        other => Err(format!("{what}: `{other}` — explain needs concrete, non-negative input sizes and strides")),
    }
}

/// Example inputs for the program's declarations: one random storage per storage id,
/// each input a strided view of it (so declared aliasing is real aliasing).
pub fn example_inputs(p: &Program) -> Result<Vec<Tensor>, String> {
    let g = &p.graph;
    // The elements each storage must hold.
    let mut extent: BTreeMap<u32, (usize, DType)> = BTreeMap::new();
    let mut layouts = Vec::new();
    for input in &g.inputs {
        let m = &input.meta;
        let what = format!("input `{}`", input.name);
        let shape: Vec<usize> = m.shape.iter().map(|d| concrete(d, &what)).collect::<Result<_, _>>()?;
        let strides: Vec<usize> = m.strides.iter().map(|d| concrete(d, &what)).collect::<Result<_, _>>()?;
        let offset = concrete(&m.offset, &what)?;
        let last = shape.iter().zip(&strides).map(|(&s, &st)| s.saturating_sub(1) * st).sum::<usize>();
        let need = if shape.contains(&0) { offset } else { offset + last + 1 };
        let e = extent.entry(input.storage.0).or_insert((0, m.dtype));
        if e.1 != m.dtype {
            return Err(format!(
                "input `{}` shares storage #{} with an input of another dtype",
                input.name, input.storage.0
            ));
        }
        e.0 = e.0.max(need);
        layouts.push((shape, strides, offset));
    }
    let mut bases = HashMap::new();
    for (k, (&id, &(len, dtype))) in extent.iter().enumerate() {
        let base = match dtype {
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Tensor::randn(&[len], dtype, 1000 + k as u64),
            _ => Tensor::zeros(&[len], dtype),
        }
        .map_err(|e| e.to_string())?;
        bases.insert(id, base);
    }
    let mut shared: HashMap<u32, usize> = HashMap::new();
    for i in &g.inputs {
        *shared.entry(i.storage.0).or_default() += 1;
    }
    let mut out = Vec::new();
    for (input, (shape, strides, offset)) in g.inputs.iter().zip(layouts) {
        let base = bases[&input.storage.0].clone();
        let rg = p.requires_grad.contains(&input.name);
        let t = if shared[&input.storage.0] == 1 {
            // A storage of its own: a leaf with the declared layout (it may require grad).
            let t = base.as_strided(&shape, &strides, offset).and_then(|v| v.detach()).map_err(|e| e.to_string())?;
            if rg {
                t.set_requires_grad(true).map_err(|e| format!("input `{}`: {e}", input.name))?;
            }
            t
        } else {
            // Inputs sharing a storage: views of one base. When one requires grad the
            // base is a non-leaf computed from a leaf (so in-place ops on the views are
            // legal, as for views of an intermediate in PyTorch).
            if rg && !base.is_requires_grad() {
                let leaf = base.detach().map_err(|e| e.to_string())?;
                leaf.set_requires_grad(true).map_err(|e| format!("input `{}`: {e}", input.name))?;
                let nonleaf = leaf.mul(1.0).map_err(|e| e.to_string())?;
                bases.insert(input.storage.0, nonleaf);
            }
            bases[&input.storage.0].as_strided(&shape, &strides, offset).map_err(|e| e.to_string())?
        };
        out.push(t);
    }
    Ok(out)
}

/// The program as a function of its inputs: every node applied in order, at the
/// program line that defines it.
fn replay(p: &Program, args: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
    let g = &p.graph;
    let mut env: HashMap<ValueId, Tensor> = HashMap::new();
    for (i, t) in g.inputs.iter().zip(args) {
        env.insert(i.id, t.clone());
    }
    let here = aotgrad::ir::SourceLoc::caller();
    for n in &g.nodes {
        let ins: Vec<&Tensor> = n
            .args
            .iter()
            .map(|a| env.get(a).ok_or_else(|| aotgrad::trace::Error::Internal(format!("%{} is undefined", a.0))))
            .collect::<Result<_, _>>()?;
        let loc = p.node_locs.get(&n.out.0).or(n.loc.as_ref()).unwrap_or(&here);
        let out = Tensor::apply_op(&n.op, &ins, loc)?;
        env.insert(n.out, out);
    }
    g.outputs
        .iter()
        .map(|o| env.get(o).cloned().ok_or_else(|| aotgrad::Error::Internal(format!("%{} is undefined", o.0))))
        .collect()
}

/// Everything `explain` found, as text sections and structured data.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Explanation {
    /// The program's title.
    pub title: Option<String>,
    /// The training path (an input requires grad) or the inference path.
    pub training: bool,
    /// `(section, text)` in order.
    pub sections: Vec<(String, String)>,
    /// Graphviz sources by file name (`joint.dot`, ...).
    #[serde(skip)]
    pub dots: Vec<(String, String)>,
    /// Stage times in seconds (not in the text: they vary run to run).
    pub compile_stages: Vec<(String, f64)>,
}

impl Explanation {
    /// The text form: each section under a `== title ==` line.
    pub fn text(&self) -> String {
        let mut s = String::new();
        if let Some(t) = &self.title {
            let _ = writeln!(s, "program: {t}");
        }
        for (title, body) in &self.sections {
            let _ = writeln!(s, "\n== {title} ==\n{}", body.trim_end());
        }
        s
    }

    /// Each compile stage's time, as a text section.
    pub fn stages_text(&self) -> String {
        let mut s = String::from("\n== compile stages ==\n");
        for (stage, t) in &self.compile_stages {
            let _ = writeln!(s, "{stage}: {:.3} ms", t * 1e3);
        }
        s
    }

    /// Write the Graphviz files into `dir` (created if missing).
    pub fn write_dots(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (name, dot) in &self.dots {
            let p = dir.join(name);
            std::fs::write(&p, dot).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        Ok(())
    }
}

fn meta_text(fz: &aotgrad::functionalize::Functionalized, names: &[String]) -> String {
    let m = &fz.meta;
    let mut s = String::from("inputs:\n");
    for (k, info) in m.inputs.iter().enumerate() {
        let name = names.get(k).map_or("(added by the trace)", String::as_str);
        let mut flags = Vec::new();
        if info.mutates_data {
            flags.push(if info.mutations_hidden_from_autograd {
                "data mutated (hidden from autograd)"
            } else {
                "data mutated"
            });
        }
        if info.mutates_metadata {
            flags.push("metadata mutated");
        }
        if info.requires_grad {
            flags.push("requires grad");
        }
        let flags = if flags.is_empty() { "unchanged".to_string() } else { flags.join(", ") };
        let _ = write!(s, "  {k} {name}: {flags}");
        if let Some(fm) = &info.final_meta {
            let _ = write!(s, "; final metadata {fm}");
        }
        s.push('\n');
    }
    s.push_str("outputs:\n");
    for (j, o) in m.outputs.iter().enumerate() {
        let kind = match &o.kind {
            OutputKind::NonAlias => "a new tensor".to_string(),
            OutputKind::IsInput(i) => format!("input {i} itself"),
            OutputKind::AliasOfInput(i) => format!("a view of input {i} (regenerated at run time)"),
            OutputKind::AliasOfIntermediate(b) => format!("a view of intermediate base {b}"),
            OutputKind::AliasOfOutput(i) => format!("a view of output {i}"),
            OutputKind::SameAs(i) => format!("the same tensor as output {i}"),
        };
        let rg = if o.requires_grad { ", requires grad" } else { "" };
        let _ = writeln!(s, "  {j}: {} — {kind}{rg}", o.meta);
    }
    let _ = writeln!(
        s,
        "graph outputs: {} updated input(s) {:?}, {} user output(s), {} intermediate base(s)",
        m.mutated_inputs.len(),
        m.mutated_inputs,
        m.outputs.len(),
        m.num_intermediate_bases
    );
    let conv = &fz.convention;
    s.push_str("calling convention:\n");
    for (k, slot) in conv.args.iter().enumerate() {
        let name = names.get(k).map_or("(added by the trace)", String::as_str);
        match slot {
            ArgSlot::Input(g) => {
                let _ = writeln!(s, "  {name} → graph input {g}");
            }
            ArgSlot::ViewOfBase { base } => {
                let b = &conv.bases[*base];
                let _ = writeln!(
                    s,
                    "  {name} → a view of synthetic base {base} (graph input {}: elements {}..{} of the shared storage)",
                    b.input,
                    b.offset,
                    b.offset + b.len
                );
            }
        }
    }
    s
}

fn plan_text(g: &Graph) -> String {
    match aotgrad_fusion::plan_graph(g) {
        Ok(plan) => {
            let extents: Option<Vec<usize>> = plan.buffers.iter().map(|b| aotgrad_fusion::extent(&b.layout)).collect();
            let slots = extents.map(|e| aotgrad_fusion::plan_slots(&plan, &e));
            aotgrad_fusion::print_plan(&plan, slots.as_ref())
        }
        Err(e) => format!("(runs on the reference interpreter: {e})\n"),
    }
}

/// Compile `program` and describe every stage.
pub fn explain(program: &Program) -> Result<Explanation, String> {
    let names: Vec<String> = program.graph.inputs.iter().map(|i| i.name.clone()).collect();
    let mut decl = String::new();
    for (i, input) in program.graph.inputs.iter().enumerate() {
        let rg = if program.requires_grad.contains(&input.name) { ", requires grad" } else { "" };
        let _ = writeln!(decl, "{i} \"{}\": {} storage #{}{rg}", input.name, input.meta, input.storage.0);
    }
    let p = program.clone();
    let make = || example_inputs(program);
    explain_function(program.title.clone(), names, decl, &make, move |a: &[Tensor]| replay(&p, a))
}

/// Explain any function: compile `f` with `aot_function` on the inputs `make`
/// builds (fresh ones per compile, since `f` may mutate them) and print every stage.
/// `names` name the inputs in graphs and metadata; `decl` describes them.
pub fn explain_function<F>(
    title: Option<String>,
    names: Vec<String>,
    mut decl: String,
    make: &dyn Fn() -> Result<Vec<Tensor>, String>,
    f: F,
) -> Result<Explanation, String>
where
    F: Fn(&[Tensor]) -> aotgrad::Result<Vec<Tensor>> + Clone + Send + Sync + 'static,
{
    let inputs = make()?;
    let training = inputs.iter().any(Tensor::is_requires_grad);
    let compile = |simplify: bool| -> Result<AotFunction, String> {
        let config =
            AotConfig { name: "explain".into(), simplify, arg_names: names.clone(), ..AotConfig::default().threads(1) };
        let f = aot_function(f.clone(), config).map_err(|e| e.to_string())?;
        // Fresh inputs per compile: the program may mutate them.
        let args = make()?;
        if training {
            f.forward(&args).map_err(|e| e.to_string())?;
        } else {
            f.call(&args).map_err(|e| e.to_string())?;
        }
        Ok(f)
    };
    let f = compile(true)?;
    drop(inputs);
    let mut sections = Vec::new();
    let path = if training { "training (an input requires grad)" } else { "inference (no input requires grad)" };
    let _ = writeln!(decl, "path: {path}");
    sections.push(("inputs".to_string(), decl));
    let traced = f.traced_graphs().into_iter().next().ok_or("nothing was compiled")?;
    sections.push(("traced graph".into(), print_graph(&traced)));
    let fz = f.functionalized().into_iter().next().ok_or("nothing was compiled")?;
    sections.push(("functional graph".into(), print_graph(&fz.graph)));
    sections.push(("view and mutation metadata".into(), meta_text(&fz, &names)));
    let mut dots = Vec::new();
    if training {
        let raw = compile(false)?;
        let joint = raw.joint_graphs().into_iter().next().ok_or("no joint graph")?;
        sections.push(("joint graph".into(), print_graph(&joint.graph)));
        let simplified = f.joint_graphs().into_iter().next().ok_or("no joint graph")?;
        sections.push(("simplified joint graph".into(), print_graph(&simplified.graph)));
        let (fw, bw, report) = f.training_graphs().into_iter().next().ok_or("no partition")?;
        sections.push(("forward graph".into(), print_graph(&fw)));
        sections.push(("backward graph".into(), print_graph(&bw)));
        sections.push(("saved values (min-cut partition)".into(), format!("{report}\n")));
        sections.push(("kernels: forward (compiled CPU backend)".into(), plan_text(&fw)));
        sections.push(("kernels: backward (compiled CPU backend)".into(), plan_text(&bw)));
        let saved: Vec<u32> = report.saved.iter().filter_map(|(d, _, _)| value_of(d)).collect();
        let recomputed: Vec<u32> = report.recomputed_ops.iter().filter_map(|d| value_of(d)).collect();
        dots.push(("joint.dot".into(), joint_dot(&simplified, &saved, &recomputed)));
        dots.push(("forward.dot".into(), graph_dot("forward", &fw)));
        dots.push(("backward.dot".into(), graph_dot("backward", &bw)));
    } else {
        sections.push(("kernels (compiled CPU backend)".into(), plan_text(&fz.graph)));
        dots.push(("functional.dot".into(), graph_dot("functional", &fz.graph)));
    }
    let compile_stages = f
        .compile_reports()
        .first()
        .map(|r| r.stages.iter().map(|(s, t)| (s.to_string(), *t)).collect())
        .unwrap_or_default();
    Ok(Explanation { title, training, sections, dots, compile_stages })
}

/// `%12 (mul)` → 12.
fn value_of(desc: &str) -> Option<u32> {
    desc.strip_prefix('%')?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn node_label(op: &str, v: u32, meta: &str) -> String {
    escape(&format!("%{v} {op}\n{meta}"))
}

/// A graph as Graphviz: inputs as boxes, nodes as ellipses, outputs double-circled.
pub fn graph_dot(name: &str, g: &Graph) -> String {
    let mut s = format!("digraph {name} {{\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n");
    for i in &g.inputs {
        let _ =
            writeln!(s, "  v{} [shape=box, label=\"{}\"];", i.id.0, node_label(&i.name, i.id.0, &i.meta.to_string()));
    }
    for n in &g.nodes {
        let out = if g.outputs.contains(&n.out) { ", peripheries=2" } else { "" };
        let _ =
            writeln!(s, "  v{} [label=\"{}\"{out}];", n.out.0, node_label(&n.op.name(), n.out.0, &n.meta.to_string()));
        for a in &n.args {
            let _ = writeln!(s, "  v{} -> v{};", a.0, n.out.0);
        }
    }
    s.push_str("}\n");
    s
}

/// The joint graph with the partition drawn on it: forward nodes blue, backward nodes
/// grey, tangent inputs green, saved values red with a bold border, forward nodes the
/// backward recomputes orange, and the edges that cross from forward to backward
/// (the cut) red.
pub fn joint_dot(joint: &aotgrad::autodiff::JointGraph, saved: &[u32], recomputed: &[u32]) -> String {
    let g = &joint.graph;
    let mut backward: HashMap<u32, bool> = HashMap::new();
    for (k, i) in g.inputs.iter().enumerate() {
        backward.insert(i.id.0, k >= joint.num_primals);
    }
    for n in &g.nodes {
        let b = n.args.iter().any(|a| backward.get(&a.0).copied().unwrap_or(false));
        backward.insert(n.out.0, b);
    }
    let mut s = String::from(
        "digraph joint {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10, style=filled];\n  \
         label=\"joint graph: blue forward, grey backward, red saved for backward (the cut), orange recomputed in the backward\";\n",
    );
    let style = |v: u32| -> &'static str {
        if saved.contains(&v) {
            "fillcolor=\"#f4a6a6\", color=red, penwidth=2.5"
        } else if recomputed.contains(&v) {
            "fillcolor=\"#ffd08a\""
        } else if backward[&v] {
            "fillcolor=\"#e0e0e0\""
        } else {
            "fillcolor=\"#bcd7f5\""
        }
    };
    for (k, i) in g.inputs.iter().enumerate() {
        let color = if k >= joint.num_primals { "fillcolor=\"#b9e6b9\"" } else { style(i.id.0) };
        let _ = writeln!(
            s,
            "  v{} [shape=box, {color}, label=\"{}\"];",
            i.id.0,
            node_label(&i.name, i.id.0, &i.meta.to_string())
        );
    }
    for n in &g.nodes {
        let v = n.out.0;
        let out = if g.outputs.contains(&n.out) { ", peripheries=2" } else { "" };
        let _ =
            writeln!(s, "  v{v} [{}{out}, label=\"{}\"];", style(v), node_label(&n.op.name(), v, &n.meta.to_string()));
        for a in &n.args {
            let cut = saved.contains(&a.0) && backward[&v];
            let _ = writeln!(s, "  v{} -> v{v}{};", a.0, if cut { " [color=red, penwidth=2]" } else { "" });
        }
    }
    s.push_str("}\n");
    s
}

/// Read, explain and (with `dot_dir`) write the DOT files.
pub fn explain_file(path: &Path, dot_dir: Option<&Path>) -> Result<Explanation, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = path.file_name().map_or_else(|| path.display().to_string(), |f| f.to_string_lossy().into_owned());
    let program = parse_program(&text, &file).map_err(|e| format!("{}: {e}", path.display()))?;
    let ex = explain(&program).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(dir) = dot_dir {
        ex.write_dots(dir)?;
    }
    Ok(ex)
}
