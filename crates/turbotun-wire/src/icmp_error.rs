//! ICMP errors about a packet that cannot be delivered: "destination unreachable" for IPv4 (RFC 792, type 3
//! code 1, host unreachable) and IPv6 (RFC 4443, type 1 code 3, address unreachable), as a router or the
//! kernel's WireGuard sends back to a packet's sender when it has nowhere to send the packet.
//!
//! [`recipient`] says whether an error may be sent about a packet at all, and to whom; [`destination_unreachable`]
//! writes the whole error packet (IP header, ICMP header, the quoted original, every checksum) into a caller's
//! buffer. Neither allocates nor panics, whatever the bytes.
//!
//! What is never answered (RFC 1122 §3.2.2, RFC 1812 §4.3.2.7, RFC 4443 §2.4 (e)): an ICMP error (or an ICMPv6
//! error or redirect) or an ICMP message whose type cannot be read; a fragment other than the first; a packet
//! whose source does not name one host (unspecified, loopback, multicast, broadcast, IPv4 class E); a packet sent
//! to a multicast or broadcast address. How much of the original is quoted: as much as keeps the error within
//! 576 bytes for IPv4 (RFC 1812 §4.3.2.3; at least the header and 8 bytes whenever the original has them) and
//! within the minimum MTU of 1280 bytes for IPv6 (RFC 4443 §2.4 (c)).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{icmp, icmpv6, ipv4, ipv6};

/// The largest IPv4 error: the minimum datagram every host accepts (RFC 1812 §4.3.2.3).
pub const IPV4_MAX_LEN: usize = 576;
/// The largest IPv6 error: the minimum MTU (RFC 4443 §2.4 (c)).
pub const IPV6_MAX_LEN: usize = 1280;
/// IPv4 "destination unreachable".
pub const ICMP_DEST_UNREACH: u8 = 3;
/// Its code for an unreachable host.
pub const ICMP_HOST_UNREACH: u8 = 1;
/// ICMPv6 "destination unreachable".
pub const ICMPV6_DEST_UNREACH: u8 = 1;
/// Its code for an unreachable address.
pub const ICMPV6_ADDR_UNREACH: u8 = 3;
/// The TTL (hop limit) of an error: the kernel's default.
pub const ERROR_TTL: u8 = 64;
/// The TOS byte of an IPv4 error: precedence "internetwork control", as the kernel's ICMP errors carry.
pub const ERROR_TOS: u8 = 0xc0;

/// IP protocol number of ICMP.
const IPPROTO_ICMP: u8 = 1;
/// ICMP types that are errors (RFC 792, RFC 1122 §3.2.2): destination unreachable, source quench, redirect, time
/// exceeded, parameter problem. Types above 18 are unknown and treated as errors too, as the kernel does.
const ICMP_ERROR_TYPES: [u8; 5] = [3, 4, 5, 11, 12];
const ICMP_LAST_KNOWN_TYPE: u8 = 18;
/// ICMPv6 redirect: never answered with an error (RFC 4443 §2.4 (e.2)).
const ICMPV6_REDIRECT: u8 = 137;
/// ICMPv6 types below this are errors (RFC 4443 §2.1).
const ICMPV6_INFO_FIRST: u8 = 128;

/// Why no error is sent about a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoError {
    /// Not an IPv4 or IPv6 packet whose headers can be read.
    Unparsable,
    /// An ICMP error (or an ICMPv6 error or redirect) itself, or an ICMP message whose type cannot be read.
    AboutAnError,
    /// A fragment other than the first.
    LaterFragment,
    /// The source does not name one host (unspecified, loopback, multicast, broadcast, class E).
    SourceNotAHost,
    /// Sent to a multicast or broadcast address.
    ToAGroup,
    /// The error's source address is not of the packet's IP version.
    WrongFamily,
    /// The buffer for the error is smaller than the headers of an error.
    NoRoom,
}

