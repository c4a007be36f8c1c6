//! Intel's IPsec-MB library (through `ipsec_mb.c`, compiled by build.rs where the library is installed): its
//! ChaCha20-Poly1305, one synchronous job per call, on the calling thread's own manager.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::OnceLock;

thread_local! {
    /// This thread's manager, made on its first job (a manager is one thread's); `Some(None)` once making it
    /// failed, so that a failure is not retried on every packet.
    static MANAGER: RefCell<Option<Option<Manager>>> = const { RefCell::new(None) };
}

/// Whether a manager can be made and runs the AVX-512 code (probed once).
pub(crate) fn runs_avx512() -> bool {
    static AVX512: OnceLock<bool> = OnceLock::new();
    *AVX512.get_or_init(|| Manager::new().is_some_and(|m| m.is_avx512()))
}

/// Seals (`encrypt`) or opens `text` in place with ChaCha20-Poly1305 on this thread's manager, writing the tag it
/// computes into `tag`. Returns whether the job completed (`false` also when this thread has no manager).
pub(crate) fn chacha20_poly1305(
    key: &[u8; 32],
    nonce: &[u8; 12],
    aad: &[u8],
    text: &mut [u8],
    tag: &mut [u8; 16],
    encrypt: bool,
) -> bool {
    MANAGER.with_borrow_mut(|manager| {
        let manager = manager.get_or_insert_with(Manager::new);
        manager.as_mut().is_some_and(|m| m.job(key, nonce, aad, text, tag, encrypt))
    })
}

/// One seal or open, as the glue takes it (`struct turbotun_imb_aead` in ipsec_mb.c): pointers and lengths.
#[repr(C)]
struct AeadJob {
    key: *const u8,
    nonce: *const u8,
    aad: *const u8,
    aad_len: u64,
    buf: *mut u8,
    len: u64,
    tag: *mut u8,
    encrypt: c_int,
}

extern "C" {
    fn turbotun_imb_new() -> *mut c_void;
    fn turbotun_imb_free(mgr: *mut c_void);
    fn turbotun_imb_is_avx512(mgr: *const c_void) -> c_int;
    fn turbotun_imb_chacha20_poly1305(mgr: *mut c_void, job: *const AeadJob) -> c_int;
}

/// The longest text one ChaCha20-Poly1305 job takes (RFC 8439: 2^32 - 1 blocks of 64 bytes, less the block
/// Poly1305's key comes from).
const MAX_TEXT: usize = (1 << 38) - 64;

/// A multi-buffer manager (`IMB_MGR`): not `Send`, since its jobs and state belong to the thread using it.
struct Manager(NonNull<c_void>);

impl Manager {
    /// A manager with the best code this CPU runs, or `None` when the library could not make one.
    fn new() -> Option<Manager> {
        // SAFETY: no arguments; the glue returns a manager it allocated and initialized, or null.
        NonNull::new(unsafe { turbotun_imb_new() }).map(Manager)
    }

    /// Whether it runs the AVX-512 code.
    fn is_avx512(&self) -> bool {
        // SAFETY: `self.0` is a live manager.
        unsafe { turbotun_imb_is_avx512(self.0.as_ptr()) != 0 }
    }

    /// [`chacha20_poly1305`] on this manager.
    fn job(
        &mut self,
        key: &[u8; 32],
        nonce: &[u8; 12],
        aad: &[u8],
        text: &mut [u8],
        tag: &mut [u8; 16],
        encrypt: bool,
    ) -> bool {
        // The glue submits without the library's own check of the job, so the one limit the types leave open is
        // kept here: ChaCha20's 32-bit block counter.
        if text.len() > MAX_TEXT {
            return false;
        }
        let job = AeadJob {
            key: key.as_ptr(),
            nonce: nonce.as_ptr(),
            aad: aad.as_ptr(),
            aad_len: aad.len() as u64,
            buf: text.as_mut_ptr(),
            len: text.len() as u64,
            tag: tag.as_mut_ptr(),
            encrypt: c_int::from(encrypt),
        };
        // SAFETY: the manager is live and used by this thread alone (`&mut self`, and `Manager` is not `Send`);
        // every pointer is valid for the length given with it for the whole call, which completes the job before
        // it returns (the library's ChaCha20-Poly1305 jobs are synchronous, and the glue flushes any it held); the
        // key, nonce and tag have the sizes the job declares, and the length is within the library's limit.
        let status = unsafe { turbotun_imb_chacha20_poly1305(self.0.as_ptr(), &job) };
        status == 0
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        // SAFETY: made by turbotun_imb_new and freed once, here.
        unsafe { turbotun_imb_free(self.0.as_ptr()) }
    }
}
