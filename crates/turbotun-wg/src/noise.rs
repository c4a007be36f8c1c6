//! WireGuard's handshake: the Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s construction as the WireGuard paper and the
//! kernel implementation define it.
//!
//! Every primitive comes from a crate made for it (X25519 from `x25519-dalek`, BLAKE2s, its keyed MAC and HMAC
//! from `blake2`/`hmac`, ChaCha20-Poly1305 from `chacha20poly1305`); what is written here is only how WireGuard
//! chains them (the messages' layouts are [`crate::message`]'s). Secrets live in types that zero themselves when dropped.
//!
//! The initiator calls [`create_initiation`] and, on the answer, [`consume_response`]; the responder calls
//! [`open_initiation`] (which names the sender), [`finish_initiation`] (which proves it) and [`create_response`]. Both end with the same [`SessionKeys`], mirrored. A
//! Diffie-Hellman result of all zeros (a low-order public key) ends a handshake on either side: nothing is sent.

use std::time::{SystemTime, UNIX_EPOCH};

use blake2::digest::{KeyInit, Mac};
use blake2::Blake2s256;
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::ChaCha20Poly1305;
use std::sync::{Arc, Mutex, OnceLock};

use hmac::SimpleHmac;
use rand_core::OsRng;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::blake2s::{hash, LABEL_COOKIE, LABEL_MAC1};
use crate::message::{Initiation, Response, INITIATION_LEN, RESPONSE_LEN, TAG_LEN};

/// The Noise protocol name, the first input of every handshake's chaining key.
const CONSTRUCTION: &[u8] = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
/// WireGuard's prologue.
const IDENTIFIER: &[u8] = b"WireGuard v1 zx2c4 Jason@zx2c4.com";
/// A 32-byte secret (a chaining key, a derived key), zeroed when dropped.
pub(crate) type Secret = Zeroizing<[u8; 32]>;

/// HMAC-BLAKE2s-256.
fn hmac(key: &[u8], parts: &[&[u8]]) -> Secret {
    let mut m = <SimpleHmac<Blake2s256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        Mac::update(&mut m, part);
    }
    Zeroizing::new(m.finalize().into_bytes().into())
}

/// The HKDF of the WireGuard paper, first output.
fn kdf1(key: &[u8; 32], input: &[u8]) -> Secret {
    let t0 = hmac(key, &[input]);
    hmac(&*t0, &[&[1]])
}

/// The HKDF of the WireGuard paper, two outputs.
fn kdf2(key: &[u8; 32], input: &[u8]) -> (Secret, Secret) {
    let t0 = hmac(key, &[input]);
    let t1 = hmac(&*t0, &[&[1]]);
    let t2 = hmac(&*t0, &[&*t1, &[2]]);
    (t1, t2)
}

/// The HKDF of the WireGuard paper, three outputs.
fn kdf3(key: &[u8; 32], input: &[u8]) -> (Secret, Secret, Secret) {
    let t0 = hmac(key, &[input]);
    let t1 = hmac(&*t0, &[&[1]]);
    let t2 = hmac(&*t0, &[&*t1, &[2]]);
    let t3 = hmac(&*t0, &[&*t2, &[3]]);
    (t1, t2, t3)
}

/// The 96-bit nonce of a counter: four zero bytes, then the counter little-endian.
pub(crate) fn nonce(counter: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    n
}

/// Seals `buf[..len - 16]` in place with `key` (counter 0, as every handshake field is), the tag written in the
/// last 16 bytes.
fn seal(key: &[u8; 32], buf: &mut [u8], aad: &[u8]) {
    let cipher = ChaCha20Poly1305::new(key.into());
    let (text, tag_out) = buf.split_at_mut(buf.len() - TAG_LEN);
    let tag = cipher.encrypt_in_place_detached(&nonce(0).into(), aad, text).expect("a handshake field is short");
    tag_out.copy_from_slice(&tag);
}

