//! The receive half: one read per call, split into the caller's buffers.
//!
//! Every read goes through [`RecvBatch::read_frame`]; what differs between reads is only where the bytes land
//! (the [`Layout`]): straight into the caller's first buffer (a queue that never receives super-packets), into
//! the scratch buffer (a super-packet is split from there by copying), or scattered so that each segment's
//! payload lands in its own buffer behind room for its header (the zero-copy split).

use std::borrow::Borrow;
use std::os::fd::AsFd;

use turbotun_wire::gso::{SplitProgress, Splitter};
use turbotun_wire::scatter::{Placement, ScatterShape};
use turbotun_wire::virtio_net::{flags, gso, VirtioNetHdrRepr};
use turbotun_wire::{Batch, Checksums, Framing};

use super::{frame_len, MAX_SEGMENTS};
use crate::dataplane::stats::{Counters, DropReason};
use crate::devices::queue::{Queue, MAX_PACKET};
use crate::devices::vnet_hdr::MAX_VNET_HDR;
use crate::error::{queue_io_error, ConfigError, Error, Malformed, Result};
use crate::stop::StopHandle;
use crate::sys;

/// What one [`RecvBatch::recv_many`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Received {
    /// Packets written to the batch's `bufs[..packets]`.
    pub packets: usize,
    /// Segments of the last super-packet that did not fit and will be returned by the next call (no read).
    pub pending: usize,
    /// What is known of these packets' L4 checksums, to hand to [`crate::batch::SendBatch::send_many`] with them:
    /// [`Checksums::Valid`] when we completed or computed them or the kernel marked them `DATA_VALID` (a
    /// coalescer need not verify them again), [`Checksums::Partial`] when segments were left with partial
    /// checksums ([`RecvBatch::partial_checksums`]), [`Checksums::Unverified`] otherwise.
    pub checksums: Checksums,
}

impl Received {
    const NOTHING: Received = Received { packets: 0, pending: 0, checksums: Checksums::Unverified };
}

/// A super-packet read earlier whose remaining segments did not fit the caller's buffers.
struct Pending {
    hdr: VirtioNetHdrRepr,
    len: usize,
    next: usize,
    total: usize,
}

/// Where one read puts the frame after its virtio header.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// Into the first buffer at `offset` (the queue never receives super-packets: nothing to split).
    Direct,
    /// Into the scratch buffer, to be split by copying.
    Scratch,
    /// Each segment's part into its own buffer at `offset` (see [`ScatterShape::piece`]), the rest into scratch:
    /// the shape of the last super-packet.
    Scattered(ScatterShape),
}

impl Layout {
    /// Bytes this layout can take after the virtio header.
    fn capacity(self, first_buf: usize, scratch: usize) -> usize {
        match self {
            Layout::Direct => first_buf,
            Layout::Scratch => scratch,
            // A scattered frame is reassembled in scratch when it is not the predicted super-packet.
            Layout::Scattered(_) => scratch,
        }
    }
}

