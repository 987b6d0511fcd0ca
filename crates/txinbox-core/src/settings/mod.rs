//! One settings file for the worker and for `txinbox check-infra`.
//!
//! A worker runs from a TOML file (every key optional; an unknown key is an error, so a typo is never ignored)
//! with environment overrides, and `txinbox check-infra --config FILE` checks the Terraform against **the same
//! file, read by the same code**: the values it validates are the values the worker runs with. Defaults live
//! here and nowhere else (the adapters' own defaults are tied to them by a test).
//!
//! ```toml
//! [worker]
//! consumer = "crm-followup"            # part of every inbox key
//! concurrency = 8
//! receive_max = 10                     # messages asked for per receive (unset: [sqs] batch_size, else 10)
//! prefetch = 0                         # received ahead of a free slot (0: only for free slots)
//! receive_loops = 4                    # receives in flight at once, sharing the same slots (1 to 16;
//!                                      # unset: enough for every place out of the queue)
//! batch_commit = 1                     # deliveries of a receive applied in one transaction (1 to 64)
//! batch_linger_ms = 0                  # how long a batch not full waits for the next receives (at most 1000)
//! shutdown_timeout_seconds = 30
//! health_addr = "0.0.0.0:8080"         # GET /livez, /readyz (unset: off)
//! metrics_addr = "0.0.0.0:9464"        # GET /metrics (unset: off)
//! give_up_after_seconds = 300          # exit when receives fail this long with a fatal error (0: never)
//!
//! [store]
//! url = "postgres://app@db/app"        # or sqlite:crm.db; a password belongs in TXINBOX_STORE__URL
//! max_connections = 10
//! # or several PostgreSQL stores, each holding some tenants' data (see ShardSettings):
//! # [store.shards.eu-1]
//! # url_env = "CRM_DB_EU_1_URL"
//! # tenants = ["acme", "globex"]
//!
//! [inbox]
//! retention_seconds = 2592000          # how long a processed marker is kept (30 d)
//! redrive_grace_seconds = 604800       # how long an operator may take to redrive a dead letter (7 d)
//!
//! [sqs]
//! queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/crm-events.fifo"
//! dead_letter_queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/crm-events-dlq.fifo"
//! batch_size = 10
//! wait_time_seconds = 20               # long poll
//! visibility_timeout_seconds = 60      # renewed every third of it
//! max_extension_seconds = 7200
//! queue_retention_seconds = 345600     # 4 d
//! dlq_retention_seconds = 1209600      # 14 d
//! max_receive_count = 5
//! producers_send_deduplication_id = true
//! identity = "cloudevents"             # or "deduplication-id"
//!
//! [servicebus]
//! namespace = "crm-prod"               # or a full host name
//! queue = "crm-events"
//! dead_letter_to = "crm-events-poison"
//! lock_duration_seconds = 60           # PT1M, renewed every third of it
//! max_delivery_count = 10
//! duplicate_detection_window_seconds = 600   # PT10M
//! default_message_ttl_seconds = 1209600      # P14D
//! dead_lettering_on_message_expiration = true
//!
//! [effects]                            # the effect runner beside the worker
//! claim_seconds = 60
//!
//! [effects.destinations.crm]           # one HTTP destination: see EffectsSettings
//! url = "https://crm.example/v1/tasks"
//! key = "header:Idempotency-Key"
//! confirm = { url = "https://crm.example/v1/tasks?external_ref={external_ref}", rule = "search", found_at = "/data/0/id" }
//! ```
//!
//! **Environment overrides**: `TXINBOX_<SECTION>__<KEY>=value` sets `[section] key` (upper or lower case; the
//! value is read as a TOML integer or boolean when it parses as one, else as a string), for example
//! `TXINBOX_SQS__VISIBILITY_TIMEOUT_SECONDS=120` or `TXINBOX_STORE__URL=postgres://...` (the way to keep a
//! password out of the file). An override of a key that does not exist is an error naming the variable.
//!
//! ```
//! use txinbox_core::settings::WorkerSettings;
//! let s = WorkerSettings::from_toml_str("[sqs]\nvisibility_timeout_seconds = 90\n").unwrap();
//! assert_eq!(s.sqs.visibility_timeout_seconds, 90);
//! assert_eq!(s.sqs.heartbeat_interval(), std::time::Duration::from_secs(30)); // a third, as the worker renews
//! assert_eq!(s.inbox.retention_seconds, 2_592_000);
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod effects;

pub use effects::{ConfirmSettings, EffectsSettings, HttpDestinationSettings};

use crate::pipeline::retention::RetentionPolicy;
use crate::runtime::lease::LeaseOptions;
use crate::runtime::worker::WorkerOptions;

