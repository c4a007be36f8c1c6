//! The synthetic guest of `turbotun bench --vhost-user`'s TCP rows: one TCP connection from the guest's address
//! to a socket in the TAP's namespace, sent as fast as the receiver's window allows, over a [`Link`]: the
//! guest's virtqueues through a backend (`turbotun::vhost_user::frontend::Guest`), or straight into a TAP from
//! guest memory (the ceiling).
//!
//! The sender is the least a TCP sender can be over a lossless path: a handshake (MSS 1460 and window scaling
//! offered), then segments of `payload` bytes (one 64 KiB super-packet with TSO, one MSS without offloads)
//! while the receiver's window has room, the window and the acknowledgements taken from every segment the
//! kernel sends back, and go-back-N from the first unacknowledged byte when nothing was acknowledged for
//! 200 ms. It never reads data (the kernel sends none) and ends without a FIN (the namespace goes).

use std::fs::File;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use turbotun::vhost_user::frontend::{Guest, GuestMemory, HDR_LEN};
use turbotun::wire::ethernet::{self, ETHERTYPE_IPV4};
use turbotun::wire::virtio_net::{flags, gso, VirtioNetHdrRepr};
use turbotun::wire::{checksum, ipv4, tcp, IPPROTO_TCP};
use turbotun::Queue;

pub(crate) const TAP_IP: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 1);
pub(crate) const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 2);
pub(crate) const GUEST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x03, 0x02];
pub(crate) const PORT: u16 = 5201;
const GUEST_PORT: u16 = 40000;
/// TCP payload per segment: 1500 − IPv4 − TCP, no options after the handshake.
pub(crate) const MSS: usize = 1460;
/// A TSO super-packet's payload: 44 segments, the most whole segments under IPv4's 64 KiB total length.
pub(crate) const TSO_PAYLOAD: usize = 44 * MSS;
const ETH: usize = 14;
const HEADERS: usize = ETH + 20 + 20;
/// How long a handshake may take, and how long without an acknowledgement before the sender goes back.
const HANDSHAKE: Duration = Duration::from_secs(10);
const RETRANSMIT: Duration = Duration::from_millis(200);
/// How long the sender sleeps when it can neither send nor read anything.
const IDLE_WAIT: Duration = Duration::from_micros(20);

/// Where the guest's frames go and where the kernel's come from.
pub(crate) trait Link {
    /// Puts one frame behind its virtio header on the way to the TAP; `false` when there is no room now.
    fn try_send(&mut self, hdr: &[u8; HDR_LEN], frame: &[u8]) -> Result<bool>;
    /// [`Link::try_send`] of a frame of `head` and the one payload the sender sends over and over: where guest
    /// memory holds it already, only the header and `head` are written, as a guest's stack does not copy its
    /// data again for each segment it sends.
    fn try_send_reusing(&mut self, hdr: &[u8; HDR_LEN], head: &[u8], payload: &[u8]) -> Result<bool>;
    /// The next frame the TAP sent, if there is one.
    fn try_recv(&mut self) -> Result<Option<Vec<u8>>>;
}

/// The guest's virtqueues, through a backend.
pub(crate) struct VirtioLink(pub Guest);

impl Link for VirtioLink {
    fn try_send(&mut self, hdr: &[u8; HDR_LEN], frame: &[u8]) -> Result<bool> {
        Ok(self.0.try_send(hdr, frame)?)
    }
    fn try_send_reusing(&mut self, hdr: &[u8; HDR_LEN], head: &[u8], payload: &[u8]) -> Result<bool> {
        Ok(self.0.try_send_parts(hdr, head, payload, Some(PAYLOAD_KEY))?)
    }
    fn try_recv(&mut self) -> Result<Option<Vec<u8>>> {
        Ok(self.0.try_recv()?.map(|r| r.frame))
    }
}

