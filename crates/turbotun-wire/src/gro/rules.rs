//! The rules of GRO: what each bit of a header is to the merge decision (the field tables), the masks derived from
//! them, and the comparisons built on those masks: whether two packets are one flow ([`FlowKey`]) and whether a
//! packet has its item's headers wherever a merge needs them equal ([`headers_match`]). The tunnel coalescer
//! compares outer headers with the same tables ([`ip_headers_match`], [`l4_headers_match`]).

use crate::ethernet;
use crate::ipv4;
use crate::ipv6;
use crate::tcp;
use crate::udp;

/// What a header field is to the merge decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Role {
    /// Names the flow (the kernel's `same_flow`): a packet whose field differs belongs to another flow, and the
    /// flow's item stays open for the packets that do match.
    Flow = 1,
    /// Must equal the head's (the kernel's `flush`): a packet of the flow whose field differs closes the item.
    Same = 2,
    /// Changes from segment to segment: checked by the segment rules
    /// ([`Item::accepts`](super::flow::Item::accepts), [`SegmentFields`](super::segment::SegmentFields)) and
    /// rewritten in the merged packet ([`Gro::finish_item`](super::Gro::finish_item)); or, for the TCP urgent
    /// pointer, not compared at all, as the kernel does not (it means nothing without URG, and a segment with URG
    /// never merges).
    PerSegment = 4,
}

/// Bits `bits` of the big-endian field of `len` bytes at `at` (a field longer than 4 bytes is taken whole).
#[derive(Debug, Clone, Copy)]
struct Field {
    at: usize,
    len: usize,
    bits: u32,
    role: Role,
}

const fn whole(at: usize, len: usize, role: Role) -> Field {
    Field { at, len, bits: u32::MAX, role }
}

const fn part(at: usize, len: usize, bits: u32, role: Role) -> Field {
    Field { at, len, bits, role }
}

/// The IPv4 header (`inet_gro_receive`, `inet_gro_flush`). Only a 20-byte header gets this far: options stop a
/// packet before the transport layer.
const IPV4_FIELDS: [Field; 10] = [
    part(0, 1, 0xf0, Role::Flow),   // version
    part(0, 1, 0x0f, Role::Same),   // header length (5)
    whole(1, 1, Role::Same),        // TOS, ECN bits included
    whole(2, 2, Role::PerSegment),  // total length: the packet's own
    whole(4, 2, Role::PerSegment),  // ID: the ID rule
    whole(6, 2, Role::Same),        // reserved bit, DF, MF, fragment offset (MF and offset 0 by then)
    whole(8, 1, Role::Same),        // TTL
    whole(9, 1, Role::Flow),        // protocol
    whole(10, 2, Role::PerSegment), // header checksum: verified
    whole(12, 8, Role::Flow),       // source and destination address
];

/// The fixed IPv6 header (`ipv6_gro_receive`, `ipv6_gro_flush`). Extension headers that follow it name the flow
/// byte for byte.
const IPV6_FIELDS: [Field; 7] = [
    part(0, 4, 0xf00f_ffff, Role::Flow), // version, flow label
    part(0, 4, 0x0ff0_0000, Role::Same), // traffic class, ECN bits included
    whole(4, 2, Role::PerSegment),       // payload length: the packet's own
    whole(6, 1, Role::Flow),             // next header
    whole(7, 1, Role::Same),             // hop limit
    whole(8, 16, Role::Flow),            // source address
    whole(24, 16, Role::Flow),           // destination address
];

/// FIN and PSH in TCP bytes 12 to 15: only the last segment of a super-packet carries them.
const TCP_LAST_SEGMENT_BITS: u32 = ((tcp::flags::FIN | tcp::flags::PSH) as u32) << 16;

/// The fixed TCP header (`tcp_gro_lookup`, `tcp_gro_receive`). Option bytes that follow it must be equal byte
/// for byte. CWR is compared like any flag (Linux 6.17 and later); that a CWR segment never merges is a segment
/// rule.
const TCP_FIELDS: [Field; 7] = [
    whole(0, 4, Role::Flow),                              // ports
    whole(4, 4, Role::PerSegment),                        // sequence number: continues the item
    whole(8, 4, Role::Same),                              // ACK number
    part(12, 4, !TCP_LAST_SEGMENT_BITS, Role::Same),      // data offset, reserved bits, flags, window
    part(12, 4, TCP_LAST_SEGMENT_BITS, Role::PerSegment), // FIN, PSH: the last segment's
    whole(16, 2, Role::PerSegment),                       // checksum: verified, then the merged packet's
    whole(18, 2, Role::PerSegment),                       // urgent pointer: not compared (see `Role`)
];

