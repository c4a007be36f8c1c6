//! The kernel's rules one at a time: rate-limited logs, the count of initiations, rekeying on either side,
//! which sessions a new handshake drops, keepalives, the last-minute rekey, a change of our key.

use turbotun::tunnel::{Opened, Sealed};

use super::*;
use crate::blake2s;
use crate::cookie;
use crate::message::INITIATION_LEN;
use crate::session::REKEY_AFTER_MESSAGES;
use crate::wireguard::handshake::{LOG_BURST, LOG_INTERVAL};

/// Every debug event of the thread, as text: what the handshake worker logs in a test that runs it here.
#[derive(Default, Clone)]
struct DebugLines(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for DebugLines {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::DEBUG
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0 += &format!("{value:?}");
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        self.0.lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl DebugLines {
    fn matching(&self, what: &str) -> Vec<String> {
        self.0.lock().unwrap().iter().filter(|l| l.contains(what)).cloned().collect()
    }
}

/// Item: a flood of forged initiations (valid mac1, garbage) writes at most the kernel's burst of debug lines a
/// window, and says how many it held back when the next window opens.
#[test]
fn test_debug_lines_about_refused_handshake_messages_are_rate_limited() {
    let (_a, b) = pair();
    let attacker: SocketAddr = ATTACKER.parse().unwrap();
    let mac1_key = hash(&[blake2s::LABEL_MAC1, &b.public()]);
    let mut jar = cookie::CookieJar::default();
    let lines = DebugLines::default();
    tracing::subscriber::with_default(lines.clone(), || {
        let mut wire = Vec::new();
        for round in 0..100u8 {
            let mut initiation = [round; INITIATION_LEN];
            initiation[..4].copy_from_slice(&[1, 0, 0, 0]);
            jar.stamp(&mac1_key, &mut initiation, Instant::now());
            b.receive(&Wire { data: initiation.to_vec(), from: attacker, to: b.addr }, &mut wire);
        }
        b.tick(&mut wire);
        assert_eq!(b.wg.settled(false).drops.unauthenticated, 100, "every one refused");
        assert_eq!(lines.matching("did not authenticate").len(), LOG_BURST as usize, "{:?}", lines.0);
        b.skip(LOG_INTERVAL);
        let mut initiation = [7u8; INITIATION_LEN];
        initiation[..4].copy_from_slice(&[1, 0, 0, 0]);
        jar.stamp(&mac1_key, &mut initiation, Instant::now());
        b.receive(&Wire { data: initiation.to_vec(), from: attacker, to: b.addr }, &mut wire);
        b.tick(&mut wire);
        assert_eq!(lines.matching("did not authenticate").len(), LOG_BURST as usize + 1);
        assert_eq!(lines.matching("90 lines about refused handshake messages suppressed").len(), 1, "{:?}", lines.0);
    });
}

/// Item: the initiator gives up after MAX_TIMER_HANDSHAKES + 2 initiations (the kernel retries while its count
/// of retries is at most MAX_TIMER_HANDSHAKES), and its log line says how many went.
#[test]
fn test_a_handshake_is_given_up_after_the_kernels_count_of_initiations_and_says_so() {
    let (a, b) = (Node::new(1, A), Node::new(2, B));
    a.configure(&b, "10.9.0.2/32", Some(b.addr), 0);
    let lines = DebugLines::default();
    let initiations = tracing::subscriber::with_default(lines.clone(), || {
        let mut wire = Vec::new();
        a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
        let mut initiations = 0;
        for _ in 0..(200_000 / 250) {
            a.tick(&mut wire);
            initiations += wire.iter().filter(|w| w.data[0] == 1).count();
            wire.clear();
            a.skip(250);
        }
        initiations
    });
    assert_eq!(initiations, MAX_TIMER_HANDSHAKES as usize + 2);
    let gave_up = lines.matching("giving up");
    assert_eq!(gave_up.len(), 1);
    assert!(gave_up[0].contains(&format!("after {initiations} attempts")), "{gave_up:?}");
}

/// Item: a session reaching REKEY_AFTER_MESSAGES asks for a new handshake on either side; the responder's too
/// (only the age waits for the initiator).
#[test]
fn test_the_responder_rekeys_after_rekey_after_messages() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    let session = only_peer(&b).keypairs().current.expect("B's session");
    assert!(!session.initiator, "B answered the handshake");
    let _ = session.take_counters(REKEY_AFTER_MESSAGES as usize);
    b.skip(REKEY_TIMEOUT + 1);
    assert!(matches!(b.send(&packet(B_INNER, A_INNER, 8), &mut wire), Sealed::Grown { .. }));
    wire.clear();
    b.tick(&mut wire);
    assert!(wire.iter().any(|w| w.from == b.addr && w.data[0] == 1), "B initiates: {wire:?}");
    let _ = a;
}

/// Item: a responder that takes a new initiation keeps `current` and drops both the old `next` and `previous`
/// (the kernel's add_new_keypair), their indices with them.
#[test]
fn test_a_responder_taking_an_initiation_drops_its_previous_session() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    let first = only_peer(&b).keypairs().current.expect("B's first session");
    // A second handshake, confirmed: B holds the first session as `previous`.
    let initiation = initiate_again(&a, &b, &mut wire);
    wire.push(initiation);
    deliver(&a, &b, &mut wire);
    let keypairs = only_peer(&b).keypairs();
    assert!(keypairs.previous.as_ref().is_some_and(|p| Arc::ptr_eq(p, &first)), "{keypairs:?}");
    let second = keypairs.current.clone().expect("B's second session");
    // A third initiation, taken by B, its response lost.
    let initiation = initiate_again(&a, &b, &mut wire);
    wire.clear();
    b.receive(&initiation, &mut wire);
    b.tick(&mut wire);
    let keypairs = only_peer(&b).keypairs();
    assert!(keypairs.next.is_some(), "the new session waits as next");
    assert!(keypairs.current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &second)), "current stays");
    assert!(keypairs.previous.is_none(), "previous dropped: {keypairs:?}");
    assert!(b.wg.peer_of_index(first.local_index).is_none(), "its index retired");
}

