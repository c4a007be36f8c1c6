//! The forwarding engine in-process, every mode with every I/O kind on TUN and TAP: TCP and UDP over IPv4 and
//! IPv6 cross it intact, and its counters account for every packet (written, or dropped with a reason).

mod common;

use common::{new_netns, ns_path, Sides, A4, A6, B4, B6};
use turbotun::forward::{ForwardMode, ForwarderBuilder, IoKind};
use turbotun::netns::with_netns;
use turbotun::Mode;

fn forward_intact(mode: ForwardMode, io: IoKind, dev_mode: Mode) {
    forward_intact_with(ForwarderBuilder::new(mode), io, dev_mode, None, false);
}

/// The data checks through one forwarder configured by `builder` with `io`; with `delete`, device B is deleted
/// afterwards while the forwarder runs, and the run must end with an error naming it.
fn forward_intact_with(builder: ForwarderBuilder, io: IoKind, dev_mode: Mode, mtu: Option<u32>, delete: bool) {
    let ns_fwd = new_netns();
    let (dev_a, dev_b) = (common::unique_name("ttea"), common::unique_name("tteb"));
    let (mode, builder) = (builder.mode(), builder.io(io));
    let (a, b) = with_netns(&ns_path(&ns_fwd), || {
        (builder.device(dev_mode).name(&dev_a).open().unwrap(), builder.device(dev_mode).name(&dev_b).open().unwrap())
    })
    .unwrap();
    let forwarder = builder.build(a, b).unwrap();
    assert_eq!(forwarder.io(), io);
    let (stop, stats) = (forwarder.stop_handle(), forwarder.stats());
    let running = std::thread::spawn(move || forwarder.run());
    let sides = Sides::connect_with_mtu(&ns_fwd, &dev_a, &dev_b, mtu);
    sides.tcp_intact(B4, 2 << 20);
    sides.tcp_intact(B6, 1 << 20);
    sides.udp_intact(A4, B4);
    sides.udp_intact(A6, B6);
    assert_eq!(sides.checksum_errors(), 0, "{mode:?}/{io:?}/{dev_mode}/mtu {mtu:?}: no packet with a bad checksum");
    let final_stats = if delete {
        turbotun::netlink::Netlink::in_netns(&ns_path(&sides.b)).unwrap().delete_link(&dev_b).unwrap();
        // Ends on the deletion (the suite's bound for a thread that must end on an event; not a speed check).
        let what = format!("a {mode:?}/{io:?}/{dev_mode} forwarder whose device is deleted");
        let ended = common::join_within(running, std::time::Duration::from_secs(30), &what);
        let err = ended.expect_err("the forwarder fails when its device is deleted");
        assert!(err.to_string().contains(&dev_b), "{mode:?}/{io:?}/{dev_mode}: the error names it: {err}");
        stop.stop();
        stats.snapshot()
    } else {
        stop.stop();
        let final_stats = running.join().unwrap().unwrap_or_else(|e| panic!("{mode:?}/{io:?}/{dev_mode}: {e}"));
        assert_eq!(final_stats, stats.snapshot(), "run() returns what the handle reads");
        final_stats
    };
    let what = format!("{mode:?}/{io:?}/{dev_mode}/mtu {mtu:?}: {final_stats:?}");
    let a_to_b = final_stats.a_to_b;
    assert!(a_to_b.bytes >= 3 << 20, "{what}");
    assert_eq!(final_stats.total().drops.faults(), 0, "{what}");
    for d in [final_stats.a_to_b, final_stats.b_to_a] {
        assert_eq!(d.packets + d.drops.total(), d.segments, "every packet read was written or counted: {what}");
    }
    match mode {
        ForwardMode::Offload => assert!(a_to_b.super_packets > 0 && a_to_b.coalesced > 0, "{what}"),
        ForwardMode::Passthrough => assert!(a_to_b.super_packets > 0 && a_to_b.coalesced == 0, "{what}"),
        ForwardMode::Plain => assert!(a_to_b.super_packets == 0 && a_to_b.packets > 1000, "{what}"),
    }
}

