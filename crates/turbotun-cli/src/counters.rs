//! The counters of a running engine as the commands print them, one renderer for all: the closing summary and the
//! line per interval (readable, or JSON with `--json`), `turbotun stats` and its Prometheus text. The counters
//! come as a [`Report`], the form the library's stats socket serves.

use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{Map, Value};
use turbotun::stats_socket::{self, Report, StatsServer, StatsSocket};
use turbotun::{Counters, ProcessUsage};

// Options of the long-running commands (`fwd`, `tunnel`, `wg`) about their counters (a plain comment: a doc
// comment would become the help text of every command that flattens them).
#[derive(Debug, Clone, Args)]
pub struct CountersArgs {
    /// Print the counters as JSON, one object per line (each interval's with `t` and `usage`, then the closing
    /// one), instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print a line every SECS seconds while running: packets, bytes, rates and drops of that interval, as
    /// iperf3 prints them, in SI units (1 MB = 10^6 bytes, rates in bit/s; iperf3's MBytes are 2^20 bytes) (with
    /// --json: the counters so far, seconds since start, resident memory, open fds and threads).
    #[arg(long, value_name = "SECS", value_parser = crate::args::seconds)]
    pub stats_interval: Option<Duration>,
    /// Serve the counters on this Unix socket while running, for `turbotun stats` (default:
    /// /run/turbotun/NAME.stats, or NAME@NETNS.stats in another network namespace, readable by root only; `none`:
    /// no socket). Its name ends in .stats.
    #[arg(long, value_name = "PATH", value_parser = stats_socket_arg)]
    pub stats_socket: Option<String>,
}

/// A `--stats-socket` argument: `none`, or a path whose name ends in `.stats` (what `turbotun stats` takes for a
/// counters socket).
fn stats_socket_arg(text: &str) -> Result<String, String> {
    if text == "none" {
        return Ok(text.to_string());
    }
    stats_socket::check_name(std::path::Path::new(text)).map_err(|e| e.to_string())?;
    Ok(text.to_string())
}

impl CountersArgs {
    /// The counters socket of the engine named `name`: the default, the path given, or none.
    pub fn socket_path(&self, name: &str) -> Option<PathBuf> {
        match self.stats_socket.as_deref() {
            Some("none") => None,
            Some(path) => Some(PathBuf::from(path)),
            None => Some(stats_socket::socket_path(name)),
        }
    }

    /// Binds the counters socket (before privileges are dropped); a socket that cannot be made is a warning: the
    /// engine runs without it.
    pub fn bind_socket(&self, program: &str, name: &str) -> Option<StatsSocket> {
        let path = self.socket_path(name)?;
        match StatsSocket::bind(&path) {
            Ok(socket) => Some(socket),
            Err(e) => {
                // Another engine of that name in this namespace, or a directory this user may not write.
                eprintln!("{program}: counters not served: {e} (--stats-socket PATH.stats serves them elsewhere)");
                None
            }
        }
    }
}

/// Starts answering on a bound counters socket (after privileges are dropped: it starts a thread).
pub fn serve(
    program: &str,
    socket: Option<StatsSocket>,
    source: impl Fn() -> Report + Send + 'static,
) -> Option<StatsServer> {
    match socket?.serve(source) {
        Ok(server) => Some(server),
        Err(e) => {
            eprintln!("{program}: counters not served: {e}");
            None
        }
    }
}

/// Where interval lines and the summary go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Stdout,
    /// Standard error: a WireGuard endpoint in the background, whose standard output nobody reads.
    Stderr,
}

impl Sink {
    pub fn line(self, text: &str) {
        // A reader that went away (a closed pipe) is no reason to stop the engine.
        match self {
            Sink::Stdout => crate::out!("{text}"),
            Sink::Stderr => {
                let _ = writeln!(std::io::stderr().lock(), "{text}");
            }
        }
    }
}

/// The closing counters: the readable summary, or one JSON object.
pub fn closing(report: &Report, json: bool) -> String {
    if json {
        to_json(report).to_string()
    } else {
        summary(report)
    }
}

