//! `tunrs-fwd DEV_A DEV_B --mode plain|offload|offload2|async-offload [--mtu N]`
//!
//! Benchmark peer for `turbotun bench`: forwards IP packets between two TUN devices with the
//! tun-rs crate, the way tun-rs's own published benchmark forwarders do, so the bench can compare
//! turbotun against it on the same machine and in the same run.
//!
//! Process contract (docs/CONTRACTS.md, "Forwarder processes"): create both TUN devices by name
//! (no addresses, not brought up), print `ready`, forward A<->B until SIGINT/SIGTERM, then print
//! one JSON line of counters and exit 0. A write that fails with EIO (device down, e.g. while the
//! bench moves it into its namespace) is counted as a drop; ENODEV/EBADFD or a read error is fatal
//! (cause on stderr, non-zero exit).
//!
//! Modes:
//! - `plain`: no offload; one thread per direction, one `recv`/`send` per packet.
//! - `offload`: `.offload(true)` (IFF_VNET_HDR + TSO/USO); one thread per direction using
//!   `recv_multiple` (GSO split into `IDEAL_BATCH_SIZE` buffers) and `send_multiple` (GRO
//!   coalescing through a `GROTable`), with `VIRTIO_NET_HDR_LEN` of headroom per buffer.
//! - `offload2`: as `offload`, with two threads per direction sharing each device's one fd
//!   (the "two threads" configuration of the published benchmark).
//! - `async-offload`: tokio (default multi-thread runtime), `AsyncDevice::recv_multiple` /
//!   `send_multiple`, one task per direction.
//!
//! `--mtu N` (default 1500) only sizes the per-segment buffers of the offload modes (each holds
//! `VIRTIO_NET_HDR_LEN + N` bytes before a receive, as in the upstream benchmark); set it when the
//! bench runs the devices with a larger MTU.

use bytes::BytesMut;
use std::io;
use std::process::exit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use tun_rs::{
    AsyncDevice, DeviceBuilder, GROTable, SyncDevice, IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN,
};

/// Largest IP packet (or GSO super-packet) a TUN read can return.
const MAX_PACKET: usize = 65535;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Plain,
    Offload,
    Offload2,
    AsyncOffload,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        match s {
            "plain" => Some(Mode::Plain),
            "offload" => Some(Mode::Offload),
            "offload2" => Some(Mode::Offload2),
            "async-offload" => Some(Mode::AsyncOffload),
            _ => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Offload => "offload",
            Mode::Offload2 => "offload2",
            Mode::AsyncOffload => "async-offload",
        }
    }
}

struct Args {
    dev_a: String,
    dev_b: String,
    mode: Mode,
    threads: Option<usize>,
    mtu: usize,
}

const USAGE: &str =
    "usage: tunrs-fwd DEV_A DEV_B --mode plain|offload|offload2|async-offload [--threads N] [--mtu N]";

fn usage_exit(msg: &str) -> ! {
    eprintln!("tunrs-fwd: {msg}\n{USAGE}");
    exit(2)
}

fn parse_args() -> Args {
    let mut pos = Vec::new();
    let mut mode = None;
    let mut threads = None;
    let mut mtu = 1500usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (key, inline) = match a.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = |k: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .unwrap_or_else(|| usage_exit(&format!("{k} needs a value")))
        };
        match key.as_str() {
            "--mode" => {
                let v = value("--mode");
                mode = Some(
                    Mode::parse(&v).unwrap_or_else(|| usage_exit(&format!("unknown mode {v:?}"))),
                );
            }
            "--threads" => {
                let v = value("--threads");
                threads = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| *n >= 1)
                        .unwrap_or_else(|| usage_exit("bad --threads")),
                );
            }
            "--mtu" => {
                let v = value("--mtu");
                mtu = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (68..=MAX_PACKET).contains(n))
                    .unwrap_or_else(|| usage_exit("bad --mtu"));
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                exit(0)
            }
            s if s.starts_with('-') => usage_exit(&format!("unknown option {s}")),
            _ => pos.push(a),
        }
    }
    if pos.len() != 2 {
        usage_exit("need exactly two device names");
    }
    let mode = mode.unwrap_or_else(|| usage_exit("--mode is required"));
    let dev_b = pos.pop().unwrap();
    let dev_a = pos.pop().unwrap();
    Args {
        dev_a,
        dev_b,
        mode,
        threads,
        mtu,
    }
}

