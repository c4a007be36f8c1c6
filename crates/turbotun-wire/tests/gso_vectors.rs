//! Table-driven GSO vectors: every super-packet is split and compared byte for byte with the segments the kernel
//! would produce, for TCP and UDP, IPv4 and IPv6, raw IP (TUN) and Ethernet (TAP, with VLAN tags) framing.

use turbotun_wire::fuzzing::{checksums_ok, payload, Spec};
use turbotun_wire::gso::MAX_HEADER_LEN;
use turbotun_wire::tcp::flags as tf;
use turbotun_wire::virtio_net::{flags, gso};
use turbotun_wire::{checksum, Batch, Framing, GsoError, Splitter, VirtioNetHdrRepr, WireError};

fn framings() -> Vec<(Framing, usize)> {
    vec![(Framing::Ip, 0), (Framing::Ethernet, 0), (Framing::Ethernet, 1), (Framing::Ethernet, 2)]
}

fn specs() -> Vec<Spec> {
    let mut v = Vec::new();
    for base in [Spec::tcp4(), Spec::tcp6(), Spec::udp4(), Spec::udp6()] {
        for (f, vl) in framings() {
            v.push(base.clone().with_framing(f, vl));
        }
    }
    v
}

/// Splits with write_segment, segment_view and split_into and checks all three against `expected`.
fn check_split(hdr: &VirtioNetHdrRepr, pkt: &[u8], framing: Framing, expected: &[Vec<u8>]) {
    let s = Splitter::new(hdr, pkt, framing).unwrap();
    assert_eq!(s.segment_count(), expected.len());
    let mut out = vec![0u8; 70000];
    for (i, exp) in expected.iter().enumerate() {
        assert_eq!(s.segment_len(i), exp.len(), "segment {i} length");
        let n = s.write_segment(i, &mut out).unwrap();
        assert_eq!(&out[..n], &exp[..], "segment {i} bytes");
        assert!(checksums_ok(&out[..n], framing));
        let v = s.segment_view(i).unwrap();
        assert_eq!(v.to_vec(), *exp, "view {i}");
    }
    let mut bufs = vec![vec![0u8; 70000]; expected.len()];
    let mut lens = vec![0usize; expected.len()];
    let p = s.split_into(0, &mut Batch::new(&mut bufs, &mut lens, 12)).unwrap();
    assert_eq!((p.produced, p.next, p.total), (expected.len(), expected.len(), expected.len()));
    for (i, exp) in expected.iter().enumerate() {
        assert_eq!(&bufs[i][12..12 + lens[i]], &exp[..]);
    }
}

#[test]
fn split_sizes_all_protocols_and_framings() {
    // (payload length, gso_size): exact multiple, short last, single segment, one byte, 1-byte segments, 64 KB.
    let cases = [(4 * 1448, 1448), (3 * 1448 + 100, 1448), (500, 1448), (1, 1448), (7, 1), (1448, 1448)];
    for spec in specs() {
        for (len, mss) in cases {
            let pl = payload(len, 3);
            let (hdr, pkt) = spec.build_gso(&pl, mss as u16);
            check_split(&hdr, &pkt, spec.framing, &spec.segments(&pl, mss));
        }
    }
}

#[test]
fn split_64k_tcp4_and_udp6() {
    for spec in [Spec::tcp4(), Spec::udp6().with_framing(Framing::Ethernet, 1)] {
        let len = 65535 - spec.hdr_len();
        let pl = payload(len, 9);
        let (hdr, pkt) = spec.build_gso(&pl, 1448);
        let exp = spec.segments(&pl, 1448);
        assert_eq!(exp.len(), len.div_ceil(1448));
        check_split(&hdr, &pkt, spec.framing, &exp);
    }
}

#[test]
fn tcp_flags_fin_psh_last_cwr_first() {
    for base in [Spec::tcp4(), Spec::tcp6()] {
        let mut spec = base;
        spec.tcp_flags = tf::ACK | tf::PSH | tf::FIN | tf::CWR;
        let pl = payload(3000, 1);
        let (mut hdr, pkt) = spec.build_gso(&pl, 1000);
        hdr.gso_type |= gso::ECN;
        let exp = spec.segments(&pl, 1000);
        check_split(&hdr, &pkt, Framing::Ip, &exp);
        let s = Splitter::new(&hdr, &pkt, Framing::Ip).unwrap();
        let fl: Vec<u8> = (0..3).map(|i| s.segment_view(i).unwrap().header()[spec.l4_offset() + 13]).collect();
        assert_eq!(fl, vec![tf::ACK | tf::CWR, tf::ACK, tf::ACK | tf::PSH | tf::FIN]);
    }
}

