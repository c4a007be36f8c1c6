//! The packet rewriting over byte arrays: each kind of answer, what is ignored and why, truncated and random
//! input (never a panic).

use super::*;
use turbotun_wire::checksum;

const A4: [u8; 4] = [10, 9, 0, 1];
const B4: [u8; 4] = [10, 9, 0, 2];
const A6: [u8; 16] = [0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const B6: [u8; 16] = [0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
const KERNEL_MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

fn tun() -> Responder {
    Responder::new(Mode::Tun).with_own_address(A4.into(), 24).with_own_address(A6.into(), 64)
}

fn tap() -> Responder {
    Responder::new(Mode::Tap).with_own_address(A4.into(), 24).with_own_address(A6.into(), 64)
}

/// An IPv4 packet with a correct header checksum around `l4`.
fn ipv4(src: [u8; 4], dst: [u8; 4], protocol: u8, l4: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 20 + l4.len()];
    let repr = ipv4::Repr { src, dst, protocol, payload_len: l4.len() as u16, ttl: 64, ident: 7, ..Default::default() };
    repr.emit(&mut p).unwrap();
    p[20..].copy_from_slice(l4);
    p
}

fn ipv6(src: [u8; 16], dst: [u8; 16], next_header: u8, hop_limit: u8, l4: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 40 + l4.len()];
    let repr = ipv6::Repr { src, dst, next_header, payload_len: l4.len() as u16, hop_limit, ..Default::default() };
    repr.emit(&mut p).unwrap();
    p[40..].copy_from_slice(l4);
    p
}

fn ethernet(dst: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14];
    ethernet::Repr { dst, src: KERNEL_MAC, ethertype, ..Default::default() }.emit(&mut f).unwrap();
    f.extend_from_slice(payload);
    f
}

/// A UDP datagram with its checksum filled in for the given pseudo-header sum.
fn udp_datagram(pseudo: impl Fn(u32) -> u32, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; 8];
    udp::Repr { src_port: sport, dst_port: dport, payload_len: payload.len() as u16 }.emit(&mut d).unwrap();
    d.extend_from_slice(payload);
    let c = checksum::checksum(&d, pseudo(d.len() as u32));
    d[6..8].copy_from_slice(&c.to_be_bytes());
    d
}

fn udp4(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let d = udp_datagram(|len| checksum::pseudo_header_v4(src, dst, IPPROTO_UDP, len), 40000, 7, payload);
    ipv4(src, dst, IPPROTO_UDP, &d)
}

fn udp6(src: [u8; 16], dst: [u8; 16], payload: &[u8]) -> Vec<u8> {
    let d = udp_datagram(|len| checksum::pseudo_header_v6(src, dst, IPPROTO_UDP, len), 40000, 7, payload);
    ipv6(src, dst, IPPROTO_UDP, 64, &d)
}

fn icmp4_echo(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut m = vec![icmp::ECHO_REQUEST, 0, 0, 0, 0x12, 0x34, 0, 1, 1, 2, 3, 4, 5];
    icmp::Packet::new_unchecked(&mut m[..]).fill_checksum();
    ipv4(src, dst, IPPROTO_ICMP, &m)
}

fn icmp6_message(src: [u8; 16], dst: [u8; 16], hop_limit: u8, mut m: Vec<u8>) -> Vec<u8> {
    icmpv6::Packet::new_unchecked(&mut m[..]).fill_checksum(src, dst);
    ipv6(src, dst, icmpv6::IPPROTO_ICMPV6, hop_limit, &m)
}

fn icmp6_echo(src: [u8; 16], dst: [u8; 16]) -> Vec<u8> {
    icmp6_message(src, dst, 64, vec![icmpv6::ECHO_REQUEST, 0, 0, 0, 0x12, 0x34, 0, 1, 9, 8, 7])
}

/// A neighbour solicitation for `target` from `src` to its solicited-node address, with or without the source
/// link-layer address option.
fn solicitation(src: [u8; 16], target: [u8; 16], with_option: bool) -> Vec<u8> {
    let snm = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, target[13], target[14], target[15]];
    let mut m = vec![icmpv6::NEIGHBOR_SOLICIT, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&target);
    if with_option {
        m.extend_from_slice(&[icmpv6::OPT_SOURCE_LL_ADDR, 1]);
        m.extend_from_slice(&KERNEL_MAC);
    }
    icmp6_message(src, snm, 255, m)
}

