//! GSO: split one super-packet read from a TUN/TAP device (a virtio_net_hdr + up to 64 KiB) into wire-sized
//! segments, into caller buffers or as zero-copy [`SegmentView`]s.
//!
//! The header's `hdr_len` is never trusted: the header length is recomputed by parsing the packet (IP header,
//! IPv6 extension headers, TCP data offset / UDP header), and `csum_start`/`csum_offset` must agree with it.
//! Each segment gets: IPv4 total length, ID = first ID + i and header checksum, or IPv6 payload length; TCP
//! sequence number = first + i * gso_size, FIN and PSH only on the last segment and CWR only on the first;
//! UDP length; and a full L4 checksum.

use crate::checksum;
use crate::ipv4;
use crate::ipv6;
use crate::tcp;
use crate::udp;
use crate::virtio_net::{gso, VirtioNetHdrRepr};
use crate::{locate_ip, Batch, Framing, GsoError, WireError, IPPROTO_TCP, IPPROTO_UDP};

/// Longest header (L2 + L3 + extension headers + L4) a super-packet may have: 22 bytes of Ethernet with two VLAN
/// tags, 60 bytes of IPv4 or 40 bytes of IPv6 plus up to 114 bytes of extension headers, and 60 bytes of TCP.
pub const MAX_HEADER_LEN: usize = 256;

/// Upper bound of an IP packet's length fields.
const MAX_IP_LEN: usize = 65535;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// GSO_NONE without NEEDS_CSUM: the packet as is.
    Plain,
    /// GSO_NONE with NEEDS_CSUM: complete the checksum.
    Partial { start: usize, offset: usize },
    /// TCPV4 / TCPV6.
    Tcp,
    /// UDP_L4.
    Udp,
}

/// A validated super-packet. Construction checks every offset; afterwards nothing can panic.
#[derive(Debug, Clone)]
pub struct Splitter<'a> {
    /// The whole packet, or only its headers (see [`Splitter::from_head`]).
    packet: &'a [u8],
    /// Length of the whole packet.
    len: usize,
    kind: Kind,
    v6: bool,
    l3: usize,
    l4: usize,
    hdr_len: usize,
    gso_size: usize,
    count: usize,
    /// Pseudo-header sum of addresses and protocol (without the length).
    addr_sum: u32,
    ident: u16,
    seq: u32,
    tcp_flags: u8,
    /// Sum of the IPv4 header with total length, ID and checksum zeroed.
    ip_base: u32,
    /// Sum of the L4 header with the per-segment fields (seq, offset/flags, UDP length, checksum) zeroed.
    l4_base: u32,
    /// Segments get a partial L4 checksum (the pseudo-header sum) instead of a complete one.
    partial: bool,
}

/// How far [`Splitter::split_into`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitProgress {
    /// Segments written by this call (into `bufs[0..produced]`).
    pub produced: usize,
    /// Index of the next segment to produce; `next == total` when done.
    pub next: usize,
    /// Total number of segments.
    pub total: usize,
}

impl SplitProgress {
    /// Whether all segments have been produced.
    pub fn is_done(&self) -> bool {
        self.next >= self.total
    }
}

/// One segment without copying its payload: patched headers in an inline array and a slice of the super-packet.
#[derive(Clone)]
pub struct SegmentView<'a> {
    header: [u8; MAX_HEADER_LEN],
    header_len: usize,
    payload: &'a [u8],
}

impl std::fmt::Debug for SegmentView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentView").field("header", &self.header()).field("payload_len", &self.payload.len()).finish()
    }
}

