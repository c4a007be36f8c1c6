//! ICMPv6 (RFC 4443) header view and the neighbour discovery messages (RFC 4861) an on-link peer answers:
//! neighbour solicitation in, neighbour advertisement out.
//!
//! The ICMPv6 checksum covers an IPv6 pseudo-header, so [`Packet::verify_checksum`] and
//! [`Packet::fill_checksum`] take the addresses.

use crate::bytes::{be16, put_be16};
use crate::{checksum, WireError};

/// IP protocol number (next header) of ICMPv6.
pub const IPPROTO_ICMPV6: u8 = 58;
/// Length of the common header (type, code, checksum, four bytes that depend on the type).
pub const HEADER_LEN: usize = 8;
/// Type of an echo request.
pub const ECHO_REQUEST: u8 = 128;
/// Type of an echo reply.
pub const ECHO_REPLY: u8 = 129;
/// Type of a router solicitation.
pub const ROUTER_SOLICIT: u8 = 133;
/// Type of a neighbour solicitation.
pub const NEIGHBOR_SOLICIT: u8 = 135;
/// Type of a neighbour advertisement.
pub const NEIGHBOR_ADVERT: u8 = 136;
/// Length of a neighbour solicitation or advertisement without options (header + target address).
pub const ND_LEN: usize = 24;
/// ND option: source link-layer address.
pub const OPT_SOURCE_LL_ADDR: u8 = 1;
/// ND option: target link-layer address.
pub const OPT_TARGET_LL_ADDR: u8 = 2;
/// Length of a neighbour advertisement with a target link-layer address option for an Ethernet address.
pub const NA_WITH_LL_ADDR_LEN: usize = ND_LEN + 8;
/// The hop limit every ND message carries, so that a receiver knows it was not forwarded (RFC 4861 §7.1.1).
pub const ND_HOP_LIMIT: u8 = 255;

/// Neighbour advertisement flags (the first byte after the checksum).
pub mod na_flags {
    /// The sender is a router.
    pub const ROUTER: u8 = 0x80;
    /// Sent in response to a solicitation.
    pub const SOLICITED: u8 = 0x40;
    /// Override an existing cache entry.
    pub const OVERRIDE: u8 = 0x20;
}

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
    /// Flags of a neighbour advertisement (reserved in a solicitation).
    pub const ND_FLAGS: usize = 4;
    /// Target address of a neighbour solicitation or advertisement.
    pub const ND_TARGET: Range<usize> = 8..24;
}

/// A view of an ICMPv6 message (header and whatever follows it in the buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after checking that the 8-byte header fits (and, for a neighbour solicitation or advertisement,
    /// the target address: [`Packet::nd_target`] may then be called).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated { what: "ICMPv6 header", need: HEADER_LEN, have: b.len() });
        }
        if matches!(b[field::TYPE], NEIGHBOR_SOLICIT | NEIGHBOR_ADVERT) && b.len() < ND_LEN {
            return Err(WireError::Truncated { what: "neighbour discovery message", need: ND_LEN, have: b.len() });
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
    /// Target address of a neighbour solicitation or advertisement (`None` for other types).
    pub fn nd_target(&self) -> Option<[u8; 16]> {
        if !matches!(self.msg_type(), NEIGHBOR_SOLICIT | NEIGHBOR_ADVERT) {
            return None;
        }
        let mut a = [0; 16];
        a.copy_from_slice(self.buffer.as_ref().get(field::ND_TARGET)?);
        Some(a)
    }
    /// Flags of a neighbour advertisement (see [`na_flags`]).
    pub fn na_flags(&self) -> u8 {
        self.buffer.as_ref()[field::ND_FLAGS]
    }
    /// The value of the first ND option of `kind` after the target address (e.g. a link-layer address), or
    /// `None` if there is none. A malformed option list (a zero length, or one that runs past the buffer) is
    /// treated as ending before the bad option.
    pub fn nd_option(&self, kind: u8) -> Option<&[u8]> {
        let b = self.buffer.as_ref();
        let mut at = ND_LEN;
        while at + 2 <= b.len() {
            let len = usize::from(b[at + 1]) * 8;
            if len == 0 || at + len > b.len() {
                return None;
            }
            if b[at] == kind {
                return Some(&b[at + 2..at + len]);
            }
            at += len;
        }
        None
    }
    /// Whether the checksum verifies, with the pseudo-header of `src` and `dst` over the whole buffer.
    pub fn verify_checksum(&self, src: [u8; 16], dst: [u8; 16]) -> bool {
        let b = self.buffer.as_ref();
        let pseudo = checksum::pseudo_header_v6(src, dst, IPPROTO_ICMPV6, b.len() as u32);
        checksum::fold(checksum::sum(b, pseudo)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::CHECKSUM, v)
    }

    /// Sets type and code and updates the checksum incrementally (RFC 1624).
    pub fn set_type_code(&mut self, msg_type: u8, code: u8) {
        let old = be16(self.buffer.as_ref(), field::TYPE_CODE);
        let new = u16::from_be_bytes([msg_type, code]);
        put_be16(self.buffer.as_mut(), field::TYPE_CODE, new);
        let c = checksum::update16(self.checksum(), old, new);
        self.set_checksum(c);
    }

    /// Recomputes the checksum over the whole buffer with the pseudo-header of `src` and `dst`.
    pub fn fill_checksum(&mut self, src: [u8; 16], dst: [u8; 16]) {
        self.set_checksum(0);
        let b = self.buffer.as_ref();
        let pseudo = checksum::pseudo_header_v6(src, dst, IPPROTO_ICMPV6, b.len() as u32);
        let c = checksum::checksum(b, pseudo);
        self.set_checksum(c);
    }
}

