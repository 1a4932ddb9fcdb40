//! [`AutogradFacts`]: what autograd did not see while tracing, reported on the
//! functional graph's values: results under no-grad and detached views are
//! `detached` (a detached view gets its own `alias` node, never shared with a view
//! autograd sees), and a hidden mutation of a storage autograd tracks makes the new
//! storage value `straight_through` to the previous one. Nothing is reported when no
//! input is tracked.

use aotgrad_functionalize::{functionalize, AutogradFacts, Options, TraceFacts};
use aotgrad_ir::text::{parse_graph, print_graph};
use aotgrad_ir::{StaticOracle, ValueId};
use expect_test::expect;

/// Functionalize `text` with input 0 requiring grad (or not) and the values `unseen`
/// hidden from autograd; the graph and the facts as text.
fn run(text: &str, requires_grad: bool, unseen: &[u32]) -> (String, AutogradFacts) {
    let g = parse_graph(text).expect("valid traced graph");
    let rg = vec![requires_grad; g.inputs.len()];
    let out_rg = vec![requires_grad; g.outputs.len()];
    let unseen: Vec<u32> = unseen.to_vec();
    let hidden = move |v: ValueId| unseen.contains(&v.0);
    let facts = TraceFacts {
        input_requires_grad: &rg,
        output_requires_grad: &out_rg,
        output_no_grad_view: &[],
        output_creation: &[],
        hidden_meta: &[],
        detach_values: &[],
        input_tracked_from: &[],
        hidden_mutation: &hidden,
    };
    let fz = functionalize(&g, &facts, &Options::default(), &mut StaticOracle).expect("functionalizes");
    (print_graph(&fz.graph), fz.autograd)
}

const PROGRAM: &str = r#"graph(%0: f32[3] #0 "x") {
  %1: f32[3] #0 = alias(%0)
  %2: f32[3] #1 = mul(%0, %1)
  %3: f32[3] #0 = view(%0, [3])
  %4: f32[3] #0 = mul_(%0, 2)
  %5: f32[3] #2 = add(%4, %2)
  %6: f32[3] #3 = exp(%4)
  return (%5, %6, %3)
}"#;

/// `%1 = x.detach()`, `%6 = no_grad(exp(x))` and the no-grad `x *= 2` (`%4`).
#[test]
fn detached_values_and_a_hidden_mutation() {
    let (text, facts) = run(PROGRAM, true, &[1, 4, 6]);
    expect![[r#"
        graph(%0: f32[3] #0 "x") {
          %1: f32[3] #0 = alias(%0)
          %2: f32[3] #1 = mul(%0, %1)
          %3: f32[3] #2 = mul(%0, 2)
          %4: f32[3] #3 = add(%3, %2)
          %5: f32[3] #4 = exp(%3)
          return (%3, %4, %5, %3)
        }
    "#]]
    .assert_eq(&text);
    expect!["AutogradFacts { detached: [ValueId(1), ValueId(5)], straight_through: [(ValueId(3), ValueId(0))] }"]
        .assert_eq(&format!("{facts:?}"));
}

/// Without inputs requiring grad nothing is tracked: no facts, no extra nodes.
#[test]
fn nothing_tracked_nothing_reported() {
    let (text, facts) = run(PROGRAM, false, &[1, 2, 3, 4, 5, 6]);
    assert_eq!(facts, AutogradFacts::default());
    expect![[r#"
        graph(%0: f32[3] #0 "x") {
          %1: f32[3] #0 = alias(%0)
          %2: f32[3] #1 = mul(%0, %1)
          %3: f32[3] #2 = mul(%0, 2)
          %4: f32[3] #3 = add(%3, %2)
          %5: f32[3] #4 = exp(%3)
          return (%3, %4, %5, %3)
        }
    "#]]
    .assert_eq(&text);
}
