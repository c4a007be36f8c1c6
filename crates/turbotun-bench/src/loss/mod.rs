//! `turbotun bench --loss`: where datagrams are lost, and each forwarder's no-drop rate.
//!
//! Every trial is one run of the ordinary topology (fresh namespaces and forwarder, `runner::run_one`) with
//! turbotun's generator paced at one offered rate of 64-byte datagrams, one flow, no GSO, toward the sink in
//! B. A trial's row says what the generator offered and transmitted, what the sink received, and where the
//! difference went: the devices' TX dropped (the tun ring's tail drop), the forwarder's own drop counter and
//! the sink socket's drops (`SO_RXQ_OVFL`); the generator's and sink's own rates sit beside it, so that neither
//! is taken for the bottleneck.
//!
//! The table runs every offered rate (step outer, forwarder inner, so that a slow phase of the machine hits
//! every forwarder); then each forwarder's no-drop rate is searched for (RFC 2544 throughput: the highest
//! offered rate whose trial loses at most [`LOSS_THRESHOLD_PERCENT`]) by bisection between the table's highest
//! passing rate and its lowest failing one, at most a fixed number of further trials ([`search_no_drop`]).

use std::fmt::Write as _;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::chart;
use crate::iperf::Traffic;
use crate::modes::{Mode, Unavailable};
use crate::report::{ReportHeader, RunRecord};
use crate::runner::{interrupted, is_not_ready, run_one, Ctx};
use crate::stats::fmt_num;
use crate::Options;

mod search;
#[cfg(test)]
use search::search_no_drop;
pub(crate) use search::{Search, Searcher};

/// Offered rates of the table, thousands of datagrams per second.
pub(crate) const STEPS_KPPS: &[u64] = &[25, 50, 100, 150, 200, 300];
/// ... with `--quick`.
pub(crate) const QUICK_STEPS_KPPS: &[u64] = &[50, 150, 300];
/// A trial passes when it loses at most this share of what the generator transmitted.
pub(crate) const LOSS_THRESHOLD_PERCENT: f64 = 0.1;
/// Most trials of the no-drop search beyond the table's.
pub(crate) const SEARCH_TRIALS: usize = 5;
/// ... with `--quick`.
pub(crate) const QUICK_SEARCH_TRIALS: usize = 3;
/// Times each forwarder's no-drop rate is searched for (each search from the table's trials alone, its steps
/// interleaved with the other forwarders'): the rate reported is the median of the searches, with their spread.
pub(crate) const SEARCH_REPEATS: usize = 3;
pub(crate) const QUICK_SEARCH_REPEATS: usize = 1;
/// The search stops once the passing and the failing rate are this close (datagrams per second).
pub(crate) const RESOLUTION_PPS: u64 = 1000;
/// UDP payload of every datagram.
pub(crate) const PAYLOAD: u32 = 64;

/// The traffic of one trial: 64-byte datagrams from turbotun's generator at `rate`, no GSO.
fn paced(rate: u64) -> Traffic {
    Traffic {
        label: "udp64-paced",
        description: "UDP, 64-byte datagrams from turbotun's generator at a paced rate, one flow, no GSO",
        udp: true,
        streams: 1,
        payload: PAYLOAD,
        gso: 1,
        rate,
    }
}

/// One trial, as a row of the table (and of the JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct LossRow {
    pub mode: String,
    pub family: String,
    /// The devices' queue length; None: the kernel's default.
    pub txqueuelen: Option<u32>,
    /// `table` or `search`.
    pub phase: String,
    /// The rate asked of the generator, datagrams per second.
    pub offered_pps: u64,
    /// Datagrams the generator's kernel took.
    pub transmitted: Option<u64>,
    /// Datagrams the sink received.
    pub received: Option<u64>,
    /// `transmitted - received`.
    pub lost: Option<u64>,
    pub lost_percent: Option<f64>,
    /// TX dropped of both devices over the trial (the tun ring's tail drop).
    pub dev_tx_dropped: Option<u64>,
    /// The forwarder's own drop counter (its counters line).
    pub fwd_drops: Option<u64>,
    /// The sink socket's drops (`SO_RXQ_OVFL`).
    pub socket_drops: Option<u64>,
    /// The generator's achieved rate: transmitted per second of its run.
    pub gen_pps: Option<f64>,
    /// The sink's rate: received per second, first to last datagram.
    pub sink_pps: Option<f64>,
    /// Received per second of the generator's run: what the chart plots against the offered rate.
    pub received_pps: Option<f64>,
    pub fwd_cpu_percent: Option<f64>,
    /// Why the trial produced no result.
    pub error: Option<String>,
}

