//! The kinds of limit, one module each, and their registry here: what a limit is ([`Limit`]:
//! requests, window and its [`LimitKind`]), its identity [`LimitId`] (which names its Redis
//! key, its policy and its memory-store record), and [`Record`], the memory store's record of
//! one limit, which hands every rule to its kind's module.
//!
//! Each kind's module owns its record type and pure rules ([`Rules`], unit-tested on a
//! [`clock::FakeClock`]), its ARGV value and reply decoding for the sliding-window script, and
//! has its Lua file (`lua/kinds/<kind>.lua`), whose sections the build splices into the Redis
//! scripts ([`script::SLIDING_WINDOW`], [`script::INSPECT`], [`script::REFUND`]). A new kind
//! is its module and Lua file (every file in `lua/kinds/` is spliced in), a [`LimitKind`]
//! variant and a [`Record`] variant with its arm in `each_kind!` (`record.rs`): see
//! `docs/design.md`.

use std::time::Duration;

use super::{LimitState, LimitView};

#[cfg(test)]
mod assemble;
pub mod clock;
pub mod lease;
pub mod log;
mod record;
pub mod script;
pub mod slots;

pub use record::{Record, Rules};

/// One sliding-window limit: at most `requests` admitted requests in any `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Maximum number of requests admitted in any window (≥ 1).
    pub requests: u32,
    /// Window length (≥ 1 ms).
    pub window: Duration,
    /// How admissions are recorded: one entry each, or one counter per slot.
    pub kind: LimitKind,
    /// What the limit counts: requests (1 each), or a cost limit's cost units.
    pub unit: Unit,
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
    /// Every admitted request counts its cost (`cost` of the route); always slotted.
    Cost,
}

/// How a limit records what it admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LimitKind {
    /// The exact sliding-window log: one timestamp per admitted request.
    #[default]
    Log,
    /// One counter per `resolution` slot (validated: ≥ 1 ms, whole milliseconds, dividing the
    /// window into at most [`MAX_SLOTS`] slots). Never admits more than the log; may refuse up
    /// to one slot early.
    Slotted {
        /// Slot length.
        resolution: Duration,
    },
    /// Requests in flight (`concurrent`): one lease per admitted request, given back when it
    /// ends, or left to expire one `window` (the `lease_ttl`) after it was taken.
    Lease,
}

/// Integers per limit in a script reply (`remaining`, `reset`), whatever its kind.
pub const REPLY_LEN: usize = 2;

/// Most slots a window may be divided into (`window / resolution`): a decision reads and
/// rewrites every slot, so this bounds its cost (and a client's memory: `MAX_SLOTS + 1`
/// counters).
pub const MAX_SLOTS: u64 = 1000;

impl Limit {
    /// An exact sliding-window-log limit.
    pub const fn log(requests: u32, window: Duration) -> Limit {
        Limit {
            requests,
            window,
            kind: LimitKind::Log,
            unit: Unit::Requests,
            weight: 1,
        }
    }

    /// A concurrency limit: at most `concurrent` leases, each expiring `ttl` after it was
    /// taken unless given back first.
    pub const fn lease(concurrent: u32, ttl: Duration) -> Limit {
        Limit {
            requests: concurrent,
            window: ttl,
            kind: LimitKind::Lease,
            unit: Unit::Requests,
            weight: 1,
        }
    }

    /// True for a concurrency limit, whose entries the proxy gives back when a request ends.
    pub fn is_lease(&self) -> bool {
        self.kind == LimitKind::Lease
    }

    /// A slotted limit of `resolution` (which must divide `window`).
    pub const fn slotted(requests: u32, window: Duration, resolution: Duration) -> Limit {
        Limit {
            requests,
            window,
            kind: LimitKind::Slotted { resolution },
            unit: Unit::Requests,
            weight: 1,
        }
    }

    /// A cost limit: at most `quota` cost units in any window, counted in slots of
    /// `resolution`.
    pub const fn cost(quota: u32, window: Duration, resolution: Duration) -> Limit {
        Limit {
            unit: Unit::Cost,
            ..Limit::slotted(quota, window, resolution)
        }
    }

    /// This limit as one request of `cost` counts in it: a cost limit weighs `cost`, any
    /// other 1.
    pub const fn weighted(self, cost: u32) -> Limit {
        match self.unit {
            Unit::Cost => Limit {
                weight: cost,
                ..self
            },
            Unit::Requests => self,
        }
    }

    /// The window in microseconds (windows are validated to whole milliseconds of at most 30
    /// days, so this is exact).
    pub fn window_us(&self) -> u64 {
        self.window.as_micros().min(u128::from(u64::MAX)) as u64
    }

