#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    turbotun_wire::fuzzing::gro_model(data);
});
