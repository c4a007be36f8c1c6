//! The device's configuration, the data model that WireGuard's userspace configuration protocol reads and
//! writes (see [`crate::uapi`]): the device's private key, port and firewall mark, and its peers, each with its
//! keys, endpoint, keepalive and allowed prefixes; the keys as the protocol writes them (lowercase hex).
//!
//! A [`DeviceConfig`] holds no prefix twice (one table over all peers), and a [`SecretKey`] is wiped when
//! dropped and never printed.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};

use subtle::{Choice, ConstantTimeEq};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// The most peers a device holds, as in the kernel (`MAX_PEERS_PER_DEVICE`): a configuration request that
/// would make more is refused with the kernel's errno, `ENOMEM`, and changes nothing.
pub const MAX_PEERS: usize = 1 << 20;

/// A Curve25519 public key, 32 bytes.
pub type Key = [u8; 32];

/// A secret key (the device's private key, a peer's preshared key): wiped when dropped, never printed by
/// `Debug`, not `Copy`, so that every copy is one that will be wiped, and compared in constant time (`==` too),
/// so that how long a comparison takes says nothing of where two keys differ.
#[derive(Clone)]
pub struct SecretKey([u8; 32]);

impl ConstantTimeEq for SecretKey {
    fn ct_eq(&self, other: &Self) -> Choice {
        self.0.ct_eq(&other.0)
    }
}

impl PartialEq for SecretKey {
    fn eq(&self, other: &Self) -> bool {
        self.ct_eq(other).into()
    }
}

impl Eq for SecretKey {}

impl SecretKey {
    /// The key of these bytes.
    pub fn new(bytes: [u8; 32]) -> Self {
        SecretKey(bytes)
    }

    /// The key from 64 hex digits (decoded in place, so that no other copy is left behind).
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut key = SecretKey([0; 32]);
        decode_hex(text, &mut key.0)?;
        Some(key)
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Whether it is all zero (what the protocol sends for "no key").
    pub fn is_zero(&self) -> bool {
        self.0.ct_eq(&[0; 32]).into()
    }

    /// The key as a Curve25519 private key is used (and as the kernel and wireguard-go store and show it): the
    /// low three bits cleared, the top bit cleared and the one below it set.
    pub fn clamped(mut self) -> Self {
        self.0[0] &= 248;
        self.0[31] &= 127;
        self.0[31] |= 64;
        self
    }
}

impl Drop for SecretKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl ZeroizeOnDrop for SecretKey {}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretKey(redacted)")
    }
}

/// What `set=1` configures, and `get=1` reports (beside what the tunnel learned at run time). Its `Debug` shows
/// no secret key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The device's private key, clamped (none until one is set).
    pub private_key: Option<SecretKey>,
    /// The UDP port (0: any free one).
    pub listen_port: u16,
    /// The firewall mark of the tunnel's datagrams (0: none).
    pub fwmark: u32,
    /// The peers, in the order they were added; no two hold the same prefix.
    pub peers: Vec<PeerConfig>,
}

impl DeviceConfig {
    /// Takes the private key out, wiping its bytes where they were: `Option::take` would leave them in place
    /// (only the tag changes), and every later move of the configuration would copy them along.
    pub(crate) fn take_private_key(&mut self) -> Option<SecretKey> {
        let key = self.private_key.clone();
        // Assigning drops the key in place, and its `Drop` wipes it there.
        self.private_key = None;
        key
    }
}

/// One peer's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// Its public key (what identifies it).
    pub public_key: Key,
    /// A preshared key mixed into its handshakes.
    pub preshared_key: Option<SecretKey>,
    /// Where to send to it first (it moves to wherever authenticated datagrams come from).
    pub endpoint: Option<SocketAddr>,
    /// Seconds between keepalives when idle (0: none).
    pub persistent_keepalive: u16,
    /// The prefixes it may send from and that are routed to it (host bits cleared).
    pub allowed_ips: Vec<(IpAddr, u8)>,
    /// Which creation of the peer with this key this is, unique in the process: a peer removed and added again
    /// (`replace_peers`, `remove`) is a new peer that keeps nothing of the old one (sessions, an endpoint it
    /// roamed to, counters), as in the kernel.
    pub incarnation: u64,
}

