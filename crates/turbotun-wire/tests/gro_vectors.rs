//! Table-driven GRO vectors after the kernel's `tools/testing/selftests/net/gro.c` scenarios (plus OFFLOAD.md's
//! stricter rules), for TCP and UDP, IPv4 and IPv6, raw IP and Ethernet framing. Every merged packet is split
//! again and compared byte for byte with the inputs it absorbed; every unmerged packet must be unchanged with a
//! zeroed virtio header.

mod common;

use common::*;
use turbotun_wire::fuzzing::{checksums_ok, payload, Spec};
use turbotun_wire::tcp::flags as tf;
use turbotun_wire::virtio_net::gso;
use turbotun_wire::{Batch, Framing, Gro, GroConfig, Splitter, VirtioNetHdrRepr};

#[test]
fn data_same_size() {
    for b in all_bases() {
        let (_, p) = stream(&b, &[1000, 1000, 1000, 1000]);
        let r = check(b.framing, &p, &[&[0, 1, 2, 3]]);
        let hdr = VirtioNetHdrRepr::parse(&r.bufs[0][OFF - 10..OFF]).unwrap();
        let want_type = match (b.udp, b.v6) {
            (true, _) => gso::UDP_L4,
            (false, false) => gso::TCPV4,
            (false, true) => gso::TCPV6,
        };
        assert_eq!(hdr.gso_type, want_type);
        assert_eq!(hdr.gso_size, 1000);
        assert_eq!(hdr.hdr_len as usize, b.hdr_len());
        assert_eq!(hdr.csum_start as usize, b.l4_offset());
        assert_eq!(hdr.csum_offset, if b.udp { 6 } else { 16 });
        assert_eq!(r.lens[0], b.hdr_len() + 4000);
    }
}

#[test]
fn data_short_last() {
    for b in all_bases() {
        let (_, p) = stream(&b, &[1000, 1000, 300]);
        check(b.framing, &p, &[&[0, 1, 2]]);
    }
}

#[test]
fn data_larger_last_and_short_middle() {
    for b in all_bases() {
        let (_, p) = stream(&b, &[1000, 1000, 1200]);
        check(b.framing, &p, &[&[0, 1], &[2]]);
        // Nothing goes after a short segment.
        let (_, p) = stream(&b, &[1000, 500, 1000]);
        check(b.framing, &p, &[&[0, 1], &[2]]);
    }
}

#[test]
fn pure_acks_are_not_coalesced() {
    for b in tcp_bases() {
        let (_, p) = stream(&b, &[0, 0, 0]);
        check(b.framing, &p, &[&[0], &[1], &[2]]);
        // A pure ACK of the flow between data segments reaches TCP, fails to merge and completes the item (as
        // tcp_gro_receive does): the next segment starts a new one.
        let (_, mut p) = stream(&b, &[1000, 1000, 1000]);
        p.insert(1, b.next_seg(1000).build(&[]));
        check(b.framing, &p, &[&[0], &[1], &[2, 3]]);
    }
}

#[test]
fn flags_psh() {
    for b in tcp_bases() {
        // PSH on the last segment merges and is carried by the super-packet (only the last segment gets it back).
        let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
        s[2].tcp_flags |= tf::PSH;
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 1))).collect();
        let r = check(b.framing, &p, &[&[0, 1, 2]]);
        assert_eq!(r.bufs[0][OFF + b.l4_offset() + 13], tf::ACK | tf::PSH);
        // Nothing is appended after PSH.
        let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
        s[1].tcp_flags |= tf::PSH;
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 1))).collect();
        check(b.framing, &p, &[&[0, 1], &[2]]);
    }
}

#[test]
fn flags_syn_rst_urg_cwr_fin_ece() {
    for b in tcp_bases() {
        for (f, groups) in [
            // A flag in the compared part of the flag word completes the item; SYN, RST and URG are never held.
            (tf::SYN, &[&[0][..], &[1], &[2]][..]),
            (tf::RST, &[&[0], &[1], &[2]]),
            (tf::URG, &[&[0], &[1], &[2]]),
            // ECE differs from the head's: it completes the item and starts one, which the next (no ECE) does
            // not join either.
            (tf::ECE, &[&[0], &[1], &[2]]),
            // CWR is kept alone (Linux 6.17 and later): see `cwr_segments_are_kept_alone`.
            (tf::CWR, &[&[0], &[1], &[2]]),
            // FIN merges as the last segment, like PSH: nothing after it.
            (tf::FIN, &[&[0, 1], &[2]]),
        ] {
            let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
            s[1].tcp_flags |= f;
            let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 2))).collect();
            check(b.framing, &p, groups);
        }
        // ECE on every segment of a stream merges (the flag words are equal).
        let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
        s.iter_mut().for_each(|s| s.tcp_flags |= tf::ECE);
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 2))).collect();
        check(b.framing, &p, &[&[0, 1, 2]]);
    }
}

