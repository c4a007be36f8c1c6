//! The loops a tunnel runs: one per direction and queue, and the transform's timers.

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use turbotun_wire::{ecn, Batch, Checksums};

use super::unreachable::Unreachables;
use super::{Opened, Room, SealBatch, SealOut, Sealed, Transform, TunnelStatsHandle};
use crate::dataplane::batch::{RecvBatch, SendBatch, BATCH_SIZE};
use crate::dataplane::stats::{batch_counts, final_batch_counts, Counters, DropReason, Flusher, SharedCounters};
use crate::dataplane::udp::{self, Datagram, RecvSlots, SourceMemo, TunnelSocket};
use crate::devices::mode::Mode;
use crate::devices::queue::{Queue, MAX_PACKET};
use crate::error::Result;
use crate::stop::StopHandle;

/// What one worker works with.
pub(super) struct Ctx<T: Transform> {
    pub queue: Arc<Queue>,
    pub socket: Arc<TunnelSocket>,
    pub transform: Arc<T>,
    pub stop: StopHandle,
    pub stats: TunnelStatsHandle,
    /// The queue's own counters, by direction as in [`TunnelStatsHandle`] (`None`: the timer thread's, no
    /// queue's).
    pub queue_stats: Option<Arc<[SharedCounters; 2]>>,
    pub unreachables: Option<Arc<Unreachables>>,
}

impl<T: Transform> Clone for Ctx<T> {
    fn clone(&self) -> Self {
        Ctx {
            queue: self.queue.clone(),
            socket: self.socket.clone(),
            transform: self.transform.clone(),
            stop: self.stop.clone(),
            stats: self.stats.clone(),
            queue_stats: self.queue_stats.clone(),
            unreachables: self.unreachables.clone(),
        }
    }
}

/// Messages one receive reads at most: each up to 64 KiB of coalesced datagrams.
const RECV_SLOTS: usize = 8;
const RECV_SLOT_SIZE: usize = 65_536;

/// Sends the transform's own datagrams at once, counting them as `control` (and their drops by reason).
fn control_sender<'a>(socket: &'a TunnelSocket, counters: &'a mut Counters) -> impl FnMut(&[u8], SocketAddr) + 'a {
    move |data: &[u8], to: SocketAddr| {
        counters.control += 1;
        let mut sent = Counters::default();
        // A socket that cannot send at all shows on the next batch's send; here only its drop is counted.
        let _ = socket.send_one(data, to, &mut sent);
        counters.drops.add_all(&sent.drops);
    }
}

