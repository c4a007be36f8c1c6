//! `turbotun bench --tunnel`: VPN-style tunnels between two network namespaces, measured with iperf3.
//!
//! Each run gets two fresh namespaces joined by a veth pair, the underlay (10.201.0.1/24 <-> 10.201.0.2/24, MTU
//! 1500). Over it each tunnel kind puts a device in each namespace (10.202.0.1/24 <-> 10.202.0.2/24, MTU 1420):
//! the kernel's VXLAN, or a userspace endpoint process in each namespace (`turbotun tunnel`, `turbotun wg`,
//! wireguard-go, boringtun, GotaTun). `veth` runs iperf3 over the underlay itself. The iperf3 server runs in B, the
//! client in A, and the runs, their interleaving, the samples and the summaries are those of the forwarder bench
//! (`mod.rs::measure`, `runner.rs`, `report.rs::summarize`); the set-up of each run is `topo.rs`'s, like every
//! topology's; this file adds the kinds, and the tables of per-endpoint CPU, peak RSS and system calls per GB.
//!
//! WireGuard endpoints follow WireGuard's cross-platform userspace interface: each serves
//! `/var/run/wireguard/NAME.sock`, which is not per namespace, so every endpoint's device name is unique to the
//! run (`tt<pid>r<run>ta`, `...tb`); the bench waits until the socket accepts connections, configures it with
//! the real `wg set` (keys from `wg genkey` in a private directory), and removes any socket left behind.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::chart;
use super::iperf::{self, Traffic};
use super::modes::{self, Endpoint, Flood, Kind, Link, Mode, Unavailable, WgKey, WgSetup};
use super::perfstat;
use super::report::{self, spread_of, ReportHeader, RunRecord, Summary};
use super::runner::Ctx;
use super::stats::{cell, fmt_count, med, med_count, ratio, Spread};
use super::topo::{clear_stale_socket, INNER, PREFIX_LEN, TUNNEL_MTU, UNDERLAY, UNDERLAY_MTU};
use super::{Options, Plan};

/// The traffic through each tunnel. The UDP datagrams are 1400-byte IP datagrams (1372 bytes of payload), so
/// that each is one packet at the tunnel's MTU of 1420: a 1400-byte payload would be fragmented in two.
pub const TUNNEL_TRAFFIC: &[Traffic] = &[
    iperf::TCP_ONE_STREAM,
    iperf::TCP_FOUR_STREAMS,
    Traffic {
        label: "udp1372",
        description: "UDP, 1400-byte IP datagrams (1372-byte payload, one packet at MTU 1420), unlimited rate (-b 0)",
        udp: true,
        streams: 1,
        payload: 1372,
        gso: 0,
        rate: 0,
    },
];

/// The traffic of `--tunnel --quick`.
pub const QUICK_TRAFFIC: &[&str] = &["tcp", "udp1372"];

/// A program at one end of a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Program {
    /// `turbotun tunnel NAME --local ADDR:PORT --remote ADDR:PORT`: says `ready`.
    TurbotunTunnel,
    /// `turbotun wg -f NAME`: serves its configuration socket.
    TurbotunWg,
    /// `turbotun tunnel --queues 2`: a two-queue device, one worker pair and one socket per queue.
    TurbotunTunnelTwoQueues,
    /// `turbotun wg --queues 2`.
    TurbotunWgTwoQueues,
    /// `turbotun tunnel` of the build given by `--baseline` (the A/B of a change).
    BaselineTunnel,
    /// `turbotun wg` of the build given by `--baseline`.
    BaselineWg,
    /// wireguard-go, built into bench/peers/bin by build.sh.
    WireguardGo,
    /// boringtun-cli, built into bench/peers/bin by build.sh.
    Boringtun,
    /// GotaTun (Mullvad's fork of boringtun), built into bench/peers/bin by build.sh.
    Gotatun,
}

impl Program {
    fn name(self) -> &'static str {
        match self {
            Program::TurbotunTunnel => "turbotun tunnel",
            Program::TurbotunWg => "turbotun wg",
            Program::TurbotunTunnelTwoQueues => "turbotun tunnel --queues 2",
            Program::TurbotunWgTwoQueues => "turbotun wg --queues 2",
            Program::BaselineTunnel => "turbotun tunnel (baseline)",
            Program::BaselineWg => "turbotun wg (baseline)",
            Program::WireguardGo => "wireguard-go",
            Program::Boringtun => "boringtun",
            Program::Gotatun => "gotatun",
        }
    }

    /// Configured with `wg` through its configuration socket.
    fn is_wg(self) -> bool {
        !matches!(self, Program::TurbotunTunnel | Program::TurbotunTunnelTwoQueues | Program::BaselineTunnel)
    }

    /// The peers the bench builds: build.sh's target and the binary under bench/peers/bin.
    fn peer(self) -> Option<(&'static str, &'static str)> {
        match self {
            Program::WireguardGo => Some(("wireguard-go", "wireguard-go")),
            Program::Boringtun => Some(("boringtun", "boringtun-cli")),
            Program::Gotatun => Some(("gotatun", "gotatun")),
            _ => None,
        }
    }

    /// Arguments (`{dev}`, `{local}`, `{remote}` stand for the device and the underlay's socket addresses) and
    /// the environment it runs with.
    fn argv_env(self) -> (&'static [&'static str], &'static [(&'static str, &'static str)]) {
        match self {
            Program::TurbotunTunnel => {
                (&["tunnel", "{dev}", "--local", "{local}", "--remote", "{remote}", "--json"], &[])
            }
            Program::TurbotunWg => (&["wg", "-f", "--json", "{dev}"], &[]),
            Program::TurbotunTunnelTwoQueues => {
                (&["tunnel", "{dev}", "--local", "{local}", "--remote", "{remote}", "--queues", "2", "--json"], &[])
            }
            Program::TurbotunWgTwoQueues => (&["wg", "-f", "--json", "--queues", "2", "{dev}"], &[]),
            // A build from before the readable output printed JSON without being asked.
            Program::BaselineTunnel => (&["tunnel", "{dev}", "--local", "{local}", "--remote", "{remote}"], &[]),
            Program::BaselineWg => (&["wg", "-f", "{dev}"], &[]),
            Program::WireguardGo => (&["-f", "{dev}"], &[("WG_PROCESS_FOREGROUND", "1")]),
            // WG_SUDO takes `true` (clap's boolean parser refuses `1`): keep root, do not drop to the sudo user.
            Program::Boringtun => (&["-f", "--disable-drop-privileges", "{dev}"], &[("WG_SUDO", "true")]),
            // The same command line as boringtun's, whose fork it is (its clap takes `1` as well as `true`).
            Program::Gotatun => (&["-f", "--disable-drop-privileges", "{dev}"], &[("WG_SUDO", "1")]),
        }
    }
}

/// How a kind joins the two namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spec {
    Veth,
    Vxlan,
    /// An endpoint process in A and one in B.
    Pair(Program, Program),
}

/// A tunnel kind: one row of each table.
#[derive(Debug, Clone, Copy)]
pub struct KindSpec {
    pub label: &'static str,
    /// The chart's colour family.
    family: &'static str,
    pub description: &'static str,
    spec: Spec,
    /// B's endpoint flooded with handshake initiations during the window (the `-flood` kinds).
    flood: Option<Flood>,
}

