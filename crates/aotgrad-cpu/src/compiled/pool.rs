//! The compiled executor's fork-join pool: `threads - 1` workers that spin for a
//! while after each job before they sleep, and the calling thread, which runs tasks
//! too.
//!
//! A training step runs tens of kernels of 10–300 µs each. Handing each one to a
//! sleeping thread costs a futex wake-up (tens of microseconds on a VM) and a rayon
//! `install` two of them; here a kernel's tasks reach a spinning worker in about a
//! microsecond, so small kernels can split too. Workers spin for
//! [`spin_window`] (`AOTGRAD_CPU_SPIN_US`, default 300 µs) after their last job,
//! then sleep on a condition variable until the next.
//!
//! One job runs at a time per pool: a job started while another runs (another thread
//! calling into a graph on the same pool) and a job started from inside a task run
//! their tasks serially on the calling thread. A task that panics makes the job
//! panic on the calling thread, after every task has finished.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The job workers take tasks of: a lifetime-erased pointer to the caller's closure.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

struct Shared {
    /// Bumped when a job is published.
    epoch: AtomicU64,
    /// Whether the published job may still be entered.
    running: AtomicBool,
    /// Workers inside the published job (or checking whether to enter it).
    active: AtomicUsize,
    /// Next task index to claim.
    next: AtomicUsize,
    /// Tasks finished.
    done: AtomicUsize,
    /// Written only while no worker can read it (see [`Pool::run`]).
    job: UnsafeCell<Job>,
    /// A task's panic payload.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Sleeping workers wait on `wake` under this lock.
    sleep: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
}

// SAFETY: `job` is written by the publishing thread only while `running` is false
// and no worker is `active`, and read by workers only between entering (`active`
// incremented, `running` seen true) and leaving; the closure it points to is `Sync`
// and outlives the job (the publisher waits for every task and worker).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A pool of `threads - 1` spinning workers plus the calling thread.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    /// Held while a job runs.
    busy: Mutex<()>,
}

thread_local! {
    /// Whether this thread is running a task of some pool (nested jobs run serially).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
    /// The pool kernels on this thread split across, set by [`Pool::enter`].
    static CURRENT: Cell<*const Pool> = const { Cell::new(std::ptr::null()) };
}

/// How long an idle worker spins before it sleeps.
pub(crate) fn spin_window() -> Duration {
    static W: OnceLock<Duration> = OnceLock::new();
    *W.get_or_init(|| {
        let us = std::env::var("AOTGRAD_CPU_SPIN_US").ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(300);
        Duration::from_micros(us)
    })
}

impl Pool {
    /// The process-wide pool of `threads` threads (`threads >= 2`), started on first use.
    pub(crate) fn shared(threads: usize) -> std::io::Result<Arc<Pool>> {
        static POOLS: OnceLock<Mutex<HashMap<usize, Arc<Pool>>>> = OnceLock::new();
        let mut pools = POOLS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pools.get(&threads) {
            return Ok(p.clone());
        }
        let pool = Arc::new(Pool::start(threads)?);
        pools.insert(threads, pool.clone());
        Ok(pool)
    }

    fn start(threads: usize) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            running: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            job: UnsafeCell::new(Job { f: &|_| {}, tasks: 0 }),
            panic: Mutex::new(None),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        for i in 1..threads.max(1) {
            let s = shared.clone();
            std::thread::Builder::new().name(format!("aotgrad-cpu-{i}")).spawn(move || worker(&s))?;
        }
        Ok(Pool { shared, threads, busy: Mutex::new(()) })
    }

    /// Run `f` with this pool as the one [`current`] returns on this thread.
    pub(crate) fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(*const Pool);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(self as *const Pool)));
        f()
    }

    /// Run `f(0..tasks)`, each index once, on the pool's threads and this one;
    /// returns when all have run.
    pub(crate) fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        let nested = IN_TASK.with(Cell::get);
        let busy = if nested || tasks == 1 || self.threads < 2 { None } else { self.busy.try_lock().ok() };
        let Some(_busy) = busy else {
            for t in 0..tasks {
                f(t);
            }
            return;
        };
        let s = &*self.shared;
        // SAFETY: no worker reads `job` now: `running` is false and none is active
        // (the previous job waited for them).
        unsafe {
            *s.job.get() = Job { f: std::mem::transmute::<_, *const (dyn Fn(usize) + Sync)>(f), tasks };
        }
        s.next.store(0, SeqCst);
        s.done.store(0, SeqCst);
        s.running.store(true, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| take_tasks(s, f, tasks)));
        while s.done.load(SeqCst) < tasks {
            std::hint::spin_loop();
        }
        s.running.store(false, SeqCst);
        while s.active.load(SeqCst) > 0 {
            std::hint::spin_loop();
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if let Some(p) = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            std::panic::resume_unwind(p);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.wake.notify_all();
    }
}

