//! The inbox lab: synthetic deliveries of the CRM follow-up event through the in-memory broker into the
//! inbox, with the counts computed from what happened.

use std::fmt;
use std::time::Duration;

use futures::future::LocalBoxFuture;
use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
use txinbox_core::{
    ConsumerName, FingerprintSpec, Handled, Handler, HandlerError, IdentityPolicy, Inbox,
    InboxProcessor, InboxStore, Message, OutcomeKind, Worker, WorkerOptions,
};
use txinbox_dynamodb::DynamoStore;
use txinbox_store::Store;

use crate::labdb::{LabDb, LabStore};

/// The lab consumer's name.
pub const CONSUMER: &str = "crm-followup";
/// The CloudEvents source of the lab's events.
pub const SOURCE: &str = "urn:txinbox:lab:crm";

/// An error running the lab.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] txinbox_store::StoreError),
    /// A query failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The DynamoDB store failed.
    #[error(transparent)]
    Dynamo(#[from] txinbox_dynamodb::DynamoError),
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// A lab run of no message, no copy or more than [`MAX_DELIVERIES`] deliveries: refused before any store
    /// is created.
    #[error(
        "the lab sends 1 to {max} deliveries (messages x copies, each at least 1); {messages} messages x {copies} copies is not",
        max = MAX_DELIVERIES
    )]
    Deliveries {
        /// The logical messages asked for.
        messages: usize,
        /// The copies of each asked for.
        copies: usize,
    },
}

/// The most deliveries (messages × copies) one lab run makes. Every delivery is queued in the in-memory
/// broker before the run starts (about 1.5 KB each) and applied in a transaction of its own: a million already
/// take about 1.5 GB and a quarter of an hour; more is refused rather than allocated. The `txinbox lab`
/// command bounds its runs lower, at 100,000.
pub const MAX_DELIVERIES: usize = 1_000_000;

/// `messages × copies`, or [`LabError::Deliveries`] when either is 0 or the product is above
/// [`MAX_DELIVERIES`] (or overflows).
pub fn lab_deliveries(messages: usize, copies: usize) -> Result<u64, LabError> {
    match messages.checked_mul(copies) {
        Some(n) if (1..=MAX_DELIVERIES).contains(&n) => Ok(n as u64),
        _ => Err(LabError::Deliveries { messages, copies }),
    }
}

/// The lab's event: a meeting of an opportunity ended; the agent creates a follow-up task.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct LabEvent {
    /// The CRM opportunity.
    pub opportunity: String,
    /// The meeting that ended.
    pub meeting: String,
}

/// The business key of the follow-up agent: `criar_tarefa_followup:<opportunity>:<meeting>`.
pub fn followup_business_key(e: &LabEvent) -> Option<String> {
    Some(format!(
        "criar_tarefa_followup:{}:{}",
        e.opportunity, e.meeting
    ))
}

/// The inbox the lab uses: consumer `crm-followup`, `sent_at` excluded from the fingerprint (a volatile
/// transport field), retries released at once.
pub fn lab_inbox<S: InboxStore>(store: S) -> Inbox<S> {
    // A constant that satisfies the naming rule; checked by `lab_consumer_name_is_valid` below.
    let consumer = ConsumerName::new(CONSUMER).expect("CONSUMER is a valid consumer name");
    Inbox::new(store, IdentityPolicy::new(consumer))
        .fingerprint(FingerprintSpec::new().exclude("/sent_at"))
        .retry_backoff(Duration::ZERO)
}

/// `handler` bound to the lab's inbox with the follow-up business key.
pub fn lab_processor<S: InboxStore, H: Handler<S, LabEvent>>(
    store: S,
    handler: H,
) -> InboxProcessor<S, LabEvent, H> {
    lab_inbox(store)
        .bind_handler(handler)
        .business_key(followup_business_key)
}

/// The lab's handler: the follow-up task, one function per store.
pub fn task_handler<S: LabStore>() -> TaskFn<S> {
    S::insert_task
}

/// The lab handler's type: a plain function of the store's transaction.
pub type TaskFn<S> = fn(
    <S as InboxStore>::Tx,
    Message<LabEvent>,
) -> futures::future::BoxFuture<'static, Result<Handled, HandlerError>>;

