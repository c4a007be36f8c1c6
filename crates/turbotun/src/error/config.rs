//! [`ConfigError`]: what is wrong with a configuration, each variant naming it (the value, the limit, the options
//! that contradict each other), so that a caller can match on it and a person reads the same line as before.

use crate::devices::offloads::{Offloads, UnknownOffload};

/// What is wrong with a request that cannot be carried out as given ([`Error::Config`](super::Error::Config)); each message says what to
/// change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// An offload list that does not parse ([`Offloads::parse`]).
    #[error(transparent)]
    UnknownOffload(#[from] UnknownOffload),

    /// Offloads asked for without the virtio header that carries them.
    #[error("offloads {offloads} need the virtio header: add vnet_hdr(10)")]
    OffloadsNeedVnetHdr {
        /// The offloads asked for.
        offloads: Offloads,
    },

    /// UDP tunnel offloads asked for with a virtio header too short for the tunnel offsets.
    #[error(
        "UDP tunnel offloads need the {len}-byte virtio header, which holds the tunnel offsets: use vnet_hdr({len})"
    )]
    UdpTunnelNeedsVnetHdr {
        /// The virtio header size they need.
        len: usize,
    },

    /// Offloads the kernel grants only together with others.
    #[error("{rule}")]
    OffloadCombination {
        /// Which offloads go together, and what to add.
        rule: &'static str,
    },

    /// Offloads stated for a queue that has no virtio header to carry them.
    #[error("{name} has no virtio header, so it can have no offloads ({offloads} stated)")]
    OffloadsWithoutVnetHdr {
        /// The device's name.
        name: String,
        /// The offloads stated.
        offloads: Offloads,
    },

    /// A single-packet read on a queue whose reads may be super-packets.
    #[error(
        "{name} has segmentation offloads ({offloads}): a read may be a super-packet, use recv_with_hdr or RecvBatch"
    )]
    SuperPackets {
        /// The device's name.
        name: String,
        /// Its offloads.
        offloads: Offloads,
    },

    /// No queue where at least one is needed.
    #[error("{needs}")]
    NoQueue {
        /// What needs one.
        needs: &'static str,
    },

    /// A number of queues (or of the sockets that go with them) that does not fit.
    #[error("{why}")]
    QueueCount {
        /// The numbers, and the rule they break.
        why: String,
    },

    /// Queues added to, or opened on, a device without `IFF_MULTI_QUEUE`.
    #[error("{}", if *existing {
        format!("device {name} exists without multi_queue: open it with multi_queue(false), or delete it and create \
                 it again with multi_queue(true)")
    } else {
        format!("{name} was opened without IFF_MULTI_QUEUE: open it with multi_queue(true) to add queues later")
    })]
    NotMultiQueue {
        /// The device's name.
        name: String,
        /// Whether the device existed before this open (else it was opened so by this process).
        existing: bool,
    },

    /// Two queues whose virtio header sizes differ, given to something that passes frames through as they are.
    #[error("{a} has a {a_len}-byte virtio header and {b} a {b_len}-byte one: {needs}")]
    VnetHdrSizesDiffer {
        /// The first queue's device.
        a: String,
        /// Its virtio header size.
        a_len: usize,
        /// The second queue's device.
        b: String,
        /// Its virtio header size.
        b_len: usize,
        /// Why they must be the same.
        needs: &'static str,
    },

    /// A queue whose virtio header size does not fit the mode it is used in.
    #[error("{name} has a {len}-byte virtio header: {needs}")]
    VnetHdrSize {
        /// The device's name.
        name: String,
        /// Its virtio header size.
        len: usize,
        /// What the mode needs.
        needs: String,
    },

    /// Queues of the wrong devices: two that must differ, or several that must be one.
    #[error("{why}")]
    Devices {
        /// The devices, and the rule they break.
        why: String,
    },

    /// Options that contradict each other.
    #[error("{why}")]
    Conflict {
        /// Which options, and which to change.
        why: String,
    },

    /// A size or count (a buffer, an offset, a ring, a batch, a datagram, a duration) outside what works.
    #[error("{why}")]
    Size {
        /// The value and the range it must lie in.
        why: String,
    },

    /// A TAP TX filter the kernel would not apply as meant.
    #[error("{why}")]
    TxFilter {
        /// What is wrong with its addresses.
        why: String,
    },

    /// A MAC address that does not parse.
    #[error("{text:?} is not a MAC address (aa:bb:cc:dd:ee:ff)")]
    MacAddress {
        /// The text given.
        text: String,
    },

    /// A hand-over message received that does not parse or does not match the fds that came with it.
    #[error("queue hand-over message refused: {why}")]
    HandoverMessage {
        /// What is wrong with it.
        why: String,
    },

    /// Queues or fds that cannot be handed over as given.
    #[error("{why}")]
    Handover {
        /// What is wrong.
        why: String,
    },

    /// A user or group given to drop privileges to, or to own a device, that cannot be used.
    #[error("{why}")]
    User {
        /// What is wrong with it.
        why: String,
    },

    /// Privileges that cannot be dropped as asked, or that did not drop.
    #[error("{why}")]
    PrivilegeDrop {
        /// What is wrong.
        why: String,
    },

    /// A uid or gid the kernel refused for a device's owner or group.
    #[error("{request} refused {id}: not a valid {kind} in this user namespace")]
    IdRefused {
        /// The ioctl (`TUNSETOWNER`, `TUNSETGROUP`).
        request: &'static str,
        /// The id given.
        id: u32,
        /// `uid` or `gid`.
        kind: &'static str,
    },

    /// A path for a socket (or the directory of sockets) that cannot be used.
    #[error("{} {why}", path.display())]
    SocketPath {
        /// The path.
        path: std::path::PathBuf,
        /// What is wrong with it, and what to do.
        why: String,
    },

    /// A path given as a counters socket whose name is not one's (they end in `.stats`): never connected to.
    #[error(
        "{path}: not a counters socket (their names end in .stats; turbotun fwd, tunnel, wg or vhost-user serve them)"
    )]
    NotAStatsSocket {
        /// The path, as shown.
        path: String,
    },
    /// A name several engines in other network namespaces serve counters by, none in this one.
    #[error(
        "{name}: served in several network namespaces ({}): name one, or run `turbotun stats` in its namespace",
        candidates.join(", ")
    )]
    AmbiguousStatsName {
        /// The name given.
        name: String,
        /// The sockets' names (`NAME@NETNS`).
        candidates: Vec<String>,
    },
    /// A counters socket whose answer does not parse.
    #[error("{socket} answered a bad report: {reason}")]
    StatsReport {
        /// The socket, as shown.
        socket: String,
        /// What is wrong with the report.
        reason: String,
    },

    /// A line of the socket keeper's variable that is not `INODE:PATH`.
    #[error("{var}={line}: expected INODE:PATH")]
    KeeperSpec {
        /// The variable's name.
        var: &'static str,
        /// The line.
        line: String,
    },

    /// A link that is not what a request on it needs (a bridge that is not one, a VXLAN's mixed address families).
    #[error("{why}")]
    Link {
        /// What is wrong.
        why: String,
    },

    /// A network namespace path that cannot be a path (it contains a NUL byte).
    #[error("namespace path {} contains a NUL byte", path.display())]
    NamespacePath {
        /// The path.
        path: std::path::PathBuf,
    },
}
