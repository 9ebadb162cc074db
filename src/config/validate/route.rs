//! One `[[routes]]` entry: a function per group of [`RouteSpec`], each checking its keys and
//! building its part, so a new route option is checked where the part it joins is built.
//!
//! A route with several mistakes reports the first in this order: name, match, upstream, key,
//! limits, answers, smoothing, counting.

use std::collections::HashSet;

use http::Method;

use super::super::raw::RawRoute;
use super::super::{
    Answers, ConfigError, Counting, HostMatch, RouteMatch, RouteSpec, UpstreamSpec,
};
use super::{slots, RouteDefaults, Validator};
use crate::limiter::Limit;

impl Validator<'_> {
    /// Route `i`: every group checked and built; `names` collects the names seen so far.
    pub(super) fn route(
        &self,
        i: usize,
        r: RawRoute,
        upstreams: &[UpstreamSpec],
        defaults: RouteDefaults,
        names: &mut HashSet<String>,
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
        let limits = self.limits(i, &r)?;
        let answers = self.answers(i, &r, defaults)?;
        let smoothing = self.smoothing(i, &r, defaults.smoothing)?;
        let counting = self.counting(i, &r, defaults)?;
        Ok(RouteSpec {
            name: r.name.into_inner(),
            matching,
            upstream,
            key,
            limits,
            counting,
            answers,
            smoothing,
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

    /// `limits`: each a log, or slots when it has a `resolution`; no two with one id.
    fn limits(&self, i: usize, r: &RawRoute) -> Result<Vec<Limit>, ConfigError> {
        let mut limits = Vec::with_capacity(r.limits.len());
        for (j, l) in r.limits.iter().enumerate() {
            let window = l.window.get_ref().0;
            let limit = match &l.resolution {
                None => Limit::log(l.requests.get(), window),
                Some(res) => match slots::check(window, res.get_ref().0) {
                    Ok(resolution) => Limit::slotted(l.requests.get(), window, resolution),
                    Err(e) => {
                        let key = format!("routes[{i}].limits[{j}].resolution");
                        return self.err(Some(res.span()), key, e);
                    }
                },
            };
            // Two limits with one id would share one log (one Redis key, one policy name).
            if limits.iter().any(|x: &Limit| x.id() == limit.id()) {
                return self.err(
                    Some(l.window.span()),
                    format!("routes[{i}].limits[{j}].window"),
                    format!(
                        "duplicate window {} on route {:?}",
                        humantime::format_duration(window),
                        r.name.get_ref()
                    ),
                );
            }
            limits.push(limit);
        }
        Ok(limits)
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
