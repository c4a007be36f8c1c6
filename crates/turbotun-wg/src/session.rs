//! Transport data: the keys of one session, its send counter and its receive window. Sealing and opening work in
//! place in the tunnel's own buffers; the counter is one atomic, so several queues can send for one session.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};

use crate::noise::{nonce, SessionKeys, DATA_HEADER_LEN, TAG_LEN};

/// Messages after which the initiator of a session starts a new handshake (the kernel's REKEY_AFTER_MESSAGES).
pub const REKEY_AFTER_MESSAGES: u64 = 1 << 60;
/// Bits of the receive window (the kernel's COUNTER_BITS_TOTAL).
pub const WINDOW_BITS: u64 = 8192;
const WORD_BITS: u64 = 64;
const WORDS: usize = (WINDOW_BITS / WORD_BITS) as usize;
/// How far behind the greatest counter seen a message may arrive: the window less one word, which is cleared as
/// the window moves (COUNTER_WINDOW_SIZE).
pub const WINDOW_SIZE: u64 = WINDOW_BITS - WORD_BITS;
/// Messages after which a session's keys are never used again (the kernel's REJECT_AFTER_MESSAGES).
pub const REJECT_AFTER_MESSAGES: u64 = u64::MAX - WINDOW_SIZE - 1;
/// Transport data is padded with zeros to a multiple of this, within the MTU.
pub const PADDING_MULTIPLE: usize = 16;

/// The counters seen of one session, as a sliding bitmap: a message is taken once, and not when it is older than
/// the window (the kernel's algorithm, RFC 6479's idea).
#[derive(Debug)]
pub struct ReplayWindow {
    /// One more than the greatest counter taken.
    next: u64,
    bits: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow { next: 0, bits: [0; WORDS] }
    }
}

impl ReplayWindow {
    /// Takes `counter` (of a message that authenticated): false if it was seen before, is too old, or is past
    /// the session's last.
    pub fn accept(&mut self, counter: u64) -> bool {
        if self.next > REJECT_AFTER_MESSAGES || counter >= REJECT_AFTER_MESSAGES {
            return false;
        }
        let counter = counter + 1;
        if WINDOW_SIZE + counter < self.next {
            return false;
        }
        let word = counter / WORD_BITS;
        if counter > self.next {
            let current = self.next / WORD_BITS;
            let moved = (word - current).min(WORDS as u64);
            for i in 1..=moved {
                self.bits[((current + i) % WORDS as u64) as usize] = 0;
            }
            self.next = counter;
        }
        let slot = &mut self.bits[(word % WORDS as u64) as usize];
        let bit = 1u64 << (counter % WORD_BITS);
        let fresh = *slot & bit == 0;
        *slot |= bit;
        fresh
    }
}

/// The keys of one session and what goes with them.
pub struct Keypair {
    /// The index we gave the session (what the peer's messages carry as their receiver).
    pub local_index: u32,
    /// The index the peer gave it (what ours carry).
    pub remote_index: u32,
    /// Whether we initiated the handshake that made it (only the initiator rekeys on age and count).
    pub initiator: bool,
    /// When it was made, in the device's clock (milliseconds).
    pub born_ms: u64,
    send: LessSafeKey,
    receive: LessSafeKey,
    send_counter: AtomicU64,
    window: Mutex<ReplayWindow>,
    /// Whether the peer is known to have it: always for the initiator; for the responder once the initiator's
    /// first message with it arrived.
    confirmed: AtomicBool,
}

impl std::fmt::Debug for Keypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keypair")
            .field("local_index", &self.local_index)
            .field("remote_index", &self.remote_index)
            .field("initiator", &self.initiator)
            .field("sent", &self.send_counter.load(Ordering::Relaxed))
            .finish()
    }
}

/// The length a packet of `len` bytes is padded to, for a device of `mtu` (0: unknown): the next multiple of
/// [`PADDING_MULTIPLE`], never past the MTU (as the kernel pads).
pub fn padded_len(len: usize, mtu: usize) -> usize {
    let aligned = len.div_ceil(PADDING_MULTIPLE) * PADDING_MULTIPLE;
    if mtu == 0 {
        return aligned;
    }
    let last_unit = if len > mtu { len % mtu } else { len };
    let padded_unit = mtu.min(last_unit.div_ceil(PADDING_MULTIPLE) * PADDING_MULTIPLE).max(last_unit);
    len + (padded_unit - last_unit)
}