/// A window update on a later segment completes the item (the window is part of the kernel's flag word): it
/// is never lost in a merged packet. Found by review: two contiguous segments with windows 100 and 200 came out
/// as one packet with window 100.
#[test]
fn a_window_change_is_never_merged_away() {
    for b in tcp_bases() {
        let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
        s[0].window = 100;
        s[1].window = 200;
        s[2].window = 200;
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 2))).collect();
        for fast in [true, false] {
            let mut gro = Gro::new(cfg(b.framing)).with_fast_path(fast);
            let r = check_opts(&mut gro, b.framing, &p, &[&[0], &[1, 2]], true, false);
            let hdr = VirtioNetHdrRepr::parse(&r.bufs[1][OFF - 10..OFF]).unwrap();
            let s = Splitter::new(&hdr, &r.bufs[1][OFF..OFF + r.lens[1]], b.framing).unwrap();
            let seg = s.segment_view(1).unwrap().to_vec();
            let window = &seg[b.l4_offset() + 14..b.l4_offset() + 16];
            assert_eq!(window, 200u16.to_be_bytes(), "the update is in the written packet");
        }
    }
}

/// Issue 30, item 1. Linux 6.18 keeps every segment with CWR set alone (`tcp_gro_receive` compares CWR with the
/// rest of the flag word and never merges a CWR segment): normal, CWR, normal, normal arrives as 1, 1, 2
/// segments; CWR, CWR as 1, 1. No merged packet carries the ECN bit. Before: the CWR segment headed an item that
/// the segments after it joined, written with `VIRTIO_NET_HDR_GSO_ECN`.
#[test]
fn cwr_segments_are_kept_alone() {
    let cases: [(&[bool], &[&[usize]]); 4] = [
        (&[false, true, false, false], &[&[0], &[1], &[2, 3]]),
        (&[true, true], &[&[0], &[1]]),
        (&[true, false, false], &[&[0], &[1, 2]]),
        (&[false, false, true, true, false], &[&[0, 1], &[2], &[3], &[4]]),
    ];
    for b in tcp_bases() {
        for (cwr, groups) in cases {
            let (mut s, _) = stream(&b, &vec![1000; cwr.len()]);
            for (spec, &on) in s.iter_mut().zip(cwr) {
                if on {
                    spec.tcp_flags |= tf::CWR;
                }
            }
            let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 2))).collect();
            for (valid, fast) in [(false, false), (true, false), (true, true)] {
                let mut gro = Gro::new(cfg(b.framing)).with_fast_path(fast);
                let r = check_opts(&mut gro, b.framing, &p, groups, valid, false);
                for &i in &r.to_write {
                    let hdr = VirtioNetHdrRepr::parse(&r.bufs[i][OFF - 10..OFF]).unwrap();
                    assert_eq!(hdr.gso_type & gso::ECN, 0, "{b:?} {cwr:?}");
                }
            }
        }
    }
}

#[test]
fn bad_checksum_passes_through() {
    for b in all_bases() {
        for bad in 0..3 {
            let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
            s[bad].bad_csum = true;
            let p: Vec<Vec<u8>> = s.iter().enumerate().map(|(i, s)| s.build(&payload(1000, i as u8))).collect();
            let groups: Vec<&[usize]> = match (bad, b.udp) {
                (0, _) => vec![&[0], &[1, 2]],
                // A packet that fails verification leaves its flow's item open, as in the kernel: an IPv6 UDP
                // packet 2 joins 0; over IPv4 its ID skips one, and TCP packet 2 does not continue 0.
                (1, true) if b.v6 => vec![&[0, 2], &[1]],
                (1, _) => vec![&[0], &[1], &[2]],
                // Packet 1 merged into 0 before packet 2 failed verification.
                (_, _) => vec![&[0, 1], &[2]],
            };
            let r = check(b.framing, &p, &groups);
            assert_eq!(r.stats.bad_checksum, 1, "{b:?} bad {bad}");
        }
    }
}

