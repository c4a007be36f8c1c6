//! The handshake flood of the tunnel bench's `-flood` kinds, and of the tests that attack `turbotun wg`: WireGuard
//! handshake initiations with random content and a valid mac1, sent as fast as one thread can from one or
//! several source addresses. A valid mac1 takes nothing but the server's public key, so anyone can make these:
//! they pass the MAC check and cost the server its handshake work (or, under load, a cookie reply) before they
//! fail. Run as the hidden `turbotun bench --wg-flood ADDR:PORT` inside the flooding namespace; prints one JSON
//! line when its time is up or when it gets SIGTERM/SIGINT.
//!
//! Each source is a socket bound to its address and connected to the server; the sender takes them in turn, one
//! `sendmmsg` of [`BATCH`] initiations each, from a pool of [`POOL`] distinct messages.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use turbotun_wg::message::{self, Initiation, INITIATION_LEN};

/// Initiations per `sendmmsg`.
const BATCH: usize = 64;
/// Distinct initiations sent in turn (the server keeps no memory of junk, so a few hundred are as good as new).
const POOL: usize = 256;

/// What the flood generator prints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct FloodReport {
    /// Initiations the kernel took.
    pub sent: u64,
    /// Initiations whose send failed (ENOBUFS, ECONNREFUSED after an ICMP error, ...).
    pub send_errors: u64,
    pub seconds: f64,
    /// Source addresses the initiations came from.
    pub sources: usize,
}

impl FloodReport {
    /// Initiations the kernel took per second.
    pub(crate) fn pps(&self) -> f64 {
        self.sent as f64 / self.seconds.max(1e-9)
    }
}

/// A WireGuard public key in the base64 `wg` shows.
pub(crate) fn parse_public_key(text: &str) -> Result<[u8; 32]> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .with_context(|| format!("WireGuard public key {text:?} is not base64"))?;
    match <[u8; 32]>::try_from(bytes.as_slice()) {
        Ok(key) => Ok(key),
        Err(_) => bail!("WireGuard public key {text:?} is {} bytes, not 32", bytes.len()),
    }
}

/// `count` initiations with random content and a valid mac1 for `server_public`, back to back.
pub(crate) fn forged_initiations(server_public: &[u8; 32], count: usize) -> Vec<u8> {
    let mac1_key = message::mac1_key(server_public);
    let mut out = Vec::with_capacity(count * INITIATION_LEN);
    for _ in 0..count {
        let mut m = [0u8; INITIATION_LEN];
        let mut initiation = Initiation::start(&mut m);
        initiation.set_sender(fastrand::u32(..));
        fastrand::fill(initiation.ephemeral_mut());
        fastrand::fill(initiation.sealed_static_mut());
        fastrand::fill(initiation.sealed_timestamp_mut());
        message::set_mac1(&mut m, &mac1_key);
        out.extend_from_slice(&m);
    }
    out
}

/// Floods `dest` from each of `sources` in turn (none: from the wildcard address) until `secs` have passed or
/// `stop` is set, at `rate` initiations a second (0: as fast as the kernel takes them).
pub(crate) fn flood(
    dest: SocketAddr,
    server_public: &[u8; 32],
    sources: &[IpAddr],
    rate: u64,
    secs: f64,
    stop: &AtomicBool,
) -> Result<FloodReport> {
    let wildcard: IpAddr = if dest.is_ipv6() { "::".parse()? } else { "0.0.0.0".parse()? };
    let from = if sources.is_empty() { vec![wildcard] } else { sources.to_vec() };
    let mut sockets = Vec::with_capacity(from.len());
    for addr in &from {
        let s = UdpSocket::bind((*addr, 0)).with_context(|| format!("bind a flood socket to {addr}"))?;
        s.connect(dest).with_context(|| format!("connect the flood socket from {addr} to {dest}"))?;
        sockets.push(s);
    }
    // The pool, with its first batch again at the end, so that any of its positions starts a whole batch.
    let mut pool = forged_initiations(server_public, POOL);
    pool.extend_from_within(..BATCH * INITIATION_LEN);
    let limit = Duration::try_from_secs_f64(secs).with_context(|| format!("duration {secs}"))?;
    let start = Instant::now();
    let (mut sent, mut send_errors, mut at) = (0u64, 0u64, 0usize);
    'flood: loop {
        for s in &sockets {
            if stop.load(Ordering::Relaxed) || start.elapsed() >= limit {
                break 'flood;
            }
            let batch = &pool[at * INITIATION_LEN..(at + BATCH) * INITIATION_LEN];
            match turbotun::udp::send_equal(s, batch, INITIATION_LEN, BATCH) {
                Ok(n) => {
                    sent += n as u64;
                    send_errors += (BATCH - n) as u64;
                }
                // The flood goes on through full buffers and ICMP errors: it counts them and tries again.
                Err(_) => send_errors += BATCH as u64,
            }
            at = (at + BATCH) % POOL;
            if rate > 0 {
                // Paced by batch: the next one leaves when the rate says the ones so far were due.
                let due = Duration::from_secs_f64((sent + send_errors) as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait.min(limit.saturating_sub(start.elapsed())));
                }
            }
        }
    }
    Ok(FloodReport { sent, send_errors, seconds: start.elapsed().as_secs_f64(), sources: sockets.len() })
}

