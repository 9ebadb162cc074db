//! The rule set a request is matched against: routes in file order (first match wins), their
//! upstream pools, and everything the hot path needs precomputed (policy names and header
//! values, metric handles).
//!
//! A [`Rules`] is immutable; a reload builds a new one and swaps it in whole, so a request in
//! flight finishes under the rules it started with.

use std::sync::Arc;

use http::HeaderValue;

use crate::config::{Config, RouteSpec, UpstreamTimeouts};
use crate::keys::ClientIpResolver;
use crate::logs::limit::EVENT_INTERVAL;
use crate::logs::state::StateLog;
use crate::metrics::RouteMetrics;
use crate::request::method_override::Methods;
use crate::response::partition_key::{PartitionKey, PartitionKeys};
use crate::response::ratelimit_headers::policy_field;
use crate::tls::{TlsFileError, UpstreamTransport};

/// One route, ready for the hot path: its validated spec plus what is precomputed from it.
pub struct Route {
    /// The route as configured.
    pub spec: RouteSpec,
    /// `<route>-<window>` per limit, as used in the RateLimit fields and problem bodies.
    pub policy_names: Vec<String>,
    /// The `RateLimit-Policy` field value (absent when the route has no limits).
    pub policy_header: Option<HeaderValue>,
    /// Metric handles of this route.
    pub metrics: RouteMetrics,
    /// WARN lines when this route's limiter changes state.
    pub state_log: StateLog,
    /// The custom deny body (`deny_body_file`), read when the rules were built.
    pub deny_body: Option<bytes::Bytes>,
    /// What the `pk` of this route's buckets is hashed with (shared by every route).
    pub partition_keys: Arc<PartitionKeys>,
    /// On a route with `plan`: where its clients' plans are read, and the route as each plan
    /// counts it. `None` for other routes and for the plans' own copies.
    pub plans: Option<PlanChoice>,
    /// The route's top limited clients (kept across reloads by name); `None` without limits.
    pub top: Option<Arc<crate::top::RouteTop>>,
    /// Where this route's limits start in its summary's list of policy names: 0, or for a
    /// plan's copy the limits of the plans before it (every plan's copy shares one summary).
    pub top_offset: u32,
}

/// A route's plans in the rules: the directory, and per plan the index of its copy of the
/// route in [`Rules::routes`] (the default plan's is the route itself).
pub struct PlanChoice {
    /// Where a client's plan is read.
    pub directory: crate::plans::PlanDirectory,
    /// Per plan, the index of the route as that plan counts it.
    pub routes: Vec<usize>,
}

pub use crate::config::file::MAX_DENY_BODY;

impl Route {
    fn new(spec: &RouteSpec, partition_keys: &Arc<PartitionKeys>) -> Result<Route, RulesError> {
        let deny_body = match &spec.answers.deny.body {
            None => None,
            Some(body) => Some(read_deny_body(&spec.name, &body.file)?),
        };
        let policy_names = spec.policy_names();
        let policy_header = spec
            .is_limited()
            .then(|| HeaderValue::from_str(&policy_field(&policy_names, &spec.limits)).ok())
            .flatten();
        let metrics = RouteMetrics::new(&spec.name, &policy_names);
        let top = (spec.is_limited()).then(|| crate::top::BOARD.route(&spec.name, &policy_names));
        Ok(Route {
            spec: spec.clone(),
            policy_names,
            policy_header,
            metrics,
            state_log: StateLog::default(),
            deny_body,
            partition_keys: partition_keys.clone(),
            plans: None,
            top,
            top_offset: 0,
        })
    }

    /// The partition key (`pk`) the RateLimit fields give `bucket`, a bucket key of this route.
    pub fn partition_key(&self, bucket: &str) -> PartitionKey {
        self.partition_keys.of(bucket)
    }

