//! ChaCha20-Poly1305 as WireGuard's transport data uses it (a 12-byte nonce from a counter, no associated data,
//! sealed and opened in place), for each implementation the project could use: ring, aws-lc-rs, RustCrypto's
//! `chacha20poly1305` (its AVX-512 ChaCha20 backend compiled in, chosen at run time) and OpenSSL 3 through the
//! `openssl` crate (AVX-512 ChaCha20, AVX-512 IFMA Poly1305 where the CPU has them), and Intel's IPsec-MB
//! (Debian's `libipsec-mb-dev`; AVX-512 ChaCha20 and IFMA Poly1305) as `turbotun::aead` runs it. Sizes: a 64-byte packet, a
//! 1420-byte packet (a full one through a 1420 MTU) and a run of 64 such packets as the tunnel seals a batch.
//!
//! Run: `cd bench/aead && cargo bench` (results in target/criterion).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const KEY: [u8; 32] = [7; 32];
const TAG: usize = 16;

fn nonce(counter: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    n
}

/// One implementation: seal `buf[..len - 16]` in place writing the tag into the last 16 bytes, and open it back.
trait Aead {
    const NAME: &'static str;
    fn seal(&mut self, counter: u64, buf: &mut [u8]);
    fn open(&mut self, counter: u64, buf: &mut [u8]) -> bool;
}

struct Ring(ring::aead::LessSafeKey);
impl Aead for Ring {
    const NAME: &'static str = "ring";
    fn seal(&mut self, counter: u64, buf: &mut [u8]) {
        let (text, tag) = buf.split_at_mut(buf.len() - TAG);
        let n = ring::aead::Nonce::assume_unique_for_key(nonce(counter));
        let t = self.0.seal_in_place_separate_tag(n, ring::aead::Aad::empty(), text).unwrap();
        tag.copy_from_slice(t.as_ref());
    }
    fn open(&mut self, counter: u64, buf: &mut [u8]) -> bool {
        let n = ring::aead::Nonce::assume_unique_for_key(nonce(counter));
        self.0.open_in_place(n, ring::aead::Aad::empty(), buf).is_ok()
    }
}

struct AwsLc(aws_lc_rs::aead::LessSafeKey);
impl Aead for AwsLc {
    const NAME: &'static str = "aws-lc-rs";
    fn seal(&mut self, counter: u64, buf: &mut [u8]) {
        let (text, tag) = buf.split_at_mut(buf.len() - TAG);
        let n = aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce(counter));
        let t = self.0.seal_in_place_separate_tag(n, aws_lc_rs::aead::Aad::empty(), text).unwrap();
        tag.copy_from_slice(t.as_ref());
    }
    fn open(&mut self, counter: u64, buf: &mut [u8]) -> bool {
        let n = aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce(counter));
        self.0.open_in_place(n, aws_lc_rs::aead::Aad::empty(), buf).is_ok()
    }
}

struct RustCrypto(chacha20poly1305::ChaCha20Poly1305);
impl Aead for RustCrypto {
    const NAME: &'static str = "rustcrypto";
    fn seal(&mut self, counter: u64, buf: &mut [u8]) {
        use chacha20poly1305::aead::AeadInOut;
        let (text, tag) = buf.split_at_mut(buf.len() - TAG);
        let t = self.0.encrypt_inout_detached(&nonce(counter).into(), &[], text.into()).unwrap();
        tag.copy_from_slice(&t);
    }
    fn open(&mut self, counter: u64, buf: &mut [u8]) -> bool {
        use chacha20poly1305::aead::AeadInOut;
        let (text, tag) = buf.split_at_mut(buf.len() - TAG);
        let tag: &[u8] = tag;
        self.0.decrypt_inout_detached(&nonce(counter).into(), &[], text.into(), tag.try_into().unwrap()).is_ok()
    }
}

/// OpenSSL with one context per direction, keyed once and given a new nonce per message (what a tunnel would
/// keep per session and thread).
struct OpenSsl {
    seal: openssl::cipher_ctx::CipherCtx,
    open: openssl::cipher_ctx::CipherCtx,
}
impl OpenSsl {
    fn new() -> Self {
        let cipher = openssl::cipher::Cipher::chacha20_poly1305();
        let mut seal = openssl::cipher_ctx::CipherCtx::new().unwrap();
        seal.encrypt_init(Some(cipher), Some(&KEY), Some(&nonce(0))).unwrap();
        let mut open = openssl::cipher_ctx::CipherCtx::new().unwrap();
        open.decrypt_init(Some(cipher), Some(&KEY), Some(&nonce(0))).unwrap();
        OpenSsl { seal, open }
    }
}
impl Aead for OpenSsl {
    const NAME: &'static str = "openssl";
    fn seal(&mut self, counter: u64, buf: &mut [u8]) {
        let len = buf.len() - TAG;
        let (text, tag) = buf.split_at_mut(len);
        self.seal.encrypt_init(None, None, Some(&nonce(counter))).unwrap();
        self.seal.cipher_update_inplace(text, len).unwrap();
        self.seal.cipher_final(&mut []).unwrap();
        self.seal.tag(tag).unwrap();
    }
    fn open(&mut self, counter: u64, buf: &mut [u8]) -> bool {
        let len = buf.len() - TAG;
        let (text, tag) = buf.split_at_mut(len);
        self.open.decrypt_init(None, None, Some(&nonce(counter))).unwrap();
        self.open.set_tag(tag).unwrap();
        self.open.cipher_update_inplace(text, len).unwrap();
        self.open.cipher_final(&mut []).is_ok()
    }
}

