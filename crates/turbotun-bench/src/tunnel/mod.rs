//! `turbotun bench --tunnel`: VPN-style tunnels between two network namespaces, measured with iperf3.
//!
//! Each run gets two fresh namespaces joined by a veth pair, the underlay (10.201.0.1/24 <-> 10.201.0.2/24, MTU
//! 1500). Over it each tunnel kind puts a device in each namespace (10.202.0.1/24 <-> 10.202.0.2/24, MTU 1420):
//! the kernel's VXLAN, or a userspace endpoint process in each namespace (`turbotun tunnel`, `turbotun wg`,
//! wireguard-go, boringtun, GotaTun). `veth` runs iperf3 over the underlay itself. The iperf3 server runs in B, the
//! client in A, and the runs, their interleaving, the samples and the summaries are those of the forwarder bench
//! (`lib.rs::measure`, `runner.rs`, `report.rs::summarize`); the set-up of each run is `topo.rs`'s, like every
//! topology's; this folder adds the kinds (`kinds.rs`), and the tables of per-endpoint CPU, peak RSS and system
//! calls per GB (`tables.rs`).
//!
//! WireGuard endpoints follow WireGuard's cross-platform userspace interface: each serves
//! `/var/run/wireguard/NAME.sock`, which is not per namespace, so every endpoint's device name is unique to the
//! run (`tt<pid>r<run>ta`, `...tb`); the bench waits until the socket accepts connections, configures it with
//! the real `wg set` (keys from `wg genkey` in a private directory), and removes any socket left behind.

use std::path::Path;

use anyhow::{bail, Result};

use crate::chart;
use crate::iperf::{self, Traffic};
use crate::modes::{self, Kind, Link};
use crate::perfstat;
use crate::report::{ReportHeader, Summary};
use crate::runner::Ctx;
use crate::topo::{INNER, PREFIX_LEN, TUNNEL_MTU, UNDERLAY, UNDERLAY_MTU};
use crate::{Options, Plan};

mod kinds;
mod tables;
#[cfg(test)]
mod tests;

pub(crate) use kinds::print_list;
pub(crate) use kinds::Resolved;
use kinds::{resolve, select_kinds, sweep_stale_sockets, KindSpec, Resolver};
use tables::{flood_rows, markdown, rows, TunnelReport};

/// The traffic through each tunnel. The UDP datagrams are 1400-byte IP datagrams (1372 bytes of payload), so
/// that each is one packet at the tunnel's MTU of 1420: a 1400-byte payload would be fragmented in two.
pub(crate) const TUNNEL_TRAFFIC: &[Traffic] = &[
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
pub(crate) const QUICK_TRAFFIC: &[&str] = &["tcp", "udp1372"];

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

/// The kinds `labels` (and their `@baseline` twins with `--baseline`) as `--tunnel` runs them, for a bench that
/// builds on its WireGuard pairs (`--wg-storm`); the keys' private directory lives as long as the value.
pub(crate) fn resolve_kinds(ctx: &Ctx, args: &Options, peers: Option<&Path>, labels: &[&str]) -> Result<Resolved> {
    let names: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
    resolve_selected(ctx, args, peers, &select_kinds(Some(&names), args.baseline.is_some())?)
}

/// `kinds` made into modes (peers built on first use, keys made), once stale configuration sockets are gone.
fn resolve_selected(ctx: &Ctx, args: &Options, peers: Option<&Path>, kinds: &[&KindSpec]) -> Result<Resolved> {
    sweep_stale_sockets();
    let mut resolver = Resolver {
        exe: &ctx.exe,
        peers,
        log_dir: &ctx.log_dir,
        build: true,
        wg: modes::which("wg"),
        baseline: args.baseline.clone(),
        found: Vec::new(),
        build_failed: false,
    };
    resolve(kinds, &mut resolver)
}

/// Every selected kind that can run, over every traffic kind, interleaved; then the JSON, the chart and the
/// Markdown. Returns how many runs failed and whether a peer build failed.
pub(crate) fn run(ctx: &mut Ctx, args: &Options, peers: Option<&Path>) -> Result<(usize, bool)> {
    let traffic = select_traffic(args)?;
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 3 });
    anyhow::ensure!(reps > 0, "nothing to do: --reps must be at least 1");
    let kinds = select_kinds(args.tunnel_kinds.as_deref(), args.baseline.is_some())?;
    let resolved = resolve_selected(ctx, args, peers, &kinds)?;
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
    crate::warn_about(&resolved.modes);
    let plan = Plan { modes: resolved.modes.clone(), traffic: traffic.clone(), duration: ctx.duration, reps };
    let started_unix = crate::now_unix();
    let (runs, failures) = crate::measure(ctx, &plan, None)?;
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
        flood_rate_pps: ctx.flood_rate_pps,
        rows,
        runs,
    };
    crate::write_json(args.json.as_deref(), &report)?;
    if let Some(p) = &args.chart {
        let summary: Vec<Summary> = report.rows.iter().map(|r| r.summary.clone()).collect();
        let title = format!(
            "turbotun bench --tunnel — {} s × {} rep(s), {}",
            report.duration_s, report.reps, report.header.kernel
        );
        chart::write_bar_chart(p, &summary, &traffic, &title, chart::Metric::Gbps)?;
        eprintln!("turbotun bench: wrote {}", p.display());
    }
    crate::print_markdown(&markdown(&report, &traffic));
    Ok((failures, resolved.build_failed))
}
