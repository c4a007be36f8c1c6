//! Error types of the crate.

use std::fmt;

/// A malformed or unsupported header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is shorter than the header (or the field that was asked for) requires.
    Truncated {
        /// Which header or field.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The IP version nibble is neither 4 nor 6 (or not the one expected).
    BadIpVersion(u8),
    /// A header length field holds an impossible value.
    BadHeaderLen {
        /// Which header.
        what: &'static str,
        /// The length in bytes it claims.
        len: usize,
    },
    /// A length field disagrees with the buffer.
    BadLength {
        /// Which field.
        what: &'static str,
        /// The value of the field.
        field: usize,
        /// The length of the buffer.
        actual: usize,
    },
    /// The EtherType (after VLAN tags) is not IPv4 or IPv6.
    UnsupportedEtherType(u16),
    /// More VLAN tags than supported (2).
    TooManyVlanTags,
    /// The IPv6 extension-header chain is longer than supported.
    ExtHeaderChainTooLong,
    /// An IPv6 routing header with segments left whose type does not say where the final destination is (the
    /// transport checksum's pseudo-header needs it).
    UnknownFinalDestination {
        /// The routing type.
        routing_type: u8,
    },
    /// A checksum range lies beyond the packet.
    ChecksumOutOfRange {
        /// `csum_start`.
        start: usize,
        /// `csum_offset`.
        offset: usize,
        /// Packet length.
        len: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated { what, need, have } => {
                write!(f, "{what} truncated: need {need} bytes, have {have}")
            }
            WireError::BadIpVersion(v) => write!(f, "IP version {v} is neither 4 nor 6"),
            WireError::BadHeaderLen { what, len } => write!(f, "{what} header length {len} is invalid"),
            WireError::BadLength { what, field, actual } => {
                write!(f, "{what} is {field} but the buffer holds {actual} bytes")
            }
            WireError::UnsupportedEtherType(t) => write!(f, "EtherType {t:#06x} is neither IPv4 nor IPv6"),
            WireError::TooManyVlanTags => write!(f, "more than 2 VLAN tags"),
            WireError::ExtHeaderChainTooLong => write!(f, "IPv6 extension header chain too long"),
            WireError::UnknownFinalDestination { routing_type } => write!(
                f,
                "IPv6 routing header of type {routing_type} with segments left: its final destination (for the \
                 checksum) cannot be read"
            ),
            WireError::ChecksumOutOfRange { start, offset, len } => {
                write!(f, "checksum at csum_start {start} + csum_offset {offset} + 2 lies beyond packet length {len}")
            }
        }
    }
}

impl std::error::Error for WireError {}

/// Why a super-packet cannot be split (or a segment cannot be produced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GsoError {
    /// A header of the packet is malformed.
    Wire(WireError),
    /// The virtio gso_type is not NONE, TCPV4, TCPV6 or UDP_L4 (UFO, type 3, is not supported).
    UnsupportedGsoType(u8),
    /// The gso_type does not match the IP version of the packet (e.g. TCPV4 on an IPv6 packet).
    GsoTypeMismatch {
        /// gso_type of the virtio header (without the ECN bit).
        gso_type: u8,
        /// IP version found in the packet.
        ip_version: u8,
    },
    /// The transport protocol does not match the gso_type.
    ProtocolMismatch {
        /// gso_type of the virtio header.
        gso_type: u8,
        /// IP protocol / next header found.
        protocol: u8,
    },
    /// `csum_start` lies beyond the packet.
    CsumStartBeyond {
        /// `csum_start`.
        csum_start: usize,
        /// Packet length.
        len: usize,
    },
    /// `csum_start` does not point at the transport header found by parsing.
    CsumStartMismatch {
        /// `csum_start`.
        csum_start: usize,
        /// Offset of the transport header.
        l4_offset: usize,
    },
    /// `csum_start + csum_offset + 2` lies beyond the headers, or the offset is wrong for the protocol.
    BadCsumOffset {
        /// `csum_start`.
        csum_start: usize,
        /// `csum_offset`.
        csum_offset: usize,
        /// Recomputed header length (or packet length for GSO_NONE).
        limit: usize,
    },
    /// gso_size is 0 on a GSO packet.
    ZeroGsoSize,
    /// The IP packet is a fragment; fragments cannot be segmented.
    Fragment,
    /// Headers are longer than [`crate::gso::MAX_HEADER_LEN`].
    HeaderTooLarge {
        /// Header length.
        len: usize,
        /// Supported maximum.
        max: usize,
    },
    /// A segment index at or beyond the segment count.
    IndexOutOfRange {
        /// Requested index.
        index: usize,
        /// Number of segments.
        count: usize,
    },
    /// The splitter was built from the headers alone ([`crate::gso::Splitter::from_head`]) and holds no payload.
    HeadOnly,
    /// The output buffer cannot hold the segment.
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A UDP-tunnel super-packet whose tunnel fields or outer headers cannot be used; the text says which.
    BadTunnel(&'static str),
    /// A UDP super-packet (`UDP_L4`) without `NEEDS_CSUM`: its segments' checksums cannot be filled in.
    MissingPartialChecksum {
        /// gso_type of the virtio header.
        gso_type: u8,
    },
}

impl From<WireError> for GsoError {
    fn from(e: WireError) -> Self {
        GsoError::Wire(e)
    }
}

impl fmt::Display for GsoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            GsoError::Wire(e) => write!(f, "malformed super-packet: {e}"),
            GsoError::HeadOnly => write!(f, "this splitter holds only the headers: give each segment's payload"),
            GsoError::UnsupportedGsoType(t) => {
                write!(f, "virtio gso_type {t:#04x} unsupported (only NONE, TCPV4, TCPV6, UDP_L4)")
            }
            GsoError::GsoTypeMismatch { gso_type, ip_version } => {
                write!(f, "virtio gso_type {gso_type} does not fit an IPv{ip_version} packet")
            }
            GsoError::ProtocolMismatch { gso_type, protocol } => {
                write!(f, "virtio gso_type {gso_type} does not fit IP protocol {protocol}")
            }
            GsoError::CsumStartBeyond { csum_start, len } => {
                write!(f, "virtio csum_start {csum_start} beyond packet length {len}")
            }
            GsoError::CsumStartMismatch { csum_start, l4_offset } => write!(
                f,
                "virtio csum_start {csum_start} does not point at the transport header at offset {l4_offset}"
            ),
            GsoError::BadCsumOffset { csum_start, csum_offset, limit } => write!(
                f,
                "virtio csum_start {csum_start} + csum_offset {csum_offset} + 2 does not fit within {limit} bytes of headers"
            ),
            GsoError::ZeroGsoSize => write!(f, "virtio gso_size is 0 on a GSO packet"),
            GsoError::Fragment => write!(f, "cannot segment an IP fragment"),
            GsoError::HeaderTooLarge { len, max } => {
                write!(f, "headers of {len} bytes exceed the supported {max}")
            }
            GsoError::IndexOutOfRange { index, count } => {
                write!(f, "segment index {index} out of range (packet has {count} segments)")
            }
            GsoError::BufferTooSmall { need, have } => {
                write!(f, "output buffer of {have} bytes cannot hold a {need}-byte segment")
            }
            GsoError::BadTunnel(why) => write!(f, "UDP tunnel super-packet: {why}"),
            GsoError::MissingPartialChecksum { gso_type } => {
                write!(f, "virtio gso_type {gso_type:#04x} without NEEDS_CSUM: the segments' checksums cannot be filled in")
            }
        }
    }
}

impl std::error::Error for GsoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GsoError::Wire(e) => Some(e),
            _ => None,
        }
    }
}
