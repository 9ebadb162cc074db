//! Slotted limits decided several times in one call (REPEATS and RUNS in `lua/kinds/slots/`):
//! a batch, with weights, answers what one call per decision answers and leaves the same
//! counters, with one GET and one write per key and call; a write into the newest slot alone
//! (SETRANGE) leaves a TTL that outlives that slot. Against a real `redis-server`.

use crate::common;

use common::redis::RedisServer;
use common::script::{
    calls_of, eval_weighted, integers, pack_slots, redis_time, slot_counters, Argv, WeightedLimit,
};
use redis::Connection;

const WINDOW_MS: i64 = 10_000;
const RES_MS: i64 = 1_000;

/// The keys, each seeded with (slot offset from the current slot, counter) pairs.
const SEEDS: [(&str, &[(i64, u32)]); 6] = [
    ("fresh", &[]),
    // Its newest slot is the current one: admissions change its last counter alone.
    ("tail", &[(-2, 1), (0, 2)]),
    // The first admission appends the current slot.
    ("busy", &[(-5, 2), (-1, 1)]),
    // The oldest pair left the window (n = 10 slots back is the oldest counted).
    ("stale", &[(-12, 3), (-4, 1)]),
    // The oldest counted slot, for limits of up to 8 requests (full).
    ("full", &[(-10, 4), (-3, 4)]),
    // Written by a Redis whose clock was ahead (see CLOCK): `now` is that slot's start.
    ("ahead", &[(-1, 1), (3, 2)]),
];

fn key(prefix: &str, name: &str) -> String {
    format!("{prefix}:{{{name}}}:{WINDOW_MS}@{RES_MS}")
}

fn seed(conn: &mut Connection, prefix: &str, cur: i64) {
    for (name, pairs) in SEEDS {
        if pairs.is_empty() {
            continue;
        }
        let slots: Vec<(i64, u32)> = pairs.iter().map(|&(o, c)| (cur + o, c)).collect();
        let _: () = redis::cmd("SET")
            .arg(key(prefix, name))
            .arg(pack_slots(&slots))
            .query(conn)
            .unwrap();
    }
}

/// One decision: its keys' names, each with (requests, weight).
type Decision = Vec<(&'static str, u32, u32)>;

/// What one decision answered: admitted, then (remaining, reset µs) per limit.
type Answer = (bool, Vec<(i64, i64)>);

/// `decisions` under `prefix`: all in one call as the store writes them, or one call each.
fn decide(conn: &mut Connection, prefix: &str, decisions: &[Decision], batch: bool) -> Vec<Answer> {
    let keys: Vec<Vec<String>> = decisions
        .iter()
        .map(|d| d.iter().map(|l| key(prefix, l.0)).collect())
        .collect();
    let key_refs: Vec<Vec<&str>> = keys
        .iter()
        .map(|k| k.iter().map(String::as_str).collect())
        .collect();
    let limits: Vec<Vec<WeightedLimit>> = decisions
        .iter()
        .map(|d| {
            d.iter()
                .map(|&(_, r, w)| (r, WINDOW_MS, RES_MS, w))
                .collect()
        })
        .collect();
    let calls: Vec<(&[&str], &[WeightedLimit])> = key_refs
        .iter()
        .zip(&limits)
        .map(|(k, l)| (k.as_slice(), l.as_slice()))
        .collect();
    let raw: Vec<i64> = if batch {
        integers(eval_weighted(conn, &calls, Argv::AsTheStore))
    } else {
        calls
            .iter()
            .flat_map(|one| integers(eval_weighted(conn, std::slice::from_ref(one), Argv::Full)))
            .collect()
    };
    common::script::answers_of(decisions.iter().map(|d| d.len()), &raw)
}

/// Random batches, most decisions repeating the one before (RUNS), over one to three slotted
/// limits with low `requests` and weights 0 to 3, from every seeded state: the batch answers
/// exactly what one call per decision answers, and the counters end equal. A round whose two
/// runs straddle a slot boundary (their decisions then count in different slots) is run again.
#[test]
fn random_weighted_batches_decide_and_count_what_one_call_each_would() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };
    let (mut rounds, mut straddled, mut runs, mut filled, mut weighted) = (0, 0, 0, 0, 0);
    while rounds < 40 {
        assert!(
            straddled < 20,
            "{straddled} rounds straddled a slot boundary"
        );
        let mut decisions: Vec<Decision> = Vec::new();
        for _ in 0..2 + next(30) {
            if !decisions.is_empty() && next(10) < 7 {
                decisions.push(decisions.last().unwrap().clone());
                runs += 1;
                continue;
            }
            let mut limits: Decision = Vec::new();
            for _ in 0..1 + next(3) {
                let name = SEEDS[next(SEEDS.len() as u64) as usize].0;
                if !limits.iter().any(|l| l.0 == name) {
                    limits.push((name, 1 + next(12) as u32, next(4) as u32));
                }
            }
            decisions.push(limits);
        }
        let (b, s) = (
            format!("b{rounds}.{straddled}"),
            format!("s{rounds}.{straddled}"),
        );
        let started = redis_time(&mut conn);
        let cur = started / (RES_MS * 1000);
        seed(&mut conn, &b, cur);
        seed(&mut conn, &s, cur);
        let batched = decide(&mut conn, &b, &decisions, true);
        let single = decide(&mut conn, &s, &decisions, false);
        let ended = redis_time(&mut conn);
        if ended / (RES_MS * 1000) != cur {
            straddled += 1;
            continue;
        }
        let tolerance = ended - started;
        for (d, (ba, sa)) in batched.iter().zip(&single).enumerate() {
            let what = format!("round {rounds} decision {d} {:?}", decisions[d]);
            assert_eq!(ba.0, sa.0, "{what}: admitted, batch {ba:?}, single {sa:?}");
            for (i, (bl, sl)) in ba.1.iter().zip(&sa.1).enumerate() {
                assert_eq!(bl.0, sl.0, "{what} limit {i}: remaining");
                assert!(
                    (bl.1 - sl.1).abs() <= tolerance,
                    "{what} limit {i}: reset {} vs {}",
                    bl.1,
                    sl.1
                );
            }
        }
        for (name, _) in SEEDS {
            let (kb, ks) = (key(&b, name), key(&s, name));
            let counters = slot_counters(&mut conn, &kb);
            assert_eq!(
                counters,
                slot_counters(&mut conn, &ks),
                "round {rounds}: {name}"
            );
            // A key written by an admission outlives its newest slot by the margin (a seeded
            // one written by nothing has no TTL).
            let ttl: i64 = redis::cmd("PTTL").arg(&kb).query(&mut conn).unwrap();
            if ttl > 0 {
                let newest = counters.unwrap().last().unwrap().0;
                let leaves = (newest + 1) * RES_MS * 1000 + WINDOW_MS * 1000;
                assert!(
                    ended + ttl * 1000 >= leaves,
                    "round {rounds}: {name} expires in {ttl} ms, its newest slot leaves in {} µs",
                    leaves - ended
                );
            }
        }
        filled += batched.windows(2).filter(|w| w[0].0 && !w[1].0).count();
        weighted += decisions
            .iter()
            .filter(|d| d.iter().any(|l| l.2 > 1))
            .count();
        rounds += 1;
    }
    assert!(
        runs > 200 && filled > 20 && weighted > 100,
        "repeats {runs}, admissions followed by a denial {filled}, weighted decisions {weighted}"
    );
}

