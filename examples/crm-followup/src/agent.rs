//! The agent: its options, and the worker, effects runner, maintenance and health it runs under one shutdown.

use std::time::Duration;

use txinbox::broker::Receiver;
use txinbox::driver::{EffectStore, MaintenanceStore};
use txinbox::health::{Health, HealthCheck};
use txinbox::settings::{EffectsSettings, WorkerSettings};
use txinbox::sqlx;
use txinbox::{
    ConsumerName, EffectRunner, IdentityPolicy, Inbox, LeasedDelivery, Maintenance,
    MaintenanceOptions, MonitorReport, OutcomeKind, RetentionPolicy, Store, Worker, WorkerOptions,
};

use crate::handler::{TASKS_PG, TASKS_SQLITE};
use crate::Error;
use crate::*;

/// Where and how the agent runs. Its `Debug` masks the store's password (`TXINBOX_STORE__URL` is where one
/// belongs, and it ends up in `store`).
#[derive(Clone)]
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

impl std::fmt::Debug for AgentOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentOptions")
            .field("store", &txinbox::error::redact_url(&self.store))
            .field("consumer", &self.consumer)
            .field("worker", &self.worker)
            .field("retry_backoff", &self.retry_backoff)
            .field("effects", &self.effects)
            .field("maintenance_every", &self.maintenance_every)
            .field("retention", &self.retention)
            .field("max_connections", &self.max_connections)
            .field("health_addr", &self.health_addr)
            .field("store_settings", &self.store_settings)
            .finish()
    }
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

