//! Batched receive (GSO split) and send (GRO coalesce) over one [`Queue`].
//!
//! Buffers belong to the caller: packet `i` lives at `bufs[i][offset .. offset + lens[i]]`, and `offset` leaves
//! room in front for the virtio header (`offset >= queue.vnet_hdr_len()`). Buffers should hold
//! `offset + 65535` bytes so that coalesced packets fit.
//!
//! Nothing is lost silently: segments that do not fit into the caller's buffers stay pending for the next call,
//! malformed packets are counted and reported, and writes the kernel refuses are counted as drops.

use std::io::{self, IoSlice};
use std::os::fd::AsFd;

use turbotun_wire::gro::{Gro, GroConfig};
use turbotun_wire::gso::{SplitProgress, Splitter};
use turbotun_wire::virtio_net::{flags, gso, VirtioNetHdrRepr};
use turbotun_wire::Framing;

use crate::device::{Mode, Offloads};
use crate::error::{queue_io_error, Error, Result};
use crate::queue::{Queue, MAX_PACKET, MAX_VNET_HDR};
use crate::sys;

/// Pieces one gathered write can carry: a coalesced packet of at most 128 segments (UDP_MAX_SEGMENTS on newer
/// kernels) plus its header.
const MAX_PIECES: usize = 129;

/// How many packets one batch call handles at most: a 64 KiB super-packet of MSS 1448 splits into 46 segments.
pub const BATCH_SIZE: usize = 64;

fn framing(mode: Mode) -> Framing {
    match mode {
        Mode::Tun => Framing::Ip,
        Mode::Tap => Framing::Ethernet,
    }
}

/// Counters of the batch layer (the queue's own counters count fd reads and writes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Reads that returned a frame (this batch object's own, however many threads share the queue).
    pub reads: u64,
    /// Reads that returned a GSO super-packet.
    pub super_packets: u64,
    /// Of those, the ones split without copying a payload byte: the read scattered each segment's payload into
    /// its own buffer (the previous super-packet's header length and gso_size held).
    pub zero_copy_splits: u64,
    /// Packets handed to the caller (segments of super-packets included).
    pub segments: u64,
    /// Reads dropped because the packet was malformed (bad virtio header or offsets).
    pub malformed: u64,
    /// Packets the coalescer merged into another (they were written as part of it).
    pub coalesced: u64,
    /// Writes issued.
    pub writes: u64,
    /// Packets the kernel refused or that could not be written (device down); counted, never silent.
    pub dropped: u64,
    /// Coalesced writes the kernel refused, after which that GRO kind was turned off and the packet re-split.
    pub gro_fallbacks: u64,
}

/// What one [`RecvBatch::recv`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Packets written to `bufs[..packets]`.
    pub packets: usize,
    /// Segments of the last super-packet that did not fit and will be returned by the next call (no read).
    pub pending: usize,
    /// Whether the L4 checksums of these packets are known to be correct (we completed or computed them, or the
    /// kernel marked them `DATA_VALID`): a coalescer need not verify them again.
    pub checksums_valid: bool,
}

struct Pending {
    hdr: VirtioNetHdrRepr,
    len: usize,
    next: usize,
}

/// The receive side: reads one packet or super-packet per call and splits it into the caller's buffers.
pub struct RecvBatch {
    framing: Framing,
    vnet_hdr_len: usize,
    receives_super_packets: bool,
    /// Where super-packets land before they are split (only used on queues with segmentation offloads).
    scratch: Box<[u8]>,
    pending: Option<Pending>,
    stats: BatchStats,
    /// Whether reads after the first of a batch can be made non-sleeping with `RWF_NOWAIT` (probed on use).
    nowait: bool,
    /// Batches left that skip the further reads, and the next such pause: a further read that finds the queue
    /// empty costs a system call and saves none (the next batch's first read would have taken the packet), so
    /// after one comes back empty the next 1, 2, 4 ... 16 batches take one read each (e.g. a stream of ACKs).
    skip_further: u8,
    next_skip: u8,
    /// Header length and gso_size of the last super-packet: the next read is scattered so that, if they hold,
    /// each segment's payload lands in its own buffer right behind room for its header (zero-copy split).
    predicted: Option<(usize, usize)>,
}

