//! Shared helpers for tests on real devices: a private network namespace per test, unique names, and small
//! packet builders that do not depend on the code under test.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Runs `f` inside a fresh private network namespace (destroyed with everything in it when `f` returns or panics).
/// Without the privileges for that: a failure under CI=true, a visible skip otherwise. Returns None when skipped.
pub fn in_netns<F, R>(test: &str, f: F) -> Option<R>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    match turbotun::netns::with_private_netns(f) {
        Ok(r) => Some(r),
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{test}: privileged test cannot run under CI=true: {e}");
            }
            eprintln!("SKIPPED {test}: needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN): {e}");
            None
        }
    }
}

/// A unique interface name (≤ 15 bytes) for this process and call.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("{prefix}{}x{n}", std::process::id() % 100_000);
    assert!(name.len() <= 15, "{name} too long");
    name
}

/// RFC 1071 checksum, written independently of turbotun-wire so tests check it rather than reuse it.
pub fn inet_checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    let mut carry_byte: Option<u8> = None;
    for chunk in chunks {
        for &b in *chunk {
            match carry_byte.take() {
                Some(hi) => sum += u64::from(u16::from_be_bytes([hi, b])),
                None => carry_byte = Some(b),
            }
        }
    }
    if let Some(hi) = carry_byte {
        sum += u64::from(u16::from_be_bytes([hi, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4/UDP packet with correct header and UDP checksums.
pub fn ipv4_udp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let total = 20 + udp_len;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40; // DF
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let hc = inet_checksum(&[&p[..20]]);
    p[10..12].copy_from_slice(&hc.to_be_bytes());
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&dport.to_be_bytes());
    p[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    let c = udp4_checksum(&p);
    let c = if c == 0 { 0xffff } else { c };
    p[26..28].copy_from_slice(&c.to_be_bytes());
    p
}

/// The one's-complement sum over the UDP pseudo-header and datagram of an IPv4/UDP packet without options:
/// 0 when the packet's UDP checksum field is right (or, with the field zeroed, the checksum to put there).
pub fn udp4_checksum(p: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&p[12..20]);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&((p.len() - 20) as u16).to_be_bytes());
    inet_checksum(&[&pseudo, &p[20..]])
}

/// Fields of an IPv4/UDP packet, if `p` is one (no options).
pub fn parse_ipv4_udp(p: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, u16, u16, &[u8])> {
    if p.len() < 28 || p[0] != 0x45 || p[9] != 17 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if total > p.len() || total < 28 {
        return None;
    }
    let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
    let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    Some((src, dst, u16::from_be_bytes([p[20], p[21]]), u16::from_be_bytes([p[22], p[23]]), &p[28..total]))
}

/// Reads from `queue` until `want` accepts a packet, skipping unrelated traffic (IPv6 router solicitations and
/// the like). Panics after `timeout`.
pub fn recv_matching(
    queue: &turbotun::Queue,
    buf: &mut [u8],
    timeout: Duration,
    mut want: impl FnMut(&[u8]) -> bool,
) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no matching packet on {} within {timeout:?}", queue.name());
        if !queue.wait_readable(Some(left)).expect("poll") {
            continue;
        }
        let n = queue.recv_raw(buf).expect("read");
        if want(&buf[..n]) {
            return n;
        }
    }
}

/// Brings a device up with an IPv4 address in the calling thread's namespace.
pub fn configure_v4(name: &str, addr: Ipv4Addr, prefix: u8) {
    let mut nl = turbotun::netlink::Netlink::new().expect("netlink");
    nl.add_address(name, addr.into(), prefix).expect("add address");
    nl.set_up(name, true).expect("up");
}
