//! The report a counters socket serves ([`crate::stats_socket`]): one engine's counters at one moment, written as
//! `key=value` lines and read back, a newer writer's unknown lines skipped by an older reader.

use crate::dataplane::stats::{Counters, DropReason, Engine};

/// One engine's counters at one moment, as the socket serves them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Report {
    /// What runs, in words: `forwarder`, `tunnel`, `wireguard`.
    pub kind: String,
    /// Which drop reasons apply ([`DropReason::applies_to`]).
    pub engine: Engine,
    /// The name the socket is found by.
    pub name: String,
    /// The serving engine's network namespace when it is not the initial one
    /// ([`crate::netns::current_name`]): its `ip netns` name or `net-INODE`.
    pub netns: Option<String>,
    /// The devices it moves packets for.
    pub devices: Vec<String>,
    /// How it runs, as `(key, value)` pairs (`mode offload`, `io block`).
    pub settings: Vec<(String, String)>,
    /// The serving process.
    pub pid: u32,
    /// Seconds since the engine started.
    pub seconds: f64,
    /// The counters of each direction, by name (`a_to_b`, `to_network`, ...).
    pub directions: Vec<(String, Counters)>,
    /// An engine of several queues: each queue's own counters, by queue number, each by direction as in
    /// [`Self::directions`] (part of the totals there, not added to them). Empty with one queue.
    pub queues: Vec<Vec<(String, Counters)>>,
    /// A WireGuard endpoint's peers, each with its own counters, in the order they were added.
    pub peers: Vec<PeerCounters>,
    /// The kernel's own drops at each device's transmit ring since the engine started (`ip -s link`'s `TX
    /// dropped`: packets the kernel had for the device while its reader, this engine, was too slow, tail-dropped
    /// before any read), by device. Not among the engine's drops: it never read them.
    pub kernel_tx_dropped: Vec<(String, u64)>,
}

/// One WireGuard peer's counters, what `wg show` shows of it and the drops it alone caused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PeerCounters {
    /// Its public key, in the base64 `wg` prints.
    pub public_key: String,
    /// Where its datagrams go now.
    pub endpoint: Option<String>,
    /// Its allowed prefixes (`ADDR/LEN`).
    pub allowed_ips: Vec<String>,
    /// When the last handshake with it completed, in UNIX seconds (`None`: never).
    pub latest_handshake: Option<u64>,
    /// Bytes of datagrams received from it.
    pub rx_bytes: u64,
    /// Bytes of datagrams sent to it.
    pub tx_bytes: u64,
    /// Packets to it or from it dropped: held packets no handshake came for, and what it sent that did not
    /// open (a replay, an expired session, a source it may not use).
    pub drops: u64,
}

impl PeerCounters {
    /// A peer's counters, all zero.
    pub fn new(public_key: impl Into<String>) -> PeerCounters {
        PeerCounters { public_key: public_key.into(), ..PeerCounters::default() }
    }

    /// Its line of the report: `KEY rx_bytes=N tx_bytes=N drops=N [latest_handshake=S] [endpoint=E]
    /// [allowed_ips=A,B]`.
    fn to_line(&self) -> String {
        let mut line =
            format!("{} rx_bytes={} tx_bytes={} drops={}", self.public_key, self.rx_bytes, self.tx_bytes, self.drops);
        if let Some(seconds) = self.latest_handshake {
            line.push_str(&format!(" latest_handshake={seconds}"));
        }
        if let Some(endpoint) = &self.endpoint {
            line.push_str(&format!(" endpoint={}", one_line(endpoint).replace(' ', "_")));
        }
        if !self.allowed_ips.is_empty() {
            line.push_str(&format!(" allowed_ips={}", self.allowed_ips.join(",")));
        }
        line
    }

    /// Reads what [`Self::to_line`] wrote (words it does not know are skipped: a newer server may say more).
    fn parse_line(value: &str) -> std::result::Result<PeerCounters, String> {
        let mut words = value.split(' ');
        let key = words.next().filter(|k| !k.is_empty()).ok_or_else(|| format!("peer={value:?}: no key"))?;
        let mut peer = PeerCounters::new(key);
        for word in words {
            let (field, v) =
                word.split_once('=').ok_or_else(|| format!("peer={value:?}: {word:?} is not key=value"))?;
            let count = || v.parse::<u64>().map_err(|_| format!("peer={value:?}: {v:?} is not a count"));
            match field {
                "rx_bytes" => peer.rx_bytes = count()?,
                "tx_bytes" => peer.tx_bytes = count()?,
                "drops" => peer.drops = count()?,
                "latest_handshake" => peer.latest_handshake = Some(count()?),
                "endpoint" => peer.endpoint = Some(v.to_string()),
                "allowed_ips" => peer.allowed_ips = v.split(',').map(str::to_string).collect(),
                _ => {}
            }
        }
        Ok(peer)
    }
}

