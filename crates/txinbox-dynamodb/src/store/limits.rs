//! The service's limits on a transaction, checked before anything is sent.

use std::collections::HashSet;

use aws_sdk_dynamodb::types::TransactWriteItem;

use super::{MAX_ACTIONS, MAX_ITEM_BYTES, MAX_TRANSACTION_BYTES};
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
/// handler's), against DynamoDB's 400 KB per item. `first_action` is the position of the handler's first
/// action; the store's items come before it.
pub(super) fn check_item_sizes(
    items: &[TransactWriteItem],
    first_action: usize,
) -> Result<(), DynamoError> {
    for (i, a) in items.iter().enumerate().take(first_action) {
        let Some(p) = a.put() else { continue };
        let size = l::item_size(p.item());
        if size > MAX_ITEM_BYTES {
            let what = p
                .item()
                .get(l::PK)
                .and_then(|v| v.as_s().ok())
                .map(|pk| match pk.get(..2) {
                    Some("e#") => "an effect (its payload and metadata)",
                    Some("m#") => "the marker (its result reference)",
                    _ => "an item",
                })
                .unwrap_or("an item");
            return Err(DynamoError::Limit(format!(
                "the store's item {i} of the call, {what}, is about {size} bytes: more than the 400 KB ({MAX_ITEM_BYTES} bytes) DynamoDB stores"
            )));
        }
    }
    Ok(())
}

pub(super) fn check_total_size(items: &[TransactWriteItem]) -> Result<(), DynamoError> {
    let total: usize = items
        .iter()
        .map(|a| {
            a.put().map(|p| l::item_size(p.item())).unwrap_or(0)
                + a.update()
                    .and_then(|u| u.expression_attribute_values())
                    .map(|v| v.values().map(|x| l::item_size(&single(x))).sum())
                    .unwrap_or(0)
        })
        .sum();
    if total > MAX_TRANSACTION_BYTES {
        return Err(DynamoError::Limit(format!(
            "the transaction carries about {total} bytes of items: more than the 4 MB ({MAX_TRANSACTION_BYTES} bytes) a TransactWriteItems call may carry"
        )));
    }
    Ok(())
}

fn single(v: &aws_sdk_dynamodb::types::AttributeValue) -> Item {
    let mut i = Item::new();
    i.insert(String::new(), v.clone());
    i
}
