//! GRO: coalesce a batch of TCP or UDP packets per flow into super-packets for one `write()` each to a TUN/TAP
//! device with a virtio_net_hdr.
//!
//! The merge decision is the kernel's (Linux 6.18: `dev_gro_receive`, `inet_gro_receive`, `ipv6_gro_receive`,
//! `tcp_gro_receive`, `udp_gro_receive_segment`; see `docs/OFFLOAD.md`), applied to the batch in order. Each part
//! of it is written once, in one layer of this module (each layer uses only those listed before it, but for an
//! item's first packet, `Item::first` and `FlowRun::start`, which is a parsed candidate):
//!
//! - **Which header bits must agree** (`rules`): the field tables (`IPV4_FIELDS`, `IPV6_FIELDS`, `TCP_FIELDS`,
//!   `UDP_FIELDS`) give every bit of the fixed headers a role: it names the flow, it must equal the head's, or it
//!   changes from segment to segment. The flow key (`FlowKey`), the one comparison both paths make
//!   (`headers_match`) and the tunnel coalescer's ([`crate::udp_tunnel::coalesce_tunnel`]) are derived from them.
//!   Layer-2 headers and IPv6 extension headers name the flow byte for byte; TCP options must be equal byte for
//!   byte.
//! - **The rules of the fields that change per segment** (`segment`: lengths, the IPv4 ID, the sequence number,
//!   the size, CWR, the UDP cap): `SegmentFields::read` reads them, and the IPv4 ID rule (`ipv4_id_rule`).
//! - **One flow** (`flow`, above the parser and the segment rules): `Item::accepts` judges a segment by those
//!   rules, `Item::merged` counts a merge, for both paths; `FlowRun` applies them to one flow for the tunnel
//!   coalescer.
//! - **Which packets may wait for more** (the kernel's held packet): `SegmentFields::holdable`.
//! - **Checksums** (`segment`): `l4_checksum_ok`, shared with the tunnel coalescer.
//! - **How far a packet gets** (`candidate`: it stops before the transport layer, reaches it flagged, or is a
//!   candidate): `parse_candidate_into`.
//! - **The batch** (`coalescer`): [`Gro`] finds each candidate's flow in its flow table, merges or holds it, and
//!   writes the merged packets' headers.
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

mod candidate;
mod coalescer;
pub(crate) mod flow;
pub(crate) mod rules;
pub(crate) mod segment;

pub use coalescer::{Gro, Pieces};

use crate::virtio_net::VIRTIO_NET_HDR_LEN;
use crate::Framing;

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
