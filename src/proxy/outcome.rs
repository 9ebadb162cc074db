//! What happens to a request, decided by one pure function from what the hook found out.
//!
//! `request_filter` finds out the [`Findings`] (request form, route, the store's answer), calls
//! [`outcome`], and writes the [`Outcome`]: no decision is taken anywhere else. A new way to
//! decide (a local fallback for `on_error`, an exempt client) is one more variant here and one
//! more arm in [`outcome`].

use crate::config::{OnError, Smoothing};
pub(super) use crate::limiter::DecidedBy;
use crate::limiter::{StoreError, Verdict};
use crate::logs::state::LimiterState;
use crate::metrics::Decision;
use crate::request::form::BadRequest;
use crate::routes::Route;

/// How a limited route turns the store's answer into a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Policy {
    /// Dry run: count what would happen, show the client nothing.
    pub shadow: bool,
    /// What a store error means for the request.
    pub on_error: OnError,
    /// `max_delay` and `max_queue`: how long a denial may wait for room.
    pub smoothing: Option<Smoothing>,
}

impl Policy {
    /// The policy of `route`.
    pub fn of(route: &Route) -> Policy {
        Policy {
            shadow: route.spec.counting.shadow,
            on_error: route.spec.counting.on_error,
            smoothing: route.spec.smoothing,
        }
    }
}

/// What the hook found out about a request, in the order it finds out: each variant ends the
/// finding out.
#[derive(Debug)]
pub(super) enum Findings {
    /// The head failed the checks before routing.
    BadForm(BadRequest),
    /// No route matches.
    NoRoute,
    /// The route has no limits: the store is not asked.
    Unlimited,
    /// The client is in the route's `exempt` networks: the store is not asked.
    Exempt,
    /// The store's answer for a limited route.
    Decided {
        /// The route's shadow and `on_error`.
        policy: Policy,
        /// The verdict, or why there is none.
        result: Result<Verdict, StoreError>,
        /// Who decided: the shared store, or (`on_error = "local"`, the store failed) this
        /// proxy's local log.
        by: DecidedBy,
        /// The request was denied at first and waited for room (`max_delay`): `result` is
        /// the decision taken after the wait.
        delayed: bool,
    },
    /// The client went away while its request waited for room: nothing is sent.
    ClientGone,
}

impl Findings {
    /// The store's error, when it gave no verdict (fail-open or fail-closed).
    pub(super) fn store_error(&self) -> Option<&StoreError> {
        match self {
            Findings::Decided { result: Err(e), .. } => Some(e),
            _ => None,
        }
    }
}