/// The prefix of environment overrides (`TXINBOX_<SECTION>__<KEY>`).
pub const ENV_PREFIX: &str = "TXINBOX_";

/// A settings file that cannot be used. Every variant names the file or variable and the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The file cannot be read.
    #[error("cannot read the settings file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file (with its overrides) is not valid: bad TOML, an unknown key, a value of the wrong type.
    #[error("invalid settings in {origin}: {source}")]
    Invalid {
        /// The file, and the overrides applied to it.
        origin: String,
        /// The TOML error (it names the key and, for the file, the line).
        #[source]
        source: toml::de::Error,
    },
    /// An environment override that cannot apply (`TXINBOX_FOO` without `__`, an unknown section).
    #[error("environment override {var}: {detail}")]
    Override {
        /// The variable's name (never its value: it may hold a password).
        var: String,
        /// Why.
        detail: String,
    },
    /// Two settings disagree, or a value is out of range.
    #[error("invalid setting {key} in {origin}: {detail}")]
    Value {
        /// `section.key`.
        key: &'static str,
        /// The file (and overrides).
        origin: String,
        /// Why.
        detail: String,
    },
}

/// The whole settings file: see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WorkerSettings {
    /// The worker (`[worker]`).
    pub worker: WorkerSection,
    /// The store (`[store]`).
    pub store: StoreSettings,
    /// The inbox (`[inbox]`).
    pub inbox: InboxSettings,
    /// The SQS adapter and its queues (`[sqs]`).
    pub sqs: SqsSettings,
    /// The Azure Service Bus adapter and its queues (`[servicebus]`).
    pub servicebus: ServiceBusSettings,
    /// The effect runner and its HTTP destinations (`[effects]`).
    pub effects: EffectsSettings,
}

/// The worker's own settings (`[worker]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WorkerSection {
    /// The consumer name, part of every inbox key (`crm-followup`).
    pub consumer: String,
    /// Deliveries processed at once (8).
    pub concurrency: usize,
    /// Messages asked for in one receive (unset: `[sqs] batch_size` when an SQS queue is set, else 10). On
    /// SQS, more than `[sqs] batch_size` is received in concurrent `ReceiveMessage` calls once the queue has a
    /// backlog. On Service Bus, `ServiceBusOptions::batch_size` caps a receive: set it to this (the example
    /// worker does).
    pub receive_max: Option<usize>,
    /// Deliveries received ahead of a free slot (0: a receive asks only for free slots); up to
    /// `concurrency + prefetch` messages are out of the queue at once.
    pub prefetch: usize,
    /// Receive loops, each with one receive in flight at a time, sharing the worker's slots and its places
    /// out of the queue (1 to 16; unset: the worker chooses enough for every place out of the queue to be in
    /// a receive at once, `ceil((concurrency + prefetch) / receive_max)`).
    pub receive_loops: Option<usize>,
    /// Deliveries of one receive applied in one database transaction, each isolated from the others (1: one
    /// transaction per delivery; at most 64).
    pub batch_commit: usize,
    /// How long a batch that one receive did not fill waits for the following receives, in milliseconds (0:
    /// a batch is what one receive brought; at most 1000). Only with `batch_commit` above 1.
    pub batch_linger_ms: u64,
    /// How long in-flight deliveries may run after shutdown begins, in seconds (30).
    pub shutdown_timeout_seconds: u64,
    /// Serve `GET /livez` and `GET /readyz` on this address (unset: off).
    pub health_addr: Option<String>,
    /// Serve Prometheus metrics on this address (unset: off).
    pub metrics_addr: Option<String>,
    /// Run the maintenance (retention purge) beside the worker this often, in seconds (unset: another process
    /// purges).
    pub purge_interval_seconds: Option<u64>,
    /// Stop the worker when receives have failed this long with an error a retry cannot fix (a key rotated, a
    /// permission removed, the queue deleted), so that its supervisor sees it, in seconds (300; 0: never).
    pub give_up_after_seconds: u64,
}

impl Default for WorkerSection {
    fn default() -> Self {
        let w = WorkerOptions::default();
        Self {
            consumer: "crm-followup".into(),
            concurrency: w.concurrency,
            receive_max: None,
            prefetch: w.prefetch,
            receive_loops: None,
            batch_commit: w.batch_commit,
            batch_linger_ms: w.batch_linger.as_millis() as u64,
            shutdown_timeout_seconds: w.shutdown_timeout.as_secs(),
            health_addr: None,
            metrics_addr: None,
            purge_interval_seconds: None,
            give_up_after_seconds: w.give_up_after.map_or(0, |d| d.as_secs()),
        }
    }
}

