//! `struct virtio_net_hdr` (virtio spec 5.1.6), the header the kernel's tun driver puts in front of every packet
//! with `IFF_VNET_HDR`. All multi-byte fields are little-endian (modern virtio / `TUNSETVNETLE`).

use crate::{GsoError, WireError};

/// Size of the legacy header (`virtio_net_hdr`).
pub const VIRTIO_NET_HDR_LEN: usize = 10;
/// Size of `virtio_net_hdr_v1` (with `num_buffers`).
pub const VIRTIO_NET_HDR_V1_LEN: usize = 12;
/// Size of `virtio_net_hdr_v1_hash` (with the hash report).
pub const VIRTIO_NET_HDR_V1_HASH_LEN: usize = 20;
/// Size of `virtio_net_hdr_v1_hash_tunnel` (Linux 6.17+): the hash header followed by the outer transport and
/// inner network header offsets of a UDP-tunnel super-packet.
pub const VIRTIO_NET_HDR_V1_HASH_TUNNEL_LEN: usize = 24;

/// Bit numbers of the virtio-net feature bits a guest acknowledges (virtio 1.x, `include/uapi/linux/virtio_net.h`):
/// feature `n` is `1 << n` of the 128-bit feature word.
pub mod features {
    /// The device takes packets with partial checksums.
    pub const CSUM: u32 = 0;
    /// The guest takes packets with partial checksums: needed for every `GUEST_*` offload below.
    pub const GUEST_CSUM: u32 = 1;
    /// The guest takes TSO super-packets over IPv4.
    pub const GUEST_TSO4: u32 = 7;
    /// The guest takes TSO super-packets over IPv6.
    pub const GUEST_TSO6: u32 = 8;
    /// The guest takes TSO super-packets with CWR set (the ECN bit of `gso_type`).
    pub const GUEST_ECN: u32 = 9;
    /// The guest takes UFO super-packets.
    pub const GUEST_UFO: u32 = 10;
    /// The device takes TSO super-packets over IPv4.
    pub const HOST_TSO4: u32 = 11;
    /// The device takes TSO super-packets over IPv6.
    pub const HOST_TSO6: u32 = 12;
    /// The device takes TSO super-packets with CWR set.
    pub const HOST_ECN: u32 = 13;
    /// The device takes UFO super-packets.
    pub const HOST_UFO: u32 = 14;
    /// Mergeable receive buffers (the 12-byte header's `num_buffers`).
    pub const MRG_RXBUF: u32 = 15;
    /// More than one queue pair (the front end's control queue chooses how many are used).
    pub const MQ: u32 = 22;
    /// The guest takes USO super-packets over IPv4.
    pub const GUEST_USO4: u32 = 54;
    /// The guest takes USO super-packets over IPv6.
    pub const GUEST_USO6: u32 = 55;
    /// The device takes USO super-packets.
    pub const HOST_USO: u32 = 56;
    /// The guest takes TCP/UDP super-packets inside a UDP tunnel (24-byte header with the tunnel offsets).
    pub const GUEST_UDP_TUNNEL_GSO: u32 = 65;
    /// ... with the outer UDP checksum left to it.
    pub const GUEST_UDP_TUNNEL_GSO_CSUM: u32 = 66;
    /// The device takes UDP-tunnel super-packets.
    pub const HOST_UDP_TUNNEL_GSO: u32 = 67;
    /// ... with the outer UDP checksum left partial.
    pub const HOST_UDP_TUNNEL_GSO_CSUM: u32 = 68;

    /// The feature word with bit `n` set.
    pub const fn bit(n: u32) -> u128 {
        1u128 << n
    }
}

/// Values of the `flags` field.
pub mod flags {
    /// The checksum from `csum_start`, stored at `csum_start + csum_offset`, must be completed.
    pub const NEEDS_CSUM: u8 = 1;
    /// The checksum has been validated.
    pub const DATA_VALID: u8 = 2;
    /// RSC info (not used by tun).
    pub const RSC_INFO: u8 = 4;
    /// UDP-tunnel super-packet: the outer UDP checksum is to be computed for every segment (without it, the
    /// segments' outer UDP checksum is 0).
    pub const UDP_TUNNEL_CSUM: u8 = 8;
}

