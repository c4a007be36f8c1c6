//! End-to-end smoke test of `turbotun bench`: builds the namespaces, runs iperf3 over the kernel baselines,
//! writes the table, the JSON and the chart, and leaves no namespace behind. Figures are not asserted.
//! Needs root (and iperf3, iproute2): skipped otherwise, except under CI=true where it fails.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// `true` when the test should run; panics under CI without root.
fn privileged() -> bool {
    if is_root() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("bench smoke test needs root (CI=true)");
    }
    println!("skipped: needs root");
    false
}

#[test]
fn bench_quick_baselines() {
    if !privileged() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("turbotun-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("bench.json");
    let chart = dir.join("bench.svg");
    let mut child = Command::new(env!("CARGO_BIN_EXE_turbotun"))
        .args(["bench", "--quick", "--duration", "1", "--modes", "veth,loopback", "--traffic", "tcp,udp64", "--json"])
        .arg(&json)
        .arg("--chart")
        .arg(&chart)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run turbotun bench");
    let pid = child.id();
    let out_reader = {
        let mut out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut out, &mut s).unwrap();
            s
        })
    };
    let err_reader = {
        let mut err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut err, &mut s).unwrap();
            s
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("turbotun bench did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = out_reader.join().unwrap();
    let stderr = err_reader.join().unwrap();
    assert!(status.success(), "bench failed ({status}):\n{stderr}\n{stdout}");

    // The table.
    assert!(stdout.contains("| mode |"), "no table:\n{stdout}");
    assert!(stdout.contains("| veth |") && stdout.contains("| loopback |"), "{stdout}");
    assert!(stdout.contains("### tcp") && stdout.contains("### udp64"), "{stdout}");

    // The JSON: every run succeeded and traffic flowed.
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{runs:?}");
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
    assert_eq!(v["summary"].as_array().unwrap().len(), 4);

    // The chart.
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.contains("<svg") && svg.contains("veth"), "chart is not an SVG with labels");

    // No namespace left behind.
    let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    let prefix = format!("tt{pid}r");
    assert!(!list.lines().any(|l| l.starts_with(&prefix)), "namespaces left behind:\n{list}");
    let _ = std::fs::remove_dir_all(&dir);
}
