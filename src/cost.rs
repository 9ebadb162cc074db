//! A request's cost (`cost`, `max_cost` of a route): what it weighs in the route's cost limits
//! (`unit = "cost"`), read from a request header or fixed, and why a cost is refused (`400`,
//! nothing counted); and its settlement (`settle`): the real cost the upstream reports in a
//! response header or trailer, and what that does to the charge. Pure: the proxy reads the
//! fields, this decides.

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
    /// `settle = "header:<Name>"`: the response header or trailer of this name carries the
    /// request's real cost, which corrects the charge.
    pub settle: Option<HeaderName>,
}

/// What a settlement does to a request's charge in the route's cost limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// The real cost is what was charged.
    Unchanged,
    /// Charged more than the real cost: give the difference back.
    GiveBack(u32),
    /// Charged less: charge the difference on top (the bucket may go into debt).
    Charge(u32),
}

impl Settlement {
    /// The correction of a charge of `charged` by a real cost of `real`.
    pub fn of(charged: u32, real: u32) -> Settlement {
        match real.cmp(&charged) {
            std::cmp::Ordering::Equal => Settlement::Unchanged,
            std::cmp::Ordering::Less => Settlement::GiveBack(charged - real),
            std::cmp::Ordering::Greater => Settlement::Charge(real - charged),
        }
    }
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

    /// The cost of a request with `headers`, checked against `max_cost` and the quota. On a
    /// route that settles, at least 1: a claim of 0 whose real cost never arrives (the
    /// upstream failed, or sent none) still counts.
    pub fn of(&self, headers: &HeaderMap) -> Result<u32, CostError> {
        let cost = match &self.source {
            CostSource::Fixed(n) => *n,
            CostSource::Header(name) => parse(headers, name)?.unwrap_or(1),
        };
        let cost = match self.settle {
            Some(_) => cost.max(1),
            None => cost,
        };
        if self.max.is_some_and(|max| cost > max) {
            return Err(CostError::OverMax);
        }
        if self.fits.is_some_and(|quota| cost > quota) {
            return Err(CostError::OverQuota);
        }
        Ok(cost)
    }

    /// The real cost the upstream reported in `fields` (the response header, or its trailers):
    /// `None` when the route does not settle or the field is absent; an error when it is not
    /// one non-negative decimal integer (the charge then stands).
    pub fn settled(&self, fields: &HeaderMap) -> Option<Result<u32, CostError>> {
        parse(fields, self.settle.as_ref()?).transpose()
    }
}

/// The field's one value as a decimal integer; `None` when missing. HTTP/1 parsers have
/// already trimmed the value's surrounding whitespace, which an HTTP/2 peer may still send
/// (trimmed here too); what is left must be digits only: no sign, no fraction, no inner
/// space, no list.
fn parse(headers: &HeaderMap, name: &HeaderName) -> Result<Option<u32>, CostError> {
    let mut values = headers.get_all(name).iter();
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
            settle: None,
        };
        assert_eq!(fixed.of(&HeaderMap::new()), Err(CostError::OverQuota));
    }

    #[test]
    fn a_settled_cost_is_read_once_and_corrects_the_charge_either_way() {
        let c = Cost {
            settle: Some(HeaderName::from_static("x-cost")),
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
}
