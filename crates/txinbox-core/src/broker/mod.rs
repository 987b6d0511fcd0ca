//! The adapter traits every broker implements: [`Receiver`] hands out [`Delivery`]s; a delivery is settled
//! exactly once by consuming it, and optionally exposes a [`Lease`] the worker keeps alive.
//!
//! Handlers never see a `Delivery`: the inbox settles it, and only after COMMIT.
//!
//! Also here: the [`message`] as a broker hands it over, the in-memory broker ([`mem`]: real
//! at-least-once semantics, for tests, the lab and demos), and the [`redrive`] report both adapters'
//! redrive tools share.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use crate::error::BrokerError;

mod boxed;
pub mod mem;
pub mod message;
pub mod redrive;

pub use boxed::{BoxDelivery, BoxReceiver};
pub use message::ReceivedMessage;

/// Why a delivery is dead-lettered. Adapters put both on the dead-letter copy, under the names of
/// [`dead_letter`] ([`dead_letter::REASON`], [`dead_letter::DETAIL`]).
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

    /// Whether [`release`](Self::release) with a delay keeps its caller waiting out the delay: a broker
    /// without a delayed release (Service Bus over REST) serves the delay by holding the lock, then
    /// abandoning. A caller that must not hold a worker slot that long (the shard router releasing the
    /// deliveries of a shard that is down) settles such a release in the background. Default `false`.
    fn release_holds(&self) -> bool {
        false
    }
}

/// An extendable lock or visibility timeout.
pub trait Lease: Send + Sync + 'static {
    /// How long the lease lasts from a receive or a renewal: the SQS visibility timeout set on the receive,
    /// the Service Bus lock duration (as configured, or shorter when the broker's first lock said so). The
    /// worker's lease keeper derives its cadence from it ([`crate::runtime::lease::renewal_interval`]) and renews by it.
    fn duration(&self) -> Duration;

    /// When the lease currently expires, as far as the adapter knows.
    fn expires_at(&self) -> Option<DateTime<Utc>>;

    /// Extend the lease so it lasts `by` from now; returns the new expiry.
    ///
    /// The worker's lease keeper counts a renewal that answers `Ok` as holding the lease for `by` from the
    /// moment it made the call, and reads the expiry returned only for its log line: an adapter whose broker
    /// extends the lease by less than `by` (a ceiling, a shorter lock) must answer with an error, not with the
    /// shorter expiry ([`BrokerErrorKind::LockLost`](crate::BrokerErrorKind::LockLost) when the lease cannot
    /// be kept, as the SQS adapter does at its 12 h visibility ceiling), or the keeper renews too late.
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

    /// The start-up check: that the queue can be reached and used with the configured credentials, and that a
    /// delivery the inbox dead-letters has somewhere to go. A worker process calls it once before
    /// [`Worker::run_until`](crate::Worker::run_until) and exits non-zero with the error's one line when it
    /// fails (the error never holds a secret). Its kind says what is wrong:
    /// [`Unauthorized`](crate::BrokerErrorKind::Unauthorized) (a key or a permission),
    /// [`EntityNotFound`](crate::BrokerErrorKind::EntityNotFound) (the queue or the dead-letter queue),
    /// [`Configuration`](crate::BrokerErrorKind::Configuration) (no dead-letter path, unless opted out),
    /// anything else (unreachable). A check must not take a message away from other workers; what it
    /// receives, if anything, it hands out on the next receive. The default checks nothing.
    fn check(&mut self) -> impl Future<Output = Result<(), BrokerError>> + Send {
        async { Ok(()) }
    }

    /// Another receiver on the same queue, for a further receive loop of the same worker
    /// ([`WorkerOptions::receive_loops`](crate::WorkerOptions::receive_loops)): it shares the connection and
    /// whatever settles deliveries, and keeps its own receive state (what it holds back, whether the queue had
    /// a backlog). `None`, the default: this receiver runs one receive loop only, and a worker asked for more
    /// says so in its log.
    fn fork(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
}

/// The dead-letter bookkeeping every adapter writes on a dead-letter copy and drops again on redrive: the
/// names of the reason and detail (SQS message attributes, Service Bus custom properties) and the detail's
/// length limit.
pub mod dead_letter {
    /// Attribute or property carrying the dead-letter reason code ([`super::DeadLetter::reason`]).
    pub const REASON: &str = "txinbox-dlq-reason";
    /// Attribute or property carrying the dead-letter detail ([`super::DeadLetter::detail`]), at most
    /// [`MAX_DETAIL_LEN`] bytes.
    pub const DETAIL: &str = "txinbox-dlq-detail";
    /// The prefix of every dead-letter bookkeeping name (adapters may add more, e.g. the source queue).
    pub const PREFIX: &str = "txinbox-dlq-";
    /// Longest detail written, in bytes (1 KiB).
    pub const MAX_DETAIL_LEN: usize = 1024;
    /// Attribute or property a redrive puts on the copy it sends back (the dead-letter queue it came from):
    /// the consuming inbox counts such a delivery in `txinbox_redriven_total{consumer}`.
    pub const REDRIVEN_FROM: &str = "txinbox-redriven-from";

    /// `detail` cut to at most [`MAX_DETAIL_LEN`] bytes, on a character boundary.
    pub fn truncate_detail(detail: &str) -> &str {
        crate::time::cut(detail, MAX_DETAIL_LEN)
    }

    /// Whether an attribute or property name is dead-letter bookkeeping (any case), which a redrive drops.
    pub fn is_bookkeeping(name: &str) -> bool {
        name.len() >= PREFIX.len()
            && name.is_char_boundary(PREFIX.len())
            && name[..PREFIX.len()].eq_ignore_ascii_case(PREFIX)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn details_are_cut_on_a_char_boundary() {
            let long = "é".repeat(600);
            let cut = truncate_detail(&long);
            assert!(cut.len() <= MAX_DETAIL_LEN && cut.len() >= MAX_DETAIL_LEN - 1);
            assert!(cut.chars().all(|c| c == 'é'));
            assert_eq!(truncate_detail("short"), "short");
        }

        #[test]
        fn bookkeeping_names_are_recognised_in_any_case() {
            assert!(is_bookkeeping(REASON) && is_bookkeeping("TXINBOX-DLQ-Detail"));
            assert!(!is_bookkeeping("ce-id") && !is_bookkeeping("txinbox") && !is_bookkeeping("é"));
        }
    }
}