/// The hidden `--wg-flood`: floods until `secs` have passed or SIGTERM/SIGINT, then prints the report.
pub(crate) fn run(dest: SocketAddr, key: Option<&str>, sources: &[IpAddr], rate: u64, secs: u64) -> Result<()> {
    let Some(key) = key else { bail!("--wg-flood needs --wg-flood-key (the server's public key, base64)") };
    let public = parse_public_key(key)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let report = flood(dest, &public, sources, rate, secs as f64, &stop)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use blake2::digest::consts::U16;
    use blake2::digest::{FixedOutput, KeyInit, Update};
    use blake2::{Blake2s256, Blake2sMac, Digest};
    use turbotun_wg::message::field::initiation;

    #[test]
    fn initiations_carry_a_valid_mac1_and_random_content() {
        let public = [7u8; 32];
        let pool = forged_initiations(&public, 3);
        // mac1 as the protocol defines it, computed here on its own (keyed BLAKE2s-128 whose key is
        // BLAKE2s-256("mac1----" || public)), not by the code that wrote the messages.
        let key: [u8; 32] = Blake2s256::new().chain_update(b"mac1----").chain_update(public).finalize().into();
        let messages: Vec<&[u8]> = pool.chunks(INITIATION_LEN).collect();
        assert_eq!(messages.len(), 3);
        for m in &messages {
            assert_eq!(m[..4], [1, 0, 0, 0]);
            let mut mac = <Blake2sMac<U16> as KeyInit>::new_from_slice(&key).unwrap();
            mac.update(&m[..initiation::MAC1.start]);
            let expected: [u8; 16] = mac.finalize_fixed().into();
            assert_eq!(m[initiation::MAC1], expected);
            assert_eq!(m[initiation::MAC2], [0u8; 16], "no mac2: the flooder has no cookie");
        }
        assert_ne!(
            messages[0][initiation::EPHEMERAL],
            messages[1][initiation::EPHEMERAL],
            "each its own ephemeral key"
        );
    }

    #[test]
    fn keys_are_checked() {
        let key = parse_public_key("HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=").unwrap();
        assert_eq!(key[0], 0x1c);
        assert!(parse_public_key("not base64!").unwrap_err().to_string().contains("not base64"));
        assert!(parse_public_key("AAAA").unwrap_err().to_string().contains("3 bytes, not 32"));
    }

    #[test]
    fn floods_loopback_for_its_time() {
        // Loopback only, in the test's own namespace: a receiver on 127.0.0.1 takes what it can.
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stop = AtomicBool::new(false);
        let r = flood(sink.local_addr().unwrap(), &[1; 32], &["127.0.0.1".parse().unwrap()], 0, 0.2, &stop).unwrap();
        assert!(r.sent > 0 && r.sources == 1, "{r:?}");
        let mut buf = [0u8; 256];
        let (n, _) = sink.recv_from(&mut buf).unwrap();
        assert_eq!((n, buf[0]), (INITIATION_LEN, 1));
        stop.store(true, Ordering::Relaxed);
        let stopped = flood(sink.local_addr().unwrap(), &[1; 32], &[], 0, 60.0, &stop).unwrap();
        assert_eq!(stopped.sent, 0, "a set stop flag ends it before the first batch");
        stop.store(false, Ordering::Relaxed);
        let paced = flood(sink.local_addr().unwrap(), &[1; 32], &[], 640, 0.5, &stop).unwrap();
        // 640 a second for half a second, in batches of 64: five or six batches, never the unpaced thousands.
        assert!(paced.sent + paced.send_errors <= 7 * 64, "{paced:?}");
    }
}
