//! A soak: `turbotun fwd` under steady TCP and UDP traffic for `TURBOTUN_SOAK_SECS` seconds (30 by default, as
//! `make test` runs it), sampled every second by its own `--stats-interval`. After a warm-up, resident memory
//! stays within 1 MiB and the open fds and threads do not change: nothing leaks per packet or per batch.
//!
//! The long run: `TURBOTUN_SOAK_SECS=600 cargo test --release -p turbotun-cli --test soak -- --nocapture`.

mod common;

use std::io::BufRead;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn soak_keeps_memory_and_fds_flat() {
    if !privileged("soak_keeps_memory_and_fds_flat") {
        return;
    }
    let secs: u64 = std::env::var("TURBOTUN_SOAK_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let mut topo = Topology::start("offload", false, &["--stats-interval", "1"]);
    let stdout = topo.stdout.take().unwrap();
    let lines = std::thread::spawn(move || stdout.lines().map_while(Result::ok).collect::<Vec<String>>());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut rounds = 0u64;
    while Instant::now() < deadline {
        tcp_stream_intact(&topo, B4, 4 << 20);
        udp_datagrams_intact(&topo, A6, B6, true, true);
        rounds += 1;
    }
    let pid = topo.pid();
    let mut child = topo.child.take().unwrap();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    assert!(child.wait().unwrap().success());
    let lines = lines.join().unwrap();
    let samples: Vec<serde_json::Value> =
        lines.iter().filter(|l| l.contains("\"usage\"")).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(samples.len() as u64 + 2 >= secs, "a sample a second: {} in {secs} s", samples.len());
    // The first seconds fill the buffers once (each touched page becomes resident); after that, nothing grows.
    let settled = &samples[samples.len().min(5)..];
    let usage = |s: &serde_json::Value, k: &str| s["usage"][k].as_u64().unwrap();
    let (min_rss, max_rss) = settled.iter().fold((u64::MAX, 0), |(lo, hi), s| {
        let rss = usage(s, "rss_kb");
        (lo.min(rss), hi.max(rss))
    });
    let fds: Vec<u64> = settled.iter().map(|s| usage(s, "open_fds")).collect();
    let threads: Vec<u64> = settled.iter().map(|s| usage(s, "threads")).collect();
    let last = samples.last().unwrap();
    println!(
        "soak {secs} s, {rounds} rounds, {} packets: RSS {min_rss}..{max_rss} KiB, fds {:?}, threads {:?}",
        last["packets"],
        fds.first(),
        threads.first()
    );
    assert!(max_rss - min_rss <= 1024, "RSS moved {} KiB after warm-up ({min_rss}..{max_rss})", max_rss - min_rss);
    assert!(fds.windows(2).all(|w| w[0] == w[1]), "open fds changed: {fds:?}");
    assert!(threads.windows(2).all(|w| w[0] == w[1]), "threads changed: {threads:?}");
    let counters: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(counters["errors"], 0, "{counters}");
    assert!(counters["packets"].as_u64().unwrap() > rounds * 2000, "{counters}");
}