impl std::fmt::Display for NoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NoError::Unparsable => "not an IP packet whose headers can be read",
            NoError::AboutAnError => "an ICMP error (or a message whose ICMP type cannot be read)",
            NoError::LaterFragment => "a fragment other than the first",
            NoError::SourceNotAHost => "its source does not name one host",
            NoError::ToAGroup => "sent to a multicast or broadcast address",
            NoError::WrongFamily => "the error's source is of another IP version than the packet",
            NoError::NoRoom => "no room for the error",
        })
    }
}

/// Where an error about `packet` (an IPv4 or IPv6 packet from its first byte) would go: its source, when an
/// error may be sent about it at all.
pub fn recipient(packet: &[u8]) -> Result<IpAddr, NoError> {
    match packet.first().map(|b| b >> 4) {
        Some(4) => recipient_v4(packet).map(|(src, _)| IpAddr::V4(src)),
        Some(6) => recipient_v6(packet).map(|(src, _)| IpAddr::V6(src)),
        _ => Err(NoError::Unparsable),
    }
}

/// Writes into `out` a "destination unreachable" error about `packet`, from `source` to the packet's source:
/// the whole IP packet, checksums filled in, quoting as much of `packet` as the error's size limit (and `out`)
/// allows. Returns its length.
pub fn destination_unreachable(packet: &[u8], source: IpAddr, out: &mut [u8]) -> Result<usize, NoError> {
    match packet.first().map(|b| b >> 4) {
        Some(4) => unreachable_v4(packet, source, out),
        Some(6) => unreachable_v6(packet, source, out),
        _ => Err(NoError::Unparsable),
    }
}

/// The source of an IPv4 packet an error may be sent about, and the packet's length (the total length field,
/// or what the buffer holds of it).
fn recipient_v4(packet: &[u8]) -> Result<(Ipv4Addr, usize), NoError> {
    let p = ipv4::Packet::new_checked(packet).map_err(|_| NoError::Unparsable)?;
    let header_len = p.header_len();
    let total = usize::from(p.total_len());
    if total < header_len {
        return Err(NoError::Unparsable);
    }
    if p.frag_offset() != 0 {
        return Err(NoError::LaterFragment);
    }
    let (src, dst) = (Ipv4Addr::from(p.src_addr()), Ipv4Addr::from(p.dst_addr()));
    // 0/8 (this network), 127/8, 224/4 (multicast) and 240/4 (class E, with the limited broadcast).
    if src.octets()[0] == 0 || src.is_loopback() || src.is_multicast() || src.octets()[0] >= 240 {
        return Err(NoError::SourceNotAHost);
    }
    if dst.is_multicast() || dst.is_broadcast() {
        return Err(NoError::ToAGroup);
    }
    if p.protocol() == IPPROTO_ICMP {
        match packet.get(header_len) {
            Some(&t) if !ICMP_ERROR_TYPES.contains(&t) && t <= ICMP_LAST_KNOWN_TYPE => {}
            _ => return Err(NoError::AboutAnError),
        }
    }
    Ok((src, total.min(packet.len())))
}

/// The source of an IPv6 packet an error may be sent about, and the packet's length.
fn recipient_v6(packet: &[u8]) -> Result<(Ipv6Addr, usize), NoError> {
    let p = ipv6::Packet::new_checked(packet).map_err(|_| NoError::Unparsable)?;
    let (src, dst) = (Ipv6Addr::from(p.src_addr()), Ipv6Addr::from(p.dst_addr()));
    if src.is_unspecified() || src.is_loopback() || src.is_multicast() {
        return Err(NoError::SourceNotAHost);
    }
    if dst.is_multicast() {
        return Err(NoError::ToAGroup);
    }
    // A payload length of 0 is a jumbogram's (or a packet with nothing after the header): the buffer decides.
    let len = match usize::from(p.payload_len()) {
        0 => packet.len(),
        n => (ipv6::HEADER_LEN + n).min(packet.len()),
    };
    let (protocol, at) = upper_layer_v6(&packet[..len])?;
    if protocol == icmpv6::IPPROTO_ICMPV6 {
        match packet[..len].get(at) {
            Some(&t) if t >= ICMPV6_INFO_FIRST && t != ICMPV6_REDIRECT => {}
            _ => return Err(NoError::AboutAnError),
        }
    }
    Ok((src, len))
}

