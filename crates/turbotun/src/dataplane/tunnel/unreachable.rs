//! ICMP errors for packets a transform has nowhere to send ([`super::Sealed::Unreachable`]), written back to the
//! TUN device, as the kernel's WireGuard answers a packet no peer's AllowedIPs take: IPv4 "host unreachable",
//! IPv6 "address unreachable" (built by `turbotun_wire::icmp_error`, which also says what is never answered).
//!
//! - **Rate**: a token bucket shared by the tunnel's workers, with the kernel's defaults for all ICMP errors
//!   (`net.ipv4.icmp_msgs_per_sec` 1000, `icmp_msgs_burst` 50); a packet past it is not answered.
//! - **Source address**: IPv6 errors come from an address of the tunnel device (one on the sender's prefix
//!   first, a link-local one only to a link-local sender), looked up over rtnetlink at most once a second while
//!   errors are sent, on a socket opened where the tunnel was built; a device with no IPv6 address sends no IPv6
//!   error (said once in the log). IPv4 errors come from the address that could not be reached: the kernel
//!   drops an IPv4 packet that arrives on a device from one of the host's own addresses (a martian source,
//!   unless `accept_local` is set), so an error from the device's address would never reach the sender. The
//!   kernel's WireGuard hands its error to the stack internally and needs no such choice.
//! - **TAP devices** get no error: the drop is counted, as for any other reason.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use turbotun_wire::icmp_error::{self, IPV6_MAX_LEN};
use turbotun_wire::ipv4;

use crate::configuration::netlink::Netlink;
use crate::dataplane::stats::Counters;
use crate::devices::queue::Queue;

/// ICMP errors a tunnel may send per second, and in one burst (the kernel's defaults for all ICMP errors).
const ERRORS_PER_SECOND: f64 = 1000.0;
const ERROR_BURST: f64 = 50.0;

/// How long the device's addresses are taken as known.
const ADDRESSES_FOR: Duration = Duration::from_secs(1);

/// A token bucket: `rate` tokens a second, at most `burst` held.
#[derive(Debug)]
pub(super) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    pub(super) fn new(rate: f64, burst: f64) -> Self {
        TokenBucket { rate, burst, tokens: burst, last: None }
    }

    /// Takes a token at `now`, if one is there.
    pub(super) fn take(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last {
            let earned = now.saturating_duration_since(last).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + earned).min(self.burst);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What the workers of one tunnel share to answer unreachable packets.
#[derive(Debug)]
pub(super) struct Unreachables {
    device: String,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    bucket: TokenBucket,
    /// A route socket in the namespace the tunnel was built in (the device's); `None` if none could be opened.
    netlink: Option<Netlink>,
    /// The device's IPv6 addresses with their prefix lengths, and when they were read.
    ipv6: Vec<(Ipv6Addr, u8)>,
    read_at: Option<Instant>,
    /// Whether the log already said that IPv6 errors cannot be sent.
    said_no_address: bool,
}

impl Unreachables {
    /// For the device `device`; call it in the namespace the device lives in.
    pub(super) fn new(device: &str) -> Self {
        let netlink = match Netlink::new() {
            Ok(netlink) => Some(netlink),
            Err(e) => {
                tracing::warn!("{device}: no route socket ({e}): IPv6 packets no peer takes get no ICMP error");
                None
            }
        };
        let state = State {
            bucket: TokenBucket::new(ERRORS_PER_SECOND, ERROR_BURST),
            netlink,
            ipv6: Vec::new(),
            read_at: None,
            said_no_address: false,
        };
        Unreachables { device: device.to_string(), state: Mutex::new(state) }
    }

    /// Answers `packet` (an IP packet read from `queue`, a TUN device) with a destination-unreachable error
    /// written back to the device, when it may be answered, the rate allows it and there is a source address;
    /// counts what it wrote as `icmp_errors`. Not answering is no error.
    pub(super) fn answer(&self, packet: &[u8], queue: &Queue, counters: &mut Counters) {
        let Ok(to) = icmp_error::recipient(packet) else { return };
        let source = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if !state.bucket.take(now) {
                return;
            }
            match to {
                IpAddr::V4(_) => match ipv4::Packet::new_checked(packet) {
                    Ok(p) => IpAddr::from(p.dst_addr()),
                    Err(_) => return,
                },
                IpAddr::V6(to) => match state.ipv6_source(&self.device, to, now) {
                    Some(source) => IpAddr::V6(source),
                    None => return,
                },
            }
        };
        let mut error = [0u8; IPV6_MAX_LEN];
        let Ok(len) = icmp_error::destination_unreachable(packet, source, &mut error) else { return };
        match queue.send(&error[..len]) {
            Ok(_) => counters.icmp_errors += 1,
            Err(e) => tracing::debug!("{}: writing an ICMP error: {e}", self.device),
        }
    }
}