    /// Does this route take a request for `host` (no port, no trailing dot), `path`, sent as
    /// one of `methods` (its own, or an override an app would honour)?
    pub fn matches(&self, host: Option<&str>, path: &str, methods: &Methods) -> bool {
        let spec = &self.spec;
        let prefix = spec.matching.path_prefix.as_bytes();
        let path = path.as_bytes();
        let same = |a: &[u8], b: &[u8]| match spec.matching.path_case_insensitive {
            true => a.eq_ignore_ascii_case(b),
            false => a == b,
        };
        let prefixed = path.len() >= prefix.len() && same(&path[..prefix.len()], prefix);
        // A prefix ending in `/` also takes its bare form: Express serves `/api` (and
        // `/api?page=2`) with the `/api/` mount's root handler, Flask and Rails redirect or
        // serve it too, so left to the next route it would pass the limit.
        let bare = match prefix {
            [stem @ .., b'/'] if !stem.is_empty() => same(path, stem),
            _ => false,
        };
        if !prefixed && !bare {
            return false;
        }
        if !spec.matching.methods.is_empty() && !methods.any_in(&spec.matching.methods) {
            return false;
        }
        match (&spec.matching.host, host) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(m), Some(host)) => m.matches(host),
        }
    }
}

/// An upstream: round-robin over its servers (resolved when the rules are built, and again
/// every `resolve_interval`), those found dead left out, with Pingora's keepalive pool
/// underneath.
pub struct UpstreamPool {
    /// The `[upstreams.<name>]` name (for logs).
    pub name: String,
    /// The load balancer and the health of its servers.
    pub health: Arc<crate::upstream_health::PoolHealth>,
    /// The address, when there is exactly one and it is never looked up again (the common
    /// case): no balancer pick needed, and no health to weigh (a pool's last server is tried
    /// whatever its health).
    pub only: Option<pingora::protocols::l4::socket::SocketAddr>,
    /// Connect, read, write and pool idle timeouts.
    pub timeouts: UpstreamTimeouts,
    /// Plain or TLS, HTTP/1.1 or HTTP/2: builds the peer of each server.
    pub transport: UpstreamTransport,
    /// `slidegate_upstream_connect_failures_total{upstream}` of this upstream.
    pub connect_failures: prometheus::IntCounter,
    /// One WARN line per [`EVENT_INTERVAL`] about failed
    /// connects, with their count.
    pub connect_log: crate::logs::limit::Throttled,
}

impl UpstreamPool {
    /// A connect to one of this pool's servers failed: count it, and write one WARN line per
    /// upstream per [`EVENT_INTERVAL`] saying how many failed since the last one, instead of a
    /// line per request.
    pub fn connect_failed(
        &self,
        server: &impl std::fmt::Display,
        error: &pingora::Error,
        retry: bool,
    ) {
        self.connect_failures.inc();
        let Some(n) = self.connect_log.note(EVENT_INTERVAL) else {
            return;
        };
        let next = if retry {
            ", trying the next server"
        } else {
            ""
        };
        log::warn!(
            "upstream {}: {n} failed connect(s) since the last line (at most one line per {}s); \
             last: {server}: {error}{next}",
            self.name,
            EVENT_INTERVAL.as_secs()
        );
    }

    /// The server of this pool a request goes to next: the only one, or the balancer's pick
    /// among the servers it has not `failed` to connect to yet (like nginx's
    /// `proxy_next_upstream error`): an up one, or when none is up, any (nginx's too: a pool
    /// whose servers are all down is tried whole rather than refused).
    pub fn select(
        &self,
        failed: &[pingora::protocols::l4::socket::SocketAddr],
    ) -> pingora::Result<std::net::SocketAddr> {
        use pingora::{Error, ErrorType};
        let addr = match &self.only {
            // One address: no selection to make (the balancer's pick costs ~1,500 instructions).
            Some(addr) if failed.is_empty() => Some(addr.clone()),
            _ => {
                let lb = &self.health.lb;
                let pick = |up_only: bool| {
                    lb.select_with(b"", 256, |b, up| {
                        (up || !up_only) && !failed.contains(&b.addr)
                    })
                };
                pick(true).or_else(|| pick(false)).map(|b| b.addr)
            }
        };
        let addr = addr.ok_or_else(|| {
            Error::explain(
                ErrorType::ConnectNoRoute,
                format!("upstream {} has no server", self.name),
            )
        })?;
        match addr.as_inet() {
            Some(inet) => Ok(*inet),
            None => Error::e_explain(ErrorType::InternalError, "upstream is not an IP address"),
        }
    }

