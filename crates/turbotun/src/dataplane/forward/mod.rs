//! The forwarding engine: packets from each queue of one device to the same queue of another, and back.
//!
//! ```no_run
//! use turbotun::forward::{ForwardMode, ForwarderBuilder};
//! use turbotun::Mode;
//!
//! # fn main() -> turbotun::Result<()> {
//! let builder = ForwarderBuilder::new(ForwardMode::Offload);
//! let a = builder.device(Mode::Tun).name("tun-a").open()?;
//! let b = builder.device(Mode::Tun).name("tun-b").open()?;
//! let forwarder = builder.build(a, b)?;
//! let stop = forwarder.stop_handle(); // stop.stop() from anywhere (a signal handler's flag, another thread)
//! let stats = forwarder.stats();     // readable while it runs
//! # stop.stop();
//! forwarder.run()?;
//! println!("{:?}", stats.snapshot().total());
//! # Ok(())
//! # }
//! ```
//!
//! - [`ForwardMode`]: `Plain` (one packet per read and write), `Offload` (split every super-packet into
//!   MTU-sized packets and coalesce them again, the work of a per-packet application such as a VPN),
//!   `Passthrough` (super-packets forwarded whole with their virtio header, the VMM/bridge path).
//! - [`IoKind`]: how workers wait. `Block` (a read sleeps in the kernel; the rest of a batch is read with
//!   `RWF_NOWAIT`; workers are woken by a signal to stop), `Poll` (non-blocking fds and `poll`), `Uring`
//!   (io_uring: one multishot read per direction into the slots of a [`crate::ring`] arena; plain and
//!   passthrough write each frame from the slot it was read into, offload splits, coalesces and submits the
//!   gathered writes of a round together; falls back to `Block` with a note where io_uring is missing),
//!   `Tokio` (tasks on a tokio runtime over `tokio::AsyncQueue`, feature `tokio`).
//! - One worker per queue and direction (`threads(n)` puts `n` on each queue; they may reorder a flow); with
//!   several queues a flow-hash steering eBPF program keeps each flow on one queue.
//! - Counting: one [`Counters`] per direction, readable at any time through [`StatsHandle`]. Every packet read
//!   is written or counted as a drop with a [`DropReason`](crate::stats::DropReason).
//! - A packet the destination cannot take yet waits for room by default ([`WhenFull`]); the decision for every
//!   failed write is made in one place for all I/O kinds.

use std::sync::Arc;
use std::time::Duration;

use crate::dataplane::stats::{Counters, SharedCounters, WhenFull};
use crate::devices::device::{Device, DeviceBuilder};
use crate::devices::mode::Mode;
use crate::devices::offloads::Offloads;
use crate::devices::queue::Queue;
use crate::error::{ConfigError, Error, Result};
use crate::stop::StopHandle;

mod jobs;
mod run;
#[cfg(feature = "tokio")]
mod tasks;
mod workers;

/// What the engine does with a packet between reading and writing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardMode {
    /// One packet per read and write, no virtio header.
    Plain,
    /// Virtio header and offloads; every super-packet is split into MTU-sized packets and coalesced again.
    Offload,
    /// Super-packets forwarded with their virtio header untouched.
    Passthrough,
}

impl ForwardMode {
    /// The name used in counters output and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ForwardMode::Plain => "plain",
            ForwardMode::Offload => "offload",
            ForwardMode::Passthrough => "passthrough",
        }
    }

    /// Whether the devices need a virtio header for this mode.
    pub fn uses_vnet_hdr(self) -> bool {
        self != ForwardMode::Plain
    }
}

/// Which way a packet moves through a forwarder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the first device (or set of queues) to the second.
    AToB,
    /// From the second to the first.
    BToA,
}

/// The per-packet hook of a forwarder ([`ForwarderBuilder::per_packet`]), shared by its workers.
pub type PerPacket = Arc<dyn Fn(Direction, &mut [u8]) + Send + Sync>;

