//! Batched receive (GSO split) and send (GRO coalesce) over one [`Queue`](crate::Queue).
//!
//! Buffers belong to the caller: packet `i` lives at `bufs[i][offset .. offset + lens[i]]`, and `offset` leaves
//! room in front for the virtio header (`offset >= queue.vnet_hdr_len()`). What each half needs of the buffers:
//! the receive half, `offset` plus the largest packet the device hands over whole (its MTU plus the link-layer
//! header on TAP); the send half, only `offset` in front of each packet (coalesced packets are written as
//! gathered pieces, never assembled in a buffer).
//!
//! Nothing is lost silently: segments that do not fit into the caller's buffers stay pending for the next call,
//! a frame that cannot be used is counted in [`Counters::drops`](crate::stats::Counters) with its reason, and
//! what happens to a packet the kernel does not take is decided in one place for every path (wait when the
//! queue is full, re-split a refused coalesced packet, count a drop otherwise).
//!
//! - [`RecvBatch`] (receive half): reads split into the caller's buffers, zero-copy when the previous
//!   super-packet's shape holds (`recv_many`, `try_recv_many`).
//! - [`SendBatch`] (send half): coalesce, then one gathered write per coalesced packet (`send_many`).
//!
//! Each half is bound to its queue when it is made, so that a batch cannot be read from one queue and its state
//! used with another.

mod recv;
mod send;

pub use turbotun_wire::Batch;

use crate::dataplane::stats::DropReason;

// The halves without their queue, for the async API, which holds its queue its own way.
#[cfg(feature = "tokio")]
pub(crate) use recv::RecvHalf;
pub use recv::{Received, RecvBatch};
#[cfg(feature = "tokio")]
pub(crate) use send::{Progress, SendHalf};
pub use send::{SendBatch, Sent};

/// How many packets one batch call handles at most: a 64 KiB super-packet of MSS 1448 splits into 46 segments.
pub const BATCH_SIZE: usize = 64;

/// Most segments one super-packet is split into; the rest are counted as
/// [`DropReason::TooManySegments`](crate::stats::DropReason) drops. A 64 KiB TCP super-packet at the smallest MSS
/// Linux sends by default (536 bytes) has 123 segments and a UDP one at most 128 (`UDP_MAX_SEGMENTS`); a
/// `gso_size` of 1 would make 65,000.
pub const MAX_SEGMENTS: usize = 1024;

/// The length after the virtio header of a frame that one read of `n` bytes put into buffers of `capacity` bytes
/// in all (the header included), or why it cannot be used: the tun driver reports a frame's full length even
/// when the buffers were shorter, so a read longer than its buffers is a frame cut short
/// ([`DropReason::TooBig`]), and one shorter than the header holds nothing ([`DropReason::Malformed`]). The one
/// rule every read path applies (blocking, raw and io_uring).
pub(crate) fn frame_len(n: usize, vnet_hdr_len: usize, capacity: usize) -> std::result::Result<usize, DropReason> {
    if n > capacity {
        return Err(DropReason::TooBig);
    }
    n.checked_sub(vnet_hdr_len).ok_or(DropReason::Malformed)
}

/// What the batch halves' and the write policy's unit tests feed through a socket pair that stands in for a tun fd.
#[cfg(test)]
pub(crate) mod testing {
    use std::os::unix::net::UnixDatagram;

    use turbotun_wire::virtio_net::{flags, gso, VirtioNetHdrRepr, VIRTIO_NET_HDR_LEN};
    use turbotun_wire::{ipv4, tcp, IPPROTO_TCP};

    use crate::devices::mode::Mode;

    use crate::devices::offloads::Offloads;
    use crate::devices::queue::Queue;

    /// A queue whose reads return what the other end sends, and whose writes it receives: a TUN queue with a
    /// virtio header and every offload.
    pub(crate) fn fake_queue() -> (Queue, UnixDatagram) {
        let (ours, peer) = UnixDatagram::pair().unwrap();
        (Queue::new(ours.into(), "fake0".into(), 0, Mode::Tun, VIRTIO_NET_HDR_LEN, Offloads::ALL), peer)
    }

    /// A TCP/IPv4 super-packet (10.0.0.1:1 -> 10.0.0.2:2, sequence number `seq`) carrying `payload` in segments of
    /// `gso_size`, its checksum left partial, and the virtio header that describes it.
    pub(crate) fn tcp4_super_packet(payload: &[u8], gso_size: u16, seq: u32) -> (VirtioNetHdrRepr, Vec<u8>) {
        let (ip_len, tcp_len) = (ipv4::MIN_HEADER_LEN, tcp::MIN_HEADER_LEN);
        let mut packet = vec![0u8; ip_len + tcp_len + payload.len()];
        let ip = ipv4::Repr {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            protocol: IPPROTO_TCP,
            payload_len: (tcp_len + payload.len()) as u16,
            ttl: 64,
            dont_frag: true,
            ..ipv4::Repr::default()
        };
        ip.emit(&mut packet).unwrap();
        let seg = tcp::Repr { src_port: 1, dst_port: 2, seq, ack: 1, flags: tcp::flags::ACK, window: 512 };
        seg.emit(&mut packet[ip_len..]).unwrap();
        packet[ip_len + tcp_len..].copy_from_slice(payload);
        let hdr = VirtioNetHdrRepr {
            flags: flags::NEEDS_CSUM,
            gso_type: gso::TCPV4,
            hdr_len: (ip_len + tcp_len) as u16,
            gso_size,
            csum_start: ip_len as u16,
            csum_offset: tcp::CHECKSUM_OFFSET as u16,
        };
        (hdr, packet)
    }
}

