//! Two devices talking through a network held in memory: every datagram either sends is delivered by the test,
//! dropped, or handed to an attacker, and the clock is moved by hand.

use turbotun::tunnel::{Opened, SealBatch, Sealed, Transform};
use turbotun::{DropReason, Drops};

use super::*;
use crate::blake2s;
use crate::blake2s::hash;
use crate::config::PeerConfig;
use crate::cookie;
use crate::message::{DataHeader, COOKIE_REPLY_LEN, INITIATION_LEN, RESPONSE_LEN};
use crate::noise;
use turbotun::tunnel::SealOut;

mod live;
mod log;

const A: &str = "192.0.2.1:1000";
const B: &str = "192.0.2.2:2000";
const ATTACKER: &str = "198.51.100.66:666";

/// A datagram on the wire.
#[derive(Debug, Clone)]
struct Wire {
    data: Vec<u8>,
    from: SocketAddr,
    to: SocketAddr,
}

/// One device and its address.
struct Node {
    wg: WireGuard,
    addr: SocketAddr,
    private: Key,
}

impl Node {
    fn new(seed: u8, addr: &str) -> Self {
        Node { wg: WireGuard::new(), addr: addr.parse().unwrap(), private: [seed; 32] }
    }

    fn public(&self) -> Key {
        public_key(&self.private)
    }

    /// Configures one peer, `other`, allowed `allowed` and at `endpoint`.
    fn configure(&self, other: &Node, allowed: &str, endpoint: Option<SocketAddr>, keepalive: u16) {
        let mut peer = PeerConfig::new(other.public());
        peer.allowed_ips = vec![crate::uapi::set::parse_prefix(allowed).unwrap()];
        peer.endpoint = endpoint;
        peer.persistent_keepalive = keepalive;
        let mut config = self.wg.config();
        config.private_key = Some(crate::config::SecretKey::new(self.private));
        config.peers.retain(|p| p.public_key != other.public());
        config.peers.push(peer);
        self.wg.apply(config);
        self.wg.set_mtu(1420);
    }

    fn skip(&self, ms: u64) {
        self.wg.skipped_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// Seals `packet` as the tunnel does (a batch of one), what it and the protocol send going on the wire.
    fn send(&self, packet: &[u8], wire: &mut Vec<Wire>) -> Sealed {
        self.send_batch(&[packet.to_vec()], wire).0[0]
    }

    /// Seals `packets` as one batch read by the tunnel, each in a buffer with the room the transform asked for,
    /// what they and the protocol send going on the wire in order; the answers, and the packets as the
    /// transform left them in their buffers.
    fn send_batch(&self, packets: &[Vec<u8>], wire: &mut Vec<Wire>) -> (Vec<Sealed>, Vec<Vec<u8>>) {
        let room = self.wg.seal_room();
        let mut bufs: Vec<Vec<u8>> = packets
            .iter()
            .map(|p| {
                // Bytes the transform must not touch stand around the room.
                let mut buf = vec![0xee; 7 + room.front];
                buf.extend_from_slice(p);
                buf.resize(buf.len() + room.back, 0xee);
                buf.extend_from_slice(&[0xee; 7]);
                buf
            })
            .collect();
        let mut lens: Vec<usize> = packets.iter().map(Vec::len).collect();
        let mut sealed = vec![Sealed::Dropped(DropReason::Stopped); packets.len()];
        let mut out = SealOut::new(0, packets.len());
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[7..]).collect();
        let mut batch =
            SealBatch::new(turbotun::wire::Batch::new(&mut slices, &mut lens, room.front), room, &mut out, &mut sealed);
        let from = self.addr;
        self.wg.seal_batch(&mut batch, &mut |d, to| wire.push(Wire { data: d.to_vec(), from, to }));
        let mut left = Vec::new();
        for (i, buf) in bufs.iter().enumerate() {
            assert!(buf[..7].iter().chain(&buf[buf.len() - 7..]).all(|&b| b == 0xee), "packet {i}: outside its room");
            let in_room = &buf[7..buf.len() - 7];
            if let Sealed::Grown { start, len, to } = sealed[i] {
                wire.push(Wire { data: in_room[start..start + len].to_vec(), from, to });
            }
            left.push(in_room[room.front..room.front + packets[i].len()].to_vec());
        }
        (sealed, left)
    }

