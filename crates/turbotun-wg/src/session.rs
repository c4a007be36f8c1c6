//! Transport data: the keys of one session, its send counter and its receive window. Sealing and opening work in
//! place in the tunnel's own buffers; the counter is one atomic, so several queues can send for one session.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};

use turbotun::aead::Key;

use crate::message::{DataHeader, DATA_HEADER_LEN, TAG_LEN};
use crate::noise::{nonce, SessionKeys};

/// Messages after which the initiator of a session starts a new handshake (the kernel's REKEY_AFTER_MESSAGES).
pub(crate) const REKEY_AFTER_MESSAGES: u64 = 1 << 60;
/// Bits of the receive window (the kernel's COUNTER_BITS_TOTAL).
pub(crate) const WINDOW_BITS: u64 = 8192;
const WORD_BITS: u64 = 64;
const WORDS: usize = (WINDOW_BITS / WORD_BITS) as usize;
/// How far behind the greatest counter seen a message may arrive: the window less one word, which is cleared as
/// the window moves (COUNTER_WINDOW_SIZE).
pub(crate) const WINDOW_SIZE: u64 = WINDOW_BITS - WORD_BITS;
/// Messages after which a session's keys are never used again (the kernel's REJECT_AFTER_MESSAGES).
pub(crate) const REJECT_AFTER_MESSAGES: u64 = u64::MAX - WINDOW_SIZE - 1;
/// Transport data is padded with zeros to a multiple of this, within the MTU.
pub(crate) const PADDING_MULTIPLE: usize = 16;

/// The counters seen of one session, as a sliding bitmap: a message is taken once, and not when it is older than
/// the window (the kernel's algorithm, RFC 6479's idea).
#[derive(Debug)]
pub(crate) struct ReplayWindow {
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
    pub(crate) fn accept(&mut self, counter: u64) -> bool {
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
pub(crate) struct Keypair {
    /// The index we gave the session (what the peer's messages carry as their receiver).
    pub local_index: u32,
    /// The index the peer gave it (what ours carry).
    pub remote_index: u32,
    /// Whether we initiated the handshake that made it (only the initiator rekeys on age and count).
    pub initiator: bool,
    /// When it was made, in the device's clock (milliseconds).
    pub born_ms: u64,
    /// The keys, erased in place when the session is retired ([`Self::erase`]) whoever still holds the session
    /// (a worker's cache keeps it until that worker's next packet); read-locked while they seal or open.
    send: RwLock<Key>,
    receive: RwLock<Key>,
    send_counter: AtomicU64,
    window: Mutex<ReplayWindow>,
    /// Whether the peer is known to have it: always for the initiator; for the responder once the initiator's
    /// first message with it arrived.
    confirmed: AtomicBool,
    /// Sealing with it stopped before its time (the device's private key changed): the kernel's
    /// `sending.is_valid` cleared; it still opens what the peer sent with it.
    sending_expired: AtomicBool,
    /// Its keys were erased: it opens nothing.
    erased: AtomicBool,
}

// Each key erases itself when dropped (`turbotun::aead::Key`), as the kernel frees a keypair with
// `kfree_sensitive`.

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
pub(crate) fn padded_len(len: usize, mtu: usize) -> usize {
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
    pub(crate) fn new(keys: &SessionKeys, local_index: u32, remote_index: u32, initiator: bool, born_ms: u64) -> Self {
        #[cfg(test)]
        tests::made_keys(keys);
        // ChaCha20-Poly1305 from the fastest implementation this machine has (`turbotun::aead`).
        let key = Key::new;
        Keypair {
            local_index,
            remote_index,
            initiator,
            born_ms,
            send: RwLock::new(key(&keys.send)),
            receive: RwLock::new(key(&keys.receive)),
            send_counter: AtomicU64::new(0),
            window: Mutex::new(ReplayWindow::default()),
            confirmed: AtomicBool::new(false),
            sending_expired: AtomicBool::new(false),
            erased: AtomicBool::new(false),
        }
    }

    /// Erases its keys where they are (the kernel frees a keypair with `kfree_sensitive`): each is overwritten with
    /// a key of zeros under its lock, so that no copy outlives the session in this process, however long a
    /// worker's cache holds the session. It seals and opens nothing after.
    pub(crate) fn erase(&self) {
        for key in [&self.send, &self.receive] {
            let mut key = key.write().unwrap_or_else(|e| e.into_inner());
            self.expire_sending();
            self.erased.store(true, Ordering::Release);
            key.erase();
        }
    }

    /// Stops sealing with it (what the peer sends with it is still opened).
    pub(crate) fn expire_sending(&self) {
        self.sending_expired.store(true, Ordering::Release);
    }

    /// Whether [`Self::expire_sending`] was called.
    pub(crate) fn sending_expired(&self) -> bool {
        self.sending_expired.load(Ordering::Acquire)
    }

    /// Whether the peer is known to have this session.
    pub(crate) fn confirmed(&self) -> bool {
        self.confirmed.load(Ordering::Acquire)
    }

    /// Records that the peer has this session.
    pub(crate) fn confirm(&self) {
        self.confirmed.store(true, Ordering::Release);
    }

    /// Messages sent so far.
    pub(crate) fn sent(&self) -> u64 {
        self.send_counter.load(Ordering::Relaxed)
    }

    /// Takes the counters of `n` messages in one atomic step, so that a run of packets costs one step however
    /// long it is and the counters of one run are consecutive. Fewer than `n` (none, once it is reached) when the
    /// run would reach [`REJECT_AFTER_MESSAGES`]: the session sends no message with that counter or later, and
    /// its counter never moves past that point by more than one run.
    pub(crate) fn take_counters(&self, n: usize) -> Range<u64> {
        let n = n as u64;
        let taken = self.send_counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
            (next < REJECT_AFTER_MESSAGES).then(|| next.saturating_add(n))
        });
        match taken {
            Ok(first) => first..first.saturating_add(n).min(REJECT_AFTER_MESSAGES),
            Err(_) => REJECT_AFTER_MESSAGES..REJECT_AFTER_MESSAGES,
        }
    }

