//! Lowering of a concrete [`KernelPlan`] to WGSL compute shaders.
//!
//! Every fused kernel of the plan becomes one compute entry point whose sizes,
//! strides and offsets are constants of the shader (a dynamic graph is lowered once
//! per binding of its symbols, as on the CPU):
//!
//! * a pointwise chain: one invocation per element of its iteration space, the body
//!   evaluated in registers, every load and store index arithmetic over its base
//!   buffer;
//! * a reduction: one workgroup per output element; each invocation evaluates the
//!   prologue over a strided share of the reduced elements, then the workgroup
//!   combines the partial results in shared memory (a tree);
//! * a matmul / bmm: 64×64 output tiles per workgroup, operand tiles staged through
//!   workgroup memory, 4×4 outputs per invocation; a pointwise epilogue that reads the
//!   product at the output position is evaluated on the accumulators before they are
//!   stored (otherwise it runs as its own kernel right after);
//! * the stages of a row group run as consecutive kernels (each stage reads what an
//!   earlier one wrote only at the same row, so the order is all that matters);
//! * extern ops (no fused kernel covers them) run on the host through the reference
//!   kernels, their operands read back and their results uploaded when a GPU kernel
//!   reads them.
//!
//! Element types on the device: f32 as `f32`, bool as `u32` (0 / 1), i32 as `i32`.
//! The planner fuses only float and bool values, so integer tensors stay on the host
//! (extern ops); f64 / f16 / bf16 kernels are refused with an error naming the
//! kernel (WGSL has no f64; f16 needs `SHADER_F16`, which this backend does not use
//! yet).

use crate::WgpuError;
use aotgrad_fusion::{
    Access, Body, BufId, Compute, ExternKernel, Instr, Kernel, KernelPlan, MatmulKernel, PointwiseKernel, ReduceKernel,
};
use aotgrad_ir::{BinaryOp, CmpOp, DType, Dim, ReduceOp, UnaryOp};
use std::fmt::Write;

/// Invocations per workgroup of pointwise kernels.
const PW_GROUP: u64 = 256;
/// Invocations per workgroup of reductions (a power of two).
const RED_GROUP: u64 = 64;
/// Output tile of the matmul kernel (rows and columns); 16×16 invocations, 4×4 each.
const MM_TILE: u64 = 64;
/// Workgroups per dispatch dimension (WebGPU's guaranteed minimum limit).
pub(crate) const MAX_GROUPS: u64 = 65_535;

/// One step of a lowered plan.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Step {
    /// A compute shader dispatch.
    Gpu(GpuKernel),
    /// An op run on the host by the reference kernels.
    Host(Box<ExternKernel>),
}

/// A WGSL kernel and how to launch it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct GpuKernel {
    /// Entry point name (`k3_pointwise`).
    pub entry: String,
    /// What the kernel fuses, for kernel lists and logs.
    pub what: String,
    /// The shader source.
    pub wgsl: String,
    /// Binding `i` of group 0: a buffer of the plan and whether the kernel writes it.
    pub bindings: Vec<(BufId, bool)>,
    /// Workgroups to dispatch.
    pub groups: [u32; 3],
    /// Refuse to run when the reduction has no elements and no identity.
    pub needs_elements: Option<String>,
}

fn c(d: &Dim) -> Result<u64, WgpuError> {
    match d.as_const() {
        Some(v) if v >= 0 => Ok(v as u64),
        Some(v) => Err(WgpuError::Internal(format!("negative size or stride {v} in a bound plan"))),
        None => Err(WgpuError::Internal(format!("symbolic size {d} in a bound plan"))),
    }
}

/// `[2, 4, 16]`.
fn shape_str(ds: &[Dim]) -> String {
    let parts: Vec<String> = ds.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// What a body computes, or `copy` when it only moves values.
fn ops_or_copy(body: &Body) -> String {
    let ops = body_ops(body);
    if ops.is_empty() {
        "copy".into()
    } else {
        ops.join(" ")
    }
}

fn cs(ds: &[Dim]) -> Result<Vec<u64>, WgpuError> {
    ds.iter().map(c).collect()
}

/// WGSL element type of a device buffer of `dtype`.
pub(crate) fn elem_type(dtype: DType, what: &str) -> Result<&'static str, WgpuError> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::Bool => Ok("u32"),
        DType::I32 => Ok("i32"),
        DType::F64 => Err(WgpuError::Unsupported {
            what: what.to_string(),
            reason: "f64 values: WGSL has no 64-bit floats (cast to f32, or use the CPU backend)".into(),
        }),
        DType::F16 if f16_available() => Ok("f16"),
        DType::F16 => Err(WgpuError::Unsupported {
            what: what.to_string(),
            reason: format!(
                "f16 values need an adapter with SHADER_F16 (f16 arithmetic and 16-bit storage), and {} lacks it \
                 (cast to f32, or use the CPU backend)",
                crate::device::gpu().map_or_else(|_| "this adapter".to_string(), |g| g.summary.name.clone())
            ),
        }),
        DType::BF16 => Err(WgpuError::Unsupported {
            what: what.to_string(),
            reason: "bf16 values: WGSL has no bf16 type (cast to f32 or f16, or use the CPU backend)".into(),
        }),
        // i64 values live on the device as i32, checked when uploaded (`run`).
        DType::I64 => Ok("i32"),
    }
}

