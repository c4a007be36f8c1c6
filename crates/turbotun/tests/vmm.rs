//! The device API a VM monitor uses, on real devices in private namespaces: offloads renegotiated while traffic
//! runs, strict offloads, vectored I/O into and out of descriptor chains, device settings without netlink, queues
//! added and removed, fds cloned and given away without leaking. (An fd adopted by a process with no privilege
//! and no netlink is `example_jailed_monitor_adopts_an_fd_without_netlink` in `examples.rs`.)

mod common;

use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::OwnedFd;
use std::time::Duration;

use common::*;
use turbotun::forward::{ForwardMode, ForwarderBuilder, IoKind};
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;
use turbotun::wire::VirtioNetHdrRepr;
use turbotun::{DeviceBuilder, Error, Mode, Offloads, Queue};

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 9, 6, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 9, 6, 2);

/// The guest acknowledges other features while TCP runs: offloads go from everything to checksums only, to
/// nothing and back, on both devices of a forwarder, again and again until every step came twice during the
/// streams. The reads follow (super-packets while TSO is
/// granted, plain packets otherwise) and the stream arrives intact.
#[test]
fn offloads_renegotiated_while_traffic_runs() {
    if in_netns("offloads_renegotiated_while_traffic_runs", || ()).is_none() {
        return;
    }
    for io in [IoKind::Block, IoKind::Uring] {
        let ns_fwd = new_netns();
        let (dev_a, dev_b) = (unique_name("ttra"), unique_name("ttrb"));
        let builder = ForwarderBuilder::new(ForwardMode::Offload).io(io);
        let (a, b) = with_netns(&ns_path(&ns_fwd), || {
            (
                builder.device(Mode::Tun).name(&dev_a).open().unwrap(),
                builder.device(Mode::Tun).name(&dev_b).open().unwrap(),
            )
        })
        .unwrap();
        // Clones of the queues stay here to renegotiate through (one offload mask per device).
        let monitor: Vec<Queue> = [&a, &b].iter().map(|d| d.queues()[0].try_clone().unwrap()).collect();
        let forwarder = builder.build(a, b).unwrap();
        let (stop, stats) = (forwarder.stop_handle(), forwarder.stats());
        let running = std::thread::spawn(move || forwarder.run());
        let sides = Sides::connect(&ns_fwd, &dev_a, &dev_b);
        let renegotiating = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let guest = {
            let (renegotiating, made) = (renegotiating.clone(), made.clone());
            std::thread::spawn(move || {
                let steps = [Offloads::ALL, Offloads::CSUM, Offloads::NONE, Offloads::TCP];
                let mut changes = 0;
                while renegotiating.load(std::sync::atomic::Ordering::Relaxed) {
                    let offloads = steps[changes % steps.len()];
                    for q in &monitor {
                        q.set_offloads(offloads).unwrap();
                        assert_eq!(q.offloads(), offloads);
                    }
                    changes += 1;
                    made.store(changes, std::sync::atomic::Ordering::Relaxed);
                    // Pacing only: how many changes the traffic meets is counted, not timed.
                    std::thread::sleep(Duration::from_millis(20));
                }
                changes
            })
        };
        // Streams go on until the guest has gone through every step twice while they ran.
        let mut streams = 0;
        while streams == 0 || made.load(std::sync::atomic::Ordering::Relaxed) < 8 {
            if guest.is_finished() {
                guest.join().unwrap();
                unreachable!("the guest stops only when told");
            }
            sides.tcp_intact(B4, 4 << 20);
            streams += 1;
        }
        sides.udp_intact(A4, B4);
        renegotiating.store(false, std::sync::atomic::Ordering::Relaxed);
        let changes = guest.join().unwrap();
        stop.stop();
        running.join().unwrap().unwrap();
        let s = stats.snapshot().a_to_b;
        assert!(changes >= 8, "{io:?}: {changes} renegotiations during {streams} streams");
        assert!(s.super_packets > 0, "{io:?}: super-packets while TSO was granted: {s:?}");
        assert_eq!(s.drops.faults(), 0, "{io:?}: {s:?}");
        assert_eq!(sides.checksum_errors(), 0, "{io:?}");
    }
}

