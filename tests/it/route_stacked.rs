//! Limits with keys of their own (`limits[].key`), through the real binary: a route with a
//! per-client limit of 5 and a `global` one of 8 a minute, three clients sending at once (one
//! over HTTP/1.1, one over HTTP/2 over TLS, one over h2c). On the memory store, one Redis, two
//! proxies sharing one Redis, and a Redis Cluster: exactly 8 admitted in all, at most 5 per
//! client, the denials name the limit that denied, and the inspector shows that no denial was
//! recorded anywhere (a client denied by the global limit has not used its own). With
//! `count_status`, on the memory store and a Cluster: a refund gives every limit back in its own
//! bucket. And the config: a bad `limits[].key` names its file, line and key; a `global` key of
//! its own is reserved last; each limit's policy name names its key.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::admin::{admin, wait_readyz};
use common::config::assert_invalid;
use common::fetch::{fetch, fetch_with, url, Seen};
use common::proxy::{start_ready, ConfigBuilder, Proxy, ProxyOptions};
use common::ratelimit::parse_ratelimit;
use common::redis::{shared_cluster, RedisServer};
use common::tls::{ready_on_every_protocol, tls_options, Protocol, TestCa};
use common::upstream::{Upstream, STATUS_HEADER};
use futures::future::join_all;
use slidegate::config::Config;

/// Requests each client sends at once: more than its own 5, and 3 × 6 more than the 8 shared.
const EACH: usize = 6;

/// Each client's protocol: all three of them in every run.
const CLIENTS: [(&str, Protocol); 3] = [
    ("alice", Protocol::H1),
    ("bob", Protocol::H2Tls),
    ("carol", Protocol::H2c),
];

fn config(up: &Upstream, store: &str) -> String {
    ConfigBuilder::new()
        .store(store)
        .upstream("app", up.addr())
        .route(
            "chat",
            "key = \"header:X-Client\"\n\
             limits = [\n  { requests = 5, window = \"1m\" },\n  \
             { requests = 8, window = \"1m\", key = \"global\" },\n]",
        )
        .build()
}

/// Proxies on `store`, each with a TLS listener and h2c, ready (`/readyz`).
fn proxies(up: &Upstream, ca: &TestCa, store: &str, n: usize) -> Vec<Proxy> {
    ready_on_every_protocol(&config(up, store), ca, n)
}

/// Every client sends [`EACH`] requests at once, request `i` to proxy `i % proxies`.
async fn burst(proxies: &[Proxy], ca: &TestCa) -> Vec<(&'static str, Seen)> {
    let clients: HashMap<_, _> = (CLIENTS.iter())
        .map(|&(who, protocol)| (who, protocol.client(&ca.ca_pem())))
        .collect();
    let calls = (0..EACH)
        .flat_map(|i| CLIENTS.map(|c| (i, c)))
        .map(|(i, (who, protocol))| {
            let target = url(&proxies[i % proxies.len()], protocol, "/");
            let client = clients[who].clone();
            async move { (who, fetch(&client, &target, who, protocol.version()).await) }
        });
    join_all(calls).await
}

/// The inspector's count of each limit of `client` on `route` (own, global).
fn counts_on(proxy: &Proxy, route: &str, client: &str) -> (u64, u64) {
    let path = format!("/api/v1/window?route={route}&client={client}");
    let (status, body) = proxy.admin_get(&path);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let count = |i: usize| {
        v["limits"][i]["count"]
            .as_u64()
            .unwrap_or_else(|| panic!("{v}"))
    };
    assert_eq!(v["limits"][1]["name"], format!("{route}-60s-global"), "{v}");
    (count(0), count(1))
}

/// [`counts_on`] the `chat` route.
fn counts(proxy: &Proxy, client: &str) -> (u64, u64) {
    counts_on(proxy, "chat", client)
}