impl LossRow {
    /// The row of one trial's record.
    pub(crate) fn from_run(rec: &RunRecord, offered_pps: u64, txqueuelen: Option<u32>, phase: &str) -> LossRow {
        let mut row = LossRow {
            mode: rec.mode.clone(),
            family: rec.family.clone(),
            txqueuelen,
            phase: phase.into(),
            offered_pps,
            error: rec.error.clone(),
            ..Default::default()
        };
        let Some(load) = rec.load.as_ref().filter(|_| rec.error.is_none()) else {
            if row.error.is_none() {
                row.error = Some("no report from the generator and sink".into());
            }
            return row;
        };
        let (g, s) = (&load.gen, &load.sink);
        let lost = g.sent.saturating_sub(s.packets);
        row.transmitted = Some(g.sent);
        row.received = Some(s.packets);
        row.lost = Some(lost);
        row.lost_percent = (g.sent > 0).then(|| lost as f64 * 100.0 / g.sent as f64);
        row.dev_tx_dropped = rec.dev_tx_dropped;
        row.fwd_drops = rec.fwd_drops();
        row.socket_drops = Some(s.socket_drops);
        row.gen_pps = Some(g.pps());
        row.sink_pps = Some(s.pps());
        row.received_pps = Some(s.packets as f64 / g.seconds.max(1e-9));
        row.fwd_cpu_percent = rec.fwd_cpu_percent;
        row
    }

    /// Whether the trial lost at most `threshold` percent; a trial without a result or that transmitted
    /// nothing does not pass.
    pub(crate) fn passes(&self, threshold: f64) -> bool {
        self.lost_percent.is_some_and(|p| p <= threshold)
    }
}

/// One forwarder's no-drop rate at one queue length.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct NoDrop {
    pub mode: String,
    pub family: String,
    pub txqueuelen: Option<u32>,
    /// The search over offered rates: `no_drop_pps` is the highest rate asked of the generator whose trial
    /// passed.
    #[serde(flatten)]
    pub search: Search,
    /// The no-drop rate: what the generator actually sent in the trial that passed at `search.no_drop_pps`
    /// (datagrams its kernel took per second), never more than was offered. A trial passes on the loss among
    /// what was sent, so a generator that fell short of the offered rate shows here, not as a higher rate.
    /// With several searches: the median search's (`search` is that one), the others in `repeats`.
    pub no_drop_sent_pps: Option<f64>,
    /// Every search of this forwarder at this queue length, in the order run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<SearchRepeat>,
    /// The no-drop rates sent over the searches that found one: median, min, max.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_drop_sent_spread: Option<crate::stats::Spread>,
}

/// One search of a forwarder's no-drop rate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SearchRepeat {
    #[serde(flatten)]
    pub search: Search,
    pub no_drop_sent_pps: Option<f64>,
}

impl NoDrop {
    /// The searches of `mode` at `txq`: the median one's rate and its offered rate, and the spread.
    fn of_repeats(mode: &str, family: &str, txq: Option<u32>, repeats: Vec<SearchRepeat>) -> NoDrop {
        let mut by_rate: Vec<&SearchRepeat> = repeats.iter().collect();
        by_rate.sort_by(|a, b| a.no_drop_sent_pps.unwrap_or(-1.0).total_cmp(&b.no_drop_sent_pps.unwrap_or(-1.0)));
        let median = by_rate.get(by_rate.len() / 2).copied().copied().unwrap_or_default();
        NoDrop {
            mode: mode.into(),
            family: family.into(),
            txqueuelen: txq,
            search: median.search,
            no_drop_sent_pps: median.no_drop_sent_pps,
            no_drop_sent_spread: crate::stats::Spread::of(repeats.iter().filter_map(|r| r.no_drop_sent_pps)),
            repeats,
        }
    }
}

