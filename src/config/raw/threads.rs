//! `server.threads`: a count, or `"auto"` for the cores this process may run on.

use serde::de::{self, Unexpected, Visitor};
use serde::{Deserialize, Serialize};

/// How many Pingora worker threads the proxy service runs, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(in crate::config) enum Threads {
    /// One per core this process may use ([`std::thread::available_parallelism`], which
    /// honours CPU affinity and cgroup quotas, so a container limited to 2 CPUs gets 2).
    #[default]
    Auto,
    /// Exactly this many (checked against 1..=1024 in `validate`).
    Count(u64),
}

impl Threads {
    /// The count this host runs: `Auto` resolved now (1 if the OS cannot tell).
    pub fn resolve(self) -> u64 {
        match self {
            Threads::Count(n) => n,
            Threads::Auto => std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Threads {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Threads;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a thread count or \"auto\"")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Threads, E> {
                u64::try_from(n)
                    .map(Threads::Count)
                    .map_err(|_| E::invalid_value(Unexpected::Signed(n), &self))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Threads, E> {
                Ok(Threads::Count(n))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Threads, E> {
                match s {
                    "auto" => Ok(Threads::Auto),
                    other => Err(E::invalid_type(Unexpected::Str(other), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Threads {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Threads::Auto => s.serialize_str("auto"),
            Threads::Count(n) => s.serialize_u64(*n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Serialize)]
    struct T {
        threads: Threads,
    }

    #[test]
    fn auto_and_counts_parse_and_print_back() {
        for (text, want) in [
            ("threads = \"auto\"", Threads::Auto),
            ("threads = 3", Threads::Count(3)),
        ] {
            let t: T = toml::from_str(text).unwrap();
            assert_eq!(t.threads, want);
            assert_eq!(toml::to_string(&t).unwrap().trim(), text);
        }
        let err = toml::from_str::<T>("threads = \"two\"")
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("invalid type") && err.contains("\"auto\""),
            "{err}"
        );
        assert!(toml::from_str::<T>("threads = -1").is_err());
    }

    #[test]
    fn auto_is_at_least_one_thread() {
        assert!(Threads::Auto.resolve() >= 1);
        assert_eq!(Threads::Count(2).resolve(), 2);
    }
}
