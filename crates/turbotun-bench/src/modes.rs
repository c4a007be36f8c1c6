//! The modes the bench can run: kernel baselines, turbotun's forwarder modes and the peers under `bench/peers/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{Context, Result};

/// What a turbotun mode needs from the tun driver beyond a plain TUN device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// `IFF_VNET_HDR`: the virtio header in front of every frame, and with it the offloads.
    VnetHdr,
    /// `IFF_MULTI_QUEUE`.
    MultiQueue,
}

/// One of turbotun's forwarder modes: `turbotun fwd DEV_A DEV_B ARGS..`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TurbotunMode {
    /// Label after `turbotun-`.
    pub label: &'static str,
    pub args: &'static [&'static str],
    pub needs: &'static [Need],
    /// Reads through io_uring where the kernel has it, blocking reads otherwise (`turbotun fwd`'s default for
    /// plain and passthrough).
    pub uring_by_default: bool,
}

const fn fwd(label: &'static str, args: &'static [&'static str], needs: &'static [Need]) -> TurbotunMode {
    TurbotunMode { label, args, needs, uring_by_default: false }
}

/// turbotun's forwarder modes, in report order. Adding a mode is one line; that `turbotun fwd` accepts its
/// arguments is a unit test, and what it needs from the kernel is checked with the library's probes.
pub(crate) const TURBOTUN_MODES: &[TurbotunMode] = &[
    TurbotunMode { uring_by_default: true, ..fwd("plain", &["--mode", "plain"], &[]) },
    fwd("offload", &["--mode", "offload"], &[Need::VnetHdr]),
    // Offload with the split segments' checksums left partial for the kernel to complete: no payload byte read.
    fwd("offload-partial", &["--mode", "offload", "--checksums", "partial"], &[Need::VnetHdr]),
    TurbotunMode { uring_by_default: true, ..fwd("passthrough", &["--mode", "passthrough"], &[Need::VnetHdr]) },
    // Offload through io_uring (slot ring, gathered writes submitted together); `--io uring` falls back to the
    // blocking path, with a note, where io_uring is missing.
    TurbotunMode {
        uring_by_default: true,
        ..fwd("uring-offload", &["--mode", "offload", "--io", "uring"], &[Need::VnetHdr])
    },
    // The same with the slot arena registered with the ring (READV_FIXED/WRITEV_FIXED, Linux 6.15): the whole
    // arena pinned and resident.
    TurbotunMode {
        uring_by_default: true,
        ..fwd("uring-offload-fixed", &["--mode", "offload", "--io", "uring", "--register-buffers"], &[Need::VnetHdr])
    },
    fwd("threads2", &["--mode", "offload", "--threads", "2"], &[Need::VnetHdr]),
    fwd("multiqueue", &["--mode", "offload", "--queues", "2"], &[Need::VnetHdr, Need::MultiQueue]),
    // The blocking paths of the two modes above that read through io_uring by default.
    fwd("plain-block", &["--mode", "plain", "--io", "block"], &[]),
    fwd("passthrough-block", &["--mode", "passthrough", "--io", "block"], &[Need::VnetHdr]),
    fwd("async", &["--mode", "offload", "--async"], &[Need::VnetHdr]),
];

/// What this kernel offers turbotun's modes, from the library's probes.
#[derive(Debug, Clone)]
pub(crate) struct Support {
    /// The tun driver's optional features, or why there is no usable tun driver.
    pub tun: Result<TunFeatures, String>,
    /// Whether io_uring forwarding works here, or why not.
    pub uring: Result<(), String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TunFeatures {
    pub vnet_hdr: bool,
    pub multi_queue: bool,
}

impl Support {
    /// `turbotun::Capabilities` and `turbotun::uring::supported`, both probed once per process.
    pub(crate) fn probe() -> Support {
        // The capability probe opens scratch devices: inside a private namespace when we may make one, so that
        // none shows up in the root namespace even for a moment.
        let caps = turbotun::netns::with_private_netns(turbotun::Capabilities::get)
            .unwrap_or_else(|_| turbotun::Capabilities::get());
        Support {
            tun: caps
                .map(|c| TunFeatures { vnet_hdr: c.vnet_hdr(), multi_queue: c.multi_queue() })
                .map_err(|e| e.to_string()),
            uring: turbotun::uring::supported().map_err(|e| e.to_string()),
        }
    }

    /// Why a mode with these needs cannot run here, if it cannot.
    fn missing(&self, needs: &[Need]) -> Option<String> {
        let tun = match &self.tun {
            Ok(tun) => tun,
            Err(e) => return Some(format!("no usable tun driver: {e}")),
        };
        let lacking: Vec<&str> = needs
            .iter()
            .filter_map(|n| match n {
                Need::VnetHdr if !tun.vnet_hdr => Some("IFF_VNET_HDR"),
                Need::MultiQueue if !tun.multi_queue => Some("IFF_MULTI_QUEUE"),
                _ => None,
            })
            .collect();
        (!lacking.is_empty()).then(|| format!("this kernel's tun driver lacks {}", lacking.join(" and ")))
    }
}

/// Peers: (family, binary under bench/peers/bin, the package that builds it, modes).
pub(crate) const PEERS: &[(&str, &str, &[&str])] = &[
    ("tunrs", "tunrs-fwd", &["plain", "offload", "offload2", "async-offload"]),
    ("wggo", "wggo-fwd", &["plain", "offload"]),
];

/// The virtual-networking comparison (`--modes virt`): the kernel's paths for a VM or container side by side
/// with turbotun's. Each moves the same traffic between the two namespaces.
pub(crate) const VIRT_MODES: &[&str] = &["veth", "veth-bridge", "turbotun-tap-bridge", "turbotun-offload"];

/// The modes `--quick` runs.
pub(crate) const QUICK_MODES: &[&str] = &["veth", "turbotun-offload", "turbotun-plain", "tunrs-offload"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// veth pair between the two namespaces.
    Veth,
    /// Each namespace's veth goes to a port of one Linux bridge in a third namespace.
    VethBridge,
    /// Loopback inside one namespace.
    Loopback,
    /// A forwarder process: `PROGRAM [PREFIX_ARGS..] DEV_A DEV_B [ARGS..]`.
    Forwarder { program: PathBuf, prefix_args: Vec<String>, args: Vec<String> },
    /// A forwarder between two TAP devices, each a port of a bridge whose other port is a veth to one of the
    /// namespaces: the path of a VM's TAP device on a host bridge, with the forwarder as the VM.
    BridgedForwarder { program: PathBuf, prefix_args: Vec<String>, args: Vec<String> },
    /// A tunnel between the two namespaces over a veth underlay (`--tunnel`, tunnel/).
    Tunnel(Link),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mode {
    /// `veth`, `loopback`, `turbotun-offload`, `tunrs-plain`, ...
    pub label: String,
    /// `baseline`, `turbotun`, `tunrs`, `wggo`.
    pub family: &'static str,
    pub kind: Kind,
    /// How it runs differently here than its name says (`--list` shows it, and the bench when it runs it).
    pub note: Option<String>,
}

impl Mode {
    pub(crate) fn is_peer(&self) -> bool {
        PEERS.iter().any(|(f, _, _)| *f == self.family)
    }

    pub(crate) fn is_forwarder(&self) -> bool {
        matches!(self.kind, Kind::Forwarder { .. } | Kind::BridgedForwarder { .. })
    }

    /// Label without the family prefix (`offload` for `turbotun-offload`), used for flamegraph file names.
    pub(crate) fn short(&self) -> &str {
        self.label.strip_prefix(&format!("{}-", self.family)).unwrap_or(&self.label)
    }
}

/// A mode the bench knows about but cannot run here, and why.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Unavailable {
    pub mode: String,
    pub reason: String,
}

/// The bench/peers directory: $TURBOTUN_PEERS_DIR, the source tree this binary was built from, or a
/// `bench/peers` directory above the executable.
pub(crate) fn peers_dir(exe: &Path) -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TURBOTUN_PEERS_DIR") {
        return Some(PathBuf::from(d));
    }
    let compiled = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/peers");
    if compiled.is_dir() {
        return compiled.canonicalize().ok().or(Some(compiled));
    }
    exe.ancestors().map(|a| a.join("bench/peers")).find(|p| p.is_dir())
}