/// The JSON document of `--loss`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LossReport {
    /// Which program, which build, on which machine, when.
    #[serde(flatten)]
    pub header: ReportHeader,
    pub payload_bytes: u32,
    pub trial_seconds: u64,
    pub ipv6: bool,
    pub steps_pps: Vec<u64>,
    /// The queue lengths the table ran at (null: the kernel's default).
    pub txqueuelens: Vec<Option<u32>>,
    pub loss_threshold_percent: f64,
    pub max_search_trials: usize,
    pub resolution_pps: u64,
    pub modes: Vec<String>,
    pub not_available: Vec<Unavailable>,
    /// Every trial, table and search.
    pub rows: Vec<LossRow>,
    pub no_drop: Vec<NoDrop>,
    /// The raw record of every trial (generator and sink reports, forwarder counters).
    pub runs: Vec<RunRecord>,
}

/// Runs the table and the searches, writes the JSON and chart if asked for and the Markdown on stdout; returns
/// how many trials failed.
pub(crate) fn run(ctx: &mut Ctx, args: &Options, modes: &[Mode], not_available: Vec<Unavailable>) -> Result<usize> {
    let (steps, txqueuelens) = steps_and_queue_lengths(args)?;
    let max_rate = steps.iter().copied().max().unwrap_or(0);
    let max_trials = if args.quick { QUICK_SEARCH_TRIALS } else { SEARCH_TRIALS };
    let repeats = if args.quick { QUICK_SEARCH_REPEATS } else { SEARCH_REPEATS };
    let started_unix = super::now_unix();
    let per_txq = (steps.len() + max_trials * repeats) * modes.len();
    eprintln!(
        "turbotun bench --loss: {} mode(s) × {} rate(s) + {repeats} search(es) of at most {max_trials} trial(s), \
         interleaved, at {} queue length(s), {} s per trial (~{} min at most)",
        modes.len(),
        steps.len(),
        txqueuelens.len(),
        ctx.duration,
        (per_txq as u64 * txqueuelens.len() as u64 * (ctx.duration + 2)).div_ceil(60)
    );
    let pb = super::progress_bar((per_txq * txqueuelens.len()) as u64);
    let mut t = Trials { ctx: &mut *ctx, pb: &pb, rows: Vec::new(), runs: Vec::new(), broken: Vec::new(), failures: 0 };
    let mut no_drop = Vec::new();
    let measured = (|| -> Result<()> {
        for &txq in &txqueuelens {
            t.ctx.txqueuelen = txq;
            for &rate in &steps {
                for m in modes {
                    t.trial(m, rate, "table")?;
                }
            }
            let mut searches: Vec<Vec<SearchRepeat>> = vec![Vec::new(); modes.len()];
            for repeat in 1..=repeats {
                let found = t.searches(modes, txq, &format!("search{repeat}"), max_rate, max_trials)?;
                searches.iter_mut().zip(found).for_each(|(all, one)| all.push(one));
            }
            no_drop.extend(
                modes.iter().zip(searches).map(|(m, found)| NoDrop::of_repeats(&m.label, m.family, txq, found)),
            );
        }
        Ok(())
    })();
    pb.finish_and_clear();
    measured?;
    let Trials { rows, runs, failures, .. } = t;
    let report = LossReport {
        header: ReportHeader::here("turbotun bench --loss", started_unix),
        payload_bytes: PAYLOAD,
        trial_seconds: ctx.duration,
        ipv6: ctx.ipv6,
        steps_pps: steps,
        txqueuelens,
        loss_threshold_percent: LOSS_THRESHOLD_PERCENT,
        max_search_trials: max_trials,
        resolution_pps: RESOLUTION_PPS,
        modes: modes.iter().map(|m| m.label.clone()).collect(),
        not_available,
        rows,
        no_drop,
        runs,
    };
    super::write_json(args.json.as_deref(), &report)?;
    if let Some(p) = &args.chart {
        write_chart(p, &report)?;
        eprintln!("turbotun bench: wrote {}", p.display());
    }
    super::print_markdown(&markdown(&report));
    Ok(failures)
}

