//! Side-by-side comparison with tun-rs's Linux offload code (`tun_rs::gso_split`, `tun_rs::GROTable`), same
//! inputs, same machine. Every variant's output is checked against tun-rs's before it is timed. `turbotun` and
//! `tun-rs` do the same work (copy and checksum every byte); the other turbotun variants do less, and their
//! names say what they leave out: payloads already in place (no copy), checksums left partial (no payload byte
//! read), checksums trusted instead of verified, payloads gathered instead of copied. Their times are not a
//! like-for-like ratio to tun-rs.
//!
//! `cargo bench -p turbotun-wire --bench vs_tunrs -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use turbotun_wire::checksum;
use turbotun_wire::fuzzing::{load, payload, time_after_reset, Spec};
use turbotun_wire::{Batch, Framing, Gro, GroConfig, Splitter, VirtioNetHdrRepr};

const OFF: usize = 12;

fn super_packet() -> (VirtioNetHdrRepr, Vec<u8>) {
    let spec = Spec::tcp4();
    spec.build_gso(&payload(65535 - spec.hdr_len(), 3), 1448)
}

fn segments() -> Vec<Vec<u8>> {
    let mut s = Spec::tcp4();
    (0..44)
        .map(|i| {
            let p = s.build(&payload(1448, i as u8));
            s = s.next_seg(1448);
            p
        })
        .collect()
}

fn tunrs_hdr(h: &VirtioNetHdrRepr) -> tun_rs::VirtioNetHdr {
    tun_rs::VirtioNetHdr {
        flags: h.flags,
        gso_type: h.gso_type,
        hdr_len: h.hdr_len,
        gso_size: h.gso_size,
        csum_start: h.csum_start,
        csum_offset: h.csum_offset,
    }
}

fn bench_checksum(c: &mut Criterion) {
    let mut g = c.benchmark_group("vs_tunrs/checksum");
    let data = payload(65536, 7);
    for len in [64usize, 1500, 65535] {
        let d = &data[..len];
        assert_eq!(checksum::checksum(d, 0), tun_rs::checksum(d, 0) ^ 0xffff);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("turbotun", len), &len, |b, _| b.iter(|| checksum::sum(black_box(d), 0)));
        g.bench_with_input(BenchmarkId::new("tun-rs", len), &len, |b, _| b.iter(|| tun_rs::checksum(black_box(d), 0)));
    }
    g.finish();
}

fn bench_split(c: &mut Criterion) {
    let (hdr, sup) = super_packet();
    let s = Splitter::new(&hdr, &sup, Framing::Ip).unwrap();
    let n = s.segment_count();
    let mut bufs = vec![vec![0u8; 2048]; n];
    let mut lens = vec![0usize; n];
    let mut tbufs = vec![vec![0u8; 2048]; n];
    let mut tsizes = vec![0usize; n];
    let mut tin = sup.clone();
    // Same work: identical output bytes.
    s.split_into(0, &mut Batch::new(&mut bufs, &mut lens, OFF)).unwrap();
    let got = tun_rs::gso_split(&mut tin, tunrs_hdr(&hdr), &mut tbufs, &mut tsizes, OFF, false).unwrap();
    assert_eq!(got, n);
    for i in 0..n {
        assert_eq!(bufs[i][OFF..OFF + lens[i]], tbufs[i][OFF..OFF + tsizes[i]], "segment {i}");
    }

    let mut g = c.benchmark_group("vs_tunrs/gso_split_64k_tcp4_1448");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("turbotun", |b| {
        b.iter(|| {
            let s = Splitter::new(black_box(&hdr), black_box(&sup), Framing::Ip).unwrap();
            s.split_into(0, &mut Batch::new(&mut bufs, &mut lens, OFF)).unwrap()
        })
    });
    g.bench_function("tun-rs", |b| {
        b.iter(|| tun_rs::gso_split(black_box(&mut tin), tunrs_hdr(&hdr), &mut tbufs, &mut tsizes, OFF, false).unwrap())
    });
    // The split `RecvBatch` makes once a scattered read has put each payload in its own buffer behind room for
    // its header: headers written, payloads only summed. Same output bytes as the copying split.
    let hl = s.hdr_len();
    let mut zbufs = vec![vec![0u8; 2048]; n];
    for (i, buf) in zbufs.iter_mut().enumerate() {
        let start = hl + i * s.gso_size();
        let plen = s.segment_payload_len(i);
        buf[OFF + hl..OFF + hl + plen].copy_from_slice(&sup[start..start + plen]);
    }
    let template = sup[..hl].to_vec();
    let zero_copy = |zbufs: &mut [Vec<u8>]| {
        let z = Splitter::from_head(black_box(&hdr), black_box(&template), sup.len(), Framing::Ip).unwrap();
        for (i, buf) in zbufs.iter_mut().enumerate() {
            let (front, back) = buf.split_at_mut(OFF + hl);
            z.write_header(i, &back[..z.segment_payload_len(i)], &mut front[OFF..]).unwrap();
        }
    };
    zero_copy(&mut zbufs);
    for i in 0..n {
        assert_eq!(zbufs[i][OFF..OFF + lens[i]], bufs[i][OFF..OFF + lens[i]], "zero-copy segment {i}");
    }
    g.bench_function("turbotun-zero-copy-payloads-in-place", |b| b.iter(|| zero_copy(&mut zbufs)));
    // The same with partial checksums (what `fwd --checksums partial` does): headers only, no payload byte read;
    // the receiving kernel completes each checksum. Less work than tun-rs's split, which copies and sums.
    let zero_copy_partial = |zbufs: &mut [Vec<u8>]| {
        let z = Splitter::from_head(black_box(&hdr), black_box(&template), sup.len(), Framing::Ip)
            .unwrap()
            .leave_checksums_partial(true);
        for (i, buf) in zbufs.iter_mut().enumerate() {
            let (front, back) = buf.split_at_mut(OFF + hl);
            z.write_header(i, &back[..z.segment_payload_len(i)], &mut front[OFF..]).unwrap();
        }
    };
    // Its output: every segment equal to the complete one but for the checksum field, which holds the partial
    // sum; completed as the kernel completes it, the same bytes.
    zero_copy_partial(&mut zbufs);
    for i in 0..n {
        let seg = &mut zbufs[i][OFF..OFF + lens[i]];
        let complete = &bufs[i][OFF..OFF + lens[i]];
        let site = turbotun_wire::partial::site(seg, Framing::Ip).expect("a partial segment is markable");
        let field = site.start + site.offset;
        assert_eq!(seg[..field], complete[..field], "partial segment {i} before its checksum field");
        assert_eq!(seg[field + 2..], complete[field + 2..], "partial segment {i} after its checksum field");
        checksum::complete_partial(seg, site.start, site.offset).unwrap();
        assert_eq!(seg, complete, "partial segment {i}, completed");
    }
    g.bench_function("turbotun-zero-copy-headers-only-partial", |b| b.iter(|| zero_copy_partial(&mut zbufs)));
    g.finish();
}

