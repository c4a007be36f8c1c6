//! Property tests: coalesce then split gives back the input; split then coalesce gives back the super-packet;
//! every produced packet verifies; arbitrary bytes never panic.

use proptest::prelude::*;
use turbotun_wire::fuzzing::{self, checksums_ok, payload, Spec};
use turbotun_wire::partial::same_up_to_checksum_zero;
use turbotun_wire::tcp::flags as tf;
use turbotun_wire::{Batch, Framing, Gro, GroConfig, Splitter, VirtioNetHdrRepr};

const OFF: usize = 20;

fn spec_strategy() -> impl Strategy<Value = Spec> {
    (0u8..4, 0usize..4, any::<bool>(), any::<u16>(), any::<u32>(), 0usize..11, any::<u8>(), any::<bool>()).prop_map(
        |(kind, framing, df, id, seq, opt_words, tos, psh)| {
            let mut s = match kind {
                0 => Spec::tcp4(),
                1 => Spec::tcp6(),
                2 => Spec::udp4(),
                _ => Spec::udp6(),
            };
            s = match framing {
                0 => s,
                n => s.with_framing(Framing::Ethernet, n - 1),
            };
            s.df = df;
            s.ip_id = id;
            s.seq = seq;
            s.tcp_opts = vec![1; opt_words * 4];
            s.tos = tos;
            if psh {
                s.tcp_flags |= tf::PSH;
            }
            s
        },
    )
}

fn gro_for(framing: Framing) -> Gro {
    Gro::new(GroConfig { tcp: true, udp: true, framing, vnet_hdr_len: 10 })
}

fn into_bufs(pkts: &[Vec<u8>]) -> (Vec<Vec<u8>>, Vec<usize>) {
    let bufs = pkts
        .iter()
        .map(|p| {
            let mut b = vec![0u8; OFF + 65535];
            b[OFF..OFF + p.len()].copy_from_slice(p);
            b
        })
        .collect();
    (bufs, pkts.iter().map(|p| p.len()).collect())
}

/// The frame a gather-mode coalescer writes for packet `head` (virtio header first), joined from its pieces.
fn joined(gro: &Gro, bufs: &[Vec<u8>], lens: &[usize], head: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (b, r) in gro.pieces(head, lens, OFF) {
        out.extend_from_slice(&bufs[b][r]);
    }
    out
}

