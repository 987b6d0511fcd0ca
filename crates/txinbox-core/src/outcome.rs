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
    Duplicate,
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

impl Outcome {
    /// A stable label (`applied`, `duplicate`, ...), used in metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Applied { .. } => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::PayloadCollision { .. } => "payload_collision",
            Outcome::BusinessDuplicate { .. } => "business_duplicate",
            Outcome::Retry { .. } => "retry",
            Outcome::DeadLettered { .. } => "dead_lettered",
            Outcome::Interrupted => "interrupted",
        }
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