/// Opens a sealed field (`sealed` = text and tag) into `out` (the text's length); false if it does not authenticate.
fn open(key: &[u8; 32], sealed: &[u8], aad: &[u8], out: &mut [u8]) -> bool {
    let cipher = ChaCha20Poly1305::new(key.into());
    let (text, tag) = sealed.split_at(sealed.len() - TAG_LEN);
    out.copy_from_slice(text);
    cipher.decrypt_in_place_detached(&nonce(0).into(), aad, out, tag.into()).is_ok()
}

/// The TAI64N label of `now`, its nanoseconds rounded down to about 16 ms as the kernel does (so that the
/// timestamp, which every initiation carries encrypted, tells nothing finer about the sender's clock).
pub(crate) fn tai64n(now: SystemTime) -> [u8; 12] {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut t = [0u8; 12];
    t[..8].copy_from_slice(&(0x4000_0000_0000_000a_u64 + since.as_secs()).to_be_bytes());
    t[8..].copy_from_slice(&(since.subsec_nanos() & !0x00ff_ffff).to_be_bytes());
    t
}

/// X25519 of a secret and a public key; `None` when the result is all zeros (a low-order point), which ends the
/// handshake as the kernel's does.
fn dh(secret: &StaticSecret, public: &[u8; 32]) -> Option<Secret> {
    let shared = secret.diffie_hellman(&PublicKey::from(*public));
    shared.was_contributory().then(|| Zeroizing::new(shared.to_bytes()))
}

/// This device's static identity.
pub(crate) struct Identity {
    /// The private key: taken out and wiped when the device's key changes ([`Identity::erase`]), whoever still
    /// holds the identity.
    secret: Mutex<Option<StaticSecret>>,
    /// Its public key.
    pub public: [u8; 32],
    /// HASH(LABEL_MAC1 || public): checks the mac1 of messages to us.
    pub mac1_key: [u8; 32],
    /// HASH(LABEL_COOKIE || public): encrypts our cookie replies.
    pub cookie_key: [u8; 32],
    /// The handshake hash a responder starts from: HASH(HASH(HASH(CONSTRUCTION) || IDENTIFIER) || public).
    responder_hash: [u8; 32],
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("public", &crate::config::key_to_hex(&self.public)).finish()
    }
}

/// The chaining key every handshake starts from.
fn initial_chaining_key() -> [u8; 32] {
    hash(&[CONSTRUCTION])
}

/// The handshake hash of the responder whose static key is `responder`, before any message.
fn initial_hash(responder: &[u8; 32]) -> [u8; 32] {
    hash(&[&hash(&[&initial_chaining_key(), IDENTIFIER]), responder])
}

impl Identity {
    /// The identity of a private key (clamped by X25519 itself).
    pub(crate) fn new(private: &[u8; 32]) -> Self {
        let secret = StaticSecret::from(*private);
        let public = PublicKey::from(&secret).to_bytes();
        Identity {
            secret: Mutex::new(Some(secret)),
            public,
            mac1_key: hash(&[LABEL_MAC1, &public]),
            cookie_key: hash(&[LABEL_COOKIE, &public]),
            responder_hash: initial_hash(&public),
        }
    }

    /// The X25519 of our static key with a peer's: `None` for a low-order key (no handshake with it, ever).
    pub(crate) fn static_static(&self, peer: &[u8; 32]) -> Option<Secret> {
        self.dh(peer)
    }

    /// The X25519 of our static key with `public`; `None` for a low-order key, or once erased.
    fn dh(&self, public: &[u8; 32]) -> Option<Secret> {
        dh(self.secret.lock().unwrap_or_else(|e| e.into_inner()).as_ref()?, public)
    }

    /// The private key, as the configuration reports it (clamped); `None` once erased.
    pub(crate) fn private_key(&self) -> Option<crate::config::SecretKey> {
        let secret = self.secret.lock().unwrap_or_else(|e| e.into_inner());
        Some(crate::config::SecretKey::new(secret.as_ref()?.to_bytes()))
    }