/// The receive half's state, apart from its queue (which the public [`RecvBatch`] holds and passes in), so that
/// the I/O paths that own their queues differently (tokio) share it.
pub(crate) struct RecvHalf {
    framing: Framing,
    vnet_hdr_len: usize,
    /// Where super-packets land before they are split: made on the first read of a queue that may receive
    /// them (one with segmentation offloads, granted at open or later), empty until then.
    scratch: Box<[u8]>,
    pending: Option<Pending>,
    stats: Counters,
    /// Whether reads after the first of a batch can be made non-sleeping with `RWF_NOWAIT` (probed on use).
    /// Every batch reads until the queue is empty or the buffers are full (without a [`Self::hold`] nothing is
    /// held back to wait for packets not yet queued: the one that wakes an idle reader leaves alone if the next
    /// comes later; see docs/CONTRACTS.md, "The I/O paths"). Skipping the further reads after
    /// one found nothing (for the next 1, 2, 4 ... 16 batches) saved a system call per batch of a packet
    /// trickle but read the first segments of every burst after an idle gap alone, unmerged, and cost more
    /// than it saved (BENCHMARKS.md, "Reading after an idle gap").
    nowait: bool,
    /// The shape of the last super-packet: the next read is scattered so that, if it holds, each segment's
    /// payload lands in its own buffer right behind room for its header (zero-copy split).
    predicted: Option<ScatterShape>,
    /// Hand UDP super-packets over whole, each packet with its virtio header in front (see
    /// [`RecvBatch::keep_udp_super_packets`]).
    whole_udp: bool,
    /// Whether the last frame was handed over whole: it ends the batch, like a split super-packet.
    last_whole: bool,
    /// Leave the L4 checksums of split segments partial (see [`RecvBatch::partial_checksums`]).
    partial: bool,
    /// Ends a wait for packets at once when it fires (see [`RecvBatch::stop_on`]).
    stop: Option<StopHandle>,
    /// How long a batch that found the queue dry waits for more (see [`RecvBatch::gro_hold`]).
    hold: Option<std::time::Duration>,
}

impl std::fmt::Debug for RecvHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvHalf").field("framing", &self.framing).field("stats", &self.stats).finish()
    }
}

impl RecvHalf {
    /// A receive half for `queue` (its mode, virtio header size and offloads decide how reads are laid out).
    pub(crate) fn new(queue: &Queue) -> Self {
        RecvHalf {
            framing: queue.mode().framing(),
            vnet_hdr_len: queue.vnet_hdr_len(),
            scratch: Box::default(),
            pending: None,
            stats: Counters::default(),
            nowait: true,
            predicted: None,
            whole_udp: false,
            last_whole: false,
            partial: false,
            stop: None,
            hold: None,
        }
    }

    /// See [`RecvBatch::gro_hold`].
    pub(crate) fn gro_hold(mut self, hold: Option<std::time::Duration>) -> Self {
        self.hold = hold.filter(|h| !h.is_zero());
        self
    }

    /// See [`RecvBatch::partial_checksums`].
    pub(crate) fn partial_checksums(mut self, on: bool) -> Self {
        self.partial = on;
        self
    }

    /// See [`RecvBatch::stop_on`].
    pub(crate) fn stop_on(mut self, stop: StopHandle) -> Self {
        self.stop = Some(stop);
        self
    }

    /// See [`RecvBatch::keep_udp_super_packets`].
    pub(crate) fn keep_udp_super_packets(mut self, on: bool) -> Self {
        self.whole_udp = on && self.vnet_hdr_len > 0;
        self
    }

    /// What this receive half has read (reads, super-packets, segments, zero-copy splits, drops by reason).
    pub(crate) fn stats(&self) -> Counters {
        self.stats
    }

    /// Segments read (part of a super-packet) that the next call hands over without reading.
    pub(crate) fn pending(&self) -> usize {
        self.pending.as_ref().map_or(0, |p| p.total - p.next)
    }

