//! The handshake storm of `turbotun bench --wg-storm`: N WireGuard peers whose private keys the bench knows, all
//! initiating a handshake with one server within a second, as after the server restarts. Run as the hidden
//! `turbotun bench --wg-storm-play ADDR:PORT` inside the storm's namespace.
//!
//! Each peer behaves as the kernel's initiator does: its initiation carries mac1, and mac2 once it holds a cookie;
//! a cookie reply is kept, not answered at once (the retransmission carries it); an initiation unanswered after
//! REKEY_TIMEOUT (5 s) plus up to a third of a second of jitter is replaced by a new one. Peer `i` sends from its
//! own address (`FIRST_SOURCE + i`, wrapping after 65,536: a /16 the bench routes to this namespace) through one
//! socket, the address chosen per datagram with `IP_PKTINFO`.
//!
//! The initiator's Noise (Noise_IKpsk2 as WireGuard specifies it) is written here on the RustCrypto primitives,
//! apart from turbotun-wg's responder: the bench plays it against wireguard-go too, which checks it. The work of
//! the initiators is done before the first initiation leaves (keys, initiations) and after the last answer arrives
//! (checking each response), so that during the storm this process only sends and receives.
//!
//! Prints `{"event":"start"}` when the first initiation leaves, `{"event":"answered"}` when the last answer
//! arrived (or the deadline passed), then the [`StormReport`] as one JSON line.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use blake2::digest::consts::U16;
use blake2::digest::{Digest, FixedOutput, KeyInit, Mac, Update};
use blake2::{Blake2s256, Blake2sMac};
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, XChaCha20Poly1305};
use hmac::SimpleHmac;
use serde::{Deserialize, Serialize};
use x25519_dalek::{PublicKey, StaticSecret};

/// The first key number of storm peers (apart from every other generated key's numbers).
const KEY_BASE: u64 = 1 << 40;
/// The first source address; peer `i` sends from `FIRST_SOURCE + i % SOURCES`.
pub(crate) const FIRST_SOURCE: Ipv4Addr = Ipv4Addr::new(10, 210, 0, 0);
/// The prefix length of the sources' /16.
pub(crate) const SOURCE_PREFIX_LEN: u8 = 16;
const SOURCES: usize = 1 << 16;
/// The kernel's REKEY_TIMEOUT and its jitter (`REKEY_TIMEOUT_JITTER_MAX_JIFFIES`, a third of a second).
const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
const REKEY_JITTER_MS: u64 = 334;
/// How long a cookie stays usable (the secret's two minutes, less the kernel's latency allowance).
const COOKIE_LIFE: Duration = Duration::from_secs(115);
/// The shortest and the longest wait for answers between sends (the first initiations leave in batches of a
/// millisecond's worth at least; the progress line is due every second).
const MIN_WAIT: Duration = Duration::from_millis(1);
const MAX_WAIT: Duration = Duration::from_millis(50);

const CONSTRUCTION: &[u8] = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
const IDENTIFIER: &[u8] = b"WireGuard v1 zx2c4 Jason@zx2c4.com";
const LABEL_MAC1: &[u8] = b"mac1----";
const LABEL_COOKIE: &[u8] = b"cookie--";

const INITIATION_LEN: usize = 148;
const RESPONSE_LEN: usize = 92;
const COOKIE_REPLY_LEN: usize = 64;

/// The private key of storm peer `i`.
pub(crate) fn private_key(i: usize) -> [u8; 32] {
    crate::peerconf::key_bytes(KEY_BASE + i as u64)
}

/// The public key of storm peer `i`, as the server is configured with it.
pub(crate) fn public_key(i: usize) -> [u8; 32] {
    PublicKey::from(&StaticSecret::from(private_key(i))).to_bytes()
}

fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Blake2s256::new();
    for p in parts {
        Digest::update(&mut h, p);
    }
    h.finalize().into()
}

