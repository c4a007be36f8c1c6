//! The topology of one run (two private namespaces, or one for loopback), the forwarder process, and their
//! teardown; for the tunnel bench (`tunnel/`), the underlay between the namespaces and the tunnel over it:
//! devices, endpoint processes and their WireGuard configuration.
//!
//! Everything created here is owned by a value whose `Drop` removes it: child processes are stopped, and
//! closing a namespace's fd lets the kernel destroy it with the devices inside. Names (`tt<pid>r<run>a`) are
//! labels for messages and device names, unique per bench process so that logs of concurrent benches do not
//! mix; the namespaces themselves have no name anywhere.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::modes::{Endpoint, Kind, Link, Mode};
use super::netcfg::{self, Netns};
use super::process::{run_tool, send_sigterm, sleep_checked, terminate};

pub(crate) const ADDR_A4: &str = "10.0.1.1";
pub(crate) const ADDR_B4: &str = "10.0.2.1";
pub(crate) const ADDR_A6: &str = "fd00:1::1";
pub(crate) const ADDR_B6: &str = "fd00:2::1";
/// Where the echo bench sends: an address of A's prefix that is not A's own, so routed into the echo's device.
pub(crate) const ECHO_PEER4: &str = "10.0.1.2";
pub(crate) const ECHO_PEER6: &str = "fd00:1::2";
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The underlay's addresses: A's, B's.
pub(crate) const UNDERLAY: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 201, 0, 1), Ipv4Addr::new(10, 201, 0, 2)];
/// The tunnel devices' addresses: A's, B's.
pub(crate) const INNER: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 202, 0, 1), Ipv4Addr::new(10, 202, 0, 2)];
pub(crate) const PREFIX_LEN: u8 = 24;
pub(crate) const UNDERLAY_MTU: u32 = 1500;
pub(crate) const TUNNEL_MTU: u32 = 1420;
/// The UDP port of every endpoint (each in its own namespace) and WireGuard's listen port.
pub(crate) const PORT: u16 = 51820;
const VXLAN_VNI: u32 = 42;
/// How long a tunnel may take, once configured, to carry a first packet both ways.
const REACH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `wg set` may take.
const WG_TIMEOUT: Duration = Duration::from_secs(10);
/// How long adding a `-crowd` kind's peers may take.
const CROWD_TIMEOUT: Duration = Duration::from_secs(300);

/// A started forwarder process (or any process the bench starts under a contract like it: an echo, a tunnel's
/// endpoint).
#[derive(Debug)]
pub(crate) struct Forwarder {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr_log: PathBuf,
    pub pid: u32,
    /// What it is, for messages and records.
    pub label: String,
}

/// How a started process tells that it is ready.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ready<'a> {
    /// It prints `ready` on a line of stdout (the forwarder contract, docs/CONTRACTS.md).
    Line,
    /// Its configuration socket, a Unix stream socket at this path, accepts connections (WireGuard's
    /// cross-platform userspace interface).
    Socket(&'a Path),
}

/// A process to start: `PROGRAM ARGV..` with `env` added to the bench's environment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch<'a> {
    pub label: &'a str,
    pub program: &'a Path,
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    pub ready: Ready<'a>,
}

/// What a forwarder printed when it stopped.
#[derive(Debug, Default)]
pub(crate) struct FwdExit {
    pub counters: Option<serde_json::Value>,
    pub status: Option<String>,
    pub stderr_tail: String,
}

/// A forwarder that exited or stayed silent instead of printing `ready`: the mode is broken, not the run, so
/// the bench skips its later runs (found in an error chain with `downcast_ref`).
#[derive(Debug)]
pub(crate) struct NotReady(pub String);

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotReady {}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return "(nothing on stderr)".into();
    }
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

