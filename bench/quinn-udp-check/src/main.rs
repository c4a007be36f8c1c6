//! Runs quinn-udp 0.6.3 over loopback through the cases a tunnel's socket layer meets, and prints what came
//! out: segmented sends with an ECN value and what the receiver sees of it, more segments than the kernel takes,
//! and what a refused send leaves behind. `cargo run --release` (loopback only).

use std::io::IoSliceMut;
use std::net::UdpSocket;

use quinn_udp::{EcnCodepoint, RecvMeta, Transmit, UdpSocketState, BATCH_SIZE};

/// Everything the receiver has now: per message, its length, segment size and ECN value.
fn receive(rx: &UdpSocket, state: &UdpSocketState) -> Vec<(usize, usize, Option<EcnCodepoint>)> {
    let mut storage = vec![0u8; 65536 * BATCH_SIZE];
    let mut bufs: Vec<IoSliceMut<'_>> = storage.chunks_mut(65536).map(IoSliceMut::new).collect();
    let mut meta = [RecvMeta::default(); BATCH_SIZE];
    let mut seen = Vec::new();
    loop {
        let mut fds = [rustix::event::PollFd::new(rx, rustix::event::PollFlags::IN)];
        let timeout = rustix::event::Timespec { tv_sec: 0, tv_nsec: 200_000_000 };
        if rustix::event::poll(&mut fds, Some(&timeout)).unwrap_or(0) == 0 {
            return seen;
        }
        match state.recv(rx.into(), &mut bufs, &mut meta) {
            Ok(n) => seen.extend(meta[..n].iter().map(|m| (m.len, m.stride, m.ecn))),
            Err(_) => return seen,
        }
    }
}

fn case(label: &str, tx: (&UdpSocket, &UdpSocketState), rx: (&UdpSocket, &UdpSocketState), seg: usize, n: usize, ecn: Option<EcnCodepoint>) {
    let contents = vec![0xab_u8; seg * n];
    let t = Transmit { destination: rx.0.local_addr().unwrap(), ecn, contents: &contents, segment_size: Some(seg), src_ip: None };
    let sent = tx.1.try_send(tx.0.into(), &t);
    let got = receive(rx.0, rx.1);
    println!("{label}: {n} x {seg} bytes, ecn {ecn:?}: send {sent:?}; max_gso_segments now {}; received (len, stride, ecn) {got:?}", tx.1.max_gso_segments());
}

fn main() {
    let (tx, rx) = (UdpSocket::bind("127.0.0.1:0").unwrap(), UdpSocket::bind("127.0.0.1:0").unwrap());
    let (ts, rs) = (UdpSocketState::new((&tx).into()).unwrap(), UdpSocketState::new((&rx).into()).unwrap());
    let pmtud = rustix::net::sockopt::ip_mtu_discover(&tx).map(|v| format!("{v:?}")).unwrap_or_default();
    println!("after UdpSocketState::new: IP_MTU_DISCOVER {pmtud} (PROBE: DF on every datagram, never fragmented)");
    case("A: one segmented send, ECT(0)", (&tx, &ts), (&rx, &rs), 1000, 10, Some(EcnCodepoint::Ect0));
    case("B: one datagram, ECT(1)", (&tx, &ts), (&rx, &rs), 1000, 1, Some(EcnCodepoint::Ect1));
    case("C: 130 segments (the kernel takes 128 at most)", (&tx, &ts), (&rx, &rs), 400, 130, None);
    case("D: after C, a segmented send, ECT(0)", (&tx, &ts), (&rx, &rs), 1000, 10, Some(EcnCodepoint::Ect0));
    case("E: after C, one datagram, ECT(0)", (&tx, &ts), (&rx, &rs), 1000, 1, Some(EcnCodepoint::Ect0));
    // The deprecated send turns every error but would-block into Ok.
    let contents = vec![0u8; 400 * 130];
    let t = Transmit { destination: rx.local_addr().unwrap(), ecn: None, contents: &contents, segment_size: Some(400), src_ip: None };
    #[allow(deprecated)]
    let sent = ts.send((&tx).into(), &t);
    println!("F: deprecated send of 130 segments: {sent:?}; received {:?}", receive(&rx, &rs));
}
