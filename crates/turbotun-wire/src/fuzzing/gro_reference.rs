//! A reference model of the kernel's GRO merge decision, written apart from `gro.rs` and as plainly as the kernel
//! states it, for the property tests and the fuzz target to hold [`crate::Gro`] against: which packets of a batch
//! end up in which coalesced packet, in which order. It reads the packets with its own parsing and checksum
//! ([`super::reference_wire`]), never with the crate's header views or checksum code, so that a bug there
//! cannot hide in both the code and its oracle.
//!
//! It follows Linux 6.18: `dev_gro_receive` with one held packet per flow, `inet_gro_receive`/`ipv6_gro_receive`
//! (`ipv6_gro_pull_exthdrs`, `inet_gro_flush`, `ipv6_gro_flush`), `tcp_gro_receive` and
//! `udp_gro_receive_segment`. The places where turbotun decides otherwise on purpose are switches
//! ([`Differences`]): [`reference_groups`] is the model with turbotun's, [`reference_groups_with`] with any, and
//! [`Differences::NONE`] is the kernel.

use super::reference_wire::{be16, be32, ip_start, ones_complement_sum, tcp_flag, transport_checksum_ok};
use super::reference_wire::{PROTO_TCP, PROTO_UDP};
use crate::gro::{Checksums, GroConfig};
use crate::Framing;

/// The longest IP packet a coalesced packet may become: the most an IPv4 total length or an IPv6 payload length
/// plus its header can describe without a jumbogram.
const MAX_MERGED_IP_LEN: usize = 65535;

/// The places where turbotun's coalescer decides otherwise than Linux 6.18, on purpose (docs/OFFLOAD.md, "Where
/// turbotun differs from Linux 6.18, on purpose").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Differences {
    /// A packet that stops before the transport layer and is not TCP closes the UDP items of its addresses (the
    /// kernel keeps them open, and a datagram behind a fragment can overtake it).
    pub udp_barrier: bool,
    /// An IPv4 UDP checksum of 0 ("none") counts as valid and may merge (the kernel passes such a datagram on
    /// alone, touching no held packet).
    pub udp_zero_checksum_merges: bool,
    /// A fixed IPv4 ID merges only with DF set (Linux 6.18 merges it whatever DF says).
    pub fixed_id_needs_df: bool,
    /// A routing header with segments left, or a chain of more than 8 extension headers, stops a packet before
    /// the transport layer (the kernel walks them, and checks a checksum against the header's destination).
    pub unusual_extension_headers_stop: bool,
}

impl Differences {
    /// What turbotun's `Gro` does.
    pub const TURBOTUN: Differences = Differences {
        udp_barrier: true,
        udp_zero_checksum_merges: true,
        fixed_id_needs_df: true,
        unusual_extension_headers_stop: true,
    };
    /// None: the kernel's decision.
    pub const NONE: Differences = Differences {
        udp_barrier: false,
        udp_zero_checksum_merges: false,
        fixed_id_needs_df: false,
        unusual_extension_headers_stop: false,
    };
}

/// The extension headers the kernel's GRO walks (`INET6_PROTO_GSO_EXTHDR`): hop-by-hop, routing, destination
/// options. Anything else ends the walk; only TCP and UDP then go on.
const WALKED_EXTENSION_HEADERS: [u8; 3] = [0, 43, 60];
/// Extension headers turbotun walks at most.
const MAX_WALKED_EXTENSION_HEADERS: usize = 8;

/// One packet as the model sees it.
#[derive(Debug, Clone)]
enum Seen {
    /// Stopped before the transport layer; `barrier`: not TCP (closes the UDP items of its addresses).
    Stopped { addrs: Option<Vec<u8>>, barrier: bool },
    /// Passed on alone before its flow is looked up (a checksum that fails, the kernel's zero UDP checksum).
    Alone,
    /// Reached TCP or UDP.
    Transport(Transport),
}

#[derive(Debug, Clone)]
struct Transport {
    /// Layer-2 header, flow label, IPv6 extension headers, addresses, protocol, ports.
    flow: Vec<u8>,
    addrs: Vec<u8>,
    udp: bool,
    /// IP length right, IPv4 reserved bit clear, a payload (UDP: length field right too).
    sound: bool,
    tos: u8,
    ttl: u8,
    df: bool,
    id: u16,
    v6: bool,
    /// Bytes 12..16 of TCP (data offset, reserved bits, flags, window).
    tcp_word: u32,
    flags: u8,
    ack: u32,
    seq: u32,
    options: Vec<u8>,
    l3_len: usize,
    payload: usize,
    checksum_ok: bool,
}

