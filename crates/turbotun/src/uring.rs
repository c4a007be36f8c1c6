//! Forwarding frames between two queues through io_uring: many reads in flight, and one system call both
//! submits the writes of what arrived and waits for the next frames.
//!
//! A synchronous forwarder makes at least two system calls per frame (a read and a write); here one multishot
//! read waits in the kernel (armed on the tun fd's wait queue, no helper threads: the tun driver honours
//! `IOCB_NOWAIT`) and reads frame after frame into a ring of `depth` provided buffers, and each
//! `io_uring_enter` hands over every write that is ready while it collects the next completions. Frames move as they are (the virtio header too, if the queues have one): this is the
//! plain and passthrough forwarding path ([`UringForwarder`]), and a slot is never copied: the buffer a frame
//! was read into is the one it is written from; its index moves from a receive to a transmit
//! [`SlotRing`](crate::ring::SlotRing) (netmap-style forwarding by index, no allocation per frame).
//!
//! [`UringOffload`] is offload mode on the same arena: super-packets read with their virtio header, split,
//! handed to the application, coalesced, and the gathered writes of a round submitted together with the next
//! read.
//!
//! Order: frames leave in the order they were read (one read request posts its completions in order, writes
//! are submitted in completion order, and a tun write does not wait); a write the kernel refuses for want of socket buffer (`EAGAIN`, only with a limited
//! `TUNSETSNDBUF`) is retried and may then be overtaken by later frames.

use std::os::fd::AsFd;
use std::time::Duration;

use turbotun_wire::virtio_net::VirtioNetHdr;

use turbotun_wire::gso::Splitter;
use turbotun_wire::virtio_net::{flags, VirtioNetHdrRepr};
use turbotun_wire::Checksums;

use crate::error::{queue_io_error, Error, Malformed, Result};
use crate::queue::{Queue, MAX_PACKET};
use crate::stats::{Counters, DropReason, WhenFull};
use crate::sys::uring::{Completion, ForwardRing, Op};
use crate::write_policy::{on_write_error, WriteFailure};

/// Environment variable that turns io_uring off for the process (any value but empty or `0`): every path
/// that would use it falls back to blocking I/O and says so, as on a kernel or container without io_uring.
pub const DISABLE_ENV: &str = "TURBOTUN_NO_URING";

/// Whether this kernel has what [`UringOffload::scattered_with`] needs to register its slots (`READV_FIXED`,
/// `WRITEV_FIXED`, Linux 6.15) besides what [`supported`] checks; probed once.
pub fn registered_vectors_supported() -> Result<()> {
    static PROBED: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    supported()?;
    PROBED.get_or_init(|| crate::sys::uring::probe_registered_vectors().map_err(|e| e.to_string())).clone().map_err(
        |why| Error::io("io_uring registered buffers", std::io::Error::new(std::io::ErrorKind::Unsupported, why)),
    )
}