/// How the workers wait for packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoKind {
    /// Blocking fds: one system call per read; the rest of a batch with `RWF_NOWAIT`; woken by a signal to stop.
    Block,
    /// Non-blocking fds and `poll` when a queue runs dry.
    Poll,
    /// io_uring (Linux 6.7 multishot reads), one ring per queue and direction: frames written from the slot
    /// they were read into (plain, passthrough), or split, coalesced and written as gathered writes from slots
    /// of the same arena (offload). Where io_uring is missing the engine falls back to `Block` with a note.
    Uring,
    /// tokio tasks over `tokio::AsyncQueue` (feature `tokio`).
    Tokio,
}

impl IoKind {
    /// The name used in counters output and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            IoKind::Block => "block",
            IoKind::Poll => "poll",
            IoKind::Uring => "uring",
            IoKind::Tokio => "tokio",
        }
    }

    fn nonblocking(self) -> bool {
        matches!(self, IoKind::Poll | IoKind::Tokio)
    }
}

/// Configuration of a [`Forwarder`]; also hands out [`DeviceBuilder`]s set up for it.
#[derive(Clone)]
pub struct ForwarderBuilder {
    mode: ForwardMode,
    io: Option<IoKind>,
    threads: usize,
    batch: usize,
    depth: usize,
    when_full: WhenFull,
    udp_tunnel: bool,
    partial_checksums: bool,
    register_buffers: bool,
    gro_hold: Option<std::time::Duration>,
    stop: Option<StopHandle>,
    per_packet: Option<PerPacket>,
}

impl std::fmt::Debug for ForwarderBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwarderBuilder")
            .field("mode", &self.mode)
            .field("io", &self.io)
            .field("threads", &self.threads)
            .field("batch", &self.batch)
            .field("depth", &self.depth)
            .field("per_packet", &self.per_packet.is_some())
            .finish_non_exhaustive()
    }
}

/// Virtio header size the engine uses for offload and passthrough.
const VNET_HDR: usize = turbotun_wire::VIRTIO_NET_HDR_LEN;
/// Most packets one batch handles.
pub const MAX_BATCH: usize = crate::dataplane::batch::BATCH_SIZE;
/// Most io_uring buffers per direction.
pub const MAX_DEPTH: usize = 1024;
/// The longest [`ForwarderBuilder::gro_hold`]: ten times the 1 ms `gro_flush_timeout` the kernel's GRO selftest
/// sets; a longer hold would only be added latency.
pub const MAX_GRO_HOLD: std::time::Duration = std::time::Duration::from_millis(10);

impl ForwarderBuilder {
    /// Frames in flight per direction with io_uring by default: in `turbotun bench` (plain, TCP) 64 used the
    /// least forwarder CPU per Gbps; 1 and 4 were slower than blocking reads, 256 lost to retransmits.
    pub const DEFAULT_DEPTH: usize = 64;
    /// The default in passthrough mode, where every buffer the kernel fills holds a super-packet of up to 64 KiB:
    /// the multishot read takes the buffers in ring order, so all of them become resident. 16 kept TCP and
    /// 64-byte UDP at least as fast as 64 in `turbotun bench` and the forwarder's peak RSS at 7.0 MB instead of
    /// 10.3 (docs/bench/HISTORY.md, appendix B).
    pub const DEFAULT_PASSTHROUGH_DEPTH: usize = 16;

    /// A forwarder in `mode` with the defaults: the fastest I/O the mode and kernel allow, one worker per queue
    /// and direction, batches of [`MAX_BATCH`], wait for room when a queue is full.
    pub fn new(mode: ForwardMode) -> Self {
        ForwarderBuilder {
            mode,
            io: None,
            threads: 1,
            batch: MAX_BATCH,
            depth: match mode {
                ForwardMode::Passthrough => Self::DEFAULT_PASSTHROUGH_DEPTH,
                _ => Self::DEFAULT_DEPTH,
            },
            when_full: WhenFull::Wait,
            udp_tunnel: false,
            partial_checksums: false,
            register_buffers: false,
            gro_hold: None,
            stop: None,
            per_packet: None,
        }
    }

