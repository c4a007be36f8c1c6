//! `turbotun echo` as a process in a private network namespace: ping and ping -6 through a TUN device, arping
//! and ping through a TAP device, UDP datagrams (and a UDP GSO send in offload mode) coming back byte for byte.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{ns_path, privileged};
use turbotun::netns::{with_netns, with_private_netns};

/// The ring length every echo here is started with (`--txqueuelen`), checked by one test.
const ECHO_TXQUEUELEN: &str = "2345";

/// `turbotun echo` running in a namespace of its own; killed and reaped on drop.
struct Echo {
    ns: OwnedFd,
    dev: String,
    child: Option<Child>,
    stdout: Option<BufReader<ChildStdout>>,
}

impl Drop for Echo {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Echo {
    /// Starts `turbotun echo` on a new device with 10.9.0.1/24 and fd00:9::1/64.
    fn start(mode: &str, tap: bool) -> Echo {
        static N: AtomicU32 = AtomicU32::new(0);
        let dev = format!("ttecho{}", N.fetch_add(1, Ordering::Relaxed));
        let ns = with_private_netns(|| std::fs::File::open("/proc/thread-self/ns/net").expect("own netns").into())
            .expect("private netns");
        let mut args = vec!["echo", &dev, "--json", "--mode", mode, "--addr", "10.9.0.1/24", "--addr", "fd00:9::1/64"];
        args.extend(["--txqueuelen", ECHO_TXQUEUELEN]);
        if tap {
            args.push("--tap");
        }
        let mut child = with_netns(&ns_path(&ns), || {
            Command::new(env!("CARGO_BIN_EXE_turbotun"))
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn turbotun echo")
        })
        .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "turbotun echo announces readiness");
        let echo = Echo { ns, dev, child: Some(child), stdout: Some(stdout) };
        // IPv6 duplicate address detection must finish before fd00:9::1 can be a source.
        let deadline = Instant::now() + Duration::from_secs(10);
        while echo.run(|| UdpSocket::bind(("fd00:9::1", 0)).is_err()) {
            assert!(Instant::now() < deadline, "fd00:9::1 never became usable");
            std::thread::sleep(Duration::from_millis(100));
        }
        echo
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        with_netns(&ns_path(&self.ns), f).unwrap()
    }

