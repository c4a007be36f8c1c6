//! WireGuard's defences against handshake floods, as the kernel implements them: every handshake message
//! carries mac1 (keyed by its receiver's public key, so only a sender who knows it gets any work done); under
//! load a message must also carry mac2, keyed by a cookie the receiver gave that source address in a cookie
//! reply (so a spoofed source gets nowhere); and under load each source address gets at most
//! [`PER_SOURCE_PER_SECOND`] handshake messages a second after a burst of [`PER_SOURCE_BURST`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{KeyInit, XChaCha20Poly1305};
use rand_core::{OsRng, RngCore};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::blake2s;
use crate::message::{field, macs_at, set_mac1, CookieReply, COOKIE_REPLY_LEN};

/// How long a cookie secret lives (and so a cookie), as the kernel's COOKIE_SECRET_MAX_AGE.
pub(crate) const COOKIE_SECRET_MAX_AGE: Duration = Duration::from_secs(120);
/// How much sooner a sender stops using a cookie than its secret's end (COOKIE_SECRET_LATENCY).
const COOKIE_SECRET_LATENCY: Duration = Duration::from_secs(5);
/// Handshake messages a second one source address may have processed under load (the kernel's ratelimiter).
pub(crate) const PER_SOURCE_PER_SECOND: u64 = 20;
/// The burst a source may send above that rate.
pub(crate) const PER_SOURCE_BURST: u64 = 5;
/// Sources the limiter tracks at once; beyond, a new source is refused until old ones expire (the kernel's
/// table is bounded the same way, by memory).
const MAX_SOURCES: usize = 16_384;

/// Whether `message`'s mac1 is the one `mac1_key` (HASH(LABEL_MAC1 || receiver's public key)) gives.
pub(crate) fn mac1_valid(mac1_key: &[u8; 32], message: &[u8]) -> bool {
    let (mac1_at, mac2_at) = macs_at(message.len());
    let expected = blake2s::mac(mac1_key, &[&message[..mac1_at]]);
    bool::from(expected.ct_eq(&message[mac1_at..mac2_at]))
}

/// What the receiver of a handshake message makes of its MACs (the kernel's `cookie_mac_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MacState {
    /// mac1 is wrong: the sender does not know our public key, or the message was changed.
    Invalid,
    /// mac1 is right; mac2 was not looked at, or is not the cookie of this source.
    ValidMacNoCookie,
    /// mac1 and the cookie are right, and the source is within its rate.
    ValidMacWithCookie,
    /// mac1 and the cookie are right, but the source is over its rate.
    ValidMacWithCookieButRateLimited,
}

/// The responder's side: the rotating secret that cookies are made from, the per-source rate limiter, and the
/// cookie replies.
pub(crate) struct CookieChecker {
    secret: Zeroizing<[u8; 32]>,
    secret_born: Instant,
    limiter: RateLimiter,
}

impl std::fmt::Debug for CookieChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CookieChecker").field("sources", &self.limiter.sources.len()).finish()
    }
}

impl Default for CookieChecker {
    fn default() -> Self {
        Self::new()
    }
}

/// The bytes of a source address that its cookie covers: address and port.
fn source_bytes(from: SocketAddr, out: &mut [u8; 18]) -> &[u8] {
    let len = match from.ip() {
        IpAddr::V4(ip) => {
            out[..4].copy_from_slice(&ip.octets());
            4
        }
        IpAddr::V6(ip) => {
            out[..16].copy_from_slice(&ip.octets());
            16
        }
    };
    out[len..len + 2].copy_from_slice(&from.port().to_be_bytes());
    &out[..len + 2]
}

impl CookieChecker {
    /// A checker with a fresh random secret.
    pub(crate) fn new() -> Self {
        let mut secret = Zeroizing::new([0u8; 32]);
        OsRng.fill_bytes(&mut *secret);
        CookieChecker { secret, secret_born: Instant::now(), limiter: RateLimiter::default() }
    }

    /// The cookie of source `from` under the current secret (the secret renewed when it is too old).
    fn cookie(&mut self, from: SocketAddr, now: Instant) -> [u8; 16] {
        if now.duration_since(self.secret_born) >= COOKIE_SECRET_MAX_AGE {
            OsRng.fill_bytes(&mut *self.secret);
            self.secret_born = now;
        }
        let mut buf = [0u8; 18];
        blake2s::mac(&*self.secret, &[source_bytes(from, &mut buf)])
    }

