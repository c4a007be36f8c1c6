//! Interface configuration through rtnetlink (no `ip` subprocesses): addresses, MTU, state, txqueuelen, MAC,
//! routes, moving to a network namespace, and link statistics.
//!
//! The API is synchronous: one `NETLINK_ROUTE` socket, one request at a time, each acknowledged before the call
//! returns, so an error names the request that failed.

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::Path;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo as NlLinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::error::{ConfigError, Error, Result};

pub(crate) mod error;
pub use error::NetlinkError;

/// Interface counters as the kernel keeps them (`IFLA_STATS64`). For a TUN/TAP device, `tx` is towards the
/// reader of the fd: `tx_dropped` counts packets the kernel dropped because the reader was too slow (tail drop).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkStats {
    /// Packets received by the interface (for TUN/TAP: written to a queue fd).
    pub rx_packets: u64,
    /// Packets sent by the interface (for TUN/TAP: queued towards the reader of a fd).
    pub tx_packets: u64,
    /// Bytes received, as counted with `rx_packets`.
    pub rx_bytes: u64,
    /// Bytes sent, as counted with `tx_packets`.
    pub tx_bytes: u64,
    /// Received packets the interface found faulty.
    pub rx_errors: u64,
    /// Packets the interface failed to send.
    pub tx_errors: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Packets dropped on the way out (for TUN/TAP: the reader was too slow).
    pub tx_dropped: u64,
}

/// What `RTM_GETLINK` tells about one interface.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LinkInfo {
    /// The interface index.
    pub index: u32,
    /// The interface name.
    pub name: String,
    /// The MTU in bytes.
    pub mtu: u32,
    /// The length of the transmit queue, in packets.
    pub txqueuelen: u32,
    /// `IFF_*` interface flags (`IFF_UP` = 1, `IFF_RUNNING` = 0x40, ...).
    pub flags: u32,
    /// `ARPHRD_*` link type (1 Ethernet, 0xfffe none: a TUN device).
    pub link_type: u16,
    /// The hardware address, if the interface has one of 6 bytes (TAP, veth; not TUN).
    pub mac: Option<[u8; 6]>,
    /// Link kind (`tun`, `veth`, ...), when the kernel reports one.
    pub kind: Option<String>,
    /// RFC 2863 operational state in upper case (`UP`, `DOWN`, `UNKNOWN`, `LOWERLAYERDOWN`, ...).
    pub oper_state: String,
    /// The interface counters.
    pub stats: LinkStats,
    /// The tun driver's own attributes (`IFLA_INFO_DATA` of kind `tun`), for TUN/TAP devices.
    pub tun: Option<TunInfo>,
    /// The index of the bridge (or other controller) the interface is attached to (`IFLA_MASTER`).
    pub master: Option<u32>,
    /// Whether the carrier is on (`IFLA_CARRIER`), when the kernel reports it.
    pub carrier: Option<bool>,
}

/// What the tun driver reports about a device through rtnetlink (`IFLA_TUN_*`). Unlike sysfs, this is
/// answered in the namespace of the netlink socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TunInfo {
    /// `IFF_TUN` (1) or `IFF_TAP` (2).
    pub kind: u8,
    /// `IFF_NO_PI`: packets carry no packet information header.
    pub no_pi: bool,
    /// `IFF_VNET_HDR`: packets carry a virtio header.
    pub vnet_hdr: bool,
    /// The device outlives its last fd (`TUNSETPERSIST`).
    pub persist: bool,
    /// `IFF_MULTI_QUEUE`.
    pub multi_queue: bool,
    /// Queues (fds) attached now.
    pub num_queues: u32,
    /// Queues detached with `TUNSETQUEUE`.
    pub num_disabled_queues: u32,
    /// The user allowed to attach without CAP_NET_ADMIN (`TUNSETOWNER`), if one was set.
    pub owner: Option<u32>,
    /// The group allowed to attach without CAP_NET_ADMIN (`TUNSETGROUP`), if one was set.
    pub group: Option<u32>,
}

impl TunInfo {
    /// Whether it is a TAP device (`kind` is `IFF_TAP`).
    pub fn is_tap(&self) -> bool {
        self.kind == libc::IFF_TAP as u8
    }
}

