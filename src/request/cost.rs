//! A request's cost (`cost`, `max_cost` of a route): what it weighs in the route's cost limits
//! (`unit = "cost"`), read from a request header or fixed, and why a cost is refused (`400`,
//! nothing counted); and its settlement (`settle`): the real cost the upstream reports in a
//! response header or trailer, or in its JSON body, and what that does to the charge. Pure:
//! the proxy reads the fields, this decides.

use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::response::usage::UsagePaths;

use crate::keys::canonical::cgi_same;

/// Where a route's requests get their cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostSource {
    /// Every request costs this (`cost = 5`; the default is 1).
    Fixed(u32),
    /// The request's header of this name (`cost = "header:X-Token-Estimate"`); missing: 1.
    Header(HeaderName),
}

impl Default for CostSource {
    fn default() -> Self {
        CostSource::Fixed(1)
    }
}

/// A route's cost rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cost {
    /// Where the cost comes from.
    pub source: CostSource,
    /// `max_cost`: a request claiming more is refused.
    pub max: Option<u32>,
    /// The smallest `quota` of the route's cost limits (`None`: it has none): a cost above it
    /// could never be admitted, so it is refused at once rather than denied forever.
    pub fits: Option<u32>,
    /// `settle`: where the upstream reports the request's real cost, which corrects the
    /// charge.
    pub settle: Option<Settle>,
    /// `reserve = "max_cost"`: every request reserves `max_cost` (not its claim) and settles
    /// down to its real cost, so the quota is never exceeded.
    pub reserve_max: bool,
}

/// Where the upstream reports a request's real cost (`settle`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// `"header:<Name>"`: the response header or trailer of this name.
    Field(HeaderName),
    /// `"json:<path>[+<path>…]"`: the response's JSON body, or the last event carrying each
    /// path of a `text/event-stream`, read as it passes; a body or event over `scan_bytes`
    /// (`settle_scan_bytes`) is not read.
    Body {
        /// The paths summed.
        paths: Arc<UsagePaths>,
        /// The most bytes of a body, or of one event, kept to be read.
        scan_bytes: usize,
    },
}

/// `settle_scan_bytes` when not configured: 1 MiB, far above a chat completion's JSON.
pub const DEFAULT_SCAN_BYTES: usize = 1 << 20;

pub use crate::limiter::settle::Settlement;

/// Why a request's cost was refused: a `400` naming `cost`. The problem's `detail` names the
/// field and the figures ([`CostError::detail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CostError {
    /// Not a non-negative decimal integer (below 2^32).
    #[error("cost: the cost header is not a non-negative decimal integer")]
    Malformed,
    /// The header on more than one line, under two spellings (`X-Cost`, `X_Cost`), or a list
    /// (`1,2`): which one would count?
    #[error("cost: the cost header is given more than once")]
    Twice,
    /// More than `max_cost`.
    #[error("cost: the request's cost {cost} is over max_cost {max}")]
    OverMax {
        /// The request's cost.
        cost: u32,
        /// The route's `max_cost`.
        max: u32,
    },
    /// More than the smallest cost quota: no window could ever admit it.
    #[error("cost: the request's cost {cost} is over the route's quota {quota}")]
    OverQuota {
        /// The request's cost.
        cost: u32,
        /// The smallest `quota` of the route's cost limits.
        quota: u32,
    },
}

impl CostError {
    /// What the `400` says, for people: which field (or the route's fixed cost) and why.
    pub fn detail(&self, source: &CostSource) -> String {
        let field = match source {
            CostSource::Header(name) => format!("the {name} header"),
            CostSource::Fixed(n) => format!("the route's fixed cost {n}"),
        };
        match self {
            CostError::Malformed => format!(
                "cost: {field} must be one non-negative decimal integer below 4294967296 \
                 (digits only: no sign, fraction, inner space or list)"
            ),
            CostError::Twice => format!(
                "cost: {field} is given more than once (on two lines, as a list, or also \
                 spelled with '_' for '-'), so which one counts is unclear"
            ),
            CostError::OverMax { cost, max } => {
                format!("cost: {cost}, from {field}, is over the route's max_cost {max}")
            }
            CostError::OverQuota { cost, quota } => format!(
                "cost: {cost}, from {field}, is over {quota}, the route's smallest cost \
                 quota: no window could ever admit it"
            ),
        }
    }
}

impl Cost {
    /// True when the route has a cost limit, so the cost must be read and checked.
    pub fn is_weighted(&self) -> bool {
        self.fits.is_some()
    }

