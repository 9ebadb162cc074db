//! Property tests (proptest) over the code that reads untrusted text: the config loader (an
//! operator's file, reloaded while serving) and key extraction (client-controlled headers).
//! None of it may panic, whatever the input; what it returns must stay within its documented
//! bounds.
//!
//! The config cases never contain a host name in `upstreams.*.servers`: validation resolves
//! those, and tests must not send DNS queries off the machine. Server values are IP literals or
//! strings that fail before any lookup (no port, a bad port).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use http::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use slidegate::config::{Config, ConfigError, KeySpec};
use slidegate::keys::{ClientIpResolver, KeyInput, Part, MAX_PLAIN_KEY_LEN};
use slidegate::request::form::host_of;
use slidegate::routes::Rules;

/// Modest case counts keep this file to a few seconds in a debug build; no regression files
/// are written into the tree.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Config loader.

/// Server values that never make validation resolve a host name.
const SAFE_SERVERS: &[&str] = &[
    "127.0.0.1:1",
    "127.0.0.1:65535",
    "[::1]:8080",
    "127.0.0.1",
    "127.0.0.1:99999",
    "",
];

/// The only `servers` lines a case may contain, so no host name can reach `to_socket_addrs`.
fn dns_safe(text: &str) -> bool {
    text.lines().filter(|l| l.contains("servers")).all(|l| {
        let Some(list) = l
            .trim()
            .strip_prefix("servers = [")
            .and_then(|r| r.strip_suffix(']'))
        else {
            return false;
        };
        list.split(", ").filter(|s| !s.is_empty()).all(|s| {
            let Some(v) = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) else {
                return false;
            };
            !v.contains(['"', '\\'])
                && (v.parse::<std::net::SocketAddr>().is_ok() || SAFE_SERVERS.contains(&v))
        })
    })
}

/// Parse `text` as `fuzz.toml`; check the error's shape, and build the rules of a valid config
/// (what a reload does next).
fn load(text: &str) -> Result<(), TestCaseError> {
    prop_assume!(dns_safe(text));
    match Config::from_toml(Path::new("fuzz.toml"), text) {
        Ok(config) => {
            let _ = Rules::build(&config);
        }
        Err(e) => {
            let message = e.to_string();
            prop_assert!(message.starts_with("fuzz.toml"), "{message}");
            if let ConfigError::Invalid {
                line: Some(line), ..
            } = e
            {
                let lines = text.lines().count().max(1);
                prop_assert!(
                    line >= 1 && line <= lines + 1,
                    "line {line} of a {lines}-line text: {message}"
                );
            }
        }
    }
    Ok(())
}