/// A monitor that told its guest what it offers gets an error, not a downgrade, when the kernel refuses: ECN
/// without TSO is a combination `TUNSETOFFLOAD` refuses. Without strict mode the open degrades, saying so.
#[test]
fn strict_offloads_refuse_instead_of_degrading() {
    in_netns("strict_offloads_refuse_instead_of_degrading", || {
        let asked = Offloads::CSUM | Offloads::TSO_ECN;
        let name = unique_name("ttst");
        let err =
            DeviceBuilder::tap().name(&name).vnet_hdr(12).offloads(asked).strict_offloads(true).open().unwrap_err();
        assert!(matches!(err, Error::OffloadsRefused { .. }), "{err}");
        assert!(err.to_string().contains("csum,tso_ecn refused"), "{err}");
        let dev = DeviceBuilder::tap().name(&name).vnet_hdr(12).offloads(asked).open().unwrap();
        assert_eq!(dev.offloads(), Offloads::CSUM);
        assert!(dev.notes().iter().any(|n| n.contains("refused offloads tso_ecn")), "{:?}", dev.notes());
        // At run time the same request is refused the same way, and changes nothing.
        let err = dev.set_offloads(asked).unwrap_err();
        assert!(matches!(err, Error::OffloadsRefused { .. }), "{err}");
        assert_eq!(dev.offloads(), Offloads::CSUM);
        let strict = DeviceBuilder::tap().name(unique_name("ttst")).vnet_hdr(12).offloads(Offloads::ALL);
        assert_eq!(strict.strict_offloads(true).open().unwrap().offloads(), Offloads::ALL, "granted exactly");
    });
}

/// Reads and writes through descriptor chains, as a monitor moves frames between a TAP fd and guest memory: the
/// virtio header in front of the first descriptor (or apart), the frame across the rest.
#[test]
fn vectored_io_through_descriptor_chains() {
    in_netns("vectored_io_through_descriptor_chains", || {
        let name = unique_name("ttvc");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(12).offloads(Offloads::CSUM).open().unwrap();
        configure_v4(&name, LOCAL, 24);
        let q = &dev.queues()[0];
        let sock = UdpSocket::bind((LOCAL, 0)).unwrap();
        let payload: Vec<u8> = (0..1300u32).map(|i| (i * 7) as u8).collect();
        // Guest memory, with the chain's descriptors at scattered places of it.
        let mut memory = vec![0xeeu8; 16384];
        sock.send_to(&payload, (PEER, 4500)).unwrap();
        let n = loop {
            let (head, rest) = memory.split_at_mut(12);
            let (_, rest) = rest.split_at_mut(500); // a gap between descriptors
            let (a, rest) = rest.split_at_mut(64);
            let (_, rest) = rest.split_at_mut(1000);
            let (b, rest) = rest.split_at_mut(1200);
            let (_, c) = rest.split_at_mut(3000);
            let mut chain =
                [IoSliceMut::new(head), IoSliceMut::new(a), IoSliceMut::new(b), IoSliceMut::new(&mut c[..2048])];
            q.wait_readable(Some(Duration::from_secs(3))).unwrap();
            let n = q.recv_vectored(&mut chain).unwrap();
            let frame: Vec<u8> = chain.iter().flat_map(|s| s.iter().copied()).take(n).collect();
            if parse_ipv4_udp(&frame[12..]).is_some_and(|u| u.3 == 4500) {
                break (n, frame);
            }
        };
        let (n, frame) = n;
        let hdr = VirtioNetHdrRepr::parse(&frame[..12]).unwrap();
        assert!(!hdr.is_gso());
        assert_eq!(n, 12 + 28 + payload.len(), "header and packet, across four descriptors");
        assert_eq!(parse_ipv4_udp(&frame[12..]).unwrap().4, &payload[..]);
        assert!(memory[12..512].iter().all(|&b| b == 0xee), "nothing written outside the descriptors");

        // The same with the header apart: the chain holds the packet alone.
        sock.send_to(b"header apart", (PEER, 4501)).unwrap();
        let mut packet = vec![0u8; 2048];
        let (hdr, len) = loop {
            let (a, b) = packet.split_at_mut(20);
            q.wait_readable(Some(Duration::from_secs(3))).unwrap();
            let (hdr, len) = q.recv_vectored_with_hdr(&mut [IoSliceMut::new(a), IoSliceMut::new(b)]).unwrap();
            if parse_ipv4_udp(&packet[..len]).is_some_and(|u| u.3 == 4501) {
                break (hdr, len);
            }
        };
        assert!(!hdr.is_gso());
        assert_eq!(parse_ipv4_udp(&packet[..len]).unwrap().4, b"header apart");

        // Transmit chains: the header leading the first descriptor, or given apart.
        let rx = UdpSocket::bind((LOCAL, 4502)).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let pkt = ipv4_udp(PEER, LOCAL, 9, 4502, &payload[..700]);
        let mut head = vec![0u8; 12 + 30];
        VirtioNetHdrRepr::default().emit(&mut head[..12]);
        head[12..].copy_from_slice(&pkt[..30]);
        let (mid, tail) = pkt[30..].split_at(400);
        assert_eq!(
            q.send_vectored(&[IoSlice::new(&head), IoSlice::new(mid), IoSlice::new(tail)]).unwrap(),
            12 + pkt.len()
        );
        let mut buf = [0u8; 2048];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &payload[..700]);
        let sent = q.send_vectored_with_hdr(
            &VirtioNetHdrRepr::default(),
            &[IoSlice::new(&pkt[..100]), IoSlice::new(&pkt[100..])],
        );
        assert_eq!(sent.unwrap(), pkt.len());
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &payload[..700]);
        // The queue's counters count packets and bytes without the virtio header, whichever call moved them.
        let stats = q.stats();
        assert!(stats.tx_packets == 2 && stats.tx_bytes == 2 * pkt.len() as u64, "{stats:?}");
    });
}

