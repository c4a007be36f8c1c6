//! `turbotun bench --wg-storm`: a WireGuard server that N peers all ask for a handshake within one second, as
//! after it restarts, and a data flow through it that was up before the storm.
//!
//! Each run builds the `--tunnel` bench's WireGuard pair (A and B in their namespaces, configured with the real
//! `wg`), then gives B's endpoint N more peers (`wg addconf`), whose private keys the storm generator
//! ([`crate::stormgen`]) holds, and a route to their /16 of source addresses in A:
//!
//! 1. the storm alone: the generator in A plays the N peers; B's endpoint's CPU time (user + system, all
//!    threads) from the first initiation to the last answer; handshakes completed per CPU-second;
//! 2. the storm again, the same peers known to the endpoint now (each one's static-static secret computed, a
//!    session held), as when every peer rekeys at once: handshakes per CPU-second;
//! 3. the storm once more while an iperf3 TCP stream runs from A to B through the
//!    tunnel: the stream's rate in each half second before the storm and during it.
//!
//! A responder's handshake costs about four X25519 operations (its ephemeral key, and the DH of the initiator's
//! ephemeral with its static and with its ephemeral, and of its ephemeral with the initiator's static); the bench
//! measures this CPU's X25519 rate with x25519-dalek (the crate turbotun-wg uses), so that the handshakes per
//! CPU-second are judged against a quarter of it. The endpoints run one after the other in each repetition, in a
//! different order each time.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::modes::{Kind, Link, Mode, Unavailable};
use crate::peerconf::{write_peers, PeerPrefixes};
use crate::process::{run_tool, sleep_checked, KillOnDrop};
use crate::report::ReportHeader;
use crate::runner::Ctx;
use crate::stats::{cell, Spread};
use crate::stormgen::{self, StormReport};
use crate::topo::{Topology, INNER, PORT, UNDERLAY};
use crate::{procfs, tunnel, Options};