impl Forwarder {
    /// Start `PROGRAM [prefix] DEV_A DEV_B [args]` inside `ns` and wait for its `ready` line.
    pub(crate) fn start(
        mode: &Mode,
        ns: &Netns,
        dev_a: &str,
        dev_b: &str,
        log_dir: &Path,
        stop: &AtomicBool,
    ) -> Result<Forwarder> {
        let (Kind::Forwarder { program, prefix_args, args } | Kind::BridgedForwarder { program, prefix_args, args }) =
            &mode.kind
        else {
            bail!("{} is not a forwarder", mode.label);
        };
        let argv: Vec<String> = prefix_args
            .iter()
            .cloned()
            .chain([dev_a.to_string(), dev_b.to_string()])
            .chain(args.iter().cloned())
            .collect();
        let log = log_dir.join(format!("{}-{dev_a}.stderr", mode.label));
        Forwarder::spawn(&mode.label, program, &argv, ns, log, stop)
    }

    /// Start `PROGRAM ARGV..` inside `ns`, stderr to `stderr_log`, and wait for its `ready` line: any process
    /// under the forwarder contract (docs/CONTRACTS.md), which `turbotun echo` and the bench's naive echo
    /// follow too.
    pub(crate) fn spawn(
        label: &str,
        program: &Path,
        argv: &[String],
        ns: &Netns,
        stderr_log: PathBuf,
        stop: &AtomicBool,
    ) -> Result<Forwarder> {
        Forwarder::launch(&Launch { label, program, argv, env: &[], ready: Ready::Line }, ns, stderr_log, stop)
    }

    /// Start a process inside `ns`, stderr to `stderr_log`, and wait until it is ready the way `l.ready` says;
    /// its stdout lines are kept for the counters line it may print when stopped.
    pub(crate) fn launch(l: &Launch<'_>, ns: &Netns, stderr_log: PathBuf, stop: &AtomicBool) -> Result<Forwarder> {
        let label = l.label;
        let errf = std::fs::File::create(&stderr_log).context("create forwarder log")?;
        let mut cmd = Command::new(l.program);
        cmd.args(l.argv).envs(l.env.iter().map(|(k, v)| (k, v)));
        let mut child = ns.spawn(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(errf))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let pid = child.id();
        let mut fwd = Forwarder { child, lines, stderr_log, pid, label: label.to_string() };
        if let Ready::Socket(path) = l.ready {
            fwd.wait_for_socket(path, stop)?;
            return Ok(fwd);
        }
        let end = Instant::now() + READY_TIMEOUT;
        loop {
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            match fwd.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(l) if l.trim() == "ready" => return Ok(fwd),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) | Err(mpsc::RecvTimeoutError::Timeout)
                    if matches!(fwd.child.try_wait(), Ok(Some(_))) =>
                {
                    let st = fwd.child.wait().ok();
                    return Err(NotReady(format!(
                        "{label} exited before `ready` ({}): {}",
                        st.map(|s| s.to_string()).unwrap_or_default(),
                        tail(&fwd.stderr_log, 3)
                    ))
                    .into());
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(20)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() >= end {
                return Err(NotReady(format!(
                    "{label} did not print `ready` within {}s: {}",
                    READY_TIMEOUT.as_secs(),
                    tail(&fwd.stderr_log, 3)
                ))
                .into());
            }
        }
    }

    /// Wait until the Unix socket at `path` accepts a connection (the process serves it), as long as the process
    /// runs and at most [`READY_TIMEOUT`].
    fn wait_for_socket(&mut self, path: &Path, stop: &AtomicBool) -> Result<()> {
        let end = Instant::now() + READY_TIMEOUT;
        loop {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Ok(());
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                return Err(NotReady(format!(
                    "{} exited before serving {} ({st}): {}",
                    self.label,
                    path.display(),
                    tail(&self.stderr_log, 3)
                ))
                .into());
            }
            if Instant::now() >= end {
                return Err(NotReady(format!(
                    "{} did not serve {} within {}s: {}",
                    self.label,
                    path.display(),
                    READY_TIMEOUT.as_secs(),
                    tail(&self.stderr_log, 3)
                ))
                .into());
            }
            sleep_checked(Duration::from_millis(20), stop)?;
        }
    }

    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, wait up to 3 s, collect its counters line.
    pub(crate) fn stop(mut self) -> FwdExit {
        let status = terminate(&mut self.child, Duration::from_secs(3));
        let mut counters = None;
        // The reader thread ends at EOF; give it a moment to drain.
        let end = Instant::now() + Duration::from_millis(500);
        while let Ok(l) = self.lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(l.trim()) {
                if v.is_object() {
                    counters = Some(v);
                }
            }
        }
        FwdExit { counters, status: status.map(|s| s.to_string()), stderr_tail: tail(&self.stderr_log, 3) }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
    }
}