/// The offered rates of the table (pps) and the queue lengths to run it at (`None`: the kernel's), from the
/// options.
fn steps_and_queue_lengths(args: &Options) -> Result<(Vec<u64>, Vec<Option<u32>>)> {
    let steps: Vec<u64> = args
        .rates
        .clone()
        .unwrap_or_else(|| if args.quick { QUICK_STEPS_KPPS } else { STEPS_KPPS }.to_vec())
        .into_iter()
        .map(|k| k * 1000)
        .collect();
    anyhow::ensure!(steps.iter().all(|&r| r > 0) && !steps.is_empty(), "--rates: give rates above 0 kpps");
    let txqueuelens: Vec<Option<u32>> = match &args.txqueuelen {
        Some(v) => v.iter().map(|&n| Some(n)).collect(),
        None => vec![None],
    };
    anyhow::ensure!(txqueuelens.iter().flatten().all(|&n| n > 0), "--txqueuelen: give lengths above 0");
    Ok((steps, txqueuelens))
}

/// The trials run so far and what they need.
struct Trials<'a> {
    ctx: &'a mut Ctx,
    pb: &'a indicatif::ProgressBar,
    rows: Vec<LossRow>,
    runs: Vec<RunRecord>,
    /// Modes whose forwarder never came up, and why: their later trials are skipped.
    broken: Vec<(String, String)>,
    failures: usize,
}

impl Trials<'_> {
    /// One search of every forwarder's no-drop rate at queue length `txq`, their steps interleaved (a trial of
    /// each in turn, so that what the machine does meanwhile falls on all alike): each a binary search between
    /// the table's rates (what they showed counts, not earlier searches), at most `max_trials` trials.
    fn searches(
        &mut self,
        modes: &[Mode],
        txq: Option<u32>,
        phase: &str,
        max_rate: u64,
        max_trials: usize,
    ) -> Result<Vec<SearchRepeat>> {
        let mut searchers: Vec<Searcher> = modes
            .iter()
            .map(|m| {
                let known: Vec<(u64, bool)> = table_rows(&self.rows, &m.label, txq)
                    .iter()
                    .map(|r| (r.offered_pps, r.passes(LOSS_THRESHOLD_PERCENT)))
                    .collect();
                Searcher::new(max_rate, &known, max_trials, RESOLUTION_PPS)
            })
            .collect();
        while searchers.iter().any(|s| s.next_rate().is_some()) {
            for (m, searcher) in modes.iter().zip(searchers.iter_mut()) {
                if let Some(rate) = searcher.next_rate() {
                    let passed = self.trial(m, rate, phase)?.passes(LOSS_THRESHOLD_PERCENT);
                    searcher.record(passed);
                }
            }
        }
        Ok(modes
            .iter()
            .zip(searchers)
            .map(|(m, searcher)| {
                let search = searcher.result();
                // The bar counted the whole budget; give back what the search did not use.
                self.pb.inc((max_trials - search.trials.min(max_trials)) as u64);
                let no_drop_sent_pps = no_drop_sent(&self.rows, &m.label, txq, search.no_drop_pps, phase);
                SearchRepeat { search, no_drop_sent_pps }
            })
            .collect())
    }

    /// One trial of `m` at `rate` (a failed one is a row with its error); an error only when interrupted.
    fn trial(&mut self, m: &Mode, rate: u64, phase: &str) -> Result<&LossRow> {
        let txq = self.ctx.txqueuelen;
        self.pb.set_message(format!(
            "{phase} {} {} kpps{}",
            m.label,
            rate_kpps(rate),
            txq.map(|n| format!(" txqueuelen {n}")).unwrap_or_default()
        ));
        let t = paced(rate);
        let rec = match self.broken.iter().find(|(b, _)| *b == m.label) {
            Some((_, why)) => RunRecord {
                mode: m.label.clone(),
                family: m.family.into(),
                traffic: t.label.into(),
                error: Some(format!("skipped: {why}")),
                ..Default::default()
            },
            None => match run_one(self.ctx, m, &t, 1, None) {
                Ok(r) => r,
                Err(e) if self.ctx.interrupted() => return Err(interrupted(e)),
                Err(e) => {
                    let msg = format!("{e:#}");
                    if is_not_ready(&e) {
                        self.broken.push((m.label.clone(), msg.clone()));
                    }
                    RunRecord {
                        mode: m.label.clone(),
                        family: m.family.into(),
                        traffic: t.label.into(),
                        ipv6: self.ctx.ipv6,
                        error: Some(msg),
                        ..Default::default()
                    }
                }
            },
        };
        let row = LossRow::from_run(&rec, rate, txq, phase);
        if let Some(err) = &row.error {
            self.failures += 1;
            self.pb.suspend(|| eprintln!("turbotun bench: {} at {rate} pps: {err}", m.label));
        }
        self.runs.push(rec);
        self.rows.push(row);
        self.pb.inc(1);
        Ok(self.rows.last().expect("just pushed"))
    }
}