    /// Fills as much of `batch` as the queue has ready: the first read waits (up to `timeout`, on a non-blocking
    /// queue), later ones only take what is there already. A batch ends after a super-packet (its segments, or
    /// those that fit, with the rest pending for next time). Returns zero packets on timeout, or when a signal
    /// interrupted a blocking read (see [`crate::wake`]), so that the caller can look at its flags.
    pub(crate) fn recv_many<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        batch: &mut Batch<'_, B>,
        timeout: Option<std::time::Duration>,
    ) -> Result<Received> {
        loop {
            match self.try_recv_many(queue, batch) {
                Err(e) if e.is_interrupted() => return Ok(Received::NOTHING),
                Err(e) if e.is_would_block() => {
                    if !queue.wait_or_stop(rustix::event::PollFlags::IN, self.stop.as_ref(), timeout)? {
                        return Ok(Received::NOTHING);
                    }
                }
                other => return other,
            }
        }
    }

    /// Like [`Self::recv_many`] without waiting: on a non-blocking queue with nothing to read it returns the
    /// would-block error (see [`Error::is_would_block`]), which is what an event loop waits on. On a
    /// blocking queue the first read sleeps until a packet comes; the later ones never do (`RWF_NOWAIT`), so a
    /// batch holds what was already queued. A kernel without `RWF_NOWAIT` gets one read per batch on a blocking
    /// queue.
    pub(crate) fn try_recv_many<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        batch: &mut Batch<'_, B>,
    ) -> Result<Received> {
        let mut total = Received { packets: 0, pending: 0, checksums: Checksums::Valid };
        let n = batch.capacity();
        // When the hold (if any) ends: counted from the batch's first packet, so a batch waits `hold` at most.
        let mut held_until: Option<std::time::Instant> = None;
        while total.packets < n {
            let nowait = total.packets > 0;
            if nowait && !self.nowait {
                break;
            }
            match self.recv_one(queue, &mut batch.range(total.packets..n), nowait) {
                Ok(r) => {
                    total.checksums = self.join_checksums(
                        (total.checksums, total.packets),
                        r.checksums,
                        &mut batch.range(0..total.packets + r.packets),
                    );
                    total.packets += r.packets;
                    total.pending = r.pending;
                    if self.last_whole {
                        break;
                    }
                    // A batch ends with a super-packet: its segments coalesce back into the buffer it started in,
                    // so the only buffer that grows to 64 KiB is the one at the batch's start, instead of heads
                    // wandering over every buffer (each would end up resident) as reads straddle batches.
                    if r.pending > 0 || r.packets > 1 {
                        break;
                    }
                }
                Err(e) if e.is_would_block() && total.packets > 0 => {
                    let Some(hold) = self.hold else { break };
                    let until = *held_until.get_or_insert_with(|| std::time::Instant::now() + hold);
                    let left = until.saturating_duration_since(std::time::Instant::now());
                    // A wait that ends empty, stopped or interrupted hands over what the batch holds.
                    let more = !left.is_zero()
                        && queue
                            .wait_or_stop(rustix::event::PollFlags::IN, self.stop.as_ref(), Some(left))
                            .is_ok_and(|m| m);
                    if !more {
                        break;
                    }
                }
                Err(e) if e.is_nowait_unsupported() && total.packets > 0 => {
                    self.nowait = false;
                    break;
                }
                // What this batch already holds is handed over; the next call meets the error again.
                Err(_) if total.packets > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    /// The checksum state of a batch of `before.1` packets in state `before.0` followed by packets in state
    /// `added` (the rest of `batch`): partial checksums beside unverified ones are completed, since one state
    /// must describe the batch for the coalescer.
    fn join_checksums<B: AsMut<[u8]>>(
        &self,
        (state, n): (Checksums, usize),
        added: Checksums,
        batch: &mut Batch<'_, B>,
    ) -> Checksums {
        if n == 0 {
            return added;
        }
        state.join(added).unwrap_or_else(|| {
            let partial = if state == Checksums::Partial { 0..n } else { n..batch.bufs.len() };
            let offset = batch.offset;
            for i in partial {
                let packet = &mut batch.bufs[i].as_mut()[offset..offset + batch.lens[i]];
                turbotun_wire::partial::complete(packet, self.framing);
            }
            Checksums::Unverified
        })
    }

    /// [`Self::recv`]; with `nowait` the read never sleeps, even on a blocking queue (a would-block error).
    fn recv_one<B: AsMut<[u8]>>(&mut self, queue: &Queue, batch: &mut Batch<'_, B>, nowait: bool) -> Result<Received> {
        let offset = batch.offset;
        if batch.bufs.is_empty() || batch.lens.len() < batch.bufs.len() {
            return Err(Error::Config(ConfigError::Size {
                why: "recv needs at least one buffer and a length slot per buffer".into(),
            }));
        }
        let first = batch.bufs[0].as_mut().len();
        if first <= offset {
            return Err(Error::BufferTooSmall { have: first, need: offset + 1 });
        }
        self.last_whole = false;
        if self.whole_udp && offset < self.vnet_hdr_len {
            return Err(Error::Config(ConfigError::Size {
                why: format!(
                    "offset {offset} leaves no room for the {}-byte virtio header in front of each packet",
                    self.vnet_hdr_len
                ),
            }));
        }
        let received = self.recv_frame(queue, batch, nowait)?;
        if self.whole_udp && !self.last_whole {
            for buf in batch.bufs[..received.packets].iter_mut() {
                buf.as_mut()[offset - self.vnet_hdr_len..offset].fill(0);
            }
        }
        Ok(received)
    }

    /// [`Self::recv_one`] after its checks: the packets of one frame, or the pending segments of the last.
    fn recv_frame<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        batch: &mut Batch<'_, B>,
        nowait: bool,
    ) -> Result<Received> {
        if self.pending.is_some() {
            return self.split_pending(queue, batch);
        }
        loop {
            let layout = self.layout(queue, batch);
            let Some((hdr, len)) = self.read_frame(queue, batch, nowait, layout)? else {
                continue;
            };
            if self.whole_udp && hdr.gso_kind() == gso::UDP_L4 {
                match self.deliver_super_packet(queue, &hdr, len, layout, batch) {
                    Some(received) => return Ok(received),
                    None => continue,
                }
            }
            let in_place = match layout {
                Layout::Direct => {
                    let packet = &mut batch.bufs[0].as_mut()[batch.offset..batch.offset + len];
                    Some(self.deliver_whole(&hdr, packet, batch.lens))
                }
                Layout::Scattered(shape) => self.split_scattered(&hdr, len, batch, shape),
                Layout::Scratch => None,
            };
            let received = match in_place {
                Some(received) => received,
                None => self.split_scratch(queue, hdr, len, batch)?,
            };
            if received.packets > 0 {
                return Ok(received);
            }
            // Dropped (counted): the next frame.
        }
    }

    /// Where the next read should put its frame.
    /// The queue's offloads are read per call: a monitor may grant or take them away at any time
    /// ([`Queue::set_offloads`]).
    fn layout<B: AsMut<[u8]>>(&mut self, queue: &Queue, batch: &mut Batch<'_, B>) -> Layout {
        if !queue.receives_super_packets() {
            return Layout::Direct;
        }
        if self.scratch.is_empty() {
            self.scratch = vec![0u8; MAX_PACKET].into_boxed_slice();
        }
        let Some(shape) = self.predicted else {
            return Layout::Scratch;
        };
        let k = batch.bufs.len().min(sys::MAX_SCATTER - 2);
        // Every buffer must have room for its part; otherwise the copying split (which reports small buffers).
        let room = batch.offset + shape.buffer_len();
        if k < 2 || batch.bufs[..k].iter_mut().any(|b| b.as_mut().len() < room) {
            self.predicted = None;
            return Layout::Scratch;
        }
        Layout::Scattered(shape.with_segments(k))
    }

    /// The one read: the virtio header into a small array, the frame where `layout` says. Returns the header and
    /// the frame's length after it, or `None` for a frame that cannot be used (counted as a drop with its
    /// reason).
    fn read_frame<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        batch: &mut Batch<'_, B>,
        nowait: bool,
        layout: Layout,
    ) -> Result<Option<(VirtioNetHdrRepr, usize)>> {
        let (bufs, offset) = (&mut *batch.bufs, batch.offset);
        let vlen = self.vnet_hdr_len;
        let mut head = [0u8; MAX_VNET_HDR];
        let first_buf = bufs[0].as_mut().len() - offset;
        let head_part = std::iter::once(&mut head[..vlen]);
        let read = match layout {
            Layout::Direct => {
                let parts = head_part.chain(std::iter::once(&mut bufs[0].as_mut()[offset..]));
                sys::read_scattered(queue.as_fd(), parts, nowait)
            }
            Layout::Scratch => {
                let parts = head_part.chain(std::iter::once(&mut self.scratch[..]));
                sys::read_scattered(queue.as_fd(), parts, nowait)
            }
            Layout::Scattered(shape) => {
                let parts = head_part
                    .chain(bufs[..shape.segments].iter_mut().enumerate().map(|(i, b)| {
                        let piece = shape.piece(i);
                        &mut b.as_mut()[offset + piece.start..offset + piece.end]
                    }))
                    .chain(std::iter::once(&mut self.scratch[..]));
                sys::read_scattered(queue.as_fd(), parts, nowait)
            }
        };
        let n = read.map_err(|e| queue_io_error(queue.name(), "read", e))?;
        self.stats.reads += 1;
        let len = match frame_len(n, vlen, vlen + layout.capacity(first_buf, self.scratch.len())) {
            Ok(len) => len,
            Err(DropReason::TooBig) => {
                queue.count_rx(1, (n - vlen) as u64);
                return Ok(self.drop_frame(queue, DropReason::TooBig, format!("a {}-byte frame", n - vlen)));
            }
            Err(reason) => return Ok(self.drop_frame(queue, reason, Malformed::ShortRead.to_string())),
        };
        queue.count_rx(1, len as u64);
        // A queue without a virtio header reads plain packets: nothing to parse, no offload to undo.
        let hdr = match VirtioNetHdrRepr::parse(&head[..vlen]) {
            _ if vlen == 0 => VirtioNetHdrRepr::default(),
            Ok(hdr) => hdr,
            Err(e) => return Ok(self.drop_frame(queue, DropReason::Malformed, Malformed::VirtioHeader(e).to_string())),
        };
        if hdr.is_gso() {
            self.stats.super_packets += 1;
        }
        Ok(Some((hdr, len)))
    }

    fn drop_frame<T>(&mut self, queue: &Queue, reason: DropReason, what: String) -> Option<T> {
        tracing::debug!("{}: dropping a frame ({reason}): {what}", queue.name());
        self.stats.drops.add(reason, 1);
        None
    }

    /// Hands a super-packet over whole (see [`Self::keep_udp_super_packets`]): moved into the first buffer if the
    /// read put it elsewhere, its virtio header written in front of it. `None` if it was dropped (counted).
    fn deliver_super_packet<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        hdr: &VirtioNetHdrRepr,
        len: usize,
        layout: Layout,
        batch: &mut Batch<'_, B>,
    ) -> Option<Received> {
        let Batch { bufs, lens, offset } = batch;
        let offset = *offset;
        match layout {
            Layout::Direct => {}
            Layout::Scratch | Layout::Scattered(_) => {
                if let Layout::Scattered(shape) = layout {
                    shape.join(bufs, offset, len, &mut self.scratch);
                }
                let first = bufs[0].as_mut();
                if first.len() < offset + len {
                    let what = format!("a {len}-byte super-packet for a {}-byte buffer", first.len() - offset);
                    return self.drop_frame(queue, DropReason::TooBig, what);
                }
                first[offset..offset + len].copy_from_slice(&self.scratch[..len]);
            }
        }
        hdr.emit(&mut bufs[0].as_mut()[offset - self.vnet_hdr_len..offset]);
        lens[0] = len;
        self.stats.segments += 1;
        self.last_whole = true;
        // Its checksum is the partial one the header describes, to be completed by whoever takes the write.
        Some(Received { packets: 1, pending: 0, checksums: Checksums::Valid })
    }

    /// The frame sits scattered as [`Layout::Scattered`] put it. If it is the predicted super-packet, each
    /// segment only needs its header written: no payload byte is copied. A plain packet that fits the first
    /// buffer is delivered where it is. Anything else is joined in scratch (`None`: split by copying).
    fn split_scattered<B: AsMut<[u8]>>(
        &mut self,
        hdr: &VirtioNetHdrRepr,
        len: usize,
        batch: &mut Batch<'_, B>,
        shape: ScatterShape,
    ) -> Option<Received> {
        let offset = batch.offset;
        match shape.placement(hdr, len) {
            Placement::Whole => {
                return Some(self.deliver_whole(hdr, &mut batch.bufs[0].as_mut()[offset..offset + len], batch.lens));
            }
            Placement::Segments => {
                let split = shape.split_in_place(hdr, len, self.framing, self.partial, batch);
                if let Some((count, left_partial)) = split {
                    self.stats.zero_copy_splits += 1;
                    let progress = SplitProgress { produced: count, next: count, total: count };
                    return Some(self.received(hdr, left_partial, progress));
                }
            }
            Placement::Join => {}
        }
        shape.join(batch.bufs, offset, len, &mut self.scratch);
        None
    }

    /// The copying split of a frame in `scratch[..len]`; segments that do not fit stay pending.
    fn split_scratch<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        hdr: VirtioNetHdrRepr,
        len: usize,
        batch: &mut Batch<'_, B>,
    ) -> Result<Received> {
        // Validated once here; only segments left for a later call are split from `Pending` again.
        let splitter = match Splitter::new(&hdr, &self.scratch[..len], self.framing) {
            Ok(splitter) => splitter.leave_checksums_partial(self.partial),
            Err(e) => {
                let _: Option<()> = self.drop_frame(queue, DropReason::Malformed, Malformed::Gso(e).to_string());
                return Ok(Received::NOTHING);
            }
        };
        if splitter.is_gso() {
            // The segment count is the next layout's (what the buffers then hold).
            self.predicted = ScatterShape::of(&splitter, 2);
        }
        let total = splitter.segment_count();
        if total > MAX_SEGMENTS {
            tracing::debug!(
                "{}: a super-packet of {total} segments: the last {} dropped",
                queue.name(),
                total - MAX_SEGMENTS
            );
            self.stats.drops.add(DropReason::TooManySegments, (total - MAX_SEGMENTS) as u64);
        }
        let limit = total.min(MAX_SEGMENTS);
        let room = batch.bufs.len().min(limit);
        let progress = match splitter.split_into(0, &mut Batch::new(&mut batch.bufs[..room], batch.lens, batch.offset))
        {
            Ok(progress) => progress,
            Err(e) => {
                // Buffers too small: keep the super-packet for a call with larger ones.
                self.pending = Some(Pending { hdr, len, next: 0, total: limit });
                return Err(split_error(queue, e));
            }
        };
        let progress = SplitProgress { total: limit, ..progress };
        if progress.next < limit {
            self.pending = Some(Pending { hdr, len, next: progress.next, total: limit });
        }
        let left_partial = splitter.checksums_left_partial();
        Ok(self.received(&hdr, left_partial, progress))
    }

    /// Accounts for what one split produced (`left_partial`: the splitter left the checksums partial).
    fn received(&mut self, hdr: &VirtioNetHdrRepr, left_partial: bool, progress: SplitProgress) -> Received {
        self.stats.segments += progress.produced as u64;
        // We computed every checksum ourselves when the kernel left them partial; otherwise trust DATA_VALID.
        let checksums = if left_partial {
            Checksums::Partial
        } else {
            Checksums::from(hdr.flags & (flags::NEEDS_CSUM | flags::DATA_VALID) != 0)
        };
        Received { packets: progress.produced, pending: progress.total - progress.next, checksums }
    }

    /// Hands over a GSO_NONE packet that already sits where it belongs (in the first buffer), its checksum
    /// completed if partial.
    fn deliver_whole(&mut self, hdr: &VirtioNetHdrRepr, packet: &mut [u8], lens: &mut [usize]) -> Received {
        let valid = match hdr.finish_whole(packet) {
            Ok(valid) => valid,
            Err(e) => {
                tracing::debug!("dropping a frame: {}", Malformed::PartialChecksum(e));
                self.stats.drops.add(DropReason::Malformed, 1);
                return Received::NOTHING;
            }
        };
        lens[0] = packet.len();
        self.stats.segments += 1;
        Received { packets: 1, pending: 0, checksums: Checksums::from(valid) }
    }

    fn split_pending<B: AsMut<[u8]>>(&mut self, queue: &Queue, batch: &mut Batch<'_, B>) -> Result<Received> {
        let Some(p) = self.pending.as_mut() else {
            return Ok(Received::NOTHING);
        };
        let splitter = Splitter::new(&p.hdr, &self.scratch[..p.len], self.framing)
            .map_err(|e| Error::malformed(queue.name(), Malformed::Gso(e)))?
            .leave_checksums_partial(self.partial);
        let room = batch.bufs.len().min(p.total - p.next);
        let progress = splitter
            .split_into(p.next, &mut Batch::new(&mut batch.bufs[..room], batch.lens, batch.offset))
            .map_err(|e| split_error(queue, e))?;
        let progress = SplitProgress { total: p.total, ..progress };
        p.next = progress.next;
        let hdr = p.hdr;
        if p.next >= p.total {
            self.pending = None;
        }
        let left_partial = splitter.checksums_left_partial();
        Ok(self.received(&hdr, left_partial, progress))
    }
}

