//! The send half: coalesce a batch (GRO), then one gathered write per packet the coalescer produced.
//!
//! A write the kernel does not take goes to [`crate::write_policy`], which decides for every path alike: wait
//! for room, retry, re-split a refused coalesced packet (and turn that GRO kind off), or count a drop.

use std::borrow::Borrow;
use std::io::{self, IoSlice};

use turbotun_wire::gro::Gro;
use turbotun_wire::virtio_net::VirtioNetHdrRepr;
use turbotun_wire::{Batch, Checksums, Framing};

use super::{prepare_units, GroKinds, BATCH_SIZE};
use crate::dataplane::stats::{Counters, DropReason, WhenFull};
use crate::dataplane::write_policy::{lost_with, Unit, Writer, Written};
use crate::devices::offloads::Offloads;
use crate::devices::queue::Queue;
use crate::error::{ConfigError, Error, Result};
use crate::stop::StopHandle;

/// Pieces one gathered write can carry: a coalesced packet of at most 128 segments (UDP_MAX_SEGMENTS on newer
/// kernels) plus its header.
const MAX_PIECES: usize = 129;

/// What one [`SendBatch::send_many`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sent {
    /// Packets the caller handed in that reached the kernel (merged ones included).
    pub packets: usize,
    /// Writes issued.
    pub writes: usize,
    /// Packets not written (device down, refused, stopped while waiting for room); counted by reason in
    /// [`SendBatch::stats`] and in the queue's `tx_dropped`.
    pub dropped: usize,
}

/// How many of the caller's packets the write unit headed by `head` carries.
fn unit_packets(gro: Option<&Gro>, head: usize, lens: &[usize], offset: usize) -> u64 {
    gro.map_or(1, |gro| gro.pieces(head, lens, offset).count() as u64)
}

/// Where the writes of a prepared batch stand ([`SendHalf::write_units`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Every unit was written or counted.
    Done,
    /// The queue is full and the half was told not to wait: writing goes on from this unit once it has room.
    Full(usize),
}

/// The send half's state, apart from its queue (which the public [`SendBatch`] holds and passes in), so that the
/// I/O paths that own their queues differently (tokio) share it.
pub(crate) struct SendHalf {
    /// The coalescer the next batch uses.
    gro: Option<Gro>,
    /// The coalescer that made the batch being written: its chains say what each unit carries. Kept apart from
    /// `gro` because a refused write in the middle of the batch rebuilds `gro` without the refused kind.
    batch_gro: Option<Gro>,
    /// Whether `gro` was rebuilt while the batch was written (it is then not the batch's to put back).
    gro_rebuilt: bool,
    framing: Framing,
    vnet_hdr_len: usize,
    kinds: GroKinds,
    to_write: Vec<usize>,
    /// A coalesced packet joined from its pieces, for the rare paths that need one contiguous frame.
    joined: Vec<u8>,
    stats: Counters,
    writer: Writer,
}

impl std::fmt::Debug for SendHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendHalf").field("gro", &self.kinds).field("stats", &self.stats).finish()
    }
}

impl SendHalf {
    pub(crate) fn new(queue: &Queue) -> Self {
        let vnet = queue.vnet_hdr_len() > 0 && queue.offloads().contains(Offloads::CSUM);
        Self::with_gro(queue, vnet, vnet && queue.offloads().contains(Offloads::USO4 | Offloads::USO6))
    }

    /// Coalescing of the given kinds, less any kind the kernel was found to refuse ([`crate::Capabilities::get`], if it
    /// ran; otherwise the first refused write turns the kind off).
    pub(crate) fn with_gro(queue: &Queue, tcp: bool, udp: bool) -> Self {
        let vnet_hdr_len = queue.vnet_hdr_len();
        let framing = queue.mode().framing();
        let kinds = GroKinds::new(framing, vnet_hdr_len, tcp, udp);
        SendHalf {
            gro: kinds.coalescer(),
            batch_gro: None,
            gro_rebuilt: false,
            framing,
            vnet_hdr_len,
            kinds,
            to_write: Vec::with_capacity(BATCH_SIZE),
            joined: Vec::new(),
            stats: Counters::default(),
            writer: Writer { vnet_hdr_len, ..Writer::default() },
        }
    }

    pub(crate) fn when_full(mut self, when_full: WhenFull) -> Self {
        self.writer.when_full = when_full;
        self
    }

    pub(crate) fn stop_on(mut self, stop: StopHandle) -> Self {
        self.writer.stop = Some(stop);
        self
    }