fn classify(pkt: &[u8], config: &GroConfig, trusted: bool, differences: &Differences) -> Seen {
    let stopped = |addrs: Option<Vec<u8>>, barrier| Seen::Stopped { addrs, barrier };
    let (l2, version) = match config.framing {
        Framing::Ip => (0, None),
        Framing::Ethernet => match ip_start(pkt, Framing::Ethernet) {
            Some((l2, version)) => (l2, Some(version)),
            None => return stopped(None, true),
        },
    };
    let ip = &pkt[l2..];
    // An IP header of another version than the Ethernet type says is no IP packet.
    if version.is_some_and(|v| ip.first().map(|b| b >> 4) != Some(v)) {
        return stopped(None, true);
    }
    let mut flow = pkt[..l2].to_vec();
    let (proto, l4, addrs, sound_ip, tos, ttl, df, id, v6) = match ip.first().map(|b| b >> 4) {
        Some(4) => {
            let header_len = usize::from(ip.first().map_or(0, |b| b & 0x0f)) * 4;
            if ip.len() < 20 || header_len < 20 || ip.len() < header_len {
                return stopped(None, true);
            }
            let addrs = ip[12..20].to_vec();
            let flags_fragment = be16(ip, 6);
            let fragment = flags_fragment & 0x3fff != 0;
            if header_len != 20 || fragment || ones_complement_sum(&[&ip[..20]]) != 0xffff {
                return stopped(Some(addrs), ip[9] != PROTO_TCP);
            }
            let sound = usize::from(be16(ip, 2)) == ip.len() && flags_fragment & 0x8000 == 0;
            let df = flags_fragment & 0x4000 != 0;
            (ip[9], 20, addrs, sound, ip[1], ip[8], df, be16(ip, 4), false)
        }
        Some(6) => {
            if ip.len() < 40 {
                return stopped(None, true);
            }
            let addrs = ip[8..40].to_vec();
            let first_word = be32(ip, 0);
            flow.extend_from_slice(&(first_word & 0x000f_ffff).to_be_bytes());
            // Walk the extension headers; they belong to the flow byte for byte.
            let (mut next, mut at, mut walked) = (ip[6], 40, 0);
            while WALKED_EXTENSION_HEADERS.contains(&next) {
                walked += 1;
                let stop = stopped(Some(addrs.clone()), ip[6] != PROTO_TCP);
                let Some(&units) = ip.get(at + 1) else { return stop };
                let len = (usize::from(units) + 1) * 8;
                if ip.len() < at + len {
                    return stop;
                }
                let segments_left = next == 43 && ip[at + 3] > 0;
                let unusual = segments_left || walked > MAX_WALKED_EXTENSION_HEADERS;
                if unusual && differences.unusual_extension_headers_stop {
                    return stop;
                }
                next = ip[at];
                at += len;
            }
            flow.extend_from_slice(&ip[40..at]);
            let sound = usize::from(be16(ip, 4)) + 40 == ip.len();
            (next, at, addrs, sound, (first_word >> 20) as u8, ip[7], false, 0, true)
        }
        _ => return stopped(None, true),
    };
    if ip.len() > MAX_MERGED_IP_LEN {
        return stopped(Some(addrs), proto != PROTO_TCP);
    }
    flow.extend_from_slice(&addrs);
    flow.push(proto);
    let l4 = &ip[l4..];
    let (src, dst) = (addrs[..addrs.len() / 2].to_vec(), addrs[addrs.len() / 2..].to_vec());
    // The pseudo-header's destination is the IPv6 header's, as the kernel's GRO takes it.
    let verify = |zero_ok: bool| {
        trusted || (zero_ok && l4.len() >= 8 && l4[6..8] == [0, 0]) || transport_checksum_ok(&src, &dst, proto, l4)
    };
    match proto {
        PROTO_TCP if config.tcp => {
            let header_len = usize::from(l4.get(12).map_or(0, |b| b >> 4)) * 4;
            if l4.len() < 20 || header_len < 20 || l4.len() < header_len {
                return stopped(Some(addrs), false);
            }
            flow.extend_from_slice(&l4[..4]);
            let payload = l4.len() - header_len;
            Seen::Transport(Transport {
                flow,
                addrs,
                udp: false,
                sound: sound_ip && payload > 0,
                tos,
                ttl,
                df,
                id,
                v6,
                tcp_word: be32(l4, 12),
                flags: l4[13],
                ack: be32(l4, 8),
                seq: be32(l4, 4),
                options: l4[20..header_len].to_vec(),
                l3_len: ip.len(),
                payload,
                checksum_ok: verify(false),
            })
        }
        PROTO_UDP if config.udp => {
            if l4.len() < 8 || !sound_ip || usize::from(be16(l4, 4)) != l4.len() || l4.len() == 8 {
                return stopped(Some(addrs), true);
            }
            if !v6 && l4[6..8] == [0, 0] && !differences.udp_zero_checksum_merges {
                // udp_gro_receive_segment: "requires non zero csum", before the held packets are looked at.
                return Seen::Alone;
            }
            flow.extend_from_slice(&l4[..4]);
            Seen::Transport(Transport {
                flow,
                addrs,
                udp: true,
                sound: true,
                tos,
                ttl,
                df,
                id,
                v6,
                tcp_word: 0,
                flags: 0,
                ack: 0,
                seq: 0,
                options: Vec::new(),
                l3_len: ip.len(),
                payload: l4.len() - 8,
                checksum_ok: verify(!v6),
            })
        }
        _ => stopped(Some(addrs), proto != PROTO_TCP),
    }
}

