//! The CRM follow-up agent of the inbox lab: each `meeting.ended` event creates one follow-up task, once,
//! whatever the broker redelivers. Shared by the `sqs-crm-worker` and `servicebus-crm-worker` examples, which
//! only differ in the receiver they build.
//!
//! * identity: CloudEvents attributes, else the producer id; consumer name from the command line;
//! * the body is parsed once into [`MeetingEnded`]; a body that is not one is dead-lettered as `invalid_json`;
//! * business key `criar_tarefa_followup:<opportunity>:<meeting>`, computed from the typed event, so two
//!   different events asking for the same follow-up create one task;
//! * the task row and the inbox marker commit in one transaction (PostgreSQL or SQLite): one handler, written
//!   once, for both; on DynamoDB (`--store dynamodb://TABLE`) the task is an item of the inbox's table, in the
//!   marker's `TransactWriteItems`.

use std::time::Duration;

use txinbox::broker::Receiver;
use txinbox::driver::{EffectStore, MaintenanceStore};
use txinbox::health::{Health, HealthCheck};
use txinbox::settings::{EffectsSettings, HttpDestinationSettings, WorkerSettings};
use txinbox::sqlx::{self, Encode, Executor, IntoArguments, Type};
use txinbox::store::Backend;
use txinbox::{
    ConsumerName, Effect, EffectRunner, Handled, HandlerError, IdentityPolicy, Inbox,
    LeasedDelivery, Maintenance, MaintenanceOptions, Message, OutcomeKind, RetentionPolicy, Store,
    Tx, Worker, WorkerOptions, WorkerReport,
};

/// An error starting the agent.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

const TASKS_PG: &str = "CREATE TABLE IF NOT EXISTS crm_followup_tasks (task_id TEXT PRIMARY KEY, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, message_id TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())";
const TASKS_SQLITE: &str = "CREATE TABLE IF NOT EXISTS crm_followup_tasks (task_id TEXT PRIMARY KEY, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, message_id TEXT NOT NULL, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)";

/// Creates the agent's task table on PostgreSQL (idempotent).
pub async fn create_tables_pg(store: &Store<sqlx::Postgres>) -> Result<(), sqlx::Error> {
    sqlx::query(TASKS_PG)
        .execute(store.pool())
        .await
        .map(|_| ())
}

/// The event: a meeting of an opportunity ended.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct MeetingEnded {
    /// The CRM opportunity.
    pub opportunity: String,
    /// The meeting.
    pub meeting: String,
}

/// The agent's business key: one follow-up per opportunity and meeting.
pub fn business_key(e: &MeetingEnded) -> Option<String> {
    Some(format!(
        "criar_tarefa_followup:{}:{}",
        e.opportunity, e.meeting
    ))
}

/// The agent's handler: the local record of the follow-up task in the inbox's transaction and, when an
/// external CRM is configured, the task to create there after COMMIT (an effect with its idempotency key,
/// searchable at the CRM by the follow-up's reference). Generic over the backend, so the bounds say what its
/// statements need (a handler for one backend needs none).
pub async fn create_task<DB>(
    tx: Tx<DB>,
    msg: Message<MeetingEnded>,
    with_crm: bool,
) -> Result<Handled, HandlerError>
where
    DB: Backend,
    for<'c> &'c Tx<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
{
    let MeetingEnded {
        opportunity,
        meeting,
    } = msg.body;
    let task_id = format!("followup-{opportunity}-{meeting}");
    let crm_task = crm_effect(&opportunity, &meeting, &task_id)?;
    // `$n` placeholders work on both backends.
    sqlx::query("INSERT INTO crm_followup_tasks (task_id, opportunity, meeting, message_id) VALUES ($1, $2, $3, $4)")
        .bind(task_id.clone())
        .bind(opportunity)
        .bind(meeting)
        .bind(msg.identity.message_id)
        .execute(&tx)
        .await?;
    let done = Handled::reference(task_id);
    Ok(if with_crm {
        done.effect(crm_task)
    } else {
        done
    })
}