    /// The sealing key, held for a run of packets ([`Sealer::seal_in_place`]); `None` once erased.
    pub(crate) fn sealer(&self) -> Option<Sealer<'_>> {
        let key = self.send.read().unwrap_or_else(|e| e.into_inner());
        // Read under the lock that erasing takes to write: a session erased is never sealed with.
        (!self.sending_expired()).then_some(Sealer { keypair: self, key })
    }

    /// [`Sealer::seal_in_place`] with the key taken for this one packet.
    pub(crate) fn seal_in_place(
        &self,
        buf: &mut [u8],
        start: usize,
        len: usize,
        counter: u64,
        mtu: usize,
    ) -> Option<Range<usize>> {
        self.sealer()?.seal_in_place(buf, start, len, counter, mtu)
    }

    /// Seals `packet` (possibly empty: a keepalive) into `out` as a transport data message, padded for a device
    /// of `mtu`; returns its length and counter, or `None` when the session may send no more or `out` is short.
    pub(crate) fn seal(&self, packet: &[u8], out: &mut [u8], mtu: usize) -> Option<(usize, u64)> {
        let total = DATA_HEADER_LEN + padded_len(packet.len(), mtu) + TAG_LEN;
        if out.len() < total {
            return None;
        }
        let counter = self.take_counters(1).next()?;
        out[DATA_HEADER_LEN..DATA_HEADER_LEN + packet.len()].copy_from_slice(packet);
        let message = self.seal_in_place(out, DATA_HEADER_LEN, packet.len(), counter, mtu)?;
        Some((message.len(), counter))
    }

    /// Opens a transport data message in place: its plaintext (padding included) and its counter, or why not.
    pub(crate) fn open<'a>(&self, message: &'a mut [u8]) -> Result<(&'a mut [u8], u64), OpenError> {
        let counter = DataHeader::new_checked(&*message).ok_or(OpenError::Unauthenticated)?.counter();
        if counter >= REJECT_AFTER_MESSAGES {
            return Err(OpenError::Replayed);
        }
        let body = message.get_mut(DATA_HEADER_LEN..).ok_or(OpenError::Unauthenticated)?;
        let key = self.receive.read().unwrap_or_else(|e| e.into_inner());
        // An erased key is all zeros: what it "opens" would be a forgery's. Read under the lock erasing writes.
        if self.erased.load(Ordering::Acquire) {
            return Err(OpenError::Unauthenticated);
        }
        let (text, tag) = body.split_last_chunk_mut::<TAG_LEN>().ok_or(OpenError::Unauthenticated)?;
        if !key.open(&nonce(counter), &[], text, tag) {
            return Err(OpenError::Unauthenticated);
        }
        let plain = text;
        drop(key);
        // Only a message that authenticated may move the window.
        if !self.window.lock().unwrap_or_else(|e| e.into_inner()).accept(counter) {
            return Err(OpenError::Replayed);
        }
        Ok((plain, counter))
    }
}

/// A session's sealing key, held (read-locked) for a run of packets: one lock for the run.
pub(crate) struct Sealer<'a> {
    keypair: &'a Keypair,
    key: RwLockReadGuard<'a, Key>,
}

impl std::fmt::Debug for Sealer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").field("keypair", self.keypair).finish_non_exhaustive()
    }
}

