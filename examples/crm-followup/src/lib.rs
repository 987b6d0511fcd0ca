//! The seed's CRM follow-up agent: each `meeting.ended` event creates one follow-up task, once, whatever the
//! broker redelivers. Shared by the `sqs-crm-worker` and `servicebus-crm-worker` examples, which only differ
//! in the receiver they build.
//!
//! * identity: CloudEvents attributes, else the producer id; consumer name from the command line;
//! * business key `criar_tarefa_followup:<opportunity>:<meeting>`, so two different events asking for the
//!   same follow-up create one task;
//! * the task row and the inbox marker commit in one transaction (PostgreSQL or SQLite).

use std::time::Duration;

use txinbox::{
    BadInput, ConsumerName, HandlerError, IdentityPolicy, LeasedDelivery, Receiver, Worker,
    WorkerOptions, WorkerReport,
};
use txinbox_store::{db_error, handler_fn, BodyFormat, Handled, Inbound, Inbox, InputRules, Store};

/// An error starting the agent.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

const TASKS_PG: &str = "CREATE TABLE IF NOT EXISTS crm_followup_tasks (task_id TEXT PRIMARY KEY, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, message_id TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())";
const TASKS_SQLITE: &str = "CREATE TABLE IF NOT EXISTS crm_followup_tasks (task_id TEXT PRIMARY KEY, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, message_id TEXT NOT NULL, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)";

/// The agent's identity policy.
pub fn policy(consumer: &str) -> Result<IdentityPolicy, BadInput> {
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

/// The task to create: (task id, opportunity, meeting).
fn task(msg: &Inbound<'_>) -> Result<(String, String, String), HandlerError> {
    let v = msg
        .json
        .ok_or_else(|| HandlerError::permanent("body is not JSON"))?;
    let get = |k: &str| {
        v[k].as_str()
            .map(str::to_owned)
            .ok_or_else(|| HandlerError::permanent(format!("missing {k}")))
    };
    let (opportunity, meeting) = (get("opportunity")?, get("meeting")?);
    Ok((
        format!("followup-{opportunity}-{meeting}"),
        opportunity,
        meeting,
    ))
}

/// Where and how the agent runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// `sqlite:crm.db` or `postgres://user@host/db`.
    pub store: String,
    /// The consumer name.
    pub consumer: String,
    /// The worker's options (from the adapter's `worker_options()`).
    pub worker: WorkerOptions,
    /// Delay before a retryable failure is redelivered.
    pub retry_backoff: Duration,
}

/// The task insert; `$n` placeholders work on both backends (SQLite numbers `$1`..`$4` by first appearance).
const INSERT_TASK: &str =
    "INSERT INTO crm_followup_tasks (task_id, opportunity, meeting, message_id) VALUES ($1, $2, $3, $4)";

/// Builds the agent's handler for one backend: the same code, typed for `$db`'s connection.
macro_rules! task_handler {
    ($db:ty) => {
        handler_fn::<$db, _>(|tx, msg| {
            Box::pin(async move {
                let (task_id, opportunity, meeting) = task(msg)?;
                sqlx::query(INSERT_TASK)
                    .bind(&task_id)
                    .bind(&opportunity)
                    .bind(&meeting)
                    .bind(&msg.identity.message_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                Ok(Handled::reference(task_id))
            })
        })
    };
}

/// Runs the agent on `receiver` until SIGTERM or Ctrl-C, then drains (commit, then settle) and returns the
/// report.
pub async fn run<R>(receiver: R, opts: AgentOptions) -> Result<WorkerReport, Error>
where
    R: Receiver,
{
    let rules = InputRules::default().body(BodyFormat::Json);
    let policy = policy(&opts.consumer)?;
    let report = if opts.store.starts_with("postgres") {
        let store =
            Store::<sqlx::Postgres>::connect(&opts.store, opts.worker.concurrency as u32 + 2)
                .await?;
        sqlx::query(TASKS_PG).execute(store.pool()).await?;
        let inbox = Inbox::new(store.pool().clone(), policy)
            .input_rules(rules)
            .retry_backoff(opts.retry_backoff);
        let report = drive(
            receiver,
            inbox.bind(task_handler!(sqlx::Postgres)),
            opts.worker,
        )
        .await;
        store.close().await;
        report
    } else {
        let store = Store::<sqlx::Sqlite>::connect(&opts.store).await?;
        sqlx::query(TASKS_SQLITE).execute(store.pool()).await?;
        let inbox = Inbox::new(store.pool().clone(), policy)
            .input_rules(rules)
            .retry_backoff(opts.retry_backoff);
        let report = drive(
            receiver,
            inbox.bind(task_handler!(sqlx::Sqlite)),
            opts.worker,
        )
        .await;
        store.close().await;
        report
    };
    Ok(report)
}

async fn drive<R, P>(receiver: R, processor: P, opts: WorkerOptions) -> WorkerReport
where
    R: Receiver,
    P: txinbox::Processor<LeasedDelivery<R::Delivery>>,
{
    let report = Worker::new(receiver, processor)
        .options(opts)
        .run_until(txinbox::shutdown_signal())
        .await;
    tracing::info!(
        applied = report.count("applied"),
        duplicates = report.count("duplicate"),
        business_duplicates = report.count("business_duplicate"),
        dead_lettered = report.count("dead_lettered") + report.count("payload_collision"),
        leases_lost = report.leases_lost,
        "worker stopped"
    );
    report
}
