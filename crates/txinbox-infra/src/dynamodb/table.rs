//! The inbox table's own checks: key schema, indexes, time to live, point-in-time recovery, encryption.

use hcl::Value;

use super::{views, Field, HASH_KEY, INDEXES, TTL_ATTRIBUTE};
use crate::rules::{as_bool, show, Checker};
use crate::terraform::{Resolved, Resource};
use crate::RuleId;

pub(super) fn check_keys(c: &mut Checker<'_>, table: &Resource) {
    const RULE: RuleId = RuleId::DynamoDbKeySchema;
    const WHY: &str = "the store addresses every item by the hash key pk (S) alone";
    match c.module.resolve(table, "hash_key") {
        Resolved::Missing => c.at(
            RULE,
            table,
            None,
            format!("hash_key is not set: {WHY}; set hash_key = \"pk\""),
        ),
        Resolved::Unknown { line, why, .. } => c.unknown(RULE, table, "hash_key", line, &why),
        Resolved::Known {
            value,
            line,
            origin,
        } => {
            if value.as_str() != Some(HASH_KEY) {
                c.at(
                    RULE,
                    table,
                    Some(line),
                    format!(
                        "hash_key = {}{origin}: {WHY}; set hash_key = \"pk\"",
                        show(&value)
                    ),
                );
            } else {
                check_attribute_type(c, table, RULE, HASH_KEY, WHY);
            }
        }
    }
    match c.module.resolve(table, "range_key") {
        Resolved::Missing
        | Resolved::Known {
            value: Value::Null, ..
        } => {}
        Resolved::Known { value, .. } if value.as_str() == Some("") => {}
        Resolved::Known {
            value,
            line,
            origin,
        } => c.at(
            RULE,
            table,
            Some(line),
            format!(
                "range_key = {}{origin}: {WHY}, without a range key; a put or get with pk only fails with ValidationException",
                show(&value)
            ),
        ),
        Resolved::Unknown { line, why, .. } => c.unknown(RULE, table, "range_key", line, &why),
    }
}

/// Checks that the `attribute` block `name` has type `S`; reports under `rule` otherwise.
fn check_attribute_type(
    c: &mut Checker<'_>,
    table: &Resource,
    rule: RuleId,
    name: &str,
    why: &str,
) {
    let attributes = views(c, table, "attribute");
    match attributes
        .iter()
        .find(|a| a.string("name").as_deref() == Some(name))
    {
        None => c.at(
            rule,
            table,
            None,
            format!("no attribute block declares {name} (type \"S\"): {why}"),
        ),
        Some(a) => match a.fields.get("type") {
            Some(Field::Known(Value::String(t), _)) if t == "S" => {}
            Some(Field::Unknown(line, why)) => c.unknown(rule, table, "type", *line, why),
            Some(Field::Known(v, line)) => c.at(
                rule,
                table,
                Some(*line),
                format!(
                    "attribute {name} has type = {}: {why}; it must be \"S\" (a string)",
                    show(v)
                ),
            ),
            None => c.at(
                rule,
                table,
                Some(a.line),
                format!("attribute {name} has no type: {why}; it must be \"S\" (a string)"),
            ),
        },
    }
}