/// Which GRO kinds a send path coalesces, and the coalescers it makes with them: the one rule, for every I/O
/// path, for turning a kind off when the kernel refuses a coalesced write of that kind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroKinds {
    pub tcp: bool,
    pub udp: bool,
    framing: turbotun_wire::Framing,
    vnet_hdr_len: usize,
}

impl GroKinds {
    /// The kinds asked for, less any kind the kernel was found to refuse ([`crate::Capabilities::get`], if it
    /// ran; otherwise the first refused write turns the kind off). None without a virtio header.
    pub(crate) fn new(framing: turbotun_wire::Framing, vnet_hdr_len: usize, tcp: bool, udp: bool) -> Self {
        let found = crate::devices::capabilities::Capabilities::if_probed().map(|c| c.gro_writes()).unwrap_or_default();
        let on = vnet_hdr_len > 0;
        GroKinds {
            tcp: on && tcp && found.tcp != Some(false),
            udp: on && udp && found.udp != Some(false),
            framing,
            vnet_hdr_len,
        }
    }

    /// A coalescer for these kinds (gathered writes), none if both are off.
    pub(crate) fn coalescer(&self) -> Option<turbotun_wire::gro::Gro> {
        (self.tcp || self.udp).then(|| {
            turbotun_wire::gro::Gro::new(turbotun_wire::gro::GroConfig {
                tcp: self.tcp,
                udp: self.udp,
                framing: self.framing,
                vnet_hdr_len: self.vnet_hdr_len,
            })
            .with_gather(true)
        })
    }

    /// The kernel refused a coalesced packet with header `hdr`: its kind goes off (logged the first time).
    pub(crate) fn refuse(&mut self, hdr: &turbotun_wire::VirtioNetHdrRepr, queue: &str) {
        if hdr.gso_kind() == turbotun_wire::virtio_net::gso::UDP_L4 {
            if std::mem::replace(&mut self.udp, false) {
                tracing::warn!("{queue}: kernel refused a coalesced UDP write; UDP GRO off");
            }
        } else if std::mem::replace(&mut self.tcp, false) {
            tracing::warn!("{queue}: kernel refused a coalesced TCP write; TCP GRO off");
        }
    }
}

