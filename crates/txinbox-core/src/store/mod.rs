//! The store contract: what the delivery pipeline needs from a database, and nothing of its policy.
//!
//! A store is a driver. It opens a transaction, inserts the marker under its unique constraints, records the
//! handler's result, commits, records evidence and purges; every decision (what a conflict means, what is
//! settled how, what is counted) is made once, in [`crate::pipeline`]. The sqlx stores (PostgreSQL, SQLite) live
//! in `txinbox-store`.
//!
//! The shape fits a transactional store that is not SQL too. A DynamoDB store, for example, would gather the
//! marker as a conditional put and the user's items into one `TransactWriteItems` call made at
//! [`InboxStore::commit`]: its `insert_marker` may answer [`MarkerInsert::Inserted`] without a round trip and
//! let the commit answer [`Commit::Conflict`] when the condition fails. The pipeline handles both places.

use std::future::Future;

use chrono::{DateTime, Utc};

use crate::effects::NewEffect;
use crate::pipeline::identity::Identity;

pub mod ops;

/// Free text from outside (a handler's result reference, a destination's reference, an executor's error, a
/// note) as every store keeps it: a NUL character, which PostgreSQL's `text` refuses, is U+FFFD.
///
/// ```
/// assert_eq!(txinbox_core::store::kept_text("task\u{0}1"), "task\u{fffd}1");
/// assert_eq!(txinbox_core::store::kept_text("task-1"), "task-1");
/// ```
pub fn kept_text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{fffd}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// The inbox row to insert.
#[derive(Debug)]
#[non_exhaustive]
pub struct MarkerRow<'a> {
    /// The identity (consumer, source, message id and metadata).
    pub identity: &'a Identity,
    /// Fingerprint of the payload.
    pub payload_hash: &'a str,
    /// When the delivery was received.
    pub received_at: DateTime<Utc>,
    /// When the marker was written (the transaction commits right after the handler).
    pub processed_at: DateTime<Utc>,
    /// When retention may delete the row.
    pub retention_until: DateTime<Utc>,
    /// The broker's delivery count.
    pub delivery_count: u32,
    /// The message's origin time, the same in every copy of the message: its CloudEvents `time`, else the
    /// broker's first enqueue time, else (a broker that tells neither) the receive time. A partitioned store
    /// places the marker by it, so that every copy meets the first copy's marker in one partition; the
    /// receive time differs per delivery, and it never places a marker by that (see
    /// [`MarkerRow::enqueued_at`]).
    pub origin_at: DateTime<Utc>,
    /// The broker's first enqueue time, when the broker tells it (`None` for a broker, or a test delivery,
    /// that does not): a partitioned store allowed to place a message without an event time by its broker
    /// time refuses one without this too.
    pub enqueued_at: Option<DateTime<Utc>>,
}

impl<'a> MarkerRow<'a> {
    /// A marker row (for a store's own tests; the pipeline builds the rows it inserts).
    pub fn new(
        identity: &'a Identity,
        payload_hash: &'a str,
        received_at: DateTime<Utc>,
        processed_at: DateTime<Utc>,
        retention_until: DateTime<Utc>,
        delivery_count: u32,
    ) -> Self {
        Self {
            identity,
            payload_hash,
            received_at,
            processed_at,
            retention_until,
            delivery_count,
            origin_at: received_at,
            enqueued_at: None,
        }
    }

    /// Sets the origin time (a store's own tests; the pipeline sets it from the message).
    pub fn origin_at(mut self, at: DateTime<Utc>) -> Self {
        self.origin_at = at;
        self
    }

    /// Sets the broker's enqueue time (a store's own tests; the pipeline sets it from the message).
    pub fn enqueued_at(mut self, at: DateTime<Utc>) -> Self {
        self.enqueued_at = Some(at);
        self
    }
}

