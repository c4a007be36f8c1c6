//! Adopting tun fds opened elsewhere and handing queues over a Unix socket, on real devices, each test in its
//! own private network namespace.

mod common;

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use turbotun::handover::{recv_queues, recv_queues_with_header, send_queues, HandoverHeader};
use turbotun::netlink::Netlink;
use turbotun::{DeviceBuilder, Mode, Offloads, Queue};

const T: Duration = Duration::from_secs(5);
const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 9, 1, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 9, 1, 2);

fn dup(fd: BorrowedFd<'_>) -> OwnedFd {
    fd.try_clone_to_owned().expect("dup")
}

/// Whether an fd number is still open in this process.
fn is_open(raw: i32) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{raw}")).is_ok()
}

/// The fd alone tells the name, TUN or TAP and the virtio header size; the offloads are the caller's word.
#[test]
fn from_fd_learns_name_mode_and_header_size_from_the_fd() {
    in_netns("from_fd_learns_name_mode_and_header_size_from_the_fd", || {
        let name = unique_name("tho");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(10).offloads(Offloads::ALL).queues(2).open().unwrap();
        for q in dev.queues() {
            let adopted = Queue::from_fd(dup(q.as_fd()), dev.offloads()).unwrap();
            assert_eq!(adopted.name(), name);
            assert_eq!(adopted.mode(), Mode::Tun);
            assert_eq!(adopted.vnet_hdr_len(), 10);
            assert_eq!(adopted.offloads(), dev.offloads(), "as stated");
            assert!(adopted.receives_super_packets());
        }

        let name = unique_name("tho");
        let tap = DeviceBuilder::tap().name(&name).open().unwrap();
        let adopted = Queue::from_fd(dup(tap.queues()[0].as_fd()), Offloads::NONE).unwrap();
        assert_eq!((adopted.name(), adopted.mode(), adopted.vnet_hdr_len()), (name.as_str(), Mode::Tap, 0));
        let err = Queue::from_fd(dup(tap.queues()[0].as_fd()), Offloads::TCP).unwrap_err().to_string();
        assert!(err.contains("has no virtio header, so it can have no offloads"), "{err}");

        for size in turbotun::device::VNET_HDR_SIZES {
            let name = unique_name("tho");
            let dev = DeviceBuilder::tap().name(&name).vnet_hdr(size).offloads(Offloads::TCP).open().unwrap();
            let adopted = Queue::from_fd(dup(dev.queues()[0].as_fd()), Offloads::TCP).unwrap();
            assert_eq!((adopted.mode(), adopted.vnet_hdr_len()), (Mode::Tap, size));
        }
    });
}

/// An fd is adopted with no netlink and no ethtool: here in a network namespace where its device is not visible,
/// so any lookup by name would fail.
#[test]
fn from_fd_outside_the_devices_namespace() {
    in_netns("from_fd_outside_the_devices_namespace", || {
        let name = unique_name("thn");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(12).offloads(Offloads::TCP).open().unwrap();
        let fd = dup(dev.queues()[0].as_fd());
        turbotun::netns::with_private_netns(move || {
            let q = Queue::from_fd(fd, Offloads::TCP).unwrap();
            assert_eq!((q.name(), q.vnet_hdr_len(), q.offloads()), (name.as_str(), 12, Offloads::TCP));
        })
        .unwrap();
    });
}

/// Found by review: facts about a received fd were looked up by its device's name in the receiver's namespace, so
/// a different device of that name there (here one without a virtio header and with no offloads) replaced the
/// sender's settings. They come from the fd and the sender's header now.
#[test]
fn a_received_fd_is_described_by_itself_and_its_sender_not_by_name() {
    in_netns("a_received_fd_is_described_by_itself_and_its_sender_not_by_name", || {
        let name = unique_name("ths");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(10).offloads(Offloads::ALL).open().unwrap();
        let (tx, rx) = UnixStream::pair().unwrap();
        send_queues(&tx, &[&dev.queues()[0]]).unwrap();
        let name2 = name.clone();
        turbotun::netns::with_private_netns(move || {
            // The receiver's namespace has its own device of that name: TAP, no virtio header, no offloads.
            let _decoy = DeviceBuilder::tap().name(&name2).open().unwrap();
            let (header, queues) = recv_queues_with_header(&rx).unwrap();
            assert_eq!(header.name, name2);
            let q = &queues[0];
            assert_eq!((q.mode(), q.vnet_hdr_len()), (Mode::Tun, 10), "from TUNGETIFF and TUNGETVNETHDRSZ");
            assert_eq!(q.offloads(), header.offloads, "from the sender");
            assert!(q.offloads().contains(Offloads::TSO4));
        })
        .unwrap();
    });
}