/// One run's namespaces and devices. Dropping it stops the forwarder and closes the namespaces, which the kernel
/// then destroys with their devices.
#[derive(Debug)]
pub(crate) struct Topology {
    /// The client's namespace (the server's too for loopback).
    pub ns_a: Netns,
    /// The server's namespace; `None` for loopback.
    ns_b: Option<Netns>,
    /// The run's devices whose TX drops are reported: the first in A, the second (if any) in the server's
    /// namespace.
    pub(super) devices: Vec<String>,
    pub server_addr: String,
    pub forwarder: Option<Forwarder>,
    /// A tunnel's endpoint processes (`--tunnel`): A's, then B's.
    pub endpoints: Vec<Forwarder>,
    /// Files the run's processes create and may leave behind (a WireGuard endpoint's configuration socket, which
    /// lives outside any namespace): removed once the processes are stopped.
    pub(super) leftovers: Vec<PathBuf>,
    /// The namespace of the bridge(s), for the modes that have one.
    bridge_ns: Option<Netns>,
    /// Where a `-flood` kind's handshake flood goes, and where from.
    pub flood: Option<FloodTarget>,
}

/// The target and the sources of a run's handshake flood: B's WireGuard endpoint, from addresses on A's underlay.
#[derive(Debug, Clone)]
pub(crate) struct FloodTarget {
    pub dest: SocketAddr,
    /// B's public key, as `wg` shows it.
    pub server_key: String,
    pub sources: Vec<IpAddr>,
}

/// The addresses a flood from `n` sources comes from: A's own underlay address for one, else 10.201.0.100 on
/// (at most 150, all in A's underlay prefix).
pub(crate) fn flood_sources(n: usize) -> Result<Vec<IpAddr>> {
    match n {
        0 => bail!("a flood needs at least one source address"),
        1 => Ok(vec![UNDERLAY[0].into()]),
        2..=150 => Ok((0..n).map(|i| IpAddr::V4(Ipv4Addr::new(10, 201, 0, 100 + i as u8))).collect()),
        _ => bail!("a flood from {n} addresses: at most 150 fit the underlay's prefix"),
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // The processes first: their devices go with them, before the namespaces are closed. All endpoints are
        // told at once, then each is waited for.
        self.forwarder.take();
        for e in &self.endpoints {
            send_sigterm(e.pid);
        }
        self.endpoints.clear();
        for f in self.leftovers.drain(..) {
            match std::fs::remove_file(&f) {
                Ok(()) => tracing::debug!("removed {} left by a stopped endpoint", f.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => eprintln!("turbotun bench: cannot remove {}: {e}", f.display()),
            }
        }
    }
}

/// Sysctls of a run's namespaces, as (key, value).
fn sysctls(ipv6: bool) -> Vec<(&'static str, &'static str)> {
    let mut v = vec![("net.ipv4.conf.all.rp_filter", "0"), ("net.ipv4.conf.default.rp_filter", "0")];
    if ipv6 {
        v.extend([
            ("net.ipv6.conf.all.disable_ipv6", "0"),
            ("net.ipv6.conf.default.disable_ipv6", "0"),
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
            ("net.ipv6.conf.all.accept_ra", "0"),
            ("net.ipv6.conf.default.accept_ra", "0"),
            ("net.ipv6.conf.all.router_solicitations", "0"),
            ("net.ipv6.conf.default.router_solicitations", "0"),
        ]);
    } else {
        // No IPv6 autoconfiguration chatter (RS, MLD, DAD) across the forwarder.
        v.extend([("net.ipv6.conf.all.disable_ipv6", "1"), ("net.ipv6.conf.default.disable_ipv6", "1")]);
    }
    v
}

/// The namespace of a bridge: no IPv6 of its own (the bridge carries IPv6 frames without it), so that its ports
/// send no autoconfiguration chatter.
fn bridge_netns(name: String) -> Result<Netns> {
    let ns = Netns::new(name)?;
    ns.set_sysctls(&[("net.ipv6.conf.all.disable_ipv6", "1"), ("net.ipv6.conf.default.disable_ipv6", "1")])?;
    Ok(ns)
}

/// A namespace for one end of the path: loopback up, the sysctls set.
fn end_netns(name: String, ipv6: bool) -> Result<Netns> {
    let ns = Netns::new(name)?;
    ns.set_sysctls(&sysctls(ipv6))?;
    Ok(ns)
}

/// Where a run's topology is built: the names unique to the run (`{prefix}r{run}...`), the address family, the
/// directory of its processes' logs, and the flag that interrupts a wait. What every builder takes alike.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunSite<'a> {
    pub prefix: &'a str,
    pub run: u32,
    pub ipv6: bool,
    pub log_dir: &'a Path,
    pub stop: &'a AtomicBool,
}