/// A valid config, with its parts drawn at random.
fn valid_config() -> impl Strategy<Value = String> {
    let backend = prop_oneof![
        Just("backend = \"memory\"".to_string()),
        Just("backend = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"".to_string()),
        Just(
            "backend = \"redis_cluster\"\nurls = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]"
                .to_string()
        ),
    ];
    let limit = (
        1u32..1000,
        prop::sample::select(vec!["1ms", "250ms", "1s", "1m", "2h", "1day"]),
    );
    let route = (
        prop::sample::select(vec![
            "client_ip",
            "global",
            "header:X-Api-Key",
            "header:authorization",
        ]),
        prop::collection::vec(limit, 0..3),
        prop::option::of(prop::sample::select(vec![
            "example.com",
            "*.example.com",
            "API.Example.COM",
        ])),
        prop::option::of(prop::sample::select(vec!["GET", "post", "DELETE"])),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec!["allow", "deny"])),
    );
    (
        backend,
        prop::collection::vec(route, 0..4),
        prop::sample::select(vec!["1s", "500ms", "0s", "30s"]),
        prop::sample::select(vec!["[]", "[\"10.0.0.0/8\"]", "[\"10.0.0.0/8\", \"::1/128\"]"]),
    )
        .prop_map(|(backend, routes, grace, trusted)| {
            let mut out = format!(
                "[server]\nlisten = \"127.0.0.1:18080\"\nadmin_listen = \"127.0.0.1:19090\"\n\
                 threads = 2\ngrace_period = \"{grace}\"\n\n[store]\n{backend}\nprefix = \"sg\"\n\
                 timeout = \"50ms\"\non_error = \"allow\"\n\n[client_ip]\ntrusted_proxies = {trusted}\n\n\
                 [upstreams.app]\nservers = [\"127.0.0.1:3000\"]\n\n[upstreams.other]\n\
                 servers = [\"127.0.0.1:3001\", \"[::1]:3002\"]\n"
            );
            for (i, (key, limits, host, method, shadow, on_error)) in routes.into_iter().enumerate() {
                out.push_str(&format!(
                    "\n[[routes]]\nname = \"r{i}\"\npath_prefix = \"/p{i}\"\nupstream = \"app\"\n\
                     key = \"{key}\"\nshadow = {shadow}\n"
                ));
                if let Some(h) = host {
                    out.push_str(&format!("host = \"{h}\"\n"));
                }
                if let Some(m) = method {
                    out.push_str(&format!("methods = [\"{m}\"]\n"));
                }
                if let Some(o) = on_error {
                    out.push_str(&format!("on_error = \"{o}\"\n"));
                }
                let mut windows = std::collections::HashSet::new();
                let limits: Vec<String> = limits
                    .into_iter()
                    .filter(|(_, w)| windows.insert(*w))
                    .map(|(r, w)| format!("{{ requests = {r}, window = \"{w}\" }}"))
                    .collect();
                out.push_str(&format!("limits = [{}]\n", limits.join(", ")));
            }
            out
        })
}

/// Odd values to put on the right of a `=`.
const ODD_VALUES: &[&str] = &[
    "\"\"",
    "0",
    "-1",
    "4294967296",
    "18446744073709551616",
    "1e400",
    "nan",
    "-inf",
    "true",
    "[]",
    "{}",
    "[[]]",
    "\"0ms\"",
    "\"1.5ms\"",
    "\"1us\"",
    "\"999999999999999999d\"",
    "\"18446744073709551615s\"",
    "\"*.\"",
    "\"*\"",
    "\"*.*.x\"",
    "\"header:\"",
    "\"header:bad name\"",
    "\"header:\\u00e9\"",
    "\"\\ud800\"",
    "\"🦀\"",
    "\"10.0.0.0/33\"",
    "\"::1/200\"",
    "\"redis://\"",
    "\"rediss://u:p@[::1]:x/0\"",
    "\"unix:///tmp/x.sock\"",
    "\"{tag}\"",
    "\"a b\"",
    "1979-05-27T07:32:00Z",
    "\"\"\"multi\nline\"\"\"",
    "'''raw'''",
    "{ requests = 0, window = \"1s\" }",
    "[{ requests = 1, window = \"1s\" }, { requests = 2, window = \"1000ms\" }]",
];

/// Text to splice into a line.
const SPLICES: &[&str] = &[
    "[",
    "]",
    "{",
    "}",
    "=",
    "\"",
    "'",
    ",",
    ".",
    "\n",
    "\r\n",
    "\t",
    "#",
    "\\",
    "\\u",
    "[[",
    "routes",
    "server",
    "0",
    "é",
    "\u{0}",
    "\u{feff}",
    " = ",
    "x.y.z = 1",
];

