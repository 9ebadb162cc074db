//! The sliding-window script's reply (see REPLY in `lua/sliding_window/skeleton.lua`): one binary
//! string of integers packed as big-endian doubles, 1 + 2n per decision; when a decision
//! failed, an array of that string and one message per failed decision. This module reads the
//! envelope (the status of each decision, the errors); each limit's integers are decoded by its
//! kind ([`Limit::state_from_reply`]).
//!
//! One string, not an array of integers: redis-rs parses every RESP value through a general
//! parser at about 1.5k instructions each, so a reply of 3 integers per decision cost more
//! than the rest of the decision's client side. Doubles, not decimal text: Lua formats a number
//! as text with `sprintf`, about 1 µs of Redis CPU per call; packing it is a copy.

use crate::limiter::algo::REPLY_LEN;
use crate::limiter::{Limit, StoreError, Verdict};

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
mod tests {
    use std::time::Duration;

    use super::*;

    /// A reply as the script packs it.
    fn reply(numbers: &[i64], errors: &[&str]) -> redis::Value {
        let packed = numbers
            .iter()
            .flat_map(|&v| (v as f64).to_be_bytes())
            .collect();
        if errors.is_empty() {
            return redis::Value::BulkString(packed);
        }
        let mut items = vec![redis::Value::BulkString(packed)];
        items.extend(
            errors
                .iter()
                .map(|e| redis::Value::BulkString(e.as_bytes().to_vec())),
        );
        redis::Value::Array(items)
    }

    fn limit() -> Limit {
        Limit::log(5, Duration::from_secs(1))
    }

    #[test]
    fn integers_parse_exactly_or_not_at_all() {
        let pack = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_be_bytes()).collect() };
        assert_eq!(
            parse_integers(&pack(&[1.0, 4.0, 993518.0, -1.0, 0.0])),
            Some(vec![1, 4, 993518, -1, 0])
        );
        assert_eq!(
            parse_integers(&pack(&[2_592_000_000_000.0])),
            Some(vec![2_592_000_000_000])
        );
        for bad in [
            vec![],
            vec![0; 7],
            pack(&[1.5]),
            pack(&[f64::NAN]),
            pack(&[f64::INFINITY]),
            pack(&[9.1e15]),
        ] {
            assert_eq!(parse_integers(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn decisions_read_in_order_with_their_errors() {
        let two = [limit(), limit()];
        let mut r = ScriptReply::parse(reply(
            &[1, 4, 900000, -1, 0, 0, 0, 0, 0, 0, 1000000],
            &["WRONGTYPE Operation against a key"],
        ))
        .unwrap();
        assert_eq!(r.len(), 11);
        let v = r.next_verdict(&[limit()]).unwrap();
        assert!(v.admitted);
        assert_eq!(v.states[0].remaining, 4);
        assert_eq!(v.states[0].reset, Duration::from_micros(900_000));
        match r.next_verdict(&two) {
            Err(StoreError::Backend(msg)) => assert!(msg.starts_with("WRONGTYPE"), "{msg}"),
            other => panic!("{other:?}"),
        }
        let v = r.next_verdict(&[limit()]).unwrap();
        assert!(!v.admitted);
        assert_eq!(v.retry_after(), Some(Duration::from_secs(1)));
        assert!(r.next_verdict(&[limit()]).is_err(), "past the end");
    }

    #[test]
    fn a_reply_of_another_shape_is_a_backend_error() {
        for bad in [
            redis::Value::Int(1),
            redis::Value::Array(vec![]),
            redis::Value::Array(vec![redis::Value::Int(1)]),
            redis::Value::Array(vec![redis::Value::BulkString(b"1 4".to_vec())]),
        ] {
            assert!(matches!(
                ScriptReply::parse(bad),
                Err(StoreError::Backend(_))
            ));
        }
    }
}