#[test]
fn checksums_valid_skips_verification() {
    for b in all_bases() {
        let (mut s, _) = stream(&b, &[1000, 1000]);
        s[1].bad_csum = true;
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 0))).collect();
        let r = run_with(&mut Gro::new(cfg(b.framing)), &p, true, 65535);
        assert_eq!(r.to_write, vec![0]);
        assert_eq!(r.stats.bad_checksum, 0);
    }
}

#[test]
fn seq_gap_and_reordering() {
    for b in tcp_bases() {
        let (_, p) = stream(&b, &[1000, 1000, 1000, 1000]);
        // Gap: 0, 2 (1 missing).
        check(b.framing, &[p[0].clone(), p[2].clone()], &[&[0], &[1]]);
        // Reversed pair: the kernel never prepends; the earlier segment completes the later one's item.
        check(b.framing, &[p[1].clone(), p[0].clone()], &[&[0], &[1]]);
        // 1, 0, 2: 0 closed 1's item, and 2 does not continue 0.
        check(b.framing, &[p[1].clone(), p[0].clone(), p[2].clone()], &[&[0], &[1], &[2]]);
        // A gap closes the item even if a later packet would have continued it: 0, 2, 1.
        check(b.framing, &[p[0].clone(), p[2].clone(), p[1].clone()], &[&[0], &[1], &[2]]);
        // Retransmission of the same segment.
        check(b.framing, &[p[0].clone(), p[0].clone()], &[&[0], &[1]]);
    }
}

#[test]
fn timestamp_and_option_changes() {
    for b in tcp_bases() {
        let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
        s[1].tcp_opts = vec![1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 2]; // TSval changed
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 4))).collect();
        check(b.framing, &p, &[&[0], &[1], &[2]]);
        let (mut s, _) = stream(&b, &[1000, 1000]);
        s[1].tcp_opts = vec![1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 2]; // different option bytes, same length
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 4))).collect();
        check(b.framing, &p, &[&[0], &[1]]);
        let (mut s, _) = stream(&b, &[1000, 1000]);
        s[1].tcp_opts = vec![]; // different header length
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 4))).collect();
        check(b.framing, &p, &[&[0], &[1]]);
        // Max-size options (40 bytes) still coalesce.
        let mut big = b.clone();
        big.tcp_opts = [[1u8, 1, 1, 1]; 10].concat();
        let (_, p) = stream(&big, &[1000, 1000]);
        check(b.framing, &p, &[&[0, 1]]);
    }
}

#[test]
fn an_ack_number_change_completes_the_item() {
    for b in tcp_bases() {
        let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
        s[1].ack += 1;
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 5))).collect();
        check(b.framing, &p, &[&[0], &[1], &[2]]);
    }
}

#[test]
fn ip_ecn_tos_ttl_flow_label_changes() {
    for b in all_bases() {
        let muts: [fn(&mut Spec); 4] = [
            |s| s.tos = 1,    // ECN ECT(1)
            |s| s.tos = 3,    // ECN CE
            |s| s.tos = 0x10, // DSCP
            |s| s.ttl = 63,
        ];
        for m in &muts {
            let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
            m(&mut s[1]);
            let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 6))).collect();
            // UDP: packet 2 may not skip the newest item (packet 1), so nothing merges; TCP: sequence gap.
            check(b.framing, &p, &[&[0], &[1], &[2]]);
        }
        if b.v6 {
            let (mut s, _) = stream(&b, &[1000, 1000]);
            s[1].flow_label = 7;
            let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 6))).collect();
            check(b.framing, &p, &[&[0], &[1]]);
        }
    }
}