/// The receive half of the batch API, bound to its queue: one read per call (or the segments left from the last),
/// split into the caller's buffers.
///
/// `Q` is how the half holds its queue: `&Queue`, `Arc<Queue>` or the `Queue` itself. The queue's mode, virtio
/// header size and offloads decide how reads are laid out; offloads changed at run time
/// ([`Queue::set_offloads`]) are followed from the next read on.
///
/// Buffers: a [`Batch`]; packet `i` lands at `bufs[i][offset .. offset + lens[i]]`. Each buffer needs `offset` (at least the
/// queue's virtio header size) plus the largest packet the device hands over whole: its MTU plus the link-layer
/// header (14 bytes on TAP, 18 or 22 with VLAN tags). Super-packets are read into a buffer of the half's own
/// (about 64 KiB, made on the first read that needs it) or scattered over the caller's buffers, never into one of
/// them whole, except with [`Self::keep_udp_super_packets`].
#[derive(Debug)]
pub struct RecvBatch<Q: Borrow<Queue>> {
    queue: Q,
    half: RecvHalf,
}

impl<Q: Borrow<Queue>> RecvBatch<Q> {
    /// A receive half reading from `queue`.
    pub fn new(queue: Q) -> Self {
        let half = RecvHalf::new(queue.borrow());
        RecvBatch { queue, half }
    }

