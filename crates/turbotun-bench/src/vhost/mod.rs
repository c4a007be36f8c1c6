//! `turbotun bench --vhost-user`: a vhost-user-net backend between a guest's virtqueues and a TAP, turbotun's
//! (`turbotun vhost-user`) against DPDK's reference backend, with the same front end for both.
//!
//! Each run gets a fresh private namespace. The backend serves a vhost-user socket in the bench's private log
//! directory and writes the guest's frames into a TAP in the namespace (no address, IPv6 off: only the guest's
//! frames cross it). The front end is DPDK's virtio-user in `dpdk-testpmd`, `txonly` with 64-byte frames: it
//! polls lcore 0 and fills its transmit ring as fast as the backend empties it. The backends:
//!
//! - `turbotun`: `turbotun vhost-user` as a subprocess of the bench, pinned to CPU 1 (`taskset`); it sleeps on
//!   its kick eventfd when the ring is empty.
//! - `dpdk`: a second testpmd, a `net_vhost` port and a `net_tap` port forwarded with `io` (`--port-topology
//!   chained`); its forwarding lcore polls CPU 1 without pause.
//!
//! Measured over the window: the frames the kernel counted into the TAP (`rx_packets` over netlink), and the
//! backend process's CPU time (`/proc/PID/stat`, every thread). A polling backend costs a whole core whatever it
//! moves, so the comparison is packets per second per CPU-second the backend spent, not packets per second
//! alone. Lost frames are counted over the whole run: the front end's port `TX-packets` (frames it put in the
//! ring) less the TAP's `rx_packets` once the ring has drained.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};

use crate::modes::{which, Unavailable};
use crate::report::ReportHeader;
use crate::runner::{interrupted, Ctx};
use crate::testpmd;
use crate::Options;

mod runs;
mod summary;
#[cfg(test)]
mod tests;

use runs::{run_one, run_tcp};
use summary::summarize;
pub(crate) use summary::{markdown, VhostReport, VhostRun};

/// The front end's forwarding lcore (CPU 0) and the backends' CPU (1): never the same core.
pub(super) const FRONT_END_MAIN_LCORE: u32 = 1;
pub(super) const BACKEND_CPU: u32 = 1;
/// The DPDK backend's command line stays on lcore 0, so that it forwards on lcore 1.
pub(super) const DPDK_BACKEND_MAIN_LCORE: u32 = 0;
/// The front end's frames, bytes on the wire without the FCS (testpmd's `set txpkts`).
pub(crate) const FRAME_LEN: u32 = 64;
/// From the front end's `start` to the window: the rings fill and the backend reaches its steady state.
pub(super) const WARMUP: Duration = Duration::from_secs(1);
/// The goal of issue 31: turbotun's packets per backend CPU-second over DPDK's.
pub(crate) const GOAL_PPS_PER_CPU: f64 = 1.5;

/// Which backend serves the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backend {
    Turbotun,
    Dpdk,
}

/// How the TCP rows' guest reaches the TAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TcpPath {
    /// TSO negotiated: 64 KiB super-packets through `turbotun vhost-user`.
    Tso,
    /// No offload negotiated: MSS-sized frames with their checksums through `turbotun vhost-user`.
    NoOffload,
    /// No backend: the same super-packets written from guest memory into the TAP, one write each.
    Ceiling,
}

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// 64 B frames from testpmd's virtio-user through a backend into the TAP.
    Pps(Backend),
    /// The synthetic guest's TCP connection to a socket in the TAP's namespace.
    Tcp(TcpPath),
}

/// One row of the report.
#[derive(Debug)]
pub(crate) struct RowSpec {
    pub label: &'static str,
    pub description: &'static str,
    kind: Kind,
    /// The row's backend is the `--baseline` build of turbotun (the A/B of a change); run only with it.
    baseline: bool,
}

