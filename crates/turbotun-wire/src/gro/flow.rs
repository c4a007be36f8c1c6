//! One flow's coalescing: an [`Item`] (the head of a merge and what it accepts of the next segment, by the segment
//! rules) and a [`FlowRun`] (one flow coalesced in order, for the tunnel coalescer). Above both the candidate parser
//! and the segment rules, which it applies to what the parser found.

use super::candidate::{parse_candidate_into, Cand, Parsed};
use super::rules::{headers_match, FlowKey, Layout};
use super::segment::{addr_sum, df_of, ipv4_header_sum_ok, ipv4_id_rule, l4_checksum_ok, IdMode, SegmentFields};
use crate::tcp;
use crate::Framing;

/// What the coalescer holds of a flow's open (or closed) item. The fields the fast path reads come first, the
/// flow key last (`repr(C)` keeps that order, so that the next segment of a stream touches one cache line).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(super) struct Item {
    /// No further packet merges: completed (after a short, FIN or PSH segment), refused a packet of its flow, or
    /// its own checksum failed.
    pub(super) closed: bool,
    pub(super) verified: bool,
    /// FIN and PSH of the merged segments, carried by the super-packet.
    pub(super) or_flags: u8,
    pub(super) id_mode: IdMode,
    pub(super) layout: Layout,
    /// The head packet's segment fields.
    pub(super) head: SegmentFields,
    pub(super) buf: usize,
    /// Gather mode: the last member of the chain (the first is `buf`) and the coalesced length.
    pub(super) last: usize,
    pub(super) vlen: usize,
    pub(super) gso_size: usize,
    pub(super) segs: usize,
    pub(super) payload_total: usize,
    pub(super) hash: u64,
    pub(super) key: FlowKey,
}

impl Item {
    /// A flow's first packet, `c` in buffer `buf` of length `len` (open).
    pub(super) fn first(c: &Cand, hash: u64, buf: usize, len: usize, verified: bool) -> Item {
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
    pub(super) fn accepts(&self, s: &SegmentFields, df: bool, udp_max_segments: usize) -> Option<IdMode> {
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
    pub(super) fn merged(&mut self, payload_len: usize, flags: u8, id_mode: IdMode, udp_max_segments: usize) {
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
/// comparison ([`headers_match`]) and segment rules ([`Item::accepts`]) as [`Gro`](super::Gro); checksums are always
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