    /// The window in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window.as_millis().min(u128::from(u64::MAX)) as u64
    }

    /// The slot length in microseconds, `None` for a log.
    pub fn resolution_us(&self) -> Option<u64> {
        match self.kind {
            LimitKind::Log | LimitKind::Lease => None,
            LimitKind::Slotted { resolution } => Some(resolution.as_micros() as u64),
        }
    }

    /// This limit's four ARGV values in the sliding-window script: requests, window in µs,
    /// the kind's own value and the admission's weight (see ARGV in
    /// `lua/sliding_window/skeleton.lua`); the inspector takes the first three.
    pub fn script_args(&self) -> [u64; 4] {
        let kind = match self.kind {
            LimitKind::Log => log::SCRIPT_ARG,
            LimitKind::Lease => lease::SCRIPT_ARG,
            LimitKind::Slotted { resolution } => slots::script_arg(resolution),
        };
        [
            u64::from(self.requests),
            self.window_us(),
            kind,
            u64::from(self.weight),
        ]
    }

    /// This limit's state from its [`REPLY_LEN`] integers of a script reply.
    pub fn state_from_reply(&self, reply: &[i64]) -> LimitState {
        // Every kind answers `remaining`, `reset` (µs): see REPLY in the script's head.
        let mut reset = reply[1].max(0) as u64;
        if self.is_lease() {
            reset = reset.min(lease::RETRY_US);
        }
        LimitState {
            remaining: reply[0].clamp(0, i64::from(u32::MAX)) as u32,
            reset: Duration::from_micros(reset),
        }
    }

    /// This limit's view from the inspector script's reply: its `[count, remaining, reset]`
    /// and the values its kind's `inspect-answer` section sends; `None` when they are of the
    /// wrong shape.
    pub fn view_from_inspect(&self, head: [i64; 3], values: &[i64]) -> Option<LimitView> {
        match self.kind {
            LimitKind::Log => Some(log::view_from_inspect(head, values)),
            LimitKind::Lease => {
                let mut view = log::view_from_inspect(head, values);
                view.reset = view.reset.min(Duration::from_micros(lease::RETRY_US));
                Some(view)
            }
            LimitKind::Slotted { .. } => slots::view_from_inspect(self, head, values),
        }
    }

    /// What this limit is, apart from how many requests it admits: see [`LimitId`].
    pub fn id(&self) -> LimitId {
        LimitId {
            // Windows are validated to at most 30 days, well under 2^32 ms.
            window_ms: self.window_ms().min(u64::from(u32::MAX)) as u32,
            resolution_ms: self
                .resolution_us()
                .map_or(0, |us| (us / 1000).min(u64::from(u32::MAX)) as u32),
            lease: self.is_lease(),
            cost: self.unit == Unit::Cost,
        }
    }
}

/// The identity of a limit within its route: the Redis key suffix, the `RateLimit-Policy`
/// name's suffix, the memory store's log and the config's duplicate check all use it, so two
/// limits of one route share a log exactly when their ids are equal. `requests` is not part of
/// it: a reload that only changes `requests` keeps the recorded entries.
///
/// A log is named by its window; a slotted limit by its window and resolution, so a log and
/// a slotted limit of one window never share a key (a reload that adds or changes a
/// `resolution` starts that limit empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitId {
    window_ms: u32,
    /// 0 for a log (a slot is at least 1 ms).
    resolution_ms: u32,
    /// A concurrency limit (its window the `lease_ttl`, resolution 0).
    lease: bool,
    /// A cost limit: its own key (`...c`) and policy name (`...-cost`) beside a request limit
    /// of the same window and resolution.
    cost: bool,
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

    /// The slot length in microseconds, `None` for a log.
    pub fn resolution_us(self) -> Option<u64> {
        (self.resolution_ms > 0).then(|| u64::from(self.resolution_ms) * 1000)
    }

    /// The kind of limit this names.
    pub fn kind(self) -> LimitKind {
        match self.resolution_ms {
            0 if self.lease => LimitKind::Lease,
            0 => LimitKind::Log,
            r => LimitKind::Slotted {
                resolution: Duration::from_millis(u64::from(r)),
            },
        }
    }

    /// Append the Redis key suffix (`<window ms>`, `<window ms>@<resolution ms>` for a
    /// slotted limit, `<lease_ttl ms>c` for a concurrency limit), as [`Display`](std::fmt::Display) writes it but without the formatting
    /// machinery: this runs for every limit of every decision.
    pub fn push_key_suffix(self, out: &mut Vec<u8>) {
        let mut buf = itoa::Buffer::new();
        out.extend_from_slice(buf.format(self.window_ms).as_bytes());
        if self.resolution_ms > 0 {
            out.push(b'@');
            out.extend_from_slice(buf.format(self.resolution_ms).as_bytes());
        }
        // A lease's (`<ttl>c`, never slotted) and a cost limit's (`<window>@<resolution>c`,
        // always slotted) own letter: never the key of a log or of slots of the same window and
        // resolution, nor of each other.
        if self.lease || self.cost {
            out.push(b'c');
        }
    }

    /// True for a cost limit (`unit = "cost"`).
    pub fn is_cost(self) -> bool {
        self.cost
    }

    /// The suffix of the policy name `<route>-<suffix>`: whole seconds as `60s`, otherwise
    /// milliseconds as `1500ms`; a slotted limit adds `@<resolution>` (`1s@100ms`); a
    /// concurrency limit is `concurrent` (a route has at most one per key).
    pub fn policy_suffix(self) -> String {
        if self.lease {
            return "concurrent".to_owned();
        }
        let text = |ms: u32| {
            if ms.is_multiple_of(1000) {
                format!("{}s", ms / 1000)
            } else {
                format!("{ms}ms")
            }
        };
        let unit = if self.cost { "-cost" } else { "" };
        match self.resolution_ms {
            0 => text(self.window_ms),
            r => format!("{}@{}{unit}", text(self.window_ms), text(r)),
        }
    }
}

/// The Redis key suffix: `<window ms>` (`<window ms>@<resolution ms>` when slotted,
/// `<lease_ttl ms>c` for leases).
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
