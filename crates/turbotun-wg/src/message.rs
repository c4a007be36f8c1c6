//! WireGuard's four messages as typed views over their bytes: each field read or written by name, never by a
//! byte range at the call site. A view is made only over a buffer of the message's exact length (the handshake
//! messages) or at least its header (transport data), so no accessor can fail or panic.
//!
//! | message          | type | length | fields (little-endian indices and counter)                                  |
//! |------------------|------|--------|-----------------------------------------------------------------------------|
//! | [`Initiation`]   | 1    | 148    | sender, ephemeral, sealed static key, sealed timestamp, mac1, mac2          |
//! | [`Response`]     | 2    | 92     | sender, receiver, ephemeral, sealed empty, mac1, mac2                       |
//! | [`CookieReply`]  | 3    | 64     | receiver, nonce, sealed cookie                                              |
//! | [`DataHeader`]   | 4    | ≥ 32   | receiver, counter, then the sealed packet                                   |

use std::ops::Range;

use crate::blake2s;

/// Message type 1: handshake initiation, 148 bytes.
pub const INITIATION_LEN: usize = 148;
/// Message type 2: handshake response, 92 bytes.
pub const RESPONSE_LEN: usize = 92;
/// Message type 3: cookie reply, 64 bytes.
pub const COOKIE_REPLY_LEN: usize = 64;
/// Message type 4: transport data, header (type, receiver index, counter).
pub const DATA_HEADER_LEN: usize = 16;
/// The Poly1305 tag.
pub const TAG_LEN: usize = 16;
/// The shortest transport data message: a keepalive (header and the tag of nothing).
pub const DATA_MIN_LEN: usize = DATA_HEADER_LEN + TAG_LEN;

/// Where each field of each message is.
pub mod field {
    use std::ops::Range;

    /// The type word: the type byte and three zero bytes.
    pub const TYPE: Range<usize> = 0..4;

    /// A handshake initiation's fields.
    pub mod initiation {
        use std::ops::Range;
        /// The initiator's index for this handshake.
        pub const SENDER: Range<usize> = 4..8;
        /// The initiator's ephemeral public key, in the clear.
        pub const EPHEMERAL: Range<usize> = 8..40;
        /// The initiator's static public key, sealed (32 bytes and the tag).
        pub const STATIC: Range<usize> = 40..88;
        /// The TAI64N timestamp, sealed (12 bytes and the tag).
        pub const TIMESTAMP: Range<usize> = 88..116;
        /// mac1: keyed with the receiver's public key.
        pub const MAC1: Range<usize> = 116..132;
        /// mac2: keyed with a cookie, or zeros.
        pub const MAC2: Range<usize> = 132..148;
    }

    /// A handshake response's fields.
    pub mod response {
        use std::ops::Range;
        /// The responder's index for the session.
        pub const SENDER: Range<usize> = 4..8;
        /// The initiator's index it answers.
        pub const RECEIVER: Range<usize> = 8..12;
        /// The responder's ephemeral public key, in the clear.
        pub const EPHEMERAL: Range<usize> = 12..44;
        /// Nothing, sealed: the tag alone, which proves the responder.
        pub const EMPTY: Range<usize> = 44..60;
        /// mac1: keyed with the receiver's public key.
        pub const MAC1: Range<usize> = 60..76;
        /// mac2: keyed with a cookie, or zeros.
        pub const MAC2: Range<usize> = 76..92;
    }

    /// A cookie reply's fields.
    pub mod cookie_reply {
        use std::ops::Range;
        /// The sender index of the message it answers.
        pub const RECEIVER: Range<usize> = 4..8;
        /// The XChaCha20-Poly1305 nonce.
        pub const NONCE: Range<usize> = 8..32;
        /// The cookie, sealed: 16 bytes and the tag.
        pub const COOKIE: Range<usize> = 32..64;
    }

    /// A transport data message's header.
    pub mod data {
        use std::ops::Range;
        /// The receiver's index for the session.
        pub const RECEIVER: Range<usize> = 4..8;
        /// The message's counter (its nonce).
        pub const COUNTER: Range<usize> = 8..16;
    }
}

/// The message kinds by their type word (the type byte and three zero bytes, little-endian, as the kernel reads
/// it) and their exact lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// Type 1.
    Initiation,
    /// Type 2.
    Response,
    /// Type 3.
    CookieReply,
    /// Type 4.
    Data,
}

