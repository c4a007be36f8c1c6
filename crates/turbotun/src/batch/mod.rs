//! Batched receive (GSO split) and send (GRO coalesce) over one [`Queue`](crate::Queue).
//!
//! Buffers belong to the caller: packet `i` lives at `bufs[i][offset .. offset + lens[i]]`, and `offset` leaves
//! room in front for the virtio header (`offset >= queue.vnet_hdr_len()`). Buffers should hold
//! `offset + 65535` bytes so that coalesced packets fit.
//!
//! Nothing is lost silently: segments that do not fit into the caller's buffers stay pending for the next call,
//! a frame that cannot be used is counted in [`Counters::drops`](crate::stats::Counters) with its reason, and
//! what happens to a packet the kernel does not take is decided in one place for every path (wait when the
//! queue is full, re-split a refused coalesced packet, count a drop otherwise).
//!
//! - [`RecvBatch`] (receive half): one read per call, split into the caller's buffers, zero-copy when the
//!   previous super-packet's shape holds.
//! - [`SendBatch`] (send half): coalesce, then one gathered write per coalesced packet.

use turbotun_wire::Framing;

use crate::kind::Mode;

mod recv;
mod send;

pub use recv::{Received, RecvBatch};
pub use send::{gro_write_support, gro_write_support_if_probed, probe_gro_writes, GroWriteSupport, SendBatch, Sent};

/// How many packets one batch call handles at most: a 64 KiB super-packet of MSS 1448 splits into 46 segments.
pub const BATCH_SIZE: usize = 64;

/// Most segments one super-packet is split into; the rest are counted as
/// [`DropReason::TooManySegments`](crate::stats::DropReason) drops. A 64 KiB TCP super-packet at the smallest MSS
/// Linux sends by default (536 bytes) has 123 segments and a UDP one at most 128 (`UDP_MAX_SEGMENTS`); a
/// `gso_size` of 1 would make 65,000.
pub const MAX_SEGMENTS: usize = 1024;

fn framing(mode: Mode) -> Framing {
    match mode {
        Mode::Tun => Framing::Ip,
        Mode::Tap => Framing::Ethernet,
    }
}
