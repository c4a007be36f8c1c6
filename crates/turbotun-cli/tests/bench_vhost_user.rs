//! End-to-end smoke test of `turbotun bench --vhost-user`: the real bench runs every row once for one second
//! (DPDK's virtio-user front end into `turbotun vhost-user` and into DPDK's own backend; the synthetic guest's
//! TCP connection with TSO, without offloads, and written straight into the TAP), and the test checks that the
//! JSON has each row with frames that reached the TAP (bytes that reached the socket) and the backend's CPU,
//! that `--list` names the same rows, and that nothing is left behind (namespaces, devices, processes, DPDK
//! runtime files, sockets).
//! Figures are not asserted. Needs root and dpdk-testpmd: skipped without them, except under CI=true where it
//! fails.

mod common;

use std::process::Command;
use std::time::Duration;

const TURBOTUN: &str = env!("CARGO_BIN_EXE_turbotun");
/// The tools the rows need, with the package that has each.
const TOOLS: &[(&str, &str)] = &[("dpdk-testpmd", "dpdk-dev"), ("stdbuf", "coreutils"), ("taskset", "util-linux")];
/// The packet rows (testpmd's frames into a TAP) and the TCP rows (the synthetic guest's connection).
const PPS_ROWS: &[&str] = &["turbotun", "dpdk"];
const TCP_ROWS: &[&str] = &["tso", "no-offload", "ceiling"];

/// `true` when the test can run; otherwise the suite's skip rule.
fn runnable(test: &str) -> bool {
    common::can_run(test, TOOLS)
}