/// Counters of one forwarding worker (one direction, one thread or task); each on its own cache line.
#[repr(align(128))]
#[derive(Default)]
struct Counters {
    packets: AtomicU64,
    bytes: AtomicU64,
    drops: AtomicU64,
    errors: AtomicU64,
    batches: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        // Only this worker writes its counters: a relaxed load+store is enough and cheaper than an RMW.
        c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

fn fatal(what: &str, e: &io::Error) -> ! {
    eprintln!("tunrs-fwd: {what}: {e}");
    exit(1)
}

/// What to do after a failed write (or batch write).
enum WriteFailure {
    /// Transient (EIO: device down): count the packets as dropped and go on.
    Drop,
    /// Other non-fatal error (EINVAL, a GRO processing error, ...): count an error and go on.
    Error,
}

fn classify_write_error(e: &io::Error, dir: &str) -> WriteFailure {
    match e.raw_os_error() {
        Some(libc::EIO) => WriteFailure::Drop,
        Some(libc::ENODEV) | Some(libc::EBADFD) | Some(libc::EBADF) => {
            fatal(&format!("write {dir}"), e)
        }
        _ => WriteFailure::Error,
    }
}

/// A read error is fatal when it comes from the read syscall; tun-rs's own packet-processing errors
/// (malformed virtio header, segment larger than the buffer, ...) carry no OS error code and are counted.
fn read_error_is_fatal(e: &io::Error) -> bool {
    match e.raw_os_error() {
        Some(libc::EINTR) | Some(libc::EAGAIN) => false,
        Some(_) => true,
        None => false,
    }
}

fn build_sync(name: &str, offload: bool) -> io::Result<SyncDevice> {
    DeviceBuilder::new()
        .name(name)
        .offload(offload)
        // Leave the link state alone: the bench brings the device up after moving it.
        .inherit_enable_state()
        .build_sync()
}

fn build_async(name: &str) -> io::Result<AsyncDevice> {
    DeviceBuilder::new()
        .name(name)
        .offload(true)
        .inherit_enable_state()
        .build_async()
}

// ---------- plain: one packet per read/write ----------

fn copy_plain(from: Arc<SyncDevice>, to: Arc<SyncDevice>, c: Arc<Counters>, dir: String) {
    let mut buf = vec![0u8; MAX_PACKET + 1];
    loop {
        let n = match from.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if !read_error_is_fatal(&e) => {
                Counters::add(&c.errors, 1);
                continue;
            }
            Err(e) => fatal(&format!("read {dir}"), &e),
        };
        if n == 0 {
            continue;
        }
        match to.send(&buf[..n]) {
            Ok(_) => {
                Counters::add(&c.packets, 1);
                Counters::add(&c.bytes, n as u64);
            }
            Err(e) => match classify_write_error(&e, &dir) {
                WriteFailure::Drop => Counters::add(&c.drops, 1),
                WriteFailure::Error => {
                    Counters::add(&c.drops, 1);
                    Counters::add(&c.errors, 1);
                }
            },
        }
    }
}

// ---------- offload: recv_multiple (GSO split) + send_multiple (GRO) ----------

struct OffloadBufs {
    original: Vec<u8>,
    bufs: Vec<BytesMut>,
    sizes: Vec<usize>,
    gro: GROTable,
    seg_len: usize,
}

impl OffloadBufs {
    fn new(mtu: usize) -> Self {
        // Each segment buffer can grow up to a full super-packet when send_multiple coalesces into it.
        let bufs = (0..IDEAL_BATCH_SIZE)
            .map(|_| BytesMut::zeroed(VIRTIO_NET_HDR_LEN + MAX_PACKET))
            .collect();
        OffloadBufs {
            original: vec![0u8; VIRTIO_NET_HDR_LEN + MAX_PACKET],
            bufs,
            sizes: vec![0usize; IDEAL_BATCH_SIZE],
            gro: GROTable::default(),
            seg_len: VIRTIO_NET_HDR_LEN + mtu,
        }
    }
    /// Restore every buffer to headroom + one MTU before the next receive (as the upstream forwarder does).
    fn prepare(&mut self) {
        for b in &mut self.bufs {
            b.resize(self.seg_len, 0);
        }
    }
    /// Cut each received segment to headroom + its size, ready for send_multiple. Returns the byte total.
    fn finish(&mut self, num: usize) -> u64 {
        let mut bytes = 0u64;
        for i in 0..num {
            self.bufs[i].truncate(VIRTIO_NET_HDR_LEN + self.sizes[i]);
            bytes += self.sizes[i] as u64;
        }
        bytes
    }
}

