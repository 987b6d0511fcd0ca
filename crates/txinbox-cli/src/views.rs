//! What `txinbox inbox` prints, whatever the store: the SQL stores' results (`txinbox_store::ops`) and the
//! DynamoDB store's (`txinbox_dynamodb::ops`) are converted into these, field for field, so that the text and
//! the JSON are the same on every store. (The two crates' types cannot be shared: `txinbox-dynamodb` does not
//! depend on the SQL store, and the SQL store's types cannot be built outside their crate.) The one difference
//! is a rejection's id: a number on SQL, the evidence item's UUID on DynamoDB.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use txinbox_dynamodb::ops as dy;
use txinbox_store::ops as sql;

/// One consumer's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    pub consumer: String,
    pub inbox_rows: i64,
    pub oldest_processed_at: Option<DateTime<Utc>>,
    pub newest_processed_at: Option<DateTime<Utc>>,
    pub rows_last_hour: i64,
    pub rejections: BTreeMap<String, i64>,
    pub last_rejection_at: Option<DateTime<Utc>>,
    pub effects: BTreeMap<String, i64>,
    pub oldest_pending_effect_at: Option<DateTime<Utc>>,
    pub effect_lag_seconds: Option<f64>,
    pub measured_at: DateTime<Utc>,
}

/// A marker.
#[derive(Clone, Debug, Serialize)]
pub struct Marker {
    pub consumer: String,
    pub source: String,
    pub message_id: String,
    pub event_type: Option<String>,
    pub business_key: Option<String>,
    pub payload_hash: String,
    pub contract_version: Option<String>,
    pub tenant_id: Option<String>,
    pub received_at: DateTime<Utc>,
    pub processed_at: DateTime<Utc>,
    pub result_reference: Option<String>,
    pub retention_until: DateTime<Utc>,
    pub id_origin: String,
    pub delivery_count: i64,
}

/// A rejection's id: a row number (SQL) or an evidence item's UUID (DynamoDB).
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum RowId {
    Number(i64),
    Uuid(String),
}

impl std::fmt::Display for RowId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RowId::Number(n) => write!(f, "{n}"),
            RowId::Uuid(s) => f.write_str(s),
        }
    }
}

/// A rejection.
#[derive(Clone, Debug, Serialize)]
pub struct Rejection {
    pub id: RowId,
    pub consumer: String,
    pub source: String,
    pub message_id: String,
    pub kind: String,
    pub business_key: Option<String>,
    pub payload_hash: String,
    pub conflicts_with: String,
    pub detail: String,
    pub recorded_at: DateTime<Utc>,
}

/// An effect of a message.
#[derive(Clone, Debug, Serialize)]
pub struct Effect {
    pub id: i64,
    pub key: String,
    pub name: String,
    pub destination: String,
    pub external_ref: String,
    pub group_key: Option<String>,
    pub state: String,
    pub attempts: i64,
    pub reconciliations: i64,
    pub next_attempt_at: DateTime<Utc>,
    pub claimed_by: Option<String>,
    pub claim_until: Option<DateTime<Utc>>,
    pub reference: Option<String>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// One message's story.
#[derive(Clone, Debug, Serialize)]
pub struct Story {
    pub consumer: String,
    pub message_id: String,
    pub source: Option<String>,
    pub markers: Vec<Marker>,
    pub rejections: Vec<Rejection>,
    pub effects: Vec<Effect>,
}

impl Story {
    /// Whether the store knows anything of the message.
    pub fn found(&self) -> bool {
        !(self.markers.is_empty() && self.rejections.is_empty() && self.effects.is_empty())
    }
}

/// The same conversion from either crate's type (their fields have the same names and types).
macro_rules! stats_from {
    ($t:ty) => {
        impl From<$t> for Stats {
            fn from(s: $t) -> Self {
                Self {
                    consumer: s.consumer,
                    inbox_rows: s.inbox_rows,
                    oldest_processed_at: s.oldest_processed_at,
                    newest_processed_at: s.newest_processed_at,
                    rows_last_hour: s.rows_last_hour,
                    rejections: s.rejections,
                    last_rejection_at: s.last_rejection_at,
                    effects: s.effects,
                    oldest_pending_effect_at: s.oldest_pending_effect_at,
                    effect_lag_seconds: s.effect_lag_seconds,
                    measured_at: s.measured_at,
                }
            }
        }
    };
}

macro_rules! marker_from {
    ($t:ty) => {
        impl From<$t> for Marker {
            fn from(m: $t) -> Self {
                Self {
                    consumer: m.consumer,
                    source: m.source,
                    message_id: m.message_id,
                    event_type: m.event_type,
                    business_key: m.business_key,
                    payload_hash: m.payload_hash,
                    contract_version: m.contract_version,
                    tenant_id: m.tenant_id,
                    received_at: m.received_at,
                    processed_at: m.processed_at,
                    result_reference: m.result_reference,
                    retention_until: m.retention_until,
                    id_origin: m.id_origin,
                    delivery_count: m.delivery_count,
                }
            }
        }
    };
}

macro_rules! rejection_from {
    ($t:ty, $id:expr) => {
        impl From<$t> for Rejection {
            fn from(r: $t) -> Self {
                Self {
                    id: $id(r.id),
                    consumer: r.consumer,
                    source: r.source,
                    message_id: r.message_id,
                    kind: r.kind,
                    business_key: r.business_key,
                    payload_hash: r.payload_hash,
                    conflicts_with: r.conflicts_with,
                    detail: r.detail,
                    recorded_at: r.recorded_at,
                }
            }
        }
    };
}

macro_rules! effect_from {
    ($t:ty) => {
        impl From<$t> for Effect {
            fn from(e: $t) -> Self {
                Self {
                    id: e.id,
                    key: e.key,
                    name: e.name,
                    destination: e.destination,
                    external_ref: e.external_ref,
                    group_key: e.group_key,
                    state: e.state,
                    attempts: e.attempts,
                    reconciliations: e.reconciliations,
                    next_attempt_at: e.next_attempt_at,
                    claimed_by: e.claimed_by,
                    claim_until: e.claim_until,
                    reference: e.reference,
                    last_error: e.last_error,
                    created_at: e.created_at,
                    updated_at: e.updated_at,
                    finished_at: e.finished_at,
                }
            }
        }
    };
}

macro_rules! story_from {
    ($t:ty) => {
        impl From<$t> for Story {
            fn from(s: $t) -> Self {
                Self {
                    consumer: s.consumer,
                    message_id: s.message_id,
                    source: s.source,
                    markers: s.markers.into_iter().map(Into::into).collect(),
                    rejections: s.rejections.into_iter().map(Into::into).collect(),
                    effects: s.effects.into_iter().map(Into::into).collect(),
                }
            }
        }
    };
}

stats_from!(sql::ConsumerStats);
stats_from!(dy::ConsumerStats);
marker_from!(sql::MarkerView);
marker_from!(dy::MarkerView);
rejection_from!(sql::RejectionRow, RowId::Number);
rejection_from!(dy::RejectionRow, RowId::Uuid);
effect_from!(sql::EffectView);
effect_from!(dy::EffectView);
story_from!(sql::MessageStory);
story_from!(dy::MessageStory);
