//! The client address of a request: the socket peer, or, behind trusted proxies, the address
//! `X-Forwarded-For` proves.

use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

/// How many leading bits of a client address name its bucket (`[client_ip] ipv4_prefix` and
/// `ipv6_prefix`). One IPv6 host usually holds a whole /64 and can take a fresh address per
/// request, so keying by the full address would give it a fresh bucket each time; a prefix keys
/// the network instead. Only the bucket key is affected: logs and forwarding headers show the
/// address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPrefixes {
    /// Leading bits of an IPv4 address, 0–32 (default 32: the address).
    pub v4: u8,
    /// Leading bits of an IPv6 address, 0–128 (default 128: the address).
    pub v6: u8,
}

impl Default for KeyPrefixes {
    fn default() -> Self {
        KeyPrefixes { v4: 32, v6: 128 }
    }
}

impl KeyPrefixes {
    /// The network `ip` is counted as: its first `v4` or `v6` bits, the rest zero.
    pub fn network(self, ip: IpAddr) -> IpAddr {
        let bits = match ip {
            IpAddr::V4(_) => self.v4,
            IpAddr::V6(_) => self.v6,
        };
        // A full-length prefix is the address (the common case: no arithmetic); the config
        // refuses lengths past the address, and `IpNet::new` would too.
        if bits >= ip_bits(ip) {
            return ip;
        }
        IpNet::new(ip, bits).map_or(ip, |net| net.network())
    }
}

/// 32 or 128.
fn ip_bits(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// `net` as the proxy compares it: a network inside `::ffff:0:0/96` (IPv4-mapped addresses)
/// is that IPv4 network. Peers and `X-Forwarded-For` entries are compared as IPv4 when they
/// are mapped (see [`ClientIpResolver::is_trusted`]), so a mapped entry written as IPv6 would
/// otherwise match nothing.
pub fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).unwrap_or(net),
            None => net,
        },
        _ => net,
    }
}

/// Resolves the client address of a request.
#[derive(Debug, Clone, Default)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
    prefixes: KeyPrefixes,
}

impl ClientIpResolver {
    /// A resolver that believes `X-Forwarded-For` only from peers inside `trusted`.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        ClientIpResolver {
            trusted,
            prefixes: KeyPrefixes::default(),
        }
    }

    /// The same, keying clients by `prefixes` of their address.
    pub fn with_prefixes(mut self, prefixes: KeyPrefixes) -> Self {
        self.prefixes = prefixes;
        self
    }

    /// The address a client's bucket is keyed by: its network under the configured prefixes
    /// (see [`KeyPrefixes`]). The proxy and the admin inspector both key through here.
    pub fn key_address(&self, client: IpAddr) -> IpAddr {
        self.prefixes.network(client.to_canonical())
    }

    /// Is `ip` inside `trusted_proxies`? An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, how
    /// a dual-stack socket shows an IPv4 peer) is its IPv4 address.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address. When the socket peer is a trusted proxy, walk `X-Forwarded-For`
    /// from the right and return the first address that is not trusted: entries to its left
    /// were written by the client itself and prove nothing. If every hop is trusted, the
    /// left-most one is the client; an unparsable entry ends the walk at the last good hop.
    /// IPv4-mapped addresses, of the peer or of an entry, come back as IPv4.
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if self.trusted.is_empty() || !self.is_trusted(peer) {
            return peer;
        }
        let mut client = peer;
        // Several X-Forwarded-For lines are one list, in order.
        let values: Vec<&[u8]> = headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        for value in values.iter().rev() {
            for hop in value.rsplit(|b| *b == b',') {
                let Some(ip) = parse_hop(hop) else {
                    return client;
                };
                client = ip;
                if !self.is_trusted(ip) {
                    return ip;
                }
            }
        }
        client
    }
}

