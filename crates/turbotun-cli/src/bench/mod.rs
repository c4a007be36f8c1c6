//! `turbotun bench`: forwarders between two network namespaces measured with iperf3, side by side with the
//! peers (tun-rs, wireguard-go) and the kernel baselines (veth, loopback); with `--tunnel`, VPN-style tunnels
//! between the namespaces (tunnel.rs); with `--vhost-user`, vhost-user-net backends between a guest's rings and a
//! TAP (vhost.rs). See docs/BENCH.md.
//!
//! Every (mode, traffic kind, repetition) gets a fresh pair of namespaces and a fresh forwarder; repetitions
//! are interleaved round-robin (rep 1 of every traffic kind and mode, then rep 2, ...).

mod ceiling;
mod chart;
mod echo;
mod flame;
mod gen;
mod iperf;
mod loss;
mod modes;
mod netcfg;
mod perfstat;
mod process;
mod procfs;
mod report;
mod runner;
mod stats;
mod testpmd;
mod topo;
mod tunnel;
mod vguest;
mod vhost;
mod wgflood;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use iperf::{Traffic, TRAFFIC};
use modes::{Mode, Unavailable};
use report::{Report, ReportHeader, RunRecord};
use runner::{interrupted, is_not_ready, run_one, run_record, Ctx};

