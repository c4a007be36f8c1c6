//! Table-driven GSO vectors: every super-packet is split and compared byte for byte with the segments the kernel
//! would produce, for TCP and UDP, IPv4 and IPv6, raw IP (TUN) and Ethernet (TAP, with VLAN tags) framing.

use turbotun_wire::fuzzing::{checksums_ok, payload, Spec};
use turbotun_wire::gso::MAX_HEADER_LEN;
use turbotun_wire::tcp::flags as tf;
use turbotun_wire::virtio_net::{flags, gso};
use turbotun_wire::{checksum, Framing, GsoError, Splitter, VirtioNetHdrRepr, WireError};

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
    let p = s.split_into(0, &mut bufs, &mut lens, 12).unwrap();
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