pub(crate) const ROWS: &[RowSpec] = &[
    RowSpec {
        label: "turbotun",
        description: "64 B frames, testpmd virtio-user txonly → `turbotun vhost-user` (pinned to CPU 1, sleeps when \
                      idle) → TAP",
        kind: Kind::Pps(Backend::Turbotun),
        baseline: false,
    },
    RowSpec {
        label: "dpdk",
        description: "64 B frames, testpmd virtio-user txonly → DPDK's testpmd net_vhost → net_tap, fwd io (polls \
                      CPU 1) → TAP",
        kind: Kind::Pps(Backend::Dpdk),
        baseline: false,
    },
    RowSpec {
        label: "tso",
        description:
            "TCP from the synthetic guest (turbotun::vhost_user::frontend) to a socket in the TAP's namespace, \
                      TSO negotiated: 64 KiB super-packets (gso TCPV4, MSS 1460) through `turbotun vhost-user` \
                      (CPU 1)",
        kind: Kind::Tcp(TcpPath::Tso),
        baseline: false,
    },
    RowSpec {
        label: "no-offload",
        description: "the same connection with no offload negotiated: 1460-byte segments in 1514-byte frames, \
                      checksums complete, through `turbotun vhost-user` (CPU 1)",
        kind: Kind::Tcp(TcpPath::NoOffload),
        baseline: false,
    },
    RowSpec {
        label: "ceiling",
        description: "the same TSO super-packets written from the same kind of guest memory into the TAP, one write \
                      each, no virtio processing and no backend",
        kind: Kind::Tcp(TcpPath::Ceiling),
        baseline: false,
    },
    RowSpec {
        label: "turbotun@baseline",
        description: "the `turbotun` row with the --baseline build's `turbotun vhost-user`",
        kind: Kind::Pps(Backend::Turbotun),
        baseline: true,
    },
    RowSpec {
        label: "tso@baseline",
        description: "the `tso` row with the --baseline build's `turbotun vhost-user`",
        kind: Kind::Tcp(TcpPath::Tso),
        baseline: true,
    },
    RowSpec {
        label: "no-offload@baseline",
        description: "the `no-offload` row with the --baseline build's `turbotun vhost-user`",
        kind: Kind::Tcp(TcpPath::NoOffload),
        baseline: true,
    },
];

/// The reference row of the ratio.
pub(super) const REFERENCE: &str = "dpdk";
/// Issue 31's goals for the TCP rows: tso over no-offload, and tso over the ceiling, in Gbps.
pub(crate) const GOAL_TSO_NO_OFFLOAD: f64 = 5.0;
pub(crate) const GOAL_TSO_CEILING: f64 = 0.8;

/// Why a row cannot run here, or `None`.
pub(super) fn unavailable(row: &RowSpec) -> Option<String> {
    if crate::cpus() < 2 {
        return Some(format!(
            "needs 2 CPUs (the front end polls one, the backend runs on the other); this machine has {}",
            crate::cpus()
        ));
    }
    match row.kind {
        // testpmd is the front end of the packet rows, and the backend of `dpdk`.
        Kind::Pps(backend) => testpmd::missing().map(|m| match backend {
            Backend::Turbotun => format!("{m}: testpmd's virtio-user is the front end"),
            Backend::Dpdk => format!("{m}: testpmd is the front end and DPDK's backend"),
        }),
        Kind::Tcp(TcpPath::Ceiling) => None,
        Kind::Tcp(_) => which("taskset").is_none().then(|| "missing taskset (apt-get install util-linux)".into()),
    }
}

/// `turbotun bench --vhost-user --list`.
pub(crate) fn print_list() {
    println!("vhost-user rows (those @baseline only with --baseline):");
    for row in ROWS {
        let state = unavailable(row).map(|r| format!(" (not available: {r})")).unwrap_or_default();
        println!("  {:<10} {}{state}", row.label, row.description);
    }
    println!("quick: every row, 1 repetition of 1 s");
}

