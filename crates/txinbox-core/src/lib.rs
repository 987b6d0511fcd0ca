//! # txinbox
//!
//! A durable inbox at the consumer's door. Brokers deliver at least once: a worker that commits its database
//! change and dies before it acknowledges the message gets that message again. txinbox records the message's
//! identity (`consumer_name` + `message_id`) and the business change in **one database transaction**, lets
//! the store's unique constraint decide who may proceed, and acknowledges the broker **only after COMMIT**.
//! A redelivery finds the marker and ends without repeating the effect.
//!
//! This crate holds what does not depend on a database or a broker:
//!
//! * [`identity`]: consumer names, identity resolution (CloudEvents, producer id, broker id opt-in);
//! * [`fingerprint`]: the canonical payload hash;
//! * [`Outcome`]: applied, duplicate, payload collision, business duplicate, retry, dead-lettered;
//! * [`broker`]: the adapter traits ([`Receiver`], [`Delivery`], [`Lease`]);
//! * [`worker`]: concurrency, lease renewal, graceful shutdown;
//! * [`mem`]: an in-memory broker with real at-least-once semantics for tests and the lab;
//! * [`outbox`], [`retention`], [`metrics`].
//!
//! The inbox transaction itself lives in `txinbox-store` (PostgreSQL and SQLite on sqlx); the brokers live in
//! `txinbox-sqs` and `txinbox-servicebus`.
//!
//! ```
//! use txinbox::{ConsumerName, IdentityPolicy, ReceivedMessage};
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
pub mod error;
pub mod fingerprint;
pub mod identity;
pub mod lease;
pub mod mem;
pub mod message;
pub mod metrics;
pub mod outbox;
pub mod outcome;
pub mod redrive;
pub mod retention;
pub mod worker;

pub use broker::{dead_letter, DeadLetter, Delivery, Lease, Receiver};
pub use error::{BadInput, BoxError, BrokerError, BrokerErrorKind, HandlerError};
pub use fingerprint::FingerprintSpec;
pub use identity::{ConsumerName, IdOrigin, Identity, IdentityPolicy};
pub use lease::LeaseOptions;
pub use message::ReceivedMessage;
pub use outbox::{OutboxMessage, Publisher};
pub use outcome::Outcome;
pub use redrive::{RedriveEvent, RedriveItem, RedriveProgress, RedriveReport};
pub use retention::RetentionPolicy;
pub use worker::{shutdown_signal, LeasedDelivery, Processor, Worker, WorkerOptions, WorkerReport};

/// Re-exported so processors and adapters agree on the type.
pub use tokio_util::sync::CancellationToken;
