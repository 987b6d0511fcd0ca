//! What a store answers an operator (`txinbox inbox stats|show|rejections`): one consumer's figures, one
//! message's story, the rejections. Every store returns these same types, so the operator's commands print the
//! same text and JSON whatever the store; the queries themselves are the stores' own (`txinbox_store::ops`,
//! `txinbox_dynamodb::ops`), each bounded by a key or an index.
//!
//! The results are [`serde::Serialize`], with stable field names, for machine-readable output; times are RFC
//! 3339 UTC. They are plain records, not `#[non_exhaustive]`: a store outside this crate builds them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The rejection kinds the inbox records, in the order they are reported.
pub const REJECTION_KINDS: [&str; 2] = ["payload_collision", "business_duplicate"];

/// Effect states counted as waiting to run: the oldest of them is the effect lag.
pub const WAITING_EFFECT_STATES: [&str; 3] = ["pending", "in_flight", "uncertain"];

/// The most rows [`RejectionFilter::limit`] accepts.
pub const MAX_REJECTIONS: i64 = 10_000;

/// One consumer's figures: inbox rows, growth, rejections and effects.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConsumerStats {
    /// The consumer's name.
    pub consumer: String,
    /// Its markers (an exact count).
    pub inbox_rows: i64,
    /// The oldest marker's `processed_at`; `None` without markers.
    pub oldest_processed_at: Option<DateTime<Utc>>,
    /// The newest marker's `processed_at`; `None` without markers.
    pub newest_processed_at: Option<DateTime<Utc>>,
    /// Markers processed in the hour before [`ConsumerStats::measured_at`] (the growth per hour).
    pub rows_last_hour: i64,
    /// Rejections by kind: `payload_collision` and `business_duplicate` are always present (0 when none).
    pub rejections: BTreeMap<String, i64>,
    /// The newest rejection's time; `None` without rejections.
    pub last_rejection_at: Option<DateTime<Utc>>,
    /// Effects by state: every state of [`crate::effects::EffectState::ALL`] is present (0 when none).
    pub effects: BTreeMap<String, i64>,
    /// The oldest effect still waiting to run (`pending`, `in_flight` or `uncertain`): its `created_at`.
    pub oldest_pending_effect_at: Option<DateTime<Utc>>,
    /// The effect lag: seconds from [`ConsumerStats::oldest_pending_effect_at`] to
    /// [`ConsumerStats::measured_at`]; `None` when no effect waits.
    pub effect_lag_seconds: Option<f64>,
    /// When the figures were taken.
    pub measured_at: DateTime<Utc>,
}

impl ConsumerStats {
    /// The figures of a consumer with nothing yet, measured at `measured_at`: every count 0, every rejection
    /// kind and effect state present. A store fills in what it finds.
    pub fn new(consumer: impl Into<String>, measured_at: DateTime<Utc>) -> Self {
        Self {
            consumer: consumer.into(),
            inbox_rows: 0,
            oldest_processed_at: None,
            newest_processed_at: None,
            rows_last_hour: 0,
            rejections: REJECTION_KINDS
                .iter()
                .map(|k| ((*k).to_owned(), 0))
                .collect(),
            last_rejection_at: None,
            effects: crate::effects::EffectState::ALL
                .iter()
                .map(|s| (s.as_str().to_owned(), 0))
                .collect(),
            oldest_pending_effect_at: None,
            effect_lag_seconds: None,
            measured_at,
        }
    }
}

/// A marker: everything the store keeps of an applied message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MarkerView {
    /// The consumer.
    pub consumer: String,
    /// The message's source (empty when the identity has none).
    pub source: String,
    /// The message id.
    pub message_id: String,
    /// The event type.
    pub event_type: Option<String>,
    /// The business key (unique per consumer and tenant).
    pub business_key: Option<String>,
    /// The payload's fingerprint.
    pub payload_hash: String,
    /// The contract version.
    pub contract_version: Option<String>,
    /// The tenant.
    pub tenant_id: Option<String>,
    /// When the delivery that applied the message was received.
    pub received_at: DateTime<Utc>,
    /// When it was applied (the transaction's time).
    pub processed_at: DateTime<Utc>,
    /// The handler's result reference.
    pub result_reference: Option<String>,
    /// Until when the marker is kept.
    pub retention_until: DateTime<Utc>,
    /// Where the message id came from (`cloudevents`, `broker`, ...).
    pub id_origin: String,
    /// The broker's delivery count of the applied delivery.
    pub delivery_count: i64,
}

/// A rejection's id: a row number (SQL stores) or an evidence item's UUID (DynamoDB). Serialized as the
/// number or the string itself.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum RejectionId {
    /// A row number.
    Number(i64),
    /// A UUID.
    Uuid(String),
}

impl std::fmt::Display for RejectionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectionId::Number(n) => write!(f, "{n}"),
            RejectionId::Uuid(u) => f.write_str(u),
        }
    }
}

/// A rejection: a payload collision or a business duplicate, with its evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RejectionRow {
    /// The rejection's id.
    pub id: RejectionId,
    /// The consumer.
    pub consumer: String,
    /// The rejected message's source.
    pub source: String,
    /// The rejected message's id.
    pub message_id: String,
    /// `payload_collision` or `business_duplicate`.
    pub kind: String,
    /// The rejected message's business key.
    pub business_key: Option<String>,
    /// The rejected message's payload hash.
    pub payload_hash: String,
    /// The stored hash (a collision) or the holder's message id (a business duplicate).
    pub conflicts_with: String,
    /// Free detail.
    pub detail: String,
    /// When it was recorded.
    pub recorded_at: DateTime<Utc>,
}

