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
//! shutdown_timeout_seconds = 20        # + 5 s of grace, well under an orchestrator's 30 s
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
//! value is read as a TOML integer or boolean when it parses as one, else as a string, and as a string too
//! where the key takes one: `TXINBOX_WORKER__CONSUMER=2024`), for example
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

mod brokers;
mod effects;
mod load;
mod store;
#[cfg(test)]
mod tests;
mod validate;
mod worker;

pub use brokers::{ServiceBusSettings, SqsIdentity, SqsSettings};
pub use effects::{ConfirmSettings, EffectsSettings, HttpDestinationSettings};
pub use store::{ResolvedShard, ShardSettings, StoreSettings};
pub use worker::{InboxSettings, WorkerSection};

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
        /// The TOML error (it names the key and, for the file, the line), its secrets masked.
        #[source]
        source: TomlError,
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

/// A TOML error of a settings file, as TOML reported it (where, the key, the line it quotes, what was expected)
/// with the values it quotes masked: any of them may be a secret (a header's API key or bearer token, a
/// Service Bus key, a store URL's password). A string of the quoted line, or one a type error quotes, is shown
/// `***`, a URL [redacted](crate::error::redact_url) (its password and query values masked); a bare value
/// `***`, keys and booleans kept. A settings error is printed at start and lands in the logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TomlError(String);

impl TomlError {
    pub(crate) fn new(e: &toml::de::Error) -> Self {
        let text = e.to_string();
        let masked: Vec<String> = text
            .split('\n')
            .map(|line| match quoted_source(line) {
                Some(at) => format!("{}{}", &line[..at], mask_toml_line(&line[at..])),
                None => mask_quoted_values(line),
            })
            .collect();
        Self(crate::error::redact_secrets(&masked.join("\n")))
    }
}

/// Where the source text starts in a line of a TOML error that quotes the file (`3 | url = ...`).
fn quoted_source(line: &str) -> Option<usize> {
    let number = line.trim_start();
    let digits = number.len()
        - number
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .len();
    let rest = &number[digits..];
    (digits > 0 && rest.starts_with(" |")).then(|| {
        let at = line.len() - rest.len() + 2;
        at + usize::from(line[at..].starts_with(' '))
    })
}

/// A string's content as an error may show it: a URL redacted, anything else `***`.
fn masked_value(content: &str) -> String {
    if content.is_empty() {
        String::new()
    } else if content.contains("://") {
        crate::error::redact_url(content)
    } else {
        "***".into()
    }
}

/// A settings file's line with its values masked: strings and bare values ([`masked_value`]), comments. Keys
/// (what an `=` or a `.` follows, a table's header) and booleans are kept.
fn mask_toml_line(line: &str) -> String {
    // A table's header (`[effects.destinations.crm]`) holds names only; a line of an array may start with `[`
    // too, and its strings are values.
    let header = line.trim_start().starts_with('[') && !line.contains(['=', '"', '\'']);
    let is_key = |after: &str| {
        let next = after.trim_start();
        header || next.starts_with('=') || next.starts_with('.')
    };
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        match c {
            '"' | '\'' => {
                let body = &rest[1..];
                let mut escaped = false;
                let end = body.find(|ch: char| {
                    let close = ch == c && !escaped;
                    escaped = c == '"' && ch == '\\' && !escaped;
                    close
                });
                let (content, after) = match end {
                    Some(end) => (&body[..end], &body[end + 1..]),
                    None => (body, ""),
                };
                out.push(c);
                if is_key(after) {
                    out.push_str(content);
                } else {
                    out.push_str(&masked_value(content));
                }
                if end.is_some() {
                    out.push(c);
                }
                rest = after;
            }
            '#' => {
                out.push_str(if rest.len() > 1 { "# ***" } else { "#" });
                rest = "";
            }
            c if c.is_whitespace() || "=,{}[]".contains(c) => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
            _ => {
                let end = rest
                    .find(|ch: char| ch.is_whitespace() || "=,{}[]\"'#".contains(ch))
                    .unwrap_or(rest.len());
                let (word, after) = rest.split_at(end);
                if is_key(after) || word == "true" || word == "false" {
                    out.push_str(word);
                } else {
                    out.push_str(&masked_value(word));
                }
                rest = after;
            }
        }
    }
    out
}

/// A line of a TOML error's message with the values it quotes masked: strings (`invalid type: string "..."`)
/// and numbers (`integer `...``, `floating point `...``). What stands between backticks otherwise (a key, the
/// tokens expected) is kept.
fn mask_quoted_values(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find(['"', '`']) {
        let (head, tail) = rest.split_at(at);
        out.push_str(head);
        let quote = if tail.starts_with('"') { '"' } else { '`' };
        let body = &tail[1..];
        let mut escaped = false;
        let end = body.find(|ch: char| {
            let close = ch == quote && !escaped;
            escaped = quote == '"' && ch == '\\' && !escaped;
            close
        });
        let (content, after) = match end {
            Some(end) => (&body[..end], &body[end + 1..]),
            None => (body, ""),
        };
        let value = quote == '"'
            || ["integer ", "floating point ", "character "]
                .iter()
                .any(|what| out.ends_with(what));
        out.push(quote);
        if value {
            out.push_str(&masked_value(content));
        } else {
            out.push_str(content);
        }
        if end.is_some() {
            out.push(quote);
        }
        rest = after;
    }
    out.push_str(rest);
    out
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