impl<'a> SegmentView<'a> {
    /// The patched headers (L2 if any, IP, L4).
    pub fn header(&self) -> &[u8] {
        &self.header[..self.header_len]
    }
    /// The payload, borrowed from the super-packet.
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
    /// Segment length.
    pub fn len(&self) -> usize {
        self.header_len + self.payload.len()
    }
    /// Whether the segment is empty (only for an empty GSO_NONE packet).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies the segment into `out`, returns its length.
    pub fn copy_to(&self, out: &mut [u8]) -> Result<usize, GsoError> {
        let n = self.len();
        if out.len() < n {
            return Err(GsoError::BufferTooSmall { need: n, have: out.len() });
        }
        out[..self.header_len].copy_from_slice(self.header());
        out[self.header_len..n].copy_from_slice(self.payload);
        Ok(n)
    }
    /// The segment as a vector (allocates; for tests and slow paths).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(self.header());
        v.extend_from_slice(self.payload);
        v
    }
    /// One's-complement partial sum of the segment's bytes from `start` to the end plus `initial`, computed
    /// without copying the payload (e.g. `fold(sum_from(l4_offset, pseudo)) == 0xffff` verifies the L4 checksum).
    pub fn sum_from(&self, start: usize, initial: u32) -> u32 {
        let hl = self.header_len;
        if start >= hl {
            let s = (start - hl).min(self.payload.len());
            return checksum::sum(&self.payload[s..], initial);
        }
        let a = checksum::sum(&self.header[start..hl], initial);
        let b = checksum::sum(self.payload, 0);
        checksum::combine(a, b, hl - start)
    }
}

fn trunc(what: &'static str, need: usize, have: usize) -> GsoError {
    GsoError::Wire(WireError::Truncated { what, need, have })
}

impl<'a> Splitter<'a> {
    /// Validates a super-packet (`packet` starts after the virtio header, at the IP or Ethernet header).
    pub fn new(hdr: &VirtioNetHdrRepr, packet: &'a [u8], framing: Framing) -> Result<Self, GsoError> {
        Self::parse(hdr, packet, packet.len(), framing)
    }

    /// Validates a GSO super-packet of `total_len` bytes from its headers alone, for a caller that already has
    /// the payload where the segments need it (a read scattered straight into per-segment buffers): `head`
    /// must hold exactly the headers. Only [`Self::write_header`] can be used on the result.
    pub fn from_head(
        hdr: &VirtioNetHdrRepr,
        head: &'a [u8],
        total_len: usize,
        framing: Framing,
    ) -> Result<Self, GsoError> {
        if total_len < head.len() {
            return Err(trunc("super-packet", head.len(), total_len));
        }
        let s = Self::parse(hdr, head, total_len, framing)?;
        if !s.is_gso() || s.hdr_len != head.len() {
            return Err(GsoError::HeadOnly);
        }
        Ok(s)
    }

    fn parse(hdr: &VirtioNetHdrRepr, packet: &'a [u8], len: usize, framing: Framing) -> Result<Self, GsoError> {
        let mut s = Splitter {
            packet,
            len,
            kind: Kind::Plain,
            v6: false,
            l3: 0,
            l4: 0,
            hdr_len: 0,
            gso_size: 0,
            count: 1,
            addr_sum: 0,
            ident: 0,
            seq: 0,
            tcp_flags: 0,
            ip_base: 0,
            l4_base: 0,
            partial: false,
        };
        let gso_kind = hdr.gso_type & !gso::ECN;
        let needs_csum = hdr.needs_csum();
        let (cs, co) = (hdr.csum_start as usize, hdr.csum_offset as usize);
        if needs_csum && cs > len {
            return Err(GsoError::CsumStartBeyond { csum_start: cs, len });
        }
        match gso_kind {
            gso::NONE => {
                if needs_csum {
                    if cs + co + 2 > len {
                        return Err(GsoError::BadCsumOffset { csum_start: cs, csum_offset: co, limit: len });
                    }
                    s.kind = Kind::Partial { start: cs, offset: co };
                }
                Ok(s)
            }
            gso::TCPV4 | gso::TCPV6 | gso::UDP_L4 => {
                s.parse_gso(hdr, gso_kind, framing)?;
                Ok(s)
            }
            _ => Err(GsoError::UnsupportedGsoType(hdr.gso_type)),
        }
    }