#[derive(Debug, Clone)]
enum Mutation {
    DropLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    ReplaceValue(usize, usize),
    Splice(usize, usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::DropLine),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::ReplaceValue(a, b)),
        (any::<usize>(), any::<usize>(), any::<usize>())
            .prop_map(|(a, b, c)| Mutation::Splice(a, b, c)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

/// Apply `m` to `text`; lines naming `servers` are moved about but never edited.
fn apply(text: &str, m: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return String::new();
    }
    let n = lines.len();
    let editable = |l: &str| !l.contains("servers");
    match *m {
        Mutation::DropLine(i) => {
            lines.remove(i % n);
        }
        Mutation::DuplicateLine(i) => {
            let l = lines[i % n].clone();
            lines.insert(i % n, l);
        }
        Mutation::SwapLines(a, b) => lines.swap(a % n, b % n),
        Mutation::ReplaceValue(i, v) => {
            let l = &mut lines[i % n];
            if editable(l) {
                if let Some((key, _)) = l.split_once('=') {
                    *l = format!("{key}= {}", ODD_VALUES[v % ODD_VALUES.len()]);
                }
            }
        }
        Mutation::Splice(i, at, s) => {
            let l = &mut lines[i % n];
            if editable(l) {
                let mut at = at % (l.len() + 1);
                while !l.is_char_boundary(at) {
                    at -= 1;
                }
                l.insert_str(at, SPLICES[s % SPLICES.len()]);
            }
        }
        Mutation::Truncate(at) => {
            let mut joined = lines.join("\n");
            let mut at = at % (joined.len() + 1);
            while !joined.is_char_boundary(at) {
                at -= 1;
            }
            joined.truncate(at);
            return joined;
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

proptest! {
    #![proptest_config(config(1000))]

    /// Any text at all.
    #[test]
    fn config_loader_never_panics_on_arbitrary_text(text in any::<String>()) {
        load(&text)?;
    }

    /// Text made of TOML's own tokens, which gets much further into the parser.
    #[test]
    fn config_loader_never_panics_on_toml_token_soup(
        parts in prop::collection::vec(
            prop_oneof![
                prop::sample::select(vec![
                    "[server]", "[store]", "[client_ip]", "[upstreams.app]", "[[routes]]",
                    "listen", "admin_listen", "threads", "grace_period", "backend", "prefix",
                    "limits", "requests", "window", "name", "key", "\"127.0.0.1:80\"", "\"1s\"",
                    " = ", "\n", "[", "]", "{", "}", ",", "\"", "'", ".", "#", "1", "-0",
                    "true", "\"memory\"", "\"redis\"",
                ]).prop_map(str::to_string),
                "[ -~]{0,8}",
            ],
            0..60,
        )
    ) {
        load(&parts.concat())?;
    }
}

proptest! {
    #![proptest_config(config(2000))]

    /// A valid config with up to 4 mutations: dropped, duplicated and swapped lines, odd values,
    /// spliced tokens, truncation.
    #[test]
    fn config_loader_never_panics_on_near_valid_configs(
        base in valid_config(),
        mutations in prop::collection::vec(mutation(), 0..5),
    ) {
        let text = mutations.iter().fold(base, |t, m| apply(&t, m));
        load(&text)?;
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Unmutated, every generated config is valid (so the mutations start from valid ground).
    #[test]
    fn generated_base_configs_are_valid(base in valid_config()) {
        prop_assert!(dns_safe(&base));
        if let Err(e) = Config::from_toml(Path::new("fuzz.toml"), &base) {
            return Err(TestCaseError::fail(format!("{e}\n{base}")));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Key extraction.

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|o| IpAddr::V4(Ipv4Addr::from(o))),
        any::<[u16; 8]>().prop_map(|s| IpAddr::V6(Ipv6Addr::from(s))),
        // Addresses in the trusted nets below, so trusted walks happen often.
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| IpAddr::V4(Ipv4Addr::new(10, 0, a, b))),
        any::<u8>().prop_map(|a| IpAddr::V4(Ipv4Addr::new(127, 0, 0, a))),
        any::<[u8; 4]>().prop_map(|o| IpAddr::V6(Ipv4Addr::from(o).to_ipv6_mapped())),
    ]
}

fn net() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        Just("10.0.0.0/8".parse().unwrap()),
        Just("127.0.0.0/8".parse().unwrap()),
        Just("::/0".parse().unwrap()),
        (ip(), any::<u8>()).prop_map(|(addr, len)| {
            let max = if addr.is_ipv4() { 32 } else { 128 };
            IpNet::new(addr, len % (max + 1))
                .expect("valid prefix")
                .trunc()
        }),
    ]
}

/// Bytes a header value may hold: HTAB, visible ASCII and space, obs-text (what httparse lets
/// through to Pingora).
fn header_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(b"0123456789abcdef.:,[] ".to_vec()),
            1 => any::<u8>(),
        ],
        0..max,
    )
    .prop_map(|v| {
        v.into_iter()
            .filter(|&b| b == b'\t' || (0x20..0x7f).contains(&b) || b >= 0x80)
            .collect()
    })
}