    /// Number of this pool's addresses now (bounds a request's connect retries).
    pub fn size(&self) -> usize {
        match self.only {
            Some(_) => 1,
            None => self.health.size(),
        }
    }

    /// The peer of `server`, with this pool's transport and timeouts.
    pub fn peer(&self, server: std::net::SocketAddr) -> Box<pingora::upstreams::peer::HttpPeer> {
        // Built in its box: an HttpPeer is large, and moving it in afterwards is another copy.
        let mut peer = Box::new(self.transport.peer(server));
        // Per upstream (nginx proxy_connect_timeout / proxy_read_timeout / proxy_send_timeout):
        // a black-holed upstream becomes a prompt 502, a hung one is cut instead of holding the
        // connection forever; idle pooled connections are dropped after `idle_timeout`.
        let t = self.timeouts;
        peer.options.connection_timeout = Some(t.connect);
        peer.options.total_connection_timeout = Some(t.connect * 2);
        peer.options.read_timeout = Some(t.read);
        peer.options.write_timeout = Some(t.write);
        peer.options.idle_timeout = Some(t.idle);
        peer
    }
}

/// A complete, immutable rule set.
pub struct Rules {
    /// Routes in file order, then each plan's copy of the routes with plans (see
    /// [`PlanChoice`]): only the first [`Rules::configured`] are matched.
    pub routes: Vec<Route>,
    /// How many of `routes` the file configures.
    pub configured: usize,
    /// Upstream pools, indexed by [`RouteSpec::upstream`].
    pub upstreams: Vec<UpstreamPool>,
    /// Client address resolution.
    pub client_ip: ClientIpResolver,
    /// `server.server_header`: the `Server` field of every response (`None`: none).
    pub server_header: Option<HeaderValue>,
    /// `server.forwarded_headers`: set on every proxied request, the others removed.
    pub forwarded_headers: crate::config::ForwardedHeaders,
    /// `server.request_id`: what is done with `X-Request-Id`.
    pub request_id: crate::config::RequestIdMode,
    /// `store.max_delayed`: requests waiting for room at once, over every route.
    pub max_delayed: u32,
}

/// What building rules can fail on: the steps that do I/O.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// An upstream server that does not resolve.
    #[error("upstreams.{upstream}.servers: {server} does not resolve: {source}")]
    Resolve {
        /// The `[upstreams.<name>]` name.
        upstream: String,
        /// The server as configured.
        server: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// An upstream's `ca_file` that cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsFileError),
    /// A route's plan file that cannot be read or names a plan the config lacks.
    #[error("routes.{route}.plan: {source}")]
    PlanFile {
        /// The route's name.
        route: String,
        /// What is wrong, with the file, line and key.
        source: crate::plans::file::PlanFileError,
    },
    /// A route's `deny_body_file` that cannot be read, or is too large.
    #[error("routes.{route}.deny_body_file: {file}: {reason}")]
    DenyBody {
        /// The route's name.
        route: String,
        /// The file, as configured.
        file: String,
        /// What is wrong.
        reason: String,
    },
}

/// Read a route's `deny_body_file`, at most [`MAX_DENY_BODY`] bytes.
fn read_deny_body(route: &str, file: &std::path::Path) -> Result<bytes::Bytes, RulesError> {
    let failed = |reason: String| RulesError::DenyBody {
        route: route.into(),
        file: file.display().to_string(),
        reason,
    };
    let bytes = crate::config::file::read_bounded(file, MAX_DENY_BODY);
    Ok(bytes.map_err(|e| failed(e.to_string()))?.into())
}

