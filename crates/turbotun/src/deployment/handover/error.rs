//! What a hand-over fails with that is its own ([`HandoverError`]), and who the peer was ([`PeerCredentials`],
//! which a refusal names). A file that names nothing of the crate, so that `Error` can wrap `HandoverError`
//! while `error.rs` stays below every folder.

use std::fmt;

/// Who is at the other end of a connected Unix socket, as the kernel recorded it at `connect` or `listen`
/// (`SO_PEERCRED`): process id, user id, group id. Unforgeable by the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerCredentials {
    /// The peer's process id as this process's PID namespace sees it; `None` when the peer lives outside it
    /// (the kernel reports 0: the usual case for a forwarder in a container and `turbotun open` on the host).
    pub pid: Option<u32>,
    /// Its effective user id.
    pub uid: u32,
    /// Its effective group id.
    pub gid: u32,
}

impl fmt::Display for PeerCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid} (uid {})", self.uid),
            None => write!(f, "a process outside this PID namespace (uid {})", self.uid),
        }
    }
}

/// A hand-over refused by one side or the other (wrapped by [`crate::Error::Handover`]); its I/O and the checks of
/// what was handed over fail with the crate's other errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandoverError {
    /// The process at the other end of a hand-over socket is not one this side may deal with.
    #[error("{peer} may not {role}: only {} may; keep the socket in a directory only they can reach", allowed.join(" or "))]
    UntrustedPeer {
        /// Who it is.
        peer: PeerCredentials,
        /// What it would have done (`hand queues over`, `receive queues`).
        role: &'static str,
        /// Who would have been allowed (`root`, `uid 65534`).
        allowed: Vec<String>,
    },

    /// The receiver of a hand-over refused the queues; its reason.
    #[error("the receiver refused the queues: {reason}")]
    Refused {
        /// What the receiver answered.
        reason: String,
    },
}
