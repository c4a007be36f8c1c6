//! TCP header view (RFC 9293) with an option iterator.

use crate::bytes::{be16, be32, put_be16, put_be32};
use crate::WireError;

/// Header length without options.
pub const MIN_HEADER_LEN: usize = 20;
/// Header length with 40 bytes of options.
pub const MAX_HEADER_LEN: usize = 60;
/// Offset of the checksum field from the start of the TCP header.
pub const CHECKSUM_OFFSET: usize = 16;

/// Flag bits of byte 13.
pub mod flags {
    #![allow(missing_docs)]
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECE: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// Byte ranges of the fields.
mod field {
    #![allow(missing_docs)]
    use std::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ_NUM: Range<usize> = 4..8;
    pub const ACK_NUM: Range<usize> = 8..12;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WIN_SIZE: Range<usize> = 14..16;
    pub const CHECKSUM: Range<usize> = 16..18;
    pub const URGENT: Range<usize> = 18..20;
}

/// A view of a TCP segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after checking the data offset is 20..=60 and the header with options fits.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(WireError::Truncated { what: "TCP header", need: MIN_HEADER_LEN, have: b.len() });
        }
        let hl = ((b[field::DATA_OFF] >> 4) as usize) * 4;
        if hl < MIN_HEADER_LEN {
            return Err(WireError::BadHeaderLen { what: "TCP", len: hl });
        }
        if b.len() < hl {
            return Err(WireError::Truncated { what: "TCP options", need: hl, have: b.len() });
        }
        Ok(Packet { buffer })
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SRC_PORT)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::DST_PORT)
    }
    /// Sequence number.
    pub fn seq_number(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SEQ_NUM)
    }
    /// Acknowledgment number.
    pub fn ack_number(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ACK_NUM)
    }
    /// Header length in bytes (data offset * 4).
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::DATA_OFF] >> 4) as usize) * 4
    }
    /// Low nibble of byte 12 (reserved bits and AE/NS).
    pub fn reserved_bits(&self) -> u8 {
        self.buffer.as_ref()[field::DATA_OFF] & 0x0f
    }
    /// Flag byte ([`flags`]).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// Window.
    pub fn window(&self) -> u16 {
        be16(self.buffer.as_ref(), field::WIN_SIZE)
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// Urgent pointer.
    pub fn urgent(&self) -> u16 {
        be16(self.buffer.as_ref(), field::URGENT)
    }
    /// Option bytes.
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()]
    }
    /// Iterator over parsed options.
    pub fn option_iter(&self) -> OptionIter<'_> {
        OptionIter { rest: self.options() }
    }
    /// Payload.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::SRC_PORT, v)
    }
    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::DST_PORT, v)
    }
    /// Sets the sequence number.
    pub fn set_seq_number(&mut self, v: u32) {
        put_be32(self.buffer.as_mut(), field::SEQ_NUM, v)
    }
    /// Sets the acknowledgment number.
    pub fn set_ack_number(&mut self, v: u32) {
        put_be32(self.buffer.as_mut(), field::ACK_NUM, v)
    }
    /// Sets the header length (multiple of 4, 20..=60), keeping the reserved bits.
    pub fn set_header_len(&mut self, len: usize) {
        let b = &mut self.buffer.as_mut()[field::DATA_OFF];
        *b = (((len / 4) as u8) << 4) | (*b & 0x0f);
    }
    /// Sets the flag byte.
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v
    }
    /// Sets the window.
    pub fn set_window(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::WIN_SIZE, v)
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::CHECKSUM, v)
    }
    /// Sets the urgent pointer.
    pub fn set_urgent(&mut self, v: u16) {
        put_be16(self.buffer.as_mut(), field::URGENT, v)
    }
    /// Mutable option bytes.
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[MIN_HEADER_LEN..hl]
    }
}

/// A TCP option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpOption<'a> {
    /// End of option list (kind 0).
    EndOfList,
    /// No-operation (kind 1).
    NoOp,
    /// Maximum segment size (kind 2).
    MaxSegmentSize(u16),
    /// Window scale (kind 3).
    WindowScale(u8),
    /// SACK permitted (kind 4).
    SackPermitted,
    /// SACK blocks (kind 5), raw.
    Sack(&'a [u8]),
    /// Timestamps (kind 8): value, echo reply.
    Timestamps(u32, u32),
    /// Any other option: kind, data.
    Unknown(u8, &'a [u8]),
}

/// Iterator over TCP options; stops (yielding an error once) at a malformed option.
#[derive(Debug, Clone)]
pub struct OptionIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for OptionIter<'a> {
    type Item = Result<TcpOption<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (&kind, after) = self.rest.split_first()?;
        match kind {
            0 => {
                self.rest = &[];
                return Some(Ok(TcpOption::EndOfList));
            }
            1 => {
                self.rest = after;
                return Some(Ok(TcpOption::NoOp));
            }
            _ => {}
        }
        let len = match after.first() {
            Some(&l) if l >= 2 && l as usize <= self.rest.len() => l as usize,
            _ => {
                let have = self.rest.len();
                self.rest = &[];
                return Some(Err(WireError::Truncated { what: "TCP option", need: 2, have }));
            }
        };
        let data = &self.rest[2..len];
        self.rest = &self.rest[len..];
        Some(Ok(match (kind, data.len()) {
            (2, 2) => TcpOption::MaxSegmentSize(u16::from_be_bytes([data[0], data[1]])),
            (3, 1) => TcpOption::WindowScale(data[0]),
            (4, 0) => TcpOption::SackPermitted,
            (5, _) => TcpOption::Sack(data),
            (8, 8) => TcpOption::Timestamps(be32(data, 0..4), be32(data, 4..8)),
            _ => TcpOption::Unknown(kind, data),
        }))
    }
}

