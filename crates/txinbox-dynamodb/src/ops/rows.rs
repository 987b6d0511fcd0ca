//! Decoding the items a query reads: markers, evidence and effects, their sort keys and their expiry.

use chrono::{DateTime, Utc};

use super::{EffectView, MarkerView, RejectionId, RejectionRow};
use crate::layout::{self as l, Item, Reader};
use crate::DynamoError;

/// The time at the head of a `by_consumer` sort key (`<RFC 3339>#<id>`).
pub(super) fn sk_time(sk: &str) -> Option<DateTime<Utc>> {
    sk.split('#')
        .next()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
}

pub(super) fn marker_from(item: &Item) -> Result<MarkerView, DynamoError> {
    let r = Reader::new(item);
    Ok(MarkerView {
        consumer: r.s("consumer")?,
        source: r.s("source")?,
        message_id: r.s("message_id")?,
        event_type: r.opt_s("event_type")?,
        business_key: r.opt_s("business_key")?,
        payload_hash: r.s("payload_hash")?,
        contract_version: r.opt_s("contract_version")?,
        tenant_id: r.opt_s("tenant_id")?,
        received_at: r.time("received_at")?,
        processed_at: r.time("processed_at")?,
        result_reference: r.opt_s("result_reference")?,
        retention_until: r.time("retention_until")?,
        id_origin: r.s("id_origin")?,
        delivery_count: r.i64("delivery_count")?,
    })
}

pub(super) fn rejection_from(item: &Item) -> Result<RejectionRow, DynamoError> {
    let r = Reader::new(item);
    let pk = r.s(l::PK)?;
    Ok(RejectionRow {
        id: RejectionId::Uuid(pk.strip_prefix("r#").unwrap_or(&pk).to_owned()),
        consumer: r.s("consumer")?,
        source: r.s("source")?,
        message_id: r.s("message_id")?,
        kind: r.s("kind")?,
        business_key: r.opt_s("business_key")?,
        payload_hash: r.s("payload_hash")?,
        conflicts_with: r.s("conflicts_with")?,
        detail: r.s("detail")?,
        recorded_at: r.time("recorded_at")?,
    })
}

pub(super) fn effect_from(item: &Item) -> Result<EffectView, DynamoError> {
    let r = Reader::new(item);
    Ok(EffectView {
        id: r.i64("id")?,
        key: r.s("key")?,
        name: r.s("name")?,
        destination: r.s("destination")?,
        external_ref: r.s("external_ref")?,
        group_key: r.opt_s("group_key")?,
        state: r.s("state")?,
        attempts: r.i64("attempts")?,
        reconciliations: r.i64("reconciliations")?,
        next_attempt_at: r.time("next_at")?,
        claimed_by: r.opt_s("claimed_by")?,
        claim_until: r.opt_time("claim_until")?,
        reference: r.opt_s("result_reference")?,
        last_error: r.opt_s("last_error")?,
        created_at: r.time("created_at")?,
        updated_at: r.time("updated_at")?,
        finished_at: r.opt_time("finished_at")?,
    })
}

/// Whether an item is past its `expires_at` (the store treats it as absent).
pub(super) fn expired(item: &Item, now_epoch: i64) -> Result<bool, DynamoError> {
    Ok(Reader::new(item)
        .opt_i64(l::EXPIRES_AT)?
        .is_some_and(|e| e < now_epoch))
}
