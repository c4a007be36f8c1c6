//! WireGuard's handshake messages as an attacker or a misbehaving peer writes them, for the tests that attack
//! `turbotun wg`: forged messages that carry a valid mac1 (which needs only the server's public key) and random
//! content, and genuine handshake initiations of a peer whose private key the test holds, with the mac2 of a
//! cookie the server gave. The primitives come from the RustCrypto crates (BLAKE2s, HMAC, ChaCha20-Poly1305,
//! XChaCha20-Poly1305) and x25519-dalek; this file only lays out WireGuard's messages and its Noise IK
//! initiation (see the WireGuard paper, section 5.4).

use blake2::digest::consts::U16;
use blake2::digest::{FixedOutput, KeyInit, Mac, Update};
use blake2::{Blake2s256, Blake2sMac, Digest};
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{ChaCha20Poly1305, XChaCha20Poly1305};
use hmac::SimpleHmac;
use x25519_dalek::{PublicKey, StaticSecret};

pub const INITIATION: u8 = 1;
pub const RESPONSE: u8 = 2;
pub const COOKIE_REPLY: u8 = 3;
pub const TRANSPORT: u8 = 4;
pub const INITIATION_LEN: usize = 148;
pub const RESPONSE_LEN: usize = 92;
pub const COOKIE_REPLY_LEN: usize = 64;

const CONSTRUCTION: &[u8] = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
const IDENTIFIER: &[u8] = b"WireGuard v1 zx2c4 Jason@zx2c4.com";
const LABEL_MAC1: &[u8] = b"mac1----";
const LABEL_COOKIE: &[u8] = b"cookie--";

fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Blake2s256::new();
    for p in parts {
        Digest::update(&mut h, p);
    }
    h.finalize().into()
}

/// WireGuard's MAC: keyed BLAKE2s with a 16-byte output.
fn keyed_mac(key: &[u8], data: &[u8]) -> [u8; 16] {
    let mut m = <Blake2sMac<U16> as KeyInit>::new_from_slice(key).expect("a BLAKE2s key of at most 32 bytes");
    Update::update(&mut m, data);
    m.finalize_fixed().into()
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <SimpleHmac<Blake2s256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    for p in parts {
        Mac::update(&mut m, p);
    }
    m.finalize().into_bytes().into()
}

/// WireGuard's KDF with two outputs (HKDF over HMAC-BLAKE2s).
fn kdf2(chaining_key: &[u8; 32], input: &[u8]) -> ([u8; 32], [u8; 32]) {
    let prk = hmac(chaining_key, &[input]);
    let first = hmac(&prk, &[&[1]]);
    let second = hmac(&prk, &[&first, &[2]]);
    (first, second)
}

/// ChaCha20-Poly1305 with counter 0 (the handshake's only use of each key).
fn seal(key: &[u8; 32], plain: &[u8], aad: &[u8]) -> Vec<u8> {
    let cipher = <ChaCha20Poly1305 as KeyInit>::new(key.into());
    cipher.encrypt(&[0u8; 12].into(), Payload { msg: plain, aad }).expect("sealing cannot fail")
}

/// The key of every mac1 sent to the holder of `public`.
pub fn mac1_key(public: &[u8; 32]) -> [u8; 32] {
    hash(&[LABEL_MAC1, public])
}

/// Fills in a valid mac1 for a handshake message (the last 32 bytes are mac1 and mac2) sent to `mac1_key`'s
/// holder, and returns it.
pub fn set_mac1(message: &mut [u8], mac1_key: &[u8; 32]) -> [u8; 16] {
    let at = message.len() - 32;
    let mac1 = keyed_mac(mac1_key, &message[..at]);
    message[at..at + 16].copy_from_slice(&mac1);
    mac1
}

/// A message of `kind` and `len` bytes: the type, three zero bytes, then `content` (repeated as needed).
fn shaped(kind: u8, len: usize, content: &[u8]) -> Vec<u8> {
    let mut m: Vec<u8> = content.iter().copied().cycle().take(len).collect();
    m[..4].copy_from_slice(&[kind, 0, 0, 0]);
    m
}

/// A handshake initiation with random content and a valid mac1: it passes the MAC check and fails at the
/// first key operation.
pub fn forged_initiation(mac1_key: &[u8; 32], content: &[u8]) -> Vec<u8> {
    let mut m = shaped(INITIATION, INITIATION_LEN, content);
    set_mac1(&mut m, mac1_key);
    m
}

