//! GRO: coalesce a batch of TCP or UDP packets per flow into super-packets for one `write()` each to a TUN/TAP
//! device with a virtio_net_hdr.
//!
//! Rules (see `OFFLOAD.md`): a packet is a candidate only if IPv4 has no options and is not a fragment (and its
//! header checksum verifies), IPv6 carries TCP or UDP directly, the IP length equals the buffer length, the total is
//! at most 65535 bytes and there is at least one byte of payload. TCP must carry exactly ACK or ACK|PSH with a data
//! offset of 20..60 bytes; UDP only when enabled (USO granted). Packets merge only when every header field that
//! must agree does: L2 header (TAP), addresses, ports, IPv4 ToS/TTL/DF+reserved bits or IPv6 traffic class, hop
//! limit and flow label, TCP ACK number, header length, reserved bits and option bytes. IPv4 IDs must increment
//! by one per segment, or stay fixed with DF set (as the kernel). TCP appends when `seq == item.seq + item.len`
//! and prepends when `seq + len == item.seq`, newest item of the flow first; nothing goes after a segment shorter
//! than `gso_size`, no segment is larger than `gso_size`, nothing is appended after PSH. UDP merges only onto the
//! newest item of its flow, up to [`Gro::udp_max_segments`] segments. L4 checksums are verified before a merge
//! unless the caller vouches for them ([`Checksums`]); invalid packets pass through unmerged.
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
/// Largest packet (from the start of the framing) produced.
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlowKey {
    addrs: [u8; 32],
    ports: u32,
    ack: u32,
    v6: bool,
    udp: bool,
}

impl FlowKey {
    fn hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ ((self.v6 as u64) << 1 | self.udp as u64);
        for c in self.addrs.chunks_exact(8) {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            h = (h ^ u64::from_ne_bytes(a)).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(23);
        }
        h = (h ^ ((self.ports as u64) << 32 | self.ack as u64)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29)
    }
}

/// Header fields that must be equal for two packets to merge (beyond the flow key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fields {
    l2: [u8; ethernet::MAX_HEADER_LEN],
    l2_len: u8,
    tos: u8,
    ttl: u8,
    frag_bits: u16,
    flow_label: u32,
    l4_hdr_len: u8,
    tcp_res: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdMode {
    Unknown,
    Incrementing,
    Fixed,
}

#[derive(Debug, Clone, Copy)]
struct Cand {
    key: FlowKey,
    fields: Fields,
    opts: [u8; 40],
    l3: usize,
    l4: usize,
    hdr_len: usize,
    payload_len: usize,
    addr_sum: u32,
    seq: u32,
    psh: bool,
    ident: u16,
    df: bool,
}

#[derive(Debug, Clone, Copy)]
struct Item {
    hash: u64,
    /// Gather mode: the last member of the chain (the first is `buf`) and the coalesced length.
    last: usize,
    vlen: usize,
    c: Cand,
    buf: usize,
    gso_size: usize,
    segs: usize,
    last_len: usize,
    payload_total: usize,
    psh: bool,
    id_mode: IdMode,
    verified: bool,
    dead: bool,
}

