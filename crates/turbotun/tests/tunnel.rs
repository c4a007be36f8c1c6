//! UDP-tunnel GSO against the real kernel (Linux 6.17+): a VXLAN interface in namespace A sends through TAP
//! device A, which hands out VXLAN super-packets with the 24-byte virtio header; the test carries them to TAP
//! device B in namespace B, where a second VXLAN interface decapsulates them for a socket. Carried split
//! (`TunnelSplitter`, each segment written as a plain frame), split and coalesced again (`coalesce_tunnel`, written
//! as tunnel super-packets of our making) or whole (passthrough: the super-packet and its header written as
//! read), the data must arrive intact.

mod common;

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use turbotun::netlink::{Netlink, Vxlan};
use turbotun::wire::udp_tunnel::{coalesce_tunnel, TunnelKind, TunnelSplitter};
use turbotun::wire::virtio_net::{TunnelOffsets, VIRTIO_NET_HDR_V1_HASH_TUNNEL_LEN as HDR};
use turbotun::wire::{Framing, VirtioNetHdr, VirtioNetHdrRepr};
use turbotun::{DeviceBuilder, Offloads, Queue};

const MAC_A: &str = "02:00:00:00:0a:01";
const MAC_B: &str = "02:00:00:00:0b:01";
const VX_MAC_B: &str = "02:00:00:00:0b:42";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carry {
    Split,
    /// Split, then coalesced again with `coalesce_tunnel` and written as tunnel super-packets of our own making.
    Regroup,
    Passthrough,
}

#[derive(Default)]
struct Seen {
    tunnel_super_packets: AtomicUsize,
    segments_written: AtomicUsize,
    coalesced_written: AtomicUsize,
}

/// Reads frames from `from` and writes them to `to` until `stop`: tunnel super-packets split or whole, every
/// other frame as read (its virtio header kept).
fn carry(from: &Queue, to: &Queue, how: Carry, stop: &AtomicBool, seen: &Seen) {
    let mut buf = vec![0u8; HDR + 65536];
    let mut seg = vec![0u8; HDR + 65536];
    while !stop.load(Ordering::Relaxed) {
        if !from.wait_readable(Some(Duration::from_millis(20))).unwrap() {
            continue;
        }
        let n = from.recv_raw(&mut buf).unwrap();
        let hdr = VirtioNetHdrRepr::parse(&buf[..HDR]).unwrap();
        if !hdr.is_udp_tunnel() || how == Carry::Passthrough {
            if hdr.is_udp_tunnel() {
                seen.tunnel_super_packets.fetch_add(1, Ordering::Relaxed);
            }
            // A refused write (the peer side not up yet) only loses this frame, as a wire would.
            let _ = to.send_raw(&buf[..n]);
            continue;
        }
        seen.tunnel_super_packets.fetch_add(1, Ordering::Relaxed);
        let offsets = TunnelOffsets::parse(&buf[..HDR]).unwrap();
        let splitter = TunnelSplitter::new(&hdr, offsets, &buf[HDR..n], Framing::Ethernet)
            .unwrap_or_else(|e| panic!("the kernel's tunnel super-packet {hdr:?} {offsets:?}: {e}"));
        let mut segments = Vec::new();
        for i in 0..splitter.segment_count() {
            seg[..HDR].fill(0);
            let len = splitter.write_segment(i, &mut seg[HDR..]).unwrap();
            // The outer UDP checksum, checked here with the test's own sum; the inner ones are checked by the
            // kernel on the far side, which drops a segment with a wrong one (the frame goes in without
            // NEEDS_CSUM or DATA_VALID).
            assert!(outer_udp_checksum_ok(&seg[HDR..HDR + len], splitter.outer_udp_offset()), "segment {i}");
            if how == Carry::Regroup {
                segments.push(seg[HDR..HDR + len].to_vec());
                continue;
            }
            to.send_raw(&seg[..HDR + len]).unwrap();
            seen.segments_written.fetch_add(1, Ordering::Relaxed);
        }
        let frames: Vec<&[u8]> = segments.iter().map(|f| &f[..]).collect();
        let mut at = 0;
        while at < frames.len() {
            let m = coalesce_tunnel(&frames[at..], Framing::Ethernet, TunnelKind::Vxlan, &mut seg[HDR..]).unwrap();
            seg[..HDR].fill(0);
            if let Some((hdr, offsets)) = m.header {
                hdr.emit(&mut seg[..HDR]);
                VirtioNetHdr::new_unchecked(&mut seg[..HDR]).set_tunnel_offsets(offsets);
                seen.coalesced_written.fetch_add(1, Ordering::Relaxed);
            }
            to.send_raw(&seg[..HDR + m.len]).unwrap();
            at += m.frames;
        }
    }
}

