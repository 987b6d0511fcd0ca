//! The broker state: queues, their messages and dead-letter sub-queues, and the rules for locks,
//! delivery counts, expiry and duplicate detection. Everything here is synchronous and runs under
//! one mutex; time is passed in as a [`tokio::time::Instant`].

mod address;
mod delivery;
mod operations;
mod queue;
mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use hyper::body::Bytes;
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::QueueProperties;
use crate::faults::FaultRule;
use crate::wire::{PropertyValue, SenderProperties};

pub(crate) use address::validate_queue_path;
pub use state::{MessageView, QueueState};

/// The dead-letter sub-queue's path segment [doc DLQ]; matched in any case.
pub(crate) const DEAD_LETTER_SEGMENT: &str = "$deadletterqueue";

/// Errors of data-plane operations, each with its documented status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DataError {
    /// 400 [doc SEND, PEEK, PROPS].
    BadRequest(String),
    /// 403: quota exceeded or message too large [doc SEND].
    QuotaExceeded(String),
    /// 404: no message with that MessageId/SequenceNumber and LockToken [doc DEL, UNLOCK, RENEW].
    LockNotFound,
    /// 410: the queue does not exist [doc SEND, PEEK, DEL].
    EntityNotFound(String),
}

impl DataError {
    pub(crate) fn status(&self) -> u16 {
        match self {
            DataError::BadRequest(_) => 400,
            DataError::QuotaExceeded(_) => 403,
            DataError::LockNotFound => 404,
            DataError::EntityNotFound(_) => 410,
        }
    }

    pub(crate) fn detail(&self) -> String {
        match self {
            DataError::BadRequest(d) | DataError::QuotaExceeded(d) => d.clone(),
            DataError::LockNotFound => {
                "The lock supplied is invalid. Either the lock expired, or the message has already been removed from the queue.".into()
            }
            DataError::EntityNotFound(path) => format!("The messaging entity '{path}' could not be found."),
        }
    }
}

/// Maps the emulator's monotonic clock to UTC for the dates it reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    base_instant: Instant,
    base_utc: DateTime<Utc>,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            base_instant: Instant::now(),
            base_utc: Utc::now(),
        }
    }

    pub(crate) fn utc(&self, at: Instant) -> DateTime<Utc> {
        let since = at.saturating_duration_since(self.base_instant);
        chrono::Duration::from_std(since)
            .ok()
            .and_then(|d| self.base_utc.checked_add_signed(d))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    fn instant_of(&self, t: DateTime<Utc>, now: Instant) -> Instant {
        let ahead = (t - self.utc(now)).to_std().unwrap_or(Duration::ZERO);
        now.checked_add(ahead)
            .unwrap_or(now + Duration::from_secs(100 * 365 * 86_400))
    }
}

/// A message handed to [`Broker::send`].
#[derive(Debug, Clone)]
pub(crate) struct IncomingMessage {
    pub body: Bytes,
    pub content_type: Option<String>,
    pub sender: SenderProperties,
    pub properties: Vec<(String, PropertyValue)>,
}

#[derive(Debug, Clone)]
struct Lock {
    token: Uuid,
    until: Instant,
}

#[derive(Debug, Clone)]
struct Message {
    sequence_number: i64,
    message_id: String,
    body: Bytes,
    content_type: Option<String>,
    sender: SenderProperties,
    properties: Vec<(String, PropertyValue)>,
    /// Effective TTL; `None` never expires.
    ttl: Option<Duration>,
    enqueued_at: Instant,
    visible_at: Instant,
    /// How many times the message was handed out.
    delivery_count: u32,
    lock: Option<Lock>,
}

impl Message {
    fn expires_at(&self) -> Option<Instant> {
        self.ttl.and_then(|ttl| self.enqueued_at.checked_add(ttl))
    }

    fn is_expired(&self, now: Instant) -> bool {
        self.expires_at().is_some_and(|at| at <= now)
    }

    fn is_receivable(&self, now: Instant) -> bool {
        self.lock.is_none() && self.visible_at <= now
    }
}

/// Which sub-queue of a queue an address names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SubQueue {
    Active,
    DeadLetter,
}

/// A parsed entity path: the queue and the sub-queue.
struct Address {
    queue_key: String,
    /// The entity path as the Location header spells it: lower case, as in [doc PEEK]'s example.
    location_path: String,
    sub: SubQueue,
}

#[derive(Debug)]
struct Queue {
    path: String,
    props: QueueProperties,
    next_sequence_number: i64,
    active: BTreeMap<i64, Message>,
    dead_letter: BTreeMap<i64, Message>,
    /// MessageId → when it was first accepted [doc DUP].
    duplicate_history: HashMap<String, Instant>,
    /// No lock lapses and no message expires before this instant (`None`: nothing is due ever), so
    /// [`Queue::maintain`] looks at the messages only from then on instead of on every request. Lowered
    /// whenever a lock is granted or a message could start to expire; it may be early, never late.
    next_due: Option<Instant>,
}

/// What a successful receive hands to the HTTP layer.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub body: Bytes,
    pub content_type: Option<String>,
    /// The `BrokerProperties` header, ASCII-only JSON.
    pub broker_properties: String,
    /// Custom properties as (header name, header value).
    pub properties: Vec<(String, String)>,
    /// For peek-lock: `/{entity}/messages/{sequenceNumber}/{lockToken}`.
    pub lock_path: Option<String>,
}

/// The outcome of a receive attempt.
#[derive(Debug)]
pub(crate) enum ReceiveOutcome {
    Delivered(Box<Delivery>),
    /// Nothing receivable now; `next_event` is when that may change on its own.
    Empty {
        next_event: Option<Instant>,
    },
}

/// How a receive takes the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReceiveMode {
    PeekLock,
    ReceiveAndDelete,
}

/// An operation on a lock URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockOperation {
    Complete,
    Abandon,
    Renew,
}

/// All broker state behind the emulator's mutex.
#[derive(Debug)]
pub(crate) struct Broker {
    pub clock: Clock,
    queues: HashMap<String, Queue>,
    initial_queues: Vec<(String, QueueProperties)>,
    pub faults: Vec<FaultRule>,
}
