//! `turbotun wg`'s tunnel engine and UDP layer against the real programs: a listen port that is one endpoint's
//! alone, ICMP errors for packets no peer takes, replies that leave from the address the peer contacted, and
//! endpoints of two queues (`--queues 2`) with each other and with wireguard-go. Each
//! test builds its own namespaces and removes everything it made, however it ends.

mod common;

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::process::Command;

use common::wg::*;
use common::{ns_path, privileged, tcp_flows_intact, Flow};
use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
use turbotun::netns::with_netns;

/// What binding `addr` in `ns` with `SO_REUSEPORT` set (as any program may) gets: `Err(errno)` if refused.
fn reuseport_bind(ns: &OwnedFd, addr: SocketAddr) -> Result<(), i32> {
    let family = if addr.is_ipv6() { AddressFamily::INET6 } else { AddressFamily::INET };
    with_netns(&ns_path(ns), || {
        let fd = rustix::net::socket_with(family, SocketType::DGRAM, SocketFlags::CLOEXEC, None).unwrap();
        sockopt::set_socket_reuseport(&fd, true).unwrap();
        rustix::net::bind(&fd, &addr).map_err(|e| e.raw_os_error())
    })
    .unwrap()
}

/// The port `wg show NAME listen-port` reports.
fn listen_port(ns: &OwnedFd, name: &str) -> String {
    wg(ns, &["show", name, "listen-port"]).trim().to_string()
}

