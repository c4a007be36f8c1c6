//! GRO: coalesce a batch of TCP or UDP packets per flow into super-packets for one `write()` each to a TUN/TAP
//! device with a virtio_net_hdr.
//!
//! The merge decision is the kernel's (`tcp_gro_receive`, `udp_gro_receive_segment`, `inet_gro_receive`,
//! `ipv6_gro_receive`; see `docs/OFFLOAD.md`), applied to the batch in order:
//!
//! - A flow (layer-2 header on TAP, addresses, IPv6 flow label, protocol, ports) has at most one open item. A
//!   packet of the flow either merges into it or closes it; a packet that did not merge becomes the flow's new
//!   open item if it may be held, and passes through alone otherwise.
//! - A packet stops before the transport layer, and touches no item, when it is not IP, has IPv4 options, is a
//!   fragment, has a bad IPv4 header checksum, has IPv6 extension headers, or its transport header is
//!   incomplete; so does a packet whose L4 checksum fails verification.
//! - TCP merges when the flag word (data offset, reserved bits, flags but CWR/FIN/PSH, window), the ACK number and
//!   the option bytes equal the item's, the packet carries no CWR, its payload is 1 to `gso_size` bytes and it
//!   continues the item's sequence; IPv4 TOS, TTL and DF (IPv6 traffic class and hop limit) must be equal and
//!   the IPv4 ID must increment by one per segment or stay fixed with DF set. FIN and PSH merge as the last
//!   segment and are carried by the super-packet; a segment shorter than `gso_size` is the last too. A packet
//!   with URG, PSH, RST, SYN or FIN, or without payload, is never held. A CWR packet may be held: the segments
//!   after it merge, and the super-packet is written with `VIRTIO_NET_HDR_GSO_ECN`.
//! - UDP merges a datagram no larger than the item's first, the same IP fields as TCP, up to
//!   [`Gro::udp_max_segments`] segments; a shorter one is the last.
//! - An IP packet is at most 65,535 bytes.
//!
//! Two deliberate differences, both of which only merge less: a UDP datagram never joins an item behind a
//! packet of the same addresses that could not merge (a fragment written between them would otherwise be
//! overtaken, which UDP cannot repair), and an IPv4 UDP checksum of 0 ("none") may coalesce, which the kernel
//! refuses (that would disable GRO for VXLAN). IPv6 extension headers, which the kernel skips when they are
//! identical, stop a packet here.
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

/// What makes two packets the same flow, as the kernel's GRO tells flows apart: the layer-2 header (TAP), the
/// addresses, the IPv6 flow label, the protocol and the ports. Everything else that must agree for a merge is in
/// [`Fields`]: a difference there closes the flow's item instead of starting another flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlowKey {
    l2: [u8; ethernet::MAX_HEADER_LEN],
    l2_len: u8,
    addrs: [u8; 32],
    ports: u32,
    flow_label: u32,
    v6: bool,
    udp: bool,
}

impl FlowKey {
    const EMPTY: FlowKey = FlowKey {
        l2: [0; ethernet::MAX_HEADER_LEN],
        l2_len: 0,
        addrs: [0; 32],
        ports: 0,
        flow_label: 0,
        v6: false,
        udp: false,
    };

    fn hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ ((self.v6 as u64) << 1 | self.udp as u64);
        for c in self.addrs.chunks_exact(8) {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            h = (h ^ u64::from_ne_bytes(a)).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(23);
        }
        if self.l2_len > 0 {
            // The MAC addresses (the first 12 bytes) tell TAP flows apart; the rest is compared, not hashed.
            let mut a = [0u8; 8];
            a.copy_from_slice(&self.l2[4..12]);
            h = (h ^ u64::from_ne_bytes(a)).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(23);
        }
        h = (h ^ ((self.ports as u64) << 32 | self.flow_label as u64)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29)
    }
}

