//! Opening TUN/TAP devices: [`DeviceBuilder`] -> [`Device`] (one [`Queue`] per fd); what the kernel supports is
//! [`Capabilities`](crate::Capabilities).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::configuration::netlink::{LinkInfo, Netlink};
use crate::devices::queue::Queue;
use crate::devices::tun_open::{busy, existing_link, negotiate_offloads, open_tun, permission_error};
use crate::error::{permission_or_io, validate_ifname, ConfigError, Error, Result};
use crate::sys::{self, iff};

pub use crate::devices::mode::Mode;
pub use crate::devices::offloads::{Offloads, UnknownOffload};

pub use crate::devices::vnet_hdr::VNET_HDR_SIZES;

/// The virtio header size UDP-tunnel offload needs: `struct virtio_net_hdr_v1_hash_tunnel`, whose last four
/// bytes hold the outer transport and inner network header offsets. The kernel reads and writes those fields
/// only when the header is at least this long.
pub const UDP_TUNNEL_VNET_HDR_LEN: usize = turbotun_wire::virtio_net::VIRTIO_NET_HDR_V1_HASH_TUNNEL_LEN;

/// Builds and opens a TUN or TAP device. Defaults: `IFF_NO_PI`, no virtio header, one queue, kernel-chosen name,
/// blocking I/O. Names follow the kernel's ioctls: `multi_queue` is `IFF_MULTI_QUEUE`, `offloads` is
/// `TUNSETOFFLOAD`; `queues` is how many fds are opened now.
#[derive(Debug, Clone)]
pub struct DeviceBuilder {
    mode: Mode,
    name: Option<String>,
    packet_info: bool,
    vnet_hdr: Option<usize>,
    offloads: Offloads,
    strict_offloads: bool,
    queues: usize,
    /// `IFF_MULTI_QUEUE` as asked for; `None`: whatever the number of queues needs (and, reopening an existing
    /// device with one queue, whatever it was created with).
    multi_queue: Option<bool>,
    napi: bool,
    napi_frags: bool,
    no_carrier: bool,
    backpressure: bool,
    exclusive: bool,
    persist: Option<bool>,
    owner: Option<u32>,
    group: Option<u32>,
    sndbuf: Option<i32>,
    txqueuelen: Option<u32>,
    nonblocking: bool,
}

