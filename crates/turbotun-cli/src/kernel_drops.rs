//! The kernel's own drops at the devices an engine holds: a packet the kernel had for a device while the engine
//! (its reader) was too slow is tail-dropped at the device's transmit ring before any read, so the engine's
//! counters never see it; `ip -s link` shows it as `TX dropped`. Reported beside the engine's own drops, labelled
//! as the kernel's, since that is where a user looking for a loss finds it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use turbotun::netlink::Netlink;

/// How often the devices' counts are read: an engine's devices go with it when it ends (a TUN device nobody holds
/// is deleted), so its closing report gives what was read last.
const READ_EVERY: Duration = Duration::from_millis(100);

/// Each device's `TX dropped` since the engine started, read every [`READ_EVERY`] on a thread of its own through
/// a netlink socket opened at the start (reading link statistics needs no privilege, so it goes on after the drop).
pub struct KernelDrops {
    /// Each device's count at the start, and as last read.
    counts: Mutex<Vec<(String, u64, u64)>>,
}

impl KernelDrops {
    /// Starts counting for `devices`; `None` (said once) if netlink cannot be read.
    pub fn start(program: &str, devices: &[String]) -> Option<Arc<KernelDrops>> {
        let mut netlink = match Netlink::new() {
            Ok(netlink) => netlink,
            Err(e) => {
                eprintln!("{program}: the kernel's drops at the devices are not counted: {e}");
                return None;
            }
        };
        let counts = devices
            .iter()
            .map(|d| {
                let at_start = netlink.stats(d).map_or(0, |s| s.tx_dropped);
                (d.clone(), at_start, at_start)
            })
            .collect();
        let drops = Arc::new(KernelDrops { counts: Mutex::new(counts) });
        // The thread holds only a weak reference: it ends once the engine's reports are gone.
        let weak = Arc::downgrade(&drops);
        let spawned = std::thread::Builder::new().name("kernel-drops".into()).spawn(move || {
            while let Some(drops) = weak.upgrade() {
                drops.read(&mut netlink);
                drop(drops);
                std::thread::sleep(READ_EVERY);
            }
        });
        if let Err(e) = spawned {
            eprintln!("{program}: the kernel's drops at the devices are not counted: {e}");
            return None;
        }
        Some(drops)
    }

    /// Reads each device's count (one gone or moved away keeps its last).
    fn read(&self, netlink: &mut Netlink) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for (device, _, last) in counts.iter_mut() {
            if let Ok(stats) = netlink.stats(device) {
                *last = stats.tx_dropped;
            }
        }
    }

    /// Each device's `TX dropped` since the start, as last read.
    pub fn since_start(&self) -> Vec<(String, u64)> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.iter().map(|(device, start, last)| (device.clone(), last.saturating_sub(*start))).collect()
    }
}

/// `; the kernel dropped 5 at ttb's transmit ring (TX dropped)` for the devices with drops in `drops`, or nothing.
pub fn text(drops: &[(String, u64)]) -> String {
    let counted: Vec<String> = drops.iter().filter(|(_, n)| *n > 0).map(|(d, n)| format!("{n} at {d}'s")).collect();
    match counted.is_empty() {
        true => String::new(),
        false => format!("; the kernel dropped {} transmit ring (TX dropped: read too late)", counted.join(", ")),
    }
}

/// What each device's count grew by from `earlier` to `now`.
pub fn since(now: &[(String, u64)], earlier: &[(String, u64)]) -> Vec<(String, u64)> {
    now.iter()
        .map(|(device, n)| {
            let before = earlier.iter().find(|(d, _)| d == device).map_or(0, |(_, b)| *b);
            (device.clone(), n.saturating_sub(before))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_devices_with_drops_are_named() {
        assert_eq!(text(&[("tta".into(), 0)]), "");
        let drops = vec![("tta".into(), 0), ("ttb".into(), 5)];
        assert_eq!(text(&drops), "; the kernel dropped 5 at ttb's transmit ring (TX dropped: read too late)");
        assert_eq!(since(&drops, &[("ttb".into(), 2)]), vec![("tta".to_string(), 0), ("ttb".to_string(), 3)]);
    }
}
