//! Script-level tests of the sliding-window script (`lua/sliding_window/skeleton.lua` with
//! `lua/kinds/*.lua`), run against a real `redis-server`: keys and TTLs, entries, the clock
//! guard, eviction, reset values, NOSCRIPT recovery, memory per entry and Redis CPU per call.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::redis::{wait_ready, RedisServer};
use common::script::{eval_decisions, integers, redis_time, ScriptLimit};
use common::store::ROUTE;
use redis::{Connection, Script};
use slidegate::limiter::redis::{RedisStore, SCRIPT_SOURCE};
use slidegate::limiter::{Buckets, Limit, Store};

const MARGIN_MS: i64 = 1000;

/// Serializes the CPU- and memory-heavy tests of this file, so that one does not inflate the
/// other's measurements.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The script's reply, decoded.
#[derive(Debug)]
struct Reply {
    admitted: bool,
    /// (remaining, reset µs) per limit.
    states: Vec<(i64, i64)>,
}

/// Run the script once; `limits` are (requests, window ms), one per key.
fn eval(conn: &mut Connection, keys: &[&str], limits: &[(u32, i64)]) -> Reply {
    let logs: Vec<ScriptLimit> = limits.iter().map(|&(r, w)| (r, w, 0)).collect();
    let raw = integers(eval_decisions(conn, &[(keys, &logs)]));
    assert_eq!(raw.len(), 1 + 2 * keys.len(), "reply shape: {raw:?}");
    Reply {
        // An admission's status is the decision's clock (µs), a denial's 0.
        admitted: raw[0] > 0,
        states: raw[1..].chunks(2).map(|c| (c[0], c[1])).collect(),
    }
}

fn entries(conn: &mut Connection, key: &str) -> Vec<i64> {
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap()
}

fn pttl(conn: &mut Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).unwrap()
}

#[test]
fn every_written_key_gets_a_ttl_within_window_plus_margin() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let keys = ["t:{r:c}:250", "t:{r:c}:1000", "t:{r:c}:60000"];
    // The 60 s limit fills first, so the third call is denied whatever the machine's speed.
    let limits = [(10, 250), (10, 1000), (2, 60_000)];

    let first = eval(&mut conn, &keys, &limits);
    assert!(first.admitted);
    for (key, (_, window_ms)) in keys.iter().zip(limits) {
        let ttl = pttl(&mut conn, key);
        assert!(
            ttl > 0 && ttl <= window_ms + MARGIN_MS,
            "{key}: PTTL {ttl} ms, window {window_ms} ms"
        );
    }

    // Only the declared keys exist: no sequence counters or other side keys.
    let mut all: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    all.sort();
    let mut declared: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    declared.sort();
    assert_eq!(all, declared);

    // A denied call writes nothing, so it does not extend any TTL.
    assert!(eval(&mut conn, &keys, &limits).admitted);
    let before: Vec<i64> = keys.iter().map(|k| pttl(&mut conn, k)).collect();
    std::thread::sleep(Duration::from_millis(20));
    let denied = eval(&mut conn, &keys, &limits);
    assert!(!denied.admitted);
    for (key, before) in keys.iter().zip(before) {
        assert!(
            pttl(&mut conn, key) < before,
            "{key}: TTL refreshed by a denied call"
        );
    }
    assert_eq!(
        entries(&mut conn, keys[2]).len(),
        2,
        "denied call was recorded"
    );
}

#[test]
fn idle_key_expires_after_window_plus_margin() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "t:{r:c}:100";
    assert!(eval(&mut conn, &[key], &[(10, 100)]).admitted);
    let exists: bool = redis::cmd("EXISTS").arg(key).query(&mut conn).unwrap();
    assert!(exists);
    std::thread::sleep(Duration::from_millis(100 + MARGIN_MS as u64 + 100));
    let exists: bool = redis::cmd("EXISTS").arg(key).query(&mut conn).unwrap();
    assert!(!exists, "idle key outlived window + margin");
}

