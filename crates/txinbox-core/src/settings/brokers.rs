use std::time::Duration;

use serde::Deserialize;

use crate::runtime::lease::LeaseOptions;

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
#[derive(Clone, PartialEq, Eq, Deserialize)]
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

/// Text a `Debug` writes as it is (already quoted, or a note).
struct AsWritten(String);

impl std::fmt::Debug for AsWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

// Debug for a log line: the namespace only when it reads as a host name; a connection string or a key given in
// its place (`TXINBOX_SERVICEBUS__NAMESPACE` set to what `SERVICEBUS_CONNECTION_STRING` takes) is not shown.
impl std::fmt::Debug for ServiceBusSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let namespace = self.namespace.as_deref().map(|ns| {
            if ns
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
            {
                format!("{ns:?}")
            } else {
                "<not shown: it holds characters of a key or a connection string>".to_owned()
            }
        });
        f.debug_struct("ServiceBusSettings")
            .field("namespace", &namespace.map(AsWritten))
            .field("queue", &self.queue)
            .field("lock_duration_seconds", &self.lock_duration_seconds)
            .field(
                "lock_renewal_interval_seconds",
                &self.lock_renewal_interval_seconds,
            )
            .field("max_delivery_count", &self.max_delivery_count)
            .field(
                "duplicate_detection_window_seconds",
                &self.duplicate_detection_window_seconds,
            )
            .field(
                "default_message_ttl_seconds",
                &self.default_message_ttl_seconds,
            )
            .field(
                "dead_lettering_on_message_expiration",
                &self.dead_lettering_on_message_expiration,
            )
            .field("dead_letter_to", &self.dead_letter_to)
            .finish()
    }
}