/// The adopted duplicate carries traffic; dropping it leaves the caller's fd open and working.
#[test]
fn from_borrowed_fd_keeps_the_callers_fd() {
    in_netns("from_borrowed_fd_keeps_the_callers_fd", || {
        let name = unique_name("thb");
        let dev = DeviceBuilder::tun().name(&name).open().unwrap();
        configure_v4(&name, LOCAL, 24);
        let original = &dev.queues()[0];
        let adopted = Queue::from_borrowed_fd(original.as_fd(), Offloads::NONE).unwrap();
        assert_ne!(adopted.as_raw_fd(), original.as_raw_fd(), "a duplicate, not the caller's fd");
        assert_eq!((adopted.name(), adopted.mode(), adopted.vnet_hdr_len()), (name.as_str(), Mode::Tun, 0));

        let sock = UdpSocket::bind((LOCAL, 0)).unwrap();
        sock.send_to(b"through the adopted fd", (PEER, 9999)).unwrap();
        let mut buf = vec![0u8; 2048];
        let n = recv_matching(&adopted, &mut buf, T, |p| parse_ipv4_udp(p).is_some_and(|(_, _, _, dp, _)| dp == 9999));
        assert_eq!(parse_ipv4_udp(&buf[..n]).unwrap().4, b"through the adopted fd");

        assert_eq!(common::fds_of(&name), 2, "the caller's fd and the duplicate");
        drop(adopted);
        assert_eq!(common::fds_of(&name), 1, "the duplicate was closed");
        assert!(is_open(original.as_raw_fd()), "the caller's fd stays open");
        original.sndbuf().expect("the caller's queue still works");
        sock.send_to(b"still here", (PEER, 9999)).unwrap();
        let n = recv_matching(original, &mut buf, T, |p| parse_ipv4_udp(p).is_some_and(|(_, _, _, dp, _)| dp == 9999));
        assert_eq!(parse_ipv4_udp(&buf[..n]).unwrap().4, b"still here");
    });
}

#[test]
fn from_fd_refuses_what_is_not_a_tun_queue() {
    let (read_end, _write_end) = rustix::pipe::pipe().unwrap();
    let err = Queue::from_fd(read_end, Offloads::NONE).unwrap_err().to_string();
    assert!(err.contains("is not a TUN/TAP queue") && err.contains("pipe:["), "{err}");
    let (a, _b) = UnixStream::pair().unwrap();
    let err = Queue::from_borrowed_fd(a.as_fd(), Offloads::NONE).unwrap_err().to_string();
    assert!(err.contains("is not a TUN/TAP queue") && err.contains("socket:["), "{err}");
    assert!(is_open(a.as_raw_fd()), "a refused borrowed fd stays open");
    let null = std::fs::File::open("/dev/null").unwrap();
    let err = Queue::from_fd(null.into(), Offloads::NONE).unwrap_err().to_string();
    assert!(err.contains("is not a TUN/TAP queue") && err.contains("/dev/null"), "{err}");
    in_netns("from_fd_refuses_an_unattached_tun_fd", || {
        let tun = std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun").unwrap();
        let err = Queue::from_fd(tun.into(), Offloads::NONE).unwrap_err().to_string();
        assert!(err.contains("attached to no device"), "{err}");
    });
}

/// Two queues of a device cross a socket pair; the receiver's queues keep the device alive after the sender's
/// device is dropped, and they carry its traffic.
#[test]
fn send_and_recv_queues() {
    in_netns("send_and_recv_queues", || {
        let name = unique_name("ths");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(10).offloads(Offloads::ALL).queues(2).open().unwrap();
        let granted = dev.offloads();
        let (tx, rx) = UnixStream::pair().unwrap();
        send_queues(&tx, &dev.queues().iter().collect::<Vec<_>>()).unwrap();
        drop(dev);
        let (header, queues) = recv_queues_with_header(&rx).unwrap();
        assert_eq!(header.name, name);
        assert_eq!((header.mode, header.vnet_hdr_len, header.queues, header.offloads), (Mode::Tun, 10, 2, granted));
        assert_eq!(queues.len(), 2);
        for (i, q) in queues.iter().enumerate() {
            assert_eq!((q.name(), q.index(), q.mode(), q.vnet_hdr_len()), (name.as_str(), i, Mode::Tun, 10));
            assert_eq!(q.offloads(), granted);
        }
        let tun = Netlink::new().unwrap().link(&name).expect("the device lives on").tun.unwrap();
        assert_eq!(tun.num_queues, 2, "both queues attached, held by the receiver");
        // The offloads are the device's: renegotiated through one received queue, the other sees it too.
        queues[0].set_offloads(Offloads::CSUM).unwrap();
        assert_eq!(queues[1].offloads(), Offloads::CSUM);
        assert!(!queues[1].receives_super_packets());

        // Mixing devices in one hand-over is refused before anything is sent.
        let other = DeviceBuilder::tun().name(unique_name("ths")).open().unwrap();
        let err = send_queues(&tx, &[&queues[0], &other.queues()[0]]).unwrap_err().to_string();
        assert!(err.contains("one device's queues"), "{err}");
    });
}

