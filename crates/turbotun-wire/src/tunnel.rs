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
use crate::gso::{Splitter, MAX_HEADER_LEN};
use crate::ipv4;
use crate::ipv6;
use crate::udp;
use crate::virtio_net::{flags, gso, TunnelOffsets, VirtioNetHdrRepr};
use crate::{locate_ip, Framing, GsoError, SplitProgress, WireError, IPPROTO_UDP};

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
            (0, checksum::pseudo_header_v6(p.src_addr(), p.dst_addr(), IPPROTO_UDP, 0), outer_l3 + info.offset)
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

    /// Writes segments `first, first + 1, ...` into `bufs[i][offset..]` and their lengths into `lens[i]`, as
    /// many as fit, like [`Splitter::split_into`].
    pub fn split_into<B: AsMut<[u8]>>(
        &self,
        first: usize,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
    ) -> Result<SplitProgress, GsoError> {
        let total = self.segment_count();
        if first > total {
            return Err(GsoError::IndexOutOfRange { index: first, count: total });
        }
        let mut produced = 0;
        for (buf, len) in bufs.iter_mut().zip(lens.iter_mut()) {
            let index = first + produced;
            if index >= total {
                break;
            }
            let buf = buf.as_mut();
            let res = match buf.get_mut(offset..) {
                Some(out) => self.write_segment(index, out),
                None => Err(GsoError::BufferTooSmall { need: offset + self.segment_len(index), have: buf.len() }),
            };
            match res {
                Ok(n) => *len = n,
                Err(e) if produced == 0 => return Err(e),
                Err(_) => break,
            }
            produced += 1;
        }
        Ok(SplitProgress { produced, next: first + produced, total })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{payload, Spec, TunnelSpec, GENEVE_HEADER};

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
}
