//! The tunnel bench's unit tests.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use super::kinds::*;
use super::tables::*;
use super::*;
use crate::iperf::IperfResult;
use crate::modes::Unavailable;
use crate::report::{ProcSample, RunRecord};
use crate::topo::flood_sources;
use crate::wgflood::FloodReport;

fn rec(kind: &str, traffic: &str, rep: u32, gbps: f64, cpu: Option<f64>) -> RunRecord {
    let udp = traffic.starts_with("udp");
    let endpoint = |side: &str, cpu: f64| ProcSample {
        side: side.into(),
        program: kind.into(),
        pid: 1,
        cpu_percent: Some(cpu),
        peak_rss_kb: Some(10 * 1024),
        // 1 Gbps is 0.125 GB/s: 125,000 system calls a second is a million per GB.
        syscalls: Some((125_000.0 * gbps * 2.0) as u64),
        syscall_seconds: Some(2.0),
        ..Default::default()
    };
    RunRecord {
        mode: kind.into(),
        family: "x".into(),
        traffic: traffic.into(),
        rep,
        iperf: Some(IperfResult {
            gbps,
            retransmits: (!udp).then_some(7),
            udp_lost_percent: udp.then_some(12.0),
            udp_packets: udp.then_some(100),
            udp_received: udp.then_some(88),
            udp_lost: udp.then_some(12),
            seconds: 2.0,
            ..Default::default()
        }),
        endpoints: cpu.map(|c| vec![endpoint("A", c), endpoint("B", c / 2.0)]).unwrap_or_default(),
        box_cpu_percent: Some(90.0),
        ..Default::default()
    }
}

fn sample() -> (Vec<RunRecord>, Vec<(String, String)>) {
    let mut runs = Vec::new();
    for rep in 1..=3 {
        let r = f64::from(rep);
        runs.push(rec("veth", "tcp", rep, 20.0 + r, None));
        runs.push(rec("wireguard-go", "tcp", rep, 1.0 + r / 10.0, Some(100.0)));
        runs.push(rec("boringtun", "tcp", rep, 2.2, Some(110.0)));
        runs.push(rec("wireguard-go", "udp1372", rep, 0.5, Some(100.0)));
    }
    runs.push(RunRecord { error: Some("boom".into()), iperf: None, ..rec("boringtun", "tcp", 4, 0.0, None) });
    let kinds = [("veth", "baseline"), ("wireguard-go", "wggo"), ("boringtun", "boringtun")]
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .to_vec();
    (runs, kinds)
}

#[test]
fn rows_endpoints_and_ratios() {
    let (runs, kinds) = sample();
    let rows = rows(&runs, &kinds, TUNNEL_TRAFFIC);
    let labels: Vec<(&str, &str)> = rows.iter().map(|r| (r.kind.as_str(), r.traffic.as_str())).collect();
    assert_eq!(labels, [("veth", "tcp"), ("wireguard-go", "tcp"), ("boringtun", "tcp"), ("wireguard-go", "udp1372")]);
    let veth = &rows[0];
    assert!(veth.kernel && veth.endpoints.is_empty() && veth.cpu_per_gbps.is_none());
    let wg = &rows[1];
    assert!(!wg.kernel);
    assert!((wg.summary.gbps.unwrap().median - 1.2).abs() < 1e-9);
    assert_eq!(wg.ratio_wggo_gbps, Some(1.0));
    assert_eq!(wg.endpoints.len(), 2);
    assert_eq!(wg.endpoints[0].cpu_percent.unwrap().median, 100.0);
    assert_eq!(wg.endpoints[1].cpu_percent.unwrap().median, 50.0);
    assert_eq!(wg.endpoints[0].rss_mb.unwrap().median, 10.0);
    let per_gb = wg.endpoints[0].syscalls_per_gb.unwrap().median;
    assert!((per_gb - 1e6).abs() < 1.0, "{per_gb}");
    // Both endpoints, 150 % of a core, over 1.2 Gbps.
    assert!((wg.cpu_per_gbps.unwrap().median - 125.0).abs() < 1e-9);
    let bt = &rows[2];
    assert_eq!((bt.summary.runs, bt.summary.failed), (4, 1));
    assert!((bt.ratio_wggo_gbps.unwrap() - 2.2 / 1.2).abs() < 1e-9);
    assert!((bt.ratio_wggo_cpu_per_gbps.unwrap() - (165.0 / 2.2) / 125.0).abs() < 1e-9);
    assert_eq!(veth.ratio_wggo_cpu_per_gbps, None);
    assert!((veth.ratio_wggo_gbps.unwrap() - 22.0 / 1.2).abs() < 1e-9);
    // The box at 90 % of every core: per Gbps in % of one core, the kernel's tunnels included.
    let cores = crate::cpus() as f64;
    assert!((wg.box_cpu_per_gbps.unwrap().median - 90.0 * cores / 1.2).abs() < 1e-9);
    assert!((veth.box_cpu_per_gbps.unwrap().median - 90.0 * cores / 22.0).abs() < 1e-9);
    assert!((veth.ratio_wggo_box_cpu_per_gbps.unwrap() - 1.2 / 22.0).abs() < 1e-9);
    let udp = &rows[3];
    assert_eq!(udp.summary.lost_percent.unwrap().median, 12.0);
}