    /// Seals `packet` with the per-packet hook into a buffer of its own, what it and the protocol send going on
    /// the wire.
    fn send_one(&self, packet: &[u8], wire: &mut Vec<Wire>) -> Sealed {
        let mut packet = packet.to_vec();
        let mut out = vec![0u8; packet.len() + self.wg.overhead()];
        let from = self.addr;
        let sealed = self.wg.seal(&mut packet, &mut out, &mut |d, to| wire.push(Wire { data: d.to_vec(), from, to }));
        if let Sealed::Out { len, to } = sealed {
            wire.push(Wire { data: out[..len].to_vec(), from, to });
        }
        sealed
    }

    /// Opens one datagram; the packet it carried, if any.
    fn receive(&self, datagram: &Wire, wire: &mut Vec<Wire>) -> (Opened, Vec<u8>) {
        let mut data = datagram.data.clone();
        let mut out = vec![0u8; 65_536];
        let from = self.addr;
        let opened = self.wg.open(&mut data, datagram.from, None, &mut out, &mut |d, to| {
            wire.push(Wire { data: d.to_vec(), from, to })
        });
        // As the tunnel's receiving worker does after each batch.
        self.wg.opened_batch();
        let packet = match opened {
            Opened::Packet { len } => out[..len].to_vec(),
            Opened::InPlace { start, len } => data[start..start + len].to_vec(),
            _ => Vec::new(),
        };
        (opened, packet)
    }

    /// Runs the handshake worker once.
    fn tick(&self, wire: &mut Vec<Wire>) -> Drops {
        let from = self.addr;
        self.wg.tick(&mut |d, to| wire.push(Wire { data: d.to_vec(), from, to }))
    }

    fn endpoint_of(&self, other: &Node) -> Option<SocketAddr> {
        let config = self.wg.config();
        let i = config.peers.iter().position(|p| p.public_key == other.public()).unwrap();
        self.wg.peer_states()[i].endpoint
    }
}

/// An IPv4 packet from `src` to `dst` with `payload` bytes.
fn packet(src: [u8; 4], dst: [u8; 4], payload: usize) -> Vec<u8> {
    let mut p = vec![0u8; 20 + payload];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&((20 + payload) as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    for (i, b) in p[20..].iter_mut().enumerate() {
        *b = i as u8;
    }
    p
}

const A_INNER: [u8; 4] = [10, 9, 0, 1];
const B_INNER: [u8; 4] = [10, 9, 0, 2];

/// Delivers everything on the wire (and what the answers put on it) until it is quiet; the packets each side
/// opened, by receiver.
fn deliver(a: &Node, b: &Node, wire: &mut Vec<Wire>) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (mut at_a, mut at_b) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let pending: Vec<Wire> = std::mem::take(wire);
        for d in &pending {
            let (node, got) = if d.to == a.addr {
                (a, &mut at_a)
            } else if d.to == b.addr {
                (b, &mut at_b)
            } else {
                continue;
            };
            let (_, packet) = node.receive(d, wire);
            if !packet.is_empty() {
                got.push(packet);
            }
        }
        a.tick(wire);
        b.tick(wire);
        if wire.is_empty() {
            break;
        }
    }
    (at_a, at_b)
}

/// Two devices configured for each other (A knows B's endpoint, B learns A's) with a session up.
fn pair() -> (Node, Node) {
    let (a, b) = (Node::new(1, A), Node::new(2, B));
    first_handshake(&a, &b);
    (a, b)
}

/// Configures `a` and `b` for each other (A knows B's endpoint, B learns A's) and has A's first packet start
/// their first handshake and arrive with it.
fn first_handshake(a: &Node, b: &Node) {
    a.configure(b, "10.9.0.2/32", Some(b.addr), 0);
    b.configure(a, "10.9.0.1/32", None, 0);
    let mut wire = Vec::new();
    assert_eq!(a.send(&packet(A_INNER, B_INNER, 64), &mut wire), Sealed::Held);
    a.tick(&mut wire);
    let (_, at_b) = deliver(a, b, &mut wire);
    assert_eq!(at_b, vec![packet(A_INNER, B_INNER, 64)], "the held packet arrives once the handshake completes");
}

