//! Devices on the real kernel, each test in its own private network namespace.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use common::*;
use turbotun::inspect;
use turbotun::netlink::Netlink;
use turbotun::{DeviceBuilder, Error, Mode, Offloads};

const T: Duration = Duration::from_secs(5);
const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);

/// The kernel sends a datagram into a TUN device and the test reads exactly that packet; then the test writes a
/// packet and a kernel socket receives it.
#[test]
fn tun_roundtrip_kernel_socket() {
    in_netns("tun_roundtrip_kernel_socket", || {
        let name = unique_name("tt");
        let dev = DeviceBuilder::tun().name(&name).open().expect("open tun");
        assert_eq!(dev.name(), name);
        assert_eq!(dev.mode(), Mode::Tun);
        let flags = dev.kernel_flags();
        assert_ne!(flags & turbotun::iff::TUN, 0);
        assert_ne!(flags & turbotun::iff::NO_PI, 0);
        configure_v4(&name, LOCAL, 24);

        let sock = UdpSocket::bind((LOCAL, 0)).unwrap();
        sock.send_to(b"hello tun", (PEER, 9999)).unwrap();
        let q = &dev.queues()[0];
        let mut buf = vec![0u8; 2048];
        let n = recv_matching(q, &mut buf, T, |p| {
            parse_ipv4_udp(p).is_some_and(|(_, d, _, dp, _)| d == PEER && dp == 9999)
        });
        let (src, dst, sport, dport, payload) = parse_ipv4_udp(&buf[..n]).unwrap();
        assert_eq!((src, dst, dport), (LOCAL, PEER, 9999));
        assert_eq!(sport, sock.local_addr().unwrap().port());
        assert_eq!(payload, b"hello tun");

        let rx = UdpSocket::bind((LOCAL, 7777)).unwrap();
        rx.set_read_timeout(Some(T)).unwrap();
        let pkt = ipv4_udp(PEER, LOCAL, 5555, 7777, b"hello kernel");
        assert_eq!(q.send(&pkt).unwrap(), pkt.len());
        let mut got = [0u8; 64];
        let (len, from) = rx.recv_from(&mut got).expect("kernel socket receives the written packet");
        assert_eq!(&got[..len], b"hello kernel");
        assert_eq!(from, (PEER, 5555).into());
        let stats = q.stats();
        assert!(stats.rx_packets >= 1 && stats.tx_packets == 1, "{stats:?}");
    });
}

/// TAP: the kernel's ARP request for a neighbour arrives as an Ethernet frame; a frame written to the device's
/// MAC reaches a socket.
#[test]
fn tap_roundtrip_ethernet() {
    in_netns("tap_roundtrip_ethernet", || {
        let name = unique_name("tp");
        let dev = DeviceBuilder::tap().name(&name).open().expect("open tap");
        assert_eq!(dev.mode(), Mode::Tap);
        let mut nl = Netlink::new().unwrap();
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        nl.set_mac(&name, mac).unwrap();
        assert_eq!(nl.link(&name).unwrap().mac, Some(mac));
        configure_v4(&name, LOCAL, 24);

        let sock = UdpSocket::bind((LOCAL, 0)).unwrap();
        sock.send_to(b"x", (PEER, 9)).unwrap();
        let q = &dev.queues()[0];
        let mut buf = vec![0u8; 2048];
        // ARP request: ethertype 0x0806, opcode 1, target protocol address PEER.
        let n = recv_matching(q, &mut buf, T, |f| f.len() >= 42 && f[12..14] == [0x08, 0x06] && f[20..22] == [0, 1]);
        assert_eq!(&buf[6..12], &mac, "sent from the device's MAC");
        assert_eq!(&buf[38..42], &PEER.octets());
        assert!(n >= 42);

        let rx = UdpSocket::bind((LOCAL, 7778)).unwrap();
        rx.set_read_timeout(Some(T)).unwrap();
        let mut frame = Vec::new();
        frame.extend_from_slice(&mac);
        frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x99]);
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&ipv4_udp(PEER, LOCAL, 5555, 7778, b"over ethernet"));
        q.send(&frame).unwrap();
        let mut got = [0u8; 64];
        let (len, _) = rx.recv_from(&mut got).expect("frame delivered");
        assert_eq!(&got[..len], b"over ethernet");
    });
}

