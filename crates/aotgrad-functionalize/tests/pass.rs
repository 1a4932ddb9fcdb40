//! Text-driven tests of the pass: a traced graph written in the IR's text format is
//! functionalized and the functional graph and metadata compared with golden text
//! (re-bless with `UPDATE_EXPECT=1 cargo test -p aotgrad-functionalize`); plus the
//! verifier's rejections. End-to-end checks against eager mode live in
//! `crates/aotgrad/tests/inference`.

use aotgrad_functionalize::{functionalize, verify_functional, FunctionalizeError, Options, TraceFacts};
use aotgrad_ir::text::{parse_graph_unchecked, print_graph};
use aotgrad_ir::{Graph, SourceLoc, StaticOracle};
use expect_test::{expect, Expect};

fn traced(text: &str) -> Graph {
    // Unchecked: some cases are deliberately invalid, to test the pass's own checks.
    parse_graph_unchecked(text).expect("parses")
}

fn run(text: &str, keep: bool) -> Result<String, FunctionalizeError> {
    let g = traced(text);
    let no = vec![false; g.inputs.len()];
    let out_no = vec![false; g.outputs.len()];
    let hidden = |_| true;
    let facts = TraceFacts {
        input_requires_grad: &no,
        output_requires_grad: &out_no,
        output_no_grad_view: &[],
        output_creation: &[],
        hidden_meta: &[],
        detach_values: &[],
        input_tracked_from: &[],
        hidden_mutation: &hidden,
    };
    let fz = functionalize(&g, &facts, &Options { keep_input_mutations: keep }, &mut StaticOracle)?;
    verify_functional(&fz.graph, keep, &mut StaticOracle).expect("functional graph verifies");
    let mut s = print_graph(&fz.graph);
    for (i, info) in fz.meta.inputs.iter().enumerate() {
        s += &format!(
            "input {i}: data={} meta={} final={}\n",
            info.mutates_data,
            info.mutates_metadata,
            info.final_meta.as_ref().map_or("-".to_string(), ToString::to_string)
        );
    }
    for (j, o) in fz.meta.outputs.iter().enumerate() {
        s += &format!("output {j}: {:?}\n", o.kind);
    }
    s += &format!(
        "mutated inputs {:?}, intermediate bases {}\n",
        fz.meta.mutated_inputs, fz.meta.num_intermediate_bases
    );
    s += &format!("convention {:?}, bases {:?}\n", fz.convention.args, fz.convention.bases);
    Ok(s)
}

fn check(text: &str, keep: bool, want: Expect) {
    want.assert_eq(&run(text, keep).expect("functionalizes"));
}

