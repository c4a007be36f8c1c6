//! What the tests that run `turbotun fwd` as a process share: a forwarder between two private namespaces and
//! data checks across it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use turbotun::netlink::Netlink;
use turbotun::netns::{with_netns, with_private_netns};

pub mod vhost_user;
pub mod wg;
pub mod wg_messages;

pub const A4: &str = "10.0.1.1";
pub const B4: &str = "10.0.2.1";
pub const A6: &str = "fd00:1::1";
pub const B6: &str = "fd00:2::1";

#[path = "../../../turbotun/tests/common/skip.rs"]
mod skip;
pub use skip::cannot_run;

/// Whether this test may create namespaces; without the privileges, the suite's skip rule ([`cannot_run`]).
pub fn privileged(test: &str) -> bool {
    match with_private_netns(|| ()) {
        Ok(()) => true,
        Err(e) => {
            cannot_run(test, &format!("needs root: {e}"));
            false
        }
    }
}

/// Whether a test whose other end is a program written elsewhere can run: root ([`privileged`]), and each
/// `(tool, package)` on the PATH or in /usr/local/go/bin (where the Go toolchain goes). False when it is to be
/// skipped, after saying why (the suite's rule: under `CI=true` a test that cannot run fails).
pub fn can_run(test: &str, tools: &[(&str, &str)]) -> bool {
    if !privileged(test) {
        return false;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).chain([PathBuf::from("/usr/local/go/bin")]).collect();
    let missing: Vec<String> = tools
        .iter()
        .filter(|(tool, _)| !dirs.iter().any(|dir| dir.join(tool).is_file()))
        .map(|(tool, package)| format!("{tool} (apt-get install {package})"))
        .collect();
    if !missing.is_empty() {
        cannot_run(test, &format!("missing {}; scripts/install-deps.sh installs them", missing.join(", ")));
        return false;
    }
    true
}

pub fn new_netns() -> OwnedFd {
    with_private_netns(|| std::fs::File::open("/proc/thread-self/ns/net").expect("own netns").into())
        .expect("private netns")
}

pub fn ns_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A running forwarder with its namespaces; killed and reaped on drop.
pub struct Topology {
    pub ns_a: OwnedFd,
    pub ns_b: OwnedFd,
    pub ns_fwd: OwnedFd,
    pub dev_a: String,
    pub dev_b: String,
    pub child: Option<Child>,
    pub stdout: Option<BufReader<ChildStdout>>,
    /// The forwarder's stderr, collected by a thread, when started with [`Topology::start_with_env`].
    pub stderr: Option<std::thread::JoinHandle<String>>,
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Topology {
    pub fn start(mode: &str, tap: bool, extra: &[&str]) -> Topology {
        Self::start_inner(mode, tap, extra, &[], false)
    }

    /// [`Self::start`] with environment variables for the forwarder; its stderr is collected for
    /// [`Self::stop_with_stderr`].
    pub fn start_with_env(mode: &str, tap: bool, extra: &[&str], env: &[(&str, &str)]) -> Topology {
        Self::start_inner(mode, tap, extra, env, true)
    }

    fn start_inner(mode: &str, tap: bool, extra: &[&str], env: &[(&str, &str)], capture: bool) -> Topology {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let (dev_a, dev_b) = (format!("ttfa{n}"), format!("ttfb{n}"));
        let (ns_a, ns_b, ns_fwd) = (new_netns(), new_netns(), new_netns());
        let mut args =
            vec!["fwd".to_string(), "--json".into(), dev_a.clone(), dev_b.clone(), "--mode".into(), mode.into()];
        if tap {
            args.push("--tap".into());
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut child = with_netns(&ns_path(&ns_fwd), || {
            Command::new(env!("CARGO_BIN_EXE_turbotun"))
                .args(&args)
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(if capture { Stdio::piped() } else { Stdio::inherit() })
                .spawn()
                .expect("spawn turbotun fwd")
        })
        .unwrap();
        let stderr = child.stderr.take().map(|mut err| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = err.read_to_string(&mut text);
                text
            })
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "forwarder announces readiness");
        let mut topo = Topology {
            ns_a,
            ns_b,
            ns_fwd,
            dev_a: dev_a.clone(),
            dev_b: dev_b.clone(),
            child: Some(child),
            stdout: Some(stdout),
            stderr,
        };

        let mut nl = Netlink::in_netns(&ns_path(&topo.ns_fwd)).unwrap();
        nl.move_to_netns(&dev_a, &ns_path(&topo.ns_a)).unwrap();
        nl.move_to_netns(&dev_b, &ns_path(&topo.ns_b)).unwrap();
        for (ns, dev, me4, peer4, me6, peer6) in
            [(&topo.ns_a, &dev_a, A4, "10.0.2.0", A6, "fd00:2::"), (&topo.ns_b, &dev_b, B4, "10.0.1.0", B6, "fd00:1::")]
        {
            let mut nl = Netlink::in_netns(&ns_path(ns)).unwrap();
            nl.add_address(dev, me4.parse().unwrap(), 24).unwrap();
            nl.add_address(dev, me6.parse().unwrap(), 64).unwrap();
            nl.set_up(dev, true).unwrap();
            nl.add_route(peer4.parse().unwrap(), 24, dev).unwrap();
            nl.add_route(peer6.parse().unwrap(), 64, dev).unwrap();
        }
        topo.wait_reachable();
        topo
    }