impl Item {
    /// A flow's first packet, `c` in buffer `buf` of length `len` (not verified, not dead).
    fn first(c: &Cand, hash: u64, buf: usize, len: usize) -> Item {
        Item {
            hash,
            last: buf,
            vlen: len,
            c: *c,
            buf,
            gso_size: c.payload_len,
            segs: 1,
            last_len: c.payload_len,
            payload_total: c.payload_len,
            psh: c.psh,
            id_mode: IdMode::Unknown,
            verified: false,
            dead: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Pass,
    Head(usize),
    Merged,
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

impl Cand {
    const EMPTY: Cand = Cand {
        key: FlowKey { addrs: [0; 32], ports: 0, ack: 0, v6: false, udp: false },
        fields: Fields {
            l2: [0; ethernet::MAX_HEADER_LEN],
            l2_len: 0,
            tos: 0,
            ttl: 0,
            frag_bits: 0,
            flow_label: 0,
            l4_hdr_len: 0,
            tcp_res: 0,
        },
        opts: [0; 40],
        l3: 0,
        l4: 0,
        hdr_len: 0,
        payload_len: 0,
        addr_sum: 0,
        seq: 0,
        psh: false,
        ident: 0,
        df: false,
    };
}

#[cfg(test)]
fn parse_candidate(pkt: &[u8], framing: Framing, tcp_on: bool, udp_on: bool) -> Option<Cand> {
    let mut c = Cand::EMPTY;
    parse_candidate_into(pkt, framing, tcp_on, udp_on, &mut c)?;
    Some(c)
}

/// Parses `pkt` into `c` (reused across packets, so that the ~200-byte candidate is written in place rather
/// than built and moved with `memcpy` per packet); `None` if it is not a GRO candidate. Every field that is
/// compared whole is reset; `opts` is only ever compared up to the option length, which is set.
#[inline(always)]
/// The source and destination addresses of an IP packet, laid out as in [`FlowKey::addrs`], and whether it is
/// IPv6; `None` if it is not IP or too short for its header.
fn address_pair(pkt: &[u8], framing: Framing) -> Option<([u8; 32], bool)> {
    let l3 = match framing {
        Framing::Ip => 0,
        Framing::Ethernet => ethernet::Frame::new_checked(pkt).ok()?.header_len(),
    };
    let ip = pkt.get(l3..)?;
    let mut addrs = [0u8; 32];
    match ip.first()? >> 4 {
        4 => {
            let p = ipv4::Packet::new_checked(ip).ok()?;
            addrs[..4].copy_from_slice(&p.src_addr());
            addrs[16..20].copy_from_slice(&p.dst_addr());
            Some((addrs, false))
        }
        6 => {
            let p = ipv6::Packet::new_checked(ip).ok()?;
            addrs[..16].copy_from_slice(&p.src_addr());
            addrs[16..].copy_from_slice(&p.dst_addr());
            Some((addrs, true))
        }
        _ => None,
    }
}

fn parse_candidate_into(pkt: &[u8], framing: Framing, tcp_on: bool, udp_on: bool, c: &mut Cand) -> Option<()> {
    if pkt.len() > MAX_PACKET_LEN {
        return None;
    }
    c.key = Cand::EMPTY.key;
    c.fields = Cand::EMPTY.fields;
    c.psh = false;
    c.seq = 0;
    let l3 = match framing {
        Framing::Ip => 0,
        Framing::Ethernet => {
            let f = ethernet::Frame::new_checked(pkt).ok()?;
            if !matches!(f.inner_ethertype(), ethernet::ETHERTYPE_IPV4 | ethernet::ETHERTYPE_IPV6) {
                return None;
            }
            let hl = f.header_len();
            crate::small_copy::copy(&mut c.fields.l2[..hl], &pkt[..hl]);
            c.fields.l2_len = hl as u8;
            hl
        }
    };
    let ip = &pkt[l3..];
    let (proto, l4, addr_sum, ident, df) = match ip.first()? >> 4 {
        4 => {
            let p = ipv4::Packet::new_checked(ip).ok()?;
            if p.header_len() != ipv4::MIN_HEADER_LEN
                || p.is_fragment()
                || p.total_len() as usize != ip.len()
                || !p.verify_checksum()
            {
                return None;
            }
            c.key.addrs[..4].copy_from_slice(&p.src_addr());
            c.key.addrs[16..20].copy_from_slice(&p.dst_addr());
            c.fields.tos = p.tos();
            c.fields.ttl = p.ttl();
            c.fields.frag_bits = p.flags_frag() & (ipv4::FLAG_DF | ipv4::FLAG_RESERVED);
            let sum = checksum::pseudo_header_v4(p.src_addr(), p.dst_addr(), p.protocol(), 0);
            (p.protocol(), l3 + ipv4::MIN_HEADER_LEN, sum, p.ident(), p.dont_frag())
        }
        6 => {
            let p = ipv6::Packet::new_checked(ip).ok()?;
            if p.payload_len() as usize + ipv6::HEADER_LEN != ip.len() {
                return None;
            }
            c.key.v6 = true;
            c.key.addrs[..16].copy_from_slice(&p.src_addr());
            c.key.addrs[16..].copy_from_slice(&p.dst_addr());
            c.fields.tos = p.traffic_class();
            c.fields.ttl = p.hop_limit();
            c.fields.flow_label = p.flow_label();
            let sum = checksum::pseudo_header_v6(p.src_addr(), p.dst_addr(), p.next_header(), 0);
            (p.next_header(), l3 + ipv6::HEADER_LEN, sum, 0, false)
        }
        _ => return None,
    };
    let l4b = &pkt[l4..];
    (c.l3, c.l4, c.addr_sum, c.ident, c.df) = (l3, l4, addr_sum, ident, df);
    match proto {
        IPPROTO_TCP if tcp_on => {
            let t = tcp::Packet::new_checked(l4b).ok()?;
            if t.flags() & !tcp::flags::PSH != tcp::flags::ACK {
                return None;
            }
            let hl = t.header_len();
            c.hdr_len = l4 + hl;
            c.payload_len = l4b.len() - hl;
            c.key.ports = (t.src_port() as u32) << 16 | t.dst_port() as u32;
            c.key.ack = t.ack_number();
            c.fields.l4_hdr_len = hl as u8;
            c.fields.tcp_res = t.reserved_bits();
            crate::small_copy::copy(&mut c.opts[..hl - tcp::MIN_HEADER_LEN], t.options());
            c.seq = t.seq_number();
            c.psh = t.flags() & tcp::flags::PSH != 0;
        }
        IPPROTO_UDP if udp_on => {
            let u = udp::Packet::new_checked(l4b).ok()?;
            if u.len() as usize != l4b.len() {
                return None;
            }
            c.key.udp = true;
            c.hdr_len = l4 + udp::HEADER_LEN;
            c.payload_len = l4b.len() - udp::HEADER_LEN;
            c.key.ports = (u.src_port() as u32) << 16 | u.dst_port() as u32;
            c.fields.l4_hdr_len = udp::HEADER_LEN as u8;
        }
        _ => return None,
    }
    if c.payload_len == 0 {
        return None;
    }
    Some(())
}

/// Verifies the L4 checksum of `pkt` (an IPv4 UDP checksum of 0 means "none" and is valid).
fn l4_checksum_ok(pkt: &[u8], c: &Cand) -> bool {
    let Some(l4) = pkt.get(c.l4..) else {
        return false;
    };
    if c.key.udp && l4.len() >= 8 && l4[6] == 0 && l4[7] == 0 {
        return !c.key.v6;
    }
    let pseudo = checksum::add(c.addr_sum, l4.len() as u32);
    checksum::fold(checksum::sum(l4, pseudo)) == 0xffff
}

/// IPv4 ID rule: incrementing IDs coalesce; a fixed ID only with DF set; no mixing.
fn id_check(it: &Item, c: &Cand, prepend: bool) -> Option<IdMode> {
    if c.key.v6 {
        return Some(it.id_mode);
    }
    let first = it.c.ident;
    let inc = if prepend { first.wrapping_sub(1) } else { first.wrapping_add(it.segs as u16) };
    if c.ident == inc && it.id_mode != IdMode::Fixed {
        return Some(IdMode::Incrementing);
    }
    if c.ident == first && c.df && it.id_mode != IdMode::Incrementing {
        return Some(IdMode::Fixed);
    }
    None
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

enum Merge {
    Append,
    Prepend,
}

/// Outcome of [`Gro::try_merge`].
enum Attempt {
    Merged,
    /// This item cannot take the packet (another item of the flow may, for TCP).
    Refused,
    /// The packet's own checksum failed: it merges with nothing.
    BadPacket,
}

/// Byte masks of the 8-byte words [`Gro::try_fast_append`] compares (0xff: must be equal).
const FLOW_WORD: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0xff, 0xff];
const IPV4_WORD0: [u8; 8] = [0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff];
const IPV4_WORD1: [u8; 8] = [0xff, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff];
const TCP_WORD0: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
const TCP_WORD1: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0xff, !tcp::flags::PSH, 0xff, 0xff];

/// Whether `a[at..at + 8]` and `b[at..at + 8]` agree where `mask` is set (both hold those bytes).
#[inline(always)]
fn same_masked(a: &[u8], b: &[u8], at: usize, mask: [u8; 8]) -> bool {
    let word = |x: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&x[at..at + 8]);
        u64::from_ne_bytes(w)
    };
    (word(a) ^ word(b)) & u64::from_ne_bytes(mask) == 0
}

