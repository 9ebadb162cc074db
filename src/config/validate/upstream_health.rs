//! `[upstreams.*]` health keys: the active check's path, and what re-resolution needs.

use super::super::raw::RawUpstream;
use super::super::{ActiveCheck, ConfigError, UpstreamHealth};
use super::Validator;

impl Validator<'_> {
    /// `health_check`, `max_fails`, `fail_timeout`, `resolve_interval` of `upstreams.<name>`.
    pub(super) fn upstream_health(
        &self,
        name: &str,
        up: &RawUpstream,
    ) -> Result<UpstreamHealth, ConfigError> {
        let key = |k: &str| format!("upstreams.{name}.{k}");
        let check = match &up.health_check {
            None => None,
            Some(raw) => {
                let path = match &raw.path {
                    None => None,
                    Some(path) => {
                        let text = path.get_ref();
                        let ok = text.starts_with('/')
                            && text.parse::<http::uri::PathAndQuery>().is_ok();
                        if !ok {
                            return self.err(
                                Some(path.span()),
                                key("health_check.path"),
                                format!("{text:?} is not an origin-form path (e.g. \"/healthz\")"),
                            );
                        }
                        Some(text.clone())
                    }
                };
                Some(ActiveCheck {
                    path,
                    interval: raw.interval.0,
                    timeout: raw.timeout.0,
                    healthy: raw.healthy.0,
                    unhealthy: raw.unhealthy.0,
                })
            }
        };
        // A re-resolved address has no configured host of its own to send as SNI.
        if let (Some(every), true, None) = (&up.resolve_interval, up.tls, &up.sni) {
            return self.err(
                Some(every.span()),
                key("resolve_interval"),
                "with tls = true needs sni (the name to check re-resolved addresses against)",
            );
        }
        Ok(UpstreamHealth {
            check,
            max_fails: up.max_fails,
            fail_timeout: up.fail_timeout.0,
            resolve_interval: up.resolve_interval.as_ref().map(|d| d.get_ref().0),
        })
    }
}