/// A handshake response with random content, addressed to `receiver` (an index the server gave a session),
/// with a valid mac1.
pub fn forged_response(mac1_key: &[u8; 32], receiver: u32, content: &[u8]) -> Vec<u8> {
    let mut m = shaped(RESPONSE, RESPONSE_LEN, content);
    m[8..12].copy_from_slice(&receiver.to_le_bytes());
    set_mac1(&mut m, mac1_key);
    m
}

/// A cookie reply with random content addressed to `receiver` (a cookie reply carries no MAC).
pub fn forged_cookie_reply(receiver: u32, content: &[u8]) -> Vec<u8> {
    let mut m = shaped(COOKIE_REPLY, COOKIE_REPLY_LEN, content);
    m[4..8].copy_from_slice(&receiver.to_le_bytes());
    m
}

/// The receiver index of a transport message (the index its receiver gave the session), if it is one.
pub fn transport_receiver(datagram: &[u8]) -> Option<u32> {
    (datagram.len() >= 32 && datagram[..4] == [TRANSPORT, 0, 0, 0])
        .then(|| u32::from_le_bytes(datagram[4..8].try_into().unwrap()))
}

/// The counter of a transport message.
pub fn transport_counter(datagram: &[u8]) -> Option<u64> {
    transport_receiver(datagram).map(|_| u64::from_le_bytes(datagram[8..16].try_into().unwrap()))
}

/// A peer whose private key the test holds, writing genuine handshake initiations to a responder: each a new
/// ephemeral key and a later timestamp, with mac1, and mac2 once a cookie reply gave it a cookie.
pub struct Initiator {
    static_secret: StaticSecret,
    static_public: [u8; 32],
    responder: [u8; 32],
    /// DH(our static, their static): the same for every initiation.
    static_static: [u8; 32],
    mac1_key: [u8; 32],
    cookie_key: [u8; 32],
    cookie: Option<[u8; 16]>,
    /// The last timestamp sent (TAI64N: seconds, nanoseconds), so that each one is later than the one before.
    last_stamp: (u64, u32),
    /// Seeds the ephemeral keys (any bytes make a key; they need not be secret here).
    seed: u64,
    /// What the last initiation leaves for its response: our index, the ephemeral key, the chaining key, the hash.
    pending: Option<(u32, StaticSecret, [u8; 32], [u8; 32])>,
}

/// A session the test completed with a responder: its keys and the responder's index.
pub struct Session {
    /// Seals what the test sends.
    pub send: [u8; 32],
    /// Opens what the responder sends.
    pub receive: [u8; 32],
    /// The responder's index (what the test's transport messages carry as their receiver).
    pub remote_index: u32,
}

/// A transport data message to `receiver` with `counter`: `plain` padded to 16 bytes, sealed with `key`.
pub fn transport(key: &[u8; 32], receiver: u32, counter: u64, plain: &[u8]) -> Vec<u8> {
    let mut padded = plain.to_vec();
    padded.resize(plain.len().div_ceil(16) * 16, 0);
    let mut nonce = [0u8; 12];
    nonce[4..].copy_from_slice(&counter.to_le_bytes());
    let cipher = <ChaCha20Poly1305 as KeyInit>::new(key.into());
    let sealed = cipher.encrypt(&nonce.into(), Payload { msg: &padded, aad: &[] }).expect("sealing cannot fail");
    let mut m = vec![TRANSPORT, 0, 0, 0];
    m.extend_from_slice(&receiver.to_le_bytes());
    m.extend_from_slice(&counter.to_le_bytes());
    m.extend_from_slice(&sealed);
    m
}

impl Initiator {
    pub fn new(private: [u8; 32], responder: [u8; 32]) -> Initiator {
        let secret = StaticSecret::from(private);
        let static_static = secret.diffie_hellman(&PublicKey::from(responder)).to_bytes();
        Initiator {
            static_public: PublicKey::from(&secret).to_bytes(),
            static_secret: secret,
            pending: None,
            responder,
            static_static,
            mac1_key: mac1_key(&responder),
            cookie_key: hash(&[LABEL_COOKIE, &responder]),
            cookie: None,
            last_stamp: (0, 0),
            seed: u64::from_le_bytes(private[..8].try_into().unwrap()),
        }
    }

    fn stamp(&mut self) -> [u8; 12] {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        let mut next = ((1u64 << 62) + 10 + now.as_secs(), now.subsec_nanos());
        if next <= self.last_stamp {
            next = (self.last_stamp.0, self.last_stamp.1 + 1);
        }
        self.last_stamp = next;
        let mut t = [0u8; 12];
        t[..8].copy_from_slice(&next.0.to_be_bytes());
        t[8..].copy_from_slice(&next.1.to_be_bytes());
        t
    }