fn mac(key: &[u8], data: &[u8]) -> [u8; 16] {
    let mut m = <Blake2sMac<U16> as KeyInit>::new_from_slice(key).expect("keys of 16 or 32 bytes");
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

/// WireGuard's KDF: the chaining key and up to three keys derived from `chaining` and `input`.
fn kdf<const N: usize>(chaining: &[u8; 32], input: &[u8]) -> [[u8; 32]; N] {
    let prk = hmac(chaining, &[input]);
    let mut out = [[0u8; 32]; N];
    let mut last: Vec<u8> = Vec::new();
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = hmac(&prk, &[&last, &[i as u8 + 1]]);
        last = slot.to_vec();
    }
    out
}

/// ChaCha20-Poly1305 with counter 0 (the handshake's only nonce), in place: `buf` is the text and room for the tag.
fn seal(key: &[u8; 32], aad: &[u8], buf: &mut [u8]) {
    let (text, tag_out) = buf.split_at_mut(buf.len() - 16);
    let tag =
        ChaCha20Poly1305::new(key.into()).encrypt_in_place_detached(&[0u8; 12].into(), aad, text).expect("short texts");
    tag_out.copy_from_slice(&tag);
}

fn open(key: &[u8; 32], aad: &[u8], sealed: &[u8]) -> bool {
    let (text, tag) = sealed.split_at(sealed.len() - 16);
    let mut text = text.to_vec();
    ChaCha20Poly1305::new(key.into()).decrypt_in_place_detached(&[0u8; 12].into(), aad, &mut text, tag.into()).is_ok()
}

fn tai64n(now: SystemTime) -> [u8; 12] {
    let d = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let mut t = [0u8; 12];
    t[..8].copy_from_slice(&((1u64 << 62) + d.as_secs()).to_be_bytes());
    t[8..].copy_from_slice(&d.subsec_nanos().to_be_bytes());
    t
}

/// The server's keys as an initiator uses them.
pub(crate) struct Server {
    public: [u8; 32],
    mac1_key: [u8; 32],
    cookie_key: [u8; 32],
    /// HASH(CONSTRUCTION): the chaining key every initiation starts from.
    first_chaining: [u8; 32],
    /// HASH(HASH(CONSTRUCTION) || IDENTIFIER || server's public key): the first hash of every initiation.
    first_hash: [u8; 32],
}

impl Server {
    pub(crate) fn new(public: [u8; 32]) -> Server {
        let c0 = hash(&[CONSTRUCTION]);
        Server {
            public,
            mac1_key: hash(&[LABEL_MAC1, &public]),
            cookie_key: hash(&[LABEL_COOKIE, &public]),
            first_chaining: c0,
            first_hash: hash(&[&hash(&[&c0, IDENTIFIER]), &public]),
        }
    }
}

/// One storm peer: its keys, its handshake under way, and the answer.
pub(crate) struct StormPeer {
    private: StaticSecret,
    public: [u8; 32],
    /// DH(our static, the server's static), computed once.
    static_static: [u8; 32],
    ephemeral: StaticSecret,
    chaining: [u8; 32],
    hash: [u8; 32],
    message: [u8; INITIATION_LEN],
    cookie: Option<([u8; 16], Instant)>,
    response: Option<[u8; RESPONSE_LEN]>,
    /// Initiations sent so far (each retransmission a new one).
    attempts: u32,
}

impl StormPeer {
    /// Peer `i` with its first initiation to `server` made.
    pub(crate) fn new(i: usize, server: &Server) -> StormPeer {
        let private = StaticSecret::from(private_key(i));
        let public = PublicKey::from(&private).to_bytes();
        let static_static = private.diffie_hellman(&PublicKey::from(server.public)).to_bytes();
        let mut peer = StormPeer {
            private,
            public,
            static_static,
            ephemeral: StaticSecret::from([0u8; 32]),
            chaining: [0; 32],
            hash: [0; 32],
            message: [0; INITIATION_LEN],
            cookie: None,
            response: None,
            attempts: 0,
        };
        peer.initiate(i as u32 + 1, server, SystemTime::now(), Instant::now());
        peer
    }

