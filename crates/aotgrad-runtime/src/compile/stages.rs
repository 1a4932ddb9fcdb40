//! What both compile paths share: the stage timer of a compile report and the
//! backend's options for a functional graph (its in-place input updates).

use aotgrad_functionalize::Functionalized;

/// Times consecutive stages.
pub(crate) struct StageTimer {
    last: std::time::Instant,
    stages: Vec<(&'static str, f64)>,
}

impl StageTimer {
    pub(crate) fn new() -> StageTimer {
        StageTimer { last: std::time::Instant::now(), stages: Vec::new() }
    }
    /// Close the stage `name` that ran since the previous call.
    pub(crate) fn stage(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.stages.push((name, (now - self.last).as_secs_f64()));
        self.last = now;
    }
    pub(crate) fn into_stages(self) -> Vec<(String, f64)> {
        self.stages.into_iter().map(|(s, t)| (s.to_string(), t)).collect()
    }
}

/// The backend's options for a functional graph: its mutated inputs, whose new
/// values (the first graph outputs) the backend may store in place. Every mutated
/// graph input overlaps no other graph input (aliased inputs a mutation reaches are
/// merged into a synthetic base, and an entry only runs on calls with its aliasing
/// pattern), and the epilogue skips the copy of a value already in place.
pub(crate) fn input_updates(fz: &Functionalized) -> aotgrad_ir::CompileOptions {
    aotgrad_ir::CompileOptions { input_updates: fz.meta.mutated_inputs.iter().copied().enumerate().collect() }
}
