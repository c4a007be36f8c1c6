//! `turbotun fwd` between two namespaces: TCP and UDP (v4 and v6, TUN and TAP, USO) cross it intact.
//!
//! Every namespace here is private (never named in /run/netns): the forwarder's, A's and B's. They live as long
//! as an fd refers to them and vanish with their devices when the test ends, even on panic.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;

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
fn fwd_io_uring_offload() {
    run_matrix_with(
        "fwd_offload_uring",
        "offload",
        false,
        &["--io", "uring"],
        &["tcp4", "tcp6", "udp4", "udp6", "uso4", "uso6"],
    );
    run_matrix_with(
        "fwd_offload_uring_tap",
        "offload",
        true,
        &["--io", "uring"],
        &["tcp4", "tcp6", "udp4", "uso4", "usomax4"],
    );
    run_matrix_with(
        "fwd_offload_uring_depth2",
        "offload",
        false,
        &["--io", "uring", "--depth", "2", "--batch", "8"],
        &["tcp4", "uso6"],
    );
}

/// With io_uring turned off (TURBOTUN_NO_URING, as where a container denies it), `--io uring` runs the
/// blocking path: a note on stderr says why, the counters line says `"io":"block"`, and the data still crosses
/// intact.
#[test]
fn fwd_io_uring_turned_off_falls_back_to_blocking() {
    if !privileged("fwd_io_uring_turned_off_falls_back_to_blocking") {
        return;
    }
    for mode in ["offload", "passthrough"] {
        let topo = Topology::start_with_env(mode, false, &["--io", "uring"], &[("TURBOTUN_NO_URING", "1")]);
        tcp_stream_intact(&topo, B4, 8 << 20);
        udp_datagrams_intact(&topo, A4, B4, true, true);
        let (counters, stderr) = topo.stop_with_stderr();
        assert_eq!(counters["io"], "block", "{mode}: {counters}");
        assert!(stderr.contains("io_uring turned off by TURBOTUN_NO_URING; using blocking reads"), "{mode}: {stderr}");
        assert!(counters["bytes"].as_u64().unwrap() >= 8 << 20, "{counters}");
        assert_eq!(counters["errors"], 0, "{counters}");
    }
}

#[test]
fn fwd_io_poll_non_blocking_workers() {
    run_matrix_with("fwd_offload_poll", "offload", false, &["--io", "poll"], &["tcp4", "udp4", "uso4"]);
    run_matrix_with("fwd_plain_poll", "plain", false, &["--io", "poll"], &["tcp4", "udp6"]);
}

/// How long a test waits for the forwarder to exit on an event: generous, so that only a forwarder that never
/// exits fails (how fast it exits is not asserted; a worker that waits out a long timeout would still fail).
const EXIT_BOUND: Duration = Duration::from_secs(30);

/// Deleting a device under the forwarder: it says so on stderr and exits non-zero, whether its workers sleep in a
/// blocking read (the default), in poll, or in io_uring.
#[test]
fn fwd_exits_when_a_device_disappears() {
    if !privileged("fwd_exits_when_a_device_disappears") {
        return;
    }
    for extra in [
        &[][..],
        &["--io", "uring"],
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
    let mut running = common::start_ready(
        &ns,
        Command::new(env!("CARGO_BIN_EXE_turbotun"))
            .args(["fwd", "ttgone0", "ttgone1"])
            .args(extra)
            .stderr(Stdio::piped()),
    );
    let child = running.0.as_mut().unwrap();
    Netlink::in_netns(&ns_path(&ns)).unwrap().delete_link("ttgone1").unwrap();
    let status = common::wait_exit(child, EXIT_BOUND, &format!("forwarder {extra:?} whose device was deleted"));
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "{extra:?}");
    assert!(err.contains("ttgone1") && err.contains("gone"), "{extra:?}: stderr names the device: {err}");
}