impl DeviceBuilder {
    /// A builder for a device of `mode` with the defaults above.
    pub fn new(mode: Mode) -> Self {
        DeviceBuilder {
            mode,
            name: None,
            packet_info: false,
            vnet_hdr: None,
            offloads: Offloads::NONE,
            strict_offloads: false,
            queues: 1,
            multi_queue: None,
            napi: false,
            napi_frags: false,
            no_carrier: false,
            backpressure: false,
            exclusive: false,
            persist: None,
            owner: None,
            group: None,
            sndbuf: None,
            txqueuelen: None,
            nonblocking: false,
        }
    }
    /// A builder for a TUN device: `new(Mode::Tun)`.
    pub fn tun() -> Self {
        Self::new(Mode::Tun)
    }
    /// A builder for a TAP device: `new(Mode::Tap)`.
    pub fn tap() -> Self {
        Self::new(Mode::Tap)
    }
    /// The interface name; may be a template such as `tun%d`. Without it the kernel picks `tunN`/`tapN`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// Keep the 4-byte packet information header (clears `IFF_NO_PI`).
    pub fn packet_info(mut self, on: bool) -> Self {
        self.packet_info = on;
        self
    }
    /// `IFF_VNET_HDR` with a header of 10, 12 (`virtio_net_hdr_v1`), 20 (`_v1_hash`) or 24 bytes
    /// (`_v1_hash_tunnel`, needed for UDP-tunnel offloads); see [`VNET_HDR_SIZES`].
    pub fn vnet_hdr(mut self, size: usize) -> Self {
        self.vnet_hdr = Some(size);
        self
    }
    /// Offloads to request; the granted set may be smaller ([`Device::offloads`]), as older kernels refuse
    /// some (USO before 6.2; the fallback order is in `docs/OFFLOAD.md`), unless [`Self::strict_offloads`].
    /// Needs [`Self::vnet_hdr`]. Any offload implies `CSUM`, which the kernel requires for the others.
    pub fn offloads(mut self, offloads: Offloads) -> Self {
        self.offloads = offloads;
        self
    }
    /// Offloads exactly as asked for or an error ([`Error::OffloadsRefused`]), instead of the quiet downgrade:
    /// for a VM monitor that has already told its guest what it offers. `CSUM` is still added to any offload.
    pub fn strict_offloads(mut self, on: bool) -> Self {
        self.strict_offloads = on;
        self
    }
    /// How many queues (fds) to open now; more than one needs `IFF_MULTI_QUEUE`, which is set for them unless
    /// [`Self::multi_queue`] says otherwise (an error). More can be added later ([`Device::add_queue`]) to a
    /// multiqueue device.
    pub fn queues(mut self, n: usize) -> Self {
        self.queues = n;
        self
    }
    /// `IFF_MULTI_QUEUE`, explicitly: `true` makes a multiqueue device even with one queue now (so that queues
    /// can be added later, for a guest that raises its queue-pair count), and refuses an existing device created
    /// without it; `false` refuses more than one queue and an existing multiqueue device. Without this option the
    /// flag follows [`Self::queues`], and one queue attaches to an existing device whichever way it was created.
    pub fn multi_queue(mut self, on: bool) -> Self {
        self.multi_queue = Some(on);
        self
    }
    /// `IFF_NAPI`: the kernel receives written packets through NAPI, in batches, instead of one at a time.
    pub fn napi(mut self, on: bool) -> Self {
        self.napi = on;
        self
    }
    /// `IFF_NAPI_FRAGS`: writes are taken as page fragments. TAP only, and needs [`Self::napi`].
    pub fn napi_frags(mut self, on: bool) -> Self {
        self.napi_frags = on;
        self
    }
    /// `IFF_NO_CARRIER`: create the device with its carrier off, until [`Device::set_carrier`] turns it on.
    pub fn no_carrier(mut self, on: bool) -> Self {
        self.no_carrier = on;
        self
    }
    /// `IFF_TUN_EXCL`: fail with EBUSY if the device exists already.
    pub fn exclusive(mut self, on: bool) -> Self {
        self.exclusive = on;
        self
    }
    /// `TUNSETPERSIST`: whether the device outlives its last fd. Without this option the flag is left as is.
    pub fn persist(mut self, on: bool) -> Self {
        self.persist = Some(on);
        self
    }
    /// `TUNSETOWNER`: the user that may attach to the device without CAP_NET_ADMIN.
    pub fn owner(mut self, uid: u32) -> Self {
        self.owner = Some(uid);
        self
    }
    /// `TUNSETGROUP`: the group whose members may attach to the device without CAP_NET_ADMIN.
    pub fn group(mut self, gid: u32) -> Self {
        self.group = Some(gid);
        self
    }
    /// Asks for `IFF_BACKPRESSURE`: when the device's transmit ring (its txqueuelen) is full, the kernel stops
    /// the queue and senders wait, instead of dropping the packet (counted as `TX dropped`). Where
    /// `TUNGETFEATURES` does not list it, the device opens without it and [`Device::notes`] says so;
    /// [`Device::backpressure`] tells what was granted.
    pub fn backpressure(mut self, on: bool) -> Self {
        self.backpressure = on;
        self
    }
    /// The device's transmit queue length (rtnetlink `IFLA_TXQLEN`). For TUN/TAP it is the length of each
    /// queue's ring of packets waiting for the reader: longer absorbs longer bursts before the kernel tail-drops,
    /// at the price of latency under load.
    pub fn txqueuelen(mut self, packets: u32) -> Self {
        self.txqueuelen = Some(packets);
        self
    }
    /// `TUNSETSNDBUF` on every queue: how many bytes of the packets this process writes may be in flight in the
    /// kernel before a write waits (or fails with `EAGAIN`).
    pub fn sndbuf(mut self, bytes: i32) -> Self {
        self.sndbuf = Some(bytes);
        self
    }
    /// Open the queues with `O_NONBLOCK`.
    pub fn nonblocking(mut self, on: bool) -> Self {
        self.nonblocking = on;
        self
    }

