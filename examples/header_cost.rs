//! What adding the four forwarding headers to a request costs through each way Pingora 0.9's
//! `RequestHeader` offers, on a request head like a browser's (10 fields, case kept as
//! received, as Pingora's HTTP/1 parser builds it).
//!
//! `scripts/bench-layers` measures what slidegate's layers cost in place; this measures the
//! alternatives for the biggest of them, the header insertion itself:
//!
//! ```text
//! cargo run --release --example header_cost
//! ```
//!
//! Prints ns per request (four headers) over the clone every variant starts from, the median
//! of 9 rounds of 200 000 requests each.

use std::hint::black_box;
use std::time::Instant;

use http::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;

const ROUNDS: usize = 9;
const PER_ROUND: u32 = 200_000;

const FIELDS: [(&str, &str); 10] = [
    ("Host", "shop.example.com"),
    (
        "User-Agent",
        "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    ),
    (
        "Accept",
        "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    ),
    ("Accept-Language", "en-US,en;q=0.5"),
    ("Accept-Encoding", "gzip, deflate, br, zstd"),
    ("Referer", "https://shop.example.com/cart"),
    ("Cookie", "session=3f2a9c; theme=dark"),
    ("Connection", "keep-alive"),
    ("Upgrade-Insecure-Requests", "1"),
    ("Priority", "u=0, i"),
];

const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
const XRI: HeaderName = HeaderName::from_static("x-real-ip");

fn request() -> RequestHeader {
    let mut req = RequestHeader::build("GET", b"/products?page=2", Some(FIELDS.len())).unwrap();
    for (name, value) in FIELDS {
        req.append_header(name, value).unwrap();
    }
    req
}

fn values() -> [HeaderValue; 4] {
    [
        HeaderValue::from_static("203.0.113.7"),
        HeaderValue::from_static("https"),
        HeaderValue::from_static("203.0.113.7"),
        HeaderValue::from_static("for=203.0.113.7;proto=https"),
    ]
}

/// The clone every variant starts from (Pingora clones the request head for the upstream).
fn baseline(req: &RequestHeader, _v: &[HeaderValue; 4]) -> RequestHeader {
    req.clone()
}

/// What slidegate does: `insert_header` with `&'static str` names (titled on the wire).
fn insert_str(req: &RequestHeader, v: &[HeaderValue; 4]) -> RequestHeader {
    let mut r = req.clone();
    r.insert_header("X-Forwarded-For", v[0].clone()).unwrap();
    r.insert_header("X-Forwarded-Proto", v[1].clone()).unwrap();
    r.insert_header("X-Real-IP", v[2].clone()).unwrap();
    r.insert_header("Forwarded", v[3].clone()).unwrap();
    r
}

/// `insert_header` with parsed `HeaderName` constants (Pingora copies the name into its case
/// map, lowercase on the wire).
fn insert_name(req: &RequestHeader, v: &[HeaderValue; 4]) -> RequestHeader {
    let mut r = req.clone();
    r.insert_header(XFF, v[0].clone()).unwrap();
    r.insert_header(XFP, v[1].clone()).unwrap();
    r.insert_header(XRI, v[2].clone()).unwrap();
    r.insert_header(http::header::FORWARDED, v[3].clone())
        .unwrap();
    r
}

/// `append_header` with `&'static str` names (right only when the request has none of them).
fn append_str(req: &RequestHeader, v: &[HeaderValue; 4]) -> RequestHeader {
    let mut r = req.clone();
    r.append_header("X-Forwarded-For", v[0].clone()).unwrap();
    r.append_header("X-Forwarded-Proto", v[1].clone()).unwrap();
    r.append_header("X-Real-IP", v[2].clone()).unwrap();
    r.append_header("Forwarded", v[3].clone()).unwrap();
    r
}

/// Through `http::request::Parts` (`From` both ways): the map takes parsed names and can be
/// reserved, but the head comes back without its case map, so every field the client sent
/// goes upstream lowercased.
fn via_parts(req: &RequestHeader, v: &[HeaderValue; 4]) -> RequestHeader {
    let mut parts: http::request::Parts = req.clone().into();
    parts.headers.reserve(4);
    parts.headers.insert(XFF, v[0].clone());
    parts.headers.insert(XFP, v[1].clone());
    parts.headers.insert(XRI, v[2].clone());
    parts.headers.insert(http::header::FORWARDED, v[3].clone());
    RequestHeader::from(parts)
}

type Variant = fn(&RequestHeader, &[HeaderValue; 4]) -> RequestHeader;

fn ns_per_request(f: Variant, req: &RequestHeader, v: &[HeaderValue; 4]) -> f64 {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..PER_ROUND {
                drop(black_box(f(black_box(req), black_box(v))));
            }
            start.elapsed().as_nanos() as f64 / f64::from(PER_ROUND)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn main() {
    let req = request();
    let v = values();
    // Every variant sends the same fields (names compared case-insensitively).
    let mut wire = Vec::new();
    insert_str(&req, &v).header_to_h1_wire(&mut wire);
    let lower = String::from_utf8(wire).unwrap().to_ascii_lowercase();
    for f in [insert_name as Variant, append_str, via_parts] {
        let mut w = Vec::new();
        f(&req, &v).header_to_h1_wire(&mut w);
        assert_eq!(String::from_utf8(w).unwrap().to_ascii_lowercase(), lower);
    }
    let base = ns_per_request(baseline, &req, &v);
    println!("clone of the request head: {base:.0} ns");
    println!("| way | ns per request (4 headers) | case on the wire |");
    println!("|---|---:|---|");
    let variants: [(&str, Variant, &str); 4] = [
        (
            "`insert_header(&'static str)` (slidegate)",
            insert_str,
            "kept, names titled",
        ),
        (
            "`insert_header(HeaderName)`",
            insert_name,
            "kept, names lowercase",
        ),
        (
            "`append_header(&'static str)`",
            append_str,
            "kept, names titled",
        ),
        (
            "`http::request::Parts` and back",
            via_parts,
            "lost for every field",
        ),
    ];
    for (name, f, case) in variants {
        let ns = ns_per_request(f, &req, &v) - base;
        println!("| {name} | {ns:.0} | {case} |");
    }
}
