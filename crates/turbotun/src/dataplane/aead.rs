//! ChaCha20-Poly1305 (RFC 8439) for a tunnel's transport data, from the fastest implementation this machine has:
//! Intel's IPsec-MB (AVX-512 ChaCha20, IFMA Poly1305) where the library was found at build time and the CPU runs
//! its AVX-512 code, ring's everywhere else. Neither is written here; this module chooses one once per process
//! and gives both the same interface, tags compared in constant time.
//!
//! `TURBOTUN_AEAD=ring` forces ring's (the fallback a CPU without AVX-512 gets), e.g. to compare the two. The
//! ranking that chose them, measured on this project's machine, is in BENCHMARKS.md ("ChaCha20-Poly1305").

use std::sync::OnceLock;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};

/// The length of a tag.
pub const TAG_LEN: usize = 16;

/// An implementation of ChaCha20-Poly1305.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// ring's (stitched AVX2 code on x86-64; every CPU).
    Ring,
    /// Intel's IPsec-MB, its AVX-512 code.
    IpsecMb,
}

impl Backend {
    /// The name used in logs and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::IpsecMb => "ipsec-mb",
        }
    }

    /// The backends this build and CPU can run, the fastest first (ring is always there).
    pub fn available() -> Vec<Backend> {
        let mut all = Vec::new();
        if ipsec_mb::usable() {
            all.push(Backend::IpsecMb);
        }
        all.push(Backend::Ring);
        all
    }
}

/// The backend every new key uses: chosen once per process, `TURBOTUN_AEAD=ring` forcing ring's.
pub fn backend() -> Backend {
    static CHOSEN: OnceLock<Backend> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let forced = std::env::var("TURBOTUN_AEAD").ok();
        let chosen = choose(forced.as_deref(), Backend::available);
        tracing::debug!(backend = chosen.as_str(), forced = ?forced, "ChaCha20-Poly1305 chosen");
        chosen
    })
}

/// The backend for `TURBOTUN_AEAD=forced`: `ring` forces ring's; anything else (or nothing) takes the fastest
/// that `available` (fastest first) finds. Forced, the others are not probed: probing IPsec-MB makes a manager,
/// which maps 3 MB of the library's code into a process that will never use it.
fn choose(forced: Option<&str>, available: impl FnOnce() -> Vec<Backend>) -> Backend {
    match forced {
        Some("ring") => Backend::Ring,
        _ => available().first().copied().unwrap_or(Backend::Ring),
    }
}

/// A ChaCha20-Poly1305 key, sealing and opening in place.
pub struct Key {
    inner: Inner,
}

/// Both implementations' keys live in a box of their own: the key itself is then the size of a pointer, so that
/// moving it (into a session, into an `Arc`) copies no stack bytes with it. An enum as large as ring's key
/// (which has room for AES's schedule) would carry whatever the stack held in the bytes its ChaCha key leaves
/// unused, a copy of key material among them.
enum Inner {
    Ring(Box<LessSafeKey>),
    /// IPsec-MB takes the key as it is (there is no schedule); a thread's manager does the work.
    IpsecMb(Box<[u8; 32]>),
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("backend", &self.backend()).finish_non_exhaustive()
    }
}

impl Key {
    /// A key on [`backend()`].
    pub fn new(key: &[u8; 32]) -> Key {
        Key::with_backend(key, backend())
    }

    /// A key on `backend` (ring's if `backend` cannot run here).
    pub fn with_backend(key: &[u8; 32], backend: Backend) -> Key {
        let inner = match backend {
            Backend::IpsecMb if ipsec_mb::usable() => {
                let mut boxed = Box::new([0u8; 32]);
                boxed.copy_from_slice(key);
                Inner::IpsecMb(boxed)
            }
            _ => Inner::Ring(Box::new(ring_key(key))),
        };
        Key { inner }
    }

