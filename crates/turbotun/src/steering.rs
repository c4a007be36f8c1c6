//! Queue steering eBPF programs for multiqueue devices (`TUNSETSTEERINGEBPF`).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::error::{Error, Result};
use crate::sys;
use crate::sys::bpf::{load_socket_filter, BpfInsn};

/// `r0 = imm` (BPF_ALU64 | BPF_MOV | BPF_K).
const fn mov64_imm(imm: i32) -> BpfInsn {
    BpfInsn { code: 0xb7, regs: 0, off: 0, imm }
}
/// `exit` (BPF_JMP | BPF_EXIT).
const EXIT: BpfInsn = BpfInsn { code: 0x95, regs: 0, off: 0, imm: 0 };

/// A loaded steering program. The kernel takes its return value modulo the number of queues.
#[derive(Debug)]
pub struct SteeringProgram {
    fd: OwnedFd,
}

impl SteeringProgram {
    /// A program that sends every packet to one queue (useful to pin traffic, and as the probe).
    pub fn fixed_queue(queue: u16) -> Result<Self> {
        let insns = [mov64_imm(i32::from(queue)), EXIT];
        let fd = load_socket_filter(&insns, "tt_fixed_queue").map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => {
                Error::PermissionDenied { action: "loading a steering eBPF program".into(), source: e }
            }
            Some(libc::ENOSYS) => Error::Unsupported { feature: "the bpf() system call" },
            _ => Error::io("loading a steering eBPF program", e),
        })?;
        Ok(SteeringProgram { fd })
    }

    /// Installs the program on the device that `queue` belongs to.
    pub fn attach(&self, queue: BorrowedFd<'_>) -> Result<()> {
        sys::tun_set_steering_ebpf(queue, self.fd.as_raw_fd()).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOTTY) => Error::Unsupported { feature: "TUNSETSTEERINGEBPF" },
            _ => Error::io("TUNSETSTEERINGEBPF", e),
        })
    }

    /// Removes whatever steering program the device has (back to the kernel's flow-hash steering).
    pub fn detach(queue: BorrowedFd<'_>) -> Result<()> {
        sys::tun_set_steering_ebpf(queue, -1).map_err(|e| Error::io("TUNSETSTEERINGEBPF(-1)", e))
    }
}

/// Loads a trivial program and installs then removes it on `scratch`, a multiqueue device's queue.
pub(crate) fn probe(scratch: BorrowedFd<'_>) -> std::result::Result<(), String> {
    let prog = SteeringProgram::fixed_queue(0).map_err(|e| e.to_string())?;
    prog.attach(scratch).map_err(|e| e.to_string())?;
    SteeringProgram::detach(scratch).map_err(|e| e.to_string())
}
