//! `turbotun bench`: forwarders between two network namespaces measured with iperf3, side by side with the
//! peers (tun-rs, wireguard-go) and the kernel baselines (veth, loopback); with `--tunnel`, VPN-style tunnels
//! between the namespaces (tunnel/); with `--vhost-user`, vhost-user-net backends between a guest's rings and a
//! TAP (vhost/). See docs/BENCH.md.
//!
//! Every (mode, traffic kind, repetition) gets a fresh pair of namespaces and a fresh forwarder; repetitions
//! are interleaved round-robin (rep 1 of every traffic kind and mode, then rep 2, ...).

#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod ceiling;
mod chart;
mod echo;
mod flame;
mod gen;
mod iperf;
mod loss;
mod modes;
mod netcfg;
mod peerconf;
mod perfstat;
mod process;
mod procfs;
mod report;
mod runner;
mod stats;
mod stormgen;
pub mod testpmd;
mod topo;
mod tunnel;
mod vguest;
mod vhost;
mod wgflood;
mod wgscale;
mod wgstorm;

pub use netcfg::Netns;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use iperf::{Traffic, TRAFFIC};
use modes::{Mode, Unavailable};
use report::{Report, ReportHeader, RunRecord};
use runner::{interrupted, is_not_ready, run_one, run_record, Ctx};

/// What `turbotun bench` measures and where it writes it: the command's options as plain values (the CLI reads
/// them with clap; its `--help` says what each means).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--quick`: the short run (fewer modes, traffic kinds, seconds and repetitions).
    pub quick: bool,
    /// `--modes`: labels, short turbotun modes or families; `None`: every available mode.
    pub modes: Option<Vec<String>>,
    /// `--traffic`: traffic kinds by label; `None`: all.
    pub traffic: Option<Vec<String>>,
    /// `--duration`: seconds per run (each bench has its own default).
    pub duration: Option<u64>,
    /// `--reps`: repetitions of every (mode, traffic) pair.
    pub reps: Option<u32>,
    /// `--ipv6`: the IPv6 variant.
    pub ipv6: bool,
    /// `--json`: where to write every run and the summary as JSON.
    pub json: Option<PathBuf>,
    /// `--chart`: where to write a grouped bar chart (.svg or .png).
    pub chart: Option<PathBuf>,
    /// `--flamegraph`: the directory of each forwarder mode's flame graph.
    pub flamegraph: Option<PathBuf>,
    /// `--list`: list the modes and traffic kinds, then return.
    pub list: bool,
    /// `--loss`: the loss table and no-drop rates instead of iperf3.
    pub loss: bool,
    /// `--echo`: echo answers per second instead of forwarding.
    pub echo: bool,
    /// `--tunnel`: tunnels between two namespaces instead of forwarders.
    pub tunnel: bool,
    /// `--tunnel-kinds`: the tunnel kinds of `--tunnel`.
    pub tunnel_kinds: Option<Vec<String>>,
    /// `--vhost-user`: vhost-user-net backends instead of forwarders.
    pub vhost_user: bool,
    /// `--wg-scale`: a WireGuard endpoint holding many peers (configuration, memory, idle CPU) instead of
    /// forwarders.
    pub wg_scale: bool,
    /// `--wg-storm`: a WireGuard endpoint answering a handshake storm (handshakes per CPU-second, a flow through
    /// it) instead of forwarders.
    pub wg_storm: bool,
    /// `--wg-peers`: with `--wg-scale` or `--wg-storm`, the numbers of peers measured.
    pub wg_peers: Option<Vec<usize>>,
    /// `--no-syscalls`: with `--tunnel`, do not count the endpoints' system calls.
    pub no_syscalls: bool,
    /// `--flood-rate`: with `--tunnel`, the handshake initiations a second, thousands, of every `-flood` kind's
    /// flood (0: as fast as one core sends them), so that the endpoints compared are flooded alike.
    pub flood_rate_kpps: u64,
    /// `--baseline`: another build of turbotun, run as `MODE@baseline` beside this one.
    pub baseline: Option<PathBuf>,
    /// `--txqueuelen`: with `--loss`, the devices' queue lengths of the table.
    pub txqueuelen: Option<Vec<u32>>,
    /// `--rates`: with `--loss`, the offered rates of the table (thousands of datagrams per second).
    pub rates: Option<Vec<u64>>,
}

