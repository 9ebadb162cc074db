//! What a kind of limit is: the [`Kind`] trait, which each kind's own type implements with its
//! own parameters (`log::Log`, `slots::Slots`, `lease::Lease`, ...), and the `kinds!` macro
//! that makes the registry from one list (`algo/mod.rs`): [`LimitKind`](super::LimitKind), an
//! enum with one variant per kind that implements [`Kind`] by delegation, and
//! [`KindRecord`](super::KindRecord), the memory store's record with one variant per kind. Every
//! delegation is an exhaustive `match` written out by the macro: no wildcard arm anywhere, so a
//! new kind is one line of the list, and the compiler names every method it must supply.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use super::{Limit, RecordRules, Unit};
use crate::limiter::{LimitState, LimitView};

/// The unit a limit counts in, the draft's quota unit (`qu`), by the names its RateLimit Quota
/// Units registry gives them (`requests`, `content-bytes`, `concurrent-requests` in -11
/// §3.1.2 and §10.3, as in -10), or slidegate's own for a unit it does not register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaUnit {
    /// `requests`: requests admitted; the draft's default.
    Requests,
    /// `content-bytes`: bytes of content.
    ContentBytes,
    /// `concurrent-requests`: requests in flight at once.
    ConcurrentRequests,
    /// A cost limit's cost units (tokens, credits: what the route's `cost` header counts).
    /// The registry has no such unit and `qu` takes only registered values, so it goes out
    /// as the vendor parameter [`COST_UNIT_PARAM`] (the draft asks service-specific
    /// parameters to carry a vendor prefix), with no `qu`.
    Cost,
}

/// The vendor parameter that names a quota unit the registry lacks: `slidegate-unit="cost"`.
pub const COST_UNIT_PARAM: &str = "slidegate-unit";

impl QuotaUnit {
    /// The registered name, `None` for a unit the registry lacks.
    pub fn name(self) -> Option<&'static str> {
        match self {
            QuotaUnit::Requests => Some("requests"),
            QuotaUnit::ContentBytes => Some("content-bytes"),
            QuotaUnit::ConcurrentRequests => Some("concurrent-requests"),
            QuotaUnit::Cost => None,
        }
    }

    /// The parameter to send and its value: none for the default unit, which the draft lets
    /// go unsaid (a few bytes less on every response of every limited route); `qu` for a
    /// registered unit, the vendor parameter for cost.
    pub fn param(self) -> Option<(&'static str, &'static str)> {
        match self {
            QuotaUnit::Requests => None,
            QuotaUnit::ContentBytes | QuotaUnit::ConcurrentRequests => {
                self.name().map(|name| ("qu", name))
            }
            QuotaUnit::Cost => Some((COST_UNIT_PARAM, "cost")),
        }
    }
}

/// The options of a limit in the config that no other kind knows (`per`, `time_zone`, ...):
/// each one's name and text as the file gives it, for [`Kind::from_options`]. A kind that
/// takes none reads only the config's own keys (`requests`, `window`, `resolution`,
/// `concurrent`), which `config/validate` turns into it.
#[derive(Debug, Clone, Copy, Default)]
pub struct KindOptions<'a> {
    /// Each option given: its name and its text.
    pub given: &'a [(&'static str, &'a str)],
    /// What the limit counts (`unit`).
    pub unit: Unit,
}

impl KindOptions<'_> {
    /// The text of the option `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.given.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }
}

/// Why a kind refused its options: the option at fault (its config key's last part) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    /// The option's name (`per`, `time_zone`).
    pub option: &'static str,
    /// What is wrong with it.
    pub message: String,
}

/// A kind of limit: its own parameters (`self`) and everything the rest of the proxy asks of
/// it. Each method is one place a kind differs; [`LimitKind`](super::LimitKind) answers each by
/// asking the kind it holds.
pub trait Kind: Copy + Debug + PartialEq + Eq + Hash {
    /// Its record of one limit of one bucket in the memory store.
    type Record: RecordRules + Clone + Debug;

    /// An empty record.
    fn new_record(self) -> Self::Record;