/// The scales without `--wg-peers`, and with `--quick`.
const DEFAULT_PEERS: &[usize] = &[10_000];
const QUICK_PEERS: &[usize] = &[1_000];
/// The kinds whose B endpoint is stormed.
const KINDS: &[&str] = &["turbotun-wg", "wireguard-go"];
/// X25519 operations of a responder's handshake.
pub(crate) const X25519_PER_HANDSHAKE: f64 = 4.0;
/// The longest a storm may take before its unanswered peers count as not completed.
const STORM_DEADLINE_S: u64 = 300;
/// The flow's samples (iperf3 `-i`), and how long it runs before the storm.
const FLOW_INTERVAL_S: f64 = 0.5;
const FLOW_LEAD: Duration = Duration::from_secs(2);
const IPERF_PORT: u16 = 5201;
const WG_TIMEOUT: Duration = Duration::from_secs(600);

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StormRun {
    pub endpoint: String,
    pub peers: usize,
    pub rep: u32,
    /// X25519 operations per second on one core (x25519-dalek): the mean of the rates measured just before and
    /// just after the first storm, and of those around the known peers' storm.
    pub x25519_per_s: f64,
    pub known_x25519_per_s: f64,
    /// The storm alone.
    pub storm: StormReport,
    /// B's endpoint's CPU seconds from the first initiation to the last answer.
    pub cpu_s: f64,
    pub handshakes_per_cpu_s: f64,
    /// The same peers again, each known to the endpoint now (its static-static secret computed, a session held):
    /// the load of every peer rekeying at once.
    pub known: StormReport,
    pub known_cpu_s: f64,
    pub known_handshakes_per_cpu_s: f64,
    /// The storm during the flow.
    pub storm_with_flow: StormReport,
    /// The flow's rate in each half second before the storm began (Gbit/s).
    pub flow_before_gbps: Vec<f64>,
    /// ... and in each half second that began while the storm was under way.
    pub flow_during_gbps: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct StormBenchReport {
    header: ReportHeader,
    reps: u32,
    x25519_per_handshake: f64,
    runs: Vec<StormRun>,
    skipped: Vec<Unavailable>,
}

/// Every endpoint at every scale, `--reps` times; the JSON and the Markdown. Returns how many runs failed.
pub(crate) fn run(ctx: &mut Ctx, args: &Options, peers_dir: Option<&Path>) -> Result<usize> {
    let (scales, reps) = crate::wgscale::scales_and_reps(args, DEFAULT_PEERS, QUICK_PEERS)?;
    let resolved = tunnel::resolve_kinds(ctx, args, peers_dir, KINDS)?;
    for s in &resolved.skipped {
        eprintln!("turbotun bench: skipping {}: {}", s.mode, s.reason);
    }
    if resolved.modes.is_empty() {
        bail!("no WireGuard endpoint can run here (see `turbotun bench --tunnel --list`)");
    }
    let mut runs = Vec::new();
    let mut failures = 0;
    let mut skipped = resolved.skipped.clone();
    for rep in 0..reps {
        for &peers in &scales {
            let count = resolved.modes.len();
            for k in 0..count {
                let mode = &resolved.modes[(k + rep as usize) % count];
                let most = if mode.label.starts_with("wireguard-go") {
                    crate::wgscale::WIREGUARD_GO_MAX_PEERS
                } else {
                    turbotun_wg::MAX_PEERS
                };
                if peers + 1 > most {
                    if rep == 0 {
                        let reason = format!("holds at most {most} peers, the storm's and the flow's");
                        skipped.push(Unavailable { mode: format!("{} with {peers} peers", mode.label), reason });
                    }
                    continue;
                }
                if ctx.interrupted() {
                    bail!("interrupted");
                }
                eprintln!("turbotun bench: --wg-storm {} with {peers} peers (repetition {})", mode.label, rep + 1);
                match run_one(ctx, mode, peers, rep) {
                    Ok(run) => runs.push(run),
                    Err(err) => {
                        failures += 1;
                        eprintln!("turbotun bench: {} with {peers} peers failed: {err:#}", mode.label);
                    }
                }
            }
        }
    }
    let report = StormBenchReport {
        header: ReportHeader::here("turbotun bench --wg-storm", crate::now_unix()),
        reps,
        x25519_per_handshake: X25519_PER_HANDSHAKE,
        runs,
        skipped,
    };
    crate::write_json(args.json.as_deref(), &report)?;
    let labels: Vec<&str> = resolved.modes.iter().map(|m| m.label.as_str()).collect();
    crate::print_markdown(&markdown(&report, &scales, &labels));
    Ok(failures)
}

/// X25519 operations per second on this core: Diffie-Hellman of a fixed secret with a new point each time, for
/// `window`.
pub(crate) fn x25519_rate(window: Duration) -> f64 {
    use x25519_dalek::{PublicKey, StaticSecret};
    let secret = StaticSecret::from(stormgen::private_key(0));
    let mut point = PublicKey::from(&StaticSecret::from(stormgen::private_key(1)));
    let start = Instant::now();
    let mut ops = 0u64;
    while start.elapsed() < window {
        for _ in 0..16 {
            // Each result is the next point: no operation can be skipped or hoisted.
            point = PublicKey::from(secret.diffie_hellman(&point).to_bytes());
        }
        ops += 16;
    }
    std::hint::black_box(point);
    ops as f64 / start.elapsed().as_secs_f64()
}

/// The prefixes of the storm's peers (100.64.0.0/10, fd00:c0::/64: neither end's inner address).
const STORM_PREFIXES: PeerPrefixes = PeerPrefixes {
    v4: std::net::Ipv4Addr::new(100, 64, 0, 0),
    v6: std::net::Ipv6Addr::new(0xfd00, 0xc0, 0, 0, 0, 0, 0, 0),
};

/// One endpoint stormed by `peers` peers (see the module's documentation).
fn run_one(ctx: &mut Ctx, mode: &Mode, peers: usize, rep: u32) -> Result<StormRun> {
    ctx.run_counter += 1;
    let stop = std::sync::Arc::clone(&ctx.stop);
    let Kind::Tunnel(Link::Pair(ends, _)) = &mode.kind else { bail!("{} is not a pair of endpoints", mode.label) };
    let Some(wg) = &ends[1].wg else { bail!("{} has no WireGuard endpoint in B", mode.label) };
    let topo = Topology::build(mode, ctx.site(&stop), None)?;
    let dev_b = topo.devices[1].clone();
    let server_ns = topo.server();
    let file = ctx.log_dir.join(format!("{dev_b}-storm.conf"));
    write_peers(&file, None, 0..peers, STORM_PREFIXES, &stormgen::public_key, false)?;
    let tool = wg.tool.to_string_lossy();
    run_tool(server_ns, &[&*tool, "addconf", &dev_b, &*file.to_string_lossy()], WG_TIMEOUT, &stop)
        .with_context(|| format!("add {peers} storm peers to {dev_b}"))?;
    let _ = std::fs::remove_file(&file);
    let sources = IpAddr::V4(stormgen::FIRST_SOURCE);
    server_ns.netlink()?.add_route_via(sources, stormgen::SOURCE_PREFIX_LEN, UNDERLAY[0].into())?;
    topo.ns_a.netlink()?.add_local_route(sources, stormgen::SOURCE_PREFIX_LEN)?;
    let target = Storm {
        ctx,
        topo: &topo,
        key: &wg.keys[1].public,
        peers,
        pid: topo.endpoints[1].pid,
        played: Default::default(),
    };

    // The rate each storm is judged by, measured on either side of it: this machine's speed moves from minute to
    // minute.
    let rate = || x25519_rate(Duration::from_millis(500));
    let before = rate();
    let alone = target.play()?;
    let between = rate();
    let cpu_s = alone.cpu_s;
    let handshakes_per_cpu_s = alone.report.completed as f64 / cpu_s.max(1e-9);
    let known = target.play()?;
    let known_handshakes_per_cpu_s = known.report.completed as f64 / known.cpu_s.max(1e-9);
    let after = rate();

    // The flow runs FLOW_LEAD before the storm, and as long after its start as the storm alone took, twice over.
    let flow_s = (FLOW_LEAD.as_secs_f64() + 2.0 * alone.report.storm_s + 3.0).ceil().max(8.0) as u64;
    let server = topo
        .server()
        .spawn(
            Command::new("iperf3")
                .args(["-s", "-1", "-B", &INNER[1].to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .context("start iperf3 -s")?;
    let _server = KillOnDrop(server);
    topo.wait_bound(IPERF_PORT, false, false, Duration::from_secs(5), &stop)?;
    let flow_started = Instant::now();
    let (with_flow, flow_json) = std::thread::scope(|s| -> Result<(Played, String)> {
        let flow = s.spawn(|| {
            let secs = flow_s.to_string();
            let server = INNER[1].to_string();
            let cmd = ["iperf3", "-c", &server, "-t", &secs, "-i", "0.5", "-J", "-C", "cubic"];
            run_tool(&topo.ns_a, &cmd, Duration::from_secs(flow_s + 30), &stop)
        });
        let played = sleep_checked(FLOW_LEAD, &stop).and_then(|()| target.play());
        let flow = flow.join().map_err(|_| anyhow::anyhow!("the iperf3 thread panicked"))?;
        Ok((played?, flow?))
    })?;
    let storm_from = with_flow.started.duration_since(flow_started).as_secs_f64();
    let storm_to = with_flow.answered.duration_since(flow_started).as_secs_f64();
    let (flow_before_gbps, flow_during_gbps) = flow_samples(&flow_json, storm_from, storm_to)?;
    Ok(StormRun {
        endpoint: mode.label.clone(),
        peers,
        rep,
        x25519_per_s: (before + between) / 2.0,
        known_x25519_per_s: (between + after) / 2.0,
        storm: alone.report,
        cpu_s,
        handshakes_per_cpu_s,
        known_cpu_s: known.cpu_s,
        known: known.report,
        known_handshakes_per_cpu_s,
        storm_with_flow: with_flow.report,
        flow_before_gbps,
        flow_during_gbps,
    })
}

/// A storm's target: B's endpoint, its key, its process.
struct Storm<'a> {
    ctx: &'a Ctx,
    topo: &'a Topology,
    key: &'a str,
    peers: usize,
    pid: u32,
    /// Storms played so far in this run (each generator's log is its own).
    played: std::cell::Cell<u32>,
}

/// One storm played: the generator's report, B's CPU seconds over it, and when it began and ended.
struct Played {
    report: StormReport,
    cpu_s: f64,
    started: Instant,
    answered: Instant,
}

impl Storm<'_> {
    /// The generator in A, B's CPU time read when it says the storm started and when it was answered.
    fn play(&self) -> Result<Played> {
        let dest = SocketAddr::new(UNDERLAY[1].into(), PORT);
        let mut cmd = Command::new(&self.ctx.exe);
        cmd.args(["bench", "--wg-storm-play", &dest.to_string(), "--wg-storm-key", self.key])
            .args(["--wg-storm-peers", &self.peers.to_string()])
            .args(["--duration", &STORM_DEADLINE_S.to_string()]);
        self.played.set(self.played.get() + 1);
        let log = self.ctx.log_dir.join(format!("storm-{}-{}.log", self.ctx.run_counter, self.played.get()));
        let log = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut child = self
            .topo
            .ns_a
            .spawn(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log))
            .context("start the storm generator")?;
        let stdout = child.stdout.take().context("the generator's stdout")?;
        let _child = KillOnDrop(child);
        // Its lines through a thread, so that waiting for the next one still sees the bench interrupted (the
        // generator is then killed with `_child`).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let next = || -> Result<String> {
            loop {
                if self.ctx.interrupted() {
                    bail!("interrupted");
                }
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(line) => return line.context("read the generator"),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(_) => bail!("the storm generator ended early (see its log)"),
                }
            }
        };
        expect_event(&next()?, "start")?;
        let (started, cpu_before) = (Instant::now(), self.cpu_s()?);
        expect_event(&next()?, "answered")?;
        let (answered, cpu_after) = (Instant::now(), self.cpu_s()?);
        let line = next()?;
        let report: StormReport =
            serde_json::from_str(line.trim()).with_context(|| format!("the storm generator's report: {line:?}"))?;
        Ok(Played { report, cpu_s: cpu_after - cpu_before, started, answered })
    }

    fn cpu_s(&self) -> Result<f64> {
        let (user, system) = procfs::pid_user_sys_ticks(self.pid)?;
        Ok((user + system) as f64 / self.ctx.clk_tck)
    }
}

