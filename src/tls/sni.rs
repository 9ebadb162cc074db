//! Pure: which `[[tls.certs]]` entry a client's SNI selects.
//!
//! The rules are nginx's `server_name` (and Envoy's `server_names`): an exact name first, then
//! the longest matching `*.domain` wildcard (which, like a route's `host`, covers subdomains at
//! any depth but not `domain` itself); no SNI, or a name nothing claims, gets the default
//! certificate (`server.tls_cert`), as nginx's `default_server`.

use std::collections::HashMap;

use crate::config::HostMatch;

/// Names to certificate indexes, built once per load and read on every handshake.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SniTable {
    /// Lower-case exact names.
    exact: HashMap<String, usize>,
    /// `.domain` suffixes, longest first so the first match is the most specific.
    suffixes: Vec<(String, usize)>,
}

impl SniTable {
    /// An empty table: every client gets the default certificate.
    pub fn new() -> Self {
        SniTable::default()
    }

    /// Claim `name` for certificate `index`, unless it is already claimed; `false` if it was
    /// (the earlier claim stays: callers decide whether that is an error).
    pub fn claim(&mut self, name: &HostMatch, index: usize) -> bool {
        match name {
            HostMatch::Exact(n) => {
                if self.exact.contains_key(n) {
                    return false;
                }
                self.exact.insert(n.clone(), index);
            }
            HostMatch::Suffix(s) => {
                if self.suffixes.iter().any(|(t, _)| t == s) {
                    return false;
                }
                // Stable: among suffixes of one length, the first claimed stays first.
                let at = self.suffixes.partition_point(|(t, _)| t.len() >= s.len());
                self.suffixes.insert(at, (s.clone(), index));
            }
        }
        true
    }

    /// The certificate for a client's SNI (any case, an absolute name's trailing dot
    /// allowed); `None`: the default certificate.
    pub fn select(&self, sni: Option<&str>) -> Option<usize> {
        let sni = sni?;
        let sni = sni.strip_suffix('.').unwrap_or(sni);
        if sni.is_empty() {
            return None;
        }
        // rustls hands over SNI as sent; a lower-case copy keeps the exact lookup one hash.
        let lower;
        let sni = if sni.bytes().any(|b| b.is_ascii_uppercase()) {
            lower = sni.to_ascii_lowercase();
            lower.as_str()
        } else {
            sni
        };
        if let Some(&i) = self.exact.get(sni) {
            return Some(i);
        }
        self.suffixes
            .iter()
            .find(|(s, _)| sni.len() > s.len() && sni.ends_with(s.as_str()))
            .map(|&(_, i)| i)
    }

    /// The table for `[[tls.certs]]` entries, in file order. Listed `names` are claimed first
    /// (validation refused a name listed twice), then each certificate's own names in file
    /// order, each going to the first entry whose certificate has it and that no entry lists.
    pub fn build(entries: &[EntryNames]) -> SniTable {
        let mut table = SniTable::new();
        for (i, e) in entries.iter().enumerate() {
            for name in e.listed.iter().flatten() {
                table.claim(name, i);
            }
        }
        for (i, e) in entries.iter().enumerate() {
            if e.listed.is_none() {
                for name in &e.from_cert {
                    table.claim(name, i);
                }
            }
        }
        table
    }

    /// Is any name claimed by certificate `index`?
    pub fn serves(&self, index: usize) -> bool {
        self.exact
            .values()
            .chain(self.suffixes.iter().map(|(_, i)| i))
            .any(|&i| i == index)
    }
}

/// The names of one `[[tls.certs]]` entry.
#[derive(Debug, Clone, Default)]
pub struct EntryNames {
    /// Its `names`, when listed.
    pub listed: Option<Vec<HostMatch>>,
    /// The DNS names of its certificate's subjectAltName (used when `names` is not listed).
    pub from_cert: Vec<HostMatch>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(names: &[(&str, usize)]) -> SniTable {
        let mut t = SniTable::new();
        for (n, i) in names {
            assert!(t.claim(&HostMatch::parse(n).unwrap(), *i), "{n}");
        }
        t
    }