/// What happens to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome<'a> {
    /// `400`, and the connection closes (like nginx).
    BadRequest(BadRequest),
    /// `404`.
    NoRoute,
    /// Forwarded: the route has no limits.
    Unlimited,
    /// Forwarded without rate-limit fields: an exempt client.
    Exempt,
    /// Forwarded: the store failed and the route fails open (or is a shadow route).
    ErrorAllowed,
    /// `503` with `Retry-After: 1`: the store failed and the route fails closed.
    ErrorDenied,
    /// `503` with `Retry-After: 1`: shed, this proxy had more decisions waiting for the shared
    /// store than it queues (whatever the route's `on_error`).
    Overloaded,
    /// Forwarded without rate-limit fields: a shadow route, with what it would have done.
    Shadow {
        /// The limits would have denied the request.
        denied: bool,
        /// The verdict, and who gave it: an admission holds leases like any other.
        verdict: &'a Verdict,
        by: DecidedBy,
    },
    /// Forwarded, with the verdict's `RateLimit` fields on the response.
    Allowed(&'a Verdict),
    /// Forwarded after waiting for room (`max_delay`), with the verdict's fields.
    Delayed(&'a Verdict),
    /// The client left while its request waited: no response, the request ends (counted as a
    /// denial: it was refused at first and never admitted).
    ClientGone,
    /// `429` with the verdict's fields and problem body.
    Denied(&'a Verdict),
    /// Forwarded on the local log's verdict (the shared store failed), with its fields.
    LocalAllowed(&'a Verdict),
    /// `429` on the local log's verdict (the shared store failed).
    LocalDenied(&'a Verdict),
}

/// Decide what happens to a request from what was found out about it.
pub(super) fn outcome(found: &Findings) -> Outcome<'_> {
    let (policy, result, by, delayed) = match found {
        Findings::BadForm(why) => return Outcome::BadRequest(*why),
        Findings::NoRoute => return Outcome::NoRoute,
        Findings::Unlimited => return Outcome::Unlimited,
        Findings::Exempt => return Outcome::Exempt,
        Findings::ClientGone => return Outcome::ClientGone,
        Findings::Decided {
            policy,
            result,
            by,
            delayed,
        } => (policy, result, by, *delayed),
    };
    match (result, by) {
        (Err(StoreError::Overloaded(_)), _) if !policy.shadow => Outcome::Overloaded,
        // A shadow route never answers for the store either.
        (Err(_), _) if policy.on_error == OnError::Deny && !policy.shadow => Outcome::ErrorDenied,
        (Err(_), _) => Outcome::ErrorAllowed,
        (Ok(v), by) if policy.shadow => Outcome::Shadow {
            denied: !v.admitted,
            verdict: v,
            by: *by,
        },
        (Ok(v), DecidedBy::Store) if v.admitted && delayed => Outcome::Delayed(v),
        (Ok(v), DecidedBy::Store) if v.admitted => Outcome::Allowed(v),
        (Ok(v), DecidedBy::Store) => Outcome::Denied(v),
        (Ok(v), DecidedBy::Local) if v.admitted => Outcome::LocalAllowed(v),
        (Ok(v), DecidedBy::Local) => Outcome::LocalDenied(v),
    }
}

impl Outcome<'_> {
    /// The decision counted in `slidegate_requests_total` (none for a request without a route).
    pub fn decision(&self) -> Option<Decision> {
        Some(match self {
            Outcome::BadRequest(_) | Outcome::NoRoute => return None,
            Outcome::Unlimited | Outcome::Allowed(_) | Outcome::Shadow { denied: false, .. } => {
                Decision::Allowed
            }
            Outcome::Shadow { denied: true, .. } => Decision::ShadowDenied,
            Outcome::Exempt => Decision::Exempt,
            Outcome::ErrorAllowed => Decision::ErrorAllowed,
            Outcome::ErrorDenied => Decision::ErrorDenied,
            Outcome::Overloaded => Decision::Overloaded,
            Outcome::Delayed(_) => Decision::Delayed,
            Outcome::Denied(_) | Outcome::ClientGone => Decision::Denied,
            Outcome::LocalAllowed(_) => Decision::LocalAllowed,
            Outcome::LocalDenied(_) => Decision::LocalDenied,
        })
    }

    /// The state of the route's limiter this outcome shows, for the route's state log.
    pub fn limiter_state(&self) -> Option<LimiterState> {
        Some(match self {
            Outcome::BadRequest(_) | Outcome::NoRoute | Outcome::Unlimited | Outcome::Exempt => {
                return None
            }
            Outcome::ErrorAllowed => LimiterState::FailOpen,
            Outcome::ErrorDenied => LimiterState::FailClosed,
            Outcome::LocalAllowed(_) | Outcome::LocalDenied(_) => LimiterState::Local,
            Outcome::Shadow { .. }
            | Outcome::Allowed(_)
            | Outcome::Delayed(_)
            | Outcome::Denied(_)
            | Outcome::Overloaded
            | Outcome::ClientGone => LimiterState::Normal,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limiter::LimitState;

    fn verdict(admitted: bool) -> Verdict {
        Verdict {
            admitted,
            recorded_at: admitted.then_some(1),
            recorded_each: Vec::new(),
            states: vec![LimitState {
                remaining: u32::from(admitted),
                reset: Duration::from_secs(1),
            }],
        }
    }

    fn decided(shadow: bool, on_error: OnError, result: Result<Verdict, StoreError>) -> Findings {
        Findings::Decided {
            policy: Policy {
                shadow,
                on_error,
                smoothing: None,
            },
            result,
            by: DecidedBy::Store,
            delayed: false,
        }
    }

    fn local(shadow: bool, result: Result<Verdict, StoreError>) -> Findings {
        Findings::Decided {
            policy: Policy {
                shadow,
                on_error: OnError::Local,
                smoothing: None,
            },
            result,
            by: DecidedBy::Local,
            delayed: false,
        }
    }

    fn failed() -> Result<Verdict, StoreError> {
        Err(StoreError::Timeout(Duration::from_millis(50)))
    }

    #[test]
    fn bad_form_is_a_400_without_a_decision() {
        let out = outcome(&Findings::BadForm(BadRequest::MissingHost));
        assert_eq!(out, Outcome::BadRequest(BadRequest::MissingHost));
        assert_eq!(out.decision(), None);
    }

    #[test]
    fn an_exempt_client_is_forwarded_and_counted_as_exempt() {
        let out = outcome(&Findings::Exempt);
        assert_eq!(out, Outcome::Exempt);
        assert_eq!(out.decision(), Some(Decision::Exempt));
        assert_eq!(out.limiter_state(), None);
    }

    #[test]
    fn no_route_is_a_404_without_a_decision() {
        let out = outcome(&Findings::NoRoute);
        assert_eq!(out, Outcome::NoRoute);
        assert_eq!(out.decision(), None);
    }

    #[test]
    fn unlimited_is_forwarded_and_counted_allowed() {
        let out = outcome(&Findings::Unlimited);
        assert_eq!(out, Outcome::Unlimited);
        assert_eq!(out.decision(), Some(Decision::Allowed));
    }

    #[test]
    fn store_error_follows_on_error() {
        let allow = decided(false, OnError::Allow, failed());
        assert_eq!(outcome(&allow), Outcome::ErrorAllowed);
        assert_eq!(outcome(&allow).decision(), Some(Decision::ErrorAllowed));

        let deny = decided(false, OnError::Deny, failed());
        assert_eq!(outcome(&deny), Outcome::ErrorDenied);
        assert_eq!(outcome(&deny).decision(), Some(Decision::ErrorDenied));
    }

    #[test]
    fn shadow_never_answers_not_even_for_a_failed_store() {
        let deny = decided(true, OnError::Deny, failed());
        assert_eq!(outcome(&deny), Outcome::ErrorAllowed);
    }

    #[test]
    fn shadow_counts_what_would_have_happened() {
        let denied = decided(true, OnError::Allow, Ok(verdict(false)));
        assert!(matches!(
            outcome(&denied),
            Outcome::Shadow { denied: true, .. }
        ));
        assert_eq!(outcome(&denied).decision(), Some(Decision::ShadowDenied));

        let allowed = decided(true, OnError::Allow, Ok(verdict(true)));
        assert!(matches!(
            outcome(&allowed),
            Outcome::Shadow { denied: false, .. }
        ));
        assert_eq!(outcome(&allowed).decision(), Some(Decision::Allowed));
    }

    #[test]
    fn the_store_verdict_allows_or_denies() {
        let (yes, no) = (verdict(true), verdict(false));
        let cases = [
            (
                OnError::Deny,
                true,
                Outcome::Allowed(&yes),
                Decision::Allowed,
            ),
            (
                OnError::Allow,
                false,
                Outcome::Denied(&no),
                Decision::Denied,
            ),
        ];
        for (on_error, admitted, want, decision) in cases {
            let found = decided(false, on_error, Ok(verdict(admitted)));
            assert_eq!(outcome(&found), want);
            assert_eq!(outcome(&found).decision(), Some(decision));
        }
    }

    #[test]
    fn the_local_log_decides_when_the_shared_store_failed() {
        let admitted = local(false, Ok(verdict(true)));
        assert_eq!(outcome(&admitted), Outcome::LocalAllowed(&verdict(true)));
        assert_eq!(outcome(&admitted).decision(), Some(Decision::LocalAllowed));
        assert_eq!(
            outcome(&admitted).limiter_state(),
            Some(LimiterState::Local)
        );

        let refused = local(false, Ok(verdict(false)));
        assert_eq!(outcome(&refused), Outcome::LocalDenied(&verdict(false)));
        assert_eq!(outcome(&refused).decision(), Some(Decision::LocalDenied));
    }

    #[test]
    fn a_failed_local_log_fails_open_and_shadow_stays_silent() {
        assert_eq!(outcome(&local(false, failed())), Outcome::ErrorAllowed);
        let shadow = local(true, Ok(verdict(false)));
        assert!(matches!(
            outcome(&shadow),
            Outcome::Shadow { denied: true, .. }
        ));
    }

    #[test]
    fn the_state_log_sees_outages_and_recovery() {
        let cases = [
            (
                decided(false, OnError::Allow, failed()),
                LimiterState::FailOpen,
            ),
            (
                decided(false, OnError::Deny, failed()),
                LimiterState::FailClosed,
            ),
            (
                decided(false, OnError::Deny, Ok(verdict(true))),
                LimiterState::Normal,
            ),
        ];
        for (found, state) in cases {
            assert_eq!(outcome(&found).limiter_state(), Some(state));
        }
        assert_eq!(outcome(&Findings::NoRoute).limiter_state(), None);
    }

    #[test]
    fn admitted_after_a_wait_is_delayed_and_a_client_gone_is_a_denial() {
        let yes = verdict(true);
        let waited = |by, result| Findings::Decided {
            policy: Policy {
                shadow: false,
                on_error: OnError::Local,
                smoothing: None,
            },
            result,
            by,
            delayed: true,
        };
        let admitted = waited(DecidedBy::Store, Ok(yes.clone()));
        let out = outcome(&admitted);
        assert_eq!(out, Outcome::Delayed(&yes));
        assert_eq!(out.decision(), Some(Decision::Delayed));
        assert_eq!(out.limiter_state(), Some(LimiterState::Normal));
        // Still denied after the wait: a denial like any other.
        let no = verdict(false);
        let refused = waited(DecidedBy::Store, Ok(no.clone()));
        let out = outcome(&refused);
        assert_eq!(out, Outcome::Denied(&no));
        // The local log's admission keeps its own label: the outage is what matters there.
        let local = waited(DecidedBy::Local, Ok(yes.clone()));
        let out = outcome(&local);
        assert_eq!(out, Outcome::LocalAllowed(&yes));
        let gone = outcome(&Findings::ClientGone);
        assert_eq!(gone, Outcome::ClientGone);
        assert_eq!(gone.decision(), Some(Decision::Denied));
    }
}