/// The store (`[store]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreSettings {
    /// `sqlite:FILE` or `postgres://user@host/db` (`sqlite:txinbox.db`). Put a password in the environment
    /// (`TXINBOX_STORE__URL`), not in the file.
    pub url: String,
    /// Most connections in the pool (10); each shard's pool too, unless the shard sets its own.
    pub max_connections: u32,
    /// Several PostgreSQL stores behind one worker (`[store.shards.NAME]`), each delivery applied in the one that
    /// claims its tenant ([`crate::runtime::shards`]). Empty (the default): one store, `url`.
    pub shards: std::collections::BTreeMap<String, ShardSettings>,
    /// Refuse to start while a shard cannot be reached (false: start for the others; the unreachable shard's
    /// deliveries are released until it answers, and readiness names it).
    pub require_all_shards: bool,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            url: "sqlite:txinbox.db".into(),
            max_connections: 10,
            shards: Default::default(),
            require_all_shards: false,
        }
    }
}

/// One shard of the store (`[store.shards.NAME]`, the name a metric label: letters, digits, `-`, `_`, `.`).
///
/// ```toml
/// [store.shards.eu-1]
/// url_env = "CRM_DB_EU_1_URL"        # the variable holding postgres://user:password@host/db
/// tenants = ["acme", "globex"]
///
/// [store.shards.eu-2]
/// url = "postgres://crm@db-eu-2/crm" # a URL without a password may sit in the file
/// tenants = ["initech"]
/// rest = true                         # and every tenant no shard claims, and messages without a tenant
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ShardSettings {
    /// The shard's `postgres://` URL. A password belongs in the environment: use `url_env`.
    pub url: Option<String>,
    /// The name of the environment variable that holds the shard's URL (with its password).
    pub url_env: Option<String>,
    /// The tenants (`ce-tenantid`) whose data this shard holds.
    pub tenants: Vec<String>,
    /// This shard also takes every tenant no shard claims, and messages without a tenant (at most one shard).
    pub rest: bool,
    /// Most connections in this shard's pool (unset: `[store] max_connections`).
    pub max_connections: Option<u32>,
}

/// A shard of the settings with its URL resolved ([`StoreSettings::resolved_shards`]).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResolvedShard {
    /// The shard's name.
    pub name: String,
    /// Its URL (it may hold a password: never log it).
    pub url: String,
    /// The tenants it claims.
    pub tenants: Vec<String>,
    /// Whether it takes the rest.
    pub rest: bool,
    /// Its pool size.
    pub max_connections: u32,
}

impl std::fmt::Debug for ResolvedShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedShard")
            .field("name", &self.name)
            .field("url", &"<redacted>")
            .field("tenants", &self.tenants)
            .field("rest", &self.rest)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

impl StoreSettings {
    /// The shards with their URLs, `url_env` read from the process's environment. An unset variable is an
    /// error that names it (never a value).
    ///
    /// # Errors
    /// [`SettingsError::Override`] naming the variable that is not set.
    pub fn resolved_shards(&self) -> Result<Vec<ResolvedShard>, SettingsError> {
        self.resolved_shards_with(|var| std::env::var(var).ok())
    }

    /// [`resolved_shards`](Self::resolved_shards) reading variables through `env`.
    ///
    /// # Errors
    /// See [`resolved_shards`](Self::resolved_shards).
    pub fn resolved_shards_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<ResolvedShard>, SettingsError> {
        self.shards
            .iter()
            .map(|(name, s)| {
                let url = match (&s.url, &s.url_env) {
                    (_, Some(var)) => env(var).ok_or_else(|| SettingsError::Override {
                        var: var.clone(),
                        detail: format!("not set; [store.shards.{name}] url_env names it"),
                    })?,
                    (Some(url), None) => url.clone(),
                    (None, None) => {
                        return Err(SettingsError::Override {
                            var: format!("store.shards.{name}.url"),
                            detail: "the shard has no url and no url_env".into(),
                        })
                    }
                };
                Ok(ResolvedShard {
                    name: name.clone(),
                    url,
                    tenants: s.tenants.clone(),
                    rest: s.rest,
                    max_connections: s.max_connections.unwrap_or(self.max_connections).max(1),
                })
            })
            .collect()
    }
}

/// The inbox's settings (`[inbox]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct InboxSettings {
    /// How long the inbox keeps a processed marker, in seconds (30 days).
    pub retention_seconds: u64,
    /// How long an operator may take to redrive a dead letter once it reached the dead-letter queue, in
    /// seconds (7 days). The longest redelivery path is the queue's retention, then the dead-letter queue's,
    /// then this: the inbox retention must cover the three together.
    pub redrive_grace_seconds: u64,
}

impl Default for InboxSettings {
    fn default() -> Self {
        Self {
            retention_seconds: RetentionPolicy::default().keep.as_secs(),
            redrive_grace_seconds: 7 * 86_400,
        }
    }
}