/// A neighbour advertisement with a target link-layer address option (an Ethernet address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NeighborAdvertRepr {
    /// Flags (see [`na_flags`]).
    pub flags: u8,
    /// The address advertised.
    pub target: [u8; 16],
    /// Its link-layer address.
    pub ll_addr: [u8; 6],
}

impl NeighborAdvertRepr {
    /// Writes the [`NA_WITH_LL_ADDR_LEN`]-byte message with its checksum for the IPv6 header `src` -> `dst`.
    pub fn emit(&self, buf: &mut [u8], src: [u8; 16], dst: [u8; 16]) -> Result<(), WireError> {
        let n = NA_WITH_LL_ADDR_LEN;
        if buf.len() < n {
            return Err(WireError::Truncated { what: "neighbour advertisement", need: n, have: buf.len() });
        }
        let b = &mut buf[..n];
        b.fill(0);
        b[field::TYPE] = NEIGHBOR_ADVERT;
        b[field::ND_FLAGS] = self.flags;
        b[field::ND_TARGET].copy_from_slice(&self.target);
        b[ND_LEN] = OPT_TARGET_LL_ADDR;
        b[ND_LEN + 1] = 1; // in units of 8 bytes
        b[ND_LEN + 2..n].copy_from_slice(&self.ll_addr);
        Packet::new_unchecked(b).fill_checksum(src, dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: [u8; 16] = [0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const TARGET: [u8; 16] = [0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    /// ff02::1:ff00:2, the solicited-node address of TARGET.
    const SNM: [u8; 16] = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 2];

    fn solicitation() -> Vec<u8> {
        let mut b = vec![NEIGHBOR_SOLICIT, 0, 0, 0, 0, 0, 0, 0];
        b.extend_from_slice(&TARGET);
        b.extend_from_slice(&[OPT_SOURCE_LL_ADDR, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        Packet::new_checked(&mut b[..]).unwrap().fill_checksum(SRC, SNM);
        b
    }

    #[test]
    fn test_parse_solicitation() {
        let b = solicitation();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.msg_type(), NEIGHBOR_SOLICIT);
        assert_eq!(p.nd_target(), Some(TARGET));
        assert_eq!(p.nd_option(OPT_SOURCE_LL_ADDR), Some(&[0x52, 0x54, 0, 0x12, 0x34, 0x56][..]));
        assert_eq!(p.nd_option(OPT_TARGET_LL_ADDR), None);
        assert!(p.verify_checksum(SRC, SNM));
        assert!(!p.verify_checksum(TARGET, SNM));
    }

    #[test]
    fn test_emit_advertisement() {
        let mut b = [0xaau8; NA_WITH_LL_ADDR_LEN + 3];
        let na = NeighborAdvertRepr {
            flags: na_flags::SOLICITED | na_flags::OVERRIDE,
            target: TARGET,
            ll_addr: [2, 0, 0, 0, 0, 9],
        };
        na.emit(&mut b, TARGET, SRC).unwrap();
        let p = Packet::new_checked(&b[..NA_WITH_LL_ADDR_LEN]).unwrap();
        assert_eq!(p.msg_type(), NEIGHBOR_ADVERT);
        assert_eq!(p.na_flags(), 0x60);
        assert_eq!(p.nd_target(), Some(TARGET));
        assert_eq!(p.nd_option(OPT_TARGET_LL_ADDR), Some(&[2, 0, 0, 0, 0, 9][..]));
        assert!(p.verify_checksum(TARGET, SRC));
        assert_eq!(b[NA_WITH_LL_ADDR_LEN..], [0xaa; 3], "nothing written past the message");
        assert!(na.emit(&mut [0u8; NA_WITH_LL_ADDR_LEN - 1], TARGET, SRC).is_err());
    }

    #[test]
    fn test_echo_type_change_keeps_the_checksum_right() {
        let mut b = vec![ECHO_REQUEST, 0, 0, 0, 0, 7, 0, 1, 1, 2, 3];
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum(SRC, TARGET);
        p.set_type_code(ECHO_REPLY, 0);
        // The addresses swap too: the pseudo-header sum does not depend on their order.
        assert!(p.verify_checksum(TARGET, SRC));
        assert_eq!((p.ident(), p.seq()), (7, 1));
    }

    #[test]
    fn test_truncated_and_bad_options() {
        let b = solicitation();
        for n in 0..ND_LEN {
            assert!(Packet::new_checked(&b[..n]).is_err(), "len {n}");
        }
        let mut zero_len = b.clone();
        zero_len[ND_LEN + 1] = 0;
        assert_eq!(Packet::new_checked(&zero_len[..]).unwrap().nd_option(OPT_SOURCE_LL_ADDR), None);
        let mut too_long = b.clone();
        too_long[ND_LEN + 1] = 2;
        assert_eq!(Packet::new_checked(&too_long[..]).unwrap().nd_option(OPT_SOURCE_LL_ADDR), None);
        let echo = [ECHO_REQUEST, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(Packet::new_checked(&echo[..]).unwrap().nd_target(), None);
    }
}