    /// The queue it reads from.
    pub fn queue(&self) -> &Queue {
        self.queue.borrow()
    }

    /// Leaves the L4 checksums of the segments of a split super-packet partial, as the kernel's own
    /// segmentation does, instead of summing every payload byte to complete them (most of a split's cost): each
    /// TCP or UDP segment carries the pseudo-header sum in its checksum field (see `turbotun_wire::partial`),
    /// [`Received::checksums`] says [`Checksums::Partial`], and [`crate::batch::SendBatch::send_many`] given that
    /// writes them with `NEEDS_CSUM` so that the kernel completes them. For a program that forwards segments
    /// without reading or changing their payload (or that completes the checksum of those it does change, with
    /// `turbotun_wire::partial::complete`). Packets read whole keep complete checksums; a batch that would mix
    /// partial checksums with unverified ones has the partial ones completed.
    pub fn partial_checksums(mut self, on: bool) -> Self {
        self.half = self.half.partial_checksums(on);
        self
    }

    /// Hands UDP super-packets (`GSO_UDP_L4`) over whole instead of splitting them, for an application that
    /// answers or forwards a datagram burst as it came (an echo swaps the outer headers and writes it back; the
    /// pseudo-header checksum seed does not depend on the order of the addresses). Such a packet lands in the
    /// first buffer at `offset` (which must then hold `offset + 65535` bytes) and ends the batch.
    ///
    /// With this on, every packet handed over has its virtio header in the `vnet_hdr_len` bytes in front of it
    /// (`offset` must leave room for them): the header as read for a whole super-packet (`gso_type`,
    /// `gso_size`, `NEEDS_CSUM` and the checksum offsets, to be written back with it), a zeroed one for every
    /// other packet (their checksums completed as usual). TCP super-packets are still split. Without a virtio
    /// header this changes nothing.
    pub fn keep_udp_super_packets(mut self, on: bool) -> Self {
        self.half = self.half.keep_udp_super_packets(on);
        self
    }