/// Whether this kernel can run a [`UringForwarder`] and a [`UringOffload`] (io_uring with multishot reads,
/// `IORING_OP_READV`, `IORING_OP_WRITEV`, Linux 6.7); probed once. The error says what is missing, or that
/// [`DISABLE_ENV`] turned io_uring off, so that a caller can fall back to blocking reads and say why.
pub fn supported() -> Result<()> {
    static PROBED: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    PROBED
        .get_or_init(|| {
            if std::env::var_os(DISABLE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
                return Err(format!("io_uring turned off by {DISABLE_ENV}"));
            }
            crate::sys::uring::probe_forward_ring().map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|why| Error::io("io_uring forwarding", std::io::Error::new(std::io::ErrorKind::Unsupported, why)))
}

/// One direction, `src` to `dst`, over a ring of its own.
#[derive(Debug)]
pub struct UringForwarder {
    ring: ForwardRing,
    /// Frames read, in read order (the kernel's side of the slot ring).
    rx: crate::ring::SlotRing,
    /// Frames handed back for writing: their writes are in flight until completed and released in order.
    tx: crate::ring::SlotRing,
    /// Per slot: its position in the transmit ring while it is being written.
    tx_pos: Vec<u32>,
    src_name: String,
    dst_name: String,
    vnet_hdr_len: usize,
    lens: Vec<usize>,
    completions: Vec<Completion>,
    stats: Counters,
    when_full: WhenFull,
}

impl UringForwarder {
    /// Default number of frames in flight per direction: in `turbotun bench` (plain, TCP) 64 used the least
    /// forwarder CPU per Gbps; 1 and 4 were slower than blocking reads, 256 lost to retransmits.
    pub const DEFAULT_DEPTH: usize = 64;

    /// A forwarder with `depth` slots (a power of two), each large enough for a super-packet and its virtio header (only the
    /// pages a frame touches become resident). Both queues must use the same virtio header size.
    pub fn new(src: &Queue, dst: &Queue, depth: usize) -> Result<Self> {
        if src.vnet_hdr_len() != dst.vnet_hdr_len() {
            return Err(Error::InvalidConfig(format!(
                "{} has a {}-byte virtio header and {} a {}-byte one: frames cannot be forwarded as they are",
                src.name(),
                src.vnet_hdr_len(),
                dst.name(),
                dst.vnet_hdr_len()
            )));
        }
        let stride = src.vnet_hdr_len() + MAX_PACKET;
        let ring = ForwardRing::new(src.as_fd(), dst.as_fd(), depth, stride)
            .map_err(|e| Error::io(format!("setting up io_uring for {} -> {}", src.name(), dst.name()), e))?;
        Ok(UringForwarder {
            ring,
            rx: crate::ring::SlotRing::new(depth)?,
            tx: crate::ring::SlotRing::new(depth)?,
            tx_pos: vec![0; depth],
            src_name: src.name().to_string(),
            dst_name: dst.name().to_string(),
            vnet_hdr_len: src.vnet_hdr_len(),
            lens: vec![0; depth],
            completions: Vec::with_capacity(depth),
            stats: Counters::default(),
            when_full: WhenFull::default(),
        })
    }

    /// What to do when the destination is full (default: write the frame again until it is taken).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// What this forwarder moved (reads, packets = frames written, bytes, super-packets, drops by reason).
    pub fn stats(&self) -> Counters {
        self.stats
    }

    /// One round: submits what is queued, waits up to `timeout` for completions and handles them (a frame
    /// read is queued for writing, a slot written goes back to the kernel for reading). Returns false if nothing
    /// completed (timeout, or a signal interrupted the wait). A deleted device is [`Error::DeviceGone`].
    pub fn poll(&mut self, timeout: Duration) -> Result<bool> {
        self.poll_with(timeout, |_| {})
    }

    /// [`Self::poll`], handing every frame read to `per_frame` before it is written (the packet after its virtio
    /// header, if any; it may be rewritten in place, keeping its length and leaving its checksums right).
    pub fn poll_with(&mut self, timeout: Duration, mut per_frame: impl FnMut(&mut [u8])) -> Result<bool> {
        let ready = self.ring.submit_and_wait(timeout).map_err(|e| self.ring_error(e))?;
        self.completions.clear();
        self.ring.reap(&mut self.completions);
        // Every completion is handled (its slot written or recycled) even after an error, so that no slot is
        // stranded; the first error is returned at the end.
        let mut first_error = None;
        for i in 0..self.completions.len() {
            let Completion { slot, op, result } = self.completions[i];
            if let Err(e) = self.handle(op, slot, result) {
                first_error.get_or_insert(e);
            }
        }
        // Forwarding moves indices: every frame read goes from the receive ring to the transmit ring and is
        // written from the slot it was read into.
        while let Some((_, frame)) = self.rx.take() {
            self.rx.release();
            let slot = frame.index as usize;
            if let Some(bytes) = self.ring.slot_mut(slot) {
                per_frame(&mut bytes[self.vnet_hdr_len..frame.len as usize]);
            }
            let queued = match self.tx.push(frame) {
                Ok(()) => {
                    let (pos, _) = self.tx.take().unwrap_or_default();
                    self.tx_pos[slot] = pos;
                    self.ring.write_from(slot, frame.len as usize).map_err(|e| self.ring_error(e))
                }
                // Cannot happen (the transmit ring has a place for every slot); dropped, never lost.
                Err(_) => {
                    self.stats.drops.add(DropReason::Malformed, 1);
                    self.ring.recycle(slot).map_err(|e| self.ring_error(e))
                }
            };
            if let Err(e) = queued {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(ready && !self.completions.is_empty()),
        }
    }

    /// Waits up to `timeout` for the writes already submitted to complete (reads that complete meanwhile are
    /// written too), so that a forwarder that stops counts what it read as written or dropped. Returns how many
    /// writes are still in flight.
    pub fn drain(&mut self, timeout: Duration) -> Result<usize> {
        let deadline = std::time::Instant::now() + timeout;
        while self.ring.writes_in_flight() > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            self.poll(left)?;
        }
        Ok(self.ring.writes_in_flight())
    }

    /// After a failure that ends the forwarder: the frames read whose writes are still in flight will never be
    /// seen through, and are counted as dropped for `reason`.
    pub fn abandon(&mut self, reason: DropReason) {
        let held = self.ring.writes_in_flight() + self.rx.len();
        self.stats.drops.add(reason, held as u64);
    }

    fn handle(&mut self, op: Op, slot: Option<usize>, result: std::result::Result<usize, i32>) -> Result<()> {
        let Some(slot) = slot else {
            // A read that ended without a buffer: EAGAIN/EINTR end the multishot read, which the next round arms
            // again; anything else is the device's error.
            return match result {
                Err(errno) if !matches!(errno, libc::EAGAIN | libc::EINTR) => {
                    Err(queue_io_error(&self.src_name, "read", std::io::Error::from_raw_os_error(errno)))
                }
                _ => Ok(()),
            };
        };
        match (op, result) {
            (Op::Read, Ok(n)) => {
                self.stats.reads += 1;
                if n == 0 {
                    return self.ring.recycle(slot).map_err(|e| self.ring_error(e));
                }
                if let Err(reason) = crate::queue::frame_len(n, self.vnet_hdr_len, self.ring.stride()) {
                    self.stats.drops.add(reason, 1);
                    return self.ring.recycle(slot).map_err(|e| self.ring_error(e));
                }
                if self.vnet_hdr_len > 0
                    && n > self.vnet_hdr_len
                    && self.ring.slot(slot).is_some_and(|b| VirtioNetHdr::new_unchecked(b).is_gso())
                {
                    self.stats.super_packets += 1;
                }
                self.stats.segments += 1;
                self.lens[slot] = n;
                if let Err(frame) = self.rx.push(crate::ring::Slot { index: slot as u32, len: n as u32 }) {
                    // Cannot happen (the receive ring has a place for every slot); dropped, never lost.
                    self.stats.drops.add(DropReason::Malformed, 1);
                    return self.ring.recycle(frame.index as usize).map_err(|e| self.ring_error(e));
                }
                Ok(())
            }
            (Op::Read, Err(errno)) => {
                self.ring.recycle(slot).map_err(|e| self.ring_error(e))?;
                if matches!(errno, libc::EAGAIN | libc::EINTR) {
                    return Ok(());
                }
                Err(queue_io_error(&self.src_name, "read", std::io::Error::from_raw_os_error(errno)))
            }
            (Op::Write, Ok(_)) => {
                self.stats.writes += 1;
                self.stats.packets += 1;
                self.stats.bytes += self.lens[slot].saturating_sub(self.vnet_hdr_len) as u64;
                self.written(slot)
            }
            // Frames move as they came: a refusal of a super-packet is not one we built, so never re-split.
            (Op::Write, Err(errno)) => match on_write_error(Some(errno), false, self.when_full) {
                // Backpressure, not a drop: the same frame is written again.
                WriteFailure::WaitWritable | WriteFailure::Retry => {
                    self.ring.write_from(slot, self.lens[slot]).map_err(|e| self.ring_error(e))
                }
                WriteFailure::Drop(reason) => {
                    self.stats.drops.add(reason, 1);
                    self.written(slot)
                }
                WriteFailure::Resplit | WriteFailure::Fatal => {
                    let err = queue_io_error(&self.dst_name, "write", std::io::Error::from_raw_os_error(errno));
                    self.stats.drops.add(crate::write_policy::lost_with(&err), 1);
                    self.written(slot)?;
                    Err(err)
                }
            },
        }
    }

    /// A write finished (or its frame was dropped): the slot leaves the transmit ring, in ring order once every
    /// earlier write has finished too, and goes back to the kernel for reading.
    fn written(&mut self, slot: usize) -> Result<()> {
        self.tx.complete(self.tx_pos[slot]);
        while let Some(done) = self.tx.release_completed() {
            self.ring.recycle(done.index as usize).map_err(|e| self.ring_error(e))?;
        }
        Ok(())
    }

    fn ring_error(&self, e: std::io::Error) -> Error {
        Error::io(format!("io_uring {} -> {}", self.src_name, self.dst_name), e)
    }
}

/// A super-packet being split into spare slots, whose remaining segments wait for free spares.
#[derive(Debug, Clone, Copy)]
struct Splitting {
    slot: u32,
    hdr: VirtioNetHdrRepr,
    len: usize,
    next: usize,
    total: usize,
}

/// One write in flight: its pieces (slot, byte range), the caller's packets it carries, and where its slots
/// sit in the transmit ring.
#[derive(Debug, Clone, Default)]
struct Unit {
    pieces: Vec<(u32, std::ops::Range<usize>)>,
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
    ring: ForwardRing,
    /// Reads scattered into spare slots (one in flight) instead of the multishot read.
    scatter: Option<Scatter>,
    rx: crate::ring::SlotRing,
    tx: crate::ring::SlotRing,
    spares: Vec<u32>,
    splitting: Option<Splitting>,
    /// Segments a scattered read left in place (slot, length), for the next batch.
    ready_segments: Vec<(u32, usize)>,
    /// Scratch for the slots one split touches, kept so that a split allocates nothing.
    slot_ids: Vec<u32>,
    framing: turbotun_wire::Framing,
    batch_max: usize,
    batch: Vec<u32>,
    lens: Vec<usize>,
    /// Whether every packet of the batch being built has a known-good L4 checksum.
    all_valid: bool,
    /// Leave split segments' checksums partial (see [`UringOffload::partial_checksums`]).
    partial: bool,
    gro: Option<turbotun_wire::gro::Gro>,
    gro_tcp: bool,
    gro_udp: bool,
    to_write: Vec<usize>,
    units: Vec<Unit>,
    completions: Vec<Completion>,
    scratch: Vec<u8>,
    src_name: String,
    dst_name: String,
    stats: Counters,
    writer: crate::write_policy::Writer,
}

impl std::fmt::Debug for UringOffload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringOffload")
            .field("ring", &self.ring)
            .field("rx", &(self.rx.head(), self.rx.cur(), self.rx.tail()))
            .field("tx", &(self.tx.head(), self.tx.cur(), self.tx.tail()))
            .field("gro", &(self.gro_tcp, self.gro_udp))
            .field("stats", &self.stats)
            .finish()
    }
}

