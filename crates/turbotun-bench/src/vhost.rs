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

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use turbotun::netlink::LinkStats;
use turbotun::vhost_user::frontend::{Guest, Layout};
use turbotun::vhost_user::VNET_HDR_LEN;
use turbotun::DeviceBuilder;

use super::modes::{which, Unavailable};
use super::netcfg::Netns;
use super::process::sleep_checked;
use super::procfs;
use super::report::ReportHeader;
use super::runner::{interrupted, Ctx};
use super::stats::{cell, fmt_count, med, ratio, Spread};
use super::testpmd::{self, Testpmd};
use super::topo::Forwarder;
use super::vguest;
use super::Options;

/// The front end's forwarding lcore (CPU 0) and the backends' CPU (1): never the same core.
const FRONT_END_MAIN_LCORE: u32 = 1;
const BACKEND_CPU: u32 = 1;
/// The DPDK backend's command line stays on lcore 0, so that it forwards on lcore 1.
const DPDK_BACKEND_MAIN_LCORE: u32 = 0;
/// The front end's frames, bytes on the wire without the FCS (testpmd's `set txpkts`).
pub const FRAME_LEN: u32 = 64;
/// From the front end's `start` to the window: the rings fill and the backend reaches its steady state.
const WARMUP: Duration = Duration::from_secs(1);
/// The goal of issue 31: turbotun's packets per backend CPU-second over DPDK's.
pub const GOAL_PPS_PER_CPU: f64 = 1.5;

/// Which backend serves the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Turbotun,
    Dpdk,
}

/// How the TCP rows' guest reaches the TAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TcpPath {
    /// TSO negotiated: 64 KiB super-packets through `turbotun vhost-user`.
    Tso,
    /// No offload negotiated: MSS-sized frames with their checksums through `turbotun vhost-user`.
    NoOffload,
    /// No backend: the same super-packets written from guest memory into the TAP, one write each.
    Ceiling,
}

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// 64 B frames from testpmd's virtio-user through a backend into the TAP.
    Pps(Backend),
    /// The synthetic guest's TCP connection to a socket in the TAP's namespace.
    Tcp(TcpPath),
}

/// One row of the report.
#[derive(Debug)]
pub struct RowSpec {
    pub label: &'static str,
    pub description: &'static str,
    kind: Kind,
    /// The row's backend is the `--baseline` build of turbotun (the A/B of a change); run only with it.
    baseline: bool,
}

