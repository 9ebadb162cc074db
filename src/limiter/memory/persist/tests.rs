//! The state file: its format refused whole when it is not one of ours, and the store's
//! windows through a write and a read, on fake clocks with a chosen time down.

use std::time::Duration;

use super::format::{decode, encode, ArenaState, BucketState, LimitState, Snapshot};
use super::windows::{restore, take_snapshot};
use super::*;
use crate::limiter::algo::calendar::{Calendar, Per, Zone};
use crate::limiter::algo::clock::{Clock, FakeClock};
use crate::limiter::algo::LimitKind;
use crate::limiter::{Limit, Unit};

const S: u64 = 1_000_000;

fn limits() -> Vec<Limit> {
    let day = Calendar::new(Per::Day, Zone::named("UTC").unwrap(), Unit::Requests);
    vec![
        Limit::log(5, Duration::from_secs(10)),
        Limit::slotted(5, Duration::from_secs(20), Duration::from_secs(1)),
        Limit::cost(50, Duration::from_secs(30), Duration::from_secs(1)).weighted(10),
        Limit::of(5, Per::Day.longest(), LimitKind::Calendar(day)),
    ]
}

/// The id of `route`'s limit named `text`, as the server finds it from the config.
fn ids(route: &str, text: &str) -> Option<LimitId> {
    let all = limits();
    (route == "login")
        .then(|| all.iter().map(Limit::id).find(|id| id.to_string() == text))
        .flatten()
}

/// A store on `clock` with the route "login".
fn store(clock: &FakeClock) -> MemoryStore {
    MemoryStore::with_max_memory(16 << 20)
        .with_clock(clock.clone())
        .with_routes(["login"])
}

/// A clock on a day's 10:00 UTC, on the store's scale.
fn ten_am() -> FakeClock {
    // 2026-12-06T10:00:00Z.
    FakeClock::at(1_796_205_600 * S - crate::limiter::algo::clock::UNIX_AT_ZERO_US)
}

/// Write `store`, then read it into a fresh store whose clock is `down` later (the wall
/// clock moved as much).
fn through_file(
    from: &MemoryStore,
    clock: &FakeClock,
    down: Duration,
) -> (MemoryStore, FakeClock, Loaded) {
    let (snapshot, _) = take_snapshot(from, MAX_FILE_BYTES);
    let snapshot = decode(&encode(&snapshot)).expect("our own file reads back");
    let later = FakeClock::at(clock.now_us() + down.as_micros() as u64);
    let to = store(&later);
    let wall = snapshot.wall_us + down.as_micros() as u64;
    let loaded = restore(&to, snapshot, &ids, wall);
    (to, later, loaded)
}

#[test]
fn every_kind_at_its_limit_is_still_refused_after_a_restart_and_frees_when_it_would_have() {
    let all = limits();
    for (i, limit) in all.iter().enumerate() {
        let clock = ten_am();
        let from = store(&clock);
        let one = std::slice::from_ref(limit);
        let key = format!("login:client-{i}");
        let mut admitted = 0;
        while from.check_now_in("login", &key, one).admitted {
            admitted += 1;
            clock.advance(Duration::from_millis(100));
            assert!(admitted <= 5, "{limit:?}");
        }
        assert_eq!(admitted, 5, "{limit:?}");
        // Down for 2 s: still refused; the window's own time later: admitted.
        let (to, later, loaded) = through_file(&from, &clock, Duration::from_secs(2));
        assert_eq!(
            (loaded.buckets, loaded.counted),
            (1, 5 * limit.weight as usize)
        );
        assert!(!to.check_now_in("login", &key, one).admitted, "{limit:?}");
        // When the writer would have admitted again, from the reader's clock 2 s on.
        let free = from.check_now_in("login", &key, one).states[0].reset;
        let down = Duration::from_secs(2);
        later.advance(free - down - Duration::from_millis(500));
        assert!(!to.check_now_in("login", &key, one).admitted, "{limit:?}");
        later.advance(Duration::from_millis(500));
        assert!(to.check_now_in("login", &key, one).admitted, "{limit:?}");
        // A fresh client of the same route starts with its whole quota.
        assert!(to.check_now_in("login", "login:other", one).admitted);
    }
}