impl KindSpec {
    /// No process: the kernel carries it.
    pub fn is_kernel(&self) -> bool {
        matches!(self.spec, Spec::Veth | Spec::Vxlan)
    }

    fn programs(&self) -> Vec<Program> {
        match self.spec {
            Spec::Pair(a, b) if a == b => vec![a],
            Spec::Pair(a, b) => vec![a, b],
            _ => vec![],
        }
    }
}

/// Every kind, in report order.
pub const KINDS: &[KindSpec] = &[
    KindSpec {
        label: "veth",
        family: "baseline",
        description: "iperf3 over the underlay itself",
        spec: Spec::Veth,
        flood: None,
    },
    KindSpec {
        label: "vxlan",
        family: "baseline",
        description: "the kernel's VXLAN over the underlay (VNI 42, UDP 4789)",
        spec: Spec::Vxlan,
        flood: None,
    },
    KindSpec {
        label: "turbotun-plain",
        family: "turbotun",
        description: "`turbotun tunnel` at both ends (packets in UDP, not encrypted)",
        spec: Spec::Pair(Program::TurbotunTunnel, Program::TurbotunTunnel),
        flood: None,
    },
    KindSpec {
        label: "turbotun-wg",
        family: "turbotun",
        description: "`turbotun wg` at both ends (WireGuard)",
        spec: Spec::Pair(Program::TurbotunWg, Program::TurbotunWg),
        flood: None,
    },
    KindSpec {
        label: "turbotun-plain-q2",
        family: "turbotun",
        description: "`turbotun tunnel --queues 2` at both ends (only when named)",
        spec: Spec::Pair(Program::TurbotunTunnelTwoQueues, Program::TurbotunTunnelTwoQueues),
        flood: None,
    },
    KindSpec {
        label: "turbotun-wg-q2",
        family: "turbotun",
        description: "`turbotun wg --queues 2` at both ends (only when named)",
        spec: Spec::Pair(Program::TurbotunWgTwoQueues, Program::TurbotunWgTwoQueues),
        flood: None,
    },
    KindSpec {
        label: "turbotun-plain@baseline",
        family: "turbotun",
        description: "`turbotun tunnel` of the --baseline build at both ends (A/B)",
        spec: Spec::Pair(Program::BaselineTunnel, Program::BaselineTunnel),
        flood: None,
    },
    KindSpec {
        label: "turbotun-wg@baseline",
        family: "turbotun",
        description: "`turbotun wg` of the --baseline build at both ends (A/B)",
        spec: Spec::Pair(Program::BaselineWg, Program::BaselineWg),
        flood: None,
    },
    KindSpec {
        label: "wireguard-go",
        family: "wggo",
        description: "wireguard-go at both ends",
        spec: Spec::Pair(Program::WireguardGo, Program::WireguardGo),
        flood: None,
    },
    KindSpec {
        label: "boringtun",
        family: "boringtun",
        description: "boringtun-cli at both ends",
        spec: Spec::Pair(Program::Boringtun, Program::Boringtun),
        flood: None,
    },
    KindSpec {
        label: "gotatun",
        family: "gotatun",
        description: "GotaTun (Mullvad's fork of boringtun) at both ends",
        spec: Spec::Pair(Program::Gotatun, Program::Gotatun),
        flood: None,
    },
    KindSpec {
        label: "turbotun-wg-vs-wireguard-go",
        family: "turbotun",
        description: "`turbotun wg` in A, wireguard-go in B (interoperation)",
        spec: Spec::Pair(Program::TurbotunWg, Program::WireguardGo),
        flood: None,
    },
    KindSpec {
        label: "turbotun-wg-flood1",
        family: "turbotun",
        description: "`turbotun wg` at both ends, B flooded with valid-mac1 handshake initiations from one address",
        spec: Spec::Pair(Program::TurbotunWg, Program::TurbotunWg),
        flood: Some(Flood { sources: 1 }),
    },
    KindSpec {
        label: "turbotun-wg-flood64",
        family: "turbotun",
        description: "`turbotun wg` at both ends, B flooded with valid-mac1 handshake initiations from 64 addresses",
        spec: Spec::Pair(Program::TurbotunWg, Program::TurbotunWg),
        flood: Some(Flood { sources: 64 }),
    },
    KindSpec {
        label: "wireguard-go-flood1",
        family: "wggo",
        description: "wireguard-go at both ends, B flooded with valid-mac1 handshake initiations from one address",
        spec: Spec::Pair(Program::WireguardGo, Program::WireguardGo),
        flood: Some(Flood { sources: 1 }),
    },
];

/// The kind every ratio is taken against.
pub const REFERENCE: &str = "wireguard-go";

/// The bench process that named a socket `tt<pid>r<run>t{a,b}.sock`, if the name is one of ours.
fn socket_owner(file_name: &str) -> Option<u32> {
    let dev = file_name.strip_suffix(".sock")?;
    let rest = dev.strip_prefix("tt")?;
    let (pid, run) = rest.split_once('r')?;
    let run = run.strip_suffix("ta").or_else(|| run.strip_suffix("tb"))?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (all_digits(pid) && all_digits(run)).then(|| pid.parse().ok())?
}

/// Sockets named by bench processes that are gone and served by nobody: removed (a bench killed by SIGKILL
/// leaves them).
fn sweep_stale_sockets() {
    let Ok(entries) = std::fs::read_dir(turbotun_wg::uapi::SOCKET_DIR) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = socket_owner(&name) else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if clear_stale_socket(&entry.path()).is_ok() {
            tracing::debug!("removed stale {name}");
        }
    }
}

/// Finds (and builds on first use) the programs of the selected kinds, and says why one is missing.
struct Resolver<'a> {
    exe: &'a Path,
    peers: Option<&'a Path>,
    log_dir: &'a Path,
    /// Whether to build missing peers (not for `--list`).
    build: bool,
    wg: Option<PathBuf>,
    /// The other build of turbotun that `@baseline` kinds run (`--baseline`).
    baseline: Option<PathBuf>,
    found: Vec<(Program, Result<PathBuf, String>)>,
    build_failed: bool,
}

