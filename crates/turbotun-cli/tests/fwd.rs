//! `turbotun fwd` between two namespaces: TCP and UDP (v4 and v6, TUN and TAP, USO) cross it intact.
//!
//! Every namespace here is private (never named in /run/netns): the forwarder's, A's and B's. They live as long
//! as an fd refers to them and vanish with their devices when the test ends, even on panic.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use turbotun::netlink::Netlink;
use turbotun::netns::{with_netns, with_private_netns};

const A4: &str = "10.0.1.1";
const B4: &str = "10.0.2.1";
const A6: &str = "fd00:1::1";
const B6: &str = "fd00:2::1";

fn privileged(test: &str) -> bool {
    match with_private_netns(|| ()) {
        Ok(()) => true,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{test}: cannot run under CI=true: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: needs root: {e}");
            false
        }
    }
}

fn new_netns() -> OwnedFd {
    with_private_netns(|| std::fs::File::open("/proc/thread-self/ns/net").expect("own netns").into())
        .expect("private netns")
}

fn ns_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A running forwarder with its namespaces; killed and reaped on drop.
struct Topology {
    ns_a: OwnedFd,
    ns_b: OwnedFd,
    _ns_fwd: OwnedFd,
    child: Option<Child>,
    stdout: Option<BufReader<ChildStdout>>,
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Topology {
    fn start(mode: &str, tap: bool, extra: &[&str]) -> Topology {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let (dev_a, dev_b) = (format!("ttfa{n}"), format!("ttfb{n}"));
        let (ns_a, ns_b, ns_fwd) = (new_netns(), new_netns(), new_netns());
        let mut args = vec!["fwd".to_string(), dev_a.clone(), dev_b.clone(), "--mode".into(), mode.into()];
        if tap {
            args.push("--tap".into());
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut child = with_netns(&ns_path(&ns_fwd), || {
            Command::new(env!("CARGO_BIN_EXE_turbotun"))
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn turbotun fwd")
        })
        .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "forwarder announces readiness");
        let mut topo = Topology { ns_a, ns_b, _ns_fwd: ns_fwd, child: Some(child), stdout: Some(stdout) };

        let mut nl = Netlink::in_netns(&ns_path(&topo._ns_fwd)).unwrap();
        nl.move_to_netns(&dev_a, &ns_path(&topo.ns_a)).unwrap();
        nl.move_to_netns(&dev_b, &ns_path(&topo.ns_b)).unwrap();
        for (ns, dev, me4, peer4, me6, peer6) in
            [(&topo.ns_a, &dev_a, A4, "10.0.2.0", A6, "fd00:2::"), (&topo.ns_b, &dev_b, B4, "10.0.1.0", B6, "fd00:1::")]
        {
            let mut nl = Netlink::in_netns(&ns_path(ns)).unwrap();
            nl.add_address(dev, me4.parse().unwrap(), 24).unwrap();
            nl.add_address(dev, me6.parse().unwrap(), 64).unwrap();
            nl.set_up(dev, true).unwrap();
            nl.add_route(peer4.parse().unwrap(), 24, dev).unwrap();
            nl.add_route(peer6.parse().unwrap(), 64, dev).unwrap();
        }
        topo.wait_reachable();
        topo
    }

    /// TAP needs ARP/ND to settle, and both directions need the devices up: retry a tiny TCP connect.
    fn wait_reachable(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = self.in_b(|| TcpListener::bind((B4, 4999)).unwrap());
        loop {
            let ok = self.in_a(|| {
                TcpStream::connect_timeout(&(B4.parse::<IpAddr>().unwrap(), 4999).into(), Duration::from_millis(500))
                    .is_ok()
            });
            if ok {
                let _ = listener.accept();
                return;
            }
            assert!(Instant::now() < deadline, "B never became reachable through the forwarder");
        }
    }

    fn in_a<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        with_netns(&ns_path(&self.ns_a), f).unwrap()
    }
    fn in_b<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        with_netns(&ns_path(&self.ns_b), f).unwrap()
    }

    /// SIGTERM, then the counters line; the forwarder must exit 0.
    fn stop(mut self) -> serde_json::Value {
        let mut child = self.child.take().unwrap();
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let mut rest = String::new();
        self.stdout.take().unwrap().read_to_string(&mut rest).unwrap();
        let exit = child.wait().unwrap();
        assert!(exit.success(), "forwarder exits 0 after SIGTERM: {exit:?}");
        serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("counters JSON {rest:?}: {e}"))
    }
}