impl Sealer<'_> {
    /// Seals the packet at `buf[start..start + len]` where it is, as the transport data message with `counter`
    /// (taken with [`Keypair::take_counters`]), padded for a device of `mtu`: its header goes into the 16 bytes
    /// in front, the padding (zeros) and the tag behind. Returns where the message is in `buf`, or `None` when
    /// `buf` has no room for it or the counter is past the session's last.
    pub(crate) fn seal_in_place(
        &self,
        buf: &mut [u8],
        start: usize,
        len: usize,
        counter: u64,
        mtu: usize,
    ) -> Option<Range<usize>> {
        if counter >= REJECT_AFTER_MESSAGES {
            return None;
        }
        let padded = padded_len(len, mtu);
        let from = start.checked_sub(DATA_HEADER_LEN)?;
        let to = start.checked_add(padded)?.checked_add(TAG_LEN)?;
        let message = buf.get_mut(from..to)?;
        let (header, rest) = message.split_at_mut(DATA_HEADER_LEN);
        DataHeader::new_checked(header).expect("16 bytes").write(self.keypair.remote_index, counter);
        let (body, tag_room) = rest.split_at_mut(padded);
        body[len..].fill(0);
        let tag = self.key.seal(&nonce(counter), &[], body);
        tag_room.copy_from_slice(&tag);
        Some(from..to)
    }
}