    fn check(&self) -> Result<()> {
        if let Some(name) = &self.name {
            validate_ifname(name)?;
        }
        if let Some(size) = self.vnet_hdr {
            if !VNET_HDR_SIZES.contains(&size) {
                let name = self.name.clone().unwrap_or_else(|| format!("{}%d", self.mode));
                return Err(Error::UnsupportedVnetHdr { name, len: size });
            }
        }
        if self.offloads.intersects(Offloads::UDP_TUNNEL) {
            if self.vnet_hdr.is_some_and(|size| size < UDP_TUNNEL_VNET_HDR_LEN) {
                return Err(Error::Config(ConfigError::UdpTunnelNeedsVnetHdr { len: UDP_TUNNEL_VNET_HDR_LEN }));
            }
            if !self.offloads.contains(Offloads::UDP_TUNNEL_GSO) {
                return Err(Error::Config(ConfigError::OffloadCombination {
                    rule: "udp_tunnel_gso_csum needs udp_tunnel_gso",
                }));
            }
            if !self.offloads.intersects(Offloads::TSO4 | Offloads::TSO6 | Offloads::USO4 | Offloads::USO6) {
                return Err(Error::Config(ConfigError::OffloadCombination {
                    rule: "the kernel grants UDP tunnel offloads only together with TSO or USO: add tso4/tso6 or uso",
                }));
            }
        }
        if !self.offloads.is_empty() && self.vnet_hdr.is_none() {
            return Err(Error::Config(ConfigError::OffloadsNeedVnetHdr { offloads: self.offloads }));
        }
        if self.offloads.intersects(Offloads::USO4 | Offloads::USO6)
            && !self.offloads.contains(Offloads::USO4 | Offloads::USO6)
        {
            return Err(Error::Config(ConfigError::OffloadCombination {
                rule: "the kernel accepts USO4 and USO6 only together",
            }));
        }
        if self.queues == 0 {
            return Err(Error::Config(ConfigError::NoQueue { needs: "queues(0): a device needs at least one queue" }));
        }
        if self.queues > 1 && self.multi_queue == Some(false) {
            return Err(Error::Config(ConfigError::Conflict {
                why: format!("queues({}) needs IFF_MULTI_QUEUE, and multi_queue(false) refuses it", self.queues),
            }));
        }
        if self.queues > MAX_QUEUES {
            let name = self.name.clone().unwrap_or_else(|| format!("{}%d", self.mode));
            return Err(Error::TooManyQueues { name, queues: self.queues, max: MAX_QUEUES });
        }
        if self.napi_frags && (!self.napi || self.mode != Mode::Tap) {
            return Err(Error::Config(ConfigError::Conflict {
                why: "napi_frags needs napi(true) on a TAP device".into(),
            }));
        }
        Ok(())
    }