/// The big-endian 16-bit field at `at`, as a length.
#[inline(always)]
fn be16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([b[at], b[at + 1]]))
}

/// Whether a 20-byte IPv4 header's checksum verifies (inline: the general sum is for long data).
#[inline(always)]
fn ipv4_header_sum_ok(ip: &[u8]) -> bool {
    let sum: u32 = ip[..20].chunks_exact(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    checksum::fold(sum) == 0xffff
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
            Some(Slot::Head(k)) if self.gather => self.items[*k].c.hdr_len,
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
            if parse_candidate_into(pkt, self.config.framing, tcp_on, udp_on, &mut cand).is_none() {
                // A packet that cannot merge (an IP fragment, IP options) between two UDP datagrams of the same
                // addresses is a barrier for UDP: no later datagram may join one before it, or it would be
                // written first (a fragmented datagram overtaken by the next one; UDP keeps no sequence to
                // restore the order). TCP merges across it as the kernel's GRO does (the receiver reorders by
                // sequence number).
                if let Some((addrs, v6)) = address_pair(pkt, self.config.framing) {
                    let same = |it: &&mut Item| it.c.key.udp && it.c.key.v6 == v6 && it.c.key.addrs == addrs;
                    for it in self.items.iter_mut().filter(same) {
                        it.dead = true;
                    }
                }
                continue;
            }
            self.insert(i, &cand, bufs, lens, offset, checksums_valid, &mut stats);
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
                    if it.c.key.udp {
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

    /// The fast path for the common case, the next TCP segment of the flow the newest item holds: if packet `i`
    /// has the head's header bytes except for the fields that change from segment to segment (IP length, IPv4
    /// ID and header checksum, TCP sequence number, PSH and checksum), continues the item's sequence and obeys the
    /// same size and ID rules, it is appended without being parsed into a candidate. Those conditions imply
    /// everything [`parse_candidate_into`] and [`Gro::can_merge`] would check for an append to the newest item,
    /// which is also the first item [`Gro::insert`] would try, so the outcome is the same; anything else (a
    /// changed window, another flow, a gap) returns `false` and takes the full path. Trusted checksums only.
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
        if it.dead || !it.verified || it.c.key.udp || it.psh || it.last_len != it.gso_size {
            return false;
        }
        let c = &it.c;
        let (l3, l4, hl, len) = (c.l3, c.l4, c.hdr_len, lens[i]);
        if len <= hl || len > MAX_PACKET_LEN || len - hl > it.gso_size {
            return false;
        }
        let payload_len = len - hl;
        let new_len = if self.gather { it.vlen } else { lens[it.buf] } + payload_len;
        if new_len > MAX_PACKET_LEN || (!self.gather && bufs[it.buf].as_ref().len() < offset + new_len) {
            return false;
        }
        let head = &bufs[it.buf].as_ref()[offset..offset + hl];
        let pkt = &bufs[i].as_ref()[offset..offset + len];
        // Slices compared only when not empty: comparing even an empty one calls `memcmp`.
        if l3 > 0 && pkt[..l3] != head[..l3] {
            return false;
        }
        let (ip, hip) = (&pkt[l3..l4], &head[l3..l4]);
        let id_mode = if c.key.v6 {
            // Version, traffic class and flow label; next header, hop limit and addresses; the payload length.
            if !same_masked(ip, hip, 0, FLOW_WORD) || ip[8..] != hip[8..] || be16(ip, 4) != len - l4 {
                return false;
            }
            it.id_mode
        } else {
            // A candidate's IPv4 header is 20 bytes: all but total length, ID and header checksum alike; the
            // total length right; the header checksum verified, as the full path does.
            if !same_masked(ip, hip, 0, IPV4_WORD0)
                || !same_masked(ip, hip, 8, IPV4_WORD1)
                || ip[16..20] != hip[16..20]
                || be16(ip, 2) != len - l3
                || !ipv4_header_sum_ok(ip)
            {
                return false;
            }
            let ident = be16(ip, 4) as u16;
            if ident == c.ident.wrapping_add(it.segs as u16) && it.id_mode != IdMode::Fixed {
                IdMode::Incrementing
            } else if ident == c.ident && c.df && it.id_mode != IdMode::Incrementing {
                IdMode::Fixed
            } else {
                return false;
            }
        };
        let (t, ht) = (&pkt[l4..hl], &head[l4..hl]);
        // Ports; ACK number, data offset and reserved bits, flags but PSH (the head's are exactly ACK: a candidate,
        // and no PSH in the item), window; urgent pointer; options.
        let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
        if !same_masked(t, ht, 0, TCP_WORD0)
            || !same_masked(t, ht, 8, TCP_WORD1)
            || t[18..20] != ht[18..20]
            || (t.len() > tcp::MIN_HEADER_LEN && t[tcp::MIN_HEADER_LEN..] != ht[tcp::MIN_HEADER_LEN..])
            || seq != c.seq.wrapping_add(it.payload_total as u32)
        {
            return false;
        }
        let psh = t[13] & tcp::flags::PSH != 0;
        self.append(k, i, (hl, payload_len, psh), new_len, bufs, lens, offset);
        self.count_merge(k, payload_len, id_mode);
        true
    }

    /// Merges packet `i` (parsed as `c`) into an earlier packet of its flow, or makes it the head of a new item.
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
        let mut dead = false;
        // Newest first: a UDP packet may only join the newest item of its flow, a TCP packet any that fits.
        for k in (0..self.items.len()).rev() {
            let it = &self.items[k];
            if it.hash != hash || it.c.key != c.key {
                continue;
            }
            match self.try_merge(k, i, c, bufs, lens, offset, &mut pkt_ok, stats) {
                Attempt::Merged => return,
                Attempt::BadPacket => {
                    // Passes through unmerged; kept as a dead item so that UDP cannot merge across it.
                    dead = true;
                    break;
                }
                Attempt::Refused if c.key.udp => break,
                Attempt::Refused => {}
            }
        }
        self.slots[i] = Slot::Head(self.items.len());
        self.items.push(Item { verified: pkt_ok == Some(true), dead, ..Item::first(c, hash, i, lens[i]) });
    }

    /// Tries to merge packet `i` into item `k` of the same flow. Checksums are verified only here, once a merge
    /// is otherwise possible: the item's (if not yet verified) and the packet's (cached in `pkt_ok`).
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
        let it = &self.items[k];
        if it.dead {
            return Attempt::Refused;
        }
        let Some((how, id_mode)) = self.can_merge(it, c) else {
            return Attempt::Refused;
        };
        let new_len = if self.gather { it.vlen } else { lens[it.buf] } + c.payload_len;
        let dst = match how {
            Merge::Append => it.buf,
            Merge::Prepend => i,
        };
        // Gather mode writes only headers into the head's buffer, so its size does not limit the merge.
        if new_len > MAX_PACKET_LEN || (!self.gather && bufs[dst].as_ref().len() < offset + new_len) {
            return Attempt::Refused;
        }
        if !it.verified {
            if !l4_checksum_ok(packet(bufs, lens, it.buf, offset), &it.c) {
                self.items[k].dead = true;
                stats.bad_checksum += 1;
                return Attempt::Refused;
            }
            self.items[k].verified = true;
        }
        if !*pkt_ok.get_or_insert_with(|| l4_checksum_ok(packet(bufs, lens, i, offset), c)) {
            stats.bad_checksum += 1;
            return Attempt::BadPacket;
        }
        match how {
            Merge::Append => self.append(k, i, (c.hdr_len, c.payload_len, c.psh), new_len, bufs, lens, offset),
            Merge::Prepend => self.prepend(k, i, c, new_len, bufs, lens, offset),
        }
        self.count_merge(k, c.payload_len, id_mode);
        stats.coalesced += 1;
        Attempt::Merged
    }

    /// What every merge into item `k` adds: a segment of `payload_len` bytes, the IPv4 ID rule it followed.
    #[inline]
    fn count_merge(&mut self, k: usize, payload_len: usize, id_mode: IdMode) {
        let it = &mut self.items[k];
        it.payload_total += payload_len;
        it.segs += 1;
        it.id_mode = id_mode;
    }

    /// Packet `i` (header length, payload length, PSH) follows item `k`: its payload goes after the item's
    /// (copied, or chained in gather mode).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn append<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        k: usize,
        i: usize,
        (hdr_len, payload_len, psh): (usize, usize, bool),
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
        it.last_len = payload_len;
        it.psh |= psh;
        self.slots[i] = Slot::Merged;
    }

    /// Packet `i` precedes item `k`: it becomes the head, with its headers, and the item's payload follows it.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn prepend<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        k: usize,
        i: usize,
        c: &Cand,
        new_len: usize,
        bufs: &mut [B],
        lens: &mut [usize],
        offset: usize,
    ) {
        let it = &mut self.items[k];
        let old = it.buf;
        if self.gather {
            self.next[i] = old;
            it.vlen = new_len;
        } else {
            let end = offset + lens[i];
            copy_across(bufs, old, offset + it.c.hdr_len..offset + lens[old], i, end);
            lens[i] += it.payload_total;
        }
        if it.segs == 1 {
            it.last_len = it.payload_total;
        }
        it.gso_size = c.payload_len;
        let keep = (it.psh, it.verified);
        it.c = *c;
        (it.psh, it.verified) = keep;
        it.buf = i;
        self.slots[old] = Slot::Merged;
        self.slots[i] = Slot::Head(k);
    }

    fn can_merge(&self, it: &Item, c: &Cand) -> Option<(Merge, IdMode)> {
        let hl = c.fields.l4_hdr_len as usize - if c.key.udp { udp::HEADER_LEN } else { tcp::MIN_HEADER_LEN };
        if it.c.fields != c.fields || it.c.opts[..hl] != c.opts[..hl] {
            return None;
        }
        if c.key.udp {
            if it.segs >= self.udp_max_segments || c.payload_len > it.gso_size || it.last_len != it.gso_size {
                return None;
            }
            return id_check(it, c, false).map(|m| (Merge::Append, m));
        }
        if c.seq == it.c.seq.wrapping_add(it.payload_total as u32) {
            if it.psh || c.payload_len > it.gso_size || it.last_len != it.gso_size {
                return None;
            }
            return id_check(it, c, false).map(|m| (Merge::Append, m));
        }
        if c.seq.wrapping_add(c.payload_len as u32) == it.c.seq {
            let fits = if it.segs == 1 { it.payload_total <= c.payload_len } else { it.gso_size == c.payload_len };
            if c.psh || !fits {
                return None;
            }
            return id_check(it, c, true).map(|m| (Merge::Prepend, m));
        }
        None
    }

    /// Rewrites the headers of a merged packet and writes its virtio header.
    fn finish_item(it: &Item, buf: &mut [u8], offset: usize, vlen: usize, len: usize) {
        let c = &it.c;
        // Only header bytes are touched: in gather mode the payload of the coalesced packet is not in `buf`.
        let (vh, rest) = buf[offset - vlen..offset + c.hdr_len].split_at_mut(vlen);
        let l4_len = len - c.l4;
        if c.key.v6 {
            ipv6::Packet::new_unchecked(&mut rest[c.l3..]).set_payload_len((len - c.l3 - ipv6::HEADER_LEN) as u16);
        } else {
            let mut ip = ipv4::Packet::new_unchecked(&mut rest[c.l3..c.l4]);
            ip.set_total_len((len - c.l3) as u16);
            ip.fill_checksum();
        }
        let pseudo = checksum::fold(checksum::add(c.addr_sum, l4_len as u32));
        let (gso_type, csum_offset) = if c.key.udp {
            let mut u = udp::Packet::new_unchecked(&mut rest[c.l4..]);
            u.set_len(l4_len as u16);
            u.set_checksum(pseudo);
            (gso::UDP_L4, udp::CHECKSUM_OFFSET)
        } else {
            let mut t = tcp::Packet::new_unchecked(&mut rest[c.l4..]);
            if it.psh {
                let f = t.flags();
                t.set_flags(f | tcp::flags::PSH);
            }
            t.set_checksum(pseudo);
            (if c.key.v6 { gso::TCPV6 } else { gso::TCPV4 }, tcp::CHECKSUM_OFFSET)
        };
        VirtioNetHdrRepr {
            flags: flags::NEEDS_CSUM,
            gso_type,
            hdr_len: c.hdr_len as u16,
            gso_size: it.gso_size as u16,
            csum_start: c.l4 as u16,
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

    fn item(c: Cand) -> Item {
        Item { verified: true, ..Item::first(&c, c.key.hash(), 0, c.hdr_len + c.payload_len) }
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
    }

    #[test]
    fn ipv4_id_modes() {
        let s = Spec::tcp4();
        let it = item(cand(&s, 10));
        let next = |id: u16, df: bool| {
            let mut n = s.next_seg(10);
            n.ip_id = id;
            n.df = df;
            cand(&n, 10)
        };
        assert_eq!(id_check(&it, &next(s.ip_id + 1, true), false), Some(IdMode::Incrementing));
        assert_eq!(id_check(&it, &next(s.ip_id, true), false), Some(IdMode::Fixed));
        assert_eq!(id_check(&it, &next(s.ip_id, false), false), None);
        assert_eq!(id_check(&it, &next(s.ip_id + 2, true), false), None);
        assert_eq!(id_check(&it, &next(s.ip_id - 1, true), true), Some(IdMode::Incrementing));
        let fixed = Item { id_mode: IdMode::Fixed, segs: 2, ..it };
        assert_eq!(id_check(&fixed, &next(s.ip_id + 2, true), false), None);
        assert_eq!(id_check(&fixed, &next(s.ip_id, true), false), Some(IdMode::Fixed));
        let inc = Item { id_mode: IdMode::Incrementing, segs: 2, ..it };
        assert_eq!(id_check(&inc, &next(s.ip_id, true), false), None);
        assert_eq!(id_check(&inc, &next(s.ip_id + 2, false), false), Some(IdMode::Incrementing));
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