impl MessageKind {
    /// The kind of `message`, or `None` if it is not a WireGuard message of a valid length.
    pub fn of(message: &[u8]) -> Option<MessageKind> {
        let word = u32::from_le_bytes(message.get(field::TYPE)?.try_into().ok()?);
        let kind = match (word, message.len()) {
            (1, INITIATION_LEN) => MessageKind::Initiation,
            (2, RESPONSE_LEN) => MessageKind::Response,
            (3, COOKIE_REPLY_LEN) => MessageKind::CookieReply,
            (4, len) if len >= DATA_MIN_LEN => MessageKind::Data,
            _ => return None,
        };
        Some(kind)
    }

    /// The type word this kind starts with.
    fn type_word(self) -> [u8; 4] {
        let byte = match self {
            MessageKind::Initiation => 1,
            MessageKind::Response => 2,
            MessageKind::CookieReply => 3,
            MessageKind::Data => 4,
        };
        [byte, 0, 0, 0]
    }
}

/// Where a handshake message's mac1 and mac2 are: the last 32 bytes of a message of `message_len` (at least 32).
pub fn macs_at(message_len: usize) -> (usize, usize) {
    (message_len - 32, message_len - 16)
}

/// The key a handshake message's mac1 is made with for the holder of `public`: HASH(LABEL_MAC1 || public).
pub fn mac1_key(public: &[u8; 32]) -> [u8; 32] {
    blake2s::hash(&[blake2s::LABEL_MAC1, public])
}

/// Writes the mac1 of a handshake message (an initiation or a response, over everything before its MACs) made
/// with `mac1_key` ([`mac1_key`] of the receiver's public key); returns it.
pub fn set_mac1(message: &mut [u8], mac1_key: &[u8; 32]) -> [u8; 16] {
    let (mac1_at, mac2_at) = macs_at(message.len());
    let mac1 = blake2s::mac(mac1_key, &[&message[..mac1_at]]);
    message[mac1_at..mac2_at].copy_from_slice(&mac1);
    mac1
}

/// A little-endian u32 field of a buffer whose length was checked when the view was made.
fn le32(buffer: &[u8], at: Range<usize>) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&buffer[at]);
    u32::from_le_bytes(word)
}

/// A 32-byte field (a public key) of a buffer whose length was checked when the view was made.
fn key32(buffer: &[u8], at: Range<usize>) -> [u8; 32] {
    let mut key = [0u8; 32];
    key.copy_from_slice(&buffer[at]);
    key
}

/// Defines a handshake message's view: checked construction over exactly `$len` bytes of type `$kind`, and the
/// zeroed start of a new one.
macro_rules! exact_view {
    ($(#[$doc:meta])* $name:ident, $kind:expr, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name<T> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// The view of `buffer`, or `None` unless it is a message of this type and length.
            pub fn new_checked(buffer: T) -> Option<Self> {
                (MessageKind::of(buffer.as_ref()) == Some($kind)).then_some($name { buffer })
            }
        }

        impl<'a> $name<&'a mut [u8; $len]> {
            /// A new message in `buffer`: zeros but for its type word.
            pub fn start(buffer: &'a mut [u8; $len]) -> Self {
                buffer.fill(0);
                buffer[field::TYPE].copy_from_slice(&$kind.type_word());
                $name { buffer }
            }
        }
    };
}

exact_view!(
    /// A handshake initiation (type 1).
    Initiation,
    MessageKind::Initiation,
    INITIATION_LEN
);
exact_view!(
    /// A handshake response (type 2).
    Response,
    MessageKind::Response,
    RESPONSE_LEN
);
exact_view!(
    /// A cookie reply (type 3).
    CookieReply,
    MessageKind::CookieReply,
    COOKIE_REPLY_LEN
);