/// Where an SQS consumer's identity comes from (`[sqs] identity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum SqsIdentity {
    /// `"cloudevents"` (the default): producers set `ce-id` and `ce-source` on every message, which survive
    /// every move.
    #[default]
    Cloudevents,
    /// `"deduplication-id"`: a message without CloudEvents attributes takes its `MessageDeduplicationId` as its
    /// identity, which AWS replaces when it moves a message to a FIFO dead-letter queue (the adapter's
    /// `SqsOptions::deduplication_id_identity(true)`).
    DeduplicationId,
}

/// The SQS adapter's settings (`[sqs]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SqsSettings {
    /// The queue's URL (the Terraform output `queue_url`).
    pub queue_url: Option<String>,
    /// Where the worker forwards payload collisions and permanent errors (the Terraform output
    /// `dead_letter_queue_url`); unset: the adapter resolves the queue's `RedrivePolicy` target.
    pub dead_letter_queue_url: Option<String>,
    /// Messages per `ReceiveMessage` call (10).
    pub batch_size: u32,
    /// Long-poll wait, in seconds (20).
    pub wait_time_seconds: u64,
    /// Visibility timeout set on every receive and renewal, in seconds (60). The worker renews every third.
    pub visibility_timeout_seconds: u64,
    /// How often the visibility of a message in progress is extended, in seconds. The worker renews every third
    /// of the visibility timeout: leave it unset, or set exactly that (anything else is refused, because no
    /// worker would run with it).
    pub heartbeat_interval_seconds: Option<u64>,
    /// The longest total extension of one message, in seconds (2 h).
    pub max_extension_seconds: u64,
    /// Retention of the queue, in seconds (4 days).
    pub queue_retention_seconds: u64,
    /// Retention of the dead-letter queue, in seconds (14 days).
    pub dlq_retention_seconds: u64,
    /// Receives before a message moves to the dead-letter queue (5).
    pub max_receive_count: u32,
    /// Producers send an explicit `MessageDeduplicationId` (true), so the queue must not use content-based
    /// deduplication.
    pub producers_send_deduplication_id: bool,
    /// Where the consumer's identity comes from ([`SqsIdentity::Cloudevents`]).
    pub identity: SqsIdentity,
}

impl Default for SqsSettings {
    fn default() -> Self {
        Self {
            queue_url: None,
            dead_letter_queue_url: None,
            batch_size: 10,
            wait_time_seconds: 20,
            visibility_timeout_seconds: 60,
            heartbeat_interval_seconds: None,
            max_extension_seconds: LeaseOptions::default().max_total.as_secs(),
            queue_retention_seconds: 4 * 86_400,
            dlq_retention_seconds: 14 * 86_400,
            max_receive_count: 5,
            producers_send_deduplication_id: true,
            identity: SqsIdentity::Cloudevents,
        }
    }
}

impl SqsSettings {
    /// How often the worker extends a message's visibility: a third of the visibility timeout.
    pub fn heartbeat_interval(&self) -> Duration {
        crate::runtime::lease::renewal_interval(Duration::from_secs(
            self.visibility_timeout_seconds,
        ))
    }
}

/// The Azure Service Bus adapter's settings (`[servicebus]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ServiceBusSettings {
    /// The namespace (`crm-prod` or `crm-prod.servicebus.windows.net`; the Terraform output `namespace`).
    pub namespace: Option<String>,
    /// The queue (the Terraform output `queue_name`).
    pub queue: Option<String>,
    /// Lock duration the queue has, in seconds (`PT1M`). The worker renews every third of it.
    pub lock_duration_seconds: u64,
    /// How often the lock of a message in progress is renewed, in seconds: unset, or exactly a third of the
    /// lock duration (what the worker does).
    pub lock_renewal_interval_seconds: Option<u64>,
    /// Deliveries before Service Bus dead-letters a message (10).
    pub max_delivery_count: u32,
    /// Duplicate detection window, in seconds (`PT10M`).
    pub duplicate_detection_window_seconds: u64,
    /// Default message time to live, in seconds (`P14D`).
    pub default_message_ttl_seconds: u64,
    /// Expired messages are dead-lettered (true).
    pub dead_lettering_on_message_expiration: bool,
    /// The poison queue the worker forwards dead letters to (`ServiceBusOptions::dead_letter_to`; the
    /// Terraform output `poison_queue_name`); unset: `{queue}-poison` when the Terraform declares such a
    /// queue, and no forward otherwise.
    pub dead_letter_to: Option<String>,
}

