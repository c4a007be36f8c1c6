//! GRO: coalesce a batch of TCP or UDP packets per flow into super-packets for one `write()` each to a TUN/TAP
//! device with a virtio_net_hdr.
//!
//! The merge decision is the kernel's (Linux 6.18: `dev_gro_receive`, `inet_gro_receive`, `ipv6_gro_receive`,
//! `tcp_gro_receive`, `udp_gro_receive_segment`; see `docs/OFFLOAD.md`), applied to the batch in order. Each part
//! of it is written once, in this module:
//!
//! - **Which header bits must agree**: the field tables (`IPV4_FIELDS`, `IPV6_FIELDS`, `TCP_FIELDS`,
//!   `UDP_FIELDS`) give every bit of the fixed headers a role: it names the flow, it must equal the head's, or it
//!   changes from segment to segment. The flow key (`FlowKey`), the one comparison both paths make
//!   (`headers_match`) and the tunnel coalescer's ([`crate::udp_tunnel::coalesce_tunnel`]) are derived from them.
//!   Layer-2 headers and IPv6 extension headers name the flow byte for byte; TCP options must be equal byte for
//!   byte.
//! - **How far a packet gets** (it stops before the transport layer, reaches it flagged, or is a candidate):
//!   `parse_candidate_into`.
//! - **The rules of the fields that change per segment** (lengths, the IPv4 ID, the sequence number, the size,
//!   CWR, the UDP cap): `SegmentFields::read` reads them, `Item::accepts` judges them, `Item::merged` counts a
//!   merge, for both paths.
//! - **Which packets may wait for more** (the kernel's held packet): `SegmentFields::holdable`.
//! - **Checksums**: `l4_checksum_ok`, shared with the tunnel coalescer.
//!
//! A flow has at most one open item. A packet of the flow either merges into it or closes it; a packet that did
//! not merge becomes the flow's new open item if it may be held, and passes through alone otherwise. FIN and PSH
//! merge as the last segment and are carried by the super-packet; a segment shorter than `gso_size` is the last
//! too. A segment with CWR is kept alone, as Linux 6.17 and 6.18 do (6.16 and earlier merge the segments after a
//! CWR segment into it; a 2026 change merges segments whose CWR bits are equal; see `docs/OFFLOAD.md`).
//!
//! Four deliberate differences from Linux 6.18, each tested against the reference model
//! (`fuzzing::reference_groups`):
//!
//! - a UDP datagram never joins an item behind a packet of the same addresses that could not merge (a fragment
//!   written between them would otherwise be overtaken, which UDP cannot repair): fewer merges;
//! - an IPv4 UDP checksum of 0 ("none") may coalesce, which the kernel refuses (that would disable GRO for VXLAN):
//!   more merges;
//! - an IPv4 ID that stays fixed merges only with DF set: 6.18 merges it with DF clear too and marks the result
//!   (`SKB_GSO_TCP_FIXEDID`) so that a re-split keeps the ID fixed, a mark the virtio header cannot carry, and a
//!   re-split without it would number the segments: fewer merges;
//! - a routing header with segments left stops a packet before the transport layer (its checksum covers the
//!   final destination, the kernel's GRO checks it against the header's): fewer merges.
//!
//! L4 checksums are verified before a merge unless the caller vouches for them ([`Checksums`]); a packet that
//! fails passes through unmerged and leaves its flow's item open, as in the kernel.
//!
//! The flow table is a `Vec` kept in the [`Gro`] and cleared (not reallocated) per batch; flows are found by a
//! linear scan over a 64-bit hash, newest first, which is cheap for the batch sizes used with TUN (≤ 128).

use crate::checksum;
use crate::ethernet;
use crate::ipv4;
use crate::ipv6;
use crate::tcp;
use crate::udp;
use crate::virtio_net::{flags, gso, VirtioNetHdrRepr, VIRTIO_NET_HDR_LEN};
use crate::{Framing, IPPROTO_TCP, IPPROTO_UDP};

/// Default cap on the segments of a coalesced UDP packet (`UDP_MAX_SEGMENTS` of older kernels).
pub const DEFAULT_UDP_MAX_SEGMENTS: usize = 64;
/// Largest IP packet produced (the kernel's `gro_max_size`, from the IP header on: a TAP frame may be longer by its
/// Ethernet header).
pub const MAX_PACKET_LEN: usize = 65535;

/// What to coalesce and how the packets are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroConfig {
    /// Coalesce TCP (needs TSO granted by `TUNSETOFFLOAD`).
    pub tcp: bool,
    /// Coalesce UDP (needs USO granted).
    pub udp: bool,
    /// Framing of the packets.
    pub framing: Framing,
    /// Size of the virtio_net_hdr in front of every packet (10, 12 or 20).
    pub vnet_hdr_len: usize,
}

impl Default for GroConfig {
    fn default() -> Self {
        GroConfig { tcp: true, udp: false, framing: Framing::Ip, vnet_hdr_len: VIRTIO_NET_HDR_LEN }
    }
}

/// What the caller of [`Gro::coalesce`] knows of the batch's L4 checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checksums {
    /// Nothing: each is verified before its packet merges (one that fails passes through unmerged).
    #[default]
    Unverified,
    /// All are correct (computed by us, or marked `DATA_VALID` by the kernel): merges trust them.
    Valid,
    /// Each is correct or partial (the pseudo-header sum, as [`crate::partial`] describes; only markable
    /// packets are ever partial): merges trust them, and every markable packet written unmerged gets a partial
    /// checksum and a `NEEDS_CSUM` header so that the kernel completes it.
    Partial,
}

impl Checksums {
    /// Whether merges may trust the checksums without verifying them.
    pub fn trusted(self) -> bool {
        self != Checksums::Unverified
    }

    /// The state of two groups of packets handed over together, if one state describes both (`None`: a partial
    /// group beside an unverified one, whose partial checksums must be completed first).
    pub fn join(self, other: Checksums) -> Option<Checksums> {
        use Checksums::*;
        match (self, other) {
            (Partial, Unverified) | (Unverified, Partial) => None,
            (Unverified, _) | (_, Unverified) => Some(Unverified),
            (Partial, _) | (_, Partial) => Some(Partial),
            (Valid, Valid) => Some(Valid),
        }
    }
}

impl From<bool> for Checksums {
    /// `true`: [`Checksums::Valid`]; `false`: [`Checksums::Unverified`].
    fn from(valid: bool) -> Self {
        if valid {
            Checksums::Valid
        } else {
            Checksums::Unverified
        }
    }
}

/// Counters of one [`Gro::coalesce`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroStats {
    /// Packets in the batch.
    pub packets: usize,
    /// Packets to write (`to_write.len()`).
    pub written: usize,
    /// Packets merged into another packet (not written on their own).
    pub coalesced: usize,
    /// TCP super-packets produced (2 or more segments).
    pub tcp_super_packets: usize,
    /// UDP super-packets produced.
    pub udp_super_packets: usize,
    /// Packets whose L4 checksum failed verification (passed through unmerged).
    pub bad_checksum: usize,
    /// Packets whose buffer cannot hold `offset + len` or when `offset < vnet_hdr_len` (written untouched).
    pub malformed: usize,
}

