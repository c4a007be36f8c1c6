//! The ceiling row (`turbotun-ceiling`, the hidden `turbotun bench --ceiling-fwd A B`): the least a forwarder
//! can do with the kernel's two copies. Both devices with the virtio header and every offload, one blocking
//! `read` and one `write` per frame, header untouched, nothing split or coalesced, one thread per direction.
//! Every mode's figure reads against it: what is left above it is what the mode's own work costs.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use turbotun::{DeviceBuilder, Offloads, Queue, StopHandle};

/// Frames, bytes and failed writes of one direction.
#[derive(Debug, Default)]
struct Count {
    packets: AtomicU64,
    bytes: AtomicU64,
    drops: AtomicU64,
}

/// Forwards `from` to `to` until a read or write fails for good; a write the kernel refuses (a device still
/// down during set-up: `EIO`) is counted as a drop.
fn pump(from: &Queue, to: &Queue, count: &Count) -> turbotun::Result<()> {
    let mut buf = vec![0u8; from.vnet_hdr_len() + turbotun::queue::MAX_PACKET];
    loop {
        let n = from.recv_raw(&mut buf)?;
        match to.send_raw(&buf[..n]) {
            Ok(_) => {
                count.packets.fetch_add(1, Relaxed);
                count.bytes.fetch_add((n - from.vnet_hdr_len().min(n)) as u64, Relaxed);
            }
            Err(e) if e.is_device_gone() => return Err(e),
            Err(_) => {
                count.drops.fetch_add(1, Relaxed);
            }
        }
    }
}

/// Runs the ceiling forwarder between `dev_a` and `dev_b` (created): prints `ready`, forwards until
/// SIGINT/SIGTERM, then prints its counters as one JSON line and exits (the forwarder contract).
pub(crate) fn ceiling_fwd(dev_a: &str, dev_b: &str) -> Result<()> {
    let open = |name: &str| {
        DeviceBuilder::tun()
            .name(name)
            .vnet_hdr(turbotun_wire::VIRTIO_NET_HDR_LEN)
            .offloads(Offloads::ALL)
            .open()
            .with_context(|| format!("opening {name}"))
    };
    let (a, b) = (open(dev_a)?, open(dev_b)?);
    let stop = StopHandle::new();
    stop.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let queues = Arc::new((a.into_queues(), b.into_queues()));
    let counts: Arc<[Count; 2]> = Arc::new(Default::default());
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for a_to_b in [true, false] {
        let (queues, counts, stop, failed) = (queues.clone(), counts.clone(), stop.clone(), failed.clone());
        std::thread::spawn(move || {
            let (a, b) = (&queues.0[0], &queues.1[0]);
            let (from, to) = if a_to_b { (a, b) } else { (b, a) };
            if let Err(e) = pump(from, to, &counts[usize::from(!a_to_b)]) {
                eprintln!("turbotun bench --ceiling-fwd: {e}");
                failed.store(true, Relaxed);
                stop.stop();
            }
        });
    }
    println!("ready");
    while !stop.is_stopped() {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The workers sleep in blocking reads: the process exits under them once the counters are out.
    let total = |f: fn(&Count) -> &AtomicU64| counts.iter().map(|c| f(c).load(Relaxed)).sum::<u64>();
    let line = serde_json::json!({
        "mode": "ceiling",
        "packets": total(|c| &c.packets),
        "segments": total(|c| &c.packets),
        "bytes": total(|c| &c.bytes),
        "drops": total(|c| &c.drops),
        "errors": 0,
    });
    println!("{line}");
    std::process::exit(i32::from(failed.load(Relaxed)))
}
