//! BLAKE2s as WireGuard uses it outside the handshake's chaining too: the hash, the keyed MAC of every handshake
//! message (mac1, mac2) and the labels of the keys those MACs are made with. A leaf: the handshake
//! ([`crate::noise`]), the cookies and the messages' MAC helpers all build on it.

use blake2::digest::consts::U16;
use blake2::digest::{Digest, KeyInit, Mac};
use blake2::{Blake2s256, Blake2sMac};

/// The label of the key that MACs a message for its receiver (mac1).
pub(crate) const LABEL_MAC1: &[u8] = b"mac1----";
/// The label of the key that encrypts cookie replies.
pub(crate) const LABEL_COOKIE: &[u8] = b"cookie--";

/// BLAKE2s-256 of the concatenated `parts`.
pub(crate) fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Blake2s256::new();
    for part in parts {
        Digest::update(&mut h, part);
    }
    h.finalize().into()
}

/// Keyed BLAKE2s with a 16-byte output (WireGuard's MAC), over the concatenated `parts`; `key` is 16 or 32 bytes.
pub(crate) fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 16] {
    let mut m = <Blake2sMac<U16> as KeyInit>::new_from_slice(key).expect("BLAKE2s takes keys of up to 32 bytes");
    for part in parts {
        Mac::update(&mut m, part);
    }
    m.finalize().into_bytes().into()
}
