//! Unit tests of the forwarding headers.

use super::*;

fn hop(peer: &str, trusted: bool, scheme: Scheme) -> Hop {
    let peer: IpAddr = peer.parse().unwrap();
    Hop {
        peer,
        client: peer,
        peer_trusted: trusted,
        scheme,
    }
}

fn request(headers: &[(&str, &str)]) -> RequestHeader {
    let mut req = RequestHeader::build("GET", b"/", None).unwrap();
    for (k, v) in headers {
        req.append_header(k.to_string(), *v).unwrap();
    }
    req
}

/// `apply` with and without the connection's kept values, which must agree on every
/// header and its case on the wire; the result of the first.
fn apply(req: &mut RequestHeader, hop: &Hop) -> Result<()> {
    let mut again = req.clone();
    super::apply(req, hop, None, ForwardedHeaders::all())?;
    let own = OwnHop::new(hop.peer, hop.scheme)?;
    super::apply(&mut again, hop, Some(&own), ForwardedHeaders::all())?;
    let mut wire = (Vec::new(), Vec::new());
    req.header_to_h1_wire(&mut wire.0);
    again.header_to_h1_wire(&mut wire.1);
    assert_eq!(wire.0, wire.1);
    // Values kept for another peer are not used.
    let mut other = req.clone();
    let stranger = OwnHop::new("192.0.2.99".parse().unwrap(), hop.scheme)?;
    super::apply(&mut other, hop, Some(&stranger), ForwardedHeaders::all())?;
    let mut after = req.clone();
    super::apply(&mut after, hop, None, ForwardedHeaders::all())?;
    let mut wire = (Vec::new(), Vec::new());
    other.header_to_h1_wire(&mut wire.0);
    after.header_to_h1_wire(&mut wire.1);
    assert_eq!(wire.0, wire.1);
    Ok(())
}

fn get<'a>(req: &'a RequestHeader, name: &str) -> Vec<&'a str> {
    req.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

#[test]
fn untrusted_peer_cannot_set_scheme_or_real_ip() {
    let mut req = request(&[
        ("X-Forwarded-Proto", "https"),
        ("X-Real-IP", "6.6.6.6"),
        ("Forwarded", "for=6.6.6.6;proto=https"),
    ]);
    apply(&mut req, &hop("203.0.113.7", false, Scheme::Http)).unwrap();
    assert_eq!(get(&req, "x-forwarded-proto"), ["http"]);
    assert_eq!(get(&req, "x-real-ip"), ["203.0.113.7"]);
    assert_eq!(get(&req, "forwarded"), ["for=203.0.113.7;proto=http"]);
    assert_eq!(get(&req, "x-forwarded-for"), ["203.0.113.7"]);
}

/// The URL-rebuilding headers of the table, with a client's values.
const URL_HEADERS: [(&str, &str); 7] = [
    ("X-Forwarded-Host", "evil.example"),
    ("X-Forwarded-Port", "443"),
    ("X-Forwarded-Prefix", "/evil"),
    ("X-Forwarded-Ssl", "on"),
    ("X-Original-URL", "/admin"),
    ("X-Rewrite-URL", "/admin"),
    ("X-Forwarded-Host", "second.example"),
];

#[test]
fn untrusted_peer_cannot_rebuild_the_url() {
    let mut req = request(&URL_HEADERS);
    apply(&mut req, &hop("203.0.113.7", false, Scheme::Http)).unwrap();
    for (name, _) in URL_HEADERS {
        assert!(get(&req, name).is_empty(), "{name} was passed on");
    }
}

#[test]
fn untrusted_peer_cannot_rebuild_the_url_with_any_one_of_them() {
    for (name, value) in URL_HEADERS {
        let mut req = request(&[("Accept", "*/*"), (name, value), ("User-Agent", "t")]);
        apply(&mut req, &hop("203.0.113.7", false, Scheme::Http)).unwrap();
        assert!(get(&req, name).is_empty(), "{name} alone was passed on");
        assert_eq!(get(&req, "accept"), ["*/*"]);
    }
}

