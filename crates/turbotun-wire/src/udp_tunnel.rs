//! UDP-tunnel GSO (Linux 6.17+, `TUN_F_UDP_TUNNEL_GSO`): split a VXLAN/Geneve-in-UDP super-packet read from a
//! TAP or TUN device into wire-sized frames, each a complete outer packet around one inner segment.
//!
//! Such a super-packet is `outer IP + outer UDP + tunnel header + inner Ethernet + inner IP + inner TCP/UDP +
//! payload` (behind an outer Ethernet header on TAP). Its virtio header is the 24-byte
//! `virtio_net_hdr_v1_hash_tunnel`: `gso_type` is the inner kind (`TCPV4`, `TCPV6`, `UDP_L4`, ECN bit allowed)
//! plus `UDP_TUNNEL_IPV4` or `UDP_TUNNEL_IPV6` for the outer IP version; `csum_start` points at the inner
//! transport header; the tunnel fields give the outer UDP header (`outer_th_offset`) and the inner IP header
//! (`inner_nh_offset`); `flags` has `NEEDS_CSUM` and, when the outer UDP checksum is to be filled in,
//! `UDP_TUNNEL_CSUM`.
//!
//! The bytes between the outer UDP header and the inner IP header (tunnel header, options, inner Ethernet) are
//! copied into every segment unchanged, so VXLAN and Geneve need no code of their own. The inner packet is split
//! by [`Splitter`], with all its rules; each segment's outer headers then get: IPv4 total length, ID (the first
//! ID plus the segment's index) and header checksum, or IPv6 payload length; UDP length; and the outer UDP
//! checksum, complete over the whole segment with `UDP_TUNNEL_CSUM` (0 sent as 0xffff), 0 without it.

use crate::checksum;
use crate::gro::{flow, rules, segment, DEFAULT_UDP_MAX_SEGMENTS, MAX_PACKET_LEN};
use crate::gso::{Splitter, MAX_HEADER_LEN};
use crate::ipv4;
use crate::ipv6;
use crate::udp;
use crate::virtio_net::{flags, gso, TunnelOffsets, VirtioNetHdrRepr};
use crate::{locate_ip, Batch, Framing, GsoError, SplitProgress, WireError, IPPROTO_UDP};

/// A validated UDP-tunnel super-packet. Construction checks every offset; afterwards nothing can panic.
#[derive(Debug, Clone)]
pub struct TunnelSplitter<'a> {
    packet: &'a [u8],
    inner: Splitter<'a>,
    outer_l3: usize,
    outer_v6: bool,
    outer_th: usize,
    inner_nh: usize,
    outer_csum: bool,
    outer_id: u16,
    /// Pseudo-header sum of the outer addresses and protocol (without the length).
    outer_addr_sum: u32,
}

fn bad(why: &'static str) -> GsoError {
    GsoError::BadTunnel(why)
}