fn report() -> TunnelReport {
    let (runs, kinds) = sample();
    TunnelReport {
        header: ReportHeader::for_tests("t"),
        duration_s: 2,
        reps: 3,
        underlay: "u".into(),
        tunnel: "t".into(),
        kinds: kinds.iter().map(|k| k.0.clone()).collect(),
        traffic: vec!["tcp".into(), "udp1372".into()],
        skipped: vec![Unavailable { mode: "turbotun-wg".into(), reason: "no `wg` subcommand".into() }],
        syscalls_counted: true,
        syscalls: "perf".into(),
        rows: rows(&runs, &kinds, TUNNEL_TRAFFIC),
        flood_rows: Vec::new(),
        flood_rate_pps: 100_000,
        runs,
    }
}

#[test]
fn flood_rows_beside_their_unflooded_kinds() {
    let mut runs = Vec::new();
    for rep in 1..=3 {
        runs.push(rec("turbotun-wg", "tcp", rep, 4.0, Some(80.0)));
        let mut flooded = rec("turbotun-wg-flood64", "tcp", rep, 1.0 + f64::from(rep), Some(100.0));
        flooded.flood =
            Some(FloodReport { sent: 600_000 * u64::from(rep), seconds: 2.0, sources: 64, ..Default::default() });
        flooded.udp_rcvbuf_errors = Some(1000);
        flooded.endpoints[1].counters = Some(serde_json::json!({
            "drops_by_reason": { "unauthenticated": 100 * rep, "replayed": 0, "malformed_datagram": 2 }
        }));
        runs.push(flooded);
    }
    let starved = rec("turbotun-wg-flood64", "tcp", 4, 0.0, None);
    runs.push(RunRecord { error: Some("iperf3 did not finish within 15 s".into()), iperf: None, ..starved });
    let kinds = [("turbotun-wg", "turbotun"), ("turbotun-wg-flood64", "turbotun")]
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .to_vec();
    let rows = rows(&runs, &kinds, TUNNEL_TRAFFIC);
    let flood = flood_rows(&runs, &rows);
    assert_eq!(flood.len(), 1, "{flood:?}");
    let f = &flood[0];
    assert_eq!((f.kind.as_str(), f.unflooded.as_str(), f.sources), ("turbotun-wg-flood64", "turbotun-wg", 64));
    assert_eq!((f.runs, f.failed), (4, 1));
    assert_eq!(f.ratio, Some(3.0 / 4.0));
    assert_eq!(f.flood_kpps.unwrap().median, 600.0);
    assert_eq!(f.b_cpu_percent.unwrap().median, 50.0);
    let reasons: Vec<&str> = f.b_drops.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(reasons, ["malformed_datagram", "unauthenticated"], "only reasons with drops");
    assert_eq!(f.b_drops[1].1.median, 200.0);
    let mut report = report();
    report.flood_rows = flood;
    let md = markdown(&report, &[TUNNEL_TRAFFIC[0]]);
    assert!(
        md.contains("| turbotun-wg-flood64 (1 of 4 failed) | tcp | 64 addresses | 3.00 (2.00–4.00) | 4.00 | 0.75× | 600 (300–900) | 50.0 | 1.0k | malformed_datagram 2, unauthenticated 200 |"),
        "{md}"
    );
    assert!(md.contains("paced to 100 kpps for every endpoint alike"), "{md}");
    crate::report::assert_rows_match_headers(&md);
    let back: TunnelReport = serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
    assert_eq!((back.flood_rows, back.flood_rate_pps), (report.flood_rows.clone(), 100_000));
}

