//! [`init_logging`]: print the pipeline's `tracing` spans and events to stderr.
//!
//! Every stage runs in a `tracing` span (`aot_compile`, `functionalize`, `joint`,
//! `autodiff`, `simplify`, `partition`, `run_forward`, ...) and the graphs each stage
//! produces are `debug` events; all their targets start with `aotgrad`. With the
//! subscriber installed here, `RUST_LOG=aotgrad=debug` prints every span's busy and
//! idle time when it closes, and the traced, functional, forward and backward graphs.

use std::io::IsTerminal;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

/// Install a global `tracing` subscriber writing to stderr, filtered by the `RUST_LOG`
/// environment variable (nothing is printed when it is unset), that reports each
/// span's time when the span closes. Returns `false`, changing nothing, when a global
/// subscriber is already installed (by an earlier call or by the application).
///
/// ```
/// aotgrad::init_logging();
/// ```
pub fn init_logging() -> bool {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::from_default_env())
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .is_ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn installs_once() {
        assert!(super::init_logging(), "no subscriber was installed in this test binary before");
        assert!(!super::init_logging(), "a second call changes nothing");
    }
}
