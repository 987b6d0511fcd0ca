//! The service's limits on a transaction, checked before anything is sent.

use std::collections::HashSet;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use super::{EFFECT_FINISH_ROOM, MAX_ACTIONS, MAX_ITEM_BYTES, MAX_TRANSACTION_BYTES};
use crate::layout::{self as l, Item};
use crate::DynamoError;

pub(super) fn action_table(a: &TransactWriteItem) -> &str {
    if let Some(p) = a.put() {
        return p.table_name();
    }
    if let Some(u) = a.update() {
        return u.table_name();
    }
    if let Some(d) = a.delete() {
        return d.table_name();
    }
    if let Some(c) = a.condition_check() {
        return c.table_name();
    }
    "?"
}

fn action_key(a: &TransactWriteItem) -> Option<String> {
    let (table, key) = if let Some(p) = a.put() {
        // A put's key is inside its item; the store's items carry `pk`, a handler's may use any key: the
        // whole item then stands for it, which can only miss a duplicate (DynamoDB then refuses the call
        // with a `ValidationException`, which the commit turns into `DynamoError::Refused`), never invent
        // one.
        (p.table_name(), p.item())
    } else if let Some(u) = a.update() {
        (u.table_name(), u.key())
    } else if let Some(d) = a.delete() {
        (d.table_name(), d.key())
    } else if let Some(c) = a.condition_check() {
        (c.table_name(), c.key())
    } else {
        return None;
    };
    let mut parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    parts.sort();
    Some(format!("{table}|{}", parts.join("|")))
}

/// The handler's actions against the service's limits, before anything is sent: a clear permanent error,
/// never a partial write.
pub(super) fn check_limits(
    actions: &[TransactWriteItem],
    store_share: usize,
) -> Result<(), DynamoError> {
    if actions.len() + store_share > MAX_ACTIONS {
        return Err(DynamoError::Limit(format!(
            "the handler added {} actions and the store needs {store_share} (marker, business key, effects): more than the {MAX_ACTIONS} a TransactWriteItems call may carry",
            actions.len()
        )));
    }
    let mut seen = HashSet::new();
    for (i, a) in actions.iter().enumerate() {
        let Some(k) = action_key(a) else {
            return Err(DynamoError::Limit(format!(
                "the handler's action {i} is empty (no put, update, delete or condition check)"
            )));
        };
        if !seen.insert(k) {
            return Err(DynamoError::Limit(format!(
                "the handler's action {i} targets an item another of its actions targets (table {}): DynamoDB allows one action per item in a transaction",
                action_table(a)
            )));
        }
        if let Some(p) = a.put() {
            let size = l::item_size(p.item());
            if size > MAX_ITEM_BYTES {
                return Err(DynamoError::Limit(format!(
                    "the handler's action {i} puts an item of about {size} bytes (table {}): more than the 400 KB ({MAX_ITEM_BYTES} bytes) DynamoDB stores",
                    p.table_name()
                )));
            }
        }
    }
    Ok(())
}

/// Every item the call puts, the store's own included (an effect's payload and metadata are the
/// handler's), against DynamoDB's 400 KB per item; an effect's item against that less
/// [`EFFECT_FINISH_ROOM`], the room its finish writes in. `first_action` is the position of the handler's
/// first action; the store's items come before it.
pub(super) fn check_item_sizes(
    items: &[TransactWriteItem],
    first_action: usize,
) -> Result<(), DynamoError> {
    for (i, a) in items.iter().enumerate().take(first_action) {
        let Some(p) = a.put() else { continue };
        let size = l::item_size(p.item());
        let kind = p
            .item()
            .get(l::PK)
            .and_then(|v| v.as_s().ok())
            .and_then(|pk| pk.get(..2));
        let (what, limit, room) = match kind {
            Some("e#") => (
                "an effect (its payload and metadata)",
                MAX_ITEM_BYTES - EFFECT_FINISH_ROOM,
                format!(
                    ", less the {EFFECT_FINISH_ROOM} bytes kept for what its finish writes (reference, error, request hash)"
                ),
            ),
            Some("m#") => (
                "the marker (its result reference)",
                MAX_ITEM_BYTES,
                String::new(),
            ),
            _ => ("an item", MAX_ITEM_BYTES, String::new()),
        };
        if size > limit {
            return Err(DynamoError::Limit(format!(
                "the store's item {i} of the call, {what}, is about {size} bytes: more than the 400 KB ({MAX_ITEM_BYTES} bytes) DynamoDB stores{room}"
            )));
        }
    }
    Ok(())
}