/// Header fields that must equal the flow's item for a merge (beyond the flow key and the option bytes): the
/// kernel's network-layer flush rules and TCP's flag word and ACK number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fields {
    /// IPv4 TOS or IPv6 traffic class, ECN bits included.
    tos: u8,
    /// IPv4 TTL or IPv6 hop limit.
    ttl: u8,
    /// IPv4 DF.
    df: bool,
    /// TCP bytes 12..16 (data offset, reserved bits, flags, window) without CWR, FIN and PSH; 0 for UDP.
    tcp_word: u32,
    /// TCP ACK number; 0 for UDP.
    ack: u32,
}

/// TCP flags that may differ between the segments of one super-packet (`tcp_gro_receive`'s mask): CWR is only on
/// the first, FIN and PSH only on the last.
const TCP_WORD_FREE_FLAGS: u8 = tcp::flags::CWR | tcp::flags::FIN | tcp::flags::PSH;
/// TCP flags that keep a packet from being held: it is written alone (after merging, for FIN and PSH).
const TCP_NOT_HELD: u8 = tcp::flags::URG | tcp::flags::PSH | tcp::flags::RST | tcp::flags::SYN | tcp::flags::FIN;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdMode {
    Unknown,
    Incrementing,
    Fixed,
}

/// A packet that reached the transport layer: everything the merge decision looks at.
#[derive(Debug, Clone, Copy)]
struct Cand {
    key: FlowKey,
    fields: Fields,
    opts: [u8; 40],
    opts_len: u8,
    l3: usize,
    l4: usize,
    hdr_len: usize,
    payload_len: usize,
    addr_sum: u32,
    seq: u32,
    /// TCP flags (0 for UDP).
    flags: u8,
    ident: u16,
    /// Whether the IP layer let it through unflagged: IP length equal to the packet's, IPv4 reserved bit clear,
    /// and a payload. A packet that is not sound reaches the transport layer (and closes its flow's item) but
    /// neither merges nor is held.
    sound: bool,
}

impl Cand {
    const EMPTY: Cand = Cand {
        key: FlowKey::EMPTY,
        fields: Fields { tos: 0, ttl: 0, df: false, tcp_word: 0, ack: 0 },
        opts: [0; 40],
        opts_len: 0,
        l3: 0,
        l4: 0,
        hdr_len: 0,
        payload_len: 0,
        addr_sum: 0,
        seq: 0,
        flags: 0,
        ident: 0,
        sound: false,
    };

    /// Whether it may start an item (the kernel holds it for later packets to merge into).
    fn holdable(&self) -> bool {
        self.sound && self.flags & TCP_NOT_HELD == 0
    }
}

#[derive(Debug, Clone, Copy)]
struct Item {
    hash: u64,
    /// Gather mode: the last member of the chain (the first is `buf`) and the coalesced length.
    last: usize,
    vlen: usize,
    /// The head packet.
    c: Cand,
    buf: usize,
    gso_size: usize,
    segs: usize,
    payload_total: usize,
    /// FIN and PSH of the merged segments, carried by the super-packet.
    or_flags: u8,
    id_mode: IdMode,
    verified: bool,
    /// No further packet merges: completed (after a short, FIN or PSH segment), refused a packet of its flow, or
    /// its own checksum failed.
    closed: bool,
}