    /// A new initiation from `sender` (our index for the session it proposes); its mac1, to open the cookie
    /// reply it may get.
    pub fn initiation(&mut self, sender: u32) -> (Vec<u8>, [u8; 16]) {
        self.seed += 1;
        let ephemeral_bytes: [u8; 32] = super::pattern(32, self.seed).try_into().unwrap();
        let ephemeral = StaticSecret::from(ephemeral_bytes);
        let ephemeral_public = PublicKey::from(&ephemeral).to_bytes();
        let mut m = vec![0u8; INITIATION_LEN];
        m[0] = INITIATION;
        m[4..8].copy_from_slice(&sender.to_le_bytes());
        let mut chaining = hash(&[CONSTRUCTION]);
        let mut h = hash(&[&hash(&[&chaining, IDENTIFIER]), &self.responder]);
        chaining = kdf2(&chaining, &ephemeral_public).0;
        m[8..40].copy_from_slice(&ephemeral_public);
        h = hash(&[&h, &ephemeral_public]);
        let es = ephemeral.diffie_hellman(&PublicKey::from(self.responder)).to_bytes();
        let (c, key) = kdf2(&chaining, &es);
        chaining = c;
        let sealed_static = seal(&key, &self.static_public, &h);
        m[40..88].copy_from_slice(&sealed_static);
        h = hash(&[&h, &sealed_static]);
        let (c, key) = kdf2(&chaining, &self.static_static);
        chaining = c;
        let stamp = self.stamp();
        m[88..116].copy_from_slice(&seal(&key, &stamp, &h));
        h = hash(&[&h, &m[88..116]]);
        self.pending = Some((sender, ephemeral, chaining, h));
        let mac1 = set_mac1(&mut m, &self.mac1_key);
        if let Some(cookie) = self.cookie {
            let mac2 = keyed_mac(&cookie, &m[..132]);
            m[132..].copy_from_slice(&mac2);
        }
        (m, mac1)
    }

    /// Takes the cookie out of a cookie reply to the initiation whose mac1 was `mac1`; whether it opened.
    pub fn take_cookie(&mut self, reply: &[u8], mac1: &[u8; 16]) -> bool {
        if reply.len() != COOKIE_REPLY_LEN || reply[0] != COOKIE_REPLY {
            return false;
        }
        let cipher = <XChaCha20Poly1305 as KeyInit>::new((&self.cookie_key).into());
        let opened = cipher.decrypt(reply[8..32].into(), Payload { msg: &reply[32..], aad: mac1 });
        match opened {
            Ok(cookie) if cookie.len() == 16 => {
                self.cookie = Some(cookie.try_into().unwrap());
                true
            }
            _ => false,
        }
    }

    /// The cookie in use.
    pub fn cookie(&self) -> Option<[u8; 16]> {
        self.cookie
    }

    /// The session a response to the last initiation completes (no preshared key), as the initiator derives it;
    /// `None` when it does not answer that initiation or does not authenticate.
    pub fn session(&self, response: &[u8]) -> Option<Session> {
        let (sender, ephemeral, chaining, h) = self.pending.as_ref()?;
        if response.len() != RESPONSE_LEN || response[0] != RESPONSE || response[8..12] != sender.to_le_bytes() {
            return None;
        }
        let theirs: [u8; 32] = response[12..44].try_into().unwrap();
        let mut c = kdf2(chaining, &theirs).0;
        let mut h = hash(&[h, &theirs]);
        c = kdf2(&c, ephemeral.diffie_hellman(&PublicKey::from(theirs)).as_bytes()).0;
        c = kdf2(&c, self.static_secret.diffie_hellman(&PublicKey::from(theirs)).as_bytes()).0;
        // KDF3 of the (zero) preshared key: chaining key, a value for the hash, the key of the empty payload.
        let prk = hmac(&c, &[&[0u8; 32]]);
        let chained = hmac(&prk, &[&[1]]);
        let tau = hmac(&prk, &[&chained, &[2]]);
        let key = hmac(&prk, &[&tau, &[3]]);
        h = hash(&[&h, &tau]);
        let cipher = <ChaCha20Poly1305 as KeyInit>::new((&key).into());
        cipher.decrypt(&[0u8; 12].into(), Payload { msg: &response[44..60], aad: &h }).ok()?;
        let (send, receive) = kdf2(&chained, &[]);
        Some(Session { send, receive, remote_index: u32::from_le_bytes(response[4..8].try_into().unwrap()) })
    }
}
