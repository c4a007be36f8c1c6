//! Traffic kinds (iperf3 client arguments) and parsing of iperf3's `-J` output.

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

/// One kind of traffic the bench offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Traffic {
    pub label: &'static str,
    pub description: &'static str,
    pub udp: bool,
    pub streams: u32,
    /// UDP payload length (`-l`).
    pub payload: u32,
    /// 0: iperf3. N > 0: turbotun's own UDP generator (N datagrams per GSO send; 1 = no GSO) and GRO sink.
    pub gso: u16,
    /// turbotun's generator only: datagrams per second offered (0: as fast as the kernel takes them).
    pub rate: u64,
}

/// TCP, one stream: the forwarding and the tunnel benches' first traffic kind.
pub(crate) const TCP_ONE_STREAM: Traffic = Traffic {
    label: "tcp",
    description: "TCP, one stream, -C cubic",
    udp: false,
    streams: 1,
    payload: 0,
    gso: 0,
    rate: 0,
};

/// TCP, four streams.
pub(crate) const TCP_FOUR_STREAMS: Traffic = Traffic {
    label: "tcp4",
    description: "TCP, four streams (-P 4), -C cubic",
    udp: false,
    streams: 4,
    payload: 0,
    gso: 0,
    rate: 0,
};

/// Every traffic kind, in report order. Adding one is one entry.
pub(crate) const TRAFFIC: &[Traffic] = &[
    TCP_ONE_STREAM,
    TCP_FOUR_STREAMS,
    Traffic {
        label: "udp64",
        description: "UDP, 64-byte payload, unlimited rate (-b 0)",
        udp: true,
        streams: 1,
        payload: 64,
        gso: 0,
        rate: 0,
    },
    Traffic {
        label: "udp1400",
        description: "UDP, 1400-byte payload, unlimited rate (-b 0)",
        udp: true,
        streams: 1,
        payload: 1400,
        gso: 0,
        rate: 0,
    },
    Traffic {
        label: "gso64",
        description: "UDP, 64-byte datagrams from turbotun's generator (UDP GSO, 64 per send) to a UDP GRO sink",
        udp: true,
        streams: 1,
        payload: 64,
        gso: 64,
        rate: 0,
    },
];

pub(crate) fn traffic_by_label(label: &str) -> Option<Traffic> {
    TRAFFIC.iter().copied().find(|t| t.label == label)
}

impl Traffic {
    /// iperf3 client arguments (after `iperf3`).
    pub(crate) fn client_args(&self, server: &str, duration: u64, ipv6: bool) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "-c".into(),
            server.into(),
            "-t".into(),
            duration.to_string(),
            "-J".into(),
            "--connect-timeout".into(),
            "3000".into(),
        ];
        if ipv6 {
            a.push("-6".into());
        }
        if self.udp {
            a.extend(["-u", "-b", "0", "-l"].map(String::from));
            a.push(self.payload.to_string());
        } else {
            a.extend(["-C", "cubic"].map(String::from));
        }
        if self.streams > 1 {
            a.push("-P".into());
            a.push(self.streams.to_string());
        }
        a
    }
}

/// What one iperf3 client run reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub(crate) struct IperfResult {
    /// Receiver-side goodput.
    pub gbps: f64,
    /// Sender-side goodput.
    pub sender_gbps: f64,
    /// TCP retransmits (sender).
    pub retransmits: Option<u64>,
    pub sender_cc: Option<String>,
    pub receiver_cc: Option<String>,
    /// UDP: datagrams sent, lost, lost %, received.
    pub udp_packets: Option<u64>,
    pub udp_lost: Option<u64>,
    pub udp_lost_percent: Option<f64>,
    pub udp_received: Option<u64>,
    /// Length of the measurement window as seen by the receiver, seconds.
    pub seconds: f64,
}

impl IperfResult {
    pub(crate) fn rx_kpps(&self) -> Option<f64> {
        Some(self.udp_received? as f64 / self.seconds.max(1e-9) / 1000.0)
    }

    pub(crate) fn lost_kpps(&self) -> Option<f64> {
        Some(self.udp_lost? as f64 / self.seconds.max(1e-9) / 1000.0)
    }
}

fn u(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_f64().map(|f| f.max(0.0) as u64))
}