/// Values of the `gso_type` field.
pub mod gso {
    /// Not a GSO packet.
    pub const NONE: u8 = 0;
    /// TCP over IPv4 (TSO).
    pub const TCPV4: u8 = 1;
    /// UDP fragmentation offload (UFO; not supported by this crate).
    pub const UDP: u8 = 3;
    /// TCP over IPv6 (TSO).
    pub const TCPV6: u8 = 4;
    /// UDP segmentation offload (USO), IPv4 or IPv6.
    pub const UDP_L4: u8 = 5;
    /// Flag (Linux 6.17+): the super-packet is inside a UDP tunnel over IPv4; the rest of `gso_type` describes
    /// the inner packet (`TCPV4`, `TCPV6` or `UDP_L4`).
    pub const UDP_TUNNEL_IPV4: u8 = 0x20;
    /// Flag (Linux 6.17+): the same over an outer IPv6 header.
    pub const UDP_TUNNEL_IPV6: u8 = 0x40;
    /// Both tunnel flags.
    pub const UDP_TUNNEL: u8 = UDP_TUNNEL_IPV4 | UDP_TUNNEL_IPV6;
    /// Flag: the TCP stream uses ECN, CWR may be set on the first segment.
    pub const ECN: u8 = 0x80;
}

/// Byte ranges of the fields.
mod field {
    #![allow(missing_docs)]
    use std::ops::Range;
    pub const FLAGS: usize = 0;
    pub const GSO_TYPE: usize = 1;
    pub const HDR_LEN: Range<usize> = 2..4;
    pub const GSO_SIZE: Range<usize> = 4..6;
    pub const CSUM_START: Range<usize> = 6..8;
    pub const CSUM_OFFSET: Range<usize> = 8..10;
    pub const NUM_BUFFERS: Range<usize> = 10..12;
    pub const HASH_VALUE: Range<usize> = 12..16;
    pub const HASH_REPORT: Range<usize> = 16..18;
    pub const OUTER_TH_OFFSET: Range<usize> = 20..22;
    pub const INNER_NH_OFFSET: Range<usize> = 22..24;
}

fn le16(b: &[u8], r: std::ops::Range<usize>) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[r]);
    u16::from_le_bytes(a)
}