impl Resolver<'_> {
    fn program(&mut self, p: Program) -> Result<PathBuf, String> {
        if let Some((_, r)) = self.found.iter().find(|(q, _)| *q == p) {
            return r.clone();
        }
        let r = self.find(p);
        self.found.push((p, r.clone()));
        r
    }

    fn find(&mut self, p: Program) -> Result<PathBuf, String> {
        if p.is_wg() && self.wg.is_none() {
            return Err(
                "`wg` not found: apt-get install wireguard-tools (it configures the WireGuard endpoints)".into()
            );
        }
        match p {
            // This very program: its `tunnel` and `wg` subcommands are always built in.
            Program::TurbotunTunnel
            | Program::TurbotunWg
            | Program::TurbotunTunnelTwoQueues
            | Program::TurbotunWgTwoQueues => Ok(self.exe.to_path_buf()),
            Program::BaselineTunnel | Program::BaselineWg => match &self.baseline {
                Some(path) if path.is_file() => Ok(path.clone()),
                Some(path) => Err(format!("--baseline {}: no such file", path.display())),
                None => Err("needs --baseline PATH (another build of turbotun)".into()),
            },
            Program::WireguardGo | Program::Boringtun | Program::Gotatun => {
                let (target, bin) = p.peer().expect("a peer");
                let Some(dir) = self.peers else {
                    return Err("bench/peers not found (set TURBOTUN_PEERS_DIR)".into());
                };
                let path = dir.join("bin").join(bin);
                if !self.build {
                    return Ok(path);
                }
                match modes::build_peer(dir, target, bin, self.log_dir) {
                    Ok(None) if path.is_file() => Ok(path),
                    Ok(None) => Err(format!("build.sh {target} made no {}", path.display())),
                    Ok(Some(note)) => {
                        self.build_failed = true;
                        if path.is_file() {
                            eprintln!("turbotun bench: {note}; using the existing {bin}");
                            Ok(path)
                        } else {
                            Err(note)
                        }
                    }
                    Err(e) => {
                        self.build_failed = true;
                        Err(format!("{e:#}"))
                    }
                }
            }
        }
    }

    /// Why `k` cannot run here, if it cannot.
    fn missing(&mut self, k: &KindSpec) -> Option<String> {
        let reasons: Vec<String> = k.programs().into_iter().filter_map(|p| self.program(p).err()).collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }
}

/// Whether a kind runs the `--baseline` build.
fn is_baseline(k: &KindSpec) -> bool {
    k.label.ends_with("@baseline")
}

/// Whether a kind runs only when `--tunnel-kinds` names it: the handshake floods and the two-queue endpoints.
fn only_when_named(k: &KindSpec) -> bool {
    k.flood.is_some() || k.label.ends_with("-q2")
}

/// The kind a `-flood` kind is compared with: the same endpoints without the flood.
fn unflooded(k: &KindSpec) -> Option<&'static KindSpec> {
    k.flood?;
    KINDS.iter().find(|b| b.flood.is_none() && b.spec == k.spec)
}

/// The kinds named by `--tunnel-kinds`, or all but the `-flood` kinds (and the `@baseline` kinds only with
/// `--baseline`), in report order.
fn select_kinds(filter: Option<&[String]>, baseline: bool) -> Result<Vec<&'static KindSpec>> {
    let Some(filter) = filter else {
        return Ok(KINDS.iter().filter(|k| !only_when_named(k) && (baseline || !is_baseline(k))).collect());
    };
    let mut out: Vec<&KindSpec> = Vec::new();
    for f in filter.iter().map(|f| f.trim()).filter(|f| !f.is_empty()) {
        let Some(k) = KINDS.iter().find(|k| k.label == f) else {
            bail!("unknown tunnel kind {f:?}; known: {}", KINDS.iter().map(|k| k.label).collect::<Vec<_>>().join(", "));
        };
        if !out.iter().any(|o| o.label == k.label) {
            out.push(k);
        }
    }
    if out.is_empty() {
        bail!("--tunnel-kinds selects nothing");
    }
    if baseline {
        // The A/B of each named kind that has one, as without --tunnel-kinds; a --baseline that would compare
        // nothing is refused rather than ignored.
        let twins: Vec<&KindSpec> = out
            .iter()
            .filter_map(|k| KINDS.iter().find(|t| t.label == format!("{}@baseline", k.label)))
            .filter(|t| !out.iter().any(|o| o.label == t.label))
            .collect();
        out.extend(twins);
        if !out.iter().any(|k| is_baseline(k)) {
            bail!("--baseline: none of the kinds named runs turbotun (name turbotun-plain or turbotun-wg)");
        }
    }
    out.sort_by_key(|k| KINDS.iter().position(|a| a.label == k.label));
    Ok(out)
}

fn select_traffic(args: &Options) -> Result<Vec<Traffic>> {
    let labels: Vec<String> = match (&args.traffic, args.quick) {
        (Some(t), _) => t.iter().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect(),
        (None, true) => QUICK_TRAFFIC.iter().map(|s| s.to_string()).collect(),
        (None, false) => TUNNEL_TRAFFIC.iter().map(|t| t.label.to_string()).collect(),
    };
    let mut out: Vec<Traffic> = Vec::new();
    for l in &labels {
        let Some(t) = TUNNEL_TRAFFIC.iter().find(|t| t.label == l) else {
            bail!(
                "traffic {l:?} is not one of --tunnel's: {}",
                TUNNEL_TRAFFIC.iter().map(|t| t.label).collect::<Vec<_>>().join(", ")
            );
        };
        if !out.contains(t) {
            out.push(*t);
        }
    }
    if out.is_empty() {
        bail!("--traffic selects nothing");
    }
    Ok(out)
}

/// A key pair made with `wg genkey` and `wg pubkey`, the private key written to `dir/NAME` with mode 0600.
fn make_key(tool: &Path, dir: &Path, name: &str) -> Result<WgKey> {
    let out = Command::new(tool).arg("genkey").stdin(Stdio::null()).output().context("run wg genkey")?;
    if !out.status.success() {
        bail!("wg genkey failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let private = dir.join(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&private)
        .and_then(|mut f| f.write_all(&out.stdout))
        .with_context(|| format!("write {}", private.display()))?;
    let mut child = Command::new(tool)
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("run wg pubkey")?;
    child.stdin.take().expect("piped stdin").write_all(&out.stdout).context("write to wg pubkey")?;
    let pubout = child.wait_with_output().context("wait for wg pubkey")?;
    let public = String::from_utf8_lossy(&pubout.stdout).trim().to_string();
    if !pubout.status.success() || public.is_empty() {
        bail!("wg pubkey failed ({}): {}", pubout.status, String::from_utf8_lossy(&pubout.stderr).trim());
    }
    Ok(WgKey { private, public })
}

/// The selected kinds that can run, as modes of the shared engine, and the ones that cannot, with why.
struct Resolved {
    modes: Vec<Mode>,
    skipped: Vec<Unavailable>,
    build_failed: bool,
    /// The private directory of the WireGuard keys, removed when dropped.
    _keys: Option<tempfile::TempDir>,
}

fn resolve(kinds: &[&KindSpec], r: &mut Resolver<'_>) -> Result<Resolved> {
    let mut runnable: Vec<&KindSpec> = Vec::new();
    let mut skipped = Vec::new();
    for k in kinds {
        match r.missing(k) {
            None => runnable.push(k),
            Some(reason) => skipped.push(Unavailable { mode: k.label.into(), reason }),
        }
    }
    let needs_wg = runnable.iter().any(|k| k.programs().iter().any(|p| p.is_wg()));
    let (wg, keys) = match (&r.wg, needs_wg && r.build) {
        (Some(tool), true) => {
            // A private directory (0700, random name) for the private keys, gone when the bench ends.
            let dir = tempfile::Builder::new().prefix("turbotun-bench-wg-").tempdir().context("key directory")?;
            let keys = [make_key(tool, dir.path(), "a.key")?, make_key(tool, dir.path(), "b.key")?];
            (Some(Arc::new(WgSetup { tool: tool.clone(), keys })), Some(dir))
        }
        _ => (None, None),
    };
    let mut modes = Vec::new();
    for k in runnable {
        let link = match k.spec {
            Spec::Veth => Link::Veth,
            Spec::Vxlan => Link::Vxlan,
            Spec::Pair(a, b) => {
                let end = |p: Program, r: &mut Resolver<'_>| -> Result<Endpoint> {
                    let (argv, env) = p.argv_env();
                    Ok(Endpoint {
                        name: p.name(),
                        program: r.program(p).map_err(|e| anyhow!(e))?,
                        argv: argv.to_vec(),
                        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                        wg: if p.is_wg() { wg.clone() } else { None },
                    })
                };
                Link::Pair(Box::new([end(a, r)?, end(b, r)?]), k.flood)
            }
        };
        modes.push(Mode { label: k.label.into(), family: k.family, kind: Kind::Tunnel(link), note: None });
    }
    Ok(Resolved { modes, skipped, build_failed: r.build_failed, _keys: keys })
}

/// `turbotun bench --tunnel --list`: the kinds and whether each can run (peers not built yet are built on first
/// use), and the traffic kinds.
pub fn print_list(exe: &Path, peers: Option<&Path>) {
    let log_dir = std::env::temp_dir();
    let mut r = Resolver {
        exe,
        peers,
        log_dir: &log_dir,
        build: false,
        wg: modes::which("wg"),
        baseline: None,
        found: Vec::new(),
        build_failed: false,
    };
    println!("tunnel kinds:");
    for k in KINDS {
        let state = match r.missing(k) {
            Some(reason) => format!("not available: {reason}"),
            None => {
                let unbuilt = k
                    .programs()
                    .into_iter()
                    .filter_map(|p| p.peer())
                    .any(|(_, bin)| !peers.is_some_and(|d| d.join("bin").join(bin).is_file()));
                if unbuilt {
                    "(built on first use by bench/peers/build.sh)".to_string()
                } else {
                    String::new()
                }
            }
        };
        println!("  {:<28} {}{}", k.label, k.description, if state.is_empty() { state } else { format!(" {state}") });
    }
    println!("traffic kinds:");
    for t in TUNNEL_TRAFFIC {
        println!("  {:<28} {}", t.label, t.description);
    }
}

/// One endpoint of a row over the repetitions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointRow {
    /// `A` (the iperf3 client's namespace: the sending end) or `B` (the server's: the receiving end).
    pub side: String,
    pub program: String,
    /// utime+stime over the window, % of one core.
    pub cpu_percent: Option<Spread>,
    /// Peak RSS (VmHWM) over the window, MB.
    pub rss_mb: Option<Spread>,
    /// System calls per gigabyte (10^9 bytes) of goodput.
    pub syscalls_per_gb: Option<Spread>,
}

