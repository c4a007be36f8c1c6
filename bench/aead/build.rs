//! Builds the IPsec-MB glue (csrc/ipsecmb.c) and links Debian's libIPSec_MB (`libipsec-mb-dev`).
fn main() {
    println!("cargo:rerun-if-changed=csrc/ipsecmb.c");
    cc::Build::new().file("csrc/ipsecmb.c").opt_level(2).compile("ttipsecmb");
    println!("cargo:rustc-link-lib=IPSec_MB");
}
