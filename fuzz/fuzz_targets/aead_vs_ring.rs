#![no_main]

use libfuzzer_sys::fuzz_target;

// turbotun's ChaCha20-Poly1305 on every implementation this machine has, byte for byte against ring's.
fuzz_target!(|data: &[u8]| {
    turbotun::aead::fuzz_compare_with_ring(data);
});