/// One side of the bench's UDP traffic, as the hidden `--udp-gen`, `--udp-sink` and `--udp-roundtrip` give it.
#[derive(Debug, Clone)]
pub struct Udp {
    /// Where the generator sends (the echo, for the round trip), or where the sink listens.
    pub target: SocketAddr,
    /// Datagram payload length of the generator (at least 16; the sink reads each datagram's own).
    pub len: usize,
    /// Datagrams per GSO send of the generator.
    pub gso: u16,
    /// Datagrams per second of the generator (0: unlimited).
    pub rate: u64,
    /// Seconds to run (default 10).
    pub duration: Option<u64>,
}

/// The processes the bench starts of this same binary inside a run's namespaces (`turbotun bench` with a hidden
/// flag): each does one job and prints its report.
#[derive(Debug, Clone)]
pub enum Helper {
    /// `--naive-echo DEV`: the naive echo on TUN device DEV (created): one packet per read and per write, no
    /// virtio header; prints `ready`, and its counters as one JSON line when stopped.
    NaiveEcho {
        /// The TUN device.
        dev: String,
    },
    /// `--ceiling-fwd DEV_A DEV_B`: the ceiling forwarder between two TUN devices (created).
    CeilingFwd {
        /// One device.
        dev_a: String,
        /// The other.
        dev_b: String,
    },
    /// `--wg-flood ADDR:PORT`: WireGuard handshake initiations (random content, valid mac1) at `dest` for
    /// `duration` seconds (default 10) or until SIGTERM; prints a JSON line.
    WgFlood {
        /// The flooded endpoint.
        dest: SocketAddr,
        /// Its public key (base64).
        key: Option<String>,
        /// Source addresses, taken in turn (empty: the wildcard).
        from: Vec<IpAddr>,
        /// Initiations per second (0: as fast as the kernel takes them).
        rate: u64,
        /// Seconds to flood (default 10).
        duration: Option<u64>,
    },
    /// `--wg-storm-play ADDR:PORT`: the handshake storm of `--wg-storm` (peers whose keys the bench knows, all
    /// initiating within a second) at `dest`; prints JSON lines (see `stormgen.rs`).
    WgStorm {
        /// The stormed endpoint.
        dest: SocketAddr,
        /// Its public key (base64).
        key: String,
        /// Peers that initiate.
        peers: usize,
        /// Seconds after which peers not answered count as not completed (default 300).
        deadline: Option<u64>,
    },
    /// `--udp-gen ADDR:PORT`: the UDP generator; prints a JSON line.
    UdpGen(Udp),
    /// `--udp-sink ADDR:PORT`: the UDP sink; prints a JSON line.
    UdpSink(Udp),
    /// `--udp-roundtrip ADDR:PORT`: the generator toward an echo and a sink counting its answers, in one
    /// process; prints both reports as one JSON line.
    UdpRoundtrip(Udp),
}

/// What to measure, from the arguments and the modes available.
#[derive(Debug)]
struct Plan {
    modes: Vec<Mode>,
    traffic: Vec<Traffic>,
    duration: u64,
    reps: u32,
}

impl Plan {
    fn new(args: &Options, all: &[Mode], unavailable: &[Unavailable]) -> Result<Plan> {
        let plan = Plan {
            modes: select_modes(args, all, unavailable)?,
            traffic: select_traffic(args)?,
            duration: args.duration.unwrap_or(if args.quick { 3 } else { 10 }),
            reps: args.reps.unwrap_or(if args.quick { 1 } else { 3 }),
        };
        if plan.duration == 0 || plan.reps == 0 || plan.traffic.is_empty() {
            bail!("nothing to do: --duration and --reps must be at least 1 and --traffic not empty");
        }
        Ok(plan)
    }

    fn runs(&self) -> u64 {
        u64::from(self.reps) * self.traffic.len() as u64 * self.modes.len() as u64
    }
}