/// Offload through io_uring at the smallest IPv6 MTU and a jumbo one, on TUN and TAP, checked as the matrix
/// checks every path; then one device is deleted under the running forwarder, which fails naming it, with
/// every packet it read accounted for.
#[test]
fn engine_uring_offload_mtus_and_device_deleted() {
    if common::in_netns("engine_uring_offload_mtus_and_device_deleted", || ()).is_none() {
        return;
    }
    for dev_mode in [Mode::Tun, Mode::Tap] {
        for mtu in [1280, 9000] {
            forward_intact_with(ForwarderBuilder::new(ForwardMode::Offload), IoKind::Uring, dev_mode, Some(mtu), false);
        }
        forward_intact_with(ForwarderBuilder::new(ForwardMode::Offload), IoKind::Uring, dev_mode, None, true);
    }
}

/// Offload through io_uring with the slot arena registered (READV_FIXED/WRITEV_FIXED): on TUN and TAP, at the
/// default MTU, 1280 and 9000, the data checks pass; then a device deleted under it ends the run naming it
/// (the ring lets go of the registered arena on the way out).
#[test]
fn engine_uring_offload_with_registered_buffers() {
    if common::in_netns("engine_uring_offload_with_registered_buffers", || ()).is_none() {
        return;
    }
    turbotun::uring::registered_vectors_supported().expect("this kernel (6.15+) has READV_FIXED and WRITEV_FIXED");
    let registered = || ForwarderBuilder::new(ForwardMode::Offload).register_buffers(true);
    for dev_mode in [Mode::Tun, Mode::Tap] {
        for mtu in [None, Some(1280), Some(9000)] {
            forward_intact_with(registered(), IoKind::Uring, dev_mode, mtu, false);
        }
        forward_intact_with(registered(), IoKind::Uring, dev_mode, None, true);
    }
}

/// Offload with the split segments' checksums left partial, for the kernel to complete: on TUN and TAP, with
/// blocking, poll, io_uring and tokio I/O, at the default MTU and at 1280 and 9000, TCP and UDP over IPv4 and IPv6 cross
/// intact (a segment written with a wrong or missing checksum would be dropped by the receiving stack and the
/// transfer would not complete).
#[test]
fn engine_offload_with_partial_checksums() {
    if common::in_netns("engine_offload_with_partial_checksums", || ()).is_none() {
        return;
    }
    let partial = || ForwarderBuilder::new(ForwardMode::Offload).partial_checksums(true);
    for dev_mode in [Mode::Tun, Mode::Tap] {
        for io in [IoKind::Block, IoKind::Poll, IoKind::Uring, IoKind::Tokio] {
            forward_intact_with(partial(), io, dev_mode, None, false);
        }
        for mtu in [1280, 9000] {
            forward_intact_with(partial(), IoKind::Block, dev_mode, Some(mtu), false);
            forward_intact_with(partial(), IoKind::Uring, dev_mode, Some(mtu), false);
        }
    }
}

fn matrix(test: &str, dev_mode: Mode) {
    if common::in_netns(test, || ()).is_none() {
        return;
    }
    for mode in [ForwardMode::Plain, ForwardMode::Offload, ForwardMode::Passthrough] {
        for io in [IoKind::Block, IoKind::Poll, IoKind::Uring, IoKind::Tokio] {
            forward_intact(mode, io, dev_mode);
        }
    }
}

#[test]
fn engine_every_mode_and_io_on_tun() {
    matrix("engine_every_mode_and_io_on_tun", Mode::Tun);
}

#[test]
fn engine_every_mode_and_io_on_tap() {
    matrix("engine_every_mode_and_io_on_tap", Mode::Tap);
}

