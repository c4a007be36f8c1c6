//! A tunnel's UDP port is its own: one socket binds it alone; the sockets of several queues share it only among
//! themselves, after proving it free. Each test runs in a private network namespace, so the ports are its own.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use common::in_netns;
use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
use turbotun::tunnel::bind_sockets;
use turbotun::udp::{RecvSlots, SocketOptions, TunnelSocket};

/// What binding `addr` with `SO_REUSEPORT` set (as any program may) gets: the errno of a refusal.
fn reuseport_bind(addr: SocketAddr) -> Result<rustix::fd::OwnedFd, i32> {
    let family = if addr.is_ipv6() { AddressFamily::INET6 } else { AddressFamily::INET };
    let fd = rustix::net::socket_with(family, SocketType::DGRAM, SocketFlags::CLOEXEC, None).unwrap();
    sockopt::set_socket_reuseport(&fd, true).unwrap();
    if addr.is_ipv6() {
        sockopt::set_ipv6_v6only(&fd, false).unwrap();
    }
    rustix::net::bind(&fd, &addr).map(|()| fd).map_err(|e| e.raw_os_error())
}

fn up_lo() {
    turbotun::netlink::Netlink::new().unwrap().set_up("lo", true).unwrap();
}

#[test]
fn one_socket_holds_its_port_alone() {
    in_netns("one_socket_holds_its_port_alone", || {
        up_lo();
        for local in ["127.0.0.1:0", "[::]:0"] {
            let options = SocketOptions { dual_stack: true, ..SocketOptions::default() };
            let sockets = bind_sockets(local.parse().unwrap(), 1, &options).unwrap();
            let port = sockets[0].local_addr().unwrap().port();
            let taken = SocketAddr::new(sockets[0].local_addr().unwrap().ip(), port);
            // Neither a program that asks to share the port nor one that does not gets it, on either family.
            assert_eq!(reuseport_bind(taken).err(), Some(libc::EADDRINUSE), "{local}: SO_REUSEPORT joined");
            let wildcard = SocketAddr::from(([0, 0, 0, 0], port));
            assert_eq!(reuseport_bind(wildcard).err(), Some(libc::EADDRINUSE), "{local}: 0.0.0.0:{port} joined");
            assert!(UdpSocket::bind(taken).is_err(), "{local}: a plain socket bound {taken}");
            // Nor a second endpoint of this library.
            let again = bind_sockets(taken, 1, &options).unwrap_err();
            assert_eq!(again.raw_os_error(), Some(libc::EADDRINUSE), "{again}");
            assert!(again.to_string().contains("Address already in use"), "{again}");
            let single = TunnelSocket::bind(taken, &options).unwrap_err();
            assert_eq!(single.raw_os_error(), Some(libc::EADDRINUSE), "{single}");
        }
    });
}

#[test]
fn the_queues_of_a_tunnel_share_a_port_they_proved_free() {
    in_netns("the_queues_of_a_tunnel_share_a_port_they_proved_free", || {
        up_lo();
        // A port another program shares (SO_REUSEPORT, the same user): a tunnel of two queues does not join it.
        let other = UdpSocket::from(reuseport_bind("127.0.0.1:0".parse().unwrap()).unwrap());
        let held = other.local_addr().unwrap();
        let refused = bind_sockets(held, 2, &SocketOptions::default()).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EADDRINUSE), "{refused}");
        drop(other);

        // Two queues on one port: both sockets bound to it, each receiving part of the remote addresses.
        let sockets = bind_sockets("127.0.0.1:0".parse().unwrap(), 2, &SocketOptions::default()).unwrap();
        let local = sockets[0].local_addr().unwrap();
        assert_eq!(sockets[1].local_addr().unwrap(), local);
        // Once the group is bound, a program that does not share it is kept out.
        assert!(UdpSocket::bind(local).is_err());
        let mut received = [0usize; 2];
        let mut slots = RecvSlots::new(8, 2048);
        for _ in 0..64 {
            let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
            sender.send_to(b"which socket", local).unwrap();
            // Looked for on both sockets for up to 5 s (loopback loses nothing: it is there at once).
            let got = (0..500).any(|_| {
                for (i, socket) in sockets.iter().enumerate() {
                    if socket.recv(&mut slots).unwrap() > 0 {
                        received[i] += 1;
                        return true;
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
                false
            });
            assert!(got, "a datagram to {local} reached neither socket");
        }
        assert!(received[0] > 0 && received[1] > 0, "64 remote addresses all reached one socket: {received:?}");
        assert_eq!(received[0] + received[1], 64);
    });
}

/// The joiner: while a tunnel's group of sockets holds a port, a socket of root's with `SO_REUSEPORT` set joins it
/// on no address (the wildcard of either family, or the group's own): the group's sockets are owned by a uid no
/// account has, and the kernel lets only a socket of the same owner join. So too for a group bound from sockets
/// reserved beforehand; a reserve too small for a group refuses it and keeps what it has.
#[test]
fn no_socket_joins_a_tunnels_port_group() {
    in_netns("no_socket_joins_a_tunnels_port_group", || {
        up_lo();
        let dual = SocketOptions { dual_stack: true, ..SocketOptions::default() };
        let reserve = turbotun::udp::SocketReserve::new(6).unwrap();
        for (local, reserved) in [("[::]:0", false), ("0.0.0.0:0", false), ("127.0.0.1:0", false), ("[::]:0", true)] {
            let sockets = match reserved {
                false => bind_sockets(local.parse().unwrap(), 2, &dual).unwrap(),
                true => turbotun::tunnel::bind_sockets_with(local.parse().unwrap(), 2, &dual, Some(&reserve)).unwrap(),
            };
            let at = sockets[0].local_addr().unwrap();
            let port = at.port();
            let v4 = if at.ip().is_loopback() { at } else { SocketAddr::from(([0, 0, 0, 0], port)) };
            for joiner in [SocketAddr::from(([0u16; 8], port)), SocketAddr::from(([0, 0, 0, 0], port)), v4, at] {
                assert_eq!(
                    reuseport_bind(joiner).err(),
                    Some(libc::EADDRINUSE),
                    "{local} (reserved: {reserved}): a socket with SO_REUSEPORT joined the group at {joiner}"
                );
            }
        }
        assert_eq!(reserve.left(), 4, "the reserved group took two sockets");
        let refused = turbotun::tunnel::bind_sockets_with("[::]:0".parse().unwrap(), 6, &dual, Some(&reserve));
        let e = refused.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        assert!(e.to_string().contains("4 of the sockets reserved for a new port are left, 6 needed"), "{e}");
        assert_eq!(reserve.left(), 4, "a refused group takes nothing");
        let v4 = turbotun::tunnel::bind_sockets_with("0.0.0.0:0".parse().unwrap(), 2, &dual, Some(&reserve));
        assert_eq!(v4.unwrap_err().raw_os_error(), Some(libc::EAFNOSUPPORT), "an IPv6 reserve for an IPv4 group");
    });
}