/// Device -> network: read (and split) a batch, seal it, send the batch's datagrams. The first read of a batch
/// sleeps in the kernel (a blocking queue); the wake-up signal ends it at the stop.
pub(super) fn to_network<T: Transform>(ctx: &Ctx<T>) -> Result<()> {
    crate::dataplane::wake::unblock()?;
    let queue = &*ctx.queue;
    // Each packet is read behind and before the room the transform seals it in. The room in front is also where
    // the virtio header would go; the read keeps the header apart, so the two share it.
    let room = ctx.transform.seal_room();
    let offset = queue.vnet_hdr_len().max(room.front);
    // Room for any frame the device hands over whole (`MAX_PACKET` has the link header's room): its MTU may be
    // changed while the tunnel runs (wg-quick sets it after the endpoint starts), and a buffer's pages are
    // touched only as far as packets reach.
    let size = offset + MAX_PACKET + room.back;
    let overhead = ctx.transform.overhead();
    let ip = queue.mode() == Mode::Tun;
    let mut rx = RecvBatch::new(ctx.queue.clone())
        .partial_checksums(ctx.transform.partial_checksums())
        .stop_on(ctx.stop.clone());
    // One allocation per set of buffers, large enough to be mapped, not taken from the heap: its pages become
    // resident only as packets reach them (buffers cloned from one vector would all be written at once).
    let mut arena = vec![0u8; size * BATCH_SIZE];
    let mut bufs: Vec<&mut [u8]> = arena.chunks_mut(size).collect();
    let mut lens = vec![0usize; BATCH_SIZE];
    // Buffers of their own for a transform that seals packet by packet into them, made on its first use.
    let mut out = SealOut::new(if overhead > 0 { size + overhead } else { 0 }, BATCH_SIZE);
    let mut sealed = [Sealed::Held; BATCH_SIZE];
    let mut outer_ecn = [0u8; BATCH_SIZE];
    let mut counters = Counters::default();
    let mut control = Counters::default();
    let mut flusher = Flusher::new(ctx.stats.device_to_network()).and(ctx.queue_stats.as_ref().map(|q| &q[0]));
    // What the socket counted for the packets' datagrams and for the control datagrams, added together.
    let sent = |counters: &Counters, control: &Counters| batch_counts(*counters, *control);
    let result = loop {
        if ctx.stop.is_stopped() {
            break Ok(());
        }
        let got = match rx.try_recv_many(&mut Batch::new(&mut bufs, &mut lens, offset)) {
            Ok(got) => got.packets,
            // Woken (to stop, or by any other signal): the loop looks at the stop handle.
            Err(e) if e.is_interrupted() || e.is_would_block() => {
                flusher.flush(batch_counts(rx.stats(), sent(&counters, &control)));
                continue;
            }
            Err(e) => break Err(e),
        };
        // The outer ECN field of each packet's datagram, taken before the packet is sealed.
        for ((field, buf), &len) in outer_ecn.iter_mut().zip(&bufs).zip(&lens).take(got) {
            *field = if ip { ecn::encapsulate(ecn::of(&buf[offset..offset + len]).unwrap_or(ecn::NOT_ECT)) } else { 0 };
        }
        sealed[..got].fill(Sealed::Dropped(DropReason::Malformed));
        {
            let mut send_control = control_sender(&ctx.socket, &mut control);
            let batch = Batch::new(&mut bufs[..got], &mut lens[..got], offset);
            let mut batch = SealBatch::new(batch, room, &mut out, &mut sealed[..got]);
            ctx.transform.seal_batch(&mut batch, &mut send_control);
        }
        // The datagrams in the order their packets came, so that a flow stays in order.
        let mut datagrams: [Datagram<'_>; BATCH_SIZE] =
            [Datagram { data: &[], dest: SocketAddr::from(([0, 0, 0, 0], 0)), ecn: 0 }; BATCH_SIZE];
        let mut n = 0;
        for (i, (&answer, &ecn_field)) in sealed.iter().zip(&outer_ecn).take(got).enumerate() {
            let (data, dest) = match answer {
                Sealed::InPlace { to } | Sealed::Out { to, .. } | Sealed::Grown { to, .. } => {
                    (sealed_datagram(answer, bufs[i], offset..offset + lens[i], room, out.get(i)), to)
                }
                Sealed::Held => {
                    counters.held += 1;
                    continue;
                }
                Sealed::Dropped(reason) => {
                    counters.drops.add(reason, 1);
                    continue;
                }
                Sealed::Unreachable(reason) => {
                    counters.drops.add(reason, 1);
                    if let Some(unreachables) = &ctx.unreachables {
                        unreachables.answer(&bufs[i][offset..offset + lens[i]], queue, &mut counters);
                    }
                    continue;
                }
            };
            // A datagram said to be where the buffers do not reach cannot be sent.
            let Some(data) = data else {
                counters.drops.add(DropReason::TooBig, 1);
                continue;
            };
            datagrams[n] = Datagram { data, dest, ecn: ecn_field };
            n += 1;
        }
        if let Err(e) = ctx.socket.send_datagrams(&datagrams[..n], Some(&ctx.stop), &mut counters) {
            break Err(e);
        }
        flusher.flush(batch_counts(rx.stats(), sent(&counters, &control)));
    };
    flusher.flush(final_batch_counts(rx.stats(), sent(&counters, &control), rx.pending()));
    result
}

/// Where the datagram of a packet sealed as `answer` is, for the packet at `packet` in `buf` with `room` around
/// it and `out` its buffer of its own: `None` for a datagram said to be where the buffers do not reach, or an
/// answer that has no datagram.
fn sealed_datagram<'a>(
    answer: Sealed,
    buf: &'a [u8],
    packet: Range<usize>,
    room: Room,
    out: &'a [u8],
) -> Option<&'a [u8]> {
    match answer {
        Sealed::InPlace { .. } => buf.get(packet),
        Sealed::Out { len, .. } => out.get(..len),
        Sealed::Grown { start, len, .. } => {
            let window = buf.get(packet.start.checked_sub(room.front)?..packet.end.checked_add(room.back)?)?;
            window.get(start..start.checked_add(len)?)
        }
        Sealed::Held | Sealed::Dropped(_) | Sealed::Unreachable(_) => None,
    }
}

