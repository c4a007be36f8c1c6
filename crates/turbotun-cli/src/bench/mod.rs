//! `turbotun bench`: forwarders between two network namespaces measured with iperf3, side by side with the
//! peers (tun-rs, wireguard-go) and the kernel baselines (veth, loopback). See docs/BENCH.md.
//!
//! Every (mode, traffic kind, repetition) gets a fresh pair of namespaces and a fresh forwarder; repetitions
//! are interleaved round-robin (rep 1 of every traffic kind and mode, then rep 2, ...).

mod chart;
mod flame;
mod gen;
mod iperf;
mod modes;
mod netcfg;
mod procfs;
mod report;
mod stats;
mod topo;

use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use iperf::{Traffic, TRAFFIC};
use modes::{Mode, Unavailable};
use netcfg::Netns;
use report::{Report, RunRecord};
use topo::{sleep_checked, terminate, wait_timeout, Topology};

/// Arguments of `turbotun bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Short run (the main job): 3 s, 1 repetition, modes veth, turbotun-offload, turbotun-plain, tunrs-offload,
    /// traffic tcp and udp64. --duration, --reps, --modes and --traffic still override.
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated modes: labels from --list, a turbotun mode without its prefix (`offload`), or a family
    /// (`turbotun`, `tunrs`, `wggo`, `peers`, `baselines`). Default: every available mode.
    #[arg(long, value_delimiter = ',')]
    pub modes: Option<Vec<String>>,
    /// Comma-separated traffic kinds (tcp, tcp4, udp64, udp1400, gso64; see --list). Default: all.
    #[arg(long, value_delimiter = ',')]
    pub traffic: Option<Vec<String>>,
    /// Seconds per run (default 10, 3 with --quick).
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
    /// and write DIR/MODE.svg (turbotun modes) or DIR/PEER-MODE.svg (peers).
    #[arg(long, value_name = "DIR")]
    pub flamegraph: Option<PathBuf>,
    /// List the modes (and whether they are available) and the traffic kinds, then exit.
    #[arg(long)]
    pub list: bool,
    /// Internal: run the UDP generator toward ADDR:PORT for --duration seconds, print a JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub udp_gen: Option<std::net::SocketAddr>,
    /// Internal: run the UDP sink on ADDR:PORT, print a JSON line.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub udp_sink: Option<std::net::SocketAddr>,
    /// Internal: datagram payload length for --udp-gen/--udp-sink.
    #[arg(long, hide = true, default_value_t = 64)]
    pub udp_len: usize,
    /// Internal: datagrams per GSO send for --udp-gen.
    #[arg(long, hide = true, default_value_t = 64)]
    pub udp_gso: u16,
}

/// UDP port of the generator's sink (iperf3 uses 5201).
const SINK_PORT: u16 = 5202;

/// Kills (SIGTERM, then SIGKILL) a child process when dropped.
#[derive(Debug)]
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        terminate(&mut self.0, Duration::from_secs(1));
    }
}

