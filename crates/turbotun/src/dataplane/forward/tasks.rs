//! Running a forwarder as tokio tasks: one task per queue and direction over [`AsyncQueue`], on a runtime of
//! its own. The loops are the threaded workers' loops with readiness awaited instead of blocked on.

use std::io::IoSlice;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::jobs::jobs;
use super::workers::{arena, each_packet, packet_offset, raw_frame, WorkerCtx};
use super::{ForwardMode, ForwardStats, Forwarder};
use crate::dataplane::batch::Batch;
use crate::dataplane::stats::Counters;
use crate::dataplane::stats::{batch_counts, final_batch_counts, Flusher};
use crate::dataplane::threads::{panic_message, supervise, Done};
use crate::dataplane::tokio::AsyncQueue;
use crate::dataplane::write_policy::Written;
use crate::devices::queue::{Queue, MAX_PACKET};
use crate::error::{Error, Result};

/// How long the runtime's shutdown waits for tasks at their await points.
const SHUTDOWN: Duration = Duration::from_millis(500);

pub(super) fn run(fwd: Forwarder) -> Result<ForwardStats> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fwd-tokio")
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| Error::io("starting the tokio runtime", e))?;
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let failure = {
        let _enter = runtime.enter();
        let mut queues = std::collections::HashMap::new();
        let mut failure = None;
        for job in jobs(&fwd) {
            let (src, dst) = match (async_queue(&mut queues, &job.src), async_queue(&mut queues, &job.dst)) {
                (Ok(src), Ok(dst)) => (src, dst),
                (Err(e), _) | (_, Err(e)) => {
                    failure = Some(e);
                    break;
                }
            };
            let ctx = WorkerCtx::new(&fwd, job.a_to_b);
            let task = runtime.spawn(async move {
                match ctx.mode {
                    ForwardMode::Offload => forward_offload(&src, &dst, &ctx).await,
                    _ => forward_raw(&src, &dst, &ctx).await,
                }
            });
            let done = done_tx.clone();
            let label = job.label;
            // A panic inside the task comes back through its join handle.
            runtime.spawn(async move {
                let result = match task.await {
                    Ok(result) => result,
                    Err(e) if e.is_panic() => {
                        Err(Error::WorkerPanicked { worker: label.clone(), message: panic_message(&e.into_panic()) })
                    }
                    Err(_) => Ok(()),
                };
                let _ = done.send((label, result));
            });
        }
        failure
    };
    drop(done_tx);
    let failure = failure.or_else(|| supervise(&fwd.stop, &done_rx));
    fwd.stop.stop();
    // Tasks are dropped at their await points; they have added their counts after every batch.
    runtime.shutdown_timeout(SHUTDOWN);
    match failure {
        Some(e) => Err(e),
        None => Ok(fwd.stats.snapshot()),
    }
}

/// Each queue registered once with the runtime, however many jobs use it.
fn async_queue(
    registered: &mut std::collections::HashMap<usize, AsyncQueue>,
    queue: &Arc<Queue>,
) -> Result<AsyncQueue> {
    let key = Arc::as_ptr(queue) as usize;
    if let Some(q) = registered.get(&key) {
        return Ok(q.clone());
    }
    let q = AsyncQueue::from_shared(queue.clone())?;
    registered.insert(key, q.clone());
    Ok(q)
}

async fn forward_offload(src: &AsyncQueue, dst: &AsyncQueue, ctx: &WorkerCtx) -> Result<()> {
    let (mut arena, stride) = arena(ctx.batch);
    let mut bufs: Vec<&mut [u8]> = arena.chunks_mut(stride).collect();
    let mut lens = vec![0usize; ctx.batch];
    let mut rx = src.recv_batch().partial_checksums(ctx.partial_checksums);
    let mut tx = dst.send_batch().when_full(ctx.when_full).stop_on(ctx.stop.clone());
    // A task may be dropped at any await point when the forwarder stops: counts are added after every batch, and
    // a batch dropped while it waits for room counts what it had not written.
    let mut flusher = Flusher::new(ctx.shared());
    let mut batch = Batch::new(&mut bufs, &mut lens, packet_offset(src.get_ref(), dst.get_ref()));
    loop {
        let got = match rx.recv_many(&mut batch).await {
            Ok(got) => got,
            Err(e) => {
                flusher.flush(final_batch_counts(rx.stats(), tx.stats(), rx.pending()));
                return Err(e);
            }
        };
        let mut received = batch.range(0..got.packets);
        each_packet(ctx, &mut received);
        let sent = tx.send_many(&mut received, got.checksums).await;
        flusher.flush(batch_counts(rx.stats(), tx.stats()));
        sent?;
    }
}

async fn forward_raw(src: &AsyncQueue, dst: &AsyncQueue, ctx: &WorkerCtx) -> Result<()> {
    let vnet_hdr_len = src.get_ref().vnet_hdr_len();
    let mut buf = vec![0u8; vnet_hdr_len + MAX_PACKET];
    let writer = ctx.writer(dst.get_ref());
    let mut c = Counters::default();
    let mut flusher = Flusher::new(ctx.shared());
    loop {
        let n = src.recv_raw(&mut buf).await?;
        let Some(unit) = raw_frame(&mut c, n, buf.len(), vnet_hdr_len, &buf[..n.min(buf.len())]) else {
            flusher.flush(c);
            continue;
        };
        if let Some(hook) = &ctx.per_packet {
            hook(ctx.direction(), &mut buf[vnet_hdr_len..n]);
        }
        // A full queue is awaited, not waited on: the write policy hands it back instead of polling.
        let written = dst
            .write_when_room(|q| match writer.write(q, &[IoSlice::new(&buf[..n])], unit, false, false, &mut c) {
                Ok(Written::Full) => Ok(None),
                other => other.map(Some),
            })
            .await;
        flusher.flush(c);
        written?;
    }
}
