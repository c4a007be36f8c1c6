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
//! - [`stats_socket`]: a running engine's counters served on a local socket (`/run/turbotun/NAME.stats`, `NAME@NETNS.stats` outside the initial network namespace).
//! - `tokio` (feature `tokio`): `tokio::AsyncQueue`, the same queues and batch core awaited.
//! - `smoltcp` (feature `smoltcp`): `smoltcp::QueueDevice`, smoltcp's device over a queue with offloads underneath.
//! - `uring` (feature `uring`): io_uring forwarding.
//! - `vhost_user` (feature `vhost-user`): a vhost-user-net backend, a VM's virtqueues onto a TAP with its
//!   offloads.
//!
//! With no feature on, the crate is the dataplane alone: devices, queues, batches, the forwarding engine,
//! netlink, hand-over and privilege separation.
//!
//! Every module has one public path, directly under the crate (`turbotun::batch`, `turbotun::netlink`, ...),
//! however the source is arranged; the types most programs need are at the root as well (`turbotun::Queue` is
//! `turbotun::queue::Queue`).
//!
//! ```no_run
//! use turbotun::batch::{Batch, RecvBatch, SendBatch};
//! use turbotun::{DeviceBuilder, Offloads};
//!
//! # fn main() -> turbotun::Result<()> {
//! let dev = DeviceBuilder::tun().name("tun0").vnet_hdr(10).offloads(Offloads::ALL).open()?;
//! println!("granted {}", dev.offloads());
//! let q = &dev.queues()[0];
//! let (mut rx, mut tx) = (RecvBatch::new(q), SendBatch::new(q));
//! let mut bufs = vec![vec![0u8; 10 + q.mtu()? as usize]; 64];
//! let mut lens = vec![0usize; 64];
//! let mut batch = Batch::new(&mut bufs, &mut lens, 10); // packet i at bufs[i][10..10 + lens[i]]
//! let got = rx.recv_many(&mut batch, None)?;
//! tx.send_many(&mut batch.range(0..got.packets), got.checksums)?;
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

// The source is grouped by what each part is (the folders read like docs/ARCHITECTURE.md), and inside the crate
// a module has one path, its folder's: `crate::dataplane::batch`, `crate::devices::queue`. The folders
// themselves are private; what users see is the flat list of modules re-exported below.
mod applications;
mod configuration;
mod dataplane;
mod deployment;
mod devices;
pub mod error;
// The stop handle ends engines (the dataplane fires it) and a queue's waits watch it (devices): a file of its own
// below both, like `error`.
pub mod stop;
#[allow(unsafe_code)]
mod sys;

// The public modules, flat (`turbotun::batch`, `turbotun::netlink`, ...): each is the folder module itself,
// documented at this path, and the one path code outside the crate uses. Code inside the crate does not use
// them (`scripts/check-imports.py` checks it); doc comments link through them, since they are what the reader sees.
#[cfg(feature = "echo")]
#[doc(inline)]
pub use applications::echo;
#[cfg(feature = "load")]
#[doc(inline)]
pub use applications::load;
#[doc(inline)]
pub use configuration::{local_socket, netlink, netns};
#[cfg(feature = "smoltcp")]
#[doc(inline)]
pub use dataplane::smoltcp;
#[cfg(feature = "tokio")]
#[doc(inline)]
pub use dataplane::tokio;
#[cfg(feature = "uring")]
#[doc(inline)]
pub use dataplane::uring;
#[cfg(feature = "vhost-user")]
#[doc(inline)]
pub use dataplane::vhost_user;
#[doc(inline)]
pub use dataplane::{aead, batch, forward, ring, stats, tunnel, udp, wake};
#[doc(inline)]
pub use deployment::{handover, privilege, socket_keeper, stats_socket};
#[doc(inline)]
pub use devices::{device, filter, inspect, queue, steering};

// The types most programs need, at the crate root as well.
pub use dataplane::forward::{ForwardMode, Forwarder, ForwarderBuilder, IoKind};
pub use dataplane::stats::{Counters, DropReason, Drops, Engine, ProcessUsage, WhenFull};
pub use devices::capabilities::{Capabilities, GroWriteSupport};
pub use devices::device::{Device, DeviceBuilder};
pub use devices::mode::Mode;
pub use devices::offloads::Offloads;
pub use devices::queue::{Queue, QueueStats};
pub use error::{validate_ifname, ConfigError, Error, Malformed, Result};
pub use stop::StopHandle;
/// The calling thread's effective capability set (CAP_NET_ADMIN is bit 12).
pub use sys::effective_capabilities;
/// `TUNSETIFF` request flags (`IFF_*`), e.g. to read [`Device::kernel_flags`].
pub use sys::iff;
pub use turbotun_wire as wire;
/// What is known of a batch's L4 checksums (see [`batch::Received::checksums`]).
pub use turbotun_wire::Checksums;