/// Runs the agent on `receiver` until SIGTERM or Ctrl-C, then drains (commit, then settle) and returns the
/// report.
pub async fn run<R>(receiver: R, opts: AgentOptions) -> Result<MonitorReport, Error>
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
) -> Result<MonitorReport, Error> {
    use txinbox::shards::{Shard, ShardRouter, Shards};
    use txinbox::store::StoreOptions;
    let resolved = opts.store_settings.resolved_shards()?;
    let mut stores = Vec::with_capacity(resolved.len());
    // Per shard: whether its schema is in place. A shard reached late answers its ping before its
    // migration has run; its check fails until then, so its deliveries wait instead of failing on tables
    // that are not there yet.
    let mut migrated = Vec::with_capacity(resolved.len());
    for shard in &resolved {
        let options = StoreOptions::new().max_connections(shard.max_connections);
        let done = std::sync::Arc::new(Migration::default());
        migrated.push(done.clone());
        // A URL that cannot be used at all (a bad port, an unknown option) stops the worker here, naming the
        // shard and what is wrong, as an unset variable does: read before any connection is tried, it is never
        // taken for a shard that is down. The driver's message is masked (it may quote the URL).
        let lazy = Store::<sqlx::Postgres>::connect_lazy_with(&shard.url, options.clone())
            .map_err(|e| {
                format!(
                    "shard {}: its URL cannot be used: {}",
                    shard.name,
                    txinbox::error::redact_secrets(&e.to_string())
                )
            })?;
        let store = match Store::<sqlx::Postgres>::connect_with(&shard.url, options).await {
            Ok(store) => {
                sqlx::query(TASKS_PG)
                    .execute(store.pool())
                    .await
                    .map_err(|e| format!("shard {}: {e}", shard.name))?;
                done.done.store(true, std::sync::atomic::Ordering::SeqCst);
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
                tracing::warn!(shard = %shard.name, error = %txinbox::error::redact_secrets(&e.to_string()), "{}: starting for the others; its deliveries are released until it answers", at_start(&e));
                let store = lazy;
                let (late, name) = (store.clone(), shard.name.clone());
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        let migrated = async {
                            late.migrate().await.map_err(|e| e.to_string())?;
                            sqlx::query(TASKS_PG)
                                .execute(late.pool())
                                .await
                                .map_err(|e| e.to_string())?;
                            Ok::<(), String>(())
                        };
                        match migrated.await {
                            Ok(()) => {
                                done.done.store(true, std::sync::atomic::Ordering::SeqCst);
                                tracing::info!(shard = %name, "shard reachable: migrated");
                                return;
                            }
                            // Reachable, and its migration failed: why, in readiness and once in the log
                            // (unreachable, the check says so itself).
                            Err(why) if late.check().await.is_ok() => done.failed(&name, why),
                            Err(_) => {}
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
        resolved
            .iter()
            .zip(&stores)
            .zip(&migrated)
            .map(|((r, store), done)| {
                let shard = Shard::new(r.name.clone(), base.on_store(store.clone()))
                    .claims(r.tenants.clone())
                    .check(shard_check(store.clone(), done.clone()));
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

/// What is wrong with a shard that could not be opened at start, for the log line (its URL was read already):
/// unreachable only when no connection could be made; a server that answered and refused (a password, a
/// database that is not there) or a schema this build cannot use is said so.
fn at_start(e: &txinbox::StoreError) -> &'static str {
    use txinbox::StoreError;
    match e {
        StoreError::Database(
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_),
        ) => "shard unreachable at start",
        StoreError::Database(sqlx::Error::Database(_)) => {
            "shard refused at start (it answered with an error)"
        }
        StoreError::Migration { .. }
        | StoreError::SchemaTooNew { .. }
        | StoreError::SchemaTooOld { .. } => "shard reachable at start, its schema cannot be used",
        _ => "shard cannot be used at start",
    }
}

/// A shard's readiness check: its store answers and its schema is in place. A shard reached late fails it until
/// its migration has run, so its deliveries wait instead of failing on tables that are not there yet; the
/// reason given is the store's own while it does not answer (`no connection: ...`), and `reachable, not
/// migrated yet` only once it does (`reachable, not migrated: why` when its migration failed).
fn shard_check(
    store: Store<sqlx::Postgres>,
    migrated: std::sync::Arc<Migration>,
) -> impl HealthCheck {
    move || {
        let (store, migrated) = (store.clone(), migrated.clone());
        async move {
            let checked = store.check().await;
            if !migrated.done.load(std::sync::atomic::Ordering::SeqCst) {
                // Not answering is the store's own reason; past its ping, its check fails on the inbox's
                // table that the migration has not made yet, which this says in its own words.
                if let Err(why) = &checked {
                    if why.starts_with("no connection:") || why.starts_with("no answer:") {
                        return checked;
                    }
                }
                return Err(match migrated.why() {
                    Some(why) => format!("reachable, not migrated: {why}"),
                    None => "reachable, not migrated yet".to_owned(),
                });
            }
            checked
        }
    }
}

/// Whether a shard's schema is in place, and why not when its migration failed.
#[derive(Default)]
struct Migration {
    done: std::sync::atomic::AtomicBool,
    failed: std::sync::Mutex<Option<String>>,
}

impl Migration {
    /// Records why the migration failed, logged when it differs from the last time.
    fn failed(&self, shard: &str, why: String) {
        let mut last = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_deref() != Some(why.as_str()) {
            tracing::warn!(shard, error = %why, "shard reachable, its migration failed: trying again");
        }
        *last = Some(why);
    }

    fn why(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
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
) -> MonitorReport
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
    let report = done.worker.clone().unwrap_or_default();
    tracing::info!(
        applied = report.count(OutcomeKind::Applied),
        duplicates = report.count(OutcomeKind::Duplicate),
        business_duplicates = report.count(OutcomeKind::BusinessDuplicate),
        dead_lettered =
            report.count(OutcomeKind::DeadLettered) + report.count(OutcomeKind::PayloadCollision),
        leases_lost = report.leases_lost,
        "worker stopped"
    );
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard that cannot be reached at start is said to be unreachable, with the driver's reason and never
    /// its password, not `reachable, not migrated yet`, in readiness and in the probe's log line.
    #[tokio::test]
    async fn a_shard_unreachable_at_start_is_not_said_to_be_reachable() {
        use txinbox::store::StoreOptions;
        // Nothing listens on port 1: every connection is refused.
        let store = Store::<sqlx::Postgres>::connect_lazy_with(
            "postgres://crm:s3cretpw@127.0.0.1:1/crm",
            StoreOptions::new().max_connections(1),
        )
        .unwrap();
        let migrated = std::sync::Arc::new(Migration::default());
        let why = shard_check(store, migrated).check().await.unwrap_err();
        assert!(!why.contains("reachable"), "{why}");
        assert!(why.contains("no connection"), "{why}");
        assert!(!why.contains("s3cretpw"), "{why}");
    }

    /// A shard that answers but whose migration failed (a permission, a schema newer than this build) says why in
    /// readiness, not only `reachable, not migrated yet`.
    #[tokio::test]
    async fn a_reachable_shard_whose_migration_failed_says_why() {
        use txinbox::store::StoreOptions;
        let url = std::env::var("TXINBOX_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        // A schema of its own, made but not migrated: the shard as a worker reaches it late.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let schema = format!("t_agent_{}_{nanos}", std::process::id());
        let admin = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query(&format!("CREATE SCHEMA \"{schema}\""))
            .execute(&admin)
            .await
            .unwrap();
        let store = Store::<sqlx::Postgres>::connect_lazy_with(
            &url,
            StoreOptions::new().max_connections(1).schema(&schema),
        )
        .unwrap();
        let migrated = std::sync::Arc::new(Migration::default());
        let check = shard_check(store.clone(), migrated.clone());
        assert_eq!(
            check.check().await.unwrap_err(),
            "reachable, not migrated yet",
            "PostgreSQL at TXINBOX_TEST_PG_URL"
        );
        migrated.failed(
            "eu-1",
            "migration 6 failed: permission denied for schema public".into(),
        );
        let why = check.check().await.unwrap_err();
        assert!(
            why.starts_with("reachable, not migrated: ") && why.contains("permission denied"),
            "{why}"
        );
        store.migrate().await.unwrap();
        migrated
            .done
            .store(true, std::sync::atomic::Ordering::SeqCst);
        check.check().await.unwrap();
        store.close().await;
        sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .execute(&admin)
            .await
            .unwrap();
    }

    /// The options in a log line (`{:?}`) never show a password: the store's (from `TXINBOX_STORE__URL`) nor a
    /// shard's.
    #[test]
    fn debug_never_shows_a_password() {
        let one =
            WorkerSettings::from_toml_str("[store]\nurl = \"postgres://crm:st0repw@db/crm\"\n")
                .unwrap();
        let sharded = WorkerSettings::from_toml_str(
            "[store.shards.eu-1]\nurl = \"postgres://crm:sh4rdpw@db-eu-1/crm\"\nrest = true\n",
        )
        .unwrap();
        for s in [one, sharded] {
            let shown = format!("{:?}", AgentOptions::from_settings(&s, None));
            assert!(
                !shown.contains("st0repw") && !shown.contains("sh4rdpw"),
                "{shown}"
            );
            assert!(shown.contains("crm:***@db"), "{shown}");
        }
    }

    /// A shard whose URL cannot be used at all stops the agent with an error that names the shard and says its
    /// URL is what is wrong (and never shows the URL), not the driver's bare `invalid port number`; nothing
    /// before it calls the shard unreachable.
    #[tokio::test]
    async fn a_shard_whose_url_cannot_be_used_is_named_in_the_error() {
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let writer = {
            let logs = logs.clone();
            move || Captured(logs.clone())
        };
        let _guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(writer)
                .with_ansi(false)
                .finish(),
        );
        let settings = WorkerSettings::from_toml_str(
            "[store.shards.eu-2]\nurl = \"postgres://crm:s3cretpw@127.0.0.1:notaport/crm\"\nrest = true\n",
        )
        .unwrap();
        let queue = txinbox::mem::MemoryQueue::new(txinbox::mem::QueueOptions::default());
        let e = run(
            queue.receiver(),
            AgentOptions::from_settings(&settings, None),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("shard eu-2") && e.contains("URL"), "{e}");
        assert!(!e.contains("s3cretpw"), "{e}");
        let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
        assert!(!logs.contains("unreachable"), "{logs}");
        assert!(!logs.contains("s3cretpw"), "{logs}");
    }

    /// What the log says of a shard that could not be opened at start: unreachable only when no connection
    /// could be made.
    #[test]
    fn a_shard_that_cannot_be_opened_is_said_unreachable_only_without_a_connection() {
        use txinbox::StoreError;
        let refused = StoreError::Database(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert!(at_start(&refused).contains("unreachable"));
        assert!(at_start(&StoreError::Database(sqlx::Error::PoolTimedOut)).contains("unreachable"));
        let protocol = StoreError::Database(sqlx::Error::Protocol("bad".into()));
        assert!(
            !at_start(&protocol).contains("unreachable"),
            "{}",
            at_start(&protocol)
        );
        let newer = StoreError::SchemaTooNew { found: 9, known: 8 };
        assert!(at_start(&newer).contains("schema"), "{}", at_start(&newer));
    }

    /// A log line's writer appending to a shared buffer.
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
