//! The backend differential suite (shared with the compiled CPU backend) on the wgpu
//! backend: every case's graphs run on the reference interpreter and on wgpu, with
//! equal metadata and values within the case's tolerance × 20 (f32 on the device;
//! transcendental functions and reduction orders differ from the host's). Cases
//! that compute in f64 use f32 here (WGSL has no f64).
//!
//! Without an adapter these tests fail with instructions, unless
//! `AOTGRAD_SKIP_GPU_TESTS=1` asks to skip them.

#[path = "../../aotgrad-cpu/tests/common/mod.rs"]
mod common;
#[path = "../../aotgrad-cpu/tests/differential/mod.rs"]
mod differential;
mod gpu;

use differential::Suite;

fn suite() -> Option<Suite> {
    gpu::adapter_or_skip()?;
    Some(Suite {
        backends: vec![("wgpu".into(), Box::new(aotgrad_wgpu::WgpuBackend::new()))],
        f64: false,
        tol_scale: 20.0,
    })
}

#[test]
fn unary_ops_on_every_layout() {
    if let Some(s) = suite() {
        differential::unary_ops_on_every_layout(&s);
    }
}

#[test]
fn binary_compare_where_with_broadcasting() {
    if let Some(s) = suite() {
        differential::binary_compare_where_with_broadcasting(&s);
    }
}

#[test]
fn reductions_with_prologues() {
    if let Some(s) = suite() {
        differential::reductions_with_prologues(&s);
    }
}

#[test]
fn softmax_like_row_and_column_chains() {
    if let Some(s) = suite() {
        differential::softmax_like_row_and_column_chains(&s);
    }
}

#[test]
fn independent_chains_of_several_tensors() {
    if let Some(s) = suite() {
        differential::independent_chains_of_several_tensors_match(&s);
    }
}

#[test]
fn matmuls_with_transposed_operands_and_epilogues() {
    if let Some(s) = suite() {
        differential::matmuls_with_transposed_operands_and_epilogues(&s);
    }
}

#[test]
fn reductions_over_copies_of_transposed_values() {
    if let Some(s) = suite() {
        differential::reductions_over_copies_of_transposed_values(&s);
    }
}

#[test]
fn views_of_a_value_beside_its_copy() {
    if let Some(s) = suite() {
        differential::views_of_a_value_beside_its_copy(&s);
    }
}

#[test]
fn extern_ops_views_and_aliasing_outputs() {
    if let Some(s) = suite() {
        differential::extern_ops_views_and_aliasing_outputs(&s);
    }
}

#[test]
fn scatters_in_place_and_copying() {
    if let Some(s) = suite() {
        differential::scatters_in_place_and_copying(&s);
    }
}

#[test]
fn dynamic_shapes_lower_per_binding() {
    if let Some(s) = suite() {
        differential::dynamic_shapes_lower_per_binding(&s);
    }
}

#[test]
fn input_checks_match_the_interpreter() {
    if let Some(s) = suite() {
        differential::input_checks_match_the_interpreter(&s);
    }
}

#[test]
fn tiles_of_short_rows_cross_dims_and_thread_chunks() {
    if let Some(s) = suite() {
        differential::tiles_of_short_rows_cross_dims_and_thread_chunks(&s);
    }
}

#[test]
fn scans_on_every_layout() {
    if let Some(s) = suite() {
        differential::scans_on_every_layout(&s);
    }
}
