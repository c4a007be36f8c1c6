//! The oracle's own reading of packet bytes, for the GRO reference model and the tests' checksum check: fields
//! read at their RFC offsets and the Internet checksum summed word by word (RFC 1071). Nothing here calls the
//! crate's header views or its checksum code, which are what the oracle checks: a bug there cannot hide in both.
//! Written for clarity, not speed.

use crate::Framing;

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
/// 802.1Q, 802.1ad and the older 0x9100 tag.
const VLAN_TPIDS: [u16; 3] = [0x8100, 0x88a8, 0x9100];
/// Most VLAN tags in front of the payload (one QinQ stack).
const MAX_VLAN_TAGS: usize = 2;
/// Most IPv6 extension headers walked before the transport header.
const MAX_EXTENSION_HEADERS: usize = 8;

/// TCP flag bits (byte 13 of the header).
pub mod tcp_flag {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const URG: u8 = 0x20;
    pub const CWR: u8 = 0x80;
}

/// The big-endian 16-bit field at `at`.
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The big-endian 32-bit field at `at`.
pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The one's-complement sum of `chunks` taken as one byte string (RFC 1071): 16-bit big-endian words, an odd
/// last byte padded with zero, carries folded back in. Every chunk but the last must have an even length.
pub fn ones_complement_sum(chunks: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    for chunk in chunks {
        let mut words = chunk.chunks_exact(2);
        for w in &mut words {
            sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [last] = words.remainder() {
            sum += u64::from(*last) << 8;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Whether the transport header and payload `l4` verify against the pseudo-header of `src`, `dst` (4 or 16 bytes
/// each) and `proto`: their sum with the pseudo-header is all ones.
pub fn transport_checksum_ok(src: &[u8], dst: &[u8], proto: u8, l4: &[u8]) -> bool {
    // The pseudo-header's length field: 16 bits in IPv4's, 32 in IPv6's; the same sum either way.
    let len = (l4.len() as u32).to_be_bytes();
    ones_complement_sum(&[src, dst, &[0, proto], &len, l4]) == 0xffff
}

/// Where the IP header starts and its version: 0 for IP framing; after the Ethernet header and its VLAN tags
/// for Ethernet framing, when the frame carries IPv4 or IPv6. None for anything else or a cut frame.
pub fn ip_start(pkt: &[u8], framing: Framing) -> Option<(usize, u8)> {
    match framing {
        Framing::Ip => Some((0, *pkt.first()? >> 4)),
        Framing::Ethernet => {
            let mut type_at = 12;
            let mut tags = 0;
            loop {
                let ethertype = u16::from_be_bytes([*pkt.get(type_at)?, *pkt.get(type_at + 1)?]);
                if !VLAN_TPIDS.contains(&ethertype) {
                    let version = match ethertype {
                        ETHERTYPE_IPV4 => 4,
                        ETHERTYPE_IPV6 => 6,
                        _ => return None,
                    };
                    return Some((14 + 4 * tags, version));
                }
                tags += 1;
                if tags > MAX_VLAN_TAGS {
                    return None;
                }
                type_at += 4;
            }
        }
    }
}

/// The transport protocol, where its header starts (from the IP header) and the pseudo-header's addresses,
/// following IPv6 extension headers to the final destination a routing header names. None where that cannot
/// be read (a cut header, an unknown routing type with segments left, too long a chain).
pub fn transport_of_ipv6(ip: &[u8]) -> Option<(u8, usize, Vec<u8>, Vec<u8>)> {
    if ip.len() < 40 {
        return None;
    }
    let (src, mut dst) = (ip[8..24].to_vec(), ip[24..40].to_vec());
    let (mut next, mut at) = (ip[6], 40);
    for _ in 0..=MAX_EXTENSION_HEADERS {
        let len = match next {
            // Hop-by-hop, routing, destination options: 8-byte units after the first 8.
            0 | 43 | 60 => (usize::from(*ip.get(at + 1)?) + 1) * 8,
            // Authentication header: 4-byte units after the first 8.
            51 => (usize::from(*ip.get(at + 1)?) + 2) * 4,
            // Fragment header.
            44 => 8,
            _ => return Some((next, at, src, dst)),
        };
        let header = ip.get(at..at + len)?;
        if next == 43 && header[3] > 0 {
            // Segments left: the checksum is over the final destination (RFC 8200 8.1).
            dst = match header[2] {
                // Type 0 and 2: the addresses in path order, the last one final.
                0 | 2 if len >= 24 => header[len - 16..].to_vec(),
                // Type 4 (segment routing): the list in reverse order, its first entry final.
                4 if len >= 24 => header[8..24].to_vec(),
                _ => return None,
            };
        }
        next = header[0];
        at += len;
    }
    None
}

/// Whether the checksums of `pkt` verify: the IPv4 header's, and the TCP or UDP one (an IPv4 UDP checksum of 0
/// means none). A packet the oracle cannot read that far (not IP, cut short, another transport) counts as
/// verifying: there is nothing to hold against it.
pub fn checksums_ok(pkt: &[u8], framing: Framing) -> bool {
    let Some((l3, version)) = ip_start(pkt, framing) else { return true };
    let ip = &pkt[l3..];
    let (proto, l4, src, dst) = match version {
        4 => {
            if ip.len() < 20 {
                return true;
            }
            let header_len = usize::from(ip[0] & 0x0f) * 4;
            if header_len < 20 || ip.len() < header_len {
                return true;
            }
            if ones_complement_sum(&[&ip[..header_len]]) != 0xffff {
                return false;
            }
            (ip[9], header_len, ip[12..16].to_vec(), ip[16..20].to_vec())
        }
        6 => match transport_of_ipv6(ip) {
            Some(found) => found,
            None => return true,
        },
        _ => return true,
    };
    let l4 = &ip[l4..];
    match proto {
        PROTO_UDP if version == 4 && l4.len() >= 8 && l4[6..8] == [0, 0] => true,
        PROTO_TCP | PROTO_UDP => transport_checksum_ok(&src, &dst, proto, l4),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_worked_example() {
        // RFC 1071 section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2 (with the carries folded in).
        assert_eq!(ones_complement_sum(&[&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]]), 0xddf2);
        // An odd length pads the last byte on the right; split chunks give the same sum.
        assert_eq!(ones_complement_sum(&[&[0x12, 0x34, 0x56]]), 0x1234 + 0x5600);
        assert_eq!(ones_complement_sum(&[&[0x00, 0x01], &[0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]]), 0xddf2);
    }

    /// An IPv4/UDP datagram written out by hand (header checksum and UDP checksum computed on paper), so that
    /// the oracle is held against numbers, not against the crate.
    #[test]
    fn a_packet_checked_by_hand() {
        let mut pkt = vec![
            0x45, 0x00, 0x00, 0x1e, 0x00, 0x01, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 0, 0, 1, 10, 0, 0,
            2, // IPv4
            0x04, 0xd2, 0x16, 0x2e, 0x00, 0x0a, 0x00, 0x00, // UDP 1234 -> 5678, length 10
            b'h', b'i',
        ];
        // Header words 4500 001e 0001 4000 4011 0a00 0001 0a00 0002 sum to d933: the checksum is 26cc.
        pkt[10..12].copy_from_slice(&[0x26, 0xcc]);
        // Pseudo-header 0a00 0001 0a00 0002 0011 000a, UDP 04d2 162e 000a 0000, data 6869 sum to 9791: 686e.
        pkt[26..28].copy_from_slice(&[0x68, 0x6e]);
        assert!(checksums_ok(&pkt, Framing::Ip));
        let mut bad = pkt.clone();
        bad[29] ^= 1;
        assert!(!checksums_ok(&bad, Framing::Ip), "a payload bit flipped");
        let mut bad = pkt.clone();
        bad[8] = 63;
        assert!(!checksums_ok(&bad, Framing::Ip), "the TTL changed under the header checksum");
        // A zero UDP checksum over IPv4 means none.
        let mut none = pkt.clone();
        none[26..28].copy_from_slice(&[0, 0]);
        none[29] ^= 1;
        assert!(checksums_ok(&none, Framing::Ip));
        // The same behind an Ethernet header with one VLAN tag.
        let mut frame = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x81, 0x00, 0x00, 0x07, 0x08, 0x00];
        frame.extend_from_slice(&pkt);
        assert_eq!(ip_start(&frame, Framing::Ethernet), Some((18, 4)));
        assert!(checksums_ok(&frame, Framing::Ethernet));
        frame[18 + 29] ^= 1;
        assert!(!checksums_ok(&frame, Framing::Ethernet));
    }
}
