//! Pure packet logic for turbotun: zero-copy header views, Internet checksums, GSO split and GRO coalesce for
//! TUN/TAP traffic that carries a `virtio_net_hdr`.
//!
//! # Guarantees
//!
//! * **No unsafe code** (`#![forbid(unsafe_code)]`); the only dependency is `multiversion` (runtime CPU-feature
//!   dispatch of the checksum loops without `unsafe` in this crate).
//! * **No panics on any input.** Every view (`Packet::new_checked`), [`virtio_net::VirtioNetHdrRepr::parse`],
//!   [`gso::Splitter::new`] and [`gro::Gro::coalesce`] validates offsets before use; malformed packets produce a
//!   [`WireError`] / [`GsoError`] (or, for GRO, pass through unmerged). This is exercised by property tests and the
//!   cargo-fuzz targets under `fuzz/`. Views built with `new_unchecked` may panic if the buffer is too short.
//! * **No allocation per packet.** [`gso::Splitter`] writes into caller buffers (or returns a
//!   [`gso::SegmentView`] with an inline header array); [`gro::Gro`] keeps its flow table and scratch vectors
//!   between batches and only grows them when a batch is larger than any before (warm-up).
//! * No I/O: this crate never talks to the kernel.
//!
//! # Supported
//!
//! * Header views: Ethernet (with VLAN tags), ARP, IPv4, IPv6, TCP, UDP, ICMP, ICMPv6 (with neighbour
//!   discovery).
//! * ICMP errors: destination unreachable for IPv4 and IPv6 about a packet that cannot be delivered, built whole
//!   ([`icmp_error`]).
//! * virtio_net_hdr of 10, 12 (v1, `num_buffers`) and 20 bytes (hash report), little-endian.
//! * Framing: raw IP ([`Framing::Ip`], TUN with `IFF_NO_PI`) and Ethernet with up to two 802.1Q/802.1ad tags
//!   ([`Framing::Ethernet`], TAP).
//! * GSO split: `GSO_NONE` (+ `NEEDS_CSUM` completion), `TCPV4`, `TCPV6` (with the `ECN` bit), `UDP_L4` (USO) over
//!   IPv4 and IPv6 (IPv6 extension headers hop-by-hop, routing, destination options are walked; fragments are
//!   rejected). `hdr_len` from the header is never trusted; it is recomputed from the packet.
//! * GRO coalesce: TCP and UDP, IPv4 (without options) and IPv6 (through hop-by-hop, routing and
//!   destination-options headers that are the same in every segment), following the decision of Linux 6.18 with
//!   four documented differences (see [`gro`] and `OFFLOAD.md` in the project).
//! * Checksums: an RFC 1071 sum whose loop is compiled for AVX-512BW, AVX2 and the baseline and picked at run time
//!   (see [`checksum`]), a fused copy + sum for GSO segments, pseudo-headers, RFC 1624 incremental update and
//!   completion of a partial checksum.
//!
//! # Not supported
//!
//! * UFO (`GSO_UDP`, type 3), IPv4 options, IPv6 fragment headers, AH and ESP on the GRO path (such packets pass
//!   unmerged), IPv6 jumbograms.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arp;
mod batch;
mod bytes;
pub mod checksum;
pub mod ecn;
mod error;
pub mod ethernet;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod gro;
pub mod gso;
pub mod icmp;
pub mod icmp_error;
pub mod icmpv6;
pub mod ipv4;
pub mod ipv6;
pub mod partial;
pub mod scatter;
mod small_copy;
pub mod tcp;
pub mod udp;
pub mod udp_tunnel;
pub mod virtio_net;

pub use batch::Batch;
pub use error::{GsoError, WireError};
pub use gro::{Checksums, Gro, GroConfig, GroStats, Pieces};
pub use gso::{SegmentView, SplitProgress, Splitter};
pub use udp_tunnel::TunnelSplitter;
pub use virtio_net::{TunnelOffsets, VirtioNetHdr, VirtioNetHdrRepr, VIRTIO_NET_HDR_LEN};

/// Layer-2 framing of the packets handed to [`gso`] and [`gro`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Framing {
    /// The packet starts at the IP header (TUN with `IFF_NO_PI`).
    #[default]
    Ip,
    /// The packet starts at an Ethernet header, optionally with 802.1Q/802.1ad tags (TAP).
    Ethernet,
}

/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// Locates the IP header after the layer-2 framing: returns `(l3_offset, ip_version)`.
///
/// For [`Framing::Ethernet`] the EtherType (after up to two VLAN tags) must be IPv4 or IPv6.
pub fn locate_ip(packet: &[u8], framing: Framing) -> Result<(usize, u8), WireError> {
    let off = match framing {
        Framing::Ip => 0,
        Framing::Ethernet => {
            let frame = ethernet::Frame::new_checked(packet)?;
            match frame.inner_ethertype() {
                ethernet::ETHERTYPE_IPV4 | ethernet::ETHERTYPE_IPV6 => frame.header_len(),
                other => return Err(WireError::UnsupportedEtherType(other)),
            }
        }
    };
    let version = match packet.get(off) {
        Some(b) => b >> 4,
        None => return Err(WireError::Truncated { what: "IP header", need: off + 1, have: packet.len() }),
    };
    match version {
        4 | 6 => Ok((off, version)),
        v => Err(WireError::BadIpVersion(v)),
    }
}
