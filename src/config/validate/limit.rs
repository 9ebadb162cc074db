//! One entry of a route's `limits`: exactly one of `requests` or `quota` (with its `window`,
//! and maybe a `resolution`: see `cost.rs`) or `concurrent` (with its `lease_ttl`), each error
//! naming the key at fault.

use std::ops::Range;

use super::super::raw::{RawLimit, RawUnit, DEFAULT_LEASE_TTL};
use super::super::ConfigError;
use super::Validator;
use crate::limiter::algo::{KindOptions, OptionError};
use crate::limiter::{Kind, Limit, LimitKind, Unit};

impl Validator<'_> {
    /// The limit at `base` (`routes[i].limits[j]`, `plans.<name>.limits[j]`) as a [`Limit`],
    /// with the span to point at when the route names it twice.
    pub(super) fn limit(
        &self,
        base: &str,
        l: &RawLimit,
    ) -> Result<(Limit, Range<usize>), ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        let options = l.kind_options();
        if !options.is_empty() {
            return self.kind_limit(base, l, &options);
        }
        let windowed = l.requests.is_some() || l.quota.is_some();
        match (windowed, &l.concurrent) {
            (true, Some(c)) => self.err(
                Some(c.span()),
                at("concurrent"),
                "a limit is either `requests` or `quota` (per `window`) or `concurrent`, not both",
            ),
            (false, None) => self.err(
                None,
                base.to_string(),
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
                Ok((self.windowed(base, l, w)?, w.span()))
            }
        }
    }

    /// A limit whose options name a kind of its own (`Kind::from_options`): its amount
    /// (`requests`, or `quota` of its `unit`), none of the keys of a window or a lease, and its
    /// options as the kind reads them, each error naming the option at fault.
    fn kind_limit(
        &self,
        base: &str,
        l: &RawLimit,
        options: &[(&'static str, Range<usize>, String)],
    ) -> Result<(Limit, Range<usize>), ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        let (first, span) = (options[0].0, options[0].1.clone());
        let stray = [("window", l.window.as_ref().map(|w| w.span()))]
            .into_iter()
            .chain([("resolution", l.resolution.as_ref().map(|r| r.span()))])
            .chain([("concurrent", l.concurrent.as_ref().map(|c| c.span()))])
            .chain([("lease_ttl", l.lease_ttl.as_ref().map(|t| t.span()))]);
        for (field, stray) in stray {
            if let Some(stray) = stray {
                let message = format!("a limit with `{first}` has no `{field}`");
                return self.err(Some(stray), at(field), message);
            }
        }
        let unit = match l.unit.as_ref().map(|u| *u.get_ref()) {
            Some(RawUnit::Cost) => Unit::Cost,
            Some(RawUnit::Requests) | None => Unit::Requests,
        };
        let amount = match (&l.requests, &l.quota, unit) {
            (Some(r), None, Unit::Requests) | (None, Some(r), _) => r.get_ref().get(),
            (Some(r), _, Unit::Cost) => {
                let message = "a cost limit counts a `quota` of cost units, not `requests`";
                return self.err(Some(r.span()), at("requests"), message);
            }
            (Some(_), Some(q), _) => {
                let message = "a limit is `requests` or a `quota`, not both";
                return self.err(Some(q.span()), at("quota"), message);
            }
            (None, None, _) => {
                let message = format!("a limit with `{first}` needs a `quota` (or `requests`)");
                return self.err(Some(span), at("quota"), message);
            }
        };
        let given: Vec<(&'static str, &str)> =
            options.iter().map(|(n, _, v)| (*n, v.as_str())).collect();
        let kind_options = KindOptions {
            given: &given,
            unit,
        };
        match LimitKind::from_options(&kind_options) {
            Some(Ok((kind, window))) => Ok((Limit::of(amount, window, kind), span)),
            Some(Err(OptionError { option, message })) => {
                let span = options
                    .iter()
                    .find(|(n, ..)| *n == option)
                    .map(|(_, s, _)| s.clone());
                self.err(span, at(option), message)
            }
            None => self.err(Some(span), at(first), "no kind of limit takes this option"),
        }
    }
}