    /// This kind read from a limit's own options, with its window (the longest anything it
    /// admits stays counted); `None`: none of them is this kind's.
    fn from_options(options: &KindOptions<'_>) -> Option<Result<(Self, Duration), OptionError>>;

    /// Append the Redis key suffix of a limit of this kind and `window_ms` (no formatting
    /// machinery: this runs for every limit of every decision). Two limits of a route share a
    /// key exactly when their ids are equal.
    fn push_key_suffix(self, window_ms: u32, out: &mut Vec<u8>);

    /// The suffix of the policy name `<route>-<suffix>` (`60s`, `1s@100ms`, `concurrent`).
    fn policy_suffix(self, window_ms: u32) -> String;

    /// The limit's second and third ARGV values in the sliding-window script: its window
    /// value and its kind value (each kind owns its values of the latter: its Lua file's
    /// `@when`). `window_us` is the limit's window.
    fn script_args(self, window_us: u64) -> [i64; 2];

    /// Its state from its [`REPLY_LEN`](super::REPLY_LEN) integers of a script reply
    /// (`remaining`, `reset` in µs).
    fn state_from_reply(self, reply: &[i64]) -> LimitState;

    /// Its view from the inspector script's `[count, remaining, reset]` and the values its
    /// `inspect-answer` section sends; `None` when they are of the wrong shape.
    fn view_from_inspect(self, limit: &Limit, head: [i64; 3], values: &[i64]) -> Option<LimitView>;

    /// What an admission counts in it: requests, or the request's cost (`unit = "cost"`).
    fn unit(self) -> Unit;

    /// The quota unit of its RateLimit fields.
    fn quota_unit(self) -> QuotaUnit;

    /// The `w` of its `RateLimit-Policy` item, whole seconds (`None`: no fixed window).
    fn policy_window_s(self, window: Duration) -> Option<u64>;

    /// The tag that tells its limits from other kinds' of the same window in the memory
    /// store's summary of evicted buckets (a collision only over-counts).
    fn summary_tag(self) -> u32;

    /// When an admission at `now` (µs on the store's clock) of a limit of this kind and
    /// `window_us` leaves what it counts.
    fn frees_if_recorded(self, window_us: u64, now: u64) -> u64;

    /// True for a kind whose admissions the proxy gives back when a request ends (leases).
    fn is_lease(self) -> bool;

    /// Its slot length in µs, `None` when it keeps no slots.
    fn resolution_us(self) -> Option<u64>;

    /// What the inspector says of it at `now_unix_us` beyond its entries, slots or leases
    /// (a calendar quota's period and its end); `None`: nothing.
    fn about(self, now_unix_us: u64) -> Option<String>;
}

/// `remaining` and `reset` (µs, at most `max_reset_us`) from a reply's two integers: what
/// every kind answers (REPLY in `lua/sliding_window/skeleton.lua`).
pub fn state_of(reply: &[i64], max_reset_us: u64) -> LimitState {
    LimitState {
        remaining: reply[0].clamp(0, i64::from(u32::MAX)) as u32,
        reset: Duration::from_micros((reply[1].max(0) as u64).min(max_reset_us)),
    }
}

/// `<n>s` for whole seconds, otherwise `<n>ms`: how policy names write a duration.
pub fn policy_text(ms: u32) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// The registry from one list of `Variant(kind type)`: [`LimitKind`](super::LimitKind), the
/// memory store's [`KindRecord`](super::KindRecord), and their delegations, each an exhaustive match.
macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident($ty:ty)),+ $(,)?) => {
        /// The kind of a limit, with its parameters: one variant per kind (see `kind.rs`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum LimitKind {
            $($(#[$doc])* $variant($ty),)+
        }

        /// The memory store's record of one limit: one variant per kind, each its kind's record.
        #[derive(Debug, Clone)]
        pub enum KindRecord {
            $($(#[$doc])* $variant(<$ty as Kind>::Record),)+
        }

        impl Kind for LimitKind {
            type Record = KindRecord;
            fn new_record(self) -> KindRecord {
                match self { $(LimitKind::$variant(k) => KindRecord::$variant(k.new_record()),)+ }
            }
            fn from_options(
                options: &KindOptions<'_>,
            ) -> Option<Result<(Self, Duration), OptionError>> {
                $(if let Some(kind) = <$ty as Kind>::from_options(options) {
                    return Some(kind.map(|(k, window)| (LimitKind::$variant(k), window)));
                })+
                None
            }
            fn push_key_suffix(self, window_ms: u32, out: &mut Vec<u8>) {
                match self { $(LimitKind::$variant(k) => k.push_key_suffix(window_ms, out),)+ }
            }
            fn policy_suffix(self, window_ms: u32) -> String {
                match self { $(LimitKind::$variant(k) => k.policy_suffix(window_ms),)+ }
            }
            fn script_args(self, window_us: u64) -> [i64; 2] {
                match self { $(LimitKind::$variant(k) => k.script_args(window_us),)+ }
            }
            fn state_from_reply(self, reply: &[i64]) -> LimitState {
                match self { $(LimitKind::$variant(k) => k.state_from_reply(reply),)+ }
            }
            fn view_from_inspect(
                self,
                limit: &Limit,
                head: [i64; 3],
                values: &[i64],
            ) -> Option<LimitView> {
                match self {
                    $(LimitKind::$variant(k) => k.view_from_inspect(limit, head, values),)+
                }
            }
            fn unit(self) -> Unit {
                match self { $(LimitKind::$variant(k) => k.unit(),)+ }
            }
            fn quota_unit(self) -> QuotaUnit {
                match self { $(LimitKind::$variant(k) => k.quota_unit(),)+ }
            }
            fn policy_window_s(self, window: Duration) -> Option<u64> {
                match self { $(LimitKind::$variant(k) => k.policy_window_s(window),)+ }
            }
            fn summary_tag(self) -> u32 {
                match self { $(LimitKind::$variant(k) => k.summary_tag(),)+ }
            }
            fn frees_if_recorded(self, window_us: u64, now: u64) -> u64 {
                match self {
                    $(LimitKind::$variant(k) => k.frees_if_recorded(window_us, now),)+
                }
            }
            fn is_lease(self) -> bool {
                match self { $(LimitKind::$variant(k) => k.is_lease(),)+ }
            }
            fn resolution_us(self) -> Option<u64> {
                match self { $(LimitKind::$variant(k) => k.resolution_us(),)+ }
            }
            fn about(self, now_unix_us: u64) -> Option<String> {
                match self { $(LimitKind::$variant(k) => k.about(now_unix_us),)+ }
            }
        }

        impl RecordRules for KindRecord {
            fn evict(&mut self, id: LimitId, now: u64) {
                match self { $(KindRecord::$variant(r) => RecordRules::evict(r, id, now),)+ }
            }
            fn count(&self) -> u64 {
                match self { $(KindRecord::$variant(r) => RecordRules::count(r),)+ }
            }
            fn push(&mut self, id: LimitId, now: u64, weight: u32) {
                match self { $(KindRecord::$variant(r) => RecordRules::push(r, id, now, weight),)+ }
            }
            fn reset_us(&self, id: LimitId, requests: u32, now: u64) -> u64 {
                match self { $(KindRecord::$variant(r) => RecordRules::reset_us(r, id, requests, now),)+ }
            }
            fn refund(&mut self, id: LimitId, at: u64, amount: u32) {
                match self { $(KindRecord::$variant(r) => RecordRules::refund(r, id, at, amount),)+ }
            }
            fn newest(&self, id: LimitId) -> Option<u64> {
                match self { $(KindRecord::$variant(r) => RecordRules::newest(r, id),)+ }
            }
            fn frees_us(&self, id: LimitId) -> u64 {
                match self { $(KindRecord::$variant(r) => RecordRules::frees_us(r, id),)+ }
            }
            fn seed(&mut self, id: LimitId, count: u64, frees_us: u64) {
                match self { $(KindRecord::$variant(r) => RecordRules::seed(r, id, count, frees_us),)+ }
            }
            fn heap_bytes(&self) -> usize {
                match self { $(KindRecord::$variant(r) => RecordRules::heap_bytes(r),)+ }
            }
            fn growth(&self, id: LimitId) -> usize {
                match self { $(KindRecord::$variant(r) => RecordRules::growth(r, id),)+ }
            }
            fn persisted(&self, id: LimitId) -> Vec<(u64, u32)> {
                match self { $(KindRecord::$variant(r) => RecordRules::persisted(r, id),)+ }
            }
            fn view(&self, limit: &Limit, now: u64, to_unix: &dyn Fn(u64) -> u64) -> LimitView {
                match self { $(KindRecord::$variant(r) => RecordRules::view(r, limit, now, to_unix),)+ }
            }
        }
    };
}
pub(super) use kinds;