// ---------------------------------------------------------------------------------------------------------------
// The field tables: what each bit of a header is to the merge decision.
// ---------------------------------------------------------------------------------------------------------------

/// What a header field is to the merge decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Role {
    /// Names the flow (the kernel's `same_flow`): a packet whose field differs belongs to another flow, and the
    /// flow's item stays open for the packets that do match.
    Flow = 1,
    /// Must equal the head's (the kernel's `flush`): a packet of the flow whose field differs closes the item.
    Same = 2,
    /// Changes from segment to segment: checked by the segment rules ([`Item::accepts`], [`SegmentFields`]) and
    /// rewritten in the merged packet ([`Gro::finish_item`]); or, for the TCP urgent pointer, not compared at all,
    /// as the kernel does not (it means nothing without URG, and a segment with URG never merges).
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
const IPV4_FLOW: [u8; ipv4::MIN_HEADER_LEN] = mask(&IPV4_FIELDS, FLOW);
const IPV6_FLOW: [u8; ipv6::HEADER_LEN] = mask(&IPV6_FIELDS, FLOW);
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
const TCP_FLOW_WORD: u32 = first_word(&TCP_FLOW);
const UDP_FLOW_WORD: u32 = first_word(&UDP_FLOW);

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
struct Layout {
    l3: usize,
    l4: usize,
    hdr_len: usize,
    v6: bool,
    udp: bool,
}

impl Layout {
    const EMPTY: Layout = Layout { l3: 0, l4: 0, hdr_len: 0, v6: false, udp: false };
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
fn headers_match(head: &[u8], pkt: &[u8], l: &Layout) -> bool {
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

// ---------------------------------------------------------------------------------------------------------------
// Flows and the fields of each segment.
// ---------------------------------------------------------------------------------------------------------------

/// What makes two packets the same flow: the bits of role `Flow` in the field tables (IP version, addresses,
/// IPv6 flow label, protocol, ports) and, byte for byte, the layer-2 header (TAP) and IPv6 extension headers (of
/// which the key holds the length; the bytes are compared with the item's head, [`Gro::find_open`]).
#[derive(Debug, Clone, Copy)]
struct FlowKey {
    l2: [u8; ethernet::MAX_HEADER_LEN],
    l2_len: u8,
    /// The IP header masked with its flow bits (IPv4 in the first 20 bytes).
    ip: [u8; ipv6::HEADER_LEN],
    /// The transport header's first 4 bytes masked with its flow bits.
    ports: u32,
    ext_len: u16,
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
    const EMPTY: FlowKey =
        FlowKey { l2: [0; ethernet::MAX_HEADER_LEN], l2_len: 0, ip: [0; ipv6::HEADER_LEN], ports: 0, ext_len: 0 };

    /// A hash of the addresses, the IPv6 flow label and the ports (and the MAC addresses on TAP); the rest of the
    /// key is compared, not hashed.
    #[inline]
    fn hash(&self) -> u64 {
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
    fn addresses(&self, v6: bool) -> &[u8] {
        if v6 {
            &self.ip[8..40]
        } else {
            &self.ip[12..20]
        }
    }
}

/// The fields of a packet that change from segment to segment (role `PerSegment`), and what the segment rules
/// make of them.
#[derive(Debug, Clone, Copy)]
struct SegmentFields {
    payload_len: usize,
    /// TCP sequence number (0 for UDP).
    seq: u32,
    /// TCP flags (0 for UDP).
    flags: u8,
    /// IPv4 ID (0 for IPv6).
    ident: u16,
    /// Whether the IP layer lets it through unflagged: its IP length is the packet's, the IPv4 reserved bit is
    /// clear, it has a payload. A packet that is not sound reaches the transport layer (and closes its flow's
    /// item) but neither merges nor is held.
    sound: bool,
}

/// TCP flags that keep a packet from being held for later segments (`tcp_gro_receive`'s `out_check_final`):
/// it is written alone, or, for FIN and PSH, as the last segment of an item. CWR is here too: nothing can merge
/// behind a CWR segment (a segment without CWR differs from it in the flag word, one with CWR never merges), so
/// holding it changes nothing.
const TCP_NOT_HELD: u8 =
    tcp::flags::URG | tcp::flags::PSH | tcp::flags::RST | tcp::flags::SYN | tcp::flags::FIN | tcp::flags::CWR;

/// The big-endian 16-bit field at `at` of `b`, as a length.
#[inline(always)]
fn be16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([b[at], b[at + 1]]))
}

impl SegmentFields {
    const EMPTY: SegmentFields = SegmentFields { payload_len: 0, seq: 0, flags: 0, ident: 0, sound: false };

    /// Reads them from `pkt` laid out as `l` (the caller has checked that `pkt` holds `l.hdr_len` bytes).
    #[inline(always)]
    fn read(pkt: &[u8], l: &Layout) -> SegmentFields {
        let ip_len = pkt.len() - l.l3;
        // Fixed-size views: one length check each instead of one per byte read.
        let ip: &[u8; 8] = pkt[l.l3..].first_chunk().unwrap_or(&[0; 8]);
        let (ip_sound, ident) = if l.v6 {
            (be16(ip, 4) + ipv6::HEADER_LEN == ip_len, 0)
        } else {
            let reserved = ip[6] & (ipv4::FLAG_RESERVED >> 8) as u8 != 0;
            (be16(ip, 2) == ip_len && !reserved, be16(ip, 4) as u16)
        };
        let payload_len = pkt.len() - l.hdr_len;
        if l.udp {
            let u: &[u8; 8] = pkt[l.l4..].first_chunk().unwrap_or(&[0; 8]);
            let udp_sound = be16(u, 4) == pkt.len() - l.l4;
            return SegmentFields {
                payload_len,
                seq: 0,
                flags: 0,
                ident,
                sound: ip_sound && udp_sound && payload_len > 0,
            };
        }
        let t: &[u8; 14] = pkt[l.l4..].first_chunk().unwrap_or(&[0; 14]);
        SegmentFields {
            payload_len,
            seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
            flags: t[13],
            ident,
            sound: ip_sound && payload_len > 0,
        }
    }

    /// Whether it may start an item (the kernel holds it for later packets to merge into).
    fn holdable(&self) -> bool {
        self.sound && self.flags & TCP_NOT_HELD == 0
    }
}

/// How the IPv4 IDs of an item go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdMode {
    /// Only the first segment so far.
    Unknown,
    /// The first's plus the segment's index.
    Incrementing,
    /// The first's, with DF set.
    Fixed,
}

