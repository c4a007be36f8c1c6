//! `turbotun fwd`: a forwarder between two TUN/TAP devices, the work a VPN or a VMM's datapath does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use turbotun::batch::{BatchStats, RecvBatch, SendBatch, BATCH_SIZE};
use turbotun::queue::MAX_PACKET;
use turbotun::tokio::AsyncQueue;
use turbotun::wire::virtio_net::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};
use turbotun::{DeviceBuilder, Error, Mode, Offloads, Queue};

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

/// How a synchronous worker waits for packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IoKind {
    /// Blocking fds: a read sleeps in the kernel until a packet comes (one system call per read); the other
    /// reads of a batch use `RWF_NOWAIT`. Workers are woken by a signal to stop.
    Block,
    /// Non-blocking fds and `poll` when a queue runs dry (a failed read, a poll and the read again).
    Poll,
    /// io_uring (plain and passthrough; Linux 6.7): one multishot read per direction over `--depth` buffers,
    /// frames written from the buffer they were read into, one `io_uring_enter` submitting the writes and
    /// waiting for the next reads.
    Uring,
}

#[derive(Debug, Args)]
pub struct FwdArgs {
    /// First device (created if missing).
    pub dev_a: String,
    /// Second device (created if missing).
    pub dev_b: String,
    #[arg(long, value_enum, default_value_t = FwdMode::Offload)]
    pub mode: FwdMode,
    /// Workers per direction sharing each queue.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Queues per device (IFF_MULTI_QUEUE); one worker per queue and direction.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// TAP (Ethernet) devices instead of TUN.
    #[arg(long)]
    pub tap: bool,
    /// Run the workers as tokio tasks over `turbotun::tokio::AsyncQueue` (offload mode).
    #[arg(long = "async")]
    pub async_io: bool,
    /// How the workers wait for packets (threads only; `--async` uses tokio's readiness). Default: `uring` for
    /// plain and passthrough where the kernel has it (else `block`, with a note), `block` for offload.
    #[arg(long, value_enum)]
    pub io: Option<IoKind>,
    /// Buffers given to the kernel per direction with `--io uring`, a power of two: frames read and not yet
    /// written at most (each buffer holds a 64 KiB frame; only touched pages become resident).
    #[arg(long, default_value_t = turbotun::uring::UringForwarder::DEFAULT_DEPTH)]
    pub depth: usize,
    /// Packets per batch in offload mode (at most 64).
    #[arg(long, default_value_t = BATCH_SIZE)]
    pub batch: usize,
}

/// Counters shared by the workers, updated once per batch.
#[derive(Debug, Default)]
struct Counters {
    packets: AtomicU64,
    bytes: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    super_packets: AtomicU64,
    zero_copy_splits: AtomicU64,
    segments: AtomicU64,
    coalesced: AtomicU64,
    malformed: AtomicU64,
    drops: AtomicU64,
    errors: AtomicU64,
    gro_fallbacks: AtomicU64,
}

#[derive(Debug, Serialize)]
struct CountersJson {
    mode: &'static str,
    io: &'static str,
    packets: u64,
    bytes: u64,
    reads: u64,
    writes: u64,
    super_packets: u64,
    zero_copy_splits: u64,
    segments: u64,
    coalesced: u64,
    malformed: u64,
    drops: u64,
    errors: u64,
    gro_fallbacks: u64,
}

/// Virtio header room in front of every buffer.
const VNET_HDR: usize = VIRTIO_NET_HDR_LEN;
/// How long a worker waits for a packet before it looks at the stop flag again.
const POLL: Duration = Duration::from_millis(100);
/// How often a worker asleep in a blocking read is signalled at shutdown (a signal can land just before it
/// enters the read), and for how long.
const WAKE_EVERY: Duration = Duration::from_millis(5);
const WAKE_LIMIT: Duration = Duration::from_secs(2);