/// The modes named by --modes, those of --quick, or every available one.
fn select_modes(args: &Options, all: &[Mode], unavailable: &[Unavailable]) -> Result<Vec<Mode>> {
    let mode_filter: Vec<String> = match (&args.modes, args.quick) {
        (Some(m), _) => m.clone(),
        (None, true) => modes::QUICK_MODES.iter().map(|s| s.to_string()).collect(),
        (None, false) => all.iter().map(|m| m.label.clone()).collect(),
    };
    let selected = modes::select_modes(all, unavailable, &mode_filter)?;
    Ok(match &args.baseline {
        Some(path) => modes::with_baseline_twins(selected, path),
        None => selected,
    })
}

fn select_traffic(args: &Options) -> Result<Vec<Traffic>> {
    match (&args.traffic, args.quick) {
        (Some(t), _) => t
            .iter()
            .map(|l| {
                iperf::traffic_by_label(l.trim()).ok_or_else(|| {
                    anyhow!(
                        "unknown traffic kind {l:?}; known: {}",
                        TRAFFIC.iter().map(|t| t.label).collect::<Vec<_>>().join(", ")
                    )
                })
            })
            .collect(),
        (None, true) => Ok(["tcp", "udp64"].iter().filter_map(|l| iperf::traffic_by_label(l)).collect()),
        (None, false) => Ok(TRAFFIC.to_vec()),
    }
}

/// The command lines of this binary that the bench starts for turbotun's rows, each with its row's label:
/// `fwd DEV_A DEV_B ARGS..` for every forwarder mode (`turbotun-offload`, ...) and each echo variant's (`naive`,
/// `echo-plain`, ...), device names filled in. For the CLI's test that its parser takes every one.
pub fn turbotun_command_lines() -> Vec<(String, Vec<String>)> {
    let fwd = modes::TURBOTUN_MODES.iter().map(|m| {
        let argv = ["fwd", "tta", "ttb"].into_iter().chain(m.args.iter().copied()).map(String::from).collect();
        (format!("turbotun-{}", m.label), argv)
    });
    let echo = echo::VARIANTS.iter().map(|v| {
        let argv = v.argv.iter().map(|a| if *a == "{dev}" { "tte0" } else { a }).map(|a| a.to_string()).collect();
        (v.label.to_string(), argv)
    });
    fwd.chain(echo).collect()
}

/// Runs a helper process of the bench (see [`Helper`]).
pub fn run_helper(helper: &Helper) -> Result<()> {
    match helper {
        Helper::NaiveEcho { dev } => echo::naive_echo(dev),
        Helper::CeilingFwd { dev_a, dev_b } => ceiling::ceiling_fwd(dev_a, dev_b),
        Helper::WgFlood { dest, key, from, rate, duration } => {
            wgflood::run(*dest, key.as_deref(), from, *rate, duration.unwrap_or(10))
        }
        Helper::WgStorm { dest, key, peers, deadline } => stormgen::run(*dest, key, *peers, deadline.unwrap_or(300)),
        Helper::UdpGen(_) | Helper::UdpSink(_) | Helper::UdpRoundtrip(_) => run_generator_or_sink(helper),
    }
}

