//! End-to-end smoke test of `turbotun bench`: builds the namespaces, runs iperf3 over the kernel baselines and
//! turbotun's forwarder, the loss bench (`--loss`) and the echo bench (`--echo`), writes the tables, the JSON
//! and the charts, and leaves no namespace, device or process behind. Figures are not asserted. Needs root (and
//! iperf3): skipped otherwise, except under CI=true where it fails.

mod common;

use std::process::Command;
use std::time::Duration;

/// What one `turbotun bench` invocation left behind.
struct BenchRun {
    stdout: String,
    json: serde_json::Value,
    chart: String,
}

/// Run `turbotun bench --quick --duration 1 ARGS --json F --chart F.svg`, assert it succeeded, produced the
/// table, the JSON and the chart, and left no named namespace or root-namespace device with its prefix.
fn run_bench(name: &str, args: &[&str]) -> BenchRun {
    let dir = std::env::temp_dir().join(format!("turbotun-bench-smoke-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("bench.json");
    let chart = dir.join("bench.svg");
    let mut bench = Command::new(env!("CARGO_BIN_EXE_turbotun"));
    bench.args(["bench", "--quick", "--duration", "1"]).args(args).arg("--json").arg(&json).arg("--chart").arg(&chart);
    let common::Finished { status, pid, stdout, stderr } = common::run_within(&mut bench, Duration::from_secs(180));
    assert!(status.success(), "bench failed ({status}):\n{stderr}\n{stdout}");
    assert!(
        stdout.contains("| mode |") || stdout.contains("| offered kpps |") || stdout.contains("| echo |"),
        "no table:\n{stdout}"
    );

    // Nothing left behind. The bench's namespaces are private (no name under /run/netns) and go with their
    // last fd, and its devices live in them; neither may show up here.
    let prefix = format!("tt{pid}r");
    let named = common::entries_with_prefix("/run/netns", &prefix);
    assert!(named.is_empty(), "named namespaces left behind: {named:?}");
    let devices = common::entries_with_prefix("/sys/class/net", &prefix);
    assert!(devices.is_empty(), "devices left in the root namespace: {devices:?}");
    let left = common::processes_with(&prefix);
    assert!(left.is_empty(), "processes of the bench still running: {left:?}");

    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let chart = std::fs::read_to_string(&chart).unwrap();
    assert!(chart.contains("<svg"), "chart is not an SVG");
    let _ = std::fs::remove_dir_all(&dir);
    BenchRun { stdout, json, chart }
}

/// Every run succeeded and traffic flowed.
fn assert_traffic(v: &serde_json::Value, expected_runs: usize) {
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), expected_runs, "{runs:?}");
    for r in runs {
        assert!(r["error"].is_null(), "run failed: {r}");
        let gbps = r["iperf"]["gbps"].as_f64().unwrap();
        assert!(gbps > 0.0, "no traffic: {r}");
        if r["traffic"] == "udp64" {
            assert!(r["iperf"]["udp_received"].as_u64().unwrap() > 0, "{r}");
        } else {
            assert_eq!(r["iperf"]["sender_cc"], "cubic", "{r}");
        }
    }
    assert_eq!(v["summary"].as_array().unwrap().len(), expected_runs);
}

#[test]
fn bench_quick_baselines() {
    if !common::privileged("bench_quick_baselines") {
        return;
    }
    let r = run_bench("baselines", &["--modes", "veth,loopback", "--traffic", "tcp,udp64"]);
    assert!(r.stdout.contains("| veth |") && r.stdout.contains("| loopback |"), "{}", r.stdout);
    assert!(r.stdout.contains("### tcp") && r.stdout.contains("### udp64"), "{}", r.stdout);
    assert!(r.chart.contains("veth"), "chart has no labels");
    assert_traffic(&r.json, 4);
}

#[test]
fn bench_quick_turbotun_forwarder() {
    if !common::privileged("bench_quick_turbotun_forwarder") {
        return;
    }
    let r = run_bench("fwd", &["--modes", "turbotun-offload,turbotun-plain", "--traffic", "tcp,udp64"]);
    assert!(r.stdout.contains("| turbotun-offload |"), "{}", r.stdout);
    assert_traffic(&r.json, 4);
    for run in r.json["runs"].as_array().unwrap() {
        // The forwarder measured and reported: CPU over the window, peak RSS, its counters line.
        assert!(run["fwd_cpu_percent"].as_f64().unwrap() > 0.0, "{run}");
        assert!(run["fwd_peak_rss_kb"].as_u64().unwrap() > 0, "{run}");
        assert!(run["fwd_counters"]["packets"].as_u64().unwrap() > 0, "{run}");
        assert!(run["dev_tx_dropped"].is_u64(), "{run}");
    }
}