/// Item: the responder sends nothing when the initiator's first message confirms a session it waited for
/// (nothing was held), and so its passive keepalive goes KEEPALIVE_TIMEOUT after that message as it should.
#[test]
fn test_a_confirmed_session_sends_no_extra_keepalive_and_the_passive_one_follows() {
    let (a, b) = (Node::new(1, A), Node::new(2, B));
    a.configure(&b, "10.9.0.2/32", Some(b.addr), 0);
    b.configure(&a, "10.9.0.1/32", None, 0);
    let mut wire = Vec::new();
    a.send(&packet(A_INNER, B_INNER, 64), &mut wire);
    a.tick(&mut wire);
    let mut from_b = Vec::new();
    for _ in 0..10 {
        for d in std::mem::take(&mut wire) {
            if d.from == b.addr {
                from_b.push(d.data[0]);
            }
            let node = if d.to == a.addr { &a } else { &b };
            node.receive(&d, &mut wire);
        }
        a.tick(&mut wire);
        b.tick(&mut wire);
        // The timers are judged in milliseconds: what B receives comes after what it sent.
        b.skip(1);
    }
    assert_eq!(from_b, vec![2], "B sent its response and nothing else");
    // B got data and sent nothing back: its passive keepalive goes once KEEPALIVE_TIMEOUT has passed.
    b.skip(KEEPALIVE_TIMEOUT - 500);
    b.tick(&mut wire);
    assert!(wire.is_empty(), "not yet: {wire:?}");
    b.skip(750);
    b.tick(&mut wire);
    assert_eq!(wire.iter().map(|w| (w.data[0], w.data.len())).collect::<Vec<_>>(), vec![(4, 32)], "a keepalive");
}