impl Rules {
    /// Build the rule set of a validated config, resolving every upstream server (the only
    /// place host names are looked up).
    pub fn build(config: &Config) -> Result<Rules, RulesError> {
        let mut upstreams = Vec::with_capacity(config.upstreams.len());
        for up in &config.upstreams {
            let mut resolved = Vec::with_capacity(up.servers.len());
            let mut hosts = Vec::with_capacity(up.servers.len());
            for server in &up.servers {
                let failed = |source| RulesError::Resolve {
                    upstream: up.name.clone(),
                    server: server.to_string(),
                    source,
                };
                let target = (server.host.as_str(), server.port);
                let addrs: Vec<_> = std::net::ToSocketAddrs::to_socket_addrs(&target)
                    .map_err(failed)?
                    .collect();
                if addrs.is_empty() {
                    let none = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
                    return Err(failed(none));
                }
                hosts.extend(addrs.iter().map(|a| (*a, server.host.clone())));
                resolved.push(addrs);
            }
            let transport = UpstreamTransport::new(up, hosts)?;
            let mut addrs: Vec<_> = resolved.iter().flatten().copied().collect();
            addrs.sort();
            addrs.dedup();
            let fixed = addrs.len() == 1 && up.health.resolve_interval.is_none();
            let only = fixed.then(|| pingora::protocols::l4::socket::SocketAddr::Inet(addrs[0]));
            let template = transport.peer(addrs[0]);
            let resolver = Arc::new(crate::upstream_health::SystemResolver);
            let health =
                crate::upstream_health::PoolHealth::build(up, resolved, template, resolver);
            upstreams.push(UpstreamPool {
                name: up.name.clone(),
                health,
                only,
                timeouts: up.timeouts,
                transport,
                connect_failures: crate::metrics::METRICS
                    .upstream_connect_failures
                    .with_label_values(&[&up.name]),
                connect_log: Default::default(),
            });
        }
        let secret = config.store.partition_key_secret.as_ref();
        let partition_keys = Arc::new(PartitionKeys::new(
            secret.map(|s| s.expose().as_bytes()),
            &config.store.prefix,
        ));
        let mut routes = (config.routes.iter())
            .map(|spec| Route::new(spec, &partition_keys))
            .collect::<Result<Vec<_>, _>>()?;
        let configured = routes.len();
        for i in 0..configured {
            let Some(plans) = config.routes[i].plans.as_ref() else {
                continue;
            };
            let name = &config.routes[i].name;
            let directory = crate::plans::PlanDirectory::build(name, plans).map_err(|source| {
                RulesError::PlanFile {
                    route: name.clone(),
                    source,
                }
            })?;
            let mut indexes = Vec::with_capacity(plans.each.len());
            for (p, plan) in plans.each.iter().enumerate() {
                if p == plans.default {
                    indexes.push(i);
                    continue;
                }
                let mut spec = config.routes[i].clone();
                spec.limits = plan.limits.clone();
                spec.limit_keys = plan.limit_keys.clone();
                spec.cost = plan.cost.clone();
                if let Some(own) = spec.plans.as_mut() {
                    own.chosen = p;
                }
                indexes.push(routes.len());
                routes.push(Route::new(&spec, &partition_keys)?);
            }
            // One summary for the route, naming every plan's limits: each copy's refusals are
            // recorded at its plan's offset.
            let mut names = Vec::new();
            for &r in &indexes {
                routes[r].top_offset = u32::try_from(names.len()).unwrap_or(u32::MAX);
                names.extend(routes[r].policy_names.iter().cloned());
            }
            let top = (!names.is_empty()).then(|| crate::top::BOARD.route(name, &names));
            for &r in &indexes {
                routes[r].top = top.clone();
            }
            routes[i].plans = Some(PlanChoice {
                directory,
                routes: indexes,
            });
        }
        Ok(Rules {
            routes,
            configured,
            upstreams,
            client_ip: ClientIpResolver::new(config.client_ip.trusted_proxies.clone())
                .with_prefixes(config.client_ip.key_prefixes),
            server_header: config.routing.server_header.clone(),
            forwarded_headers: config.routing.forwarded_headers,
            request_id: config.routing.request_id,
            max_delayed: config.store.max_delayed,
        })
    }

    /// The health of every upstream pool, for [`crate::upstream_health::HealthService`].
    pub fn pool_health(&self) -> Vec<Arc<crate::upstream_health::PoolHealth>> {
        self.upstreams.iter().map(|p| p.health.clone()).collect()
    }

    /// The first route that takes this request, with its index.
    pub fn find(
        &self,
        host: Option<&str>,
        path: &str,
        methods: &Methods,
    ) -> Option<(usize, &Route)> {
        self.configured_routes()
            .iter()
            .enumerate()
            .find(|(_, r)| r.matches(host, path, methods))
    }

    /// The routes the file configures, in its order (without the plans' copies).
    pub fn configured_routes(&self) -> &[Route] {
        &self.routes[..self.configured]
    }
}