/// The peers' forwarders (tun-rs's and wireguard-go's tun package, built by `make peers`) run as a bench row
/// each, so that the ×tun-rs figures cannot break unnoticed.
#[test]
fn bench_quick_peer_forwarders() {
    if !common::privileged("bench_quick_peer_forwarders") {
        return;
    }
    let bin = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/peers/bin");
    let missing: Vec<&str> = ["tunrs-fwd", "wggo-fwd"].into_iter().filter(|b| !bin.join(b).is_file()).collect();
    if !missing.is_empty() {
        common::cannot_run("bench_quick_peer_forwarders", &format!("{missing:?} not built: `make peers` builds them"));
        return;
    }
    let r = run_bench("peers", &["--modes", "tunrs-offload,wggo-offload", "--traffic", "tcp,udp64"]);
    assert!(r.stdout.contains("| tunrs-offload |") && r.stdout.contains("| wggo-offload |"), "{}", r.stdout);
    assert_traffic(&r.json, 4);
}

/// The ceiling row and offload through io_uring run like any forwarder; every TCP row gets its ratio to the
/// ceiling, and the estimated cycles table has a row per forwarder with the clock and why it is an estimate.
#[test]
fn bench_quick_ceiling_uring_offload_and_cycles() {
    if !common::privileged("bench_quick_ceiling_uring_offload_and_cycles") {
        return;
    }
    let r = run_bench("ceiling", &["--modes", "ceiling,turbotun-uring-offload", "--traffic", "tcp"]);
    assert_traffic(&r.json, 2);
    assert!(r.stdout.contains("| ceiling | ") && r.stdout.contains("| 1.00× |"), "{}", r.stdout);
    assert!(r.stdout.contains("Cycles per packet and per segment (estimate)"), "{}", r.stdout);
    let mhz = r.json["cycles"]["mhz"].as_f64().unwrap();
    assert!(mhz > 0.0, "{}", r.json["cycles"]);
    let summary = r.json["summary"].as_array().unwrap();
    let per_segment = |s: &serde_json::Value| {
        s["user_cycles_per_segment"]["median"].as_f64().unwrap()
            + s["sys_cycles_per_segment"]["median"].as_f64().unwrap()
    };
    let ceiling = summary.iter().find(|s| s["mode"] == "ceiling").unwrap();
    for s in summary {
        // One repetition: each estimate is that run's CPU seconds × the clock over its count, and the ratios are
        // the rows' own figures against the ceiling's (Gbps for `ratio_ceiling`, cycles for the cycles table).
        let run = r.json["runs"].as_array().unwrap().iter().find(|run| run["mode"] == s["mode"]).unwrap();
        let ip = &run["iperf"];
        let segments = ip["gbps"].as_f64().unwrap() * 1e9 / 8.0 * ip["seconds"].as_f64().unwrap() / 1448.0;
        let packets = run["fwd_counters"]["packets"].as_u64().unwrap() as f64;
        for (key, cpu, count) in [
            ("user_cycles_per_segment", "fwd_user_seconds", segments),
            ("sys_cycles_per_segment", "fwd_sys_seconds", segments),
            ("user_cycles_per_packet", "fwd_user_seconds", packets),
            ("sys_cycles_per_packet", "fwd_sys_seconds", packets),
        ] {
            let want = run[cpu].as_f64().unwrap() * mhz * 1e6 / count;
            let got = s[key]["median"].as_f64().unwrap();
            assert!((got - want).abs() <= 1e-6 * want.max(1.0), "{key}: {got} against {want}: {s}\n{run}");
        }
        let gbps = |s: &serde_json::Value| s["gbps"]["median"].as_f64().unwrap();
        assert!((s["ratio_ceiling"].as_f64().unwrap() - gbps(s) / gbps(ceiling)).abs() < 1e-9, "{s}");
        let cycles_ratio = s["cycles_per_segment_ratio_ceiling"].as_f64().unwrap();
        assert!((cycles_ratio - per_segment(s) / per_segment(ceiling)).abs() < 1e-9, "{s}");
    }
    assert!(r.stdout.contains("| cyc/seg ×ceiling |"), "{}", r.stdout);
    let uring = r.json["runs"].as_array().unwrap().iter().find(|r| r["mode"] == "turbotun-uring-offload").unwrap();
    assert_eq!(uring["fwd_counters"]["io"], "uring", "{uring}");
    assert!(uring["fwd_counters"]["zero_copy_splits"].as_u64().unwrap() > 0, "{uring}");
}

/// The virtual-networking family: veth on a bridge and turbotun between two TAP devices on bridges carry TCP
/// and UDP over IPv6, the forwarder counts packets, and nothing (namespace, bridge, veth, TAP) is left behind.
#[test]
fn bench_quick_virt_bridged_modes() {
    if !common::privileged("bench_quick_virt_bridged_modes") {
        return;
    }
    let r = run_bench("virt", &["--modes", "veth-bridge,turbotun-tap-bridge", "--traffic", "tcp,udp64", "--ipv6"]);
    assert!(r.stdout.contains("| veth-bridge |") && r.stdout.contains("| turbotun-tap-bridge |"), "{}", r.stdout);
    assert_traffic(&r.json, 4);
    let runs = r.json["runs"].as_array().unwrap();
    let tap_runs: Vec<_> = runs.iter().filter(|run| run["mode"] == "turbotun-tap-bridge").collect();
    assert_eq!(tap_runs.len(), 2, "{runs:?}");
    for run in tap_runs {
        assert!(run["fwd_counters"]["packets"].as_u64().unwrap() > 0, "{run}");
    }
}

