//! Offload mode through io_uring: super-packets read, split, handed to the application, coalesced, and the
//! gathered writes of a round submitted with the next read. The scattered read it uses by default is in
//! `scatter.rs`; every step it shares with the blocking path (the zero-copy split, a packet handed over whole,
//! write units, a refused coalesced write) is the same code (`turbotun_wire::scatter`, `crate::batch`,
//! `crate::write_policy`).

use std::ops::Range;
use std::os::fd::AsFd;
use std::time::Duration;

use turbotun_wire::gso::Splitter;
use turbotun_wire::scatter::ScatterShape;
use turbotun_wire::virtio_net::VirtioNetHdrRepr;
use turbotun_wire::{Batch, Checksums};

use super::{ring_error, OFFSET};
use crate::dataplane::stats::{Counters, DropReason, WhenFull};
use crate::dataplane::write_policy::{on_write_error, WriteFailure};
use crate::devices::queue::{Queue, MAX_PACKET};
use crate::error::{queue_io_error, Error, Malformed, Result};
use crate::sys::uring::{Completion, ForwardRing, Op};

/// How an offload forwarder reads.
#[derive(Debug)]
pub(super) enum ReadMode {
    /// One multishot read over `depth` provided slots.
    Multishot,
    /// One read in flight, scattered over spare slots by the shape of the last super-packet.
    Scattered(Scatter),
}

/// The state of scattered reads.
#[derive(Debug, Default)]
pub(super) struct Scatter {
    /// Reads and writes through the registered slot arena (`READV_FIXED`/`WRITEV_FIXED`).
    pub(super) registered: bool,
    /// The shape of the last super-packet: the next read is laid out for it.
    pub(super) predicted: Option<ScatterShape>,
    /// The pieces of the read in flight (slot, byte range): with a shape, its segment slots then the overflow
    /// slot; without, one slot for the whole frame.
    pub(super) plan: Vec<(u32, Range<usize>)>,
    /// The shape the read in flight was laid out for.
    pub(super) shape_in_flight: Option<ScatterShape>,
}

/// A super-packet being split into spare slots, whose remaining segments wait for free spares.
#[derive(Debug, Clone, Copy)]
pub(super) struct Splitting {
    slot: u32,
    hdr: VirtioNetHdrRepr,
    len: usize,
    next: usize,
    total: usize,
}

/// One write in flight: its pieces (slot, byte range), the caller's packets it carries, and where its slots
/// sit in the transmit ring.
#[derive(Debug, Clone, Default)]
pub(super) struct Unit {
    pieces: Vec<(u32, Range<usize>)>,
    packets: u64,
    bytes: u64,
    first_pos: u32,
}

