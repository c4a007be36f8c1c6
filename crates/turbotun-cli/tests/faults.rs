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

/// How long a test waits for an event the forwarder must bring about: generous, so that only a forwarder that
/// never does it fails (not a speed check).
const EVENT_BOUND: Duration = Duration::from_secs(30);

/// Waits until every thread of process `pid` is in `state` (`S`: asleep, `T`: stopped by a signal).
fn wait_threads_in(pid: &str, state: &str) {
    let deadline = Instant::now() + EVENT_BOUND;
    loop {
        let states: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .map(|t| std::fs::read_to_string(t.path().join("stat")).unwrap_or_default())
            // The state follows the command name, which is in parentheses and may hold anything.
            .map(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start()[..1].to_string()).unwrap_or_default())
            .collect();
        if states.iter().all(|s| s == state) {
            return;
        }
        assert!(Instant::now() < deadline, "process {pid}: thread states {states:?}, waiting for all {state}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Packets the reader of device `dev` (the forwarder) took from it so far: its TX packets in
/// `/proc/thread-self/net/dev` of the calling thread's namespace.
fn taken_from(dev: &str) -> u64 {
    let table = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    let line = table.lines().find(|l| l.trim_start().starts_with(&format!("{dev}:"))).expect("the device's line");
    // After the name: 8 receive fields, then transmit bytes and packets.
    line.split(':').nth(1).unwrap().split_whitespace().nth(9).unwrap().parse().unwrap()
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
    let taken = topo.in_a(|| taken_from(&topo.dev_a));
    let tx = topo.in_a(|| std::net::UdpSocket::bind((A4, 0)).unwrap());
    for _ in 0..20 {
        tx.send_to(b"into a link that is down", (B4, 7000)).unwrap();
    }
    // B comes up again once the forwarder has taken all 20 from A and gone back to sleep in its reads (so their
    // writes are done), not after a guessed pause.
    let deadline = Instant::now() + EVENT_BOUND;
    while topo.in_a(|| taken_from(&topo.dev_a)) < taken + 20 {
        assert!(Instant::now() < deadline, "the forwarder did not take the 20 datagrams from A");
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_threads_in(&topo.pid().to_string(), "S");
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
    let tx = topo.in_a(|| std::net::UdpSocket::bind((A4, 0)).unwrap());
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    wait_threads_in(&pid, "T");
    for i in 0..50u32 {
        tx.send_to(&i.to_be_bytes(), (B4, 7001)).unwrap();
    }
    // Each send returned once its datagram was in A's ring; with every thread stopped none can have crossed.
    rx.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 16];
    let early = rx.recv(&mut buf).map_err(|e| e.kind());
    assert_eq!(early, Err(std::io::ErrorKind::WouldBlock), "a datagram crossed a stopped forwarder");
    rx.set_nonblocking(false).unwrap();
    rx.set_read_timeout(Some(EVENT_BOUND)).unwrap();
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
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
/// exits non-zero, naming the device on stderr.
#[test]
fn namespace_deleted_under_the_forwarder() {
    if !privileged("namespace_deleted_under_the_forwarder") {
        return;
    }
    let mut topo = Topology::start_with_env("offload", false, &[], &[]);
    let gone = std::mem::replace(&mut topo.ns_b, common::new_netns());
    drop(gone);
    let status = wait_exit(topo.child.as_mut().unwrap(), EVENT_BOUND, "the forwarder whose device's namespace went");
    assert!(!status.success(), "{status:?}");
    let stderr = topo.stderr.take().unwrap().join().unwrap();
    assert!(
        stderr.contains(&topo.dev_b) && stderr.contains("gone"),
        "stderr names the device {}: {stderr}",
        topo.dev_b
    );
}