/// Decides a batch's write units, for every I/O path: the coalescer's heads (each with the virtio header of
/// its coalesced packet), or without one every packet, with a zeroed header or one asking the kernel to
/// complete a partial checksum (completed here on a queue without a virtio header, which cannot ask). Each
/// packet's header goes at `batch.offset - vnet_hdr_len`. Returns how many packets were merged into others.
pub(crate) fn prepare_units<B: AsMut<[u8]> + AsRef<[u8]>>(
    gro: Option<&mut turbotun_wire::gro::Gro>,
    batch: &mut Batch<'_, B>,
    vnet_hdr_len: usize,
    framing: turbotun_wire::Framing,
    checksums: turbotun_wire::Checksums,
    to_write: &mut Vec<usize>,
) -> usize {
    if let Some(gro) = gro {
        return gro.coalesce(batch, checksums, to_write).coalesced;
    }
    let Batch { bufs, lens, offset } = batch;
    let offset = *offset;
    to_write.clear();
    to_write.extend(0..bufs.len());
    let partial = checksums == turbotun_wire::Checksums::Partial;
    for (buf, &len) in bufs.iter_mut().zip(lens.iter()) {
        let Some(frame) = buf.as_mut().get_mut(offset - vnet_hdr_len..offset + len) else {
            continue; // Too short for its length: the write reports it.
        };
        let (vh, packet) = frame.split_at_mut(vnet_hdr_len);
        if partial && vnet_hdr_len == 0 {
            turbotun_wire::partial::complete(packet, framing);
        } else {
            turbotun_wire::partial::write_plain_header(vh, packet, framing, partial);
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use turbotun_wire::virtio_net::{gso, VirtioNetHdrRepr, VIRTIO_NET_HDR_LEN};
    use turbotun_wire::{partial, Batch, Checksums, Framing};

    use super::testing::tcp4_super_packet;
    use super::{frame_len, prepare_units, GroKinds};
    use crate::dataplane::stats::DropReason;

    const V: usize = VIRTIO_NET_HDR_LEN;

    /// Four consecutive 500-byte segments of one TCP flow, each with its checksum left partial, behind `offset`
    /// bytes of room.
    fn segments(offset: usize) -> (Vec<Vec<u8>>, Vec<usize>) {
        let (mut bufs, mut lens) = (Vec::new(), Vec::new());
        for i in 0..4u32 {
            let (_, packet) = tcp4_super_packet(&[i as u8; 500], 500, 1 + 500 * i);
            let mut buf = vec![0xee; offset];
            buf.extend_from_slice(&packet);
            lens.push(packet.len());
            bufs.push(buf);
        }
        (bufs, lens)
    }

    #[test]
    fn without_a_coalescer_every_packet_is_a_unit_with_its_own_header() {
        // (virtio header length, what the caller vouches for, the header each packet gets, checksum afterwards)
        let cases = [
            (V, Checksums::Partial, Some(true), Some(false)),
            (V, Checksums::Valid, Some(false), Some(false)),
            (0, Checksums::Partial, None, Some(true)),
        ];
        for (vlen, checksums, needs_csum, complete) in cases {
            let (mut bufs, mut lens) = segments(V);
            let mut to_write = vec![99];
            let merged = prepare_units(
                None,
                &mut Batch::new(&mut bufs, &mut lens, V),
                vlen,
                Framing::Ip,
                checksums,
                &mut to_write,
            );
            assert_eq!((merged, to_write.as_slice()), (0, &[0, 1, 2, 3][..]), "{checksums:?}");
            for buf in &bufs {
                if let Some(needs_csum) = needs_csum {
                    let hdr = VirtioNetHdrRepr::parse(&buf[V - vlen..V]).unwrap();
                    assert_eq!(hdr.needs_csum(), needs_csum, "{checksums:?}");
                    assert!(!hdr.is_gso());
                }
                assert_eq!(partial::verify(&buf[V..], Framing::Ip), complete, "{checksums:?} over {vlen}");
            }
        }
        // A buffer shorter than its length is left for the write to report, not a panic here.
        let (mut bufs, mut lens) = segments(V);
        lens[1] += 100;
        let mut to_write = Vec::new();
        prepare_units(
            None,
            &mut Batch::new(&mut bufs, &mut lens, V),
            V,
            Framing::Ip,
            Checksums::Partial,
            &mut to_write,
        );
        assert_eq!(to_write, [0, 1, 2, 3]);
    }

    #[test]
    fn with_a_coalescer_one_flow_is_one_unit() {
        let mut gro = GroKinds { tcp: true, udp: false, framing: Framing::Ip, vnet_hdr_len: V }.coalescer();
        let (mut bufs, mut lens) = segments(V);
        let mut to_write = Vec::new();
        let merged = prepare_units(
            gro.as_mut(),
            &mut Batch::new(&mut bufs, &mut lens, V),
            V,
            Framing::Ip,
            Checksums::Partial,
            &mut to_write,
        );
        assert_eq!((merged, to_write.as_slice()), (3, &[0][..]));
        let hdr = VirtioNetHdrRepr::parse(&bufs[0][..V]).unwrap();
        assert_eq!((hdr.gso_kind(), hdr.gso_size), (gso::TCPV4, 500));
    }

    #[test]
    fn a_refused_kind_goes_off_and_the_other_stays() {
        let tcp_hdr = VirtioNetHdrRepr { gso_type: gso::TCPV4, ..Default::default() };
        let udp_hdr = VirtioNetHdrRepr { gso_type: gso::UDP_L4, ..Default::default() };
        // (kinds asked for, the refused writes' headers, tcp and udp afterwards, whether a coalescer is made)
        type Case<'a> = ((bool, bool), &'a [VirtioNetHdrRepr], (bool, bool), bool);
        let cases: [Case; 5] = [
            ((true, true), &[], (true, true), true),
            ((true, true), &[udp_hdr], (true, false), true),
            ((true, true), &[tcp_hdr], (false, true), true),
            ((true, false), &[tcp_hdr, tcp_hdr], (false, false), false),
            ((true, true), &[tcp_hdr, udp_hdr], (false, false), false),
        ];
        for ((tcp, udp), refused, after, coalesces) in cases {
            let mut kinds = GroKinds { tcp, udp, framing: Framing::Ip, vnet_hdr_len: V };
            for hdr in refused {
                kinds.refuse(hdr, "test0");
            }
            assert_eq!(((kinds.tcp, kinds.udp), kinds.coalescer().is_some()), (after, coalesces), "{refused:?}");
        }
        // No virtio header, no coalesced writes.
        let none = GroKinds::new(Framing::Ip, 0, true, true);
        assert!(!none.tcp && !none.udp && none.coalescer().is_none());
    }

    #[test]
    fn test_frame_len() {
        assert_eq!(frame_len(1510, 10, 1510), Ok(1500));
        assert_eq!(frame_len(1511, 10, 1510), Err(DropReason::TooBig), "longer than its buffers: cut short");
        assert_eq!(frame_len(9, 10, 1510), Err(DropReason::Malformed), "shorter than the virtio header");
        assert_eq!(frame_len(10, 10, 1510), Ok(0));
        assert_eq!(frame_len(0, 0, 0), Ok(0));
    }
}
