//! `slidegate -T`: the configuration as this process would run it, printed as TOML that
//! `slidegate -t` accepts again (like `nginx -T`).
//!
//! The file is read into its serde schema again, which fills in every default, and printed
//! from it; what the validator derives (the pid file and upgrade socket paths,
//! `tls_min_version` with a TLS listener, each route's inherited `on_error` and `deny_status`,
//! and the `[store]` and `[client_ip]` defaults the schema leaves unset: `on_error`,
//! `deny_status`, `max_queue`, a Sentinel `db`, the key prefixes) is added from the model; a
//! one-Redis `url` is printed with its database written out (`/0` when it names none). A
//! `[[tls.certs]]` entry without `names` is printed without them: they are read from its
//! certificate. Secrets are replaced by [`REDACTED`]: `server.admin_token`,
//! `store.master_password` and the password of every `store.url`/`store.urls` entry, whether
//! written in the file or taken from `${ENV}`. Files (`password_file`, `admin_token_file`) are
//! shown by path; their contents are never read here.

use redis::IntoConnectionInfo;
use toml::{Table, Value};

use super::{raw, Backend, Config, ConfigError, OnError, Smoothing};

/// What a secret is printed as. Visible ASCII, so the printed file still passes `-t`.
pub const REDACTED: &str = "REDACTED";

/// `server.admin_token` as printed: [`REDACTED`] lengthened to the 16 bytes a token must have,
/// so the output still passes `-t`.
pub const REDACTED_TOKEN: &str = "REDACTED-admin-token";

impl Config {
    /// The effective configuration as TOML text, secrets redacted (see the module docs).
    pub fn effective_toml(&self) -> Result<String, ConfigError> {
        let text =
            super::file::read_text(&self.source, super::file::MAX_CONFIG).map_err(|source| {
                ConfigError::Io {
                    file: self.source.clone(),
                    source,
                }
            })?;
        let invalid = |message: String| ConfigError::Invalid {
            file: self.source.clone(),
            line: None,
            key: "(top level)".into(),
            message,
        };
        let raw: raw::RawConfig = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let mut doc = Table::try_from(&raw).map_err(|e| invalid(e.to_string()))?;
        self.add_derived(&mut doc);
        redact(&mut doc);
        let body = toml::to_string(&doc).map_err(|e| invalid(e.to_string()))?;
        Ok(format!(
            "# slidegate -T: {} with every default filled in; secrets are {REDACTED:?}.\n\
             # This process runs {} proxy thread(s).\n{body}",
            self.source.display(),
            self.server.threads,
        ))
    }

    /// Values the validator derives rather than the schema's defaults.
    fn add_derived(&self, doc: &mut Table) {
        let path = |p: &std::path::Path| Value::String(p.to_string_lossy().into_owned());
        if let Some(Value::Table(server)) = doc.get_mut("server") {
            server
                .entry("pid_file")
                .or_insert_with(|| path(&self.server.pid_file));
            server
                .entry("upgrade_sock")
                .or_insert_with(|| path(&self.server.upgrade_sock));
            if let Some(tls) = &self.server.tls {
                let min = Value::String(tls.min_version.as_str().into());
                server.entry("tls_min_version").or_insert(min);
            }
        }
        self.add_store_defaults(doc);
        if let Some(Value::Table(client_ip)) = doc.get_mut("client_ip") {
            let prefixes = self.routing.client_ip.key_prefixes;
            client_ip
                .entry("ipv4_prefix")
                .or_insert(Value::Integer(i64::from(prefixes.v4)));
            client_ip
                .entry("ipv6_prefix")
                .or_insert(Value::Integer(i64::from(prefixes.v6)));
        }
        let Some(Value::Array(routes)) = doc.get_mut("routes") else {
            return;
        };
        for (route, spec) in routes.iter_mut().zip(&self.routing.routes) {
            let Value::Table(route) = route else { continue };
            let on_error = serde_json::to_value(spec.counting.on_error)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned));
            if let Some(on_error) = on_error {
                route.entry("on_error").or_insert(Value::String(on_error));
            }
            route
                .entry("deny_status")
                .or_insert(Value::Integer(i64::from(spec.answers.deny.status.as_u16())));
            lease_ttls(route);
            add_cost_resolutions(route, &spec.limits);
            if let Some((_, scan_bytes)) = spec.cost.body_settle() {
                let bytes = Value::Integer(scan_bytes as i64);
                route.entry("settle_scan_bytes").or_insert(bytes);
            }
            plan_refresh(route, spec.plans.as_ref());
        }
    }
}

