//! Partial checksums on MTU-sized TCP and UDP packets: the kernel's `CHECKSUM_PARTIAL`, virtio's `NEEDS_CSUM`.
//!
//! A packet with a partial checksum carries, in its L4 checksum field, only the folded (not complemented) sum of
//! its pseudo-header with the L4 length; whoever writes it to a device marks it `NEEDS_CSUM` with the field's
//! position, and the kernel (or the NIC behind it) adds the sum of the L4 header and payload. A program that
//! forwards segments without reading their payload saves the payload sums this way: [`crate::gso::Splitter`]
//! can leave segments partial ([`crate::gso::Splitter::leave_checksums_partial`]) and [`crate::gro::Gro`] marks
//! what it writes ([`crate::gro::Checksums::Partial`]).
//!
//! Only *markable* packets are ever left partial, so that a writer can find the checksum from the packet alone:
//! TCP or UDP directly in IPv4 (options allowed, not a fragment) or in IPv6 without extension headers, the IP
//! length equal to the packet's, the UDP length equal to what follows the IP header. Every other packet's
//! checksum stays complete.

use crate::checksum;
use crate::ipv4;
use crate::ipv6;
use crate::tcp;
use crate::udp;
use crate::virtio_net::{flags, gso, VirtioNetHdrRepr};
use crate::{locate_ip, Framing, IPPROTO_TCP, IPPROTO_UDP};

/// Where a markable packet's L4 checksum goes and the partial sum it needs there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    /// Offset of the L4 header from the start of the packet (`csum_start`).
    pub start: usize,
    /// Offset of the checksum field within the L4 header (`csum_offset`).
    pub offset: usize,
    /// The partial checksum: the pseudo-header (addresses, protocol, L4 length) folded, not complemented.
    pub seed: u16,
}

impl Site {
    /// The virtio header that hands a packet with this partial checksum to the kernel (`NEEDS_CSUM`, no GSO).
    pub fn virtio_header(&self) -> VirtioNetHdrRepr {
        VirtioNetHdrRepr {
            flags: flags::NEEDS_CSUM,
            gso_type: gso::NONE,
            hdr_len: 0,
            gso_size: 0,
            csum_start: self.start as u16,
            csum_offset: self.offset as u16,
        }
    }
}

/// The checksum site of `packet` if it is markable (see the module documentation), else `None`. Never panics.
pub fn site(packet: &[u8], framing: Framing) -> Option<Site> {
    let (l3, version) = locate_ip(packet, framing).ok()?;
    let ip = &packet[l3..];
    let (proto, l4, addr_sum) = if version == 4 {
        let p = ipv4::Packet::new_checked(ip).ok()?;
        if p.is_fragment() || p.total_len() as usize != ip.len() {
            return None;
        }
        (p.protocol(), l3 + p.header_len(), checksum::pseudo_header_v4(p.src_addr(), p.dst_addr(), p.protocol(), 0))
    } else {
        let p = ipv6::Packet::new_checked(ip).ok()?;
        let proto = p.next_header();
        if p.payload_len() as usize + ipv6::HEADER_LEN != ip.len() || !matches!(proto, IPPROTO_TCP | IPPROTO_UDP) {
            return None;
        }
        (proto, l3 + ipv6::HEADER_LEN, checksum::pseudo_header_v6(p.src_addr(), p.dst_addr(), proto, 0))
    };
    let l4b = packet.get(l4..)?;
    let offset = match proto {
        IPPROTO_TCP => {
            tcp::Packet::new_checked(l4b).ok()?;
            tcp::CHECKSUM_OFFSET
        }
        IPPROTO_UDP => {
            let u = udp::Packet::new_checked(l4b).ok()?;
            if u.len() as usize != l4b.len() {
                return None;
            }
            udp::CHECKSUM_OFFSET
        }
        _ => return None,
    };
    let seed = checksum::fold(checksum::add(addr_sum, l4b.len() as u32));
    Some(Site { start: l4, offset, seed })
}

/// Makes a markable packet's checksum partial (whatever it held: complete, partial or wrong) and returns the
/// virtio header to write it with; `None` (packet untouched) if it is not markable.
pub fn make_partial(packet: &mut [u8], framing: Framing) -> Option<VirtioNetHdrRepr> {
    let s = site(packet, framing)?;
    let at = s.start + s.offset;
    packet[at..at + 2].copy_from_slice(&s.seed.to_be_bytes());
    Some(s.virtio_header())
}

/// Writes the virtio header `vh` of a packet written as it is (not coalesced): with `partial`, a markable packet
/// gets a partial checksum and the `NEEDS_CSUM` header for it; anything else a zeroed header.
pub fn write_plain_header(vh: &mut [u8], packet: &mut [u8], framing: Framing, partial: bool) {
    match if partial { make_partial(packet, framing) } else { None } {
        Some(h) => h.emit(vh),
        None => vh.fill(0),
    }
}