/// The UDP header (`udp_gro_receive_segment`).
const UDP_FIELDS: [Field; 3] = [
    whole(0, 4, Role::Flow),       // ports
    whole(4, 2, Role::PerSegment), // length: the datagram's own
    whole(6, 2, Role::PerSegment), // checksum: verified, then the merged packet's
];

impl Field {
    /// The bits of byte `b` of the field that it covers.
    const fn byte_bits(&self, b: usize) -> u8 {
        if self.len > 4 {
            0xff
        } else {
            (self.bits >> (8 * (self.len - 1 - b))) as u8
        }
    }
}

/// The bits of an `N`-byte header that fields of the roles in `roles` (a set of [`Role`] bits) cover.
const fn mask<const N: usize>(fields: &[Field], roles: u8) -> [u8; N] {
    let mut m = [0u8; N];
    let mut i = 0;
    while i < fields.len() {
        let f = fields[i];
        if roles & f.role as u8 != 0 {
            let mut b = 0;
            while b < f.len {
                m[f.at + b] |= f.byte_bits(b);
                b += 1;
            }
        }
        i += 1;
    }
    m
}

/// Whether the fields cover every bit of an `n`-byte header exactly once (checked at compile time below).
const fn covers_exactly(fields: &[Field], n: usize) -> bool {
    let mut covered = [0u8; 64];
    let mut i = 0;
    while i < fields.len() {
        let f = fields[i];
        if f.at + f.len > n || (f.len > 4 && f.bits != u32::MAX) {
            return false;
        }
        let mut b = 0;
        while b < f.len {
            let bits = f.byte_bits(b);
            if covered[f.at + b] & bits != 0 {
                return false;
            }
            covered[f.at + b] |= bits;
            b += 1;
        }
        i += 1;
    }
    let mut at = 0;
    while at < n {
        if covered[at] != 0xff {
            return false;
        }
        at += 1;
    }
    true
}

const _: () = assert!(covers_exactly(&IPV4_FIELDS, ipv4::MIN_HEADER_LEN));
const _: () = assert!(covers_exactly(&IPV6_FIELDS, ipv6::HEADER_LEN));
const _: () = assert!(covers_exactly(&TCP_FIELDS, tcp::MIN_HEADER_LEN));
const _: () = assert!(covers_exactly(&UDP_FIELDS, udp::HEADER_LEN));

const FLOW: u8 = Role::Flow as u8;
const FLOW_OR_SAME: u8 = Role::Flow as u8 | Role::Same as u8;

/// The bits of each header that must equal the head's for a merge (roles `Flow` and `Same`).
const IPV4_EQUAL: [u8; ipv4::MIN_HEADER_LEN] = mask(&IPV4_FIELDS, FLOW_OR_SAME);
const IPV6_EQUAL: [u8; ipv6::HEADER_LEN] = mask(&IPV6_FIELDS, FLOW_OR_SAME);
const TCP_EQUAL: [u8; tcp::MIN_HEADER_LEN] = mask(&TCP_FIELDS, FLOW_OR_SAME);
const UDP_EQUAL: [u8; udp::HEADER_LEN] = mask(&UDP_FIELDS, FLOW_OR_SAME);

/// The bits of each header that name the flow ([`FlowKey`]).
pub(super) const IPV4_FLOW: [u8; ipv4::MIN_HEADER_LEN] = mask(&IPV4_FIELDS, FLOW);
pub(super) const IPV6_FLOW: [u8; ipv6::HEADER_LEN] = mask(&IPV6_FIELDS, FLOW);
const TCP_FLOW: [u8; tcp::MIN_HEADER_LEN] = mask(&TCP_FIELDS, FLOW);
const UDP_FLOW: [u8; udp::HEADER_LEN] = mask(&UDP_FIELDS, FLOW);

/// Whether the flow bits of an `N`-byte transport header all lie in its first 4 bytes ([`FlowKey::ports`]).
const fn flow_in_first_word<const N: usize>(m: &[u8; N]) -> bool {
    let mut at = 4;
    while at < N {
        if m[at] != 0 {
            return false;
        }
        at += 1;
    }
    true
}
const _: () = assert!(flow_in_first_word(&TCP_FLOW) && flow_in_first_word(&UDP_FLOW));