/// What the generator sent per second in the passing trial of `mode` at queue length `txq` offered `offered`,
/// among the table's trials and the search `phase`'s (the last such trial, a search's repeat of a table rate
/// included).
pub(crate) fn no_drop_sent(
    rows: &[LossRow],
    mode: &str,
    txq: Option<u32>,
    offered: Option<u64>,
    phase: &str,
) -> Option<f64> {
    let offered = offered?;
    rows.iter()
        .rev()
        .filter(|r| r.phase == "table" || r.phase == phase)
        .find(|r| r.mode == mode && r.txqueuelen == txq && r.offered_pps == offered && r.passes(LOSS_THRESHOLD_PERCENT))
        .and_then(|r| r.gen_pps)
}

fn opt_count(x: Option<u64>) -> String {
    x.map(|x| x.to_string()).unwrap_or_else(|| "–".into())
}

fn opt_kpps(x: Option<f64>) -> String {
    x.map(|x| fmt_num(x / 1000.0)).unwrap_or_else(|| "–".into())
}

/// A rate in kpps: whole thousands as integers (the steps), others with one decimal (the search's).
fn rate_kpps(pps: u64) -> String {
    if pps % 1000 == 0 {
        (pps / 1000).to_string()
    } else {
        format!("{:.1}", pps as f64 / 1000.0)
    }
}

fn txq_label(txq: Option<u32>) -> String {
    match txq {
        Some(n) => format!("txqueuelen {n}"),
        None => "default txqueuelen".into(),
    }
}

/// The table rows of one forwarder at one queue length, by offered rate.
pub(crate) fn table_rows<'a>(rows: &'a [LossRow], mode: &str, txq: Option<u32>) -> Vec<&'a LossRow> {
    let mut v: Vec<&LossRow> =
        rows.iter().filter(|r| r.mode == mode && r.txqueuelen == txq && r.phase == "table").collect();
    v.sort_by_key(|r| r.offered_pps);
    v
}

