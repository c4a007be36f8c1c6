//! The modes the bench can run: kernel baselines, turbotun's forwarder modes and the peers under `bench/peers/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

/// turbotun forwarder modes: (label, arguments after `fwd DEV_A DEV_B`). Adding a mode is one line; a mode
/// whose flags `turbotun fwd --help` does not mention is listed as not available.
pub const TURBOTUN_MODES: &[(&str, &[&str])] = &[
    ("plain", &["--mode", "plain"]),
    ("offload", &["--mode", "offload"]),
    ("passthrough", &["--mode", "passthrough"]),
    ("threads2", &["--mode", "offload", "--threads", "2"]),
    ("multiqueue", &["--mode", "offload", "--queues", "2"]),
    // plain and passthrough use io_uring by default where the kernel has it; these are the blocking paths.
    ("plain-block", &["--mode", "plain", "--io", "block"]),
    ("passthrough-block", &["--mode", "passthrough", "--io", "block"]),
    ("async", &["--mode", "offload", "--async"]),
];

/// Peers: (family, binary under bench/peers/bin, the package that builds it, modes).
pub const PEERS: &[(&str, &str, &[&str])] = &[
    ("tunrs", "tunrs-fwd", &["plain", "offload", "offload2", "async-offload"]),
    ("wggo", "wggo-fwd", &["plain", "offload"]),
];

/// The modes `--quick` runs.
pub const QUICK_MODES: &[&str] = &["veth", "turbotun-offload", "turbotun-plain", "tunrs-offload"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// veth pair between the two namespaces.
    Veth,
    /// Loopback inside one namespace.
    Loopback,
    /// A forwarder process: `PROGRAM [PREFIX_ARGS..] DEV_A DEV_B [ARGS..]`.
    Forwarder { program: PathBuf, prefix_args: Vec<String>, args: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mode {
    /// `veth`, `loopback`, `turbotun-offload`, `tunrs-plain`, ...
    pub label: String,
    /// `baseline`, `turbotun`, `tunrs`, `wggo`.
    pub family: &'static str,
    pub kind: Kind,
}

impl Mode {
    pub fn is_peer(&self) -> bool {
        PEERS.iter().any(|(f, _, _)| *f == self.family)
    }

    pub fn is_forwarder(&self) -> bool {
        matches!(self.kind, Kind::Forwarder { .. })
    }

    /// Label without the family prefix (`offload` for `turbotun-offload`), used for flamegraph file names.
    pub fn short(&self) -> &str {
        self.label.strip_prefix(&format!("{}-", self.family)).unwrap_or(&self.label)
    }
}

/// A mode the bench knows about but cannot run here, and why.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Unavailable {
    pub mode: String,
    pub reason: String,
}

/// Does `turbotun fwd --help` accept these arguments? Flags (`--x`) must appear in the help; the value after
/// `--mode`/`--io` must appear too (clap lists possible values).
pub fn fwd_accepts(help: &str, args: &[&str]) -> bool {
    let has_word = |w: &str| help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).any(|x| x == w);
    let mut prev_flag: Option<&str> = None;
    for a in args {
        if a.starts_with("--") {
            if !has_word(a) {
                return false;
            }
            prev_flag = Some(a);
        } else {
            if matches!(prev_flag, Some("--mode") | Some("--io")) && !has_word(a) {
                return false;
            }
            prev_flag = None;
        }
    }
    true
}