#[test]
fn bench_loss_quick_one_mode() {
    if !common::privileged("bench_loss_quick_one_mode") {
        return;
    }
    let r =
        run_bench("loss", &["--loss", "--modes", "turbotun-offload", "--rates", "20,40", "--txqueuelen", "500,2000"]);
    assert!(r.stdout.contains("### turbotun-offload, txqueuelen 500"), "{}", r.stdout);
    assert!(r.stdout.contains("### turbotun-offload, txqueuelen 2000"), "{}", r.stdout);
    assert!(r.stdout.contains("No-drop rate"), "{}", r.stdout);
    let rows = r.json["rows"].as_array().unwrap();
    let table: Vec<_> = rows.iter().filter(|r| r["phase"] == "table").collect();
    assert_eq!(table.len(), 4, "two rates at two queue lengths: {rows:?}");
    for row in &table {
        assert!(row["error"].is_null(), "trial failed: {row}");
        assert!(row["transmitted"].as_u64().unwrap() > 0, "{row}");
        assert!(row["received"].as_u64().unwrap() > 0, "{row}");
        for key in ["lost", "dev_tx_dropped", "fwd_drops", "socket_drops"] {
            assert!(row[key].is_u64(), "{key} missing: {row}");
        }
        assert!(row["gen_pps"].as_f64().unwrap() > 0.0 && row["sink_pps"].as_f64().unwrap() > 0.0, "{row}");
    }
    let no_drop = r.json["no_drop"].as_array().unwrap();
    assert_eq!(no_drop.len(), 2, "{no_drop:?}");
    for n in no_drop {
        assert!(n["trials"].as_u64().unwrap() <= r.json["max_search_trials"].as_u64().unwrap(), "{n}");
        // The no-drop rate is what the generator sent in the passing trial at the offered rate the search found.
        if let Some(offered) = n["no_drop_pps"].as_u64() {
            let trial = rows
                .iter()
                .rev()
                .find(|r| r["txqueuelen"] == n["txqueuelen"] && r["offered_pps"] == offered)
                .unwrap_or_else(|| panic!("no trial at {offered}: {n}"));
            assert_eq!(n["no_drop_sent_pps"], trial["gen_pps"], "{n}\n{trial}");
        }
    }
    assert!(r.chart.contains("turbotun-offload"), "chart has no line label");
}

#[test]
fn bench_echo_quick_offload() {
    if !common::privileged("bench_echo_quick_offload") {
        return;
    }
    let r = run_bench("echo", &["--echo", "--modes", "naive,offload"]);
    let rows = r.json["rows"].as_array().unwrap();
    let cases: Vec<String> =
        rows.iter().map(|r| format!("{} {}", r["echo"].as_str().unwrap(), r["traffic"].as_str().unwrap())).collect();
    assert_eq!(
        cases,
        [
            "naive udp64",
            "naive udp1400",
            "echo-offload udp64",
            "echo-offload udp1400",
            "echo-offload gso64",
            "echo-offload gso1400"
        ],
        "{rows:?}"
    );
    for row in rows {
        assert_eq!(row["failed"], 0, "{row}");
        assert!(row["replies_kpps"]["median"].as_f64().unwrap() > 0.0, "no answers: {row}");
    }
    for run in r.json["runs"].as_array().unwrap() {
        // The echo answered and said so in its counters line.
        assert!(
            run["fwd_counters"]["answered"].as_u64().unwrap_or(0) > 0
                || run["fwd_counters"]["answered"]["udp"].as_u64().unwrap_or(0) > 0,
            "{run}"
        );
    }
    assert!(r.stdout.contains("| naive | udp64 |"), "{}", r.stdout);
    // The goal is judged at matched load (the same traffic offered to both), the trains reported apart.
    let goals = r.json["goals"].as_array().unwrap();
    let goal_traffic: Vec<&str> = goals.iter().map(|g| g["traffic"].as_str().unwrap()).collect();
    assert_eq!(goal_traffic, ["udp64", "udp1400"], "{goals:?}");
    let trains: Vec<&str> =
        r.json["trains"].as_array().unwrap().iter().map(|t| t["offload_traffic"].as_str().unwrap()).collect();
    assert_eq!(trains, ["gso64", "gso1400"], "{}", r.json["trains"]);
    for g in goals {
        let k = |key: &str| g[key].as_f64().unwrap();
        // Judged on the shares answered (the generator may reach another rate for each echo), the replies'
        // ratio beside it.
        assert!((k("ratio") - k("offload_answered_percent") / k("naive_answered_percent")).abs() < 1e-9, "{g}");
        assert!((k("replies_ratio") - k("offload_kpps") / k("naive_kpps")).abs() < 1e-9, "{g}");
        assert!(k("naive_offered_kpps") > 0.0 && k("offload_offered_kpps") > 0.0, "{g}");
    }
}
