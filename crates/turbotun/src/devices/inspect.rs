//! Reading the state of TUN/TAP devices this process did not open: what `turbotun info` shows.
//!
//! Sources: `/sys/class/net/DEV/tun_flags|owner|group` (the tun driver's sysfs attributes), the `iff:` lines of
//! `/proc/*/fdinfo/*` (which processes hold queues), rtnetlink (MTU, state, addresses, counters) and
//! `SIOCETHTOOL` (active offload features, as `ethtool -k` shows them).

use std::fs;
use std::net::IpAddr;

use crate::configuration::netlink::{LinkInfo, LinkStats, Netlink};
use crate::devices::mode::Mode;
use crate::devices::offloads::Offloads;
use crate::error::{Error, Result};
use crate::sys::{self, iff};

/// One TUN/TAP device as the kernel describes it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeviceReport {
    /// The interface name.
    pub name: String,
    /// The interface index.
    pub index: u32,
    /// TUN or TAP.
    pub mode: Mode,
    /// `IFF_*` flags from `tun_flags` (the flags the device was created with).
    pub tun_flags: u32,
    /// `tun_flags` by name ([`flag_names`]).
    pub flag_names: Vec<&'static str>,
    /// The device outlives its last fd (`TUNSETPERSIST`).
    pub persist: bool,
    /// The user allowed to attach without CAP_NET_ADMIN, if one was set.
    pub owner: Option<u32>,
    /// The group allowed to attach without CAP_NET_ADMIN, if one was set.
    pub group: Option<u32>,
    /// Queues attached now: `IFLA_TUN_NUM_QUEUES` for a multiqueue device; the kernel reports that number only
    /// for those, so a single-queue device counts 1 when a process holds it (its carrier is on, which the kernel
    /// allows only while a queue is attached, or `/proc` shows a holder) and 0 otherwise.
    pub queues: u32,
    /// Queues detached with `TUNSETQUEUE` (`IFLA_TUN_NUM_DISABLED_QUEUES`).
    pub disabled_queues: u32,
    /// Pids of the processes holding a queue fd, one entry per fd, as far as `/proc` of this mount shows them.
    pub queue_holders: Vec<u32>,
    /// The MTU in bytes.
    pub mtu: u32,
    /// The length of the transmit queue, in packets.
    pub txqueuelen: u32,
    /// Whether the interface is administratively up.
    pub up: bool,
    /// RFC 2863 operational state (`UP`, `DOWN`, `UNKNOWN`, ...), see [`LinkInfo::oper_state`].
    pub oper_state: String,
    /// The hardware address (TAP only).
    pub mac: Option<[u8; 6]>,
    /// The bridge the device is a port of (`IFLA_MASTER`), by name.
    pub master: Option<String>,
    /// Whether the carrier is on (`IFLA_CARRIER`; off: `NO-CARRIER`, set with `TUNSETCARRIER` or
    /// `IFF_NO_CARRIER`).
    pub carrier: Option<bool>,
    /// The addresses on the interface, with their prefix lengths.
    pub addresses: Vec<(IpAddr, u8)>,
    /// The interface counters.
    pub stats: LinkStats,
    /// Offloads derived from the active netdev features (`None` if ethtool could not be asked).
    pub offloads: Option<Offloads>,
}

/// Names of the `IFF_*` bits the tun driver keeps in `tun_flags`.
pub fn flag_names(flags: u32) -> Vec<&'static str> {
    // IFF_NOFILTER shares its bit with IFF_NO_PI (it only means something for TUNSETTXFILTER), so it is not listed.
    let table: [(u16, &'static str); 12] = [
        (iff::TUN, "tun"),
        (iff::TAP, "tap"),
        (iff::NO_PI, "no_pi"),
        (iff::ONE_QUEUE, "one_queue"),
        (iff::VNET_HDR, "vnet_hdr"),
        (iff::MULTI_QUEUE, "multi_queue"),
        (iff::NAPI, "napi"),
        (iff::NAPI_FRAGS, "napi_frags"),
        (iff::NO_CARRIER, "no_carrier"),
        (iff::TUN_EXCL, "tun_excl"),
        (iff::PERSIST, "persist"),
        (iff::BACKPRESSURE, "backpressure"),
    ];
    table.iter().filter(|(bit, _)| flags & u32::from(*bit) != 0).map(|(_, n)| *n).collect()
}

