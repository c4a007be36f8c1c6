//! One run of a row: the backend and the front end in a fresh namespace, the window measured (testpmd's frames
//! into the TAP, or the synthetic guest's TCP connection), the backend's CPU.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use turbotun::netlink::LinkStats;
use turbotun::vhost_user::frontend::{Guest, Layout};
use turbotun::vhost_user::VNET_HDR_LEN;
use turbotun::DeviceBuilder;

use crate::netcfg::Netns;
use crate::process::sleep_checked;
use crate::procfs;
use crate::runner::Ctx;
use crate::testpmd::{self, Testpmd};
use crate::topo::Forwarder;
use crate::vguest;

use super::summary::VhostRun;
use super::{Backend, RowSpec, TcpPath, BACKEND_CPU, DPDK_BACKEND_MAIN_LCORE, FRAME_LEN, FRONT_END_MAIN_LCORE, WARMUP};

/// A file removed when this value is dropped (a vhost-user socket a killed backend leaves).
pub(super) struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A running backend.
pub(super) enum Running {
    Turbotun(Forwarder),
    Dpdk(Testpmd),
}

impl Running {
    fn pid(&self) -> u32 {
        match self {
            Running::Turbotun(f) => f.pid,
            Running::Dpdk(t) => t.pid(),
        }
    }

    /// Stops the backend; its drop count and (turbotun) its counters line.
    fn finish(self) -> Result<(Option<u64>, Option<serde_json::Value>)> {
        match self {
            Running::Turbotun(mut f) => {
                if !f.is_running() {
                    bail!("turbotun vhost-user died during the run");
                }
                let exit = f.stop();
                let drops = exit.counters.as_ref().and_then(|c| c.get("drops")?.as_u64());
                Ok((drops, exit.counters))
            }
            Running::Dpdk(mut t) => {
                let forward_drops = testpmd::parse_forward_drops(&t.run("stop")?)?;
                let ports = t.port_stats()?;
                let port_drops: u64 = ports.iter().map(|p| p.rx_missed + p.rx_errors + p.rx_nombuf + p.tx_errors).sum();
                t.quit()?;
                Ok((Some(forward_drops + port_drops), None))
            }
        }
    }
}

/// The TAP's counters, read in the run's namespace.
pub(super) fn tap_stats(ns: &Netns, tap: &str) -> Result<LinkStats> {
    ns.netlink()?.stats(tap).with_context(|| format!("{}: counters of {tap}", ns.name))
}

/// CPU seconds (user, system) of a live process.
pub(super) fn cpu_seconds(pid: u32, clk_tck: f64) -> Result<(f64, f64)> {
    let (user, sys) = procfs::pid_user_sys_ticks(pid)?;
    Ok((user as f64 / clk_tck, sys as f64 / clk_tck))
}

/// A run's namespace (IPv6 off: only the guest's frames cross the TAP, no router solicitations or DAD), the
/// names of its TAP and socket, and the socket removed with it.
pub(super) struct RunPlace {
    ns: Netns,
    base: String,
    tap: String,
    socket: PathBuf,
    socket_str: String,
    _socket: RemoveOnDrop,
}

impl RunPlace {
    fn new(ctx: &mut Ctx) -> Result<RunPlace> {
        ctx.run_counter += 1;
        let base = format!("{}r{}", ctx.prefix, ctx.run_counter);
        let ns = Netns::new(format!("{base}v"))?;
        ns.set_sysctls(&[("net.ipv6.conf.all.disable_ipv6", "1"), ("net.ipv6.conf.default.disable_ipv6", "1")])?;
        let socket = ctx.log_dir.join(format!("{base}.sock"));
        let socket_str = socket.to_str().ok_or_else(|| anyhow!("{} is not UTF-8", socket.display()))?.to_string();
        Ok(RunPlace { ns, tap: format!("{base}v"), base, _socket: RemoveOnDrop(socket.clone()), socket, socket_str })
    }