/// Whether the device takes f16 values (the adapter has `SHADER_F16`).
pub(crate) fn f16_available() -> bool {
    crate::device::gpu().is_ok_and(|g| g.summary.shader_f16)
}

/// Largest index any thread computes must fit in `u32`.
fn check_u32(v: u64, what: &str) -> Result<(), WgpuError> {
    if v > u32::MAX as u64 {
        return Err(WgpuError::Limit {
            what: what.to_string(),
            reason: format!("{v} elements or index positions exceed the 32-bit indices of WGSL"),
        });
    }
    Ok(())
}

/// Extent (elements spanned from index 0 of the buffer) of an access.
pub(crate) fn access_extent(a: &Access) -> Result<u64, WgpuError> {
    let shape = cs(&a.shape)?;
    if shape.contains(&0) {
        return Ok(0);
    }
    let strides = cs(&a.strides)?;
    let mut far = c(&a.offset)?;
    for (s, st) in shape.iter().zip(&strides) {
        far = far
            .checked_add((s - 1).checked_mul(*st).ok_or_else(|| WgpuError::Internal("index overflow".into()))?)
            .ok_or_else(|| WgpuError::Internal("index overflow".into()))?;
    }
    Ok(far + 1)
}

/// Buffers a kernel binds, in binding order, with their element types.
struct Binds {
    list: Vec<(BufId, bool, &'static str)>,
}

impl Binds {
    fn new() -> Binds {
        Binds { list: Vec::new() }
    }
    fn add(&mut self, a: &Access, write: bool, what: &str) -> Result<usize, WgpuError> {
        let ty = elem_type(a.dtype, what)?;
        if let Some(i) = self.list.iter().position(|(b, _, _)| *b == a.buf) {
            self.list[i].1 |= write;
            return Ok(i);
        }
        self.list.push((a.buf, write, ty));
        Ok(self.list.len() - 1)
    }
    fn slot(&self, buf: BufId) -> usize {
        self.list.iter().position(|(b, _, _)| *b == buf).unwrap_or(usize::MAX)
    }
    fn declare(&self, out: &mut String) {
        for (i, (_, write, ty)) in self.list.iter().enumerate() {
            let mode = if *write { "read_write" } else { "read" };
            let _ = writeln!(out, "@group(0) @binding({i}) var<storage, {mode}> b{i}: array<{ty}>;");
        }
    }
    fn bindings(&self) -> Vec<(BufId, bool)> {
        self.list.iter().map(|(b, w, _)| (*b, *w)).collect()
    }
}

/// Index expression of `a` for the index variables `vars` (one per dim, `None` for a
/// dim that is always 0).
fn index_expr(a: &Access, vars: &[Option<String>]) -> Result<String, WgpuError> {
    let strides = cs(&a.strides)?;
    if strides.len() != vars.len() {
        return Err(WgpuError::Internal(format!(
            "an access of rank {} in an iteration space of rank {}",
            strides.len(),
            vars.len()
        )));
    }
    let mut terms = vec![format!("{}u", c(&a.offset)?)];
    for (st, v) in strides.iter().zip(vars) {
        if let (Some(v), true) = (v, *st != 0) {
            terms.push(if *st == 1 { v.clone() } else { format!("{v} * {st}u") });
        }
    }
    Ok(terms.join(" + "))
}

/// Code decomposing the linear index `lin` over `shape` into `{prefix}{d}` variables.
fn decompose(out: &mut String, lin: &str, shape: &[u64], prefix: &str, indent: &str) -> Vec<Option<String>> {
    let mut vars: Vec<Option<String>> = vec![None; shape.len()];
    let live: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] > 1).collect();
    let _ = writeln!(out, "{indent}var rem_{prefix}: u32 = {lin};");
    for (n, &d) in live.iter().enumerate().rev() {
        let name = format!("{prefix}{d}");
        if n == 0 {
            let _ = writeln!(out, "{indent}let {name} = rem_{prefix};");
        } else {
            let _ = writeln!(out, "{indent}let {name} = rem_{prefix} % {}u;", shape[d]);
            let _ = writeln!(out, "{indent}rem_{prefix} = rem_{prefix} / {}u;", shape[d]);
        }
        vars[d] = Some(name);
    }
    vars
}

fn lit(v: f64) -> String {
    let f = v as f32;
    if f.is_finite() {
        format!("{f:?}f")
    } else {
        format!("bitcast<f32>({:#010x}u)", f.to_bits())
    }
}

