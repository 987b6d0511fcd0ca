//! `txinbox effects`: run the effects of a store (for operators, or as a process of its own beside the
//! workers) and count them by state.

use std::time::Duration;

use txinbox_core::effects::EffectStore;
use txinbox_core::http::HttpEffect;
use txinbox_core::{EffectOptions, EffectRunner};
use txinbox_store::{Backend, Store};

/// Arguments of `txinbox effects run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Store URL (`sqlite:path.db` or `postgres://...`).
    #[arg(long, env = "TXINBOX_STORE_URL")]
    pub store: String,
    /// An HTTP destination: `NAME=URL` (effects of destination NAME are POSTed to URL with their
    /// Idempotency-Key). Repeat for several.
    #[arg(long = "http", value_parser = parse_pair, required = true)]
    pub http: Vec<(String, String)>,
    /// The confirmation request of a destination: `NAME=URL` with `{key}` or `{external_ref}` in it.
    #[arg(long = "confirm", value_parser = parse_pair)]
    pub confirm: Vec<(String, String)>,
    /// Destinations that ignore the Idempotency-Key header (sent anyway; only the confirmation protects them).
    #[arg(long = "no-idempotency")]
    pub no_idempotency: Vec<String>,
    /// Run until nothing is due, then exit (else until SIGTERM / Ctrl-C).
    #[arg(long)]
    pub once: bool,
    /// Effects claimed per pass.
    #[arg(long, default_value_t = 32)]
    pub batch: i64,
    /// Seconds a claim lasts before another runner may reconcile the effect.
    #[arg(long, default_value_t = 60)]
    pub claim_secs: u64,
    /// Seconds each HTTP request may take before the call is uncertain.
    #[arg(long, default_value_t = 10)]
    pub timeout_secs: u64,
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

/// Runs the effects of `store` through the HTTP destinations of `args`; prints the report.
pub async fn run<DB: Backend>(store: Store<DB>, args: &RunArgs) -> Result<(), String> {
    let mut runner = EffectRunner::new(store.clone()).options(
        EffectOptions::default()
            .batch(args.batch)
            .claim_for(Duration::from_secs(args.claim_secs.max(1))),
    );
    for (name, url) in &args.http {
        let mut http = HttpEffect::post(url).timeout(Duration::from_secs(args.timeout_secs.max(1)));
        if let Some((_, c)) = args.confirm.iter().find(|(n, _)| n == name) {
            http = http.confirm_url(c);
        }
        if args.no_idempotency.contains(name) {
            tracing::warn!(destination = %name, "destination without idempotency support: only the confirmation request prevents a repeat");
        }
        runner = runner.executor(name.clone(), http);
    }
    for (name, _) in &args.confirm {
        if !args.http.iter().any(|(n, _)| n == name) {
            return Err(format!("--confirm names {name:?}, which no --http defines"));
        }
    }
    tracing::info!(holder = runner.holder(), "effect runner started");
    let report = if args.once {
        runner.run_until_idle().await
    } else {
        runner.run_until(txinbox_core::shutdown_signal()).await
    };
    println!("{report}");
    Ok(())
}

/// Arguments of `txinbox effects compensate`.
#[derive(Debug, clap::Args)]
pub struct CompensateArgs {
    /// Store URL (`sqlite:path.db` or `postgres://...`).
    #[arg(long, env = "TXINBOX_STORE_URL")]
    pub store: String,
    /// The idempotency key of the done effect to undo.
    #[arg(long)]
    pub key: String,
    /// The compensation request of a destination: `NAME=URL` with `{reference}`, `{key}` or `{external_ref}`
    /// in it (a DELETE).
    #[arg(long = "compensate", value_parser = parse_pair, required = true)]
    pub compensate: Vec<(String, String)>,
}

/// Undoes one done effect through its destination and marks it compensated.
pub async fn compensate<DB: Backend>(
    store: Store<DB>,
    args: &CompensateArgs,
) -> Result<(), String> {
    let mut runner = EffectRunner::new(store);
    for (name, url) in &args.compensate {
        // The POST URL is not used by a compensation.
        runner = runner.executor(name.clone(), HttpEffect::post(url).compensate_url(url));
    }
    let state = runner
        .compensate(&args.key)
        .await
        .map_err(|e| e.to_string())?;
    println!("effect {} {state}", args.key);
    Ok(())
}

/// Prints the effects of `store` by consumer, destination and state.
pub async fn stats<DB: Backend>(store: Store<DB>) -> Result<(), String> {
    let counts = store.effect_counts().await.map_err(|e| e.to_string())?;
    println!(
        "{:<24} {:<20} {:<16} {:>8}  oldest",
        "consumer", "destination", "state", "effects"
    );
    let mut counts = counts;
    counts.sort_by(|a, b| {
        (&a.consumer, &a.destination, a.state).cmp(&(&b.consumer, &b.destination, b.state))
    });
    for c in counts {
        println!(
            "{:<24} {:<20} {:<16} {:>8}  {}",
            c.consumer,
            c.destination,
            c.state,
            c.count,
            c.oldest.map(|t| t.to_rfc3339()).unwrap_or_default()
        );
    }
    Ok(())
}
