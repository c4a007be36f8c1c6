//! The device: opening TUN/TAP devices and their queues, their modes and offloads, what the kernel supports,
//! the filters and steering program attached to them, and reports on them; and the stop handle, which a queue's
//! waits watch (so it sits here, below the dataplane that fires it).

pub(crate) mod capabilities;
pub mod device;
pub mod filter;
pub mod inspect;
pub(crate) mod mode;
pub(crate) mod offloads;
pub mod queue;
pub mod steering;
pub mod stop;
pub(crate) mod vnet_hdr;
