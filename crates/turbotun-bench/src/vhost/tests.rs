//! The vhost-user bench's unit tests.

use super::*;

fn run(row: &str, mpps: f64, cpu: f64) -> VhostRun {
    VhostRun {
        row: row.into(),
        mpps: Some(mpps),
        backend_cpu_per_second: Some(cpu),
        pps_per_cpu_second: Some(mpps * 1e6 / cpu),
        frontend_tx_packets: 1000,
        lost: 10,
        ..Default::default()
    }
}

/// The report of `runs`, every row listed, ratios made.
fn report_of(runs: Vec<VhostRun>, reps: u32) -> VhostReport {
    let rows: Vec<&RowSpec> = ROWS.iter().collect();
    VhostReport {
        header: ReportHeader::for_tests("turbotun bench --vhost-user"),
        duration_s: 1,
        reps,
        topology: String::new(),
        front_end: String::new(),
        rows: summarize(&runs, &rows),
        ratio_turbotun_dpdk_pps_per_cpu_second: None,
        goal_ratio: GOAL_PPS_PER_CPU,
        ratio_tso_no_offload_gbps: None,
        ratio_no_offload_tso_cpu_per_gb: None,
        goal_tso_no_offload: GOAL_TSO_NO_OFFLOAD,
        ratio_tso_ceiling_gbps: None,
        goal_tso_ceiling: GOAL_TSO_CEILING,
        ab: vec![],
        skipped: vec![],
        runs,
    }
    .with_ratio()
}

#[test]
fn rows_and_the_ratio_to_dpdk() {
    let runs = vec![
        run("turbotun", 1.0, 0.5),
        run("dpdk", 2.0, 1.0),
        run("turbotun", 1.2, 0.5),
        run("dpdk", 2.0, 1.0),
        VhostRun { row: "turbotun".into(), error: Some("broken".into()), ..Default::default() },
        VhostRun { row: "tso".into(), gbps: Some(10.0), backend_cpu_per_second: Some(0.5), ..Default::default() },
        VhostRun { row: "no-offload".into(), gbps: Some(2.0), backend_cpu_per_second: Some(1.0), ..Default::default() },
        VhostRun { row: "ceiling".into(), gbps: Some(20.0), ..Default::default() },
    ];
    let report = report_of(runs, 2);
    assert!(report.ab.is_empty(), "no baseline rows, no A/B: {:?}", report.ab);
    let turbotun = &report.rows[0];
    assert_eq!((turbotun.runs, turbotun.failed), (3, 1));
    assert_eq!(turbotun.pps_per_cpu_second.unwrap().median, 2.2e6);
    assert_eq!(turbotun.lost_percent.unwrap().median, 1.0);
    assert_eq!(report.ratio_turbotun_dpdk_pps_per_cpu_second, Some(1.1));
    let md = markdown(&report);
    assert!(md.contains("| turbotun (1 of 3 failed) | 1.10 (1.00–1.20) |"), "{md}");
    assert!(md.contains("1.10× (goal ≥ 1.5×: not met)"), "{md}");
    assert_eq!((report.ratio_tso_no_offload_gbps, report.ratio_tso_ceiling_gbps), (Some(5.0), Some(0.5)));
    assert!(md.contains("| ceiling | 20.0 | no backend |"), "{md}");
    // Per GB at the socket: tso 0.5 CPU-s/s over 1.25 GB/s = 0.4, no-offload 1.0 over 0.25 = 4: 10× less per byte.
    assert_eq!(report.ratio_no_offload_tso_cpu_per_gb, Some(10.0));
    assert!(md.contains("| tso | 10.0 | 0.500 | 0.400 |"), "{md}");
    assert!(
        md.contains("(no-offload's over tso's): 10.00× (goal ≥ 5×: met); tso/ceiling Gbps: 0.50× (goal ≥ 0.8×: not met). tso/no-offload in Gbps: 5.00×"),
        "{md}"
    );
    crate::report::assert_rows_match_headers(&md);
}

#[test]
fn the_ab_is_this_build_over_the_baseline_round_by_round() {
    let at = |row: &str, rep: u32, mpps: f64| VhostRun { rep, ..run(row, mpps, 1.0) };
    let tcp =
        |row: &str, rep: u32, gbps: f64| VhostRun { row: row.into(), rep, gbps: Some(gbps), ..Default::default() };
    let runs = vec![
        at("turbotun", 1, 1.2),
        at("turbotun@baseline", 1, 1.0),
        at("turbotun", 2, 3.0),
        at("turbotun@baseline", 2, 2.0),
        at("turbotun", 3, 1.0),
        at("turbotun@baseline", 3, 1.0),
        tcp("tso", 1, 10.0),
        tcp("tso@baseline", 1, 8.0),
    ];
    let report = report_of(runs, 3);
    let pps = report.ab.iter().find(|a| a.row == "turbotun").expect("turbotun's A/B");
    // Medians 1.2 over 1.0; rounds 1.2, 1.5, 1.0.
    assert!((pps.ratio_of_medians.unwrap() - 1.2).abs() < 1e-9, "{pps:?}");
    let round = pps.per_round.unwrap();
    assert_eq!((round.min, round.max, round.n), (1.0, 1.5, 3), "{pps:?}");
    assert!((round.median - 1.2).abs() < 1e-9, "{pps:?}");
    let tso = report.ab.iter().find(|a| a.row == "tso").expect("tso's A/B");
    assert_eq!((tso.ratio_of_medians, tso.measure.as_str()), (Some(1.25), "Gbps at the socket"));
    assert!(report.ab.iter().all(|a| a.row != "no-offload"), "a row without baseline runs has no A/B");
    let md = markdown(&report);
    assert!(md.contains("| turbotun | pps per backend CPU-second | 1.20× | 1.20× (1.00–1.50, 3 rounds) |"), "{md}");
    crate::report::assert_rows_match_headers(&md);
}