impl Item {
    /// A flow's first packet, `c` in buffer `buf` of length `len` (not verified, open).
    fn first(c: &Cand, hash: u64, buf: usize, len: usize) -> Item {
        Item {
            hash,
            last: buf,
            vlen: len,
            c: *c,
            buf,
            gso_size: c.payload_len,
            segs: 1,
            payload_total: c.payload_len,
            or_flags: 0,
            id_mode: IdMode::Unknown,
            verified: false,
            closed: false,
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

/// How far the parser got with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parsed {
    /// It reached the transport layer of a kind being coalesced: `Cand` describes it.
    Transport,
    /// It stopped before (not IP, IPv4 options, a fragment, a bad IPv4 header checksum, IPv6 extension headers,
    /// an incomplete or bad transport header, a kind not coalesced). `udp_barrier`: it is not TCP, so a UDP
    /// datagram behind it must not join an item in front of it (see the module documentation).
    Stopped { udp_barrier: bool },
}

#[cfg(test)]
fn parse_candidate(pkt: &[u8], framing: Framing, tcp_on: bool, udp_on: bool) -> Option<Cand> {
    let mut c = Cand::EMPTY;
    (parse_candidate_into(pkt, framing, tcp_on, udp_on, &mut c) == Parsed::Transport && c.sound).then_some(c)
}

/// The source and destination addresses of an IP packet, laid out as in [`FlowKey::addrs`], and whether it is
/// IPv6; `None` if it is not IP or too short for its header.
fn address_pair(pkt: &[u8], framing: Framing) -> Option<([u8; 32], bool)> {
    let (l3, ethertype) = match framing {
        Framing::Ip => (0, None),
        Framing::Ethernet => {
            let f = ethernet::Frame::new_checked(pkt).ok()?;
            (f.header_len(), Some(f.inner_ethertype()))
        }
    };
    let ip = pkt.get(l3..)?;
    let mut addrs = [0u8; 32];
    match ip.first()? >> 4 {
        4 if ethertype.map_or(true, |e| e == ethernet::ETHERTYPE_IPV4) => {
            let p = ipv4::Packet::new_checked(ip).ok()?;
            addrs[..4].copy_from_slice(&p.src_addr());
            addrs[16..20].copy_from_slice(&p.dst_addr());
            Some((addrs, false))
        }
        6 if ethertype.map_or(true, |e| e == ethernet::ETHERTYPE_IPV6) => {
            let p = ipv6::Packet::new_checked(ip).ok()?;
            addrs[..16].copy_from_slice(&p.src_addr());
            addrs[16..].copy_from_slice(&p.dst_addr());
            Some((addrs, true))
        }
        _ => None,
    }
}

/// Parses `pkt` into `c` (reused across packets, so that the ~250-byte candidate is written in place rather
/// than built and moved with `memcpy` per packet). Every field that is compared whole is reset; `opts` is only
/// ever compared up to `opts_len`, which is set.
#[inline(always)]
fn parse_candidate_into(pkt: &[u8], framing: Framing, tcp_on: bool, udp_on: bool, c: &mut Cand) -> Parsed {
    const STOPPED: Parsed = Parsed::Stopped { udp_barrier: true };
    c.key = FlowKey::EMPTY;
    c.fields = Cand::EMPTY.fields;
    c.flags = 0;
    c.seq = 0;
    c.opts_len = 0;
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
            c.key.l2_len = hl as u8;
            (hl, Some(version))
        }
    };
    let ip = &pkt[l3..];
    let Some(&first) = ip.first() else { return STOPPED };
    if version.is_some_and(|v| v != first >> 4) {
        return STOPPED;
    }
    // Whether the IP layer flags the packet (it still reaches the transport layer, where it closes its flow's
    // item, but it neither merges nor is held): a length that is not the packet's, the IPv4 reserved bit.
    let (proto, l4, addr_sum, ident, ip_sound) = match first >> 4 {
        4 => {
            let Ok(p) = ipv4::Packet::new_checked(ip) else { return STOPPED };
            if p.header_len() != ipv4::MIN_HEADER_LEN || p.is_fragment() || !p.verify_checksum() {
                return Parsed::Stopped { udp_barrier: p.protocol() != IPPROTO_TCP };
            }
            c.key.addrs[..4].copy_from_slice(&p.src_addr());
            c.key.addrs[16..20].copy_from_slice(&p.dst_addr());
            c.fields.tos = p.tos();
            c.fields.ttl = p.ttl();
            c.fields.df = p.dont_frag();
            let sound = p.total_len() as usize == ip.len() && p.flags_frag() & ipv4::FLAG_RESERVED == 0;
            let sum = checksum::pseudo_header_v4(p.src_addr(), p.dst_addr(), p.protocol(), 0);
            (p.protocol(), l3 + ipv4::MIN_HEADER_LEN, sum, p.ident(), sound)
        }
        6 => {
            let Ok(p) = ipv6::Packet::new_checked(ip) else { return STOPPED };
            c.key.v6 = true;
            c.key.addrs[..16].copy_from_slice(&p.src_addr());
            c.key.addrs[16..].copy_from_slice(&p.dst_addr());
            c.key.flow_label = p.flow_label();
            c.fields.tos = p.traffic_class();
            c.fields.ttl = p.hop_limit();
            let sound = p.payload_len() as usize + ipv6::HEADER_LEN == ip.len();
            let sum = checksum::pseudo_header_v6(p.src_addr(), p.dst_addr(), p.next_header(), 0);
            (p.next_header(), l3 + ipv6::HEADER_LEN, sum, 0, sound)
        }
        _ => return STOPPED,
    };
    if pkt.len() - l3 > MAX_PACKET_LEN {
        return Parsed::Stopped { udp_barrier: proto != IPPROTO_TCP };
    }
    let l4b = &pkt[l4..];
    (c.l3, c.l4, c.addr_sum, c.ident) = (l3, l4, addr_sum, ident);
    match proto {
        IPPROTO_TCP if tcp_on => {
            let Ok(t) = tcp::Packet::new_checked(l4b) else { return Parsed::Stopped { udp_barrier: false } };
            let hl = t.header_len();
            c.hdr_len = l4 + hl;
            c.payload_len = l4b.len() - hl;
            c.key.ports = (t.src_port() as u32) << 16 | t.dst_port() as u32;
            c.fields.ack = t.ack_number();
            let word = u32::from_be_bytes([l4b[12], l4b[13], l4b[14], l4b[15]]);
            c.fields.tcp_word = word & !(u32::from(TCP_WORD_FREE_FLAGS) << 16);
            c.opts_len = (hl - tcp::MIN_HEADER_LEN) as u8;
            crate::small_copy::copy(&mut c.opts[..hl - tcp::MIN_HEADER_LEN], t.options());
            c.seq = t.seq_number();
            c.flags = t.flags();
            c.sound = ip_sound && c.payload_len > 0;
            Parsed::Transport
        }
        IPPROTO_UDP if udp_on => {
            let Ok(u) = udp::Packet::new_checked(l4b) else { return STOPPED };
            if !ip_sound || u.len() as usize != l4b.len() || l4b.len() == udp::HEADER_LEN {
                return STOPPED;
            }
            c.key.udp = true;
            c.hdr_len = l4 + udp::HEADER_LEN;
            c.payload_len = l4b.len() - udp::HEADER_LEN;
            c.key.ports = (u.src_port() as u32) << 16 | u.dst_port() as u32;
            c.sound = true;
            Parsed::Transport
        }
        _ => Parsed::Stopped { udp_barrier: proto != IPPROTO_TCP },
    }
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

/// IPv4 ID rule (`inet_gro_flush`): the ID of segment `n` is the first's plus `n`, or every ID equals the first
/// with DF set; the second segment decides which, and the two never mix.
fn id_check(it: &Item, c: &Cand) -> Option<IdMode> {
    if c.key.v6 {
        return Some(it.id_mode);
    }
    let first = it.c.ident;
    if c.ident == first.wrapping_add(it.segs as u16) && it.id_mode != IdMode::Fixed {
        return Some(IdMode::Incrementing);
    }
    if c.ident == first && c.df() && it.id_mode != IdMode::Incrementing {
        return Some(IdMode::Fixed);
    }
    None
}

impl Cand {
    fn df(&self) -> bool {
        self.fields.df
    }
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

