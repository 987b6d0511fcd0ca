//! The CRM follow-up agent as an SQS FIFO worker: each `meeting.ended` event creates one follow-up task,
//! once, whatever SQS redelivers. The inbox marker and the task commit in one transaction; the message is
//! deleted only after COMMIT.
//!
//! ```text
//! sqs-crm-worker --queue-url URL [--store sqlite:crm.db | --store postgres://...] [--consumer crm-followup]
//! ```
//!
//! Configuration comes from the standard AWS chain; `AWS_ENDPOINT_URL_SQS` points it at moto. SIGTERM or
//! Ctrl-C stops receiving, lets in-flight messages finish (commit, then delete) and exits.

use std::time::Duration;

use clap::Parser;
use txinbox::{ConsumerName, IdentityPolicy, Worker};
use txinbox_sqs::{SqsOptions, SqsReceiver};
use txinbox_store::{db_error, handler_fn, Handled, Inbox, Store};

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
}

const TASKS_PG: &str = "CREATE TABLE IF NOT EXISTS crm_followup_tasks (task_id TEXT PRIMARY KEY, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, message_id TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())";
const TASKS_SQLITE: &str = "CREATE TABLE IF NOT EXISTS crm_followup_tasks (task_id TEXT PRIMARY KEY, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, message_id TEXT NOT NULL, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)";

/// The identity policy of the agent: CloudEvents / dedup id as message id, and the business key
/// `criar_tarefa_followup:<opportunity>:<meeting>` so two different events asking for the same follow-up
/// create one task.
fn policy(consumer: &str) -> Result<IdentityPolicy, Box<dyn std::error::Error>> {
    Ok(
        IdentityPolicy::new(ConsumerName::new(consumer)?).business_key(|m| {
            let v: serde_json::Value =
                serde_json::from_slice(&m.body).map_err(|e| e.to_string())?;
            Ok(Some(format!(
                "criar_tarefa_followup:{}:{}",
                v["opportunity"].as_str().ok_or("no opportunity")?,
                v["meeting"].as_str().ok_or("no meeting")?
            )))
        }),
    )
}

fn fields(json: Option<&serde_json::Value>) -> Result<(String, String), txinbox::HandlerError> {
    let v = json.ok_or_else(|| txinbox::HandlerError::permanent("body is not JSON"))?;
    let get = |k: &str| {
        v[k].as_str()
            .map(str::to_owned)
            .ok_or_else(|| txinbox::HandlerError::permanent(format!("missing {k}")))
    };
    Ok((get("opportunity")?, get("meeting")?))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let mut opts = SqsOptions::default()
        .concurrency(args.concurrency)
        .visibility_timeout(Duration::from_secs(args.visibility_timeout))
        .heartbeat_interval(Duration::from_secs((args.visibility_timeout / 3).max(1)));
    if let Some(dlq) = &args.dlq_url {
        opts = opts.dead_letter_queue(dlq);
    }
    let rules = txinbox_store::InputRules::default().body(txinbox_store::BodyFormat::Json);
    let client = txinbox_sqs::client_from_env().await;
    let receiver = SqsReceiver::connect(client, &args.queue_url, opts.clone()).await?;
    let worker_opts = receiver.worker_options();

    let report = if args.store.starts_with("postgres") {
        let store =
            Store::<sqlx::Postgres>::connect(&args.store, args.concurrency as u32 + 2).await?;
        sqlx::query(TASKS_PG).execute(store.pool()).await?;
        let inbox = Inbox::new(store.pool().clone(), policy(&args.consumer)?)
            .input_rules(rules)
            .retry_backoff(opts.retry_backoff);
        let handler = handler_fn::<sqlx::Postgres, _>(|tx, msg| {
            Box::pin(async move {
                let (opportunity, meeting) = fields(msg.json)?;
                let task_id = format!("followup-{opportunity}-{meeting}");
                sqlx::query("INSERT INTO crm_followup_tasks (task_id, opportunity, meeting, message_id) VALUES ($1, $2, $3, $4)")
                    .bind(&task_id)
                    .bind(&opportunity)
                    .bind(&meeting)
                    .bind(&msg.identity.message_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                Ok(Handled::reference(task_id))
            })
        });
        let r = Worker::new(receiver, inbox.bind(handler))
            .options(worker_opts)
            .run_until(txinbox::shutdown_signal())
            .await;
        store.close().await;
        r
    } else {
        let store = Store::<sqlx::Sqlite>::connect(&args.store).await?;
        sqlx::query(TASKS_SQLITE).execute(store.pool()).await?;
        let inbox = Inbox::new(store.pool().clone(), policy(&args.consumer)?)
            .input_rules(rules)
            .retry_backoff(opts.retry_backoff);
        let handler = handler_fn::<sqlx::Sqlite, _>(|tx, msg| {
            Box::pin(async move {
                let (opportunity, meeting) = fields(msg.json)?;
                let task_id = format!("followup-{opportunity}-{meeting}");
                sqlx::query("INSERT INTO crm_followup_tasks (task_id, opportunity, meeting, message_id) VALUES (?1, ?2, ?3, ?4)")
                    .bind(&task_id)
                    .bind(&opportunity)
                    .bind(&meeting)
                    .bind(&msg.identity.message_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                Ok(Handled::reference(task_id))
            })
        });
        let r = Worker::new(receiver, inbox.bind(handler))
            .options(worker_opts)
            .run_until(txinbox::shutdown_signal())
            .await;
        store.close().await;
        r
    };
    tracing::info!(
        applied = report.count("applied"),
        duplicates = report.count("duplicate"),
        business_duplicates = report.count("business_duplicate"),
        dead_lettered = report.count("dead_lettered") + report.count("payload_collision"),
        leases_lost = report.leases_lost,
        "worker stopped"
    );
    println!("{report:?}");
    Ok(())
}