impl Report {
    /// A report of this process (`pid` set) without counters yet.
    pub fn new(kind: impl Into<String>, engine: Engine, name: impl Into<String>) -> Report {
        Report {
            kind: kind.into(),
            engine,
            name: name.into(),
            netns: None,
            devices: Vec::new(),
            settings: Vec::new(),
            pid: std::process::id(),
            seconds: 0.0,
            directions: Vec::new(),
            queues: Vec::new(),
            peers: Vec::new(),
            kernel_tx_dropped: Vec::new(),
        }
    }

    /// A tunnel's report: `to_network` and `from_network` through the device `name`, in `mode` (`plain`,
    /// `wireguard`), `seconds` after it started.
    pub fn of_tunnel(
        kind: &str,
        engine: Engine,
        name: &str,
        mode: &str,
        stats: &crate::dataplane::tunnel::TunnelStats,
        seconds: f64,
    ) -> Report {
        let mut report = Report::new(kind, engine, name);
        report.devices = vec![name.to_string()];
        report.settings = vec![("mode".into(), mode.into())];
        report.seconds = seconds;
        report.directions = vec![("to_network".into(), stats.to_network), ("from_network".into(), stats.from_network)];
        report
    }

    /// A tunnel's report ([`Self::of_tunnel`]) with each queue's counters, when it has several
    /// ([`crate::dataplane::tunnel::TunnelStatsHandle::queue_snapshots`]).
    pub fn with_tunnel_queues(mut self, per_queue: &[crate::dataplane::tunnel::TunnelStats]) -> Report {
        self.queues = match per_queue.len() {
            0 | 1 => Vec::new(),
            _ => per_queue
                .iter()
                .map(|q| vec![("to_network".into(), q.to_network), ("from_network".into(), q.from_network)])
                .collect(),
        };
        self
    }

    /// A vhost-user-net backend's report: `to_tap` and `to_guest` through the TAP `tap`, the front ends served so
    /// far among its settings, `seconds` after it started.
    #[cfg(feature = "vhost-user")]
    pub fn of_vhost_user(
        tap: &str,
        socket: &std::path::Path,
        counters: &crate::dataplane::vhost_user::VhostUserCounters,
        seconds: f64,
    ) -> Report {
        let mut report = Report::new("vhost-user", Engine::VhostUser, tap);
        report.devices = vec![tap.to_string()];
        report.settings = vec![
            ("socket".into(), socket.display().to_string()),
            ("connections".into(), counters.connections.to_string()),
        ];
        report.seconds = seconds;
        report.directions = vec![("to_tap".into(), counters.to_tap), ("to_guest".into(), counters.to_guest)];
        report
    }

    /// A vhost-user-net backend's report ([`Self::of_vhost_user`]) with each queue pair's counters, when it has
    /// several ([`crate::dataplane::vhost_user::VhostUserStats::pair_snapshots`]).
    #[cfg(feature = "vhost-user")]
    pub fn with_vhost_user_pairs(mut self, pairs: &[crate::dataplane::vhost_user::VhostUserCounters]) -> Report {
        self.queues = match pairs.len() {
            0 | 1 => Vec::new(),
            _ => pairs.iter().map(|p| vec![("to_tap".into(), p.to_tap), ("to_guest".into(), p.to_guest)]).collect(),
        };
        self
    }

    /// A forwarder's report: `a_to_b` and `b_to_a` between `devices`, named after the first, `seconds` after it
    /// started.
    pub fn of_forwarder(
        devices: &[String; 2],
        mode: crate::dataplane::forward::ForwardMode,
        io: crate::dataplane::forward::IoKind,
        stats: &crate::dataplane::forward::ForwardStats,
        seconds: f64,
    ) -> Report {
        let mut report = Report::new("forwarder", Engine::Forwarder, devices[0].clone());
        report.devices = devices.to_vec();
        report.settings = vec![("mode".into(), mode.as_str().into()), ("io".into(), io.as_str().into())];
        report.seconds = seconds;
        report.directions = vec![("a_to_b".into(), stats.a_to_b), ("b_to_a".into(), stats.b_to_a)];
        report
    }