    /// Calls `hook` for every packet between reading and writing, on whichever worker moves it, in place: the
    /// hook may rewrite the packet's bytes but not its length, and must leave its checksums right (with
    /// [`Self::partial_checksums`] a TCP or UDP checksum may be partial, as `turbotun_wire::partial` describes).
    /// Offload mode hands it every MTU-sized packet after the split and before coalescing; plain mode every
    /// packet as read. Every I/O kind calls it (blocking, poll, io_uring, tokio). Passthrough forwards
    /// super-packets whole and takes no hook.
    pub fn per_packet(mut self, hook: impl Fn(Direction, &mut [u8]) + Send + Sync + 'static) -> Self {
        self.per_packet = Some(Arc::new(hook));
        self
    }

    /// How workers wait (default: io_uring for plain and passthrough with one worker per queue where the kernel
    /// has it, blocking reads otherwise).
    pub fn io(mut self, io: IoKind) -> Self {
        self.io = Some(io);
        self
    }

    /// Workers per queue and direction (they share the queue and may reorder packets of a flow).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Packets per batch in offload mode (1 to [`MAX_BATCH`]).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// io_uring buffers per direction, a power of two up to [`MAX_DEPTH`], for plain and passthrough: frames
    /// read and not yet written at most (each buffer holds a 64 KiB frame; only touched pages become resident).
    /// Default: [`Self::DEFAULT_DEPTH`], in passthrough [`Self::DEFAULT_PASSTHROUGH_DEPTH`].
    /// Offload through io_uring keeps one scattered read in flight and a batch's worth of slots instead.
    pub fn depth(mut self, depth: usize) -> Self {
        self.depth = depth;
        self
    }

    /// What to do when the destination queue is full (default: wait).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// Passthrough only: devices from [`Self::device`] also ask for UDP-tunnel offloads (Linux 6.17+) with the
    /// 24-byte virtio header, so VXLAN/Geneve super-packets are forwarded whole like any other; both sides must
    /// then have that header. On an older kernel the devices get the plain offloads (see [`Device::offloads`]).
    pub fn udp_tunnel(mut self, on: bool) -> Self {
        self.udp_tunnel = on;
        self
    }

    /// Offload mode: leave the checksums of split segments partial and let the kernel
    /// complete what is written (`NEEDS_CSUM`), as its own forwarding path does, instead of summing every
    /// payload byte on the way through (see [`crate::batch::RecvBatch::partial_checksums`]). Off by default: the
    /// segments in the middle then carry complete checksums, as a VPN that encrypts them needs, and the work is
    /// the same as the peers'.
    pub fn partial_checksums(mut self, on: bool) -> Self {
        self.partial_checksums = on;
        self
    }

    /// Offload mode through io_uring: register the slot arena with the ring and read and write with
    /// `READV_FIXED`/`WRITEV_FIXED` (Linux 6.15), which saves the kernel mapping and checking user memory on
    /// every operation, at the price of pinning the whole arena (about 8.5 MiB per direction, all resident;
    /// an unprivileged user needs RLIMIT_MEMLOCK for it). Where the kernel lacks those operations, the
    /// forwarder runs without and says so in [`Forwarder::notes`]. docs/bench/HISTORY.md, appendix B, has the trade.
    pub fn register_buffers(mut self, on: bool) -> Self {
        self.register_buffers = on;
        self
    }

    /// Offload mode, blocking or poll I/O: a batch that finds the queue dry waits up to `hold` for more packets
    /// before it is coalesced and written, as the kernel's NAPI does with a device's `gro_flush_timeout` (see
    /// [`crate::batch::RecvBatch::gro_hold`]). Off by default, as in the kernel: a burst written one packet at a
    /// time after an idle pause may then have its first packet leave alone. At most [`MAX_GRO_HOLD`].
    pub fn gro_hold(mut self, hold: std::time::Duration) -> Self {
        self.gro_hold = Some(hold);
        self
    }

    /// The virtio header size this configuration forwards with (0 for plain).
    fn vnet_hdr_len(&self) -> usize {
        match (self.mode.uses_vnet_hdr(), self.udp_tunnel) {
            (false, _) => 0,
            (true, false) => VNET_HDR,
            (true, true) => crate::devices::device::UDP_TUNNEL_VNET_HDR_LEN,
        }
    }

    /// The mode.
    pub fn mode(&self) -> ForwardMode {
        self.mode
    }

