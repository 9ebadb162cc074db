//! Bucket keys: the text a request (or an admin query) is counted under, bounded whatever the
//! client sends, and free of `{`/`}` (Redis Cluster hash tags).

use std::fmt::Write as _;

use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use super::parts::PartValue;
use super::{is_plain, IpText, MAX_PLAIN_KEY_LEN};

/// Who a bucket belongs to, as far as the key is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketClient<'a> {
    /// The route-wide bucket (`key = "global"`).
    Global,
    /// The value of a one-part key.
    One(PartValue<'a>),
    /// The values of a composite key, in the key's order.
    Composite(&'a [PartValue<'a>]),
}

/// Is `bytes` kept verbatim in a key?
fn plain(bytes: &[u8]) -> bool {
    bytes.len() <= MAX_PLAIN_KEY_LEN && bytes.iter().all(|b| is_plain(*b))
}

/// Write the bucket key of `client` on `route` into `out` (cleared first):
///
/// - `<route>:global` for the route-wide bucket;
/// - `<route>:ip:<addr>` for a client address;
/// - `<route>:<tag>:<value>` for a value (`h` header, `q` query, `c` cookie, `m` method, `p`
///   path), or `<route>:<tag>:#<xxh3-128 hex>` when the value is longer than
///   [`MAX_PLAIN_KEY_LEN`] or has bytes outside the plain set;
/// - `<route>:k:<tag>=<value>,<tag>=<value>…` for a composite key (`ip` tags an address), or
///   `<route>:k:#<xxh3-128 hex>` of every part when that text would be longer than
///   [`MAX_PLAIN_KEY_LEN`] or a value is not plain.
///
/// The result is at most route name + 3 + [`MAX_PLAIN_KEY_LEN`] bytes. The proxy and the admin
/// inspector both build keys here, so they always agree.
pub fn write_bucket_key(out: &mut String, route: &str, client: &BucketClient<'_>) {
    out.clear();
    match client {
        BucketClient::Global => {
            out.reserve(route.len() + ":global".len());
            out.push_str(route);
            out.push_str(":global");
        }
        BucketClient::One(PartValue::Ip(ip)) => {
            let text = IpText::new(*ip);
            // Sized before the first push: a key grown push by push reallocates several times,
            // and this runs on every limited request.
            out.reserve(route.len() + ":ip:".len() + text.as_bytes().len());
            out.push_str(route);
            out.push_str(":ip:");
            out.push_str(text.as_str());
        }
        BucketClient::One(PartValue::Text(kind, bytes)) => {
            // The longer of a plain value and `#` + 32 hex digits.
            out.reserve(route.len() + ":h:".len() + MAX_PLAIN_KEY_LEN.max(33));
            out.push_str(route);
            out.push(':');
            out.push_str(kind.tag());
            out.push(':');
            if plain(bytes) {
                // Plain bytes are ASCII, so this cannot fail.
                out.push_str(std::str::from_utf8(bytes).unwrap_or_default());
            } else {
                let _ = write!(out, "#{:032x}", xxh3_128(bytes));
            }
        }
        BucketClient::Composite(values) => {
            let mut key = CompositeKey::start(out, route);
            for v in values.iter() {
                key.push(v);
            }
            key.finish();
        }
    }
}

/// A composite key written part by part, with no intermediate list: the plain text while every
/// value is plain and it fits, and a hash of every part all along for when it does not.
pub struct CompositeKey<'o> {
    out: &'o mut String,
    /// Where the parts start in `out`.
    start: usize,
    plain: bool,
    hasher: Xxh3,
}

impl<'o> CompositeKey<'o> {
    /// Clear `out` and write `<route>:k:`.
    pub fn start(out: &'o mut String, route: &str) -> Self {
        out.clear();
        out.reserve(route.len() + ":k:".len() + MAX_PLAIN_KEY_LEN.max(33));
        out.push_str(route);
        out.push_str(":k:");
        let start = out.len();
        CompositeKey {
            out,
            start,
            plain: true,
            hasher: Xxh3::new(),
        }
    }

    /// Add the next part's value.
    pub fn push(&mut self, value: &PartValue<'_>) {
        let ip;
        let (tag, bytes) = match value {
            PartValue::Ip(addr) => {
                ip = IpText::new(*addr);
                ("ip", ip.as_bytes())
            }
            PartValue::Text(kind, bytes) => (kind.tag(), &bytes[..]),
        };
        // Length-prefixed, so no two lists of values hash the same input.
        self.hasher.update(tag.as_bytes());
        self.hasher.update(&(bytes.len() as u64).to_le_bytes());
        self.hasher.update(bytes);
        if !self.plain {
            return;
        }
        let sep = usize::from(self.out.len() > self.start);
        let grown = self.out.len() - self.start + sep + tag.len() + 1 + bytes.len();
        // An address is written by `IpText` (digits, dots, colons): plain here; `,` and `=`
        // never occur in one, and `,` never in a plain value, so the text is unambiguous.
        let ok = matches!(value, PartValue::Ip(_)) || bytes.iter().all(|b| is_plain(*b));
        if !ok || grown > MAX_PLAIN_KEY_LEN {
            self.plain = false;
            return;
        }
        if sep == 1 {
            self.out.push(',');
        }
        self.out.push_str(tag);
        self.out.push('=');
        self.out
            .push_str(std::str::from_utf8(bytes).unwrap_or_default());
    }

    /// Finish the key: the plain text, or `#` and the hash of every part.
    pub fn finish(self) {
        if !self.plain {
            self.out.truncate(self.start);
            let _ = write!(self.out, "#{:032x}", self.hasher.digest128());
        }
    }
}
