//! Issue 52 row 6, row 18 and the quota-feature notes, through the real binary over HTTP/1.1,
//! h2c, and HTTP/1.1 and HTTP/2 over TLS, each request on a connection of its own:
//!
//! - a method override is read as frameworks read it: on any method, `_method` (and
//!   `_method_override`, `__method_override__`) percent-decoded, the header fields under their
//!   CGI spelling (`X_HTTP_METHOD_OVERRIDE`); overrides naming two methods are `400`;
//! - the cost field is read under every spelling its key headers are (`X_Token_Estimate`), two
//!   spellings are `400`, and a refused cost's problem names the field and the figures;
//! - `path_prefix = "/api/"` also takes the bare `/api` (and `/api?page=2`);
//! - a cost limit's policy item names its unit (`slidegate-unit="cost"`) and its `t` is at most
//!   one resolution past `w`;
//! - `-T` prints the database of a one-Redis `url`.

use crate::common;

use common::config::limited;
use common::http::Reply;
use common::kept::Kept;
use common::proxy::{ConfigBuilder, Proxy};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

/// One request on a fresh connection, as written.
async fn sent(
    proxy: &Proxy,
    (protocol, ca): (Protocol, &TestCa),
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut conn = Kept::open(proxy, protocol, &ca.ca_pem()).await;
    let reply = conn.send(method, path, headers, Default::default()).await;
    reply.unwrap_or_else(|e| panic!("{protocol:?} {method} {path}: {e}"))
}

fn start(config: &ConfigBuilder, ca: &TestCa) -> Proxy {
    let mut options = tls_options(ca, "h2c = true");
    // The reason of every 400 in the log, should a case fail.
    (options.env).push(("RUST_LOG".into(), "info,slidegate=debug".into()));
    let proxy = Proxy::start_with(&config.build(), options);
    common::admin::wait_readyz(&proxy, 200, std::time::Duration::from_secs(10));
    proxy
}

/// A request that names an override: (sent method, header fields, query).
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// Overrides an app reads as the limited method, each sent by a client that has used up its
/// limit with the real method.
const OVERRIDDEN: [Case; 9] = [
    ("POST", &[], "?_method=DEL%45TE"),
    ("POST", &[], "?a=1&_m%65thod=delete"),
    ("POST", &[], "?__METHOD_OVERRIDE__=DELETE"),
    ("PUT", &[], "?_method_override=%64elete"),
    ("POST", &[("X_HTTP_METHOD_OVERRIDE", "DELETE")], ""),
    ("GET", &[("X-HTTP-Method-Override", "DELETE")], ""),
    ("PUT", &[("x_method_override", "delete")], ""),
    ("GET", &[("X-Http_Method", "Delete")], ""),
    ("PATCH", &[("x-method-override", "DELETE, delete")], ""),
];

/// Overrides naming two methods: no one route is right (Express takes the first item, Rails
/// and Flask none, Symfony refuses).
const AMBIGUOUS: [Case; 4] = [
    ("POST", &[("X-HTTP-Method-Override", "DELETE, GET")], ""),
    ("GET", &[("X_HTTP_METHOD_OVERRIDE", "GET,DELETE")], ""),
    ("POST", &[("x-http-method", "PUT")], "?_method=DELETE"),
    ("PUT", &[], "?_method=DELETE&_method=PATCH"),
];

#[tokio::test]
async fn method_overrides_are_read_as_frameworks_read_them() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let route = format!(
        "{}\nkey = \"header:X-Client\"\nmethods = [\"DELETE\"]",
        limited("/items/", 2, "1h")
    );
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("del", &route)
        .route(
            "edit",
            &format!(
                "{}\nkey = \"header:X-Client\"\nmethods = [\"PATCH\", \"PUT\"]",
                limited("/notes/", 1, "1h")
            ),
        )
        .route("default", "path_prefix = \"/\"");
    let proxy = start(&config, &ca);
    let mut forwarded = 0;
    for protocol in Protocol::ALL {
        let via = (protocol, &ca);
        // Another route, other methods, another limit.
        let who = format!("{protocol:?}-edit");
        let client = ("x-client", who.as_str());
        let real = sent(&proxy, via, "PATCH", "/notes/1", &[client]).await;
        assert_eq!(real.status, 200, "{who}");
        forwarded += 1;
        for (method, field, path) in [
            ("POST", None, "/notes/1?_method=p%41tch"),
            ("GET", Some(("x_method_override", "put")), "/notes/1"),
            (
                "DELETE",
                Some(("X-HTTP-Method", "PATCH, patch")),
                "/notes/1",
            ),
        ] {
            let headers: Vec<_> = [client].into_iter().chain(field).collect();
            let got = sent(&proxy, via, method, path, &headers).await;
            assert_eq!(got.status, 429, "{who}: {method} {path} {field:?}");
        }
        for (i, (method, fields, query)) in OVERRIDDEN.iter().enumerate() {
            let who = format!("{protocol:?}-{i}");
            let client = ("x-client", who.as_str());
            for _ in 0..2 {
                let real = sent(&proxy, via, "DELETE", "/items/7", &[client]).await;
                assert_eq!(real.status, 200, "{who}");
            }
            forwarded += 2;
            let mut headers = vec![client];
            headers.extend_from_slice(fields);
            let path = format!("/items/7{query}");
            let got = sent(&proxy, via, method, &path, &headers).await;
            assert_eq!(got.status, 429, "{who}: {method} {path} {fields:?}");
        }
        for (method, fields, query) in AMBIGUOUS {
            let mut headers = vec![("x-client", "fresh")];
            headers.extend_from_slice(fields);
            let path = format!("/items/7{query}");
            let got = sent(&proxy, via, method, &path, &headers).await;
            assert_eq!(got.status, 400, "{protocol:?}: {method} {path} {fields:?}");
            assert!(got.body.contains("more than one method"), "{}", got.body);
        }
        // Not the DELETE route's: no override, one naming the sent method, or no method.
        for (method, fields) in [
            ("POST", &[][..]),
            ("GET", &[("X-HTTP-Method-Override", "GET")]),
            ("GET", &[("X-HTTP-Method-Override", "DE LETE")]),
            ("GET", &[("X-HTTP-Method-Overrides", "DELETE")]),
        ] {
            let mut headers = vec![("x-client", "fresh")];
            headers.extend_from_slice(fields);
            let got = sent(&proxy, via, method, "/items/7", &headers).await;
            assert_eq!(got.status, 200, "{protocol:?}: {method} {fields:?}");
            forwarded += 1;
        }
    }
    assert_eq!(up.hits(), forwarded);
}