/// Each virtio header size is accepted, reported back by the kernel, and frames packets both ways.
#[test]
fn vnet_hdr_sizes_roundtrip() {
    in_netns("vnet_hdr_sizes_roundtrip", || {
        for size in [10usize, 12, 20] {
            let name = unique_name("tv");
            let dev = DeviceBuilder::tun().name(&name).vnet_hdr(size).open().expect("open");
            assert_eq!(dev.vnet_hdr_len(), size);
            assert_eq!(dev.kernel_vnet_hdr_len().unwrap(), size);
            assert!(dev.offloads().is_empty());
            configure_v4(&name, LOCAL, 24);
            let q = &dev.queues()[0];

            let sock = UdpSocket::bind((LOCAL, 0)).unwrap();
            sock.send_to(b"with header", (PEER, 4000 + size as u16)).unwrap();
            let mut buf = vec![0u8; 2048];
            let n = recv_matching(q, &mut buf, T, |p| {
                p.len() > size
                    && parse_ipv4_udp(&p[size..]).is_some_and(|(_, d, _, dp, _)| d == PEER && dp == 4000 + size as u16)
            });
            let hdr = turbotun::wire::VirtioNetHdrRepr::parse(&buf[..size]).unwrap();
            assert_eq!(hdr.gso_type, 0, "no offload granted, so no GSO");
            assert_eq!(parse_ipv4_udp(&buf[size..n]).unwrap().4, b"with header");

            let rx = UdpSocket::bind((LOCAL, 7000 + size as u16)).unwrap();
            rx.set_read_timeout(Some(T)).unwrap();
            q.send(&ipv4_udp(PEER, LOCAL, 1, 7000 + size as u16, b"sent behind header")).unwrap();
            let mut got = [0u8; 64];
            let (len, _) = rx.recv_from(&mut got).expect("delivered");
            assert_eq!(&got[..len], b"sent behind header");
            // A raw write without room for the header is refused by the kernel (EINVAL), not half-parsed.
            assert!(q.send_raw(&[0u8; 4]).is_err());
        }
    });
}

/// The granted offloads are what the kernel shows through ethtool, and a persistent device reopened without
/// offloads has its mask reset.
#[test]
fn offload_negotiation_and_persist_reset() {
    in_netns("offload_negotiation_and_persist_reset", || {
        let name = unique_name("to");
        let dev = DeviceBuilder::tun()
            .name(&name)
            .vnet_hdr(12)
            .offloads(Offloads::ALL)
            .persist(true)
            .open()
            .expect("open with offloads");
        let granted = dev.offloads();
        assert!(granted.contains(Offloads::TCP), "every supported kernel grants csum+tso4+tso6: {granted}");
        let caps = turbotun::Capabilities::get().unwrap();
        assert_eq!(granted.contains(Offloads::USO4 | Offloads::USO6), caps.uso());
        let shown = inspect::device_offloads(&name).expect("ethtool features");
        assert_eq!(shown, granted, "ethtool's view of the device matches what the builder reports");
        if let Some(text) = ethtool_k(&name) {
            assert!(text.contains("tx-tcp-segmentation: on"), "{text}");
            assert!(text.contains("tx-tcp6-segmentation: on"), "{text}");
        }
        drop(dev);

        let mut nl = Netlink::new().unwrap();
        let report = inspect::inspect(&mut nl, &name).expect("persistent device still there");
        assert!(report.persist);
        assert_eq!(report.queues, 0);
        assert_eq!(report.offloads, Some(granted), "offload mask persists with the device");

        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(12).open().expect("reopen without offloads");
        assert_eq!(dev.offloads(), Offloads::NONE);
        assert_eq!(inspect::device_offloads(&name).unwrap(), Offloads::NONE, "TUNSETOFFLOAD(0) reset the mask");
        dev.set_persist(false).unwrap();
        drop(dev);
        assert!(matches!(nl.link(&name), Err(Error::NoSuchDevice { .. })), "gone once not persistent and closed");
    });
}