/// One tunnel kind and traffic kind over the repetitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TunnelRow {
    pub kind: String,
    pub traffic: String,
    /// No endpoint process: the kernel carries the traffic (veth, vxlan); CPU, RSS and system calls do not
    /// apply.
    pub kernel: bool,
    /// Goodput, retransmits, loss, drops and box CPU, summarized as the forwarder bench does.
    pub summary: Summary,
    pub endpoints: Vec<EndpointRow>,
    /// Both endpoints' CPU (% of a core) over Gbps, per run, median: the cost of one Gbps.
    pub cpu_per_gbps: Option<Spread>,
    /// Median Gbps over wireguard-go's, same traffic, same run.
    pub ratio_wggo_gbps: Option<f64>,
    /// Median CPU %/Gbps over wireguard-go's (below 1: cheaper per Gbps).
    pub ratio_wggo_cpu_per_gbps: Option<f64>,
}

fn gbps(r: &RunRecord) -> Option<f64> {
    r.iperf.as_ref().map(|i| i.gbps).filter(|g| *g > 0.0)
}

/// The rows, traffic outer and kind inner (report order), with the ratios to wireguard-go.
pub fn rows(runs: &[RunRecord], kinds: &[(String, String)], traffic: &[Traffic]) -> Vec<TunnelRow> {
    let summaries = report::summarize(runs, kinds, traffic);
    let mut rows: Vec<TunnelRow> = summaries
        .into_iter()
        .filter(|s| s.runs > 0)
        .map(|s| {
            let ok: Vec<&RunRecord> = runs
                .iter()
                .filter(|r| r.mode == s.mode && r.traffic == s.traffic && r.error.is_none() && r.iperf.is_some())
                .collect();
            let kernel = KINDS.iter().find(|k| k.label == s.mode).is_some_and(|k| k.is_kernel());
            let mut endpoints = Vec::new();
            for side in ["A", "B"] {
                let of = |r: &RunRecord| r.endpoints.iter().find(|e| e.side == side).cloned();
                let Some(program) = ok.iter().find_map(|r| of(r)).map(|e| e.program) else { continue };
                endpoints.push(EndpointRow {
                    side: side.into(),
                    program,
                    cpu_percent: spread_of(&ok, |r| of(r)?.cpu_percent),
                    rss_mb: spread_of(&ok, |r| Some(of(r)?.peak_rss_kb? as f64 / 1024.0)),
                    syscalls_per_gb: spread_of(&ok, |r| of(r)?.syscalls_per_gb(gbps(r)?)),
                });
            }
            let cpu_per_gbps = spread_of(&ok, |r| {
                let cpu: Option<f64> = r.endpoints.iter().map(|e| e.cpu_percent).sum();
                (!r.endpoints.is_empty()).then_some(cpu? / gbps(r)?)
            });
            TunnelRow {
                kind: s.mode.clone(),
                traffic: s.traffic.clone(),
                kernel,
                summary: s,
                endpoints,
                cpu_per_gbps,
                ratio_wggo_gbps: None,
                ratio_wggo_cpu_per_gbps: None,
            }
        })
        .collect();
    let reference: Vec<(String, Option<f64>, Option<f64>)> = rows
        .iter()
        .filter(|r| r.kind == REFERENCE)
        .map(|r| (r.traffic.clone(), r.summary.gbps.map(|s| s.median), r.cpu_per_gbps.map(|s| s.median)))
        .collect();
    let ratio = |x: Option<f64>, base: Option<f64>| Some(x? / base.filter(|b| *b > 0.0)?);
    for row in &mut rows {
        let Some((_, g, c)) = reference.iter().find(|(t, _, _)| *t == row.traffic) else { continue };
        row.ratio_wggo_gbps = ratio(row.summary.gbps.map(|s| s.median), *g);
        row.ratio_wggo_cpu_per_gbps = ratio(row.cpu_per_gbps.map(|s| s.median), *c);
    }
    rows
}

/// One `-flood` kind over the repetitions, beside the same endpoints without the flood.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FloodRow {
    pub kind: String,
    pub traffic: String,
    /// The kind it is compared with: the same endpoints, no flood, in the same bench.
    pub unflooded: String,
    /// Addresses the flood came from.
    pub sources: usize,
    /// Runs, and those that failed (under a flood: mostly iperf3 starved until it could not finish).
    #[serde(default)]
    pub runs: usize,
    #[serde(default)]
    pub failed: usize,
    pub gbps: Option<Spread>,
    pub unflooded_gbps: Option<Spread>,
    /// Median goodput under the flood over the median without it.
    pub ratio: Option<f64>,
    /// Initiations the flood generator sent per second, thousands.
    pub flood_kpps: Option<Spread>,
    /// B's endpoint's CPU over the window, % of one core.
    pub b_cpu_percent: Option<Spread>,
    /// Datagrams B's socket had no room for over the window (the kernel's UDP receive-buffer errors in B).
    pub b_socket_dropped: Option<Spread>,
    /// What B's endpoint counted as dropped, by reason (the reasons with any drop in a run), per run.
    pub b_drops: Vec<(String, Spread)>,
}

