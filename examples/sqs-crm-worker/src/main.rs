//! The CRM follow-up agent as an SQS FIFO worker: each `meeting.ended` event creates one follow-up task,
//! once, whatever SQS redelivers. The inbox marker and the task commit in one transaction; the message is
//! deleted only after COMMIT.
//!
//! ```text
//! sqs-crm-worker --queue-url URL [--store sqlite:crm.db | --store postgres://...] [--consumer crm-followup]
//!                [--metrics-addr 127.0.0.1:9464] [--purge-interval-secs 60]
//! ```
//!
//! Configuration comes from the standard AWS chain; `AWS_ENDPOINT_URL_SQS` points it at moto. SIGTERM or
//! Ctrl-C stops receiving, lets in-flight messages finish (commit, then delete) and exits.

use std::time::Duration;

use clap::Parser;
use txinbox::WorkerOptions;
use txinbox_sqs::{SqsOptions, SqsReceiver};

#[derive(Debug, Parser)]
#[command(about = "CRM follow-up worker on SQS FIFO with the txinbox inbox")]
struct Args {
    /// The SQS queue URL.
    #[arg(long, env = "CRM_QUEUE_URL")]
    queue_url: String,
    /// The dead-letter queue URL (default: discovered from the queue's RedrivePolicy).
    #[arg(long, env = "CRM_DLQ_URL")]
    dlq_url: Option<String>,
    /// The store: `sqlite:crm.db` or `postgres://user@host/db`.
    #[arg(long, env = "CRM_STORE", default_value = "sqlite:crm.db")]
    store: String,
    /// The consumer name (part of every inbox key).
    #[arg(long, default_value = "crm-followup")]
    consumer: String,
    /// Messages processed at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Visibility timeout in seconds (the heartbeat renews it every third of it).
    #[arg(long, default_value_t = 60)]
    visibility_timeout: u64,
    /// The external CRM's base URL (e.g. `txinbox-crm-api`'s): each follow-up task is also created there,
    /// through an effect with its idempotency key, run beside the worker.
    #[arg(long, env = "TXINBOX_CRM_URL")]
    crm_url: Option<String>,
    /// Serve Prometheus metrics (`GET /metrics`) on this address, e.g. `127.0.0.1:9464` (default: off).
    #[arg(long, env = "TXINBOX_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Run the maintenance every this many seconds beside the worker: purge expired markers, old evidence and
    /// done effects in bounded batches, and publish `txinbox_inbox_rows` and the maintenance metrics (default:
    /// off, as when `txinbox inbox purge` runs elsewhere).
    #[arg(long, env = "TXINBOX_PURGE_INTERVAL_SECS")]
    purge_interval_secs: Option<u64>,
}

#[tokio::main]
async fn main() -> Result<(), crm_followup::Error> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    if let Some(addr) = args.metrics_addr {
        crm_followup::serve_metrics(addr)?;
    }
    let mut opts =
        SqsOptions::default().visibility_timeout(Duration::from_secs(args.visibility_timeout));
    if let Some(dlq) = &args.dlq_url {
        opts = opts.dead_letter_queue(dlq);
    }
    let client = txinbox_sqs::client_from_env().await;
    let receiver = SqsReceiver::connect(client, &args.queue_url, opts).await?;

    let report = crm_followup::run(
        receiver,
        crm_followup::AgentOptions {
            store: args.store,
            consumer: args.consumer,
            // The lease keeper renews every third of the visibility timeout, which the receiver's leases report.
            worker: WorkerOptions::default().concurrency(args.concurrency),
            retry_backoff: Duration::from_secs(5),
            crm_url: args.crm_url,
            maintenance_every: args.purge_interval_secs.map(Duration::from_secs),
        },
    )
    .await?;
    println!("{report}");
    Ok(())
}
