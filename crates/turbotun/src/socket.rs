//! Socket options a TUN/TAP application needs next to its devices.

use std::os::fd::AsFd;

use crate::error::{Error, Result};
use crate::sys;

/// Turns on UDP GSO (`UDP_SEGMENT`) for a UDP socket: each `send` of up to 64 KiB leaves as datagrams of
/// `segment_size` bytes, which reach a TUN/TAP device with USO as one super-packet.
pub fn set_udp_segment(socket: &impl AsFd, segment_size: u16) -> Result<()> {
    sys::set_udp_segment(socket.as_fd(), segment_size).map_err(|e| Error::io("setsockopt(UDP_SEGMENT)", e))
}