/// The agent's handler on DynamoDB: the follow-up task is an item of the inbox's own table (single-table
/// design: `pk = followup#<task>`), written in the same `TransactWriteItems` as the marker. It counts the
/// applications that reached it (`applied`), so a doubled application would show as 2.
pub async fn create_task_dynamodb(
    tx: txinbox::dynamodb::DynamoTx,
    msg: Message<MeetingEnded>,
    table: String,
    with_crm: bool,
) -> Result<Handled, HandlerError> {
    use txinbox::dynamodb::aws_sdk_dynamodb::types::{AttributeValue as V, Update};
    let MeetingEnded {
        opportunity,
        meeting,
    } = msg.body;
    let task_id = format!("followup-{opportunity}-{meeting}");
    let crm_task = crm_effect(&opportunity, &meeting, &task_id)?;
    tx.update(
        Update::builder()
            .table_name(table)
            .key("pk", V::S(format!("followup#{task_id}")))
            .update_expression(
                "SET opportunity = :o, meeting = :m, message_id = :id ADD applied :one",
            )
            .expression_attribute_values(":o", V::S(opportunity))
            .expression_attribute_values(":m", V::S(meeting))
            .expression_attribute_values(":id", V::S(msg.identity.message_id))
            .expression_attribute_values(":one", V::N("1".into()))
            .build()
            .map_err(HandlerError::permanent)?,
    )?;
    let done = Handled::reference(task_id);
    Ok(if with_crm {
        done.effect(crm_task)
    } else {
        done
    })
}

/// The task to create at the external CRM, with the follow-up's reference.
fn crm_effect(opportunity: &str, meeting: &str, task_id: &str) -> Result<Effect, HandlerError> {
    Ok(Effect::json(
        "crm.create_task",
        CRM,
        &serde_json::json!({
            "title": format!("Follow up meeting {meeting} of opportunity {opportunity}"),
            "opportunity": opportunity,
            "meeting": meeting,
            "external_ref": task_id,
        }),
    )?
    .external_ref(task_id.to_owned()))
}

/// The destination name of the external CRM.
pub const CRM: &str = "crm";

/// The external CRM at `url` (`txinbox-crm-api`) as a destination, what `--crm-url` stands for: tasks POSTed
/// to `{url}/tasks` with their `Idempotency-Key`, which it honours, found again by key
/// (`{url}/tasks?idempotency_key=...`, 404 when none) when an answer was lost. The same as the settings file's
///
/// ```toml
/// [effects.destinations.crm]
/// url = "http://127.0.0.1:8088/tasks"
/// key = "header:Idempotency-Key"
/// timeout_seconds = 5
/// confirm = { url = "http://127.0.0.1:8088/tasks?idempotency_key={key}", rule = "lookup" }
/// ```
pub fn crm_destination(url: &str) -> HttpDestinationSettings {
    let url = url.trim_end_matches('/');
    let mut confirm = txinbox::settings::ConfirmSettings::default();
    confirm.url = format!("{url}/tasks?idempotency_key={{key}}");
    confirm.rule = Some("lookup".into());
    let mut d = HttpDestinationSettings::default();
    d.url = format!("{url}/tasks");
    d.key = Some("header:Idempotency-Key".into());
    d.timeout_seconds = Some(5);
    d.confirm = Some(confirm);
    d
}

/// Where and how the agent runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// `sqlite:crm.db` or `postgres://user@host/db`.
    pub store: String,
    /// The consumer name.
    pub consumer: String,
    /// The worker's options.
    pub worker: WorkerOptions,
    /// Delay before a retryable failure is redelivered.
    pub retry_backoff: Duration,
    /// The effect runner and its destinations (`[effects]`): with a [`CRM`] destination the agent creates each
    /// follow-up task there too, through an effect run by a runner in this process (none: the local record
    /// only).
    pub effects: EffectsSettings,
    /// Run the maintenance (retention) beside the worker this often (`None`: another process purges).
    pub maintenance_every: Option<Duration>,
    /// How long markers are kept (`[inbox] retention_seconds`).
    pub retention: RetentionPolicy,
    /// Most database connections.
    pub max_connections: u32,
    /// Serve `GET /livez` and `GET /readyz` here (`None`: off).
    pub health_addr: Option<std::net::SocketAddr>,
    /// The store section, for its shards (`[store.shards.NAME]`): when there are, `store` is not used and each
    /// delivery is applied in the shard that claims its tenant.
    pub store_settings: txinbox::settings::StoreSettings,
}