/// `turbotun bench`: the bench these options select; its report on standard output, progress and notes on
/// standard error.
pub fn run(args: &Options) -> Result<()> {
    let exe = std::env::current_exe().context("locate the turbotun executable")?;
    let peers_dir = modes::peers_dir(&exe);
    if args.vhost_user && args.list {
        vhost::print_list();
        return Ok(());
    }
    if args.tunnel && args.list {
        tunnel::print_list(&exe, peers_dir.as_deref());
        return Ok(());
    }
    let (all, mut unavailable) = modes::all_modes(&exe, &modes::Support::probe(), peers_dir.as_deref());
    if args.list {
        print_list(&all, &unavailable, peers_dir.as_deref());
        return Ok(());
    }

    preflight(args)?;
    if let Some(c) = &args.chart {
        chart::check_path(c)?;
    }
    if args.vhost_user {
        let mut ctx = new_ctx(args, exe, args.duration.unwrap_or(if args.quick { 1 } else { 5 }))?;
        let failures = vhost::run(&mut ctx, args).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&ctx.log_dir);
        })?;
        finish(&ctx, failures, false);
        return Ok(());
    }
    if args.tunnel {
        let mut ctx = new_ctx(args, exe, args.duration.unwrap_or(if args.quick { 3 } else { 10 }))?;
        match tunnel::run(&mut ctx, args, peers_dir.as_deref()) {
            Ok((failures, build_failed)) => finish(&ctx, failures, build_failed),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&ctx.log_dir);
                return Err(e);
            }
        }
        return Ok(());
    }
    if args.wg_scale {
        let mut ctx = new_ctx(args, exe, args.duration.unwrap_or(if args.quick { 2 } else { 5 }))?;
        let failures = wgscale::run(&mut ctx, args, peers_dir.as_deref()).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&ctx.log_dir);
        })?;
        finish(&ctx, failures, false);
        return Ok(());
    }
    if args.wg_storm {
        let mut ctx = new_ctx(args, exe, args.duration.unwrap_or(5))?;
        let failures = wgstorm::run(&mut ctx, args, peers_dir.as_deref()).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&ctx.log_dir);
        })?;
        finish(&ctx, failures, false);
        return Ok(());
    }
    if args.echo {
        let mut ctx = new_ctx(args, exe, args.duration.unwrap_or(if args.quick { 2 } else { 5 }))?;
        let failures = echo::run(&mut ctx, args)?;
        finish(&ctx, failures, false);
        return Ok(());
    }
    if args.loss {
        let mut ctx = new_ctx(args, exe, args.duration.unwrap_or(if args.quick { 2 } else { 5 }))?;
        let selected = select_modes(args, &all, &unavailable)?;
        let (selected, build_failed) =
            modes::ensure_peers_built(selected, peers_dir.as_deref(), &mut unavailable, &ctx.log_dir)?;
        if selected.is_empty() {
            bail!("no runnable mode selected (see `turbotun bench --list`)");
        }
        warn_about(&selected);
        let failures = loss::run(&mut ctx, args, &selected, unavailable)?;
        finish(&ctx, failures, build_failed);
        return Ok(());
    }
    let mut plan = Plan::new(args, &all, &unavailable)?;
    if let Some(d) = &args.flamegraph {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let mut ctx = new_ctx(args, exe, plan.duration)?;
    let (selected, build_failed) =
        modes::ensure_peers_built(plan.modes, peers_dir.as_deref(), &mut unavailable, &ctx.log_dir)?;
    plan.modes = selected;
    if plan.modes.is_empty() {
        bail!("no runnable mode selected (see `turbotun bench --list`)");
    }
    warn_about(&plan.modes);

    let started_unix = now_unix();
    let (runs, failures) = match measure(&mut ctx, &plan, args.flamegraph.as_deref()) {
        Ok(measured) => measured,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&ctx.log_dir);
            return Err(e);
        }
    };
    let report = build_report(&plan, args.ipv6, started_unix, unavailable, runs);
    write_outputs(args, &report, &plan)?;
    finish(&ctx, failures, build_failed);
    Ok(())
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// What every kind of bench run needs: a private log directory, the signal flag, names unique to this process.
fn new_ctx(args: &Options, exe: PathBuf, duration: u64) -> Result<Ctx> {
    if duration == 0 {
        bail!("nothing to do: --duration must be at least 1");
    }
    // A private directory (mode 0700, random name, created atomically): a predictable path in /tmp could be a
    // link planted by another local user before a root bench writes there.
    let log_dir = tempfile::Builder::new()
        .prefix("turbotun-bench-")
        .tempdir()
        .context("create the bench's private log directory")?
        .keep();
    Ok(Ctx {
        exe,
        prefix: format!("tt{}", std::process::id()),
        duration,
        ipv6: args.ipv6,
        log_dir,
        stop: stop_on_signals()?,
        run_counter: 0,
        clk_tck: procfs::clk_tck()?,
        txqueuelen: None,
        count_syscalls: false,
        flood_rate_pps: args.flood_rate_kpps * 1000,
    })
}

/// The logs go unless something failed, in which case the user is told where they are.
fn finish(ctx: &Ctx, failures: usize, build_failed: bool) {
    if failures == 0 && !build_failed {
        let _ = std::fs::remove_dir_all(&ctx.log_dir);
    } else {
        eprintln!(
            "turbotun bench: {failures} run(s) failed{}; logs kept in {}",
            if build_failed { ", a peer build failed" } else { "" },
            ctx.log_dir.display()
        );
    }
}

