//! The virtio-net features the backend offers and their names, as the connection line says them.

use vhost::vhost_user::message::VhostUserVirtioFeatures;

use turbotun_wire::virtio_net::features as f;

/// The virtio feature bits (`VIRTIO_F_*`, `VIRTIO_RING_F_*`) this device offers besides the net ones.
pub(crate) const VERSION_1: u32 = virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
pub(crate) const EVENT_IDX: u32 = virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
pub(crate) const INDIRECT_DESC: u32 = virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;

pub(crate) fn bit(n: u32) -> u64 {
    1u64 << n
}

/// The virtio-net features offered for a TAP: checksum and segmentation offloads both ways (those for UDP only
/// where the kernel takes USO), mergeable receive buffers, event index and indirect descriptors. The guest's
/// acknowledged subset decides the TAP's offloads ([`Offloads::for_guest_features`]).
pub(crate) fn offered_features(uso: bool, queue_pairs: usize) -> u64 {
    let mut bits = vec![
        f::CSUM,
        f::GUEST_CSUM,
        f::GUEST_TSO4,
        f::GUEST_TSO6,
        f::GUEST_ECN,
        f::GUEST_UFO,
        f::HOST_TSO4,
        f::HOST_TSO6,
        f::HOST_ECN,
        f::HOST_UFO,
        f::MRG_RXBUF,
        VERSION_1,
        EVENT_IDX,
        INDIRECT_DESC,
    ];
    if uso {
        bits.extend([f::GUEST_USO4, f::GUEST_USO6, f::HOST_USO]);
    }
    // The control queue that picks how many pairs the guest uses is the front end's own (QEMU's, virtio-user's):
    // the backend offers the feature and serves whichever pairs are enabled.
    if queue_pairs > 1 {
        bits.push(f::MQ);
    }
    bits.into_iter().fold(VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), |w, n| w | bit(n))
}

/// The names of the virtio features in `features` this backend offers (`VIRTIO_NET_F_`, `VIRTIO_F_` and
/// `VIRTIO_RING_F_` taken off, lower case), as its connection line says them.
pub(crate) fn feature_names(features: u64) -> String {
    const NAMES: &[(u32, &str)] = &[
        (f::CSUM, "csum"),
        (f::GUEST_CSUM, "guest_csum"),
        (f::MQ, "mq"),
        (f::MRG_RXBUF, "mrg_rxbuf"),
        (f::GUEST_TSO4, "guest_tso4"),
        (f::GUEST_TSO6, "guest_tso6"),
        (f::GUEST_ECN, "guest_ecn"),
        (f::GUEST_UFO, "guest_ufo"),
        (f::GUEST_USO4, "guest_uso4"),
        (f::GUEST_USO6, "guest_uso6"),
        (f::HOST_TSO4, "host_tso4"),
        (f::HOST_TSO6, "host_tso6"),
        (f::HOST_ECN, "host_ecn"),
        (f::HOST_UFO, "host_ufo"),
        (f::HOST_USO, "host_uso"),
        (VERSION_1, "version_1"),
        (EVENT_IDX, "event_idx"),
        (INDIRECT_DESC, "indirect_desc"),
    ];
    let names: Vec<&str> = NAMES.iter().filter(|(n, _)| features & bit(*n) != 0).map(|(_, name)| *name).collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(",")
    }
}
