//! What the kernel queues for the reader of a device: the TAP TX filter on destination MAC addresses
//! (`TUNSETTXFILTER`, [`TxFilter`]) and an eBPF socket filter run on every frame (`TUNSETFILTEREBPF`,
//! [`FilterProgram`]).
//!
//! Both live on the device, not on one queue: they apply to every queue and stay while the device exists (a
//! persistent device keeps them after its last fd closes). Frames they drop never reach userspace; the kernel
//! counts them in the interface's `tx_dropped`. The kernel offers no way to read either back.

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::configuration::netlink::mac_to_string;
use crate::error::{ConfigError, Error, Result};
use crate::sys;
use crate::sys::bpf::{load_socket_filter, BpfInsn};

/// How many addresses the kernel's TX filter compares exactly (`FLT_EXACT_COUNT` in `drivers/net/tun.c`). Further
/// multicast addresses go into a 64-bit hash, which lets a few other multicast groups through; a ninth unicast
/// address would turn the filter off, so [`TxFilter`] refuses it.
pub const TX_FILTER_EXACT: usize = 8;

/// The broadcast address `ff:ff:ff:ff:ff:ff`.
pub const BROADCAST: [u8; 6] = [0xff; 6];

fn is_multicast(mac: &[u8; 6]) -> bool {
    mac[0] & 1 != 0
}

/// A TAP device's TX filter (`TUNSETTXFILTER`): only frames whose destination MAC address is listed, or (with
/// [`TxFilter::all_multicast`]) any multicast or broadcast frame, are queued for the reader. Everything else is
/// dropped by the kernel before it is queued: frames for other MAC addresses, as a bridge floods them, never
/// reach a VM that is not meant to see them. Broadcast is a multicast address like any other: list it
/// ([`TxFilter::broadcast`]) or allow all multicast, or ARP requests stop arriving.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxFilter {
    unicast: Vec<[u8; 6]>,
    multicast: Vec<[u8; 6]>,
    all_multicast: bool,
}

impl TxFilter {
    /// A filter that passes nothing yet; add addresses.
    pub fn new() -> Self {
        Self::default()
    }
    /// Passes frames to this unicast address (at most [`TX_FILTER_EXACT`]).
    pub fn unicast(mut self, mac: [u8; 6]) -> Self {
        self.unicast.push(mac);
        self
    }
    /// Passes frames to this multicast address (hashed beyond the first [`TX_FILTER_EXACT`] addresses).
    pub fn multicast(mut self, mac: [u8; 6]) -> Self {
        self.multicast.push(mac);
        self
    }
    /// Passes broadcast frames (ARP requests, DHCP).
    pub fn broadcast(self) -> Self {
        self.multicast(BROADCAST)
    }
    /// Passes every multicast and broadcast frame (`TUN_FLT_ALLMULTI`).
    pub fn all_multicast(mut self, on: bool) -> Self {
        self.all_multicast = on;
        self
    }
    /// The unicast addresses passed.
    pub fn unicast_addresses(&self) -> &[[u8; 6]] {
        &self.unicast
    }
    /// The multicast addresses passed.
    pub fn multicast_addresses(&self) -> &[[u8; 6]] {
        &self.multicast
    }
    /// Whether every multicast frame passes.
    pub fn passes_all_multicast(&self) -> bool {
        self.all_multicast
    }

    /// Whether a frame to `dst` passes, as the kernel decides it (`drivers/net/tun.c`, `run_filter`), except
    /// that the kernel's hash of the multicast addresses after the first eight may also pass a few others.
    pub fn passes(&self, dst: &[u8; 6]) -> bool {
        self.unicast.contains(dst) || (is_multicast(dst) && (self.all_multicast || self.multicast.contains(dst)))
    }