/// The rows of the `-flood` kinds that ran, with their unflooded kinds' goodput.
pub fn flood_rows(runs: &[RunRecord], rows: &[TunnelRow]) -> Vec<FloodRow> {
    let mut out = Vec::new();
    for row in rows {
        let Some(k) = KINDS.iter().find(|k| k.label == row.kind) else { continue };
        let (Some(flood), Some(base)) = (k.flood, unflooded(k)) else { continue };
        let ok: Vec<&RunRecord> = runs
            .iter()
            .filter(|r| r.mode == row.kind && r.traffic == row.traffic && r.error.is_none() && r.iperf.is_some())
            .collect();
        let unflooded_gbps = rows.iter().find(|r| r.kind == base.label && r.traffic == row.traffic);
        let unflooded_gbps = unflooded_gbps.and_then(|r| r.summary.gbps);
        let drops_of = |r: &RunRecord| -> Vec<(String, u64)> {
            let b = r.endpoints.iter().find(|e| e.side == "B").and_then(|e| e.counters.as_ref());
            let by_reason = b.and_then(|c| c["drops_by_reason"].as_object().cloned()).unwrap_or_default();
            by_reason.into_iter().map(|(k, v)| (k, v.as_u64().unwrap_or(0))).collect()
        };
        let mut reasons: Vec<String> =
            ok.iter().flat_map(|r| drops_of(r)).filter(|(_, n)| *n > 0).map(|(k, _)| k).collect();
        reasons.sort();
        reasons.dedup();
        let b_drops = reasons
            .into_iter()
            .filter_map(|reason| {
                let s = spread_of(&ok, |r| drops_of(r).into_iter().find(|(k, _)| *k == reason).map(|(_, n)| n as f64));
                Some((reason, s?))
            })
            .collect();
        out.push(FloodRow {
            kind: row.kind.clone(),
            traffic: row.traffic.clone(),
            unflooded: base.label.to_string(),
            sources: flood.sources,
            runs: row.summary.runs,
            failed: row.summary.failed,
            gbps: row.summary.gbps,
            unflooded_gbps,
            ratio: row.summary.gbps.zip(unflooded_gbps.filter(|g| g.median > 0.0)).map(|(g, u)| g.median / u.median),
            flood_kpps: spread_of(&ok, |r| Some(r.flood.as_ref()?.pps() / 1e3)),
            b_cpu_percent: row.endpoints.iter().find(|e| e.side == "B").and_then(|e| e.cpu_percent),
            b_socket_dropped: spread_of(&ok, |r| r.udp_rcvbuf_errors.map(|n| n as f64)),
            b_drops,
        });
    }
    out
}

/// The flood table: each `-flood` kind beside its unflooded kind.
fn flood_markdown(o: &mut String, report: &TunnelReport) {
    let _ = writeln!(
        o,
        "\n### WireGuard handshake flood — B's endpoint flooded during each run\n\n\
         | tunnel | traffic | flood from | Gbps | without flood | ×no flood | flood kpps sent | CPU % B | \
         B's socket dropped | B's drops by reason |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for f in &report.flood_rows {
        let drops: Vec<String> = f.b_drops.iter().map(|(k, s)| format!("{k} {}", fmt_count(s.median))).collect();
        let failed = if f.failed > 0 { format!(" ({} of {} failed)", f.failed, f.runs) } else { String::new() };
        let _ = writeln!(
            o,
            "| {}{failed} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            f.kind,
            f.traffic,
            if f.sources == 1 { "1 address".to_string() } else { format!("{} addresses", f.sources) },
            cell(f.gbps),
            cell(f.unflooded_gbps),
            ratio(f.ratio),
            cell(f.flood_kpps),
            med(f.b_cpu_percent),
            med_count(f.b_socket_dropped),
            if drops.is_empty() { "none".to_string() } else { drops.join(", ") }
        );
    }
    let _ = writeln!(
        o,
        "\nThe flood: WireGuard handshake initiations with random content and a valid mac1 (which takes nothing but \
         B's public key), sent from A's namespace by `turbotun bench --wg-flood`, one thread, `sendmmsg` batches of \
         64, as fast as it can, from A's underlay address or from that many addresses taken in turn, over the whole \
         window. Gbps: medians (min–max) over interleaved repetitions; ×no flood: the median under the flood over \
         the median of the same endpoints without it in this bench, both over the runs that finished (a run fails when \
         the flood starves iperf3 until it cannot finish). B's drops: what B's endpoint counted as \
         dropped, by reason, median per run (its counters line when stopped); B's socket dropped: the datagrams \
         the kernel found no room for in B's sockets."
    );
}

/// The JSON document of `--tunnel`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TunnelReport {
    /// Which program, which build, on which machine, when.
    #[serde(flatten)]
    pub header: ReportHeader,
    pub duration_s: u64,
    pub reps: u32,
    /// The underlay and the tunnels' addresses and MTUs.
    pub underlay: String,
    pub tunnel: String,
    pub kinds: Vec<String>,
    pub traffic: Vec<String>,
    /// Kinds selected that could not run, with why.
    pub skipped: Vec<Unavailable>,
    /// Whether system calls were counted, and how or why not.
    pub syscalls_counted: bool,
    pub syscalls: String,
    pub rows: Vec<TunnelRow>,
    /// The `-flood` kinds beside their unflooded kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flood_rows: Vec<FloodRow>,
    /// Every run, with both endpoints' samples and counters lines.
    pub runs: Vec<RunRecord>,
}