/// The IPv4 ID rule: the ID of segment `n` (counting from 0) is the first's plus `n`, or every ID equals the
/// first's with DF set; the second segment decides which, and the two never mix. The kernel's `inet_gro_flush`
/// through 6.17; 6.18 also merges a fixed ID with DF clear, marking the result (`SKB_GSO_TCP_FIXEDID`) so that a
/// re-split keeps the ID fixed, which the virtio header cannot say, so that merge is refused here (a re-split
/// would number the segments). `None`: the segment may not join.
#[inline(always)]
pub(crate) fn ipv4_id_rule(first: u16, n: usize, id: u16, df: bool, mode: IdMode) -> Option<IdMode> {
    if id == first.wrapping_add(n as u16) && mode != IdMode::Fixed {
        Some(IdMode::Incrementing)
    } else if id == first && df && mode != IdMode::Incrementing {
        Some(IdMode::Fixed)
    } else {
        None
    }
}

/// Verifies the transport checksum of the transport header and payload `l4` against the pseudo-header sum
/// `addr_sum` (addresses and protocol, without the length). A UDP checksum of 0 means "none": valid over IPv4
/// (where it may coalesce, see the module documentation), invalid over IPv6.
pub(crate) fn l4_checksum_ok(l4: &[u8], addr_sum: u32, udp: bool, v6: bool) -> bool {
    if udp && l4.len() >= udp::HEADER_LEN && l4[6] == 0 && l4[7] == 0 {
        return !v6;
    }
    checksum::fold(checksum::sum(l4, checksum::add(addr_sum, l4.len() as u32))) == 0xffff
}

/// The pseudo-header sum (addresses and transport protocol, without the length) of `pkt`, laid out as `l`. The
/// IPv6 destination is the header's: a routing header with segments left stops a packet before this is asked.
fn addr_sum(pkt: &[u8], l: &Layout) -> u32 {
    let ip = &pkt[l.l3..];
    let proto = if l.udp { IPPROTO_UDP } else { IPPROTO_TCP };
    let take = |at: usize| -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&ip[at..at + 16]);
        a
    };
    if l.v6 {
        checksum::pseudo_header_v6(take(8), take(24), proto, 0)
    } else {
        checksum::pseudo_header_v4([ip[12], ip[13], ip[14], ip[15]], [ip[16], ip[17], ip[18], ip[19]], proto, 0)
    }
}

/// Whether a 20-byte IPv4 header's checksum verifies (inline: the general sum is for long data).
#[inline(always)]
pub(crate) fn ipv4_header_sum_ok(ip: &[u8]) -> bool {
    let sum: u32 = ip[..20].chunks_exact(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    checksum::fold(sum) == 0xffff
}

/// A packet that reached the transport layer: everything the merge decision looks at.
#[derive(Debug, Clone, Copy)]
struct Cand {
    key: FlowKey,
    layout: Layout,
    seg: SegmentFields,
}

impl Cand {
    const EMPTY: Cand = Cand { key: FlowKey::EMPTY, layout: Layout::EMPTY, seg: SegmentFields::EMPTY };
}

/// What the coalescer holds of a flow's open (or closed) item. The fields the fast path reads come first, the
/// flow key last (`repr(C)` keeps that order, so that the next segment of a stream touches one cache line).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Item {
    /// No further packet merges: completed (after a short, FIN or PSH segment), refused a packet of its flow, or
    /// its own checksum failed.
    closed: bool,
    verified: bool,
    /// FIN and PSH of the merged segments, carried by the super-packet.
    or_flags: u8,
    id_mode: IdMode,
    layout: Layout,
    /// The head packet's segment fields.
    head: SegmentFields,
    buf: usize,
    /// Gather mode: the last member of the chain (the first is `buf`) and the coalesced length.
    last: usize,
    vlen: usize,
    gso_size: usize,
    segs: usize,
    payload_total: usize,
    hash: u64,
    key: FlowKey,
}

impl Item {
    /// A flow's first packet, `c` in buffer `buf` of length `len` (open).
    fn first(c: &Cand, hash: u64, buf: usize, len: usize, verified: bool) -> Item {
        Item {
            hash,
            key: c.key,
            layout: c.layout,
            head: c.seg,
            buf,
            last: buf,
            vlen: len,
            gso_size: c.seg.payload_len,
            segs: 1,
            payload_total: c.seg.payload_len,
            or_flags: 0,
            id_mode: IdMode::Unknown,
            verified,
            closed: false,
        }
    }

    /// The segment rules: whether a packet whose headers match the head's ([`headers_match`]) and whose
    /// per-segment fields are `s` may be appended (`tcp_gro_receive`, `udp_gro_receive_segment`,
    /// `inet_gro_flush`), and the IPv4 ID rule the item then follows. The size of the merged packet is the
    /// caller's to check (it depends on the buffers).
    #[inline(always)]
    fn accepts(&self, s: &SegmentFields, df: bool, udp_max_segments: usize) -> Option<IdMode> {
        // A CWR segment never merges (`tcp_gro_receive`); nothing goes beyond the item's first segment size.
        if !s.sound || s.flags & tcp::flags::CWR != 0 || s.payload_len > self.gso_size {
            return None;
        }
        let continues = if self.layout.udp {
            self.segs < udp_max_segments
        } else {
            s.seq == self.head.seq.wrapping_add(self.payload_total as u32)
        };
        if !continues {
            return None;
        }
        if self.layout.v6 {
            return Some(self.id_mode);
        }
        ipv4_id_rule(self.head.ident, self.segs, s.ident, df, self.id_mode)
    }

    /// Counts a merged segment of `payload_len` bytes with TCP `flags` that followed ID rule `id_mode`. A short
    /// segment, FIN or PSH completes the item, as does the UDP segment cap.
    #[inline(always)]
    fn merged(&mut self, payload_len: usize, flags: u8, id_mode: IdMode, udp_max_segments: usize) {
        self.payload_total += payload_len;
        self.segs += 1;
        self.id_mode = id_mode;
        let last_flags = flags & (tcp::flags::FIN | tcp::flags::PSH);
        self.or_flags |= last_flags;
        let full = self.layout.udp && self.segs >= udp_max_segments;
        if payload_len < self.gso_size || last_flags != 0 || full {
            self.closed = true;
        }
    }
}

/// One flow coalesced in order, packet by packet, for a caller that finds the packets itself: the tunnel
/// coalescer, for the inner packets of tunnel frames. The same parse ([`parse_candidate_into`]), header
/// comparison ([`headers_match`]) and segment rules ([`Item::accepts`]) as [`Gro`]; checksums are always
/// verified.
#[derive(Debug, Clone)]
pub(crate) struct FlowRun {
    item: Item,
    udp_max_segments: usize,
}

impl FlowRun {
    /// Starts a run with `pkt` (framed as `framing`) if it may be held and its checksum verifies.
    pub(crate) fn start(pkt: &[u8], framing: Framing, udp_max_segments: usize) -> Option<FlowRun> {
        let mut c = Cand::EMPTY;
        if parse_candidate_into(pkt, framing, true, true, &mut c) != Parsed::Transport || !c.seg.holdable() {
            return None;
        }
        let l = c.layout;
        if !l4_checksum_ok(&pkt[l.l4..], addr_sum(pkt, &l), l.udp, l.v6) {
            return None;
        }
        Some(FlowRun { item: Item::first(&c, 0, 0, pkt.len(), true), udp_max_segments })
    }