/// Every row that can run, `reps` times interleaved; then the JSON and the Markdown. Returns how many runs
/// failed.
pub(crate) fn run(ctx: &mut Ctx, args: &Options) -> Result<usize> {
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 3 });
    anyhow::ensure!(reps > 0, "nothing to do: --reps must be at least 1");
    let mut skipped = Vec::new();
    let mut rows = Vec::new();
    for row in ROWS.iter().filter(|row| !row.baseline || args.baseline.is_some()) {
        match unavailable(row) {
            Some(reason) => {
                eprintln!("turbotun bench: skipping vhost-user row {}: {reason}", row.label);
                skipped.push(Unavailable { mode: row.label.into(), reason });
            }
            None => rows.push(row),
        }
    }
    if rows.is_empty() {
        bail!("no vhost-user row can run here (see `turbotun bench --vhost-user --list`)");
    }
    if cfg!(debug_assertions) {
        eprintln!(
            "turbotun bench: warning: this is a debug build, so turbotun's backend runs unoptimized; use \
             `cargo run --release -p turbotun-cli -- bench --vhost-user ...` for figures"
        );
    }
    let taskset = which("taskset").ok_or_else(|| anyhow!("taskset (util-linux) not found"))?;
    let started_unix = crate::now_unix();
    let total = u64::from(reps) * rows.len() as u64;
    eprintln!(
        "turbotun bench: {} vhost-user row(s) × {reps} rep(s), {} s each (~{} min)",
        rows.len(),
        ctx.duration,
        (total * (ctx.duration + 6)).div_ceil(60)
    );
    let pb = crate::progress_bar(total);
    let mut runs = Vec::new();
    let mut failures = 0;
    for rep in 1..=reps {
        for row in &rows {
            pb.set_message(format!("rep {rep}/{reps} {}", row.label));
            let exe = match (&args.baseline, row.baseline) {
                (Some(baseline), true) => baseline.clone(),
                _ => ctx.exe.clone(),
            };
            let measured = match row.kind {
                Kind::Pps(backend) => run_one(ctx, row, backend, rep, &taskset, &exe),
                Kind::Tcp(path) => run_tcp(ctx, row, path, rep, &taskset, &exe),
            };
            let run = match measured {
                Ok(run) => run,
                Err(e) if ctx.interrupted() => {
                    pb.finish_and_clear();
                    return Err(interrupted(e));
                }
                Err(e) => {
                    failures += 1;
                    pb.suspend(|| eprintln!("turbotun bench: vhost-user {} rep {rep}: {e:#}", row.label));
                    VhostRun { row: row.label.into(), rep, error: Some(format!("{e:#}")), ..Default::default() }
                }
            };
            runs.push(run);
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let report = VhostReport {
        header: ReportHeader::here("turbotun bench --vhost-user", started_unix),
        duration_s: ctx.duration,
        reps,
        topology: "one private namespace: the backend's vhost-user socket, its TAP (no address, IPv6 off)".into(),
        front_end: format!(
            "dpdk-testpmd virtio-user (split ring, mrg_rxbuf, 1 queue pair), txonly, {FRAME_LEN} B frames, \
             forwarding on CPU 0"
        ),
        rows: summarize(&runs, &rows),
        ratio_turbotun_dpdk_pps_per_cpu_second: None,
        goal_ratio: GOAL_PPS_PER_CPU,
        ratio_tso_no_offload_gbps: None,
        ratio_no_offload_tso_cpu_per_gb: None,
        goal_tso_no_offload: GOAL_TSO_NO_OFFLOAD,
        ratio_tso_ceiling_gbps: None,
        goal_tso_ceiling: GOAL_TSO_CEILING,
        ab: Vec::new(),
        skipped,
        runs,
    }
    .with_ratio();
    crate::write_json(args.json.as_deref(), &report)?;
    crate::print_markdown(&markdown(&report));
    Ok(failures)
}