#[test]
fn key_never_expires_while_an_entry_is_in_its_window() {
    // PEXPIRE is sent at most once per 500 ms epoch per key, not on every admission: check
    // that, under steady traffic, the key always outlives its newest entry's window.
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "t:{r:c}:300";
    let window_us = 300_000;
    let mut admitted = 0;
    let deadline = std::time::Instant::now() + Duration::from_millis(2500);
    while std::time::Instant::now() < deadline {
        assert!(eval(&mut conn, &[key], &[(1000, 300)]).admitted);
        admitted += 1;
        let newest = *entries(&mut conn, key).last().unwrap();
        let ttl_ms = pttl(&mut conn, key);
        let t = redis_time(&mut conn);
        assert!(ttl_ms > 0, "no TTL after {admitted} admissions");
        assert!(ttl_ms <= 300 + MARGIN_MS);
        // PTTL is rounded to ms: allow 1 ms.
        assert!(
            t + ttl_ms * 1000 + 1000 >= newest + window_us,
            "key expires {} µs before its newest entry leaves the window",
            newest + window_us - t - ttl_ms * 1000
        );
        std::thread::sleep(Duration::from_millis(7));
    }
    assert!(admitted > 100);
}

#[test]
fn same_microsecond_requests_are_two_entries() {
    // Force identical timestamps deterministically: an entry in the future makes the clock
    // guard pin `now` to it, so both calls below run at the very same microsecond.
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "t:{r:c}:60000";
    let future = redis_time(&mut conn) + 5_000_000;
    let _: () = redis::cmd("RPUSH")
        .arg(key)
        .arg(future)
        .query(&mut conn)
        .unwrap();

    let a = eval(&mut conn, &[key], &[(10, 60_000)]);
    let b = eval(&mut conn, &[key], &[(10, 60_000)]);
    assert!(a.admitted && b.admitted);
    assert_eq!(a.states[0].0, 8);
    assert_eq!(b.states[0].0, 7);
    assert_eq!(entries(&mut conn, key), vec![future, future, future]);
    // Reset is measured from the guarded `now`, i.e. exactly one window.
    assert_eq!(b.states[0].1, 60_000_000);
}

#[test]
fn clock_guard_takes_the_newest_entry_of_any_list() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let (a, b) = ("t:{r:c}:1000", "t:{r:c}:60000");
    let future = redis_time(&mut conn) + 3_000_000;
    let _: () = redis::cmd("RPUSH")
        .arg(b)
        .arg(future)
        .query(&mut conn)
        .unwrap();

    let reply = eval(&mut conn, &[a, b], &[(5, 1000), (5, 60_000)]);
    assert!(reply.admitted);
    assert_eq!(entries(&mut conn, a), vec![future]);
    assert_eq!(entries(&mut conn, b), vec![future, future]);
    // Both lists stay sorted; entries are plain integers (listpack-encodable).
    assert_eq!(reply.states[0], (4, 1_000_000));
    assert_eq!(reply.states[1], (3, 60_000_000));
}

#[test]
fn entries_are_integer_microseconds_in_order() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "t:{r:c}:60000";
    let before = redis_time(&mut conn);
    for _ in 0..50 {
        assert!(eval(&mut conn, &[key], &[(100, 60_000)]).admitted);
    }
    let after = redis_time(&mut conn);
    let list = entries(&mut conn, key);
    assert_eq!(list.len(), 50);
    assert!(
        list.windows(2).all(|w| w[0] <= w[1]),
        "not sorted: {list:?}"
    );
    assert!(list[0] >= before && list[49] <= after);
}

/// Every split of a list into an expired prefix and entries in the window, decided by a call of
/// `batch` decisions of that one list (a busy client's batch): the first decision finds the
/// prefix (the first two entries, then one LRANGE of the next 2 to 16, the run's length, bisected
/// in memory, then LINDEX probes for longer prefixes) and trims exactly it; the next ones push
/// theirs.
#[test]
fn expired_prefix_is_trimmed_exactly_at_every_split() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let cases = [
        (1, 0),
        (1, 1),
        (2, 1),
        (2, 2),
        (3, 1),
        (3, 2),
        (10, 0),
        (10, 1),
        (10, 4),
        (10, 5),
        (10, 9),
        (10, 10),
        (40, 6),
        (40, 7),
        (40, 8),
        (40, 16),
        (40, 17),
        (40, 18),
        (40, 19),
        (40, 39),
        (1000, 1),
        (1000, 2),
        (1000, 3),
        (1000, 255),
        (1000, 256),
        (1000, 257),
        (1000, 511),
        (1000, 700),
        (1000, 998),
        (1000, 999),
        (1000, 1000),
    ];
    // 1 and 2 read 2 entries in one range, 6 six, 16 and 20 sixteen.
    for batch in [1, 2, 6, 16, 20] {
        for (total, expired) in cases {
            trims_exactly(&mut conn, total, expired, batch);
        }
    }
}

