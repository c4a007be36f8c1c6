//! `turbotun fwd`: the library's forwarding engine between two devices, until SIGINT/SIGTERM.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

use turbotun::forward::{ForwardMode, Forwarder, ForwarderBuilder, IoKind, MAX_BATCH};
use turbotun::handover::{Accepted, QueueListener};
use turbotun::privilege::{drop_to, Identity};
use turbotun::stats_socket::Report;
use turbotun::{Mode, Queue, StopHandle};

use crate::counters::{CountersArgs, Sampler, Sink};
use crate::device_cmd::QueueingArgs;

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FwdMode {
    /// One packet per read and write, no virtio header.
    Plain,
    /// Virtio header and offloads; each super-packet is split into packets and coalesced again before writing,
    /// as a per-packet application (a VPN) must.
    Offload,
    /// Super-packets forwarded with their virtio header untouched (the VMM/bridge path).
    Passthrough,
}

/// `--checksums`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FwdChecksums {
    /// Every split segment gets a complete L4 checksum.
    Complete,
    /// Split segments keep partial checksums; the kernel completes what is written.
    Partial,
}

/// `--io`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FwdIo {
    /// Blocking fds: a read sleeps in the kernel until a packet comes (one system call per read); the other
    /// reads of a batch use `RWF_NOWAIT`. Workers are woken by a signal to stop.
    Block,
    /// Non-blocking fds and `poll` when a queue runs dry.
    Poll,
    /// io_uring (Linux 6.7). Plain and passthrough: one multishot read per direction over `--depth` buffers,
    /// each frame written from the buffer it was read into. Offload: one scattered read in flight (zero-copy
    /// split), a round's coalesced writes submitted with the next read by one system call. Where io_uring is
    /// missing or denied: `block`, with a note.
    Uring,
    /// tokio tasks, one per queue and direction (the same as `--async`).
    Tokio,
}

#[derive(Debug, Args)]
pub struct FwdArgs {
    /// First device (created if missing).
    #[arg(required_unless_present = "from_socket")]
    pub dev_a: Option<String>,
    /// Second device (created if missing).
    #[arg(required_unless_present = "from_socket")]
    pub dev_b: Option<String>,
    /// Become this user (name or uid; USER:GROUP for another group than the user's own) once the devices are
    /// open and configured, before forwarding starts: supplementary groups, gid and uid (real, effective, saved)
    /// set, every capability cleared, no_new_privs.
    #[arg(long, value_name = "USER[:GROUP]")]
    pub user: Option<String>,
    /// Old spelling of --user USER:GROUP.
    #[arg(long, requires = "user", hide = true)]
    pub group: Option<String>,
    /// Open no device: listen on this Unix socket path (which must not exist; put it in a private directory),
    /// take the queues of two devices from two `turbotun open NAME --send-to PATH`, the first received as A,
    /// and forward between them. Needs no privilege.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["dev_a", "dev_b", "tap", "txqueuelen", "backpressure"])]
    pub from_socket: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = FwdMode::Offload)]
    pub mode: FwdMode,
    /// Workers per direction sharing each queue.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Queues per device (IFF_MULTI_QUEUE) with a flow-hash steering eBPF program; one worker per queue and
    /// direction.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = crate::args::queue_count)]
    pub queues: usize,
    /// TAP (Ethernet) devices instead of TUN.
    #[arg(long)]
    pub tap: bool,
    /// With --mode passthrough: also ask for UDP-tunnel offloads (Linux 6.17+, 24-byte virtio header), so
    /// VXLAN/Geneve super-packets are forwarded whole.
    #[arg(long, conflicts_with = "from_socket")]
    pub udp_tunnel: bool,
    /// Run the workers as tokio tasks (the same as `--io tokio`).
    #[arg(long = "async")]
    pub async_io: bool,
    /// How the workers wait for packets. Default: `uring` for plain and passthrough where the kernel has it
    /// (else `block`, with a note), `block` for offload. TURBOTUN_NO_URING=1 turns io_uring off.
    #[arg(long, value_enum)]
    pub io: Option<FwdIo>,
    /// Buffers given to the kernel per direction with `--io uring` in plain and passthrough mode, a power of
    /// two: frames read and not yet written at most (each buffer holds a 64 KiB frame; only touched pages
    /// become resident). Offload through io_uring keeps one scattered read in flight instead. Default: 64 in
    /// plain mode, 16 in passthrough (whose buffers each hold a super-packet).
    #[arg(long)]
    pub depth: Option<usize>,
    /// Packets per batch in offload mode (at most 64).
    #[arg(long, default_value_t = MAX_BATCH)]
    pub batch: usize,
    /// With --mode offload: `complete` gives every split segment a complete L4 checksum (as a VPN that
    /// encrypts segments needs; the peers do the same work); `partial` leaves them partial and has the kernel
    /// complete what is written (NEEDS_CSUM), as its own forwarding does: no payload byte is read.
    #[arg(long, value_enum, default_value_t = FwdChecksums::Complete)]
    pub checksums: FwdChecksums,
    /// With --mode offload --io uring: register the slot arena with io_uring and read and write with
    /// READV_FIXED/WRITEV_FIXED (Linux 6.15; without them, a note and unregistered I/O). Less kernel work per
    /// operation, but the arena (about 8.5 MiB per direction) is pinned and resident.
    #[arg(long)]
    pub register_buffers: bool,
    /// With --mode offload and blocking or poll I/O: a batch that finds the queue dry waits up to this many
    /// microseconds for more packets before it is coalesced and written, as the kernel does with a device's
    /// gro_flush_timeout. A burst written one packet at a time after an idle pause then leaves coalesced, at up
    /// to this much added latency per packet. Default: no hold (the kernel's default too).
    #[arg(long, value_name = "USECS", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub gro_hold: Option<u64>,
    #[command(flatten)]
    pub counters: CountersArgs,
    #[command(flatten)]
    pub queueing: QueueingArgs,
}