/// One pktgen-style table per forwarder and queue length, then the no-drop rates.
pub(crate) fn markdown(report: &LossReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## turbotun bench --loss ({} build): {}-byte UDP, one flow, {} s trials, IPv{}, kernel {}, {} CPUs\n",
        report.header.build,
        report.payload_bytes,
        report.trial_seconds,
        if report.ipv6 { 6 } else { 4 },
        report.header.kernel,
        report.header.cpus
    );
    for &txq in &report.txqueuelens {
        for mode in &report.modes {
            let rows = table_rows(&report.rows, mode, txq);
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(o, "### {mode}, {}\n", txq_label(txq));
            let _ = writeln!(
                o,
                "| offered kpps | transmitted | received | lost | lost % | dev TX drop | fwd drop | socket drop | gen kpps | sink kpps | fwd CPU % |"
            );
            let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
            for r in rows {
                let _ = writeln!(o, "| {} |", row_cells(r).join(" | "));
            }
            o.push('\n');
        }
    }
    let _ = writeln!(
        o,
        "### No-drop rate (loss ≤ {} %: binary search of {} s trials between the table's rates, at most {} more, \
         resolution {} kpps; every search's steps interleaved across the forwarders, each forwarder searched \
         as often as the table's searches column says, the median search shown with the others' spread)\n",
        report.loss_threshold_percent,
        report.trial_seconds,
        report.max_search_trials,
        fmt_num(report.resolution_pps as f64 / 1000.0)
    );
    let _ = writeln!(
        o,
        "| mode | txqueuelen | no-drop kpps (sent) | offered there | lowest failing kpps (offered) | search trials |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    let top = report.steps_pps.iter().copied().max().unwrap_or(0);
    for n in &report.no_drop {
        // The median search's rate, and the range over the searches when there were several.
        let spread = match n.no_drop_sent_spread {
            Some(s) if n.repeats.len() > 1 => {
                format!(
                    " ({}–{}, {} of {} found one)",
                    opt_kpps(Some(s.min)),
                    opt_kpps(Some(s.max)),
                    s.n,
                    n.repeats.len()
                )
            }
            _ => String::new(),
        };
        let no_drop = match (n.no_drop_sent_pps, n.search.no_drop_pps) {
            (Some(sent), Some(offered)) if offered >= top => {
                format!("≥ {}{spread} (the top rate passed)", opt_kpps(Some(sent)))
            }
            (Some(sent), Some(_)) => format!("{}{spread}", opt_kpps(Some(sent))),
            (None, Some(_)) => "– (no trial record)".into(),
            (_, None) => "none passed".into(),
        };
        let searches: Vec<Search> =
            if n.repeats.is_empty() { vec![n.search] } else { n.repeats.iter().map(|r| r.search).collect() };
        let trials = format!(
            "{}{}",
            searches.iter().map(|s| s.trials.to_string()).collect::<Vec<_>>().join(" + "),
            if searches.iter().any(|s| s.budget_exhausted) { " (budget spent)" } else { "" }
        );
        let _ = writeln!(
            o,
            "| {} | {} | {no_drop} | {} | {} | {trials} |",
            n.mode,
            n.txqueuelen.map(|t| t.to_string()).unwrap_or_else(|| "default".into()),
            n.search.no_drop_pps.map(rate_kpps).unwrap_or_else(|| "–".into()),
            n.search.lowest_fail_pps.map(rate_kpps).unwrap_or_else(|| "–".into()),
        );
    }
    let _ = writeln!(
        o,
        "\noffered = the rate asked of turbotun's paced generator; transmitted = datagrams its kernel took; \
         received = datagrams the sink counted; lost = transmitted − received. Where they were lost, in \
         datagrams over the trial: dev TX drop = TX dropped of both devices (the tun ring's tail drop: the kernel \
         had a datagram for the forwarder and its ring was full), fwd drop = the forwarder's own drop counter, \
         socket drop = the sink socket's drops (SO_RXQ_OVFL). gen kpps and sink kpps are the generator's and the \
         sink's achieved rates: a gen kpps below the offered rate means the generator, not the forwarder, set the \
         pace. The no-drop rate is what the generator sent in the highest passing trial (a trial passes on the \
         loss among what was sent), with the rate offered there beside it. fwd CPU % is over the generator's run \
         (the window closes with its last datagram). {}",
        if report.txqueuelens.iter().any(Option::is_some) {
            "txqueuelen is the length of each device's queue, for a TUN device its ring."
        } else {
            ""
        }
    );
    if !report.not_available.is_empty() {
        let _ = writeln!(o, "\nNot available:");
        for u in &report.not_available {
            let _ = writeln!(o, "- {}: {}", u.mode, u.reason);
        }
    }
    o
}

/// The cells of one table row.
pub(crate) fn row_cells(r: &LossRow) -> Vec<String> {
    let offered = rate_kpps(r.offered_pps);
    if let Some(err) = &r.error {
        let mut cells = vec![offered, format!("failed: {}", err.replace('|', "/"))];
        cells.extend(std::iter::repeat("–".to_string()).take(9));
        return cells;
    }
    vec![
        offered,
        opt_count(r.transmitted),
        opt_count(r.received),
        opt_count(r.lost),
        r.lost_percent.map(|p| format!("{p:.3}")).unwrap_or_else(|| "–".into()),
        opt_count(r.dev_tx_dropped),
        opt_count(r.fwd_drops),
        opt_count(r.socket_drops),
        opt_kpps(r.gen_pps),
        opt_kpps(r.sink_pps),
        r.fwd_cpu_percent.map(fmt_num).unwrap_or_else(|| "–".into()),
    ]
}

