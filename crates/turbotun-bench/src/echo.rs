//! `turbotun bench --echo`: answers per second of an echo on a TUN device.
//!
//! Each run is one namespace holding the echo's device (10.0.1.1/24, so 10.0.1.2 is routed into it) and one
//! process of turbotun's generator and sink (`--udp-roundtrip`): the generator sends from a handle on the sink's
//! socket toward 10.0.1.2, the echo swaps addresses and ports, and the answers arrive at the sink, which counts
//! them. Three echoes are compared:
//!
//! - `naive`: [`naive_echo`], the TAP guide's baseline: one packet per `read` and per `write`, no virtio
//!   header (`Queue::recv`/`send` with the library's `echo::Responder` rewriting the packet);
//! - `echo-plain`: `turbotun echo --mode plain` (the library's `Echo`, batched reads, no virtio header);
//! - `echo-offload`: `turbotun echo --mode offload` (virtio header, answers coalesced; UDP GSO trains
//!   answered whole), which alone is also offered trains of UDP GSO segments: a device without checksum offload
//!   refuses a GSO send (see docs/BENCH.md).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use turbotun::echo::{Responder, Verdict};
use turbotun::queue::MAX_PACKET;
use turbotun::{DeviceBuilder, StopHandle};

use super::iperf::Traffic;
use super::report::{ReportHeader, RunRecord, Summary};
use super::runner::{interrupted, is_not_ready, run_echo, Ctx, EchoProgram};
use super::stats::{cell, fmt_num, med, Spread};
use super::Options;

/// The traffic each echo is offered: the generator as fast as the kernel takes it, one flow.
pub(crate) const ECHO_TRAFFIC: &[Traffic] = &[
    Traffic {
        label: "udp64",
        description: "UDP, 64-byte datagrams, one per send, unlimited rate",
        udp: true,
        streams: 1,
        payload: 64,
        gso: 1,
        rate: 0,
    },
    Traffic {
        label: "udp1400",
        description: "UDP, 1400-byte datagrams, one per send, unlimited rate",
        udp: true,
        streams: 1,
        payload: 1400,
        gso: 1,
        rate: 0,
    },
    Traffic {
        label: "gso64",
        description: "UDP GSO trains of 64 datagrams of 64 bytes, unlimited rate",
        udp: true,
        streams: 1,
        payload: 64,
        gso: 64,
        rate: 0,
    },
    Traffic {
        label: "gso1400",
        description: "UDP GSO trains of 46 datagrams of 1400 bytes (the most under 64 KiB), unlimited rate",
        udp: true,
        streams: 1,
        payload: 1400,
        gso: 46,
        rate: 0,
    },
];

/// One echo the bench compares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Variant {
    pub label: &'static str,
    /// The name `--modes` also accepts.
    pub short: &'static str,
    /// The turbotun arguments that start it, `{dev}` for the device.
    pub argv: &'static [&'static str],
    /// Whether it gets the GSO trains (its device grants checksum offload).
    pub gso: bool,
}

/// The echoes, in report order.
pub(crate) const VARIANTS: &[Variant] = &[
    Variant { label: "naive", short: "naive", argv: &["bench", "--naive-echo", "{dev}"], gso: false },
    Variant { label: "echo-plain", short: "plain", argv: &["echo", "{dev}", "--json", "--mode", "plain"], gso: false },
    Variant {
        label: "echo-offload",
        short: "offload",
        argv: &["echo", "{dev}", "--json", "--mode", "offload"],
        gso: true,
    },
];

/// The goal this bench reports on (never asserts): the offload echo's answers per second over the naive
/// echo's at matched load, both offered the same traffic (the same datagrams, one per send, as fast as the
/// generator's kernel takes them).
pub(crate) const GOAL_RATIO: f64 = 5.0;

/// The echoes named by `--modes` (labels or short names), or all.
pub(crate) fn select_variants(filter: Option<&[String]>) -> Result<Vec<Variant>> {
    let Some(filter) = filter else { return Ok(VARIANTS.to_vec()) };
    let mut out: Vec<Variant> = Vec::new();
    for f in filter.iter().map(|f| f.trim()).filter(|f| !f.is_empty()) {
        let Some(v) = VARIANTS.iter().find(|v| v.label == f || v.short == f) else {
            bail!(
                "unknown echo {f:?} for --echo; known: {}",
                VARIANTS.iter().map(|v| format!("{} ({})", v.short, v.label)).collect::<Vec<_>>().join(", ")
            );
        };
        if !out.iter().any(|o| o.label == v.label) {
            out.push(*v);
        }
    }
    out.sort_by_key(|v| VARIANTS.iter().position(|a| a.label == v.label));
    if out.is_empty() {
        bail!("--modes selects no echo");
    }
    Ok(out)
}