impl PeerConfig {
    /// A new peer with nothing configured but its key.
    pub fn new(public_key: Key) -> Self {
        static NEXT_INCARNATION: AtomicU64 = AtomicU64::new(1);
        PeerConfig {
            public_key,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: 0,
            allowed_ips: Vec::new(),
            incarnation: NEXT_INCARNATION.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// Whether two optional secrets (preshared keys as a peer holds them) are the same, compared in constant time.
pub(crate) fn same_secret(a: Option<&[u8; 32]>, b: Option<&[u8; 32]>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.ct_eq(b).into(),
        (None, None) => true,
        _ => false,
    }
}

/// Overwrites the stack below the caller's frame with zeros: what the calls made from there left in their
/// frames (keys moved or derived on the way, HMAC pads) is gone. Called where secret work ends on a thread (the
/// handshake worker's wake-up, a configuration request), since frames are not wiped when they return.
pub(crate) fn scrub_stack() {
    scrub::<{ 64 * 1024 }>();
}

/// [`scrub_stack`] for the data path, after each batch: deep enough for the frames of sealing and opening, where
/// the ChaCha20-Poly1305 code may leave its key (ring's keeps its state on the stack, not wiped).
pub(crate) fn scrub_data_path_stack() {
    scrub::<{ 16 * 1024 }>();
}

#[inline(never)]
fn scrub<const BYTES: usize>() {
    let mut area = [0u8; BYTES];
    std::hint::black_box(&mut area);
}

/// A key in lowercase hex, as the protocol writes it.
pub(crate) fn key_to_hex(key: &Key) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key from 64 hex digits.
pub(crate) fn key_from_hex(text: &str) -> Option<Key> {
    let mut key = [0u8; 32];
    decode_hex(text, &mut key)?;
    Some(key)
}

/// A key as `wg` prints and reads it (44 characters of base64), e.g. a public key from `wg pubkey` or a
/// private key from a file `wg genkey` wrote (surrounding white space is ignored).
pub fn key_from_base64(text: &str) -> Option<Key> {
    use base64::Engine as _;
    let mut key = [0u8; 32];
    let text = text.trim();
    // Exactly 32 bytes: a longer text would not fit, a shorter one leaves the length below.
    match base64::engine::general_purpose::STANDARD.decode_slice(text, &mut key) {
        Ok(32) if text.len() == 44 => Some(key),
        _ => None,
    }
}

/// A key in the base64 `wg` prints.
pub fn key_to_base64(key: &Key) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// 64 hex digits into `key`.
fn decode_hex(text: &str, key: &mut [u8; 32]) -> Option<()> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_goes_to_base64_and_back_and_nothing_else_is_a_key() {
        let key = [0xa5u8; 32];
        assert_eq!(super::key_from_base64(&format!(" {}\n", super::key_to_base64(&key))), Some(key));
        assert_eq!(super::key_from_base64(&super::key_to_base64(&[1; 32])[..43]), None);
        assert_eq!(super::key_from_base64("not a key"), None);
        assert_eq!(super::key_from_base64(&format!("{}AAAA", super::key_to_base64(&key))), None);
    }

    use super::*;

    fn k(b: u8) -> Key {
        [b; 32]
    }

    #[test]
    fn test_hex_keys_round_trip_and_bad_ones_are_refused() {
        let key = k(0xab);
        assert_eq!(key_from_hex(&key_to_hex(&key)), Some(key));
        assert_eq!(SecretKey::from_hex(&key_to_hex(&key)), Some(SecretKey::new(key)));
        assert_eq!(key_from_hex("ab"), None);
        assert_eq!(key_from_hex(&"zz".repeat(32)), None);
        assert_eq!(key_from_hex(&"é".repeat(32)), None, "non-ASCII never slices through a character");
    }

    /// Secret keys are compared through `subtle` (whose comparison does not stop at the first differing byte),
    /// `==` included; a key differing only in its last byte is unequal, an equal one equal.
    #[test]
    fn test_secret_keys_compare_in_constant_time() {
        let a = SecretKey::new(k(7));
        let mut last = k(7);
        last[31] ^= 1;
        assert!(bool::from(a.ct_eq(&SecretKey::new(k(7)))));
        assert!(!bool::from(a.ct_eq(&SecretKey::new(last))));
        assert!(a == SecretKey::new(k(7)) && a != SecretKey::new(last));
        assert!(SecretKey::new([0; 32]).is_zero() && !a.is_zero());
    }
}