/// MTU, up/down and the MAC address through the classic interface ioctls (no netlink: what a jailed monitor
/// may use), read back through rtnetlink.
#[test]
fn device_settings_without_netlink() {
    in_netns("device_settings_without_netlink", || {
        let name = unique_name("ttdn");
        let dev = DeviceBuilder::tap().name(&name).vnet_hdr(12).open().unwrap();
        let q = &dev.queues()[0];
        assert_eq!(q.mtu().unwrap(), 1500);
        q.set_mtu(9000).unwrap();
        assert!(!q.is_up().unwrap());
        q.set_up(true).unwrap();
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        q.set_mac(mac).unwrap();
        let link = Netlink::new().unwrap().link(&name).unwrap();
        assert_eq!(link.mtu, 9000);
        assert!(link.is_up(), "{link:?}");
        assert_eq!(link.mac, Some(mac));
        assert_eq!((q.mtu().unwrap(), q.is_up().unwrap(), q.mac().unwrap()), (9000, true, mac));
        q.set_up(false).unwrap();
        assert!(!Netlink::new().unwrap().link(&name).unwrap().is_up());
        let err = q.set_mtu(10).unwrap_err();
        assert!(err.to_string().contains("SIOCSIFMTU"), "{err}");
        let tun = DeviceBuilder::tun().name(unique_name("ttdn")).open().unwrap();
        let err = tun.queues()[0].set_mac(mac).unwrap_err();
        assert!(matches!(err, turbotun::Error::NotTap { what: "MAC addresses", .. }), "{err}");
        // Legacy virtio byte order: LE is known to every kernel; BE only with CONFIG_TUN_VNET_CROSS_LE.
        q.set_vnet_le(true).unwrap();
        assert!(q.vnet_le().unwrap());
        q.set_vnet_le(false).unwrap();
        match q.set_vnet_be(true) {
            Ok(()) => assert!(q.vnet_be().unwrap()),
            Err(e) => assert!(matches!(e, Error::Unsupported { .. }), "{e}"),
        }
    });
}

/// A guest raises its queue-pair count and lowers it again: queues attached to a running multiqueue device and
/// taken out; fds cloned, handed out as raw numbers and taken back, none leaked.
#[test]
fn queues_added_removed_cloned_and_given_away() {
    in_netns("queues_added_removed_cloned_and_given_away", || {
        let name = unique_name("ttqa");
        let mut dev = DeviceBuilder::tap().name(&name).vnet_hdr(12).multi_queue(true).open().unwrap();
        let queues = |name: &str| Netlink::new().unwrap().link(name).unwrap().tun.unwrap().num_queues;
        assert_eq!(queues(&name), 1);
        dev.add_queue().unwrap();
        let third = dev.add_queue().unwrap();
        assert_eq!((third.index(), third.vnet_hdr_len()), (2, 12));
        assert_eq!((dev.queues().len(), queues(&name), common::fds_of(&name)), (3, 3, 3));
        // One offload mask per device: set through the newest queue, seen through the first.
        dev.queues()[2].set_offloads(Offloads::TCP).unwrap();
        assert_eq!(dev.queues()[0].offloads(), Offloads::TCP);
        let removed = dev.remove_queue(1).unwrap();
        assert!(dev.remove_queue(0).is_none(), "the first queue stays");
        drop(removed);
        assert_eq!((dev.queues().len(), queues(&name), common::fds_of(&name)), (2, 2, 2));

        let clone = dev.queues()[0].try_clone().unwrap();
        assert_eq!((clone.name(), clone.offloads()), (name.as_str(), Offloads::TCP));
        assert_eq!(common::fds_of(&name), 3);
        // Given away as an OwnedFd (for another process or a later adoption) and adopted back: one fd throughout.
        let owned: OwnedFd = clone.into();
        assert_eq!(common::fds_of(&name), 3, "given away, still open");
        let back = Queue::from_fd(owned, Offloads::TCP).unwrap();
        assert_eq!(back.name(), name);
        assert_eq!(common::fds_of(&name), 3);
        drop(back);
        assert_eq!(common::fds_of(&name), 2, "every clone closed");

        let single = DeviceBuilder::tap().name(unique_name("ttqa")).open();
        let err = single.unwrap().add_queue().unwrap_err();
        assert!(err.to_string().contains("without IFF_MULTI_QUEUE"), "{err}");
    });
}