/// `IFLA_TUN_*` attribute types (`linux/if_link.h`). netlink-packet-route 0.34 has no variants for them and
/// hands every one over as `InfoTun::Other`.
mod ifla_tun {
    pub(super) const OWNER: u16 = 1;
    pub(super) const GROUP: u16 = 2;
    pub(super) const TYPE: u16 = 3;
    pub(super) const PI: u16 = 4;
    pub(super) const VNET_HDR: u16 = 5;
    pub(super) const PERSIST: u16 = 6;
    pub(super) const MULTI_QUEUE: u16 = 7;
    pub(super) const NUM_QUEUES: u16 = 8;
    pub(super) const NUM_DISABLED_QUEUES: u16 = 9;
}

fn tun_info(attrs: &[netlink_packet_route::link::InfoTun]) -> TunInfo {
    use netlink_packet_core::Nla;
    let mut info = TunInfo::default();
    for attr in attrs {
        let mut value = vec![0u8; attr.value_len()];
        attr.emit_value(&mut value);
        let u8v = value.first().copied().unwrap_or(0);
        let u32v = value.get(..4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
        match attr.kind() {
            ifla_tun::OWNER => info.owner = Some(u32v),
            ifla_tun::GROUP => info.group = Some(u32v),
            ifla_tun::TYPE => info.kind = u8v,
            // IFLA_TUN_PI is 1 when the packet information header is on (IFF_NO_PI clear).
            ifla_tun::PI => info.no_pi = u8v == 0,
            ifla_tun::VNET_HDR => info.vnet_hdr = u8v != 0,
            ifla_tun::PERSIST => info.persist = u8v != 0,
            ifla_tun::MULTI_QUEUE => info.multi_queue = u8v != 0,
            ifla_tun::NUM_QUEUES => info.num_queues = u32v,
            ifla_tun::NUM_DISABLED_QUEUES => info.num_disabled_queues = u32v,
            _ => {}
        }
    }
    info
}

impl LinkInfo {
    /// Whether the interface is administratively up (`IFF_UP`).
    pub fn is_up(&self) -> bool {
        self.flags & libc::IFF_UP as u32 != 0
    }
    /// Whether the link layer is up (`IFF_LOWER_UP`): carrier on. `ip link` shows `NO-CARRIER` for an interface
    /// that is up without it.
    pub fn is_lower_up(&self) -> bool {
        self.flags & libc::IFF_LOWER_UP as u32 != 0
    }
}

/// A `NETLINK_ROUTE` socket bound in one network namespace.
#[derive(Debug)]
pub struct Netlink {
    socket: Socket,
    seq: u32,
}

impl Netlink {
    /// A socket in the calling thread's network namespace.
    pub fn new() -> Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(|e| Error::io("opening a NETLINK_ROUTE socket", e))?;
        socket.bind_auto().map_err(|e| Error::io("binding a NETLINK_ROUTE socket", e))?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(|e| Error::io("connecting a NETLINK_ROUTE socket", e))?;
        // Ask for extended ACKs so that errors carry the kernel's message; older kernels refuse, which is fine.
        let _ = socket.set_ext_ack(true);
        Ok(Netlink { socket, seq: 1 })
    }

    /// A socket inside the network namespace named by `netns_file` (`/run/netns/NAME`, `/proc/PID/ns/net`).
    /// A socket stays in the namespace it was created in, so a short-lived thread enters the namespace, opens it
    /// and exits; the caller's own namespace is never changed.
    pub fn in_netns(netns_file: &Path) -> Result<Self> {
        crate::configuration::netns::with_netns(netns_file, Netlink::new)?
    }

    /// The index of the interface with this name.
    pub fn link_index(&mut self, name: &str) -> Result<u32> {
        Ok(self.link(name)?.index)
    }

    /// Everything `RTM_GETLINK` reports about one interface.
    pub fn link(&mut self, name: &str) -> Result<LinkInfo> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        let replies = self
            .request(RouteNetlinkMessage::GetLink(msg), NLM_F_REQUEST, &format!("looking up {name}"))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENODEV) => Error::NoSuchDevice { name: name.to_string() },
                _ => e,
            })?;
        replies
            .into_iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link_info(&link)),
                _ => None,
            })
            .ok_or_else(|| Error::NoSuchDevice { name: name.to_string() })
    }

    /// Every interface in the namespace.
    pub fn links(&mut self) -> Result<Vec<LinkInfo>> {
        let replies = self.request(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            NLM_F_REQUEST | NLM_F_DUMP,
            "listing links",
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link_info(&link)),
                _ => None,
            })
            .collect())
    }

    /// Interface counters (`IFLA_STATS64`).
    pub fn stats(&mut self, name: &str) -> Result<LinkStats> {
        Ok(self.link(name)?.stats)
    }

    /// Sets the interface up or down, as `ip link set NAME up|down` does.
    pub fn set_up(&mut self, name: &str, up: bool) -> Result<()> {
        let mut msg = self.link_message(name)?;
        msg.header.flags = if up { LinkFlags::Up } else { LinkFlags::empty() };
        msg.header.change_mask = LinkFlags::Up;
        self.ack(RouteNetlinkMessage::SetLink(msg), 0, &format!("setting {name} {}", if up { "up" } else { "down" }))
    }

    /// Sets the MTU in bytes.
    pub fn set_mtu(&mut self, name: &str, mtu: u32) -> Result<()> {
        self.set_link_attribute(name, LinkAttribute::Mtu(mtu), &format!("setting the MTU of {name} to {mtu}"))
    }

    /// Sets the length of the transmit queue, in packets (for TUN/TAP: how many the kernel holds for a reader).
    pub fn set_txqueuelen(&mut self, name: &str, len: u32) -> Result<()> {
        self.set_link_attribute(name, LinkAttribute::TxQueueLen(len), &format!("setting txqueuelen of {name} to {len}"))
    }

    /// The hardware address (TAP devices; a TUN device has none and the kernel refuses).
    pub fn set_mac(&mut self, name: &str, mac: [u8; 6]) -> Result<()> {
        let context = format!("setting the MAC address of {name} to {}", mac_to_string(&mac));
        self.set_link_attribute(name, LinkAttribute::Address(mac.to_vec()), &context)
    }

    /// Turns the carrier on or off through rtnetlink (`IFLA_CARRIER`), as `ip link set NAME carrier on|off`
    /// does; for a TUN/TAP device this is the same switch as `TUNSETCARRIER`, without holding one of its fds.
    pub fn set_carrier(&mut self, name: &str, on: bool) -> Result<()> {
        let context = format!("turning the carrier of {name} {}", if on { "on" } else { "off" });
        self.set_link_attribute(name, LinkAttribute::Carrier(u8::from(on)), &context)
    }

    /// Attaches the interface to a bridge (`IFLA_MASTER`), as `ip link set NAME master BRIDGE` does, or detaches
    /// it from whatever it is attached to with `None` (`nomaster`).
    pub fn set_master(&mut self, name: &str, bridge: Option<&str>) -> Result<()> {
        let (index, context) = match bridge {
            Some(bridge) => {
                let link = self.link(bridge)?;
                if link.kind.as_deref() != Some("bridge") {
                    return Err(Error::Config(ConfigError::Link {
                        why: format!(
                        "{bridge} is a {} device, not a bridge: give a bridge's name (`ip -d link show type bridge` \
                         lists them; `ip link add br0 type bridge` makes one)",
                        link.kind.as_deref().unwrap_or(if bridge == "lo" { "loopback" } else { "plain" })
                    ),
                    }));
                }
                (link.index, format!("attaching {name} to bridge {bridge}"))
            }
            None => (0, format!("detaching {name} from its bridge")),
        };
        self.set_link_attribute(name, LinkAttribute::Controller(index), &context)
    }

    /// The name of the interface with this index.
    pub fn link_name(&mut self, index: u32) -> Result<String> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let replies =
            self.request(RouteNetlinkMessage::GetLink(msg), NLM_F_REQUEST, &format!("looking up interface {index}"))?;
        replies
            .into_iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link_info(&link).name),
                _ => None,
            })
            .ok_or_else(|| Error::NoSuchDevice { name: format!("#{index}") })
    }

    /// Creates a Linux bridge (down, no ports), as `ip link add NAME type bridge` does.
    pub fn create_bridge(&mut self, name: &str) -> Result<()> {
        crate::error::validate_ifname(name)?;
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![NlLinkInfo::Kind(InfoKind::Bridge)]));
        self.ack(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL, &format!("creating bridge {name}"))
    }

    /// Moves the interface into the network namespace named by `netns_file`. The kernel flushes its addresses and
    /// sets it down; configure it again inside the namespace. Open queue fds stay attached.
    pub fn move_to_netns(&mut self, name: &str, netns_file: &Path) -> Result<()> {
        let ns = crate::configuration::netns::open_netns(netns_file)?;
        let context = format!("moving {name} to network namespace {}", netns_file.display());
        self.set_link_attribute(name, LinkAttribute::NetNsFd(ns.as_raw_fd()), &context)
    }

    /// Creates a veth pair in this socket's namespace, as `ip link add NAME type veth peer name PEER` does. Both
    /// ends start down; [`Netlink::move_to_netns`] puts one end elsewhere.
    pub fn create_veth(&mut self, name: &str, peer: &str) -> Result<()> {
        crate::error::validate_ifname(name)?;
        crate::error::validate_ifname(peer)?;
        let mut peer_msg = LinkMessage::default();
        peer_msg.attributes.push(LinkAttribute::IfName(peer.to_string()));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            NlLinkInfo::Kind(InfoKind::Veth),
            NlLinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
        ]));
        self.ack(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("creating veth pair {name} and {peer}"),
        )
    }

    /// Creates a VXLAN interface (point to point: one remote endpoint), as `ip link add NAME type vxlan id VNI
    /// remote R local L dev DEV dstport PORT` does; see [`Vxlan`] for the options. It starts down. This is how a
    /// host puts a VM's Ethernet frames into UDP; over a TAP device with [`crate::Offloads::UDP_TUNNEL`] the
    /// kernel hands such tunnel super-packets over whole.
    pub fn create_vxlan(&mut self, vxlan: &Vxlan) -> Result<()> {
        crate::error::validate_ifname(&vxlan.name)?;
        if vxlan.local.is_ipv4() != vxlan.remote.is_ipv4() {
            return Err(Error::Config(ConfigError::Link {
                why: format!(
                    "vxlan {}: local {} and remote {} are of different IP versions",
                    vxlan.name, vxlan.local, vxlan.remote
                ),
            }));
        }
        let mut data = vec![InfoVxlan::Id(vxlan.vni)];
        match (vxlan.local, vxlan.remote) {
            (IpAddr::V4(local), IpAddr::V4(remote)) => data.extend([InfoVxlan::Local(local), InfoVxlan::Group(remote)]),
            (IpAddr::V6(local), IpAddr::V6(remote)) => {
                data.extend([InfoVxlan::Local6(local), InfoVxlan::Group6(remote)])
            }
            _ => unreachable!("checked above"),
        }
        if let Some(dev) = &vxlan.dev {
            data.push(InfoVxlan::Link(self.link_index(dev)?));
        }
        data.extend([InfoVxlan::Port(vxlan.port), InfoVxlan::UDPCsum(vxlan.udp_csum)]);
        if vxlan.remote.is_ipv6() {
            data.push(InfoVxlan::UDPZeroCsumRX(vxlan.zero_csum6_rx));
        }
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(vxlan.name.clone()));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            NlLinkInfo::Kind(InfoKind::Vxlan),
            NlLinkInfo::Data(InfoData::Vxlan(data)),
        ]));
        let context = format!("creating vxlan {} (vni {}, remote {})", vxlan.name, vxlan.vni, vxlan.remote);
        self.ack(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL, &context)
    }

    /// Adds a permanent neighbour entry (`ip neigh add ADDR lladdr MAC dev DEV`): `addr` on `dev` is `mac`,
    /// without ARP or neighbour discovery.
    pub fn add_neighbour(&mut self, dev: &str, addr: IpAddr, mac: [u8; 6]) -> Result<()> {
        let mut msg = NeighbourMessage::default();
        msg.header.ifindex = self.link_index(dev)?;
        msg.header.state = NeighbourState::Permanent;
        msg.header.kind = RouteType::Unicast;
        let destination = match addr {
            IpAddr::V4(a) => {
                msg.header.family = AddressFamily::Inet;
                NeighbourAddress::Inet(a)
            }
            IpAddr::V6(a) => {
                msg.header.family = AddressFamily::Inet6;
                NeighbourAddress::Inet6(a)
            }
        };
        msg.attributes.push(NeighbourAttribute::Destination(destination));
        msg.attributes.push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        let context = format!("adding neighbour {addr} lladdr {} on {dev}", mac_to_string(&mac));
        self.ack(RouteNetlinkMessage::NewNeighbour(msg), NLM_F_CREATE | NLM_F_EXCL, &context)
    }

    /// Deletes an interface (`RTM_DELLINK`), as `ip link del` does.
    pub fn delete_link(&mut self, name: &str) -> Result<()> {
        let msg = self.link_message(name)?;
        self.ack(RouteNetlinkMessage::DelLink(msg), 0, &format!("deleting {name}"))
    }

    /// Adds an address. IPv6 addresses are added with `IFA_F_NODAD`: duplicate address detection on a
    /// point-to-point tunnel only delays the address by a second.
    pub fn add_address(&mut self, name: &str, addr: IpAddr, prefix_len: u8) -> Result<()> {
        let msg = self.address_message(name, addr, prefix_len)?;
        self.ack(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("adding {addr}/{prefix_len} to {name}"),
        )
    }

    /// Removes an address, given with the prefix length it was added with.
    pub fn del_address(&mut self, name: &str, addr: IpAddr, prefix_len: u8) -> Result<()> {
        let msg = self.address_message(name, addr, prefix_len)?;
        self.ack(RouteNetlinkMessage::DelAddress(msg), 0, &format!("removing {addr}/{prefix_len} from {name}"))
    }

    /// The addresses on an interface, with their prefix lengths.
    pub fn addresses(&mut self, name: &str) -> Result<Vec<(IpAddr, u8)>> {
        let index = self.link_index(name)?;
        self.addresses_of(index)
    }

    /// The addresses of the interface with this index (for a caller that has its [`LinkInfo`] already).
    pub fn addresses_of(&mut self, index: u32) -> Result<Vec<(IpAddr, u8)>> {
        let replies = self.request(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_REQUEST | NLM_F_DUMP,
            &format!("listing addresses of interface {index}"),
        )?;
        let mut out = Vec::new();
        for reply in replies {
            let RouteNetlinkMessage::NewAddress(msg) = reply else { continue };
            if msg.header.index != index {
                continue;
            }
            let addr = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(ip) = addr {
                out.push((ip, msg.header.prefix_len));
            }
        }
        Ok(out)
    }

    /// Adds a device route (`dest/prefix_len dev DEV`, scope link) to the main table.
    pub fn add_route(&mut self, dest: IpAddr, prefix_len: u8, dev: &str) -> Result<()> {
        let mut msg = route_message(dest, prefix_len, RouteHeader::RT_TABLE_MAIN, RouteScope::Link, RouteType::Unicast);
        msg.attributes.push(RouteAttribute::Oif(self.link_index(dev)?));
        self.add_route_message(msg, &format!("adding route {dest}/{prefix_len} dev {dev}"))
    }

    /// Adds a route through a gateway (`dest/prefix_len via GATEWAY`) to the main table: many addresses reached
    /// through one neighbour, without a neighbour entry each.
    pub fn add_route_via(&mut self, dest: IpAddr, prefix_len: u8, gateway: IpAddr) -> Result<()> {
        let mut msg =
            route_message(dest, prefix_len, RouteHeader::RT_TABLE_MAIN, RouteScope::Universe, RouteType::Unicast);
        msg.attributes.push(RouteAttribute::Gateway(RouteAddress::from(gateway)));
        self.add_route_message(msg, &format!("adding route {dest}/{prefix_len} via {gateway}"))
    }

    /// Makes every address of `dest/prefix_len` local (`ip route add local dest/prefix_len dev lo`): a socket may
    /// bind to or send from any of them, and what is sent to them is delivered here, without adding each address.
    pub fn add_local_route(&mut self, dest: IpAddr, prefix_len: u8) -> Result<()> {
        let mut msg = route_message(dest, prefix_len, RT_TABLE_LOCAL, RouteScope::Host, RouteType::Local);
        msg.attributes.push(RouteAttribute::Oif(self.link_index("lo")?));
        self.add_route_message(msg, &format!("adding local route {dest}/{prefix_len} dev lo"))
    }

    fn add_route_message(&mut self, msg: RouteMessage, context: &str) -> Result<()> {
        self.ack(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | NLM_F_EXCL, context)
    }

    fn link_message(&mut self, name: &str) -> Result<LinkMessage> {
        let index = self.link_index(name)?;
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        Ok(msg)
    }

    fn set_link_attribute(&mut self, name: &str, attr: LinkAttribute, context: &str) -> Result<()> {
        let mut msg = self.link_message(name)?;
        msg.attributes.push(attr);
        self.ack(RouteNetlinkMessage::SetLink(msg), 0, context)
    }

    fn address_message(&mut self, name: &str, addr: IpAddr, prefix_len: u8) -> Result<AddressMessage> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(Error::OutOfRange {
                what: "prefix length",
                value: prefix_len.into(),
                allowed: format!("0 to {max} for {addr}"),
            });
        }
        let index = self.link_index(name)?;
        let mut msg = AddressMessage::default();
        msg.header.family = family(addr);
        msg.header.prefix_len = prefix_len;
        msg.header.scope = AddressScope::Universe;
        msg.header.index = index;
        msg.attributes.push(AddressAttribute::Address(addr));
        match addr {
            IpAddr::V4(_) => msg.attributes.push(AddressAttribute::Local(addr)),
            IpAddr::V6(_) => msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad)),
        }
        Ok(msg)
    }

    fn ack(&mut self, msg: RouteNetlinkMessage, extra_flags: u16, context: &str) -> Result<()> {
        self.request(msg, NLM_F_REQUEST | NLM_F_ACK | extra_flags, context).map(|_| ())
    }

    /// Sends one request and collects the replies up to the ACK (or `NLMSG_DONE` for a dump).
    fn request(&mut self, msg: RouteNetlinkMessage, flags: u16, context: &str) -> Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0).map_err(|e| netlink_error(context, e))?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let want_ack = flags & NLM_F_ACK != 0;
        let mut replies = Vec::new();
        loop {
            let (data, _) = self.socket.recv_from_full().map_err(|e| netlink_error(context, e))?;
            let mut offset = 0;
            while offset < data.len() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..]).map_err(|e| {
                    netlink_error(context, std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
                })?;
                let len = reply.header.length as usize;
                if len == 0 {
                    break;
                }
                offset += (len + 3) & !3;
                if reply.header.sequence_number != seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::Error(err) => match err.code {
                        None => return Ok(replies),
                        Some(code) => {
                            return Err(netlink_error(context, std::io::Error::from_raw_os_error(-code.get())))
                        }
                    },
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::InnerMessage(inner) => {
                        replies.push(inner);
                        if !dump && !want_ack {
                            return Ok(replies);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

fn family(addr: IpAddr) -> AddressFamily {
    match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn netlink_error(context: &str, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => Error::PermissionDenied { action: context.to_string(), source: e },
        _ => NetlinkError { context: context.to_string(), source: e }.into(),
    }
}

fn link_info(msg: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        index: msg.header.index,
        flags: msg.header.flags.bits(),
        link_type: u16::from(msg.header.link_layer_type),
        ..LinkInfo::default()
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(name) => info.name = name.clone(),
            LinkAttribute::Mtu(mtu) => info.mtu = *mtu,
            LinkAttribute::TxQueueLen(len) => info.txqueuelen = *len,
            LinkAttribute::Address(mac) if mac.len() == 6 => {
                let mut m = [0u8; 6];
                m.copy_from_slice(mac);
                info.mac = Some(m);
            }
            LinkAttribute::OperState(state) => info.oper_state = format!("{state:?}").to_uppercase(),
            LinkAttribute::Controller(index) if *index != 0 => info.master = Some(*index),
            LinkAttribute::Carrier(on) => info.carrier = Some(*on != 0),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        NlLinkInfo::Kind(kind) => info.kind = Some(kind.to_string()),
                        NlLinkInfo::Data(netlink_packet_route::link::InfoData::Tun(attrs)) => {
                            info.tun = Some(tun_info(attrs))
                        }
                        _ => {}
                    }
                }
            }
            LinkAttribute::Stats64(s) => {
                info.stats = LinkStats {
                    rx_packets: s.rx_packets,
                    tx_packets: s.tx_packets,
                    rx_bytes: s.rx_bytes,
                    tx_bytes: s.tx_bytes,
                    rx_errors: s.rx_errors,
                    tx_errors: s.tx_errors,
                    rx_dropped: s.rx_dropped,
                    tx_dropped: s.tx_dropped,
                }
            }
            _ => {}
        }
    }
    info
}

