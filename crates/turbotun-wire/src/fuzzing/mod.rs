//! Entry points shared by the cargo-fuzz targets and the corpus replay test, and packet builders for tests and
//! benches (`spec.rs`), compiled only with the `fuzzing` feature. Not part of the public API; may change at any
//! time.
#![allow(missing_docs)]

mod gro_reference;
mod reference_wire;
mod spec;
pub use gro_reference::{reference_groups, reference_groups_with, Differences};
/// Whether a packet's IPv4 header and TCP/UDP checksums verify, by the oracle's own parsing and checksum (never
/// the crate's, which is what the tests check with it).
pub use reference_wire::checksums_ok;
pub use spec::{Spec, TunnelSpec, GENEVE_HEADER, VXLAN_HEADER};

use crate::checksum;
use crate::gro::{Checksums, Gro, GroConfig};
use crate::gso::Splitter;
use crate::virtio_net::VirtioNetHdrRepr;
use crate::{ethernet, ipv4, ipv6, tcp, udp, Batch, Framing};

/// Fuzz entry: `data` = 24-byte virtio header, 1 framing byte, packet. Validates a UDP-tunnel super-packet and
/// checks every segment: its length, the outer checksums and (from the inner IP header on) the inner ones.
pub fn udp_tunnel_split(data: &[u8]) {
    use crate::udp_tunnel::TunnelSplitter;
    if data.len() < 25 {
        return;
    }
    let (Ok(hdr), Ok(offsets)) = (VirtioNetHdrRepr::parse(&data[..24]), crate::TunnelOffsets::parse(&data[..24]))
    else {
        return;
    };
    let framing = framing_of(data[24]);
    let pkt = &data[25..];
    let Ok(s) = TunnelSplitter::new(&hdr, offsets, pkt, framing) else {
        return;
    };
    let n = s.segment_count();
    assert!(n >= 1);
    let mut out = vec![0u8; 65536 + 512];
    let inner = s.inner_offset();
    let mut payload = 0;
    for i in 0..n.min(256) {
        let len = s.write_segment(i, &mut out).expect("segment fits");
        assert_eq!(len, s.segment_len(i));
        let seg = &out[..len];
        let th = s.outer_udp_offset();
        assert_eq!(usize::from(u16::from_be_bytes([seg[th + 4], seg[th + 5]])), len - th, "outer UDP length");
        if s.outer_checksum() {
            assert!(checksums_ok(seg, framing), "segment {i}: outer checksums");
        } else {
            assert_eq!(seg[th + 6..th + 8], [0, 0], "segment {i}: no outer UDP checksum");
        }
        assert!(checksums_ok(&seg[inner..], Framing::Ip), "segment {i}: inner checksums");
        payload += len - s.header_len();
    }
    if n <= 256 {
        assert_eq!(payload, pkt.len() - s.header_len(), "every payload byte in exactly one segment");
    }
    assert!(s.write_segment(n, &mut out).is_err());
    let mut bufs = vec![vec![0u8; 2048]; 4];
    let mut lens = [0usize; 4];
    let _ = s.split_into(0, &mut Batch::new(&mut bufs, &mut lens, 12));
    // GRO: what merges of the segments must split back into the same segments.
    if n <= 64 {
        use crate::udp_tunnel::{coalesce_tunnel, TunnelKind};
        let segs: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let len = s.write_segment(i, &mut out).expect("segment fits");
                out[..len].to_vec()
            })
            .collect();
        let frames: Vec<&[u8]> = segs.iter().map(|f| &f[..]).collect();
        let mut merged = vec![0u8; 65536 + 512];
        for kind in [TunnelKind::Vxlan, TunnelKind::Geneve] {
            let m = coalesce_tunnel(&frames, framing, kind, &mut merged).expect("room for the merge");
            assert!(m.frames >= 1 && m.frames <= n);
            if let Some((h, o)) = m.header {
                let again = TunnelSplitter::new(&h, o, &merged[..m.len], framing).expect("a merge splits");
                assert_eq!(again.segment_count(), m.frames);
                for (i, seg) in segs.iter().take(m.frames).enumerate() {
                    let len = again.write_segment(i, &mut out).expect("segment fits");
                    assert_eq!(&out[..len], &seg[..], "merged and split again, segment {i}");
                }
            } else {
                assert_eq!(merged[..m.len], segs[0][..]);
            }
        }
    }
}

