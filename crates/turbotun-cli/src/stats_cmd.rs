//! `turbotun stats [NAME]`: the counters of a running `fwd`, `tunnel`, `wg` or `vhost-user`, read from its counters
//! socket.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use turbotun::stats_socket::{self, Report, STATS_DIR};

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The engine: its device name (a forwarder's first device), or the path of its counters socket. An engine
    /// in another network namespace is NAME@NETNS (its `ip netns` name, or net-INODE); NAME alone finds it when
    /// it is the only one of that name. Without it, every engine serving counters in /run/turbotun.
    pub name: Option<String>,
    /// Print JSON (one object per engine, one per line) instead of text.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print Prometheus's text format (for node_exporter's textfile collector or a scrape through a wrapper).
    /// A WireGuard endpoint's peers come as WireGuard's usual exporter names them (wireguard_peer_*).
    #[arg(long)]
    pub prometheus: bool,
    /// List a WireGuard endpoint's peers as `wg show` does, with each one's drops.
    #[arg(long, conflicts_with_all = ["prometheus", "json"])]
    pub peers: bool,
    /// With --peers: busiest first (traffic) or latest handshake first (handshake).
    #[arg(long, value_enum, default_value = "traffic", requires = "peers")]
    pub sort: crate::counters::PeerOrder,
}

pub fn run(args: &StatsArgs) -> Result<()> {
    let reports = match &args.name {
        Some(name) => vec![stats_socket::read(&socket_of(name)?).map_err(|e| {
            let serving: Vec<String> =
                stats_socket::list(Path::new(STATS_DIR)).into_iter().map(|(name, _)| name).collect();
            if serving.is_empty() {
                anyhow::anyhow!("{e}")
            } else {
                anyhow::anyhow!("{e} (serving now: {}; a forwarder goes by its first device)", serving.join(", "))
            }
        })?],
        None => {
            let found = stats_socket::list(Path::new(STATS_DIR));
            let mut reports = Vec::new();
            let mut unread = Vec::new();
            for (name, path) in found {
                match stats_socket::read(&path) {
                    Ok(report) => reports.push(report),
                    Err(e) => unread.push(format!("{name}: {e}")),
                }
            }
            match (reports.is_empty(), unread.is_empty()) {
                // Nothing read: one error, naming what could not be read if anything was found.
                (true, true) if !args.prometheus => {
                    bail!("no turbotun {} serves counters in {STATS_DIR} now", stats_socket::SERVERS)
                }
                (true, false) => bail!("{}", unread.join("; ")),
                // A stale socket (its process killed) or one this user may not read beside those read: said,
                // not fatal.
                _ => unread.iter().for_each(|e| eprintln!("turbotun stats: {e}")),
            }
            reports
        }
    };
    if args.prometheus {
        crate::out_raw!("{}", crate::counters::prometheus(&reports));
    } else if args.json {
        for report in &reports {
            crate::out!("{}", crate::counters::to_json(report));
        }
    } else if args.peers {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        for report in &reports {
            crate::out!("{}", heading(report));
            if report.kind != "wireguard" {
                crate::out!("(not a WireGuard endpoint: no peers)");
                continue;
            }
            crate::out_raw!("{}", crate::counters::peer_table(report, args.sort, now));
        }
    } else {
        for report in &reports {
            crate::out!("{}", heading(report));
            crate::out!("{}", crate::counters::summary(report));
        }
    }
    Ok(())
}

/// `tta: forwarder tta <-> ttb (mode offload, io block), pid 4242` (then ` in netns blue` outside the initial
/// namespace).
fn heading(report: &Report) -> String {
    let settings: Vec<String> = report.settings.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let devices = report.devices.join(" <-> ");
    let settings = if settings.is_empty() { String::new() } else { format!(" ({})", settings.join(", ")) };
    let netns = report.netns.as_ref().map_or(String::new(), |netns| format!(" in netns {netns}"));
    format!("{}: {} {devices}{settings}, pid {}{netns}", report.name, report.kind, report.pid)
}

/// A name as given ([`stats_socket::locate`]: this namespace's engine first), or the path of its socket
/// (anything with a `/` is a path).
fn socket_of(name: &str) -> Result<PathBuf> {
    if name.contains('/') {
        Ok(PathBuf::from(name))
    } else {
        Ok(stats_socket::locate(name)?)
    }
}
