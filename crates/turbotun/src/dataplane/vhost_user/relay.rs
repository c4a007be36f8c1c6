//! The front end's connection, relayed message by message to vhost-user-backend's request handler so that one
//! ordering QEMU uses is accepted.
//!
//! QEMU 7.2's virtio-net sends `SET_VRING_ENABLE` as soon as the backend offers `VHOST_USER_F_PROTOCOL_FEATURES`
//! (when the device is realized and again when the guest's driver starts it), before any `SET_FEATURES` has acked
//! that feature. The `vhost` crate's request handler refuses the message then ("inactive feature") and drops
//! the connection; a backend that does not offer the feature is refused by QEMU ("unable to start vhost net").
//! So the relay holds such an early `SET_VRING_ENABLE` (acknowledging it itself if the front end asked for a
//! reply) and hands it to the handler right after the `SET_FEATURES` that acks the feature; after one that does
//! not, the rings are enabled by `SET_FEATURES` itself (the spec's rule) and the held messages are dropped.
//! Every other message, with the file descriptors it carries, passes unchanged both ways.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rustix::net::SendFlags;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage};
use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, MAX_ATTACHED_FD_ENTRIES, MAX_MSG_SIZE};
use vhost::vhost_user::VhostUserVirtioFeatures;

/// A message header: request, flags, payload size (little-endian `u32`s, as on the socket).
const HEADER: usize = 12;
/// Early `SET_VRING_ENABLE`s held at most, one per ring: far more rings than a front end is offered.
const MAX_HELD: usize = 64;

/// One message as read from a socket: its header and payload bytes and the descriptors that came with it.
struct Message {
    bytes: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Message {
    fn field(&self, n: usize) -> u32 {
        u32::from_le_bytes(self.bytes[n * 4..n * 4 + 4].try_into().unwrap_or_default())
    }
    fn request(&self) -> u32 {
        self.field(0)
    }
    fn flags(&self) -> u32 {
        self.field(1)
    }
    fn set_flags(&mut self, flags: u32) {
        self.bytes[4..8].copy_from_slice(&flags.to_le_bytes());
    }
    fn payload(&self) -> &[u8] {
        &self.bytes[HEADER..]
    }
}

/// The two threads copying between the front end and the handler; each ends when its side closes and then
/// shuts both sockets, so that the other one ends too.
pub(super) struct Relay {
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Relays between `front` (the front end's connection) and `back` (the handler's end of a socket pair).
    pub(super) fn start(front: UnixStream, back: UnixStream) -> io::Result<Relay> {
        let front_writer = Arc::new(Mutex::new(front.try_clone()?));
        let (front_r, back_r, back_w) = (front.try_clone()?, back.try_clone()?, back);
        let to_handler = {
            let front_writer = front_writer.clone();
            std::thread::Builder::new()
                .name("vhost-user-relay".into())
                .spawn(move || requests(front_r, back_w, &front_writer))?
        };
        let to_front = std::thread::Builder::new()
            .name("vhost-user-relay".into())
            .spawn(move || replies(back_r, &front_writer))?;
        Ok(Relay { threads: vec![to_handler, to_front] })
    }