#[test]
fn test_a_handshake_carries_the_held_packet_and_data_flows_both_ways_padded() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    let p = packet(B_INNER, A_INNER, 64); // 84 bytes, as a ping of 56
    assert!(matches!(b.send(&p, &mut wire), Sealed::Grown { start: 0, len: 128, .. }), "16 + 96 padded + 16");
    let (at_a, _) = deliver(&a, &b, &mut wire);
    assert_eq!(at_a, vec![p.clone()]);
    // The per-packet hook seals the same message into a buffer of its own.
    assert!(matches!(b.send_one(&p, &mut wire), Sealed::Out { len: 128, .. }));
    let (at_a, _) = deliver(&a, &b, &mut wire);
    assert_eq!(at_a, vec![p]);
    assert_eq!(b.endpoint_of(&a), Some(a.addr));
    let before = b.wg.peer_states()[0].tx_bytes;
    b.send(&packet(B_INNER, A_INNER, 64), &mut wire);
    assert_eq!(b.wg.peer_states()[0].tx_bytes - before, 128, "whole messages are counted, padding included");
}

#[test]
fn test_unauthenticated_messages_never_move_an_endpoint() {
    let (a, b) = pair();
    let attacker: SocketAddr = ATTACKER.parse().unwrap();
    let mut wire = Vec::new();
    a.send(&packet(A_INNER, B_INNER, 10), &mut wire);
    let victim_index = DataHeader::new_checked(&wire[0].data[..]).expect("a data message").receiver();
    deliver(&a, &b, &mut wire);
    let mac1_key = hash(&[blake2s::LABEL_MAC1, &b.public()]);
    for under_load in [false, true] {
        if under_load {
            b.wg.under_load_until.store(u64::MAX, Ordering::Relaxed);
        }
        for round in 0..40u8 {
            // A response, a cookie reply and an initiation with valid mac1, random content and the victim's index.
            let mut response = [round; RESPONSE_LEN];
            response[..4].copy_from_slice(&[2, 0, 0, 0]);
            response[8..12].copy_from_slice(&victim_index.to_le_bytes());
            let mut initiation = [round; INITIATION_LEN];
            initiation[..4].copy_from_slice(&[1, 0, 0, 0]);
            let mut cookie = [round; COOKIE_REPLY_LEN];
            cookie[..4].copy_from_slice(&[3, 0, 0, 0]);
            cookie[4..8].copy_from_slice(&victim_index.to_le_bytes());
            let mut jar = cookie::CookieJar::default();
            jar.stamp(&mac1_key, &mut response, Instant::now());
            jar.stamp(&mac1_key, &mut initiation, Instant::now());
            for message in [&response[..], &initiation[..], &cookie[..]] {
                b.receive(&Wire { data: message.to_vec(), from: attacker, to: b.addr }, &mut wire);
            }
            b.tick(&mut wire);
        }
        assert_eq!(b.endpoint_of(&a), Some(a.addr), "under load: {under_load}");
        assert!(wire.iter().all(|w| w.to == attacker), "only cookie replies go out, to the sender");
        wire.clear();
        // Data still flows both ways.
        b.send(&packet(B_INNER, A_INNER, 10), &mut wire);
        a.send(&packet(A_INNER, B_INNER, 10), &mut wire);
        let (at_a, at_b) = deliver(&a, &b, &mut wire);
        assert_eq!((at_a.len(), at_b.len()), (1, 1));
    }
}

#[test]
fn test_under_load_each_source_gets_a_cookie_then_its_rate() {
    let (a, b) = pair();
    let attacker: SocketAddr = ATTACKER.parse().unwrap();
    b.wg.under_load_until.store(u64::MAX, Ordering::Relaxed);
    let mac1_key = hash(&[blake2s::LABEL_MAC1, &b.public()]);
    let mut jar = cookie::CookieJar::default();
    let cookie_key = hash(&[blake2s::LABEL_COOKIE, &b.public()]);
    let mut initiation = [7u8; INITIATION_LEN];
    initiation[..4].copy_from_slice(&[1, 0, 0, 0]);
    jar.stamp(&mac1_key, &mut initiation, Instant::now());
    let mut wire = Vec::new();
    let (opened, _) = b.receive(&Wire { data: initiation.to_vec(), from: attacker, to: b.addr }, &mut wire);
    assert_eq!(opened, Opened::Queued);
    b.tick(&mut wire);
    assert_eq!(wire.len(), 1, "a cookie reply");
    assert!(jar.consume(&cookie_key, &wire[0].data, Instant::now()));
    wire.clear();
    // With the cookie: a burst is taken, then the source is over its rate.
    let mut refused = 0;
    for _ in 0..50 {
        jar.stamp(&mac1_key, &mut initiation, Instant::now());
        match b.receive(&Wire { data: initiation.to_vec(), from: attacker, to: b.addr }, &mut wire).0 {
            Opened::Dropped(DropReason::RateLimited) => refused += 1,
            other => assert_eq!(other, Opened::Queued),
        }
    }
    assert_eq!(refused, 50 - cookie::PER_SOURCE_BURST as usize);
    let _ = a;
}