/// The `i`-th logical message of the lab (one meeting of one opportunity ended; create a follow-up task).
pub fn lab_message(i: usize) -> OutgoingMessage {
    let body = serde_json::json!({
        "opportunity": format!("oportunidade_{}", 2481 + i),
        "meeting": format!("reuniao_{}", 184 + i),
        "action": "criar_tarefa_followup",
        "sent_at": chrono::Utc::now().to_rfc3339(),
    });
    OutgoingMessage::new(body.to_string())
        .cloudevent(SOURCE, &format!("evt-{}", 482 + i), "crm.meeting.ended")
        .attribute(txinbox_core::pipeline::identity::ce::TIME, lab_event_time())
}

/// The CloudEvents `time` of the lab's events: one time per process, so that every send of one lab message is
/// the same event (a producer that sends an event again sends its time again).
pub fn lab_event_time() -> String {
    static AT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    AT.get_or_init(|| chrono::Utc::now().to_rfc3339()).clone()
}

/// The lab's counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabReport {
    /// Deliveries processed.
    pub deliveries: u64,
    /// Deliveries applied.
    pub accepted: u64,
    /// Deliveries recognised as duplicates.
    pub duplicates: u64,
    /// Inbox rows at the end.
    pub inbox_rows: i64,
    /// Business effects (rows in the business table) at the end.
    pub business_effects: i64,
}

impl fmt::Display for LabReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "deliveries={}", self.deliveries)?;
        writeln!(f, "accepted={}", self.accepted)?;
        writeln!(f, "duplicates={}", self.duplicates)?;
        writeln!(f, "inbox_rows={}", self.inbox_rows)?;
        write!(f, "business_effects={}", self.business_effects)
    }
}

/// Sends `messages` logical messages `copies` times each through the in-memory broker and runs a worker
/// until every delivery is processed. [`LabError::Deliveries`] (before the tables are created) unless both
/// are at least 1 and their product at most [`MAX_DELIVERIES`].
pub async fn run_lab<S: LabStore>(
    store: S,
    messages: usize,
    copies: usize,
) -> Result<LabReport, LabError> {
    let expected = lab_deliveries(messages, copies)?;
    store.create_tables().await?;
    let queue = MemoryQueue::new(QueueOptions {
        wait: Duration::from_millis(50),
        ..QueueOptions::default()
    });
    for _ in 0..copies {
        for i in 0..messages {
            queue.send(lab_message(i));
        }
    }
    let processor = lab_processor(store.clone(), task_handler::<S>());
    let q = queue.clone();
    let drained = async move {
        loop {
            let s = q.state();
            if s.visible + s.in_flight + s.delayed == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let report = Worker::new(queue.receiver(), processor)
        .options(WorkerOptions::default().concurrency(4))
        .run_until(drained)
        .await;
    let rows = store.count_markers(CONSUMER).await?;
    let effects = store.count_tasks().await?;
    let deliveries = report.total();
    if deliveries != expected {
        tracing::warn!(deliveries, expected, "not every delivery was processed");
    }
    Ok(LabReport {
        deliveries,
        accepted: report.count(OutcomeKind::Applied),
        duplicates: report.count(OutcomeKind::Duplicate),
        inbox_rows: rows,
        business_effects: effects,
    })
}

/// [`run_lab`] on a fresh database of `target`, removed afterwards. [`LabError::Deliveries`] before anything
/// is created unless both counts are at least 1 and their product at most [`MAX_DELIVERIES`].
pub async fn run_lab_on(
    target: &Target,
    messages: usize,
    copies: usize,
) -> Result<LabReport, LabError> {
    lab_deliveries(messages, copies)?;
    struct Lab(usize, usize);
    impl OnFresh for Lab {
        type Output = LabReport;
        fn run<S: LabStore>(
            self,
            store: S,
        ) -> LocalBoxFuture<'static, Result<LabReport, LabError>> {
            Box::pin(run_lab(store, self.0, self.1))
        }
    }
    with_fresh(target, Lab(messages, copies)).await
}

/// A store the lab can open: SQLite (`sqlite:` URL, fresh in-memory database by default), PostgreSQL
/// (`postgres://` URL; each run gets its own schema, dropped afterwards) or DynamoDB (`dynamodb://TABLE`:
/// each run gets its own table, `TABLE-lab-` and a random suffix, deleted afterwards; the AWS configuration
/// chain finds the account, `AWS_ENDPOINT_URL_DYNAMODB` an emulator). Its `Debug` masks the URLs' passwords and
/// query values.
#[derive(Clone)]
pub enum Target {
    /// A `sqlite:` URL.
    Sqlite(String),
    /// A `postgres://` URL.
    Postgres(String),
    /// A `postgres://` URL, each fresh schema converted to the partitioned layout
    /// ([`lab_partition_options`]) before the run: `txinbox lab --partitioned`.
    PostgresPartitioned(String),
    /// A `dynamodb://TABLE` URL: the base of the fresh tables' names, and the endpoint of an emulator
    /// (`None`: the AWS configuration chain decides).
    Dynamodb {
        /// The base of the fresh tables' names.
        table: String,
        /// An emulator's endpoint (DynamoDB Local, moto), with its dummy credentials.
        endpoint: Option<String>,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use txinbox_core::error::redact_url;
        match self {
            Target::Sqlite(url) => f.debug_tuple("Sqlite").field(&redact_url(url)).finish(),
            Target::Postgres(url) => f.debug_tuple("Postgres").field(&redact_url(url)).finish(),
            Target::PostgresPartitioned(url) => f
                .debug_tuple("PostgresPartitioned")
                .field(&redact_url(url))
                .finish(),
            Target::Dynamodb { table, endpoint } => f
                .debug_struct("Dynamodb")
                .field("table", table)
                .field("endpoint", &endpoint.as_deref().map(redact_url))
                .finish(),
        }
    }
}

impl Target {
    /// Parses a store URL, naming only the scheme in errors (the URL may hold a password).
    pub fn parse(url: &str) -> Result<Self, LabError> {
        if url.starts_with("sqlite:") {
            Ok(Target::Sqlite(url.to_owned()))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Target::Postgres(url.to_owned()))
        } else if url.starts_with("dynamodb://") {
            Ok(Target::Dynamodb {
                table: txinbox_dynamodb::table_from_url(url)?,
                endpoint: None,
            })
        } else {
            // Never the whole text: what has no scheme may be a password.
            let scheme = txinbox_core::error::url_scheme(url)
                .unwrap_or("(none: not a URL)")
                .to_owned();
            Err(LabError::Store(txinbox_store::StoreError::UnsupportedUrl {
                scheme,
            }))
        }
    }
}

