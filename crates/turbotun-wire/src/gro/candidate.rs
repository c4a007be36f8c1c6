//! The candidate parser of GRO: how far a packet gets (it stops before the transport layer, reaches it flagged,
//! or is a candidate, [`parse_candidate_into`]), and what of it the merge decision looks at ([`Cand`]).

use super::rules::{FlowKey, Layout, IPV4_FLOW, IPV6_FLOW, TCP_FLOW_WORD, UDP_FLOW_WORD};
use super::segment::{ipv4_header_sum_ok, SegmentFields};
use super::MAX_PACKET_LEN;
use crate::ethernet;
use crate::ipv4;
use crate::ipv6;
use crate::tcp;
use crate::udp;
use crate::{Framing, IPPROTO_TCP, IPPROTO_UDP};

/// A packet that reached the transport layer: everything the merge decision looks at.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cand {
    pub(super) key: FlowKey,
    pub(super) layout: Layout,
    pub(super) seg: SegmentFields,
}

impl Cand {
    pub(super) const EMPTY: Cand = Cand { key: FlowKey::EMPTY, layout: Layout::EMPTY, seg: SegmentFields::EMPTY };
}

/// How far the parser got with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Parsed {
    /// It reached the transport layer of a kind being coalesced: `Cand` describes it.
    Transport,
    /// It stopped before (not IP, IPv4 options, a fragment, a bad IPv4 header checksum, an IPv6 extension header
    /// GRO does not walk or a routing header with segments left, an incomplete or bad transport header, a kind
    /// not coalesced). `udp_barrier`: it is not TCP, so a UDP datagram behind it must not join an item in front
    /// of it (see the module documentation).
    Stopped { udp_barrier: bool },
}

#[cfg(test)]
fn parse_candidate(pkt: &[u8], framing: Framing, tcp_on: bool, udp_on: bool) -> Option<Cand> {
    let mut c = Cand::EMPTY;
    (parse_candidate_into(pkt, framing, tcp_on, udp_on, &mut c) == Parsed::Transport && c.seg.sound).then_some(c)
}

/// The source and destination addresses of an IP packet, laid out as in [`FlowKey::addresses`], and whether it
/// is IPv6; `None` if it is not IP or its header is not one (too short, or an IPv4 header length below 20 bytes or
/// past the packet): such bytes name no addresses, so they are no UDP barrier.
pub(super) fn address_pair(pkt: &[u8], framing: Framing) -> Option<(&[u8], bool)> {
    let (l3, ethertype) = match framing {
        Framing::Ip => (0, None),
        Framing::Ethernet => {
            let f = ethernet::Frame::new_checked(pkt).ok()?;
            (f.header_len(), Some(f.inner_ethertype()))
        }
    };
    let ip = pkt.get(l3..)?;
    match ip.first()? >> 4 {
        4 if ethertype.map_or(true, |e| e == ethernet::ETHERTYPE_IPV4) => {
            ipv4::Packet::new_checked(ip).ok()?;
            Some((&ip[12..20], false))
        }
        6 if ethertype.map_or(true, |e| e == ethernet::ETHERTYPE_IPV6) => {
            ipv6::Packet::new_checked(ip).ok()?;
            Some((&ip[8..40], true))
        }
        _ => None,
    }
}

/// The length of the IPv6 extension headers GRO walks (hop-by-hop, routing and destination options, as the
/// kernel's `ipv6_gro_pull_exthdrs`) between the fixed header and `ip`'s transport header, and the transport
/// protocol; `None` if they do not fit, a routing header has segments left, or the chain is longer than
/// [`ipv6::MAX_EXT_HEADERS`].
fn ipv6_extension_headers(ip: &[u8]) -> Option<(usize, u8)> {
    use ipv6::next_header::{DEST_OPTS, HOP_BY_HOP, ROUTING};
    let mut nh = *ip.get(6)?;
    let mut at = ipv6::HEADER_LEN;
    let mut count = 0;
    while matches!(nh, HOP_BY_HOP | ROUTING | DEST_OPTS) {
        count += 1;
        let len = (usize::from(*ip.get(at + 1)?) + 1) * 8;
        if count > ipv6::MAX_EXT_HEADERS || at + len > ip.len() || (nh == ROUTING && ip[at + 3] != 0) {
            return None;
        }
        nh = ip[at];
        at += len;
    }
    Some((at - ipv6::HEADER_LEN, nh))
}