    /// Waits up to `hold` for more packets when a batch finds the queue dry before it is full, as the kernel's
    /// NAPI does with a device's `gro_flush_timeout`: a sender that writes a burst one packet at a time after
    /// an idle pause (the kernel's GRO selftest does) has it read in one batch and coalesced, instead of its
    /// first packet leaving alone. The hold is counted from the batch's first would-block read and ends at
    /// once when a packet fills the batch, a super-packet ends it, or `stop` fires; so it adds at most `hold` to
    /// a packet's time in the forwarder, and nothing while the reads keep finding full batches. `None` or zero
    /// (the default, like the kernel's) holds nothing.
    pub fn gro_hold(mut self, hold: Option<std::time::Duration>) -> Self {
        self.half = self.half.gro_hold(hold);
        self
    }

    /// A wait for packets in [`Self::recv_many`] (on a non-blocking queue) ends at once when `stop` fires, with
    /// zero packets: a reader stopped without any signal. (A read asleep in the kernel on a blocking queue can be
    /// ended only by a signal; see [`crate::wake`].)
    pub fn stop_on(mut self, stop: StopHandle) -> Self {
        self.half = self.half.stop_on(stop);
        self
    }

    /// What this receive half has read (reads, super-packets, segments, zero-copy splits, drops by reason).
    pub fn stats(&self) -> Counters {
        self.half.stats()
    }

