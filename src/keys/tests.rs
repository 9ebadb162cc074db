//! Key texts, bucket keys and admin queries.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, Method};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A key as the config's `key` gives it (`config/validate/key.rs`): `global`, one part, or a
/// list of parts (written here as JSON, which is also how TOML writes it).
fn parse_spec(text: &str) -> Result<KeySpec, KeySpecError> {
    if text == "global" {
        return Ok(KeySpec::Global);
    }
    if text.starts_with('[') {
        let list: Vec<String> = serde_json::from_str(text).expect("a list of strings");
        let parts = list.iter().map(|p| p.parse()).collect::<Result<_, _>>()?;
        return KeySpec::from_parts(parts);
    }
    text.parse().map(KeySpec::One)
}

fn spec(text: &str) -> KeySpec {
    parse_spec(text).unwrap()
}

fn key_of(spec: &KeySpec, req: &KeyInput<'_>) -> String {
    let mut out = String::from("left over");
    spec.write_request_key(&mut out, "api", req).unwrap();
    out
}

fn query_key(spec: &KeySpec, client: &str) -> Result<String, ClientQueryError> {
    let mut out = String::new();
    spec.write_query_key(&mut out, "api", client, |ip| ip)
        .map(|()| out)
}

#[test]
fn only_a_repeated_key_header_repeats() {
    let mut h = HeaderMap::new();
    h.append("x-api-key", "a".parse().unwrap());
    h.append("x-other", "1".parse().unwrap());
    h.append("x-other", "2".parse().unwrap());
    h.append("cookie", "a=1".parse().unwrap());
    h.append("cookie", "b=2".parse().unwrap());
    let repeats = |spec: &KeySpec, h: &HeaderMap| {
        let mut out = String::new();
        let req = KeyInput::headers(h, ip("127.0.0.1"));
        spec.write_request_key(&mut out, "api", &req).is_err()
    };
    let key = spec("header:X-Api-Key");
    assert!(!repeats(&key, &h));
    assert!(!repeats(&spec("client_ip"), &h));
    assert!(!repeats(&spec("cookie:a"), &h));
    assert!(!repeats(&spec("header:x-other"), &HeaderMap::new()));
    assert!(repeats(&spec("header:x-other"), &h));
    assert!(repeats(&spec(r#"["client_ip", "header:x-other"]"#), &h));
    h.append("x-api-key", "b".parse().unwrap());
    assert!(repeats(&key, &h));
}

#[test]
fn long_values_are_hashed_and_bounded() {
    let key = spec("header:x-api-key");
    let mut h = HeaderMap::new();
    h.insert("x-api-key", "a".repeat(10_000).parse().unwrap());
    let out = key_of(&key, &KeyInput::headers(&h, ip("127.0.0.1")));
    assert!(
        out.starts_with("api:h.x-api-key:#") && out.len() == "api:h.x-api-key:#".len() + 32,
        "{out}"
    );
    h.insert("x-api-key", "{tag}".parse().unwrap());
    let out = key_of(&key, &KeyInput::headers(&h, ip("127.0.0.1")));
    assert!(!out.contains('{'), "{out}");
    // A composite of long values: hashed as a whole, the same bound.
    let both = spec(r#"["header:x-api-key", "client_ip", "path"]"#);
    h.insert("x-api-key", "b".repeat(10_000).parse().unwrap());
    let out = key_of(&both, &KeyInput::headers(&h, ip("2001:db8::1")));
    assert!(
        out.starts_with("api:k:#") && out.len() == "api:k:#".len() + 32,
        "{out}"
    );
}

#[test]
fn key_text_round_trips_and_header_names_are_lower_cased() {
    for text in [
        "client_ip",
        "global",
        "header:x-api-key",
        "query:page",
        "cookie:session",
        "method",
        "path",
        r#"["header:x-api-key", "client_ip"]"#,
        r#"["method", "path", "cookie:Sid", "query:a b"]"#,
    ] {
        assert_eq!(spec(text).to_string(), text);
    }
    assert_eq!(spec("header:X-Api-Key").to_string(), "header:x-api-key");
    // One part in a list is that part alone: the same bucket as the plain text.
    assert_eq!(spec(r#"["client_ip"]"#), KeySpec::One(Part::ClientIp));
    for (text, want) in [
        ("nope", KeySpecError::Unknown("nope".into())),
        (
            "header:X Api Key",
            KeySpecError::HeaderName("X Api Key".into()),
        ),
        ("cookie:a;b", KeySpecError::CookieName("a;b".into())),
        ("query:", KeySpecError::EmptyName("query:".into())),
        ("[]", KeySpecError::Empty),
        (r#"["global", "client_ip"]"#, KeySpecError::GlobalInList),
        (
            r#"["method", "method"]"#,
            KeySpecError::Duplicate("method".into()),
        ),
        (
            r#"["header:A", "header:a"]"#,
            KeySpecError::Duplicate("header:a".into()),
        ),
    ] {
        assert_eq!(parse_spec(text), Err(want), "{text}");
    }
    let nine = format!("[{}]", ["\"method\""; 9].join(","));
    assert_eq!(parse_spec(&nine), Err(KeySpecError::TooMany(9)));
}

#[test]
fn key_json_names_the_kind() {
    let json = |text: &str| serde_json::to_string(&spec(text)).unwrap();
    assert_eq!(json("client_ip"), r#"{"kind":"client_ip"}"#);
    assert_eq!(json("global"), r#"{"kind":"global"}"#);
    assert_eq!(
        json("header:X-Api-Key"),
        r#"{"kind":"header","name":"x-api-key"}"#
    );
    assert_eq!(json("query:page"), r#"{"kind":"query","name":"page"}"#);
    assert_eq!(json("method"), r#"{"kind":"method"}"#);
    assert_eq!(
        json(r#"["cookie:sid", "path"]"#),
        r#"{"kind":"composite","parts":[{"kind":"cookie","name":"sid"},{"kind":"path"}]}"#
    );
}

#[test]
fn each_part_reads_its_value() {
    let mut h = HeaderMap::new();
    h.insert("x-api-key", "k1".parse().unwrap());
    // HTTP/2 may split cookies over several fields; the name's one value, however spelled.
    h.append("cookie", "theme=dark; sid=s1".parse().unwrap());
    h.append("cookie", "sid=\"s%31\"".parse().unwrap());
    let req = KeyInput {
        headers: &h,
        query: Some("page=2&who=a%62+c&who=ab%20c&empty="),
        method: &Method::POST,
        path: "/login",
        ip: ip("192.0.2.7"),
    };
    for (text, want) in [
        ("client_ip", "api:ip:192.0.2.7"),
        ("header:x-api-key", "api:h.x-api-key:k1"),
        ("query:who", "api:q.who:#"), // "ab c": a space is not plain
        ("query:page", "api:q.page:2"),
        ("cookie:sid", "api:c.sid:s1"),
        ("cookie:theme", "api:c.theme:dark"),
        ("method", "api:m:POST"),
        ("path", "api:p:/login"),
        ("global", "api:global"),
        (
            r#"["header:x-api-key", "client_ip"]"#,
            "api:k:h.x-api-key=k1,ip=192.0.2.7",
        ),
        (
            r#"["method", "path", "query:page"]"#,
            "api:k:m=POST,p=/login,q.page=2",
        ),
        // Missing or empty: the client address, in its place.
        ("query:empty", "api:q.empty:ip:192.0.2.7"),
        ("query:absent", "api:q.absent:ip:192.0.2.7"),
        ("cookie:absent", "api:c.absent:ip:192.0.2.7"),
        ("header:x-absent", "api:h.x-absent:ip:192.0.2.7"),
        (
            r#"["header:x-absent", "method"]"#,
            "api:k:h.x-absent=ip:192.0.2.7,m=POST",
        ),
    ] {
        let got = key_of(&spec(text), &req);
        assert!(got.starts_with(want), "{text}: {got}");
    }
    // Decoded: `a%62+c` is `ab c`, the same client as a request that sent it another way.
    let other = KeyInput {
        query: Some("who=ab%20c"),
        ..req
    };
    assert_eq!(
        key_of(&spec("query:who"), &req),
        key_of(&spec("query:who"), &other)
    );
}

#[test]
fn composite_parts_cannot_be_confused() {
    let h = HeaderMap::new();
    let req = KeyInput::headers(&h, ip("192.0.2.7"));
    let mut with_value = HeaderMap::new();
    with_value.insert("x-k", "192.0.2.7".parse().unwrap());
    let sent = KeyInput::headers(&with_value, ip("192.0.2.7"));
    let both = spec(r#"["header:x-k", "client_ip"]"#);
    // A header whose value is the address is not the missing header.
    assert_ne!(key_of(&both, &req), key_of(&both, &sent));
    // Hashed inputs are length-prefixed: ("ab", "c") and ("a", "bc") differ.
    let long = |a: &str, b: &str| {
        let mut h = HeaderMap::new();
        h.insert("x-a", format!("{a}{}", "#".repeat(70)).parse().unwrap());
        h.insert("x-b", b.parse().unwrap());
        let pair = spec(r#"["header:x-a", "header:x-b"]"#);
        key_of(&pair, &KeyInput::headers(&h, ip("192.0.2.7")))
    };
    assert_ne!(long("ab", "c"), long("a", "bc"));
    assert_eq!(long("ab", "c"), long("ab", "c"));
}

#[test]
fn admin_queries_name_the_bucket_the_proxy_counts() {
    let mut h = HeaderMap::new();
    h.insert("x-api-key", "k1".parse().unwrap());
    let req = KeyInput {
        headers: &h,
        query: Some("page=2"),
        method: &Method::GET,
        path: "/a/b",
        ip: ip("192.0.2.7"),
    };
    for (text, client) in [
        ("global", ""),
        ("client_ip", " 192.0.2.7 "),
        ("header:x-api-key", "k1"),
        ("query:page", "2"),
        ("method", "GET"),
        ("path", "/a/./x/../b"),
        (
            r#"["header:x-api-key", "client_ip"]"#,
            r#"["k1", "192.0.2.7"]"#,
        ),
        (
            r#"["header:x-absent", "path"]"#,
            r#"[{"ip": "192.0.2.7"}, "/a/b"]"#,
        ),
    ] {
        let key = spec(text);
        assert_eq!(
            query_key(&key, client).unwrap(),
            key_of(&key, &req),
            "{text}"
        );
    }
    let header = spec("header:x-api-key");
    assert_eq!(
        query_key(&spec("global"), "x"),
        Err(ClientQueryError::NotEmpty)
    );
    assert_eq!(
        query_key(&spec("client_ip"), "nope"),
        Err(ClientQueryError::NotAnIp)
    );
    assert!(matches!(
        query_key(&header, ""),
        Err(ClientQueryError::NoValue(_))
    ));
    let both = spec(r#"["header:x-api-key", "client_ip"]"#);
    for bad in ["k1", r#"["k1"]"#, r#"["k1", "x", "y"]"#] {
        assert!(
            matches!(query_key(&both, bad), Err(ClientQueryError::NotAList(_))),
            "{bad}"
        );
    }
    for bad in [
        r#"["k1", "nope"]"#,
        r#"["k1", {"ip": "192.0.2.7"}]"#,
        r#"[{"ip": "x"}, "192.0.2.7"]"#,
    ] {
        assert!(
            matches!(query_key(&both, bad), Err(ClientQueryError::Entry { .. })),
            "{bad}"
        );
    }
}

#[test]
fn prefixes_apply_to_queried_addresses() {
    let mut out = String::new();
    let net = |_: IpAddr| ip("192.0.2.0");
    spec(r#"["method", "client_ip"]"#)
        .write_query_key(&mut out, "r", r#"["GET", "192.0.2.77"]"#, net)
        .unwrap();
    assert_eq!(out, "r:k:m=GET,ip=192.0.2.0");
}

/// Issue 52 row 1: a bucket names which part it read, so two keys that differ only by the
/// field they read never share a bucket, whatever the values; the same spec always does.
#[test]
fn different_fields_never_share_a_bucket() {
    let mut h = HeaderMap::new();
    for name in ["x-user", "x-org", "x-tenant", "authorization"] {
        h.insert(HeaderName::from_static(name), "42".parse().unwrap());
    }
    h.insert("cookie", "uid=42; org=42".parse().unwrap());
    let req = KeyInput {
        headers: &h,
        query: Some("user=42&org=42&a%3Db=42&x=ip:1.2.3.4"),
        method: &Method::GET,
        path: "/",
        ip: ip("1.2.3.4"),
    };
    let long = format!("query:{}", "n".repeat(100));
    let specs = [
        "client_ip",
        "header:x-user",
        "header:x-org",
        "header:x-tenant",
        "header:x-absent",
        "header:x-other-absent",
        "query:user",
        "query:org",
        "query:absent",
        "query:x",
        "cookie:uid",
        "cookie:org",
        "cookie:absent",
        long.as_str(),
        r#"["header:x-user", "method"]"#,
        r#"["header:x-org", "method"]"#,
        r#"["header:x-absent", "method"]"#,
        r#"["header:x-other-absent", "method"]"#,
        r#"["client_ip", "method"]"#,
        r#"["method", "header:x-user"]"#,
    ];
    let keys: Vec<String> = specs.iter().map(|s| key_of(&spec(s), &req)).collect();
    for (i, a) in keys.iter().enumerate() {
        for (j, b) in keys.iter().enumerate().skip(i + 1) {
            assert_ne!(a, b, "{} and {} share a bucket", specs[i], specs[j]);
        }
        // The same spec, read again: the same bucket.
        assert_eq!(a, &key_of(&spec(specs[i]), &req), "{}", specs[i]);
        assert!(!a.contains(['{', '}']), "{a}");
    }
    // Hashed composites keep the parts apart too: long values force the hash.
    let mut long_h = HeaderMap::new();
    long_h.insert("x-user", "v".repeat(200).parse().unwrap());
    long_h.insert("x-org", "v".repeat(200).parse().unwrap());
    let req = KeyInput::headers(&long_h, ip("1.2.3.4"));
    let user = key_of(&spec(r#"["header:x-user", "client_ip"]"#), &req);
    let org = key_of(&spec(r#"["header:x-org", "client_ip"]"#), &req);
    assert!(
        user.starts_with("api:k:#") && org.starts_with("api:k:#"),
        "{user}"
    );
    assert_ne!(user, org);
}
