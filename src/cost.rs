//! A request's cost (`cost`, `max_cost` of a route): what it weighs in the route's cost limits
//! (`unit = "cost"`), read from a request header or fixed, and why a cost is refused (`400`,
//! nothing counted). Pure: the proxy reads the headers, this decides.

use http::header::{HeaderMap, HeaderName};

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
}

/// Why a request's cost was refused: a `400` naming `cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CostError {
    /// Not a non-negative decimal integer (below 2^32).
    #[error("cost: the cost header is not a non-negative decimal integer")]
    Malformed,
    /// The header on more than one line, or a list (`1,2`): which one would count?
    #[error("cost: the cost header is given more than once")]
    Twice,
    /// More than `max_cost`.
    #[error("cost: the request's cost is over max_cost")]
    OverMax,
    /// More than the smallest cost quota: no window could ever admit it.
    #[error("cost: the request's cost is over the route's quota")]
    OverQuota,
}

impl Cost {
    /// True when the route has a cost limit, so the cost must be read and checked.
    pub fn is_weighted(&self) -> bool {
        self.fits.is_some()
    }

    /// The cost of a request with `headers`, checked against `max_cost` and the quota.
    pub fn of(&self, headers: &HeaderMap) -> Result<u32, CostError> {
        let cost = match &self.source {
            CostSource::Fixed(n) => *n,
            CostSource::Header(name) => parse(headers, name)?,
        };
        if self.max.is_some_and(|max| cost > max) {
            return Err(CostError::OverMax);
        }
        if self.fits.is_some_and(|quota| cost > quota) {
            return Err(CostError::OverQuota);
        }
        Ok(cost)
    }
}

/// The header's one value as a decimal integer; missing: 1. HTTP/1 parsers have already
/// trimmed the value's surrounding whitespace (and HTTP/2 refuses it), as for keys; what is
/// left must be digits only: no sign, no fraction, no inner space, no list.
fn parse(headers: &HeaderMap, name: &HeaderName) -> Result<u32, CostError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(1);
    };
    if values.next().is_some() || value.as_bytes().contains(&b',') {
        return Err(CostError::Twice);
    }
    let text = value.as_bytes();
    if text.is_empty() || text.len() > 10 || !text.iter().all(u8::is_ascii_digit) {
        return Err(CostError::Malformed);
    }
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
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
        assert_eq!(c.of(&with(&["501"])), Err(CostError::OverMax));
    }

    #[test]
    fn a_cost_over_the_smallest_quota_is_refused_at_once() {
        let c = Cost {
            max: None,
            ..cost()
        };
        assert_eq!(c.of(&with(&["1000"])), Ok(1000));
        assert_eq!(c.of(&with(&["1001"])), Err(CostError::OverQuota));
        let fixed = Cost {
            source: CostSource::Fixed(3),
            max: None,
            fits: Some(2),
        };
        assert_eq!(fixed.of(&HeaderMap::new()), Err(CostError::OverQuota));
    }
}