/// The outer UDP checksum of an Ethernet frame: 0 is "none" on IPv4, anything else must verify.
fn outer_udp_checksum_ok(frame: &[u8], th: usize) -> bool {
    let v6 = frame[12..14] == [0x86, 0xdd];
    let udp = &frame[th..];
    if !v6 && udp[6..8] == [0, 0] {
        return true;
    }
    let mut pseudo = Vec::new();
    if v6 {
        pseudo.extend_from_slice(&frame[14 + 8..14 + 40]);
    } else {
        pseudo.extend_from_slice(&frame[14 + 12..14 + 20]);
    }
    pseudo.extend_from_slice(&[0, 0, 0, 17]);
    pseudo.extend_from_slice(&(udp.len() as u16).to_be_bytes());
    inet_checksum(&[&pseudo, udp]) == 0
}

struct Path {
    b: std::os::fd::OwnedFd,
    tap_a: turbotun::Device,
    tap_b: turbotun::Device,
}

/// TAP A (namespace A, the caller's) and TAP B (namespace B) with tunnel offloads; VXLAN vxa/vxb on top,
/// 192.168.80.1 and .2 (IPv4 outer) or over fd80::1 and ::2 (IPv6 outer).
fn build(outer_v6: bool) -> Path {
    let offloads = Offloads::TCP | Offloads::USO4 | Offloads::USO6 | Offloads::UDP_TUNNEL;
    let open = |name: &str| DeviceBuilder::tap().name(name).vnet_hdr(HDR).offloads(offloads).open().unwrap();
    let tap_a = open("ttvxa");
    let b = new_netns();
    let tap_b = turbotun::netns::with_netns(&ns_path(&b), || open("ttvxb")).unwrap();
    for dev in [&tap_a, &tap_b] {
        assert!(dev.offloads().contains(Offloads::UDP_TUNNEL), "granted {} (needs Linux 6.17+)", dev.offloads());
    }
    let (a, b_addr, len) = if outer_v6 { ("fd80::1", "fd80::2", 64) } else { ("10.80.0.1", "10.80.0.2", 24) };
    let side =
        |dev: &str, dev_mac: &str, me: &str, peer: &str, peer_mac: &str, vx: &str, vx_addr: &str, vx_mac: &str| {
            let ip = |text: &str| -> std::net::IpAddr { text.parse().unwrap() };
            let mac = |text: &str| turbotun::filter::parse_mac(text).unwrap();
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/accept_dad"), "0").unwrap();
            let mut nl = Netlink::new().unwrap();
            nl.set_mac(dev, mac(dev_mac)).unwrap();
            nl.add_address(dev, ip(me), len).unwrap();
            nl.set_up(dev, true).unwrap();
            nl.add_neighbour(dev, ip(peer), mac(peer_mac)).unwrap();
            let mut vxlan = Vxlan::new(vx, 42, ip(me), ip(peer));
            vxlan.dev = Some(dev.to_string());
            vxlan.zero_csum6_rx = outer_v6;
            nl.create_vxlan(&vxlan).unwrap();
            nl.set_mac(vx, mac(vx_mac)).unwrap();
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{vx}/disable_ipv6"), "1").unwrap();
            let (vx_ip, vx_len) = vx_addr.split_once('/').unwrap();
            nl.add_address(vx, ip(vx_ip), vx_len.parse().unwrap()).unwrap();
            nl.set_up(vx, true).unwrap();
        };
    const VX_MAC_A: &str = "02:00:00:00:0a:42";
    side("ttvxa", MAC_A, a, b_addr, MAC_B, "vxa", "192.168.80.1/24", VX_MAC_A);
    let vx_neighbour = |dev: &str, addr: &str, mac: &str| {
        let mac = turbotun::filter::parse_mac(mac).unwrap();
        Netlink::new().unwrap().add_neighbour(dev, addr.parse().unwrap(), mac).unwrap();
    };
    vx_neighbour("vxa", "192.168.80.2", VX_MAC_B);
    turbotun::netns::with_netns(&ns_path(&b), || {
        side("ttvxb", MAC_B, b_addr, a, MAC_A, "vxb", "192.168.80.2/24", VX_MAC_B);
        vx_neighbour("vxb", "192.168.80.1", VX_MAC_A);
    })
    .unwrap();
    Path { b, tap_a, tap_b }
}