impl<'a> TunnelSplitter<'a> {
    /// Validates a UDP-tunnel super-packet: `hdr` and `offsets` from its 24-byte virtio header, `packet` what
    /// follows it (from the outer Ethernet header on TAP, the outer IP header on TUN).
    pub fn new(
        hdr: &VirtioNetHdrRepr,
        offsets: TunnelOffsets,
        packet: &'a [u8],
        framing: Framing,
    ) -> Result<Self, GsoError> {
        let tunnel = hdr.gso_type & gso::UDP_TUNNEL;
        if tunnel == 0 {
            return Err(bad("gso_type has no UDP tunnel bit"));
        }
        if tunnel == gso::UDP_TUNNEL {
            return Err(bad("gso_type has both the IPv4 and the IPv6 tunnel bit"));
        }
        let inner_kind = hdr.inner_gso_kind();
        if !matches!(inner_kind, gso::TCPV4 | gso::TCPV6 | gso::UDP_L4) {
            return Err(GsoError::UnsupportedGsoType(hdr.gso_type));
        }
        if !hdr.needs_csum() {
            return Err(bad("NEEDS_CSUM is missing (the kernel never sends a tunnel super-packet without it)"));
        }

        let (outer_l3, version) = locate_ip(packet, framing)?;
        let outer_v6 = version == 6;
        if outer_v6 != (tunnel == gso::UDP_TUNNEL_IPV6) {
            return Err(bad("the outer IP version does not match the tunnel bit of gso_type"));
        }
        let (outer_id, outer_addr_sum, l4) = if outer_v6 {
            let p = ipv6::Packet::new_checked(&packet[outer_l3..])?;
            let info = p.l4_info()?;
            if info.fragment || info.protocol != IPPROTO_UDP {
                return Err(bad("the outer IPv6 packet is not one unfragmented UDP datagram"));
            }
            (0, checksum::pseudo_header_v6(p.src_addr(), info.final_dst, IPPROTO_UDP, 0), outer_l3 + info.offset)
        } else {
            let p = ipv4::Packet::new_checked(&packet[outer_l3..])?;
            if p.is_fragment() || p.protocol() != IPPROTO_UDP {
                return Err(bad("the outer IPv4 packet is not one unfragmented UDP datagram"));
            }
            let sum = checksum::pseudo_header_v4(p.src_addr(), p.dst_addr(), IPPROTO_UDP, 0);
            (p.ident(), sum, outer_l3 + p.header_len())
        };
        let (outer_th, inner_nh) = (usize::from(offsets.outer_th), usize::from(offsets.inner_nh));
        if outer_th != l4 {
            return Err(bad("outer_th_offset does not point at the outer UDP header"));
        }
        if inner_nh < outer_th + udp::HEADER_LEN || inner_nh >= packet.len() {
            return Err(bad("inner_nh_offset is not between the outer UDP header and the end of the packet"));
        }
        if inner_nh > MAX_HEADER_LEN {
            return Err(GsoError::HeaderTooLarge { len: inner_nh, max: MAX_HEADER_LEN });
        }
        let csum_start = usize::from(hdr.csum_start);
        if csum_start < inner_nh {
            return Err(GsoError::CsumStartMismatch { csum_start, l4_offset: inner_nh });
        }
        let inner_hdr = VirtioNetHdrRepr {
            flags: flags::NEEDS_CSUM,
            gso_type: inner_kind | (hdr.gso_type & gso::ECN),
            hdr_len: 0,
            gso_size: hdr.gso_size,
            csum_start: (csum_start - inner_nh) as u16,
            csum_offset: hdr.csum_offset,
        };
        let inner = Splitter::new(&inner_hdr, &packet[inner_nh..], Framing::Ip)?;
        let largest = inner_nh - outer_l3 + inner.segment_len(0);
        if largest > 65535 {
            return Err(GsoError::Wire(WireError::BadLength {
                what: "outer segment IP length",
                field: largest,
                actual: 65535,
            }));
        }
        Ok(TunnelSplitter {
            packet,
            inner,
            outer_l3,
            outer_v6,
            outer_th,
            inner_nh,
            outer_csum: hdr.flags & flags::UDP_TUNNEL_CSUM != 0,
            outer_id,
            outer_addr_sum,
        })
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.inner.segment_count()
    }

    /// Inner payload bytes per segment (the last may be shorter).
    pub fn gso_size(&self) -> usize {
        self.inner.gso_size()
    }

    /// Offset of the inner IP header (where the opaque tunnel bytes end).
    pub fn inner_offset(&self) -> usize {
        self.inner_nh
    }

    /// Offset of the outer UDP header.
    pub fn outer_udp_offset(&self) -> usize {
        self.outer_th
    }

    /// Length of every header of a segment: outer, tunnel and inner.
    pub fn header_len(&self) -> usize {
        self.inner_nh + self.inner.hdr_len()
    }

    /// Whether the outer IP header is IPv6.
    pub fn outer_is_ipv6(&self) -> bool {
        self.outer_v6
    }

    /// Whether each segment gets a complete outer UDP checksum (`UDP_TUNNEL_CSUM`); without it the field is 0.
    pub fn outer_checksum(&self) -> bool {
        self.outer_csum
    }

    /// Length of segment `index` (0 beyond the last).
    pub fn segment_len(&self, index: usize) -> usize {
        match self.inner.segment_len(index) {
            0 => 0,
            n => self.inner_nh + n,
        }
    }

    /// Writes segment `index` (outer headers patched, inner segment as [`Splitter`] cuts it, every checksum
    /// complete) into `out`; returns its length.
    pub fn write_segment(&self, index: usize, out: &mut [u8]) -> Result<usize, GsoError> {
        let inner_len = self.inner.segment_len(index);
        if inner_len == 0 {
            return Err(GsoError::IndexOutOfRange { index, count: self.segment_count() });
        }
        let total = self.inner_nh + inner_len;
        if out.len() < total {
            return Err(GsoError::BufferTooSmall { need: total, have: out.len() });
        }
        let out = &mut out[..total];
        out[..self.inner_nh].copy_from_slice(&self.packet[..self.inner_nh]);
        self.inner.write_segment(index, &mut out[self.inner_nh..])?;
        self.patch_outer(index, out);
        Ok(total)
    }