fn trims_exactly(conn: &mut Connection, total: i64, expired: i64, batch: usize) {
    let key = "t:{r:c}:60000";
    let window_us = 60_000_000i64;
    let case = format!("case {total}/{expired}, {batch} a call");
    let _: () = redis::cmd("DEL").arg(key).query(conn).unwrap();
    let t = redis_time(conn);
    let list: Vec<i64> = (0..total)
        .map(|i| {
            if i < expired {
                t - 2 * window_us + i // long gone
            } else {
                t - window_us / 2 + i // well inside the window
            }
        })
        .collect();
    for chunk in list.chunks(500) {
        let _: () = redis::cmd("RPUSH").arg(key).arg(chunk).query(conn).unwrap();
    }
    let requests = (total + batch as i64) as u32;
    let keys: &[&str] = &[key];
    let limits = &[(requests, 60_000)][..];
    let t0 = redis_time(conn);
    let reply = integers(eval_batch(conn, &vec![(keys, limits); batch]));
    let t1 = redis_time(conn);
    assert_eq!(reply.len(), 3 * batch, "{case}: {reply:?}");
    assert!(reply.chunks(3).all(|d| d[0] > 0), "{case}: {reply:?}");
    let kept = (total - expired) as usize;
    let now_list = entries(conn, key);
    assert_eq!(now_list.len(), kept + batch, "{case}");
    assert_eq!(&now_list[..kept], &list[expired as usize..], "{case}");
    let (remaining, reset) = (reply[1], reply[2]);
    assert_eq!(remaining, requests as i64 - kept as i64 - 1, "{case}");
    let oldest = now_list[0];
    assert!(
        reset >= oldest + window_us - t1 && reset <= oldest + window_us - t0,
        "{case}: reset {reset}"
    );
}

#[test]
fn entry_exactly_one_window_old_has_left_the_window() {
    // Boundary rule shared with the memory store: an entry at t leaves the window at t + window.
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "t:{r:c}:1000";
    // Pin `now` with a future entry in another list of the same call, then place an entry of
    // this list exactly one window before it.
    let guard = "t:{r:c}:60000";
    let now = redis_time(&mut conn) + 5_000_000;
    let _: () = redis::cmd("RPUSH")
        .arg(guard)
        .arg(now)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(key)
        .arg(now - 1_000_000)
        .arg(now - 999_999)
        .query(&mut conn)
        .unwrap();
    let reply = eval(&mut conn, &[key, guard], &[(2, 1000), (100, 60_000)]);
    // now - window evicted, now - window + 1 µs kept: one slot was free.
    assert!(reply.admitted);
    assert_eq!(entries(&mut conn, key), vec![now - 999_999, now]);
    assert_eq!(reply.states[0], (0, 1));
}

#[test]
fn full_limit_reset_is_oldest_plus_window_minus_now() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "t:{r:c}:10000";
    let window_us = 10_000_000;
    for expected in [2, 1, 0] {
        let r = eval(&mut conn, &[key], &[(3, 10_000)]);
        assert!(r.admitted);
        assert_eq!(r.states[0].0, expected);
    }
    std::thread::sleep(Duration::from_millis(30));
    let oldest = entries(&mut conn, key)[0];
    let t0 = redis_time(&mut conn);
    let denied = eval(&mut conn, &[key], &[(3, 10_000)]);
    let t1 = redis_time(&mut conn);
    assert!(!denied.admitted);
    let (remaining, reset) = denied.states[0];
    assert_eq!(remaining, 0);
    assert!(
        reset >= oldest + window_us - t1 && reset <= oldest + window_us - t0,
        "reset {reset} µs not in [{}, {}]",
        oldest + window_us - t1,
        oldest + window_us - t0
    );
}

#[test]
fn lowered_requests_keep_state_and_reset_waits_for_enough_entries() {
    // A reload from 10 to 5 requests per window keeps the key (same window) and its 10
    // entries; the limit admits again only when 6 of them have left, i.e. when entry[5] does.
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "t:{r:c}:10000";
    let window_us = 10_000_000;
    for _ in 0..10 {
        assert!(eval(&mut conn, &[key], &[(10, 10_000)]).admitted);
    }
    let list = entries(&mut conn, key);
    let t0 = redis_time(&mut conn);
    let denied = eval(&mut conn, &[key], &[(5, 10_000)]);
    let t1 = redis_time(&mut conn);
    assert!(!denied.admitted);
    let (remaining, reset) = denied.states[0];
    assert_eq!(remaining, 0);
    assert!(reset >= list[5] + window_us - t1 && reset <= list[5] + window_us - t0);
    assert_eq!(entries(&mut conn, key).len(), 10);
}

