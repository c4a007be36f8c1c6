//! DPDK's virtio-user (`dpdk-testpmd`, Debian's `dpdk-dev`) as the front end of `turbotun vhost-user`: a
//! vhost-user implementation written elsewhere negotiates with the backend, maps its memory (a memfd: DPDK runs
//! with `--no-huge`) and drives the rings. Both run in a private namespace; testpmd is driven through its
//! interactive prompt, and its own port counters are checked against the backend's and the TAP's.

mod common;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::vhost_user::Backend;
use turbotun::netlink::LinkStats;
use turbotun::Counters;
use turbotun_bench::testpmd::{self as driver, PortStats, TESTPMD};

/// What an answer may take at most: far above what it takes (testpmd starts in about a second, the backend
/// moves a frame in microseconds), so that only a path that is broken reaches it.
const PATIENCE: Duration = Duration::from_secs(30);
/// The address the TAP pings; testpmd's `icmpecho` answers ARP and ping for any address.
const TAP_ADDR: &str = "10.99.0.1";
const GUEST_ADDR: &str = "10.99.0.2";

/// testpmd's forwarding core polls CPU 0 without pause: two at once would only slow each other down.
static ONE_FRONT_END_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn dpdk_icmpecho_answers_pings_through_the_backend() {
    let Some(_one) = runnable("dpdk_icmpecho_answers_pings_through_the_backend") else { return };
    let mut setup = Setup::start();
    let mut testpmd = setup.testpmd();
    testpmd.run("set fwd icmpecho");
    testpmd.run("start");

    // ARP from the kernel to the guest and back, then echo requests one way and replies the other.
    let pings = 5;
    let ping = setup.in_ns(|| {
        Command::new("ping")
            .args(["-n", "-c", &pings.to_string(), "-i", "0.2", "-w", "20", GUEST_ADDR])
            .output()
            .expect("ping (iputils-ping)")
    });
    let ping_out = String::from_utf8_lossy(&ping.stdout);
    assert!(
        ping.status.success() && ping_out.contains(&format!("{pings} received")),
        "{pings} pings through the backend answered by testpmd:\n{ping_out}\ntestpmd:\n{}",
        testpmd.output()
    );
    testpmd.run("stop");
    let port = testpmd.port_stats();
    // The guest sent its ARP reply and the echo replies, and received the ARP request and the echo requests:
    // testpmd counted each frame the backend moved, and the backend moved each frame it was given.
    let (to_tap, to_guest) = setup.wait_backend("frames testpmd counted", |to_tap, to_guest| {
        to_tap.packets >= port.tx_packets && to_guest.packets >= port.rx_packets
    });
    assert!(port.tx_packets > pings && port.rx_packets > pings, "testpmd's port: {port:?}");
    assert_eq!((to_tap.packets, to_tap.bytes), (port.tx_packets, port.tx_bytes), "guest → TAP: {to_tap:?}");
    assert_eq!((to_guest.packets, to_guest.bytes), (port.rx_packets, port.rx_bytes), "TAP → guest: {to_guest:?}");
    let tap = setup.tap_stats();
    assert_eq!(tap.rx_packets, to_tap.packets, "every frame written reached the TAP: {tap:?}");
    assert_eq!(tap.tx_packets, to_guest.packets, "every frame the kernel sent reached the guest: {tap:?}");
    assert_eq!((to_tap.drops.total(), to_guest.drops.total()), (0, 0), "no drops: {to_tap:?} {to_guest:?}");
    let pid = testpmd.pid();
    testpmd.quit();
    // What the operator reads at the default level, as DPDK's own backend says it: who connected, the features
    // agreed, and what the connection moved once it is gone.
    let backend = &setup.backend;
    let said = |line: &str| backend.log().lines().any(|l| l.contains(line));
    assert!(said(&format!("front end pid {pid} (uid 0, ")), "the front end by pid: {}", backend.log());
    assert!(said("connected on ") && said("1 queue pair(s) offered"), "{}", backend.log());
    assert!(said("the guest took virtio features ") && said("mrg_rxbuf"), "{}", backend.log());
    let moved =
        format!("disconnected: {} frames to the TAP, {} to the guest, 0 dropped", to_tap.packets, to_guest.packets);
    common::eventually("the disconnection said", || said(&moved));
    setup.stop_backend();
}

