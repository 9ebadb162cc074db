//! `[store] urls`, the nodes a shared store starts from: a Cluster's seed nodes, or the
//! Sentinels (`backend = "redis_sentinel"`) with the master's name, login and database.
//! Nothing connects here (`slidegate -t` stays offline).

use toml::Spanned;

use super::super::raw::RawStore;
use super::super::secrets::EnvText;
use super::super::{Backend, ConfigError, RedisUrl, SentinelMaster};
use super::{Span, Validator};

/// The `[store]` keys of `backend = "redis_sentinel"`.
pub(super) const SENTINEL_KEYS: [&str; 5] = [
    "store.urls",
    "store.master_name",
    "store.master_username",
    "store.master_password",
    "store.db",
];

/// The Sentinel-only keys present in `raw`, with where they are (`urls` is checked with the
/// other backends' keys).
pub(super) fn sentinel_given(raw: &RawStore) -> [(&'static str, Option<Span>); 4] {
    [
        (
            "store.master_name",
            raw.master_name.as_ref().map(Spanned::span),
        ),
        (
            "store.master_username",
            raw.master_username.as_ref().map(Spanned::span),
        ),
        (
            "store.master_password",
            raw.master_password.as_ref().map(Spanned::span),
        ),
        ("store.db", raw.db.as_ref().map(Spanned::span)),
    ]
}

impl Validator<'_> {
    /// `store.urls`: required, at least one, each a Redis URL.
    pub(super) fn redis_urls(
        &self,
        raw: &RawStore,
        what: &str,
    ) -> Result<Vec<RedisUrl>, ConfigError> {
        let urls = self.required(raw.urls.as_ref(), &raw.backend, "store.urls")?;
        if urls.get_ref().is_empty() {
            return self.err(
                Some(urls.span()),
                "store.urls",
                format!("needs at least one {what}"),
            );
        }
        let url = |(i, u): (usize, &EnvText)| {
            self.redis_url(urls.span(), format!("store.urls[{i}]"), &u.0)
        };
        urls.get_ref().iter().enumerate().map(url).collect()
    }

    /// The Sentinel backend's keys; the keys of other backends were refused already.
    pub(super) fn sentinel(&self, raw: &RawStore) -> Result<Backend, ConfigError> {
        let urls = self.redis_urls(raw, "Sentinel")?;
        if let Some(i) = urls.iter().position(|u| u.info.redis_settings().db() != 0) {
            // A Sentinel has no databases: a `/db` in its URL would make every lookup fail
            // with `SELECT` refused. The master's database has a key of its own.
            return self.err(
                raw.urls.as_ref().map(Spanned::span),
                format!("store.urls[{i}]"),
                "a Sentinel URL takes no database; set store.db for the master's",
            );
        }
        let name = self.required(raw.master_name.as_ref(), &raw.backend, "store.master_name")?;
        if name.get_ref().is_empty() || name.get_ref().chars().any(char::is_whitespace) {
            return self.err(
                Some(name.span()),
                "store.master_name",
                "must be the non-empty name of `sentinel monitor <name> …`, without whitespace",
            );
        }
        if let (Some(user), None) = (&raw.master_username, &raw.master_password) {
            return self.err(
                Some(user.span()),
                "store.master_username",
                "needs store.master_password (an ACL login is a user and a password)",
            );
        }
        let db = match &raw.db {
            Some(db) if *db.get_ref() < 0 => {
                return self.err(Some(db.span()), "store.db", "must be 0 or more");
            }
            Some(db) => *db.get_ref(),
            None => 0,
        };
        Ok(Backend::RedisSentinel {
            urls,
            master: SentinelMaster {
                name: name.get_ref().clone(),
                username: raw.master_username.as_ref().map(|u| u.get_ref().clone()),
                password: (raw.master_password.as_ref())
                    .map(|p| super::super::Secret::new(p.get_ref().0.clone())),
                db,
            },
        })
    }
}