/// Parses `pkt` into `c` (reused across packets, so that the candidate is written in place rather than built and
/// moved with `memcpy` per packet): how far the packet gets, its flow key, layout and segment fields.
#[inline(always)]
pub(super) fn parse_candidate_into(pkt: &[u8], framing: Framing, tcp_on: bool, udp_on: bool, c: &mut Cand) -> Parsed {
    const STOPPED: Parsed = Parsed::Stopped { udp_barrier: true };
    c.key.l2_len = 0;
    c.key.ext_len = 0;
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
            // The key is compared whole: bytes a longer header left behind would tell equal flows apart.
            c.key.l2[hl..].fill(0);
            c.key.l2_len = hl as u8;
            (hl, Some(version))
        }
    };
    let ip = &pkt[l3..];
    let Some(&first) = ip.first() else { return STOPPED };
    if version.is_some_and(|v| v != first >> 4) {
        return STOPPED;
    }
    let (proto, l4, v6) = match first >> 4 {
        4 => {
            let Ok(p) = ipv4::Packet::new_checked(ip) else { return STOPPED };
            if p.header_len() != ipv4::MIN_HEADER_LEN || p.is_fragment() || !ipv4_header_sum_ok(ip) {
                return Parsed::Stopped { udp_barrier: p.protocol() != IPPROTO_TCP };
            }
            for (k, (&b, &m)) in c.key.ip.iter_mut().zip(ip.iter().zip(&IPV4_FLOW)) {
                *k = b & m;
            }
            c.key.ip[ipv4::MIN_HEADER_LEN..].fill(0);
            (p.protocol(), l3 + ipv4::MIN_HEADER_LEN, false)
        }
        6 => {
            let Ok(p) = ipv6::Packet::new_checked(ip) else { return STOPPED };
            let Some((ext_len, proto)) = ipv6_extension_headers(ip) else {
                return Parsed::Stopped { udp_barrier: p.next_header() != IPPROTO_TCP };
            };
            for (k, (&b, &m)) in c.key.ip.iter_mut().zip(ip.iter().zip(&IPV6_FLOW)) {
                *k = b & m;
            }
            c.key.ext_len = ext_len as u16;
            (proto, l3 + ipv6::HEADER_LEN + ext_len, true)
        }
        _ => return STOPPED,
    };
    if pkt.len() - l3 > MAX_PACKET_LEN {
        return Parsed::Stopped { udp_barrier: proto != IPPROTO_TCP };
    }
    let l4b = &pkt[l4..];
    let (hdr_len, udp) = match proto {
        IPPROTO_TCP if tcp_on => {
            let Ok(t) = tcp::Packet::new_checked(l4b) else { return Parsed::Stopped { udp_barrier: false } };
            c.key.ports = u32::from_be_bytes([l4b[0], l4b[1], l4b[2], l4b[3]]) & TCP_FLOW_WORD;
            (l4 + t.header_len(), false)
        }
        IPPROTO_UDP if udp_on => {
            if l4b.len() < udp::HEADER_LEN {
                return STOPPED;
            }
            c.key.ports = u32::from_be_bytes([l4b[0], l4b[1], l4b[2], l4b[3]]) & UDP_FLOW_WORD;
            (l4 + udp::HEADER_LEN, true)
        }
        _ => return Parsed::Stopped { udp_barrier: proto != IPPROTO_TCP },
    };
    c.layout = Layout { l3, l4, hdr_len, v6, udp };
    c.seg = SegmentFields::read(pkt, &c.layout);
    // A UDP datagram the IP layer (or its own length field) flags stops here (`udp_gro_receive` skips it and
    // touches no item); a TCP segment goes on to close its flow's item.
    if udp && !c.seg.sound {
        return STOPPED;
    }
    Parsed::Transport
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::{payload, Spec};

    fn cand(spec: &Spec, len: usize) -> Cand {
        parse_candidate(&spec.build(&payload(len, 0)), spec.framing, true, true).expect("candidate")
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
        // IPv6 with destination options: the transport header is found behind them.
        let c = cand(&Spec { v6_dest_opts: 2, ..Spec::tcp6() }, 10);
        assert_eq!((c.layout.l4, c.key.ext_len), (40 + 16, 16));
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
        // Fields of role `Same` are not part of the key.
        assert_eq!(a.key, cand(&Spec { ttl: 3, tos: 2, window: 9, ..Spec::tcp4() }, 10).key);
        assert_ne!(cand(&Spec::tcp6(), 10).key, cand(&Spec { flow_label: 1, ..Spec::tcp6() }, 10).key);
    }

    #[test]
    fn extension_header_walk() {
        let ip = |ext: &[u8], first: u8| {
            let mut p = Spec::tcp6().build(&[1]);
            p[6] = first;
            p.splice(40..40, ext.iter().copied());
            p
        };
        use ipv6::next_header::{DEST_OPTS, FRAGMENT, HOP_BY_HOP, ROUTING};
        let opts = [DEST_OPTS, 0, 1, 4, 0, 0, 0, 0, IPPROTO_TCP, 0, 1, 4, 0, 0, 0, 0];
        assert_eq!(ipv6_extension_headers(&ip(&opts, HOP_BY_HOP)), Some((16, IPPROTO_TCP)));
        let routing_done = [IPPROTO_TCP, 0, 4, 0, 0, 0, 0, 0];
        assert_eq!(ipv6_extension_headers(&ip(&routing_done, ROUTING)), Some((8, IPPROTO_TCP)));
        let routing_left = [IPPROTO_TCP, 2, 2, 1, 0, 0, 0, 0];
        assert_eq!(ipv6_extension_headers(&ip(&[&routing_left[..], &[0; 16]].concat(), ROUTING)), None);
        assert_eq!(ipv6_extension_headers(&ip(&[IPPROTO_TCP, 0, 0, 0, 0, 0, 0, 0], FRAGMENT)), Some((0, FRAGMENT)));
        assert_eq!(ipv6_extension_headers(&ip(&[IPPROTO_TCP, 9], DEST_OPTS)[..50]), None, "cut short");
    }
}
