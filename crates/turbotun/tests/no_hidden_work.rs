//! No hidden work on a data path: building the batch halves and sending a coalescable batch runs no kernel probe
//! (no thread, no namespace, no scratch device: a probe inside a tokio task would block the runtime, and under a
//! seccomp filter that denies `unshare` it would kill the process). The probes run when asked
//! (`Capabilities::get`). Process-wide state, hence a test binary of its own.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use common::{configure_v4, in_netns, ipv4_udp, unique_name};
use turbotun::batch::{Batch, RecvBatch, SendBatch};
use turbotun::{Capabilities, DeviceBuilder, Offloads};

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 9, 7, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 9, 7, 2);

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// The threads once a thread just joined is gone from `/proc/self/task`: `join` returns when the thread's exit
/// wakes it, a moment before the kernel reaps the thread (CI saw one more thread than before, once).
fn threads_after_join(expected: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let now = threads();
        if now == expected || std::time::Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn sending_probes_nothing() {
    in_netns("sending_probes_nothing", || {
        let name = unique_name("tnh");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(10).offloads(Offloads::ALL).open().unwrap();
        configure_v4(&name, LOCAL, 24);
        let q = &dev.queues()[0];
        let before = threads();
        let (_rx, mut tx) = (RecvBatch::new(q), SendBatch::new(q));
        let sink = UdpSocket::bind((LOCAL, 7100)).unwrap();
        sink.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut bufs: Vec<Vec<u8>> =
            (0..8u8).map(|i| [vec![0u8; 10], ipv4_udp(PEER, LOCAL, 9, 7100, &[i; 800])].concat()).collect();
        let mut lens: Vec<usize> = bufs.iter().map(|b| b.len() - 10).collect();
        let sent = tx.send_many(&mut Batch::new(&mut bufs, &mut lens, 10), false).unwrap();
        assert_eq!((sent.packets, sent.dropped), (8, 0));
        assert!(sent.writes < 8, "coalesced: {sent:?}");
        let mut buf = [0u8; 1024];
        for i in 0..8u8 {
            let n = sink.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &[i; 800][..]);
        }
        assert!(Capabilities::if_probed().is_none(), "no probe ran as a side effect of sending");
        assert_eq!(threads(), before, "no thread was started");

        // Asked for, the probes run (in a private namespace, on a thread that is gone when they are done).
        let caps = Capabilities::get().unwrap();
        assert_eq!(caps.gro_writes().udp, Some(true));
        assert!(Capabilities::if_probed().is_some());
        assert_eq!(threads_after_join(before), before, "the probes' thread is gone");
    });
}
