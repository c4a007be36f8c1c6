//! The tunnel bench's report: a row per kind and traffic kind with each endpoint's CPU, peak RSS and system calls
//! per GB, the flood rows, and the Markdown tables.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::iperf::Traffic;
use crate::modes::Unavailable;
use crate::report::{self, spread_of, ReportHeader, RunRecord, Summary};
use crate::stats::{cell, fmt_count, med, med_count, ratio, Spread};

use super::kinds::{unflooded, KINDS, REFERENCE};

/// One endpoint of a row over the repetitions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct EndpointRow {
    /// `A` (the iperf3 client's namespace: the sending end) or `B` (the server's: the receiving end).
    pub side: String,
    pub program: String,
    /// utime+stime over the window, % of one core.
    pub cpu_percent: Option<Spread>,
    /// Peak RSS (VmHWM) over the window, MB.
    pub rss_mb: Option<Spread>,
    /// System calls per gigabyte (10^9 bytes) of goodput.
    pub syscalls_per_gb: Option<Spread>,
}

/// One tunnel kind and traffic kind over the repetitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TunnelRow {
    pub kind: String,
    pub traffic: String,
    /// No endpoint process: the kernel carries the traffic (veth, vxlan); CPU, RSS and system calls do not
    /// apply.
    pub kernel: bool,
    /// Goodput, retransmits, loss, drops and box CPU, summarized as the forwarder bench does.
    pub summary: Summary,
    pub endpoints: Vec<EndpointRow>,
    /// Both endpoints' CPU (% of a core) over Gbps, per run, median: the cost of one Gbps.
    pub cpu_per_gbps: Option<Spread>,
    /// Median Gbps over wireguard-go's, same traffic, same run.
    pub ratio_wggo_gbps: Option<f64>,
    /// Median CPU %/Gbps over wireguard-go's (below 1: cheaper per Gbps).
    pub ratio_wggo_cpu_per_gbps: Option<f64>,
    /// The whole box's CPU (every core, softirq and iperf3 included) over Gbps, % of one core, per run, median:
    /// what the endpoints' own CPU misses (softirq work run in ksoftirqd or charged to iperf3), and the only CPU
    /// figure of the kernel's tunnels.
    #[serde(default)]
    pub box_cpu_per_gbps: Option<Spread>,
    /// Median box CPU %/Gbps over wireguard-go's.
    #[serde(default)]
    pub ratio_wggo_box_cpu_per_gbps: Option<f64>,
}

pub(super) fn gbps(r: &RunRecord) -> Option<f64> {
    r.iperf.as_ref().map(|i| i.gbps).filter(|g| *g > 0.0)
}

/// The rows, traffic outer and kind inner (report order), with the ratios to wireguard-go.
pub(super) fn rows(runs: &[RunRecord], kinds: &[(String, String)], traffic: &[Traffic]) -> Vec<TunnelRow> {
    let summaries = report::summarize(runs, kinds, traffic);
    let mut rows: Vec<TunnelRow> = summaries
        .into_iter()
        .filter(|s| s.runs > 0)
        .map(|s| {
            let ok: Vec<&RunRecord> = runs
                .iter()
                .filter(|r| r.mode == s.mode && r.traffic == s.traffic && r.error.is_none() && r.iperf.is_some())
                .collect();
            let kernel = KINDS.iter().find(|k| k.label == s.mode).is_some_and(|k| k.is_kernel());
            let mut endpoints = Vec::new();
            for side in ["A", "B"] {
                let of = |r: &RunRecord| r.endpoints.iter().find(|e| e.side == side).cloned();
                let Some(program) = ok.iter().find_map(|r| of(r)).map(|e| e.program) else { continue };
                endpoints.push(EndpointRow {
                    side: side.into(),
                    program,
                    cpu_percent: spread_of(&ok, |r| of(r)?.cpu_percent),
                    rss_mb: spread_of(&ok, |r| Some(of(r)?.peak_rss_kb? as f64 / 1024.0)),
                    syscalls_per_gb: spread_of(&ok, |r| of(r)?.syscalls_per_gb(gbps(r)?)),
                });
            }
            let cpu_per_gbps = spread_of(&ok, |r| {
                let cpu: Option<f64> = r.endpoints.iter().map(|e| e.cpu_percent).sum();
                (!r.endpoints.is_empty()).then_some(cpu? / gbps(r)?)
            });
            let cores = crate::cpus() as f64;
            let box_cpu_per_gbps = spread_of(&ok, |r| Some(r.box_cpu_percent? * cores / gbps(r)?));
            TunnelRow {
                kind: s.mode.clone(),
                traffic: s.traffic.clone(),
                kernel,
                summary: s,
                endpoints,
                cpu_per_gbps,
                ratio_wggo_gbps: None,
                ratio_wggo_cpu_per_gbps: None,
                box_cpu_per_gbps,
                ratio_wggo_box_cpu_per_gbps: None,
            }
        })
        .collect();
    let median = |s: Option<Spread>| s.map(|s| s.median);
    let reference: Vec<(String, [Option<f64>; 3])> = rows
        .iter()
        .filter(|r| r.kind == REFERENCE)
        .map(|r| (r.traffic.clone(), [median(r.summary.gbps), median(r.cpu_per_gbps), median(r.box_cpu_per_gbps)]))
        .collect();
    let ratio = |x: Option<f64>, base: Option<f64>| Some(x? / base.filter(|b| *b > 0.0)?);
    for row in &mut rows {
        let Some((_, [g, c, b])) = reference.iter().find(|(t, _)| *t == row.traffic) else { continue };
        row.ratio_wggo_gbps = ratio(median(row.summary.gbps), *g);
        row.ratio_wggo_cpu_per_gbps = ratio(median(row.cpu_per_gbps), *c);
        row.ratio_wggo_box_cpu_per_gbps = ratio(median(row.box_cpu_per_gbps), *b);
    }
    rows
}