impl Target {
    /// The same PostgreSQL target in the partitioned layout; other stores have none.
    pub fn partitioned(self) -> Result<Self, LabError> {
        match self {
            Target::Postgres(url) | Target::PostgresPartitioned(url) => {
                Ok(Target::PostgresPartitioned(url))
            }
            _ => Err(LabError::Usage(
                "--partitioned needs a postgres:// store (only PostgreSQL has the partitioned layout)"
                    .into(),
            )),
        }
    }

    /// Whether the target is the partitioned layout.
    pub fn is_partitioned(&self) -> bool {
        matches!(self, Target::PostgresPartitioned(_))
    }
}

/// The partitioned layout the lab converts its fresh schemas to: hour-wide partitions, markers kept an hour
/// past their origin (the retention window's keep), a day of partitions ahead (the windows move the
/// in-memory broker's clock by hours).
pub fn lab_partition_options() -> txinbox_store::PartitionOptions {
    txinbox_store::PartitionOptions::new()
        .width(Duration::from_secs(3600))
        .keep(Duration::from_secs(3600))
        .ahead(24)
}

/// A fresh, migrated database for one run; dropped (schema or file removed) by [`Fresh::cleanup`].
pub struct Fresh<DB: LabDb> {
    /// The store.
    pub store: Store<DB>,
    cleanup: Option<Cleanup>,
}

enum Cleanup {
    PgSchema { url: String, schema: String },
    File(std::path::PathBuf),
}

impl<DB: LabDb> Fresh<DB> {
    /// Closes the pool and removes what was created for the run.
    pub async fn cleanup(self) {
        self.store.close().await;
        match self.cleanup {
            Some(Cleanup::PgSchema { url, schema }) => {
                use sqlx::Connection;
                // Read as the store reads it: sqlx's own reading logs a parameter it does not know with its value.
                let Ok(opts) = txinbox_store::pg_connect_options(&url) else {
                    return;
                };
                if let Ok(mut c) = sqlx::PgConnection::connect_with(&opts).await {
                    let _ = sqlx::Executor::execute(
                        &mut c,
                        format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str(),
                    )
                    .await;
                    let _ = c.close().await;
                }
            }
            Some(Cleanup::File(p)) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", p.display()));
                }
            }
            None => {}
        }
    }
}

/// Opens a fresh SQLite database: in memory for `sqlite::memory:`, else a new file beside the one named.
pub async fn fresh_sqlite(url: &str) -> Result<Fresh<sqlx::Sqlite>, LabError> {
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Ok(Fresh {
            store: Store::<sqlx::Sqlite>::connect("sqlite::memory:").await?,
            cleanup: None,
        });
    }
    let path = std::path::PathBuf::from(
        url.trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:"),
    );
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| ".".into());
    let file = dir.join(format!("txinbox-lab-{}.db", uuid::Uuid::new_v4().simple()));
    let store = Store::<sqlx::Sqlite>::connect(&format!("sqlite:{}", file.display())).await?;
    Ok(Fresh {
        store,
        cleanup: Some(Cleanup::File(file)),
    })
}

