//! The loops one worker runs, one per way of moving packets: split and coalesce (offload), one frame per read
//! and write (plain and passthrough), and io_uring. Each counts into its own [`Counters`] and adds what changed
//! to the forwarder's shared counters every [`FLUSH_EVERY`](crate::stats::FLUSH_EVERY) packets and whenever it goes idle.

use std::io::IoSlice;

use turbotun_wire::virtio_net::VirtioNetHdr;

use super::{Direction, ForwardMode, Forwarder, IoKind, PerPacket, StatsHandle, IDLE_WAIT};
use crate::dataplane::batch::{Batch, RecvBatch, SendBatch};
use crate::dataplane::stats::{batch_counts, final_batch_counts, Counters, Flusher, SharedCounters, WhenFull};
use crate::dataplane::write_policy::{Unit, Writer};
use crate::devices::queue::{Queue, MAX_PACKET};
use crate::devices::vnet_hdr::MAX_VNET_HDR;
use crate::error::Result;
use crate::stop::StopHandle;

/// What a worker needs to know besides its two queues.
#[derive(Clone)]
pub(super) struct WorkerCtx {
    pub mode: ForwardMode,
    pub io: IoKind,
    pub batch: usize,
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub depth: usize,
    pub when_full: WhenFull,
    pub partial_checksums: bool,
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub register_buffers: bool,
    pub gro_hold: Option<std::time::Duration>,
    pub stop: StopHandle,
    pub stats: StatsHandle,
    pub a_to_b: bool,
    pub per_packet: Option<PerPacket>,
}

impl std::fmt::Debug for WorkerCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerCtx").field("mode", &self.mode).field("io", &self.io).finish_non_exhaustive()
    }
}

impl WorkerCtx {
    pub(super) fn new(fwd: &Forwarder, a_to_b: bool) -> Self {
        WorkerCtx {
            mode: fwd.config.mode,
            io: fwd.io,
            batch: fwd.config.batch,
            depth: fwd.config.depth,
            when_full: fwd.config.when_full,
            partial_checksums: fwd.config.partial_checksums,
            register_buffers: fwd.config.register_buffers,
            gro_hold: fwd.config.gro_hold,
            stop: fwd.stop.clone(),
            stats: fwd.stats.clone(),
            a_to_b,
            per_packet: fwd.config.per_packet.clone(),
        }
    }

    /// The direction this worker moves packets in.
    pub(super) fn direction(&self) -> Direction {
        if self.a_to_b {
            Direction::AToB
        } else {
            Direction::BToA
        }
    }

    pub(super) fn shared(&self) -> &SharedCounters {
        self.stats.direction(self.a_to_b)
    }

    /// The write policy's writer for `dst`.
    pub(super) fn writer(&self, dst: &Queue) -> Writer {
        Writer { vnet_hdr_len: dst.vnet_hdr_len(), when_full: self.when_full, stop: Some(self.stop.clone()) }
    }
}

pub(super) fn run_worker(src: &Queue, dst: &Queue, ctx: &WorkerCtx) -> Result<()> {
    match (ctx.io, ctx.mode) {
        #[cfg(feature = "uring")]
        (IoKind::Uring, ForwardMode::Offload) => forward_uring_offload(src, dst, ctx),
        #[cfg(feature = "uring")]
        (IoKind::Uring, _) => forward_uring(src, dst, ctx),
        (_, ForwardMode::Offload) => forward_offload(src, dst, ctx),
        _ => forward_raw(src, dst, ctx),
    }
}

/// Buffers of one direction: one allocation made once, a stride per packet (only the pages a packet touches
/// become resident).
pub(super) fn arena(batch: usize) -> (Vec<u8>, usize) {
    let stride = MAX_VNET_HDR + MAX_PACKET;
    (vec![0u8; batch * stride], stride)
}

/// Where packets start in the offload buffers: room for the larger of the two queues' virtio headers (the receive
/// half needs its source's in front of each packet, the send half its destination's).
pub(super) fn packet_offset(src: &Queue, dst: &Queue) -> usize {
    src.vnet_hdr_len().max(dst.vnet_hdr_len())
}

