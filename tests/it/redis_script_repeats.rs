//! A call that decides one bucket several times (a busy client, a `global` limit): the script
//! answers the later decisions from what it wrote itself (REPEATS in
//! `lua/sliding_window/skeleton.lua`), and must decide exactly what the same decisions would,
//! one call each, from every state a list can be in. Against a real `redis-server`.

use crate::common;

use common::redis::RedisServer;
use common::script::{
    calls_of, eval_decisions, eval_decisions_written, integers, redis_time, Argv, ScriptLimit,
};
use redis::Connection;

/// Every limit here is a log over ten seconds (or slots of one second over it). The ages below
/// are written for a 1 s window and scaled to this one: the one-by-one run follows the batch,
/// and on a loaded machine (a CI run: one took 400 ms between them) a 1 s window let an entry
/// slide out in between.
const WINDOW_MS: i64 = 10_000;

/// The lists, each with its entries (thousandths of the window before the seeding instant,
/// oldest first; negative: after it). Every entry is at least 100 of them (1 s) from its
/// window's edge at every `now` a decision of it sees, so the time between the batch and the
/// one-by-one run never moves one across it.
const LISTS: [(&str, &[i64]); 6] = [
    ("fresh", &[]),
    ("busy", &[600, 300]),
    // Three entries slid out, one left in the window.
    ("stale", &[2500, 2000, 1500, 700]),
    // Four in the window, for a limit of 2 (lowered by a reload): full until two leave.
    ("lowered", &[900, 800, 500, 400]),
    // Every entry slid out.
    ("gone", &[1500, 1200]),
    // Written by a Redis whose clock was 400 ahead (see CLOCK): it moves `now` of a
    // decision that counts in it 400 ahead, so a list's entries can slide out between
    // two decisions of one call.
    ("ahead", &[-400]),
];

/// The decisions, in order: each names the lists of its limits, each with its `requests`.
const DECISIONS: [&[(&str, u32)]; 22] = [
    &[("fresh", 3)],
    &[("fresh", 3)],
    &[("busy", 5)],
    &[("fresh", 3), ("busy", 5)],
    &[("fresh", 3)],
    &[("stale", 3)],
    &[("stale", 3)],
    // `now` 400 ahead: the entry 700 old slides out of "stale", whose entries admitted
    // in this call are still held back.
    &[("ahead", 5), ("stale", 3)],
    &[("stale", 3)],
    &[("lowered", 2)],
    &[("lowered", 2), ("fresh", 3)],
    &[("gone", 1)],
    &[("gone", 1)],
    &[("busy", 3), ("gone", 1)],
    &[("busy", 3)],
    // "busy" (4 in its window now) decided under a limit of 1 (a route lowered meanwhile):
    // its reset reads its newest entry, held back.
    &[("busy", 1)],
    &[("fresh", 5)],
    &[("fresh", 5)],
    &[("fresh", 2)],
    &[("ahead", 5)],
    &[("stale", 3), ("ahead", 5)],
    &[("fresh", 6)],
];

fn key(prefix: &str, list: &str) -> String {
    match resolution_ms(list) {
        0 => format!("{prefix}:{{{list}}}:{WINDOW_MS}"),
        res => format!("{prefix}:{{{list}}}:{WINDOW_MS}@{res}"),
    }
}

/// A list named `slots…` is a limit with slots of a tenth of the window; every other, a log.
fn resolution_ms(list: &str) -> i64 {
    if list.starts_with("slots") {
        WINDOW_MS / 10
    } else {
        0
    }
}

/// Every list of `lists` under `prefix`, with its entries (ages in thousandths of the window)
/// before `now_us`.
fn seed(conn: &mut Connection, prefix: &str, now_us: i64, lists: &[(&str, &[i64])]) {
    for &(name, ago) in lists {
        let values: Vec<i64> = ago.iter().map(|a| now_us - a * WINDOW_MS).collect();
        if !values.is_empty() {
            let _: () = redis::cmd("RPUSH")
                .arg(key(prefix, name))
                .arg(values)
                .query(conn)
                .unwrap();
        }
    }
}

/// What one decision answered: admitted, then (remaining, reset µs) per limit.
type Answer = (bool, Vec<(i64, i64)>);

