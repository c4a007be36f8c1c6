//! Waking a worker that sleeps in a read on a blocking queue.
//!
//! A blocking read costs one system call per packet where a non-blocking queue costs a failed read, a `poll`
//! and the read again whenever it runs dry (measured on the forwarder: three times the system calls of a
//! blocking peer). The price of blocking is that a thread asleep in `read` does not see a stop flag; this
//! module interrupts it with a signal whose handler does nothing and is installed without `SA_RESTART`, so the
//! read returns `EINTR` (see [`crate::Error::is_interrupted`]) and the thread can look at its flag.
//!
//! A signal sent just before the thread enters `read` is lost, so [`interrupt`] is meant to be repeated until
//! the thread has finished (see [`interrupt_until_finished`]).

use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sys;

fn ensure_handler() -> Result<()> {
    static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| sys::install_wake_handler().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| Error::io("installing the wake-up signal handler", std::io::Error::other(e)))
}

/// Installs the handler now (it is installed on first use otherwise), so that a failure shows at start-up.
pub fn prepare() -> Result<()> {
    ensure_handler()
}

/// Makes sure the calling thread can be woken: unblocks the wake-up signal, which an inherited signal mask may
/// block. Call it at the start of a thread that will sleep in blocking reads.
pub fn unblock() -> Result<()> {
    sys::unblock_wake_signal().map_err(|e| Error::io("unblocking the wake-up signal", e))
}

/// Interrupts whatever blocking system call `thread` is in (it returns `EINTR`); harmless if it is in none.
pub fn interrupt<T>(thread: &JoinHandle<T>) -> Result<()> {
    ensure_handler()?;
    sys::wake_thread(thread).map_err(|e| Error::io("pthread_kill", e))
}

/// Interrupts `thread` every `every` until it has finished or `limit` has passed; true if it finished.
pub fn interrupt_until_finished<T>(thread: &JoinHandle<T>, every: Duration, limit: Duration) -> Result<bool> {
    let start = Instant::now();
    while !thread.is_finished() {
        if start.elapsed() >= limit {
            return Ok(false);
        }
        interrupt(thread)?;
        std::thread::sleep(every);
    }
    Ok(true)
}
