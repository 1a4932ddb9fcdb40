//! Export: a module's (or function's) functional graph — or its joint forward+backward
//! graph — as plain data, for whoever wants to run, transform or serialize it.
//!
//! - [`aot_export_module`]: inputs are `(parameters..., buffers..., user inputs...)`
//!   (named by their fully qualified names and `arg0`, `arg1`, ...); outputs are
//!   `(new values of mutated buffers..., user outputs..., [gradients...])`, described
//!   by a [`GraphSignature`]. With `trace_joint` the graph also returns the gradient of
//!   the loss with respect to every parameter (then every user input) that requires
//!   grad, and takes **no tangent input**: the loss is seeded with one, as PyTorch's
//!   `backward()` on a scalar does. The joint is built with a tangent for the loss,
//!   then that tangent input is replaced by a `full(shape=<loss shape>, value=1.0)`
//!   node defining the same value.
//! - [`aot_export_joint_simple`]: a function with no calling-convention changes at all
//!   (no input mutation, no output aliasing): its inference graph, or with
//!   `trace_joint` its joint graph (inputs: primals then one tangent per output that
//!   requires grad; outputs: forward outputs then gradients of the inputs that require
//!   grad).
//!
//! An exported graph has no runtime wrapper to replay side effects, so both refuse,
//! each with a clear error: a tensor passed twice (duplicated inputs); a metadata
//! mutation of any input; a data mutation of an input that requires grad; any
//! mutation of a parameter; mutated inputs that alias other inputs (which would need a
//! synthetic base); a data mutation of a user input (only buffers may be mutated, and
//! `aot_export_joint_simple` accepts no mutation at all); random ops drawing from the
//! global generator (functionalized RNG); with `trace_joint`, a missing
//! or out-of-range loss index, a loss that is not a scalar or does not require grad,
//! and any other output that requires grad. `aot_export_joint_simple` also refuses
//! outputs that alias inputs or other outputs. Intermediate-base outputs (which only
//! the runtime epilogue needs) are dropped, since user outputs that are views are
//! computed by the graph itself.

mod checks;

use crate::compile::functionalize_traced;
use crate::error::{Error, Result};
use crate::params::{Module, Params};
use aotgrad_autodiff::{build_joint_with_cuts, GradCuts, JointGraph};
use aotgrad_functionalize::{eliminate_dead_code, Functionalized, Options};
use aotgrad_ir::{Graph, Node, Op, Scalar, ValueId};
use aotgrad_meta::{GraphSignature, InputSpec, InputSpecKind, OutputSpec, OutputSpecKind};
use aotgrad_trace::{trace, NoGradGuard, ShapeEnv, Tensor, TraceConfig, Traced};
use checks::{err, Roles};

const EXPORT_MODULE: &str = "aot_export_module";
const EXPORT_SIMPLE: &str = "aot_export_joint_simple";