fn bench_coalesce(c: &mut Criterion) {
    let pkts = segments();
    let n = pkts.len();
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; OFF + 65535]; n];
    let mut lens = vec![0usize; n];
    let mut gro = Gro::new(GroConfig { tcp: true, udp: true, framing: Framing::Ip, vnet_hdr_len: 10 });
    let mut tw = Vec::with_capacity(128);
    let mut tbufs: Vec<Vec<u8>> = (0..n).map(|_| Vec::with_capacity(OFF + 65535)).collect();
    let mut table = tun_rs::GROTable::new();
    let reset_tunrs = |tbufs: &mut Vec<Vec<u8>>| {
        for (b, p) in tbufs.iter_mut().zip(&pkts) {
            b.clear();
            b.resize(OFF, 0);
            b.extend_from_slice(p);
        }
    };
    // Same work: both produce one identical super-packet.
    load(&pkts, &mut Batch::new(&mut bufs, &mut lens, OFF));
    gro.coalesce(&mut Batch::new(&mut bufs, &mut lens, OFF), false, &mut tw);
    reset_tunrs(&mut tbufs);
    table.apply_gro(&mut tbufs, OFF, true).unwrap();
    assert_eq!(tw, vec![0]);
    assert_eq!(bufs[0][OFF - 10..OFF + lens[0]], tbufs[0][OFF - 10..]);

    let mut g = c.benchmark_group("vs_tunrs/gro_coalesce_44x1448_tcp4");
    g.throughput(Throughput::Elements(n as u64));
    // Then what the forwarder runs: gather mode (payloads left where they are, written as pieces), checksums
    // vouched for (segments it split itself): less work than tun-rs's copy with verification. Its output, the
    // pieces joined, is the same super-packet.
    let mut gather =
        Gro::new(GroConfig { tcp: true, udp: true, framing: Framing::Ip, vnet_hdr_len: 10 }).with_gather(true);
    load(&pkts, &mut Batch::new(&mut bufs, &mut lens, OFF));
    gather.coalesce(&mut Batch::new(&mut bufs, &mut lens, OFF), true, &mut tw);
    assert_eq!(tw, vec![0]);
    let joined: Vec<u8> = gather.pieces(0, &lens, OFF).flat_map(|(b, range)| bufs[b][range].to_vec()).collect();
    assert_eq!(joined, tbufs[0][OFF - 10..], "gather mode's pieces, joined");
    for (name, gro, trusted) in
        [("turbotun", &mut gro, false), ("turbotun-gather-checksums-trusted", &mut gather, true)]
    {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                time_after_reset(
                    iters,
                    &mut (&mut bufs, &mut lens),
                    |(bufs, lens)| load(&pkts, &mut Batch::new(bufs, lens, OFF)),
                    |(bufs, lens)| {
                        black_box(gro.coalesce(&mut Batch::new(bufs, lens, OFF), trusted, &mut tw));
                    },
                )
            })
        });
    }
    g.bench_function("tun-rs", |b| {
        b.iter_custom(|iters| {
            time_after_reset(
                iters,
                &mut tbufs,
                |t| reset_tunrs(t),
                |t| {
                    table.apply_gro(t, OFF, true).unwrap();
                    black_box(&t);
                },
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench_checksum, bench_split, bench_coalesce);
criterion_main!(benches);
