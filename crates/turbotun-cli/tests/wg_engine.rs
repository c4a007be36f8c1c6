//! `turbotun wg`'s tunnel engine and UDP layer against the real programs: a listen port that is one endpoint's
//! alone, ICMP errors for packets no peer takes, and replies that leave from the address the peer contacted. Each
//! test builds its own namespaces and removes everything it made, however it ends.

mod common;

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::process::Command;

use common::wg::*;
use common::{ns_path, privileged};
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

/// `ping` in `ns`, once, and what it printed.
fn ping_output(ns: &OwnedFd, dst: &str) -> String {
    let out = with_netns(&ns_path(ns), || Command::new("ping").args(["-c", "1", "-W", "2", dst]).output())
        .unwrap()
        .expect("ping (apt: iputils-ping)");
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    // kernel's WireGuard tells it (wireguard-go drops them without a word).
    for (dst, said) in [
        ("10.202.0.77", "Destination Host Unreachable"),
        ("10.202.0.9", "Destination Host Unreachable"),
        ("fd02::77", "Destination unreachable: Address unreachable"),
    ] {
        let out = ping_output(&nss[1], dst);
        assert!(out.contains(said), "ping {dst}: {out}");
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