    pub(crate) fn stats(&self) -> Counters {
        self.stats
    }

    pub(crate) fn gro_kinds(&self) -> (bool, bool) {
        (self.kinds.tcp, self.kinds.udp)
    }

    /// [`SendBatch::send_many`]: prepare, then write every unit (waiting for room as the policy says).
    pub(crate) fn send_many<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        queue: &Queue,
        batch: &mut Batch<'_, B>,
        checksums: impl Into<Checksums>,
    ) -> Result<Sent> {
        let before = self.stats;
        let n = self.prepare(batch, checksums.into())?;
        self.write_units(queue, &batch.range(0..n), 0, true)?;
        Ok(self.sent_since(&before))
    }

    /// What changed since `before`, as a [`Sent`].
    pub(crate) fn sent_since(&self, before: &Counters) -> Sent {
        let delta = self.stats.since(before);
        Sent { packets: delta.packets as usize, writes: delta.writes as usize, dropped: delta.drops.total() as usize }
    }

    /// Coalesces the batch's `n` packets (see [`Batch::capacity`]) into write units (`to_write`), ready for
    /// [`Self::write_units`]; returns `n`.
    pub(crate) fn prepare<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        batch: &mut Batch<'_, B>,
        checksums: Checksums,
    ) -> Result<usize> {
        let offset = batch.offset;
        if offset < self.vnet_hdr_len {
            return Err(Error::Config(ConfigError::Size {
                why: format!("offset {offset} leaves no room for the {}-byte virtio header", self.vnet_hdr_len),
            }));
        }
        let n = batch.capacity();
        self.coalesce(&mut batch.range(0..n), checksums);
        self.batch_gro = self.gro.take();
        self.gro_rebuilt = false;
        Ok(n)
    }

    /// Writes the prepared units from `first` on. With `wait`, a full queue is waited on (or dropped from, as the
    /// policy says) and the result is [`Progress::Done`]; without, a full queue stops the writes and says where to
    /// go on. If the queue fails, the failing unit and every unit after it are counted as dropped before the
    /// error is returned, so that every packet handed in is written or counted.
    pub(crate) fn write_units<B: AsRef<[u8]>>(
        &mut self,
        queue: &Queue,
        batch: &Batch<'_, B>,
        first: usize,
        wait: bool,
    ) -> Result<Progress> {
        let to_write = std::mem::take(&mut self.to_write);
        let gro = self.batch_gro.take();
        let mut result = Ok(Progress::Done);
        for (k, &i) in to_write.iter().enumerate().skip(first) {
            match self.write_unit(queue, gro.as_ref(), batch, i, wait) {
                Ok(true) => {}
                Ok(false) => {
                    result = Ok(Progress::Full(k));
                    break;
                }
                Err(e) => {
                    let rest: u64 = to_write[k + 1..]
                        .iter()
                        .map(|&h| unit_packets(gro.as_ref(), h, batch.lens, batch.offset))
                        .sum();
                    self.drop_packets(queue, lost_with(&e), rest, &io::Error::other(e.to_string()));
                    result = Err(e);
                    break;
                }
            }
        }
        self.to_write = to_write;
        if matches!(result, Ok(Progress::Full(_))) {
            // Still being written: the batch keeps its coalescer.
            self.batch_gro = gro;
        } else if !self.gro_rebuilt {
            self.gro = gro;
        }
        result
    }

    /// After [`Progress::Full`] the caller gave up on the batch (a dropped future): the units from `first` on are
    /// counted as stopped, and the coalescer is ready for the next batch.
    #[cfg(feature = "tokio")]
    pub(crate) fn abandon_units(&mut self, queue: &Queue, lens: &[usize], offset: usize, first: usize) {
        let gro = self.batch_gro.take();
        let rest: u64 = self.to_write.iter().skip(first).map(|&h| unit_packets(gro.as_ref(), h, lens, offset)).sum();
        self.drop_packets(queue, DropReason::Stopped, rest, &io::Error::other("the send was cancelled"));
        if !self.gro_rebuilt {
            self.gro = gro;
        }
    }

    /// Decides the write units: the coalescer's heads, or every packet (with a zeroed virtio header, or one
    /// asking the kernel to complete a partial checksum) without it.
    fn coalesce<B: AsMut<[u8]> + AsRef<[u8]>>(&mut self, batch: &mut Batch<'_, B>, checksums: Checksums) {
        let gro = self.gro.as_mut();
        let coalesced = prepare_units(gro, batch, self.vnet_hdr_len, self.framing, checksums, &mut self.to_write);
        self.stats.coalesced += coalesced as u64;
    }

    /// Writes packet `head` as the coalescer assembled it: one `writev` of the virtio header and head packet plus
    /// each merged member's payload, so payloads are never copied in user space. False if the queue was full and
    /// `wait` was off (nothing written).
    fn write_unit<B: AsRef<[u8]>>(
        &mut self,
        queue: &Queue,
        gro: Option<&Gro>,
        batch: &Batch<'_, B>,
        head: usize,
        wait: bool,
    ) -> Result<bool> {
        let (bufs, lens, offset) = (&*batch.bufs, &*batch.lens, batch.offset);
        let start = offset - self.vnet_hdr_len;
        let mut iov = [IoSlice::new(&[]); MAX_PIECES];
        let mut count = 0;
        let mut unit = Unit { packets: 0, bytes: 0 };
        match gro {
            Some(gro) => {
                for (b, range) in gro.pieces(head, lens, offset) {
                    if count < MAX_PIECES {
                        iov[count] = IoSlice::new(&bufs[b].as_ref()[range]);
                    }
                    count += 1;
                    unit.packets += 1;
                    unit.bytes += lens[b] as u64;
                }
            }
            None => {
                iov[0] = IoSlice::new(&bufs[head].as_ref()[start..offset + lens[head]]);
                count = 1;
                unit = Unit { packets: 1, bytes: lens[head] as u64 };
            }
        }
        if count > MAX_PIECES {
            // More pieces than the array holds (a caller batch larger than any coalesced packet should be):
            // joined once into a scratch buffer.
            let mut joined = std::mem::take(&mut self.joined);
            joined.clear();
            for (b, range) in gro.into_iter().flat_map(|gro| gro.pieces(head, lens, offset)) {
                joined.extend_from_slice(&bufs[b].as_ref()[range]);
            }
            let result = self.write_frame(queue, &[IoSlice::new(&joined)], unit, wait);
            self.joined = joined;
            return result;
        }
        self.write_frame(queue, &iov[..count], unit, wait)
    }

    /// Writes one frame under the write policy; a coalesced packet the kernel refuses is split again. False if
    /// the queue was full and `wait` was off.
    fn write_frame(&mut self, queue: &Queue, iov: &[IoSlice<'_>], unit: Unit, wait: bool) -> Result<bool> {
        match self.writer.write(queue, iov, unit, true, wait, &mut self.stats)? {
            Written::Yes | Written::Dropped => Ok(true),
            Written::Full => Ok(false),
            Written::Refused(hdr) => {
                // Re-splitting works on one contiguous frame.
                let mut joined = std::mem::take(&mut self.joined);
                joined.clear();
                iov.iter().for_each(|piece| joined.extend_from_slice(piece));
                let result = self.resplit(queue, &hdr, &joined[self.vnet_hdr_len..], unit);
                self.joined = joined;
                result.map(|()| true)
            }
        }
    }

    /// The kernel refused a coalesced packet: that GRO kind goes off and the packet is split again and written
    /// segment by segment, each through the same write policy, so no data is lost (the rule every path shares:
    /// [`GroKinds::refuse`], [`crate::write_policy::write_split`]).
    fn resplit(&mut self, queue: &Queue, hdr: &VirtioNetHdrRepr, packet: &[u8], unit: Unit) -> Result<()> {
        self.stats.gro_fallbacks += 1;
        self.kinds.refuse(hdr, queue.name());
        self.gro_rebuilt = true;
        self.gro = self.kinds.coalescer();
        crate::dataplane::write_policy::write_split(
            &self.writer,
            queue,
            self.framing,
            hdr,
            packet,
            unit.packets,
            &mut self.stats,
        )
    }

    fn drop_packets(&mut self, queue: &Queue, reason: DropReason, packets: u64, e: &io::Error) {
        if packets > 0 {
            self.writer.drop(queue, reason, packets, e, &mut self.stats);
        }
    }
}