/// Maps the netdev features the tun driver toggles on `TUNSETOFFLOAD` back to offload bits.
pub fn offloads_from_features(features: &[(String, bool)]) -> Offloads {
    let active = |name: &str| features.iter().any(|(n, on)| n == name && *on);
    let mut out = Offloads::NONE;
    if active("tx-checksum-ip-generic") {
        out |= Offloads::CSUM;
    }
    if active("tx-tcp-segmentation") {
        out |= Offloads::TSO4;
    }
    if active("tx-tcp6-segmentation") {
        out |= Offloads::TSO6;
    }
    if active("tx-tcp-ecn-segmentation") {
        out |= Offloads::TSO_ECN;
    }
    if active("tx-udp-segmentation") {
        out |= Offloads::USO4 | Offloads::USO6;
    }
    if active("tx-udp_tnl-segmentation") {
        out |= Offloads::UDP_TUNNEL_GSO;
    }
    if active("tx-udp_tnl-csum-segmentation") {
        out |= Offloads::UDP_TUNNEL_GSO_CSUM;
    }
    out
}

/// The active offloads of an interface, read through `SIOCETHTOOL`.
pub fn device_offloads(name: &str) -> Result<Offloads> {
    let features = sys::ethtool::features(name).map_err(|e| Error::io(format!("ethtool features of {name}"), e))?;
    Ok(offloads_from_features(&features))
}

fn read_sys(name: &str, attr: &str) -> Option<String> {
    fs::read_to_string(format!("/sys/class/net/{name}/{attr}")).ok().map(|s| s.trim().to_string())
}

/// Parses a `tun_flags` sysfs value (`0x1002`).
pub fn parse_tun_flags(text: &str) -> Option<u32> {
    u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

/// Pids of the processes holding a queue of `name` (one entry per fd), from `/proc/*/fdinfo`.
pub fn queue_holders(name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else { return out };
    for proc_entry in procs.flatten() {
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(fds) = fs::read_dir(proc_entry.path().join("fdinfo")) else { continue };
        for fd in fds.flatten() {
            let Ok(text) = fs::read_to_string(fd.path()) else { continue };
            if text.lines().any(|l| l.strip_prefix("iff:").is_some_and(|n| n.trim() == name)) {
                out.push(pid);
            }
        }
    }
    out
}

/// The processes holding a UDP socket bound to `port` (IPv4 or IPv6), one entry per process: `pid 123
/// (wireguard-go wg0)`. From `/proc/net/udp{,6}` (the socket's inode) and `/proc/*/fd`; what this process may not
/// read is left out.
pub fn udp_port_holders(port: u16) -> Vec<String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        let text = fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port =
                fields.get(1).and_then(|a| a.rsplit_once(':')).and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                inodes.extend(fields.get(9).map(|inode| format!("socket:[{inode}]")));
            }
        }
    }
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut pids = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else { return Vec::new() };
    for proc_entry in procs.flatten() {
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(fds) = fs::read_dir(proc_entry.path().join("fd")) else { continue };
        let holds = fds
            .flatten()
            .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str())));
        if holds {
            pids.push(pid);
        }
    }
    pids.into_iter().map(|pid| format!("pid {pid} ({})", process_command(pid))).collect()
}

/// The processes holding a queue of `name`, one entry per process: `pid 123 (turbotun fwd tta ttb)`.
pub fn queue_holder_processes(name: &str) -> Vec<String> {
    let mut pids = queue_holders(name);
    pids.dedup();
    pids.into_iter().map(|pid| format!("pid {pid} ({})", process_command(pid))).collect()
}

/// A process's command line, as `ps` shows it (its name alone if the command line cannot be read).
pub fn process_command(pid: u32) -> String {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let words: Vec<String> =
        cmdline.split(|&b| b == 0).filter(|w| !w.is_empty()).map(|w| String::from_utf8_lossy(w).into_owned()).collect();
    if words.is_empty() {
        return fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_string()).unwrap_or_default();
    }
    // The program by its file name, as ps does: `/usr/local/bin/turbotun fwd a b` reads `turbotun fwd a b`.
    let program = words[0].rsplit('/').next().unwrap_or(&words[0]).to_string();
    std::iter::once(program).chain(words[1..].iter().cloned()).collect::<Vec<_>>().join(" ")
}

/// The error for a link that exists and is not TUN/TAP, naming what it is.
pub(crate) fn not_tun_tap(link: &LinkInfo) -> Error {
    let kind =
        link.kind.clone().unwrap_or_else(|| if link.name == "lo" { "loopback".into() } else { "non-tun".into() });
    Error::NotTunTap { name: link.name.clone(), kind }
}