/// A plan read from Redis: its `refresh`, the default written out.
fn plan_refresh(route: &mut Table, plans: Option<&super::RoutePlans>) {
    let Some(super::PlanSource::Redis { refresh }) = plans.map(|p| &p.source) else {
        return;
    };
    if let Some(Value::Table(plan)) = route.get_mut("plan") {
        let refresh = humantime::format_duration(*refresh).to_string();
        plan.entry("refresh").or_insert(Value::String(refresh));
    }
}

/// Each `concurrent` limit's `lease_ttl`, its default written out.
fn lease_ttls(route: &mut Table) {
    let Some(Value::Array(limits)) = route.get_mut("limits") else {
        return;
    };
    for limit in limits.iter_mut() {
        if let Value::Table(limit) = limit {
            if limit.contains_key("concurrent") {
                let ttl = humantime::format_duration(super::raw::DEFAULT_LEASE_TTL).to_string();
                limit.entry("lease_ttl").or_insert(Value::String(ttl));
            }
        }
    }
}

/// A cost limit's `resolution` when the file gives none: the one the validator picked.
fn add_cost_resolutions(route: &mut Table, limits: &[crate::limiter::Limit]) {
    let Some(Value::Array(raw)) = route.get_mut("limits") else {
        return;
    };
    for (raw, limit) in raw.iter_mut().zip(limits) {
        let (Value::Table(raw), Some(us)) = (raw, limit.resolution_us()) else {
            continue;
        };
        if limit.unit() == crate::limiter::Unit::Cost {
            let text = humantime::format_duration(std::time::Duration::from_micros(us));
            raw.entry("resolution")
                .or_insert(Value::String(text.to_string()));
        }
    }
}

impl Config {
    /// `[store]` keys whose default the schema leaves to the validator: `on_error` (which
    /// depends on the backend), `deny_status`, `max_queue` and, with Sentinel, `db`. Written
    /// out so that `-T` shows what the routes inherit. `max_delay` has no default (no waiting).
    fn add_store_defaults(&self, doc: &mut Table) {
        let Some(Value::Table(store)) = doc.get_mut("store") else {
            return;
        };
        let on_error = match self.store.backend {
            Backend::Memory => OnError::Allow,
            _ => OnError::Local,
        };
        let on_error = serde_json::to_value(on_error)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned));
        if let Some(on_error) = on_error {
            store.entry("on_error").or_insert(Value::String(on_error));
        }
        store
            .entry("deny_status")
            .or_insert(Value::Integer(i64::from(
                http::StatusCode::TOO_MANY_REQUESTS.as_u16(),
            )));
        store
            .entry("max_queue")
            .or_insert(Value::Integer(i64::from(Smoothing::DEFAULT_QUEUE)));
        if let Backend::RedisSentinel { master, .. } = &self.store.backend {
            store.entry("db").or_insert(Value::Integer(master.db));
        }
    }
}