impl Topology {
    /// Namespaces with nothing in them yet.
    fn empty(ns_a: Netns, ns_b: Option<Netns>) -> Topology {
        Topology {
            ns_a,
            ns_b,
            devices: Vec::new(),
            server_addr: String::new(),
            forwarder: None,
            endpoints: Vec::new(),
            leftovers: Vec::new(),
            bridge_ns: None,
            flood: None,
        }
    }

    /// Build the topology of `mode` for run number `run` of this bench process, starting the forwarder if
    /// the mode has one; `txqueuelen` sets both devices' queue length (for a TUN device the length of the ring
    /// the kernel fills and the forwarder drains), else they keep the kernel's default.
    pub(crate) fn build(mode: &Mode, site: RunSite<'_>, txqueuelen: Option<u32>) -> Result<Topology> {
        let RunSite { prefix, run, ipv6, log_dir, stop } = site;
        let base = format!("{prefix}r{run}");
        let ns_a = end_netns(format!("{base}a"), ipv6)?;
        if mode.kind == Kind::Loopback {
            let server_addr = if ipv6 { "::1" } else { "127.0.0.1" }.into();
            let mut t = Topology::empty(ns_a, None);
            t.server_addr = server_addr;
            return Ok(t);
        }
        let ns_b = end_netns(format!("{base}b"), ipv6)?;
        if let Kind::Tunnel(link) = &mode.kind {
            let mut t = Topology::empty(ns_a, Some(ns_b));
            set_up_tunnel(&mut t, link, &base, log_dir, stop)?;
            return Ok(t);
        }
        // Device names: at most 15 bytes ("tt" + pid (<= 7) + "r" + run + "x").
        let dev_a = format!("{base}x");
        let dev_b = format!("{base}y");
        anyhow::ensure!(dev_a.len() <= 15, "device name {dev_a} longer than 15 bytes");
        let mut t = Topology::empty(ns_a, Some(ns_b));
        match &mode.kind {
            Kind::Veth => netcfg::create_veth(&t.ns_a, &dev_a, t.server(), &dev_b)?,
            Kind::VethBridge => {
                // A's veth and B's veth, their other ends ports of one bridge in a namespace of its own.
                let ns_br = bridge_netns(format!("{base}f"))?;
                netcfg::create_veth(&t.ns_a, &dev_a, &ns_br, &format!("{base}p"))?;
                netcfg::create_veth(t.server(), &dev_b, &ns_br, &format!("{base}q"))?;
                netcfg::bridge(&ns_br, &format!("{base}g"), &[&format!("{base}p"), &format!("{base}q")])?;
                t.bridge_ns = Some(ns_br);
            }
            Kind::BridgedForwarder { .. } => {
                // The forwarder's TAP devices stay in its namespace, each a port of a bridge there whose other
                // port is a veth to A or B: A -> bridge g -> TAP -> forwarder -> TAP -> bridge h -> B.
                let ns_fwd = bridge_netns(format!("{base}f"))?;
                t.forwarder = Some(Forwarder::start(mode, &ns_fwd, &dev_a, &dev_b, log_dir, stop)?);
                let (port_a, port_b) = (format!("{base}p"), format!("{base}q"));
                netcfg::create_veth(&t.ns_a, &dev_a, &ns_fwd, &port_a)?;
                netcfg::create_veth(t.server(), &dev_b, &ns_fwd, &port_b)?;
                netcfg::bridge(&ns_fwd, &format!("{base}g"), &[&dev_a, &port_a])?;
                netcfg::bridge(&ns_fwd, &format!("{base}h"), &[&dev_b, &port_b])?;
                t.bridge_ns = Some(ns_fwd);
            }
            Kind::Forwarder { .. } => {
                // The forwarder creates its devices in a namespace of its own, so that they never show in the
                // root namespace; the process keeps that namespace alive after its fd is closed here.
                let ns_fwd = Netns::new(format!("{base}f"))?;
                t.forwarder = Some(Forwarder::start(mode, &ns_fwd, &dev_a, &dev_b, log_dir, stop)?);
                netcfg::move_to_netns(&ns_fwd, &dev_a, &t.ns_a)?;
                netcfg::move_to_netns(&ns_fwd, &dev_b, t.server())?;
            }
            Kind::Loopback | Kind::Tunnel(_) => unreachable!("handled above"),
        }
        t.configure_ends(&dev_a, &dev_b, ipv6, txqueuelen)?;
        t.devices = vec![dev_a, dev_b];
        t.server_addr = if ipv6 { ADDR_B6 } else { ADDR_B4 }.into();
        if let Some(f) = t.forwarder.as_mut() {
            if !f.is_running() {
                bail!("{} exited during set-up", mode.label);
            }
        }
        Ok(t)
    }