/// Deterministic pseudo-random bytes (xorshift), so a failure reproduces.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn tcp_stream_intact(topo: &Topology, dst: &str, len: usize) {
    let port = 5001;
    let listener = topo.in_b(|| TcpListener::bind((dst, port)).unwrap());
    let data = pattern(len, len as u64);
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut got = Vec::with_capacity(len);
        s.read_to_end(&mut got).unwrap();
        got
    });
    let target: SocketAddr = (dst.parse::<IpAddr>().unwrap(), port).into();
    let mut s = topo.in_a(|| TcpStream::connect_timeout(&target, Duration::from_secs(5)).unwrap());
    s.write_all(&data).unwrap();
    drop(s);
    let got = receiver.join().unwrap();
    assert_eq!(got.len(), data.len(), "byte count over {dst}");
    assert!(got == data, "byte stream over {dst} arrived altered");
}

/// Datagrams of many sizes in bursts; each burst is received before the next is sent, so no queue can overflow
/// and every datagram must arrive complete and in order. With `uso`, each burst is one UDP GSO send of 40
/// segments, which crosses the forwarder as a super-packet.
/// `ordered` is false for several workers on one queue (`--threads`), which may reorder datagrams of a flow.
/// The largest UDP super-packet the kernel hands a TAP device whole: the device's `gso_max_size` (65,536) counts
/// the Ethernet header, so 65,494 bytes of payload (a 65,522-byte IP packet) make a 65,536-byte frame, one byte
/// more than 65,535. It must arrive whole, never cut (segments of 1,400, the last one shorter).
fn udp_largest_super_packet_intact(topo: &Topology, src: &str, dst: &str) {
    let rx = topo.in_b(|| UdpSocket::bind((dst, 6002)).unwrap());
    rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let tx = topo.in_a(|| UdpSocket::bind((src, 0)).unwrap());
    tx.connect((dst, 6002)).unwrap();
    turbotun::socket::set_udp_segment(&tx, 1400).unwrap();
    let mut buf = vec![0u8; 65536];
    for send in 0..5u64 {
        let data = pattern(65_494, 1000 + send);
        tx.send(&data).unwrap();
        for (k, want) in data.chunks(1400).enumerate() {
            let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("send {send} segment {k}: {e}"));
            assert_eq!(&buf[..n], want, "send {send} segment {k}");
        }
    }
}

fn udp_datagrams_intact(topo: &Topology, src: &str, dst: &str, uso: bool, ordered: bool) {
    let port = 6001;
    let rx = topo.in_b(|| UdpSocket::bind((dst, port)).unwrap());
    rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let tx = topo.in_a(|| UdpSocket::bind((src, 0)).unwrap());
    tx.connect((dst, port)).unwrap();
    let seg = 1200usize;
    if uso {
        turbotun::socket::set_udp_segment(&tx, seg as u16).unwrap();
    }
    let mut buf = vec![0u8; 65536];
    let (bursts, per_burst) = if uso { (20u32, 40u32) } else { (50, 8) };
    for burst in 0..bursts {
        let mut expected = Vec::new();
        let mut gso_send = Vec::new();
        for k in 0..per_burst {
            let i = burst * per_burst + k;
            let size = if uso { seg } else { 4 + (i as usize * 37) % 1400 };
            let mut d = pattern(size, u64::from(i));
            d[..4].copy_from_slice(&i.to_be_bytes());
            if uso {
                gso_send.extend_from_slice(&d);
            } else {
                tx.send(&d).unwrap();
            }
            expected.push(d);
        }
        if uso {
            tx.send(&gso_send).unwrap();
        }
        let mut got = Vec::with_capacity(expected.len());
        for k in 0..expected.len() {
            let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("burst {burst} datagram {k} over {dst}: {e}"));
            got.push(buf[..n].to_vec());
        }
        if !ordered {
            got.sort();
            expected.sort();
        }
        for (k, (g, want)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, want, "burst {burst} datagram {k} over {dst} (uso {uso}, ordered {ordered})");
        }
    }
}

