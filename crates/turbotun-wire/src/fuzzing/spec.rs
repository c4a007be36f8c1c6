//! Packet builders for tests, benches and the fuzz targets: [`Spec`] describes one TCP or UDP packet (and builds
//! it, a super-packet of it or the segments the kernel would make of that), [`TunnelSpec`] a UDP-tunnel
//! super-packet around one.

use crate::checksum;
use crate::virtio_net::{flags, gso, VirtioNetHdrRepr};
use crate::{ethernet, ipv4, ipv6, tcp, udp, Framing, IPPROTO_TCP, IPPROTO_UDP};

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