/// A decoded TCP header (without options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flags.
    pub flags: u8,
    /// Window.
    pub window: u16,
}

impl Repr {
    /// Parses the fixed part.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq: p.seq_number(),
            ack: p.ack_number(),
            flags: p.flags(),
            window: p.window(),
        }
    }

    /// Writes a 20-byte header with a zero checksum and urgent pointer.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < MIN_HEADER_LEN {
            return Err(WireError::Truncated { what: "TCP header", need: MIN_HEADER_LEN, have: buf.len() });
        }
        let mut p = Packet::new_unchecked(&mut buf[..MIN_HEADER_LEN]);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_seq_number(self.seq);
        p.set_ack_number(self.ack);
        p.buffer[field::DATA_OFF] = 0x50;
        p.set_flags(self.flags);
        p.set_window(self.window);
        p.set_checksum(0);
        p.set_urgent(0);
        Ok(())
    }
}

/// One line that names the segment: ports, sequence and acknowledgement numbers, flags, window, payload length.
impl<T: AsRef<[u8]>> core::fmt::Display for Packet<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "TCP {} > {} seq {} ack {} flags {:#04x} win {} len {}",
            self.src_port(),
            self.dst_port(),
            self.seq_number(),
            self.ack_number(),
            self.flags(),
            self.window(),
            self.payload().len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: [u8; 36] = [
        0x04, 0xd2, 0x16, 0x2e, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x80, 0x18, 0x01, 0xf5, 0xab, 0xcd,
        0x00, 0x00, // fixed
        0x01, 0x01, 0x08, 0x0a, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x06, // NOP NOP TS
        b'a', b'b', b'c', b'd',
    ];

    #[test]
    fn test_parse() {
        let p = Packet::new_checked(&SEG[..]).unwrap();
        assert_eq!(p.src_port(), 1234);
        assert_eq!(p.dst_port(), 5678);
        assert_eq!(p.seq_number(), 1);
        assert_eq!(p.ack_number(), 2);
        assert_eq!(p.header_len(), 32);
        assert_eq!(p.flags(), flags::ACK | flags::PSH);
        assert_eq!(p.window(), 501);
        assert_eq!(p.checksum(), 0xabcd);
        assert_eq!(p.payload(), b"abcd");
        let opts: Vec<_> = p.option_iter().collect();
        assert_eq!(opts, vec![Ok(TcpOption::NoOp), Ok(TcpOption::NoOp), Ok(TcpOption::Timestamps(5, 6))]);
    }

    #[test]
    fn test_emit() {
        let p = Packet::new_checked(&SEG[..]).unwrap();
        let r = Repr::parse(&p);
        let mut out = [0xffu8; 20];
        r.emit(&mut out).unwrap();
        assert_eq!(out[..12], SEG[..12]);
        assert_eq!(out[12], 0x50);
        assert_eq!(out[13..16], SEG[13..16]);
        assert_eq!(out[16..20], [0, 0, 0, 0]);
        assert!(r.emit(&mut [0u8; 19]).is_err());
    }

    #[test]
    fn test_truncated_and_bad_offset() {
        for n in 0..32 {
            assert!(Packet::new_checked(&SEG[..n]).is_err(), "len {n}");
        }
        let mut bad = SEG;
        bad[12] = 0x40;
        assert_eq!(Packet::new_checked(&bad[..]), Err(WireError::BadHeaderLen { what: "TCP", len: 16 }));
    }

    #[test]
    fn test_malformed_options() {
        let mut seg = SEG;
        seg[22] = 8;
        seg[23] = 40; // length beyond options
        let p = Packet::new_checked(&seg[..]).unwrap();
        let opts: Vec<_> = p.option_iter().collect();
        assert_eq!(opts.len(), 3);
        assert!(opts[2].is_err());
        seg[23] = 0; // zero length
        assert!(Packet::new_checked(&seg[..]).unwrap().option_iter().any(|o| o.is_err()));
        let mut mss = [0u8; 24];
        mss[12] = 0x60;
        mss[20..24].copy_from_slice(&[2, 4, 0x05, 0xb4]);
        let p = Packet::new_checked(&mss[..]).unwrap();
        assert_eq!(p.option_iter().next(), Some(Ok(TcpOption::MaxSegmentSize(1460))));
    }
}
