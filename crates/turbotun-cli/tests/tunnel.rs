//! `turbotun tunnel` as a process: two namespaces joined by a veth pair, a plain tunnel between them (one end
//! with two queues and dropped to nobody), TCP both ways byte for byte, the counters on SIGTERM; and options
//! that cannot work refused before anything is made.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{new_netns, ns_path, privileged};
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;

const TURBOTUN: &str = env!("CARGO_BIN_EXE_turbotun");

/// A `turbotun tunnel` process, killed on drop.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Running {
    /// SIGTERM, then the counters line it printed.
    fn stop(mut self) -> serde_json::Value {
        let mut child = self.0.take().unwrap();
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert!(child.wait().unwrap().success());
        serde_json::from_str(out.lines().last().unwrap()).unwrap()
    }
}

fn start(ns: &OwnedFd, args: &[&str]) -> Running {
    let mut child = with_netns(&ns_path(ns), || {
        Command::new(TURBOTUN).arg("tunnel").args(args).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()
    })
    .unwrap()
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    child.stdout = Some(out.into_inner());
    Running(Some(child))
}

fn tcp_intact(from: &OwnedFd, to: &OwnedFd, to_addr: &str, len: usize) {
    let listener = with_netns(&ns_path(to), || TcpListener::bind((to_addr, 7200))).unwrap().unwrap();
    let data = common::pattern(len, 3);
    let expected = data.clone();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    });
    let dst: SocketAddr = format!("{to_addr}:7200").parse().unwrap();
    let mut s =
        with_netns(&ns_path(from), || TcpStream::connect_timeout(&dst, Duration::from_secs(5))).unwrap().unwrap();
    s.write_all(&data).unwrap();
    drop(s);
    assert!(receiver.join().unwrap() == expected, "{len} bytes to {to_addr}");
}

#[test]
fn plain_tunnel_between_two_namespaces() {
    if !privileged("plain_tunnel_between_two_namespaces") {
        return;
    }
    let (a, b) = (new_netns(), new_netns());
    let tag = std::process::id() % 100_000;
    let (ula, ulb, tta, ttb) = (format!("tua{tag}"), format!("tub{tag}"), format!("tta{tag}"), format!("ttb{tag}"));
    let mut nl = Netlink::in_netns(&ns_path(&a)).unwrap();
    nl.create_veth(&ula, &ulb).unwrap();
    nl.move_to_netns(&ulb, &ns_path(&b)).unwrap();
    for (ns, ul, me) in [(&a, &ula, "10.201.0.1"), (&b, &ulb, "10.201.0.2")] {
        let mut nl = Netlink::in_netns(&ns_path(ns)).unwrap();
        nl.add_address(ul, me.parse().unwrap(), 24).unwrap();
        nl.set_up(ul, true).unwrap();
        nl.set_up("lo", true).unwrap();
    }
    let end_a = start(&a, &[&tta, "--local", "10.201.0.1:6000", "--remote", "10.201.0.2:6000"]);
    let end_b = start(
        &b,
        &[&ttb, "--local", "10.201.0.2:6000", "--remote", "10.201.0.1:6000", "--queues", "2", "--user", "nobody"],
    );
    for (ns, dev, inner) in [(&a, &tta, "10.202.0.1"), (&b, &ttb, "10.202.0.2")] {
        let mut nl = Netlink::in_netns(&ns_path(ns)).unwrap();
        nl.add_address(dev, inner.parse().unwrap(), 24).unwrap();
        nl.set_mtu(dev, 1472).unwrap();
        nl.set_up(dev, true).unwrap();
    }
    tcp_intact(&a, &b, "10.202.0.2", 32 << 20);
    tcp_intact(&b, &a, "10.202.0.1", 32 << 20);
    let (ca, cb) = (end_a.stop(), end_b.stop());
    for c in [&ca, &cb] {
        // Only what came while this end's device was still down (the other's first IPv6 packets) is lost.
        let down = c["drops_by_reason"]["device_down"].as_u64().unwrap();
        assert_eq!(c["drops"].as_u64().unwrap(), down, "{c}");
        assert!(down < 10, "{c}");
        let to = &c["to_network"];
        // Segmented sends: far fewer system calls than datagrams.
        assert!(to["writes"].as_u64().unwrap() * 4 < to["packets"].as_u64().unwrap(), "{c}");
    }
}

#[test]
fn tunnel_refuses_what_cannot_work() {
    let out = Command::new(TURBOTUN)
        .args(["tunnel", "ttbad0", "--local", "10.0.0.1:5000", "--remote", "[fd00::1]:5000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("different address families"), "{out:?}");
    let out = Command::new(TURBOTUN)
        .args(["tunnel", "bad name", "--local", "10.0.0.1:5000", "--remote", "10.0.0.2:5000"])
        .output()
        .unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("invalid interface name"),
        "{out:?}"
    );
}