#[test]
fn dpdk_txonly_frames_all_reach_the_tap() {
    let Some(_one) = runnable("dpdk_txonly_frames_all_reach_the_tap") else { return };
    let mut setup = Setup::start();
    let mut testpmd = setup.testpmd();
    testpmd.run("set fwd txonly");
    for size in [64, 1514] {
        let (port_before, (backend_before, _), tap_before) =
            (testpmd.port_stats(), setup.backend_counters(), setup.tap_stats());
        testpmd.run(&format!("set txpkts {size}"));
        testpmd.run("start");
        // How long testpmd sends, not a result: the counts are compared, whatever they are.
        std::thread::sleep(Duration::from_secs(1));
        testpmd.run("stop");
        let sent = testpmd.port_stats().since(&port_before);
        assert!(sent.tx_packets > 0, "{size} B: testpmd sent nothing:\n{}", testpmd.output());
        assert_eq!(sent.tx_bytes, sent.tx_packets * size, "{size} B: testpmd's frames are {size} bytes");
        // Every frame the guest put in its ring is written to the TAP or counted as a drop, by reason.
        let (to_tap, _) = setup.wait_backend("testpmd's frames", |to_tap, _| {
            let to_tap = to_tap.since(&backend_before);
            to_tap.packets + to_tap.drops.total() >= sent.tx_packets
        });
        let to_tap = to_tap.since(&backend_before);
        assert_eq!(to_tap.packets + to_tap.drops.total(), sent.tx_packets, "{size} B: each frame once: {to_tap:?}");
        assert_eq!(to_tap.drops.total(), 0, "{size} B: frames a TAP takes are not dropped: {to_tap:?}");
        assert_eq!(to_tap.bytes, sent.tx_bytes, "{size} B: bytes the guest sent");
        // And the kernel received every frame the backend wrote.
        let tap = setup.tap_stats();
        let (rx_packets, rx_bytes, rx_dropped) = (
            tap.rx_packets - tap_before.rx_packets,
            tap.rx_bytes - tap_before.rx_bytes,
            tap.rx_dropped - tap_before.rx_dropped,
        );
        assert_eq!((rx_packets, rx_bytes, rx_dropped), (to_tap.packets, to_tap.bytes, 0), "{size} B: the TAP");
    }
    testpmd.quit();
    setup.stop_backend();
}

#[test]
fn dpdk_two_queue_pairs_carry_frames_both_ways() {
    let Some(_one) = runnable("dpdk_two_queue_pairs_carry_frames_both_ways") else { return };
    let mut setup = Setup::with_queue_pairs(2);
    let mut testpmd = setup.testpmd_with_queue_pairs(2);
    testpmd.run("set fwd icmpecho");
    testpmd.run("start");
    // 16 flows (one per address): the kernel steers each to one of the TAP's two queues by its hash, and
    // icmpecho answers on the queue the request came in on. All on one queue would take a hash that puts 16
    // addresses on the same side (about 1 in 65 000).
    setup.ping_many(16);
    testpmd.run("stop");
    let (rx, tx) = testpmd.queue_packets(2);
    assert!(rx.iter().all(|&n| n > 0), "both receive queues carried frames from the TAP: {rx:?}");
    assert!(tx.iter().all(|&n| n > 0), "both transmit queues carried answers to the TAP: {tx:?}");
    let port = testpmd.port_stats();
    let (to_tap, to_guest) = setup.wait_backend("frames testpmd counted", |to_tap, to_guest| {
        to_tap.packets >= port.tx_packets && to_guest.packets >= port.rx_packets
    });
    assert_eq!(to_tap.packets, port.tx_packets, "guest → TAP over both pairs: {to_tap:?}");
    assert_eq!(to_guest.packets, port.rx_packets, "TAP → guest over both pairs: {to_guest:?}");
    assert_eq!((to_tap.drops.total(), to_guest.drops.total()), (0, 0), "no drops: {to_tap:?} {to_guest:?}");
    // The backend's own count by pair: each carried frames both ways, and together they are the totals.
    let pairs = setup.backend.pair_counters();
    assert_eq!(pairs.len(), 2, "{pairs:?}");
    assert!(pairs.iter().all(|(t, g)| t.packets > 0 && g.packets > 0), "both pairs, both ways: {pairs:?}");
    let sum = |f: fn(&(Counters, Counters)) -> u64| pairs.iter().map(f).sum::<u64>();
    assert_eq!((sum(|p| p.0.packets), sum(|p| p.1.packets)), (to_tap.packets, to_guest.packets), "{pairs:?}");
    testpmd.quit();
    setup.stop_backend();
}