/// Each limit's `pk` is its own bucket's: the global limit's one for every client, each
/// client's own limit its own (one proxy: without a shared secret each process keys its own).
fn partition_keys_follow_the_buckets(seen: &[(&str, Seen)]) {
    let mut global = HashSet::new();
    let mut own: HashMap<&str, HashSet<Vec<u8>>> = HashMap::new();
    for (who, seen) in seen {
        let items = parse_ratelimit(seen.ratelimit.as_deref().unwrap_or_default());
        assert_eq!(items.len(), 2, "{who}: {items:?}");
        own.entry(who).or_default().insert(items[0].pk.clone());
        global.insert(items[1].pk.clone());
    }
    assert_eq!(global.len(), 1, "one global bucket, one pk: {global:?}");
    let owns: HashSet<Vec<u8>> = own.values().flatten().cloned().collect();
    assert!(own.values().all(|pks| pks.len() == 1), "{own:?}");
    assert_eq!(owns.len(), CLIENTS.len(), "{own:?}");
    assert!(owns.is_disjoint(&global));
}

/// Issue 54: each denial is counted under the limit(s) it names with `r=0` in its RateLimit
/// field, each admission in both limits; the series are the policy names.
fn denials_are_counted_by_limit(proxy: &Proxy, seen: &[(&str, Seen)]) {
    let mut want: HashMap<String, u64> = HashMap::new();
    for (_, s) in seen.iter().filter(|(_, s)| s.status == 429) {
        for item in parse_ratelimit(s.ratelimit.as_deref().unwrap_or_default()) {
            if item.r == 0 {
                *want.entry(item.name).or_default() += 1;
            }
        }
    }
    let admitted = seen.iter().filter(|(_, s)| s.status == 200).count() as u64;
    for policy in ["chat-60s", "chat-60s-global"] {
        let series = |m: &str| format!("{m}{{route=\"chat\",limit=\"{policy}\"}}");
        let denials = proxy.counter(&series("slidegate_limit_denials_total"));
        assert_eq!(denials, want.get(policy).copied().unwrap_or(0), "{policy}");
        let admissions = proxy.counter(&series("slidegate_limit_admissions_total"));
        assert_eq!(admissions, admitted, "{policy}");
    }
    assert!(want.values().sum::<u64>() > 0, "some denial: {want:?}");
}