#[test]
fn flood_kinds_only_when_named() {
    assert!(select_kinds(None, true).unwrap().iter().all(|k| k.flood.is_none()));
    let k = select_kinds(Some(&["turbotun-wg-flood1".into(), "turbotun-wg".into()]), false).unwrap();
    assert_eq!(k.iter().map(|k| k.label).collect::<Vec<_>>(), ["turbotun-wg", "turbotun-wg-flood1"]);
    for k in KINDS.iter().filter(|k| k.flood.is_some()) {
        let base = unflooded(k).unwrap_or_else(|| panic!("{} has no unflooded kind", k.label));
        assert!(k.label.starts_with(base.label) && base.flood.is_none(), "{}", k.label);
    }
    let one: Vec<IpAddr> = vec![Ipv4Addr::new(10, 201, 0, 1).into()];
    assert_eq!(flood_sources(1).unwrap(), one);
    assert_eq!(flood_sources(64).unwrap().len(), 64);
    assert!(flood_sources(151).is_err() && flood_sources(0).is_err());
}

#[test]
fn markdown_tables() {
    let r = report();
    let traffic = [TUNNEL_TRAFFIC[0], TUNNEL_TRAFFIC[2]];
    let md = markdown(&r, &traffic);
    assert!(md.contains("| tunnel | tcp Gbps median (min–max) | udp1372 Gbps median (min–max) |"), "{md}");
    assert!(md.contains("| veth | 22.0 (21.0–23.0) | – |"), "{md}");
    assert!(md.contains("| veth | 22.0 (21.0–23.0) | 18.33× | 7 | kernel | kernel | kernel | – | n/a |"), "{md}");
    assert!(
        md.contains(
            "| wireguard-go | 1.20 (1.10–1.30) | 1.00× | 7 | 100 | 50.0 | 125 | 1.00× | 10.0 | 10.0 | 1.0M | 1.0M |"
        ),
        "{md}"
    );
    assert!(md.contains("| boringtun (1 of 4 failed) | 2.20 |"), "{md}");
    assert!(md.contains("| lost % |") && md.contains("| wireguard-go | 0.500 | 1.00× | 12.0 |"), "{md}");
    assert!(md.contains("- turbotun-wg: no `wg` subcommand"), "{md}");
    crate::report::assert_rows_match_headers(&md);
    let back: TunnelReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.rows.len(), r.rows.len());
    assert_eq!(back.runs[1].endpoints, r.runs[1].endpoints);
}