    #[test]
    fn no_sni_or_an_unknown_name_gets_the_default() {
        let t = table(&[("api.example.com", 0), ("*.example.com", 1)]);
        assert_eq!(t.select(None), None);
        assert_eq!(t.select(Some("")), None);
        assert_eq!(t.select(Some("example.org")), None);
        assert_eq!(SniTable::new().select(Some("api.example.com")), None);
    }

    #[test]
    fn an_exact_name_beats_a_wildcard() {
        let t = table(&[("*.example.com", 1), ("api.example.com", 0)]);
        assert_eq!(t.select(Some("api.example.com")), Some(0));
        assert_eq!(t.select(Some("www.example.com")), Some(1));
    }

    #[test]
    fn a_wildcard_covers_subdomains_not_the_domain() {
        let t = table(&[("*.example.com", 1)]);
        assert_eq!(t.select(Some("a.example.com")), Some(1));
        assert_eq!(t.select(Some("a.b.example.com")), Some(1));
        assert_eq!(t.select(Some("example.com")), None);
        assert_eq!(t.select(Some("badexample.com")), None);
    }

    #[test]
    fn the_longest_wildcard_wins_whatever_the_claim_order() {
        for names in [
            [("*.example.com", 1), ("*.eu.example.com", 2)],
            [("*.eu.example.com", 2), ("*.example.com", 1)],
        ] {
            let t = table(&names);
            assert_eq!(t.select(Some("a.eu.example.com")), Some(2), "{names:?}");
            assert_eq!(t.select(Some("a.us.example.com")), Some(1), "{names:?}");
        }
    }

    #[test]
    fn case_and_the_trailing_dot_do_not_matter() {
        let t = table(&[("api.example.com", 0), ("*.example.net", 1)]);
        assert_eq!(t.select(Some("API.Example.COM")), Some(0));
        assert_eq!(t.select(Some("api.example.com.")), Some(0));
        assert_eq!(t.select(Some("WWW.EXAMPLE.NET.")), Some(1));
    }

    fn names(list: &[&str]) -> Vec<HostMatch> {
        list.iter().map(|n| HostMatch::parse(n).unwrap()).collect()
    }

    #[test]
    fn listed_names_win_then_certificate_names_go_to_the_first_entry() {
        let entries = [
            // Its certificate also has api.example.com, but the entry lists its names.
            EntryNames {
                listed: Some(names(&["www.example.com"])),
                from_cert: names(&["www.example.com", "api.example.com"]),
            },
            EntryNames {
                listed: None,
                from_cert: names(&["shop.example.com", "*.example.com"]),
            },
            // shop.example.com is the previous entry's; *.example.com too; only cdn is left.
            EntryNames {
                listed: None,
                from_cert: names(&["shop.example.com", "*.example.com", "cdn.example.com"]),
            },
            // Lists a name an earlier certificate has: the list wins.
            EntryNames {
                listed: Some(names(&["shop.example.com"])),
                from_cert: names(&["other.example.org"]),
            },
        ];
        let t = SniTable::build(&entries);
        let select = |n: &str| t.select(Some(n));
        assert_eq!(select("www.example.com"), Some(0));
        assert_eq!(
            select("api.example.com"),
            Some(1),
            "by the wildcard of entry 1"
        );
        assert_eq!(select("x.example.com"), Some(1));
        assert_eq!(select("cdn.example.com"), Some(2));
        assert_eq!(select("shop.example.com"), Some(3));
        assert_eq!(select("other.example.org"), None, "entry 3 lists its names");
    }

    #[test]
    fn a_name_claimed_twice_keeps_its_first_certificate() {
        let mut t = table(&[("api.example.com", 0), ("*.example.com", 0)]);
        assert!(!t.claim(&HostMatch::parse("API.example.com").unwrap(), 1));
        assert!(!t.claim(&HostMatch::parse("*.example.com").unwrap(), 1));
        assert_eq!(t.select(Some("api.example.com")), Some(0));
        assert_eq!(t.select(Some("x.example.com")), Some(0));
        assert!(t.serves(0) && !t.serves(1));
    }
}
