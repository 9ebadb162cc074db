//! The sliding-window script's reply (see REPLY in `lua/sliding_window.lua`): one string of
//! space-separated integers, 1 + 2n per decision, then one message per failed decision.
//!
//! One string, not an array of integers: redis-rs parses every RESP value through a general
//! parser at about 1.5k instructions each, so a reply of 3 integers per decision cost more
//! than the rest of the decision's client side; splitting one string costs a few per digit.

use std::time::Duration;

use crate::limiter::{Limit, LimitState, StoreError, Verdict};

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
        let redis::Value::Array(items) = reply else {
            return Err(bad(&reply));
        };
        let mut items = items.into_iter();
        let numbers = match items.next() {
            Some(redis::Value::BulkString(text)) => parse_integers(&text),
            _ => None,
        };
        match numbers {
            Some(numbers) => Ok(ScriptReply {
                numbers,
                at: 0,
                errors: items,
            }),
            None => Err(bad(&redis::Value::Array(items.collect()))),
        }
    }

    /// How many integers the reply carries (1 + 2n per decision).
    pub(super) fn len(&self) -> usize {
        self.numbers.len()
    }

    /// The verdict of the next decision, which has `limits`.
    pub(super) fn next_verdict(&mut self, limits: &[Limit]) -> Result<Verdict, StoreError> {
        let len = 1 + 2 * limits.len();
        let Some(slot) = self.numbers.get(self.at..self.at + len) else {
            return Err(StoreError::Backend(format!(
                "script reply too short: {} integers, decision at {} needs {len}",
                self.numbers.len(),
                self.at
            )));
        };
        self.at += len;
        let admitted = match slot[0] {
            1 => true,
            0 => false,
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
        let states = slot[1..]
            .chunks_exact(2)
            .map(|pair| LimitState {
                remaining: pair[0].clamp(0, i64::from(u32::MAX)) as u32,
                reset: Duration::from_micros(pair[1].max(0) as u64),
            })
            .collect();
        Ok(Verdict { admitted, states })
    }
}

/// `b"1 4 993518"` → `[1, 4, 993518]`; `None` unless every field is a decimal integer.
fn parse_integers(text: &[u8]) -> Option<Vec<i64>> {
    let mut out = Vec::with_capacity(text.len() / 4 + 1);
    for field in text.split(|&b| b == b' ') {
        let (negative, digits) = match field.split_first()? {
            (b'-', rest) => (true, rest),
            _ => (false, field),
        };
        if digits.is_empty() || digits.len() > 18 {
            return None;
        }
        let mut v: i64 = 0;
        for &d in digits {
            if !d.is_ascii_digit() {
                return None;
            }
            v = v * 10 + i64::from(d - b'0');
        }
        out.push(if negative { -v } else { v });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str, errors: &[&str]) -> redis::Value {
        let mut items = vec![redis::Value::BulkString(text.as_bytes().to_vec())];
        items.extend(
            errors
                .iter()
                .map(|e| redis::Value::BulkString(e.as_bytes().to_vec())),
        );
        redis::Value::Array(items)
    }

    fn limit() -> Limit {
        Limit {
            requests: 5,
            window: Duration::from_secs(1),
        }
    }

    #[test]
    fn integers_parse_exactly_or_not_at_all() {
        assert_eq!(
            parse_integers(b"1 4 993518 -1 0"),
            Some(vec![1, 4, 993518, -1, 0])
        );
        assert_eq!(
            parse_integers(b"2592000000000"),
            Some(vec![2_592_000_000_000])
        );
        for bad in [&b""[..], b"1  2", b"1 ", b"1e+15", b"-", b"x", b"1.5"] {
            assert_eq!(
                parse_integers(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn decisions_read_in_order_with_their_errors() {
        let two = [limit(), limit()];
        let mut r = ScriptReply::parse(reply(
            "1 4 900000 -1 0 0 0 0 0 0 1000000",
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
            reply("1 x", &[]),
        ] {
            assert!(matches!(
                ScriptReply::parse(bad),
                Err(StoreError::Backend(_))
            ));
        }
    }
}