    /// Wipes the private key (a new one is in force): no handshake is made with this identity after.
    pub(crate) fn erase(&self) {
        // Dropped in place (its `Drop` wipes it there): `take` would leave its bytes behind in the slot.
        *self.secret.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// What we keep of one peer for handshakes with it.
pub(crate) struct PeerKeys {
    /// Its public key.
    pub public: [u8; 32],
    /// The identity these keys are of.
    identity: Arc<Identity>,
    /// The preshared key (zeros when none is set, as the protocol mixes zeros then).
    psk: Secret,
    /// X25519 of our static key and its (`None` when its key is of low order), computed at its first use: an
    /// X25519 costs about as much as everything else configuring a peer does many times over, and a server's
    /// peers mostly never handshake between two configurations. Computed once: whoever comes second waits.
    static_static: OnceLock<Option<Secret>>,
    /// HASH(LABEL_MAC1 || its public key): the mac1 of what we send it.
    pub mac1_key: [u8; 32],
    /// HASH(LABEL_COOKIE || its public key): opens its cookie replies.
    pub cookie_key: [u8; 32],
    /// The handshake hash an initiation to it starts from.
    initiator_hash: [u8; 32],
}

impl std::fmt::Debug for PeerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerKeys").field("public", &crate::config::key_to_hex(&self.public)).finish()
    }
}

impl PeerKeys {
    /// The keys for peer `public` of `identity`, with preshared key `psk`.
    pub(crate) fn new(identity: &Arc<Identity>, public: [u8; 32], psk: Option<&[u8; 32]>) -> Self {
        PeerKeys {
            public,
            identity: identity.clone(),
            psk: Zeroizing::new(psk.copied().unwrap_or([0; 32])),
            static_static: OnceLock::new(),
            mac1_key: hash(&[LABEL_MAC1, &public]),
            cookie_key: hash(&[LABEL_COOKIE, &public]),
            initiator_hash: initial_hash(&public),
        }
    }

    /// X25519 of our static key and the peer's, computed the first time it is asked for.
    fn static_static(&self) -> Option<&Secret> {
        self.static_static.get_or_init(|| self.identity.static_static(&self.public)).as_ref()
    }

    /// Whether a handshake with this peer is possible (its key is not of low order).
    pub(crate) fn can_handshake(&self) -> bool {
        self.static_static().is_some()
    }

    /// Whether the static-static secret has been computed (for the tests of when it is).
    #[cfg(test)]
    pub(crate) fn computed(&self) -> bool {
        self.static_static.get().is_some()
    }
}

/// The keys of one session, from the point of view of one side.
#[derive(Zeroize, ZeroizeOnDrop)]
pub(crate) struct SessionKeys {
    /// Seals what this side sends.
    pub send: [u8; 32],
    /// Opens what this side receives.
    pub receive: [u8; 32],
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

/// An initiation sent and waiting for its response.
pub(crate) struct InitiationState {
    /// The index the response will carry as its receiver.
    pub local_index: u32,
    chaining_key: Secret,
    hash: [u8; 32],
    ephemeral: StaticSecret,
}

impl std::fmt::Debug for InitiationState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitiationState").field("local_index", &self.local_index).finish()
    }
}

/// Writes an initiation to `peer` into `msg` (all but the MACs, which depend on the cookie state); `None` for a
/// peer whose key is of low order (nothing is written).
pub(crate) fn create_initiation(
    identity: &Identity,
    peer: &PeerKeys,
    local_index: u32,
    now: SystemTime,
    msg: &mut [u8; INITIATION_LEN],
) -> Option<InitiationState> {
    let static_static = peer.static_static()?;
    let ephemeral = StaticSecret::random_from_rng(OsRng);
    let ephemeral_public = PublicKey::from(&ephemeral).to_bytes();
    let mut msg = Initiation::start(msg);
    msg.set_sender(local_index);
    let ck = kdf1(&initial_chaining_key(), &ephemeral_public);
    msg.ephemeral_mut().copy_from_slice(&ephemeral_public);
    let h = hash(&[&peer.initiator_hash, &ephemeral_public]);
    let es = dh(&ephemeral, &peer.public)?;
    let (ck, key) = kdf2(&ck, &*es);
    msg.sealed_static_mut()[..32].copy_from_slice(&identity.public);
    seal(&key, msg.sealed_static_mut(), &h);
    let h = hash(&[&h, msg.sealed_static()]);
    let (ck, key) = kdf2(&ck, &**static_static);
    msg.sealed_timestamp_mut()[..12].copy_from_slice(&tai64n(now));
    seal(&key, msg.sealed_timestamp_mut(), &h);
    let h = hash(&[&h, msg.sealed_timestamp()]);
    Some(InitiationState { local_index, chaining_key: ck, hash: h, ephemeral })
}

