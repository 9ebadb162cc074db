//! One GET through the proxy over any [`Protocol`], and what came back of it: status, the
//! rate-limit fields, `Retry-After`, `Content-Type` and the body. Used by every test that runs
//! the same request over HTTP/1.1, h2c and HTTP/1.1 or HTTP/2 over TLS.

use super::proxy::Proxy;
use super::tls::Protocol;

/// The URL of `path` on the listener `protocol` uses (`localhost` on TLS, for the certificate).
pub fn url(proxy: &Proxy, protocol: Protocol, path: &str) -> String {
    if protocol.tls() {
        format!("https://localhost:{}{path}", proxy.tls_addr().port())
    } else {
        format!("http://{}{path}", proxy.addr())
    }
}

/// What a client sees of one answer, minus what legitimately differs between protocols.
#[derive(Debug, PartialEq)]
pub struct Seen {
    pub status: u16,
    pub policy: Option<String>,
    pub ratelimit: Option<String>,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
    pub body: String,
}

/// GET `url` as client `who` (`X-Client`), checking the HTTP version is `want`.
pub async fn fetch(client: &reqwest::Client, url: &str, who: &str, want: reqwest::Version) -> Seen {
    fetch_with(client, url, &[("x-client", who)], want).await
}

/// GET `url` with `headers`, checking the response came back in HTTP version `want`.
pub async fn fetch_with(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    want: reqwest::Version,
) -> Seen {
    let mut request = client.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let resp = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e:?}"));
    assert_eq!(resp.version(), want, "{url}");
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let (policy, ratelimit, retry_after, content_type) = (
        h("ratelimit-policy"),
        h("ratelimit"),
        h("retry-after"),
        h("content-type"),
    );
    Seen {
        status: resp.status().as_u16(),
        policy,
        ratelimit,
        retry_after,
        content_type,
        body: resp.text().await.expect("body"),
    }
}