/// One `-flood` kind over the repetitions, beside the same endpoints without the flood.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct FloodRow {
    pub kind: String,
    pub traffic: String,
    /// The kind it is compared with: the same endpoints, no flood, in the same bench.
    pub unflooded: String,
    /// Addresses the flood came from.
    pub sources: usize,
    /// Runs, and those that failed (under a flood: mostly iperf3 starved until it could not finish).
    #[serde(default)]
    pub runs: usize,
    #[serde(default)]
    pub failed: usize,
    pub gbps: Option<Spread>,
    pub unflooded_gbps: Option<Spread>,
    /// Median goodput under the flood over the median without it.
    pub ratio: Option<f64>,
    /// Initiations the flood generator sent per second, thousands.
    pub flood_kpps: Option<Spread>,
    /// B's endpoint's CPU over the window, % of one core.
    pub b_cpu_percent: Option<Spread>,
    /// Datagrams B's socket had no room for over the window (the kernel's UDP receive-buffer errors in B).
    pub b_socket_dropped: Option<Spread>,
    /// What B's endpoint counted as dropped, by reason (the reasons with any drop in a run), per run.
    pub b_drops: Vec<(String, Spread)>,
}

/// The rows of the `-flood` kinds that ran, with their unflooded kinds' goodput.
pub(super) fn flood_rows(runs: &[RunRecord], rows: &[TunnelRow]) -> Vec<FloodRow> {
    let mut out = Vec::new();
    for row in rows {
        let Some(k) = KINDS.iter().find(|k| k.label == row.kind) else { continue };
        let (Some(flood), Some(base)) = (k.flood, unflooded(k)) else { continue };
        let ok: Vec<&RunRecord> = runs
            .iter()
            .filter(|r| r.mode == row.kind && r.traffic == row.traffic && r.error.is_none() && r.iperf.is_some())
            .collect();
        let unflooded_gbps = rows.iter().find(|r| r.kind == base.label && r.traffic == row.traffic);
        let unflooded_gbps = unflooded_gbps.and_then(|r| r.summary.gbps);
        let drops_of = |r: &RunRecord| -> Vec<(String, u64)> {
            let b = r.endpoints.iter().find(|e| e.side == "B").and_then(|e| e.counters.as_ref());
            let by_reason = b.and_then(|c| c["drops_by_reason"].as_object().cloned()).unwrap_or_default();
            by_reason.into_iter().map(|(k, v)| (k, v.as_u64().unwrap_or(0))).collect()
        };
        let mut reasons: Vec<String> =
            ok.iter().flat_map(|r| drops_of(r)).filter(|(_, n)| *n > 0).map(|(k, _)| k).collect();
        reasons.sort();
        reasons.dedup();
        let b_drops = reasons
            .into_iter()
            .filter_map(|reason| {
                let s = spread_of(&ok, |r| drops_of(r).into_iter().find(|(k, _)| *k == reason).map(|(_, n)| n as f64));
                Some((reason, s?))
            })
            .collect();
        out.push(FloodRow {
            kind: row.kind.clone(),
            traffic: row.traffic.clone(),
            unflooded: base.label.to_string(),
            sources: flood.sources,
            runs: row.summary.runs,
            failed: row.summary.failed,
            gbps: row.summary.gbps,
            unflooded_gbps,
            ratio: row.summary.gbps.zip(unflooded_gbps.filter(|g| g.median > 0.0)).map(|(g, u)| g.median / u.median),
            flood_kpps: spread_of(&ok, |r| Some(r.flood.as_ref()?.pps() / 1e3)),
            b_cpu_percent: row.endpoints.iter().find(|e| e.side == "B").and_then(|e| e.cpu_percent),
            b_socket_dropped: spread_of(&ok, |r| r.udp_rcvbuf_errors.map(|n| n as f64)),
            b_drops,
        });
    }
    out
}

