//! The reply's parsing.

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