    /// A: 10.0.1.1/24 on `dev_a`, with a route to B's subnet through it; B the mirror image (and the IPv6 pair).
    fn configure_ends(&self, dev_a: &str, dev_b: &str, ipv6: bool, txqueuelen: Option<u32>) -> Result<()> {
        let (a4, b4): (IpAddr, IpAddr) = (ADDR_A4.parse()?, ADDR_B4.parse()?);
        let (a6, b6): (IpAddr, IpAddr) = (ADDR_A6.parse()?, ADDR_B6.parse()?);
        let mut side_a = netcfg::Side {
            ns: &self.ns_a,
            dev: dev_a,
            mtu: netcfg::MTU,
            addrs: vec![(a4, 24)],
            routes: vec![(b4, 24)],
            txqueuelen,
        };
        let mut side_b = netcfg::Side {
            ns: self.server(),
            dev: dev_b,
            mtu: netcfg::MTU,
            addrs: vec![(b4, 24)],
            routes: vec![(a4, 24)],
            txqueuelen,
        };
        if ipv6 {
            side_a.addrs.push((a6, 64));
            side_a.routes.push((b6, 64));
            side_b.addrs.push((b6, 64));
            side_b.routes.push((a6, 64));
        }
        netcfg::configure(&side_a)?;
        netcfg::configure(&side_b)
    }