/// Every selected kind that can run, over every traffic kind, interleaved; then the JSON, the chart and the
/// Markdown. Returns how many runs failed and whether a peer build failed.
pub fn run(ctx: &mut Ctx, args: &Options, peers: Option<&Path>) -> Result<(usize, bool)> {
    let traffic = select_traffic(args)?;
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 3 });
    anyhow::ensure!(reps > 0, "nothing to do: --reps must be at least 1");
    let kinds = select_kinds(args.tunnel_kinds.as_deref(), args.baseline.is_some())?;
    sweep_stale_sockets();
    let exe = ctx.exe.clone();
    let mut resolver = Resolver {
        exe: &exe,
        peers,
        log_dir: &ctx.log_dir,
        build: true,
        wg: modes::which("wg"),
        baseline: args.baseline.clone(),
        found: Vec::new(),
        build_failed: false,
    };
    let resolved = resolve(&kinds, &mut resolver)?;
    for s in &resolved.skipped {
        eprintln!("turbotun bench: skipping {}: {}", s.mode, s.reason);
    }
    if resolved.modes.is_empty() {
        bail!("no selected tunnel kind can run here (see `turbotun bench --tunnel --list`)");
    }
    let with_processes = resolved.modes.iter().any(|m| matches!(&m.kind, Kind::Tunnel(Link::Pair(..))));
    let syscalls = match perfstat::probe(&ctx.log_dir) {
        _ if args.no_syscalls => "not counted (--no-syscalls)".to_string(),
        Ok(()) => {
            ctx.count_syscalls = with_processes;
            format!("`perf stat -e {} -p PID` on each endpoint process over the window", perfstat::EVENT)
        }
        Err(e) => {
            if with_processes {
                eprintln!("turbotun bench: system calls not counted: {e:#}");
            }
            format!("not counted: {e:#}")
        }
    };
    super::warn_about(&resolved.modes);
    let plan = Plan { modes: resolved.modes.clone(), traffic: traffic.clone(), duration: ctx.duration, reps };
    let started_unix = super::now_unix();
    let (runs, failures) = super::measure(ctx, &plan, None)?;
    let kinds: Vec<(String, String)> = plan.modes.iter().map(|m| (m.label.clone(), m.family.to_string())).collect();
    let rows = rows(&runs, &kinds, &traffic);
    let report = TunnelReport {
        header: ReportHeader::here("turbotun bench --tunnel", started_unix),
        duration_s: ctx.duration,
        reps,
        underlay: format!("veth {}/{PREFIX_LEN} <-> {}/{PREFIX_LEN}, MTU {UNDERLAY_MTU}", UNDERLAY[0], UNDERLAY[1]),
        tunnel: format!("{}/{PREFIX_LEN} <-> {}/{PREFIX_LEN}, MTU {TUNNEL_MTU}", INNER[0], INNER[1]),
        kinds: kinds.iter().map(|k| k.0.clone()).collect(),
        traffic: traffic.iter().map(|t| t.label.to_string()).collect(),
        skipped: resolved.skipped.clone(),
        syscalls_counted: ctx.count_syscalls,
        syscalls,
        flood_rows: flood_rows(&runs, &rows),
        rows,
        runs,
    };
    super::write_json(args.json.as_deref(), &report)?;
    if let Some(p) = &args.chart {
        let summary: Vec<Summary> = report.rows.iter().map(|r| r.summary.clone()).collect();
        let title = format!(
            "turbotun bench --tunnel — {} s × {} rep(s), {}",
            report.duration_s, report.reps, report.header.kernel
        );
        chart::write_bar_chart(p, &summary, &traffic, &title, chart::Metric::Gbps)?;
        eprintln!("turbotun bench: wrote {}", p.display());
    }
    super::print_markdown(&markdown(&report, &traffic));
    Ok((failures, resolved.build_failed))
}

/// The cells of one row of a traffic kind's table.
fn row_cells(r: &TunnelRow, udp: bool) -> Vec<String> {
    let s = &r.summary;
    let failed = if s.failed > 0 { format!(" ({} of {} failed)", s.failed, s.runs) } else { String::new() };
    let mut cells = vec![
        format!("{}{failed}", r.kind),
        cell(s.gbps),
        ratio(r.ratio_wggo_gbps),
        if udp { cell(s.lost_percent) } else { med_count(s.retransmits) },
    ];
    let end = |side: &str| r.endpoints.iter().find(|e| e.side == side);
    if r.kernel {
        cells.extend(["kernel", "kernel", "kernel", "–", "n/a", "n/a", "n/a", "n/a"].map(String::from));
    } else {
        cells.push(cell(end("A").and_then(|e| e.cpu_percent)));
        cells.push(cell(end("B").and_then(|e| e.cpu_percent)));
        cells.push(med(r.cpu_per_gbps));
        cells.push(ratio(r.ratio_wggo_cpu_per_gbps));
        cells.push(med(end("A").and_then(|e| e.rss_mb)));
        cells.push(med(end("B").and_then(|e| e.rss_mb)));
        cells.push(med_count(end("A").and_then(|e| e.syscalls_per_gb)));
        cells.push(med_count(end("B").and_then(|e| e.syscalls_per_gb)));
    }
    cells.push(med(s.box_cpu_percent));
    cells
}