/// Every mode in report order, plus the ones that cannot run here. Peers are listed if their binary exists or
/// `build.sh` could build it (checked later by [`ensure_peers_built`]).
pub(crate) fn all_modes(exe: &Path, support: &Support, peers: Option<&Path>) -> (Vec<Mode>, Vec<Unavailable>) {
    let mut modes = vec![
        Mode { label: "veth".into(), family: "baseline", kind: Kind::Veth, note: None },
        Mode { label: "loopback".into(), family: "baseline", kind: Kind::Loopback, note: None },
        Mode { label: "veth-bridge".into(), family: "baseline", kind: Kind::VethBridge, note: None },
    ];
    let mut unavailable = Vec::new();
    // The ceiling: one read and one write per frame, virtio header untouched (bench/ceiling.rs).
    match support.missing(&[Need::VnetHdr]) {
        None => modes.push(Mode {
            label: "ceiling".into(),
            family: "baseline",
            kind: Kind::Forwarder {
                program: exe.to_path_buf(),
                prefix_args: vec!["bench".into(), "--ceiling-fwd".into()],
                args: vec![],
            },
            note: None,
        }),
        Some(reason) => unavailable.push(Unavailable { mode: "ceiling".into(), reason }),
    }
    for m in TURBOTUN_MODES {
        let label = format!("turbotun-{}", m.label);
        if let Some(reason) = support.missing(m.needs) {
            unavailable.push(Unavailable { mode: label, reason });
            continue;
        }
        let note = match &support.uring {
            Err(why) if m.uring_by_default => {
                let twin = match m.label.strip_prefix("uring-") {
                    Some(blocking) => blocking.to_string(),
                    None => format!("{}-block", m.label),
                };
                Some(format!("io_uring forwarding unavailable ({why}): blocking reads, as turbotun-{twin}"))
            }
            _ => None,
        };
        modes.push(Mode {
            label,
            family: "turbotun",
            kind: Kind::Forwarder {
                program: exe.to_path_buf(),
                prefix_args: vec!["fwd".into(), "--json".into()],
                args: m.args.iter().map(|s| s.to_string()).collect(),
            },
            note,
        });
    }
    let tap_bridge = "turbotun-tap-bridge".to_string();
    match support.missing(&[Need::VnetHdr]) {
        Some(reason) => unavailable.push(Unavailable { mode: tap_bridge, reason }),
        None => modes.push(Mode {
            label: tap_bridge,
            family: "turbotun",
            kind: Kind::BridgedForwarder {
                program: exe.to_path_buf(),
                prefix_args: vec!["fwd".into(), "--json".into()],
                args: ["--mode", "offload", "--tap"].iter().map(|s| s.to_string()).collect(),
            },
            note: None,
        }),
    }
    for (family, bin, peer_modes) in PEERS {
        for m in *peer_modes {
            let label = format!("{family}-{m}");
            match peers {
                Some(dir) => modes.push(Mode {
                    label,
                    family,
                    kind: Kind::Forwarder {
                        program: dir.join("bin").join(bin),
                        prefix_args: vec![],
                        args: vec!["--mode".into(), m.to_string()],
                    },
                    note: None,
                }),
                None => unavailable
                    .push(Unavailable { mode: label, reason: "bench/peers not found (set TURBOTUN_PEERS_DIR)".into() }),
            }
        }
    }
    (modes, unavailable)
}