    /// One namespace with an echo responder's device in it: `PROGRAM ARGV..` is started inside the namespace
    /// with `{dev}` in `argv` replaced by the device name, creates the device and prints `ready`; then the device
    /// gets A's address (10.0.1.1/24 or fd00:1::1/64), so that every other address of the prefix is routed
    /// into it. `server_addr` is one of those (10.0.1.2, fd00:1::2): where the load goes to be answered.
    pub(crate) fn build_echo(label: &str, program: &Path, argv: &[&str], site: RunSite<'_>) -> Result<Topology> {
        let RunSite { prefix, run, ipv6, log_dir, stop } = site;
        let base = format!("{prefix}r{run}");
        let ns_a = end_netns(format!("{base}a"), ipv6)?;
        let dev = format!("{base}e");
        anyhow::ensure!(dev.len() <= 15, "device name {dev} longer than 15 bytes");
        let argv: Vec<String> = argv.iter().map(|a| if *a == "{dev}" { dev.clone() } else { a.to_string() }).collect();
        let log = log_dir.join(format!("{label}-{dev}.stderr"));
        // Created inside A, so that the device never shows in the root namespace and needs no move.
        let echo = Forwarder::spawn(label, program, &argv, &ns_a, log, stop)?;
        let mut t = Topology::empty(ns_a, None);
        t.devices = vec![dev.clone()];
        t.forwarder = Some(echo);
        let (addr, peer, len): (IpAddr, &str, u8) =
            if ipv6 { (ADDR_A6.parse()?, ECHO_PEER6, 64) } else { (ADDR_A4.parse()?, ECHO_PEER4, 24) };
        netcfg::configure(&netcfg::Side {
            ns: &t.ns_a,
            dev: &dev,
            mtu: netcfg::MTU,
            addrs: vec![(addr, len)],
            routes: vec![],
            txqueuelen: None,
        })?;
        t.server_addr = peer.into();
        if t.forwarder.as_mut().is_some_and(|f| !f.is_running()) {
            bail!("{label} exited during set-up");
        }
        Ok(t)
    }

    /// Wait until the server's address answers from A: a TCP connection to a port nobody listens on (9, discard)
    /// is refused by the server's kernel, which proves the path both ways (ARP, a tunnel's handshake) without
    /// touching the server process.
    pub(crate) fn wait_reachable(&self, timeout: Duration, stop: &AtomicBool) -> Result<()> {
        let target = SocketAddr::new(self.server_addr.parse().context("server address")?, 9);
        let end = Instant::now() + timeout;
        loop {
            let attempt = self.ns_a.run(|| TcpStream::connect_timeout(&target, Duration::from_millis(300)))?;
            let last = match attempt {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= end {
                bail!("{target} not reachable from {} within {}s: {last}", self.ns_a.name, timeout.as_secs());
            }
            sleep_checked(Duration::from_millis(50), stop)?;
        }
    }

    /// The server's namespace: B, or A itself for loopback.
    pub(crate) fn server(&self) -> &Netns {
        self.ns_b.as_ref().unwrap_or(&self.ns_a)
    }

    /// Sum of the TX dropped counters of the run's devices (tun: the ring tail drop); None without devices.
    pub(crate) fn tx_dropped(&self) -> Option<u64> {
        if self.devices.is_empty() {
            return None;
        }
        let mut sum = 0;
        for (dev, ns) in self.devices.iter().zip([&self.ns_a, self.server()]) {
            sum += netcfg::tx_dropped(ns, dev).ok()?;
        }
        Some(sum)
    }

    /// UDP receive-buffer errors in the server namespace.
    pub(crate) fn rcvbuf_errors(&self, ipv6: bool) -> Option<u64> {
        if ipv6 {
            super::procfs::parse_snmp6(&self.server().read_proc_net("snmp6").ok()?, "Udp6RcvbufErrors")
        } else {
            super::procfs::parse_snmp(&self.server().read_proc_net("snmp").ok()?, "Udp", "RcvbufErrors")
        }
    }

    /// Wait until a socket is bound to `port` in the server namespace: a listening TCP socket, or a bound UDP
    /// one.
    pub(crate) fn wait_bound(
        &self,
        port: u16,
        udp: bool,
        ipv6: bool,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<()> {
        let file = match (udp, ipv6) {
            (false, false) => "tcp",
            (false, true) => "tcp6",
            (true, false) => "udp",
            (true, true) => "udp6",
        };
        // TCP_LISTEN is 0A; an unconnected UDP socket shows TCP_CLOSE (07).
        let state = if udp { "07" } else { "0A" };
        let end = Instant::now() + timeout;
        loop {
            let text = self.server().read_proc_net(file).unwrap_or_default();
            if proc_net_has_port(&text, port, state) {
                return Ok(());
            }
            if Instant::now() >= end {
                return Err(anyhow!(
                    "no server bound to port {port} in {} within {}s",
                    self.server().name,
                    timeout.as_secs()
                ));
            }
            sleep_checked(Duration::from_millis(50), stop)?;
        }
    }
}

/// Does a `/proc/net/{tcp,udp}[6]` table hold a socket on local `port` in `state`?
fn proc_net_has_port(text: &str, port: u16, state: &str) -> bool {
    let suffix = format!(":{port:04X}");
    text.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&suffix) && f[3] == state
    })
}

