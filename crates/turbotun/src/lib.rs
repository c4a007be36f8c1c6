//! Linux TUN/TAP dataplane.
//!
//! - [`DeviceBuilder`] opens TUN or TAP devices the modern way (`IFF_NO_PI`, `IFF_VNET_HDR`, `TUNSETOFFLOAD`,
//!   `IFF_MULTI_QUEUE`, `IFF_NAPI`, persist/owner/group) and reports what the kernel granted.
//! - [`Queue`] is one fd: blocking or non-blocking single-packet and raw I/O.
//! - [`batch`] splits GSO super-packets into MTU-sized packets and coalesces packets before writing (GRO).
//! - `echo::Echo` (feature `echo`) answers what the kernel sends into a device (ARP, ND, ICMP and ICMPv6 echo,
//!   UDP).
//! - [`filter`]: what the kernel queues for the reader: the TAP TX filter on MAC addresses and an eBPF filter.
//! - [`netlink::Netlink`] configures addresses, MTU, state, txqueuelen, MAC, bridges and namespaces through
//!   rtnetlink.
//! - `load` (feature `load`): a paced UDP generator and a sink that counts loss, reordering and duplicates per
//!   flow.
//! - [`Capabilities`] says what this kernel supports, probed once.
//! - [`stats_socket`]: a running engine's counters served on a local socket (`/run/turbotun/NAME.stats`).
//! - `tokio` (feature `tokio`): `tokio::AsyncQueue`, the same queues and batch core awaited.
//! - `smoltcp` (feature `smoltcp`): `smoltcp::QueueDevice`, smoltcp's device over a queue with offloads underneath.
//! - `uring` (feature `uring`): io_uring forwarding.
//! - `vhost_user` (feature `vhost-user`): a vhost-user-net backend, a VM's virtqueues onto a TAP with its
//!   offloads.
//!
//! With no feature on, the crate is the dataplane alone: devices, queues, batches, the forwarding engine,
//! netlink, hand-over and privilege separation.
//!
//! ```no_run
//! use turbotun::batch::{RecvBatch, SendBatch};
//! use turbotun::{DeviceBuilder, Offloads};
//!
//! # fn main() -> turbotun::Result<()> {
//! let dev = DeviceBuilder::tun().name("tun0").vnet_hdr(10).offloads(Offloads::ALL).open()?;
//! println!("granted {}", dev.offloads());
//! let q = &dev.queues()[0];
//! let (mut rx, mut tx) = (RecvBatch::new(q), SendBatch::new(q));
//! let mut bufs = vec![vec![0u8; 10 + q.mtu()? as usize]; 64];
//! let mut lens = vec![0usize; 64];
//! let got = rx.recv_many(&mut bufs, &mut lens, 10, None)?;
//! tx.send_many(&mut bufs[..got.packets], &mut lens[..got.packets], 10, got.checksums)?;
//! # Ok(())
//! # }
//! ```
//!
//! Guarantees: no panics on anything the kernel or a peer sends; optional kernel features degrade (USO, NAPI,
//! steering eBPF) instead of failing, and what was granted is reported; all `unsafe` code lives in the private `sys` module.

#![warn(missing_docs)]
// Unsafe code is denied everywhere but in `sys`, the one module that makes system calls and ioctls (each block
// with a `// SAFETY:` comment); a `pub` item that cannot be reached from outside says so (`pub(crate)`).
#![deny(unsafe_code)]
#![warn(unreachable_pub)]

// The source is grouped by what each part is (the folders read like docs/ARCHITECTURE.md); the public paths
// stay flat: `turbotun::batch`, `turbotun::netlink`, ...
mod applications;
mod configuration;
mod dataplane;
mod deployment;
mod devices;
pub mod error;
#[allow(unsafe_code)]
mod sys;

#[cfg(feature = "echo")]
pub use applications::echo;
#[cfg(feature = "load")]
pub use applications::load;
pub use configuration::{netlink, netns};
#[cfg(feature = "smoltcp")]
pub use dataplane::smoltcp;
#[cfg(feature = "tokio")]
pub use dataplane::tokio;
#[cfg(feature = "uring")]
pub use dataplane::uring;
#[cfg(feature = "vhost-user")]
pub use dataplane::vhost_user;
pub use dataplane::{batch, forward, ring, stats, stop, tunnel, udp, wake};
pub(crate) use dataplane::{threads, write_policy};
pub use deployment::{handover, privilege, stats_socket};
pub(crate) use devices::{capabilities, kind};
pub use devices::{device, filter, inspect, queue, steering};

pub use capabilities::{Capabilities, GroWriteSupport};
pub use device::{Device, DeviceBuilder, Mode, Offloads};
pub use error::{validate_ifname, Error, Malformed, Result};
pub use forward::{ForwardMode, Forwarder, ForwarderBuilder, IoKind};
pub use queue::{Queue, QueueStats};
pub use stats::{Counters, DropReason, Drops, Engine, ProcessUsage, WhenFull};
pub use stop::StopHandle;
/// The calling thread's effective capability set (CAP_NET_ADMIN is bit 12).
pub use sys::effective_capabilities;
/// `TUNSETIFF` request flags (`IFF_*`), e.g. to read [`Device::kernel_flags`].
pub use sys::iff;
pub use turbotun_wire as wire;
/// What is known of a batch's L4 checksums (see [`batch::Received::checksums`]).
pub use turbotun_wire::Checksums;
