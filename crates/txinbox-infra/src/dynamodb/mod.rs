//! The DynamoDB store's inbox table (`dynamodb://TABLE`): its key schema, its two indexes, time to live,
//! point-in-time recovery, encryption, and the worker's IAM policy on it.
//!
//! The layout is the store's (crate `txinbox-dynamodb`): hash key `pk` (S) and no range key; index
//! `by_consumer` (hash `gsi1pk`, range `gsi1sk`, projection ALL); index `due` (hash `gsi2pk`, range
//! `gsi2sk`, projection KEYS_ONLY); time to live on `expires_at`.

mod policy;
mod table;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use hcl::Value;

use crate::iam::policies;
use crate::rules::{show, Checker};
use crate::terraform::{referenced_resource, Resolved, Resource};
use crate::RuleId;

use policy::check_policies;
use table::{check_flag_block, check_indexes, check_keys, check_ttl};

/// IAM actions the DynamoDB store's worker calls on the inbox table.
///
/// There is no IAM action `dynamodb:TransactWriteItems`: DynamoDB authorizes each action of a
/// `TransactWriteItems` call as its own action (`PutItem`, `UpdateItem`, `DeleteItem`,
/// `ConditionCheckItem`) on its own table.
///
/// Exactly the store's (`txinbox_dynamodb::IAM_TABLE_ACTIONS`, tied by a test): any other action on the inbox
/// table is a too-broad finding, `DeleteItem` included (the store never deletes there, TTL does; a worker
/// allowed to delete markers would apply their redeliveries again) and `ConditionCheckItem` (the store makes
/// none on its own table; a handler's condition checks are on its own tables).
///
/// `ConditionCheckItem` only reads, like `BatchGetItem`, but the too-broad rule is "any DynamoDB action the
/// store does not call", not "any dangerous action": every unneeded action is named, and only those in
/// `FORBIDDEN` get a reason of what they would let the worker do. `ConditionCheckItem` is unneeded, so it is
/// named without a reason; `DeleteItem` is unneeded and dangerous, so it is in `FORBIDDEN`.
pub const DYNAMODB_WORKER_TABLE_ACTIONS: [&str; 6] = [
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:GetItem",
    "dynamodb:Query",
    "dynamodb:DescribeTable",
    "dynamodb:DescribeTimeToLive",
];

/// IAM actions the worker calls on the inbox table's indexes (`TABLE_ARN/index/NAME`).
pub const DYNAMODB_WORKER_INDEX_ACTIONS: [&str; 1] = ["dynamodb:Query"];

const TABLE: &str = "aws_dynamodb_table";
const HASH_KEY: &str = "pk";
const TTL_ATTRIBUTE: &str = "expires_at";

/// An index the store queries: name, hash key, range key, projection, and what it is for.
struct Index {
    name: &'static str,
    hash: &'static str,
    range: &'static str,
    projection: &'static str,
    purpose: &'static str,
}

const INDEXES: [Index; 2] = [
    Index {
        name: "by_consumer",
        hash: "gsi1pk",
        range: "gsi1sk",
        projection: "ALL",
        purpose: "the store lists and counts markers and evidence by consumer, oldest first, without a scan",
    },
    Index {
        name: "due",
        hash: "gsi2pk",
        range: "gsi2sk",
        projection: "KEYS_ONLY",
        purpose: "the effect runner finds the effects that are due, by destination and time",
    },
];

/// One attribute of a nested block: its value and line, or the line and why it is unknown.
enum Field {
    Known(Value, usize),
    Unknown(usize, String),
}

/// A nested block (`attribute`, `global_secondary_index`, `ttl`, ...) of a table, read from HCL or a plan.
struct View {
    fields: BTreeMap<String, Field>,
    line: usize,
}

impl View {
    /// The line of `key`, or of the block.
    fn line_of(&self, key: &str) -> usize {
        match self.fields.get(key) {
            Some(Field::Known(_, line) | Field::Unknown(line, _)) => *line,
            None => self.line,
        }
    }

    fn string(&self, key: &str) -> Option<String> {
        match self.fields.get(key) {
            Some(Field::Known(Value::String(s), _)) => Some(s.clone()),
            _ => None,
        }
    }
}

