//! Deploying with least privilege: dropping to a user after the devices are open, and handing queue fds to
//! another process.

pub mod handover;
pub mod privilege;
