//! A route's policy keys beyond its limits: who is exempt, what a denial answers, and how long
//! a denial may wait for room (`max_delay`, `max_queue`).

use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderValue, StatusCode};
use ipnet::IpNet;
use toml::Spanned;

use super::super::raw::RawRoute;
use super::super::raw::RawStore;
use super::super::{ConfigError, DenyAnswer, DenyBody, Smoothing};
use super::Validator;

/// Statuses a denial may use: nginx's `limit_req_status` range.
const DENY_STATUSES: std::ops::RangeInclusive<u16> = 400..=599;

impl Validator<'_> {
    /// A `deny_status` value (`key` names it in errors).
    pub(super) fn deny_status(
        &self,
        raw: &Spanned<u16>,
        key: String,
    ) -> Result<StatusCode, ConfigError> {
        let code = *raw.get_ref();
        match StatusCode::from_u16(code) {
            Ok(status) if DENY_STATUSES.contains(&code) => Ok(status),
            _ => self.err(
                Some(raw.span()),
                key,
                "a status from 400 to 599 (429 by default; 503 as many nginx setups use)",
            ),
        }
    }

    /// The route's deny answer: its own `deny_status` or the store's default, and its body.
    pub(super) fn deny_answer(
        &self,
        i: usize,
        r: &RawRoute,
        default_status: StatusCode,
    ) -> Result<DenyAnswer, ConfigError> {
        let status = match &r.deny_status {
            Some(raw) => self.deny_status(raw, format!("routes[{i}].deny_status"))?,
            None => default_status,
        };
        let body = match (&r.deny_body_file, &r.deny_content_type) {
            (None, None) => None,
            (None, Some(t)) => {
                return self.err(
                    Some(t.span()),
                    format!("routes[{i}].deny_content_type"),
                    "is the type of `deny_body_file`, which is not set",
                )
            }
            (Some(file), kind) => {
                // The type first: it is checked from the text alone, the file by reading it.
                let content_type = match kind {
                    None => HeaderValue::from_static("text/plain; charset=utf-8"),
                    Some(t) => match HeaderValue::from_str(t.get_ref()) {
                        Ok(v) if t.get_ref().contains('/') => v,
                        _ => {
                            return self.err(
                                Some(t.span()),
                                format!("routes[{i}].deny_content_type"),
                                "a media type such as \"text/html; charset=utf-8\"",
                            )
                        }
                    },
                };
                Some(DenyBody {
                    file: self.body_file(i, file)?,
                    content_type,
                })
            }
        };
        Ok(DenyAnswer { status, body })
    }

    fn body_file(&self, i: usize, file: &Spanned<PathBuf>) -> Result<PathBuf, ConfigError> {
        if file.get_ref().as_os_str().is_empty() {
            return self.err(
                Some(file.span()),
                format!("routes[{i}].deny_body_file"),
                "an empty path",
            );
        }
        // As every other path in the file: as written (relative to the working directory).
        // Read here too, so that an unreadable file is named with its line.
        let path = file.get_ref();
        if let Err(e) = crate::config::file::read_bounded(path, crate::config::file::MAX_DENY_BODY)
        {
            let message = format!("cannot read {}: {e}", path.display());
            return self.err(
                Some(file.span()),
                format!("routes[{i}].deny_body_file"),
                message,
            );
        }
        Ok(path.clone())
    }

    /// The route's `count_status`: a non-empty list of distinct statuses from 100 to 599.
    pub(super) fn count_status(
        &self,
        i: usize,
        raw: Option<&Spanned<Vec<Spanned<u16>>>>,
    ) -> Result<Option<Vec<StatusCode>>, ConfigError> {
        let Some(list) = raw else {
            return Ok(None);
        };
        let key = format!("routes[{i}].count_status");
        if list.get_ref().is_empty() {
            return self.err(
                Some(list.span()),
                key,
                "an empty list would give every admission back (no limit at all); remove the key \
                 to count every admission",
            );
        }
        let mut statuses: Vec<StatusCode> = Vec::with_capacity(list.get_ref().len());
        for code in list.get_ref() {
            let status = match StatusCode::from_u16(*code.get_ref()) {
                Ok(s) if (100..=599).contains(code.get_ref()) => s,
                _ => return self.err(Some(code.span()), key, "a status from 100 to 599"),
            };
            if statuses.contains(&status) {
                return self.err(Some(code.span()), key, format!("{status} is listed twice"));
            }
            statuses.push(status);
        }
        Ok(Some(statuses))
    }

    /// The route's `exempt` networks, as the proxy compares them.
    pub(super) fn exempt(&self, raw: &[IpNet]) -> Vec<IpNet> {
        raw.iter()
            .copied()
            .map(crate::keys::canonical_net)
            .collect()
    }

    /// `[store]`'s `max_delay` and `max_queue`, the routes' defaults.
    pub(super) fn smoothing_default(
        &self,
        store: &RawStore,
    ) -> Result<SmoothingDefault, ConfigError> {
        Ok(SmoothingDefault {
            max_delay: store.max_delay.map(|d| d.0),
            max_queue: match &store.max_queue {
                Some(q) => self.max_queue(q, "store.max_queue".into())?,
                None => Smoothing::DEFAULT_QUEUE,
            },
        })
    }

    /// The route's smoothing: its own `max_delay` or the store's (`"0s"` turns a store default
    /// off), with its own `max_queue` or the store's. A `max_queue` without any `max_delay`
    /// would silently do nothing, so it is an error.
    pub(super) fn smoothing(
        &self,
        i: usize,
        r: &RawRoute,
        default: SmoothingDefault,
    ) -> Result<Option<Smoothing>, ConfigError> {
        let max_delay = r.max_delay.map(|d| d.0).or(default.max_delay);
        let max_queue = match &r.max_queue {
            Some(q) => self.max_queue(q, format!("routes[{i}].max_queue"))?,
            None => default.max_queue,
        };
        match (max_delay, &r.max_queue) {
            (Some(max_delay), _) if !max_delay.is_zero() => Ok(Some(Smoothing {
                max_delay,
                max_queue,
            })),
            (_, Some(q)) => self.err(
                Some(q.span()),
                format!("routes[{i}].max_queue"),
                "is the queue of `max_delay`, which is not set (or \"0s\") on this route",
            ),
            _ => Ok(None),
        }
    }

    fn max_queue(&self, raw: &Spanned<u32>, key: String) -> Result<u32, ConfigError> {
        let q = *raw.get_ref();
        if (1..=Smoothing::MAX_QUEUE).contains(&q) {
            return Ok(q);
        }
        let message = format!(
            "a number of waiting requests from 1 to {} (default {})",
            Smoothing::MAX_QUEUE,
            Smoothing::DEFAULT_QUEUE
        );
        self.err(Some(raw.span()), key, message)
    }
}

/// What routes inherit from `[store]` for smoothing.
#[derive(Clone, Copy)]
pub(super) struct SmoothingDefault {
    /// `store.max_delay` (`None` or zero: routes do not wait unless they say so).
    max_delay: Option<Duration>,
    /// `store.max_queue`, or [`Smoothing::DEFAULT_QUEUE`].
    max_queue: u32,
}