fn expect_event(line: &str, event: &str) -> Result<()> {
    let v: serde_json::Value =
        serde_json::from_str(line.trim()).with_context(|| format!("the storm generator printed {line:?}"))?;
    if v["event"] != event {
        bail!("the storm generator printed {line:?}, not the {event:?} event");
    }
    Ok(())
}

/// The flow's rate (Gbit/s) in each interval of iperf3's JSON that ended before `storm_from` seconds, and in
/// each that began between `storm_from` and `storm_to`.
fn flow_samples(json: &str, storm_from: f64, storm_to: f64) -> Result<(Vec<f64>, Vec<f64>)> {
    let v: serde_json::Value = serde_json::from_str(json).context("iperf3's JSON")?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let intervals = v["intervals"].as_array().context("iperf3's JSON has no intervals")?;
    let (mut before, mut during) = (Vec::new(), Vec::new());
    for i in intervals {
        let s = &i["sum"];
        let (Some(start), Some(end), Some(bps)) =
            (s["start"].as_f64(), s["end"].as_f64(), s["bits_per_second"].as_f64())
        else {
            continue;
        };
        if end - start < FLOW_INTERVAL_S / 2.0 {
            continue; // iperf3's short last interval
        }
        if end <= storm_from {
            before.push(bps / 1e9);
        } else if start >= storm_from && start < storm_to {
            during.push(bps / 1e9);
        }
    }
    Ok((before, during))
}

