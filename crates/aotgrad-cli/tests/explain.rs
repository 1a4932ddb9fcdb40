//! `aotgrad explain`: every example program explains; golden text for two programs
//! and the partition DOT for one (`UPDATE_EXPECT=1 cargo test -p aotgrad-cli` to
//! refresh after an intended change); malformed programs give located errors.

use aotgrad_cli::explain::{explain, explain_file, parse_program};
use expect_test::expect_file;
use std::path::{Path, PathBuf};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

#[test]
fn every_example_program_explains() {
    let mut n = 0;
    for entry in std::fs::read_dir(examples()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "aot") {
            let ex = explain_file(&path, None).unwrap_or_else(|e| panic!("{e}"));
            let text = ex.text();
            for section in ["traced graph", "functional graph", "view and mutation metadata", "kernels"] {
                assert!(text.contains(section), "{}: no {section}", path.display());
            }
            if ex.training {
                for section in
                    ["joint graph", "simplified joint graph", "forward graph", "backward graph", "saved values"]
                {
                    assert!(text.contains(&format!("== {section}")), "{}: no {section}", path.display());
                }
                assert!(ex.dots.iter().any(|(n, _)| n == "joint.dot"));
            }
            n += 1;
        }
    }
    assert!(n >= 7, "the seed cases, the MLP and the transformer block: {n} programs");
}

#[test]
fn golden_input_data_mutation() {
    let ex = explain_file(&examples().join("input_data_mutation.aot"), None).unwrap();
    expect_file!["golden/input_data_mutation.txt"].assert_eq(&ex.text());
    let dot = &ex.dots.iter().find(|(n, _)| n == "joint.dot").unwrap().1;
    expect_file!["golden/input_data_mutation.joint.dot"].assert_eq(dot);
}

#[test]
fn golden_output_aliases() {
    let ex = explain_file(&examples().join("output_aliases.aot"), None).unwrap();
    expect_file!["golden/output_aliases.txt"].assert_eq(&ex.text());
}

#[test]
fn dot_files_are_written() {
    let dir = std::env::temp_dir().join(format!("aotgrad-explain-dot-{}", std::process::id()));
    let ex = explain_file(&examples().join("mlp.aot"), Some(&dir)).unwrap();
    for (name, _) in &ex.dots {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        assert!(text.starts_with("digraph"), "{name}");
    }
    let joint = std::fs::read_to_string(dir.join("joint.dot")).unwrap();
    assert!(joint.contains("color=red"), "the cut is highlighted");
}

#[test]
fn malformed_programs_give_located_errors() {
    let e = parse_program(
        "# title\ngraph(%0: f32[2] #0 \"x\") {\n  %1: f32[2] #1 = frobnicate(%0)\n  return (%1)\n}\n",
        "p.aot",
    )
    .unwrap_err();
    assert!(e.contains("line 3, column"), "{e}");
    let e =
        parse_program("#! requires_grad: nope\ngraph(%0: f32[2] #0 \"x\") {\n  return (%0)\n}\n", "p.aot").unwrap_err();
    assert!(e.contains("no input named `nope`"), "{e}");
    let e = parse_program("#! frobnicate: x\ngraph() {\n  return ()\n}\n", "p.aot").unwrap_err();
    assert!(e.contains("line 1, column 1: unknown directive"), "{e}");
    // A program that does not type-check names its line (the shape error is found
    // when the graph is read, before anything is compiled).
    let e = parse_program(
        "graph(%0: f32[2] #0 \"x\", %1: f32[3] #1 \"y\") {\n  %2: f32[2] #2 = add(%0, %1)\n  return (%2)\n}\n",
        "bad.aot",
    )
    .unwrap_err();
    assert!(e.contains("line 2, column 3: invalid program"), "{e}");
    let p = parse_program("graph(%0: f32[s0] #0 \"x\") {\n  return (%0)\n}\n", "sym.aot").unwrap();
    assert!(explain(&p).unwrap_err().contains("concrete"));
}
