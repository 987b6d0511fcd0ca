//! The known outcomes of one delivery.

use std::fmt;

/// What happened to one delivery. Every delivery ends in exactly one of these; none is a generic error.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The marker and the business change committed together; the delivery was then settled.
    Applied {
        /// The handler's result reference (e.g. the id of the created CRM task), as stored in the inbox row.
        result_reference: Option<String>,
    },
    /// The same identity with the same payload hash was already applied: no effect, settled.
    Duplicate {
        /// What the first application recorded (its handler's result reference), as idempotency libraries
        /// return the stored result.
        result_reference: Option<String>,
    },
    /// The same identity arrived with another payload hash: no effect, the evidence is recorded and the
    /// message dead-lettered for investigation.
    PayloadCollision {
        /// Hash stored with the applied marker.
        stored_hash: String,
        /// Hash of this delivery.
        received_hash: String,
    },
    /// Another message id already applied the same business key: no effect, recorded, settled.
    BusinessDuplicate {
        /// The message id that holds the business key.
        holder_message_id: String,
        /// What the holder's application recorded.
        result_reference: Option<String>,
    },
    /// The handler (or the store) failed in a way a retry can fix: rolled back, released for redelivery.
    Retry {
        /// Why.
        reason: String,
    },
    /// The delivery cannot advance (bad input, permanent handler error, collision): rolled back and
    /// dead-lettered with this reason.
    DeadLettered {
        /// Reason code (`no_identity`, `invalid_json`, `payload_collision`, `handler_permanent`, ...).
        reason: String,
        /// Human-readable detail.
        detail: String,
    },
    /// The worker stopped (shutdown deadline) before COMMIT: rolled back, released for redelivery.
    Interrupted,
}

/// The kind of an [`Outcome`], without its data: what reports count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum OutcomeKind {
    /// [`Outcome::Applied`].
    Applied,
    /// [`Outcome::Duplicate`].
    Duplicate,
    /// [`Outcome::PayloadCollision`].
    PayloadCollision,
    /// [`Outcome::BusinessDuplicate`].
    BusinessDuplicate,
    /// [`Outcome::Retry`].
    Retry,
    /// [`Outcome::DeadLettered`].
    DeadLettered,
    /// [`Outcome::Interrupted`].
    Interrupted,
}

impl OutcomeKind {
    /// Every kind, in declaration order.
    pub const ALL: [OutcomeKind; 7] = [
        OutcomeKind::Applied,
        OutcomeKind::Duplicate,
        OutcomeKind::PayloadCollision,
        OutcomeKind::BusinessDuplicate,
        OutcomeKind::Retry,
        OutcomeKind::DeadLettered,
        OutcomeKind::Interrupted,
    ];

    /// A stable label (`applied`, `duplicate`, ...), used in metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            OutcomeKind::Applied => "applied",
            OutcomeKind::Duplicate => "duplicate",
            OutcomeKind::PayloadCollision => "payload_collision",
            OutcomeKind::BusinessDuplicate => "business_duplicate",
            OutcomeKind::Retry => "retry",
            OutcomeKind::DeadLettered => "dead_lettered",
            OutcomeKind::Interrupted => "interrupted",
        }
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl Outcome {
    /// The kind of this outcome.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Applied { .. } => OutcomeKind::Applied,
            Outcome::Duplicate { .. } => OutcomeKind::Duplicate,
            Outcome::PayloadCollision { .. } => OutcomeKind::PayloadCollision,
            Outcome::BusinessDuplicate { .. } => OutcomeKind::BusinessDuplicate,
            Outcome::Retry { .. } => OutcomeKind::Retry,
            Outcome::DeadLettered { .. } => OutcomeKind::DeadLettered,
            Outcome::Interrupted => OutcomeKind::Interrupted,
        }
    }

    /// A stable label (`applied`, `duplicate`, ...), used in metrics and logs.
    pub fn label(&self) -> &'static str {
        self.kind().label()
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::DeadLettered { reason, .. } => write!(f, "dead_lettered({reason})"),
            other => f.write_str(other.label()),
        }
    }
}