    /// A device builder with what this mode needs: a virtio header and every offload for offload and
    /// passthrough, none for plain. Add the name, queues and the rest, then `open()`.
    pub fn device(&self, mode: Mode) -> DeviceBuilder {
        let builder = DeviceBuilder::new(mode);
        match (self.mode.uses_vnet_hdr(), self.udp_tunnel) {
            (true, false) => builder.vnet_hdr(VNET_HDR).offloads(Offloads::ALL),
            (true, true) => builder.vnet_hdr(self.vnet_hdr_len()).offloads(Offloads::ALL | Offloads::UDP_TUNNEL),
            (false, _) => builder,
        }
    }

    /// Checks the options against each other and against this kernel for `queues` queues per device, before
    /// any device is opened; returns the I/O kind the workers will use.
    pub fn validate(&self, queues: usize) -> Result<IoKind> {
        self.resolve(queues, &mut Vec::new())
    }

    /// Checks the options against each other and picks the I/O kind; a default that the kernel cannot run
    /// falls back with a note.
    fn resolve(&self, queues: usize, notes: &mut Vec<String>) -> Result<IoKind> {
        let bad = |why: &str| Err(Error::Config(ConfigError::Conflict { why: why.to_string() }));
        if self.threads == 0 || queues == 0 {
            return bad("threads and queues must be at least 1");
        }
        if self.threads > 1 && queues > 1 {
            return bad("several threads per queue and several queues don't fit together: use one worker per queue (queues N) or N workers on one queue (threads N)");
        }
        if self.udp_tunnel && self.mode != ForwardMode::Passthrough {
            return bad("udp_tunnel goes with passthrough mode: only passthrough forwards tunnel super-packets whole");
        }
        if self.per_packet.is_some() && self.mode == ForwardMode::Passthrough {
            return bad("a per-packet hook goes with offload or plain mode: passthrough forwards super-packets whole");
        }
        if self.partial_checksums && self.mode != ForwardMode::Offload {
            return bad("partial checksums go with offload mode: only offload mode splits super-packets");
        }
        if self.register_buffers && (self.mode != ForwardMode::Offload || self.io != Some(IoKind::Uring)) {
            return bad(
                "registered buffers go with offload mode through io_uring: only that path reads into registered slots",
            );
        }
        if let Some(hold) = self.gro_hold {
            if self.mode != ForwardMode::Offload || matches!(self.io, Some(IoKind::Tokio | IoKind::Uring)) {
                return bad("a GRO hold goes with offload mode and blocking or poll I/O: only those reads wait for a burst's rest");
            }
            if hold.is_zero() || hold > MAX_GRO_HOLD {
                return Err(Error::OutOfRange {
                    what: "gro_hold (microseconds)",
                    value: hold.as_micros() as u64,
                    allowed: format!("1 to {}", MAX_GRO_HOLD.as_micros()),
                });
            }
        }
        if self.batch == 0 || self.batch > MAX_BATCH {
            return Err(Error::OutOfRange {
                what: "batch",
                value: self.batch as u64,
                allowed: format!("1 to {MAX_BATCH}"),
            });
        }
        if !self.depth.is_power_of_two() || self.depth > MAX_DEPTH {
            return Err(Error::OutOfRange {
                what: "depth",
                value: self.depth as u64,
                allowed: format!("a power of two from 1 to {MAX_DEPTH}"),
            });
        }
        match self.io {
            Some(IoKind::Uring) if self.threads > 1 => {
                bad("io_uring runs one ring per queue and direction: use several queues rather than several threads")
            }
            Some(IoKind::Tokio) if self.threads > 1 => {
                bad("tokio runs one task per queue and direction: use several queues rather than several threads")
            }
            // Asked for and missing (no kernel support, denied by a container's seccomp policy, turned off
            // with TURBOTUN_NO_URING, or compiled out): the blocking path, with a note saying why.
            Some(IoKind::Uring) => match uring_supported() {
                Ok(()) => Ok(IoKind::Uring),
                Err(e) => {
                    notes.push(format!("{e}; using blocking reads"));
                    Ok(IoKind::Block)
                }
            },
            Some(IoKind::Tokio) if !cfg!(feature = "tokio") => bad("tokio I/O needs turbotun's `tokio` feature"),
            Some(io) => Ok(io),
            None if (self.mode == ForwardMode::Offload && !URING_OFFLOAD_BY_DEFAULT) || self.threads > 1 => {
                Ok(IoKind::Block)
            }
            None => match uring_supported() {
                Ok(()) => Ok(IoKind::Uring),
                Err(e) => {
                    notes.push(format!("{e}; using blocking reads"));
                    Ok(IoKind::Block)
                }
            },
        }
    }