/// `decisions` under `prefix`, all in one call with ARGV written as `batch` says, or one call
/// each (`None`).
fn decide(
    conn: &mut Connection,
    prefix: &str,
    decisions: &[&[(&str, u32)]],
    batch: Option<Argv>,
) -> Vec<Answer> {
    let keys: Vec<Vec<String>> = decisions
        .iter()
        .map(|lists| lists.iter().map(|(l, _)| key(prefix, l)).collect())
        .collect();
    let key_refs: Vec<Vec<&str>> = keys
        .iter()
        .map(|k| k.iter().map(String::as_str).collect())
        .collect();
    let limits: Vec<Vec<ScriptLimit>> = decisions
        .iter()
        .map(|lists| {
            let limit = |&(l, r): &(&str, u32)| (r, WINDOW_MS, resolution_ms(l));
            lists.iter().map(limit).collect()
        })
        .collect();
    let calls: Vec<(&[&str], &[ScriptLimit])> = key_refs
        .iter()
        .zip(&limits)
        .map(|(k, l)| (k.as_slice(), l.as_slice()))
        .collect();
    let raw: Vec<i64> = if let Some(argv) = batch {
        integers(eval_decisions_written(conn, &calls, argv))
    } else {
        calls
            .iter()
            .flat_map(|one| integers(eval_decisions(conn, std::slice::from_ref(one))))
            .collect()
    };
    common::script::answers_of(decisions.iter().map(|d| d.len()), &raw)
}

fn length(conn: &mut Connection, key: &str) -> i64 {
    redis::cmd("LLEN").arg(key).query(conn).unwrap()
}

#[test]
fn a_batch_with_repeated_buckets_decides_what_one_call_each_would() {
    let repeats = DECISIONS.windows(2).filter(|d| {
        let limits = |lists: &[(&str, u32)]| lists.iter().map(|l| l.1).collect::<Vec<_>>();
        limits(d[0]) == limits(d[1])
    });
    assert!(
        repeats.count() >= 4,
        "decisions whose limits repeat are written `=`"
    );
    batch_decides_what_one_call_each_would(Argv::AsTheStore);
}

/// The same batch with every decision's limits written in full: a decision written `=` (the
/// limits of the decision before) decides what it decides written out.
#[test]
fn a_batch_written_in_full_decides_the_same() {
    batch_decides_what_one_call_each_would(Argv::Full);
}

fn batch_decides_what_one_call_each_would(argv: Argv) {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let now = redis_time(&mut conn);
    seed(&mut conn, "batch", now, &LISTS);
    seed(&mut conn, "single", now, &LISTS);
    let started = std::time::Instant::now();
    let batched = decide(&mut conn, "batch", &DECISIONS, Some(argv));
    let single = decide(&mut conn, "single", &DECISIONS, None);
    assert_same_answers(&DECISIONS, &batched, &single, started.elapsed());
    let admitted = batched.iter().filter(|a| a.0).count();
    assert!(
        (4..DECISIONS.len()).contains(&admitted),
        "admissions and denials both: {admitted}"
    );
    for (name, _) in LISTS {
        let (b, s) = (key("batch", name), key("single", name));
        assert_eq!(length(&mut conn, &b), length(&mut conn, &s), "{name}");
        // A list admitted into has a TTL (the seeded ones had none).
        let ttl = |conn: &mut Connection, k: &str| -> i64 {
            redis::cmd("PTTL").arg(k).query(conn).unwrap()
        };
        let (tb, ts) = (ttl(&mut conn, &b), ttl(&mut conn, &s));
        assert_eq!(tb > 0, ts > 0, "{name}: PTTL {tb} vs {ts}");
    }
}

/// Each decision of `batched` answered as the same one of `single` did.
/// The one-by-one calls ran after the batch, each on its own TIME: a reset may differ by at
/// most `elapsed`, the time from the batch's start to the last single call's end (a few ms on
/// an idle machine; measured, so a busy one does not fail it and a wrong reset still does).
fn assert_same_answers(
    decisions: &[&[(&str, u32)]],
    batched: &[Answer],
    single: &[Answer],
    elapsed: std::time::Duration,
) {
    let tolerance = elapsed.as_micros() as i64 + 1_000;
    for (d, (b, s)) in batched.iter().zip(single).enumerate() {
        let lists = decisions[d];
        assert_eq!(
            b.0, s.0,
            "decision {d} {lists:?}: admitted, batch {b:?}, single {s:?}"
        );
        for (i, (bs, ss)) in b.1.iter().zip(&s.1).enumerate() {
            assert_eq!(bs.0, ss.0, "decision {d} {lists:?} limit {i}: remaining");
            // A slot boundary crossed between the two moves a slotted limit's reset by a slot.
            let slot = resolution_ms(lists[i].0) * 1000;
            assert!(
                (bs.1 - ss.1).abs() <= tolerance + slot,
                "decision {d} {lists:?} limit {i}: reset {} vs {} (calls {elapsed:?} apart)",
                bs.1,
                ss.1
            );
        }
    }
}

