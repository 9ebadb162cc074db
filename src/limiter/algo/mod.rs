//! The kinds of limit, one module each, and their registry here: what a limit is ([`Limit`]:
//! requests, window and its [`LimitKind`]), its identity [`LimitId`] (`{ window, kind }`, which
//! names its Redis key, its policy and its memory-store record), and [`KindRecord`], the memory
//! store's record of one limit.
//!
//! Each kind is its own type implementing [`Kind`] (`kind.rs`), in one module that owns its
//! parameters, its record and pure rules ([`RecordRules`], unit-tested on a [`clock::FakeClock`]),
//! its key suffix, ARGV values, reply decoding, quota unit and RateLimit fields, and has its Lua
//! file (`lua/kinds/<kind>.lua`), whose sections the build splices into the Redis scripts
//! ([`script::SLIDING_WINDOW`], [`script::INSPECT`], [`script::REFUND`]). A new kind is its
//! module, its Lua file and one line of the `kinds!` list below: see `docs/design.md`.

use std::time::Duration;

use super::{LimitState, LimitView};

#[cfg(test)]
mod assemble;
pub mod calendar;
pub mod clock;
mod kind;
pub mod lease;
pub mod log;
mod record;
pub mod script;
pub mod slots;

pub use kind::{policy_text, state_of, Kind, KindOptions, OptionError, QuotaUnit, COST_UNIT_PARAM};
pub use record::RecordRules;

kind::kinds! {
    /// The exact sliding-window log: one timestamp per admitted request.
    Log(log::Log),
    /// One counter per `resolution` slot (validated: ≥ 1 ms, whole milliseconds, dividing the
    /// window into at most [`MAX_SLOTS`] slots). Never admits more than the log; may refuse up
    /// to one slot early.
    Slotted(slots::Slots),
    /// Requests in flight (`concurrent`): one lease per admitted request, given back when it
    /// ends, or left to expire one `window` (the `lease_ttl`) after it was taken.
    Lease(lease::Lease),
    /// A quota per calendar day, ISO week or month in a time zone (`per`, `time_zone`).
    Calendar(calendar::Calendar),
}

impl Default for LimitKind {
    fn default() -> Self {
        LimitKind::Log(log::Log)
    }
}

/// One limit: at most `requests` admitted (or, for a cost limit, cost units) in any `window`,
/// as its kind counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Maximum number of requests (cost units) admitted in any window (≥ 1).
    pub requests: u32,
    /// Window length (≥ 1 ms): the longest anything admitted stays counted.
    pub window: Duration,
    /// How admissions are recorded, with the kind's parameters.
    pub kind: LimitKind,
    /// What this decision's admission counts in it: 1, or for a cost limit the request's cost
    /// (see [`Limit::weighted`]; the configured limits say 1).
    pub weight: u32,
}

/// What a limit counts (`unit` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Unit {
    /// Every admitted request counts 1.
    #[default]
    Requests,
    /// Every admitted request counts its cost (`cost` of the route).
    Cost,
}

/// Integers per limit in a script reply (`remaining`, `reset`), whatever its kind.
pub const REPLY_LEN: usize = 2;

/// Most slots a window may be divided into (`window / resolution`): a decision reads and
/// rewrites every slot, so this bounds its cost (and a client's memory: `MAX_SLOTS + 1`
/// counters).
pub const MAX_SLOTS: u64 = 1000;

impl Limit {
    /// A limit of `kind`.
    pub const fn of(requests: u32, window: Duration, kind: LimitKind) -> Limit {
        Limit {
            requests,
            window,
            kind,
            weight: 1,
        }
    }

    /// An exact sliding-window-log limit.
    pub const fn log(requests: u32, window: Duration) -> Limit {
        Limit::of(requests, window, LimitKind::Log(log::Log))
    }

