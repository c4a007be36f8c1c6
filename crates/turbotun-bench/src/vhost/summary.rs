//! The vhost-user bench's report: the runs, a row per backend over the repetitions, the A/B ratios and the
//! Markdown.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::modes::Unavailable;
use crate::report::ReportHeader;
use crate::stats::{cell, fmt_count, med, ratio, Spread};
use crate::vguest;

use super::{Kind, RowSpec, REFERENCE, ROWS};

/// One run of one row.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct VhostRun {
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
pub(crate) struct VhostRow {
    pub row: String,
    pub description: String,
    pub runs: usize,
    pub failed: usize,
    pub mpps: Option<Spread>,
    pub backend_cpu_per_second: Option<Spread>,
    pub pps_per_cpu_second: Option<Spread>,
    /// The TCP rows: backend CPU-seconds per GB at the socket, per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds_per_gb: Option<Spread>,
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
pub(crate) struct VhostReport {
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
    /// The TCP rows: tso's median Gbps over no-offload's and over the ceiling's, with the goals. The guests of
    /// tso and no-offload do different work per byte (headers into prebuilt slots, against a copy and a checksum
    /// per frame), so Gbps compares the guests as much as the backend: the tso/no-offload goal is judged on
    /// [`Self::ratio_no_offload_tso_cpu_per_gb`].
    pub ratio_tso_no_offload_gbps: Option<f64>,
    /// The backend's CPU-seconds per GB with no-offload over with tso: how many times less the backend spends
    /// per byte with the guest's TSO, whatever either guest costs. What the tso/no-offload goal is judged on.
    #[serde(default)]
    pub ratio_no_offload_tso_cpu_per_gb: Option<f64>,
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
pub(crate) struct AbRatio {
    pub row: String,
    pub measure: String,
    /// Median over median.
    pub ratio_of_medians: Option<f64>,
    /// The ratio within each round (repetition), both measured side by side: median, min and max.
    pub per_round: Option<Spread>,
}

pub(super) fn summarize(runs: &[VhostRun], rows: &[&RowSpec]) -> Vec<VhostRow> {
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
                cpu_seconds_per_gb: of(|r| {
                    let (gb_per_second, cpu) = (r.gbps? / 8.0, r.backend_cpu_per_second?);
                    (gb_per_second > 0.0).then(|| cpu / gb_per_second)
                }),
            }
        })
        .collect()
}

impl VhostReport {
    /// Each row's pps per CPU-second over DPDK's, medians of this bench run.
    pub(super) fn with_ratio(mut self) -> VhostReport {
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
        let cpu_per_gb = |label: &str| {
            self.rows.iter().find(|r| r.row == label).and_then(|r| r.cpu_seconds_per_gb).map(|s| s.median)
        };
        self.ratio_no_offload_tso_cpu_per_gb = over(cpu_per_gb("no-offload"), cpu_per_gb("tso"));
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

pub(crate) fn markdown(report: &VhostReport) -> String {
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
            "| row | Gbps at the socket | backend CPU-s/s | backend CPU-s per GB | frames into TAP /s | go-backs | lost | backend drops |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|");
        for r in report.rows.iter().filter(|r| is_tcp(&r.row)) {
            let runs: Vec<&VhostRun> = report.runs.iter().filter(|x| x.row == r.row && x.error.is_none()).collect();
            let go_backs = Spread::of(runs.iter().filter_map(|x| Some(x.sender?.go_backs as f64)));
            let lost = Spread::of(runs.iter().map(|x| x.lost as f64));
            let _ = writeln!(
                o,
                "| {}{} | {} | {} | {} | {} | {} | {} | {} |",
                r.row,
                failed(r),
                cell(r.gbps),
                r.backend_cpu_per_second.map(|s| cell(Some(s))).unwrap_or_else(|| "no backend".into()),
                r.cpu_seconds_per_gb.map(|s| cell(Some(s))).unwrap_or_else(|| "–".into()),
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
            "\ntso/no-offload, the backend's CPU-s per GB (no-offload's over tso's): {}; tso/ceiling Gbps: {}. \
             tso/no-offload in Gbps: {} (not the goal: the two guests do different work per byte).",
            goal(report.ratio_no_offload_tso_cpu_per_gb, report.goal_tso_no_offload),
            goal(report.ratio_tso_ceiling_gbps, report.goal_tso_ceiling),
            report.ratio_tso_no_offload_gbps.map_or("–".to_string(), |x| format!("{x:.2}×"))
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