    /// Fails with [`Error::Unsupported`] if the kernel's `TUNGETFEATURES` lacks a flag this builder needs.
    pub fn check_features(&self, features: u32) -> Result<()> {
        let need = |cond: bool, bit: u16, feature: &'static str| {
            if cond && features & u32::from(bit) == 0 {
                Err(Error::Unsupported { feature })
            } else {
                Ok(())
            }
        };
        need(self.vnet_hdr.is_some(), iff::VNET_HDR, "IFF_VNET_HDR (virtio net header)")?;
        need(self.wants_multi_queue(), iff::MULTI_QUEUE, "IFF_MULTI_QUEUE (multiqueue devices)")?;
        need(self.napi, iff::NAPI, "IFF_NAPI")?;
        need(self.napi_frags, iff::NAPI_FRAGS, "IFF_NAPI_FRAGS")?;
        need(self.no_carrier, iff::NO_CARRIER, "IFF_NO_CARRIER")?;
        Ok(())
    }

    fn flags(&self, multi_queue: bool) -> u16 {
        let mut flags = match self.mode {
            Mode::Tun => iff::TUN,
            Mode::Tap => iff::TAP,
        };
        let on = |cond: bool, bit: u16| if cond { bit } else { 0 };
        flags |= on(!self.packet_info, iff::NO_PI);
        flags |= on(self.vnet_hdr.is_some(), iff::VNET_HDR);
        flags |= on(multi_queue, iff::MULTI_QUEUE);
        flags |= on(self.napi, iff::NAPI);
        flags |= on(self.napi_frags, iff::NAPI_FRAGS);
        flags |= on(self.no_carrier, iff::NO_CARRIER);
        flags |= on(self.backpressure, iff::BACKPRESSURE);
        flags |= on(self.exclusive, iff::TUN_EXCL);
        flags
    }

    /// Creates the device, or attaches to an existing one of that name, and applies every setting.
    pub fn open(mut self) -> Result<Device> {
        self.check()?;
        let first = open_tun(self.nonblocking)?;
        let features = sys::tun_get_features(first.as_fd()).map_err(|e| Error::io("TUNGETFEATURES", e))?;
        self.check_features(features)?;

        let mut notes = Vec::new();
        // The kernel ignores request flags it does not know, so IFF_BACKPRESSURE is asked for only where listed.
        let wanted_backpressure = self.backpressure;
        self.backpressure &= features & u32::from(iff::BACKPRESSURE) != 0;
        if wanted_backpressure && !self.backpressure {
            notes.push(
                "IFF_BACKPRESSURE is not in this kernel's TUNGETFEATURES: opened without it, so a full transmit \
                 ring drops (TX dropped); a longer txqueuelen absorbs longer bursts"
                    .to_string(),
            );
        }
        let (name, multi_queue) = self.create_or_attach(first.as_fd(), &mut notes)?;
        let fds = self.attach_queues(first, &name, multi_queue)?;
        let ctl = fds[0].as_fd();
        let vnet_hdr_len = self.set_vnet_hdr(ctl)?;
        let offloads = self.set_offloads(ctl, &name, &mut notes)?;
        self.apply_settings(&fds, &name)?;

        let (_, kernel_flags) = sys::tun_get_iff(ctl).map_err(|e| Error::io("TUNGETIFF", e))?;
        let name: Arc<str> = Arc::from(name);
        let mut queues: Vec<Queue> = Vec::with_capacity(fds.len());
        for (index, fd) in fds.into_iter().enumerate() {
            let queue = Queue::new(fd, name.clone(), index, self.mode, vnet_hdr_len, offloads)
                .with_packet_info(self.packet_info);
            // One offload mask per device: a change through any queue shows through all.
            let queue = match queues.first() {
                Some(first) => queue.sharing_offloads_with(first),
                None => queue,
            };
            queues.push(queue);
        }
        let attach_flags = self.flags(multi_queue) & !iff::TUN_EXCL;
        let nonblocking = self.nonblocking;
        Ok(Device { name, mode: self.mode, kernel_flags, vnet_hdr_len, queues, notes, attach_flags, nonblocking })
    }

    /// Whether the device is to have `IFF_MULTI_QUEUE`: asked for, or needed for more than one queue.
    fn wants_multi_queue(&self) -> bool {
        self.multi_queue.unwrap_or(self.queues > 1)
    }

    /// `TUNSETIFF` on the first fd: creates the device or attaches to it. Returns the kernel's name for it and
    /// whether it is multiqueue.
    ///
    /// An existing device refuses an attach whose `IFF_MULTI_QUEUE` differs from how it was created (EINVAL). A
    /// plain one-queue open does not care, so it attaches again with the flag set (and says so in `notes`); an open
    /// that needs multiqueue fails with the fix in the error.
    fn create_or_attach(&self, fd: BorrowedFd<'_>, notes: &mut Vec<String>) -> Result<(String, bool)> {
        let requested = self.name.as_deref().unwrap_or("");
        let display_name = if requested.is_empty() { format!("{}%d", self.mode) } else { requested.to_string() };
        let multi_queue = self.wants_multi_queue();
        let existing = existing_link(requested);
        if let Some(link) = &existing {
            self.check_existing(link)?;
        }
        let err = match sys::tun_set_iff(fd, requested, self.flags(multi_queue)) {
            Ok(name) => return Ok((name, multi_queue)),
            Err(e) => e,
        };
        match err.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                return Err(permission_error(&display_name, existing.as_ref(), err))
            }
            Some(libc::EBUSY) => return Err(busy(&display_name, self.exclusive)),
            Some(libc::EINVAL) if !requested.is_empty() => {}
            _ => return Err(Error::io(format!("TUNSETIFF {display_name}"), err)),
        }
        // EINVAL on an existing device: usually the multiqueue flag differs from how it was created.
        if self.queues > 1 {
            return Err(Error::MultiQueueMismatch { name: display_name, existing: "without multi_queue", hint: "1" });
        }
        if self.multi_queue.is_some() {
            return Err(Error::Config(ConfigError::NotMultiQueue { name: display_name, existing: true }));
        }
        match sys::tun_set_iff(fd, requested, self.flags(true)) {
            Ok(name) => {
                let note = format!("{name} exists with multi_queue; attached with the flag set");
                tracing::info!("{note}");
                notes.push(note);
                Ok((name, true))
            }
            Err(e2) if e2.raw_os_error() == Some(libc::EBUSY) => Err(busy(&display_name, self.exclusive)),
            Err(_) => Err(Error::FlagsMismatch { name: display_name, source: err }),
        }
    }

    /// What an existing device of the requested name says about this open, before the kernel is asked: the
    /// kernel answers a name that is not TUN/TAP with a bare EINVAL, and on a multiqueue device that has queues
    /// already it ignores a newcomer's framing flags (virtio header, packet info), so the new queue would get
    /// frames in the device's framing and misread every one.
    fn check_existing(&self, link: &LinkInfo) -> Result<()> {
        let name = link.name.clone();
        let Some(tun) = &link.tun else {
            return Err(crate::devices::inspect::not_tun_tap(link));
        };
        let differ = |difference: String| Err(Error::FramingMismatch { name: name.clone(), difference });
        if tun.is_tap() != (self.mode == Mode::Tap) {
            let (is, asked) = if tun.is_tap() { ("tap", "tun") } else { ("tun", "tap") };
            return differ(format!("it is a {is} device, this open asks for {asked}"));
        }
        if tun.num_queues == 0 {
            // No queue attached: the kernel applies this open's flags to the device.
            return Ok(());
        }
        let has = |on: bool| if on { "has" } else { "has no" };
        let wants = |on: bool| if on { "asks for one" } else { "asks for none" };
        if tun.vnet_hdr != self.vnet_hdr.is_some() {
            return differ(format!(
                "it {} virtio header and {} queue(s) attached, this open {}",
                has(tun.vnet_hdr),
                tun.num_queues,
                wants(self.vnet_hdr.is_some())
            ));
        }
        if tun.no_pi == self.packet_info {
            return differ(format!(
                "it {} packet information header and {} queue(s) attached, this open {}",
                has(!tun.no_pi),
                tun.num_queues,
                wants(self.packet_info)
            ));
        }
        Ok(())
    }

    /// Attaches the queues after the first to the device `name`; returns all the fds, the first one first.
    fn attach_queues(&self, first: OwnedFd, name: &str, multi_queue: bool) -> Result<Vec<OwnedFd>> {
        let mut fds = vec![first];
        for _ in 1..self.queues {
            let fd = open_tun(self.nonblocking)?;
            // IFF_TUN_EXCL guards the creating open only; the device is ours now, so further queues attach.
            let flags = self.flags(multi_queue) & !iff::TUN_EXCL;
            sys::tun_set_iff(fd.as_fd(), name, flags).map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => busy(name, false),
                Some(libc::E2BIG) => {
                    Error::TooManyQueues { name: name.to_string(), queues: self.queues, max: MAX_QUEUES }
                }
                _ => Error::io(format!("attaching queue {} to {name}", fds.len()), e),
            })?;
            fds.push(fd);
        }
        Ok(fds)
    }

    /// `TUNSETVNETHDRSZ`; returns the header size in front of every packet (0 without a virtio header).
    fn set_vnet_hdr(&self, ctl: BorrowedFd<'_>) -> Result<usize> {
        let Some(size) = self.vnet_hdr else { return Ok(0) };
        sys::tun_set_vnet_hdr_sz(ctl, size as i32).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => Error::Unsupported { feature: "this virtio header size" },
            _ => Error::io("TUNSETVNETHDRSZ", e),
        })?;
        Ok(size)
    }

    /// `TUNSETOFFLOAD`; returns what the kernel granted and notes what it refused.
    fn set_offloads(&self, ctl: BorrowedFd<'_>, name: &str, notes: &mut Vec<String>) -> Result<Offloads> {
        // Always set the mask: a persistent device keeps the last owner's offloads, and a reader that asked for
        // none must not be handed super-packets.
        if self.strict_offloads {
            let wanted = if self.offloads.is_empty() { Offloads::NONE } else { self.offloads | Offloads::CSUM };
            return match sys::tun_set_offload(ctl, wanted.bits()) {
                Ok(()) => Ok(wanted),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Err(Error::OffloadsRefused {
                    name: name.to_string(),
                    asked: wanted,
                    reason: "the kernel refused the combination (EINVAL), and strict_offloads takes no less",
                }),
                Err(e) => Err(Error::io(format!("TUNSETOFFLOAD on {name}"), e)),
            };
        }
        let offloads = negotiate_offloads(ctl, name, self.offloads)?;
        if offloads != self.offloads && !self.offloads.is_empty() {
            let missing = self.offloads.difference(offloads).difference(Offloads::CSUM);
            if !missing.is_empty() {
                notes.push(format!("{name}: kernel refused offloads {missing}; granted {offloads}"));
            }
        }
        Ok(offloads)
    }

    /// Owner, group (on the device, through the first fd), the send buffer (on every queue), the transmit queue
    /// length (rtnetlink) and persistence.
    /// Persistence comes last: a setting refused before it leaves no persistent device behind.
    fn apply_settings(&self, fds: &[OwnedFd], name: &str) -> Result<()> {
        let ctl = fds[0].as_fd();
        // EINVAL: the id does not map into this user namespace (or is -1, which means "none").
        if let Some(uid) = self.owner {
            sys::tun_set_owner(ctl, uid).map_err(|e| match e.raw_os_error() {
                Some(libc::EINVAL) => {
                    Error::Config(ConfigError::IdRefused { request: "TUNSETOWNER", id: uid, kind: "uid" })
                }
                _ => permission_or_io("TUNSETOWNER", e),
            })?;
        }
        if let Some(gid) = self.group {
            sys::tun_set_group(ctl, gid).map_err(|e| match e.raw_os_error() {
                Some(libc::EINVAL) => {
                    Error::Config(ConfigError::IdRefused { request: "TUNSETGROUP", id: gid, kind: "gid" })
                }
                _ => permission_or_io("TUNSETGROUP", e),
            })?;
        }
        if let Some(bytes) = self.sndbuf {
            for fd in fds {
                sys::tun_set_sndbuf(fd.as_fd(), bytes).map_err(|e| Error::io("TUNSETSNDBUF", e))?;
            }
        }
        if let Some(len) = self.txqueuelen {
            Netlink::new()?.set_txqueuelen(name, len)?;
        }
        if let Some(persist) = self.persist {
            sys::tun_set_persist(ctl, persist).map_err(|e| permission_or_io("TUNSETPERSIST", e))?;
        }
        Ok(())
    }
}

