//! UDP header view (RFC 768).

use crate::bytes::{be16, put_be16};
use crate::WireError;

/// Header length.
pub const HEADER_LEN: usize = 8;
/// Offset of the checksum field.
pub const CHECKSUM_OFFSET: usize = 6;

/// Byte ranges of the fields.
mod field {
    #![allow(missing_docs)]
    use std::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// A view of a UDP datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after checking the 8-byte header fits (the length field is checked by [`Packet::check_len`]).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < HEADER_LEN {
            return Err(WireError::Truncated { what: "UDP header", need: HEADER_LEN, have });
        }
        Ok(Packet { buffer })
    }

    /// Checks the length field equals the buffer length.
    pub fn check_len(&self) -> Result<(), WireError> {
        let (l, have) = (self.len() as usize, self.buffer.as_ref().len());
        if l != have {
            return Err(WireError::BadLength { what: "UDP length", field: l, actual: have });
        }
        Ok(())
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SRC_PORT)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::DST_PORT)
    }
    /// Length field (header + payload).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH)
    }
    /// Checksum field (0 = none over IPv4).
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// Payload (everything after the header in the buffer).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::SRC_PORT, v)
    }
    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::DST_PORT, v)
    }
    /// Sets the length field.
    pub fn set_len(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::LENGTH, v)
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::CHECKSUM, v)
    }
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// A decoded UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length.
    pub payload_len: u16,
}

impl Repr {
    /// Parses (the length field must match the buffer).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, WireError> {
        p.check_len()?;
        Ok(Repr { src_port: p.src_port(), dst_port: p.dst_port(), payload_len: p.len() - HEADER_LEN as u16 })
    }

    /// Writes the header with a zero checksum.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < HEADER_LEN {
            return Err(WireError::Truncated { what: "UDP header", need: HEADER_LEN, have: buf.len() });
        }
        let mut p = Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(self.payload_len.saturating_add(HEADER_LEN as u16));
        p.set_checksum(0);
        Ok(())
    }
}

/// One line that names the datagram: ports and length.
impl<T: AsRef<[u8]>> core::fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "UDP {} > {} len {}", self.src_port(), self.dst_port(), self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DGRAM: [u8; 12] = [0xbf, 0x00, 0x00, 0x35, 0x00, 0x0c, 0x12, 0x4d, 0xaa, 0x00, 0x00, 0xff];

    #[test]
    fn test_parse() {
        let p = Packet::new_checked(&DGRAM[..]).unwrap();
        assert_eq!(p.src_port(), 48896);
        assert_eq!(p.dst_port(), 53);
        assert_eq!(p.len(), 12);
        assert_eq!(p.checksum(), 0x124d);
        assert_eq!(p.payload(), &[0xaa, 0x00, 0x00, 0xff]);
        assert_eq!(Repr::parse(&p).unwrap(), Repr { src_port: 48896, dst_port: 53, payload_len: 4 });
    }

    #[test]
    fn test_emit() {
        let mut buf = [0xffu8; 8];
        Repr { src_port: 48896, dst_port: 53, payload_len: 4 }.emit(&mut buf).unwrap();
        assert_eq!(buf, [0xbf, 0x00, 0x00, 0x35, 0x00, 0x0c, 0, 0]);
    }

    #[test]
    fn test_truncated() {
        for n in 0..8 {
            assert!(Packet::new_checked(&DGRAM[..n]).is_err());
        }
        let p = Packet::new_checked(&DGRAM[..11]).unwrap();
        assert_eq!(p.check_len(), Err(WireError::BadLength { what: "UDP length", field: 12, actual: 11 }));
    }
}