#[tokio::test]
async fn the_cost_field_is_read_under_every_spelling_and_a_refusal_says_why() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let route = "path_prefix = \"/v1/\"\nkey = \"header:X-Client\"\n\
                 cost = \"header:X-Token-Estimate\"\nmax_cost = 80\n\
                 limits = [{ quota = 100, window = \"1h\", unit = \"cost\" }]";
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("llm", route)
        .route("default", "path_prefix = \"/\"");
    let proxy = start(&config, &ca);
    let remaining = |r: &Reply| {
        let field = r.header("ratelimit").unwrap_or_else(|| panic!("{r:?}"));
        let r_param = field.split(';').find_map(|p| p.strip_prefix("r="));
        r_param.and_then(|v| v.parse::<u32>().ok()).unwrap()
    };
    let mut forwarded = 0;
    for protocol in Protocol::ALL {
        let via = (protocol, &ca);
        let who = format!("{protocol:?}");
        let client = ("x-client", who.as_str());
        let ask = |fields: &'static [(&'static str, &'static str)]| {
            let mut headers = vec![client];
            headers.extend_from_slice(fields);
            headers
        };
        // Charged what the app reads (`HTTP_X_TOKEN_ESTIMATE`), not 1.
        let first = sent(
            &proxy,
            via,
            "POST",
            "/v1/chat",
            &ask(&[("X_Token_Estimate", "50")]),
        )
        .await;
        assert_eq!((first.status, remaining(&first)), (200, 50), "{who}");
        let next = sent(
            &proxy,
            via,
            "POST",
            "/v1/chat",
            &ask(&[("x_token-estimate", "30")]),
        )
        .await;
        assert_eq!((next.status, remaining(&next)), (200, 20), "{who}");
        forwarded += 2;
        // Refused, saying which field and why, in problem+json; nothing counted.
        for (fields, says) in [
            (
                &[("X-Token-Estimate", "1"), ("X_Token_Estimate", "50")][..],
                "the x-token-estimate header is given more than once",
            ),
            (
                &[("X_TOKEN_ESTIMATE", "5"), ("X-Token_Estimate", "5")],
                "the x-token-estimate header is given more than once",
            ),
            (
                &[("X-Token-Estimate", "abc")],
                "the x-token-estimate header must be one non-negative decimal integer",
            ),
            (
                &[("X_Token_Estimate", "90")],
                "90, from the x-token-estimate header, is over the route's max_cost 80",
            ),
        ] {
            let got = sent(&proxy, via, "POST", "/v1/chat", &ask(fields)).await;
            assert_eq!(got.status, 400, "{who} {fields:?}");
            assert_eq!(got.header("content-type"), Some("application/problem+json"));
            let body: serde_json::Value = serde_json::from_str(&got.body)
                .unwrap_or_else(|e| panic!("{who} {fields:?}: {e}: {:?}", got.body));
            let detail = body["detail"].as_str().unwrap_or_default();
            assert!(
                detail.starts_with("cost: ") && detail.contains(says),
                "{detail}"
            );
            assert_eq!(body["status"], 400);
        }
        let after = sent(
            &proxy,
            via,
            "POST",
            "/v1/chat",
            &ask(&[("X-Token-Estimate", "20")]),
        )
        .await;
        assert_eq!((after.status, remaining(&after)), (200, 0), "{who}");
        forwarded += 1;
    }
    assert_eq!(up.hits(), forwarded);
}

