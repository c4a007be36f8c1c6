//! What the threaded and the tokio runners share: the list of workers, and waiting for the stop handle or the
//! first failure.

use std::sync::mpsc;
use std::sync::Arc;

use super::{Forwarder, IDLE_WAIT};
use crate::error::{Error, Result};
use crate::queue::Queue;
use crate::stop::StopHandle;

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
        e => Error::Worker { worker: label, error: Box::new(e) },
    }
}

pub(super) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}