/// A thread printing a line every interval until it is stopped.
#[derive(Debug)]
pub struct Sampler {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    /// Every `every`, a line for the interval (readable) or the counters so far (JSON) of what `source` reports.
    pub fn start(
        every: Duration,
        json: bool,
        sink: Sink,
        source: impl Fn() -> Report + Send + 'static,
    ) -> std::io::Result<Sampler> {
        let every = every.max(Duration::from_millis(10));
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("stats-interval".into()).spawn(move || {
            let start = Instant::now();
            let mut next = start + every;
            let mut last = source();
            loop {
                match stopped.recv_timeout(next.saturating_duration_since(Instant::now())) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                next += every;
                let now = source();
                let line = if json {
                    let mut value = to_json(&now);
                    value["t"] = start.elapsed().as_secs_f64().into();
                    if let Ok(usage) = ProcessUsage::now() {
                        value["usage"] = serde_json::to_value(usage).unwrap_or_default();
                    }
                    value.to_string()
                } else {
                    interval_line(&last, &now)
                };
                sink.line(&line);
                last = now;
            }
        })?;
        Ok(Sampler { stop, thread })
    }

    /// Stops it and waits for its last line.
    pub fn finish(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// The report as JSON: the kind, settings (`mode`, `io`), every counter of both directions added up, `drops`
/// (their total), `drops_by_reason` (the reasons that apply), `errors` (the faults among them), `seconds`, then
/// each direction by name.
pub fn to_json(report: &Report) -> Value {
    let reasons = report.reasons();
    let counters_json = |c: &Counters| {
        let mut map = Map::new();
        for (field, value) in c.fields() {
            map.insert(field.into(), value.into());
        }
        map
    };
    let by_reason = |c: &Counters| {
        Value::Object(reasons.iter().map(|&r| (r.as_str().to_string(), c.drops.get(r).into())).collect())
    };
    let total = report.total();
    let mut line = Map::new();
    line.insert("kind".into(), report.kind.clone().into());
    line.insert("name".into(), report.name.clone().into());
    if let Some(netns) = &report.netns {
        line.insert("netns".into(), netns.clone().into());
    }
    line.insert("devices".into(), report.devices.clone().into());
    for (key, value) in &report.settings {
        line.insert(key.clone(), value.clone().into());
    }
    line.insert("pid".into(), report.pid.into());
    line.insert("seconds".into(), ((report.seconds * 1000.0).round() / 1000.0).into());
    line.extend(counters_json(&total));
    line.insert("drops".into(), total.drops.total().into());
    line.insert("drops_by_reason".into(), by_reason(&total));
    line.insert("errors".into(), total.drops.faults().into());
    line.insert("malformed".into(), total.drops.malformed.into());
    let direction_json = |counters: &Counters| {
        let mut map = counters_json(counters);
        map.insert("drops".into(), by_reason(counters));
        Value::Object(map)
    };
    for (direction, counters) in &report.directions {
        line.insert(direction.clone(), direction_json(counters));
    }
    if !report.kernel_tx_dropped.is_empty() {
        let by_device = report.kernel_tx_dropped.iter().map(|(d, n)| (d.clone(), Value::from(*n))).collect();
        line.insert("kernel_tx_dropped".into(), Value::Object(by_device));
    }
    if !report.queues.is_empty() {
        let queues = report
            .queues
            .iter()
            .map(|directions| Value::Object(directions.iter().map(|(d, c)| (d.clone(), direction_json(c))).collect()))
            .collect::<Vec<_>>();
        line.insert("queues".into(), Value::Array(queues));
    }
    if !report.peers.is_empty() {
        let peers = report
            .peers
            .iter()
            .map(|p| {
                serde_json::json!({
                    "public_key": p.public_key,
                    "endpoint": p.endpoint,
                    "allowed_ips": p.allowed_ips,
                    "latest_handshake": p.latest_handshake,
                    "rx_bytes": p.rx_bytes,
                    "tx_bytes": p.tx_bytes,
                    "drops": p.drops,
                })
            })
            .collect();
        line.insert("peers".into(), Value::Array(peers));
    }
    Value::Object(line)
}

/// The order of `turbotun stats --peers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PeerOrder {
    /// The most bytes both ways first.
    Traffic,
    /// The latest handshake first, those without one last.
    Handshake,
}

/// A WireGuard endpoint's peers as `wg show` lists them, with each one's drops: a line each, in `order`, times
/// of the last handshake as an age at `now` (UNIX seconds).
pub fn peer_table(report: &Report, order: PeerOrder, now: u64) -> String {
    let mut peers: Vec<&turbotun::stats_socket::PeerCounters> = report.peers.iter().collect();
    match order {
        PeerOrder::Traffic => peers.sort_by_key(|p| std::cmp::Reverse(p.rx_bytes + p.tx_bytes)),
        PeerOrder::Handshake => peers.sort_by_key(|p| std::cmp::Reverse(p.latest_handshake)),
    }
    let mut s = format!(
        "{:<44}  {:<24}  {:>16}  {:>10}  {:>10}  {:>7}\n",
        "peer", "endpoint", "latest handshake", "received", "sent", "drops"
    );
    for p in peers {
        let handshake = match p.latest_handshake {
            Some(at) => format!("{} ago", age(now.saturating_sub(at))),
            None => "never".into(),
        };
        s += &format!(
            "{:<44}  {:<24}  {:>16}  {:>10}  {:>10}  {:>7}\n",
            p.public_key,
            p.endpoint.as_deref().unwrap_or("(none)"),
            handshake,
            bytes(p.rx_bytes),
            bytes(p.tx_bytes),
            p.drops
        );
    }
    s
}

/// `42 s`, `3 min 5 s`, `2 h 1 min`, `3 d 4 h`.
fn age(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min {} s", seconds / 60, seconds % 60),
        3600..86_400 => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{} d {} h", seconds / 86_400, seconds % 86_400 / 3600),
    }
}

