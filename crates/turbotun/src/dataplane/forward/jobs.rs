//! The job list both runners (threads and tokio tasks) start their workers from: one job per queue pair,
//! direction and thread. Waiting for the stop handle or the first failure is `dataplane::threads`'s, which the
//! tunnel engine shares.

use std::sync::Arc;

use super::Forwarder;
use crate::devices::queue::Queue;

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
                let label = format!("{}->{} queue {q} thread {t}", src.name(), dst.name());
                jobs.push(Job { src: src.clone(), dst: dst.clone(), a_to_b, label });
            }
        }
    }
    jobs
}
