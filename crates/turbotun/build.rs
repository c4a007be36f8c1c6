//! Compiles the glue to Intel's IPsec-MB library (`src/sys/ipsec_mb.c`) where its header is installed (Debian's
//! `libipsec-mb-dev`), for the AVX-512 ChaCha20-Poly1305 of `turbotun::aead`. Without the header (or with
//! `TURBOTUN_NO_IPSEC_MB` set) the crate is built with ring's ChaCha20-Poly1305 alone.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ipsec_mb)");
    println!("cargo::rerun-if-changed=src/sys/ipsec_mb.c");
    println!("cargo::rerun-if-env-changed=TURBOTUN_NO_IPSEC_MB");
    let header = ["/usr/include/intel-ipsec-mb.h", "/usr/local/include/intel-ipsec-mb.h"];
    for path in header {
        println!("cargo::rerun-if-changed={path}");
    }
    if std::env::var_os("TURBOTUN_NO_IPSEC_MB").is_some() || !header.iter().any(|h| Path::new(h).exists()) {
        return;
    }
    cc::Build::new().file("src/sys/ipsec_mb.c").opt_level(2).warnings(true).compile("turbotun_ipsec_mb");
    println!("cargo::rustc-link-lib=IPSec_MB");
    println!("cargo::rustc-cfg=ipsec_mb");
}
