//! The bench's side of the `gso64` traffic: turbotun's load generator and sink (`turbotun::load`; one iperf3
//! UDP sender offers only ~200–380 kpps here), run as hidden modes of `turbotun bench` inside the run's
//! namespaces, each printing one JSON line that the bench reads back.
//!
//! The generator sends as fast as the kernel takes it, with UDP GSO (`UDP_SEGMENT`): one `send` of
//! `segments × len` bytes leaves the socket as one super-packet that the kernel (or an offload-capable TUN
//! reader) splits into `segments` datagrams of `len` bytes, so the offered rate is far above what the
//! forwarders carry. The sink asks for `UDP_GRO` and counts each datagram by its header (flow, sequence).
//!
//! The loss bench paces the generator (`--udp-rate`) without GSO; the echo bench runs both in one process
//! (`--udp-roundtrip`), the generator sending from a handle on the sink's socket so that the echo's answers
//! (addresses and ports swapped) come back to the sink.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use turbotun::load::{Generator, SinkBuilder};

/// The generator's report, as the hidden `--udp-gen` prints it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct GenReport {
    /// Datagrams handed to the kernel.
    pub sent: u64,
    /// Datagrams not sent (ENOBUFS, EAGAIN, ECONNREFUSED), each send that failed worth `segments`.
    pub send_errors: u64,
    pub seconds: f64,
    pub segments: u16,
    /// Datagrams the pacer released (`sent + send_errors`).
    #[serde(default)]
    pub attempted: u64,
    /// The rate asked for, datagrams per second (0: unlimited).
    #[serde(default)]
    pub rate_pps: u64,
}

impl GenReport {
    /// Datagrams the kernel took per second.
    pub(crate) fn pps(&self) -> f64 {
        self.sent as f64 / self.seconds.max(1e-9)
    }
}

/// The sink's report, as the hidden `--udp-sink` prints it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SinkReport {
    /// Datagrams received.
    pub packets: u64,
    pub bytes: u64,
    /// First to last datagram.
    pub seconds: f64,
    /// `recvmmsg` calls that returned data.
    pub reads: u64,
    pub gro: bool,
    /// Holes in the sequence numbers below the highest received (loss after the last arrival is the difference
    /// between the generator's `sent` and `packets`).
    #[serde(default)]
    pub lost: u64,
    #[serde(default)]
    pub reordered: u64,
    #[serde(default)]
    pub duplicated: u64,
    /// The sink socket's own drop counter (SO_RXQ_OVFL).
    #[serde(default)]
    pub socket_drops: u64,
}

impl SinkReport {
    /// Datagrams received per second, first to last.
    pub(crate) fn pps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.packets as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Both sides of one run of turbotun's generator: what the bench keeps of a `gso64`, loss or echo run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct LoadResult {
    pub gen: GenReport,
    pub sink: SinkReport,
}

fn generator(dest: SocketAddr, len: usize, segments: u16, rate: u64, secs: f64) -> Result<Generator> {
    let secs = Duration::try_from_secs_f64(secs).with_context(|| format!("duration {secs}"))?;
    Ok(Generator::new(dest).size(len).gso(segments.max(1)).rate(rate).duration(secs))
}

fn gen_report(r: &turbotun::load::GeneratorReport) -> GenReport {
    GenReport {
        sent: r.sent,
        send_errors: r.send_errors,
        seconds: r.seconds,
        segments: r.segments,
        attempted: r.attempted,
        rate_pps: r.rate_pps,
    }
}

/// Send `len`-byte datagrams to `dest` for `secs`, `segments` per send (1 = no GSO), at `rate` datagrams per
/// second (0: as fast as the kernel takes them).
pub(crate) fn generate(dest: SocketAddr, len: usize, segments: u16, rate: u64, secs: f64) -> Result<GenReport> {
    Ok(gen_report(&generator(dest, len, segments, rate, secs)?.run()?))
}

/// What `--udp-roundtrip` prints on a line of its own once the generator has sent its last datagram, before
/// the sink's wait for the last answers: the bench ends its measurement window there.
pub(crate) const SENT_LINE: &str = "sent";

/// Load toward an echo at `dest` and count its answers: a sink on the wildcard address, and the generator
/// sending from a handle on the sink's socket (connected to `dest`, so the answers, addresses and ports
/// swapped, arrive at the sink and nothing else does). `sent` runs when the generator is done. The sink stops
/// `idle` after the last answer, or `idle` after the generator if none came.
pub(crate) fn roundtrip(
    dest: SocketAddr,
    len: usize,
    segments: u16,
    rate: u64,
    secs: f64,
    idle: Duration,
    sent: impl FnOnce(),
) -> Result<LoadResult> {
    let any: SocketAddr = if dest.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse()?;
    let max = Duration::try_from_secs_f64(secs).with_context(|| format!("duration {secs}"))? + idle;
    let sink = SinkBuilder::new(any).gro(true).idle_timeout(idle).duration(max).bind()?;
    let socket = sink.try_clone_socket()?;
    let receiving = std::thread::spawn(move || sink.run());
    let generated = generator(dest, len, segments, rate, secs)?.socket(socket).run();
    sent();
    let received = receiving.join().map_err(|_| anyhow::anyhow!("the sink thread panicked"))??;
    Ok(LoadResult { gen: gen_report(&generated?), sink: sink_report(&received) })
}

