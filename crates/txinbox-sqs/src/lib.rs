//! # txinbox-sqs
//!
//! The Amazon SQS adapter of txinbox (FIFO and standard queues), on `aws-sdk-sqs`:
//!
//! * [`SqsReceiver`]: long-poll receive of up to 10 messages with every system and message attribute; identity
//!   is resolved by the inbox from the CloudEvents attributes (`ce-id`, `ce-source`, ...), then — only when
//!   the consumer opts in with [`SqsOptions::deduplication_id_identity`], because AWS replaces it on a move
//!   to a FIFO DLQ — the `MessageDeduplicationId`, then — only when the policy opts in — the `MessageId`
//!   (which SQS changes on redrive);
//! * [`SqsDelivery`]: settled by the inbox after COMMIT with `DeleteMessage` (`DeleteMessageBatch` when
//!   several are ready), released with a visibility of the inbox's retry delay, or forwarded to the
//!   dead-letter queue with its identity attributes and the reason ([`txinbox_core::dead_letter::REASON`],
//!   [`txinbox_core::dead_letter::DETAIL`]) and then deleted;
//! * [`SqsLease`]: the visibility heartbeat (`ChangeMessageVisibility`), run by the worker's lease keeper
//!   while the handler runs: the lease says its duration (the visibility timeout) and the keeper renews it
//!   every third of it, with any [`WorkerOptions`](txinbox_core::WorkerOptions);
//! * [`redrive()`]: moves messages from a DLQ back to their queue keeping their identity, reporting with the
//!   core's [`RedriveReport`](txinbox_core::RedriveReport) and [`RedriveProgress`](txinbox_core::RedriveProgress);
//! * every failed SQS call is a [`txinbox_core::BrokerError`] whose source is the SDK's `SdkError`;
//! * [`SqsPublisher`]: sends with `MessageGroupId`, `MessageDeduplicationId` and CloudEvents attributes
//!   derived from one identity.
//!
//! ## Wiring a worker
//!
//! ```no_run
//! use txinbox_core::{ConsumerName, IdentityPolicy, Inbox, Message, Raw, Worker};
//! use txinbox_sqs::{SqsOptions, SqsReceiver};
//! use txinbox_store::Store;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Store::<sqlx::Sqlite>::connect("sqlite:crm.db").await?;
//! let inbox = Inbox::new(store, IdentityPolicy::new(ConsumerName::new("crm-followup")?));
//! let handler = inbox.bind(|tx, msg: Message<Raw>| async move {
//!     sqlx::query("INSERT INTO tasks (message_id) VALUES ($1)")
//!         .bind(&msg.identity.message_id)
//!         .execute(&tx)
//!         .await?;
//!     Ok(())
//! });
//!
//! // Standard AWS chain (env, profile, web identity, ECS/EC2); AWS_ENDPOINT_URL_SQS points it at moto.
//! let client = txinbox_sqs::client_from_env().await;
//! let queue = "https://sqs.us-east-1.amazonaws.com/123456789012/crm-events.fifo";
//! let receiver = SqsReceiver::connect(client, queue, SqsOptions::default()).await?;
//! let report = Worker::new(receiver, handler)
//!     .run_until(txinbox_core::shutdown_signal())
//!     .await;
//! println!("{report:?}");
//! # Ok(()) }
//! ```
//!
//! ## Failure windows
//!
//! * Commit, then crash before the delete: the message reappears after its visibility timeout and the inbox
//!   answers `Duplicate`; the redelivery is deleted.
//! * A heartbeat that fails (`ReceiptHandleIsInvalid`, throttling, network) is counted in
//!   `txinbox_lease_lost_total` and logged; the handler's transaction still decides the outcome and a second
//!   copy is absorbed by the unique constraint.
//! * A failed delete is logged and counted (`txinbox_settle_failures_total`); entries of a failed
//!   `DeleteMessageBatch` are counted in [`metrics::DELETE_BATCH_ENTRY_FAILURES`] and, when SQS failed on
//!   its side (a retryable code), retried once alone; a
//!   `DeleteMessageBatch` refused as a whole is sent again as a batch (the SDK's retries), never entry by
//!   entry, and then fails each entry's `ack`.
//! * Poison messages reach the DLQ by the queue's `maxReceiveCount`; payload collisions, bad input and
//!   permanent handler errors are forwarded explicitly (copy first, delete second: never lost).
//!
//! ## Features
//!
//! * `aws-config` (default): the standard AWS configuration chain (`load_sdk_config`, `client_from_env`)
//!   and the `aws_config` re-export. Without it (`default-features = false`) the crate does not build
//!   `aws-config` and its STS client: build the client from an `aws_sdk_sqs::Config` of your own with
//!   [`client_from_conf`] (the HTTP client of [`http_client`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod dlq;
pub mod error;
pub mod iam;
pub mod options;
pub mod publisher;
pub mod receiver;
pub mod redrive;

pub use error::{BatchEntryError, SqsError};
pub use options::{client_from_conf, emulator_client, http_client, SqsOptions};
#[cfg(feature = "aws-config")]
pub use options::{client_from_env, load_sdk_config};
pub use publisher::{deduplication_id, SqsPublisher};
pub use receiver::{
    deduplication_id_replaced, received_message, SqsDelivery, SqsLease, SqsReceiver,
    MAX_CALLS_PER_RECEIVE,
};
pub use redrive::{redrive, RedriveOptions};

/// Re-exported so users load AWS configuration with the version the adapter is built on.
#[cfg(feature = "aws-config")]
#[cfg_attr(docsrs, doc(cfg(feature = "aws-config")))]
pub use aws_config;
/// Re-exported so users name the same SDK version.
pub use aws_sdk_sqs;

/// Metric names specific to the SQS adapter (the core's names in [`txinbox_core::metrics`] apply too).
pub mod metrics {
    /// Entries of a `DeleteMessageBatch` that failed, by `code` (one with a retryable code is retried once
    /// with `DeleteMessage`).
    pub const DELETE_BATCH_ENTRY_FAILURES: &str = "txinbox_sqs_delete_batch_entry_failures_total";
    /// Messages forwarded explicitly to the dead-letter queue, by `reason`.
    pub const DLQ_FORWARDS: &str = "txinbox_sqs_dlq_forwards_total";
    /// Received messages whose deduplication id AWS replaced with their message id on a move to a FIFO DLQ
    /// (not used as an identity).
    pub const REPLACED_DEDUP_IDS: &str = "txinbox_sqs_replaced_dedup_ids_total";
}