/// The first 4 bytes of a transport header's flow mask.
const fn first_word(m: &[u8]) -> u32 {
    u32::from_be_bytes([m[0], m[1], m[2], m[3]])
}
pub(super) const TCP_FLOW_WORD: u32 = first_word(&TCP_FLOW);
pub(super) const UDP_FLOW_WORD: u32 = first_word(&UDP_FLOW);

/// Whether `a` and `b` (each at least `N` bytes) agree on the bits of `mask`: 8-byte words, the last one
/// overlapping the one before when `N` is not a multiple of 8.
#[inline(always)]
fn equal_under<const N: usize>(a: &[u8], b: &[u8], mask: &[u8; N]) -> bool {
    const { assert!(N >= 8) };
    // One length check each; the words are then read from arrays at constant offsets.
    let (Some(a), Some(b)) = (a.first_chunk::<N>(), b.first_chunk::<N>()) else {
        return false;
    };
    let word = |x: &[u8; N], at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&x[at..at + 8]);
        u64::from_ne_bytes(w)
    };
    let mut diff = 0u64;
    let mut at = 0;
    while at + 8 <= N {
        diff |= (word(a, at) ^ word(b, at)) & word(mask, at);
        at += 8;
    }
    if at < N {
        diff |= (word(a, N - 8) ^ word(b, N - 8)) & word(mask, N - 8);
    }
    diff == 0
}

/// Where a packet's headers are: the layer-2 header ends at `l3`, the IP header (with any IPv6 extension
/// headers) at `l4`, the transport header at `hdr_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) l3: usize,
    pub(super) l4: usize,
    pub(super) hdr_len: usize,
    pub(super) v6: bool,
    pub(super) udp: bool,
}

impl Layout {
    pub(super) const EMPTY: Layout = Layout { l3: 0, l4: 0, hdr_len: 0, v6: false, udp: false };
}

/// Whether the IP headers at the start of `head` and `pkt` (a 20-byte IPv4 or the fixed IPv6 header, each
/// slice holding at least that) agree where the field table says they must.
#[inline(always)]
pub(crate) fn ip_headers_match(head: &[u8], pkt: &[u8], v6: bool) -> bool {
    if v6 {
        equal_under(head, pkt, &IPV6_EQUAL)
    } else {
        equal_under(head, pkt, &IPV4_EQUAL)
    }
}

/// Whether the transport headers `head` and `pkt` (each exactly the head's header: the fixed part and, for
/// TCP, its options) agree where the field table says they must; TCP options byte for byte.
#[inline(always)]
pub(crate) fn l4_headers_match(head: &[u8], pkt: &[u8], udp: bool) -> bool {
    if udp {
        return equal_under(head, pkt, &UDP_EQUAL);
    }
    // The data offset is compared with the fixed part, so both have the head's option length.
    equal_under(head, pkt, &TCP_EQUAL)
        && crate::small_copy::same(&head[tcp::MIN_HEADER_LEN..], &pkt[tcp::MIN_HEADER_LEN..])
}

/// Whether packet `pkt` has the headers of `head` (laid out as `l`) wherever a merge needs them equal: the
/// layer-2 header and IPv6 extension headers byte for byte (they name the flow), the IP and transport headers
/// under the field tables. The one comparison of both paths; `pkt` must be longer than `l.hdr_len`.
#[inline(always)]
pub(super) fn headers_match(head: &[u8], pkt: &[u8], l: &Layout) -> bool {
    let (l3, l4, hl) = (l.l3, l.l4, l.hdr_len);
    if pkt.len() <= hl || head.len() < hl {
        return false;
    }
    let ip_fixed = l3 + if l.v6 { ipv6::HEADER_LEN } else { ipv4::MIN_HEADER_LEN };
    // Runs that are empty (no layer-2 header on TUN, no extension headers) are skipped outright.
    (l3 == 0 || crate::small_copy::same(&head[..l3], &pkt[..l3]))
        && ip_headers_match(&head[l3..], &pkt[l3..], l.v6)
        && (l4 == ip_fixed || crate::small_copy::same(&head[ip_fixed..l4], &pkt[ip_fixed..l4]))
        && l4_headers_match(&head[l4..hl], &pkt[l4..hl], l.udp)
}