/// The send half of the batch API, bound to its queue: coalesces a batch (GRO) and writes it, one gathered
/// write per coalesced packet.
///
/// `Q` is how the half holds its queue: `&Queue`, `Arc<Queue>` or the `Queue` itself. Coalescing needs no room
/// in the caller's buffers (merged packets are written as gathered pieces): each buffer needs `offset` bytes in
/// front of its packet (at least the queue's virtio header size), where the header is written, and no more.
/// Building one is cheap and probes nothing: a GRO kind [`crate::Capabilities::get`] found refused (if it ran) is off
/// from the start, and otherwise the first coalesced write the kernel refuses turns that kind off and is split
/// again, never lost.
#[derive(Debug)]
pub struct SendBatch<Q: Borrow<Queue>> {
    queue: Q,
    half: SendHalf,
}

impl<Q: Borrow<Queue>> SendBatch<Q> {
    /// Coalesces TCP when the queue has a virtio header with checksum offload, UDP when USO was granted too
    /// (the kernel accepts `GSO_UDP_L4` writes since the same release that added USO).
    pub fn new(queue: Q) -> Self {
        let half = SendHalf::new(queue.borrow());
        SendBatch { queue, half }
    }

    /// Like [`Self::new`] with explicit GRO kinds (both false: plain writes, one per packet).
    pub fn with_gro(queue: Q, tcp: bool, udp: bool) -> Self {
        let half = SendHalf::with_gro(queue.borrow(), tcp, udp);
        SendBatch { queue, half }
    }