/// Walks the extension headers of an IPv6 packet to its upper-layer header: its protocol and offset. A fragment
/// header with a non-zero offset means a later fragment; a header that does not fit, or too many of them, an
/// unparsable packet (whose kind cannot be told, so it is not answered).
fn upper_layer_v6(packet: &[u8]) -> Result<(u8, usize), NoError> {
    use ipv6::next_header as nh;
    let mut next = packet[6];
    let mut at = ipv6::HEADER_LEN;
    for _ in 0..ipv6::MAX_EXT_HEADERS {
        let len = match next {
            nh::HOP_BY_HOP | nh::ROUTING | nh::DEST_OPTS => packet.get(at + 1).map(|&l| (usize::from(l) + 1) * 8),
            nh::AH => packet.get(at + 1).map(|&l| (usize::from(l) + 2) * 4),
            nh::FRAGMENT => {
                let offset = packet.get(at + 2..at + 4).map(|b| u16::from_be_bytes([b[0], b[1]]) & 0xfff8);
                match offset {
                    Some(0) => Some(8),
                    Some(_) => return Err(NoError::LaterFragment),
                    None => None,
                }
            }
            _ => return Ok((next, at)),
        };
        match len {
            Some(len) if at + len <= packet.len() => {
                next = packet[at];
                at += len;
            }
            _ => return Err(NoError::Unparsable),
        }
    }
    Err(NoError::Unparsable)
}

/// Lays out an error behind an IP header of `ip_len` bytes in at most `max` bytes of `out`: the 8-byte ICMP(v6)
/// header (type and code, then four unused bytes: the next-hop MTU of other codes) and as much of the original
/// packet as fits. Returns the error's bytes (its IP header and checksum still to write) and its length.
fn quote<'a>(
    packet: &[u8],
    original_len: usize,
    out: &'a mut [u8],
    ip_len: usize,
    max: usize,
    type_code: [u8; 2],
) -> Result<(&'a mut [u8], usize), NoError> {
    // ICMP's and ICMPv6's headers are both 8 bytes.
    let headers = ip_len + icmp::HEADER_LEN;
    let room = out.len().min(max);
    if room < headers {
        return Err(NoError::NoRoom);
    }
    let quoted = original_len.min(room - headers);
    let len = headers + quoted;
    let out = &mut out[..len];
    out[headers..].copy_from_slice(&packet[..quoted]);
    out[ip_len..headers].copy_from_slice(&[type_code[0], type_code[1], 0, 0, 0, 0, 0, 0]);
    Ok((out, len))
}

fn unreachable_v4(packet: &[u8], source: IpAddr, out: &mut [u8]) -> Result<usize, NoError> {
    let (to, original_len) = recipient_v4(packet)?;
    let IpAddr::V4(source) = source else { return Err(NoError::WrongFamily) };
    let (out, len) =
        quote(packet, original_len, out, ipv4::MIN_HEADER_LEN, IPV4_MAX_LEN, [ICMP_DEST_UNREACH, ICMP_HOST_UNREACH])?;
    let message = &mut out[ipv4::MIN_HEADER_LEN..];
    icmp::Packet::new_unchecked(message).fill_checksum();
    let header = ipv4::Repr {
        src: source.octets(),
        dst: to.octets(),
        protocol: IPPROTO_ICMP,
        payload_len: (len - ipv4::MIN_HEADER_LEN) as u16,
        ttl: ERROR_TTL,
        tos: ERROR_TOS,
        ident: 0,
        dont_frag: false,
    };
    header.emit(out).map_err(|_| NoError::NoRoom)?;
    Ok(len)
}

