//! Assembles the Pingora server from a validated config: the proxy service, the admin service,
//! the store's maintenance task and the reloader.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::apps::HttpServerOptions;
use pingora::prelude::{background_service, Opt};
use pingora::proxy::HttpProxy;
use pingora::server::configuration::ServerConf;
use pingora::server::{ListenFds, RunArgs, RuntimeOpts, Server, ShutdownWatch};
use pingora::services::listening::Service as ListeningService;
use pingora::services::Service;

use crate::access_log::AccessLog;
use crate::admin::admin_service;
use crate::admin::stopping::{ServeUntilExit, Signals, Stopping};
use crate::config::Config;
use crate::edge::{ConnLimits, EdgeApp, TlsPort};
use crate::limiter::Store;
use crate::process::limits_os::raise_nofile;
use crate::process::reload::Reloader;
use crate::process::state_file::StateFile;
use crate::process::stores::{
    build_local_fallback, build_store, maintain_store, memory_store, StoreSweeper,
};
use crate::proxy::SlideGate;
use crate::response::ratelimit_headers::ceil_secs;
use crate::routes::Rules;
use crate::tls::load_listener;
use crate::upstream_health::HealthService;

/// The proxy service, with the store's maintenance running on the proxy's own runtime.
///
/// A redis-rs connection's driver task lives on the runtime that created it. Creating it here,
/// next to the requests that use it, keeps every limiter call on the proxy's worker threads; a
/// connection made on a separate background runtime would cost two cross-thread wake-ups per
/// request.
///
/// It also writes the pid file once the listeners are bound, and ends the process as soon as
/// the last client connection closes after a graceful shutdown ([`crate::process::drain`]).
struct ProxyWithStore<S> {
    proxy: S,
    store: Arc<dyn Store>,
    /// The listener addresses as given to Pingora (its fd table's keys).
    listen: Vec<String>,
    pid_file: std::path::PathBuf,
    grace_period: Duration,
    /// Written once the drain has ended, before the process exits.
    state_file: Option<Arc<StateFile>>,
}

#[async_trait]
impl<S: Service> Service for ProxyWithStore<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        tokio::spawn(maintain_store(self.store.clone(), shutdown.clone()));
        if let Some(fds) = &fds {
            let pid = crate::process::pid_file::write_when_bound(
                fds.clone(),
                self.listen.clone(),
                self.pid_file.clone(),
            );
            tokio::spawn(pid);
        }
        // Returns once the listeners stopped accepting, after the shutdown broadcast.
        self.proxy
            .start_service(fds, shutdown, listeners_per_fd)
            .await;
        let state_file = self.state_file.clone();
        let before_exit = move || {
            if let Some(f) = state_file {
                f.save("after the drain");
            }
        };
        let pid_file = self.pid_file.clone();
        crate::process::drain::exit_when_drained(self.grace_period, pid_file, before_exit).await;
    }

    fn name(&self) -> &str {
        self.proxy.name()
    }

    fn threads(&self) -> Option<usize> {
        self.proxy.threads()
    }

    fn runtime_opts_override(&self, global: &RuntimeOpts) -> Option<RuntimeOpts> {
        self.proxy.runtime_opts_override(global)
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.proxy.listen_addresses()
    }
}

/// SIGHUP's default action terminates the process, and the reloader only starts listening once
/// Pingora has started its services. Registering a handler now (tokio keeps it installed for the
/// life of the process) makes an early SIGHUP harmless instead of fatal.
/// SIGUSR1 (access log reopen) likewise.
fn catch_sighup_from_now_on() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build a runtime to register SIGHUP")?;
    let _guard = rt.enter();
    let _sighup = signal(SignalKind::hangup()).context("cannot catch SIGHUP")?;
    let _sigusr1 = signal(SignalKind::user_defined1()).context("cannot catch SIGUSR1")?;
    Ok(())
}

