//! Read-only queries for an operator on a DynamoDB store: one consumer's figures, one message's story, and
//! a consumer's rejections (`txinbox inbox stats|show|rejections --store dynamodb://TABLE`).
//!
//! The result types mirror those of the SQL stores' `txinbox_store::ops` field for field (this crate does not
//! depend on the SQL store), with one difference: a rejection's id is the evidence item's UUID, not a number.
//!
//! ## What each query reads
//!
//! Every read goes through a key: a `GetItem` of one item, or a `Query` of one partition of the
//! `by_consumer` index (eventually consistent, as every index read). A `Query` is billed for every item it
//! reads from the partition's key range, about **0.5 read unit per 4 KB** read (eventually consistent),
//! whatever its filter or projection keeps and even with `Select=COUNT`: a filter only trims the answer.
//! There is no scan anywhere, and no way to list consumers (no index has them), so every query names its
//! consumer.
//!
//! | query | reads |
//! |---|---|
//! | [`DynamoStore::consumer_stats`](crate::DynamoStore::consumer_stats) | the consumer's marker partition and evidence partition (every item not yet deleted by the TTL), and the 8 effect shards (every effect of every consumer) |
//! | [`DynamoStore::message_story`](crate::DynamoStore::message_story) | one `GetItem` (the marker), the consumer's evidence partition, and either one `GetItem` per effect name given or the 8 effect shards |
//! | [`DynamoStore::rejections`](crate::DynamoStore::rejections) | the consumer's evidence partition between `since` and `until`, newest first, until `limit` rows of the kind asked are found |
//!
//! Expired items (`expires_at` passed, not yet deleted by the TTL) are left out, as the store treats them:
//! absent from that second on. They are still read, and billed, until the TTL deletes them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

mod partition;
mod queries;
mod rows;
#[cfg(test)]
mod tests;

/// The rejection kinds the inbox records, in the order they are reported.
pub const REJECTION_KINDS: [&str; 2] = ["payload_collision", "business_duplicate"];

/// Effect states counted as waiting to run: the oldest of them is the effect lag.
pub const WAITING_EFFECT_STATES: [&str; 3] = ["pending", "in_flight", "uncertain"];

/// The most rows [`RejectionFilter::limit`] accepts.
pub const MAX_REJECTIONS: i64 = 10_000;

/// One consumer's figures: markers, growth, rejections and effects.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// The consumer's name.
    pub consumer: String,
    /// Its markers not yet expired (an exact count).
    pub inbox_rows: i64,
    /// The oldest marker's `processed_at`; `None` without markers.
    pub oldest_processed_at: Option<DateTime<Utc>>,
    /// The newest marker's `processed_at`; `None` without markers.
    pub newest_processed_at: Option<DateTime<Utc>>,
    /// Markers processed in the hour before [`ConsumerStats::measured_at`].
    pub rows_last_hour: i64,
    /// Rejections by kind: `payload_collision` and `business_duplicate` are always present (0 when none).
    pub rejections: BTreeMap<String, i64>,
    /// The newest rejection's time; `None` without rejections.
    pub last_rejection_at: Option<DateTime<Utc>>,
    /// Effects by state: every state of [`EffectState::ALL`](txinbox_core::effects::EffectState::ALL) is
    /// present (0 when none).
    pub effects: BTreeMap<String, i64>,
    /// The oldest effect still waiting to run (`pending`, `in_flight` or `uncertain`): its `created_at`.
    pub oldest_pending_effect_at: Option<DateTime<Utc>>,
    /// Seconds from [`ConsumerStats::oldest_pending_effect_at`] to [`ConsumerStats::measured_at`]; `None`
    /// when no effect waits.
    pub effect_lag_seconds: Option<f64>,
    /// When the figures were taken.
    pub measured_at: DateTime<Utc>,
}

/// A marker: every attribute of a marker item the SQL stores have a column for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MarkerView {
    /// The consumer.
    pub consumer: String,
    /// The message's source (`""` when the identity has none).
    pub source: String,
    /// The message id.
    pub message_id: String,
    /// The event type.
    pub event_type: Option<String>,
    /// The business key.
    pub business_key: Option<String>,
    /// The payload's fingerprint.
    pub payload_hash: String,
    /// The contract version.
    pub contract_version: Option<String>,
    /// The tenant.
    pub tenant_id: Option<String>,
    /// When the delivery that applied the message was received.
    pub received_at: DateTime<Utc>,
    /// When it was applied.
    pub processed_at: DateTime<Utc>,
    /// The handler's result reference.
    pub result_reference: Option<String>,
    /// Until when the marker is kept.
    pub retention_until: DateTime<Utc>,
    /// Where the message id came from.
    pub id_origin: String,
    /// The broker's delivery count of the applied delivery.
    pub delivery_count: i64,
}

/// A rejection: a payload collision or a business duplicate, with its evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectionRow {
    /// The evidence item's id (a UUID).
    pub id: String,
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
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EffectView {
    /// The effect's id ([`layout::effect_id`](crate::layout::effect_id) of its key).
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
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageStory {
    /// The consumer asked about.
    pub consumer: String,
    /// The message id asked about.
    pub message_id: String,
    /// The source asked about (always given on DynamoDB: it is part of the marker's key).
    pub source: Option<String>,
    /// Its marker (zero or one).
    pub markers: Vec<MarkerView>,
    /// Its rejections (of this source), oldest first.
    pub rejections: Vec<RejectionRow>,
    /// Its effects, by id (effects have no source: all of the message id's, or those named).
    pub effects: Vec<EffectView>,
}

impl MessageStory {
    /// Whether the store knows anything of the message.
    pub fn found(&self) -> bool {
        !(self.markers.is_empty() && self.rejections.is_empty() && self.effects.is_empty())
    }
}

/// Which rejections of one consumer to list, newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectionFilter {
    /// The consumer (its evidence partition is the one read).
    pub consumer: String,
    /// Only this kind (`payload_collision` or `business_duplicate`).
    pub kind: Option<String>,
    /// Recorded at or after.
    pub since: Option<DateTime<Utc>>,
    /// Recorded before.
    pub until: Option<DateTime<Utc>>,
    /// At most this many (1 to [`MAX_REJECTIONS`]; default 50).
    pub limit: i64,
}

impl RejectionFilter {
    /// Every kind of `consumer`'s rejections, the 50 newest.
    pub fn new(consumer: impl Into<String>) -> Self {
        Self {
            consumer: consumer.into(),
            kind: None,
            since: None,
            until: None,
            limit: 50,
        }
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