impl AgentOptions {
    /// The agent as a settings file describes it (the file `txinbox check-infra --config` checks): consumer,
    /// store, worker options, retention, maintenance cadence, health endpoint, effects. `crm_url` (the
    /// `--crm-url` flag) sets the [`CRM`] destination to [`crm_destination`], with claims of 10 s unless the
    /// file sets them: a runner killed mid-call (5 s timeout) leaves its effects to the next one soon.
    pub fn from_settings(s: &WorkerSettings, crm_url: Option<String>) -> Self {
        let mut effects = s.effects.clone();
        if let Some(url) = crm_url {
            effects
                .destinations
                .insert(CRM.to_owned(), crm_destination(&url));
            if effects.claim_seconds == EffectsSettings::default().claim_seconds {
                effects.claim_seconds = 10;
            }
        }
        Self {
            store: s.store.url.clone(),
            consumer: s.worker.consumer.clone(),
            worker: s.worker_options(),
            retry_backoff: Duration::from_secs(5),
            effects,
            maintenance_every: s.worker.purge_interval_seconds.map(Duration::from_secs),
            retention: s.retention(),
            max_connections: s.store.max_connections,
            health_addr: s.health_addr(),
            store_settings: s.store.clone(),
        }
    }

    /// The effective values, one `key=value` per line, read back from the options the agent runs with (what
    /// `--print-config` shows).
    pub fn describe(&self) -> String {
        format!(
            "shards={}\nconsumer={}\nconcurrency={}\nreceive_max={}\nprefetch={}\nreceive_loops={}\nbatch_commit={}\nbatch_linger_ms={}\nshutdown_timeout_seconds={}\nretention_seconds={}\nmax_connections={}\nhealth_addr={}\npurge_interval_seconds={}\n",
            self.store_settings
                .shards
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(","),
            self.consumer,
            self.worker.get_concurrency(),
            self.worker.get_batch_size(),
            self.worker.get_prefetch(),
            self.worker.get_receive_loops(),
            self.worker.get_batch_commit(),
            self.worker.get_batch_linger().as_millis(),
            self.worker.get_shutdown_timeout().as_secs(),
            self.retention.keep.as_secs(),
            self.max_connections,
            self.health_addr.map(|a| a.to_string()).unwrap_or_default(),
            self.maintenance_every.map(|d| d.as_secs().to_string()).unwrap_or_default(),
        )
    }
}

/// The flags both example workers share (`#[command(flatten)]`): the settings file and the overrides that are
/// not about a broker. Each worker adds its broker's own.
#[derive(Debug, clap::Args)]
pub struct CommonArgs {
    /// The settings file (the one `txinbox check-infra --config` reads). Without it: the defaults and the
    /// `TXINBOX_<SECTION>__<KEY>` environment overrides.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Print the values the worker would run with (`key=value`) and exit without connecting.
    #[arg(long)]
    pub print_config: bool,
    /// The store: `sqlite:crm.db`, `postgres://user@host/db` or `dynamodb://TABLE` (`[store] url`).
    #[arg(long)]
    pub store: Option<String>,
    /// The consumer name, part of every inbox key (`[worker] consumer`).
    #[arg(long)]
    pub consumer: Option<String>,
    /// Messages processed at once (`[worker] concurrency`).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Serve Prometheus metrics (`GET /metrics`) here, e.g. `127.0.0.1:9464` (`[worker] metrics_addr`).
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Serve `GET /livez` and `GET /readyz` here, e.g. `127.0.0.1:8080` (`[worker] health_addr`).
    #[arg(long)]
    pub health_addr: Option<String>,
    /// Run the maintenance every this many seconds beside the worker (`[worker] purge_interval_seconds`).
    #[arg(long)]
    pub purge_interval_secs: Option<u64>,
    /// Stop when receives keep failing this many seconds with an error a retry cannot fix (a key rotated, a
    /// permission removed, the queue deleted), so that the supervisor sees it (`[worker]
    /// give_up_after_seconds`; 0: never).
    #[arg(long)]
    pub give_up_after_secs: Option<u64>,
    /// The external CRM's base URL (e.g. `txinbox-crm-api`'s): each follow-up task is also created there,
    /// through an effect with its idempotency key, run beside the worker.
    #[arg(long, env = "TXINBOX_CRM_URL")]
    pub crm_url: Option<String>,
}