    /// A new initiation (a fresh ephemeral key and timestamp) with sender index `index`, mac1, and mac2 with a
    /// cookie younger than [`COOKIE_LIFE`] at `now`.
    fn initiate(&mut self, index: u32, server: &Server, wall: SystemTime, now: Instant) {
        let mut secret = [0u8; 32];
        fastrand::fill(&mut secret);
        self.ephemeral = StaticSecret::from(secret);
        let ephemeral_public = PublicKey::from(&self.ephemeral).to_bytes();
        let m = &mut self.message;
        m.fill(0);
        m[0] = 1;
        m[4..8].copy_from_slice(&index.to_le_bytes());
        m[8..40].copy_from_slice(&ephemeral_public);
        let [c] = kdf::<1>(&server.first_chaining, &ephemeral_public);
        let h = hash(&[&server.first_hash, &ephemeral_public]);
        let es = self.ephemeral.diffie_hellman(&PublicKey::from(server.public)).to_bytes();
        let [c, k] = kdf::<2>(&c, &es);
        m[40..72].copy_from_slice(&self.public);
        seal(&k, &h, &mut m[40..88]);
        let h = hash(&[&h, &m[40..88]]);
        let [c, k] = kdf::<2>(&c, &self.static_static);
        m[88..100].copy_from_slice(&tai64n(wall));
        seal(&k, &h, &mut m[88..116]);
        self.hash = hash(&[&h, &m[88..116]]);
        self.chaining = c;
        let mac1 = mac(&server.mac1_key, &m[..116]);
        m[116..132].copy_from_slice(&mac1);
        if let Some((cookie, _)) = self.cookie.filter(|(_, born)| now.duration_since(*born) < COOKIE_LIFE) {
            let mac2 = mac(&cookie, &m[..132]);
            m[132..].copy_from_slice(&mac2);
        }
        self.attempts += 1;
    }

    /// Takes the cookie of a cookie reply to our last initiation (bound to its mac1); false if it does not open.
    fn take_cookie(&mut self, server: &Server, reply: &[u8], now: Instant) -> bool {
        let (nonce, sealed) = (&reply[8..32], &reply[32..64]);
        let mut cookie = [0u8; 16];
        cookie.copy_from_slice(&sealed[..16]);
        let opened = XChaCha20Poly1305::new((&server.cookie_key).into()).decrypt_in_place_detached(
            nonce.into(),
            &self.message[116..132],
            &mut cookie,
            sealed[16..].into(),
        );
        if opened.is_err() {
            return false;
        }
        self.cookie = Some((cookie, now));
        true
    }

    /// Whether the response held authenticates as the answer to our last initiation: its mac1 (for our public
    /// key), its receiver index, and the empty text sealed with the keys both DH results give.
    fn response_valid(&self, index: u32) -> bool {
        let Some(r) = &self.response else { return false };
        if r[..4] != [2, 0, 0, 0] || r[8..12] != index.to_le_bytes() {
            return false;
        }
        if mac(&hash(&[LABEL_MAC1, &self.public]), &r[..60]) != r[60..76] {
            return false;
        }
        let theirs: [u8; 32] = r[12..44].try_into().expect("32 bytes");
        let [c] = kdf::<1>(&self.chaining, &theirs);
        let h = hash(&[&self.hash, &theirs]);
        let ee = self.ephemeral.diffie_hellman(&PublicKey::from(theirs)).to_bytes();
        let [c] = kdf::<1>(&c, &ee);
        let se = self.private.diffie_hellman(&PublicKey::from(theirs)).to_bytes();
        let [c] = kdf::<1>(&c, &se);
        let [_, tau, k] = kdf::<3>(&c, &[0u8; 32]); // no preshared key
        let h = hash(&[&h, &tau]);
        open(&k, &h, &r[44..60])
    }
}