/// Replace every secret in `doc` by [`REDACTED`].
fn redact(doc: &mut Table) {
    let secret = || Value::String(REDACTED.into());
    if let Some(Value::Table(server)) = doc.get_mut("server") {
        if let Some(token) = server.get_mut("admin_token") {
            *token = Value::String(REDACTED_TOKEN.into());
        }
    }
    let Some(Value::Table(store)) = doc.get_mut("store") else {
        return;
    };
    if let Some(password) = store.get_mut("master_password") {
        *password = secret();
    }
    let urls = store
        .iter_mut()
        .flat_map(|(key, value)| match (key.as_str(), value) {
            ("url", url) => vec![(url, true)],
            ("urls", Value::Array(urls)) => urls.iter_mut().map(|u| (u, false)).collect(),
            _ => Vec::new(),
        });
    for (url, one_redis) in urls {
        if let Value::String(text) = url {
            *text = match one_redis {
                true => with_db_text(&redacted_url_text(text)),
                false => redacted_url_text(text),
            };
        }
    }
}

/// A one-Redis URL with its database written out (`redis://h:6379` as `redis://h:6379/0`):
/// there the URL is where `[store].db` lives (the `db` key is the Sentinel's), so `-T` shows
/// which database the limits are kept in. Left as written when it carries more than the
/// address and credentials (a query, a Unix socket), which rewriting could lose.
fn with_db_text(url: &str) -> String {
    let Ok(info) = url.into_connection_info() else {
        return url.to_owned();
    };
    let canonical = super::redacted_url(&info).replace(":***@", &format!(":{REDACTED}@"));
    let db = info.redis_settings().db();
    let Some(bare) = canonical.strip_suffix(&format!("/{db}")) else {
        return url.to_owned();
    };
    match url == bare || url.strip_suffix('/') == Some(bare) || url == canonical {
        true => canonical,
        false => url.to_owned(),
    }
}

/// A Redis URL with its password replaced by [`REDACTED`] (unchanged without one).
fn redacted_url_text(url: &str) -> String {
    let Ok(info) = url.into_connection_info() else {
        return url.to_owned();
    };
    if info.redis_settings().password().is_none() {
        return url.to_owned();
    }
    super::redacted_url(&info).replace(":***@", &format!(":{REDACTED}@"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_replaced_and_the_rest_kept() {
        assert_eq!(
            redacted_url_text("rediss://app:hunter2@redis.internal:6380/2"),
            "rediss://app:REDACTED@redis.internal:6380/2"
        );
        assert_eq!(
            redacted_url_text("redis://:pw@10.0.0.1:6379"),
            "redis://:REDACTED@10.0.0.1:6379/0"
        );
        assert_eq!(
            redacted_url_text("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }

    #[test]
    fn a_one_redis_url_shows_its_database() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379/0"),
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/0"),
            ("redis://127.0.0.1:6379/3", "redis://127.0.0.1:6379/3"),
            ("rediss://app@h:6380", "rediss://app@h:6380/0"),
            ("redis://:REDACTED@h:1/2", "redis://:REDACTED@h:1/2"),
            (
                "redis://h:1/0?protocol=resp3",
                "redis://h:1/0?protocol=resp3",
            ),
        ] {
            assert_eq!(with_db_text(url), shown, "{url}");
        }
        let mut doc: Table =
            toml::from_str("[store]\nurl = \"redis://h:1\"\nurls = [\"redis://h:2\"]\n").unwrap();
        redact(&mut doc);
        let text = toml::to_string(&doc).unwrap();
        assert!(text.contains("\"redis://h:1/0\"") && text.contains("\"redis://h:2\""));
    }

    #[test]
    fn tokens_and_master_passwords_are_replaced() {
        let mut doc: Table = toml::from_str(
            "[server]\nadmin_token = \"t0k\"\n[store]\nmaster_password = \"m\"\n\
             urls = [\"redis://:a@h:1\", \"redis://h:2\"]\n",
        )
        .unwrap();
        redact(&mut doc);
        let text = toml::to_string(&doc).unwrap();
        for secret in ["t0k", "\"m\"", ":a@"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(text.contains("redis://h:2"), "{text}");
    }
}