impl<T: AsRef<[u8]>> Initiation<T> {
    /// The initiator's index for this handshake.
    pub fn sender(&self) -> u32 {
        le32(self.buffer.as_ref(), field::initiation::SENDER)
    }
    /// The initiator's ephemeral public key.
    pub fn ephemeral(&self) -> [u8; 32] {
        key32(self.buffer.as_ref(), field::initiation::EPHEMERAL)
    }
    /// The sealed static key (ciphertext and tag).
    pub fn sealed_static(&self) -> &[u8] {
        &self.buffer.as_ref()[field::initiation::STATIC]
    }
    /// The sealed timestamp (ciphertext and tag).
    pub fn sealed_timestamp(&self) -> &[u8] {
        &self.buffer.as_ref()[field::initiation::TIMESTAMP]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Initiation<T> {
    /// Sets the initiator's index.
    pub fn set_sender(&mut self, index: u32) {
        self.buffer.as_mut()[field::initiation::SENDER].copy_from_slice(&index.to_le_bytes());
    }
    /// The ephemeral key's bytes, to write.
    pub fn ephemeral_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::initiation::EPHEMERAL]
    }
    /// The static key's field (the key in its first 32 bytes, sealed in place with the tag after it).
    pub fn sealed_static_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::initiation::STATIC]
    }
    /// The timestamp's field (the label in its first 12 bytes, sealed in place with the tag after it).
    pub fn sealed_timestamp_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::initiation::TIMESTAMP]
    }
}

impl<T: AsRef<[u8]>> Response<T> {
    /// The responder's index for the session.
    pub fn sender(&self) -> u32 {
        le32(self.buffer.as_ref(), field::response::SENDER)
    }
    /// The initiator's index it answers.
    pub fn receiver(&self) -> u32 {
        le32(self.buffer.as_ref(), field::response::RECEIVER)
    }
    /// The responder's ephemeral public key.
    pub fn ephemeral(&self) -> [u8; 32] {
        key32(self.buffer.as_ref(), field::response::EPHEMERAL)
    }
    /// The sealed empty payload: its tag.
    pub fn sealed_empty(&self) -> &[u8] {
        &self.buffer.as_ref()[field::response::EMPTY]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Response<T> {
    /// Sets the responder's index.
    pub fn set_sender(&mut self, index: u32) {
        self.buffer.as_mut()[field::response::SENDER].copy_from_slice(&index.to_le_bytes());
    }
    /// Sets the index of the initiation it answers.
    pub fn set_receiver(&mut self, index: u32) {
        self.buffer.as_mut()[field::response::RECEIVER].copy_from_slice(&index.to_le_bytes());
    }
    /// The ephemeral key's bytes, to write.
    pub fn ephemeral_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::response::EPHEMERAL]
    }
    /// The sealed empty payload's field (the tag, written in place).
    pub fn sealed_empty_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::response::EMPTY]
    }
}

