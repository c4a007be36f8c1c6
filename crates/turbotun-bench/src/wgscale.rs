//! `turbotun bench --wg-scale`: a WireGuard endpoint as a VPN provider's server uses it, holding many peers,
//! configured and read back with the real `wg`, as an operator would.
//!
//! Each run starts one endpoint in a fresh network namespace (a device name unique to the run, its
//! configuration socket waited for), then, timed with the wall clock around each `wg` command:
//!
//! 1. `wg addconf` of 10,000 peers to the empty endpoint (the reference for 4.);
//! 2. `wg setconf` of N peers (replacing those), each with an endpoint, one /32 and one /128;
//! 3. the endpoint's resident memory per configured peer (`VmRSS` after 2. minus before 1., over N);
//! 4. `wg addconf` of 10,000 more peers to the endpoint holding N, and its ratio to 1.;
//! 5. `wg show NAME dump` (every line counted: N + 10,000 peers and the device);
//! 6. the endpoint's CPU time over `--duration` seconds with no traffic, as a share of one core;
//! 7. for turbotun's endpoints, `turbotun stats NAME --prometheus` (every peer's series from the counters socket).
//!
//! Keys are 32 pseudo-random bytes each (a public key needs no private key to be configured). wireguard-go holds
//! at most 65,536 peers: its runs of more are listed as skipped, not run. The endpoints run one after the other
//! in each repetition, in a different order each time.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::netcfg::Netns;
use crate::peerconf::{random_public, write_peers, PeerPrefixes};
use crate::process::{run_tool, sleep_checked};
use crate::report::ReportHeader;
use crate::runner::Ctx;
use crate::stats::{cell, Spread};
use crate::topo::{clear_stale_socket, Forwarder, Launch, Ready};
use crate::{modes, procfs, Options};

/// Peers added by `wg addconf`, to the empty endpoint and to the one holding N.
pub(crate) const ADDED: usize = 10_000;
/// The scales of `--wg-scale` without `--wg-peers`, and with `--quick`.
pub(crate) const DEFAULT_PEERS: &[usize] = &[10_000, 100_000];
pub(crate) const QUICK_PEERS: &[usize] = &[10_000];
/// The most peers wireguard-go holds (its `MaxPeers`).
pub(crate) const WIREGUARD_GO_MAX_PEERS: usize = 1 << 16;
/// The most any `wg` command may take.
const WG_COMMAND_TIMEOUT: Duration = Duration::from_secs(900);

/// An endpoint program measured.
struct Endpoint {
    label: String,
    program: PathBuf,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    max_peers: usize,
    /// Serves turbotun's counters socket (read with `turbotun stats --prometheus`).
    stats: bool,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ScaleRun {
    pub endpoint: String,
    pub peers: usize,
    pub rep: u32,
    pub add_to_empty_s: f64,
    pub setconf_s: f64,
    pub rss_bytes_per_peer: f64,
    /// `None`: N + 10,000 is more than the endpoint holds (N = 2^20, the kernel's limit).
    pub add_to_full_s: Option<f64>,
    pub show_dump_s: f64,
    /// `turbotun stats NAME --prometheus` (every peer's series), for turbotun's endpoints.
    pub scrape_s: Option<f64>,
    pub idle_cpu_percent: f64,
}

/// What was not run, and why.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ScaleSkip {
    pub endpoint: String,
    pub peers: Option<usize>,
    pub reason: String,
}

#[derive(Debug, Serialize)]
struct ScaleReport {
    header: ReportHeader,
    idle_window_s: u64,
    reps: u32,
    added: usize,
    runs: Vec<ScaleRun>,
    skipped: Vec<ScaleSkip>,
}