/// Offload mode through io_uring, one direction: super-packets with their virtio header read by one multishot
/// read into the slots of a [`SlotRing`](crate::ring::SlotRing) arena, split into MTU-sized packets, handed to
/// the application as a batch, coalesced again (GRO) and written as gathered writes (`IORING_OP_WRITEV`), every
/// write of a round submitted by the same `io_uring_enter` that waits for the next reads.
///
/// The arena has `depth` read slots (each a 64 KiB super-packet plus header, provided to the kernel) and spare
/// slots that hold the segments of split super-packets. A packet that was not a super-packet is never copied:
/// its read slot index moves to the transmit ring and it is written from where it was read. A coalesced
/// packet is written from its pieces (the head segment and each member's payload, each in its own slot), so
/// no payload byte is copied to coalesce; the split copies each segment's payload once into its slot.
///
/// A coalesced write the kernel refuses (`EINVAL`) turns that GRO kind off and is split again and written
/// segment by segment (blocking writes, through the same write policy as the blocking path).
pub struct UringOffload {
    pub(super) ring: ForwardRing,
    /// How frames are read: the multishot read over provided slots, or one read scattered over spares.
    pub(super) read: ReadMode,
    /// The queue written to (a duplicate of the caller's fd; counters shared): the re-split fallback writes to
    /// it directly, and drops are counted on it.
    pub(super) dst: Queue,
    pub(super) rx: crate::dataplane::ring::SlotRing,
    pub(super) tx: crate::dataplane::ring::SlotRing,
    pub(super) spares: Vec<u32>,
    pub(super) splitting: Option<Splitting>,
    /// Segments a scattered read left in place (slot, length), for the next batch.
    pub(super) ready_segments: Vec<(u32, usize)>,
    /// Scratch for the slots one split touches, kept so that a split allocates nothing.
    pub(super) slot_ids: Vec<u32>,
    pub(super) framing: turbotun_wire::Framing,
    pub(super) batch_max: usize,
    pub(super) batch: Vec<u32>,
    pub(super) lens: Vec<usize>,
    /// Whether every packet of the batch being built has a known-good L4 checksum.
    pub(super) all_valid: bool,
    /// Leave split segments' checksums partial (see [`UringOffload::partial_checksums`]).
    pub(super) partial: bool,
    pub(super) gro: Option<turbotun_wire::gro::Gro>,
    pub(super) kinds: crate::dataplane::batch::GroKinds,
    pub(super) to_write: Vec<usize>,
    pub(super) units: Vec<Unit>,
    pub(super) completions: Vec<Completion>,
    pub(super) scratch: Vec<u8>,
    pub(super) src_name: String,
    pub(super) dst_name: String,
    pub(super) stats: Counters,
    pub(super) writer: crate::dataplane::write_policy::Writer,
}

impl std::fmt::Debug for UringOffload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringOffload")
            .field("ring", &self.ring)
            .field("rx", &(self.rx.head(), self.rx.cur(), self.rx.tail()))
            .field("tx", &(self.tx.head(), self.tx.cur(), self.tx.tail()))
            .field("gro", &self.kinds)
            .field("stats", &self.stats)
            .finish()
    }
}

impl UringOffload {
    /// An offload forwarder from `src` to `dst` with `depth` read slots (a power of two) and batches of up to
    /// `batch` packets (twice as many spare slots, so that a batch can be split while the last one is written).
    /// Both queues need the 10-byte virtio header.
    pub fn new(src: &Queue, dst: &Queue, depth: usize, batch: usize) -> Result<Self> {
        Self::build(src, dst, depth, batch, ReadMode::Multishot)
    }

