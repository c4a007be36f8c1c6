//! Running a forwarder on threads: one worker per queue, direction and thread; when the stop handle fires or
//! the first worker fails, every worker is stopped, woken and joined.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::supervise::{jobs, panic_message, supervise, Done};
use super::workers::{run_worker, WorkerCtx};
use super::{ForwardStats, Forwarder};
use crate::error::{Error, Result};

/// How often workers asleep in a blocking read are signalled at shutdown (a signal can land just before one
/// enters the read), and for how long.
const WAKE_EVERY: Duration = Duration::from_millis(5);
const WAKE_LIMIT: Duration = Duration::from_secs(2);

pub(super) fn run(fwd: Forwarder) -> Result<ForwardStats> {
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let mut handles = Vec::new();
    let mut spawn_error = None;
    for (i, job) in jobs(&fwd).into_iter().enumerate() {
        let ctx = WorkerCtx::new(&fwd, job.a_to_b);
        let done = done_tx.clone();
        let spawned = std::thread::Builder::new().name(format!("fwd-{i}")).spawn(move || {
            let work = || crate::wake::unblock().and_then(|()| run_worker(&job.src, &job.dst, &ctx));
            let result = std::panic::catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|panic| {
                Err(Error::WorkerPanicked { worker: job.label.clone(), message: panic_message(&panic) })
            });
            let _ = done.send((job.label, result));
        });
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                spawn_error = Some(Error::io("spawning a forwarding worker", e));
                break;
            }
        }
    }
    drop(done_tx);
    let failure = match spawn_error {
        Some(e) => Some(e),
        None => supervise(&fwd.stop, &done_rx),
    };
    fwd.stop.stop();
    stop_workers(handles);
    match failure {
        Some(e) => Err(e),
        None => Ok(fwd.stats.snapshot()),
    }
}

/// Wakes every worker still asleep in a blocking call, all together and repeatedly (a signal can land just
/// before a worker enters its read), until each has finished or [`WAKE_LIMIT`] has passed; then joins them.
/// Workers see the stop handle and add what they still hold to the counters before they return.
fn stop_workers(handles: Vec<JoinHandle<()>>) {
    let start = Instant::now();
    while handles.iter().any(|h| !h.is_finished()) && start.elapsed() < WAKE_LIMIT {
        for h in handles.iter().filter(|h| !h.is_finished()) {
            if let Err(e) = crate::wake::interrupt(h) {
                tracing::warn!("waking a forwarding worker: {e}");
            }
        }
        std::thread::sleep(WAKE_EVERY);
    }
    for h in handles {
        if h.is_finished() {
            let _ = h.join();
        } else {
            tracing::warn!("a forwarding worker did not stop within {WAKE_LIMIT:?}; its last counts are lost");
        }
    }
}
