//! Redis's `maxmemory-policy`, read at every (re)connect and by `slidegate -t` (issue 52 row 4).
//!
//! Every key slidegate writes has a TTL, so every policy but `noeviction` (`volatile-*` as
//! much as `allkeys-*`) lets Redis delete a bucket under memory pressure, and a deleted bucket
//! is an empty one: its client starts its window again. A key flood is exactly such pressure.
//! With `noeviction` a full Redis refuses the write instead (`OOM`), which the route's
//! `on_error` answers. So slidegate warns (a WARN line, `slidegate_redis_eviction_policy_unsafe`
//! = 1) when a master's policy may evict. The policy may be unreadable (`CONFIG` denied by the
//! ACL, renamed away, a managed service): that is said once, and the gauge is -1; it never
//! keeps the store from running.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::LazyLock;

use prometheus::{register_int_gauge, IntGauge};
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::Value;

use super::conn::{within, Conn, Target};
use super::RedisTarget;

/// `slidegate_redis_eviction_policy_unsafe`.
static UNSAFE: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "slidegate_redis_eviction_policy_unsafe",
        "1 when a Redis master's maxmemory-policy may evict rate-limit keys (anything but \
         noeviction), 0 when all say noeviction, -1 when it could not be read"
    )
    .expect("register slidegate_redis_eviction_policy_unsafe")
});

/// Register this module's metric at startup (at 0 until a connection says otherwise).
pub fn register_metrics() {
    LazyLock::force(&UNSAFE);
}

/// What the masters' `maxmemory-policy` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// Every master says `noeviction`.
    Never,
    /// These policies (one per master that has one) may evict limit keys.
    May(Vec<String>),
    /// It could not be read, and why.
    Unknown(String),
}

impl Eviction {
    /// The gauge's value.
    fn gauge(&self) -> i64 {
        match self {
            Eviction::Never => 0,
            Eviction::May(_) => 1,
            Eviction::Unknown(_) => -1,
        }
    }

    /// The warning to give, if any: what happens, and the fix.
    pub fn warning(&self) -> Option<String> {
        match self {
            Eviction::Never => None,
            Eviction::May(policies) => Some(format!(
                "Redis maxmemory-policy is {}: under memory pressure (a flood of new keys) Redis \
                 may evict rate-limit keys, and an evicted key is an empty window (a client at \
                 its limit is admitted again); set maxmemory-policy noeviction (docs/redis.md, \
                 \"Memory\")",
                policies.join(", ")
            )),
            Eviction::Unknown(why) => Some(format!(
                // One line, whatever the error's text holds.
                "cannot read Redis maxmemory-policy ({why}); make sure it is noeviction, or \
                 Redis may evict rate-limit keys under memory pressure (docs/redis.md, \"Memory\")",
                why = why.split_whitespace().collect::<Vec<_>>().join(" ")
            )),
        }
    }
}

/// May a Redis with this `maxmemory-policy` evict slidegate's keys (all of which have a TTL)?
pub fn may_evict(policy: &str) -> bool {
    !policy.eq_ignore_ascii_case("noeviction")
}

/// The verdict on `reply` to `CONFIG GET maxmemory-policy`: an array or map of name and value
/// (RESP2 or RESP3), or, from a Cluster, a map or array of such replies per master.
pub fn judge(reply: &Value) -> Eviction {
    let mut policies = Vec::new();
    collect(reply, &mut policies);
    if policies.is_empty() {
        return Eviction::Unknown("no maxmemory-policy in the reply".into());
    }
    let mut evicting: Vec<String> = policies.into_iter().filter(|p| may_evict(p)).collect();
    evicting.sort();
    evicting.dedup();
    match evicting.is_empty() {
        true => Eviction::Never,
        false => Eviction::May(evicting),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn collect(v: &Value, out: &mut Vec<String>) {
    let is_name = |k: &Value| text(k).is_some_and(|k| k.eq_ignore_ascii_case("maxmemory-policy"));
    match v {
        Value::Map(pairs) => {
            for (k, v) in pairs {
                match (is_name(k), text(v)) {
                    (true, Some(p)) => out.push(p),
                    _ => collect(v, out),
                }
            }
        }
        Value::Array(items) => {
            if let [k, v] = items.as_slice() {
                if let (true, Some(p)) = (is_name(k), text(v)) {
                    return out.push(p);
                }
            }
            items.iter().for_each(|i| collect(i, out));
        }
        _ => {}
    }
}

impl Conn {
    /// `CONFIG GET maxmemory-policy` on the server, or on every master of a Cluster.
    async fn maxmemory_policy(&mut self) -> redis::RedisResult<Value> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory-policy");
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => {
                let masters = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                c.route_command(cmd, masters).await
            }
        }
    }

    /// The masters' policy, within `timeout`.
    pub(super) async fn eviction(&mut self, timeout: std::time::Duration) -> Eviction {
        match within(timeout, self.maxmemory_policy()).await {
            Ok(reply) => judge(&reply),
            Err(e) => Eviction::Unknown(e.to_string()),
        }
    }
}

/// The last verdict reported, so each is logged once, not at every reconnect.
#[derive(Debug)]
pub(super) struct Reported(AtomicI64);

impl Default for Reported {
    fn default() -> Self {
        Reported(AtomicI64::new(i64::MIN))
    }
}

impl Reported {
    /// Set the gauge to `verdict`, and warn when it changed.
    pub(super) fn report(&self, label: &str, verdict: &Eviction) {
        let value = verdict.gauge();
        UNSAFE.set(value);
        if self.0.swap(value, Ordering::Relaxed) != value {
            match verdict.warning() {
                Some(w) => log::warn!("{label} store: {w}"),
                None => log::info!("{label} store: Redis maxmemory-policy is noeviction"),
            }
        }
    }
}

/// For `slidegate -t`: connect to `target` once and read its policy. A Redis that cannot be
/// reached is [`Eviction::Unknown`], never an error: `-t` checks the file, not the network.
pub async fn read_policy(target: &RedisTarget) -> Eviction {
    let target = match Target::new(target) {
        Ok(t) => t,
        Err(e) => return Eviction::Unknown(e.to_string()),
    };
    let mut conn: Conn = match target.connect().await {
        Ok(c) => c,
        Err(e) => return Eviction::Unknown(format!("cannot connect: {e}")),
    };
    conn.eviction(target.timeout * 4).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn pair(p: &str) -> Value {
        Value::Array(vec![bulk("maxmemory-policy"), bulk(p)])
    }

    #[test]
    fn only_noeviction_is_safe() {
        assert_eq!(judge(&pair("noeviction")), Eviction::Never);
        for p in [
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
        ] {
            assert_eq!(judge(&pair(p)), Eviction::May(vec![p.into()]), "{p}");
        }
        let resp3 = Value::Map(vec![(bulk("maxmemory-policy"), bulk("allkeys-lru"))]);
        assert_eq!(judge(&resp3), Eviction::May(vec!["allkeys-lru".into()]));
        // A Cluster: one reply per master; one evicting master is enough.
        let cluster = Value::Map(vec![
            (bulk("127.0.0.1:7000"), pair("noeviction")),
            (bulk("127.0.0.1:7001"), pair("volatile-lru")),
        ]);
        assert_eq!(judge(&cluster), Eviction::May(vec!["volatile-lru".into()]));
        assert!(matches!(judge(&Value::Array(vec![])), Eviction::Unknown(_)));
    }
}
