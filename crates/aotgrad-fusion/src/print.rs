//! The text form of a plan, for golden tests and debug logs.
//!
//! ```text
//! b0 = input 0 f32[4, 8]
//! b2 = output f32[4, 8] (slot -)
//! k0: pointwise [4, 8] f32 (4 nodes) -> b2
//!     r0 = load b0 strides [8, 1] offset 0
//!     r1 = sin r0
//!     store r3 -> b2 strides [8, 1] offset 0
//! ```
//! Accesses print as buffer, strides and offset over the kernel's iteration space.

use crate::buffers::SlotPlan;
use crate::plan::*;
use aotgrad_ir::Dim;
use std::fmt::Write;

fn dims(d: &[Dim]) -> String {
    d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

fn access(a: &Access) -> String {
    format!("b{} [{}]+{}", a.buf, dims(&a.strides), a.offset)
}

fn body(out: &mut String, b: &Body) {
    for (i, ins) in b.instrs.iter().enumerate() {
        let rhs = match ins {
            Instr::Load(l) => format!("load {}", access(&b.loads[*l])),
            Instr::Const(c) => format!("const {c}"),
            Instr::Unary(u, x) => format!("{} r{x}", u.name()),
            Instr::Binary(op, x, y) => format!("{} r{x}, r{y}", op.name()),
            Instr::Compare(op, x, y) => format!("{} r{x}, r{y}", op.name()),
            Instr::Where(c, x, y) => format!("where r{c}, r{x}, r{y}"),
            Instr::Clamp { x, min, max } => format!("clamp r{x}, {min:?}, {max:?}"),
            Instr::Round(d, x) => format!("round.{d} r{x}"),
        };
        let _ = writeln!(out, "    r{i} = {rhs}");
    }
}

fn pointwise(out: &mut String, p: &PointwiseKernel) {
    body(out, &p.body);
    for s in &p.stores {
        let _ = writeln!(out, "    store r{} -> {}", s.reg, access(&s.dst));
    }
}

/// One kernel's text, its header line starting with `label`.
fn kernel(out: &mut String, label: &str, k: &Kernel) {
    match k {
        Kernel::Pointwise(p) => {
            let _ =
                writeln!(out, "{label}: pointwise [{}] {} ({} nodes)", dims(&p.shape), p.body.compute.name(), p.nodes);
            pointwise(out, p);
        }
        Kernel::Reduce(r) => {
            let red: Vec<usize> = (0..r.reduced.len()).filter(|&d| r.reduced[d]).collect();
            let _ = writeln!(
                out,
                "{label}: reduce {} over {:?} of [{}] {} ({} nodes) -> {}",
                r.op.name(),
                red,
                dims(&r.shape),
                r.body.compute.name(),
                r.nodes,
                access(&r.dst)
            );
            body(out, &r.body);
        }
        Kernel::Matmul(m) => {
            let _ = writeln!(
                out,
                "{label}: matmul {} @ {} -> {} [{}]",
                access(&m.a),
                access(&m.b),
                access(&m.out),
                dims(&m.out.shape)
            );
            if let Some(e) = &m.epilogue {
                let _ = writeln!(out, "  epilogue [{}] {} ({} nodes)", dims(&e.shape), e.body.compute.name(), e.nodes);
                pointwise(out, e);
            }
        }
        Kernel::Rows(r) => {
            let _ = writeln!(
                out,
                "{label}: rows [{}] outer {} ({} stages, {} nodes)",
                dims(&r.shape),
                r.outer,
                r.stages.len(),
                k.nodes()
            );
            for (s, st) in r.stages.iter().enumerate() {
                let mut inner = String::new();
                kernel(&mut inner, &format!("s{s}"), st);
                for line in inner.lines() {
                    let _ = writeln!(out, "  {line}");
                }
            }
        }
        Kernel::Extern(e) => {
            let args: Vec<String> = e.args.iter().map(access).collect();
            let _ = writeln!(out, "{label}: extern {} ({}) -> b{} {}", e.op.name(), args.join(", "), e.out, e.meta);
        }
    }
}

/// Print `plan`; with `slots`, each intermediate shows its arena slot and the header
/// the arena and output bytes.
pub fn print_plan(plan: &KernelPlan, slots: Option<&SlotPlan>) -> String {
    let mut out = String::new();
    let nodes: usize = plan.graph_nodes;
    let _ = write!(out, "plan: {} nodes -> {} kernels", nodes, plan.kernels.len());
    if let Some(s) = slots {
        let _ = write!(
            out,
            ", {} slots, arena {} B (unshared {} B), outputs {} B, peak {} B",
            s.slots.len(),
            s.arena_bytes,
            s.unshared_bytes,
            s.output_bytes,
            s.peak_bytes()
        );
    }
    out.push('\n');
    for (i, b) in plan.buffers.iter().enumerate() {
        let kind = match &b.kind {
            BufferKind::Input(n) => format!("input {n}"),
            BufferKind::Updated(n) => format!("input {n} (updated in place)"),
            BufferKind::Intermediate => match slots.and_then(|s| s.slot_of[i]) {
                Some(s) => format!("slot {s}"),
                None => "intermediate".to_string(),
            },
            BufferKind::Output => "output".to_string(),
            BufferKind::Extern => "extern".to_string(),
        };
        let _ = writeln!(out, "b{i} = {kind} {}", b.layout);
    }
    for (i, k) in plan.kernels.iter().enumerate() {
        kernel(&mut out, &format!("k{i}"), k);
    }
    let outs: Vec<String> = plan.outputs.iter().map(|o| format!("b{} {}", o.buf, o.meta)).collect();
    let _ = writeln!(out, "outputs: {}", outs.join(", "));
    out
}

/// What a body computes, as its ops in order (`copy` when it only moves values,
/// `fill` when it only writes constants).
fn ops(b: &Body) -> String {
    let v: Vec<String> = b
        .instrs
        .iter()
        .filter_map(|ins| match ins {
            Instr::Load(_) | Instr::Const(_) => None,
            Instr::Unary(u, _) => Some(u.name().to_string()),
            Instr::Binary(op, ..) => Some(op.name().to_string()),
            Instr::Compare(op, ..) => Some(op.name().to_string()),
            Instr::Where(..) => Some("where".to_string()),
            Instr::Clamp { .. } => Some("clamp".to_string()),
            Instr::Round(d, _) => Some(format!("round.{d}")),
        })
        .collect();
    if v.is_empty() && b.loads.is_empty() {
        "fill".to_string()
    } else if v.is_empty() {
        "copy".to_string()
    } else {
        v.join(" ")
    }
}

fn summary_line(k: &Kernel) -> String {
    match k {
        Kernel::Pointwise(p) => {
            let stores = if p.stores.len() > 1 { format!(", {} stores", p.stores.len()) } else { String::new() };
            format!("pointwise {} over [{}]{stores}", ops(&p.body), dims(&p.shape))
        }
        Kernel::Reduce(r) => {
            let red: Vec<usize> = (0..r.reduced.len()).filter(|&d| r.reduced[d]).collect();
            let pro = if r.body.instrs.len() > 1 { format!(" of {}", ops(&r.body)) } else { String::new() };
            format!("{}{pro} over [{}] reducing {red:?}", r.op.name(), dims(&r.shape))
        }
        Kernel::Matmul(m) => {
            let epi = m.epilogue.as_ref().map(|e| format!(" + epilogue {}", ops(&e.body))).unwrap_or_default();
            format!("matmul [{}] x [{}]{epi}", dims(&m.a.shape), dims(&m.b.shape))
        }
        Kernel::Extern(e) => format!("extern {}", e.op.name()),
        Kernel::Rows(g) => {
            let stages: Vec<String> = g.stages.iter().map(summary_line).collect();
            format!("rows over [{}]: {}", dims(&g.shape), stages.join("; "))
        }
    }
}

/// One line per kernel saying what it fuses (`k3: rows over [8, 128]: amax over ...;
/// pointwise sub exp ...`), for golden tests of whole models and for logs.
pub fn plan_summary(plan: &KernelPlan) -> String {
    let mut out = String::new();
    for (i, k) in plan.kernels.iter().enumerate() {
        let _ = writeln!(out, "k{i}: {}", summary_line(k));
    }
    out
}
