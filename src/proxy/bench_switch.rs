//! Switches that turn one layer of the request path off, so `scripts/bench-layers` can measure
//! what each layer costs by taking it away.
//!
//! They exist only in a build with the `bench-switches` feature, which reads
//! `SLIDEGATE_BENCH_OFF` (a comma-separated list of [`Layer`] names) once. In every other build
//! [`on`] is the constant `true` and the compiler removes the checks: a shipped binary has no
//! way to switch a layer off.
//!
//! A build with a layer off is not a proxy to run: it drops the protection that layer gives
//! (forwarding headers a client could set, request forms that break routing, deadlines).

/// A layer of per-request work that a bench build can switch off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Layer {
    /// `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Real-IP`, `Forwarded` (see [`crate::request::forwarding`]).
    Forwarding,
    /// The request-form checks before routing and the target rewrite when forwarding
    /// (see [`crate::request::form`]).
    RequestForm,
    /// `X-Request-Id`, kept or generated, and echoed (see [`crate::request::id`]).
    RequestId,
    /// `Server` and the route's `response_headers` on the response.
    AnswerHeaders,
    /// The `RateLimit` field on an allowed response of a limited route.
    RateLimitFields,
    /// [`crate::edge::EdgeStream`]: the phase deadlines and the held writes.
    Edge,
    /// Per-request Prometheus updates: decisions, in flight, durations, upstream status.
    Metrics,
}

impl Layer {
    /// Every layer, in the order `scripts/bench-layers` reports them.
    pub const ALL: [Layer; 7] = [
        Layer::Forwarding,
        Layer::RequestForm,
        Layer::RequestId,
        Layer::AnswerHeaders,
        Layer::RateLimitFields,
        Layer::Edge,
        Layer::Metrics,
    ];

    /// The name `SLIDEGATE_BENCH_OFF` uses.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Forwarding => "forwarding",
            Layer::RequestForm => "request_form",
            Layer::RequestId => "request_id",
            Layer::AnswerHeaders => "answer_headers",
            Layer::RateLimitFields => "ratelimit_fields",
            Layer::Edge => "edge",
            Layer::Metrics => "metrics",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The set of switched-off layers named in `list` (`"forwarding,metrics"`); an unknown name
/// is an error naming it.
pub fn parse(list: &str) -> Result<u8, String> {
    let mut off = 0;
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let layer = Layer::ALL
            .iter()
            .find(|l| l.name() == name)
            .ok_or_else(|| {
                let known: Vec<_> = Layer::ALL.iter().map(|l| l.name()).collect();
                format!("unknown layer {name:?} (known: {})", known.join(", "))
            })?;
        off |= layer.bit();
    }
    Ok(off)
}

#[cfg(feature = "bench-switches")]
static OFF: std::sync::LazyLock<u8> = std::sync::LazyLock::new(|| {
    let list = std::env::var("SLIDEGATE_BENCH_OFF").unwrap_or_default();
    parse(&list).unwrap_or_else(|e| panic!("SLIDEGATE_BENCH_OFF: {e}"))
});

/// Is `layer` on? Always, unless this is a `bench-switches` build told otherwise.
#[cfg(feature = "bench-switches")]
pub fn on(layer: Layer) -> bool {
    *OFF & layer.bit() == 0
}

/// Is `layer` on? Always, unless this is a `bench-switches` build told otherwise.
#[cfg(not(feature = "bench-switches"))]
#[inline(always)]
pub fn on(_layer: Layer) -> bool {
    true
}

/// The switched-off layers' names, for the startup log of a `bench-switches` build (empty in
/// any other build). Panics on an unknown name, so a typo cannot measure the wrong build.
pub fn describe() -> Vec<&'static str> {
    Layer::ALL
        .into_iter()
        .filter(|l| !on(*l))
        .map(Layer::name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        let all: Vec<_> = Layer::ALL.iter().map(|l| l.name()).collect();
        assert_eq!(parse(&all.join(",")).unwrap(), 0b111_1111);
        assert_eq!(parse(" edge , metrics ").unwrap(), 0b110_0000);
        assert_eq!(parse("").unwrap(), 0);
        let e = parse("forwarding,fowarding").unwrap_err();
        assert!(e.contains("\"fowarding\""), "{e}");
    }

    #[cfg(not(feature = "bench-switches"))]
    #[test]
    fn every_layer_is_on_in_a_normal_build() {
        assert!(Layer::ALL.iter().all(|l| on(*l)));
        assert!(describe().is_empty());
    }
}