    /// The cost of a request with `headers`, checked against `max_cost` and the quota. On a
    /// route that settles, at least 1: a claim of 0 whose real cost never arrives (the
    /// upstream failed, or sent none) still counts.
    pub fn of(&self, headers: &HeaderMap) -> Result<u32, CostError> {
        let cost = match &self.source {
            CostSource::Fixed(n) => *n,
            CostSource::Header(name) => parse(spellings(headers, name))?.unwrap_or(1),
        };
        let cost = match self.settle {
            Some(_) => cost.max(1),
            None => cost,
        };
        if let Some(max) = self.max.filter(|max| cost > *max) {
            return Err(CostError::OverMax { cost, max });
        }
        if let Some(quota) = self.fits.filter(|quota| cost > *quota) {
            return Err(CostError::OverQuota { cost, quota });
        }
        // The claim was checked as ever; the reservation is the most a request may cost (the
        // validator made sure `max_cost` fits the smallest quota).
        match (self.reserve_max, self.max) {
            (true, Some(max)) => Ok(max),
            _ => Ok(cost),
        }
    }

    /// The response body scan's paths and bound, on a route that settles from the body.
    pub fn body_settle(&self) -> Option<(&Arc<UsagePaths>, usize)> {
        match &self.settle {
            Some(Settle::Body { paths, scan_bytes }) => Some((paths, *scan_bytes)),
            _ => None,
        }
    }

    /// A real cost as it is settled: on a `reserve = "max_cost"` route at most `max_cost`,
    /// the reservation (so no report can take the quota past its end).
    pub fn capped(&self, real: u32) -> u32 {
        match (self.reserve_max, self.max) {
            (true, Some(max)) => real.min(max),
            _ => real,
        }
    }

    /// The real cost the upstream reported in `fields` (the response header, or its trailers):
    /// `None` when the route does not settle or the field is absent; an error when it is not
    /// one non-negative decimal integer (the charge then stands).
    pub fn settled(&self, fields: &HeaderMap) -> Option<Result<u32, CostError>> {
        let Some(Settle::Field(name)) = &self.settle else {
            return None;
        };
        parse(fields.get_all(name).iter()).transpose()
    }
}

/// Every value of request header `name`, under every spelling a CGI server reads as it
/// (`X_Cost` for `X-Cost`: WSGI and PHP join them into one `HTTP_X_COST`), as the key headers
/// are read ([`crate::keys::canonical`]). A response's `settle` field is read as named: the
/// upstream is not the party that would spell it twice.
fn spellings<'a>(
    headers: &'a HeaderMap,
    name: &'a HeaderName,
) -> impl Iterator<Item = &'a HeaderValue> {
    let aliases =
        (headers.keys()).filter(move |k| *k != name && cgi_same(k.as_str(), name.as_str()));
    (headers.get_all(name).iter()).chain(aliases.flat_map(|k| headers.get_all(k)))
}