/// Received against offered, one line per forwarder, one panel per queue length.
fn write_chart(path: &std::path::Path, report: &LossReport) -> Result<()> {
    let panels: Vec<chart::LinePanel> = report
        .txqueuelens
        .iter()
        .map(|&txq| chart::LinePanel {
            caption: format!("received vs offered, {}-byte UDP, {}", report.payload_bytes, txq_label(txq)),
            x_desc: "offered kpps".into(),
            y_desc: "received kpps".into(),
            lines: report
                .modes
                .iter()
                .filter_map(|mode| {
                    let rows = table_rows(&report.rows, mode, txq);
                    let points: Vec<(f64, f64)> = rows
                        .iter()
                        .filter_map(|r| Some((r.offered_pps as f64 / 1000.0, r.received_pps? / 1000.0)))
                        .collect();
                    let family = rows.first()?.family.clone();
                    Some(chart::Line { label: mode.clone(), family, points })
                })
                .collect(),
        })
        .collect();
    let title = format!("turbotun bench --loss — {} s trials, {}", report.trial_seconds, report.header.kernel);
    chart::write_line_chart(path, &panels, &title)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{GenReport, LoadResult, SinkReport};

    fn record(sent: u64, received: u64, socket_drops: u64) -> RunRecord {
        RunRecord {
            mode: "turbotun-offload".into(),
            family: "turbotun".into(),
            traffic: "udp64-paced".into(),
            dev_tx_dropped: Some(sent - received - socket_drops),
            fwd_counters: Some(serde_json::json!({"packets": received, "drops": 0})),
            fwd_cpu_percent: Some(55.0),
            load: Some(LoadResult {
                gen: GenReport {
                    sent,
                    seconds: 2.0,
                    segments: 1,
                    attempted: sent,
                    rate_pps: sent / 2,
                    ..Default::default()
                },
                sink: SinkReport { packets: received, seconds: 1.9, socket_drops, ..Default::default() },
            }),
            ..Default::default()
        }
    }

    #[test]
    fn rows_from_records() {
        let r = LossRow::from_run(&record(200_000, 199_900, 40), 100_000, Some(1000), "table");
        assert_eq!((r.transmitted, r.received, r.lost), (Some(200_000), Some(199_900), Some(100)));
        assert!((r.lost_percent.unwrap() - 0.05).abs() < 1e-12);
        assert_eq!((r.dev_tx_dropped, r.fwd_drops, r.socket_drops), (Some(60), Some(0), Some(40)));
        assert_eq!(r.gen_pps, Some(100_000.0));
        assert!((r.sink_pps.unwrap() - 199_900.0 / 1.9).abs() < 1e-6);
        assert_eq!(r.received_pps, Some(99_950.0));
        assert!(r.passes(LOSS_THRESHOLD_PERCENT));
        let lossy = LossRow::from_run(&record(200_000, 190_000, 0), 100_000, None, "table");
        assert!(!lossy.passes(LOSS_THRESHOLD_PERCENT));
        let cells = row_cells(&r);
        assert_eq!(cells.len(), 11);
        assert_eq!(cells[..6], ["100", "200000", "199900", "100", "0.050", "60"]);
        // A failed trial: its error in the row, never a pass.
        let failed = RunRecord { error: Some("forwarder died | x".into()), ..record(10, 10, 0) };
        let f = LossRow::from_run(&failed, 50_000, None, "search");
        assert!(f.transmitted.is_none() && !f.passes(100.0));
        let cells = row_cells(&f);
        assert_eq!(cells.len(), 11);
        assert!(cells[1].contains("forwarder died / x"), "{cells:?}");
    }

    /// A generator that fell short of the offered rate: the no-drop rate is what it sent, not what was asked.
    #[test]
    fn the_median_search_and_the_spread() {
        let repeat = |offered: u64, sent: Option<f64>| SearchRepeat {
            search: Search {
                no_drop_pps: Some(offered),
                lowest_fail_pps: Some(offered + 1000),
                trials: 5,
                budget_exhausted: true,
            },
            no_drop_sent_pps: sent,
        };
        let n = NoDrop::of_repeats(
            "turbotun-offload",
            "turbotun",
            None,
            vec![repeat(180_000, Some(179_000.0)), repeat(120_000, Some(119_500.0)), repeat(150_000, Some(150_000.0))],
        );
        assert_eq!((n.no_drop_sent_pps, n.search.no_drop_pps), (Some(150_000.0), Some(150_000)));
        let s = n.no_drop_sent_spread.unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (150_000.0, 119_500.0, 179_000.0, 3));
        let report = LossReport {
            header: ReportHeader::for_tests("t"),
            payload_bytes: 64,
            trial_seconds: 2,
            ipv6: false,
            steps_pps: vec![50_000, 300_000],
            txqueuelens: vec![None],
            loss_threshold_percent: 0.1,
            max_search_trials: 5,
            resolution_pps: 1000,
            modes: vec!["turbotun-offload".into()],
            not_available: vec![],
            rows: vec![],
            no_drop: vec![n],
            runs: vec![],
        };
        let md = markdown(&report);
        assert!(md.contains("| turbotun-offload | default | 150 (120–179, 3 of 3 found one) | 150 | 151 | 5 + 5 + 5 (budget spent) |"), "{md}");
    }

    #[test]
    fn no_drop_is_the_rate_sent() {
        // Offered 500 kpps for 2 s, the generator sent 330 kpps, nothing lost: a pass at 500 offered.
        let short = record(660_000, 660_000, 0);
        let mut rows = vec![LossRow::from_run(&short, 500_000, None, "table")];
        rows.push(LossRow::from_run(&record(300_000, 100_000, 0), 600_000, None, "table"));
        assert!(rows[0].passes(LOSS_THRESHOLD_PERCENT) && !rows[1].passes(LOSS_THRESHOLD_PERCENT));
        let known: Vec<(u64, bool)> = rows.iter().map(|r| (r.offered_pps, r.passes(LOSS_THRESHOLD_PERCENT))).collect();
        let search = search_no_drop(600_000, &known, 0, RESOLUTION_PPS, |_| Ok::<_, ()>(false)).unwrap();
        assert_eq!(search.no_drop_pps, Some(500_000), "the search works on offered rates");
        assert_eq!(no_drop_sent(&rows, "turbotun-offload", None, search.no_drop_pps, "search1"), Some(330_000.0));
        // Another queue length or a failing trial at that rate is not taken for it.
        assert_eq!(no_drop_sent(&rows, "turbotun-offload", Some(1000), search.no_drop_pps, "search1"), None);
        assert_eq!(no_drop_sent(&rows, "turbotun-offload", None, Some(600_000), "search1"), None);
        // Another search's passing trial is not this search's.
        rows.push(LossRow::from_run(&record(880_000, 880_000, 0), 550_000, None, "search2"));
        assert_eq!(no_drop_sent(&rows, "turbotun-offload", None, Some(550_000), "search2"), Some(440_000.0));
        assert_eq!(no_drop_sent(&rows, "turbotun-offload", None, Some(550_000), "search1"), None);
    }

    #[test]
    fn markdown_has_a_table_per_forwarder_and_the_no_drop_rates() {
        let mut rows = Vec::new();
        for (i, rate) in [150_000u64, 50_000].into_iter().enumerate() {
            let rec = record(rate * 2, rate * 2 - (i as u64) * 10, 0);
            rows.push(LossRow::from_run(&rec, rate, None, "table"));
        }
        rows.push(LossRow::from_run(&record(10, 10, 0), 99_000, None, "search"));
        let report = LossReport {
            header: ReportHeader::for_tests("t"),
            payload_bytes: 64,
            trial_seconds: 2,
            ipv6: false,
            steps_pps: vec![50_000, 150_000],
            txqueuelens: vec![None],
            loss_threshold_percent: 0.1,
            max_search_trials: 3,
            resolution_pps: 1000,
            modes: vec!["turbotun-offload".into()],
            not_available: vec![],
            rows,
            no_drop: vec![NoDrop {
                mode: "turbotun-offload".into(),
                family: "turbotun".into(),
                txqueuelen: None,
                search: Search {
                    no_drop_pps: Some(150_000),
                    lowest_fail_pps: None,
                    trials: 0,
                    budget_exhausted: false,
                },
                no_drop_sent_pps: Some(149_000.0),
                repeats: vec![],
                no_drop_sent_spread: None,
            }],
            runs: vec![],
        };
        let md = markdown(&report);
        assert!(md.contains("### turbotun-offload, default txqueuelen"), "{md}");
        // Sorted by offered rate; the search trial is not in the table.
        let first = md.find("| 50 | 100000 |").expect(&md);
        let second = md.find("| 150 | 300000 | 300000 |").expect(&md);
        assert!(first < second && !md.contains("| 99 |"), "{md}");
        assert!(md.contains("| turbotun-offload | default | ≥ 149 (the top rate passed) | 150 | – | 0 |"), "{md}");
        crate::report::assert_rows_match_headers(&md);
        let back: LossReport = serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
        assert_eq!(back.rows.len(), report.rows.len());
        assert_eq!(back.rows[0].received, report.rows[0].received);
        assert_eq!(back.no_drop, report.no_drop);
    }
}