    /// Parses `aa:bb:cc:dd:ee:ff,...` with the words `broadcast` and `allmulti`: unicast and multicast addresses
    /// are told apart by the group bit of their first byte.
    pub fn parse(list: &str) -> Result<TxFilter> {
        let mut filter = TxFilter::new();
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            filter = match word {
                "broadcast" => filter.broadcast(),
                "allmulti" => filter.all_multicast(true),
                _ => {
                    let mac = parse_mac(word)?;
                    if is_multicast(&mac) {
                        filter.multicast(mac)
                    } else {
                        filter.unicast(mac)
                    }
                }
            };
        }
        Ok(filter)
    }

    /// The `TUNSETTXFILTER` flags and address list: unicast addresses first (exact), then multicast.
    fn to_kernel(&self) -> Result<(u16, Vec<[u8; 6]>)> {
        if let Some(mac) = self.unicast.iter().find(|m| is_multicast(m)) {
            return Err(Error::Config(ConfigError::TxFilter {
                why: format!("TX filter: {} is a multicast address, not a unicast one", mac_to_string(mac)),
            }));
        }
        if let Some(mac) = self.multicast.iter().find(|m| !is_multicast(m)) {
            return Err(Error::Config(ConfigError::TxFilter {
                why: format!("TX filter: {} is a unicast address, not a multicast one", mac_to_string(mac)),
            }));
        }
        if self.unicast.len() > TX_FILTER_EXACT {
            return Err(Error::Config(ConfigError::TxFilter {
                why: format!(
                    "TX filter: {} unicast addresses, the kernel matches at most {TX_FILTER_EXACT} (more turns it off)",
                    self.unicast.len()
                ),
            }));
        }
        let mut addrs: Vec<[u8; 6]> = self.unicast.iter().chain(&self.multicast).copied().collect();
        if addrs.is_empty() {
            if !self.all_multicast {
                return Err(Error::Config(ConfigError::TxFilter {
                    why: "TX filter without any address: the kernel would turn the filter off and pass everything; \
                     to drop every frame attach FilterProgram::drop_all()"
                        .into(),
                }));
            }
            // The kernel enables the filter only with at least one address; broadcast passes anyway.
            addrs.push(BROADCAST);
        }
        let flags = if self.all_multicast { sys::TUN_FLT_ALLMULTI } else { 0 };
        Ok((flags, addrs))
    }
}

