//! Deploying with least privilege: dropping to a user after the devices are open, and handing queue fds to
//! another process; serving a running engine's counters on a local socket; removing a process's sockets after
//! it dropped its privileges.

pub mod handover;
pub mod privilege;
pub mod socket_keeper;
mod stats_report;
pub mod stats_socket;
