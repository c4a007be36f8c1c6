use super::*;

use proptest::prelude::*;

/// Whether the suite demands the AVX-512 backend (`TURBOTUN_EXPECT_IPSEC_MB=1`, which `make test` sets on a CPU
/// with AVX-512); elsewhere the tests cover what the machine has.
fn both_expected() -> bool {
    std::env::var("TURBOTUN_EXPECT_IPSEC_MB").is_ok_and(|v| v == "1")
}

#[test]
fn the_backends_this_machine_has() {
    let available = Backend::available();
    assert_eq!(available.last(), Some(&Backend::Ring), "ring's is always there, last");
    if both_expected() {
        assert_eq!(available, [Backend::IpsecMb, Backend::Ring], "IPsec-MB's AVX-512 code runs here");
    }
    assert_eq!(backend(), choose(std::env::var("TURBOTUN_AEAD").ok().as_deref(), || available));
}

#[test]
fn the_switch_to_ring_probes_no_other_backend() {
    // Probing IPsec-MB makes a manager, which maps megabytes of its code into a process forced to ring: an endpoint
    // forced to ring peaked at 16 MB with the probe and at 9 without it.
    let probed = std::cell::Cell::new(false);
    let chosen = choose(Some("ring"), || {
        probed.set(true);
        vec![Backend::IpsecMb, Backend::Ring]
    });
    assert_eq!(chosen, Backend::Ring);
    assert!(!probed.get(), "TURBOTUN_AEAD=ring probed the other backends");
}

#[test]
fn ring_is_forced_by_the_switch_and_otherwise_the_fastest_is_chosen() {
    let both = || vec![Backend::IpsecMb, Backend::Ring];
    assert_eq!(choose(Some("ring"), both), Backend::Ring);
    assert_eq!(choose(None, both), Backend::IpsecMb);
    assert_eq!(choose(Some("fastest"), both), Backend::IpsecMb);
    assert_eq!(choose(None, || vec![Backend::Ring]), Backend::Ring, "a CPU without AVX-512");
    assert_eq!(Key::with_backend(&[1; 32], Backend::Ring).backend(), Backend::Ring);
}

/// Wycheproof's ChaCha20-Poly1305 vectors (tcId 1 is RFC 8439's section 2.8.2 vector) through every backend this
/// machine has: each valid one seals to its ciphertext and tag and opens back; each invalid one is refused.
#[test]
fn wycheproof_vectors_on_every_backend() {
    use wycheproof::aead::{TestName, TestSet};
    use wycheproof::TestResult;
    let set = TestSet::load(TestName::ChaCha20Poly1305).expect("the vectors");
    for backend in Backend::available() {
        let (mut valid, mut invalid, mut rfc) = (0, 0, false);
        for group in &set.test_groups {
            // Only 96-bit nonces are ChaCha20-Poly1305's (RFC 8439); the other groups test that a library refuses
            // other sizes, which the type of `nonce` here already does.
            if group.nonce_size != 96 {
                continue;
            }
            for test in &group.tests {
                let key: [u8; 32] = test.key[..].try_into().expect("256-bit keys");
                let nonce: [u8; 12] = test.nonce[..].try_into().expect("96-bit nonces");
                let Ok(tag) = <[u8; TAG_LEN]>::try_from(&test.tag[..]) else {
                    assert_eq!(test.result, TestResult::Invalid, "tcId {}: a short tag is invalid", test.tc_id);
                    invalid += 1;
                    continue;
                };
                let key = Key::with_backend(&key, backend);
                let mut opened = test.ct.to_vec();
                let ok = key.open(&nonce, &test.aad, &mut opened, &tag);
                match test.result {
                    TestResult::Valid | TestResult::Acceptable => {
                        assert!(ok, "{backend:?} tcId {} opens", test.tc_id);
                        assert_eq!(opened, &test.pt[..], "{backend:?} tcId {}: plaintext", test.tc_id);
                        let mut sealed = test.pt.to_vec();
                        assert_eq!(key.seal(&nonce, &test.aad, &mut sealed), tag, "{backend:?} tcId {}", test.tc_id);
                        assert_eq!(sealed, &test.ct[..], "{backend:?} tcId {}: ciphertext", test.tc_id);
                        rfc |= test.tc_id == 1;
                        valid += 1;
                    }
                    TestResult::Invalid => {
                        assert!(!ok, "{backend:?} tcId {} ({:?}) refused", test.tc_id, test.comment);
                        invalid += 1;
                    }
                }
            }
        }
        assert!(rfc, "RFC 8439's vector among them");
        assert!(valid > 200 && invalid > 50, "{backend:?}: {valid} valid and {invalid} invalid vectors");
    }
}

/// RFC 8439, section 2.8.2, written out: the example every implementation starts from.
#[test]
fn rfc_8439_section_2_8_2() {
    let key: [u8; 32] = std::array::from_fn(|i| 0x80 + i as u8);
    let nonce = [0x07, 0, 0, 0, 0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47];
    let aad = [0x50, 0x51, 0x52, 0x53, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7];
    let text = b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, \
                 sunscreen would be it.";
    let tag = [0x1a, 0xe1, 0x0b, 0x59, 0x4f, 0x09, 0xe2, 0x6a, 0x7e, 0x90, 0x2e, 0xcb, 0xd0, 0x60, 0x06, 0x91];
    for backend in Backend::available() {
        let key = Key::with_backend(&key, backend);
        let mut sealed = text.to_vec();
        assert_eq!(key.seal(&nonce, &aad, &mut sealed), tag, "{backend:?}");
        assert_eq!(&sealed[..4], &[0xd3, 0x1a, 0x8d, 0x34], "{backend:?}: the ciphertext's first bytes");
        assert!(key.open(&nonce, &aad, &mut sealed, &tag));
        assert_eq!(&sealed[..], &text[..]);
    }
}

/// A key is a pointer to its box (and the variant's tag): moving one into a session, or a session into an `Arc`,
/// copies no other bytes. Before, it was as large as ring's key (room for AES's schedule), and the bytes an
/// IPsec-MB key left unused carried whatever the stack held, a copy of the session key among them, into the
/// heap, where erasing the key did not reach it (the zero-key timer's memory scan found six).
#[test]
fn a_key_is_two_words() {
    assert_eq!(std::mem::size_of::<Key>(), 2 * std::mem::size_of::<usize>());
}

#[test]
fn an_erased_key_opens_nothing_it_sealed_before() {
    for backend in Backend::available() {
        let mut key = Key::with_backend(&[9; 32], backend);
        let mut text = vec![1u8; 100];
        let tag = key.seal(&[0; 12], &[], &mut text);
        key.erase();
        assert!(!key.open(&[0; 12], &[], &mut text, &tag), "{backend:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// The fuzz target's body on random input: every backend agrees with ring's byte for byte.
    #[test]
    fn every_backend_agrees_with_ring(data in proptest::collection::vec(any::<u8>(), 45..4200)) {
        fuzz_compare_with_ring(&data);
    }
}
