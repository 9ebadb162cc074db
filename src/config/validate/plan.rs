//! `[plans.<name>]` and a route's `plan`: each plan's limits checked as the limits of every
//! route that takes plans (their keys and cost are the route's), the source and the default
//! plan checked against what exists.

use std::path::PathBuf;
use std::time::Duration;

use super::super::raw::{RawLimit, RawPlan, RawRoute};
use super::super::{ConfigError, KeySpec, PlanLimits, PlanSource, RoutePlans};
use super::Validator;
use crate::keys::Part;

/// A plan as routes read it: its name and its raw limits.
pub(in crate::config) struct RawPlanEntry<'a> {
    pub name: &'a str,
    pub plan: &'a RawPlan,
}

/// How long a plan read from Redis is used when `refresh` is not given: a change made by the
/// billing system applies on every proxy within this (plus one store call).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(2);

impl Validator<'_> {
    /// `[plans]`: names spelled as route names (they join the policy names, `api-pro-60s`).
    pub(super) fn plan_entries<'a>(
        &self,
        plans: &'a std::collections::BTreeMap<String, RawPlan>,
    ) -> Result<Vec<RawPlanEntry<'a>>, ConfigError> {
        let spelled = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        let mut entries = Vec::with_capacity(plans.len());
        for (name, plan) in plans {
            if name.is_empty() || !name.chars().all(spelled) {
                let message = "a plan's name is ASCII letters, digits, '-', '_' or '.'";
                return self.err(None, format!("plans.{name}"), message);
            }
            entries.push(RawPlanEntry { name, plan });
        }
        Ok(entries)
    }

    /// Route `i`'s `plan`: `None` without one; else every plan's limits as this route counts
    /// them (the plan's, then the route's own `own`), the default's chosen.
    pub(super) fn route_plans(
        &self,
        i: usize,
        r: &RawRoute,
        plans: &[RawPlanEntry<'_>],
        key: &KeySpec,
        own: &[(String, &RawLimit)],
        shared: bool,
    ) -> Result<Option<RoutePlans>, ConfigError> {
        let Some(choice) = &r.plan else {
            return Ok(None);
        };
        let at = |field: &str| format!("routes[{i}].plan.{field}");
        let choice_ref = choice.get_ref();
        // The plan belongs to the customer the key names: one value read from the request.
        let named = matches!(
            key,
            KeySpec::One(Part::Header(_) | Part::Query(_) | Part::Cookie(_) | Part::ClientIp)
        );
        if !named {
            let message = "a route with `plan` needs a key naming one customer: \
                           \"header:<Name>\", \"query:<name>\", \"cookie:<name>\" or \"client_ip\"";
            return self.err(Some(r.key.span()), format!("routes[{i}].key"), message);
        }
        let from = choice_ref.from.get_ref();
        let source = match (from.strip_prefix("file:"), from.as_str()) {
            (Some(path), _) if !path.is_empty() => PlanSource::File(PathBuf::from(path)),
            (None, "redis") if shared => PlanSource::Redis {
                refresh: (choice_ref.refresh.as_ref()).map_or(DEFAULT_REFRESH, |r| r.get_ref().0),
            },
            (None, "redis") => {
                let message = "plans read from Redis need backend = \"redis\", \
                               \"redis_sentinel\" or \"redis_cluster\"; with the memory store use \
                               \"file:<path>\"";
                return self.err(Some(choice_ref.from.span()), at("from"), message);
            }
            _ => {
                let message = "\"file:<path>\" (a table of client key to plan name) or \"redis\" \
                               (the hash <prefix>:plans)";
                return self.err(Some(choice_ref.from.span()), at("from"), message);
            }
        };
        if let (Some(refresh), PlanSource::File(_)) = (&choice_ref.refresh, &source) {
            let message = "`refresh` is for plans read from Redis; a plan file is read again on \
                           reload (and by --watch when it changes)";
            return self.err(Some(refresh.span()), at("refresh"), message);
        }
        let default_name = choice_ref.default.get_ref();
        let Some(default) = plans.iter().position(|p| p.name == default_name.as_str()) else {
            let known: Vec<&str> = plans.iter().map(|p| p.name).collect();
            let message = format!("no [plans.{default_name}] is defined (plans: {known:?})");
            return self.err(Some(choice_ref.default.span()), at("default"), message);
        };
        let route = r.name.get_ref();
        let mut each = Vec::with_capacity(plans.len());
        for p in plans {
            let mut list: Vec<(String, &RawLimit)> = (p.plan.limits.iter().enumerate())
                .map(|(j, l)| (format!("plans.{}.limits[{j}]", p.name), l))
                .collect();
            list.extend(own.iter().map(|(base, l)| (base.clone(), *l)));
            let prefix = format!("{route}-{}", p.name);
            let (limits, limit_keys) = self.limits(&prefix, &list, key)?;
            let cost = self.cost(i, r, &limits)?;
            each.push(PlanLimits {
                name: p.name.to_string(),
                limits,
                limit_keys,
                cost,
            });
        }
        Ok(Some(RoutePlans {
            source,
            default,
            chosen: default,
            each,
        }))
    }
}