    /// Every direction added up.
    pub fn total(&self) -> Counters {
        let mut total = Counters::default();
        for (_, counters) in &self.directions {
            total.add(counters);
        }
        total
    }

    /// The drop reasons to show: those that apply to the engine, and any other that counted a drop (none is
    /// hidden), in the order [`DropReason::ALL`] lists them.
    pub fn reasons(&self) -> Vec<DropReason> {
        let total = self.total();
        DropReason::ALL.iter().copied().filter(|&r| r.applies_to(self.engine) || total.drops.get(r) > 0).collect()
    }

    /// The value of a setting.
    pub fn setting(&self, key: &str) -> Option<&str> {
        self.settings.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The report as the socket writes it (see the module documentation).
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(s, "kind={}", one_line(&self.kind));
        let _ = writeln!(s, "engine={}", self.engine.as_str());
        let _ = writeln!(s, "name={}", one_line(&self.name));
        if let Some(netns) = &self.netns {
            let _ = writeln!(s, "netns={}", one_line(netns));
        }
        for device in &self.devices {
            let _ = writeln!(s, "device={}", one_line(device));
        }
        for (key, value) in &self.settings {
            let _ = writeln!(s, "setting={} {}", one_line(key).replace(' ', "_"), one_line(value));
        }
        let _ = writeln!(s, "pid={}", self.pid);
        let _ = writeln!(s, "seconds={:.3}", self.seconds);
        for (direction, counters) in &self.directions {
            let _ = writeln!(s, "direction={}", one_line(direction));
            for (field, value) in counters.fields() {
                let _ = writeln!(s, "{field}={value}");
            }
            for &reason in DropReason::ALL {
                let n = counters.drops.get(reason);
                if n > 0 {
                    let _ = writeln!(s, "drop={reason} {n}");
                }
            }
        }
        // One line per queue and direction, so that a reader that does not know them skips them whole.
        for (i, directions) in self.queues.iter().enumerate() {
            for (direction, counters) in directions {
                let _ = write!(s, "queue={i} {}", one_line(direction).replace(' ', "_"));
                for (field, value) in counters.fields() {
                    let _ = write!(s, " {field}={value}");
                }
                for &reason in DropReason::ALL {
                    let n = counters.drops.get(reason);
                    if n > 0 {
                        let _ = write!(s, " drop.{reason}={n}");
                    }
                }
                s.push('\n');
            }
        }
        for peer in &self.peers {
            let _ = writeln!(s, "peer={}", peer.to_line());
        }
        for (device, n) in &self.kernel_tx_dropped {
            let _ = writeln!(s, "kernel_tx_dropped={} {n}", one_line(device).replace(' ', "_"));
        }
        s.push('\n');
        s
    }

