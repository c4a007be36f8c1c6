//! `turbotun vhost-user` serving a TAP in a private namespace, for the tests whose front end is a program
//! written elsewhere (DPDK's testpmd, QEMU).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use turbotun::netlink::{LinkStats, Netlink};
use turbotun::Counters;

use super::{new_netns, ns_path, start_ready, Running};

const TURBOTUN: &str = env!("CARGO_BIN_EXE_turbotun");

/// A private namespace with `turbotun vhost-user` serving a TAP (IPv6 off, `tap_addr`/24 on it, up), its socket
/// and counters socket in a scratch directory. The fields drop in order: the backend is killed (if a test failed
/// before stopping it), then the directory goes, then the namespace with the TAP.
pub struct Backend {
    backend: Option<Running>,
    scratch: Scratch,
    pub ns: OwnedFd,
    pub tap: String,
    /// Unique to this backend in this test run: names the TAP, the scratch directory and what a test makes.
    pub tag: String,
}

impl Backend {
    /// `kind` names the scratch directory (`turbotun-KIND-TAG`).
    pub fn start(kind: &str, tap_addr: &str) -> Backend {
        Backend::with_queue_pairs(kind, tap_addr, 1)
    }

    /// [`Backend::start`] offering `pairs` queue pairs on a multiqueue TAP.
    pub fn with_queue_pairs(kind: &str, tap_addr: &str, pairs: usize) -> Backend {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}x{n}", std::process::id() % 100_000);
        let scratch = Scratch::new(&format!("turbotun-{kind}-{tag}"));
        let ns = new_netns();
        let tap = format!("ttvd{tag}");
        let backend = start_ready(
            &ns,
            Command::new(TURBOTUN)
                .args(["vhost-user", "--json", "--device", &tap, "--queues", &pairs.to_string()])
                .arg("--socket")
                .arg(scratch.socket())
                .arg("--stats-socket")
                .arg(scratch.stats())
                .stderr(std::fs::File::create(scratch.log()).unwrap()),
        );
        let setup = Backend { backend: Some(backend), scratch, ns, tap, tag };
        // Only the frames a test makes cross the TAP: no IPv6 (router solicitations, DAD) from the kernel.
        let tap = setup.tap.clone();
        setup.in_ns(|| std::fs::write(format!("/proc/sys/net/ipv6/conf/{tap}/disable_ipv6"), "1").unwrap());
        let mut nl = Netlink::in_netns(&ns_path(&setup.ns)).unwrap();
        nl.add_address(&setup.tap, tap_addr.parse().unwrap(), 24).unwrap();
        nl.set_up(&setup.tap, true).unwrap();
        setup
    }

    pub fn in_ns<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        turbotun::netns::with_netns(&ns_path(&self.ns), f).unwrap()
    }

    /// The vhost-user socket front ends connect to.
    pub fn socket(&self) -> PathBuf {
        self.scratch.socket()
    }

    /// What the backend logged so far (its standard error).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.scratch.log()).unwrap_or_default()
    }

    /// The scratch directory, removed with the backend: for a test's own files.
    pub fn dir(&self) -> PathBuf {
        self.scratch.0.clone()
    }

    pub fn tap_stats(&self) -> LinkStats {
        Netlink::in_netns(&ns_path(&self.ns)).unwrap().stats(&self.tap).unwrap()
    }

    /// The backend's counters now (its counters socket): guest → TAP and TAP → guest.
    pub fn counters(&self) -> (Counters, Counters) {
        let report = turbotun::stats_socket::read(&self.scratch.stats()).expect("the backend's counters socket");
        let direction = |name: &str| {
            report.directions.iter().find(|(n, _)| n == name).map(|(_, c)| *c).unwrap_or_else(|| {
                panic!("no {name} in the backend's report: {:?}", report.directions);
            })
        };
        (direction("to_tap"), direction("to_guest"))
    }

    /// Each queue pair's counters (none when the backend serves one pair): guest → TAP and TAP → guest.
    pub fn pair_counters(&self) -> Vec<(Counters, Counters)> {
        let report = turbotun::stats_socket::read(&self.scratch.stats()).expect("the backend's counters socket");
        report
            .queues
            .iter()
            .map(|directions| {
                let direction = |name: &str| {
                    directions.iter().find(|(n, _)| n == name).map(|(_, c)| *c).unwrap_or_else(|| {
                        panic!("no {name} in a queue pair's report: {directions:?}");
                    })
                };
                (direction("to_tap"), direction("to_guest"))
            })
            .collect()
    }

    /// The backend's counters once `done` holds of them: a frame a front end counts may not be counted by the
    /// backend yet (it adds a batch's counters after the batch). Fails after `patience`.
    pub fn wait_counters(
        &self,
        what: &str,
        patience: Duration,
        done: impl Fn(&Counters, &Counters) -> bool,
    ) -> (Counters, Counters) {
        let deadline = Instant::now() + patience;
        loop {
            let (to_tap, to_guest) = self.counters();
            if done(&to_tap, &to_guest) {
                return (to_tap, to_guest);
            }
            assert!(Instant::now() < deadline, "the backend never counted {what}: {to_tap:?} {to_guest:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM: the backend exits 0 with its closing counters, having served `front_end` once without a drop
    /// and removed its socket. The closing counters.
    pub fn stop(&mut self, front_end: &str) -> serde_json::Value {
        self.stop_after(front_end, 1)
    }

    /// [`Backend::stop`] for a backend that served `connections` front ends.
    pub fn stop_after(&mut self, front_end: &str, connections: u32) -> serde_json::Value {
        let out = self.backend.take().unwrap().stop();
        let log = self.log();
        let counters: serde_json::Value = serde_json::from_str(out.trim().lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("closing counters {out:?}: {e}; its log:\n{log}"));
        assert_eq!(counters["connections"], connections.to_string().as_str(), "{front_end}'s connections: {counters}");
        assert_eq!(counters["drops"], 0, "{counters}; its log:\n{log}");
        assert!(!self.scratch.socket().exists(), "the backend removes its socket");
        counters
    }
}

/// A directory of the test's own under the temporary directory, removed with what is in it however the test
/// ends (a killed backend leaves its sockets).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        Scratch(dir)
    }
    fn socket(&self) -> PathBuf {
        self.0.join("vhost.sock")
    }
    fn stats(&self) -> PathBuf {
        self.0.join("counters.stats")
    }
    fn log(&self) -> PathBuf {
        self.0.join("backend.log")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