/// Completes a markable packet's checksum, whether it was partial or already complete (it is recomputed);
/// returns whether the packet was markable (if not, it is untouched: its checksum is complete by the rule of
/// this module).
pub fn complete(packet: &mut [u8], framing: Framing) -> bool {
    let Some(s) = site(packet, framing) else {
        return false;
    };
    let at = s.start + s.offset;
    packet[at..at + 2].copy_from_slice(&s.seed.to_be_bytes());
    // In range: `site` checked that the L4 header (and so the checksum field) lies inside the packet.
    checksum::complete_partial(packet, s.start, s.offset).is_ok()
}

/// Whether a markable packet's L4 checksum is correct: `Some(true)` if it adds up (or is a UDP/IPv4 checksum of
/// zero, which means none was computed), `Some(false)` if it does not, `None` if the packet is not markable (the
/// checksum cannot be found from the packet alone; see the module documentation). Reads the packet, never
/// panics.
pub fn verify(packet: &[u8], framing: Framing) -> Option<bool> {
    let s = site(packet, framing)?;
    let l4 = &packet[s.start..];
    if s.offset == udp::CHECKSUM_OFFSET && l4[6..8] == [0, 0] {
        // UDP over IPv4 may leave its checksum out; over IPv6 it may not (RFC 8200 section 8.1).
        return Some(matches!(locate_ip(packet, framing), Ok((_, 4))));
    }
    Some(checksum::fold(checksum::sum(l4, s.seed as u32)) == 0xffff)
}

/// Whether `a` and `b` are the same packet once a TCP checksum of `0xffff` counts as `0x0000` (the two
/// one's-complement zeros: a complete split may store either, the kernel's completion stores the first).
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub fn same_up_to_checksum_zero(a: &[u8], b: &[u8], framing: Framing) -> bool {
    let norm = |p: &[u8]| {
        let mut p = p.to_vec();
        if let Some(s) = site(&p, framing).filter(|s| s.offset == tcp::CHECKSUM_OFFSET) {
            let at = s.start + s.offset;
            if p[at..at + 2] == [0xff, 0xff] {
                p[at..at + 2].fill(0);
            }
        }
        p
    };
    norm(a) == norm(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{payload, Spec};

    #[test]
    fn verify_finds_a_wrong_checksum_and_accepts_a_right_one() {
        for spec in [Spec::tcp4(), Spec::tcp6(), Spec::udp4(), Spec::udp6()] {
            let mut p = spec.build(&payload(300, 7));
            assert!(complete(&mut p, Framing::Ip));
            assert_eq!(verify(&p, Framing::Ip), Some(true), "{spec:?}");
            let last = p.len() - 1;
            p[last] ^= 0x40;
            assert_eq!(verify(&p, Framing::Ip), Some(false), "{spec:?}");
            make_partial(&mut p, Framing::Ip).unwrap();
            assert_eq!(verify(&p, Framing::Ip), Some(false), "a partial checksum is not a complete one: {spec:?}");
        }
        // A UDP checksum of zero: none computed, allowed over IPv4 only.
        for (spec, ok) in [(Spec::udp4(), true), (Spec::udp6(), false)] {
            let mut p = spec.build(&payload(10, 1));
            let s = site(&p, Framing::Ip).unwrap();
            p[s.start + s.offset..s.start + s.offset + 2].fill(0);
            assert_eq!(verify(&p, Framing::Ip), Some(ok), "{spec:?}");
        }
        assert_eq!(verify(&[0x45, 0, 0], Framing::Ip), None);
    }

    #[test]
    fn partial_then_complete_restores_the_checksum() {
        for spec in [Spec::tcp4(), Spec::tcp6(), Spec::udp4(), Spec::udp6()] {
            let good = spec.build(&payload(1000, 9));
            let mut p = good.clone();
            let h = make_partial(&mut p, Framing::Ip).expect("markable");
            assert!(h.needs_csum());
            assert_ne!(p, good, "the field now holds the seed");
            checksum::complete_partial(&mut p, h.csum_start.into(), h.csum_offset.into()).unwrap();
            assert_eq!(p, good);
            let mut q = good.clone();
            assert!(complete(&mut q, Framing::Ip));
            assert_eq!(q, good, "completing a complete packet changes nothing");
        }
    }

    #[test]
    fn unmarkable_packets_are_left_alone() {
        let mut short = vec![0x45u8; 10];
        assert!(make_partial(&mut short, Framing::Ip).is_none());
        assert!(!complete(&mut short, Framing::Ip));
        // IPv4 length shorter than the buffer (Ethernet padding): the sum would cover the padding.
        let mut padded = Spec::tcp4().build(&payload(10, 1));
        padded.extend_from_slice(&[0; 6]);
        let before = padded.clone();
        assert!(make_partial(&mut padded, Framing::Ip).is_none());
        assert_eq!(padded, before);
    }
}
