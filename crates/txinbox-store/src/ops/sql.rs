//! The SQL of the operator queries: the consumers, one consumer's figures, one message's rows, the rejections.

// The SQL, written once with `$N` placeholders (SQLite gets `?N`).

use chrono::{DateTime, Utc};

use super::{RejectionFilter, MAX_REJECTIONS};

/// The consumers of a table, by a skip scan over its index led by `consumer_name`.
pub(super) fn consumers_sql(table: &str) -> String {
    format!(
        "WITH RECURSIVE c(name) AS (\
         SELECT min(consumer_name) FROM {table} \
         UNION ALL \
         SELECT (SELECT min(consumer_name) FROM {table} WHERE consumer_name > c.name) FROM c WHERE c.name IS NOT NULL) \
         SELECT name FROM c WHERE name IS NOT NULL LIMIT $1"
    )
}

pub(super) const INBOX_STATS: &str = "SELECT count(*), min(processed_at), max(processed_at), count(CASE WHEN processed_at >= $2 THEN 1 END) FROM txinbox_inbox WHERE consumer_name = $1";
pub(super) const REJECTION_STATS: &str = "SELECT kind, count(*), max(recorded_at) FROM txinbox_rejections WHERE consumer_name = $1 GROUP BY kind";
pub(super) const EFFECT_STATS: &str = "SELECT state, count(*), min(created_at) FROM txinbox_effects WHERE consumer_name = $1 GROUP BY state";

const MARKER_COLUMNS: &str = "i.consumer_name, i.source, i.message_id, i.event_type, i.business_key, i.payload_hash, i.contract_version, i.tenant_id, i.received_at, i.processed_at, i.result_reference, i.retention_until, i.id_origin, i.delivery_count";
const REJECTION_COLUMNS: &str = "id, consumer_name, source, message_id, kind, business_key, payload_hash, conflicts_with, detail, recorded_at";
const EFFECT_COLUMNS: &str = "id, idempotency_key, name, destination, external_ref, group_key, state, attempts, reconciliations, next_attempt_at, claimed_by, claim_until, result_reference, last_error, created_at, updated_at, finished_at";

pub(super) fn marker_sql(with_source: bool) -> String {
    if with_source {
        format!("SELECT {MARKER_COLUMNS} FROM txinbox_inbox i WHERE i.consumer_name = $1 AND i.message_id = $2 AND i.source = $3")
    } else {
        // The consumer's sources by a skip scan over the primary key, then one primary-key probe each.
        format!(
            "WITH RECURSIVE s(source) AS (\
             SELECT min(source) FROM txinbox_inbox WHERE consumer_name = $1 \
             UNION ALL \
             SELECT (SELECT min(source) FROM txinbox_inbox WHERE consumer_name = $1 AND source > s.source) FROM s WHERE s.source IS NOT NULL) \
             SELECT {MARKER_COLUMNS} FROM s JOIN txinbox_inbox i ON i.consumer_name = $1 AND i.source = s.source AND i.message_id = $2 \
             ORDER BY i.source"
        )
    }
}

// A message's rejections and effects are few: they are sorted after the query, since an ORDER BY here would
// tempt SQLite (without ANALYZE statistics) into the consumer's time-ordered index instead of the message's.
pub(super) fn message_rejections_sql(with_source: bool) -> String {
    format!(
        "SELECT {REJECTION_COLUMNS} FROM txinbox_rejections WHERE consumer_name = $1 AND message_id = $2{}",
        if with_source { " AND source = $3" } else { "" }
    )
}

pub(super) fn message_effects_sql() -> String {
    format!(
        "SELECT {EFFECT_COLUMNS} FROM txinbox_effects WHERE consumer_name = $1 AND message_id = $2"
    )
}

/// A bound parameter.
#[derive(Clone, Debug)]
pub(super) enum Param {
    Text(String),
    Time(DateTime<Utc>),
    Int(i64),
}

pub(super) fn rejections_sql(f: &RejectionFilter) -> (String, Vec<Param>) {
    let mut clauses = Vec::new();
    let mut params = Vec::new();
    let mut push = |clause: &str, p: Param| {
        params.push(p);
        clauses.push(format!("{clause} ${}", params.len()));
    };
    if let Some(c) = &f.consumer {
        push("consumer_name =", Param::Text(c.clone()));
    }
    if let Some(k) = &f.kind {
        push("kind =", Param::Text(k.clone()));
    }
    if let Some(t) = f.since {
        push("recorded_at >=", Param::Time(t));
    }
    if let Some(t) = f.until {
        push("recorded_at <", Param::Time(t));
    }
    params.push(Param::Int(f.limit.clamp(1, MAX_REJECTIONS)));
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (
        format!(
            "SELECT {REJECTION_COLUMNS} FROM txinbox_rejections{filter} ORDER BY recorded_at DESC, id DESC LIMIT ${}",
            params.len()
        ),
        params,
    )
}
