//! The kernel's GRO selftest (`tools/testing/selftests/net/gro.c`) case by case, in packets of our own: `Gro`
//! against the groups Linux 6.18 delivers and the reference model, with the documented differences.

mod common;

use common::{cfg, make_fragment_header, run_with, stream, tcp_bases, OFF};
use turbotun_wire::fuzzing::{payload, Spec};
use turbotun_wire::tcp::flags as tf;
use turbotun_wire::virtio_net::gso;
use turbotun_wire::{Checksums, Gro, Splitter, VirtioNetHdrRepr};

/// One case of the kernel's GRO selftest (`tools/testing/selftests/net/gro.c`), in packets of our own: the
/// groups Linux 6.18 delivers (`kernel`: which packets end up in which delivered packet) and the ones turbotun
/// writes (`turbotun`: the same, unless one of the documented differences applies).
struct Scenario {
    name: &'static str,
    pkts: Vec<Vec<u8>>,
    checksums: Checksums,
    kernel: Vec<Vec<usize>>,
    turbotun: Vec<Vec<usize>>,
}

fn groups(g: &[&[usize]]) -> Vec<Vec<usize>> {
    g.iter().map(|g| g.to_vec()).collect()
}

/// The selftest's cases for one TCP base (IPv4 or IPv6, any framing), with 1000-byte segments.
fn selftest_scenarios(b: &Spec) -> Vec<Scenario> {
    const P: usize = 1000;
    let same = |name, pkts, checksums, g: &[&[usize]]| Scenario {
        name,
        pkts,
        checksums,
        kernel: groups(g),
        turbotun: groups(g),
    };
    let built = |specs: &[Spec], lens: &[usize]| -> Vec<Vec<u8>> {
        specs.iter().zip(lens).enumerate().map(|(i, (s, &l))| s.build(&payload(l, i as u8))).collect()
    };
    // A stream of `lens`, with `change` applied to packet `at` (and only to it).
    let changed = |lens: &[usize], at: usize, change: &dyn Fn(&mut Spec)| {
        let (mut s, _) = stream(b, lens);
        change(&mut s[at]);
        built(&s, lens)
    };
    let valid = Checksums::Valid;
    let mut v = vec![
        same("data_same", stream(b, &[P, P]).1, valid, &[&[0, 1]]),
        same("data_lrg_sml", stream(b, &[P, P / 2]).1, valid, &[&[0, 1]]),
        same("data_lrg_1byte", stream(b, &[P, 1]).1, valid, &[&[0, 1]]),
        same("data_sml_lrg", stream(b, &[P / 2, P]).1, valid, &[&[0], &[1]]),
        same("ack", stream(b, &[0, 0, 0]).1, valid, &[&[0], &[1], &[2]]),
        same("flags_psh", changed(&[P; 5], 2, &|s| s.tcp_flags |= tf::PSH), valid, &[&[0, 1, 2], &[3, 4]]),
        same("flags_syn", changed(&[P; 5], 2, &|s| s.tcp_flags |= tf::SYN), valid, &[&[0, 1], &[2], &[3, 4]]),
        same("flags_rst", changed(&[P; 5], 2, &|s| s.tcp_flags |= tf::RST), valid, &[&[0, 1], &[2], &[3, 4]]),
        same("flags_urg", changed(&[P; 5], 2, &|s| s.tcp_flags |= tf::URG), valid, &[&[0, 1], &[2], &[3, 4]]),
        same("flags_cwr", changed(&[P; 4], 1, &|s| s.tcp_flags |= tf::CWR), valid, &[&[0], &[1], &[2, 3]]),
        same(
            "flags_cwr_twice",
            {
                let (mut s, _) = stream(b, &[P, P]);
                s.iter_mut().for_each(|s| s.tcp_flags |= tf::CWR);
                built(&s, &[P, P])
            },
            valid,
            &[&[0], &[1]],
        ),
        same("tcp_csum", changed(&[P, P], 1, &|s| s.bad_csum = true), Checksums::Unverified, &[&[0], &[1]]),
        same("tcp_seq", changed(&[P, P], 1, &|s| s.seq += 1), valid, &[&[0], &[1]]),
        same(
            "tcp_ts",
            {
                let (mut s, _) = stream(b, &[P; 4]);
                s[2].tcp_opts = vec![1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 2];
                s[3].tcp_opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 9];
                built(&s, &[P; 4])
            },
            valid,
            &[&[0, 1], &[2], &[3]],
        ),
        same(
            "tcp_opt",
            changed(&[P; 3], 2, &|s| s.tcp_opts = vec![1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 2]),
            valid,
            &[&[0, 1], &[2]],
        ),
        same("ip_ecn", changed(&[P, P], 1, &|s| s.tos ^= 2), valid, &[&[0], &[1]]),
        same("ip_tos", changed(&[P, P], 1, &|s| s.tos ^= 0x10), valid, &[&[0], &[1]]),
        same("single", stream(b, &[P]).1, valid, &[&[0]]),
    ];
    if b.v6 {
        let ext = Spec { v6_dest_opts: 1, ..b.clone() };
        v.push(same("ip_v6ext_same", stream(&ext, &[P, P]).1, valid, &[&[0, 1]]));
        let (mut s, _) = stream(&ext, &[P, P]);
        s[1].v6_opts_fill = 9;
        v.push(same("ip_v6ext_diff", built(&s, &[P, P]), valid, &[&[0], &[1]]));
        let (s, mut p) = stream(&Spec { v6_dest_opts: 1, ..b.clone() }, &[P; 4]);
        let plain = stream(b, &[P; 4]).1;
        make_fragment_header(&mut p[2], &s[2]);
        v.push(same(
            "ip_frag6",
            vec![plain[0].clone(), plain[1].clone(), p[2].clone(), plain[3].clone()],
            valid,
            &[&[0, 1], &[2], &[3]],
        ));
    } else {
        v.push(same("ip_ttl", changed(&[P, P], 1, &|s| s.ttl -= 1), valid, &[&[0], &[1]]));
        let mut p = stream(b, &[P; 3]).1;
        p[1][b.l2_len() + 10] ^= 1; // the IPv4 header checksum
        v.push(same("ip_csum", p, valid, &[&[0], &[1], &[2]]));
        v.push(same("ip_opt", changed(&[P; 3], 1, &|s| s.ip_opts = vec![1, 1, 1, 0]), valid, &[&[0], &[1], &[2]]));
        v.push(same("ip_frag4", changed(&[P, P], 1, &|s| s.mf = true), valid, &[&[0], &[1]]));
        let ids = |df: bool, ids: &[u16]| {
            let (mut s, _) = stream(b, &vec![P; ids.len()]);
            for (s, &id) in s.iter_mut().zip(ids) {
                (s.df, s.ip_id) = (df, id);
            }
            built(&s, &vec![P; ids.len()])
        };
        v.push(same("ip_id_df1_inc", ids(true, &[8, 9]), valid, &[&[0, 1]]));
        v.push(same("ip_id_df1_fixed", ids(true, &[8, 8]), valid, &[&[0, 1]]));
        v.push(same("ip_id_df0_inc", ids(false, &[8, 9]), valid, &[&[0, 1]]));
        // Issue 30, item 3: Linux 6.18 merges a fixed ID with DF clear; turbotun refuses, on purpose.
        v.push(Scenario {
            name: "ip_id_df0_fixed",
            pkts: ids(false, &[8, 8]),
            checksums: valid,
            kernel: groups(&[&[0, 1]]),
            turbotun: groups(&[&[0], &[1]]),
        });
        v.push(same("ip_id_df1_inc_fixed", ids(true, &[8, 9, 9]), valid, &[&[0, 1], &[2]]));
        v.push(same("ip_id_df1_fixed_inc", ids(true, &[8, 8, 9]), valid, &[&[0, 1], &[2]]));
    }
    // large_max: the merged IP packet stops short of 65,535 bytes; the segment that would pass it starts anew.
    let per = (65535 - (b.hdr_len() - b.l2_len())) / 1448;
    let n = per + 2;
    let first: Vec<usize> = (0..per).collect();
    let rest: Vec<usize> = (per..n).collect();
    v.push(same("large_max", stream(b, &vec![1448; n]).1, valid, &[&first, &rest]));
    v
}

