//! Faults while `turbotun fwd` runs, each on real devices in private namespaces: the forwarder either goes on
//! (and the data that crosses it afterwards is intact) or exits with the reason, never a panic, a hang or
//! anything left behind (the namespaces, and with them the devices, go when the test ends).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use turbotun::netlink::Netlink;

/// Adds a route that the kernel may have removed with the link (an existing one is fine).
fn reroute(nl: &mut Netlink, dest: &str, prefix: u8, dev: &str) {
    if let Err(e) = nl.add_route(dest.parse().unwrap(), prefix, dev) {
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "route to {dest}/{prefix}: {e}");
    }
}

#[test]
fn link_down_and_up_counts_the_drops_and_recovers() {
    if !privileged("link_down_and_up_counts_the_drops_and_recovers") {
        return;
    }
    let mut topo = Topology::start("offload", false, &[]);
    let mut nl_b = Netlink::in_netns(&ns_path(&topo.ns_b)).unwrap();
    nl_b.set_up(&topo.dev_b, false).unwrap();
    // Datagrams from A now meet a device that is down: the forwarder's writes fail with EIO.
    let tx = topo.in_a(|| std::net::UdpSocket::bind((A4, 0)).unwrap());
    for _ in 0..20 {
        tx.send_to(b"into a link that is down", (B4, 7000)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    nl_b.set_up(&topo.dev_b, true).unwrap();
    reroute(&mut nl_b, "10.0.1.0", 24, &topo.dev_b);
    topo.wait_reachable();
    tcp_stream_intact(&topo, B4, 4 << 20);
    udp_datagrams_intact(&topo, A4, B4, false, true);
    let counters = topo.stop();
    assert!(counters["drops_by_reason"]["device_down"].as_u64().unwrap() >= 20, "{counters}");
    assert_eq!(counters["errors"], 0, "{counters}");
}

#[test]
fn mtu_changes_while_forwarding() {
    if !privileged("mtu_changes_while_forwarding") {
        return;
    }
    let topo = Topology::start("offload", false, &[]);
    for mtu in [1280, 9000, 1500] {
        for (ns, dev) in [(&topo.ns_a, &topo.dev_a), (&topo.ns_b, &topo.dev_b)] {
            Netlink::in_netns(&ns_path(ns)).unwrap().set_mtu(dev, mtu).unwrap();
        }
        tcp_stream_intact(&topo, B4, 4 << 20);
        tcp_stream_intact(&topo, B6, 1 << 20);
        udp_datagrams_intact(&topo, A4, B4, true, true);
    }
    let counters = topo.stop();
    assert_eq!(counters["errors"], 0, "{counters}");
}

/// `ethtool -K DEV tso off gso off` (and back on) on both devices while the forwarder runs.
#[test]
fn offloads_turned_off_and_on_with_ethtool() {
    if !privileged("offloads_turned_off_and_on_with_ethtool") {
        return;
    }
    let topo = Topology::start("offload", false, &[]);
    for state in ["off", "on"] {
        for (ns, dev) in [(&topo.ns_a, &topo.dev_a), (&topo.ns_b, &topo.dev_b)] {
            let status = turbotun::netns::with_netns(&ns_path(ns), || {
                Command::new("ethtool").args(["-K", dev, "tso", state, "gso", state, "tx", state]).status()
            })
            .unwrap()
            .expect("ethtool (installed by scripts/install-deps.sh)");
            assert!(status.success(), "ethtool -K {dev} ... {state}");
        }
        tcp_stream_intact(&topo, B4, 4 << 20);
        udp_datagrams_intact(&topo, A6, B6, true, true);
    }
    let counters = topo.stop();
    assert_eq!(counters["errors"], 0, "{counters}");
}

/// SIGSTOP, traffic while stopped (the tun ring holds it), SIGCONT: what was queued arrives.
#[test]
fn stopped_and_continued() {
    if !privileged("stopped_and_continued") {
        return;
    }
    let topo = Topology::start("offload", false, &[]);
    let pid = topo.pid().to_string();
    let rx = topo.in_b(|| std::net::UdpSocket::bind((B4, 7001)).unwrap());
    rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let tx = topo.in_a(|| std::net::UdpSocket::bind((A4, 0)).unwrap());
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    for i in 0..50u32 {
        tx.send_to(&i.to_be_bytes(), (B4, 7001)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let mut buf = [0u8; 16];
    for i in 0..50u32 {
        let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("datagram {i} queued while stopped: {e}"));
        assert_eq!(&buf[..n], &i.to_be_bytes());
    }
    tcp_stream_intact(&topo, B4, 2 << 20);
    let counters = topo.stop();
    // A packet the kernel sent through A while B was still down during set-up (IPv6 router solicitations) is a
    // `device_down` drop; nothing else may be dropped.
    let drops = counters["drops"].as_u64().unwrap();
    let device_down = counters["drops_by_reason"]["device_down"].as_u64().unwrap();
    assert_eq!(drops - device_down, 0, "{counters}");
}

/// The namespace of one side goes away (its last reference dropped): its device goes with it and the forwarder
/// exits non-zero promptly, naming the device.
#[test]
fn namespace_deleted_under_the_forwarder() {
    if !privileged("namespace_deleted_under_the_forwarder") {
        return;
    }
    let mut topo = Topology::start("offload", false, &[]);
    let gone = std::mem::replace(&mut topo.ns_b, common::new_netns());
    drop(gone);
    let started = Instant::now();
    let child = topo.child.as_mut().unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "forwarder still running 5 s after its device's namespace went"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{status:?}");
}
