//! `txinbox-sb-emulator`: runs the Service Bus REST emulator until interrupted.
//!
//! Prints `listening on http://ADDR` on stdout once it accepts connections; logs go to stderr
//! (`RUST_LOG`, default `info`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use txinbox_sb_emulator::{Emulator, LocationStyle, QueueProperties};

/// A local emulator of the Azure Service Bus REST data plane. Its `Debug` shows neither the key nor the tokens.
#[derive(Parser)]
#[command(name = "txinbox-sb-emulator", version, about)]
struct Cli {
    /// Address to listen on; port 0 picks a free port (see the `listening on` line).
    #[arg(
        long,
        env = "TXINBOX_SB_EMULATOR_LISTEN",
        default_value = "127.0.0.1:0"
    )]
    listen: SocketAddr,

    /// Namespace name: tokens may be signed for https://{NAME}.servicebus.windows.net/...
    #[arg(
        long,
        env = "TXINBOX_SB_EMULATOR_NAMESPACE",
        default_value = "emulator"
    )]
    namespace: String,

    /// Name of the shared access rule (e.g. RootManageSharedAccessKey); needs --sas-key.
    #[arg(long, env = "TXINBOX_SB_EMULATOR_SAS_KEY_NAME", requires = "sas_key")]
    sas_key_name: Option<String>,

    /// The rule's key. With no key and no bearer token, every request is accepted.
    #[arg(
        long,
        env = "TXINBOX_SB_EMULATOR_SAS_KEY",
        requires = "sas_key_name",
        hide_env_values = true
    )]
    sas_key: Option<String>,

    /// A bearer token to accept (repeatable; the variable takes a comma-separated list).
    #[arg(
        long,
        env = "TXINBOX_SB_EMULATOR_ACCEPT_BEARER",
        value_delimiter = ',',
        hide_env_values = true
    )]
    accept_bearer: Vec<String>,

    /// A queue to create at start-up (repeatable): `NAME` or `NAME={"lockDuration":"PT1.5S",...}`.
    #[arg(
        long = "queue",
        env = "TXINBOX_SB_EMULATOR_QUEUES",
        value_delimiter = ';'
    )]
    queues: Vec<String>,

    /// Host named by the peek-lock Location header: `namespace` (like the service) or `request`
    /// (the Host the request came to).
    #[arg(long, env = "TXINBOX_SB_EMULATOR_LOCATION", default_value = "namespace", value_parser = ["namespace", "request"])]
    location: String,

    /// Seconds a receive without `?timeout=` waits.
    #[arg(
        long,
        env = "TXINBOX_SB_EMULATOR_DEFAULT_RECEIVE_TIMEOUT",
        default_value_t = 60.0
    )]
    default_receive_timeout_secs: f64,

    /// Cap on `?timeout=` in seconds.
    #[arg(
        long,
        env = "TXINBOX_SB_EMULATOR_MAX_RECEIVE_TIMEOUT",
        default_value_t = 60.0
    )]
    max_receive_timeout_secs: f64,
}

impl std::fmt::Debug for Cli {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cli")
            .field("listen", &self.listen)
            .field("namespace", &self.namespace)
            .field("sas_key_name", &self.sas_key_name)
            .field("sas_key", &self.sas_key.as_ref().map(|_| "***"))
            .field(
                "accept_bearer",
                &format!("{} token(s)", self.accept_bearer.len()),
            )
            .field("queues", &self.queues)
            .field("location", &self.location)
            .field(
                "default_receive_timeout_secs",
                &self.default_receive_timeout_secs,
            )
            .field("max_receive_timeout_secs", &self.max_receive_timeout_secs)
            .finish()
    }
}

fn seconds(value: f64, flag: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| format!("{flag}: {value} is not a number of seconds"))
}

fn queue_spec(spec: &str) -> Result<(String, QueueProperties), String> {
    let (name, json) = match spec.split_once('=') {
        Some((name, json)) => (name.trim(), Some(json)),
        None => (spec.trim(), None),
    };
    let props = match json {
        Some(json) => txinbox_sb_emulator::QueueProperties::from_json(json)
            .map_err(|e| format!("--queue {name}: {e}"))?,
        None => QueueProperties::default(),
    };
    Ok((name.to_string(), props))
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
            eprintln!("txinbox-sb-emulator: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let mut builder = Emulator::builder()
        .namespace(cli.namespace)
        .default_receive_timeout(seconds(
            cli.default_receive_timeout_secs,
            "--default-receive-timeout-secs",
        )?)
        .max_receive_timeout(seconds(
            cli.max_receive_timeout_secs,
            "--max-receive-timeout-secs",
        )?)
        .location_style(if cli.location == "request" {
            LocationStyle::RequestHost
        } else {
            LocationStyle::Namespace
        });
    if let (Some(name), Some(key)) = (cli.sas_key_name, cli.sas_key) {
        builder = builder.sas_key(name, key);
    }
    for token in cli.accept_bearer.into_iter().filter(|t| !t.is_empty()) {
        builder = builder.accept_bearer(token);
    }
    for spec in cli.queues.iter().filter(|s| !s.trim().is_empty()) {
        let (name, props) = queue_spec(spec)?;
        builder = builder.queue(name, props);
    }
    let handle = builder.start(cli.listen).await.map_err(|e| e.to_string())?;
    // Listening before the address is printed: a SIGTERM sent as soon as it is read stops the emulator cleanly.
    let shutdown = txinbox_core::shutdown_signal();
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {}", handle.base_url()).map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    drop(stdout);
    shutdown.await;
    tracing::info!("shutting down");
    handle.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    #[test]
    fn debug_of_the_flags_masks_the_key_and_the_tokens() {
        let cli = super::Cli::try_parse_from([
            "txinbox-sb-emulator",
            "--sas-key-name",
            "Root",
            "--sas-key",
            "s3cretkey",
            "--accept-bearer",
            "s3cretbearer",
        ])
        .unwrap();
        let shown = format!("{cli:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("Root"), "{shown}");
    }
}