/// The shared checks of every store: see the module documentation.
async fn exactly_eight(proxies: &[Proxy], ca: &TestCa) {
    let seen = burst(proxies, ca).await;
    if proxies.len() == 1 {
        partition_keys_follow_the_buckets(&seen);
        denials_are_counted_by_limit(&proxies[0], &seen);
    }
    let admitted = |who: &str| {
        (seen.iter())
            .filter(|(w, s)| *w == who && s.status == 200)
            .count()
    };
    let total: usize = CLIENTS.iter().map(|(who, _)| admitted(who)).sum();
    assert_eq!(total, 8, "{seen:#?}");
    for (who, seen) in &seen {
        assert!(matches!(seen.status, 200 | 429), "{who}: {seen:?}");
        let policy = seen.policy.as_deref().unwrap_or_default();
        assert!(policy.contains("\"chat-60s-global\";q=8;w=60"), "{policy}");
        if seen.status == 429 {
            // Whichever limit denied says 0 left; the RateLimit field names it.
            let field = seen.ratelimit.as_deref().unwrap_or_default();
            assert!(field.contains(";r=0;"), "{who}: {field}");
        }
    }
    let mut global = 0;
    for (who, _) in CLIENTS {
        assert!(admitted(who) <= 5, "{who}: {}", admitted(who));
        let (own, shared) = counts(&proxies[0], who);
        // Denials are recorded nowhere: the client's own bucket holds its admissions only.
        assert_eq!(own, admitted(who) as u64, "{who}");
        global = shared;
    }
    assert_eq!(global, 8, "the global bucket holds the admissions only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_admits_exactly_the_global_limit() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxies = proxies(&up, &ca, "backend = \"memory\"", 1);
    exactly_eight(&proxies, &ca).await;
    // The inspector names each limit's own key; a client's reset leaves the shared bucket.
    let (_, routes) = proxies[0].admin_get("/api/v1/routes");
    let routes: serde_json::Value = serde_json::from_str(&routes).unwrap();
    assert_eq!(
        routes[0]["limits"][0]["key"],
        serde_json::Value::Null,
        "{routes}"
    );
    assert_eq!(routes[0]["limits"][1]["key"], "global", "{routes}");
    let reset = admin(
        &proxies[0],
        "POST",
        "/api/v1/reset?route=chat&client=alice",
        &[],
    )
    .await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert_eq!(counts(&proxies[0], "alice"), (0, 8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_admits_exactly_the_global_limit() {
    let (up, ca, redis) = (Upstream::start(), TestCa::new("ca"), RedisServer::start());
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        redis.url()
    );
    let proxies = proxies(&up, &ca, &store, 1);
    exactly_eight(&proxies, &ca).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_one_redis_admit_exactly_the_global_limit() {
    let (up, ca, redis) = (Upstream::start(), TestCa::new("ca"), RedisServer::start());
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        redis.url()
    );
    let proxies = proxies(&up, &ca, &store, 2);
    exactly_eight(&proxies, &ca).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_admits_exactly_the_global_limit() {
    let (up, ca, cluster) = (Upstream::start(), TestCa::new("ca"), shared_cluster());
    let store = format!("{}\ntimeout = \"2s\"", cluster.own_store());
    let proxies = proxies(&up, &ca, &store, 1);
    exactly_eight(&proxies, &ca).await;
}

#[test]
fn a_bad_limit_key_names_its_file_line_and_key() {
    let up = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n[upstreams.app]\nservers = [\"127.0.0.1:1\"]\n";
    let text = format!(
        "{up}\n[[routes]]\nname = \"chat\"\nupstream = \"app\"\nlimits = [\n  \
         {{ requests = 5, window = \"1m\" }},\n  \
         {{ requests = 8, window = \"1m\", key = \"header:\" }},\n]\n"
    );
    assert_invalid(&text, "routes[0].limits[1].key", 12, "invalid header name");
    // Two limits of one window whose keys read the same in a policy name.
    let text = format!(
        "{up}\n[[routes]]\nname = \"chat\"\nupstream = \"app\"\nlimits = [\n  \
         {{ requests = 5, window = \"1m\", key = \"header:a_b\" }},\n  \
         {{ requests = 8, window = \"1m\", key = \"header:a-b\" }},\n]\n"
    );
    assert_invalid(&text, "routes[0].limits[1].key", 12, "chat-60s-header-a-b");
}

#[test]
fn a_global_key_of_its_own_is_reserved_last() {
    let text = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
        [upstreams.app]\nservers = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"chat\"\n\
        upstream = \"app\"\nlimits = [\n  { requests = 8, window = \"1m\", key = \"global\" },\n  \
        { requests = 5, window = \"1m\", key = \"header:X-Org\" },\n  \
        { requests = 2, window = \"1s\" },\n]\n";
    let config = Config::from_toml(std::path::Path::new("t.toml"), text).expect("valid");
    let route = &config.routing.routes[0];
    let keys: Vec<String> = route
        .limit_keys
        .keys
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(keys, ["header:x-org", "global"]);
    assert_eq!(route.limit_keys.of_limit, [2, 1, 0]);
    assert_eq!(
        route.policy_names(),
        ["chat-60s-global", "chat-60s-header-x-org", "chat-1s"]
    );
}

/// `count_status = [401]` on a route with a per-client 2 and a global 3: an answer of 200 gives
/// the admission back in both buckets (on a Cluster each in its own slot, recorded at its own
/// node's time); 401s count in both, and a denial by either counts in neither.
async fn refunds_in_every_bucket(proxy: &Proxy, protocol: Protocol, ca: &TestCa) {
    let client = protocol.client(&ca.ca_pem());
    let target = url(proxy, protocol, "/");
    let send = |who: &'static str, status: &'static str| {
        let (client, target) = (client.clone(), target.clone());
        async move {
            let headers = [("x-client", who), (STATUS_HEADER, status)];
            fetch_with(&client, &target, &headers, protocol.version())
                .await
                .status
        }
    };
    for _ in 0..3 {
        assert_eq!(send("a", "200").await, 200);
        let deadline = Instant::now() + Duration::from_secs(5);
        while counts_on(proxy, "login", "a") != (0, 0) {
            assert!(Instant::now() < deadline, "not given back in both buckets");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let statuses = [
        send("a", "401").await,
        send("a", "401").await,
        send("a", "401").await,
    ];
    assert_eq!(statuses, [401, 401, 429], "a's own limit denies the third");
    assert_eq!([send("b", "401").await, send("b", "401").await], [401, 429]);
    assert_eq!(counts_on(proxy, "login", "a"), (2, 3));
    assert_eq!(counts_on(proxy, "login", "b"), (1, 3));
}

fn login_config(up: &Upstream, store: &str) -> String {
    ConfigBuilder::new()
        .store(store)
        .upstream("app", up.addr())
        .route(
            "login",
            "key = \"header:X-Client\"\ncount_status = [401]\n\
             limits = [\n  { requests = 2, window = \"1m\" },\n  \
             { requests = 3, window = \"1m\", key = \"global\" },\n]",
        )
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_refunds_every_limit_in_its_own_bucket() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let config = login_config(&up, "backend = \"memory\"");
    let proxy = Proxy::start_with(&config, tls_options(&ca, "h2c = true"));
    refunds_in_every_bucket(&proxy, Protocol::H2Tls, &ca).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_refunds_every_limit_in_its_own_bucket() {
    let (up, ca, cluster) = (Upstream::start(), TestCa::new("ca"), shared_cluster());
    let store = format!("{}\ntimeout = \"2s\"", cluster.own_store());
    let proxy = Proxy::start_with(&login_config(&up, &store), tls_options(&ca, "h2c = true"));
    wait_readyz(&proxy, 200, Duration::from_secs(20));
    refunds_in_every_bucket(&proxy, Protocol::H2c, &ca).await;
}

/// Issue 52 row 1: limits keyed by different fields never share a bucket, whatever their
/// values. Each route keys its own limit (3) by a member field and a second limit (9) by a
/// group field of the same kind (header, query, cookie, composite; and a header beside
/// `client_ip`). A group's 9 requests leave a member whose id equals the group's id untouched
/// (before: 0 of 3, the group's bucket was the member's), and a value given in both fields is
/// counted once in each (before: twice in one). Memory and one Redis, over HTTP/1.1, h2c and
/// HTTP/2 over TLS in turn.
mod two_keys {
    use super::*;

    /// Route, its own key, the second limit's key.
    const ROUTES: [(&str, &str, &str); 5] = [
        ("hdr", r#""header:X-Member""#, r#""header:X-Group""#),
        ("qry", r#""query:member""#, r#""query:group""#),
        ("ck", r#""cookie:member""#, r#""cookie:group""#),
        (
            "mix",
            r#"["header:X-Member", "method"]"#,
            r#"["header:X-Group", "method"]"#,
        ),
        ("ipk", r#""header:X-Member""#, r#""client_ip""#),
    ];
    const PROTOCOLS: [Protocol; 3] = [Protocol::H1, Protocol::H2c, Protocol::H2Tls];

    fn config(up: &Upstream, store: &str) -> String {
        let mut config = ConfigBuilder::new().store(store).upstream("app", up.addr());
        for (name, own, other) in ROUTES {
            config = config.route(
                name,
                &format!(
                    "path_prefix = \"/{name}\"\nkey = {own}\nlimits = [\n  \
                     {{ requests = 3, window = \"10m\" }},\n  \
                     {{ requests = 9, window = \"10m\", key = {other} }},\n]"
                ),
            );
        }
        config.build()
    }

    /// One request on `route` from member `member` (`None`: the field left out) of group
    /// `group`, over the `i`th protocol in turn: its status.
    async fn send(
        proxy: &Proxy,
        clients: &[reqwest::Client],
        i: usize,
        route: &str,
        member: Option<&str>,
        group: &str,
    ) -> u16 {
        let protocol = PROTOCOLS[i % PROTOCOLS.len()];
        let mut headers: Vec<(&str, String)> = Vec::new();
        let mut path = format!("/{route}");
        match route {
            "qry" => {
                path.push_str(&format!("?group={group}"));
                if let Some(m) = member {
                    path.push_str(&format!("&member={m}"));
                }
            }
            "ck" => {
                let mut cookie = format!("group={group}");
                if let Some(m) = member {
                    cookie.push_str(&format!("; member={m}"));
                }
                headers.push(("cookie", cookie));
            }
            _ => {
                headers.push(("x-group", group.to_string()));
                if let Some(m) = member {
                    headers.push(("x-member", m.to_string()));
                }
            }
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let target = url(proxy, protocol, &path);
        let client = &clients[i % PROTOCOLS.len()];
        let seen = fetch_with(client, &target, &headers, protocol.version()).await;
        assert!(matches!(seen.status, 200 | 429), "{route} {path}: {seen:?}");
        seen.status
    }

    async fn check(proxy: &Proxy, ca: &TestCa) {
        let clients: Vec<_> = PROTOCOLS.iter().map(|p| p.client(&ca.ca_pem())).collect();
        let clients = &clients;
        let mut i = 0;
        let mut next = |route: &'static str, member: Option<&str>, group: &'static str| {
            i += 1;
            let (i, member) = (i, member.map(str::to_string));
            async move { send(proxy, clients, i, route, member.as_deref(), group).await }
        };
        for (route, _, other) in ROUTES {
            let by_ip = other.contains("client_ip");
            if by_ip {
                // The member field left out: its bucket is the address, under the member
                // field's own name, not the `client_ip` limit's bucket of the same address.
                let statuses = [
                    next(route, None, "g").await,
                    next(route, None, "g").await,
                    next(route, None, "g").await,
                    next(route, None, "g").await,
                ];
                assert_eq!(statuses, [200, 200, 200, 429], "{route}: {statuses:?}");
                // The address has used 3 of its 9: six other members still pass.
                for m in 0..6 {
                    let s = next(route, Some(&format!("m{m}")), "g").await;
                    assert_eq!(s, 200, "{route}: member m{m}");
                }
                assert_eq!(next(route, Some("m9"), "g").await, 429, "{route}");
                continue;
            }
            // Group 31 fills its 9 with nine members.
            for m in 0..9 {
                let s = next(route, Some(&format!("u{m}")), "31").await;
                assert_eq!(s, 200, "{route}: member u{m} of group 31");
            }
            assert_eq!(
                next(route, Some("u9"), "31").await,
                429,
                "{route}: group 31 full"
            );
            // Member 31, of another group: its own 3, untouched by group 31's bucket.
            let mut statuses = Vec::new();
            for _ in 0..4 {
                statuses.push(next(route, Some("31"), "g-other").await);
            }
            assert_eq!(statuses, [200, 200, 200, 429], "{route}: member 31");
            // The same value in both fields: counted once in each, so 3 of 3.
            let mut statuses = Vec::new();
            for _ in 0..4 {
                statuses.push(next(route, Some("x7"), "x7").await);
            }
            assert_eq!(
                statuses,
                [200, 200, 200, 429],
                "{route}: member x7 of group x7"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_the_memory_store() {
        let (up, ca) = (Upstream::start(), TestCa::new("ca"));
        let proxies = ready_on_every_protocol(&config(&up, "backend = \"memory\""), &ca, 1);
        check(&proxies[0], &ca).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_redis() {
        let (up, ca, redis) = (Upstream::start(), TestCa::new("ca"), RedisServer::start());
        let store = format!(
            "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
            redis.url()
        );
        let proxies = ready_on_every_protocol(&config(&up, &store), &ca, 1);
        check(&proxies[0], &ca).await;
    }
}

/// Issue 52 rows 16 and 17 on the memory store, which reserves a stacked decision bucket by
/// bucket: a client at its own limit, flooding, never refuses another client on the shared
/// limit while it has room (before: 5-8 of 300 probes refused); and a refused cost-50 request
/// gives back the 50 it reserved (before: its cost limit reported `r=51`).
mod reservations {
    use super::*;
    use common::load::{h2load_for, Burst};

    /// The shared limit is the route's own key (reserved first in key order) and has one place
    /// per 40 ms, which each probe takes once the last one slid out: a probe is refused only if
    /// the flooder holds that place, which it may do only for the microseconds of a
    /// reservation its own full bucket then gives back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flooding_client_never_refuses_others_on_the_shared_limit() {
        let _permit = common::heavy::heavy();
        const PROBES: usize = 120;
        let (up, ca) = (Upstream::start(), TestCa::new("ca"));
        let toml = ConfigBuilder::new()
            .store("backend = \"memory\"")
            .upstream("app", up.addr())
            .route(
                "shared",
                "key = \"global\"\nlimits = [\n  { requests = 1, window = \"40ms\" },\n  \
                 { requests = 2, window = \"10m\", key = \"header:X-Tenant\" },\n]",
            )
            .build();
        // More workers than cores: a worker preempted between a reservation and its release
        // holds it for a scheduler slice, as on a busy production host.
        let options = ProxyOptions {
            threads: 4,
            server_extra: "h2c = true".into(),
            ..ProxyOptions::default()
        };
        let proxy = start_ready(&toml, options);
        let client = Protocol::H1.client(&ca.ca_pem());
        let target = url(&proxy, Protocol::H1, "/");
        let get = |who: String| {
            let (client, target) = (client.clone(), target.clone());
            async move {
                let headers = [("x-tenant", who.as_str())];
                fetch_with(&client, &target, &headers, Protocol::H1.version()).await
            }
        };
        // The flooder uses its own 2, a window apart; from then on its own limit refuses it.
        for _ in 0..2 {
            assert_eq!(get("noisy".into()).await.status, 200);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let addr = proxy.addr();
        let flood = Burst {
            connections: 20,
            streams: 10,
            requests: 0,
            headers: vec!["X-Tenant: noisy".into()],
            path: "/".into(),
        };
        let flood = std::thread::spawn(move || h2load_for(addr, &flood, 10));
        let mut refused = Vec::new();
        for i in 0..PROBES {
            // Each probe after the last one's admission slid out of the 40 ms window.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let seen = get(format!("probe-{i}")).await;
            if seen.status != 200 {
                refused.push((i, seen.status, seen.ratelimit));
            }
        }
        let flood = flood.join().unwrap();
        assert_eq!(
            flood.s2xx, 0,
            "the flooder stays at its own limit: {flood:?}"
        );
        assert!(flood.s4xx > 1000, "a flood: {flood:?}");
        let n = refused.len();
        assert!(refused.is_empty(), "{n} of {PROBES} refused: {refused:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_reservation_gives_back_its_cost() {
        let (up, ca) = (Upstream::start(), TestCa::new("ca"));
        let toml = ConfigBuilder::new()
            .store("backend = \"memory\"")
            .upstream("app", up.addr())
            .route(
                "quota",
                "key = \"header:X-Client\"\ncost = \"header:X-Cost\"\nmax_cost = 500\n\
                 limits = [\n  { quota = 300, window = \"1m\", unit = \"cost\" },\n  \
                 { requests = 1, window = \"1m\", key = \"global\" },\n]",
            )
            .build();
        let proxy = ready_on_every_protocol(&toml, &ca, 1).remove(0);
        for (i, protocol) in [Protocol::H1, Protocol::H2c, Protocol::H2Tls]
            .into_iter()
            .enumerate()
        {
            let client = protocol.client(&ca.ca_pem());
            let target = url(&proxy, protocol, "/");
            let who = format!("c{i}");
            let headers = [("x-client", who.as_str()), ("x-cost", "70")];
            let seen = fetch_with(&client, &target, &headers, protocol.version()).await;
            // The first request takes the one global place; every later one is refused by it.
            assert_eq!(seen.status, if i == 0 { 200 } else { 429 }, "{seen:?}");
            let items = parse_ratelimit(seen.ratelimit.as_deref().unwrap_or_default());
            let cost = items.iter().find(|it| it.name.ends_with("-cost"));
            let cost = cost.unwrap_or_else(|| panic!("{seen:?}"));
            let want = if i == 0 { 230 } else { 300 };
            assert_eq!(cost.r, want, "{protocol:?}: {seen:?}");
        }
    }
}