fn ethtool_k(name: &str) -> Option<String> {
    let out = std::process::Command::new("ethtool").arg("-k").arg(name).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Four queues: each is an fd the kernel reports; detach and attach; traffic from many flows reaches the queues.
#[test]
fn multiqueue_four_queues_detach_attach() {
    in_netns("multiqueue_four_queues_detach_attach", || {
        let name = unique_name("tm");
        let dev = DeviceBuilder::tun().name(&name).queues(4).nonblocking(true).open().expect("open 4 queues");
        assert_eq!(dev.queues().len(), 4);
        assert_ne!(dev.kernel_flags() & turbotun::iff::MULTI_QUEUE, 0);
        assert_eq!(inspect::queue_holders(&name).len(), 4, "four fds attached, as /proc fdinfo shows");
        let mut nl = Netlink::new().unwrap();
        let report = inspect::inspect(&mut nl, &name).unwrap();
        assert_eq!((report.queues, report.disabled_queues), (4, 0));
        assert!(report.flag_names.contains(&"multi_queue"), "{:?}", report.flag_names);
        configure_v4(&name, LOCAL, 24);

        let q1 = &dev.queues()[1];
        q1.detach().expect("detach");
        assert_eq!(inspect::inspect(&mut nl, &name).unwrap().disabled_queues, 1);
        assert!(q1.detach().is_err(), "detaching a detached queue is refused");
        q1.attach().expect("attach");

        // Many flows: the kernel spreads them over the queues; every datagram must arrive on exactly one queue.
        let sock = UdpSocket::bind((LOCAL, 0)).unwrap();
        let flows = 64u16;
        for port in 0..flows {
            sock.send_to(b"mq", (PEER, 20000 + port)).unwrap();
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut per_queue = [0usize; 4];
        let mut buf = vec![0u8; 2048];
        let deadline = std::time::Instant::now() + T;
        while seen.len() < usize::from(flows) && std::time::Instant::now() < deadline {
            for (i, q) in dev.queues().iter().enumerate() {
                match q.recv_raw(&mut buf) {
                    Ok(n) => {
                        if let Some((_, dst, _, dport, _)) = parse_ipv4_udp(&buf[..n]) {
                            if dst == PEER && (20000..20000 + flows).contains(&dport) {
                                assert!(seen.insert(dport), "datagram to port {dport} delivered twice");
                                per_queue[i] += 1;
                            }
                        }
                    }
                    Err(e) if e.is_would_block() => {}
                    Err(e) => panic!("queue {i}: {e}"),
                }
            }
        }
        assert_eq!(seen.len(), usize::from(flows), "every flow's datagram arrived; per queue {per_queue:?}");
        assert!(per_queue.iter().filter(|&&c| c > 0).count() >= 2, "flows spread over queues: {per_queue:?}");
    });
}

#[test]
fn packet_info_header_when_asked() {
    in_netns("packet_info_header_when_asked", || {
        let name = unique_name("tpi");
        let dev = DeviceBuilder::tun().name(&name).packet_info(true).open().unwrap();
        let mut nl = Netlink::new().unwrap();
        assert_eq!(nl.link(&name).unwrap().tun.map(|t| t.no_pi), Some(false), "the device keeps packet info");
        configure_v4(&name, LOCAL, 24);
        UdpSocket::bind((LOCAL, 0)).unwrap().send_to(b"pi", (PEER, 1234)).unwrap();
        let mut buf = vec![0u8; 2048];
        let n = recv_matching(&dev.queues()[0], &mut buf, T, |p| {
            p.len() > 4 && parse_ipv4_udp(&p[4..]).is_some_and(|(_, _, _, dp, _)| dp == 1234)
        });
        assert_eq!(&buf[2..4], &[0x08, 0x00], "struct tun_pi carries the EtherType of IPv4");
        assert!(n > 32);
    });
}

#[test]
fn error_busy_with_exclusive() {
    in_netns("error_busy_with_exclusive", || {
        let name = unique_name("tb");
        let _first = DeviceBuilder::tun().name(&name).open().unwrap();
        let err = DeviceBuilder::tun().name(&name).exclusive(true).open().unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert!(err.to_string().contains(&name) && err.to_string().contains("EBUSY"), "{err}");
        // Exclusive creation of a multiqueue device: only the creating open is exclusive.
        let mq = unique_name("tbx");
        let dev = DeviceBuilder::tun().name(&mq).exclusive(true).queues(3).open().expect("exclusive multiqueue");
        assert_eq!(dev.queues().len(), 3);
    });
}

/// A private namespace comes with its loopback up: a datagram to 127.0.0.1 arrives.
#[test]
fn private_netns_loopback_up() {
    in_netns("private_netns_loopback_up", || {
        let lo = Netlink::new().unwrap().link("lo").unwrap();
        assert!(lo.is_up(), "{lo:?}");
        let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        rx.set_read_timeout(Some(T)).unwrap();
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        tx.send_to(b"lo", rx.local_addr().unwrap()).unwrap();
        let mut got = [0u8; 8];
        assert_eq!(rx.recv(&mut got).unwrap(), 2);
    });
}

/// `multi_queue(true)` creates a multiqueue device with a single fd; further queues attach to it later, and an
/// existing single-queue device is refused with the fix named.
#[test]
fn multi_queue_with_one_queue() {
    in_netns("multi_queue_with_one_queue", || {
        let mq_flag = libc::IFF_MULTI_QUEUE as u16;
        let name = unique_name("tw");
        let dev = DeviceBuilder::tun().name(&name).multi_queue(true).open().expect("multiqueue, one queue");
        assert_eq!(dev.queues().len(), 1);
        assert_ne!(dev.kernel_flags() & mq_flag, 0, "flags {:#x}", dev.kernel_flags());
        assert!(dev.notes().is_empty(), "{:?}", dev.notes());
        assert_eq!(inspect::queue_holders(&name).len(), 1, "one fd attached");
        let mut nl = Netlink::new().unwrap();
        let tun = nl.link(&name).unwrap().tun.expect("tun attributes");
        assert!(tun.multi_queue, "{tun:?}");
        assert_eq!(tun.num_queues, 1);

        let second = DeviceBuilder::tun().name(&name).multi_queue(true).open().expect("a second queue attaches");
        assert!(second.notes().is_empty(), "the flag matched, nothing to adapt: {:?}", second.notes());
        assert_eq!(inspect::queue_holders(&name).len(), 2);

        let single = unique_name("tv");
        let plain = DeviceBuilder::tun().name(&single).open().unwrap();
        assert_eq!(plain.kernel_flags() & mq_flag, 0);
        let err = DeviceBuilder::tun().name(&single).multi_queue(true).open().unwrap_err();
        assert!(err.to_string().contains("exists without multi_queue"), "{err}");
        assert!(err.to_string().contains("multi_queue(false)"), "the error names the fix: {err}");
    });
}

#[test]
fn error_multiqueue_mismatch_and_flip() {
    in_netns("error_multiqueue_mismatch_and_flip", || {
        let single = unique_name("ts");
        let _a = DeviceBuilder::tun().name(&single).open().unwrap();
        let err = DeviceBuilder::tun().name(&single).queues(2).open().unwrap_err();
        assert!(matches!(err, Error::MultiQueueMismatch { .. }), "{err}");
        assert!(err.to_string().contains("queues(1)"), "the error names the fix: {err}");

        let multi = unique_name("tq");
        let _b = DeviceBuilder::tun().name(&multi).queues(2).open().unwrap();
        let flipped = DeviceBuilder::tun().name(&multi).open().expect("one queue of a multiqueue device");
        assert!(flipped.notes().iter().any(|n| n.contains("multi_queue")), "{:?}", flipped.notes());
        assert_eq!(inspect::queue_holders(&multi).len(), 3);
    });
}

#[test]
fn error_tun_vs_tap_mismatch() {
    in_netns("error_tun_vs_tap_mismatch", || {
        let name = unique_name("tx");
        let _tun = DeviceBuilder::tun().name(&name).open().unwrap();
        let err = DeviceBuilder::tap().name(&name).open().unwrap_err();
        assert!(matches!(err, Error::FramingMismatch { .. }), "{err}");
        assert!(err.to_string().contains("it is a tun device, this open asks for tap"), "{err}");
    });
}

/// Deleting the device under an open queue: reads and writes report that the device is gone.
#[test]
fn error_device_gone_after_delete() {
    in_netns("error_device_gone_after_delete", || {
        let name = unique_name("tg");
        let dev = DeviceBuilder::tun().name(&name).open().unwrap();
        Netlink::new().unwrap().delete_link(&name).expect("delete through rtnetlink");
        let mut buf = [0u8; 64];
        let err = dev.queues()[0].recv_raw(&mut buf).unwrap_err();
        assert!(err.is_device_gone(), "{err}");
        let err = dev.queues()[0].send(&ipv4_udp(PEER, LOCAL, 1, 2, b"x")).unwrap_err();
        assert!(err.is_device_gone(), "{err}");
    });
}

/// Writing to a device that is down is reported as such.
#[test]
fn error_device_down_on_write() {
    in_netns("error_device_down_on_write", || {
        let name = unique_name("td");
        let dev = DeviceBuilder::tun().name(&name).open().unwrap();
        let err = dev.queues()[0].send(&ipv4_udp(PEER, LOCAL, 1, 2, b"x")).unwrap_err();
        assert!(matches!(err, Error::DeviceDown { .. }), "{err}");
    });
}

#[test]
fn error_invalid_names_and_configs() {
    // No privileges needed: these are refused before any system call.
    for bad in ["", "this-name-is-too-long", "a/b", "a b", "eth0:1"] {
        let err = DeviceBuilder::tun().name(bad).open().unwrap_err();
        assert!(matches!(err, Error::InvalidName { .. }), "{bad:?}: {err}");
    }
    let err = DeviceBuilder::tun().vnet_hdr(11).open().unwrap_err();
    assert!(err.to_string().contains("10, 12, 20 or 24"), "{err}");
    let err = DeviceBuilder::tun().offloads(Offloads::TCP).open().unwrap_err();
    assert!(err.to_string().contains("vnet_hdr"), "{err}");
    let err = DeviceBuilder::tun().vnet_hdr(10).offloads(Offloads::USO4).open().unwrap_err();
    assert!(err.to_string().contains("USO4 and USO6"), "{err}");
    let err = DeviceBuilder::tun().queues(0).open().unwrap_err();
    assert!(err.to_string().contains("queues(0)"), "{err}");
}

/// `backpressure(true)` opens on any kernel: granted where TUNGETFEATURES lists IFF_BACKPRESSURE, otherwise the
/// device opens without it and a note says so; `txqueuelen` is the length rtnetlink reports afterwards.
#[test]
fn backpressure_requested_and_txqueuelen() {
    in_netns("backpressure_requested_and_txqueuelen", || {
        let name = unique_name("tb");
        let dev = DeviceBuilder::tun().name(&name).backpressure(true).txqueuelen(321).open().unwrap();
        let offered = turbotun::Capabilities::get().unwrap().backpressure();
        assert_eq!(dev.backpressure(), offered);
        let noted = dev.notes().iter().any(|n| n.contains("IFF_BACKPRESSURE is not in this kernel"));
        assert_eq!(noted, !offered, "{:?}", dev.notes());
        assert_eq!(Netlink::new().unwrap().link(&name).unwrap().txqueuelen, 321);
        // Not asked for: never set, never noted.
        let other = unique_name("tb");
        let dev = DeviceBuilder::tun().name(&other).open().unwrap();
        assert!(!dev.backpressure() && dev.notes().is_empty(), "{:?}", dev.notes());
    });
}

/// Netlink configuration: MTU, txqueuelen, addresses v4/v6, routes, up/down, statistics.
#[test]
fn netlink_configuration() {
    in_netns("netlink_configuration", || {
        let name = unique_name("tn");
        let _dev = DeviceBuilder::tun().name(&name).open().unwrap();
        let mut nl = Netlink::new().unwrap();
        nl.set_mtu(&name, 1400).unwrap();
        nl.set_txqueuelen(&name, 1234).unwrap();
        nl.add_address(&name, LOCAL.into(), 24).unwrap();
        let v6: std::net::IpAddr = "fd00:9::1".parse().unwrap();
        nl.add_address(&name, v6, 64).unwrap();
        nl.set_up(&name, true).unwrap();
        nl.add_route("10.77.0.0".parse().unwrap(), 16, &name).unwrap();
        let link = nl.link(&name).unwrap();
        assert_eq!((link.mtu, link.txqueuelen, link.is_up()), (1400, 1234, true));
        let addrs = nl.addresses(&name).unwrap();
        assert!(addrs.contains(&(LOCAL.into(), 24)) && addrs.contains(&(v6, 64)), "{addrs:?}");
        // The route works: a datagram to 10.77.1.1 leaves through the device.
        UdpSocket::bind((LOCAL, 0)).unwrap().send_to(b"r", ("10.77.1.1", 53)).unwrap();
        let mut buf = vec![0u8; 2048];
        recv_matching(&_dev.queues()[0], &mut buf, T, |p| {
            parse_ipv4_udp(p).is_some_and(|(_, d, _, _, _)| d == Ipv4Addr::new(10, 77, 1, 1))
        });
        assert!(nl.stats(&name).unwrap().tx_packets >= 1);
        // A route through a gateway on the device's prefix: 10.78.0.0/16 leaves through the device too.
        let gateway = Ipv4Addr::from(u32::from(LOCAL) + 1);
        nl.add_route_via("10.78.0.0".parse().unwrap(), 16, gateway.into()).unwrap();
        UdpSocket::bind((LOCAL, 0)).unwrap().send_to(b"g", ("10.78.2.2", 53)).unwrap();
        recv_matching(&_dev.queues()[0], &mut buf, T, |p| {
            parse_ipv4_udp(p).is_some_and(|(_, d, _, _, _)| d == Ipv4Addr::new(10, 78, 2, 2))
        });
        // A local route makes a whole prefix this host's: any of its addresses can be bound, none added.
        let anyip = Ipv4Addr::new(10, 79, 3, 4);
        assert!(UdpSocket::bind((anyip, 0)).is_err(), "10.79.3.4 is nobody's address yet");
        nl.add_local_route("10.79.0.0".parse().unwrap(), 16).unwrap();
        let bound = UdpSocket::bind((anyip, 0)).unwrap();
        UdpSocket::bind((LOCAL, 0)).unwrap().send_to(b"l", bound.local_addr().unwrap()).unwrap();
        bound.set_read_timeout(Some(T)).unwrap();
        assert_eq!(bound.recv(&mut buf).unwrap(), 1, "delivered here, not sent out");
        let err = nl.add_local_route("10.79.0.0".parse().unwrap(), 16).unwrap_err();
        assert!(err.to_string().contains("local route 10.79.0.0/16"), "{err}");
        nl.del_address(&name, LOCAL.into(), 24).unwrap();
        assert!(!nl.addresses(&name).unwrap().contains(&(LOCAL.into(), 24)));
        nl.set_up(&name, false).unwrap();
        assert!(!nl.link(&name).unwrap().is_up());
        let err = nl.set_mtu("nosuchdev0", 1500).unwrap_err();
        assert!(matches!(err, Error::NoSuchDevice { .. }), "{err}");
        let err = nl.add_address(&name, LOCAL.into(), 33).unwrap_err();
        assert!(matches!(err, Error::OutOfRange { what: "prefix length", value: 33, .. }), "{err}");
        assert!(err.to_string().contains("0 to 32"), "{err}");
    });
}

/// The tun tail drop shows as TX dropped: nobody reads while the kernel sends more than the queue holds.
#[test]
fn tail_drop_counted_as_tx_dropped() {
    in_netns("tail_drop_counted_as_tx_dropped", || {
        let name = unique_name("tt");
        let _dev = DeviceBuilder::tun().name(&name).open().unwrap();
        let mut nl = Netlink::new().unwrap();
        nl.set_txqueuelen(&name, 16).unwrap();
        configure_v4(&name, LOCAL, 24);
        let sock = UdpSocket::bind((LOCAL, 0)).unwrap();
        for _ in 0..200 {
            let _ = sock.send_to(&[0u8; 100], (PEER, 9));
        }
        let stats = nl.stats(&name).unwrap();
        assert!(stats.tx_dropped > 0, "packets beyond the ring are counted as dropped: {stats:?}");
    });
}

/// Moving a device to another namespace keeps the fd attached; the device's namespace is reported.
#[test]
fn move_to_netns_keeps_fd() {
    in_netns("move_to_netns_keeps_fd", || {
        let name = unique_name("tmv");
        let dev = DeviceBuilder::tun().name(&name).open().unwrap();
        let before = dev.netns().unwrap();
        // A second private namespace, kept alive by a thread that waits until we are done.
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            turbotun::netns::with_private_netns(move || {
                tx.send(format!("/proc/{}/task/{}/ns/net", std::process::id(), gettid())).unwrap();
                let _ = done_rx.recv();
            })
            .unwrap();
        });
        let path = rx.recv().unwrap();
        let mut nl = Netlink::new().unwrap();
        nl.move_to_netns(&name, std::path::Path::new(&path)).expect("move");
        assert!(matches!(nl.link(&name), Err(Error::NoSuchDevice { .. })), "gone from this namespace");
        let mut there = Netlink::in_netns(std::path::Path::new(&path)).unwrap();
        there.add_address(&name, LOCAL.into(), 24).unwrap();
        there.set_up(&name, true).unwrap();
        let after = dev.netns().unwrap();
        assert_ne!(ns_inode(&before), ns_inode(&after), "TUNGETDEVNETNS follows the device");
        done_tx.send(()).unwrap();
        holder.join().unwrap();
    });
}

