//! Calling the sliding-window script ([`SCRIPT_SOURCE`], assembled from
//! `lua/sliding_window/skeleton.lua` and `lua/kinds/*.lua`) directly, as the store does, and
//! decoding its reply.

use redis::{Connection, Script};
use slidegate::limiter::redis::SCRIPT_SOURCE;

/// One limit of a direct script call: requests, window in ms, resolution in ms (0: a log).
pub type ScriptLimit = (u32, i64, i64);

/// How a direct call writes ARGV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argv {
    /// As the store does: a decision with the limits of the decision before is `=`.
    AsTheStore,
    /// Every decision's limits in full.
    Full,
}

/// One `EVALSHA` of some decisions, each `(its keys, its limits)`, one limit per key, with
/// ARGV written as the store writes it.
pub fn eval_decisions(
    conn: &mut Connection,
    decisions: &[(&[&str], &[ScriptLimit])],
) -> redis::Value {
    eval_decisions_written(conn, decisions, Argv::AsTheStore)
}

/// [`eval_decisions`], with ARGV written as `argv` says.
pub fn eval_decisions_written(
    conn: &mut Connection,
    decisions: &[(&[&str], &[ScriptLimit])],
    argv: Argv,
) -> redis::Value {
    let weighted: Vec<Vec<WeightedLimit>> = decisions
        .iter()
        .map(|(_, limits)| limits.iter().map(|&(r, w, res)| (r, w, res, 1)).collect())
        .collect();
    let calls: Vec<(&[&str], &[WeightedLimit])> = decisions
        .iter()
        .zip(&weighted)
        .map(|((keys, _), limits)| (*keys, limits.as_slice()))
        .collect();
    eval_weighted(conn, &calls, argv)
}

/// One limit of a direct script call with the weight an admission counts in it (a cost
/// limit's cost; 0 admits without counting): requests, window in ms, resolution in ms, weight.
pub type WeightedLimit = (u32, i64, i64, u32);

/// One `EVALSHA` of some decisions with weights, ARGV written as `argv` says.
pub fn eval_weighted(
    conn: &mut Connection,
    decisions: &[(&[&str], &[WeightedLimit])],
    argv: Argv,
) -> redis::Value {
    let script = Script::new(SCRIPT_SOURCE);
    let mut call = script.prepare_invoke();
    for (keys, limits) in decisions {
        assert_eq!(keys.len(), limits.len());
        for key in keys.iter() {
            call.key(*key);
        }
    }
    let mut before: Option<&[WeightedLimit]> = None;
    for (_, limits) in decisions {
        if argv == Argv::AsTheStore && before == Some(*limits) {
            call.arg("=");
            continue;
        }
        call.arg(limits.len());
        for (requests, window_ms, resolution_ms, weight) in limits.iter() {
            call.arg(*requests)
                .arg(window_ms * 1000)
                .arg(resolution_ms * 1000)
                .arg(*weight);
        }
        before = Some(*limits);
    }
    call.invoke(conn).expect("script call")
}

/// The integers of a script reply (big-endian doubles, 8 bytes each), which must be a bare
/// string: an array would carry the messages of failed decisions.
pub fn integers(reply: redis::Value) -> Vec<i64> {
    let redis::Value::BulkString(packed) = reply else {
        panic!("reply shape (failed decisions?): {reply:?}");
    };
    packed_integers(&packed)
}

/// The integers of the script's packed reply string.
pub fn packed_integers(packed: &[u8]) -> Vec<i64> {
    assert_eq!(packed.len() % 8, 0, "packed length {}", packed.len());
    packed
        .chunks_exact(8)
        .map(|b| {
            let v = f64::from_be_bytes(b.try_into().unwrap());
            assert_eq!(v.fract(), 0.0, "not an integer: {v}");
            v as i64
        })
        .collect()
}

/// Redis's clock, in µs.
pub fn redis_time(conn: &mut Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    s * 1_000_000 + us
}

/// A slotted limit's stored value (see SLOTS in `lua/kinds/slots/`): its non-empty slots,
/// (slot index, counter) oldest first; `None` when the key does not exist.
pub fn slot_counters(conn: &mut Connection, key: &str) -> Option<Vec<(i64, u32)>> {
    let raw: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(conn).unwrap();
    let raw = raw?;
    assert!(
        raw.len() >= 14 && (raw.len() - 8) % 6 == 0,
        "slot string of {} bytes",
        raw.len()
    );
    let first = f64::from_be_bytes(raw[..8].try_into().unwrap()) as i64;
    let pairs = raw[8..]
        .chunks_exact(6)
        .map(|b| {
            let offset = u16::from_be_bytes([b[0], b[1]]);
            (
                first + i64::from(offset),
                u32::from_be_bytes(b[2..].try_into().unwrap()),
            )
        })
        .collect();
    Some(pairs)
}

/// The packed value of non-empty slots, (slot index, counter) oldest first.
pub fn pack_slots(slots: &[(i64, u32)]) -> Vec<u8> {
    let first = slots[0].0;
    let mut out = (first as f64).to_be_bytes().to_vec();
    for &(slot, count) in slots {
        out.extend_from_slice(&u16::try_from(slot - first).unwrap().to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
    }
    out
}

/// `calls` of `command` in INFO commandstats (0 when it never ran).
pub fn calls_of(conn: &mut Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let head = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.strip_prefix(head.as_str()))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("calls=")))
        .map_or(0, |v| v.parse().unwrap())
}

/// A reply of decisions split per decision (`lens[i]`: decision `i`'s limits): whether it was
/// admitted, and each limit's `(remaining, reset)`; panics unless the reply has that shape.
pub fn answers_of(
    lens: impl IntoIterator<Item = usize>,
    raw: &[i64],
) -> Vec<(bool, Vec<(i64, i64)>)> {
    let mut answers = Vec::new();
    let mut at = 0;
    for n in lens {
        let states = raw[at + 1..at + 1 + 2 * n]
            .chunks(2)
            .map(|c| (c[0], c[1]))
            .collect();
        answers.push((raw[at] > 0, states));
        at += 1 + 2 * n;
    }
    assert_eq!(at, raw.len(), "reply shape: {raw:?}");
    answers
}
