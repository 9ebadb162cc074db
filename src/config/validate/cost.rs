//! A route's cost (`cost`, `max_cost`) and what each limit counts (`requests`, or `quota` with
//! `unit = "cost"`): the checks of cost-weighted limits, beside the route's other limit checks.

use std::sync::Arc;

use http::header::HeaderName;

use toml::Spanned;

use super::super::raw::{RawCost, RawLimit, RawRoute, RawUnit, Window};
use super::super::ConfigError;
use super::{slots, Validator};
use crate::limiter::{Limit, Unit};
use crate::request::cost::{Cost, CostSource, Settle, DEFAULT_SCAN_BYTES};
use crate::response::usage::UsagePaths;

/// `settle_scan_bytes`: at least 1 KiB (a usage report's event), at most 64 MiB (each
/// response in flight may hold this much).
const SCAN_BYTES: std::ops::RangeInclusive<u64> = 1 << 10..=64 << 20;

impl Validator<'_> {
    /// The limit at `base` over its `window` `w`: a request limit (`requests`, a log or
    /// slotted by `resolution`) or a cost limit (`quota`, `unit = "cost"`, always slotted: by
    /// its `resolution`, or the largest whole-ms divisor of the window up to a sixtieth of it).
    pub(super) fn windowed(
        &self,
        base: &str,
        l: &RawLimit,
        w: &Spanned<Window>,
    ) -> Result<Limit, ConfigError> {
        let window = w.get_ref().0;
        let at = |field: &str| format!("{base}.{field}");
        let unit = l.unit.as_ref().map_or(RawUnit::Requests, |u| *u.get_ref());
        let (requests, quota) = (l.requests.as_ref(), l.quota.as_ref());
        let amount = match (
            unit,
            requests.map(|r| *r.get_ref()),
            quota.map(|q| *q.get_ref()),
        ) {
            (RawUnit::Requests, Some(n), None) | (RawUnit::Cost, None, Some(n)) => n.get(),
            (RawUnit::Cost, Some(_), _) => {
                let why = "a cost limit counts `quota` cost units, not `requests`";
                return self.err(Some(w.span()), at("requests"), why);
            }
            (RawUnit::Requests, _, Some(_)) => {
                let why = "`quota` counts cost units: add unit = \"cost\" (or use `requests`)";
                return self.err(Some(w.span()), at("quota"), why);
            }
            (_, None, None) => {
                let why = "a limit needs `requests` (or `quota` with unit = \"cost\")";
                return self.err(Some(w.span()), at("requests"), why);
            }
        };
        let resolution = match (&l.resolution, unit) {
            (Some(res), _) => slots::resolution_in(window, res.get_ref().0)
                .map(Some)
                .or_else(|e| self.err(Some(res.span()), at("resolution"), e))?,
            (None, RawUnit::Cost) => Some(
                slots::cost_default(window)
                    .or_else(|e| self.err(Some(w.span()), at("window"), e))?,
            ),
            (None, RawUnit::Requests) => None,
        };
        Ok(match (unit, resolution) {
            (RawUnit::Cost, Some(res)) => Limit::cost(amount, window, res),
            (_, Some(res)) => Limit::slotted(amount, window, res),
            (_, None) => Limit::log(amount, window),
        })
    }

    /// `cost` and `max_cost` of route `i`, with the smallest quota of its cost limits.
    pub(super) fn cost(
        &self,
        i: usize,
        r: &RawRoute,
        limits: &[Limit],
    ) -> Result<Cost, ConfigError> {
        let source = match r.cost.as_ref().map(|c| (c.span(), c.get_ref())) {
            None => CostSource::default(),
            Some((_, RawCost::Fixed(n))) => CostSource::Fixed(*n),
            Some((span, RawCost::Text(text))) => {
                let name = text.strip_prefix("header:").map(HeaderName::try_from);
                match name {
                    Some(Ok(name)) => CostSource::Header(name),
                    _ => {
                        let why = "an integer or \"header:<Name>\" (a request header's value)";
                        return self.err(Some(span), format!("routes[{i}].cost"), why);
                    }
                }
            }
        };
        let fits = (limits.iter())
            .filter(|l| l.unit() == Unit::Cost)
            .map(|l| l.requests)
            .min();
        let max = r.max_cost.as_ref().map(|m| *m.get_ref());
        let settle = self.settle(i, r, fits)?;
        Ok(Cost {
            source,
            max,
            fits,
            reserve_max: self.reserve(i, r, (max, fits), settle.is_some())?,
            settle,
        })
    }

    /// `settle` of route `i` (with `settle_scan_bytes`): a response field's name, or paths
    /// into the response's JSON body, on a route with a cost limit (`fits`).
    fn settle(
        &self,
        i: usize,
        r: &RawRoute,
        fits: Option<u32>,
    ) -> Result<Option<Settle>, ConfigError> {
        let scan = r.settle_scan_bytes.as_ref();
        let Some(settle) = &r.settle else {
            if let Some(scan) = scan {
                let why = "settle_scan_bytes bounds settle = \"json:…\": add that settle";
                return self.err(
                    Some(scan.span()),
                    format!("routes[{i}].settle_scan_bytes"),
                    why,
                );
            }
            return Ok(None);
        };
        let at = format!("routes[{i}].settle");
        let text = settle.get_ref();
        let source = if let Some(paths) = text.strip_prefix("json:") {
            let paths = UsagePaths::parse(paths).or_else(|e| {
                let why = format!("\"json:<path>[+<path>…]\", dotted paths into the body: {e}");
                self.err(Some(settle.span()), at.clone(), why)
            })?;
            let scan_bytes = match scan {
                None => DEFAULT_SCAN_BYTES,
                Some(s) if SCAN_BYTES.contains(s.get_ref()) => *s.get_ref() as usize,
                Some(s) => {
                    let why = "bytes from 1024 to 67108864 (64 MiB)";
                    return self.err(
                        Some(s.span()),
                        format!("routes[{i}].settle_scan_bytes"),
                        why,
                    );
                }
            };
            let paths = Arc::new(paths);
            Settle::Body { paths, scan_bytes }
        } else {
            let name = text.strip_prefix("header:").map(HeaderName::try_from);
            let Some(Ok(name)) = name else {
                let why = "\"header:<Name>\" (the response header or trailer with the real cost) \
                           or \"json:<path>\" (e.g. json:usage.total_tokens, in the JSON body)";
                return self.err(Some(settle.span()), at, why);
            };
            if let Some(scan) = scan {
                let why = "settle_scan_bytes bounds settle = \"json:…\", not a header";
                return self.err(
                    Some(scan.span()),
                    format!("routes[{i}].settle_scan_bytes"),
                    why,
                );
            }
            Settle::Field(name)
        };
        if fits.is_none() {
            let why = "settle corrects a cost limit's charge: add a limit with unit = \"cost\"";
            return self.err(Some(settle.span()), at, why);
        }
        Ok(Some(source))
    }

    /// `reserve` of route `i`: `"max_cost"`, with a `max_cost` that fits the smallest cost
    /// quota (`fits`) and a `settle` to bring the reservation down to the real cost.
    fn reserve(
        &self,
        i: usize,
        r: &RawRoute,
        (max, fits): (Option<u32>, Option<u32>),
        settles: bool,
    ) -> Result<bool, ConfigError> {
        let Some(reserve) = &r.reserve else {
            return Ok(false);
        };
        let (at, span) = (format!("routes[{i}].reserve"), Some(reserve.span()));
        if reserve.get_ref() != "max_cost" {
            let why = "\"max_cost\" (every request reserves max_cost; without reserve, its cost)";
            return self.err(span, at, why);
        }
        let why = match (max, fits) {
            (_, None) => "reserve = \"max_cost\" needs a cost limit (unit = \"cost\")".to_owned(),
            (None, _) => "reserve = \"max_cost\" needs max_cost on the route".to_owned(),
            (Some(max), Some(quota)) if max > quota => format!(
                "max_cost {max} is over the smallest cost quota {quota}: every request would be \
                 refused"
            ),
            _ if !settles => "reserve = \"max_cost\" needs settle (else every request costs \
                              max_cost for good)"
                .to_owned(),
            _ => return Ok(true),
        };
        self.err(span, at, why)
    }
}