#[test]
fn stacked_limits_record_in_all_or_none() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let keys = ["t:{r:c}:1000", "t:{r:c}:10000"];
    let limits = [(3, 1000), (5, 10_000)];
    for _ in 0..3 {
        assert!(eval(&mut conn, &keys, &limits).admitted);
    }
    for _ in 0..5 {
        let r = eval(&mut conn, &keys, &limits);
        assert!(!r.admitted);
        assert_eq!(r.states[0].0, 0);
        assert_eq!(
            r.states[1].0, 2,
            "denied request recorded in the 10 s limit"
        );
    }
    assert_eq!(entries(&mut conn, keys[1]).len(), 3);
}

fn rpush(conn: &mut Connection, key: &str, values: &[i64]) {
    let _: () = redis::cmd("RPUSH")
        .arg(key)
        .arg(values)
        .query(conn)
        .unwrap();
}

/// Redis's count of writes since the last save: a call that writes nothing leaves it alone.
fn dirty(conn: &mut Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("persistence").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("rdb_changes_since_last_save:"))
        .expect("rdb_changes_since_last_save")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn clock_step_back_with_head_in_window_still_reads_the_newest_entry() {
    // The newest entry is skipped only when the head has left the window by TIME. Here the
    // head is still in it, and the newest entry is ahead of TIME (the clock stepped back):
    // the new entry must take the newest's time, not TIME, so the list stays sorted.
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "t:{r:c}:10000";
    let t = redis_time(&mut conn);
    let future = t + 3_000_000;
    rpush(&mut conn, key, &[t - 5_000_000, t - 4_000_000, future]);
    let reply = eval(&mut conn, &[key], &[(10, 10_000)]);
    assert!(reply.admitted);
    assert_eq!(
        entries(&mut conn, key),
        vec![t - 5_000_000, t - 4_000_000, future, future]
    );
    // now = future: the oldest entry leaves at t - 5 s + 10 s.
    assert_eq!(reply.states[0], (6, t - 5_000_000 + 10_000_000 - future));
}

#[test]
fn step_back_on_one_list_moves_now_for_a_list_whose_head_left() {
    // List a's head left its 1 s window by TIME, so a's newest is not read; list b's newest is
    // ahead of TIME. `now` is b's newest, and a is evicted against it.
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let (a, b) = ("t:{r:c}:1000", "t:{r:c}:60000");
    let t = redis_time(&mut conn);
    let future = t + 400_000;
    // a: head gone by TIME; the second entry is in the window by TIME but not by `future`.
    rpush(&mut conn, a, &[t - 1_500_000, t - 700_000, t - 300_000]);
    rpush(&mut conn, b, &[future]);
    let reply = eval(&mut conn, &[a, b], &[(10, 1000), (10, 60_000)]);
    assert!(reply.admitted);
    assert_eq!(entries(&mut conn, a), vec![t - 300_000, future]);
    assert_eq!(entries(&mut conn, b), vec![future, future]);
    assert_eq!(reply.states[0], (8, t - 300_000 + 1_000_000 - future));
}

#[test]
fn denied_call_writes_nothing_even_with_expired_entries() {
    // Limit b is full; limit a holds expired entries. The denial evicts nothing, refreshes no
    // TTL, records nothing: Redis counts no write at all.
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let (a, b) = ("t:{r:c}:1000", "t:{r:c}:60000");
    let t = redis_time(&mut conn);
    rpush(&mut conn, a, &[t - 3_000_000, t - 2_000_000, t - 100_000]);
    rpush(&mut conn, b, &[t - 1_000_000, t - 500_000]);
    let before = dirty(&mut conn);
    let reply = eval(&mut conn, &[a, b], &[(5, 1000), (2, 60_000)]);
    assert!(!reply.admitted);
    assert_eq!(dirty(&mut conn), before, "a denied call wrote");
    assert_eq!(
        entries(&mut conn, a),
        vec![t - 3_000_000, t - 2_000_000, t - 100_000]
    );
    // a counts only its one entry in the window; b is full.
    assert_eq!(reply.states[0].0, 4);
    assert_eq!(reply.states[1].0, 0);
    // The next admitted call evicts what slid out.
    let _: () = redis::cmd("DEL").arg(b).query(&mut conn).unwrap();
    assert!(eval(&mut conn, &[a, b], &[(5, 1000), (2, 60_000)]).admitted);
    let list = entries(&mut conn, a);
    assert_eq!(list.len(), 2);
    assert_eq!(list[0], t - 100_000);
}