#[test]
fn ipv4_ids_increment_and_wrap_seq_wraps() {
    let mut spec = Spec::tcp4();
    spec.ip_id = 0xfffe;
    spec.seq = u32::MAX - 10;
    let pl = payload(400, 2);
    let (hdr, pkt) = spec.build_gso(&pl, 100);
    let exp = spec.segments(&pl, 100);
    check_split(&hdr, &pkt, Framing::Ip, &exp);
    let ids: Vec<u16> = exp.iter().map(|p| u16::from_be_bytes([p[4], p[5]])).collect();
    assert_eq!(ids, vec![0xfffe, 0xffff, 0, 1]);
}

#[test]
fn options_ip4_and_ipv6_extension_headers() {
    let mut s4 = Spec::tcp4();
    s4.ip_opts = vec![1, 1, 1, 0]; // NOP NOP NOP EOL
    s4.tcp_opts = vec![2, 4, 5, 0xb4, 1, 3, 3, 7];
    let mut s6 = Spec::tcp6().with_framing(Framing::Ethernet, 1);
    s6.v6_dest_opts = 2;
    let mut u6 = Spec::udp6();
    u6.v6_dest_opts = 1;
    for spec in [s4, s6, u6] {
        let pl = payload(2500, 4);
        let (hdr, pkt) = spec.build_gso(&pl, 1200);
        check_split(&hdr, &pkt, spec.framing, &spec.segments(&pl, 1200));
    }
}

#[test]
fn hdr_len_is_recomputed_not_trusted() {
    let spec = Spec::tcp4();
    let pl = payload(3000, 5);
    let (mut hdr, pkt) = spec.build_gso(&pl, 1000);
    let exp = spec.segments(&pl, 1000);
    for bogus in [0u16, 1, 20, 1040, 3052, u16::MAX] {
        hdr.hdr_len = bogus;
        check_split(&hdr, &pkt, Framing::Ip, &exp);
    }
}

#[test]
fn udp_zero_checksum_in_super_packet_is_completed() {
    // Without NEEDS_CSUM the checksum field is ignored and every segment gets a full checksum.
    let spec = Spec::udp4();
    let pl = payload(3000, 6);
    let (mut hdr, mut pkt) = spec.build_gso(&pl, 1000);
    hdr.flags = 0;
    let l4 = spec.l4_offset();
    pkt[l4 + 6] = 0;
    pkt[l4 + 7] = 0;
    check_split(&hdr, &pkt, Framing::Ip, &spec.segments(&pl, 1000));
}

#[test]
fn gso_none_plain_and_needs_csum() {
    for spec in specs() {
        let pl = payload(333, 7);
        let full = spec.build(&pl);
        // Plain: returned as is.
        let s = Splitter::new(&VirtioNetHdrRepr::default(), &full, spec.framing).unwrap();
        assert_eq!(s.segment_count(), 1);
        assert!(!s.is_gso());
        assert_eq!(s.segment_view(0).unwrap().to_vec(), full);
        // NEEDS_CSUM: the checksum field holds the pseudo-header sum; completion gives the full packet.
        let (mut hdr, partial) = spec.build_gso(&pl, 0);
        hdr.gso_type = gso::NONE;
        let s = Splitter::new(&hdr, &partial, spec.framing).unwrap();
        let mut out = vec![0u8; 2000];
        let n = s.write_segment(0, &mut out).unwrap();
        assert_eq!(&out[..n], &full[..]);
        assert_eq!(s.segment_view(0).unwrap().to_vec(), full);
    }
}

