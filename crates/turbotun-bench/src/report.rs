//! Raw run records, per-(mode, traffic) summaries and the Markdown report.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::iperf::{IperfResult, Traffic};
use super::modes::{self, Unavailable};
use super::stats::{cell, med, med_count, ratio, Spread};

/// One measured run: one mode, one traffic kind, one repetition.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    pub mode: String,
    pub family: String,
    pub traffic: String,
    pub rep: u32,
    pub ipv6: bool,
    /// Why the run produced no result.
    pub error: Option<String>,
    pub iperf: Option<IperfResult>,
    /// Forwarder utime+stime over the test window, % of one core.
    pub fwd_cpu_percent: Option<f64>,
    /// Forwarder CPU time over the test window in user space (utime) and in the kernel (stime), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd_user_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd_sys_seconds: Option<f64>,
    /// Forwarder peak RSS (VmHWM, reset before the window when the kernel allows), kB.
    pub fwd_peak_rss_kb: Option<u64>,
    /// The forwarder's anonymous memory at the window's end (RssAnon: its buffers, heap and stacks), kB; the rest
    /// of its RSS is file pages, the code of the binary and libc, shared with every process that maps them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd_rss_anon_kb: Option<u64>,
    /// Whole-box CPU busy over the window, % of all cores.
    pub box_cpu_percent: Option<f64>,
    /// Length of the sampled window, seconds.
    pub window_seconds: f64,
    /// TX dropped of the two devices over the window (tun ring tail drop).
    pub dev_tx_dropped: Option<u64>,
    /// UDP receive-buffer errors in the server namespace over the window.
    pub udp_rcvbuf_errors: Option<u64>,
    /// The forwarder's final counters line.
    pub fwd_counters: Option<serde_json::Value>,
    pub fwd_exit: Option<String>,
    /// turbotun's generator and sink, when they made the traffic: both reports as they printed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<super::gen::LoadResult>,
    /// The endpoint processes of a tunnel (`--tunnel`), A's first, each sampled over the window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<ProcSample>,
    /// The handshake flood at B's endpoint over the window (the tunnel bench's `-flood` kinds), as its
    /// generator reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flood: Option<super::wgflood::FloodReport>,
}

/// One process sampled over the measurement window: a tunnel's endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProcSample {
    /// The namespace it runs in: `A` (the iperf3 client's) or `B` (the server's).
    pub side: String,
    /// What runs there (`wireguard-go`, `turbotun wg`, ...).
    pub program: String,
    pub pid: u32,
    /// utime+stime over the window, % of one core.
    pub cpu_percent: Option<f64>,
    /// CPU time over the window in user space (utime) and in the kernel (stime), seconds.
    pub user_seconds: Option<f64>,
    pub sys_seconds: Option<f64>,
    /// Peak RSS (VmHWM, reset before the window when the kernel allows), kB.
    pub peak_rss_kb: Option<u64>,
    /// Anonymous memory at the window's end (RssAnon), kB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_anon_kb: Option<u64>,
    /// System calls it entered over the window (`perf stat -e raw_syscalls:sys_enter -p PID`), and the seconds
    /// perf counted; None when they were not counted.
    pub syscalls: Option<u64>,
    pub syscall_seconds: Option<f64>,
    /// Why the system calls could not be counted in this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall_error: Option<String>,
    /// Its counters line, if it printed one when stopped.
    pub counters: Option<serde_json::Value>,
    pub exit: Option<String>,
}

impl ProcSample {
    /// System calls per gigabyte (10^9 bytes) of goodput at `gbps`: the rate perf counted over the rate the
    /// traffic moved bytes.
    pub(crate) fn syscalls_per_gb(&self, gbps: f64) -> Option<f64> {
        let rate = self.syscalls? as f64 / self.syscall_seconds.filter(|s| *s > 0.0)?;
        (gbps > 0.0).then(|| rate / (gbps / 8.0))
    }
}

impl RunRecord {
    /// The forwarder's own drop count (`drops` key of its counters line).
    pub(crate) fn fwd_drops(&self) -> Option<u64> {
        self.fwd_counters.as_ref()?.get("drops")?.as_u64()
    }

    /// A count over the window as thousands per second.
    pub(crate) fn per_ms(&self, count: Option<u64>) -> Option<f64> {
        let secs = self.iperf.as_ref().map(|i| i.seconds).filter(|s| *s > 0.0).unwrap_or(self.window_seconds);
        (secs > 0.0).then_some(count? as f64 / secs / 1000.0)
    }