pub const ROWS: &[RowSpec] = &[
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
const REFERENCE: &str = "dpdk";
/// Issue 31's goals for the TCP rows: tso over no-offload, and tso over the ceiling, in Gbps.
pub const GOAL_TSO_NO_OFFLOAD: f64 = 5.0;
pub const GOAL_TSO_CEILING: f64 = 0.8;

/// Why a row cannot run here, or `None`.
fn unavailable(row: &RowSpec) -> Option<String> {
    if super::cpus() < 2 {
        return Some(format!(
            "needs 2 CPUs (the front end polls one, the backend runs on the other); this machine has {}",
            super::cpus()
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
pub fn print_list() {
    println!("vhost-user rows (those @baseline only with --baseline):");
    for row in ROWS {
        let state = unavailable(row).map(|r| format!(" (not available: {r})")).unwrap_or_default();
        println!("  {:<10} {}{state}", row.label, row.description);
    }
    println!("quick: every row, 1 repetition of 1 s");
}

/// One run of one row.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VhostRun {
    pub row: String,
    pub rep: u32,
    /// Why the run produced no result.
    pub error: Option<String>,
    /// Length of the window, seconds.
    pub window_seconds: f64,
    /// Frames the TAP received (the kernel's `rx_packets`) over the window.
    pub tap_rx_packets: u64,
    /// `tap_rx_packets` per second, millions.
    pub mpps: Option<f64>,
    pub backend_pid: u32,
    /// The backend process's CPU time over the window (utime and stime of all its threads), seconds.
    pub backend_user_seconds: f64,
    pub backend_sys_seconds: f64,
    /// Backend CPU-seconds per second of the window (1.0: one core busy throughout).
    pub backend_cpu_per_second: Option<f64>,
    /// Frames per second reaching the TAP per backend CPU-second.
    pub pps_per_cpu_second: Option<f64>,
    /// Over the whole run: frames the front end put in its ring (its port's `TX-packets`), frames the TAP
    /// received once the ring drained, and the difference.
    pub frontend_tx_packets: u64,
    pub tap_rx_packets_total: u64,
    pub lost: u64,
    /// The TAP's `rx_dropped` over the whole run (the kernel had no room for a frame the backend wrote).
    pub tap_rx_dropped: u64,
    /// The backend's own drop count over the whole run: turbotun's `drops` counter; DPDK's forwarding drops
    /// (`stop`'s RX-dropped + TX-dropped) and its ports' RX-missed, RX-errors, RX-nombuf and TX-errors.
    pub backend_drops: Option<u64>,
    /// turbotun's closing counters line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_counters: Option<serde_json::Value>,
    /// The TCP rows: bytes the socket read over the window, as Gbps, and what the guest's sender did over the
    /// whole run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<vguest::SenderReport>,
}

/// One row over the repetitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VhostRow {
    pub row: String,
    pub description: String,
    pub runs: usize,
    pub failed: usize,
    pub mpps: Option<Spread>,
    pub backend_cpu_per_second: Option<Spread>,
    pub pps_per_cpu_second: Option<Spread>,
    /// `lost` over `frontend_tx_packets`, %.
    pub lost_percent: Option<Spread>,
    pub backend_drops: Option<Spread>,
    pub tap_rx_dropped: Option<Spread>,
    /// Median pps per CPU-second over DPDK's in this bench run.
    pub ratio_dpdk_pps_per_cpu_second: Option<f64>,
    /// The TCP rows: Gbps the socket read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbps: Option<Spread>,
}

/// The JSON document of `--vhost-user`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VhostReport {
    #[serde(flatten)]
    pub header: ReportHeader,
    pub duration_s: u64,
    pub reps: u32,
    pub topology: String,
    pub front_end: String,
    pub rows: Vec<VhostRow>,
    /// turbotun's median pps per backend CPU-second over DPDK's, and the goal.
    pub ratio_turbotun_dpdk_pps_per_cpu_second: Option<f64>,
    pub goal_ratio: f64,
    /// The TCP rows: tso's median Gbps over no-offload's and over the ceiling's, with the goals.
    pub ratio_tso_no_offload_gbps: Option<f64>,
    pub goal_tso_no_offload: f64,
    pub ratio_tso_ceiling_gbps: Option<f64>,
    pub goal_tso_ceiling: f64,
    /// With --baseline: this build over the baseline's, row by row.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ab: Vec<AbRatio>,
    /// Rows that could not run here, with why.
    pub skipped: Vec<Unavailable>,
    pub runs: Vec<VhostRun>,
}

/// The A/B of one row: this build's figure over the --baseline build's, the row's own measure (pps per backend
/// CPU-second for `turbotun`, Gbps at the socket for the TCP rows).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AbRatio {
    pub row: String,
    pub measure: String,
    /// Median over median.
    pub ratio_of_medians: Option<f64>,
    /// The ratio within each round (repetition), both measured side by side: median, min and max.
    pub per_round: Option<Spread>,
}

/// Every row that can run, `reps` times interleaved; then the JSON and the Markdown. Returns how many runs
/// failed.
pub fn run(ctx: &mut Ctx, args: &Options) -> Result<usize> {
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
    let started_unix = super::now_unix();
    let total = u64::from(reps) * rows.len() as u64;
    eprintln!(
        "turbotun bench: {} vhost-user row(s) × {reps} rep(s), {} s each (~{} min)",
        rows.len(),
        ctx.duration,
        (total * (ctx.duration + 6)).div_ceil(60)
    );
    let pb = super::progress_bar(total);
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
        goal_tso_no_offload: GOAL_TSO_NO_OFFLOAD,
        ratio_tso_ceiling_gbps: None,
        goal_tso_ceiling: GOAL_TSO_CEILING,
        ab: Vec::new(),
        skipped,
        runs,
    }
    .with_ratio();
    super::write_json(args.json.as_deref(), &report)?;
    super::print_markdown(&markdown(&report));
    Ok(failures)
}

/// A file removed when this value is dropped (a vhost-user socket a killed backend leaves).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A running backend.
enum Running {
    Turbotun(Forwarder),
    Dpdk(Testpmd),
}

impl Running {
    fn pid(&self) -> u32 {
        match self {
            Running::Turbotun(f) => f.pid,
            Running::Dpdk(t) => t.pid(),
        }
    }

    /// Stops the backend; its drop count and (turbotun) its counters line.
    fn finish(self) -> Result<(Option<u64>, Option<serde_json::Value>)> {
        match self {
            Running::Turbotun(mut f) => {
                if !f.is_running() {
                    bail!("turbotun vhost-user died during the run");
                }
                let exit = f.stop();
                let drops = exit.counters.as_ref().and_then(|c| c.get("drops")?.as_u64());
                Ok((drops, exit.counters))
            }
            Running::Dpdk(mut t) => {
                let forward_drops = testpmd::parse_forward_drops(&t.run("stop")?)?;
                let ports = t.port_stats()?;
                let port_drops: u64 = ports.iter().map(|p| p.rx_missed + p.rx_errors + p.rx_nombuf + p.tx_errors).sum();
                t.quit()?;
                Ok((Some(forward_drops + port_drops), None))
            }
        }
    }
}

/// The TAP's counters, read in the run's namespace.
fn tap_stats(ns: &Netns, tap: &str) -> Result<LinkStats> {
    ns.netlink()?.stats(tap).with_context(|| format!("{}: counters of {tap}", ns.name))
}

