//! A jailed VM monitor's network device: it receives a TUN/TAP queue fd from a privileged parent, then runs
//! with no privilege and no netlink (a seccomp filter refuses `AF_NETLINK` sockets, as a monitor's jail would)
//! and plays the guest's side with the fd alone: the offloads the "guest" acknowledged set at run time, frames
//! read into a descriptor chain of guest memory and written from one, the MTU read with the classic ioctl.
//!
//! `jailed_monitor SOCKET USER`: listens on SOCKET (which must not exist) for one device's queues handed over
//! with `turbotun::handover::send_queues_and_wait` (or `turbotun open --send-to SOCKET --to-user ...`), then
//! drops to USER and answers every UDP datagram routed into the device by swapping its addresses and ports, until
//! killed. Prints `ready` once listening, then one line per fact it checked.

use std::io::{IoSlice, IoSliceMut};
use std::time::Duration;

use turbotun::handover::{Accepted, QueueListener};
use turbotun::privilege::{drop_to, UserSpec};
use turbotun::wire::virtio_net::features;
use turbotun::wire::{ipv4, udp, VirtioNetHdrRepr};
use turbotun::{Offloads, StopHandle};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: jailed_monitor SOCKET USER")?;
    let user = UserSpec::new(args.next().ok_or("usage: jailed_monitor SOCKET USER")?).resolve()?;
    let listener = QueueListener::bind(path.as_ref())?;
    println!("ready");
    let queue = loop {
        match listener.accept(&StopHandle::new(), Duration::from_secs(10), |_, _| Ok(()))? {
            Accepted::Device { mut queues, .. } => break queues.remove(0),
            Accepted::Refused(e) => eprintln!("jailed_monitor: {e}"),
            _ => return Err("stopped".into()),
        }
    };
    drop(listener);

    // The jail: no netlink from here on, and no privilege.
    deny_netlink()?;
    drop_to(&user)?;
    let netlink = turbotun::netlink::Netlink::new().err().map_or("allowed".to_string(), |e| e.to_string());
    println!("netlink: {netlink}");
    println!("uid: {}", nix_uid());

    // The guest acknowledged checksum and TCP segmentation offload, nothing else.
    let acked = features::bit(features::GUEST_CSUM) | features::bit(features::GUEST_TSO4);
    queue.set_offloads(Offloads::for_guest_features(acked))?;
    println!("offloads: {}", queue.offloads());
    println!("mtu: {}", queue.mtu()?);

    // Guest memory and a receive chain over it: the virtio header, then the packet across three descriptors.
    let hdr_len = queue.vnet_hdr_len();
    let mut guest = vec![0u8; 8192];
    loop {
        let n = {
            let (head, rest) = guest.split_at_mut(hdr_len);
            let (a, rest) = rest.split_at_mut(100);
            let (b, c) = rest.split_at_mut(1000);
            queue.recv_vectored(&mut [
                IoSliceMut::new(head),
                IoSliceMut::new(a),
                IoSliceMut::new(b),
                IoSliceMut::new(c),
            ])?
        };
        let hdr = VirtioNetHdrRepr::parse(&guest[..hdr_len])?;
        let packet = &mut guest[hdr_len..n];
        if hdr.is_gso() || !answer_udp4(packet) {
            continue;
        }
        // The transmit chain: header and packet from two places of guest memory.
        let (head, packet) = guest[..n].split_at(hdr_len);
        let (a, b) = packet.split_at(packet.len() / 2);
        queue.send_vectored(&[IoSlice::new(head), IoSlice::new(a), IoSlice::new(b)])?;
        println!("answered {} bytes", n - hdr_len);
    }
}

/// A seccomp filter on this thread (the only one) that fails `socket(AF_NETLINK, ...)` with `EPERM`.
fn deny_netlink() -> Result<(), Box<dyn std::error::Error>> {
    use seccompiler::{SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule};
    let family = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)?;
    let rules = [(libc::SYS_socket, vec![SeccompRule::new(vec![family])?])].into_iter().collect();
    let arch = std::env::consts::ARCH.try_into()?;
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)?;
    let program: seccompiler::BpfProgram = filter.try_into()?;
    seccompiler::apply_filter(&program)?;
    Ok(())
}

fn nix_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(str::to_string)))
        .and_then(|l| l.split_whitespace().next().and_then(|u| u.parse().ok()))
        .unwrap_or(u32::MAX)
}

/// Swaps the addresses and ports of an IPv4 UDP datagram in place (no checksum changes).
fn answer_udp4(packet: &mut [u8]) -> bool {
    let Ok(mut ip) = ipv4::Packet::new_checked(&mut *packet) else { return false };
    if ip.protocol() != turbotun::wire::IPPROTO_UDP || ip.is_fragment() {
        return false;
    }
    let (src, dst, l4) = (ip.src_addr(), ip.dst_addr(), ip.header_len());
    ip.set_src_addr(dst);
    ip.set_dst_addr(src);
    let Ok(mut datagram) = udp::Packet::new_checked(&mut packet[l4..]) else { return false };
    let (sp, dp) = (datagram.src_port(), datagram.dst_port());
    datagram.set_src_port(dp);
    datagram.set_dst_port(sp);
    true
}