/// One echo and traffic kind over the repetitions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct EchoRow {
    pub echo: String,
    pub traffic: String,
    pub datagram_bytes: u32,
    /// Datagrams per send (1: no GSO).
    pub segments: u16,
    pub runs: usize,
    pub failed: usize,
    /// The generator's achieved rate: datagrams its kernel took per second, thousands.
    pub offered_kpps: Option<Spread>,
    /// Answers the sink received per second of the generator's run, thousands: the headline.
    pub replies_kpps: Option<Spread>,
    /// Answers as a share of the datagrams the generator sent, %: what compares two echoes offered the same
    /// traffic when the generator did not reach the same rate for both.
    #[serde(default)]
    pub answered_percent: Option<Spread>,
    /// The sink's own rate, first to last answer, thousands per second.
    pub sink_kpps: Option<Spread>,
    /// Answers' UDP payload, Gbit/s.
    pub gbps: Option<Spread>,
    /// Sent but not answered back, % of sent.
    pub lost_percent: Option<Spread>,
    /// TX dropped of the echo's device (the ring toward the echo was full), thousands per second.
    pub dev_tx_drop_kpps: Option<Spread>,
    /// The echo's own drop counter, thousands per second.
    pub echo_drop_kpps: Option<Spread>,
    /// The sink socket's drops (SO_RXQ_OVFL), thousands per second.
    pub socket_drop_kpps: Option<Spread>,
    /// The echo process's CPU over the window, % of one core.
    pub echo_cpu_percent: Option<Spread>,
    /// Median answers per second over the naive echo's offered the same traffic (matched load); None for the GSO
    /// trains, which the naive echo is not offered.
    pub ratio_naive: Option<f64>,
    /// For the GSO trains only: median answers per second over the naive echo's at the same datagram size offered
    /// one datagram per send, a far lower load (not a matched comparison: see [`TrainComparison`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_naive_other_load: Option<f64>,
}

/// The report's goal line for one datagram size: both echoes offered the same traffic (matched load).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Goal {
    pub datagram_bytes: u32,
    /// The traffic both were offered (one datagram per send).
    pub traffic: String,
    /// What the generator sent each of them, thousands per second (medians).
    pub naive_offered_kpps: f64,
    pub offload_offered_kpps: f64,
    /// Answers received per second, thousands (medians).
    pub naive_kpps: f64,
    pub offload_kpps: f64,
    /// Answers as a share of what each was sent, % (medians).
    #[serde(default)]
    pub naive_answered_percent: f64,
    #[serde(default)]
    pub offload_answered_percent: f64,
    /// The goal's ratio, at matched load: answers per second over the naive echo's, each scaled to the same
    /// offered rate (the ratio of the answered shares). Equal to [`Self::replies_ratio`] when the generator
    /// reached the same rate for both.
    pub ratio: f64,
    /// Answers per second over the naive echo's, as measured (the offered rates may differ).
    #[serde(default)]
    pub replies_ratio: f64,
    pub goal_ratio: f64,
    pub met: bool,
}

/// The offload echo answering GSO trains against the naive echo answering single datagrams of the same size:
/// different offered loads (the trains offer tens of times more), so not the goal; reported with both loads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TrainComparison {
    pub datagram_bytes: u32,
    pub offload_traffic: String,
    pub offload_offered_kpps: f64,
    pub offload_kpps: f64,
    pub naive_traffic: String,
    pub naive_offered_kpps: f64,
    pub naive_kpps: f64,
    pub ratio: f64,
}

fn spread(runs: &[&RunRecord], f: impl Fn(&RunRecord) -> Option<f64>) -> Option<Spread> {
    Spread::of(runs.iter().filter_map(|r| f(r)))
}

