use super::*;

fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
    Value::Array(vec![
        Value::Int(start),
        Value::Int(end),
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
        ]),
    ])
}

fn shards_with(map: SlotMap) -> Shards {
    let shards = Shards::new(
        &[],
        None,
        Duration::from_millis(50),
        Duration::from_millis(100),
    );
    shards.map.store(Some(Arc::new(map)));
    shards
}

#[test]
fn a_dead_master_fails_only_its_own_slots() {
    let reply = Value::Array(vec![
        range(0, 5460, "10.0.0.1", 7000),
        range(5461, 10922, "", 7001),
        range(10923, 16383, "10.0.0.3", 7002),
    ]);
    let map = SlotMap::parse(reply, "10.0.0.2", &[]).unwrap();
    assert_eq!(map.master_of(5461).unwrap().host, "10.0.0.2");
    let shards = shards_with(map);
    let refused = StoreError::Unavailable("connection refused".into());
    shards.map.load().as_ref().unwrap().masters[0].went_down(&refused);
    assert!(shards.pass(0).is_err() && shards.pass(5460).is_err());
    assert!(
        shards.probe_owner(0).is_none(),
        "no PING asked for a master down already"
    );
    assert!(shards.pass(5461).is_ok() && shards.pass(16383).is_ok());
}

#[test]
fn a_master_keeps_its_health_across_a_new_map_and_unknown_slots_pass() {
    let old = SlotMap::parse(Value::Array(vec![range(0, 99, "h", 1)]), "h", &[]).unwrap();
    old.masters[0].down.store(true, Ordering::Release);
    let reply = Value::Array(vec![range(0, 49, "h", 1), range(50, 99, "g", 2)]);
    let shards = shards_with(SlotMap::parse(reply, "h", &old.masters).unwrap());
    assert!(shards.pass(0).is_err() && shards.pass(50).is_ok());
    assert!(shards.pass(100).is_ok(), "an unowned slot is left to Redis");
    assert!(Shards::new(&[], None, Duration::ZERO, Duration::ZERO)
        .pass(0)
        .is_ok());
}
