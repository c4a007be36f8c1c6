//! Replies leave from the address a remote contacted: a tunnel socket on a wildcard address reads the local
//! address of each datagram, remembers it per remote once told to, sends to that remote from it (one datagram or a
//! segmented run), and forgets it when it goes away. Each test runs in a private network namespace with two
//! addresses of each family on the loopback device.

mod common;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use common::in_netns;
use turbotun::netlink::Netlink;
use turbotun::stats::Counters;
use turbotun::udp::{Datagram, RecvSlots, SocketOptions, SourceMemo, TunnelSocket};

/// Receives one message on `socket` (up to 5 s): its source, local address and bytes.
fn recv_one(socket: &TunnelSocket, slots: &mut RecvSlots) -> (SocketAddr, Option<IpAddr>, Vec<u8>) {
    assert!(socket.wait_readable(None, Some(Duration::from_secs(5))).unwrap(), "nothing came");
    assert_eq!(socket.recv(slots).unwrap(), 1);
    let (meta, data) = slots.messages().next().unwrap();
    (meta.source.unwrap(), meta.local.map(|l| l.ip), data.to_vec())
}

/// Waits (up to 5 s) until a datagram to `ip` arrives: the kernel makes a new IPv6 address local a moment after
/// adding it (from a work queue).
fn wait_usable(ip: IpAddr) {
    let probe = UdpSocket::bind((ip, 0)).unwrap();
    probe.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let arrived = (0..100).any(|_| {
        let _ = probe.send_to(b"probe", probe.local_addr().unwrap());
        probe.recv(&mut [0u8; 8]).is_ok()
    });
    assert!(arrived, "{ip} never became usable");
}

/// From `peer` (bound to `peer_addr`) to `second`, the socket's second address: the reply to `peer` then leaves
/// from `second`, alone and as a segmented run; once `second` is gone, from the routing's choice, and nothing is
/// lost.
fn replies_follow_the_contacted_address(dual: bool, peer_addr: &str, first: &str, second: &str, prefix: u8) {
    let mut nl = Netlink::new().unwrap();
    nl.set_up("lo", true).unwrap();
    for a in [peer_addr, first, second] {
        nl.add_address("lo", a.parse().unwrap(), prefix).unwrap();
    }
    for a in [peer_addr, first, second] {
        wait_usable(a.parse().unwrap());
    }
    let wildcard = if dual || second.contains(':') { "[::]:0" } else { "0.0.0.0:0" };
    let options = SocketOptions { dual_stack: dual, gro: false, ..SocketOptions::default() };
    let socket = TunnelSocket::bind(wildcard.parse().unwrap(), &options).unwrap();
    let port = socket.local_addr().unwrap().port();
    let peer = UdpSocket::bind((peer_addr, 0)).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let peer_at = peer.local_addr().unwrap();
    let second_ip: IpAddr = second.parse().unwrap();
    let mut slots = RecvSlots::new(4, 65536);
    let mut memo = SourceMemo::default();

    peer.send_to(b"hello", (second_ip, port)).unwrap();
    let (from, local, data) = recv_one(&socket, &mut slots);
    assert_eq!((from, local, &data[..]), (peer_at, Some(second_ip), &b"hello"[..]), "the local address is read");
    // Not yet remembered: the reply leaves from the routing's choice.
    let mut counters = Counters::default();
    socket.send_one(b"before", peer_at, &mut counters).unwrap();
    let mut buf = [0u8; 2048];
    let (n, replied_from) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"before");
    assert_ne!(replied_from.ip(), second_ip, "the routing picked the second address by itself: the test shows nothing");

    socket.remember_source(from, slots.messages().next().unwrap().0.local, &mut memo);
    socket.send_one(b"after", peer_at, &mut counters).unwrap();
    let (n, replied_from) = peer.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], replied_from), (&b"after"[..], SocketAddr::new(second_ip, port)));
    // A run of equal datagrams (one segmented send where the kernel has it) leaves from it too.
    let payloads: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 1000]).collect();
    let run: Vec<Datagram<'_>> = payloads.iter().map(|p| Datagram { data: p, dest: peer_at, ecn: 0 }).collect();
    socket.send_datagrams(&run, None, &mut counters).unwrap();
    for (i, p) in payloads.iter().enumerate() {
        let (n, replied_from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], replied_from), (&p[..], SocketAddr::new(second_ip, port)), "datagram {i} of the run");
    }

    // The address goes away: the send is refused from it, the address forgotten, the datagram sent from the
    // routing's choice, nothing dropped.
    nl.del_address("lo", second_ip, prefix).unwrap();
    let mut counters = Counters::default();
    socket.send_one(b"gone", peer_at, &mut counters).unwrap();
    let (n, replied_from) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"gone");
    assert_ne!(replied_from.ip(), second_ip);
    assert_eq!((counters.packets, counters.drops.total()), (1, 0), "{counters:?}");
}

#[test]
fn replies_follow_the_contacted_address_ipv4() {
    in_netns("replies_follow_the_contacted_address_ipv4", || {
        replies_follow_the_contacted_address(false, "10.9.0.1", "10.9.0.2", "10.9.0.3", 32);
    });
}

#[test]
fn replies_follow_the_contacted_address_ipv4_on_a_dual_stack_socket() {
    in_netns("replies_follow_the_contacted_address_ipv4_on_a_dual_stack_socket", || {
        replies_follow_the_contacted_address(true, "10.9.0.1", "10.9.0.2", "10.9.0.3", 32);
    });
}

#[test]
fn replies_follow_the_contacted_address_ipv6() {
    in_netns("replies_follow_the_contacted_address_ipv6", || {
        replies_follow_the_contacted_address(true, "fd09::1", "fd09::2", "fd09::3", 128);
    });
}

/// A socket bound to one address has no choice to make: it reads no local addresses and remembers none, even
/// when told one: its replies leave from its own address.
#[test]
fn a_socket_on_one_address_remembers_nothing() {
    in_netns("a_socket_on_one_address_remembers_nothing", || {
        // 127.0.0.2 is local too (all of 127/8 is), so a reply could leave from it.
        Netlink::new().unwrap().set_up("lo", true).unwrap();
        let socket = TunnelSocket::bind("127.0.0.1:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        let at = socket.local_addr().unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        peer.send_to(b"x", at).unwrap();
        let mut slots = RecvSlots::new(1, 2048);
        let (from, local, _) = recv_one(&socket, &mut slots);
        assert_eq!(local, None, "no local address read");
        let elsewhere = turbotun::udp::LocalAddr { ip: "127.0.0.2".parse().unwrap(), ifindex: 0 };
        let mut memo = SourceMemo::default();
        socket.remember_source(from, Some(elsewhere), &mut memo);
        assert_eq!(format!("{memo:?}"), format!("{:?}", SourceMemo::default()), "nothing recorded");
        let mut counters = Counters::default();
        socket.send_one(b"reply", from, &mut counters).unwrap();
        let mut buf = [0u8; 64];
        let (n, replied_from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], replied_from), (&b"reply"[..], at), "the reply leaves from the bound address");
    });
}