    /// Outer IP length (and IPv4 ID and header checksum), UDP length and checksum of a segment in `seg`.
    fn patch_outer(&self, index: usize, seg: &mut [u8]) {
        let total = seg.len();
        if self.outer_v6 {
            if let Ok(mut ip) = ipv6::Packet::new_checked(&mut seg[self.outer_l3..]) {
                ip.set_payload_len((total - self.outer_l3 - ipv6::HEADER_LEN) as u16);
            }
        } else if let Ok(mut ip) = ipv4::Packet::new_checked(&mut seg[self.outer_l3..]) {
            ip.set_total_len((total - self.outer_l3) as u16);
            ip.set_ident(self.outer_id.wrapping_add(index as u16));
            ip.fill_checksum();
        }
        let udp_len = total - self.outer_th;
        let mut u = udp::Packet::new_unchecked(&mut seg[self.outer_th..]);
        u.set_len(udp_len as u16);
        u.set_checksum(0);
        if self.outer_csum {
            let pseudo = self.outer_addr_sum + udp_len as u32;
            let c = checksum::finish(checksum::sum(&seg[self.outer_th..], pseudo));
            let c = if c == 0 { 0xffff } else { c };
            udp::Packet::new_unchecked(&mut seg[self.outer_th..]).set_checksum(c);
        }
    }

    /// Writes segments `first, first + 1, ...` into the batch's `bufs[i][offset..]` and their lengths into
    /// `lens[i]`, as many as fit, like [`Splitter::split_into`].
    pub fn split_into<B: AsMut<[u8]>>(
        &self,
        first: usize,
        batch: &mut Batch<'_, B>,
    ) -> Result<SplitProgress, GsoError> {
        crate::gso::split_batch(
            first,
            self.segment_count(),
            batch,
            |index, out| self.write_segment(index, out),
            |index| self.segment_len(index),
        )
    }
}

/// The tunnel header in front of the inner Ethernet frame, which the coalescer must step over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelKind {
    /// VXLAN: 8 bytes (RFC 7348).
    Vxlan,
    /// Geneve: 8 bytes plus the options its header announces; protocol Transparent Ethernet Bridging
    /// (RFC 8926).
    Geneve,
}

/// What [`coalesce_tunnel`] made of a run of frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelMerge {
    /// How many frames from the start of the run it took (at least 1).
    pub frames: usize,
    /// Length of what it wrote into the output buffer.
    pub len: usize,
    /// The virtio header and tunnel fields to write in front of it when `frames > 1` (a UDP-tunnel super-packet
    /// for a 24-byte header); `None` when the first frame could not be merged with the next: the output is that
    /// frame unchanged, to be written with a zeroed header.
    pub header: Option<(VirtioNetHdrRepr, TunnelOffsets)>,
}

/// The outer headers of one frame as the coalescer sees them (the inner packet is the GRO rules' business,
/// [`flow::FlowRun`]).
#[derive(Debug, Clone, Copy)]
struct Outer {
    l3: usize,
    v6: bool,
    /// Offset of the outer UDP header.
    th: usize,
    /// Offset of the inner Ethernet header (after the tunnel header).
    eth: usize,
    /// IPv4 ID and DF (0 and false over IPv6).
    id: u16,
    df: bool,
    /// Whether the outer UDP checksum is present (not 0).
    csum: bool,
}