/// A view of a virtio_net_hdr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioNetHdr<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VirtioNetHdr<T> {
    /// Wraps a buffer without checking its length (accessors may panic if it is shorter than 10 bytes).
    pub const fn new_unchecked(buffer: T) -> Self {
        VirtioNetHdr { buffer }
    }

    /// Wraps a buffer of at least [`VIRTIO_NET_HDR_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < VIRTIO_NET_HDR_LEN {
            return Err(WireError::Truncated { what: "virtio_net_hdr", need: VIRTIO_NET_HDR_LEN, have });
        }
        Ok(VirtioNetHdr { buffer })
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// `flags`.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// `gso_type` (including the ECN bit).
    pub fn gso_type(&self) -> u8 {
        self.buffer.as_ref()[field::GSO_TYPE]
    }
    /// Whether the packet behind this header is a GSO super-packet (any gso_type but NONE, ECN bit aside).
    pub fn is_gso(&self) -> bool {
        self.gso_type() & !gso::ECN != gso::NONE
    }
    /// `hdr_len` (not trustworthy: see [`crate::gso`]).
    pub fn hdr_len(&self) -> u16 {
        le16(self.buffer.as_ref(), field::HDR_LEN)
    }
    /// `gso_size`.
    pub fn gso_size(&self) -> u16 {
        le16(self.buffer.as_ref(), field::GSO_SIZE)
    }
    /// `csum_start`.
    pub fn csum_start(&self) -> u16 {
        le16(self.buffer.as_ref(), field::CSUM_START)
    }
    /// `csum_offset`.
    pub fn csum_offset(&self) -> u16 {
        le16(self.buffer.as_ref(), field::CSUM_OFFSET)
    }
    /// `num_buffers` of the v1 header, `None` when the buffer is shorter than 12 bytes.
    pub fn num_buffers(&self) -> Option<u16> {
        let b = self.buffer.as_ref();
        (b.len() >= field::NUM_BUFFERS.end).then(|| le16(b, field::NUM_BUFFERS))
    }
    /// `hash_value` and `hash_report` of a `virtio_net_hdr_v1_hash` (`VIRTIO_NET_F_HASH_REPORT`), `None` when
    /// the buffer is shorter than 20 bytes.
    pub fn hash(&self) -> Option<(u32, u16)> {
        let b = self.buffer.as_ref();
        let value = b.get(field::HASH_VALUE)?;
        let report = le16(b.get(..field::HASH_REPORT.end)?, field::HASH_REPORT);
        Some((u32::from_le_bytes([value[0], value[1], value[2], value[3]]), report))
    }
    /// The tunnel fields of a `virtio_net_hdr_v1_hash_tunnel`, `None` when the buffer is shorter than 24 bytes.
    pub fn tunnel_offsets(&self) -> Option<TunnelOffsets> {
        let b = self.buffer.as_ref();
        (b.len() >= VIRTIO_NET_HDR_V1_HASH_TUNNEL_LEN).then(|| TunnelOffsets {
            outer_th: le16(b, field::OUTER_TH_OFFSET),
            inner_nh: le16(b, field::INNER_NH_OFFSET),
        })
    }
    /// The decoded header.
    pub fn repr(&self) -> VirtioNetHdrRepr {
        VirtioNetHdrRepr {
            flags: self.flags(),
            gso_type: self.gso_type(),
            hdr_len: self.hdr_len(),
            gso_size: self.gso_size(),
            csum_start: self.csum_start(),
            csum_offset: self.csum_offset(),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VirtioNetHdr<T> {
    fn put16(&mut self, r: std::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_le_bytes());
    }
    /// Sets `flags`.
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }
    /// Sets `gso_type`.
    pub fn set_gso_type(&mut self, v: u8) {
        self.buffer.as_mut()[field::GSO_TYPE] = v;
    }
    /// Sets `hdr_len`.
    pub fn set_hdr_len(&mut self, v: u16) {
        self.put16(field::HDR_LEN, v)
    }
    /// Sets `gso_size`.
    pub fn set_gso_size(&mut self, v: u16) {
        self.put16(field::GSO_SIZE, v)
    }
    /// Sets `csum_start`.
    pub fn set_csum_start(&mut self, v: u16) {
        self.put16(field::CSUM_START, v)
    }
    /// Sets `csum_offset`.
    pub fn set_csum_offset(&mut self, v: u16) {
        self.put16(field::CSUM_OFFSET, v)
    }
    /// Sets the tunnel fields; does nothing on a header shorter than 24 bytes.
    pub fn set_tunnel_offsets(&mut self, offsets: TunnelOffsets) {
        if self.buffer.as_ref().len() >= VIRTIO_NET_HDR_V1_HASH_TUNNEL_LEN {
            self.put16(field::OUTER_TH_OFFSET, offsets.outer_th);
            self.put16(field::INNER_NH_OFFSET, offsets.inner_nh);
        }
    }
    /// Sets `num_buffers`; does nothing on a 10-byte header.
    pub fn set_num_buffers(&mut self, v: u16) {
        if self.buffer.as_ref().len() >= field::NUM_BUFFERS.end {
            self.put16(field::NUM_BUFFERS, v)
        }
    }
}

/// Where the headers of a UDP-tunnel super-packet start, counted from the start of the packet (after the virtio
/// header): the last two fields of `virtio_net_hdr_v1_hash_tunnel`. `csum_start` of the same header points at the
/// inner transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TunnelOffsets {
    /// `outer_th_offset`: the outer UDP header.
    pub outer_th: u16,
    /// `inner_nh_offset`: the inner IP header (after the tunnel header and the inner Ethernet header).
    pub inner_nh: u16,
}

impl TunnelOffsets {
    /// Parses the tunnel fields of a header of at least 24 bytes.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let have = buf.len();
        if have < VIRTIO_NET_HDR_V1_HASH_TUNNEL_LEN {
            let need = VIRTIO_NET_HDR_V1_HASH_TUNNEL_LEN;
            return Err(WireError::Truncated { what: "virtio_net_hdr_v1_hash_tunnel", need, have });
        }
        Ok(VirtioNetHdr::new_unchecked(buf).tunnel_offsets().unwrap_or_default())
    }
}