impl Default for ServiceBusSettings {
    fn default() -> Self {
        Self {
            namespace: None,
            queue: None,
            lock_duration_seconds: 60,
            lock_renewal_interval_seconds: None,
            max_delivery_count: 10,
            duplicate_detection_window_seconds: 600,
            default_message_ttl_seconds: 14 * 86_400,
            dead_lettering_on_message_expiration: true,
            dead_letter_to: None,
        }
    }
}

impl ServiceBusSettings {
    /// How often the worker renews a lock: a third of the lock duration.
    pub fn lock_renewal_interval(&self) -> Duration {
        crate::runtime::lease::renewal_interval(Duration::from_secs(self.lock_duration_seconds))
    }
}

impl WorkerSettings {
    /// Parses settings from TOML text (no environment overrides); absent keys keep their defaults.
    ///
    /// # Errors
    /// [`SettingsError::Invalid`] for bad TOML, an unknown key or a wrong type; [`SettingsError::Value`] when
    /// settings disagree.
    pub fn from_toml_str(text: &str) -> Result<Self, SettingsError> {
        Self::parse(text, "<text>".into(), std::iter::empty())
    }

    /// Reads `path` and applies the process's `TXINBOX_<SECTION>__<KEY>` overrides: what a worker and
    /// `check-infra` both call.
    ///
    /// # Errors
    /// See [`SettingsError`]; every error names the file or the variable, and the key.
    pub fn load(path: &Path) -> Result<Self, SettingsError> {
        Self::load_with_env(path, std::env::vars())
    }