    /// Reads one `queue=` line's value (`N DIRECTION field=value ... drop.REASON=value ...`) into the report.
    fn parse_queue_line(&mut self, value: &str) -> std::result::Result<(), String> {
        let mut words = value.split(' ');
        let queue = words
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n <= crate::devices::device::MAX_QUEUES)
            .ok_or_else(|| format!("queue={value:?}: no queue number"))?;
        let direction =
            words.next().filter(|d| !d.is_empty()).ok_or_else(|| format!("queue={value:?}: no direction"))?;
        let mut counters = Counters::default();
        for word in words {
            let (key, n) = word.split_once('=').ok_or_else(|| format!("queue={value:?}: {word:?} is not key=value"))?;
            let n = n.parse::<u64>().map_err(|_| format!("queue={value:?}: {n:?} is not a count"))?;
            match key.strip_prefix("drop.") {
                // A reason (or below, a counter) this build does not know is skipped: a newer server may say more.
                Some(reason) => {
                    if let Some(reason) = DropReason::from_name(reason) {
                        counters.drops.add(reason, n);
                    }
                }
                None => {
                    counters.set_field(key, n);
                }
            }
        }
        while self.queues.len() <= queue {
            self.queues.push(Vec::new());
        }
        self.queues[queue].push((direction.to_string(), counters));
        Ok(())
    }

    /// Reads a report written by [`Self::to_text`]. Lines it does not know are skipped (a newer server may say
    /// more); a known line with a bad value is an error.
    pub fn parse(text: &str) -> std::result::Result<Report, String> {
        let mut report = Report::new("", Engine::Forwarder, "");
        report.pid = 0;
        let (mut has_kind, mut has_engine, mut ended) = (false, false, false);
        for line in text.lines() {
            if line.is_empty() {
                ended = true;
                break;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(format!("{line:?} is not a key=value line"));
            };
            let number = |what: &str| value.parse::<u64>().map_err(|_| format!("{what}={value:?} is not a count"));
            match key {
                "kind" => (report.kind, has_kind) = (value.to_string(), true),
                "engine" => {
                    report.engine = Engine::from_name(value).ok_or_else(|| format!("unknown engine {value:?}"))?;
                    has_engine = true;
                }
                "name" => report.name = value.to_string(),
                "netns" => report.netns = Some(value.to_string()),
                "device" => report.devices.push(value.to_string()),
                "setting" => {
                    let (k, v) = value.split_once(' ').unwrap_or((value, ""));
                    report.settings.push((k.to_string(), v.to_string()));
                }
                "pid" => report.pid = u32::try_from(number("pid")?).map_err(|_| format!("pid {value} out of range"))?,
                "seconds" => {
                    report.seconds = value
                        .parse::<f64>()
                        .ok()
                        .filter(|s| s.is_finite() && *s >= 0.0)
                        .ok_or_else(|| format!("seconds={value:?} is not a duration"))?;
                }
                "direction" => report.directions.push((value.to_string(), Counters::default())),
                "queue" => report.parse_queue_line(value)?,
                "peer" => report.peers.push(PeerCounters::parse_line(value)?),
                "kernel_tx_dropped" => {
                    let (device, n) =
                        value.split_once(' ').ok_or_else(|| format!("kernel_tx_dropped={value:?}: DEVICE COUNT"))?;
                    let n =
                        n.parse::<u64>().map_err(|_| format!("kernel_tx_dropped={value:?}: {n:?} is not a count"))?;
                    report.kernel_tx_dropped.push((device.to_string(), n));
                }
                "drop" => {
                    let (reason, n) = value.split_once(' ').ok_or_else(|| format!("drop={value:?}: REASON COUNT"))?;
                    let n = n.parse::<u64>().map_err(|_| format!("drop={value:?}: {n:?} is not a count"))?;
                    let (_, counters) = report.directions.last_mut().ok_or("a drop before any direction")?;
                    // A reason this build does not know is skipped: a newer server may have more.
                    if let Some(reason) = DropReason::from_name(reason) {
                        counters.drops.add(reason, n);
                    }
                }
                field if Counters::FIELDS.contains(&field) => {
                    let n = number(field)?;
                    let (_, counters) = report.directions.last_mut().ok_or("a counter before any direction")?;
                    counters.set_field(field, n);
                }
                _ => {}
            }
        }
        if !ended {
            return Err("the report ended early (no empty line at its end)".into());
        }
        if !has_kind || !has_engine {
            return Err("the report names no kind or engine".into());
        }
        Ok(report)
    }
}