pub fn run(args: &FwdArgs) -> Result<()> {
    if args.threads == 0 || args.queues == 0 {
        bail!("--threads and --queues must be at least 1");
    }
    if args.threads > 1 && args.queues > 1 {
        bail!("--threads and --queues don't fit together: use one worker per queue (--queues N) or N workers on one queue (--threads N)");
    }
    if args.batch == 0 || args.batch > BATCH_SIZE {
        bail!("--batch must be between 1 and {BATCH_SIZE}");
    }
    if args.async_io && (args.mode != FwdMode::Offload || args.threads > 1) {
        bail!("--async goes with --mode offload and one task per direction (--queues N for more)");
    }
    if args.async_io && args.io.is_some() {
        bail!("--io and --async don't fit together: the tokio workers wait through the runtime's readiness");
    }
    if args.io == Some(IoKind::Uring) && args.mode == FwdMode::Offload {
        bail!("--io uring goes with --mode plain or passthrough (offload splits and coalesces with blocking I/O)");
    }
    if !args.depth.is_power_of_two() || args.depth > 1024 {
        bail!("--depth must be a power of two between 1 and 1024");
    }
    if args.io == Some(IoKind::Uring) && args.threads > 1 {
        bail!("--io uring runs one ring per queue and direction: use --queues N rather than --threads N");
    }
    if args.dev_a == args.dev_b {
        bail!("the two devices must differ (both are {})", args.dev_a);
    }
    let io = resolve_io(args)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    if !args.async_io {
        turbotun::wake::prepare()?;
    }
    let a = open(&args.dev_a, args, io)?;
    let b = open(&args.dev_b, args, io)?;
    for note in a.notes().iter().chain(b.notes()) {
        eprintln!("turbotun fwd: {note}");
    }
    let counters = Arc::new(Counters::default());
    let (done_tx, done_rx) = mpsc::channel::<(String, Result<(), Error>)>();
    let mut handles = Vec::new();
    if args.async_io {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_io()
            .build()
            .context("starting the tokio runtime")?;
        let _enter = runtime.enter();
        let wrap = |qs: Vec<Queue>| -> Result<Vec<AsyncQueue>> {
            qs.into_iter().map(|q| AsyncQueue::new(q).map_err(anyhow::Error::from)).collect()
        };
        let (a, b) = (wrap(a.into_queues())?, wrap(b.into_queues())?);
        println!("ready");
        for q in 0..args.queues {
            for (src, dst) in [(&a[q], &b[q]), (&b[q], &a[q])] {
                let (src, dst, counters, done) = (src.clone(), dst.clone(), counters.clone(), done_tx.clone());
                let label = format!("{}->{} q{q} async", src.get_ref().name(), dst.get_ref().name());
                let batch = args.batch;
                runtime.spawn(async move {
                    let result = forward_offload_async(&src, &dst, &counters, batch).await;
                    let _ = done.send((label, result));
                });
            }
        }
        drop(done_tx);
        let result = supervise(&stop, &done_rx, args.mode, io, &counters);
        print_counters(args.mode, io, &counters);
        // The tasks never finish on their own; dropping the runtime would wait for reads, so leak it.
        std::mem::forget(runtime);
        return result;
    }
    let a: Vec<Arc<Queue>> = a.into_queues().into_iter().map(Arc::new).collect();
    let b: Vec<Arc<Queue>> = b.into_queues().into_iter().map(Arc::new).collect();
    println!("ready");
    for q in 0..args.queues {
        for (src, dst) in [(&a[q], &b[q]), (&b[q], &a[q])] {
            for t in 0..args.threads {
                let (src, dst, stop, counters, done) =
                    (src.clone(), dst.clone(), stop.clone(), counters.clone(), done_tx.clone());
                let (mode, batch, depth) = (args.mode, args.batch, args.depth);
                let label = format!("{}->{} q{q} t{t}", src.name(), dst.name());
                handles.push(
                    std::thread::Builder::new()
                        .name(format!("fwd-{q}-{t}"))
                        .spawn(move || {
                            let result = match mode {
                                _ if io == Io::Uring => forward_uring(&src, &dst, &stop, &counters, depth),
                                FwdMode::Plain | FwdMode::Passthrough => forward_raw(&src, &dst, &stop, &counters),
                                FwdMode::Offload => forward_offload(&src, &dst, &stop, &counters, batch),
                            };
                            let _ = done.send((label, result));
                        })
                        .context("spawning a worker")?,
                );
            }
        }
    }
    drop(done_tx);
    supervise(&stop, &done_rx, args.mode, io, &counters)?;
    // Workers see the stop flag within one poll interval (or when a signal interrupts their blocking read) and
    // add what they still hold before they return.
    for h in handles {
        match turbotun::wake::interrupt_until_finished(&h, WAKE_EVERY, WAKE_LIMIT) {
            Ok(true) => {
                let _ = h.join();
            }
            Ok(false) => {
                eprintln!("turbotun fwd: a worker did not stop within {WAKE_LIMIT:?}; its last counts are lost")
            }
            Err(e) => eprintln!("turbotun fwd: {e}"),
        }
    }
    print_counters(args.mode, io, &counters);
    Ok(())
}