#[test]
fn headers_outside_the_set_are_removed_not_passed_on() {
    let forged = [
        ("X-Forwarded-For", "6.6.6.6"),
        ("X-Forwarded-Proto", "https"),
        ("X-Real-IP", "6.6.6.6"),
        ("Forwarded", "for=6.6.6.6"),
    ];
    let only_xff = ForwardedHeaders::NONE.with(XForwardedFor);
    let mut req = request(&forged);
    let h = hop("203.0.113.7", false, Scheme::Http);
    super::apply(&mut req, &h, None, only_xff).unwrap();
    assert_eq!(get(&req, "x-forwarded-for"), ["6.6.6.6, 203.0.113.7"]);
    for name in ["x-forwarded-proto", "x-real-ip", "forwarded"] {
        assert!(get(&req, name).is_empty(), "{name} was passed on");
    }
    let mut req = request(&forged);
    super::apply(&mut req, &h, None, ForwardedHeaders::NONE).unwrap();
    for (name, _) in forged {
        assert!(get(&req, name).is_empty(), "{name} was passed on");
    }
    // A trusted proxy's scheme is kept only while the header is in the set.
    let trusted = hop("10.0.0.1", true, Scheme::Http);
    let mut req = request(&forged);
    super::apply(&mut req, &trusted, None, only_xff.with(XForwardedProto)).unwrap();
    assert_eq!(get(&req, "x-forwarded-proto"), ["https"]);
}

#[test]
fn trusted_peer_keeps_url_headers() {
    let mut req = request(&URL_HEADERS);
    apply(&mut req, &hop("10.0.0.1", true, Scheme::Http)).unwrap();
    assert_eq!(
        get(&req, "x-forwarded-host"),
        ["evil.example", "second.example"]
    );
    assert_eq!(get(&req, "x-forwarded-prefix"), ["/evil"]);
    assert_eq!(get(&req, "x-original-url"), ["/admin"]);
}

#[test]
fn trusted_peer_keeps_scheme_and_forwarded_chain() {
    let mut req = request(&[
        ("X-Forwarded-Proto", "https"),
        ("Forwarded", "for=198.51.100.1;proto=https"),
    ]);
    apply(&mut req, &hop("::1", true, Scheme::Http)).unwrap();
    assert_eq!(get(&req, "x-forwarded-proto"), ["https"]);
    assert_eq!(
        get(&req, "forwarded"),
        ["for=198.51.100.1;proto=https, for=\"[::1]\";proto=http"]
    );
}

#[test]
fn trusted_peer_with_odd_scheme_gets_ours() {
    for bad in [
        &[("X-Forwarded-Proto", "javascript")][..],
        &[
            ("X-Forwarded-Proto", "http"),
            ("X-Forwarded-Proto", "https"),
        ],
    ] {
        let mut req = request(bad);
        apply(&mut req, &hop("10.0.0.1", true, Scheme::Https)).unwrap();
        assert_eq!(get(&req, "x-forwarded-proto"), ["https"], "{bad:?}");
    }
}

#[test]
fn lists_are_extended_and_client_is_real_ip() {
    let mut req = request(&[
        ("X-Forwarded-For", "6.6.6.6"),
        ("X-Forwarded-For", "203.0.113.9"),
        ("Forwarded", "for=6.6.6.6"),
    ]);
    let mut hop = hop("10.0.0.1", true, Scheme::Https);
    hop.client = "203.0.113.9".parse().unwrap();
    apply(&mut req, &hop).unwrap();
    assert_eq!(
        get(&req, "x-forwarded-for"),
        ["6.6.6.6, 203.0.113.9, 10.0.0.1"]
    );
    assert_eq!(get(&req, "x-real-ip"), ["203.0.113.9"]);
    assert_eq!(
        get(&req, "forwarded"),
        ["for=6.6.6.6, for=10.0.0.1;proto=https"]
    );
}