#[test]
fn errors_name_the_problem() {
    let spec = Spec::tcp4();
    let pl = payload(3000, 8);
    let (hdr, pkt) = spec.build_gso(&pl, 1000);
    let err = |h: VirtioNetHdrRepr, p: &[u8], f: Framing| Splitter::new(&h, p, f).unwrap_err();

    assert_eq!(err(VirtioNetHdrRepr { gso_type: gso::UDP, ..hdr }, &pkt, Framing::Ip), GsoError::UnsupportedGsoType(3));
    assert_eq!(err(VirtioNetHdrRepr { gso_type: 9, ..hdr }, &pkt, Framing::Ip), GsoError::UnsupportedGsoType(9));
    assert_eq!(
        err(VirtioNetHdrRepr { gso_type: gso::TCPV6, ..hdr }, &pkt, Framing::Ip),
        GsoError::GsoTypeMismatch { gso_type: gso::TCPV6, ip_version: 4 }
    );
    assert_eq!(
        err(VirtioNetHdrRepr { gso_type: gso::UDP_L4, csum_offset: 6, ..hdr }, &pkt, Framing::Ip),
        GsoError::ProtocolMismatch { gso_type: gso::UDP_L4, protocol: 6 }
    );
    assert_eq!(
        err(VirtioNetHdrRepr { csum_start: 60000, ..hdr }, &pkt, Framing::Ip),
        GsoError::CsumStartBeyond { csum_start: 60000, len: pkt.len() }
    );
    assert_eq!(
        err(VirtioNetHdrRepr { csum_start: 24, ..hdr }, &pkt, Framing::Ip),
        GsoError::CsumStartMismatch { csum_start: 24, l4_offset: 20 }
    );
    assert_eq!(
        err(VirtioNetHdrRepr { csum_offset: 40, ..hdr }, &pkt, Framing::Ip),
        GsoError::BadCsumOffset { csum_start: 20, csum_offset: 40, limit: 52 }
    );
    assert_eq!(
        err(VirtioNetHdrRepr { csum_offset: 6, ..hdr }, &pkt, Framing::Ip),
        GsoError::BadCsumOffset { csum_start: 20, csum_offset: 6, limit: 52 }
    );
    assert_eq!(err(VirtioNetHdrRepr { gso_size: 0, ..hdr }, &pkt, Framing::Ip), GsoError::ZeroGsoSize);
    // Truncated TCP header and data offset below 20.
    assert!(matches!(err(hdr, &pkt[..30], Framing::Ip), GsoError::Wire(WireError::Truncated { .. })));
    let mut bad = pkt.clone();
    bad[20 + 12] = 0x40;
    assert_eq!(err(hdr, &bad, Framing::Ip), GsoError::Wire(WireError::BadHeaderLen { what: "TCP", len: 16 }));
    // Fragment.
    let mut frag = pkt.clone();
    frag[6] |= 0x20;
    assert_eq!(err(hdr, &frag, Framing::Ip), GsoError::Fragment);
    // Wrong framing: an IP packet read as Ethernet.
    assert!(matches!(err(hdr, &pkt, Framing::Ethernet), GsoError::Wire(_)));
    // GSO_NONE + NEEDS_CSUM with the checksum beyond the packet.
    let none =
        VirtioNetHdrRepr { gso_type: gso::NONE, flags: flags::NEEDS_CSUM, csum_start: 50, csum_offset: 16, ..hdr };
    assert_eq!(
        err(none, &pkt[..60], Framing::Ip),
        GsoError::BadCsumOffset { csum_start: 50, csum_offset: 16, limit: 60 }
    );
    // Display strings name the values.
    assert_eq!(
        GsoError::CsumStartBeyond { csum_start: 80, len: 60 }.to_string(),
        "virtio csum_start 80 beyond packet length 60"
    );
    assert!(GsoError::UnsupportedGsoType(3).to_string().contains("0x03"));
}

#[test]
fn header_too_large_rejected() {
    let mut spec = Spec::tcp6().with_framing(Framing::Ethernet, 2);
    spec.v6_dest_opts = 8; // 22 + 40 + 64 + 32 = 158: fine
    let pl = payload(100, 1);
    let (hdr, pkt) = spec.build_gso(&pl, 50);
    assert!(Splitter::new(&hdr, &pkt, spec.framing).is_ok());
    // Build a header > MAX_HEADER_LEN with one huge destination-options header.
    let mut big = pkt[..22 + 40].to_vec();
    big[22 + 6] = 60;
    let ext_len = 200usize;
    let mut ext = vec![0u8; ext_len];
    ext[0] = 6;
    ext[1] = (ext_len / 8 - 1) as u8;
    big.extend_from_slice(&ext);
    big.extend_from_slice(&pkt[22 + 40 + 64..]);
    let l4 = 22 + 40 + ext_len;
    let h = VirtioNetHdrRepr { csum_start: l4 as u16, ..hdr };
    assert_eq!(
        Splitter::new(&h, &big, Framing::Ethernet).unwrap_err(),
        GsoError::HeaderTooLarge { len: l4 + 32, max: MAX_HEADER_LEN }
    );
}

#[test]
fn view_sum_from_verifies_without_copy() {
    let spec = Spec::udp6();
    let pl = payload(5000, 2);
    let (hdr, pkt) = spec.build_gso(&pl, 1400);
    let s = Splitter::new(&hdr, &pkt, Framing::Ip).unwrap();
    for i in 0..s.segment_count() {
        let v = s.segment_view(i).unwrap();
        let l4_len = (v.len() - 40) as u32;
        let ps = checksum::pseudo_header_v6(spec.src6, spec.dst6, 17, l4_len);
        assert_eq!(checksum::fold(v.sum_from(40, ps)), 0xffff);
    }
}

