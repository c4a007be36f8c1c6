//! ICMP (RFC 792) header view: type, code, checksum and the echo identifier and sequence number.

use crate::bytes::{be16, put_be16};
use crate::{checksum, WireError};

/// Length of the header (type, code, checksum, four bytes that depend on the type).
pub const HEADER_LEN: usize = 8;
/// Type of an echo reply.
pub const ECHO_REPLY: u8 = 0;
/// Type of an echo request.
pub const ECHO_REQUEST: u8 = 8;

/// Byte ranges of the fields.
mod field {
    #![allow(missing_docs)]
    use std::ops::Range;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    /// Type and code as one 16-bit word of the checksummed data.
    pub const TYPE_CODE: Range<usize> = 0..2;
    pub const CHECKSUM: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const SEQ: Range<usize> = 6..8;
}

/// A view of an ICMP message (header and whatever follows it in the buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after checking that the 8-byte header fits.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < HEADER_LEN {
            return Err(WireError::Truncated { what: "ICMP header", need: HEADER_LEN, have });
        }
        Ok(Packet { buffer })
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Message type.
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    /// Code.
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// Echo identifier.
    pub fn ident(&self) -> u16 {
        be16(self.buffer.as_ref(), field::IDENT)
    }
    /// Echo sequence number.
    pub fn seq(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SEQ)
    }
    /// Whether the checksum over the whole buffer verifies (ICMPv4 has no pseudo-header).
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(self.buffer.as_ref(), 0)) == 0xffff
    }
    /// Everything after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::CHECKSUM, v)
    }

    /// Sets type and code and updates the checksum incrementally (RFC 1624): the rest of the message is not
    /// read, so this costs the same for any message length.
    pub fn set_type_code(&mut self, msg_type: u8, code: u8) {
        let old = be16(self.buffer.as_ref(), field::TYPE_CODE);
        let new = u16::from_be_bytes([msg_type, code]);
        put_be16(self.buffer.as_mut(), field::TYPE_CODE, new);
        let c = checksum::update16(self.checksum(), old, new);
        self.set_checksum(c);
    }

    /// Recomputes the checksum over the whole buffer.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref(), 0);
        self.set_checksum(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Echo request, id 0x1234, seq 1, payload "abcd", checksum computed by hand.
    const REQUEST: [u8; 12] = [8, 0, 0x21, 0x04, 0x12, 0x34, 0x00, 0x01, b'a', b'b', b'c', b'd'];

    #[test]
    fn test_parse() {
        let p = Packet::new_checked(&REQUEST[..]).unwrap();
        assert_eq!((p.msg_type(), p.code()), (ECHO_REQUEST, 0));
        assert_eq!((p.ident(), p.seq()), (0x1234, 1));
        assert_eq!(p.payload(), b"abcd");
        assert!(p.verify_checksum(), "checksum {:#06x}", p.checksum());
    }

    #[test]
    fn test_set_type_code_keeps_the_checksum_right() {
        let mut b = REQUEST;
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_type_code(ECHO_REPLY, 0);
        assert!(p.verify_checksum());
        let incremental = p.checksum();
        p.fill_checksum();
        assert_eq!(p.checksum(), incremental);
        assert_eq!(b[0], ECHO_REPLY);
    }

    #[test]
    fn test_truncated() {
        for n in 0..HEADER_LEN {
            assert!(Packet::new_checked(&REQUEST[..n]).is_err());
        }
    }
}
