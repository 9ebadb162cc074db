//! Composite and richer keys (issue 21 item 1) beyond the requests of `route_keys.rs`: the
//! config errors of `key` (file, line, entry), the admin API's refusals of composite clients
//! that name no bucket, and what building a bucket key allocates.

use crate::common;

use std::path::Path;

use common::admin::{admin, enc};
use common::cli::check_config;
use common::config::assert_invalid;
use common::proxy::{ConfigBuilder, Proxy};
use common::upstream::Upstream;
use slidegate::config::Config;

const ONE: &str = r#"limits = [{ requests = 1, window = "1m" }]"#;

/// Each bad `key` is refused with the file, its line and its key.
#[test]
fn bad_keys_name_file_line_and_key() {
    let base = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [upstreams.app]\nservers = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\n\
                upstream = \"app\"\n";
    for (extra, key, line, message) in [
        (
            "key = \"cookie:\"\n",
            "routes[0].key",
            9,
            "invalid cookie name",
        ),
        (
            "key = \"query:\"\n",
            "routes[0].key",
            9,
            "names no parameter",
        ),
        ("key = \"body:x\"\n", "routes[0].key", 9, "unknown key"),
        ("key = []\n", "routes[0].key", 9, "empty list"),
        (
            "key = [\n  \"client_ip\",\n  \"global\",\n]\n",
            "routes[0].key[1]",
            11,
            "cannot be combined",
        ),
        (
            "key = [\"method\",\n \"method\"]\n",
            "routes[0].key[1]",
            10,
            "listed twice",
        ),
        (
            "key = [\"header:X-K\", \"header:x-k\"]\n",
            "routes[0].key[1]",
            9,
            "listed twice",
        ),
        (
            "key = [\"client_ip\", \"header:a b\"]\n",
            "routes[0].key[1]",
            9,
            "invalid header name",
        ),
    ] {
        let text = format!("{base}{extra}");
        assert_invalid(&text, key, line, message);
    }
    let text = format!("{base}key = [\"client_ip\", 7]\n");
    let e = Config::from_toml(Path::new("p.toml"), &text)
        .unwrap_err()
        .to_string();
    assert!(e.contains("p.toml:9") && e.contains("routes"), "{e}");
    let nine = ["\"method\""; 9].join(", ");
    let text = format!("{base}key = [{nine}]\n");
    let e = Config::from_toml(Path::new("p.toml"), &text)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("routes[0].key") && e.contains("at most 8"),
        "{e}"
    );

    // Through the binary: a non-zero exit naming file:line:key.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, format!("{base}key = [\"client_ip\", \"global\"]\n")).unwrap();
    let checked = check_config(&file, &[]);
    assert!(!checked.ok, "{}", checked.output());
    let want = format!("{}:9: `routes[0].key[1]`", file.display());
    assert!(checked.stderr.contains(&want), "{}", checked.stderr);
    std::fs::write(
        &file,
        format!("{base}key = [\"header:X-K\", \"client_ip\"]\n"),
    )
    .unwrap();
    assert!(check_config(&file, &[]).ok);
}

/// The admin API refuses composite clients that name no bucket, saying what it takes.
#[tokio::test]
async fn the_inspector_refuses_malformed_composite_clients() {
    let up = Upstream::start();
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route(
            "c",
            &format!("key = [\"header:X-K\", \"client_ip\"]\n{ONE}"),
        )
        .build();
    let proxy = Proxy::start(&config);
    for (client, says) in [
        ("k1", "JSON list with one entry per part"),
        (r#"["k1"]"#, "JSON list with one entry per part"),
        (r#"["k1", "nope"]"#, "entry 1 (client_ip)"),
        (r#"["", "127.0.0.1"]"#, "entry 0 (header:x-k)"),
        (r#"["k1", {"ip": "127.0.0.1"}]"#, "entry 1"),
    ] {
        let path = format!("/api/v1/window?route=c&client={}", enc(client));
        let reply = admin(&proxy, "GET", &path, &[]).await;
        assert_eq!(reply.status, 400, "{client}: {}", reply.body);
        assert!(reply.body.contains(says), "{client}: {}", reply.body);
    }
    let routes = admin(&proxy, "GET", "/api/v1/routes", &[]).await;
    let routes: serde_json::Value = serde_json::from_str(&routes.body).unwrap();
    assert_eq!(routes[0]["key"], r#"["header:x-k", "client_ip"]"#);
    assert_eq!(routes[0]["key_spec"]["kind"], "composite");
    assert_eq!(routes[0]["key_spec"]["parts"][0]["name"], "x-k");
}

/// Counts this thread's allocations, to show what building a bucket key costs.
struct Counting;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// The proxy reuses one key buffer per request context: once it has room, a `client_ip` key,
/// a header key and a composite of plain parts are written with no allocation at all.
#[test]
fn bucket_keys_are_built_without_allocating() {
    use slidegate::config::KeySpec;
    use slidegate::keys::KeyInput;
    let mut headers = http::HeaderMap::new();
    headers.insert("x-k", "key-1".parse().unwrap());
    headers.insert("cookie", "a=1; sid=s1".parse().unwrap());
    let req = KeyInput {
        query: Some("t=tenant-1"),
        ..KeyInput::headers(&headers, "192.0.2.7".parse().unwrap())
    };
    let mut out = String::with_capacity(256);
    for texts in [
        &["client_ip"][..],
        &["header:X-K"],
        &["cookie:sid"],
        &["query:t"],
        &["header:X-K", "query:t", "cookie:sid", "client_ip"],
    ] {
        // Parts as the config reads them, one or a list.
        let parts = texts.iter().map(|t| t.parse().unwrap()).collect();
        let spec = KeySpec::from_parts(parts).unwrap();
        let text = texts.join(", ");
        let before = ALLOCATIONS.with(|n| n.get());
        spec.write_request_key(&mut out, "route", &req).unwrap();
        let allocated = ALLOCATIONS.with(|n| n.get()) - before;
        println!("{text}: {out} ({allocated} allocations)");
        assert_eq!(allocated, 0, "{text}: {out}");
    }
}
