//! `turbotun tunnel` as a process: two namespaces joined by a veth pair, a plain tunnel between them (one end
//! with two queues and dropped to nobody), TCP both ways byte for byte, the counters on SIGTERM; and options
//! that cannot work refused before anything is made.

mod common;

use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};

use common::{new_netns, ns_path, privileged, tcp_between, Running};
use turbotun::netlink::Netlink;

const TURBOTUN: &str = env!("CARGO_BIN_EXE_turbotun");

fn start(ns: &OwnedFd, args: &[&str]) -> Running {
    common::start_ready(ns, Command::new(TURBOTUN).args(["tunnel", "--json"]).args(args).stderr(Stdio::inherit()))
}

/// The counters line of a stopped `turbotun tunnel`.
fn stop(running: Running) -> serde_json::Value {
    serde_json::from_str(running.stop().lines().last().unwrap()).unwrap()
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
    tcp_between(&a, &b, "10.202.0.2", 7200, 32 << 20);
    tcp_between(&b, &a, "10.202.0.1", 7200, 32 << 20);
    let (ca, cb) = (stop(end_a), stop(end_b));
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