fn arp_request(spa: [u8; 4], tpa: [u8; 4]) -> Vec<u8> {
    let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1];
    a.extend_from_slice(&KERNEL_MAC);
    a.extend_from_slice(&spa);
    a.extend_from_slice(&[0; 6]);
    a.extend_from_slice(&tpa);
    ethernet([0xff; 6], ethernet::ETHERTYPE_ARP, &a)
}

/// Runs the responder over `packet` in a buffer with `room` spare bytes; the answer (or the verdict).
fn answer(r: &Responder, packet: &[u8], room: usize) -> (Verdict, Vec<u8>) {
    let mut buf = packet.to_vec();
    buf.resize(packet.len() + room, 0);
    let v = r.answer(&mut buf, packet.len());
    let out = match v {
        Verdict::Answer { len, .. } => buf[..len].to_vec(),
        _ => Vec::new(),
    };
    (v, out)
}

fn answered(r: &Responder, packet: &[u8], kind: AnswerKind) -> Vec<u8> {
    let (v, out) = answer(r, packet, 0);
    assert!(matches!(v, Verdict::Answer { kind: k, .. } if k == kind), "{kind:?} expected, got {v:?}");
    out
}

fn ipv4_ok(p: &[u8]) -> ipv4::Packet<&[u8]> {
    let ip = ipv4::Packet::new_checked(p).unwrap();
    ip.check_total_len().unwrap();
    assert!(ip.verify_checksum(), "IPv4 header checksum");
    ip
}

#[test]
fn test_icmp_echo_request_becomes_a_reply() {
    let q = icmp4_echo(A4, B4);
    let a = answered(&tun(), &q, AnswerKind::Icmp);
    let ip = ipv4_ok(&a);
    assert_eq!((ip.src_addr(), ip.dst_addr()), (B4, A4));
    let m = icmp::Packet::new_checked(ip.payload()).unwrap();
    assert_eq!((m.msg_type(), m.code(), m.ident(), m.seq()), (icmp::ECHO_REPLY, 0, 0x1234, 1));
    assert!(m.verify_checksum());
    assert_eq!(m.payload(), &q[28..]);
}

#[test]
fn test_udp_is_sent_back_with_addresses_and_ports_swapped() {
    for r in [tun(), tap()] {
        let framed = |p: Vec<u8>, et| if r.mode == Mode::Tap { ethernet(DEFAULT_MAC, et, &p) } else { p };
        let l2 = if r.mode == Mode::Tap { 14 } else { 0 };
        let q4 = framed(udp4(A4, B4, b"hello"), ethernet::ETHERTYPE_IPV4);
        let a = answered(&r, &q4, AnswerKind::Udp);
        let ip = ipv4_ok(&a[l2..]);
        assert_eq!((ip.src_addr(), ip.dst_addr()), (B4, A4));
        let d = udp::Packet::new_checked(ip.payload()).unwrap();
        assert_eq!((d.src_port(), d.dst_port(), d.payload()), (7, 40000, &b"hello"[..]));
        let pseudo = checksum::pseudo_header_v4(B4, A4, IPPROTO_UDP, ip.payload().len() as u32);
        assert_eq!(checksum::fold(checksum::sum(ip.payload(), pseudo)), 0xffff, "UDP checksum still right");

        let q6 = framed(udp6(A6, B6, b"hello6"), ethernet::ETHERTYPE_IPV6);
        let a = answered(&r, &q6, AnswerKind::Udp);
        let ip = ipv6::Packet::new_checked(&a[l2..]).unwrap();
        assert_eq!((ip.src_addr(), ip.dst_addr()), (B6, A6));
        let d = udp::Packet::new_checked(ip.payload()).unwrap();
        assert_eq!((d.src_port(), d.dst_port(), d.payload()), (7, 40000, &b"hello6"[..]));
        let pseudo = checksum::pseudo_header_v6(B6, A6, IPPROTO_UDP, ip.payload().len() as u32);
        assert_eq!(checksum::fold(checksum::sum(ip.payload(), pseudo)), 0xffff);
        if r.mode == Mode::Tap {
            let f = ethernet::Frame::new_checked(&a[..]).unwrap();
            assert_eq!((f.src_addr(), f.dst_addr()), (DEFAULT_MAC, KERNEL_MAC));
        }
    }
}

