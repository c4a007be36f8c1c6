//! The tunnel kinds and their endpoints: the programs at each end, which kinds can run here (peers built on
//! first use, WireGuard keys made), the sockets stopped endpoints left, and `--tunnel --list`.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};

use crate::modes::{self, Endpoint, Flood, Kind, Link, Mode, Unavailable, WgKey, WgSetup};
use crate::topo::clear_stale_socket;

use super::TUNNEL_TRAFFIC;

/// A program at one end of a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Program {
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
    pub(super) fn name(self) -> &'static str {
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
    pub(super) fn is_wg(self) -> bool {
        !matches!(self, Program::TurbotunTunnel | Program::TurbotunTunnelTwoQueues | Program::BaselineTunnel)
    }

    /// The peers the bench builds: build.sh's target and the binary under bench/peers/bin.
    pub(super) fn peer(self) -> Option<(&'static str, &'static str)> {
        match self {
            Program::WireguardGo => Some(("wireguard-go", "wireguard-go")),
            Program::Boringtun => Some(("boringtun", "boringtun-cli")),
            Program::Gotatun => Some(("gotatun", "gotatun")),
            _ => None,
        }
    }

    /// Arguments (`{dev}`, `{local}`, `{remote}` stand for the device and the underlay's socket addresses) and
    /// the environment it runs with.
    pub(super) fn argv_env(self) -> (&'static [&'static str], &'static [(&'static str, &'static str)]) {
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
pub(super) enum Spec {
    Veth,
    Vxlan,
    /// An endpoint process in A and one in B.
    Pair(Program, Program),
}

/// A tunnel kind: one row of each table.
#[derive(Debug, Clone, Copy)]
pub(super) struct KindSpec {
    pub label: &'static str,
    /// The chart's colour family.
    pub(super) family: &'static str,
    pub description: &'static str,
    pub(super) spec: Spec,
    /// B's endpoint flooded with handshake initiations during the window (the `-flood` kinds).
    pub(super) flood: Option<Flood>,
    /// Peers configured on each endpoint beside the other end, each with a /32 and a /128 nothing is sent to
    /// (the `-crowd` kinds: a server's routing table around the one flow measured).
    pub(super) crowd: usize,
}

impl KindSpec {
    /// No process: the kernel carries it.
    pub(super) fn is_kernel(&self) -> bool {
        matches!(self.spec, Spec::Veth | Spec::Vxlan)
    }

    pub(super) fn programs(&self) -> Vec<Program> {
        match self.spec {
            Spec::Pair(a, b) if a == b => vec![a],
            Spec::Pair(a, b) => vec![a, b],
            _ => vec![],
        }
    }
}

/// The other peers each endpoint of a `-crowd` kind holds.
pub(super) const CROWD: usize = 100_000;

/// Every kind, in report order.
pub(super) const KINDS: &[KindSpec] = &[
    KindSpec {
        label: "veth",
        family: "baseline",
        description: "iperf3 over the underlay itself",
        spec: Spec::Veth,
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "vxlan",
        family: "baseline",
        description: "the kernel's VXLAN over the underlay (VNI 42, UDP 4789)",
        spec: Spec::Vxlan,
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "turbotun-plain",
        family: "turbotun",
        description: "`turbotun tunnel` at both ends (packets in UDP, not encrypted)",
        spec: Spec::Pair(Program::TurbotunTunnel, Program::TurbotunTunnel),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "turbotun-wg",
        family: "turbotun",
        description: "`turbotun wg` at both ends (WireGuard)",
        spec: Spec::Pair(Program::TurbotunWg, Program::TurbotunWg),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "turbotun-wg-crowd",
        family: "turbotun",
        description: "`turbotun wg` at both ends, each also holding 100,000 other peers and their 200,000 prefixes \
                      (only when named)",
        spec: Spec::Pair(Program::TurbotunWg, Program::TurbotunWg),
        flood: None,
        crowd: CROWD,
    },
    KindSpec {
        label: "turbotun-plain-q2",
        family: "turbotun",
        description: "`turbotun tunnel --queues 2` at both ends (only when named)",
        spec: Spec::Pair(Program::TurbotunTunnelTwoQueues, Program::TurbotunTunnelTwoQueues),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "turbotun-wg-q2",
        family: "turbotun",
        description: "`turbotun wg --queues 2` at both ends (only when named)",
        spec: Spec::Pair(Program::TurbotunWgTwoQueues, Program::TurbotunWgTwoQueues),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "turbotun-plain@baseline",
        family: "turbotun",
        description: "`turbotun tunnel` of the --baseline build at both ends (A/B)",
        spec: Spec::Pair(Program::BaselineTunnel, Program::BaselineTunnel),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "turbotun-wg@baseline",
        family: "turbotun",
        description: "`turbotun wg` of the --baseline build at both ends (A/B)",
        spec: Spec::Pair(Program::BaselineWg, Program::BaselineWg),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "wireguard-go",
        family: "wggo",
        description: "wireguard-go at both ends",
        spec: Spec::Pair(Program::WireguardGo, Program::WireguardGo),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "boringtun",
        family: "boringtun",
        description: "boringtun-cli at both ends",
        spec: Spec::Pair(Program::Boringtun, Program::Boringtun),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "gotatun",
        family: "gotatun",
        description: "GotaTun (Mullvad's fork of boringtun) at both ends",
        spec: Spec::Pair(Program::Gotatun, Program::Gotatun),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "turbotun-wg-vs-wireguard-go",
        family: "turbotun",
        description: "`turbotun wg` in A, wireguard-go in B (interoperation)",
        spec: Spec::Pair(Program::TurbotunWg, Program::WireguardGo),
        flood: None,
        crowd: 0,
    },
    KindSpec {
        label: "turbotun-wg-flood1",
        family: "turbotun",
        description: "`turbotun wg` at both ends, B flooded with valid-mac1 handshake initiations from one address",
        spec: Spec::Pair(Program::TurbotunWg, Program::TurbotunWg),
        flood: Some(Flood { sources: 1 }),
        crowd: 0,
    },
    KindSpec {
        label: "turbotun-wg-flood64",
        family: "turbotun",
        description: "`turbotun wg` at both ends, B flooded with valid-mac1 handshake initiations from 64 addresses",
        spec: Spec::Pair(Program::TurbotunWg, Program::TurbotunWg),
        flood: Some(Flood { sources: 64 }),
        crowd: 0,
    },
    KindSpec {
        label: "wireguard-go-flood1",
        family: "wggo",
        description: "wireguard-go at both ends, B flooded with valid-mac1 handshake initiations from one address",
        spec: Spec::Pair(Program::WireguardGo, Program::WireguardGo),
        flood: Some(Flood { sources: 1 }),
        crowd: 0,
    },
];

