//! IPv6 header view (RFC 8200) and a walker over extension headers (hop-by-hop, routing, destination options,
//! fragment, AH) that finds the transport protocol and its offset.

use crate::bytes::{be16, be32, put_be16, put_be32};
use crate::WireError;

/// Length of the fixed header.
pub const HEADER_LEN: usize = 40;
/// Maximum number of extension headers walked.
pub const MAX_EXT_HEADERS: usize = 8;

/// Next-header values of extension headers.
pub mod next_header {
    #![allow(missing_docs)]
    pub const HOP_BY_HOP: u8 = 0;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const AH: u8 = 51;
    pub const NO_NEXT: u8 = 59;
    pub const DEST_OPTS: u8 = 60;
}

/// Byte ranges of the fields.
mod field {
    #![allow(missing_docs)]
    use std::ops::Range;
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Range<usize> = 8..24;
    pub const DST_ADDR: Range<usize> = 24..40;
}

/// Where the transport header is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L4Info {
    /// Protocol number of the transport header (or 59, no next header).
    pub protocol: u8,
    /// Offset of the transport header from the start of the IPv6 header.
    pub offset: usize,
    /// Whether a fragment header was seen.
    pub fragment: bool,
    /// Number of extension headers.
    pub ext_headers: usize,
    /// The destination the transport checksum's pseudo-header uses (RFC 8200 section 8.1): the header's
    /// destination, or, behind a routing header with segments left, the final one it lists.
    pub final_dst: [u8; 16],
}

/// A view of an IPv6 header (and what follows it in the buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after checking the fixed header fits and the version is 6.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated { what: "IPv6 header", need: HEADER_LEN, have: b.len() });
        }
        if b[0] >> 4 != 6 {
            return Err(WireError::BadIpVersion(b[0] >> 4));
        }
        Ok(Packet { buffer })
    }

    /// Checks `40 + payload_len == buffer length`.
    pub fn check_payload_len(&self) -> Result<(), WireError> {
        let (pl, have) = (self.payload_len() as usize, self.buffer.as_ref().len());
        if pl + HEADER_LEN != have {
            return Err(WireError::BadLength {
                what: "IPv6 payload length + 40",
                field: pl + HEADER_LEN,
                actual: have,
            });
        }
        Ok(())
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn word0(&self) -> u32 {
        be32(self.buffer.as_ref(), field::VER_TC_FLOW)
    }
    /// Version (6).
    pub fn version(&self) -> u8 {
        (self.word0() >> 28) as u8
    }
    /// Traffic class (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }
    /// Payload length field.
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }
    /// Next header of the fixed header.
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NXT_HDR]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }
    /// Source address.
    pub fn src_addr(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC_ADDR]);
        a
    }
    /// Destination address.
    pub fn dst_addr(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST_ADDR]);
        a
    }
    /// Everything after the fixed header that is in the buffer.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// Walks the extension headers to the transport header. Every header must fit in the buffer. A routing
    /// header with segments left names the final destination the pseudo-header uses
    /// ([`L4Info::final_dst`]): types 0 and 2 as their last address, type 4 (segment routing) as the first
    /// entry of its segment list; any other type with segments left is refused, since its final destination
    /// cannot be read ([`WireError::UnknownFinalDestination`]).
    pub fn l4_info(&self) -> Result<L4Info, WireError> {
        let b = self.buffer.as_ref();
        let mut nh = self.next_header();
        let mut off = HEADER_LEN;
        let mut fragment = false;
        let mut n = 0;
        let mut final_dst = self.dst_addr();
        loop {
            let len = match nh {
                next_header::HOP_BY_HOP | next_header::ROUTING | next_header::DEST_OPTS => {
                    b.get(off + 1).map(|&l| (l as usize + 1) * 8)
                }
                next_header::AH => b.get(off + 1).map(|&l| (l as usize + 2) * 4),
                next_header::FRAGMENT => {
                    fragment = true;
                    Some(8)
                }
                _ => return Ok(L4Info { protocol: nh, offset: off, fragment, ext_headers: n, final_dst }),
            };
            n += 1;
            if n > MAX_EXT_HEADERS {
                return Err(WireError::ExtHeaderChainTooLong);
            }
            let Some(len) = len.filter(|l| off + l <= b.len()) else {
                return Err(WireError::Truncated {
                    what: "IPv6 extension header",
                    need: off + len.unwrap_or(2),
                    have: b.len(),
                });
            };
            if nh == next_header::ROUTING {
                if let Some(dst) = routing_final_destination(&b[off..off + len])? {
                    final_dst = dst;
                }
            }
            nh = b[off];
            off += len;
        }
    }
}