#[test]
fn ip_options_and_fragments_are_not_candidates() {
    for b in all_bases() {
        let (_, p) = if b.v6 {
            let (s, mut p) = stream(&Spec { v6_dest_opts: 1, ..b.clone() }, &[1000, 1000]);
            for pkt in &mut p {
                make_fragment_header(pkt, &s[0]);
            }
            (s, p)
        } else {
            stream(&Spec { ip_opts: vec![1, 1, 1, 0], ..b.clone() }, &[1000, 1000])
        };
        check(b.framing, &p, &[&[0], &[1]]);
        if !b.v6 {
            let mut f = b.clone();
            f.mf = true;
            let (_, p) = stream(&f, &[1000, 1000]);
            check(b.framing, &p, &[&[0], &[1]]);
        }
    }
}

/// Rewrites the first extension header of `pkt` (built from `spec` with `v6_dest_opts >= 1`, an 8-byte
/// destination-options header) as another 8-byte header of type `kind` with `body` after its next-header and
/// length bytes. Extension headers are not covered by the transport checksum.
fn rewrite_extension_header(pkt: &mut [u8], spec: &Spec, kind: u8, body: [u8; 6]) {
    let l3 = spec.l2_len();
    pkt[l3 + 6] = kind;
    pkt[l3 + 42..l3 + 48].copy_from_slice(&body);
}

/// Issue 30, item 2. The kernel walks hop-by-hop, routing and destination-options headers
/// (`ipv6_gro_receive`) and merges segments whose extension headers are byte for byte the same; different ones
/// are different flows (the first item stays open for its own segments). Before: any extension header stopped
/// the packet before the transport layer, and nothing merged.
#[test]
fn ipv6_identical_extension_headers_merge() {
    const DEST_OPTS: u8 = 60;
    const PAD: [u8; 6] = [1, 4, 0, 0, 0, 0];
    for b in all_bases().into_iter().filter(|s| s.v6) {
        for (kind, body) in [(DEST_OPTS, PAD), (0, PAD), (43, [0, 0, 0, 0, 0, 0]), (43, [4, 0, 0, 0, 0, 0])] {
            for headers in [1, 2] {
                let spec = Spec { v6_dest_opts: headers, ..b.clone() };
                let (_, mut p) = stream(&spec, &[1000, 1000, 600]);
                p.iter_mut().for_each(|pkt| rewrite_extension_header(pkt, &spec, kind, body));
                let r = check(b.framing, &p, &[&[0, 1, 2]]);
                let hdr = VirtioNetHdrRepr::parse(&r.bufs[0][OFF - 10..OFF]).unwrap();
                assert_eq!(usize::from(hdr.csum_start), spec.l4_offset(), "{spec:?}");
            }
        }
        // Different option bytes: another flow. The first item stays open and takes its next segment.
        let spec = Spec { v6_dest_opts: 1, ..b.clone() };
        let (_, mut p) = stream(&spec, &[1000, 1000, 1000]);
        rewrite_extension_header(&mut p[1], &spec, DEST_OPTS, [1, 4, 0, 0, 0, 9]);
        if b.udp {
            // Packet 1 heads an item of its own flow (no barrier: it reached the transport layer), so packet 2
            // still joins packet 0.
            check(b.framing, &p, &[&[0, 2], &[1]]);
        } else {
            // Packet 2 continues packet 0's sequence (packet 1 carried the bytes between, in another flow).
            let (_, q) = stream(&spec, &[1000, 1000]);
            let mut other = q[1].clone();
            rewrite_extension_header(&mut other, &spec, DEST_OPTS, [1, 4, 0, 0, 0, 9]);
            check(b.framing, &[q[0].clone(), other, q[1].clone()], &[&[0, 2], &[1]]);
            check(b.framing, &p[..2], &[&[0], &[1]]);
        }
        // A routing header with segments left stops the packet (its checksum covers another destination).
        let (_, mut p) = stream(&spec, &[1000, 1000]);
        for pkt in &mut p {
            rewrite_extension_header(pkt, &spec, 43, [0, 1, 0, 0, 0, 0]);
        }
        check(b.framing, &p, &[&[0], &[1]]);
    }
}

