//! A WireGuard endpoint on turbotun's tunnel engine: a TUN device and UDP with segmentation offload on both
//! sides, the protocol written here with the kernel implementation's semantics (on crates for every
//! primitive), configured through WireGuard's cross-platform userspace interface so that the real `wg` and
//! `wg-quick` drive it and wireguard-go talks to it.
//!
//! - [`wireguard::WireGuard`]: the protocol side, a [`turbotun::tunnel::Transform`] over several peers: routing,
//!   the data path, the handshake worker and the timers.
//! - [`noise`]: the handshake's construction and the messages' layouts; [`cookie`]: mac1/mac2, cookie replies
//!   and the per-source rate limit; [`session`]: transport keys, send counter and replay window; [`peer`]: one
//!   peer's state.
//! - [`config`]: the configuration, the data model that `wg` reads and writes.
//! - [`uapi`]: WireGuard's userspace configuration protocol: the socket (`/var/run/wireguard/NAME.sock`), the
//!   `get=1` reply ([`uapi::get`]) and the `set=1` request (a bad request changes nothing, [`uapi::set`]).
//! - [`daemon`]: the whole endpoint as `turbotun wg` runs it: device, sockets, engine, daemonizing, and exiting
//!   when the device is deleted or the socket file removed.
#![forbid(unsafe_code)]

pub mod config;
pub mod cookie;
pub mod daemon;
pub mod message;
pub mod noise;
pub mod peer;
pub mod session;
pub mod uapi;
pub mod wireguard;

pub use wireguard::WireGuard;