    /// Segments read (part of a super-packet) that the next call hands over without reading.
    pub fn pending(&self) -> usize {
        self.half.pending()
    }

    /// Fills as much of `batch` as the queue has ready: the first read waits (up to `timeout`, forever with
    /// `None`), later ones only take what is there already. A batch ends after a super-packet (its segments, or
    /// those that fit, with the rest pending for next time). Returns zero packets on timeout, or when a signal
    /// interrupted a blocking read (see [`crate::wake`]), so that the caller can look at its flags. A frame that
    /// cannot be used is counted as a drop with its reason and skipped, so that one bad packet never stops a
    /// queue.
    pub fn recv_many<B: AsMut<[u8]>>(
        &mut self,
        batch: &mut Batch<'_, B>,
        timeout: Option<std::time::Duration>,
    ) -> Result<Received> {
        self.half.recv_many(self.queue.borrow(), batch, timeout)
    }

    /// Like [`Self::recv_many`] without waiting: on a non-blocking queue with nothing to read it returns the
    /// would-block error ([`Error::is_would_block`]), which is what an event loop waits on. On a blocking queue
    /// the first read sleeps until a packet comes; the later ones never do (`RWF_NOWAIT`), so a batch holds what
    /// was already queued. A kernel without `RWF_NOWAIT` gets one read per batch on a blocking queue.
    pub fn try_recv_many<B: AsMut<[u8]>>(&mut self, batch: &mut Batch<'_, B>) -> Result<Received> {
        self.half.try_recv_many(self.queue.borrow(), batch)
    }
}

fn split_error(queue: &Queue, e: turbotun_wire::GsoError) -> Error {
    match e {
        turbotun_wire::GsoError::BufferTooSmall { need, have } => Error::BufferTooSmall { have, need },
        other => Error::malformed(queue.name(), Malformed::Gso(other)),
    }
}

#[cfg(test)]
mod tests;