#[test]
fn lowered_requests_reset_counts_from_the_window_not_the_expired_prefix() {
    // A denial trims nothing, so with expired entries still at the head, the entry whose
    // leaving frees room is entry[expired + count - requests] of the stored list.
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "t:{r:c}:10000";
    let t = redis_time(&mut conn);
    let expired = [t - 30_000_000, t - 20_000_000];
    let in_window: Vec<i64> = (0..8).map(|i| t - 8_000_000 + i * 500_000).collect();
    rpush(&mut conn, key, &expired);
    rpush(&mut conn, key, &in_window);
    let t0 = redis_time(&mut conn);
    let denied = eval(&mut conn, &[key], &[(5, 10_000)]);
    let t1 = redis_time(&mut conn);
    assert!(!denied.admitted);
    let (remaining, reset) = denied.states[0];
    assert_eq!(remaining, 0);
    // 8 in the window, 5 allowed: admits again when in_window[3] leaves.
    let frees = in_window[3] + 10_000_000;
    assert!(reset >= frees - t1 && reset <= frees - t0, "reset {reset}");
    assert_eq!(entries(&mut conn, key).len(), 10, "a denial trimmed");
}

#[test]
fn ttl_is_set_on_every_admission_path() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let w = 1000; // ms: at least a TTL epoch, so the PTTL path is reachable
    let check = |conn: &mut Connection, key: &str, what: &str| {
        let ttl = pttl(conn, key);
        assert!(
            ttl > w && ttl <= w + MARGIN_MS,
            "{what}: PTTL {ttl} ms, window {w} ms"
        );
    };
    let t = redis_time(&mut conn);

    // Empty list: the push creates the key.
    let key = "t:{r:empty}:1000";
    assert!(eval(&mut conn, &[key], &[(10, w)]).admitted);
    check(&mut conn, key, "empty");

    // Every entry slid out (DEL, then a new key).
    let key = "t:{r:all}:1000";
    rpush(
        &mut conn,
        key,
        &[t - 5_000_000, t - 4_000_000, t - 3_000_000],
    );
    assert!(eval(&mut conn, &[key], &[(10, w)]).admitted);
    assert_eq!(entries(&mut conn, key).len(), 1);
    check(&mut conn, key, "all expired");

    // One entry slid out (LPOP), the newest not read, the last TTL set long ago: PTTL says so
    // and the TTL is refreshed.
    let key = "t:{r:one}:1000";
    rpush(&mut conn, key, &[t - 1_500_000, t - 700_000, t - 600_000]);
    let _: () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(300)
        .query(&mut conn)
        .unwrap();
    assert!(eval(&mut conn, &[key], &[(10, w)]).admitted);
    assert_eq!(entries(&mut conn, key).len(), 3);
    check(&mut conn, key, "one expired, old TTL");

    // Same, with a TTL just set: no PEXPIRE (at most one per 500 ms epoch), and the key still
    // outlives its newest entry's window.
    let key = "t:{r:fresh}:1000";
    let t = redis_time(&mut conn);
    rpush(&mut conn, key, &[t - 1_500_000, t - 700_000, t - 600_000]);
    let _: () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(w + MARGIN_MS)
        .query(&mut conn)
        .unwrap();
    let before = pttl(&mut conn, key);
    assert!(eval(&mut conn, &[key], &[(10, w)]).admitted);
    let after = pttl(&mut conn, key);
    assert!(after <= before, "TTL refreshed twice in one epoch");
    assert!(
        after > w,
        "key may expire before its newest entry leaves: {after} ms"
    );

    // Several slid out (LTRIM).
    let key = "t:{r:some}:1000";
    let t = redis_time(&mut conn);
    rpush(
        &mut conn,
        key,
        &[t - 2_500_000, t - 2_000_000, t - 1_500_000, t - 600_000],
    );
    assert!(eval(&mut conn, &[key], &[(10, w)]).admitted);
    assert_eq!(entries(&mut conn, key).len(), 2);
    check(&mut conn, key, "several expired");

    // Nothing slid out (newest read).
    let key = "t:{r:none}:1000";
    rpush(&mut conn, key, &[t - 600_000, t - 500_000]);
    assert!(eval(&mut conn, &[key], &[(10, w)]).admitted);
    check(&mut conn, key, "none expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_after_script_flush_recovers_through_store() {
    let redis = RedisServer::start();
    let store = Arc::new(RedisStore::new(&redis.redis_target(Duration::from_secs(1))).unwrap());
    wait_ready(store.as_ref(), Duration::from_secs(10)).await;
    let limits = [Limit::log(10, Duration::from_secs(60))];

    let first = store
        .check(ROUTE, &Buckets::one("route:client"), &limits)
        .await
        .unwrap();
    assert_eq!(first.states[0].remaining, 9);

    let mut conn = redis.connection();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    let sha = Script::new(SCRIPT_SOURCE).get_hash().to_string();
    let exists: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&sha)
        .query(&mut conn)
        .unwrap();
    assert_eq!(exists, vec![false]);

    let second = store
        .check(ROUTE, &Buckets::one("route:client"), &limits)
        .await
        .unwrap();
    assert!(second.admitted);
    assert_eq!(
        second.states[0].remaining, 8,
        "state survives a script flush"
    );
    let exists: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&sha)
        .query(&mut conn)
        .unwrap();
    assert_eq!(exists, vec![true], "script reloaded");
}