#[test]
fn test_udp_super_packet_keeps_its_checksum_seed() {
    // A GSO super-packet as the kernel hands it over: lengths cover every segment, the checksum field holds
    // the folded pseudo-header sum (NEEDS_CSUM) rather than a checksum.
    let payload = vec![0x5au8; 20 * 1000];
    let mut d = vec![0u8; 8];
    udp::Repr { src_port: 40000, dst_port: 7, payload_len: payload.len() as u16 }.emit(&mut d).unwrap();
    d.extend_from_slice(&payload);
    let seed = checksum::fold(checksum::pseudo_header_v4(A4, B4, IPPROTO_UDP, d.len() as u32));
    d[6..8].copy_from_slice(&seed.to_be_bytes());
    let q = ipv4(A4, B4, IPPROTO_UDP, &d);
    let a = answered(&tun(), &q, AnswerKind::Udp);
    let ip = ipv4_ok(&a);
    let back = udp::Packet::new_checked(ip.payload()).unwrap();
    let swapped_seed = checksum::fold(checksum::pseudo_header_v4(B4, A4, IPPROTO_UDP, d.len() as u32));
    assert_eq!(back.checksum(), swapped_seed);
    assert_eq!(back.checksum(), seed);
    assert_eq!(a.len(), q.len());
}

#[test]
fn test_icmpv6_echo_request_becomes_a_reply() {
    let a = answered(&tun(), &icmp6_echo(A6, B6), AnswerKind::Icmp6);
    let ip = ipv6::Packet::new_checked(&a[..]).unwrap();
    ip.check_payload_len().unwrap();
    assert_eq!((ip.src_addr(), ip.dst_addr()), (B6, A6));
    let m = icmpv6::Packet::new_checked(ip.payload()).unwrap();
    assert_eq!((m.msg_type(), m.ident(), m.seq()), (icmpv6::ECHO_REPLY, 0x1234, 1));
    assert!(m.verify_checksum(B6, A6));
}

#[test]
fn test_arp_request_is_answered_with_our_mac() {
    let mac = [2, 0, 0, 0, 0, 0x42];
    let r = tap().with_mac(mac);
    let mut q = arp_request(A4, B4);
    q.resize(60, 0); // Ethernet padding is not part of the answer
    let a = answered(&r, &q, AnswerKind::Arp);
    assert_eq!(a.len(), 42);
    let f = ethernet::Frame::new_checked(&a[..]).unwrap();
    assert_eq!((f.dst_addr(), f.src_addr(), f.inner_ethertype()), (KERNEL_MAC, mac, ethernet::ETHERTYPE_ARP));
    let p = arp::Packet::new_checked(f.payload()).unwrap();
    assert_eq!(p.operation(), arp::OP_REPLY);
    assert_eq!((p.sender_hw(), p.sender_ip()), (mac, B4));
    assert_eq!((p.target_hw(), p.target_ip()), (KERNEL_MAC, A4));
}

#[test]
fn test_arp_that_must_not_be_answered() {
    let r = tap();
    let cases = [
        (arp_request(A4, A4), IgnoreReason::OwnAddress),     // gratuitous
        (arp_request(B4, A4), IgnoreReason::OwnAddress),     // for the device's own address
        (arp_request([0; 4], B4), IgnoreReason::NotUnicast), // probe (RFC 5227)
        (arp_request(A4, [224, 0, 0, 1]), IgnoreReason::NotUnicast),
    ];
    for (q, why) in cases {
        assert_eq!(answer(&r, &q, 0).0, Verdict::Ignore(why));
    }
    let mut reply = arp_request(A4, B4);
    reply[21] = 2;
    assert_eq!(answer(&r, &reply, 0).0, Verdict::Ignore(IgnoreReason::Other));
    // ARP on TUN is not IP: ignored, not answered.
    assert_eq!(answer(&tun(), &arp_request(A4, B4)[14..], 0).0, Verdict::Ignore(IgnoreReason::Other));
}

fn check_advertisement(a: &[u8], mac: [u8; 6], to: [u8; 16]) {
    let f = ethernet::Frame::new_checked(a).unwrap();
    assert_eq!((f.dst_addr(), f.src_addr()), (KERNEL_MAC, mac));
    let ip = ipv6::Packet::new_checked(f.payload()).unwrap();
    ip.check_payload_len().unwrap();
    assert_eq!((ip.src_addr(), ip.dst_addr(), ip.hop_limit()), (B6, to, 255));
    let m = icmpv6::Packet::new_checked(ip.payload()).unwrap();
    assert_eq!(m.msg_type(), icmpv6::NEIGHBOR_ADVERT);
    assert_eq!(m.nd_target(), Some(B6));
    assert_eq!(m.na_flags(), icmpv6::na_flags::SOLICITED | icmpv6::na_flags::OVERRIDE);
    assert_eq!(m.nd_option(icmpv6::OPT_TARGET_LL_ADDR), Some(&mac[..]));
    assert!(m.verify_checksum(B6, to));
}

