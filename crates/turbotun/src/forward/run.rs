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
    run_with(fwd, run_worker)
}

/// What a worker runs: its two queues and what else it needs to know.
type WorkerFn = fn(&crate::queue::Queue, &crate::queue::Queue, &WorkerCtx) -> Result<()>;

/// [`run`] with the worker's loop given (the tests give one that fails or panics).
fn run_with(fwd: Forwarder, worker: WorkerFn) -> Result<ForwardStats> {
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let mut handles = Vec::new();
    let mut spawn_error = None;
    for (i, job) in jobs(&fwd).into_iter().enumerate() {
        let ctx = WorkerCtx::new(&fwd, job.a_to_b);
        let done = done_tx.clone();
        let spawned = std::thread::Builder::new().name(format!("fwd-{i}")).spawn(move || {
            let work = || {
                if ctx.io == super::IoKind::Block {
                    crate::wake::unblock()?;
                }
                worker(&job.src, &job.dst, &ctx)
            };
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
    stop_workers(handles, fwd.io == super::IoKind::Block);
    match failure {
        Some(e) => Err(e),
        None => Ok(fwd.stats.snapshot()),
    }
}

/// Waits for every worker to finish, up to [`WAKE_LIMIT`], then joins them. With blocking reads (`signal`),
/// a worker asleep in the kernel sees the stop handle only when a signal interrupts its read: they are
/// signalled all together and repeatedly (a signal can land just before a worker enters its read). The other
/// I/O kinds need none: a poll wait ends on the stop handle's fd, an io_uring wait times out. Workers add what
/// they still hold to the counters before they return.
fn stop_workers(handles: Vec<JoinHandle<()>>, signal: bool) {
    let start = Instant::now();
    while handles.iter().any(|h| !h.is_finished()) && start.elapsed() < WAKE_LIMIT {
        for h in handles.iter().filter(|h| signal && !h.is_finished()) {
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

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;
    use crate::forward::{ForwardMode, ForwarderBuilder, IoKind};
    use crate::kind::{Mode, Offloads};
    use crate::queue::Queue;

    /// A plain queue over one end of a datagram socket pair (a read returns one message, as from a tun fd).
    fn fake_queue(name: &str) -> (Queue, UnixDatagram) {
        let (ours, other) = UnixDatagram::pair().unwrap();
        (Queue::new(ours.into(), name.into(), 0, Mode::Tun, 0, Offloads::NONE), other)
    }

    fn panics_one_way(src: &Queue, dst: &Queue, ctx: &WorkerCtx) -> Result<()> {
        if ctx.a_to_b {
            panic!("injected failure in {}", src.name());
        }
        run_worker(src, dst, ctx)
    }

    /// A worker that panics stops the whole forwarder: the others (here one asleep in a blocking read) are
    /// woken and joined, and `run` returns the panic as an error naming the worker.
    #[test]
    fn test_a_worker_panic_stops_every_worker() {
        let ((a, _peer_a), (b, _peer_b)) = (fake_queue("fakea"), fake_queue("fakeb"));
        let forwarder =
            ForwarderBuilder::new(ForwardMode::Plain).io(IoKind::Block).build_queues(vec![a], vec![b]).unwrap();
        let started = std::time::Instant::now();
        let err = run_with(forwarder, panics_one_way).unwrap_err();
        assert!(matches!(err, Error::WorkerPanicked { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("fakea->fakeb") && text.contains("injected failure in fakea"), "{text}");
        assert!(started.elapsed() < WAKE_LIMIT, "the blocked worker was woken, not waited out");
    }

    fn fails_one_way(src: &Queue, dst: &Queue, ctx: &WorkerCtx) -> Result<()> {
        if !ctx.a_to_b {
            return Err(Error::DeviceGone {
                name: src.name().to_string(),
                source: std::io::Error::from_raw_os_error(libc::EBADFD),
            });
        }
        run_worker(src, dst, ctx)
    }

    #[test]
    fn test_a_worker_error_stops_every_worker_and_names_it() {
        let ((a, _peer_a), (b, _peer_b)) = (fake_queue("fakec"), fake_queue("faked"));
        let forwarder =
            ForwarderBuilder::new(ForwardMode::Plain).io(IoKind::Poll).build_queues(vec![a], vec![b]).unwrap();
        let err = run_with(forwarder, fails_one_way).unwrap_err();
        assert!(err.is_device_gone(), "{err}");
        assert!(err.to_string().starts_with("faked->fakec q0 t0: device faked is gone"), "{err}");
    }
}
