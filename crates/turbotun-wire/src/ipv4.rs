//! IPv4 header view (RFC 791) with options, fragment fields and the header checksum.

use crate::bytes::{be16, put_be16};
use crate::{checksum, WireError};

/// Length of a header without options.
pub const MIN_HEADER_LEN: usize = 20;
/// Length of a header with the maximum 40 bytes of options.
pub const MAX_HEADER_LEN: usize = 60;

/// Byte ranges of the fields.
mod field {
    #![allow(missing_docs)]
    use std::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC_ADDR: Range<usize> = 12..16;
    pub const DST_ADDR: Range<usize> = 16..20;
}

/// Don't-fragment bit in the 16-bit flags/offset word.
pub const FLAG_DF: u16 = 0x4000;
/// More-fragments bit.
pub const FLAG_MF: u16 = 0x2000;
/// Reserved (evil) bit.
pub const FLAG_RESERVED: u16 = 0x8000;

/// A view of an IPv4 header (and whatever follows it in the buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after checking the version is 4, IHL >= 5 and the whole header (with options) fits.
    /// The total-length field is *not* checked against the buffer (see [`Packet::check_total_len`]).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(WireError::Truncated { what: "IPv4 header", need: MIN_HEADER_LEN, have: b.len() });
        }
        if b[0] >> 4 != 4 {
            return Err(WireError::BadIpVersion(b[0] >> 4));
        }
        let hl = ((b[0] & 0x0f) as usize) * 4;
        if hl < MIN_HEADER_LEN {
            return Err(WireError::BadHeaderLen { what: "IPv4", len: hl });
        }
        if b.len() < hl {
            return Err(WireError::Truncated { what: "IPv4 options", need: hl, have: b.len() });
        }
        Ok(Packet { buffer })
    }

    /// Checks `header_len <= total_len == buffer length`.
    pub fn check_total_len(&self) -> Result<(), WireError> {
        let (tl, have) = (self.total_len() as usize, self.buffer.as_ref().len());
        if tl != have || tl < self.header_len() {
            return Err(WireError::BadLength { what: "IPv4 total length", field: tl, actual: have });
        }
        Ok(())
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Version (4).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }
    /// Header length in bytes (IHL * 4).
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }
    /// Type of service byte (DSCP << 2 | ECN).
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::TOS]
    }
    /// DSCP.
    pub fn dscp(&self) -> u8 {
        self.tos() >> 2
    }
    /// ECN codepoint.
    pub fn ecn(&self) -> u8 {
        self.tos() & 3
    }
    /// Total length field.
    pub fn total_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH)
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        be16(self.buffer.as_ref(), field::IDENT)
    }
    /// The flags/fragment-offset word.
    pub fn flags_frag(&self) -> u16 {
        be16(self.buffer.as_ref(), field::FLG_OFF)
    }
    /// Don't fragment.
    pub fn dont_frag(&self) -> bool {
        self.flags_frag() & FLAG_DF != 0
    }
    /// More fragments.
    pub fn more_frags(&self) -> bool {
        self.flags_frag() & FLAG_MF != 0
    }
    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (self.flags_frag() & 0x1fff) << 3
    }
    /// Whether this is a fragment (MF set or non-zero offset).
    pub fn is_fragment(&self) -> bool {
        self.flags_frag() & (FLAG_MF | 0x1fff) != 0
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }
    /// Protocol of the payload.
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }
    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// Source address.
    pub fn src_addr(&self) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[12], b[13], b[14], b[15]]
    }
    /// Destination address.
    pub fn dst_addr(&self) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[16], b[17], b[18], b[19]]
    }
    /// Option bytes (IHL > 5).
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()]
    }
    /// Whether the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(&self.buffer.as_ref()[..self.header_len()], 0)) == 0xffff
    }
    /// Everything after the header that is in the buffer.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 4 and the header length (a multiple of 4 in 20..=60).
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }
    /// Sets the ToS byte.
    pub fn set_tos(&mut self, v: u8) {
        self.buffer.as_mut()[field::TOS] = v
    }
    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::LENGTH, v)
    }
    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::IDENT, v)
    }
    /// Sets the flags/fragment-offset word.
    pub fn set_flags_frag(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::FLG_OFF, v)
    }
    /// Sets the TTL.
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v
    }
    /// Sets the protocol.
    pub fn set_protocol(&mut self, v: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = v
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::CHECKSUM, v)
    }
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a)
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a)
    }
    /// Recomputes the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum::checksum(&self.buffer.as_ref()[..hl], 0);
        self.set_checksum(c);
    }
}

/// A decoded option-less IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source.
    pub src: [u8; 4],
    /// Destination.
    pub dst: [u8; 4],
    /// Payload protocol.
    pub protocol: u8,
    /// Payload length (total length - 20).
    pub payload_len: u16,
    /// Time to live.
    pub ttl: u8,
    /// ToS byte.
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't fragment.
    pub dont_frag: bool,
}

