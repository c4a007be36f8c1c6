//! End-to-end test of `turbotun bench --tunnel`: the real bench binary runs veth, the kernel's VXLAN and
//! wireguard-go (built into bench/peers/bin on first use) for one short repetition of TCP and UDP, and the test
//! checks that the table and the JSON carry numbers for those rows, and that nothing is left behind: no
//! namespace, device, WireGuard configuration socket, key directory or process. A second run takes the
//! handshake-flood kinds beside `turbotun-wg` (the flood table and its JSON, nothing left behind, nothing timed), a
//! third `--wg-storm` (every handshake of a small storm completes with turbotun-wg and wireguard-go). Needs root, iperf3, wg
//! (wireguard-tools), go and perf: skipped without them, except under CI=true where it fails.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

/// The tools the run needs, with the package that has each.
const TOOLS: &[(&str, &str)] =
    &[("iperf3", "iperf3"), ("wg", "wireguard-tools"), ("go", "golang-go"), ("perf", "linux-perf")];

/// `true` when the test can run; otherwise the suite's skip rule.
fn runnable(test: &str) -> bool {
    common::can_run(test, TOOLS)
}

/// Makes this test process the reaper of its orphaned descendants, so that a process the bench leaves behind
/// (an endpoint, an iperf3, a perf) becomes a child of the test when the bench exits, wherever it runs.
fn become_subreaper() {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes integer arguments only and changes no memory.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER: {}", std::io::Error::last_os_error());
}

/// This process's children, with their command lines (every thread's: an orphan goes to one of them).
fn children() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().map(String::from).collect::<Vec<_>>())
        .map(|pid| {
            // A zombie has no command line, but its name and state are in stat.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            format!("{} [{}]", String::from_utf8_lossy(&cmdline).replace('\0', " "), stat.trim())
        })
        .collect()
}