    /// Appends `pkt` if it may follow the run, whose first packet is `head`; `false` (and nothing counted) if not.
    pub(crate) fn push(&mut self, head: &[u8], pkt: &[u8]) -> bool {
        let it = &self.item;
        let l = it.layout;
        if it.closed || !headers_match(head, pkt, &l) || (!l.v6 && !ipv4_header_sum_ok(&pkt[l.l3..])) {
            return false;
        }
        let seg = SegmentFields::read(pkt, &l);
        if !l4_checksum_ok(&pkt[l.l4..], addr_sum(pkt, &l), l.udp, l.v6) {
            return false;
        }
        let Some(id_mode) = it.accepts(&seg, df_of(pkt, &l), self.udp_max_segments) else {
            return false;
        };
        self.item.merged(seg.payload_len, seg.flags, id_mode, self.udp_max_segments);
        true
    }

    /// Header length of every packet of the run.
    pub(crate) fn hdr_len(&self) -> usize {
        self.item.layout.hdr_len
    }

    /// Offset of the IP header.
    pub(crate) fn l3(&self) -> usize {
        self.item.layout.l3
    }

    /// Offset of the transport header.
    pub(crate) fn l4(&self) -> usize {
        self.item.layout.l4
    }

    /// Whether the packets are UDP (else TCP) and IPv6 (else IPv4).
    pub(crate) fn udp_v6(&self) -> (bool, bool) {
        (self.item.layout.udp, self.item.layout.v6)
    }

    /// Payload bytes of the first packet (every one but the last has as many).
    pub(crate) fn gso_size(&self) -> usize {
        self.item.gso_size
    }

    /// FIN and PSH of the segments, which the merged packet carries.
    pub(crate) fn last_segment_flags(&self) -> u8 {
        self.item.or_flags
    }

    /// Pseudo-header sum of the addresses and protocol (without the length) of the run's first packet, `head`.
    pub(crate) fn addr_sum(&self, head: &[u8]) -> u32 {
        addr_sum(head, &self.item.layout)
    }
}

/// Whether the IPv4 header at `l3` of `pkt` has DF set (false for IPv6).
#[inline(always)]
fn df_of(pkt: &[u8], l: &Layout) -> bool {
    !l.v6 && pkt[l.l3 + 6] & (ipv4::FLAG_DF >> 8) as u8 != 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Pass,
    Head(usize),
    Merged,
}

/// How far the parser got with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parsed {
    /// It reached the transport layer of a kind being coalesced: `Cand` describes it.
    Transport,
    /// It stopped before (not IP, IPv4 options, a fragment, a bad IPv4 header checksum, an IPv6 extension header
    /// GRO does not walk or a routing header with segments left, an incomplete or bad transport header, a kind
    /// not coalesced). `udp_barrier`: it is not TCP, so a UDP datagram behind it must not join an item in front
    /// of it (see the module documentation).
    Stopped { udp_barrier: bool },
}

#[cfg(test)]
fn parse_candidate(pkt: &[u8], framing: Framing, tcp_on: bool, udp_on: bool) -> Option<Cand> {
    let mut c = Cand::EMPTY;
    (parse_candidate_into(pkt, framing, tcp_on, udp_on, &mut c) == Parsed::Transport && c.seg.sound).then_some(c)
}

/// The source and destination addresses of an IP packet, laid out as in [`FlowKey::addresses`], and whether it
/// is IPv6; `None` if it is not IP or its header is not one (too short, or an IPv4 header length below 20 bytes or
/// past the packet): such bytes name no addresses, so they are no UDP barrier.
fn address_pair(pkt: &[u8], framing: Framing) -> Option<(&[u8], bool)> {
    let (l3, ethertype) = match framing {
        Framing::Ip => (0, None),
        Framing::Ethernet => {
            let f = ethernet::Frame::new_checked(pkt).ok()?;
            (f.header_len(), Some(f.inner_ethertype()))
        }
    };
    let ip = pkt.get(l3..)?;
    match ip.first()? >> 4 {
        4 if ethertype.map_or(true, |e| e == ethernet::ETHERTYPE_IPV4) => {
            ipv4::Packet::new_checked(ip).ok()?;
            Some((&ip[12..20], false))
        }
        6 if ethertype.map_or(true, |e| e == ethernet::ETHERTYPE_IPV6) => {
            ipv6::Packet::new_checked(ip).ok()?;
            Some((&ip[8..40], true))
        }
        _ => None,
    }
}

/// The length of the IPv6 extension headers GRO walks (hop-by-hop, routing and destination options, as the
/// kernel's `ipv6_gro_pull_exthdrs`) between the fixed header and `ip`'s transport header, and the transport
/// protocol; `None` if they do not fit, a routing header has segments left, or the chain is longer than
/// [`ipv6::MAX_EXT_HEADERS`].
fn ipv6_extension_headers(ip: &[u8]) -> Option<(usize, u8)> {
    use ipv6::next_header::{DEST_OPTS, HOP_BY_HOP, ROUTING};
    let mut nh = *ip.get(6)?;
    let mut at = ipv6::HEADER_LEN;
    let mut count = 0;
    while matches!(nh, HOP_BY_HOP | ROUTING | DEST_OPTS) {
        count += 1;
        let len = (usize::from(*ip.get(at + 1)?) + 1) * 8;
        if count > ipv6::MAX_EXT_HEADERS || at + len > ip.len() || (nh == ROUTING && ip[at + 3] != 0) {
            return None;
        }
        nh = ip[at];
        at += len;
    }
    Some((at - ipv6::HEADER_LEN, nh))
}

