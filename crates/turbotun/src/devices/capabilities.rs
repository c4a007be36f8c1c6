//! What this kernel supports, every probe in one place: the tun driver's flags (`TUNGETFEATURES`), the offloads
//! and virtio header sizes a scratch device accepts, steering eBPF, io_uring, and whether coalesced writes are
//! taken. Probed once per process, when asked ([`Capabilities::get`]), never as a side effect of moving packets:
//! the probe creates scratch devices and, for the write probe, a private network namespace (tens of
//! milliseconds), which must not happen inside an event loop or under a seccomp filter.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::OnceLock;

use turbotun_wire::virtio_net::{flags, gso, VirtioNetHdrRepr};
use turbotun_wire::{checksum, ethernet, ipv4, tcp, udp, VIRTIO_NET_HDR_LEN};

#[cfg(doc)]
use crate::devices::device::UDP_TUNNEL_VNET_HDR_LEN;
use crate::devices::mode::Mode;
use crate::devices::offloads::Offloads;
use crate::devices::queue::Queue;
use crate::devices::tun_open::open_tun;
use crate::devices::vnet_hdr::VNET_HDR_SIZES;
use crate::error::{permission_or_io, Error, Result};
use crate::sys::{self, iff};

/// Whether the kernel accepts coalesced writes of each kind (`None`: could not tell, e.g. the probe lacked the
/// privilege for a namespace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroWriteSupport {
    /// Coalesced TCP (`GSO_TCPV4`).
    pub tcp: Option<bool>,
    /// Coalesced UDP (`GSO_UDP_L4`).
    pub udp: Option<bool>,
}

/// What this kernel supports, probed once per process ([`Capabilities::get`]).
#[derive(Debug, Clone)]
pub struct Capabilities {
    iff_features: u32,
    offloads: Option<Offloads>,
    vnet_hdr_sizes: Vec<usize>,
    /// Why `TUNSETSTEERINGEBPF` is not available (`None`: it took a program on a scratch multiqueue device).
    steering_ebpf_missing: Option<String>,
    io_uring: bool,
    gro_writes: GroWriteSupport,
}

static CAPS: OnceLock<Capabilities> = OnceLock::new();

impl Capabilities {
    /// The `IFF_*` flags `TUNGETFEATURES` reports.
    pub fn iff_features(&self) -> u32 {
        self.iff_features
    }
    /// Offload bits a scratch device accepted, each probed on its own (`None`: probing needs CAP_NET_ADMIN).
    pub fn offloads(&self) -> Option<Offloads> {
        self.offloads
    }
    /// Virtio header sizes the driver accepted (of [`VNET_HDR_SIZES`]; empty: probing needs CAP_NET_ADMIN).
    pub fn vnet_hdr_sizes(&self) -> &[usize] {
        &self.vnet_hdr_sizes
    }
    /// Whether `TUNSETSTEERINGEBPF` took a program on a scratch multiqueue device.
    pub fn steering_ebpf(&self) -> bool {
        self.steering_ebpf_missing.is_none()
    }
    /// Why steering eBPF is not available, in words, when it is not.
    pub fn steering_ebpf_missing(&self) -> Option<&str> {
        self.steering_ebpf_missing.as_deref()
    }
    /// Whether `io_uring_setup` works here.
    pub fn io_uring(&self) -> bool {
        self.io_uring
    }
    /// Whether the kernel takes coalesced writes of each kind, probed on a scratch device in a private network
    /// namespace; [`crate::batch::SendBatch`] turns off a kind found refused.
    pub fn gro_writes(&self) -> GroWriteSupport {
        self.gro_writes
    }
    /// Whether the driver supports `IFF_VNET_HDR` (a virtio header in front of every packet).
    pub fn vnet_hdr(&self) -> bool {
        self.iff_features & u32::from(iff::VNET_HDR) != 0
    }
    /// Whether the driver supports `IFF_MULTI_QUEUE` (more than one fd per device).
    pub fn multi_queue(&self) -> bool {
        self.iff_features & u32::from(iff::MULTI_QUEUE) != 0
    }
    /// Whether the driver supports `IFF_NAPI` (written packets delivered through NAPI, in batches).
    pub fn napi(&self) -> bool {
        self.iff_features & u32::from(iff::NAPI) != 0
    }
    /// Whether the driver supports `IFF_NAPI_FRAGS` (TAP writes as page fragments, with NAPI).
    pub fn napi_frags(&self) -> bool {
        self.iff_features & u32::from(iff::NAPI_FRAGS) != 0
    }
    /// Whether the driver offers `IFF_BACKPRESSURE` (a full transmit ring stops the device's queue instead of
    /// dropping). No released kernel does yet.
    pub fn backpressure(&self) -> bool {
        self.iff_features & u32::from(iff::BACKPRESSURE) != 0
    }
    /// Whether UDP segmentation offload was granted on the scratch device.
    pub fn uso(&self) -> bool {
        self.offloads.is_some_and(|o| o.contains(Offloads::USO4 | Offloads::USO6))
    }
    /// Whether UDP-tunnel segmentation offload (`TUN_F_UDP_TUNNEL_GSO`, Linux 6.17+) was granted on the scratch
    /// device; it is used with a virtio header of [`UDP_TUNNEL_VNET_HDR_LEN`] bytes.
    pub fn udp_tunnel_gso(&self) -> bool {
        self.offloads.is_some_and(|o| o.contains(Offloads::UDP_TUNNEL_GSO))
    }
    /// Whether the outer-checksum variant (`TUN_F_UDP_TUNNEL_GSO_CSUM`) was granted too.
    pub fn udp_tunnel_gso_csum(&self) -> bool {
        self.offloads.is_some_and(|o| o.contains(Offloads::UDP_TUNNEL))
    }