/// The result of the conditional marker insert.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MarkerInsert {
    /// The marker is ours (or will be checked at commit): go on with the handler.
    Inserted,
    /// A unique constraint refused the insert; `None` when the conflicting row could not be read (it was
    /// deleted in between).
    Conflict(Option<ExistingMarker>),
    /// The store has already dropped the place where this message's marker would be (a partitioned store's
    /// partition past its retention): a marker of an earlier copy may have been dropped with it, so the
    /// delivery is refused (`retention_expired`), never applied again. The text says why.
    Expired(String),
    /// The store has no place for this marker yet (a partition not created: the maintenance is behind):
    /// nothing was written; the delivery is released and retried. The text says why. (An origin time past
    /// any partition the maintenance makes by now is [`Refused`](Self::Refused), `event_time_in_future`.)
    Unplaced(String),
    /// The store cannot hold a marker for the message as it is (a partitioned store that places markers by
    /// the event's own time, given a message without one, or with one past its partitions' horizon):
    /// nothing was written; the delivery is
    /// dead-lettered with `reason`.
    Refused {
        /// The dead-letter reason code.
        reason: String,
        /// What the operator reads.
        detail: String,
    },
}

/// The result of a commit.
#[derive(Debug)]
#[non_exhaustive]
pub enum Commit {
    /// Committed: the marker and the business change are durable.
    Done,
    /// A store that checks its conditions at commit time refused the marker: nothing was written.
    Conflict(Option<ExistingMarker>),
    /// A store that sends the handler's writes at commit time refused them (a condition of the handler's
    /// failed, or the writes exceed what one transaction may carry): nothing was written, and the delivery
    /// is decided as if the handler had returned this error.
    HandlerFailed(crate::HandlerError),
}

/// The row that holds the identity or the business key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExistingMarker {
    /// True when the conflict is on (consumer, source, message_id); false when on the business key.
    pub same_identity: bool,
    /// The holder's message id.
    pub message_id: String,
    /// The holder's payload hash.
    pub payload_hash: String,
    /// When the holder was processed.
    pub processed_at: DateTime<Utc>,
    /// The holder's result reference (what its handler recorded), when the store read it.
    pub result_reference: Option<String>,
}

impl ExistingMarker {
    /// A holder as a store reads it.
    pub fn new(
        same_identity: bool,
        message_id: String,
        payload_hash: String,
        processed_at: DateTime<Utc>,
        result_reference: Option<String>,
    ) -> Self {
        Self {
            same_identity,
            message_id,
            payload_hash,
            processed_at,
            result_reference,
        }
    }

    /// Whether the holder is this very message (same identity, same payload): a plain duplicate.
    pub fn is_same_message(&self, payload_hash: &str) -> bool {
        self.same_identity && self.payload_hash == payload_hash
    }
}

/// What kind of rejection an evidence row records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectionKind {
    /// Same identity, other payload.
    PayloadCollision,
    /// Other identity, same business key.
    BusinessDuplicate,
}

impl RejectionKind {
    /// The stored name (`payload_collision`, `business_duplicate`), also the dead-letter reason.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectionKind::PayloadCollision => "payload_collision",
            RejectionKind::BusinessDuplicate => "business_duplicate",
        }
    }
}

/// Evidence of a payload collision or a business duplicate, kept for an operator.
#[derive(Debug)]
#[non_exhaustive]
pub struct Rejection<'a> {
    /// The rejected delivery's identity.
    pub identity: &'a Identity,
    /// What was rejected.
    pub kind: RejectionKind,
    /// The rejected delivery's payload hash.
    pub payload_hash: &'a str,
    /// The stored hash (collision) or the holder's message id (business duplicate).
    pub conflicts_with: &'a str,
    /// Free detail.
    pub detail: &'a str,
    /// When.
    pub recorded_at: DateTime<Utc>,
}

