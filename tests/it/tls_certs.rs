//! Certificates chosen by SNI (`[[tls.certs]]`, default `server.tls_cert`) and
//! `server.tls_min_version`, through the real binary: which leaf HTTP/1.1-over-TLS and
//! HTTP/2-over-TLS clients see for exact, wildcard, listed, unknown and absent names; a TLS
//! 1.2-only client refused at "1.3" and accepted at "1.2"; a reload swapping a certificate and
//! the minimum version together, and a bad reload keeping the old ones; config errors by file,
//! line and key. Certificates are made at run time (tests/it/common/tls.rs).

use crate::common;

use common::admin::wait_reloads;

use std::net::SocketAddr;
use std::time::Duration;

use common::cli::check_config;
use common::config::assert_invalid;
use common::proxy::{ConfigBuilder, Proxy};
use common::tls::{
    handshake, san_dns_names, tls_options, Issued, Protocol, TestCa, TLS_12_ONLY, TLS_ANY,
};
use common::upstream::{Upstream, UPSTREAM_BODY};

/// One `[[tls.certs]]` entry; `names: None` leaves them to the certificate.
fn entry(issued: &Issued, names: Option<&[&str]>) -> String {
    let mut out = format!(
        "[[tls.certs]]\ncert = {:?}\nkey = {:?}\n",
        issued.cert, issued.key
    );
    if let Some(names) = names {
        out.push_str(&format!("names = {names:?}\n"));
    }
    out
}

/// GET `https://<host>:<port>/` over `protocol`, verifying the certificate against the test
/// CA and `host`: the status and the leaf the client saw.
async fn get_leaf(ca: &TestCa, protocol: Protocol, host: &str, tls: SocketAddr) -> (u16, Vec<u8>) {
    let client = protocol.client_resolving(&ca.ca_pem(), &[(host, tls)]);
    let url = format!("https://{host}:{}/", tls.port());
    let resp = client
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{protocol:?} {url}: {e:?}"));
    assert_eq!(resp.version(), protocol.version(), "{protocol:?} {url}");
    let leaf = resp
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .expect("TlsInfo with the peer certificate")
        .to_vec();
    let status = resp.status().as_u16();
    assert_eq!(resp.text().await.unwrap(), UPSTREAM_BODY, "{url}");
    (status, leaf)
}

/// Two entries by name (one exact, listed; one wildcard from its certificate's SAN) and the
/// default: over HTTP/1.1 and HTTP/2 over TLS each name gets its own leaf (verified by the
/// client against the name, and compared by SAN and DER); a name the certificate has but the
/// entry does not list, an unknown name and a client without SNI get the default.
#[tokio::test]
async fn sni_selects_exact_wildcard_and_default_certificates_over_h1_and_h2_tls() {
    let ca = TestCa::new("sni CA");
    let up = Upstream::start();
    let api = ca.issue("api", &["api.example.test", "unlisted.example.test"]);
    let apps = ca.issue("apps", &["*.apps.example.test"]);
    let opts = tls_options(&ca, "");
    let default_der = {
        use rustls::pki_types::pem::PemObject;
        let (cert, _) = opts.tls.as_ref().unwrap();
        let der = rustls::pki_types::CertificateDer::from_pem_file(cert).unwrap();
        der.to_vec()
    };
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("all", "")
        .raw(&entry(&api, Some(&["api.example.test"])))
        .raw(&entry(&apps, None))
        .build();
    let proxy = Proxy::start_with(&config, opts);
    let tls = proxy.tls_addr();
    for protocol in [Protocol::H1Tls, Protocol::H2Tls] {
        for (host, want, sans) in [
            (
                "api.example.test",
                &api.der,
                vec!["api.example.test", "unlisted.example.test"],
            ),
            (
                "web.apps.example.test",
                &apps.der,
                vec!["*.apps.example.test"],
            ),
            ("localhost", &default_der, vec!["localhost"]),
        ] {
            let (status, leaf) = get_leaf(&ca, protocol, host, tls).await;
            assert_eq!(status, 200, "{protocol:?} {host}");
            assert_eq!(san_dns_names(&leaf), sans, "{protocol:?} {host}");
            assert_eq!(
                &leaf, want,
                "{protocol:?} {host}: another certificate of that name"
            );
        }
    }
    // No verification here: the certificates are not valid for these names. A wildcard
    // covers subdomains at any depth (as nginx's server_name); the rest get the default.
    let deep = handshake(tls, Some("a.b.apps.example.test"), TLS_ANY).await;
    assert_eq!(deep.expect("handshake").leaf, apps.der);
    for sni in [
        Some("unlisted.example.test"),
        Some("nobody.example.test"),
        None,
    ] {
        let seen = handshake(tls, sni, TLS_ANY).await.expect("handshake");
        assert_eq!(seen.leaf, default_der, "SNI {sni:?} must get the default");
    }
    // Without SNI (by IP address) a verifying client gets the default, valid for 127.0.0.1.
    let client = Protocol::H2Tls.client(&ca.ca_pem());
    let resp = client
        .get(format!("https://{tls}/"))
        .send()
        .await
        .expect("request by IP address");
    assert_eq!(resp.status(), 200);
    assert_eq!(up.hits(), 2 * 3 + 1);
}