fn account_batch(c: &Counters, res: io::Result<usize>, num: usize, bytes: u64, dir: &str) {
    Counters::add(&c.batches, 1);
    match res {
        Ok(_) => {
            Counters::add(&c.packets, num as u64);
            Counters::add(&c.bytes, bytes);
        }
        // send_multiple tries every (coalesced) packet and reports only the last error, so which
        // packets of the batch went out is unknown: count the whole batch as dropped.
        Err(e) => match classify_write_error(&e, dir) {
            WriteFailure::Drop => Counters::add(&c.drops, num as u64),
            WriteFailure::Error => {
                Counters::add(&c.drops, num as u64);
                Counters::add(&c.errors, 1);
            }
        },
    }
}

fn copy_offload(
    from: Arc<SyncDevice>,
    to: Arc<SyncDevice>,
    c: Arc<Counters>,
    dir: String,
    mtu: usize,
) {
    let mut ob = OffloadBufs::new(mtu);
    loop {
        ob.prepare();
        let num = match from.recv_multiple(
            &mut ob.original,
            &mut ob.bufs,
            &mut ob.sizes,
            VIRTIO_NET_HDR_LEN,
        ) {
            Ok(n) => n,
            Err(e) if !read_error_is_fatal(&e) => {
                Counters::add(&c.errors, 1);
                continue;
            }
            Err(e) => fatal(&format!("read {dir}"), &e),
        };
        if num == 0 {
            continue;
        }
        let bytes = ob.finish(num);
        let res = to.send_multiple(&mut ob.gro, &mut ob.bufs[..num], VIRTIO_NET_HDR_LEN);
        account_batch(&c, res, num, bytes, &dir);
    }
}

async fn copy_async_offload(
    from: Arc<AsyncDevice>,
    to: Arc<AsyncDevice>,
    c: Arc<Counters>,
    dir: String,
    mtu: usize,
) {
    let mut ob = OffloadBufs::new(mtu);
    loop {
        ob.prepare();
        let num = match from
            .recv_multiple(
                &mut ob.original,
                &mut ob.bufs,
                &mut ob.sizes,
                VIRTIO_NET_HDR_LEN,
            )
            .await
        {
            Ok(n) => n,
            Err(e) if !read_error_is_fatal(&e) => {
                Counters::add(&c.errors, 1);
                continue;
            }
            Err(e) => fatal(&format!("read {dir}"), &e),
        };
        if num == 0 {
            continue;
        }
        let bytes = ob.finish(num);
        let res = to
            .send_multiple(&mut ob.gro, &mut ob.bufs[..num], VIRTIO_NET_HDR_LEN)
            .await;
        account_batch(&c, res, num, bytes, &dir);
    }
}

// ---------- signals and main ----------

fn termination_sigset() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset only write into the local set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Block SIGINT/SIGTERM in this thread; every thread spawned afterwards inherits the mask, so the
/// signals stay pending until `wait_for_termination` takes them with sigwait.
fn block_termination_signals() {
    let set = termination_sigset();
    // SAFETY: valid set pointer; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        fatal("pthread_sigmask", &io::Error::from_raw_os_error(rc));
    }
}

fn wait_for_termination() -> i32 {
    let set = termination_sigset();
    let mut sig: libc::c_int = 0;
    loop {
        // SAFETY: valid set and output pointers.
        let rc = unsafe { libc::sigwait(&set, &mut sig) };
        if rc == 0 {
            return sig;
        }
        if rc != libc::EINTR {
            fatal("sigwait", &io::Error::from_raw_os_error(rc));
        }
    }
}