impl State {
    /// An IPv6 address of `device` to send an error to `to` from.
    fn ipv6_source(&mut self, device: &str, to: Ipv6Addr, now: Instant) -> Option<Ipv6Addr> {
        let stale = match self.read_at {
            Some(at) => now.saturating_duration_since(at) >= ADDRESSES_FOR,
            None => true,
        };
        if stale {
            self.read_at = Some(now);
            self.ipv6 = match self.netlink.as_mut().map(|nl| nl.addresses(device)) {
                Some(Ok(addresses)) => addresses
                    .into_iter()
                    .filter_map(|(ip, len)| match ip {
                        IpAddr::V6(ip) => Some((ip, len)),
                        IpAddr::V4(_) => None,
                    })
                    .collect(),
                Some(Err(e)) => {
                    tracing::debug!("{device}: reading its addresses: {e}");
                    Vec::new()
                }
                None => Vec::new(),
            };
        }
        let source = pick_ipv6_source(&self.ipv6, to);
        if source.is_none() && !self.said_no_address {
            self.said_no_address = true;
            tracing::info!(
                "{device} has no IPv6 address to send ICMPv6 errors from: IPv6 packets no peer takes get none"
            );
        }
        source
    }
}

/// The address of `addresses` (with their prefix lengths) an error to `to` comes from: one whose prefix holds
/// `to`, else one of the same kind (link-local for a link-local `to`, any other for the rest).
fn pick_ipv6_source(addresses: &[(Ipv6Addr, u8)], to: Ipv6Addr) -> Option<Ipv6Addr> {
    let link_local = |ip: &Ipv6Addr| (ip.segments()[0] & 0xffc0) == 0xfe80;
    let on_prefix = |(ip, len): &&(Ipv6Addr, u8)| {
        let mask = u128::MAX.checked_shl(128 - u32::from((*len).min(128))).unwrap_or(0);
        u128::from(*ip) & mask == u128::from(to) & mask
    };
    addresses
        .iter()
        .find(on_prefix)
        .or_else(|| addresses.iter().find(|(ip, _)| link_local(ip) == link_local(&to)))
        .map(|&(ip, _)| ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_bucket_holds_a_burst_and_refills_at_its_rate() {
        let mut bucket = TokenBucket::new(1000.0, 50.0);
        let start = Instant::now();
        assert_eq!((0..80).filter(|_| bucket.take(start)).count(), 50, "a burst of 50, the rest refused");
        // 10 ms later: 10 more.
        let later = start + Duration::from_millis(10);
        assert_eq!((0..80).filter(|_| bucket.take(later)).count(), 10);
        // A long pause refills to the burst, never past it.
        let much_later = later + Duration::from_secs(60);
        assert_eq!((0..80).filter(|_| bucket.take(much_later)).count(), 50);
    }

    #[test]
    fn test_the_source_is_on_the_senders_prefix_or_of_its_kind() {
        let a = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        let addresses = [(a("fe80::1"), 64), (a("fd02::1"), 64), (a("fd09::1"), 64)];
        assert_eq!(pick_ipv6_source(&addresses, a("fd09::5")), Some(a("fd09::1")));
        assert_eq!(pick_ipv6_source(&addresses, a("fd77::5")), Some(a("fd02::1")));
        assert_eq!(pick_ipv6_source(&addresses, a("fe80::9")), Some(a("fe80::1")));
        assert_eq!(pick_ipv6_source(&addresses[..1], a("fd77::5")), None, "only link-local: not to a global one");
        assert_eq!(pick_ipv6_source(&[], a("fd77::5")), None);
        assert_eq!(pick_ipv6_source(&[(a("fd00::1"), 0)], a("2001:db8::1")), Some(a("fd00::1")), "a /0");
    }
}
