//! Stopping readers without a process-wide signal: a receive half waiting on a non-blocking queue (no timeout) and
//! a forwarder with poll or io_uring workers end when their stop handle fires (waited for with a generous bound,
//! not timed), and the process never gets the wake-up
//! signal's handler (it is installed only for blocking reads, where a signal is the only way). Process-wide
//! state, hence a test binary of its own.

mod common;

use std::time::Duration;

use common::{in_netns, join_within, new_netns, ns_path, unique_name, wait_until_asleep, Sides, A4, B4};
use turbotun::batch::{Batch, RecvBatch};
use turbotun::forward::{ForwardMode, ForwarderBuilder, IoKind};
use turbotun::netns::with_netns;
use turbotun::{DeviceBuilder, Mode, Offloads, StopHandle};

/// Whether this process has a handler for `signal` (its bit in `SigCgt` of `/proc/self/status`).
fn handles_signal(signal: i32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).unwrap().trim();
    let mask = u64::from_str_radix(mask, 16).unwrap();
    mask & (1 << (signal - 1)) != 0
}

fn wake_signal() -> i32 {
    libc::SIGRTMIN() + 3
}

#[test]
fn readers_stop_on_the_handle_alone() {
    in_netns("readers_stop_on_the_handle_alone", || {
        // A receive half asleep in poll on a quiet non-blocking queue.
        let name = unique_name("tsw");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(10).offloads(Offloads::ALL).nonblocking(true).open();
        let queue = dev.unwrap().into_queues().pop().unwrap();
        let stop = StopHandle::new();
        let mut rx = RecvBatch::new(queue).stop_on(stop.clone());
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut bufs = vec![vec![0u8; 1510]; 4];
            let mut lens = [0usize; 4];
            tid_tx.send(rustix::thread::gettid().as_raw_nonzero().get()).unwrap();
            // No timeout: only the stop handle can end this wait.
            rx.recv_many(&mut Batch::new(&mut bufs, &mut lens, 10), None).unwrap().packets
        });
        wait_until_asleep(tid_rx.recv().unwrap(), Duration::from_secs(30));
        assert!(!reader.is_finished(), "the reader waits while nothing comes");
        stop.stop();
        let packets = join_within(reader, Duration::from_secs(30), "a reader told to stop");
        assert_eq!(packets, 0);

        // Forwarders with poll and io_uring workers, traffic through them, then stopped.
        for io in [IoKind::Poll, IoKind::Uring] {
            let ns_fwd = new_netns();
            let (dev_a, dev_b) = (unique_name("tswa"), unique_name("tswb"));
            let builder = ForwarderBuilder::new(ForwardMode::Offload).io(io);
            let (a, b) = with_netns(&ns_path(&ns_fwd), || {
                (
                    builder.device(Mode::Tun).name(&dev_a).open().unwrap(),
                    builder.device(Mode::Tun).name(&dev_b).open().unwrap(),
                )
            })
            .unwrap();
            let forwarder = builder.build(a, b).unwrap();
            assert_eq!(forwarder.io(), io);
            let stop = forwarder.stop_handle();
            let running = std::thread::spawn(move || forwarder.run());
            let sides = Sides::connect(&ns_fwd, &dev_a, &dev_b);
            sides.tcp_intact(B4, 1 << 20);
            sides.udp_intact(A4, B4);
            stop.stop();
            // Poll waits end on the handle's fd; an io_uring wait at its next idle wake-up.
            join_within(running, Duration::from_secs(30), &format!("a forwarder with {io:?} workers told to stop"))
                .unwrap();
        }
        assert!(!handles_signal(wake_signal()), "no process-wide handler was installed");

        // Blocking reads are the one case for a signal: a forwarder with them installs the handler.
        let builder = ForwarderBuilder::new(ForwardMode::Plain).io(IoKind::Block);
        let open = |b: &ForwarderBuilder| b.device(Mode::Tun).name(unique_name("tswk")).open().unwrap();
        drop(builder.clone().build(open(&builder), open(&builder)).unwrap());
        assert!(handles_signal(wake_signal()), "blocking reads need the wake-up signal");
    });
}
