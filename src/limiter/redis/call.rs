//! One script call: the Redis keys of a decision, the `EVALSHA` of one or more decisions, and
//! sending it through the gate's bookkeeping; what the coalescer sends its batches through
//! ([`Backend`]).

use std::future::Future;

use super::conn::{classified, Conn};
use super::reply::ScriptReply;
use super::{Inner, SCRIPT};
use crate::limiter::coalesce::patience;
use crate::limiter::coalesce::sender::{Backend, Coalescer};
use crate::limiter::coalesce::Pending;
use crate::limiter::{Checked, Limit, StoreError};

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

    /// One `EVALSHA` of the whole batch; a reply of the wrong length fails every decision (it
    /// is still an answer: the lane saw the store answering).
    async fn send(&self, batch: &[Pending]) -> Result<Vec<Checked>, StoreError> {
        let conn = self.live_conn()?;
        let evalsha = self.evalsha(batch);
        let mut reply = self.call(&conn, &evalsha).await?;
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
    /// it waits `store.timeout` for its own answer, not counting time the proxy itself was too
    /// busy to notice one (`patience.rs`). The gate learns of every answer and every failure.
    async fn call(&self, conn: &Conn, evalsha: &redis::Cmd) -> Result<ScriptReply, StoreError> {
        let mut conn = conn.clone();
        let answer = async { classified(self.target.timeout, conn.decide(evalsha).await) };
        match patience::wait(self.target.timeout, || None, answer).await {
            Ok(reply) => {
                self.gate.answered();
                ScriptReply::parse(reply)
            }
            Err(error) => {
                self.gate.call_failed(&error);
                Err(error)
            }
        }
    }

    /// The `EVALSHA` of some decisions, written straight into one command buffer: keys built
    /// in a reused scratch buffer, integers formatted without allocating (redis-rs writes them
    /// with itoa), no intermediate `Vec<Vec<u8>>` of keys and args.
    /// A decision's keys may name different buckets (`limits[].key`): the script takes any
    /// key per limit, so a stacked decision is still one atomic run.
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
        for Pending { limits, .. } in decisions {
            cmd.arg(limits.len());
            for limit in limits {
                for arg in limit.script_args() {
                    cmd.arg(arg);
                }
            }
        }
        cmd
    }
}