    /// [`load`](Self::load) with the overrides taken from `env` (name, value) instead of the process.
    ///
    /// # Errors
    /// See [`load`](Self::load).
    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path.display().to_string(), env)
    }

    /// The defaults with the process's environment overrides only (no file).
    ///
    /// # Errors
    /// See [`load`](Self::load).
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::parse("", "<defaults>".into(), std::env::vars())
    }

    fn parse(
        text: &str,
        origin: String,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, SettingsError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|source| SettingsError::Invalid {
                origin: origin.clone(),
                source,
            })?;
        let mut applied = Vec::new();
        let mut overrides: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.len() > ENV_PREFIX.len() && k.starts_with(ENV_PREFIX))
            .collect();
        overrides.sort();
        for (var, value) in overrides {
            let rest = &var[ENV_PREFIX.len()..];
            let Some((section, key)) = rest.split_once("__") else {
                // Other TXINBOX_ variables (TXINBOX_CRM_URL, ...) are not settings.
                continue;
            };
            let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
            if !["worker", "store", "inbox", "sqs", "servicebus", "effects"]
                .contains(&section.as_str())
            {
                return Err(SettingsError::Override {
                    var,
                    detail: format!(
                        "no section [{section}] (worker, store, inbox, sqs, servicebus, effects)"
                    ),
                });
            }
            if key.is_empty() {
                return Err(SettingsError::Override {
                    var,
                    detail: "no key after `__`".into(),
                });
            }
            let entry = table
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let toml::Value::Table(t) = entry else {
                return Err(SettingsError::Override {
                    var,
                    detail: format!("[{section}] is not a table in the file"),
                });
            };
            t.insert(key, scalar(&value));
            applied.push((var, value));
        }
        let origin = if applied.is_empty() {
            origin
        } else {
            let names: Vec<&str> = applied.iter().map(|(v, _)| v.as_str()).collect();
            format!("{origin} with {}", names.join(", "))
        };
        let s: Self = table.try_into().map_err(|source: toml::de::Error| {
            // A TOML type error quotes the value; an override's value may be a password, so such an error is
            // reported without it, naming the variable instead.
            let msg = source.to_string();
            match applied
                .iter()
                .find(|(_, value)| !value.is_empty() && msg.contains(value.as_str()))
            {
                Some((var, value)) => SettingsError::Override {
                    var: var.clone(),
                    detail: msg.replace(value.as_str(), "<redacted>").trim().to_owned(),
                },
                None => SettingsError::Invalid {
                    origin: origin.clone(),
                    source,
                },
            }
        })?;
        s.validate(&origin)?;
        Ok(s)
    }

    fn validate(&self, origin: &str) -> Result<(), SettingsError> {
        let bad = |key: &'static str, detail: String| {
            Err(SettingsError::Value {
                key,
                origin: origin.to_owned(),
                detail,
            })
        };
        if let Some(h) = self.sqs.heartbeat_interval_seconds {
            let derived = self.sqs.heartbeat_interval();
            if Duration::from_secs(h) != derived {
                return bad(
                    "sqs.heartbeat_interval_seconds",
                    format!(
                        "{h} s, but the worker extends the visibility every third of visibility_timeout_seconds ({} s = {derived:?}): remove the key or set it to that",
                        self.sqs.visibility_timeout_seconds
                    ),
                );
            }
        }
        if let Some(r) = self.servicebus.lock_renewal_interval_seconds {
            let derived = self.servicebus.lock_renewal_interval();
            if Duration::from_secs(r) != derived {
                return bad(
                    "servicebus.lock_renewal_interval_seconds",
                    format!(
                        "{r} s, but the worker renews the lock every third of lock_duration_seconds ({} s = {derived:?}): remove the key or set it to that",
                        self.servicebus.lock_duration_seconds
                    ),
                );
            }
        }
        if !self.store.shards.is_empty() {
            for (name, shard) in &self.store.shards {
                match (&shard.url, &shard.url_env) {
                    (Some(_), Some(_)) => {
                        return bad(
                            "store.shards",
                            format!("shard {name:?} sets both url and url_env: keep one"),
                        )
                    }
                    (None, None) => {
                        return bad(
                            "store.shards",
                            format!("shard {name:?} has no url and no url_env"),
                        )
                    }
                    (Some(url), None) if !url.starts_with("postgres") => {
                        return bad(
                            "store.shards",
                            format!(
                                "shard {name:?}: shards are PostgreSQL stores (postgres://...)"
                            ),
                        )
                    }
                    _ => {}
                }
            }
            if let Err(e) = crate::runtime::shards::check_shards(
                self.store
                    .shards
                    .iter()
                    .map(|(n, s)| (n.as_str(), s.tenants.as_slice(), s.rest)),
            ) {
                return bad("store.shards", e.to_string());
            }
        }
        if self.worker.concurrency == 0 {
            return bad("worker.concurrency", "must be at least 1".into());
        }
        if self.worker.receive_max == Some(0) {
            return bad("worker.receive_max", "must be at least 1".into());
        }
        if !(1..=crate::runtime::worker::MAX_BATCH_COMMIT).contains(&self.worker.batch_commit) {
            return bad(
                "worker.batch_commit",
                format!(
                    "{} is outside 1..={} (PostgreSQL keeps at most 64 subtransactions in shared memory)",
                    self.worker.batch_commit,
                    crate::runtime::worker::MAX_BATCH_COMMIT
                ),
            );
        }
        if let Some(n) = self.worker.receive_loops {
            if !(1..=crate::runtime::worker::MAX_RECEIVE_LOOPS).contains(&n) {
                return bad(
                    "worker.receive_loops",
                    format!(
                        "{n} is outside 1..={} (unset: the worker chooses)",
                        crate::runtime::worker::MAX_RECEIVE_LOOPS
                    ),
                );
            }
        }
        let linger_max = crate::runtime::worker::MAX_BATCH_LINGER.as_millis() as u64;
        if self.worker.batch_linger_ms > linger_max {
            return bad(
                "worker.batch_linger_ms",
                format!(
                    "{} is above {linger_max} (a larger receive_max gathers a batch better than a longer wait)",
                    self.worker.batch_linger_ms
                ),
            );
        }
        if self.store.max_connections == 0 {
            return bad("store.max_connections", "must be at least 1".into());
        }
        if crate::ConsumerName::new(&self.worker.consumer).is_err() {
            return bad(
                "worker.consumer",
                "must be a valid consumer name (non-empty, no control characters)".into(),
            );
        }
        for (key, addr) in [
            ("worker.health_addr", &self.worker.health_addr),
            ("worker.metrics_addr", &self.worker.metrics_addr),
        ] {
            if let Some(a) = addr {
                if a.parse::<std::net::SocketAddr>().is_err() {
                    return bad(key, format!("`{a}` is not an address like 0.0.0.0:8080"));
                }
            }
        }
        Ok(())
    }

    /// The worker's options: concurrency, messages per receive (`receive_max`, else the SQS batch when an SQS
    /// queue is set), prefetch, receive loops, batch commit and linger, shutdown timeout, the longest lease hold, and when to give up on
    /// persistent receive errors.
    pub fn worker_options(&self) -> WorkerOptions {
        let give_up = self.worker.give_up_after_seconds;
        let mut o = WorkerOptions::default()
            .concurrency(self.worker.concurrency)
            .prefetch(self.worker.prefetch)
            .batch_commit(self.worker.batch_commit)
            .batch_linger(Duration::from_millis(self.worker.batch_linger_ms))
            .shutdown_timeout(Duration::from_secs(self.worker.shutdown_timeout_seconds))
            .give_up_after((give_up > 0).then(|| Duration::from_secs(give_up)));
        if self.sqs.queue_url.is_some() {
            o = o.batch_size(self.sqs.batch_size as usize).lease(
                LeaseOptions::default()
                    .max_total(Duration::from_secs(self.sqs.max_extension_seconds)),
            );
        }
        if let Some(n) = self.worker.receive_max {
            o = o.batch_size(n);
        }
        if let Some(n) = self.worker.receive_loops {
            o = o.receive_loops(n);
        }
        o
    }

    /// The retention policy (`[inbox] retention_seconds`).
    pub fn retention(&self) -> RetentionPolicy {
        RetentionPolicy::default().keep(Duration::from_secs(self.inbox.retention_seconds))
    }

    /// `[worker] health_addr`, parsed (validated on load).
    pub fn health_addr(&self) -> Option<std::net::SocketAddr> {
        self.worker.health_addr.as_ref()?.parse().ok()
    }

    /// `[worker] metrics_addr`, parsed (validated on load).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.worker.metrics_addr.as_ref()?.parse().ok()
    }
}