#[test]
fn test_neighbour_solicitation_becomes_an_advertisement() {
    let r = tap();
    let q = ethernet([0x33, 0x33, 0xff, 0, 0, 2], ethernet::ETHERTYPE_IPV6, &solicitation(A6, B6, true));
    let a = answered(&r, &q, AnswerKind::Nd);
    assert_eq!(a.len(), q.len(), "same size: written in place");
    check_advertisement(&a, DEFAULT_MAC, A6);

    // Without the option the answer is 8 bytes longer: written into the room after the packet, or not at all.
    let short = ethernet([0x33, 0x33, 0xff, 0, 0, 2], ethernet::ETHERTYPE_IPV6, &solicitation(A6, B6, false));
    let (v, a) = answer(&r, &short, 8);
    assert!(matches!(v, Verdict::Answer { kind: AnswerKind::Nd, len } if len == short.len() + 8));
    check_advertisement(&a, DEFAULT_MAC, A6);
    assert_eq!(answer(&r, &short, 7).0, Verdict::Ignore(IgnoreReason::Other));
}

#[test]
fn test_neighbour_solicitations_that_must_not_be_answered() {
    let r = tap();
    let frame = |p: Vec<u8>| ethernet([0x33, 0x33, 0xff, 0, 0, 1], ethernet::ETHERTYPE_IPV6, &p);
    // Duplicate address detection comes from the unspecified address.
    assert_eq!(answer(&r, &frame(solicitation([0; 16], B6, false)), 8).0, Verdict::Ignore(IgnoreReason::NotUnicast));
    assert_eq!(answer(&r, &frame(solicitation(B6, A6, true)), 0).0, Verdict::Ignore(IgnoreReason::OwnAddress));
    let mut forwarded = frame(solicitation(A6, B6, true));
    forwarded[14 + 7] = 64; // hop limit
    assert_eq!(answer(&r, &forwarded, 0).0, Verdict::Ignore(IgnoreReason::Other));
    // TUN has no link layer to resolve.
    assert_eq!(answer(&tun(), &solicitation(A6, B6, true), 0).0, Verdict::Ignore(IgnoreReason::Other));
}

#[test]
fn test_what_is_never_answered() {
    let r = tun();
    let tcp = ipv4(A4, B4, IPPROTO_TCP, &[0u8; 20]);
    assert_eq!(answer(&r, &tcp, 0).0, Verdict::Ignore(IgnoreReason::Tcp));
    let tcp6 = ipv6(A6, B6, IPPROTO_TCP, 64, &[0u8; 20]);
    assert_eq!(answer(&r, &tcp6, 0).0, Verdict::Ignore(IgnoreReason::Tcp));
    let cases = [
        (udp4(A4, [224, 0, 0, 251], b"mdns"), IgnoreReason::NotUnicast),
        (udp4(A4, [255, 255, 255, 255], b"x"), IgnoreReason::NotUnicast),
        (udp4(A4, [10, 9, 0, 255], b"x"), IgnoreReason::NotUnicast), // the /24's broadcast
        (udp4([0, 0, 0, 0], B4, b"dhcp"), IgnoreReason::NotUnicast),
        (udp4(B4, A4, b"x"), IgnoreReason::OwnAddress),
        (icmp4_echo(B4, A4), IgnoreReason::OwnAddress),
        (udp6(A6, [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xfb], b"mdns"), IgnoreReason::NotUnicast),
        (udp6([0; 16], B6, b"x"), IgnoreReason::NotUnicast),
        (udp6(B6, A6, b"x"), IgnoreReason::OwnAddress),
        (icmp6_message(A6, B6, 255, vec![icmpv6::ROUTER_SOLICIT, 0, 0, 0, 0, 0, 0, 0]), IgnoreReason::Other),
        (ipv4(A4, B4, 47, &[0u8; 8]), IgnoreReason::Other), // GRE
    ];
    for (i, (q, why)) in cases.into_iter().enumerate() {
        assert_eq!(answer(&r, &q, 0).0, Verdict::Ignore(why), "case {i}");
    }
    let mut fragment = udp4(A4, B4, b"frag");
    fragment[6] |= 0x20; // MF
    ipv4::Packet::new_unchecked(&mut fragment[..]).fill_checksum();
    assert_eq!(answer(&r, &fragment, 0).0, Verdict::Ignore(IgnoreReason::Other));
    let mut reply = icmp4_echo(A4, B4);
    reply[20] = icmp::ECHO_REPLY;
    assert_eq!(answer(&r, &reply, 0).0, Verdict::Ignore(IgnoreReason::Other));
    // A frame from a multicast MAC on TAP.
    let mut f = ethernet(DEFAULT_MAC, ethernet::ETHERTYPE_IPV4, &udp4(A4, B4, b"x"));
    f[6] = 0x01;
    assert_eq!(answer(&tap(), &f, 0).0, Verdict::Ignore(IgnoreReason::NotUnicast));
}

