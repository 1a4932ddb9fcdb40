//! Golden traced graphs for the seed's core programs, printed with the IR's text
//! format; every traced graph also round-trips through the parser. Re-bless with
//! `UPDATE_EXPECT=1 cargo test -p aotgrad-trace --test golden`.

use aotgrad_ir::text::{parse_graph, print_graph};
use aotgrad_trace::{trace, DType, Result, Tensor, TraceConfig, Traced};
use expect_test::{expect, Expect};

fn input(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|i| i as f64).collect();
    Tensor::from_f64(&data, shape, DType::F32).expect("valid data")
}

fn check(t: &Traced, want: Expect) {
    let text = print_graph(&t.graph);
    want.assert_eq(&text);
    assert_eq!(parse_graph(&text).expect("printed graph parses"), t.graph);
}

#[test]
fn input_data_mutation() -> Result<()> {
    let t = trace(
        |a| {
            a[0].mul_(2)?;
            Ok(vec![a[0].mul(3)?])
        },
        &[input(&[2, 3])],
        &TraceConfig::default(),
    )?;
    check(
        &t,
        expect![[r#"
            graph(%0: f32[2, 3] #0 "arg0") {
              %1: f32[2, 3] #0 = mul_(%0, 2)  # crates/aotgrad-trace/tests/golden.rs:25:18
              %2: f32[2, 3] #1 = mul(%1, 3)  # crates/aotgrad-trace/tests/golden.rs:26:26
              return (%2)
            }
        "#]],
    );
    Ok(())
}

#[test]
fn input_metadata_mutation() -> Result<()> {
    let t = trace(
        |a| {
            a[0].t_()?;
            Ok(vec![a[0].mul(3)?])
        },
        &[input(&[2, 3])],
        &TraceConfig::default(),
    )?;
    check(
        &t,
        expect![[r#"
            graph(%0: f32[2, 3] #0 "arg0") {
              %1: f32[3, 2] strides=[1, 3] #0 = t_(%0)  # crates/aotgrad-trace/tests/golden.rs:48:18
              %2: f32[3, 2] strides=[1, 3] #1 = mul(%1, 3)  # crates/aotgrad-trace/tests/golden.rs:49:26
              return (%2)
            }
        "#]],
    );
    Ok(())
}

#[test]
fn outputs_aliasing_an_input_and_an_intermediate() -> Result<()> {
    let t = trace(|a| Ok(vec![a[0].t()?, a[0].mul(2)?.view(&[-1])?]), &[input(&[2, 3])], &TraceConfig::default())?;
    check(
        &t,
        expect![[r#"
            graph(%0: f32[2, 3] #0 "arg0") {
              %1: f32[3, 2] strides=[1, 3] #0 = t(%0)  # crates/aotgrad-trace/tests/golden.rs:69:36
              %2: f32[2, 3] #1 = mul(%0, 2)  # crates/aotgrad-trace/tests/golden.rs:69:47
              %3: f32[6] #1 = view(%2, [6])  # crates/aotgrad-trace/tests/golden.rs:69:55
              return (%1, %3)
            }
        "#]],
    );
    Ok(())
}

#[test]
fn mutation_of_an_input_aliasing_another_input() -> Result<()> {
    let x = input(&[4]);
    let x_view = x.view(&[-1])?;
    let t = trace(
        |a| {
            a[0].mul_(2)?;
            Ok(vec![a[0].mul(&a[1])?])
        },
        &[x, x_view],
        &TraceConfig::default(),
    )?;
    assert_eq!(t.graph.inputs[0].storage, t.graph.inputs[1].storage, "aliasing inputs share a storage id");
    check(
        &t,
        expect![[r#"
            graph(%0: f32[4] #0 "arg0", %1: f32[4] #0 "arg1") {
              %2: f32[4] #0 = mul_(%0, 2)  # crates/aotgrad-trace/tests/golden.rs:90:18
              %3: f32[4] #1 = mul(%2, %1)  # crates/aotgrad-trace/tests/golden.rs:91:26
              return (%3)
            }
        "#]],
    );
    Ok(())
}

#[test]
fn views_mutation_through_a_strided_slice_and_as_strided() -> Result<()> {
    let cfg = TraceConfig { input_names: Some(vec!["x".into()]), ..TraceConfig::default() };
    let t = trace(
        |a| {
            let rows = a[0].slice(0, Some(0), None, 2)?;
            let col = rows.select(1, -1)?;
            col.add_(1.0)?;
            let s = a[0].as_strided(&[2, 2], &[1, 4], 1)?;
            let z = Tensor::zeros(&[2, 2], DType::F32)?;
            Ok(vec![s.add(&z)?, rows])
        },
        &[input(&[4, 4])],
        &cfg,
    )?;
    check(
        &t,
        expect![[r#"
            graph(%0: f32[4, 4] #0 "x") {
              %1: f32[2, 4] strides=[8, 1] #0 = slice(%0, dim=0, start=0, end=4, step=2)  # crates/aotgrad-trace/tests/golden.rs:115:29
              %2: f32[2] strides=[8] offset=3 #0 = select(%1, dim=1, index=3)  # crates/aotgrad-trace/tests/golden.rs:116:28
              %3: f32[2] strides=[8] offset=3 #0 = add_(%2, 1.0)  # crates/aotgrad-trace/tests/golden.rs:117:17
              %4: f32[2, 2] strides=[1, 4] offset=1 #0 = as_strided(%0, size=[2, 2], stride=[1, 4], offset=1)  # crates/aotgrad-trace/tests/golden.rs:118:26
              %5: f32[2, 2] #1 = full(shape=[2, 2], value=0, dtype=f32)  # crates/aotgrad-trace/tests/golden.rs:119:21
              %6: f32[2, 2] strides=[1, 2] #2 = add(%4, %5)  # crates/aotgrad-trace/tests/golden.rs:120:23
              return (%6, %1)
            }
        "#]],
    );
    Ok(())
}

#[test]
fn requires_grad_is_recorded_per_input_output_and_value() -> Result<()> {
    let w = input(&[3]).requires_grad(true)?;
    let x = input(&[3]);
    let t = trace(
        |a| {
            let y = a[0].mul(&a[1])?;
            let d = y.detach()?;
            let n = aotgrad_trace::no_grad(|| a[1].mul(2))?;
            Ok(vec![y, d, n])
        },
        &[x, w],
        &TraceConfig::default(),
    )?;
    assert_eq!(t.input_requires_grad, vec![false, true]);
    assert_eq!(t.output_requires_grad, vec![true, false, false]);
    let per_value: Vec<bool> = t.graph.outputs.iter().map(|v| t.value_requires_grad[v.0 as usize]).collect();
    assert_eq!(per_value, vec![true, false, false]);
    check(
        &t,
        expect![[r#"
            graph(%0: f32[3] #0 "arg0", %1: f32[3] #1 "arg1") {
              %2: f32[3] #2 = mul(%0, %1)  # crates/aotgrad-trace/tests/golden.rs:148:26
              %3: f32[3] #2 = alias(%2)  # crates/aotgrad-trace/tests/golden.rs:149:23
              %4: f32[3] #3 = mul(%1, 2)  # crates/aotgrad-trace/tests/golden.rs:150:52
              return (%2, %3, %4)
            }
        "#]],
    );
    Ok(())
}