/// The family of a turbotun mode run by the `--baseline` build: neither turbotun's own nor a peer's.
pub(crate) const BASELINE_BUILD: &str = "turbotun@baseline";

/// Each selected turbotun forwarder mode followed by its A/B twin: the same arguments run by another build of
/// turbotun (`--baseline`), labelled `MODE@baseline`, placed right after its mode so that every round runs the
/// two builds one after the other.
pub(crate) fn with_baseline_twins(selected: Vec<Mode>, baseline: &Path) -> Vec<Mode> {
    let mut out = Vec::with_capacity(selected.len() * 2);
    for m in selected {
        let twin_kind = match &m.kind {
            Kind::Forwarder { prefix_args, args, .. } if m.family == "turbotun" => Some(Kind::Forwarder {
                program: baseline.to_path_buf(),
                prefix_args: prefix_args.clone(),
                args: args.clone(),
            }),
            Kind::BridgedForwarder { prefix_args, args, .. } if m.family == "turbotun" => {
                Some(Kind::BridgedForwarder {
                    program: baseline.to_path_buf(),
                    prefix_args: prefix_args.clone(),
                    args: args.clone(),
                })
            }
            _ => None,
        };
        let twin = twin_kind.map(|kind| Mode {
            label: format!("{}@baseline", m.label),
            family: BASELINE_BUILD,
            kind,
            note: m.note.clone(),
        });
        out.push(m);
        out.extend(twin);
    }
    out
}

