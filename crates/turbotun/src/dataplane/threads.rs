//! Worker threads under one stop handle, for the forwarding engine and the tunnel engine alike: spawned with a
//! label each, supervised until the handle fires or the first one fails (or panics), then stopped and joined.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::stop::StopHandle;

/// How often the supervisor looks at the stop handle while no worker reports.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// How often workers asleep in a blocking read are signalled at shutdown (a signal can land just before one
/// enters the read), and for how long.
const WAKE_EVERY: Duration = Duration::from_millis(5);
pub(crate) const WAKE_LIMIT: Duration = Duration::from_secs(2);

/// One worker: its label (for errors) and what it runs.
pub(crate) struct Worker {
    pub label: String,
    pub work: Box<dyn FnOnce() -> Result<()> + Send>,
}

/// Runs `workers` on threads of their own until `stop` fires or the first one fails or panics; then fires
/// `stop`, and waits for every worker (signalling them when `blocking_reads` says some sleep in a read that
/// only a signal ends). Returns the first failure.
pub(crate) fn run_workers(workers: Vec<Worker>, stop: &StopHandle, blocking_reads: bool) -> Result<()> {
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let mut handles = Vec::new();
    let mut spawn_error = None;
    for (i, worker) in workers.into_iter().enumerate() {
        let done = done_tx.clone();
        let Worker { label, work } = worker;
        let name = format!("{}-{i}", label.split_whitespace().next().unwrap_or("worker"));
        // The workers log where the thread that runs the engine logs: a program embedding it may have given that
        // thread a subscriber of its own (`tracing::dispatcher::with_default`) rather than the process's.
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            let result = tracing::dispatcher::with_default(&dispatch, || {
                std::panic::catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|panic| {
                    Err(Error::WorkerPanicked { worker: label.clone(), message: panic_message(&panic) })
                })
            });
            let _ = done.send((label, result));
        });
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                spawn_error = Some(Error::io("spawning a worker thread", e));
                break;
            }
        }
    }
    drop(done_tx);
    let failure = match spawn_error {
        Some(e) => Some(e),
        None => supervise(stop, &done_rx),
    };
    stop.stop();
    stop_threads(handles, blocking_reads);
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Waits for every worker to finish, up to [`WAKE_LIMIT`], then joins them. With blocking reads (`signal`),
/// a worker asleep in the kernel sees the stop handle only when a signal interrupts its read: they are
/// signalled all together and repeatedly (a signal can land just before a worker enters its read). The other
/// I/O kinds need none: a poll wait ends on the stop handle's fd, an io_uring wait times out. Workers add what
/// they still hold to the counters before they return.
pub(crate) fn stop_threads(handles: Vec<JoinHandle<()>>, signal: bool) {
    let start = Instant::now();
    while handles.iter().any(|h| !h.is_finished()) && start.elapsed() < WAKE_LIMIT {
        for h in handles.iter().filter(|h| signal && !h.is_finished()) {
            if let Err(e) = crate::dataplane::wake::interrupt(h) {
                tracing::warn!("waking a worker: {e}");
            }
        }
        std::thread::sleep(WAKE_EVERY);
    }
    for h in handles {
        if h.is_finished() {
            let _ = h.join();
        } else {
            tracing::warn!("a worker did not stop within {WAKE_LIMIT:?}; its last counts are lost");
        }
    }
}

/// What a worker reports when it ends.
pub(crate) type Done = (String, Result<()>);

/// Waits for the stop handle or the first worker to fail; returns that failure.
pub(crate) fn supervise(stop: &StopHandle, done_rx: &mpsc::Receiver<Done>) -> Option<Error> {
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

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a subscriber wrote, kept for the test to read.
    #[derive(Clone, Default)]
    struct Caught(Arc<Mutex<Vec<u8>>>);

    impl Write for Caught {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_worker_logs_where_the_thread_that_runs_the_engine_logs() {
        let caught = Caught::default();
        let writer = caught.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let stop = StopHandle::new();
        let worker_stop = stop.clone();
        let work = Box::new(move || {
            tracing::warn!("a line from the worker's thread");
            worker_stop.stop();
            Ok(())
        });
        // The host's subscriber is this thread's only, not the process's default.
        tracing::subscriber::with_default(subscriber, || {
            run_workers(vec![Worker { label: "logging worker".into(), work }], &stop, false).unwrap();
        });
        let text = String::from_utf8(caught.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("a line from the worker's thread"), "{text:?}");
    }
}