/// `1.46 M packets, 2.16 GB in 3.0 s (5.8 Gbit/s), 1 drop: device_down`, then a line per direction, then one
/// per queue when there are several.
pub fn summary(report: &Report) -> String {
    let total = report.total();
    let mut s = format!(
        "{} packets, {} in {:.1} s ({}), {}",
        count(total.packets),
        bytes(total.bytes),
        report.seconds,
        bit_rate(total.bytes, report.seconds),
        drops(&total)
    );
    s += &crate::kernel_drops::text(&report.kernel_tx_dropped);
    if report.directions.len() > 1 {
        for (direction, c) in &report.directions {
            s += &format!("\n  {direction:<12} {} packets, {}, {}", count(c.packets), bytes(c.bytes), drops(c));
        }
    }
    for (i, directions) in report.queues.iter().enumerate() {
        let each: Vec<String> =
            directions.iter().map(|(d, c)| format!("{d} {} packets, {}", count(c.packets), drops(c))).collect();
        s += &format!("\n  {:<12} {}", format!("queue {i}"), each.join("; "));
    }
    s
}

/// One interval, as iperf3 prints it: `  1.00-2.00  s  118 k packets  170 MB  1.36 Gbit/s  118 k packets/s  no
/// drops`.
pub fn interval_line(earlier: &Report, now: &Report) -> String {
    let delta = now.total().since(&earlier.total());
    let seconds = (now.seconds - earlier.seconds).max(1e-9);
    let kernel = crate::kernel_drops::since(&now.kernel_tx_dropped, &earlier.kernel_tx_dropped);
    format!(
        "{:>7.2}-{:<7.2} s  {:>8} packets  {:>9}  {:>12}  {:>8} packets/s  {}{}",
        earlier.seconds,
        now.seconds,
        count(delta.packets),
        bytes(delta.bytes),
        bit_rate(delta.bytes, seconds),
        count((delta.packets as f64 / seconds).round() as u64),
        drops(&delta),
        crate::kernel_drops::text(&kernel)
    )
}

/// `no drops`, `1 drop: device_down`, `7 drops: 5 device_down, 2 no_peer`; then, for a tunnel whose protocol
/// held packets for a handshake, `, 5 held for a handshake` (each leaves later, or is counted as a drop).
fn drops(c: &Counters) -> String {
    match c.held {
        0 => drop_list(c),
        held => format!("{}, {held} held for a handshake", drop_list(c)),
    }
}