impl fmt::Display for TxFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words: Vec<String> = self.unicast.iter().chain(&self.multicast).map(mac_to_string).collect();
        if self.all_multicast {
            words.push("allmulti".into());
        }
        f.write_str(&words.join(","))
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Result<[u8; 6]> {
    let bad = || Error::Config(ConfigError::MacAddress { text: text.to_string() });
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next().ok_or_else(bad)?;
        if part.is_empty() || part.len() > 2 {
            return Err(bad());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(mac)
}

/// Installs `filter` on the device `queue` belongs to, or turns the filter off with `None`. TAP devices only.
pub fn set_tx_filter(queue: BorrowedFd<'_>, filter: Option<&TxFilter>) -> Result<()> {
    let (flags, addrs) = match filter {
        Some(filter) => filter.to_kernel()?,
        None => (0, Vec::new()),
    };
    sys::tun_set_tx_filter(queue, flags, &addrs).map(|_| ()).map_err(|e| match e.raw_os_error() {
        Some(libc::EINVAL) => Error::NotTap {
            name: sys::tun_get_iff(queue).map_or_else(|_| "the queue's device".to_string(), |(name, _)| name),
            what: "TX filters (TUNSETTXFILTER)",
        },
        _ => Error::io("TUNSETTXFILTER", e),
    })
}

/// `__sk_buff` offsets an eBPF socket filter may read (`include/uapi/linux/bpf.h`).
const SKB_LEN: i16 = 0;
const SKB_PROTOCOL: i16 = 16;

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> BpfInsn {
    BpfInsn { code, regs: (src << 4) | (dst & 0x0f), off, imm }
}
/// `dst = *(u32 *)(src + off)` (BPF_LDX | BPF_MEM | BPF_W).
const fn ldx_w(dst: u8, src: u8, off: i16) -> BpfInsn {
    insn(0x61, dst, src, off, 0)
}
/// `if dst == imm goto +off` (BPF_JMP | BPF_JEQ | BPF_K).
const fn jeq_imm(dst: u8, imm: i32, off: i16) -> BpfInsn {
    insn(0x15, dst, 0, off, imm)
}
/// `r0 = imm` (BPF_ALU64 | BPF_MOV | BPF_K).
const fn mov_r0(imm: i32) -> BpfInsn {
    insn(0xb7, 0, 0, 0, imm)
}
const EXIT: BpfInsn = insn(0x95, 0, 0, 0, 0);

/// The program of [`FilterProgram::allow_protocols`]: load `skb->protocol`, one equality test per protocol
/// jumping to the accept block, else return 0; accept returns `skb->len`.
fn protocol_insns(protocols: &[u16]) -> Vec<BpfInsn> {
    let n = protocols.len() as i16;
    let mut insns = vec![ldx_w(2, 1, SKB_PROTOCOL)];
    for (i, &proto) in protocols.iter().enumerate() {
        // skb->protocol is kept in network byte order; the program sees those two bytes as a native u16.
        let value = u16::from_ne_bytes(proto.to_be_bytes());
        insns.push(jeq_imm(2, i32::from(value), n + 1 - i as i16));
    }
    insns.extend([mov_r0(0), EXIT, ldx_w(0, 1, SKB_LEN), EXIT]);
    insns
}

/// A loaded eBPF socket filter for `TUNSETFILTEREBPF`. The kernel runs it on every frame about to be queued for
/// the reader, TUN or TAP, and keeps as many bytes as it returns: 0 drops the frame.
#[derive(Debug)]
pub struct FilterProgram {
    fd: OwnedFd,
    what: String,
}

impl FilterProgram {
    /// Drops every frame.
    pub fn drop_all() -> Result<Self> {
        Self::load(&[mov_r0(0), EXIT], "tt_drop_all", "drop all".into())
    }

    /// Passes, whole, only frames whose protocol (`skb->protocol`: the EtherType, such as 0x0800 IPv4, 0x86dd
    /// IPv6, 0x0806 ARP) is listed; drops the rest.
    pub fn allow_protocols(protocols: &[u16]) -> Result<Self> {
        if protocols.is_empty() || protocols.len() > 64 {
            return Err(Error::Config(ConfigError::Size {
                why: format!("an eBPF protocol filter needs 1 to 64 protocols, not {}", protocols.len()),
            }));
        }
        let insns = protocol_insns(protocols);
        let what = protocols.iter().map(|p| format!("{p:#06x}")).collect::<Vec<_>>().join(",");
        Self::load(&insns, "tt_allow_proto", format!("allow protocols {what}"))
    }

    /// A socket-filter program loaded elsewhere (with aya, libbpf, ...), as its fd.
    pub fn from_fd(fd: OwnedFd) -> Self {
        FilterProgram { fd, what: "external program".into() }
    }

    fn load(insns: &[BpfInsn], name: &str, what: String) -> Result<Self> {
        let fd = load_socket_filter(insns, name).map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => Error::PermissionDenied { action: "loading an eBPF filter program".into(), source: e },
            Some(libc::ENOSYS) => Error::Unsupported { feature: "the bpf() system call" },
            _ => Error::io("loading an eBPF filter program", e),
        })?;
        Ok(FilterProgram { fd, what })
    }

    /// What the program does, in words.
    pub fn description(&self) -> &str {
        &self.what
    }

    /// Installs the program on the device `queue` belongs to (replacing any filter program it had).
    pub fn attach(&self, queue: BorrowedFd<'_>) -> Result<()> {
        sys::tun_set_filter_ebpf(queue, self.fd.as_raw_fd()).map_err(|e| Error::tun_ebpf_ioctl("TUNSETFILTEREBPF", e))
    }

    /// Removes the filter program of the device `queue` belongs to, if it has one.
    pub fn detach(queue: BorrowedFd<'_>) -> Result<()> {
        sys::tun_set_filter_ebpf(queue, -1).map_err(|e| Error::io("TUNSETFILTEREBPF(-1)", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VM: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
    const MDNS: [u8; 6] = [0x01, 0x00, 0x5e, 0, 0, 0xfb];

    #[test]
    fn test_tx_filter_kernel_list_and_passes() {
        let f = TxFilter::new().multicast(MDNS).unicast(VM).broadcast();
        let (flags, addrs) = f.to_kernel().unwrap();
        assert_eq!(flags, 0);
        assert_eq!(addrs, vec![VM, MDNS, BROADCAST], "unicast first, in the exact slots");
        assert!(f.passes(&VM) && f.passes(&MDNS) && f.passes(&BROADCAST));
        assert!(!f.passes(&[0x52, 0x54, 0, 0x12, 0x34, 0x57]));
        assert!(!f.passes(&[0x01, 0x00, 0x5e, 0, 0, 0x01]));
        let all = TxFilter::new().all_multicast(true);
        assert_eq!(all.to_kernel().unwrap(), (sys::TUN_FLT_ALLMULTI, vec![BROADCAST]));
        assert!(all.passes(&MDNS) && !all.passes(&VM));
    }

    #[test]
    fn test_tx_filter_refusals() {
        let err = TxFilter::new().to_kernel().unwrap_err().to_string();
        assert!(err.contains("without any address") && err.contains("drop_all"), "{err}");
        let err = TxFilter::new().unicast(MDNS).to_kernel().unwrap_err().to_string();
        assert!(err.contains("01:00:5e:00:00:fb is a multicast address"), "{err}");
        let err = TxFilter::new().multicast(VM).to_kernel().unwrap_err().to_string();
        assert!(err.contains("is a unicast address"), "{err}");
        let nine = (0..9u8).fold(TxFilter::new(), |f, i| f.unicast([2, 0, 0, 0, 0, i]));
        let err = nine.to_kernel().unwrap_err().to_string();
        assert!(err.contains("9 unicast addresses") && err.contains("at most 8"), "{err}");
    }

    #[test]
    fn test_parse_filter_and_mac() {
        let f = TxFilter::parse("52:54:00:12:34:56, broadcast,01:00:5e:00:00:fb,allmulti").unwrap();
        assert_eq!(f, TxFilter::new().unicast(VM).broadcast().multicast(MDNS).all_multicast(true));
        assert_eq!(f.to_string(), "52:54:00:12:34:56,ff:ff:ff:ff:ff:ff,01:00:5e:00:00:fb,allmulti");
        for bad in ["52:54:00:12:34", "52:54:00:12:34:56:78", "52:54:00:12:34:5g", "525:4:00:12:34:56", ""] {
            let err = parse_mac(bad).unwrap_err().to_string();
            assert!(err.contains("is not a MAC address"), "{bad}: {err}");
        }
        assert!(TxFilter::parse("broadcast,zz").is_err());
    }

    /// The protocol filter's jumps all land on the accept block.
    #[test]
    fn test_protocol_program_layout() {
        for n in 1..5u16 {
            let protocols: Vec<u16> = (0..n).map(|i| 0x0800 + i).collect();
            let insns = protocol_insns(&protocols);
            assert_eq!(insns.len(), usize::from(n) + 5);
            for (i, proto) in protocols.iter().enumerate() {
                let at = 1 + i;
                assert_eq!(insns[at].code, 0x15);
                assert_eq!(insns[at].imm, i32::from(u16::from_ne_bytes(proto.to_be_bytes())));
                let target = at as i16 + 1 + insns[at].off;
                assert_eq!(insns[target as usize], ldx_w(0, 1, SKB_LEN), "n {n} jump {i}");
            }
            assert_eq!(insns[usize::from(n) + 1], mov_r0(0), "no match: drop");
        }
    }
}