#[test]
fn test_a_message_held_back_past_a_thousand_others_is_taken_and_a_replay_is_not() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    for _ in 0..3000 {
        a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    }
    let late = wire.remove(0);
    let mut scratch = Vec::new();
    for d in &wire {
        assert!(matches!(b.receive(d, &mut scratch).0, Opened::InPlace { start: 16, .. }));
    }
    assert!(
        matches!(b.receive(&late, &mut scratch).0, Opened::InPlace { start: 16, .. }),
        "2999 later messages: within 8192"
    );
    assert_eq!(b.receive(&late, &mut scratch).0, Opened::Dropped(DropReason::Replayed));
}

/// The peer moves to a new address between two messages, and B's two workers (one socket each, as with two
/// queues) read the newer message from the new address first and the older one from the old address after: the
/// endpoint stays at the new address, where the newest message came from; a newer message from elsewhere moves
/// it again.
#[test]
fn test_the_endpoint_follows_the_newest_message_whichever_worker_reads_last() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    let moved: SocketAddr = "192.0.2.9:1001".parse().unwrap();
    let older = wire[0].clone();
    let newer = Wire { from: moved, ..wire[1].clone() };
    let on_a_worker = |d: &Wire| std::thread::scope(|s| s.spawn(|| b.receive(d, &mut Vec::new()).0).join().unwrap());
    assert!(matches!(on_a_worker(&newer), Opened::InPlace { start: 16, .. }));
    assert_eq!(b.endpoint_of(&a), Some(moved));
    assert!(matches!(on_a_worker(&older), Opened::InPlace { start: 16, .. }), "an older message is still taken");
    assert_eq!(b.endpoint_of(&a), Some(moved), "but does not move the endpoint back");
    wire.clear();
    a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    assert!(matches!(on_a_worker(&wire[0]), Opened::InPlace { start: 16, .. }));
    assert_eq!(b.endpoint_of(&a), Some(a.addr), "a newer message from the old address moves it back");
    // Sending follows it.
    wire.clear();
    assert!(matches!(b.send(&packet(B_INNER, A_INNER, 8), &mut wire), Sealed::Grown { to, .. } if to == a.addr));
}

#[test]
fn test_no_handshake_is_sent_to_a_low_order_key() {
    let a = Node::new(1, A);
    for low in crate::noise::tests::low_order_points() {
        let mut config =
            DeviceConfig { private_key: Some(crate::config::SecretKey::new(a.private)), ..DeviceConfig::default() };
        let mut peer = PeerConfig::new(low);
        peer.allowed_ips = vec![crate::uapi::set::parse_prefix("10.9.0.0/24").unwrap()];
        peer.endpoint = Some(B.parse().unwrap());
        peer.persistent_keepalive = 1;
        config.peers.push(peer);
        a.wg.apply(config);
        let mut wire = Vec::new();
        assert_eq!(a.send(&packet(A_INNER, B_INNER, 8), &mut wire), Sealed::Dropped(DropReason::NoSession));
        a.tick(&mut wire);
        a.skip(10_000);
        a.tick(&mut wire);
        assert!(wire.is_empty(), "nothing sent to a low-order key: {wire:?}");
    }
}