    pub(crate) fn cpu_per_gbps(&self) -> Option<f64> {
        let g = self.iperf.as_ref()?.gbps;
        (g > 0.0).then_some(self.fwd_cpu_percent? / g)
    }
}

/// Medians and ranges of one (mode, traffic) cell.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Summary {
    pub mode: String,
    pub family: String,
    pub traffic: String,
    pub runs: usize,
    pub failed: usize,
    pub gbps: Option<Spread>,
    pub retransmits: Option<Spread>,
    pub rx_kpps: Option<Spread>,
    pub lost_kpps: Option<Spread>,
    pub lost_percent: Option<Spread>,
    pub fwd_cpu_percent: Option<Spread>,
    pub cpu_per_gbps: Option<Spread>,
    pub rss_mb: Option<Spread>,
    /// The anonymous part at the window's end, MB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_anon_mb: Option<Spread>,
    pub box_cpu_percent: Option<Spread>,
    /// Drops per run (counts) and the same per second of the window (kpps).
    pub dev_tx_dropped: Option<Spread>,
    pub fwd_drops: Option<Spread>,
    pub udp_rcvbuf_errors: Option<Spread>,
    pub dev_tx_drop_kpps: Option<Spread>,
    pub fwd_drop_kpps: Option<Spread>,
    pub udp_rcvbuf_err_kpps: Option<Spread>,
    pub congestion_control: Option<String>,
    /// Headline metric (Gbps for TCP, received kpps for UDP) relative to veth in this run.
    pub ratio_veth: Option<f64>,
    /// ... and relative to the best peer of the same traffic kind.
    pub ratio_best_peer: Option<f64>,
    pub best_peer: Option<String>,
    /// ... and relative to the ceiling forwarder (`ceiling`) in this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_ceiling: Option<f64>,
    /// Estimated cycles (see [`Cycles`]) of the forwarder per packet it counted, user space and kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_cycles_per_packet: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sys_cycles_per_packet: Option<Spread>,
    /// ... per segment: an MTU-sized packet of the traffic (TCP: goodput bytes over the MSS; UDP: datagrams
    /// received), the same count for every mode and peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_cycles_per_segment: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sys_cycles_per_segment: Option<Spread>,
    /// Estimated cycles per segment, user space and kernel together (medians added), over the ceiling
    /// forwarder's in this run: below 1.00× is cheaper than the ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycles_per_segment_ratio_ceiling: Option<f64>,
}

impl Summary {
    /// Gbps for TCP, received kpps for UDP.
    pub(crate) fn headline(&self, udp: bool) -> Option<Spread> {
        if udp {
            self.rx_kpps
        } else {
            self.gbps
        }
    }
}

/// What every bench report opens with: which program and build ran, on which kernel and how many CPUs, and
/// when. Flattened into each report's JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ReportHeader {
    pub tool: String,
    pub version: String,
    /// `release` or `debug` (turbotun's forwarder is this same binary).
    pub build: String,
    pub started_unix: u64,
    pub kernel: String,
    pub cpus: usize,
}

impl ReportHeader {
    /// This program on this machine, started at `started_unix`.
    pub(crate) fn here(tool: &str, started_unix: u64) -> Self {
        ReportHeader {
            tool: tool.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            build: super::build_kind().into(),
            started_unix,
            kernel: super::kernel(),
            cpus: super::cpus(),
        }
    }

    /// A fixed header for the report tests.
    #[cfg(test)]
    pub(crate) fn for_tests(tool: &str) -> Self {
        ReportHeader {
            tool: tool.into(),
            version: "0".into(),
            build: "debug".into(),
            started_unix: 0,
            kernel: "6.18".into(),
            cpus: 2,
        }
    }
}

/// Every row of every Markdown table in `md` has as many cells as its header (the report tests' check).
#[cfg(test)]
pub(crate) fn assert_rows_match_headers(md: &str) {
    for block in md.split("\n\n") {
        let rows: Vec<&str> = block.lines().filter(|l| l.starts_with('|')).collect();
        if let Some(header) = rows.first() {
            for row in &rows {
                assert_eq!(row.matches('|').count(), header.matches('|').count(), "{row}\nin\n{block}");
            }
        }
    }
}

/// The whole JSON document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Report {
    /// Which program, which build, on which machine, when.
    #[serde(flatten)]
    pub header: ReportHeader,
    pub duration_s: u64,
    pub reps: u32,
    pub ipv6: bool,
    pub modes: Vec<String>,
    pub traffic: Vec<String>,
    pub not_available: Vec<Unavailable>,
    pub runs: Vec<RunRecord>,
    pub summary: Vec<Summary>,
    /// How cycles were counted, and the clock used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycles: Option<Cycles>,
}