/// One `X-Forwarded-For` line: hops written as real addresses (some with ports or brackets),
/// junk, or raw bytes.
fn xff_line() -> impl Strategy<Value = Vec<u8>> {
    let hop = prop_oneof![
        ip().prop_map(|ip| ip.to_string()),
        (ip(), any::<u16>()).prop_map(|(ip, port)| match ip {
            IpAddr::V4(v4) => format!("{v4}:{port}"),
            IpAddr::V6(v6) => format!("[{v6}]:{port}"),
        }),
        ip().prop_map(|ip| format!("[{ip}]")),
        Just("unknown".to_string()),
        Just(String::new()),
        "[ -~]{0,12}",
    ];
    prop_oneof![
        prop::collection::vec(hop, 1..6).prop_map(|hops| hops.join(", ").into_bytes()),
        header_bytes(200),
    ]
}

fn header_map(name: &'static str, values: &[Vec<u8>]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(
            name,
            HeaderValue::from_bytes(v).expect("valid header bytes"),
        );
    }
    h
}

/// Every address written in `values`, as [`ClientIpResolver`] could parse it (loosely: any
/// token that parses after trimming brackets and a port), an IPv4-mapped one as IPv4.
fn mentions(values: &[Vec<u8>], ip: IpAddr) -> bool {
    let is = |parsed: Option<IpAddr>| parsed.map(|p| p.to_canonical()) == Some(ip);
    values.iter().any(|v| {
        v.split(|b| *b == b',').any(|hop| {
            let Ok(s) = std::str::from_utf8(hop) else {
                return false;
            };
            let s = s.trim();
            is(s.parse().ok())
                || is(s
                    .strip_prefix('[')
                    .and_then(|r| r.split(']').next())
                    .and_then(|r| r.parse().ok()))
                || is(s.rsplit_once(':').and_then(|(h, _)| h.parse().ok()))
        })
    })
}