/// What the delivery pipeline needs from a database.
///
/// `Tx` is the open transaction. The pipeline hands the handler a clone of it (the handler writes its
/// business change through it) and keeps one to commit; a store makes sure a clone kept past the handler
/// cannot write after the commit. Dropping the last clone of an uncommitted transaction rolls it back.
pub trait InboxStore: Clone + Send + Sync + 'static {
    /// An open transaction.
    type Tx: Clone + Send + Sync + 'static;
    /// The driver's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// A short name for logs (`postgres`, `sqlite`).
    fn name(&self) -> &'static str;

    /// Opens a transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, Self::Error>> + Send;

    /// Inserts the marker unless a unique constraint refuses it; on conflict reads the holder.
    fn insert_marker(
        &self,
        tx: &Self::Tx,
        row: &MarkerRow<'_>,
    ) -> impl Future<Output = Result<MarkerInsert, Self::Error>> + Send;

    /// Inserts the markers of a batch in `tx`, in the order given, each unless a unique constraint refuses
    /// it (a row refused by an earlier row of the same call included), and reads the holder of each refused
    /// one: one answer per row, in order, as [`InboxStore::insert_marker`] would have given them one after
    /// the other. The default runs `insert_marker` for each row; a store may send them all as one statement
    /// (the PostgreSQL store does: one round trip for the batch).
    fn insert_markers(
        &self,
        tx: &Self::Tx,
        rows: &[MarkerRow<'_>],
    ) -> impl Future<Output = Result<Vec<MarkerInsert>, Self::Error>> + Send {
        async move {
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                out.push(self.insert_marker(tx, row).await?);
            }
            Ok(out)
        }
    }

    /// Records the handler's result reference on the marker and writes its effect intents (same
    /// transaction).
    fn record_result(
        &self,
        tx: &Self::Tx,
        identity: &Identity,
        result_reference: Option<&str>,
        effects: &[NewEffect<'_>],
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Commits.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<Commit, Self::Error>> + Send;

    /// Rolls back. `clean_end` says the transaction ended as planned (a plain duplicate), so its connection
    /// may serve the next delivery; otherwise it goes back to be checked.
    fn rollback(
        &self,
        tx: Self::Tx,
        clean_end: bool,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Records a rejection (its own transaction).
    fn record_rejection(
        &self,
        r: &Rejection<'_>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Opens a savepoint in `tx` (one name, stacked: each call opens a new one above the previous), so that
    /// one delivery of a batch can be undone without the others ([`InboxStore::rollback_to_savepoint`]).
    /// `Ok(false)` means this store has no savepoints (the default): the inbox then gives every delivery of a
    /// batch its own transaction. A store that answers `true` implements both methods.
    fn savepoint(&self, tx: &Self::Tx) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        let _ = tx;
        async { Ok(false) }
    }

    /// Undoes everything written in `tx` since the latest savepoint and keeps the transaction open (the
    /// savepoint stays too). Only called after [`InboxStore::savepoint`] answered `true`.
    fn rollback_to_savepoint(
        &self,
        tx: &Self::Tx,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = tx;
        async { Ok(()) }
    }

    /// What holds `identity`'s message now, as [`InboxStore::insert_marker`] would find it: its own marker,
    /// else the marker of another message that holds its business key (same consumer and tenant). A store
    /// that checks its markers at commit ([`MarkerInsert::Inserted`] "or will be checked at commit") runs the
    /// handler of a copy whose marker is held; the pipeline asks it here only when such a delivery would be
    /// dead-lettered after its handler ran (the handler's permanent error, effects the pipeline refuses), or
    /// released when the broker had handed it out before (a retryable error or a panic of a redelivered
    /// copy), once its transaction is rolled back, and decides a holder as a commit-time [`Commit::Conflict`]
    /// (duplicate, payload collision, business duplicate). The default answers `None` without a round trip:
    /// a store that inserts the marker before the handler (the SQL stores) has already answered a held one.
    fn holder_of(
        &self,
        identity: &Identity,
    ) -> impl Future<Output = Result<Option<ExistingMarker>, Self::Error>> + Send {
        let _ = identity;
        async { Ok(None) }
    }

    /// Whether an error of this store is transient (a retry may succeed).
    fn is_transient(e: &Self::Error) -> bool;

    /// Classifies an error a handler raised with `?` that came from this store's driver (for example a
    /// `sqlx::Error` from the business change): `Some(true)` when a retry can help, `Some(false)` when it
    /// cannot, `None` when the error is not the driver's.
    fn classify(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
        let _ = e;
        None
    }
}