/// A point-to-point VXLAN interface for [`Netlink::create_vxlan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vxlan {
    /// Interface name.
    pub name: String,
    /// VXLAN network identifier (24 bits).
    pub vni: u32,
    /// Outer source address.
    pub local: IpAddr,
    /// The one remote endpoint (outer destination address).
    pub remote: IpAddr,
    /// The underlying device the outer packets leave through, if one is to be named.
    pub dev: Option<String>,
    /// Outer UDP destination port (4789 is IANA's).
    pub port: u16,
    /// Outer UDP checksums over IPv4 (`udpcsum`).
    pub udp_csum: bool,
    /// Over IPv6: accept outer UDP datagrams with a zero checksum (`udp6zerocsumrx`).
    pub zero_csum6_rx: bool,
}

impl Vxlan {
    /// VNI `vni` from `local` to `remote` on port 4789 with outer UDP checksums.
    pub fn new(name: impl Into<String>, vni: u32, local: IpAddr, remote: IpAddr) -> Self {
        Vxlan { name: name.into(), vni, local, remote, dev: None, port: 4789, udp_csum: true, zero_csum6_rx: false }
    }
}

/// The kernel's table of local and broadcast routes (`RT_TABLE_LOCAL`; the crate names only the main table).
const RT_TABLE_LOCAL: u8 = 255;