#[test]
fn data_mutation_becomes_an_extra_output() {
    let g = r#"graph(%0: f32[2, 3] #0 "x") {
  %1: f32[2, 3] #0 = mul_(%0, 2)
  %2: f32[2, 3] #1 = mul(%1, 3)
  return (%2)
}"#;
    check(
        g,
        false,
        expect![[r#"
        graph(%0: f32[2, 3] #0 "x") {
          %1: f32[2, 3] #1 = mul(%0, 2)
          %2: f32[2, 3] #2 = mul(%1, 3)
          return (%1, %2)
        }
        input 0: data=true meta=false final=-
        output 0: NonAlias
        mutated inputs [0], intermediate bases 0
        convention [Input(0)], bases []
    "#]],
    );
    check(
        g,
        true,
        expect![[r#"
        graph(%0: f32[2, 3] #0 "x") {
          %1: f32[2, 3] #1 = mul(%0, 2)
          %2: f32[2, 3] #2 = mul(%1, 3)
          %3: f32[2, 3] #0 = copy_(%0, %1)
          return (%2)
        }
        input 0: data=true meta=false final=-
        output 0: NonAlias
        mutated inputs [], intermediate bases 0
        convention [Input(0)], bases []
    "#]],
    );
}

#[test]
fn metadata_mutation_becomes_a_view() {
    check(
        r#"graph(%0: f32[2, 3] #0 "x") {
  %1: f32[3, 2] strides=[1, 3] #0 = t_(%0)
  %2: f32[3, 2] #1 = mul(%1, 3)
  return (%2)
}"#,
        false,
        expect![[r#"
            graph(%0: f32[2, 3] #0 "x") {
              %1: f32[3, 2] strides=[1, 3] #0 = t(%0)
              %2: f32[3, 2] strides=[1, 3] #1 = mul(%1, 3)
              return (%2)
            }
            input 0: data=false meta=true final=f32[3, 2] strides=[1, 3]
            output 0: NonAlias
            mutated inputs [], intermediate bases 0
            convention [Input(0)], bases []
        "#]],
    );
}

#[test]
fn write_through_a_view_is_scattered_back_and_replayed() {
    check(
        r#"graph(%0: f32[4, 4] #0 "x") {
  %1: f32[4, 2] strides=[4, 2] #0 = slice(%0, dim=1, start=0, end=4, step=2)
  %2: f32[2] strides=[2] offset=4 #0 = select(%1, dim=0, index=1)
  %3: f32[2] strides=[2] offset=4 #0 = add_(%2, 1)
  %4: f32[4, 2] #1 = mul(%1, 2)
  return (%4, %1)
}"#,
        false,
        expect![[r#"
            graph(%0: f32[4, 4] #0 "x") {
              %1: f32[4, 2] strides=[4, 2] #0 = slice(%0, dim=1, start=0, end=4, step=2)
              %2: f32[2] strides=[2] offset=4 #0 = select(%1, dim=0, index=1)
              %3: f32[2] #1 = add(%2, 1)
              %4: f32[4, 2] #2 = select_scatter(%1, %3, dim=0, index=1)
              %5: f32[4, 4] #3 = slice_scatter(%0, %4, dim=1, start=0, end=4, step=2)
              %6: f32[4, 2] strides=[4, 2] #3 = slice(%5, dim=1, start=0, end=4, step=2)
              %7: f32[4, 2] #4 = mul(%6, 2)
              return (%5, %7, %6)
            }
            input 0: data=true meta=false final=-
            output 0: NonAlias
            output 1: AliasOfInput(0)
            mutated inputs [0], intermediate bases 0
            convention [Input(0)], bases []
        "#]],
    );
}

#[test]
fn overlapping_inputs_with_a_write_get_a_synthetic_base() {
    check(
        r#"graph(%0: f32[2, 3] #0 "x", %1: f32[6] #0 "xv") {
  %2: f32[2, 3] #0 = mul_(%0, 2)
  %3: f32[6] #1 = add(%1, 1)
  return (%3)
}"#,
        false,
        expect![[r#"
            graph(%0: f32[6] #0 "base0") {
              %1: f32[2, 3] #0 = as_strided(%0, size=[2, 3], stride=[3, 1], offset=0)
              %2: f32[2, 3] #1 = mul(%1, 2)
              %3: f32[6] #2 = as_strided_scatter(%0, %2, size=[2, 3], stride=[3, 1], offset=0)
              %4: f32[6] #3 = add(%3, 1)
              return (%3, %4)
            }
            input 0: data=true meta=false final=-
            input 1: data=true meta=false final=-
            output 0: NonAlias
            mutated inputs [0], intermediate bases 0
            convention [ViewOfBase { base: 0 }, ViewOfBase { base: 0 }], bases [SyntheticBase { input: 0, members: [0, 1], offset: 0, len: 6 }]
        "#]],
    );
}

#[test]
fn disjoint_inputs_of_one_storage_stay_separate() {
    check(
        r#"graph(%0: f32[4] strides=[2] #0 "even", %1: f32[4] strides=[2] offset=1 #0 "odd") {
  %2: f32[4] strides=[2] #0 = mul_(%0, 2)
  %3: f32[4] strides=[2] offset=1 #0 = add_(%1, %2)
  return (%3)
}"#,
        false,
        expect![[r#"
            graph(%0: f32[4] strides=[2] #0 "even", %1: f32[4] strides=[2] offset=1 #1 "odd") {
              %2: f32[4] #2 = mul(%0, 2)
              %3: f32[4] strides=[2] #3 = copy(%0, %2)
              %4: f32[4] #4 = add(%1, %3)
              %5: f32[4] strides=[2] #5 = copy(%1, %4)
              return (%3, %5, %5)
            }
            input 0: data=true meta=false final=-
            input 1: data=true meta=false final=-
            output 0: IsInput(1)
            mutated inputs [0, 1], intermediate bases 0
            convention [Input(0), Input(1)], bases []
        "#]],
    );
}

#[test]
fn write_through_an_expand_uses_as_strided_scatter() {
    check(
        r#"graph(%0: f32[1, 3] #0 "x") {
  %1: f32[2, 3] strides=[0, 1] #0 = expand(%0, [2, 3])
  %2: f32[3] #0 = select(%1, dim=0, index=1)
  %3: f32[3] #0 = full_like_(%2, value=5, dtype=None)
  return (%0)
}"#,
        false,
        expect![[r#"
            graph(%0: f32[1, 3] #0 "x") {
              %1: f32[2, 3] strides=[0, 1] #0 = expand(%0, [2, 3])
              %2: f32[3] #0 = select(%1, dim=0, index=1)
              %3: f32[3] #1 = full_like(%2, value=5, dtype=None)
              %4: f32[1, 3] #2 = as_strided_scatter(%0, %3, size=[3], stride=[1], offset=0)
              return (%4, %4)
            }
            input 0: data=true meta=false final=-
            output 0: IsInput(0)
            mutated inputs [0], intermediate bases 0
            convention [Input(0)], bases []
        "#]],
    );
}

#[test]
fn symbolic_synthetic_base_is_unsupported() {
    let err = run(
        r#"graph(%0: f32[s0, 3] #0 "x", %1: f32[3*s0] #0 "xv") {
  %2: f32[s0, 3] #0 = mul_(%0, 2)
  return (%1)
}"#,
        false,
    )
    .expect_err("symbolic synthetic base");
    assert!(matches!(err, FunctionalizeError::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("synthetic base"), "{err}");
}

fn verify_err(text: &str, keep: bool) -> String {
    verify_functional(&traced(text), keep, &mut StaticOracle).expect_err("verifier rejects")
}

#[test]
fn verifier_rejects_mutation_and_bad_structure() {
    let inplace = r#"graph(%0: f32[3] #0 "x") {
  %1: f32[3] #0 = mul_(%0, 2)
  return (%1)
}"#;
    assert_eq!(verify_err(inplace, false), "%1 = mul_: in-place op in a functional graph");
    let meta = r#"graph(%0: f32[2, 3] #0 "x") {
  %1: f32[3, 2] strides=[1, 3] #0 = t_(%0)
  return (%1)
}"#;
    assert_eq!(verify_err(meta, true), "%1 = t_: in-place op in a functional graph");
    let wrong_meta = r#"graph(%0: f32[2, 3] #0 "x") {
  %1: f32[3, 2] #0 = t(%0)
  return (%1)
}"#;
    assert_eq!(
        verify_err(wrong_meta, false),
        "%1 = t: recorded meta f32[3, 2] but inference gives f32[3, 2] strides=[1, 3]"
    );
    let view_storage = r#"graph(%0: f32[2, 3] #0 "x") {
  %1: f32[3, 2] strides=[1, 3] #1 = t(%0)
  return (%1)
}"#;
    assert_eq!(verify_err(view_storage, false), "%1 = t: a view must share its argument's storage");
    let fresh_storage = r#"graph(%0: f32[3] #0 "x") {
  %1: f32[3] #0 = mul(%0, 2)
  return (%1)
}"#;
    assert_eq!(verify_err(fresh_storage, false), "%1 = mul: a fresh result reuses storage #0");
}

#[test]
fn verifier_checks_trailing_input_copies() {
    let ok = r#"graph(%0: f32[3] #0 "x") {
  %1: f32[3] #1 = mul(%0, 2)
  %2: f32[3] #0 = copy_(%0, %1)
  return (%1)
}"#;
    verify_functional(&traced(ok), true, &mut StaticOracle).expect("trailing copy into an input");
    assert_eq!(verify_err(ok, false), "%2 = copy_: in-place op in a functional graph");
    let into_intermediate = r#"graph(%0: f32[3] #0 "x") {
  %1: f32[3] #1 = mul(%0, 2)
  %2: f32[3] #1 = copy_(%1, %0)
  return (%1)
}"#;
    assert_eq!(verify_err(into_intermediate, true), "%2 = copy_: target %1 is not a graph input");
    let twice = r#"graph(%0: f32[3] #0 "x") {
  %1: f32[3] #1 = mul(%0, 2)
  %2: f32[3] #0 = copy_(%0, %1)
  %3: f32[3] #0 = copy_(%0, %1)
  return (%1)
}"#;
    assert_eq!(verify_err(twice, true), "%3 = copy_: graph input %0 is written back twice");
    let after = r#"graph(%0: f32[3] #0 "x") {
  %1: f32[3] #1 = mul(%0, 2)
  %2: f32[3] #0 = copy_(%0, %1)
  %3: f32[3] #2 = mul(%1, 2)
  return (%3)
}"#;
    assert_eq!(verify_err(after, true), "%3 = mul: node after the trailing input copies");
    let returned = r#"graph(%0: f32[3] #0 "x") {
  %1: f32[3] #1 = mul(%0, 2)
  %2: f32[3] #0 = copy_(%0, %1)
  return (%2)
}"#;
    assert_eq!(verify_err(returned, true), "output %2 is the result of a trailing input copy");
}