/// Deterministic payload bytes.
pub fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn framing_of(b: u8) -> Framing {
    if b & 1 == 0 {
        Framing::Ip
    } else {
        Framing::Ethernet
    }
}

/// Fuzz entry: every parser and accessor on arbitrary bytes.
pub fn parse_headers(data: &[u8]) {
    let _ = VirtioNetHdrRepr::parse(data);
    if let Ok(h) = crate::VirtioNetHdr::new_checked(data) {
        let _ = (h.repr(), h.num_buffers());
    }
    if let Ok(f) = ethernet::Frame::new_checked(data) {
        let _ = (f.dst_addr(), f.src_addr(), f.inner_ethertype(), f.vlan_id(0), f.vlan_id(1), f.payload().len());
        let _ = ethernet::Repr::parse(&f);
    }
    if let Ok(p) = ipv4::Packet::new_checked(data) {
        let _ = (p.total_len(), p.ident(), p.is_fragment(), p.options().len(), p.verify_checksum());
        let _ = (p.payload().len(), ipv4::Repr::parse(&p), p.check_total_len(), p.src_addr(), p.dst_addr());
    }
    if let Ok(p) = ipv6::Packet::new_checked(data) {
        let _ = (p.flow_label(), p.traffic_class(), p.l4_info(), p.check_payload_len(), ipv6::Repr::parse(&p));
    }
    icmp_error_about(data);
    if let Ok(p) = tcp::Packet::new_checked(data) {
        let _ = (p.seq_number(), p.flags(), p.options().len(), p.payload().len());
        for o in p.option_iter() {
            let _ = o;
        }
    }
    if let Ok(p) = udp::Packet::new_checked(data) {
        let _ = (p.len(), p.checksum(), p.payload().len(), udp::Repr::parse(&p));
    }
    for framing in [Framing::Ip, Framing::Ethernet] {
        let _ = crate::locate_ip(data, framing);
        // A checksum found wrong is one that completing changes; one found right (other than UDP's "none"),
        // completing leaves alone up to the two one's-complement zeros.
        if let Some(right) = crate::partial::verify(data, framing) {
            let mut copy = data.to_vec();
            assert!(crate::partial::complete(&mut copy, framing));
            assert_eq!(crate::partial::verify(&copy, framing), Some(true));
            let site = crate::partial::site(data, framing).expect("verify found it");
            let field = site.start + site.offset;
            let udp_none = site.offset == udp::CHECKSUM_OFFSET && data[field..field + 2] == [0, 0];
            if !right {
                assert_ne!(copy, data);
            } else if !udp_none {
                assert!(crate::partial::same_up_to_checksum_zero(&copy, data, framing));
            }
        }
    }
    if data.len() >= 4 {
        let s = u16::from_le_bytes([data[0], data[1]]) as usize;
        let o = u16::from_le_bytes([data[2], data[3]]) as usize;
        let mut copy = data[4..].to_vec();
        let _ = checksum::complete_partial(&mut copy, s, o);
        assert_eq!(checksum::sum(data, 7), checksum::sum_reference(data, 7));
    }
}

