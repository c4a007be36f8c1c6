//! Ethernet II frames with up to two 802.1Q / 802.1ad VLAN tags (TAP framing).

use crate::WireError;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// 802.1Q customer VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// 802.1ad service VLAN tag (QinQ).
pub const ETHERTYPE_QINQ: u16 = 0x88a8;
/// Legacy QinQ tag.
pub const ETHERTYPE_QINQ_OLD: u16 = 0x9100;

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = 14;
/// Length of one VLAN tag.
pub const VLAN_TAG_LEN: usize = 4;
/// Maximum number of VLAN tags walked.
pub const MAX_VLAN_TAGS: usize = 2;
/// Longest header this module accepts (two tags).
pub const MAX_HEADER_LEN: usize = HEADER_LEN + MAX_VLAN_TAGS * VLAN_TAG_LEN;

/// Byte ranges of the fields.
mod field {
    #![allow(missing_docs)]
    use std::ops::Range;
    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
}

fn is_vlan(t: u16) -> bool {
    matches!(t, ETHERTYPE_VLAN | ETHERTYPE_QINQ | ETHERTYPE_QINQ_OLD)
}

/// A view of an Ethernet frame; `new_checked` validates the base header and every VLAN tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Frame { buffer }
    }

    /// Wraps after checking that the header and its VLAN tags (at most 2) fit.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated { what: "Ethernet header", need: HEADER_LEN, have: b.len() });
        }
        let mut off = 12;
        let mut tags = 0;
        loop {
            let t = u16::from_be_bytes([b[off], b[off + 1]]);
            if !is_vlan(t) {
                break;
            }
            tags += 1;
            if tags > MAX_VLAN_TAGS {
                return Err(WireError::TooManyVlanTags);
            }
            off += VLAN_TAG_LEN;
            if b.len() < off + 2 {
                return Err(WireError::Truncated { what: "VLAN tag", need: off + 2, have: b.len() });
            }
        }
        Ok(Frame { buffer })
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination MAC.
    pub fn dst_addr(&self) -> [u8; 6] {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::DESTINATION]);
        a
    }

    /// Source MAC.
    pub fn src_addr(&self) -> [u8; 6] {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SOURCE]);
        a
    }

    /// The outer EtherType (a VLAN TPID when tagged).
    pub fn ethertype(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::ETHERTYPE];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Number of VLAN tags (0..=2).
    pub fn vlan_count(&self) -> usize {
        let b = self.buffer.as_ref();
        let mut n = 0;
        while n < MAX_VLAN_TAGS {
            let off = 12 + n * VLAN_TAG_LEN;
            if off + 2 > b.len() || !is_vlan(u16::from_be_bytes([b[off], b[off + 1]])) {
                break;
            }
            n += 1;
        }
        n
    }

    /// The VLAN ID (12 bits) of tag `i`, outermost first.
    pub fn vlan_id(&self, i: usize) -> Option<u16> {
        if i >= self.vlan_count() {
            return None;
        }
        let b = self.buffer.as_ref();
        let off = 14 + i * VLAN_TAG_LEN;
        Some(u16::from_be_bytes([b[off], b[off + 1]]) & 0x0fff)
    }

    /// The EtherType after the VLAN tags.
    pub fn inner_ethertype(&self) -> u16 {
        let b = self.buffer.as_ref();
        let off = 12 + self.vlan_count() * VLAN_TAG_LEN;
        u16::from_be_bytes([b[off], b[off + 1]])
    }

    /// Header length including VLAN tags (offset of the payload).
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.vlan_count() * VLAN_TAG_LEN
    }

    /// The payload after the header and tags.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the destination MAC.
    pub fn set_dst_addr(&mut self, a: [u8; 6]) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&a)
    }
    /// Sets the source MAC.
    pub fn set_src_addr(&mut self, a: [u8; 6]) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&a)
    }
}

/// A decoded Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// VLAN tags (TPID, TCI), outermost first.
    pub vlans: [Option<(u16, u16)>; MAX_VLAN_TAGS],
    /// EtherType of the payload.
    pub ethertype: u16,
}