fn number(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Nothing of the bench run `pid` left behind. The namespaces are private (never under /run/netns) and die with
/// the last process inside: with no process of the run left, none is. The devices lived in them. The
/// configuration sockets live in /var/run/wireguard, outside any namespace.
fn nothing_left_behind(pid: u32, key_dirs_before: &[String]) {
    let prefix = format!("tt{pid}r");
    assert!(common::entries_with_prefix("/run/netns", &prefix).is_empty(), "named namespaces left");
    let devices = common::entries_with_prefix("/sys/class/net", &prefix);
    assert!(devices.is_empty(), "devices left in the root namespace: {devices:?}");
    let sockets = common::entries_with_prefix("/var/run/wireguard", &prefix);
    assert!(sockets.is_empty(), "configuration sockets left: {sockets:?}");
    let left = common::processes_with(&prefix);
    assert!(left.is_empty(), "endpoint processes left: {left:?}");
    // Whatever the bench started and left running is now this test's child (iperf3, perf, an endpoint, a flood).
    std::thread::sleep(Duration::from_millis(200));
    let orphans = children();
    assert!(orphans.is_empty(), "processes of the bench left running: {orphans:?}");
    let key_dirs = common::entries_with_prefix(&std::env::temp_dir().to_string_lossy(), "turbotun-bench-wg-");
    assert!(key_dirs.iter().all(|d| key_dirs_before.contains(d)), "key directory left: {key_dirs:?}");
}

/// One bench at a time: each takes the machine's two cores, and each looks for processes it left behind among
/// this test process's children.
static ONE_BENCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn bench_tunnel_veth_vxlan_wireguard_go() {
    if !runnable("bench_tunnel_veth_vxlan_wireguard_go") {
        return;
    }
    let _one = ONE_BENCH.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (json, chart) = (dir.path().join("tunnel.json"), dir.path().join("tunnel.svg"));
    let key_dirs_before = common::entries_with_prefix(&std::env::temp_dir().to_string_lossy(), "turbotun-bench-wg-");
    become_subreaper();
    let started = Instant::now();
    let mut bench = Command::new(env!("CARGO_BIN_EXE_turbotun"));
    bench
        .args(["bench", "--tunnel", "--tunnel-kinds", "veth,vxlan,wireguard-go", "--traffic", "tcp,udp1372"])
        .args(["--duration", "1", "--reps", "1", "--json"])
        .arg(&json)
        .arg("--chart")
        .arg(&chart);
    // Building wireguard-go the first time takes part of the time allowed.
    let common::Finished { status, pid, stdout, stderr } = common::run_within(&mut bench, Duration::from_secs(180));
    assert!(status.success(), "bench failed ({status}):\n{stderr}\n{stdout}");
    eprintln!("bench --tunnel took {:.1} s", started.elapsed().as_secs_f64());

    nothing_left_behind(pid, &key_dirs_before);

    // The table: an overview row per kind, a table per traffic kind, the kernel rows marked so.
    for kind in ["veth", "vxlan", "wireguard-go"] {
        assert!(stdout.contains(&format!("| {kind} | ")), "no {kind} row:\n{stdout}");
    }
    assert!(stdout.contains("### tcp") && stdout.contains("### udp1372"), "{stdout}");
    assert!(stdout.contains("| kernel | kernel |"), "{stdout}");
    assert!(chart.is_file() && std::fs::read_to_string(&chart).unwrap().contains("wireguard-go"), "no chart");

    // The JSON: every run succeeded, and every row has its numbers.
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "3 kinds × 2 traffic kinds × 1 repetition");
    for r in runs {
        assert!(r["error"].is_null(), "run failed: {r}");
    }
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{rows:?}");
    let counted = v["syscalls_counted"].as_bool().unwrap();
    assert!(counted, "system calls not counted: {}", v["syscalls"]);
    let run_of = |kind: &str, traffic: &str| {
        runs.iter().find(|r| r["mode"] == kind && r["traffic"] == traffic).unwrap_or_else(|| panic!("{kind} {traffic}"))
    };
    let wggo_gbps = |traffic: &str| {
        let row = rows.iter().find(|r| r["kind"] == "wireguard-go" && r["traffic"] == traffic).unwrap();
        number(&row["summary"]["gbps"]["median"])
    };
    for row in rows {
        let (kind, traffic) = (row["kind"].as_str().unwrap(), row["traffic"].as_str().unwrap());
        let s = &row["summary"];
        let run = run_of(kind, traffic);
        let gbps = number(&s["gbps"]["median"]);
        assert!(gbps > 0.0, "{kind} {traffic}: no goodput: {row}");
        // One repetition: the row's figures are that run's.
        assert_eq!(gbps, number(&run["iperf"]["gbps"]), "{kind} {traffic}: {row}\n{run}");
        if traffic == "tcp" {
            assert_eq!(number(&s["retransmits"]["median"]), number(&run["iperf"]["retransmits"]), "{row}");
        } else {
            let (sent, lost) = (number(&run["iperf"]["udp_packets"]), number(&run["iperf"]["udp_lost"]));
            assert!(sent > 0.0 && lost <= sent, "{run}");
            assert!((number(&s["lost_percent"]["median"]) - lost * 100.0 / sent).abs() < 1e-6, "{row}\n{run}");
        }
        // Against wireguard-go in the same run: the rows' own figures give the ratio.
        let want = gbps / wggo_gbps(traffic);
        assert!((number(&row["ratio_wggo_gbps"]) - want).abs() < 1e-9, "{kind} {traffic}: {row}");
        if kind == "wireguard-go" {
            assert!(!row["kernel"].as_bool().unwrap());
            assert!(number(&row["cpu_per_gbps"]["median"]) > 0.0, "{row}");
            let ends = row["endpoints"].as_array().unwrap();
            assert_eq!(ends.len(), 2, "{row}");
            for (e, side) in ends.iter().zip(["A", "B"]) {
                assert_eq!(e["side"], side);
                assert_eq!(e["program"], "wireguard-go");
                assert!(number(&e["cpu_percent"]["median"]) > 0.0, "{e}");
                assert!(number(&e["rss_mb"]["median"]) > 0.0, "{e}");
                assert!(number(&e["syscalls_per_gb"]["median"]) > 0.0, "{e}");
            }
        } else {
            assert!(row["kernel"].as_bool().unwrap(), "{row}");
            assert!(row["endpoints"].as_array().unwrap().is_empty(), "{row}");
        }
    }
}