/// An effect of a message (its payload is not shown).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EffectView {
    /// The effect's id (on DynamoDB, derived from its key).
    pub id: i64,
    /// The idempotency key.
    pub key: String,
    /// The effect's name.
    pub name: String,
    /// The destination.
    pub destination: String,
    /// The reference the destination knows it by.
    pub external_ref: String,
    /// The ordered group, if any.
    pub group_key: Option<String>,
    /// The state (`pending`, `in_flight`, `done`, ...).
    pub state: String,
    /// Calls made.
    pub attempts: i64,
    /// Reconciliations made.
    pub reconciliations: i64,
    /// When it is due next.
    pub next_attempt_at: DateTime<Utc>,
    /// The runner holding its claim.
    pub claimed_by: Option<String>,
    /// Until when the claim holds.
    pub claim_until: Option<DateTime<Utc>>,
    /// The destination's reference of the done effect.
    pub reference: Option<String>,
    /// The last error (or a compensation's note).
    pub last_error: Option<String>,
    /// When it was recorded (the inbox transaction).
    pub created_at: DateTime<Utc>,
    /// Its last change.
    pub updated_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
}

/// Everything the store knows of one message of one consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MessageStory {
    /// The consumer asked about.
    pub consumer: String,
    /// The message id asked about.
    pub message_id: String,
    /// The source asked about (`None`: any source; always given on DynamoDB, where it is part of the marker's
    /// key).
    pub source: Option<String>,
    /// Its markers (one per source with this message id; usually zero or one).
    pub markers: Vec<MarkerView>,
    /// Its rejections, oldest first.
    pub rejections: Vec<RejectionRow>,
    /// Its effects, in the order they were recorded (effects have no source: all of the message id's).
    pub effects: Vec<EffectView>,
}

impl MessageStory {
    /// Whether the store knows anything of the message.
    pub fn found(&self) -> bool {
        !(self.markers.is_empty() && self.rejections.is_empty() && self.effects.is_empty())
    }
}

/// Which rejections to list, newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectionFilter {
    /// Only this consumer's (required on DynamoDB, where a consumer's evidence is one partition).
    pub consumer: Option<String>,
    /// Only this kind (`payload_collision` or `business_duplicate`).
    pub kind: Option<String>,
    /// Recorded at or after.
    pub since: Option<DateTime<Utc>>,
    /// Recorded before.
    pub until: Option<DateTime<Utc>>,
    /// At most this many (1 to [`MAX_REJECTIONS`]; default 50).
    pub limit: i64,
}

impl Default for RejectionFilter {
    fn default() -> Self {
        Self {
            consumer: None,
            kind: None,
            since: None,
            until: None,
            limit: 50,
        }
    }
}

impl RejectionFilter {
    /// Every consumer, every kind, the 50 newest.
    pub fn new() -> Self {
        Self::default()
    }
    /// Only this consumer's.
    pub fn consumer(mut self, c: impl Into<String>) -> Self {
        self.consumer = Some(c.into());
        self
    }
    /// Only this kind.
    pub fn kind(mut self, k: impl Into<String>) -> Self {
        self.kind = Some(k.into());
        self
    }
    /// Recorded at or after `t`.
    pub fn since(mut self, t: DateTime<Utc>) -> Self {
        self.since = Some(t);
        self
    }
    /// Recorded before `t`.
    pub fn until(mut self, t: DateTime<Utc>) -> Self {
        self.until = Some(t);
        self
    }
    /// At most `n` rows (clamped to 1..=[`MAX_REJECTIONS`]).
    pub fn limit(mut self, n: i64) -> Self {
        self.limit = n.clamp(1, MAX_REJECTIONS);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_s_figures_start_with_every_kind_and_state_at_zero() {
        let now = Utc::now();
        let s = ConsumerStats::new("crm", now);
        assert_eq!(s.rejections.len(), REJECTION_KINDS.len());
        assert_eq!(
            s.effects.len(),
            crate::effects::EffectState::ALL.len(),
            "{:?}",
            s.effects
        );
        assert!(s
            .rejections
            .values()
            .chain(s.effects.values())
            .all(|n| *n == 0));
        assert_eq!((s.inbox_rows, s.measured_at), (0, now));
    }

    #[test]
    fn the_filter_clamps_its_limit() {
        assert_eq!(RejectionFilter::new().limit(0).limit, 1);
        assert_eq!(
            RejectionFilter::new().limit(1_000_000).limit,
            MAX_REJECTIONS
        );
        assert_eq!(RejectionFilter::new().limit, 50);
    }

    #[test]
    fn a_rejection_id_is_written_as_the_number_or_the_uuid_itself() {
        let n = RejectionId::Number(42);
        let u = RejectionId::Uuid("0b7c".into());
        assert_eq!(serde_json::to_string(&n).unwrap(), "42");
        assert_eq!(serde_json::to_string(&u).unwrap(), r#""0b7c""#);
        assert_eq!((n.to_string(), u.to_string()), ("42".into(), "0b7c".into()));
    }
}
