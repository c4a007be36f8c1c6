//! ARP packet view (RFC 826), for Ethernet hardware addresses and IPv4 protocol addresses only: the only kind
//! a TAP device carries.

use crate::bytes::{be16, put_be16};
use crate::WireError;

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;
/// Hardware type of Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;
/// Protocol type of IPv4 (the EtherType).
pub const PTYPE_IPV4: u16 = 0x0800;
/// Operation: request.
pub const OP_REQUEST: u16 = 1;
/// Operation: reply.
pub const OP_REPLY: u16 = 2;

/// Byte ranges of the fields.
mod field {
    #![allow(missing_docs)]
    use std::ops::Range;
    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// A view of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after checking that 28 bytes fit (the address types are checked by [`Packet::is_ethernet_ipv4`]:
    /// another kind of ARP packet is well formed, just not one this view reads).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < PACKET_LEN {
            return Err(WireError::Truncated { what: "ARP packet", need: PACKET_LEN, have });
        }
        Ok(Packet { buffer })
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Whether hardware and protocol types and lengths are Ethernet (6) and IPv4 (4).
    pub fn is_ethernet_ipv4(&self) -> bool {
        let b = self.buffer.as_ref();
        self.htype() == HTYPE_ETHERNET && self.ptype() == PTYPE_IPV4 && b[field::HLEN] == 6 && b[field::PLEN] == 4
    }
    /// Hardware type.
    pub fn htype(&self) -> u16 {
        be16(self.buffer.as_ref(), field::HTYPE)
    }
    /// Protocol type.
    pub fn ptype(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PTYPE)
    }
    /// Operation.
    pub fn operation(&self) -> u16 {
        be16(self.buffer.as_ref(), field::OPER)
    }
    /// Sender hardware address.
    pub fn sender_hw(&self) -> [u8; 6] {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SHA]);
        a
    }
    /// Sender protocol (IPv4) address.
    pub fn sender_ip(&self) -> [u8; 4] {
        let mut a = [0; 4];
        a.copy_from_slice(&self.buffer.as_ref()[field::SPA]);
        a
    }
    /// Target hardware address.
    pub fn target_hw(&self) -> [u8; 6] {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::THA]);
        a
    }
    /// Target protocol (IPv4) address.
    pub fn target_ip(&self) -> [u8; 4] {
        let mut a = [0; 4];
        a.copy_from_slice(&self.buffer.as_ref()[field::TPA]);
        a
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the operation.
    pub fn set_operation(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::OPER, v)
    }
    /// Sets the sender hardware address.
    pub fn set_sender_hw(&mut self, a: [u8; 6]) {
        self.buffer.as_mut()[field::SHA].copy_from_slice(&a)
    }
    /// Sets the sender protocol address.
    pub fn set_sender_ip(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::SPA].copy_from_slice(&a)
    }
    /// Sets the target hardware address.
    pub fn set_target_hw(&mut self, a: [u8; 6]) {
        self.buffer.as_mut()[field::THA].copy_from_slice(&a)
    }
    /// Sets the target protocol address.
    pub fn set_target_ip(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::TPA].copy_from_slice(&a)
    }

    /// Turns a request into the reply that `hw` owns the target address, in place: sender and target swapped,
    /// `hw` as the sender hardware address, operation reply.
    pub fn make_reply(&mut self, hw: [u8; 6]) {
        let (sha, spa, tpa) = (self.sender_hw(), self.sender_ip(), self.target_ip());
        self.set_operation(OP_REPLY);
        self.set_sender_hw(hw);
        self.set_sender_ip(tpa);
        self.set_target_hw(sha);
        self.set_target_ip(spa);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Who has 10.9.0.2? Tell 10.9.0.1 (52:54:00:12:34:56).
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 10, 9, 0, 1, 0, 0, 0, 0, 0, 0,
        10, 9, 0, 2,
    ];

    #[test]
    fn test_parse() {
        let p = Packet::new_checked(&REQUEST[..]).unwrap();
        assert!(p.is_ethernet_ipv4());
        assert_eq!(p.operation(), OP_REQUEST);
        assert_eq!(p.sender_hw(), [0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(p.sender_ip(), [10, 9, 0, 1]);
        assert_eq!(p.target_hw(), [0; 6]);
        assert_eq!(p.target_ip(), [10, 9, 0, 2]);
    }

    #[test]
    fn test_make_reply() {
        let mut b = REQUEST;
        Packet::new_checked(&mut b[..]).unwrap().make_reply([2, 0, 0, 0, 0, 9]);
        let expected: [u8; 28] = [
            0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x02, 2, 0, 0, 0, 0, 9, 10, 9, 0, 2, 0x52, 0x54, 0x00, 0x12, 0x34,
            0x56, 10, 9, 0, 1,
        ];
        assert_eq!(b, expected);
    }

    #[test]
    fn test_truncated_and_other_types() {
        for n in 0..PACKET_LEN {
            assert!(Packet::new_checked(&REQUEST[..n]).is_err());
        }
        let mut other = REQUEST;
        other[5] = 16; // IPv6-sized protocol addresses
        assert!(!Packet::new_checked(&other[..]).unwrap().is_ethernet_ipv4());
    }
}