/// The decoded fields of a virtio_net_hdr (those tun uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct VirtioNetHdrRepr {
    /// `flags` ([`flags`]).
    pub flags: u8,
    /// `gso_type` ([`gso`]), including the ECN bit.
    pub gso_type: u8,
    /// `hdr_len`.
    pub hdr_len: u16,
    /// `gso_size`.
    pub gso_size: u16,
    /// `csum_start`.
    pub csum_start: u16,
    /// `csum_offset`.
    pub csum_offset: u16,
}

impl VirtioNetHdrRepr {
    /// Parses the first 10 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        Ok(VirtioNetHdr::new_checked(buf)?.repr())
    }

    /// Writes the 10-byte header into `buf` and zeroes `buf[10..]` (so pass exactly the configured header size,
    /// 10, 12, 20 or 24). On a buffer shorter than 10 bytes, writes only the bytes that fit; see [`Self::try_emit`].
    pub fn emit(&self, buf: &mut [u8]) {
        let mut full = [0u8; VIRTIO_NET_HDR_LEN];
        self.emit_array(&mut full);
        let n = buf.len().min(VIRTIO_NET_HDR_LEN);
        buf[..n].copy_from_slice(&full[..n]);
        buf[n..].fill(0);
    }

    /// Like [`Self::emit`] but fails on a buffer shorter than 10 bytes.
    pub fn try_emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < VIRTIO_NET_HDR_LEN {
            return Err(WireError::Truncated { what: "virtio_net_hdr", need: VIRTIO_NET_HDR_LEN, have: buf.len() });
        }
        self.emit(buf);
        Ok(())
    }

    fn emit_array(&self, b: &mut [u8; VIRTIO_NET_HDR_LEN]) {
        b[field::FLAGS] = self.flags;
        b[field::GSO_TYPE] = self.gso_type;
        b[field::HDR_LEN].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[field::GSO_SIZE].copy_from_slice(&self.gso_size.to_le_bytes());
        b[field::CSUM_START].copy_from_slice(&self.csum_start.to_le_bytes());
        b[field::CSUM_OFFSET].copy_from_slice(&self.csum_offset.to_le_bytes());
    }

    /// `gso_type` without the ECN bit.
    pub fn gso_kind(&self) -> u8 {
        self.gso_type & !gso::ECN
    }

    /// Whether this is a GSO super-packet's header (any gso_type but NONE, ECN bit aside).
    pub fn is_gso(&self) -> bool {
        self.gso_kind() != gso::NONE
    }

    /// Whether `NEEDS_CSUM` is set.
    pub fn needs_csum(&self) -> bool {
        self.flags & flags::NEEDS_CSUM != 0
    }

    /// Finishes a packet handed over whole (not a super-packet) with this header: its partial checksum
    /// (`NEEDS_CSUM`) completed. Returns whether its L4 checksum is now known good (completed here, or marked
    /// `DATA_VALID` by the kernel); an error if the checksum offsets lie outside the packet (it is then left as
    /// it was). The one rule every read path uses.
    pub fn finish_whole(&self, packet: &mut [u8]) -> Result<bool, WireError> {
        if self.needs_csum() {
            crate::checksum::complete_partial(packet, self.csum_start.into(), self.csum_offset.into())?;
            return Ok(true);
        }
        Ok(self.flags & flags::DATA_VALID != 0)
    }

    /// Whether `gso_type` marks a UDP-tunnel super-packet (either tunnel bit).
    pub fn is_udp_tunnel(&self) -> bool {
        self.gso_type & gso::UDP_TUNNEL != 0
    }

    /// The inner packet's kind of a UDP-tunnel super-packet: `gso_type` without the tunnel and ECN bits.
    pub fn inner_gso_kind(&self) -> u8 {
        self.gso_type & !(gso::UDP_TUNNEL | gso::ECN)
    }

    /// Checks the header a sender (a guest, a program writing to a TAP) put in front of a frame of `frame_len`
    /// bytes (the header not included), by the rules the kernel applies to a write (`virtio_net_hdr_to_skb` and
    /// the tun driver's own check): a known `gso_type` (`NONE`, `TCPV4`, `TCPV6`, `UDP`, `UDP_L4`; the ECN bit
    /// only on TCP; no UDP-tunnel bits), a `gso_size` above 0 on a super-packet, `hdr_len` within the frame, a
    /// partial checksum whose `csum_start + max(transport header, csum_offset + 2)` lies within the frame and
    /// whose offset is the transport's checksum field on a super-packet, and `NEEDS_CSUM` on a `UDP_L4` one.
    /// A header that passes is one the kernel takes; one that fails would make it refuse the write (`EINVAL`) or,
    /// on an older kernel, build a packet from offsets outside the frame.
    pub fn check_sent_frame(&self, frame_len: usize) -> Result<(), GsoError> {
        let kind = self.gso_kind();
        // The transport header's length the kernel insists on reading behind csum_start (0 without GSO).
        let transport_len = match kind {
            gso::NONE => 0,
            gso::TCPV4 | gso::TCPV6 => crate::tcp::MIN_HEADER_LEN,
            gso::UDP | gso::UDP_L4 => crate::udp::HEADER_LEN,
            _ => return Err(GsoError::UnsupportedGsoType(self.gso_type)),
        };
        let tcp = matches!(kind, gso::TCPV4 | gso::TCPV6);
        if self.gso_type & gso::ECN != 0 && !tcp {
            return Err(GsoError::UnsupportedGsoType(self.gso_type));
        }
        if kind != gso::NONE && self.gso_size == 0 {
            return Err(GsoError::ZeroGsoSize);
        }
        if usize::from(self.hdr_len) > frame_len {
            return Err(GsoError::Wire(WireError::BadLength {
                what: "virtio hdr_len",
                field: self.hdr_len.into(),
                actual: frame_len,
            }));
        }
        let (start, offset) = (usize::from(self.csum_start), usize::from(self.csum_offset));
        if self.needs_csum() {
            if start + transport_len.max(offset + 2) > frame_len {
                return Err(GsoError::Wire(WireError::ChecksumOutOfRange { start, offset, len: frame_len }));
            }
            let expected = if tcp { crate::tcp::CHECKSUM_OFFSET } else { crate::udp::CHECKSUM_OFFSET };
            if kind != gso::NONE && offset != expected {
                return Err(GsoError::BadCsumOffset { csum_start: start, csum_offset: offset, limit: frame_len });
            }
        } else if kind == gso::UDP_L4 {
            return Err(GsoError::MissingPartialChecksum { gso_type: self.gso_type });
        }
        Ok(())
    }

    /// Whether the size is one with a defined layout: 10, 12, 20 or 24 (`virtio_net_hdr`, `_v1`, `_v1_hash`,
    /// `_v1_hash_tunnel`).
    pub fn is_valid_size(len: usize) -> bool {
        matches!(
            len,
            VIRTIO_NET_HDR_LEN | VIRTIO_NET_HDR_V1_LEN | VIRTIO_NET_HDR_V1_HASH_LEN | VIRTIO_NET_HDR_V1_HASH_TUNNEL_LEN
        )
    }
}