/// CPU seconds (user, system) of a live process.
fn cpu_seconds(pid: u32, clk_tck: f64) -> Result<(f64, f64)> {
    let (user, sys) = procfs::pid_user_sys_ticks(pid)?;
    Ok((user as f64 / clk_tck, sys as f64 / clk_tck))
}

/// A run's namespace (IPv6 off: only the guest's frames cross the TAP, no router solicitations or DAD), the
/// names of its TAP and socket, and the socket removed with it.
struct RunPlace {
    ns: Netns,
    base: String,
    tap: String,
    socket: PathBuf,
    socket_str: String,
    _socket: RemoveOnDrop,
}

impl RunPlace {
    fn new(ctx: &mut Ctx) -> Result<RunPlace> {
        ctx.run_counter += 1;
        let base = format!("{}r{}", ctx.prefix, ctx.run_counter);
        let ns = Netns::new(format!("{base}v"))?;
        ns.set_sysctls(&[("net.ipv6.conf.all.disable_ipv6", "1"), ("net.ipv6.conf.default.disable_ipv6", "1")])?;
        let socket = ctx.log_dir.join(format!("{base}.sock"));
        let socket_str = socket.to_str().ok_or_else(|| anyhow!("{} is not UTF-8", socket.display()))?.to_string();
        Ok(RunPlace { ns, tap: format!("{base}v"), base, _socket: RemoveOnDrop(socket.clone()), socket, socket_str })
    }

    /// `turbotun vhost-user` on the socket and the TAP, pinned to [`BACKEND_CPU`], once it printed `ready`.
    /// `exe` is this build of turbotun, or the --baseline build.
    fn start_turbotun(&self, ctx: &Ctx, taskset: &Path, exe: &Path) -> Result<Forwarder> {
        let argv: Vec<String> = vec![
            "-c".into(),
            BACKEND_CPU.to_string(),
            exe.display().to_string(),
            "vhost-user".into(),
            "--json".into(),
            "--socket".into(),
            self.socket_str.clone(),
            "--tap".into(),
            self.tap.clone(),
        ];
        let log = ctx.log_dir.join(format!("{}-turbotun-vhost-user.stderr", self.base));
        Forwarder::spawn("turbotun vhost-user", taskset, &argv, &self.ns, log, &ctx.stop)
    }
}

/// One run of a packet row: namespace, backend, front end, the window, the drain, the counters.
fn run_one(ctx: &mut Ctx, row: &RowSpec, backend: Backend, rep: u32, taskset: &Path, exe: &Path) -> Result<VhostRun> {
    let place = RunPlace::new(ctx)?;
    let RunPlace { ns, base, tap, socket_str, .. } = &place;
    let (base, tap, socket_str) = (base.as_str(), tap.as_str(), socket_str.as_str());

    let backend = match backend {
        Backend::Turbotun => {
            let fwd = place.start_turbotun(ctx, taskset, exe)?;
            ns.netlink()?.set_up(tap, true).with_context(|| format!("set {tap} up"))?;
            Running::Turbotun(fwd)
        }
        Backend::Dpdk => {
            let mut eal = testpmd::eal_args(DPDK_BACKEND_MAIN_LCORE, &format!("{base}be"));
            eal.extend([
                "--vdev".into(),
                format!("net_vhost0,iface={socket_str},queues=1"),
                "--vdev".into(),
                format!("net_tap0,iface={tap}"),
            ]);
            let app = ["--port-topology=chained", "--total-num-mbufs=32768"];
            let log = ctx.log_dir.join(format!("{base}-dpdk-backend.log"));
            Running::Dpdk(Testpmd::start(
                "DPDK's backend (testpmd)",
                ns,
                &eal,
                &app,
                &format!("{base}be"),
                log,
                &ctx.stop,
            )?)
        }
    };
    let pid = backend.pid();

    let mut eal = testpmd::eal_args(FRONT_END_MAIN_LCORE, &format!("{base}fe"));
    eal.extend([
        "--vdev".into(),
        format!("net_virtio_user0,path={socket_str},queues=1,packed_vq=0,mrg_rxbuf=1,in_order=0"),
    ]);
    let log = ctx.log_dir.join(format!("{base}-front-end.log"));
    let mut front = Testpmd::start(
        "the front end (testpmd)",
        ns,
        &eal,
        &["--total-num-mbufs=32768"],
        &format!("{base}fe"),
        log,
        &ctx.stop,
    )?;
    front.run("set fwd txonly")?;
    front.run(&format!("set txpkts {FRAME_LEN}"))?;
    let mut backend = backend;
    if let Running::Dpdk(t) = &mut backend {
        // Forwarding starts once the front end is connected (its first prompt comes after its port started): a
        // vhost port polled before its guest arrived was seen to stop after its first burst.
        t.run("set fwd io")?;
        t.run("start")?;
    }
    front.run("start")?;
    sleep_checked(WARMUP, &ctx.stop)?;

    let (tap0, cpu0, t0) = (tap_stats(ns, tap)?, cpu_seconds(pid, ctx.clk_tck)?, Instant::now());
    sleep_checked(Duration::from_secs(ctx.duration), &ctx.stop)?;
    let (tap1, cpu1, t1) = (tap_stats(ns, tap)?, cpu_seconds(pid, ctx.clk_tck)?, Instant::now());

    front.run("stop")?;
    let sent = front.port_stats()?.first().map(|p| p.tx_packets).ok_or_else(|| anyhow!("the front end has no port"))?;
    let drained = drain(ns, tap, &ctx.stop)?;
    front.quit()?;
    let (backend_drops, backend_counters) = backend.finish()?;

    let window_seconds = (t1 - t0).as_secs_f64();
    let tap_rx_packets = tap1.rx_packets.saturating_sub(tap0.rx_packets);
    let (user, sys) = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
    let pps = tap_rx_packets as f64 / window_seconds;
    let cpu_per_second = (user + sys) / window_seconds;
    if tap_rx_packets == 0 {
        bail!("no frame reached the TAP over the window (the front end sent {sent})");
    }
    Ok(VhostRun {
        row: row.label.into(),
        rep,
        error: None,
        window_seconds,
        tap_rx_packets,
        mpps: Some(pps / 1e6),
        backend_pid: pid,
        backend_user_seconds: user,
        backend_sys_seconds: sys,
        backend_cpu_per_second: Some(cpu_per_second),
        // No CPU time counted (a clock tick is 10 ms): no figure rather than an infinite one.
        pps_per_cpu_second: (cpu_per_second > 0.0).then(|| pps / cpu_per_second),
        frontend_tx_packets: sent,
        tap_rx_packets_total: drained.rx_packets,
        lost: sent.saturating_sub(drained.rx_packets),
        tap_rx_dropped: drained.rx_dropped,
        backend_drops,
        backend_counters,
        ..Default::default()
    })
}