    /// What `message` from `from` carries: mac1 checked with `mac1_key`; under load, also its cookie and its
    /// source's rate.
    pub(crate) fn validate(
        &mut self,
        mac1_key: &[u8; 32],
        message: &[u8],
        from: SocketAddr,
        under_load: bool,
        now: Instant,
    ) -> MacState {
        if !mac1_valid(mac1_key, message) {
            return MacState::Invalid;
        }
        if !under_load {
            return MacState::ValidMacNoCookie;
        }
        let (_, mac2_at) = macs_at(message.len());
        let cookie = self.cookie(from, now);
        let expected = blake2s::mac(&cookie, &[&message[..mac2_at]]);
        if !bool::from(expected.ct_eq(&message[mac2_at..])) {
            return MacState::ValidMacNoCookie;
        }
        if self.limiter.allow(from.ip(), now) {
            MacState::ValidMacWithCookie
        } else {
            MacState::ValidMacWithCookieButRateLimited
        }
    }

    /// Writes into `reply` the cookie reply to `message` (an initiation or response with a valid mac1) from
    /// `from`: its cookie sealed with `cookie_key` (HASH(LABEL_COOKIE || our public key)), bound to the message's
    /// mac1.
    pub(crate) fn reply(
        &mut self,
        cookie_key: &[u8; 32],
        message: &[u8],
        from: SocketAddr,
        now: Instant,
        reply: &mut [u8; COOKIE_REPLY_LEN],
    ) {
        let cookie = self.cookie(from, now);
        let (mac1_at, mac2_at) = macs_at(message.len());
        let mut reply = CookieReply::start(reply);
        // The sender index of an initiation or a response, the same bytes in both.
        reply.set_receiver(u32::from_le_bytes(message[field::initiation::SENDER].try_into().expect("4 bytes")));
        let (nonce, sealed) = reply.nonce_and_cookie_mut();
        OsRng.fill_bytes(nonce);
        sealed[..16].copy_from_slice(&cookie);
        let cipher = XChaCha20Poly1305::new(cookie_key.into());
        let (text, tag_out) = sealed.split_at_mut(16);
        let tag =
            cipher.encrypt_in_place_detached((&*nonce).into(), &message[mac1_at..mac2_at], text).expect("16 bytes");
        tag_out.copy_from_slice(&tag);
    }

    /// Drops rate-limiter entries idle for more than a second; does nothing within a second of the last time
    /// (the handshake worker calls it with every tick, never a data worker).
    pub(crate) fn expire(&mut self, now: Instant) {
        self.limiter.expire(now);
    }
}

/// The per-source token bucket: a source key (an IPv4 address, or an IPv6 /64 as the kernel keys it) and its
/// tokens, in nanoseconds of credit.
#[derive(Default)]
struct RateLimiter {
    sources: HashMap<[u8; 8], (Instant, u64)>,
    /// When idle entries were last dropped.
    collected: Option<Instant>,
}

/// How often idle entries are dropped, and how long an entry must have been idle to go.
const GC_INTERVAL: Duration = Duration::from_secs(1);

/// The cost of one message in nanoseconds of credit, and the most credit a source may hold.
const TOKEN_COST: u64 = 1_000_000_000 / PER_SOURCE_PER_SECOND;
const TOKEN_MAX: u64 = TOKEN_COST * PER_SOURCE_BURST;

