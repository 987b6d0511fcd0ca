//! The worker settings the Terraform is checked against.

use std::path::Path;

use serde::Deserialize;

use crate::CheckError;

/// The txinbox worker's settings that the queue configuration must agree with.
///
/// [`WorkerSettings::default()`] holds the worker's defaults. A TOML file
/// (`txinbox check-infra --config FILE`) overrides any of them; every key is
/// optional and an unknown key is an error (so a typo is not silently ignored):
///
/// ```toml
/// [inbox]
/// retention_seconds = 2592000          # how long a processed marker is kept (30 d)
/// redrive_grace_seconds = 604800       # how long an operator may take to redrive a dead letter (7 d)
///
/// [sqs]
/// batch_size = 10
/// wait_time_seconds = 20               # long poll
/// visibility_timeout_seconds = 60
/// heartbeat_interval_seconds = 20      # visibility is extended this often
/// max_extension_seconds = 7200
/// queue_retention_seconds = 345600     # 4 d
/// dlq_retention_seconds = 1209600      # 14 d
/// max_receive_count = 5
/// producers_send_deduplication_id = true
/// identity = "cloudevents"             # or "deduplication-id": where the consumer's identity comes from
///
/// [servicebus]
/// lock_duration_seconds = 60           # PT1M
/// lock_renewal_interval_seconds = 20
/// max_delivery_count = 10
/// duplicate_detection_window_seconds = 600   # PT10M
/// default_message_ttl_seconds = 1209600      # P14D
/// dead_lettering_on_message_expiration = true
/// # dead_letter_to = "orders-poison"   # the poison queue dead letters are forwarded to
/// #                                    # (unset: `{queue}-poison` when the Terraform declares it)
/// ```
///
/// The rules read `inbox.retention_seconds`, `inbox.redrive_grace_seconds`,
/// `sqs.heartbeat_interval_seconds`, `sqs.producers_send_deduplication_id`, `sqs.identity`,
/// `servicebus.lock_renewal_interval_seconds` and `servicebus.dead_letter_to`; the other keys describe the
/// adapters' defaults, which the sample Terraform mirrors. The worker renews
/// a lease every third of its duration (the visibility timeout, the lock
/// duration), so the two renewal intervals default to a third of those; a
/// test ties every default here to the adapters' own.
///
/// ```
/// let s = txinbox_infra::WorkerSettings::from_toml_str(
///     "[sqs]\nheartbeat_interval_seconds = 30\n",
/// )
/// .unwrap();
/// assert_eq!(s.sqs.heartbeat_interval_seconds, 30);
/// assert_eq!(s.inbox.retention_seconds, 2_592_000);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WorkerSettings {
    /// The inbox (`[inbox]`).
    pub inbox: InboxSettings,
    /// The SQS adapter (`[sqs]`).
    pub sqs: SqsSettings,
    /// The Azure Service Bus adapter (`[servicebus]`).
    pub servicebus: ServiceBusSettings,
}

/// The inbox's settings (`[inbox]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct InboxSettings {
    /// How long the inbox keeps a processed marker, in seconds (30 days).
    pub retention_seconds: u64,
    /// How long an operator may take to redrive a dead letter once it reached the dead-letter queue, in
    /// seconds (7 days). The longest redelivery path is the queue's retention, then the dead-letter
    /// queue's, then this: the inbox retention must cover the three together.
    pub redrive_grace_seconds: u64,
}

impl Default for InboxSettings {
    fn default() -> Self {
        Self {
            retention_seconds: 30 * 86_400,
            redrive_grace_seconds: 7 * 86_400,
        }
    }
}

/// Where an SQS consumer's identity comes from (`[sqs] identity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum SqsIdentity {
    /// `"cloudevents"` (the default): producers set `ce-id` and `ce-source` on every message, which
    /// survive every move (the deduplication id is only a fallback).
    #[default]
    Cloudevents,
    /// `"deduplication-id"`: the identity is the producer's `MessageDeduplicationId`, which AWS replaces
    /// when it moves a message to a FIFO dead-letter queue, so it does not survive the redrive path.
    DeduplicationId,
}