/// What becomes of a packet a transform opened in place (`datagram[start..start + len]` of a `datagram_len`-byte
/// datagram) on its way to a device with a `vnet`-byte virtio header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opening {
    /// Written from where it is: the header fits in front of it.
    Kept,
    /// Copied into a buffer with room for the header.
    Copied,
    /// Not inside the datagram: nothing to write (`too_big`).
    Outside,
}

fn opening(start: usize, len: usize, datagram_len: usize, vnet: usize) -> Opening {
    match start.checked_add(len) {
        Some(end) if end <= datagram_len && start >= vnet => Opening::Kept,
        Some(end) if end <= datagram_len => Opening::Copied,
        _ => Opening::Outside,
    }
}

/// Network -> device: receive many datagrams (sleeping in the kernel for the first), open each, coalesce and
/// write the packets.
pub(super) fn from_network<T: Transform>(ctx: &Ctx<T>) -> Result<()> {
    crate::dataplane::wake::unblock()?;
    let queue = &*ctx.queue;
    let vnet = queue.vnet_hdr_len();
    let ip = queue.mode() == Mode::Tun;
    let checksums = if ctx.transform.partial_checksums() {
        Checksums::Partial
    } else if ctx.transform.authenticates() {
        Checksums::Valid
    } else {
        Checksums::Unverified
    };
    let mut tx = SendBatch::new(ctx.queue.clone()).stop_on(ctx.stop.clone());
    let mut slots = RecvSlots::new(RECV_SLOTS, RECV_SLOT_SIZE);
    // For packets a transform copies out of their datagrams (`Opened::Packet`; one opened in place stays in its
    // receive slot): any packet a datagram can carry, behind room for the virtio header; pages are touched only
    // as used.
    let out_size = vnet + RECV_SLOT_SIZE;
    let mut out_arena = vec![0u8; out_size * BATCH_SIZE];
    let mut out: Vec<&mut [u8]> = out_arena.chunks_mut(out_size).collect();
    let mut lens = vec![0usize; BATCH_SIZE];
    let mut counters = Counters::default();
    let mut control = Counters::default();
    let mut flusher = Flusher::new(ctx.stats.network_to_device()).and(ctx.queue_stats.as_ref().map(|q| &q[1]));
    let mut sources = SourceMemo::default();
    let all = |tx: &SendBatch<Arc<Queue>>, counters: &Counters, control: &Counters| {
        batch_counts(batch_counts(*counters, *control), tx.stats())
    };
    let result: Result<()> = 'run: loop {
        if ctx.stop.is_stopped() {
            break Ok(());
        }
        match ctx.socket.recv_wait(&mut slots) {
            // Woken (to stop, or by any other signal): the loop looks at the stop handle.
            Ok(0) => {
                flusher.flush(all(&tx, &counters, &control));
                continue;
            }
            // Each message is looked at below.
            Ok(_) => {}
            Err(e) => break Err(e),
        }
        counters.reads += 1;
        let mut k = 0;
        // Packet `i` of the batch being gathered, when it was opened where it arrived: its piece of a receive
        // slot, the virtio header's room in front of the packet (`None`: the packet is in `out[i]`).
        let mut in_slots: [Option<&mut [u8]>; BATCH_SIZE] = std::array::from_fn(|_| None);
        let mut send_control = control_sender(&ctx.socket, &mut control);
        for (meta, data) in slots.messages_mut() {
            let Some(from) = meta.source else {
                counters.drops.add(DropReason::MalformedDatagram, 1);
                continue;
            };
            if meta.truncated {
                // Longer than a slot: never a tunnel's datagram (they are at most 64 KiB).
                counters.drops.add(DropReason::TooBig, 1);
                continue;
            }
            let outer_ecn = meta.tos.unwrap_or(0) & 0b11;
            // Recorded once per message (one sender's run of datagrams), when one of them authenticated.
            let mut local = meta.local;
            // A coalesced read is one flow's run of datagrams: written in one batch, its packets coalesce into
            // one write, so the batch so far goes first if the run would not fit behind it.
            let count = if meta.gso_size > 0 { data.len().div_ceil(usize::from(meta.gso_size)) } else { 1 };
            if k > 0 && k + count > BATCH_SIZE {
                if let Err(e) = write_opened(&mut tx, &mut out, &mut in_slots[..k], &mut lens, vnet, checksums) {
                    break 'run Err(e);
                }
                k = 0;
            }
            for datagram in udp::datagrams(meta, data) {
                counters.segments += 1;
                let opened = ctx.transform.open(datagram, from, meta.local, &mut out[k][vnet..], &mut send_control);
                // Replies to `from` leave from the address it reached once what it sent authenticated (no lock
                // when it is the same as last time); a message the transform queued is its own worker's to record.
                if local.is_some() && matches!(opened, Opened::Packet { .. } | Opened::InPlace { .. } | Opened::Control)
                {
                    ctx.socket.remember_source(from, local.take(), &mut sources);
                }
                let (mut piece, len) = match opened {
                    Opened::Packet { len } => (None, len),
                    Opened::InPlace { start, len } => match opening(start, len, datagram.len(), vnet) {
                        Opening::Kept => (Some(&mut datagram[start - vnet..start + len]), len),
                        Opening::Copied if vnet + len <= out[k].len() => {
                            out[k][vnet..vnet + len].copy_from_slice(&datagram[start..start + len]);
                            (None, len)
                        }
                        Opening::Copied | Opening::Outside => {
                            counters.drops.add(DropReason::TooBig, 1);
                            continue;
                        }
                    },
                    Opened::Control => {
                        counters.control += 1;
                        continue;
                    }
                    // Counted when the transform settles it (the timer thread).
                    Opened::Queued => continue,
                    Opened::Dropped(reason) => {
                        counters.drops.add(reason, 1);
                        continue;
                    }
                };
                let packet = match &mut piece {
                    Some(piece) => &mut piece[vnet..],
                    None => &mut out[k][vnet..vnet + len],
                };
                if ip && outer_ecn != ecn::NOT_ECT {
                    let inner = ecn::of(packet).unwrap_or(ecn::NOT_ECT);
                    match ecn::decapsulate(outer_ecn, inner) {
                        None => {
                            counters.drops.add(DropReason::CeOnNotEct, 1);
                            continue;
                        }
                        Some(field) if field != inner => {
                            ecn::set(packet, field);
                        }
                        Some(_) => {}
                    }
                }
                in_slots[k] = piece;
                lens[k] = len;
                k += 1;
                if k == BATCH_SIZE {
                    if let Err(e) = write_opened(&mut tx, &mut out, &mut in_slots[..k], &mut lens, vnet, checksums) {
                        break 'run Err(e);
                    }
                    k = 0;
                }
            }
        }
        drop(send_control);
        ctx.transform.opened_batch();
        if k > 0 {
            if let Err(e) = write_opened(&mut tx, &mut out, &mut in_slots[..k], &mut lens, vnet, checksums) {
                break Err(e);
            }
        }
        flusher.flush(all(&tx, &counters, &control));
    };
    flusher.flush(all(&tx, &counters, &control));
    result
}