/// Splits every written packet and concatenates the segments in write order.
fn split_all(bufs: &[Vec<u8>], lens: &[usize], to_write: &[usize], framing: Framing) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for &i in to_write {
        let hdr = VirtioNetHdrRepr::parse(&bufs[i][OFF - 10..OFF]).unwrap();
        let s = Splitter::new(&hdr, &bufs[i][OFF..OFF + lens[i]], framing).unwrap();
        for k in 0..s.segment_count() {
            let seg = s.segment_view(k).unwrap().to_vec();
            assert!(checksums_ok(&seg, framing));
            out.push(seg);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn coalesce_then_split_is_identity(
        spec in spec_strategy(),
        mss in 1usize..1500,
        n in 1usize..30,
        last in 1usize..1500,
        valid in any::<bool>(),
    ) {
        // One in-order flow: n - 1 full segments and a last one of at most mss bytes, PSH only on the last.
        let last = last.min(mss);
        let mut s = spec.clone();
        s.tcp_flags &= !tf::PSH;
        let mut pkts = Vec::new();
        for i in 0..n {
            let len = if i + 1 == n { last } else { mss };
            let mut x = s.clone();
            if i + 1 == n && spec.tcp_flags & tf::PSH != 0 {
                x.tcp_flags |= tf::PSH;
            }
            pkts.push(x.build(&payload(len, i as u8)));
            s = s.next_seg(len);
        }
        let (mut bufs, mut lens) = into_bufs(&pkts);
        let mut tw = Vec::new();
        let st = gro_for(spec.framing).coalesce(&mut Batch::new(&mut bufs, &mut lens, OFF), valid, &mut tw);
        prop_assert_eq!(st.written + st.coalesced, n);
        let total = (n - 1) * mss + last + spec.hdr_len();
        if total <= 65535 && (!spec.udp || n <= 64) {
            prop_assert_eq!(tw.len(), 1);
        }
        let out = split_all(&bufs, &lens, &tw, spec.framing);
        prop_assert_eq!(out, pkts);
    }

    #[test]
    fn split_then_coalesce_is_identity(
        spec in spec_strategy(),
        mss in 1u16..1500,
        len in 1usize..65000,
        valid in any::<bool>(),
    ) {
        let max_payload = 65535 - spec.hdr_len();
        let mut len = len.min(max_payload);
        if spec.udp {
            len = len.min(64 * mss as usize);
        }
        let pl = payload(len, 1);
        let (hdr, sup) = spec.build_gso(&pl, mss);
        let s = Splitter::new(&hdr, &sup, spec.framing).unwrap();
        let n = s.segment_count();
        let mut bufs = vec![vec![0u8; OFF + 65535]; n];
        let mut lens = vec![0usize; n];
        let p = s.split_into(0, &mut Batch::new(&mut bufs, &mut lens, OFF)).unwrap();
        prop_assert!(p.is_done());
        for i in 0..n {
            prop_assert!(checksums_ok(&bufs[i][OFF..OFF + lens[i]], spec.framing));
        }
        let segs: Vec<Vec<u8>> = (0..n).map(|i| bufs[i][OFF..OFF + lens[i]].to_vec()).collect();
        let mut tw = Vec::new();
        gro_for(spec.framing).coalesce(&mut Batch::new(&mut bufs, &mut lens, OFF), valid, &mut tw);
        prop_assert_eq!(&tw, &vec![0]);
        let out_hdr = VirtioNetHdrRepr::parse(&bufs[0][OFF - 10..OFF]).unwrap();
        if n > 1 {
            prop_assert_eq!(out_hdr, VirtioNetHdrRepr { hdr_len: spec.hdr_len() as u16, ..hdr });
            prop_assert_eq!(&bufs[0][OFF..OFF + lens[0]], &sup[..]);
        } else {
            prop_assert_eq!(out_hdr, VirtioNetHdrRepr::default());
            prop_assert_eq!(&bufs[0][OFF..OFF + lens[0]], &segs[0][..]);
        }
    }

    #[test]
    fn interleaved_flows_keep_per_flow_order(
        a in spec_strategy(),
        mss in 1usize..1500,
        order in proptest::collection::vec(any::<bool>(), 1..40),
    ) {
        let mut b = a.clone();
        b.sport ^= 0x5555;
        let (mut sa, mut sb) = (a.clone(), b.clone());
        sa.tcp_flags &= !tf::PSH;
        sb.tcp_flags &= !tf::PSH;
        let mut pkts = Vec::new();
        let (mut fa, mut fb) = (Vec::new(), Vec::new());
        for (i, &which) in order.iter().enumerate() {
            let s = if which { &mut sa } else { &mut sb };
            let p = s.build(&payload(mss, i as u8));
            *s = s.next_seg(mss);
            if which { fa.push(p.clone()) } else { fb.push(p.clone()) }
            pkts.push(p);
        }
        let (mut bufs, mut lens) = into_bufs(&pkts);
        let mut tw = Vec::new();
        gro_for(a.framing).coalesce(&mut Batch::new(&mut bufs, &mut lens, OFF), false, &mut tw);
        let out = split_all(&bufs, &lens, &tw, a.framing);
        let oa: Vec<Vec<u8>> = out.iter().filter(|p| fa.contains(p)).cloned().collect();
        let ob: Vec<Vec<u8>> = out.iter().filter(|p| fb.contains(p)).cloned().collect();
        prop_assert_eq!(out.len(), pkts.len());
        prop_assert_eq!(oa, fa);
        prop_assert_eq!(ob, fb);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        fuzzing::parse_headers(&data);
        fuzzing::gso_split(&data);
        fuzzing::gro_coalesce(&data);
    }

    /// ICMP errors about packets whose every field is random but the version (and, half the time, lengths that
    /// fit and a first fragment): never a panic; every error written is well formed, within its size limit, and
    /// quotes the packet (`fuzzing::icmp_error_about`).
    #[test]
    fn icmp_errors_about_random_packets(
        v6 in any::<bool>(),
        data in proptest::collection::vec(any::<u8>(), 0..1600),
        consistent in any::<bool>(),
    ) {
        let mut data = data;
        if let Some(b) = data.first_mut() {
            *b = (*b & 0x0f) | if v6 { 0x60 } else { 0x40 };
        }
        if consistent && data.len() >= 48 {
            if v6 {
                let payload = (data.len() - 40) as u16;
                data[4..6].copy_from_slice(&payload.to_be_bytes());
            } else {
                data[0] = 0x45;
                let total = data.len() as u16;
                data[2..4].copy_from_slice(&total.to_be_bytes());
                data[6] &= 0x20;
                data[7] = 0;
                data[12] = 10;
                data[16] = 10;
            }
        }
        fuzzing::icmp_error_about(&data);
    }

    #[test]
    fn mutated_packets_never_panic(
        spec in spec_strategy(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
        gso_type in prop_oneof![Just(0u8), Just(1), Just(4), Just(5), Just(0x81), any::<u8>()],
    ) {
        let pl = payload(3000, 2);
        let (mut hdr, mut sup) = spec.build_gso(&pl, 1000);
        hdr.gso_type = gso_type;
        let hl = spec.hdr_len();
        for (at, v) in &flips {
            let i = at % (hl + 4);
            if i < hl { sup[i] ^= v } else { hdr.csum_start ^= *v as u16 }
        }
        sup.truncate(cut % (sup.len() + 1));
        let mut data = vec![0u8; 10];
        hdr.emit(&mut data);
        data.push(if spec.framing == Framing::Ethernet { 1 } else { 0 });
        data.extend_from_slice(&sup);
        fuzzing::gso_split(&data);
        fuzzing::parse_headers(&sup);
        // The same bytes as a GRO batch next to a valid packet of the flow.
        let good = spec.build(&payload(1000, 0));
        let mut g = vec![if spec.framing == Framing::Ethernet { 1 } else { 0 }];
        for p in [&good, &sup, &good] {
            g.extend_from_slice(&(p.len() as u16).to_le_bytes());
            g.extend_from_slice(p);
        }
        fuzzing::gro_coalesce(&g);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Gather mode writes exactly the bytes copy mode writes: for every packet to write, the concatenated pieces
    /// equal the copy-mode buffer (virtio header included). Shuffled order exercises prepends and interleaving.
    #[test]
    fn gather_equals_copy(
        spec in spec_strategy(),
        mss in 1usize..1500,
        n in 1usize..40,
        order in proptest::collection::vec(any::<u32>(), 40),
        valid in any::<bool>(),
    ) {
        let mut s = spec.clone();
        let mut pkts = Vec::new();
        for i in 0..n {
            pkts.push(s.build(&payload(mss, i as u8)));
            s = s.next_seg(mss);
        }
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by_key(|&i| order[i]);
        let pkts: Vec<Vec<u8>> = idx.iter().map(|&i| pkts[i].clone()).collect();

        let (mut copy_bufs, mut copy_lens) = into_bufs(&pkts);
        let mut copy_tw = Vec::new();
        gro_for(spec.framing).coalesce(&mut Batch::new(&mut copy_bufs, &mut copy_lens, OFF), valid, &mut copy_tw);

        let (mut g_bufs, mut g_lens) = into_bufs(&pkts);
        let mut g_tw = Vec::new();
        let mut gather = gro_for(spec.framing).with_gather(true);
        gather.coalesce(&mut Batch::new(&mut g_bufs, &mut g_lens, OFF), valid, &mut g_tw);

        prop_assert_eq!(&copy_tw, &g_tw);
        for &i in &g_tw {
            let joined = joined(&gather, &g_bufs, &g_lens, i);
            prop_assert_eq!(&joined[..], &copy_bufs[i][OFF - 10..OFF + copy_lens[i]], "packet {}", i);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// UDP-tunnel split: for any inner spec, outer version and framing, tunnel header, payload and gso_size, the
    /// segments are exactly the outer frames built around the inner segments, every checksum verifies, and the
    /// inner payloads put together are the original payload.
    #[test]
    fn udp_tunnel_split_equals_built_segments(
        inner in spec_strategy(),
        outer_v6 in any::<bool>(),
        tun_framing in any::<bool>(),
        geneve in any::<bool>(),
        outer_csum in any::<bool>(),
        outer_id in any::<u16>(),
        len in 1usize..20000,
        gso_size in 1usize..3000,
        seed in any::<u8>(),
    ) {
        use turbotun_wire::fuzzing::{TunnelSpec, GENEVE_HEADER};
        use turbotun_wire::udp_tunnel::TunnelSplitter;
        let framing = if tun_framing { Framing::Ip } else { Framing::Ethernet };
        let mut spec = TunnelSpec::vxlan(outer_v6, framing, Spec { vlans: 0, ..inner });
        if geneve {
            spec.tunnel = GENEVE_HEADER.to_vec();
        }
        spec.outer_csum = outer_csum;
        spec.outer.ip_id = outer_id;
        let data = payload(len, seed);
        let (hdr, offsets, packet) = spec.build_gso(&data, gso_size as u16);
        let s = TunnelSplitter::new(&hdr, offsets, &packet, framing).unwrap();
        let want = spec.segments(&data, gso_size);
        prop_assert_eq!(s.segment_count(), want.len());
        let mut out = vec![0u8; 65536];
        let mut joined = Vec::new();
        for (i, w) in want.iter().enumerate() {
            let n = s.write_segment(i, &mut out).unwrap();
            prop_assert_eq!(&out[..n], &w[..], "segment {}", i);
            prop_assert!(checksums_ok(&out[s.inner_offset()..n], Framing::Ip));
            if outer_csum || !outer_v6 {
                prop_assert!(checksums_ok(&out[..n], framing));
            }
            joined.extend_from_slice(&out[s.header_len()..n]);
        }
        prop_assert_eq!(joined, data);

        // GRO: the segments coalesce back into one super-packet that splits into the same segments.
        let frames: Vec<&[u8]> = want.iter().map(|f| &f[..]).collect();
        let kind = if geneve { turbotun_wire::udp_tunnel::TunnelKind::Geneve } else { turbotun_wire::udp_tunnel::TunnelKind::Vxlan };
        let mut merged = vec![0u8; 65536 + 4096];
        let m = turbotun_wire::udp_tunnel::coalesce_tunnel(&frames, framing, kind, &mut merged).unwrap();
        let fits = packet.len() - spec.outer.l2_len() <= 65535;
        // Inner UDP: at most 64 segments per merged packet, the coalescer's UDP cap (`udp_gro_receive_segment`).
        let cap = if spec.inner.udp { turbotun_wire::gro::DEFAULT_UDP_MAX_SEGMENTS } else { usize::MAX };
        let take = want.len().min(cap);
        if want.len() > 1 && fits {
            prop_assert_eq!(m.frames, take);
            let (h, o) = m.header.unwrap();
            let again = TunnelSplitter::new(&h, o, &merged[..m.len], framing).unwrap();
            for (i, w) in want[..take].iter().enumerate() {
                let n = again.write_segment(i, &mut out).unwrap();
                prop_assert_eq!(&out[..n], &w[..], "coalesced, segment {}", i);
            }
        }
    }

    /// Any byte of a valid tunnel super-packet (header included) changed: an error or a consistent split, never a
    /// panic (the fuzz target's checks run on it).
    #[test]
    fn tunnel_mutations_never_panic(
        inner in spec_strategy(),
        outer_v6 in any::<bool>(),
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
    ) {
        use turbotun_wire::fuzzing::TunnelSpec;
        let spec = TunnelSpec::vxlan(outer_v6, Framing::Ethernet, Spec { vlans: 0, ..inner });
        let (hdr, offsets, packet) = spec.build_gso(&payload(2500, 9), 700);
        let mut d = vec![0u8; 24];
        hdr.emit(&mut d);
        turbotun_wire::VirtioNetHdr::new_unchecked(&mut d[..]).set_tunnel_offsets(offsets);
        d.push(1);
        d.extend_from_slice(&packet);
        let i = at.index(d.len());
        d[i] = value;
        fuzzing::udp_tunnel_split(&d);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Partial checksums change nothing but the checksum fields: every segment split with partial checksums,
    /// once completed, is the segment split with complete ones; coalescing the partial segments (in any order)
    /// writes the same packets as coalescing the complete ones, merged packets byte for byte (their checksum is
    /// partial either way) and every other packet marked `NEEDS_CSUM` so that completing it gives the complete
    /// packet.
    #[test]
    fn partial_checksums_equal_complete_ones_once_completed(
        spec in spec_strategy(),
        mss in 1u16..1500,
        len in 1usize..20000,
        order in proptest::collection::vec(any::<u32>(), 64),
        gather in any::<bool>(),
    ) {
        let mut len = len.min(65535 - spec.hdr_len());
        if spec.udp {
            len = len.min(64 * mss as usize);
        }
        let (hdr, sup) = spec.build_gso(&payload(len, 5), mss);
        let complete = Splitter::new(&hdr, &sup, spec.framing).unwrap();
        let partial = complete.clone().leave_checksums_partial(true);
        prop_assert!(partial.checksums_left_partial(), "every spec here is markable");
        let n = complete.segment_count();
        let (mut cbufs, mut clens) = (vec![vec![0u8; OFF + 65535]; n], vec![0usize; n]);
        let (mut pbufs, mut plens) = (cbufs.clone(), clens.clone());
        complete.split_into(0, &mut Batch::new(&mut cbufs, &mut clens, OFF)).unwrap();
        partial.split_into(0, &mut Batch::new(&mut pbufs, &mut plens, OFF)).unwrap();
        for i in 0..n {
            // Completed from what the field holds (the kernel's way), not recomputed.
            let mut seg = pbufs[i][OFF..OFF + plens[i]].to_vec();
            let site = turbotun_wire::partial::site(&seg, spec.framing).unwrap();
            turbotun_wire::checksum::complete_partial(&mut seg, site.start, site.offset).unwrap();
            let want = &cbufs[i][OFF..OFF + clens[i]];
            prop_assert!(same_up_to_checksum_zero(&seg, want, spec.framing), "segment {}: {:?} {:?}", i, seg, want);
        }
        // Shuffle both the same way, then coalesce.
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by_key(|&i| order[i % order.len()] ^ i as u32);
        let cpkts: Vec<Vec<u8>> = idx.iter().map(|&i| cbufs[i][OFF..OFF + clens[i]].to_vec()).collect();
        let ppkts: Vec<Vec<u8>> = idx.iter().map(|&i| pbufs[i][OFF..OFF + plens[i]].to_vec()).collect();
        let (mut cb, mut cl) = into_bufs(&cpkts);
        let (mut pb, mut pl) = into_bufs(&ppkts);
        let (mut ctw, mut ptw) = (Vec::new(), Vec::new());
        let mut cgro = gro_for(spec.framing).with_gather(gather);
        let mut pgro = gro_for(spec.framing).with_gather(gather);
        cgro.coalesce(&mut Batch::new(&mut cb, &mut cl, OFF), turbotun_wire::Checksums::Valid, &mut ctw);
        pgro.coalesce(&mut Batch::new(&mut pb, &mut pl, OFF), turbotun_wire::Checksums::Partial, &mut ptw);
        prop_assert_eq!(&ctw, &ptw);
        for &i in &ctw {
            let want = joined(&cgro, &cb, &cl, i);
            let mut got = joined(&pgro, &pb, &pl, i);
            let h = VirtioNetHdrRepr::parse(&got[..10]).unwrap();
            if !h.is_gso() {
                prop_assert_eq!(VirtioNetHdrRepr::parse(&want[..10]).unwrap(), VirtioNetHdrRepr::default());
                prop_assert!(h.needs_csum(), "an unmerged segment is handed to the kernel to complete");
                let (start, at) = (h.csum_start as usize, h.csum_offset as usize);
                turbotun_wire::checksum::complete_partial(&mut got[10..], start, at).unwrap();
                got[..10].fill(0);
            }
            prop_assert_eq!(&got[..10], &want[..10], "packet {} header", i);
            prop_assert!(same_up_to_checksum_zero(&got[10..], &want[10..], spec.framing), "packet {}", i);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The coalescer's fast path for the next segment of a stream changes no output: a stream of segments, in
    /// order or shuffled, some with header bytes changed (other windows, IDs, flags, addresses, lengths), some of
    /// another flow, coalesced with and without it, writes the same packets byte for byte.
    #[test]
    fn fast_path_changes_nothing(
        spec in spec_strategy(),
        mss in 1usize..1500,
        n in 1usize..48,
        shuffle in proptest::collection::vec(any::<u32>(), 48),
        in_order in any::<bool>(),
        flips in proptest::collection::vec((any::<usize>(), any::<usize>(), any::<u8>()), 0..6),
        other_flow in proptest::collection::vec(any::<bool>(), 48),
        id_changes in proptest::collection::vec((any::<usize>(), 0u16..3), 0..4),
        gather in any::<bool>(),
        partial in any::<bool>(),
    ) {
        let mut other = spec.clone();
        other.sport ^= 0x5555;
        let (mut s, mut o) = (spec.clone(), other);
        s.tcp_flags &= !tf::PSH;
        o.tcp_flags &= !tf::PSH;
        let mut pkts = Vec::new();
        for (i, &other_flow) in other_flow.iter().enumerate().take(n) {
            let which = if other_flow && i % 3 == 0 { &mut o } else { &mut s };
            let last = i + 1 == n;
            let len = if last { 1 + mss / 2 } else { mss };
            pkts.push(which.build(&payload(len, i as u8)));
            *which = which.next_seg(len);
        }
        if !in_order {
            let mut idx: Vec<usize> = (0..n).collect();
            idx.sort_by_key(|&i| shuffle[i]);
            pkts = idx.iter().map(|&i| pkts[i].clone()).collect();
        }
        // IPv4 IDs set to the previous one, the same, or one further, with a valid header checksum: only the
        // ID rule decides.
        if !spec.v6 {
            for (which, delta) in &id_changes {
                let i = which % n;
                let prev = if i > 0 { u16::from_be_bytes([pkts[i - 1][spec.l2_len() + 4], pkts[i - 1][spec.l2_len() + 5]]) } else { 0 };
                let mut ip = turbotun_wire::ipv4::Packet::new_unchecked(&mut pkts[i][spec.l2_len()..]);
                ip.set_ident(prev.wrapping_add(*delta));
                ip.fill_checksum();
            }
        }
        let hl = spec.hdr_len();
        for (which, at, v) in &flips {
            let p = &mut pkts[which % n];
            let at = at % hl.min(p.len());
            p[at] ^= v;
        }
        let checksums = if partial { turbotun_wire::Checksums::Partial } else { turbotun_wire::Checksums::Valid };
        let run = |fast: bool| {
            let (mut bufs, mut lens) = into_bufs(&pkts);
            let mut tw = Vec::new();
            let mut gro = gro_for(spec.framing).with_gather(gather).with_fast_path(fast);
            let stats = gro.coalesce(&mut Batch::new(&mut bufs, &mut lens, OFF), checksums, &mut tw);
            let written: Vec<Vec<u8>> = tw.iter().map(|&i| joined(&gro, &bufs, &lens, i)).collect();
            (tw, stats, written)
        };
        let (fast, slow) = (run(true), run(false));
        prop_assert_eq!(&fast.0, &slow.0);
        prop_assert_eq!(fast.1, slow.1);
        prop_assert_eq!(fast.2, slow.2);
        // And both made the coalesced packets the kernel's merge decision makes.
        let (mut bufs, mut lens) = into_bufs(&pkts);
        let mut tw = Vec::new();
        let mut gro = gro_for(spec.framing).with_gather(true);
        gro.coalesce(&mut Batch::new(&mut bufs, &mut lens, OFF), checksums, &mut tw);
        let refs: Vec<&[u8]> = pkts.iter().map(Vec::as_slice).collect();
        let want = fuzzing::reference_groups(&refs, gro.config(), gro.udp_max_segments(), checksums);
        prop_assert_eq!(fuzzing::groups_of(&gro, &tw, &lens, OFF), want);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// The coalescer against a reference model of the kernel's merge decision (`fuzzing::reference_groups`): a
    /// stream whose packets change one field at a time (a flag, CWR on one segment or on all, the window, the ACK
    /// number, TTL, TOS, flow label, DF, the IPv4 ID, options, IPv6 extension headers, length, checksum),
    /// retransmissions and other flows, checksums trusted or not: the same packets end up in the same coalesced
    /// packets, in the same order.
    #[test]
    fn the_kernels_merge_decision(data in proptest::collection::vec(any::<u8>(), 2..130)) {
        fuzzing::gro_model(&data);
    }
}