/// The kind every ratio is taken against.
pub(super) const REFERENCE: &str = "wireguard-go";

/// The bench process that named a socket `tt<pid>r<run>t{a,b}.sock`, if the name is one of ours.
pub(super) fn socket_owner(file_name: &str) -> Option<u32> {
    let dev = file_name.strip_suffix(".sock")?;
    let rest = dev.strip_prefix("tt")?;
    let (pid, run) = rest.split_once('r')?;
    let run = run.strip_suffix("ta").or_else(|| run.strip_suffix("tb"))?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (all_digits(pid) && all_digits(run)).then(|| pid.parse().ok())?
}

/// Sockets named by bench processes that are gone and served by nobody: removed (a bench killed by SIGKILL
/// leaves them).
pub(super) fn sweep_stale_sockets() {
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
pub(super) struct Resolver<'a> {
    pub(super) exe: &'a Path,
    pub(super) peers: Option<&'a Path>,
    pub(super) log_dir: &'a Path,
    /// Whether to build missing peers (not for `--list`).
    pub(super) build: bool,
    pub(super) wg: Option<PathBuf>,
    /// The other build of turbotun that `@baseline` kinds run (`--baseline`).
    pub(super) baseline: Option<PathBuf>,
    pub(super) found: Vec<(Program, Result<PathBuf, String>)>,
    pub(super) build_failed: bool,
}

impl Resolver<'_> {
    pub(super) fn program(&mut self, p: Program) -> Result<PathBuf, String> {
        if let Some((_, r)) = self.found.iter().find(|(q, _)| *q == p) {
            return r.clone();
        }
        let r = self.find(p);
        self.found.push((p, r.clone()));
        r
    }

    pub(super) fn find(&mut self, p: Program) -> Result<PathBuf, String> {
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
    pub(super) fn missing(&mut self, k: &KindSpec) -> Option<String> {
        let reasons: Vec<String> = k.programs().into_iter().filter_map(|p| self.program(p).err()).collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }
}

/// Whether a kind runs the `--baseline` build.
pub(super) fn is_baseline(k: &KindSpec) -> bool {
    k.label.ends_with("@baseline")
}

/// Whether a kind runs only when `--tunnel-kinds` names it: the handshake floods, the crowds and the two-queue
/// endpoints.
pub(super) fn only_when_named(k: &KindSpec) -> bool {
    k.flood.is_some() || k.crowd > 0 || k.label.ends_with("-q2")
}

/// The kind a `-flood` kind is compared with: the same endpoints without the flood.
pub(super) fn unflooded(k: &KindSpec) -> Option<&'static KindSpec> {
    k.flood?;
    KINDS.iter().find(|b| b.flood.is_none() && b.spec == k.spec)
}

/// The kinds named by `--tunnel-kinds`, or all but the `-flood` kinds (and the `@baseline` kinds only with
/// `--baseline`), in report order.
pub(super) fn select_kinds(filter: Option<&[String]>, baseline: bool) -> Result<Vec<&'static KindSpec>> {
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

/// A key pair made with `wg genkey` and `wg pubkey`, the private key written to `dir/NAME` with mode 0600.
pub(super) fn make_key(tool: &Path, dir: &Path, name: &str) -> Result<WgKey> {
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
pub(crate) struct Resolved {
    pub(crate) modes: Vec<Mode>,
    pub(crate) skipped: Vec<Unavailable>,
    pub(crate) build_failed: bool,
    /// The private directory of the WireGuard keys, removed when dropped.
    pub(super) _keys: Option<tempfile::TempDir>,
}

pub(super) fn resolve(kinds: &[&KindSpec], r: &mut Resolver<'_>) -> Result<Resolved> {
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
                        crowd: k.crowd,
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
pub(crate) fn print_list(exe: &Path, peers: Option<&Path>) {
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