/// An IPv6 TCP super-packet behind a routing header with segments left: the checksums of its segments are
/// completed against the final destination the routing header names (RFC 8200 section 8.1), as the kernel's
/// stack seeded them, not against the header's destination. Found by review: the header's was used, and every
/// segment went out with a checksum the receiver rejects.
#[test]
fn ipv6_routing_header_uses_the_final_destination() {
    let src = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let hop = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xaa];
    let fin = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff];
    // (routing type, the header's bytes after its first four, where the final destination is)
    let type2 = [&[0u8; 4][..], &fin].concat(); // Mobile IPv6: one address, the final one
    let type0 = [&[0u8; 4][..], &hop, &fin].concat(); // two addresses, the last final
    let srh = [&[1u8, 0, 0, 0][..], &fin, &hop].concat(); // segment routing: the list reversed, entry 0 final
    for (routing_type, body) in [(2u8, type2), (0, type0), (4, srh)] {
        let (payload, mss) = (payload(3000, 5), 1000usize);
        let rh_len = 4 + body.len();
        let mut rh = vec![6u8, (rh_len / 8 - 1) as u8, routing_type, 1];
        rh.extend_from_slice(&body);
        let l4 = 40 + rh_len;
        let mut pkt = vec![0u8; l4 + 20];
        pkt[0] = 0x60;
        pkt[4..6].copy_from_slice(&((rh_len + 20 + payload.len()) as u16).to_be_bytes());
        pkt[6] = 43;
        pkt[7] = 64;
        pkt[8..24].copy_from_slice(&src);
        pkt[24..40].copy_from_slice(&hop);
        pkt[40..l4].copy_from_slice(&rh);
        pkt[l4 + 4..l4 + 8].copy_from_slice(&7u32.to_be_bytes());
        pkt[l4 + 12] = 5 << 4;
        pkt[l4 + 13] = tf::ACK;
        pkt[l4 + 14..l4 + 16].copy_from_slice(&512u16.to_be_bytes());
        pkt.extend_from_slice(&payload);
        let l4_len = pkt.len() - l4;
        let seed = checksum::fold(checksum::pseudo_header_v6(src, fin, 6, l4_len as u32));
        pkt[l4 + 16..l4 + 18].copy_from_slice(&seed.to_be_bytes());
        let hdr = VirtioNetHdrRepr {
            flags: flags::NEEDS_CSUM,
            gso_type: gso::TCPV6,
            hdr_len: (l4 + 20) as u16,
            gso_size: mss as u16,
            csum_start: l4 as u16,
            csum_offset: 16,
        };
        let s = Splitter::new(&hdr, &pkt, Framing::Ip).unwrap();
        assert_eq!(s.segment_count(), 3);
        let mut out = vec![0u8; 2000];
        for i in 0..3 {
            let n = s.write_segment(i, &mut out).unwrap();
            let seg_l4 = &out[l4..n];
            let sum = checksum::sum(seg_l4, checksum::pseudo_header_v6(src, fin, 6, seg_l4.len() as u32));
            assert_eq!(
                checksum::fold(sum),
                0xffff,
                "type {routing_type} segment {i} verifies at the final destination"
            );
            assert!(checksums_ok(&out[..n], Framing::Ip), "type {routing_type} segment {i}");
        }
    }
    // A routing type whose final destination cannot be read (RPL's compressed addresses) is refused, with segments
    // left; with none left the header's destination is the final one.
    let mut pkt = vec![0u8; 40 + 8 + 20 + 100];
    pkt[0] = 0x60;
    pkt[4..6].copy_from_slice(&128u16.to_be_bytes());
    pkt[6] = 43;
    pkt[40..44].copy_from_slice(&[6, 0, 3, 1]);
    pkt[48 + 12] = 5 << 4;
    let hdr = VirtioNetHdrRepr {
        flags: flags::NEEDS_CSUM,
        gso_type: gso::TCPV6,
        hdr_len: 68,
        gso_size: 50,
        csum_start: 48,
        csum_offset: 16,
    };
    let err = Splitter::new(&hdr, &pkt, Framing::Ip).unwrap_err();
    assert_eq!(err, GsoError::Wire(WireError::UnknownFinalDestination { routing_type: 3 }));
    pkt[43] = 0;
    assert!(Splitter::new(&hdr, &pkt, Framing::Ip).is_ok());
}