#[test]
fn what_passed_while_down_is_dropped_and_leases_are_never_written() {
    let clock = ten_am();
    let from = store(&clock);
    let log = [Limit::log(5, Duration::from_secs(10))];
    assert!(from.check_now_in("login", "login:a", &log).admitted);
    let lease = [Limit::lease(2, Duration::from_secs(30))];
    assert!(from.check_now_in("login", "login:b", &lease).admitted);
    let (snapshot, saved) = take_snapshot(&from, MAX_FILE_BYTES);
    assert_eq!(
        saved.buckets, 1,
        "the lease's bucket counts nothing to write"
    );
    assert_eq!(snapshot.arenas[0].buckets.len(), 1);
    let (_, _, loaded) = through_file(&from, &clock, Duration::from_secs(11));
    assert_eq!((loaded.buckets, loaded.expired), (0, 1));
    // A route no longer configured, a limit no longer configured.
    let other = MemoryStore::new()
        .with_clock(clock.clone())
        .with_routes(["gone"]);
    assert!(other.check_now_in("gone", "gone:a", &log).admitted);
    let (_, _, loaded) = through_file(&other, &clock, Duration::ZERO);
    assert_eq!((loaded.buckets, loaded.gone), (0, 1));
    let ten = [Limit::log(5, Duration::from_secs(11))];
    let odd = store(&clock);
    assert!(odd.check_now_in("login", "login:a", &ten).admitted);
    let (_, _, loaded) = through_file(&odd, &clock, Duration::ZERO);
    assert_eq!((loaded.buckets, loaded.gone), (0, 1));
}

#[test]
fn a_wall_clock_set_back_counts_as_no_time_down() {
    let clock = ten_am();
    let from = store(&clock);
    let log = [Limit::log(1, Duration::from_secs(10))];
    assert!(from.check_now_in("login", "login:a", &log).admitted);
    let (snapshot, _) = take_snapshot(&from, MAX_FILE_BYTES);
    let to = store(&clock);
    let wall = snapshot.wall_us - 3600 * S;
    let loaded = restore(&to, snapshot, &ids, wall);
    assert_eq!(loaded.buckets, 1);
    assert!(!to.check_now_in("login", "login:a", &log).admitted);
}

#[test]
fn the_size_bound_keeps_the_fullest_buckets_and_counts_the_rest() {
    let clock = ten_am();
    let from = store(&clock);
    let log = [Limit::log(5, Duration::from_secs(60))];
    for i in 0..100 {
        // Client i has 1 + i % 5 entries: 20 clients are at 5 of 5.
        for _ in 0..=(i % 5) {
            assert!(
                from.check_now_in("login", &format!("login:{i}"), &log)
                    .admitted
            );
        }
    }
    // Room for the header and about 20 full buckets (8 + 1 + 1 + 5 + 4 + 5 x 12 bytes).
    let max = format::EMPTY_LEN + format::arena_overhead("login") + 20 * 79;
    let (snapshot, saved) = take_snapshot(&from, max);
    assert_eq!((saved.buckets, saved.dropped_buckets), (20, 80));
    assert!(encode(&snapshot).len() <= max);
    let full: Vec<usize> = (snapshot.arenas[0].buckets.iter())
        .map(|b| b.limits[0].steps.len())
        .collect();
    assert!(full.iter().all(|&n| n == 5), "{full:?}");
}