/// The downstream listeners: plain HTTP/1.1 (and h2c if enabled), and TLS with HTTP/2 and
/// HTTP/1.1 by ALPN. Pingora buffers what it writes to a client (1460 bytes) and flushes a
/// response with a `Content-Length` only at its end, so a slow upstream's body (a progress
/// stream, `/drip`, a long poll) would reach the client only when complete. The listener's
/// buffer is off; `EdgeStream` holds writes instead and sends them as soon as the proxy waits
/// (see `edge::held_writes`), so pieces arrive as the upstream sends them, like nginx.
///
/// The TLS listener is a plain one here: its handshakes run in [`EdgeApp`], inside the
/// connection cap (see `edge::tls_accept`).
///
/// Returns the addresses as given to Pingora, the keys of its listening-socket table.
fn add_listeners<A>(
    proxy: &mut pingora::services::listening::Service<A>,
    config: &Config,
) -> Vec<String> {
    use pingora::listeners::ListenerConfig;
    use pingora::protocols::l4::stream::L4BufferSettings;
    let unbuffered = L4BufferSettings::default().write(0);
    let addrs: Vec<String> = std::iter::once(config.server.listen)
        .chain(config.server.tls.as_ref().map(|t| t.listen))
        .map(|a| a.to_string())
        .collect();
    for addr in &addrs {
        proxy.add_listener(ListenerConfig::tcp(addr.clone()).l4_buffer(unbuffered));
    }
    addrs
}

/// The proxy service on its listeners (and their addresses): Pingora's HTTP proxy around
/// `gate`, inside the edge that keeps what Pingora does not have: header, body, send and
/// keep-alive deadlines and the connection cap.
fn proxy_service(
    conf: &Arc<ServerConf>,
    config: &Config,
    gate: SlideGate,
    access_log: Option<AccessLog>,
    tls: &Option<Arc<TlsPort>>,
) -> (ListeningService<EdgeApp<HttpProxy<SlideGate>>>, Vec<String>) {
    // The edge logs the heads Pingora refuses before any hook runs.
    let edge_log = access_log.clone();
    let mut app = pingora::proxy::http_proxy(conf, gate.with_access_log(access_log));
    let s = &config.server;
    // Like nginx's keepalive_requests: recycle a client connection's per-connection memory
    // now and then (Pingora's default is no limit); HTTP/2 connections: `edge::h2_conn`.
    let mut http_options = HttpServerOptions::default();
    // Pingora counts reuses: the first request is none.
    http_options.keepalive_request_limit = Some(s.keepalive_requests - 1);
    http_options.h2c = s.h2c;
    // An HTTP/2 connection lives while it has a stream open; idle, it is closed after
    // keepalive_timeout (with keep-alive off, client_header_timeout: an h2 connection with no
    // stream yet must still be closed).
    let h2_idle = match s.keepalive_timeout {
        t if t.is_zero() => s.client_header_timeout,
        t => t,
    };
    http_options.h2_idle_timeout = Some(h2_idle);
    app.server_options = Some(http_options);
    let limits = ConnLimits {
        client_header_timeout: s.client_header_timeout,
        keepalive_timeout: s.keepalive_timeout,
        client_body_timeout: s.client_body_timeout,
        send_timeout: s.send_timeout,
        max_connections: s.max_connections,
        keepalive_requests: s.keepalive_requests,
        grace_period: s.grace_period,
    };
    let edge = (EdgeApp::new(app, limits).with_tls(tls.clone())).with_access_log(edge_log);
    let mut proxy = ListeningService::new("Pingora HTTP Proxy Service".to_string(), edge);
    let listen = add_listeners(&mut proxy, config);
    (proxy, listen)
}

/// The TLS listener's handshakes, if there is one.
fn tls_port(config: &Config) -> anyhow::Result<Option<Arc<TlsPort>>> {
    let Some(tls) = &config.server.tls else {
        return Ok(None);
    };
    let listener = load_listener(tls).map_err(|e| e.in_config(&config.source))?;
    Ok(Some(TlsPort::new(tls.listen, listener)))
}

