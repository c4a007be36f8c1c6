//! Shared helpers of the GRO vector tests: a batch run through a `Gro`, and the check that its result is exactly
//! the expected groups (each merged packet split again and compared with its inputs byte for byte, each unmerged
//! one untouched with a zeroed virtio header).
// Each test file that includes this module uses only some of it.
#![allow(dead_code)]

use turbotun_wire::fuzzing::{checksums_ok, payload, Spec};
use turbotun_wire::virtio_net::flags;
use turbotun_wire::{Batch, Framing, Gro, GroConfig, GroStats, Splitter, VirtioNetHdrRepr};

pub const OFF: usize = 12;

pub struct Run {
    pub bufs: Vec<Vec<u8>>,
    pub lens: Vec<usize>,
    pub to_write: Vec<usize>,
    pub stats: GroStats,
}

pub fn run_with(gro: &mut Gro, pkts: &[Vec<u8>], valid: bool, room: usize) -> Run {
    let mut bufs: Vec<Vec<u8>> = pkts
        .iter()
        .map(|p| {
            let mut b = vec![0xeeu8; OFF + room.max(p.len())];
            b[OFF..OFF + p.len()].copy_from_slice(p);
            b
        })
        .collect();
    let mut lens: Vec<usize> = pkts.iter().map(|p| p.len()).collect();
    let mut to_write = vec![99];
    let stats = gro.coalesce(&mut Batch::new(&mut bufs, &mut lens, OFF), valid, &mut to_write);
    Run { bufs, lens, to_write, stats }
}

pub fn cfg(framing: Framing) -> GroConfig {
    GroConfig { tcp: true, udp: true, framing, vnet_hdr_len: 10 }
}

/// Runs GRO and checks the result is exactly `groups` (input indices in segment order; written at group[0]).
pub fn check(framing: Framing, pkts: &[Vec<u8>], groups: &[&[usize]]) -> Run {
    check_opts(&mut Gro::new(cfg(framing)), framing, pkts, groups, false, false)
}

pub fn check_opts(
    gro: &mut Gro,
    framing: Framing,
    pkts: &[Vec<u8>],
    groups: &[&[usize]],
    valid: bool,
    ignore_ip_id: bool,
) -> Run {
    let r = run_with(gro, pkts, valid, 65535);
    let mut g: Vec<&[usize]> = groups.to_vec();
    g.sort_by_key(|g| g[0]);
    assert_eq!(r.to_write, g.iter().map(|g| g[0]).collect::<Vec<_>>(), "written indices");
    assert_eq!(r.stats.packets, pkts.len());
    assert_eq!(r.stats.written, g.len());
    assert_eq!(r.stats.coalesced, pkts.len() - g.len());
    for grp in g {
        let i = grp[0];
        let vh = &r.bufs[i][OFF - 10..OFF];
        let out = &r.bufs[i][OFF..OFF + r.lens[i]];
        let hdr = VirtioNetHdrRepr::parse(vh).unwrap();
        if grp.len() == 1 {
            assert_eq!(vh, &[0u8; 10], "unmerged packet {i} gets a zeroed header");
            assert_eq!(out, &pkts[i][..], "unmerged packet {i} untouched");
            continue;
        }
        assert_eq!(hdr.flags, flags::NEEDS_CSUM);
        let s = Splitter::new(&hdr, out, framing).expect("merged packet splits");
        assert_eq!(hdr.hdr_len as usize, s.hdr_len());
        assert_eq!(hdr.csum_start as usize, s.l4_offset());
        assert_eq!(s.segment_count(), grp.len(), "group {grp:?}");
        for (k, &src) in grp.iter().enumerate() {
            let mut seg = s.segment_view(k).unwrap().to_vec();
            assert!(checksums_ok(&seg, framing));
            let mut want = pkts[src].clone();
            if ignore_ip_id {
                let l3 = s.l4_offset() - 20;
                for b in [4, 5, 10, 11] {
                    seg[l3 + b] = 0;
                    want[l3 + b] = 0;
                }
            }
            assert_eq!(seg, want, "segment {k} of group {grp:?} equals input {src}");
        }
    }
    r
}

/// A stream of segments of `lens` payload bytes each, consecutive sequence numbers and IDs.
pub fn stream(spec: &Spec, lens: &[usize]) -> (Vec<Spec>, Vec<Vec<u8>>) {
    let mut specs = Vec::new();
    let mut s = spec.clone();
    for &l in lens {
        specs.push(s.clone());
        s = s.next_seg(l);
    }
    let pkts = specs.iter().zip(lens).enumerate().map(|(i, (s, &l))| s.build(&payload(l, i as u8))).collect();
    (specs, pkts)
}

pub fn all_bases() -> Vec<Spec> {
    let mut v = Vec::new();
    for base in [Spec::tcp4(), Spec::tcp6(), Spec::udp4(), Spec::udp6()] {
        for (f, vl) in [(Framing::Ip, 0), (Framing::Ethernet, 0), (Framing::Ethernet, 2)] {
            v.push(base.clone().with_framing(f, vl));
        }
    }
    v
}

pub fn tcp_bases() -> Vec<Spec> {
    all_bases().into_iter().filter(|s| !s.udp).collect()
}

/// Turns the first extension header of `pkt` (built from `spec` with `v6_dest_opts >= 1`) into a fragment
/// header of the first fragment of a larger datagram.
pub fn make_fragment_header(pkt: &mut [u8], spec: &Spec) {
    let l3 = spec.l2_len();
    pkt[l3 + 6] = 44;
    let next = pkt[l3 + 40];
    pkt[l3 + 40..l3 + 48].copy_from_slice(&[next, 0, 0, 1, 0, 0, 0, 7]);
}