    /// The capabilities of this kernel, probed on the first call and cached for the life of the process. The
    /// probe costs tens of milliseconds (scratch devices, a private namespace for the write probe) and needs
    /// CAP_NET_ADMIN for all but the driver's flags: call it once at start, before traffic (the forwarding engine
    /// and the echo do, when they are built). Without the privilege the answers it cannot get are "unknown".
    pub fn get() -> Result<&'static Capabilities> {
        if let Some(caps) = CAPS.get() {
            return Ok(caps);
        }
        let caps = Capabilities::probe()?;
        Ok(CAPS.get_or_init(|| caps))
    }

    /// What [`Self::get`] found, if it has run in this process (it never runs as a side effect of this call).
    pub fn if_probed() -> Option<&'static Capabilities> {
        CAPS.get()
    }

    /// Probes without caching: `TUNGETFEATURES`, then (with CAP_NET_ADMIN) a scratch device per optional feature,
    /// and the write probe in a private namespace. Scratch devices are non-persistent with kernel-chosen names
    /// and vanish when their fd closes.
    pub fn probe() -> Result<Capabilities> {
        let fd = open_tun(false)?;
        let iff_features = sys::tun_get_features(fd.as_fd()).map_err(|e| Error::io("TUNGETFEATURES", e))?;
        let mut caps = Capabilities {
            iff_features,
            offloads: None,
            vnet_hdr_sizes: Vec::new(),
            steering_ebpf_missing: Some("not probed: needs CAP_NET_ADMIN".into()),
            io_uring: sys::io_uring_available(),
            gro_writes: GroWriteSupport::default(),
        };
        if let Ok(scratch) = scratch_device(iff::TUN | iff::NO_PI | iff::VNET_HDR) {
            let mut granted = Offloads::NONE;
            for candidate in [
                Offloads::CSUM,
                Offloads::CSUM | Offloads::TSO4,
                Offloads::CSUM | Offloads::TSO6,
                Offloads::CSUM | Offloads::TSO4 | Offloads::TSO_ECN,
                Offloads::CSUM | Offloads::UFO,
                Offloads::CSUM | Offloads::USO4 | Offloads::USO6,
                // The kernel grants the tunnel bits only next to plain TSO or USO.
                Offloads::CSUM | Offloads::TSO4 | Offloads::TSO6 | Offloads::UDP_TUNNEL_GSO,
                Offloads::CSUM | Offloads::TSO4 | Offloads::TSO6 | Offloads::UDP_TUNNEL,
            ] {
                if sys::tun_set_offload(scratch.as_fd(), candidate.bits()).is_ok() {
                    granted |= candidate;
                }
            }
            caps.offloads = Some(granted);
            for size in VNET_HDR_SIZES {
                if sys::tun_set_vnet_hdr_sz(scratch.as_fd(), size as i32).is_ok() {
                    caps.vnet_hdr_sizes.push(size);
                }
            }
        }
        caps.steering_ebpf_missing = if caps.multi_queue() {
            match scratch_device(iff::TUN | iff::NO_PI | iff::MULTI_QUEUE) {
                Ok(scratch) => crate::devices::steering::probe(scratch.as_fd()).err(),
                Err(e) => Some(e.to_string()),
            }
        } else {
            Some("needs IFF_MULTI_QUEUE".into())
        };
        caps.gro_writes = probe_gro_writes_privately();
        Ok(caps)
    }
}

fn scratch_device(flags: u16) -> Result<OwnedFd> {
    let fd = open_tun(false)?;
    sys::tun_set_iff(fd.as_fd(), "ttprobe%d", flags).map_err(|e| permission_or_io("creating a probe device", e))?;
    Ok(fd)
}

/// [`probe_gro_writes`] on a scratch TUN device inside a private network namespace, where no bridge, capture or
/// route can see the probe and from which the kernel removes the device when the probe ends. Without the
/// privileges for a namespace the answer is "could not tell" (`None`), and [`crate::batch::SendBatch`] relies
/// on its run-time fallback alone: a refused coalesced write turns that GRO kind off and is re-split, never lost.
fn probe_gro_writes_privately() -> GroWriteSupport {
    let probed = crate::configuration::netns::with_private_netns(|| -> Result<GroWriteSupport> {
        let dev =
            crate::devices::device::DeviceBuilder::tun().vnet_hdr(VIRTIO_NET_HDR_LEN).offloads(Offloads::ALL).open()?;
        crate::configuration::netlink::Netlink::new()?.set_up(dev.name(), true)?;
        Ok(probe_gro_writes(&dev.queues()[0]))
    });
    match probed {
        Ok(Ok(found)) => found,
        Ok(Err(e)) | Err(e) => {
            tracing::debug!("GRO write probe not run ({e}); relying on the EINVAL fallback");
            GroWriteSupport::default()
        }
    }
}

