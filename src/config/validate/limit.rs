//! One entry of a route's `limits`: exactly one of `requests` or `quota` (with its `window`,
//! and maybe a `resolution`: see `cost.rs`) or `concurrent` (with its `lease_ttl`), each error
//! naming the key at fault.

use std::ops::Range;

use super::super::raw::{RawLimit, DEFAULT_LEASE_TTL};
use super::super::ConfigError;
use super::Validator;
use crate::limiter::Limit;

impl Validator<'_> {
    /// `routes[i].limits[j]` as a [`Limit`], with the span to point at when the route names it
    /// twice.
    pub(super) fn limit(
        &self,
        i: usize,
        j: usize,
        l: &RawLimit,
    ) -> Result<(Limit, Range<usize>), ConfigError> {
        let at = |field: &str| format!("routes[{i}].limits[{j}].{field}");
        let windowed = l.requests.is_some() || l.quota.is_some();
        match (windowed, &l.concurrent) {
            (true, Some(c)) => self.err(
                Some(c.span()),
                at("concurrent"),
                "a limit is either `requests` or `quota` (per `window`) or `concurrent`, not both",
            ),
            (false, None) => self.err(
                None,
                format!("routes[{i}].limits[{j}]"),
                "a limit needs `requests` (with a `window`), `quota` (with unit = \"cost\") or \
                 `concurrent`",
            ),
            (false, Some(c)) => {
                let stray = [("window", l.window.as_ref().map(|w| w.span()))]
                    .into_iter()
                    .chain([("resolution", l.resolution.as_ref().map(|r| r.span()))])
                    .chain([("unit", l.unit.as_ref().map(|u| u.span()))]);
                for (field, span) in stray {
                    if let Some(span) = span {
                        let message = format!("a `concurrent` limit has no `{field}`: a lease lasts while its request runs (renewed), or `lease_ttl` past a crashed proxy");
                        return self.err(Some(span), at(field), message);
                    }
                }
                let ttl = l
                    .lease_ttl
                    .as_ref()
                    .map_or(DEFAULT_LEASE_TTL, |t| t.get_ref().0);
                Ok((Limit::lease(c.get_ref().get(), ttl), c.span()))
            }
            (true, None) => {
                let amount = l.requests.as_ref().or(l.quota.as_ref());
                if let Some(t) = &l.lease_ttl {
                    let message = "`lease_ttl` belongs to a `concurrent` limit";
                    return self.err(Some(t.span()), at("lease_ttl"), message);
                }
                let Some(w) = &l.window else {
                    let span = amount.map(|a| a.span());
                    return self.err(span, at("window"), "`requests` and `quota` need a `window`");
                };
                Ok((self.windowed((i, j), l, w)?, w.span()))
            }
        }
    }
}
