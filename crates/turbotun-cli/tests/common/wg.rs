//! What the tests of `turbotun wg` share: the endpoints (`turbotun wg`, wireguard-go, boringtun, GotaTun) in
//! namespaces, `wg` through the configuration socket, keys, an underlay of namespaces over a bridge, and checks
//! across a tunnel.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;

use super::{new_netns, ns_path};

pub const TURBOTUN: &str = env!("CARGO_BIN_EXE_turbotun");
pub const TURBOTUN_WG: &str = env!("CARGO_BIN_EXE_turbotun-wg");

/// The wireguard-go program the bench uses, built from the Go module proxy on first use.
pub fn wireguard_go() -> PathBuf {
    peer_program("wireguard-go", "wireguard-go", "Go and the module proxy")
}

/// boringtun-cli, Cloudflare's WireGuard, the program the bench uses, built from the crate registry on first use.
pub fn boringtun() -> PathBuf {
    peer_program("boringtun", "boringtun-cli", "cargo and the crate registry")
}

/// GotaTun, Mullvad's WireGuard (a fork of boringtun), the program the bench uses, built from the crate registry
/// on first use.
pub fn gotatun() -> PathBuf {
    peer_program("gotatun", "gotatun", "cargo and the crate registry")
}

/// `bench/peers/bin/BIN`, made by `bench/peers/build.sh TARGET` once per test process: the script builds the
/// version it pins when the binary is missing or of another version, and returns at once otherwise. A failed
/// build fails the test, never skips it (`needs` names what the build takes).
fn peer_program(target: &str, bin: &str, needs: &str) -> PathBuf {
    // Tests run in parallel: one build at a time, and each target once.
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/peers");
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|t| t == target) {
        let status = Command::new(root.join("build.sh")).arg(target).status().expect("bench/peers/build.sh");
        assert!(status.success(), "building {target} failed (it needs {needs})");
        built.push(target.to_string());
    }
    root.join("bin").join(bin)
}

/// A name unique to this process and call (≤ 15 bytes): the configuration socket's path is not per namespace.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}{}x{}", std::process::id() % 100_000, NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn socket_of(name: &str) -> PathBuf {
    PathBuf::from(format!("/var/run/wireguard/{name}.sock"))
}

/// Which program an endpoint runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Impl {
    Turbotun,
    WireguardGo,
    Boringtun,
    /// GotaTun 0.10.2. Unlike the others it leaves its configuration socket behind when stopped (docs/RELIABILITY.md).
    Gotatun,
}

/// One endpoint: its program in the foreground inside a namespace; killed, reaped and its socket removed on
/// drop.
pub struct Endpoint {
    pub name: String,
    pub child: Option<Child>,
    /// Where turbotun's counters socket is (its name carries the namespace).
    stats_socket: PathBuf,
}

impl Endpoint {
    pub fn start(ns: &OwnedFd, which: Impl, name: &str) -> Endpoint {
        Self::start_with(ns, which, name, &[])
    }

    /// [`Self::start`] with more options for `turbotun wg`.
    pub fn start_with(ns: &OwnedFd, which: Impl, name: &str, options: &[&str]) -> Endpoint {
        let mut command = match which {
            Impl::Turbotun => {
                let mut c = Command::new(TURBOTUN);
                c.args(["wg", "-f", "--json"]).args(options).arg(name);
                c
            }
            Impl::WireguardGo => {
                let mut c = Command::new(wireguard_go());
                c.args(["-f", name]).env("WG_PROCESS_FOREGROUND", "1");
                c
            }
            Impl::Boringtun => {
                let mut c = Command::new(boringtun());
                // As root: keep root. Its clap parser takes `true` here, not `1`.
                c.args(["-f", "--disable-drop-privileges", name]).env("WG_SUDO", "true");
                c
            }
            Impl::Gotatun => {
                let mut c = Command::new(gotatun());
                // As root: keep root (no sudo user to drop to), as the bench runs it.
                c.args(["-f", "--disable-drop-privileges", name]).env("WG_SUDO", "1");
                c
            }
        };
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = with_netns(&ns_path(ns), || command.spawn()).unwrap().expect("starting the endpoint");
        let endpoint = Endpoint::of(ns, name, child);
        wait_for(|| UnixStream::connect(socket_of(name)).is_ok(), "the configuration socket");
        endpoint
    }