/// MEMORY USAGE of one key, in bytes, counting every element.
fn memory_usage(conn: &mut Connection, key: &str) -> i64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query(conn)
        .unwrap()
}

/// The seeds' sorted-set script (seed 000), verbatim, with proxy-clock milliseconds.
const SEED_ZSET_SCRIPT: &str = r"
local key    = KEYS[1]
local now    = tonumber(ARGV[1])
local window = tonumber(ARGV[2])  -- milliseconds
local limit  = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)
if count >= limit then
  return 0
end
redis.call('ZADD', key, now, now .. '-' .. redis.call('INCR', key .. ':seq'))
redis.call('EXPIRE', key, math.ceil(window / 1000) + 1)
return 1
";

#[test]
fn memory_per_entry_list_vs_seed_zset_at_100k() {
    const N: usize = 100_000;
    const BATCH: usize = 1000;
    let _alone = alone();
    let redis = RedisServer::start();
    let mut conn = redis.connection();

    // Our LIST, filled by the real script: 100k admitted requests in one hour-long window.
    let list_key = "m:{r:c}:3600000";
    let sha = Script::new(SCRIPT_SOURCE).load(&mut conn).unwrap();
    for _ in 0..N / BATCH {
        let mut pipe = redis::pipe();
        for _ in 0..BATCH {
            pipe.cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(list_key)
                .arg(1)
                .arg(N as u64 * 2)
                .arg(3_600_000_000u64)
                .arg(0)
                .arg(1)
                .ignore();
        }
        let _: () = pipe.query(&mut conn).unwrap();
    }
    let len: usize = redis::cmd("LLEN").arg(list_key).query(&mut conn).unwrap();
    assert_eq!(len, N);
    let list_bytes = memory_usage(&mut conn, list_key);

    // The seeds' ZSET, filled by the seed script itself (member "<ms>-<seq>").
    let zset_key = "m:zset";
    let seed_sha = Script::new(SEED_ZSET_SCRIPT).load(&mut conn).unwrap();
    let start_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for b in 0..N / BATCH {
        let mut pipe = redis::pipe();
        for i in 0..BATCH {
            // ~10 requests per ms, as a busy client would produce.
            let now_ms = start_ms + ((b * BATCH + i) / 10) as u64;
            pipe.cmd("EVALSHA")
                .arg(&seed_sha)
                .arg(1)
                .arg(zset_key)
                .arg(now_ms)
                .arg(3_600_000u64)
                .arg(N as u64 * 2)
                .ignore();
        }
        let _: () = pipe.query(&mut conn).unwrap();
    }
    let card: usize = redis::cmd("ZCARD").arg(zset_key).query(&mut conn).unwrap();
    assert_eq!(card, N);
    let zset_bytes = memory_usage(&mut conn, zset_key);
    let seq_bytes = memory_usage(&mut conn, "m:zset:seq");

    let list_per = list_bytes as f64 / N as f64;
    let zset_per = zset_bytes as f64 / N as f64;
    println!(
        "memory at {N} entries in one key (MEMORY USAGE SAMPLES 0):\n  \
         LIST (this script): {list_bytes} B = {list_per:.2} B/entry\n  \
         ZSET (seed script): {zset_bytes} B = {zset_per:.2} B/entry \
         (+ {seq_bytes} B for its undeclared, never-expiring :seq key)\n  \
         ratio: {:.1}x",
        zset_per / list_per
    );
    assert!(
        list_per <= 16.0,
        "LIST uses {list_per:.2} B/entry, target <= 16"
    );
    assert!(zset_per > list_per);
}

