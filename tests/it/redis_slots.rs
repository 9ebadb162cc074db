//! Script-level tests of slotted limits (SLOTS in `lua/kinds/slots/`) against a real
//! `redis-server`: the packed counters, their bound at full rate, TTLs, denials that write
//! nothing, the clock guard, keys of another type, and the bytes a client costs.

use crate::common;

use std::time::{Duration, Instant};

use common::redis::RedisServer;
use common::script::{
    eval_decisions, integers, pack_slots, packed_integers, redis_time, slot_counters, ScriptLimit,
};
use redis::Connection;

const MARGIN_MS: i64 = 1000;

/// One decision of one slotted limit: (status, remaining, reset µs).
fn decide(conn: &mut Connection, key: &str, limit: ScriptLimit) -> (i64, i64, i64) {
    let r = integers(eval_decisions(conn, &[(&[key], &[limit])]));
    assert_eq!(r.len(), 3, "{r:?}");
    // An admission's status is the decision's clock (µs): 1 here for admitted.
    (r[0].signum(), r[1], r[2])
}

fn pttl(conn: &mut Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).unwrap()
}

fn raw(conn: &mut Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

#[test]
fn slots_admit_exactly_and_a_denial_writes_nothing() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "s:{r:c}:60000@1000";
    let limit = (5, 60_000, 1_000);
    for left in (0..5).rev() {
        let (status, remaining, reset) = decide(&mut conn, key, limit);
        assert_eq!((status, remaining), (1, left));
        // Not full: when the oldest slot leaves, at most window + resolution away.
        assert!(reset > 59_000_000 && reset <= 61_000_000, "reset {reset}");
    }
    let slots = slot_counters(&mut conn, key).expect("written");
    assert_eq!(slots.iter().map(|s| s.1).sum::<u32>(), 5, "{slots:?}");
    assert!(slots.len() <= 2, "{slots:?}");
    let first = slots[0].0;
    let slot_now = redis_time(&mut conn) / 1_000_000;
    assert!(
        (first - slot_now).abs() <= 1,
        "first slot {first}, now {slot_now}"
    );
    let ttl = pttl(&mut conn, key);
    assert!(ttl > 61_000 && ttl <= 61_000 + MARGIN_MS, "PTTL {ttl}");

    let before = (raw(&mut conn, key), pttl(&mut conn, key));
    let (status, remaining, reset) = decide(&mut conn, key, limit);
    assert_eq!((status, remaining), (0, 0));
    // Full: admits again when the oldest slot leaves, (first + 1) s + 60 s on Redis's clock.
    let leaves = (first + 1) * 1_000_000 + 60_000_000;
    let now = redis_time(&mut conn);
    assert!(
        (leaves - now - reset).abs() < 50_000,
        "reset {reset}, leaves in {}",
        leaves - now
    );
    let after = (raw(&mut conn, key), pttl(&mut conn, key));
    assert_eq!(before.0, after.0, "a denial rewrote the counters");
    assert!(after.1 <= before.1, "a denial refreshed the TTL");
}

#[test]
fn a_client_at_full_rate_keeps_at_most_n_plus_one_counters() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "s:{r:fast}:200@20";
    // 200 per 200 ms in slots of 20 ms: 11 pairs at most, however many decisions run.
    let limit = (200, 200, 20);
    let sha = redis::Script::new(slidegate::limiter::redis::SCRIPT_SOURCE)
        .load(&mut conn)
        .unwrap();
    let (mut admitted, mut calls, mut longest) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_millis(700);
    while Instant::now() < deadline {
        let mut pipe = redis::pipe();
        for _ in 0..50 {
            pipe.cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(key)
                .arg(1)
                .arg(limit.0)
                .arg(limit.1 * 1000)
                .arg(limit.2 * 1000)
                .arg(1);
        }
        let replies: Vec<Vec<u8>> = pipe.query(&mut conn).unwrap();
        for r in replies {
            admitted += packed_integers(&r)[0].signum();
            calls += 1;
        }
        let len = raw(&mut conn, key).map_or(0, |v| v.len());
        longest = longest.max(len);
    }
    assert!(calls > 1000, "only {calls} decisions");
    assert!(admitted > 0 && admitted < calls, "{admitted} of {calls}");
    assert!(longest <= 8 + 6 * 11, "value of {longest} bytes");
    let bytes: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .query(&mut conn)
        .unwrap();
    println!(
        "{calls} decisions, {admitted} admitted, value <= {longest} B, MEMORY USAGE {bytes} B"
    );
    assert!(bytes <= 1024, "{bytes} B for one client");
}

