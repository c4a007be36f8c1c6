//! Linux TUN/TAP dataplane.
pub mod sys;