impl Keypair {
    /// A session from handshake keys.
    pub fn new(keys: &SessionKeys, local_index: u32, remote_index: u32, initiator: bool, born_ms: u64) -> Self {
        let key = |k: &[u8; 32]| LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, k).expect("32-byte key"));
        Keypair {
            local_index,
            remote_index,
            initiator,
            born_ms,
            send: key(&keys.send),
            receive: key(&keys.receive),
            send_counter: AtomicU64::new(0),
            window: Mutex::new(ReplayWindow::default()),
            confirmed: AtomicBool::new(false),
        }
    }

    /// Whether the peer is known to have this session.
    pub fn confirmed(&self) -> bool {
        self.confirmed.load(Ordering::Acquire)
    }

    /// Records that the peer has this session.
    pub fn confirm(&self) {
        self.confirmed.store(true, Ordering::Release);
    }

    /// Messages sent so far.
    pub fn sent(&self) -> u64 {
        self.send_counter.load(Ordering::Relaxed)
    }

    /// Seals `packet` (possibly empty: a keepalive) into `out` as a transport data message, padded for a device
    /// of `mtu`; returns its length and counter, or `None` when the session may send no more or `out` is short.
    pub fn seal(&self, packet: &[u8], out: &mut [u8], mtu: usize) -> Option<(usize, u64)> {
        let padded = padded_len(packet.len(), mtu);
        let total = DATA_HEADER_LEN + padded + TAG_LEN;
        if out.len() < total {
            return None;
        }
        let counter = self.send_counter.fetch_add(1, Ordering::Relaxed);
        if counter >= REJECT_AFTER_MESSAGES {
            return None;
        }
        out[..4].copy_from_slice(&[4, 0, 0, 0]);
        out[4..8].copy_from_slice(&self.remote_index.to_le_bytes());
        out[8..16].copy_from_slice(&counter.to_le_bytes());
        let body = &mut out[DATA_HEADER_LEN..DATA_HEADER_LEN + padded];
        body[..packet.len()].copy_from_slice(packet);
        body[packet.len()..].fill(0);
        let tag = self
            .send
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce(counter)), Aad::empty(), body)
            .ok()?;
        out[DATA_HEADER_LEN + padded..total].copy_from_slice(tag.as_ref());
        Some((total, counter))
    }

    /// Opens a transport data message in place: its plaintext (padding included) and its counter, or why not.
    pub fn open<'a>(&self, message: &'a mut [u8]) -> Result<(&'a mut [u8], u64), OpenError> {
        let mut counter = [0u8; 8];
        counter.copy_from_slice(message.get(8..16).ok_or(OpenError::Unauthenticated)?);
        let counter = u64::from_le_bytes(counter);
        if counter >= REJECT_AFTER_MESSAGES {
            return Err(OpenError::Replayed);
        }
        let body = message.get_mut(DATA_HEADER_LEN..).ok_or(OpenError::Unauthenticated)?;
        let plain = self
            .receive
            .open_in_place(Nonce::assume_unique_for_key(nonce(counter)), Aad::empty(), body)
            .map_err(|_| OpenError::Unauthenticated)?;
        // Only a message that authenticated may move the window.
        if !self.window.lock().unwrap_or_else(|e| e.into_inner()).accept(counter) {
            return Err(OpenError::Replayed);
        }
        Ok((plain, counter))
    }
}

