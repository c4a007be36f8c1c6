//! Operating turbotun as the tools it stands beside are operated, each check running the command as a person
//! would: the log after daemonizing (LOG_LEVEL, no colour in a file, no key), the counters socket read while
//! traffic flows (readable, JSON, Prometheus text parsed), the lines per interval and the closing summary, drops
//! that `ip -s link` cannot see, the manual pages rendered by `man -l`, completions, `make install`, errors that
//! name the fix, the consistent flags and what `info` says. Each test works in namespaces of its own with names
//! of its own, and leaves no device, process or socket behind.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{new_netns, ns_path, privileged, start_ready, tcp_between_while, Topology};
use turbotun::netlink::Netlink;
use turbotun::netns::with_netns;

const TURBOTUN: &str = env!("CARGO_BIN_EXE_turbotun");
const TURBOTUN_WG: &str = env!("CARGO_BIN_EXE_turbotun-wg");

/// A name unique to this process and call (≤ 15 bytes): the sockets' paths are not per namespace.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}{}x{}", std::process::id() % 100_000, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The counters socket of the engine `name` running in `ns` (its path names the namespace).
fn stats_socket(ns: &std::os::fd::OwnedFd, name: &str) -> PathBuf {
    with_netns(&ns_path(ns), || turbotun::stats_socket::socket_path(name)).unwrap()
}

/// How a private namespace is named in counters (`net-INODE`).
fn netns_name(ns: &std::os::fd::OwnedFd) -> String {
    use std::os::unix::fs::MetadataExt;
    format!("net-{}", std::fs::metadata(ns_path(ns)).unwrap().ino())
}

fn uapi_socket(name: &str) -> PathBuf {
    PathBuf::from(format!("/var/run/wireguard/{name}.sock"))
}

use common::{eventually as wait_for, output_text as text, turbotun_in};