/// `no drops`, `1 drop: device_down`, `7 drops: 5 device_down, 2 no_peer`.
fn drop_list(c: &Counters) -> String {
    let total = c.drops.total();
    let counted: Vec<(turbotun::DropReason, u64)> =
        turbotun::DropReason::ALL.iter().map(|&r| (r, c.drops.get(r))).filter(|&(_, n)| n > 0).collect();
    match counted.as_slice() {
        [] => "no drops".to_string(),
        [(reason, _)] => format!("{total} {}: {reason}", if total == 1 { "drop" } else { "drops" }),
        many => {
            format!("{total} drops: {}", many.iter().map(|(r, n)| format!("{n} {r}")).collect::<Vec<_>>().join(", "))
        }
    }
}

/// Three significant digits with an SI prefix: `12`, `53.2 k`, `1.46 M`.
fn scaled(value: f64, unit: &str) -> String {
    let mut value = value;
    let mut prefix = "";
    for next in ["k", "M", "G", "T", "P"] {
        if value < 999.5 {
            break;
        }
        value /= 1000.0;
        prefix = next;
    }
    let digits = if prefix.is_empty() || value >= 99.95 {
        0
    } else if value >= 9.995 {
        1
    } else {
        2
    };
    let space = if prefix.is_empty() && unit.is_empty() { "" } else { " " };
    format!("{value:.digits$}{space}{prefix}{unit}")
}

fn count(n: u64) -> String {
    scaled(n as f64, "")
}

fn bytes(n: u64) -> String {
    scaled(n as f64, "B")
}

fn bit_rate(bytes: u64, seconds: f64) -> String {
    scaled(bytes as f64 * 8.0 / seconds.max(1e-9), "bit/s")
}

/// A Prometheus metric: its name, help and type.
struct Metric {
    name: &'static str,
    help: &'static str,
}

/// The metric of each counter ([`Counters::FIELDS`]), named as node_exporter names its own: a unit, `_total` on
/// counters.
fn counter_metric(field: &str) -> Option<Metric> {
    let (name, help) = match field {
        "reads" => {
            ("turbotun_reads_total", "Reads that returned a frame (tunnels, out of the network: receive calls).")
        }
        "packets" => ("turbotun_packets_total", "Packets written (segments of a split super-packet count one each)."),
        "bytes" => ("turbotun_bytes_total", "Bytes of the packets written, virtio header excluded."),
        "super_packets" => ("turbotun_super_packets_total", "Reads that returned a GSO super-packet."),
        "zero_copy_splits" => {
            ("turbotun_zero_copy_splits_total", "Super-packets split without copying a payload byte.")
        }
        "segments" => {
            ("turbotun_segments_total", "Packets produced by reads, one per segment of a split super-packet.")
        }
        "coalesced" => ("turbotun_coalesced_packets_total", "Packets merged into another before writing."),
        "writes" => ("turbotun_writes_total", "Writes (or sends) issued."),
        "gro_fallbacks" => ("turbotun_gro_fallbacks_total", "Coalesced writes the kernel refused, then split."),
        "gso_fallbacks" => {
            ("turbotun_gso_fallbacks_total", "Segmented UDP sends the kernel refused, then sent one by one.")
        }
        "control" => ("turbotun_control_datagrams_total", "A tunnel protocol's own datagrams, sent or received."),
        "held" => ("turbotun_held_packets_total", "Packets a tunnel protocol kept until its handshake was done."),
        "icmp_errors" => (
            "turbotun_icmp_errors_total",
            "ICMP destination-unreachable errors written back for packets no peer takes.",
        ),
        _ => return None,
    };
    Some(Metric { name, help })
}