/// How long a sink goes on after the last datagram: the queues on the way (at most a ring of 10,000 at a
/// forwarder's 100 kpps) drain in far less.
const SINK_IDLE: Duration = Duration::from_millis(500);

/// The hidden `--udp-gen`, `--udp-sink` and `--udp-roundtrip`: one side of the generator's traffic (both for
/// the echo), started by the bench inside a run's namespace; prints its report as one JSON line.
fn run_generator_or_sink(helper: &Helper) -> Result<()> {
    let line = match helper {
        Helper::UdpGen(u) => {
            let secs = u.duration.unwrap_or(10);
            serde_json::to_string(&gen::generate(u.target, u.len, u.gso, u.rate, secs as f64)?)?
        }
        Helper::UdpSink(u) => {
            let max = Duration::from_secs(u.duration.unwrap_or(10) + 10);
            serde_json::to_string(&gen::sink(u.target, SINK_IDLE, max)?)?
        }
        Helper::UdpRoundtrip(u) => {
            let secs = u.duration.unwrap_or(10);
            let sent = || println!("{}", gen::SENT_LINE);
            let r = gen::roundtrip(u.target, u.len, u.gso, u.rate, secs as f64, SINK_IDLE, sent)?;
            serde_json::to_string(&r)?
        }
        _ => bail!("neither --udp-gen, --udp-sink nor --udp-roundtrip given"),
    };
    println!("{line}");
    Ok(())
}

/// Notes on the selected modes, and on a debug build, before minutes of measuring.
fn warn_about(selected: &[Mode]) {
    for m in selected {
        if let Some(note) = &m.note {
            eprintln!("turbotun bench: {}: {note}", m.label);
        }
    }
    if cfg!(debug_assertions) && selected.iter().any(|m| m.family == "turbotun") {
        eprintln!(
            "turbotun bench: warning: this is a debug build, so turbotun's forwarder runs unoptimized; \
             use `cargo run --release -p turbotun-cli -- bench ...` for figures"
        );
    }
}

/// A flag set by SIGINT or SIGTERM, so that the run in progress stops and tears down; a second signal while
/// tearing down exits at once.
fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))?;
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    Ok(stop)
}

fn progress_bar(total: u64) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.enable_steady_tick(Duration::from_millis(250));
    pb
}

/// Every run of the plan, then the flamegraph runs if asked for: the records and how many runs failed. An
/// error only when interrupted.
fn measure(ctx: &mut Ctx, plan: &Plan, flamegraph: Option<&Path>) -> Result<(Vec<RunRecord>, usize)> {
    let profiled: Vec<&Mode> =
        if flamegraph.is_some() { plan.modes.iter().filter(|m| m.is_forwarder()).collect() } else { Vec::new() };
    let total = plan.runs() + profiled.len() as u64;
    eprintln!(
        "turbotun bench: {} mode(s) × {} traffic kind(s) × {} rep(s), {} s each, IPv{} (~{} min)",
        plan.modes.len(),
        plan.traffic.len(),
        plan.reps,
        plan.duration,
        if ctx.ipv6 { 6 } else { 4 },
        (total * (plan.duration + 1)).div_ceil(60)
    );
    let pb = progress_bar(total);
    let measured = measure_runs(ctx, plan, &pb).and_then(|measured| {
        if let Some(dir) = flamegraph {
            profile(ctx, &profiled, &plan.traffic[0], dir, &pb)?;
        }
        Ok(measured)
    });
    pb.finish_and_clear();
    measured
}

/// The repetitions, interleaved round-robin: rep 1 of every traffic kind and mode, then rep 2, ...
fn measure_runs(ctx: &mut Ctx, plan: &Plan, pb: &ProgressBar) -> Result<(Vec<RunRecord>, usize)> {
    let mut runs = Vec::new();
    let mut broken: Vec<(String, String)> = Vec::new();
    let mut failures = 0;
    for rep in 1..=plan.reps {
        for t in &plan.traffic {
            for m in &plan.modes {
                pb.set_message(format!("rep {rep}/{} {} {}", plan.reps, t.label, m.label));
                let rec = measure_one(ctx, m, t, rep, &mut broken)?;
                if let Some(err) = &rec.error {
                    failures += 1;
                    pb.suspend(|| eprintln!("turbotun bench: {} {} rep {rep}: {err}", m.label, t.label));
                }
                runs.push(rec);
                pb.inc(1);
            }
        }
    }
    Ok((runs, failures))
}

