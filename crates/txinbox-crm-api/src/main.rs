//! `txinbox-crm-api`: runs the local CRM API until SIGTERM or Ctrl-C.
//!
//! Prints exactly one line on stdout once it listens,
//! `export TXINBOX_CRM_URL=http://127.0.0.1:PORT` (a script can read it and `eval` it); logs go to
//! stderr (`RUST_LOG`, default `info`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use txinbox_crm_api::CrmApi;

/// A local stand-in for an external CRM HTTP API: idempotency keys, searchable references and
/// injected faults for the failure windows of external effects.
#[derive(Debug, Parser)]
#[command(name = "txinbox-crm-api", version, about)]
struct Cli {
    /// Loopback address to listen on; port 0 picks a free port (see the export line).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,

    /// Ignore `Idempotency-Key`: every POST /tasks creates a task.
    #[arg(long)]
    no_idempotency: bool,
    /// Milliseconds each POST /tasks waits after performing and before answering.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
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
    let api = CrmApi::builder()
        .idempotency(!cli.no_idempotency)
        .latency(std::time::Duration::from_millis(cli.latency_ms))
        .listen(cli.listen)
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "export TXINBOX_CRM_URL={}", api.url()).map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    drop(stdout);
    shutdown_signal().await?;
    tracing::info!("shutting down");
    api.shutdown().await;
    Ok(())
}

/// Waits for Ctrl-C or (on Unix) SIGTERM.
async fn shutdown_signal() -> Result<(), String> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| format!("cannot listen for SIGTERM: {e}"))?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => {
                result.map_err(|e| format!("cannot listen for Ctrl-C: {e}"))
            }
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c()
            .await
            .map_err(|e| format!("cannot listen for Ctrl-C: {e}"))
    }
}
