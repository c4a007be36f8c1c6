//! The slot ring's invariants under random batch sizes: a model of forwarding by slot index (a kernel that fills
//! read slots, an application that takes a batch, sends some on and gives the rest back, writes that complete
//! out of order) in which every slot must be in exactly one place after every step, and the pointers must keep
//! `head <= cur <= tail` with `tail - head <= capacity`.

use proptest::prelude::*;
use turbotun::ring::{Slot, SlotRing};

/// One step of the model.
#[derive(Debug, Clone)]
enum Step {
    /// The kernel fills up to n free slots (reads complete) and publishes them on the receive ring.
    Fill(usize),
    /// The application takes a batch of up to n; of each, `send` decides (by bit) whether it is sent on (its
    /// index moved to the transmit ring) or dropped (given back to the kernel).
    Batch(usize, u64),
    /// The kernel takes up to n entries of the transmit ring as writes in flight.
    Submit(usize),
    /// Writes in flight complete, picked by `pick` (out of order), up to n of them; completed leading entries
    /// are released back to the kernel.
    Complete(usize, u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0usize..40).prop_map(Step::Fill),
        (0usize..70, any::<u64>()).prop_map(|(n, bits)| Step::Batch(n, bits)),
        (0usize..40).prop_map(Step::Submit),
        (0usize..40, any::<u64>()).prop_map(|(n, pick)| Step::Complete(n, pick)),
    ]
}

struct Model {
    slots: u32,
    /// Slots the kernel may read into.
    free: Vec<u32>,
    rx: SlotRing,
    tx: SlotRing,
    /// Positions of the transmit ring submitted as writes and not completed yet.
    in_flight: Vec<u32>,
}

impl Model {
    fn new(slots: u32, rx_cap: usize, tx_cap: usize) -> Model {
        Model {
            slots,
            free: (0..slots).collect(),
            rx: SlotRing::new(rx_cap).unwrap(),
            tx: SlotRing::new(tx_cap).unwrap(),
            in_flight: Vec::new(),
        }
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::Fill(n) => {
                for _ in 0..n {
                    let Some(index) = self.free.pop() else { break };
                    if let Err(slot) = self.rx.push(Slot { index, len: 60 + index }) {
                        self.free.push(slot.index);
                        break;
                    }
                }
            }
            Step::Batch(n, send) => {
                for k in 0..n {
                    if self.tx.space() == 0 && send & (1 << (k % 64)) != 0 {
                        break;
                    }
                    let Some((pos, slot)) = self.rx.take() else { break };
                    assert_eq!(self.rx.get(pos), Some(slot));
                    // In place: the application may rewrite the packet, and its length.
                    assert!(self.rx.set_len(pos, slot.len + 1));
                    let released = self.rx.release().expect("the entry just taken is at head");
                    assert_eq!(released.index, slot.index, "released in the order taken");
                    assert_eq!(released.len, slot.len + 1);
                    if send & (1 << (k % 64)) != 0 {
                        self.tx.push(released).expect("room checked above");
                    } else {
                        self.free.push(released.index);
                    }
                }
            }
            Step::Submit(n) => {
                for _ in 0..n {
                    let Some((pos, _)) = self.tx.take() else { break };
                    self.in_flight.push(pos);
                }
            }
            Step::Complete(n, mut pick) => {
                for _ in 0..n {
                    if self.in_flight.is_empty() {
                        break;
                    }
                    let i = (pick as usize) % self.in_flight.len();
                    pick = pick.rotate_left(7) ^ 0x9e37_79b9;
                    let pos = self.in_flight.swap_remove(i);
                    assert!(self.tx.complete(pos), "a write in flight completes once");
                    assert!(!self.tx.complete(pos), "and never twice");
                }
                while let Some(slot) = self.tx.release_completed() {
                    self.free.push(slot.index);
                }
            }
        }
    }

    /// Every slot is in exactly one place: free (the kernel's), published or taken on the receive ring, or on
    /// the transmit ring; the pointers are ordered.
    fn check(&self) {
        let mut seen = vec![0u32; self.slots as usize];
        for &i in &self.free {
            seen[i as usize] += 1;
        }
        for ring in [&self.rx, &self.tx] {
            let (head, cur, tail) = (ring.head(), ring.cur(), ring.tail());
            assert!(cur.wrapping_sub(head) <= tail.wrapping_sub(head), "head <= cur <= tail");
            assert!(ring.len() <= ring.capacity());
            assert_eq!(ring.len(), ring.taken() + ring.ready());
            let mut pos = head;
            while pos != tail {
                seen[ring.get(pos).expect("an entry between head and tail").index as usize] += 1;
                pos = pos.wrapping_add(1);
            }
        }
        for (slot, &n) in seen.iter().enumerate() {
            assert_eq!(n, 1, "slot {slot} is in {n} places");
        }
        assert_eq!(self.in_flight.len(), self.tx.taken() - self.completed_not_released());
    }

    fn completed_not_released(&self) -> usize {
        // Taken entries of the transmit ring that are not in flight were completed but wait for an earlier one.
        let mut n = 0;
        let mut pos = self.tx.head();
        while pos != self.tx.cur() {
            if !self.in_flight.contains(&pos) {
                n += 1;
            }
            pos = pos.wrapping_add(1);
        }
        n
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_slot_lost_or_duplicated(
        (slots, rx_cap, tx_cap) in prop_oneof![Just((16u32, 16usize, 16usize)), Just((80, 16, 128)), Just((5, 4, 8))],
        steps in proptest::collection::vec(step(), 1..200),
    ) {
        let mut model = Model::new(slots, rx_cap, tx_cap);
        model.check();
        for step in &steps {
            model.apply(step);
            model.check();
        }
        // Drained: every write completes and every slot comes home.
        model.apply(&Step::Submit(usize::MAX));
        model.apply(&Step::Complete(usize::MAX, 1));
        model.check();
        prop_assert_eq!(model.tx.len(), 0);
    }
}