    /// Runs a command in the namespace; it must succeed.
    fn command(&self, program: &str, args: &[&str]) {
        let out = self
            .run(|| Command::new(program).args(args).output())
            .unwrap_or_else(|e| panic!("{program} could not run ({e}): scripts/install-deps.sh installs it"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// SIGTERM, then the counters line; the process must exit 0.
    fn stop(mut self) -> serde_json::Value {
        let mut child = self.child.take().unwrap();
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let mut rest = String::new();
        self.stdout.take().unwrap().read_to_string(&mut rest).unwrap();
        let exit = child.wait().unwrap();
        assert!(exit.success(), "turbotun echo exits 0 after SIGTERM: {exit:?}");
        serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("counters JSON {rest:?}: {e}"))
    }
}

fn count(line: &serde_json::Value, path: &[&str]) -> u64 {
    path.iter().fold(line, |v, k| &v[*k]).as_u64().unwrap_or_else(|| panic!("{path:?} in {line}"))
}

/// Datagrams to `peer` come back from it byte for byte; with `gso`, 20 segments sent at once come back as 20.
fn udp_answered(local: &str, peer: &str, gso: bool) {
    let sock = UdpSocket::bind((local, 0)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let target: SocketAddr = (peer.parse::<IpAddr>().unwrap(), 9).into();
    let mut buf = vec![0u8; 65536];
    // Up to the MTU: fragments are not answered.
    for size in [0usize, 1, 100, 1200, 1400] {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
        sock.send_to(&payload, target).unwrap();
        let (n, from) = sock.recv_from(&mut buf).unwrap_or_else(|e| panic!("answer to {size} bytes from {peer}: {e}"));
        assert_eq!(from, target);
        assert!(buf[..n] == payload[..], "{size}-byte answer from {peer} differs");
    }
    if gso {
        turbotun::udp::set_udp_segment(&sock, 1000).unwrap();
        let burst: Vec<u8> = (0..20_000).map(|i| (i / 1000) as u8 ^ (i as u8)).collect();
        sock.send_to(&burst, target).unwrap();
        for k in 0..20 {
            let (n, from) = sock.recv_from(&mut buf).unwrap_or_else(|e| panic!("segment {k} from {peer}: {e}"));
            assert_eq!(from, target);
            assert!(buf[..n] == burst[k * 1000..(k + 1) * 1000], "segment {k} from {peer} differs");
        }
    }
}

#[test]
fn echo_tun_answers_ping_and_ping6() {
    if !privileged("echo_tun_answers_ping_and_ping6") {
        return;
    }
    let echo = Echo::start("offload", false);
    echo.command("ping", &["-c", "3", "-i", "0.2", "-W", "2", "10.9.0.2"]);
    echo.command("ping", &["-6", "-c", "3", "-i", "0.2", "-W", "2", "fd00:9::2"]);
    let line = echo.stop();
    assert!(count(&line, &["answered", "icmp"]) >= 3, "{line}");
    assert!(count(&line, &["answered", "icmp6"]) >= 3, "{line}");
    assert_eq!(count(&line, &["drops"]), 0, "{line}");
}

#[test]
fn echo_tap_answers_arping_and_ping() {
    if !privileged("echo_tap_answers_arping_and_ping") {
        return;
    }
    for mode in ["plain", "offload"] {
        let echo = Echo::start(mode, true);
        let dev = echo.dev.clone();
        echo.command("arping", &["-c", "3", "-i", &dev, "10.9.0.3"]);
        echo.command("ping", &["-c", "3", "-i", "0.2", "-W", "2", "10.9.0.2"]);
        echo.command("ping", &["-6", "-c", "3", "-i", "0.2", "-W", "2", "fd00:9::2"]);
        let line = echo.stop();
        assert!(count(&line, &["answered", "arp"]) >= 3, "{mode}: {line}");
        assert!(count(&line, &["answered", "nd"]) >= 1, "{mode}: {line}");
        assert!(count(&line, &["answered", "icmp"]) >= 3, "{mode}: {line}");
        assert!(count(&line, &["answered", "icmp6"]) >= 3, "{mode}: {line}");
        assert_eq!(count(&line, &["drops"]), 0, "{mode}: {line}");
    }
}

#[test]
fn echo_sends_udp_back_unchanged() {
    if !privileged("echo_sends_udp_back_unchanged") {
        return;
    }
    for mode in ["plain", "offload"] {
        let echo = Echo::start(mode, false);
        let link = echo.run(|| turbotun::netlink::Netlink::new().unwrap().link(&echo.dev).unwrap());
        assert_eq!(link.txqueuelen.to_string(), ECHO_TXQUEUELEN, "--txqueuelen");
        let gso = mode == "offload";
        echo.run(|| udp_answered("10.9.0.1", "10.9.0.2", gso));
        echo.run(|| udp_answered("fd00:9::1", "fd00:9::2", false));
        // TCP is never answered: a connect gets no answer and times out, and the SYNs are counted.
        let tcp = echo
            .run(|| std::net::TcpStream::connect_timeout(&"10.9.0.2:80".parse().unwrap(), Duration::from_millis(300)));
        assert!(tcp.is_err());
        let line = echo.stop();
        assert!(count(&line, &["answered", "udp"]) >= 10, "{mode}: {line}");
        assert!(count(&line, &["ignored", "tcp"]) >= 1, "{mode}: {line}");
        assert_eq!(count(&line, &["drops"]), 0, "{mode}: {line}");
        if gso {
            // The 20 segments crossed the device twice as one super-packet, answered whole.
            assert_eq!(count(&line, &["answered", "udp_super_packets"]), 1, "{line}");
            assert!(count(&line, &["super_packets"]) >= 1, "{line}");
        }
    }
}

#[test]
fn echo_tap_sends_udp_back_unchanged_with_gso() {
    if !privileged("echo_tap_sends_udp_back_unchanged_with_gso") {
        return;
    }
    let echo = Echo::start("offload", true);
    echo.run(|| udp_answered("10.9.0.1", "10.9.0.2", true));
    echo.run(|| udp_answered("fd00:9::1", "fd00:9::2", true));
    let line = echo.stop();
    assert_eq!(count(&line, &["answered", "udp_super_packets"]), 2, "{line}");
    assert_eq!(count(&line, &["drops"]), 0, "{line}");
}