/// Parses `pkt` into `c` (reused across packets, so that the candidate is written in place rather than built and
/// moved with `memcpy` per packet): how far the packet gets, its flow key, layout and segment fields.
#[inline(always)]
fn parse_candidate_into(pkt: &[u8], framing: Framing, tcp_on: bool, udp_on: bool, c: &mut Cand) -> Parsed {
    const STOPPED: Parsed = Parsed::Stopped { udp_barrier: true };
    c.key.l2_len = 0;
    c.key.ext_len = 0;
    // The IP version the layer-2 header announces (any, for TUN).
    let (l3, version) = match framing {
        Framing::Ip => (0, None),
        Framing::Ethernet => {
            let Ok(f) = ethernet::Frame::new_checked(pkt) else { return STOPPED };
            let version = match f.inner_ethertype() {
                ethernet::ETHERTYPE_IPV4 => 4,
                ethernet::ETHERTYPE_IPV6 => 6,
                _ => return STOPPED,
            };
            let hl = f.header_len();
            crate::small_copy::copy(&mut c.key.l2[..hl], &pkt[..hl]);
            // The key is compared whole: bytes a longer header left behind would tell equal flows apart.
            c.key.l2[hl..].fill(0);
            c.key.l2_len = hl as u8;
            (hl, Some(version))
        }
    };
    let ip = &pkt[l3..];
    let Some(&first) = ip.first() else { return STOPPED };
    if version.is_some_and(|v| v != first >> 4) {
        return STOPPED;
    }
    let (proto, l4, v6) = match first >> 4 {
        4 => {
            let Ok(p) = ipv4::Packet::new_checked(ip) else { return STOPPED };
            if p.header_len() != ipv4::MIN_HEADER_LEN || p.is_fragment() || !ipv4_header_sum_ok(ip) {
                return Parsed::Stopped { udp_barrier: p.protocol() != IPPROTO_TCP };
            }
            for (k, (&b, &m)) in c.key.ip.iter_mut().zip(ip.iter().zip(&IPV4_FLOW)) {
                *k = b & m;
            }
            c.key.ip[ipv4::MIN_HEADER_LEN..].fill(0);
            (p.protocol(), l3 + ipv4::MIN_HEADER_LEN, false)
        }
        6 => {
            let Ok(p) = ipv6::Packet::new_checked(ip) else { return STOPPED };
            let Some((ext_len, proto)) = ipv6_extension_headers(ip) else {
                return Parsed::Stopped { udp_barrier: p.next_header() != IPPROTO_TCP };
            };
            for (k, (&b, &m)) in c.key.ip.iter_mut().zip(ip.iter().zip(&IPV6_FLOW)) {
                *k = b & m;
            }
            c.key.ext_len = ext_len as u16;
            (proto, l3 + ipv6::HEADER_LEN + ext_len, true)
        }
        _ => return STOPPED,
    };
    if pkt.len() - l3 > MAX_PACKET_LEN {
        return Parsed::Stopped { udp_barrier: proto != IPPROTO_TCP };
    }
    let l4b = &pkt[l4..];
    let (hdr_len, udp) = match proto {
        IPPROTO_TCP if tcp_on => {
            let Ok(t) = tcp::Packet::new_checked(l4b) else { return Parsed::Stopped { udp_barrier: false } };
            c.key.ports = u32::from_be_bytes([l4b[0], l4b[1], l4b[2], l4b[3]]) & TCP_FLOW_WORD;
            (l4 + t.header_len(), false)
        }
        IPPROTO_UDP if udp_on => {
            if l4b.len() < udp::HEADER_LEN {
                return STOPPED;
            }
            c.key.ports = u32::from_be_bytes([l4b[0], l4b[1], l4b[2], l4b[3]]) & UDP_FLOW_WORD;
            (l4 + udp::HEADER_LEN, true)
        }
        _ => return Parsed::Stopped { udp_barrier: proto != IPPROTO_TCP },
    };
    c.layout = Layout { l3, l4, hdr_len, v6, udp };
    c.seg = SegmentFields::read(pkt, &c.layout);
    // A UDP datagram the IP layer (or its own length field) flags stops here (`udp_gro_receive` skips it and
    // touches no item); a TCP segment goes on to close its flow's item.
    if udp && !c.seg.sound {
        return STOPPED;
    }
    Parsed::Transport
}

fn packet<'a, B: AsRef<[u8]>>(bufs: &'a [B], lens: &[usize], i: usize, offset: usize) -> &'a [u8] {
    &bufs[i].as_ref()[offset..offset + lens[i]]
}

/// Copies `bufs[src][range]` to `bufs[dst][at..]` (`src != dst`, ranges checked by the caller).
fn copy_across<B: AsMut<[u8]> + AsRef<[u8]>>(
    bufs: &mut [B],
    src: usize,
    range: std::ops::Range<usize>,
    dst: usize,
    at: usize,
) {
    let n = range.len();
    if src < dst {
        let (a, b) = bufs.split_at_mut(dst);
        b[0].as_mut()[at..at + n].copy_from_slice(&a[src].as_ref()[range]);
    } else {
        let (a, b) = bufs.split_at_mut(src);
        a[dst].as_mut()[at..at + n].copy_from_slice(&b[0].as_ref()[range]);
    }
}

/// What a packet of a flow with an open item did to it ([`Gro::try_merge`]).
enum Attempt {
    Merged,
    /// It did not merge: the item is closed.
    Refused,
    /// The packet's own checksum failed: it passes through and the item stays open.
    BadPacket,
    /// The item's own checksum failed: it was never a real item (closed now), as if the flow had none.
    BadItem,
}
/// Reusable GRO engine: flow table and scratch space survive between batches.
#[derive(Debug, Clone)]
pub struct Gro {
    config: GroConfig,
    udp_max_segments: usize,
    items: Vec<Item>,
    slots: Vec<Slot>,
    /// Gather mode: members are chained (`next[i]`) instead of copied into the head's buffer.
    gather: bool,
    next: Vec<usize>,
    /// Try [`Gro::try_fast_append`] before parsing a packet (off only to compare the two paths in tests).
    fast_path: bool,
}

/// End of a gather chain.
const CHAIN_END: usize = usize::MAX;

/// The pieces of one coalesced packet in gather mode ([`Gro::pieces`]): `(buffer index, byte range)`.
#[derive(Debug, Clone)]
pub struct Pieces<'g> {
    first: Option<(usize, std::ops::Range<usize>)>,
    next: usize,
    chain: &'g [usize],
    lens: &'g [usize],
    offset: usize,
    hdr_len: usize,
}

impl Iterator for Pieces<'_> {
    type Item = (usize, std::ops::Range<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        let m = self.next;
        let len = *self.lens.get(m)?;
        self.next = self.chain.get(m).copied().unwrap_or(CHAIN_END);
        // A member has the head's header length (a merge requires it), so its payload follows that many bytes.
        let end = self.offset + len;
        Some((m, (self.offset + self.hdr_len).min(end)..end))
    }
}

impl Gro {
    /// A GRO engine; allocates nothing until the first batch.
    pub fn new(config: GroConfig) -> Self {
        Gro {
            config,
            udp_max_segments: DEFAULT_UDP_MAX_SEGMENTS,
            items: Vec::new(),
            slots: Vec::new(),
            gather: false,
            next: Vec::new(),
            fast_path: true,
        }
    }

    /// Turns the fast path for the next segment of a stream off or on (on by default). It changes no output,
    /// only the work per packet: tests and the fuzz target compare both.
    #[doc(hidden)]
    pub fn with_fast_path(mut self, on: bool) -> Self {
        self.fast_path = on;
        self
    }

    /// Gather mode: merged packets are not copied into the head's buffer; the head's headers are patched for the
    /// coalesced length and [`Gro::pieces`] lists what to write (header and head packet, then each member's
    /// payload), for a vectored write. Saves the copy, and buffers need not have room for 64 KiB.
    pub fn with_gather(mut self, on: bool) -> Self {
        self.gather = on;
        self
    }