/// One run, or the record of its failure; an error only when interrupted. A mode whose forwarder never came up
/// is `broken` and skipped from then on.
fn measure_one(
    ctx: &mut Ctx,
    m: &Mode,
    t: &Traffic,
    rep: u32,
    broken: &mut Vec<(String, String)>,
) -> Result<RunRecord> {
    let ipv6 = ctx.ipv6;
    let failed = |msg: String| RunRecord { error: Some(msg), ..run_record(m, t, rep, ipv6) };
    if let Some((_, why)) = broken.iter().find(|(b, _)| *b == m.label) {
        return Ok(failed(format!("skipped: {why}")));
    }
    match run_one(ctx, m, t, rep, None) {
        Ok(r) => Ok(r),
        Err(e) if ctx.interrupted() => Err(interrupted(e)),
        Err(e) => {
            let msg = format!("{e:#}");
            if is_not_ready(&e) {
                broken.push((m.label.clone(), msg.clone()));
            }
            Ok(failed(msg))
        }
    }
}

/// One extra run of traffic `t` per forwarder mode under perf, so that perf does not disturb the measured ones:
/// DIR/offload.svg for turbotun's modes, DIR/tunrs-offload.svg for the peers.
fn profile(ctx: &mut Ctx, modes: &[&Mode], t: &Traffic, dir: &Path, pb: &ProgressBar) -> Result<()> {
    for m in modes {
        pb.set_message(format!("flamegraph {} {}", t.label, m.label));
        let name = if m.family == "turbotun" { m.short() } else { m.label.as_str() };
        let svg = dir.join(format!("{name}.svg"));
        match run_one(ctx, m, t, 0, Some(&svg)) {
            Ok(_) => pb.suspend(|| eprintln!("turbotun bench: wrote {}", svg.display())),
            Err(e) if ctx.interrupted() => return Err(interrupted(e)),
            Err(e) => pb.suspend(|| eprintln!("turbotun bench: flamegraph of {}: {e:#}", m.label)),
        }
        pb.inc(1);
    }
    Ok(())
}

fn build_report(
    plan: &Plan,
    ipv6: bool,
    started_unix: u64,
    not_available: Vec<Unavailable>,
    runs: Vec<RunRecord>,
) -> Report {
    let mode_list: Vec<(String, String)> = plan.modes.iter().map(|m| (m.label.clone(), m.family.to_string())).collect();
    Report {
        header: ReportHeader::here("turbotun bench", started_unix),
        duration_s: plan.duration,
        reps: plan.reps,
        ipv6,
        modes: mode_list.iter().map(|m| m.0.clone()).collect(),
        traffic: plan.traffic.iter().map(|t| t.label.to_string()).collect(),
        not_available,
        summary: report::summarize(&runs, &mode_list, &plan.traffic),
        runs,
        cycles: None,
    }
    .with_cycles(ipv6, &plan.traffic)
}

impl Report {
    /// The cycle estimates, when the CPU's clock is known.
    fn with_cycles(mut self, ipv6: bool, traffic: &[Traffic]) -> Report {
        let mhz = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|c| procfs::parse_cpuinfo_mhz(&c));
        let Some(mhz) = mhz else { return self };
        let cycles = report::Cycles { mhz, pmu: pmu_state() };
        let udp: Vec<&str> = traffic.iter().filter(|t| t.udp).map(|t| t.label).collect();
        report::add_cycles(&mut self.summary, &self.runs, &cycles, ipv6, &udp);
        self.cycles = Some(cycles);
        self
    }
}

