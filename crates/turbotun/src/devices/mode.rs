//! [`Mode`]: whether a device carries IP packets (TUN) or Ethernet frames (TAP). Apart from `device`, so that
//! `queue` and `device` need not import each other.

use std::fmt;

/// TUN carries IP packets (layer 3), TAP carries Ethernet frames (layer 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `IFF_TUN`: IP packets, no link-layer header.
    Tun,
    /// `IFF_TAP`: Ethernet frames.
    Tap,
}

impl Mode {
    /// How the packets of a device of this mode begin: an IP header (TUN) or an Ethernet header (TAP).
    pub fn framing(self) -> turbotun_wire::Framing {
        match self {
            Mode::Tun => turbotun_wire::Framing::Ip,
            Mode::Tap => turbotun_wire::Framing::Ethernet,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Tun => "tun",
            Mode::Tap => "tap",
        })
    }
}