/// No backend: each frame put in guest memory behind its header and written into the TAP from there with one
/// `write(2)`; the kernel's answers read from the same TAP.
pub(crate) struct TapLink {
    pub queue: Queue,
    pub file: File,
    pub mem: GuestMemory,
    buf: Vec<u8>,
    /// The payload the slot holds (its head's length and its own), from [`Link::try_send_reusing`].
    payload: Option<(usize, usize)>,
}

/// Where the ceiling's frame sits in its guest memory.
const CEILING_SLOT: u64 = 0x1_0000;

impl TapLink {
    pub(crate) fn new(queue: Queue) -> Result<TapLink> {
        use std::os::fd::AsFd;
        queue.set_nonblocking(true)?;
        let file = File::from(queue.as_fd().try_clone_to_owned()?);
        Ok(TapLink { queue, file, mem: GuestMemory::new(1 << 20)?, buf: vec![0u8; 65536 + HDR_LEN], payload: None })
    }
}

impl Link for TapLink {
    fn try_send(&mut self, hdr: &[u8; HDR_LEN], frame: &[u8]) -> Result<bool> {
        self.payload = None;
        self.write_out(hdr, frame, &[])
    }
    fn try_send_reusing(&mut self, hdr: &[u8; HDR_LEN], head: &[u8], payload: &[u8]) -> Result<bool> {
        self.write_out(hdr, head, payload)
    }
    fn try_recv(&mut self) -> Result<Option<Vec<u8>>> {
        match self.queue.try_recv(&mut self.buf) {
            Ok(n) => Ok(Some(self.buf[..n].to_vec())),
            Err(e) if e.is_would_block() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

impl TapLink {
    /// Puts the header, `head` and (unless the slot holds it already) `payload` in guest memory and writes them
    /// into the TAP from there.
    fn write_out(&mut self, hdr: &[u8; HDR_LEN], head: &[u8], payload: &[u8]) -> Result<bool> {
        self.mem.write(CEILING_SLOT, hdr)?;
        self.mem.write(CEILING_SLOT + HDR_LEN as u64, head)?;
        if !payload.is_empty() && self.payload != Some((head.len(), payload.len())) {
            self.mem.write(CEILING_SLOT + (HDR_LEN + head.len()) as u64, payload)?;
            self.payload = Some((head.len(), payload.len()));
        }
        let len = HDR_LEN + head.len() + payload.len();
        match self.mem.write_to(&mut self.file, CEILING_SLOT, len) {
            Ok(n) if n == len => Ok(true),
            Ok(n) => bail!("the TAP took {n} of {len} bytes"),
            Err(turbotun::vhost_user::frontend::FrontendError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// What the sender did.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct SenderReport {
    /// Frames (super-packets with TSO) handed to the link, the handshake's among them, and the data's TCP
    /// payload bytes.
    pub frames: u64,
    pub payload_bytes: u64,
    /// Times it went back to the first unacknowledged byte.
    pub go_backs: u64,
    /// Bytes the receiver acknowledged.
    pub acked_bytes: u64,
}

/// `true` when `a` is after `b` in sequence space.
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The guest's side of the frames: the TAP's MAC (the destination) and the next IPv4 identification.
struct Framer {
    tap_mac: [u8; 6],
    ip_id: u16,
}

/// Names the one payload the sender sends ([`Link::try_send_reusing`]).
const PAYLOAD_KEY: u64 = 0x5a;

/// The window the guest advertises: it never receives data.
const WINDOW: u16 = 65535;

impl Framer {
    /// One Ethernet + IPv4 + TCP frame from the guest to the socket; `options` after the 20-byte TCP header.
    /// With `tso` and more than an MSS of payload, the virtio header of a TCPv4 super-packet (partial checksum,
    /// the kernel segments at [`MSS`]); else a zero header and every checksum complete.
    fn frame(
        &mut self,
        segment: (u32, u32, u8),
        options: &[u8],
        payload: &[u8],
        tso: bool,
    ) -> ([u8; HDR_LEN], Vec<u8>) {
        self.build(segment, options, payload.len(), Some(payload), tso)
    }

    /// The virtio header and the Ethernet + IPv4 + TCP headers of a TSO super-packet of `payload_len` bytes of
    /// payload, which the caller puts behind them (its checksum is the kernel's to complete: it is not read).
    fn tso_head(&mut self, segment: (u32, u32, u8), payload_len: usize) -> ([u8; HDR_LEN], Vec<u8>) {
        debug_assert!(payload_len > MSS, "a super-packet is more than one segment");
        self.build(segment, &[], payload_len, None, true)
    }

    /// [`Self::frame`] with the payload's length given apart: without the payload (`None`) only the headers are
    /// made, which only a super-packet allows (its TCP checksum is partial: the payload is not summed).
    fn build(
        &mut self,
        (seq, ack, flags_): (u32, u32, u8),
        options: &[u8],
        payload_len: usize,
        payload: Option<&[u8]>,
        tso: bool,
    ) -> ([u8; HDR_LEN], Vec<u8>) {
        let ip_id = self.ip_id;
        self.ip_id = self.ip_id.wrapping_add(1);
        let tcp_header_len = tcp::MIN_HEADER_LEN + options.len();
        let tcp_len = tcp_header_len + payload_len;
        let mut f = vec![0u8; ETH + ipv4::MIN_HEADER_LEN + tcp_header_len];
        let eth = ethernet::Repr { dst: self.tap_mac, src: GUEST_MAC, ethertype: ETHERTYPE_IPV4, ..Default::default() };
        let ip = ipv4::Repr {
            src: GUEST_IP.octets(),
            dst: TAP_IP.octets(),
            protocol: IPPROTO_TCP,
            payload_len: tcp_len as u16,
            ttl: 64,
            tos: 0,
            ident: ip_id,
            dont_frag: true,
        };
        let th = tcp::Repr { src_port: GUEST_PORT, dst_port: PORT, seq, ack, flags: flags_, window: WINDOW };
        let emitted = eth
            .emit(&mut f)
            .and_then(|_| ip.emit(&mut f[ETH..]))
            .and_then(|()| th.emit(&mut f[ETH + ipv4::MIN_HEADER_LEN..]));
        emitted.expect("the buffer holds the headers");
        let mut segment = tcp::Packet::new_unchecked(&mut f[ETH + ipv4::MIN_HEADER_LEN..]);
        segment.set_header_len(tcp_header_len);
        segment.options_mut().copy_from_slice(options);
        f.extend_from_slice(payload.unwrap_or_default());
        let pseudo = checksum::pseudo_header_v4(GUEST_IP.octets(), TAP_IP.octets(), IPPROTO_TCP, tcp_len as u32);
        let at = ETH + ipv4::MIN_HEADER_LEN + tcp::CHECKSUM_OFFSET;
        if tso && payload_len > MSS {
            f[at..at + 2].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
            let mut h = [0u8; HDR_LEN];
            VirtioNetHdrRepr {
                flags: flags::NEEDS_CSUM,
                gso_type: gso::TCPV4,
                hdr_len: HEADERS as u16,
                gso_size: MSS as u16,
                csum_start: (ETH + ipv4::MIN_HEADER_LEN) as u16,
                csum_offset: tcp::CHECKSUM_OFFSET as u16,
            }
            .emit(&mut h);
            (h, f)
        } else {
            let check = checksum::checksum(&f[ETH + ipv4::MIN_HEADER_LEN..], pseudo);
            f[at..at + 2].copy_from_slice(&check.to_be_bytes());
            ([0u8; HDR_LEN], f)
        }
    }
}

/// A TCP segment from the socket to the guest: (seq, ack, flags, window, window scale offered).
fn parse_reply(frame: &[u8]) -> Option<(u32, u32, u8, u16, Option<u8>)> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = ipv4::Packet::new_checked(eth.payload()).ok()?;
    if ip.protocol() != IPPROTO_TCP || ip.src_addr() != TAP_IP.octets() || ip.dst_addr() != GUEST_IP.octets() {
        return None;
    }
    let th = tcp::Packet::new_checked(ip.payload()).ok()?;
    if th.src_port() != PORT || th.dst_port() != GUEST_PORT {
        return None;
    }
    let mut scale = None;
    for option in th.option_iter() {
        if let tcp::TcpOption::WindowScale(shift) = option.ok()? {
            scale = Some(shift);
        }
    }
    Some((th.seq_number(), th.ack_number(), th.flags(), th.window(), scale))
}

use tcp::flags::{ACK, PSH, RST, SYN};

/// Connects to [`TAP_IP`]:[`PORT`] over `link` and sends `payload`-byte segments (TSO super-packets when
/// `tso`) until `stop`; `sent` follows the payload bytes handed to the link.
pub(crate) fn send_tcp(
    link: &mut dyn Link,
    tap_mac: [u8; 6],
    tso: bool,
    stop: &AtomicBool,
    sent: &AtomicU64,
) -> Result<SenderReport> {
    let payload = vec![0x5au8; if tso { TSO_PAYLOAD } else { MSS }];
    let iss: u32 = 0x1000_0000;
    let mut framer = Framer { tap_mac, ip_id: 1 };
    // MSS 1460, NOP, window scale 7.
    let syn_options = [2, 4, (MSS >> 8) as u8, MSS as u8, 1, 3, 3, 7];
    let deadline = Instant::now() + HANDSHAKE;
    let mut last_syn: Option<Instant> = None;
    let mut report = SenderReport::default();
    let (server_seq, mut window, scale) = loop {
        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
            bail!("no SYN-ACK from the socket within {} s", HANDSHAKE.as_secs());
        }
        if last_syn.map_or(true, |t| t.elapsed() >= Duration::from_secs(1)) {
            let (h, f) = framer.frame((iss, 0, SYN), &syn_options, &[], false);
            if link.try_send(&h, &f)? {
                last_syn = Some(Instant::now());
                report.frames += 1;
            }
        }
        match link.try_recv()?.as_deref().and_then(parse_reply) {
            Some((seq, ack, fl, win, scale)) if fl & (SYN | ACK) == SYN | ACK && ack == iss.wrapping_add(1) => {
                break (seq, u64::from(win), scale.unwrap_or(0));
            }
            Some((_, _, fl, _, _)) if fl & RST != 0 => bail!("the socket refused the connection"),
            _ => std::thread::yield_now(),
        }
    };
    // The window of the SYN-ACK is never scaled; later ones are.
    let rcv_nxt = server_seq.wrapping_add(1);
    let (mut snd_una, mut snd_nxt) = (iss.wrapping_add(1), iss.wrapping_add(1));
    let (h, f) = framer.frame((snd_nxt, rcv_nxt, ACK), &[], &[], false);
    while !link.try_send(&h, &f)? {
        std::thread::yield_now();
    }
    report.frames += 1;
    let mut progress = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let mut idle = true;
        while let Some(frame) = link.try_recv()? {
            idle = false;
            let Some((_, ack, fl, win, _)) = parse_reply(&frame) else { continue };
            if fl & RST != 0 {
                // At the end of the run the reader closes its socket with data unread, which resets the
                // connection: that is the end, not a failure.
                if stop.load(Ordering::Relaxed) {
                    return Ok(report);
                }
                bail!("the socket reset the connection");
            }
            if fl & ACK != 0 {
                if after(ack, snd_una) && !after(ack, snd_nxt) {
                    report.acked_bytes += u64::from(ack.wrapping_sub(snd_una));
                    snd_una = ack;
                    progress = Instant::now();
                }
                window = u64::from(win) << scale;
            }
        }
        loop {
            let in_flight = u64::from(snd_nxt.wrapping_sub(snd_una));
            if in_flight + payload.len() as u64 > window {
                break;
            }
            let sent_now = if tso {
                let (h, head) = framer.tso_head((snd_nxt, rcv_nxt, ACK | PSH), payload.len());
                link.try_send_reusing(&h, &head, &payload)?
            } else {
                let (h, f) = framer.frame((snd_nxt, rcv_nxt, ACK | PSH), &[], &payload, false);
                link.try_send(&h, &f)?
            };
            if !sent_now {
                break;
            }
            idle = false;
            snd_nxt = snd_nxt.wrapping_add(payload.len() as u32);
            report.frames += 1;
            report.payload_bytes += payload.len() as u64;
            sent.fetch_add(payload.len() as u64, Ordering::Relaxed);
        }
        if snd_nxt != snd_una && progress.elapsed() >= RETRANSMIT {
            snd_nxt = snd_una;
            report.go_backs += 1;
            progress = Instant::now();
        }
        if idle {
            // Nothing to send and nothing came back: a short sleep, as a guest's driver waits for an interrupt,
            // rather than a spin that takes a core from the backend and the socket's reader (two cores here).
            std::thread::sleep(IDLE_WAIT);
        }
    }
    Ok(report)
}

/// The receiving socket: accepts one connection on `listener` and reads until `stop`, adding what it read to
/// `received`.
pub(crate) fn receive(listener: std::net::TcpListener, stop: Arc<AtomicBool>, received: Arc<AtomicU64>) -> Result<()> {
    use std::io::Read;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + HANDSHAKE + Duration::from_secs(5);
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                    return Err(anyhow!("no connection from the guest"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut buf = vec![0u8; 1 << 18];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                received.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_replies() {
        let mut framer = Framer { tap_mac: [2, 0, 0, 0, 0, 1], ip_id: 7 };
        let (h, f) = framer.frame((100, 200, ACK | PSH), &[], &vec![1u8; TSO_PAYLOAD], true);
        assert_eq!((h[1], u16::from_le_bytes([h[4], h[5]])), (gso::TCPV4, MSS as u16));
        assert_eq!(f.len(), HEADERS + TSO_PAYLOAD);
        assert!(f.len() - ETH <= 65535, "an IPv4 datagram's total length");
        let (h, f) = framer.frame((100, 200, ACK), &[], &[9u8; MSS], false);
        assert_eq!(framer.ip_id, 9, "one identification per frame");
        assert_eq!(h, [0u8; HDR_LEN]);
        // Every checksum complete: the IPv4 header and the TCP segment with its pseudo-header sum to zero.
        assert_eq!(checksum::checksum(&f[ETH..ETH + 20], 0), 0);
        let pseudo = checksum::pseudo_header_v4(GUEST_IP.octets(), TAP_IP.octets(), 6, (20 + MSS) as u32);
        assert_eq!(checksum::checksum(&f[ETH + 20..], pseudo), 0);

        // The socket's SYN-ACK, as the guest would receive it (addresses and ports swapped).
        let mut reply = f[..HEADERS].to_vec();
        reply[ETH + 12..ETH + 16].copy_from_slice(&TAP_IP.octets());
        reply[ETH + 16..ETH + 20].copy_from_slice(&GUEST_IP.octets());
        reply[ETH + 20..ETH + 22].copy_from_slice(&PORT.to_be_bytes());
        reply[ETH + 22..ETH + 24].copy_from_slice(&GUEST_PORT.to_be_bytes());
        reply[ETH + 32] = 6 << 4;
        reply[ETH + 33] = SYN | ACK;
        reply.extend_from_slice(&[1, 3, 3, 9]);
        assert_eq!(parse_reply(&reply), Some((100, 200, SYN | ACK, WINDOW, Some(9))));
        assert_eq!(parse_reply(&reply[..ETH + 30]), None, "cut short");
        reply[ETH + 22] ^= 1;
        assert_eq!(parse_reply(&reply), None, "another port");
        assert!(after(1, u32::MAX) && !after(u32::MAX, 1));
    }
}