/// Export `module` called on `args`: the functional graph (the joint graph when
/// `trace_joint`) and its [`GraphSignature`]. With `trace_joint`, `output_loss_index`
/// names the output that is the scalar loss; every other output must not require grad.
/// See the [module docs](self) for the graph's layout and what is refused.
#[track_caller]
pub fn aot_export_module(
    module: &dyn Module,
    args: &[Tensor],
    trace_joint: bool,
    output_loss_index: Option<usize>,
) -> Result<(Graph, GraphSignature)> {
    let api = EXPORT_MODULE;
    let _span = tracing::debug_span!("aot_export_module", trace_joint).entered();
    let store = module.store();
    let mut names = store.names();
    let num_params = store.params().len();
    let num_lifted = names.len();
    let mut inputs = store.tensors();
    inputs.extend(args.iter().cloned());
    names.extend((0..args.len()).map(|i| format!("arg{i}")));
    let roles = Roles { names: &names, num_params, num_lifted };
    checks::no_duplicates(api, &inputs, &roles)?;
    let loss = match (trace_joint, output_loss_index) {
        (true, None) => {
            return Err(err(
                api,
                "trace_joint needs one of the forward's outputs to be a scalar loss: give its index as \
                 output_loss_index",
            ))
        }
        (true, Some(l)) => Some(l),
        (false, _) => None,
    };
    let lifted = names[..num_lifted].to_vec();
    let called_at = std::panic::Location::caller();
    let forward = |fakes: &[Tensor]| {
        let p = Params::new(lifted.iter().cloned().zip(fakes.iter().cloned()));
        let _user_line = aotgrad_ir::AttributeCalls::new(file!(), called_at);
        module.forward(&p, fakes.get(num_lifted..).unwrap_or_default())
    };
    let Exported { traced, fz, mut env } = trace_and_functionalize(api, forward, &inputs, &names, trace_joint)?;
    if let Some(l) = loss {
        checks::loss_output(api, &traced.graph, &traced.output_requires_grad, l)?;
    }
    checks::mutations(api, &fz, &roles, true)?;
    if let Some(i) = (num_params..num_lifted).find(|&i| fz.meta.inputs[i].requires_grad) {
        return Err(err(api, format!("{} requires grad; buffers must not require grad", roles.describe(i))));
    }

    let meta = &fz.meta;
    let n_mut = meta.mutated_inputs.len();
    let n_user = meta.outputs.len();
    let input_specs: Vec<InputSpec> = (0..inputs.len())
        .map(|i| InputSpec {
            name: names[i].clone(),
            kind: if i < num_params {
                InputSpecKind::Parameter(names[i].clone())
            } else if i < num_lifted {
                InputSpecKind::Buffer(names[i].clone())
            } else {
                InputSpecKind::UserInput(i - num_lifted)
            },
        })
        .collect();
    let mut kinds: Vec<OutputSpecKind> =
        meta.mutated_inputs.iter().map(|&g| OutputSpecKind::BufferMutation(names[g].clone())).collect();
    kinds.extend((0..n_user).map(OutputSpecKind::UserOutput));

    let graph = match loss {
        None => keep_outputs(fz.graph.clone(), n_mut + n_user, &[]),
        Some(l) => {
            let requires_grad: Vec<bool> = meta.inputs.iter().map(|i| i.requires_grad).collect();
            let mut has_tangent = vec![false; meta.num_graph_outputs()];
            has_tangent[meta.user_output_index(l)] = true;
            let joint = joint(&fz, &requires_grad, &has_tangent, &mut env)?;
            if joint.num_tangents != 1 {
                return Err(Error::Internal(format!("the loss got {} tangents, expected 1", joint.num_tangents)));
            }
            for &g in &joint.grad_primals {
                kinds.push(if g < num_params {
                    OutputSpecKind::GradientToParameter(names[g].clone())
                } else {
                    OutputSpecKind::GradientToUserInput(g - num_lifted)
                });
            }
            let grads: Vec<usize> = (joint.num_fw_outputs..joint.graph.outputs.len()).collect();
            let g = seed_tangents_with_ones(joint.graph, joint.num_primals)?;
            keep_outputs(g, n_mut + n_user, &grads)
        }
    };
    if graph.outputs.len() != kinds.len() {
        return Err(Error::Internal(format!("{} graph outputs for {} output specs", graph.outputs.len(), kinds.len())));
    }
    let outputs = graph.outputs.iter().zip(kinds).map(|(&value, kind)| OutputSpec { value, kind }).collect();
    tracing::debug!(target: "aotgrad::export", "exported graph:\n{}", aotgrad_ir::text::print_graph(&graph));
    Ok((graph, GraphSignature { inputs: input_specs, outputs, loss_output: loss }))
}

