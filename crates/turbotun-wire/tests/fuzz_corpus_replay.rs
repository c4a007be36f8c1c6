//! Replays every file of `fuzz/corpus/<target>/` through the same entry functions the cargo-fuzz targets use, so
//! the corpus (seeds plus anything the fuzzer found) stays green in a normal `cargo test`.
//!
//! `cargo test -p turbotun-wire --test fuzz_corpus_replay -- --ignored` regenerates the seed files.

use std::fs;
use std::path::PathBuf;
use turbotun_wire::fuzzing::{self, payload, Spec, TunnelSpec, GENEVE_HEADER};
use turbotun_wire::virtio_net::{flags, gso};
use turbotun_wire::{Framing, VirtioNetHdrRepr};

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

fn replay(target: &str, f: fn(&[u8])) -> usize {
    let dir = corpus_dir(target);
    let mut n = 0;
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let data = fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        f(&data);
        n += 1;
    }
    n
}

#[test]
fn replay_parse_headers() {
    assert!(replay("parse_headers", fuzzing::parse_headers) >= 10);
}

#[test]
fn replay_gso_split() {
    assert!(replay("gso_split", fuzzing::gso_split) >= 10);
}

#[test]
fn replay_udp_tunnel_split() {
    assert!(replay("udp_tunnel_split", fuzzing::udp_tunnel_split) >= 10);
}

#[test]
fn replay_gro_coalesce() {
    assert!(replay("gro_coalesce", fuzzing::gro_coalesce) >= 10);
}

#[test]
fn replay_gro_model() {
    assert!(replay("gro_model", fuzzing::gro_model) >= 10);
}

fn specs() -> Vec<(String, Spec)> {
    let mut v = Vec::new();
    for (name, base) in [("tcp4", Spec::tcp4()), ("tcp6", Spec::tcp6()), ("udp4", Spec::udp4()), ("udp6", Spec::udp6())]
    {
        for (fname, f, vl) in [("ip", Framing::Ip, 0), ("eth", Framing::Ethernet, 0), ("vlan", Framing::Ethernet, 1)] {
            v.push((format!("{name}_{fname}"), base.clone().with_framing(f, vl)));
        }
    }
    v
}

fn framing_byte(f: Framing) -> u8 {
    if f == Framing::Ethernet {
        1
    } else {
        0
    }
}

#[test]
#[ignore = "writes the seed corpus; run explicitly"]
fn generate_seed_corpus() {
    let write = |target: &str, name: &str, data: &[u8]| {
        let dir = corpus_dir(target);
        fs::create_dir_all(&dir).expect("mkdir");
        fs::write(dir.join(format!("seed_{name}")), data).expect("write");
    };
    for (name, spec) in specs() {
        // gso_split: a 4-segment super-packet and a GSO_NONE + NEEDS_CSUM packet.
        let pl = payload(350, 1);
        let (hdr, sup) = spec.build_gso(&pl, 100);
        let mut d = vec![0u8; 10];
        hdr.emit(&mut d);
        d.push(framing_byte(spec.framing));
        d.extend_from_slice(&sup);
        write("gso_split", &name, &d);
        let none = VirtioNetHdrRepr { gso_type: gso::NONE, gso_size: 0, flags: flags::NEEDS_CSUM, ..hdr };
        none.emit(&mut d[..10]);
        write("gso_split", &format!("{name}_none"), &d);
        // gro_coalesce: 3 consecutive segments, one with a bad checksum in a second file.
        let mut s = spec.clone();
        let mut g = vec![framing_byte(spec.framing)];
        let mut pkts = Vec::new();
        for i in 0..3 {
            let p = s.build(&payload(64, i));
            s = s.next_seg(64);
            g.extend_from_slice(&(p.len() as u16).to_le_bytes());
            g.extend_from_slice(&p);
            pkts.push(p);
        }
        write("gro_coalesce", &name, &g);
        // parse_headers: the packet itself, and its L4 header alone.
        write("parse_headers", &name, &pkts[0]);
        write("parse_headers", &format!("{name}_l4"), &pkts[0][spec.l4_offset()..]);
    }
    let mut bad = Spec::tcp4();
    bad.bad_csum = true;
    let mut g = vec![0u8];
    for p in [Spec::tcp4().build(&payload(64, 0)), bad.next_seg(64).build(&payload(64, 1))] {
        g.extend_from_slice(&(p.len() as u16).to_le_bytes());
        g.extend_from_slice(&p);
    }
    write("gro_coalesce", "tcp4_badcsum", &g);
    let mut v6x = Spec::tcp6();
    v6x.v6_dest_opts = 2;
    write("parse_headers", "tcp6_ext", &v6x.build(&payload(16, 0)));
    write("parse_headers", "empty", &[]);
    // udp_tunnel_split: VXLAN and Geneve, outer IPv4/IPv6, TAP and TUN framing, each inner kind: 24-byte header,
    // framing byte, super-packet.
    for outer_v6 in [false, true] {
        for framing in [Framing::Ethernet, Framing::Ip] {
            for (inner_name, inner) in [("tcp4", Spec::tcp4()), ("tcp6", Spec::tcp6()), ("udp4", Spec::udp4())] {
                let mut spec = TunnelSpec::vxlan(outer_v6, framing, inner);
                let mut kind = "vxlan";
                if inner_name == "udp4" {
                    spec.tunnel = GENEVE_HEADER.to_vec();
                    kind = "geneve";
                }
                let (hdr, offsets, sup) = spec.build_gso(&payload(900, 3), 300);
                let mut d = vec![0u8; 24];
                hdr.emit(&mut d);
                turbotun_wire::VirtioNetHdr::new_unchecked(&mut d[..]).set_tunnel_offsets(offsets);
                d.push(framing_byte(framing));
                d.extend_from_slice(&sup);
                let outer = if outer_v6 { "o6" } else { "o4" };
                write("udp_tunnel_split", &format!("{kind}_{outer}_{}_{inner_name}", framing_byte(framing)), &d);
            }
        }
    }
    // gro_model: per base (TCP/UDP x v4/v6 x framing), a stream with one of each kind of change.
    for base in 0u8..16 {
        for (name, ops) in [
            ("stream", vec![0u8, 0, 0, 0, 0, 0, 0, 0]),
            ("window", vec![0, 0, 9, 7, 0, 0, 0, 0]),
            ("flags", vec![0, 0, 8, 0, 0, 0, 8, 2, 0, 0, 8, 0x83]),
            ("ack_ttl_tos", vec![0, 0, 10, 1, 0, 0, 11, 0, 0, 0, 11, 1, 0, 0]),
            ("ids", vec![0, 0, 12, 1, 0, 0, 12, 4, 0, 0]),
            ("reorder", vec![0, 0, 0, 0, 14, 0, 0, 0, 13, 0, 0, 0]),
            ("flows", vec![0, 0, 15, 0, 0, 0, 15, 1, 0, 0, 15, 2, 15, 3, 6, 40]),
        ] {
            for cfg in [0u8, 1, 3] {
                let data = [&[base, cfg][..], &ops].concat();
                write("gro_model", &format!("b{base}_c{cfg}_{name}"), &data);
            }
        }
    }
}