/// Features of the `tso` row's guest: what a Linux guest takes for TCP over IPv4 (checksums and TSO both ways,
/// mergeable receive buffers, the event index).
fn tso_features() -> u64 {
    use turbotun::wire::virtio_net::features as f;
    [VERSION_1, EVENT_IDX, f::CSUM, f::GUEST_CSUM, f::HOST_TSO4, f::GUEST_TSO4, f::MRG_RXBUF]
        .iter()
        .fold(0, |w, &n| w | 1u64 << n)
}

/// Features of the `no-offload` row's guest: no checksum or segmentation offload at all.
fn plain_features() -> u64 {
    use turbotun::wire::virtio_net::features as f;
    [VERSION_1, EVENT_IDX, f::MRG_RXBUF].iter().fold(0, |w, &n| w | 1u64 << n)
}

const VERSION_1: u32 = 32;
const EVENT_IDX: u32 = 29;

/// Sets a flag when dropped: the run's threads stop however the run ends.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One run of a TCP row: namespace, TAP at 10.203.0.1/24 with the guest's address known to it, the socket, the
/// backend (or none), the guest's sender; the socket's bytes over the window.
fn run_tcp(ctx: &mut Ctx, row: &RowSpec, path: TcpPath, rep: u32, taskset: &Path, exe: &Path) -> Result<VhostRun> {
    let place = RunPlace::new(ctx)?;
    let (ns, tap) = (&place.ns, place.tap.as_str());
    let configure = || -> Result<()> {
        let mut nl = ns.netlink()?;
        nl.add_address(tap, vguest::TAP_IP.into(), 24).with_context(|| format!("address on {tap}"))?;
        nl.set_up(tap, true).with_context(|| format!("set {tap} up"))?;
        // The guest answers no ARP: the kernel knows its address already.
        nl.add_neighbour(tap, vguest::GUEST_IP.into(), vguest::GUEST_MAC)
            .with_context(|| format!("neighbour on {tap}"))?;
        Ok(())
    };
    let (backend, link): (Option<Running>, Box<dyn vguest::Link + Send>) = match path {
        TcpPath::Tso | TcpPath::NoOffload => {
            let fwd = place.start_turbotun(ctx, taskset, exe)?;
            configure()?;
            let features = if path == TcpPath::Tso { tso_features() } else { plain_features() };
            let layout = Layout { rx_size: 256, tx_size: 256 };
            let mut guest = Guest::connect_with(&place.socket, features, layout).context("the guest's front end")?;
            guest.post_rx(0, layout.rx_size).context("the guest's receive buffers")?;
            (Some(Running::Turbotun(fwd)), Box::new(vguest::VirtioLink(guest)))
        }
        TcpPath::Ceiling => {
            let device = ns
                .run(|| DeviceBuilder::tap().name(tap).vnet_hdr(VNET_HDR_LEN).open())?
                .with_context(|| format!("open {tap}"))?;
            configure()?;
            (None, Box::new(vguest::TapLink::new(device.into_queues().remove(0))?))
        }
    };
    let pid = backend.as_ref().map(Running::pid);
    let mac = ns.netlink()?.link(tap)?.mac.ok_or_else(|| anyhow!("{tap} has no MAC address"))?;
    let listener = ns.run(|| std::net::TcpListener::bind((vguest::TAP_IP, vguest::PORT)))?.context("the socket")?;

    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(Arc::clone(&stop));
    let (received, sent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let receiver = {
        let (stop, received) = (Arc::clone(&stop), Arc::clone(&received));
        std::thread::spawn(move || vguest::receive(listener, stop, received))
    };
    let sender = {
        let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
        let tso = path != TcpPath::NoOffload;
        let mut link = link;
        // The link comes back with the report: the ceiling's TAP lives as long as its fd, which the counters
        // read after the sender stopped still need.
        std::thread::spawn(move || {
            let report = vguest::send_tcp(&mut *link, mac, tso, &stop, &sent);
            (link, report)
        })
    };
    // The connection is up once the socket has read something; the sender's error if it gave up first.
    let deadline = Instant::now() + Duration::from_secs(20);
    while received.load(Ordering::Relaxed) == 0 {
        if sender.is_finished() || Instant::now() >= deadline {
            stop.store(true, Ordering::Relaxed);
            let why = match sender.join() {
                Ok((_, Err(e))) => format!("{e:#}"),
                _ => "no byte reached the socket within 20 s".into(),
            };
            bail!("{why}");
        }
        sleep_checked(Duration::from_millis(10), &ctx.stop)?;
    }
    sleep_checked(WARMUP, &ctx.stop)?;
    let cpu = |pid: Option<u32>| pid.map(|p| cpu_seconds(p, ctx.clk_tck)).transpose();
    let (bytes0, tap0, cpu0, t0) = (received.load(Ordering::Relaxed), tap_stats(ns, tap)?, cpu(pid)?, Instant::now());
    sleep_checked(Duration::from_secs(ctx.duration), &ctx.stop)?;
    let (bytes1, tap1, cpu1, t1) = (received.load(Ordering::Relaxed), tap_stats(ns, tap)?, cpu(pid)?, Instant::now());
    stop.store(true, Ordering::Relaxed);
    let (link, report) = sender.join().map_err(|_| anyhow!("the guest's sender panicked"))?;
    let report = report?;
    receiver.join().map_err(|_| anyhow!("the socket's reader panicked"))??;
    let drained = drain(ns, tap, &ctx.stop)?;
    drop(link);
    let (backend_drops, backend_counters) = match backend {
        Some(b) => b.finish()?,
        None => (None, None),
    };

    let window_seconds = (t1 - t0).as_secs_f64();
    let socket_bytes = bytes1 - bytes0;
    let tap_rx_packets = tap1.rx_packets.saturating_sub(tap0.rx_packets);
    let (user, sys) = match (cpu0, cpu1) {
        (Some(a), Some(b)) => (b.0 - a.0, b.1 - a.1),
        _ => (0.0, 0.0),
    };
    Ok(VhostRun {
        row: row.label.into(),
        rep,
        error: None,
        window_seconds,
        tap_rx_packets,
        mpps: Some(tap_rx_packets as f64 / window_seconds / 1e6),
        backend_pid: pid.unwrap_or(0),
        backend_user_seconds: user,
        backend_sys_seconds: sys,
        backend_cpu_per_second: pid.map(|_| (user + sys) / window_seconds),
        pps_per_cpu_second: None,
        frontend_tx_packets: report.frames,
        tap_rx_packets_total: drained.rx_packets,
        lost: report.frames.saturating_sub(drained.rx_packets),
        tap_rx_dropped: drained.rx_dropped,
        backend_drops,
        backend_counters,
        socket_bytes: Some(socket_bytes),
        gbps: Some(socket_bytes as f64 * 8.0 / window_seconds / 1e9),
        sender: Some(report),
    })
}

/// The TAP's counters once the backend has written what was left in the ring: `rx_packets` unchanged over
/// 100 ms, or after 3 s.
fn drain(ns: &Netns, tap: &str, stop: &std::sync::atomic::AtomicBool) -> Result<LinkStats> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = tap_stats(ns, tap)?;
    loop {
        sleep_checked(Duration::from_millis(100), stop)?;
        let now = tap_stats(ns, tap)?;
        if now.rx_packets == last.rx_packets || Instant::now() >= deadline {
            return Ok(now);
        }
        last = now;
    }
}