/// Item: the last-minute rekey on receive is judged on the session we send with: a late message on the old
/// session (within KEEPALIVE_TIMEOUT + REKEY_TIMEOUT of its end) asks for nothing while the current one is young.
#[test]
fn test_a_late_message_on_the_previous_session_asks_for_no_handshake() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    a.skip(REKEY_AFTER_TIME + 10_000);
    b.skip(REKEY_AFTER_TIME + 10_000);
    // B seals with the first session; the message arrives late.
    assert!(matches!(b.send(&packet(B_INNER, A_INNER, 8), &mut wire), Sealed::Grown { .. }));
    let late = wire.pop().unwrap();
    // A's session is old: its next packet starts a new handshake, which completes.
    fresh_timestamp();
    a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    a.tick(&mut wire);
    deliver(&a, &b, &mut wire);
    let peer = only_peer(&a);
    let keypairs = peer.keypairs();
    let (current, previous) = (keypairs.current.unwrap(), keypairs.previous.unwrap());
    assert!(current.born_ms > previous.born_ms + REKEY_AFTER_TIME);
    // The late message comes when the first session is past LASTMINUTE_AGE and the current one is young.
    let to_lastminute = previous.born_ms + LASTMINUTE_AGE - a.wg.now();
    a.skip(to_lastminute + 1);
    peer.wants_handshake.store(false, Ordering::Relaxed);
    assert!(matches!(a.receive(&late, &mut wire).0, Opened::InPlace { .. }), "still opened");
    assert!(!peer.wants_handshake.load(Ordering::Relaxed), "no handshake asked for");
    assert!(!peer.sent_lastminute_handshake.load(Ordering::Relaxed));
}

/// The attack of a key change: a captured initiation is replayed after `private-key B; private-key A`. The peer
/// keeps the greatest timestamp taken from it, so the replay is refused, nothing answers it and the endpoint
/// stays; the old sessions stop sealing (a packet waits for a handshake with the key in force) but still open.
#[test]
fn test_a_key_change_and_back_keeps_replay_state_and_expires_sessions() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    let captured = initiate_again(&a, &b, &mut wire);
    wire.push(captured.clone());
    deliver(&a, &b, &mut wire);
    let peer = only_peer(&b);
    let mut config = b.wg.config();
    config.private_key = Some(crate::config::SecretKey::new([9; 32]));
    b.wg.apply(config.clone());
    config.private_key = Some(crate::config::SecretKey::new(b.private));
    b.wg.apply(config);
    // The replay, from the attacker.
    b.skip(REKEY_TIMEOUT + 1);
    b.wg.settled(false);
    let attacker: SocketAddr = ATTACKER.parse().unwrap();
    let replay = Wire { from: attacker, ..captured };
    assert_eq!(b.receive(&replay, &mut wire).0, Opened::Queued);
    b.tick(&mut wire);
    assert_eq!(b.wg.settled(false).drops.replayed, 1, "refused as a replay");
    assert!(wire.iter().all(|w| w.to != attacker), "nothing answers it: {wire:?}");
    assert_eq!(b.endpoint_of(&a), Some(a.addr), "the endpoint stays");
    assert!(Arc::ptr_eq(&peer, &only_peer(&b)), "the same peer");
    // A sends with the session it has: B still opens it.
    wire.clear();
    a.send(&packet(A_INNER, B_INNER, 8), &mut wire);
    let (opened, _) = b.receive(&wire.pop().unwrap(), &mut wire);
    assert!(matches!(opened, Opened::InPlace { .. }), "{opened:?}");
    // B seals nothing with it: the packet is held for a handshake.
    assert_eq!(b.send(&packet(B_INNER, A_INNER, 8), &mut wire), Sealed::Held);
    // A handshake with the key in force carries what B held.
    wire.retain(|w| w.to == a.addr);
    let (at_a, _) = deliver(&a, &b, &mut wire);
    assert_eq!(at_a, vec![packet(B_INNER, A_INNER, 8)]);
}