#[test]
fn save_and_load_replace_the_file_atomically_and_a_missing_file_is_a_first_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("windows.state");
    let clock = ten_am();
    let from = store(&clock);
    assert_eq!(load(&from, &path, &ids).unwrap(), None);
    // The id of limits()'s log, whatever its `requests`.
    let log = [Limit::log(2, Duration::from_secs(10))];
    for _ in 0..2 {
        assert!(from.check_now_in("login", "login:a", &log).admitted);
    }
    let saved = save(&from, &path, MAX_FILE_BYTES).unwrap();
    assert_eq!((saved.buckets, saved.steps), (1, 2));
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "no temporary file is left behind");
    let to = store(&clock);
    let loaded = load(&to, &path, &ids).unwrap().unwrap();
    assert_eq!(loaded.buckets, 1);
    assert!(!to.check_now_in("login", "login:a", &log).admitted);
    // Too large: refused before it is read.
    std::fs::write(&path, vec![0u8; MAX_FILE_BYTES + 1]).unwrap();
    assert!(matches!(
        load(&store(&clock), &path, &ids),
        Err(PersistError::TooLarge(_))
    ));
}

fn sample() -> Snapshot {
    Snapshot {
        wall_us: 1_796_205_600 * S,
        clock_us: 123_456_789,
        seed: 0xDEAD_BEEF,
        arenas: vec![ArenaState {
            route: "login".into(),
            buckets: vec![BucketState {
                key: 42,
                limits: vec![LimitState {
                    id: "10000".into(),
                    steps: vec![(100, 1), (200, 1)],
                }],
            }],
        }],
    }
}

#[test]
fn foreign_future_corrupt_and_cut_files_are_refused_with_their_reason() {
    let bytes = encode(&sample());
    assert_eq!(decode(&bytes).unwrap(), sample());
    let err = |b: &[u8]| decode(b).unwrap_err().to_string();
    assert!(err(b"[server]\nlisten = 1\n").contains("not a slidegate state file"));
    assert!(err(b"").contains("cut short"));
    assert!(err(&bytes[..20]).contains("cut short"));
    let mut future = bytes.clone();
    future[8] = 2;
    assert!(
        err(&future).contains("format version 2"),
        "{}",
        err(&future)
    );
    let mut flipped = bytes.clone();
    flipped[40] ^= 1;
    assert!(err(&flipped).contains("checksum mismatch"));
    assert!(err(&bytes[..bytes.len() - 3]).contains("checksum mismatch"));
    // A count past the end, under a checksum that matches: refused, no allocation.
    let mut lying = bytes[..bytes.len() - 8].to_vec();
    lying[44..48].copy_from_slice(&u32::MAX.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&lying);
    lying.extend_from_slice(&sum.to_le_bytes());
    assert!(err(&lying).starts_with("corrupt:"), "{}", err(&lying));
}

/// Random snapshots read back as written; random damage to one is refused, never a panic.
#[test]
fn random_files_round_trip_and_random_damage_is_always_refused() {
    let mut rng = fastrand::Rng::with_seed(55);
    for _ in 0..300 {
        let arenas = (0..rng.usize(0..4))
            .map(|r| ArenaState {
                route: format!("route-{r}"),
                buckets: (0..rng.usize(0..6))
                    .map(|_| BucketState {
                        key: rng.u64(..),
                        limits: (0..rng.usize(1..4))
                            .map(|_| LimitState {
                                id: rng.u32(..).to_string(),
                                steps: (0..rng.usize(0..8))
                                    .map(|_| (rng.u64(..), rng.u32(..)))
                                    .collect(),
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect();
        let s = Snapshot {
            wall_us: rng.u64(..),
            clock_us: rng.u64(..),
            seed: rng.u64(..),
            arenas,
        };
        let bytes = encode(&s);
        assert_eq!(decode(&bytes).unwrap(), s);
        let mut damaged = bytes.clone();
        match rng.u8(0..3) {
            0 => damaged.truncate(rng.usize(0..bytes.len())),
            1 => {
                let i = rng.usize(0..bytes.len());
                damaged[i] ^= 1 << rng.u8(0..8);
            }
            _ => damaged.insert(rng.usize(0..=bytes.len()), rng.u8(..)),
        }
        assert!(decode(&damaged).is_err());
    }
}