/// One startup line per listener, so an operator sees at once what is served where.
fn log_listeners(config: &Config) {
    let s = &config.server;
    let h2c = if s.h2c { " and h2c" } else { "" };
    log::info!("listening on http://{} (HTTP/1.1{h2c})", s.listen);
    if let Some(tls) = &s.tls {
        let min = tls.min_version.as_str();
        log::info!(
            "listening on https://{} (HTTP/2 and HTTP/1.1 by ALPN, TLS {min} and up; default \
             certificate {}, {} more by SNI)",
            tls.listen,
            tls.default_cert.cert.path.display(),
            tls.certs.len()
        );
    }
    log::info!(
        "admin on http://{} (/metrics, /healthz, /readyz)",
        s.admin_listen
    );
    match &config.log.access {
        crate::config::AccessTarget::Off => log::info!("access log off"),
        crate::config::AccessTarget::Stdout => log::info!("access log to stdout"),
        crate::config::AccessTarget::File(p) => log::info!("access log to {}", p.display()),
    }
}

/// With a shared store and no `partition_key_secret_file`, each proxy hashes the RateLimit
/// fields' `pk` under its own secret: say so once, since a client will see another `pk` from
/// each proxy for the one bucket they share.
fn log_partition_keys(config: &Config) {
    if config.store.redis_target().is_some() && config.store.partition_key_secret.is_none() {
        log::info!(
            "RateLimit pk hashed under a secret of this process: set \
             store.partition_key_secret_file for one pk per client across the proxies sharing \
             the store"
        );
    }
}

/// Pingora process settings derived from `[server]`.
fn server_conf(config: &Config) -> ServerConf {
    let s = &config.server;
    ServerConf {
        threads: s.threads,
        // Pingora counts whole seconds; round up so "500ms" still drains.
        grace_period_seconds: Some(ceil_secs(s.grace_period)),
        graceful_shutdown_timeout_seconds: Some(ceil_secs(s.grace_period).max(1)),
        pid_file: s.pid_file.to_string_lossy().into_owned(),
        upgrade_sock: s.upgrade_sock.to_string_lossy().into_owned(),
        ..ServerConf::default()
    }
}

/// Raise the descriptor limit to its hard limit, set the edge's descriptor budget from it
/// (`edge::descriptors`) and log what is in effect: each client connection costs a
/// descriptor, and usually one more upstream.
fn log_nofile(config: &Config) {
    use crate::edge::descriptors::{self, RESERVE};
    let max = u64::from(config.server.max_connections);
    match raise_nofile() {
        Ok(n) => {
            let budget = descriptors::init(n.soft);
            log::info!(
                "descriptor limit {} (was {}, hard {}); max_connections {max}; {RESERVE} kept \
                 for the admin listener, Redis and logs",
                n.soft,
                n.before,
                n.hard
            );
            // A client plus an upstream connection each, and the reserve.
            if max * 2 + RESERVE > n.soft {
                log::warn!(
                    "server.max_connections = {max} needs about {} descriptors (one per client, \
                     one per upstream connection, {RESERVE} kept), but the limit is {}: at most \
                     {} client connections are held (lower max_connections or raise the hard \
                     limit, ulimit -Hn)",
                    max * 2 + RESERVE,
                    n.soft,
                    budget / 2
                );
            }
        }
        Err(e) => log::warn!("cannot raise the descriptor limit: {e}"),
    }
}

/// How to run, from the command line.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Take the listening sockets over from a running instance (Pingora's zero-downtime upgrade).
    pub upgrade: bool,
    /// Reload when the config file changes, not only on SIGHUP.
    pub watch: bool,
}

