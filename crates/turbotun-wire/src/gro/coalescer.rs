//! The coalescer of GRO: [`Gro`] takes a batch packet by packet, finds each candidate's flow in its flow table
//! (the items of the batch, newest first), merges it into the flow's open item or holds it as a new one, and
//! then writes the headers of every merged packet.

use super::candidate::{address_pair, parse_candidate_into, Cand, Parsed};
use super::flow::Item;
use super::rules::headers_match;
use super::segment::{addr_sum, df_of, ipv4_header_sum_ok, l4_checksum_ok, IdMode, SegmentFields};
use super::{Checksums, GroConfig, GroStats, DEFAULT_UDP_MAX_SEGMENTS, MAX_PACKET_LEN};
use crate::checksum;
use crate::ipv4;
use crate::ipv6;
use crate::tcp;
use crate::udp;
use crate::virtio_net::{flags, gso, VirtioNetHdrRepr, VIRTIO_NET_HDR_LEN};
use crate::Batch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Pass,
    Head(usize),
    Merged,
}

/// Packet `i` of the batch.
fn packet<'a, B: AsRef<[u8]>>(batch: &'a Batch<'_, B>, i: usize) -> &'a [u8] {
    &batch.bufs[i].as_ref()[batch.offset..batch.offset + batch.lens[i]]
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

    /// Coalesces a batch. Packets are `bufs[i][offset .. offset + lens[i]]` of `batch`; `offset >= vnet_hdr_len`
    /// and buffers should have room to grow to `offset + 65535` (a merge that does not fit a buffer is not made).
    /// Merged packets are appended into the flow head's buffer (`lens` updated). Every packet to write gets its
    /// virtio header in `bufs[i][offset - vnet_hdr_len .. offset]` (zeroed if unmerged, or `NEEDS_CSUM` for a
    /// markable packet with [`Checksums::Partial`]). `to_write` is cleared and then filled with the indices to
    /// write, in ascending order.
    ///
    /// `checksums`: what the caller vouches for (`true` for [`Checksums::Valid`]: segments split by us, or
    /// `DATA_VALID`; `false` for [`Checksums::Unverified`]).
    pub fn coalesce<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        batch: &mut Batch<'_, B>,
        checksums: impl Into<Checksums>,
        to_write: &mut Vec<usize>,
    ) -> GroStats {
        let offset = batch.offset;
        let checksums = checksums.into();
        let checksums_valid = checksums.trusted();
        to_write.clear();
        self.items.clear();
        self.slots.clear();
        self.next.clear();
        if self.gather {
            self.next.resize(batch.capacity(), CHAIN_END);
        }
        let n = batch.capacity();
        let vlen = self.config.vnet_hdr_len;
        let mut stats = GroStats { packets: n, ..GroStats::default() };
        let headers_ok = vlen >= VIRTIO_NET_HDR_LEN && offset >= vlen;
        let (tcp_on, udp_on) = (self.config.tcp && headers_ok, self.config.udp && headers_ok);
        let mut cand = Cand::EMPTY;
        for i in 0..n {
            self.slots.push(Slot::Pass);
            let buf_len = batch.bufs[i].as_ref().len();
            if !headers_ok || !offset.checked_add(batch.lens[i]).is_some_and(|e| e <= buf_len) {
                stats.malformed += 1;
                continue;
            }
            if self.fast_path && checksums_valid && self.try_fast_append(i, batch) {
                stats.coalesced += 1;
                continue;
            }
            let pkt = packet(batch, i);
            match parse_candidate_into(pkt, self.config.framing, tcp_on, udp_on, &mut cand) {
                Parsed::Transport => self.insert(i, &cand, batch, checksums_valid, &mut stats),
                Parsed::Stopped { udp_barrier: true } => self.udp_barrier(pkt),
                Parsed::Stopped { udp_barrier: false } => {}
            }
        }
        let Batch { bufs, lens, .. } = batch;
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
    fn fits<B: AsRef<[u8]>>(&self, k: usize, new_len: usize, batch: &Batch<'_, B>) -> bool {
        let it = &self.items[k];
        // Gather mode writes only headers into the head's buffer, so its size does not limit the merge.
        new_len - it.layout.l3 <= MAX_PACKET_LEN
            && (self.gather || batch.bufs[it.buf].as_ref().len() >= batch.offset + new_len)
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
    fn try_fast_append<B: AsMut<[u8]> + AsRef<[u8]>>(&mut self, i: usize, batch: &mut Batch<'_, B>) -> bool {
        let Some(k) = self.items.len().checked_sub(1) else {
            return false;
        };
        let it = &self.items[k];
        if it.closed || !it.verified {
            return false;
        }
        let l = it.layout;
        let offset = batch.offset;
        let pkt = packet(batch, i);
        let head = &batch.bufs[it.buf].as_ref()[offset..offset + l.hdr_len];
        // The full path stops a packet whose IPv4 header checksum fails before the transport layer.
        if !headers_match(head, pkt, &l) || (!l.v6 && !ipv4_header_sum_ok(&pkt[l.l3..])) {
            return false;
        }
        let seg = SegmentFields::read(pkt, &l);
        let Some(id_mode) = it.accepts(&seg, df_of(pkt, &l), self.udp_max_segments) else {
            return false;
        };
        let new_len = self.grown_len(k, batch.lens, seg.payload_len);
        if !self.fits(k, new_len, batch) {
            return false;
        }
        self.append(k, i, l.hdr_len, seg.payload_len, new_len, batch);
        self.count_merge(k, seg.payload_len, seg.flags, id_mode);
        true
    }

    /// The open item of packet `i`'s flow (parsed as `c`): the newest open item with its flow key whose IPv6
    /// extension headers, if any, are the packet's byte for byte.
    #[inline]
    fn find_open<B: AsRef<[u8]>>(&self, hash: u64, c: &Cand, batch: &Batch<'_, B>, i: usize) -> Option<usize> {
        (0..self.items.len()).rev().find(|&k| {
            let it = &self.items[k];
            !it.closed && it.hash == hash && it.key == c.key && {
                let ext = c.layout.l3 + ipv6::HEADER_LEN..c.layout.l4;
                c.key.ext_len == 0 || packet(batch, it.buf)[ext.clone()] == packet(batch, i)[ext]
            }
        })
    }

    /// Merges packet `i` (parsed as `c`) into its flow's open item, or closes that item and makes the packet the
    /// head of a new one (if it may be held), or lets it pass alone.
    #[inline]
    fn insert<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        i: usize,
        c: &Cand,
        batch: &mut Batch<'_, B>,
        checksums_valid: bool,
        stats: &mut GroStats,
    ) {
        let hash = c.key.hash();
        let mut pkt_ok: Option<bool> = if checksums_valid { Some(true) } else { None };
        if let Some(k) = self.find_open(hash, c, batch, i) {
            match self.try_merge(k, i, c, batch, &mut pkt_ok, stats) {
                Attempt::Merged | Attempt::BadPacket => return,
                Attempt::Refused | Attempt::BadItem => {}
            }
        }
        if !c.seg.holdable() {
            return;
        }
        self.slots[i] = Slot::Head(self.items.len());
        self.items.push(Item::first(c, hash, i, batch.lens[i], pkt_ok == Some(true)));
    }

    /// Packet `i` of the flow of open item `k`: merged, or the item closed. Checksums are verified only here, as
    /// a packet meets an item: the item's (if not yet verified) and the packet's (cached in `pkt_ok`).
    #[inline]
    fn try_merge<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        k: usize,
        i: usize,
        c: &Cand,
        batch: &mut Batch<'_, B>,
        pkt_ok: &mut Option<bool>,
        stats: &mut GroStats,
    ) -> Attempt {
        if !self.items[k].verified {
            let it = &self.items[k];
            let l = it.layout;
            let head = packet(batch, it.buf);
            if !l4_checksum_ok(&head[l.l4..], addr_sum(head, &l), l.udp, l.v6) {
                self.items[k].closed = true;
                stats.bad_checksum += 1;
                return Attempt::BadItem;
            }
            self.items[k].verified = true;
        }
        let l = c.layout;
        if !*pkt_ok.get_or_insert_with(|| {
            let pkt = packet(batch, i);
            l4_checksum_ok(&pkt[l.l4..], addr_sum(pkt, &l), l.udp, l.v6)
        }) {
            stats.bad_checksum += 1;
            return Attempt::BadPacket;
        }
        let it = &self.items[k];
        let pkt = packet(batch, i);
        let head = &batch.bufs[it.buf].as_ref()[batch.offset..batch.offset + it.layout.hdr_len];
        let verdict = if headers_match(head, pkt, &it.layout) {
            it.accepts(&c.seg, df_of(pkt, &l), self.udp_max_segments)
        } else {
            None
        };
        let new_len = self.grown_len(k, batch.lens, c.seg.payload_len);
        match verdict.filter(|_| self.fits(k, new_len, batch)) {
            Some(id_mode) => {
                self.append(k, i, l.hdr_len, c.seg.payload_len, new_len, batch);
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
    #[inline]
    fn append<B: AsMut<[u8]> + AsRef<[u8]>>(
        &mut self,
        k: usize,
        i: usize,
        hdr_len: usize,
        payload_len: usize,
        new_len: usize,
        batch: &mut Batch<'_, B>,
    ) {
        let Batch { bufs, lens, offset } = batch;
        let offset = *offset;
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
            let st = g.coalesce(&mut Batch::new(&mut bufs, &mut lens, 10), false, &mut tw);
            assert_eq!((st.written, st.coalesced, st.tcp_super_packets), (1, 31, 1));
            caps.push((g.items.capacity(), g.slots.capacity(), g.items.as_ptr(), g.slots.as_ptr()));
        }
        assert!(caps.windows(2).all(|w| w[0] == w[1]), "{caps:?}");
    }
}
