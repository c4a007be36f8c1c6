//! The load generator and sink against each other on loopback (127.0.0.1 of the test's own namespace): at a
//! paced rate far below what the machine can do, everything sent arrives, in order, once, and the pacer never
//! releases more than the rate allows. A correctness check of the accounting and the pacing, not a performance
//! measurement (nothing here asserts a speed).

use std::time::Duration;

use turbotun::load::{Generator, GeneratorReport, SinkBuilder, SinkReport};

const RATE: u64 = 20_000;

fn run_pair(gso: u16, gro: bool, flows: usize) -> (GeneratorReport, SinkReport) {
    let sink = SinkBuilder::new("127.0.0.1:0".parse().unwrap())
        .gro(gro)
        .idle_timeout(Duration::from_millis(500))
        .duration(Duration::from_secs(20))
        .bind()
        .expect("bind the sink");
    let dest = sink.local_addr().unwrap();
    let receiving = std::thread::spawn(move || sink.run());
    let sent = Generator::new(dest)
        .rate(RATE)
        .size(64)
        .flows(flows)
        .gso(gso)
        .duration(Duration::from_secs(1))
        .run()
        .expect("generator");
    let received = receiving.join().expect("sink thread").expect("sink");
    (sent, received)
}

fn check(g: &GeneratorReport, s: &SinkReport) {
    assert_eq!(g.send_errors, 0, "{g:?}");
    assert_eq!(g.sent, g.attempted, "{g:?}");
    assert_eq!(s.datagrams, g.sent, "the sink received what was sent: {s:?}\n{g:?}");
    assert_eq!(s.bytes, g.sent * 64);
    assert_eq!((s.lost, s.reordered, s.duplicated, s.stale), (0, 0, 0, 0), "{s:?}");
    assert_eq!((s.malformed, s.unknown_flow, s.truncated, s.socket_drops), (0, 0, 0, 0), "{s:?}");
    assert_eq!(s.flows.len(), g.flows);
    for f in &s.flows {
        assert_eq!(f.counts.expected, g.per_flow[usize::from(f.flow)], "nothing lost at the tail of flow {}", f.flow);
        assert_eq!(f.counts.received, f.counts.expected);
    }
    // The pacer's token bucket fills at the rate from its first millisecond's worth: whatever the machine's
    // speed, it never releases more than that (how close it comes to the rate is the bench's business).
    let allowed = RATE as f64 * g.seconds + (RATE as f64 * 1e-3).max(f64::from(g.segments));
    assert!(
        g.attempted as f64 <= allowed,
        "released {} datagrams in {:.3} s at {RATE}/s: {g:?}",
        g.attempted,
        g.seconds
    );
    assert!(g.attempted > 0, "{g:?}");
}

#[test]
fn test_paced_loopback_every_datagram_arrives_once_in_order() {
    let (g, s) = run_pair(1, false, 4);
    check(&g, &s);
    assert_eq!(s.messages, s.datagrams, "one datagram per message without GRO");
}

#[test]
fn test_paced_loopback_with_gso_and_gro() {
    let (g, s) = run_pair(8, true, 2);
    check(&g, &s);
    assert!(s.gro, "UDP_GRO is on this kernel's loopback since Linux 5.0");
    assert_eq!(g.sent % 8, 0, "whole GSO sends: {g:?}");
    assert!(s.messages < s.datagrams, "GRO coalesced some: {s:?}");
}

/// An echo's answers (addresses and ports swapped) reach the sink when the generator sends from a handle on the
/// sink's socket; the connected socket takes nothing from anyone else.
#[test]
fn test_generator_from_the_sinks_socket_gets_the_echoed_datagrams() {
    let sink = SinkBuilder::new("127.0.0.1:0".parse().unwrap())
        .idle_timeout(Duration::from_millis(500))
        .duration(Duration::from_secs(20))
        .bind()
        .expect("bind the sink");
    let echo = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    echo.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let echo_addr = echo.local_addr().unwrap();
    // A stranger's datagram to the sink's port before the generator connects would count as malformed (it has
    // no header); one after must not arrive at all.
    let sink_addr = sink.local_addr().unwrap();
    let socket = sink.try_clone_socket().unwrap();
    let receiving = std::thread::spawn(move || sink.run());
    let echoing = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut n = 0u64;
        while let Ok((len, from)) = echo.recv_from(&mut buf) {
            echo.send_to(&buf[..len], from).unwrap();
            n += 1;
        }
        n
    });
    let sent = Generator::new(echo_addr)
        .socket(socket)
        .rate(RATE)
        .size(64)
        .duration(Duration::from_secs(1))
        .run()
        .expect("generator");
    let stranger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    stranger.send_to(&[0u8; 64], sink_addr).unwrap();
    let received = receiving.join().expect("sink thread").expect("sink");
    let echoed = echoing.join().unwrap();
    assert_eq!(echoed, sent.sent, "{sent:?}");
    check(&sent, &received);
    assert!(Generator::new(echo_addr).socket(stranger).flows(2).validate().is_err(), "one socket is one flow");
}