/// What the storm generator prints at the end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct StormReport {
    pub peers: usize,
    /// Peers holding a response that authenticates: their handshake done on the initiator's side.
    pub completed: usize,
    /// Peers answered with a response that does not authenticate.
    pub invalid: usize,
    /// Initiations sent, first ones and retransmissions.
    pub initiations: u64,
    pub retransmissions: u64,
    pub cookie_replies: u64,
    pub send_errors: u64,
    /// From the first initiation to the last response (or the deadline).
    pub storm_s: f64,
    /// Making the keys and first initiations, before the storm.
    pub prepare_s: f64,
}

/// The storm: `peers` peers initiating with `server` at `dest` within `spread`, answered or given up at
/// `deadline` (or when `stop` is set).
pub(crate) fn storm(
    dest: SocketAddrV4,
    server_public: [u8; 32],
    peers: usize,
    spread: Duration,
    deadline: Duration,
    stop: &AtomicBool,
) -> Result<StormReport> {
    if peers == 0 {
        bail!("a storm needs at least one peer");
    }
    let server = Server::new(server_public);
    let prepared = Instant::now();
    let mut all = make_peers(peers, &server);
    let prepare_s = prepared.elapsed().as_secs_f64();
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).context("bind the storm's socket")?;
    // Cookie replies come back as fast as the first initiations leave: room for all of them.
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &(16 << 20))
        .context("SO_RCVBUFFORCE on the storm's socket")?;
    socket.set_nonblocking(true).context("a non-blocking storm socket")?;
    let mut report = StormReport { peers, prepare_s, ..Default::default() };
    let start = Instant::now();
    println!("{{\"event\":\"start\"}}");
    let mut first_unsent = 0usize;
    let mut retries: VecDeque<(Instant, usize, u32)> = VecDeque::new();
    let mut answered = 0usize;
    let mut buf = [0u8; 256];
    let send = |i: usize, message: &[u8], report: &mut StormReport| {
        let source = Ipv4Addr::from(u32::from(FIRST_SOURCE) + (i % SOURCES) as u32);
        if send_from(&socket, message, source, dest).is_err() {
            report.send_errors += 1;
        }
        report.initiations += 1;
    };
    let mut progress_at = start + Duration::from_secs(1);
    while answered < peers && !stop.load(Ordering::Relaxed) && start.elapsed() < deadline {
        let now = Instant::now();
        if now >= progress_at {
            // Its log says how the storm went, second by second.
            eprintln!(
                "storm: {:.0} s: {answered} of {peers} answered, {} initiations sent ({} retransmitted), {} cookie \
                 replies, {} send errors",
                (now - start).as_secs_f64(),
                report.initiations,
                report.retransmissions,
                report.cookie_replies,
                report.send_errors
            );
            progress_at += Duration::from_secs(1);
        }
        let due = ((now - start).as_secs_f64() / spread.as_secs_f64().max(1e-3) * peers as f64).ceil() as usize;
        while first_unsent < due.min(peers) {
            let i = first_unsent;
            send(i, &all[i].message, &mut report);
            retries.push_back((now + retransmit_after(), i, all[i].attempts));
            first_unsent += 1;
        }
        while retries.front().is_some_and(|(at, ..)| *at <= now) {
            let (_, i, attempt) = retries.pop_front().expect("a front");
            let p = &mut all[i];
            if p.response.is_some() || p.attempts != attempt {
                continue;
            }
            p.initiate(i as u32 + 1, &server, SystemTime::now(), now);
            send(i, &p.message, &mut report);
            report.retransmissions += 1;
            retries.push_back((now + retransmit_after(), i, p.attempts));
        }
        // Every answer waiting, before any more is sent: an answer read late is one its initiator may have
        // replaced (a cookie bound to an initiation since retransmitted opens no more).
        while let Ok(len) = socket.recv(&mut buf) {
            // Our sender index, where each answer carries it: after the responder's own index in a response.
            let at = if buf[0] == 2 { 8 } else { 4 };
            let receiver = buf.get(at..at + 4).filter(|_| len >= at + 4);
            let receiver = receiver.map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
            let Some(i) = receiver.and_then(|r| (r as usize).checked_sub(1)).filter(|i| *i < peers) else {
                continue;
            };
            let p = &mut all[i];
            match (buf[0], len) {
                (2, RESPONSE_LEN) if p.response.is_none() => {
                    p.response = Some(buf[..RESPONSE_LEN].try_into().expect("92 bytes"));
                    answered += 1;
                }
                (3, COOKIE_REPLY_LEN) if p.take_cookie(&server, &buf[..len], Instant::now()) => {
                    report.cookie_replies += 1;
                }
                _ => {}
            }
        }
        // Then wait in the kernel for an answer or the next send: a generator that woke often would take the CPU
        // from the endpoint it measures.
        let next_first =
            (first_unsent < peers).then(|| start + spread.mul_f64((first_unsent + 1) as f64 / peers as f64));
        let next_due = [next_first, retries.front().map(|r| r.0)].into_iter().flatten().min();
        let wait = next_due.map_or(MAX_WAIT, |due| due.saturating_duration_since(Instant::now())).min(MAX_WAIT);
        if wait >= MIN_WAIT {
            use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
            let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(wait.as_millis() as u16));
        }
    }
    report.storm_s = start.elapsed().as_secs_f64();
    println!("{{\"event\":\"answered\"}}");
    let valid = check_responses(&all);
    report.completed = valid;
    report.invalid = answered - valid;
    Ok(report)
}