impl CommonArgs {
    /// The settings: the file (or the defaults), then the environment, then these flags. The caller applies
    /// its broker's flags on top.
    pub fn settings(&self) -> Result<WorkerSettings, Error> {
        let mut s = match &self.config {
            Some(path) => WorkerSettings::load(path)?,
            None => WorkerSettings::from_env()?,
        };
        set(&mut s.worker.metrics_addr, &self.metrics_addr);
        set(&mut s.worker.health_addr, &self.health_addr);
        if let Some(v) = &self.store {
            s.store.url.clone_from(v);
        }
        if let Some(v) = &self.consumer {
            s.worker.consumer.clone_from(v);
        }
        if let Some(v) = self.concurrency {
            s.worker.concurrency = v.max(1);
        }
        if self.purge_interval_secs.is_some() {
            s.worker.purge_interval_seconds = self.purge_interval_secs;
        }
        if let Some(v) = self.give_up_after_secs {
            s.worker.give_up_after_seconds = v;
        }
        Ok(s)
    }
}

/// Sets `to` when a flag gave `from`.
pub fn set(to: &mut Option<String>, from: &Option<String>) {
    if from.is_some() {
        to.clone_from(from);
    }
}

/// A worker that stopped because its receives kept failing with an error a retry cannot fix.
#[derive(Debug)]
pub struct GaveUp(pub String);

impl std::fmt::Display for GaveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gave up: {}", self.0)
    }
}

impl std::error::Error for GaveUp {}

/// Exit code of a worker that could not start (bad settings, a queue or database it cannot use).
pub const EXIT_CANNOT_START: u8 = 2;
/// Exit code of a worker that ran and gave up ([`GaveUp`]).
pub const EXIT_GAVE_UP: u8 = 3;

/// The process's exit: `0`, or one line on stderr naming what is wrong (the errors never carry a secret) and
/// [`EXIT_GAVE_UP`] or [`EXIT_CANNOT_START`].
pub fn exit(program: &str, result: Result<(), Error>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let line = e
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            eprintln!("{program}: {line}");
            std::process::ExitCode::from(if e.downcast_ref::<GaveUp>().is_some() {
                EXIT_GAVE_UP
            } else {
                EXIT_CANNOT_START
            })
        }
    }
}

/// Logs to stdout through `tracing-subscriber`, at `RUST_LOG` (default `info`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
}

/// The worker's end: the report on stdout, and [`GaveUp`] when it stopped on persistent receive errors.
pub fn finish(report: &WorkerReport) -> Result<(), Error> {
    println!("{report}");
    match &report.gave_up {
        Some(why) => Err(GaveUp(why.clone()).into()),
        None => Ok(()),
    }
}

/// Serves Prometheus metrics (`GET /metrics`) on `addr` through `metrics-exporter-prometheus`, with buckets for
/// the histograms, and registers the metric descriptions.
pub fn serve_metrics(addr: std::net::SocketAddr) -> Result<(), Error> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    const SECONDS: &[f64] = &[
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ];
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Full(txinbox::metrics::RECEIVE_TO_COMMIT.to_owned()),
            SECONDS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(txinbox::metrics::MAINTENANCE_DURATION.to_owned()),
            SECONDS,
        )?
        .install()?;
    txinbox::metrics::describe();
    tracing::info!(%addr, "serving Prometheus metrics on /metrics");
    Ok(())
}

