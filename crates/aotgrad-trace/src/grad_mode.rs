//! Grad mode: a thread-local switch saying whether new results track gradients
//! (PyTorch's `torch.no_grad()` / `is_grad_enabled()`).

use std::cell::Cell;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread currently record gradient requirements.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Turn grad mode on or off for this thread; returns the previous setting.
pub fn set_grad_enabled(enabled: bool) -> bool {
    GRAD_ENABLED.with(|g| g.replace(enabled))
}

/// Disables grad mode until dropped, then restores the previous setting.
#[derive(Debug)]
#[must_use = "grad mode is restored when the guard is dropped"]
pub struct NoGradGuard {
    prev: bool,
}

impl NoGradGuard {
    /// Disable grad mode for this thread.
    pub fn new() -> NoGradGuard {
        NoGradGuard { prev: set_grad_enabled(false) }
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        NoGradGuard::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        set_grad_enabled(self.prev);
    }
}

/// Run `f` with grad mode disabled (restored afterwards, also on early return or panic).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = NoGradGuard::new();
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_grad_nests_and_restores() {
        assert!(is_grad_enabled());
        no_grad(|| {
            assert!(!is_grad_enabled());
            no_grad(|| assert!(!is_grad_enabled()));
            assert!(!is_grad_enabled());
        });
        assert!(is_grad_enabled());
        {
            let _g = NoGradGuard::new();
            assert!(!is_grad_enabled());
        }
        assert!(is_grad_enabled());
    }
}