/// `<current exe> fwd --help`, or why it is not there.
pub fn probe_fwd_help(exe: &Path) -> Result<String, String> {
    let out = Command::new(exe)
        .args(["fwd", "--help"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {} fwd --help: {e}", exe.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "`turbotun fwd` is not available in this build ({})",
            err.lines().next().unwrap_or("").trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The bench/peers directory: $TURBOTUN_PEERS_DIR, the source tree this binary was built from, or a
/// `bench/peers` directory above the executable.
pub fn peers_dir(exe: &Path) -> Option<PathBuf> {
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
pub fn all_modes(exe: &Path, fwd_help: &Result<String, String>, peers: Option<&Path>) -> (Vec<Mode>, Vec<Unavailable>) {
    let mut modes = vec![
        Mode { label: "veth".into(), family: "baseline", kind: Kind::Veth },
        Mode { label: "loopback".into(), family: "baseline", kind: Kind::Loopback },
    ];
    let mut unavailable = Vec::new();
    for (label, args) in TURBOTUN_MODES {
        let label = format!("turbotun-{label}");
        match fwd_help {
            Ok(help) if fwd_accepts(help, args) => modes.push(Mode {
                label,
                family: "turbotun",
                kind: Kind::Forwarder {
                    program: exe.to_path_buf(),
                    prefix_args: vec!["fwd".into()],
                    args: args.iter().map(|s| s.to_string()).collect(),
                },
            }),
            Ok(_) => unavailable.push(Unavailable {
                mode: label,
                reason: format!("`turbotun fwd` does not accept `{}` yet", args.join(" ")),
            }),
            Err(e) => unavailable.push(Unavailable { mode: label, reason: e.clone() }),
        }
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
                }),
                None => unavailable
                    .push(Unavailable { mode: label, reason: "bench/peers not found (set TURBOTUN_PEERS_DIR)".into() }),
            }
        }
    }
    (modes, unavailable)
}

/// Select modes by a comma list: exact labels, a label without the `turbotun-` prefix, or a family name
/// (`turbotun`, `tunrs`, `wggo`, `peers`, `baseline`).
pub fn select_modes(all: &[Mode], unavailable: &[Unavailable], filter: &[String]) -> Result<Vec<Mode>> {
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
pub fn ensure_peers_built(
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
        let script = dir.join("build.sh");
        if !script.is_file() {
            notes.push((family, format!("{} does not exist", script.display())));
            continue;
        }
        let fresh = !dir.join("bin").join(bin).is_file();
        if fresh {
            eprintln!("turbotun bench: building {bin} with {} (first use; takes a few minutes)", script.display());
        }
        let log = log_dir.join(format!("build-{family}.log"));
        let logf = std::fs::File::create(&log).context("create build log")?;
        let status = Command::new("bash")
            .arg(&script)
            .arg(family)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .status()
            .with_context(|| format!("run {}", script.display()))?;
        if !status.success() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
            notes.push((family, format!("build.sh {family} failed: {last} (log {})", log.display())));
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

/// First executable named `name` on $PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELP: &str = "Usage: turbotun fwd [OPTIONS] <DEV_A> <DEV_B>\n\nOptions:\n      --mode <MODE>  [default: \
                        offload] [possible values: plain, offload, passthrough]\n      --threads <N>  workers\n  -h, \
                        --help\n";

    #[test]
    fn probe_flags() {
        assert!(fwd_accepts(HELP, &["--mode", "plain"]));
        assert!(fwd_accepts(HELP, &["--mode", "offload", "--threads", "2"]));
        assert!(!fwd_accepts(HELP, &["--mode", "plain", "--io", "block"]));
        assert!(!fwd_accepts(HELP, &["--mode", "turbo"]));
        // `--threads` must not match `--thread`
        assert!(!fwd_accepts(HELP, &["--thread", "2"]));
    }

    #[test]
    fn table_and_selection() {
        let exe = Path::new("/x/turbotun");
        let (all, na) = all_modes(exe, &Ok(HELP.into()), Some(Path::new("/p")));
        let labels: Vec<&str> = all.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(&labels[..5], ["veth", "loopback", "turbotun-plain", "turbotun-offload", "turbotun-passthrough"]);
        assert!(labels.contains(&"turbotun-threads2"));
        assert!(labels.contains(&"wggo-offload"));
        assert!(na.iter().any(|u| u.mode == "turbotun-plain-block"));
        let sel = select_modes(&all, &na, &["tunrs-offload".into(), "veth".into(), "offload".into()]).unwrap();
        let sel: Vec<&str> = sel.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(sel, ["veth", "turbotun-offload", "tunrs-offload"]);
        let sel = select_modes(&all, &na, &["wggo".into()]).unwrap();
        assert_eq!(sel.len(), 2);
        assert!(select_modes(&all, &na, &["nonsense".into()]).is_err());
        // unavailable: a note, not an error
        assert!(select_modes(&all, &na, &["plain-block".into()]).unwrap().is_empty());
        let (all, na) = all_modes(exe, &Err("no fwd".into()), None);
        assert_eq!(all.len(), 2);
        assert_eq!(na.len(), TURBOTUN_MODES.len() + 6);
    }
}