/// A hot client decided 400 times in one call on 100 per window, weight 3: 33 admitted, the
/// rest denied, with one GET and one write for all of them, and the counters hold 99.
#[test]
fn a_hot_slotted_bucket_is_read_and_written_once_per_call() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .unwrap();
    let hot = key("hot", "client");
    let one: &[&str] = &[hot.as_str()];
    let limit: &[WeightedLimit] = &[(100, WINDOW_MS, RES_MS, 3)];
    let raw = integers(eval_weighted(
        &mut conn,
        &vec![(one, limit); 400],
        Argv::AsTheStore,
    ));
    let admitted = raw.chunks(3).filter(|d| d[0] > 0).count();
    assert_eq!(admitted, 33);
    assert_eq!(calls_of(&mut conn, "get"), 1);
    assert_eq!(
        calls_of(&mut conn, "set") + calls_of(&mut conn, "setrange"),
        1
    );
    let counted: u32 = slot_counters(&mut conn, &hot)
        .unwrap()
        .iter()
        .map(|s| s.1)
        .sum();
    assert_eq!(counted, 99);
    let remaining: Vec<i64> = raw.chunks(3).take(34).map(|d| d[1]).collect();
    // Then denied: 1 left, but a weight of 3 does not fit, so `remaining` says 0.
    let counted_down: Vec<i64> = (0..33).rev().map(|k| 1 + 3 * k).chain([0]).collect();
    assert_eq!(remaining, counted_down);
    // The next call adds into the same slot: only the newest counter is written (SETRANGE),
    // unless a slot boundary passed meanwhile (then the whole string, SET).
    let before = calls_of(&mut conn, "setrange");
    let newest = |conn: &mut Connection| slot_counters(conn, &hot).unwrap().last().unwrap().0;
    let slot = newest(&mut conn);
    let one_more: &[WeightedLimit] = &[(100, WINDOW_MS, RES_MS, 1)];
    let raw = integers(eval_weighted(&mut conn, &[(one, one_more)], Argv::Full));
    assert!(raw[0] > 0, "{raw:?}");
    let written = calls_of(&mut conn, "setrange") - before;
    assert_eq!(
        written,
        u64::from(newest(&mut conn) == slot),
        "SETRANGE calls"
    );
}
