//! HTTP/2 frames written and read by hand, for what a client library will not send (an
//! unfinished header block, streams opened past a GOAWAY).

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const GOAWAY: u8 = 0x7;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
/// `RST_STREAM`'s `REFUSED_STREAM` (RFC 9113 §7).
pub const REFUSED_STREAM: u32 = 0x7;

/// One HTTP/2 frame: 9-byte header (RFC 9113 §4.1), then `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// The frame types in `bytes` (what the server sent), in order; a trailing partial frame is
/// ignored.
pub fn frame_types(bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 9 {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        types.push(rest[3]);
        rest = &rest[(9 + len).min(rest.len())..];
    }
    types
}