#[test]
fn ipv4_id_rules() {
    let bases: Vec<Spec> = all_bases().into_iter().filter(|s| !s.v6).collect();
    for b in bases {
        let build = |df: bool, ids: [u16; 3]| -> Vec<Vec<u8>> {
            let (mut s, _) = stream(&b, &[1000, 1000, 1000]);
            for (x, id) in s.iter_mut().zip(ids) {
                x.df = df;
                x.ip_id = id;
            }
            s.iter().map(|s| s.build(&payload(1000, 7))).collect()
        };
        let mut g = Gro::new(cfg(b.framing));
        // DF set, incrementing: merge.
        check_opts(&mut g, b.framing, &build(true, [5, 6, 7]), &[&[0, 1, 2]], false, false);
        // DF clear, incrementing: merge.
        check_opts(&mut g, b.framing, &build(false, [5, 6, 7]), &[&[0, 1, 2]], false, false);
        // DF set, fixed: merge (IDs are not restored by the split).
        check_opts(&mut g, b.framing, &build(true, [5, 5, 5]), &[&[0, 1, 2]], false, true);
        // DF clear, fixed: no merge.
        let exp: &[&[usize]] = &[&[0], &[1], &[2]];
        check_opts(&mut g, b.framing, &build(false, [5, 5, 5]), exp, false, false);
        // Incrementing then fixed, fixed then incrementing: the mode may not change.
        check_opts(&mut g, b.framing, &build(true, [5, 6, 6]), &[&[0, 1], &[2]], false, false);
        check_opts(&mut g, b.framing, &build(true, [5, 5, 6]), &[&[0, 1], &[2]], false, true);
        // Random IDs: no merge.
        check_opts(&mut g, b.framing, &build(true, [5, 900, 17]), &[&[0], &[1], &[2]], false, false);
        // ID wrap-around increments.
        check_opts(&mut g, b.framing, &build(false, [0xffff, 0, 1]), &[&[0, 1, 2]], false, false);
        // DF differs: no merge.
        let (mut s, _) = stream(&b, &[1000, 1000]);
        s[1].df = false;
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 7))).collect();
        check_opts(&mut g, b.framing, &p, &[&[0], &[1]], false, false);
    }
}

#[test]
fn large_max_size() {
    for b in all_bases() {
        let n = 50;
        let (_, p) = stream(&b, &vec![1448; n]);
        let per = (65535 - b.hdr_len()) / 1448;
        let first: Vec<usize> = (0..per).collect();
        let second: Vec<usize> = (per..n).collect();
        let max = if b.udp { 64 } else { usize::MAX };
        assert!(per <= max);
        let r = check(b.framing, &p, &[&first, &second]);
        assert!(r.lens[0] <= 65535);
        assert!(r.lens[0] + 1448 > 65535);
    }
}

#[test]
fn udp_segment_cap_is_configurable() {
    for b in all_bases().into_iter().filter(|s| s.udp) {
        let (_, p) = stream(&b, &[100; 10]);
        let mut g = Gro::new(cfg(b.framing)).with_udp_max_segments(4);
        assert_eq!(g.udp_max_segments(), 4);
        check_opts(&mut g, b.framing, &p, &[&[0, 1, 2, 3], &[4, 5, 6, 7], &[8, 9]], false, false);
        let (_, p) = stream(&b, &[100; 70]);
        let all: Vec<usize> = (0..64).collect();
        let rest: Vec<usize> = (64..70).collect();
        check(b.framing, &p, &[&all, &rest]);
    }
}

#[test]
fn udp_merges_only_onto_newest_item() {
    for b in all_bases().into_iter().filter(|s| s.udp) {
        // A, B (different TTL), C like A: C must not jump over B onto A.
        let (mut s, _) = stream(&b, &[100, 100, 100, 100]);
        s[1].ttl = 1;
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(100, 8))).collect();
        check(b.framing, &p, &[&[0], &[1], &[2, 3]]);
    }
}

#[test]
fn udp_zero_checksum() {
    for b in all_bases().into_iter().filter(|s| s.udp) {
        let mut z = b.clone();
        z.udp_zero_csum = true;
        let (_, p) = stream(&z, &[500, 500, 500]);
        if b.v6 {
            // IPv6 forbids checksum 0: invalid, passes through unmerged.
            let r = check(b.framing, &p, &[&[0], &[1], &[2]]);
            assert_eq!(r.stats.bad_checksum, 2);
        } else {
            // IPv4 "no checksum" is valid and coalesces (stricter-than-peer rule); the split adds real checksums.
            let r = run_with(&mut Gro::new(cfg(b.framing)), &p, false, 65535);
            assert_eq!(r.to_write, vec![0]);
            let hdr = VirtioNetHdrRepr::parse(&r.bufs[0][OFF - 10..OFF]).unwrap();
            let s = Splitter::new(&hdr, &r.bufs[0][OFF..OFF + r.lens[0]], b.framing).unwrap();
            assert_eq!(s.segment_count(), 3);
            for (k, want) in p.iter().enumerate() {
                let seg = s.segment_view(k).unwrap().to_vec();
                assert!(checksums_ok(&seg, b.framing));
                assert_eq!(seg[b.hdr_len()..], want[b.hdr_len()..]);
            }
        }
    }
}