/// Select modes by a comma list: exact labels, a label without the `turbotun-` prefix, or a family name
/// (`turbotun`, `tunrs`, `wggo`, `peers`, `baseline`, `virt` for [`VIRT_MODES`]).
pub(crate) fn select_modes(all: &[Mode], unavailable: &[Unavailable], filter: &[String]) -> Result<Vec<Mode>> {
    let mut out: Vec<Mode> = Vec::new();
    for f in filter {
        let f = f.trim();
        if f.is_empty() {
            continue;
        }
        let matched: Vec<&Mode> = all
            .iter()
            .filter(|m| {
                m.label == f
                    || (m.family == "turbotun" && m.short() == f)
                    || m.family == f
                    || (f == "peers" && m.is_peer())
                    || (f == "baselines" && m.family == "baseline")
                    || (f == "virt" && VIRT_MODES.contains(&m.label.as_str()))
            })
            .collect();
        if matched.is_empty() {
            let na = unavailable.iter().find(|u| u.mode == f || u.mode == format!("turbotun-{f}"));
            match na {
                Some(u) => eprintln!("turbotun bench: mode {} not available: {}", u.mode, u.reason),
                None => anyhow::bail!(
                    "unknown mode {f:?}; known: {}",
                    all.iter().map(|m| m.label.as_str()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
        for m in matched {
            if !out.contains(m) {
                out.push(m.clone());
            }
        }
    }
    // Keep report order.
    out.sort_by_key(|m| all.iter().position(|a| a == m));
    Ok(out)
}

/// Build (or refresh: build.sh skips an up-to-date binary) the selected peers with `bench/peers/build.sh
/// FAMILY`, one family at a time so one missing toolchain does not stop the other. Returns the modes whose
/// binary is there afterwards, and whether a build failed (so that its log is kept); marks the rest
/// unavailable with what to install.
pub(crate) fn ensure_peers_built(
    modes: Vec<Mode>,
    peers: Option<&Path>,
    unavailable: &mut Vec<Unavailable>,
    log_dir: &Path,
) -> Result<(Vec<Mode>, bool)> {
    let mut notes: Vec<(&str, String)> = Vec::new();
    for (family, bin, _) in PEERS {
        if !modes.iter().any(|m| m.family == *family) {
            continue;
        }
        let Some(dir) = peers else { break };
        if let Some(note) = build_peer(dir, family, bin, log_dir)? {
            notes.push((family, note));
        }
    }
    let mut out = Vec::new();
    for m in modes {
        let missing = match &m.kind {
            Kind::Forwarder { program, .. } if m.is_peer() => !program.is_file(),
            _ => false,
        };
        if missing {
            // build.sh looks for the toolchains where they usually are and names what to install.
            let need = notes
                .iter()
                .find(|(n, _)| *n == m.family)
                .map(|(_, s)| s.clone())
                .unwrap_or_else(|| "peer binary missing".into());
            if !unavailable.iter().any(|u| u.mode == m.label) {
                eprintln!("turbotun bench: skipping {}: {need}", m.label);
                unavailable.push(Unavailable { mode: m.label, reason: need });
            }
        } else {
            if let Some((_, note)) = notes.iter().find(|(n, _)| *n == m.family) {
                eprintln!("turbotun bench: {note}; using the existing {} binary", m.family);
            }
            out.push(m);
        }
    }
    Ok((out, !notes.is_empty()))
}

/// Build (or refresh) one peer with `bench/peers/build.sh TARGET` in `dir`, its output in
/// `log_dir/build-TARGET.log`; `bin` is the binary it makes under `dir/bin`. Returns why it failed, if it did.
pub(crate) fn build_peer(dir: &Path, target: &str, bin: &str, log_dir: &Path) -> Result<Option<String>> {
    let script = dir.join("build.sh");
    if !script.is_file() {
        return Ok(Some(format!("{} does not exist", script.display())));
    }
    if !dir.join("bin").join(bin).is_file() {
        eprintln!("turbotun bench: building {bin} with {} (first use; takes a few minutes)", script.display());
    }
    let log = log_dir.join(format!("build-{target}.log"));
    let logf = std::fs::File::create(&log).context("create build log")?;
    let status = Command::new("bash")
        .arg(&script)
        .arg(target)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .status()
        .with_context(|| format!("run {}", script.display()))?;
    if status.success() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
    Ok(Some(format!("build.sh {target} failed: {last} (log {})", log.display())))
}

/// First executable named `name` on $PATH.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// One end of a tunnel, as the bench starts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub name: &'static str,
    pub program: PathBuf,
    /// `{dev}`, `{local}` and `{remote}` stand for the device and the underlay's socket addresses.
    pub argv: Vec<&'static str>,
    pub env: Vec<(String, String)>,
    /// Configured with `wg set` through its configuration socket, with these keys; None: a `ready` line.
    pub wg: Option<Arc<WgSetup>>,
    /// Other peers configured beside the other end, with `wg addconf` (see `wgscale::write_peers`).
    pub crowd: usize,
}

/// What configuring WireGuard endpoints takes: the `wg` tool and a key pair for each side.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WgSetup {
    pub tool: PathBuf,
    /// A's key, B's key.
    pub keys: [WgKey; 2],
}

/// A private key in a file (mode 0600, in a private directory) and its public key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WgKey {
    pub private: PathBuf,
    pub public: String,
}

/// How a run's namespaces are joined (`modes::Kind::Tunnel`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Link {
    Veth,
    Vxlan,
    /// A's endpoint, B's endpoint, and whether B's is flooded with handshake initiations during the window.
    Pair(Box<[Endpoint; 2]>, Option<Flood>),
}