/// Where the cycle figures come from. This machine's hypervisor exposes no PMU (`perf stat -e cycles` counts
/// nothing), so cycles are estimated: CPU time (utime, stime from `/proc/PID/stat`, 10 ms ticks) times the CPU's
/// nominal clock from `/proc/cpuinfo`. That counts stalls and any clock below nominal as cycles.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Cycles {
    /// The clock the estimate multiplies by, MHz.
    pub mhz: f64,
    /// What `perf stat -e cycles` said, i.e. why this is an estimate.
    pub pmu: String,
}

/// TCP payload bytes per segment at the bench's MTU of 1500 (IP and TCP headers with timestamps removed).
const MSS_V4: f64 = 1448.0;
const MSS_V6: f64 = 1428.0;

/// netmap's figure for forwarding one packet (Rizzo, "netmap: a novel framework for fast packet I/O", USENIX
/// ATC 2012), quoted beside the estimates.
pub(crate) const NETMAP_CYCLES_PER_PACKET: f64 = 90.0;

/// Adds the cycle estimates to every summary: per packet over the forwarder's own `packets` counter, per
/// segment over the traffic's MTU-sized packets that crossed, as counted (the CPU window is the traffic's, see
/// runner.rs, so neither side is scaled); then each forwarder's cycles per segment against the ceiling's.
pub(crate) fn add_cycles(summary: &mut [Summary], runs: &[RunRecord], cycles: &Cycles, ipv6: bool, udp: &[&str]) {
    let hz = cycles.mhz * 1e6;
    for s in summary.iter_mut() {
        let ok: Vec<&RunRecord> = runs
            .iter()
            .filter(|r| r.mode == s.mode && r.traffic == s.traffic && r.error.is_none() && r.iperf.is_some())
            .collect();
        let is_udp = udp.contains(&s.traffic.as_str());
        let segments = |r: &RunRecord| -> Option<f64> {
            let ip = r.iperf.as_ref()?;
            let n = if is_udp {
                ip.udp_received? as f64
            } else {
                ip.gbps * 1e9 / 8.0 * ip.seconds / if ipv6 { MSS_V6 } else { MSS_V4 }
            };
            (n > 0.0).then_some(n)
        };
        let packets = |r: &RunRecord| -> Option<f64> {
            let p = r.fwd_counters.as_ref()?.get("packets")?.as_u64()? as f64;
            (p > 0.0).then_some(p)
        };
        let per = |cpu: fn(&RunRecord) -> Option<f64>, count: &dyn Fn(&RunRecord) -> Option<f64>| {
            spread_of(&ok, |r| Some(cpu(r)? * hz / count(r)?))
        };
        s.user_cycles_per_packet = per(|r| r.fwd_user_seconds, &packets);
        s.sys_cycles_per_packet = per(|r| r.fwd_sys_seconds, &packets);
        s.user_cycles_per_segment = per(|r| r.fwd_user_seconds, &segments);
        s.sys_cycles_per_segment = per(|r| r.fwd_sys_seconds, &segments);
    }
    let per_segment = |s: &Summary| Some(s.user_cycles_per_segment?.median + s.sys_cycles_per_segment?.median);
    let ceilings: Vec<(String, f64)> = summary
        .iter()
        .filter(|s| s.mode == "ceiling")
        .filter_map(|s| Some((s.traffic.clone(), per_segment(s).filter(|c| *c > 0.0)?)))
        .collect();
    for s in summary.iter_mut() {
        let ceiling = ceilings.iter().find(|(t, _)| *t == s.traffic).map(|(_, c)| *c);
        s.cycles_per_segment_ratio_ceiling = per_segment(s).zip(ceiling).map(|(c, base)| c / base);
    }
}

pub(super) fn spread_of<F: Fn(&RunRecord) -> Option<f64>>(runs: &[&RunRecord], f: F) -> Option<Spread> {
    Spread::of(runs.iter().filter_map(|r| f(r)))
}

