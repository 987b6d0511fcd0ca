//! The adapter traits every broker implements: [`Receiver`] hands out [`Delivery`]s; a delivery is settled
//! exactly once by consuming it, and optionally exposes a [`Lease`] the worker keeps alive.
//!
//! Handlers never see a `Delivery`: the inbox settles it, and only after COMMIT.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use crate::error::BrokerError;
use crate::message::ReceivedMessage;

/// Why a delivery is dead-lettered. Adapters put both on the dead-letter copy (SQS message attributes
/// `txinbox-dlq-reason`/`txinbox-dlq-detail`; Service Bus `DeadLetterReason`/`DeadLetterErrorDescription`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// Stable reason code (`payload_collision`, `no_identity`, `handler_permanent`, ...).
    pub reason: String,
    /// Human-readable detail (never a secret).
    pub detail: String,
}

impl DeadLetter {
    /// A dead-letter reason with detail.
    pub fn new(reason: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            detail: detail.into(),
        }
    }
}

/// One received copy of a message, holding the broker's lock or receipt.
///
/// Settling (`ack`, `release`, `dead_letter`) consumes the delivery, so it happens once. Dropping a delivery
/// without settling leaves the message to the broker, which redelivers it after the lock or visibility
/// timeout: that is what a crash looks like, and the inbox absorbs the redelivery.
pub trait Delivery: Send + Sync + 'static {
    /// The message.
    fn message(&self) -> &ReceivedMessage;

    /// Settle as done: SQS `DeleteMessage`, Service Bus complete. The inbox calls this only after COMMIT.
    fn ack(self) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// Give the message back for redelivery after `delay` (SQS visibility, Service Bus abandon).
    fn release(self, delay: Duration) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// Move the message to the dead-letter destination with `why`, keeping its identity attributes.
    fn dead_letter(self, why: DeadLetter) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// The lease (lock or visibility) of this delivery, if the broker has one that can be extended.
    fn lease(&self) -> Option<Arc<dyn Lease>>;
}

/// An extendable lock or visibility timeout.
pub trait Lease: Send + Sync + 'static {
    /// When the lease currently expires, as far as the adapter knows.
    fn expires_at(&self) -> Option<DateTime<Utc>>;

    /// Extend the lease so it lasts `by` from now; returns the new expiry.
    fn renew(&self, by: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>>;
}

/// Receives deliveries from one queue.
pub trait Receiver: Send + 'static {
    /// The delivery type.
    type Delivery: Delivery;

    /// Receive up to `max` deliveries, waiting (long poll) at most the adapter's configured wait. An empty
    /// vector means nothing arrived in time.
    fn receive(
        &mut self,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Self::Delivery>, BrokerError>> + Send;
}