fn median(values: &[f64]) -> Option<f64> {
    Spread::of(values.iter().copied()).map(|s| s.median)
}

fn markdown(report: &StormBenchReport, scales: &[usize], labels: &[&str]) -> String {
    let mut md = String::new();
    let rate = Spread::of(report.runs.iter().map(|r| r.x25519_per_s));
    let bound = rate.map(|r| r.median / report.x25519_per_handshake);
    let per_handshake = report.x25519_per_handshake;
    let _ = writeln!(
        md,
        "## turbotun bench --wg-storm — {} repetition(s); medians (min–max)\n\n\
         X25519 on one core (x25519-dalek, measured on either side of each storm): {} operations/s, so {} \
         handshakes per CPU-second at {} operations each; each storm is judged by the mean of its two measurements.\nEach run: N peers initiate within 1 s with B's endpoint, as the kernel's initiator does (a cookie \
         kept for the retransmission after 5 s); then again while a TCP stream runs through the tunnel, sampled \
         every {FLOW_INTERVAL_S} s.\n",
        report.reps,
        cell(rate),
        bound.map_or("–".into(), |b| format!("{b:.0}")),
        report.x25519_per_handshake,
    );
    md.push_str(
        "| endpoint | peers | completed (fewest of the 3 storms) | storm s | handshakes per CPU-second | ÷ X25519 bound | known peers: \
         handshakes per CPU-second | ÷ X25519 bound | cookie replies | retransmissions | flow before Gbit/s \
         | flow's slowest 0.5 s in the storm Gbit/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for &peers in scales {
        for label in labels {
            let runs: Vec<&StormRun> =
                report.runs.iter().filter(|r| r.endpoint == *label && r.peers == peers).collect();
            if runs.is_empty() {
                continue;
            }
            let col = |f: &dyn Fn(&StormRun) -> Option<f64>| cell(Spread::of(runs.iter().filter_map(|r| f(r))));
            let _ = writeln!(
                md,
                "| {label} | {peers} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                col(&|r| Some(r.storm.completed.min(r.known.completed).min(r.storm_with_flow.completed) as f64)),
                col(&|r| Some(r.storm.storm_s)),
                col(&|r| Some(r.handshakes_per_cpu_s)),
                col(&|r| Some(r.handshakes_per_cpu_s / (r.x25519_per_s / per_handshake))),
                col(&|r| Some(r.known_handshakes_per_cpu_s)),
                col(&|r| Some(r.known_handshakes_per_cpu_s / (r.known_x25519_per_s / per_handshake))),
                col(&|r| Some(r.storm.cookie_replies as f64)),
                col(&|r| Some(r.storm.retransmissions as f64)),
                col(&|r| median(&r.flow_before_gbps)),
                col(&|r| r.flow_during_gbps.iter().copied().reduce(f64::min)),
            );
        }
        let per_cpu = |label: &str| {
            median(
                &report
                    .runs
                    .iter()
                    .filter(|r| r.endpoint == label && r.peers == peers)
                    .map(|r| r.handshakes_per_cpu_s)
                    .collect::<Vec<_>>(),
            )
        };
        if let (Some(ours), Some(theirs)) = (per_cpu("turbotun-wg"), per_cpu("wireguard-go")) {
            // First contact, as the table's first figure.
            let _ = writeln!(
                md,
                "\nWith {peers} peers: turbotun-wg ÷ wireguard-go, handshakes per CPU-second: {:.2}×.",
                ours / theirs
            );
        }
    }
    for s in &report.skipped {
        let _ = writeln!(md, "\nNot run: {}: {}.", s.mode, s.reason);
    }
    md
}