/// f32 to f16 as the CPU rounds it: nearest even, overflow to ±inf (WGSL leaves a
/// conversion out of f16's range indeterminate, so overflow is made by doubling the
/// largest finite f16 at run time; naga cannot bitcast a u32 to f16 bits), NaN
/// converted as it is (IEEE hardware, lavapipe included, keeps it). Only in shaders
/// that enable f16.
const PRELUDE_F16: &str = r#"fn ag_f16(x: f32) -> f16 {
  // The largest finite f16 with x's sign; doubled at run time it overflows to inf.
  let m = f16(65504.0) * f16(select(1.0, -1.0, x < 0.0));
  if (abs(x) >= 65520.0) { return m + m; }
  if (ag_isnan(x)) { return f16(x); }
  return f16(clamp(x, -65504.0, 65504.0));
}
"#;

/// Helper functions every shader may call (unused ones are dropped by the compiler).
const PRELUDE: &str = r#"fn ag_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn ag_nan() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn ag_max(a: f32, b: f32) -> f32 { if (ag_isnan(a) || ag_isnan(b)) { return ag_nan(); } return max(a, b); }
fn ag_min(a: f32, b: f32) -> f32 { if (ag_isnan(a) || ag_isnan(b)) { return ag_nan(); } return min(a, b); }
fn ag_relu(x: f32) -> f32 { if (ag_isnan(x) || x > 0.0) { return x; } return 0.0; }
fn ag_sign(x: f32) -> f32 { if (x > 0.0) { return 1.0; } if (x < 0.0) { return -1.0; } return 0.0; }
fn ag_exp(x: f32) -> f32 { if (x > 88.72) { return bitcast<f32>(0x7f800000u); } return exp(x); }
fn ag_tanh(x: f32) -> f32 {
  if (ag_isnan(x)) { return x; }
  let a = min(abs(x), 20.0);
  if (a < 0.125) {
    let z2 = x * x;
    return x * (1.0 + z2 * (-0.33333334 + z2 * (0.13333334 + z2 * (-0.053968254 + z2 * 0.021869488))));
  }
  let t = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
  return select(t, -t, x < 0.0);
}
fn ag_sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + ag_exp(-x)); }
fn ag_erf(x: f32) -> f32 {
  if (ag_isnan(x)) { return x; }
  let a = abs(x);
  let z2 = x * x;
  if (a < 0.5) {
    return x * (1.1283792 + z2 * (-0.3761264 + z2 * (0.11283792 + z2 * (-0.02686617 + z2 * (0.00522378 + z2 * -0.000854832)))));
  }
  let t = 1.0 / (1.0 + 0.5 * a);
  let p = -1.2655122 + t * (1.0000237 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807
    + t * (-1.135204 + t * (1.4885159 + t * (-0.8221522 + t * 0.1708728))))))));
  let r = 1.0 - t * exp(-z2 + p);
  return select(r, -r, x < 0.0);
}
fn ag_log1p(x: f32) -> f32 {
  let u = 1.0 + x;
  if (u == 1.0) { return x; }
  if (ag_isnan(x) || x == bitcast<f32>(0x7f800000u)) { return log(u); }
  return log(u) * x / (u - 1.0);
}
fn ag_expm1(x: f32) -> f32 {
  if (abs(x) < 1e-5) { return x + 0.5 * x * x; }
  return ag_exp(x) - 1.0;
}
fn ag_pow(x: f32, y: f32) -> f32 {
  if (y == 0.0 || x == 1.0) { return 1.0; }
  if (ag_isnan(x) || ag_isnan(y)) { return ag_nan(); }
  if (y == 1.0) { return x; }
  if (y == 2.0) { return x * x; }
  if (y == 0.5 && x >= 0.0) { return sqrt(x); }
  let ax = abs(x);
  let inf = bitcast<f32>(0x7f800000u);
  if (ax == 1.0 && abs(y) == inf) { return 1.0; }
  let yi = y == floor(y) && abs(y) < 16777216.0;
  let odd = yi && (abs(y) % 2.0) == 1.0;
  var r: f32;
  if (ax == 0.0) {
    r = select(inf, 0.0, y > 0.0);
  } else if (ax == inf) {
    r = select(0.0, inf, y > 0.0);
  } else {
    r = exp2(y * log2(ax));
  }
  if (x < 0.0 || (x == 0.0 && bitcast<u32>(x) != 0u)) {
    if (x < 0.0 && !yi && abs(y) != inf) { return ag_nan(); }
    if (odd) { return -r; }
  }
  return r;
}
"#;

fn unary(op: UnaryOp, x: &str) -> String {
    use UnaryOp::*;
    match op {
        Neg => format!("-{x}"),
        Abs => format!("abs({x})"),
        Exp => format!("ag_exp({x})"),
        Log => format!("log({x})"),
        Sqrt => format!("sqrt({x})"),
        Rsqrt => format!("1.0 / sqrt({x})"),
        Sin => format!("sin({x})"),
        Cos => format!("cos({x})"),
        Tanh => format!("ag_tanh({x})"),
        Sigmoid => format!("ag_sigmoid({x})"),
        Relu => format!("ag_relu({x})"),
        Erf => format!("ag_erf({x})"),
        Reciprocal => format!("1.0 / {x}"),
        Sign => format!("ag_sign({x})"),
        LogicalNot => format!("select(0.0, 1.0, {x} == 0.0)"),
        Floor => format!("floor({x})"),
        Ceil => format!("ceil({x})"),
        Round => format!("round({x})"),
        Trunc => format!("trunc({x})"),
        Log1p => format!("ag_log1p({x})"),
        Expm1 => format!("ag_expm1({x})"),
    }
}