#[test]
fn the_clock_guard_records_into_a_slot_ahead_of_time() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let (slots, log) = ("s:{r:c}:10000@100", "s:{r:c}:10000");
    // A slot 5 s ahead of Redis's clock (another proxy's clock stepped back, say).
    let ahead = redis_time(&mut conn) / 100_000 + 50;
    let _: () = redis::cmd("SET")
        .arg(slots)
        .arg(pack_slots(&[(ahead, 1)]))
        .query(&mut conn)
        .unwrap();
    let limits: [ScriptLimit; 2] = [(3, 10_000, 100), (10, 10_000, 0)];
    let r = integers(eval_decisions(&mut conn, &[(&[slots, log], &limits)]));
    // Admitted at the frozen clock: the status is that slot's start.
    assert_eq!(r[0], ahead * 100_000, "{r:?}");
    // The decision's clock is the slot's start: recorded in that slot, not in an older one.
    assert_eq!(slot_counters(&mut conn, slots), Some(vec![(ahead, 2)]));
    let entries: Vec<i64> = redis::cmd("LRANGE")
        .arg(log)
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        entries,
        [ahead * 100_000],
        "the log entry is at the frozen clock"
    );
    // Remaining 3 - 2; reset: the slot leaves at (ahead + 1) × 100 ms + 10 s from its start.
    assert_eq!((r[1], r[2]), (1, 10_100_000));
}

#[test]
fn a_key_of_another_shape_fails_only_its_decision() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let _: () = redis::cmd("RPUSH")
        .arg("s:{a}:1000@100")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("s:{b}:1000@100")
        .arg("abc")
        .query(&mut conn)
        .unwrap();
    let limit: &[ScriptLimit] = &[(5, 1_000, 100)];
    let reply = eval_decisions(
        &mut conn,
        &[
            (&["s:{a}:1000@100"], limit),
            (&["s:{b}:1000@100"], limit),
            (&["s:{c}:1000@100"], limit),
        ],
    );
    let redis::Value::Array(parts) = reply else {
        panic!("failed decisions come as an array: {reply:?}");
    };
    let redis::Value::BulkString(packed) = &parts[0] else {
        panic!("{parts:?}");
    };
    let numbers = packed_integers(packed);
    assert_eq!(
        (numbers[0], numbers[3], numbers[6].signum()),
        (-1, -1, 1),
        "{numbers:?}"
    );
    let messages = format!("{:?}", &parts[1..]);
    assert!(
        messages.contains("WRONGTYPE") && messages.contains("no slot counters"),
        "{messages}"
    );
    assert_eq!(slot_counters(&mut conn, "s:{c}:1000@100").unwrap().len(), 1);
}

#[test]
fn a_slot_client_costs_a_hundredth_of_the_log_at_the_same_rate() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    // 10,000 admissions in one 1 s window (a pipeline: Redis runs them in well under 1 s): the
    // log keeps 10,000 entries, slots of 100 ms 11 counters at most.
    let sha = redis::Script::new(slidegate::limiter::redis::SCRIPT_SOURCE)
        .load(&mut conn)
        .unwrap();
    let mut usage = Vec::new();
    for (key, resolution_us) in [("m:{c}:1000@100", 100_000), ("m:{c}:1000", 0)] {
        let mut pipe = redis::pipe();
        for _ in 0..10_000 {
            pipe.cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(key)
                .arg(1)
                .arg(20_000)
                .arg(1_000_000)
                .arg(resolution_us)
                .arg(1)
                .ignore();
        }
        let _: () = pipe.query(&mut conn).unwrap();
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query(&mut conn)
            .unwrap();
        usage.push(bytes);
    }
    println!(
        "10,000 admissions: slots {} B, log {} B",
        usage[0], usage[1]
    );
    assert!(
        usage[0] * 100 <= usage[1],
        "slots {} B vs log {} B",
        usage[0],
        usage[1]
    );
}

#[test]
fn only_non_empty_slots_in_the_window_are_kept() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let key = "s:{r:slow}:1000@100";
    let cur = redis_time(&mut conn) / 100_000;
    // A slow client: one request 1.5 s ago (left the window), one 0.8 s and one 0.4 s ago.
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(pack_slots(&[(cur - 15, 1), (cur - 8, 1), (cur - 4, 2)]))
        .query(&mut conn)
        .unwrap();
    let (status, remaining, reset) = decide(&mut conn, key, (10, 1_000, 100));
    assert_eq!((status, remaining), (1, 10 - 4));
    let kept = slot_counters(&mut conn, key).unwrap();
    assert_eq!(kept.len(), 3, "{kept:?}");
    assert_eq!((kept[0], kept[1]), ((cur - 8, 1), (cur - 4, 2)), "{kept:?}");
    assert!(kept[2].0 >= cur && kept[2].1 == 1, "{kept:?}");
    // 8 + 6 bytes per non-empty slot: the value does not grow with the slots between them.
    assert_eq!(raw(&mut conn, key).unwrap().len(), 8 + 6 * 3);
    // Not full: the oldest kept slot leaves at (cur - 8 + 1) × 100 ms + 1 s.
    assert!(reset > 0 && reset <= 300_000, "reset {reset}");
}