/// A flood of WireGuard handshake initiations (random content, valid mac1) at B's endpoint over a run's window,
/// sent from A's namespace by `turbotun bench --wg-flood` as fast as one thread can (the `-flood` kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flood {
    /// How many addresses on A's underlay the initiations come from, in turn.
    pub sources: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn support(vnet_hdr: bool, multi_queue: bool, uring: Result<(), String>) -> Support {
        Support { tun: Ok(TunFeatures { vnet_hdr, multi_queue }), uring }
    }

    #[test]
    fn table_and_selection() {
        let exe = Path::new("/x/turbotun");
        let (all, na) = all_modes(exe, &support(true, true, Ok(())), Some(Path::new("/p")));
        let labels: Vec<&str> = all.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(
            &labels[..10],
            [
                "veth",
                "loopback",
                "veth-bridge",
                "ceiling",
                "turbotun-plain",
                "turbotun-offload",
                "turbotun-offload-partial",
                "turbotun-passthrough",
                "turbotun-uring-offload",
                "turbotun-uring-offload-fixed"
            ]
        );
        assert!(labels.contains(&"turbotun-threads2") && labels.contains(&"turbotun-plain-block"));
        assert!(labels.contains(&"wggo-offload"));
        assert!(na.is_empty(), "{na:?}");
        assert!(all.iter().all(|m| m.note.is_none()));
        let sel = select_modes(&all, &na, &["tunrs-offload".into(), "veth".into(), "offload".into()]).unwrap();
        let sel: Vec<&str> = sel.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(sel, ["veth", "turbotun-offload", "tunrs-offload"]);
        let sel = select_modes(&all, &na, &["wggo".into()]).unwrap();
        assert_eq!(sel.len(), 2);
        let sel = select_modes(&all, &na, &["virt".into()]).unwrap();
        let sel: Vec<&str> = sel.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(sel, ["veth", "veth-bridge", "turbotun-offload", "turbotun-tap-bridge"]);
        assert!(select_modes(&all, &na, &["nonsense".into()]).is_err());
    }

    #[test]
    fn a_baseline_build_twins_each_turbotun_forwarder_and_nothing_else() {
        let exe = Path::new("/x/turbotun");
        let (all, na) = all_modes(exe, &support(true, true, Ok(())), Some(Path::new("/p")));
        let filter = ["veth".into(), "offload".into(), "tap-bridge".into(), "tunrs-offload".into()];
        let sel = with_baseline_twins(select_modes(&all, &na, &filter).unwrap(), Path::new("/old/turbotun"));
        let labels: Vec<&str> = sel.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "veth",
                "turbotun-offload",
                "turbotun-offload@baseline",
                "turbotun-tap-bridge",
                "turbotun-tap-bridge@baseline",
                "tunrs-offload"
            ]
        );
        for (mode, twin) in [(&sel[1], &sel[2]), (&sel[3], &sel[4])] {
            assert_eq!(twin.family, BASELINE_BUILD);
            match (&mode.kind, &twin.kind) {
                (
                    Kind::Forwarder { program: p, prefix_args: pa, args: a },
                    Kind::Forwarder { program: tp, prefix_args: tpa, args: ta },
                )
                | (
                    Kind::BridgedForwarder { program: p, prefix_args: pa, args: a },
                    Kind::BridgedForwarder { program: tp, prefix_args: tpa, args: ta },
                ) => {
                    assert_eq!((p.as_path(), tp.as_path()), (exe, Path::new("/old/turbotun")));
                    assert_eq!((pa, a), (tpa, ta), "the twin runs the same arguments");
                }
                other => panic!("twin of another kind: {other:?}"),
            }
        }
    }

    #[test]
    fn availability_from_the_probes() {
        let exe = Path::new("/x/turbotun");
        // No multiqueue, no io_uring: multiqueue is not available, plain and passthrough say how they run.
        let (all, na) = all_modes(exe, &support(true, false, Err("Linux < 6.7".into())), None);
        assert_eq!(na.iter().filter(|u| u.mode.starts_with("turbotun-")).count(), 1);
        let mq = na.iter().find(|u| u.mode == "turbotun-multiqueue").unwrap();
        assert!(mq.reason.contains("IFF_MULTI_QUEUE") && !mq.reason.contains("IFF_VNET_HDR"), "{}", mq.reason);
        let plain = all.iter().find(|m| m.label == "turbotun-plain").unwrap();
        assert!(plain.note.as_deref().is_some_and(|n| n.contains("Linux < 6.7") && n.contains("plain-block")));
        let uring_offload = all.iter().find(|m| m.label == "turbotun-uring-offload").unwrap();
        assert!(uring_offload.note.as_deref().is_some_and(|n| n.ends_with("as turbotun-offload")));
        assert!(all.iter().find(|m| m.label == "turbotun-offload").unwrap().note.is_none());
        // unavailable: a note, not an error
        assert!(select_modes(&all, &na, &["multiqueue".into()]).unwrap().is_empty());
        // Without the virtio header only the plain modes remain.
        let (all, _) = all_modes(exe, &support(false, true, Ok(())), None);
        let turbotun: Vec<&str> = all.iter().filter(|m| m.family == "turbotun").map(|m| m.label.as_str()).collect();
        assert_eq!(turbotun, ["turbotun-plain", "turbotun-plain-block"]);
        assert!(!all.iter().any(|m| m.label == "ceiling"), "the ceiling needs the virtio header too");
        assert!(!all.iter().any(|m| m.label == "turbotun-tap-bridge"), "the TAP bridge mode needs the virtio header");
        // No tun driver, no peers: the kernel baselines only.
        let none = Support { tun: Err("no /dev/net/tun".into()), uring: Ok(()) };
        let (all, na) = all_modes(exe, &none, None);
        assert_eq!(all.len(), 3);
        // Unavailable: every turbotun mode, the ceiling, the TAP bridge mode and the six peer modes.
        assert_eq!(na.len(), TURBOTUN_MODES.len() + 8);
        assert!(na[0].reason.contains("no /dev/net/tun"), "{:?}", na[0]);
    }
}
