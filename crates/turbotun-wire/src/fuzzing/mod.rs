//! Entry points shared by the cargo-fuzz targets and the corpus replay test, and packet builders for tests and
//! benches, compiled only with the `fuzzing` feature. Not part of the public API; may change at any time.
#![allow(missing_docs)]

mod gro_reference;
mod reference_wire;
pub use gro_reference::{reference_groups, reference_groups_with, Differences};
/// Whether a packet's IPv4 header and TCP/UDP checksums verify, by the oracle's own parsing and checksum (never
/// the crate's, which is what the tests check with it).
pub use reference_wire::checksums_ok;

use crate::checksum;
use crate::gro::{Checksums, Gro, GroConfig};
use crate::gso::Splitter;
use crate::virtio_net::{flags, gso, VirtioNetHdrRepr};
use crate::{ethernet, ipv4, ipv6, tcp, udp, Batch, Framing, IPPROTO_TCP, IPPROTO_UDP};

/// Description of one test packet; [`Spec::build`] makes it with valid checksums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub framing: Framing,
    /// Number of VLAN tags (0..=2) for Ethernet framing.
    pub vlans: usize,
    pub mac_src: [u8; 6],
    pub v6: bool,
    pub udp: bool,
    pub src4: [u8; 4],
    pub dst4: [u8; 4],
    pub src6: [u8; 16],
    pub dst6: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub tcp_flags: u8,
    pub window: u16,
    /// TCP option bytes (length a multiple of 4, at most 40).
    pub tcp_opts: Vec<u8>,
    pub ip_id: u16,
    pub df: bool,
    pub mf: bool,
    pub ttl: u8,
    pub tos: u8,
    pub flow_label: u32,
    /// IPv4 option bytes (multiple of 4).
    pub ip_opts: Vec<u8>,
    /// IPv6: number of 8-byte destination-options headers before L4.
    pub v6_dest_opts: usize,
    /// The last byte of each destination-options header (inside its PadN option: any value is valid).
    pub v6_opts_fill: u8,
    /// IPv4 UDP: send checksum 0 ("none").
    pub udp_zero_csum: bool,
    /// Corrupt the L4 checksum.
    pub bad_csum: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            framing: Framing::Ip,
            vlans: 0,
            mac_src: [2, 0, 0, 0, 0, 2],
            v6: false,
            udp: false,
            src4: [192, 0, 2, 1],
            dst4: [198, 51, 100, 2],
            src6: [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            dst6: [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            sport: 40000,
            dport: 5201,
            seq: 1_000_000,
            ack: 77,
            tcp_flags: tcp::flags::ACK,
            window: 512,
            tcp_opts: vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2],
            ip_id: 1000,
            df: true,
            mf: false,
            ttl: 64,
            tos: 0,
            flow_label: 0x12345,
            ip_opts: Vec::new(),
            v6_dest_opts: 0,
            v6_opts_fill: 0,
            udp_zero_csum: false,
            bad_csum: false,
        }
    }
}

impl Spec {
    pub fn tcp4() -> Self {
        Spec::default()
    }
    pub fn tcp6() -> Self {
        Spec { v6: true, ..Spec::default() }
    }
    pub fn udp4() -> Self {
        Spec { udp: true, ..Spec::default() }
    }
    pub fn udp6() -> Self {
        Spec { v6: true, udp: true, ..Spec::default() }
    }
    pub fn with_framing(mut self, framing: Framing, vlans: usize) -> Self {
        self.framing = framing;
        self.vlans = vlans;
        self
    }

    pub fn l2_len(&self) -> usize {
        match self.framing {
            Framing::Ip => 0,
            Framing::Ethernet => ethernet::HEADER_LEN + self.vlans * ethernet::VLAN_TAG_LEN,
        }
    }
    pub fn l4_offset(&self) -> usize {
        self.l2_len() + if self.v6 { 40 + 8 * self.v6_dest_opts } else { 20 + self.ip_opts.len() }
    }
    pub fn hdr_len(&self) -> usize {
        self.l4_offset() + if self.udp { 8 } else { 20 + self.tcp_opts.len() }
    }
    fn pseudo(&self, l4_len: usize) -> u32 {
        let proto = if self.udp { IPPROTO_UDP } else { IPPROTO_TCP };
        if self.v6 {
            checksum::pseudo_header_v6(self.src6, self.dst6, proto, l4_len as u32)
        } else {
            checksum::pseudo_header_v4(self.src4, self.dst4, proto, l4_len as u32)
        }
    }