/// Summaries for every (mode, traffic) pair in the given order, with ratios.
pub(crate) fn summarize(runs: &[RunRecord], modes: &[(String, String)], traffic: &[Traffic]) -> Vec<Summary> {
    let mut out = Vec::new();
    for t in traffic {
        let first = out.len();
        for (mode, family) in modes {
            let all: Vec<&RunRecord> = runs.iter().filter(|r| &r.mode == mode && r.traffic == t.label).collect();
            let ok: Vec<&RunRecord> = all.iter().copied().filter(|r| r.error.is_none() && r.iperf.is_some()).collect();
            let ip = |r: &RunRecord| r.iperf.clone().unwrap_or_default();
            let s = Summary {
                mode: mode.clone(),
                family: family.clone(),
                traffic: t.label.to_string(),
                runs: all.len(),
                failed: all.len() - ok.len(),
                gbps: spread_of(&ok, |r| Some(ip(r).gbps)),
                retransmits: spread_of(&ok, |r| ip(r).retransmits.map(|x| x as f64)),
                rx_kpps: spread_of(&ok, |r| ip(r).rx_kpps()),
                lost_kpps: spread_of(&ok, |r| ip(r).lost_kpps()),
                lost_percent: spread_of(&ok, |r| ip(r).udp_lost_percent),
                fwd_cpu_percent: spread_of(&ok, |r| r.fwd_cpu_percent),
                cpu_per_gbps: spread_of(&ok, |r| r.cpu_per_gbps()),
                rss_mb: spread_of(&ok, |r| r.fwd_peak_rss_kb.map(|k| k as f64 / 1024.0)),
                rss_anon_mb: spread_of(&ok, |r| r.fwd_rss_anon_kb.map(|k| k as f64 / 1024.0)),
                box_cpu_percent: spread_of(&ok, |r| r.box_cpu_percent),
                dev_tx_dropped: spread_of(&ok, |r| r.dev_tx_dropped.map(|x| x as f64)),
                fwd_drops: spread_of(&ok, |r| r.fwd_drops().map(|x| x as f64)),
                udp_rcvbuf_errors: spread_of(&ok, |r| r.udp_rcvbuf_errors.map(|x| x as f64)),
                dev_tx_drop_kpps: spread_of(&ok, |r| r.per_ms(r.dev_tx_dropped)),
                fwd_drop_kpps: spread_of(&ok, |r| r.per_ms(r.fwd_drops())),
                udp_rcvbuf_err_kpps: spread_of(&ok, |r| r.per_ms(r.udp_rcvbuf_errors)),
                congestion_control: ok.iter().find_map(|r| ip(r).sender_cc),
                ..Default::default()
            };
            out.push(s);
        }
        // Ratios within this traffic kind.
        let cells = &mut out[first..];
        let head = |s: &Summary| s.headline(t.udp).map(|x| x.median);
        let veth = cells.iter().find(|s| s.mode == "veth").and_then(head);
        let ceiling = cells.iter().find(|s| s.mode == "ceiling").and_then(head);
        let best_peer = cells
            .iter()
            .filter(|s| s.family != "baseline" && s.family != "turbotun" && s.family != modes::BASELINE_BUILD)
            .filter_map(|s| Some((s.mode.clone(), head(s)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        for s in cells.iter_mut() {
            let Some(h) = head(s) else { continue };
            s.ratio_veth = veth.filter(|v| *v > 0.0).map(|v| h / v);
            s.ratio_ceiling = ceiling.filter(|v| *v > 0.0).map(|v| h / v);
            if let Some((peer, v)) = &best_peer {
                if *v > 0.0 {
                    s.ratio_best_peer = Some(h / v);
                    s.best_peer = Some(peer.clone());
                }
            }
        }
    }
    out
}

/// The Markdown report: an overview (one row per mode, one column per traffic kind) and one detail table per
/// traffic kind.
pub(crate) fn markdown(report: &Report, traffic: &[Traffic]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## turbotun bench ({} build): {} s per run, {} rep(s) interleaved, IPv{}, kernel {}, {} CPUs\n",
        report.header.build,
        report.duration_s,
        report.reps,
        if report.ipv6 { 6 } else { 4 },
        report.header.kernel,
        report.header.cpus
    );
    let modes = report_modes(report);
    overview(&mut o, report, &modes, traffic);
    for t in traffic {
        detail(&mut o, report, &modes, t);
    }
    if let Some(cycles) = &report.cycles {
        cycles_table(&mut o, report, cycles, &modes, traffic);
    }
    notes(&mut o, report);
    o
}

/// The modes of the summary, in its order.
fn report_modes(report: &Report) -> Vec<&str> {
    let mut modes: Vec<&str> = Vec::new();
    for s in &report.summary {
        if !modes.contains(&s.mode.as_str()) {
            modes.push(&s.mode);
        }
    }
    modes
}

fn find<'a>(report: &'a Report, mode: &str, traffic: &str) -> Option<&'a Summary> {
    report.summary.iter().find(|s| s.mode == mode && s.traffic == traffic)
}

