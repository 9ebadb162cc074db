//! Composite and richer keys (issue 21 item 1), through the real binary on the memory and Redis
//! stores, each over HTTP/1.1, h2c, and HTTP/1.1 and HTTP/2 over TLS: for every part alone
//! (`header:`, `query:`, `cookie:`, `method`, `path`) and for composites, two values get two
//! buckets, one value (however it is spelled) one bucket, and a missing part falls back to the
//! client address; the admin inspector names the bucket the proxy counted. Under an h2 burst
//! a composite route admits exactly its limit. (Config errors and key costs: `route_keys_checks.rs`.)

use crate::common;

use common::admin::{admin, window};
use common::load::{h2load, Burst};
use common::proxy::{ConfigBuilder, Proxy, ProxyOptions};
use common::redis::RedisServer;
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

const ONE: &str = r#"limits = [{ requests = 1, window = "1m" }]"#;

/// The routes under test, each 1 request per minute, with the key each one has.
const ROUTES: [(&str, &str); 8] = [
    ("hdr", r#""header:X-K""#),
    ("qry", r#""query:k""#),
    ("ck", r#""cookie:sid""#),
    ("mth", r#""method""#),
    ("pth", r#""path""#),
    ("pair", r#"["header:X-K", "client_ip"]"#),
    ("mix", r#"["query:k", "cookie:sid", "method"]"#),
    ("verbpath", r#"["method", "path"]"#),
];

fn start(store_lines: &str, up: &Upstream, ca: &TestCa) -> Proxy {
    let mut config = ConfigBuilder::new()
        .store(store_lines)
        .trusted_proxies(&["127.0.0.1/32"])
        .upstream("app", up.addr());
    for (name, key) in ROUTES {
        config = config.route(
            name,
            &format!("path_prefix = \"/{name}\"\nkey = {key}\n{ONE}"),
        );
    }
    let proxy = Proxy::start_with(&config.build(), tls_options(ca, "h2c = true"));
    // Exactness is the store's: decide nothing before it answers (a busy machine may take a
    // while to connect, and until then `on_error` decides).
    common::admin::wait_readyz(&proxy, 200, std::time::Duration::from_secs(10));
    proxy
}

/// One request's status: `method` on `path` with `headers`.
struct Client {
    http: reqwest::Client,
    base: String,
    version: reqwest::Version,
}

impl Client {
    fn new(proxy: &Proxy, ca: &TestCa, protocol: Protocol) -> Client {
        let base = common::fetch::url(proxy, protocol, "");
        Client {
            http: protocol.client(&ca.ca_pem()),
            base,
            version: protocol.version(),
        }
    }

    async fn status(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url);
        // Appended, not replaced: two `cookie` fields stay two (as HTTP/2 clients send them).
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("{url}: {e:?}"));
        assert_eq!(resp.version(), self.version, "{url}");
        resp.status().as_u16()
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> u16 {
        self.status("GET", path, headers).await
    }
}

/// Asserts `statuses` came back, in order, naming the case.
fn expect(case: &str, got: Vec<u16>, want: &[u16]) {
    assert_eq!(got, want, "{case}");
}

/// Every single part: value A twice (200, 429), value B (200), A spelled otherwise (429), and
/// the part missing from address X twice (200, 429) then from address Y (200).
async fn single_parts(c: &Client, p: usize) {
    let (x, y) = (format!("203.0.113.{p}"), format!("198.51.100.{p}"));
    let xff = |ip: &str| ("x-forwarded-for", ip.to_string());
    let (a, b) = (format!("a{p}"), format!("b{p}"));
    let mut got = Vec::new();
    for v in [&a, &a, &b] {
        got.push(c.get("/hdr", &[("x-k", v)]).await);
    }
    for ip in [&x, &x, &y] {
        got.push(c.get("/hdr", &[(xff(ip).0, &xff(ip).1)]).await);
    }
    expect("header", got, &[200, 429, 200, 200, 429, 200]);

    // Query values are decoded: `a%31` is `a1`; a missing or empty one is the address.
    let spelled = format!("/qry?k={}", a.replace(&p.to_string(), &format!("%3{p}")));
    let mut got = Vec::new();
    for path in [
        format!("/qry?k={a}"),
        spelled,
        // The same value twice is one value (twice with different values: 400,
        // `key_spellings.rs`).
        format!("/qry?x=1&k={b}&k=%22{b}%22"),
    ] {
        got.push(c.get(&path, &[]).await);
    }
    for (path, ip) in [("/qry?k=", &x), ("/qry", &x), ("/qry?k=", &y)] {
        got.push(c.get(path, &[(xff(ip).0, &xff(ip).1)]).await);
    }
    expect("query", got, &[200, 429, 200, 200, 429, 200]);

    // Cookies: one value of the name over every field, however the fields are split.
    let (one, split) = (format!("theme=x; sid={a}"), format!("sid={a}"));
    let mut got = vec![c.get("/ck", &[("cookie", &one)]).await];
    got.push(
        c.get("/ck", &[("cookie", "theme=y"), ("cookie", &split)])
            .await,
    );
    got.push(
        c.get("/ck", &[("cookie", &format!("sid={b}; sid=\"{b}\""))])
            .await,
    );
    for (cookie, ip) in [("theme=x", &x), ("sid=", &x), ("theme=x", &y)] {
        got.push(
            c.get("/ck", &[("cookie", cookie), (xff(ip).0, &xff(ip).1)])
                .await,
        );
    }
    expect("cookie", got, &[200, 429, 200, 200, 429, 200]);

    // The normalised path the routes matched: `/pth//N/%61` is `/pth/N/a`. (The client
    // resolves `.` and `..` segments itself; empty segments and escapes reach the proxy.)
    let mut got = Vec::new();
    for path in [
        format!("/pth/{p}/a"),
        format!("/pth//{p}/%61"),
        format!("/pth/{p}/b"),
    ] {
        got.push(c.get(&path, &[]).await);
    }
    got.push(c.get(&format!("/pth/{p}//a?q=1"), &[]).await);
    expect("path", got, &[200, 429, 200, 429]);
}

/// The method alone has few values: its buckets are reset through the admin API first, which
/// must name the ones the proxy counts.
async fn method_part(proxy: &Proxy, c: &Client) {
    for m in ["GET", "POST"] {
        let reply = admin(
            proxy,
            "POST",
            &format!("/api/v1/reset?route=mth&client={m}"),
            &[],
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let mut got = Vec::new();
    for m in ["GET", "GET", "POST", "POST"] {
        got.push(c.status(m, "/mth", &[]).await);
    }
    expect("method", got, &[200, 429, 200, 429]);
    let w = window(proxy, "mth", "POST").await;
    assert_eq!(w["limits"][0]["count"], 1, "{w}");
}

/// Composites: one bucket per combination; a missing part is the client address in its place,
/// so omitting it neither escapes the limit nor pools clients together.
async fn composites(proxy: &Proxy, c: &Client, p: usize) {
    let (x, y) = (format!("203.0.113.{p}"), format!("198.51.100.{p}"));
    let (a, b) = (format!("a{p}"), format!("b{p}"));
    let mut got = Vec::new();
    for (k, ip) in [(&a, &x), (&a, &x), (&b, &x), (&a, &y)] {
        got.push(c.get("/pair", &[("x-k", k), ("x-forwarded-for", ip)]).await);
    }
    for ip in [&x, &x, &y] {
        got.push(c.get("/pair", &[("x-forwarded-for", ip)]).await);
    }
    expect(
        "header + client_ip",
        got,
        &[200, 429, 200, 200, 200, 429, 200],
    );
    // The inspector names the same buckets, the fallback as {"ip": …}.
    for client in [
        format!(r#"["{a}", "{x}"]"#),
        format!(r#"[{{"ip": "{x}"}}, "{x}"]"#),
    ] {
        let w = window(proxy, "pair", &client).await;
        assert_eq!(w["limits"][0]["remaining"], 0, "{client}: {w}");
    }
    let w = window(proxy, "pair", &format!(r#"["{b}", "{y}"]"#)).await;
    assert_eq!(w["limits"][0]["count"], 0, "{w}");

    let sid = format!("sid={a}");
    let mut got = Vec::new();
    for (m, k, ip) in [
        ("GET", &a, &x),
        ("GET", &a, &y),
        ("POST", &a, &x),
        ("GET", &b, &x),
    ] {
        got.push(
            c.status(
                m,
                &format!("/mix?k={k}"),
                &[("cookie", &sid), ("x-forwarded-for", ip)],
            )
            .await,
        );
    }
    // No cookie, from X then Y: the cookie part is each one's address.
    for ip in [&x, &x, &y] {
        got.push(
            c.get(&format!("/mix?k={a}"), &[("x-forwarded-for", ip)])
                .await,
        );
    }
    expect(
        "query + cookie + method",
        got,
        &[200, 429, 200, 200, 200, 429, 200],
    );

    let mut got = Vec::new();
    for (m, path) in [
        ("GET", "/verbpath/{p}"),
        ("GET", "//verbpath//{p}"),
        ("POST", "/verbpath/{p}"),
    ] {
        got.push(c.status(m, &path.replace("{p}", &p.to_string()), &[]).await);
    }
    expect("method + path", got, &[200, 429, 200]);
}

async fn exercise(proxy: &Proxy, ca: &TestCa) {
    for (p, protocol) in Protocol::ALL.into_iter().enumerate() {
        let c = Client::new(proxy, ca, protocol);
        single_parts(&c, p).await;
        method_part(proxy, &c).await;
        composites(proxy, &c, p).await;
    }
    let n = Protocol::ALL.len() as u64;
    let counts: Vec<String> = ROUTES
        .iter()
        .map(|(r, _)| {
            format!(
                "{r} {}/{}",
                proxy.decisions(r, "allowed"),
                proxy.decisions(r, "denied")
            )
        })
        .collect();
    println!("allowed/denied over {n} protocols: {}", counts.join(", "));
    assert_eq!(proxy.decisions("pair", "allowed"), 5 * n);
    assert_eq!(proxy.decisions("pair", "denied"), 2 * n);
}

#[tokio::test]
async fn key_parts_and_composites_on_the_memory_store() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start("backend = \"memory\"", &up, &ca);
    exercise(&proxy, &ca).await;
}

#[tokio::test]
async fn key_parts_and_composites_on_the_redis_store() {
    let redis = RedisServer::start();
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&redis.store_toml(), &up, &ca);
    exercise(&proxy, &ca).await;
    // Bucket keys reach Redis bounded and without hash-tag braces, whatever was sent.
    let mut conn = redis.connection();
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(!keys.is_empty());
    // `<prefix>:{<bucket>}:<window>`: the bucket is the hash tag, so it holds no brace itself.
    for k in &keys {
        let braces = k.matches(['{', '}']).count();
        assert!(k.len() < 160 && braces == 2, "{k}");
    }
}

/// 100 h2c connections × 10 streams, 4000 requests, on one composite client (header, query,
/// cookie and address fixed): exactly the limit is admitted, on both stores.
#[tokio::test]
async fn a_composite_route_admits_exactly_its_limit_under_an_h2_burst() {
    const LIMIT: u64 = 50;
    let redis = RedisServer::start();
    for store in ["backend = \"memory\"".to_string(), redis.store_toml()] {
        let up = Upstream::start();
        let config = ConfigBuilder::new()
            .store(&store)
            .trusted_proxies(&["127.0.0.1/32"])
            .upstream("app", up.addr())
            .route(
                "combo",
                &format!(
                    "key = [\"header:X-K\", \"query:t\", \"cookie:sid\", \"client_ip\"]\n\
                     limits = [{{ requests = {LIMIT}, window = \"1m\" }}]"
                ),
            )
            .build();
        let h2c = ProxyOptions {
            server_extra: "h2c = true".into(),
            ..ProxyOptions::default()
        };
        let proxy = Proxy::start_with(&config, h2c);
        common::admin::wait_readyz(&proxy, 200, std::time::Duration::from_secs(10));
        let burst = Burst {
            path: "/x?t=tenant-1".into(),
            headers: vec![
                "X-K: key-1".into(),
                "Cookie: sid=s1".into(),
                "X-Forwarded-For: 192.0.2.9".into(),
            ],
            ..Burst::keyed(100, "unused")
        };
        let got = h2load(proxy.addr(), &burst);
        let total = burst.requests as u64;
        assert_eq!(
            (got.s2xx, got.s4xx, got.failed),
            (LIMIT, total - LIMIT, 0),
            "{store}: {got:?}"
        );
        assert_eq!(proxy.decisions("combo", "allowed"), LIMIT, "{store}");
        let client = r#"["key-1", "tenant-1", "s1", "192.0.2.9"]"#;
        let w = window(&proxy, "combo", client).await;
        assert_eq!(w["limits"][0]["count"], LIMIT, "{store}: {w}");
        println!(
            "{store}: composite burst 100 conns x 10 streams, {total} requests: admitted {}/{LIMIT}, \
             denied {}, max latency {:?}",
            got.s2xx, got.s4xx, got.max_latency
        );
    }
}