/// `tls_min_version = "1.3"` refuses a client that offers only TLS 1.2 (and serves TLS 1.3);
/// the default, "1.2", accepts it.
#[tokio::test]
async fn a_tls12_only_client_is_refused_at_min_13_and_accepted_at_12() {
    let ca = TestCa::new("version CA");
    let up = Upstream::start();
    let config = ConfigBuilder::unlimited(up.addr());
    let strict = Proxy::start_with(&config, tls_options(&ca, "tls_min_version = \"1.3\""));
    let refused = handshake(strict.tls_addr(), Some("localhost"), TLS_12_ONLY).await;
    assert!(refused.is_err(), "TLS 1.2 accepted at 1.3: {refused:?}");
    let modern = handshake(strict.tls_addr(), Some("localhost"), TLS_ANY).await;
    assert_eq!(modern.unwrap().version, rustls::ProtocolVersion::TLSv1_3);

    let default = Proxy::start_with(&config, tls_options(&ca, ""));
    let old = handshake(default.tls_addr(), Some("localhost"), TLS_12_ONLY).await;
    assert_eq!(old.unwrap().version, rustls::ProtocolVersion::TLSv1_2);
}

/// One SIGHUP swaps an entry's certificate and raises the minimum version together (counted
/// `ok`: neither needs a restart); a reload whose entry key does not match its certificate is
/// refused, naming the key and line, and both the certificate and "1.3" keep serving.
#[tokio::test]
async fn reload_swaps_certificates_and_min_version_and_a_bad_one_keeps_the_old() {
    let ca = TestCa::new("reload CA");
    let up = Upstream::start();
    let first = ca.issue("first", &["api.example.test"]);
    let second = ca.issue("second", &["api.example.test"]);
    let base = ConfigBuilder::unlimited(up.addr());
    let proxy = Proxy::start_with(
        &format!("{base}{}", entry(&first, None)),
        tls_options(&ca, "tls_min_version = \"1.2\""),
    );
    let tls = proxy.tls_addr();
    let api = || handshake(tls, Some("api.example.test"), TLS_ANY);
    assert_eq!(api().await.unwrap().leaf, first.der);
    let old = handshake(tls, Some("api.example.test"), TLS_12_ONLY).await;
    assert_eq!(old.unwrap().version, rustls::ProtocolVersion::TLSv1_2);
    proxy.wait_signal_handler(libc::SIGHUP, Duration::from_secs(10));

    let strict = proxy
        .server_section()
        .replace("tls_min_version = \"1.2\"", "tls_min_version = \"1.3\"");
    assert_ne!(strict, proxy.server_section());
    proxy.write_config_text(&format!("{strict}{base}{}", entry(&second, None)));
    proxy.signal(libc::SIGHUP).unwrap();
    wait_reloads(&proxy, "ok", 1, Duration::from_secs(10));
    let now = api().await.unwrap();
    assert_eq!(
        (now.leaf, now.version),
        (second.der.clone(), rustls::ProtocolVersion::TLSv1_3)
    );
    let refused = handshake(tls, Some("api.example.test"), TLS_12_ONLY).await;
    assert!(refused.is_err(), "TLS 1.2 accepted after the reload to 1.3");
    let (status, leaf) = get_leaf(&ca, Protocol::H2Tls, "api.example.test", tls).await;
    assert_eq!((status, leaf), (200, second.der.clone()));

    // Back to 1.2 and the first certificate, but with the second one's key: refused whole.
    let mismatched = format!(
        "[[tls.certs]]\ncert = {:?}\nkey = {:?}\n",
        first.cert, second.key
    );
    let text = format!("{}{base}{mismatched}", proxy.server_section());
    let line = text.lines().position(|l| l.starts_with("key = ")).unwrap() + 1;
    proxy.write_config_text(&text);
    proxy.signal(libc::SIGHUP).unwrap();
    wait_reloads(&proxy, "error", 1, Duration::from_secs(10));
    assert_eq!(api().await.unwrap().leaf, second.der);
    let refused = handshake(tls, Some("api.example.test"), TLS_12_ONLY).await;
    assert!(refused.is_err(), "the refused reload's 1.2 was applied");
    let log = proxy.log();
    let named = format!(":{line}: `tls.certs[0].key`");
    assert!(
        log.contains("config reload refused") && log.contains(&named),
        "expected {named:?} in:\n{log}"
    );
    let restart = proxy.metric("slidegate_config_reloads_total{result=\"needs_restart\"}");
    assert_eq!(
        restart.unwrap_or(0.0),
        0.0,
        "tls_min_version reported as needing a restart"
    );
}