#[test]
fn disabled_kinds_pass_through() {
    for b in all_bases() {
        let (_, p) = stream(&b, &[1000, 1000]);
        let c = GroConfig { tcp: b.udp, udp: !b.udp, framing: b.framing, vnet_hdr_len: 10 };
        check_opts(&mut Gro::new(c), b.framing, &p, &[&[0], &[1]], false, false);
    }
}

#[test]
fn interleaved_flows() {
    for b in all_bases() {
        let mut other = b.clone();
        other.sport += 1;
        let (_, a) = stream(&b, &[1000, 1000, 1000]);
        let (_, o) = stream(&other, &[1000, 1000, 1000]);
        let p = vec![a[0].clone(), o[0].clone(), a[1].clone(), o[1].clone(), a[2].clone(), o[2].clone()];
        check(b.framing, &p, &[&[0, 2, 4], &[1, 3, 5]]);
    }
}

#[test]
fn ethernet_headers_must_match() {
    for b in all_bases().into_iter().filter(|s| s.framing == Framing::Ethernet) {
        let (mut s, _) = stream(&b, &[1000, 1000]);
        s[1].mac_src = [2, 0, 0, 0, 0, 9];
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 9))).collect();
        check(b.framing, &p, &[&[0], &[1]]);
        let (mut s, _) = stream(&b, &[1000, 1000]);
        s[1].vlans = if b.vlans == 0 { 1 } else { 0 };
        let p: Vec<Vec<u8>> = s.iter().map(|s| s.build(&payload(1000, 9))).collect();
        check(b.framing, &p, &[&[0], &[1]]);
    }
}

#[test]
fn non_ip_and_garbage_pass_through() {
    let arp = {
        let mut f = vec![0xffu8; 6];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        f.extend_from_slice(&[0u8; 28]);
        f
    };
    let (_, p) = stream(&Spec::tcp4().with_framing(Framing::Ethernet, 0), &[100, 100]);
    let pkts = vec![arp.clone(), p[0].clone(), vec![], vec![0x45], p[1].clone(), arp];
    check(Framing::Ethernet, &pkts, &[&[0], &[1, 4], &[2], &[3], &[5]]);
}

#[test]
fn buffer_without_room_is_not_merged() {
    let b = Spec::tcp4();
    let (_, p) = stream(&b, &[1000, 1000]);
    let r = run_with(&mut Gro::new(cfg(Framing::Ip)), &p, false, 0);
    assert_eq!(r.to_write, vec![0, 1]);
    assert_eq!(r.stats.coalesced, 0);
    assert!(r.bufs.iter().all(|b| b[OFF - 10..OFF] == [0; 10]));
}

#[test]
fn bad_offset_and_lengths_are_reported_not_panicking() {
    let (_, p) = stream(&Spec::tcp4(), &[1000, 1000]);
    let mut bufs: Vec<Vec<u8>> = p.clone();
    let mut lens = vec![1000 + 52, 5000];
    let mut tw = Vec::new();
    let st = Gro::new(cfg(Framing::Ip)).coalesce(&mut Batch::new(&mut bufs, &mut lens, 0), false, &mut tw);
    assert_eq!(tw, vec![0, 1]);
    assert_eq!(st.malformed, 2);
    assert_eq!(bufs, p);
    // lens shorter than bufs: only the first lens.len() packets are considered.
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 100]; 3];
    let st = Gro::new(cfg(Framing::Ip)).coalesce(&mut Batch::new(&mut bufs, &mut [10], 10), false, &mut tw);
    assert_eq!((st.packets, tw.len()), (1, 1));
}