fn retransmit_after() -> Duration {
    REKEY_TIMEOUT + Duration::from_millis(fastrand::u64(..REKEY_JITTER_MS))
}

/// Every peer and its first initiation, made on every core.
fn make_peers(peers: usize, server: &Server) -> Vec<StormPeer> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = peers.div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = (0..peers)
            .step_by(chunk)
            .map(|first| {
                s.spawn(move || {
                    (first..(first + chunk).min(peers)).map(|i| StormPeer::new(i, server)).collect::<Vec<_>>()
                })
            })
            .collect();
        parts.into_iter().flat_map(|h| h.join().expect("a key thread does not panic")).collect::<Vec<StormPeer>>()
    })
}

/// How many peers hold a response that authenticates, checked on every core.
fn check_responses(all: &[StormPeer]) -> usize {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = all.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = all
            .chunks(chunk)
            .enumerate()
            .map(|(n, peers)| {
                s.spawn(move || {
                    peers.iter().enumerate().filter(|(j, p)| p.response_valid((n * chunk + j) as u32 + 1)).count()
                })
            })
            .collect();
        parts.into_iter().map(|h| h.join().expect("a check thread does not panic")).sum()
    })
}

/// One datagram from `source` (`IP_PKTINFO`: any address of the storm's local /16).
fn send_from(socket: &UdpSocket, data: &[u8], source: Ipv4Addr, dest: SocketAddrV4) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrIn};
    let info = libc::in_pktinfo {
        ipi_ifindex: 0,
        ipi_spec_dst: libc::in_addr { s_addr: u32::from(source).to_be() },
        ipi_addr: libc::in_addr { s_addr: 0 },
    };
    let to = SockaddrIn::from(dest);
    sendmsg(
        socket.as_raw_fd(),
        &[IoSlice::new(data)],
        &[ControlMessage::Ipv4PacketInfo(&info)],
        MsgFlags::empty(),
        Some(&to),
    )
    .map(drop)
    .map_err(std::io::Error::from)
}