/// Intel's IPsec-MB (AVX-512 ChaCha20, IFMA Poly1305) as the WireGuard endpoint runs it: `turbotun::aead`'s
/// key on that backend (a manager per thread, one synchronous job per message).
struct IpsecMb(turbotun::aead::Key);
impl Aead for IpsecMb {
    const NAME: &'static str = "ipsec-mb";
    fn seal(&mut self, counter: u64, buf: &mut [u8]) {
        let len = buf.len() - TAG;
        let (text, tag) = buf.split_at_mut(len);
        tag.copy_from_slice(&self.0.seal(&nonce(counter), &[], text));
    }
    fn open(&mut self, counter: u64, buf: &mut [u8]) -> bool {
        let len = buf.len() - TAG;
        let (text, tag) = buf.split_at_mut(len);
        self.0.open(&nonce(counter), &[], text, (&*tag).try_into().unwrap())
    }
}

/// The same bytes from every implementation: each seals what ring seals, and opens it.
fn check<A: Aead>(a: &mut A) {
    let mut reference = Ring(ring_key());
    for len in [0usize, 1, 64, 1420] {
        let mut mine = vec![0x5a; len + TAG];
        let mut theirs = mine.clone();
        a.seal(3, &mut mine);
        reference.seal(3, &mut theirs);
        assert_eq!(mine, theirs, "{} seals {len} bytes as ring does", A::NAME);
        assert!(a.open(3, &mut mine), "{} opens", A::NAME);
        assert!(mine[..len].iter().all(|&b| b == 0x5a));
        theirs[0] ^= 1;
        assert!(!a.open(3, &mut theirs), "{} refuses a flipped bit", A::NAME);
    }
}

fn ring_key() -> ring::aead::LessSafeKey {
    ring::aead::LessSafeKey::new(ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, &KEY).unwrap())
}

fn measure<A: Aead>(c: &mut Criterion, mut a: A) {
    check(&mut a);
    for (label, len, count) in [("64", 64usize, 1usize), ("1420", 1420, 1), ("run64x1420", 1420, 64)] {
        let mut group = c.benchmark_group(format!("seal/{label}"));
        group.throughput(Throughput::Bytes((len * count) as u64));
        let mut bufs = vec![vec![0x5au8; len + TAG]; count];
        let mut counter = 0u64;
        group.bench_function(BenchmarkId::from_parameter(A::NAME), |b| {
            b.iter(|| {
                for buf in bufs.iter_mut() {
                    counter += 1;
                    a.seal(counter, buf);
                }
            })
        });
        group.finish();
        let mut group = c.benchmark_group(format!("open/{label}"));
        group.throughput(Throughput::Bytes((len * count) as u64));
        let sealed: Vec<Vec<u8>> = (0..count as u64)
            .map(|i| {
                let mut buf = vec![0x5au8; len + TAG];
                a.seal(i, &mut buf);
                buf
            })
            .collect();
        let mut work = sealed.clone();
        group.bench_function(BenchmarkId::from_parameter(A::NAME), |b| {
            b.iter(|| {
                for (i, (w, s)) in work.iter_mut().zip(&sealed).enumerate() {
                    w.copy_from_slice(s);
                    assert!(a.open(i as u64, w));
                }
            })
        });
        group.finish();
    }
}

fn all(c: &mut Criterion) {
    measure(c, Ring(ring_key()));
    measure(
        c,
        AwsLc(aws_lc_rs::aead::LessSafeKey::new(
            aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::CHACHA20_POLY1305, &KEY).unwrap(),
        )),
    );
    measure(c, RustCrypto(<chacha20poly1305::ChaCha20Poly1305 as chacha20poly1305::KeyInit>::new(&KEY.into())));
    measure(c, OpenSsl::new());
    use turbotun::aead::{Backend, Key};
    let imb = Key::with_backend(&KEY, Backend::IpsecMb);
    assert_eq!(imb.backend(), Backend::IpsecMb, "IPsec-MB's AVX-512 code runs here (libipsec-mb-dev installed)");
    measure(c, IpsecMb(imb));
}

criterion_group!(benches, all);
criterion_main!(benches);