/// One line that names the header: flags, GSO type and size, header length, checksum offsets.
impl core::fmt::Display for VirtioNetHdrRepr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "virtio flags {:#04x} gso_type {:#04x} gso_size {} hdr_len {} csum {}+{}",
            self.flags, self.gso_type, self.gso_size, self.hdr_len, self.csum_start, self.csum_offset
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 12] = [0x01, 0x81, 0x36, 0x00, 0xa8, 0x05, 0x22, 0x00, 0x10, 0x00, 0x01, 0x00];

    #[test]
    fn test_parse() {
        let r = VirtioNetHdrRepr::parse(&BYTES).unwrap();
        assert_eq!(
            r,
            VirtioNetHdrRepr {
                flags: flags::NEEDS_CSUM,
                gso_type: gso::TCPV4 | gso::ECN,
                hdr_len: 54,
                gso_size: 1448,
                csum_start: 34,
                csum_offset: 16
            }
        );
        assert_eq!(r.gso_kind(), gso::TCPV4);
        assert!(r.needs_csum());
        assert_eq!(VirtioNetHdr::new_checked(&BYTES[..]).unwrap().num_buffers(), Some(1));
        assert_eq!(VirtioNetHdr::new_checked(&BYTES[..10]).unwrap().num_buffers(), None);
    }

    #[test]
    fn test_emit_sizes() {
        let r = VirtioNetHdrRepr::parse(&BYTES).unwrap();
        for size in [10usize, 12, 20] {
            let mut buf = [0xffu8; 20];
            r.emit(&mut buf[..size]);
            assert_eq!(buf[..10], BYTES[..10]);
            assert!(buf[10..size].iter().all(|&b| b == 0), "size {size}");
            assert!(buf[size..].iter().all(|&b| b == 0xff));
        }
        let mut short = [0u8; 9];
        assert!(r.try_emit(&mut short).is_err());
        r.emit(&mut short); // no panic
        assert_eq!(short[..], BYTES[..9]);
    }

    #[test]
    fn test_truncated() {
        for n in 0..10 {
            assert_eq!(
                VirtioNetHdrRepr::parse(&BYTES[..n]),
                Err(WireError::Truncated { what: "virtio_net_hdr", need: 10, have: n })
            );
        }
    }

    /// The tunnel fields sit in bytes 20..24, little-endian; shorter headers have none.
    #[test]
    fn test_tunnel_fields() {
        let mut buf = [0u8; 24];
        let mut h = VirtioNetHdr::new_checked(&mut buf[..]).unwrap();
        h.set_flags(flags::NEEDS_CSUM | flags::UDP_TUNNEL_CSUM);
        h.set_gso_type(gso::UDP_TUNNEL_IPV6 | gso::TCPV4);
        h.set_tunnel_offsets(TunnelOffsets { outer_th: 54, inner_nh: 0x0104 });
        assert_eq!(buf[20..], [54, 0, 0x04, 0x01]);
        let h = VirtioNetHdr::new_checked(&buf[..]).unwrap();
        assert_eq!(h.tunnel_offsets(), Some(TunnelOffsets { outer_th: 54, inner_nh: 260 }));
        assert_eq!(TunnelOffsets::parse(&buf).unwrap(), TunnelOffsets { outer_th: 54, inner_nh: 260 });
        let r = h.repr();
        assert!(r.is_udp_tunnel() && r.is_gso());
        assert_eq!(r.inner_gso_kind(), gso::TCPV4);
        assert_eq!(VirtioNetHdr::new_checked(&buf[..20]).unwrap().tunnel_offsets(), None);
        assert!(TunnelOffsets::parse(&buf[..23]).is_err());
        let mut short = [0u8; 20];
        VirtioNetHdr::new_checked(&mut short[..]).unwrap().set_tunnel_offsets(TunnelOffsets::default());
        assert!(VirtioNetHdrRepr::is_valid_size(24));
        assert!(!VirtioNetHdrRepr { gso_type: gso::UDP_L4, ..Default::default() }.is_udp_tunnel());
    }

    /// What a guest may write in front of a frame, by the kernel's rules: good headers pass, and each bad one is
    /// refused for its own reason.
    #[test]
    fn test_check_sent_frame() {
        let tso = VirtioNetHdrRepr {
            flags: flags::NEEDS_CSUM,
            gso_type: gso::TCPV4,
            hdr_len: 66,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        let uso = VirtioNetHdrRepr { gso_type: gso::UDP_L4, hdr_len: 42, csum_offset: 6, ..tso };
        let plain_csum =
            VirtioNetHdrRepr { flags: flags::NEEDS_CSUM, csum_start: 34, csum_offset: 6, ..Default::default() };
        for (hdr, len) in [
            (VirtioNetHdrRepr::default(), 60),
            (VirtioNetHdrRepr::default(), 0),
            (tso, 3000),
            (VirtioNetHdrRepr { gso_type: gso::TCPV6 | gso::ECN, ..tso }, 3000),
            (uso, 3000),
            (VirtioNetHdrRepr { gso_type: gso::UDP, ..uso }, 3000),
            (plain_csum, 42),
        ] {
            assert_eq!(hdr.check_sent_frame(len), Ok(()), "{hdr} on {len} bytes");
        }
        let bad = [
            (VirtioNetHdrRepr { gso_type: 2, ..tso }, 3000, GsoError::UnsupportedGsoType(2)),
            (
                VirtioNetHdrRepr { gso_type: gso::UDP_TUNNEL_IPV4 | gso::TCPV4, ..tso },
                3000,
                GsoError::UnsupportedGsoType(0x21),
            ),
            (VirtioNetHdrRepr { gso_type: gso::UDP_L4 | gso::ECN, ..uso }, 3000, GsoError::UnsupportedGsoType(0x85)),
            (VirtioNetHdrRepr { gso_size: 0, ..tso }, 3000, GsoError::ZeroGsoSize),
            (
                VirtioNetHdrRepr { hdr_len: 3001, ..tso },
                3000,
                GsoError::Wire(WireError::BadLength { what: "virtio hdr_len", field: 3001, actual: 3000 }),
            ),
            // The TCP header behind csum_start must be in the frame, not only the checksum field.
            (
                VirtioNetHdrRepr { hdr_len: 40, ..tso },
                50,
                GsoError::Wire(WireError::ChecksumOutOfRange { start: 34, offset: 16, len: 50 }),
            ),
            (
                VirtioNetHdrRepr { csum_start: 59, ..plain_csum },
                60,
                GsoError::Wire(WireError::ChecksumOutOfRange { start: 59, offset: 6, len: 60 }),
            ),
            (
                VirtioNetHdrRepr { csum_offset: 6, ..tso },
                3000,
                GsoError::BadCsumOffset { csum_start: 34, csum_offset: 6, limit: 3000 },
            ),
            (VirtioNetHdrRepr { flags: 0, ..uso }, 3000, GsoError::MissingPartialChecksum { gso_type: gso::UDP_L4 }),
        ];
        for (hdr, len, why) in bad {
            assert_eq!(hdr.check_sent_frame(len), Err(why), "{hdr} on {len} bytes");
        }
        // The largest offsets a u16 holds add up without overflow.
        let far = VirtioNetHdrRepr { csum_start: u16::MAX, csum_offset: u16::MAX, ..plain_csum };
        assert!(far.check_sent_frame(usize::from(u16::MAX)).is_err());
    }

    #[test]
    fn test_setters() {
        let mut buf = [0u8; 12];
        let mut h = VirtioNetHdr::new_checked(&mut buf[..]).unwrap();
        h.set_flags(1);
        h.set_gso_type(0x81);
        h.set_hdr_len(54);
        h.set_gso_size(1448);
        h.set_csum_start(34);
        h.set_csum_offset(16);
        h.set_num_buffers(1);
        assert_eq!(buf, BYTES);
        assert!(VirtioNetHdrRepr::is_valid_size(12));
        assert!(!VirtioNetHdrRepr::is_valid_size(11));
    }

    #[test]
    fn a_packet_handed_over_whole_is_finished_by_its_header() {
        use crate::fuzzing::{payload, Spec};
        use crate::{partial, Framing};
        let good = Spec::tcp4().build(&payload(300, 3));
        let mut marked = good.clone();
        let needs_csum = partial::make_partial(&mut marked, Framing::Ip).unwrap();
        let data_valid = VirtioNetHdrRepr { flags: flags::DATA_VALID, ..Default::default() };
        let out_of_range = VirtioNetHdrRepr { csum_start: 20, csum_offset: 400, ..needs_csum };
        // (header, packet as read, Ok(known good) or an error, the packet afterwards)
        type Case<'a> = (VirtioNetHdrRepr, &'a [u8], Option<bool>, &'a [u8]);
        let cases: [Case<'_>; 5] = [
            (needs_csum, &marked, Some(true), &good),
            (data_valid, &good, Some(true), &good),
            (VirtioNetHdrRepr::default(), &good, Some(false), &good),
            (VirtioNetHdrRepr::default(), &marked, Some(false), &marked),
            (out_of_range, &marked, None, &marked),
        ];
        for (i, (hdr, read, known_good, after)) in cases.into_iter().enumerate() {
            let mut packet = read.to_vec();
            assert_eq!(hdr.finish_whole(&mut packet).ok(), known_good, "case {i}");
            assert_eq!(packet, after, "case {i}");
        }
    }
}