#[test]
fn dpdk_one_pair_of_two_gets_every_frame_also_after_a_guest_with_two() {
    let Some(_one) = runnable("dpdk_one_pair_of_two_gets_every_frame_also_after_a_guest_with_two") else { return };
    let mut setup = Setup::with_queue_pairs(2);
    // A front end that used both pairs, then one that uses one: the kernel must steer every frame to the TAP
    // queue of the pair in use, else the flows hashed to the other queue would wait there unread.
    let mut testpmd = setup.testpmd_with_queue_pairs(2);
    testpmd.run("set fwd icmpecho");
    testpmd.run("start");
    setup.ping_many(16);
    testpmd.quit();
    let mut testpmd = setup.testpmd_with_queue_pairs(1);
    testpmd.run("set fwd icmpecho");
    testpmd.run("start");
    setup.ping_many(16);
    testpmd.run("stop");
    let port = testpmd.port_stats();
    // The second front end's port counts from zero; the backend's counters are for both.
    let (_, to_guest) = setup.wait_backend("frames testpmd counted", |_, to_guest| to_guest.packets >= port.rx_packets);
    assert!(port.rx_packets >= 32, "16 flows' echo requests reached the one pair: {port:?}");
    assert_eq!(to_guest.drops.total(), 0, "no drops: {to_guest:?}");
    testpmd.quit();
    setup.stop_backend_after(2);
}

/// Holds the lock while the test runs; `None` when the test is to be skipped (the suite's skip rule: under
/// `CI=true` a test that cannot run fails).
fn runnable(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    if !common::can_run(test, &[(TESTPMD, "dpdk-dev"), ("stdbuf", "coreutils"), ("ping", "iputils-ping")]) {
        return None;
    }
    Some(ONE_FRONT_END_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

/// The backend in its namespace (see [`common::vhost_user::Backend`]) and testpmd's name for its files.
struct Setup {
    backend: Backend,
    /// Names testpmd's runtime files (`/var/run/dpdk/PREFIX`).
    prefix: String,
}

impl Setup {
    fn start() -> Setup {
        Setup::with_queue_pairs(1)
    }

    /// The backend offers `pairs` queue pairs on a multiqueue TAP.
    fn with_queue_pairs(pairs: usize) -> Setup {
        let backend = Backend::with_queue_pairs("dpdk", TAP_ADDR, pairs);
        let prefix = format!("ttdpdk{}", backend.tag);
        Setup { backend, prefix }
    }

    fn in_ns<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.backend.in_ns(f)
    }

    /// testpmd with a virtio-user port on the backend's socket, at its first prompt.
    fn testpmd(&self) -> Testpmd {
        self.testpmd_with_queue_pairs(1)
    }

    /// testpmd using `pairs` queue pairs of the port (its receive and transmit queues).
    fn testpmd_with_queue_pairs(&self, pairs: usize) -> Testpmd {
        Testpmd::start(&self.backend.ns, &self.backend.socket(), &self.backend.dir(), &self.prefix, pairs)
    }

    /// Pings `count` addresses of the guest's subnet (testpmd's `icmpecho` answers for any), a flow each, so
    /// that the kernel spreads them over the TAP's queues; panics unless every ping is answered.
    fn ping_many(&self, count: u8) {
        let failed: Vec<String> = (0..count)
            .filter_map(|i| {
                let addr = format!("10.99.0.{}", 100 + i);
                let out = self.in_ns(|| {
                    Command::new("ping").args(["-n", "-c", "2", "-i", "0.2", "-w", "20", &addr]).output().unwrap()
                });
                (!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("2 received")))
                    .then(|| format!("{addr}: {}", String::from_utf8_lossy(&out.stdout)))
            })
            .collect();
        assert!(failed.is_empty(), "pings unanswered through the backend: {failed:#?}");
    }

    fn tap_stats(&self) -> LinkStats {
        self.backend.tap_stats()
    }

    /// The backend's counters now: guest → TAP and TAP → guest.
    fn backend_counters(&self) -> (Counters, Counters) {
        self.backend.counters()
    }

    /// The backend's counters once `done` holds of them. Fails after [`PATIENCE`].
    fn wait_backend(&self, what: &str, done: impl Fn(&Counters, &Counters) -> bool) -> (Counters, Counters) {
        self.backend.wait_counters(what, PATIENCE, done)
    }

    /// SIGTERM: the backend exits 0 with its closing counters, having served testpmd once without a drop.
    fn stop_backend(&mut self) {
        self.backend.stop("testpmd");
    }

    /// [`Self::stop_backend`] for a backend that served `connections` front ends.
    fn stop_backend_after(&mut self, connections: u32) {
        self.backend.stop_after("testpmd", connections);
    }
}

