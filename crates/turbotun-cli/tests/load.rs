//! `turbotun load gen` and `load sink` as processes on 127.0.0.1 (loopback of the test's own namespace, no
//! privileges needed): the JSON lines add up at a modest paced rate, and bad input gets a clear error.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn turbotun(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turbotun")).args(args).output().expect("run turbotun")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Whether a UDP socket of this namespace is bound to local port `port` (`/proc/net/udp`, ports in hex).
fn udp_port_bound(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/udp").unwrap();
    let want = format!(":{port:04X} ");
    table.lines().skip(1).any(|l| l.split_whitespace().nth(1).is_some_and(|local| format!("{local} ").ends_with(&want)))
}

#[test]
fn gen_and_sink_json_add_up() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let sink = Command::new(env!("CARGO_BIN_EXE_turbotun"))
        .args(["load", "sink", "--bind", &addr, "--duration", "4", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the sink");
    // A datagram before the sink has bound would only be counted as refused by the generator: wait until the
    // port is bound (the sink runs in this test's namespace, so its socket is in this /proc/net/udp).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !udp_port_bound(port) {
        assert!(Instant::now() < deadline, "the sink never bound {addr}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let gen = turbotun(&[
        "load",
        "gen",
        "--dest",
        &addr,
        "--rate",
        "20000",
        "--size",
        "100",
        "--flows",
        "2",
        "--duration",
        "1",
        "--json",
    ]);
    assert!(gen.status.success(), "{}", text(&gen));
    let sink = sink.wait_with_output().expect("sink");
    assert!(sink.status.success(), "{}", text(&sink));
    let g: serde_json::Value = serde_json::from_slice(&gen.stdout).unwrap();
    let s: serde_json::Value = serde_json::from_slice(&sink.stdout).unwrap();
    assert_eq!(g["send_errors"], 0, "{g}");
    assert_eq!(s["datagrams"], g["sent"], "{s}\n{g}");
    assert_eq!(s["bytes"].as_u64().unwrap(), g["sent"].as_u64().unwrap() * 100);
    for k in ["lost", "reordered", "duplicated", "socket_drops", "malformed"] {
        assert_eq!(s[k], 0, "{k}: {s}");
    }
    let flows = s["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 2, "{s}");
    assert_eq!(flows[0]["expected"], g["per_flow"][0]);
}

#[test]
fn load_bad_input_gets_a_clear_error() {
    let out = turbotun(&["load", "gen", "--dest", "127.0.0.1:9", "--size", "8", "--duration", "1"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("datagram size 8 out of range: 16"), "{}", text(&out));
    let out = turbotun(&["load", "gen", "--dest", "127.0.0.1:9", "--size", "1400", "--gso", "64"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("more than UDP's 65507"), "{}", text(&out));
}
