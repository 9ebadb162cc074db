//! The floor slidegate is measured against: the smallest Pingora reverse proxy with the same
//! upstream and keepalive settings as slidegate's own (one `upstream_peer`, nothing else).
//!
//! `scripts/bench` runs it as case M, so the gap between slidegate's no-limit route (case C)
//! and Pingora itself is measured in the same run, on the same upstream.
//!
//! ```text
//! cargo run --release --example minimal_proxy -- 127.0.0.1:8081 127.0.0.1:9000
//! ```

use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::HttpServerOptions;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Proxies every request to one upstream address.
struct Minimal {
    upstream: std::net::SocketAddr,
}

#[async_trait]
impl ProxyHttp for Minimal {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        // The same peer options slidegate sets by default (src/proxy.rs, [upstreams.*] timeouts).
        let mut peer = HttpPeer::new(self.upstream, false, String::new());
        peer.options.connection_timeout = Some(Duration::from_secs(5));
        peer.options.total_connection_timeout = Some(Duration::from_secs(10));
        peer.options.read_timeout = Some(Duration::from_secs(60));
        peer.options.write_timeout = Some(Duration::from_secs(60));
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        Ok(Box::new(peer))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: minimal_proxy LISTEN_ADDR UPSTREAM_ADDR");
        std::process::exit(2);
    };
    let upstream = upstream.parse().expect("UPSTREAM_ADDR must be ip:port");
    let tag = listen.replace([':', '.'], "-");
    let conf = ServerConf {
        threads: 1,
        pid_file: format!("/tmp/minimal-proxy-{tag}.pid"),
        upgrade_sock: format!("/tmp/minimal-proxy-{tag}.sock"),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, Minimal { upstream });
    if let Some(app) = proxy.app_logic_mut() {
        // slidegate's keepalive_requests (src/process/server.rs).
        let mut options = HttpServerOptions::default();
        options.keepalive_request_limit = Some(1000);
        app.server_options = Some(options);
    }
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever();
}