/// A label value with `\`, `"` and newlines escaped, as the text format wants it.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A setting's key as a label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
fn label_name(text: &str) -> String {
    let mut name: String = text.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// Settings whose values change while an engine runs: never labels of `turbotun_info`.
const VARYING_SETTINGS: &[&str] = &["connections", "peer_metrics"];

/// The reports in Prometheus's text format: `turbotun_info` and `turbotun_uptime_seconds` per engine, each counter
/// per direction (`direction` label) and the drops per direction and reason (`reason` label); every series
/// labelled with the engine's `name` and `kind`, and its `netns` outside the initial namespace.
pub fn prometheus(reports: &[Report]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    // The namespace tells apart engines of one device name in two namespaces (absent in the initial one).
    let base = |r: &Report| match &r.netns {
        None => format!("name=\"{}\",kind=\"{}\"", label_value(&r.name), label_value(&r.kind)),
        Some(netns) => format!(
            "name=\"{}\",netns=\"{}\",kind=\"{}\"",
            label_value(&r.name),
            label_value(netns),
            label_value(&r.kind)
        ),
    };
    let header = |s: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
    };
    header(&mut s, "turbotun_info", "gauge", "A running turbotun engine, its settings as labels (always 1).");
    for r in reports {
        let mut labels = base(r);
        for (key, value) in &r.settings {
            let key = label_name(key);
            // A label that changes while the engine runs would start a new series each time: what counts goes
            // in a counter of its own (below), a note such as why per-peer series are off is no setting.
            if !["name", "kind", "netns"].contains(&key.as_str()) && !VARYING_SETTINGS.contains(&key.as_str()) {
                let _ = write!(labels, ",{key}=\"{}\"", label_value(value));
            }
        }
        let _ = write!(labels, ",devices=\"{}\",pid=\"{}\"", label_value(&r.devices.join(",")), r.pid);
        let _ = writeln!(s, "turbotun_info{{{labels}}} 1");
    }
    header(
        &mut s,
        "turbotun_kernel_tx_dropped_total",
        "counter",
        "Packets the kernel dropped at a device's transmit ring since the engine started (ip -s link's TX dropped).",
    );
    for r in reports {
        for (device, n) in &r.kernel_tx_dropped {
            let _ =
                writeln!(s, "turbotun_kernel_tx_dropped_total{{{},device=\"{}\"}} {n}", base(r), label_value(device));
        }
    }
    header(&mut s, "turbotun_connections_total", "counter", "Front ends a vhost-user backend has served.");
    for r in reports {
        if let Some((_, n)) = r.settings.iter().find(|(k, _)| k == "connections") {
            let _ = writeln!(s, "turbotun_connections_total{{{}}} {}", base(r), n.parse::<u64>().unwrap_or(0));
        }
    }
    header(&mut s, "turbotun_uptime_seconds", "gauge", "Seconds since the engine started.");
    for r in reports {
        let _ = writeln!(s, "turbotun_uptime_seconds{{{}}} {:.3}", base(r), r.seconds);
    }
    for field in Counters::FIELDS {
        let Some(metric) = counter_metric(field) else { continue };
        header(&mut s, metric.name, "counter", metric.help);
        for r in reports {
            for (direction, c) in &r.directions {
                let value = c.fields().iter().find(|(f, _)| f == field).map_or(0, |&(_, v)| v);
                let _ = writeln!(s, "{}{{{},direction=\"{}\"}} {value}", metric.name, base(r), label_value(direction));
            }
        }
    }
    header(&mut s, "turbotun_queue_packets_total", "counter", "Packets written, by queue of an engine with several.");
    for r in reports {
        for (i, directions) in r.queues.iter().enumerate() {
            for (direction, c) in directions {
                let _ = writeln!(
                    s,
                    "turbotun_queue_packets_total{{{},queue=\"{i}\",direction=\"{}\"}} {}",
                    base(r),
                    label_value(direction),
                    c.packets
                );
            }
        }
    }
    header(
        &mut s,
        "turbotun_dropped_packets_total",
        "counter",
        "Packets read and not written, by reason (none is silent; see docs/RELIABILITY.md).",
    );
    for r in reports {
        for (direction, c) in &r.directions {
            for reason in r.reasons() {
                let _ = writeln!(
                    s,
                    "turbotun_dropped_packets_total{{{},direction=\"{}\",reason=\"{reason}\"}} {}",
                    base(r),
                    label_value(direction),
                    c.drops.get(reason)
                );
            }
        }
    }
    peer_metrics(&mut s, reports);
    s
}