    /// TAP needs ARP/ND to settle, and both directions need the devices up: retry a tiny TCP connect.
    pub fn wait_reachable(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = self.in_b(|| TcpListener::bind((B4, 4999)).unwrap());
        loop {
            let ok = self.in_a(|| {
                TcpStream::connect_timeout(&(B4.parse::<IpAddr>().unwrap(), 4999).into(), Duration::from_millis(500))
                    .is_ok()
            });
            if ok {
                let _ = listener.accept();
                return;
            }
            assert!(Instant::now() < deadline, "B never became reachable through the forwarder");
        }
    }

    pub fn in_a<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        with_netns(&ns_path(&self.ns_a), f).unwrap()
    }
    pub fn in_b<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        with_netns(&ns_path(&self.ns_b), f).unwrap()
    }

    /// The forwarder's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// [`Self::stop`], and what the forwarder wrote on stderr (started with [`Self::start_with_env`]).
    pub fn stop_with_stderr(mut self) -> (serde_json::Value, String) {
        let stderr = self.stderr.take();
        let counters = self.stop();
        (counters, stderr.map(|t| t.join().unwrap()).unwrap_or_default())
    }

    /// SIGTERM, then the counters line (the last line of its output); the forwarder must exit 0.
    pub fn stop(mut self) -> serde_json::Value {
        let mut child = self.child.take().unwrap();
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let mut rest = String::new();
        self.stdout.take().unwrap().read_to_string(&mut rest).unwrap();
        let exit = child.wait().unwrap();
        assert!(exit.success(), "forwarder exits 0 after SIGTERM: {exit:?}");
        let last = rest.trim().lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| panic!("counters JSON {last:?}: {e}"))
    }
}

/// A command's standard output and error, as one text.
pub fn output_text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `turbotun ARGS` in namespace `ns`, run to its end.
pub fn turbotun_in(ns: &OwnedFd, args: &[&str]) -> std::process::Output {
    with_netns(&ns_path(ns), || Command::new(env!("CARGO_BIN_EXE_turbotun")).args(args).output()).unwrap().unwrap()
}

/// Waits until `done` (20 s at most: then the test fails, naming `what`).
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "waited 20 s for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deterministic pseudo-random bytes (xorshift), so a failure reproduces.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn tcp_stream_intact(topo: &Topology, dst: &str, len: usize) {
    tcp_between(&topo.ns_a, &topo.ns_b, dst, 5001, len);
}

/// `len` bytes of TCP from namespace `from` to a listener on `to_addr:port` in namespace `to`, compared byte for
/// byte. The bounds are generous (30 s to connect, 30 s without a byte): a path under attack may be slow.
pub fn tcp_between(from: &OwnedFd, to: &OwnedFd, to_addr: &str, port: u16, len: usize) {
    tcp_between_while(from, to, to_addr, port, len, || {});
}

/// [`tcp_between`], with `during` run on the test's thread while the bytes flow.
pub fn tcp_between_while(from: &OwnedFd, to: &OwnedFd, to_addr: &str, port: u16, len: usize, during: impl FnOnce()) {
    if let Err(e) = try_tcp_between_while(from, to, to_addr, port, len, during) {
        panic!("{e}");
    }
}

/// [`tcp_between_while`], saying what went wrong instead of failing the test.
pub fn try_tcp_between_while(
    from: &OwnedFd,
    to: &OwnedFd,
    to_addr: &str,
    port: u16,
    len: usize,
    during: impl FnOnce(),
) -> Result<(), String> {
    let flow = Flow { from, to, to_addr, port, source_port: 0 };
    try_tcp_flow(&flow, len, len as u64, during)
}

/// One TCP connection: from namespace `from`, from `source_port` (0: any), to a listener on `to_addr:port` in
/// namespace `to`.
#[derive(Clone, Copy)]
pub struct Flow<'a> {
    pub from: &'a OwnedFd,
    pub to: &'a OwnedFd,
    pub to_addr: &'a str,
    pub port: u16,
    pub source_port: u16,
}