#[tokio::test]
async fn a_prefix_ending_in_a_slash_takes_its_bare_form() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let keyed = |path: &str, n| format!("{}\nkey = \"header:X-Client\"", limited(path, n, "1h"));
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("api", &keyed("/api/", 2))
        .route(
            "docs",
            &format!("{}\npath_case_insensitive = true", keyed("/v2/Docs/", 1)),
        )
        .route("default", "path_prefix = \"/\"");
    let proxy = start(&config, &ca);
    let mut forwarded = 0;
    for protocol in Protocol::ALL {
        let via = (protocol, &ca);
        let who = format!("{protocol:?}");
        let client = [("x-client", who.as_str())];
        for path in ["/api/users", "/api/"] {
            assert_eq!(sent(&proxy, via, "GET", path, &client).await.status, 200);
            forwarded += 1;
        }
        for path in ["/api", "/api?page=2", "/api;v=1", "/api?"] {
            let got = sent(&proxy, via, "GET", path, &client).await;
            assert_eq!(got.status, 429, "{who} {path} is the /api/ route's");
        }
        assert_eq!(
            sent(&proxy, via, "GET", "/V2/docs/x?y=1", &client)
                .await
                .status,
            200
        );
        forwarded += 1;
        let bare = sent(&proxy, via, "GET", "/v2/DOCS", &client).await;
        assert_eq!(bare.status, 429, "{who}: case-insensitive bare form");
        // Other paths are not its bare form.
        for path in ["/apix", "/ap", "/v2/docsx", "/v2"] {
            let got = sent(&proxy, via, "GET", path, &client).await;
            assert_eq!(got.status, 200, "{who} {path}");
            forwarded += 1;
        }
    }
    assert_eq!(up.hits(), forwarded);
}

#[tokio::test]
async fn a_cost_limit_names_its_unit_and_its_reset_stays_within_a_slot_of_its_window() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let route = "path_prefix = \"/v1/\"\nkey = \"header:X-Client\"\ncost = \"header:X-Cost\"\n\
                 limits = [{ requests = 9, window = \"1h\" }, \
                 { quota = 777, window = \"1h\", unit = \"cost\" }, \
                 { quota = 50, window = \"2m\", unit = \"cost\", resolution = \"30s\" }]";
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("llm", route);
    let proxy = start(&config, &ca);
    for protocol in Protocol::ALL {
        let who = format!("{protocol:?}");
        let headers = [("x-client", who.as_str()), ("x-cost", "7")];
        let got = sent(&proxy, (protocol, &ca), "POST", "/v1/x", &headers).await;
        assert_eq!(got.status, 200, "{who}");
        let policy = got.header("ratelimit-policy").unwrap();
        assert_eq!(
            policy,
            "\"llm-3600s\";q=9;w=3600, \
             \"llm-3600s@60s-cost\";q=777;slidegate-unit=\"cost\";w=3600, \
             \"llm-120s@30s-cost\";q=50;slidegate-unit=\"cost\";w=120",
            "{who}"
        );
        // `t`: until the charge leaves, which for a slotted limit is the end of its slot plus
        // the window: within (w, w + resolution], never the exact log's w.
        let t: Vec<u64> = (got.header("ratelimit").unwrap().split(';'))
            .filter_map(|p| p.strip_prefix("t=")?.parse().ok())
            .collect();
        assert_eq!(t.len(), 3, "{who}");
        assert!(t[0] <= 3600, "{who}: the log's t {t:?}");
        assert!((3601..=3660).contains(&t[1]), "{who}: {t:?}");
        assert!((121..=150).contains(&t[2]), "{who}: {t:?}");
    }
}

#[test]
fn minus_t_prints_the_database_of_a_one_redis_url() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("slidegate.toml");
    for (url, env, shown) in [
        ("redis://127.0.0.1:6379", None, "redis://127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/4", None, "redis://127.0.0.1:6379/4"),
        (
            "${R5_REDIS_URL}",
            Some("rediss://app:pw@cache.internal:6380"),
            "rediss://app:REDACTED@cache.internal:6380/0",
        ),
    ] {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:18080\"\nadmin_listen = \"127.0.0.1:19090\"\n\
             {}",
            ConfigBuilder::new()
                .store(&format!("backend = \"redis\"\nurl = \"{url}\""))
                .upstream("app", "127.0.0.1:9")
                .route("all", "")
                .build()
        );
        std::fs::write(&file, text).unwrap();
        let env: Vec<(&str, &str)> = env.map(|v| ("R5_REDIS_URL", v)).into_iter().collect();
        let doc = common::cli::effective_config(&file, &env);
        assert_eq!(doc["store"]["url"].as_str(), Some(shown), "{url}");
        // What -T prints, -t accepts.
        let printed = dir.path().join("printed.toml");
        std::fs::write(&printed, toml::to_string(&doc).unwrap()).unwrap();
        let checked = common::cli::check_config(&printed, &[]);
        assert!(checked.ok, "{}", checked.output());
    }
}