fn run_matrix(test: &str, mode: &str, tap: bool, checks: &[&str]) {
    run_matrix_with(test, mode, tap, &[], checks);
}

fn run_matrix_with(test: &str, mode: &str, tap: bool, extra: &[&str], checks: &[&str]) {
    if !privileged(test) {
        return;
    }
    let topo = Topology::start(mode, tap, extra);
    let ordered = !extra.contains(&"--threads");
    for check in checks {
        match *check {
            "tcp4" => tcp_stream_intact(&topo, B4, 8 << 20),
            "tcp6" => tcp_stream_intact(&topo, B6, 8 << 20),
            "udp4" => udp_datagrams_intact(&topo, A4, B4, false, ordered),
            "udp6" => udp_datagrams_intact(&topo, A6, B6, false, ordered),
            "uso4" => udp_datagrams_intact(&topo, A4, B4, true, ordered),
            "uso6" => udp_datagrams_intact(&topo, A6, B6, true, ordered),
            "usomax4" => udp_largest_super_packet_intact(&topo, A4, B4),
            other => panic!("unknown check {other}"),
        }
    }
    let counters = topo.stop();
    assert_eq!(counters["mode"], mode);
    let io = match extra.iter().position(|a| *a == "--io") {
        Some(i) if extra[i + 1] == "tokio" => "tokio",
        Some(i) => extra[i + 1],
        None if extra.contains(&"--async") => "tokio",
        None if mode == "offload" || extra.contains(&"--threads") => "block",
        None => "uring",
    };
    assert_eq!(counters["io"], io, "{counters}");
    // Every check moves at least one 8 MiB TCP stream (passthrough counts a super-packet as one packet).
    assert!(counters["bytes"].as_u64().unwrap() >= 8 << 20, "{counters}");
    assert_eq!(counters["errors"], 0, "{counters}");
    // Every packet a read produced was written or counted as a drop (a packet sent while the other device was
    // still down during set-up is a `device_down` drop), nothing left in flight.
    for dir in ["a_to_b", "b_to_a"] {
        let d = &counters[dir];
        let drops: u64 = d["drops"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(d["packets"].as_u64().unwrap() + drops, d["segments"].as_u64().unwrap(), "{dir}: {counters}");
    }
    assert_eq!(counters["malformed"].as_u64().unwrap_or(0), 0, "{counters}");
    if mode == "offload" {
        assert!(counters["super_packets"].as_u64().unwrap() > 0, "TSO super-packets were split: {counters}");
        assert!(counters["zero_copy_splits"].as_u64().unwrap() > 0, "most without a copy: {counters}");
        assert!(counters["coalesced"].as_u64().unwrap() > 0, "segments were coalesced again: {counters}");
        let (reads, writes) = (counters["reads"].as_u64().unwrap(), counters["writes"].as_u64().unwrap());
        assert!(reads > 0 && writes > 0 && writes < counters["packets"].as_u64().unwrap(), "{counters}");
    }
}

#[test]
fn fwd_offload_tun_v4_v6_tcp_udp_uso() {
    run_matrix("fwd_offload_tun", "offload", false, &["tcp4", "tcp6", "udp4", "udp6", "uso4", "uso6"]);
}

#[test]
fn fwd_offload_tap_v4_v6() {
    run_matrix("fwd_offload_tap", "offload", true, &["tcp4", "tcp6", "udp4", "uso4", "usomax4"]);
}

#[test]
fn fwd_passthrough_tap_largest_frames() {
    run_matrix("fwd_passthrough_tap", "passthrough", true, &["tcp4", "usomax4"]);
    run_matrix_with("fwd_passthrough_tap_uring", "passthrough", true, &["--io", "uring"], &["tcp4", "usomax4"]);
}

#[test]
fn fwd_passthrough_tun() {
    run_matrix("fwd_passthrough_tun", "passthrough", false, &["tcp4", "tcp6", "udp4", "uso4"]);
}

#[test]
fn fwd_plain_tun_and_tap() {
    run_matrix("fwd_plain_tun", "plain", false, &["tcp4", "udp4", "udp6"]);
    run_matrix("fwd_plain_tap", "plain", true, &["tcp4", "udp4"]);
    run_matrix_with("fwd_plain_tun_block", "plain", false, &["--io", "block"], &["tcp4", "udp4", "udp6"]);
    run_matrix_with("fwd_passthrough_block", "passthrough", false, &["--io", "block"], &["tcp4", "uso4"]);
}

#[test]
fn fwd_offload_async_tokio() {
    run_matrix_with("fwd_offload_async", "offload", false, &["--async"], &["tcp4", "tcp6", "udp4", "uso4"]);
}

#[test]
fn fwd_plain_and_passthrough_tokio() {
    run_matrix_with("fwd_plain_tokio", "plain", false, &["--io", "tokio"], &["tcp4", "udp6"]);
    run_matrix_with("fwd_passthrough_tokio_tap", "passthrough", true, &["--io", "tokio"], &["tcp4", "uso4"]);
}

#[test]
fn fwd_offload_two_threads_and_two_queues() {
    run_matrix_with("fwd_offload_threads2", "offload", false, &["--threads", "2"], &["tcp4", "udp4", "uso6"]);
    run_matrix_with("fwd_offload_queues2", "offload", false, &["--queues", "2"], &["tcp4", "tcp6", "udp4"]);
}

#[test]
fn fwd_io_uring_plain_and_passthrough() {
    run_matrix_with("fwd_plain_uring", "plain", false, &["--io", "uring"], &["tcp4", "tcp6", "udp4", "udp6"]);
    run_matrix_with("fwd_plain_uring_tap", "plain", true, &["--io", "uring", "--depth", "4"], &["tcp4", "udp4"]);
    run_matrix_with("fwd_passthrough_uring", "passthrough", false, &["--io", "uring"], &["tcp4", "tcp6", "uso4"]);
    // One ring per queue and direction, the flow steered to one queue (default I/O for plain: io_uring).
    run_matrix_with("fwd_plain_uring_queues2", "plain", false, &["--queues", "2"], &["tcp4", "udp4"]);
}

#[test]
fn fwd_io_poll_non_blocking_workers() {
    run_matrix_with("fwd_offload_poll", "offload", false, &["--io", "poll"], &["tcp4", "udp4", "uso4"]);
    run_matrix_with("fwd_plain_poll", "plain", false, &["--io", "poll"], &["tcp4", "udp6"]);
}

/// Deleting a device under the forwarder: it says so on stderr and exits non-zero within a second, whether its
/// workers sleep in a blocking read (the default), in poll, or in io_uring.
#[test]
fn fwd_exits_when_a_device_disappears() {
    if !privileged("fwd_exits_when_a_device_disappears") {
        return;
    }
    for extra in [
        &[][..],
        &["--io", "poll"],
        &["--async"],
        &["--mode", "plain"],
        &["--mode", "plain", "--io", "block"],
        &["--mode", "plain", "--async"],
    ] {
        exits_when_a_device_disappears(extra);
    }
}

fn exits_when_a_device_disappears(extra: &[&str]) {
    let ns = new_netns();
    let mut child = with_netns(&ns_path(&ns), || {
        Command::new(env!("CARGO_BIN_EXE_turbotun"))
            .args(["fwd", "ttgone0", "ttgone1"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    })
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    Netlink::in_netns(&ns_path(&ns)).unwrap().delete_link("ttgone1").unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(3) {
            let _ = child.kill();
            panic!("forwarder {extra:?} still running 3 s after its device was deleted");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "{extra:?}");
    // The promise is "within a second"; the bound leaves room for a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(2), "{extra:?} exited promptly: {:?}", started.elapsed());
    assert!(err.contains("ttgone1") && err.contains("gone"), "{extra:?}: stderr names the device: {err}");
}

/// SIGINT stops every kind of worker promptly (a blocking read, poll, io_uring, tokio) and the counters are
/// printed; the bound is generous for a loaded machine, the point is that no worker waits out a timeout.
#[test]
fn fwd_stops_promptly_on_sigint() {
    if !privileged("fwd_stops_promptly_on_sigint") {
        return;
    }
    for extra in [&["--io", "block"][..], &["--io", "poll"], &["--async"], &["--mode", "plain", "--io", "uring"]] {
        let ns = new_netns();
        let mut child = with_netns(&ns_path(&ns), || {
            Command::new(env!("CARGO_BIN_EXE_turbotun"))
                .args(["fwd", "ttstop0", "ttstop1"])
                .args(extra)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let started = Instant::now();
        assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
        let status = child.wait().unwrap();
        let took = started.elapsed();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert!(status.success(), "{extra:?}: {status:?}");
        assert!(rest.contains("\"packets\""), "{extra:?}: counters printed: {rest}");
        assert!(took < Duration::from_secs(1), "{extra:?} took {took:?} to stop");
    }
}

/// Signals the forwarder relies on are taken back when they come ignored from the parent (a supervisor, nohup):
/// SIGTERM still stops it and its blocking workers are still woken.
#[test]
fn fwd_stops_with_inherited_ignored_signals() {
    if !privileged("fwd_stops_with_inherited_ignored_signals") {
        return;
    }
    let ns = new_netns();
    let script =
        format!("trap '' TERM INT RTMIN+3; exec {} fwd ttign0 ttign1 --io block", env!("CARGO_BIN_EXE_turbotun"));
    let mut child = with_netns(&ns_path(&ns), || {
        Command::new("bash").args(["-c", &script]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    })
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    if line.trim() != "ready" {
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        panic!("forwarder did not start with ignored signals: {line:?} {err}");
    }
    let started = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
}

#[test]
fn fwd_rejects_options_that_do_not_fit() {
    let out = Command::new(env!("CARGO_BIN_EXE_turbotun"))
        .args(["fwd", "a", "b", "--threads", "2", "--queues", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("don't fit together"));
    for (args, why) in [
        (&["--io", "uring"][..], "io_uring goes with plain or passthrough mode"),
        (&["--io", "poll", "--async"], "--io and --async don't fit together"),
        (&["--mode", "plain", "--io", "uring", "--threads", "2"], "use several queues rather than several threads"),
        (&["--async", "--threads", "2"], "use several queues rather than several threads"),
        (&["--depth", "48"], "depth must be a power of two between 1 and 1024"),
        (&["--batch", "65"], "batch must be between 1 and 64"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_turbotun")).args(["fwd", "a", "b"]).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(why), "{args:?}: {out:?}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_turbotun")).args(["fwd", "same", "same"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("must differ"));
    let out = Command::new(env!("CARGO_BIN_EXE_turbotun")).args(["fwd", "bad name", "b"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid interface name"), "{out:?}");
}
