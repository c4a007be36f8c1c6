//! The send half: coalesce a batch (GRO), then one gathered write per packet the coalescer produced.
//!
//! A write the kernel does not take goes to [`crate::write_policy`], which decides for every path alike: wait
//! for room, retry, re-split a refused coalesced packet (and turn that GRO kind off), or count a drop.

use std::io::{self, IoSlice};
use std::os::fd::AsFd;

use turbotun_wire::gro::{Gro, GroConfig};
use turbotun_wire::gso::Splitter;
use turbotun_wire::virtio_net::{flags, gso, VirtioNetHdrRepr};
use turbotun_wire::{checksum, ethernet, ipv4, tcp, udp, Checksums, Framing, VIRTIO_NET_HDR_LEN};

use super::{framing, BATCH_SIZE};
use crate::error::{Error, Result};
use crate::kind::{Mode, Offloads};
use crate::queue::{Queue, MAX_PACKET};
use crate::stats::{Counters, DropReason, WhenFull};
use crate::stop::StopHandle;
use crate::sys;
use crate::write_policy::{lost_with, Unit, Writer, Written};

/// Pieces one gathered write can carry: a coalesced packet of at most 128 segments (UDP_MAX_SEGMENTS on newer
/// kernels) plus its header.
const MAX_PIECES: usize = 129;

/// What one [`SendBatch::send`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Packets the caller handed in that reached the kernel (merged ones included).
    pub packets: usize,
    /// Writes issued.
    pub writes: usize,
    /// Packets not written (device down, refused, stopped while waiting for room); counted by reason in
    /// [`SendBatch::stats`] and in the queue's `tx_dropped`.
    pub dropped: usize,
}

/// Whether the kernel accepts coalesced writes of each kind (`None`: could not tell, e.g. the device was down).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroWriteSupport {
    /// Coalesced TCP (`GSO_TCPV4`).
    pub tcp: Option<bool>,
    /// Coalesced UDP (`GSO_UDP_L4`).
    pub udp: Option<bool>,
}

/// The answer of the process's GRO write probe, once it has run.
static GRO_WRITE_PROBE: std::sync::OnceLock<GroWriteSupport> = std::sync::OnceLock::new();

/// What [`gro_write_support`] found, if it has run in this process yet (it never runs as a side effect of this
/// call): a program can check that the probe is behind it before traffic starts.
pub fn gro_write_support_if_probed() -> Option<GroWriteSupport> {
    GRO_WRITE_PROBE.get().copied()
}