/// Waits for a signal or for the first worker to fail (a device deleted, a fatal error). A failure prints the
/// counters and exits with status 1 at once: workers blocked on the other device may never wake to be joined.
/// On a signal the caller prints the counters once the workers have added theirs.
fn supervise(
    stop: &AtomicBool,
    done_rx: &mpsc::Receiver<(String, Result<(), Error>)>,
    mode: FwdMode,
    io: Io,
    counters: &Counters,
) -> Result<()> {
    let mut failure = None;
    while !stop.load(Ordering::Relaxed) {
        match done_rx.recv_timeout(POLL) {
            Ok((label, Err(e))) => {
                failure = Some(format!("{label}: {e}"));
                break;
            }
            Ok((_, Ok(()))) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(why) = failure {
        print_counters(mode, io, counters);
        eprintln!("turbotun fwd: {why}");
        std::process::exit(1);
    }
    Ok(())
}

/// How the workers of this run wait: `--io`, or the default for the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Io {
    Block,
    Poll,
    Uring,
    Async,
}

impl Io {
    fn label(self) -> &'static str {
        match self {
            Io::Block => "block",
            Io::Poll => "poll",
            Io::Uring => "uring",
            Io::Async => "async",
        }
    }
}

/// `--io` as given (io_uring checked against the kernel), or the fastest the mode and kernel allow: io_uring
/// for plain and passthrough with one worker per queue, blocking reads otherwise.
fn resolve_io(args: &FwdArgs) -> Result<Io> {
    if args.async_io {
        return Ok(Io::Async);
    }
    match args.io {
        Some(IoKind::Block) => Ok(Io::Block),
        Some(IoKind::Poll) => Ok(Io::Poll),
        Some(IoKind::Uring) => {
            turbotun::uring::supported()?;
            Ok(Io::Uring)
        }
        None if args.mode == FwdMode::Offload || args.threads > 1 => Ok(Io::Block),
        None => match turbotun::uring::supported() {
            Ok(()) => Ok(Io::Uring),
            Err(e) => {
                eprintln!("turbotun fwd: {e}; using blocking reads");
                Ok(Io::Block)
            }
        },
    }
}

fn open(name: &str, args: &FwdArgs, io: Io) -> Result<turbotun::Device> {
    let mut builder = DeviceBuilder::new(if args.tap { Mode::Tap } else { Mode::Tun })
        .name(name)
        .queues(args.queues)
        .nonblocking(matches!(io, Io::Async | Io::Poll));
    if args.mode != FwdMode::Plain {
        builder = builder.vnet_hdr(VNET_HDR).offloads(Offloads::ALL);
    }
    let device = builder.open().with_context(|| format!("opening {name}"))?;
    if args.queues > 1 {
        // One flow, one queue, one worker: steering by a hash of addresses and ports keeps a TCP stream in order.
        let steered = turbotun::steering::SteeringProgram::flow_hash()
            .and_then(|prog| prog.attach(std::os::fd::AsFd::as_fd(&device.queues()[0])));
        if let Err(e) = steered {
            eprintln!("turbotun fwd: {name}: no steering eBPF ({e}); the kernel's own flow steering is used");
        }
    }
    Ok(device)
}

fn print_counters(mode: FwdMode, io: Io, c: &Counters) {
    let get = |v: &AtomicU64| v.load(Ordering::Relaxed);
    let json = CountersJson {
        mode: match mode {
            FwdMode::Plain => "plain",
            FwdMode::Offload => "offload",
            FwdMode::Passthrough => "passthrough",
        },
        io: io.label(),
        packets: get(&c.packets),
        bytes: get(&c.bytes),
        reads: get(&c.reads),
        writes: get(&c.writes),
        super_packets: get(&c.super_packets),
        zero_copy_splits: get(&c.zero_copy_splits),
        segments: get(&c.segments),
        coalesced: get(&c.coalesced),
        malformed: get(&c.malformed),
        drops: get(&c.drops),
        errors: get(&c.errors),
        gro_fallbacks: get(&c.gro_fallbacks),
    };
    println!("{}", serde_json::to_string(&json).unwrap_or_default());
}

/// Per-worker counts of the plain/passthrough loop, added to the shared [`Counters`] now and then rather than
/// per packet: the shared atomics sit on one cache line that both directions' threads would fight over.
#[derive(Debug, Default)]
struct Tally {
    reads: u64,
    writes: u64,
    packets: u64,
    bytes: u64,
    super_packets: u64,
    drops: u64,
    errors: u64,
}

impl Tally {
    /// Packets between two flushes while busy.
    const FLUSH_EVERY: u64 = 64;