/// The bytes an action carries toward the 4 MB of a `TransactWriteItems` call (AWS, TransactWriteItems: "The
/// aggregate size of the items in the transaction cannot exceed 4 MB."): a put's whole item, the key of an
/// update, a delete or a condition check, and the expression attribute values of every action (an update's
/// new values, a condition's operands).
fn action_bytes(a: &TransactWriteItem) -> usize {
    let values = |v: Option<&std::collections::HashMap<String, AttributeValue>>| -> usize {
        v.map(|v| v.values().map(|x| l::item_size(&single(x))).sum())
            .unwrap_or(0)
    };
    if let Some(p) = a.put() {
        l::item_size(p.item()) + values(p.expression_attribute_values())
    } else if let Some(u) = a.update() {
        l::item_size(u.key()) + values(u.expression_attribute_values())
    } else if let Some(d) = a.delete() {
        l::item_size(d.key()) + values(d.expression_attribute_values())
    } else if let Some(c) = a.condition_check() {
        l::item_size(c.key()) + values(c.expression_attribute_values())
    } else {
        0
    }
}

pub(super) fn check_total_size(items: &[TransactWriteItem]) -> Result<(), DynamoError> {
    let total: usize = items.iter().map(action_bytes).sum();
    if total > MAX_TRANSACTION_BYTES {
        return Err(DynamoError::Limit(format!(
            "the transaction carries about {total} bytes of items, keys and expression values: more than the 4 MB ({MAX_TRANSACTION_BYTES} bytes) a TransactWriteItems call may carry"
        )));
    }
    Ok(())
}

fn single(v: &AttributeValue) -> Item {
    let mut i = Item::new();
    i.insert(String::new(), v.clone());
    i
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::{
        AttributeValue, ConditionCheck, Delete, Put, TransactWriteItem, Update,
    };

    use super::{check_total_size, MAX_TRANSACTION_BYTES};
    use crate::DynamoError;

    fn s(v: impl Into<String>) -> AttributeValue {
        AttributeValue::S(v.into())
    }

    /// A key of about 2,000 bytes (DynamoDB's partition keys reach 2,048).
    fn long_key(i: usize) -> String {
        format!("{i:04}{}", "k".repeat(1996))
    }

    /// Ten puts of about 409,000 bytes: 4,090,000 and a little, under the 4,194,304 of a call.
    fn ten_puts() -> Vec<TransactWriteItem> {
        (0..10)
            .map(|i| {
                let put = Put::builder()
                    .table_name("tasks")
                    .item("id", s(format!("big-{i}")))
                    .item("blob", s("x".repeat(409_000)))
                    .build()
                    .unwrap();
                TransactWriteItem::builder().put(put).build()
            })
            .collect()
    }

    fn over_the_limit(extra: impl Fn(usize) -> TransactWriteItem) -> bool {
        let mut items = ten_puts();
        items.extend((0..55).map(extra));
        matches!(check_total_size(&items), Err(DynamoError::Limit(m)) if m.contains(&MAX_TRANSACTION_BYTES.to_string()))
    }

    /// AWS, TransactWriteItems: "The aggregate size of the items in the transaction cannot exceed 4 MB." Only
    /// the puts and the values of updates were counted: 55 deletes, updates or condition checks of ~2 KB keys
    /// (110 KB) beside 4,090,000 bytes of puts went out to a permanent refusal of the service instead of the
    /// store's `Limit` before the call.
    #[test]
    fn the_keys_and_condition_values_of_every_action_count_toward_the_4_mb() {
        assert!(check_total_size(&ten_puts()).is_ok());
        assert!(over_the_limit(|i| {
            let d = Delete::builder()
                .table_name("tasks")
                .key("id", s(long_key(i)))
                .build()
                .unwrap();
            TransactWriteItem::builder().delete(d).build()
        }));
        assert!(over_the_limit(|i| {
            let u = Update::builder()
                .table_name("tasks")
                .key("id", s(long_key(i)))
                .update_expression("REMOVE done")
                .build()
                .unwrap();
            TransactWriteItem::builder().update(u).build()
        }));
        assert!(over_the_limit(|i| {
            let c = ConditionCheck::builder()
                .table_name("tasks")
                .key("id", s(long_key(i)))
                .condition_expression("attribute_not_exists(id)")
                .build()
                .unwrap();
            TransactWriteItem::builder().condition_check(c).build()
        }));
        // A condition check's operands: small keys, one value of 120,000 bytes.
        let mut items = ten_puts();
        let c = ConditionCheck::builder()
            .table_name("tasks")
            .key("id", s("k"))
            .condition_expression("blob <> :v")
            .expression_attribute_values(":v", s("y".repeat(120_000)))
            .build()
            .unwrap();
        items.push(TransactWriteItem::builder().condition_check(c).build());
        assert!(matches!(
            check_total_size(&items),
            Err(DynamoError::Limit(_))
        ));
    }
}