    /// Checks that `queues` (one device's, e.g. just received in a hand-over) carry what this forwarder's mode
    /// needs, the same rule [`Self::build_queues`] applies, so that a receiver can refuse a device as it comes.
    pub fn check_queues(&self, queues: &[Queue]) -> Result<()> {
        queues.iter().try_for_each(|q| check_framing(self.mode, self.udp_tunnel, q))
    }

    /// Offload through io_uring lays slots out for the 10-byte virtio header: queues with another size take the
    /// blocking path, with a note.
    fn uring_offload_fits<'q>(
        &self,
        io: IoKind,
        mut queues: impl Iterator<Item = &'q Queue>,
        notes: &mut Vec<String>,
    ) -> IoKind {
        if io != IoKind::Uring || self.mode != ForwardMode::Offload {
            return io;
        }
        match queues.find(|q| q.vnet_hdr_len() != VNET_HDR) {
            None => io,
            Some(q) => {
                notes.push(format!(
                    "{} has a {}-byte virtio header: offload through io_uring uses {VNET_HDR}-byte ones; using \
                     blocking reads",
                    q.name(),
                    q.vnet_hdr_len()
                ));
                IoKind::Block
            }
        }
    }

    /// The handle that stops the forwarder (default: a new one; [`Forwarder::stop_handle`] returns it). Give
    /// one that already listens for signals ([`StopHandle::stop_on_signals`]) to stop on a signal that came
    /// before the forwarder was built.
    pub fn stop_on(mut self, stop: StopHandle) -> Self {
        self.stop = Some(stop);
        self
    }

    /// A forwarder between all queues of `a` and `b` (queue `i` of one to queue `i` of the other). With several
    /// queues, a flow-hash steering program is attached to both devices (a note says so if it cannot be).
    pub fn build(self, a: Device, b: Device) -> Result<Forwarder> {
        let mut notes: Vec<String> = a.notes().iter().chain(b.notes()).cloned().collect();
        if a.queues().len() > 1 {
            for dev in [&a, &b] {
                if let Err(e) = steer_flows(dev) {
                    notes.push(format!(
                        "{}: no steering eBPF ({e}); the kernel's own flow steering is used",
                        dev.name()
                    ));
                }
            }
        }
        let mut forwarder = self.build_queues(a.into_queues(), b.into_queues())?;
        forwarder.notes.splice(0..0, notes);
        Ok(forwarder)
    }

    /// A forwarder between two sets of queues, pairwise (for queues opened elsewhere or a subset of them).
    pub fn build_queues(mut self, a: Vec<Queue>, b: Vec<Queue>) -> Result<Forwarder> {
        if a.len() != b.len() {
            return Err(Error::Config(ConfigError::QueueCount {
                why: format!("{} queues on one side and {} on the other", a.len(), b.len()),
            }));
        }
        if let (Some(qa), Some(qb)) = (a.first(), b.first()) {
            if qa.name() == qb.name() {
                return Err(Error::Config(ConfigError::Devices {
                    why: format!("the two devices must differ (both are {})", qa.name()),
                }));
            }
        }
        let mut notes = Vec::new();
        let io = self.resolve(a.len(), &mut notes)?;
        if self.register_buffers {
            // Without io_uring (a note above says why) there is nothing to register; without READV_FIXED, the
            // io_uring path runs unregistered.
            if io == IoKind::Uring {
                if let Err(e) = registered_vectors_supported() {
                    notes.push(format!("{e}; io_uring runs without registered buffers"));
                    self.register_buffers = false;
                }
            } else {
                self.register_buffers = false;
            }
        }
        for q in a.iter().chain(&b) {
            check_framing(self.mode, self.udp_tunnel, q)?;
        }
        if self.mode == ForwardMode::Passthrough {
            if let Some((qa, qb)) = a.iter().zip(&b).find(|(qa, qb)| qa.vnet_hdr_len() != qb.vnet_hdr_len()) {
                return Err(Error::Config(ConfigError::VnetHdrSizesDiffer {
                    a: qa.name().to_string(),
                    a_len: qa.vnet_hdr_len(),
                    b: qb.name().to_string(),
                    b_len: qb.vnet_hdr_len(),
                    needs: "passthrough forwards headers as they are",
                }));
            }
        }
        let io = self.uring_offload_fits(io, a.iter().chain(&b), &mut notes);
        for q in a.iter().chain(&b) {
            q.set_nonblocking(io.nonblocking())?;
        }
        if io == IoKind::Block {
            // A read asleep in the kernel ends only with a signal: the one place the process-wide wake-up handler
            // is installed. Poll waits end on the stop handle's fd, io_uring waits time out, tokio tasks are
            // dropped.
            crate::dataplane::wake::prepare()?;
        }
        if self.mode == ForwardMode::Offload {
            // The kernel probes (scratch devices, and a private namespace for the GRO write probe: tens of
            // milliseconds) run here, before traffic, so that the send halves start with the kinds the kernel
            // takes. Never on a data path: left to a first send, the probe stalled a worker long enough for the
            // source device's ring to overflow (a few hundred datagrams lost in every short loss trial).
            if let Err(e) = crate::devices::capabilities::Capabilities::get() {
                notes.push(format!("kernel probes not run ({e}); a refused coalesced write turns that kind off"));
            }
        }
        let stop = self.stop.clone().unwrap_or_default();
        Ok(Forwarder {
            config: self,
            io,
            a: a.into_iter().map(Arc::new).collect(),
            b: b.into_iter().map(Arc::new).collect(),
            stop,
            stats: StatsHandle::new(),
            notes,
        })
    }
}