/// The table: one row per (echo, traffic) that ran, in report order, with the ratio to the naive echo.
pub(crate) fn echo_rows(runs: &[RunRecord], echoes: &[&str], traffic: &[Traffic]) -> Vec<EchoRow> {
    let mut rows = Vec::new();
    for e in echoes {
        for t in traffic {
            let all: Vec<&RunRecord> = runs.iter().filter(|r| r.mode == *e && r.traffic == t.label).collect();
            if all.is_empty() {
                continue;
            }
            let ok: Vec<&RunRecord> = all.iter().copied().filter(|r| r.error.is_none() && r.load.is_some()).collect();
            let load = |r: &RunRecord| r.load.clone().unwrap_or_default();
            let secs = |r: &RunRecord| load(r).gen.seconds.max(1e-9);
            rows.push(EchoRow {
                echo: e.to_string(),
                traffic: t.label.into(),
                datagram_bytes: t.payload,
                segments: t.gso.max(1),
                runs: all.len(),
                failed: all.len() - ok.len(),
                offered_kpps: spread(&ok, |r| Some(load(r).gen.pps() / 1000.0)),
                replies_kpps: spread(&ok, |r| Some(load(r).sink.packets as f64 / secs(r) / 1000.0)),
                answered_percent: spread(&ok, |r| {
                    let sent = load(r).gen.sent;
                    (sent > 0).then(|| load(r).sink.packets as f64 * 100.0 / sent as f64)
                }),
                sink_kpps: spread(&ok, |r| Some(load(r).sink.pps() / 1000.0)),
                gbps: spread(&ok, |r| Some(load(r).sink.bytes as f64 * 8.0 / secs(r) / 1e9)),
                lost_percent: spread(&ok, |r| r.iperf.as_ref()?.udp_lost_percent),
                dev_tx_drop_kpps: spread(&ok, |r| r.per_ms(r.dev_tx_dropped)),
                echo_drop_kpps: spread(&ok, |r| r.per_ms(r.fwd_drops())),
                socket_drop_kpps: spread(&ok, |r| Some(load(r).sink.socket_drops as f64 / secs(r) / 1000.0)),
                echo_cpu_percent: spread(&ok, |r| r.fwd_cpu_percent),
                ratio_naive: None,
                ratio_naive_other_load: None,
            });
        }
    }
    let naive: Vec<(String, u32, f64)> = rows
        .iter()
        .filter(|r| r.echo == "naive" && r.segments == 1)
        .filter_map(|r| Some((r.traffic.clone(), r.datagram_bytes, r.replies_kpps?.median)))
        .filter(|(_, _, base)| *base > 0.0)
        .collect();
    for r in &mut rows {
        let Some(k) = r.replies_kpps.map(|s| s.median) else { continue };
        if r.segments == 1 {
            r.ratio_naive = naive.iter().find(|(t, _, _)| *t == r.traffic).map(|(_, _, base)| k / base);
        } else {
            r.ratio_naive_other_load =
                naive.iter().find(|(_, b, _)| *b == r.datagram_bytes).map(|(_, _, base)| k / base);
        }
    }
    rows
}

/// Per traffic kind both were offered: the offload echo against the naive echo at matched load, the goal.
pub(crate) fn goals(rows: &[EchoRow]) -> Vec<Goal> {
    let median = |s: Option<Spread>| s.map(|s| s.median);
    let mut out = Vec::new();
    for naive in rows.iter().filter(|r| r.echo == "naive" && r.segments == 1) {
        let Some(base) = median(naive.replies_kpps).filter(|b| *b > 0.0) else { continue };
        let Some(offload) = rows.iter().find(|r| r.echo == "echo-offload" && r.traffic == naive.traffic) else {
            continue;
        };
        let Some(k) = median(offload.replies_kpps) else { continue };
        let (Some(naive_share), Some(offload_share)) =
            (median(naive.answered_percent).filter(|s| *s > 0.0), median(offload.answered_percent))
        else {
            continue;
        };
        let ratio = offload_share / naive_share;
        out.push(Goal {
            datagram_bytes: naive.datagram_bytes,
            traffic: naive.traffic.clone(),
            naive_offered_kpps: median(naive.offered_kpps).unwrap_or(0.0),
            offload_offered_kpps: median(offload.offered_kpps).unwrap_or(0.0),
            naive_kpps: base,
            offload_kpps: k,
            naive_answered_percent: naive_share,
            offload_answered_percent: offload_share,
            ratio,
            replies_ratio: k / base,
            goal_ratio: GOAL_RATIO,
            met: ratio >= GOAL_RATIO,
        });
    }
    out
}

