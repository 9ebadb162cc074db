//! The top limited clients in Redis: per route and minute, sorted sets of denials and
//! admissions by bucket, and one per limit that refused (a client's score there: the folds in
//! which that limit refused it). Keys `<prefix>:top:{<route>}:<minute>:d`, `…:a` and
//! `…:l:<policy name>`: the `{<route>}` hash tag keeps a route's keys in one Cluster slot (one
//! pipeline per route), and no bucket's key starts with `<prefix>:top:` (those are
//! `<prefix>:{…`). Every key written lives [`TOP_TTL`] from its last fold and keeps its
//! [`KEEP_PER_MINUTE`] highest scores.
//!
//! A fold is a pipeline of `ZINCRBY`s, `ZREMRANGEBYRANK`s and `EXPIRE`s on the store's connection and I/O thread,
//! bounded by [`FOLD_TIMEOUT`]; a read is two pipelines (each minute's most denied, then their
//! admissions and limits by `ZMSCORE`). Neither takes part in the gate's health bookkeeping:
//! both fail at once while the gate is closed.

use std::collections::HashMap;

use super::conn::within;
use super::Inner;
use crate::limiter::top::{
    TopCount, TopFold, TopQuery, FOLD_TIMEOUT, KEEP_PER_MINUTE, READ_PER_MINUTE, TOP_TTL,
};
use crate::limiter::StoreError;

/// What a user needs beyond [`super::REQUIRED_COMMANDS`] for the top limited clients (without
/// them decisions go on; the folds fail, counted and logged, and `/api/v1/top` answers 503).
pub const TOP_COMMANDS: &[&str] = &[
    "ZINCRBY",
    "ZREMRANGEBYRANK",
    "EXPIRE",
    "ZREVRANGE",
    "ZMSCORE",
];

impl Inner {
    /// `<prefix>:top:{<route>}:<minute>`.
    fn top_base(&self, route: &str, minute: u64) -> String {
        format!("{}:top:{{{route}}}:{minute}", self.target.prefix)
    }

    /// One pipeline per fold (a route), all of them within [`FOLD_TIMEOUT`]; the first error
    /// ends the fold (the rest is dropped with it).
    pub(super) async fn fold_top(&self, folds: Vec<TopFold>) -> Result<(), StoreError> {
        match tokio::time::timeout(FOLD_TIMEOUT, self.fold_each(folds)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(FOLD_TIMEOUT)),
        }
    }

    async fn fold_each(&self, folds: Vec<TopFold>) -> Result<(), StoreError> {
        let ttl = TOP_TTL.as_secs();
        for fold in folds {
            let mut conn = self.live_conn_for(&fold.route).map(|c| (*c).clone())?;
            let base = self.top_base(&fold.route, fold.minute);
            let (denied, allowed) = (format!("{base}:d"), format!("{base}:a"));
            let limits: Vec<String> = (fold.limits.iter())
                .map(|name| format!("{base}:l:{name}"))
                .collect();
            let mut touched = vec![false; limits.len() + 2];
            let mut pipe = redis::pipe();
            for c in &fold.counts {
                if c.denied > 0 {
                    pipe.cmd("ZINCRBY")
                        .arg(&denied)
                        .arg(c.denied)
                        .arg(&c.bucket)
                        .ignore();
                    touched[0] = true;
                }
                if c.allowed > 0 {
                    pipe.cmd("ZINCRBY")
                        .arg(&allowed)
                        .arg(c.allowed)
                        .arg(&c.bucket)
                        .ignore();
                    touched[1] = true;
                }
                for (i, key) in limits.iter().enumerate() {
                    if c.refused & (1 << i.min(63)) != 0 {
                        pipe.cmd("ZINCRBY").arg(key).arg(1).arg(&c.bucket).ignore();
                        touched[i + 2] = true;
                    }
                }
            }
            let keys = [&denied, &allowed].into_iter().chain(&limits);
            for (key, _) in keys.zip(&touched).filter(|(_, t)| **t) {
                // The lowest scores past the kept ones go: bounded whatever the fleet sends.
                let past = -(KEEP_PER_MINUTE as i64) - 1;
                pipe.cmd("ZREMRANGEBYRANK")
                    .arg(key)
                    .arg(0)
                    .arg(past)
                    .ignore();
                pipe.cmd("EXPIRE").arg(key).arg(ttl).ignore();
            }
            within(FOLD_TIMEOUT, pipe.query_async::<()>(&mut conn)).await?;
        }
        Ok(())
    }

    /// Each minute's most denied, summed; then the admissions and refusing limits of the
    /// `query.max` most denied.
    pub(super) async fn read_top(&self, query: TopQuery) -> Result<Vec<TopCount>, StoreError> {
        let mut conn = self.live_conn_for(&query.route).map(|c| (*c).clone())?;
        let bases: Vec<String> = (query.minutes.iter())
            .map(|&m| self.top_base(&query.route, m))
            .collect();
        let mut pipe = redis::pipe();
        for base in &bases {
            let last = READ_PER_MINUTE.max(query.max) - 1;
            pipe.cmd("ZREVRANGE")
                .arg(format!("{base}:d"))
                .arg(0)
                .arg(last)
                .arg("WITHSCORES");
        }
        let timeout = self.target.timeout.max(FOLD_TIMEOUT);
        let per_minute: Vec<Vec<(String, f64)>> =
            within(timeout, pipe.query_async(&mut conn)).await?;
        let mut sums: HashMap<String, u64> = HashMap::new();
        for (bucket, score) in per_minute.into_iter().flatten() {
            *sums.entry(bucket).or_default() += score.max(0.0).round() as u64;
        }
        let mut top: Vec<TopCount> = (sums.into_iter())
            .map(|(bucket, denied)| TopCount {
                bucket,
                denied,
                ..TopCount::default()
            })
            .collect();
        top.sort_by(|a, b| {
            b.denied
                .cmp(&a.denied)
                .then_with(|| a.bucket.cmp(&b.bucket))
        });
        top.truncate(query.max);
        if top.is_empty() {
            return Ok(top);
        }
        let mut pipe = redis::pipe();
        let sets = std::iter::once("a".to_string())
            .chain(query.limits.iter().map(|name| format!("l:{name}")));
        let sets: Vec<String> = sets.collect();
        for base in &bases {
            for set in &sets {
                let mut cmd = redis::cmd("ZMSCORE");
                cmd.arg(format!("{base}:{set}"));
                for c in &top {
                    cmd.arg(&c.bucket);
                }
                pipe.add_command(cmd);
            }
        }
        let scores: Vec<Vec<Option<f64>>> = within(timeout, pipe.query_async(&mut conn)).await?;
        for (n, column) in scores.iter().enumerate() {
            let set = n % sets.len();
            for (count, score) in top.iter_mut().zip(column) {
                let Some(score) = score.filter(|s| *s > 0.0) else {
                    continue;
                };
                match set {
                    0 => count.allowed += score.round() as u64,
                    i => count.refused |= 1u64.checked_shl(i as u32 - 1).unwrap_or(0),
                }
            }
        }
        Ok(top)
    }
}