/// A coalesced packet being built: the kernel's held packet `p`.
#[derive(Debug)]
struct Held {
    members: Vec<usize>,
    head: Transport,
    mss: usize,
    l3_len: usize,
    fixed_id: Option<bool>,
    open: bool,
}

/// Whether `t` may be appended to `p` (the kernel's merge decision for one packet and one held packet).
fn may_append(p: &Held, t: &Transport, udp_max_segments: usize, differences: &Differences) -> Option<bool> {
    let h = &p.head;
    // tcp_gro_receive's flag word: all of bytes 12..16 but FIN and PSH (CWR too, since Linux 6.17); a segment
    // with CWR never merges.
    let free = u32::from(tcp_flag::FIN | tcp_flag::PSH) << 16;
    let same = t.sound
        && t.flags & tcp_flag::CWR == 0
        && t.tos == h.tos
        && t.ttl == h.ttl
        && t.df == h.df
        && (t.tcp_word ^ h.tcp_word) & !free == 0
        && t.ack == h.ack
        && t.options == h.options
        && t.payload <= p.mss
        && p.l3_len + t.payload <= MAX_MERGED_IP_LEN;
    let continues = if t.udp {
        p.members.len() < udp_max_segments
    } else {
        t.seq == h.seq.wrapping_add((p.l3_len - h.l3_len + h.payload) as u32)
    };
    if !same || !continues {
        return None;
    }
    if t.v6 {
        return Some(p.fixed_id.unwrap_or(false));
    }
    // inet_gro_flush: the second segment decides between an ID fixed at the first's and one going up by one.
    let n = p.members.len() as u16;
    let fixed_allowed = t.df || !differences.fixed_id_needs_df;
    match p.fixed_id {
        None if t.id == h.id.wrapping_add(n) => Some(false),
        None if t.id == h.id && fixed_allowed => Some(true),
        Some(false) if t.id == h.id.wrapping_add(n) => Some(false),
        Some(true) if t.id == h.id && fixed_allowed => Some(true),
        _ => None,
    }
}

/// The coalesced packets the model makes of `pkts` with turbotun's differences ([`Differences::TURBOTUN`]): what
/// [`crate::Gro`] must make. See [`reference_groups_with`].
pub fn reference_groups(
    pkts: &[&[u8]],
    config: &GroConfig,
    udp_max_segments: usize,
    checksums: Checksums,
) -> Vec<Vec<usize>> {
    reference_groups_with(pkts, config, udp_max_segments, checksums, &Differences::TURBOTUN)
}

/// The coalesced packets the model makes of `pkts`: each a list of input indices in segment order, listed by
/// their first index. `udp_max_segments` as [`crate::Gro::with_udp_max_segments`]; `checksums` what the caller
/// vouches for; `differences` which of turbotun's differences from the kernel to apply.
pub fn reference_groups_with(
    pkts: &[&[u8]],
    config: &GroConfig,
    udp_max_segments: usize,
    checksums: Checksums,
    differences: &Differences,
) -> Vec<Vec<usize>> {
    let udp_max_segments = udp_max_segments.max(1);
    let mut done: Vec<Vec<usize>> = Vec::new();
    let mut held: Vec<Held> = Vec::new();
    for (i, pkt) in pkts.iter().enumerate() {
        let t = match classify(pkt, config, checksums.trusted(), differences) {
            Seen::Stopped { addrs, barrier } => {
                if let (true, true, Some(addrs)) = (differences.udp_barrier, barrier, addrs) {
                    for p in held.iter_mut().filter(|p| p.head.udp && p.head.addrs == addrs) {
                        p.open = false;
                    }
                }
                done.push(vec![i]);
                continue;
            }
            Seen::Alone => {
                done.push(vec![i]);
                continue;
            }
            Seen::Transport(t) if !t.checksum_ok => {
                // tcp4_gro_receive / udp_gro_receive: flagged before the flow is looked up.
                done.push(vec![i]);
                continue;
            }
            Seen::Transport(t) => t,
        };
        if let Some(p) = held.iter_mut().find(|p| p.open && p.head.flow == t.flow) {
            if let Some(fixed) = may_append(p, &t, udp_max_segments, differences) {
                p.members.push(i);
                p.l3_len += t.payload;
                p.fixed_id = Some(fixed);
                let last = tcp_flag::FIN | tcp_flag::PSH;
                let full = t.udp && p.members.len() >= udp_max_segments;
                if t.payload < p.mss || t.flags & last != 0 || full {
                    p.open = false;
                }
                continue;
            }
            p.open = false;
        }
        // out_check_final: these end the flow at once. A CWR segment is held, though nothing can merge behind it.
        let not_held = tcp_flag::URG | tcp_flag::PSH | tcp_flag::RST | tcp_flag::SYN | tcp_flag::FIN;
        if t.sound && t.flags & not_held == 0 {
            held.push(Held { members: vec![i], mss: t.payload, l3_len: t.l3_len, head: t, fixed_id: None, open: true });
        } else {
            done.push(vec![i]);
        }
    }
    done.extend(held.into_iter().map(|p| p.members));
    done.sort_by_key(|g| g[0]);
    done
}