    fn flush(&mut self, c: &Counters) {
        for (shared, local) in [
            (&c.reads, self.reads),
            (&c.writes, self.writes),
            (&c.packets, self.packets),
            (&c.bytes, self.bytes),
            (&c.super_packets, self.super_packets),
            (&c.drops, self.drops),
            (&c.errors, self.errors),
        ] {
            if local > 0 {
                shared.fetch_add(local, Ordering::Relaxed);
            }
        }
        *self = Tally::default();
    }
}

/// Plain and passthrough: one read, one write, the buffer forwarded as it came (virtio header included).
fn forward_raw(src: &Queue, dst: &Queue, stop: &AtomicBool, c: &Counters) -> Result<(), Error> {
    let mut tally = Tally::default();
    let result = forward_raw_loop(src, dst, stop, c, &mut tally);
    tally.flush(c);
    result
}

fn forward_raw_loop(src: &Queue, dst: &Queue, stop: &AtomicBool, c: &Counters, t: &mut Tally) -> Result<(), Error> {
    let mut buf = vec![0u8; src.vnet_hdr_len() + MAX_PACKET];
    let hdr = src.vnet_hdr_len();
    while !stop.load(Ordering::Relaxed) {
        let n = match src.recv_raw(&mut buf) {
            Ok(n) => n,
            Err(e) if turbotun::queue::is_would_block(&e) => {
                t.flush(c);
                src.wait_readable(Some(POLL))?;
                continue;
            }
            Err(e) if turbotun::queue::is_interrupted(&e) => {
                t.flush(c);
                continue;
            }
            Err(e) => return Err(e),
        };
        t.reads += 1;
        if hdr > 0 && n > hdr && VirtioNetHdr::new_unchecked(&buf[..n]).is_gso() {
            t.super_packets += 1;
        }
        match send_raw_waiting(dst, &buf[..n], stop) {
            Ok(()) => {
                t.writes += 1;
                t.packets += 1;
                t.bytes += n.saturating_sub(hdr) as u64;
            }
            Err(Error::DeviceDown { .. }) => {
                dst.count_tx_drop(1);
                t.drops += 1;
            }
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                dst.count_tx_drop(1);
                t.drops += 1;
                t.errors += 1;
            }
            Err(e) => return Err(e),
        }
        if t.reads >= Tally::FLUSH_EVERY {
            t.flush(c);
        }
    }
    Ok(())
}

/// Plain and passthrough through io_uring; counts are added to the shared ones every 64 reads or when idle.
fn forward_uring(src: &Queue, dst: &Queue, stop: &AtomicBool, c: &Counters, depth: usize) -> Result<(), Error> {
    let mut ring = turbotun::uring::UringForwarder::new(src, dst, depth)?;
    let mut flushed = turbotun::uring::UringStats::default();
    let flush = |now: turbotun::uring::UringStats, last: &mut turbotun::uring::UringStats| {
        let mut tally = Tally {
            reads: now.reads - last.reads,
            writes: now.writes - last.writes,
            packets: now.writes - last.writes,
            bytes: now.bytes - last.bytes,
            super_packets: now.super_packets - last.super_packets,
            drops: now.drops - last.drops,
            errors: now.errors - last.errors,
        };
        if tally.drops > 0 {
            dst.count_tx_drop(tally.drops);
        }
        tally.flush(c);
        *last = now;
    };
    let result = loop {
        if stop.load(Ordering::Relaxed) {
            break Ok(());
        }
        match ring.poll(POLL) {
            Ok(busy) => {
                let now = ring.stats();
                if !busy || now.reads - flushed.reads >= Tally::FLUSH_EVERY {
                    flush(now, &mut flushed);
                }
            }
            Err(e) => break Err(e),
        }
    };
    flush(ring.stats(), &mut flushed);
    result
}

