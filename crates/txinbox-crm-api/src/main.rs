//! `txinbox-crm-api`: runs the local CRM API until SIGTERM or Ctrl-C.
//!
//! Prints exactly one line on stdout once it listens,
//! `export TXINBOX_CRM_URL=http://127.0.0.1:PORT` (a script can read it and `eval` it); logs go to
//! stderr (`RUST_LOG`, default `info`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use std::time::Duration;

use clap::Parser;
use txinbox_crm_api::{CrmApi, FaultRates, KeyMode};

/// A local stand-in for an external CRM HTTP API: idempotency keys, searchable references and
/// injected faults for the failure windows of external effects.
#[derive(Debug, Parser)]
#[command(name = "txinbox-crm-api", version, about)]
struct Cli {
    /// Loopback address to listen on; port 0 picks a free port (see the export line).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,

    /// Ignore `Idempotency-Key`: every create creates a task (the same as `--key none`).
    #[arg(long, conflicts_with = "key")]
    no_idempotency: bool,
    /// Where creates carry their idempotency key: `header:NAME` (default
    /// `header:Idempotency-Key`), `body:FIELD` or `none`.
    #[arg(long, value_name = "MODE")]
    key: Option<KeyMode>,
    /// Milliseconds each create waits after performing and before answering.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Milliseconds each create takes before the task exists (its key answers 409 meanwhile).
    #[arg(long, default_value_t = 0)]
    processing_ms: u64,
    /// Milliseconds before a created task appears in the listings and searches.
    #[arg(long, default_value_t = 0)]
    search_lag_ms: u64,
    /// Random faults per create request, e.g. `drop_answer=0.1,gateway_502=0.05` (also
    /// `gateway_504`, `unavailable`, `rate_limited`).
    #[arg(long, value_name = "RATES")]
    random_faults: Option<FaultRates>,
    /// The seed of the random faults.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The `Retry-After` of the 429/503 faults, in seconds.
    #[arg(long, default_value_t = 1)]
    retry_after_secs: u64,
    /// Send `Retry-After` as an HTTP-date (now + `--retry-after-secs`) instead of seconds.
    #[arg(long)]
    retry_after_date: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("txinbox-crm-api: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let key_mode = match cli.key {
        Some(mode) => mode,
        None if cli.no_idempotency => KeyMode::None,
        None => KeyMode::default(),
    };
    let api = CrmApi::builder()
        .key_mode(key_mode)
        .latency(Duration::from_millis(cli.latency_ms))
        .processing(Duration::from_millis(cli.processing_ms))
        .search_lag(Duration::from_millis(cli.search_lag_ms))
        .random_faults(cli.random_faults.unwrap_or_default(), cli.seed)
        .retry_after(cli.retry_after_secs, cli.retry_after_date)
        .listen(cli.listen)
        .start()
        .await
        .map_err(|e| e.to_string())?;
    // Listening before the URL is printed: a SIGTERM sent as soon as it is read stops the server cleanly.
    let shutdown = txinbox_core::shutdown_signal();
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "export TXINBOX_CRM_URL={}", api.url()).map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    drop(stdout);
    shutdown.await;
    tracing::info!("shutting down");
    api.shutdown().await;
    Ok(())
}
