//! The `get=1` half of WireGuard's userspace configuration protocol: the configuration in force and what the
//! tunnel learned at run time (endpoints, the last handshake, byte counts), as `wg show` reads them.

use std::fmt::Write as _;
use std::io;
use std::time::SystemTime;

use zeroize::Zeroizing;

use crate::config::{Key, SecretKey};
use crate::wireguard::WireGuard;

/// How much of a reply is made before it is written: the buffer is made this big at once and never grows, so
/// that no reallocation leaves a copy of a key behind.
const PART_BYTES: usize = 64 << 10;

/// The text of a `get=1` reply (without the `errno=0` line and the empty line that end it), given to `write` a
/// part at a time as it is made, so that a reply of a million peers needs no room for all of it. It holds the
/// private and preshared keys: the part's buffer is zeroed when dropped. Returns false (and stops) when `write`
/// does.
pub(crate) fn render_get(wg: &WireGuard, write: &mut dyn FnMut(&[u8]) -> io::Result<bool>) -> io::Result<bool> {
    let config = wg.device_config();
    let peers = wg.peers_with_state();
    let mut out = Reply { part: Zeroizing::new(String::with_capacity(PART_BYTES)), write };
    if let Some(key) = &config.private_key {
        out.room()?;
        out.part.push_str("private_key=");
        write_key_hex(&mut out.part, key.as_bytes());
        out.part.push('\n');
    }
    let port = wg.bound_port();
    if port != 0 {
        let _ = writeln!(out.part, "listen_port={port}");
    }
    if config.fwmark != 0 {
        let _ = writeln!(out.part, "fwmark={}", config.fwmark);
    }
    for (peer, state) in &peers {
        if !out.room()? {
            return Ok(false);
        }
        let part = &mut out.part;
        part.push_str("public_key=");
        write_key_hex(part, &peer.public_key);
        part.push_str("\npreshared_key=");
        write_key_hex(part, peer.preshared_key.as_ref().map_or(&[0; 32], SecretKey::as_bytes));
        part.push_str("\nprotocol_version=1\n");
        if let Some(endpoint) = state.endpoint {
            let _ = writeln!(part, "endpoint={endpoint}");
        }
        let since_epoch = state.last_handshake.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
        let (sec, nsec) = since_epoch.map_or((0, 0), |d| (d.as_secs(), d.subsec_nanos()));
        let _ = writeln!(part, "last_handshake_time_sec={sec}");
        let _ = writeln!(part, "last_handshake_time_nsec={nsec}");
        let _ = writeln!(part, "tx_bytes={}", state.tx_bytes);
        let _ = writeln!(part, "rx_bytes={}", state.rx_bytes);
        let _ = writeln!(part, "persistent_keepalive_interval={}", peer.persistent_keepalive);
        for (addr, len) in &peer.allowed_ips {
            if !out.room()? {
                return Ok(false);
            }
            let _ = writeln!(out.part, "allowed_ip={addr}/{len}");
        }
    }
    out.flush()
}

/// A reply being made: the part not yet written.
struct Reply<'a> {
    part: Zeroizing<String>,
    write: &'a mut dyn FnMut(&[u8]) -> io::Result<bool>,
}

/// The most one step of a reply adds: a peer's lines before its prefixes, or one prefix's line.
const STEP_BYTES: usize = 1024;

impl Reply<'_> {
    /// Writes the part if the next step might not fit in its buffer; false when the write failed.
    fn room(&mut self) -> io::Result<bool> {
        if self.part.len() + STEP_BYTES > PART_BYTES {
            return self.flush();
        }
        Ok(true)
    }

    fn flush(&mut self) -> io::Result<bool> {
        let written = (self.write)(self.part.as_bytes())?;
        // Cleared in place: the keys it held are overwritten by the next part or zeroed when it drops.
        self.part.clear();
        Ok(written)
    }
}

/// Writes `key` in lowercase hex into `out`, with no copy of its own.
fn write_key_hex(out: &mut String, key: &Key) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in key {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}
