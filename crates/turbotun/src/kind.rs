//! What kind of device a queue belongs to and what it may offload: [`Mode`] (TUN or TAP) and [`Offloads`]
//! (`TUNSETOFFLOAD` bits). Kept apart from `device` so that `queue` and `device` need not import each other.

use std::fmt;

use crate::error::{Error, Result};
use crate::sys::tun_f;

/// The virtio header sizes turbotun reads and writes: `virtio_net_hdr` (10 bytes), `_v1` (12, with
/// `num_buffers`), `_v1_hash` (20, with the hash report) and `_v1_hash_tunnel` (24, with the UDP-tunnel offsets).
/// The kernel accepts any size from 10 up (`TUNSETVNETHDRSZ`) and leaves bytes it does not know untouched; only
/// these are defined by the virtio specification, so a queue of another size is refused
/// ([`Error::UnsupportedVnetHdr`]).
pub const VNET_HDR_SIZES: [usize; 4] = [10, 12, 20, 24];

/// The largest of [`VNET_HDR_SIZES`]: room enough for any queue's header.
pub const MAX_VNET_HDR: usize = 24;

/// Refuses a virtio header size outside [`VNET_HDR_SIZES`] (0, no header, is allowed).
pub(crate) fn check_vnet_hdr_len(name: &str, len: usize) -> Result<()> {
    if len == 0 || VNET_HDR_SIZES.contains(&len) {
        Ok(())
    } else {
        Err(Error::UnsupportedVnetHdr { name: name.to_string(), len })
    }
}

/// TUN carries IP packets (layer 3), TAP carries Ethernet frames (layer 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `IFF_TUN`: IP packets, no link-layer header.
    Tun,
    /// `IFF_TAP`: Ethernet frames.
    Tap,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Tun => "tun",
            Mode::Tap => "tap",
        })
    }
}

/// A set of `TUNSETOFFLOAD` bits: what the kernel may hand us (and accept from us) as GSO super-packets.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Offloads(u32);

bitflags::bitflags! {
    impl Offloads: u32 {
        /// Partial checksums (`NEEDS_CSUM`); required for every other offload.
        const CSUM = tun_f::CSUM;
        /// TCP segmentation offload over IPv4 (`VIRTIO_NET_HDR_GSO_TCPV4`).
        const TSO4 = tun_f::TSO4;
        /// TCP segmentation offload over IPv6 (`VIRTIO_NET_HDR_GSO_TCPV6`).
        const TSO6 = tun_f::TSO6;
        /// TSO frames with CWR set (`VIRTIO_NET_HDR_GSO_ECN`).
        const TSO_ECN = tun_f::TSO_ECN;
        /// UDP segmentation offload over IPv4 (Linux 6.2+); the kernel accepts USO4 and USO6 only together.
        const USO4 = tun_f::USO4;
        /// UDP segmentation offload over IPv6 (Linux 6.2+); see [`Offloads::USO4`].
        const USO6 = tun_f::USO6;
        /// TCP/UDP super-packets inside a UDP tunnel such as VXLAN or Geneve (Linux 6.17+): granted only with TSO
        /// or USO, and used only with the 24-byte virtio header that carries the tunnel offsets.
        const UDP_TUNNEL_GSO = tun_f::UDP_TUNNEL_GSO;
        /// Tunnel super-packets whose outer UDP checksum is left to the reader (Linux 6.17+; needs
        /// [`Offloads::UDP_TUNNEL_GSO`]).
        const UDP_TUNNEL_GSO_CSUM = tun_f::UDP_TUNNEL_GSO_CSUM;
    }
}

impl Offloads {
    /// No offload: every packet is read and written whole, with its checksums complete.
    pub const NONE: Offloads = Offloads::empty();
    /// Checksum and TCP segmentation, v4 and v6: what every kernel since 2.6.27 grants.
    pub const TCP: Offloads = Offloads::CSUM.union(Offloads::TSO4).union(Offloads::TSO6);
    /// Everything the batch halves split and coalesce: checksum, TSO and USO. The UDP tunnel bits are not part
    /// of it: ask for [`Offloads::UDP_TUNNEL`] explicitly, with a 24-byte virtio header.
    pub const ALL: Offloads = Offloads::TCP.union(Offloads::TSO_ECN).union(Offloads::USO4).union(Offloads::USO6);
    /// Both UDP tunnel bits (Linux 6.17+).
    pub const UDP_TUNNEL: Offloads = Offloads::UDP_TUNNEL_GSO.union(Offloads::UDP_TUNNEL_GSO_CSUM);

    /// The names `parse` accepts and `Display` writes, in kernel bit order. They are lower case, as the command
    /// line takes them, so they are not the constants' names that `bitflags` knows.
    const NAMES: [(Offloads, &'static str); 8] = [
        (Offloads::CSUM, "csum"),
        (Offloads::TSO4, "tso4"),
        (Offloads::TSO6, "tso6"),
        (Offloads::TSO_ECN, "tso_ecn"),
        (Offloads::USO4, "uso4"),
        (Offloads::USO6, "uso6"),
        (Offloads::UDP_TUNNEL_GSO, "udp_tunnel_gso"),
        (Offloads::UDP_TUNNEL_GSO_CSUM, "udp_tunnel_gso_csum"),
    ];

    /// Names of the bits set, in kernel order (`csum`, `tso4`, ...).
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES.iter().filter(|(bit, _)| self.contains(*bit)).map(|(_, n)| *n).collect()
    }
    /// Parses a comma-separated list of names (`csum,tso4,tso6`), `all`, `tcp`, `uso`, `udp_tunnel` (both tunnel
    /// bits) or `none`.
    pub fn parse(list: &str) -> Result<Offloads> {
        let mut out = Offloads::NONE;
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            out |= match word {
                "all" => Offloads::ALL,
                "tcp" => Offloads::TCP,
                "none" => Offloads::NONE,
                "uso" => Offloads::USO4 | Offloads::USO6,
                "udp_tunnel" => Offloads::UDP_TUNNEL,
                _ => match Self::NAMES.iter().find(|(_, n)| *n == word) {
                    Some((bit, _)) => *bit,
                    None => {
                        return Err(Error::InvalidConfig(format!(
                            "unknown offload {word:?} (known: csum, tso4, tso6, tso_ecn, uso4, uso6, udp_tunnel_gso, \
                         udp_tunnel_gso_csum, tcp, uso, udp_tunnel, all, none)"
                        )))
                    }
                },
            };
        }
        Ok(out)
    }
}

impl fmt::Display for Offloads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.names().join(","))
    }
}

impl fmt::Debug for Offloads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Offloads({self})")
    }
}