/// The namespace of side `i`: A (the client's) or B (the server's).
fn side_ns(t: &Topology, i: usize) -> &Netns {
    if i == 0 {
        &t.ns_a
    } else {
        t.server()
    }
}

fn side<'a>(ns: &'a Netns, dev: &'a str, mtu: u32, addr: Ipv4Addr) -> netcfg::Side<'a> {
    netcfg::Side { ns, dev, mtu, addrs: vec![(addr.into(), PREFIX_LEN)], routes: vec![], txqueuelen: None }
}

/// Set up `link` between the topology's two namespaces: the underlay, then the tunnel (devices, endpoint
/// processes, WireGuard configuration, addresses), then a first packet both ways. Everything started is owned
/// by `t`, so an error tears it down.
fn set_up_tunnel(t: &mut Topology, link: &Link, base: &str, log_dir: &Path, stop: &AtomicBool) -> Result<()> {
    let under = [format!("{base}ua"), format!("{base}ub")];
    let tun = [format!("{base}ta"), format!("{base}tb")];
    if let Some(long) = under.iter().chain(&tun).find(|n| n.len() > 15) {
        bail!("device name {long} longer than 15 bytes");
    }
    netcfg::create_veth(&t.ns_a, &under[0], t.server(), &under[1])?;
    for i in 0..2 {
        netcfg::configure(&side(side_ns(t, i), &under[i], UNDERLAY_MTU, UNDERLAY[i]))?;
    }
    let devices = match link {
        Link::Veth => under,
        Link::Vxlan => {
            for i in 0..2 {
                let (local, remote) = (UNDERLAY[i].into(), UNDERLAY[1 - i].into());
                netcfg::create_vxlan(side_ns(t, i), &tun[i], VXLAN_VNI, local, remote, &under[i])?;
            }
            tun
        }
        Link::Pair(ends, flood) => {
            for (i, e) in ends.iter().enumerate() {
                start_endpoint(t, e, i, &tun[i], log_dir, stop)?;
            }
            if let Some(flood) = flood {
                let Some(wg) = &ends[1].wg else { bail!("a flood needs a WireGuard endpoint in B") };
                let sources = flood_sources(flood.sources)?;
                let mut nl = t.ns_a.netlink()?;
                for a in sources.iter().filter(|a| **a != IpAddr::from(UNDERLAY[0])) {
                    nl.add_address(&under[0], *a, PREFIX_LEN).with_context(|| format!("{a} on {}", under[0]))?;
                }
                let dest = SocketAddr::new(UNDERLAY[1].into(), PORT);
                t.flood = Some(FloodTarget { dest, server_key: wg.keys[1].public.clone(), sources });
            }
            tun
        }
    };
    let addrs = if *link == Link::Veth {
        UNDERLAY
    } else {
        for i in 0..2 {
            netcfg::configure(&side(side_ns(t, i), &devices[i], TUNNEL_MTU, INNER[i]))?;
        }
        INNER
    };
    t.devices = devices.to_vec();
    t.server_addr = addrs[1].to_string();
    t.wait_reachable(REACH_TIMEOUT, stop)?;
    for e in &mut t.endpoints {
        if !e.is_running() {
            bail!("{} exited during set-up", e.label);
        }
    }
    Ok(())
}

