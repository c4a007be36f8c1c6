//! WireGuard peers made up for the benches: a configuration file of many peers, as `wg setconf` and `wg addconf`
//! read it (`--wg-scale`, the `-crowd` tunnel kinds).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use base64::Engine as _;

/// Where generated peers' prefixes are: peer `i` gets the /32 `v4 + i` and the /128 `v6 + i`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerPrefixes {
    pub v4: std::net::Ipv4Addr,
    pub v6: std::net::Ipv6Addr,
}

/// A configuration file of the peers numbered `numbers`, each with its public key `public(i)`, one /32 and one
/// /128 (see [`PeerPrefixes`]) and, with `endpoints`, an endpoint; with the device's private key (made from
/// `seed`) when given, as `wg setconf` takes it whole (without one, as `wg addconf` adds it).
pub(crate) fn write_peers(
    path: &Path,
    seed: Option<u64>,
    numbers: std::ops::Range<usize>,
    prefixes: PeerPrefixes,
    public: &dyn Fn(usize) -> [u8; 32],
    endpoints: bool,
) -> Result<()> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut text = String::with_capacity(numbers.len() * 200 + 100);
    text.push_str("[Interface]\n");
    if let Some(seed) = seed {
        let _ = writeln!(text, "PrivateKey = {}", b64.encode(key_bytes(u64::MAX - seed)));
    }
    for i in numbers {
        let v4 = std::net::Ipv4Addr::from(u32::from(prefixes.v4).wrapping_add(i as u32));
        let v6 = std::net::Ipv6Addr::from(u128::from(prefixes.v6).wrapping_add(i as u128));
        let _ = write!(text, "\n[Peer]\nPublicKey = {}\nAllowedIPs = {v4}/32, {v6}/128\n", b64.encode(public(i)));
        if endpoints {
            let (mid, lo) = ((i >> 8) & 0xff, i & 0xff);
            let _ = writeln!(text, "Endpoint = 198.18.{mid}.{lo}:{}", 1024 + i % 60_000);
        }
    }
    let mut file = std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("write {}", path.display()))
}

/// A public key that needs no private key (the configuration cost of a peer is the same): [`key_bytes`] of `i`.
pub(crate) fn random_public(i: usize) -> [u8; 32] {
    key_bytes(i as u64)
}

/// 32 bytes for key number `n`: distinct for every `n`, and spread (splitmix64), as real keys are.
pub(crate) fn key_bytes(n: u64) -> [u8; 32] {
    let mut state = n;
    let mut key = [0u8; 32];
    for chunk in key.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// The generated configuration is what `wg setconf` reads: distinct keys of 32 bytes, one /32 and one /128
    /// a peer, none shared.
    #[test]
    fn test_generated_peers_are_distinct_and_well_formed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.conf");
        let prefixes = PeerPrefixes { v4: Ipv4Addr::new(10, 0, 0, 0), v6: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0) };
        write_peers(&path, Some(3), 65_530..65_540, prefixes, &random_public, true).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("[Interface]\nPrivateKey = "), "{text}");
        let keys: std::collections::HashSet<&str> =
            text.lines().filter_map(|l| l.strip_prefix("PublicKey = ")).collect();
        assert_eq!(keys.len(), 10);
        let b64 = base64::engine::general_purpose::STANDARD;
        assert!(keys.iter().all(|k| b64.decode(k).unwrap().len() == 32));
        assert!(text.contains("AllowedIPs = 10.0.255.255/32, fd00::ffff/128\n"), "{text}");
        assert!(text.contains("AllowedIPs = 10.1.0.0/32, fd00::1:0/128\n"), "{text}");
        let prefixes: std::collections::HashSet<&str> =
            text.lines().filter_map(|l| l.strip_prefix("AllowedIPs = ")).collect();
        assert_eq!(prefixes.len(), 10);
        assert_eq!(text.matches("\nEndpoint = ").count(), 10);
        write_peers(
            &path,
            None,
            0..3,
            PeerPrefixes { v4: Ipv4Addr::new(100, 64, 0, 0), v6: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0) },
            &|_| [9; 32],
            false,
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("[Interface]\n\n[Peer]\nPublicKey = CQkJ"), "{text}");
        assert!(!text.contains("Endpoint") && text.contains("AllowedIPs = 100.64.0.2/32, fd00::2/128\n"), "{text}");
    }
}