fn gettid() -> i32 {
    // /proc/thread-self points at /proc/PID/task/TID.
    std::fs::read_link("/proc/thread-self").unwrap().file_name().unwrap().to_string_lossy().parse().unwrap()
}

fn ns_inode(fd: &std::os::fd::OwnedFd) -> u64 {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap().ino()
}

/// Without CAP_NET_ADMIN, creating a device fails with an error that names the capability. The test re-runs itself
/// in a child whose bounding set lacks CAP_NET_ADMIN (setpriv from util-linux).
#[test]
fn error_missing_cap_net_admin() {
    if std::env::var("TURBOTUN_TEST_NO_NET_ADMIN").is_ok() {
        let caps = turbotun::effective_capabilities().unwrap();
        assert_eq!(caps & (1 << 12), 0, "child must run without CAP_NET_ADMIN");
        let err = DeviceBuilder::tun().name("ttnocap0").open().unwrap_err();
        assert!(matches!(err, Error::PermissionDenied { .. }), "{err}");
        assert!(err.to_string().contains("CAP_NET_ADMIN"), "{err}");
        return;
    }
    let caps = turbotun::effective_capabilities().unwrap_or(0);
    if caps & (1 << 12) == 0 {
        // Already unprivileged: the child's assertions hold here directly.
        let err = DeviceBuilder::tun().name("ttnocap0").open().unwrap_err();
        assert!(err.to_string().contains("CAP_NET_ADMIN") || matches!(err, Error::NoTunDevice), "{err}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--bounding-set=-net_admin", "--inh-caps=-net_admin", "--"])
        .arg(exe)
        .args(["--exact", "error_missing_cap_net_admin", "--nocapture", "--test-threads=1"])
        .env("TURBOTUN_TEST_NO_NET_ADMIN", "1")
        .output()
        .expect("setpriv (util-linux) runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran the test:\n{text}");
}