/// The final destination a routing header (`rh`, the whole header) names, if it has segments left.
fn routing_final_destination(rh: &[u8]) -> Result<Option<[u8; 16]>, WireError> {
    let (routing_type, segments_left) = (rh.get(2).copied().unwrap_or(0), rh.get(3).copied().unwrap_or(0));
    if segments_left == 0 {
        return Ok(None);
    }
    let at = match routing_type {
        // Type 0 (deprecated) and 2 (Mobile IPv6): the addresses in path order, the last one final.
        0 | 2 => rh.len().checked_sub(16).filter(|&at| at >= 8),
        // Type 4 (segment routing): the segment list in reverse order, its first entry final.
        4 => Some(8).filter(|at| at + 16 <= rh.len()),
        _ => None,
    };
    let at = at.ok_or(WireError::UnknownFinalDestination { routing_type })?;
    let mut dst = [0u8; 16];
    dst.copy_from_slice(&rh[at..at + 16]);
    Ok(Some(dst))
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_word0(&mut self, w: u32) {
        put_be32(self.buffer.as_mut(), field::VER_TC_FLOW, w)
    }
    /// Sets the version to 6.
    pub fn set_version(&mut self) {
        let w = self.word0();
        self.set_word0((w & 0x0fff_ffff) | 0x6000_0000)
    }
    /// Sets the traffic class.
    pub fn set_traffic_class(&mut self, tc: u8) {
        let w = self.word0();
        self.set_word0((w & 0xf00f_ffff) | ((tc as u32) << 20))
    }
    /// Sets the flow label (low 20 bits used).
    pub fn set_flow_label(&mut self, fl: u32) {
        let w = self.word0();
        self.set_word0((w & 0xfff0_0000) | (fl & 0x000f_ffff))
    }
    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::PAYLOAD_LEN, v)
    }
    /// Sets the next header.
    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[field::NXT_HDR] = v
    }
    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v
    }
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a)
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a)
    }
}

/// A decoded fixed IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source.
    pub src: [u8; 16],
    /// Destination.
    pub dst: [u8; 16],
    /// Next header.
    pub next_header: u8,
    /// Payload length.
    pub payload_len: u16,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
}

impl Repr {
    /// Parses the fixed header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            next_header: p.next_header(),
            payload_len: p.payload_len(),
            hop_limit: p.hop_limit(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
        }
    }

    /// Writes the 40-byte fixed header.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < HEADER_LEN {
            return Err(WireError::Truncated { what: "IPv6 header", need: HEADER_LEN, have: buf.len() });
        }
        let mut p = Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_word0(0x6000_0000);
        p.set_traffic_class(self.traffic_class);
        p.set_flow_label(self.flow_label);
        p.set_payload_len(self.payload_len);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        Ok(())
    }
}

/// One line that names the packet: addresses, next header, payload length, hop limit.
impl<T: AsRef<[u8]>> core::fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (src, dst) = (core::net::Ipv6Addr::from(self.src_addr()), core::net::Ipv6Addr::from(self.dst_addr()));
        write!(f, "IPv6 {src} > {dst} next {} len {} hops {}", self.next_header(), self.payload_len(), self.hop_limit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let r = Repr {
            src: [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            dst: [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            next_header: 6,
            payload_len: 20,
            hop_limit: 64,
            traffic_class: 0xb8,
            flow_label: 0xabcde,
        };
        let mut b = vec![0u8; 60];
        r.emit(&mut b).unwrap();
        b
    }

    #[test]
    fn test_parse_emit() {
        let b = sample();
        assert_eq!(&b[..4], &[0x6b, 0x8a, 0xbc, 0xde]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!(p.traffic_class(), 0xb8);
        assert_eq!(p.flow_label(), 0xabcde);
        assert_eq!(p.payload_len(), 20);
        assert_eq!(p.hop_limit(), 64);
        assert!(p.check_payload_len().is_ok());
        let r = Repr::parse(&p);
        let mut again = vec![0u8; 40];
        r.emit(&mut again).unwrap();
        assert_eq!(again, b[..40]);
        let final_dst = p.dst_addr();
        assert_eq!(
            p.l4_info().unwrap(),
            L4Info { protocol: 6, offset: 40, fragment: false, ext_headers: 0, final_dst }
        );
    }

    #[test]
    fn test_truncated() {
        let b = sample();
        for n in 0..40 {
            assert!(Packet::new_checked(&b[..n]).is_err());
        }
        assert!(Packet::new_checked(&b[..59]).unwrap().check_payload_len().is_err());
    }

    #[test]
    fn test_ext_headers() {
        let mut b = sample();
        b[6] = next_header::HOP_BY_HOP;
        // HBH (8 bytes) -> dest opts (16 bytes) -> fragment (8) -> UDP
        let mut ext = vec![next_header::DEST_OPTS, 0, 1, 4, 0, 0, 0, 0];
        ext.extend_from_slice(&[next_header::FRAGMENT, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        ext.extend_from_slice(&[17, 0, 0, 0, 0, 0, 0, 1]);
        b.truncate(40);
        b.extend_from_slice(&ext);
        b.extend_from_slice(&[0u8; 8]);
        let p = Packet::new_checked(&b[..]).unwrap();
        let final_dst = p.dst_addr();
        let want = L4Info { protocol: 17, offset: 72, fragment: true, ext_headers: 3, final_dst };
        assert_eq!(p.l4_info().unwrap(), want);
        // Truncated in the middle of the dest-opts header.
        let p = Packet::new_checked(&b[..50]).unwrap();
        assert!(matches!(p.l4_info(), Err(WireError::Truncated { .. })));
        // A routing-header loop is bounded.
        let mut lp = b[..40].to_vec();
        lp[6] = next_header::ROUTING;
        for _ in 0..10 {
            lp.extend_from_slice(&[next_header::ROUTING, 0, 0, 0, 0, 0, 0, 0]);
        }
        assert_eq!(Packet::new_checked(&lp[..]).unwrap().l4_info(), Err(WireError::ExtHeaderChainTooLong));
        // AH length unit is 4 bytes, (len + 2) * 4.
        let mut ah = b[..40].to_vec();
        ah[6] = next_header::AH;
        ah.extend_from_slice(&[6, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let p = Packet::new_checked(&ah[..]).unwrap();
        assert_eq!(p.l4_info().unwrap().offset, 52);
    }
}