/// Why a transport data message did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// Its tag is wrong (another key, or changed on the way).
    Unauthenticated,
    /// It authenticated, but its counter was taken before, is older than the window, or is past the session's
    /// last.
    Replayed,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Keypair, Keypair) {
        let a = SessionKeys { send: [1; 32], receive: [2; 32] };
        let b = SessionKeys { send: [2; 32], receive: [1; 32] };
        (Keypair::new(&a, 10, 20, true, 0), Keypair::new(&b, 20, 10, false, 0))
    }

    #[test]
    fn test_the_window_takes_each_counter_once_in_any_order_within_8192() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(0));
        assert!(!w.accept(0));
        assert!(w.accept(5000));
        for c in 1..5000 {
            assert!(w.accept(c), "{c} is within the window");
        }
        assert!(!w.accept(4999));
        assert!(w.accept(5000 + WINDOW_SIZE));
        assert!(!w.accept(5000 + WINDOW_SIZE), "a replay of the newest");
        assert!(!w.accept(0), "older than the window");
        assert!(w.accept(5128), "within the window after it moved");
        // A jump of more than the whole window clears it.
        assert!(w.accept(1_000_000));
        assert!(w.accept(1_000_000 - 100));
        assert!(!w.accept(REJECT_AFTER_MESSAGES));
    }

    #[test]
    fn test_sealed_messages_open_on_the_other_side_padded_and_once() {
        let (a, b) = pair();
        let packet = [0x45u8; 84];
        let mut out = [0u8; 256];
        let (len, counter) = a.seal(&packet, &mut out, 1420).unwrap();
        assert_eq!((len, counter), (16 + 96 + 16, 0), "84 bytes padded to 96");
        let mut copy = out;
        let (plain, opened_counter) = b.open(&mut out[..len]).unwrap();
        assert_eq!(opened_counter, counter);
        assert_eq!(&plain[..84], &packet[..]);
        assert!(plain[84..].iter().all(|&b| b == 0));
        assert_eq!(b.open(&mut copy[..len]).unwrap_err(), OpenError::Replayed);
        let mut copy = [0u8; 256];
        let (len, _) = a.seal(&packet, &mut copy, 1420).unwrap();
        copy[20] ^= 1;
        assert_eq!(b.open(&mut copy[..len]).unwrap_err(), OpenError::Unauthenticated);
    }

    /// Several queues' workers seal for one session at once, in runs of 64 as a worker's batch; the receiver
    /// (one socket takes all of one peer's datagrams) reads the queues' runs interleaved, each queue's in the
    /// order it sent them, the last queue's first: every counter was taken once, and every message opens within
    /// the window, once.
    #[test]
    fn test_queues_sealing_for_one_session_never_share_a_counter_and_the_receiver_takes_every_message() {
        const QUEUES: usize = 4;
        const EACH: usize = 2000;
        const RUN: usize = 64;
        /// What a worker sealed: the counter, the packet, the message.
        type SealedBy = Vec<(u64, Vec<u8>, Vec<u8>)>;
        let (a, b) = pair();
        let sent: Vec<SealedBy> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..QUEUES)
                .map(|q| {
                    let a = &a;
                    scope.spawn(move || {
                        (0..EACH)
                            .map(|i| {
                                let mut packet = vec![0x45u8; 40 + i % 1300];
                                packet[1..3].copy_from_slice(&(q as u16).to_be_bytes());
                                packet[3..7].copy_from_slice(&(i as u32).to_be_bytes());
                                let mut out = vec![0u8; packet.len() + DATA_HEADER_LEN + TAG_LEN + PADDING_MULTIPLE];
                                let (len, counter) = a.seal(&packet, &mut out, 1420).expect("the session can send");
                                out.truncate(len);
                                (counter, packet, out)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut counters: Vec<u64> = sent.iter().flatten().map(|(c, _, _)| *c).collect();
        counters.sort_unstable();
        assert_eq!(counters, (0..(QUEUES * EACH) as u64).collect::<Vec<_>>(), "each counter taken exactly once");
        for queue in &sent {
            assert!(queue.windows(2).all(|w| w[0].0 < w[1].0), "a worker's own counters rise");
        }
        let mut opened = 0;
        let mut greatest_behind = 0;
        let mut newest = 0;
        for run in 0..EACH.div_ceil(RUN) {
            for queue in sent.iter().rev() {
                for (counter, packet, message) in queue.iter().skip(run * RUN).take(RUN) {
                    newest = newest.max(*counter);
                    greatest_behind = greatest_behind.max(newest - counter);
                    let mut message = message.clone();
                    let (plain, got) = b.open(&mut message).unwrap_or_else(|e| panic!("counter {counter}: {e:?}"));
                    assert_eq!((got, &plain[..packet.len()]), (*counter, &packet[..]));
                    opened += 1;
                }
            }
        }
        assert_eq!(opened, QUEUES * EACH);
        assert!(greatest_behind < WINDOW_SIZE, "the interleaving stayed within the window: {greatest_behind}");
        // Each one again is a replay, whichever queue sent it.
        for queue in &sent {
            let (counter, _, message) = &queue[EACH - 1];
            assert_eq!(b.open(&mut message.clone()).unwrap_err(), OpenError::Replayed, "counter {counter}");
        }
    }

    #[test]
    fn test_padding_stops_at_the_mtu() {
        assert_eq!(padded_len(0, 1420), 0);
        assert_eq!(padded_len(1, 1420), 16);
        assert_eq!(padded_len(1419, 1420), 1420);
        assert_eq!(padded_len(1420, 1420), 1420);
        assert_eq!(padded_len(1409, 1420), 1420);
        assert_eq!(padded_len(1409, 0), 1424);
    }
}