/// The hidden `--wg-storm-play`: the storm, then the report on standard output.
pub(crate) fn run(dest: SocketAddr, key: &str, peers: usize, deadline_s: u64) -> Result<()> {
    let SocketAddr::V4(dest) = dest else { bail!("the storm runs over IPv4 only, not to {dest}") };
    let public = crate::wgflood::parse_public_key(key)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let report = storm(dest, public, peers, Duration::from_secs(1), Duration::from_secs(deadline_s), &stop)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_keys() -> (StaticSecret, Server) {
        let private = StaticSecret::from([5u8; 32]);
        let server = Server::new(PublicKey::from(&private).to_bytes());
        (private, server)
    }

    /// An initiation as the responder reads it: its header, its mac1 for the server, no mac2 without a cookie,
    /// and the static key inside opens (with the server's private key) to the peer's public key.
    #[test]
    fn test_an_initiation_opens_with_the_servers_key() {
        let (server_private, server) = server_keys();
        let peer = StormPeer::new(7, &server);
        let m = &peer.message;
        assert_eq!((m[..4].to_vec(), &m[4..8]), (vec![1, 0, 0, 0], &8u32.to_le_bytes()[..]));
        assert_eq!(m[116..132], mac(&hash(&[LABEL_MAC1, &server.public]), &m[..116]));
        assert_eq!(m[132..], [0u8; 16]);
        // The responder's first steps: C and H from the ephemeral, then DH(server static, ephemeral).
        let ephemeral: [u8; 32] = m[8..40].try_into().unwrap();
        let [c] = kdf::<1>(&hash(&[CONSTRUCTION]), &ephemeral);
        let h = hash(&[&server.first_hash, &ephemeral]);
        let es = server_private.diffie_hellman(&PublicKey::from(ephemeral)).to_bytes();
        let [_, k] = kdf::<2>(&c, &es);
        let (text, tag) = m[40..88].split_at(32);
        let mut opened = text.to_vec();
        ChaCha20Poly1305::new((&k).into())
            .decrypt_in_place_detached(&[0u8; 12].into(), &h, &mut opened, tag.into())
            .unwrap();
        assert_eq!(opened, public_key(7));
        assert_eq!(public_key(7), peer.public);
        assert_ne!(public_key(7), public_key(8));
    }

    /// A cookie reply bound to the last initiation's mac1 is taken, one bound to anything else is not, and the
    /// retransmission carries mac2 made with the cookie.
    #[test]
    fn test_a_cookie_reply_gives_the_retransmission_its_mac2() {
        let (_, server) = server_keys();
        let mut peer = StormPeer::new(0, &server);
        let cookie = [0x42u8; 16];
        let reply = |mac1: &[u8]| {
            let mut r = [0u8; COOKIE_REPLY_LEN];
            r[0] = 3;
            r[4..8].copy_from_slice(&1u32.to_le_bytes());
            r[8..32].copy_from_slice(&[9u8; 24]);
            let mut sealed = cookie;
            let tag = XChaCha20Poly1305::new((&server.cookie_key).into())
                .encrypt_in_place_detached((&[9u8; 24]).into(), mac1, &mut sealed)
                .unwrap();
            r[32..48].copy_from_slice(&sealed);
            r[48..].copy_from_slice(&tag);
            r
        };
        let now = Instant::now();
        assert!(!peer.take_cookie(&server, &reply(&[0u8; 16]), now), "bound to another message");
        let mac1 = peer.message[116..132].to_vec();
        assert!(peer.take_cookie(&server, &reply(&mac1), now));
        peer.initiate(1, &server, SystemTime::now(), now);
        assert_eq!(peer.attempts, 2);
        assert_eq!(peer.message[132..], mac(&cookie, &peer.message[..132]));
        // A cookie past its life is not used.
        peer.initiate(1, &server, SystemTime::now(), now + COOKIE_LIFE);
        assert_eq!(peer.message[132..], [0u8; 16]);
    }
}