/// The one value of `values` as a decimal integer; `None` when there is none. HTTP/1 parsers have
/// already trimmed the value's surrounding whitespace, which an HTTP/2 peer may still send
/// (trimmed here too); what is left must be digits only: no sign, no fraction, no inner
/// space, no list.
fn parse<'a>(mut values: impl Iterator<Item = &'a HeaderValue>) -> Result<Option<u32>, CostError> {
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() || value.as_bytes().contains(&b',') {
        return Err(CostError::Twice);
    }
    let text = value.as_bytes().trim_ascii();
    if text.is_empty() || text.len() > 10 || !text.iter().all(u8::is_ascii_digit) {
        return Err(CostError::Malformed);
    }
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .map(Some)
        .ok_or(CostError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost() -> Cost {
        Cost {
            source: CostSource::Header(HeaderName::from_static("x-cost")),
            max: Some(500),
            fits: Some(1000),
            settle: None,
            reserve_max: false,
        }
    }

    fn with(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-cost", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_header_cost_is_digits_only_once_and_within_max() {
        let c = cost();
        assert_eq!(c.of(&with(&[])), Ok(1));
        assert_eq!(c.of(&with(&["0"])), Ok(0));
        assert_eq!(c.of(&with(&["500"])), Ok(500));
        assert_eq!(c.of(&with(&["007"])), Ok(7));
        for bad in ["abc", "-1", "1.5", "+3", "1 2", "", "99999999999"] {
            assert_eq!(c.of(&with(&[bad])), Err(CostError::Malformed), "{bad:?}");
        }
        assert_eq!(c.of(&with(&["1", "2"])), Err(CostError::Twice));
        assert_eq!(c.of(&with(&["1,2"])), Err(CostError::Twice));
        assert_eq!(
            c.of(&with(&["501"])),
            Err(CostError::OverMax {
                cost: 501,
                max: 500
            })
        );
    }

    #[test]
    fn the_cost_header_is_read_under_every_spelling_a_cgi_server_joins() {
        let c = cost();
        let spelled = |fields: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in fields {
                h.append(
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            h
        };
        assert_eq!(c.of(&spelled(&[("x_cost", "50")])), Ok(50));
        assert_eq!(c.of(&spelled(&[("x_Cost", "7")])), Ok(7));
        for twice in [
            &[("x-cost", "1"), ("x_cost", "50")][..],
            &[("x_cost", "5"), ("x_cost", "5")],
            &[("x_cost", "5"), ("x-cost", "5")],
        ] {
            assert_eq!(c.of(&spelled(twice)), Err(CostError::Twice), "{twice:?}");
        }
        assert_eq!(c.of(&spelled(&[("x-costs", "50"), ("xcost", "9")])), Ok(1));
        // The upstream's settle field is read as named.
        let settling = Cost {
            settle: Some(Settle::Field(HeaderName::from_static("x-cost"))),
            ..cost()
        };
        assert_eq!(settling.settled(&spelled(&[("x_cost", "9")])), None);
    }

    #[test]
    fn a_refusal_names_the_field_and_the_figures() {
        let header = CostSource::Header(HeaderName::from_static("x-token-estimate"));
        let said = |e: CostError| e.detail(&header);
        assert!(said(CostError::Malformed).contains("the x-token-estimate header must be"));
        assert!(said(CostError::Twice).contains("x-token-estimate header is given more"));
        let over = said(CostError::OverMax { cost: 9, max: 5 });
        assert!(
            over.contains("9, from the x-token-estimate header") && over.contains("max_cost 5")
        );
        let fixed = CostError::OverQuota { cost: 3, quota: 2 }.detail(&CostSource::Fixed(3));
        assert!(fixed.contains("the route's fixed cost 3") && fixed.contains("quota: no window"));
    }

    #[test]
    fn a_cost_over_the_smallest_quota_is_refused_at_once() {
        let c = Cost {
            max: None,
            ..cost()
        };
        assert_eq!(c.of(&with(&["1000"])), Ok(1000));
        assert_eq!(
            c.of(&with(&["1001"])),
            Err(CostError::OverQuota {
                cost: 1001,
                quota: 1000
            })
        );
        let fixed = Cost {
            source: CostSource::Fixed(3),
            max: None,
            fits: Some(2),
            settle: None,
            reserve_max: false,
        };
        assert_eq!(
            fixed.of(&HeaderMap::new()),
            Err(CostError::OverQuota { cost: 3, quota: 2 })
        );
    }

    #[test]
    fn a_settled_cost_is_read_once_and_corrects_the_charge_either_way() {
        let c = Cost {
            settle: Some(Settle::Field(HeaderName::from_static("x-cost"))),
            ..cost()
        };
        assert_eq!(c.settled(&with(&[])), None);
        assert_eq!(c.settled(&with(&["120"])), Some(Ok(120)));
        // An HTTP/2 upstream's field may keep the whitespace an HTTP/1 parser trims.
        assert_eq!(c.settled(&with(&[" 7\t"])), Some(Ok(7)));
        for bad in ["-3", "1e3", "12 3", "", "4294967296"] {
            assert_eq!(
                c.settled(&with(&[bad])),
                Some(Err(CostError::Malformed)),
                "{bad:?}"
            );
        }
        assert_eq!(c.settled(&with(&["1", "1"])), Some(Err(CostError::Twice)));
        let plain = cost();
        assert_eq!(
            plain.settled(&with(&["5"])),
            None,
            "a route that does not settle"
        );
        // A settling route reserves at least 1, so the charge has a counter to land in.
        assert_eq!(
            (c.of(&with(&["0"])), plain.of(&with(&["0"]))),
            (Ok(1), Ok(0))
        );
        assert_eq!(Settlement::of(50, 50), Settlement::Unchanged);
        assert_eq!(Settlement::of(50, 10), Settlement::GiveBack(40));
        assert_eq!(Settlement::of(1, 5000), Settlement::Charge(4999));
    }

    #[test]
    fn a_reserving_route_reserves_max_cost_whatever_the_claim() {
        let c = Cost {
            reserve_max: true,
            settle: Some(Settle::Field(HeaderName::from_static("x-used"))),
            ..cost()
        };
        assert_eq!(c.of(&with(&[])), Ok(500));
        assert_eq!(c.of(&with(&["1"])), Ok(500));
        assert_eq!(
            c.of(&with(&["abc"])),
            Err(CostError::Malformed),
            "still checked"
        );
        assert_eq!(
            c.of(&with(&["501"])),
            Err(CostError::OverMax {
                cost: 501,
                max: 500
            })
        );
        assert_eq!((c.capped(499), c.capped(9000)), (499, 500));
        assert_eq!(cost().capped(9000), 9000, "not reserving: no cap");
    }
}