/// The kernel's limit on queues per TUN/TAP device (`MAX_TAP_QUEUES` in `drivers/net/tun.c`).
pub const MAX_QUEUES: usize = 256;

/// An open TUN/TAP device: its name, what was granted, and one [`Queue`] per fd.
#[derive(Debug)]
pub struct Device {
    name: Arc<str>,
    mode: Mode,
    kernel_flags: u16,
    vnet_hdr_len: usize,
    queues: Vec<Queue>,
    notes: Vec<String>,
    /// The `TUNSETIFF` flags a further queue attaches with ([`Device::add_queue`]).
    attach_flags: u16,
    nonblocking: bool,
}

impl Device {
    /// The interface name the kernel gave the device.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Whether it is a TUN or a TAP device.
    pub fn mode(&self) -> Mode {
        self.mode
    }
    /// The `IFF_*` flags as `TUNGETIFF` reports them. Bit 0x1000 is set on every device: the kernel reports
    /// `IFF_NOFILTER`, which shares its value with `IFF_NO_PI`; ask rtnetlink (`TunInfo::no_pi`) for the truth.
    pub fn kernel_flags(&self) -> u16 {
        self.kernel_flags
    }
    /// Size of the virtio header in front of every packet, 0 without `IFF_VNET_HDR`.
    pub fn vnet_hdr_len(&self) -> usize {
        self.vnet_hdr_len
    }
    /// The offloads the kernel granted (at open, or since by [`Self::set_offloads`]).
    pub fn offloads(&self) -> Offloads {
        self.queues.first().map_or(Offloads::NONE, Queue::offloads)
    }