/// Sends `header` bytes with `fds` attached, as a peer that does not play by the rules would.
fn send_raw(socket: &UnixStream, header: &[u8], fds: &[BorrowedFd<'_>]) {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    rustix::net::sendmsg(socket, &[IoSlice::new(header)], &mut control, SendFlags::empty()).unwrap();
}

#[test]
fn recv_queues_trusts_nothing() {
    in_netns("recv_queues_trusts_nothing", || {
        let name = unique_name("tht");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(10).offloads(Offloads::TCP).open().unwrap();
        let q = dev.queues()[0].as_fd();
        let good = HandoverHeader {
            name: name.clone(),
            mode: Mode::Tun,
            vnet_hdr_len: 10,
            offloads: Offloads::TCP,
            queues: 1,
        };
        let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
        let cases: Vec<(Vec<u8>, Vec<BorrowedFd<'_>>, &str)> = vec![
            (b"GARBAGE!and more".to_vec(), vec![q], "the peer is no turbotun"),
            (HandoverHeader { queues: 2, ..good.clone() }.encode().unwrap(), vec![q], "announces 2 queues"),
            (
                HandoverHeader { name: "otherdev".into(), ..good.clone() }.encode().unwrap(),
                vec![q],
                "the header says otherdev",
            ),
            (HandoverHeader { mode: Mode::Tap, ..good.clone() }.encode().unwrap(), vec![q], "the header says"),
            (HandoverHeader { vnet_hdr_len: 12, ..good.clone() }.encode().unwrap(), vec![q], "the header says"),
            (good.encode().unwrap(), vec![pipe_r.as_fd()], "is not a TUN/TAP queue"),
            (good.encode().unwrap(), vec![], "announces 1 queues"),
            (
                {
                    let mut v = good.encode().unwrap();
                    v[4] = 9;
                    v
                },
                vec![q],
                "version 9",
            ),
        ];
        for (bytes, fds, why) in cases {
            let (tx, rx) = UnixStream::pair().unwrap();
            rx.set_read_timeout(Some(T)).unwrap();
            send_raw(&tx, &bytes, &fds);
            drop(tx);
            let err = recv_queues(&rx).unwrap_err().to_string();
            assert!(err.contains(why), "{why}: {err}");
            assert_eq!(common::fds_of(&name), 1, "{why}: every received fd was closed");
        }
        // A good message after all that is taken.
        let (tx, rx) = UnixStream::pair().unwrap();
        send_raw(&tx, &good.encode().unwrap(), &[q]);
        assert_eq!(recv_queues(&rx).unwrap()[0].name(), name);
        // A peer that closes without a word.
        let (tx, rx) = UnixStream::pair().unwrap();
        drop(tx);
        assert!(recv_queues(&rx).unwrap_err().to_string().contains("closed the connection"));
    });
}

#[test]
fn header_encode_decode_and_limits() {
    let h =
        HandoverHeader { name: "tun0".into(), mode: Mode::Tap, vnet_hdr_len: 12, offloads: Offloads::ALL, queues: 4 };
    let bytes = h.encode().unwrap();
    assert_eq!(HandoverHeader::decode(&bytes).unwrap(), h);
    // Every size a queue may have crosses, the 24-byte UDP-tunnel one included.
    for size in [0, 10, 12, 20, 24] {
        let offloads = if size == 0 { Offloads::NONE } else { Offloads::ALL };
        let h = HandoverHeader { vnet_hdr_len: size, offloads, ..h.clone() };
        assert_eq!(HandoverHeader::decode(&h.encode().unwrap()).unwrap(), h);
    }
    for cut in 0..bytes.len() {
        assert!(HandoverHeader::decode(&bytes[..cut]).is_err(), "a header cut at {cut} is refused");
    }
    let mut long = bytes.clone();
    long.push(b'x');
    assert!(HandoverHeader::decode(&long).unwrap_err().to_string().contains("header length"));
    let with = |i: usize, v: u8| {
        let mut b = bytes.clone();
        b[i] = v;
        HandoverHeader::decode(&b).unwrap_err().to_string()
    };
    assert!(with(8, 7).contains("mode 7"));
    assert!(with(9, 11).contains("virtio header size 11"));
    assert!(with(10, 0).contains("0 queues") || with(10, 0).contains("queues"));
    assert!(with(15, 0x80).contains("unknown"));
    assert!(with(16, 3).contains("name length 3"));
    assert!(with(17, b'/').contains("invalid interface name"));
    let none = HandoverHeader { vnet_hdr_len: 0, ..h.clone() };
    let mut b = HandoverHeader { offloads: Offloads::NONE, ..none.clone() }.encode().unwrap();
    b[12] = 1;
    assert!(HandoverHeader::decode(&b).unwrap_err().to_string().contains("without a virtio header"));
    assert!(HandoverHeader { queues: 0, ..h.clone() }.encode().is_err());
    assert!(HandoverHeader { queues: 257, ..h.clone() }.encode().is_err());
    assert!(HandoverHeader { name: "tun%d".into(), ..h }.encode().is_err());
}