    /// In gather mode, the pieces of written packet `head` (an index from `to_write`), in order, as
    /// `(buffer index, byte range)`: first the virtio header and the head's whole packet, then the payload of each
    /// merged member. In copy mode (or for an unmerged packet) only the first piece.
    pub fn pieces<'g>(&'g self, head: usize, lens: &'g [usize], offset: usize) -> Pieces<'g> {
        let vlen = self.config.vnet_hdr_len;
        let hdr_len = match self.slots.get(head) {
            Some(Slot::Head(k)) if self.gather => self.items[*k].layout.hdr_len,
            _ => 0,
        };
        let next = if hdr_len > 0 { self.next.get(head).copied().unwrap_or(CHAIN_END) } else { CHAIN_END };
        let first = lens.get(head).map(|&len| (head, offset.saturating_sub(vlen)..offset + len));
        Pieces { first, next, chain: &self.next, lens, offset, hdr_len }
    }

    /// Sets the cap on segments of a coalesced UDP packet (kernel `UDP_MAX_SEGMENTS`: 64, or 128 on newer
    /// kernels). Values below 1 are treated as 1 (no UDP merging).
    pub fn with_udp_max_segments(mut self, n: usize) -> Self {
        self.set_udp_max_segments(n);
        self
    }

    /// See [`Gro::with_udp_max_segments`].
    pub fn set_udp_max_segments(&mut self, n: usize) {
        self.udp_max_segments = n.max(1);
    }

    /// The UDP segment cap.
    pub fn udp_max_segments(&self) -> usize {
        self.udp_max_segments
    }

    /// The configuration.
    pub fn config(&self) -> &GroConfig {
        &self.config
    }

