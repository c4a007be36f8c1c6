//! The device: opening TUN/TAP devices and their queues, their modes and offloads, what the kernel supports,
//! the filters and steering program attached to them, and reports on them. The stop handle a queue's waits watch
//! is `crate::stop`, beside `error.rs`, below both this folder and the dataplane that fires it.

pub(crate) mod capabilities;
pub mod device;
pub mod filter;
pub mod inspect;
pub(crate) mod mode;
pub(crate) mod offloads;
pub mod queue;
pub mod steering;
pub(crate) mod tun_open;
pub(crate) mod vnet_hdr;
