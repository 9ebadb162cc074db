//! A running proxy's admin listener and `/metrics`, parsed.

use super::{http_get_blocking, Proxy};

impl Proxy {
    /// The inspector's count of `who`'s first limit on `route`, once `done` holds for it (a
    /// `settle` correction lands just after its response); the last count read if it never
    /// does within 5 s.
    pub fn count_when(&self, route: &str, who: &str, done: impl Fn(u64) -> bool) -> u64 {
        let path = format!("/api/v1/window?route={route}&client={who}");
        let mut last = 0;
        super::super::control::poll_until(std::time::Duration::from_secs(5), || {
            let (status, body) = self.admin_get(&path);
            assert_eq!(status, 200, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            last = v["limits"][0]["count"].as_u64().unwrap_or(0);
            done(last)
        });
        last
    }

    /// Status and body of `GET <path>` on the admin listener.
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        http_get_blocking(self.admin, path)
            .unwrap_or_else(|e| panic!("admin GET {path}: {e}; log:\n{}", self.log()))
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics_text(&self) -> String {
        let (status, body) = self.admin_get("/metrics");
        assert_eq!(status, 200, "/metrics answered {status}: {body}");
        body
    }

    /// One sample of `/metrics`, written as in the exposition format with labels in any order,
    /// e.g. `slidegate_requests_total{route="x",decision="denied"}` or
    /// `slidegate_no_route_total`. `None` when there is no such series.
    pub fn metric(&self, sample: &str) -> Option<f64> {
        find_sample(&self.metrics_text(), sample)
    }

    /// Like [`Proxy::metric`] but for a counter that must exist: its value as an integer.
    pub fn counter(&self, sample: &str) -> u64 {
        let text = self.metrics_text();
        match find_sample(&text, sample) {
            Some(v) => v as u64,
            None => panic!("no sample {sample} in /metrics:\n{text}"),
        }
    }

    /// `slidegate_store_errors_total`, summed over every kind.
    pub fn store_errors(&self) -> u64 {
        ["timeout", "unavailable", "backend"]
            .iter()
            .map(|k| self.counter(&format!("slidegate_store_errors_total{{kind=\"{k}\"}}")))
            .sum()
    }

    /// `slidegate_requests_total{route,decision}`.
    pub fn decisions(&self, route: &str, decision: &str) -> u64 {
        self.counter(&format!(
            "slidegate_requests_total{{route=\"{route}\",decision=\"{decision}\"}}"
        ))
    }
}

/// Find `name{labels}` (labels in any order) in Prometheus text.
fn find_sample(text: &str, sample: &str) -> Option<f64> {
    let want = parse_series(sample.trim())?;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (parse_series(series)? == want).then(|| value.parse().ok())?
        })
}

/// `name{a="x",b="y"}` as (name, sorted label pairs).
fn parse_series(s: &str) -> Option<(String, Vec<(String, String)>)> {
    let Some((name, rest)) = s.split_once('{') else {
        return Some((s.to_string(), Vec::new()));
    };
    let body = rest.strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let end = after.find('"')?;
        labels.push((
            key.trim_start_matches(',').trim().to_string(),
            after[..end].to_string(),
        ));
        rest = after[end + 1..].trim_start_matches(',');
    }
    labels.sort();
    Some((name.to_string(), labels))
}