/// `len` bytes over each of `flows` at once (different bytes on each), each compared byte for byte; fails the
/// test naming every flow that went wrong.
pub fn tcp_flows_intact(flows: &[Flow<'_>], len: usize) {
    let failed: Vec<String> = std::thread::scope(|s| {
        let running: Vec<_> = flows
            .iter()
            .map(|flow| s.spawn(move || try_tcp_flow(flow, len, u64::from(flow.port) << 32 | len as u64, || {})))
            .collect();
        running.into_iter().filter_map(|r| r.join().unwrap().err()).collect()
    });
    assert!(failed.is_empty(), "{} of {} flows failed: {failed:?}", failed.len(), flows.len());
}

/// `len` bytes (the pattern of `seed`) over `flow`, compared byte for byte, with `during` run on this thread
/// while they flow; what went wrong, if anything.
fn try_tcp_flow(flow: &Flow<'_>, len: usize, seed: u64, during: impl FnOnce()) -> Result<(), String> {
    const PATIENCE: Duration = Duration::from_secs(30);
    let Flow { from, to, to_addr, port, source_port } = *flow;
    let listener = with_netns(&ns_path(to), || TcpListener::bind((to_addr, port))).unwrap().unwrap();
    listener.set_nonblocking(true).unwrap();
    let data = pattern(len, seed);
    let expected = data.clone();
    let receiver = std::thread::spawn(move || -> Result<Vec<u8>, String> {
        let start = Instant::now();
        let mut s = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(_) if start.elapsed() < PATIENCE => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(format!("no connection in {PATIENCE:?}: {e}")),
            }
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut got = Vec::with_capacity(len);
        match s.read_to_end(&mut got) {
            Ok(_) => Ok(got),
            Err(e) => Err(format!("{} of {len} bytes arrived, then none for {PATIENCE:?}: {e}", got.len())),
        }
    });
    let target: SocketAddr = (to_addr.parse::<IpAddr>().unwrap(), port).into();
    let connected = with_netns(&ns_path(from), || connect_from(source_port, &target, PATIENCE)).unwrap();
    // A stalled path fails the sender too, instead of leaving it to TCP's retransmissions for many minutes.
    let sender = connected.map(|mut s| {
        s.set_write_timeout(Some(PATIENCE)).unwrap();
        std::thread::spawn(move || s.write_all(&data))
    });
    during();
    let sent = match sender {
        Ok(sender) => sender.join().unwrap().map_err(|e| format!("sending: {e}")),
        Err(e) => Err(format!("connecting: {e}")),
    };
    let got = receiver.join().unwrap();
    let got = match (got, sent) {
        (Err(e), Err(sending)) => return Err(format!("TCP over {to_addr}: {e} ({sending})")),
        (Err(e), Ok(())) => return Err(format!("TCP over {to_addr}: {e}")),
        (Ok(_), Err(e)) => return Err(format!("TCP over {to_addr}: {e}")),
        (Ok(got), Ok(())) => got,
    };
    if got.len() != expected.len() {
        return Err(format!("TCP over {to_addr}: {} of {len} bytes arrived", got.len()));
    }
    if got != expected {
        return Err(format!("TCP over {to_addr}: the byte stream arrived altered"));
    }
    Ok(())
}

/// A TCP connection to `target` from `source_port` (0: one the kernel picks).
fn connect_from(source_port: u16, target: &SocketAddr, patience: Duration) -> std::io::Result<TcpStream> {
    if source_port == 0 {
        return TcpStream::connect_timeout(target, patience);
    }
    let socket = socket2::Socket::new(socket2::Domain::for_address(*target), socket2::Type::STREAM, None)?;
    let any: IpAddr = if target.is_ipv6() { "::".parse().unwrap() } else { "0.0.0.0".parse().unwrap() };
    socket.bind(&SocketAddr::new(any, source_port).into())?;
    socket.connect_timeout(&(*target).into(), patience)?;
    Ok(socket.into())
}