    /// The endpoint `name` that `child`, started in `ns`, runs.
    pub fn of(ns: &OwnedFd, name: &str, child: Child) -> Endpoint {
        let stats_socket = with_netns(&ns_path(ns), || turbotun::stats_socket::socket_path(name)).unwrap();
        Endpoint { name: name.to_string(), child: Some(child), stats_socket }
    }

    /// Stops it with SIGTERM and returns what it printed on standard output (turbotun: the counters line);
    /// asserts that it exited 0 and removed its socket (which GotaTun does not).
    pub fn stop(mut self) -> String {
        let mut child = self.child.take().unwrap();
        nix_kill(child.id(), "TERM");
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        let status = child.wait().unwrap();
        assert!(status.success(), "{} ended with {status}", self.name);
        assert!(!socket_of(&self.name).exists(), "{} removed its socket", self.name);
        out
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(socket_of(&self.name));
        // Its counters socket too: a killed endpoint cannot remove it (the next start would replace it).
        let _ = std::fs::remove_file(&self.stats_socket);
    }
}

pub fn nix_kill(pid: u32, signal: &str) {
    let _ = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status();
}

pub fn wait_for(mut ready: impl FnMut() -> bool, what: &str) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < Duration::from_secs(10), "waited 10 s for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `wg ARGS` in `ns`; its output, failing the test on a non-zero status.
pub fn wg(ns: &OwnedFd, args: &[&str]) -> String {
    let out = wg_status(ns, args);
    assert!(out.status.success(), "wg {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `wg` with the arguments of one command line (words separated by spaces; no word here has one).
pub fn wg_line(ns: &OwnedFd, line: &str) -> String {
    wg(ns, &line.split(' ').collect::<Vec<_>>())
}

pub fn wg_status(ns: &OwnedFd, args: &[&str]) -> Output {
    with_netns(&ns_path(ns), || Command::new("wg").args(args).output()).unwrap().expect("wg (apt: wireguard-tools)")
}

/// A key pair from `wg genkey`/`wg pubkey`, the private key in a file of its own (mode 0600).
pub struct Keys {
    pub private_file: PathBuf,
    pub private: String,
    pub public: String,
}

pub fn keys(dir: &Path, name: &str) -> Keys {
    let private =
        String::from_utf8(Command::new("wg").arg("genkey").output().unwrap().stdout).unwrap().trim().to_string();
    let mut pubkey = Command::new("wg").arg("pubkey").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    pubkey.stdin.take().unwrap().write_all(private.as_bytes()).unwrap();
    let public = String::from_utf8(pubkey.wait_with_output().unwrap().stdout).unwrap().trim().to_string();
    let private_file = dir.join(name);
    std::fs::write(&private_file, &private).unwrap();
    Keys { private_file, private, public }
}

/// A private temporary directory for key files and configurations, removed on drop.
pub fn private_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("turbotun-wg-test").tempdir().unwrap()
}

/// One underlay network, 10.201.0.0/24, over a bridge in a hub namespace `nss[0]` (which has 10.201.0.1 on it):
/// side `i` (namespace `nss[i]`, i ≥ 1) has 10.201.0.(10 + i) on its end of a veth pair to the bridge, named
/// `names[i]`.
pub struct Underlay {
    pub nss: Vec<OwnedFd>,
    pub names: Vec<String>,
}

pub fn underlay(count: usize) -> Underlay {
    let nss: Vec<OwnedFd> = (0..=count).map(|_| new_netns()).collect();
    let mut hub = Netlink::in_netns(&ns_path(&nss[0])).unwrap();
    hub.set_up("lo", true).unwrap();
    let bridge = unique("ub");
    hub.create_bridge(&bridge).unwrap();
    hub.add_address(&bridge, "10.201.0.1".parse().unwrap(), 24).unwrap();
    hub.set_up(&bridge, true).unwrap();
    let mut names = vec![bridge.clone()];
    for (i, ns) in nss.iter().enumerate().skip(1) {
        let (near, far) = (unique("uh"), unique("uf"));
        hub.create_veth(&near, &far).unwrap();
        hub.move_to_netns(&far, &ns_path(ns)).unwrap();
        hub.set_master(&near, Some(&bridge)).unwrap();
        hub.set_up(&near, true).unwrap();
        let mut nl = Netlink::in_netns(&ns_path(ns)).unwrap();
        nl.add_address(&far, format!("10.201.0.{}", 10 + i).parse().unwrap(), 24).unwrap();
        nl.set_up(&far, true).unwrap();
        nl.set_up("lo", true).unwrap();
        names.push(far);
    }
    Underlay { nss, names }
}

/// Gives the tunnel device `name` in `ns` the address `addr`/24, MTU 1420, up.
pub fn bring_up(ns: &OwnedFd, name: &str, addr: &str) {
    let mut nl = Netlink::in_netns(&ns_path(ns)).unwrap();
    nl.add_address(name, addr.parse().unwrap(), 24).unwrap();
    nl.set_mtu(name, 1420).unwrap();
    nl.set_up(name, true).unwrap();
}

/// Pings `dst` from `ns` (up to `count` tries, one second each); whether one came back.
pub fn ping(ns: &OwnedFd, dst: &str) -> bool {
    with_netns(&ns_path(ns), || Command::new("ping").args(["-c", "1", "-W", "1", dst]).output())
        .unwrap()
        .is_ok_and(|o| o.status.success())
}

pub fn ping_within(ns: &OwnedFd, dst: &str, tries: usize) -> bool {
    (0..tries).any(|_| ping(ns, dst))
}

/// `len` bytes of TCP from `from` to `to_addr` in `to`, compared byte for byte.
pub fn tcp_intact(from: &OwnedFd, to: &OwnedFd, to_addr: &str, len: usize) {
    super::tcp_between(from, to, to_addr, 7100, len);
}

/// Two endpoints, `a` in `nss[1]` at 10.202.0.1 and `b` in `nss[2]` at 10.202.0.2, each the other's peer.
pub struct Pair {
    pub nss: Vec<OwnedFd>,
    pub a: Endpoint,
    pub b: Endpoint,
    pub dir: tempfile::TempDir,
}

pub fn pair(a: Impl, b: Impl) -> Pair {
    pair_with(a, &[], b, &[])
}

/// [`pair`], with more options for each side that runs `turbotun wg` (`--queues 2`).
pub fn pair_with(a: Impl, a_options: &[&str], b: Impl, b_options: &[&str]) -> Pair {
    let nss = underlay(2).nss;
    let dir = private_dir();
    let (ka, kb) = (keys(dir.path(), "a.key"), keys(dir.path(), "b.key"));
    let (na, nb) = (unique("wga"), unique("wgb"));
    let ea = Endpoint::start_with(&nss[1], a, &na, a_options);
    let eb = Endpoint::start_with(&nss[2], b, &nb, b_options);
    let ka_file = ka.private_file.to_str().unwrap().to_string();
    let kb_file = kb.private_file.to_str().unwrap().to_string();
    let line = format!(
        "set {na} private-key {ka_file} listen-port 51820 \
            peer {} endpoint 10.201.0.12:51821 allowed-ips 10.202.0.2/32",
        kb.public
    );
    wg_line(&nss[1], &line);
    let line = format!(
        "set {nb} private-key {kb_file} listen-port 51821 \
            peer {} endpoint 10.201.0.11:51820 allowed-ips 10.202.0.1/32",
        ka.public
    );
    wg_line(&nss[2], &line);
    bring_up(&nss[1], &na, "10.202.0.1");
    bring_up(&nss[2], &nb, "10.202.0.2");
    Pair { nss, a: ea, b: eb, dir }
}

/// turbotun's own counters: no drop but `no_peer`, the kernel's own IPv6 multicast (router solicitations, MLD) to
/// addresses no peer's AllowedIPs cover, which WireGuard drops too. (Whether packets crossed end to end is counted
/// at the ends: see the datagrams in the tests.)
pub fn nothing_lost_but_unroutable(c: &serde_json::Value) {
    let no_peer = c["drops_by_reason"]["no_peer"].as_u64().unwrap();
    assert_eq!(c["drops"].as_u64().unwrap(), no_peer, "{c}");
    assert!(no_peer < 20, "{c}");
}

/// The counters line `turbotun wg` printed when stopped.
pub fn counters(out: &str) -> serde_json::Value {
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no counters in {out:?}"));
    serde_json::from_str(line).unwrap()
}

/// Sends `request` (e.g. `set=1\nlisten_port=1\n`, without the empty line that ends it) to the configuration
/// socket of `name` and returns the first line of the answer (`errno=N`).
pub fn uapi_first_line(name: &str, request: &str) -> String {
    let mut s = UnixStream::connect(socket_of(name)).unwrap();
    s.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut reply = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut reply).unwrap();
    reply.trim().to_string()
}
