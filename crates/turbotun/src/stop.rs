//! A stop handle: one flag that tells every worker of a forwarder (and any write waiting for room) to finish.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Cheap to clone; every clone sees the same flag. Firing it is permanent.
#[derive(Debug, Clone, Default)]
pub struct StopHandle {
    flag: Arc<AtomicBool>,
}

impl StopHandle {
    /// A handle that has not fired.
    pub fn new() -> Self {
        StopHandle::default()
    }

    /// Asks everything watching this handle to finish. Workers asleep in a blocking read are woken by the
    /// forwarder that owns them (see [`crate::forward::Forwarder::run`]).
    pub fn stop(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }

    /// Whether [`Self::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// The flag itself, for APIs that take one (e.g. `signal_hook::flag::register`, so that a signal fires it).
    pub fn as_flag(&self) -> &Arc<AtomicBool> {
        &self.flag
    }
}