pub fn run(args: &FwdArgs) -> Result<()> {
    // SIGINT/SIGTERM stop whatever is under way from here on: waiting for a hand-over, forwarding.
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let builder = forwarder_builder(args)?.stop_on(stop.clone());
    // The user is looked up before any device is opened, so that a typo leaves nothing behind.
    let identity = match &args.user {
        Some(user) => Some(crate::args::user_spec(user, args.group.as_deref()).resolve().context("--user")?),
        None => None,
    };
    let (forwarder, devices) = match &args.from_socket {
        Some(path) => {
            builder.validate(1).map_err(crate::process::usage_of)?;
            let Some((a, b)) = receive_two_devices(&builder, path, &stop)? else {
                eprintln!("turbotun fwd: stopped before both devices came");
                return Ok(());
            };
            let devices = [&a, &b].map(|q| q.first().map(|q| q.name().to_string()).unwrap_or_default());
            (builder.build_queues(a, b)?, devices)
        }
        None => open_and_build(builder, args)?,
    };
    for note in forwarder.notes() {
        eprintln!("turbotun fwd: {note}");
    }
    // Bound while the process may still write to /run/turbotun; answered once the privileges are dropped.
    let socket = args.counters.bind_socket("turbotun fwd", &devices[0]);
    let _keeper = match (&identity, &socket) {
        (Some(_), Some(socket)) => {
            Some(turbotun::socket_keeper::start_socket_keeper(&[(socket.path().to_path_buf(), socket.inode())])?)
        }
        _ => None,
    };
    if let Some(identity) = &identity {
        drop_privileges(identity)?;
    }
    let (stats, mode, io) = (forwarder.stats(), forwarder.mode(), forwarder.io());
    let start = Instant::now();
    let kernel = crate::kernel_drops::KernelDrops::start("turbotun fwd", &devices);
    let source = move || {
        let mut report = Report::of_forwarder(&devices, mode, io, &stats.snapshot(), start.elapsed().as_secs_f64());
        report.kernel_tx_dropped = kernel.as_ref().map(|k| k.since_start()).unwrap_or_default();
        report
    };
    let _server = crate::counters::serve("turbotun fwd", socket, source.clone());
    crate::out!("ready");
    let sampler = match args.counters.stats_interval {
        Some(every) => Some(Sampler::start(every, args.counters.json, Sink::Stdout, source.clone())?),
        None => None,
    };
    let result = forwarder.run();
    if let Some(sampler) = sampler {
        sampler.finish();
    }
    crate::out!("{}", crate::counters::closing(&source(), args.counters.json));
    result.map(drop).map_err(anyhow::Error::from)
}