fn number(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn bench_vhost_user_quick_measures_every_row() {
    if !runnable("bench_vhost_user_quick_measures_every_row") {
        return;
    }
    let list = Command::new(TURBOTUN).args(["bench", "--vhost-user", "--list"]).output().unwrap();
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "--list failed: {listed}");
    for row in PPS_ROWS.iter().chain(TCP_ROWS) {
        let line = listed.lines().find(|l| l.trim_start().starts_with(&format!("{row} "))).unwrap_or_else(|| {
            panic!("--list has no row {row}:\n{listed}");
        });
        assert!(!line.contains("not available"), "{row} is listed as unavailable here: {line}");
    }

    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("vhost.json");
    let mut bench = Command::new(TURBOTUN);
    bench.args(["bench", "--vhost-user", "--quick", "--json"]).arg(&json);
    let common::Finished { status, pid, stdout, stderr } = common::run_within(&mut bench, Duration::from_secs(180));
    if let Some(logs) = stderr.split("logs kept in ").nth(1) {
        let _ = std::fs::remove_dir_all(logs.trim());
    }
    assert!(status.success(), "bench failed ({status}):\n{stderr}\n{stdout}");

    // Nothing left behind: the namespaces are private and their TAPs went with them; testpmd's runtime files
    // (named by its --file-prefix, the bench's prefix) and the backends' sockets (in the bench's log
    // directory) are removed.
    let prefix = format!("tt{pid}r");
    assert!(common::entries_with_prefix("/sys/class/net", &prefix).is_empty(), "devices left");
    let left = common::processes_with(&prefix);
    assert!(left.is_empty(), "processes of the bench still running: {left:?}");
    let dpdk = common::entries_with_prefix("/var/run/dpdk", &prefix);
    assert!(dpdk.is_empty(), "DPDK runtime files left: {dpdk:?}");
    let shm = common::entries_with_prefix("/dev/shm", &prefix);
    assert!(shm.is_empty(), "shared memory left: {shm:?}");
    assert!(!stderr.contains("logs kept in"), "a run failed:\n{stderr}");

    for row in PPS_ROWS.iter().chain(TCP_ROWS) {
        assert!(stdout.contains(&format!("| {row} | ")), "no {row} row in the table:\n{stdout}");
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["skipped"].as_array().unwrap().is_empty(), "rows skipped: {}", v["skipped"]);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), PPS_ROWS.len() + TCP_ROWS.len(), "one repetition of each row: {runs:?}");
    for row in PPS_ROWS {
        let run = runs.iter().find(|r| r["row"] == *row).unwrap_or_else(|| panic!("no run of {row}"));
        assert!(run["error"].is_null(), "{row} failed: {run}");
        let tap = run["tap_rx_packets"].as_u64().unwrap();
        assert!(tap > 0, "{row}: no frame reached the TAP: {run}");
        // Over the whole run, the TAP received no more than the front end sent, and the difference is the loss.
        let (sent, total) =
            (run["frontend_tx_packets"].as_u64().unwrap(), run["tap_rx_packets_total"].as_u64().unwrap());
        assert!(total >= tap && sent >= total, "{row}: {run}");
        assert_eq!(run["lost"].as_u64().unwrap(), sent - total, "{row}: {run}");
        let cpu = number(&run["backend_user_seconds"]) + number(&run["backend_sys_seconds"]);
        assert!(cpu > 0.0, "{row}: no backend CPU counted: {run}");
        let window = number(&run["window_seconds"]);
        assert!((number(&run["backend_cpu_per_second"]) - cpu / window).abs() < 1e-9, "{row}: {run}");
        let pps = tap as f64 / window;
        assert!((number(&run["mpps"]) - pps / 1e6).abs() < 1e-9, "{row}: {run}");
        assert!((number(&run["pps_per_cpu_second"]) - pps * window / cpu).abs() < 1e-3, "{row}: {run}");
        assert!(run["backend_drops"].is_u64(), "{row}: no backend drop count: {run}");
        let summary = v["rows"].as_array().unwrap().iter().find(|r| r["row"] == *row).unwrap();
        assert_eq!(number(&summary["pps_per_cpu_second"]["median"]), number(&run["pps_per_cpu_second"]), "{row}");
    }
    // The turbotun backend's own counters: every frame it took from the ring, written to the TAP or dropped.
    let turbotun = runs.iter().find(|r| r["row"] == "turbotun").unwrap();
    let counters = &turbotun["backend_counters"]["to_tap"];
    assert_eq!(
        counters["packets"].as_u64().unwrap(),
        turbotun["tap_rx_packets_total"].as_u64().unwrap(),
        "turbotun's to_tap packets are the TAP's rx_packets: {turbotun}"
    );
    // The TCP rows: bytes reached the socket, frames the TAP, and the backend's CPU was counted where there is one.
    for row in TCP_ROWS {
        let run = runs.iter().find(|r| r["row"] == *row).unwrap_or_else(|| panic!("no run of {row}"));
        assert!(run["error"].is_null(), "{row} failed: {run}");
        let bytes = run["socket_bytes"].as_u64().unwrap();
        assert!(bytes > 0, "{row}: nothing reached the socket: {run}");
        let window = number(&run["window_seconds"]);
        assert!((number(&run["gbps"]) - bytes as f64 * 8.0 / window / 1e9).abs() < 1e-9, "{row}: {run}");
        assert!(run["tap_rx_packets"].as_u64().unwrap() > 0, "{row}: {run}");
        let sender = &run["sender"];
        assert!(sender["frames"].as_u64().unwrap() > 0 && sender["payload_bytes"].as_u64().unwrap() >= bytes, "{run}");
        let cpu = number(&run["backend_user_seconds"]) + number(&run["backend_sys_seconds"]);
        if *row == "ceiling" {
            assert!(run["backend_cpu_per_second"].is_null() && cpu == 0.0, "the ceiling has no backend: {run}");
        } else {
            assert!(cpu > 0.0, "{row}: no backend CPU counted: {run}");
            assert!((number(&run["backend_cpu_per_second"]) - cpu / window).abs() < 1e-9, "{row}: {run}");
            assert!(run["backend_counters"]["to_tap"]["packets"].as_u64().unwrap() > 0, "{row}: {run}");
        }
    }
    let gbps = |row: &str| number(&runs.iter().find(|r| r["row"] == row).unwrap()["gbps"]);
    let tso_ratio = number(&v["ratio_tso_no_offload_gbps"]);
    assert!((tso_ratio - gbps("tso") / gbps("no-offload")).abs() < 1e-9, "{tso_ratio}");
    let ceiling_ratio = number(&v["ratio_tso_ceiling_gbps"]);
    assert!((ceiling_ratio - gbps("tso") / gbps("ceiling")).abs() < 1e-9, "{ceiling_ratio}");

    let ratio = number(&v["ratio_turbotun_dpdk_pps_per_cpu_second"]);
    let of = |row: &str| number(&runs.iter().find(|r| r["row"] == row).unwrap()["pps_per_cpu_second"]);
    let (ours, theirs) = (of("turbotun"), of("dpdk"));
    assert!((ratio - ours / theirs).abs() < 1e-9, "the ratio is the two rows' figures: {ratio} {ours} {theirs}");
}