impl RateLimiter {
    fn key(ip: IpAddr) -> [u8; 8] {
        let mut key = [0u8; 8];
        match ip {
            IpAddr::V4(v4) => key[..4].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => key[..4].copy_from_slice(&v4.octets()),
                None => {
                    key.copy_from_slice(&v6.octets()[..8]);
                    // Tells a /64 from an IPv4 address whose bytes happen to match.
                    key[7] ^= 0x80;
                    key[4] ^= 0x01;
                }
            },
        }
        key
    }

    fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        let key = Self::key(ip);
        if let Some((last, tokens)) = self.sources.get_mut(&key) {
            let earned = u64::try_from(now.duration_since(*last).as_nanos()).unwrap_or(u64::MAX);
            *tokens = tokens.saturating_add(earned).min(TOKEN_MAX);
            *last = now;
            if *tokens >= TOKEN_COST {
                *tokens -= TOKEN_COST;
                return true;
            }
            return false;
        }
        // Full: refused at once, as the kernel refuses (its garbage collection, off the data path, makes room).
        // Never a scan here: a packet costs the same whatever the table holds.
        if self.sources.len() >= MAX_SOURCES {
            return false;
        }
        self.sources.insert(key, (now, TOKEN_MAX - TOKEN_COST));
        true
    }

    /// Drops the entries idle for a second, at most once a second (the kernel's garbage collection).
    fn expire(&mut self, now: Instant) {
        if self.collected.is_some_and(|at| now.duration_since(at) < GC_INTERVAL) {
            return;
        }
        self.collected = Some(now);
        self.sources.retain(|_, (last, _)| now.duration_since(*last) < GC_INTERVAL);
    }
}

/// The initiator's side for one peer: the mac1 of the last handshake message sent (a cookie reply is bound to
/// it) and the cookie last received, which gives later messages their mac2.
#[derive(Default)]
pub(crate) struct CookieJar {
    last_mac1: Option<[u8; 16]>,
    cookie: Option<([u8; 16], Instant)>,
}

impl std::fmt::Debug for CookieJar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CookieJar").field("has_cookie", &self.cookie.is_some()).finish()
    }
}

impl CookieJar {
    /// Writes mac1 (with `mac1_key`, HASH(LABEL_MAC1 || the peer's public key)) and, with a fresh cookie, mac2
    /// into the last 32 bytes of `message`.
    pub(crate) fn stamp(&mut self, mac1_key: &[u8; 32], message: &mut [u8], now: Instant) {
        let (_, mac2_at) = macs_at(message.len());
        let mac1 = set_mac1(message, mac1_key);
        self.last_mac1 = Some(mac1);
        let fresh =
            self.cookie.filter(|(_, born)| now.duration_since(*born) < COOKIE_SECRET_MAX_AGE - COOKIE_SECRET_LATENCY);
        let mac2 = match fresh {
            Some((cookie, _)) => blake2s::mac(&cookie, &[&message[..mac2_at]]),
            None => [0; 16],
        };
        message[mac2_at..].copy_from_slice(&mac2);
    }