/// One `X-Forwarded-For` element: an IP, optionally `[v6]` or with a `:port`; an IPv4-mapped
/// one as its IPv4 address.
fn parse_hop(hop: &[u8]) -> Option<IpAddr> {
    parse_hop_text(hop).map(|ip| ip.to_canonical())
}

fn parse_hop_text(hop: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(hop).ok()?.trim();
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    s.rsplit_once(':').and_then(|(ip, _port)| ip.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_mapped_network_is_its_ipv4_network() {
        let canon = |s: &str| canonical_net(s.parse().unwrap()).to_string();
        assert_eq!(canon("::ffff:10.0.0.0/104"), "10.0.0.0/8");
        assert_eq!(canon("::ffff:192.0.2.7/128"), "192.0.2.7/32");
        assert_eq!(canon("::ffff:0:0/96"), "0.0.0.0/0");
        // Not inside ::ffff:0:0/96: left alone.
        assert_eq!(canon("2001:db8::/32"), "2001:db8::/32");
        assert_eq!(canon("::/0"), "::/0");
        assert_eq!(canon("10.0.0.0/8"), "10.0.0.0/8");
        let trusted =
            ClientIpResolver::new(vec![canonical_net("::ffff:10.0.0.0/104".parse().unwrap())]);
        assert!(trusted.is_trusted("10.1.2.3".parse().unwrap()));
        assert!(trusted.is_trusted("::ffff:10.1.2.3".parse().unwrap()));
    }

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn untrusted_peer_ignores_xff() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(r.resolve(peer, &headers(&["1.2.3.4"])), peer);
    }

    #[test]
    fn trusted_peer_takes_rightmost_untrusted() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        // The client forged 6.6.6.6 on the left; 203.0.113.9 is what our proxy saw.
        let got = r.resolve(peer, &headers(&["6.6.6.6, 203.0.113.9", "10.1.1.1"]));
        assert_eq!(got, "203.0.113.9".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn ipv4_mapped_peers_and_hops_are_ipv4() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert!(r.is_trusted(mapped));
        let got = r.resolve(
            mapped,
            &headers(&["[::ffff:203.0.113.9]:5555, ::ffff:10.2.2.2"]),
        );
        assert_eq!(got, "203.0.113.9".parse::<IpAddr>().unwrap());
        // Untrusted: the peer itself, as IPv4.
        let stranger: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let got = r.resolve(stranger, &headers(&["1.2.3.4"]));
        assert_eq!(got, "192.0.2.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn prefixes_key_the_network() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let r = ClientIpResolver::default();
        assert_eq!(
            r.key_address(ip("2001:db8:1:2:aaaa::1")),
            ip("2001:db8:1:2:aaaa::1")
        );
        assert_eq!(r.key_address(ip("192.0.2.77")), ip("192.0.2.77"));
        let r = r.with_prefixes(KeyPrefixes { v4: 24, v6: 64 });
        for a in ["2001:db8:1:2:aaaa::1", "2001:db8:1:2:ffff:ffff:ffff:ffff"] {
            assert_eq!(r.key_address(ip(a)), ip("2001:db8:1:2::"), "{a}");
        }
        assert_eq!(r.key_address(ip("2001:db8:1:3::1")), ip("2001:db8:1:3::"));
        assert_eq!(r.key_address(ip("192.0.2.77")), ip("192.0.2.0"));
        // An IPv4-mapped client takes the IPv4 prefix, not the IPv6 one.
        assert_eq!(r.key_address(ip("::ffff:192.0.2.77")), ip("192.0.2.0"));
        let all = KeyPrefixes { v4: 0, v6: 0 };
        assert_eq!(all.network(ip("2001:db8::1")), ip("::"));
    }

    #[test]
    fn garbage_hop_stops_at_last_good() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let got = r.resolve(peer, &headers(&["nonsense, 10.2.2.2"]));
        assert_eq!(got, "10.2.2.2".parse::<IpAddr>().unwrap());
    }
}