/// testpmd (the bench's driver, [`turbotun_bench::testpmd`]) as these tests use it: each step must succeed.
struct Testpmd {
    testpmd: Option<driver::Testpmd>,
    prefix: String,
}

impl Testpmd {
    fn start(ns: &OwnedFd, socket: &Path, log_dir: &Path, prefix: &str, pairs: usize) -> Testpmd {
        let vdev = format!(
            "net_virtio_user0,path={},queues={pairs},packed_vq=0,mrg_rxbuf=1,in_order=0",
            socket.to_str().expect("a UTF-8 socket path")
        );
        // Lcore 0 forwards, lcore 1 reads commands; no hugepages (memory a memfd the backend maps), no PCI scan,
        // no telemetry socket, and a 32k-mbuf pool (the default one takes seconds to make). The offloads are
        // asked for, as a VM's driver would: checksum and TSO both ways, which the backend then gives the TAP.
        let mut eal = driver::eal_args(1, prefix);
        eal.extend(["--vdev".to_string(), vdev]);
        let (rxq, txq) = (format!("--rxq={pairs}"), format!("--txq={pairs}"));
        let app = ["--total-num-mbufs=32768", "--rx-offloads=0x1c", "--tx-offloads=0x2c", &rxq, &txq];
        let ns = turbotun_bench::Netns::from_fd(format!("the namespace of {prefix}"), ns.try_clone().unwrap());
        let log = log_dir.join(format!("{prefix}-testpmd.log"));
        let testpmd = driver::Testpmd::start("testpmd", &ns, &eal, &app, prefix, log, &Arc::default())
            .unwrap_or_else(|e| panic!("{e:#}"));
        // The first prompt comes once the port has started: connected, features agreed, rings handed over.
        let started = testpmd.output();
        assert!(started.contains("Port 0: "), "testpmd made no port on the backend's socket:\n{started}");
        Testpmd { testpmd: Some(testpmd), prefix: prefix.to_string() }
    }

    fn driver(&mut self) -> &mut driver::Testpmd {
        self.testpmd.as_mut().expect("testpmd runs")
    }

    /// Sends `command` and waits for the next prompt; what testpmd answered.
    fn run(&mut self, command: &str) -> String {
        self.driver().run(command).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Its standard output so far, and then its standard error.
    fn output(&self) -> String {
        let testpmd = self.testpmd.as_ref().expect("testpmd runs");
        let (output, errors) = (testpmd.output(), testpmd.errors());
        if errors.is_empty() {
            output
        } else {
            format!("{output}\n--- standard error ---\n{errors}")
        }
    }

    fn port_stats(&mut self) -> PortStats {
        let ports = self.driver().port_stats().unwrap_or_else(|e| panic!("{e:#}"));
        ports.first().copied().expect("port 0")
    }

    /// Frames each receive and transmit queue of the port carried, queue by queue.
    fn queue_packets(&mut self, pairs: usize) -> (Vec<u64>, Vec<u64>) {
        self.driver().queue_packets(pairs).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// `quit`: testpmd closes its port (the backend sees the front end leave) and exits 0, having made no file
    /// in /dev/shm (its memory is a memfd).
    fn pid(&self) -> u32 {
        self.testpmd.as_ref().expect("testpmd runs").pid()
    }

    fn quit(mut self) {
        let testpmd = self.testpmd.take().expect("testpmd runs");
        let output = testpmd.output();
        if let Err(e) = testpmd.quit() {
            panic!("testpmd exits 0 after quit: {e:#}\n{output}");
        }
        let shm = common::entries_with_prefix("/dev/shm", &self.prefix);
        assert!(shm.is_empty(), "testpmd left {shm:?} in /dev/shm");
    }
}