/// The overview (Gbps of every kind and traffic), one table per traffic kind, what the columns mean and the
/// kinds that were skipped.
pub fn markdown(report: &TunnelReport, traffic: &[Traffic]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## turbotun bench --tunnel ({} build): {} s per run, {} rep(s) interleaved, kernel {}, {} CPUs\n",
        report.header.build, report.duration_s, report.reps, report.header.kernel, report.header.cpus
    );
    let _ = writeln!(
        o,
        "Underlay: {}. Tunnel: {}. iperf3 client (the sender) in A, server in B.\n",
        report.underlay, report.tunnel
    );
    let _ = write!(o, "| tunnel |");
    for t in traffic {
        let _ = write!(o, " {} Gbps median (min–max) |", t.label);
    }
    let _ = write!(o, "\n|---|");
    for _ in traffic {
        let _ = write!(o, "---|");
    }
    o.push('\n');
    for kind in &report.kinds {
        let _ = write!(o, "| {kind} |");
        for t in traffic {
            let r = report.rows.iter().find(|r| r.kind == *kind && r.traffic == t.label);
            let _ = write!(o, " {} |", r.map(|r| cell(r.summary.gbps)).unwrap_or_else(|| "–".into()));
        }
        o.push('\n');
    }
    for t in traffic {
        let _ = writeln!(o, "\n### {} — {}\n", t.label, t.description);
        let _ = writeln!(
            o,
            "| tunnel | Gbps | ×wg-go | {} | CPU % A | CPU % B | CPU %/Gbps | ×wg-go | RSS MB A | RSS MB B | \
             syscalls/GB A | syscalls/GB B | box CPU % |",
            if t.udp { "lost %" } else { "retr" }
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in report.rows.iter().filter(|r| r.traffic == t.label) {
            let _ = writeln!(o, "| {} |", row_cells(r, t.udp).join(" | "));
        }
    }
    let _ = writeln!(
        o,
        "\nMedians (min–max) over interleaved repetitions. Gbps = receiver goodput (iperf3); retr = TCP \
         retransmits (sender); lost % = UDP datagrams sent but not received. A = the client's namespace (its \
         endpoint encrypts and sends), B = the server's. CPU % = utime+stime of the endpoint process over the \
         window, % of one core (veth and vxlan: the kernel does the work, in softirq and in iperf3's system \
         calls, not attributable to a process). CPU %/Gbps = both endpoints' CPU over Gbps, per run. ×wg-go = \
         the median over {REFERENCE}'s in this run (Gbps: above 1 is faster; CPU %/Gbps: below 1 is cheaper). \
         RSS MB = peak RSS (VmHWM) of the endpoint over the window. syscalls/GB = system calls the endpoint \
         entered per 10^9 bytes of goodput: {}. box CPU % = all cores busy over the window.",
        report.syscalls
    );
    if !report.flood_rows.is_empty() {
        flood_markdown(&mut o, report);
    }
    if !report.skipped.is_empty() {
        let _ = writeln!(o, "\nSkipped:");
        for u in &report.skipped {
            let _ = writeln!(o, "- {}: {}", u.mode, u.reason);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iperf::IperfResult;
    use crate::report::ProcSample;
    use crate::topo::flood_sources;
    use crate::wgflood::FloodReport;
    use std::net::{IpAddr, Ipv4Addr};

    fn rec(kind: &str, traffic: &str, rep: u32, gbps: f64, cpu: Option<f64>) -> RunRecord {
        let udp = traffic.starts_with("udp");
        let endpoint = |side: &str, cpu: f64| ProcSample {
            side: side.into(),
            program: kind.into(),
            pid: 1,
            cpu_percent: Some(cpu),
            peak_rss_kb: Some(10 * 1024),
            // 1 Gbps is 0.125 GB/s: 125,000 system calls a second is a million per GB.
            syscalls: Some((125_000.0 * gbps * 2.0) as u64),
            syscall_seconds: Some(2.0),
            ..Default::default()
        };
        RunRecord {
            mode: kind.into(),
            family: "x".into(),
            traffic: traffic.into(),
            rep,
            iperf: Some(IperfResult {
                gbps,
                retransmits: (!udp).then_some(7),
                udp_lost_percent: udp.then_some(12.0),
                udp_packets: udp.then_some(100),
                udp_received: udp.then_some(88),
                udp_lost: udp.then_some(12),
                seconds: 2.0,
                ..Default::default()
            }),
            endpoints: cpu.map(|c| vec![endpoint("A", c), endpoint("B", c / 2.0)]).unwrap_or_default(),
            box_cpu_percent: Some(90.0),
            ..Default::default()
        }
    }

    fn sample() -> (Vec<RunRecord>, Vec<(String, String)>) {
        let mut runs = Vec::new();
        for rep in 1..=3 {
            let r = f64::from(rep);
            runs.push(rec("veth", "tcp", rep, 20.0 + r, None));
            runs.push(rec("wireguard-go", "tcp", rep, 1.0 + r / 10.0, Some(100.0)));
            runs.push(rec("boringtun", "tcp", rep, 2.2, Some(110.0)));
            runs.push(rec("wireguard-go", "udp1372", rep, 0.5, Some(100.0)));
        }
        runs.push(RunRecord { error: Some("boom".into()), iperf: None, ..rec("boringtun", "tcp", 4, 0.0, None) });
        let kinds = [("veth", "baseline"), ("wireguard-go", "wggo"), ("boringtun", "boringtun")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .to_vec();
        (runs, kinds)
    }

    #[test]
    fn rows_endpoints_and_ratios() {
        let (runs, kinds) = sample();
        let rows = rows(&runs, &kinds, TUNNEL_TRAFFIC);
        let labels: Vec<(&str, &str)> = rows.iter().map(|r| (r.kind.as_str(), r.traffic.as_str())).collect();
        assert_eq!(
            labels,
            [("veth", "tcp"), ("wireguard-go", "tcp"), ("boringtun", "tcp"), ("wireguard-go", "udp1372")]
        );
        let veth = &rows[0];
        assert!(veth.kernel && veth.endpoints.is_empty() && veth.cpu_per_gbps.is_none());
        let wg = &rows[1];
        assert!(!wg.kernel);
        assert!((wg.summary.gbps.unwrap().median - 1.2).abs() < 1e-9);
        assert_eq!(wg.ratio_wggo_gbps, Some(1.0));
        assert_eq!(wg.endpoints.len(), 2);
        assert_eq!(wg.endpoints[0].cpu_percent.unwrap().median, 100.0);
        assert_eq!(wg.endpoints[1].cpu_percent.unwrap().median, 50.0);
        assert_eq!(wg.endpoints[0].rss_mb.unwrap().median, 10.0);
        let per_gb = wg.endpoints[0].syscalls_per_gb.unwrap().median;
        assert!((per_gb - 1e6).abs() < 1.0, "{per_gb}");
        // Both endpoints, 150 % of a core, over 1.2 Gbps.
        assert!((wg.cpu_per_gbps.unwrap().median - 125.0).abs() < 1e-9);
        let bt = &rows[2];
        assert_eq!((bt.summary.runs, bt.summary.failed), (4, 1));
        assert!((bt.ratio_wggo_gbps.unwrap() - 2.2 / 1.2).abs() < 1e-9);
        assert!((bt.ratio_wggo_cpu_per_gbps.unwrap() - (165.0 / 2.2) / 125.0).abs() < 1e-9);
        assert_eq!(veth.ratio_wggo_cpu_per_gbps, None);
        assert!((veth.ratio_wggo_gbps.unwrap() - 22.0 / 1.2).abs() < 1e-9);
        let udp = &rows[3];
        assert_eq!(udp.summary.lost_percent.unwrap().median, 12.0);
    }

    fn report() -> TunnelReport {
        let (runs, kinds) = sample();
        TunnelReport {
            header: ReportHeader::for_tests("t"),
            duration_s: 2,
            reps: 3,
            underlay: "u".into(),
            tunnel: "t".into(),
            kinds: kinds.iter().map(|k| k.0.clone()).collect(),
            traffic: vec!["tcp".into(), "udp1372".into()],
            skipped: vec![Unavailable { mode: "turbotun-wg".into(), reason: "no `wg` subcommand".into() }],
            syscalls_counted: true,
            syscalls: "perf".into(),
            rows: rows(&runs, &kinds, TUNNEL_TRAFFIC),
            flood_rows: Vec::new(),
            runs,
        }
    }

    #[test]
    fn flood_rows_beside_their_unflooded_kinds() {
        let mut runs = Vec::new();
        for rep in 1..=3 {
            runs.push(rec("turbotun-wg", "tcp", rep, 4.0, Some(80.0)));
            let mut flooded = rec("turbotun-wg-flood64", "tcp", rep, 1.0 + f64::from(rep), Some(100.0));
            flooded.flood =
                Some(FloodReport { sent: 600_000 * u64::from(rep), seconds: 2.0, sources: 64, ..Default::default() });
            flooded.udp_rcvbuf_errors = Some(1000);
            flooded.endpoints[1].counters = Some(serde_json::json!({
                "drops_by_reason": { "unauthenticated": 100 * rep, "replayed": 0, "malformed_datagram": 2 }
            }));
            runs.push(flooded);
        }
        let starved = rec("turbotun-wg-flood64", "tcp", 4, 0.0, None);
        runs.push(RunRecord { error: Some("iperf3 did not finish within 15 s".into()), iperf: None, ..starved });
        let kinds = [("turbotun-wg", "turbotun"), ("turbotun-wg-flood64", "turbotun")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .to_vec();
        let rows = rows(&runs, &kinds, TUNNEL_TRAFFIC);
        let flood = flood_rows(&runs, &rows);
        assert_eq!(flood.len(), 1, "{flood:?}");
        let f = &flood[0];
        assert_eq!((f.kind.as_str(), f.unflooded.as_str(), f.sources), ("turbotun-wg-flood64", "turbotun-wg", 64));
        assert_eq!((f.runs, f.failed), (4, 1));
        assert_eq!(f.ratio, Some(3.0 / 4.0));
        assert_eq!(f.flood_kpps.unwrap().median, 600.0);
        assert_eq!(f.b_cpu_percent.unwrap().median, 50.0);
        let reasons: Vec<&str> = f.b_drops.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(reasons, ["malformed_datagram", "unauthenticated"], "only reasons with drops");
        assert_eq!(f.b_drops[1].1.median, 200.0);
        let mut report = report();
        report.flood_rows = flood;
        let md = markdown(&report, &[TUNNEL_TRAFFIC[0]]);
        assert!(
            md.contains("| turbotun-wg-flood64 (1 of 4 failed) | tcp | 64 addresses | 3.00 (2.00–4.00) | 4.00 | 0.75× | 600 (300–900) | 50.0 | 1.0k | malformed_datagram 2, unauthenticated 200 |"),
            "{md}"
        );
        crate::report::assert_rows_match_headers(&md);
        let back: TunnelReport = serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
        assert_eq!(back.flood_rows, report.flood_rows);
    }

    #[test]
    fn flood_kinds_only_when_named() {
        assert!(select_kinds(None, true).unwrap().iter().all(|k| k.flood.is_none()));
        let k = select_kinds(Some(&["turbotun-wg-flood1".into(), "turbotun-wg".into()]), false).unwrap();
        assert_eq!(k.iter().map(|k| k.label).collect::<Vec<_>>(), ["turbotun-wg", "turbotun-wg-flood1"]);
        for k in KINDS.iter().filter(|k| k.flood.is_some()) {
            let base = unflooded(k).unwrap_or_else(|| panic!("{} has no unflooded kind", k.label));
            assert!(k.label.starts_with(base.label) && base.flood.is_none(), "{}", k.label);
        }
        let one: Vec<IpAddr> = vec![Ipv4Addr::new(10, 201, 0, 1).into()];
        assert_eq!(flood_sources(1).unwrap(), one);
        assert_eq!(flood_sources(64).unwrap().len(), 64);
        assert!(flood_sources(151).is_err() && flood_sources(0).is_err());
    }

    #[test]
    fn markdown_tables() {
        let r = report();
        let traffic = [TUNNEL_TRAFFIC[0], TUNNEL_TRAFFIC[2]];
        let md = markdown(&r, &traffic);
        assert!(md.contains("| tunnel | tcp Gbps median (min–max) | udp1372 Gbps median (min–max) |"), "{md}");
        assert!(md.contains("| veth | 22.0 (21.0–23.0) | – |"), "{md}");
        assert!(md.contains("| veth | 22.0 (21.0–23.0) | 18.33× | 7 | kernel | kernel | kernel | – | n/a |"), "{md}");
        assert!(md.contains("| wireguard-go | 1.20 (1.10–1.30) | 1.00× | 7 | 100 | 50.0 | 125 | 1.00× | 10.0 | 10.0 | 1.0M | 1.0M |"), "{md}");
        assert!(md.contains("| boringtun (1 of 4 failed) | 2.20 |"), "{md}");
        assert!(md.contains("| lost % |") && md.contains("| wireguard-go | 0.500 | 1.00× | 12.0 |"), "{md}");
        assert!(md.contains("- turbotun-wg: no `wg` subcommand"), "{md}");
        crate::report::assert_rows_match_headers(&md);
        let back: TunnelReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.rows.len(), r.rows.len());
        assert_eq!(back.runs[1].endpoints, r.runs[1].endpoints);
    }

    #[test]
    fn kinds_and_traffic_selection() {
        let baseline_kinds = KINDS.iter().filter(|k| is_baseline(k)).count();
        assert_eq!(baseline_kinds, 2);
        let plain_kinds = KINDS.iter().filter(|k| !only_when_named(k)).count();
        assert_eq!(select_kinds(None, false).unwrap().len(), plain_kinds - baseline_kinds);
        let k = select_kinds(Some(&["turbotun-wg".into(), "wireguard-go".into()]), true).unwrap();
        let labels: Vec<&str> = k.iter().map(|k| k.label).collect();
        assert_eq!(labels, ["turbotun-wg", "turbotun-wg@baseline", "wireguard-go"], "--baseline adds the twin");
        assert!(select_kinds(Some(&["wireguard-go".into()]), true).is_err(), "a --baseline comparing nothing");
        let k = select_kinds(Some(&["turbotun-wg-q2".into()]), false).unwrap();
        assert_eq!(k[0].programs(), [Program::TurbotunWgTwoQueues]);
        assert!(Program::TurbotunWgTwoQueues.argv_env().0.windows(2).any(|w| w == ["--queues", "2"]));
        assert!(!select_kinds(None, true).unwrap().iter().any(|k| k.label.ends_with("-q2")), "only when named");
        assert_eq!(select_kinds(None, true).unwrap().len(), plain_kinds, "--baseline adds the A/B kinds");
        let k = select_kinds(Some(&["wireguard-go".into(), "veth".into(), "veth".into()]), false).unwrap();
        assert_eq!(k.iter().map(|k| k.label).collect::<Vec<_>>(), ["veth", "wireguard-go"]);
        assert!(select_kinds(Some(&["wggo".into()]), false).is_err());
        assert!(select_kinds(Some(&[" ".into()]), false).is_err());
        let ab = KINDS.iter().find(|k| k.label == "turbotun-wg@baseline").unwrap();
        assert_eq!(ab.programs(), [Program::BaselineWg]);
        assert_eq!(Program::BaselineWg.argv_env().0, ["wg", "-f", "{dev}"], "an older build prints JSON unasked");
        let interop = KINDS.iter().find(|k| k.label == "turbotun-wg-vs-wireguard-go").unwrap();
        assert_eq!(interop.programs(), [Program::TurbotunWg, Program::WireguardGo]);
        let gotatun = select_kinds(Some(&["gotatun".into()]), false).unwrap();
        assert_eq!(gotatun[0].programs(), [Program::Gotatun]);
        assert_eq!(Program::Gotatun.peer(), Some(("gotatun", "gotatun")), "build.sh's target, bench/peers/bin's name");
        assert!(KINDS.iter().any(|k| k.label == REFERENCE));
        assert!(KINDS.iter().filter(|k| k.is_kernel()).all(|k| k.programs().is_empty()));
        // The UDP datagrams fit the tunnel's MTU whole: 20 bytes of IP and 8 of UDP header.
        assert!(TUNNEL_TRAFFIC.iter().all(|t| !t.udp || t.payload + 28 <= TUNNEL_MTU));
    }

    #[test]
    fn socket_names() {
        assert_eq!(socket_owner("tt1234r5ta.sock"), Some(1234));
        assert_eq!(socket_owner("tt1234r56tb.sock"), Some(1234));
        for other in ["wg0.sock", "tt1234r5ta", "tt1234r5tc.sock", "ttxr5ta.sock", "tt12r.sock", "tt1234rta.sock"] {
            assert_eq!(socket_owner(other), None, "{other}");
        }
        assert_eq!(turbotun_wg::uapi::socket_path("tt1r1ta"), PathBuf::from("/var/run/wireguard/tt1r1ta.sock"));
    }

    #[test]
    fn endpoint_arguments() {
        let (argv, env) = Program::Boringtun.argv_env();
        assert!(argv.contains(&"--disable-drop-privileges") && env.contains(&("WG_SUDO", "true")));
        let (argv, env) = Program::Gotatun.argv_env();
        assert!(argv.contains(&"--disable-drop-privileges") && env.contains(&("WG_SUDO", "1")));
        let (argv, env) = Program::WireguardGo.argv_env();
        assert_eq!((argv, env), (&["-f", "{dev}"][..], &[("WG_PROCESS_FOREGROUND", "1")][..]));
        let all =
            [Program::TurbotunTunnel, Program::TurbotunWg, Program::WireguardGo, Program::Boringtun, Program::Gotatun];
        for p in all {
            assert!(p.argv_env().0.contains(&"{dev}"), "{p:?}");
        }
    }
}