    /// `turbotun vhost-user` on the socket and the TAP, pinned to [`BACKEND_CPU`], once it printed `ready`.
    /// `exe` is this build of turbotun, or the --baseline build.
    fn start_turbotun(&self, ctx: &Ctx, taskset: &Path, exe: &Path) -> Result<Forwarder> {
        let argv: Vec<String> = vec![
            "-c".into(),
            BACKEND_CPU.to_string(),
            exe.display().to_string(),
            "vhost-user".into(),
            "--json".into(),
            "--socket".into(),
            self.socket_str.clone(),
            "--device".into(),
            self.tap.clone(),
        ];
        let log = ctx.log_dir.join(format!("{}-turbotun-vhost-user.stderr", self.base));
        Forwarder::spawn("turbotun vhost-user", taskset, &argv, &self.ns, log, &ctx.stop)
    }
}

/// One run of a packet row: namespace, backend, front end, the window, the drain, the counters.
pub(super) fn run_one(
    ctx: &mut Ctx,
    row: &RowSpec,
    backend: Backend,
    rep: u32,
    taskset: &Path,
    exe: &Path,
) -> Result<VhostRun> {
    let place = RunPlace::new(ctx)?;
    let RunPlace { ns, base, tap, socket_str, .. } = &place;
    let (base, tap, socket_str) = (base.as_str(), tap.as_str(), socket_str.as_str());

    let backend = match backend {
        Backend::Turbotun => {
            let fwd = place.start_turbotun(ctx, taskset, exe)?;
            ns.netlink()?.set_up(tap, true).with_context(|| format!("set {tap} up"))?;
            Running::Turbotun(fwd)
        }
        Backend::Dpdk => {
            let mut eal = testpmd::eal_args(DPDK_BACKEND_MAIN_LCORE, &format!("{base}be"));
            eal.extend([
                "--vdev".into(),
                format!("net_vhost0,iface={socket_str},queues=1"),
                "--vdev".into(),
                format!("net_tap0,iface={tap}"),
            ]);
            let app = ["--port-topology=chained", "--total-num-mbufs=32768"];
            let log = ctx.log_dir.join(format!("{base}-dpdk-backend.log"));
            Running::Dpdk(Testpmd::start(
                "DPDK's backend (testpmd)",
                ns,
                &eal,
                &app,
                &format!("{base}be"),
                log,
                &ctx.stop,
            )?)
        }
    };
    let pid = backend.pid();

    let mut eal = testpmd::eal_args(FRONT_END_MAIN_LCORE, &format!("{base}fe"));
    eal.extend([
        "--vdev".into(),
        format!("net_virtio_user0,path={socket_str},queues=1,packed_vq=0,mrg_rxbuf=1,in_order=0"),
    ]);
    let log = ctx.log_dir.join(format!("{base}-front-end.log"));
    let mut front = Testpmd::start(
        "the front end (testpmd)",
        ns,
        &eal,
        &["--total-num-mbufs=32768"],
        &format!("{base}fe"),
        log,
        &ctx.stop,
    )?;
    front.run("set fwd txonly")?;
    front.run(&format!("set txpkts {FRAME_LEN}"))?;
    let mut backend = backend;
    if let Running::Dpdk(t) = &mut backend {
        // Forwarding starts once the front end is connected (its first prompt comes after its port started): a
        // vhost port polled before its guest arrived was seen to stop after its first burst.
        t.run("set fwd io")?;
        t.run("start")?;
    }
    front.run("start")?;
    sleep_checked(WARMUP, &ctx.stop)?;

    let (tap0, cpu0, t0) = (tap_stats(ns, tap)?, cpu_seconds(pid, ctx.clk_tck)?, Instant::now());
    sleep_checked(Duration::from_secs(ctx.duration), &ctx.stop)?;
    let (tap1, cpu1, t1) = (tap_stats(ns, tap)?, cpu_seconds(pid, ctx.clk_tck)?, Instant::now());

    front.run("stop")?;
    let sent = front.port_stats()?.first().map(|p| p.tx_packets).ok_or_else(|| anyhow!("the front end has no port"))?;
    let drained = drain(ns, tap, &ctx.stop)?;
    front.quit()?;
    let (backend_drops, backend_counters) = backend.finish()?;

    let window_seconds = (t1 - t0).as_secs_f64();
    let tap_rx_packets = tap1.rx_packets.saturating_sub(tap0.rx_packets);
    let (user, sys) = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
    let pps = tap_rx_packets as f64 / window_seconds;
    let cpu_per_second = (user + sys) / window_seconds;
    if tap_rx_packets == 0 {
        bail!("no frame reached the TAP over the window (the front end sent {sent})");
    }
    Ok(VhostRun {
        row: row.label.into(),
        rep,
        error: None,
        window_seconds,
        tap_rx_packets,
        mpps: Some(pps / 1e6),
        backend_pid: pid,
        backend_user_seconds: user,
        backend_sys_seconds: sys,
        backend_cpu_per_second: Some(cpu_per_second),
        // No CPU time counted (a clock tick is 10 ms): no figure rather than an infinite one.
        pps_per_cpu_second: (cpu_per_second > 0.0).then(|| pps / cpu_per_second),
        frontend_tx_packets: sent,
        tap_rx_packets_total: drained.rx_packets,
        lost: sent.saturating_sub(drained.rx_packets),
        tap_rx_dropped: drained.rx_dropped,
        backend_drops,
        backend_counters,
        ..Default::default()
    })
}

