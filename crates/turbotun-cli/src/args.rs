//! Argument types shared by several commands, checked when the arguments are parsed.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use turbotun::privilege::UserSpec;

/// Longest time a `SECS` argument may give: beyond it a deadline computed from now could overflow the clock.
const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// A `SECS` argument: a finite number of seconds above zero and at most a week (fractions allowed).
pub fn seconds(text: &str) -> Result<Duration, String> {
    let secs: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 || secs > MAX_SECONDS {
        return Err(format!("{text} seconds: give a number above 0 and at most {MAX_SECONDS} (a week)"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{text} seconds: {e}"))
}

/// An `ADDR:PORT` argument: an IPv4 address and port (`10.0.0.1:51820`), an IPv6 one in brackets
/// (`[fd00::1]:51820`), or a host name and port (`localhost:51820`, resolved as `wg` and iperf3 resolve theirs;
/// the first address wins).
pub fn socket_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let example = "give ADDR:PORT, e.g. 10.0.0.1:51820, [fd00::1]:51820 or host.example:51820";
    if text.parse::<std::net::Ipv6Addr>().is_ok() {
        return Err(format!("{text:?} has no port (an IPv6 address goes in brackets, then the port): {example}"));
    }
    if !text.contains(':') {
        return Err(format!("{text:?} has no port: {example}"));
    }
    let (host, port) = text.rsplit_once(':').unwrap_or((text, ""));
    if port.parse::<u16>().is_err() {
        return Err(format!("{text:?}: {port:?} is not a port (0 to 65535): {example}"));
    }
    if host.contains(':') && !host.starts_with('[') {
        return Err(format!("{text:?}: an IPv6 address goes in brackets: {example}"));
    }
    match text.to_socket_addrs() {
        Ok(mut addrs) => addrs.next().ok_or_else(|| format!("{host} has no address: {example}")),
        Err(e) => Err(format!("cannot resolve {host}: {e} ({example})")),
    }
}

/// A `--remote ADDR:PORT` argument: where datagrams go, so as [`socket_addr`] but neither port 0 nor an
/// unspecified address (0.0.0.0, ::), which no datagram can be sent to.
pub fn remote_addr(text: &str) -> Result<SocketAddr, String> {
    let addr = socket_addr(text)?;
    if addr.port() == 0 {
        return Err(format!("{text:?}: port 0 is no port to send to (give the port the other end listens on)"));
    }
    if addr.ip().is_unspecified() {
        return Err(format!("{text:?}: {} is no address to send to (give the other end's address)", addr.ip()));
    }
    Ok(addr)
}

/// A `--queues N` argument, the same for every command: 1 to the kernel's limit of queues per device.
pub fn queue_count(text: &str) -> Result<usize, String> {
    let max = turbotun::device::MAX_QUEUES;
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("give 1 to {max} (the kernel's limit of queues a device)")),
    }
}

/// A vhost-user `--queues N` argument: 1 to the queue pairs a backend offers, in [`queue_count`]'s words.
pub fn queue_pairs(text: &str) -> Result<u16, String> {
    let max = turbotun::vhost_user::MAX_QUEUE_PAIRS;
    match text.trim().parse::<u16>() {
        Ok(n) if (1..=max).contains(&usize::from(n)) => Ok(n),
        _ => Err(format!("give 1 to {max} (the queue pairs a vhost-user backend offers)")),
    }
}

/// A `--user USER[:GROUP]` argument (and the old `--group GROUP` beside it).
pub fn user_spec(user: &str, group: Option<&str>) -> UserSpec {
    match (user.split_once(':'), group) {
        (Some((user, group)), _) => UserSpec::new(user).group(group),
        (None, Some(group)) => UserSpec::new(user).group(group),
        (None, None) => UserSpec::new(user),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_queue_count_is_1_to_the_kernels_limit() {
        assert_eq!(queue_count("2"), Ok(2));
        assert!(queue_count("0").unwrap_err().contains("give 1 to 256"));
        assert!(queue_count("257").is_err() && queue_count("two").is_err());
    }

    #[test]
    fn test_a_remote_address_needs_a_port_and_an_address() {
        assert_eq!(remote_addr("192.168.77.2:4789"), Ok("192.168.77.2:4789".parse().unwrap()));
        assert!(remote_addr("192.168.77.2:0").unwrap_err().contains("port 0 is no port"));
        assert!(remote_addr("0.0.0.0:4789").unwrap_err().contains("no address to send to"));
        assert!(remote_addr("[::]:4789").unwrap_err().contains("no address to send to"));
    }

    #[test]
    fn test_socket_addr() {
        assert_eq!(socket_addr("10.0.0.1:5000"), Ok("10.0.0.1:5000".parse().unwrap()));
        assert_eq!(socket_addr("[fd00::1]:5000"), Ok("[fd00::1]:5000".parse().unwrap()));
        let local = socket_addr("localhost:5000").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 5000, "{local}");
        for (bad, says) in [
            ("10.0.0.1", "has no port"),
            ("fd00::1", "in brackets"),
            ("10.0.0.1:99999", "is not a port"),
            ("10.0.0.1:x", "is not a port"),
            ("fd00::1:5000", "in brackets"),
            ("no-such-host.invalid:5000", "cannot resolve no-such-host.invalid"),
        ] {
            let err = socket_addr(bad).unwrap_err();
            assert!(err.contains(says) && err.contains("e.g. 10.0.0.1:51820"), "{bad}: {err}");
        }
    }

    #[test]
    fn test_user_spec() {
        assert_eq!(user_spec("nobody", None), UserSpec::new("nobody"));
        assert_eq!(user_spec("nobody:nogroup", None), UserSpec::new("nobody").group("nogroup"));
        assert_eq!(user_spec("nobody", Some("nogroup")), UserSpec::new("nobody").group("nogroup"));
    }

    #[test]
    fn test_seconds() {
        assert_eq!(seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(seconds("604800"), Ok(Duration::from_secs(604_800)));
        for bad in ["inf", "-inf", "NaN", "0", "-1", "1e300", "604801", "abc", ""] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