impl Capabilities {
    /// Writes one harmless coalesced packet of each kind to `queue` and reports which the kernel took: a write
    /// to a live device, for a program that wants to know before its first batch ([`Self::get`] runs the same
    /// probe on a scratch device, where it belongs).
    pub fn probe_gro_writes(queue: &Queue) -> GroWriteSupport {
        probe_gro_writes(queue)
    }
}

/// Writes one harmless coalesced packet of each kind (two segments, the second shorter than `gso_size`, the case
/// some 6.6-era kernels refuse with EINVAL) and reports which the kernel accepted. The probes go from 127.0.0.1
/// to 127.0.0.1, which the kernel's IP layer drops as martian after the virtio header was checked; on a TAP
/// device they are also addressed to a MAC that is not the device's.
fn probe_gro_writes(queue: &Queue) -> GroWriteSupport {
    if queue.vnet_hdr_len() == 0 {
        return GroWriteSupport { tcp: Some(false), udp: Some(false) };
    }
    let probe = |udp: bool| -> Option<bool> {
        let frame = probe_frame(queue.mode(), queue.vnet_hdr_len(), udp);
        match sys::write(queue.as_fd(), &frame) {
            Ok(_) => Some(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Some(false),
            Err(_) => None,
        }
    };
    GroWriteSupport { tcp: probe(false), udp: probe(true) }
}

/// The probe frame: virtio header, (Ethernet,) IPv4, TCP or UDP, 150 bytes of payload in segments of 100, the
/// L4 checksum left partial for the kernel as `NEEDS_CSUM` asks.
fn probe_frame(mode: Mode, vnet_hdr_len: usize, udp: bool) -> Vec<u8> {
    const PAYLOAD: usize = 150;
    const GSO_SIZE: u16 = 100;
    const LOCALHOST: [u8; 4] = [127, 0, 0, 1];
    let l2 = if mode == Mode::Tap { ethernet::HEADER_LEN } else { 0 };
    let l4_len = if udp { udp::HEADER_LEN } else { tcp::MIN_HEADER_LEN };
    let ip_len = ipv4::MIN_HEADER_LEN;
    let mut f = vec![0u8; vnet_hdr_len + l2 + ip_len + l4_len + PAYLOAD];
    let csum_offset = if udp { udp::CHECKSUM_OFFSET } else { tcp::CHECKSUM_OFFSET };
    VirtioNetHdrRepr {
        flags: flags::NEEDS_CSUM,
        gso_type: if udp { gso::UDP_L4 } else { gso::TCPV4 },
        hdr_len: (l2 + ip_len + l4_len) as u16,
        gso_size: GSO_SIZE,
        csum_start: (l2 + ip_len) as u16,
        csum_offset: csum_offset as u16,
    }
    .emit(&mut f[..vnet_hdr_len]);
    let frame = &mut f[vnet_hdr_len..];
    // The emitters below cannot fail: the buffer was sized for exactly these headers.
    if l2 > 0 {
        let eth = ethernet::Repr {
            dst: [0x02, 0, 0, 0, 0, 0x01],
            src: [0x02, 0, 0, 0, 0, 0x02],
            ethertype: ethernet::ETHERTYPE_IPV4,
            ..ethernet::Repr::default()
        };
        let _ = eth.emit(frame);
    }
    let protocol = if udp { turbotun_wire::IPPROTO_UDP } else { turbotun_wire::IPPROTO_TCP };
    let l4_total = (l4_len + PAYLOAD) as u16;
    let ip = ipv4::Repr {
        src: LOCALHOST,
        dst: LOCALHOST,
        protocol,
        payload_len: l4_total,
        ttl: 64,
        dont_frag: true,
        ..ipv4::Repr::default()
    };
    let _ = ip.emit(&mut frame[l2..]);
    let l4 = &mut frame[l2 + ip_len..];
    if udp {
        let _ = udp::Repr { src_port: 9, dst_port: 9, payload_len: PAYLOAD as u16 }.emit(l4);
    } else {
        let seg = tcp::Repr {
            src_port: 9,
            dst_port: 9,
            flags: tcp::flags::ACK | tcp::flags::PSH,
            window: 1024,
            ..Default::default()
        };
        let _ = seg.emit(l4);
    }
    let partial = checksum::fold(checksum::pseudo_header_v4(LOCALHOST, LOCALHOST, protocol, l4_total.into()));
    l4[csum_offset..csum_offset + 2].copy_from_slice(&partial.to_be_bytes());
    f
}