/// Runs the agent on `receiver` until SIGTERM or Ctrl-C, then drains (commit, then settle) and returns the
/// report.
pub async fn run<R>(receiver: R, opts: AgentOptions) -> Result<WorkerReport, Error>
where
    R: Receiver,
{
    let policy = IdentityPolicy::new(ConsumerName::new(&opts.consumer)?);
    // Bound before anything else: a worker asked to answer probes that cannot is misconfigured.
    let health_listener = match opts.health_addr {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| format!("cannot serve the health endpoint on {a}: {e}"))?,
        ),
        None => None,
    };
    let report = if !opts.store_settings.shards.is_empty() {
        run_sharded(receiver, policy, &opts, health_listener).await?
    } else if let Some(table) = opts.store.strip_prefix("dynamodb://") {
        let store = txinbox::dynamodb::DynamoStore::connect(&opts.store).await?;
        let with_crm = opts.effects.destinations.contains_key(CRM);
        let runner = effect_runner(&store, &opts)?;
        let table = table.to_owned();
        let processor = Inbox::new(store.clone(), policy)
            .retention(opts.retention.clone())
            .retry_backoff(opts.retry_backoff)
            .bind(move |tx, msg| create_task_dynamodb(tx, msg, table.clone(), with_crm))
            .business_key(business_key);
        let health = Health::new().check("database", store.clone());
        drive(
            receiver,
            processor,
            vec![(None, store)],
            runner.into_iter().collect(),
            health,
            &opts,
            health_listener,
        )
        .await
    } else if opts.store.starts_with("postgres") {
        let store = Store::<sqlx::Postgres>::connect(&opts.store, opts.max_connections).await?;
        sqlx::query(TASKS_PG).execute(store.pool()).await?;
        let with_crm = opts.effects.destinations.contains_key(CRM);
        let runner = effect_runner(&store, &opts)?;
        let processor = Inbox::new(store.clone(), policy)
            .retention(opts.retention.clone())
            .retry_backoff(opts.retry_backoff)
            .bind(move |tx, msg| create_task(tx, msg, with_crm))
            .business_key(business_key);
        let health = Health::new().check("database", store.clone());
        let report = drive(
            receiver,
            processor,
            vec![(None, store.clone())],
            runner.into_iter().collect(),
            health,
            &opts,
            health_listener,
        )
        .await;
        store.close().await;
        report
    } else {
        let store = Store::<sqlx::Sqlite>::connect(&opts.store).await?;
        sqlx::query(TASKS_SQLITE).execute(store.pool()).await?;
        let with_crm = opts.effects.destinations.contains_key(CRM);
        let runner = effect_runner(&store, &opts)?;
        let processor = Inbox::new(store.clone(), policy)
            .retention(opts.retention.clone())
            .retry_backoff(opts.retry_backoff)
            .bind(move |tx, msg| create_task(tx, msg, with_crm))
            .business_key(business_key);
        let health = Health::new().check("database", store.clone());
        let report = drive(
            receiver,
            processor,
            vec![(None, store.clone())],
            runner.into_iter().collect(),
            health,
            &opts,
            health_listener,
        )
        .await;
        store.close().await;
        report
    };
    Ok(report)
}

/// The effect runner of the settings' destinations (none without one); a destination whose rules cannot work
/// stops the agent at start.
fn effect_runner<S: EffectStore>(
    store: &S,
    opts: &AgentOptions,
) -> Result<Option<EffectRunner<S>>, Error> {
    if opts.effects.destinations.is_empty() {
        return Ok(None);
    }
    Ok(Some(txinbox::http::runner_from_settings(
        store.clone(),
        &opts.effects,
    )?))
}