#[test]
fn capabilities_probe() {
    in_netns("capabilities_probe", || {
        let caps = turbotun::Capabilities::probe().unwrap();
        assert!(caps.vnet_hdr() && caps.multi_queue());
        assert_eq!(caps.vnet_hdr_sizes(), [10, 12, 20, 24]);
        let offloads = caps.offloads().expect("root can probe offloads");
        assert!(offloads.contains(Offloads::TCP | Offloads::TSO_ECN), "{offloads}");
        // This kernel (6.18) has USO (6.2+) and NAPI; the probe must find them rather than assume them.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let (major, minor) = parse_release(&release);
        if (major, minor) >= (6, 2) {
            assert!(caps.uso(), "USO expected on {release}");
        }
        // UDP-tunnel GSO arrived in 6.17, with its outer-checksum variant.
        let tunnel = (major, minor) >= (6, 17);
        assert_eq!(caps.udp_tunnel_gso(), tunnel, "udp_tunnel_gso on {release}");
        assert_eq!(caps.udp_tunnel_gso_csum(), tunnel, "udp_tunnel_gso_csum on {release}");
        assert!(caps.napi());
        assert!(caps.steering_ebpf(), "{:?}", caps.steering_ebpf_missing());
        // The coalesced-write probe ran with the others, in a private namespace.
        assert_eq!((caps.gro_writes().tcp, caps.gro_writes().udp), (Some(true), Some(true)));
        assert!(offloads.contains(Offloads::UFO), "the UFO bit is taken (and ignored) by the kernel");
    });
}