/// A user `as_strided` whose addresses overflow `usize`: the plan's range arithmetic is
/// checked, and the program is rejected with an error naming the op and the user's line
/// (it used to overflow while computing the synthetic base's range).
#[test]
fn as_strided_with_overflowing_addresses_is_unsupported() {
    let mut g = traced(
        r#"graph(%0: f32[6] #0 "x") {
  %1: f32[4] strides=[9223372036854775807] #0 = as_strided(%0, size=[4], stride=[9223372036854775807], offset=0)
  return (%1)
}"#,
    );
    g.nodes[0].loc = Some(SourceLoc { file: "user.rs".into(), line: 7, col: 3 });
    let (no, out_no, hidden) = (vec![false], vec![false], |_| true);
    let facts = TraceFacts {
        input_requires_grad: &no,
        output_requires_grad: &out_no,
        output_no_grad_view: &[],
        output_creation: &[],
        hidden_meta: &[],
        detach_values: &[],
        input_tracked_from: &[],
        hidden_mutation: &hidden,
    };
    let err = functionalize(&g, &facts, &Options::default(), &mut StaticOracle).expect_err("overflow is refused");
    assert!(matches!(err, FunctionalizeError::Unsupported { .. }), "{err:?}");
    expect!["user.rs:7:3: as_strided: inputs [0] need a synthetic base covering every storage element the program reaches, but storage addresses overflow the address range (huge sizes, strides or offset)"].assert_eq(&err.to_string());
}

/// The shared dead-code elimination: nodes no output needs go (also through chains of
/// dead nodes), trailing mutations stay with what they read, order is kept.
#[test]
fn eliminate_dead_code_keeps_what_outputs_and_mutations_need() {
    let g = traced(
        r#"graph(%0: f32[3] #0 "x", %1: f32[3] #1 "y") {
  %2: f32[3] #2 = mul(%0, 2)
  %3: f32[3] #3 = exp(%2)
  %4: f32[3] #4 = neg(%0)
  %5: f32[3] #5 = add(%4, 1)
  %6: f32[3] #6 = sin(%1)
  %7: f32[3] #1 = copy_(%1, %6)
  return (%5)
}"#,
    );
    let out = aotgrad_functionalize::eliminate_dead_code(g);
    expect![[r#"
        graph(%0: f32[3] #0 "x", %1: f32[3] #1 "y") {
          %4: f32[3] #4 = neg(%0)
          %5: f32[3] #5 = add(%4, 1)
          %6: f32[3] #6 = sin(%1)
          %7: f32[3] #1 = copy_(%1, %6)
          return (%5)
        }
    "#]]
    .assert_eq(&print_graph(&out));
}
