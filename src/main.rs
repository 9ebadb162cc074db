//! The slidegate binary: parse the command line, load the config, run (or test it, print it,
//! signal the running instance, probe its health).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use slidegate::config::Config;
use slidegate::process::pid_file::Command as Signal;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: slidegate::process::allocator::Allocator = slidegate::process::allocator::Allocator;

/// A reverse proxy with exact, distributed sliding-window rate limiting.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Path to the TOML configuration.
    #[arg(short, long, default_value = "config/slidegate.toml", global = true)]
    config: PathBuf,
    /// Validate the configuration and exit (like `nginx -t`).
    #[arg(short = 't', long = "test")]
    test: bool,
    /// Validate, then print the effective configuration (defaults filled in, secrets
    /// redacted) and exit (like `nginx -T`).
    #[arg(short = 'T', long = "test-print")]
    test_print: bool,
    /// Signal the instance named by the config's pid file (like `nginx -s`): reload (SIGHUP),
    /// stop (SIGTERM), reopen the access log (SIGUSR1).
    #[arg(short = 's', long = "signal", value_enum)]
    signal: Option<Signal>,
    /// Take over the listening sockets of a running instance (zero-downtime upgrade; then send
    /// SIGQUIT to the old process).
    #[arg(short, long)]
    upgrade: bool,
    /// Reload the configuration when the file changes (SIGHUP always reloads).
    #[arg(short, long)]
    watch: bool,
    #[command(subcommand)]
    command: Option<Tool>,
}

#[derive(Subcommand, Debug)]
enum Tool {
    /// GET /healthz on the config's admin listener over loopback: exit 0 on 200, else 1 (for
    /// container health checks; the image has no curl).
    Healthcheck {
        /// Give up after this long (connect, send and read each).
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
}

/// What `-t` checks beyond loading: every upstream server resolves (the one check that needs
/// DNS, as `nginx -t` does) and the TLS listener's certificates and keys load.
fn test_config(config: &Config) -> Result<(), String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", config.source.display());
    slidegate::routes::Rules::build(config).map_err(|e| at(&e))?;
    if let Some(tls) = &config.server.tls {
        slidegate::tls::load_listener(tls).map_err(|e| e.in_config(&config.source).to_string())?;
    }
    warn_if_redis_may_evict(config);
    Ok(())
}

/// `-t` with a Redis store: warn (never fail) when Redis may evict limit keys, or when its
/// `maxmemory-policy` cannot be read (see `limiter/redis/eviction.rs`). The nodes the config
/// names are asked; behind Sentinel the master is not (`-t` asks no Sentinel which one it is:
/// the proxy reads the policy when it connects).
fn warn_if_redis_may_evict(config: &Config) {
    let Some(target) = config.store.redis_target() else {
        return;
    };
    if matches!(
        target.nodes,
        slidegate::limiter::redis::RedisNodes::Sentinel(_)
    ) {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let Ok(rt) = rt else {
        return;
    };
    let verdict = rt.block_on(slidegate::limiter::redis::eviction::read_policy(&target));
    if let Some(warning) = verdict.warning() {
        eprintln!("slidegate: warning: {}: {warning}", config.source.display());
    }
}

/// Everything but running the proxy; `None` to run it.
fn one_shot(cli: &Cli, config: &Config) -> Option<Result<(), String>> {
    if let Some(Tool::Healthcheck { timeout }) = cli.command {
        let addr = slidegate::process::healthcheck::probe_addr(config.server.admin_listen);
        return Some(slidegate::process::healthcheck::probe(addr, timeout));
    }
    if let Some(signal) = cli.signal {
        let sent = slidegate::process::pid_file::send(&config.server.pid_file, signal);
        return Some(sent.map(|_| ()).map_err(|e| e.to_string()));
    }
    if cli.test_print {
        return Some(test_config(config).and_then(|()| {
            let text = config.effective_toml().map_err(|e| e.to_string())?;
            print!("{text}");
            Ok(())
        }));
    }
    if cli.test {
        return Some(test_config(config).map(|()| {
            println!("slidegate: configuration {} is valid", cli.config.display());
        }));
    }
    None
}

fn main() -> ExitCode {
    slidegate::logs::limit::init();
    let cli = Cli::parse();
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("slidegate: {e}");
            return ExitCode::from(1);
        }
    };
    match one_shot(&cli, &config) {
        Some(Ok(())) => return ExitCode::SUCCESS,
        Some(Err(e)) => {
            eprintln!("slidegate: {e}");
            return ExitCode::from(1);
        }
        None => {}
    }
    let off = slidegate::proxy::bench_switch::describe();
    if !off.is_empty() {
        log::warn!("benchmark build: layers switched off: {}", off.join(", "));
    }
    let options = slidegate::process::server::RunOptions {
        upgrade: cli.upgrade,
        watch: cli.watch,
    };
    match slidegate::process::server::run(config, options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("slidegate: {e:#}");
            ExitCode::from(1)
        }
    }
}
