//! `turbotun::tokio::AsyncQueue`: awaiting packets through tokio's reactor on a real device.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use common::*;
use turbotun::batch::Batch;
use turbotun::tokio::AsyncQueue;
use turbotun::{DeviceBuilder, Offloads};

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);

#[test]
fn async_recv_waits_for_the_packet_and_send_delivers() {
    in_netns("async_recv_waits_for_the_packet_and_send_delivers", || {
        let name = unique_name("ta");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(10).offloads(Offloads::ALL).open().unwrap();
        configure_v4(&name, LOCAL, 24);
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().unwrap();
        rt.block_on(async {
            let q = AsyncQueue::new(dev.into_queues().remove(0)).unwrap();
            // Nothing to read yet: the batch read must wait rather than return empty.
            let mut rx = q.recv_batch();
            let mut bufs = vec![vec![0u8; 10 + 65535]; 4];
            let mut lens = [0usize; 4];
            let mut waiting = Batch::new(&mut bufs, &mut lens, 10);
            let early = tokio::time::timeout(Duration::from_millis(200), rx.recv_many(&mut waiting));
            // IPv6 autoconfiguration may send something; either it timed out or it returned a real packet.
            if let Ok(r) = early.await {
                assert!(r.unwrap().packets > 0);
            }
            let sender = std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                UdpSocket::bind((LOCAL, 0)).unwrap().send_to(b"async hello", (PEER, 4444)).unwrap();
            });
            let found = loop {
                let got = tokio::time::timeout(
                    Duration::from_secs(5),
                    rx.recv_many(&mut Batch::new(&mut bufs, &mut lens, 10)),
                )
                .await
                .expect("the datagram arrives")
                .unwrap();
                let hit = (0..got.packets).find_map(|i| {
                    parse_ipv4_udp(&bufs[i][10..10 + lens[i]])
                        .filter(|(_, d, _, dp, _)| *d == PEER && *dp == 4444)
                        .map(|(_, _, _, _, data)| data.to_vec())
                });
                if let Some(data) = hit {
                    break data;
                }
            };
            sender.join().unwrap();
            assert_eq!(found, b"async hello");

            let sock = UdpSocket::bind((LOCAL, 4445)).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            q.send(&ipv4_udp(PEER, LOCAL, 9, 4445, b"from async")).await.unwrap();
            let mut buf = [0u8; 64];
            let n = sock.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"from async");

            // The device disappears: the awaiting read reports it instead of hanging.
            turbotun::netlink::Netlink::new().unwrap().delete_link(&name).unwrap();
            let mut one = [0u8; 2048];
            let err =
                tokio::time::timeout(Duration::from_secs(3), q.recv_raw(&mut one)).await.expect("woken").unwrap_err();
            assert!(err.is_device_gone(), "{err}");
        });
    });
}

#[test]
fn async_send_to_a_device_that_is_down_fails_at_once() {
    in_netns("async_send_to_a_device_that_is_down_fails_at_once", || {
        // The kernel reports a TUN fd writable only while its device is up: a write that waited for writability
        // first would wait forever here instead of failing.
        let name = unique_name("tdn");
        let dev = DeviceBuilder::tun().name(&name).vnet_hdr(10).offloads(Offloads::ALL).open().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().unwrap();
        rt.block_on(async {
            let q = AsyncQueue::new(dev.into_queues().remove(0)).unwrap();
            let packet = ipv4_udp(LOCAL, PEER, 9, 4446, b"to a device that is down");
            let sent = tokio::time::timeout(Duration::from_secs(3), q.send(&packet)).await.expect("not left waiting");
            assert!(matches!(sent, Err(turbotun::Error::DeviceDown { .. })), "{sent:?}");
            let mut batch = q.send_batch();
            let mut bufs = vec![[vec![0u8; 10], packet.clone()].concat()];
            let mut lens = [packet.len()];
            let sent = tokio::time::timeout(
                Duration::from_secs(3),
                batch.send_many(&mut Batch::new(&mut bufs, &mut lens, 10), false),
            )
            .await
            .expect("not left waiting");
            assert_eq!(batch.stats().drops.get(turbotun::DropReason::DeviceDown), 1, "{sent:?}");
        });
    });
}
