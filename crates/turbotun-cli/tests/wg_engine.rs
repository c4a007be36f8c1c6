//! `turbotun wg`'s tunnel engine and UDP layer against the real programs: a listen port that is one endpoint's
//! alone, ICMP errors for packets no peer takes, and replies that leave from the address the peer contacted. Each
//! test builds its own namespaces and removes everything it made, however it ends.

mod common;

use std::net::SocketAddr;
use std::os::fd::OwnedFd;

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
