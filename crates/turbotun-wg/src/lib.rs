//! A WireGuard endpoint on turbotun's tunnel engine: a TUN device and UDP with segmentation offload on both
//! sides, the protocol written here with the kernel implementation's semantics (on crates for every
//! primitive), configured through WireGuard's cross-platform userspace interface so that the real `wg` and
//! `wg-quick` drive it and wireguard-go talks to it.
//!
//! - [`wireguard::WireGuard`]: the protocol side, a [`turbotun::tunnel::Transform`] over several peers: routing,
//!   the data path, the handshake worker and the timers.
//! - [`message`]: the four messages as typed views over their bytes (the handshake's construction, the cookies,
//!   the transport keys and the per-peer state are the crate's own: `noise`, `cookie`, `session`, `peer`).
//! - [`config`]: the configuration, the data model that `wg` reads and writes.
//! - [`uapi`]: WireGuard's userspace configuration protocol: where the socket is
//!   (`/var/run/wireguard/NAME.sock`, [`uapi::socket_path`]); a bad `set=1` request changes nothing.
//! - [`daemon`]: the whole endpoint as `turbotun wg` runs it: device, sockets, engine, daemonizing, and exiting
//!   when the device is deleted or the socket file removed.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

mod blake2s;
pub mod config;
mod cookie;
pub mod daemon;
pub mod message;
mod noise;
mod peer;
mod session;
pub mod uapi;
pub mod wireguard;

pub use wireguard::WireGuard;