/// A route to `dest/prefix_len` in `table`, as `ip route` adds it (protocol boot), without its output.
fn route_message(dest: IpAddr, prefix_len: u8, table: u8, scope: RouteScope, kind: RouteType) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header.address_family = family(dest);
    msg.header.destination_prefix_length = prefix_len;
    msg.header.table = table;
    msg.header.protocol = RouteProtocol::Boot;
    msg.header.scope = scope;
    msg.header.kind = kind;
    msg.attributes.push(RouteAttribute::Destination(RouteAddress::from(dest)));
    msg
}

/// Formats a MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn mac_to_string(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test suite's skip rule, the same file the integration tests include (where it must be `pub`).
    #[allow(unreachable_pub)]
    mod skip {
        include!("../../tests/common/skip.rs");
    }

    /// A veth pair is created with both names, and one end can be moved to another namespace. Runs in private
    /// namespaces; skipped without the privileges for them (a failure under CI=true).
    #[test]
    fn veth_pair_created_and_moved() {
        let ran = crate::configuration::netns::with_private_netns(|| {
            let mut nl = Netlink::new().unwrap();
            nl.create_veth("ttveth0", "ttveth1").unwrap();
            assert_eq!(nl.link("ttveth0").unwrap().kind.as_deref(), Some("veth"));
            assert_eq!(nl.link("ttveth1").unwrap().kind.as_deref(), Some("veth"));
            let err = nl.create_veth("ttveth0", "ttveth2").unwrap_err();
            assert!(err.to_string().contains("creating veth pair ttveth0 and ttveth2"), "{err}");
            assert!(nl.create_veth("a-name-far-too-long", "ttveth3").is_err());
            // A second private namespace, kept alive by this fd once its thread has ended.
            let other = crate::configuration::netns::with_private_netns(|| {
                std::fs::File::open("/proc/thread-self/ns/net").unwrap()
            })
            .unwrap();
            let other_path = std::path::PathBuf::from(format!("/proc/self/fd/{}", other.as_raw_fd()));
            nl.move_to_netns("ttveth1", &other_path).unwrap();
            assert!(matches!(nl.link("ttveth1"), Err(Error::NoSuchDevice { .. })));
            assert!(Netlink::in_netns(&other_path).unwrap().link("ttveth1").is_ok());
        });
        if let Err(e) = ran {
            skip::cannot_run("veth_pair_created_and_moved", &format!("needs root: {e}"));
        }
    }
}