#[test]
fn test_persistent_keepalive_starts_handshakes_again_after_one_was_given_up() {
    let (a, b) = (Node::new(1, A), Node::new(2, B));
    a.configure(&b, "10.9.0.2/32", Some(b.addr), 5);
    b.configure(&a, "10.9.0.1/32", None, 0);
    let mut wire = Vec::new();
    // B is away: everything A sends is lost, for longer than a handshake is retried (90 s).
    let mut sent_initiations = 0;
    for _ in 0..(120_000 / 250) {
        a.tick(&mut wire);
        sent_initiations += wire.iter().filter(|w| w.data[0] == 1).count();
        wire.clear();
        a.skip(250);
    }
    assert!(sent_initiations > 18, "retried, given up, then started again by the keepalive: {sent_initiations}");
    // B is back: within one keepalive interval A initiates and the session comes up.
    let mut got_through = false;
    for _ in 0..(6_000 / 250) {
        a.tick(&mut wire);
        if wire.iter().any(|w| w.data[0] == 1) {
            deliver(&a, &b, &mut wire);
            got_through = true;
            break;
        }
        a.skip(250);
    }
    assert!(got_through, "an initiation within the keepalive interval");
    assert!(a.wg.peer_states()[0].last_handshake.is_some());
    assert!(b.wg.peer_states()[0].last_handshake.is_some());
}

#[test]
fn test_retransmission_stops_after_its_attempts_without_a_keepalive() {
    let (a, b) = (Node::new(1, A), Node::new(2, B));
    a.configure(&b, "10.9.0.2/32", Some(b.addr), 0);
    let mut wire = Vec::new();
    a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    let mut initiations = 0;
    let mut lost = 0;
    for _ in 0..(200_000 / 250) {
        lost += a.tick(&mut wire).no_session;
        initiations += wire.iter().filter(|w| w.data[0] == 1).count();
        wire.clear();
        a.skip(250);
    }
    assert_eq!(initiations, 2 + MAX_TIMER_HANDSHAKES as usize);
    assert_eq!(lost, 1, "the held packet is counted when the handshake is given up");
}

#[test]
fn test_a_session_is_renewed_before_it_expires_and_old_keys_are_forgotten() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    // Past REKEY_AFTER_TIME, the initiator's next packet asks for a new handshake.
    a.skip(REKEY_AFTER_TIME + 1000);
    b.skip(REKEY_AFTER_TIME + 1000);
    a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    a.tick(&mut wire);
    assert!(wire.iter().any(|w| w.data[0] == 1), "a new initiation");
    let (_, at_b) = deliver(&a, &b, &mut wire);
    assert_eq!(at_b.len(), 1);
    a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    assert_eq!(deliver(&a, &b, &mut wire).1.len(), 1, "the new session carries data");
    // Long silence: every key is zeroed after 3 × REJECT_AFTER_TIME, and sending starts a handshake again.
    a.skip(3 * REJECT_AFTER_TIME + 1000);
    a.tick(&mut wire);
    wire.clear();
    assert!(a.wg.peer_of_index(0).is_none());
    assert_eq!(a.send(&packet(A_INNER, B_INNER, 8), &mut wire), Sealed::Held);
}

#[test]
fn test_a_packet_from_a_source_the_peer_may_not_use_is_dropped() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    a.send(&packet([10, 9, 9, 9], B_INNER, 8), &mut wire);
    let (opened, _) = b.receive(&wire[0], &mut Vec::new());
    assert_eq!(opened, Opened::Dropped(DropReason::NotAllowed));
}

#[test]
fn test_every_handshake_message_taken_to_the_worker_is_settled_once() {
    let (a, b) = pair();
    let attacker: SocketAddr = ATTACKER.parse().unwrap();
    let mac1_key = hash(&[blake2s::LABEL_MAC1, &b.public()]);
    let mut jar = cookie::CookieJar::default();
    let forged = |round: u8, jar: &mut cookie::CookieJar| {
        let mut initiation = [round; INITIATION_LEN];
        initiation[..4].copy_from_slice(&[1, 0, 0, 0]);
        jar.stamp(&mac1_key, &mut initiation, Instant::now());
        Wire { data: initiation.to_vec(), from: attacker, to: b.addr }
    };
    let mut wire = Vec::new();
    b.wg.settled(false);
    for round in 0..10 {
        assert_eq!(b.receive(&forged(round, &mut jar), &mut wire).0, Opened::Queued);
    }
    b.tick(&mut wire);
    let settled = b.wg.settled(false);
    assert_eq!((settled.control, settled.drops.unauthenticated), (0, 10), "{settled:?}");
    // Under load: refused with a cookie reply each, counted as rate_limited.
    b.wg.under_load_until.store(u64::MAX, Ordering::Relaxed);
    for round in 0..5 {
        assert_eq!(b.receive(&forged(round, &mut jar), &mut wire).0, Opened::Queued);
    }
    b.tick(&mut wire);
    assert_eq!(b.wg.settled(false).drops.rate_limited, 5);
    assert_eq!(wire.iter().filter(|w| w.to == attacker && w.data[0] == 3).count(), 5, "a cookie reply each");
    // What waits when the tunnel stops is counted as stopped.
    for round in 0..3 {
        b.receive(&forged(round, &mut jar), &mut wire);
    }
    assert_eq!(b.wg.settled(true).drops.stopped, 3);
    // A genuine handshake is settled as the protocol's own.
    b.wg.under_load_until.store(0, Ordering::Relaxed);
    a.skip(REKEY_AFTER_TIME + 1000);
    // Past the 20 ms B keeps between two initiations it takes from one peer (50 a second), and with a timestamp
    // later than the last initiation's (TAI64N labels move in steps of about 16 ms of wall-clock time).
    b.skip(1000);
    let label = noise::tai64n(std::time::SystemTime::now());
    while noise::tai64n(std::time::SystemTime::now()) == label {
        std::thread::sleep(Duration::from_millis(1));
    }
    a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    a.tick(&mut wire);
    deliver(&a, &b, &mut wire);
    assert!(b.wg.settled(false).control >= 1);
}