/// Parses one frame's outer headers: IPv4 without options and not a fragment, or IPv6 with UDP right after the
/// fixed header; lengths matching the frame; the IPv4 header checksum, and the outer UDP checksum unless it is 0;
/// the tunnel header's length. `None` for anything else.
fn parse_outer(f: &[u8], framing: Framing, kind: TunnelKind) -> Option<Outer> {
    let (l3, version) = locate_ip(f, framing).ok()?;
    let v6 = version == 6;
    let ip = &f[l3..];
    let (id, df, th, addr_sum) = if v6 {
        let p = ipv6::Packet::new_checked(ip).ok()?;
        if usize::from(p.payload_len()) + ipv6::HEADER_LEN != ip.len() || p.next_header() != IPPROTO_UDP {
            return None;
        }
        (0, false, l3 + ipv6::HEADER_LEN, checksum::pseudo_header_v6(p.src_addr(), p.dst_addr(), IPPROTO_UDP, 0))
    } else {
        let p = ipv4::Packet::new_checked(ip).ok()?;
        let ok = p.header_len() == ipv4::MIN_HEADER_LEN
            && !p.is_fragment()
            && usize::from(p.total_len()) == ip.len()
            && p.protocol() == IPPROTO_UDP
            && segment::ipv4_header_sum_ok(ip);
        if !ok {
            return None;
        }
        let sum = checksum::pseudo_header_v4(p.src_addr(), p.dst_addr(), IPPROTO_UDP, 0);
        (p.ident(), p.dont_frag(), l3 + ipv4::MIN_HEADER_LEN, sum)
    };
    let u = udp::Packet::new_checked(f.get(th..)?).ok()?;
    if usize::from(u.len()) != f.len() - th {
        return None;
    }
    // A zero outer UDP checksum is "none", over IPv6 too: tunnels may send that (RFC 6935; Linux VXLAN with
    // `udp6zerocsumtx`). A present one must verify.
    let csum = u.checksum() != 0;
    if csum && !segment::l4_checksum_ok(&f[th..], addr_sum, true, v6) {
        return None;
    }
    let tunnel = th + udp::HEADER_LEN;
    let tunnel_len = match kind {
        TunnelKind::Vxlan => 8,
        TunnelKind::Geneve => {
            let g = f.get(tunnel..tunnel + 8)?;
            if u16::from_be_bytes([g[2], g[3]]) != 0x6558 {
                return None;
            }
            8 + usize::from(g[0] & 0x3f) * 4
        }
    };
    let eth = tunnel + tunnel_len;
    (eth < f.len()).then_some(Outer { l3, v6, th, eth, id, df, csum })
}

/// Whether frame `b`'s outer headers agree with the run's first frame `a` wherever one super-packet's segments
/// agree: the outer layer-2 header, tunnel header (and options) byte for byte; the outer IP and UDP headers
/// under the GRO field tables (lengths, IPv4 ID and checksums left to their own rules).
fn outer_headers_match(a: &[u8], b: &[u8], p: &Outer) -> bool {
    let udp_end = p.th + udp::HEADER_LEN;
    a[..p.l3] == b[..p.l3]
        && rules::ip_headers_match(&a[p.l3..], &b[p.l3..], p.v6)
        && rules::l4_headers_match(&a[p.th..udp_end], &b[p.th..udp_end], true)
        && a[udp_end..p.eth] == b[udp_end..p.eth]
}

