//! One identity per value, however a client writes it (issue 32 rows 1 and 2), through the
//! real binary on the memory and Redis stores, over HTTP/1.1, h2c and HTTP/1.1 and HTTP/2 over
//! TLS: a limit of N admits N whatever the spelling.
//!
//! - A key header padded with SP/HTAB: HTTP/1 parsing drops the padding (one bucket); in
//!   HTTP/2 such a field is malformed (RFC 9113 §8.2.1) and answered 400, never a new bucket.
//! - Cookie and query values quoted, percent-encoded, padded, or given twice with the same
//!   value are one bucket; given twice with different values they are ambiguous: 400, nothing
//!   counted.
//! - What lenient apps read as one value is one bucket too: `Basic` credentials with junk,
//!   padding or trailing bits in their base64; a quoted cookie's backslash escapes; a query
//!   split at `;`; a key header with NBSP or NEL around it.

use crate::common;

use common::fetch::{fetch_with, url};
use common::proxy::{ConfigBuilder, Proxy};
use common::redis::RedisServer;
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

/// Route name, key, limit: other names and limits than the issue's example.
const ROUTES: [(&str, &str, usize); 8] = [
    ("hdr", r#""header:X-Tenant-Token""#, 3),
    ("auth", r#""header:Authorization""#, 2),
    ("pair", r#"["header:X-Tenant-Token", "method"]"#, 2),
    ("ck", r#""cookie:session_id""#, 3),
    ("qry", r#"["query:account", "path"]"#, 2),
    ("basic", r#""header:Authorization""#, 2),
    ("raw", r#""header:X-Raw-Key""#, 2),
    ("php", r#""query:api_key""#, 2),
];

fn start(store: &str, up: &Upstream, ca: &TestCa) -> Proxy {
    let mut config = ConfigBuilder::new()
        .store(store)
        .trusted_proxies(&["127.0.0.1/32"])
        .upstream("app", up.addr());
    for (name, key, n) in ROUTES {
        config = config.route(
            name,
            &format!(
                "path_prefix = \"/{name}\"\nkey = {key}\n\
                 limits = [{{ requests = {n}, window = \"10m\" }}]"
            ),
        );
    }
    let mut options = tls_options(ca, "h2c = true");
    // The reason of every 400 in the log, should a case fail.
    options
        .env
        .push(("RUST_LOG".into(), "info,slidegate=debug".into()));
    let proxy = Proxy::start_with(&config.build(), options);
    // Decide nothing before the store answers (until then `on_error` would).
    common::admin::wait_readyz(&proxy, 200, std::time::Duration::from_secs(10));
    proxy
}

struct Client {
    http: reqwest::Client,
    protocol: Protocol,
}

impl Client {
    async fn status(&self, proxy: &Proxy, path: &str, headers: &[(&str, &str)]) -> u16 {
        let url = url(proxy, self.protocol, path);
        let version = self.protocol.version();
        fetch_with(&self.http, &url, headers, version).await.status
    }
}

/// How many of `statuses` were admitted; panics on anything but 200, 429 and `also`.
fn admitted(case: &str, statuses: &[u16], also: &[u16]) -> usize {
    for s in statuses {
        assert!(
            [200, 429].contains(s) || also.contains(s),
            "{case}: {statuses:?}"
        );
    }
    statuses.iter().filter(|s| **s == 200).count()
}

/// Row 1: padded header values. Over HTTP/1 the padding is gone before the key is read; over
/// HTTP/2 a padded field is refused whatever its name.
async fn padded_headers(proxy: &Proxy, c: &Client, p: usize) {
    let h2 = c.protocol.version() == reqwest::Version::HTTP_2;
    let token = format!("tok-{p}");
    let forms = [
        token.clone(),
        format!(" {token}"),
        format!("{token}\t"),
        format!("\t {token} "),
        token.clone(),
        format!("{token}  "),
        token.clone(),
    ];
    let mut got = Vec::new();
    for form in &forms {
        got.push(c.status(proxy, "/hdr", &[("x-tenant-token", form)]).await);
    }
    let padded: Vec<u16> = [1, 2, 3, 5].iter().map(|i| got[*i]).collect();
    if h2 {
        assert_eq!(padded, [400; 4], "{:?} padded: {got:?}", c.protocol);
    }
    assert_eq!(
        admitted(&format!("{:?} hdr", c.protocol), &got, &[400]),
        3,
        "{:?}: {got:?}",
        c.protocol
    );

    // A padded field that is not the key is malformed all the same over HTTP/2.
    let other = c
        .status(
            proxy,
            "/pair",
            &[("x-tenant-token", &format!("t{p}")), ("x-other", " v")],
        )
        .await;
    assert_eq!(other, if h2 { 400 } else { 200 }, "{:?}", c.protocol);

    // Authorization: the scheme is case-insensitive and one space apart from the credentials.
    let cred = format!("c{p}");
    let mut got = Vec::new();
    for form in [
        format!("Bearer {cred}"),
        format!("bearer {cred}"),
        format!("BEARER  {cred}"),
        format!("Bearer\t{cred}"),
    ] {
        got.push(c.status(proxy, "/auth", &[("authorization", &form)]).await);
    }
    assert_eq!(got, [200, 200, 429, 429], "{:?} auth", c.protocol);
}

/// Row 2: cookie spellings, split fields, and ambiguity.
async fn cookie_spellings(proxy: &Proxy, c: &Client, p: usize) {
    let v = format!("s{p}x");
    let enc = v.replace('x', "%78");
    let mut got = Vec::new();
    for cookies in [
        vec![format!("session_id={v}")],
        vec![format!("session_id=\"{v}\"")],
        vec![format!("theme=a; session_id={enc}")],
        vec![format!("session_id=%22{v}%22")],
        vec![format!("theme=a;  session_id= \" {v} \"")],
        vec!["theme=a".to_string(), format!("session_id={v}")],
        vec![format!("session_id={v}; session_id=\"{enc}\"")],
        vec![format!("session_id={v}"), format!("session_id={v}")],
        // Python's http.cookies resolves escapes in a quoted value: `\170` and `\x` are `x`.
        vec![format!("session_id=\"s{p}\\170\"")],
        vec![format!("session_id=\"s{p}\\x\"")],
    ] {
        let headers: Vec<(&str, &str)> = cookies.iter().map(|c| ("cookie", c.as_str())).collect();
        got.push(c.status(proxy, "/ck", &headers).await);
    }
    assert_eq!(
        admitted(&format!("{:?} cookie", c.protocol), &got, &[]),
        3,
        "{:?}: {got:?}",
        c.protocol
    );

    // Two values: ambiguous, refused and not counted (a fresh value still has its quota).
    let w = format!("w{p}");
    for cookies in [
        vec![format!("session_id={v}; session_id={w}")],
        vec![format!("session_id={w}"), format!("session_id={v}")],
        vec![format!("session_id={w}; session_id=")],
    ] {
        let headers: Vec<(&str, &str)> = cookies.iter().map(|c| ("cookie", c.as_str())).collect();
        let status = c.status(proxy, "/ck", &headers).await;
        assert_eq!(status, 400, "{:?} {cookies:?}", c.protocol);
    }
    let cookie = format!("session_id={w}");
    let fresh = c.status(proxy, "/ck", &[("cookie", &cookie)]).await;
    assert_eq!(fresh, 200, "{:?}", c.protocol);
}

/// Row 2: query spellings and ambiguity (in a composite, on one path).
async fn query_spellings(proxy: &Proxy, c: &Client, p: usize) {
    let v = format!("acct{p}");
    let mut got = Vec::new();
    for q in [
        format!("account={v}"),
        format!("account=%61cct{p}"),
        format!("%61ccount={v}"),
        format!("account=%22{v}%22"),
        format!("account={v}&account={v}&x=1"),
        format!("account=+{v}"),
        format!("account={v};x=1"),
    ] {
        got.push(c.status(proxy, &format!("/qry/x?{q}"), &[]).await);
    }
    assert_eq!(
        admitted(&format!("{:?} query", c.protocol), &got, &[]),
        2,
        "{:?}: {got:?}",
        c.protocol
    );
    for q in [
        format!("account={v}&account=other{p}"),
        format!("account=other{p}&%61ccount={v}"),
        format!("account=&account={v}"),
        format!("account=other{p};account={v}"),
    ] {
        let status = c.status(proxy, &format!("/qry/x?{q}"), &[]).await;
        assert_eq!(status, 400, "{:?} {q}", c.protocol);
    }
    let path = format!("/qry/x?account=other{p}");
    let fresh = c.status(proxy, &path, &[]).await;
    assert_eq!(fresh, 200, "{:?}", c.protocol);
}

/// What lenient apps read as one value: `Basic` credentials spelled with junk, padding and
/// trailing bits, and a key header with NBSP or NEL bytes around it.
async fn lenient_spellings(proxy: &Proxy, c: &Client, p: usize) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("u{p}:pw"));
    // "u0:pw" is 5 bytes: the last digit carries 2 padding bits; flip one.
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let digits = b64.trim_end_matches('=');
    let last = alphabet
        .iter()
        .position(|a| *a == *digits.as_bytes().last().unwrap());
    let flipped = format!(
        "{}{}=",
        &digits[..digits.len() - 1],
        alphabet[last.unwrap() ^ 1] as char
    );
    let mut got = Vec::new();
    for form in [
        format!("Basic {b64}"),
        format!("Basic {digits}"),
        format!("basic {}.{}", &b64[..3], &b64[3..]),
        format!("Basic {b64}junk"),
        format!("Basic {flipped}"),
    ] {
        got.push(c.status(proxy, "/basic", &[("authorization", &form)]).await);
    }
    assert_eq!(got, [200, 200, 429, 429, 429], "{:?} basic", c.protocol);

    let key = format!("k{p}");
    let mut got = Vec::new();
    for raw in [
        key.clone().into_bytes(),
        [key.as_bytes(), b"\xa0"].concat(),
        [b"\xa0", key.as_bytes()].concat(),
        [key.as_bytes(), b"\x85"].concat(),
        key.clone().into_bytes(),
    ] {
        let value = reqwest::header::HeaderValue::from_bytes(&raw).unwrap();
        let url = url(proxy, c.protocol, "/raw");
        let resp = c.http.get(&url).header("x-raw-key", value).send().await;
        got.push(resp.expect("send").status().as_u16());
    }
    assert_eq!(
        admitted(&format!("{:?} raw", c.protocol), &got, &[400]),
        2,
        "{:?}: {got:?}",
        c.protocol
    );

    // A CGI server reads `X_Raw_Key` as `X-Raw-Key`: one header, and both at once repeat it.
    let (one, other) = (format!("u{p}"), format!("z{p}"));
    let mut got = Vec::new();
    for name in ["x_raw_key", "x-raw-key", "x_raw-key"] {
        got.push(c.status(proxy, "/raw", &[(name, &one)]).await);
    }
    assert_eq!(got, [200, 200, 429], "{:?} underscore", c.protocol);
    let both = [("x-raw-key", other.as_str()), ("x_raw_key", one.as_str())];
    assert_eq!(
        c.status(proxy, "/raw", &both).await,
        400,
        "{:?}",
        c.protocol
    );

    // PHP reads `api.key`, `api key` and `api[key` as `api_key`.
    let mut got = Vec::new();
    for q in ["api_key", "api.key", "api%20key", "api[key"] {
        let path = format!("/php?{q}=P{p}");
        got.push(c.status(proxy, &path, &[]).await);
    }
    assert_eq!(got, [200, 200, 429, 429], "{:?} php", c.protocol);
    let decoy = format!("/php?api_key=fresh{p}&api.key=P{p}");
    assert_eq!(c.status(proxy, &decoy, &[]).await, 400, "{:?}", c.protocol);
}

async fn exercise(proxy: &Proxy, ca: &TestCa) {
    for (p, protocol) in Protocol::ALL.into_iter().enumerate() {
        let c = Client {
            http: protocol.client(&ca.ca_pem()),
            protocol,
        };
        padded_headers(proxy, &c, p).await;
        cookie_spellings(proxy, &c, p).await;
        query_spellings(proxy, &c, p).await;
        lenient_spellings(proxy, &c, p).await;
    }
    // The refusals are counted as bad requests, not as decisions.
    assert!(proxy.counter("slidegate_bad_requests_total") >= 4 * 6);
}

#[tokio::test]
async fn spellings_of_one_identity_are_one_bucket_on_the_memory_store() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start("backend = \"memory\"", &up, &ca);
    exercise(&proxy, &ca).await;
}

#[tokio::test]
async fn spellings_of_one_identity_are_one_bucket_on_the_redis_store() {
    let redis = RedisServer::start();
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&redis.store_toml(), &up, &ca);
    exercise(&proxy, &ca).await;
}