/// A batch as the tunnel reads it: runs to one peer sealed in place with consecutive counters, each packet that
/// goes nowhere answered on its own and left as it was, the messages opening to the same packets in order.
#[test]
fn test_a_batch_seals_in_place_run_by_run() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    let to_b = |payload| packet(A_INNER, B_INNER, payload);
    let nowhere = packet(A_INNER, [10, 99, 0, 1], 30);
    let batch = vec![to_b(0), to_b(1), to_b(1400), nowhere.clone(), to_b(100), Vec::new(), to_b(1380)];
    let (sealed, left) = a.send_batch(&batch, &mut wire);
    let grown = |i: usize| matches!(sealed[i], Sealed::Grown { start: 0, to, .. } if to == b.addr);
    assert!([0, 1, 2, 4, 6].into_iter().all(grown), "{sealed:?}");
    assert_eq!(sealed[3], Sealed::Unreachable(DropReason::NoPeer));
    assert_eq!(sealed[5], Sealed::Dropped(DropReason::Malformed));
    assert_eq!(left[3], nowhere, "a packet answered unreachable is left as it was");
    // Padded to 16 within the MTU (1420): 20 -> 32, 21 -> 32, 1420 stays, 120 -> 128, 1400 -> 1408.
    let lens: Vec<usize> = wire.iter().map(|w| w.data.len()).collect();
    assert_eq!(lens, [16 + 32 + 16, 16 + 32 + 16, 16 + 1420 + 16, 16 + 128 + 16, 16 + 1408 + 16]);
    let counters: Vec<u64> = wire.iter().map(|w| u64::from_le_bytes(w.data[8..16].try_into().unwrap())).collect();
    assert!(counters.windows(2).all(|c| c[1] == c[0] + 1), "consecutive across runs: {counters:?}");
    let (_, at_b) = deliver(&a, &b, &mut wire);
    assert_eq!(at_b, [0, 1, 2, 4, 6].map(|i| batch[i].clone()));
}

/// Waits until the wall clock gives a TAI64N label later than the last one (labels move in steps of about 16 ms),
/// so that a new initiation is not taken for a replay of the last.
fn fresh_timestamp() {
    let label = noise::tai64n(std::time::SystemTime::now());
    while noise::tai64n(std::time::SystemTime::now()) == label {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The peer at position 0 of `node` (the tests configure one).
fn only_peer(node: &Node) -> Arc<Peer> {
    node.wg.peer_table().ordered()[0].peer.clone()
}

/// A starts a handshake with B past the limits between two (REKEY_TIMEOUT on A, 20 ms on B); its initiation.
fn initiate_again(a: &Node, b: &Node, wire: &mut Vec<Wire>) -> Wire {
    a.skip(REKEY_TIMEOUT + 1);
    b.skip(REKEY_TIMEOUT + 1);
    fresh_timestamp();
    a.wg.request_handshake(&only_peer(a));
    a.tick(wire);
    let at = wire.iter().position(|w| w.from == a.addr && w.data[0] == 1).expect("an initiation");
    wire.remove(at)
}

mod kernel_rules;
