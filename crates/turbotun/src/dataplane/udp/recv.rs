//! The receive path: many messages per `recvmmsg`, each split into the datagrams the kernel coalesced.

use std::io;
use std::os::fd::AsFd;

use crate::error::{Error, Result};
use crate::sys;
use crate::sys::udp::{RecvMeta, MAX_MMSG};

/// Buffers for batched receives: `slots` messages of `slot_size` bytes each, read by one `recvmmsg`.
#[derive(Debug)]
pub struct RecvSlots {
    buf: Vec<u8>,
    slot: usize,
    pub(super) meta: Vec<RecvMeta>,
    filled: usize,
}

impl RecvSlots {
    /// Room for `slots` messages of `slot_size` bytes (64 KiB holds any coalesced read).
    pub fn new(slots: usize, slot_size: usize) -> Self {
        let slots = slots.clamp(1, MAX_MMSG);
        RecvSlots {
            buf: vec![0; slots * slot_size],
            slot: slot_size,
            meta: vec![RecvMeta::default(); slots],
            filled: 0,
        }
    }

    /// Reads into the slots: with `wait`, sleeps (up to the socket's receive timeout) for the first message;
    /// without, returns 0 at once when nothing is queued. The number of messages read.
    pub fn recv(&mut self, socket: &impl AsFd, wait: bool) -> Result<usize> {
        self.filled = 0;
        match sys::udp::recv_mmsg(socket.as_fd(), &mut self.buf, self.slot, &mut self.meta, wait) {
            Ok(n) => {
                self.filled = n;
                Ok(n)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(Error::io("recvmmsg", e)),
        }
    }

    /// The messages of the last read: what the kernel said of each, and its bytes (several datagrams when
    /// `gso_size` is set: see [`datagrams`]).
    pub fn messages_mut(&mut self) -> impl Iterator<Item = (&RecvMeta, &mut [u8])> {
        let slot = self.slot;
        self.meta[..self.filled].iter().zip(self.buf.chunks_mut(slot)).map(|(m, s)| {
            let len = m.len.min(s.len());
            (m, &mut s[..len])
        })
    }

    /// Like [`Self::messages_mut`], read-only.
    pub fn messages(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> {
        self.meta[..self.filled].iter().zip(self.buf.chunks(self.slot)).map(|(m, s)| (m, &s[..m.len.min(s.len())]))
    }
}

/// The datagrams of one received message: split by its `UDP_GRO` segment size, or the whole message.
pub fn datagrams<'a>(meta: &RecvMeta, data: &'a mut [u8]) -> std::slice::ChunksMut<'a, u8> {
    let step = if meta.gso_size > 0 { usize::from(meta.gso_size) } else { data.len().max(1) };
    data.chunks_mut(step)
}