/// Arguments of `turbotun bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Short run (the main job): 3 s, 1 repetition, modes veth, turbotun-offload, turbotun-plain, tunrs-offload,
    /// traffic tcp and udp64. --duration, --reps, --modes and --traffic still override. Never includes the
    /// tunnel bench; with --tunnel: every tunnel kind, tcp and udp1372, 1 repetition of 3 s.
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated modes: labels from --list, a turbotun mode without its prefix (`offload`), or a family
    /// (`turbotun`, `tunrs`, `wggo`, `peers`, `baselines`). Default: every available mode.
    #[arg(long, value_delimiter = ',')]
    pub modes: Option<Vec<String>>,
    /// Comma-separated traffic kinds (tcp, tcp4, udp64, udp1400, gso64; see --list). Default: all.
    #[arg(long, value_delimiter = ',')]
    pub traffic: Option<Vec<String>>,
    /// Seconds per run (default 10, 3 with --quick; --loss and --echo: 5, 2 with --quick).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Repetitions of every (mode, traffic) pair, interleaved round-robin (default 3, 1 with --quick).
    #[arg(long, value_name = "N")]
    pub reps: Option<u32>,
    /// Run the IPv6 variant (fd00:1::1/64, fd00:2::1/64, no DAD) instead of IPv4.
    #[arg(long)]
    pub ipv6: bool,
    /// Write every run and the summary as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a grouped bar chart (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,
    /// Profile each forwarder mode in one extra run of the first traffic kind (perf record -e cpu-clock -g)
    /// and write DIR/MODE.svg (turbotun modes) or DIR/PEER-MODE.svg (peers), with perf's recording beside each
    /// (MODE.perf.data, for `perf report -i FILE --sort dso,sym`).
    #[arg(long, value_name = "DIR")]
    pub flamegraph: Option<PathBuf>,
    /// List the modes (and whether they are available) and the traffic kinds, then exit.
    #[arg(long)]
    pub list: bool,
    /// Loss instead of iperf3: paced 64-byte UDP through each forwarder at offered rates in steps, a
    /// pktgen-style table of where datagrams were lost, then each forwarder's no-drop rate (RFC 2544 binary
    /// search). Honours --quick, --modes, --duration (seconds per trial), --ipv6, --json, --chart.
    #[arg(long, conflicts_with_all = ["echo", "traffic", "flamegraph", "reps"])]
    pub loss: bool,
    /// Echo instead of forwarding: UDP load routed into an echo device, answers per second of a naive echo
    /// and of `turbotun echo --mode plain|offload`. Honours --quick, --modes (naive, plain, offload),
    /// --duration, --reps, --ipv6, --json, --chart.
    #[arg(long, conflicts_with_all = ["traffic", "flamegraph"])]
    pub echo: bool,
    /// Tunnels instead of forwarders: VPN-style tunnels between two namespaces over a veth underlay (veth,
    /// the kernel's VXLAN, turbotun tunnel, turbotun wg, wireguard-go, boringtun, GotaTun), iperf3 TCP and UDP
    /// through each, with every endpoint's CPU, peak RSS and system calls per GB. Honours --quick, --duration,
    /// --reps, --traffic (tcp, tcp4, udp1372), --json, --chart, --list.
    #[arg(long, conflicts_with_all = ["loss", "echo", "modes", "flamegraph", "ipv6"])]
    pub tunnel: bool,
    /// With --tunnel: comma-separated tunnel kinds (veth, vxlan, turbotun-plain, turbotun-wg, wireguard-go,
    /// boringtun, gotatun, turbotun-wg-vs-wireguard-go; and, only when named, the two-queue endpoints
    /// turbotun-plain-q2 and turbotun-wg-q2, and the handshake-flood kinds turbotun-wg-flood1,
    /// turbotun-wg-flood64, wireguard-go-flood1, each compared with its kind without the flood). Default: all but
    /// those named-only kinds; those that cannot run here are listed as skipped.
    #[arg(long, value_delimiter = ',', value_name = "KIND", requires = "tunnel")]
    pub tunnel_kinds: Option<Vec<String>>,
    /// vhost-user-net backends instead of forwarders: a DPDK virtio-user front end (testpmd, txonly, 64-byte
    /// frames) into `turbotun vhost-user` and into DPDK's own vhost backend, each writing into a TAP in a
    /// private namespace; frames per second reaching the TAP, the backend's CPU, and packets per backend
    /// CPU-second. Honours --quick (1 repetition of 1 s), --duration, --reps, --json, --list, --baseline
    /// (`turbotun@baseline`, `tso@baseline`, `no-offload@baseline`).
    #[arg(long, conflicts_with_all = ["loss", "echo", "tunnel", "modes", "traffic", "flamegraph", "ipv6", "chart"])]
    pub vhost_user: bool,
    /// With --tunnel: do not count the endpoints' system calls. Counting enables a syscall tracepoint, which
    /// slows every system call on the machine a little, and endpoints that make millions per GB visibly.
    #[arg(long, requires = "tunnel")]
    pub no_syscalls: bool,
    /// The A/B of a change: also run turbotun's modes with this other build of turbotun (e.g. the commit before
    /// the change, built with `cargo build --release`), interleaved with this build's in the same rounds: each
    /// selected forwarder mode as `MODE@baseline`, with --tunnel `turbotun-plain@baseline` and
    /// `turbotun-wg@baseline`, with --vhost-user `turbotun@baseline`, `tso@baseline` and `no-offload@baseline`.
    #[arg(long, value_name = "TURBOTUN", conflicts_with_all = ["echo"])]
    pub baseline: Option<PathBuf>,
    /// With --loss: the loss table at each of these queue lengths of the devices (for a TUN device, its ring),
    /// e.g. 500,1000,10000. Default: the kernel's (500 for TUN).
    #[arg(long, value_delimiter = ',', value_name = "N", requires = "loss")]
    pub txqueuelen: Option<Vec<u32>>,
    /// With --loss: the offered rates of the table, thousands of datagrams per second (default
    /// 25,50,100,150,200,300; 50,150,300 with --quick). The no-drop search runs up to the highest.
    #[arg(long, value_delimiter = ',', value_name = "KPPS", requires = "loss")]
    pub rates: Option<Vec<u64>>,
    /// Internal: run the UDP generator toward ADDR:PORT for --duration seconds, print a JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub udp_gen: Option<std::net::SocketAddr>,
    /// Internal: run the UDP sink on ADDR:PORT, print a JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub udp_sink: Option<std::net::SocketAddr>,
    /// Internal: datagram payload length for --udp-gen (at least 16; --udp-sink reads each datagram's own).
    #[arg(long, hide = true, default_value_t = 64)]
    pub udp_len: usize,
    /// Internal: datagrams per GSO send for --udp-gen.
    #[arg(long, hide = true, default_value_t = 64)]
    pub udp_gso: u16,
    /// Internal: datagrams per second for --udp-gen and --udp-roundtrip (0: unlimited).
    #[arg(long, hide = true, default_value_t = 0)]
    pub udp_rate: u64,
    /// Internal: the generator toward an echo at ADDR:PORT and a sink counting its answers, in one process;
    /// prints both reports as one JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub udp_roundtrip: Option<std::net::SocketAddr>,
    /// Internal: the naive echo on TUN device DEV (created): one packet per read and per write, no virtio
    /// header; prints `ready`, and its counters as one JSON line when stopped.
    #[arg(long, hide = true, value_name = "DEV")]
    pub naive_echo: Option<String>,
    /// Internal: the ceiling forwarder between TUN devices DEV_A and DEV_B (created): virtio header and every
    /// offload, one blocking read and one write per frame, header untouched (the `turbotun-ceiling` row).
    #[arg(long, hide = true, num_args = 2, value_names = ["DEV_A", "DEV_B"])]
    pub ceiling_fwd: Option<Vec<String>>,
    /// Internal: flood ADDR:PORT with WireGuard handshake initiations (random content, valid mac1) for
    /// --duration seconds or until SIGTERM, print a JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub wg_flood: Option<std::net::SocketAddr>,
    /// Internal: the flooded server's public key (base64), for --wg-flood.
    #[arg(long, hide = true, value_name = "KEY", requires = "wg_flood")]
    pub wg_flood_key: Option<String>,
    /// Internal: comma-separated source addresses of --wg-flood, taken in turn (default: the wildcard).
    #[arg(long, hide = true, value_delimiter = ',', value_name = "ADDR", requires = "wg_flood")]
    pub wg_flood_from: Vec<std::net::IpAddr>,
    /// Internal: initiations per second of --wg-flood (0: as fast as the kernel takes them).
    #[arg(long, hide = true, default_value_t = 0, requires = "wg_flood")]
    pub wg_flood_rate: u64,
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
    fn new(args: &BenchArgs, all: &[Mode], unavailable: &[Unavailable]) -> Result<Plan> {
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
fn select_modes(args: &BenchArgs, all: &[Mode], unavailable: &[Unavailable]) -> Result<Vec<Mode>> {
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

fn select_traffic(args: &BenchArgs) -> Result<Vec<Traffic>> {
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

pub fn run(args: &BenchArgs) -> Result<()> {
    if let Some(dev) = &args.naive_echo {
        return echo::naive_echo(dev);
    }
    if let Some([a, b]) = args.ceiling_fwd.as_deref() {
        return ceiling::ceiling_fwd(a, b);
    }
    if let Some(dest) = args.wg_flood {
        return wgflood::run(
            dest,
            args.wg_flood_key.as_deref(),
            &args.wg_flood_from,
            args.wg_flood_rate,
            args.duration.unwrap_or(10),
        );
    }
    if args.udp_gen.is_some() || args.udp_sink.is_some() || args.udp_roundtrip.is_some() {
        return run_generator_or_sink(args);
    }
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
fn new_ctx(args: &BenchArgs, exe: PathBuf, duration: u64) -> Result<Ctx> {
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
fn run_generator_or_sink(args: &BenchArgs) -> Result<()> {
    let secs = args.duration.unwrap_or(10);
    let line = if let Some(dest) = args.udp_gen {
        serde_json::to_string(&gen::generate(dest, args.udp_len, args.udp_gso, args.udp_rate, secs as f64)?)?
    } else if let Some(addr) = args.udp_sink {
        let max = Duration::from_secs(secs + 10);
        serde_json::to_string(&gen::sink(addr, SINK_IDLE, max)?)?
    } else if let Some(dest) = args.udp_roundtrip {
        let sent = || println!("{}", gen::SENT_LINE);
        let r = gen::roundtrip(dest, args.udp_len, args.udp_gso, args.udp_rate, secs as f64, SINK_IDLE, sent)?;
        serde_json::to_string(&r)?
    } else {
        bail!("neither --udp-gen, --udp-sink nor --udp-roundtrip given");
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
fn write_outputs(args: &BenchArgs, report: &Report, plan: &Plan) -> Result<()> {
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
fn preflight(args: &BenchArgs) -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if procfs::parse_status_euid(&status) != Some(0) {
        bail!(
            "turbotun bench must run as root (it creates network namespaces and TUN devices): try `sudo {}`",
            std::env::args().collect::<Vec<_>>().join(" ")
        );
    }
    // The loss and echo benches make their traffic with turbotun's own generator, the vhost-user bench with
    // testpmd (whose absence makes rows unavailable, said per row).
    let mut tools = if args.loss || args.echo || args.vhost_user { vec![] } else { vec![("iperf3", "iperf3")] };
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