fn binary(op: BinaryOp, x: &str, y: &str) -> String {
    match op {
        BinaryOp::Add => format!("{x} + {y}"),
        BinaryOp::Sub => format!("{x} - {y}"),
        BinaryOp::Mul => format!("{x} * {y}"),
        BinaryOp::Div => format!("{x} / {y}"),
        BinaryOp::Pow => format!("ag_pow({x}, {y})"),
        BinaryOp::Maximum => format!("ag_max({x}, {y})"),
        BinaryOp::Minimum => format!("ag_min({x}, {y})"),
    }
}

fn compare(op: CmpOp, x: &str, y: &str) -> String {
    let o = match op {
        CmpOp::Eq => "==",
        CmpOp::Ne => "!=",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    };
    format!("select(0.0, 1.0, {x} {o} {y})")
}

/// What a body computes, as op names (`sin mul add relu`).
fn body_ops(body: &Body) -> Vec<String> {
    body.instrs
        .iter()
        .filter_map(|i| match i {
            Instr::Load(_) | Instr::Const(_) => None,
            Instr::Unary(op, _) => Some(op.name().to_string()),
            Instr::Binary(op, _, _) => Some(op.name().to_string()),
            Instr::Compare(op, _, _) => Some(op.name().to_string()),
            Instr::Where(..) => Some("where".into()),
            Instr::Clamp { .. } => Some("clamp".into()),
            Instr::Round(d, _) => Some(format!("to_{d}")),
        })
        .collect()
}

/// Emit the body's registers `r{n}`; `load` gives the expression of load `n`.
fn emit_body(
    out: &mut String,
    body: &Body,
    prefix: &str,
    indent: &str,
    what: &str,
    load: &mut dyn FnMut(usize) -> Result<String, WgpuError>,
) -> Result<(), WgpuError> {
    if body.compute != Compute::F32 {
        return Err(WgpuError::Unsupported {
            what: what.to_string(),
            reason: format!("{} arithmetic: WGSL has no 64-bit floats (cast to f32)", body.compute.name()),
        });
    }
    let r = |i: usize| format!("{prefix}{i}");
    for (n, ins) in body.instrs.iter().enumerate() {
        let e = match ins {
            Instr::Load(l) => load(*l)?,
            Instr::Const(v) => lit(*v),
            Instr::Unary(op, a) => unary(*op, &r(*a)),
            Instr::Binary(op, a, b) => binary(*op, &r(*a), &r(*b)),
            Instr::Compare(op, a, b) => compare(*op, &r(*a), &r(*b)),
            Instr::Where(cnd, a, b) => format!("select({}, {}, {} != 0.0)", r(*b), r(*a), r(*cnd)),
            Instr::Clamp { x, min, max } => {
                let mut e = r(*x);
                if let Some(lo) = min {
                    e = format!("max({e}, {})", lit(*lo));
                }
                if let Some(hi) = max {
                    e = format!("min({e}, {})", lit(*hi));
                }
                format!("select({e}, {}, ag_isnan({}))", r(*x), r(*x))
            }
            Instr::Round(DType::F32, a) => r(*a),
            Instr::Round(DType::F16, a) if f16_available() => format!("f32(ag_f16({}))", r(*a)),
            Instr::Round(DType::Bool, a) => format!("select(0.0, 1.0, {} != 0.0)", r(*a)),
            Instr::Round(d, _) => {
                return Err(WgpuError::Unsupported {
                    what: what.to_string(),
                    reason: format!(
                        "rounding to {d}: the device holds no {d} values (f16 needs an adapter with SHADER_F16; \
                         WGSL has no bf16)"
                    ),
                })
            }
        };
        let _ = writeln!(out, "{indent}let {} = {e};", r(n));
    }
    Ok(())
}

fn load_expr(binds: &Binds, a: &Access, vars: &[Option<String>]) -> Result<String, WgpuError> {
    let idx = index_expr(a, vars)?;
    let b = binds.slot(a.buf);
    Ok(match a.dtype {
        DType::F32 => format!("b{b}[{idx}]"),
        _ => format!("f32(b{b}[{idx}])"),
    })
}

fn store_stmt(binds: &Binds, a: &Access, vars: &[Option<String>], reg: &str) -> Result<String, WgpuError> {
    let idx = index_expr(a, vars)?;
    let b = binds.slot(a.buf);
    let v = match a.dtype {
        DType::F32 => reg.to_string(),
        DType::F16 => format!("ag_f16({reg})"),
        DType::Bool => format!("select(0u, 1u, {reg} != 0.0)"),
        _ => format!("i32({reg})"),
    };
    Ok(format!("b{b}[{idx}] = {v};"))
}

