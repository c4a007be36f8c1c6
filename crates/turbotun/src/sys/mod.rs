//! The raw kernel interface: the only module in turbotun with `unsafe`.
//!
//! Everything here is a thin, typed wrapper over one system call or ioctl. Callers get `OwnedFd`s and
//! `io::Result`s; no packet is parsed here and no policy is decided here.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

pub(crate) mod bpf;
pub(crate) mod ethtool;
#[cfg(feature = "vhost-user")]
pub(crate) mod guest;
#[cfg(ipsec_mb)]
pub(crate) mod ipsec_mb;
pub(crate) mod udp;
#[cfg(feature = "uring")]
pub(crate) mod uring;

/// `IFNAMSIZ`: interface names are at most 15 bytes plus the terminating NUL.
pub(crate) const IFNAMSIZ: usize = libc::IFNAMSIZ;

/// Request flags of `TUNSETIFF` (`ifr_flags`), as the kernel's `if_tun.h` defines them.
pub mod iff {
    /// TUN device: IP packets.
    pub const TUN: u16 = libc::IFF_TUN as u16;
    /// TAP device: Ethernet frames.
    pub const TAP: u16 = libc::IFF_TAP as u16;
    /// Written packets are received through NAPI, in batches.
    pub const NAPI: u16 = libc::IFF_NAPI as u16;
    /// Writes are taken as page fragments (TAP with `NAPI` only).
    pub const NAPI_FRAGS: u16 = libc::IFF_NAPI_FRAGS as u16;
    /// The device is created with its carrier off.
    pub const NO_CARRIER: u16 = libc::IFF_NO_CARRIER as u16;
    /// No 4-byte packet information header in front of packets.
    pub const NO_PI: u16 = libc::IFF_NO_PI as u16;
    /// Obsolete: the kernel accepts it and ignores it.
    pub const ONE_QUEUE: u16 = libc::IFF_ONE_QUEUE as u16;
    /// A virtio header in front of every packet.
    pub const VNET_HDR: u16 = libc::IFF_VNET_HDR as u16;
    /// Fail with EBUSY if the device exists already.
    pub const TUN_EXCL: u16 = libc::IFF_TUN_EXCL as u16;
    /// More than one fd (queue) may attach to the device.
    pub const MULTI_QUEUE: u16 = libc::IFF_MULTI_QUEUE as u16;
    /// `TUNSETQUEUE`: attach a detached queue again.
    pub const ATTACH_QUEUE: u16 = libc::IFF_ATTACH_QUEUE as u16;
    /// `TUNSETQUEUE`: detach a queue (it stops receiving packets, its fd stays open).
    pub const DETACH_QUEUE: u16 = libc::IFF_DETACH_QUEUE as u16;
    /// The device outlives its last fd (as `tun_flags` reports it; set with `TUNSETPERSIST`).
    pub const PERSIST: u16 = libc::IFF_PERSIST as u16;
    /// `IFF_BACKPRESSURE`: opt-in flow control, proposed for tun after the series that stopped the device's
    /// queue instead of tail-dropping was reverted. No released kernel has it, so libc does not name it; the
    /// kernel ignores unknown request flags, which is why it is requested only when `TUNGETFEATURES` lists it.
    pub const BACKPRESSURE: u16 = 0x0080;
}

/// Offload bits of `TUNSETOFFLOAD`.
pub(crate) mod tun_f {
    pub(crate) const CSUM: u32 = libc::TUN_F_CSUM;
    pub(crate) const TSO4: u32 = libc::TUN_F_TSO4;
    pub(crate) const TSO6: u32 = libc::TUN_F_TSO6;
    pub(crate) const TSO_ECN: u32 = libc::TUN_F_TSO_ECN;
    pub(crate) const UFO: u32 = libc::TUN_F_UFO;
    pub(crate) const USO4: u32 = libc::TUN_F_USO4;
    pub(crate) const USO6: u32 = libc::TUN_F_USO6;
    /// Linux 6.17+: TCP/UDP super-packets inside a UDP tunnel (VXLAN, Geneve); `include/uapi/linux/if_tun.h`.
    pub(crate) const UDP_TUNNEL_GSO: u32 = 0x080;
    /// Linux 6.17+: such super-packets whose outer UDP checksum is left to the reader (with `UDP_TUNNEL_GSO`).
    pub(crate) const UDP_TUNNEL_GSO_CSUM: u32 = 0x100;
}

