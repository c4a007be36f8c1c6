//! Deploying with least privilege: dropping to a user after the devices are open, and handing queue fds to
//! another process; serving a running engine's counters on a local socket.

pub mod handover;
pub mod privilege;
pub mod stats_socket;