/// SIGINT stops every kind of worker (a blocking read, poll, io_uring, tokio) and the counters are printed.
#[test]
fn fwd_stops_promptly_on_sigint() {
    if !privileged("fwd_stops_promptly_on_sigint") {
        return;
    }
    for extra in [
        &["--io", "block"][..],
        &["--io", "poll"],
        &["--async"],
        &["--mode", "plain", "--io", "uring"],
        &["--io", "uring"],
    ] {
        let ns = new_netns();
        let mut running = common::start_ready(
            &ns,
            Command::new(env!("CARGO_BIN_EXE_turbotun")).args(["fwd", "--json", "ttstop0", "ttstop1"]).args(extra),
        );
        let child = running.0.as_mut().unwrap();
        let mut out = child.stdout.take().unwrap();
        assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
        let status = common::wait_exit(child, EXIT_BOUND, &format!("forwarder {extra:?} after SIGINT"));
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert!(status.success(), "{extra:?}: {status:?}");
        assert!(rest.contains("\"packets\""), "{extra:?}: counters printed: {rest}");
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
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = common::wait_exit(&mut child, EXIT_BOUND, "forwarder started with ignored signals, after SIGTERM");
    assert!(status.success(), "{status:?}");
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
        (&["--io", "poll", "--async"][..], "--io and --async don't fit together"),
        (&["--mode", "plain", "--io", "uring", "--threads", "2"], "use several queues rather than several threads"),
        (&["--async", "--threads", "2"], "use several queues rather than several threads"),
        (&["--depth", "48"], "depth 48 is out of range: a power of two from 1 to 1024"),
        (&["--batch", "65"], "batch 65 is out of range: 1 to 64"),
        (&["--mode", "offload", "--udp-tunnel"], "udp_tunnel goes with passthrough mode"),
        (&["--mode", "plain", "--checksums", "partial"], "partial checksums go with offload mode"),
        (&["--register-buffers"], "registered buffers go with offload mode through io_uring"),
        (&["--mode", "offload", "--io", "block", "--register-buffers"], "registered buffers go with offload mode"),
        // Refused when the arguments are parsed: the sampler thread used to panic on them and the forwarder ran
        // on without it.
        (&["--stats-interval", "inf"], "give a number above 0 and at most"),
        (&["--stats-interval", "1e300"], "give a number above 0 and at most"),
        (&["--stats-interval", "NaN"], "give a number above 0 and at most"),
        (&["--stats-interval", "0"], "give a number above 0 and at most"),
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

/// `fwd --txqueuelen` gives both devices that ring length (they keep it when moved to their namespaces), and
/// traffic flows through them.
#[test]
fn fwd_sets_txqueuelen() {
    if !privileged("fwd_sets_txqueuelen") {
        return;
    }
    let topo = Topology::start("plain", false, &["--txqueuelen", "4321"]);
    for (ns, dev) in [(&topo.ns_a, &topo.dev_a), (&topo.ns_b, &topo.dev_b)] {
        let link = Netlink::in_netns(&ns_path(ns)).unwrap().link(dev).unwrap();
        assert_eq!(link.txqueuelen, 4321, "{dev}");
    }
    udp_datagrams_intact(&topo, A4, B4, false, true);
    let counters = topo.stop();
    assert_eq!(counters["errors"], 0, "{counters}");
}

/// `fwd --mode passthrough --tap --udp-tunnel`: both TAP devices get the UDP-tunnel offloads (Linux 6.17+; this
/// machine runs 6.18; granted only with the 24-byte virtio header), as `turbotun info` reads them back, and
/// ordinary TCP and UDP still cross intact. (VXLAN super-packets through such devices: `tests/tunnel.rs`.)
#[test]
fn fwd_passthrough_udp_tunnel_devices() {
    if !privileged("fwd_passthrough_udp_tunnel_devices") {
        return;
    }
    let topo = Topology::start("passthrough", true, &["--udp-tunnel"]);
    for (ns, dev) in [(&topo.ns_a, &topo.dev_a), (&topo.ns_b, &topo.dev_b)] {
        let out = with_netns(&ns_path(ns), || {
            Command::new(env!("CARGO_BIN_EXE_turbotun")).args(["info", dev, "--json"]).output().unwrap()
        })
        .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let offloads: Vec<&str> = info[0]["offloads"].as_array().unwrap().iter().filter_map(|o| o.as_str()).collect();
        for o in ["udp_tunnel_gso", "udp_tunnel_gso_csum", "tso4", "uso4"] {
            assert!(offloads.contains(&o), "{dev}: {offloads:?}");
        }
    }
    tcp_stream_intact(&topo, B4, 4 << 20);
    udp_datagrams_intact(&topo, A4, B4, true, true);
    let counters = topo.stop();
    assert_eq!(counters["errors"], 0, "{counters}");
}
