//! [`Offloads`]: the `TUNSETOFFLOAD` bits, what the kernel may hand a queue (and take from it) as GSO
//! super-packets, named as the command line takes them and derived from a guest's virtio-net features.
//!
//! This file names nothing of the crate but the ioctl's bits in `sys`, so that `Error::OffloadsRefused` can
//! carry an `Offloads` while `error.rs` stays below every folder; a word [`Offloads::parse`] does not know is an
//! error of its own ([`UnknownOffload`]) for the same reason.

use std::fmt;

use crate::sys::tun_f;

/// The words [`Offloads::parse`] knows, as its error lists them.
const KNOWN: &str =
    "csum, tso4, tso6, tso_ecn, ufo, uso4, uso6, udp_tunnel_gso, udp_tunnel_gso_csum, tcp, uso, udp_tunnel, all, none";

/// A word in an offload list that [`Offloads::parse`] does not know. As a [`crate::Error`] (it converts) it is
/// [`crate::Error::Config`] ([`crate::ConfigError::UnknownOffload`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown offload {word:?} (known: {})", KNOWN)]
pub struct UnknownOffload {
    /// The word as given.
    pub word: String,
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
        /// UDP fragmentation offload (`VIRTIO_NET_HDR_GSO_UDP`): the kernel accepts the bit (a guest that acked
        /// `VIRTIO_NET_F_GUEST_UFO` asks for it) but has handed out no UFO packets since Linux 4.14.
        const UFO = tun_f::UFO;
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
    const NAMES: [(Offloads, &'static str); 9] = [
        (Offloads::CSUM, "csum"),
        (Offloads::TSO4, "tso4"),
        (Offloads::TSO6, "tso6"),
        (Offloads::TSO_ECN, "tso_ecn"),
        (Offloads::UFO, "ufo"),
        (Offloads::USO4, "uso4"),
        (Offloads::USO6, "uso6"),
        (Offloads::UDP_TUNNEL_GSO, "udp_tunnel_gso"),
        (Offloads::UDP_TUNNEL_GSO_CSUM, "udp_tunnel_gso_csum"),
    ];

    /// The `TUNSETOFFLOAD` flags for a guest that acknowledged `features` (virtio-net feature bits, 128-bit word;
    /// see `turbotun_wire::virtio_net::features`): what the device may hand the guest. The rules are those of
    /// QEMU's `virtio_net_apply_guest_offloads` and of the kernel's `set_offload`, which refuses the whole call
    /// for a combination it does not take: nothing without `GUEST_CSUM`; `TSO4`, `TSO6`, `UFO` as acknowledged;
    /// `TSO_ECN` only beside TSO; USO only when both `GUEST_USO4` and `GUEST_USO6` were (the kernel takes them
    /// only together); the UDP-tunnel bits only beside TSO or USO, and the checksum one only with the tunnel one.
    /// Firecracker and cloud-hypervisor map `GUEST_CSUM`, `GUEST_TSO4/6` and `GUEST_UFO` one to one (and
    /// cloud-hypervisor `GUEST_ECN` too, unconditionally), which is the same for the combinations a conforming
    /// guest acknowledges and an `EINVAL` from the kernel for the others.
    pub fn for_guest_features(features: u128) -> Offloads {
        use turbotun_wire::virtio_net::features as f;
        let has = |n: u32| features & f::bit(n) != 0;
        if !has(f::GUEST_CSUM) {
            return Offloads::NONE;
        }
        let mut out = Offloads::CSUM;
        if has(f::GUEST_TSO4) {
            out |= Offloads::TSO4;
        }
        if has(f::GUEST_TSO6) {
            out |= Offloads::TSO6;
        }
        if has(f::GUEST_ECN) && out.intersects(Offloads::TSO4 | Offloads::TSO6) {
            out |= Offloads::TSO_ECN;
        }
        if has(f::GUEST_UFO) {
            out |= Offloads::UFO;
        }
        if has(f::GUEST_USO4) && has(f::GUEST_USO6) {
            out |= Offloads::USO4 | Offloads::USO6;
        }
        let inner = Offloads::TSO4 | Offloads::TSO6 | Offloads::USO4 | Offloads::USO6;
        if has(f::GUEST_UDP_TUNNEL_GSO) && out.intersects(inner) {
            out |= Offloads::UDP_TUNNEL_GSO;
            if has(f::GUEST_UDP_TUNNEL_GSO_CSUM) {
                out |= Offloads::UDP_TUNNEL_GSO_CSUM;
            }
        }
        out
    }

    /// Names of the bits set, in kernel order (`csum`, `tso4`, ...).
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES.iter().filter(|(bit, _)| self.contains(*bit)).map(|(_, n)| *n).collect()
    }
    /// Parses a comma-separated list of names (`csum,tso4,tso6`), `all`, `tcp`, `uso`, `udp_tunnel` (both tunnel
    /// bits) or `none`.
    pub fn parse(list: &str) -> Result<Offloads, UnknownOffload> {
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
                    None => return Err(UnknownOffload { word: word.to_string() }),
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

#[cfg(test)]
mod tests {
    use super::*;
    use turbotun_wire::virtio_net::features as f;

    fn word(bits: &[u32]) -> u128 {
        bits.iter().fold(0, |w, &n| w | f::bit(n))
    }

    /// Firecracker's mapping (`build_tap_offload_features`): one to one for the four bits it offers.
    fn firecracker(features: u128) -> Offloads {
        let mut out = Offloads::NONE;
        for (bit, flag) in [
            (f::GUEST_CSUM, Offloads::CSUM),
            (f::GUEST_UFO, Offloads::UFO),
            (f::GUEST_TSO4, Offloads::TSO4),
            (f::GUEST_TSO6, Offloads::TSO6),
        ] {
            if features & f::bit(bit) != 0 {
                out |= flag;
            }
        }
        out
    }

    /// The virtio-net guest features to TUN offload flags, against QEMU's rules and, for what a conforming guest
    /// acknowledges among the bits it offers, Firecracker's one-to-one mapping.
    #[test]
    fn test_for_guest_features() {
        let csum = f::GUEST_CSUM;
        let cases: &[(&[u32], Offloads)] = &[
            (&[], Offloads::NONE),
            // Nothing without GUEST_CSUM, whatever else was acknowledged (QEMU drops it all; the kernel would
            // refuse TSO without CSUM).
            (&[f::GUEST_TSO4, f::GUEST_TSO6, f::GUEST_UFO], Offloads::NONE),
            (&[csum], Offloads::CSUM),
            (&[csum, f::GUEST_TSO4], Offloads::CSUM | Offloads::TSO4),
            (&[csum, f::GUEST_TSO4, f::GUEST_TSO6], Offloads::TCP),
            // ECN only beside TSO (cloud-hypervisor passes it alone, which the kernel refuses).
            (&[csum, f::GUEST_ECN], Offloads::CSUM),
            (&[csum, f::GUEST_TSO6, f::GUEST_ECN], Offloads::CSUM | Offloads::TSO6 | Offloads::TSO_ECN),
            (&[csum, f::GUEST_UFO], Offloads::CSUM | Offloads::UFO),
            // USO only as a pair.
            (&[csum, f::GUEST_USO4], Offloads::CSUM),
            (&[csum, f::GUEST_USO4, f::GUEST_USO6], Offloads::CSUM | Offloads::USO4 | Offloads::USO6),
            // The tunnel bits only beside TSO or USO, the checksum one only with the tunnel one.
            (&[csum, f::GUEST_UDP_TUNNEL_GSO], Offloads::CSUM),
            (&[csum, f::GUEST_TSO4, f::GUEST_UDP_TUNNEL_GSO_CSUM], Offloads::CSUM | Offloads::TSO4),
            (
                &[csum, f::GUEST_TSO4, f::GUEST_UDP_TUNNEL_GSO, f::GUEST_UDP_TUNNEL_GSO_CSUM],
                Offloads::CSUM | Offloads::TSO4 | Offloads::UDP_TUNNEL,
            ),
            // Host-side and unrelated bits change nothing of what the guest takes.
            (&[csum, f::HOST_TSO4, f::HOST_ECN, f::HOST_USO, f::MRG_RXBUF, f::CSUM], Offloads::CSUM),
        ];
        for (bits, want) in cases {
            assert_eq!(Offloads::for_guest_features(word(bits)), *want, "{bits:?}");
        }
        // Every acknowledgement a conforming guest makes of the bits Firecracker offers maps as Firecracker maps it.
        for tso4 in [false, true] {
            for tso6 in [false, true] {
                for ufo in [false, true] {
                    let mut bits = vec![csum];
                    bits.extend(tso4.then_some(f::GUEST_TSO4));
                    bits.extend(tso6.then_some(f::GUEST_TSO6));
                    bits.extend(ufo.then_some(f::GUEST_UFO));
                    let w = word(&bits);
                    assert_eq!(Offloads::for_guest_features(w), firecracker(w), "{bits:?}");
                }
            }
        }
    }
}
