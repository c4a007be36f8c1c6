//! turbotun-wg embedded in another program, each way its examples embed it, with wireguard-go at the other end:
//! an endpoint on a TUN fd handed over by a privileged opener to a process that then drops to `nobody`, one on
//! a UDP socket the host made and configured through typed calls while traffic flows (a peer added, roaming
//! learned, the peer removed), and the no-I/O protocol driven by tokio. Each test builds its own namespaces and
//! removes everything it made however it ends. `cargo test` builds the examples before it runs this.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::wg::*;
use common::{ns_path, privileged, tcp_between_while};
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;

/// `target/<profile>/examples/NAME`, next to the directory of this test binary.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let path = exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("examples").join(name);
    assert!(path.exists(), "{} was not built (`cargo test --workspace` builds the examples)", path.display());
    path
}

/// An example running in a namespace: its standard output read line by line on a thread of its own; killed
/// and reaped however the test ends.
struct Program {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Lines read while waiting for another.
    seen: Vec<String>,
}

impl Program {
    fn start(ns: &OwnedFd, name: &str, args: &[&str]) -> Program {
        let mut command = Command::new(example(name));
        command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = with_netns(&ns_path(ns), || command.spawn()).unwrap().expect("starting the example");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut program = Program { child, stdin, lines, seen: Vec::new() };
        program.expect(|l| l == "ready", "ready");
        program
    }

    /// The first line (seen before or coming within 15 s) that `wanted` accepts; fails the test otherwise.
    fn expect(&mut self, wanted: impl Fn(&str) -> bool, what: &str) -> String {
        if let Some(i) = self.seen.iter().position(|l| wanted(l)) {
            return self.seen.remove(i);
        }
        loop {
            match self.lines.recv_timeout(Duration::from_secs(15)) {
                Ok(line) if wanted(&line) => return line,
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no line {what:?} in 15 s; it printed {:?}", self.seen),
            }
        }
    }

    /// Sends a command line and returns the answer (the next line that is not an event).
    fn command(&mut self, line: &str) -> String {
        writeln!(self.stdin.as_mut().unwrap(), "{line}").unwrap();
        self.expect(|l| !l.starts_with("event "), &format!("the answer to {line:?}"))
    }