fn summarize(runs: &[VhostRun], rows: &[&RowSpec]) -> Vec<VhostRow> {
    rows.iter()
        .map(|spec| {
            let all: Vec<&VhostRun> = runs.iter().filter(|r| r.row == spec.label).collect();
            let ok: Vec<&VhostRun> = all.iter().copied().filter(|r| r.error.is_none()).collect();
            let of = |f: fn(&VhostRun) -> Option<f64>| Spread::of(ok.iter().filter_map(|r| f(r)));
            VhostRow {
                row: spec.label.into(),
                description: spec.description.into(),
                runs: all.len(),
                failed: all.len() - ok.len(),
                mpps: of(|r| r.mpps),
                backend_cpu_per_second: of(|r| r.backend_cpu_per_second),
                pps_per_cpu_second: of(|r| r.pps_per_cpu_second),
                lost_percent: of(|r| {
                    (r.frontend_tx_packets > 0).then(|| r.lost as f64 * 100.0 / r.frontend_tx_packets as f64)
                }),
                backend_drops: of(|r| r.backend_drops.map(|d| d as f64)),
                tap_rx_dropped: of(|r| Some(r.tap_rx_dropped as f64)),
                ratio_dpdk_pps_per_cpu_second: None,
                gbps: of(|r| r.gbps),
            }
        })
        .collect()
}

