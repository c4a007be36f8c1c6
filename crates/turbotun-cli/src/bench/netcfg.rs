//! Device configuration inside the run's namespaces: the only place that talks to the kernel's link/address/
//! route tables, so swapping the `ip` commands for `turbotun::netlink::Netlink` is a change to this file only.

use std::net::IpAddr;

use anyhow::{Context, Result};

use super::topo::{ns_read, run_cmd};

/// One end of the path: a device in a namespace, its addresses and the routes through it.
#[derive(Debug)]
pub struct Side<'a> {
    pub ns: &'a str,
    pub dev: &'a str,
    pub addrs: Vec<(IpAddr, u8)>,
    /// Destination prefixes routed out of `dev` (the host part of the address is masked by the kernel).
    pub routes: Vec<(IpAddr, u8)>,
}

pub const MTU: u32 = 1500;

/// Move a device from the root namespace into `/run/netns/NS`. Moving flushes its addresses and sets it down.
pub fn move_to_netns(dev: &str, ns: &str) -> Result<()> {
    run_cmd("ip", &["link", "set", "dev", dev, "netns", ns]).map(drop)
}

/// MTU, up, addresses (IPv6 without DAD), routes.
pub fn configure(side: &Side<'_>) -> Result<()> {
    let ns = side.ns;
    let mtu = MTU.to_string();
    run_cmd("ip", &["-n", ns, "link", "set", "dev", side.dev, "mtu", &mtu])?;
    for (addr, len) in &side.addrs {
        let a = format!("{addr}/{len}");
        let mut args = vec!["-n", ns, "addr", "add", &a, "dev", side.dev];
        if addr.is_ipv6() {
            args.push("nodad");
        }
        run_cmd("ip", &args)?;
    }
    run_cmd("ip", &["-n", ns, "link", "set", "dev", side.dev, "up"])?;
    for (dest, len) in &side.routes {
        let net = mask(*dest, *len);
        let d = format!("{net}/{len}");
        let fam = if dest.is_ipv6() { "-6" } else { "-4" };
        run_cmd("ip", &["-n", ns, fam, "route", "replace", &d, "dev", side.dev])?;
    }
    Ok(())
}

/// The device's TX dropped counter (for a TUN device: packets the kernel dropped because the ring was full).
pub fn tx_dropped(ns: &str, dev: &str) -> Result<u64> {
    let s = ns_read(ns, &format!("/sys/class/net/{dev}/statistics/tx_dropped"))?;
    s.trim().parse().with_context(|| format!("tx_dropped of {dev}: {s:?}"))
}

fn mask(addr: IpAddr, len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len.min(32))) };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len.min(128))) };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(mask("10.0.2.1".parse().unwrap(), 24).to_string(), "10.0.2.0");
        assert_eq!(mask("fd00:2::1".parse().unwrap(), 64).to_string(), "fd00:2::");
        assert_eq!(mask("10.0.2.1".parse().unwrap(), 0).to_string(), "0.0.0.0");
    }
}