/// An initiation whose static key a responder opened: who claims to have sent it, before that is proven.
pub(crate) struct InitiationStatic {
    /// The static public key it carries.
    pub peer: [u8; 32],
    chaining_key: Secret,
    hash: [u8; 32],
    remote_ephemeral: [u8; 32],
}

impl std::fmt::Debug for InitiationStatic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitiationStatic").field("peer", &crate::config::key_to_hex(&self.peer)).finish()
    }
}

/// An initiation a responder opened whole: its sender proven, and what the response needs.
pub(crate) struct ConsumedInitiation {
    /// Its TAI64N timestamp (greater than any before it from the same peer, or a replay).
    pub timestamp: [u8; 12],
    /// The initiator's index (the response's receiver index).
    pub remote_index: u32,
    chaining_key: Secret,
    hash: [u8; 32],
    remote_ephemeral: [u8; 32],
}

impl std::fmt::Debug for ConsumedInitiation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumedInitiation").field("remote_index", &self.remote_index).finish()
    }
}

/// Opens the static key of an initiation (its MACs already checked): `None` if it does not authenticate under
/// our key or its ephemeral key is of low order.
pub(crate) fn open_initiation(identity: &Identity, msg: &[u8]) -> Option<InitiationStatic> {
    let msg = Initiation::new_checked(msg)?;
    let remote_ephemeral = msg.ephemeral();
    let ck = kdf1(&initial_chaining_key(), &remote_ephemeral);
    let h = hash(&[&identity.responder_hash, &remote_ephemeral]);
    let es = identity.dh(&remote_ephemeral)?;
    let (ck, key) = kdf2(&ck, &*es);
    let mut peer = [0u8; 32];
    if !open(&key, msg.sealed_static(), &h, &mut peer) {
        return None;
    }
    let h = hash(&[&h, msg.sealed_static()]);
    Some(InitiationStatic { peer, chaining_key: ck, hash: h, remote_ephemeral })
}

/// Finishes opening an initiation with the keys of the peer it names: `None` unless its timestamp authenticates
/// (which proves the sender holds that peer's private key).
pub(crate) fn finish_initiation(opened: InitiationStatic, peer: &PeerKeys, msg: &[u8]) -> Option<ConsumedInitiation> {
    let msg = Initiation::new_checked(msg)?;
    if peer.public != opened.peer {
        return None;
    }
    let static_static = peer.static_static()?;
    let (ck, key) = kdf2(&opened.chaining_key, &**static_static);
    let mut timestamp = [0u8; 12];
    if !open(&key, msg.sealed_timestamp(), &opened.hash, &mut timestamp) {
        return None;
    }
    let h = hash(&[&opened.hash, msg.sealed_timestamp()]);
    Some(ConsumedInitiation {
        timestamp,
        remote_index: msg.sender(),
        chaining_key: ck,
        hash: h,
        remote_ephemeral: opened.remote_ephemeral,
    })
}

