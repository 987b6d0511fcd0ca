//! The worker's IAM policy on the inbox table and its indexes: every action the store calls, no other.

use super::{DYNAMODB_WORKER_INDEX_ACTIONS, DYNAMODB_WORKER_TABLE_ACTIONS, INDEXES};
use crate::iam::{allows, glob, grant, lacking, names_arn, uncertain_advice, Policy};
use crate::rules::Checker;
use crate::terraform::Resource;
use crate::RuleId;

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

/// Whether a policy's resource pattern names the table (`suffix` empty) or one of its indexes
/// (`suffix` = `/index/NAME`), as [`names_arn`] reads it (`arn:PARTITION:dynamodb:REGION:ACCOUNT:table/NAME`).
fn names_table(c: &Checker<'_>, pattern: &str, table: &Resource, suffix: &str) -> bool {
    names_arn(c, pattern, table, "dynamodb", "table/", suffix)
}

/// An action pattern that covers a DynamoDB action (`dynamodb:...`, `dynamo*:*`, `*`).
pub(super) fn is_dynamodb(action: &str) -> bool {
    action.to_ascii_lowercase().starts_with("dynamodb:") || glob(action, "dynamodb:Scan", true)
}

pub(super) fn check_policies(c: &mut Checker<'_>, table: &Resource, policies: &[Policy<'_>]) {
    let address = table.address();
    let index_suffixes: Vec<String> = INDEXES
        .iter()
        .map(|i| format!("/index/{}", i.name))
        .collect();
    let workers: Vec<&Policy<'_>> = policies
        .iter()
        .filter(|p| grant(p, "dynamodb:PutItem", |r| names_table(c, r, table, "")).meant())
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
        let (on_table, uncertain) = lacking(policy, &DYNAMODB_WORKER_TABLE_ACTIONS, |r| {
            names_table(c, r, table, "")
        });
        uncertain_advice(c, policy, &address, &uncertain);
        if !on_table.is_empty() {
            missing.push(format!("{} on {address}", on_table.join(", ")));
        }
        for (index, suffix) in INDEXES.iter().zip(&index_suffixes) {
            let (on_index, uncertain) = lacking(policy, &DYNAMODB_WORKER_INDEX_ACTIONS, |r| {
                names_table(c, r, table, suffix)
            });
            uncertain_advice(
                c,
                policy,
                &format!("its index {} (TABLE_ARN/index/{})", index.name, index.name),
                &uncertain,
            );
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
        for s in policy
            .statements
            .iter()
            .filter(|s| s.allow && s.unresolved.is_none())
        {
            let on_table = s.covers_resource(|r| names_table(c, r, table, ""))
                || index_suffixes
                    .iter()
                    .any(|suffix| s.covers_resource(|r| names_table(c, r, table, suffix)));
            if !on_table {
                continue;
            }
            if s.not_actions {
                // Every action but those listed: too broad when it leaves one the store does not call.
                let beyond = FORBIDDEN
                    .iter()
                    .chain(&["dynamodb:BatchGetItem", "dynamodb:ConditionCheckItem"])
                    .any(|a| s.covers_action(a));
                let shown = format!("NotAction [{}]", s.actions.join(", "));
                if beyond && !broad.contains(&shown) {
                    broad.push(shown);
                }
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
                .filter(|f| {
                    allows(policy, f, |r| names_table(c, r, table, ""))
                        || index_suffixes
                            .iter()
                            .any(|suffix| allows(policy, f, |r| names_table(c, r, table, suffix)))
                })
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
