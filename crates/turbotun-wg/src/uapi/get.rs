//! The `get=1` half of WireGuard's userspace configuration protocol: the configuration in force and what the
//! tunnel learned at run time (endpoints, the last handshake, byte counts), as `wg show` reads them.

use std::time::SystemTime;

use zeroize::Zeroizing;

use crate::config::{Key, SecretKey};
use crate::wireguard::WireGuard;

/// The text of a `get=1` reply (without the `errno=0` line and the empty line that end it). It holds the private
/// and preshared keys: room for all of it is taken at once, so that no copy is left behind by a reallocation,
/// and it is zeroed when dropped.
pub(crate) fn render_get(wg: &WireGuard) -> Zeroizing<String> {
    use std::fmt::Write;
    let config = wg.config();
    let states = wg.peer_states();
    let room = 256 + config.peers.iter().map(|p| 512 + 64 * p.allowed_ips.len()).sum::<usize>();
    let mut out = Zeroizing::new(String::with_capacity(room));
    if let Some(key) = &config.private_key {
        out.push_str("private_key=");
        write_key_hex(&mut out, key.as_bytes());
        out.push('\n');
    }
    let port = wg.bound_port();
    if port != 0 {
        let _ = writeln!(out, "listen_port={port}");
    }
    if config.fwmark != 0 {
        let _ = writeln!(out, "fwmark={}", config.fwmark);
    }
    for (peer, state) in config.peers.iter().zip(states) {
        out.push_str("public_key=");
        write_key_hex(&mut out, &peer.public_key);
        out.push_str("\npreshared_key=");
        write_key_hex(&mut out, peer.preshared_key.as_ref().map_or(&[0; 32], SecretKey::as_bytes));
        out.push_str("\nprotocol_version=1\n");
        if let Some(endpoint) = state.endpoint {
            let _ = writeln!(out, "endpoint={endpoint}");
        }
        let since_epoch = state.last_handshake.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
        let (sec, nsec) = since_epoch.map_or((0, 0), |d| (d.as_secs(), d.subsec_nanos()));
        let _ = writeln!(out, "last_handshake_time_sec={sec}");
        let _ = writeln!(out, "last_handshake_time_nsec={nsec}");
        let _ = writeln!(out, "tx_bytes={}", state.tx_bytes);
        let _ = writeln!(out, "rx_bytes={}", state.rx_bytes);
        let _ = writeln!(out, "persistent_keepalive_interval={}", peer.persistent_keepalive);
        for (addr, len) in &peer.allowed_ips {
            let _ = writeln!(out, "allowed_ip={addr}/{len}");
        }
    }
    out
}

/// Writes `key` in lowercase hex into `out`, with no copy of its own.
fn write_key_hex(out: &mut String, key: &Key) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in key {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}