/// One `set=1` request on a configuration socket; the `errno=` answer.
fn uapi_set(name: &str, lines: &str) -> String {
    let mut stream = UnixStream::connect(uapi_socket(name)).unwrap();
    stream.write_all(format!("set=1\n{lines}\n\n").as_bytes()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = [0u8; 64];
    let n = stream.read(&mut answer).unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// A WireGuard endpoint started in the background, its log in a file; on drop its device is deleted (which
/// ends it) and its sockets must be gone.
struct Daemon {
    ns: std::os::fd::OwnedFd,
    name: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(log_level: Option<&str>) -> Daemon {
        Daemon::start_with(log_level, &[])
    }

    /// [`Daemon::start`] with `args` after `wg`.
    fn start_with(log_level: Option<&str>, args: &[&str]) -> Daemon {
        let ns = new_netns();
        let name = unique("tw");
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("wg.log");
        let file = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(TURBOTUN);
        command.arg("wg").args(args).arg(&name).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(file);
        command.env_remove("LOG_LEVEL").env_remove("RUST_LOG");
        if let Some(level) = log_level {
            command.env("LOG_LEVEL", level);
        }
        let out = with_netns(&ns_path(&ns), || command.output()).unwrap().unwrap();
        assert!(out.status.success(), "{out:?}: {}", std::fs::read_to_string(&log).unwrap_or_default());
        Daemon { ns, name, log, _dir: dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// `wg-quick down` does this: the endpoint notices, ends and removes its sockets. Returns once its process is
    /// gone too, so that its log is complete (the closing summary is written after the sockets go).
    fn delete(&self) {
        if let Ok(mut nl) = Netlink::in_netns(&ns_path(&self.ns)) {
            let _ = nl.delete_link(&self.name);
        }
        wait_for("the endpoint to remove its sockets", || {
            !uapi_socket(&self.name).exists() && !stats_socket(&self.ns, &self.name).exists()
        });
        wait_for("the endpoint's process to end", || common::processes_with(&self.name).is_empty());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(mut nl) = Netlink::in_netns(&ns_path(&self.ns)) {
            let _ = nl.delete_link(&self.name);
        }
    }
}

/// wireguard-go's LOG_LEVEL, after daemonizing: a refused configuration is a warning, shown by default and
/// with verbose, hidden by error and silent; verbose adds the informational lines; a log in a file has no
/// colour codes; no key, in hex or base64, is ever in it; the closing summary is in it.
#[test]
fn wg_logs_after_daemonizing_as_log_level_says() {
    if !privileged("wg_logs_after_daemonizing_as_log_level_says") {
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let genkey = || String::from_utf8(Command::new("wg").arg("genkey").output().unwrap().stdout).unwrap();
    let (private, psk) = (genkey(), genkey());
    std::fs::write(keys.path().join("private"), &private).unwrap();
    std::fs::write(keys.path().join("psk"), &psk).unwrap();
    let hex = |b64: &str| {
        let out = Command::new("bash")
            .args(["-c", &format!("echo {} | base64 -d | od -An -tx1 -v | tr -d ' \\n'", b64.trim())])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default()
    };
    for (level, refused_shown, info_shown) in [
        (None, true, false),
        (Some("verbose"), true, true),
        (Some("error"), false, false),
        (Some("silent"), false, false),
    ] {
        let daemon = Daemon::start(level);
        let peer =
            String::from_utf8(Command::new("bash").args(["-c", "wg genkey | wg pubkey"]).output().unwrap().stdout)
                .unwrap();
        let set = with_netns(&ns_path(&daemon.ns), || {
            Command::new("wg")
                .args(["set", &daemon.name, "private-key"])
                .arg(keys.path().join("private"))
                .args(["peer", peer.trim(), "preshared-key"])
                .arg(keys.path().join("psk"))
                .args(["allowed-ips", "10.79.0.2/32"])
                .output()
        })
        .unwrap()
        .unwrap();
        assert!(set.status.success(), "{set:?}");
        // The answer comes after the log line is written.
        assert_eq!(uapi_set(&daemon.name, "listen_port=notaport"), "errno=-22\n\n");
        let log = daemon.log();
        assert_eq!(log.contains("configuration refused"), refused_shown, "{level:?}: {log}");
        assert_eq!(log.contains("up, UDP port"), info_shown, "{level:?}: {log}");
        // The configuration change, as wireguard-go's verbose log says it: the interface, the peer's key cut to
        // its ends (`peer(ABCD…WXYZ)`), what changed.
        let created = format!("{}: peer({}…{}) - Created", daemon.name, &peer.trim()[..4], &peer.trim()[39..43]);
        assert_eq!(log.contains(&created), info_shown, "{level:?}: {created:?} in {log}");
        daemon.delete();
        let log = daemon.log();
        assert!(!log.contains('\x1b'), "{level:?}: colour codes in a file: {log:?}");
        for key in [private.trim().to_string(), psk.trim().to_string(), hex(&private), hex(&psk)] {
            assert!(key.len() >= 44 && !log.contains(&key), "{level:?}: a key in the log: {log}");
        }
        if level != Some("silent") {
            assert!(log.contains("packets,") && log.contains(" in "), "{level:?}: the summary is in the log: {log}");
            let why = format!("{}: the device was deleted", daemon.name);
            assert!(log.contains(&why), "{level:?}: why it stopped is in the log: {log}");
        } else {
            assert!(!log.contains("packets,"), "silent: {log}");
        }
    }
}

/// The lines of Prometheus's text format, checked as a scraper reads them: every sample's metric declared by a
/// `# TYPE` before it, names and labels of the allowed characters, label values quoted, values numbers, counters
/// ending in `_total`, no series twice. Returns the samples by `name{labels}`.
fn parse_prometheus(text: &str) -> HashMap<String, f64> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = HashMap::new();
    let name_ok = |n: &str| {
        !n.is_empty()
            && !n.starts_with(|c: char| c.is_ascii_digit())
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(name_ok(name) && ["counter", "gauge"].contains(&kind), "{line}");
            assert!(types.insert(name.to_string(), kind.to_string()).is_none(), "declared twice: {line}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "a counter's name ends in _total: {line}");
            }
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("not a number: {line}"));
        let name = series.split('{').next().unwrap();
        assert!(types.contains_key(name), "no # TYPE before {line}");
        if let Some(labels) = series.strip_prefix(name).and_then(|l| l.strip_prefix('{')) {
            let labels = labels.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"));
            for pair in labels.split("\",") {
                let (label, quoted) = pair.split_once('=').unwrap_or_else(|| panic!("bad label {pair:?}: {line}"));
                assert!(name_ok(label) && quoted.starts_with('"'), "bad label {pair:?}: {line}");
            }
        }
        assert!(samples.insert(series.to_string(), value).is_none(), "series twice: {line}");
    }
    samples
}

/// A forwarder's counters read from its socket while a TCP stream crosses it: they grow between two reads,
/// the readable form, JSON and the Prometheus text all say so; the socket is gone once it stops.
#[test]
fn fwd_counters_are_served_while_traffic_flows() {
    if !privileged("fwd_counters_are_served_while_traffic_flows") {
        return;
    }
    let topo = Topology::start("offload", false, &[]);
    let name = topo.dev_a.clone();
    let socket = stats_socket(&topo.ns_fwd, &name);
    assert!(socket.exists(), "{} serves its counters", name);
    let packets = || {
        let out = Command::new(TURBOTUN).args(["stats", &name, "--json"]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["kind"], "forwarder");
        assert!(v["drops_by_reason"].get("no_peer").is_none(), "no tunnel reasons for a forwarder: {v}");
        v["packets"].as_u64().unwrap()
    };
    let mut seen = Vec::new();
    tcp_between_while(&topo.ns_a, &topo.ns_b, common::B4, 5101, 256 << 20, || {
        wait_for("packets counted while the stream runs", || {
            seen.push(packets());
            seen.len() >= 2 && seen[seen.len() - 1] > seen[0]
        });
    });
    let readable = Command::new(TURBOTUN).args(["stats", &name]).output().unwrap();
    let readable = text(&readable);
    assert!(readable.contains(&format!("{name}: forwarder {name} <-> {}", topo.dev_b)), "{readable}");
    assert!(readable.contains(" packets, ") && readable.contains("bit/s") && readable.contains("a_to_b"), "{readable}");
    let out = Command::new(TURBOTUN).args(["stats", "--prometheus"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let samples = parse_prometheus(&String::from_utf8(out.stdout).unwrap());
    let netns = netns_name(&topo.ns_fwd);
    let labels = format!("name=\"{name}\",netns=\"{netns}\",kind=\"forwarder\",direction=\"a_to_b\"");
    assert!(samples[&format!("turbotun_bytes_total{{{labels}}}")] >= (1 << 20) as f64, "{samples:?}");
    // Listed whether or not one was counted (a packet sent while a device was still down at set-up may be).
    assert!(samples.contains_key(&format!("turbotun_dropped_packets_total{{{labels},reason=\"device_down\"}}")));
    assert!(!samples.keys().any(|k| k.contains(&name) && k.contains("no_peer")), "{samples:?}");
    let counters = topo.stop();
    assert!(counters["seconds"].as_f64().unwrap() > 0.0, "{counters}");
    assert!(!socket.exists(), "the socket is removed at the end");
    let gone = Command::new(TURBOTUN).args(["stats", &name]).output().unwrap();
    assert!(!gone.status.success() && text(&gone).contains("no counters socket"), "{}", text(&gone));
}

/// `tunnel --stats-interval`: a readable line per interval with rates, then the closing summary; `--json`:
/// objects with `seconds` and only a plain tunnel's reasons. A socket left by a killed process does not block
/// the start, and host names are resolved.
#[test]
fn tunnel_prints_rates_per_interval_and_a_summary() {
    if !privileged("tunnel_prints_rates_per_interval_and_a_summary") {
        return;
    }
    let ns = new_netns();
    Netlink::in_netns(&ns_path(&ns)).unwrap().set_up("lo", true).unwrap();
    let name = unique("tp");
    // A socket left behind by a process that was killed: bound and never removed.
    drop(UnixListener::bind(stats_socket(&ns, &name)).unwrap());
    let args = ["tunnel", &name, "--local", "localhost:0", "--remote", "localhost:9", "--stats-interval", "0.2"];
    let running = start_ready(&ns, Command::new(TURBOTUN).args(args).stderr(Stdio::piped()));
    wait_for("the stale socket replaced", || UnixStream::connect(stats_socket(&ns, &name)).is_ok());
    std::thread::sleep(Duration::from_millis(700));
    let out = running.stop();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 3, "{out}");
    for line in &lines[..lines.len() - 3] {
        assert!(line.contains(" s ") && line.contains("packets/s") && line.contains("bit/s"), "{line:?} in {out}");
    }
    let summary = lines[lines.len() - 3];
    assert!(summary.contains(" packets, ") && summary.contains(" s (") && summary.ends_with("no drops"), "{out}");
    assert!(lines[lines.len() - 2].trim_start().starts_with("to_network"), "{out}");
    assert!(!stats_socket(&ns, &name).exists(), "removed at the end");

    let args =
        ["tunnel", &name, "--local", "127.0.0.1:0", "--remote", "127.0.0.1:9", "--json", "--stats-interval", "0.2"];
    let running = start_ready(&ns, Command::new(TURBOTUN).args(args));
    std::thread::sleep(Duration::from_millis(500));
    let out = running.stop();
    let objects: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(objects.len() >= 2, "{out}");
    assert!(objects[0]["t"].as_f64().is_some() && objects[0]["usage"]["rss_kb"].as_u64().unwrap() > 0, "{out}");
    let last = objects.last().unwrap();
    assert_eq!(last["mode"], "plain");
    assert!(last["seconds"].as_f64().unwrap() > 0.0, "{last}");
    let reasons = last["drops_by_reason"].as_object().unwrap();
    assert!(reasons.contains_key("unauthenticated") && reasons.contains_key("device_down"), "{last}");
    assert!(!reasons.contains_key("no_peer") && !reasons.contains_key("replayed"), "{last}");
}

/// A ping into a WireGuard endpoint with no peer for it: `ip -s link` counts nothing dropped, `turbotun stats`
/// shows every one as `no_peer`, in each of its forms.
#[test]
fn wg_drops_that_ip_link_cannot_see_show_in_stats() {
    if !privileged("wg_drops_that_ip_link_cannot_see_show_in_stats") {
        return;
    }
    let ns = new_netns();
    let name = unique("td");
    let running = {
        let mut command = Command::new(TURBOTUN);
        command.args(["wg", "-f", "--stats-interval", "0.3", &name]).stderr(Stdio::piped());
        let child = with_netns(&ns_path(&ns), || command.stdout(Stdio::piped()).spawn()).unwrap().unwrap();
        common::Running(Some(child))
    };
    wait_for("the configuration socket", || UnixStream::connect(uapi_socket(&name)).is_ok());
    let mut nl = Netlink::in_netns(&ns_path(&ns)).unwrap();
    nl.add_address(&name, "10.78.0.1".parse().unwrap(), 24).unwrap();
    nl.set_up(&name, true).unwrap();
    let ping = with_netns(&ns_path(&ns), || {
        Command::new("ping").args(["-c", "3", "-i", "0.2", "-W", "1", "10.78.0.2"]).output()
    })
    .unwrap()
    .unwrap();
    assert!(!ping.status.success(), "nobody answers: {ping:?}");
    let no_peer = || {
        let v: serde_json::Value =
            serde_json::from_slice(&turbotun_in(&ns, &["stats", &name, "--json"]).stdout).unwrap();
        v["drops_by_reason"]["no_peer"].as_u64().unwrap()
    };
    wait_for("the pings counted as no_peer", || no_peer() >= 3);
    let link = with_netns(&ns_path(&ns), || Command::new("ip").args(["-s", "-j", "link", "show", &name]).output())
        .unwrap()
        .unwrap();
    let link: serde_json::Value = serde_json::from_slice(&link.stdout).unwrap();
    assert_eq!(link[0]["stats64"]["tx"]["dropped"], 0, "the kernel saw no drop: {link}");
    let readable = text(&turbotun_in(&ns, &["stats", &name]));
    assert!(readable.contains("no_peer") && readable.contains("wireguard"), "{readable}");
    let samples = parse_prometheus(&String::from_utf8(turbotun_in(&ns, &["stats", "--prometheus"]).stdout).unwrap());
    let netns = netns_name(&ns);
    let key = format!("turbotun_dropped_packets_total{{name=\"{name}\",netns=\"{netns}\",kind=\"wireguard\",direction=\"to_network\",reason=\"no_peer\"}}");
    assert!(samples[&key] >= 3.0, "{samples:?}");
    let out = running.stop();
    assert!(out.lines().any(|l| l.contains("packets/s")), "interval lines: {out}");
    assert!(out.lines().any(|l| l.contains(" drops: no_peer") || l.contains(" drop: no_peer")), "{out}");
    assert!(!stats_socket(&ns, &name).exists() && !uapi_socket(&name).exists(), "sockets removed");
}

/// A WireGuard endpoint's peers in `turbotun stats`: in the Prometheus text as WireGuard's usual exporter names
/// them (device and public key on every series, the endpoint and the allowed prefixes on the info series), in
/// `--json`, and listed by `--peers` busiest first, as `wg show` lists them.
#[test]
fn wg_peers_show_in_stats_as_the_exporters_name_them() {
    use base64::Engine as _;
    if !privileged("wg_peers_show_in_stats_as_the_exporters_name_them") {
        return;
    }
    let daemon = Daemon::start(None);
    let name = &daemon.name;
    let (busy, idle) = ([0x21u8; 32], [0x42u8; 32]);
    let hex = |key: &[u8; 32]| key.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let b64 = |key: &[u8; 32]| base64::engine::general_purpose::STANDARD.encode(key);
    let set = format!(
        "private_key={}\npublic_key={}\nendpoint=127.0.0.1:9\nallowed_ip=10.79.0.2/32\nallowed_ip=fd79::2/128\n\
         public_key={}\nallowed_ip=10.79.0.3/32",
        hex(&[0x17; 32]),
        hex(&busy),
        hex(&idle)
    );
    assert_eq!(uapi_set(name, &set), "errno=0\n\n");
    let mut nl = Netlink::in_netns(&ns_path(&daemon.ns)).unwrap();
    nl.add_address(name, "10.79.0.1".parse().unwrap(), 24).unwrap();
    nl.set_up(name, true).unwrap();
    // A ping to the busy peer: held for the handshake, whose initiation goes to its endpoint (148 bytes).
    let _ =
        with_netns(&ns_path(&daemon.ns), || Command::new("ping").args(["-c", "1", "-W", "1", "10.79.0.2"]).output());
    let samples = || {
        parse_prometheus(&String::from_utf8(turbotun_in(&daemon.ns, &["stats", name, "--prometheus"]).stdout).unwrap())
    };
    let peer = |key: &[u8; 32]| format!("device=\"{name}\",public_key=\"{}\"", b64(key));
    let sent = |key: &[u8; 32]| samples()[&format!("wireguard_peer_transmit_bytes_total{{{}}}", peer(key))];
    wait_for("the initiation counted", || sent(&busy) >= 148.0);
    let all = samples();
    assert_eq!(sent(&idle), 0.0);
    for (series, value) in [
        (
            format!(
                "wireguard_peer_info{{{},endpoint=\"127.0.0.1:9\",allowed_ips=\"10.79.0.2/32,fd79::2/128\"}}",
                peer(&busy)
            ),
            1.0,
        ),
        (format!("wireguard_peer_info{{{},endpoint=\"\",allowed_ips=\"10.79.0.3/32\"}}", peer(&idle)), 1.0),
        (format!("wireguard_peer_allowed_ips_info{{{},allowed_ips=\"fd79::2/128\"}}", peer(&busy)), 1.0),
        (format!("wireguard_peer_last_handshake_seconds{{{}}}", peer(&busy)), 0.0),
        (format!("wireguard_peer_receive_bytes_total{{{}}}", peer(&busy)), 0.0),
        (format!("turbotun_wireguard_peer_dropped_packets_total{{{}}}", peer(&idle)), 0.0),
    ] {
        assert_eq!(all.get(&series), Some(&value), "{series} in {all:?}");
    }
    let json: serde_json::Value =
        serde_json::from_slice(&turbotun_in(&daemon.ns, &["stats", name, "--json"]).stdout).unwrap();
    assert_eq!(json["peers"][0]["public_key"], b64(&busy), "{json}");
    assert_eq!(json["peers"][1]["allowed_ips"], serde_json::json!(["10.79.0.3/32"]), "{json}");
    let listed = text(&turbotun_in(&daemon.ns, &["stats", name, "--peers"]));
    let rows: Vec<&str> = listed.lines().filter(|l| l.contains('=')).collect();
    assert_eq!(rows.len(), 2, "{listed}");
    assert!(rows[0].starts_with(&b64(&busy)) && rows[0].contains("127.0.0.1:9"), "busiest first: {listed}");
    assert!(rows[1].starts_with(&b64(&idle)) && rows[1].contains("never"), "{listed}");
    daemon.delete();
    // Above --peer-metrics-limit the per-peer counters are left out, and the report says why.
    let limited = Daemon::start_with(None, &["--peer-metrics-limit", "1"]);
    assert_eq!(uapi_set(&limited.name, &set), "errno=0\n\n");
    let json: serde_json::Value =
        serde_json::from_slice(&turbotun_in(&limited.ns, &["stats", &limited.name, "--json"]).stdout).unwrap();
    assert!(json.get("peers").is_none(), "{json}");
    let why = json["peer_metrics"].as_str().unwrap_or_default();
    assert!(why.starts_with("off (2 peers, more than --peer-metrics-limit 1)"), "{json}");
    limited.delete();
}

/// Every command's `--help` ends with EXAMPLES and EXIT STATUS; the manual pages render with `man -l` and say
/// the same; the completions are what each shell loads.
#[test]
fn help_man_pages_and_completions() {
    for command in [
        &["features"][..],
        &["info"],
        &["create"],
        &["set"],
        &["delete"],
        &["fwd"],
        &["echo"],
        &["open"],
        &["load"],
        &["load", "gen"],
        &["load", "sink"],
        &["tunnel"],
        &["wg"],
        &["stats"],
        &["bench"],
        &["completions"],
        &[],
    ] {
        let out = Command::new(TURBOTUN).args(command).arg("--help").output().unwrap();
        let help = text(&out);
        assert!(out.status.success(), "{command:?}: {help}");
        assert!(help.contains("\nEXAMPLES:\n  ") && help.contains("\nEXIT STATUS:\n  0  "), "{command:?}: {help}");
    }
    let wg_help = text(&Command::new(TURBOTUN_WG).arg("--help").output().unwrap());
    assert!(wg_help.contains("EXAMPLES:") && wg_help.contains("LOG_LEVEL"), "{wg_help}");
    assert!(wg_help.contains("WG_QUICK_USERSPACE_IMPLEMENTATION"), "{wg_help}");
    assert!(wg_help.contains("LOGS: on standard error") && wg_help.contains("COUNTERS: served on"), "{wg_help}");

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(TURBOTUN).arg("man").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for (page, says) in [
        ("turbotun.1", "turbotun fwd tta ttb"),
        ("turbotun-fwd.1", "stopped by SIGINT or SIGTERM"),
        ("turbotun-load-gen.1", "--remote"),
        ("turbotun-stats.1", "--prometheus"),
        ("turbotun-wg.1", "WG_QUICK_USERSPACE_IMPLEMENTATION"),
    ] {
        let rendered = man_l(&dir.path().join(page));
        assert!(!rendered.contains("turbotun-help"), "{page} lists a page that does not exist: {rendered}");
        for section in ["NAME", "SYNOPSIS", "EXAMPLES", "EXIT STATUS"] {
            assert!(rendered.contains(&format!("\n{section}\n")), "{page}: no {section}: {rendered}");
        }
        assert!(rendered.contains(says), "{page}: {rendered}");
    }

    // The synopsis gives each option with its value.
    let fwd = man_l(&dir.path().join("turbotun-fwd.1"));
    assert!(fwd.contains("[--queues N]") && fwd.contains("[--user USER[:GROUP]]"), "{fwd}");

    let completions = |shell: &str| {
        let out = Command::new(TURBOTUN).args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let bash = dir.path().join("turbotun.bash");
    std::fs::write(&bash, completions("bash")).unwrap();
    let loaded =
        Command::new("bash").arg("-c").arg(format!("source {} && complete -p turbotun", bash.display())).output();
    let loaded = text(&loaded.unwrap());
    assert!(loaded.contains("-F _turbotun_names turbotun"), "the wrapper that adds device names: {loaded}");
    assert!(completions("zsh").starts_with("#compdef turbotun"));
    let wg = Command::new(TURBOTUN).args(["completions", "bash", "--program", "turbotun-wg"]).output().unwrap();
    let wg = String::from_utf8(wg.stdout).unwrap();
    assert!(wg.contains("turbotun-wg") && wg.contains("--peer-metrics-limit"), "{wg}");
    let fish = completions("fish");
    assert!(fish.contains("complete -c turbotun") && fish.contains("stats"), "{fish}");
    let bad = Command::new(TURBOTUN).args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2), "a usage error: {}", text(&bad));
}

/// `man -l PAGE`, as plain text.
fn man_l(page: &Path) -> String {
    let out = Command::new("man")
        .arg("-l")
        .arg(page)
        .env("MANWIDTH", "200")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .output()
        .expect("man (apt: man-db)");
    assert!(out.status.success(), "man -l {}: {}", page.display(), text(&out));
    // Bold and underline as overstrikes, where the formatter still writes them.
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut plain = String::new();
    for c in raw.chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    plain.replace(['\u{2010}', '\u{2212}'], "-")
}

/// `make install` with PREFIX and DESTDIR: both programs, the pages (which render), the completions; and the
/// wg-quick drop-in.
#[test]
fn make_install_puts_everything_in_place() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin_dir = Path::new(TURBOTUN).parent().unwrap();
    let dest = tempfile::tempdir().unwrap();
    for target in ["install", "install-wg-quick"] {
        let out = Command::new("make")
            .arg("-C")
            .arg(&root)
            .arg(target)
            .arg("PREFIX=/usr")
            .arg(format!("DESTDIR={}", dest.path().display()))
            .arg(format!("BIN_DIR={}", bin_dir.display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "make {target}: {}", text(&out));
    }
    let usr = dest.path().join("usr");
    for file in [
        "bin/turbotun",
        "bin/turbotun-wg",
        "share/man/man1/turbotun.1",
        "share/man/man1/turbotun-fwd.1",
        "share/man/man1/turbotun-wg.1",
        "share/bash-completion/completions/turbotun",
        "share/zsh/site-functions/_turbotun",
        "share/fish/vendor_completions.d/turbotun.fish",
    ] {
        assert!(usr.join(file).metadata().is_ok_and(|m| m.len() > 0), "{file} installed");
    }
    let version = Command::new(usr.join("bin/turbotun-wg")).arg("--version").output().unwrap();
    assert!(text(&version).starts_with("turbotun-wg "), "{}", text(&version));
    assert!(man_l(&usr.join("share/man/man1/turbotun-create.1")).contains("--offloads"));
    let drop_in = std::fs::read_to_string(usr.join("lib/systemd/system/wg-quick@.service.d/turbotun.conf")).unwrap();
    assert!(drop_in.contains("Environment=WG_QUICK_USERSPACE_IMPLEMENTATION=/usr/bin/turbotun-wg"), "{drop_in}");
    let out = Command::new("make")
        .arg("-C")
        .arg(&root)
        .arg("install")
        .arg(format!("DESTDIR={}", dest.path().display()))
        .arg(format!("BIN_DIR={}", dest.path().join("nowhere").display()))
        .output()
        .unwrap();
    assert!(!out.status.success() && text(&out).contains("run make build first"), "{}", text(&out));
}

/// Errors that name the fix: a device that exists (and how to delete it), one held by another process (named),
/// a MAC address for a TUN device, an address without a port, and the background endpoint's error said once.
#[test]
fn errors_name_the_fix() {
    if !privileged("errors_name_the_fix") {
        return;
    }
    let ns = new_netns();
    let (dev, held, other) = (unique("te"), unique("th"), unique("to"));
    let out = turbotun_in(&ns, &["create", &dev, "--owner", "nobody"]);
    assert!(out.status.success(), "{}", text(&out));
    let again = turbotun_in(&ns, &["create", &dev]);
    assert!(!again.status.success());
    let said = text(&again);
    assert!(said.contains(&format!("device {dev} exists already")), "{said}");
    assert!(said.contains(&format!("ip link delete {dev}")), "{said}");

    // A single-queue device held by a forwarder: another open is refused, naming the holder.
    let holder = start_ready(&ns, Command::new(TURBOTUN).args(["fwd", &held, &other, "--stats-socket", "none"]));
    let pid = holder.0.as_ref().unwrap().id();
    let busy = turbotun_in(&ns, &["fwd", &held, &unique("tx"), "--stats-socket", "none"]);
    let said = text(&busy);
    assert!(!busy.status.success(), "{said}");
    assert!(said.contains(&format!("device {held} is busy")), "{said}");
    assert!(said.contains(&format!("pid {pid} (turbotun fwd {held} {other}")), "{said}");
    drop(holder);

    let tun_mac = turbotun_in(&ns, &["create", &unique("tm"), "--mac", "02:00:00:00:00:01"]);
    assert!(text(&tun_mac).contains("--mac needs --tap"), "{}", text(&tun_mac));
    let set_mac = turbotun_in(&ns, &["set", &dev, "--mac", "02:00:00:00:00:01"]);
    assert!(text(&set_mac).contains(&format!("{dev} is a TUN device: --mac applies to TAP devices")));
    for (flag, value) in [("--local", "10.0.0.1"), ("--remote", "fd00::1")] {
        let mut args = vec!["tunnel", "tt0", "--local", "10.0.0.1:5000", "--remote", "10.0.0.2:5000"];
        let at = args.iter().position(|a| *a == flag).unwrap();
        args[at + 1] = value;
        let out = turbotun_in(&ns, &args);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("has no port") && text(&out).contains("e.g. 10.0.0.1:51820"), "{}", text(&out));
    }
    assert!(turbotun_in(&ns, &["delete", &dev]).status.success());

    // turbotun-wg in the background, refused (its device name is taken by a TAP device): said once.
    let taken = unique("tk");
    assert!(turbotun_in(&ns, &["create", &taken, "--tap", "--owner", "nobody"]).status.success());
    let out = with_netns(&ns_path(&ns), || Command::new(TURBOTUN_WG).arg(&taken).stdin(Stdio::null()).output())
        .unwrap()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert_eq!(said.matches("turbotun-wg:").count(), 1, "one prefix: {said}");
    assert!(said.contains(&format!("device {taken} exists with other framing")), "{said}");
    assert!(turbotun_in(&ns, &["delete", &taken]).status.success());
    let links = Netlink::in_netns(&ns_path(&ns)).unwrap().links().unwrap();
    assert_eq!(links.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["lo"], "nothing left behind");
}

/// The same words everywhere: `load gen --remote` and `load sink --local`, as `tunnel` has them (the old
/// `--dest` and `--bind` still work); `create --queues N` (the old `--multi-queue` still works), `--offloads`,
/// `--owner`/`--group` by name as `ip tuntap` takes them; `--group` shown only where it means the device's group.
#[test]
fn flags_are_consistent() {
    if !privileged("flags_are_consistent") {
        return;
    }
    let ns = new_netns();
    Netlink::in_netns(&ns_path(&ns)).unwrap().set_up("lo", true).unwrap();
    let sink = start_ready(
        &ns,
        Command::new("bash")
            .args(["-c", &format!("echo ready; exec {TURBOTUN} load sink --local 127.0.0.1:9911 --duration 3 --json")]),
    );
    std::thread::sleep(Duration::from_millis(300));
    let gen = turbotun_in(&ns, &["load", "gen", "--remote", "127.0.0.1:9911", "--rate", "1000", "--duration", "0.5"]);
    assert!(gen.status.success(), "{}", text(&gen));
    let mut sink = sink;
    let mut child = sink.0.take().unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(child.wait().unwrap().success());
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(report["datagrams"].as_u64().unwrap() > 0, "{report}");

    let nobody = |what: &str| {
        let out = Command::new("id").args([what, "nobody"]).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().parse::<u64>().unwrap()
    };
    let dev = unique("tq");
    let out = turbotun_in(
        &ns,
        &["create", &dev, "--queues", "4", "--offloads", "tcp", "--owner", "nobody", "--group", "nogroup"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("offloads csum,tso4,tso6") && !text(&out).contains("warning"), "{}", text(&out));
    let info: serde_json::Value = serde_json::from_slice(&turbotun_in(&ns, &["info", &dev, "--json"]).stdout).unwrap();
    let flags: HashSet<&str> = info[0]["flags"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
    assert!(flags.contains("multi_queue") && flags.contains("vnet_hdr"), "{info}");
    assert_eq!(info[0]["owner"].as_u64(), Some(nobody("-u")), "{info}");
    assert_eq!(info[0]["group"].as_u64(), Some(nobody("-g")), "{info}");
    assert_eq!(info[0]["offloads"], serde_json::json!(["csum", "tso4", "tso6"]), "{info}");
    assert!(turbotun_in(&ns, &["delete", &dev]).status.success());

    let help = |command: &str| text(&Command::new(TURBOTUN).args([command, "--help"]).output().unwrap());
    assert!(help("create").contains("--group <GROUP>") && help("create").contains("--queues <N>"));
    assert!(!help("create").contains("--multi-queue"), "the old spelling is hidden");
    assert!(!help("fwd").contains("--group") && help("fwd").contains("--user <USER[:GROUP]>"), "{}", help("fwd"));
    let load = text(&Command::new(TURBOTUN).args(["load", "gen", "--help"]).output().unwrap());
    assert!(load.contains("--remote <ADDR:PORT>") && !load.contains("--dest"), "{load}");
    let bad = turbotun_in(&ns, &["create", &unique("tb"), "--owner", "no-such-user-here"]);
    assert!(text(&bad).contains("no user named \"no-such-user-here\""), "{}", text(&bad));
    let bad = turbotun_in(&ns, &["create", &unique("tb"), "--group", "no-such-group-here"]);
    assert!(text(&bad).contains("no group named \"no-such-group-here\""), "{}", text(&bad));
}

/// `info` tells the truth: a single-queue device held by a process has its one queue (the kernel reports the
/// count only for multiqueue devices), its state is said once; `create` without an owner or group warns that
/// any local user may attach.
#[test]
fn info_tells_the_truth() {
    if !privileged("info_tells_the_truth") {
        return;
    }
    let ns = new_netns();
    let dev = unique("ti");
    let out = turbotun_in(&ns, &["create", &dev]);
    assert!(out.status.success(), "{}", text(&out));
    let warning = String::from_utf8_lossy(&out.stderr);
    assert!(warning.contains(&format!("warning: {dev} has no owner or group")), "{warning}");
    assert!(warning.contains("may attach to it") && warning.contains("--owner USER or --group GROUP"), "{warning}");
    let listing = text(&turbotun_in(&ns, &["info", &dev]));
    assert!(listing.contains("queues 0") && listing.contains(" state DOWN carrier"), "{listing}");
    assert!(!listing.contains("(DOWN)"), "{listing}");

    let holder = start_ready(&ns, Command::new(TURBOTUN).args(["fwd", &dev, &unique("tj"), "--stats-socket", "none"]));
    let pid = holder.0.as_ref().unwrap().id();
    let listing = text(&turbotun_in(&ns, &["info", &dev]));
    assert!(listing.contains(&format!("queues 1 (detached 0) (pids {pid}")), "{listing}");
    let info: serde_json::Value = serde_json::from_slice(&turbotun_in(&ns, &["info", &dev, "--json"]).stdout).unwrap();
    assert_eq!(info[0]["queues"], 1, "{info}");
    // Held, the carrier may be turned off (the command refused a device it thought had no queue).
    let out = turbotun_in(&ns, &["set", &dev, "--carrier", "off"]);
    assert!(out.status.success(), "{}", text(&out));
    // Deleting it while held names the holder.
    let out = turbotun_in(&ns, &["delete", &dev]);
    assert!(!out.status.success() && text(&out).contains(&format!("pid {pid}")), "{}", text(&out));
    drop(holder);
    assert!(turbotun_in(&ns, &["delete", &dev]).status.success());
}

/// An engine that dropped its privileges still serves its counters (bound before the drop) and its socket is
/// still removed at the end (by the keeper: the process itself may no longer write to /run/turbotun).
#[test]
fn an_unprivileged_tunnel_serves_and_removes_its_counters_socket() {
    if !privileged("an_unprivileged_tunnel_serves_and_removes_its_counters_socket") {
        return;
    }
    let ns = new_netns();
    Netlink::in_netns(&ns_path(&ns)).unwrap().set_up("lo", true).unwrap();
    let name = unique("tu");
    let args = ["tunnel", &name, "--local", "127.0.0.1:0", "--remote", "127.0.0.1:9", "--user", "nobody"];
    let running = start_ready(&ns, Command::new(TURBOTUN).args(args).stderr(Stdio::piped()));
    let out = turbotun_in(&ns, &["stats", &name, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pid"].as_u64(), Some(u64::from(running.0.as_ref().unwrap().id())), "{report}");
    running.stop();
    wait_for("the keeper to remove the counters socket", || !stats_socket(&ns, &name).exists());
}