fn parse_release(s: &str) -> (u32, u32) {
    let mut it = s.trim().split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok());
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// NAPI, NAPI_FRAGS and NO_CARRIER reach the kernel; carrier and sndbuf and the link type can be changed.
#[test]
fn napi_carrier_sndbuf_link_type() {
    in_netns("napi_carrier_sndbuf_link_type", || {
        use turbotun::iff;
        let name = unique_name("tz");
        let dev = DeviceBuilder::tap().name(&name).napi(true).napi_frags(true).no_carrier(true).open().unwrap();
        let flags = dev.kernel_flags();
        assert_ne!(flags & iff::NAPI, 0, "{flags:#x}");
        assert_ne!(flags & iff::NAPI_FRAGS, 0, "{flags:#x}");
        let mut nl = Netlink::new().unwrap();
        nl.set_up(&name, true).unwrap();
        let oper = |nl: &mut Netlink| nl.link(&name).unwrap().oper_state;
        assert_eq!(oper(&mut nl), "DOWN", "IFF_NO_CARRIER: up but without carrier");
        dev.set_carrier(true).unwrap();
        assert_ne!(oper(&mut nl), "DOWN", "TUNSETCARRIER(1) brings the carrier up");

        let tun = unique_name("ty");
        let dev = DeviceBuilder::tun().name(&tun).sndbuf(1 << 20).open().unwrap();
        assert_eq!(dev.queues()[0].sndbuf().unwrap(), 1 << 20);
        // TUNSETLINK: the link type of a down device; ARPHRD_PPP (512) instead of the default ARPHRD_NONE.
        assert_eq!(nl.link(&tun).unwrap().link_type, 0xfffe);
        dev.set_link_type(512).unwrap();
        assert_eq!(nl.link(&tun).unwrap().link_type, 512);
        nl.set_up(&tun, true).unwrap();
        assert!(dev.set_link_type(0xfffe).is_err(), "the kernel refuses TUNSETLINK while the device is up");
    });
}