/// The SQS adapter's settings (`[sqs]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SqsSettings {
    /// Messages per `ReceiveMessage` call (10).
    pub batch_size: u32,
    /// Long-poll wait, in seconds (20).
    pub wait_time_seconds: u64,
    /// Visibility timeout the queue should have, in seconds (60).
    pub visibility_timeout_seconds: u64,
    /// How often the visibility of a message in progress is extended, in seconds (20: a third of the
    /// visibility timeout, as the worker derives it).
    pub heartbeat_interval_seconds: u64,
    /// The longest total extension of one message, in seconds (2 h).
    pub max_extension_seconds: u64,
    /// Retention of the queue, in seconds (4 days).
    pub queue_retention_seconds: u64,
    /// Retention of the dead-letter queue, in seconds (14 days).
    pub dlq_retention_seconds: u64,
    /// Receives before a message moves to the dead-letter queue (5).
    pub max_receive_count: u32,
    /// Producers send an explicit `MessageDeduplicationId` (true), so the
    /// queue must not use content-based deduplication.
    pub producers_send_deduplication_id: bool,
    /// Where the consumer's identity comes from ([`SqsIdentity::Cloudevents`]).
    pub identity: SqsIdentity,
}

impl Default for SqsSettings {
    fn default() -> Self {
        Self {
            batch_size: 10,
            wait_time_seconds: 20,
            visibility_timeout_seconds: 60,
            heartbeat_interval_seconds: 20,
            max_extension_seconds: 2 * 3_600,
            queue_retention_seconds: 4 * 86_400,
            dlq_retention_seconds: 14 * 86_400,
            max_receive_count: 5,
            producers_send_deduplication_id: true,
            identity: SqsIdentity::Cloudevents,
        }
    }
}

/// The Azure Service Bus adapter's settings (`[servicebus]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ServiceBusSettings {
    /// Lock duration the queue should have, in seconds (`PT1M`).
    pub lock_duration_seconds: u64,
    /// How often the lock of a message in progress is renewed, in seconds (20: a third of the lock
    /// duration, as the worker derives it).
    pub lock_renewal_interval_seconds: u64,
    /// Deliveries before Service Bus dead-letters a message (10).
    pub max_delivery_count: u32,
    /// Duplicate detection window, in seconds (`PT10M`).
    pub duplicate_detection_window_seconds: u64,
    /// Default message time to live, in seconds (`P14D`).
    pub default_message_ttl_seconds: u64,
    /// Expired messages are dead-lettered (true).
    pub dead_lettering_on_message_expiration: bool,
    /// The poison queue the worker forwards dead letters to
    /// (`ServiceBusOptions::dead_letter_to`); unset means `{queue}-poison` when the Terraform declares
    /// such a queue, and no forward otherwise.
    pub dead_letter_to: Option<String>,
}

impl Default for ServiceBusSettings {
    fn default() -> Self {
        Self {
            lock_duration_seconds: 60,
            lock_renewal_interval_seconds: 20,
            max_delivery_count: 10,
            duplicate_detection_window_seconds: 600,
            default_message_ttl_seconds: 14 * 86_400,
            dead_lettering_on_message_expiration: true,
            dead_letter_to: None,
        }
    }
}

impl WorkerSettings {
    /// Parses settings from TOML text; absent keys keep their defaults.
    ///
    /// # Errors
    ///
    /// The TOML error when the text is not valid TOML, has an unknown key or
    /// a value of the wrong type.
    pub fn from_toml_str(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// Reads settings from a TOML file; absent keys keep their defaults.
    ///
    /// # Errors
    ///
    /// [`CheckError::Io`] when the file cannot be read, [`CheckError::Config`]
    /// when it is not valid.
    pub fn from_toml_file(path: &Path) -> Result<Self, CheckError> {
        let text = std::fs::read_to_string(path).map_err(|source| CheckError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|source| CheckError::Config {
            path: path.to_path_buf(),
            source,
        })
    }
}
