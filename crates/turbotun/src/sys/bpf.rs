//! The `bpf(2)` system call, only as far as queue steering needs it: loading a socket-filter program.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BpfInsn {
    pub code: u8,
    /// dst_reg in the low nibble, src_reg in the high nibble.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;

/// The `BPF_PROG_LOAD` member of `union bpf_attr`, up to `prog_name`; the rest stays zero as the kernel requires.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    _rest: [u8; 56],
}

/// Loads a socket-filter program (the type `TUNSETSTEERINGEBPF` expects) and returns its fd.
///
/// The first load asks for no verifier log: with a log the kernel fails a valid program with `ENOSPC` when the
/// log outgrows its buffer (a long program logs a line per instruction). Only a refused program is loaded again
/// with a log, grown until it holds the verifier's reason, which the error then carries.
pub(crate) fn load_socket_filter(insns: &[BpfInsn], name: &str) -> io::Result<OwnedFd> {
    let err = match prog_load(insns, name, None) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    let mut size = 64 << 10;
    loop {
        let mut log = vec![0u8; size];
        match prog_load(insns, name, Some(&mut log)) {
            // Accepted this time (a transient refusal): use it.
            Ok(fd) => return Ok(fd),
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && size < MAX_LOG => size *= 4,
            Err(_) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]).trim().to_string();
                if text.is_empty() {
                    return Err(err);
                }
                return Err(io::Error::new(err.kind(), format!("{err}; verifier: {text}")));
            }
        }
    }
}

/// Largest verifier log asked for when explaining a refusal.
const MAX_LOG: usize = 16 << 20;

/// One `BPF_PROG_LOAD`; with `log`, at level 1 into it.
fn prog_load(insns: &[BpfInsn], name: &str, log: Option<&mut [u8]>) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut prog_name = [0u8; 16];
    let n = name.len().min(15);
    prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let (log_level, log_size, log_buf) = match log {
        Some(log) => (1, log.len() as u32, log.as_mut_ptr() as u64),
        None => (0, 0, 0),
    };
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_SOCKET_FILTER,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level,
        log_size,
        log_buf,
        kern_version: 0,
        prog_flags: 0,
        prog_name,
        _rest: [0; 56],
    };
    // SAFETY: `attr` points to a zero-padded bpf_attr whose pointers (insns, license, and the log if any) stay
    // alive for the call; the size passed is the size of that struct.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &mut attr as *mut ProgLoadAttr,
            std::mem::size_of::<ProgLoadAttr>() as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new program fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}