/// An override's value as TOML: an integer or a boolean when it parses as one, else a string.
fn scalar(v: &str) -> toml::Value {
    if let Ok(i) = v.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(b) = v.parse::<bool>() {
        toml::Value::Boolean(b)
    } else {
        toml::Value::String(v.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shards_resolve_their_url_from_the_environment_and_bad_claims_are_one_line() {
        let s = WorkerSettings::from_toml_str(
            "[store]\nmax_connections = 6\n[store.shards.eu-1]\nurl_env = \"EU1\"\ntenants = [\"acme\", \"globex\"]\n[store.shards.eu-2]\nurl = \"postgres://crm@db-eu-2/crm\"\ntenants = [\"initech\"]\nrest = true\nmax_connections = 3\n",
        )
        .unwrap();
        let shards = s
            .store
            .resolved_shards_with(|v| {
                (v == "EU1").then(|| "postgres://crm:s3cret@db-eu-1/crm".into())
            })
            .unwrap();
        assert_eq!(shards.len(), 2);
        assert_eq!(shards[0].name, "eu-1");
        assert_eq!(shards[0].url, "postgres://crm:s3cret@db-eu-1/crm");
        assert_eq!(shards[0].max_connections, 6);
        assert!(!format!("{shards:?}").contains("s3cret"), "{shards:?}");
        assert!(shards[1].rest && shards[1].max_connections == 3);
        let unset = s
            .store
            .resolved_shards_with(|_| None)
            .unwrap_err()
            .to_string();
        assert!(
            unset.contains("EU1") && unset.contains("not set"),
            "{unset}"
        );

        let twice = WorkerSettings::from_toml_str(
            "[store.shards.a]\nurl = \"postgres://x@a/db\"\ntenants = [\"acme\"]\n[store.shards.b]\nurl = \"postgres://x@b/db\"\ntenants = [\"acme\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            twice.contains(r#"tenant "acme" is claimed by shard "a" and by shard "b""#),
            "{twice}"
        );
        for (text, says) in [
            ("[store.shards.a]\ntenants = [\"x\"]\n", "no url and no url_env"),
            (
                "[store.shards.a]\nurl = \"postgres://h/d\"\nurl_env = \"V\"\ntenants = [\"x\"]\n",
                "both url and url_env",
            ),
            ("[store.shards.a]\nurl = \"sqlite:a.db\"\ntenants = [\"x\"]\n", "PostgreSQL"),
            ("[store.shards.a]\nurl = \"postgres://h/d\"\n", "claims no tenant"),
            (
                "[store.shards.a]\nurl = \"postgres://h/d\"\nrest = true\n[store.shards.b]\nurl = \"postgres://h/e\"\nrest = true\n",
                "both take the unclaimed tenants",
            ),
        ] {
            let e = WorkerSettings::from_toml_str(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn defaults_come_from_the_library() {
        let s = WorkerSettings::default();
        let w = WorkerOptions::default();
        assert_eq!(s.worker.concurrency, w.concurrency);
        assert_eq!(
            s.worker.shutdown_timeout_seconds,
            w.shutdown_timeout.as_secs()
        );
        assert_eq!(
            s.inbox.retention_seconds,
            RetentionPolicy::default().keep.as_secs()
        );
        assert_eq!(s.sqs.heartbeat_interval(), Duration::from_secs(20));
        assert_eq!(
            s.servicebus.lock_renewal_interval(),
            Duration::from_secs(20)
        );
        assert_eq!(WorkerSettings::from_toml_str("").unwrap(), s);
    }

    #[test]
    fn overrides_set_keys_and_name_the_variable_when_they_cannot() {
        let dir = std::env::temp_dir().join(format!("txinbox-settings-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("worker.toml");
        std::fs::write(&f, "[sqs]\nvisibility_timeout_seconds = 60\n").unwrap();
        let s = WorkerSettings::load_with_env(
            &f,
            env(&[
                ("TXINBOX_SQS__VISIBILITY_TIMEOUT_SECONDS", "120"),
                ("txinbox_store__url", "postgres://u:secret@db/app"),
                ("TXINBOX_STORE__URL", "postgres://u:secret@db/app"),
                ("TXINBOX_CRM_URL", "http://crm"), // not a setting: ignored
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        assert_eq!(s.sqs.visibility_timeout_seconds, 120);
        assert_eq!(s.sqs.heartbeat_interval(), Duration::from_secs(40));
        assert_eq!(s.store.url, "postgres://u:secret@db/app");

        let e = WorkerSettings::load_with_env(
            &f,
            env(&[("TXINBOX_SQS__VISIBILTY_TIMEOUT_SECONDS", "120")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("worker.toml"), "{e}");
        assert!(e.contains("TXINBOX_SQS__VISIBILTY_TIMEOUT_SECONDS"), "{e}");
        assert!(e.contains("visibilty_timeout_seconds"), "{e}");

        let e = WorkerSettings::load_with_env(&f, env(&[("TXINBOX_QUEUE__URL", "x")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TXINBOX_QUEUE__URL") && e.contains("no section"),
            "{e}"
        );

        // The value of an override never appears in an error (it may be a password).
        let e = WorkerSettings::load_with_env(
            &f,
            env(&[("TXINBOX_STORE__MAX_CONNECTIONS", "hunter2")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("TXINBOX_STORE__MAX_CONNECTIONS"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_renewal_cadence_no_worker_would_run_is_refused() {
        let e = WorkerSettings::from_toml_str(
            "[sqs]\nvisibility_timeout_seconds = 60\nheartbeat_interval_seconds = 45\n",
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                SettingsError::Value {
                    key: "sqs.heartbeat_interval_seconds",
                    ..
                }
            ),
            "{e}"
        );
        WorkerSettings::from_toml_str(
            "[sqs]\nvisibility_timeout_seconds = 60\nheartbeat_interval_seconds = 20\n",
        )
        .unwrap();
        let e = WorkerSettings::from_toml_str("[servicebus]\nlock_renewal_interval_seconds = 59\n")
            .unwrap_err();
        assert!(
            e.to_string().contains("lock_renewal_interval_seconds"),
            "{e}"
        );
    }

    #[test]
    fn the_delivery_pipeline_keys_reach_the_worker_options() {
        let d = WorkerSettings::default().worker_options();
        let w = WorkerOptions::default();
        assert_eq!(
            (
                d.batch_size,
                d.prefetch,
                d.batch_commit,
                d.batch_linger,
                d.get_receive_loops()
            ),
            (
                w.batch_size,
                w.prefetch,
                w.batch_commit,
                w.batch_linger,
                w.get_receive_loops()
            )
        );
        let s = WorkerSettings::from_toml_str(
            "[worker]\nconcurrency = 32\nreceive_max = 20\nprefetch = 16\nbatch_commit = 10\nbatch_linger_ms = 25\nreceive_loops = 3\n[sqs]\nqueue_url = \"https://sqs.eu-west-1.amazonaws.com/1/q.fifo\"\nbatch_size = 10\n",
        )
        .unwrap();
        let o = s.worker_options();
        assert_eq!(
            (o.concurrency, o.batch_size, o.prefetch, o.batch_commit),
            (32, 20, 16, 10)
        );
        assert_eq!(
            (o.batch_linger, o.get_receive_loops()),
            (Duration::from_millis(25), 3)
        );
        // Without receive_max, the SQS batch is the receive.
        let o = WorkerSettings::from_toml_str(
            "[sqs]\nqueue_url = \"https://sqs.eu-west-1.amazonaws.com/1/q.fifo\"\nbatch_size = 4\n",
        )
        .unwrap()
        .worker_options();
        assert_eq!(o.batch_size, 4);
        for bad in [
            "[worker]\nbatch_commit = 65\n",
            "[worker]\nbatch_commit = 0\n",
            "[worker]\nreceive_max = 0\n",
            "[worker]\nbatch_linger_ms = 1001\n",
            "[worker]\nreceive_loops = 0\n",
            "[worker]\nreceive_loops = 17\n",
        ] {
            let e = WorkerSettings::from_toml_str(bad).unwrap_err().to_string();
            let key = bad.split('\n').nth(1).unwrap().split(' ').next().unwrap();
            assert!(e.contains(&format!("worker.{key}")), "{bad}: {e}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_addresses_name_the_key() {
        let e = WorkerSettings::from_toml_str("[inbox]\nretention_days = 30\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("retention_days"), "{e}");
        let e = WorkerSettings::from_toml_str("[worker]\nhealth_addr = \"localhost\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("worker.health_addr"), "{e}");
    }
}