#[test]
fn engine_refuses_what_does_not_fit() {
    let uring_threads = ForwarderBuilder::new(ForwardMode::Offload).io(IoKind::Uring).threads(2).validate(1);
    assert!(uring_threads.unwrap_err().to_string().contains("use several queues rather than several threads"));
    let threads_and_queues = ForwarderBuilder::new(ForwardMode::Plain).threads(2).validate(2);
    assert!(threads_and_queues.unwrap_err().to_string().contains("don't fit together"));
    let batch = ForwarderBuilder::new(ForwardMode::Offload).batch(0).validate(1);
    assert!(batch.unwrap_err().to_string().contains("batch 0 is out of range: 1 to 64"));
    let partial_plain = ForwarderBuilder::new(ForwardMode::Plain).partial_checksums(true).validate(1);
    assert!(partial_plain.unwrap_err().to_string().contains("partial checksums go with offload mode"));
    let registered_block =
        ForwarderBuilder::new(ForwardMode::Offload).register_buffers(true).io(IoKind::Block).validate(1);
    assert!(registered_block
        .unwrap_err()
        .to_string()
        .contains("registered buffers go with offload mode through io_uring"));
    common::in_netns("engine_refuses_what_does_not_fit", || {
        // A plain forwarder over devices with a virtio header would forward the header as data.
        let offload = ForwarderBuilder::new(ForwardMode::Offload);
        let a = offload.device(Mode::Tun).name(common::unique_name("ttra")).open().unwrap();
        let b = offload.device(Mode::Tun).name(common::unique_name("ttrb")).open().unwrap();
        let err = ForwarderBuilder::new(ForwardMode::Plain).build(a, b).unwrap_err().to_string();
        assert!(err.contains("virtio header: plain mode forwards queues without one"), "{err}");
    });
}

/// The library's io_uring offload halves driven directly with the multishot read over provided slots (the
/// engine uses the scattered read): the application's hook sees every packet, MTU-sized and starting with its
/// IP header, and the data crosses intact.
#[test]
fn uring_offload_multishot_with_a_per_packet_hook() {
    use std::sync::Arc;
    use std::time::Duration;
    if common::in_netns("uring_offload_multishot_with_a_per_packet_hook", || ()).is_none() {
        return;
    }
    let ns_fwd = new_netns();
    let (dev_a, dev_b) = (common::unique_name("ttma"), common::unique_name("ttmb"));
    let builder = ForwarderBuilder::new(ForwardMode::Offload);
    let (a, b) = with_netns(&ns_path(&ns_fwd), || {
        (builder.device(Mode::Tun).name(&dev_a).open().unwrap(), builder.device(Mode::Tun).name(&dev_b).open().unwrap())
    })
    .unwrap();
    let (qa, qb) = (Arc::new(a.into_queues().remove(0)), Arc::new(b.into_queues().remove(0)));
    let stop = turbotun::StopHandle::new();
    let workers: Vec<_> = [(qa.clone(), qb.clone()), (qb, qa)]
        .into_iter()
        .map(|(src, dst)| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut fwd = turbotun::uring::UringOffload::new(&src, &dst, 16, 64).unwrap();
                let (mut seen, mut not_ip) = (0u64, 0u64);
                while !stop.is_stopped() {
                    fwd.poll_with(Duration::from_millis(50), |packet| {
                        seen += 1;
                        not_ip += u64::from(!matches!(packet.first().map(|b| b >> 4), Some(4 | 6)));
                    })
                    .unwrap();
                }
                fwd.drain(Duration::from_millis(100)).unwrap();
                (fwd.stats(), seen, not_ip)
            })
        })
        .collect();
    let sides = Sides::connect(&ns_fwd, &dev_a, &dev_b);
    sides.tcp_intact(B4, 2 << 20);
    sides.udp_intact(A4, B4);
    sides.udp_intact(A6, B6);
    stop.stop();
    let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let (a_to_b, seen, not_ip) = results[0];
    assert_eq!(not_ip, 0, "every packet starts with its IP header");
    assert_eq!(seen, a_to_b.segments, "the hook saw every packet: {a_to_b:?}");
    assert!(a_to_b.super_packets > 0 && a_to_b.coalesced > 0 && a_to_b.bytes >= 2 << 20, "{a_to_b:?}");
    for (d, _, _) in &results {
        assert_eq!(d.packets + d.drops.total(), d.segments, "every packet read was written or counted: {d:?}");
        assert_eq!(d.drops.faults(), 0, "{d:?}");
    }
}

