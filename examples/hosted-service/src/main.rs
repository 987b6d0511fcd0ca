//! The inbox worker hosted inside a web service: an axum application with its own routes runs the CRM
//! follow-up worker (SQS FIFO, PostgreSQL) beside them, on **one** database pool and with **one** shutdown.
//!
//! ```text
//! hosted-service --config service.toml [--listen 0.0.0.0:8080] [--handler-delay-ms 0]
//! ```
//!
//! Routes: `GET /tasks` (the application's own: the follow-up tasks the worker created, read through the shared
//! pool), `GET /livez` and `GET /readyz` (the worker's health, answered by the application's router instead of
//! a second server). The settings file is the one `txinbox check-infra --config` checks (`[worker]`,
//! `[store]`, `[inbox]`, `[sqs]`), with `TXINBOX_<SECTION>__<KEY>` overrides.
//!
//! SIGTERM or Ctrl-C, in this order: the worker stops receiving, lets its in-flight messages finish (commit,
//! then delete; past `[worker] shutdown_timeout_seconds` what has not committed rolls back and is released);
//! meanwhile `/readyz` answers 503 so a load balancer stops sending; then the HTTP server stops accepting and
//! finishes its open requests; then the pool closes. The process exits 0 and prints the worker's report.

use std::path::PathBuf;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use clap::Parser;
use txinbox::health::Health;
use txinbox::settings::WorkerSettings;
use txinbox::sqlx;
use txinbox::sqs::{SqsOptions, SqsReceiver};
use txinbox::{CancellationToken, ConsumerName, IdentityPolicy, Inbox, PgStore, Worker};

#[derive(Debug, Parser)]
#[command(about = "A web service hosting the txinbox CRM follow-up worker (SQS FIFO, PostgreSQL)")]
struct Args {
    /// The settings file (the one `txinbox check-infra --config` reads).
    #[arg(long)]
    config: PathBuf,
    /// Where the application's HTTP server listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// Sleep this long in every handler (to show a shutdown in the middle of a batch).
    #[arg(long, default_value_t = 0)]
    handler_delay_ms: u64,
}

/// What the routes share with the worker.
#[derive(Clone)]
struct AppState {
    store: PgStore,
    health: Health,
}

#[derive(serde::Serialize)]
struct Task {
    task_id: String,
    message_id: String,
}

/// The application's own route: the tasks, through the pool the inbox uses.
async fn tasks(State(app): State<AppState>) -> Result<Json<Vec<Task>>, (StatusCode, String)> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT task_id, message_id FROM crm_followup_tasks ORDER BY task_id")
            .fetch_all(app.store.pool())
            .await
            .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(Json(
        rows.into_iter()
            .map(|(task_id, message_id)| Task {
                task_id,
                message_id,
            })
            .collect(),
    ))
}

async fn livez(State(app): State<AppState>) -> (StatusCode, String) {
    answer(app.health.liveness())
}

async fn readyz(State(app): State<AppState>) -> (StatusCode, String) {
    answer(app.health.readiness().await)
}

fn answer(s: txinbox::health::HealthStatus) -> (StatusCode, String) {
    let code = if s.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, s.to_string())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    crm_followup::init_logging();
    crm_followup::exit("hosted-service", run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), crm_followup::Error> {
    let settings = WorkerSettings::load(&args.config)?;
    let queue_url = settings
        .sqs
        .queue_url
        .clone()
        .ok_or("no queue: set [sqs] queue_url or TXINBOX_SQS__QUEUE_URL")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;

    // One pool for the application and the inbox.
    let store = PgStore::connect(&settings.store.url, settings.store.max_connections).await?;
    crm_followup::create_tables_pg(&store).await?;
    let receiver = SqsReceiver::connect(
        txinbox::sqs::client_from_env().await,
        &queue_url,
        SqsOptions::from_settings(&settings.sqs),
    )
    .await?;
    let delay = Duration::from_millis(args.handler_delay_ms);
    let processor = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new(&settings.worker.consumer)?),
    )
    .retention(settings.retention())
    .bind(move |tx, msg| async move {
        tokio::time::sleep(delay).await;
        crm_followup::create_task(tx, msg, false).await
    })
    .business_key(crm_followup::business_key);
    let health = Health::new().check("database", store.clone());

    // One shutdown: the signal stops the worker; the server closes only once the worker has drained.
    let stop = CancellationToken::new();
    let drained = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            txinbox::shutdown_signal().await;
            tracing::info!(
                "shutdown: the worker stops receiving and drains; the server closes after it"
            );
            stop.cancel();
        }
    });
    let worker = tokio::spawn({
        let worker = Worker::new(receiver, processor)
            .options(settings.worker_options())
            .health(health.clone());
        let (stop, drained) = (stop.clone(), drained.clone());
        async move {
            let report = worker.run_until(stop.cancelled_owned()).await;
            drained.cancel();
            report
        }
    });

    let app = Router::new()
        .route("/tasks", get(tasks))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            store: store.clone(),
            health,
        });
    tracing::info!(addr = %args.listen, "serving /tasks, /livez, /readyz");
    axum::serve(listener, app)
        .with_graceful_shutdown(drained.cancelled_owned())
        .await?;
    let report = worker.await?;
    tracing::info!("server closed; closing the pool");
    store.close().await;
    println!("{report}");
    Ok(())
}