    /// `TUNSETOFFLOAD` at run time, exactly (see [`Queue::set_offloads`]); every queue's view follows.
    pub fn set_offloads(&self, offloads: Offloads) -> Result<()> {
        self.queues[0].set_offloads(offloads)
    }

    /// Attaches one more queue to a multiqueue device (a guest raised its queue-pair count): a new fd with the
    /// device's flags, its virtio header size and offloads view shared. [`ConfigError::NotMultiQueue`](crate::ConfigError::NotMultiQueue) on a device
    /// opened without `IFF_MULTI_QUEUE` ([`DeviceBuilder::multi_queue`]); the kernel's limit is [`MAX_QUEUES`].
    pub fn add_queue(&mut self) -> Result<&Queue> {
        if self.attach_flags & iff::MULTI_QUEUE == 0 {
            return Err(Error::Config(ConfigError::NotMultiQueue { name: self.name.to_string(), existing: false }));
        }
        let fd = open_tun(self.nonblocking)?;
        let index = self.queues.iter().map(|q| q.index() + 1).max().unwrap_or(0);
        sys::tun_set_iff(fd.as_fd(), &self.name, self.attach_flags).map_err(|e| match e.raw_os_error() {
            Some(libc::E2BIG) => {
                Error::TooManyQueues { name: self.name.to_string(), queues: self.queues.len() + 1, max: MAX_QUEUES }
            }
            Some(libc::EPERM) | Some(libc::EACCES) => {
                Error::PermissionDenied { action: format!("attaching a queue to {}", self.name), source: e }
            }
            _ => Error::io(format!("attaching queue {index} to {}", self.name), e),
        })?;
        let first = &self.queues[0];
        let queue = Queue::new(fd, self.name.clone(), index, self.mode, self.vnet_hdr_len, first.offloads())
            .with_packet_info(first.packet_info())
            .sharing_offloads_with(first);
        self.queues.push(queue);
        Ok(&self.queues[self.queues.len() - 1])
    }