/// Writes the response to a consumed initiation into `msg` (all but the MACs) and derives the session; `None`
/// if a Diffie-Hellman result is zero.
pub(crate) fn create_response(
    consumed: &ConsumedInitiation,
    peer: &PeerKeys,
    local_index: u32,
    msg: &mut [u8; RESPONSE_LEN],
) -> Option<SessionKeys> {
    let ephemeral = StaticSecret::random_from_rng(OsRng);
    let ephemeral_public = PublicKey::from(&ephemeral).to_bytes();
    let mut msg = Response::start(msg);
    msg.set_sender(local_index);
    msg.set_receiver(consumed.remote_index);
    msg.ephemeral_mut().copy_from_slice(&ephemeral_public);
    let ck = kdf1(&consumed.chaining_key, &ephemeral_public);
    let h = hash(&[&consumed.hash, &ephemeral_public]);
    let ee = dh(&ephemeral, &consumed.remote_ephemeral)?;
    let ck = kdf1(&ck, &*ee);
    let se = dh(&ephemeral, &peer.public)?;
    let ck = kdf1(&ck, &*se);
    let (ck, tau, key) = kdf3(&ck, &*peer.psk);
    let h = hash(&[&h, &*tau]);
    seal(&key, msg.sealed_empty_mut(), &h);
    let (initiator_sends, responder_sends) = kdf2(&ck, &[]);
    Some(SessionKeys { send: *responder_sends, receive: *initiator_sends })
}

