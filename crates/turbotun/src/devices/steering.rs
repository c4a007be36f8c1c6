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

/// `SKF_NET_OFF`: packet loads relative to the network header, so one program serves TUN (IP first) and TAP
/// (Ethernet first).
const NET: i32 = -0x10_0000;

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> BpfInsn {
    BpfInsn { code, regs: (src << 4) | (dst & 0x0f), off, imm }
}
/// `r0 = ntohl(*(u32 *)(net + k))` (BPF_LD | BPF_ABS | BPF_W; implicit context in r6).
const fn ld_net_w(k: i32) -> BpfInsn {
    insn(0x20, 0, 0, 0, NET + k)
}
/// `r0 = *(u8 *)(net + k)` (BPF_LD | BPF_ABS | BPF_B).
const fn ld_net_b(k: i32) -> BpfInsn {
    insn(0x30, 0, 0, 0, NET + k)
}
const fn mov64_reg(dst: u8, src: u8) -> BpfInsn {
    insn(0xbf, dst, src, 0, 0)
}
const fn xor64_reg(dst: u8, src: u8) -> BpfInsn {
    insn(0xaf, dst, src, 0, 0)
}
const fn rsh64_imm(dst: u8, imm: i32) -> BpfInsn {
    insn(0x77, dst, 0, 0, imm)
}

/// Steers by a hash of addresses and ports read from the packet: IPv4 `src ^ dst ^ ports` (no options assumed),
/// IPv6 the last words of both addresses and the ports (no extension headers assumed), folded to 16 bits. A load
/// past the end of a short packet ends the program with 0 (queue 0).
const FLOW_HASH: [BpfInsn; 21] = [
    mov64_reg(6, 1),        // 0: r6 = ctx, as LD_ABS requires
    ld_net_b(0),            // 1: r0 = version/IHL byte
    rsh64_imm(0, 4),        // 2: r0 = IP version
    insn(0x15, 0, 0, 7, 6), // 3: if r0 == 6 goto 11
    ld_net_w(12),           // 4: IPv4 source
    mov64_reg(7, 0),        // 5
    ld_net_w(16),           // 6: IPv4 destination
    xor64_reg(7, 0),        // 7
    ld_net_w(20),           // 8: ports (IHL 5)
    xor64_reg(0, 7),        // 9
    insn(0x05, 0, 0, 6, 0), // 10: goto 17
    ld_net_w(20),           // 11: IPv6 source, last word
    mov64_reg(7, 0),        // 12
    ld_net_w(36),           // 13: IPv6 destination, last word
    xor64_reg(7, 0),        // 14
    ld_net_w(40),           // 15: ports
    xor64_reg(0, 7),        // 16
    mov64_reg(7, 0),        // 17: fold the high half in
    rsh64_imm(7, 16),       // 18
    xor64_reg(0, 7),        // 19
    EXIT,                   // 20: the kernel takes r0 modulo the number of queues
];

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

    /// A program that steers by a hash of the packet's addresses and ports, so every packet of a flow goes to
    /// the same queue (`skb->hash` is not usable here: an unconnected UDP socket leaves it 0).
    pub fn flow_hash() -> Result<Self> {
        let fd = load_socket_filter(&FLOW_HASH, "tt_flow_hash")
            .map_err(|e| Error::io("loading the flow-hash steering program", e))?;
        Ok(SteeringProgram { fd })
    }

    /// Installs the program on the device that `queue` belongs to.
    pub fn attach(&self, queue: BorrowedFd<'_>) -> Result<()> {
        sys::tun_set_steering_ebpf(queue, self.fd.as_raw_fd())
            .map_err(|e| Error::tun_ebpf_ioctl("TUNSETSTEERINGEBPF", e))
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