/// The flood table: each `-flood` kind beside its unflooded kind.
pub(super) fn flood_markdown(o: &mut String, report: &TunnelReport) {
    let _ = writeln!(
        o,
        "\n### WireGuard handshake flood — B's endpoint flooded during each run\n\n\
         | tunnel | traffic | flood from | Gbps | without flood | ×no flood | flood kpps sent | CPU % B | \
         B's socket dropped | B's drops by reason |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for f in &report.flood_rows {
        let drops: Vec<String> = f.b_drops.iter().map(|(k, s)| format!("{k} {}", fmt_count(s.median))).collect();
        let failed = if f.failed > 0 { format!(" ({} of {} failed)", f.failed, f.runs) } else { String::new() };
        let _ = writeln!(
            o,
            "| {}{failed} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            f.kind,
            f.traffic,
            if f.sources == 1 { "1 address".to_string() } else { format!("{} addresses", f.sources) },
            cell(f.gbps),
            cell(f.unflooded_gbps),
            ratio(f.ratio),
            cell(f.flood_kpps),
            med(f.b_cpu_percent),
            med_count(f.b_socket_dropped),
            if drops.is_empty() { "none".to_string() } else { drops.join(", ") }
        );
    }
    let _ = writeln!(
        o,
        "\nThe flood: WireGuard handshake initiations with random content and a valid mac1 (which takes nothing but \
         B's public key), sent from A's namespace by `turbotun bench --wg-flood`, one thread, `sendmmsg` batches of \
         64, {}, from A's underlay address or from that many addresses taken in turn, over the whole \
         window (flood kpps sent: what it achieved). Gbps: medians (min–max) over interleaved repetitions; ×no flood: the median under the flood over \
         the median of the same endpoints without it in this bench, both over the runs that finished (a run fails when \
         the flood starves iperf3 until it cannot finish). B's drops: what B's endpoint counted as \
         dropped, by reason, median per run (its counters line when stopped); B's socket dropped: the datagrams \
         the kernel found no room for in B's sockets.",
        match report.flood_rate_pps {
            0 => "as fast as it can (--flood-rate 0: the load differs with what each endpoint leaves of the machine)"
                .to_string(),
            pps => format!("paced to {} kpps for every endpoint alike (--flood-rate)", pps / 1000),
        }
    );
}

/// The JSON document of `--tunnel`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TunnelReport {
    /// Which program, which build, on which machine, when.
    #[serde(flatten)]
    pub header: ReportHeader,
    pub duration_s: u64,
    pub reps: u32,
    /// The underlay and the tunnels' addresses and MTUs.
    pub underlay: String,
    pub tunnel: String,
    pub kinds: Vec<String>,
    pub traffic: Vec<String>,
    /// Kinds selected that could not run, with why.
    pub skipped: Vec<Unavailable>,
    /// Whether system calls were counted, and how or why not.
    pub syscalls_counted: bool,
    pub syscalls: String,
    pub rows: Vec<TunnelRow>,
    /// The `-flood` kinds beside their unflooded kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flood_rows: Vec<FloodRow>,
    /// The rate every flood was paced to, initiations a second (0: as fast as one core sent them).
    #[serde(default)]
    pub flood_rate_pps: u64,
    /// Every run, with both endpoints' samples and counters lines.
    pub runs: Vec<RunRecord>,
}

