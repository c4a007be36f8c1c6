//! The index table: the random 32-bit index our side gives each handshake and session, to its peer (what a
//! response, a cookie reply or transport data names us by).

use std::sync::Arc;

use rand_core::{OsRng, RngCore};

use super::WireGuard;
use crate::peer::Peer;

impl WireGuard {
    /// A new random index for `peer`, registered.
    pub(super) fn new_index(&self, peer: &Arc<Peer>) -> u32 {
        let mut indices = self.indices.write().unwrap_or_else(|e| e.into_inner());
        loop {
            let candidate = OsRng.next_u32();
            if let std::collections::hash_map::Entry::Vacant(slot) = indices.entry(candidate) {
                slot.insert(peer.clone());
                return candidate;
            }
        }
    }

    /// Forgets indices no handshake or session holds any more.
    pub(super) fn retire(&self, gone: &[u32]) {
        if gone.is_empty() {
            return;
        }
        let mut indices = self.indices.write().unwrap_or_else(|e| e.into_inner());
        for index in gone {
            indices.remove(index);
        }
    }

    pub(super) fn peer_of_index(&self, index: u32) -> Option<Arc<Peer>> {
        self.indices.read().unwrap_or_else(|e| e.into_inner()).get(&index).cloned()
    }
}