/// `usec_per_call` of EVALSHA, and the calls of every command the script ran (all but
/// EVALSHA and CONFIG), from INFO commandstats.
fn evalsha_stats(conn: &mut Connection) -> (f64, u64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let field = |line: &str, name: &str| -> Option<String> {
        line.split([':', ','])
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_string)
    };
    let mut usec = None;
    let mut inner = 0;
    for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
        let name = &line["cmdstat_".len()..line.find(':').unwrap_or(line.len())];
        match name {
            "evalsha" => usec = field(line, "usec_per_call").map(|v| v.parse().unwrap()),
            "config" => {}
            _ => inner += field(line, "calls").map_or(0, |v| v.parse::<u64>().unwrap()),
        }
    }
    (usec.expect("evalsha stats"), inner)
}

/// (name, number of buckets, limits as (requests, window ms)).
type Scenario = (&'static str, usize, &'static [(u32, u64)]);

/// Measure EVALSHA `usec_per_call` (INFO commandstats) over 10k pipelined calls per scenario.
/// It is wall time inside Redis, so it inflates when the machine is busy: callers print it or
/// assert on it only when asked to.
fn measure_cpu_per_call() -> Vec<(&'static str, usize, f64, f64)> {
    const CALLS: usize = 10_000;
    let _alone = alone();
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let sha = Script::new(SCRIPT_SOURCE).load(&mut conn).unwrap();

    let scenarios: [Scenario; 5] = [
        ("1 limit, admitted", 100, &[(1000, 60_000)]),
        (
            "3 limits, admitted",
            100,
            &[(1000, 1_000), (5000, 60_000), (20_000, 3_600_000)],
        ),
        ("1 limit, denied (full)", 1, &[(10, 60_000)]),
        (
            "3 limits, denied (full)",
            1,
            &[(10, 1_000), (50, 60_000), (100, 3_600_000)],
        ),
        ("1 limit, sliding (evicts)", 1, &[(20, 2)]),
    ];
    let mut results = Vec::new();
    for (name, buckets, limits) in scenarios {
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
        // After FLUSHALL: RESETSTAT clears its count, so only the script's commands remain.
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut conn)
            .unwrap();
        for b in 0..CALLS / 500 {
            let mut pipe = redis::pipe();
            for i in 0..500 {
                let bucket = format!("route:client{}", (b * 500 + i) % buckets);
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&sha).arg(limits.len());
                for (_, w) in limits.iter() {
                    cmd.arg(format!("cpu:{{{bucket}}}:{w}"));
                }
                cmd.arg(limits.len());
                for (r, w) in limits.iter() {
                    cmd.arg(*r).arg(w * 1000).arg(0).arg(1);
                }
                pipe.add_command(cmd).ignore();
            }
            let _: () = pipe.query(&mut conn).unwrap();
        }
        let (usec, inner) = evalsha_stats(&mut conn);
        let commands = inner as f64 / CALLS as f64;
        println!("usec_per_call {name:>28}: {usec:.2}; commands per call {commands:.2}");
        results.push((name, limits.len(), usec, commands));
    }
    results
}

/// Redis work per decision, by path. The time (`usec_per_call`) is printed only: it is wall
/// time inside Redis and moves with the machine's load (speed is a benchmark's to judge:
/// `scripts/bench-script`). What fails here is the work, counted: the commands the script
/// runs per call, the same on any machine, so a regression to O(entries) work (an eviction
/// popping entry by entry, a read of a whole log) shows as a count over the bound.
#[test]
fn redis_work_per_call() {
    for (name, limits, usec, commands) in measure_cpu_per_call() {
        // TIME and a call's bookkeeping, then per limit at most a read, an eviction, a push,
        // a trim and a TTL (4.0 to 4.4 measured per limit on 2026-12-06).
        let bound = 2.0 + 5.0 * limits as f64;
        assert!(
            commands <= bound,
            "{name}: {commands:.2} commands per call ({usec:.2} µs), over {bound}"
        );
    }
}

