//! # txinbox-core
//!
//! The core of txinbox, a durable inbox at the consumer's door. Brokers deliver at least once: a worker that
//! commits its database change and dies before it acknowledges the message gets that message again. txinbox
//! records the message's identity (`consumer_name` + `message_id`) and the business change in **one database
//! transaction**, lets the store's unique constraint decide who may proceed, and acknowledges the broker
//! **only after COMMIT**. A redelivery finds the marker and ends without repeating the effect.
//!
//! Users depend on the `txinbox` facade crate, which re-exports this one. This crate holds what depends on
//! no particular database or broker:
//!
//! * [`inbox`]: **the delivery pipeline**: validation, identity, retention, fingerprint, the transaction's
//!   decisions, the settle and the metrics, written once for every store;
//! * [`handler`]: the handler API (typed [`Message`]s, [`HandlerError`] that any error converts into);
//! * [`store`]: the store contract ([`InboxStore`]) a database driver implements;
//! * [`broker`]: the broker contract ([`Receiver`], [`Delivery`], [`Lease`], [`BrokerError`]);
//! * [`identity`], [`fingerprint`], [`Outcome`];
//! * [`worker`]: concurrency, lease renewal, graceful shutdown; [`redrive`]: one report for both brokers;
//! * [`mem`]: an in-memory broker with real at-least-once semantics for tests and the lab;
//! * [`effects`]: external effects as governed units (idempotency key, uncertain state, reconciliation), a
//!   broker publish being one kind ([`outbox`]);
//! * [`retention`], [`metrics`].
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
pub mod fingerprint;
pub mod handler;
pub mod health;
#[cfg(feature = "http")]
pub mod http;
pub mod identity;
pub mod inbox;
pub mod lease;
pub mod maintenance;
pub mod mem;
pub mod message;
pub mod metrics;
pub mod outbox;
pub mod outcome;
pub mod redrive;
pub mod retention;
pub mod settings;
pub mod store;
pub mod worker;

pub use broker::{dead_letter, DeadLetter, Delivery, Lease, Receiver};
pub use effects::{
    ClaimedEffect, CompensateError, Confirmation, Effect, EffectExecutor, EffectOptions,
    EffectReport, EffectRunner, EffectState, EffectStore, Execution,
};
pub use error::{BadInput, BoxError, BrokerError, BrokerErrorKind};
pub use fingerprint::FingerprintSpec;
pub use handler::{Handled, Handler, HandlerError, Message, Payload, Raw, Retry};
pub use identity::{ConsumerName, IdOrigin, Identity, IdentityPolicy};
pub use inbox::{BodyFormat, Inbox, InboxProcessor, InputRules};
pub use lease::LeaseOptions;
pub use maintenance::{Maintenance, MaintenanceOptions, MaintenanceReport, MaintenanceStore};
pub use message::ReceivedMessage;
pub use outbox::{OutboxMessage, Publisher};
pub use outcome::{Outcome, OutcomeKind};
pub use redrive::{RedriveEvent, RedriveItem, RedriveOptions, RedriveProgress, RedriveReport};
pub use retention::RetentionPolicy;
pub use store::{
    Commit, ExistingMarker, InboxStore, MarkerInsert, MarkerRow, Rejection, RejectionKind,
};
pub use worker::{shutdown_signal, LeasedDelivery, Processor, Worker, WorkerOptions, WorkerReport};

/// Re-exported so processors and adapters agree on the type.
pub use tokio_util::sync::CancellationToken;