/// Receive on `addr` until `idle` passes without a datagram after the first one, or `max` in total.
pub(crate) fn sink(addr: SocketAddr, idle: Duration, max: Duration) -> Result<SinkReport> {
    let r = SinkBuilder::new(addr).gro(true).idle_timeout(idle).duration(max).bind()?.run()?;
    Ok(sink_report(&r))
}

fn sink_report(r: &turbotun::load::SinkReport) -> SinkReport {
    SinkReport {
        packets: r.datagrams,
        bytes: r.bytes,
        seconds: r.seconds,
        reads: r.reads,
        gro: r.gro,
        lost: r.lost,
        reordered: r.reordered,
        duplicated: r.duplicated,
        socket_drops: r.socket_drops,
    }
}

/// Results of one generator run in iperf3's terms.
pub(crate) fn to_result(g: &GenReport, s: &SinkReport) -> super::iperf::IperfResult {
    let secs = g.seconds.max(1e-9);
    let lost = g.sent.saturating_sub(s.packets);
    super::iperf::IperfResult {
        gbps: s.bytes as f64 * 8.0 / secs / 1e9,
        sender_gbps: 0.0,
        udp_packets: Some(g.sent),
        udp_lost: Some(lost),
        udp_received: Some(s.packets.min(g.sent)),
        udp_lost_percent: Some(if g.sent > 0 { lost as f64 * 100.0 / g.sent as f64 } else { 0.0 }),
        seconds: g.seconds,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_gso_gen_and_gro_sink() {
        // Runs in the test's own namespace on 127.0.0.1 (no privileges needed; loopback only).
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let h = std::thread::spawn(move || sink(addr, Duration::from_millis(300), Duration::from_secs(5)).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        let g = generate(addr, 64, 16, 0, 0.2).unwrap();
        let s = h.join().unwrap();
        assert!(g.sent > 0 && g.sent % 16 == 0, "{g:?}");
        assert!(s.packets > 0 && s.packets <= g.sent, "{s:?} {g:?}");
        assert_eq!(s.bytes, s.packets * 64);
        assert_eq!(s.duplicated, 0, "{s:?}");
        assert!(s.packets + s.lost <= g.sent, "{s:?} {g:?}");
        let r = to_result(&g, &s);
        assert_eq!(r.udp_received.unwrap() + r.udp_lost.unwrap(), g.sent);
        assert!(r.rx_kpps().unwrap() > 0.0);
    }

    /// `--udp-roundtrip` says `sent` when the generator is done, before the sink's wait for the last answers:
    /// the bench's CPU window ends there, so that wait (`idle` at least) is never counted as traffic.
    #[test]
    fn roundtrip_says_sent_before_the_sinks_idle_wait() {
        // An echo on 127.0.0.1 of the test's own namespace (no privileges needed; loopback only).
        let echo = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        echo.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let echo_addr = echo.local_addr().unwrap();
        let echoing = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = echo.recv_from(&mut buf) {
                echo.send_to(&buf[..n], from).unwrap();
            }
        });
        let idle = Duration::from_millis(300);
        let mut sent_at = None;
        let r = roundtrip(echo_addr, 64, 1, 2000, 0.2, idle, || sent_at = Some(std::time::Instant::now())).unwrap();
        let returned = std::time::Instant::now();
        echoing.join().unwrap();
        let sent_at = sent_at.expect("`sent` was said");
        assert!(returned - sent_at >= idle, "the sink's idle wait came after `sent`: {:?}", returned - sent_at);
        assert!(r.gen.sent > 0 && r.sink.packets == r.gen.sent, "{r:?}");
    }

    #[test]
    fn report_mapping() {
        let g = GenReport { sent: 1000, send_errors: 0, seconds: 2.0, segments: 64, ..Default::default() };
        let s = SinkReport { packets: 600, bytes: 600 * 64, seconds: 1.9, reads: 10, gro: true, ..Default::default() };
        let r = to_result(&g, &s);
        assert_eq!((r.udp_received, r.udp_lost), (Some(600), Some(400)));
        assert_eq!(r.udp_lost_percent, Some(40.0));
        assert!((r.rx_kpps().unwrap() - 0.3).abs() < 1e-12);
    }
}
