//! One script call: the Redis keys of a decision, the `EVALSHA` of one or more decisions,
//! sending it through the gate's bookkeeping, and reading its reply ([`ScriptReply`]); what the
//! coalescer sends its batches through ([`Backend`], whose sender keeps the calls' deadline).
//! Encoding, call and decoding sit in one file so that a decision's path on Redis reads in one
//! place.

use std::future::Future;
use std::time::Duration;

use super::conn::{classified, connection_lost, Conn};
use super::{Inner, SCRIPT};
use crate::limiter::algo::REPLY_LEN;
use crate::limiter::coalesce::sender::{Backend, Coalescer};
use crate::limiter::coalesce::Pending;
use crate::limiter::{Checked, Limit, StoreError, Verdict};

impl Backend for Inner {
    fn coalescer(&self) -> &Coalescer {
        &self.coalescer
    }

    fn lane_of(&self, bucket: &str) -> usize {
        self.target.lane_of(bucket)
    }

    fn generation(&self) -> u64 {
        self.gate.generation()
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.io.spawn(task);
    }

    fn deadline(&self) -> Duration {
        self.target.timeout
    }

    fn timed_out(&self, error: &StoreError) {
        // (On a Cluster, a timeout fails its own call only: see `shards.rs`.)
        self.gate.call_failed(error);
    }

    /// One `EVALSHA` of the whole batch; a reply of the wrong length fails every decision (it
    /// is still an answer: the lane saw the store answering).
    async fn send(&self, batch: &[Pending]) -> Result<Vec<Checked>, StoreError> {
        // (A batch is one lane's: every decision's bucket is in its first's slot.)
        let bucket = &batch.first().expect("a batch is never empty").bucket;
        let conn = self.live_conn_for(bucket)?;
        let evalsha = self.evalsha(batch);
        let mut reply = self
            .call(&conn, &evalsha, self.target.lane_of(bucket))
            .await?;
        let expected: usize = batch.iter().map(|p| 1 + 2 * p.limits.len()).sum();
        if reply.len() != expected {
            let error = StoreError::Backend(format!(
                "script reply has {} integers for {} decisions, expected {expected}",
                reply.len(),
                batch.len()
            ));
            return Ok(vec![Err(error); batch.len()]);
        }
        Ok(batch
            .iter()
            .map(|p| reply.next_verdict(&p.limits))
            .collect())
    }
}

impl Inner {
    /// See [`super::RedisStore::key`].
    pub(super) fn key(&self, bucket: &str, limit: &Limit) -> String {
        let mut key = Vec::new();
        self.write_key(&mut key, bucket, limit);
        String::from_utf8(key).expect("prefix and bucket are UTF-8")
    }

    /// Write [`super::RedisStore::key`] into `out` (cleared first), without allocating.
    fn write_key(&self, out: &mut Vec<u8>, bucket: &str, limit: &Limit) {
        debug_assert!(
            !bucket.contains(['{', '}']),
            "bucket {bucket:?} contains a brace"
        );
        out.clear();
        out.extend_from_slice(self.target.prefix.as_bytes());
        out.extend_from_slice(b":{");
        out.extend_from_slice(bucket.as_bytes());
        out.extend_from_slice(b"}:");
        limit.id().push_key_suffix(out);
    }

    /// Send one `EVALSHA` and parse its reply. It is sent as soon as its batch leaves the queue
    /// (at most a few other calls of its lane are ahead of it on the connection, each short), so
    /// it waits `store.timeout` for its own answer: the lane's sender fails it then (see
    /// `coalesce/deadline.rs`; [`Backend::timed_out`] tells the gate). The gate learns of
    /// every answer and every other failure here; on a Cluster, a lost connection also has
    /// `lane`'s master PINGed at once (`shards.rs`).
    async fn call(
        &self,
        conn: &Conn,
        evalsha: &redis::Cmd,
        lane: usize,
    ) -> Result<ScriptReply, StoreError> {
        let mut conn = conn.clone();
        let result = conn.decide(evalsha).await;
        let lost = matches!(&result, Err(e) if connection_lost(e));
        match classified(self.target.timeout, result) {
            Ok(reply) => {
                self.gate.answered();
                ScriptReply::parse(reply)
            }
            Err(error) => {
                self.gate.call_failed(&error);
                let shards = self.shards.as_ref().filter(|_| lost);
                if let Some(check) = shards.and_then(|shards| shards.probe_owner(lane)) {
                    self.io.spawn(check);
                }
                Err(error)
            }
        }
    }

    /// The `EVALSHA` of some decisions, written straight into one command buffer: keys built
    /// in a reused scratch buffer, integers formatted without allocating (redis-rs writes them
    /// with itoa), no intermediate `Vec<Vec<u8>>` of keys and args.
    /// A decision's keys may name different buckets (`limits[].key`): the script takes any
    /// key per limit, so a stacked decision is still one atomic run. A decision whose limits
    /// are the decision before's is written as one value, [`SAME_LIMITS`].
    fn evalsha(&self, decisions: &[Pending]) -> redis::Cmd {
        let (mut keys, mut key_bytes) = (0, 0);
        for p in decisions {
            keys += p.limits.len();
            key_bytes += p.limits.len() * (self.target.prefix.len() + p.bucket.len() + 16);
        }
        let mut cmd = redis::Cmd::with_capacity(3 + 4 * keys, 64 + key_bytes + keys * 32);
        cmd.arg("EVALSHA").arg(SCRIPT.get_hash()).arg(keys);
        let mut key = Vec::with_capacity(64);
        for p in decisions {
            for (i, limit) in p.limits.iter().enumerate() {
                self.write_key(&mut key, p.bucket_of(i), limit);
                cmd.arg(&key[..]);
            }
        }
        let mut before: &[Limit] = &[];
        for Pending { limits, .. } in decisions {
            if same_args(limits, before) {
                cmd.arg(SAME_LIMITS);
                continue;
            }
            cmd.arg(limits.len());
            for limit in limits {
                for arg in limit.script_args() {
                    cmd.arg(arg);
                }
            }
            before = limits;
        }
        cmd
    }
}