/// Reports one device by name.
pub fn inspect(netlink: &mut Netlink, name: &str) -> Result<DeviceReport> {
    let link = netlink.link(name)?;
    report(netlink, link)
}

/// The report of a device whose link attributes are at hand.
fn report(netlink: &mut Netlink, link: LinkInfo) -> Result<DeviceReport> {
    let Some(tun) = link.tun else {
        return Err(not_tun_tap(&link));
    };
    let name = link.name.as_str();
    // rtnetlink answers in the socket's namespace; sysfs only in the namespace that mounted /sys, and only it
    // has the flags netlink lacks (napi, napi_frags, no_carrier), so it adds to them when it sees this device.
    let sys_flags = read_sys(name, "ifindex")
        .filter(|idx| idx.parse::<u32>().ok() == Some(link.index))
        .and_then(|_| read_sys(name, "tun_flags"))
        .and_then(|s| parse_tun_flags(&s));
    let on = |cond: bool, bit: u16| if cond { u32::from(bit) } else { 0 };
    let tun_flags = sys_flags.unwrap_or(0)
        | on(tun.is_tap(), iff::TAP)
        | on(!tun.is_tap(), iff::TUN)
        | on(tun.no_pi, iff::NO_PI)
        | on(tun.vnet_hdr, iff::VNET_HDR)
        | on(tun.multi_queue, iff::MULTI_QUEUE)
        | on(tun.persist, iff::PERSIST);
    let mode = if tun.is_tap() { Mode::Tap } else { Mode::Tun };
    let holders = queue_holders(name);
    let master = link.master.map(|index| netlink.link_name(index).unwrap_or_else(|_| format!("#{index}")));
    Ok(DeviceReport {
        name: name.to_string(),
        index: link.index,
        mode,
        tun_flags,
        flag_names: flag_names(tun_flags),
        persist: tun.persist,
        owner: tun.owner,
        group: tun.group,
        queues: if tun.multi_queue {
            tun.num_queues
        } else {
            u32::from(link.carrier == Some(true) || !holders.is_empty())
        },
        disabled_queues: tun.num_disabled_queues,
        queue_holders: holders,
        mtu: link.mtu,
        txqueuelen: link.txqueuelen,
        up: link.is_up(),
        oper_state: link.oper_state.clone(),
        mac: if mode == Mode::Tap { link.mac } else { None },
        master,
        carrier: link.carrier,
        addresses: netlink.addresses_of(link.index)?,
        stats: link.stats,
        offloads: device_offloads(name).ok(),
    })
}

/// Reports every TUN/TAP device in the namespace of `netlink`, sorted by index.
pub fn inspect_all(netlink: &mut Netlink) -> Result<Vec<DeviceReport>> {
    let mut out = Vec::new();
    for link in netlink.links()? {
        if link.tun.is_some() {
            // Built from the dump itself: a device deleted since is reported as it was, never looked up again.
            out.push(report(netlink, link)?);
        }
    }
    out.sort_by_key(|r| r.index);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_tun_flags_and_names() {
        assert_eq!(parse_tun_flags("0x5002\n"), Some(0x5002));
        assert_eq!(parse_tun_flags("zz"), None);
        assert_eq!(flag_names(0x5002), vec!["tap", "no_pi", "vnet_hdr"]);
        assert_eq!(flag_names(0x1101), vec!["tun", "no_pi", "multi_queue"]);
    }

    #[test]
    fn test_offloads_from_features() {
        let f = |names: &[(&str, bool)]| names.iter().map(|(n, on)| (n.to_string(), *on)).collect::<Vec<_>>();
        let all = f(&[
            ("tx-checksum-ip-generic", true),
            ("tx-tcp-segmentation", true),
            ("tx-tcp6-segmentation", true),
            ("tx-tcp-ecn-segmentation", false),
            ("tx-udp-segmentation", true),
        ]);
        assert_eq!(offloads_from_features(&all), Offloads::TCP | Offloads::USO4 | Offloads::USO6);
        assert_eq!(offloads_from_features(&f(&[("tx-tcp-segmentation", false)])), Offloads::NONE);
        let tunnel = f(&[("tx-udp_tnl-segmentation", true), ("tx-udp_tnl-csum-segmentation", true)]);
        assert_eq!(offloads_from_features(&tunnel), Offloads::UDP_TUNNEL);
    }
}