proptest! {
    #![proptest_config(config(2000))]

    /// Resolution never panics; an untrusted peer is the client whatever it sends; otherwise the
    /// client is the peer or an address actually written in `X-Forwarded-For`.
    #[test]
    fn client_ip_resolution_never_panics(
        trusted in prop::collection::vec(net(), 0..4),
        peer in ip(),
        lines in prop::collection::vec(xff_line(), 0..4),
    ) {
        let resolver = ClientIpResolver::new(trusted.clone());
        let headers = header_map("x-forwarded-for", &lines);
        let client = resolver.resolve(peer, &headers);
        // Issue 18: an IPv4-mapped peer (a dual-stack listener's IPv4 client) is its IPv4
        // address, for trust and as the client.
        let peer = peer.to_canonical();
        if !trusted.iter().any(|n| n.contains(&peer)) {
            prop_assert_eq!(client, peer);
        } else {
            prop_assert!(client == peer || mentions(&lines, client), "{} from {:?}", client, lines);
        }
        // Deterministic.
        prop_assert_eq!(resolver.resolve(peer, &headers), client);
    }

    /// Bucket keys never panic, stay bounded (route + `:h.x-api-key:` + at most
    /// MAX_PLAIN_KEY_LEN bytes; the hashed form is `#` + 32 hex, an address `ip:` + at most 39,
    /// and a missing header `h.x-api-key:ip:` + the address), are visible ASCII
    /// without `{` or `}` (Redis Cluster hash tags), and keep distinct values apart (values
    /// that differ only by surrounding whitespace are one: HTTP/1 parsing drops it).
    #[test]
    fn bucket_keys_are_bounded_and_tag_free(
        route in "[A-Za-z0-9._-]{1,40}",
        spec in prop_oneof![
            Just(KeySpec::One(Part::ClientIp)),
            Just(KeySpec::Global),
            Just(KeySpec::One(Part::Header(HeaderName::from_static("x-api-key")))),
            Just(
                KeySpec::from_parts(vec![
                    Part::Header(HeaderName::from_static("x-api-key")),
                    Part::ClientIp,
                    Part::Path,
                ])
                .unwrap()
            ),
        ],
        value in prop::option::of(prop_oneof![
            header_bytes(3000),
            "[A-Za-z0-9._~@=+/{}#-]{0,80}".prop_map(String::into_bytes),
        ]),
        other in header_bytes(100),
        client in ip(),
    ) {
        let headers = header_map("x-api-key", value.as_slice());
        let mut key = String::from("left over from the previous request");
        spec.write_request_key(&mut key, &route, &KeyInput::headers(&headers, client)).unwrap();
        prop_assert!(key.starts_with(&format!("{route}:")), "{}", key);
        prop_assert!(
            key.len() <= route.len() + ":h.x-api-key:".len() + MAX_PLAIN_KEY_LEN,
            "{} bytes: {}", key.len(), key
        );
        prop_assert!(key.bytes().all(|b| b.is_ascii_graphic()), "{:?}", key);
        prop_assert!(!key.contains(['{', '}']), "{}", key);

        let rest = &key[route.len() + 1..];
        match (&spec, &value) {
            (KeySpec::Global, _) => prop_assert_eq!(rest, "global"),
            (KeySpec::One(Part::ClientIp), _) => prop_assert_eq!(rest, format!("ip:{client}")),
            (KeySpec::One(_), Some(v)) if !v.trim_ascii().is_empty() => {
                prop_assert!(rest.starts_with("h.x-api-key:"), "{}", key);
                prop_assert!(rest.len() <= 12 + MAX_PLAIN_KEY_LEN.max(33), "{}", key);
                // Distinct values, distinct buckets.
                let ows = |b: &u8| *b == b' ' || *b == b'\t';
                let trim = |v: &[u8]| -> Vec<u8> {
                    let start = v.iter().position(|b| !ows(b)).unwrap_or(v.len());
                    let end = v.iter().rposition(|b| !ows(b)).map_or(start, |e| e + 1);
                    v[start..end].to_vec()
                };
                if trim(&other) != trim(v) && !trim(&other).is_empty() {
                    let mut k2 = String::new();
                    let h2 = header_map("x-api-key", std::slice::from_ref(&other));
                    spec.write_request_key(&mut k2, &route, &KeyInput::headers(&h2, client))
                        .unwrap();
                    prop_assert_ne!(&key, &k2);
                }
            }
            // Missing: the address, under the header's own tag.
            (KeySpec::One(_), _) => {
                prop_assert_eq!(rest, format!("h.x-api-key:ip:{client}"))
            }
            // A composite: `k:` and its text or hash, within the same bound (checked above).
            (KeySpec::Composite(_), _) => prop_assert!(rest.starts_with("k:"), "{}", key),
        }
    }

    /// The Host header is client-controlled too: the host routes match on (port and trailing
    /// dot stripped, lower-cased) never panics and is a part of what the client sent.
    #[test]
    fn host_of_never_panics(host in prop_oneof![any::<String>(), "[\\[\\]:a-z0-9.]{0,30}"]) {
        if let Some(h) = host_of(&host) {
            prop_assert!(host.to_ascii_lowercase().contains(&h), "{:?} -> {:?}", host, h);
        }
    }
}
