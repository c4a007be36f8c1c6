//! A WireGuard endpoint on turbotun's tunnel engine: a TUN device and UDP with segmentation offload on both
//! sides, the protocol from boringtun's `noise` module, configured through WireGuard's cross-platform userspace
//! interface so that the real `wg` and `wg-quick` drive it and wireguard-go talks to it.
//!
//! - [`wireguard::WireGuard`]: the protocol side, a [`turbotun::tunnel::Transform`] over several peers.
//! - [`config`]: the configuration and the `set=1` protocol (a bad request changes nothing).
//! - [`uapi`]: the configuration socket (`/var/run/wireguard/NAME.sock`).
//! - [`daemon`]: the whole endpoint as `turbotun wg` runs it: device, sockets, engine, daemonizing, and exiting
//!   when the device is deleted or the socket file removed.
#![forbid(unsafe_code)]

pub mod config;
pub mod daemon;
pub mod uapi;
pub mod wireguard;

pub use wireguard::WireGuard;