    /// A concurrency limit: at most `concurrent` leases, each expiring `ttl` after it was
    /// taken unless given back first.
    pub const fn lease(concurrent: u32, ttl: Duration) -> Limit {
        Limit::of(concurrent, ttl, LimitKind::Lease(lease::Lease))
    }

    /// True for a concurrency limit, whose entries the proxy gives back when a request ends.
    pub fn is_lease(&self) -> bool {
        self.kind.is_lease()
    }

    /// A slotted limit of `resolution` (which must divide `window`).
    pub const fn slotted(requests: u32, window: Duration, resolution: Duration) -> Limit {
        let kind = LimitKind::Slotted(slots::Slots::new(resolution, Unit::Requests));
        Limit::of(requests, window, kind)
    }

    /// A cost limit: at most `quota` cost units in any window, counted in slots of
    /// `resolution`.
    pub const fn cost(quota: u32, window: Duration, resolution: Duration) -> Limit {
        let kind = LimitKind::Slotted(slots::Slots::new(resolution, Unit::Cost));
        Limit::of(quota, window, kind)
    }

    /// What the limit counts: requests, or cost units.
    pub fn unit(&self) -> Unit {
        self.kind.unit()
    }

    /// This limit as one request of `cost` counts in it: a cost limit weighs `cost`, any
    /// other 1.
    pub fn weighted(self, cost: u32) -> Limit {
        match self.unit() {
            Unit::Cost => Limit {
                weight: cost,
                ..self
            },
            Unit::Requests => self,
        }
    }

    /// The window in microseconds (windows are validated to whole milliseconds of at most a
    /// month and a day, so this is exact).
    pub fn window_us(&self) -> u64 {
        self.window.as_micros().min(u128::from(u64::MAX)) as u64
    }

    /// The window in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window.as_millis().min(u128::from(u64::MAX)) as u64
    }

    /// The slot length in microseconds, `None` for a kind without slots.
    pub fn resolution_us(&self) -> Option<u64> {
        self.kind.resolution_us()
    }

    /// This limit's four ARGV values in the sliding-window script: requests, its kind's window
    /// and kind values, and the admission's weight (see ARGV in
    /// `lua/sliding_window/skeleton.lua`); the inspector takes the first three.
    pub fn script_args(&self) -> [i64; 4] {
        let [window, kind] = self.kind.script_args(self.window_us());
        [
            i64::from(self.requests),
            window,
            kind,
            i64::from(self.weight),
        ]
    }

    /// This limit's state from its [`REPLY_LEN`] integers of a script reply.
    pub fn state_from_reply(&self, reply: &[i64]) -> LimitState {
        self.kind.state_from_reply(reply)
    }

    /// This limit's view from the inspector script's reply: its `[count, remaining, reset]`
    /// and the values its kind's `inspect-answer` section sends; `None` when they are of the
    /// wrong shape.
    pub fn view_from_inspect(&self, head: [i64; 3], values: &[i64]) -> Option<LimitView> {
        self.kind.view_from_inspect(self, head, values)
    }

    /// What this limit is, apart from how many requests it admits: see [`LimitId`].
    pub fn id(&self) -> LimitId {
        LimitId {
            // Windows are validated to at most a month and a day, well under 2^32 ms.
            window_ms: self.window_ms().min(u64::from(u32::MAX)) as u32,
            kind: self.kind,
        }
    }
}

/// The identity of a limit within its route: its window and its kind with the kind's
/// parameters. The Redis key suffix, the `RateLimit-Policy` name's suffix, the memory store's
/// record and the config's duplicate check all use it, so two limits of one route share a
/// record exactly when their ids are equal. `requests` is not part of it: a reload that only
/// changes `requests` keeps what was recorded; one that changes the kind or a parameter of it
/// starts that limit empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitId {
    window_ms: u32,
    kind: LimitKind,
}

impl LimitId {
    /// The window in milliseconds.
    pub fn window_ms(self) -> u32 {
        self.window_ms
    }