/// Opens a response to `state` from `peer` (its MACs already checked) and derives the session; `None` if it does
/// not authenticate.
pub(crate) fn consume_response(
    identity: &Identity,
    state: &InitiationState,
    peer: &PeerKeys,
    msg: &[u8],
) -> Option<SessionKeys> {
    let msg = Response::new_checked(msg)?;
    if msg.receiver() != state.local_index {
        return None;
    }
    let remote_ephemeral = msg.ephemeral();
    let ck = kdf1(&state.chaining_key, &remote_ephemeral);
    let h = hash(&[&state.hash, &remote_ephemeral]);
    let ee = dh(&state.ephemeral, &remote_ephemeral)?;
    let ck = kdf1(&ck, &*ee);
    let se = identity.dh(&remote_ephemeral)?;
    let ck = kdf1(&ck, &*se);
    let (ck, tau, key) = kdf3(&ck, &*peer.psk);
    let h = hash(&[&h, &*tau]);
    if !open(&key, msg.sealed_empty(), &h, &mut []) {
        return None;
    }
    let (initiator_sends, responder_sends) = kdf2(&ck, &[]);
    Some(SessionKeys { send: *initiator_sends, receive: *responder_sends })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::message::MessageKind;

    fn identity(seed: u8) -> Arc<Identity> {
        Arc::new(Identity::new(&[seed; 32]))
    }

    /// A full handshake between two identities, returning both sides' keys.
    fn handshake(psk: Option<&[u8; 32]>) -> (SessionKeys, SessionKeys) {
        let (a, b) = (identity(1), identity(2));
        let b_at_a = PeerKeys::new(&a, b.public, psk);
        let a_at_b = PeerKeys::new(&b, a.public, psk);
        let mut init = [0u8; INITIATION_LEN];
        let state = create_initiation(&a, &b_at_a, 7, SystemTime::now(), &mut init).unwrap();
        assert_eq!(MessageKind::of(&init), Some(MessageKind::Initiation));
        let opened = open_initiation(&b, &init).unwrap();
        assert_eq!(opened.peer, a.public);
        let consumed = finish_initiation(opened, &a_at_b, &init).unwrap();
        assert_eq!(consumed.remote_index, 7);
        let mut response = [0u8; RESPONSE_LEN];
        let b_keys = create_response(&consumed, &a_at_b, 9, &mut response).unwrap();
        assert_eq!(MessageKind::of(&response), Some(MessageKind::Response));
        let a_keys = consume_response(&a, &state, &b_at_a, &response).unwrap();
        (a_keys, b_keys)
    }

    #[test]
    fn test_both_sides_derive_mirrored_keys_with_and_without_a_preshared_key() {
        for psk in [None, Some(&[5u8; 32])] {
            let (a, b) = handshake(psk);
            assert_eq!(a.send, b.receive);
            assert_eq!(a.receive, b.send);
            assert_ne!(a.send, a.receive);
        }
    }

    #[test]
    fn test_a_flipped_bit_anywhere_in_the_sealed_fields_is_refused() {
        let (a, b) = (identity(1), identity(2));
        let b_at_a = PeerKeys::new(&a, b.public, None);
        let a_at_b = PeerKeys::new(&b, a.public, None);
        let mut init = [0u8; INITIATION_LEN];
        create_initiation(&a, &b_at_a, 7, SystemTime::now(), &mut init).unwrap();
        for byte in 8..116 {
            let mut bad = init;
            bad[byte] ^= 1;
            let consumed = open_initiation(&b, &bad).and_then(|o| finish_initiation(o, &a_at_b, &bad));
            assert!(consumed.is_none(), "byte {byte}");
        }
    }

    #[test]
    fn test_different_preshared_keys_do_not_complete() {
        let (a, b) = (identity(1), identity(2));
        let b_at_a = PeerKeys::new(&a, b.public, Some(&[1; 32]));
        let a_at_b = PeerKeys::new(&b, a.public, Some(&[2; 32]));
        let mut init = [0u8; INITIATION_LEN];
        let state = create_initiation(&a, &b_at_a, 7, SystemTime::now(), &mut init).unwrap();
        let consumed = finish_initiation(open_initiation(&b, &init).unwrap(), &a_at_b, &init).unwrap();
        let mut response = [0u8; RESPONSE_LEN];
        create_response(&consumed, &a_at_b, 9, &mut response).unwrap();
        assert!(consume_response(&a, &state, &b_at_a, &response).is_none());
    }

    /// Points of small order on Curve25519: X25519 with any of them is all zeros.
    pub(crate) fn low_order_points() -> Vec<[u8; 32]> {
        let mut one = [0u8; 32];
        one[0] = 1;
        let order8 = [
            0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4, 0x6a, 0xda, 0x09,
            0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00,
        ];
        vec![[0u8; 32], one, order8]
    }

    #[test]
    fn test_no_initiation_to_a_low_order_key_and_none_accepted_from_one() {
        let a = identity(1);
        for low in low_order_points() {
            let peer = PeerKeys::new(&a, low, None);
            assert!(!peer.can_handshake());
            let mut init = [0u8; INITIATION_LEN];
            assert!(create_initiation(&a, &peer, 1, SystemTime::now(), &mut init).is_none());
        }
        // An initiation whose ephemeral key is of low order is refused before any peer is looked up.
        let b = identity(2);
        for low in low_order_points() {
            let mut init = [0u8; INITIATION_LEN];
            init[0] = 1;
            init[crate::message::field::initiation::EPHEMERAL].copy_from_slice(&low);
            assert!(open_initiation(&b, &init).is_none());
        }
    }

    /// Configuring a peer costs no X25519: the static-static secret is computed by the first handshake that
    /// needs it, and kept for the next.
    #[test]
    fn test_the_static_static_secret_is_computed_at_first_use_and_once() {
        let (a, b) = (identity(1), identity(2));
        let b_at_a = PeerKeys::new(&a, b.public, None);
        assert!(!b_at_a.computed(), "configuring the peer made no X25519");
        let mut init = [0u8; INITIATION_LEN];
        create_initiation(&a, &b_at_a, 1, SystemTime::now(), &mut init).unwrap();
        assert!(b_at_a.computed());
        let first = **b_at_a.static_static().unwrap();
        create_initiation(&a, &b_at_a, 2, SystemTime::now(), &mut init).unwrap();
        assert_eq!(**b_at_a.static_static().unwrap(), first);
        assert_eq!(first, *a.static_static(&b.public).unwrap());
    }

    #[test]
    fn test_timestamps_grow_and_are_rounded() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::new(100, 999_999_999);
        let label = tai64n(t);
        assert_eq!(u64::from_be_bytes(label[..8].try_into().unwrap()), 0x4000_0000_0000_000a + 100);
        assert_eq!(u32::from_be_bytes(label[8..].try_into().unwrap()) & 0x00ff_ffff, 0);
        assert!(tai64n(t + std::time::Duration::from_secs(1)) > label);
    }
}