    /// The rest of [`Self::parse`] for a TCP or UDP super-packet (`gso_kind` without the ECN bit): locates the
    /// headers, checks them against the virtio header and precomputes the per-segment sums.
    fn parse_gso(&mut self, hdr: &VirtioNetHdrRepr, gso_kind: u8, framing: Framing) -> Result<(), GsoError> {
        let (packet, len) = (self.packet, self.len);
        let needs_csum = hdr.needs_csum();
        let (cs, co) = (hdr.csum_start as usize, hdr.csum_offset as usize);
        let tcp = gso_kind != gso::UDP_L4;
        let (l3, version) = locate_ip(packet, framing)?;
        match (gso_kind, version) {
            (gso::TCPV4, 4) | (gso::TCPV6, 6) | (gso::UDP_L4, _) => {}
            _ => return Err(GsoError::GsoTypeMismatch { gso_type: gso_kind, ip_version: version }),
        }
        let (proto, l4) = self.parse_ip(l3, version)?;
        let want = if tcp { IPPROTO_TCP } else { IPPROTO_UDP };
        if proto != want {
            return Err(GsoError::ProtocolMismatch { gso_type: gso_kind, protocol: proto });
        }
        if needs_csum && cs != l4 {
            return Err(GsoError::CsumStartMismatch { csum_start: cs, l4_offset: l4 });
        }
        let hdr_len = l4 + self.parse_l4(l4, tcp)?;
        if packet.len() < hdr_len {
            return Err(trunc("headers", hdr_len, packet.len()));
        }
        if needs_csum {
            let expected = if tcp { tcp::CHECKSUM_OFFSET } else { udp::CHECKSUM_OFFSET };
            if cs + co + 2 > hdr_len || co != expected {
                return Err(GsoError::BadCsumOffset { csum_start: cs, csum_offset: co, limit: hdr_len });
            }
        }
        if hdr_len > MAX_HEADER_LEN {
            return Err(GsoError::HeaderTooLarge { len: hdr_len, max: MAX_HEADER_LEN });
        }
        if hdr.gso_size == 0 {
            return Err(GsoError::ZeroGsoSize);
        }
        let gso_size = hdr.gso_size as usize;
        let payload = len - hdr_len;
        let largest = hdr_len - l3 + payload.min(gso_size);
        if largest > MAX_IP_LEN {
            return Err(GsoError::Wire(WireError::BadLength {
                what: "segment IP length",
                field: largest,
                actual: MAX_IP_LEN,
            }));
        }
        self.kind = if tcp { Kind::Tcp } else { Kind::Udp };
        self.l3 = l3;
        self.l4 = l4;
        self.hdr_len = hdr_len;
        self.gso_size = gso_size;
        self.count = payload.div_ceil(gso_size).max(1);
        self.precompute_header_sums(version == 4, tcp);
        Ok(())
    }

    /// Reads the IP header at `l3` (IP `version`): records the IPv4 ID and the pseudo-header address sum and
    /// returns `(L4 protocol, L4 offset)`. Fragments cannot be segmented.
    fn parse_ip(&mut self, l3: usize, version: u8) -> Result<(u8, usize), GsoError> {
        let ip = &self.packet[l3..];
        if version == 4 {
            let p = ipv4::Packet::new_checked(ip)?;
            if p.is_fragment() {
                return Err(GsoError::Fragment);
            }
            self.ident = p.ident();
            self.addr_sum = checksum::pseudo_header_v4(p.src_addr(), p.dst_addr(), p.protocol(), 0);
            Ok((p.protocol(), l3 + p.header_len()))
        } else {
            let p = ipv6::Packet::new_checked(ip)?;
            let info = p.l4_info()?;
            if info.fragment {
                return Err(GsoError::Fragment);
            }
            self.v6 = true;
            // The final destination: behind a routing header with segments left it is not the header's.
            self.addr_sum = checksum::pseudo_header_v6(p.src_addr(), info.final_dst, info.protocol, 0);
            Ok((info.protocol, l3 + info.offset))
        }
    }

