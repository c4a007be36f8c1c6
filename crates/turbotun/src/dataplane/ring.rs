//! The slot ring: netmap's idea on a tun device. One arena of fixed slots, allocated once, each large enough
//! for a super-packet and its virtio header; rings that hold slot *indices*, never bytes. Forwarding a frame
//! from one device to another moves its index from a receive ring to a transmit ring: the bytes stay in the
//! slot they were read into and are written from there.
//!
//! A [`SlotRing`] is one such ring, with netmap's three pointers (free-running `u32` counters, taken modulo
//! the capacity):
//!
//! ```text
//!        head            cur             tail
//!  ... ---|---------------|---------------|--------------------------- ...
//!          taken: the      published, not  free entries: the producer
//!          consumer holds  yet taken       may push here
//!          these slots
//! ```
//!
//! - the producer appends at `tail` ([`SlotRing::push`]);
//! - the consumer takes the entry at `cur` ([`SlotRing::take`]) and holds it in `[head, cur)`, reading or
//!   rewriting the slot in place, until it gives it back: in order ([`SlotRing::release`]), or out of order by
//!   marking it done ([`SlotRing::complete`]) and collecting the leading done entries
//!   ([`SlotRing::release_completed`]).
//!
//! On a receive ring the producer is the kernel (a read completed into the slot) and the consumer the
//! application: `[head, tail)` is what netmap calls the slots owned by the user, `[tail, head)` those owned by
//! the kernel. On a transmit ring the producer is the application (a slot handed back for sending) and the
//! consumer the kernel: `[head, cur)` are the writes in flight, released when they complete.
//!
//! The ring itself is plain bookkeeping (no memory of slots, no I/O, no `unsafe`); [`crate::uring`] puts it
//! over the arena it shares with the kernel. That every slot is in exactly one place at any time, under any
//! sequence of batch sizes, is property-tested (`tests/ring.rs`).

use crate::error::{ConfigError, Error, Result};

/// One ring entry: which slot, and how many bytes of it are in use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slot {
    /// Index of the slot in its arena.
    pub index: u32,
    /// Bytes of the slot in use (virtio header included, where the queue has one).
    pub len: u32,
}

/// A ring of slot indices with netmap's `head`/`cur`/`tail` (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct SlotRing {
    entries: Box<[Slot]>,
    /// Per entry: taken and marked done out of order, waiting for the entries before it.
    done: Box<[bool]>,
    mask: u32,
    head: u32,
    cur: u32,
    tail: u32,
}

impl SlotRing {
    /// An empty ring of `capacity` entries (a power of two, at most 2^16).
    pub fn new(capacity: usize) -> Result<SlotRing> {
        if !capacity.is_power_of_two() || capacity > 1 << 16 {
            return Err(Error::Config(ConfigError::Size {
                why: format!("a slot ring holds a power of two of entries up to 65536, not {capacity}"),
            }));
        }
        Ok(SlotRing {
            entries: vec![Slot::default(); capacity].into_boxed_slice(),
            done: vec![false; capacity].into_boxed_slice(),
            mask: capacity as u32 - 1,
            head: 0,
            cur: 0,
            tail: 0,
        })
    }

    /// Entries the ring holds at most.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// First entry the consumer holds (taken, not yet released).
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Next entry the consumer takes.
    pub fn cur(&self) -> u32 {
        self.cur
    }

