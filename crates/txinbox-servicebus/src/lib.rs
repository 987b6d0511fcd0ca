//! # txinbox-servicebus
//!
//! The Azure Service Bus adapter of txinbox, on the REST data plane through `azure_messaging_servicebus` 0.21
//! (rustls only), with SAS or Azure AD (`azure_identity` 0.21) authentication:
//!
//! * [`ServiceBusReceiver`]: peek-lock receive (one long poll, then whatever is waiting, up to the batch);
//!   every response status is checked here (the crate returns `Ok` on 204 and even 401), `BrokerProperties`
//!   is parsed with tolerant types ([`wire::BrokerProperties`]) and the lock URI is read from `Location`;
//! * [`ServiceBusDelivery`]: completed by the inbox **only after COMMIT**, abandoned on a retryable error
//!   (after holding the lock for the retry backoff), dead-lettered by [`DeadLetterStrategy`];
//! * [`ServiceBusLease`]: lock renewal, run by the worker's lease keeper with any
//!   [`WorkerOptions`](txinbox_core::WorkerOptions): the lease says its duration
//!   ([`ServiceBusOptions::lock_duration`], or the broker's shorter lock) and is renewed every third of it, for
//!   up to [`LeaseOptions::max_total`](txinbox_core::LeaseOptions::max_total); REST renew answers no expiry,
//!   so the adapter computes it;
//! * [`dlq`]: forwarding dead letters with their identity and reason, reading `$DeadLetterQueue`;
//! * [`redrive()`]: moves dead letters back with their MessageId intact, reporting with the core's
//!   [`RedriveReport`](txinbox_core::RedriveReport) and [`RedriveProgress`](txinbox_core::RedriveProgress);
//! * every failed Service Bus call is a [`txinbox_core::BrokerError`] whose source is the `azure_core`
//!   error (or [`error::UnexpectedStatus`] when the adapter checked the status itself);
//! * [`ServiceBusPublisher`]: sends with MessageId and CloudEvents properties from one identity.
//!
//! ## Wiring a worker
//!
//! ```no_run
//! use txinbox_core::{ConsumerName, IdentityPolicy, Inbox, Message, Raw, Worker};
//! use txinbox_servicebus::{ServiceBusConfig, ServiceBusOptions, ServiceBusReceiver};
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
//! // SAS: Endpoint=sb://NS.servicebus.windows.net/;SharedAccessKeyName=...;SharedAccessKey=...
//! let client = ServiceBusConfig::from_connection_string(&std::env::var("SERVICEBUS_CONNECTION_STRING")?)?
//!     .connect()?;
//! // Managed identity instead: ServiceBusConfig::default_azure_credential("NS")?.connect()?
//! let options = ServiceBusOptions::default().dead_letter_to("crm-events-poison");
//! let receiver = ServiceBusReceiver::new(&client, "crm-events", options)?;
//! let report = Worker::new(receiver, handler)
//!     .run_until(txinbox_core::shutdown_signal())
//!     .await;
//! println!("{report:?}");
//! # Ok(()) }
//! ```
//!
//! ## Failure windows
//!
//! * Commit, then crash before the complete: the lock lapses, the message comes back with DeliveryCount + 1,
//!   the inbox answers `Duplicate` and the copy is completed.
//! * A renewal that fails (404: lock lost; throttling or 5xx after [`ServiceBusOptions::settle_attempts`]) is
//!   counted in `txinbox_lease_lost_total`; the handler's transaction still decides, and the copy another
//!   receiver gets meanwhile is absorbed by the unique constraint.
//! * A complete that fails is counted (`txinbox_settle_failures_total`); the message comes back and is absorbed.
//!   A complete whose answer was lost, or that was answered 500 (it may have applied), is retried; a 404 on the
//!   retry is reported as ambiguous
//!   ([`error::AmbiguousSettle`], an [`OutcomeUnknown`](txinbox_core::BrokerErrorKind::OutcomeUnknown)
//!   error), not as a lost lock; one given up on a 500 (its last attempt) is an unknown outcome too
//!   ([`error::SettleMayHaveApplied`]).
//! * Throttling (429/503), 500 and lost answers are retried for settles and renewals, after the service's
//!   `Retry-After` when it sent one (while the lock lasts); a throttled receive waits the service's
//!   `Retry-After` and lets the worker back off.
//!
//! See `docs/servicebus.md` for duplicate detection, the identity contract and the dead-letter strategy.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod dlq;
pub mod error;
pub mod options;
pub mod publisher;
pub mod receiver;
pub mod redrive;
pub mod roles;
mod transport;
pub mod wire;

pub use config::{dead_letter_queue_path, Credential, ServiceBusClient, ServiceBusConfig};
pub use dlq::{read_dead_letters, DeadLetteredMessage};
pub use error::ServiceBusError;
pub use options::{DeadLetterStrategy, ServiceBusOptions};
pub use publisher::{send_options, ServiceBusPublisher};
pub use receiver::{ServiceBusDelivery, ServiceBusLease, ServiceBusReceiver};
pub use redrive::{redrive, RedriveOptions};

/// Re-exported so users name the same crate versions.
pub use azure_core;
#[cfg(feature = "azure-identity")]
pub use azure_identity;
pub use azure_messaging_servicebus;

/// Metric names specific to the Service Bus adapter (the core's names in [`txinbox_core::metrics`] apply too).
pub mod metrics {
    /// Messages forwarded to the dead-letter destination, by `reason`.
    pub const DLQ_FORWARDS: &str = "txinbox_servicebus_dlq_forwards_total";
    /// Settle or renewal attempts retried after throttling, 5xx or a lost answer, by `op` and `kind`.
    pub const SETTLE_RETRIES: &str = "txinbox_servicebus_settle_retries_total";
}