const HEAD: &str = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n";

/// What validation refuses, by key and line, before any file is read.
#[test]
fn names_versions_and_stray_keys_are_refused_by_key_and_line() {
    let tls =
        format!("{HEAD}tls_listen = \"127.0.0.1:3\"\ntls_cert = \"d.pem\"\ntls_key = \"d.key\"\n");
    let two = |a: &str, b: &str| {
        format!(
            "{tls}[[tls.certs]]\ncert = \"a.pem\"\nkey = \"a.key\"\nnames = {a}\n\
             [[tls.certs]]\ncert = \"b.pem\"\nkey = \"b.key\"\nnames = {b}\n"
        )
    };
    assert_invalid(
        &two(
            "[\"api.example.com\", \"*.example.com\"]",
            "[\"www.example.com\", \"API.example.com.\"]",
        ),
        "tls.certs[1].names[1]",
        14,
        "listed by two entries",
    );
    assert_invalid(
        &two("[\"*.example.com\"]", "[\"*.EXAMPLE.com\"]"),
        "tls.certs[1].names[0]",
        14,
        "listed by two",
    );
    assert_invalid(
        &two("[\"a.example.com\"]", "[\"10.0.0.1:443\"]"),
        "tls.certs[1].names[0]",
        14,
        "not a host name",
    );
    assert_invalid(
        &two("[\"a.example.com\"]", "[]"),
        "tls.certs[1].names",
        14,
        "lists no name",
    );
    assert_invalid(
        &format!("{tls}tls_min_version = \"1.1\"\n"),
        "server.tls_min_version",
        7,
        "unknown variant",
    );
    assert_invalid(
        &format!("{HEAD}tls_min_version = \"1.3\"\n"),
        "server.tls_min_version",
        4,
        "only used with server.tls_listen",
    );
    assert_invalid(
        &format!("{HEAD}[[tls.certs]]\ncert = \"a.pem\"\nkey = \"a.key\"\n"),
        "tls.certs[0].cert",
        5,
        "only used with server.tls_listen",
    );
    assert_invalid(
        &format!("{tls}[[tls.certs]]\ncert = \"\"\nkey = \"a.key\"\n"),
        "tls.certs[0].cert",
        8,
        "must name a PEM file",
    );
}

