//! The `bpf(2)` system call, only as far as queue steering needs it: loading a socket-filter program.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfInsn {
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
/// On a verifier rejection the error carries the verifier's log.
pub fn load_socket_filter(insns: &[BpfInsn], name: &str) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let mut prog_name = [0u8; 16];
    let n = name.len().min(15);
    prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_SOCKET_FILTER,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name,
        _rest: [0; 56],
    };
    // SAFETY: `attr` points to a zero-padded bpf_attr whose pointers (insns, license, log) stay alive for the call;
    // the size passed is the size of that struct.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &mut attr as *mut ProgLoadAttr,
            std::mem::size_of::<ProgLoadAttr>() as libc::c_uint,
        )
    };
    if fd < 0 {
        let err = io::Error::last_os_error();
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        if end > 0 {
            let text = String::from_utf8_lossy(&log[..end]).trim().to_string();
            return Err(io::Error::new(err.kind(), format!("{err}; verifier: {text}")));
        }
        return Err(err);
    }
    // SAFETY: the kernel returned a new program fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}