    /// Waits for both threads: the connection has ended on both sides.
    pub(super) fn join(self) {
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// Front end to handler, holding an early `SET_VRING_ENABLE` (see the module's comment).
fn requests(mut front: UnixStream, mut back: UnixStream, front_writer: &Mutex<UnixStream>) {
    let result = (|| -> io::Result<()> {
        let mut protocol_features_acked = false;
        let mut held: Vec<Message> = Vec::new();
        while let Some(mut message) = receive(&mut front)? {
            let request = message.request();
            if request == FrontendReq::SET_VRING_ENABLE as u32 && !protocol_features_acked {
                let flags = message.flags();
                if flags & VhostUserHeaderFlag::NEED_REPLY.bits() != 0 {
                    // REPLY_ACK: success, as the handler answers an enable it takes.
                    let mut reply = Vec::with_capacity(HEADER + 8);
                    reply.extend_from_slice(&request.to_le_bytes());
                    reply.extend_from_slice(&(0x1 | VhostUserHeaderFlag::REPLY.bits()).to_le_bytes());
                    reply.extend_from_slice(&8u32.to_le_bytes());
                    reply.extend_from_slice(&0u64.to_le_bytes());
                    let mut writer = front_writer.lock().unwrap_or_else(|p| p.into_inner());
                    writer.write_all(&reply)?;
                }
                message.set_flags(flags & !VhostUserHeaderFlag::NEED_REPLY.bits());
                // The latest per ring; a front end cannot make the relay hold more than a few.
                let ring = message.payload().get(..4).map(<[u8]>::to_vec);
                held.retain(|m| m.payload().get(..4).map(<[u8]>::to_vec) != ring);
                if held.len() == MAX_HELD {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("SET_VRING_ENABLE for more than {MAX_HELD} rings before SET_FEATURES"),
                    ));
                }
                held.push(message);
                continue;
            }
            send(&mut back, &message)?;
            if request == FrontendReq::SET_FEATURES as u32 {
                let acked = message.payload().get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
                protocol_features_acked =
                    acked.is_some_and(|f| f & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0);
                for early in held.drain(..) {
                    if protocol_features_acked {
                        send(&mut back, &early)?;
                    }
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        tracing::debug!("vhost-user relay, front end to backend: {e}");
    }
    let _ = front.shutdown(Shutdown::Both);
    let _ = back.shutdown(Shutdown::Both);
}

/// Handler to front end: replies, unchanged.
fn replies(mut back: UnixStream, front_writer: &Mutex<UnixStream>) {
    let result = (|| -> io::Result<()> {
        while let Some(message) = receive(&mut back)? {
            let mut writer = front_writer.lock().unwrap_or_else(|p| p.into_inner());
            send(&mut writer, &message)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        tracing::debug!("vhost-user relay, backend to front end: {e}");
    }
    let _ = back.shutdown(Shutdown::Both);
    let _ = front_writer.lock().unwrap_or_else(|p| p.into_inner()).shutdown(Shutdown::Both);
}

/// The next message on `socket` (the descriptors arrive with its first bytes); `None` at the end of the stream.
fn receive(socket: &mut UnixStream) -> io::Result<Option<Message>> {
    let mut header = [0u8; HEADER];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_ATTACHED_FD_ENTRIES))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got =
        rustix::net::recvmsg(&*socket, &mut [IoSliceMut::new(&mut header)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got.bytes == 0 {
        return Ok(None);
    }
    socket.read_exact(&mut header[got.bytes..])?;
    let size = u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize;
    if size > MAX_MSG_SIZE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a {size}-byte vhost-user message")));
    }
    let mut bytes = vec![0u8; HEADER + size];
    bytes[..HEADER].copy_from_slice(&header);
    socket.read_exact(&mut bytes[HEADER..])?;
    Ok(Some(Message { bytes, fds }))
}

/// Writes `message` whole, its descriptors with its first bytes.
fn send(socket: &mut UnixStream, message: &Message) -> io::Result<()> {
    let fds: Vec<BorrowedFd<'_>> = message.fds.iter().map(|fd| fd.as_fd()).collect();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the message's file descriptors"));
    }
    let sent = rustix::net::sendmsg(&*socket, &[IoSlice::new(&message.bytes)], &mut control, SendFlags::NOSIGNAL)?;
    socket.write_all(&message.bytes[sent..])
}

/// The handler's side of the relay: vhost-user-backend takes a connection only from a listener, so the relay
/// connects to one of its own, bound in a directory only this user may enter (made, then removed at once: the
/// listener and the connection waiting on it outlive their names). Returns the relay's end and the listener,
/// whose next `accept` is that connection.
pub(super) fn handler_listener() -> io::Result<(UnixStream, UnixListener)> {
    static N: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    let dir = loop {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("turbotun-vhost-user.{}.{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => break dir,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("making {}: {e}", dir.display()))),
        }
    };
    let path = dir.join("s");
    let made = UnixListener::bind(&path).and_then(|listener| Ok((UnixStream::connect(&path)?, listener)));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
    made
}