/// Per GSO traffic kind of the offload echo: its answers against the naive echo's to single datagrams of the
/// same size, each with what it was offered.
pub(crate) fn train_comparisons(rows: &[EchoRow]) -> Vec<TrainComparison> {
    let median = |s: Option<Spread>| s.map(|s| s.median);
    let mut out = Vec::new();
    for train in rows.iter().filter(|r| r.echo == "echo-offload" && r.segments > 1) {
        let naive =
            rows.iter().find(|r| r.echo == "naive" && r.segments == 1 && r.datagram_bytes == train.datagram_bytes);
        let (Some(naive), Some(k)) = (naive, median(train.replies_kpps)) else { continue };
        let Some(base) = median(naive.replies_kpps).filter(|b| *b > 0.0) else { continue };
        out.push(TrainComparison {
            datagram_bytes: train.datagram_bytes,
            offload_traffic: train.traffic.clone(),
            offload_offered_kpps: median(train.offered_kpps).unwrap_or(0.0),
            offload_kpps: k,
            naive_traffic: naive.traffic.clone(),
            naive_offered_kpps: median(naive.offered_kpps).unwrap_or(0.0),
            naive_kpps: base,
            ratio: k / base,
        });
    }
    out
}

/// The JSON document of `--echo`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EchoReport {
    /// Which program, which build, on which machine, when.
    #[serde(flatten)]
    pub header: ReportHeader,
    pub duration_s: u64,
    pub reps: u32,
    pub ipv6: bool,
    pub echoes: Vec<String>,
    pub traffic: Vec<String>,
    pub rows: Vec<EchoRow>,
    /// The goal, judged at matched load.
    pub goals: Vec<Goal>,
    /// GSO trains against single datagrams: different loads, not the goal.
    #[serde(default)]
    pub trains: Vec<TrainComparison>,
    /// Every run: the generator's and sink's reports, the echo's counters line.
    pub runs: Vec<RunRecord>,
}

/// Every run, interleaved (repetition 1 of every echo and traffic kind, then repetition 2, ...); then the JSON,
/// the chart and the Markdown. Returns how many runs failed.
pub(crate) fn run(ctx: &mut Ctx, args: &Options) -> Result<usize> {
    let variants = select_variants(args.modes.as_deref())?;
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 3 });
    anyhow::ensure!(reps > 0, "nothing to do: --reps must be at least 1");
    let cases: Vec<(EchoProgram, Traffic)> = variants
        .iter()
        .flat_map(|v| {
            ECHO_TRAFFIC
                .iter()
                .filter(move |t| v.gso || t.gso <= 1)
                .map(move |t| (EchoProgram { label: v.label.to_string(), argv: v.argv.to_vec() }, *t))
        })
        .collect();
    if cfg!(debug_assertions) {
        eprintln!("turbotun bench: warning: this is a debug build, so turbotun's echoes run unoptimized");
    }
    let total = cases.len() as u64 * u64::from(reps);
    eprintln!(
        "turbotun bench --echo: {} echo(es), {} case(s) × {reps} rep(s), {} s each (~{} min)",
        variants.len(),
        cases.len(),
        ctx.duration,
        (total * (ctx.duration + 2)).div_ceil(60)
    );
    let started_unix = super::now_unix();
    let pb = super::progress_bar(total);
    let mut runs = Vec::new();
    let mut broken: Vec<(String, String)> = Vec::new();
    let mut failures = 0;
    let ipv6 = ctx.ipv6;
    let measured = (|| -> Result<()> {
        for rep in 1..=reps {
            for (e, t) in &cases {
                pb.set_message(format!("rep {rep}/{reps} {} {}", e.label, t.label));
                let failed = |msg: String| RunRecord {
                    mode: e.label.clone(),
                    family: "echo".into(),
                    traffic: t.label.into(),
                    rep,
                    ipv6,
                    error: Some(msg),
                    ..Default::default()
                };
                let rec = match broken.iter().find(|(b, _)| *b == e.label) {
                    Some((_, why)) => failed(format!("skipped: {why}")),
                    None => match run_echo(ctx, e, t, rep) {
                        Ok(r) => r,
                        Err(err) if ctx.interrupted() => return Err(interrupted(err)),
                        Err(err) => {
                            let msg = format!("{err:#}");
                            if is_not_ready(&err) {
                                broken.push((e.label.clone(), msg.clone()));
                            }
                            failed(msg)
                        }
                    },
                };
                if let Some(err) = &rec.error {
                    failures += 1;
                    pb.suspend(|| eprintln!("turbotun bench: {} {} rep {rep}: {err}", e.label, t.label));
                }
                runs.push(rec);
                pb.inc(1);
            }
        }
        Ok(())
    })();
    pb.finish_and_clear();
    measured?;
    let labels: Vec<&str> = variants.iter().map(|v| v.label).collect();
    let traffic: Vec<Traffic> =
        ECHO_TRAFFIC.iter().copied().filter(|t| cases.iter().any(|(_, c)| c.label == t.label)).collect();
    let rows = echo_rows(&runs, &labels, &traffic);
    let report = EchoReport {
        header: ReportHeader::here("turbotun bench --echo", started_unix),
        duration_s: ctx.duration,
        reps,
        ipv6: ctx.ipv6,
        echoes: labels.iter().map(|l| l.to_string()).collect(),
        traffic: traffic.iter().map(|t| t.label.to_string()).collect(),
        goals: goals(&rows),
        trains: train_comparisons(&rows),
        rows,
        runs,
    };
    super::write_json(args.json.as_deref(), &report)?;
    if let Some(p) = &args.chart {
        write_echo_chart(p, &report, &traffic)?;
        eprintln!("turbotun bench: wrote {}", p.display());
    }
    super::print_markdown(&markdown(&report));
    Ok(failures)
}