/// `TUN_FLT_ALLMULTI`: the TX filter passes every multicast destination.
pub(crate) const TUN_FLT_ALLMULTI: u16 = 0x0001;

/// `struct ifreq` restricted to the members the tun driver reads: a name and the flags short.
#[repr(C)]
#[derive(Clone, Copy)]
struct IfReq {
    name: [u8; IFNAMSIZ],
    flags: i16,
    // The kernel copies `sizeof(struct ifreq)` (40 bytes on 64-bit) in and out.
    _pad: [u8; 22],
}

impl IfReq {
    /// A request for `name`; a name the kernel could not hold whole (over 15 bytes, or with a NUL) is refused
    /// rather than cut, which would name another device.
    fn new(name: &str, flags: u16) -> io::Result<Self> {
        let mut req = IfReq { name: [0; IFNAMSIZ], flags: flags as i16, _pad: [0; 22] };
        let bytes = name.as_bytes();
        if bytes.len() >= IFNAMSIZ || bytes.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name {name:?} is longer than 15 bytes or contains a NUL"),
            ));
        }
        req.name[..bytes.len()].copy_from_slice(bytes);
        Ok(req)
    }

    fn name(&self) -> String {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(IFNAMSIZ);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// Opens a path read-write with `O_CLOEXEC` (and `O_NONBLOCK` when asked).
pub(crate) fn open_rdwr(path: &CStr, nonblocking: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::O_RDWR | libc::O_CLOEXEC;
    if nonblocking {
        flags |= libc::O_NONBLOCK;
    }
    // SAFETY: `path` is a valid NUL-terminated string; open returns a new fd or -1.
    let fd = cvt(unsafe { libc::open(path.as_ptr(), flags) })?;
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a path read-only with `O_CLOEXEC` (namespace files).
pub(crate) fn open_rdonly(path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid NUL-terminated string.
    let fd = cvt(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `TUNSETIFF`: attaches the fd to the named device (creating it if allowed). Returns the name the kernel chose.
pub(crate) fn tun_set_iff(fd: BorrowedFd<'_>, name: &str, flags: u16) -> io::Result<String> {
    let mut req = IfReq::new(name, flags)?;
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`; `req` is a properly sized, initialized ifreq.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) })?;
    Ok(req.name())
}

/// `TUNGETIFF`: the attached device's name and its flags as the kernel reports them.
pub(crate) fn tun_get_iff(fd: BorrowedFd<'_>) -> io::Result<(String, u16)> {
    let mut req = IfReq::new("", 0)?;
    // SAFETY: TUNGETIFF writes a `struct ifreq` into the pointed-to buffer, which is large enough.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNGETIFF, &mut req as *mut IfReq) })?;
    Ok((req.name(), req.flags as u16))
}

/// `TUNSETQUEUE`: attach (`IFF_ATTACH_QUEUE`) or detach (`IFF_DETACH_QUEUE`) this queue of a multiqueue device.
pub(crate) fn tun_set_queue(fd: BorrowedFd<'_>, flags: u16) -> io::Result<()> {
    let mut req = IfReq::new("", flags)?;
    // SAFETY: TUNSETQUEUE reads a `struct ifreq`; `req` is valid for the call.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETQUEUE, &mut req as *mut IfReq) })?;
    Ok(())
}

/// `TUNGETFEATURES`: the `IFF_*` flags this kernel's tun driver accepts.
pub(crate) fn tun_get_features(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut features: libc::c_uint = 0;
    // SAFETY: TUNGETFEATURES writes one unsigned int through the pointer.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNGETFEATURES, &mut features as *mut libc::c_uint) })?;
    Ok(features)
}

/// Ioctls whose argument is an `int` passed by pointer (`TUNSETVNETHDRSZ`, `TUNSETSNDBUF`, ...).
fn ioctl_set_int_ptr(fd: BorrowedFd<'_>, request: libc::Ioctl, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the request reads one int through the pointer, which points to a live local.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), request, &value as *const libc::c_int) })?;
    Ok(())
}

fn ioctl_get_int_ptr(fd: BorrowedFd<'_>, request: libc::Ioctl) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    // SAFETY: the request writes one int through the pointer, which points to a live local.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), request, &mut value as *mut libc::c_int) })?;
    Ok(value)
}

/// Ioctls whose argument is passed by value (`TUNSETOFFLOAD`, `TUNSETPERSIST`, `TUNSETOWNER`, ...).
fn ioctl_set_value(fd: BorrowedFd<'_>, request: libc::Ioctl, value: libc::c_ulong) -> io::Result<()> {
    // SAFETY: these requests take their argument by value and do not dereference it.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), request, value) })?;
    Ok(())
}

pub(crate) fn tun_set_vnet_hdr_sz(fd: BorrowedFd<'_>, size: i32) -> io::Result<()> {
    ioctl_set_int_ptr(fd, libc::TUNSETVNETHDRSZ, size)
}

pub(crate) fn tun_get_vnet_hdr_sz(fd: BorrowedFd<'_>) -> io::Result<i32> {
    ioctl_get_int_ptr(fd, libc::TUNGETVNETHDRSZ)
}

pub(crate) fn tun_set_offload(fd: BorrowedFd<'_>, offloads: u32) -> io::Result<()> {
    ioctl_set_value(fd, libc::TUNSETOFFLOAD, offloads as libc::c_ulong)
}

pub(crate) fn tun_set_persist(fd: BorrowedFd<'_>, persist: bool) -> io::Result<()> {
    ioctl_set_value(fd, libc::TUNSETPERSIST, persist as libc::c_ulong)
}

pub(crate) fn tun_set_owner(fd: BorrowedFd<'_>, uid: u32) -> io::Result<()> {
    ioctl_set_value(fd, libc::TUNSETOWNER, uid as libc::c_ulong)
}

pub(crate) fn tun_set_group(fd: BorrowedFd<'_>, gid: u32) -> io::Result<()> {
    ioctl_set_value(fd, libc::TUNSETGROUP, gid as libc::c_ulong)
}

/// `TUNSETLINK`: the ARPHRD link type (only while the device is down and has no queue attached elsewhere).
pub(crate) fn tun_set_link(fd: BorrowedFd<'_>, link_type: u32) -> io::Result<()> {
    ioctl_set_value(fd, libc::TUNSETLINK, link_type as libc::c_ulong)
}

pub(crate) fn tun_set_sndbuf(fd: BorrowedFd<'_>, bytes: i32) -> io::Result<()> {
    ioctl_set_int_ptr(fd, libc::TUNSETSNDBUF, bytes)
}

pub(crate) fn tun_get_sndbuf(fd: BorrowedFd<'_>) -> io::Result<i32> {
    ioctl_get_int_ptr(fd, libc::TUNGETSNDBUF)
}

pub(crate) fn tun_set_carrier(fd: BorrowedFd<'_>, carrier: bool) -> io::Result<()> {
    ioctl_set_int_ptr(fd, libc::TUNSETCARRIER, carrier as libc::c_int)
}

/// `TUNSETTXFILTER`: a TAP device's filter on destination MAC addresses, applied before a frame is queued for
/// the reader. `addrs` empty turns the filter off. Returns how many addresses the kernel matches exactly (the
/// first 8; further multicast addresses are hashed).
pub(crate) fn tun_set_tx_filter(fd: BorrowedFd<'_>, flags: u16, addrs: &[[u8; 6]]) -> io::Result<usize> {
    // `struct tun_filter { __u16 flags; __u16 count; __u8 addr[][ETH_ALEN]; }`, laid out by hand: 4 bytes of
    // header, then the addresses back to back.
    let count = u16::try_from(addrs.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "more than 65535 TX filter addresses"))?;
    let mut buf = Vec::with_capacity(4 + 6 * addrs.len());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&count.to_ne_bytes());
    for addr in addrs {
        buf.extend_from_slice(addr);
    }
    // SAFETY: TUNSETTXFILTER reads the 4-byte header and then `count` 6-byte addresses from the pointer; `buf`
    // holds exactly that and lives until the call returns.
    let n = cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETTXFILTER, buf.as_ptr()) })?;
    Ok(n as usize)
}

/// `TUNSETFILTEREBPF`: install (fd >= 0) or remove (-1) a socket-filter eBPF program run on every frame before it
/// is queued for the reader; it returns how many bytes to keep, 0 drops the frame.
pub(crate) fn tun_set_filter_ebpf(fd: BorrowedFd<'_>, prog: RawFd) -> io::Result<()> {
    ioctl_set_int_ptr(fd, libc::TUNSETFILTEREBPF, prog)
}

/// `TUNSETSTEERINGEBPF`: install (fd >= 0) or remove (-1) a queue-steering eBPF program.
pub(crate) fn tun_set_steering_ebpf(fd: BorrowedFd<'_>, prog: RawFd) -> io::Result<()> {
    ioctl_set_int_ptr(fd, libc::TUNSETSTEERINGEBPF, prog)
}

/// `TUNGETDEVNETNS`: an fd of the network namespace the device lives in now.
pub(crate) fn tun_get_dev_netns(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: TUNGETDEVNETNS takes no argument and returns a new fd or -1.
    let ns = cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNGETDEVNETNS) })?;
    // SAFETY: the kernel just created `ns` for us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(ns) })
}

/// Sets or clears `O_NONBLOCK` on the open file description.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> io::Result<()> {
    // SAFETY: F_GETFL takes no argument.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let flags = if nonblocking { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    // SAFETY: F_SETFL takes an int argument by value.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) })?;
    Ok(())
}

pub(crate) fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the duration of the call.
    cvt_size(unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) })
}

/// Moves the calling thread into the network namespace `ns` (an fd of `/run/netns/NAME` or `/proc/PID/ns/net`).
pub(crate) fn setns_net(ns: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns only reads its arguments; changing this thread's network namespace does not affect memory safety.
    cvt(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) })?;
    Ok(())
}

/// Gives the calling thread a new, private network namespace (used by tests and probes; it disappears with the
/// last thread or fd that refers to it, taking its devices along).
pub(crate) fn unshare_net() -> io::Result<()> {
    // SAFETY: CLONE_NEWNET only changes this thread's network namespace; no memory is touched.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
    Ok(())
}

/// The effective capability set of the calling thread, as the low 64 bits (CAP_NET_ADMIN is bit 12).
pub fn effective_capabilities() -> io::Result<u64> {
    // The capability header/data layout of `capget(2)`, version 3 (two 32-bit words per set).
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget reads the header and writes two CapData records, which `data` provides.
    cvt(unsafe { libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, data.as_mut_ptr()) } as libc::c_int)?;
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

/// Whether the kernel accepts io_uring set-up (it can be compiled out or disabled by sysctl).
pub(crate) fn io_uring_available() -> bool {
    #[repr(C)]
    struct IoUringParams {
        raw: [u32; 30],
    }
    let mut params = IoUringParams { raw: [0; 30] };
    // SAFETY: io_uring_setup reads/writes the 120-byte params struct; on success it returns an fd we close at once.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, &mut params as *mut IoUringParams) };
    if fd < 0 {
        return false;
    }
    // SAFETY: `fd` is a fresh io_uring fd owned by nobody else.
    drop(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    true
}

/// A value that owns one fd for its whole life: `as_raw_fd` returns the same open descriptor from creation to
/// drop (it is never replaced or closed early). What tokio's reactor needs of a registered fd.
#[cfg(feature = "tokio")]
pub(crate) trait StableFd: AsRawFd {}

#[cfg(feature = "tokio")]
impl<T: StableFd> StableFd for std::sync::Arc<T> {}

/// Registers an fd owner with tokio's reactor for readable, writable and error readiness.
#[cfg(feature = "tokio")]
pub(crate) fn register_with_tokio<T: StableFd>(owner: T) -> io::Result<::tokio::io::unix::AsyncFd<T>> {
    // Error readiness too: a deleted device reports only EPOLLERR, which readable interest alone never sees.
    let interest =
        ::tokio::io::Interest::READABLE.add(::tokio::io::Interest::WRITABLE).add(::tokio::io::Interest::ERROR);
    // SAFETY: `T: StableFd` keeps its descriptor open and unchanged for as long as it lives, and the `AsyncFd`
    // owns it, so the registration never outlives the fd nor refers to a reused number.
    unsafe { ::tokio::io::unix::AsyncFd::register_with_interest(owner, interest) }.map_err(io::Error::from)
}

/// One write gathered from several buffers (`writev`): a packet assembled from pieces without copying them.
pub(crate) fn writev(fd: BorrowedFd<'_>, bufs: &[std::io::IoSlice<'_>]) -> io::Result<usize> {
    let count = bufs.len().min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: `IoSlice` is guaranteed ABI-compatible with `struct iovec` on Unix; the slices are live and only
    // read by the kernel for the duration of the call.
    cvt_size(unsafe { libc::writev(fd.as_raw_fd(), bufs.as_ptr().cast::<libc::iovec>(), count) })
}

/// The signal that interrupts a thread blocked in a read (see [`install_wake_handler`]). A real-time signal
/// above the ones glibc keeps for itself, so that it does not collide with an application's SIGUSR1/2.
pub(crate) fn wake_signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

extern "C" fn wake_handler(_signo: libc::c_int) {
    // Nothing to do: the point is that the interrupted system call returns EINTR.
}

/// Installs a do-nothing handler for [`wake_signal`] without `SA_RESTART`, so that a blocking read in the
/// signalled thread returns `EINTR` instead of being restarted.
pub(crate) fn install_wake_handler() -> io::Result<()> {
    // SAFETY: an all-zero sigaction is a valid value (empty mask, no flags), filled in by the kernel below.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `old`, a valid sigaction owned by this frame.
    cvt(unsafe { libc::sigaction(wake_signal(), std::ptr::null(), &mut old) })?;
    let ours = wake_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SIG_IGN is most often inherited across exec (a supervisor, nohup) rather than chosen by this program; it
    // would make every wake-up a no-op, so it is replaced like the default action.
    if ![libc::SIG_DFL, libc::SIG_IGN, ours].contains(&old.sa_sigaction) {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "signal SIGRTMIN+3 ({}) already has a handler: turbotun uses it to wake blocked readers",
                wake_signal()
            ),
        ));
    }
    // SAFETY: an all-zero sigaction is a valid value (empty mask, no flags) that is filled in below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = wake_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
    action.sa_flags = 0;
    // SAFETY: `action.sa_mask` is a valid sigset_t owned by this frame.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: the handler is async-signal-safe (it does nothing) and `action` is fully initialised.
    cvt(unsafe { libc::sigaction(wake_signal(), &action, std::ptr::null_mut()) })?;
    Ok(())
}

/// Unblocks [`wake_signal`] in the calling thread (a mask inherited from the parent process or the spawning
/// thread could block it, and a blocked wake-up never interrupts the read it is meant for).
pub(crate) fn unblock_wake_signal() -> io::Result<()> {
    // SAFETY: an all-zero sigset_t is a valid value, initialised by sigemptyset below.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; the signal number is a valid real-time signal.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, wake_signal());
    }
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Sends [`wake_signal`] to one thread of this process. Only after [`install_wake_handler`] succeeded (the
/// default action of a real-time signal ends the process): `crate::wake` makes sure of it.
pub(crate) fn wake_thread<T>(thread: &std::thread::JoinHandle<T>) -> io::Result<()> {
    use std::os::unix::thread::JoinHandleExt;
    // SAFETY: the borrowed JoinHandle proves the thread has not been joined, so its pthread_t is still valid
    // (a thread that has exited but is not joined keeps its id); the caller installed the handler first.
    let rc = unsafe { libc::pthread_kill(thread.as_pthread_t(), wake_signal()) };
    if rc == 0 || rc == libc::ESRCH {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Most slices [`read_scattered`] takes: a batch of 64 buffers plus the virtio header and the overflow buffer
/// (the kernel's limit is `UIO_MAXIOV`, 1024). The iovec array lives on the stack, filled per read.
pub(crate) const MAX_SCATTER: usize = 66;

/// One read scattered over `parts` in order (at most [`MAX_SCATTER`]); with `nowait` it never sleeps
/// (`RWF_NOWAIT`, see [`read2`]).
pub(crate) fn read_scattered<'a>(
    fd: BorrowedFd<'_>,
    parts: impl IntoIterator<Item = &'a mut [u8]>,
    nowait: bool,
) -> io::Result<usize> {
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_SCATTER];
    let mut count = 0;
    for part in parts {
        let slot = iov.get_mut(count).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "too many slices"))?;
        *slot = libc::iovec { iov_base: part.as_mut_ptr().cast(), iov_len: part.len() };
        count += 1;
    }
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    // SAFETY: the first `count` iovecs describe the exclusively borrowed slices yielded above, which stay
    // borrowed (lifetime 'a) for the duration of the call; offset -1 means the current position.
    cvt_size(unsafe { libc::preadv2(fd.as_raw_fd(), iov.as_ptr(), count as i32, -1, flags) })
}

/// `SO_PEERCRED` of a connected Unix socket: the peer's pid (0 when the peer is outside the caller's PID
/// namespace), uid and gid, read into a plain `struct ucred` (the pid may be 0, which a non-zero type could not
/// hold).
pub(crate) fn peer_credentials(fd: BorrowedFd<'_>) -> io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes (one `struct ucred`) into `cred`, a live local of that size,
    // and updates `len`.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok((cred.pid, cred.uid, cred.gid))
}

/// One read scattered over the caller's slices (`preadv2`), e.g. guest memory described by a descriptor chain;
/// with `nowait` it never sleeps (`RWF_NOWAIT`).
pub(crate) fn readv(fd: BorrowedFd<'_>, bufs: &mut [std::io::IoSliceMut<'_>], nowait: bool) -> io::Result<usize> {
    let count = bufs.len().min(libc::c_int::MAX as usize) as libc::c_int;
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    // SAFETY: `IoSliceMut` is guaranteed ABI-compatible with `struct iovec` on Unix; the slices are live and
    // exclusively borrowed for the duration of the call; offset -1 means the current position.
    cvt_size(unsafe { libc::preadv2(fd.as_raw_fd(), bufs.as_ptr().cast::<libc::iovec>(), count, -1, flags) })
}

/// `TUNSETVNETLE` / `TUNSETVNETBE`: the virtio header's byte order for a legacy (pre-1.0) guest; `big` picks
/// the BE request, which kernels without `CONFIG_TUN_VNET_CROSS_LE` refuse with `EINVAL`.
pub(crate) fn tun_set_vnet_endian(fd: BorrowedFd<'_>, big: bool, on: bool) -> io::Result<()> {
    ioctl_set_int_ptr(fd, if big { libc::TUNSETVNETBE } else { libc::TUNSETVNETLE }, on as libc::c_int)
}

/// `TUNGETVNETLE` / `TUNGETVNETBE`.
pub(crate) fn tun_get_vnet_endian(fd: BorrowedFd<'_>, big: bool) -> io::Result<bool> {
    ioctl_get_int_ptr(fd, if big { libc::TUNGETVNETBE } else { libc::TUNGETVNETLE }).map(|v| v != 0)
}

/// `struct ifreq` with an `int` (`ifr_mtu`) after the name.
#[repr(C)]
struct IfReqInt {
    name: [u8; IFNAMSIZ],
    value: libc::c_int,
    _pad: [u8; 20],
}

/// `struct ifreq` with a `struct sockaddr` (`ifr_hwaddr`) after the name.
#[repr(C)]
struct IfReqAddr {
    name: [u8; IFNAMSIZ],
    family: libc::sa_family_t,
    data: [u8; 14],
    _pad: [u8; 8],
}

fn ifreq_name(name: &str) -> io::Result<[u8; IFNAMSIZ]> {
    Ok(IfReq::new(name, 0)?.name)
}

/// A datagram socket of the calling thread's network namespace, for the classic interface ioctls (which look the
/// name up in the socket's namespace). `AF_UNIX`: it needs no network protocol and no address.
pub(crate) fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket returns a new fd or -1.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is new and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `SIOCGIFMTU`: the MTU of interface `name`, through `sock`.
pub(crate) fn ifreq_get_mtu(sock: BorrowedFd<'_>, name: &str) -> io::Result<u32> {
    let mut req = IfReqInt { name: ifreq_name(name)?, value: 0, _pad: [0; 20] };
    // SAFETY: SIOCGIFMTU reads the name and writes the int member of a full-size `struct ifreq`.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU as libc::Ioctl, &mut req as *mut IfReqInt) })?;
    Ok(req.value as u32)
}

/// `SIOCSIFMTU`: sets the MTU of interface `name`, through `sock`.
pub(crate) fn ifreq_set_mtu(sock: BorrowedFd<'_>, name: &str, mtu: u32) -> io::Result<()> {
    let value = libc::c_int::try_from(mtu).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut req = IfReqInt { name: ifreq_name(name)?, value, _pad: [0; 20] };
    // SAFETY: SIOCSIFMTU reads a full-size `struct ifreq` (name and int member).
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFMTU as libc::Ioctl, &mut req as *mut IfReqInt) })?;
    Ok(())
}

/// `SIOCGIFFLAGS`: the interface flags (`IFF_UP`, ...) of `name`, through `sock`.
pub(crate) fn ifreq_get_flags(sock: BorrowedFd<'_>, name: &str) -> io::Result<u16> {
    let mut req = IfReq::new(name, 0)?;
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of a full-size `struct ifreq`.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as libc::Ioctl, &mut req as *mut IfReq) })?;
    Ok(req.flags as u16)
}

/// `SIOCSIFFLAGS`: sets the interface flags of `name`, through `sock`.
pub(crate) fn ifreq_set_flags(sock: BorrowedFd<'_>, name: &str, flags: u16) -> io::Result<()> {
    let mut req = IfReq::new(name, flags)?;
    // SAFETY: SIOCSIFFLAGS reads a full-size `struct ifreq` (name and flags).
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as libc::Ioctl, &mut req as *mut IfReq) })?;
    Ok(())
}

/// `SIOCGIFHWADDR` on the tun fd itself (the tun driver answers it for its device, in any namespace).
pub(crate) fn tun_get_hwaddr(fd: BorrowedFd<'_>) -> io::Result<[u8; 6]> {
    let mut req = IfReqAddr { name: [0; IFNAMSIZ], family: 0, data: [0; 14], _pad: [0; 8] };
    // SAFETY: the tun driver writes a full-size `struct ifreq` with the device's hardware address.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR as libc::Ioctl, &mut req as *mut IfReqAddr) })?;
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&req.data[..6]);
    Ok(mac)
}

/// `SIOCSIFHWADDR` on the tun fd itself (TAP devices; an Ethernet address).
pub(crate) fn tun_set_hwaddr(fd: BorrowedFd<'_>, mac: [u8; 6]) -> io::Result<()> {
    let mut req = IfReqAddr { name: [0; IFNAMSIZ], family: libc::ARPHRD_ETHER, data: [0; 14], _pad: [0; 8] };
    req.data[..6].copy_from_slice(&mac);
    // SAFETY: the tun driver reads a full-size `struct ifreq` holding the new address.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFHWADDR as libc::Ioctl, &mut req as *mut IfReqAddr) })?;
    Ok(())
}