/// Everything a run needs besides the mode and traffic.
#[derive(Debug)]
struct Ctx {
    exe: PathBuf,
    prefix: String,
    duration: u64,
    ipv6: bool,
    log_dir: PathBuf,
    stop: Arc<AtomicBool>,
    run_counter: u32,
    /// Clock ticks per second of the forwarder's CPU times.
    clk_tck: f64,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if let Some(dest) = args.udp_gen {
        let secs = args.duration.unwrap_or(10) as f64;
        let r = gen::generate(dest, args.udp_len, args.udp_gso, secs)?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    if let Some(addr) = args.udp_sink {
        let max = Duration::from_secs(args.duration.unwrap_or(10) + 10);
        let r = gen::sink(addr, args.udp_len, Duration::from_secs(1), max)?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let exe = std::env::current_exe().context("locate the turbotun executable")?;
    let peers_dir = modes::peers_dir(&exe);
    let (all, mut unavailable) = modes::all_modes(&exe, &modes::Support::probe(), peers_dir.as_deref());

    if args.list {
        print_list(&all, &unavailable, peers_dir.as_deref());
        return Ok(());
    }

    preflight(args)?;

    // Selection.
    let quick_modes: Vec<String> = modes::QUICK_MODES.iter().map(|s| s.to_string()).collect();
    let mode_filter = match (&args.modes, args.quick) {
        (Some(m), _) => m.clone(),
        (None, true) => quick_modes,
        (None, false) => all.iter().map(|m| m.label.clone()).collect(),
    };
    let selected = modes::select_modes(&all, &unavailable, &mode_filter)?;
    let traffic: Vec<Traffic> = match (&args.traffic, args.quick) {
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
            .collect::<Result<_>>()?,
        (None, true) => ["tcp", "udp64"].iter().filter_map(|l| iperf::traffic_by_label(l)).collect(),
        (None, false) => TRAFFIC.to_vec(),
    };
    let duration = args.duration.unwrap_or(if args.quick { 3 } else { 10 });
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 3 });
    if duration == 0 || reps == 0 || traffic.is_empty() {
        bail!("nothing to do: --duration and --reps must be at least 1 and --traffic not empty");
    }
    if let Some(c) = &args.chart {
        chart::check_path(c)?;
    }
    if let Some(d) = &args.flamegraph {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }

    let pid = std::process::id();
    let log_dir = std::env::temp_dir().join(format!("turbotun-bench-{pid}"));
    std::fs::create_dir_all(&log_dir).context("create log directory")?;
    let (selected, build_failed) =
        modes::ensure_peers_built(selected, peers_dir.as_deref(), &mut unavailable, &log_dir)?;
    if selected.is_empty() {
        bail!("no runnable mode selected (see `turbotun bench --list`)");
    }
    for m in &selected {
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

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while tearing down exits at once.
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))?;
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }

    let mut ctx = Ctx {
        exe: exe.clone(),
        prefix: format!("tt{pid}"),
        duration,
        ipv6: args.ipv6,
        log_dir,
        stop,
        run_counter: 0,
        clk_tck: procfs::clk_tck()?,
    };
    let profiled: Vec<&Mode> =
        if args.flamegraph.is_some() { selected.iter().filter(|m| m.is_forwarder()).collect() } else { Vec::new() };
    let total = reps as u64 * traffic.len() as u64 * selected.len() as u64 + profiled.len() as u64;
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.enable_steady_tick(Duration::from_millis(250));
    eprintln!(
        "turbotun bench: {} mode(s) × {} traffic kind(s) × {reps} rep(s), {duration} s each, IPv{} (~{} min)",
        selected.len(),
        traffic.len(),
        if args.ipv6 { 6 } else { 4 },
        (total * (duration + 1)).div_ceil(60)
    );

    let started_unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut runs: Vec<RunRecord> = Vec::new();
    let mut broken: Vec<(String, String)> = Vec::new();
    let mut failures = 0usize;
    for rep in 1..=reps {
        for t in &traffic {
            for m in &selected {
                pb.set_message(format!("rep {rep}/{reps} {} {}", t.label, m.label));
                let rec = if let Some((_, why)) = broken.iter().find(|(b, _)| *b == m.label) {
                    RunRecord { error: Some(format!("skipped: {why}")), ..run_record(m, t, rep, args.ipv6) }
                } else {
                    match run_one(&mut ctx, m, t, rep, None) {
                        Ok(r) => r,
                        Err(e) if ctx.stop.load(Ordering::Relaxed) => {
                            pb.finish_and_clear();
                            let _ = std::fs::remove_dir_all(&ctx.log_dir);
                            return Err(interrupted(e));
                        }
                        Err(e) => {
                            let msg = format!("{e:#}");
                            if e.chain().any(|c| c.downcast_ref::<topo::NotReady>().is_some()) {
                                broken.push((m.label.clone(), msg.clone()));
                            }
                            RunRecord { error: Some(msg), ..run_record(m, t, rep, args.ipv6) }
                        }
                    }
                };
                if let Some(err) = &rec.error {
                    failures += 1;
                    pb.suspend(|| eprintln!("turbotun bench: {} {} rep {rep}: {err}", m.label, t.label));
                }
                runs.push(rec);
                pb.inc(1);
            }
        }
    }
    if let Some(dir) = &args.flamegraph {
        let t = &traffic[0];
        for m in profiled {
            pb.set_message(format!("flamegraph {} {}", t.label, m.label));
            // DIR/offload.svg for turbotun's modes, DIR/tunrs-offload.svg for the peers.
            let name = if m.family == "turbotun" { m.short() } else { m.label.as_str() };
            let svg = dir.join(format!("{name}.svg"));
            match run_one(&mut ctx, m, t, 0, Some(&svg)) {
                Ok(_) => pb.suspend(|| eprintln!("turbotun bench: wrote {}", svg.display())),
                Err(e) if ctx.stop.load(Ordering::Relaxed) => {
                    pb.finish_and_clear();
                    let _ = std::fs::remove_dir_all(&ctx.log_dir);
                    return Err(interrupted(e));
                }
                Err(e) => pb.suspend(|| eprintln!("turbotun bench: flamegraph of {}: {e:#}", m.label)),
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();

    let mode_list: Vec<(String, String)> = selected.iter().map(|m| (m.label.clone(), m.family.to_string())).collect();
    let summary = report::summarize(&runs, &mode_list, &traffic);
    let report = Report {
        tool: "turbotun bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        build: if cfg!(debug_assertions) { "debug" } else { "release" }.into(),
        started_unix,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        duration_s: duration,
        reps,
        ipv6: args.ipv6,
        modes: mode_list.iter().map(|m| m.0.clone()).collect(),
        traffic: traffic.iter().map(|t| t.label.to_string()).collect(),
        not_available: unavailable.clone(),
        runs,
        summary,
    };
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(p, text + "\n").with_context(|| format!("write {}", p.display()))?;
        eprintln!("turbotun bench: wrote {}", p.display());
    }
    if let Some(p) = &args.chart {
        let title = format!(
            "turbotun bench — {} s × {} rep(s), IPv{}, {}",
            duration,
            reps,
            if args.ipv6 { 6 } else { 4 },
            report.kernel
        );
        chart::write_chart(p, &report.summary, &traffic, &title)?;
        eprintln!("turbotun bench: wrote {}", p.display());
    }
    // Last, and without panicking when stdout is a closed pipe (`| head`): the files are written already.
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(report::markdown(&report, &traffic).as_bytes());
        let _ = out.flush();
    }
    if failures == 0 && !build_failed {
        let _ = std::fs::remove_dir_all(&ctx.log_dir);
    } else {
        eprintln!(
            "turbotun bench: {failures} run(s) failed{}; logs kept in {}",
            if build_failed { ", a peer build failed" } else { "" },
            ctx.log_dir.display()
        );
    }
    Ok(())
}

fn print_list(all: &[Mode], unavailable: &[Unavailable], peers: Option<&Path>) {
    println!("modes:");
    for m in all {
        let note = match &m.kind {
            modes::Kind::Forwarder { program, .. } if m.is_peer() && !program.is_file() => {
                " (built on first use by bench/peers/build.sh)".to_string()
            }
            _ => m.note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default(),
        };
        println!("  {:<24} {}{note}", m.label, m.family);
    }
    for u in unavailable {
        println!("  {:<24} not available: {}", u.mode, u.reason);
    }
    println!("traffic kinds:");
    for t in TRAFFIC {
        println!("  {:<24} {}", t.label, t.description);
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
    let mut tools = vec![("iperf3", "iperf3")];
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
    Ok(())
}

/// Read a child's stdout to a string on a thread (so a chatty child never blocks on a full pipe).
fn collect_stdout(child: &mut Child) -> std::thread::JoinHandle<String> {
    let out = child.stdout.take();
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out {
            let _ = BufReader::new(o).read_to_string(&mut s);
        }
        s
    })
}

