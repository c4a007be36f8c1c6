//! The segment rules of GRO: the fields that change from segment to segment ([`SegmentFields`]), the IPv4 ID
//! rule ([`ipv4_id_rule`]) and the checksum checks ([`l4_checksum_ok`], [`ipv4_header_sum_ok`]). What an item
//! accepts of a segment by them is `flow::Item::accepts`; the candidate parser reads `SegmentFields` here, and
//! nothing here reads a candidate.

use super::rules::Layout;
use crate::checksum;
use crate::ipv4;
use crate::ipv6;
use crate::tcp;
use crate::udp;
use crate::{IPPROTO_TCP, IPPROTO_UDP};

/// The fields of a packet that change from segment to segment (role `PerSegment`), and what the segment rules
/// make of them.
#[derive(Debug, Clone, Copy)]
pub(super) struct SegmentFields {
    pub(super) payload_len: usize,
    /// TCP sequence number (0 for UDP).
    pub(super) seq: u32,
    /// TCP flags (0 for UDP).
    pub(super) flags: u8,
    /// IPv4 ID (0 for IPv6).
    pub(super) ident: u16,
    /// Whether the IP layer lets it through unflagged: its IP length is the packet's, the IPv4 reserved bit is
    /// clear, it has a payload. A packet that is not sound reaches the transport layer (and closes its flow's
    /// item) but neither merges nor is held.
    pub(super) sound: bool,
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
    pub(super) const EMPTY: SegmentFields = SegmentFields { payload_len: 0, seq: 0, flags: 0, ident: 0, sound: false };

    /// Reads them from `pkt` laid out as `l` (the caller has checked that `pkt` holds `l.hdr_len` bytes).
    #[inline(always)]
    pub(super) fn read(pkt: &[u8], l: &Layout) -> SegmentFields {
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
    pub(super) fn holdable(&self) -> bool {
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
pub(super) fn addr_sum(pkt: &[u8], l: &Layout) -> u32 {
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

/// Whether the IPv4 header at `l3` of `pkt` has DF set (false for IPv6).
#[inline(always)]
pub(super) fn df_of(pkt: &[u8], l: &Layout) -> bool {
    !l.v6 && pkt[l.l3 + 6] & (ipv4::FLAG_DF >> 8) as u8 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