    /// Which implementation it runs on.
    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Ring(_) => Backend::Ring,
            Inner::IpsecMb(_) => Backend::IpsecMb,
        }
    }

    /// Encrypts `text` in place and returns the tag over it and `aad`.
    pub fn seal(&self, nonce: &[u8; 12], aad: &[u8], text: &mut [u8]) -> [u8; TAG_LEN] {
        match &self.inner {
            Inner::Ring(key) => {
                let tag = key
                    .seal_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), text)
                    .expect("ChaCha20-Poly1305 seals any length a slice has");
                tag.as_ref().try_into().expect("a 16-byte tag")
            }
            Inner::IpsecMb(key) => {
                let mut tag = [0u8; TAG_LEN];
                if !ipsec_mb::run(key, nonce, aad, text, &mut tag, true) {
                    // The library refused the job (it cannot for these arguments): ring's gives the same bytes.
                    return Key::with_backend(key, Backend::Ring).seal(nonce, aad, text);
                }
                tag
            }
        }
    }

    /// Decrypts `text` in place if `tag` authenticates it with `aad`; returns whether it did. When it did not,
    /// `text` holds no plaintext of any use (it may have been decrypted regardless, or zeroed) and must be
    /// dropped.
    pub fn open(&self, nonce: &[u8; 12], aad: &[u8], text: &mut [u8], tag: &[u8; TAG_LEN]) -> bool {
        match &self.inner {
            Inner::Ring(key) => key
                .open_in_place_separate_tag(
                    Nonce::assume_unique_for_key(*nonce),
                    Aad::from(aad),
                    ring::aead::Tag::from(*tag),
                    text,
                    0..,
                )
                .is_ok(),
            Inner::IpsecMb(key) => {
                let mut computed = [0u8; TAG_LEN];
                if !ipsec_mb::run(key, nonce, aad, text, &mut computed, false) {
                    return false;
                }
                subtle::ConstantTimeEq::ct_eq(&computed[..], &tag[..]).into()
            }
        }
    }

    /// Overwrites the key where it is with zeros (it seals and opens under the all-zero key after), the store
    /// kept even when the memory is freed right after.
    pub fn erase(&mut self) {
        match &mut self.inner {
            Inner::Ring(key) => **key = ring_key(&[0; 32]),
            Inner::IpsecMb(key) => key.fill(0),
        }
        std::hint::black_box(&self.inner);
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        self.erase();
    }
}

fn ring_key(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key"))
}

/// Seals `data`'s message under both backends (when this machine has two) and checks that they agree byte for
/// byte and that each opens what the other sealed, and refuses it with one bit flipped: the fuzz target's body
/// (`fuzz/fuzz_targets/aead_vs_ring.rs`) and the property test's. Input: 32 bytes of key, 12 of nonce, one byte
/// giving the length of the associated data, then the associated data and the message.
#[doc(hidden)]
pub fn fuzz_compare_with_ring(data: &[u8]) {
    let Some((key, rest)) = data.split_first_chunk::<32>() else { return };
    let Some((nonce, rest)) = rest.split_first_chunk::<12>() else { return };
    let Some((&aad_len, rest)) = rest.split_first() else { return };
    let (aad, message) = rest.split_at(usize::from(aad_len).min(rest.len()));
    let reference = Key::with_backend(key, Backend::Ring);
    let mut sealed = message.to_vec();
    let tag = reference.seal(nonce, aad, &mut sealed);
    for backend in Backend::available() {
        let key = Key::with_backend(key, backend);
        let mut mine = message.to_vec();
        assert_eq!(key.seal(nonce, aad, &mut mine), tag, "{backend:?}: the tag ring's gives");
        assert_eq!(mine, sealed, "{backend:?}: the ciphertext ring's gives");
        let mut opened = sealed.clone();
        assert!(key.open(nonce, aad, &mut opened, &tag), "{backend:?} opens what ring's sealed");
        assert_eq!(opened, message, "{backend:?}: the message back");
        let mut flipped = tag;
        flipped[usize::from(aad_len) % TAG_LEN] ^= 1 << (aad_len % 8);
        let mut opened = sealed.clone();
        assert!(!key.open(nonce, aad, &mut opened, &flipped), "{backend:?} refuses a flipped tag bit");
        if let Some(byte) = sealed.first() {
            let mut changed = sealed.clone();
            changed[0] = byte ^ 0x80;
            assert!(!key.open(nonce, aad, &mut changed, &tag), "{backend:?} refuses a flipped ciphertext bit");
        }
    }
}

/// IPsec-MB's ChaCha20-Poly1305 on each thread's own manager. Only its AVX-512 code is used: on a CPU without
/// AVX-512 ring's stitched AVX2 code is as fast as the library's AVX2 and SSE code.
#[cfg(ipsec_mb)]
mod ipsec_mb {
    pub(super) use crate::sys::ipsec_mb::{chacha20_poly1305 as run, runs_avx512 as usable};
}

#[cfg(not(ipsec_mb))]
mod ipsec_mb {
    /// Built without IPsec-MB: never usable.
    pub(super) fn usable() -> bool {
        false
    }

    pub(super) fn run(_: &[u8; 32], _: &[u8; 12], _: &[u8], _: &mut [u8], _: &mut [u8; 16], _: bool) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