    /// The queue it writes to.
    pub fn queue(&self) -> &Queue {
        self.queue.borrow()
    }

    /// What to do when the queue is full (default: wait for room).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.half = self.half.when_full(when_full);
        self
    }

    /// A write waiting for room gives up (the packet counted as [`DropReason::Stopped`]) once `stop` fires.
    pub fn stop_on(mut self, stop: StopHandle) -> Self {
        self.half = self.half.stop_on(stop);
        self
    }

    /// What this send half wrote (packets, bytes, writes, coalesced, GRO fallbacks, drops by reason).
    pub fn stats(&self) -> Counters {
        self.half.stats()
    }

    /// Which GRO kinds are on (a kind the kernel refused at run time is turned off).
    pub fn gro_kinds(&self) -> (bool, bool) {
        self.half.gro_kinds()
    }

    /// Coalesces the packets of `batch` and writes the result. On a queue with a virtio header every packet needs
    /// `offset >= vnet_hdr_len` bytes of headroom, where the header is written.
    ///
    /// `checksums`: what [`crate::batch::Received::checksums`] said of these packets (`true` and `false` stand for
    /// [`Checksums::Valid`] and [`Checksums::Unverified`]). With [`Checksums::Partial`] the kernel completes the
    /// partial checksums (`NEEDS_CSUM`); a queue without a virtio header cannot ask it to, so they are completed
    /// here before the write.
    pub fn send_many<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        batch: &mut Batch<'_, B>,
        checksums: impl Into<Checksums>,
    ) -> Result<Sent> {
        self.half.send_many(self.queue.borrow(), batch, checksums)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{fake_queue, tcp4_super_packet};
    use super::*;
    use turbotun_wire::VIRTIO_NET_HDR_LEN;

    /// A queue that fails fatally in the middle of a batch: the failing packet and every one after it are
    /// counted, so `packets + drops` is the batch. Found by review: they were counted neither way.
    #[test]
    fn test_a_fatal_write_counts_the_rest_of_its_batch() {
        let (queue, peer) = fake_queue();
        // Three packets of three flows (no merging): three writes, the first of which already fails.
        let pkts: Vec<Vec<u8>> = (0..3u32)
            .map(|i| {
                let (_, mut p) = tcp4_super_packet(&[i as u8; 100], 100, 1000 * i);
                p[23] = i as u8; // another destination port per packet
                assert!(turbotun_wire::partial::complete(&mut p, Framing::Ip));
                p
            })
            .collect();
        drop(peer); // writes now fail with ECONNREFUSED: not a per-packet problem
        let mut bufs: Vec<Vec<u8>> = pkts.iter().map(|p| [vec![0u8; VIRTIO_NET_HDR_LEN], p.clone()].concat()).collect();
        let mut lens: Vec<usize> = pkts.iter().map(Vec::len).collect();
        let mut tx = SendBatch::new(&queue);
        assert!(tx.send_many(&mut Batch::new(&mut bufs, &mut lens, VIRTIO_NET_HDR_LEN), true).is_err());
        let stats = tx.stats();
        assert_eq!(stats.packets + stats.drops.total(), 3, "{stats:?}");
        assert_eq!(stats.drops.stopped, 3, "{stats:?}");
        assert_eq!(queue.stats().tx_dropped, 3);
    }
}
