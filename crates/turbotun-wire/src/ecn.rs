//! Explicit Congestion Notification across a tunnel (RFC 6040, normal mode): the inner packet's ECN field is
//! copied to the outer header on the way in, and congestion marked on the outer header on the way is carried
//! over to the inner packet on the way out.
//!
//! The field is the low two bits of the IPv4 TOS byte or of the IPv6 traffic class.

use crate::checksum;

/// Not ECN-capable transport.
pub const NOT_ECT: u8 = 0b00;
/// ECN-capable transport, codepoint 1.
pub const ECT1: u8 = 0b01;
/// ECN-capable transport, codepoint 0.
pub const ECT0: u8 = 0b10;
/// Congestion experienced.
pub const CE: u8 = 0b11;

/// The ECN field of an IP packet (by its version nibble), `None` if it is too short to hold one.
pub fn of(packet: &[u8]) -> Option<u8> {
    match packet.first()? >> 4 {
        4 => Some(packet.get(1)? & 0b11),
        6 => Some((packet.get(1)? >> 4) & 0b11),
        _ => None,
    }
}

/// The outer ECN field for a packet whose ECN field is `inner` (RFC 6040 normal mode: a copy).
pub fn encapsulate(inner: u8) -> u8 {
    inner & 0b11
}

/// The inner ECN field after decapsulation (RFC 6040 section 4.2, figure 4), or `None` when the packet must be
/// dropped: congestion was marked on the outer header of a packet whose transport cannot be told of it.
pub fn decapsulate(outer: u8, inner: u8) -> Option<u8> {
    let (outer, inner) = (outer & 0b11, inner & 0b11);
    match (inner, outer) {
        (NOT_ECT, CE) => None,
        (NOT_ECT, _) => Some(NOT_ECT),
        (CE, _) => Some(CE),
        (_, CE) => Some(CE),
        (ECT0, ECT1) => Some(ECT1),
        (inner, _) => Some(inner),
    }
}

/// Sets the ECN field of an IP packet to `value`, keeping an IPv4 header checksum right (RFC 1624 update).
/// Returns false (packet untouched) if it is not an IPv4 or IPv6 packet long enough for its header.
pub fn set(packet: &mut [u8], value: u8) -> bool {
    let value = value & 0b11;
    match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 => {
            let old = u16::from_be_bytes([packet[0], packet[1]]);
            packet[1] = (packet[1] & !0b11) | value;
            let new = u16::from_be_bytes([packet[0], packet[1]]);
            let check = u16::from_be_bytes([packet[10], packet[11]]);
            packet[10..12].copy_from_slice(&checksum::update16(check, old, new).to_be_bytes());
            true
        }
        Some(6) if packet.len() >= 40 => {
            packet[1] = (packet[1] & !0b0011_0000) | (value << 4);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{payload, Spec};
    use crate::ipv4;

    #[test]
    fn decapsulation_follows_rfc_6040_figure_4() {
        // Rows: inner; columns: outer Not-ECT, ECT(0), ECT(1), CE.
        let table = [
            (NOT_ECT, [Some(NOT_ECT), Some(NOT_ECT), Some(NOT_ECT), None]),
            (ECT0, [Some(ECT0), Some(ECT0), Some(ECT1), Some(CE)]),
            (ECT1, [Some(ECT1), Some(ECT1), Some(ECT1), Some(CE)]),
            (CE, [Some(CE), Some(CE), Some(CE), Some(CE)]),
        ];
        for (inner, row) in table {
            for (outer, want) in [NOT_ECT, ECT0, ECT1, CE].into_iter().zip(row) {
                assert_eq!(decapsulate(outer, inner), want, "inner {inner:02b} outer {outer:02b}");
            }
        }
        for inner in [NOT_ECT, ECT0, ECT1, CE] {
            assert_eq!(encapsulate(inner), inner, "normal mode copies");
        }
    }

    #[test]
    fn setting_the_field_keeps_the_ipv4_checksum_right() {
        for spec in [Spec { tos: 0xb8 | ECT0, ..Spec::udp4() }, Spec { tos: ECT1, ..Spec::tcp6() }] {
            let mut p = spec.build(&payload(100, 3));
            assert_eq!(of(&p), Some(spec.tos & 0b11));
            assert!(set(&mut p, CE));
            assert_eq!(of(&p), Some(CE));
            if !spec.v6 {
                assert!(ipv4::Packet::new_checked(&p[..]).unwrap().verify_checksum());
                assert_eq!(p[1] >> 2, 0xb8 >> 2, "the DSCP bits stay");
            }
        }
        assert!(!set(&mut [0x45, 0, 0], CE));
        assert_eq!(of(&[0x20]), None);
    }
}
