//! Bucket keys: the text a request (or an admin query) is counted under, bounded whatever the
//! client sends, and free of `{`/`}` (Redis Cluster hash tags).
//!
//! A key names which part it read, not only what kind: `header:X-User` and `header:X-Org`
//! (or `query:a` and `query:b`) never meet in one bucket, whatever their values (issue 52 row
//! 1), while two limits keyed by the same spec still share theirs.

use std::fmt::Write as _;

use xxhash_rust::xxh3::{xxh3_128, xxh3_64, Xxh3};

use super::parts::{Part, PartValue};
use super::{is_plain, IpText, MAX_PLAIN_KEY_LEN};

/// A part's name longer than this (or with bytes outside [`is_name_byte`]) is written as `#`
/// and 16 hex digits of its hash.
pub const MAX_PLAIN_NAME_LEN: usize = 24;

/// Longest tag [`write_tag`] writes: a kind letter, `.`, and the name or its hash.
pub const MAX_TAG_LEN: usize = 2 + MAX_PLAIN_NAME_LEN;

/// Bytes kept verbatim in a part's name: none of the separators a key uses (`:`, `=`, `,`)
/// nor `#`, which marks a hashed name.
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~')
}

/// Who a bucket belongs to, as far as the key is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketClient<'a> {
    /// The route-wide bucket (`key = "global"`).
    Global,
    /// The value of a one-part key, and the part it was read for.
    One(&'a Part, PartValue<'a>),
    /// The parts and values of a composite key, in the key's order.
    Composite(&'a [(&'a Part, PartValue<'a>)]),
}

/// Is `bytes` kept verbatim in a key?
fn plain(bytes: &[u8]) -> bool {
    bytes.len() <= MAX_PLAIN_KEY_LEN && bytes.iter().all(|b| is_plain(*b))
}

/// A part's name as its tag writes it.
enum TagName<'a> {
    /// A part that reads one thing (`client_ip`, `method`, `path`).
    None,
    /// The name as configured.
    Plain(&'a str),
    /// The xxh3-64 of a name that is long or not plain.
    Hashed(u64),
}

/// The kind letter(s) and name of `part`'s tag.
fn tag_of(part: &Part) -> (&'static str, TagName<'_>) {
    let (kind, name): (&str, &str) = match part {
        Part::ClientIp => return ("ip", TagName::None),
        Part::Method => return ("m", TagName::None),
        Part::Path => return ("p", TagName::None),
        Part::Header(name) => ("h", name.as_str()),
        Part::Query(name) => ("q", name),
        Part::Cookie(name) => ("c", name),
    };
    let bytes = name.as_bytes();
    if bytes.len() <= MAX_PLAIN_NAME_LEN && bytes.iter().all(|b| is_name_byte(*b)) {
        (kind, TagName::Plain(name))
    } else {
        (kind, TagName::Hashed(xxh3_64(bytes)))
    }
}

/// Write `part`'s tag: `ip`, `m` and `p` for the parts that read one thing; `h.<name>`,
/// `q.<name>`, `c.<name>` for those that read a named field (the name as configured, header
/// names lower-case), or `<kind>.#<xxh3-64 hex>` of a name that is long or not plain. A tag
/// never holds `:`, `=`, `,`, `{` or `}`.
pub fn write_tag(out: &mut String, part: &Part) {
    let (kind, name) = tag_of(part);
    out.push_str(kind);
    match name {
        TagName::None => {}
        TagName::Plain(name) => {
            out.push('.');
            out.push_str(name);
        }
        TagName::Hashed(hash) => {
            let _ = write!(out, ".#{hash:016x}");
        }
    }
}

/// Write the value a part took: the address of a `client_ip` part, `ip:<addr>` for a named
/// part the request lacked (never a plain value: `:` is not plain), the plain value, or `#` and
/// the xxh3-128 hex of any other.
fn write_value(out: &mut String, part: &Part, value: &PartValue<'_>) {
    match value {
        PartValue::Ip(ip) => {
            if !matches!(part, Part::ClientIp) {
                out.push_str("ip:");
            }
            out.push_str(IpText::new(*ip).as_str());
        }
        PartValue::Text(_, bytes) if plain(bytes) => {
            // Plain bytes are ASCII, so this cannot fail.
            out.push_str(std::str::from_utf8(bytes).unwrap_or_default());
        }
        PartValue::Text(_, bytes) => {
            let _ = write!(out, "#{:032x}", xxh3_128(bytes));
        }
    }
}