/// Offload mode rewrites every virtio header, so its two devices may each have any size turbotun handles (here 12
/// and 24 bytes): TCP and UDP cross intact with blocking and tokio I/O; io_uring, whose slots are laid out for
/// 10-byte headers, falls back to blocking reads with a note.
#[test]
fn engine_offload_between_virtio_header_sizes() {
    if common::in_netns("engine_offload_between_virtio_header_sizes", || ()).is_none() {
        return;
    }
    for io in [IoKind::Block, IoKind::Tokio, IoKind::Uring] {
        let ns_fwd = new_netns();
        let (dev_a, dev_b) = (common::unique_name("ttha"), common::unique_name("tthb"));
        let builder = ForwarderBuilder::new(ForwardMode::Offload).io(io);
        let (a, b) = with_netns(&ns_path(&ns_fwd), || {
            let open = |name: &str, size| builder.device(Mode::Tun).name(name).vnet_hdr(size).open().unwrap();
            (open(&dev_a, 12), open(&dev_b, 24))
        })
        .unwrap();
        let forwarder = builder.build(a, b).unwrap();
        if io == IoKind::Uring {
            assert_eq!(forwarder.io(), IoKind::Block);
            assert!(forwarder.notes().iter().any(|n| n.contains("12-byte virtio header")), "{:?}", forwarder.notes());
        }
        let (stop, stats) = (forwarder.stop_handle(), forwarder.stats());
        let running = std::thread::spawn(move || forwarder.run());
        let sides = Sides::connect(&ns_fwd, &dev_a, &dev_b);
        sides.tcp_intact(B4, 2 << 20);
        sides.udp_intact(A6, B6);
        assert_eq!(sides.checksum_errors(), 0, "{io:?}");
        stop.stop();
        running.join().unwrap().unwrap();
        let s = stats.snapshot();
        assert!(s.a_to_b.super_packets > 0 && s.a_to_b.coalesced > 0, "{io:?}: {s:?}");
        assert_eq!(s.total().drops.faults(), 0, "{io:?}: {s:?}");
    }
}