fn open_and_build(builder: ForwarderBuilder, args: &FwdArgs) -> Result<(Forwarder, [String; 2])> {
    let (Some(dev_a), Some(dev_b)) = (&args.dev_a, &args.dev_b) else {
        return Err(crate::process::usage("give two devices, or --from-socket PATH"));
    };
    if dev_a == dev_b {
        return Err(crate::process::usage(format!("the two devices must differ (both are {dev_a})")));
    }
    // Options are checked before any device is created.
    builder.validate(args.queues).map_err(crate::process::usage_of)?;
    let mode = if args.tap { Mode::Tap } else { Mode::Tun };
    let open = |name: &str| {
        let device = args.queueing.apply(builder.device(mode)).name(name).queues(args.queues);
        device.open().with_context(|| format!("opening {name}"))
    };
    let (a, b) = (open(dev_a)?, open(dev_b)?);
    let devices = [a.name().to_string(), b.name().to_string()];
    // build() attaches the steering program (CAP_BPF), so it runs before any privilege is dropped.
    Ok((builder.build(a, b)?, devices))
}

/// Everything that needs a privilege is done by now (devices, steering program, and in offload mode the GRO
/// write probe, which needs a private namespace and ran when the forwarder was built); the process becomes
/// `identity`.
fn drop_privileges(identity: &Identity) -> Result<()> {
    drop_to(identity).with_context(|| format!("--user {}", identity.name))?;
    eprintln!("turbotun fwd: running as {identity}, no capabilities, no_new_privs");
    Ok(())
}

/// How long a connected `turbotun open` may take to send its message.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// Listens on `path` and takes the queues of two devices, one connection each, in the order they come, each
/// checked against the forwarder's mode before its sender is answered; `None` if `stop` fired first. The socket
/// is removed however this ends.
fn receive_two_devices(
    builder: &ForwarderBuilder,
    path: &Path,
    stop: &StopHandle,
) -> Result<Option<(Vec<Queue>, Vec<Queue>)>> {
    let listener = QueueListener::bind(path)?;
    eprintln!("turbotun fwd: waiting for the queues of two devices on {}", path.display());
    let mut sides = Vec::with_capacity(2);
    while sides.len() < 2 {
        let accepted = listener
            .accept(stop, HANDOVER_TIMEOUT, |_, queues| builder.check_queues(queues))
            .with_context(|| format!("receiving queues on {}", path.display()))?;
        match accepted {
            Accepted::Device { peer, header, queues } => {
                eprintln!(
                    "turbotun fwd: received {} queue(s) of {} from {peer} ({}, {}-byte virtio header, offloads {})",
                    queues.len(),
                    header.name,
                    header.mode,
                    header.vnet_hdr_len,
                    header.offloads
                );
                sides.push(queues);
            }
            // A refused hand-over (another user's, one that does not fit the mode) is told why and forgotten; the
            // rightful sender can still come.
            Accepted::Refused(e) => eprintln!("turbotun fwd: refused a hand-over: {e}"),
            Accepted::Stopped => return Ok(None),
            _ => bail!("an unexpected hand-over outcome"),
        }
    }
    let b = sides.pop().unwrap_or_default();
    let a = sides.pop().unwrap_or_default();
    Ok(Some((a, b)))
}

impl FwdMode {
    /// The library's mode of that name.
    pub fn forward_mode(self) -> ForwardMode {
        match self {
            FwdMode::Plain => ForwardMode::Plain,
            FwdMode::Offload => ForwardMode::Offload,
            FwdMode::Passthrough => ForwardMode::Passthrough,
        }
    }
}

fn forwarder_builder(args: &FwdArgs) -> Result<ForwarderBuilder> {
    let mode = args.mode.forward_mode();
    let io = match (args.io, args.async_io) {
        (Some(FwdIo::Tokio) | None, true) => Some(IoKind::Tokio),
        (Some(_), true) => {
            return Err(crate::process::usage("--io and --async don't fit together: --async is --io tokio"))
        }
        (io, false) => io.map(|io| match io {
            FwdIo::Block => IoKind::Block,
            FwdIo::Poll => IoKind::Poll,
            FwdIo::Uring => IoKind::Uring,
            FwdIo::Tokio => IoKind::Tokio,
        }),
    };
    let mut builder = ForwarderBuilder::new(mode)
        .threads(args.threads)
        .batch(args.batch)
        .udp_tunnel(args.udp_tunnel)
        .partial_checksums(args.checksums == FwdChecksums::Partial)
        .register_buffers(args.register_buffers);
    if let Some(depth) = args.depth {
        builder = builder.depth(depth);
    }
    if let Some(usecs) = args.gro_hold {
        builder = builder.gro_hold(Duration::from_micros(usecs));
    }
    Ok(match io {
        Some(io) => builder.io(io),
        None => builder,
    })
}
