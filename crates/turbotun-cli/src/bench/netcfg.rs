//! Device configuration inside the run's namespaces through `turbotun::netlink::Netlink` (the library's own
//! rtnetlink client, so the bench exercises it too). The only place that talks to the kernel's link, address
//! and route tables.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use turbotun::netlink::Netlink;

/// One end of the path: a device in a namespace, its addresses and the routes through it.
#[derive(Debug)]
pub struct Side<'a> {
    pub ns: &'a str,
    pub dev: &'a str,
    pub addrs: Vec<(IpAddr, u8)>,
    /// Destination prefixes routed out of `dev` (the host part is masked off here).
    pub routes: Vec<(IpAddr, u8)>,
}

pub const MTU: u32 = 1500;

fn netns_path(ns: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{ns}"))
}

fn in_netns(ns: &str) -> Result<Netlink> {
    Netlink::in_netns(&netns_path(ns)).with_context(|| format!("netlink socket in namespace {ns}"))
}

/// Move a device from the root namespace into `/run/netns/NS`. Moving flushes its addresses and sets it down.
pub fn move_to_netns(dev: &str, ns: &str) -> Result<()> {
    let mut nl = Netlink::new().context("netlink socket")?;
    nl.move_to_netns(dev, &netns_path(ns)).with_context(|| format!("move {dev} to {ns}"))
}

/// MTU, addresses (IPv6 without DAD: the library adds them with IFA_F_NODAD), up, routes.
pub fn configure(side: &Side<'_>) -> Result<()> {
    let (ns, dev) = (side.ns, side.dev);
    let mut nl = in_netns(ns)?;
    nl.set_mtu(dev, MTU).with_context(|| format!("{ns}: mtu of {dev}"))?;
    for (addr, len) in &side.addrs {
        nl.add_address(dev, *addr, *len).with_context(|| format!("{ns}: {addr}/{len} on {dev}"))?;
    }
    nl.set_up(dev, true).with_context(|| format!("{ns}: {dev} up"))?;
    for (dest, len) in &side.routes {
        let net = mask(*dest, *len);
        nl.add_route(net, *len, dev).with_context(|| format!("{ns}: route {net}/{len} dev {dev}"))?;
    }
    Ok(())
}

/// The device's TX dropped counter (for a TUN device: packets the kernel dropped because the reader of the fd
/// was too slow — the ring's tail drop).
pub fn tx_dropped(ns: &str, dev: &str) -> Result<u64> {
    Ok(in_netns(ns)?.stats(dev).with_context(|| format!("{ns}: stats of {dev}"))?.tx_dropped)
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
