//! The virtio header sizes a queue may have, and the check every way of getting a queue (opening, adopting an
//! fd, a hand-over) applies to them.

use crate::error::{Error, Result};

/// The virtio header sizes turbotun reads and writes: `virtio_net_hdr` (10 bytes), `_v1` (12, with
/// `num_buffers`), `_v1_hash` (20, with the hash report) and `_v1_hash_tunnel` (24, with the UDP-tunnel offsets).
/// The kernel accepts any size from 10 up (`TUNSETVNETHDRSZ`) and leaves bytes it does not know untouched; only
/// these are defined by the virtio specification, so a queue of another size is refused
/// ([`Error::UnsupportedVnetHdr`]).
pub const VNET_HDR_SIZES: [usize; 4] = [10, 12, 20, 24];

/// The largest of [`VNET_HDR_SIZES`]: room enough for any queue's header.
pub const MAX_VNET_HDR: usize = 24;

/// Refuses a virtio header size outside [`VNET_HDR_SIZES`] (0, no header, is allowed).
pub(crate) fn check_vnet_hdr_len(name: &str, len: usize) -> Result<()> {
    if len == 0 || VNET_HDR_SIZES.contains(&len) {
        Ok(())
    } else {
        Err(Error::UnsupportedVnetHdr { name: name.to_string(), len })
    }
}