/// The scattered read: where the read in flight puts the frame.
#[derive(Debug, Default)]
struct Scatter {
    /// Header length and gso_size of the last super-packet: the next read puts each segment's payload in its
    /// own slot behind room for its header, so that splitting only writes headers.
    predicted: Option<(usize, usize)>,
    /// The pieces of the read in flight: with a prediction, `k` segment slots then the overflow slot; without,
    /// one slot for the whole frame.
    plan: Vec<(u32, std::ops::Range<usize>)>,
    predicted_for_plan: Option<(usize, usize)>,
    /// A frame that missed the prediction, joined from its pieces.
    joined: Vec<u8>,
}

/// Offset of a packet in its slot: the virtio header in front of it.
const OFFSET: usize = turbotun_wire::VIRTIO_NET_HDR_LEN;

impl UringOffload {
    /// An offload forwarder from `src` to `dst` with `depth` read slots (a power of two) and batches of up to
    /// `batch` packets (twice as many spare slots, so that a batch can be split while the last one is written).
    /// Both queues need the 10-byte virtio header.
    pub fn new(src: &Queue, dst: &Queue, depth: usize, batch: usize) -> Result<Self> {
        Self::build(src, dst, depth, batch, true, false)
    }

    fn build(src: &Queue, dst: &Queue, depth: usize, batch: usize, multishot: bool, registered: bool) -> Result<Self> {
        for q in [src, dst] {
            if q.vnet_hdr_len() != OFFSET {
                return Err(Error::VnetHdrMismatch {
                    name: q.name().to_string(),
                    has: q.vnet_hdr_len(),
                    needs: format!("offload through io_uring uses {OFFSET}-byte headers"),
                });
            }
        }
        if batch == 0 || batch > crate::batch::BATCH_SIZE {
            return Err(Error::OutOfRange {
                what: "batch",
                value: batch as u64,
                allowed: format!("1 to {}", crate::batch::BATCH_SIZE),
            });
        }
        // Scattered reads take a batch of spares and one for the overflow while the last batch is written.
        let spare = if multishot { 2 * batch } else { 2 * batch + 2 };
        let stride = OFFSET + MAX_PACKET;
        let ring = ForwardRing::with_spares(src.as_fd(), dst.as_fd(), depth, spare, stride, multishot, registered)
            .map_err(|e| Error::io(format!("setting up io_uring for {} -> {}", src.name(), dst.name()), e))?;
        let slots = depth + spare;
        let framing = dst.mode().framing();
        let vnet = dst.offloads().contains(crate::Offloads::CSUM);
        let found = crate::Capabilities::if_probed().map(|c| c.gro_writes()).unwrap_or_default();
        let gro_tcp = vnet && found.tcp != Some(false);
        let gro_udp =
            vnet && dst.offloads().contains(crate::Offloads::USO4 | crate::Offloads::USO6) && found.udp != Some(false);
        let mut fwd = UringOffload {
            ring,
            scatter: None,
            rx: crate::ring::SlotRing::new(depth)?,
            tx: crate::ring::SlotRing::new(slots.next_power_of_two())?,
            spares: (depth as u32..slots as u32).rev().collect(),
            splitting: None,
            ready_segments: Vec::with_capacity(batch),
            slot_ids: Vec::with_capacity(2 * batch + 3),
            framing,
            batch_max: batch,
            batch: Vec::with_capacity(batch),
            lens: Vec::with_capacity(batch),
            all_valid: true,
            partial: false,
            gro: None,
            gro_tcp,
            gro_udp,
            to_write: Vec::with_capacity(batch),
            units: vec![Unit::default(); slots],
            completions: Vec::with_capacity(slots),
            scratch: Vec::new(),
            src_name: src.name().to_string(),
            dst_name: dst.name().to_string(),
            stats: Counters::default(),
            writer: crate::write_policy::Writer { vnet_hdr_len: OFFSET, ..Default::default() },
        };
        fwd.rebuild_gro();
        Ok(fwd)
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
    /// writes go through `READV_FIXED` and `WRITEV_FIXED` (Linux 6.15; see [`registered_vectors_supported`]):
    /// the kernel skips mapping and checking user memory per operation, but the whole arena (about 8.5 MiB per
    /// direction at the default batch) is pinned and so resident.
    pub fn scattered_with(src: &Queue, dst: &Queue, batch: usize, registered: bool) -> Result<Self> {
        let mut fwd = Self::build(src, dst, 1, batch, false, registered)?;
        fwd.scatter = Some(Scatter::default());
        // Every slot is a spare: nothing is provided to the kernel.
        fwd.spares = (0..(1 + 2 * batch + 2) as u32).rev().collect();
        Ok(fwd)
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
    pub fn stop_on(mut self, stop: crate::StopHandle) -> Self {
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
        (self.gro_tcp, self.gro_udp)
    }

    /// Segments split or packets read that are neither written nor dropped yet.
    pub fn held(&self) -> usize {
        self.tx.len()
    }

    /// One round, every packet sent on: see [`Self::poll_with`].
    pub fn poll(&mut self, dst: &Queue, timeout: Duration) -> Result<bool> {
        self.poll_with(dst, timeout, |_| {})
    }

    /// One round: one `io_uring_enter` submits the writes queued by the last round and waits up to `timeout`
    /// for completions; reads that completed are split into batches, each packet is handed to `per_packet`
    /// (IP or Ethernet header first, checksums complete; it may rewrite the bytes in place, keeping the length
    /// and leaving the checksums correct),
    /// and the batch is coalesced and queued for writing. `dst` is the queue the forwarder writes to (used only
    /// by the re-split fallback). Returns false if nothing completed. A deleted device is
    /// [`Error::DeviceGone`].
    pub fn poll_with(&mut self, dst: &Queue, timeout: Duration, mut per_packet: impl FnMut(&mut [u8])) -> Result<bool> {
        self.plan_read()?;
        let ready = self.ring.submit_and_wait(timeout).map_err(|e| self.ring_error(e))?;
        self.completions.clear();
        self.ring.reap(&mut self.completions);
        // Every completion is handled even after an error, so that no slot is stranded.
        let mut first_error = None;
        let completions = std::mem::take(&mut self.completions);
        for c in &completions {
            if let Err(e) = self.handle(dst, c) {
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

    /// Scattered reads: queues the next read (submitted by the next round's `io_uring_enter`) once the last one
    /// was handled, laid out by the prediction if there is one and enough spares are free.
    fn plan_read(&mut self) -> Result<()> {
        let Some(sc) = self.scatter.as_mut() else { return Ok(()) };
        if self.ring.readv_in_flight() > 0
            || !self.rx.is_empty()
            || self.splitting.is_some()
            || !self.ready_segments.is_empty()
        {
            return Ok(());
        }
        let mut plan = std::mem::take(&mut sc.plan);
        plan.clear();
        let k = self.batch_max.min(crate::sys::MAX_SCATTER - 2).min(self.spares.len().saturating_sub(1));
        let stride = self.ring.stride();
        match sc.predicted {
            Some((h, g)) if k >= 2 && g > 0 && OFFSET + h + g <= stride => {
                // No more segment slots than the largest frame of this shape can fill.
                let k = k.min((MAX_PACKET.saturating_sub(h)).div_ceil(g)).max(2);
                for i in 0..k {
                    let slot = self.spares.pop().unwrap_or_default();
                    let start = if i == 0 { 0 } else { OFFSET + h };
                    plan.push((slot, start..OFFSET + h + g));
                }
                let overflow = self.spares.pop().unwrap_or_default();
                plan.push((overflow, OFFSET..stride));
                sc.predicted_for_plan = Some((h, g));
            }
            _ => {
                let Some(slot) = self.spares.pop() else {
                    // Every spare is being written: the next round, after their completions.
                    sc.plan = plan;
                    return Ok(());
                };
                plan.push((slot, 0..stride));
                sc.predicted_for_plan = None;
            }
        }
        let queued = self.ring.readv_into(&plan);
        if let Err(e) = queued {
            self.spares.extend(plan.iter().map(|(slot, _)| *slot));
            plan.clear();
            if let Some(sc) = self.scatter.as_mut() {
                sc.plan = plan;
            }
            return Err(self.ring_error(e));
        }
        if let Some(sc) = self.scatter.as_mut() {
            sc.plan = plan;
        }
        Ok(())
    }

    /// A scattered read of `n` bytes completed: its frame goes into the receive ring as one slot holding the
    /// virtio header and the whole frame, or, when it is the predicted super-packet, becomes segments whose
    /// payload is already in place (only their headers are written).
    fn scattered_read(&mut self, n: usize) -> Result<()> {
        let Some(sc) = self.scatter.as_mut() else { return Ok(()) };
        let mut plan = std::mem::take(&mut sc.plan);
        let predicted = sc.predicted_for_plan.take();
        let result = self.place_scattered(n, &plan, predicted);
        plan.clear();
        if let Some(sc) = self.scatter.as_mut() {
            sc.plan = plan;
        }
        result
    }

    fn place_scattered(
        &mut self,
        n: usize,
        plan: &[(u32, std::ops::Range<usize>)],
        predicted: Option<(usize, usize)>,
    ) -> Result<()> {
        let all = |plan: &[(u32, std::ops::Range<usize>)]| plan.iter().map(|(s, _)| *s).collect::<Vec<u32>>();
        // What the read's pieces hold together; with a prediction the overflow slot also has room for the
        // segments' part when a frame of another shape is joined in it (its capacity bounds the whole frame).
        let capacity = match predicted {
            None => plan.iter().map(|(_, r)| r.len()).sum(),
            Some(_) => self.ring.stride(),
        };
        let len = match crate::queue::frame_len(n, OFFSET, capacity) {
            Ok(len) if !plan.is_empty() => len,
            // No plan means no read was queued: nothing to place (cannot happen), counted all the same.
            Ok(_) => {
                self.stats.drops.add(DropReason::Malformed, 1);
                return Ok(());
            }
            Err(reason) => {
                self.stats.drops.add(reason, 1);
                self.spares.extend(all(plan));
                return Ok(());
            }
        };
        let Some((h, g)) = predicted else {
            // One slot holds the header and the whole frame: as the multishot read leaves it.
            if self.rx.push(crate::ring::Slot { index: plan[0].0, len: n as u32 }).is_err() {
                self.stats.drops.add(DropReason::Malformed, 1);
                self.spares.extend(all(plan));
            }
            return Ok(());
        };
        let k = plan.len() - 1;
        if self.zero_copy_split(len, plan, (h, g, k))? {
            return Ok(());
        }
        // Not the predicted shape: join the pieces into the overflow slot (header and frame) and take it from the
        // receive ring like any other frame.
        let overflow = plan[k].0;
        let in_segments = (h + g + (k - 1) * g).min(len);
        let mut joined = self.scatter.as_mut().map(|sc| std::mem::take(&mut sc.joined)).unwrap_or_default();
        joined.clear();
        let mut at = 0;
        for (i, (slot, _)) in plan[..k].iter().enumerate() {
            if at >= in_segments {
                break;
            }
            let Some(bytes) = self.ring.slot(*slot as usize) else { continue };
            if i == 0 {
                let take = (h + g).min(in_segments);
                joined.extend_from_slice(&bytes[..OFFSET + take]);
                at += take;
            } else {
                let take = g.min(in_segments - at);
                joined.extend_from_slice(&bytes[OFFSET + h..OFFSET + h + take]);
                at += take;
            }
        }
        let rest = len - in_segments;
        let (src_name, dst_name) = (&self.src_name, &self.dst_name);
        let Some(overflow_bytes) = self.ring.slot_mut(overflow as usize) else {
            return Err(ring_error(src_name, dst_name, std::io::Error::other("the overflow slot is not ours")));
        };
        overflow_bytes.copy_within(OFFSET..OFFSET + rest, OFFSET + in_segments);
        overflow_bytes[..joined.len()].copy_from_slice(&joined);
        if let Some(sc) = self.scatter.as_mut() {
            sc.joined = joined;
        }
        self.spares.extend(plan[..k].iter().map(|(s, _)| *s));
        if self.rx.push(crate::ring::Slot { index: overflow, len: n as u32 }).is_err() {
            self.stats.drops.add(DropReason::Malformed, 1);
            self.spares.push(overflow);
        }
        Ok(())
    }

    /// The predicted super-packet (or a packet that fits the first slot): each segment's payload already sits
    /// in its own slot; only the headers are written. False if the frame has another shape.
    fn zero_copy_split(
        &mut self,
        len: usize,
        plan: &[(u32, std::ops::Range<usize>)],
        (h, g, k): (usize, usize, usize),
    ) -> Result<bool> {
        let first = plan[0].0;
        let Some(bytes) = self.ring.slot_mut(first as usize) else { return Ok(false) };
        let Ok(hdr) = VirtioNetHdrRepr::parse(&bytes[..OFFSET]) else { return Ok(false) };
        if !hdr.is_gso() {
            if len > h + g {
                return Ok(false);
            }
            // A packet that fits the first slot is delivered where it is (as a multishot read leaves it).
            if self.rx.push(crate::ring::Slot { index: first, len: (OFFSET + len) as u32 }).is_err() {
                return Ok(false);
            }
            self.spares.extend(plan[1..].iter().map(|(s, _)| *s));
            return Ok(true);
        }
        if len < h || len > h + k * g || h > turbotun_wire::gso::MAX_HEADER_LEN {
            return Ok(false);
        }
        let mut template = [0u8; turbotun_wire::gso::MAX_HEADER_LEN];
        let template = &mut template[..h];
        template.copy_from_slice(&bytes[OFFSET..OFFSET + h]);
        let Ok(splitter) = Splitter::from_head(&hdr, template, len, self.framing) else { return Ok(false) };
        let splitter = splitter.leave_checksums_partial(self.partial);
        let count = splitter.segment_count();
        if splitter.gso_size() != g || count > k || count == 0 {
            return Ok(false);
        }
        self.slot_ids.clear();
        self.slot_ids.extend(plan[..count].iter().map(|(s, _)| *s));
        let (src_name, dst_name) = (&self.src_name, &self.dst_name);
        let mut bufs = self.ring.slots_mut(&self.slot_ids).map_err(|e| ring_error(src_name, dst_name, e))?;
        for (i, buf) in bufs.iter_mut().enumerate() {
            let plen = splitter.segment_payload_len(i);
            let (front, back) = buf.split_at_mut(OFFSET + h);
            if splitter.write_header(i, &back[..plen], &mut front[OFFSET..]).is_err() {
                return Ok(false);
            }
        }
        drop(bufs);
        let segments = self.slot_ids.iter().enumerate().map(|(i, &slot)| (slot, h + splitter.segment_payload_len(i)));
        self.ready_segments.extend(segments);
        self.spares.extend(plan[count..].iter().map(|(s, _)| *s));
        self.stats.super_packets += 1;
        self.stats.zero_copy_splits += 1;
        self.stats.segments += count as u64;
        Ok(true)
    }

    /// Waits up to `timeout` for the writes in flight (reads that complete meanwhile are forwarded too);
    /// returns how many of the packets read are neither written nor dropped, for the caller to count as
    /// stopped.
    pub fn drain(&mut self, dst: &Queue, timeout: Duration) -> Result<usize> {
        let deadline = std::time::Instant::now() + timeout;
        while self.ring.writes_in_flight() > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            self.poll(dst, left)?;
        }
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

    fn handle(&mut self, dst: &Queue, c: &Completion) -> Result<()> {
        match (c.op, c.slot, c.result) {
            (Op::Read, None, Err(errno)) if !matches!(errno, libc::EAGAIN | libc::EINTR) => {
                Err(queue_io_error(&self.src_name, "read", std::io::Error::from_raw_os_error(errno)))
            }
            (Op::Read, None, _) => Ok(()),
            (Op::Read, Some(_), Ok(n)) if self.scatter.is_some() => {
                self.stats.reads += 1;
                self.scattered_read(n)
            }
            (Op::Read, Some(_), Err(errno)) if self.scatter.is_some() => {
                let plan = self.scatter.as_mut().map(|sc| std::mem::take(&mut sc.plan)).unwrap_or_default();
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
                if let Err(reason) = crate::queue::frame_len(n, OFFSET, self.ring.stride()) {
                    self.stats.drops.add(reason, 1);
                    return self.ring.recycle(slot).map_err(|e| self.ring_error(e));
                }
                let entry = crate::ring::Slot { index: slot as u32, len: n as u32 };
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
            (Op::Write, Some(head), result) => self.write_done(dst, head, result),
            (Op::Write, None, _) => Ok(()),
        }
    }

    /// A write completed: count it, or decide under the write policy what its failure becomes.
    fn write_done(&mut self, dst: &Queue, head: usize, result: std::result::Result<usize, i32>) -> Result<()> {
        let unit = std::mem::take(&mut self.units[head]);
        let errno = match result {
            Ok(_) => {
                self.stats.writes += 1;
                self.stats.packets += unit.packets;
                self.stats.bytes += unit.bytes;
                return self.finish(unit);
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
                dst.count_tx_drop(unit.packets);
                self.finish(unit)
            }
            WriteFailure::Resplit => {
                let result = self.resplit(dst, &unit);
                self.finish(unit)?;
                result
            }
            WriteFailure::Fatal => {
                let err = queue_io_error(&self.dst_name, "write", std::io::Error::from_raw_os_error(errno));
                self.stats.drops.add(crate::write_policy::lost_with(&err), unit.packets);
                self.finish(unit)?;
                Err(err)
            }
        }
    }

    /// The slots of a finished write leave the transmit ring (in ring order, once every earlier write has
    /// finished too): read slots go back to the kernel, spares to the spare list.
    fn finish(&mut self, unit: Unit) -> Result<()> {
        for k in 0..unit.pieces.len() {
            self.tx.complete(unit.first_pos.wrapping_add(k as u32));
        }
        while let Some(slot) = self.tx.release_completed() {
            self.give_back(slot.index)?;
        }
        Ok(())
    }

    fn give_back(&mut self, slot: u32) -> Result<()> {
        if self.scatter.is_none() && (slot as usize) < self.ring.depth() {
            self.ring.recycle(slot as usize).map_err(|e| self.ring_error(e))
        } else {
            self.spares.push(slot);
            Ok(())
        }
    }

    /// The kernel refused a coalesced packet: that GRO kind goes off and the packet is split again and written
    /// segment by segment with blocking writes, under the same policy as the blocking path.
    fn resplit(&mut self, dst: &Queue, unit: &Unit) -> Result<()> {
        self.stats.gro_fallbacks += 1;
        let mut joined = std::mem::take(&mut self.scratch);
        joined.clear();
        for (slot, range) in &unit.pieces {
            if let Some(bytes) = self.ring.slot(*slot as usize) {
                joined.extend_from_slice(&bytes[range.clone()]);
            }
        }
        let hdr = VirtioNetHdrRepr::parse(&joined[..OFFSET.min(joined.len())]).unwrap_or_default();
        if hdr.gso_kind() == turbotun_wire::virtio_net::gso::UDP_L4 {
            tracing::warn!("{}: kernel refused a coalesced UDP write; UDP GRO off", self.dst_name);
            self.gro_udp = false;
        } else {
            tracing::warn!("{}: kernel refused a coalesced TCP write; TCP GRO off", self.dst_name);
            self.gro_tcp = false;
        }
        self.rebuild_gro();
        let result = crate::write_policy::write_split(
            &self.writer,
            dst,
            self.framing,
            &hdr,
            &joined[OFFSET.min(joined.len())..],
            unit.packets,
            &mut self.stats,
        );
        self.scratch = joined;
        result
    }

    fn rebuild_gro(&mut self) {
        self.gro = (self.gro_tcp || self.gro_udp).then(|| {
            turbotun_wire::gro::Gro::new(turbotun_wire::gro::GroConfig {
                tcp: self.gro_tcp,
                udp: self.gro_udp,
                framing: self.framing,
                vnet_hdr_len: OFFSET,
            })
            .with_gather(true)
        });
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
    fn take_frame(&mut self, entry: crate::ring::Slot) -> Result<()> {
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
            let packet = &mut bytes[OFFSET..n];
            if hdr.flags & flags::NEEDS_CSUM != 0 {
                let (start, at) = (hdr.csum_start.into(), hdr.csum_offset.into());
                if let Err(e) = turbotun_wire::checksum::complete_partial(packet, start, at) {
                    tracing::debug!("{}: dropping a frame: {}", self.src_name, Malformed::PartialChecksum(e));
                    return self.drop_frame(DropReason::Malformed);
                }
            } else if hdr.flags & flags::DATA_VALID == 0 {
                self.all_valid = false;
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
                if let Some(sc) = self.scatter.as_mut() {
                    sc.predicted = Some((s.hdr_len(), s.gso_size()));
                }
                s.segment_count()
            }
            Err(e) => {
                tracing::debug!("{}: dropping a frame: {}", self.src_name, Malformed::Gso(e));
                return self.drop_frame(DropReason::Malformed);
            }
        };
        if total > crate::batch::MAX_SEGMENTS {
            self.stats.drops.add(DropReason::TooManySegments, (total - crate::batch::MAX_SEGMENTS) as u64);
        }
        let total = total.min(crate::batch::MAX_SEGMENTS);
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
            splitter.leave_checksums_partial(partial).split_into(s.next, outs, &mut self.lens[first..], OFFSET)
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
        match self.gro.as_mut() {
            Some(gro) => {
                let stats = gro.coalesce(&mut bufs, &mut self.lens, OFFSET, checksums, &mut self.to_write);
                self.stats.coalesced += stats.coalesced as u64;
            }
            None => {
                self.to_write.clear();
                self.to_write.extend(0..bufs.len());
                for (buf, &len) in bufs.iter_mut().zip(&self.lens) {
                    let (vh, packet) = buf[..OFFSET + len].split_at_mut(OFFSET);
                    let partial = checksums == Checksums::Partial;
                    turbotun_wire::partial::write_plain_header(vh, packet, self.framing, partial);
                }
            }
        }
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
                let entry = crate::ring::Slot { index: *slot, len: range.len() as u32 };
                let moved = self.tx.push(entry).is_ok() && self.tx.take().is_some();
                debug_assert!(moved, "next_batch keeps room in the transmit ring for the whole batch");
            }
            let queued = self.ring.writev_from(&unit.pieces);
            self.units[head_slot] = unit;
            queued.map_err(|e| self.ring_error(e))?;
        }
        Ok(())
    }

    fn ring_error(&self, e: std::io::Error) -> Error {
        ring_error(&self.src_name, &self.dst_name, e)
    }
}

fn ring_error(src: &str, dst: &str, e: std::io::Error) -> Error {
    Error::io(format!("io_uring {src} -> {dst}"), e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::testing::fake_queue;

    /// A scattered read whose completion reports more bytes than its pieces hold (the tun driver reports a
    /// frame's full length, cut to the buffers): counted as too big on every layout, never a panic, every slot
    /// back among the spares. Found by review: the overflow copy would slice past the slot.
    #[test]
    fn test_an_oversized_scattered_read_is_too_big() {
        let (src, _feed) = fake_queue();
        let (dst, _sink) = fake_queue();
        for predicted in [None, Some((40, 1000))] {
            let mut fwd = UringOffload::scattered(&src, &dst, 16).unwrap();
            let spares = fwd.spares.len();
            if let Some(sc) = fwd.scatter.as_mut() {
                sc.predicted = predicted;
            }
            fwd.plan_read().unwrap();
            let planned = fwd.scatter.as_ref().map_or(0, |sc| sc.plan.len());
            assert!(planned >= 1, "{predicted:?}");
            fwd.scattered_read(fwd.ring.stride() + 4096).unwrap();
            let stats = fwd.stats();
            assert_eq!(stats.drops.too_big, 1, "{predicted:?}: {stats:?}");
            assert_eq!(fwd.spares.len(), spares, "{predicted:?}: every slot of the read is a spare again");
            assert!(fwd.rx.is_empty() && fwd.ready_segments.is_empty(), "{predicted:?}: nothing delivered");
        }
    }
}