/// TUNSETSTEERINGEBPF: a program pinning every packet to queue 2 is obeyed; the flow-hash program keeps each
/// flow on one queue and spreads flows over several.
#[test]
fn steering_ebpf_programs() {
    in_netns("steering_ebpf_programs", || {
        use std::os::fd::AsFd;
        use turbotun::steering::SteeringProgram;
        let name = unique_name("te");
        let dev = DeviceBuilder::tun().name(&name).queues(4).nonblocking(true).open().unwrap();
        configure_v4(&name, LOCAL, 24);
        let pin = SteeringProgram::fixed_queue(2).unwrap();
        pin.attach(dev.queues()[0].as_fd()).unwrap();
        // Each flow is a socket of its own, so each has its own hash.
        let socks: Vec<UdpSocket> = (0..16).map(|_| UdpSocket::bind((LOCAL, 0)).unwrap()).collect();
        let drain = |expect: usize| -> Vec<Vec<u16>> {
            let mut per_queue = vec![Vec::new(); 4];
            let mut buf = vec![0u8; 2048];
            let deadline = std::time::Instant::now() + T;
            while per_queue.iter().map(Vec::len).sum::<usize>() < expect && std::time::Instant::now() < deadline {
                for (i, q) in dev.queues().iter().enumerate() {
                    if let Ok(n) = q.recv_raw(&mut buf) {
                        if let Some((_, dst, sport, dport, _)) = parse_ipv4_udp(&buf[..n]) {
                            if dst == PEER && dport == 8000 {
                                per_queue[i].push(sport);
                            }
                        }
                    }
                }
            }
            per_queue
        };
        for s in &socks {
            s.send_to(b"s", (PEER, 8000)).unwrap();
        }
        let pinned = drain(socks.len());
        assert_eq!(pinned[2].len(), socks.len(), "every packet on queue 2: {pinned:?}");

        SteeringProgram::flow_hash().unwrap().attach(dev.queues()[0].as_fd()).unwrap();
        for _round in 0..2 {
            for s in &socks {
                s.send_to(b"h", (PEER, 8000)).unwrap();
            }
        }
        let hashed = drain(2 * socks.len());
        assert_eq!(hashed.iter().map(Vec::len).sum::<usize>(), 2 * socks.len(), "{hashed:?}");
        for (i, ports) in hashed.iter().enumerate() {
            for p in ports {
                assert!(
                    hashed.iter().enumerate().all(|(j, o)| j == i || !o.contains(p)),
                    "flow {p} on two queues: {hashed:?}"
                );
            }
        }
        assert!(hashed.iter().filter(|q| !q.is_empty()).count() >= 2, "flows spread: {hashed:?}");
        SteeringProgram::detach(dev.queues()[0].as_fd()).unwrap();
    });
}
