//! Pure packet logic for turbotun: no I/O, no unsafe.
#![forbid(unsafe_code)]