#[test]
fn a_listen_port_is_one_endpoints_alone() {
    if !privileged("a_listen_port_is_one_endpoints_alone") {
        return;
    }
    let nss = underlay(1).nss;
    let ns = &nss[1];
    let (na, nb, ng) = (unique("wpa"), unique("wpb"), unique("wpg"));
    let a = Endpoint::start(ns, Impl::Turbotun, &na);
    let b = Endpoint::start(ns, Impl::Turbotun, &nb);
    wg(ns, &["set", &na, "listen-port", "51900"]);
    let b_port = listen_port(ns, &nb);
    // A second endpoint asked for the port: refused with EADDRINUSE, as wireguard-go and the kernel refuse it;
    // wg names it, the raw answer is errno=-98; nothing changed.
    let refused = wg_status(ns, &["set", &nb, "listen-port", "51900"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("Address already in use"), "{refused:?}");
    assert_eq!(uapi_first_line(&nb, "set=1\nlisten_port=51900\n"), "errno=-98");
    assert_eq!((listen_port(ns, &na), listen_port(ns, &nb)), ("51900".to_string(), b_port.clone()));
    // Nor does any program of the same user (root, as the endpoint) that asks to share it get it, on either
    // family; the endpoint's own port asked for again is no change.
    for addr in ["0.0.0.0:51900", "10.201.0.11:51900", "[::]:51900"] {
        assert_eq!(reuseport_bind(ns, addr.parse().unwrap()), Err(libc::EADDRINUSE), "{addr}");
    }
    wg(ns, &["set", &na, "listen-port", "51900"]);
    // A port picked at start (listen_port 0) and then asked for by number, as `wg syncconf NAME <(wg showconf
    // NAME)` does: its own, so no change and no error.
    wg(ns, &["set", &nb, "listen-port", &b_port]);
    assert_eq!(listen_port(ns, &nb), b_port);
    // wireguard-go, the oracle, gives the same answer for a port a turbotun endpoint holds.
    let g = Endpoint::start(ns, Impl::WireguardGo, &ng);
    assert_eq!(uapi_first_line(&ng, "set=1\nlisten_port=51900\n"), "errno=-98");
    drop(g);
    b.stop();
    // The port is free again once its endpoint has stopped.
    a.stop();
    assert_eq!(reuseport_bind(ns, "[::]:51900".parse().unwrap()), Ok(()));
}

/// `ip ARGS` in `ns` (iproute2: addresses with flags and routes through a gateway, which the library's netlink
/// module does not make); fails the test if it fails.
fn ip(ns: &OwnedFd, args: &str) {
    let out = with_netns(&ns_path(ns), || Command::new("ip").args(args.split(' ')).output())
        .unwrap()
        .expect("ip (apt: iproute2)");
    assert!(out.status.success(), "ip {args}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Sends a UDP datagram to `dst` port 9 from `ns`; the type and code of the ICMP (or ICMPv6) error that comes
/// back within 5 s, as a raw socket sees it (nothing else sends errors in these namespaces).
fn icmp_error_for(ns: &OwnedFd, dst: &str) -> Option<(u8, u8)> {
    use rustix::net::{ipproto, sockopt, AddressFamily, RecvFlags, SocketType};
    use std::time::Duration;
    with_netns(&ns_path(ns), || {
        let v6 = dst.contains(':');
        let (family, protocol) =
            if v6 { (AddressFamily::INET6, ipproto::ICMPV6) } else { (AddressFamily::INET, ipproto::ICMP) };
        let raw = rustix::net::socket(family, SocketType::RAW, Some(protocol)).unwrap();
        sockopt::set_socket_timeout(&raw, sockopt::Timeout::Recv, Some(Duration::from_millis(200))).unwrap();
        let udp = std::net::UdpSocket::bind(if v6 { "[::]:0" } else { "0.0.0.0:0" }).unwrap();
        udp.send_to(b"anyone?", (dst, 9)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut buf = [0u8; 2048];
        while std::time::Instant::now() < deadline {
            let Ok((n, _)) = rustix::net::recv(&raw, &mut buf, RecvFlags::empty()) else { continue };
            // An IPv4 raw socket reads the IP header too; an ICMPv6 one only the message.
            let at = if v6 { 0 } else { usize::from(buf[0] & 0x0f) * 4 };
            let error = if v6 { 1 } else { 3 };
            if n > at + 1 && buf[at] == error {
                return Some((buf[at], buf[at + 1]));
            }
        }
        None
    })
    .unwrap()
}

/// The endpoint `wg show NAME endpoints` in `ns` reports for its one peer.
fn endpoint_of_peer(ns: &OwnedFd, name: &str) -> String {
    let shown = wg(ns, &["show", name, "endpoints"]);
    shown.lines().next().and_then(|l| l.split('\t').nth(1)).unwrap_or_default().to_string()
}

#[test]
fn a_packet_no_peer_takes_is_answered_unreachable() {
    if !privileged("a_packet_no_peer_takes_is_answered_unreachable") {
        return;
    }
    let nss = underlay(2).nss;
    let dir = private_dir();
    let (ka, kb, kc) = (keys(dir.path(), "a"), keys(dir.path(), "b"), keys(dir.path(), "c"));
    let (na, nb) = (unique("wua"), unique("wub"));
    let a = Endpoint::start(&nss[1], Impl::Turbotun, &na);
    let b = Endpoint::start(&nss[2], Impl::WireguardGo, &nb);
    let file = |k: &Keys| k.private_file.to_str().unwrap().to_string();
    // A's peers: B (wireguard-go) with 10.202.0.2 and fd02::2, and C, which has 10.202.0.9 and no endpoint.
    wg_line(
        &nss[1],
        &format!(
            "set {na} private-key {} listen-port 51920 \
                peer {} endpoint 10.201.0.12:51921 allowed-ips 10.202.0.2/32,fd02::2/128 \
                peer {} allowed-ips 10.202.0.9/32",
            file(&ka),
            kb.public,
            kc.public
        ),
    );
    wg_line(
        &nss[2],
        &format!(
            "set {nb} private-key {} listen-port 51921 peer {} endpoint 10.201.0.11:51920 allowed-ips 10.202.0.1/32",
            file(&kb),
            ka.public
        ),
    );
    bring_up(&nss[1], &na, "10.202.0.1");
    bring_up(&nss[2], &nb, "10.202.0.2");
    ip(&nss[1], &format!("-6 addr add fd02::1/64 dev {na} nodad"));
    assert!(ping_within(&nss[1], "10.202.0.2", 5), "the tunnel works");
    // No peer allows 10.202.0.77 or fd02::77; C allows 10.202.0.9 but has no endpoint: the sender is told, as the
    // kernel's WireGuard tells it (wireguard-go drops them without a word): host unreachable (ICMP 3/1), address
    // unreachable (ICMPv6 1/3), read off the wire whatever ping's wording.
    for (dst, told) in [("10.202.0.77", (3, 1)), ("10.202.0.9", (3, 1)), ("fd02::77", (1, 3))] {
        assert_eq!(icmp_error_for(&nss[1], dst), Some(told), "a datagram to {dst}");
    }
    assert!(ping(&nss[1], "10.202.0.2"), "the tunnel still works");
    drop(b);
    let c = counters(&a.stop());
    assert!(c["drops_by_reason"]["no_peer"].as_u64().unwrap() >= 3, "each counted as no_peer: {c}");
    assert!(c["icmp_errors"].as_u64().unwrap() >= 3, "{c}");
}

/// How the peer reaches the endpoint in [`replies_leave_from_the_contacted_address`]: a second address on the
/// interface that has the route back (the first is the one the routing would pick), or an address on another
/// interface (the loopback) than the route back.
#[derive(Debug, Clone, Copy)]
enum Contacted {
    SecondOnTheSameInterface,
    OnAnotherInterface,
}

/// The endpoint (turbotun, in `nss[1]`) has two addresses; wireguard-go (in `nss[2]`) is configured to reach the
/// one `contacted` says and starts the handshake (the endpoint knows no endpoint for it). Traffic flows both
/// ways, and wireguard-go, which moves its endpoint to wherever authenticated packets come from, still sees the
/// contacted address: every reply left from it. Then that address goes away: the endpoint forgets it, replies
/// from the routing's choice, and traffic goes on.
fn replies_leave_from_the_contacted_address(ipv6: bool, contacted: Contacted) {
    let Underlay { nss, names } = underlay(2);
    let (near, far) = (&names[1], &names[2]);
    for (ns, dev, own) in [(&nss[1], near, "11"), (&nss[2], far, "12")] {
        ip(ns, &format!("-6 addr add fd01::{own}/64 dev {dev} nodad"));
    }
    let (reached, gone) = match (ipv6, contacted) {
        (false, Contacted::SecondOnTheSameInterface) => {
            ip(&nss[1], &format!("addr add 10.201.0.21/24 dev {near}"));
            ("10.201.0.21:51930".to_string(), format!("addr del 10.201.0.21/24 dev {near}"))
        }
        (true, Contacted::SecondOnTheSameInterface) => {
            // Deprecated (preferred_lft 0): the routing never picks it as a source, so only stickiness can.
            ip(&nss[1], &format!("-6 addr add fd01::21/64 dev {near} nodad preferred_lft 0"));
            ("[fd01::21]:51930".to_string(), format!("-6 addr del fd01::21/64 dev {near}"))
        }
        (false, Contacted::OnAnotherInterface) => {
            ip(&nss[1], "addr add 10.77.0.1/32 dev lo");
            ip(&nss[2], "route add 10.77.0.1/32 via 10.201.0.11");
            ("10.77.0.1:51930".to_string(), "addr del 10.77.0.1/32 dev lo".to_string())
        }
        (true, Contacted::OnAnotherInterface) => {
            ip(&nss[1], "-6 addr add fd77::1/128 dev lo");
            ip(&nss[2], "-6 route add fd77::1/128 via fd01::11");
            ("[fd77::1]:51930".to_string(), "-6 addr del fd77::1/128 dev lo".to_string())
        }
    };
    let case = format!("{} {contacted:?}", if ipv6 { "IPv6" } else { "IPv4" });
    let dir = private_dir();
    let (ka, kb) = (keys(dir.path(), "a"), keys(dir.path(), "b"));
    let (na, nb) = (unique("wsa"), unique("wsb"));
    let a = Endpoint::start(&nss[1], Impl::Turbotun, &na);
    let b = Endpoint::start(&nss[2], Impl::WireguardGo, &nb);
    let file = |k: &Keys| k.private_file.to_str().unwrap().to_string();
    wg_line(
        &nss[1],
        &format!("set {na} private-key {} listen-port 51930 peer {} allowed-ips 10.202.0.2/32", file(&ka), kb.public),
    );
    wg_line(
        &nss[2],
        &format!(
            "set {nb} private-key {} listen-port 51931 peer {} endpoint {reached} allowed-ips 10.202.0.1/32",
            file(&kb),
            ka.public
        ),
    );
    bring_up(&nss[1], &na, "10.202.0.1");
    bring_up(&nss[2], &nb, "10.202.0.2");
    // wireguard-go starts (its handshake to the contacted address), then traffic both ways: the handshake
    // response, echo replies and segmented TCP from the endpoint all leave from the contacted address.
    assert!(ping_within(&nss[2], "10.202.0.1", 5), "{case}: wireguard-go -> turbotun");
    assert!(ping(&nss[1], "10.202.0.2"), "{case}: turbotun -> wireguard-go");
    tcp_intact(&nss[1], &nss[2], "10.202.0.2", 4 << 20);
    assert_eq!(endpoint_of_peer(&nss[2], &nb), reached, "{case}: wireguard-go's endpoint for turbotun");
    let peer_underlay = if ipv6 { "[fd01::12]:51931" } else { "10.201.0.12:51931" };
    assert_eq!(endpoint_of_peer(&nss[1], &na), peer_underlay, "{case}: turbotun's endpoint for wireguard-go");
    // The contacted address goes away: the next reply is refused from it, forgotten, and leaves from the
    // routing's choice (the first address); wireguard-go follows it there.
    ip(&nss[1], &gone);
    assert!(ping_within(&nss[1], "10.202.0.2", 5), "{case}: turbotun -> wireguard-go once the address went");
    let routed = if ipv6 { "[fd01::11]:51930" } else { "10.201.0.11:51930" };
    assert_eq!(endpoint_of_peer(&nss[2], &nb), routed, "{case}: wireguard-go's endpoint after the address went");
    tcp_intact(&nss[2], &nss[1], "10.202.0.1", 1 << 20);
    drop(b);
    a.stop();
}

#[test]
fn replies_leave_from_a_second_address_the_peer_contacted() {
    if !privileged("replies_leave_from_a_second_address_the_peer_contacted") {
        return;
    }
    replies_leave_from_the_contacted_address(false, Contacted::SecondOnTheSameInterface);
    replies_leave_from_the_contacted_address(true, Contacted::SecondOnTheSameInterface);
}

#[test]
fn replies_leave_from_an_address_on_another_interface_than_the_route_back() {
    if !privileged("replies_leave_from_an_address_on_another_interface_than_the_route_back") {
        return;
    }
    replies_leave_from_the_contacted_address(false, Contacted::OnAnotherInterface);
    replies_leave_from_the_contacted_address(true, Contacted::OnAnotherInterface);
}

/// Eight TCP flows at once through the tunnel between 10.202.0.1 (`nss[1]`) and 10.202.0.2 (`nss[2]`), four each
/// way, 8 MiB each, every byte compared. The steering program hashes addresses and ports by XOR, so with even
/// source ports the destination port's parity picks the queue: each way's flows go to both queues of a
/// two-queue endpoint, two on each (the counters show it). The source ports follow from the destination ports
/// (a port of an earlier round may still be in TIME_WAIT).
fn parallel_flows_both_ways(nss: &[OwnedFd], first_port: u16) {
    let mut flows = Vec::new();
    for i in 0..4u16 {
        let (there, back) = (first_port + i, first_port + 10 + i);
        let (from_a, from_b) = (30_000 + 2 * there, 30_000 + 2 * back);
        flows.push(Flow { from: &nss[1], to: &nss[2], to_addr: "10.202.0.2", port: there, source_port: from_a });
        flows.push(Flow { from: &nss[2], to: &nss[1], to_addr: "10.202.0.1", port: back, source_port: from_b });
    }
    tcp_flows_intact(&flows, 8 << 20);
}

/// One counter of each queue of a `turbotun wg` of several queues (`to_network`/`from_network`, `packets`...),
/// from its counters (the closing line, or `turbotun stats --json`).
fn per_queue(c: &serde_json::Value, direction: &str, field: &str) -> Vec<u64> {
    let queues = c["queues"].as_array().unwrap_or_else(|| panic!("no per-queue counters: {c}"));
    queues.iter().map(|q| q[direction][field].as_u64().unwrap()).collect()
}

/// What the queues of a two-queue `turbotun wg` did between its counters `before` (`None`: its start) and
/// `after`, while parallel flows ran: both queues sealed and sent (more than 1000 packets apiece); one queue
/// received all that the one peer sent (its datagrams share one address and port, and the kernel gives one
/// sender's datagrams to one socket of a port's group); nothing dropped as replayed, though the peer (with two
/// queues of its own) sent for one session from both, out of order with each other.
fn queues_since(before: Option<&serde_json::Value>, after: &serde_json::Value, what: &str) {
    assert_eq!(after["drops_by_reason"]["replayed"].as_u64(), Some(0), "{what}: {after}");
    let since = |direction: &str, field: &str| -> Vec<u64> {
        let now = per_queue(after, direction, field);
        let then = before.map_or(vec![0; now.len()], |b| per_queue(b, direction, field));
        now.iter().zip(&then).map(|(n, t)| n - t).collect()
    };
    let sent = since("to_network", "packets");
    assert_eq!(sent.len(), 2, "{what}: {after}");
    assert!(sent.iter().all(|&n| n > 1000), "{what}: each queue sent more than 1000: {sent:?}");
    let received = since("from_network", "segments");
    assert_eq!(received.iter().filter(|&&n| n > 0).count(), 1, "{what}: one socket received the peer: {received:?}");
}

/// A field of `/proc/PID/status` in KiB (`VmRSS:`, `VmHWM:`).
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix(field)).unwrap_or_else(|| panic!("{field} of {pid}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// The UDP sockets bound to `port` in the namespace of process `pid` (IPv4 and IPv6 tables).
fn udp_sockets_on(pid: u32, port: u16) -> usize {
    let bound_to_port = |line: &str| {
        let local = line.split_whitespace().nth(1).and_then(|a| a.rsplit_once(':'));
        local.is_some_and(|(_, hex)| u16::from_str_radix(hex, 16) == Ok(port))
    };
    ["udp", "udp6"]
        .iter()
        .map(|table| std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default())
        .map(|text| text.lines().skip(1).filter(|l| bound_to_port(l)).count())
        .sum()
}

/// `turbotun stats NAME --json` of a running endpoint.
fn stats_json(name: &str) -> serde_json::Value {
    let out = Command::new(TURBOTUN).args(["stats", name, "--json"]).output().unwrap();
    assert!(out.status.success(), "turbotun stats {name}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn two_queue_endpoints_carry_parallel_flows_on_both_queues_without_replays() {
    if !privileged("two_queue_endpoints_carry_parallel_flows_on_both_queues_without_replays") {
        return;
    }
    let p = pair_with(Impl::Turbotun, &["--queues", "2"], Impl::Turbotun, &["--queues", "2"]);
    assert!(ping_within(&p.nss[1], "10.202.0.2", 5), "the tunnel works");
    parallel_flows_both_ways(&p.nss, 7300);
    // Memory with two queues, at work (reported: run with --nocapture).
    for (name, pid) in [(&p.a.name, p.a.pid()), (&p.b.name, p.b.pid())] {
        let (rss, peak) = (status_kb(pid, "VmRSS:"), status_kb(pid, "VmHWM:"));
        eprintln!("{name} --queues 2: VmRSS {rss} KiB, VmHWM {peak} KiB");
    }
    let (a_first, b_first) = (stats_json(&p.a.name), stats_json(&p.b.name));
    queues_since(None, &a_first, "A");
    queues_since(None, &b_first, "B");
    // A new listen port: both queues' sockets move to it (the old port is left), and the flows go on over both.
    assert_eq!((udp_sockets_on(p.a.pid(), 51820), udp_sockets_on(p.a.pid(), 51821)), (2, 0), "one socket a queue");
    wg(&p.nss[1], &["set", &p.a.name, "listen-port", "51850"]);
    assert_eq!(udp_sockets_on(p.a.pid(), 51850), 2, "both queues' sockets bound anew when `wg set` returned");
    // The old ones are closed once the engine on them has stopped, a moment after `wg set` returned.
    wait_for(|| udp_sockets_on(p.a.pid(), 51820) == 0, "the sockets of the old port to be closed");
    assert_eq!(wg(&p.nss[1], &["show", &p.a.name, "listen-port"]).trim(), "51850");
    assert!(ping_within(&p.nss[1], "10.202.0.2", 5), "the tunnel works from the new port");
    parallel_flows_both_ways(&p.nss, 7400);
    let peer_of_b = wg(&p.nss[2], &["show", &p.b.name, "endpoints"]);
    assert!(peer_of_b.trim_end().ends_with("10.201.0.11:51850"), "B follows A to its new port: {peer_of_b}");
    let Pair { a, b, .. } = p;
    for (side, first, out) in [("A", a_first, a.stop()), ("B", b_first, b.stop())] {
        let c = counters(&out);
        nothing_lost_but_unroutable(&c);
        // A's new port is another address to B too: each side's receiving may be on another queue now.
        queues_since(Some(&first), &c, &format!("{side}, from the new port"));
    }
}

#[test]
fn a_two_queue_turbotun_wg_and_wireguard_go_interoperate_both_ways() {
    if !privileged("a_two_queue_turbotun_wg_and_wireguard_go_interoperate_both_ways") {
        return;
    }
    let queues: &[&str] = &["--queues", "2"];
    for (first, second) in [(Impl::Turbotun, Impl::WireguardGo), (Impl::WireguardGo, Impl::Turbotun)] {
        let what = format!("{first:?} -> {second:?}");
        // The first side pings first, so each program starts the handshake once.
        let p = pair_with(first, queues, second, queues);
        assert!(ping_within(&p.nss[1], "10.202.0.2", 5), "{what}: no ping answer");
        assert!(ping(&p.nss[2], "10.202.0.1"), "{what}");
        parallel_flows_both_ways(&p.nss, 7500);
        common::udp_datagrams_between(&p.nss[1], &p.nss[2], "10.202.0.1", "10.202.0.2", false, false, 50);
        common::udp_datagrams_between(&p.nss[2], &p.nss[1], "10.202.0.2", "10.202.0.1", false, false, 50);
        for (ns, name) in [(&p.nss[1], &p.a.name), (&p.nss[2], &p.b.name)] {
            let dump = wg(ns, &["show", name, "dump"]);
            let peer: Vec<&str> = dump.lines().nth(1).expect("one peer line").split('\t').collect();
            let (rx, tx): (u64, u64) = (peer[5].parse().unwrap(), peer[6].parse().unwrap());
            assert!(rx > 32 << 20 && tx > 32 << 20, "{what}: {name} rx {rx} tx {tx}");
        }
        let Pair { a, b, .. } = p;
        let turbotun = if first == Impl::Turbotun { a } else { b };
        let c = counters(&turbotun.stop());
        nothing_lost_but_unroutable(&c);
        queues_since(None, &c, &what);
    }
}