/// A device deleted while a flood runs into it: the run fails naming it, and in each direction every packet read
/// was written or counted with a reason, the batch in hand when the writes started failing included. Found by
/// review: a fatal write lost the count of the rest of its batch.
#[test]
fn engine_device_deleted_under_traffic() {
    if common::in_netns("engine_device_deleted_under_traffic", || ()).is_none() {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cases = [
        (ForwardMode::Offload, IoKind::Block),
        (ForwardMode::Offload, IoKind::Poll),
        (ForwardMode::Offload, IoKind::Uring),
        (ForwardMode::Offload, IoKind::Tokio),
        (ForwardMode::Plain, IoKind::Block),
        (ForwardMode::Plain, IoKind::Uring),
        (ForwardMode::Passthrough, IoKind::Block),
        (ForwardMode::Passthrough, IoKind::Uring),
    ];
    for (mode, io) in cases {
        let ns_fwd = new_netns();
        let (dev_a, dev_b) = (common::unique_name("ttda"), common::unique_name("ttdb"));
        let builder = ForwarderBuilder::new(mode).io(io);
        let (a, b) = with_netns(&ns_path(&ns_fwd), || {
            (
                builder.device(Mode::Tun).name(&dev_a).open().unwrap(),
                builder.device(Mode::Tun).name(&dev_b).open().unwrap(),
            )
        })
        .unwrap();
        let forwarder = builder.build(a, b).unwrap();
        let stats = forwarder.stats();
        let running = std::thread::spawn(move || forwarder.run());
        let sides = Sides::connect(&ns_fwd, &dev_a, &dev_b);
        let flooding = Arc::new(AtomicBool::new(true));
        let sock = sides.in_a(|| std::net::UdpSocket::bind((A4, 0)).unwrap());
        sock.connect((B4, 6001)).unwrap();
        if mode == ForwardMode::Offload {
            turbotun::udp::set_udp_segment(&sock, 1000).unwrap();
        }
        let flood = {
            let flooding = flooding.clone();
            std::thread::spawn(move || {
                let data = vec![0x5au8; 16_000];
                while flooding.load(Ordering::Relaxed) {
                    let _ = sock.send(&data);
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(300));
        turbotun::netlink::Netlink::in_netns(&ns_path(&sides.b)).unwrap().delete_link(&dev_b).unwrap();
        let err = running.join().unwrap().expect_err("the run fails when its device is deleted");
        flooding.store(false, Ordering::Relaxed);
        flood.join().unwrap();
        assert!(err.to_string().contains(&dev_b), "{mode:?}/{io:?}: {err}");
        let s = stats.snapshot();
        assert!(s.a_to_b.packets > 0, "{mode:?}/{io:?}: traffic flowed before: {s:?}");
        for d in [s.a_to_b, s.b_to_a] {
            assert_eq!(d.packets + d.drops.total(), d.segments, "{mode:?}/{io:?}: every packet read accounted: {d:?}");
        }
    }
}

/// The per-packet hook of the engine runs on every I/O kind, in offload mode (on the split packets) and plain
/// mode: here it rewrites the payload of UDP datagrams to one port (and drops their now wrong checksum to
/// "none"), and the receiver gets the rewritten bytes; it sees both directions. Passthrough, which moves
/// super-packets whole, takes no hook.
#[test]
fn engine_per_packet_hook_on_every_io_kind() {
    if common::in_netns("engine_per_packet_hook_on_every_io_kind", || ()).is_none() {
        return;
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use turbotun::forward::Direction;
    for mode in [ForwardMode::Offload, ForwardMode::Plain] {
        for io in [IoKind::Block, IoKind::Poll, IoKind::Uring, IoKind::Tokio] {
            let seen = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
            let counts = seen.clone();
            let builder = ForwarderBuilder::new(mode).io(io).per_packet(move |dir, packet| {
                counts[usize::from(dir == Direction::BToA)].fetch_add(1, Ordering::Relaxed);
                // IPv4, UDP, to port 7700: the payload XORed, the checksum now "none".
                if packet.len() > 28 && packet[0] == 0x45 && packet[9] == 17 && packet[22..24] == 7700u16.to_be_bytes()
                {
                    packet[26..28].fill(0);
                    packet[28..].iter_mut().for_each(|b| *b ^= 0x5a);
                }
            });
            let ns_fwd = new_netns();
            let (dev_a, dev_b) = (common::unique_name("ttpa"), common::unique_name("ttpb"));
            let (a, b) = with_netns(&ns_path(&ns_fwd), || {
                (
                    builder.device(Mode::Tun).name(&dev_a).open().unwrap(),
                    builder.device(Mode::Tun).name(&dev_b).open().unwrap(),
                )
            })
            .unwrap();
            let forwarder = builder.build(a, b).unwrap();
            let stop = forwarder.stop_handle();
            let running = std::thread::spawn(move || forwarder.run());
            let sides = Sides::connect(&ns_fwd, &dev_a, &dev_b);
            let rx = sides.in_b(|| std::net::UdpSocket::bind((B4, 7700)).unwrap());
            rx.set_read_timeout(Some(std::time::Duration::from_secs(3))).unwrap();
            let tx = sides.in_a(|| std::net::UdpSocket::bind((A4, 0)).unwrap());
            let mut buf = [0u8; 2048];
            for size in [1usize, 500, 1400] {
                let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
                tx.send_to(&data, (B4, 7700)).unwrap();
                let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("{mode:?}/{io:?} {size}: {e}"));
                let want: Vec<u8> = data.iter().map(|b| b ^ 0x5a).collect();
                assert_eq!(&buf[..n], &want[..], "{mode:?}/{io:?}: the hook rewrote the payload");
            }
            // TCP both ways passes through the hook untouched.
            sides.tcp_intact(B4, 1 << 20);
            stop.stop();
            running.join().unwrap().unwrap();
            let (ab, ba) = (seen[0].load(Ordering::Relaxed), seen[1].load(Ordering::Relaxed));
            assert!(ab > 3 && ba > 0, "{mode:?}/{io:?}: the hook saw both directions ({ab}, {ba})");
        }
    }
    let err = ForwarderBuilder::new(ForwardMode::Passthrough).per_packet(|_, _| {}).validate(1).unwrap_err();
    assert!(err.to_string().contains("a per-packet hook goes with offload or plain mode"), "{err}");
}
