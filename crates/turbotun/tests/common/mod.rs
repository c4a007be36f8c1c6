//! Shared helpers for tests on real devices: a private network namespace per test, unique names, and small
//! packet builders that do not depend on the code under test.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

mod skip;
pub use skip::cannot_run;

/// Runs `f` inside a fresh private network namespace (destroyed with everything in it when `f` returns or panics).
/// Without the privileges for that, the suite's skip rule ([`cannot_run`]). Returns None when skipped.
pub fn in_netns<F, R>(test: &str, f: F) -> Option<R>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    match turbotun::netns::with_private_netns(f) {
        Ok(r) => Some(r),
        Err(e) => {
            cannot_run(test, &format!("needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN): {e}"));
            None
        }
    }
}

/// Joins `handle` once its thread has ended, failing the test if that takes longer than `bound`: a generous bound
/// for a thread that must end on an event (a stop, a device gone), so that a thread that never ends fails the
/// test instead of hanging it. Not a speed check: the bound is far above any time the event takes.
pub fn join_within<T>(handle: std::thread::JoinHandle<T>, bound: Duration, what: &str) -> T {
    let deadline = Instant::now() + bound;
    while !handle.is_finished() {
        assert!(Instant::now() < deadline, "{what}: still running {bound:?} after it should have ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Waits until thread `tid` of this process sleeps (state `S` in its `/proc/self/task/TID/stat`), e.g. in the
/// wait the test wants to see it in, within a generous `bound`.
pub fn wait_until_asleep(tid: i32, bound: Duration) {
    let deadline = Instant::now() + bound;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses and may hold anything.
        if stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('S')) {
            return;
        }
        assert!(Instant::now() < deadline, "thread {tid} never went to sleep within {bound:?}: {stat}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A unique interface name (≤ 15 bytes) for this process and call.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("{prefix}{}x{n}", std::process::id() % 100_000);
    assert!(name.len() <= 15, "{name} too long");
    name
}

/// RFC 1071 checksum, written independently of turbotun-wire so tests check it rather than reuse it.
pub fn inet_checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    let mut carry_byte: Option<u8> = None;
    for chunk in chunks {
        for &b in *chunk {
            match carry_byte.take() {
                Some(hi) => sum += u64::from(u16::from_be_bytes([hi, b])),
                None => carry_byte = Some(b),
            }
        }
    }
    if let Some(hi) = carry_byte {
        sum += u64::from(u16::from_be_bytes([hi, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4/UDP packet with correct header and UDP checksums.
pub fn ipv4_udp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let total = 20 + udp_len;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40; // DF
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let hc = inet_checksum(&[&p[..20]]);
    p[10..12].copy_from_slice(&hc.to_be_bytes());
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&dport.to_be_bytes());
    p[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    let c = udp4_checksum(&p);
    let c = if c == 0 { 0xffff } else { c };
    p[26..28].copy_from_slice(&c.to_be_bytes());
    p
}

/// The one's-complement sum over the UDP pseudo-header and datagram of an IPv4/UDP packet without options:
/// 0 when the packet's UDP checksum field is right (or, with the field zeroed, the checksum to put there).
pub fn udp4_checksum(p: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&p[12..20]);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&((p.len() - 20) as u16).to_be_bytes());
    inet_checksum(&[&pseudo, &p[20..]])
}

/// Fields of an IPv4/UDP packet, if `p` is one (no options).
pub fn parse_ipv4_udp(p: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, u16, u16, &[u8])> {
    if p.len() < 28 || p[0] != 0x45 || p[9] != 17 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if total > p.len() || total < 28 {
        return None;
    }
    let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
    let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    Some((src, dst, u16::from_be_bytes([p[20], p[21]]), u16::from_be_bytes([p[22], p[23]]), &p[28..total]))
}

/// Reads from `queue` until `want` accepts a packet, skipping unrelated traffic (IPv6 router solicitations and
/// the like). Panics after `timeout`.
pub fn recv_matching(
    queue: &turbotun::Queue,
    buf: &mut [u8],
    timeout: Duration,
    mut want: impl FnMut(&[u8]) -> bool,
) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no matching packet on {} within {timeout:?}", queue.name());
        if !queue.wait_readable(Some(left)).expect("poll") {
            continue;
        }
        let n = queue.recv_raw(buf).expect("read");
        if want(&buf[..n]) {
            return n;
        }
    }
}

/// Brings a device up with an IPv4 address in the calling thread's namespace.
pub fn configure_v4(name: &str, addr: Ipv4Addr, prefix: u8) {
    let mut nl = turbotun::netlink::Netlink::new().expect("netlink");
    nl.add_address(name, addr.into(), prefix).expect("add address");
    nl.set_up(name, true).expect("up");
}

/// A private network namespace kept alive by its fd (it vanishes with its devices when the fd closes).
pub fn new_netns() -> std::os::fd::OwnedFd {
    turbotun::netns::with_private_netns(|| std::fs::File::open("/proc/thread-self/ns/net").expect("own netns").into())
        .expect("private netns")
}

/// The path through which `with_netns` and netlink reach a namespace held by `fd`.
pub fn ns_path(fd: &std::os::fd::OwnedFd) -> std::path::PathBuf {
    use std::os::fd::AsRawFd;
    std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Two namespaces A (10.0.1.1, fd00:1::1) and B (10.0.2.1, fd00:2::1), each with one end of a path through
/// devices `dev_a` and `dev_b` that live in `ns_fwd` now: the devices are moved into A and B and configured,
/// with routes to the other side through them.
pub struct Sides {
    pub a: std::os::fd::OwnedFd,
    pub b: std::os::fd::OwnedFd,
}

pub const A4: &str = "10.0.1.1";
pub const B4: &str = "10.0.2.1";
pub const A6: &str = "fd00:1::1";
pub const B6: &str = "fd00:2::1";

impl Sides {
    pub fn connect(ns_fwd: &std::os::fd::OwnedFd, dev_a: &str, dev_b: &str) -> Sides {
        Self::connect_with_mtu(ns_fwd, dev_a, dev_b, None)
    }

    /// [`Self::connect`] with both devices at `mtu` (the kernel's default when `None`).
    pub fn connect_with_mtu(ns_fwd: &std::os::fd::OwnedFd, dev_a: &str, dev_b: &str, mtu: Option<u32>) -> Sides {
        let sides = Sides { a: new_netns(), b: new_netns() };
        let mut nl = turbotun::netlink::Netlink::in_netns(&ns_path(ns_fwd)).unwrap();
        nl.move_to_netns(dev_a, &ns_path(&sides.a)).unwrap();
        nl.move_to_netns(dev_b, &ns_path(&sides.b)).unwrap();
        for (ns, dev, me4, peer4, me6, peer6) in
            [(&sides.a, dev_a, A4, "10.0.2.0", A6, "fd00:2::"), (&sides.b, dev_b, B4, "10.0.1.0", B6, "fd00:1::")]
        {
            let mut nl = turbotun::netlink::Netlink::in_netns(&ns_path(ns)).unwrap();
            // No IPv6 duplicate address detection: the address is usable at once.
            turbotun::netns::with_netns(&ns_path(ns), || {
                std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/accept_dad"), "0")
            })
            .unwrap()
            .unwrap();
            if let Some(mtu) = mtu {
                nl.set_mtu(dev, mtu).unwrap();
            }
            nl.add_address(dev, me4.parse().unwrap(), 24).unwrap();
            nl.add_address(dev, me6.parse().unwrap(), 64).unwrap();
            nl.set_up(dev, true).unwrap();
            nl.add_route(peer4.parse().unwrap(), 24, dev).unwrap();
            nl.add_route(peer6.parse().unwrap(), 64, dev).unwrap();
        }
        sides
    }

    pub fn in_a<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        turbotun::netns::with_netns(&ns_path(&self.a), f).unwrap()
    }

    pub fn in_b<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        turbotun::netns::with_netns(&ns_path(&self.b), f).unwrap()
    }

    /// Segments and datagrams either namespace's stack dropped for a bad checksum so far (TCP `InCsumErrors`,
    /// UDP `InCsumErrors`, `Udp6InCsumErrors`): a retransmission would hide them from the data checks.
    pub fn checksum_errors(&self) -> u64 {
        self.in_a(checksum_errors_here) + self.in_b(checksum_errors_here)
    }

    /// A TCP stream of `len` bytes from A to B arrives intact (retrying the connect while a TAP path resolves
    /// its neighbours).
    pub fn tcp_intact(&self, dst: &str, len: usize) {
        let target = std::net::SocketAddr::new(dst.parse().unwrap(), 5001);
        let data: Vec<u8> = (0..len as u32).map(|i| (i ^ (i >> 11)) as u8).collect();
        tcp_stream_intact(&self.b, target, data, |t| {
            self.in_a(|| std::net::TcpStream::connect_timeout(t, Duration::from_millis(500)))
        });
    }

    /// Datagrams of many sizes from A to B arrive complete and in order (each burst received before the next).
    pub fn udp_intact(&self, src: &str, dst: &str) {
        let rx = self.in_b(|| std::net::UdpSocket::bind((dst, 6001)).unwrap());
        rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let tx = self.in_a(|| std::net::UdpSocket::bind((src, 0)).unwrap());
        tx.connect((dst, 6001)).unwrap();
        let mut buf = vec![0u8; 65536];
        for burst in 0..10u32 {
            let sent: Vec<Vec<u8>> = (0..8u32)
                .map(|k| {
                    let i = burst * 8 + k;
                    let mut d: Vec<u8> = (0..4 + (i as usize * 37) % 1400).map(|j| (j as u32 ^ i) as u8).collect();
                    d[..4].copy_from_slice(&i.to_be_bytes());
                    d
                })
                .collect();
            for d in &sent {
                tx.send(d).unwrap();
            }
            for (k, d) in sent.iter().enumerate() {
                let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("burst {burst} datagram {k} to {dst}: {e}"));
                assert_eq!(&buf[..n], &d[..], "burst {burst} datagram {k} to {dst}");
            }
        }
    }
}

