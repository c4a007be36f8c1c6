//! A stop handle: one flag that tells every worker of a forwarder (and any write waiting for room) to finish,
//! and an fd that becomes readable when it fires, for waits that must end with it.
//!
//! It stops engines, yet a queue's own waits watch it (`Queue::wait_readable_or_stop`), so it is neither the
//! dataplane's nor the devices': a file at the crate's root, below both, that names nothing of the crate but
//! `error`.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// Cheap to clone; every clone sees the same flag. Firing it is permanent.
#[derive(Debug, Clone, Default)]
pub struct StopHandle {
    flag: Arc<AtomicBool>,
    /// A non-blocking pipe whose read end turns readable when the handle fires; made on first use, since most
    /// handles are only ever looked at, never waited on.
    wake: Arc<OnceLock<WakePipe>>,
}

#[derive(Debug)]
struct WakePipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl WakePipe {
    fn new() -> Result<WakePipe> {
        let flags = rustix::pipe::PipeFlags::NONBLOCK | rustix::pipe::PipeFlags::CLOEXEC;
        let (read, write) =
            rustix::pipe::pipe_with(flags).map_err(|e| Error::io("creating the stop handle's pipe", e.into()))?;
        Ok(WakePipe { read, write })
    }

    /// One byte into the pipe; a full pipe is readable already, so the error is of no interest.
    fn poke(&self) {
        let _ = rustix::io::write(&self.write, &[1]);
    }
}

impl StopHandle {
    /// A handle that has not fired.
    pub fn new() -> Self {
        StopHandle::default()
    }

    /// Asks everything watching this handle to finish: the flag is set and [`Self::wake_fd`] turns readable.
    /// Workers asleep in a blocking read are woken by the forwarder that owns them (see
    /// [`crate::forward::Forwarder::run`]).
    pub fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        // Pairs with the fence in `wake_pipe`: either this sees the pipe, or the waiter sees the flag.
        fence(Ordering::SeqCst);
        if let Some(pipe) = self.wake.get() {
            pipe.poke();
        }
    }

    /// Whether [`Self::stop`] was called (or a signal given to [`Self::stop_on_signals`] came).
    pub fn is_stopped(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// The flag itself, for APIs that take one.
    pub fn as_flag(&self) -> &Arc<AtomicBool> {
        &self.flag
    }

    /// An fd that is readable once the handle has fired, for a wait (`poll`, `epoll`, a reactor) that must end
    /// when it does: wait on it beside the fd of interest. The first call makes a pipe (two fds for the life of
    /// the handle and its clones); it never needs draining, since firing is permanent.
    pub fn wake_fd(&self) -> Result<BorrowedFd<'_>> {
        Ok(self.wake_pipe()?.read.as_fd())
    }

    fn wake_pipe(&self) -> Result<&WakePipe> {
        let pipe = match self.wake.get() {
            Some(pipe) => pipe,
            None => {
                let made = WakePipe::new()?;
                // Another thread may have made one first; either is fine, the spare is closed.
                let _ = self.wake.set(made);
                self.wake.get().ok_or_else(|| Error::io("the stop handle's pipe", std::io::Error::other("unset")))?
            }
        };
        fence(Ordering::SeqCst);
        if self.is_stopped() {
            // A stop that came before the pipe existed.
            pipe.poke();
        }
        Ok(pipe)
    }

    /// Fires the handle on any of `signals` (e.g. `SIGINT`, `SIGTERM`): their handlers set the flag and write to
    /// [`Self::wake_fd`] (both async-signal-safe, through `signal-hook`), so that a wait on the fd ends at once.
    /// The handlers stay installed for the life of the process; call this before anything that must be undone
    /// on a signal (a socket bound, a device created), so that a signal never kills the process half-way.
    pub fn stop_on_signals(&self, signals: &[i32]) -> Result<()> {
        let pipe = self.wake_pipe()?;
        for &signal in signals {
            let installing = |e: std::io::Error| Error::io(format!("installing a handler for signal {signal}"), e);
            signal_hook::flag::register(signal, self.flag.clone()).map_err(installing)?;
            let write = pipe.write.try_clone().map_err(installing)?;
            signal_hook::low_level::pipe::register(signal, write).map_err(installing)?;
        }
        Ok(())
    }
}

/// Waits for `events` on `fd` and, with a stop handle, for its wake fd: true when `fd` is ready, false on timeout,
/// on a stop, or when a signal ends the wait. Errors and hang-ups count as ready, so that the next read or write
/// reports them.
pub(crate) fn wait_or_stop(
    fd: BorrowedFd<'_>,
    events: rustix::event::PollFlags,
    stop: Option<&StopHandle>,
    timeout: Option<std::time::Duration>,
) -> Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let wake = stop.map(StopHandle::wake_fd).transpose()?;
    if stop.is_some_and(StopHandle::is_stopped) {
        return Ok(false);
    }
    let timeout = timeout.map(|t| Timespec { tv_sec: t.as_secs() as i64, tv_nsec: t.subsec_nanos().into() });
    let mut fds = [PollFd::new(&fd, events), PollFd::new(&fd, PollFlags::empty())];
    let count = match &wake {
        Some(wake) => {
            fds[1] = PollFd::new(wake, PollFlags::IN);
            2
        }
        None => 1,
    };
    match poll(&mut fds[..count], timeout.as_ref()) {
        Ok(_) => Ok(!fds[0].revents().is_empty() && !stop.is_some_and(StopHandle::is_stopped)),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(crate::error::Error::io("poll", e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: BorrowedFd<'_>) -> bool {
        let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
        let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
        rustix::event::poll(&mut fds, Some(&zero)).unwrap() == 1
    }

    #[test]
    fn test_wake_fd_turns_readable_on_stop_whenever_it_was_made() {
        let before = StopHandle::new();
        let fd = before.wake_fd().unwrap();
        assert!(!readable(fd));
        before.clone().stop();
        assert!(readable(before.wake_fd().unwrap()));

        // Stopped before anyone asked for the fd: it is readable from the start.
        let after = StopHandle::new();
        after.stop();
        assert!(readable(after.wake_fd().unwrap()));
        assert!(after.is_stopped());
    }
}
