//! A small, fast UDP generator and sink (one iperf3 UDP sender offers only ~200–380 kpps here).
//!
//! The generator sends with UDP GSO (`UDP_SEGMENT`): one `send` of `segments × len` bytes leaves the socket as
//! one super-packet that the kernel (or an offload-capable TUN reader) splits into `segments` datagrams of
//! `len` bytes, so the offered rate is far above what the forwarders carry. The sink enables `UDP_GRO` and
//! counts datagrams as bytes / len (every datagram has the same length). Both run as hidden modes of
//! `turbotun bench` inside the run's namespaces and print one JSON line.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::socket::{setsockopt, sockopt};
use serde::{Deserialize, Serialize};

/// The generator's report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenReport {
    /// Datagrams handed to the kernel.
    pub sent: u64,
    /// `send` calls that failed (ENOBUFS and the like), each worth `segments` datagrams not sent.
    pub send_errors: u64,
    pub seconds: f64,
    pub segments: u16,
}

/// The sink's report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SinkReport {
    pub packets: u64,
    pub bytes: u64,
    /// First to last datagram.
    pub seconds: f64,
    /// `recv` calls (fewer than packets when UDP GRO coalesced them).
    pub reads: u64,
    pub gro: bool,
}

/// Send `len`-byte datagrams to `dest` for `secs`, `segments` per send (1 = no GSO).
pub fn generate(dest: SocketAddr, len: usize, segments: u16, secs: f64) -> Result<GenReport> {
    let bind: SocketAddr = if dest.is_ipv6() { "[::]:0".parse()? } else { "0.0.0.0:0".parse()? };
    let sock = UdpSocket::bind(bind).context("bind generator socket")?;
    sock.connect(dest).with_context(|| format!("connect to {dest}"))?;
    let segments = segments.max(1);
    if segments > 1 {
        let gso = i32::try_from(len).context("datagram length")?;
        setsockopt(&sock, sockopt::UdpGsoSegment, &gso).context("UDP_SEGMENT (UDP GSO) not supported")?;
    }
    let mut buf = vec![0u8; len * usize::from(segments)];
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut r = GenReport { segments, ..Default::default() };
    let mut seq: u64 = 0;
    loop {
        // A sequence number at the head of the first datagram of each send (for eyeballing captures).
        buf[..8].copy_from_slice(&seq.to_be_bytes());
        seq += 1;
        match sock.send(&buf) {
            Ok(_) => r.sent += u64::from(segments),
            // ICMP port unreachable from before the sink bound, queue full: count and go on.
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::WouldBlock) => r.send_errors += 1,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => r.send_errors += 1,
            Err(e) => return Err(e).context("send"),
        }
        if seq % 16 == 0 && Instant::now() >= end {
            break;
        }
    }
    r.seconds = start.elapsed().as_secs_f64();
    Ok(r)
}

/// Receive on `addr` until `idle` passes without a datagram after the first one, or `max` in total.
pub fn sink(addr: SocketAddr, len: usize, idle: Duration, max: Duration) -> Result<SinkReport> {
    let sock = UdpSocket::bind(addr).with_context(|| format!("bind sink to {addr}"))?;
    let gro = setsockopt(&sock, sockopt::UdpGroSegment, &true).is_ok();
    // A deep receive queue (root may exceed rmem_max): the sink should not be where datagrams are lost.
    let _ = setsockopt(&sock, sockopt::RcvBufForce, &(8 << 20));
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut buf = vec![0u8; 65536];
    let start = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last = start;
    let mut r = SinkReport { gro, ..Default::default() };
    loop {
        match sock.recv(&mut buf) {
            Ok(n) => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                r.reads += 1;
                r.bytes += n as u64;
                r.packets += n.div_ceil(len.max(1)) as u64;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(e).context("recv"),
        }
        let now = Instant::now();
        if (first.is_some() && now - last >= idle) || now - start >= max {
            break;
        }
    }
    r.seconds = first.map(|f| (last - f).as_secs_f64()).unwrap_or(0.0);
    Ok(r)
}

/// Results of one generator run in iperf3's terms.
pub fn to_result(g: &GenReport, s: &SinkReport) -> super::iperf::IperfResult {
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
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let h = std::thread::spawn(move || sink(addr, 64, Duration::from_millis(300), Duration::from_secs(5)).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        let g = generate(addr, 64, 16, 0.2).unwrap();
        let s = h.join().unwrap();
        assert!(g.sent > 0 && g.sent % 16 == 0, "{g:?}");
        assert!(s.packets > 0 && s.packets <= g.sent, "{s:?} {g:?}");
        assert_eq!(s.bytes, s.packets * 64);
        let r = to_result(&g, &s);
        assert_eq!(r.udp_received.unwrap() + r.udp_lost.unwrap(), g.sent);
        assert!(r.rx_kpps().unwrap() > 0.0);
    }

    #[test]
    fn report_mapping() {
        let g = GenReport { sent: 1000, send_errors: 0, seconds: 2.0, segments: 64 };
        let s = SinkReport { packets: 600, bytes: 600 * 64, seconds: 1.9, reads: 10, gro: true };
        let r = to_result(&g, &s);
        assert_eq!((r.udp_received, r.udp_lost), (Some(600), Some(400)));
        assert_eq!(r.udp_lost_percent, Some(40.0));
        assert!((r.rx_kpps().unwrap() - 0.3).abs() < 1e-12);
    }
}