    /// Takes the queue at `index` (its position in [`Self::queues`]) out of the device, for a guest that lowered
    /// its queue-pair count: dropping it closes its fd and the kernel stops steering packets to it. The first
    /// queue, which the device's settings go through, stays; `None` for it or an index out of range.
    pub fn remove_queue(&mut self, index: usize) -> Option<Queue> {
        (index > 0 && index < self.queues.len()).then(|| self.queues.remove(index))
    }
    /// Whether the device has `IFF_BACKPRESSURE` (asked for with [`DeviceBuilder::backpressure`] and offered by
    /// the kernel).
    pub fn backpressure(&self) -> bool {
        self.kernel_flags & iff::BACKPRESSURE != 0
    }
    /// The queues, one per fd, in the order they were opened.
    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }
    /// The queue at `index`, if there is one.
    pub fn queue(&self, index: usize) -> Option<&Queue> {
        self.queues.get(index)
    }
    /// Hands the queues out (e.g. one per thread). The device stays as long as a queue is open (or persists).
    pub fn into_queues(self) -> Vec<Queue> {
        self.queues
    }
    /// What the open adapted and why (multiqueue flag flipped, offloads refused).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
    /// `TUNSETPERSIST`: whether the device outlives its last fd (needs CAP_NET_ADMIN or to be its owner).
    pub fn set_persist(&self, persist: bool) -> Result<()> {
        sys::tun_set_persist(self.ctl(), persist).map_err(|e| permission_or_io("TUNSETPERSIST", e))
    }
    /// `TUNSETCARRIER`: turns the carrier on or off (the link shows `LOWER_UP` or `NO-CARRIER`).
    pub fn set_carrier(&self, carrier: bool) -> Result<()> {
        sys::tun_set_carrier(self.ctl(), carrier).map_err(|e| Error::io("TUNSETCARRIER", e))
    }
    /// `TUNSETTXFILTER`: only frames to the filter's MAC addresses reach the reader; `None` turns the filter off.
    /// TAP devices only (a TUN device is refused with [`Error::NotTap`]). See [`crate::filter`].
    pub fn set_tx_filter(&self, filter: Option<&crate::devices::filter::TxFilter>) -> Result<()> {
        if self.mode != Mode::Tap {
            return Err(Error::NotTap { name: self.name.to_string(), what: "TX filters (TUNSETTXFILTER)" });
        }
        crate::devices::filter::set_tx_filter(self.ctl(), filter)
    }
    /// `TUNSETFILTEREBPF`: runs `program` on every frame before it is queued for the reader (it decides how many
    /// bytes to keep, 0 drops); `None` removes the device's filter program.
    pub fn set_filter_program(&self, program: Option<&crate::devices::filter::FilterProgram>) -> Result<()> {
        match program {
            Some(program) => program.attach(self.ctl()),
            None => crate::devices::filter::FilterProgram::detach(self.ctl()),
        }
    }
    /// `TUNSETLINK`: the ARPHRD link type (e.g. `ARPHRD_NONE` = 0xfffe). The device must be down.
    pub fn set_link_type(&self, link_type: u32) -> Result<()> {
        sys::tun_set_link(self.ctl(), link_type).map_err(|e| Error::io("TUNSETLINK", e))
    }
    /// The network namespace the device lives in now (`TUNGETDEVNETNS`), as an fd usable with `setns`.
    pub fn netns(&self) -> Result<OwnedFd> {
        sys::tun_get_dev_netns(self.ctl()).map_err(|e| permission_or_io("TUNGETDEVNETNS", e))
    }
    /// The virtio header size as the kernel reports it now (`TUNGETVNETHDRSZ`).
    pub fn kernel_vnet_hdr_len(&self) -> Result<usize> {
        sys::tun_get_vnet_hdr_sz(self.ctl()).map(|n| n as usize).map_err(|e| Error::io("TUNGETVNETHDRSZ", e))
    }
    fn ctl(&self) -> BorrowedFd<'_> {
        self.queues[0].as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::tun_f;

    /// An old kernel's TUNGETFEATURES (2.6.x: tun, tap, no_pi, one_queue, vnet_hdr) refuses what it lacks by name.
    #[test]
    fn test_check_features_old_kernel() {
        let old = u32::from(iff::TUN | iff::TAP | iff::NO_PI | iff::ONE_QUEUE | iff::VNET_HDR);
        assert!(DeviceBuilder::tun().vnet_hdr(10).check_features(old).is_ok());
        for (builder, feature) in [
            (DeviceBuilder::tun().queues(2), "IFF_MULTI_QUEUE"),
            (DeviceBuilder::tun().multi_queue(true), "IFF_MULTI_QUEUE"),
            (DeviceBuilder::tun().napi(true), "IFF_NAPI"),
            (DeviceBuilder::tap().napi(true).napi_frags(true), "IFF_NAPI"),
            (DeviceBuilder::tun().no_carrier(true), "IFF_NO_CARRIER"),
        ] {
            let err = builder.check_features(old).unwrap_err();
            assert!(matches!(err, Error::Unsupported { .. }), "{err}");
            assert!(err.to_string().contains(feature), "{err}");
            assert!(err.to_string().contains("this kernel does not support"), "{err}");
        }
        let ancient = u32::from(iff::TUN | iff::TAP | iff::NO_PI);
        let err = DeviceBuilder::tun().vnet_hdr(10).check_features(ancient).unwrap_err();
        assert!(err.to_string().contains("IFF_VNET_HDR"), "{err}");
    }

    /// IFF_BACKPRESSURE goes into the TUNSETIFF flags only when asked for; `open` clears the request first where
    /// TUNGETFEATURES does not list the bit, because the kernel would ignore it without a word.
    #[test]
    fn test_backpressure_flag() {
        assert_eq!(DeviceBuilder::tun().flags(false) & iff::BACKPRESSURE, 0);
        let asked = DeviceBuilder::tun().backpressure(true);
        assert_eq!(asked.flags(false) & iff::BACKPRESSURE, iff::BACKPRESSURE);
        // Not a condition of opening: a kernel without it passes check_features, and the open degrades.
        let old = u32::from(iff::TUN | iff::TAP | iff::NO_PI | iff::VNET_HDR);
        assert!(asked.check_features(old).is_ok());
        // The value is the proposed one and collides with no flag the kernel has.
        assert_eq!(iff::BACKPRESSURE, 0x0080);
        let known = iff::TUN | iff::TAP | iff::NAPI | iff::NAPI_FRAGS | iff::NO_CARRIER | iff::NO_PI | iff::ONE_QUEUE;
        let known = known | iff::VNET_HDR | iff::TUN_EXCL | iff::MULTI_QUEUE | iff::PERSIST;
        assert_eq!(known & iff::BACKPRESSURE, 0);
    }

    /// The tunnel bits: the 24-byte header, the CSUM variant only with the base bit, and a plain GSO bit beside.
    #[test]
    fn test_udp_tunnel_builder_checks() {
        let tcp_tunnel = Offloads::TCP | Offloads::UDP_TUNNEL;
        assert!(DeviceBuilder::tap().vnet_hdr(24).offloads(tcp_tunnel).check().is_ok());
        for (builder, why) in [
            (DeviceBuilder::tap().vnet_hdr(12).offloads(tcp_tunnel), "24-byte virtio header"),
            (DeviceBuilder::tap().vnet_hdr(24).offloads(Offloads::TCP | Offloads::UDP_TUNNEL_GSO_CSUM), "needs udp"),
            (DeviceBuilder::tap().vnet_hdr(24).offloads(Offloads::CSUM | Offloads::UDP_TUNNEL), "TSO or USO"),
            (DeviceBuilder::tap().vnet_hdr(16), "must be 10, 12, 20 or 24"),
        ] {
            let err = builder.check().unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn test_offloads_parse_and_display() {
        assert_eq!(Offloads::parse("csum,tso4").unwrap(), Offloads::CSUM | Offloads::TSO4);
        assert_eq!(Offloads::parse("all").unwrap(), Offloads::ALL);
        assert_eq!(Offloads::parse("uso").unwrap(), Offloads::USO4 | Offloads::USO6);
        assert_eq!(Offloads::parse("").unwrap(), Offloads::NONE);
        assert!(Offloads::parse("tso9").unwrap_err().to_string().contains("tso9"));
        assert_eq!(Offloads::ALL.to_string(), "csum,tso4,tso6,tso_ecn,uso4,uso6");
        assert_eq!(Offloads::NONE.to_string(), "none");
        assert_eq!(Offloads::from_bits_truncate(0xffff_ffff), Offloads::ALL | Offloads::UFO | Offloads::UDP_TUNNEL);
        assert_eq!(Offloads::parse("ufo").unwrap().bits(), tun_f::UFO, "every bit the kernel knows can be said");
        assert!(!Offloads::ALL.intersects(Offloads::UDP_TUNNEL), "tunnel offloads are asked for explicitly");
        assert_eq!(Offloads::parse("udp_tunnel").unwrap().bits(), tun_f::UDP_TUNNEL_GSO | tun_f::UDP_TUNNEL_GSO_CSUM);
        assert_eq!(Offloads::UDP_TUNNEL.to_string(), "udp_tunnel_gso,udp_tunnel_gso_csum");
        assert_eq!((tun_f::UDP_TUNNEL_GSO, tun_f::UDP_TUNNEL_GSO_CSUM), (0x80, 0x100));
        assert_eq!(format!("{:?}", Offloads::TCP), "Offloads(csum,tso4,tso6)");
        assert_eq!(Offloads::TCP.names(), ["csum", "tso4", "tso6"]);
        assert_eq!(
            Offloads::ALL.bits(),
            tun_f::CSUM | tun_f::TSO4 | tun_f::TSO6 | tun_f::TSO_ECN | tun_f::USO4 | tun_f::USO6
        );
    }
}