/// Start endpoint `e` on side `i` with device `dev` and wait until it is ready; configure a WireGuard endpoint
/// with `wg set`. The process, and the socket it may leave, belong to `t` from the start.
fn start_endpoint(
    t: &mut Topology,
    e: &Endpoint,
    i: usize,
    dev: &str,
    log_dir: &Path,
    stop: &AtomicBool,
) -> Result<()> {
    let local = format!("{}:{PORT}", UNDERLAY[i]);
    let remote = format!("{}:{PORT}", UNDERLAY[1 - i]);
    let argv: Vec<String> = e
        .argv
        .iter()
        .map(|a| match *a {
            "{dev}" => dev.to_string(),
            "{local}" => local.clone(),
            "{remote}" => remote.clone(),
            other => other.to_string(),
        })
        .collect();
    // WireGuard's userspace interface: every implementation serves the same path, not per namespace.
    let socket = turbotun_wg::uapi::socket_path(dev);
    let ready = if e.wg.is_some() {
        clear_stale_socket(&socket)?;
        t.leftovers.push(socket.clone());
        Ready::Socket(&socket)
    } else {
        Ready::Line
    };
    let log = log_dir.join(format!("{}-{dev}.stderr", e.name.replace(' ', "-")));
    let launch = Launch { label: e.name, program: &e.program, argv: &argv, env: &e.env, ready };
    let process = Forwarder::launch(&launch, side_ns(t, i), log, stop)?;
    t.endpoints.push(process);
    if let Some(wg) = &e.wg {
        let (key, peer) = (&wg.keys[i], &wg.keys[1 - i]);
        let tool = wg.tool.to_string_lossy();
        let private = key.private.to_string_lossy();
        let (port, allowed) = (PORT.to_string(), format!("{}/32", INNER[1 - i]));
        let cmd = [
            &*tool,
            "set",
            dev,
            "private-key",
            &*private,
            "listen-port",
            &port,
            "peer",
            &peer.public,
            "endpoint",
            &remote,
            "allowed-ips",
            &allowed,
        ];
        run_tool(side_ns(t, i), &cmd, WG_TIMEOUT, stop).with_context(|| format!("configure {} {dev}", e.name))?;
        if e.crowd > 0 {
            // The crowd's prefixes (100.64.0.0/10, fd00:c0::/64) cover neither end's inner address.
            let prefixes = crate::peerconf::PeerPrefixes {
                v4: std::net::Ipv4Addr::new(100, 64, 0, 0),
                v6: std::net::Ipv6Addr::new(0xfd00, 0xc0, 0, 0, 0, 0, 0, 0),
            };
            let file = log_dir.join(format!("{dev}-crowd.conf"));
            crate::peerconf::write_peers(&file, None, 0..e.crowd, prefixes, &crate::peerconf::random_public, true)?;
            let cmd = [&*tool, "addconf", dev, &*file.to_string_lossy()];
            run_tool(side_ns(t, i), &cmd, CROWD_TIMEOUT, stop)
                .with_context(|| format!("add {} peers to {} {dev}", e.crowd, e.name))?;
            let _ = std::fs::remove_file(&file);
        }
    }
    Ok(())
}

/// A socket at `path` that nobody serves is stale (a process of an earlier run killed hard): removed, by the
/// library's one rule for such paths. One that is served belongs to a live device of that name: an error, never
/// touched.
pub(crate) fn clear_stale_socket(path: &Path) -> Result<()> {
    turbotun::local_socket::clear_stale_socket(path, "remove it")
        .with_context(|| format!("making way for {}: a WireGuard device of that name may exist", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tables() {
        let tcp =
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
                   0: 0102000A:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n";
        assert!(proc_net_has_port(tcp, 5201, "0A"));
        assert!(!proc_net_has_port(tcp, 5202, "0A"));
        assert!(!proc_net_has_port(tcp, 5201, "07"));
        let udp6 = "  sl  local_address                         remote_address                        st\n  \
                    1: 000000000000000000000000000000FD:1452 00000000000000000000000000000000:0000 07 0\n";
        assert!(proc_net_has_port(udp6, 5202, "07"));
    }

    #[test]
    fn sysctl_sets() {
        assert!(sysctls(false).contains(&("net.ipv6.conf.default.disable_ipv6", "1")));
        assert!(sysctls(true).contains(&("net.ipv6.conf.default.accept_dad", "0")));
        assert!(sysctls(true).iter().all(|(k, v)| !(k.ends_with("disable_ipv6") && *v == "1")));
    }
}
