//! A route's cost (`cost`, `max_cost`) and what each limit counts (`requests`, or `quota` with
//! `unit = "cost"`): the checks of cost-weighted limits, beside the route's other limit checks.

use http::header::HeaderName;

use toml::Spanned;

use super::super::raw::{RawCost, RawLimit, RawRoute, RawUnit, Window};
use super::super::ConfigError;
use super::{slots, Validator};
use crate::limiter::{Limit, Unit};
use crate::request::cost::{Cost, CostSource};

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
            (Some(res), _) => slots::check(window, res.get_ref().0)
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
        Ok(Cost {
            source,
            max: r.max_cost.as_ref().map(|m| *m.get_ref()),
            fits,
            settle: self.settle(i, r, fits)?,
        })
    }

    /// `settle` of route `i`: a response field's name, on a route with a cost limit (`fits`).
    fn settle(
        &self,
        i: usize,
        r: &RawRoute,
        fits: Option<u32>,
    ) -> Result<Option<HeaderName>, ConfigError> {
        let Some(settle) = &r.settle else {
            return Ok(None);
        };
        let at = format!("routes[{i}].settle");
        let name = settle.get_ref().strip_prefix("header:");
        let Some(Ok(name)) = name.map(HeaderName::try_from) else {
            let why = "\"header:<Name>\": the response header or trailer with the real cost";
            return self.err(Some(settle.span()), at, why);
        };
        if fits.is_none() {
            let why = "settle corrects a cost limit's charge: add a limit with unit = \"cost\"";
            return self.err(Some(settle.span()), at, why);
        }
        Ok(Some(name))
    }
}