/// Run `f(0..tasks)` on the pool this thread entered (serially without one).
pub(crate) fn par_tasks(tasks: usize, f: impl Fn(usize) + Sync) {
    if tasks <= 1 {
        if tasks == 1 {
            f(0);
        }
        return;
    }
    current(|p| match p {
        Some(p) => p.run(tasks, &f),
        None => (0..tasks).for_each(&f),
    })
}

/// The pool kernels on this thread split across ([`Pool::enter`]), if any.
pub(crate) fn current<R>(f: impl FnOnce(Option<&Pool>) -> R) -> R {
    let p = CURRENT.with(Cell::get);
    // SAFETY: `enter` keeps the pool borrowed while the pointer is set.
    f(unsafe { p.as_ref() })
}

/// Claim and run tasks of the current job until none is left; each counts as done.
fn take_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), tasks: usize) {
    let was = IN_TASK.with(|c| c.replace(true));
    loop {
        let t = s.next.fetch_add(1, SeqCst);
        if t >= tasks {
            break;
        }
        let r = catch_unwind(AssertUnwindSafe(|| f(t)));
        if let Err(p) = r {
            s.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(p);
        }
        s.done.fetch_add(1, SeqCst);
    }
    IN_TASK.with(|c| c.set(was));
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    let mut idle_since = Instant::now();
    loop {
        if s.stop.load(SeqCst) {
            return;
        }
        if s.epoch.load(SeqCst) != seen {
            s.active.fetch_add(1, SeqCst);
            let epoch = s.epoch.load(SeqCst);
            if s.running.load(SeqCst) && epoch != seen {
                seen = epoch;
                // SAFETY: entered while `running`: the job and its closure stay valid
                // until this worker leaves (`active`).
                let job = unsafe { *s.job.get() };
                take_tasks(s, unsafe { &*job.f }, job.tasks);
            }
            s.active.fetch_sub(1, SeqCst);
            idle_since = Instant::now();
            continue;
        }
        if idle_since.elapsed() < spin_window() {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            continue;
        }
        // Asleep until a job is published (or, as a safeguard, a while has passed;
        // still idle then, it sleeps again without spinning).
        let g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
        if s.epoch.load(SeqCst) == seen && !s.stop.load(SeqCst) {
            drop(s.wake.wait_timeout(g, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_and_panics_reach_the_caller() {
        let pool = Pool::start(3).expect("threads");
        for tasks in [1usize, 2, 3, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            pool.run(tasks, &|t| {
                hits[t].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
        }
        // Nested jobs run serially inside the task.
        let sum = AtomicUsize::new(0);
        pool.run(4, &|_| {
            pool.run(5, &|u| {
                sum.fetch_add(u, SeqCst);
            })
        });
        assert_eq!(sum.load(SeqCst), 4 * 10);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(8, &|t| {
                if t == 5 {
                    panic!("task 5");
                }
            })
        }));
        assert!(r.is_err());
        // The pool still works after a panic.
        let n = AtomicUsize::new(0);
        pool.run(9, &|_| {
            n.fetch_add(1, SeqCst);
        });
        assert_eq!(n.load(SeqCst), 9);
    }

    #[test]
    fn workers_wake_after_sleeping() {
        let pool = Pool::start(2).expect("threads");
        std::thread::sleep(spin_window() + Duration::from_millis(5));
        let n = AtomicUsize::new(0);
        pool.run(64, &|_| {
            n.fetch_add(1, SeqCst);
        });
        assert_eq!(n.load(SeqCst), 64);
    }
}
