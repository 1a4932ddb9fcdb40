//! `aotgrad import MODEL.pt2`: the signature, the op histogram and every compile
//! stage of an imported PyTorch program.

use aotgrad_cli::import::import_file;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../aotgrad-import/fixtures").join(name)
}

#[test]
fn import_prints_the_signature_the_ops_and_every_compile_stage() {
    let report = import_file(&fixture("cnn.pt2"), true, false).unwrap();
    let text = report.text();
    let head: String = text.lines().take_while(|l| !l.starts_with("program: imported")).collect::<Vec<_>>().join("\n");
    expect_test::expect![[r#"
        == signature ==
        program `cnn`: exported by torch 2.15.0+cu132, schema 8.20, TRAINING dialect (opset aten 10), 9 nodes
        6 parameter tensor(s), 20490 elements; 0 buffer(s)
        inputs:
          parameter    conv1.weight                             f32[16, 1, 3, 3]
          parameter    conv1.bias                               f32[16]
          parameter    conv2.weight                             f32[32, 16, 3, 3]
          parameter    conv2.bias                               f32[32]
          parameter    head.weight                              f32[10, 1568]
          parameter    head.bias                                f32[10]
          user input   x                                        f32[s77, 784]
        outputs:
          user output  linear                                   f32[s77, 10]
        symbolic sizes:
          s77 in [1, 4096]

        == ops (9 nodes, 6 distinct) ==
            2  aten.conv2d.default
            2  aten.max_pool2d.default
            2  aten.relu.default
            1  aten.flatten.using_ints
            1  aten.linear.default
            1  aten.view.default
    "#]]
    .assert_eq(&(head + "\n"));
    let ex = report.explanation.as_ref().expect("explained");
    assert!(ex.training);
    for section in [
        "traced graph",
        "functional graph",
        "joint graph",
        "forward graph",
        "backward graph",
        "saved values",
        "kernels: forward",
    ] {
        assert!(text.contains(&format!("== {section}")), "no {section}");
    }
    // Traced nodes point at the PyTorch model's lines, not at the importer.
    assert!(text.contains("export_fixtures.py:61:1"), "{text}");
    assert!(!text.contains("aotgrad-import/src"), "{text}");
}

#[test]
fn import_explains_inference_and_every_fixture() {
    for name in ["mlp", "resnet", "mobilenet", "encoder", "gpt"] {
        for form in ["", ".core"] {
            let r = import_file(&fixture(&format!("{name}{form}.pt2")), true, true).unwrap_or_else(|e| panic!("{e}"));
            let ex = r.explanation.unwrap();
            assert!(!ex.training, "{name}{form}");
            assert!(ex.text().contains("== kernels (compiled CPU backend)"), "{name}{form}");
            // Every node, buffer write-backs included, points at the PyTorch model.
            assert!(!ex.text().contains("aotgrad-import/src"), "{name}{form}: {}", ex.text());
        }
    }
    let r = import_file(&fixture("resnet.core.pt2"), false, false).unwrap();
    assert!(r.explanation.is_none());
    assert!(
        r.ops.iter().any(|(op, n)| op == "aten._native_batch_norm_legit_functional.default" && *n == 6),
        "{:?}",
        r.ops
    );
}

#[test]
fn import_of_a_missing_or_foreign_file_is_an_error() {
    let e = import_file(&fixture("no-such.pt2"), true, false).unwrap_err();
    assert!(e.contains("no-such.pt2: cannot read"), "{e}");
    let e = import_file(&fixture("export_fixtures.py"), true, false).unwrap_err();
    assert!(e.contains("not a readable zip archive"), "{e}");
}