pub(super) fn check_indexes(c: &mut Checker<'_>, table: &Resource) {
    const RULE: RuleId = RuleId::DynamoDbIndexMismatch;
    let gsis = views(c, table, "global_secondary_index");
    for index in &INDEXES {
        let expected = format!(
            "hash_key = \"{}\", range_key = \"{}\", projection_type = \"{}\"",
            index.hash, index.range, index.projection
        );
        let Some(gsi) = gsis
            .iter()
            .find(|g| g.string("name").as_deref() == Some(index.name))
        else {
            c.at(
                RULE,
                table,
                None,
                format!(
                    "no global_secondary_index \"{}\" ({expected}): {}; without it the store's queries fail with ValidationException",
                    index.name, index.purpose
                ),
            );
            continue;
        };
        for (key, want) in [
            ("hash_key", index.hash),
            ("range_key", index.range),
            ("projection_type", index.projection),
        ] {
            match gsi.fields.get(key) {
                Some(Field::Known(Value::String(s), _)) if s == want => {}
                Some(Field::Unknown(line, why)) => c.unknown(RULE, table, key, *line, why),
                found => {
                    let shown = match found {
                        Some(Field::Known(v, _)) => format!("{key} = {}", show(v)),
                        _ => format!("{key} is not set"),
                    };
                    c.at(
                        RULE,
                        table,
                        Some(gsi.line_of(key)),
                        format!(
                            "global_secondary_index \"{}\": {shown}, the store expects {expected}: {}",
                            index.name, index.purpose
                        ),
                    );
                }
            }
        }
        for key in [index.hash, index.range] {
            check_attribute_type(
                c,
                table,
                RULE,
                key,
                &format!("a key of the index {}", index.name),
            );
        }
    }
}

pub(super) fn check_ttl(c: &mut Checker<'_>, table: &Resource) {
    const RULE: RuleId = RuleId::DynamoDbTtlOff;
    const WHY: &str = "the store sets expires_at (epoch seconds) on every marker and relies on DynamoDB's time to live to delete it after inbox.retention_seconds; without it the table grows forever";
    let ttl = views(c, table, "ttl");
    let Some(ttl) = ttl.first() else {
        c.at(
            RULE,
            table,
            None,
            format!("no ttl block: {WHY}; add ttl {{ attribute_name = \"{TTL_ATTRIBUTE}\", enabled = true }}"),
        );
        return;
    };
    match ttl.fields.get("enabled") {
        Some(Field::Known(v, _)) if as_bool(v) == Some(true) => {}
        Some(Field::Unknown(line, why)) => c.unknown(RULE, table, "ttl.enabled", *line, why),
        found => {
            let shown = match found {
                Some(Field::Known(v, _)) => format!("ttl enabled = {}", show(v)),
                _ => "ttl enabled is not set (default false)".to_owned(),
            };
            c.at(
                RULE,
                table,
                Some(ttl.line_of("enabled")),
                format!("{shown}: {WHY}"),
            );
        }
    }
    match ttl.fields.get("attribute_name") {
        Some(Field::Known(Value::String(s), _)) if s == TTL_ATTRIBUTE => {}
        Some(Field::Unknown(line, why)) => {
            c.unknown(RULE, table, "ttl.attribute_name", *line, why);
        }
        found => {
            let shown = match found {
                Some(Field::Known(v, _)) => format!("ttl attribute_name = {}", show(v)),
                _ => "ttl attribute_name is not set".to_owned(),
            };
            c.at(
                RULE,
                table,
                Some(ttl.line_of("attribute_name")),
                format!("{shown}, not \"{TTL_ATTRIBUTE}\": {WHY}"),
            );
        }
    }
}

/// A block `ident { enabled = true }` the table must have.
pub(super) fn check_flag_block(
    c: &mut Checker<'_>,
    table: &Resource,
    rule: RuleId,
    ident: &str,
    why: &str,
) {
    let blocks = views(c, table, ident);
    let Some(block) = blocks.first() else {
        c.at(
            rule,
            table,
            None,
            format!("no {ident} block (default: off): {why}; add {ident} {{ enabled = true }}"),
        );
        return;
    };
    match block.fields.get("enabled") {
        Some(Field::Known(v, _)) if as_bool(v) == Some(true) => {}
        Some(Field::Unknown(line, reason)) => {
            c.unknown(rule, table, &format!("{ident}.enabled"), *line, reason);
        }
        found => {
            let shown = match found {
                Some(Field::Known(v, _)) => format!("{ident} enabled = {}", show(v)),
                _ => format!("{ident} enabled is not set (default false)"),
            };
            c.at(
                rule,
                table,
                Some(block.line_of("enabled")),
                format!("{shown}: {why}"),
            );
        }
    }
}