/// Every endpoint at every scale, `--reps` times; the JSON and the Markdown. Returns how many runs failed.
pub(crate) fn run(ctx: &mut Ctx, args: &Options, peers_dir: Option<&Path>) -> Result<usize> {
    let (scales, reps) = scales_and_reps(args, DEFAULT_PEERS, QUICK_PEERS)?;
    let Some(wg) = modes::which("wg") else {
        bail!("`wg` not found: apt-get install wireguard-tools (it configures the endpoints)");
    };
    let (endpoints, mut skipped) = endpoints(ctx, args, peers_dir);
    let mut runs = Vec::new();
    let mut failures = 0;
    for rep in 0..reps {
        for &peers in &scales {
            let count = endpoints.len();
            for k in 0..count {
                // A different endpoint first in each repetition: no endpoint always runs on a machine the one
                // before it warmed.
                let e = &endpoints[(k + rep as usize) % count];
                if peers > e.max_peers {
                    if rep == 0 {
                        let reason = format!("holds at most {} peers", e.max_peers);
                        skipped.push(ScaleSkip { endpoint: e.label.clone(), peers: Some(peers), reason });
                    }
                    continue;
                }
                if ctx.interrupted() {
                    bail!("interrupted");
                }
                eprintln!("turbotun bench: --wg-scale {} with {peers} peers (repetition {})", e.label, rep + 1);
                match run_one(ctx, e, &wg, peers, rep) {
                    Ok(run) => runs.push(run),
                    Err(err) => {
                        failures += 1;
                        eprintln!("turbotun bench: {} with {peers} peers failed: {err:#}", e.label);
                    }
                }
            }
        }
    }
    let report = ScaleReport {
        header: ReportHeader::here("turbotun bench --wg-scale", crate::now_unix()),
        idle_window_s: ctx.duration,
        reps,
        added: ADDED,
        runs,
        skipped,
    };
    crate::write_json(args.json.as_deref(), &report)?;
    crate::print_markdown(&markdown(&report, &scales, &endpoints));
    Ok(failures)
}

/// The scales (`--wg-peers`, else `defaults`, or `quick` with `--quick`) and the repetitions of a WireGuard
/// bench of many peers (`--wg-scale`, `--wg-storm`).
pub(crate) fn scales_and_reps(args: &Options, defaults: &[usize], quick: &[usize]) -> Result<(Vec<usize>, u32)> {
    let scales: Vec<usize> = match (&args.wg_peers, args.quick) {
        (Some(p), _) => p.clone(),
        (None, true) => quick.to_vec(),
        (None, false) => defaults.to_vec(),
    };
    if scales.is_empty() || scales.contains(&0) {
        bail!("--wg-peers: each scale must be at least 1 peer");
    }
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 3 });
    anyhow::ensure!(reps > 0, "nothing to do: --reps must be at least 1");
    Ok((scales, reps))
}

/// The endpoints that can run here: turbotun's, the `--baseline` build's, and wireguard-go if it builds.
fn endpoints(ctx: &Ctx, args: &Options, peers_dir: Option<&Path>) -> (Vec<Endpoint>, Vec<ScaleSkip>) {
    let turbotun = |label: &str, program: PathBuf| Endpoint {
        label: label.into(),
        program,
        argv: ["wg", "-f", "{dev}"].map(String::from).to_vec(),
        env: Vec::new(),
        max_peers: turbotun_wg::MAX_PEERS,
        stats: true,
    };
    let mut out = vec![turbotun("turbotun-wg", ctx.exe.clone())];
    let mut skipped = Vec::new();
    if let Some(baseline) = &args.baseline {
        out.push(turbotun("turbotun-wg@baseline", baseline.clone()));
    }
    let go = match peers_dir {
        None => Err("bench/peers not found (set TURBOTUN_PEERS_DIR)".to_string()),
        Some(dir) => match modes::build_peer(dir, "wireguard-go", "wireguard-go", &ctx.log_dir) {
            Ok(None) => Ok(dir.join("bin/wireguard-go")),
            Ok(Some(note)) => Err(note),
            Err(e) => Err(format!("{e:#}")),
        },
    };
    match go {
        Ok(program) => out.push(Endpoint {
            label: "wireguard-go".into(),
            program,
            argv: ["-f", "{dev}"].map(String::from).to_vec(),
            env: vec![("WG_PROCESS_FOREGROUND".into(), "1".into())],
            max_peers: WIREGUARD_GO_MAX_PEERS,
            stats: false,
        }),
        Err(reason) => {
            eprintln!("turbotun bench: skipping wireguard-go: {reason}");
            skipped.push(ScaleSkip { endpoint: "wireguard-go".into(), peers: None, reason });
        }
    }
    (out, skipped)
}