/// Runs `f` while both directions are carried `how`; returns what the carriers saw.
fn with_carriers(path: &Path, how: Carry, f: impl FnOnce()) -> (usize, usize, usize) {
    let stop = AtomicBool::new(false);
    let seen = Seen::default();
    let (qa, qb) = (&path.tap_a.queues()[0], &path.tap_b.queues()[0]);
    /// Tells the carriers to stop when dropped: also when `f` panics, or the scope would wait for them forever
    /// and the failed test would hang instead of failing.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| carry(qa, qb, how, &stop, &seen));
        s.spawn(|| carry(qb, qa, how, &stop, &seen));
        let _stop = StopOnDrop(&stop);
        f();
    });
    (seen.tunnel_super_packets.into_inner(), seen.segments_written.into_inner(), seen.coalesced_written.into_inner())
}

/// UDP GSO: one 12000-byte send of 1200-byte datagrams from A leaves vxa as one super-packet and must arrive in
/// B as the ten datagrams, in order, byte for byte.
fn udp_gso_intact(b: &std::os::fd::OwnedFd) {
    let rx = turbotun::netns::with_netns(&ns_path(b), || UdpSocket::bind("192.168.80.2:9000").unwrap()).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let tx = UdpSocket::bind("192.168.80.1:0").unwrap();
    turbotun::udp::set_udp_segment(&tx, 1200).unwrap();
    let data = pattern(12000);
    let mut buf = [0u8; 2048];
    for round in 0..5 {
        tx.send_to(&data, "192.168.80.2:9000").unwrap();
        for (k, chunk) in data.chunks(1200).enumerate() {
            let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("round {round} datagram {k}: {e}"));
            assert_eq!(&buf[..n], chunk, "round {round} datagram {k}");
        }
    }
}

/// A TCP stream of 4 MB from A to B through the tunnel arrives intact.
fn tcp_intact(b: &std::os::fd::OwnedFd) {
    let target = "192.168.80.2:5001".parse().unwrap();
    common::tcp_stream_intact(b, target, pattern(4 << 20), |t| {
        std::net::TcpStream::connect_timeout(t, Duration::from_millis(500))
    });
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i ^ (i >> 9) ^ (i >> 17)) as u8).collect()
}