/// Workgroup counts covering `n` groups, as 2-D when one dimension is not enough.
fn grid(n: u64, what: &str) -> Result<[u32; 3], WgpuError> {
    if n <= MAX_GROUPS {
        return Ok([n as u32, 1, 1]);
    }
    let y = n.div_ceil(MAX_GROUPS);
    if y > MAX_GROUPS {
        return Err(WgpuError::Limit {
            what: what.to_string(),
            reason: format!("{n} workgroups exceed the {MAX_GROUPS}×{MAX_GROUPS} a dispatch may launch"),
        });
    }
    Ok([MAX_GROUPS as u32, y as u32, 1])
}

fn lower_pointwise(p: &PointwiseKernel, entry: &str) -> Result<GpuKernel, WgpuError> {
    let what = format!("pointwise {} over {}", ops_or_copy(&p.body), shape_str(&p.shape));
    let shape = cs(&p.shape)?;
    let n: u64 = shape.iter().product();
    check_u32(n, &what)?;
    let mut binds = Binds::new();
    for l in &p.body.loads {
        binds.add(l, false, &what)?;
        check_u32(access_extent(l)?, &what)?;
    }
    for s in &p.stores {
        binds.add(&s.dst, true, &what)?;
        check_u32(access_extent(&s.dst)?, &what)?;
    }
    let groups = grid(n.div_ceil(PW_GROUP), &what)?;
    let span = groups[0] as u64 * PW_GROUP;
    let mut src = String::new();
    binds.declare(&mut src);
    let _ = writeln!(src, "\n@compute @workgroup_size({PW_GROUP})");
    let _ = writeln!(src, "fn {entry}(@builtin(global_invocation_id) gid: vec3<u32>) {{");
    let _ = writeln!(src, "  let lin = gid.x + gid.y * {span}u;");
    let _ = writeln!(src, "  if (lin >= {n}u) {{ return; }}");
    let vars = decompose(&mut src, "lin", &shape, "i", "  ");
    emit_body(&mut src, &p.body, "r", "  ", &what, &mut |l| load_expr(&binds, &p.body.loads[l], &vars))?;
    for s in &p.stores {
        let _ = writeln!(src, "  {}", store_stmt(&binds, &s.dst, &vars, &format!("r{}", s.reg))?);
    }
    src.push_str("}\n");
    Ok(GpuKernel { entry: entry.into(), what, wgsl: src, bindings: binds.bindings(), groups, needs_elements: None })
}