/// Write the bucket key of `client` on `route` into `out` (cleared first):
///
/// - `<route>:global` for the route-wide bucket;
/// - `<route>:<tag>:<value>` for a one-part key ([`write_tag`]: `ip:<addr>` for a client
///   address, `h.x-api-key:<value>` for a header, …), where the value is `#<xxh3-128 hex>` when
///   longer than [`MAX_PLAIN_KEY_LEN`] or not plain, and `ip:<addr>` when the request lacked
///   the field;
/// - `<route>:k:<tag>=<value>,<tag>=<value>…` for a composite key, or `<route>:k:#<xxh3-128
///   hex>` of every part when that text would be longer than [`MAX_PLAIN_KEY_LEN`] or a value
///   is not plain.
///
/// The result is at most route name + 2 + [`MAX_TAG_LEN`] + [`MAX_PLAIN_KEY_LEN`] bytes. The
/// proxy and the admin inspector both build keys here, so they always agree.
pub fn write_bucket_key(out: &mut String, route: &str, client: &BucketClient<'_>) {
    out.clear();
    match client {
        BucketClient::Global => {
            out.reserve(route.len() + ":global".len());
            out.push_str(route);
            out.push_str(":global");
        }
        BucketClient::One(part, value) => {
            // Sized before the first push: a key grown push by push reallocates several times,
            // and this runs on every limited request.
            out.reserve(route.len() + 2 + MAX_TAG_LEN + MAX_PLAIN_KEY_LEN);
            out.push_str(route);
            out.push(':');
            write_tag(out, part);
            out.push(':');
            write_value(out, part, value);
        }
        BucketClient::Composite(values) => {
            let mut key = CompositeKey::start(out, route);
            for (part, value) in values.iter() {
                key.push(part, value);
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

    /// Add the value `part` took.
    pub fn push(&mut self, part: &Part, value: &PartValue<'_>) {
        let (kind, name) = tag_of(part);
        let ip;
        let (missing, bytes) = match value {
            PartValue::Ip(addr) => {
                ip = IpText::new(*addr);
                (!matches!(part, Part::ClientIp), ip.as_bytes())
            }
            PartValue::Text(_, bytes) => (false, &bytes[..]),
        };
        // Length-prefixed, and names and addresses marked apart from texts, so no two lists
        // of parts and values hash the same input.
        self.hasher.update(kind.as_bytes());
        let name_len = match name {
            TagName::None => {
                self.hasher.update(&[0]);
                0
            }
            TagName::Plain(name) => {
                self.hasher.update(&[1]);
                self.hasher.update(&(name.len() as u64).to_le_bytes());
                self.hasher.update(name.as_bytes());
                1 + name.len()
            }
            TagName::Hashed(hash) => {
                self.hasher.update(&[2]);
                self.hasher.update(&hash.to_le_bytes());
                2 + 16
            }
        };
        self.hasher
            .update(&[u8::from(matches!(value, PartValue::Ip(_)))]);
        self.hasher.update(&(bytes.len() as u64).to_le_bytes());
        self.hasher.update(bytes);
        if !self.plain {
            return;
        }
        let sep = usize::from(self.out.len() > self.start);
        let marker = if missing { "ip:".len() } else { 0 };
        let tag_len = kind.len() + name_len;
        let grown = self.out.len() - self.start + sep + tag_len + 1 + marker + bytes.len();
        // An address is written by `IpText` (digits, dots, colons): `,` and `=` never occur in
        // one, and `,` and `:` never in a plain value, nor `=`, `,`, `:` in a tag, so the text
        // is unambiguous.
        let ok = matches!(value, PartValue::Ip(_)) || bytes.iter().all(|b| is_plain(*b));
        if !ok || grown > MAX_PLAIN_KEY_LEN {
            self.plain = false;
            return;
        }
        if sep == 1 {
            self.out.push(',');
        }
        write_tag(self.out, part);
        self.out.push('=');
        if missing {
            self.out.push_str("ip:");
        }
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