#[test]
fn bench_tunnel_wireguard_handshake_flood() {
    if !runnable("bench_tunnel_wireguard_handshake_flood") {
        return;
    }
    let _one = ONE_BENCH.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("flood.json");
    let key_dirs_before = common::entries_with_prefix(&std::env::temp_dir().to_string_lossy(), "turbotun-bench-wg-");
    become_subreaper();
    let mut bench = Command::new(env!("CARGO_BIN_EXE_turbotun"));
    bench
        .args(["bench", "--tunnel", "--tunnel-kinds", "turbotun-wg,turbotun-wg-flood1,turbotun-wg-flood64"])
        .args(["--traffic", "tcp", "--duration", "1", "--reps", "1", "--no-syscalls", "--json"])
        .arg(&json);
    let common::Finished { status, pid, stdout, stderr } = common::run_within(&mut bench, Duration::from_secs(180));
    // A run that failed keeps its logs, and says where.
    if let Some(logs) = stderr.split("logs kept in ").nth(1) {
        let _ = std::fs::remove_dir_all(logs.trim());
    }
    assert!(status.success(), "bench failed ({status}):\n{stderr}\n{stdout}");
    nothing_left_behind(pid, &key_dirs_before);

    assert!(stdout.contains("### WireGuard handshake flood"), "no flood table:\n{stdout}");
    for kind in ["turbotun-wg-flood1", "turbotun-wg-flood64"] {
        assert!(stdout.contains(&format!("| {kind} | tcp | ")), "no {kind} row in the flood table:\n{stdout}");
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "3 kinds × 1 traffic kind × 1 repetition");
    let unflooded = runs.iter().find(|r| r["mode"] == "turbotun-wg").unwrap();
    assert!(unflooded["error"].is_null() && unflooded.get("flood").is_none(), "{unflooded}");
    // Each flooded run measured: traffic crossed while the flood ran, which B answered with cookies or dropped
    // under load, each drop by its reason. Nothing is timed here.
    for r in runs.iter().filter(|r| r["mode"] != "turbotun-wg") {
        assert!(r["error"].is_null(), "a flooded run that measured nothing: {r}");
        assert!(number(&r["flood"]["sent"]) > 0.0, "{r}");
        let drops = &r["endpoints"][1]["counters"]["drops_by_reason"];
        assert!(drops.is_object(), "{r}");
    }
    let rows = v["flood_rows"].as_array().unwrap();
    let shape: Vec<(&str, u64, &str)> = rows
        .iter()
        .map(|r| (r["kind"].as_str().unwrap(), r["sources"].as_u64().unwrap(), r["unflooded"].as_str().unwrap()))
        .collect();
    assert_eq!(shape, [("turbotun-wg-flood1", 1, "turbotun-wg"), ("turbotun-wg-flood64", 64, "turbotun-wg")]);
    for r in rows {
        assert!(number(&r["unflooded_gbps"]["median"]) > 0.0, "{r}");
    }
}

/// `turbotun bench --wg-storm` with a small storm: 150 peers whose keys only the bench's generator holds complete
/// every handshake with `turbotun wg` and with wireguard-go (which checks the generator's Noise, written apart from
/// turbotun-wg's), in each of the three storms; the flow was sampled; the table has both rows; nothing is left
/// behind. Nothing is timed.
#[test]
fn bench_wg_storm_every_handshake_completes() {
    if !runnable("bench_wg_storm_every_handshake_completes") {
        return;
    }
    let _one = ONE_BENCH.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("storm.json");
    let key_dirs_before = common::entries_with_prefix(&std::env::temp_dir().to_string_lossy(), "turbotun-bench-wg-");
    become_subreaper();
    let mut bench = Command::new(env!("CARGO_BIN_EXE_turbotun"));
    bench.args(["bench", "--wg-storm", "--wg-peers", "150", "--reps", "1", "--json"]).arg(&json);
    let common::Finished { status, pid, stdout, stderr } = common::run_within(&mut bench, Duration::from_secs(300));
    if let Some(logs) = stderr.split("logs kept in ").nth(1) {
        let _ = std::fs::remove_dir_all(logs.trim());
    }
    assert!(status.success(), "bench failed ({status}):\n{stderr}\n{stdout}");
    nothing_left_behind(pid, &key_dirs_before);
    for endpoint in ["turbotun-wg", "wireguard-go"] {
        assert!(stdout.contains(&format!("| {endpoint} | 150 | 150 | ")), "no complete {endpoint} row:\n{stdout}");
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    for r in runs {
        for storm in ["storm", "known", "storm_with_flow"] {
            let s = &r[storm];
            assert_eq!((number(&s["completed"]), number(&s["invalid"])), (150.0, 0.0), "{storm}: {r}");
            assert!(number(&s["initiations"]) >= 150.0, "{storm}: {r}");
        }
        assert!(number(&r["handshakes_per_cpu_s"]) > 0.0 && number(&r["x25519_per_s"]) > 0.0, "{r}");
        assert!(!r["flow_before_gbps"].as_array().unwrap().is_empty(), "the flow ran before the storm: {r}");
    }
}
