//! turbotun-wire micro-benchmarks: checksum throughput, GSO split and GRO coalesce per segment.
//!
//! `cargo bench -p turbotun-wire --bench wire -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use turbotun_wire::checksum;
use turbotun_wire::fuzzing::{load, payload, time_after_reset, Spec};
use turbotun_wire::{Batch, Checksums, Framing, Gro, GroConfig, Splitter};

const OFF: usize = 12;

fn bench_checksum(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum");
    let data = payload(65535 + 1, 7);
    for len in [64usize, 1500, 65535] {
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("wide", len), &len, |b, &len| {
            b.iter(|| checksum::sum(black_box(&data[1..1 + len]), 0))
        });
        g.bench_with_input(BenchmarkId::new("scalar_reference", len), &len, |b, &len| {
            b.iter(|| checksum::sum_reference(black_box(&data[1..1 + len]), 0))
        });
    }
    g.finish();
}

/// 64 KB TCPv4 super-packet, gso_size 1448 (46 segments).
pub fn super_packet() -> (turbotun_wire::VirtioNetHdrRepr, Vec<u8>) {
    let spec = Spec::tcp4();
    spec.build_gso(&payload(65535 - spec.hdr_len(), 3), 1448)
}

/// 44 consecutive 1448-byte segments of one TCPv4 flow.
pub fn segments() -> Vec<Vec<u8>> {
    let mut s = Spec::tcp4();
    (0..44)
        .map(|i| {
            let p = s.build(&payload(1448, i as u8));
            s = s.next_seg(1448);
            p
        })
        .collect()
}

fn bench_split(c: &mut Criterion) {
    let (hdr, sup) = super_packet();
    let n = Splitter::new(&hdr, &sup, Framing::Ip).unwrap().segment_count();
    let mut bufs = vec![vec![0u8; 2048]; n];
    let mut lens = vec![0usize; n];
    let mut g = c.benchmark_group("gso_split_64k_tcp4");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("split_into", |b| {
        b.iter(|| {
            let s = Splitter::new(black_box(&hdr), black_box(&sup), Framing::Ip).unwrap();
            s.split_into(0, &mut Batch::new(&mut bufs, &mut lens, OFF)).unwrap()
        })
    });
    g.bench_function("segment_view", |b| {
        b.iter(|| {
            let s = Splitter::new(black_box(&hdr), black_box(&sup), Framing::Ip).unwrap();
            let mut x = 0usize;
            for i in 0..s.segment_count() {
                x += black_box(s.segment_view(i).unwrap()).len();
            }
            x
        })
    });
    g.finish();
}

fn bench_coalesce(c: &mut Criterion) {
    let pkts = segments();
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; OFF + 65535]; pkts.len()];
    let mut lens = vec![0usize; pkts.len()];
    let mut tw = Vec::with_capacity(128);
    let mut g = c.benchmark_group("gro_coalesce_44x1448_tcp4");
    g.throughput(Throughput::Elements(pkts.len() as u64));
    // Copy mode verifying or trusting the checksums, then gather mode (what SendBatch uses), each trusting them
    // with the fast path for the next segment of a stream and without it (every packet parsed).
    let cases = [
        ("verify_checksums", Checksums::Unverified, false, true),
        ("checksums_valid", Checksums::Valid, false, true),
        ("checksums_valid_full_parse", Checksums::Valid, false, false),
        ("gather", Checksums::Valid, true, true),
        ("gather_full_parse", Checksums::Valid, true, false),
        ("gather_partial", Checksums::Partial, true, true),
    ];
    for (name, checksums, gather, fast) in cases {
        let cfg = GroConfig { tcp: true, udp: true, framing: Framing::Ip, vnet_hdr_len: 10 };
        let mut gro = Gro::new(cfg).with_gather(gather).with_fast_path(fast);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let total = time_after_reset(
                    iters,
                    &mut (&mut bufs, &mut lens),
                    |(bufs, lens)| load(&pkts, &mut Batch::new(bufs, lens, OFF)),
                    |(bufs, lens)| {
                        black_box(gro.coalesce(&mut Batch::new(bufs, lens, OFF), checksums, &mut tw));
                    },
                );
                assert_eq!(tw, vec![0]);
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_checksum, bench_split, bench_coalesce);
criterion_main!(benches);