/// Export a function with no calling-convention changes: no input may be mutated and
/// no output may alias an input or another output. Without `trace_joint` (or when no
/// input and output require grad) this is the inference graph, traced under no-grad;
/// with it, the joint graph (see the [module docs](self)).
pub fn aot_export_joint_simple<F>(f: F, args: &[Tensor], trace_joint: bool) -> Result<Graph>
where
    F: Fn(&[Tensor]) -> crate::Result<Vec<Tensor>>,
{
    let api = EXPORT_SIMPLE;
    let _span = tracing::debug_span!("aot_export_joint_simple", trace_joint).entered();
    let names: Vec<String> = (0..args.len()).map(|i| format!("arg{i}")).collect();
    let roles = Roles { names: &names, num_params: 0, num_lifted: 0 };
    checks::no_duplicates(api, args, &roles)?;
    let Exported { traced, fz, mut env } = trace_and_functionalize(api, f, args, &names, trace_joint)?;
    checks::mutations(api, &fz, &roles, false)?;
    if let Some((j, o)) = fz.meta.outputs.iter().enumerate().find(|(_, o)| o.kind != aotgrad_meta::OutputKind::NonAlias)
    {
        return Err(err(
            api,
            format!(
                "output {j} aliases an input or another output ({:?}); aot_export_joint_simple does not support \
                 outputs that alias",
                o.kind
            ),
        ));
    }
    let requires_grad: Vec<bool> = fz.meta.inputs.iter().map(|i| i.requires_grad).collect();
    let has_tangent: Vec<bool> = fz.meta.outputs.iter().map(|o| o.requires_grad && o.meta.dtype.is_float()).collect();
    let needs_autograd = trace_joint
        && aotgrad_trace::is_grad_enabled()
        && requires_grad.contains(&true)
        && traced.output_requires_grad.contains(&true);
    if !needs_autograd {
        return Ok(fz.graph);
    }
    Ok(joint(&fz, &requires_grad, &has_tangent, &mut env)?.graph)
}

/// Trace `f` over `inputs` (under no-grad unless `grad`) and functionalize it.
fn trace_and_functionalize<F>(api: &str, f: F, inputs: &[Tensor], names: &[String], grad: bool) -> Result<Exported>
where
    F: FnOnce(&[Tensor]) -> crate::Result<Vec<Tensor>>,
{
    let _no_grad = (!grad).then(NoGradGuard::new);
    let config = TraceConfig { input_names: Some(names.to_vec()), ..TraceConfig::default() };
    let traced = trace(|t: &[Tensor]| f(t).map_err(aotgrad_trace::Error::from), inputs, &config)?;
    if traced.rng.is_some() {
        return Err(err(
            api,
            "the program draws from the global random generator (e.g. `dropout` or `randn` with \
             `RngSeed::Global`), which would add generator-state inputs; export does not support functionalized RNG: \
             give those ops a fixed seed",
        ));
    }
    let mut env = traced.shape_env.clone();
    // Without grad the whole trace is invisible to autograd.
    let fz = functionalize_traced(&traced, grad, &Options { keep_input_mutations: false }, &mut env)?;
    Ok(Exported { traced, fz, env })
}

/// A traced and functionalized program, with the shape environment tracing used.
struct Exported {
    traced: Traced,
    fz: Functionalized,
    env: ShapeEnv,
}

/// The joint graph, honouring what autograd must not see (`detach`, no-grad writes).
fn joint(fz: &Functionalized, requires_grad: &[bool], has_tangent: &[bool], env: &mut ShapeEnv) -> Result<JointGraph> {
    let _span = tracing::debug_span!("joint").entered();
    let cuts = GradCuts { detached: &fz.autograd.detached, straight_through: &fz.autograd.straight_through };
    Ok(build_joint_with_cuts(&fz.graph, requires_grad, has_tangent, &cuts, env)?)
}

/// Replace every input after the first `num_primals` (the tangents) by a node filling
/// its shape with ones.
fn seed_tangents_with_ones(mut g: Graph, num_primals: usize) -> Result<Graph> {
    if g.inputs.len() < num_primals {
        return Err(Error::Internal("joint graph has fewer inputs than primals".into()));
    }
    let tangents = g.inputs.split_off(num_primals);
    let ones: Vec<Node> = tangents
        .into_iter()
        .map(|t| Node {
            out: t.id,
            op: Op::Full { shape: t.meta.shape.clone(), value: Scalar::Float(1.0), dtype: t.meta.dtype },
            args: Vec::new(),
            meta: t.meta,
            storage: t.storage,
            loc: None,
        })
        .collect();
    g.nodes.splice(0..0, ones);
    Ok(g)
}

/// Keep the first `head` outputs and the outputs at positions `tail` (in order), then
/// drop the nodes nothing uses any more.
fn keep_outputs(mut g: Graph, head: usize, tail: &[usize]) -> Graph {
    let outs: Vec<ValueId> =
        g.outputs.iter().take(head).chain(tail.iter().filter_map(|&p| g.outputs.get(p))).copied().collect();
    g.outputs = outs;
    eliminate_dead_code(g)
}