/// Why a transport data message did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenError {
    /// Its tag is wrong (another key, or changed on the way).
    Unauthenticated,
    /// It authenticated, but its counter was taken before, is older than the window, or is past the session's
    /// last.
    Replayed,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What every transport key made in this process is XORed with where the tests keep it, so that the copy a
    /// memory scan looks for is not one the tests hold.
    pub(crate) const KEY_MASK: u8 = 0x5a;

    thread_local! {
        /// The transport keys of every session made on this thread (tests run on threads of their own beside
        /// each other), masked, for the memory scans.
        pub(crate) static MADE_KEYS: std::cell::RefCell<Vec<[u8; 32]>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    pub(super) fn made_keys(keys: &SessionKeys) {
        MADE_KEYS.with_borrow_mut(|made| {
            for key in [&keys.send, &keys.receive] {
                made.push(key.map(|b| b ^ KEY_MASK));
            }
        });
    }

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

    /// `packet` in a buffer as the tunnel reads it: the header's room in front, room for padding and tag behind,
    /// and bytes around that the seal must not touch.
    fn in_room(packet: &[u8]) -> Vec<u8> {
        let mut buf = vec![0xee; 5 + DATA_HEADER_LEN];
        buf.extend_from_slice(packet);
        buf.extend_from_slice(&[0xee; PADDING_MULTIPLE - 1 + TAG_LEN + 5]);
        buf
    }

    /// Seals `packets` as one run where they are; each message with its counter.
    fn seal_run(a: &Keypair, packets: &[Vec<u8>], mtu: usize) -> Vec<(u64, Vec<u8>)> {
        let counters = a.take_counters(packets.len());
        assert_eq!(counters.end - counters.start, packets.len() as u64, "the whole run has counters");
        packets
            .iter()
            .zip(counters)
            .map(|(packet, counter)| {
                let mut buf = in_room(packet);
                let start = 5 + DATA_HEADER_LEN;
                let message = a.seal_in_place(&mut buf, start, packet.len(), counter, mtu).expect("room for it");
                assert_eq!(message.start, 5, "the header right in front of the packet");
                let outside = buf[..message.start].iter().chain(&buf[message.end..]);
                assert!(outside.into_iter().all(|&b| b == 0xee), "nothing written outside the message");
                (counter, buf[message].to_vec())
            })
            .collect()
    }

    #[test]
    fn test_a_run_sealed_in_place_opens_to_the_same_packets_padded_within_the_mtu() {
        let (a, b) = pair();
        let mtu = 1420;
        // A keepalive, lengths around a multiple of 16, and packets up to and at the MTU.
        let lens = [0, 1, 15, 16, 17, 84, 1403, 1404, 1405, 1419, 1420];
        let packets: Vec<Vec<u8>> = lens.iter().map(|&n| (0..n).map(|i| (i * 7 + n) as u8).collect()).collect();
        let sealed = seal_run(&a, &packets, mtu);
        for (i, ((counter, message), packet)) in sealed.iter().zip(&packets).enumerate() {
            assert_eq!(*counter, i as u64, "one run's counters are consecutive");
            let padded = message.len() - DATA_HEADER_LEN - TAG_LEN;
            assert!(padded >= packet.len() && padded <= mtu, "{}: padded to {padded}", packet.len());
            assert!(padded % PADDING_MULTIPLE == 0 || padded == mtu, "{}: padded to {padded}", packet.len());
            assert!(padded - packet.len() < PADDING_MULTIPLE);
            assert_eq!(&message[..8], &[4, 0, 0, 0, 20, 0, 0, 0], "data message to the peer's index");
            let mut message = message.clone();
            let (plain, got) = b.open(&mut message).unwrap_or_else(|e| panic!("{}: {e:?}", packet.len()));
            assert_eq!(got, *counter);
            assert_eq!(&plain[..packet.len()], &packet[..]);
            assert!(plain[packet.len()..].iter().all(|&z| z == 0), "zero padding");
        }
        // The per-packet seal makes the same message for the next counter.
        let mut out = vec![0u8; 1420 + 64];
        let (len, counter) = a.seal(&packets[5], &mut out, mtu).unwrap();
        assert_eq!((len, counter), (16 + 96 + 16, lens.len() as u64));
        let (plain, _) = b.open(&mut out[..len]).unwrap();
        assert_eq!(&plain[..84], &packets[5][..]);
        // Without the room in front or behind, nothing is sealed.
        let mut short = vec![0u8; 100];
        assert_eq!(a.seal_in_place(&mut short, 10, 20, 99, mtu), None, "no room for the header");
        assert_eq!(a.seal_in_place(&mut short, 16, 80, 99, mtu), None, "no room for the padding and tag");
    }

    /// Two workers seal runs for one session at once: each run takes one consecutive block of counters, no
    /// counter is taken twice, and every message opens.
    #[test]
    fn test_runs_sealed_by_two_threads_take_consecutive_counters_never_shared() {
        const RUNS: usize = 200;
        const RUN: usize = 64;
        let (a, b) = pair();
        let packets: Vec<Vec<u8>> = (0..RUN).map(|i| vec![0x45; 20 + i * 20]).collect();
        let sealed: Vec<Vec<(u64, Vec<u8>)>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..2)
                .map(|_| scope.spawn(|| (0..RUNS).flat_map(|_| seal_run(&a, &packets, 1420)).collect::<Vec<_>>()))
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        for worker in &sealed {
            for run in worker.chunks(RUN) {
                assert!(run.windows(2).all(|w| w[1].0 == w[0].0 + 1), "a run's counters are one block");
                assert_eq!(run[0].0 % RUN as u64, 0, "runs of one length never interleave their blocks");
            }
        }
        let mut all: Vec<&(u64, Vec<u8>)> = sealed.iter().flatten().collect();
        all.sort_by_key(|(counter, _)| *counter);
        let counters: Vec<u64> = all.iter().map(|(c, _)| *c).collect();
        assert_eq!(counters, (0..(2 * RUNS * RUN) as u64).collect::<Vec<_>>(), "each counter taken once");
        for (counter, message) in all {
            let mut message = message.clone();
            let (plain, got) = b.open(&mut message).unwrap_or_else(|e| panic!("counter {counter}: {e:?}"));
            let packet = &packets[(*counter % RUN as u64) as usize];
            assert_eq!((got, &plain[..packet.len()]), (*counter, &packet[..]));
        }
    }

    #[test]
    fn test_a_run_that_reaches_reject_after_messages_stops_there() {
        let (a, b) = pair();
        a.send_counter.store(REJECT_AFTER_MESSAGES - 3, Ordering::Relaxed);
        let counters = a.take_counters(64);
        assert_eq!(counters, REJECT_AFTER_MESSAGES - 3..REJECT_AFTER_MESSAGES, "the run stops at the last");
        let packet = vec![0x45u8; 100];
        for counter in counters {
            let mut buf = in_room(&packet);
            let message = a.seal_in_place(&mut buf, 5 + DATA_HEADER_LEN, 100, counter, 1420).unwrap();
            let (plain, got) = b.open(&mut buf[message]).unwrap();
            assert_eq!((got, &plain[..100]), (counter, &packet[..]));
        }
        assert!(a.take_counters(1).is_empty(), "nothing after the last");
        assert!(a.sent() >= REJECT_AFTER_MESSAGES && a.sent() < REJECT_AFTER_MESSAGES + 64, "never further on");
        let mut buf = in_room(&packet);
        assert_eq!(a.seal_in_place(&mut buf, 5 + DATA_HEADER_LEN, 100, REJECT_AFTER_MESSAGES, 1420), None);
        assert_eq!(a.seal(&packet, &mut [0u8; 256], 1420), None);
        // A run that starts exactly at the last message takes nothing either.
        let (c, _) = pair();
        c.send_counter.store(REJECT_AFTER_MESSAGES, Ordering::Relaxed);
        assert!(c.take_counters(64).is_empty());
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
