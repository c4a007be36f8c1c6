//! See benches/aead.rs.