    /// Next entry the producer fills.
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Entries in the ring: taken and published (`tail - head`).
    pub fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head) as usize
    }

    /// Whether the ring holds no entry.
    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Entries the producer may still push.
    pub fn space(&self) -> usize {
        self.capacity() - self.len()
    }

    /// Entries published and not yet taken (`tail - cur`).
    pub fn ready(&self) -> usize {
        self.tail.wrapping_sub(self.cur) as usize
    }

    /// Entries taken and not yet released (`cur - head`).
    pub fn taken(&self) -> usize {
        self.cur.wrapping_sub(self.head) as usize
    }

    /// Producer: appends `slot` at `tail`; gives it back if the ring is full.
    pub fn push(&mut self, slot: Slot) -> std::result::Result<(), Slot> {
        if self.space() == 0 {
            return Err(slot);
        }
        let i = (self.tail & self.mask) as usize;
        self.entries[i] = slot;
        self.done[i] = false;
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Consumer: takes the entry at `cur`, if one is published; returns its position and the entry.
    pub fn take(&mut self) -> Option<(u32, Slot)> {
        if self.ready() == 0 {
            return None;
        }
        let pos = self.cur;
        self.cur = self.cur.wrapping_add(1);
        Some((pos, self.entries[(pos & self.mask) as usize]))
    }

    /// The entry at `pos`, if it is in the ring (`head <= pos < tail`).
    pub fn get(&self, pos: u32) -> Option<Slot> {
        self.holds(pos).then(|| self.entries[(pos & self.mask) as usize])
    }

    /// Rewrites the length of a taken entry (a packet rewritten in place changed size). False if `pos` is not
    /// taken.
    pub fn set_len(&mut self, pos: u32, len: u32) -> bool {
        if !self.is_taken(pos) {
            return false;
        }
        self.entries[(pos & self.mask) as usize].len = len;
        true
    }

    /// Consumer: gives back the entry at `head` if it was taken (in-order release); the caller decides where its
    /// slot goes next.
    pub fn release(&mut self) -> Option<Slot> {
        if self.taken() == 0 {
            return None;
        }
        let i = (self.head & self.mask) as usize;
        self.done[i] = false;
        self.head = self.head.wrapping_add(1);
        Some(self.entries[i])
    }

    /// Consumer: marks the taken entry at `pos` done (out-of-order completion, such as a write that finished
    /// before an earlier one). False if `pos` is not taken or already done.
    pub fn complete(&mut self, pos: u32) -> bool {
        if !self.is_taken(pos) {
            return false;
        }
        let i = (pos & self.mask) as usize;
        !std::mem::replace(&mut self.done[i], true)
    }

    /// Consumer: releases the entry at `head` if it was marked done; call until `None` to collect every
    /// leading done entry.
    pub fn release_completed(&mut self) -> Option<Slot> {
        if self.taken() == 0 || !self.done[(self.head & self.mask) as usize] {
            return None;
        }
        self.release()
    }

    fn holds(&self, pos: u32) -> bool {
        pos.wrapping_sub(self.head) < self.tail.wrapping_sub(self.head)
    }

    fn is_taken(&self, pos: u32) -> bool {
        pos.wrapping_sub(self.head) < self.cur.wrapping_sub(self.head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(index: u32) -> Slot {
        Slot { index, len: index * 10 }
    }

    #[test]
    fn test_pointers_move_as_netmap_says() {
        let mut ring = SlotRing::new(4).unwrap();
        for i in 0..4 {
            ring.push(slot(i)).unwrap();
        }
        assert_eq!(ring.push(slot(9)), Err(slot(9)), "a full ring refuses and gives the slot back");
        assert_eq!((ring.head(), ring.cur(), ring.tail()), (0, 0, 4));
        assert_eq!(ring.take(), Some((0, slot(0))));
        assert_eq!(ring.take(), Some((1, slot(1))));
        assert_eq!((ring.taken(), ring.ready(), ring.space()), (2, 2, 0));
        assert!(ring.set_len(1, 77) && !ring.set_len(2, 77), "only a taken entry is rewritten");
        // Entry 1 finishes first: nothing is released until entry 0 is done too.
        assert!(ring.complete(1) && !ring.complete(1) && !ring.complete(3));
        assert_eq!(ring.release_completed(), None);
        assert!(ring.complete(0));
        assert_eq!(ring.release_completed(), Some(slot(0)));
        assert_eq!(ring.release_completed(), Some(Slot { index: 1, len: 77 }));
        assert_eq!(ring.release_completed(), None);
        assert_eq!((ring.head(), ring.cur(), ring.tail(), ring.space()), (2, 2, 4, 2));
        assert_eq!(ring.get(1), None, "released entries are out of the ring");
        assert_eq!(ring.get(3), Some(slot(3)));
    }

    #[test]
    fn test_counters_wrap() {
        let mut ring = SlotRing::new(2).unwrap();
        ring.head = u32::MAX - 1;
        ring.cur = u32::MAX - 1;
        ring.tail = u32::MAX - 1;
        for i in 0..10 {
            ring.push(slot(i)).unwrap();
            assert_eq!(ring.take().map(|(_, s)| s), Some(slot(i)));
            assert_eq!(ring.release(), Some(slot(i)));
            assert!(ring.is_empty());
        }
    }

    #[test]
    fn test_bad_capacity_is_refused() {
        for bad in [0, 3, 1 << 17] {
            let err = SlotRing::new(bad).unwrap_err().to_string();
            assert!(err.contains("power of two"), "{err}");
        }
    }
}
