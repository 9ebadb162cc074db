//! Unit tests of `form.rs`.

use super::*;

fn req(method: &str, target: &str, headers: &[(&str, &str)]) -> RequestHeader {
    let mut r = RequestHeader::build(method, target.as_bytes(), None).unwrap();
    for (k, v) in headers {
        r.append_header(k.to_string(), *v).unwrap();
    }
    r
}

#[test]
fn a_request_without_a_host_goes_upstream_with_the_upstream_name() {
    let form = RequestForm::default();
    let mut bare = req("GET", "/", &[]);
    forward(&form, &mut bare, "app").unwrap();
    assert_eq!(bare.headers.get(HOST).unwrap(), "app");
    let mut named = req("GET", "/", &[("host", "example.com")]);
    forward(&form, &mut named, "app").unwrap();
    assert_eq!(named.headers.get(HOST).unwrap(), "example.com");
    // A table name that is no host name is not sent as one.
    let mut bare = req("GET", "/", &[]);
    forward(&form, &mut bare, "my app").unwrap();
    assert!(bare.headers.get(HOST).is_none());
}

#[test]
fn hosts() {
    for (value, want) in [
        ("Admin.Example.com", Some("admin.example.com")),
        ("admin.example.com.:8080", Some("admin.example.com")),
        ("admin.example.com:", Some("admin.example.com")),
        ("[::1]:80", Some("::1")),
        ("127.0.0.1", Some("127.0.0.1")),
        ("admin.example.com:abc", None),
        ("admin.example.com:80:80", None),
        ("a..b", None),
        ("", None),
        ("a/b", None),
        ("[::1", None),
        ("[zz]", None),
        ("a.", Some("a")),
        ("a..", None),
        (".a", None),
        (".", None),
        ("a.b.:1", Some("a.b")),
        (":80", None),
        ("a:8a", None),
        ("a b", None),
        ("é.com", None),
        ("[::1]x", None),
        ("[::1]:", Some("::1")),
    ] {
        assert_eq!(host_of(value).as_deref(), want, "{value:?}");
    }
}

#[test]
fn forms() {
    let ok = |r: &mut RequestHeader| parse(r).map(|f| f.host);
    assert_eq!(
        ok(&mut req("GET", "/x", &[("Host", "A.com")])),
        Ok(Some("a.com".into()))
    );
    assert_eq!(
        ok(&mut req("GET", "HTTP://ADMIN.Example.COM./x", &[])),
        Ok(Some("admin.example.com".into()))
    );
    assert_eq!(
        parse(&mut req("post", "/x", &[("Host", "a")])),
        Err(BadRequest::Method)
    );
    assert_eq!(
        parse(&mut req("GET", "login", &[("Host", "a")])),
        Err(BadRequest::Target)
    );
    assert_eq!(
        parse(&mut req("GET", "%2Flogin", &[("Host", "a")])),
        Err(BadRequest::Target)
    );
    assert_eq!(
        parse(&mut req("GET", "*", &[("Host", "a")])),
        Err(BadRequest::Target)
    );
    assert!(parse(&mut req("OPTIONS", "*", &[("Host", "a")])).is_ok());
    assert_eq!(
        parse(&mut req("GET", "/", &[])),
        Err(BadRequest::MissingHost)
    );
}

/// An HTTP/2 request as Pingora's h2 session builds it: the URI carries `:authority`.
fn h2(uri: &str, host: Option<&str>) -> RequestHeader {
    let mut b = http::Request::get(uri).version(Version::HTTP_2);
    if let Some(h) = host {
        b = b.header(HOST, h);
    }
    RequestHeader::from(b.body(()).unwrap().into_parts().0)
}

#[test]
fn padded_field_values_are_refused() {
    for value in [" k1", "k1\t", "\tk1", "k1 ", " "] {
        let mut r = h2("https://a.com/x", None);
        r.append_header("x-api-key", value).unwrap();
        assert_eq!(parse(&mut r), Err(BadRequest::FieldWhitespace), "{value:?}");
    }
    let mut r = h2("https://a.com/x", None);
    r.append_header("x-api-key", "k 1").unwrap();
    r.append_header("x-empty", "").unwrap();
    assert!(parse(&mut r).is_ok());
}

#[test]
fn h2_authority_is_the_host() {
    let host = |r: &mut RequestHeader| parse(r).map(|f| f.host);
    let want = Ok(Some("admin.example.com".to_string()));
    assert_eq!(host(&mut h2("https://Admin.Example.com/x", None)), want);
    assert_eq!(
        host(&mut h2(
            "https://admin.example.com:8443/x",
            Some("ADMIN.example.com:8443")
        )),
        want
    );
    assert_eq!(
        host(&mut h2(
            "https://admin.example.com/x",
            Some("other.example.com")
        )),
        Err(BadRequest::Host)
    );
    assert_eq!(
        host(&mut h2(
            "https://admin.example.com/x",
            Some("admin.example.com:8443")
        )),
        Err(BadRequest::Host)
    );
    // No authority and no Host: nothing to route on (HTTP/2 is not HTTP/1.1's 400 case).
    assert_eq!(host(&mut h2("/x", None)), Ok(None));
}

#[test]
fn content_length_lists_collapse() {
    let mut r = req("POST", "/", &[("Host", "a"), ("Content-Length", "5, 5")]);
    parse(&mut r).unwrap();
    let all: Vec<_> = r.headers.get_all(CONTENT_LENGTH).iter().collect();
    assert_eq!(all, ["5"]);
    let mut r = req(
        "POST",
        "/",
        &[
            ("Host", "a"),
            ("Content-Length", "5"),
            ("Content-Length", "5"),
        ],
    );
    parse(&mut r).unwrap();
    assert_eq!(r.headers.get_all(CONTENT_LENGTH).iter().count(), 1);
    for bad in ["5, 6", "5,", "5, x"] {
        let mut r = req("POST", "/", &[("Host", "a"), ("Content-Length", bad)]);
        assert_eq!(parse(&mut r), Err(BadRequest::ContentLength), "{bad}");
    }
}
