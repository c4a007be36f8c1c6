//! The dataplane: moving packets between queues, sockets and the application. The batch halves (split and
//! coalesce), the AEAD a tunnel's transport data is sealed with, the forwarding engine and its io_uring paths over a slot ring, the tunnel engine over the UDP
//! layer, the one write policy, the counters, waking workers asleep in a read, and the async and smoltcp front ends.

pub mod aead;
pub mod batch;
pub mod forward;
pub mod ring;
#[cfg(feature = "smoltcp")]
pub mod smoltcp;
pub mod stats;
pub(crate) mod threads;
#[cfg(feature = "tokio")]
pub mod tokio;
pub mod tunnel;
pub mod udp;
#[cfg(feature = "uring")]
pub mod uring;
#[cfg(feature = "vhost-user")]
pub mod vhost_user;
pub mod wake;
pub(crate) mod write_policy;