/// Features of the `tso` row's guest: what a Linux guest takes for TCP over IPv4 (checksums and TSO both ways,
/// mergeable receive buffers, the event index).
pub(super) fn tso_features() -> u64 {
    use turbotun::wire::virtio_net::features as f;
    [VERSION_1, EVENT_IDX, f::CSUM, f::GUEST_CSUM, f::HOST_TSO4, f::GUEST_TSO4, f::MRG_RXBUF]
        .iter()
        .fold(0, |w, &n| w | 1u64 << n)
}

/// Features of the `no-offload` row's guest: no checksum or segmentation offload at all.
pub(super) fn plain_features() -> u64 {
    use turbotun::wire::virtio_net::features as f;
    [VERSION_1, EVENT_IDX, f::MRG_RXBUF].iter().fold(0, |w, &n| w | 1u64 << n)
}

pub(super) const VERSION_1: u32 = 32;
pub(super) const EVENT_IDX: u32 = 29;

/// Sets a flag when dropped: the run's threads stop however the run ends.
pub(super) struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One run of a TCP row: namespace, TAP at 10.203.0.1/24 with the guest's address known to it, the socket, the
/// backend (or none), the guest's sender; the socket's bytes over the window.
pub(super) fn run_tcp(
    ctx: &mut Ctx,
    row: &RowSpec,
    path: TcpPath,
    rep: u32,
    taskset: &Path,
    exe: &Path,
) -> Result<VhostRun> {
    let place = RunPlace::new(ctx)?;
    let (ns, tap) = (&place.ns, place.tap.as_str());
    let configure = || -> Result<()> {
        let mut nl = ns.netlink()?;
        nl.add_address(tap, vguest::TAP_IP.into(), 24).with_context(|| format!("address on {tap}"))?;
        nl.set_up(tap, true).with_context(|| format!("set {tap} up"))?;
        // The guest answers no ARP: the kernel knows its address already.
        nl.add_neighbour(tap, vguest::GUEST_IP.into(), vguest::GUEST_MAC)
            .with_context(|| format!("neighbour on {tap}"))?;
        Ok(())
    };
    let (backend, link): (Option<Running>, Box<dyn vguest::Link + Send>) = match path {
        TcpPath::Tso | TcpPath::NoOffload => {
            let fwd = place.start_turbotun(ctx, taskset, exe)?;
            configure()?;
            let features = if path == TcpPath::Tso { tso_features() } else { plain_features() };
            let layout = Layout { rx_size: 256, tx_size: 256 };
            let mut guest = Guest::connect_with(&place.socket, features, layout).context("the guest's front end")?;
            guest.post_rx(0, layout.rx_size).context("the guest's receive buffers")?;
            (Some(Running::Turbotun(fwd)), Box::new(vguest::VirtioLink(guest)))
        }
        TcpPath::Ceiling => {
            let device = ns
                .run(|| DeviceBuilder::tap().name(tap).vnet_hdr(VNET_HDR_LEN).open())?
                .with_context(|| format!("open {tap}"))?;
            configure()?;
            (None, Box::new(vguest::TapLink::new(device.into_queues().remove(0))?))
        }
    };
    let pid = backend.as_ref().map(Running::pid);
    let mac = ns.netlink()?.link(tap)?.mac.ok_or_else(|| anyhow!("{tap} has no MAC address"))?;
    let listener = ns.run(|| std::net::TcpListener::bind((vguest::TAP_IP, vguest::PORT)))?.context("the socket")?;

    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(Arc::clone(&stop));
    let (received, sent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let receiver = {
        let (stop, received) = (Arc::clone(&stop), Arc::clone(&received));
        std::thread::spawn(move || vguest::receive(listener, stop, received))
    };
    let sender = {
        let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
        let tso = path != TcpPath::NoOffload;
        let mut link = link;
        // The link comes back with the report: the ceiling's TAP lives as long as its fd, which the counters
        // read after the sender stopped still need.
        std::thread::spawn(move || {
            let report = vguest::send_tcp(&mut *link, mac, tso, &stop, &sent);
            (link, report)
        })
    };
    // The connection is up once the socket has read something; the sender's error if it gave up first.
    let deadline = Instant::now() + Duration::from_secs(20);
    while received.load(Ordering::Relaxed) == 0 {
        if sender.is_finished() || Instant::now() >= deadline {
            stop.store(true, Ordering::Relaxed);
            let why = match sender.join() {
                Ok((_, Err(e))) => format!("{e:#}"),
                _ => "no byte reached the socket within 20 s".into(),
            };
            bail!("{why}");
        }
        sleep_checked(Duration::from_millis(10), &ctx.stop)?;
    }
    sleep_checked(WARMUP, &ctx.stop)?;
    let cpu = |pid: Option<u32>| pid.map(|p| cpu_seconds(p, ctx.clk_tck)).transpose();
    let (bytes0, tap0, cpu0, t0) = (received.load(Ordering::Relaxed), tap_stats(ns, tap)?, cpu(pid)?, Instant::now());
    sleep_checked(Duration::from_secs(ctx.duration), &ctx.stop)?;
    let (bytes1, tap1, cpu1, t1) = (received.load(Ordering::Relaxed), tap_stats(ns, tap)?, cpu(pid)?, Instant::now());
    stop.store(true, Ordering::Relaxed);
    let (link, report) = sender.join().map_err(|_| anyhow!("the guest's sender panicked"))?;
    let report = report?;
    receiver.join().map_err(|_| anyhow!("the socket's reader panicked"))??;
    let drained = drain(ns, tap, &ctx.stop)?;
    drop(link);
    let (backend_drops, backend_counters) = match backend {
        Some(b) => b.finish()?,
        None => (None, None),
    };

    let window_seconds = (t1 - t0).as_secs_f64();
    let socket_bytes = bytes1 - bytes0;
    let tap_rx_packets = tap1.rx_packets.saturating_sub(tap0.rx_packets);
    let (user, sys) = match (cpu0, cpu1) {
        (Some(a), Some(b)) => (b.0 - a.0, b.1 - a.1),
        _ => (0.0, 0.0),
    };
    Ok(VhostRun {
        row: row.label.into(),
        rep,
        error: None,
        window_seconds,
        tap_rx_packets,
        mpps: Some(tap_rx_packets as f64 / window_seconds / 1e6),
        backend_pid: pid.unwrap_or(0),
        backend_user_seconds: user,
        backend_sys_seconds: sys,
        backend_cpu_per_second: pid.map(|_| (user + sys) / window_seconds),
        pps_per_cpu_second: None,
        frontend_tx_packets: report.frames,
        tap_rx_packets_total: drained.rx_packets,
        lost: report.frames.saturating_sub(drained.rx_packets),
        tap_rx_dropped: drained.rx_dropped,
        backend_drops,
        backend_counters,
        socket_bytes: Some(socket_bytes),
        gbps: Some(socket_bytes as f64 * 8.0 / window_seconds / 1e9),
        sender: Some(report),
    })
}

/// The TAP's counters once the backend has written what was left in the ring: `rx_packets` unchanged over
/// 100 ms, or after 3 s.
pub(super) fn drain(ns: &Netns, tap: &str, stop: &std::sync::atomic::AtomicBool) -> Result<LinkStats> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = tap_stats(ns, tap)?;
    loop {
        sleep_checked(Duration::from_millis(100), stop)?;
        let now = tap_stats(ns, tap)?;
        if now.rx_packets == last.rx_packets || Instant::now() >= deadline {
            return Ok(now);
        }
        last = now;
    }
}