/// One endpoint with `peers` peers, in a namespace of its own.
fn run_one(ctx: &mut Ctx, e: &Endpoint, wg: &Path, peers: usize, rep: u32) -> Result<ScaleRun> {
    ctx.run_counter += 1;
    let dev = format!("{}s{}", ctx.prefix, ctx.run_counter);
    let ns = Netns::new(dev.clone())?;
    let socket = turbotun_wg::uapi::socket_path(&dev);
    clear_stale_socket(&socket)?;
    let _socket_gone = RemoveOnDrop(socket.clone());
    let argv: Vec<String> = e.argv.iter().map(|a| if a == "{dev}" { dev.clone() } else { a.clone() }).collect();
    let launch =
        Launch { label: &e.label, program: &e.program, argv: &argv, env: &e.env, ready: Ready::Socket(&socket) };
    let log = ctx.log_dir.join(format!("{}-{dev}.stderr", e.label));
    let endpoint = Forwarder::launch(&launch, &ns, log, &ctx.stop)?;
    let result = measure(ctx, &ns, &endpoint, wg, &dev, (peers, e.max_peers));
    let scrape_s = match (&result, e.stats) {
        (Ok(_), true) => Some(scrape(ctx, &ns, &dev)?),
        _ => None,
    };
    let exit = endpoint.stop();
    let (add_to_empty_s, setconf_s, rss_bytes_per_peer, add_to_full_s, show_dump_s, idle_cpu_percent) =
        result.with_context(|| format!("{} ({})", e.label, exit.stderr_tail))?;
    Ok(ScaleRun {
        endpoint: e.label.clone(),
        peers,
        rep,
        add_to_empty_s,
        setconf_s,
        rss_bytes_per_peer,
        add_to_full_s,
        show_dump_s,
        scrape_s,
        idle_cpu_percent,
    })
}

/// Seconds `turbotun stats DEV --prometheus` takes (every peer's series, read from the counters socket).
fn scrape(ctx: &Ctx, ns: &Netns, dev: &str) -> Result<f64> {
    let exe = ctx.exe.to_string_lossy();
    let start = Instant::now();
    let text = run_tool(ns, &[&*exe, "stats", dev, "--prometheus"], WG_COMMAND_TIMEOUT, &ctx.stop)?;
    let seconds = start.elapsed().as_secs_f64();
    if !text.contains("turbotun_info{") {
        bail!("`turbotun stats {dev} --prometheus` printed no engine");
    }
    Ok(seconds)
}

type Figures = (f64, f64, f64, Option<f64>, f64, f64);

/// The steps of one run (see the module's documentation).
fn measure(
    ctx: &Ctx,
    ns: &Netns,
    endpoint: &Forwarder,
    wg: &Path,
    dev: &str,
    (peers, max_peers): (usize, usize),
) -> Result<Figures> {
    let wg = wg.to_string_lossy();
    let timed = |args: &[&str]| -> Result<(f64, String)> {
        let cmd: Vec<&str> = [&*wg].into_iter().chain(args.iter().copied()).collect();
        let start = Instant::now();
        let out = run_tool(ns, &cmd, WG_COMMAND_TIMEOUT, &ctx.stop)?;
        Ok((start.elapsed().as_secs_f64(), out))
    };
    let rss_before = rss_bytes(endpoint.pid)?;
    // Peer numbers: the first 10,000 above every scale's, then 0..N, then N..N+10,000.
    let first = ctx.log_dir.join(format!("{dev}-first.conf"));
    write_config(&first, None, (1 << 22)..(1 << 22) + ADDED)?;
    let (add_to_empty_s, _) = timed(&["addconf", dev, &first.to_string_lossy()])?;
    let server = ctx.log_dir.join(format!("{dev}-server.conf"));
    write_config(&server, Some(peers as u64), 0..peers)?;
    let (setconf_s, _) = timed(&["setconf", dev, &server.to_string_lossy()])?;
    let rss_bytes_per_peer = rss_bytes(endpoint.pid)?.saturating_sub(rss_before) as f64 / peers as f64;
    let more = ctx.log_dir.join(format!("{dev}-more.conf"));
    let room = peers + ADDED <= max_peers;
    let add_to_full_s = if room {
        write_config(&more, None, peers..peers + ADDED)?;
        Some(timed(&["addconf", dev, &more.to_string_lossy()])?.0)
    } else {
        None
    };
    let (show_dump_s, dump) = timed(&["show", dev, "dump"])?;
    let listed = dump.lines().count().saturating_sub(1);
    let expected = if room { peers + ADDED } else { peers };
    if listed != expected {
        bail!("`wg show {dev} dump` listed {listed} peers, not {expected}");
    }
    for file in [&first, &server, &more] {
        let _ = std::fs::remove_file(file);
    }
    let cpu_before = cpu_ticks(endpoint.pid)?;
    let start = Instant::now();
    sleep_checked(Duration::from_secs(ctx.duration), &ctx.stop)?;
    let ticks = cpu_ticks(endpoint.pid)?.saturating_sub(cpu_before);
    let idle_cpu_percent = 100.0 * ticks as f64 / ctx.clk_tck / start.elapsed().as_secs_f64();
    Ok((add_to_empty_s, setconf_s, rss_bytes_per_peer, add_to_full_s, show_dump_s, idle_cpu_percent))
}