    /// Reads the TCP or UDP header at `l4`: records the TCP sequence number and flags and returns the header's
    /// length. The UDP header is checked against the whole packet's length, as `packet` may hold headers only.
    fn parse_l4(&mut self, l4: usize, tcp: bool) -> Result<usize, GsoError> {
        if tcp {
            let t = tcp::Packet::new_checked(&self.packet[l4..])?;
            self.seq = t.seq_number();
            self.tcp_flags = t.flags();
            Ok(t.header_len())
        } else if self.len < l4 + udp::HEADER_LEN {
            Err(trunc("UDP header", l4 + udp::HEADER_LEN, self.len))
        } else {
            Ok(udp::HEADER_LEN)
        }
    }

    /// Sums the IP and L4 headers with the per-segment fields zeroed, so that each segment only sums its payload.
    /// Needs `l3`, `l4` and `hdr_len` set and checked (`hdr_len <= MAX_HEADER_LEN`).
    fn precompute_header_sums(&mut self, v4: bool, tcp: bool) {
        let (l3, l4, hdr_len) = (self.l3, self.l4, self.hdr_len);
        let mut h = [0u8; MAX_HEADER_LEN];
        h[..hdr_len].copy_from_slice(&self.packet[..hdr_len]);
        if v4 {
            let ip = &mut h[l3..l4];
            ip[2..6].fill(0);
            ip[10..12].fill(0);
            self.ip_base = checksum::sum(ip, 0);
        }
        let l4h = &mut h[l4..hdr_len];
        if tcp {
            l4h[4..8].fill(0);
            l4h[12..14].fill(0);
            l4h[16..18].fill(0);
        } else {
            l4h[4..8].fill(0);
        }
        self.l4_base = checksum::sum(l4h, 0);
    }

    /// Segments get a partial L4 checksum, as the kernel's own segmentation leaves a `CHECKSUM_PARTIAL`
    /// packet's segments: the pseudo-header sum in the field, to be completed by whoever writes them with
    /// `NEEDS_CSUM` (see [`crate::partial`]). No payload byte is read, which is most of a split's work. Takes
    /// effect only for a GSO packet whose segments are markable (TCP or UDP in IPv4, or in IPv6 without
    /// extension headers); [`Self::checksums_left_partial`] tells. The IPv4 header checksum is always complete.
    pub fn leave_checksums_partial(mut self, on: bool) -> Self {
        self.partial = on && self.is_gso() && (!self.v6 || self.l4 == self.l3 + ipv6::HEADER_LEN);
        self
    }

    /// Whether the segments get partial L4 checksums (see [`Self::leave_checksums_partial`]).
    pub fn checksums_left_partial(&self) -> bool {
        self.partial
    }

    /// Number of segments (1 for GSO_NONE).
    pub fn segment_count(&self) -> usize {
        self.count
    }

    /// Whether this is a GSO packet (TCP or UDP) rather than GSO_NONE.
    pub fn is_gso(&self) -> bool {
        matches!(self.kind, Kind::Tcp | Kind::Udp)
    }

    /// Recomputed header length (L2 + IP + L4) of a GSO packet, 0 for GSO_NONE.
    pub fn hdr_len(&self) -> usize {
        self.hdr_len
    }

    /// gso_size of a GSO packet, 0 for GSO_NONE.
    pub fn gso_size(&self) -> usize {
        self.gso_size
    }

    /// Offset of the transport header of a GSO packet.
    pub fn l4_offset(&self) -> usize {
        self.l4
    }

    fn payload_range(&self, index: usize) -> (usize, usize) {
        let start = self.hdr_len + index * self.gso_size;
        let end = (start + self.gso_size).min(self.len);
        (start.min(end), end)
    }

    /// Length of segment `index` (0 when out of range).
    pub fn segment_len(&self, index: usize) -> usize {
        if index >= self.count {
            return 0;
        }
        match self.kind {
            Kind::Plain | Kind::Partial { .. } => self.len,
            Kind::Tcp | Kind::Udp => {
                let (s, e) = self.payload_range(index);
                self.hdr_len + (e - s)
            }
        }
    }