fn lower_reduce(r: &ReduceKernel, entry: &str) -> Result<GpuKernel, WgpuError> {
    let ops = body_ops(&r.body);
    let what = format!(
        "reduce {}{}{} over {} reducing {:?}",
        r.op.name(),
        if ops.is_empty() { "" } else { " of " },
        ops.join(" "),
        shape_str(&r.shape),
        (0..r.reduced.len()).filter(|&d| r.reduced[d]).collect::<Vec<_>>()
    );
    let shape = cs(&r.shape)?;
    if r.reduced.len() != shape.len() {
        return Err(WgpuError::Internal("reduced flags do not match the iteration space".into()));
    }
    let kept: Vec<u64> = shape.iter().zip(&r.reduced).map(|(s, red)| if *red { 1 } else { *s }).collect();
    let red: Vec<u64> = shape.iter().zip(&r.reduced).map(|(s, red)| if *red { *s } else { 1 }).collect();
    let n_out: u64 = kept.iter().product();
    let n_red: u64 = red.iter().product();
    check_u32(n_out.saturating_mul(n_red.max(1)), &what)?;
    let mut binds = Binds::new();
    for l in &r.body.loads {
        binds.add(l, false, &what)?;
        check_u32(access_extent(l)?, &what)?;
    }
    binds.add(&r.dst, true, &what)?;
    check_u32(access_extent(&r.dst)?, &what)?;
    if !matches!(r.dst.dtype, DType::F32 | DType::F16) {
        return Err(WgpuError::Unsupported { what, reason: format!("a {} result", r.dst.dtype) });
    }
    let groups = grid(n_out, &what)?;
    let (init, comb) = match r.op {
        ReduceOp::Sum | ReduceOp::Mean => ("0.0".to_string(), "a + b"),
        ReduceOp::Amax => (lit(f64::NEG_INFINITY), "ag_max(a, b)"),
        ReduceOp::Amin => (lit(f64::INFINITY), "ag_min(a, b)"),
    };
    let mut src = String::new();
    binds.declare(&mut src);
    let _ = writeln!(src, "var<workgroup> part: array<f32, {RED_GROUP}>;");
    let _ = writeln!(src, "fn comb(a: f32, b: f32) -> f32 {{ return {comb}; }}");
    let _ = writeln!(src, "\n@compute @workgroup_size({RED_GROUP})");
    let _ = writeln!(
        src,
        "fn {entry}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{"
    );
    let _ = writeln!(src, "  let o = wid.x + wid.y * {}u;", groups[0]);
    let _ = writeln!(src, "  if (o >= {n_out}u) {{ return; }}");
    let kvars = decompose(&mut src, "o", &kept, "k", "  ");
    let _ = writeln!(src, "  var acc: f32 = {init};");
    let _ = writeln!(src, "  for (var j: u32 = lid.x; j < {n_red}u; j = j + {RED_GROUP}u) {{");
    let rvars = decompose(&mut src, "j", &red, "q", "    ");
    let vars: Vec<Option<String>> = kvars.iter().zip(&rvars).map(|(k, q)| k.clone().or_else(|| q.clone())).collect();
    let last =
        r.body.instrs.len().checked_sub(1).ok_or_else(|| WgpuError::Internal("an empty reduction body".into()))?;
    emit_body(&mut src, &r.body, "r", "    ", &what, &mut |l| load_expr(&binds, &r.body.loads[l], &vars))?;
    let _ = writeln!(src, "    acc = comb(acc, r{last});");
    src.push_str("  }\n  part[lid.x] = acc;\n  workgroupBarrier();\n");
    let _ = writeln!(src, "  for (var s: u32 = {}u; s > 0u; s = s >> 1u) {{", RED_GROUP / 2);
    src.push_str(
        "    if (lid.x < s) { part[lid.x] = comb(part[lid.x], part[lid.x + s]); }\n    workgroupBarrier();\n  }\n",
    );
    let fin = match r.op {
        // The mean of nothing is NaN (not left to a division by zero).
        ReduceOp::Mean if n_red == 0 => "ag_nan()".to_string(),
        ReduceOp::Mean => format!("part[0] / {}", lit(n_red as f64)),
        _ => "part[0]".into(),
    };
    let _ = writeln!(src, "  if (lid.x == 0u) {{ {} }}", store_stmt(&binds, &r.dst, &kvars, &fin)?);
    src.push_str("}\n");
    let needs_elements = (n_red == 0 && n_out > 0 && matches!(r.op, ReduceOp::Amax | ReduceOp::Amin)).then(|| {
        let at = r.loc.as_ref().map_or_else(String::new, |l| format!("{l}: "));
        format!(
            "{at}{} ({}): cannot reduce over a dimension of size 0 (the operation has no identity)",
            r.op.name(),
            r.value
        )
    });
    Ok(GpuKernel { entry: entry.into(), what, wgsl: src, bindings: binds.bindings(), groups, needs_elements })
}

/// How an epilogue runs on the accumulators of the product, when it can.
#[derive(Clone, Copy, PartialEq)]
enum EpilogueFusion {
    /// It iterates over the product's shape and reads the product at the same index.
    SameSpace,
    /// It iterates over another shape of as many elements (a reshape of the
    /// contiguous product) and reads the product row-major over that shape: the
    /// output's linear index, decomposed over the epilogue's shape, indexes it.
    Reshaped,
}

/// Whether the epilogue reads the product only at the output position (so it can run
/// on the accumulators), and how its index follows from the output's.
fn epilogue_fusion(m: &MatmulKernel, e: &PointwiseKernel) -> Option<EpilogueFusion> {
    if e.stores.iter().any(|s| s.dst.buf == m.out.buf) {
        return None;
    }
    let reads = || e.body.loads.iter().filter(|l| l.buf == m.out.buf);
    if e.shape == m.out.shape && reads().all(|l| l.strides == m.out.strides && l.offset == m.out.offset) {
        return Some(EpilogueFusion::SameSpace);
    }
    let numel = |s: &[Dim]| cs(s).ok().map(|v| v.iter().product::<u64>());
    let contiguous = |shape: &[Dim], strides: &[Dim]| *aotgrad_ir::contiguous_strides(shape) == *strides;
    let ok = numel(&e.shape).is_some()
        && numel(&e.shape) == numel(&m.out.shape)
        && contiguous(&m.out.shape, &m.out.strides)
        && m.out.offset == Dim::Const(0)
        && reads().all(|l| l.offset == Dim::Const(0) && contiguous(&e.shape, &l.strides));
    ok.then_some(EpilogueFusion::Reshaped)
}

