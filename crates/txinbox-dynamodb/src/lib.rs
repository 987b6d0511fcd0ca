//! # txinbox-dynamodb
//!
//! The inbox on Amazon DynamoDB: the message's marker, your business writes and the effect intents go out in
//! **one `TransactWriteItems` call**, which DynamoDB applies atomically (all of it, or none) across up to 100
//! items of any tables of one account and region. The marker's put carries the condition
//! `attribute_not_exists(pk) OR expires_at < :now`; when a copy of the message was already applied, the
//! condition fails, the whole transaction is cancelled (your writes with it), and the pipeline acknowledges
//! the copy as a duplicate. The broker is acknowledged only after the call succeeded.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use aws_sdk_dynamodb::types::{AttributeValue, Put};
//! use txinbox_core::{ConsumerName, IdentityPolicy, Inbox, Message};
//! use txinbox_dynamodb::DynamoStore;
//!
//! #[derive(serde::Deserialize)]
//! struct Meeting { opportunity: String, meeting: String }
//!
//! let store = DynamoStore::connect("dynamodb://txinbox").await?;
//! let inbox = Inbox::new(store, IdentityPolicy::new(ConsumerName::new("crm-followup")?));
//! let _processor = inbox.bind(|tx: txinbox_dynamodb::DynamoTx, msg: Message<Meeting>| async move {
//!     tx.put(
//!         Put::builder()
//!             .table_name("tasks")
//!             .item("id", AttributeValue::S(format!("{}:{}", msg.body.opportunity, msg.body.meeting)))
//!             .build()?,
//!     )?;
//!     Ok(())
//! });
//! # Ok(()) }
//! ```
//!
//! ## What a commit does
//!
//! * **One call.** The handler's actions ([`DynamoTx::put`], [`update`](DynamoTx::update),
//!   [`delete`](DynamoTx::delete), [`condition_check`](DynamoTx::condition_check)) are gathered and sent at
//!   commit with the marker, a business key item when the message has a business key (unique per consumer
//!   and tenant), and one item per effect intent. Reads go through [`DynamoTx::client`], outside the
//!   transaction; a decision that depends on a read is guarded by a condition in the same transaction (a
//!   `version` attribute checked by a [`ConditionCheck`](aws_sdk_dynamodb::types::ConditionCheck)).
//! * **A cancelled transaction is classified from its `CancellationReasons`**, with
//!   `ReturnValuesOnConditionCheckFailure = ALL_OLD` on the marker and business key puts, so the holder comes
//!   back with the refusal (no extra read): the marker's condition failing is a duplicate (same payload hash)
//!   or a payload collision (another hash: evidence item, dead letter); the business key's is a business
//!   duplicate (evidence, acknowledged); the handler's own condition failing is the handler's error
//!   ([`DynamoError::HandlerCondition`], retried on fresh reads); `TransactionConflict` and throttling are
//!   retried with backoff ([`DynamoOptions::commit_attempts`]), then released to the broker, never
//!   dead-lettered.
//! * **A lost answer is recognised.** Each attempt sends its own `ClientRequestToken` and writes it into the
//!   marker; a retry whose marker condition fails on a marker carrying one of this commit's tokens knows the
//!   earlier attempt committed, and reports it done. (Within one attempt, the SDK's own retries resend the
//!   same token, which DynamoDB answers idempotently for 10 minutes.)
//! * **The service's limits are checked before sending**: 100 actions per transaction (the store's share is
//!   the marker, the business key item and one item per effect), 4 MB in all (the items put, the keys of
//!   updates, deletes and condition checks, and every expression attribute value), 400 KB per item, one
//!   action per item. A handler over a limit gets a permanent error ([`DynamoError::Limit`]) and the message
//!   is dead-lettered with it: never a partial write.
//! * **Batch mode** ([`WorkerOptions::batch_commit`](txinbox_core::WorkerOptions::batch_commit)) sends the
//!   deliveries of one receive in one call, every marker with its own result; a cancellation writes nothing
//!   and each delivery is then decided in a transaction of its own (DynamoDB has no savepoints).
//!
//! ## The table
//!
//! One table, hash key `pk` (string), two global secondary indexes and TTL on `expires_at`; see
//! [`layout`] for what each item holds. [`DynamoStore::connect`] checks it (`DescribeTable`,
//! `DescribeTimeToLive`) and refuses to start when it does not match, with one line saying what differs.
//! [`DynamoStore::create_table`] makes one for tests and development.
//!
//! ## Retention
//!
//! Every marker, business key item, evidence item and done effect carries `expires_at` (epoch seconds).
//! DynamoDB's TTL deletes expired items in the background, typically within a few days and at no write cost;
//! the store never relies on the deletion: the conditions treat an item whose `expires_at` has passed as
//! absent from that second on, so the retention window is exact. The maintenance's purge deletes nothing
//! here ([`MaintenanceStore::purge_batch`](txinbox_core::runtime::maintenance::MaintenanceStore::purge_batch)
//! returns no row).
//!
//! ## Effects
//!
//! Effect intents are items written in the transaction. A runner finds due effects through the `due` index
//! (by destination and time, never a scan) and claims each with a conditional update: no two runners hold
//! one effect at once. An effect of a group waits while an older one of its group is unfinished.
//!
//! ## IAM
//!
//! The store calls [`IAM_TABLE_ACTIONS`] on its table and [`IAM_INDEX_ACTIONS`] on its indexes.
//! `TransactWriteItems` is authorized action by action (`PutItem`, `UpdateItem`, `DeleteItem`,
//! `ConditionCheckItem` on each item's table): there is no `dynamodb:TransactWriteItems` permission, and your
//! handler's tables need the actions its writes use.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod effects;
mod error;
pub mod layout;
pub mod ops;
mod store;
mod tx;

pub use error::DynamoError;
pub use store::{
    client_from_env, emulator_client, http_client, table_from_url, DynamoOptions, DynamoStore,
    EFFECT_FINISH_ROOM, MAX_ACTIONS, MAX_ITEM_BYTES, MAX_TRANSACTION_BYTES,
};
pub use tx::DynamoTx;

/// The IAM actions the store calls on its table: `TransactWriteItems` is authorized as its `PutItem` (marker,
/// business key item, effects); `UpdateItem` claims and finishes effects; `PutItem` also writes evidence;
/// `GetItem` and `Query` read items and the indexes; `DescribeTable` and `DescribeTimeToLive` are the
/// start-up check. The handler's own tables need the actions its writes use (`PutItem`, `UpdateItem`,
/// `DeleteItem`, `ConditionCheckItem`), granted by you.
pub const IAM_TABLE_ACTIONS: [&str; 6] = [
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:GetItem",
    "dynamodb:Query",
    "dynamodb:DescribeTable",
    "dynamodb:DescribeTimeToLive",
];

/// The IAM actions the store calls on its table's indexes (`TABLE_ARN/index/NAME`).
pub const IAM_INDEX_ACTIONS: [&str; 1] = ["dynamodb:Query"];

/// The AWS SDK for DynamoDB, re-exported so handlers name the same version the store is built on.
pub use aws_sdk_dynamodb;
