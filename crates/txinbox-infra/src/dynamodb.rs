//! The DynamoDB store's inbox table (`dynamodb://TABLE`): its key schema, its three indexes, time to live,
//! point-in-time recovery, encryption, and the worker's IAM policy on it.
//!
//! The layout is the store's (crate `txinbox-dynamodb`): hash key `pk` (S) and no range key; index
//! `by_consumer` (hash `gsi1pk`, range `gsi1sk`, projection ALL); index `due` (hash `gsi2pk`, range
//! `gsi2sk`, projection KEYS_ONLY); index `by_group` (hash `gsi3pk`, range `gsi3sk`, projection KEYS_ONLY); time
//! to live on `expires_at`.

use std::collections::BTreeMap;

use hcl::Value;

use crate::iam::{glob, policies, Policy};
use crate::rules::{as_bool, show, Checker};
use crate::terraform::{placeholder, referenced_resource, Resolved, Resource};
use crate::RuleId;

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

/// Actions a worker must not have on the inbox table: the too-broad finding says what each would let the worker
/// do. Other unneeded actions (`ConditionCheckItem`, `BatchGetItem`, ...) are only named.
const FORBIDDEN: [&str; 6] = [
    "dynamodb:DeleteItem",
    "dynamodb:Scan",
    "dynamodb:BatchWriteItem",
    "dynamodb:UpdateTable",
    "dynamodb:UpdateTimeToLive",
    "dynamodb:DeleteTable",
];

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