/// The agent on shards (`[store.shards.NAME]`, PostgreSQL): one store per shard, each delivery applied in the
/// shard that claims its tenant, an effect runner and a maintenance per shard. A shard that cannot be reached at
/// start stops the agent when `[store] require_all_shards` is set; otherwise the agent starts for the others,
/// that shard's deliveries are released until it answers, and it is migrated then.
async fn run_sharded<R: Receiver>(
    receiver: R,
    policy: IdentityPolicy,
    opts: &AgentOptions,
    health_listener: Option<tokio::net::TcpListener>,
) -> Result<WorkerReport, Error> {
    use txinbox::shards::{Shard, ShardRouter, Shards};
    use txinbox::store::StoreOptions;
    let resolved = opts.store_settings.resolved_shards()?;
    let mut stores = Vec::with_capacity(resolved.len());
    for shard in &resolved {
        let options = StoreOptions::new().max_connections(shard.max_connections);
        let store = match Store::<sqlx::Postgres>::connect_with(&shard.url, options.clone()).await {
            Ok(store) => {
                sqlx::query(TASKS_PG).execute(store.pool()).await?;
                store
            }
            Err(e) if opts.store_settings.require_all_shards => {
                return Err(format!(
                    "shard {}: cannot be used ({e}) and [store] require_all_shards is set",
                    shard.name
                )
                .into())
            }
            Err(e) => {
                tracing::warn!(shard = %shard.name, error = %e, "shard unreachable at start: starting for the others; its deliveries are released until it answers");
                let store = Store::<sqlx::Postgres>::connect_lazy_with(&shard.url, options)?;
                let (late, name) = (store.clone(), shard.name.clone());
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        if late.migrate().await.is_ok()
                            && sqlx::query(TASKS_PG).execute(late.pool()).await.is_ok()
                        {
                            tracing::info!(shard = %name, "shard reachable: migrated");
                            return;
                        }
                    }
                });
                store
            }
        };
        stores.push(store);
    }
    let with_crm = opts.effects.destinations.contains_key(CRM);
    let base = Inbox::new(stores[0].clone(), policy)
        .retention(opts.retention.clone())
        .retry_backoff(opts.retry_backoff)
        .bind(move |tx, msg| create_task(tx, msg, with_crm))
        .business_key(business_key);
    let shards = Shards::new(
        ShardRouter::tenant(),
        resolved.iter().zip(&stores).map(|(r, store)| {
            let shard = Shard::new(r.name.clone(), base.on_store(store.clone()))
                .claims(r.tenants.clone())
                .check(store.clone());
            if r.rest {
                shard.rest()
            } else {
                shard
            }
        }),
    )?
    .options(
        txinbox::shards::ShardOptions::new().require_all(opts.store_settings.require_all_shards),
    );
    for down in shards.probe().await {
        tracing::warn!(shard = %down.name, error = down.down.as_deref().unwrap_or(""), "shard unavailable");
    }
    // One effect runner and one maintenance per shard, their gauges labelled with the shard.
    let mut runners = Vec::new();
    for (r, store) in resolved.iter().zip(&stores) {
        runners.extend(effect_runner(store, opts)?.map(|runner| runner.shard(r.name.clone())));
    }
    let named: Vec<_> = resolved
        .iter()
        .zip(&stores)
        .map(|(r, s)| (Some(r.name.clone()), s.clone()))
        .collect();
    let health = shards.health(Health::new());
    let report = drive(
        receiver,
        shards,
        named,
        runners,
        health,
        opts,
        health_listener,
    )
    .await;
    for store in &stores {
        store.close().await;
    }
    Ok(report)
}

/// Runs the worker and, with effects, the effect runners and the maintenances beside it (one of each per store),
/// and the health endpoint, under one shutdown (SIGTERM or Ctrl-C): a [`Monitor`](txinbox::Monitor).
async fn drive<R, P, S>(
    receiver: R,
    processor: P,
    stores: Vec<(Option<String>, S)>,
    runners: Vec<EffectRunner<S>>,
    health: Health,
    opts: &AgentOptions,
    health_listener: Option<tokio::net::TcpListener>,
) -> WorkerReport
where
    R: Receiver,
    P: txinbox::Processor<LeasedDelivery<R::Delivery>>,
    S: EffectStore + MaintenanceStore + HealthCheck + Clone,
{
    let mut monitor = txinbox::Monitor::new().worker(
        Worker::new(receiver, processor)
            .options(opts.worker.clone())
            .health(health.clone()),
    );
    if let Some(l) = health_listener {
        tracing::info!(addr = ?l.local_addr().ok(), "serving GET /livez and GET /readyz");
        monitor = monitor.health_server(l, health);
    }
    if let Some(every) = opts.maintenance_every {
        for (shard, store) in stores {
            let mut options = MaintenanceOptions::default()
                .every(every)
                .consumer(opts.consumer.clone());
            if let Some(shard) = shard {
                options = options.shard(shard);
            }
            monitor = monitor.maintenance(Maintenance::new(store).options(options));
        }
    }
    for runner in runners {
        monitor = monitor.effects(runner);
    }
    let done = monitor.run_until(txinbox::shutdown_signal()).await;
    if let Some(e) = &done.effects {
        tracing::info!(%e, "effect runner stopped");
        println!("{e}");
    }
    let report = done.worker.unwrap_or_default();
    tracing::info!(
        applied = report.count(OutcomeKind::Applied),
        duplicates = report.count(OutcomeKind::Duplicate),
        business_duplicates = report.count(OutcomeKind::BusinessDuplicate),
        dead_lettered =
            report.count(OutcomeKind::DeadLettered) + report.count(OutcomeKind::PayloadCollision),
        leases_lost = report.leases_lost,
        "worker stopped"
    );
    report
}