/// What makes two packets the same flow: the bits of role `Flow` in the field tables (IP version, addresses,
/// IPv6 flow label, protocol, ports) and, byte for byte, the layer-2 header (TAP) and IPv6 extension headers (of
/// which the key holds the length; the bytes are compared with the item's head,
/// [`Gro::find_open`](super::Gro::find_open)).
#[derive(Debug, Clone, Copy)]
pub(super) struct FlowKey {
    pub(super) l2: [u8; ethernet::MAX_HEADER_LEN],
    pub(super) l2_len: u8,
    /// The IP header masked with its flow bits (IPv4 in the first 20 bytes).
    pub(super) ip: [u8; ipv6::HEADER_LEN],
    /// The transport header's first 4 bytes masked with its flow bits.
    pub(super) ports: u32,
    pub(super) ext_len: u16,
}

/// Whether two arrays are equal, compared as 8-byte words (the last overlapping the one before): `==` on an
/// array calls `bcmp`.
#[inline(always)]
fn same_array<const N: usize>(a: &[u8; N], b: &[u8; N]) -> bool {
    equal_under(a, b, &[0xff; N])
}

impl PartialEq for FlowKey {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.ports == other.ports
            && self.l2_len == other.l2_len
            && self.ext_len == other.ext_len
            && same_array(&self.ip, &other.ip)
            && (self.l2_len == 0 || same_array(&self.l2, &other.l2))
    }
}

impl Eq for FlowKey {}

impl FlowKey {
    pub(super) const EMPTY: FlowKey =
        FlowKey { l2: [0; ethernet::MAX_HEADER_LEN], l2_len: 0, ip: [0; ipv6::HEADER_LEN], ports: 0, ext_len: 0 };

    /// A hash of the addresses, the IPv6 flow label and the ports (and the MAC addresses on TAP); the rest of the
    /// key is compared, not hashed.
    #[inline]
    pub(super) fn hash(&self) -> u64 {
        let word = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&self.ip[at..at + 8]);
            u64::from_ne_bytes(a)
        };
        let mix = |h: u64, w: u64| (h ^ w).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(23);
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(self.ext_len);
        // IPv6 (the version in byte 0): flow label, next header and addresses in 40 bytes; IPv4: protocol and
        // addresses in bytes 8 to 20.
        if self.ip[0] == 0x60 {
            for at in [0, 8, 16, 24, 32] {
                h = mix(h, word(at));
            }
        } else {
            h = mix(mix(h, word(8)), word(12));
        }
        if self.l2_len > 0 {
            // The MAC addresses (the first 12 bytes) tell TAP flows apart; the rest is compared, not hashed.
            let mut a = [0u8; 8];
            a.copy_from_slice(&self.l2[4..12]);
            h = (h ^ u64::from_ne_bytes(a)).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(23);
        }
        h = (h ^ u64::from(self.ports)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29)
    }

    /// The source and destination address (in the IP header's layout).
    #[inline]
    pub(super) fn addresses(&self, v6: bool) -> &[u8] {
        if v6 {
            &self.ip[8..40]
        } else {
            &self.ip[12..20]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The masks derived from the field tables: the ones the fast path was first written with by hand, but for
    /// the TCP urgent pointer, which it compared and the kernel does not.
    #[test]
    fn derived_masks() {
        let no = 0u8;
        let x = 0xffu8;
        assert_eq!(IPV4_EQUAL, [x, x, no, no, no, no, x, x, x, x, no, no, x, x, x, x, x, x, x, x]);
        assert_eq!(IPV4_FLOW[..12], [0xf0, no, no, no, no, no, no, no, no, x, no, no]);
        let mut v6 = [x; 40];
        v6[4..6].fill(0);
        assert_eq!(IPV6_EQUAL, v6);
        assert_eq!(IPV6_FLOW[..8], [0xf0, 0x0f, x, x, no, no, x, no]);
        let free = !(tcp::flags::FIN | tcp::flags::PSH);
        assert_eq!(TCP_EQUAL, [x, x, x, x, no, no, no, no, x, x, x, x, x, free, x, x, no, no, no, no]);
        assert_eq!(UDP_EQUAL, [x, x, x, x, no, no, no, no]);
        assert_eq!((TCP_FLOW_WORD, UDP_FLOW_WORD), (u32::MAX, u32::MAX));
    }

    #[test]
    fn equal_under_sees_every_masked_bit() {
        let a: Vec<u8> = (0..40u8).collect();
        for at in 0..20 {
            for bit in 0..8 {
                let mut b = a.clone();
                b[at] ^= 1 << bit;
                let masked = TCP_EQUAL[at] & (1 << bit) != 0;
                assert_eq!(equal_under(&a, &b, &TCP_EQUAL), !masked, "byte {at} bit {bit}");
            }
        }
    }
}