#[test]
fn test_malformed_headers() {
    let r = tun();
    let mut bad_sum = udp4(A4, B4, b"x");
    bad_sum[10] ^= 1;
    assert_eq!(answer(&r, &bad_sum, 0).0, Verdict::Malformed);
    let mut long_total = udp4(A4, B4, b"x");
    long_total[3] += 1;
    ipv4::Packet::new_unchecked(&mut long_total[..]).fill_checksum();
    assert_eq!(answer(&r, &long_total, 0).0, Verdict::Malformed);
    let mut long_payload = udp6(A6, B6, b"x");
    long_payload[5] += 1;
    assert_eq!(answer(&r, &long_payload, 0).0, Verdict::Malformed);
    assert_eq!(answer(&r, &[], 0).0, Verdict::Malformed);
    assert_eq!(answer(&tap(), &[0u8; 13], 0).0, Verdict::Malformed);
}

/// Every packet the tests build, framed for the responder that takes it.
fn corpus() -> Vec<(Responder, Vec<u8>)> {
    let ip = [
        icmp4_echo(A4, B4),
        udp4(A4, B4, b"hello"),
        icmp6_echo(A6, B6),
        udp6(A6, B6, b"hello"),
        ipv4(A4, B4, IPPROTO_TCP, &[0u8; 20]),
    ];
    let mut all: Vec<(Responder, Vec<u8>)> = ip.iter().map(|p| (tun(), p.clone())).collect();
    for p in &ip {
        let et = if p[0] >> 4 == 4 { ethernet::ETHERTYPE_IPV4 } else { ethernet::ETHERTYPE_IPV6 };
        all.push((tap(), ethernet(DEFAULT_MAC, et, p)));
    }
    all.push((tap(), arp_request(A4, B4)));
    all.push((tap(), ethernet([0x33; 6], ethernet::ETHERTYPE_IPV6, &solicitation(A6, B6, true))));
    all.push((tap(), ethernet([0x33; 6], ethernet::ETHERTYPE_IPV6, &solicitation(A6, B6, false))));
    all
}

#[test]
fn test_every_truncation_is_ignored_or_malformed() {
    for (r, p) in corpus() {
        for n in 0..p.len() {
            for room in [0, 8, 64] {
                let mut buf = p[..n].to_vec();
                buf.resize(n + room, 0);
                match r.answer(&mut buf, n) {
                    Verdict::Answer { len, .. } => assert!(
                        len <= buf.len() && len > n,
                        "a truncated packet answered only if the answer grew into the room ({n}, {len})"
                    ),
                    Verdict::Ignore(_) | Verdict::Malformed => {}
                }
            }
        }
    }
}

/// xorshift, so that the test needs no dependency and a failure reproduces.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn test_random_and_mutated_bytes_never_panic() {
    let corpus = corpus();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..200_000u32 {
        let (r, base) = &corpus[round as usize % corpus.len()];
        let mut buf: Vec<u8> = if round % 4 == 0 {
            // Random bytes of a random length, starting like an IP packet or an Ethernet frame now and then.
            let len = (next(&mut seed) % 200) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next(&mut seed) as u8).collect();
            if let Some(first) = b.first_mut() {
                *first = [0x45, 0x60, *first][round as usize % 3];
            }
            b
        } else {
            // A valid packet with a few bytes flipped, cut or lengthened.
            let mut b = base.clone();
            for _ in 0..1 + next(&mut seed) % 4 {
                let i = (next(&mut seed) as usize) % b.len();
                b[i] = next(&mut seed) as u8;
            }
            let len = match next(&mut seed) % 4 {
                0 => (next(&mut seed) as usize) % (b.len() + 1),
                1 => b.len() + (next(&mut seed) % 16) as usize,
                _ => b.len(),
            };
            b.resize(len, 0);
            b
        };
        let len = buf.len();
        let room = (next(&mut seed) % 40) as usize;
        buf.resize(len + room, 0);
        // A length beyond the buffer is clamped, never trusted.
        let claimed = if round % 7 == 0 { len + 1000 } else { len };
        if let Verdict::Answer { len: answer_len, .. } = r.answer(&mut buf, claimed) {
            assert!(answer_len <= buf.len(), "round {round}: answer of {answer_len} bytes in {}", buf.len());
        }
    }
}