fn lower_matmul(m: &MatmulKernel, entry: &str, plan: &KernelPlan, kernel: usize) -> Result<Vec<GpuKernel>, WgpuError> {
    let a_shape = cs(&m.a.shape)?;
    let b_shape = cs(&m.b.shape)?;
    let o_shape = cs(&m.out.shape)?;
    let what_mm = format!("matmul {} x {}", shape_str(&m.a.shape), shape_str(&m.b.shape));
    let rank = o_shape.len();
    if !(rank == 2 || rank == 3) || a_shape.len() != rank || b_shape.len() != rank {
        return Err(WgpuError::Internal(format!("{what_mm}: operands of rank {rank}")));
    }
    let (batch, n, k, mm) =
        (if rank == 3 { o_shape[0] } else { 1 }, a_shape[rank - 2], a_shape[rank - 1], b_shape[rank - 1]);
    let fusion = m.epilogue.as_ref().and_then(|e| epilogue_fusion(m, e));
    let fused = m.epilogue.as_ref().filter(|_| fusion.is_some());
    let what = match (&m.epilogue, fused) {
        (Some(e), Some(_)) => format!("{what_mm} + epilogue {}", ops_or_copy(&e.body)),
        _ => what_mm.clone(),
    };
    let mut binds = Binds::new();
    for acc in [&m.a, &m.b] {
        binds.add(acc, false, &what)?;
        check_u32(access_extent(acc)?, &what)?;
    }
    if !matches!(m.a.dtype, DType::F32 | DType::F16) || m.b.dtype != m.a.dtype {
        return Err(WgpuError::Unsupported {
            what,
            reason: format!("{} x {} operands: WGSL matmuls take f32 or f16", m.a.dtype, m.b.dtype),
        });
    }
    // The product itself is stored unless only the fused epilogue reads it.
    let only_epilogue = fused.is_some()
        && plan
            .buffers
            .get(m.out.buf)
            .is_some_and(|b| b.kind == aotgrad_fusion::BufferKind::Intermediate && b.last_use == Some(kernel))
        && !plan.outputs.iter().any(|o| o.buf == m.out.buf);
    if !only_epilogue {
        binds.add(&m.out, true, &what)?;
        check_u32(access_extent(&m.out)?, &what)?;
    }
    if let Some(e) = fused {
        for l in e.body.loads.iter().filter(|l| l.buf != m.out.buf) {
            binds.add(l, false, &what)?;
            check_u32(access_extent(l)?, &what)?;
        }
        for s in &e.stores {
            binds.add(&s.dst, true, &what)?;
            check_u32(access_extent(&s.dst)?, &what)?;
        }
    }
    check_u32(batch * n * mm, &what)?;
    let gx = mm.div_ceil(MM_TILE);
    let gy = n.div_ceil(MM_TILE);
    if gx > MAX_GROUPS || gy > MAX_GROUPS || batch > MAX_GROUPS {
        return Err(WgpuError::Limit {
            what,
            reason: "the product needs more workgroups than a dispatch allows".into(),
        });
    }
    let st = |a: &Access| -> Result<Vec<u64>, WgpuError> { cs(&a.strides) };
    let (sa, sb) = (st(&m.a)?, st(&m.b)?);
    let (a_off, b_off) = (c(&m.a.offset)?, c(&m.b.offset)?);
    let (asb, asn, ask) = if rank == 3 { (sa[0], sa[1], sa[2]) } else { (0, sa[0], sa[1]) };
    let (bsb, bsk, bsm) = if rank == 3 { (sb[0], sb[1], sb[2]) } else { (0, sb[0], sb[1]) };
    let (ba, bb) = (binds.slot(m.a.buf), binds.slot(m.b.buf));
    let mut src = String::new();
    binds.declare(&mut src);
    src.push_str("var<workgroup> ta: array<f32, 1024>;\nvar<workgroup> tb: array<f32, 1024>;\n");
    let _ = writeln!(src, "\n@compute @workgroup_size(16, 16)");
    let _ = writeln!(
        src,
        "fn {entry}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{"
    );
    src.push_str("  let z = wid.z;\n  let row0 = wid.y * 64u;\n  let col0 = wid.x * 64u;\n");
    src.push_str("  let tid = lid.y * 16u + lid.x;\n  var acc: array<f32, 16>;\n");
    src.push_str("  for (var t: u32 = 0u; t < 16u; t = t + 1u) { acc[t] = 0.0; }\n");
    let _ = writeln!(src, "  for (var k0: u32 = 0u; k0 < {k}u; k0 = k0 + 16u) {{");
    src.push_str("    for (var e: u32 = 0u; e < 4u; e = e + 1u) {\n      let li = tid + e * 256u;\n");
    src.push_str("      let ar = li / 16u;\n      let ak = li % 16u;\n");
    let _ = writeln!(src, "      var va: f32 = 0.0;\n      if (row0 + ar < {n}u && k0 + ak < {k}u) {{");
    let _ = writeln!(
        src,
        "        va = f32(b{ba}[{a_off}u + z * {asb}u + (row0 + ar) * {asn}u + (k0 + ak) * {ask}u]);\n      }}"
    );
    src.push_str("      ta[ak * 64u + ar] = va;\n      let bk = li / 64u;\n      let bc = li % 64u;\n");
    let _ = writeln!(src, "      var vb: f32 = 0.0;\n      if (k0 + bk < {k}u && col0 + bc < {mm}u) {{");
    let _ = writeln!(
        src,
        "        vb = f32(b{bb}[{b_off}u + z * {bsb}u + (k0 + bk) * {bsk}u + (col0 + bc) * {bsm}u]);\n      }}"
    );
    src.push_str("      tb[bk * 64u + bc] = vb;\n    }\n    workgroupBarrier();\n");
    src.push_str("    for (var kk: u32 = 0u; kk < 16u; kk = kk + 1u) {\n");
    src.push_str("      let a0 = ta[kk * 64u + lid.y * 4u];\n      let a1 = ta[kk * 64u + lid.y * 4u + 1u];\n");
    src.push_str("      let a2 = ta[kk * 64u + lid.y * 4u + 2u];\n      let a3 = ta[kk * 64u + lid.y * 4u + 3u];\n");
    src.push_str(
        "      for (var j: u32 = 0u; j < 4u; j = j + 1u) {\n        let bv = tb[kk * 64u + lid.x * 4u + j];\n",
    );
    src.push_str("        acc[j] = acc[j] + a0 * bv;\n        acc[4u + j] = acc[4u + j] + a1 * bv;\n");
    src.push_str("        acc[8u + j] = acc[8u + j] + a2 * bv;\n        acc[12u + j] = acc[12u + j] + a3 * bv;\n");
    src.push_str("      }\n    }\n    workgroupBarrier();\n  }\n");
    src.push_str("  for (var i: u32 = 0u; i < 4u; i = i + 1u) {\n    for (var j: u32 = 0u; j < 4u; j = j + 1u) {\n");
    src.push_str("      let row = row0 + lid.y * 4u + i;\n      let col = col0 + lid.x * 4u + j;\n");
    let _ = writeln!(src, "      if (row < {n}u && col < {mm}u) {{");
    src.push_str("        let v = acc[i * 4u + j];\n");
    let vars: Vec<Option<String>> = if rank == 3 {
        vec![Some("z".into()), Some("row".into()), Some("col".into())]
    } else {
        vec![Some("row".into()), Some("col".into())]
    };
    if !only_epilogue {
        let _ = writeln!(src, "        {}", store_stmt(&binds, &m.out, &vars, "v")?);
    }
    if let Some(e) = fused {
        let evars = if fusion == Some(EpilogueFusion::Reshaped) {
            let _ = writeln!(src, "        let lin = (z * {n}u + row) * {mm}u + col;");
            decompose(&mut src, "lin", &cs(&e.shape)?, "e", "        ")
        } else {
            vars.clone()
        };
        emit_body(&mut src, &e.body, "r", "        ", &what, &mut |l| {
            let acc = &e.body.loads[l];
            if acc.buf == m.out.buf {
                Ok("v".to_string())
            } else {
                load_expr(&binds, acc, &evars)
            }
        })?;
        for s in &e.stores {
            let _ = writeln!(src, "        {}", store_stmt(&binds, &s.dst, &evars, &format!("r{}", s.reg))?);
        }
    }
    src.push_str("      }\n    }\n  }\n}\n");
    let mut out = vec![GpuKernel {
        entry: entry.into(),
        what,
        wgsl: src,
        bindings: binds.bindings(),
        groups: [gx.max(1) as u32, gy.max(1) as u32, batch.max(1) as u32],
        needs_elements: None,
    }];
    if batch * n * mm == 0 {
        out[0].groups = [0, 0, 0];
    }
    if let (Some(e), None) = (&m.epilogue, fused) {
        out.push(lower_pointwise(e, &format!("{entry}_epilogue"))?);
    }
    Ok(out)
}