/// Each WireGuard peer's series, named and labelled as WireGuard's usual Prometheus exporter
/// (`wireguard_exporter`) names them, so that the dashboards made for it work: `device` (the interface) and
/// `public_key` (the peer's, in base64) on every series, `endpoint` on `wireguard_peer_info`, and one
/// `wireguard_peer_allowed_ips_info` per allowed prefix; and the drops per peer, which only turbotun counts.
fn peer_metrics(s: &mut String, reports: &[Report]) {
    use std::fmt::Write as _;
    let with_peers: Vec<&Report> = reports.iter().filter(|r| !r.peers.is_empty()).collect();
    if with_peers.is_empty() {
        return;
    }
    let peer =
        |r: &Report, key: &str| format!("device=\"{}\",public_key=\"{}\"", label_value(&r.name), label_value(key));
    type Value = fn(&turbotun::stats_socket::PeerCounters) -> String;
    let series: [(&str, &str, &str, Value); 5] = [
        (
            "wireguard_peer_info",
            "gauge",
            "Metadata about a peer: its endpoint and allowed prefixes (always 1).",
            |_| "1".into(),
        ),
        (
            "wireguard_peer_last_handshake_seconds",
            "gauge",
            "UNIX timestamp of the last handshake with a peer (0: none yet).",
            |p| p.latest_handshake.unwrap_or(0).to_string(),
        ),
        ("wireguard_peer_receive_bytes_total", "counter", "Bytes received from a peer.", |p| p.rx_bytes.to_string()),
        ("wireguard_peer_transmit_bytes_total", "counter", "Bytes transmitted to a peer.", |p| p.tx_bytes.to_string()),
        (
            "turbotun_wireguard_peer_dropped_packets_total",
            "counter",
            "Packets to or from a peer dropped (held packets no handshake came for, datagrams that did not open).",
            |p| p.drops.to_string(),
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        for r in &with_peers {
            for p in &r.peers {
                let value = value(p);
                let mut labels = peer(r, &p.public_key);
                if name == "wireguard_peer_info" {
                    let endpoint = p.endpoint.as_deref().unwrap_or("");
                    let _ = write!(
                        labels,
                        ",endpoint=\"{}\",allowed_ips=\"{}\"",
                        label_value(endpoint),
                        label_value(&p.allowed_ips.join(","))
                    );
                }
                let _ = writeln!(s, "{name}{{{labels}}} {value}");
            }
        }
    }
    let name = "wireguard_peer_allowed_ips_info";
    let _ = writeln!(s, "# HELP {name} Each allowed prefix of a peer (always 1).");
    let _ = writeln!(s, "# TYPE {name} gauge");
    for r in &with_peers {
        for p in &r.peers {
            for prefix in &p.allowed_ips {
                let _ = writeln!(s, "{name}{{{},allowed_ips=\"{}\"}} 1", peer(r, &p.public_key), label_value(prefix));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbotun::{DropReason, Engine};

    fn report(seconds: f64, packets: u64, bytes: u64, device_down: u64) -> Report {
        let mut r = Report::new("forwarder", Engine::Forwarder, "tta");
        r.settings = vec![("mode".into(), "offload".into()), ("io".into(), "block".into())];
        r.seconds = seconds;
        let mut a = Counters::default();
        a.set_field("packets", packets);
        a.set_field("bytes", bytes);
        a.drops.add(DropReason::DeviceDown, device_down);
        r.directions = vec![("a_to_b".into(), a), ("b_to_a".into(), Counters::default())];
        r
    }

    #[test]
    fn test_summary_reads_like_a_sentence() {
        let r = report(3.0, 1_460_000, 2_160_000_000, 1);
        let s = summary(&r);
        assert!(s.starts_with("1.46 M packets, 2.16 GB in 3.0 s (5.76 Gbit/s), 1 drop: device_down"), "{s}");
        assert!(s.contains("\n  b_to_a       0 packets, 0 B, no drops"), "{s}");
        let mut two = r.clone();
        two.directions[1].1.drops.add(DropReason::Stopped, 6);
        assert!(summary(&two).contains("7 drops: 1 device_down, 6 stopped"), "{}", summary(&two));
        assert_eq!(scaled(999.0, ""), "999");
        assert_eq!(scaled(53_210.0, ""), "53.2 k");
        assert_eq!(scaled(120e6, "bit/s"), "120 Mbit/s");
    }

    #[test]
    fn test_interval_line_has_the_rates_of_the_interval() {
        let line = interval_line(&report(1.0, 1000, 1_000_000, 0), &report(2.0, 3000, 3_000_000, 2));
        assert!(line.contains("1.00-2.00"), "{line}");
        assert!(line.contains("2.00 k packets") && line.contains("2.00 MB") && line.contains("16.0 Mbit/s"), "{line}");
        assert!(line.contains("2.00 k packets/s") && line.ends_with("2 drops: device_down"), "{line}");
    }

    #[test]
    fn test_json_has_seconds_and_only_the_reasons_that_apply() {
        let v = to_json(&report(3.0, 10, 1000, 1));
        assert_eq!(v["seconds"], 3.0);
        assert_eq!(v["mode"], "offload");
        assert_eq!(v["io"], "block");
        assert_eq!(v["packets"], 10);
        assert_eq!(v["drops"], 1);
        assert_eq!(v["drops_by_reason"]["device_down"], 1);
        assert!(v["drops_by_reason"].get("no_peer").is_none(), "no tunnel reasons for a forwarder: {v}");
        assert_eq!(v["a_to_b"]["bytes"], 1000);
        assert_eq!(v["a_to_b"]["drops"]["device_down"], 1);
        assert!(v.get("queues").is_none(), "one queue: no per-queue counters");
    }

    #[test]
    fn test_a_tunnel_of_two_queues_shows_each_queues_counters() {
        let mut q = [turbotun::tunnel::TunnelStats::default(); 2];
        q[0].to_network.set_field("packets", 3);
        q[1].to_network.set_field("packets", 4);
        q[1].from_network.drops.add(DropReason::Replayed, 1);
        let mut total = turbotun::tunnel::TunnelStats::default();
        total.to_network.set_field("packets", 7);
        let r =
            Report::of_tunnel("wireguard", Engine::KeyedTunnel, "wg0", "wireguard", &total, 1.0).with_tunnel_queues(&q);
        let v = to_json(&r);
        assert_eq!(v["packets"], 7, "the totals are the tunnel's: {v}");
        assert_eq!(v["queues"][0]["to_network"]["packets"], 3);
        assert_eq!(v["queues"][1]["to_network"]["packets"], 4);
        assert_eq!(v["queues"][1]["from_network"]["drops"]["replayed"], 1);
        let text = summary(&r);
        assert!(
            text.contains("\n  queue 1      to_network 4 packets, no drops; from_network 0 packets, 1 drop: replayed"),
            "{text}"
        );
        let metrics = prometheus(&[r]);
        assert!(metrics.contains("turbotun_queue_packets_total{name=\"wg0\",kind=\"wireguard\",queue=\"1\",direction=\"to_network\"} 4\n"), "{metrics}");
    }

    #[test]
    fn test_every_counter_has_a_metric() {
        for field in Counters::FIELDS {
            let metric = counter_metric(field).unwrap_or_else(|| panic!("{field} has no metric"));
            assert!(metric.name.ends_with("_total"), "{}", metric.name);
        }
        let text = prometheus(&[report(1.0, 5, 500, 0)]);
        assert!(text.contains("turbotun_packets_total{name=\"tta\",kind=\"forwarder\",direction=\"a_to_b\"} 5\n"));
        assert!(text.contains("reason=\"device_down\"} 0\n") && !text.contains("no_peer"), "{text}");
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(label_name("9x-y"), "_9x_y");
    }

    #[test]
    fn test_what_changes_while_an_engine_runs_is_a_counter_not_a_label() {
        let mut r = report(1.0, 5, 500, 0);
        r.settings.push(("socket".into(), "/run/vm0.sock".into()));
        r.settings.push(("connections".into(), "3".into()));
        r.kernel_tx_dropped = vec![("tta".into(), 7)];
        let text = prometheus(&[r.clone()]);
        let info = text.lines().find(|l| l.starts_with("turbotun_info{")).unwrap();
        assert!(info.contains("socket=\"/run/vm0.sock\"") && !info.contains("connections"), "{info}");
        assert!(text.contains("turbotun_connections_total{name=\"tta\",kind=\"forwarder\"} 3\n"), "{text}");
        assert!(text.contains("turbotun_kernel_tx_dropped_total{name=\"tta\",kind=\"forwarder\",device=\"tta\"} 7\n"));
        assert!(summary(&r).contains("; the kernel dropped 7 at tta's transmit ring"), "{}", summary(&r));
    }
}
