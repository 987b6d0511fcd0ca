//! # txinbox-core
//!
//! The core of txinbox, a durable inbox at the consumer's door. Brokers deliver at least once: a worker that
//! commits its database change and dies before it acknowledges the message gets that message again. txinbox
//! records the message's identity (`consumer_name` + `message_id`) and the business change in **one database
//! transaction**, lets the store's unique constraint decide who may proceed, and acknowledges the broker
//! **only after COMMIT**. A redelivery finds the marker and ends without repeating the effect.
//!
//! Users depend on the `txinbox` facade crate, which re-exports what they use by name; this crate's module
//! tree is an implementation detail, exempt from semver. It holds what depends on no particular database or
//! broker, one folder per subsystem:
//!
//! * [`pipeline`]: **the delivery pipeline**: validation, [identity](pipeline::identity),
//!   [retention](pipeline::retention), [fingerprint](pipeline::fingerprint), the transaction's decisions, the
//!   settle and the metrics, written once for every store; the [handler API](pipeline::handler) and the
//!   [outcomes](pipeline::outcome);
//! * [`runtime`]: the [worker](runtime::worker) (receive loops, concurrency, shutdown), the
//!   [lease keeper](runtime::lease), [health](runtime::health) and the [maintenance](runtime::maintenance);
//! * [`broker`]: the broker contract ([`Receiver`], [`Delivery`], [`Lease`], [`BrokerError`]), the
//!   [in-memory broker](broker::mem), the [redrive](broker::redrive) report;
//! * [`store`]: the store contract ([`InboxStore`]) a database driver implements;
//! * [`effects`]: external effects as governed units (idempotency key, uncertain state, reconciliation), a
//!   broker publish being one kind ([outbox](effects::outbox)); [`http`] (feature `http`): the HTTP
//!   destination;
//! * [`settings`]: the settings file; [`metrics`]: the metric names.
//!
//! The sqlx stores (PostgreSQL, SQLite) live in `txinbox-store`; the brokers in `txinbox-sqs` and
//! `txinbox-servicebus`.
//!
//! ```
//! use txinbox_core::{ConsumerName, IdentityPolicy, ReceivedMessage};
//!
//! let policy = IdentityPolicy::new(ConsumerName::new("crm-followup").unwrap())
//!     .business_key(|m| {
//!         let v: serde_json::Value = serde_json::from_slice(&m.body).map_err(|e| e.to_string())?;
//!         Ok(Some(format!(
//!             "criar_tarefa_followup:{}:{}",
//!             v["opportunity"].as_str().ok_or("no opportunity")?,
//!             v["meeting"].as_str().ok_or("no meeting")?
//!         )))
//!     });
//! let mut msg = ReceivedMessage::new(br#"{"opportunity":"2481","meeting":"184"}"#.to_vec());
//! msg.producer_id = Some("evt-482".into());
//! let id = policy.resolve(&msg).unwrap();
//! assert_eq!(id.message_id, "evt-482");
//! assert_eq!(id.business_key.as_deref(), Some("criar_tarefa_followup:2481:184"));
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod broker;
pub mod effects;
pub mod error;
#[cfg(feature = "http")]
pub mod http;
pub mod metrics;
pub mod pipeline;
pub mod runtime;
pub mod settings;
pub mod store;
pub mod time;

pub use broker::message::ReceivedMessage;
pub use broker::redrive::{
    RedriveEvent, RedriveItem, RedriveOptions, RedriveProgress, RedriveReport,
};
pub use broker::{dead_letter, DeadLetter, Delivery, Lease, Receiver};
pub use effects::outbox::{OutboxMessage, Publisher};
pub use effects::{
    ClaimedEffect, CompensateError, CompensatedRow, Confirmation, Effect, EffectExecutor,
    EffectOptions, EffectReport, EffectRunner, EffectState, EffectStore, Execution, RowOutcome,
};
pub use error::{BadInput, BoxError, BrokerError, BrokerErrorKind};
pub use pipeline::fingerprint::FingerprintSpec;
pub use pipeline::handler::{Handled, Handler, HandlerError, Message, Payload, Raw, Retry};
pub use pipeline::identity::{ConsumerName, IdOrigin, Identity, IdentityPolicy};
pub use pipeline::outcome::{Outcome, OutcomeKind};
pub use pipeline::retention::RetentionPolicy;
pub use pipeline::{BodyFormat, Inbox, InboxProcessor, InputRules};
pub use runtime::lease::LeaseOptions;
pub use runtime::maintenance::{
    Maintenance, MaintenanceOptions, MaintenanceReport, MaintenanceStore,
};
pub use runtime::monitor::{Monitor, MonitorReport};
pub use runtime::shards::{
    Shard, ShardConfigError, ShardOptions, ShardRouter, ShardStatus, Shards,
};
pub use runtime::worker::{
    shutdown_signal, LeasedDelivery, Processor, Worker, WorkerOptions, WorkerReport,
};
pub use store::{
    Commit, ExistingMarker, InboxStore, MarkerInsert, MarkerRow, Rejection, RejectionKind,
};

/// Re-exported so processors and adapters agree on the type.
pub use tokio_util::sync::CancellationToken;