/// Files are read by `-t` (and at start, and on reload): one that cannot be used is reported as
/// `file:line: `key``, and a certificate without a DNS name needs `names`.
#[test]
fn unusable_entry_files_are_named_by_file_line_and_key() {
    let ca = TestCa::new("files CA");
    let default = ca.issue("default", &["localhost"]);
    let a = ca.issue("a", &["a.example.test"]);
    let b = ca.issue("b", &["b.example.test"]);
    let ip_only = ca.issue("ip", &["127.0.0.1"]);
    let missing = ca.dir().join("missing.pem");
    let check = |entries: &str| {
        let path = ca.dir().join("t.toml");
        let text = format!(
            "{HEAD}tls_listen = \"127.0.0.1:3\"\ntls_cert = {:?}\ntls_key = {:?}\n{entries}",
            default.cert, default.key
        );
        std::fs::write(&path, text).unwrap();
        check_config(&path, &[])
    };
    let ok = check(&format!(
        "{}{}",
        entry(&a, None),
        entry(&ip_only, Some(&["ip.example.test"]))
    ));
    assert!(ok.ok, "{}", ok.output());
    let with_missing = Issued {
        cert: missing.clone(),
        ..b.clone()
    };
    for (entries, named, why) in [
        (
            format!("{}{}", entry(&a, None), entry(&with_missing, None)),
            "t.toml:11: `tls.certs[1].cert`",
            "missing.pem: cannot read",
        ),
        (
            format!("[[tls.certs]]\ncert = {:?}\nkey = {:?}\n", a.cert, b.key),
            "t.toml:9: `tls.certs[0].key`",
            "does not match the certificate",
        ),
        (
            entry(&ip_only, None),
            "t.toml:8: `tls.certs[0].cert`",
            "no DNS name",
        ),
    ] {
        let out = check(&entries);
        assert!(!out.ok, "{entries}");
        assert!(
            out.stderr.contains(named) && out.stderr.contains(why),
            "expected {named:?} and {why:?}: {}",
            out.output()
        );
    }
}

/// `-T` prints `tls_min_version` with its default and every entry by path (never a key's
/// contents), and what it prints passes `-t`.
#[test]
fn effective_config_prints_the_min_version_and_entries_by_path() {
    let ca = TestCa::new("print CA");
    let default = ca.issue("default", &["localhost"]);
    let a = ca.issue("a", &["a.example.test"]);
    let path = ca.dir().join("t.toml");
    std::fs::write(
        &path,
        format!(
            "{HEAD}tls_listen = \"127.0.0.1:3\"\ntls_cert = {:?}\ntls_key = {:?}\n{}",
            default.cert,
            default.key,
            entry(&a, Some(&["a.example.test"]))
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["-T", "-c"])
        .arg(&path)
        .env_remove("RUST_LOG")
        .output()
        .expect("run slidegate -T");
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key_pem = std::fs::read_to_string(&a.key).unwrap();
    let key_body = key_pem.lines().nth(1).unwrap();
    for want in [
        "tls_min_version = \"1.2\"".to_string(),
        "[[tls.certs]]".to_string(),
        format!("key = {:?}", a.key),
        "names = [\"a.example.test\"]".to_string(),
    ] {
        assert!(printed.contains(&want), "{want} not in:\n{printed}");
    }
    assert!(
        !printed.contains(key_body),
        "key contents printed:\n{printed}"
    );
    let again = ca.dir().join("printed.toml");
    std::fs::write(&again, &printed).unwrap();
    let checked = check_config(&again, &[]);
    assert!(checked.ok, "{}", checked.output());
}
