//! The run's namespaces and device configuration, through the library (`turbotun::netns` and
//! `turbotun::netlink::Netlink`, so the bench exercises them too): no `ip` or `sysctl` processes. The only place
//! that talks to the kernel's link, address and route tables.
//!
//! The namespaces are private: made with `unshare` on a short-lived thread and held by an fd, never mounted
//! under `/run/netns`. The kernel destroys one, with every device in it, once its fd is closed and no process is
//! left inside, so a bench that dies, even by SIGKILL, leaves no namespace to sweep.

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command};

use anyhow::{Context, Result};
use turbotun::netlink::{Netlink, Vxlan};

/// A private network namespace, alive while this value (or a process inside) is.
#[derive(Debug)]
pub struct Netns {
    /// Label for messages and device names (`tt<pid>r<run>a`); the kernel knows no name for it.
    pub name: String,
    fd: OwnedFd,
}

impl Netns {
    /// A fresh namespace with its loopback up.
    pub fn new(name: String) -> Result<Netns> {
        let file = turbotun::netns::with_private_netns(|| File::open("/proc/thread-self/ns/net"))
            .with_context(|| format!("create network namespace {name}"))?
            .with_context(|| format!("open network namespace {name}"))?;
        Ok(Netns { name, fd: file.into() })
    }

    /// A namespace held elsewhere, by `fd` (an fd of `/proc/.../ns/net`).
    pub fn from_fd(name: String, fd: OwnedFd) -> Netns {
        Netns { name, fd }
    }

    /// A path that names the namespace for `setns` and `IFLA_NET_NS_FD`: the magic link of our own fd, which
    /// opens the namespace itself.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Runs `f` on a thread inside the namespace.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        turbotun::netns::with_netns(&self.path(), f).with_context(|| format!("enter network namespace {}", self.name))
    }

    /// Starts `cmd` inside the namespace: a child inherits the namespace of the thread that spawns it.
    pub fn spawn(&self, cmd: &mut Command) -> Result<Child> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        self.run(|| cmd.spawn())?.with_context(|| format!("start {program} in {}", self.name))
    }

    /// A file of the namespace's `/proc/net` (`snmp`, `tcp6`, ...). `/proc/net` is `/proc/self/net`, the
    /// namespace of the process's main thread; `/proc/thread-self/net` is the calling thread's.
    pub fn read_proc_net(&self, file: &str) -> Result<String> {
        let path = format!("/proc/thread-self/net/{file}");
        self.run(|| std::fs::read_to_string(&path))?.with_context(|| format!("{}: read /proc/net/{file}", self.name))
    }

    /// Writes sysctls (`net.ipv4.conf.all.rp_filter`, "0"): the `net.*` tree under `/proc/sys` belongs to the
    /// namespace of the thread that opens it.
    pub fn set_sysctls(&self, settings: &[(&str, &str)]) -> Result<()> {
        self.run(|| {
            for (key, value) in settings {
                std::fs::write(sysctl_path(key), value)
                    .with_context(|| format!("{}: sysctl {key}={value}", self.name))?;
            }
            Ok(())
        })?
    }

    /// A netlink socket inside the namespace.
    pub fn netlink(&self) -> Result<Netlink> {
        Netlink::in_netns(&self.path()).with_context(|| format!("netlink socket in namespace {}", self.name))
    }
}

fn sysctl_path(key: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(key.replace('.', "/"))
}

/// One end of the path: a device in a namespace, its addresses and the routes through it.
#[derive(Debug)]
pub(crate) struct Side<'a> {
    pub ns: &'a Netns,
    pub dev: &'a str,
    /// The device's MTU (the bench's [`MTU`] but for a tunnel's devices).
    pub mtu: u32,
    pub addrs: Vec<(IpAddr, u8)>,
    /// Destination prefixes routed out of `dev` (the host part is masked off here).
    pub routes: Vec<(IpAddr, u8)>,
    /// The device's queue length (`IFLA_TXQLEN`), if it is to be set; for a TUN device, the ring's length.
    pub txqueuelen: Option<u32>,
}

pub(crate) const MTU: u32 = 1500;

/// A veth pair from `dev_a` in `a` to `dev_b` in `b`: created in `a`, then one end moved.
pub(crate) fn create_veth(a: &Netns, dev_a: &str, b: &Netns, dev_b: &str) -> Result<()> {
    let mut nl = a.netlink()?;
    nl.create_veth(dev_a, dev_b).with_context(|| format!("{}: veth {dev_a} to {dev_b}", a.name))?;
    nl.move_to_netns(dev_b, &b.path()).with_context(|| format!("move {dev_b} from {} to {}", a.name, b.name))
}

/// A point-to-point VXLAN device `name` in `ns` (VNI `vni`, the IANA port 4789), its outer packets from `local`
/// to `remote` leaving through `underlay`; left down and without an address.
pub(crate) fn create_vxlan(
    ns: &Netns,
    name: &str,
    vni: u32,
    local: IpAddr,
    remote: IpAddr,
    underlay: &str,
) -> Result<()> {
    let vxlan = Vxlan { dev: Some(underlay.to_string()), ..Vxlan::new(name, vni, local, remote) };
    ns.netlink()?.create_vxlan(&vxlan).with_context(|| format!("{}: vxlan {name} to {remote}", ns.name))
}

/// A bridge `name` in `ns` with `ports` attached, everything up (the ports at the bench's MTU).
pub(crate) fn bridge(ns: &Netns, name: &str, ports: &[&str]) -> Result<()> {
    let mut nl = ns.netlink()?;
    nl.create_bridge(name).with_context(|| format!("{}: bridge {name}", ns.name))?;
    for port in ports {
        nl.set_mtu(port, MTU).with_context(|| format!("{}: mtu of {port}", ns.name))?;
        nl.set_master(port, Some(name)).with_context(|| format!("{}: {port} into {name}", ns.name))?;
        nl.set_up(port, true).with_context(|| format!("{}: {port} up", ns.name))?;
    }
    nl.set_up(name, true).with_context(|| format!("{}: {name} up", ns.name))
}

/// Move a device between namespaces. Moving flushes its addresses and sets it down.
pub(crate) fn move_to_netns(from: &Netns, dev: &str, to: &Netns) -> Result<()> {
    from.netlink()?
        .move_to_netns(dev, &to.path())
        .with_context(|| format!("move {dev} from {} to {}", from.name, to.name))
}

/// MTU, addresses (IPv6 without DAD: the library adds them with IFA_F_NODAD), up, routes.
pub(crate) fn configure(side: &Side<'_>) -> Result<()> {
    let (ns, dev) = (&side.ns.name, side.dev);
    let mut nl = side.ns.netlink()?;
    nl.set_mtu(dev, side.mtu).with_context(|| format!("{ns}: mtu {} of {dev}", side.mtu))?;
    if let Some(len) = side.txqueuelen {
        nl.set_txqueuelen(dev, len).with_context(|| format!("{ns}: txqueuelen {len} of {dev}"))?;
    }
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
pub(crate) fn tx_dropped(ns: &Netns, dev: &str) -> Result<u64> {
    Ok(ns.netlink()?.stats(dev).with_context(|| format!("{}: stats of {dev}", ns.name))?.tx_dropped)
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

    #[test]
    fn sysctl_paths() {
        assert_eq!(sysctl_path("net.ipv4.conf.all.rp_filter"), PathBuf::from("/proc/sys/net/ipv4/conf/all/rp_filter"));
    }
}