/// Parse the JSON an iperf3 3.x client prints with `-J`.
pub(crate) fn parse_client_json(text: &str) -> Result<IperfResult> {
    let v: Value = serde_json::from_str(text.trim()).context("iperf3 output is not JSON")?;
    if let Some(err) = v.get("error").and_then(Value::as_str) {
        bail!("iperf3: {err}");
    }
    let end = v.get("end").ok_or_else(|| anyhow!("iperf3 JSON has no 'end' section"))?;
    let udp = v
        .pointer("/start/test_start/protocol")
        .and_then(Value::as_str)
        .map(|p| p.eq_ignore_ascii_case("UDP"))
        .unwrap_or_else(|| end.get("sum").is_some_and(|s| s.get("lost_packets").is_some()));
    let recv = end
        .get("sum_received")
        .or_else(|| end.get("sum"))
        .ok_or_else(|| anyhow!("iperf3 JSON has no receiver summary"))?;
    let sent = end.get("sum_sent").or_else(|| end.get("sum")).unwrap_or(recv);
    let bps = |s: &Value| s.get("bits_per_second").and_then(Value::as_f64).unwrap_or(0.0);
    let mut r = IperfResult {
        gbps: bps(recv) / 1e9,
        sender_gbps: bps(sent) / 1e9,
        seconds: recv.get("seconds").and_then(Value::as_f64).unwrap_or(0.0),
        sender_cc: end.get("sender_tcp_congestion").and_then(Value::as_str).map(String::from),
        receiver_cc: end.get("receiver_tcp_congestion").and_then(Value::as_str).map(String::from),
        ..Default::default()
    };
    if udp {
        // iperf3 >= 3.10 fills sum_received with the receiver's view: `packets` is the datagrams the receiver
        // accounted for (received + lost, by sequence number).
        let packets = recv.get("packets").and_then(u).unwrap_or(0);
        let lost = recv.get("lost_packets").and_then(u).unwrap_or(0);
        r.udp_packets = Some(packets);
        r.udp_lost = Some(lost);
        r.udp_received = Some(packets.saturating_sub(lost));
        r.udp_lost_percent = Some(if packets > 0 { lost as f64 * 100.0 / packets as f64 } else { 0.0 });
    } else {
        r.retransmits = sent.get("retransmits").and_then(u);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = include_str!("../tests/fixtures/iperf3_tcp.json");
    const TCP4: &str = include_str!("../tests/fixtures/iperf3_tcp_p4.json");
    const UDP: &str = include_str!("../tests/fixtures/iperf3_udp64.json");

    #[test]
    fn tcp_one_stream() {
        let r = parse_client_json(TCP).unwrap();
        assert!((r.gbps - 28.352_320_021_368_78).abs() < 1e-9, "{}", r.gbps);
        assert!((r.sender_gbps - 28.477_387_697_636_56).abs() < 1e-9);
        assert_eq!(r.retransmits, Some(0));
        assert_eq!(r.sender_cc.as_deref(), Some("cubic"));
        assert_eq!(r.receiver_cc.as_deref(), Some("cubic"));
        assert_eq!(r.udp_packets, None);
        assert_eq!(r.rx_kpps(), None);
    }

    #[test]
    fn tcp_four_streams_uses_sums() {
        let r = parse_client_json(TCP4).unwrap();
        assert!((r.gbps - 21.287_418_794_941_73).abs() < 1e-9);
        assert_eq!(r.retransmits, Some(0));
    }

    #[test]
    fn udp_small() {
        let r = parse_client_json(UDP).unwrap();
        assert_eq!(r.udp_packets, Some(227968));
        assert_eq!(r.udp_lost, Some(123295));
        assert_eq!(r.udp_received, Some(227968 - 123295));
        assert!((r.udp_lost_percent.unwrap() - 54.0843).abs() < 1e-3);
        assert!((r.gbps - 0.053_420_455_293_045_8).abs() < 1e-12);
        assert!((r.rx_kpps().unwrap() - 104.337).abs() < 0.01, "{:?}", r.rx_kpps());
        assert_eq!(r.retransmits, None);
        assert_eq!(r.sender_cc, None);
    }

    #[test]
    fn error_and_garbage() {
        let e = parse_client_json(
            r#"{"start":{},"intervals":[],"end":{},"error":"unable to connect to server: Connection refused"}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("Connection refused"), "{e}");
        assert!(parse_client_json("iperf3: error").is_err());
        assert!(parse_client_json("{}").is_err());
    }

    #[test]
    fn client_args() {
        let t = traffic_by_label("udp64").unwrap();
        let a = t.client_args("10.0.2.1", 3, false).join(" ");
        assert!(a.contains("-u -b 0 -l 64"), "{a}");
        assert!(!a.contains("cubic"));
        let t = traffic_by_label("tcp4").unwrap();
        let a = t.client_args("fd00:2::1", 10, true).join(" ");
        assert!(a.contains("-C cubic") && a.contains("-P 4") && a.contains("-6") && a.contains("-t 10"), "{a}");
    }
}
