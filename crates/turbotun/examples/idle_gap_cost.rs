//! What reading a batch to the end costs and what it saves, on this machine (BENCHMARKS.md, "Reading after an
//! idle gap"): run as root, `cargo run --release -p turbotun --example idle_gap_cost`. Everything happens in a
//! private network namespace of its own, which goes away with the program.
//!
//! - A read that finds the queue empty, which is what a batch pays when its further read finds nothing (the reader
//!   once skipped those reads for up to 16 batches after one came back empty).
//! - A burst of 8 datagrams of 1200 bytes into a TUN device, to a socket on it: written as 8 plain writes (what a
//!   burst read one datagram per batch becomes) or as one coalesced write (a burst read in one batch).

use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use turbotun::batch::{Batch, RecvBatch, SendBatch};
use turbotun::{DeviceBuilder, Offloads};
use turbotun_wire::{checksum, ipv4, udp, IPPROTO_UDP};

const HDR: usize = 10;
const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const PORT: u16 = 7001;

/// Datagram `i` of a burst from the peer to the socket: 1200 bytes of payload, every checksum right.
fn datagram(i: u8) -> Vec<u8> {
    let payload = [i; 1200];
    let udp_len = udp::HEADER_LEN + payload.len();
    let mut p = vec![0u8; ipv4::MIN_HEADER_LEN + udp_len];
    let ip = ipv4::Repr {
        src: PEER.octets(),
        dst: LOCAL.octets(),
        protocol: IPPROTO_UDP,
        payload_len: udp_len as u16,
        ttl: 64,
        tos: 0,
        ident: u16::from(i),
        dont_frag: true,
    };
    ip.emit(&mut p).expect("room for the IPv4 header");
    let l4 = &mut p[ipv4::MIN_HEADER_LEN..];
    udp::Repr { src_port: 4000, dst_port: PORT, payload_len: payload.len() as u16 }
        .emit(l4)
        .expect("room for the UDP header");
    l4[udp::HEADER_LEN..].copy_from_slice(&payload);
    let pseudo = checksum::pseudo_header_v4(PEER.octets(), LOCAL.octets(), IPPROTO_UDP, udp_len as u32);
    let sum = checksum::checksum(l4, pseudo);
    l4[6..8].copy_from_slice(&(if sum == 0 { 0xffff } else { sum }).to_be_bytes());
    p
}

fn measure() -> Result<(), Box<dyn std::error::Error>> {
    let name = format!("ttidle{}", std::process::id() % 100_000);
    let dev = DeviceBuilder::tun().name(&name).vnet_hdr(HDR).offloads(Offloads::ALL).nonblocking(true).open()?;
    let mut nl = turbotun::netlink::Netlink::new()?;
    nl.add_address(&name, LOCAL.into(), 24)?;
    nl.set_up(&name, true)?;
    let q = &dev.queues()[0];

    // A batch's read of an empty queue.
    let mut rx = RecvBatch::new(q);
    let mut bufs = vec![vec![0u8; HDR + 65535]; 2];
    let mut lens = [0usize; 2];
    let calls = 1_000_000u32;
    let start = Instant::now();
    for _ in 0..calls {
        // Would-block every time: nothing is routed into the device.
        let _ = rx.try_recv_many(&mut Batch::new(&mut bufs, &mut lens, HDR));
    }
    let per_read = start.elapsed().as_nanos() as f64 / f64::from(calls);
    println!("a read that finds the queue empty: {per_read:.0} ns");

    // A burst of 8, written plain or coalesced; the socket takes every datagram before the next burst.
    let sock = UdpSocket::bind((LOCAL, PORT))?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut tx = SendBatch::new(q);
    let burst: Vec<Vec<u8>> = (0..8).map(datagram).collect();
    let mut answer = [0u8; 2048];
    for coalesced in [false, true, false, true] {
        let rounds = 20_000u32;
        let mut spent = Duration::ZERO;
        for _ in 0..rounds {
            let mut bufs: Vec<Vec<u8>> = burst
                .iter()
                .map(|p| {
                    let mut b = vec![0u8; HDR + 65535];
                    b[HDR..HDR + p.len()].copy_from_slice(p);
                    b
                })
                .collect();
            let mut lens: Vec<usize> = burst.iter().map(Vec::len).collect();
            let start = Instant::now();
            if coalesced {
                tx.send_many(&mut Batch::new(&mut bufs, &mut lens, HDR), true)?;
            } else {
                for i in 0..burst.len() {
                    tx.send_many(&mut Batch::new(&mut bufs[i..i + 1], &mut lens[i..i + 1], HDR), true)?;
                }
            }
            spent += start.elapsed();
            for i in 0..burst.len() {
                let n = sock.recv(&mut answer).map_err(|e| format!("datagram {i} of a burst: {e}"))?;
                assert_eq!(n, 1200, "datagram {i} of a burst arrives whole");
            }
        }
        let how = if coalesced { "one coalesced write" } else { "8 plain writes" };
        println!("a burst of 8 datagrams as {how}: {:.1} us", spent.as_secs_f64() * 1e6 / f64::from(rounds));
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    turbotun::netns::with_private_netns(|| measure().map_err(|e| e.to_string()))??;
    Ok(())
}