    /// Builds the headers for `payload_len` bytes of payload (checksum field zero) into a vector.
    fn headers(&self, payload_len: usize) -> Vec<u8> {
        let hl = self.hdr_len();
        let mut p = vec![0u8; hl];
        let l2 = self.l2_len();
        if self.framing == Framing::Ethernet {
            let mut vlans = [None; 2];
            for (i, v) in vlans.iter_mut().enumerate().take(self.vlans.min(2)) {
                *v = Some((if i == 0 && self.vlans == 2 { 0x88a8 } else { 0x8100 }, 100 + i as u16));
            }
            let et = if self.v6 { ethernet::ETHERTYPE_IPV6 } else { ethernet::ETHERTYPE_IPV4 };
            ethernet::Repr { dst: [2, 0, 0, 0, 0, 1], src: self.mac_src, vlans, ethertype: et }
                .emit(&mut p)
                .expect("room");
        }
        let l4 = self.l4_offset();
        let l4_len = hl - l4 + payload_len;
        let proto = if self.udp { IPPROTO_UDP } else { IPPROTO_TCP };
        if self.v6 {
            let nh = if self.v6_dest_opts > 0 { ipv6::next_header::DEST_OPTS } else { proto };
            ipv6::Repr {
                src: self.src6,
                dst: self.dst6,
                next_header: nh,
                payload_len: (hl - l2 - 40 + payload_len) as u16,
                hop_limit: self.ttl,
                traffic_class: self.tos,
                flow_label: self.flow_label,
            }
            .emit(&mut p[l2..])
            .expect("room");
            for i in 0..self.v6_dest_opts {
                let o = l2 + 40 + 8 * i;
                let next = if i + 1 == self.v6_dest_opts { proto } else { ipv6::next_header::DEST_OPTS };
                p[o..o + 8].copy_from_slice(&[next, 0, 1, 4, 0, 0, 0, self.v6_opts_fill]);
            }
        } else {
            let ihl = 20 + self.ip_opts.len();
            let mut ip = ipv4::Packet::new_unchecked(&mut p[l2..l2 + ihl]);
            ip.set_version_and_header_len(ihl);
            ip.set_tos(self.tos);
            ip.set_total_len((hl - l2 + payload_len) as u16);
            ip.set_ident(self.ip_id);
            let mut ff = 0;
            if self.df {
                ff |= ipv4::FLAG_DF;
            }
            if self.mf {
                ff |= ipv4::FLAG_MF;
            }
            ip.set_flags_frag(ff);
            ip.set_ttl(self.ttl);
            ip.set_protocol(proto);
            ip.set_src_addr(self.src4);
            ip.set_dst_addr(self.dst4);
            p[l2 + 20..l2 + ihl].copy_from_slice(&self.ip_opts);
            ipv4::Packet::new_unchecked(&mut p[l2..l2 + ihl]).fill_checksum();
        }
        if self.udp {
            udp::Repr { src_port: self.sport, dst_port: self.dport, payload_len: (l4_len - 8) as u16 }
                .emit(&mut p[l4..])
                .expect("room");
        } else {
            tcp::Repr {
                src_port: self.sport,
                dst_port: self.dport,
                seq: self.seq,
                ack: self.ack,
                flags: self.tcp_flags,
                window: self.window,
            }
            .emit(&mut p[l4..])
            .expect("room");
            let mut t = tcp::Packet::new_unchecked(&mut p[l4..]);
            t.set_header_len(20 + self.tcp_opts.len());
            t.options_mut().copy_from_slice(&self.tcp_opts);
        }
        p
    }

    /// A complete packet with valid checksums (unless `bad_csum`/`udp_zero_csum`).
    pub fn build(&self, payload: &[u8]) -> Vec<u8> {
        let mut p = self.headers(payload.len());
        p.extend_from_slice(payload);
        let l4 = self.l4_offset();
        let at = l4 + if self.udp { 6 } else { 16 };
        let mut c = checksum::checksum(&p[l4..], self.pseudo(p.len() - l4));
        if self.udp && c == 0 {
            c = 0xffff;
        }
        if self.udp && self.udp_zero_csum {
            c = 0;
        }
        if self.bad_csum {
            c = c.wrapping_add(1) | 1;
        }
        p[at..at + 2].copy_from_slice(&c.to_be_bytes());
        p
    }

    /// A super-packet as the kernel hands it out (NEEDS_CSUM, pseudo-header sum in the checksum field).
    pub fn build_gso(&self, payload: &[u8], gso_size: u16) -> (VirtioNetHdrRepr, Vec<u8>) {
        let mut p = self.headers(payload.len());
        p.extend_from_slice(payload);
        let l4 = self.l4_offset();
        let off = if self.udp { 6 } else { 16 };
        let ps = checksum::fold(self.pseudo(p.len() - l4));
        p[l4 + off..l4 + off + 2].copy_from_slice(&ps.to_be_bytes());
        let gso_type = match (self.udp, self.v6) {
            (true, _) => gso::UDP_L4,
            (false, false) => gso::TCPV4,
            (false, true) => gso::TCPV6,
        };
        let hdr = VirtioNetHdrRepr {
            flags: flags::NEEDS_CSUM,
            gso_type,
            hdr_len: self.hdr_len() as u16,
            gso_size,
            csum_start: l4 as u16,
            csum_offset: off as u16,
        };
        (hdr, p)
    }