/// GRO for UDP tunnels: merges the longest run of `frames`, from the first, that the kernel would have cut from
/// one tunnel super-packet, into one such super-packet written into `out`. The inner packets follow the rules
/// of [`crate::gro::Gro`] for one flow in order (the same field tables, segment rules and checksum checks); the
/// outer headers agree as the segments of one super-packet do, each frame's outer IPv4 ID follows the same ID
/// rule, and every checksum verifies. The result has the inner checksum left partial (`NEEDS_CSUM`, the field
/// holding the pseudo-header sum), and, when the frames carried an outer UDP checksum, `UDP_TUNNEL_CSUM` with the
/// outer field holding its pseudo-header sum too; it is meant for a device with `TUN_F_UDP_TUNNEL_GSO` and a
/// 24-byte header. A first frame that cannot be merged is copied as it is (`header: None`).
pub fn coalesce_tunnel(
    frames: &[&[u8]],
    framing: Framing,
    kind: TunnelKind,
    out: &mut [u8],
) -> Result<TunnelMerge, GsoError> {
    let Some(first) = frames.first() else {
        return Err(GsoError::IndexOutOfRange { index: 0, count: 0 });
    };
    let plain = |out: &mut [u8]| -> Result<TunnelMerge, GsoError> {
        let dst = out.get_mut(..first.len()).ok_or(GsoError::BufferTooSmall { need: first.len(), have: 0 })?;
        dst.copy_from_slice(first);
        Ok(TunnelMerge { frames: 1, len: first.len(), header: None })
    };
    let Some(p) = parse_outer(first, framing, kind) else {
        return plain(out);
    };
    let Some(mut run) = flow::FlowRun::start(&first[p.eth..], Framing::Ethernet, DEFAULT_UDP_MAX_SEGMENTS) else {
        return plain(out);
    };
    if p.eth + run.hdr_len() > MAX_HEADER_LEN {
        return plain(out);
    }
    let (mut count, mut total) = (1usize, first.len());
    let mut outer_ids = segment::IdMode::Unknown;
    for f in &frames[1..] {
        let Some(q) = parse_outer(f, framing, kind) else { break };
        let payload = f.len().saturating_sub(q.eth + run.hdr_len());
        let outer_id = if p.v6 { Some(outer_ids) } else { segment::ipv4_id_rule(p.id, count, q.id, q.df, outer_ids) };
        let fits = q.eth == p.eth
            && q.csum == p.csum
            && outer_headers_match(first, f, &p)
            && total + payload - p.l3 <= MAX_PACKET_LEN;
        let Some(outer_id) = outer_id else { break };
        if !fits || !run.push(&first[p.eth..], &f[p.eth..]) {
            break;
        }
        outer_ids = outer_id;
        count += 1;
        total += payload;
    }
    if count == 1 {
        return plain(out);
    }
    if out.len() < total {
        return Err(GsoError::BufferTooSmall { need: total, have: out.len() });
    }
    out[..first.len()].copy_from_slice(first);
    let hdr_len = p.eth + run.hdr_len();
    let mut at = first.len();
    for f in &frames[1..count] {
        let body = &f[hdr_len..];
        out[at..at + body.len()].copy_from_slice(body);
        at += body.len();
    }
    patch_merged(&mut out[..total], &p, &run);
    let (udp, inner_v6) = run.udp_v6();
    let tunnel_bit = if p.v6 { gso::UDP_TUNNEL_IPV6 } else { gso::UDP_TUNNEL_IPV4 };
    let inner_kind = match (udp, inner_v6) {
        (true, _) => gso::UDP_L4,
        (false, false) => gso::TCPV4,
        (false, true) => gso::TCPV6,
    };
    let hdr = VirtioNetHdrRepr {
        flags: flags::NEEDS_CSUM | if p.csum { flags::UDP_TUNNEL_CSUM } else { 0 },
        gso_type: inner_kind | tunnel_bit,
        hdr_len: hdr_len as u16,
        gso_size: run.gso_size() as u16,
        csum_start: (p.eth + run.l4()) as u16,
        csum_offset: if udp { udp::CHECKSUM_OFFSET } else { crate::tcp::CHECKSUM_OFFSET } as u16,
    };
    let offsets = TunnelOffsets { outer_th: p.th as u16, inner_nh: (p.eth + run.l3()) as u16 };
    Ok(TunnelMerge { frames: count, len: total, header: Some((hdr, offsets)) })
}