    fn build(src: &Queue, dst: &Queue, depth: usize, batch: usize, read: ReadMode) -> Result<Self> {
        for q in [src, dst] {
            if q.vnet_hdr_len() != OFFSET {
                return Err(Error::VnetHdrMismatch {
                    name: q.name().to_string(),
                    has: q.vnet_hdr_len(),
                    needs: format!("offload through io_uring uses {OFFSET}-byte headers"),
                });
            }
        }
        if batch == 0 || batch > crate::dataplane::batch::BATCH_SIZE {
            return Err(Error::OutOfRange {
                what: "batch",
                value: batch as u64,
                allowed: format!("1 to {}", crate::dataplane::batch::BATCH_SIZE),
            });
        }
        // Scattered reads take a batch of spares and one for the overflow while the last batch is written.
        let (multishot, registered) = match &read {
            ReadMode::Multishot => (true, false),
            ReadMode::Scattered(scatter) => (false, scatter.registered),
        };
        let spare = if multishot { 2 * batch } else { 2 * batch + 2 };
        let stride = OFFSET + MAX_PACKET;
        let ring = ForwardRing::with_spares(src.as_fd(), dst.as_fd(), depth, spare, stride, multishot, registered)
            .map_err(|e| Error::io(format!("setting up io_uring for {} -> {}", src.name(), dst.name()), e))?;
        let slots = depth + spare;
        let framing = dst.mode().framing();
        let vnet = dst.offloads().contains(crate::devices::offloads::Offloads::CSUM);
        let uso = dst
            .offloads()
            .contains(crate::devices::offloads::Offloads::USO4 | crate::devices::offloads::Offloads::USO6);
        let kinds = crate::dataplane::batch::GroKinds::new(framing, OFFSET, vnet, vnet && uso);
        let spares = if multishot {
            (depth as u32..slots as u32).rev().collect()
        } else {
            // Every slot is a spare: nothing is provided to the kernel.
            (0..slots as u32).rev().collect()
        };
        Ok(UringOffload {
            ring,
            read,
            dst: dst.try_clone()?,
            rx: crate::dataplane::ring::SlotRing::new(depth)?,
            tx: crate::dataplane::ring::SlotRing::new(slots.next_power_of_two())?,
            spares,
            splitting: None,
            ready_segments: Vec::with_capacity(batch),
            slot_ids: Vec::with_capacity(2 * batch + 3),
            framing,
            batch_max: batch,
            batch: Vec::with_capacity(batch),
            lens: Vec::with_capacity(batch),
            all_valid: true,
            partial: false,
            gro: kinds.coalescer(),
            kinds,
            to_write: Vec::with_capacity(batch),
            units: vec![Unit::default(); slots],
            completions: Vec::with_capacity(slots),
            scratch: Vec::new(),
            src_name: src.name().to_string(),
            dst_name: dst.name().to_string(),
            stats: Counters::default(),
            writer: crate::dataplane::write_policy::Writer { vnet_hdr_len: OFFSET, ..Default::default() },
        })
    }

    /// Like [`Self::new`], but reading with one scattered read in flight (`IORING_OP_READV`) instead of the
    /// multishot read: once a super-packet was seen, the next read puts each segment's payload into its own
    /// slot behind room for its header (the layout of the blocking path's zero-copy split), so that splitting
    /// writes only headers and no payload byte is copied in user space. A frame of another shape is joined
    /// and split by copying.
    pub fn scattered(src: &Queue, dst: &Queue, batch: usize) -> Result<Self> {
        Self::scattered_with(src, dst, batch, false)
    }

    /// [`Self::scattered`]; with `registered`, the slot arena is registered with the ring and the reads and
    /// writes go through `READV_FIXED` and `WRITEV_FIXED` (Linux 6.15; see [`super::registered_vectors_supported`]):
    /// the kernel skips mapping and checking user memory per operation, but the whole arena (about 8.5 MiB per
    /// direction at the default batch) is pinned and so resident.
    pub fn scattered_with(src: &Queue, dst: &Queue, batch: usize, registered: bool) -> Result<Self> {
        Self::build(src, dst, 1, batch, ReadMode::Scattered(Scatter { registered, ..Scatter::default() }))
    }