/// Whether this kernel has UDP-tunnel GSO (6.17+). On 6.17+ its absence is a failure; an older kernel gets the
/// suite's skip rule (a failure under CI=true, a counted skip otherwise).
fn kernel_has_tunnel_gso(test: &str) -> bool {
    let caps = turbotun::Capabilities::probe().unwrap();
    if caps.udp_tunnel_gso() {
        return true;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut it = release.trim().split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    let version = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    assert!(version < (6, 17), "{test}: Linux {release} should grant TUN_F_UDP_TUNNEL_GSO");
    common::cannot_run(test, &format!("Linux {} has no UDP-tunnel GSO (6.17+)", release.trim()));
    false
}

fn round_trip(test: &str, outer_v6: bool) {
    in_netns(test, || {
        if !kernel_has_tunnel_gso(test) {
            return;
        }
        let path = build(outer_v6);
        for how in [Carry::Split, Carry::Regroup, Carry::Passthrough] {
            let (supers, segments, coalesced) = with_carriers(&path, how, || {
                udp_gso_intact(&path.b);
                tcp_intact(&path.b);
            });
            eprintln!(
                "{test} {how:?}: {supers} tunnel super-packets, {segments} segments, {coalesced} coalesced written"
            );
            assert!(supers >= 5, "{how:?}: {supers} tunnel super-packets read: the kernel kept none whole");
            if how == Carry::Split {
                assert!(segments >= 50, "{how:?}: {segments} segments written");
            }
            if how == Carry::Regroup {
                assert!(coalesced >= 5, "{how:?}: {coalesced} coalesced tunnel super-packets written");
            }
        }
    });
}

/// Outer IPv4 (VXLAN with outer UDP checksums: `UDP_TUNNEL_CSUM`), inner UDP and TCP over IPv4.
#[test]
fn vxlan_over_ipv4_split_coalesce_passthrough() {
    round_trip("vxlan_over_ipv4_split_coalesce_passthrough", false);
}

/// Outer IPv6, the same inner traffic.
#[test]
fn vxlan_over_ipv6_split_coalesce_passthrough() {
    round_trip("vxlan_over_ipv6_split_coalesce_passthrough", true);
}

/// The library's engine in passthrough mode with `udp_tunnel(true)`: the same VXLAN traffic crosses it with the
/// tunnel super-packets forwarded whole (counted as super-packets), over io_uring and blocking reads.
#[test]
fn engine_passthrough_keeps_tunnel_super_packets_whole() {
    use turbotun::forward::{ForwardMode, ForwarderBuilder};
    use turbotun::IoKind;
    in_netns("engine_passthrough_keeps_tunnel_super_packets_whole", || {
        if !kernel_has_tunnel_gso("engine_passthrough_keeps_tunnel_super_packets_whole") {
            return;
        }
        let ios: &[IoKind] = if cfg!(feature = "uring") { &[IoKind::Block, IoKind::Uring] } else { &[IoKind::Block] };
        for &io in ios {
            let Path { b, tap_a, tap_b } = build(false);
            let builder = ForwarderBuilder::new(ForwardMode::Passthrough).udp_tunnel(true).io(io);
            let forwarder = builder.build(tap_a, tap_b).unwrap();
            let (stop, stats) = (forwarder.stop_handle(), forwarder.stats());
            let runner = std::thread::spawn(move || forwarder.run());
            udp_gso_intact(&b);
            tcp_intact(&b);
            stop.stop();
            runner.join().unwrap().unwrap();
            let total = stats.snapshot().total();
            assert!(total.super_packets >= 5, "{io:?}: {total:?}");
            assert_eq!(total.drops.total(), 0, "{io:?}: {total:?}");
            // The devices go with the forwarder; the next round builds them again.
            drop(b);
            for dev in ["vxa", "ttvxa"] {
                let _ = Netlink::new().and_then(|mut nl| nl.delete_link(dev));
            }
        }
        // Offload mode splits with 10-byte headers only: asking for tunnel offloads there is refused.
        let err = ForwarderBuilder::new(ForwardMode::Offload).udp_tunnel(true).validate(1).unwrap_err();
        assert!(err.to_string().contains("passthrough"), "{err}");
    });
}

/// `create_vxlan` refuses local and remote addresses of different IP versions before asking the kernel, and a
/// VXLAN it creates is there with its kind; `add_neighbour` refuses a device that does not exist, naming it.
#[test]
fn vxlan_and_neighbour_through_rtnetlink() {
    in_netns("vxlan_and_neighbour_through_rtnetlink", || {
        let mut nl = Netlink::new().unwrap();
        let mixed = Vxlan::new("ttvxm", 7, "10.1.0.1".parse().unwrap(), "fd00::2".parse().unwrap());
        let err = nl.create_vxlan(&mixed).unwrap_err().to_string();
        assert!(err.contains("different IP versions"), "{err}");
        let vxlan = Vxlan::new("ttvxok", 7, "10.1.0.1".parse().unwrap(), "10.1.0.2".parse().unwrap());
        nl.create_vxlan(&vxlan).unwrap();
        assert_eq!(nl.link("ttvxok").unwrap().kind.as_deref(), Some("vxlan"));
        nl.add_neighbour("ttvxok", "10.9.9.9".parse().unwrap(), [2, 0, 0, 0, 0, 9]).unwrap();
        let err = nl.add_neighbour("ttnone", "10.9.9.9".parse().unwrap(), [2, 0, 0, 0, 0, 9]).unwrap_err();
        assert!(err.to_string().contains("ttnone"), "{err}");
        nl.delete_link("ttvxok").unwrap();
    });
}