fn main() {
    let args = parse_args();
    block_termination_signals();

    let threads_per_dir = match args.mode {
        Mode::Offload2 => args.threads.unwrap_or(2),
        Mode::Plain | Mode::Offload => args.threads.unwrap_or(1),
        Mode::AsyncOffload => 1,
    };
    let mut counters: Vec<Arc<Counters>> = Vec::new();
    let mut new_counters = || {
        let c = Arc::new(Counters::default());
        counters.push(c.clone());
        c
    };
    let ab = format!("{}->{}", args.dev_a, args.dev_b);
    let ba = format!("{}->{}", args.dev_b, args.dev_a);

    // Kept alive (not dropped) until exit: the runtime owns the async devices' reactor registration.
    let mut _runtime = None;
    let (tcp_gso, udp_gso);
    match args.mode {
        Mode::Plain | Mode::Offload | Mode::Offload2 => {
            let offload = args.mode != Mode::Plain;
            let a = Arc::new(
                build_sync(&args.dev_a, offload)
                    .unwrap_or_else(|e| fatal(&format!("create {}", args.dev_a), &e)),
            );
            let b = Arc::new(
                build_sync(&args.dev_b, offload)
                    .unwrap_or_else(|e| fatal(&format!("create {}", args.dev_b), &e)),
            );
            (tcp_gso, udp_gso) = (a.tcp_gso(), a.udp_gso());
            for (from, to, dir) in [(&a, &b, &ab), (&b, &a, &ba)] {
                for t in 0..threads_per_dir {
                    let (from, to, c, dir, mtu) = (
                        from.clone(),
                        to.clone(),
                        new_counters(),
                        dir.clone(),
                        args.mtu,
                    );
                    thread::Builder::new()
                        .name(format!("fwd-{t}-{dir}"))
                        .spawn(move || {
                            if offload {
                                copy_offload(from, to, c, dir, mtu)
                            } else {
                                copy_plain(from, to, c, dir)
                            }
                        })
                        .unwrap_or_else(|e| fatal("spawn", &e));
                }
            }
        }
        Mode::AsyncOffload => {
            // The default runtime of #[tokio::main]: multi-thread, one worker per core.
            let mut rb = tokio::runtime::Builder::new_multi_thread();
            if let Some(n) = args.threads {
                rb.worker_threads(n);
            }
            let rt = rb
                .enable_all()
                .build()
                .unwrap_or_else(|e| fatal("tokio runtime", &e));
            let (a, b) = {
                let _guard = rt.enter();
                let a = build_async(&args.dev_a)
                    .unwrap_or_else(|e| fatal(&format!("create {}", args.dev_a), &e));
                let b = build_async(&args.dev_b)
                    .unwrap_or_else(|e| fatal(&format!("create {}", args.dev_b), &e));
                (Arc::new(a), Arc::new(b))
            };
            (tcp_gso, udp_gso) = (a.tcp_gso(), a.udp_gso());
            rt.spawn(copy_async_offload(
                a.clone(),
                b.clone(),
                new_counters(),
                ab.clone(),
                args.mtu,
            ));
            rt.spawn(copy_async_offload(
                b,
                a,
                new_counters(),
                ba.clone(),
                args.mtu,
            ));
            _runtime = Some(rt);
        }
    }

    eprintln!(
        "tunrs-fwd: tun-rs 2.8 mode={} threads/direction={} tcp_gso={} udp_gso={}",
        args.mode.name(),
        threads_per_dir,
        tcp_gso,
        udp_gso
    );
    println!("ready");

    let sig = wait_for_termination();
    let sum = |f: fn(&Counters) -> &AtomicU64| {
        counters
            .iter()
            .map(|c| f(c).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    println!(
        "{{\"packets\":{},\"bytes\":{},\"drops\":{},\"errors\":{},\"batches\":{},\"mode\":\"{}\",\"impl\":\"tun-rs 2.8\",\"tcp_gso\":{},\"udp_gso\":{},\"signal\":{}}}",
        sum(|c| &c.packets),
        sum(|c| &c.bytes),
        sum(|c| &c.drops),
        sum(|c| &c.errors),
        sum(|c| &c.batches),
        args.mode.name(),
        tcp_gso,
        udp_gso,
        sig
    );
    // Worker threads are blocked in read(2): leave without joining them (the devices go with the process).
    exit(0)
}
