//! `strata-server`: parse the configuration, start one node, run until
//! SIGINT/SIGTERM. Everything else lives in the library.

use clap::Parser;
use strata_server::config::{self, Cli};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let cfg = match config::load(&cli) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("strata-server: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if cli.print_config {
        match serde_json::to_string_pretty(&cfg) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("strata-server: {e}"),
        }
        return std::process::ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(log_filter(
            &cfg.log_level,
        )))
        .with_writer(std::io::stderr)
        .init();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if cfg.worker_threads > 0 {
        runtime.worker_threads(cfg.worker_threads as usize);
    }
    let runtime = match runtime.enable_all().thread_name("strata").build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("strata-server: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(strata_server::run(cfg)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("strata-server: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// foyer logs every recovery step at INFO; its warnings and errors are
/// what an operator needs, unless the filter names foyer itself.
fn log_filter(level: &str) -> String {
    if level.contains("foyer") {
        level.to_string()
    } else {
        format!("{level},foyer_storage=warn,foyer_memory=warn,foyer=warn")
    }
}