#[test]
fn vnet_header_sizes_12_and_20() {
    for vlen in [12usize, 20] {
        let b = Spec::tcp6();
        let (_, p) = stream(&b, &[1000, 1000]);
        let mut bufs: Vec<Vec<u8>> = p
            .iter()
            .map(|x| {
                let mut v = vec![0xaau8; 24 + 65535];
                v[24..24 + x.len()].copy_from_slice(x);
                v
            })
            .collect();
        let mut lens: Vec<usize> = p.iter().map(|x| x.len()).collect();
        let mut tw = Vec::new();
        let c = GroConfig { vnet_hdr_len: vlen, ..cfg(Framing::Ip) };
        Gro::new(c).coalesce(&mut Batch::new(&mut bufs, &mut lens, 24), false, &mut tw);
        assert_eq!(tw, vec![0]);
        let h = &bufs[0][24 - vlen..24];
        assert_eq!(VirtioNetHdrRepr::parse(h).unwrap().gso_type, gso::TCPV6);
        assert!(h[10..].iter().all(|&x| x == 0), "num_buffers/hash zeroed");
        assert!(bufs[0][..24 - vlen].iter().all(|&x| x == 0xaa), "nothing before the header touched");
    }
}

#[test]
fn engine_reuse_gives_same_result() {
    let b = Spec::tcp4();
    let (_, p) = stream(&b, &[1000; 8]);
    let mut g = Gro::new(cfg(Framing::Ip));
    for _ in 0..3 {
        check_opts(&mut g, Framing::Ip, &p, &[&[0, 1, 2, 3, 4, 5, 6, 7]], false, false);
    }
}

#[test]
fn merged_pseudo_header_in_checksum_field() {
    use turbotun_wire::checksum;
    for b in all_bases() {
        let (_, p) = stream(&b, &[1000, 1000]);
        let r = check(b.framing, &p, &[&[0, 1]]);
        let out = &r.bufs[0][OFF..OFF + r.lens[0]];
        let l4 = b.l4_offset();
        let l4_len = (out.len() - l4) as u32;
        let proto = if b.udp { 17 } else { 6 };
        let ps = if b.v6 {
            checksum::pseudo_header_v6(b.src6, b.dst6, proto, l4_len)
        } else {
            checksum::pseudo_header_v4(b.src4, b.dst4, proto, l4_len)
        };
        let at = l4 + if b.udp { 6 } else { 16 };
        assert_eq!(u16::from_be_bytes([out[at], out[at + 1]]), checksum::fold(ps));
        // Completing the partial checksum as the kernel would gives a valid packet.
        let mut full = out.to_vec();
        checksum::complete_partial(&mut full, l4, at - l4).unwrap();
        assert!(checksums_ok(&full, b.framing));
    }
}

/// A packet of the same addresses that cannot merge (a fragment of a larger datagram) is a barrier for UDP: a later datagram may not join a head written before it, or it would overtake it.
#[test]
fn a_packet_that_cannot_merge_is_a_barrier_for_udp() {
    for b in all_bases().into_iter().filter(|s| s.udp) {
        let mut barrier = b.clone();
        if b.v6 {
            barrier.v6_dest_opts = 1;
        } else {
            barrier.mf = true;
        }
        let (_, mut p) = stream(&b, &[1000, 600]);
        let (_, mut mid) = stream(&barrier, &[700]);
        if b.v6 {
            make_fragment_header(&mut mid[0], &barrier);
        }
        p.insert(1, mid[0].clone());
        // Without the barrier the 600-byte packet (a short last segment) would join the first.
        check(b.framing, &p, &[&[0], &[1], &[2]]);
    }
}

/// Bytes between two UDP datagrams whose IP header is no header (here an IPv4 header length of 16 bytes, the
/// input the property test found) name no addresses, so they are no barrier: the kernel's `inet_gro_receive` passes
/// such a packet on before it looks at any held packet, and the datagrams around it merge.
#[test]
fn a_broken_ip_header_is_no_barrier_for_udp() {
    for b in all_bases().into_iter().filter(|s| s.udp && !s.v6) {
        let (_, mut p) = stream(&b, &[1000, 1000]);
        let mut broken = p[0].clone();
        let l3 = b.l4_offset() - 20 - b.ip_opts.len();
        broken[l3] = 0x44;
        broken.truncate(l3 + 20);
        p.insert(1, broken);
        check(b.framing, &p, &[&[0, 2], &[1]]);
    }
}