/// Lower a concrete plan to steps in execution order.
pub(crate) fn lower_plan(plan: &KernelPlan) -> Result<Vec<Step>, WgpuError> {
    let mut steps = Vec::new();
    for (i, k) in plan.kernels.iter().enumerate() {
        lower_kernel(k, &format!("k{i}"), plan, i, &mut steps)?;
    }
    for s in &mut steps {
        if let Step::Gpu(g) = s {
            g.wgsl = if g.wgsl.contains("f16") {
                format!("enable f16;\n{PRELUDE}{PRELUDE_F16}\n{}", g.wgsl)
            } else {
                format!("{PRELUDE}\n{}", g.wgsl)
            };
        }
    }
    Ok(steps)
}

fn lower_kernel(
    k: &Kernel,
    name: &str,
    plan: &KernelPlan,
    index: usize,
    steps: &mut Vec<Step>,
) -> Result<(), WgpuError> {
    match k {
        Kernel::Pointwise(p) => steps.push(Step::Gpu(lower_pointwise(p, &format!("{name}_pointwise"))?)),
        Kernel::Reduce(r) => steps.push(Step::Gpu(lower_reduce(r, &format!("{name}_reduce"))?)),
        Kernel::Matmul(m) => {
            steps.extend(lower_matmul(m, &format!("{name}_matmul"), plan, index)?.into_iter().map(Step::Gpu))
        }
        Kernel::Extern(e) => steps.push(Step::Host(e.clone())),
        Kernel::Rows(r) => {
            for (s, stage) in r.stages.iter().enumerate() {
                lower_kernel(stage, &format!("{name}_{s}"), plan, index, steps)?;
            }
        }
    }
    Ok(())
}