/// One decision of a batch: its keys, and its limits as (requests, window ms).
type Decision<'a> = (&'a [&'a str], &'a [(u32, i64)]);

/// One call of several decisions.
fn eval_batch(conn: &mut Connection, decisions: &[Decision]) -> redis::Value {
    let logs: Vec<Vec<ScriptLimit>> = decisions
        .iter()
        .map(|(_, limits)| limits.iter().map(|&(r, w)| (r, w, 0)).collect())
        .collect();
    let calls: Vec<(&[&str], &[ScriptLimit])> = decisions
        .iter()
        .zip(&logs)
        .map(|((keys, _), limits)| (*keys, &limits[..]))
        .collect();
    eval_decisions(conn, &calls)
}

#[test]
fn a_batch_decides_in_order_what_single_calls_would() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let a: &[&str] = &["t:{a}:60000"];
    let b: &[&str] = &["t:{b}:1000", "t:{b}:60000"];
    let one = &[(2, 60_000)][..];
    let two = &[(5, 1_000), (1, 60_000)][..];
    // a, b, a, a, b: a admits twice then denies; b admits once (its 1/min limit) then denies.
    let reply = integers(eval_batch(
        &mut conn,
        &[(a, one), (b, two), (a, one), (a, one), (b, two)],
    ));
    let statuses: Vec<i64> = {
        let mut at = 0;
        [1, 2, 1, 1, 2]
            .iter()
            .map(|n| {
                let s = reply[at].signum();
                at += 1 + 2 * n;
                s
            })
            .collect()
    };
    assert_eq!(statuses, [1, 1, 1, 0, 0], "reply {reply:?}");
    assert_eq!(entries(&mut conn, a[0]).len(), 2);
    assert_eq!(entries(&mut conn, b[0]).len(), 1);
    assert_eq!(entries(&mut conn, b[1]).len(), 1);
    // The third decision (a, admitted, now full) and the fifth (b, its 1/min limit full).
    assert_eq!(
        reply[9], 0,
        "a is full after its second admission: {reply:?}"
    );
    assert_eq!((reply[14], reply[15], reply[17]), (0, 4, 0), "{reply:?}");
    assert!(reply[18] > 0 && reply[18] <= 60_000_000, "{reply:?}");
}

/// Calls the script with `keys` and `args`, which it must refuse: its error message, once
/// checked that nothing was decided (none of `keys` exists).
fn refused(conn: &mut Connection, keys: &[&str], args: &[&str]) -> String {
    let script = Script::new(SCRIPT_SOURCE);
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(*key);
    }
    for arg in args {
        call.arg(*arg);
    }
    let err = call.invoke::<redis::Value>(conn).unwrap_err().to_string();
    let exists: i64 = redis::cmd("EXISTS").arg(keys).query(conn).unwrap();
    assert_eq!(exists, 0, "{err}");
    err
}

#[test]
fn argv_that_does_not_match_keys_is_an_error_reply() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    // Two keys, but ARGV describes one decision of one limit.
    let keys = ["t:{a}:1000", "t:{b}:1000"];
    let err = refused(&mut conn, &keys, &["1", "5", "1000000", "0"]);
    assert!(err.contains("sliding_window"), "{err}");
}

/// `=` (the limits of the decision before) cannot open a call, and stands for the whole of a
/// decision's limits, not for some of them: either way, an error reply and nothing decided.
#[test]
fn an_equals_sign_with_no_decision_before_is_an_error_reply() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let keys = ["t:{a}:1000", "t:{b}:1000"];
    let first = refused(&mut conn, &keys, &["=", "1", "5", "1000000", "0", "1"]);
    assert!(first.contains("ARGV[1]"), "{first}");
    // One decision of one limit, then `=` followed by a limit's values it does not take.
    let trailing = refused(&mut conn, &keys, &["1", "5", "1000000", "0", "1", "=", "5"]);
    assert!(trailing.contains("sliding_window"), "{trailing}");
}