    /// The segments the kernel would produce from [`Spec::build_gso`] (FIN/PSH only last, CWR only first).
    pub fn segments(&self, payload: &[u8], gso_size: usize) -> Vec<Vec<u8>> {
        let chunks: Vec<&[u8]> =
            if payload.is_empty() { vec![payload] } else { payload.chunks(gso_size.max(1)).collect() };
        let n = chunks.len();
        chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut s = self.clone();
                s.ip_id = self.ip_id.wrapping_add(i as u16);
                s.seq = self.seq.wrapping_add((i * gso_size) as u32);
                if i + 1 != n {
                    s.tcp_flags &= !(tcp::flags::FIN | tcp::flags::PSH);
                }
                if i != 0 {
                    s.tcp_flags &= !tcp::flags::CWR;
                }
                s.build(c)
            })
            .collect()
    }

    /// The `i`-th follow-on segment of a stream: seq and ID advanced, same sizes.
    pub fn next_seg(&self, payload_len: usize) -> Spec {
        let mut s = self.clone();
        s.seq = s.seq.wrapping_add(payload_len as u32);
        s.ip_id = s.ip_id.wrapping_add(1);
        s
    }
}

/// A UDP-tunnel super-packet: `outer` (a UDP spec, its framing the device's) carries `tunnel` (a VXLAN or
/// Geneve header, opaque here) followed by `inner` (an Ethernet-framed TCP or UDP spec).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelSpec {
    pub outer: Spec,
    pub tunnel: Vec<u8>,
    pub inner: Spec,
    /// `UDP_TUNNEL_CSUM`: segments carry a complete outer UDP checksum (else 0).
    pub outer_csum: bool,
}

/// A VXLAN header with VNI 42 (flags: the I bit).
pub const VXLAN_HEADER: [u8; 8] = [0x08, 0, 0, 0, 0, 0, 42, 0];
/// A Geneve header with VNI 42, protocol Transparent Ethernet Bridging, and one 8-byte option.
pub const GENEVE_HEADER: [u8; 16] = [0x02, 0, 0x65, 0x58, 0, 0, 42, 0, 0x01, 0x02, 0x03, 0x01, 0xde, 0xad, 0xbe, 0xef];

impl TunnelSpec {
    /// VXLAN (port 4789) over `outer_v6`, around `inner` (whose framing becomes Ethernet).
    pub fn vxlan(outer_v6: bool, framing: Framing, inner: Spec) -> Self {
        let outer = Spec { v6: outer_v6, udp: true, dport: 4789, sport: 51000, ..Spec::default() };
        TunnelSpec {
            outer: outer.with_framing(framing, 0),
            tunnel: VXLAN_HEADER.to_vec(),
            inner: inner.with_framing(Framing::Ethernet, 0),
            outer_csum: outer_v6,
        }
    }

    fn inner_start(&self) -> usize {
        self.outer.l4_offset() + 8 + self.tunnel.len()
    }

    /// Offset of the inner IP header.
    pub fn inner_nh(&self) -> usize {
        self.inner_start() + self.inner.l2_len()
    }

    /// The super-packet as the kernel hands it out, with its virtio header and tunnel offsets.
    pub fn build_gso(&self, payload: &[u8], gso_size: u16) -> (VirtioNetHdrRepr, crate::TunnelOffsets, Vec<u8>) {
        let (inner_hdr, inner) = self.inner.build_gso(payload, gso_size);
        let mut carried = self.tunnel.clone();
        carried.extend_from_slice(&inner);
        let packet = self.outer.build(&carried);
        let start = self.inner_start();
        let tunnel_bit = if self.outer.v6 { gso::UDP_TUNNEL_IPV6 } else { gso::UDP_TUNNEL_IPV4 };
        let hdr = VirtioNetHdrRepr {
            flags: inner_hdr.flags | if self.outer_csum { flags::UDP_TUNNEL_CSUM } else { 0 },
            gso_type: inner_hdr.gso_type | tunnel_bit,
            hdr_len: (start + usize::from(inner_hdr.hdr_len)) as u16,
            gso_size,
            csum_start: (start + usize::from(inner_hdr.csum_start)) as u16,
            csum_offset: inner_hdr.csum_offset,
        };
        let offsets =
            crate::TunnelOffsets { outer_th: self.outer.l4_offset() as u16, inner_nh: self.inner_nh() as u16 };
        (hdr, offsets, packet)
    }

    /// The frames the kernel would put on the wire for [`Self::build_gso`]: each inner segment in its own outer
    /// packet (outer IPv4 ID + i, outer UDP checksum complete or 0).
    pub fn segments(&self, payload: &[u8], gso_size: usize) -> Vec<Vec<u8>> {
        self.inner
            .segments(payload, gso_size)
            .into_iter()
            .enumerate()
            .map(|(i, inner)| {
                let mut outer = self.outer.clone();
                outer.ip_id = self.outer.ip_id.wrapping_add(i as u16);
                outer.udp_zero_csum = !self.outer_csum;
                let mut carried = self.tunnel.clone();
                carried.extend_from_slice(&inner);
                outer.build(&carried)
            })
            .collect()
    }
}

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