/// Opens a fresh PostgreSQL schema.
pub async fn fresh_postgres(
    url: &str,
    max_connections: u32,
) -> Result<Fresh<sqlx::Postgres>, LabError> {
    let schema = format!("txinbox_lab_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_in_schema(url, &schema, max_connections).await?;
    Ok(Fresh {
        store,
        cleanup: Some(Cleanup::PgSchema {
            url: url.to_owned(),
            schema,
        }),
    })
}

/// Work to run on a fresh store of any kind: [`with_fresh`] calls it with the store the target names.
pub trait OnFresh {
    /// What the work returns.
    type Output;
    /// Runs the work on `store` (fresh, empty).
    fn run<S: LabStore>(self, store: S) -> LocalBoxFuture<'static, Result<Self::Output, LabError>>;
}

/// Runs `f` on a fresh database of `target`, then cleans up.
pub async fn with_fresh<F: OnFresh>(target: &Target, f: F) -> Result<F::Output, LabError> {
    match target {
        Target::Sqlite(url) => {
            let fresh = fresh_sqlite(url).await?;
            let r = f.run(fresh.store.clone()).await;
            fresh.cleanup().await;
            r
        }
        Target::Postgres(url) => {
            let fresh = fresh_postgres(url, 16).await?;
            let r = f.run(fresh.store.clone()).await;
            fresh.cleanup().await;
            r
        }
        Target::PostgresPartitioned(url) => {
            let fresh = fresh_postgres(url, 16).await?;
            let converted = fresh.store.partition(&lab_partition_options()).await;
            let r = match converted {
                Ok(_) => match fresh.store.is_partitioned().await {
                    Ok(true) => f.run(fresh.store.clone()).await,
                    Ok(false) => Err(LabError::Usage(
                        "the schema was not partitioned after the conversion".into(),
                    )),
                    Err(e) => Err(e.into()),
                },
                Err(e) => Err(e.into()),
            };
            fresh.cleanup().await;
            r
        }
        Target::Dynamodb { table, endpoint } => {
            let (store, client) = fresh_dynamodb(table, endpoint.as_deref()).await?;
            let table = store.table().to_owned();
            let r = f.run(store).await;
            if let Err(e) = client.delete_table().table_name(&table).send().await {
                let e = txinbox_dynamodb::DynamoError::from_sdk("DeleteTable", e);
                tracing::warn!(table, error = %e, "the lab's table could not be deleted");
            }
            r
        }
    }
}

/// Creates a fresh table `BASE-lab-<random>` with the store's layout ([`DynamoStore::create_table`]: it
/// waits until DynamoDB has the table `ACTIVE`, at once on DynamoDB Local, seconds to a minute on the service)
/// and opens it, through `endpoint` (an emulator) or else the AWS configuration chain. A table whose opening
/// fails is deleted before the error is returned.
pub async fn fresh_dynamodb(
    base: &str,
    endpoint: Option<&str>,
) -> Result<(DynamoStore, txinbox_dynamodb::aws_sdk_dynamodb::Client), LabError> {
    let client = match endpoint {
        Some(e) => txinbox_dynamodb::emulator_client(e),
        None => txinbox_dynamodb::client_from_env().await,
    };
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let table = format!("{base}-lab-{}", &suffix[..12]);
    DynamoStore::create_table(&client, &table).await?;
    let opened = DynamoStore::open(
        client.clone(),
        table.clone(),
        txinbox_dynamodb::DynamoOptions::default(),
    )
    .await;
    let store = DynamoStore::delete_on_error(&client, &table, opened).await?;
    Ok((store, client))
}

#[cfg(test)]
mod tests {
    #[test]
    fn debug_of_a_target_masks_the_urls_password() {
        for target in [
            super::Target::parse("postgres://lab:s3cretpw@db/lab").unwrap(),
            super::Target::parse("postgres://lab:s3cretpw@db/lab")
                .unwrap()
                .partitioned()
                .unwrap(),
            super::Target::parse("sqlite:lab.db?key=s3cret").unwrap(),
        ] {
            let shown = format!("{target:?}");
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("lab"), "{shown}");
        }
    }

    #[test]
    fn lab_consumer_name_is_valid() {
        assert!(txinbox_core::ConsumerName::new(super::CONSUMER).is_ok());
    }
}