/// Run slidegate until it is stopped by a signal.
pub fn run(config: Config, options: RunOptions) -> anyhow::Result<()> {
    crate::metrics::init();
    crate::top::init(config.server.top_clients);
    let rules = Rules::build(&config).with_context(|| format!("{}", config.source.display()))?;
    let rules = Arc::new(ArcSwap::from_pointee(rules));
    let memory = (config.store.redis_target().is_none()).then(|| Arc::new(memory_store(&config)));
    let store: Arc<dyn Store> = match &memory {
        Some(m) => m.clone(),
        None => build_store(&config)?,
    };
    let state_file = StateFile::of(&config, memory.as_ref());
    let local = build_local_fallback(&config);
    let tls = tls_port(&config)?;
    let access_log =
        AccessLog::start(&config.log).with_context(|| format!("{}", config.source.display()))?;
    crate::logs::hygiene::init();
    crate::edge::h2_conn::register_metrics();
    crate::admin::throttle::register_metrics();
    crate::limiter::redis::eviction::register_metrics();
    crate::top::fold::register_metrics();

    let opt = Opt {
        upgrade: options.upgrade,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, server_conf(&config));
    server.bootstrap();
    // After the bootstrap: with -u it returns once the old process handed its sockets over,
    // which it does only after writing this file (`persist`'s order of a hand-over).
    if let Some(f) = &state_file {
        f.load(&config);
    }

    log_nofile(&config);
    let reopen = access_log.as_ref().map(AccessLog::reopen_on_sigusr1);
    let gate = SlideGate::new(rules.clone(), store.clone())
        .with_local_fallback(local.clone(), config.store.fallback_buckets)
        .with_send_timeout(config.server.send_timeout)
        .with_body_timeout(config.server.client_body_timeout);
    let (proxy, listen) = proxy_service(&server.configuration, &config, gate, access_log, &tls);
    // The store connects in the background once the proxy runs; until then, and whenever Redis
    // is down, requests get the route's on_error.
    server.add_service(ProxyWithStore {
        proxy,
        store: store.clone(),
        listen,
        pid_file: config.server.pid_file.clone(),
        grace_period: config.server.grace_period,
        state_file: state_file.clone(),
    });

    server.add_service(background_service(
        "store sweeper",
        StoreSweeper {
            stores: std::iter::once(store.clone()).chain(local).collect(),
        },
    ));
    let stopping = Stopping::new();
    let admin = admin_service(
        &config.server,
        store.clone(),
        rules.clone(),
        stopping.clone(),
    );
    server.add_service(ServeUntilExit::new(admin, stopping.clone()));
    let fold = crate::top::fold::FoldService::new(&crate::top::BOARD, store.clone());
    server.add_service(background_service("top limited clients", fold));
    let current = rules.clone();
    let health = HealthService::new(move || current.load().pool_health());
    server.add_service(background_service("upstream health", health));
    if let Some(reopen) = reopen {
        server.add_service(background_service("access log reopen", reopen));
    }
    log_listeners(&config);
    log_partition_keys(&config);
    let pid_file = config.server.pid_file.clone();
    let config_delay = config.server.shutdown_delay;
    server.add_service(background_service(
        "config reload",
        Reloader::new(config, rules, store, options.watch).with_tls(tls),
    ));

    catch_sighup_from_now_on()?;
    log::info!("slidegate starting");
    let handover = state_file.clone();
    let signals = Signals::new(stopping, config_delay, move || {
        if let Some(f) = &handover {
            f.save("before handing the sockets over (SIGQUIT)");
        }
    });
    server.run(RunArgs {
        shutdown_signal: Box::new(signals),
    });
    // The runtimes are down: no decision is made any more (nothing is written after a
    // hand-over: the successor owns the file).
    if let Some(f) = &state_file {
        f.save("at exit");
    }
    // Only after a grace period that ran out, or SIGINT: a drain that finished exits earlier.
    crate::process::pid_file::remove_if_ours(&pid_file);
    Ok(())
}
