//! The client address of a request: the socket peer, or, behind trusted proxies, the address
//! `X-Forwarded-For` proves.

use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

/// Resolves the client address of a request.
#[derive(Debug, Clone, Default)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
}

impl ClientIpResolver {
    /// A resolver that believes `X-Forwarded-For` only from peers inside `trusted`.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        ClientIpResolver { trusted }
    }

    /// Is `ip` inside `trusted_proxies`?
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address. When the socket peer is a trusted proxy, walk `X-Forwarded-For`
    /// from the right and return the first address that is not trusted: entries to its left
    /// were written by the client itself and prove nothing. If every hop is trusted, the
    /// left-most one is the client; an unparsable entry ends the walk at the last good hop.
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
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

/// One `X-Forwarded-For` element: an IP, optionally `[v6]` or with a `:port`.
fn parse_hop(hop: &[u8]) -> Option<IpAddr> {
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
    fn garbage_hop_stops_at_last_good() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let got = r.resolve(peer, &headers(&["nonsense, 10.2.2.2"]));
        assert_eq!(got, "10.2.2.2".parse::<IpAddr>().unwrap());
    }
}
