//! The items the inbox transaction writes (marker, business key item, effect) and a refused one's holder.

use txinbox_core::effects::NewEffect;
use txinbox_core::store::ExistingMarker;

use super::DynamoStore;
use crate::layout::{self as l, b, n, s, Item, Reader};
use crate::tx::PendingMarker;
use crate::DynamoError;

impl DynamoStore {
    pub(super) fn marker_item(m: &PendingMarker, reference: Option<&str>, token: &str) -> Item {
        let id = &m.identity;
        let consumer = id.consumer.as_str();
        let mut item = Item::new();
        let pk = l::marker_pk(consumer, &id.source, &id.message_id);
        let shard = l::marker_shard(&pk);
        item.insert(l::PK.into(), s(pk));
        item.insert("kind".into(), s("marker"));
        item.insert("consumer".into(), s(consumer));
        item.insert("source".into(), s(&id.source));
        item.insert("message_id".into(), s(&id.message_id));
        item.insert("id_origin".into(), s(id.origin.as_str()));
        item.insert("payload_hash".into(), s(&m.payload_hash));
        for (k, v) in [
            ("event_type", &id.event_type),
            ("contract_version", &id.contract_version),
            ("tenant_id", &id.tenant_id),
            ("business_key", &id.business_key),
        ] {
            if let Some(v) = v {
                item.insert(k.into(), s(v));
            }
        }
        if let Some(r) = reference {
            item.insert("result_reference".into(), s(r));
        }
        item.insert("received_at".into(), s(l::ts(m.received_at)));
        item.insert("processed_at".into(), s(l::ts(m.processed_at)));
        item.insert("retention_until".into(), s(l::ts(m.retention_until)));
        item.insert(l::EXPIRES_AT.into(), n(l::epoch_ceil(m.retention_until)));
        // Kept as the SQL stores keep it (their INTEGER column): at most `i32::MAX`.
        item.insert(
            "delivery_count".into(),
            n(m.delivery_count.min(i32::MAX as u32)),
        );
        item.insert("token".into(), s(token));
        item.insert("gsi1pk".into(), s(l::markers_of(consumer, shard)));
        item.insert(
            "gsi1sk".into(),
            s(format!("{}#{}", l::ts(m.processed_at), id.message_id)),
        );
        item
    }

    pub(super) fn business_item(m: &PendingMarker, key: &str, reference: Option<&str>) -> Item {
        let id = &m.identity;
        let consumer = id.consumer.as_str();
        let mut item = Item::new();
        item.insert(
            l::PK.into(),
            s(l::business_pk(consumer, id.tenant_id.as_deref(), key)),
        );
        item.insert("kind".into(), s("business_key"));
        item.insert("consumer".into(), s(consumer));
        item.insert("source".into(), s(&id.source));
        item.insert("message_id".into(), s(&id.message_id));
        item.insert("payload_hash".into(), s(&m.payload_hash));
        item.insert("processed_at".into(), s(l::ts(m.processed_at)));
        if let Some(r) = reference {
            item.insert("result_reference".into(), s(r));
        }
        item.insert(l::EXPIRES_AT.into(), n(l::epoch_ceil(m.retention_until)));
        item
    }

    pub(super) fn holder(item: &Item, same_identity: bool) -> Result<ExistingMarker, DynamoError> {
        let r = Reader::new(item);
        Ok(ExistingMarker::new(
            same_identity,
            r.s("message_id")?,
            r.s("payload_hash")?,
            r.time("processed_at")?,
            r.opt_s("result_reference")?,
        ))
    }
}

pub(crate) fn effect_item(e: &NewEffect<'_>) -> Item {
    let fx = e.effect;
    let id = l::effect_id(&e.key);
    let created = l::ts(e.created_at);
    let mut item = Item::new();
    item.insert(l::PK.into(), s(l::effect_pk(id)));
    item.insert("kind".into(), s("effect"));
    item.insert("id".into(), n(id));
    item.insert("consumer".into(), s(e.consumer));
    item.insert("message_id".into(), s(e.message_id));
    item.insert("key".into(), s(&e.key));
    item.insert("name".into(), s(&fx.name));
    item.insert("destination".into(), s(&fx.destination));
    item.insert("payload".into(), b(&fx.payload));
    if !fx.metadata.is_empty() {
        use aws_sdk_dynamodb::types::AttributeValue;
        // A map, unless a key is empty: DynamoDB refuses an empty key in a map attribute, so such metadata is
        // a list of [key, value] pairs (`Reader::string_map` reads both).
        let value = if fx.metadata.keys().any(String::is_empty) {
            AttributeValue::L(
                fx.metadata
                    .iter()
                    .map(|(k, v)| AttributeValue::L(vec![s(k), s(v)]))
                    .collect(),
            )
        } else {
            AttributeValue::M(fx.metadata.iter().map(|(k, v)| (k.clone(), s(v))).collect())
        };
        item.insert("metadata".into(), value);
    }
    item.insert(
        "external_ref".into(),
        s(fx.external_ref.as_deref().unwrap_or(&e.key)),
    );
    item.insert("state".into(), s("pending"));
    item.insert("attempts".into(), n(0));
    item.insert("reconciliations".into(), n(0));
    item.insert("next_at".into(), s(&created));
    item.insert("created_at".into(), s(&created));
    item.insert("updated_at".into(), s(&created));
    item.insert("gsi1pk".into(), s(l::effect_shard(l::shard_of(id))));
    item.insert("gsi1sk".into(), s(format!("{created}#{id}")));
    item.insert(
        "gsi2pk".into(),
        s(l::due_of(&fx.destination, l::due_shard(id))),
    );
    item.insert("gsi2sk".into(), s(format!("{created}#{id}")));
    if let Some(g) = &fx.group {
        item.insert("group_key".into(), s(g));
    }
    item
}