/// The nested blocks `ident` of a table: static and `dynamic` blocks of HCL, or a plan's list of objects.
fn views(c: &Checker<'_>, table: &Resource, ident: &str) -> Vec<View> {
    let module = c.module;
    let mut out: Vec<View> = Vec::new();
    for b in table.blocks.iter().filter(|b| b.ident == ident) {
        let view = |unknown: Option<&str>| View {
            fields: b
                .attrs
                .iter()
                .map(|(k, a)| {
                    let field = match (unknown, module.resolve_attr(table.scope, Some(a))) {
                        (Some(why), _) => Field::Unknown(a.line, why.to_owned()),
                        (None, Resolved::Known { value, line, .. }) => Field::Known(value, line),
                        (None, Resolved::Unknown { line, why, .. }) => Field::Unknown(line, why),
                        (None, Resolved::Missing) => Field::Unknown(a.line, "not set".into()),
                    };
                    (k.clone(), field)
                })
                .collect(),
            line: b.line,
        };
        if !b.dynamic {
            out.push(view(None));
            continue;
        }
        // A `dynamic` block is as many blocks as its for_each has elements: none for an empty one (a
        // `for_each = var.pitr ? [1] : []` with pitr false leaves the table without the block).
        match module.resolve_attr(table.scope, b.for_each.as_ref()) {
            Resolved::Known {
                value: Value::Array(items),
                ..
            } => out.extend(items.iter().map(|_| view(None))),
            Resolved::Known {
                value: Value::Object(items),
                ..
            } => out.extend(items.iter().map(|_| view(None))),
            _ => out.push(view(Some(
                "in a dynamic block whose for_each cannot be resolved statically",
            ))),
        }
    }
    match module.resolve(table, ident) {
        Resolved::Known {
            value: Value::Array(items),
            line,
            ..
        } => out.extend(items.into_iter().filter_map(|item| {
            match item {
                Value::Object(map) => Some(View {
                    fields: map
                        .into_iter()
                        .map(|(k, v)| (k, Field::Known(v, line)))
                        .collect(),
                    line,
                }),
                _ => None,
            }
        })),
        Resolved::Unknown { line, why, .. } => out.push(View {
            fields: BTreeMap::from([("enabled".to_owned(), Field::Unknown(line, why))]),
            line,
        }),
        _ => {}
    }
    out
}

fn known_string(c: &Checker<'_>, table: &Resource, key: &str) -> Option<String> {
    match c.module.resolve(table, key) {
        Resolved::Known {
            value: Value::String(s),
            ..
        } if referenced_resource(&s).is_none() => Some(s),
        _ => None,
    }
}

/// The table name of a `dynamodb://TABLE` store URL.
fn store_table(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("dynamodb://")?;
    let name = rest.split(['/', '?']).next().unwrap_or_default();
    (!name.is_empty()).then_some(name)
}

pub(crate) fn check(c: &mut Checker<'_>) {
    let module = c.module;
    let tables: Vec<&Resource> = module
        .resources
        .iter()
        .filter(|r| r.mode.is_empty() && r.kind == TABLE)
        .collect();
    let inbox: Vec<&Resource> = match store_table(&c.settings.store.url) {
        Some(name) => {
            let found: Vec<&Resource> = tables
                .iter()
                .copied()
                .filter(|t| known_string(c, t, "name").as_deref() == Some(name))
                .collect();
            if found.is_empty() {
                let declared: Vec<String> = tables
                    .iter()
                    .map(|t| match c.module.resolve(t, "name") {
                        Resolved::Known { value, .. } => {
                            format!("{} = {}", t.address(), show(&value))
                        }
                        _ => format!("{} (name not known statically)", t.address()),
                    })
                    .collect();
                c.report_missing(
                    RuleId::DynamoDbInboxTableMissing,
                    0,
                    1,
                    format!("dynamodb://{name}"),
                    format!(
                        "store.url names the DynamoDB table {name:?} but no aws_dynamodb_table in what was read has that name ({}): the inbox table, its indexes, time to live and the worker's permissions cannot be checked",
                        if declared.is_empty() { "none is declared".to_owned() } else { format!("declared: {}", declared.join(", ")) }
                    ),
                );
            }
            found
        }
        None => tables
            .iter()
            .copied()
            .filter(|t| {
                views(c, t, "global_secondary_index").iter().any(|v| {
                    v.string("name")
                        .is_some_and(|n| INDEXES.iter().any(|i| i.name == n))
                })
            })
            .collect(),
    };
    if inbox.is_empty()
        && !tables.is_empty()
        && store_table(&c.settings.store.url).is_none()
        && !module
            .resources
            .iter()
            .any(|r| r.kind == "aws_sqs_queue" || r.kind == "azurerm_servicebus_queue")
    {
        c.advice.push(format!(
            "no aws_dynamodb_table in what was read is the inbox's: store.url is not dynamodb://TABLE ({:?}) and no table declares the index by_consumer or due, so no table was checked; pass the worker's settings with --config",
            // The URL of another store may hold its password.
            txinbox_core::error::redact_url(&c.settings.store.url)
        ));
    }
    let policies = policies(c);
    for table in inbox {
        check_keys(c, table);
        check_indexes(c, table);
        check_ttl(c, table);
        check_flag_block(
            c,
            table,
            RuleId::DynamoDbPitrOff,
            "point_in_time_recovery",
            "a table deleted or overwritten by mistake loses the processed markers, and every redelivered message would then be applied again as new",
        );
        check_flag_block(
            c,
            table,
            RuleId::DynamoDbEncryptionOff,
            "server_side_encryption",
            "the table is encrypted with a key DynamoDB owns instead of a KMS key (the customer-managed kms_key_arn, else aws/dynamodb) whose use the account controls and audits in CloudTrail",
        );
        check_policies(c, table, &policies);
    }
}
