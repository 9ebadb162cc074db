//! One `[[routes]]` entry: a function per group of [`RouteSpec`], each checking its keys and
//! building its part, so a new route option is checked where the part it joins is built.
//!
//! A route with several mistakes reports the first in this order: name, match, upstream, key,
//! limits, answers, smoothing, counting.

use std::collections::HashSet;

use http::Method;

use super::super::raw::{RawLimit, RawRoute};
use super::super::{
    Answers, ConfigError, Counting, HostMatch, KeySpec, LimitKeys, RouteMatch, RouteSpec,
    UpstreamSpec,
};
use super::plan::RawPlanEntry;
use super::{RouteDefaults, Validator};
use crate::limiter::Limit;
use crate::response::ratelimit_headers::policy_name;

impl Validator<'_> {
    /// Route `i`: every group checked and built; `names` collects the names seen so far.
    pub(super) fn route(
        &self,
        i: usize,
        r: RawRoute,
        upstreams: &[UpstreamSpec],
        defaults: RouteDefaults,
        names: &mut HashSet<String>,
        plans: &[RawPlanEntry<'_>],
    ) -> Result<RouteSpec, ConfigError> {
        self.route_name(i, &r, names)?;
        let matching = self.route_match(i, &r)?;
        let Some(upstream) = (upstreams.iter()).position(|u| &u.name == r.upstream.get_ref())
        else {
            return self.err(
                Some(r.upstream.span()),
                format!("routes[{i}].upstream"),
                format!("no [upstreams.{}] is defined", r.upstream.get_ref()),
            );
        };
        let key = self.key(&r.key, &format!("routes[{i}].key"))?;
        let own: Vec<_> = (r.limits.iter().enumerate())
            .map(|(j, l)| (format!("routes[{i}].limits[{j}]"), l))
            .collect();
        let plans = self.route_plans(i, &r, plans, &key, &own, defaults.shared)?;
        let (limits, limit_keys, cost) = match &plans {
            Some(p) => {
                let chosen = &p.each[p.chosen];
                (
                    chosen.limits.clone(),
                    chosen.limit_keys.clone(),
                    chosen.cost.clone(),
                )
            }
            None => {
                let (limits, keys) = self.limits(r.name.get_ref(), &own, &key)?;
                let cost = self.cost(i, &r, &limits)?;
                (limits, keys, cost)
            }
        };
        let answers = self.answers(i, &r, defaults)?;
        let smoothing = self.smoothing(i, &r, defaults.smoothing)?;
        let counting = self.counting(i, &r, defaults)?;
        Ok(RouteSpec {
            name: r.name.into_inner(),
            matching,
            upstream,
            key,
            limits,
            limit_keys,
            counting,
            answers,
            smoothing,
            cost,
            plans,
        })
    }

    /// `name`: the label of metrics and policy names, so restricted in spelling and unique.
    fn route_name(
        &self,
        i: usize,
        r: &RawRoute,
        names: &mut HashSet<String>,
    ) -> Result<(), ConfigError> {
        let name = r.name.get_ref();
        let spelled = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if name.is_empty() || !name.chars().all(spelled) {
            return self.err(
                Some(r.name.span()),
                format!("routes[{i}].name"),
                "must be non-empty ASCII letters, digits, '-', '_' or '.'",
            );
        }
        if !names.insert(name.clone()) {
            let message = format!("duplicate route name {name:?}");
            return self.err(Some(r.name.span()), format!("routes[{i}].name"), message);
        }
        Ok(())
    }

    /// `host`, `path_prefix`, `path_case_insensitive` and `methods`.
    fn route_match(&self, i: usize, r: &RawRoute) -> Result<RouteMatch, ConfigError> {
        let host = match &r.host {
            None => None,
            Some(h) => match HostMatch::parse(h.get_ref()) {
                Some(m) => Some(m),
                None => {
                    let message = "must be a host name or \"*.domain\"";
                    return self.err(Some(h.span()), format!("routes[{i}].host"), message);
                }
            },
        };
        if !r.path_prefix.get_ref().starts_with('/') {
            let (span, key) = (
                Some(r.path_prefix.span()),
                format!("routes[{i}].path_prefix"),
            );
            return self.err(span, key, "must start with '/'");
        }
        // Routes match the normalised path: a prefix in another form would never match, and
        // its traffic would go to the next route (often an unlimited catch-all).
        let prefix = r.path_prefix.get_ref();
        let normal = crate::request::path::normalize_path(prefix);
        if crate::request::path::ambiguous(prefix) || normal != prefix.as_str() {
            let (span, key) = (
                Some(r.path_prefix.span()),
                format!("routes[{i}].path_prefix"),
            );
            let message = format!(
                "routes match the path decoded, without empty segments, `;parameters` or dot \
                 segments, so this prefix would never match; write it as {normal:?}"
            );
            return self.err(span, key, message);
        }
        Ok(RouteMatch {
            host,
            path_prefix: r.path_prefix.get_ref().clone(),
            path_case_insensitive: r.path_case_insensitive,
            methods: self.methods(i, r)?,
        })
    }

    /// `methods`, upper-cased, with `HEAD` added to a list that has `GET`.
    fn methods(&self, i: usize, r: &RawRoute) -> Result<Vec<Method>, ConfigError> {
        let mut methods = Vec::with_capacity(r.methods.len() + 1);
        for (j, m) in r.methods.iter().enumerate() {
            match Method::from_bytes(m.get_ref().to_ascii_uppercase().as_bytes()) {
                Ok(method) => methods.push(method),
                Err(_) => {
                    return self.err(
                        Some(m.span()),
                        format!("routes[{i}].methods[{j}]"),
                        format!("invalid method {:?}", m.get_ref()),
                    )
                }
            }
        }
        // HEAD is answered by the GET handler upstream; without this a GET-only limit could
        // be bypassed with HEAD (nginx's `limit_except GET` covers HEAD for the same reason).
        if methods.contains(&Method::GET) && !methods.contains(&Method::HEAD) {
            methods.push(Method::HEAD);
        }
        Ok(methods)
    }

    /// `limits` (each given with where it is written: `routes[i].limits[j]`,
    /// `plans.<name>.limits[j]`) of the route whose policy names start with `prefix`: each a
    /// log, or slots when it has a `resolution`, under the route's `key` or its own; no two with
    /// one id under one key, nor with one policy name.
    pub(super) fn limits(
        &self,
        prefix: &str,
        list: &[(String, &RawLimit)],
        key: &KeySpec,
    ) -> Result<(Vec<Limit>, LimitKeys), ConfigError> {
        let mut limits = Vec::with_capacity(list.len());
        let mut keys = LimitKeys::default();
        let mut of_limit = Vec::with_capacity(list.len());
        for (base, l) in list {
            let k = self.limit_key(base, l, key, &mut keys.keys)?;
            let (limit, span) = self.limit(base, l)?;
            // Two limits with one id under one key would share one log (one Redis key, one
            // policy name).
            let same = |(x, xk): (&Limit, &u8)| x.id() == limit.id() && *xk == k;
            if limits.iter().zip(&of_limit).any(same) {
                let (what, field) = match limit.is_lease() {
                    true => ("`concurrent` limit", "concurrent"),
                    false => ("window", "window"),
                };
                let window = humantime::format_duration(limit.window);
                return self.err(
                    Some(span),
                    format!("{base}.{field}"),
                    format!("duplicate {what} {window} in the limits of {prefix:?}"),
                );
            }
            limits.push(limit);
            of_limit.push(k);
        }
        global_last(&mut keys.keys, &mut of_limit);
        if of_limit.iter().any(|&k| k > 0) {
            keys.of_limit = of_limit;
        }
        self.policy_names(prefix, list, &limits, &keys)?;
        Ok((limits, keys))
    }

    /// No two limits with one policy name (two keys may read the same in one: see
    /// [`key_suffix`](crate::response::ratelimit_headers::key_suffix)).
    fn policy_names(
        &self,
        prefix: &str,
        list: &[(String, &RawLimit)],
        limits: &[Limit],
        keys: &LimitKeys,
    ) -> Result<(), ConfigError> {
        let mut seen = HashSet::new();
        for (j, limit) in limits.iter().enumerate() {
            let policy = policy_name(prefix, limit, keys.key_of(j));
            if !seen.insert(policy.clone()) {
                let (base, raw) = &list[j];
                let span = (raw.key.as_ref().map(|k| k.span()))
                    .or_else(|| raw.window.as_ref().map(|w| w.span()))
                    .or_else(|| raw.concurrent.as_ref().map(|c| c.span()));
                let message = format!("a second limit with the policy name {policy:?}");
                return self.err(span, format!("{base}.key"), message);
            }
        }
        Ok(())
    }

    /// `<base>.key` of a limit: 0 for the route's key (none given, or the same key), else the
    /// limit's own key's place in `keys` plus 1 (added there when new).
    fn limit_key(
        &self,
        base: &str,
        l: &RawLimit,
        route_key: &KeySpec,
        keys: &mut Vec<KeySpec>,
    ) -> Result<u8, ConfigError> {
        let Some(raw) = &l.key else { return Ok(0) };
        let at = format!("{base}.key");
        let key = self.key(raw, &at)?;
        if key == *route_key {
            return Ok(0);
        }
        let k = match keys.iter().position(|x| *x == key) {
            Some(k) => k,
            None if keys.len() < LimitKeys::MAX => {
                keys.push(key);
                keys.len() - 1
            }
            None => {
                let message = format!(
                    "at most {} distinct limit keys per route besides the route's",
                    LimitKeys::MAX
                );
                return self.err(Some(raw.span()), at, message);
            }
        };
        Ok(u8::try_from(k + 1).unwrap_or(u8::MAX))
    }

    /// `deny_status`, `deny_body_file`, `deny_content_type`, `response_headers` and
    /// `legacy_headers`.
    fn answers(
        &self,
        i: usize,
        r: &RawRoute,
        defaults: RouteDefaults,
    ) -> Result<Answers, ConfigError> {
        Ok(Answers {
            deny: self.deny_answer(i, r, defaults.deny_status)?,
            response_headers: self.response_headers(i, &r.response_headers)?,
            legacy_headers: r.legacy_headers,
        })
    }

    /// `shadow`, `exempt`, `count_status` and `on_error` (the store's unless overridden).
    fn counting(
        &self,
        i: usize,
        r: &RawRoute,
        defaults: RouteDefaults,
    ) -> Result<Counting, ConfigError> {
        let on_error = match &r.on_error {
            Some(v) => self.on_error(v, defaults.shared, format!("routes[{i}].on_error"))?,
            None => defaults.on_error,
        };
        Ok(Counting {
            shadow: r.shadow,
            exempt: self.exempt(&r.exempt),
            count_status: self.count_status(i, r.count_status.as_ref())?,
            on_error,
        })
    }
}

/// Move a `global` key of its own to the end of `keys` (renumbering `of_limit`): stores
/// reserve a decision's buckets in key order, and the one every client shares is best reserved
/// last (see [`crate::limiter::Buckets::groups`]).
fn global_last(keys: &mut Vec<KeySpec>, of_limit: &mut [u8]) {
    let Some(g) = keys.iter().position(|k| *k == KeySpec::Global) else {
        return;
    };
    let moved = keys.remove(g);
    keys.push(moved);
    // Key g + 1 becomes keys.len(); those after it move down by one.
    let (from, to) = (g + 1, keys.len());
    for k in of_limit.iter_mut() {
        let n = usize::from(*k);
        *k = match n {
            n if n == from => to,
            n if n > from => n - 1,
            n => n,
        } as u8;
    }
}