    /// The window in microseconds.
    pub fn window_us(self) -> u64 {
        u64::from(self.window_ms) * 1000
    }

    /// The slot length in microseconds, `None` for a kind without slots.
    pub fn resolution_us(self) -> Option<u64> {
        self.kind.resolution_us()
    }

    /// The kind of limit this names, with its parameters.
    pub fn kind(self) -> LimitKind {
        self.kind
    }

    /// Append the Redis key suffix ([`Kind::push_key_suffix`]), as
    /// [`Display`](std::fmt::Display) writes it.
    pub fn push_key_suffix(self, out: &mut Vec<u8>) {
        self.kind.push_key_suffix(self.window_ms, out);
    }

    /// The suffix of the policy name `<route>-<suffix>` ([`Kind::policy_suffix`]).
    pub fn policy_suffix(self) -> String {
        self.kind.policy_suffix(self.window_ms)
    }

    /// The tag of this limit in the memory store's summary: its window and its kind's tag.
    pub fn summary_tag(self) -> u64 {
        u64::from(self.window_ms) | u64::from(self.kind.summary_tag()) << 32
    }
}

/// The Redis key suffix ([`LimitId::push_key_suffix`]).
impl std::fmt::Display for LimitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = Vec::new();
        self.push_key_suffix(&mut out);
        f.write_str(std::str::from_utf8(&out).map_err(|_| std::fmt::Error)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(requests: u32, ms: u64) -> Limit {
        Limit::log(requests, Duration::from_millis(ms))
    }

    #[test]
    fn windows_in_us_and_ms() {
        let l = limit(1, 1500);
        assert_eq!((l.window_us(), l.window_ms()), (1_500_000, 1500));
        assert_eq!(l.id().window_us(), 1_500_000);
    }

    #[test]
    fn id_is_the_window_and_leaves_requests_out() {
        assert_eq!(limit(5, 60_000).id(), limit(100, 60_000).id());
        assert_ne!(limit(5, 60_000).id(), limit(5, 1_000).id());
    }

    #[test]
    fn id_texts_are_todays_key_suffix_and_policy_suffix() {
        for (ms, key, policy) in [(60_000, "60000", "60s"), (250, "250", "250ms")] {
            let id = limit(1, ms).id();
            let mut out = b"p:{b}:".to_vec();
            id.push_key_suffix(&mut out);
            assert_eq!(out, format!("p:{{b}}:{key}").into_bytes());
            assert_eq!(id.to_string(), key);
            assert_eq!(id.policy_suffix(), policy);
        }
    }

    #[test]
    fn a_slotted_limit_has_its_own_id_key_and_policy_name() {
        let w = Duration::from_secs(1);
        let slotted = Limit::slotted(10, w, Duration::from_millis(100));
        assert_ne!(slotted.id(), Limit::log(10, w).id());
        assert_eq!(slotted.id().to_string(), "1000@100");
        assert_eq!(slotted.id().policy_suffix(), "1s@100ms");
        assert_eq!(slotted.id().resolution_us(), Some(100_000));
        assert_eq!(Limit::log(1, w).id().resolution_us(), None);
        let odd = Limit::slotted(1, Duration::from_millis(1500), Duration::from_millis(1500));
        assert_eq!(odd.id().policy_suffix(), "1500ms@1500ms");
    }

    #[test]
    fn a_cost_limit_has_its_own_key_and_policy_name_and_weighs_the_cost() {
        let (w, r) = (Duration::from_secs(1), Duration::from_millis(100));
        let cost = Limit::cost(10, w, r);
        assert_ne!(cost.id(), Limit::slotted(10, w, r).id());
        assert_eq!(cost.id().to_string(), "1000@100c");
        assert_eq!(cost.id().policy_suffix(), "1s@100ms-cost");
        assert_eq!(cost.weighted(7).script_args(), [10, 1_000_000, 100_000, 7]);
        assert_eq!(Limit::log(5, w).weighted(7).weight, 1);
    }
}