/// The prefixes of `--wg-scale`'s peers: 10.0.0.0/8 and fd00::/64 hold them all.
const SCALE_PREFIXES: PeerPrefixes =
    PeerPrefixes { v4: std::net::Ipv4Addr::new(10, 0, 0, 0), v6: std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0) };

fn write_config(path: &Path, seed: Option<u64>, numbers: std::ops::Range<usize>) -> Result<()> {
    write_peers(path, seed, numbers, SCALE_PREFIXES, &random_public, true)
}

fn rss_bytes(pid: u32) -> Result<u64> {
    Ok(procfs::pid_rss_kb(pid).context("no VmRSS for the endpoint")? * 1024)
}

fn cpu_ticks(pid: u32) -> Result<u64> {
    let (user, system) = procfs::pid_user_sys_ticks(pid)?;
    Ok(user + system)
}

/// Removes the socket path when the run ends, however it ends (an endpoint killed leaves it behind).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = clear_stale_socket(&self.0);
    }
}

fn markdown(report: &ScaleReport, scales: &[usize], endpoints: &[Endpoint]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## turbotun bench --wg-scale — {} repetition(s); medians (min–max)\n\n\
         Each run: `wg addconf` of {ADDED} peers to the empty endpoint, `wg setconf` of N peers (an endpoint, a /32 \
         and a /128 each), `wg addconf` of {ADDED} more to the endpoint holding N, `wg show dump`, then {} s \
         without traffic. Times are wall-clock seconds around each `wg` command.\n",
        report.reps, report.idle_window_s
    );
    md.push_str(
        "| endpoint | peers | setconf s | RSS B/peer | addconf 10k to empty s | addconf 10k to N s | ratio \
         | show dump s | stats scrape s | idle CPU % of a core |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for &peers in scales {
        for e in endpoints {
            let runs: Vec<&ScaleRun> =
                report.runs.iter().filter(|r| r.endpoint == e.label && r.peers == peers).collect();
            if runs.is_empty() {
                continue;
            }
            let col = |f: fn(&ScaleRun) -> Option<f64>| cell(Spread::of(runs.iter().filter_map(|r| f(r))));
            let _ = writeln!(
                md,
                "| {} | {peers} | {} | {} | {} | {} | {} | {} | {} | {} |",
                e.label,
                col(|r| Some(r.setconf_s)),
                col(|r| Some(r.rss_bytes_per_peer)),
                col(|r| Some(r.add_to_empty_s)),
                col(|r| r.add_to_full_s),
                col(|r| Some(r.add_to_full_s? / r.add_to_empty_s)),
                col(|r| Some(r.show_dump_s)),
                col(|r| r.scrape_s),
                col(|r| Some(r.idle_cpu_percent)),
            );
        }
    }
    if report.runs.iter().any(|r| r.add_to_full_s.is_none()) {
        let _ = writeln!(md, "\n–: N + {ADDED} peers is more than a device holds (1,048,576, the kernel's limit).");
    }
    for s in &report.skipped {
        let scale = s.peers.map(|p| format!(" with {p} peers")).unwrap_or_default();
        let _ = writeln!(md, "\nNot run: {}{scale}: {}.", s.endpoint, s.reason);
    }
    md
}