/// The merged packet's lengths, IPv4 header checksums, FIN and PSH of its last segment, and its partial
/// checksums (pseudo-header sums).
fn patch_merged(seg: &mut [u8], p: &Outer, run: &flow::FlowRun) {
    let total = seg.len();
    let set_ip = |seg: &mut [u8], l3: usize, v6: bool| {
        if v6 {
            ipv6::Packet::new_unchecked(&mut seg[l3..]).set_payload_len((total - l3 - ipv6::HEADER_LEN) as u16);
        } else {
            let mut ip = ipv4::Packet::new_unchecked(&mut seg[l3..l3 + ipv4::MIN_HEADER_LEN]);
            ip.set_total_len((total - l3) as u16);
            ip.fill_checksum();
        }
    };
    let (udp, inner_v6) = run.udp_v6();
    set_ip(seg, p.l3, p.v6);
    set_ip(seg, p.eth + run.l3(), inner_v6);
    let outer_udp_len = total - p.th;
    let outer_check = if p.csum {
        let ip = &seg[p.l3..];
        let sum = if p.v6 {
            let ip = ipv6::Packet::new_unchecked(ip);
            checksum::pseudo_header_v6(ip.src_addr(), ip.dst_addr(), IPPROTO_UDP, outer_udp_len as u32)
        } else {
            let ip = ipv4::Packet::new_unchecked(ip);
            checksum::pseudo_header_v4(ip.src_addr(), ip.dst_addr(), IPPROTO_UDP, outer_udp_len as u32)
        };
        checksum::fold(sum)
    } else {
        0
    };
    let mut u = udp::Packet::new_unchecked(&mut seg[p.th..]);
    u.set_len(outer_udp_len as u16);
    u.set_checksum(outer_check);
    let l4 = p.eth + run.l4();
    let l4_len = total - l4;
    let check = checksum::fold(checksum::add(run.addr_sum(&seg[p.eth..]), l4_len as u32));
    if udp {
        let mut u = udp::Packet::new_unchecked(&mut seg[l4..]);
        u.set_len(l4_len as u16);
        u.set_checksum(check);
    } else {
        let mut t = crate::tcp::Packet::new_unchecked(&mut seg[l4..]);
        let f = t.flags();
        t.set_flags(f | run.last_segment_flags());
        t.set_checksum(check);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{payload, Spec, TunnelSpec, GENEVE_HEADER};
    use crate::tcp;

    fn split_all(spec: &TunnelSpec, data: &[u8], gso_size: u16) -> Vec<Vec<u8>> {
        let (hdr, offsets, packet) = spec.build_gso(data, gso_size);
        let s = TunnelSplitter::new(&hdr, offsets, &packet, spec.outer.framing).unwrap();
        assert_eq!(s.header_len(), spec.inner_nh() + spec.inner.hdr_len() - spec.inner.l2_len());
        let mut out = vec![0u8; 65536];
        (0..s.segment_count())
            .map(|i| {
                let n = s.write_segment(i, &mut out).unwrap();
                out[..n].to_vec()
            })
            .collect()
    }

    /// VXLAN and Geneve, outer IPv4 and IPv6, TAP and TUN framing, inner TCPv4/TCPv6/UDP: the segments are
    /// exactly the frames built independently from the same specs.
    #[test]
    fn test_split_matches_built_segments() {
        let data = payload(5000, 7);
        for outer_v6 in [false, true] {
            for framing in [Framing::Ethernet, Framing::Ip] {
                for inner in [Spec::tcp4(), Spec::tcp6(), Spec::udp4(), Spec::udp6()] {
                    for geneve in [false, true] {
                        let mut spec = TunnelSpec::vxlan(outer_v6, framing, inner.clone());
                        if geneve {
                            spec.tunnel = GENEVE_HEADER.to_vec();
                            spec.outer.dport = 6081;
                        }
                        for outer_csum in [false, true] {
                            spec.outer_csum = outer_csum;
                            let got = split_all(&spec, &data, 1400);
                            assert_eq!(got.len(), 4);
                            assert_eq!(got, spec.segments(&data, 1400), "{spec:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn test_refusals() {
        let spec = TunnelSpec::vxlan(false, Framing::Ethernet, Spec::tcp4());
        let (hdr, offsets, packet) = spec.build_gso(&payload(3000, 1), 1000);
        let f = Framing::Ethernet;
        let err = |h: VirtioNetHdrRepr, o: TunnelOffsets| TunnelSplitter::new(&h, o, &packet, f).unwrap_err();
        let plain = VirtioNetHdrRepr { gso_type: gso::TCPV4, ..hdr };
        assert_eq!(err(plain, offsets), GsoError::BadTunnel("gso_type has no UDP tunnel bit"));
        let both = VirtioNetHdrRepr { gso_type: gso::TCPV4 | gso::UDP_TUNNEL, ..hdr };
        assert!(err(both, offsets).to_string().contains("both the IPv4 and the IPv6 tunnel bit"));
        let v6_bit = VirtioNetHdrRepr { gso_type: gso::TCPV4 | gso::UDP_TUNNEL_IPV6, ..hdr };
        assert!(err(v6_bit, offsets).to_string().contains("outer IP version"));
        let ufo = VirtioNetHdrRepr { gso_type: gso::UDP | gso::UDP_TUNNEL_IPV4, ..hdr };
        assert!(matches!(err(ufo, offsets), GsoError::UnsupportedGsoType(_)));
        let no_csum = VirtioNetHdrRepr { flags: 0, ..hdr };
        assert!(err(no_csum, offsets).to_string().contains("NEEDS_CSUM"));
        let th = TunnelOffsets { outer_th: offsets.outer_th + 2, ..offsets };
        assert!(err(hdr, th).to_string().contains("outer_th_offset"));
        let nh = TunnelOffsets { inner_nh: offsets.outer_th + 4, ..offsets };
        assert!(err(hdr, nh).to_string().contains("inner_nh_offset"));
        // Two bytes into the inner IP header: no IP header parses there.
        let nh = TunnelOffsets { inner_nh: offsets.inner_nh + 2, ..offsets };
        assert!(TunnelSplitter::new(&hdr, nh, &packet, f).is_err());
        let inner_v6 = VirtioNetHdrRepr { gso_type: gso::TCPV6 | gso::UDP_TUNNEL_IPV4, ..hdr };
        assert!(matches!(err(inner_v6, offsets), GsoError::GsoTypeMismatch { .. }));
        let zero = VirtioNetHdrRepr { gso_size: 0, ..hdr };
        assert_eq!(err(zero, offsets), GsoError::ZeroGsoSize);
        for cut in [0, 20, usize::from(offsets.outer_th) + 4, usize::from(offsets.inner_nh)] {
            assert!(TunnelSplitter::new(&hdr, offsets, &packet[..cut], f).is_err(), "cut at {cut}");
        }
        let s = TunnelSplitter::new(&hdr, offsets, &packet, f).unwrap();
        let mut small = [0u8; 100];
        assert!(matches!(s.write_segment(0, &mut small), Err(GsoError::BufferTooSmall { .. })));
        assert!(matches!(s.write_segment(3, &mut small), Err(GsoError::IndexOutOfRange { index: 3, count: 3 })));
    }

    /// Coalesce then split gives back the frames: VXLAN and Geneve, outer IPv4/IPv6, TAP/TUN framing, every inner
    /// kind, with and without the outer checksum; a frame of another flow ends the run.
    #[test]
    fn test_coalesce_then_split_is_identity() {
        let data = payload(6000, 3);
        for outer_v6 in [false, true] {
            for framing in [Framing::Ethernet, Framing::Ip] {
                for inner in [Spec::tcp4(), Spec::tcp6(), Spec::udp4(), Spec::udp6()] {
                    for (kind, geneve) in [(TunnelKind::Vxlan, false), (TunnelKind::Geneve, true)] {
                        let mut spec = TunnelSpec::vxlan(outer_v6, framing, inner.clone());
                        if geneve {
                            spec.tunnel = GENEVE_HEADER.to_vec();
                        }
                        for outer_csum in [false, true] {
                            spec.outer_csum = outer_csum;
                            let segs = spec.segments(&data, 1300);
                            let mut other = spec.clone();
                            other.inner.sport += 1;
                            let mut frames: Vec<&[u8]> = segs.iter().map(|f| &f[..]).collect();
                            let stranger = other.segments(&data[..100], 1300).remove(0);
                            frames.push(&stranger);
                            let mut out = vec![0u8; 65536];
                            let m = coalesce_tunnel(&frames, framing, kind, &mut out).unwrap();
                            assert_eq!(m.frames, segs.len(), "{spec:?}");
                            let (hdr, offsets) = m.header.unwrap();
                            assert_eq!(hdr.flags & flags::UDP_TUNNEL_CSUM != 0, outer_csum);
                            let s = TunnelSplitter::new(&hdr, offsets, &out[..m.len], framing).unwrap();
                            let mut seg = vec![0u8; 65536];
                            let again: Vec<Vec<u8>> = (0..s.segment_count())
                                .map(|i| {
                                    let n = s.write_segment(i, &mut seg).unwrap();
                                    seg[..n].to_vec()
                                })
                                .collect();
                            assert_eq!(again, segs, "{spec:?}");
                        }
                    }
                }
            }
        }
    }

    /// The inner packets follow the rules of `Gro` and the outer IPv4 IDs its ID rule (issue 30, item 5: the
    /// tunnel coalescer had rules of its own): a fixed outer ID merges only with DF set; ECE on every segment
    /// merges and FIN on the last one is carried; a CWR segment is kept alone; an inner IPv4 UDP checksum of 0
    /// merges. Each run that merges splits back into its frames.
    #[test]
    fn test_coalesce_follows_the_gro_rules() {
        let data = payload(4000, 9);
        // How many frames merge; with `split_back`, a merged run must split back into its frames.
        let run = |frames: &[Vec<u8>], framing: Framing, split_back: bool| {
            let mut out = vec![0u8; 65536];
            let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
            let m = coalesce_tunnel(&refs, framing, TunnelKind::Vxlan, &mut out).unwrap();
            if let (Some((hdr, offsets)), true) = (m.header, split_back) {
                let s = TunnelSplitter::new(&hdr, offsets, &out[..m.len], framing).unwrap();
                let mut seg = vec![0u8; 65536];
                for (i, want) in frames[..m.frames].iter().enumerate() {
                    let n = s.write_segment(i, &mut seg).unwrap();
                    assert_eq!(&seg[..n], &want[..], "segment {i}");
                }
            }
            m.frames
        };
        for framing in [Framing::Ethernet, Framing::Ip] {
            // Fixed outer IDs merge only with DF (and split back numbered, so only the count is checked).
            for (df, want) in [(true, 4), (false, 1)] {
                let mut spec = TunnelSpec::vxlan(false, framing, Spec::tcp4());
                spec.outer.df = df;
                let mut frames = spec.segments(&data, 1000);
                for f in &mut frames {
                    let l3 = spec.outer.l2_len();
                    let mut ip = ipv4::Packet::new_unchecked(&mut f[l3..l3 + 20]);
                    ip.set_ident(77);
                    ip.fill_checksum();
                }
                assert_eq!(run(&frames, framing, false), want, "fixed outer ID, DF {df}");
            }
            let spec = |flags: u8| {
                let inner = Spec { tcp_flags: tcp::flags::ACK | flags, ..Spec::tcp4() };
                TunnelSpec::vxlan(false, framing, inner)
            };
            assert_eq!(run(&spec(tcp::flags::ECE).segments(&data, 1000), framing, true), 4, "ECE everywhere");
            assert_eq!(run(&spec(tcp::flags::FIN).segments(&data, 1000), framing, true), 4, "FIN on the last");
            let mut frames = spec(0).segments(&data, 1000);
            frames[1] = spec(tcp::flags::CWR).segments(&data[1000..], 1000).remove(0);
            assert_eq!(run(&frames, framing, true), 1, "a CWR segment is not merged");
            assert_eq!(run(&spec(tcp::flags::CWR).segments(&data, 1000), framing, true), 1, "nor followed");
            // The split fills in the checksums the frames left out: only the count is checked.
            let mut zero = TunnelSpec::vxlan(false, framing, Spec::udp4());
            zero.inner.udp_zero_csum = true;
            assert_eq!(run(&zero.segments(&data, 1000), framing, false), 4, "inner IPv4 UDP checksum 0");
        }
    }

    /// What is not merged: a lone frame, a gap in the TCP sequence, a bad inner checksum, a short segment
    /// followed by another; the first frame comes back unchanged when it cannot be merged.
    #[test]
    fn test_coalesce_refusals() {
        let spec = TunnelSpec::vxlan(false, Framing::Ethernet, Spec::tcp4());
        let segs = spec.segments(&payload(4000, 1), 1000);
        let mut out = vec![0u8; 65536];
        let mut run =
            |frames: &[&[u8]]| coalesce_tunnel(frames, Framing::Ethernet, TunnelKind::Vxlan, &mut out).unwrap();
        let lone = run(&[&segs[0]]);
        assert_eq!((lone.frames, lone.header), (1, None));
        assert_eq!(run(&[&segs[0], &segs[2]]).frames, 1, "sequence gap");
        let mut bad = segs[1].clone();
        let n = bad.len();
        bad[n - 1] ^= 0xff;
        assert_eq!(run(&[&segs[0], &bad]).frames, 1, "bad inner checksum");
        let short = spec.segments(&payload(1500, 1), 1000);
        let after = spec.segments(&payload(3000, 1), 1000);
        assert_eq!(run(&[&short[0], &short[1], &after[2]]).frames, 2, "nothing after a short segment");
        let m = run(&[&segs[0], &segs[1], &segs[2], &segs[3]]);
        assert_eq!((m.frames, m.len), (4, segs[0].len() + 3000));
        let err = coalesce_tunnel(&[], Framing::Ethernet, TunnelKind::Vxlan, &mut out).unwrap_err();
        assert!(matches!(err, GsoError::IndexOutOfRange { .. }));
        let mut small = [0u8; 64];
        let frames: Vec<&[u8]> = segs.iter().map(|f| &f[..]).collect();
        let err = coalesce_tunnel(&frames, Framing::Ethernet, TunnelKind::Vxlan, &mut small).unwrap_err();
        assert!(matches!(err, GsoError::BufferTooSmall { .. }));
    }
}