/// The kernel's GRO selftest, case by case: `Gro` writes the groups turbotun is meant to (the kernel's, but for
/// the documented differences), and the reference model makes the kernel's groups with no differences and
/// turbotun's with them. TCP over IPv4 and IPv6, IP and Ethernet framing, copy and gather mode, with and
/// without the fast path.
#[test]
fn kernel_selftest_scenarios() {
    use turbotun_wire::fuzzing::{groups_of, reference_groups, reference_groups_with, Differences};
    for b in tcp_bases() {
        for sc in selftest_scenarios(&b) {
            let what = format!("{} ({:?}, v6 {}, {} VLAN tags)", sc.name, b.framing, b.v6, b.vlans);
            let refs: Vec<&[u8]> = sc.pkts.iter().map(Vec::as_slice).collect();
            let config = cfg(b.framing);
            let kernel = reference_groups_with(&refs, &config, 64, sc.checksums, &Differences::NONE);
            assert_eq!(kernel, sc.kernel, "the model as Linux 6.18: {what}");
            assert_eq!(
                reference_groups(&refs, &config, 64, sc.checksums),
                sc.turbotun,
                "the model as turbotun: {what}"
            );
            for (fast, gather) in [(true, true), (false, true), (true, false), (false, false)] {
                let mut gro = Gro::new(config).with_fast_path(fast).with_gather(gather);
                let r = run_with(&mut gro, &sc.pkts, sc.checksums == Checksums::Valid, 65535);
                let got = if gather {
                    groups_of(&gro, &r.to_write, &r.lens, OFF)
                } else {
                    // Copy mode: the groups' heads, each with as many segments as its virtio header says.
                    let mut seen = Vec::new();
                    for &i in &r.to_write {
                        let hdr = VirtioNetHdrRepr::parse(&r.bufs[i][OFF - 10..OFF]).unwrap();
                        let segs = if hdr.gso_type == gso::NONE {
                            1
                        } else {
                            Splitter::new(&hdr, &r.bufs[i][OFF..OFF + r.lens[i]], b.framing).unwrap().segment_count()
                        };
                        seen.push((i, segs));
                    }
                    let want_shape: Vec<(usize, usize)> = sc.turbotun.iter().map(|g| (g[0], g.len())).collect();
                    assert_eq!(seen, want_shape, "copy mode, fast path {fast}: {what}");
                    continue;
                };
                assert_eq!(got, sc.turbotun, "gather mode, fast path {fast}: {what}");
            }
        }
    }
}