/// Hands every packet of a batch to the per-packet hook, if there is one.
pub(super) fn each_packet(ctx: &WorkerCtx, batch: &mut Batch<'_, &mut [u8]>) {
    if let Some(hook) = &ctx.per_packet {
        let offset = batch.offset;
        for (buf, &len) in batch.bufs.iter_mut().zip(batch.lens.iter()) {
            hook(ctx.direction(), &mut buf[offset..offset + len]);
        }
    }
}

/// Offload: read and split into MTU-sized packets, coalesce, write.
fn forward_offload(src: &Queue, dst: &Queue, ctx: &WorkerCtx) -> Result<()> {
    let (mut arena, stride) = arena(ctx.batch);
    let mut bufs: Vec<&mut [u8]> = arena.chunks_mut(stride).collect();
    let mut lens = vec![0usize; ctx.batch];
    let mut rx =
        RecvBatch::new(src).partial_checksums(ctx.partial_checksums).gro_hold(ctx.gro_hold).stop_on(ctx.stop.clone());
    let mut tx = SendBatch::new(dst).when_full(ctx.when_full).stop_on(ctx.stop.clone());
    let mut flusher = Flusher::new(ctx.shared());
    let mut batch = Batch::new(&mut bufs, &mut lens, packet_offset(src, dst));
    let result = (|| {
        while !ctx.stop.is_stopped() {
            let got = rx.recv_many(&mut batch, Some(IDLE_WAIT))?;
            if got.packets == 0 {
                flusher.flush(batch_counts(rx.stats(), tx.stats()));
                continue;
            }
            // A batch that ended short found the queue dry: the next read may sleep (a blocking read sleeps
            // until a packet comes), so what this one moved is counted now, not after the next packet.
            let drained = got.pending == 0 && got.packets < batch.capacity();
            let mut received = batch.range(0..got.packets);
            each_packet(ctx, &mut received);
            tx.send_many(&mut received, got.checksums)?;
            let now = batch_counts(rx.stats(), tx.stats());
            if drained {
                flusher.flush(now);
            } else {
                flusher.maybe_flush(now);
            }
        }
        Ok(())
    })();
    flusher.flush(final_batch_counts(rx.stats(), tx.stats(), rx.pending()));
    result
}

/// Accounts for one frame read by a raw loop (plain or passthrough): `None` if it is to be dropped (counted).
pub(super) fn raw_frame(
    c: &mut Counters,
    frame_len: usize,
    capacity: usize,
    vnet_hdr_len: usize,
    head: &[u8],
) -> Option<Unit> {
    c.reads += 1;
    if let Err(reason) = crate::dataplane::batch::frame_len(frame_len, vnet_hdr_len, capacity) {
        tracing::debug!("dropping a frame of {frame_len} bytes ({reason})");
        c.drops.add(reason, 1);
        return None;
    }
    if vnet_hdr_len > 0 && frame_len > vnet_hdr_len && VirtioNetHdr::new_unchecked(head).is_gso() {
        c.super_packets += 1;
    }
    c.segments += 1;
    Some(Unit { packets: 1, bytes: (frame_len - vnet_hdr_len) as u64 })
}

