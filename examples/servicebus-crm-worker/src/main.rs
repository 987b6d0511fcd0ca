//! The CRM follow-up agent as an Azure Service Bus worker: each `meeting.ended` event creates one follow-up
//! task, once, whatever Service Bus redelivers. The inbox marker and the task commit in one transaction; the
//! message is completed only after COMMIT; its lock is renewed while the handler runs.
//!
//! ```text
//! servicebus-crm-worker [--queue crm-events] [--dead-letter-to crm-events-poison]
//!                       [--store sqlite:crm.db | --store postgres://...] [--consumer crm-followup]
//!                       [--metrics-addr 127.0.0.1:9464] [--purge-interval-secs 60]
//! ```
//!
//! Connection (never printed): `SERVICEBUS_CONNECTION_STRING` (SAS), or `SERVICEBUS_NAMESPACE` for Azure AD
//! (managed identity, workload identity, `az login`); `SERVICEBUS_ENDPOINT` points it at the emulator.
//! SIGTERM or Ctrl-C stops receiving, lets in-flight messages finish (commit, then complete) and exits.

use std::time::Duration;

use clap::Parser;
use txinbox::WorkerOptions;
use txinbox_servicebus::{ServiceBusConfig, ServiceBusOptions, ServiceBusReceiver};

#[derive(Debug, Parser)]
#[command(about = "CRM follow-up worker on Azure Service Bus with the txinbox inbox")]
struct Args {
    /// The queue path.
    #[arg(long, env = "CRM_SB_QUEUE", default_value = "crm-events")]
    queue: String,
    /// Forward payload collisions and permanent errors to this queue (else: abandon until MaxDeliveryCount,
    /// and the broker moves the message to `{queue}/$DeadLetterQueue`).
    #[arg(long, env = "CRM_SB_DEAD_LETTER_TO")]
    dead_letter_to: Option<String>,
    /// The store: `sqlite:crm.db` or `postgres://user@host/db`.
    #[arg(long, env = "CRM_STORE", default_value = "sqlite:crm.db")]
    store: String,
    /// The consumer name (part of every inbox key).
    #[arg(long, default_value = "crm-followup")]
    consumer: String,
    /// Messages processed at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The queue's LockDuration in seconds (the lock is renewed every third of it).
    #[arg(long, default_value_t = 60)]
    lock_duration_secs: u64,
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
    let client = ServiceBusConfig::from_env()?.connect()?;
    let mut opts = ServiceBusOptions::default()
        .lock_duration(Duration::from_secs(args.lock_duration_secs.max(1)));
    if let Some(dlq) = &args.dead_letter_to {
        opts = opts.dead_letter_to(dlq);
    }
    let receiver = ServiceBusReceiver::new(&client, &args.queue, opts)?;
    tracing::info!(namespace = client.namespace(), queue = %args.queue, "worker starting");
    let report = crm_followup::run(
        receiver,
        crm_followup::AgentOptions {
            store: args.store,
            consumer: args.consumer,
            // The lease keeper renews every third of the lock duration, which the receiver's leases report.
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