/// Whether hardware cycles can be counted here (`perf stat -e cycles true`), said as the reason the figures are
/// estimates: the bench estimates either way, so that every run and peer is measured alike.
fn pmu_state() -> String {
    let out = std::process::Command::new("perf").args(["stat", "-x,", "-e", "cycles", "true"]).output();
    match out {
        Err(e) => format!("perf is not installed ({e}); no hardware cycle counts"),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let line = err.lines().find(|l| l.contains("cycles")).unwrap_or("").trim().to_string();
            if line.contains("<not supported>") || line.contains("<not counted>") || !o.status.success() {
                format!("this machine has no PMU for perf (`perf stat -e cycles` answers `{line}`)")
            } else {
                format!("perf counts cycles here (`{line}`), but the bench estimates them alike for every row")
            }
        }
    }
}

/// The running kernel's release.
fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string()
}

fn cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// `release` or `debug`: turbotun's forwarder and echo are this same binary.
fn build_kind() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Writes the JSON document if asked for, and says so.
fn write_json<T: serde::Serialize>(path: Option<&Path>, doc: &T) -> Result<()> {
    if let Some(p) = path {
        let text = serde_json::to_string_pretty(doc)?;
        std::fs::write(p, text + "\n").with_context(|| format!("write {}", p.display()))?;
        eprintln!("turbotun bench: wrote {}", p.display());
    }
    Ok(())
}

/// The Markdown report on stdout, last, and without panicking when stdout is a closed pipe (`| head`): the
/// files are written already.
fn print_markdown(text: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The JSON and the chart if asked for, then the Markdown report on stdout.
fn write_outputs(args: &Options, report: &Report, plan: &Plan) -> Result<()> {
    write_json(args.json.as_deref(), report)?;
    if let Some(p) = &args.chart {
        let title = format!(
            "turbotun bench — {} s × {} rep(s), IPv{}, {}",
            plan.duration,
            plan.reps,
            if args.ipv6 { 6 } else { 4 },
            report.header.kernel
        );
        chart::write_chart(p, &report.summary, &plan.traffic, &title)?;
        eprintln!("turbotun bench: wrote {}", p.display());
    }
    print_markdown(&report::markdown(report, &plan.traffic));
    Ok(())
}

fn print_list(all: &[Mode], unavailable: &[Unavailable], peers: Option<&Path>) {
    println!("modes:");
    for m in all {
        let note = match &m.kind {
            modes::Kind::Forwarder { program, .. } | modes::Kind::BridgedForwarder { program, .. }
                if m.is_peer() && !program.is_file() =>
            {
                " (built on first use by bench/peers/build.sh)".to_string()
            }
            _ => m.note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default(),
        };
        println!("  {:<27} {}{note}", m.label, m.family);
    }
    for u in unavailable {
        println!("  {:<27} not available: {}", u.mode, u.reason);
    }
    println!("traffic kinds:");
    for t in TRAFFIC {
        println!("  {:<27} {}", t.label, t.description);
    }
    println!("quick modes: {}", modes::QUICK_MODES.join(", "));
    match peers {
        Some(p) => println!("peers directory: {}", p.display()),
        None => println!("peers directory: not found (set TURBOTUN_PEERS_DIR)"),
    }
}

/// Root and the tools, with the package to install.
fn preflight(args: &Options) -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if procfs::parse_status_euid(&status) != Some(0) {
        bail!(
            "turbotun bench must run as root (it creates network namespaces and TUN devices): try `sudo {}`",
            std::env::args().collect::<Vec<_>>().join(" ")
        );
    }
    // The loss and echo benches make their traffic with turbotun's own generator, the vhost-user bench with
    // testpmd (whose absence makes rows unavailable, said per row).
    let mut tools =
        if args.loss || args.echo || args.vhost_user || args.wg_scale { vec![] } else { vec![("iperf3", "iperf3")] };
    if args.flamegraph.is_some() {
        tools.push(("perf", "linux-perf (Debian) or linux-tools-generic (Ubuntu)"));
    }
    let missing: Vec<String> = tools
        .iter()
        .filter(|(t, _)| modes::which(t).is_none())
        .map(|(t, p)| format!("{t} (apt-get install {p})"))
        .collect();
    if !missing.is_empty() {
        bail!("missing tools: {}", missing.join(", "));
    }
    if let Some(b) = &args.baseline {
        if !b.is_file() {
            bail!("--baseline {}: no such file (build the other commit with `cargo build --release`)", b.display());
        }
    }
    Ok(())
}