/// Plain and passthrough: one read, one write, the frame forwarded as it came (virtio header included).
fn forward_raw(src: &Queue, dst: &Queue, ctx: &WorkerCtx) -> Result<()> {
    let vnet_hdr_len = src.vnet_hdr_len();
    let mut buf = vec![0u8; vnet_hdr_len + MAX_PACKET];
    let writer = ctx.writer(dst);
    let mut c = Counters::default();
    let mut flusher = Flusher::new(ctx.shared());
    let result = (|| {
        while !ctx.stop.is_stopped() {
            // With counts not yet shared, the read first looks without sleeping: a queue found dry has them
            // shared before a blocking read sleeps until the next packet (however long that is).
            let read = match flusher.has_unshared(&c) {
                true => match src.try_recv_raw(&mut buf) {
                    Err(e) if e.is_would_block() || e.is_nowait_unsupported() => {
                        flusher.flush(c);
                        src.recv_raw(&mut buf)
                    }
                    read => read,
                },
                false => src.recv_raw(&mut buf),
            };
            let n = match read {
                Ok(n) => n,
                Err(e) if e.is_would_block() => {
                    flusher.flush(c);
                    src.wait_readable_or_stop(&ctx.stop, Some(IDLE_WAIT))?;
                    continue;
                }
                Err(e) if e.is_interrupted() => {
                    flusher.flush(c);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(unit) = raw_frame(&mut c, n, buf.len(), vnet_hdr_len, &buf[..n.min(buf.len())]) else {
                continue;
            };
            if let Some(hook) = &ctx.per_packet {
                hook(ctx.direction(), &mut buf[vnet_hdr_len..n]);
            }
            writer.write(dst, &[IoSlice::new(&buf[..n])], unit, false, true, &mut c)?;
            flusher.maybe_flush(c);
        }
        Ok(())
    })();
    flusher.flush(c);
    result
}

/// Plain and passthrough through io_uring. Drops on the write side are also added to the destination queue's
/// `tx_dropped` (the ring has no queue to count them on).
#[cfg(feature = "uring")]
fn forward_uring(src: &Queue, dst: &Queue, ctx: &WorkerCtx) -> Result<()> {
    let ring = crate::dataplane::uring::UringForwarder::new(src, dst, ctx.depth)?.when_full(ctx.when_full);
    run_rounds(ring, ctx, Some(dst))
}

/// Offload through io_uring: reads, splits and coalesced writes over one slot arena, the writes of a round
/// submitted by the same `io_uring_enter` that waits for the next reads.
#[cfg(feature = "uring")]
fn forward_uring_offload(src: &Queue, dst: &Queue, ctx: &WorkerCtx) -> Result<()> {
    // Scattered reads rather than the multishot read over provided slots: the split copies no payload byte,
    // and a batch's worth of slots replaces `depth` 64 KiB read slots.
    let fwd = crate::dataplane::uring::UringOffload::scattered_with(src, dst, ctx.batch, ctx.register_buffers)?
        .partial_checksums(ctx.partial_checksums)
        .when_full(ctx.when_full)
        .stop_on(ctx.stop.clone());
    run_rounds(fwd, ctx, None)
}

/// The io_uring worker loop, for both kinds of ring: rounds until the stop handle fires, the counters added up
/// now and then; after a stop the writes in flight are waited for, and whatever is still held then (or at once,
/// after a failure) is counted with its reason. With `count_on`, drops on the write side are also added to
/// that queue's `tx_dropped`.
#[cfg(feature = "uring")]
fn run_rounds(mut ring: impl crate::dataplane::uring::Rounds, ctx: &WorkerCtx, count_on: Option<&Queue>) -> Result<()> {
    let mut flusher = Flusher::new(ctx.shared());
    let flush = |flusher: &mut Flusher, now: Counters| {
        let delta = flusher.flush(now);
        let write_side = delta.drops.total() - delta.drops.too_big - delta.drops.malformed;
        if let (Some(dst), true) = (count_on, write_side > 0) {
            dst.count_tx_drop(write_side);
        }
    };
    let mut last_flushed_reads = 0;
    let mut no_hook = |_: &mut [u8]| {};
    let result = loop {
        if ctx.stop.is_stopped() {
            break Ok(());
        }
        let polled = match &ctx.per_packet {
            Some(hook) => ring.round(IDLE_WAIT, &mut |packet: &mut [u8]| hook(ctx.direction(), packet)),
            None => ring.round(IDLE_WAIT, &mut no_hook),
        };
        match polled {
            Ok(busy) => {
                let now = ring.counters();
                if !busy || now.reads - last_flushed_reads >= crate::dataplane::stats::FLUSH_EVERY {
                    last_flushed_reads = now.reads;
                    flush(&mut flusher, now);
                }
            }
            Err(e) => break Err(e),
        }
    };
    let reason = match &result {
        Err(e) => crate::dataplane::write_policy::lost_with(e),
        Ok(()) => ring.wait_for_writes(IDLE_WAIT).map_or_else(
            |e| crate::dataplane::write_policy::lost_with(&e),
            |_| crate::dataplane::stats::DropReason::Stopped,
        ),
    };
    ring.give_up(reason);
    let last = ring.counters();
    flush(&mut flusher, last);
    result
}