    /// A packet that could not merge, and is not TCP, between two UDP datagrams of the same addresses is a
    /// barrier for UDP: no later datagram may join one before it, or it would be written first (a fragmented
    /// datagram overtaken by the next one; UDP keeps no sequence to restore the order). TCP merges across it as
    /// the kernel's GRO does (the receiver reorders by sequence number).
    fn udp_barrier(&mut self, pkt: &[u8]) {
        if let Some((addrs, v6)) = address_pair(pkt, self.config.framing) {
            let same = |it: &&mut Item| it.c.key.udp && it.c.key.v6 == v6 && it.c.key.addrs == addrs;
            for it in self.items.iter_mut().filter(same) {
                it.closed = true;
            }
        }
    }

    /// The fast path for the common case, the next TCP segment of the flow the newest item holds: if packet `i`
    /// has the head's header bytes except for the fields that change from segment to segment (IP length, IPv4
    /// ID and header checksum, TCP sequence number, PSH and checksum), carries no CWR, continues the item's
    /// sequence and obeys the same size and ID rules, it is appended without being parsed into a candidate.
    /// Those conditions imply everything [`parse_candidate_into`] and [`Gro::can_merge`] would check for the
    /// newest item, the open item of the packet's flow, so the outcome is the same; anything else (a changed
    /// window, another flow, a gap) returns `false` and takes the full path. Trusted checksums only.
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
        if it.closed || !it.verified || it.c.key.udp {
            return false;
        }
        let c = &it.c;
        let (l3, l4, hl, len) = (c.l3, c.l4, c.hdr_len, lens[i]);
        if len <= hl || len - hl > it.gso_size {
            return false;
        }
        let payload_len = len - hl;
        let new_len = if self.gather { it.vlen } else { lens[it.buf] } + payload_len;
        if new_len - l3 > MAX_PACKET_LEN || (!self.gather && bufs[it.buf].as_ref().len() < offset + new_len) {
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
            } else if ident == c.ident && c.df() && it.id_mode != IdMode::Incrementing {
                IdMode::Fixed
            } else {
                return false;
            }
        };
        let (t, ht) = (&pkt[l4..hl], &head[l4..hl]);
        // Ports; ACK number, data offset and reserved bits, flags but PSH (the head has none: an open item), window;
        // urgent pointer; options. A CWR packet never merges, even behind a CWR head.
        let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
        if !same_masked(t, ht, 0, TCP_WORD0)
            || !same_masked(t, ht, 8, TCP_WORD1)
            || t[13] & tcp::flags::CWR != 0
            || t[18..20] != ht[18..20]
            || (t.len() > tcp::MIN_HEADER_LEN && t[tcp::MIN_HEADER_LEN..] != ht[tcp::MIN_HEADER_LEN..])
            || seq != c.seq.wrapping_add(it.payload_total as u32)
        {
            return false;
        }
        let flags = t[13];
        self.append(k, i, hl, payload_len, new_len, bufs, lens, offset);
        self.count_merge(k, payload_len, flags, id_mode);
        true
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
        let open = (0..self.items.len())
            .rev()
            .find(|&k| !self.items[k].closed && self.items[k].hash == hash && self.items[k].c.key == c.key);
        if let Some(k) = open {
            match self.try_merge(k, i, c, bufs, lens, offset, &mut pkt_ok, stats) {
                Attempt::Merged | Attempt::BadPacket => return,
                Attempt::Refused | Attempt::BadItem => {}
            }
        }
        if !c.holdable() {
            return;
        }
        self.slots[i] = Slot::Head(self.items.len());
        self.items.push(Item { verified: pkt_ok == Some(true), ..Item::first(c, hash, i, lens[i]) });
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
            if !l4_checksum_ok(packet(bufs, lens, it.buf, offset), &it.c) {
                self.items[k].closed = true;
                stats.bad_checksum += 1;
                return Attempt::BadItem;
            }
            self.items[k].verified = true;
        }
        if !*pkt_ok.get_or_insert_with(|| l4_checksum_ok(packet(bufs, lens, i, offset), c)) {
            stats.bad_checksum += 1;
            return Attempt::BadPacket;
        }
        let it = &self.items[k];
        let new_len = if self.gather { it.vlen } else { lens[it.buf] } + c.payload_len;
        // Gather mode writes only headers into the head's buffer, so its size does not limit the merge.
        let fits = new_len - c.l3 <= MAX_PACKET_LEN && (self.gather || bufs[it.buf].as_ref().len() >= offset + new_len);
        match self.can_merge(it, c).filter(|_| fits) {
            Some(id_mode) => {
                self.append(k, i, c.hdr_len, c.payload_len, new_len, bufs, lens, offset);
                self.count_merge(k, c.payload_len, c.flags, id_mode);
                stats.coalesced += 1;
                Attempt::Merged
            }
            None => {
                self.items[k].closed = true;
                Attempt::Refused
            }
        }
    }

    /// What every merge into item `k` adds: a segment of `payload_len` bytes with TCP `flags`, the IPv4 ID rule it
    /// followed. A short segment, FIN or PSH completes the item.
    #[inline]
    fn count_merge(&mut self, k: usize, payload_len: usize, flags: u8, id_mode: IdMode) {
        let it = &mut self.items[k];
        it.payload_total += payload_len;
        it.segs += 1;
        it.id_mode = id_mode;
        let last_flags = flags & (tcp::flags::FIN | tcp::flags::PSH);
        it.or_flags |= last_flags;
        let full = it.c.key.udp && it.segs >= self.udp_max_segments;
        if payload_len < it.gso_size || last_flags != 0 || full {
            it.closed = true;
        }
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

    /// Whether packet `c` may be appended to open item `it` of its flow (the kernel's `tcp_gro_receive` /
    /// `udp_gro_receive_segment` and the network-layer flush rules), and the IPv4 ID rule it follows.
    fn can_merge(&self, it: &Item, c: &Cand) -> Option<IdMode> {
        if !c.sound || c.flags & tcp::flags::CWR != 0 || c.payload_len > it.gso_size {
            return None;
        }
        let opts = usize::from(c.opts_len);
        if it.c.fields != c.fields || it.c.opts_len != c.opts_len || it.c.opts[..opts] != c.opts[..opts] {
            return None;
        }
        if c.key.udp {
            if it.segs >= self.udp_max_segments {
                return None;
            }
        } else if c.seq != it.c.seq.wrapping_add(it.payload_total as u32) {
            return None;
        }
        id_check(it, c)
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
            let f = t.flags();
            t.set_flags(f | it.or_flags);
            t.set_checksum(pseudo);
            // A CWR head: the kernel splits it with CWR on the first segment only (`SKB_GSO_TCP_ECN`).
            let ecn = if f & tcp::flags::CWR != 0 { gso::ECN } else { 0 };
            (if c.key.v6 { gso::TCPV6 } else { gso::TCPV4 } | ecn, tcp::CHECKSUM_OFFSET)
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
        assert_eq!(id_check(&it, &next(s.ip_id + 1, true)), Some(IdMode::Incrementing));
        assert_eq!(id_check(&it, &next(s.ip_id, true)), Some(IdMode::Fixed));
        assert_eq!(id_check(&it, &next(s.ip_id, false)), None);
        assert_eq!(id_check(&it, &next(s.ip_id + 2, true)), None);
        let fixed = Item { id_mode: IdMode::Fixed, segs: 2, ..it };
        assert_eq!(id_check(&fixed, &next(s.ip_id + 2, true)), None);
        assert_eq!(id_check(&fixed, &next(s.ip_id, true)), Some(IdMode::Fixed));
        let inc = Item { id_mode: IdMode::Incrementing, segs: 2, ..it };
        assert_eq!(id_check(&inc, &next(s.ip_id, true)), None);
        assert_eq!(id_check(&inc, &next(s.ip_id + 2, false)), Some(IdMode::Incrementing));
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