/// The cells of one row of a traffic kind's table.
pub(super) fn row_cells(r: &TunnelRow, udp: bool) -> Vec<String> {
    let s = &r.summary;
    let failed = if s.failed > 0 { format!(" ({} of {} failed)", s.failed, s.runs) } else { String::new() };
    let mut cells = vec![
        format!("{}{failed}", r.kind),
        cell(s.gbps),
        ratio(r.ratio_wggo_gbps),
        if udp { cell(s.lost_percent) } else { med_count(s.retransmits) },
    ];
    let end = |side: &str| r.endpoints.iter().find(|e| e.side == side);
    if r.kernel {
        cells.extend(["kernel", "kernel", "kernel", "–", "n/a", "n/a", "n/a", "n/a"].map(String::from));
    } else {
        cells.push(cell(end("A").and_then(|e| e.cpu_percent)));
        cells.push(cell(end("B").and_then(|e| e.cpu_percent)));
        cells.push(med(r.cpu_per_gbps));
        cells.push(ratio(r.ratio_wggo_cpu_per_gbps));
        cells.push(med(end("A").and_then(|e| e.rss_mb)));
        cells.push(med(end("B").and_then(|e| e.rss_mb)));
        cells.push(med_count(end("A").and_then(|e| e.syscalls_per_gb)));
        cells.push(med_count(end("B").and_then(|e| e.syscalls_per_gb)));
    }
    cells.push(med(s.box_cpu_percent));
    cells.push(med(r.box_cpu_per_gbps));
    cells.push(ratio(r.ratio_wggo_box_cpu_per_gbps));
    cells
}

/// The overview (Gbps of every kind and traffic), one table per traffic kind, what the columns mean and the
/// kinds that were skipped.
pub(super) fn markdown(report: &TunnelReport, traffic: &[Traffic]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## turbotun bench --tunnel ({} build): {} s per run, {} rep(s) interleaved, kernel {}, {} CPUs\n",
        report.header.build, report.duration_s, report.reps, report.header.kernel, report.header.cpus
    );
    let _ = writeln!(
        o,
        "Underlay: {}. Tunnel: {}. iperf3 client (the sender) in A, server in B.\n",
        report.underlay, report.tunnel
    );
    let _ = write!(o, "| tunnel |");
    for t in traffic {
        let _ = write!(o, " {} Gbps median (min–max) |", t.label);
    }
    let _ = write!(o, "\n|---|");
    for _ in traffic {
        let _ = write!(o, "---|");
    }
    o.push('\n');
    for kind in &report.kinds {
        let _ = write!(o, "| {kind} |");
        for t in traffic {
            let r = report.rows.iter().find(|r| r.kind == *kind && r.traffic == t.label);
            let _ = write!(o, " {} |", r.map(|r| cell(r.summary.gbps)).unwrap_or_else(|| "–".into()));
        }
        o.push('\n');
    }
    for t in traffic {
        let _ = writeln!(o, "\n### {} — {}\n", t.label, t.description);
        let _ = writeln!(
            o,
            "| tunnel | Gbps | ×wg-go | {} | CPU % A | CPU % B | CPU %/Gbps | ×wg-go | RSS MB A | RSS MB B | \
             syscalls/GB A | syscalls/GB B | box CPU % | box CPU %/Gbps | ×wg-go |",
            if t.udp { "lost %" } else { "retr" }
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in report.rows.iter().filter(|r| r.traffic == t.label) {
            let _ = writeln!(o, "| {} |", row_cells(r, t.udp).join(" | "));
        }
    }
    let _ = writeln!(
        o,
        "\nMedians (min–max) over interleaved repetitions. Gbps = receiver goodput (iperf3); retr = TCP \
         retransmits (sender); lost % = UDP datagrams sent but not received. A = the client's namespace (its \
         endpoint encrypts and sends), B = the server's. CPU % = utime+stime of the endpoint process over the \
         window, % of one core (veth and vxlan: the kernel does the work, in softirq and in iperf3's system \
         calls, not attributable to a process). CPU %/Gbps = both endpoints' CPU over Gbps, per run. ×wg-go = \
         the median over {REFERENCE}'s in this run (Gbps: above 1 is faster; CPU %/Gbps: below 1 is cheaper). \
         RSS MB = peak RSS (VmHWM) of the endpoint over the window. syscalls/GB = system calls the endpoint \
         entered per 10^9 bytes of goodput: {}. box CPU % = all cores busy over the window (100 = every \
         core). box CPU %/Gbps = the whole box's CPU (every core, so softirq work in ksoftirqd or charged to iperf3, \
         and iperf3 itself, which every kind shares) in % of one core, over Gbps, per run: the endpoints' CPU misses \
         the kernel's work on their behalf, for turbotun and the peers alike but not necessarily equally.",
        report.syscalls
    );
    if !report.flood_rows.is_empty() {
        flood_markdown(&mut o, report);
    }
    if !report.skipped.is_empty() {
        let _ = writeln!(o, "\nSkipped:");
        for u in &report.skipped {
            let _ = writeln!(o, "- {}: {}", u.mode, u.reason);
        }
    }
    o
}