/// Fuzz entry: `data` = 10-byte virtio header, 1 framing byte, packet. Splits into every segment both ways and
/// checks that they agree.
pub fn gso_split(data: &[u8]) {
    if data.len() < 11 {
        return;
    }
    let Ok(hdr) = VirtioNetHdrRepr::parse(&data[..10]) else {
        return;
    };
    let framing = framing_of(data[10]);
    let pkt = &data[11..];
    let Ok(s) = Splitter::new(&hdr, pkt, framing) else {
        return;
    };
    let n = s.segment_count();
    assert!(n >= 1);
    let mut out = vec![0u8; 65536 + 256];
    let mut total_payload = 0;
    for i in 0..n.min(256) {
        let len = s.write_segment(i, &mut out).expect("segment fits");
        assert_eq!(len, s.segment_len(i));
        let v = s.segment_view(i);
        if let Ok(v) = v {
            assert_eq!(v.to_vec(), out[..len]);
            total_payload += v.payload().len();
        }
        if s.is_gso() {
            assert!(checksums_ok(&out[..len], framing), "segment {i} checksum");
        }
    }
    if s.is_gso() && n <= 256 {
        assert_eq!(total_payload, pkt.len() - s.hdr_len());
        // The zero-copy split (headers alone + each payload where it lies) gives the same bytes.
        let hl = s.hdr_len();
        let head = Splitter::from_head(&hdr, &pkt[..hl], pkt.len(), framing).expect("headers of a valid packet");
        assert_eq!(head.segment_count(), n);
        let mut header = [0u8; crate::gso::MAX_HEADER_LEN];
        for i in 0..n {
            let len = s.write_segment(i, &mut out).expect("segment fits");
            let start = hl + i * s.gso_size();
            let payload = &pkt[start..start + head.segment_payload_len(i)];
            head.write_header(i, payload, &mut header).expect("header fits");
            assert_eq!(&header[..hl], &out[..hl], "segment {i} header");
            assert_eq!(payload, &out[hl..len], "segment {i} payload");
        }
        // Partial checksums: the same segments once the kernel's completion (from the field) is applied.
        let partial = s.clone().leave_checksums_partial(true);
        let mut complete = vec![0u8; 65536 + 256];
        for i in 0..n {
            let len = partial.write_segment(i, &mut out).expect("segment fits");
            s.write_segment(i, &mut complete).expect("segment fits");
            if partial.checksums_left_partial() {
                let site = crate::partial::site(&out[..len], framing).expect("a partial segment is markable");
                checksum::complete_partial(&mut out[..len], site.start, site.offset).expect("in range");
            }
            assert!(crate::partial::same_up_to_checksum_zero(&out[..len], &complete[..len], framing), "segment {i}");
        }
    }
    // Any cut of the packet handed to from_head is an error or a consistent splitter, never a panic.
    if let Some(&cut) = data.get(10) {
        let cut = (cut as usize).min(pkt.len());
        if let Ok(head) = Splitter::from_head(&hdr, &pkt[..cut], pkt.len(), framing) {
            assert_eq!(head.hdr_len(), cut);
        }
    }
    let mut bufs = vec![vec![0u8; 2048]; 4];
    let mut lens = [0usize; 4];
    let _ = s.split_into(0, &mut Batch::new(&mut bufs, &mut lens, 12));
}