/// The grouped bar chart of answers received per echo and traffic kind.
fn write_echo_chart(path: &std::path::Path, report: &EchoReport, traffic: &[Traffic]) -> Result<()> {
    let summary: Vec<Summary> = report
        .rows
        .iter()
        .map(|r| Summary {
            mode: r.echo.clone(),
            family: "echo".into(),
            traffic: r.traffic.clone(),
            rx_kpps: r.replies_kpps,
            ..Default::default()
        })
        .collect();
    let title = format!(
        "turbotun bench --echo — answers received, {} s × {} rep(s), {}",
        report.duration_s, report.reps, report.header.kernel
    );
    super::chart::write_chart(path, &summary, traffic, &title)
}

/// The table, the goal line and what the columns mean.
pub(crate) fn markdown(report: &EchoReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## turbotun bench --echo ({} build): {} s per run, {} rep(s) interleaved, IPv{}, kernel {}, {} CPUs\n",
        report.header.build,
        report.duration_s,
        report.reps,
        if report.ipv6 { 6 } else { 4 },
        report.header.kernel,
        report.header.cpus
    );
    let _ = writeln!(
        o,
        "| echo | traffic | offered kpps | replies kpps | answered % | ×naive, same traffic | Gbps | lost % | dev TX drop kpps | echo drop kpps | socket drop kpps | echo CPU % |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &report.rows {
        let failed = if r.failed > 0 { format!(" ({} of {} failed)", r.failed, r.runs) } else { String::new() };
        let _ = writeln!(
            o,
            "| {}{failed} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.echo,
            r.traffic,
            med(r.offered_kpps),
            cell(r.replies_kpps),
            cell(r.answered_percent),
            match (r.ratio_naive, r.ratio_naive_other_load) {
                (Some(x), _) => format!("{x:.2}×"),
                (None, Some(x)) => format!("– ({x:.2}× at another load)"),
                (None, None) => "–".into(),
            },
            med(r.gbps),
            cell(r.lost_percent),
            med(r.dev_tx_drop_kpps),
            med(r.echo_drop_kpps),
            med(r.socket_drop_kpps),
            cell(r.echo_cpu_percent),
        );
    }
    o.push('\n');
    for g in &report.goals {
        let _ = writeln!(
            o,
            "Goal (reported, not asserted): echo-offload ≥ {}× the naive echo's replies per second at matched \
             load, {}-byte datagrams, both offered {} (echo-offload {} kpps, naive {} kpps offered): {:.2}× in \
             the share answered ({:.1} % against {:.1} %; {:.2}× in replies per second, {} against {} kpps, at \
             those offered rates) — {}.",
            g.goal_ratio,
            g.datagram_bytes,
            g.traffic,
            fmt_num(g.offload_offered_kpps),
            fmt_num(g.naive_offered_kpps),
            g.ratio,
            g.offload_answered_percent,
            g.naive_answered_percent,
            g.replies_ratio,
            fmt_num(g.offload_kpps),
            fmt_num(g.naive_kpps),
            if g.met { "met" } else { "NOT met" }
        );
    }
    for c in &report.trains {
        let _ = writeln!(
            o,
            "Not the goal (different loads): echo-offload offered {} ({} kpps of {}-byte datagrams) answered {} \
             kpps, {:.2}× what the naive echo answered offered {} ({} kpps offered, {} kpps answered).",
            c.offload_traffic,
            fmt_num(c.offload_offered_kpps),
            c.datagram_bytes,
            fmt_num(c.offload_kpps),
            c.ratio,
            c.naive_traffic,
            fmt_num(c.naive_offered_kpps),
            fmt_num(c.naive_kpps),
        );
    }
    let _ = writeln!(
        o,
        "\nMedians (min–max) over interleaved repetitions. The generator sends as fast as its kernel takes \
         datagrams toward an address routed into the echo's device; the sink shares its socket, so it receives \
         exactly the answers. offered kpps = the generator's achieved rate; replies kpps = answers received per \
         second of the generator's run (a GSO train counts as its datagrams); answered % = replies over the \
         datagrams sent, which judges the goal (the generator may reach another rate for each echo); ×naive, same traffic = replies over \
         the naive echo's offered the same traffic (matched load; the naive echo is never offered GSO trains, so a \
         train's ratio to its single datagrams compares different loads and is shown apart); Gbps = the answers' \
         UDP payload; lost % = sent but not answered back. \
         Where they were lost, per second: dev TX drop = TX dropped of the echo's device (its ring was full: the \
         echo did not keep up; a GSO train counts once), echo drop = the echo's own drop counter, socket drop = \
         the sink socket's drops (SO_RXQ_OVFL). echo CPU % = the echo process's CPU while the generator sent (the window \
         closes with its last datagram, not after the wait for the last answers), % of one core."
    );
    o
}