/// Where [`RecvBatch::recv_scattered`] left a frame.
enum Scattered {
    /// Split (or delivered) into the caller's buffers.
    Done(Received),
    /// Reassembled in `scratch[..len]` for the copying split (the prediction did not hold).
    InScratch { hdr: VirtioNetHdrRepr, len: usize },
    /// Dropped as malformed (counted).
    Malformed,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch").field("framing", &self.framing).field("stats", &self.stats).finish()
    }
}

impl RecvBatch {
    pub fn new(queue: &Queue) -> Self {
        let receives_super_packets = queue.receives_super_packets();
        RecvBatch {
            framing: framing(queue.mode()),
            vnet_hdr_len: queue.vnet_hdr_len(),
            receives_super_packets,
            scratch: vec![0u8; if receives_super_packets { MAX_PACKET } else { 0 }].into_boxed_slice(),
            pending: None,
            stats: BatchStats::default(),
            nowait: true,
            skip_further: 0,
            next_skip: 1,
            predicted: None,
        }
    }

    pub fn stats(&self) -> BatchStats {
        self.stats
    }

    /// Fills `bufs` with MTU-sized packets from one read (or from the segments left over from the last one).
    /// Blocks if the queue is blocking and nothing is pending. A malformed packet is counted and skipped (the
    /// next read follows), so that one bad packet never stops a queue.
    pub fn recv<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
    ) -> Result<Received> {
        self.recv_one(queue, bufs, lens, offset, false)
    }

    /// [`Self::recv`]; with `nowait` the read never sleeps, even on a blocking queue (a would-block error).
    fn recv_one<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        nowait: bool,
    ) -> Result<Received> {
        if bufs.is_empty() || lens.len() < bufs.len() {
            return Err(Error::InvalidConfig("recv needs at least one buffer and a length slot per buffer".into()));
        }
        if self.pending.is_some() {
            return self.split_pending(bufs, lens, offset);
        }
        loop {
            if !self.receives_super_packets {
                return self.recv_direct(queue, bufs, lens, offset, nowait);
            }
            let scattered = match self.predicted {
                Some(prediction) if bufs.len() >= 2 => {
                    self.recv_scattered(queue, bufs, lens, offset, nowait, prediction)?
                }
                _ => self.read_into_scratch(queue, nowait)?,
            };
            let (hdr, len) = match scattered {
                Scattered::Done(received) => return Ok(received),
                Scattered::InScratch { hdr, len } => (hdr, len),
                Scattered::Malformed => continue,
            };
            // Validated once here; only segments left for a later call are split from `Pending` again.
            let splitter = match Splitter::new(&hdr, &self.scratch[..len], self.framing) {
                Ok(splitter) => splitter,
                Err(e) => {
                    self.stats.malformed += 1;
                    tracing::debug!("{}: dropping malformed packet: {e}", queue.name());
                    continue;
                }
            };
            if splitter.is_gso() {
                self.predicted = Some((splitter.hdr_len(), splitter.gso_size()));
            }
            let progress = match splitter.split_into(0, bufs, lens, offset) {
                Ok(progress) => progress,
                Err(e) => {
                    // Buffers too small: keep the super-packet for a call with larger ones.
                    self.pending = Some(Pending { hdr, len, next: 0 });
                    return Err(split_error(e));
                }
            };
            if !progress.is_done() {
                self.pending = Some(Pending { hdr, len, next: progress.next });
            }
            return Ok(self.received(&hdr, progress));
        }
    }

    /// Reads one frame scattered for a super-packet of header length `h` and gso_size `g`: the virtio header,
    /// then `h + g` bytes into `bufs[0]` at `offset`, then `g` bytes into each further buffer at `offset + h`
    /// (behind room for that segment's header), and anything beyond into `scratch`. When the frame is such a
    /// super-packet, each segment only needs its header written: no payload byte is copied. Any other frame is
    /// delivered as is when it fits the first buffer, or reassembled in `scratch` for the copying split.
    fn recv_scattered<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        nowait: bool,
        (h, g): (usize, usize),
    ) -> Result<Scattered> {
        let vlen = self.vnet_hdr_len;
        let k = bufs.len().min(lens.len()).min(sys::MAX_SCATTER - 2);
        // Every buffer must have room for its part; otherwise the copying split (which reports small buffers).
        let first_end = offset + h + g;
        if bufs[..k].iter_mut().any(|b| b.as_mut().len() < first_end) {
            self.predicted = None;
            return self.read_into_scratch(queue, nowait);
        }
        let mut head = [0u8; MAX_VNET_HDR];
        let parts = std::iter::once(&mut head[..vlen])
            .chain(bufs[..k].iter_mut().enumerate().map(|(i, b)| {
                let start = if i == 0 { offset } else { offset + h };
                &mut b.as_mut()[start..first_end]
            }))
            .chain(std::iter::once(&mut self.scratch[..]));
        let n =
            sys::read_scattered(queue.as_fd(), parts, nowait).map_err(|e| queue_io_error(queue.name(), "read", e))?;
        let Some((hdr, len)) = self.frame(queue, &head[..vlen], n) else {
            return Ok(Scattered::Malformed);
        };
        let in_bufs = h + g + (k - 1) * g;
        if !hdr.is_gso() {
            if len > h + g {
                self.reassemble(bufs, offset, h, g, k, len);
                return Ok(Scattered::InScratch { hdr, len });
            }
            // The whole packet is in the first buffer, where it belongs.
            let received = self.deliver_whole(&hdr, &mut bufs[0].as_mut()[offset..offset + len], &mut lens[0]);
            return Ok(if received.packets == 0 { Scattered::Malformed } else { Scattered::Done(received) });
        }
        if len >= h && len <= in_bufs {
            let mut template = [0u8; turbotun_wire::gso::MAX_HEADER_LEN];
            let template = &mut template[..h.min(turbotun_wire::gso::MAX_HEADER_LEN)];
            template.copy_from_slice(&bufs[0].as_mut()[offset..offset + template.len()]);
            if let Ok(splitter) = Splitter::from_head(&hdr, template, len, self.framing) {
                if splitter.gso_size() == g && splitter.segment_count() <= k {
                    for i in 0..splitter.segment_count() {
                        let plen = splitter.segment_payload_len(i);
                        let (front, back) = bufs[i].as_mut().split_at_mut(offset + h);
                        if splitter.write_header(i, &back[..plen], &mut front[offset..]).is_err() {
                            // Cannot happen for a validated splitter; never leave half-written segments.
                            self.stats.malformed += 1;
                            return Ok(Scattered::Malformed);
                        }
                        lens[i] = h + plen;
                    }
                    let total = splitter.segment_count();
                    self.stats.zero_copy_splits += 1;
                    let progress = SplitProgress { produced: total, next: total, total };
                    return Ok(Scattered::Done(self.received(&hdr, progress)));
                }
            }
        }
        // Another header length, gso_size or size: put the frame back together and split it by copying.
        self.reassemble(bufs, offset, h, g, k, len);
        Ok(Scattered::InScratch { hdr, len })
    }

    /// Moves a scattered frame of `len` bytes (see [`Self::recv_scattered`]) into `scratch[..len]`.
    fn reassemble<B: AsMut<[u8]>>(&mut self, bufs: &mut [B], offset: usize, h: usize, g: usize, k: usize, len: usize) {
        let in_bufs = (h + g + (k - 1) * g).min(len);
        // What overflowed into scratch goes behind the part that was in the buffers.
        self.scratch.copy_within(..len - in_bufs, in_bufs);
        let mut at = 0;
        for (i, b) in bufs[..k].iter_mut().enumerate() {
            if at >= in_bufs {
                break;
            }
            let start = if i == 0 { offset } else { offset + h };
            let part = if i == 0 { h + g } else { g };
            let n = part.min(in_bufs - at);
            self.scratch[at..at + n].copy_from_slice(&b.as_mut()[start..start + n]);
            at += n;
        }
    }

    /// The plain read into `scratch` (no prediction to scatter by).
    fn read_into_scratch(&mut self, queue: &Queue, nowait: bool) -> Result<Scattered> {
        let mut head = [0u8; MAX_VNET_HDR];
        let head = &mut head[..self.vnet_hdr_len];
        let n = sys::read2(queue.as_fd(), head, &mut self.scratch, nowait)
            .map_err(|e| queue_io_error(queue.name(), "read", e))?;
        Ok(match self.frame(queue, head, n) {
            Some((hdr, len)) => Scattered::InScratch { hdr, len },
            None => Scattered::Malformed,
        })
    }

    /// Accounts for what one split produced.
    fn received(&mut self, hdr: &VirtioNetHdrRepr, progress: SplitProgress) -> Received {
        self.stats.segments += progress.produced as u64;
        // We computed every checksum ourselves when the kernel left them partial; otherwise trust DATA_VALID.
        let valid = hdr.flags & (flags::NEEDS_CSUM | flags::DATA_VALID) != 0;
        Received { packets: progress.produced, pending: progress.total - progress.next, checksums_valid: valid }
    }

    /// Fills as much of `bufs` as the queue has ready: the first read waits (up to `timeout`, on a non-blocking
    /// queue), later ones only take what is there already. A batch ends after a super-packet (its segments, or
    /// those that fit, with the rest pending for next time). Returns zero packets on timeout.
    pub fn recv_many<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        timeout: Option<std::time::Duration>,
    ) -> Result<Received> {
        loop {
            match self.try_recv_many(queue, bufs, lens, offset) {
                // A blocking queue woken by `crate::wake`: the caller gets control back to look at its flags.
                Err(e) if crate::queue::is_interrupted(&e) => {
                    return Ok(Received { packets: 0, pending: 0, checksums_valid: false });
                }
                Err(e) if crate::queue::is_would_block(&e) => {
                    if !queue.wait_readable(timeout)? {
                        return Ok(Received { packets: 0, pending: 0, checksums_valid: false });
                    }
                }
                other => return other,
            }
        }
    }

    /// Like [`Self::recv_many`] without waiting: on a non-blocking queue with nothing to read it returns the
    /// would-block error (see [`crate::queue::is_would_block`]), which is what an event loop waits on. On a
    /// blocking queue the first read sleeps until a packet comes; the later ones never do (`RWF_NOWAIT`), so a
    /// batch holds what was already queued. A kernel without `RWF_NOWAIT` gets one read per batch on a blocking
    /// queue.
    pub fn try_recv_many<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
    ) -> Result<Received> {
        let mut total = Received { packets: 0, pending: 0, checksums_valid: true };
        let n = bufs.len().min(lens.len());
        let skip_further = self.skip_further > 0;
        self.skip_further = self.skip_further.saturating_sub(1);
        while total.packets < n {
            let nowait = total.packets > 0;
            if nowait && (!self.nowait || skip_further) {
                break;
            }
            match self.recv_one(queue, &mut bufs[total.packets..n], &mut lens[total.packets..n], offset, nowait) {
                Ok(r) => {
                    if nowait {
                        self.next_skip = 1;
                    }
                    total.packets += r.packets;
                    total.checksums_valid &= r.checksums_valid;
                    total.pending = r.pending;
                    // A batch ends with a super-packet: its segments coalesce back into the buffer it started in,
                    // so the only buffer that grows to 64 KiB is the one at the batch's start, instead of heads
                    // wandering over every buffer (each would end up resident) as reads straddle batches.
                    if r.pending > 0 || r.packets > 1 {
                        break;
                    }
                }
                Err(e) if crate::queue::is_would_block(&e) && total.packets > 0 => {
                    self.skip_further = self.next_skip;
                    self.next_skip = (self.next_skip * 2).min(16);
                    break;
                }
                Err(e) if crate::queue::is_nowait_unsupported(&e) && total.packets > 0 => {
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

    /// Reads straight into the first buffer: the queue cannot receive super-packets, so no split can be needed.
    fn recv_direct<B: AsMut<[u8]>>(
        &mut self,
        queue: &Queue,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        nowait: bool,
    ) -> Result<Received> {
        let buf = bufs[0].as_mut();
        let Some(data) = buf.get_mut(offset..) else {
            return Err(Error::BufferTooSmall { have: buf.len(), need: offset + 1 });
        };
        let (hdr, len) = queue.recv_with_hdr_inner(data, nowait)?;
        self.stats.reads += 1;
        Ok(self.deliver_whole(&hdr, &mut data[..len], &mut lens[0]))
    }

    /// Hands over a GSO_NONE packet that already sits where it belongs, its checksum completed if partial.
    fn deliver_whole(&mut self, hdr: &VirtioNetHdrRepr, packet: &mut [u8], len: &mut usize) -> Received {
        let mut valid = hdr.flags & flags::DATA_VALID != 0;
        if hdr.flags & flags::NEEDS_CSUM != 0 {
            let (start, offset) = (hdr.csum_start.into(), hdr.csum_offset.into());
            if turbotun_wire::checksum::complete_partial(packet, start, offset).is_err() {
                self.stats.malformed += 1;
                return Received { packets: 0, pending: 0, checksums_valid: false };
            }
            valid = true;
        }
        *len = packet.len();
        self.stats.segments += 1;
        Received { packets: 1, pending: 0, checksums_valid: valid }
    }

    /// Accounts for one read of `n` bytes whose virtio header is `head`: its length after the header, and the
    /// header, or `None` (counted as malformed) for a short read, a length beyond the scratch buffer (a
    /// truncated frame can report its full length) or a bad header.
    fn frame(&mut self, queue: &Queue, head: &[u8], n: usize) -> Option<(VirtioNetHdrRepr, usize)> {
        self.stats.reads += 1;
        let parsed = n
            .checked_sub(head.len())
            .filter(|&len| len <= self.scratch.len())
            .inspect(|&len| queue.count_rx(1, len as u64))
            .and_then(|len| Some((VirtioNetHdrRepr::parse(head).ok()?, len)));
        match parsed {
            Some((hdr, _)) if hdr.is_gso() => self.stats.super_packets += 1,
            Some(_) => {}
            None => self.stats.malformed += 1,
        }
        parsed
    }

    fn split_pending<B: AsMut<[u8]>>(&mut self, bufs: &mut [B], lens: &mut [usize], offset: usize) -> Result<Received> {
        let Some(p) = self.pending.as_mut() else {
            return Ok(Received { packets: 0, pending: 0, checksums_valid: false });
        };
        let splitter = Splitter::new(&p.hdr, &self.scratch[..p.len], self.framing)
            .map_err(|e| Error::MalformedPacket(e.to_string()))?;
        let progress = splitter.split_into(p.next, bufs, lens, offset).map_err(split_error)?;
        p.next = progress.next;
        let hdr = p.hdr;
        if progress.is_done() {
            self.pending = None;
        }
        Ok(self.received(&hdr, progress))
    }
}

fn split_error(e: turbotun_wire::GsoError) -> Error {
    match e {
        turbotun_wire::GsoError::BufferTooSmall { need, have } => Error::BufferTooSmall { have, need },
        other => Error::MalformedPacket(other.to_string()),
    }
}

/// What one [`SendBatch::send`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Packets the caller handed in that reached the kernel (merged ones included).
    pub packets: usize,
    /// Writes issued.
    pub writes: usize,
    /// Packets not written (device down, refused); also counted in the queue's `tx_dropped`.
    pub dropped: usize,
}

/// Whether the kernel accepts coalesced writes of each kind (`None`: could not tell, e.g. the device was down).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroWriteSupport {
    pub tcp: Option<bool>,
    pub udp: Option<bool>,
}

/// Writes one harmless coalesced packet of each kind (two segments, the second shorter than `gso_size`, the case
/// some 6.6-era kernels refuse with EINVAL) and reports which the kernel accepted. The probes go from 127.0.0.1
/// to 127.0.0.1, which the kernel's IP layer drops as martian after the virtio header was checked; on a TAP
/// device they are also addressed to a MAC that is not the device's.
pub fn probe_gro_writes(queue: &Queue) -> GroWriteSupport {
    if queue.vnet_hdr_len() == 0 {
        return GroWriteSupport { tcp: Some(false), udp: Some(false) };
    }
    let probe = |udp: bool| -> Option<bool> {
        let frame = probe_frame(queue.mode(), queue.vnet_hdr_len(), udp);
        match sys::write(queue.as_fd(), &frame) {
            Ok(_) => Some(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Some(false),
            Err(_) => None,
        }
    };
    GroWriteSupport { tcp: probe(false), udp: probe(true) }
}

fn probe_frame(mode: Mode, vnet_hdr_len: usize, udp: bool) -> Vec<u8> {
    const PAYLOAD: usize = 150;
    const GSO_SIZE: u16 = 100;
    let l2 = if mode == Mode::Tap { 14 } else { 0 };
    let l4_len = if udp { 8 } else { 20 };
    let ip_total = 20 + l4_len + PAYLOAD;
    let mut f = vec![0u8; vnet_hdr_len + l2 + ip_total];
    let hdr = VirtioNetHdrRepr {
        flags: flags::NEEDS_CSUM,
        gso_type: if udp { gso::UDP_L4 } else { gso::TCPV4 },
        hdr_len: (l2 + 20 + l4_len) as u16,
        gso_size: GSO_SIZE,
        csum_start: (l2 + 20) as u16,
        csum_offset: if udp { 6 } else { 16 },
    };
    hdr.emit(&mut f[..vnet_hdr_len]);
    let p = &mut f[vnet_hdr_len..];
    if l2 > 0 {
        p[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        p[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
        p[12..14].copy_from_slice(&[0x08, 0x00]);
    }
    let ip = &mut p[l2..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(ip_total as u16).to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = if udp { 17 } else { 6 };
    ip[12..16].copy_from_slice(&[127, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[127, 0, 0, 1]);
    let ip_sum = turbotun_wire::checksum::checksum(&ip[..20], 0);
    ip[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let l4 = &mut ip[20..];
    l4[..2].copy_from_slice(&9u16.to_be_bytes());
    l4[2..4].copy_from_slice(&9u16.to_be_bytes());
    if udp {
        l4[4..6].copy_from_slice(&((8 + PAYLOAD) as u16).to_be_bytes());
    } else {
        l4[12] = 5 << 4;
        l4[13] = 0x18; // ACK|PSH
        l4[14..16].copy_from_slice(&1024u16.to_be_bytes());
    }
    let pseudo =
        turbotun_wire::checksum::pseudo_header_v4([127, 0, 0, 1], [127, 0, 0, 1], ip[9], (l4_len + PAYLOAD) as u32);
    let partial = turbotun_wire::checksum::fold(pseudo);
    let at = 20 + usize::from(hdr.csum_offset);
    ip[at..at + 2].copy_from_slice(&partial.to_be_bytes());
    f
}

/// The send side: coalesces a batch (GRO) and writes it.
pub struct SendBatch {
    gro: Option<Gro>,
    framing: Framing,
    vnet_hdr_len: usize,
    gro_tcp: bool,
    gro_udp: bool,
    to_write: Vec<usize>,
    scratch: Vec<u8>,
    /// A coalesced packet joined from its pieces, for the rare paths that need one contiguous frame.
    joined: Vec<u8>,
    stats: BatchStats,
    /// Probes left before giving up on learning what the kernel accepts (each needs the device up).
    probes_left: u8,
    probe_result: GroWriteSupport,
}

impl std::fmt::Debug for SendBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch")
            .field("gro_tcp", &self.gro_tcp)
            .field("gro_udp", &self.gro_udp)
            .field("stats", &self.stats)
            .finish()
    }
}

impl SendBatch {
    /// Coalesces TCP when the queue has a virtio header with checksum offload, UDP when USO was granted too
    /// (the kernel accepts `GSO_UDP_L4` writes since the same release that added USO).
    pub fn new(queue: &Queue) -> Self {
        let vnet = queue.vnet_hdr_len() > 0 && queue.offloads().contains(Offloads::CSUM);
        Self::with_gro(queue, vnet, vnet && queue.offloads().contains(Offloads::USO4 | Offloads::USO6))
    }

    /// Like [`Self::new`] with explicit GRO kinds (both false: plain writes, one per packet).
    pub fn with_gro(queue: &Queue, tcp: bool, udp: bool) -> Self {
        let vnet_hdr_len = queue.vnet_hdr_len();
        let gro_on = vnet_hdr_len > 0 && (tcp || udp);
        let framing = framing(queue.mode());
        SendBatch {
            gro: gro_on.then(|| Gro::new(GroConfig { tcp, udp, framing, vnet_hdr_len }).with_gather(true)),
            framing,
            vnet_hdr_len,
            gro_tcp: gro_on && tcp,
            gro_udp: gro_on && udp,
            to_write: Vec::with_capacity(BATCH_SIZE),
            scratch: Vec::new(),
            joined: Vec::new(),
            stats: BatchStats::default(),
            probes_left: if gro_on { 8 } else { 0 },
            probe_result: GroWriteSupport::default(),
        }
    }

    /// What the write probe found so far (see [`probe_gro_writes`]).
    pub fn gro_write_support(&self) -> GroWriteSupport {
        self.probe_result
    }

    /// Runs the GRO write probe until it gives an answer; turns off the kinds the kernel refuses.
    fn probe_once(&mut self, queue: &Queue) {
        self.probes_left -= 1;
        let found = probe_gro_writes(queue);
        self.probe_result = found;
        if found.tcp.is_none() || found.udp.is_none() {
            return;
        }
        self.probes_left = 0;
        let (tcp, udp) = (self.gro_tcp && found.tcp == Some(true), self.gro_udp && found.udp == Some(true));
        if (tcp, udp) != (self.gro_tcp, self.gro_udp) {
            tracing::warn!(
                "{}: kernel refuses coalesced writes (tcp {:?}, udp {:?}); that GRO is off",
                queue.name(),
                found.tcp,
                found.udp
            );
            self.gro_tcp = tcp;
            self.gro_udp = udp;
            self.rebuild_gro();
        }
    }

    pub fn stats(&self) -> BatchStats {
        self.stats
    }

    /// Which GRO kinds are on (a kind the kernel refused at run time is turned off).
    pub fn gro_kinds(&self) -> (bool, bool) {
        (self.gro_tcp, self.gro_udp)
    }

    /// Coalesces `bufs[..n]` and writes the result. On a queue with a virtio header every packet needs
    /// `offset >= vnet_hdr_len` bytes of headroom, where the header is written.
    pub fn send<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        queue: &Queue,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        checksums_valid: bool,
    ) -> Result<Sent> {
        if offset < self.vnet_hdr_len {
            return Err(Error::InvalidConfig(format!(
                "offset {offset} leaves no room for the {}-byte virtio header",
                self.vnet_hdr_len
            )));
        }
        if self.probes_left > 0 {
            self.probe_once(queue);
        }
        let n = bufs.len().min(lens.len());
        let mut sent = Sent::default();
        let dropped_before = self.stats.dropped;
        match self.gro.as_mut() {
            Some(gro) => {
                let stats = gro.coalesce(&mut bufs[..n], &mut lens[..n], offset, checksums_valid, &mut self.to_write);
                self.stats.coalesced += stats.coalesced as u64;
            }
            None => {
                self.to_write.clear();
                self.to_write.extend(0..n);
                if self.vnet_hdr_len > 0 {
                    for buf in bufs[..n].iter_mut() {
                        buf.as_mut()[offset - self.vnet_hdr_len..offset].fill(0);
                    }
                }
            }
        }
        let start = offset - self.vnet_hdr_len;
        let to_write = std::mem::take(&mut self.to_write);
        let gro = self.gro.take();
        let kinds = (self.gro_tcp, self.gro_udp);
        let mut result = Ok(());
        for &i in &to_write {
            let written = match &gro {
                Some(gro) => self.write_gathered(queue, gro, bufs, lens, i, offset),
                None => self.write_one(queue, &bufs[i].as_ref()[start..offset + lens[i]]),
            };
            if let Err(e) = written {
                result = Err(e);
                break;
            }
            sent.writes += 1;
        }
        // A GRO kind turned off during the writes rebuilt `self.gro` (or removed it); otherwise put it back.
        if (self.gro_tcp, self.gro_udp) == kinds {
            self.gro = gro;
        }
        self.to_write = to_write;
        result?;
        sent.packets = n;
        self.stats.writes += sent.writes as u64;
        sent.dropped = (self.stats.dropped - dropped_before) as usize;
        Ok(sent)
    }

    /// Writes packet `head` as the coalescer assembled it: one `writev` of the virtio header and head packet plus
    /// each merged member's payload, so payloads are never copied in user space.
    fn write_gathered<B: AsRef<[u8]>>(
        &mut self,
        queue: &Queue,
        gro: &Gro,
        bufs: &[B],
        lens: &[usize],
        head: usize,
        offset: usize,
    ) -> Result<()> {
        let mut iov = [IoSlice::new(&[]); MAX_PIECES];
        let mut count = 0;
        let mut total = 0;
        for (b, range) in gro.pieces(head, lens, offset) {
            let piece = &bufs[b].as_ref()[range];
            total += piece.len();
            if count < MAX_PIECES {
                iov[count] = IoSlice::new(piece);
            }
            count += 1;
        }
        if count == 1 {
            let frame: &[u8] = &iov[0];
            return self.write_one(queue, frame);
        }
        if count > MAX_PIECES {
            // More pieces than the array holds (a caller batch larger than any coalesced packet should be):
            // joined once into a scratch buffer.
            let mut joined = std::mem::take(&mut self.joined);
            joined.clear();
            for (b, range) in gro.pieces(head, lens, offset) {
                joined.extend_from_slice(&bufs[b].as_ref()[range]);
            }
            let result = self.write_one(queue, &joined);
            self.joined = joined;
            return result;
        }
        match sys::writev(queue.as_fd(), &iov[..count]) {
            Ok(_) => {
                queue.count_tx(1, (total - self.vnet_hdr_len) as u64);
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                self.drop_one(queue, "device down", e);
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // Re-splitting a refused coalesced packet works on one contiguous frame.
                let mut joined = std::mem::take(&mut self.joined);
                joined.clear();
                for piece in &iov[..count] {
                    joined.extend_from_slice(piece);
                }
                let result = self.write_failed(queue, &joined, e);
                self.joined = joined;
                result
            }
            Err(e) => Err(queue_io_error(queue.name(), "write", e)),
        }
    }

    /// Writes one frame (virtio header + packet). A coalesced frame the kernel refuses with EINVAL turns that
    /// GRO kind off (logged once) and is re-split and written segment by segment, so no data is lost.
    fn write_one(&mut self, queue: &Queue, frame: &[u8]) -> Result<()> {
        match sys::write(queue.as_fd(), frame) {
            Ok(_) => {
                queue.count_tx(1, (frame.len() - self.vnet_hdr_len) as u64);
                Ok(())
            }
            Err(e) => self.write_failed(queue, frame, e),
        }
    }

    /// What a refused write of `frame` becomes: EINVAL on a coalesced frame turns that GRO kind off and re-splits
    /// it, EINVAL on a plain one and EIO (device down) are counted drops; anything else is the caller's error.
    fn write_failed(&mut self, queue: &Queue, frame: &[u8], e: io::Error) -> Result<()> {
        match e {
            e if e.raw_os_error() == Some(libc::EINVAL) && self.vnet_hdr_len > 0 => {
                let hdr = VirtioNetHdrRepr::parse(&frame[..self.vnet_hdr_len]).unwrap_or_default();
                let kind = hdr.gso_kind();
                if kind == gso::NONE {
                    self.drop_one(queue, "kernel refused the packet (EINVAL)", e);
                    return Ok(());
                }
                self.stats.gro_fallbacks += 1;
                if kind == gso::UDP_L4 && self.gro_udp {
                    tracing::warn!("{}: kernel refused a coalesced UDP write; UDP GRO off", queue.name());
                    self.gro_udp = false;
                } else if kind != gso::UDP_L4 && self.gro_tcp {
                    tracing::warn!("{}: kernel refused a coalesced TCP write; TCP GRO off", queue.name());
                    self.gro_tcp = false;
                }
                self.rebuild_gro();
                self.write_resplit(queue, &hdr, &frame[self.vnet_hdr_len..])
            }
            e if e.raw_os_error() == Some(libc::EIO) => {
                self.drop_one(queue, "device down", e);
                Ok(())
            }
            e => Err(queue_io_error(queue.name(), "write", e)),
        }
    }

    fn drop_one(&mut self, queue: &Queue, why: &str, e: io::Error) {
        tracing::debug!("{}: dropped a packet ({why}): {e}", queue.name());
        self.stats.dropped += 1;
        queue.count_tx_drop(1);
    }

    fn rebuild_gro(&mut self) {
        self.gro = (self.gro_tcp || self.gro_udp).then(|| {
            Gro::new(GroConfig {
                tcp: self.gro_tcp,
                udp: self.gro_udp,
                framing: self.framing,
                vnet_hdr_len: self.vnet_hdr_len,
            })
            .with_gather(true)
        });
    }

    fn write_resplit(&mut self, queue: &Queue, hdr: &VirtioNetHdrRepr, packet: &[u8]) -> Result<()> {
        let splitter = match Splitter::new(hdr, packet, self.framing) {
            Ok(s) => s,
            Err(e) => {
                self.drop_one(queue, "re-split failed", io::Error::other(e.to_string()));
                return Ok(());
            }
        };
        self.scratch.resize(self.vnet_hdr_len + MAX_PACKET, 0);
        for index in 0..splitter.segment_count() {
            self.scratch[..self.vnet_hdr_len].fill(0);
            let len = match splitter.write_segment(index, &mut self.scratch[self.vnet_hdr_len..]) {
                Ok(len) => len,
                Err(e) => {
                    self.drop_one(queue, "re-split failed", io::Error::other(e.to_string()));
                    continue;
                }
            };
            let frame_len = self.vnet_hdr_len + len;
            match sys::write(queue.as_fd(), &self.scratch[..frame_len]) {
                Ok(_) => queue.count_tx(1, len as u64),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EIO)) => {
                    self.drop_one(queue, "segment refused", e)
                }
                Err(e) => return Err(queue_io_error(queue.name(), "write", e)),
            }
        }
        Ok(())
    }
}