impl<T: AsRef<[u8]>> CookieReply<T> {
    /// The sender index of the message it answers.
    pub fn receiver(&self) -> u32 {
        le32(self.buffer.as_ref(), field::cookie_reply::RECEIVER)
    }
    /// The nonce the cookie is sealed with.
    pub fn nonce(&self) -> &[u8] {
        &self.buffer.as_ref()[field::cookie_reply::NONCE]
    }
    /// The sealed cookie: 16 bytes, then the tag.
    pub fn sealed_cookie(&self) -> &[u8] {
        &self.buffer.as_ref()[field::cookie_reply::COOKIE]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CookieReply<T> {
    /// Sets the sender index of the message it answers.
    pub fn set_receiver(&mut self, index: u32) {
        self.buffer.as_mut()[field::cookie_reply::RECEIVER].copy_from_slice(&index.to_le_bytes());
    }
    /// The nonce (to fill) and the sealed cookie's field (to seal into), at once.
    pub fn nonce_and_cookie_mut(&mut self) -> (&mut [u8], &mut [u8]) {
        let (head, cookie) = self.buffer.as_mut().split_at_mut(field::cookie_reply::COOKIE.start);
        (&mut head[field::cookie_reply::NONCE], cookie)
    }
}

/// The header of a transport data message (type 4), over at least its 16 bytes.
#[derive(Debug, Clone, Copy)]
pub struct DataHeader<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> DataHeader<T> {
    /// The view of `buffer`'s first 16 bytes, or `None` when it is shorter (the type word is not checked: the
    /// header of a message being written has none yet).
    pub fn new_checked(buffer: T) -> Option<Self> {
        (buffer.as_ref().len() >= DATA_HEADER_LEN).then_some(DataHeader { buffer })
    }
    /// The receiver's index for the session.
    pub fn receiver(&self) -> u32 {
        le32(self.buffer.as_ref(), field::data::RECEIVER)
    }
    /// The message's counter.
    pub fn counter(&self) -> u64 {
        let mut counter = [0u8; 8];
        counter.copy_from_slice(&self.buffer.as_ref()[field::data::COUNTER]);
        u64::from_le_bytes(counter)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DataHeader<T> {
    /// Writes the whole header: the type word, `receiver` and `counter`.
    pub fn write(&mut self, receiver: u32, counter: u64) {
        let b = self.buffer.as_mut();
        b[field::TYPE].copy_from_slice(&MessageKind::Data.type_word());
        b[field::data::RECEIVER].copy_from_slice(&receiver.to_le_bytes());
        b[field::data::COUNTER].copy_from_slice(&counter.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field tables cover each handshake message whole, in order, with no gap or overlap.
    #[test]
    fn test_fields_tile_each_message() {
        let tiles: [(&[Range<usize>], usize); 3] = [
            (
                &[
                    field::TYPE,
                    field::initiation::SENDER,
                    field::initiation::EPHEMERAL,
                    field::initiation::STATIC,
                    field::initiation::TIMESTAMP,
                    field::initiation::MAC1,
                    field::initiation::MAC2,
                ],
                INITIATION_LEN,
            ),
            (
                &[
                    field::TYPE,
                    field::response::SENDER,
                    field::response::RECEIVER,
                    field::response::EPHEMERAL,
                    field::response::EMPTY,
                    field::response::MAC1,
                    field::response::MAC2,
                ],
                RESPONSE_LEN,
            ),
            (
                &[field::TYPE, field::cookie_reply::RECEIVER, field::cookie_reply::NONCE, field::cookie_reply::COOKIE],
                COOKIE_REPLY_LEN,
            ),
        ];
        for (fields, len) in tiles {
            let mut at = 0;
            for f in fields {
                assert_eq!(f.start, at, "{fields:?}");
                at = f.end;
            }
            assert_eq!(at, len);
        }
        assert_eq!(macs_at(INITIATION_LEN), (field::initiation::MAC1.start, field::initiation::MAC2.start));
        assert_eq!(macs_at(RESPONSE_LEN), (field::response::MAC1.start, field::response::MAC2.start));
        assert_eq!(field::data::COUNTER.end, DATA_HEADER_LEN);
    }

    #[test]
    fn test_views_read_what_they_wrote_and_refuse_other_buffers() {
        let mut buf = [0u8; RESPONSE_LEN];
        let mut response = Response::start(&mut buf);
        response.set_sender(0x0102_0304);
        response.set_receiver(7);
        response.ephemeral_mut().fill(9);
        assert_eq!((response.sender(), response.receiver(), response.ephemeral()), (0x0102_0304, 7, [9; 32]));
        assert_eq!(buf[..8], [2, 0, 0, 0, 4, 3, 2, 1]);
        assert!(Response::new_checked(&buf[..]).is_some());
        assert!(Response::new_checked(&buf[..RESPONSE_LEN - 1]).is_none(), "a length of its own");
        assert!(Initiation::new_checked(&buf[..]).is_none(), "another type");

        let mut data = [0u8; DATA_MIN_LEN];
        DataHeader::new_checked(&mut data[..]).expect("long enough").write(5, 1 << 40);
        let header = DataHeader::new_checked(&data[..]).expect("long enough");
        assert_eq!(
            (header.receiver(), header.counter(), MessageKind::of(&data)),
            (5, 1 << 40, Some(MessageKind::Data))
        );
        assert!(DataHeader::new_checked(&data[..DATA_HEADER_LEN - 1]).is_none());
    }

    #[test]
    fn test_kinds_need_the_exact_type_word_and_length() {
        let mut m = [0u8; INITIATION_LEN];
        m[0] = 1;
        assert_eq!(MessageKind::of(&m), Some(MessageKind::Initiation));
        m[1] = 1;
        assert_eq!(MessageKind::of(&m), None, "reserved bytes must be zero");
        assert_eq!(MessageKind::of(&m[..3]), None);
        let mut d = [0u8; DATA_MIN_LEN];
        d[0] = 4;
        assert_eq!(MessageKind::of(&d), Some(MessageKind::Data));
        assert_eq!(MessageKind::of(&d[..DATA_MIN_LEN - 1]), None);
    }
}