const INDEXES: [Index; 3] = [
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
    Index {
        name: "by_group",
        hash: "gsi3pk",
        range: "gsi3sk",
        projection: "KEYS_ONLY",
        purpose: "the effect runner keeps the order of an effect group (an effect waits while an older one of its group is unfinished)",
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
    let mut out: Vec<View> = table
        .blocks
        .iter()
        .filter(|b| b.ident == ident)
        .map(|b| View {
            fields: b
                .attrs
                .iter()
                .map(|(k, a)| {
                    let field = match module.resolve_attr(table.scope, Some(a)) {
                        Resolved::Known { value, line, .. } => Field::Known(value, line),
                        Resolved::Unknown { line, why, .. } => Field::Unknown(line, why),
                        Resolved::Missing => Field::Unknown(a.line, "not set".into()),
                    };
                    (k.clone(), field)
                })
                .collect(),
            line: b.line,
        })
        .collect();
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
            "no aws_dynamodb_table in what was read is the inbox's: store.url is not dynamodb://TABLE ({:?}) and no table declares the index by_consumer, due or by_group, so no table was checked; pass the worker's settings with --config",
            c.settings.store.url
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

fn check_keys(c: &mut Checker<'_>, table: &Resource) {
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

fn check_indexes(c: &mut Checker<'_>, table: &Resource) {
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

fn check_ttl(c: &mut Checker<'_>, table: &Resource) {
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
fn check_flag_block(c: &mut Checker<'_>, table: &Resource, rule: RuleId, ident: &str, why: &str) {
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

/// Whether a policy's resource pattern names the table (`suffix` empty) or one of its indexes
/// (`suffix` = `/index/NAME`): the ARN placeholder (also inside `"${...arn}/index/*"`), a known ARN, or
/// a literal ARN pattern `arn:PARTITION:dynamodb:REGION:ACCOUNT:table/NAME[/index/INDEX]`.
fn names_table(c: &Checker<'_>, pattern: &str, table: &Resource, suffix: &str) -> bool {
    if glob(
        pattern,
        &format!("{}{suffix}", placeholder(&table.address(), "arn")),
        false,
    ) {
        return true;
    }
    if let Some(arn) = known_string(c, table, "arn") {
        if glob(pattern, &format!("{arn}{suffix}"), false) {
            return true;
        }
    }
    let parts: Vec<&str> = pattern.splitn(6, ':').collect();
    known_string(c, table, "name").is_some_and(|name| {
        parts.len() == 6
            && parts[0] == "arn"
            && glob(parts[2], "dynamodb", false)
            && glob(parts[5], &format!("table/{name}{suffix}"), false)
    })
}

fn grants(
    c: &Checker<'_>,
    policy: &Policy<'_>,
    action: &str,
    table: &Resource,
    suffix: &str,
) -> bool {
    policy.statements.iter().any(|s| {
        s.allow
            && s.actions.iter().any(|a| glob(a, action, true))
            && s.resources.iter().any(|r| names_table(c, r, table, suffix))
    })
}

/// An action pattern that covers a DynamoDB action (`dynamodb:...`, `dynamo*:*`, `*`).
fn is_dynamodb(action: &str) -> bool {
    action.to_ascii_lowercase().starts_with("dynamodb:") || glob(action, "dynamodb:Scan", true)
}

fn check_policies(c: &mut Checker<'_>, table: &Resource, policies: &[Policy<'_>]) {
    let address = table.address();
    let index_suffixes: Vec<String> = INDEXES
        .iter()
        .map(|i| format!("/index/{}", i.name))
        .collect();
    let workers: Vec<&Policy<'_>> = policies
        .iter()
        .filter(|p| grants(c, p, "dynamodb:PutItem", table, ""))
        .collect();
    if workers.is_empty() {
        if !policies.is_empty() {
            c.advice.push(format!(
                "{}: {address}: no IAM policy in what was read grants dynamodb:PutItem on this table, so the worker's permissions are not checked (the worker needs {} on it and {} on its indexes)",
                c.place(table),
                DYNAMODB_WORKER_TABLE_ACTIONS.join(", "),
                DYNAMODB_WORKER_INDEX_ACTIONS.join(", "),
            ));
        }
        return;
    }
    for policy in workers {
        let mut missing = Vec::new();
        let on_table: Vec<&str> = DYNAMODB_WORKER_TABLE_ACTIONS
            .into_iter()
            .filter(|a| !grants(c, policy, a, table, ""))
            .collect();
        if !on_table.is_empty() {
            missing.push(format!("{} on {address}", on_table.join(", ")));
        }
        for (index, suffix) in INDEXES.iter().zip(&index_suffixes) {
            let on_index: Vec<&str> = DYNAMODB_WORKER_INDEX_ACTIONS
                .into_iter()
                .filter(|a| !grants(c, policy, a, table, suffix))
                .collect();
            if !on_index.is_empty() {
                missing.push(format!(
                    "{} on its index {} (TABLE_ARN/index/{})",
                    on_index.join(", "),
                    index.name,
                    index.name
                ));
            }
        }
        if !missing.is_empty() {
            c.at(
                RuleId::DynamoDbWorkerPolicyMissingAction,
                policy.holder,
                None,
                format!(
                    "this policy lets a worker write {address} but does not grant {}: the DynamoDB store calls them (PutItem inside TransactWriteItems, which IAM authorizes action by action, and for evidence; UpdateItem for effects; GetItem, Query on the table and its indexes; DescribeTable and DescribeTimeToLive in its start-up check), and on AWS the worker fails with AccessDenied",
                    missing.join(" and ")
                ),
            );
        }
        let mut broad: Vec<String> = Vec::new();
        for s in policy.statements.iter().filter(|s| s.allow) {
            let on_table = s.resources.iter().any(|r| {
                names_table(c, r, table, "")
                    || index_suffixes
                        .iter()
                        .any(|suffix| names_table(c, r, table, suffix))
            });
            if !on_table {
                continue;
            }
            for a in &s.actions {
                if is_dynamodb(a)
                    && !DYNAMODB_WORKER_TABLE_ACTIONS
                        .iter()
                        .any(|w| w.eq_ignore_ascii_case(a))
                    && !broad.contains(a)
                {
                    broad.push(a.clone());
                }
            }
        }
        if !broad.is_empty() {
            let forbidden: Vec<&str> = FORBIDDEN
                .into_iter()
                .filter(|f| broad.iter().any(|a| glob(a, f, true)))
                .collect();
            c.at(
                RuleId::DynamoDbWorkerPolicyTooBroad,
                policy.holder,
                None,
                format!(
                    "this policy grants {} on {address} or its indexes, more than the DynamoDB store calls ({}){}: grant exactly those actions",
                    broad.join(", "),
                    DYNAMODB_WORKER_TABLE_ACTIONS.join(", "),
                    if forbidden.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; it lets the worker {}",
                            forbidden
                                .iter()
                                .map(|f| match *f {
                                    "dynamodb:DeleteItem" => "delete markers, after which a redelivered message is applied again (DeleteItem; the store never deletes, time to live does)",
                                    "dynamodb:Scan" => "read every item (Scan)",
                                    "dynamodb:BatchWriteItem" => "write outside a transaction (BatchWriteItem)",
                                    "dynamodb:UpdateTable" => "change the keys, indexes or capacity (UpdateTable)",
                                    "dynamodb:UpdateTimeToLive" => "turn time to live off (UpdateTimeToLive)",
                                    _ => "delete the table and every marker (DeleteTable)",
                                })
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{is_dynamodb, store_table};

    #[test]
    fn store_urls() {
        assert_eq!(store_table("dynamodb://orders-inbox"), Some("orders-inbox"));
        assert_eq!(store_table("dynamodb://t?region=eu-west-1"), Some("t"));
        assert_eq!(store_table("dynamodb://"), None);
        assert_eq!(store_table("postgres://app@db/app"), None);
        assert_eq!(store_table("sqlite:txinbox.db"), None);
    }

    #[test]
    fn dynamodb_action_patterns() {
        assert!(is_dynamodb("dynamodb:*"));
        assert!(is_dynamodb("DynamoDB:Scan"));
        assert!(is_dynamodb("*"));
        assert!(is_dynamodb("dynamo*:S*"));
        assert!(!is_dynamodb("kms:Decrypt"));
        assert!(!is_dynamodb("sqs:*"));
    }
}