fn registered_vectors_supported() -> Result<()> {
    #[cfg(feature = "uring")]
    return crate::dataplane::uring::registered_vectors_supported();
    #[cfg(not(feature = "uring"))]
    Err(Error::Unsupported { feature: "io_uring (turbotun was built without its `uring` feature)" })
}

fn uring_supported() -> Result<()> {
    #[cfg(feature = "uring")]
    return crate::dataplane::uring::supported();
    #[cfg(not(feature = "uring"))]
    return Err(Error::Unsupported { feature: "io_uring (turbotun was built without its `uring` feature)" });
}

fn steer_flows(dev: &Device) -> Result<()> {
    let program = crate::devices::steering::SteeringProgram::flow_hash()?;
    program.attach(std::os::fd::AsFd::as_fd(&dev.queues()[0]))
}

/// The queues of a forwarder must carry what its mode expects: a virtio header for offload and passthrough
/// (else super-packets cannot be told apart), none for plain (else the header would be forwarded as data), and
/// for UDP-tunnel passthrough the 24-byte header that holds the tunnel offsets. Offload rewrites every header, so
/// each side may have any size turbotun handles; passthrough forwards headers as they are, so both sides must
/// have the same size (checked in [`ForwarderBuilder::build_queues`]).
fn check_framing(mode: ForwardMode, udp_tunnel: bool, q: &Queue) -> Result<()> {
    let tunnel = crate::devices::device::UDP_TUNNEL_VNET_HDR_LEN;
    match (mode, q.vnet_hdr_len()) {
        _ if q.packet_info() => Err(Error::PacketInfo { name: q.name().to_string(), user: "the forwarder" }),
        (ForwardMode::Plain, 0) => Ok(()),
        (ForwardMode::Plain, has) => Err(Error::VnetHdrMismatch {
            name: q.name().to_string(),
            has,
            needs: "plain mode forwards queues without one".into(),
        }),
        (_, 0) => Err(Error::VnetHdrMismatch {
            name: q.name().to_string(),
            has: 0,
            needs: format!("{} mode needs one (open it with vnet_hdr({VNET_HDR}))", mode.as_str()),
        }),
        (ForwardMode::Passthrough, has) if udp_tunnel && has != tunnel => Err(Error::VnetHdrMismatch {
            name: q.name().to_string(),
            has,
            needs: format!("UDP-tunnel passthrough needs the {tunnel}-byte one"),
        }),
        _ => Ok(()),
    }
}

