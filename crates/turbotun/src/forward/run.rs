//! Running a forwarder on threads: one worker per queue, direction and thread; a supervisor that waits for
//! the stop handle or the first failure, then stops, wakes and joins every worker.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::workers::{run_worker, WorkerCtx};
use super::{ForwardStats, Forwarder, IoKind, IDLE_WAIT};
use crate::error::{Error, Result};
use crate::queue::Queue;
use crate::stop::StopHandle;

/// How often workers asleep in a blocking read are signalled at shutdown (a signal can land just before one
/// enters the read), and for how long.
const WAKE_EVERY: Duration = Duration::from_millis(5);
const WAKE_LIMIT: Duration = Duration::from_secs(2);

/// One worker's assignment.
pub(super) struct Job {
    pub src: Arc<Queue>,
    pub dst: Arc<Queue>,
    pub a_to_b: bool,
    pub label: String,
}

/// Every worker: for each queue pair, both directions, `threads` each.
pub(super) fn jobs(fwd: &Forwarder) -> Vec<Job> {
    let mut jobs = Vec::new();
    for (q, (a, b)) in fwd.a.iter().zip(&fwd.b).enumerate() {
        for (src, dst, a_to_b) in [(a, b, true), (b, a, false)] {
            for t in 0..fwd.config.threads {
                let label = format!("{}->{} q{q} t{t}", src.name(), dst.name());
                jobs.push(Job { src: src.clone(), dst: dst.clone(), a_to_b, label });
            }
        }
    }
    jobs
}

/// What a worker reports when it ends.
pub(super) type Done = (String, Result<()>);

pub(super) fn run(fwd: Forwarder) -> Result<ForwardStats> {
    #[cfg(feature = "tokio")]
    if fwd.io == IoKind::Tokio {
        return super::tasks::run(fwd);
    }
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let mut handles = Vec::new();
    let mut spawn_error = None;
    for (i, job) in jobs(&fwd).into_iter().enumerate() {
        let ctx = WorkerCtx::new(&fwd, job.a_to_b);
        let done = done_tx.clone();
        let spawned = std::thread::Builder::new().name(format!("fwd-{i}")).spawn(move || {
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| run_worker(&job.src, &job.dst, &ctx)))
                .unwrap_or_else(|panic| {
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

/// Waits for the stop handle or the first worker to fail; returns that failure.
pub(super) fn supervise(stop: &StopHandle, done_rx: &mpsc::Receiver<Done>) -> Option<Error> {
    while !stop.is_stopped() {
        match done_rx.recv_timeout(IDLE_WAIT) {
            Ok((label, Err(e))) => return Some(worker_error(label, e)),
            Ok((_, Ok(()))) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        }
    }
    None
}

fn worker_error(label: String, e: Error) -> Error {
    match e {
        e @ Error::WorkerPanicked { .. } => e,
        e => Error::Worker { worker: label, source: Box::new(e) },
    }
}

pub(super) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
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