    /// Patches a copy of the headers (`h` is `packet[..hdr_len]`) for segment `index` whose payload sums to
    /// `payload_sum`; only the changed fields are summed, the rest comes from the precomputed header sums.
    fn patch(&self, index: usize, h: &mut [u8], payload_len: usize, payload_sum: u32) {
        let last = index + 1 == self.count;
        let l4_len = self.hdr_len - self.l4 + payload_len;
        if self.v6 {
            let len = (self.hdr_len - self.l3 - ipv6::HEADER_LEN + payload_len) as u16;
            h[self.l3 + 4..self.l3 + 6].copy_from_slice(&len.to_be_bytes());
        } else {
            let ip = &mut h[self.l3..self.l4];
            let total = (self.l4 - self.l3 + l4_len) as u16;
            let id = self.ident.wrapping_add(index as u16);
            let c = checksum::finish(checksum::add(self.ip_base, total as u32 + id as u32));
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[4..6].copy_from_slice(&id.to_be_bytes());
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        // Pseudo-header (addresses, protocol, length) + constant header part + payload.
        let base = checksum::add(self.l4_base, checksum::add(self.addr_sum, payload_sum) + l4_len as u32);
        let seed = checksum::fold(checksum::add(self.addr_sum, l4_len as u32));
        let l4 = &mut h[self.l4..];
        if self.kind == Kind::Tcp {
            let seq = self.seq.wrapping_add((index as u32).wrapping_mul(self.gso_size as u32));
            let mut f = self.tcp_flags;
            if !last {
                f &= !(tcp::flags::FIN | tcp::flags::PSH);
            }
            if index != 0 {
                f &= !tcp::flags::CWR;
            }
            let word = u16::from_be_bytes([l4[12], f]) as u32;
            let c = if self.partial {
                seed
            } else {
                checksum::finish(checksum::add(base, (seq >> 16) + (seq & 0xffff) + word))
            };
            l4[4..8].copy_from_slice(&seq.to_be_bytes());
            l4[13] = f;
            l4[16..18].copy_from_slice(&c.to_be_bytes());
        } else {
            let c = checksum::finish(checksum::add(base, l4_len as u32));
            let c = if self.partial {
                seed
            } else if c == 0 {
                0xffff
            } else {
                c
            };
            l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            l4[6..8].copy_from_slice(&c.to_be_bytes());
        }
    }

    fn check_index(&self, index: usize) -> Result<(), GsoError> {
        if index >= self.count {
            return Err(GsoError::IndexOutOfRange { index, count: self.count });
        }
        Ok(())
    }

    fn check_payload_held(&self) -> Result<(), GsoError> {
        if self.packet.len() < self.len {
            return Err(GsoError::HeadOnly);
        }
        Ok(())
    }

    /// Length of segment `index`'s payload (0 when out of range or not GSO).
    pub fn segment_payload_len(&self, index: usize) -> usize {
        match self.kind {
            Kind::Tcp | Kind::Udp if index < self.count => {
                let (s, e) = self.payload_range(index);
                e - s
            }
            _ => 0,
        }
    }

    /// Writes the patched headers of GSO segment `index` into `out` (at least [`Self::hdr_len`] bytes), with
    /// the L4 checksum over `payload`, which must be that segment's payload (length
    /// [`Self::segment_payload_len`]) wherever the caller keeps it. The zero-copy split: no payload byte is
    /// copied, each is read once for the checksum (not at all with partial checksums).
    pub fn write_header(&self, index: usize, payload: &[u8], out: &mut [u8]) -> Result<(), GsoError> {
        self.check_index(index)?;
        if !self.is_gso() {
            return Err(GsoError::HeadOnly);
        }
        let want = self.segment_payload_len(index);
        if payload.len() != want {
            return Err(GsoError::Wire(WireError::BadLength {
                what: "segment payload",
                field: want,
                actual: payload.len(),
            }));
        }
        let hl = self.hdr_len;
        let Some(h) = out.get_mut(..hl) else {
            return Err(GsoError::BufferTooSmall { need: hl, have: out.len() });
        };
        crate::small_copy::copy(h, &self.packet[..hl]);
        let payload_sum = if self.partial { 0 } else { checksum::sum(payload, 0) };
        self.patch(index, h, payload.len(), payload_sum);
        Ok(())
    }

    /// Writes segment `index` (headers patched, checksums complete unless left partial) into `out`, returns its
    /// length.
    pub fn write_segment(&self, index: usize, out: &mut [u8]) -> Result<usize, GsoError> {
        self.check_index(index)?;
        self.check_payload_held()?;
        let n = self.segment_len(index);
        if out.len() < n {
            return Err(GsoError::BufferTooSmall { need: n, have: out.len() });
        }
        let out = &mut out[..n];
        match self.kind {
            Kind::Plain => out.copy_from_slice(self.packet),
            Kind::Partial { start, offset } => {
                out.copy_from_slice(self.packet);
                checksum::complete_partial(out, start, offset)?;
            }
            Kind::Tcp | Kind::Udp => {
                let (s, e) = self.payload_range(index);
                let payload = &self.packet[s..e];
                let (h, p) = out.split_at_mut(self.hdr_len);
                crate::small_copy::copy(h, &self.packet[..self.hdr_len]);
                let payload_sum = if self.partial {
                    p.copy_from_slice(payload);
                    0
                } else {
                    checksum::copy_and_sum(p, payload, 0)
                };
                self.patch(index, h, payload.len(), payload_sum);
            }
        }
        Ok(n)
    }

    /// Zero-copy view of segment `index`: patched headers in an inline array + a slice of the payload.
    ///
    /// For GSO_NONE + NEEDS_CSUM the "header" is everything up to the checksum field, which must fit in
    /// [`MAX_HEADER_LEN`].
    pub fn segment_view(&self, index: usize) -> Result<SegmentView<'a>, GsoError> {
        self.check_index(index)?;
        self.check_payload_held()?;
        let mut v = SegmentView { header: [0u8; MAX_HEADER_LEN], header_len: 0, payload: self.packet };
        match self.kind {
            Kind::Plain => {}
            Kind::Partial { start, offset } => {
                let hl = start + offset + 2;
                if hl > MAX_HEADER_LEN {
                    return Err(GsoError::HeaderTooLarge { len: hl, max: MAX_HEADER_LEN });
                }
                v.header[..hl].copy_from_slice(&self.packet[..hl]);
                v.header_len = hl;
                v.payload = &self.packet[hl..];
                let c = checksum::finish(v.sum_from(start, 0));
                let c = if c == 0 { 0xffff } else { c };
                v.header[start + offset..hl].copy_from_slice(&c.to_be_bytes());
            }
            Kind::Tcp | Kind::Udp => {
                let (s, e) = self.payload_range(index);
                let hl = self.hdr_len;
                v.header[..hl].copy_from_slice(&self.packet[..hl]);
                v.header_len = hl;
                v.payload = &self.packet[s..e];
                let payload_sum = if self.partial { 0 } else { checksum::sum(v.payload, 0) };
                self.patch(index, &mut v.header[..hl], v.payload.len(), payload_sum);
            }
        }
        Ok(v)
    }