/// Run `CMD..` inside `ns` to completion within `timeout`, returning its stdout.
fn run_in_ns(
    ns: &Netns,
    cmd: &[&str],
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<(String, std::process::ExitStatus)> {
    let mut child = ns.spawn(
        Command::new(cmd[0]).args(&cmd[1..]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()),
    )?;
    let out = collect_stdout(&mut child);
    let mut child = KillOnDrop(child);
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = wait_timeout(&mut child.0, Duration::from_millis(100)) {
            break st;
        }
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        if Instant::now() >= deadline {
            bail!("{} did not finish within {} s", cmd[0], timeout.as_secs());
        }
    };
    Ok((out.join().unwrap_or_default(), status))
}

/// The record of one (mode, traffic, repetition), before anything is measured.
fn run_record(mode: &Mode, t: &Traffic, rep: u32, ipv6: bool) -> RunRecord {
    RunRecord {
        mode: mode.label.clone(),
        family: mode.family.into(),
        traffic: t.label.into(),
        rep,
        ipv6,
        ..Default::default()
    }
}

/// One run: topology, forwarder, iperf3 server and client, samples before and after the window.
fn run_one(ctx: &mut Ctx, mode: &Mode, t: &Traffic, rep: u32, flamegraph: Option<&Path>) -> Result<RunRecord> {
    ctx.run_counter += 1;
    let stop = Arc::clone(&ctx.stop);
    let mut topo = Topology::build(mode, &ctx.prefix, ctx.run_counter, ctx.ipv6, &ctx.log_dir, &stop)?;
    let mut rec = run_record(mode, t, rep, ctx.ipv6);

    // Server in B bound to B's address: iperf3 for one test, or our UDP sink.
    let srv_log = std::fs::File::create(ctx.log_dir.join(format!("server-{}.log", ctx.run_counter)))?;
    let v6_socket = topo.server_addr.contains(':');
    let sink_addr = if v6_socket {
        format!("[{}]:{SINK_PORT}", topo.server_addr)
    } else {
        format!("{}:{SINK_PORT}", topo.server_addr)
    };
    let duration_s = ctx.duration.to_string();
    let exe = ctx.exe.to_string_lossy().into_owned();
    let len_s = t.payload.to_string();
    let gso_s = t.gso.to_string();
    let server_cmd: Vec<&str> = if t.gso > 0 {
        vec![&exe, "bench", "--udp-sink", &sink_addr, "--udp-len", &len_s, "--duration", &duration_s]
    } else {
        vec!["iperf3", "-s", "-1", "-J", "-B", &topo.server_addr]
    };
    let mut server = topo
        .server()
        .spawn(
            Command::new(server_cmd[0])
                .args(&server_cmd[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(srv_log),
        )
        .context("start the server")?;
    let server_out = collect_stdout(&mut server);
    let mut server = KillOnDrop(server);
    if t.gso > 0 {
        topo.wait_bound(SINK_PORT, true, v6_socket, Duration::from_secs(5), &stop)?;
    } else {
        topo.wait_bound(5201, false, v6_socket, Duration::from_secs(5), &stop)?;
    }

    // Samples before the window.
    let fwd_pid = topo.forwarder.as_ref().map(|f| f.pid);
    let drops0 = topo.tx_dropped();
    let rcvbuf0 = if t.udp { topo.rcvbuf_errors(ctx.ipv6) } else { None };
    let rss_reset = fwd_pid.map(procfs::reset_peak_rss).unwrap_or(false);
    let ticks0 = fwd_pid.map(procfs::pid_cpu_ticks).transpose()?;
    let box0 = procfs::box_cpu()?;
    let t0 = Instant::now();
    let perf = match (flamegraph, fwd_pid) {
        (Some(svg), Some(pid)) => Some(flame::start(pid, ctx.duration, &svg.with_extension("perf.data"))?),
        _ => None,
    };

    let timeout = Duration::from_secs(ctx.duration + 10);
    let iperf = if t.gso > 0 {
        let cmd = [
            exe.as_str(),
            "bench",
            "--udp-gen",
            &sink_addr,
            "--udp-len",
            &len_s,
            "--udp-gso",
            &gso_s,
            "--duration",
            &duration_s,
        ];
        let (text, status) = run_in_ns(&topo.ns_a, &cmd, timeout, &stop)?;
        let g: gen::GenReport = serde_json::from_str(text.trim())
            .with_context(|| format!("UDP generator ({status}): {:?}", text.trim()))?;
        // The sink stops 1 s after the last datagram.
        if wait_timeout(&mut server.0, Duration::from_secs(5)).is_none() {
            bail!("UDP sink did not finish");
        }
        let text = server_out.join().unwrap_or_default();
        let sk: gen::SinkReport =
            serde_json::from_str(text.trim()).with_context(|| format!("UDP sink: {:?}", text.trim()))?;
        gen::to_result(&g, &sk)
    } else {
        let client_args = t.client_args(&topo.server_addr, ctx.duration, v6_socket);
        let mut cmd: Vec<&str> = vec!["iperf3"];
        cmd.extend(client_args.iter().map(String::as_str));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (text, status) = run_in_ns(&topo.ns_a, &cmd, timeout, &stop)?;
            match iperf::parse_client_json(&text) {
                Ok(r) => break r,
                Err(e) if attempt < 3 && format!("{e}").contains("connect") => {
                    sleep_checked(Duration::from_millis(300), &stop)?;
                }
                Err(e) => return Err(e.context(format!("iperf3 client ({status})"))),
            }
        }
    };

    // Samples after the window.
    let window = t0.elapsed().as_secs_f64();
    let box1 = procfs::box_cpu()?;
    if let (Some(pid), Some(t0)) = (fwd_pid, ticks0) {
        if let Ok(t1) = procfs::pid_cpu_ticks(pid) {
            rec.fwd_cpu_percent = Some((t1.saturating_sub(t0)) as f64 / ctx.clk_tck / window * 100.0);
        }
        rec.fwd_peak_rss_kb = procfs::pid_peak_rss_kb(pid);
        if !rss_reset {
            tracing::debug!("could not reset VmHWM of {pid}: peak RSS covers the forwarder's lifetime");
        }
    }
    rec.box_cpu_percent = box1.percent_since(&box0);
    rec.window_seconds = window;
    rec.dev_tx_dropped = match (drops0, topo.tx_dropped()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    if t.udp {
        rec.udp_rcvbuf_errors = match (rcvbuf0, topo.rcvbuf_errors(ctx.ipv6)) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
    }
    rec.iperf = Some(iperf);
    if wait_timeout(&mut server.0, Duration::from_secs(5)).is_none() {
        tracing::debug!("iperf3 server still running after the client finished; killing it");
    }
    drop(server);

    let alive = topo.forwarder.as_mut().map(|f| f.is_running());
    if let Some(fwd) = topo.forwarder.take() {
        let exit = fwd.stop();
        rec.fwd_counters = exit.counters;
        rec.fwd_exit = exit.status;
        if alive == Some(false) {
            rec.error = Some(format!("forwarder died during the run: {}", exit.stderr_tail));
        }
    }
    if let Some(rec_perf) = perf {
        let svg = flamegraph.expect("perf implies flamegraph");
        let title = format!("turbotun bench {} — {} {} s", mode.label, t.label, ctx.duration);
        rec_perf.finish(Duration::from_secs(ctx.duration + 15), svg, &title)?;
        let _ = std::fs::remove_file(svg.with_extension("perf.data"));
        let _ = std::fs::remove_file(svg.with_extension("perf.log"));
    }
    drop(topo);
    Ok(rec)
}

fn interrupted(e: anyhow::Error) -> anyhow::Error {
    tracing::debug!("interrupted during: {e:#}");
    anyhow!("interrupted: namespaces and processes torn down")
}
