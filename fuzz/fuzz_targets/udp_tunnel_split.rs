#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    turbotun_wire::fuzzing::udp_tunnel_split(data);
});