    /// Batch helper: writes segments `first, first + 1, ...` into the batch's `bufs[i][offset..]` and their lengths
    /// into `lens[i]`, as many as it holds. Reports exactly how many were produced and the next index.
    ///
    /// A buffer too small for its segment stops the batch there: if some segments were already produced they are
    /// reported (and `next` points at the segment that did not fit); if it is the first one, the error is returned.
    pub fn split_into<B: AsMut<[u8]>>(
        &self,
        first: usize,
        batch: &mut Batch<'_, B>,
    ) -> Result<SplitProgress, GsoError> {
        split_batch(
            first,
            self.count,
            batch,
            |index, out| self.write_segment(index, out),
            |index| self.segment_len(index),
        )
    }
}

/// The batch loop of [`Splitter::split_into`] and [`crate::TunnelSplitter::split_into`]: segments `first ..
/// total` written by `write` into the batch's `bufs[i][offset..]` (lengths into `lens[i]`) as far as the buffers
/// go. A buffer too small for its segment ends the batch there, or is the error if it is the first.
pub(crate) fn split_batch<B: AsMut<[u8]>>(
    first: usize,
    total: usize,
    batch: &mut Batch<'_, B>,
    write: impl Fn(usize, &mut [u8]) -> Result<usize, GsoError>,
    segment_len: impl Fn(usize) -> usize,
) -> Result<SplitProgress, GsoError> {
    let Batch { bufs, lens, offset } = batch;
    let offset = *offset;
    if first > total {
        return Err(GsoError::IndexOutOfRange { index: first, count: total });
    }
    let mut produced = 0;
    for (buf, len) in bufs.iter_mut().zip(lens.iter_mut()) {
        let index = first + produced;
        if index >= total {
            break;
        }
        let buf = buf.as_mut();
        let res = match buf.get_mut(offset..) {
            Some(out) => write(index, out),
            None => Err(GsoError::BufferTooSmall { need: offset + segment_len(index), have: buf.len() }),
        };
        match res {
            Ok(n) => *len = n,
            Err(e) if produced == 0 => return Err(e),
            Err(_) => break,
        }
        produced += 1;
    }
    Ok(SplitProgress { produced, next: first + produced, total })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio_net::flags;

    fn tcp4_super(payload_len: usize, gso_size: u16) -> (VirtioNetHdrRepr, Vec<u8>) {
        let mut p = vec![0u8; 40 + payload_len];
        ipv4::Repr {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            protocol: 6,
            payload_len: (20 + payload_len) as u16,
            ttl: 64,
            tos: 0,
            ident: 7,
            dont_frag: true,
        }
        .emit(&mut p)
        .unwrap();
        tcp::Repr { src_port: 1, dst_port: 2, seq: 100, ack: 5, flags: 0x18 | 1, window: 9 }
            .emit(&mut p[20..])
            .unwrap();
        for (i, b) in p[40..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let hdr = VirtioNetHdrRepr {
            flags: flags::NEEDS_CSUM,
            gso_type: gso::TCPV4,
            hdr_len: 40,
            gso_size,
            csum_start: 20,
            csum_offset: 16,
        };
        (hdr, p)
    }

    #[test]
    fn counts_and_lengths() {
        let (h, p) = tcp4_super(1000, 300);
        let s = Splitter::new(&h, &p, Framing::Ip).unwrap();
        assert_eq!(s.segment_count(), 4);
        assert_eq!(s.hdr_len(), 40);
        assert_eq!((0..5).map(|i| s.segment_len(i)).collect::<Vec<_>>(), vec![340, 340, 340, 140, 0]);
        let mut out = [0u8; 340];
        assert_eq!(s.write_segment(3, &mut out).unwrap(), 140);
        let seg = &out[..140];
        assert_eq!(u16::from_be_bytes([seg[2], seg[3]]), 140);
        assert_eq!(u16::from_be_bytes([seg[4], seg[5]]), 10); // ID 7 + 3
        assert_eq!(u32::from_be_bytes([seg[24], seg[25], seg[26], seg[27]]), 1000); // seq 100 + 900
        assert_eq!(seg[33], 0x19); // FIN|PSH|ACK on the last
        s.write_segment(0, &mut out).unwrap();
        assert_eq!(out[33], 0x10);
        assert_eq!(s.write_segment(4, &mut out), Err(GsoError::IndexOutOfRange { index: 4, count: 4 }));
        assert_eq!(s.write_segment(0, &mut out[..339]), Err(GsoError::BufferTooSmall { need: 340, have: 339 }));
    }

    #[test]
    fn view_equals_write() {
        let (h, p) = tcp4_super(1001, 250);
        let s = Splitter::new(&h, &p, Framing::Ip).unwrap();
        for i in 0..s.segment_count() {
            let mut out = vec![0u8; 400];
            let n = s.write_segment(i, &mut out).unwrap();
            let v = s.segment_view(i).unwrap();
            assert_eq!(v.to_vec(), out[..n]);
            let mut copy = vec![0u8; n];
            assert_eq!(v.copy_to(&mut copy).unwrap(), n);
            assert_eq!(copy, out[..n]);
            let pseudo = checksum::pseudo_header_v4([10, 0, 0, 1], [10, 0, 0, 2], 6, (n - 20) as u32);
            assert_eq!(checksum::fold(v.sum_from(20, pseudo)), 0xffff);
        }
    }

    /// The zero-copy split (headers from `from_head`, payload where the caller has it) gives the same bytes
    /// as `write_segment`, for every segment including the short last one.
    #[test]
    fn write_header_equals_write_segment() {
        for (payload_len, gso_size) in [(4000, 1000), (4001, 1000), (999, 1000), (65535 - 40, 1448)] {
            let (hdr, pkt) = tcp4_super(payload_len, gso_size);
            let full = Splitter::new(&hdr, &pkt, Framing::Ip).unwrap();
            let hl = full.hdr_len();
            let head = Splitter::from_head(&hdr, &pkt[..hl], pkt.len(), Framing::Ip).unwrap();
            assert_eq!(head.segment_count(), full.segment_count());
            for i in 0..full.segment_count() {
                let mut want = vec![0u8; 2048];
                let n = full.write_segment(i, &mut want).unwrap();
                let start = hl + i * gso_size as usize;
                let payload = &pkt[start..start + head.segment_payload_len(i)];
                let mut got = vec![0u8; hl];
                head.write_header(i, payload, &mut got).unwrap();
                got.extend_from_slice(payload);
                assert_eq!(got, want[..n], "segment {i} of {payload_len}/{gso_size}");
            }
            // A head-only splitter has no payload to copy or view, and refuses a payload of the wrong size.
            assert_eq!(head.write_segment(0, &mut [0u8; 2048]), Err(GsoError::HeadOnly));
            assert!(head.segment_view(0).is_err());
            assert!(head.write_header(0, &pkt[hl..hl + 1], &mut [0u8; 256]).is_err());
        }
        // Too short a head, or one that is not exactly the headers, is an error, never a panic.
        let (hdr, pkt) = tcp4_super(4000, 1000);
        for cut in [0, 10, 20, 39, 41] {
            assert!(Splitter::from_head(&hdr, &pkt[..cut], pkt.len(), Framing::Ip).is_err(), "cut {cut}");
        }
        assert!(Splitter::from_head(&hdr, &pkt[..40], 30, Framing::Ip).is_err());
    }

    #[test]
    fn csum_start_beyond_message() {
        let (mut h, p) = tcp4_super(40, 10);
        h.csum_start = 80;
        let e = Splitter::new(&h, &p[..60], Framing::Ip).unwrap_err();
        assert_eq!(e.to_string(), "virtio csum_start 80 beyond packet length 60");
    }

    #[test]
    fn split_into_reports_progress() {
        let (h, p) = tcp4_super(1000, 100);
        let s = Splitter::new(&h, &p, Framing::Ip).unwrap();
        let mut bufs = vec![vec![0u8; 200]; 3];
        let mut lens = [0usize; 3];
        let mut next = 0;
        let mut got = 0;
        loop {
            let pr = s.split_into(next, &mut Batch::new(&mut bufs, &mut lens, 10)).unwrap();
            got += pr.produced;
            assert_eq!(pr.total, 10);
            for l in &lens[..pr.produced] {
                assert_eq!(*l, 140);
            }
            next = pr.next;
            if pr.is_done() {
                break;
            }
            assert_eq!(pr.produced, 3);
        }
        assert_eq!(got, 10);
        // Second buffer too small: the first is reported, next points at segment 1.
        let mut bufs = vec![vec![0u8; 200], vec![0u8; 100]];
        let pr = s.split_into(0, &mut Batch::new(&mut bufs, &mut lens[..2], 10)).unwrap();
        assert_eq!(pr, SplitProgress { produced: 1, next: 1, total: 10 });
        assert!(s.split_into(1, &mut Batch::new(&mut bufs[1..], &mut lens[..1], 10)).is_err());
        assert!(s.split_into(11, &mut Batch::new(&mut bufs, &mut lens[..2], 0)).is_err());
        assert_eq!(s.split_into(10, &mut Batch::new(&mut bufs, &mut lens[..2], 0)).unwrap().produced, 0);
    }
}