impl Repr {
    /// Parses a frame.
    pub fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> Repr {
        let b = f.buffer.as_ref();
        let mut vlans = [None; MAX_VLAN_TAGS];
        for (i, v) in vlans.iter_mut().enumerate().take(f.vlan_count()) {
            let o = 12 + i * VLAN_TAG_LEN;
            *v = Some((u16::from_be_bytes([b[o], b[o + 1]]), u16::from_be_bytes([b[o + 2], b[o + 3]])));
        }
        Repr { dst: f.dst_addr(), src: f.src_addr(), vlans, ethertype: f.inner_ethertype() }
    }

    /// Header length.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.vlans.iter().flatten().count() * VLAN_TAG_LEN
    }

    /// Writes the header into `buf`, returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let n = self.header_len();
        if buf.len() < n {
            return Err(WireError::Truncated { what: "Ethernet header", need: n, have: buf.len() });
        }
        buf[0..6].copy_from_slice(&self.dst);
        buf[6..12].copy_from_slice(&self.src);
        let mut o = 12;
        for (tpid, tci) in self.vlans.iter().flatten() {
            buf[o..o + 2].copy_from_slice(&tpid.to_be_bytes());
            buf[o + 2..o + 4].copy_from_slice(&tci.to_be_bytes());
            o += 4;
        }
        buf[o..o + 2].copy_from_slice(&self.ethertype.to_be_bytes());
        Ok(n)
    }
}

/// One line that names the frame: addresses, VLAN tags and the ethertype they carry.
impl<T: AsRef<[u8]>> core::fmt::Display for Frame<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mac = |m: [u8; 6]| {
            let [a, b, c, d, e, g] = m;
            format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
        };
        write!(f, "Ethernet {} > {}", mac(self.src_addr()), mac(self.dst_addr()))?;
        for i in 0..self.vlan_count() {
            if let Some(id) = self.vlan_id(i) {
                write!(f, " vlan {id}")?;
            }
        }
        write!(f, " type {:#06x}", self.inner_ethertype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNTAGGED: [u8; 16] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x08, 0x00, 0x45, 0];
    const QINQ: [u8; 23] =
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x20, 0x05, 0x86, 0xdd, 0x60];

    #[test]
    fn test_parse() {
        let f = Frame::new_checked(&UNTAGGED[..]).unwrap();
        assert_eq!(f.dst_addr(), [1, 2, 3, 4, 5, 6]);
        assert_eq!(f.src_addr(), [7, 8, 9, 10, 11, 12]);
        assert_eq!(f.inner_ethertype(), ETHERTYPE_IPV4);
        assert_eq!(f.header_len(), 14);
        assert_eq!(f.payload(), &[0x45, 0]);
        let q = Frame::new_checked(&QINQ[..]).unwrap();
        assert_eq!(q.vlan_count(), 2);
        assert_eq!(q.vlan_id(0), Some(100));
        assert_eq!(q.vlan_id(1), Some(5));
        assert_eq!(q.vlan_id(2), None);
        assert_eq!(q.inner_ethertype(), ETHERTYPE_IPV6);
        assert_eq!(q.header_len(), 22);
        assert_eq!(q.payload(), &[0x60]);
    }

    #[test]
    fn test_emit_roundtrip() {
        let q = Frame::new_checked(&QINQ[..]).unwrap();
        let r = Repr::parse(&q);
        let mut out = [0u8; 22];
        assert_eq!(r.emit(&mut out).unwrap(), 22);
        assert_eq!(out, QINQ[..22]);
        assert!(r.emit(&mut [0u8; 21]).is_err());
    }

    #[test]
    fn test_truncated() {
        for n in 0..14 {
            assert!(Frame::new_checked(&UNTAGGED[..n]).is_err());
        }
        for n in 14..22 {
            assert!(Frame::new_checked(&QINQ[..n]).is_err(), "len {n}");
        }
        // Three tags are refused.
        let mut three = vec![0u8; 12];
        for _ in 0..3 {
            three.extend_from_slice(&[0x81, 0, 0, 1]);
        }
        three.extend_from_slice(&[0x08, 0]);
        assert_eq!(Frame::new_checked(&three[..]), Err(WireError::TooManyVlanTags));
    }
}