/// `data` sent over TCP to `target`, listened on in namespace `listen_ns`, with connections made by `connect`
/// (retried for up to 10 s while a path resolves its neighbours), arrives intact.
pub fn tcp_stream_intact(
    listen_ns: &std::os::fd::OwnedFd,
    target: std::net::SocketAddr,
    data: Vec<u8>,
    connect: impl Fn(&std::net::SocketAddr) -> std::io::Result<std::net::TcpStream>,
) {
    use std::io::{Read, Write};
    let listener =
        turbotun::netns::with_netns(&ns_path(listen_ns), || std::net::TcpListener::bind(target).unwrap()).unwrap();
    let expected = data.clone();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match connect(&target) {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "connect to {target}: {e}"),
        }
    };
    stream.write_all(&data).unwrap();
    drop(stream);
    assert!(receiver.join().unwrap() == expected, "TCP stream to {target} arrived altered");
}

/// TCP and UDP segments and datagrams the calling thread's namespace dropped for a bad checksum so far (TCP and
/// UDP `InCsumErrors`, `Udp6InCsumErrors`).
fn checksum_errors_here() -> u64 {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap();
    let lines: Vec<&str> = snmp.lines().collect();
    let mut total = 0;
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        if !(names.starts_with("Tcp:") || names.starts_with("Udp:")) {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if n == "InCsumErrors" {
                total += v.parse::<u64>().unwrap();
            }
        }
    }
    let snmp6 = std::fs::read_to_string("/proc/thread-self/net/snmp6").unwrap();
    for line in snmp6.lines() {
        if let Some(v) = line.strip_prefix("Udp6InCsumErrors") {
            total += v.trim().parse::<u64>().unwrap();
        }
    }
    total
}

/// How many fds of this process are queues of device `name` (the `iff:` line of `/proc/self/fdinfo`): other
/// tests run in parallel, so fds are counted per device rather than in total.
pub fn fds_of(name: &str) -> usize {
    let want = format!("iff:\t{name}\n");
    std::fs::read_dir("/proc/self/fdinfo")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter(|info| info.contains(&want))
        .count()
}