#[test]
fn a_hot_bucket_admits_exactly_its_limit_in_one_call_and_reads_it_once() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .unwrap();
    let hot = key("hot", "client");
    let one: &[&str] = &[hot.as_str()];
    let limit: &[ScriptLimit] = &[(100, WINDOW_MS, 0)];
    let calls = vec![(one, limit); 400];
    let raw = integers(eval_decisions(&mut conn, &calls));
    let admitted = raw.chunks(3).filter(|d| d[0] > 0).count();
    assert_eq!(admitted, 100);
    // Read once, by the first decision; every later one is answered from what it wrote, and
    // every entry of the call, the first's included, goes in with one RPUSH at its end.
    assert_eq!(calls_of(&mut conn, "llen"), 1);
    assert_eq!(calls_of(&mut conn, "rpush"), 1);
    assert_eq!(length(&mut conn, &hot), 100);
    // The list did not exist: its TTL, held back too, was set after the RPUSH created it.
    let ttl: i64 = redis::cmd("PTTL").arg(&hot).query(&mut conn).unwrap();
    assert!(ttl > 0, "PTTL {ttl}");
    let remaining: Vec<i64> = raw.chunks(3).take(101).map(|d| d[1]).collect();
    let counted_down: Vec<i64> = (0..100).rev().chain([0]).collect();
    assert_eq!(remaining, counted_down);
}

/// The lists of the random batches: seeded like [`LISTS`] (ages in thousandths of the window),
/// each entry at least 150 of them (1.5 s) from its window's edge at every `now` a decision
/// sees, "ahead" included.
const RANDOM_LISTS: [(&str, &[i64]); 5] = [
    ("a", &[]),
    ("b", &[750, 450, 100]),
    ("c", &[2000, 1300, 250]),
    ("ahead", &[-400]),
    ("slots", &[]),
];

/// Random batches, most of their decisions repeating the one before (a hot bucket, RUNS in
/// the skeleton), over one to three limits of low `requests`, so runs fill limits and go on
/// denied: each decides what its decisions decide one call each.
#[test]
fn random_batches_of_repeats_decide_what_one_call_each_would() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };
    let (mut runs, mut filled) = (0, 0);
    for round in 0..40 {
        let mut decisions: Vec<Vec<(&str, u32)>> = Vec::new();
        for _ in 0..2 + next(30) {
            if !decisions.is_empty() && next(10) < 7 {
                decisions.push(decisions.last().unwrap().clone());
                runs += 1;
                continue;
            }
            let mut lists: Vec<(&str, u32)> = Vec::new();
            for _ in 0..1 + next(3) {
                let list = RANDOM_LISTS[next(RANDOM_LISTS.len() as u64) as usize].0;
                if !lists.iter().any(|l| l.0 == list) {
                    lists.push((list, 1 + next(6) as u32));
                }
            }
            decisions.push(lists);
        }
        let decisions: Vec<&[(&str, u32)]> = decisions.iter().map(Vec::as_slice).collect();
        let (b, s) = (format!("rb{round}"), format!("rs{round}"));
        let now = redis_time(&mut conn);
        for prefix in [&b, &s] {
            seed(&mut conn, prefix, now, &RANDOM_LISTS);
        }
        let started = std::time::Instant::now();
        let batched = decide(&mut conn, &b, &decisions, Some(Argv::AsTheStore));
        let single = decide(&mut conn, &s, &decisions, None);
        assert_same_answers(&decisions, &batched, &single, started.elapsed());
        filled += batched.windows(2).filter(|w| w[0].0 && !w[1].0).count();
        for (name, _) in RANDOM_LISTS.iter().filter(|l| resolution_ms(l.0) == 0) {
            let (kb, ks) = (key(&b, name), key(&s, name));
            assert_eq!(
                length(&mut conn, &kb),
                length(&mut conn, &ks),
                "round {round}: {name}"
            );
        }
    }
    assert!(
        runs > 200 && filled > 20,
        "repeats {runs}, admissions followed by a denial {filled}"
    );
}
