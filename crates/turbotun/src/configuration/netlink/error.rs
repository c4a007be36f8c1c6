//! [`NetlinkError`]: an rtnetlink request the kernel refused. A file that names nothing of the crate, so that
//! `Error` can wrap it while `error.rs` stays below every folder.

/// An rtnetlink request failed (wrapped by [`crate::Error::Netlink`]). A refusal for want of a capability is
/// [`crate::Error::PermissionDenied`] instead, and the checks before a request (names, ranges, a device that is not
/// there) fail with the crate's other errors.
#[derive(Debug, thiserror::Error)]
#[error("netlink {context}: {source}")]
#[non_exhaustive]
pub struct NetlinkError {
    /// The request and the interface it was about.
    pub context: String,
    /// The error the kernel returned.
    pub source: std::io::Error,
}
