//! The bench itself is benches/aead.rs; this holds the binding to Intel's IPsec-MB (csrc/ipsecmb.c), which the
//! bench's build links through this crate.

/// Intel's IPsec-MB (Debian's libipsec-mb-dev, through csrc/ipsecmb.c): AVX-512 ChaCha20 and IFMA Poly1305 on a
/// CPU with them, one synchronous job per message, a manager per thread.
pub struct IpsecMb {
    mgr: *mut std::ffi::c_void,
}

extern "C" {
    fn tt_imb_new() -> *mut std::ffi::c_void;
    fn tt_imb_free(mgr: *mut std::ffi::c_void);
    fn tt_imb_arch(mgr: *const std::ffi::c_void) -> std::ffi::c_int;
    fn tt_imb_chacha20_poly1305(
        mgr: *mut std::ffi::c_void,
        key: *const u8,
        nonce: *const u8,
        buf: *mut u8,
        len: u64,
        tag: *mut u8,
        encrypt: std::ffi::c_int,
    ) -> std::ffi::c_int;
}

impl IpsecMb {
    /// A manager for this thread, the best architecture the CPU runs.
    pub fn new() -> Self {
        // SAFETY: no arguments; a null return is checked.
        let mgr = unsafe { tt_imb_new() };
        assert!(!mgr.is_null(), "IPsec-MB: no manager");
        IpsecMb { mgr }
    }

    /// The manager's architecture (IPsec-MB's `IMB_ARCH`: 5 is AVX-512).
    pub fn arch(&self) -> i32 {
        // SAFETY: `mgr` is a live manager.
        unsafe { tt_imb_arch(self.mgr) }
    }

    /// Seals (`encrypt`) or opens `text` in place with ChaCha20-Poly1305 and no associated data, writing the tag
    /// it computes into `tag`.
    pub fn run(&mut self, key: &[u8; 32], nonce: &[u8; 12], text: &mut [u8], tag: &mut [u8; 16], encrypt: bool) {
        // SAFETY: the manager is live and used by this thread only (`&mut self`); key, nonce, text and tag are
        // valid for their lengths for the call, which completes before it returns (the library's ChaCha20-Poly1305
        // jobs are synchronous).
        let status = unsafe {
            tt_imb_chacha20_poly1305(
                self.mgr,
                key.as_ptr(),
                nonce.as_ptr(),
                text.as_mut_ptr(),
                text.len() as u64,
                tag.as_mut_ptr(),
                encrypt.into(),
            )
        };
        assert_eq!(status, 0, "IPsec-MB job failed");
    }
}

impl Default for IpsecMb {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for IpsecMb {
    fn drop(&mut self) {
        // SAFETY: made by tt_imb_new, freed once.
        unsafe { tt_imb_free(self.mgr) }
    }
}