    /// Takes the cookie of a cookie reply from the peer (opened with `cookie_key`, HASH(LABEL_COOKIE || the
    /// peer's public key)); false if it answers nothing we sent or does not authenticate. One reply per message.
    pub(crate) fn consume(&mut self, cookie_key: &[u8; 32], reply: &[u8], now: Instant) -> bool {
        let Some(mac1) = self.last_mac1 else { return false };
        let Some(reply) = CookieReply::new_checked(reply) else { return false };
        let cipher = XChaCha20Poly1305::new(cookie_key.into());
        let (sealed, tag) = reply.sealed_cookie().split_at(16);
        let mut cookie = [0u8; 16];
        cookie.copy_from_slice(sealed);
        if cipher.decrypt_in_place_detached(reply.nonce().into(), &mac1, &mut cookie, tag.into()).is_err() {
            return false;
        }
        self.cookie = Some((cookie, now));
        self.last_mac1 = None;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blake2s::{hash, LABEL_COOKIE, LABEL_MAC1};

    fn keys(public: &[u8; 32]) -> ([u8; 32], [u8; 32]) {
        (hash(&[LABEL_MAC1, public]), hash(&[LABEL_COOKIE, public]))
    }

    /// A full table refuses a new source at once, even when every entry is idle: the data path never scans it;
    /// the worker's collection (once a second) makes room.
    #[test]
    fn test_a_full_rate_limiter_refuses_a_new_source_without_a_scan() {
        let mut limiter = RateLimiter::default();
        let start = Instant::now();
        limiter.expire(start);
        for i in 0..MAX_SOURCES as u32 {
            assert!(limiter.allow(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)), start));
        }
        let later = start + Duration::from_secs(2);
        let newcomer: IpAddr = "192.0.2.77".parse().unwrap();
        assert!(!limiter.allow(newcomer, later), "full: refused, however idle the entries are");
        assert_eq!(limiter.sources.len(), MAX_SOURCES, "nothing was collected on the data path");
        limiter.expire(later);
        assert!(limiter.sources.is_empty(), "the collection drops the idle entries");
        assert!(limiter.allow(newcomer, later));
        // Collected at most once a second: an entry idle for more than a second stays until then.
        let idle = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000));
        assert!(limiter.allow(idle, later - Duration::from_millis(800)));
        limiter.expire(later + Duration::from_millis(300));
        assert_eq!(limiter.sources.len(), 2, "within a second of the last collection: nothing dropped");
        limiter.expire(later + Duration::from_millis(1000));
        assert!(limiter.sources.is_empty());
    }

    #[test]
    fn test_a_cookie_reply_gives_the_sender_a_mac2_the_checker_accepts_under_load() {
        let responder = [7u8; 32];
        let (mac1_key, cookie_key) = keys(&responder);
        let from: SocketAddr = "192.0.2.1:5000".parse().unwrap();
        let now = Instant::now();
        let mut checker = CookieChecker::new();
        let mut jar = CookieJar::default();
        let mut msg = [1u8; 148];
        jar.stamp(&mac1_key, &mut msg, now);
        assert_eq!(checker.validate(&mac1_key, &msg, from, false, now), MacState::ValidMacNoCookie);
        assert_eq!(checker.validate(&mac1_key, &msg, from, true, now), MacState::ValidMacNoCookie);
        let mut reply = [0u8; COOKIE_REPLY_LEN];
        checker.reply(&cookie_key, &msg, from, now, &mut reply);
        assert!(jar.consume(&cookie_key, &reply, now));
        assert!(!jar.consume(&cookie_key, &reply, now), "one reply per message");
        jar.stamp(&mac1_key, &mut msg, now);
        assert_eq!(checker.validate(&mac1_key, &msg, from, true, now), MacState::ValidMacWithCookie);
        // The cookie is the source's: another port of the same address has none.
        let other: SocketAddr = "192.0.2.1:5001".parse().unwrap();
        assert_eq!(checker.validate(&mac1_key, &msg, other, true, now), MacState::ValidMacNoCookie);
        msg[3] ^= 1;
        assert_eq!(checker.validate(&mac1_key, &msg, from, true, now), MacState::Invalid);
    }

    #[test]
    fn test_a_reply_to_another_message_or_with_another_key_is_refused() {
        let (mac1_key, cookie_key) = keys(&[7u8; 32]);
        let from: SocketAddr = "[2001:db8::1]:5000".parse().unwrap();
        let now = Instant::now();
        let mut checker = CookieChecker::new();
        let mut jar = CookieJar::default();
        let mut reply = [0u8; COOKIE_REPLY_LEN];
        let mut msg = [1u8; 92];
        checker.reply(&cookie_key, &msg, from, now, &mut reply);
        assert!(!jar.consume(&cookie_key, &reply, now), "nothing was sent");
        jar.stamp(&mac1_key, &mut msg, now);
        let (_, wrong_key) = keys(&[8u8; 32]);
        checker.reply(&wrong_key, &msg, from, now, &mut reply);
        assert!(!jar.consume(&cookie_key, &reply, now));
    }

    #[test]
    fn test_each_source_gets_its_burst_then_its_rate() {
        let mut limiter = RateLimiter::default();
        let now = Instant::now();
        let a: IpAddr = "198.51.100.1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b_same_64: IpAddr = "2001:db8:1:2::ffff".parse().unwrap();
        let allowed = (0..100).filter(|_| limiter.allow(a, now)).count() as u64;
        assert_eq!(allowed, PER_SOURCE_BURST);
        assert!(limiter.allow(b, now), "another source has its own bucket");
        let same_64 = (0..100).filter(|_| limiter.allow(b_same_64, now)).count() as u64;
        assert_eq!(same_64, PER_SOURCE_BURST - 1, "an IPv6 /64 is one source");
        let later = now + Duration::from_millis(1000 / PER_SOURCE_PER_SECOND);
        assert!(limiter.allow(a, later));
        assert!(!limiter.allow(a, later));
    }
}