    /// Coalesces a batch. Packets are `bufs[i][offset .. offset + lens[i]]`; `offset >= vnet_hdr_len` and buffers
    /// should have room to grow to `offset + 65535` (a merge that does not fit a buffer is not made). Merged
    /// packets are appended into the flow head's buffer (`lens` updated). Every packet to write gets its virtio
    /// header in `bufs[i][offset - vnet_hdr_len .. offset]` (zeroed if unmerged, or `NEEDS_CSUM` for a markable
    /// packet with [`Checksums::Partial`]). `to_write` is cleared and then filled with the indices to write, in
    /// ascending order.
    ///
    /// `checksums`: what the caller vouches for (`true` for [`Checksums::Valid`]: segments split by us, or
    /// `DATA_VALID`; `false` for [`Checksums::Unverified`]).
    pub fn coalesce<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        checksums: impl Into<Checksums>,
        to_write: &mut Vec<usize>,
    ) -> GroStats {
        let checksums = checksums.into();
        let checksums_valid = checksums.trusted();
        to_write.clear();
        self.items.clear();
        self.slots.clear();
        self.next.clear();
        if self.gather {
            self.next.resize(bufs.len().min(lens.len()), CHAIN_END);
        }
        let n = bufs.len().min(lens.len());
        let vlen = self.config.vnet_hdr_len;
        let mut stats = GroStats { packets: n, ..GroStats::default() };
        let headers_ok = vlen >= VIRTIO_NET_HDR_LEN && offset >= vlen;
        let (tcp_on, udp_on) = (self.config.tcp && headers_ok, self.config.udp && headers_ok);
        let mut cand = Cand::EMPTY;
        for i in 0..n {
            self.slots.push(Slot::Pass);
            let buf_len = bufs[i].as_ref().len();
            if !headers_ok || !offset.checked_add(lens[i]).is_some_and(|e| e <= buf_len) {
                stats.malformed += 1;
                continue;
            }
            if self.fast_path && checksums_valid && self.try_fast_append(i, bufs, lens, offset) {
                stats.coalesced += 1;
                continue;
            }
            let pkt = packet(bufs, lens, i, offset);
            match parse_candidate_into(pkt, self.config.framing, tcp_on, udp_on, &mut cand) {
                Parsed::Transport => self.insert(i, &cand, bufs, lens, offset, checksums_valid, &mut stats),
                Parsed::Stopped { udp_barrier: true } => self.udp_barrier(pkt),
                Parsed::Stopped { udp_barrier: false } => {}
            }
        }
        for i in 0..n {
            let slot = self.slots[i];
            if slot == Slot::Merged {
                continue;
            }
            to_write.push(i);
            if !headers_ok || !offset.checked_add(lens[i]).is_some_and(|e| e <= bufs[i].as_ref().len()) {
                continue;
            }
            match slot {
                Slot::Head(k) if self.items[k].segs > 1 => {
                    let it = self.items[k];
                    if it.layout.udp {
                        stats.udp_super_packets += 1;
                    } else {
                        stats.tcp_super_packets += 1;
                    }
                    let len = if self.gather { it.vlen } else { lens[i] };
                    Self::finish_item(&it, bufs[i].as_mut(), offset, vlen, len);
                }
                _ => {
                    let (vh, pkt) = bufs[i].as_mut()[offset - vlen..offset + lens[i]].split_at_mut(vlen);
                    crate::partial::write_plain_header(vh, pkt, self.config.framing, checksums == Checksums::Partial);
                }
            }
        }
        stats.written = to_write.len();
        stats
    }

    /// A packet that could not merge, and is not TCP, between two UDP datagrams of the same addresses is a
    /// barrier for UDP: no later datagram may join one before it, or it would be written first (a fragmented
    /// datagram overtaken by the next one; UDP keeps no sequence to restore the order). TCP merges across it as
    /// the kernel's GRO does (the receiver reorders by sequence number).
    fn udp_barrier(&mut self, pkt: &[u8]) {
        if let Some((addrs, v6)) = address_pair(pkt, self.config.framing) {
            for it in self.items.iter_mut() {
                if it.layout.udp && it.layout.v6 == v6 && it.key.addresses(v6) == addrs {
                    it.closed = true;
                }
            }
        }
    }

    /// Whether item `k`, grown to `new_len` bytes, stays within [`MAX_PACKET_LEN`] of IP packet and (in copy
    /// mode, where the payload is appended to the head's buffer) within its buffer.
    #[inline(always)]
    fn fits<B: AsRef<[u8]>>(&self, k: usize, new_len: usize, bufs: &[B], offset: usize) -> bool {
        let it = &self.items[k];
        // Gather mode writes only headers into the head's buffer, so its size does not limit the merge.
        new_len - it.layout.l3 <= MAX_PACKET_LEN && (self.gather || bufs[it.buf].as_ref().len() >= offset + new_len)
    }

    /// The coalesced length of item `k` with `payload_len` more bytes.
    #[inline(always)]
    fn grown_len(&self, k: usize, lens: &[usize], payload_len: usize) -> usize {
        let it = &self.items[k];
        (if self.gather { it.vlen } else { lens[it.buf] }) + payload_len
    }

    /// The fast path for the common case, the next segment of the flow the newest item holds: a packet whose
    /// headers match the head's ([`headers_match`], which compares every bit that names the flow) belongs to that
    /// item's flow, whose open item it is; the segment rules ([`Item::accepts`]) then decide as they do on the
    /// full path, without the packet being parsed into a candidate or its flow looked up. Anything else (a
    /// changed window, another flow, a gap) returns `false` and takes the full path, which reaches the same
    /// verdict. Trusted checksums only.
    #[inline]
    fn try_fast_append<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        i: usize,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
    ) -> bool {
        let Some(k) = self.items.len().checked_sub(1) else {
            return false;
        };
        let it = &self.items[k];
        if it.closed || !it.verified {
            return false;
        }
        let l = it.layout;
        let pkt = packet(bufs, lens, i, offset);
        let head = &bufs[it.buf].as_ref()[offset..offset + l.hdr_len];
        // The full path stops a packet whose IPv4 header checksum fails before the transport layer.
        if !headers_match(head, pkt, &l) || (!l.v6 && !ipv4_header_sum_ok(&pkt[l.l3..])) {
            return false;
        }
        let seg = SegmentFields::read(pkt, &l);
        let Some(id_mode) = it.accepts(&seg, df_of(pkt, &l), self.udp_max_segments) else {
            return false;
        };
        let new_len = self.grown_len(k, lens, seg.payload_len);
        if !self.fits(k, new_len, bufs, offset) {
            return false;
        }
        self.append(k, i, l.hdr_len, seg.payload_len, new_len, bufs, lens, offset);
        self.count_merge(k, seg.payload_len, seg.flags, id_mode);
        true
    }

    /// The open item of packet `i`'s flow (parsed as `c`): the newest open item with its flow key whose IPv6
    /// extension headers, if any, are the packet's byte for byte.
    #[inline]
    fn find_open<B: AsRef<[u8]>>(
        &self,
        hash: u64,
        c: &Cand,
        bufs: &[B],
        lens: &[usize],
        i: usize,
        offset: usize,
    ) -> Option<usize> {
        (0..self.items.len()).rev().find(|&k| {
            let it = &self.items[k];
            !it.closed && it.hash == hash && it.key == c.key && {
                let ext = c.layout.l3 + ipv6::HEADER_LEN..c.layout.l4;
                c.key.ext_len == 0
                    || packet(bufs, lens, it.buf, offset)[ext.clone()] == packet(bufs, lens, i, offset)[ext]
            }
        })
    }

    /// Merges packet `i` (parsed as `c`) into its flow's open item, or closes that item and makes the packet the
    /// head of a new one (if it may be held), or lets it pass alone.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn insert<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        i: usize,
        c: &Cand,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        checksums_valid: bool,
        stats: &mut GroStats,
    ) {
        let hash = c.key.hash();
        let mut pkt_ok: Option<bool> = if checksums_valid { Some(true) } else { None };
        if let Some(k) = self.find_open(hash, c, bufs, lens, i, offset) {
            match self.try_merge(k, i, c, bufs, lens, offset, &mut pkt_ok, stats) {
                Attempt::Merged | Attempt::BadPacket => return,
                Attempt::Refused | Attempt::BadItem => {}
            }
        }
        if !c.seg.holdable() {
            return;
        }
        self.slots[i] = Slot::Head(self.items.len());
        self.items.push(Item::first(c, hash, i, lens[i], pkt_ok == Some(true)));
    }

    /// Packet `i` of the flow of open item `k`: merged, or the item closed. Checksums are verified only here, as
    /// a packet meets an item: the item's (if not yet verified) and the packet's (cached in `pkt_ok`).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn try_merge<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        k: usize,
        i: usize,
        c: &Cand,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
        pkt_ok: &mut Option<bool>,
        stats: &mut GroStats,
    ) -> Attempt {
        if !self.items[k].verified {
            let it = &self.items[k];
            let l = it.layout;
            let head = packet(bufs, lens, it.buf, offset);
            if !l4_checksum_ok(&head[l.l4..], addr_sum(head, &l), l.udp, l.v6) {
                self.items[k].closed = true;
                stats.bad_checksum += 1;
                return Attempt::BadItem;
            }
            self.items[k].verified = true;
        }
        let l = c.layout;
        if !*pkt_ok.get_or_insert_with(|| {
            let pkt = packet(bufs, lens, i, offset);
            l4_checksum_ok(&pkt[l.l4..], addr_sum(pkt, &l), l.udp, l.v6)
        }) {
            stats.bad_checksum += 1;
            return Attempt::BadPacket;
        }
        let it = &self.items[k];
        let pkt = packet(bufs, lens, i, offset);
        let head = &bufs[it.buf].as_ref()[offset..offset + it.layout.hdr_len];
        let verdict = if headers_match(head, pkt, &it.layout) {
            it.accepts(&c.seg, df_of(pkt, &l), self.udp_max_segments)
        } else {
            None
        };
        let new_len = self.grown_len(k, lens, c.seg.payload_len);
        match verdict.filter(|_| self.fits(k, new_len, bufs, offset)) {
            Some(id_mode) => {
                self.append(k, i, l.hdr_len, c.seg.payload_len, new_len, bufs, lens, offset);
                self.count_merge(k, c.seg.payload_len, c.seg.flags, id_mode);
                stats.coalesced += 1;
                Attempt::Merged
            }
            None => {
                self.items[k].closed = true;
                Attempt::Refused
            }
        }
    }

    #[inline]
    fn count_merge(&mut self, k: usize, payload_len: usize, flags: u8, id_mode: IdMode) {
        self.items[k].merged(payload_len, flags, id_mode, self.udp_max_segments);
    }

    /// Packet `i` (header length, payload length) follows item `k`: its payload goes after the item's (copied, or
    /// chained in gather mode).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn append<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        k: usize,
        i: usize,
        hdr_len: usize,
        payload_len: usize,
        new_len: usize,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
    ) {
        let it = &mut self.items[k];
        if self.gather {
            self.next[it.last] = i;
            it.last = i;
            it.vlen = new_len;
        } else {
            let end = offset + lens[it.buf];
            copy_across(bufs, i, offset + hdr_len..offset + lens[i], it.buf, end);
            lens[it.buf] += payload_len;
        }
        self.slots[i] = Slot::Merged;
    }

    /// Rewrites the headers of a merged packet (its fields of role `PerSegment`) and writes its virtio header.
    fn finish_item(it: &Item, buf: &mut [u8], offset: usize, vlen: usize, len: usize) {
        let l = &it.layout;
        // Only header bytes are touched: in gather mode the payload of the coalesced packet is not in `buf`.
        let (vh, rest) = buf[offset - vlen..offset + l.hdr_len].split_at_mut(vlen);
        let l4_len = len - l.l4;
        let pseudo = checksum::fold(checksum::add(addr_sum(rest, l), l4_len as u32));
        if l.v6 {
            ipv6::Packet::new_unchecked(&mut rest[l.l3..]).set_payload_len((len - l.l3 - ipv6::HEADER_LEN) as u16);
        } else {
            let mut ip = ipv4::Packet::new_unchecked(&mut rest[l.l3..l.l4]);
            ip.set_total_len((len - l.l3) as u16);
            ip.fill_checksum();
        }
        let (gso_type, csum_offset) = if l.udp {
            let mut u = udp::Packet::new_unchecked(&mut rest[l.l4..]);
            u.set_len(l4_len as u16);
            u.set_checksum(pseudo);
            (gso::UDP_L4, udp::CHECKSUM_OFFSET)
        } else {
            let mut t = tcp::Packet::new_unchecked(&mut rest[l.l4..]);
            let f = t.flags();
            t.set_flags(f | it.or_flags);
            t.set_checksum(pseudo);
            // No ECN bit: a CWR segment is never part of a merged packet.
            (if l.v6 { gso::TCPV6 } else { gso::TCPV4 }, tcp::CHECKSUM_OFFSET)
        };
        VirtioNetHdrRepr {
            flags: flags::NEEDS_CSUM,
            gso_type,
            hdr_len: l.hdr_len as u16,
            gso_size: it.gso_size as u16,
            csum_start: l.l4 as u16,
            csum_offset: csum_offset as u16,
        }
        .emit(vh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{payload, Spec};

    fn cand(spec: &Spec, len: usize) -> Cand {
        parse_candidate(&spec.build(&payload(len, 0)), spec.framing, true, true).expect("candidate")
    }

    #[test]
    fn candidates() {
        assert!(parse_candidate(&Spec::tcp4().build(&[1]), Framing::Ip, true, true).is_some());
        assert!(parse_candidate(&Spec::tcp4().build(&[]), Framing::Ip, true, true).is_none());
        assert!(parse_candidate(&Spec::tcp4().build(&[1]), Framing::Ip, false, true).is_none());
        assert!(parse_candidate(&Spec::udp6().build(&[1]), Framing::Ip, true, false).is_none());
        assert!(parse_candidate(&Spec::udp6().build(&[1]), Framing::Ethernet, true, true).is_none());
        let mut p = Spec::tcp4().build(&[1, 2]);
        p.push(0); // IP length no longer equals the buffer length
        assert!(parse_candidate(&p, Framing::Ip, true, true).is_none());
        let mut p = Spec::tcp4().build(&[1, 2]);
        p[8] ^= 1; // TTL changed without fixing the header checksum
        assert!(parse_candidate(&p, Framing::Ip, true, true).is_none());
        // IPv6 with destination options: the transport header is found behind them.
        let c = cand(&Spec { v6_dest_opts: 2, ..Spec::tcp6() }, 10);
        assert_eq!((c.layout.l4, c.key.ext_len), (40 + 16, 16));
    }

    #[test]
    fn flow_keys_hash_apart() {
        let a = cand(&Spec::tcp4(), 10);
        let mut s = Spec::tcp4();
        s.dport += 1;
        let b = cand(&s, 10);
        assert_ne!(a.key, b.key);
        assert_ne!(a.key.hash(), b.key.hash());
        assert_eq!(a.key.hash(), cand(&Spec::tcp4(), 20).key.hash());
        // Fields of role `Same` are not part of the key.
        assert_eq!(a.key, cand(&Spec { ttl: 3, tos: 2, window: 9, ..Spec::tcp4() }, 10).key);
        assert_ne!(cand(&Spec::tcp6(), 10).key, cand(&Spec { flow_label: 1, ..Spec::tcp6() }, 10).key);
    }

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

    #[test]
    fn ipv4_id_rule_modes() {
        use IdMode::*;
        assert_eq!(ipv4_id_rule(5, 1, 6, true, Unknown), Some(Incrementing));
        assert_eq!(ipv4_id_rule(5, 1, 5, true, Unknown), Some(Fixed));
        assert_eq!(ipv4_id_rule(5, 1, 5, false, Unknown), None, "fixed needs DF");
        assert_eq!(ipv4_id_rule(5, 1, 7, true, Unknown), None);
        assert_eq!(ipv4_id_rule(5, 2, 7, true, Fixed), None);
        assert_eq!(ipv4_id_rule(5, 2, 5, true, Fixed), Some(Fixed));
        assert_eq!(ipv4_id_rule(5, 2, 5, true, Incrementing), None);
        assert_eq!(ipv4_id_rule(5, 2, 7, false, Incrementing), Some(Incrementing));
        assert_eq!(ipv4_id_rule(0xffff, 1, 0, false, Unknown), Some(Incrementing));
    }

    #[test]
    fn extension_header_walk() {
        let ip = |ext: &[u8], first: u8| {
            let mut p = Spec::tcp6().build(&[1]);
            p[6] = first;
            p.splice(40..40, ext.iter().copied());
            p
        };
        use ipv6::next_header::{DEST_OPTS, FRAGMENT, HOP_BY_HOP, ROUTING};
        let opts = [DEST_OPTS, 0, 1, 4, 0, 0, 0, 0, IPPROTO_TCP, 0, 1, 4, 0, 0, 0, 0];
        assert_eq!(ipv6_extension_headers(&ip(&opts, HOP_BY_HOP)), Some((16, IPPROTO_TCP)));
        let routing_done = [IPPROTO_TCP, 0, 4, 0, 0, 0, 0, 0];
        assert_eq!(ipv6_extension_headers(&ip(&routing_done, ROUTING)), Some((8, IPPROTO_TCP)));
        let routing_left = [IPPROTO_TCP, 2, 2, 1, 0, 0, 0, 0];
        assert_eq!(ipv6_extension_headers(&ip(&[&routing_left[..], &[0; 16]].concat(), ROUTING)), None);
        assert_eq!(ipv6_extension_headers(&ip(&[IPPROTO_TCP, 0, 0, 0, 0, 0, 0, 0], FRAGMENT)), Some((0, FRAGMENT)));
        assert_eq!(ipv6_extension_headers(&ip(&[IPPROTO_TCP, 9], DEST_OPTS)[..50]), None, "cut short");
    }

    #[test]
    fn tables_are_reused_not_reallocated() {
        let mut g = Gro::new(GroConfig::default());
        let mut s = Spec::tcp4();
        let pkts: Vec<Vec<u8>> = (0..32)
            .map(|_| {
                let p = s.build(&payload(100, 1));
                s = s.next_seg(100);
                p
            })
            .collect();
        let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 10 + 65535]; 32];
        let mut lens = vec![0usize; 32];
        let mut tw = Vec::new();
        let mut caps = Vec::new();
        for _ in 0..3 {
            for (i, p) in pkts.iter().enumerate() {
                bufs[i][10..10 + p.len()].copy_from_slice(p);
                lens[i] = p.len();
            }
            let st = g.coalesce(&mut bufs, &mut lens, 10, false, &mut tw);
            assert_eq!((st.written, st.coalesced, st.tcp_super_packets), (1, 31, 1));
            caps.push((g.items.capacity(), g.slots.capacity(), g.items.as_ptr(), g.slots.as_ptr()));
        }
        assert!(caps.windows(2).all(|w| w[0] == w[1]), "{caps:?}");
    }
}