/// How often the naive echo looks at its stop flag while no packet comes.
const NAIVE_POLL: Duration = Duration::from_millis(50);

/// What the naive echo counted, printed as its counters line when stopped.
#[derive(Debug, Default, Serialize)]
struct NaiveCounters {
    mode: &'static str,
    reads: u64,
    /// Answers written.
    packets: u64,
    answered: u64,
    ignored: u64,
    malformed: u64,
    /// Answers whose write failed.
    drops: u64,
    seconds: f64,
}

/// The naive echo (the hidden `--naive-echo DEV`): a TUN device without a virtio header, one packet per
/// `Queue::recv` and per `Queue::send`, rewritten by the library's `Responder`: the program a TUN/TAP guide
/// starts with, the baseline the bench compares the library's echo against. It prints `ready`, answers until
/// SIGINT/SIGTERM, then prints its counters as one JSON line (the forwarder contract the bench reads).
pub(crate) fn naive_echo(dev: &str) -> Result<()> {
    let device = DeviceBuilder::tun().name(dev).open().with_context(|| format!("opening {dev}"))?;
    let q = device.queues().first().context("the device has no queue")?;
    // Non-blocking so that a quiet device still lets it see the stop flag; under load every read finds a
    // packet and the loop is the plain read-answer-write of a blocking one.
    q.set_nonblocking(true)?;
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let responder = Responder::new(turbotun::Mode::Tun);
    let mut buf = vec![0u8; MAX_PACKET];
    let mut c = NaiveCounters { mode: "naive", ..Default::default() };
    println!("ready");
    let start = Instant::now();
    let mut reported = false;
    while !stop.is_stopped() {
        let n = match q.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => match q.wait_readable(Some(NAIVE_POLL)) {
                Err(e) if !e.is_interrupted() => return Err(e.into()),
                _ => continue,
            },
            Err(e) if e.is_interrupted() => continue,
            Err(e) => return Err(e.into()),
        };
        c.reads += 1;
        match responder.answer(&mut buf, n) {
            Verdict::Answer { len, .. } => match q.send(&buf[..len]) {
                Ok(_) => {
                    c.answered += 1;
                    c.packets += 1;
                }
                Err(e) if e.is_device_gone() => return Err(e.into()),
                Err(e) => {
                    // Counted like a forwarder's drop (a device down during set-up gives EIO); said once.
                    if !reported {
                        eprintln!("turbotun bench --naive-echo: a write failed (counted as a drop): {e}");
                        reported = true;
                    }
                    c.drops += 1;
                }
            },
            Verdict::Ignore(_) => c.ignored += 1,
            Verdict::Malformed => c.malformed += 1,
        }
    }
    c.seconds = start.elapsed().as_secs_f64();
    println!("{}", serde_json::to_string(&c)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{GenReport, LoadResult, SinkReport};

    fn rec(echo: &str, traffic: &str, rep: u32, sent: u64, answered: u64) -> RunRecord {
        let t = ECHO_TRAFFIC.iter().find(|t| t.label == traffic).unwrap();
        let gen = GenReport { sent, seconds: 2.0, segments: t.gso, attempted: sent, ..Default::default() };
        let sink = SinkReport {
            packets: answered,
            bytes: answered * u64::from(t.payload),
            seconds: 1.9,
            socket_drops: 10,
            ..Default::default()
        };
        RunRecord {
            mode: echo.into(),
            family: "echo".into(),
            traffic: traffic.into(),
            rep,
            iperf: Some(crate::gen::to_result(&gen, &sink)),
            load: Some(LoadResult { gen, sink }),
            dev_tx_dropped: Some(sent - answered),
            fwd_counters: Some(serde_json::json!({"drops": 4})),
            fwd_cpu_percent: Some(99.0),
            ..Default::default()
        }
    }

    fn sample() -> Vec<RunRecord> {
        let mut runs = Vec::new();
        for rep in 1..=3u64 {
            runs.push(rec("naive", "udp64", rep as u32, 400_000, 200_000 + rep * 2000));
            runs.push(rec("echo-offload", "udp64", rep as u32, 400_000, 300_000));
            runs.push(rec("echo-offload", "gso64", rep as u32, 4_000_000, 2_000_000 + rep * 20_000));
        }
        runs.push(RunRecord { error: Some("boom".into()), ..rec("echo-offload", "gso64", 4, 1, 1) });
        runs
    }

    #[test]
    fn rows_ratios_and_goal() {
        let rows = echo_rows(&sample(), &["naive", "echo-plain", "echo-offload"], ECHO_TRAFFIC);
        let labels: Vec<(&str, &str)> = rows.iter().map(|r| (r.echo.as_str(), r.traffic.as_str())).collect();
        assert_eq!(labels, [("naive", "udp64"), ("echo-offload", "udp64"), ("echo-offload", "gso64")]);
        let naive = &rows[0];
        // 204,000 answers over the generator's 2 s.
        assert!((naive.replies_kpps.unwrap().median - 102.0).abs() < 1e-9, "{naive:?}");
        assert_eq!(naive.ratio_naive, Some(1.0));
        assert!((naive.offered_kpps.unwrap().median - 200.0).abs() < 1e-9);
        assert!((naive.echo_drop_kpps.unwrap().median - 0.002).abs() < 1e-12);
        assert!((naive.socket_drop_kpps.unwrap().median - 0.005).abs() < 1e-12);
        assert_eq!(naive.echo_cpu_percent.unwrap().median, 99.0);
        let offload = &rows[1];
        assert!((offload.ratio_naive.unwrap() - 150.0 / 102.0).abs() < 1e-9, "{offload:?}");
        let gso = &rows[2];
        assert_eq!((gso.runs, gso.failed, gso.segments, gso.datagram_bytes), (4, 1, 64, 64));
        // The trains are not compared with the naive echo as if the load were the same.
        assert_eq!(gso.ratio_naive, None, "{gso:?}");
        assert!((gso.ratio_naive_other_load.unwrap() - 1020.0 / 102.0).abs() < 1e-9, "{gso:?}");
        assert!((gso.gbps.unwrap().median - 2_040_000.0 * 64.0 * 8.0 / 2.0 / 1e9).abs() < 1e-9);
        // The goal is judged at matched load: udp64 offered to both, 150 against 102 kpps, not the trains' 10×.
        let g = goals(&rows);
        assert_eq!(g.len(), 1);
        assert_eq!((g[0].datagram_bytes, g[0].traffic.as_str(), g[0].met), (64, "udp64", false));
        assert!((g[0].ratio - 150.0 / 102.0).abs() < 1e-9, "{g:?}");
        assert!((g[0].replies_ratio - 150.0 / 102.0).abs() < 1e-9, "{g:?}");
        assert!(
            (g[0].naive_answered_percent - 51.0).abs() < 1e-9 && (g[0].offload_answered_percent - 75.0).abs() < 1e-9
        );
        // Offered at different rates (the generator reached 400k for one, 200k for the other), the goal compares
        // the shares answered: 75 % against 51 %, not the replies' 2.94×.
        let mut faster = sample();
        for r in faster.iter_mut().filter(|r| r.mode == "echo-offload" && r.traffic == "udp64") {
            let load = r.load.as_mut().unwrap();
            (load.gen.sent, load.sink.packets) = (800_000, 600_000);
        }
        let unequal = goals(&echo_rows(&faster, &["naive", "echo-offload"], ECHO_TRAFFIC));
        assert!((unequal[0].replies_ratio - 300.0 / 102.0).abs() < 1e-9, "{unequal:?}");
        assert!((unequal[0].ratio - 75.0 / 51.0).abs() < 1e-9, "{unequal:?}");
        assert_eq!((g[0].naive_offered_kpps, g[0].offload_offered_kpps), (200.0, 200.0));
        let t = train_comparisons(&rows);
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].offload_traffic.as_str(), t[0].naive_traffic.as_str()), ("gso64", "udp64"));
        assert!((t[0].ratio - 10.0).abs() < 1e-9 && (t[0].offload_offered_kpps - 2000.0).abs() < 1e-9, "{t:?}");
    }

    #[test]
    fn markdown_table() {
        let runs = sample();
        let rows = echo_rows(&runs, &["naive", "echo-offload"], ECHO_TRAFFIC);
        let report = EchoReport {
            header: ReportHeader::for_tests("t"),
            duration_s: 2,
            reps: 3,
            ipv6: false,
            echoes: vec!["naive".into(), "echo-offload".into()],
            traffic: vec!["udp64".into(), "gso64".into()],
            goals: goals(&rows),
            trains: train_comparisons(&rows),
            rows,
            runs,
        };
        let md = markdown(&report);
        assert!(md.contains("| naive | udp64 | 200 | 102 (101–103) | 51.0 (50.5–51.5) | 1.00× |"), "{md}");
        assert!(
            md.contains(
                "| echo-offload (1 of 4 failed) | gso64 | 2000 | 1020 (1010–1030) | 51.0 (50.5–51.5) | – (10.00× at another load) |"
            ),
            "{md}"
        );
        assert!(md.contains("both offered udp64 (echo-offload 200 kpps, naive 200 kpps offered): 1.47× in the share answered (75.0 % against 51.0 %; 1.47× in replies per second, 150 against 102 kpps, at those offered rates) — NOT met"), "{md}");
        assert!(md.contains("Not the goal (different loads): echo-offload offered gso64 (2000 kpps of 64-byte datagrams) answered 1020 kpps, 10.00× what the naive echo answered offered udp64 (200 kpps offered, 102 kpps answered)."), "{md}");
        crate::report::assert_rows_match_headers(&md);
        let back: EchoReport = serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
        assert_eq!(back.rows.len(), report.rows.len());
        assert_eq!(back.goals, report.goals);
        assert_eq!(back.trains, report.trains);
    }

    #[test]
    fn variant_selection() {
        assert_eq!(select_variants(None).unwrap().len(), 3);
        let v = select_variants(Some(&["offload".into(), "naive".into(), "echo-offload".into()])).unwrap();
        assert_eq!(v.iter().map(|v| v.label).collect::<Vec<_>>(), ["naive", "echo-offload"]);
        assert!(select_variants(Some(&["turbotun-offload".into()])).is_err());
        assert!(select_variants(Some(&[" ".into()])).is_err());
        // The GSO trains go to the offload echo only.
        assert!(VARIANTS.iter().filter(|v| v.gso).all(|v| v.short == "offload"));
    }
}