/// Waits for `child` to exit, failing the test if it has not within `bound`: a generous bound for a process that
/// must exit on an event (a signal, a device gone), so that one that never exits fails the test instead of hanging
/// it. Not a speed check: the bound is far above the time the event takes.
pub fn wait_exit(child: &mut Child, bound: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running {bound:?} later");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child process killed and reaped however the test ends.
pub struct Running(pub Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Running {
    /// SIGTERM; what it printed on standard output after `ready`, once it exited 0.
    pub fn stop(mut self) -> String {
        let mut child = self.0.take().unwrap();
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        let status = child.wait().unwrap();
        assert!(status.success(), "exit after SIGTERM: {status:?}");
        out
    }
}

/// Starts `command` in namespace `ns` with its standard output piped and waits for its `ready` line.
pub fn start_ready(ns: &OwnedFd, command: &mut Command) -> Running {
    let mut child = with_netns(&ns_path(ns), || command.stdout(Stdio::piped()).spawn()).unwrap().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "{command:?} announces readiness");
    child.stdout = Some(out.into_inner());
    Running(Some(child))
}

/// Datagrams of many sizes in bursts; each burst is received before the next is sent, so no queue can overflow
/// and every datagram must arrive complete and in order. With `uso`, each burst is one UDP GSO send of 40
/// segments, which crosses the forwarder as a super-packet.
/// `ordered` is false for several workers on one queue (`--threads`), which may reorder datagrams of a flow.
/// The largest UDP super-packet the kernel hands a TAP device whole: the device's `gso_max_size` (65,536) counts
/// the Ethernet header, so 65,494 bytes of payload (a 65,522-byte IP packet) make a 65,536-byte frame, one byte
/// more than 65,535. It must arrive whole, never cut (segments of 1,400, the last one shorter).
pub fn udp_largest_super_packet_intact(topo: &Topology, src: &str, dst: &str) {
    let rx = topo.in_b(|| UdpSocket::bind((dst, 6002)).unwrap());
    rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let tx = topo.in_a(|| UdpSocket::bind((src, 0)).unwrap());
    tx.connect((dst, 6002)).unwrap();
    turbotun::udp::set_udp_segment(&tx, 1400).unwrap();
    let mut buf = vec![0u8; 65536];
    for send in 0..5u64 {
        let data = pattern(65_494, 1000 + send);
        tx.send(&data).unwrap();
        for (k, want) in data.chunks(1400).enumerate() {
            let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("send {send} segment {k}: {e}"));
            assert_eq!(&buf[..n], want, "send {send} segment {k}");
        }
    }
}

pub fn udp_datagrams_intact(topo: &Topology, src: &str, dst: &str, uso: bool, ordered: bool) {
    let bursts = if uso { 20 } else { 50 };
    udp_datagrams_between(&topo.ns_a, &topo.ns_b, src, dst, uso, ordered, bursts);
}

/// [`udp_datagrams_intact`] from namespace `a` to `b`, `bursts` bursts.
pub fn udp_datagrams_between(a: &OwnedFd, b: &OwnedFd, src: &str, dst: &str, uso: bool, ordered: bool, bursts: u32) {
    let port = 6001;
    let rx = with_netns(&ns_path(b), || UdpSocket::bind((dst, port)).unwrap()).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let tx = with_netns(&ns_path(a), || UdpSocket::bind((src, 0)).unwrap()).unwrap();
    tx.connect((dst, port)).unwrap();
    let seg = 1200usize;
    if uso {
        turbotun::udp::set_udp_segment(&tx, seg as u16).unwrap();
    }
    let mut buf = vec![0u8; 65536];
    let per_burst = if uso { 40u32 } else { 8 };
    for burst in 0..bursts {
        let mut expected = Vec::new();
        let mut gso_send = Vec::new();
        for k in 0..per_burst {
            let i = burst * per_burst + k;
            let size = if uso { seg } else { 4 + (i as usize * 37) % 1400 };
            let mut d = pattern(size, u64::from(i));
            d[..4].copy_from_slice(&i.to_be_bytes());
            if uso {
                gso_send.extend_from_slice(&d);
            } else {
                tx.send(&d).unwrap();
            }
            expected.push(d);
        }
        if uso {
            tx.send(&gso_send).unwrap();
        }
        let mut got = Vec::with_capacity(expected.len());
        for k in 0..expected.len() {
            let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("burst {burst} datagram {k} over {dst}: {e}"));
            got.push(buf[..n].to_vec());
        }
        if !ordered {
            got.sort();
            expected.sort();
        }
        for (k, (g, want)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, want, "burst {burst} datagram {k} over {dst} (uso {uso}, ordered {ordered})");
        }
    }
}

/// Names in a directory (`/run/netns`, `/sys/class/net`, `/var/run/wireguard`) that start with `prefix`.
pub fn entries_with_prefix(dir: &str, prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(prefix)).collect()
}

/// Command lines of the live processes that contain `needle` (a process whose parent has exited belongs to init,
/// so it is found by name).
pub fn processes_with(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then_some(cmdline)
        })
        .collect()
}

/// A finished run of a command: its exit status, its process id and what it printed.
pub struct Finished {
    pub status: ExitStatus,
    pub pid: u32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` with both outputs read as it runs (so that neither pipe fills), killed and the test failed if
/// it has not exited within `limit`.
pub fn run_within(command: &mut Command, limit: Duration) -> Finished {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
    let pid = child.id();
    let read_all = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out_reader = read_all(Box::new(child.stdout.take().unwrap()));
    let err_reader = read_all(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Finished { status, pid, stdout: out_reader.join().unwrap(), stderr: err_reader.join().unwrap() }
}
