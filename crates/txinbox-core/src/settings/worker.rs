use serde::Deserialize;

use crate::pipeline::retention::RetentionPolicy;
use crate::runtime::worker::WorkerOptions;

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
    /// a batch is what one receive brought; at most 1000). Only with `batch_commit` above 1 (refused
    /// otherwise: it would be ignored).
    pub batch_linger_ms: u64,
    /// How long in-flight deliveries may run after shutdown begins, in seconds (30).
    pub shutdown_timeout_seconds: u64,
    /// Serve `GET /livez` and `GET /readyz` on this address (unset: off).
    pub health_addr: Option<String>,
    /// Serve Prometheus metrics on this address (unset: off).
    pub metrics_addr: Option<String>,
    /// Run the maintenance (retention purge) beside the worker this often, in seconds (at least 1;
    /// unset: another process purges).
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