impl VhostReport {
    /// Each row's pps per CPU-second over DPDK's, medians of this bench run.
    fn with_ratio(mut self) -> VhostReport {
        let reference = self.rows.iter().find(|r| r.row == REFERENCE).and_then(|r| r.pps_per_cpu_second);
        for row in &mut self.rows {
            row.ratio_dpdk_pps_per_cpu_second = match (row.pps_per_cpu_second, reference) {
                (Some(own), Some(dpdk)) if dpdk.median > 0.0 => Some(own.median / dpdk.median),
                _ => None,
            };
        }
        self.ratio_turbotun_dpdk_pps_per_cpu_second =
            self.rows.iter().find(|r| r.row == "turbotun").and_then(|r| r.ratio_dpdk_pps_per_cpu_second);
        let gbps = |label: &str| self.rows.iter().find(|r| r.row == label).and_then(|r| r.gbps).map(|s| s.median);
        let over = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        self.ratio_tso_no_offload_gbps = over(gbps("tso"), gbps("no-offload"));
        self.ratio_tso_ceiling_gbps = over(gbps("tso"), gbps("ceiling"));
        self.ab = self.ab_ratios();
        self
    }

    /// For every row run with the --baseline build too: this build over that one.
    fn ab_ratios(&self) -> Vec<AbRatio> {
        let measure = |row: &str, r: &VhostRun| match ROWS.iter().find(|spec| spec.label == row).map(|s| s.kind) {
            Some(Kind::Pps(_)) => r.pps_per_cpu_second,
            _ => r.gbps,
        };
        let median = |label: &str| {
            Spread::of(
                self.runs.iter().filter(|r| r.row == label && r.error.is_none()).filter_map(|r| measure(label, r)),
            )
            .map(|s| s.median)
        };
        ROWS.iter()
            .filter(|spec| spec.baseline)
            .filter_map(|spec| {
                let row = spec.label.strip_suffix("@baseline")?;
                let per_round = Spread::of(self.runs.iter().filter(|r| r.row == row).filter_map(|ours| {
                    let theirs = self.runs.iter().find(|r| r.row == spec.label && r.rep == ours.rep)?;
                    match (measure(row, ours), measure(row, theirs)) {
                        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                        _ => None,
                    }
                }));
                let ratio_of_medians = match (median(row), median(spec.label)) {
                    (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                    _ => None,
                };
                (ratio_of_medians.is_some() || per_round.is_some()).then(|| AbRatio {
                    row: row.into(),
                    measure: match spec.kind {
                        Kind::Pps(_) => "pps per backend CPU-second".into(),
                        Kind::Tcp(_) => "Gbps at the socket".into(),
                    },
                    ratio_of_medians,
                    per_round,
                })
            })
            .collect()
    }
}

pub fn markdown(report: &VhostReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## turbotun bench --vhost-user ({} build): {} s per run, {} rep(s) interleaved, kernel {}, {} CPUs\n",
        report.header.build, report.duration_s, report.reps, report.header.kernel, report.header.cpus
    );
    let _ = writeln!(o, "Front end: {}. Topology: {}.\n", report.front_end, report.topology);
    let is_tcp = |label: &str| ROWS.iter().any(|r| r.label == label && matches!(r.kind, Kind::Tcp(_)));
    let count = |s: Option<Spread>| s.map(|s| fmt_count(s.median)).unwrap_or_else(|| "–".into());
    let failed =
        |r: &VhostRow| if r.failed > 0 { format!(" ({} of {} failed)", r.failed, r.runs) } else { String::new() };
    if report.rows.iter().any(|r| !is_tcp(&r.row)) {
        let _ = writeln!(o, "### 64-byte frames, front end → backend → TAP\n");
        let _ = writeln!(
            o,
            "| backend | Mpps to TAP | backend CPU-s/s | pps per backend CPU-s | ×dpdk | lost % | backend drops | TAP \
             rx dropped |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|");
        for r in report.rows.iter().filter(|r| !is_tcp(&r.row)) {
            let _ = writeln!(
                o,
                "| {}{} | {} | {} | {} | {} | {} | {} | {} |",
                r.row,
                failed(r),
                cell(r.mpps),
                cell(r.backend_cpu_per_second),
                count(r.pps_per_cpu_second),
                ratio(r.ratio_dpdk_pps_per_cpu_second),
                med(r.lost_percent),
                count(r.backend_drops),
                count(r.tap_rx_dropped),
            );
        }
        if let Some(x) = report.ratio_turbotun_dpdk_pps_per_cpu_second {
            let _ = writeln!(
                o,
                "\nturbotun/dpdk, pps per backend CPU-second: {x:.2}× (goal ≥ {:.1}×: {}).",
                report.goal_ratio,
                if x >= report.goal_ratio { "met" } else { "not met" }
            );
        }
        let _ = writeln!(
            o,
            "\nMedians (min–max) over interleaved repetitions. Mpps to TAP = the TAP's rx_packets over the window. \
             Backend CPU-s/s = the backend process's utime+stime over the window per second (a polling backend \
             costs a core whatever it moves). pps per backend CPU-s = the two divided, per run. lost % = frames the \
             front end put in its ring (its port's TX-packets) that never reached the TAP, over the whole run. \
             backend drops = turbotun's drops counter; DPDK's forwarding drops and port errors. TAP rx dropped = \
             frames the kernel had no room for."
        );
    }
    if report.rows.iter().any(|r| is_tcp(&r.row)) {
        let _ = writeln!(o, "\n### TCP from the guest to a socket in the TAP's namespace\n");
        let _ = writeln!(
            o,
            "| row | Gbps at the socket | backend CPU-s/s | frames into TAP /s | go-backs | lost | backend drops |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|");
        for r in report.rows.iter().filter(|r| is_tcp(&r.row)) {
            let runs: Vec<&VhostRun> = report.runs.iter().filter(|x| x.row == r.row && x.error.is_none()).collect();
            let go_backs = Spread::of(runs.iter().filter_map(|x| Some(x.sender?.go_backs as f64)));
            let lost = Spread::of(runs.iter().map(|x| x.lost as f64));
            let _ = writeln!(
                o,
                "| {}{} | {} | {} | {} | {} | {} | {} |",
                r.row,
                failed(r),
                cell(r.gbps),
                r.backend_cpu_per_second.map(|s| cell(Some(s))).unwrap_or_else(|| "no backend".into()),
                r.mpps.map(|s| fmt_count(s.median * 1e6)).unwrap_or_else(|| "–".into()),
                count(go_backs),
                count(lost),
                count(r.backend_drops),
            );
        }
        let goal = |x: Option<f64>, goal: f64| match x {
            Some(x) => format!("{x:.2}× (goal ≥ {goal}×: {})", if x >= goal { "met" } else { "not met" }),
            None => "–".into(),
        };
        let _ = writeln!(
            o,
            "\ntso/no-offload Gbps: {}; tso/ceiling Gbps: {}.",
            goal(report.ratio_tso_no_offload_gbps, report.goal_tso_no_offload),
            goal(report.ratio_tso_ceiling_gbps, report.goal_tso_ceiling)
        );
        let _ = writeln!(
            o,
            "\nGbps at the socket = bytes the socket read over the window. Backend CPU-s/s = `turbotun vhost-user`'s \
             utime+stime per second (the ceiling has no backend). frames into TAP /s = the TAP's rx_packets per \
             second (a super-packet is one). go-backs = times the guest's sender went back to its first \
             unacknowledged byte after 200 ms without an acknowledgement. lost = frames the guest sent that never \
             reached the TAP."
        );
    }
    if !report.ab.is_empty() {
        let _ = writeln!(o, "\n### This build over the --baseline build (A/B)\n");
        let _ = writeln!(o, "| row | measure | median over median | per round: median (min–max) |");
        let _ = writeln!(o, "|---|---|---|---|");
        for ab in &report.ab {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} |",
                ab.row,
                ab.measure,
                ab.ratio_of_medians.map(|x| format!("{x:.2}×")).unwrap_or_else(|| "–".into()),
                ab.per_round
                    .map(|s| format!("{:.2}× ({:.2}–{:.2}, {} rounds)", s.median, s.min, s.max, s.n))
                    .unwrap_or_else(|| "–".into()),
            );
        }
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

    fn run(row: &str, mpps: f64, cpu: f64) -> VhostRun {
        VhostRun {
            row: row.into(),
            mpps: Some(mpps),
            backend_cpu_per_second: Some(cpu),
            pps_per_cpu_second: Some(mpps * 1e6 / cpu),
            frontend_tx_packets: 1000,
            lost: 10,
            ..Default::default()
        }
    }

    /// The report of `runs`, every row listed, ratios made.
    fn report_of(runs: Vec<VhostRun>, reps: u32) -> VhostReport {
        let rows: Vec<&RowSpec> = ROWS.iter().collect();
        VhostReport {
            header: ReportHeader::for_tests("turbotun bench --vhost-user"),
            duration_s: 1,
            reps,
            topology: String::new(),
            front_end: String::new(),
            rows: summarize(&runs, &rows),
            ratio_turbotun_dpdk_pps_per_cpu_second: None,
            goal_ratio: GOAL_PPS_PER_CPU,
            ratio_tso_no_offload_gbps: None,
            goal_tso_no_offload: GOAL_TSO_NO_OFFLOAD,
            ratio_tso_ceiling_gbps: None,
            goal_tso_ceiling: GOAL_TSO_CEILING,
            ab: vec![],
            skipped: vec![],
            runs,
        }
        .with_ratio()
    }

    #[test]
    fn rows_and_the_ratio_to_dpdk() {
        let runs = vec![
            run("turbotun", 1.0, 0.5),
            run("dpdk", 2.0, 1.0),
            run("turbotun", 1.2, 0.5),
            run("dpdk", 2.0, 1.0),
            VhostRun { row: "turbotun".into(), error: Some("broken".into()), ..Default::default() },
            VhostRun { row: "tso".into(), gbps: Some(10.0), backend_cpu_per_second: Some(0.5), ..Default::default() },
            VhostRun {
                row: "no-offload".into(),
                gbps: Some(2.0),
                backend_cpu_per_second: Some(1.0),
                ..Default::default()
            },
            VhostRun { row: "ceiling".into(), gbps: Some(20.0), ..Default::default() },
        ];
        let report = report_of(runs, 2);
        assert!(report.ab.is_empty(), "no baseline rows, no A/B: {:?}", report.ab);
        let turbotun = &report.rows[0];
        assert_eq!((turbotun.runs, turbotun.failed), (3, 1));
        assert_eq!(turbotun.pps_per_cpu_second.unwrap().median, 2.2e6);
        assert_eq!(turbotun.lost_percent.unwrap().median, 1.0);
        assert_eq!(report.ratio_turbotun_dpdk_pps_per_cpu_second, Some(1.1));
        let md = markdown(&report);
        assert!(md.contains("| turbotun (1 of 3 failed) | 1.10 (1.00–1.20) |"), "{md}");
        assert!(md.contains("1.10× (goal ≥ 1.5×: not met)"), "{md}");
        assert_eq!((report.ratio_tso_no_offload_gbps, report.ratio_tso_ceiling_gbps), (Some(5.0), Some(0.5)));
        assert!(md.contains("| ceiling | 20.0 | no backend |"), "{md}");
        assert!(
            md.contains("tso/no-offload Gbps: 5.00× (goal ≥ 5×: met); tso/ceiling Gbps: 0.50× (goal ≥ 0.8×: not met)"),
            "{md}"
        );
        crate::report::assert_rows_match_headers(&md);
    }

    #[test]
    fn the_ab_is_this_build_over_the_baseline_round_by_round() {
        let at = |row: &str, rep: u32, mpps: f64| VhostRun { rep, ..run(row, mpps, 1.0) };
        let tcp =
            |row: &str, rep: u32, gbps: f64| VhostRun { row: row.into(), rep, gbps: Some(gbps), ..Default::default() };
        let runs = vec![
            at("turbotun", 1, 1.2),
            at("turbotun@baseline", 1, 1.0),
            at("turbotun", 2, 3.0),
            at("turbotun@baseline", 2, 2.0),
            at("turbotun", 3, 1.0),
            at("turbotun@baseline", 3, 1.0),
            tcp("tso", 1, 10.0),
            tcp("tso@baseline", 1, 8.0),
        ];
        let report = report_of(runs, 3);
        let pps = report.ab.iter().find(|a| a.row == "turbotun").expect("turbotun's A/B");
        // Medians 1.2 over 1.0; rounds 1.2, 1.5, 1.0.
        assert!((pps.ratio_of_medians.unwrap() - 1.2).abs() < 1e-9, "{pps:?}");
        let round = pps.per_round.unwrap();
        assert_eq!((round.min, round.max, round.n), (1.0, 1.5, 3), "{pps:?}");
        assert!((round.median - 1.2).abs() < 1e-9, "{pps:?}");
        let tso = report.ab.iter().find(|a| a.row == "tso").expect("tso's A/B");
        assert_eq!((tso.ratio_of_medians, tso.measure.as_str()), (Some(1.25), "Gbps at the socket"));
        assert!(report.ab.iter().all(|a| a.row != "no-offload"), "a row without baseline runs has no A/B");
        let md = markdown(&report);
        assert!(md.contains("| turbotun | pps per backend CPU-second | 1.20× | 1.20× (1.00–1.50, 3 rounds) |"), "{md}");
        crate::report::assert_rows_match_headers(&md);
    }
}