/// A value on one line of the report (a newline would start another key).
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A forwarder's report with counters in both directions and a drop.
    pub(crate) fn sample() -> Report {
        let mut report = Report::new("forwarder", Engine::Forwarder, "tta");
        report.devices = vec!["tta".into(), "ttb".into()];
        report.settings = vec![("mode".into(), "offload".into()), ("io".into(), "block".into())];
        report.seconds = 3.25;
        let mut a = Counters { reads: 10, packets: 1000, bytes: 1_400_000, ..Counters::default() };
        a.drops.add(DropReason::DeviceDown, 2);
        let b = Counters { reads: 5, packets: 500, bytes: 700_000, ..Counters::default() };
        report.directions = vec![("a_to_b".into(), a), ("b_to_a".into(), b)];
        report
    }

    #[test]
    fn test_report_round_trips_and_lists_the_reasons_that_apply() {
        let mut report = sample();
        report.kernel_tx_dropped = vec![("tta".into(), 0), ("ttb".into(), 7)];
        let text = report.to_text();
        assert!(text.contains("kernel_tx_dropped=ttb 7\n"), "{text}");
        assert!(text.ends_with("\n\n") && text.contains("drop=device_down 2\n"), "{text}");
        assert_eq!(Report::parse(&text).unwrap(), report);
        let reasons = report.reasons();
        assert!(reasons.contains(&DropReason::DeviceDown) && !reasons.contains(&DropReason::NoPeer));
        // A drop for a reason the engine is not known for is still shown.
        let mut odd = report.clone();
        odd.directions[0].1.drops.add(DropReason::NoPeer, 1);
        assert!(odd.reasons().contains(&DropReason::NoPeer));
        assert_eq!(report.total().packets, 1500);
    }

    #[test]
    fn test_a_tunnels_queues_round_trip_and_an_older_reader_skips_them() {
        use crate::dataplane::tunnel::TunnelStats;
        let mut q0 = TunnelStats::default();
        q0.to_network.packets = 7;
        q0.from_network.drops.add(DropReason::Replayed, 2);
        let mut q1 = TunnelStats::default();
        q1.to_network.bytes = 9000;
        let stats = TunnelStats { to_network: Counters { packets: 7, bytes: 9000, ..Counters::default() }, ..q0 };
        let report = Report::of_tunnel("wireguard", Engine::KeyedTunnel, "wg0", "wireguard", &stats, 1.0)
            .with_tunnel_queues(&[q0, q1]);
        let text = report.to_text();
        assert!(text.contains("queue=0 from_network reads=0 ") && text.contains(" drop.replayed=2\n"), "{text}");
        let parsed = Report::parse(&text).unwrap();
        assert_eq!(parsed, report);
        assert_eq!(parsed.queues[1][0].1.bytes, 9000);
        assert_eq!(parsed.total(), report.total(), "the queues are not added to the totals");
        // What a reader without queue lines makes of it: the same directions (no counter set on the last one).
        let without: String = text.lines().filter(|l| !l.starts_with("queue=")).map(|l| format!("{l}\n")).collect();
        assert_eq!(Report::parse(&without).unwrap().directions, report.directions);
        // One queue: no queue lines.
        let one = Report::of_tunnel("tunnel", Engine::Tunnel, "tt0", "plain", &stats, 1.0).with_tunnel_queues(&[q0]);
        assert!(one.queues.is_empty() && !one.to_text().contains("queue="));
        for bad in ["queue=x to_network\n", "queue=0\n", "queue=0 to_network packets\n", "queue=0 d packets=-1\n"] {
            let text = format!("kind=x\nengine=tunnel\n{bad}\n");
            assert!(Report::parse(&text).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn test_a_wireguard_endpoints_peers_round_trip() {
        let mut report = Report::of_tunnel(
            "wireguard",
            Engine::KeyedTunnel,
            "wg0",
            "wireguard",
            &crate::dataplane::tunnel::TunnelStats::default(),
            1.0,
        );
        let mut busy = PeerCounters::new("uBo0UWM53IC0Fn0JXqf2fvVHb3FNqpCs2qJX9rXzRXc=");
        (busy.rx_bytes, busy.tx_bytes, busy.drops, busy.latest_handshake) = (1_000, 2_000, 3, Some(1_764_000_000));
        busy.endpoint = Some("[2001:db8::1]:51820".into());
        busy.allowed_ips = vec!["10.0.0.2/32".into(), "fd00::2/128".into()];
        report.peers = vec![busy, PeerCounters::new("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")];
        let text = report.to_text();
        assert!(
            text.contains("\npeer=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= rx_bytes=0 tx_bytes=0 drops=0\n"),
            "{text}"
        );
        assert_eq!(Report::parse(&text).unwrap(), report);
        for bad in ["peer=\n", "peer=K rx_bytes=x\n", "peer=K drops\n"] {
            assert!(Report::parse(&format!("kind=x\nengine=tunnel\n{bad}\n")).is_err(), "{bad:?}");
        }
        let newer = "kind=x\nengine=tunnel\npeer=K rx_bytes=1 colour=blue\n\n";
        assert_eq!(Report::parse(newer).unwrap().peers[0].rx_bytes, 1);
    }

    #[test]
    fn test_report_parse_refuses_bad_input_and_skips_unknown_lines() {
        let text = sample().to_text();
        for (bad, why) in [
            ("", "ended early"),
            ("kind=x\n\n", "names no kind or engine"),
            ("kind=x\nengine=forwarder\npackets=1\n\n", "before any direction"),
            ("kind=x\nengine=forwarder\ndirection=d\npackets=-1\n\n", "not a count"),
            ("kind=x\nengine=warp\n\n", "unknown engine"),
            ("kind=x\nengine=forwarder\nseconds=NaN\n\n", "not a duration"),
            ("nonsense\n\n", "not a key=value line"),
        ] {
            let err = Report::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let newer = text.replacen("direction=a_to_b\n", "direction=a_to_b\nfuture_key=1\ndrop=warp_drive 3\n", 1);
        assert!(Report::parse(&newer).is_ok());
    }
}
