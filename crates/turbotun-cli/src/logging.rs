//! The log, on standard error: its level from `LOG_LEVEL` as wireguard-go reads it, or from `RUST_LOG`; colour
//! only on a terminal; and whether a WireGuard endpoint that goes to the background keeps it.
//!
//! - `LOG_LEVEL=verbose` (or `debug`): everything turbotun logs, down to debug (wireguard-go: its verbose log);
//!   `LOG_LEVEL=error`: errors only (wireguard-go's default); `LOG_LEVEL=silent`: nothing. Unset: warnings and
//!   errors, so that a refused configuration is seen.
//! - `RUST_LOG`, when set, takes precedence: `tracing` directives (`debug`, `turbotun_wg=trace,warn`, ...).

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use tracing_subscriber::EnvFilter;

/// The filter when neither variable says otherwise: warnings, and a vhost-user backend's front ends coming and
/// going (what an operator of VMs watches for, as DPDK's backend prints it).
const DEFAULT_FILTER: &str = "warn,turbotun::dataplane::vhost_user=info";

/// `LOG_LEVEL=verbose`: this program's crates at debug, the libraries under them at warn.
const VERBOSE_FILTER: &str = "warn,turbotun=debug,turbotun_wg=debug,turbotun_bench=debug,turbotun_cli=debug";

/// What the environment asks for: the filter, and a warning about a value that made no sense.
fn filter_from(log_level: Option<&str>, rust_log: Option<&str>) -> (String, Option<String>) {
    if let Some(directives) = rust_log.filter(|d| !d.trim().is_empty()) {
        return match EnvFilter::try_new(directives) {
            Ok(_) => (directives.to_string(), None),
            Err(e) => (DEFAULT_FILTER.into(), Some(format!("RUST_LOG={directives:?} ignored ({e}): warnings shown"))),
        };
    }
    match log_level.map(str::trim) {
        None | Some("") => (DEFAULT_FILTER.into(), None),
        Some("verbose" | "debug") => (VERBOSE_FILTER.into(), None),
        Some("error") => ("error".into(), None),
        Some("silent") => ("off".into(), None),
        Some(other) => (
            DEFAULT_FILTER.into(),
            Some(format!("LOG_LEVEL={other:?} is not verbose, error or silent: warnings shown")),
        ),
    }
}

/// Whether the environment silences the log.
fn silent() -> bool {
    filter_from(env("LOG_LEVEL").as_deref(), env("RUST_LOG").as_deref()).0 == "off"
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// What standard error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stderr {
    Terminal,
    /// systemd's journal (`JOURNAL_STREAM` names this stream), which stamps each line itself.
    Journal,
    /// A pipe or a socket: someone may read it until its end.
    Stream,
    /// A file, `/dev/null` or anything else.
    File,
}

fn stderr_kind() -> Stderr {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        return Stderr::Terminal;
    }
    // The open file itself (the link is followed to the pipe, socket or file behind it).
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else { return Stderr::File };
    let journal = env("JOURNAL_STREAM")
        .and_then(|s| {
            let (dev, ino) = s.split_once(':')?;
            Some((dev.parse::<u64>().ok()?, ino.parse::<u64>().ok()?))
        })
        .is_some_and(|(dev, ino)| meta.dev() == dev && meta.ino() == ino);
    if journal {
        Stderr::Journal
    } else if meta.file_type().is_fifo() || meta.file_type().is_socket() {
        Stderr::Stream
    } else {
        Stderr::File
    }
}

/// Sets up the log on standard error (once, at the start of either binary).
pub fn init(program: &str) {
    let (filter, warning) = filter_from(env("LOG_LEVEL").as_deref(), env("RUST_LOG").as_deref());
    let kind = stderr_kind();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER)))
        .with_writer(std::io::stderr)
        .with_ansi(kind == Stderr::Terminal);
    if kind == Stderr::Journal {
        builder.without_time().init();
    } else {
        builder.init();
    }
    if let Some(warning) = warning {
        eprintln!("{program}: {warning}");
    }
}

/// Whether a WireGuard endpoint going to the background keeps writing its log to this standard error, as
/// wireguard-go keeps it when `LOG_LEVEL` is set. Kept on a terminal, in a file and in the journal; on a pipe or
/// socket only when `LOG_LEVEL` or `RUST_LOG` asks for a log, because whoever reads it (a script capturing
/// `wg-quick up`) would otherwise wait for its end, which comes only when the endpoint ends. Never when silent.
pub fn keep_in_background() -> bool {
    if silent() {
        return false;
    }
    match stderr_kind() {
        Stderr::Terminal | Stderr::Journal | Stderr::File => true,
        Stderr::Stream => {
            env("LOG_LEVEL").is_some_and(|v| !v.trim().is_empty())
                || env("RUST_LOG").is_some_and(|v| !v.trim().is_empty())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::filter_from;

    #[test]
    fn test_log_level_and_rust_log() {
        assert_eq!(filter_from(None, None), (super::DEFAULT_FILTER.to_string(), None));
        assert_eq!(filter_from(Some("verbose"), None).0, super::VERBOSE_FILTER);
        assert_eq!(filter_from(Some("debug"), None).0, super::VERBOSE_FILTER);
        assert_eq!(filter_from(Some("error"), None).0, "error");
        assert_eq!(filter_from(Some("silent"), None).0, "off");
        let (filter, warning) = filter_from(Some("loud"), None);
        assert_eq!(filter, super::DEFAULT_FILTER);
        assert!(warning.unwrap().contains("not verbose, error or silent"));
        // RUST_LOG wins over LOG_LEVEL; a bad one is said and ignored.
        assert_eq!(filter_from(Some("silent"), Some("turbotun_wg=trace")).0, "turbotun_wg=trace");
        let (filter, warning) = filter_from(None, Some("turbotun=notalevel"));
        assert_eq!(filter, super::DEFAULT_FILTER);
        assert!(warning.unwrap().contains("RUST_LOG"));
    }
}