/// A snapshot of a forwarder's counters, one [`Counters`] per direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ForwardStats {
    /// From the first device to the second.
    pub a_to_b: Counters,
    /// From the second device to the first.
    pub b_to_a: Counters,
}

impl ForwardStats {
    /// Both directions added up.
    pub fn total(&self) -> Counters {
        let mut total = self.a_to_b;
        total.add(&self.b_to_a);
        total
    }
}

/// The live counters of a forwarder: clone it before [`Forwarder::run`] and read it during or after the run.
#[derive(Debug, Clone)]
pub struct StatsHandle {
    directions: Arc<[SharedCounters; 2]>,
}

impl StatsHandle {
    fn new() -> Self {
        StatsHandle { directions: Arc::new([SharedCounters::default(), SharedCounters::default()]) }
    }

    /// The counters as they are now (workers add theirs every 64 packets and whenever they go idle).
    pub fn snapshot(&self) -> ForwardStats {
        ForwardStats { a_to_b: self.directions[0].snapshot(), b_to_a: self.directions[1].snapshot() }
    }

    fn direction(&self, a_to_b: bool) -> &SharedCounters {
        &self.directions[usize::from(!a_to_b)]
    }
}

/// A forwarder ready to run (see [`ForwarderBuilder`]).
#[derive(Debug)]
pub struct Forwarder {
    config: ForwarderBuilder,
    io: IoKind,
    a: Vec<Arc<Queue>>,
    b: Vec<Arc<Queue>>,
    stop: StopHandle,
    stats: StatsHandle,
    notes: Vec<String>,
}

/// Whether offload mode reads through io_uring by default where the kernel has it: decided by `turbotun bench`
/// (offload through io_uring against the blocking offload path, side by side; see docs/bench/HISTORY.md, appendix B).
const URING_OFFLOAD_BY_DEFAULT: bool = false;

/// How often a worker that waits for packets looks at the stop handle (poll and io_uring waits).
const IDLE_WAIT: Duration = Duration::from_millis(100);

impl Forwarder {
    /// Fires to end [`Self::run`]: workers finish what they hold and return.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The forwarder's counters, readable while it runs.
    pub fn stats(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// The mode.
    pub fn mode(&self) -> ForwardMode {
        self.config.mode
    }

    /// The I/O kind the workers use (the default resolved against this kernel).
    pub fn io(&self) -> IoKind {
        self.io
    }

    /// What the devices and the I/O choice had to say (a fallback taken, a multiqueue flag flipped, no
    /// steering program).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The queues of each side, in pairs.
    pub fn queues(&self) -> impl Iterator<Item = (&Queue, &Queue)> {
        self.a.iter().zip(&self.b).map(|(a, b)| (&**a, &**b))
    }

    /// Forwards until the stop handle fires (`Ok` with the final counters) or a worker fails (the error, after
    /// every other worker was stopped; the counters stay readable through [`Self::stats`]).
    pub fn run(self) -> Result<ForwardStats> {
        #[cfg(feature = "tokio")]
        if self.io == IoKind::Tokio {
            return tasks::run(self);
        }
        run::run(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passthrough fills every io_uring buffer with a super-packet, so it defaults to fewer of them; an explicit
    /// depth wins in every mode.
    #[test]
    fn test_default_depth_by_mode() {
        assert_eq!(ForwarderBuilder::new(ForwardMode::Passthrough).depth, ForwarderBuilder::DEFAULT_PASSTHROUGH_DEPTH);
        assert_eq!(ForwarderBuilder::new(ForwardMode::Plain).depth, ForwarderBuilder::DEFAULT_DEPTH);
        assert_eq!(ForwarderBuilder::new(ForwardMode::Passthrough).depth(128).depth, 128);
    }
}