/// Whether this kernel accepts coalesced writes of each kind, probed once per process with
/// [`probe_gro_writes`] on a scratch TUN device inside a private network namespace, where no bridge, capture or
/// route can see the probe and from which the kernel removes the device when the probe ends. Without the
/// privileges for a namespace the answer is "could not tell" (`None`), and [`SendBatch`] relies on its run-time
/// fallback alone: a refused coalesced write turns that GRO kind off and is re-split, never lost.
pub fn gro_write_support() -> GroWriteSupport {
    *GRO_WRITE_PROBE.get_or_init(|| {
        let probed = crate::netns::with_private_netns(|| -> Result<GroWriteSupport> {
            let dev = crate::DeviceBuilder::tun().vnet_hdr(VIRTIO_NET_HDR_LEN).offloads(Offloads::ALL).open()?;
            crate::netlink::Netlink::new()?.set_up(dev.name(), true)?;
            Ok(probe_gro_writes(&dev.queues()[0]))
        });
        match probed {
            Ok(Ok(found)) => found,
            Ok(Err(e)) | Err(e) => {
                tracing::debug!("GRO write probe not run ({e}); relying on the EINVAL fallback");
                GroWriteSupport::default()
            }
        }
    })
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

/// The probe frame: virtio header, (Ethernet,) IPv4, TCP or UDP, 150 bytes of payload in segments of 100, the
/// L4 checksum left partial for the kernel as `NEEDS_CSUM` asks.
fn probe_frame(mode: Mode, vnet_hdr_len: usize, udp: bool) -> Vec<u8> {
    const PAYLOAD: usize = 150;
    const GSO_SIZE: u16 = 100;
    const LOCALHOST: [u8; 4] = [127, 0, 0, 1];
    let l2 = if mode == Mode::Tap { ethernet::HEADER_LEN } else { 0 };
    let l4_len = if udp { udp::HEADER_LEN } else { tcp::MIN_HEADER_LEN };
    let ip_len = ipv4::MIN_HEADER_LEN;
    let mut f = vec![0u8; vnet_hdr_len + l2 + ip_len + l4_len + PAYLOAD];
    let csum_offset = if udp { udp::CHECKSUM_OFFSET } else { tcp::CHECKSUM_OFFSET };
    VirtioNetHdrRepr {
        flags: flags::NEEDS_CSUM,
        gso_type: if udp { gso::UDP_L4 } else { gso::TCPV4 },
        hdr_len: (l2 + ip_len + l4_len) as u16,
        gso_size: GSO_SIZE,
        csum_start: (l2 + ip_len) as u16,
        csum_offset: csum_offset as u16,
    }
    .emit(&mut f[..vnet_hdr_len]);
    let frame = &mut f[vnet_hdr_len..];
    // The emitters below cannot fail: the buffer was sized for exactly these headers.
    if l2 > 0 {
        let eth = ethernet::Repr {
            dst: [0x02, 0, 0, 0, 0, 0x01],
            src: [0x02, 0, 0, 0, 0, 0x02],
            ethertype: ethernet::ETHERTYPE_IPV4,
            ..ethernet::Repr::default()
        };
        let _ = eth.emit(frame);
    }
    let protocol = if udp { turbotun_wire::IPPROTO_UDP } else { turbotun_wire::IPPROTO_TCP };
    let l4_total = (l4_len + PAYLOAD) as u16;
    let ip = ipv4::Repr {
        src: LOCALHOST,
        dst: LOCALHOST,
        protocol,
        payload_len: l4_total,
        ttl: 64,
        dont_frag: true,
        ..ipv4::Repr::default()
    };
    let _ = ip.emit(&mut frame[l2..]);
    let l4 = &mut frame[l2 + ip_len..];
    if udp {
        let _ = udp::Repr { src_port: 9, dst_port: 9, payload_len: PAYLOAD as u16 }.emit(l4);
    } else {
        let seg = tcp::Repr {
            src_port: 9,
            dst_port: 9,
            flags: tcp::flags::ACK | tcp::flags::PSH,
            window: 1024,
            ..Default::default()
        };
        let _ = seg.emit(l4);
    }
    let partial = checksum::fold(checksum::pseudo_header_v4(LOCALHOST, LOCALHOST, protocol, l4_total.into()));
    l4[csum_offset..csum_offset + 2].copy_from_slice(&partial.to_be_bytes());
    f
}

/// How many of the caller's packets the write unit headed by `head` carries.
fn unit_packets(gro: Option<&Gro>, head: usize, lens: &[usize], offset: usize) -> u64 {
    gro.map_or(1, |gro| gro.pieces(head, lens, offset).count() as u64)
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
    stats: Counters,
    /// Whether the process-wide GRO write probe was consulted yet (at the first send, not at construction, so
    /// that building one stays cheap; a program that cannot afford the probe's tens of milliseconds on its
    /// first send calls [`gro_write_support`] before traffic starts, as the engine and the echo do).
    probed: bool,
    writer: Writer,
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
            stats: Counters::default(),
            probed: !gro_on,
            writer: Writer { vnet_hdr_len, ..Writer::default() },
        }
    }

    /// What to do when the queue is full (default: wait for room).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.writer.when_full = when_full;
        self
    }

    /// A write waiting for room gives up (the packet counted as [`DropReason::Stopped`]) once `stop` fires.
    pub fn stop_on(mut self, stop: StopHandle) -> Self {
        self.writer.stop = Some(stop);
        self
    }

    /// What the process-wide write probe found (see [`gro_write_support`]).
    pub fn gro_write_support(&self) -> GroWriteSupport {
        gro_write_support()
    }

    /// What this send half wrote (packets, bytes, writes, coalesced, GRO fallbacks, drops by reason).
    pub fn stats(&self) -> Counters {
        self.stats
    }

    /// Which GRO kinds are on (a kind the kernel refused at run time is turned off).
    pub fn gro_kinds(&self) -> (bool, bool) {
        (self.gro_tcp, self.gro_udp)
    }

    /// Coalesces `bufs[..n]` and writes the result. On a queue with a virtio header every packet needs
    /// `offset >= vnet_hdr_len` bytes of headroom, where the header is written.
    ///
    /// `checksums`: what [`crate::batch::Received::checksums`] said of these packets (`true` and `false` stand for
    /// [`Checksums::Valid`] and [`Checksums::Unverified`]). With [`Checksums::Partial`] the kernel completes the
    /// partial checksums (`NEEDS_CSUM`); a queue without a virtio header cannot ask it to, so they are completed
    /// here before the write.
    pub fn send<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        queue: &Queue,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        checksums: impl Into<Checksums>,
    ) -> Result<Sent> {
        let checksums = checksums.into();
        if offset < self.vnet_hdr_len {
            return Err(Error::InvalidConfig(format!(
                "offset {offset} leaves no room for the {}-byte virtio header",
                self.vnet_hdr_len
            )));
        }
        if !self.probed {
            self.apply_probe(queue);
        }
        let n = bufs.len().min(lens.len());
        let before = self.stats;
        self.coalesce(&mut bufs[..n], &mut lens[..n], offset, checksums);
        let to_write = std::mem::take(&mut self.to_write);
        let gro = self.gro.take();
        let kinds = (self.gro_tcp, self.gro_udp);
        let mut result = Ok(());
        for (k, &i) in to_write.iter().enumerate() {
            if let Err(e) = self.write_unit(queue, gro.as_ref(), bufs, lens, i, offset) {
                // The queue failed (its unit's packets are counted already): the rest of the batch is lost with it,
                // and counted, so that every packet handed in is written or dropped with a reason.
                let rest: u64 = to_write[k + 1..].iter().map(|&h| unit_packets(gro.as_ref(), h, lens, offset)).sum();
                self.drop_packets(queue, lost_with(&e), rest, &io::Error::other(e.to_string()));
                result = Err(e);
                break;
            }
        }
        // A GRO kind turned off during the writes rebuilt `self.gro` (or removed it); otherwise put it back.
        if (self.gro_tcp, self.gro_udp) == kinds {
            self.gro = gro;
        }
        self.to_write = to_write;
        result?;
        let delta = self.stats.since(&before);
        Ok(Sent {
            packets: delta.packets as usize,
            writes: delta.writes as usize,
            dropped: delta.drops.total() as usize,
        })
    }

    /// Decides the write units: the coalescer's heads, or every packet (with a zeroed virtio header, or one
    /// asking the kernel to complete a partial checksum) without it.
    fn coalesce<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        checksums: Checksums,
    ) {
        match self.gro.as_mut() {
            Some(gro) => {
                let stats = gro.coalesce(bufs, lens, offset, checksums, &mut self.to_write);
                self.stats.coalesced += stats.coalesced as u64;
            }
            None => {
                self.to_write.clear();
                self.to_write.extend(0..bufs.len());
                let (vlen, partial) = (self.vnet_hdr_len, checksums == Checksums::Partial);
                for (buf, &len) in bufs.iter_mut().zip(lens.iter()) {
                    let Some(frame) = buf.as_mut().get_mut(offset - vlen..offset + len) else {
                        continue; // Too short for its length: the write reports it.
                    };
                    let (vh, packet) = frame.split_at_mut(vlen);
                    if partial && vlen == 0 {
                        // No header to ask the kernel with: completed here.
                        turbotun_wire::partial::complete(packet, self.framing);
                    } else {
                        turbotun_wire::partial::write_plain_header(vh, packet, self.framing, partial);
                    }
                }
            }
        }
    }

    /// Writes packet `head` as the coalescer assembled it: one `writev` of the virtio header and head packet plus
    /// each merged member's payload, so payloads are never copied in user space.
    fn write_unit<B: AsRef<[u8]>>(
        &mut self,
        queue: &Queue,
        gro: Option<&Gro>,
        bufs: &[B],
        lens: &[usize],
        head: usize,
        offset: usize,
    ) -> Result<()> {
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
            let result = self.write_frame(queue, &[IoSlice::new(&joined)], unit);
            self.joined = joined;
            return result;
        }
        self.write_frame(queue, &iov[..count], unit)
    }

    /// Writes one frame under the write policy; a coalesced packet the kernel refuses is split again.
    fn write_frame(&mut self, queue: &Queue, iov: &[IoSlice<'_>], unit: Unit) -> Result<()> {
        match self.writer.write(queue, iov, unit, true, &mut self.stats)? {
            Written::Yes | Written::Dropped => Ok(()),
            Written::Refused(hdr) => {
                // Re-splitting works on one contiguous frame.
                let mut joined = std::mem::take(&mut self.joined);
                joined.clear();
                iov.iter().for_each(|piece| joined.extend_from_slice(piece));
                let result = self.resplit(queue, &hdr, &joined[self.vnet_hdr_len..], unit);
                self.joined = joined;
                result
            }
        }
    }

    /// The kernel refused a coalesced packet: that GRO kind goes off (logged once) and the packet is split again
    /// and written segment by segment, each through the same write policy, so no data is lost.
    fn resplit(&mut self, queue: &Queue, hdr: &VirtioNetHdrRepr, packet: &[u8], unit: Unit) -> Result<()> {
        self.stats.gro_fallbacks += 1;
        let kind = hdr.gso_kind();
        if kind == gso::UDP_L4 && self.gro_udp {
            tracing::warn!("{}: kernel refused a coalesced UDP write; UDP GRO off", queue.name());
            self.gro_udp = false;
        } else if kind != gso::UDP_L4 && self.gro_tcp {
            tracing::warn!("{}: kernel refused a coalesced TCP write; TCP GRO off", queue.name());
            self.gro_tcp = false;
        }
        self.rebuild_gro();
        let splitter = match Splitter::new(hdr, packet, self.framing) {
            Ok(s) => s,
            Err(e) => {
                self.drop_packets(queue, DropReason::Malformed, unit.packets, &io::Error::other(e.to_string()));
                return Ok(());
            }
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(self.vnet_hdr_len + MAX_PACKET, 0);
        let mut result = Ok(());
        let count = splitter.segment_count();
        for index in 0..count {
            scratch[..self.vnet_hdr_len].fill(0);
            match splitter.write_segment(index, &mut scratch[self.vnet_hdr_len..]) {
                Ok(len) => {
                    let frame = [IoSlice::new(&scratch[..self.vnet_hdr_len + len])];
                    result = self.write_frame(queue, &frame, Unit { packets: 1, bytes: len as u64 });
                    if let Err(e) = &result {
                        // The queue failed: the segments after this one are lost with it.
                        let rest = (count - index - 1) as u64;
                        self.drop_packets(queue, lost_with(e), rest, &io::Error::other(e.to_string()));
                        break;
                    }
                }
                Err(e) => self.drop_packets(queue, DropReason::Malformed, 1, &io::Error::other(e.to_string())),
            }
        }
        self.scratch = scratch;
        result
    }

    fn drop_packets(&mut self, queue: &Queue, reason: DropReason, packets: u64, e: &io::Error) {
        if packets > 0 {
            self.writer.drop(queue, reason, packets, e, &mut self.stats);
        }
    }

    /// Turns off the GRO kinds the process-wide probe found refused.
    fn apply_probe(&mut self, queue: &Queue) {
        self.probed = true;
        let found = gro_write_support();
        let (tcp, udp) = (self.gro_tcp && found.tcp != Some(false), self.gro_udp && found.udp != Some(false));
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
}

#[cfg(test)]
mod tests {
    use super::super::testing::{fake_queue, tcp4_super_packet};
    use super::*;

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
        assert!(tx.send(&queue, &mut bufs, &mut lens, VIRTIO_NET_HDR_LEN, true).is_err());
        let stats = tx.stats();
        assert_eq!(stats.packets + stats.drops.total(), 3, "{stats:?}");
        assert_eq!(stats.drops.stopped, 3, "{stats:?}");
        assert_eq!(queue.stats().tx_dropped, 3);
    }
}
