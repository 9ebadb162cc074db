//! The slidegate binary: parse the command line, load the config, run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use slidegate::config::Config;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A reverse proxy with exact, distributed sliding-window rate limiting.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Path to the TOML configuration.
    #[arg(short, long, default_value = "config/slidegate.toml")]
    config: PathBuf,
    /// Validate the configuration and exit (like `nginx -t`).
    #[arg(short = 't', long = "test")]
    test: bool,
    /// Take over the listening sockets of a running instance (zero-downtime upgrade; then send
    /// SIGQUIT to the old process).
    #[arg(short, long)]
    upgrade: bool,
    /// Reload the configuration when the file changes (SIGHUP always reloads).
    #[arg(short, long)]
    watch: bool,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("slidegate: {e}");
            return ExitCode::from(1);
        }
    };
    if cli.test {
        // Like `nginx -t`, also resolve every upstream server (the one check that needs DNS).
        if let Err(e) = slidegate::routes::Rules::build(&config) {
            eprintln!("slidegate: {}: {e}", cli.config.display());
            return ExitCode::from(1);
        }
        if let Some(tls) = &config.server.tls {
            if let Err(e) = slidegate::tls::load_certified_key(tls) {
                eprintln!("slidegate: {}: {e}", cli.config.display());
                return ExitCode::from(1);
            }
        }
        println!("slidegate: configuration {} is valid", cli.config.display());
        return ExitCode::SUCCESS;
    }
    let options = slidegate::server::RunOptions {
        upgrade: cli.upgrade,
        watch: cli.watch,
    };
    match slidegate::server::run(config, options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("slidegate: {e:#}");
            ExitCode::from(1)
        }
    }
}