/// A decision's ARGV when its limits' values are the decision before's (see ARGV in
/// `lua/sliding_window/skeleton.lua`): a batch is mostly one route's requests, and Redis pays
/// about 1k instructions per value it reads into the script.
const SAME_LIMITS: &str = "=";

/// Whether `limits` give the script the same ARGV as `before` (never true of the first
/// decision of a call, whose `before` is empty).
fn same_args(limits: &[Limit], before: &[Limit]) -> bool {
    !before.is_empty()
        && limits.len() == before.len()
        && limits
            .iter()
            .zip(before)
            .all(|(a, b)| a.script_args() == b.script_args())
}

// ---------------------------------------------------------------------------------------------
// The reply.
//
// The sliding-window script's reply (see REPLY in `lua/sliding_window/skeleton.lua`): one binary
// string of integers packed as big-endian doubles, 1 + 2n per decision; when a decision
// failed, an array of that string and one message per failed decision. This module reads the
// envelope (the status of each decision, the errors); each limit's integers are decoded by its
// kind ([`Limit::state_from_reply`]).
//
// One string, not an array of integers: redis-rs parses every RESP value through a general
// parser at about 1.5k instructions each, so a reply of 3 integers per decision cost more
// than the rest of the decision's client side. Doubles, not decimal text: Lua formats a number
// as text with `sprintf`, about 1 µs of Redis CPU per call; packing it is a copy.

/// A parsed reply, read decision by decision.
pub(super) struct ScriptReply {
    numbers: Vec<i64>,
    /// Next unread number.
    at: usize,
    errors: std::vec::IntoIter<redis::Value>,
}

impl ScriptReply {
    /// Parse a reply, checking its shape.
    pub(super) fn parse(reply: redis::Value) -> Result<ScriptReply, StoreError> {
        let bad = |reply: &redis::Value| {
            StoreError::Backend(format!("unexpected script reply {reply:?}"))
        };
        let (packed, errors) = match reply {
            redis::Value::BulkString(packed) => (packed, Vec::new()),
            redis::Value::Array(items) => {
                let mut items = items.into_iter();
                match items.next() {
                    Some(redis::Value::BulkString(packed)) => (packed, items.collect()),
                    first => return Err(bad(&redis::Value::Array(first.into_iter().collect()))),
                }
            }
            other => return Err(bad(&other)),
        };
        match parse_integers(&packed) {
            Some(numbers) => Ok(ScriptReply {
                numbers,
                at: 0,
                errors: errors.into_iter(),
            }),
            None => Err(bad(&redis::Value::BulkString(packed))),
        }
    }

    /// How many integers the reply carries (1 + [`REPLY_LEN`] n per decision).
    pub(super) fn len(&self) -> usize {
        self.numbers.len()
    }

    /// The verdict of the next decision, which has `limits`.
    pub(super) fn next_verdict(&mut self, limits: &[Limit]) -> Result<Verdict, StoreError> {
        let len = 1 + REPLY_LEN * limits.len();
        let Some(decision) = self.numbers.get(self.at..self.at + len) else {
            return Err(StoreError::Backend(format!(
                "script reply too short: {} integers, decision at {} needs {len}",
                self.numbers.len(),
                self.at
            )));
        };
        self.at += len;
        // The status is the decision's `now` when admitted.
        let (admitted, recorded_at) = match decision[0] {
            at if at > 0 => (true, Some(at as u64)),
            0 => (false, None),
            // This decision failed inside the script (a key of another type, say).
            _ => {
                let message = match self.errors.next() {
                    Some(redis::Value::BulkString(msg)) => {
                        String::from_utf8_lossy(&msg).into_owned()
                    }
                    other => format!("decision failed, message {other:?}"),
                };
                return Err(StoreError::Backend(message));
            }
        };
        let states = decision[1..]
            .chunks_exact(REPLY_LEN)
            .zip(limits)
            .map(|(values, limit)| limit.state_from_reply(values))
            .collect();
        Ok(Verdict {
            admitted,
            states,
            recorded_at,
            recorded_each: Vec::new(),
        })
    }
}

/// Eight bytes per integer, each a big-endian IEEE 754 double holding an exact integer
/// (`|v| < 2^53`); `None` for any other length or value.
fn parse_integers(packed: &[u8]) -> Option<Vec<i64>> {
    const EXACT: f64 = (1u64 << 53) as f64;
    if packed.is_empty() || !packed.len().is_multiple_of(8) {
        return None;
    }
    packed
        .chunks_exact(8)
        .map(|b| {
            let v = f64::from_be_bytes(b.try_into().expect("8 bytes"));
            (v.fract() == 0.0 && v.abs() < EXACT).then_some(v as i64)
        })
        .collect()
}

#[cfg(test)]
mod tests;
