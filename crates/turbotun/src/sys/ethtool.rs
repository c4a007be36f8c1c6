//! `SIOCETHTOOL`: the active netdev features of any interface, by name (what `ethtool -k` shows).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GFEATURES: u32 = 0x3a;
const ETH_SS_FEATURES: u32 = 4;
const ETH_GSTRING_LEN: usize = 32;

#[repr(C)]
struct IfReqData {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: socket() takes plain integers and returns a new fd or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Issues one `SIOCETHTOOL` request whose command buffer is `buf` (a u32 array starting with the command).
fn ethtool(sock: &OwnedFd, ifname: &str, buf: &mut [u32]) -> io::Result<()> {
    let mut req = IfReqData { name: [0; libc::IFNAMSIZ], data: buf.as_mut_ptr().cast(), _pad: [0; 16] };
    // A name cut to fit would ask about another device: refuse it.
    if ifname.len() >= libc::IFNAMSIZ || ifname.as_bytes().contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("interface name {ifname:?} is too long")));
    }
    req.name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    // SAFETY: `req` is a valid ifreq whose data pointer refers to `buf`, which is large enough for the command
    // (the callers size it from the counts the kernel reported) and lives for the duration of the call.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req as *mut IfReqData) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Every feature of `ifname` with whether it is active: `("tx-tcp-segmentation", true)`, ...
pub(crate) fn features(ifname: &str) -> io::Result<Vec<(String, bool)>> {
    let sock = socket()?;
    // struct ethtool_sset_info { cmd; reserved; u64 sset_mask; u32 data[] }: ask for one set.
    let mut sset = [ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0, 0];
    ethtool(&sock, ifname, &mut sset)?;
    let count = sset[4] as usize;
    if count == 0 || count > 4096 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{count} feature names")));
    }
    // struct ethtool_gstrings { cmd; string_set; len; u8 data[len * 32] }.
    let mut strings = vec![0u32; 3 + count * ETH_GSTRING_LEN / 4];
    strings[0] = ETHTOOL_GSTRINGS;
    strings[1] = ETH_SS_FEATURES;
    strings[2] = count as u32;
    ethtool(&sock, ifname, &mut strings)?;
    let names: Vec<String> = strings[3..]
        .chunks_exact(ETH_GSTRING_LEN / 4)
        .map(|chunk| {
            let bytes: Vec<u8> = chunk.iter().flat_map(|w| w.to_ne_bytes()).collect();
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            String::from_utf8_lossy(&bytes[..end]).into_owned()
        })
        .collect();
    // struct ethtool_gfeatures { cmd; size; struct { available, requested, active, never_changed } features[size] }.
    let blocks = count.div_ceil(32);
    let mut feats = vec![0u32; 2 + blocks * 4];
    feats[0] = ETHTOOL_GFEATURES;
    feats[1] = blocks as u32;
    ethtool(&sock, ifname, &mut feats)?;
    Ok(names
        .into_iter()
        .enumerate()
        .filter(|(_, name)| !name.is_empty())
        .map(|(bit, name)| {
            let active = feats[2 + (bit / 32) * 4 + 2];
            (name, active & (1 << (bit % 32)) != 0)
        })
        .collect())
}