fn unreachable_v6(packet: &[u8], source: IpAddr, out: &mut [u8]) -> Result<usize, NoError> {
    let (to, original_len) = recipient_v6(packet)?;
    let IpAddr::V6(source) = source else { return Err(NoError::WrongFamily) };
    let (out, len) =
        quote(packet, original_len, out, ipv6::HEADER_LEN, IPV6_MAX_LEN, [ICMPV6_DEST_UNREACH, ICMPV6_ADDR_UNREACH])?;
    let message = &mut out[ipv6::HEADER_LEN..];
    icmpv6::Packet::new_unchecked(message).fill_checksum(source.octets(), to.octets());
    let header = ipv6::Repr {
        src: source.octets(),
        dst: to.octets(),
        next_header: icmpv6::IPPROTO_ICMPV6,
        payload_len: (len - ipv6::HEADER_LEN) as u16,
        hop_limit: ERROR_TTL,
        traffic_class: 0,
        flow_label: 0,
    };
    header.emit(out).map_err(|_| NoError::NoRoom)?;
    Ok(len)
}

/// Whether `error` is a well-formed error of this module about a packet that began with `quoted`: headers, both
/// checksums, the quoted bytes. For tests and the fuzz target.
pub fn verify(error: &[u8], quoted: &[u8]) -> bool {
    match error.first().map(|b| b >> 4) {
        Some(4) => {
            let Ok(p) = ipv4::Packet::new_checked(error) else { return false };
            let Ok(m) = icmp::Packet::new_checked(p.payload()) else { return false };
            p.check_total_len().is_ok()
                && p.verify_checksum()
                && p.protocol() == IPPROTO_ICMP
                && error.len() <= IPV4_MAX_LEN
                && (m.msg_type(), m.code()) == (ICMP_DEST_UNREACH, ICMP_HOST_UNREACH)
                && m.verify_checksum()
                && quoted.starts_with(m.payload())
        }
        Some(6) => {
            let Ok(p) = ipv6::Packet::new_checked(error) else { return false };
            let Ok(m) = icmpv6::Packet::new_checked(p.payload()) else { return false };
            p.check_payload_len().is_ok()
                && p.next_header() == icmpv6::IPPROTO_ICMPV6
                && error.len() <= IPV6_MAX_LEN
                && (m.msg_type(), m.code()) == (ICMPV6_DEST_UNREACH, ICMPV6_ADDR_UNREACH)
                && m.verify_checksum(p.src_addr(), p.dst_addr())
                && quoted.starts_with(&p.payload()[icmpv6::HEADER_LEN..])
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum;

    /// Whether `data` adds up, by the plain reference sum (not the routine that wrote the checksum).
    fn reference_checksum_ok(data: &[u8], pseudo: u32) -> bool {
        checksum::fold(checksum::sum_reference(data, pseudo)) == 0xffff
    }

    const A: Ipv4Addr = Ipv4Addr::new(10, 202, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 202, 0, 77);

    /// An IPv4 packet of `len` bytes from `src` to `dst` carrying `protocol`, whose payload starts with `first`.
    fn v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, first: u8, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        let repr = ipv4::Repr {
            src: src.octets(),
            dst: dst.octets(),
            protocol,
            payload_len: (len - 20) as u16,
            ttl: 64,
            tos: 0,
            ident: 7,
            dont_frag: true,
        };
        repr.emit(&mut b).unwrap();
        for (i, x) in b[20..].iter_mut().enumerate() {
            *x = i as u8;
        }
        if len > 20 {
            b[20] = first;
        }
        b
    }

    fn v6(src: &str, dst: &str, next: u8, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 40];
        let repr = ipv6::Repr {
            src: src.parse::<Ipv6Addr>().unwrap().octets(),
            dst: dst.parse::<Ipv6Addr>().unwrap().octets(),
            next_header: next,
            payload_len: payload.len() as u16,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        };
        repr.emit(&mut b).unwrap();
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn test_an_ipv4_error_quotes_the_packet_and_adds_up() {
        let ping = v4(A, B, IPPROTO_ICMP, icmp::ECHO_REQUEST, 84);
        let mut out = [0u8; 1500];
        let n = destination_unreachable(&ping, IpAddr::V4(B), &mut out).unwrap();
        assert_eq!(n, 20 + 8 + 84);
        let e = &out[..n];
        assert!(verify(e, &ping));
        let p = ipv4::Packet::new_checked(e).unwrap();
        assert_eq!((p.src_addr(), p.dst_addr(), p.ttl(), p.tos()), (B.octets(), A.octets(), 64, 0xc0));
        assert_eq!(&e[20..24], &[3, 1, e[22], e[23]]);
        assert_eq!(&e[24..28], &[0; 4]);
        assert_eq!(&e[28..], &ping[..]);
        // Checked by a second, independent sum: the IPv4 header and the ICMP message each add up to all ones.
        assert!(reference_checksum_ok(&e[..20], 0) && reference_checksum_ok(&e[20..], 0));
    }

    #[test]
    fn test_the_quote_stops_at_576_bytes_for_ipv4_and_1280_for_ipv6() {
        let big = v4(A, B, 17, 0, 1400);
        let mut out = [0u8; 2000];
        let n = destination_unreachable(&big, IpAddr::V4(B), &mut out).unwrap();
        assert_eq!(n, IPV4_MAX_LEN);
        assert!(verify(&out[..n], &big));
        let big6 = v6("fd02::1", "fd02::77", 17, &[0x5a; 1400]);
        let n = destination_unreachable(&big6, "fd02::2".parse().unwrap(), &mut out).unwrap();
        assert_eq!(n, IPV6_MAX_LEN);
        assert!(verify(&out[..n], &big6));
        let pseudo = checksum::pseudo_header_v6(
            ipv6::Packet::new_checked(&out[..n]).unwrap().src_addr(),
            ipv6::Packet::new_checked(&out[..n]).unwrap().dst_addr(),
            icmpv6::IPPROTO_ICMPV6,
            (n - 40) as u32,
        );
        assert!(reference_checksum_ok(&out[40..n], pseudo));
        // A small buffer quotes less, and one without room for the headers refuses.
        let n = destination_unreachable(&big, IpAddr::V4(B), &mut out[..100]).unwrap();
        assert!(n == 100 && verify(&out[..n], &big));
        assert_eq!(destination_unreachable(&big, IpAddr::V4(B), &mut out[..27]), Err(NoError::NoRoom));
        // A total length shorter than the buffer (padding): only the packet is quoted.
        let mut padded = v4(A, B, 17, 0, 60);
        padded.extend_from_slice(&[0xee; 10]);
        let n = destination_unreachable(&padded, IpAddr::V4(B), &mut out).unwrap();
        assert_eq!(&out[28..n], &padded[..60]);
    }

    #[test]
    fn test_an_ipv6_error() {
        let ping = v6("fd02::1", "fd02::77", icmpv6::IPPROTO_ICMPV6, &[icmpv6::ECHO_REQUEST, 0, 0, 0, 0, 1, 0, 1]);
        let mut out = [0u8; 1500];
        let from: Ipv6Addr = "fd02::2".parse().unwrap();
        let n = destination_unreachable(&ping, IpAddr::V6(from), &mut out).unwrap();
        assert_eq!(n, 48 + ping.len());
        assert!(verify(&out[..n], &ping));
        let p = ipv6::Packet::new_checked(&out[..n]).unwrap();
        assert_eq!((p.src_addr(), p.dst_addr(), p.hop_limit()), (from.octets(), ping[8..24].try_into().unwrap(), 64));
        assert_eq!(&out[40..42], &[1, 3]);
        assert_eq!(recipient(&ping), Ok("fd02::1".parse().unwrap()));
    }

    #[test]
    fn test_what_is_never_answered() {
        let mut out = [0u8; 1500];
        let refuse = |packet: &[u8], why: NoError| {
            assert_eq!(recipient(packet), Err(why), "{packet:?}");
            let source = if packet.first().map(|b| b >> 4) == Some(6) { "fd02::2".parse().unwrap() } else { B.into() };
            assert_eq!(destination_unreachable(packet, source, &mut [0u8; 1500]), Err(why));
        };
        // ICMP errors, unknown ICMP types and an ICMP header cut off; queries are answered.
        for t in [3u8, 4, 5, 11, 12, 19, 255] {
            refuse(&v4(A, B, IPPROTO_ICMP, t, 40), NoError::AboutAnError);
        }
        refuse(&v4(A, B, IPPROTO_ICMP, 0, 20), NoError::AboutAnError);
        for t in [0u8, 8, 13, 17] {
            assert_eq!(recipient(&v4(A, B, IPPROTO_ICMP, t, 40)), Ok(A.into()));
        }
        // A later fragment; the first one is answered.
        let mut later = v4(A, B, 17, 0, 60);
        later[6..8].copy_from_slice(&0x0010u16.to_be_bytes());
        refuse(&later, NoError::LaterFragment);
        let mut first = v4(A, B, 17, 0, 60);
        first[6..8].copy_from_slice(&ipv4::FLAG_MF.to_be_bytes());
        assert!(destination_unreachable(&first, B.into(), &mut out).is_ok());
        // Sources that are no one host, group destinations.
        for src in ["0.0.0.0", "0.1.2.3", "127.0.0.1", "224.0.0.1", "240.0.0.1", "255.255.255.255"] {
            refuse(&v4(src.parse().unwrap(), B, 17, 0, 40), NoError::SourceNotAHost);
        }
        for dst in ["224.0.0.251", "239.1.1.1", "255.255.255.255"] {
            refuse(&v4(A, dst.parse().unwrap(), 17, 0, 40), NoError::ToAGroup);
        }
        // IPv6: errors and redirects, an unreadable type, multicast and unspecified sources, multicast
        // destinations (the kernel's own router solicitations and MLD reports among them).
        for t in [1u8, 2, 3, 4, 127, 137] {
            refuse(&v6("fd02::1", "fd02::77", 58, &[t, 0, 0, 0, 0, 0, 0, 0]), NoError::AboutAnError);
        }
        refuse(&v6("fd02::1", "fd02::77", 58, &[]), NoError::AboutAnError);
        refuse(&v6("::", "fd02::77", 17, &[0; 8]), NoError::SourceNotAHost);
        refuse(&v6("ff02::1", "fd02::77", 17, &[0; 8]), NoError::SourceNotAHost);
        refuse(&v6("fe80::1", "ff02::2", 58, &[133, 0, 0, 0, 0, 0, 0, 0]), NoError::ToAGroup);
        // Behind extension headers: a later fragment, an error found behind a hop-by-hop header, a chain cut off.
        let later6 = v6("fd02::1", "fd02::77", 44, &[17, 0, 0x00, 0x08, 0, 0, 0, 1, 0, 0]);
        refuse(&later6, NoError::LaterFragment);
        let first6 = v6("fd02::1", "fd02::77", 44, &[17, 0, 0x00, 0x01, 0, 0, 0, 1, 0, 0]);
        assert!(destination_unreachable(&first6, "fd02::2".parse().unwrap(), &mut out).is_ok());
        let behind_hbh = v6("fd02::1", "fd02::77", 0, &[58, 0, 1, 4, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        refuse(&behind_hbh, NoError::AboutAnError);
        refuse(&v6("fd02::1", "fd02::77", 0, &[58, 1, 0, 0]), NoError::Unparsable);
        // Not IP, and a source of the other family.
        refuse(&[0x10; 40], NoError::Unparsable);
        refuse(&[], NoError::Unparsable);
        let ping = v4(A, B, IPPROTO_ICMP, 8, 40);
        assert_eq!(destination_unreachable(&ping, "fd02::2".parse().unwrap(), &mut out), Err(NoError::WrongFamily));
    }
}