/// One row per mode, the headline metric of every traffic kind.
fn overview(o: &mut String, report: &Report, modes: &[&str], traffic: &[Traffic]) {
    let _ = write!(o, "| mode |");
    for t in traffic {
        let unit = if t.udp { "rx kpps" } else { "Gbps" };
        let _ = write!(o, " {} {unit} median (min–max) |", t.label);
    }
    let _ = write!(o, "\n|---|");
    for _ in traffic {
        let _ = write!(o, "---|");
    }
    o.push('\n');
    for m in modes {
        let _ = write!(o, "| {m} |");
        for t in traffic {
            let c = find(report, m, t.label).map(|s| cell(s.headline(t.udp))).unwrap_or_else(|| "–".into());
            let _ = write!(o, " {c} |");
        }
        o.push('\n');
    }
}

/// Everything measured for one traffic kind: losses and drops for UDP, retransmits and CPU per Gbps for TCP.
fn detail(o: &mut String, report: &Report, modes: &[&str], t: &Traffic) {
    let _ = writeln!(o, "\n### {} — {}\n", t.label, t.description);
    if t.udp {
        let _ = writeln!(
            o,
            "| mode | rx kpps | ×veth | ×best peer | Gbps | lost % | lost kpps | dev TX drop kpps | fwd drop kpps | rcvbuf err kpps | fwd CPU % | RSS MB | box CPU % |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    } else {
        let _ = writeln!(
            o,
            "| mode | Gbps | ×veth | ×best peer | ×ceiling | retr | fwd CPU % | CPU %/Gbps | RSS MB | box CPU % | cc |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
    }
    for m in modes {
        let Some(s) = find(report, m, t.label) else { continue };
        let failed = if s.failed > 0 { format!(" ({} of {} failed)", s.failed, s.runs) } else { String::new() };
        let cells = if t.udp { udp_cells(s) } else { tcp_cells(s) };
        let _ = writeln!(o, "| {m}{failed} | {} |", cells.join(" | "));
    }
}

/// Estimated cycles per packet and per segment, user space and kernel, for every forwarder.
fn cycles_table(o: &mut String, report: &Report, cycles: &Cycles, modes: &[&str], traffic: &[Traffic]) {
    let _ = writeln!(
        o,
        "\n### Cycles per packet and per segment (estimate)\n\n**Estimate, not a count**: {}, so cycles = CPU time \
         of the forwarder over the window (utime = user, stime = kernel, from /proc/PID/stat in 10 ms ticks) × \
         {:.0} MHz (the nominal clock in /proc/cpuinfo). Per packet: over the forwarder's own `packets` counter \
         (turbotun offload: MTU-sized packets; passthrough, plain and the ceiling: frames as read, a super-packet \
         counting once; peers: what their counters line calls packets). Per segment: over the MTU-sized packets \
         that crossed during the traffic (TCP: goodput over the MSS; UDP: datagrams received), as counted, the \
         same count for every row. cyc/seg ×ceiling = user and kernel cycles per segment together over the \
         ceiling forwarder's (below 1.00× is cheaper). netmap forwards a packet in \
         ~{NETMAP_CYCLES_PER_PACKET:.0} cycles (user and kernel together).\n",
        cycles.pmu, cycles.mhz
    );
    let _ = writeln!(
        o,
        "| mode | traffic | user cyc/pkt | kernel cyc/pkt | user cyc/seg | kernel cyc/seg | cyc/seg ×ceiling |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for t in traffic {
        for m in modes {
            let Some(s) = find(report, m, t.label) else { continue };
            if s.user_cycles_per_segment.is_none() && s.user_cycles_per_packet.is_none() {
                continue;
            }
            let _ = writeln!(
                o,
                "| {m} | {} | {} | {} | {} | {} | {} |",
                t.label,
                med_count(s.user_cycles_per_packet),
                med_count(s.sys_cycles_per_packet),
                med_count(s.user_cycles_per_segment),
                med_count(s.sys_cycles_per_segment),
                ratio(s.cycles_per_segment_ratio_ceiling)
            );
        }
    }
}

fn udp_cells(s: &Summary) -> Vec<String> {
    vec![
        cell(s.rx_kpps),
        ratio(s.ratio_veth),
        ratio(s.ratio_best_peer),
        med(s.gbps),
        cell(s.lost_percent),
        med(s.lost_kpps),
        med(s.dev_tx_drop_kpps),
        med(s.fwd_drop_kpps),
        med(s.udp_rcvbuf_err_kpps),
        cell(s.fwd_cpu_percent),
        rss_cell(s),
        med(s.box_cpu_percent),
    ]
}

/// Peak RSS, with its anonymous part where it was read: `8.06 (0.94 anon)`.
fn rss_cell(s: &Summary) -> String {
    match s.rss_anon_mb {
        Some(anon) => format!("{} ({} anon)", med(s.rss_mb), med(Some(anon))),
        None => med(s.rss_mb),
    }
}

fn tcp_cells(s: &Summary) -> Vec<String> {
    vec![
        cell(s.gbps),
        ratio(s.ratio_veth),
        ratio(s.ratio_best_peer),
        ratio(s.ratio_ceiling),
        med_count(s.retransmits),
        cell(s.fwd_cpu_percent),
        med(s.cpu_per_gbps),
        rss_cell(s),
        med(s.box_cpu_percent),
        s.congestion_control.clone().unwrap_or_else(|| "–".into()),
    ]
}

/// What the columns mean, and the modes that could not run.
fn notes(o: &mut String, report: &Report) {
    let best: Vec<String> = report
        .summary
        .iter()
        .filter_map(|s| Some(format!("{} {}", s.traffic, s.best_peer.as_ref()?)))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let _ = writeln!(
        o,
        "\nMedians (min–max) over interleaved repetitions. Ratios use the headline metric (Gbps for TCP, received \
         kpps for UDP) against veth and against the best peer of the same traffic kind in this run{}. fwd CPU % is \
         utime+stime of the forwarder over the traffic (% of one core: the window closes when iperf3's client or \
         turbotun's generator ends, before any wait for the last datagrams); box CPU % is of all cores. Where UDP \
         datagrams were lost, in thousands per second: dev TX drop = TX dropped of the two devices (the tun ring \
         tail drop; for veth its queue), fwd drop = the forwarder's own counter, rcvbuf err = UDP receive-buffer \
         errors in the server namespace (TX dropped counts what the kernel dropped: with gso64 one super-packet \
         of 64 datagrams counts once). RSS MB = the forwarder's peak RSS over the window (VmHWM), with its \
         anonymous part at the window's end (RssAnon: buffers, heap, stacks, what each queue pair adds); the rest \
         is file pages, the code of the binary and libc, shared with every process that maps them (the kernel maps \
         cached pages around each one touched). Flamegraphs, when asked for, come from an extra run per mode so that \
         perf does not disturb the measured ones.",
        if best.is_empty() { String::new() } else { format!(" ({})", best.join(", ")) }
    );
    if !report.not_available.is_empty() {
        let _ = writeln!(o, "\nNot available:");
        for u in &report.not_available {
            let _ = writeln!(o, "- {}: {}", u.mode, u.reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iperf::traffic_by_label;

    fn rec(mode: &str, family: &str, traffic: &str, rep: u32, gbps: f64, kpps: f64) -> RunRecord {
        let udp = traffic.starts_with("udp");
        RunRecord {
            mode: mode.into(),
            family: family.into(),
            traffic: traffic.into(),
            rep,
            iperf: Some(IperfResult {
                gbps,
                sender_gbps: gbps,
                retransmits: (!udp).then_some(10 * u64::from(rep)),
                sender_cc: (!udp).then(|| "cubic".into()),
                udp_packets: udp.then_some((kpps * 2000.0) as u64),
                udp_lost: udp.then_some((kpps * 1000.0) as u64),
                udp_received: udp.then_some((kpps * 1000.0) as u64),
                udp_lost_percent: udp.then_some(50.0),
                seconds: 1.0,
                ..Default::default()
            }),
            fwd_cpu_percent: (family != "baseline").then_some(100.0),
            fwd_peak_rss_kb: (family != "baseline").then_some(2048),
            fwd_rss_anon_kb: (family != "baseline").then_some(512),
            fwd_counters: (family != "baseline").then(|| serde_json::json!({"packets": 5, "drops": 3})),
            ..Default::default()
        }
    }

    fn sample() -> (Report, Vec<Traffic>) {
        let traffic = vec![traffic_by_label("tcp").unwrap(), traffic_by_label("udp64").unwrap()];
        let mut runs = Vec::new();
        for rep in 1..=3 {
            let r = f64::from(rep);
            runs.push(rec("veth", "baseline", "tcp", rep, 20.0 + r, 0.0));
            runs.push(rec("turbotun-offload", "turbotun", "tcp", rep, 10.0 + r, 0.0));
            runs.push(rec("tunrs-offload", "tunrs", "tcp", rep, 5.0 + r, 0.0));
            runs.push(rec("veth", "baseline", "udp64", rep, 0.1, 200.0));
            runs.push(rec("turbotun-offload", "turbotun", "udp64", rep, 0.1, 100.0 + r));
            runs.push(rec("tunrs-offload", "tunrs", "udp64", rep, 0.1, 50.0));
        }
        let mut failed = rec("tunrs-offload", "tunrs", "tcp", 4, 0.0, 0.0);
        failed.iperf = None;
        failed.error = Some("boom".into());
        runs.push(failed);
        let modes: Vec<(String, String)> =
            [("veth", "baseline"), ("turbotun-offload", "turbotun"), ("tunrs-offload", "tunrs")]
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
        let summary = summarize(&runs, &modes, &traffic);
        let report = Report {
            header: ReportHeader::for_tests("turbotun bench"),
            duration_s: 1,
            reps: 3,
            ipv6: false,
            modes: modes.iter().map(|m| m.0.clone()).collect(),
            traffic: vec!["tcp".into(), "udp64".into()],
            not_available: vec![Unavailable { mode: "turbotun-uring".into(), reason: "no --io".into() }],
            runs,
            summary,
            cycles: None,
        };
        (report, traffic)
    }

    #[test]
    fn summary_and_ratios() {
        let (report, _) = sample();
        let s = report.summary.iter().find(|s| s.mode == "turbotun-offload" && s.traffic == "tcp").unwrap();
        assert_eq!(s.gbps.unwrap().median, 12.0);
        assert!((s.ratio_veth.unwrap() - 12.0 / 22.0).abs() < 1e-9);
        assert!((s.ratio_best_peer.unwrap() - 12.0 / 7.0).abs() < 1e-9);
        assert_eq!(s.best_peer.as_deref(), Some("tunrs-offload"));
        assert_eq!(s.retransmits.unwrap().median, 20.0);
        assert_eq!(s.fwd_drops.unwrap().median, 3.0);
        assert_eq!(s.cpu_per_gbps.unwrap().median, 100.0 / 12.0);
        let peer = report.summary.iter().find(|s| s.mode == "tunrs-offload" && s.traffic == "tcp").unwrap();
        assert_eq!((peer.runs, peer.failed), (4, 1));
        let u = report.summary.iter().find(|s| s.mode == "turbotun-offload" && s.traffic == "udp64").unwrap();
        assert!((u.rx_kpps.unwrap().median - 102.0).abs() < 1e-9);
        assert!((u.ratio_veth.unwrap() - 0.51).abs() < 1e-9);
        let v = report.summary.iter().find(|s| s.mode == "veth" && s.traffic == "tcp").unwrap();
        assert_eq!(v.fwd_cpu_percent, None);
        assert_eq!(v.ratio_veth, Some(1.0));
    }

    #[test]
    fn markdown_tables() {
        let (report, traffic) = sample();
        let md = markdown(&report, &traffic);
        assert!(md.contains("| mode | tcp Gbps median (min–max) | udp64 rx kpps median (min–max) |"), "{md}");
        assert!(md.contains("| turbotun-offload | 12.0 (11.0–13.0) | 102 (101–103) |"), "{md}");
        assert!(md.contains("| tunrs-offload (1 of 4 failed) | 7.00 (6.00–8.00) |"), "{md}");
        assert!(md.contains("### udp64"), "{md}");
        // Peak RSS with its anonymous part.
        assert!(md.contains("| 2.00 (0.500 anon) |"), "{md}");
        assert!(md.contains("- turbotun-uring: no --io"), "{md}");
        assert_rows_match_headers(&md);
        // JSON round trip
        let j = serde_json::to_string(&report).unwrap();
        let back: Report = serde_json::from_str(&j).unwrap();
        assert_eq!(back.runs.len(), report.runs.len());
    }
    #[test]
    fn cycles_per_packet_and_segment() {
        let (mut report, traffic) = sample();
        for r in report.runs.iter_mut() {
            // A window a little longer than iperf3's second: the segments are counted as they crossed, not
            // scaled to the window.
            r.window_seconds = 1.1;
            if r.family != "baseline" {
                // 0.25 s user and 0.5 s kernel over a one-second window.
                r.fwd_user_seconds = Some(0.25);
                r.fwd_sys_seconds = Some(0.5);
                r.fwd_counters = Some(serde_json::json!({"packets": 1_000_000, "drops": 0}));
            }
        }
        let cycles = Cycles { mhz: 2000.0, pmu: "no PMU".into() };
        add_cycles(&mut report.summary, &report.runs, &cycles, false, &["udp64"]);
        report.cycles = Some(cycles);
        let off = report.summary.iter().find(|s| s.mode == "turbotun-offload" && s.traffic == "tcp").unwrap();
        // 0.25 s × 2 GHz over a million packets: 500 user cycles a packet, 1000 in the kernel.
        assert_eq!(off.user_cycles_per_packet.unwrap().median, 500.0);
        assert_eq!(off.sys_cycles_per_packet.unwrap().median, 1000.0);
        // Segments: 12 Gbps for one second over a 1448-byte MSS.
        let segs = 12e9 / 8.0 / 1448.0;
        assert!((off.user_cycles_per_segment.unwrap().median - 0.25 * 2e9 / segs).abs() < 1e-6);
        let udp = report.summary.iter().find(|s| s.mode == "turbotun-offload" && s.traffic == "udp64").unwrap();
        let received = udp_received(&report, "turbotun-offload");
        assert!((udp.sys_cycles_per_segment.unwrap().median - 0.5 * 2e9 / received).abs() < 1e-6);
        let veth = report.summary.iter().find(|s| s.mode == "veth").unwrap();
        assert!(veth.user_cycles_per_packet.is_none(), "no forwarder, no cycles");
        let md = markdown(&report, &traffic);
        assert!(md.contains("Cycles per packet and per segment (estimate)") && md.contains("no PMU"), "{md}");
        assert!(md.contains("| turbotun-offload | tcp | 500 | 1.0k |"), "{md}");
    }

    /// The cycles table's ratio to the ceiling is one of cycles (user and kernel per segment), not of Gbps.
    #[test]
    fn cycles_against_the_ceiling_are_a_cycles_ratio() {
        let traffic = vec![traffic_by_label("tcp").unwrap()];
        let mut runs = Vec::new();
        for (mode, gbps, user, sys) in [("ceiling", 20.0, 0.01, 0.4), ("turbotun-offload", 10.0, 0.15, 0.6)] {
            let mut r = rec(mode, "turbotun", "tcp", 1, gbps, 0.0);
            (r.fwd_user_seconds, r.fwd_sys_seconds, r.window_seconds) = (Some(user), Some(sys), 1.0);
            runs.push(r);
        }
        let modes: Vec<(String, String)> =
            ["ceiling", "turbotun-offload"].iter().map(|m| (m.to_string(), "turbotun".to_string())).collect();
        let mut summary = summarize(&runs, &modes, &traffic);
        let cycles = Cycles { mhz: 1000.0, pmu: "no PMU".into() };
        add_cycles(&mut summary, &runs, &cycles, false, &[]);
        let (ceiling, offload) = (&summary[0], &summary[1]);
        assert_eq!(offload.ratio_ceiling, Some(0.5), "Gbps against the ceiling");
        // Per segment: (0.15 + 0.6) s over half the segments, against (0.01 + 0.4) s: 0.75 × 2 / 0.41.
        let want = 0.75 * 2.0 / 0.41;
        assert!((offload.cycles_per_segment_ratio_ceiling.unwrap() - want).abs() < 1e-9, "{offload:?}");
        assert_eq!(ceiling.cycles_per_segment_ratio_ceiling, Some(1.0));
        let report = Report {
            header: ReportHeader::for_tests("turbotun bench"),
            duration_s: 1,
            reps: 1,
            ipv6: false,
            modes: vec!["ceiling".into(), "turbotun-offload".into()],
            traffic: vec!["tcp".into()],
            not_available: vec![],
            runs,
            summary,
            cycles: Some(cycles),
        };
        let md = markdown(&report, &traffic);
        assert!(md.contains("| cyc/seg ×ceiling |"), "{md}");
        let row = md.lines().find(|l| l.starts_with("| turbotun-offload | tcp |")).expect(&md);
        assert!(row.ends_with(&format!("| {want:.2}× |")), "{row}");
        assert_rows_match_headers(&md);
    }

    fn udp_received(report: &Report, mode: &str) -> f64 {
        let mut v: Vec<f64> = report
            .runs
            .iter()
            .filter(|r| r.mode == mode && r.traffic == "udp64" && r.error.is_none())
            .filter_map(|r| r.iperf.as_ref()?.udp_received.map(|x| x as f64))
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
}