#[test]
fn kinds_and_traffic_selection() {
    let baseline_kinds = KINDS.iter().filter(|k| is_baseline(k)).count();
    assert_eq!(baseline_kinds, 2);
    let plain_kinds = KINDS.iter().filter(|k| !only_when_named(k)).count();
    assert_eq!(select_kinds(None, false).unwrap().len(), plain_kinds - baseline_kinds);
    let k = select_kinds(Some(&["turbotun-wg".into(), "wireguard-go".into()]), true).unwrap();
    let labels: Vec<&str> = k.iter().map(|k| k.label).collect();
    assert_eq!(labels, ["turbotun-wg", "turbotun-wg@baseline", "wireguard-go"], "--baseline adds the twin");
    assert!(select_kinds(Some(&["wireguard-go".into()]), true).is_err(), "a --baseline comparing nothing");
    let k = select_kinds(Some(&["turbotun-wg-q2".into()]), false).unwrap();
    assert_eq!(k[0].programs(), [Program::TurbotunWgTwoQueues]);
    assert!(Program::TurbotunWgTwoQueues.argv_env().0.windows(2).any(|w| w == ["--queues", "2"]));
    assert!(!select_kinds(None, true).unwrap().iter().any(|k| k.label.ends_with("-q2")), "only when named");
    assert_eq!(select_kinds(None, true).unwrap().len(), plain_kinds, "--baseline adds the A/B kinds");
    let k = select_kinds(Some(&["wireguard-go".into(), "veth".into(), "veth".into()]), false).unwrap();
    assert_eq!(k.iter().map(|k| k.label).collect::<Vec<_>>(), ["veth", "wireguard-go"]);
    assert!(select_kinds(Some(&["wggo".into()]), false).is_err());
    assert!(select_kinds(Some(&[" ".into()]), false).is_err());
    let ab = KINDS.iter().find(|k| k.label == "turbotun-wg@baseline").unwrap();
    assert_eq!(ab.programs(), [Program::BaselineWg]);
    assert_eq!(Program::BaselineWg.argv_env().0, ["wg", "-f", "{dev}"], "an older build prints JSON unasked");
    let interop = KINDS.iter().find(|k| k.label == "turbotun-wg-vs-wireguard-go").unwrap();
    assert_eq!(interop.programs(), [Program::TurbotunWg, Program::WireguardGo]);
    let gotatun = select_kinds(Some(&["gotatun".into()]), false).unwrap();
    assert_eq!(gotatun[0].programs(), [Program::Gotatun]);
    assert_eq!(Program::Gotatun.peer(), Some(("gotatun", "gotatun")), "build.sh's target, bench/peers/bin's name");
    assert!(KINDS.iter().any(|k| k.label == REFERENCE));
    assert!(KINDS.iter().filter(|k| k.is_kernel()).all(|k| k.programs().is_empty()));
    // The UDP datagrams fit the tunnel's MTU whole: 20 bytes of IP and 8 of UDP header.
    assert!(TUNNEL_TRAFFIC.iter().all(|t| !t.udp || t.payload + 28 <= TUNNEL_MTU));
}

#[test]
fn socket_names() {
    assert_eq!(socket_owner("tt1234r5ta.sock"), Some(1234));
    assert_eq!(socket_owner("tt1234r56tb.sock"), Some(1234));
    for other in ["wg0.sock", "tt1234r5ta", "tt1234r5tc.sock", "ttxr5ta.sock", "tt12r.sock", "tt1234rta.sock"] {
        assert_eq!(socket_owner(other), None, "{other}");
    }
    assert_eq!(turbotun_wg::uapi::socket_path("tt1r1ta"), PathBuf::from("/var/run/wireguard/tt1r1ta.sock"));
}

#[test]
fn endpoint_arguments() {
    let (argv, env) = Program::Boringtun.argv_env();
    assert!(argv.contains(&"--disable-drop-privileges") && env.contains(&("WG_SUDO", "true")));
    let (argv, env) = Program::Gotatun.argv_env();
    assert!(argv.contains(&"--disable-drop-privileges") && env.contains(&("WG_SUDO", "1")));
    let (argv, env) = Program::WireguardGo.argv_env();
    assert_eq!((argv, env), (&["-f", "{dev}"][..], &[("WG_PROCESS_FOREGROUND", "1")][..]));
    let all =
        [Program::TurbotunTunnel, Program::TurbotunWg, Program::WireguardGo, Program::Boringtun, Program::Gotatun];
    for p in all {
        assert!(p.argv_env().0.contains(&"{dev}"), "{p:?}");
    }
}
