//! The inspector page in a real headless chromium (Debian's, over chromedriver): routes listed,
//! a bucket with entries shows its countdown ring, the countdown decreases, the reset button
//! empties the bucket, and the red "next to free" marker stays on top of entries that share its
//! millisecond. A screenshot is saved in the proxy's temporary directory (printed).

use crate::common;

use std::time::{Duration, Instant};

use common::admin::{reset, window};
use common::browser::Browser;
use common::http::connect;
use common::proxy::{get, ConfigBuilder, Proxy};
use common::upstream::Upstream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_routes_ring_countdown_and_resets() {
    let up = Upstream::start();
    let toml = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route(
            "login",
            "path_prefix = \"/login\"\n\
             limits = [{ requests = 3, window = \"20s\" }, { requests = 10, window = \"1m\" }]",
        )
        .route(
            "api",
            "path_prefix = \"/api\"\nkey = \"header:X-Api-Key\"\n\
             limits = [{ requests = 100, window = \"1m\" }]",
        )
        .build();
    let proxy = Proxy::start(&toml);
    // Fill the 20 s limit: 3 admitted, then a 429.
    for want in [200, 200, 200, 429] {
        assert_eq!(get(proxy.addr(), "/login").await.status, want);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    let browser = Browser::start().await;
    let url = format!(
        "http://{}/?route=login&client=127.0.0.1",
        proxy.admin_addr()
    );
    let started = Instant::now();
    browser.goto(&url).await;
    let routes = browser
        .wait_for(
            "routes listed",
            "const rows = [...document.querySelectorAll('#routes tbody tr')];
             return rows.length ? rows.map(r => r.dataset.route) : null;",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(routes, serde_json::json!(["login", "api"]));
    let load_ms = browser
        .eval("const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd;")
        .await;

    // The deep link opened the bucket: the full limit shows its ring and a countdown.
    let ring_script = "const c = document.querySelector('[data-limit=\"login-20s\"]');
        if (!c) return null;
        const ring = c.querySelector('svg.ring');
        const t = c.querySelector('.countdown');
        if (!ring || getComputedStyle(ring).display === 'none' || !t.dataset.ms) return null;
        return { ms: Number(t.dataset.ms), full: ring.classList.contains('full'),
                 remaining: c.querySelector('.remaining').textContent,
                 entries: c.querySelectorAll('.axis rect.entry').length };";
    let first = browser
        .wait_for(
            "ring with a countdown",
            ring_script,
            Duration::from_secs(10),
        )
        .await;
    println!(
        "page: routes listed {:?} after navigation; loadEventEnd {load_ms} ms",
        started.elapsed()
    );
    assert_eq!(first["full"], true, "{first}");
    assert_eq!(first["entries"], 3, "three entries on the axis: {first}");
    assert!(
        first["remaining"].as_str().unwrap().starts_with("0 of 3"),
        "{first}"
    );
    let first_ms = first["ms"].as_f64().unwrap();
    assert!(first_ms > 0.0 && first_ms <= 20_000.0, "{first}");
    // The countdown runs: a later sample is smaller (bounded wait, no fixed sleep).
    let deadline = Instant::now() + Duration::from_secs(5);
    let second_ms = loop {
        let v = browser.eval(ring_script).await;
        let ms = v["ms"].as_f64().unwrap_or(first_ms);
        if ms < first_ms - 200.0 {
            break ms;
        }
        assert!(
            Instant::now() < deadline,
            "countdown stuck at {first_ms} ms"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("countdown: {first_ms} ms, then {second_ms} ms");
    // And it agrees with the API (same store clock), within the polling period.
    let api = window(&proxy, "login", "127.0.0.1").await;
    let api_reset = api["limits"][0]["reset_ms"].as_f64().unwrap();
    assert!(
        (api_reset - second_ms).abs() < 2_000.0,
        "page {second_ms} vs API {api_reset}"
    );
    // The store clock is shown.
    let clock = browser
        .eval("return document.querySelector('#store-clock').textContent;")
        .await;
    assert!(clock.as_str().unwrap().contains("UTC"), "{clock}");

    let shot = proxy.dir().join("inspector.png");
    browser.screenshot(&shot).await;
    println!("screenshot: {}", shot.display());
    if let Ok(copy) = std::env::var("SLIDEGATE_SCREENSHOT") {
        std::fs::copy(&shot, copy).expect("copy screenshot");
    }

    // Reset from the page: the bucket empties, the ring goes, the proxy admits again.
    browser.click("#reset").await;
    browser
        .wait_for(
            "bucket empty after reset",
            "const c = document.querySelector('[data-limit=\"login-20s\"]');
             const r = c && c.querySelector('.remaining').textContent;
             const ring = c && c.querySelector('svg.ring');
             return !!r && r.startsWith('3 of 3') && getComputedStyle(ring).display === 'none';",
            Duration::from_secs(10),
        )
        .await;
    let status = browser
        .eval("return document.querySelector('#status').textContent;")
        .await;
    assert!(status.as_str().unwrap().contains("reset"), "{status}");
    assert_eq!(
        window(&proxy, "login", "127.0.0.1").await["limits"][0]["count"],
        0
    );
    assert_eq!(get(proxy.addr(), "/login").await.status, 200);
}

/// A composite route: the page shows one field per part, sends their JSON list, and shows the
/// bucket the proxy counted (the one the API names for that list); a deep link fills the fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_inspects_a_composite_key_by_its_parts() {
    let up = Upstream::start();
    let toml = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route(
            "tenant",
            "key = [\"header:X-Api-Key\", \"client_ip\"]\n\
             limits = [{ requests = 2, window = \"20s\" }]",
        )
        .build();
    let proxy = Proxy::start(&toml);
    let key = [("x-api-key", "k1")];
    for want in [200, 200, 429] {
        let reply = common::proxy::send(proxy.addr(), "GET", "/", &key).await;
        assert_eq!(reply.status, want);
    }
    // Another key from the same address: its own bucket.
    let other = [("x-api-key", "k2")];
    let reply = common::proxy::send(proxy.addr(), "GET", "/", &other).await;
    assert_eq!(reply.status, 200);

    let browser = Browser::start().await;
    browser
        .goto(&format!("http://{}/?route=tenant", proxy.admin_addr()))
        .await;
    let fields = browser
        .wait_for(
            "one field per part",
            "const f = [...document.querySelectorAll('#parts input')];
             return f.length ? { parts: f.map(i => i.dataset.part),
                 single: document.querySelector('#client').hidden } : null;",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(
        fields,
        serde_json::json!({"parts": ["header:x-api-key", "client_ip"], "single": true})
    );
    browser
        .eval(
            "document.querySelector('#part-0').value = 'k1';
             document.querySelector('#part-1').value = '127.0.0.1';
             document.querySelector('#bucket-form button[type=submit]').click();
             return true;",
        )
        .await;
    let card = "const c = document.querySelector('[data-limit=\"tenant-20s\"]');
        if (!c || !c.querySelector('.countdown').dataset.ms) return null;
        return { remaining: c.querySelector('.remaining').textContent,
                 entries: c.querySelectorAll('.axis rect.entry').length,
                 url: location.search };";
    let seen = browser
        .wait_for("the composite bucket", card, Duration::from_secs(10))
        .await;
    assert!(
        seen["remaining"].as_str().unwrap().starts_with("0 of 2"),
        "{seen}"
    );
    assert_eq!(seen["entries"], 2, "{seen}");
    let client = r#"["k1","127.0.0.1"]"#;
    assert_eq!(
        seen["url"],
        format!("?route=tenant&client={}", common::admin::enc(client)),
        "{seen}"
    );
    assert_eq!(
        window(&proxy, "tenant", client).await["limits"][0]["count"],
        2
    );
    let shot = proxy.dir().join("inspector-composite.png");
    browser.screenshot(&shot).await;
    println!("composite: {seen}; screenshot: {}", shot.display());
    if let Ok(copy) = std::env::var("SLIDEGATE_SCREENSHOT_COMPOSITE") {
        std::fs::copy(&shot, copy).expect("copy screenshot");
    }

    // A deep link to k2's bucket fills the fields and shows its one entry.
    let k2 = r#"["k2", "127.0.0.1"]"#;
    browser
        .goto(&format!(
            "http://{}/?route=tenant&client={}",
            proxy.admin_addr(),
            common::admin::enc(k2)
        ))
        .await;
    let filled = browser
        .wait_for(
            "fields filled and one entry shown",
            "const c = document.querySelector('[data-limit=\"tenant-20s\"]');
             const r = c && c.querySelector('.remaining').textContent;
             if (!r || !r.startsWith('1 of 2')) return null;
             return [...document.querySelectorAll('#parts input')].map(i => i.value);",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(filled, serde_json::json!(["k2", "127.0.0.1"]));
}

/// Two entries of the same millisecond sit at the same x on the axis. The red "next to free"
/// marker belongs to the oldest of them and must stay visible: the element painted on top at
/// its position is the marker itself, not an entry of the same millisecond drawn over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_to_free_marker_stays_visible_when_entries_tie() {
    let up = Upstream::start();
    let toml = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route(
            "login",
            "path_prefix = \"/login\"\nlimits = [{ requests = 2, window = \"20s\" }]",
        )
        .build();
    let proxy = Proxy::start(&toml);
    // Two requests sent at once on connections opened beforehand are usually admitted within
    // one millisecond; when they are not, the bucket is reset and the pair sent again. The
    // store's own timestamps (the API's entries) say whether the tie happened.
    let mut tie = None;
    for attempt in 1..=50 {
        let (a, b) = (connect(proxy.addr()).await, connect(proxy.addr()).await);
        let (a, b) = (a.expect("connect"), b.expect("connect"));
        let (ra, rb) = tokio::join!(a.send("GET", "/login", &[]), b.send("GET", "/login", &[]));
        assert_eq!((ra.unwrap().status, rb.unwrap().status), (200, 200));
        let entries = window(&proxy, "login", "127.0.0.1").await["limits"][0]["entries_ms"].clone();
        // The API gives fractional milliseconds (µs / 1000); the axis draws both at one x.
        let ms = |i: usize| entries[i].as_f64().expect("entry ms").floor();
        if ms(0) == ms(1) {
            tie = Some((attempt, entries));
            break;
        }
        reset(&proxy, "login", "127.0.0.1").await;
    }
    let (attempt, entries) = tie.expect("no two admissions in the same millisecond in 50 tries");
    println!("tie on attempt {attempt}: {entries}");

    let browser = Browser::start().await;
    browser
        .goto(&format!(
            "http://{}/?route=login&client=127.0.0.1",
            proxy.admin_addr()
        ))
        .await;
    // Evaluated in one script run, so no animation frame redraws the axis in between.
    let seen = browser
        .wait_for(
            "a full bucket with its marker",
            "const c = document.querySelector('[data-limit=\"login-20s\"]');
             if (!c) return null;
             const rects = [...c.querySelectorAll('.axis rect.entry')];
             const pivot = c.querySelector('.axis rect.entry.pivot');
             if (rects.length !== 2 || !pivot) return null;
             const box = pivot.getBoundingClientRect();
             const top = document.elementFromPoint(box.x + box.width / 2, box.y + box.height / 2);
             return { pivot_ms: Number(pivot.dataset.ms),
                      oldest_ms: Math.min(...rects.map(r => Number(r.dataset.ms))),
                      on_top: top === pivot,
                      on_top_class: top ? top.getAttribute('class') : null,
                      fill: getComputedStyle(pivot).fill };",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(
        seen["pivot_ms"], seen["oldest_ms"],
        "marker on the oldest: {seen}"
    );
    assert_eq!(seen["on_top"], true, "marker covered: {seen}");
    let shot = proxy.dir().join("inspector-tie.png");
    browser.screenshot(&shot).await;
    println!("tie: {seen}; screenshot: {}", shot.display());
}

/// A cost limit in debt (a settled cost over the quota) and a concurrency limit with a lease
/// held, as the page shows them: `… left · N in window · D in debt` and `… · N held now`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_cost_debt_and_the_leases_held() {
    use common::upstream::{DELAY_HEADER, FIELD_HEADER};
    let up = Upstream::start();
    let toml = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route(
            "chat",
            "path_prefix = \"/v1/\"\nkey = \"header:X-Client\"\ncost = \"header:X-Cost\"\n\
             settle = \"header:X-Tokens-Used\"\n\
             limits = [{ quota = 1000, window = \"1m\", unit = \"cost\" }]",
        )
        .route(
            "stream",
            "path_prefix = \"/s/\"\nkey = \"header:X-Client\"\n\
             limits = [{ concurrent = 2, lease_ttl = \"30s\" }]",
        )
        .build();
    let proxy = Proxy::start(&toml);
    let settled = [
        ("x-client", "u1"),
        ("x-cost", "10"),
        (FIELD_HEADER, "X-Tokens-Used: 1500"),
    ];
    let reply = common::proxy::send(proxy.addr(), "GET", "/v1/x", &settled).await;
    assert_eq!(reply.status, 200);
    // The settlement lands just after the response.
    let deadline = Instant::now() + Duration::from_secs(5);
    while window(&proxy, "chat", "u1").await["limits"][0]["count"] != 1500 {
        assert!(Instant::now() < deadline, "never settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A request held upstream keeps its lease while the page looks.
    let addr = proxy.addr();
    let held = tokio::spawn(async move {
        // Long enough to outlast chromium's start on a busy machine (4 s did not once).
        let h = [("x-client", "u1"), (DELAY_HEADER, "10000")];
        common::proxy::send(addr, "GET", "/s/x", &h).await.status
    });
    let browser = Browser::start().await;
    let text = |route: &str, limit: &str| {
        let url = format!("http://{}/?route={route}&client=u1", proxy.admin_addr());
        let js = format!(
            "const c = document.querySelector('[data-limit=\"{limit}\"]');
             const r = c && c.querySelector('.remaining').textContent;
             return r && r.includes('{}') ? r : null;",
            if route == "chat" { "debt" } else { "held" }
        );
        (url, js)
    };
    let (url, js) = text("chat", "chat-60s@1s-cost");
    browser.goto(&url).await;
    let debt = browser
        .wait_for("the debt", &js, Duration::from_secs(10))
        .await;
    assert_eq!(debt, "0 of 1000 left · 1500 in window · 500 in debt");
    let (url, js) = text("stream", "stream-concurrent");
    browser.goto(&url).await;
    let leases = browser
        .wait_for("a lease", &js, Duration::from_secs(10))
        .await;
    assert!(
        !held.is_finished(),
        "the held request ended before the page looked"
    );
    assert_eq!(leases, "1 of 2 left · 1 held now");
    assert_eq!(held.await.unwrap(), 200);
}