    /// What to do when the destination is full (default: write the packet again until it is taken).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.writer.when_full = when_full;
        self
    }

    /// Leaves the L4 checksums of split segments partial and has the kernel complete what is written
    /// (`NEEDS_CSUM`), as [`crate::batch::RecvBatch::partial_checksums`] does on the blocking path: no payload
    /// byte is read in user space. The per-packet hook then sees TCP and UDP packets whose checksum may be
    /// partial. A batch that also holds packets with unverified checksums has every checksum completed first.
    pub fn partial_checksums(mut self, on: bool) -> Self {
        self.partial = on;
        self
    }

    /// A write re-split after a refusal and waiting for room gives up once `stop` fires.
    pub fn stop_on(mut self, stop: crate::stop::StopHandle) -> Self {
        self.writer.stop = Some(stop);
        self
    }

    /// What this forwarder moved (reads, super-packets, segments, packets and bytes written, writes, coalesced,
    /// GRO fallbacks, drops by reason).
    pub fn stats(&self) -> Counters {
        self.stats
    }

    /// Which GRO kinds are on (TCP, UDP): a kind the kernel refused at run time is turned off.
    pub fn gro_kinds(&self) -> (bool, bool) {
        (self.kinds.tcp, self.kinds.udp)
    }

    /// Segments split or packets read that are neither written nor dropped yet.
    pub fn held(&self) -> usize {
        self.tx.len()
    }

    /// One round, every packet sent on: see [`Self::poll_with`].
    pub fn poll(&mut self, timeout: Duration) -> Result<bool> {
        self.poll_with(timeout, |_| {})
    }

    /// One round: one `io_uring_enter` submits the writes queued by the last round and waits up to `timeout`
    /// for completions; reads that completed are split into batches, each packet is handed to `per_packet`
    /// (IP or Ethernet header first, checksums complete; it may rewrite the bytes in place, keeping the length
    /// and leaving the checksums correct),
    /// and the batch is coalesced and queued for writing. Returns false if nothing completed. A deleted device
    /// is [`Error::DeviceGone`].
    pub fn poll_with(&mut self, timeout: Duration, mut per_packet: impl FnMut(&mut [u8])) -> Result<bool> {
        self.plan_read()?;
        let ready = self.ring.submit_and_wait(timeout).map_err(|e| self.ring_error(e))?;
        self.completions.clear();
        self.ring.reap(&mut self.completions);
        // Every completion is handled even after an error, so that no slot is stranded.
        let mut first_error = None;
        let completions = std::mem::take(&mut self.completions);
        for c in &completions {
            if let Err(e) = self.handle(c) {
                first_error.get_or_insert(e);
            }
        }
        let busy = ready && !completions.is_empty();
        self.completions = completions;
        if let Some(e) = first_error {
            return Err(e);
        }
        while self.next_batch()? {
            self.run_batch(&mut per_packet)?;
        }
        self.plan_read()?;
        Ok(busy)
    }

    /// Waits up to `timeout` for the writes in flight (reads that complete meanwhile are forwarded too);
    /// returns how many of the packets read are neither written nor dropped, for the caller to count as
    /// stopped.
    pub fn drain(&mut self, timeout: Duration) -> Result<usize> {
        super::until_written(timeout, |s: &mut Self| s.ring.writes_in_flight(), |s, left| s.poll(left), self)?;
        Ok(self.units_in_flight())
    }

    /// After a failure that ends the forwarder: every packet read and neither written nor dropped yet (in writes
    /// in flight, split and waiting, still to be split, or read and not taken) is counted as dropped for `reason`;
    /// those not yet counted as segments are counted as one each.
    pub fn abandon(&mut self, reason: DropReason) {
        let held = self.units_in_flight() + self.ready_segments.len();
        let unsplit = self.splitting.take().map_or(0, |s| s.total - s.next) + self.rx.len();
        self.ready_segments.clear();
        self.stats.segments += unsplit as u64;
        self.stats.drops.add(reason, (held + unsplit) as u64);
    }

    fn units_in_flight(&self) -> usize {
        // Slots in the transmit ring belong to writes in flight; their packets are what is not written yet.
        let mut packets = 0u64;
        let mut pos = self.tx.head();
        while pos != self.tx.tail() {
            if let Some(slot) = self.tx.get(pos) {
                let unit = &self.units[slot.index as usize];
                if unit.first_pos == pos && !unit.pieces.is_empty() {
                    packets += unit.packets;
                }
            }
            pos = pos.wrapping_add(1);
        }
        packets as usize
    }

    fn handle(&mut self, c: &Completion) -> Result<()> {
        match (c.op, c.slot, c.result) {
            (Op::Read, None, Err(errno)) if !matches!(errno, libc::EAGAIN | libc::EINTR) => {
                Err(queue_io_error(&self.src_name, "read", std::io::Error::from_raw_os_error(errno)))
            }
            (Op::Read, None, _) => Ok(()),
            (Op::Read, Some(_), Ok(n)) if self.reads_scattered() => {
                self.stats.reads += 1;
                self.scattered_read(n)
            }
            (Op::Read, Some(_), Err(errno)) if self.reads_scattered() => {
                let plan = match &mut self.read {
                    ReadMode::Scattered(sc) => std::mem::take(&mut sc.plan),
                    ReadMode::Multishot => Vec::new(),
                };
                for (slot, _) in plan {
                    self.spares.push(slot);
                }
                if matches!(errno, libc::EAGAIN | libc::EINTR | libc::ECANCELED) {
                    return Ok(());
                }
                Err(queue_io_error(&self.src_name, "read", std::io::Error::from_raw_os_error(errno)))
            }
            (Op::Read, Some(slot), Ok(n)) => {
                self.stats.reads += 1;
                if n == 0 {
                    return self.ring.recycle(slot).map_err(|e| self.ring_error(e));
                }
                if let Err(reason) = crate::dataplane::batch::frame_len(n, OFFSET, self.ring.stride()) {
                    self.stats.drops.add(reason, 1);
                    return self.ring.recycle(slot).map_err(|e| self.ring_error(e));
                }
                let entry = crate::dataplane::ring::Slot { index: slot as u32, len: n as u32 };
                if let Err(entry) = self.rx.push(entry) {
                    // Cannot happen (the receive ring has a place for every read slot); dropped, never lost.
                    self.stats.drops.add(DropReason::Malformed, 1);
                    return self.ring.recycle(entry.index as usize).map_err(|e| self.ring_error(e));
                }
                Ok(())
            }
            (Op::Read, Some(slot), Err(errno)) => {
                self.ring.recycle(slot).map_err(|e| self.ring_error(e))?;
                if matches!(errno, libc::EAGAIN | libc::EINTR) {
                    return Ok(());
                }
                Err(queue_io_error(&self.src_name, "read", std::io::Error::from_raw_os_error(errno)))
            }
            (Op::Write, Some(head), result) => self.write_done(head, result),
            (Op::Write, None, _) => Ok(()),
        }
    }

    /// A write completed: count it, or decide under the write policy what its failure becomes.
    fn write_done(&mut self, head: usize, result: std::result::Result<usize, i32>) -> Result<()> {
        let unit = std::mem::take(&mut self.units[head]);
        let errno = match result {
            Ok(_) => {
                self.stats.writes += 1;
                self.stats.packets += unit.packets;
                self.stats.bytes += unit.bytes;
                return self.finish(head, unit);
            }
            Err(errno) => errno,
        };
        let coalesced = unit.packets > 1;
        match on_write_error(Some(errno), coalesced, self.writer.when_full) {
            WriteFailure::WaitWritable | WriteFailure::Retry => {
                // Backpressure, not a drop: the same pieces are written again.
                let queued = self.ring.writev_from(&unit.pieces).map_err(|e| self.ring_error(e));
                self.units[head] = unit;
                queued
            }
            WriteFailure::Drop(reason) => {
                self.stats.drops.add(reason, unit.packets);
                self.dst.count_tx_drop(unit.packets);
                self.finish(head, unit)
            }
            WriteFailure::Resplit => {
                let result = self.resplit(&unit);
                self.finish(head, unit)?;
                result
            }
            WriteFailure::Fatal => {
                let err = queue_io_error(&self.dst_name, "write", std::io::Error::from_raw_os_error(errno));
                self.stats.drops.add(crate::dataplane::write_policy::lost_with(&err), unit.packets);
                self.finish(head, unit)?;
                Err(err)
            }
        }
    }

    /// The slots of a finished write leave the transmit ring (in ring order, once every earlier write has
    /// finished too): read slots go back to the kernel, spares to the spare list. The unit goes back to its
    /// place emptied, so that the next write from that slot reuses its vector.
    fn finish(&mut self, head: usize, mut unit: Unit) -> Result<()> {
        for k in 0..unit.pieces.len() {
            self.tx.complete(unit.first_pos.wrapping_add(k as u32));
        }
        unit.pieces.clear();
        self.units[head] = unit;
        while let Some(slot) = self.tx.release_completed() {
            self.give_back(slot.index)?;
        }
        Ok(())
    }

    /// Whether reads are scattered over spares (not the multishot read).
    fn reads_scattered(&self) -> bool {
        matches!(self.read, ReadMode::Scattered(_))
    }

    fn give_back(&mut self, slot: u32) -> Result<()> {
        if !self.reads_scattered() && (slot as usize) < self.ring.depth() {
            self.ring.recycle(slot as usize).map_err(|e| self.ring_error(e))
        } else {
            self.spares.push(slot);
            Ok(())
        }
    }

    /// The kernel refused a coalesced packet: that GRO kind goes off and the packet is split again and written
    /// segment by segment with blocking writes, under the same rules as the blocking path
    /// ([`crate::batch::GroKinds::refuse`], [`crate::write_policy::write_split`]).
    fn resplit(&mut self, unit: &Unit) -> Result<()> {
        self.stats.gro_fallbacks += 1;
        let mut joined = std::mem::take(&mut self.scratch);
        joined.clear();
        for (slot, range) in &unit.pieces {
            if let Some(bytes) = self.ring.slot(*slot as usize) {
                joined.extend_from_slice(&bytes[range.clone()]);
            }
        }
        let hdr = VirtioNetHdrRepr::parse(&joined[..OFFSET.min(joined.len())]).unwrap_or_default();
        self.kinds.refuse(&hdr, &self.dst_name);
        self.gro = self.kinds.coalescer();
        let packet = &joined[OFFSET.min(joined.len())..];
        let (writer, dst) = (&self.writer, &self.dst);
        let result = crate::dataplane::write_policy::write_split(
            writer,
            dst,
            self.framing,
            &hdr,
            packet,
            unit.packets,
            &mut self.stats,
        );
        self.scratch = joined;
        result
    }

    /// Fills `batch` from the receive ring: packets that were not super-packets by moving their slot index,
    /// super-packets split into spare slots. Returns whether the batch holds anything.
    fn next_batch(&mut self) -> Result<bool> {
        self.batch.clear();
        self.lens.clear();
        if !self.ready_segments.is_empty() {
            // A scattered read's segments, in place (at most a batch: the read had a slot per segment).
            if self.tx.space() < self.ready_segments.len() {
                return Ok(false);
            }
            for (slot, len) in self.ready_segments.drain(..) {
                self.batch.push(slot);
                self.lens.push(len);
            }
        }
        while self.batch.len() < self.batch_max {
            if self.splitting.is_some() {
                if !self.split_more()? {
                    break;
                }
                continue;
            }
            // Room in the transmit ring for everything the batch may hold.
            if self.tx.space() < self.batch.len() + 1 {
                break;
            }
            let Some((_, entry)) = self.rx.take() else { break };
            self.take_frame(entry)?;
        }
        Ok(!self.batch.is_empty())
    }

    /// One frame from the receive ring: into the batch as it is, or set up for splitting.
    fn take_frame(&mut self, entry: crate::dataplane::ring::Slot) -> Result<()> {
        let (slot, n) = (entry.index, entry.len as usize);
        let parsed = self.ring.slot_mut(slot as usize).map(|bytes| {
            let hdr = VirtioNetHdrRepr::parse(&bytes[..OFFSET]);
            (hdr, bytes)
        });
        let Some((hdr, bytes)) = parsed else {
            return Err(self.ring_error(std::io::Error::other(format!("slot {slot} is not ours"))));
        };
        let hdr = match hdr {
            Ok(hdr) => hdr,
            Err(e) => {
                tracing::debug!("{}: dropping a frame: {}", self.src_name, Malformed::VirtioHeader(e));
                return self.drop_frame(DropReason::Malformed);
            }
        };
        if !hdr.is_gso() {
            // Moved, not copied: the read slot itself goes into the batch.
            match hdr.finish_whole(&mut bytes[OFFSET..n]) {
                Ok(valid) => self.all_valid &= valid,
                Err(e) => {
                    tracing::debug!("{}: dropping a frame: {}", self.src_name, Malformed::PartialChecksum(e));
                    return self.drop_frame(DropReason::Malformed);
                }
            }
            self.rx.release();
            self.stats.segments += 1;
            self.batch.push(slot);
            self.lens.push(n - OFFSET);
            return Ok(());
        }
        self.stats.super_packets += 1;
        let total = match Splitter::new(&hdr, &bytes[OFFSET..n], self.framing) {
            Ok(s) => {
                if let ReadMode::Scattered(sc) = &mut self.read {
                    sc.predicted = ScatterShape::of(&s, 2);
                }
                s.segment_count()
            }
            Err(e) => {
                tracing::debug!("{}: dropping a frame: {}", self.src_name, Malformed::Gso(e));
                return self.drop_frame(DropReason::Malformed);
            }
        };
        if total > crate::dataplane::batch::MAX_SEGMENTS {
            self.stats.drops.add(DropReason::TooManySegments, (total - crate::dataplane::batch::MAX_SEGMENTS) as u64);
        }
        let total = total.min(crate::dataplane::batch::MAX_SEGMENTS);
        self.splitting = Some(Splitting { slot, hdr, len: n - OFFSET, next: 0, total });
        Ok(())
    }

    /// A frame taken from the receive ring that cannot be used: counted, its slot back to the kernel.
    fn drop_frame(&mut self, reason: DropReason) -> Result<()> {
        self.stats.drops.add(reason, 1);
        match self.rx.release() {
            Some(slot) => self.give_back(slot.index),
            None => Ok(()),
        }
    }

    /// Splits the next segments of the super-packet being split into free spares; returns false if none could
    /// be (no spare free, or the batch is full).
    fn split_more(&mut self) -> Result<bool> {
        let Some(s) = self.splitting else { return Ok(false) };
        let room = (self.batch_max - self.batch.len()).min(self.spares.len()).min(s.total - s.next);
        if room == 0 || self.tx.space() < self.batch.len() + room {
            return Ok(false);
        }
        let first = self.batch.len();
        let ids = &mut self.slot_ids;
        ids.clear();
        ids.push(s.slot);
        for _ in 0..room {
            if let Some(spare) = self.spares.pop() {
                ids.push(spare);
            }
        }
        self.lens.resize(first + room, 0);
        let (src_name, dst_name) = (&self.src_name, &self.dst_name);
        let mut bufs = self.ring.slots_mut(&self.slot_ids).map_err(|e| ring_error(src_name, dst_name, e))?;
        let (src, outs) = bufs.split_at_mut(1);
        let partial = self.partial;
        let split = Splitter::new(&s.hdr, &src[0][OFFSET..OFFSET + s.len], self.framing).and_then(|splitter| {
            splitter
                .leave_checksums_partial(partial)
                .split_into(s.next, &mut Batch::new(outs, &mut self.lens[first..], OFFSET))
        });
        drop(bufs);
        let progress = match split {
            Ok(progress) => progress,
            Err(e) => {
                // Validated when it was taken; a failure here drops what is left of it.
                tracing::debug!("{}: dropping a super-packet: {}", self.src_name, Malformed::Gso(e));
                self.spares.extend_from_slice(&self.slot_ids[1..]);
                self.lens.truncate(first);
                self.splitting = None;
                return self.drop_frame(DropReason::Malformed).map(|()| true);
            }
        };
        // Spares the split did not use go back.
        self.spares.extend_from_slice(&self.slot_ids[1 + progress.produced..]);
        self.batch.extend_from_slice(&self.slot_ids[1..1 + progress.produced]);
        self.lens.truncate(first + progress.produced);
        self.stats.segments += progress.produced as u64;
        let next = s.next + progress.produced;
        if next >= s.total || progress.produced == 0 {
            self.splitting = None;
            if let Some(slot) = self.rx.release() {
                self.give_back(slot.index)?;
            }
        } else {
            self.splitting = Some(Splitting { next, ..s });
        }
        Ok(true)
    }

    /// Hands the batch to the application, coalesces it and queues one write per coalesced packet.
    fn run_batch(&mut self, per_packet: &mut impl FnMut(&mut [u8])) -> Result<()> {
        let valid = std::mem::replace(&mut self.all_valid, true);
        // With partial checksums on, any packet of the batch may be partial (segments wait in `ready_segments`
        // across batches), so the batch is marked partial as a whole, which is right for complete ones too;
        // beside unverified packets every checksum is completed, since the coalescer must verify those.
        let checksums = match (self.partial, valid) {
            (false, valid) => Checksums::from(valid),
            (true, true) => Checksums::Partial,
            (true, false) => Checksums::Unverified,
        };
        let (src_name, dst_name) = (&self.src_name, &self.dst_name);
        let mut bufs = self.ring.slots_mut(&self.batch).map_err(|e| ring_error(src_name, dst_name, e))?;
        for (buf, &len) in bufs.iter_mut().zip(&self.lens) {
            if self.partial && !valid {
                turbotun_wire::partial::complete(&mut buf[OFFSET..OFFSET + len], self.framing);
            }
            per_packet(&mut buf[OFFSET..OFFSET + len]);
        }
        let coalesced = crate::dataplane::batch::prepare_units(
            self.gro.as_mut(),
            &mut Batch::new(&mut bufs, &mut self.lens, OFFSET),
            OFFSET,
            self.framing,
            checksums,
            &mut self.to_write,
        );
        self.stats.coalesced += coalesced as u64;
        drop(bufs);
        for k in 0..self.to_write.len() {
            let head = self.to_write[k];
            let head_slot = self.batch[head] as usize;
            let mut unit = std::mem::take(&mut self.units[head_slot]);
            unit.pieces.clear();
            unit.packets = 0;
            unit.bytes = 0;
            match self.gro.as_ref() {
                Some(gro) => {
                    for (b, range) in gro.pieces(head, &self.lens, OFFSET) {
                        unit.pieces.push((self.batch[b], range));
                        unit.packets += 1;
                        unit.bytes += self.lens[b] as u64;
                    }
                }
                None => {
                    unit.pieces.push((self.batch[head], 0..OFFSET + self.lens[head]));
                    unit.packets = 1;
                    unit.bytes = self.lens[head] as u64;
                }
            }
            unit.first_pos = self.tx.tail();
            for (slot, range) in &unit.pieces {
                let entry = crate::dataplane::ring::Slot { index: *slot, len: range.len() as u32 };
                let moved = self.tx.push(entry).is_ok() && self.tx.take().is_some();
                debug_assert!(moved, "next_batch keeps room in the transmit ring for the whole batch");
            }
            let queued = self.ring.writev_from(&unit.pieces);
            self.units[head_slot] = unit;
            queued.map_err(|e| self.ring_error(e))?;
        }
        Ok(())
    }

    pub(super) fn ring_error(&self, e: std::io::Error) -> Error {
        ring_error(&self.src_name, &self.dst_name, e)
    }

    /// Sets the shape the next read is laid out for (tests).
    #[cfg(test)]
    pub(super) fn predict(&mut self, shape: Option<turbotun_wire::scatter::ScatterShape>) {
        if let ReadMode::Scattered(sc) = &mut self.read {
            sc.predicted = shape;
        }
    }

    /// Slots in the read in flight (tests).
    #[cfg(test)]
    pub(super) fn planned(&self) -> usize {
        match &self.read {
            ReadMode::Scattered(sc) => sc.plan.len(),
            ReadMode::Multishot => 0,
        }
    }
}
