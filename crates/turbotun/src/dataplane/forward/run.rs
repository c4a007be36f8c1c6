//! Running a forwarder on threads: one worker per queue, direction and thread; when the stop handle fires or
//! the first worker fails, every worker is stopped, woken and joined.

use super::jobs::jobs;
use super::workers::{run_worker, WorkerCtx};
use super::{ForwardStats, Forwarder};
use crate::dataplane::threads::{run_workers, Worker};
use crate::error::Result;

pub(super) fn run(fwd: Forwarder) -> Result<ForwardStats> {
    run_with(fwd, run_worker)
}

/// What a worker runs: its two queues and what else it needs to know.
type WorkerFn = fn(&crate::devices::queue::Queue, &crate::devices::queue::Queue, &WorkerCtx) -> Result<()>;

/// [`run`] with the worker's loop given (the tests give one that fails or panics).
fn run_with(fwd: Forwarder, worker: WorkerFn) -> Result<ForwardStats> {
    let workers = jobs(&fwd)
        .into_iter()
        .map(|job| {
            let ctx = WorkerCtx::new(&fwd, job.a_to_b);
            let work = move || {
                if ctx.io == super::IoKind::Block {
                    crate::dataplane::wake::unblock()?;
                }
                worker(&job.src, &job.dst, &ctx)
            };
            Worker { label: job.label, work: Box::new(work) }
        })
        .collect();
    run_workers(workers, &fwd.stop, fwd.io == super::IoKind::Block)?;
    Ok(fwd.stats.snapshot())
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;
    use crate::dataplane::forward::{ForwardMode, ForwarderBuilder, IoKind};
    use crate::devices::mode::Mode;
    use crate::devices::offloads::Offloads;
    use crate::devices::queue::Queue;
    use crate::error::Error;

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
        assert!(
            started.elapsed() < crate::dataplane::threads::WAKE_LIMIT,
            "the blocked worker was woken, not waited out"
        );
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
        assert!(err.to_string().starts_with("device faked is gone"), "{err}");
    }
}
