//! Frames the kernel would never send, delivered through a datagram socket pair that stands in for a tun fd
//! (a read returns one whole message, as from a tun queue): each is counted with its reason, never a panic,
//! never a silent loss.

use std::os::unix::net::UnixDatagram;

use turbotun_wire::virtio_net::VIRTIO_NET_HDR_LEN;

use super::super::testing::{fake_queue, tcp4_super_packet};
use super::*;
use crate::devices::mode::Mode;
use crate::devices::offloads::Offloads;

/// A TCP/IPv4 super-packet of `payload` zero bytes in segments of `gso_size`, its checksum left partial, as a
/// frame with its virtio header.
fn super_packet(payload: usize, gso_size: u16) -> Vec<u8> {
    let (hdr, packet) = tcp4_super_packet(&vec![0; payload], gso_size, 1);
    let mut frame = vec![0u8; VIRTIO_NET_HDR_LEN];
    hdr.emit(&mut frame);
    frame.extend_from_slice(&packet);
    frame
}

fn buffers(n: usize, size: usize) -> (Vec<Vec<u8>>, Vec<usize>) {
    (vec![vec![0u8; size]; n], vec![0; n])
}

#[test]
fn test_a_tiny_gso_size_is_capped() {
    let (queue, feed) = fake_queue();
    let payload = MAX_SEGMENTS + 976;
    feed.send(&super_packet(payload, 1)).unwrap();
    let mut rx = RecvBatch::new(&queue);
    let (mut bufs, mut lens) = buffers(64, VIRTIO_NET_HDR_LEN + 1500);
    let mut delivered = 0;
    while delivered < MAX_SEGMENTS {
        let got = rx.recv_many(&mut Batch::new(&mut bufs, &mut lens, VIRTIO_NET_HDR_LEN), None).unwrap();
        assert!(got.packets > 0);
        assert!(lens[..got.packets].iter().all(|&len| len == 20 + 20 + 1), "one-byte segments");
        delivered += got.packets;
    }
    assert_eq!(delivered, MAX_SEGMENTS);
    assert_eq!(rx.pending(), 0, "nothing beyond the cap is pending");
    let stats = rx.stats();
    assert_eq!(stats.segments, MAX_SEGMENTS as u64);
    assert_eq!(stats.drops.too_many_segments, 976, "the excess is counted with its reason");
}

#[test]
fn test_frames_that_cannot_be_used_are_counted_and_skipped() {
    let (queue, feed) = fake_queue();
    let mut rx = RecvBatch::new(&queue);
    // A short read, a header with an unknown GSO type, a super-packet whose csum_start points nowhere,
    // then a good one: the good one is delivered and each bad one counted.
    feed.send(&[0u8; 4]).unwrap();
    let mut unknown = super_packet(3000, 1000);
    unknown[1] = 0x33;
    feed.send(&unknown).unwrap();
    let mut bad_offsets = super_packet(3000, 1000);
    bad_offsets[6..8].copy_from_slice(&60000u16.to_le_bytes());
    feed.send(&bad_offsets).unwrap();
    feed.send(&super_packet(3000, 1000)).unwrap();
    let (mut bufs, mut lens) = buffers(8, VIRTIO_NET_HDR_LEN + 1500);
    let got = rx.recv_many(&mut Batch::new(&mut bufs, &mut lens, VIRTIO_NET_HDR_LEN), None).unwrap();
    assert_eq!(got.packets, 3, "the good super-packet, split");
    let stats = rx.stats();
    assert_eq!(stats.reads, 4);
    assert_eq!(stats.drops.malformed, 3, "{stats:?}");
}

/// The frame of one plain TCP packet of `payload` bytes: no virtio flags, its checksum complete.
fn whole_packet(payload: usize) -> Vec<u8> {
    let mut frame = super_packet(payload, 1000);
    VirtioNetHdrRepr::default().emit(&mut frame[..VIRTIO_NET_HDR_LEN]);
    assert!(turbotun_wire::partial::complete(&mut frame[VIRTIO_NET_HDR_LEN..], Framing::Ip));
    frame
}

fn checksum_complete(packet: &[u8]) -> bool {
    let mut completed = packet.to_vec();
    turbotun_wire::partial::complete(&mut completed, Framing::Ip) && completed == packet
}

#[test]
fn test_partial_checksums_are_left_partial_unless_the_batch_has_unverified_packets() {
    let (queue, feed) = fake_queue();
    let mut rx = RecvBatch::new(&queue).partial_checksums(true);
    let (mut bufs, mut lens) = buffers(8, VIRTIO_NET_HDR_LEN + 1500);
    let off = VIRTIO_NET_HDR_LEN;

    // A super-packet alone: its segments carry the pseudo-header sum, and the batch says so.
    feed.send(&super_packet(3000, 1000)).unwrap();
    let got = rx.try_recv_many(&mut Batch::new(&mut bufs, &mut lens, off)).unwrap();
    assert_eq!((got.packets, got.checksums), (3, Checksums::Partial));
    for i in 0..3 {
        let seg = &bufs[i][off..off + lens[i]];
        let site = turbotun_wire::partial::site(seg, Framing::Ip).unwrap();
        assert_eq!(seg[site.start + site.offset..][..2], site.seed.to_be_bytes(), "segment {i}");
        assert!(!checksum_complete(seg), "segment {i} is partial");
    }

    // An unverified packet first, then the super-packet: one state must describe the batch, so the
    // segments' checksums are completed.
    feed.send(&whole_packet(200)).unwrap();
    feed.send(&super_packet(3000, 1000)).unwrap();
    let got = rx.try_recv_many(&mut Batch::new(&mut bufs, &mut lens, off)).unwrap();
    assert_eq!((got.packets, got.checksums), (4, Checksums::Unverified));
    for i in 0..4 {
        assert!(checksum_complete(&bufs[i][off..off + lens[i]]), "packet {i}");
    }

    // Without the option every segment is complete.
    let mut rx = RecvBatch::new(&queue);
    feed.send(&super_packet(3000, 1000)).unwrap();
    let got = rx.try_recv_many(&mut Batch::new(&mut bufs, &mut lens, off)).unwrap();
    assert_eq!((got.packets, got.checksums), (3, Checksums::Valid));
    assert!((0..3).all(|i| checksum_complete(&bufs[i][off..off + lens[i]])));
}

#[test]
fn test_a_plain_queue_delivers_each_frame_in_place() {
    let (ours, feed) = UnixDatagram::pair().unwrap();
    // No virtio header, no super-packets: each frame is read straight into the caller's next buffer.
    let queue = Queue::new(ours.into(), "fake1".into(), 0, Mode::Tun, 0, Offloads::NONE);
    let mut rx = RecvBatch::new(&queue);
    feed.send(&[0x45; 100]).unwrap();
    feed.send(&[0x60; 60]).unwrap();
    let (mut bufs, mut lens) = buffers(4, 1500);
    let got = rx.try_recv_many(&mut Batch::new(&mut bufs, &mut lens, 0)).unwrap();
    assert_eq!((got.packets, lens[0], lens[1]), (2, 100, 60));
    assert_eq!((bufs[0][0], bufs[1][0]), (0x45, 0x60));
    assert_eq!(rx.stats().drops.total(), 0);
}