/// How many copies of the key whose masked form is `masked` (see `session::tests::KEY_MASK`) the writable memory
/// of this process holds, read through /proc/self/mem; the unmasked key is never formed here. The buffer the scan
/// reads into is left out: what it holds are images of memory already counted.
fn copies_in_own_memory(masked: &[u8; 32]) -> usize {
    use crate::session::tests::KEY_MASK;
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mem = std::fs::File::open("/proc/self/mem").unwrap();
    let mut copies = 0;
    let mut buf = vec![0u8; 1 << 20];
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        if !perms.starts_with("rw") || line.ends_with("[vvar]") {
            continue;
        }
        let (start, end) = range.split_once('-').unwrap();
        let (mut at, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
        while at < end {
            let len = (end - at).min(buf.len() as u64) as usize;
            let Ok(n) = mem.read_at(&mut buf[..len], at) else { break };
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            let scratch = buf.as_ptr() as u64..buf.as_ptr() as u64 + buf.len() as u64;
            copies += chunk
                .windows(32)
                .enumerate()
                .filter(|(i, w)| {
                    w[0] ^ KEY_MASK == masked[0]
                        && w.iter().zip(masked).all(|(b, m)| b ^ KEY_MASK == *m)
                        && !scratch.contains(&(at + *i as u64))
                })
                .count();
            at += n.saturating_sub(31).max(1) as u64;
        }
    }
    copies
}

/// Item: the zero-key timer (3 × REJECT_AFTER_TIME without a handshake, on the test clock) erases every session
/// of both sides where it is: no copy of their transport keys remains in this process's memory, although the
/// test still holds the sessions (as a worker's cache would).
#[test]
fn test_the_zero_key_timer_leaves_no_copy_of_the_keys_in_memory() {
    let (a, b) = pair();
    let mut wire = Vec::new();
    a.send(&packet(A_INNER, B_INNER, 100), &mut wire);
    b.send(&packet(B_INNER, A_INNER, 100), &mut wire);
    deliver(&a, &b, &mut wire);
    let held = [only_peer(&a).keypairs().current.unwrap(), only_peer(&b).keypairs().current.unwrap()];
    // The keys of the sessions this test's two devices made (on this thread, where their handshakes ran).
    let ours = crate::session::tests::MADE_KEYS.with_borrow(Vec::clone);
    assert!(ours.len() >= 2 && ours.iter().all(|k| copies_in_own_memory(k) > 0), "the scan sees no live key");
    for node in [&a, &b] {
        node.skip(3 * REJECT_AFTER_TIME + 1000);
        node.tick(&mut wire);
    }
    assert!(held.iter().all(|k| k.sealer().is_none()), "the sessions held are erased");
    for key in &ours {
        assert_eq!(copies_in_own_memory(key), 0, "a transport key outlived the zero-key timer");
    }
}

/// Item: the events a subscriber sees, in order, on the test clock: each side's handshake when its session starts
/// to send (the responder's once the initiator's first message on it came), the responder learning the
/// initiator's endpoint, and the zero-key timer's expiry on both sides; no event for what configuration did.
#[test]
fn test_subscribers_see_handshakes_a_learned_endpoint_and_the_keys_expire() {
    use crate::events::Event;
    let (a, b) = (Node::new(1, A), Node::new(2, B));
    let (events_a, events_b) = (a.wg.events.subscribe(), b.wg.events.subscribe());
    first_handshake(&a, &b);
    let mut wire = Vec::new();
    let seen_a: Vec<Event> = events_a.try_iter().collect();
    let seen_b: Vec<Event> = events_b.try_iter().collect();
    assert_eq!(seen_a, vec![Event::HandshakeCompleted { peer: b.public() }], "a configured b's endpoint itself");
    assert_eq!(
        seen_b,
        vec![
            Event::EndpointChanged { peer: a.public(), endpoint: a.addr },
            Event::HandshakeCompleted { peer: a.public() }
        ]
    );
    for node in [&a, &b] {
        node.skip(3 * REJECT_AFTER_TIME + 1000);
        node.tick(&mut wire);
    }
    assert_eq!(events_a.try_iter().collect::<Vec<_>>(), vec![Event::KeysExpired { peer: b.public() }]);
    assert_eq!(events_b.try_iter().collect::<Vec<_>>(), vec![Event::KeysExpired { peer: a.public() }]);
}