impl Repr {
    /// Parses a header (options are ignored; fragments and length mismatches are errors).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, WireError> {
        p.check_total_len()?;
        Ok(Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            protocol: p.protocol(),
            payload_len: p.total_len() - p.header_len() as u16,
            ttl: p.ttl(),
            tos: p.tos(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
        })
    }

    /// Writes a 20-byte header with a valid checksum.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < MIN_HEADER_LEN {
            return Err(WireError::Truncated { what: "IPv4 header", need: MIN_HEADER_LEN, have: buf.len() });
        }
        let mut p = Packet::new_unchecked(&mut buf[..MIN_HEADER_LEN]);
        p.set_version_and_header_len(MIN_HEADER_LEN);
        p.set_tos(self.tos);
        p.set_total_len(self.payload_len.saturating_add(MIN_HEADER_LEN as u16));
        p.set_ident(self.ident);
        p.set_flags_frag(if self.dont_frag { FLAG_DF } else { 0 });
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        p.fill_checksum();
        Ok(())
    }
}

/// One line that names the packet (for a drop's log line or a failed test): addresses, protocol, length,
/// identification, TTL, and the fragment and DF bits.
impl<T: AsRef<[u8]>> core::fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (src, dst) = (core::net::Ipv4Addr::from(self.src_addr()), core::net::Ipv4Addr::from(self.dst_addr()));
        write!(
            f,
            "IPv4 {src} > {dst} proto {} len {} id {} ttl {}",
            self.protocol(),
            self.total_len(),
            self.ident(),
            self.ttl()
        )?;
        if self.dont_frag() {
            f.write_str(" DF")?;
        }
        if self.is_fragment() {
            write!(f, " frag {}{}", self.frag_offset(), if self.more_frags() { "+" } else { "" })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 192.168.0.1 -> 192.168.0.2, TCP, 40 bytes, ID 0x1234, DF, TTL 64 (checksum computed by hand tools).
    const HDR: [u8; 20] =
        [0x45, 0x00, 0x00, 0x28, 0x12, 0x34, 0x40, 0x00, 0x40, 0x06, 0xa7, 0x48, 192, 168, 0, 1, 192, 168, 0, 2];

    #[test]
    fn test_parse() {
        let mut pkt = HDR.to_vec();
        pkt.resize(40, 0);
        let p = Packet::new_checked(&pkt[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 40);
        assert_eq!(p.ident(), 0x1234);
        assert!(p.dont_frag() && !p.more_frags() && !p.is_fragment());
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), 6);
        assert_eq!(p.src_addr(), [192, 168, 0, 1]);
        assert!(p.options().is_empty());
        assert_eq!(p.payload().len(), 20);
        assert!(p.check_total_len().is_ok());
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.payload_len, 20);
        assert!(p.verify_checksum(), "checksum {:#x}", p.checksum());
    }

    #[test]
    fn test_emit() {
        let r = Repr {
            src: [192, 168, 0, 1],
            dst: [192, 168, 0, 2],
            protocol: 6,
            payload_len: 20,
            ttl: 64,
            tos: 0,
            ident: 0x1234,
            dont_frag: true,
        };
        let mut buf = [0u8; 20];
        r.emit(&mut buf).unwrap();
        assert_eq!(buf, HDR);
        assert!(r.emit(&mut [0u8; 19]).is_err());
    }

    #[test]
    fn test_options_fragments_truncated() {
        for n in 0..20 {
            assert!(Packet::new_checked(&HDR[..n]).is_err());
        }
        let mut opt = HDR.to_vec();
        opt[0] = 0x46;
        assert!(matches!(Packet::new_checked(&opt[..]), Err(WireError::Truncated { need: 24, .. })));
        opt.extend_from_slice(&[1, 1, 1, 0]);
        let p = Packet::new_checked(&opt[..]).unwrap();
        assert_eq!(p.options(), &[1, 1, 1, 0]);
        opt[0] = 0x44;
        assert_eq!(Packet::new_checked(&opt[..]), Err(WireError::BadHeaderLen { what: "IPv4", len: 16 }));
        opt[0] = 0x65;
        assert_eq!(Packet::new_checked(&opt[..]), Err(WireError::BadIpVersion(6)));
        let mut frag = HDR;
        frag[6] = 0x20; // MF
        assert!(Packet::new_checked(&frag[..]).unwrap().is_fragment());
        frag[6] = 0x00;
        frag[7] = 0x01; // offset 8
        let f = Packet::new_checked(&frag[..]).unwrap();
        assert!(f.is_fragment());
        assert_eq!(f.frag_offset(), 8);
        assert!(f.check_total_len().is_err());
    }

    #[test]
    fn test_fill_checksum() {
        let mut h = HDR;
        let mut p = Packet::new_checked(&mut h[..]).unwrap();
        p.set_ttl(1);
        assert!(!p.verify_checksum());
        p.fill_checksum();
        assert!(p.verify_checksum());
    }
}