/// Fuzz entry: `data` = config byte, then packets as (u16 LE length, bytes). Coalesces them and checks the
/// invariants: indices ascending, bytes conserved, merged packets split again into valid segments.
pub fn gro_coalesce(data: &[u8]) {
    let Some((&cfg, mut rest)) = data.split_first() else {
        return;
    };
    let framing = framing_of(cfg);
    let vnet = [10usize, 12, 20, 10][((cfg >> 1) & 3) as usize];
    let config = GroConfig { tcp: cfg & 8 == 0, udp: cfg & 16 == 0, framing, vnet_hdr_len: vnet };
    let checksums = match (cfg & 128 != 0, cfg & 32 != 0) {
        (true, _) => Checksums::Partial,
        (false, valid) => Checksums::from(valid),
    };
    let offset = vnet + 2;
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut lens = Vec::new();
    while rest.len() >= 2 && bufs.len() < 64 {
        let l = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
        let mut b = vec![0u8; offset + 65535];
        b[offset..offset + l].copy_from_slice(&rest[2..2 + l]);
        bufs.push(b);
        lens.push(l);
        rest = &rest[2 + l..];
    }
    let before: usize = lens.iter().sum();
    let udp_max = if cfg & 64 != 0 { 4 } else { 64 };
    // Which packets merge, in gather mode (no buffer room in the way), is the kernel's decision.
    let pkts: Vec<&[u8]> = bufs.iter().zip(&lens).map(|(b, &l)| &b[offset..offset + l]).collect();
    let want = reference_groups(&pkts, &config, udp_max, checksums);
    let (mut gather_bufs, mut gather_lens, mut gather_write) = (bufs.clone(), lens.clone(), Vec::new());
    let mut gather = Gro::new(config).with_udp_max_segments(udp_max).with_gather(true);
    gather.coalesce(&mut Batch::new(&mut gather_bufs, &mut gather_lens, offset), checksums, &mut gather_write);
    assert_eq!(groups_of(&gather, &gather_write, &gather_lens, offset), want, "the kernel's merge decision");
    // The same batch without the fast path for the next segment of a stream: the same output.
    let (mut slow_bufs, mut slow_lens, mut slow_write) = (bufs.clone(), lens.clone(), Vec::new());
    let mut slow = Gro::new(config).with_udp_max_segments(udp_max).with_fast_path(false);
    let slow_stats = slow.coalesce(&mut Batch::new(&mut slow_bufs, &mut slow_lens, offset), checksums, &mut slow_write);
    let mut gro = Gro::new(config).with_udp_max_segments(udp_max);
    let mut to_write = Vec::new();
    let stats = gro.coalesce(&mut Batch::new(&mut bufs, &mut lens, offset), checksums, &mut to_write);
    assert_eq!((&to_write, stats), (&slow_write, slow_stats));
    for &i in &to_write {
        assert_eq!(bufs[i][..offset + lens[i]], slow_bufs[i][..offset + slow_lens[i]], "packet {i}");
    }
    assert!(to_write.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(stats.written + stats.coalesced, stats.packets);
    let mut segments = 0;
    let mut after = 0;
    for &i in &to_write {
        let b = &bufs[i];
        let hdr = VirtioNetHdrRepr::parse(&b[offset - vnet..offset]).expect("header");
        let pkt = &b[offset..offset + lens[i]];
        let s = Splitter::new(&hdr, pkt, framing).expect("written packets split");
        segments += s.segment_count();
        if s.is_gso() {
            after += pkt.len() - s.hdr_len() + s.segment_count() * s.hdr_len();
            // Each segment of a merged packet carries complete, correct checksums, whatever the caller vouched
            // for: the merged packet leaves with NEEDS_CSUM, so the split computes them from the bytes.
            for k in 0..s.segment_count() {
                let v = s.segment_view(k).expect("view");
                assert!(checksums_ok(&v.to_vec(), framing), "packet {i} segment {k}: checksums ({checksums:?})");
            }
        } else {
            after += pkt.len();
            // Unmerged: a zeroed header, or with partial checksums NEEDS_CSUM where the packet's checksum is.
            match crate::partial::site(pkt, framing) {
                Some(site) if checksums == Checksums::Partial => {
                    assert_eq!(hdr, site.virtio_header());
                    assert!(b[offset - vnet + 10..offset].iter().all(|&x| x == 0));
                    assert_eq!(pkt[site.start + site.offset..][..2], site.seed.to_be_bytes());
                }
                _ => assert!(b[offset - vnet..offset].iter().all(|&x| x == 0)),
            }
        }
    }
    assert_eq!(segments, stats.packets);
    assert_eq!(before, after);
    // Reuse with the same engine must not panic either.
    let _ = gro.coalesce(&mut Batch::new(&mut bufs, &mut lens, offset), checksums, &mut to_write);
}

/// For criterion's `iter_custom`: runs `reset` then `work` on `state` `iters` times and returns the time spent
/// in `work` alone (coalescing changes its input, which must be rebuilt outside the measurement).
pub fn time_after_reset<S>(
    iters: u64,
    state: &mut S,
    mut reset: impl FnMut(&mut S),
    mut work: impl FnMut(&mut S),
) -> std::time::Duration {
    let mut total = std::time::Duration::ZERO;
    for _ in 0..iters {
        reset(state);
        let t = std::time::Instant::now();
        work(state);
        total += t.elapsed();
    }
    total
}

/// Copies `pkts` into the batch's `bufs[i][offset..]` and sets its `lens` (a batch to coalesce, rebuilt before
/// each run).
pub fn load(pkts: &[Vec<u8>], batch: &mut Batch<'_, Vec<u8>>) {
    let Batch { bufs, lens, offset } = batch;
    let off = *offset;
    for (i, p) in pkts.iter().enumerate() {
        bufs[i][off..off + p.len()].copy_from_slice(p);
        lens[i] = p.len();
    }
}

/// The coalesced packets a gather-mode [`Gro`] made of a batch: for each written packet, the input indices it
/// carries in segment order.
pub fn groups_of(gro: &Gro, to_write: &[usize], lens: &[usize], offset: usize) -> Vec<Vec<usize>> {
    to_write.iter().map(|&head| gro.pieces(head, lens, offset).map(|(b, _)| b).collect()).collect()
}

/// A TCP or UDP stream described by fuzz input, for [`gro_model`]: byte 0 chooses the base (TCP/UDP, IPv4/IPv6,
/// IP or Ethernet framing, VLAN tags), byte 1 the checksum state and UDP segment cap, then every two bytes are one
/// packet: the next segment, or one with a field changed (a flag, the window, the ACK number, TTL, TOS, flow
/// label, DF, the IPv4 ID, the options, the payload length, the checksum), a retransmission, or another flow.
pub fn gro_stream(data: &[u8]) -> Option<(GroConfig, Checksums, usize, Vec<Vec<u8>>)> {
    let (&base, rest) = data.split_first()?;
    let (&cfg, mut rest) = rest.split_first()?;
    let kind = [Spec::tcp4(), Spec::tcp6(), Spec::udp4(), Spec::udp6()][usize::from(base & 3)].clone();
    let (framing, vlans) = [(Framing::Ip, 0), (Framing::Ethernet, 0), (Framing::Ethernet, 1), (Framing::Ip, 0)]
        [usize::from((base >> 2) & 3)];
    let mut cur = kind.with_framing(framing, vlans);
    if base & 16 != 0 {
        cur.tcp_opts.clear();
    }
    if base & 32 != 0 {
        cur.v6_dest_opts = 1;
    }
    let checksums = if cfg & 1 != 0 { Checksums::Valid } else { Checksums::Unverified };
    let udp_max = if cfg & 2 != 0 { 3 } else { 64 };
    let config = GroConfig { tcp: true, udp: true, framing, vnet_hdr_len: 10 };
    const SIZE: usize = 100;
    let mut sent: Vec<(Spec, usize)> = Vec::new();
    let mut pkts = Vec::new();
    while rest.len() >= 2 && pkts.len() < 64 {
        let (op, arg) = (rest[0], rest[1]);
        rest = &rest[2..];
        let mut this = cur.clone();
        let mut len = SIZE;
        match op % 16 {
            0..=5 => {}
            6 => len = usize::from(arg) % SIZE,
            7 => len = SIZE + 1 + usize::from(arg) % 50,
            8 => {
                let f = [tcp::flags::PSH, tcp::flags::FIN, tcp::flags::CWR, tcp::flags::ECE, tcp::flags::URG];
                let f = [f.as_slice(), &[tcp::flags::SYN, tcp::flags::RST, 0]].concat()[usize::from(arg) % 8];
                this.tcp_flags |= f;
                if arg & 0x80 != 0 {
                    // The flag stays on the stream's following packets too (an ECE stream, say).
                    cur.tcp_flags |= f & !(tcp::flags::FIN | tcp::flags::SYN | tcp::flags::RST);
                }
            }
            9 => {
                cur.window = u16::from(arg) * 3;
                this.window = cur.window;
            }
            10 => {
                cur.ack = cur.ack.wrapping_add(u32::from(arg));
                this.ack = cur.ack;
            }
            11 => {
                match arg % 5 {
                    0 => cur.ttl = arg,
                    1 => cur.tos = arg & 3,
                    2 => cur.tos = arg & 0xfc,
                    3 => cur.flow_label = u32::from(arg),
                    _ => cur.df = !cur.df,
                }
                this = Spec { seq: this.seq, ip_id: this.ip_id, ..cur.clone() };
            }
            12 => {
                // An ID that jumps, or stays: the fixed-ID rule and its DF condition.
                cur.ip_id = if arg & 1 == 0 { cur.ip_id.wrapping_add(u16::from(arg)) } else { cur.ip_id };
                this.ip_id = cur.ip_id;
            }
            13 => this.bad_csum = true,
            14 if !sent.is_empty() => {
                // A retransmission or a segment out of order.
                let (old, old_len) = sent[usize::from(arg) % sent.len()].clone();
                pkts.push(old.build(&payload(old_len, arg)));
                continue;
            }
            _ => match arg % 6 {
                0 => {
                    cur.sport = cur.sport.wrapping_add(1);
                    this.sport = cur.sport;
                }
                1 => {
                    cur.tcp_opts = vec![1, 1, 8, 10, 0, 0, 0, arg, 0, 0, 0, 2];
                    this.tcp_opts = cur.tcp_opts.clone();
                }
                2 => len = 0,
                3 => this.mac_src[5] ^= 1,
                // IPv6 extension headers (ignored over IPv4): more or fewer, or other bytes in them.
                4 => {
                    cur.v6_dest_opts = (cur.v6_dest_opts + 1) % 3;
                    this.v6_dest_opts = cur.v6_dest_opts;
                }
                _ => this.v6_opts_fill = arg,
            },
        }
        pkts.push(this.build(&payload(len, pkts.len() as u8)));
        sent.push((this.clone(), len));
        let ip_id = cur.ip_id;
        cur = this.next_seg(len);
        cur.tcp_flags = this.tcp_flags & !(tcp::flags::PSH | tcp::flags::FIN | tcp::flags::SYN | tcp::flags::RST);
        cur.bad_csum = false;
        cur.mac_src = this.mac_src;
        // An ID that was held fixed stays so.
        if op % 16 == 12 && arg & 1 != 0 {
            cur.ip_id = ip_id;
        }
    }
    Some((config, checksums, udp_max, pkts))
}

/// Fuzz entry: a stream from [`gro_stream`], coalesced by [`Gro`] (gather mode, with and without the fast path)
/// and by the kernel's merge decision ([`reference_groups`]): the same packets must end up in the same
/// coalesced packets, in the same order.
pub fn gro_model(data: &[u8]) {
    let Some((config, checksums, udp_max, pkts)) = gro_stream(data) else { return };
    let offset = 12;
    let refs: Vec<&[u8]> = pkts.iter().map(Vec::as_slice).collect();
    let want = reference_groups(&refs, &config, udp_max, checksums);
    for fast in [true, false] {
        let mut bufs: Vec<Vec<u8>> = pkts.iter().map(|p| [&[0u8; 12][..], p].concat()).collect();
        let mut lens: Vec<usize> = pkts.iter().map(Vec::len).collect();
        let mut gro = Gro::new(config).with_gather(true).with_fast_path(fast).with_udp_max_segments(udp_max);
        let mut to_write = Vec::new();
        gro.coalesce(&mut Batch::new(&mut bufs, &mut lens, offset), checksums, &mut to_write);
        let got = groups_of(&gro, &to_write, &lens, offset);
        assert_eq!(got, want, "fast path {fast}: coalesced packets differ from the kernel's decision");
    }
}

/// An ICMP error about `data` from each family's source into buffers of several sizes: never a panic; what is
/// written is a well-formed error that quotes the start of `data`, within its size limit; and an error is written
/// exactly when [`crate::icmp_error::recipient`] names someone to send it to.
pub fn icmp_error_about(data: &[u8]) {
    use crate::icmp_error::{destination_unreachable, recipient, verify, NoError};
    let sources = [std::net::IpAddr::from([10, 0, 0, 1]), std::net::IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1])];
    let mut out = [0u8; crate::icmp_error::IPV6_MAX_LEN + 64];
    for source in sources {
        for room in [0, 27, 47, 48, 100, 576, out.len()] {
            match destination_unreachable(data, source, &mut out[..room]) {
                Ok(n) => {
                    assert!(n <= room && verify(&out[..n], data), "a bad error about {data:?}");
                    assert!(recipient(data).is_ok());
                }
                Err(NoError::WrongFamily | NoError::NoRoom) => assert!(recipient(data).is_ok()),
                Err(why) => assert_eq!(recipient(data), Err(why)),
            }
        }
    }
}