    /// Stops it with SIGTERM; its last line (`stopped ...`).
    fn stop(mut self) -> String {
        nix_kill(self.child.id(), "TERM");
        let last = self.expect(|l| l.starts_with("stopped"), "stopped");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the example ended with {status}");
        last
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// wireguard-go as `name` in `ns`, at 10.201.0.(10 + side):`port` with tunnel address `addr`, its one peer
/// `peer_public` at `peer_endpoint` (none: learned from the peer's first message) holding `allowed`.
fn wireguard_go_side(
    ns: &OwnedFd,
    name: &str,
    keys: &Keys,
    port: u16,
    addr: &str,
    peer: (&str, Option<&str>, &str),
) -> Endpoint {
    let side = Endpoint::start(ns, Impl::WireguardGo, name);
    let key_file = keys.private_file.to_str().unwrap();
    let (public, endpoint, allowed) = peer;
    let mut line = format!("set {name} private-key {key_file} listen-port {port} peer {public} allowed-ips {allowed}");
    if let Some(endpoint) = endpoint {
        line.push_str(&format!(" endpoint {endpoint}"));
    }
    wg_line(ns, &line);
    bring_up(ns, name, addr);
    side
}

/// A TUN device `name` in `ns`, as the daemon opens one (virtio header, every offload), with `addr`/24, up.
fn tun_in(ns: &OwnedFd, name: &str, addr: &str) -> turbotun::Device {
    let device = with_netns(&ns_path(ns), || {
        turbotun::DeviceBuilder::tun()
            .name(name)
            .vnet_hdr(turbotun::wire::VIRTIO_NET_HDR_LEN)
            .offloads(turbotun::Offloads::ALL)
            .open()
    })
    .unwrap()
    .unwrap();
    bring_up(ns, name, addr);
    device
}

/// The embedding's side A (keys `ka`, device name `na`) and wireguard-go as B in `nss[2]` at 10.202.0.2 (port
/// 51821), A its peer with 10.202.0.1/32 and no endpoint (B learns it), over an underlay of `sides` namespaces.
struct Rig {
    nss: Vec<OwnedFd>,
    dir: tempfile::TempDir,
    ka: Keys,
    kb: Keys,
    na: String,
    _b: Endpoint,
}

fn rig(sides: usize) -> Rig {
    let nss = underlay(sides).nss;
    let dir = private_dir();
    let (ka, kb) = (keys(dir.path(), "a.key"), keys(dir.path(), "b.key"));
    let (na, nb) = (unique("wea"), unique("web"));
    let b = wireguard_go_side(&nss[2], &nb, &kb, 51821, "10.202.0.2", (&ka.public, None, "10.202.0.1/32"));
    Rig { nss, dir, ka, kb, na, _b: b }
}

#[test]
fn an_endpoint_on_a_tun_fd_handed_to_an_unprivileged_process_talks_to_wireguard_go() {
    if !privileged("an_endpoint_on_a_tun_fd_handed_to_an_unprivileged_process_talks_to_wireguard_go") {
        return;
    }
    let Rig { nss, dir, ka, kb, na, _b } = rig(2);
    let socket = dir.path().join("handover.sock");
    let socket_text = socket.to_str().unwrap().to_string();
    let key_file = ka.private_file.to_str().unwrap();
    let args = [&socket_text, "nobody", key_file, "51820", &kb.public, "10.201.0.12:51821", "10.202.0.2/32"];
    let mut jailed = Program::start(&nss[1], "jailed_endpoint", &args);
    // The privileged opener: this test creates the device in the namespace and hands its queue over.
    let device = tun_in(&nss[1], &na, "10.202.0.1");
    let stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    turbotun::handover::send_queues_and_wait(&stream, &[&device.queues()[0]], Duration::from_secs(10)).unwrap();
    assert_eq!(jailed.expect(|l| l.starts_with("uid: "), "uid"), "uid: 65534");
    assert_eq!(jailed.expect(|l| l.starts_with("up "), "up"), "up 51820");
    assert!(ping_within(&nss[1], "10.202.0.2", 10), "a ping across the tunnel");
    jailed.expect(|l| l == format!("event handshake {}", kb.public), "the handshake event");
    tcp_intact(&nss[1], &nss[2], "10.202.0.2", 1 << 20);
    tcp_intact(&nss[2], &nss[1], "10.202.0.1", 1 << 20);
    assert!(jailed.stop().starts_with("stopped (Stopped)"));
    drop(device);
}

#[test]
fn an_endpoint_on_a_host_socket_is_configured_while_traffic_flows() {
    if !privileged("an_endpoint_on_a_host_socket_is_configured_while_traffic_flows") {
        return;
    }
    let Rig { nss, dir, ka, kb, na, _b } = rig(3);
    let (kc, nc) = (keys(dir.path(), "c.key"), unique("wec"));
    // C knows where A is; A is told C's key but not where it is: it learns that from C's first message.
    let _c = wireguard_go_side(
        &nss[3],
        &nc,
        &kc,
        51822,
        "10.202.0.3",
        (&ka.public, Some("10.201.0.11:51820"), "10.202.0.1/32"),
    );
    let key_file = ka.private_file.to_str().unwrap();
    let mut a = Program::start(&nss[1], "host_socket", &[&na, "10.202.0.1/24", key_file, "10.201.0.11:51820", "119"]);

    // No peer yet: nothing gets through.
    assert!(!ping(&nss[1], "10.202.0.2"));
    assert_eq!(a.command(&format!("add {} 10.201.0.12:51821 10.202.0.2/32", kb.public)), "ok");
    assert!(ping_within(&nss[1], "10.202.0.2", 10), "a ping to the peer just added");
    a.expect(|l| l == format!("event handshake {}", kb.public), "B's handshake event");

    // While a TCP stream to B flows: C is added, reached, and removed again.
    tcp_between_while(&nss[1], &nss[2], "10.202.0.2", 7101, 32 << 20, || {
        assert_eq!(a.command(&format!("add {} - 10.202.0.3/32", kc.public)), "ok");
        assert!(ping_within(&nss[3], "10.202.0.1", 10), "C reaches A once A knows its key");
        let roamed = a.expect(|l| l.starts_with(&format!("event endpoint {}", kc.public)), "C's endpoint event");
        assert!(roamed.ends_with(" 10.201.0.13:51822"), "{roamed}");
        let status = a.command(&format!("peer {}", kc.public));
        assert!(status.starts_with("endpoint=10.201.0.13:51822 handshake=yes rx="), "{status}");
        assert_eq!(a.command(&format!("remove {}", kc.public)), "ok");
        assert!(!ping(&nss[3], "10.202.0.1"), "C is gone");
        assert!(a.command(&format!("peer {}", kc.public)).starts_with("error: no such peer"));
    });
    let status = a.command(&format!("peer {}", kb.public));
    let tx: u64 = status.split("tx=").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!(tx > 32 << 20, "the 32 MiB to B counted: {status}");
    // The host's socket is fixed: a new port is refused, whole.
    let refused = a.command("port 9999");
    assert!(refused.starts_with("error: ") && refused.contains("listen_port=9999"), "{refused}");
    assert!(ping_within(&nss[1], "10.202.0.2", 3), "still up after the refusal");
    assert!(a.stop().starts_with("stopped (Stopped;"));
}

#[test]
fn the_no_io_protocol_driven_by_tokio_talks_to_wireguard_go() {
    if !privileged("the_no_io_protocol_driven_by_tokio_talks_to_wireguard_go") {
        return;
    }
    let Rig { nss, dir: _dir, ka, kb, na, _b } = rig(2);
    let key_file = ka.private_file.to_str().unwrap();
    let args = [&na, "10.202.0.1/24", key_file, "51820", &kb.public, "10.201.0.12:51821", "10.202.0.2/32"];
    let mut a = Program::start(&nss[1], "no_io_tokio", &args);
    assert!(ping_within(&nss[1], "10.202.0.2", 10), "a ping across the tunnel");
    a.expect(|l| l == format!("event handshake {}", kb.public), "the handshake event");
    tcp_intact(&nss[1], &nss[2], "10.202.0.2", 4 << 20);
    tcp_intact(&nss[2], &nss[1], "10.202.0.1", 4 << 20);
    let stopped = a.stop();
    let sealed: u64 = stopped.split("stopped: ").nth(1).and_then(|s| s.split(' ').next()).unwrap().parse().unwrap();
    assert!(sealed > 1000, "{stopped}");
    // The device went with the program.
    let mut nl = Netlink::in_netns(&ns_path(&nss[1])).unwrap();
    assert!(nl.link_index(&na).is_err(), "{na} removed");
}