/// A write on a full non-blocking queue waits for room instead of dropping (backpressure).
fn send_raw_waiting(dst: &Queue, frame: &[u8], stop: &AtomicBool) -> Result<(), Error> {
    loop {
        match dst.send_raw(frame) {
            Ok(_) => return Ok(()),
            Err(e) if turbotun::queue::is_would_block(&e) && !stop.load(Ordering::Relaxed) => {
                dst.wait_writable(Some(POLL))?;
            }
            // A blocking write (only with a limited TUNSETSNDBUF) woken by the stop signal: try once more unless
            // stopping.
            Err(e) if turbotun::queue::is_interrupted(&e) && !stop.load(Ordering::Relaxed) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Turns the batch layer's cumulative counters into the shared ones every `flush_every` packets (and at the end):
/// the shared atomics sit on one cache line that both directions write, so a batch of one small packet would
/// otherwise pay a dozen contended adds.
#[derive(Debug)]
struct Accounting {
    last_rx: BatchStats,
    last_tx: BatchStats,
    packets: u64,
    bytes: u64,
    flush_every: u64,
}

impl Accounting {
    fn new(flush_every: u64) -> Self {
        Accounting { last_rx: BatchStats::default(), last_tx: BatchStats::default(), packets: 0, bytes: 0, flush_every }
    }

    fn record(&mut self, c: &Counters, packets: usize, bytes: usize, rx: &RecvBatch, tx: &SendBatch) {
        self.packets += packets as u64;
        self.bytes += bytes as u64;
        if self.packets >= self.flush_every {
            self.flush(c, rx, tx);
        }
    }

    fn flush(&mut self, c: &Counters, rx: &RecvBatch, tx: &SendBatch) {
        let (r, t, lr, lt) = (rx.stats(), tx.stats(), self.last_rx, self.last_tx);
        for (shared, local) in [
            (&c.reads, r.reads - lr.reads),
            (&c.packets, self.packets),
            (&c.bytes, self.bytes),
            (&c.super_packets, r.super_packets - lr.super_packets),
            (&c.zero_copy_splits, r.zero_copy_splits - lr.zero_copy_splits),
            (&c.segments, r.segments - lr.segments),
            (&c.malformed, r.malformed - lr.malformed),
            (&c.coalesced, t.coalesced - lt.coalesced),
            (&c.writes, t.writes - lt.writes),
            (&c.drops, t.dropped - lt.dropped),
            (&c.gro_fallbacks, t.gro_fallbacks - lt.gro_fallbacks),
        ] {
            if local > 0 {
                shared.fetch_add(local, Ordering::Relaxed);
            }
        }
        (self.last_rx, self.last_tx, self.packets, self.bytes) = (r, t, 0, 0);
    }
}

/// One allocation per direction, made once: only the pages a packet touches become resident.
fn arena(batch: usize) -> (Vec<u8>, usize) {
    let stride = VNET_HDR + MAX_PACKET;
    (vec![0u8; batch * stride], stride)
}

/// Offload: read and split into MTU-sized packets, coalesce, write.
fn forward_offload(src: &Queue, dst: &Queue, stop: &AtomicBool, c: &Counters, batch: usize) -> Result<(), Error> {
    let (mut arena, stride) = arena(batch);
    let mut bufs: Vec<&mut [u8]> = arena.chunks_mut(stride).collect();
    let mut lens = vec![0usize; batch];
    let (mut rx, mut tx) = (RecvBatch::new(src), SendBatch::new(dst));
    let mut accounting = Accounting::new(Tally::FLUSH_EVERY);
    let result = (|| {
        while !stop.load(Ordering::Relaxed) {
            let got = rx.recv_many(src, &mut bufs, &mut lens, VNET_HDR, Some(POLL))?;
            if got.packets == 0 {
                accounting.flush(c, &rx, &tx);
                continue;
            }
            let bytes: usize = lens[..got.packets].iter().sum();
            tx.send(dst, &mut bufs[..got.packets], &mut lens[..got.packets], VNET_HDR, got.checksums_valid)?;
            accounting.record(c, got.packets, bytes, &rx, &tx);
        }
        Ok(())
    })();
    accounting.flush(c, &rx, &tx);
    result
}

/// The same loop as [`forward_offload`], awaiting readiness through tokio.
async fn forward_offload_async(src: &AsyncQueue, dst: &AsyncQueue, c: &Counters, batch: usize) -> Result<(), Error> {
    let (mut arena, stride) = arena(batch);
    let mut bufs: Vec<&mut [u8]> = arena.chunks_mut(stride).collect();
    let mut lens = vec![0usize; batch];
    let (mut rx, mut tx) = (RecvBatch::new(src.get_ref()), SendBatch::new(dst.get_ref()));
    // The tasks are never joined (see `run`), so they add their counts after every batch.
    let mut accounting = Accounting::new(1);
    loop {
        let got = src.recv_batch(&mut rx, &mut bufs, &mut lens, VNET_HDR).await?;
        if got.packets == 0 {
            continue;
        }
        let bytes: usize = lens[..got.packets].iter().sum();
        dst.send_batch(&mut tx, &mut bufs[..got.packets], &mut lens[..got.packets], VNET_HDR, got.checksums_valid)?;
        accounting.record(c, got.packets, bytes, &rx, &tx);
    }
}
