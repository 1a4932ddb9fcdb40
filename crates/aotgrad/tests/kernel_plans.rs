//! What the compiled CPU backend runs for a whole model: the kernel plans of the
//! transformer block's forward and backward graphs (min-cut partition), one line per
//! kernel saying what it fuses. Far fewer kernels than graph nodes: every pointwise
//! chain, a softmax or layer norm and their backward passes, bias and activation
//! epilogues of the matmuls are each one kernel.

use aotgrad::nn::TransformerBlock;
use aotgrad::prelude::*;
use aotgrad_cpu::CpuBackend;
use expect_test::expect;
use std::sync::Arc;

#[test]
fn transformer_block_forward_and_backward_plans() {
    let blk = Arc::new(TransformerBlock::new(16, 2, DType::F32, 3).unwrap());
    let compiled = aot_module(blk, AotConfig::default().threads(1).no_cache()).unwrap();
    let x = Tensor::randn(&[2, 4, 16], DType::F32, 4).unwrap();
    let (_, back) = compiled.forward(std::slice::from_ref(&x)).unwrap();
    drop(back);
    let graphs = compiled.function().training_graphs();
    assert_eq!(graphs.len(), 1);
    let (fw, bw, _) = &graphs[0];
    let summary = |g: &aotgrad_ir::Graph| {
        let c = CpuBackend::new(1).compile_graph(g).unwrap();
        let plan = c.plan().expect("planned");
        assert!(plan.kernels.len() * 3 < g.nodes.len(), "{} kernels for {} nodes", plan.kernels.len(), g.nodes.len());
        c.plan_summary().unwrap()
    };
    expect![[r#"
        k0: rows over [2, 4, 16]: mean over [2, 4, 16] reducing [2]; mean of sub mul over [2, 4, 16] reducing [2]; pointwise add rsqrt over [2, 4, 1]; pointwise sub mul mul add over [2, 4, 16]
        k1: matmul [8, 16] x [16, 48] + epilogue add
        k2: pointwise copy over [2, 2, 4, 8]
        k3: pointwise copy over [2, 2, 8, 4]
        k4: matmul [4, 4, 8] x [4, 8, 4]
        k5: rows over [2, 2, 4, 4]: amax of mul over [2, 2, 4, 4] reducing [3]; pointwise mul sub exp over [2, 2, 4, 4]; sum over [2, 2, 4, 4] reducing [3]; pointwise reciprocal over [2, 2, 4, 1]; pointwise mul over [2, 2, 4, 4]
        k6: pointwise copy over [2, 2, 4, 8]
        k7: matmul [4, 4, 4] x [4, 4, 8]
        k8: pointwise copy over [2, 4, 2, 8]
        k9: matmul [8, 16] x [16, 16] + epilogue add add
        k10: rows over [2, 4, 16]: mean over [2, 4, 16] reducing [2]; pointwise sub over [2, 4, 16]; mean of mul over [2, 4, 16] reducing [2]; pointwise add rsqrt over [2, 4, 1]; pointwise mul mul add over [2, 4, 16]
        k11: matmul [8, 16] x [16, 64] + epilogue add mul erf add mul mul
        k12: matmul [8, 64] x [64, 16] + epilogue add add
    "#]]
    .assert_eq(&summary(fw));
    expect![[r#"
        k0: rows over [2, 4, 16]: mean over [2, 4, 16] reducing [2]; mean of sub mul over [2, 4, 16] reducing [2]; pointwise add rsqrt over [2, 4, 1]; pointwise sub mul mul add over [2, 4, 16]
        k1: pointwise copy over [2, 2, 4, 8]
        k2: pointwise copy over [2, 2, 8, 4]
        k3: rows over [2, 2, 4, 4]: sum over [2, 2, 4, 4] reducing [3]; pointwise reciprocal over [2, 2, 4, 1]; pointwise mul over [2, 2, 4, 4]
        k4: pointwise copy over [2, 2, 4, 8]
        k5: rows over [2, 4, 16]: mean of mul over [2, 4, 16] reducing [2]; pointwise add rsqrt over [2, 4, 1]
        k6: pointwise mul erf add mul mul over [2, 4, 64], 2 stores
        k7: sum over [2, 4, 16] reducing [0, 1]
        k8: matmul [8, 16] x [16, 64] + epilogue mul add mul mul mul mul mul neg exp mul mul mul add
        k9: matmul [64, 8] x [8, 16]
        k10: sum over [2, 4, 64] reducing [0, 1]
        k11: matmul [8, 64] x [64, 16]
        k12: matmul [16, 8] x [8, 64]
        k13: sum over [2, 4, 16] reducing [0, 1]
        k14: sum of mul mul over [2, 4, 16] reducing [0, 1]
        k15: rows over [2, 4, 16]: sum of mul mul over [2, 4, 16] reducing [2]; pointwise pow mul mul div over [2, 4, 1]; pointwise mul mul mul add add over [2, 4, 16]; sum of neg over [2, 4, 16] reducing [2]; pointwise div over [2, 4, 1]; pointwise add add over [2, 4, 16]
        k16: sum over [2, 4, 16] reducing [0, 1]
        k17: matmul [8, 16] x [16, 16]
        k18: matmul [16, 8] x [8, 16]
        k19: pointwise copy over [2, 2, 4, 8]
        k20: matmul [4, 4, 8] x [4, 8, 4]
        k21: matmul [4, 4, 4] x [4, 4, 8]
        k22: rows over [2, 2, 4, 4]: sum of mul over [2, 2, 4, 4] reducing [3]; pointwise mul mul neg over [2, 2, 4, 1]; pointwise mul add mul mul over [2, 2, 4, 4]
        k23: matmul [4, 4, 4] x [4, 4, 8]
        k24: matmul [4, 8, 4] x [4, 4, 4]
        k25: pointwise fill over [3, 2, 2, 4, 8]
        k26: pointwise copy over [2, 2, 4, 8]
        k27: pointwise copy over [2, 2, 4, 8]
        k28: pointwise copy over [2, 2, 4, 8]
        k29: pointwise copy over [2, 4, 3, 2, 8]
        k30: sum over [2, 4, 48] reducing [0, 1]
        k31: matmul [8, 48] x [48, 16]
        k32: matmul [16, 8] x [8, 48]
        k33: sum over [2, 4, 16] reducing [0, 1]
        k34: sum of sub mul mul over [2, 4, 16] reducing [0, 1]
    "#]]
    .assert_eq(&summary(bw));
}