/// Writes the packets of `in_slots` (as many as it has): packet `i` in its piece of a receive slot, or in
/// `out[i]`, each at `vnet` with its length in `lens[i]`. Takes the pieces, so that the next batch starts empty.
fn write_opened(
    tx: &mut SendBatch<Arc<Queue>>,
    out: &mut [&mut [u8]],
    in_slots: &mut [Option<&mut [u8]>],
    lens: &mut [usize],
    vnet: usize,
    checksums: Checksums,
) -> Result<()> {
    let mut units: [&mut [u8]; BATCH_SIZE] = std::array::from_fn(|_| Default::default());
    let k = in_slots.len();
    for ((unit, piece), own) in units.iter_mut().zip(in_slots.iter_mut()).zip(out.iter_mut()) {
        *unit = match piece.take() {
            Some(piece) => piece,
            None => own,
        };
    }
    tx.send_many(&mut Batch::new(&mut units[..k], &mut lens[..k], vnet), checksums)?;
    Ok(())
}

/// The transform's timers, every `interval` until the stop handle fires.
pub(super) fn timers<T: Transform>(ctx: &Ctx<T>, interval: Duration) -> Result<()> {
    let mut control = Counters::default();
    let mut flusher = Flusher::new(ctx.stats.device_to_network());
    // What the transform's own worker made of the datagrams it took: the network's direction.
    let mut settled = Counters::default();
    let mut settled_flusher = Flusher::new(ctx.stats.network_to_device());
    let settle = |stopping: bool, settled: &mut Counters| {
        let s = ctx.transform.settled(stopping);
        settled.control += s.control;
        settled.drops.add_all(&s.drops);
    };
    let wake = ctx.stop.wake_fd()?;
    let mut last_tick = std::time::Instant::now();
    let mut outbox: Vec<u8> = Vec::new();
    let mut spans: Vec<(usize, usize, SocketAddr)> = Vec::new();
    loop {
        // The transform's own work wakes this thread early; the timers still run every `interval`.
        let woken = match ctx.transform.work_fd() {
            Some(work) => {
                let left = interval.saturating_sub(last_tick.elapsed());
                crate::stop::wait_or_stop(work, rustix::event::PollFlags::IN, Some(&ctx.stop), Some(left))?
            }
            None => crate::stop::wait_or_stop(wake, rustix::event::PollFlags::IN, None, Some(interval))?,
        };
        if ctx.stop.is_stopped() || (woken && ctx.transform.work_fd().is_none()) {
            break;
        }
        last_tick = std::time::Instant::now();
        // What the transform sends while it ticks (handshake responses and cookie replies to a whole queue of
        // handshake messages, keepalives) leaves in as few `sendmmsg` calls as it fits, after the tick.
        let lost = ctx.transform.tick(&mut |data: &[u8], to: SocketAddr| {
            let start = outbox.len();
            outbox.extend_from_slice(data);
            spans.push((start, data.len(), to));
        });
        control.drops.add_all(&lost);
        if !spans.is_empty() {
            control.control += spans.len() as u64;
            let datagrams: Vec<Datagram<'_>> =
                spans.iter().map(|&(at, len, dest)| Datagram { data: &outbox[at..at + len], dest, ecn: 0 }).collect();
            let mut sent = Counters::default();
            // A socket that cannot send at all shows on the next batch's send; here only its drops are counted.
            let _ = ctx.socket.send_datagrams(&datagrams, None, &mut sent);
            control.drops.add_all(&sent.drops);
            outbox.clear();
            spans.clear();
        }
        flusher.flush(control);
        settle(false, &mut settled);
        settled_flusher.flush(settled);
    }
    control.drops.add_all(&ctx.transform.give_up());
    flusher.flush(control);
    settle(true, &mut settled);
    settled_flusher.flush(settled);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_sealed_datagram_is_taken_only_from_within_its_buffers() {
        let to = SocketAddr::from(([192, 0, 2, 1], 1));
        let buf: Vec<u8> = (0..100).collect();
        let out: Vec<u8> = (100..150).collect();
        let room = Room { front: 16, back: 31 };
        // The packet at 20..60: its room is 4..91.
        let at = |answer| sealed_datagram(answer, &buf, 20..60, room, &out);
        assert_eq!(at(Sealed::InPlace { to }), Some(&buf[20..60]));
        assert_eq!(at(Sealed::Out { len: 50, to }), Some(&out[..]));
        assert_eq!(at(Sealed::Out { len: 51, to }), None, "longer than its buffer");
        assert_eq!(at(Sealed::Grown { start: 0, len: 87, to }), Some(&buf[4..91]), "the whole room");
        assert_eq!(at(Sealed::Grown { start: 0, len: 88, to }), None, "past the room behind");
        assert_eq!(at(Sealed::Grown { start: 80, len: 8, to }), None);
        assert_eq!(at(Sealed::Grown { start: usize::MAX, len: 2, to }), None, "no overflow");
        // A packet with less room in its buffer than asked for has no grown datagram.
        assert_eq!(sealed_datagram(Sealed::Grown { start: 0, len: 10, to }, &buf, 10..60, room, &out), None);
        assert_eq!(sealed_datagram(Sealed::Grown { start: 0, len: 10, to }, &buf, 20..80, room, &out), None);
        assert_eq!(at(Sealed::Held), None);
    }

    #[test]
    fn test_a_packet_opened_in_place_is_kept_copied_or_refused() {
        // A WireGuard message: the packet behind its 16-byte header, padding and tag behind it.
        assert_eq!(opening(16, 84, 16 + 96 + 16, 10), Opening::Kept);
        assert_eq!(opening(16, 84, 16 + 96 + 16, 12), Opening::Kept);
        assert_eq!(opening(4, 84, 100, 10), Opening::Copied, "no room for the virtio header in front");
        assert_eq!(opening(0, 100, 100, 0), Opening::Kept, "no virtio header: nothing needs room");
        assert_eq!(opening(16, 113, 128, 10), Opening::Outside, "past the datagram's end");
        assert_eq!(opening(usize::MAX, 2, 128, 10), Opening::Outside, "no overflow");
    }
}
