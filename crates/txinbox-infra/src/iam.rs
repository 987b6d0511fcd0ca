//! `sqs-worker-policy-missing-action`: the IAM policy of a worker grants every action the SQS adapter calls,
//! on the queue and on its dead-letter queue.

use hcl::Value;

use crate::rules::{Checker, SqsTopology};
use crate::terraform::{placeholder, referenced_resource, Resolved, Resource};
use crate::RuleId;

/// IAM actions the SQS adapter's worker calls on the queue it consumes (`txinbox_sqs::iam::QUEUE_ACTIONS`;
/// a test ties the two lists).
pub const SQS_WORKER_QUEUE_ACTIONS: [&str; 4] = [
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueAttributes",
];

/// IAM actions the SQS adapter's worker calls on the queue's dead-letter queue
/// (`txinbox_sqs::iam::DLQ_ACTIONS`).
pub const SQS_WORKER_DLQ_ACTIONS: [&str; 3] = [
    "sqs:SendMessage",
    "sqs:GetQueueUrl",
    "sqs:GetQueueAttributes",
];

/// One statement of a policy.
pub(crate) struct Statement {
    pub(crate) allow: bool,
    /// `Action`, or with `not_actions` the `NotAction` list.
    pub(crate) actions: Vec<String>,
    /// `NotAction`: IAM "explicitly matches everything except the specified list of actions".
    pub(crate) not_actions: bool,
    /// `Resource`, or with `not_resources` the `NotResource` list.
    pub(crate) resources: Vec<String>,
    /// `NotResource`: every resource but those listed.
    pub(crate) not_resources: bool,
    /// A `Condition`: whether it applies depends on the request, so a Deny with one is not taken as denying.
    pub(crate) conditional: bool,
}

impl Statement {
    /// Whether the statement's `Action` (or `NotAction`) matches `action`.
    pub(crate) fn covers_action(&self, action: &str) -> bool {
        self.actions.iter().any(|a| glob(a, action, true)) != self.not_actions
    }

    /// Whether the statement's `Resource` (or `NotResource`) matches what `names` recognises.
    pub(crate) fn covers_resource(&self, names: impl Fn(&str) -> bool) -> bool {
        self.resources.iter().any(|r| names(r)) != self.not_resources
    }
}

/// Whether `policy` lets its holder call `action` on what `names` recognises: an Allow statement covers it and
/// no Deny statement without a condition does. AWS IAM: "If policies that apply to a request include an
/// `Allow` statement and a `Deny` statement, the `Deny` statement trumps the `Allow` statement. The request is
/// explicitly denied." A Deny with a condition (`aws:SecureTransport`, ...) is not taken as denying, since
/// whether it applies depends on the request.
pub(crate) fn allows(policy: &Policy<'_>, action: &str, names: impl Fn(&str) -> bool) -> bool {
    let covers = |s: &Statement| s.covers_action(action) && s.covers_resource(&names);
    policy.statements.iter().any(|s| s.allow && covers(s))
        && !policy
            .statements
            .iter()
            .any(|s| !s.allow && !s.conditional && covers(s))
}

/// A policy read from what was checked.
pub(crate) struct Policy<'a> {
    pub(crate) holder: &'a Resource,
    pub(crate) statements: Vec<Statement>,
}

const POLICY_RESOURCES: [&str; 4] = [
    "aws_iam_policy",
    "aws_iam_role_policy",
    "aws_iam_user_policy",
    "aws_iam_group_policy",
];

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

fn json_strings(value: Option<&serde_json::Value>) -> Vec<String> {
    match value {
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// The statements of a JSON policy document (`{"Statement": [...]}`).
fn json_statements(text: &str) -> Option<Vec<Statement>> {
    let doc: serde_json::Value = serde_json::from_str(text).ok()?;
    let statements = match doc.get("Statement")? {
        serde_json::Value::Array(items) => items.clone(),
        one => vec![one.clone()],
    };
    Some(
        statements
            .iter()
            .map(|s| {
                let not_actions = s.get("Action").is_none() && s.get("NotAction").is_some();
                let not_resources = s.get("Resource").is_none() && s.get("NotResource").is_some();
                Statement {
                    allow: s.get("Effect").and_then(|e| e.as_str()) != Some("Deny"),
                    actions: json_strings(s.get(if not_actions { "NotAction" } else { "Action" })),
                    not_actions,
                    resources: json_strings(s.get(if not_resources {
                        "NotResource"
                    } else {
                        "Resource"
                    })),
                    not_resources,
                    conditional: s
                        .get("Condition")
                        .is_some_and(|c| c.as_object().is_none_or(|o| !o.is_empty())),
                }
            })
            .collect(),
    )
}

/// A statement as an object (a plan's `statement` list): `effect`, `actions`, `resources`.
fn object_statement(value: &Value) -> Option<Statement> {
    let Value::Object(map) = value else {
        return None;
    };
    let listed = |key: &str| map.get(key).map(strings).unwrap_or_default();
    let (actions, not_actions) = match (listed("actions"), listed("not_actions")) {
        (actions, not) if actions.is_empty() && !not.is_empty() => (not, true),
        (actions, _) => (actions, false),
    };
    let (resources, not_resources) = match (listed("resources"), listed("not_resources")) {
        (resources, not) if resources.is_empty() && !not.is_empty() => (not, true),
        (resources, _) => (resources, false),
    };
    Some(Statement {
        allow: map.get("effect").and_then(Value::as_str) != Some("Deny"),
        actions,
        not_actions,
        resources,
        not_resources,
        conditional: map.get("condition").is_some_and(|c| {
            !matches!(c, Value::Null) && c.as_array().is_none_or(|a| !a.is_empty())
        }),
    })
}

pub(crate) fn policies<'a>(c: &Checker<'a>) -> Vec<Policy<'a>> {
    let module = c.module;
    let mut out = Vec::new();
    for r in &module.resources {
        if r.mode == "data." && r.kind == "aws_iam_policy_document" {
            let mut statements = Vec::new();
            // A `dynamic "statement"` counts when its for_each is known and not empty (its content's
            // references to the iterator are not known and match nothing); an unknown for_each is left out.
            let made = |b: &crate::terraform::NestedBlock| {
                !b.dynamic
                    || match module.resolve_attr(r.scope, b.for_each.as_ref()) {
                        Resolved::Known {
                            value: Value::Array(items),
                            ..
                        } => !items.is_empty(),
                        Resolved::Known {
                            value: Value::Object(items),
                            ..
                        } => !items.is_empty(),
                        _ => false,
                    }
            };
            for block in r
                .blocks
                .iter()
                .filter(|b| b.ident == "statement" && made(b))
            {
                let get = |key| match module.resolve_attr(r.scope, block.attrs.get(key)) {
                    Resolved::Known { value, .. } => Some(value),
                    _ => None,
                };
                let listed = |key| get(key).map(|v| strings(&v)).unwrap_or_default();
                let not_actions =
                    !block.attrs.contains_key("actions") && block.attrs.contains_key("not_actions");
                let not_resources = !block.attrs.contains_key("resources")
                    && block.attrs.contains_key("not_resources");
                statements.push(Statement {
                    allow: get("effect")
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .as_deref()
                        != Some("Deny"),
                    actions: listed(if not_actions {
                        "not_actions"
                    } else {
                        "actions"
                    }),
                    not_actions,
                    resources: listed(if not_resources {
                        "not_resources"
                    } else {
                        "resources"
                    }),
                    not_resources,
                    conditional: block.children.iter().any(|c| c == "condition"),
                });
            }
            if let Resolved::Known {
                value: Value::Array(items),
                ..
            } = module.resolve(r, "statement")
            {
                statements.extend(items.iter().filter_map(object_statement));
            }
            out.push(Policy {
                holder: r,
                statements,
            });
        } else if r.mode.is_empty() && POLICY_RESOURCES.contains(&r.kind.as_str()) {
            if let Resolved::Known {
                value: Value::String(text),
                ..
            } = module.resolve(r, "policy")
            {
                // A reference to a policy document: the document is read as its own policy.
                if referenced_resource(&text).is_none() {
                    if let Some(statements) = json_statements(&text) {
                        out.push(Policy {
                            holder: r,
                            statements,
                        });
                    }
                }
            }
        }
    }
    out
}

/// `*` and `?` wildcards, as IAM matches actions (case-insensitively) and resources.
pub(crate) fn glob(pattern: &str, text: &str, case_insensitive: bool) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = if case_insensitive {
        (
            pattern.to_lowercase().chars().collect(),
            text.to_lowercase().chars().collect(),
        )
    } else {
        (pattern.chars().collect(), text.chars().collect())
    };
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The strings a policy resource may use to name `queue`: its ARN placeholder, its known ARN, or an ARN
/// pattern ending in its name.
fn names_queue(c: &Checker<'_>, pattern: &str, queue: &Resource) -> bool {
    if pattern == placeholder(&queue.address(), "arn") || pattern == "*" {
        return true;
    }
    let known = |key| match c.module.resolve(queue, key) {
        Resolved::Known {
            value: Value::String(s),
            ..
        } => Some(s),
        _ => None,
    };
    if let Some(arn) = known("arn").filter(|a| referenced_resource(a).is_none()) {
        if glob(pattern, &arn, false) {
            return true;
        }
    }
    // A literal ARN or ARN pattern: `arn:PARTITION:sqs:REGION:ACCOUNT:NAME`, matched on the service and the
    // queue's name (the region and the account are not known statically).
    let parts: Vec<&str> = pattern.splitn(6, ':').collect();
    known("name")
        .filter(|n| referenced_resource(n).is_none())
        .is_some_and(|name| {
            parts.len() == 6
                && parts[0] == "arn"
                && glob(parts[2], "sqs", false)
                && glob(parts[5], &name, false)
        })
}

fn grants(c: &Checker<'_>, policy: &Policy<'_>, action: &str, queue: &Resource) -> bool {
    allows(policy, action, |r| names_queue(c, r, queue))
}

pub(crate) fn check(c: &mut Checker<'_>, topology: &SqsTopology<'_>) {
    let policies = policies(c);
    for queue in &topology.queues {
        let address = queue.address();
        if topology.dlqs.contains(&address) {
            continue;
        }
        let dlq = topology
            .dlq_of
            .get(&address)
            .and_then(|d| topology.queues.iter().find(|q| q.address() == *d));
        let workers: Vec<&Policy<'_>> = policies
            .iter()
            .filter(|p| grants(c, p, "sqs:ReceiveMessage", queue))
            .collect();
        if workers.is_empty() {
            if !policies.is_empty() {
                c.advice.push(format!(
                    "{}: {address}: no IAM policy in what was read grants sqs:ReceiveMessage on this queue, so the worker's permissions are not checked (the worker needs {} on it{})",
                    c.place(queue),
                    SQS_WORKER_QUEUE_ACTIONS.join(", "),
                    if dlq.is_some() { format!(" and {} on its dead-letter queue", SQS_WORKER_DLQ_ACTIONS.join(", ")) } else { String::new() }
                ));
            }
            continue;
        }
        for policy in workers {
            let mut missing = Vec::new();
            let on_queue: Vec<&str> = SQS_WORKER_QUEUE_ACTIONS
                .into_iter()
                .filter(|a| !grants(c, policy, a, queue))
                .collect();
            if !on_queue.is_empty() {
                missing.push(format!("{} on {address}", on_queue.join(", ")));
            }
            if let Some(dlq) = dlq {
                let on_dlq: Vec<&str> = SQS_WORKER_DLQ_ACTIONS
                    .into_iter()
                    .filter(|a| !grants(c, policy, a, dlq))
                    .collect();
                if !on_dlq.is_empty() {
                    missing.push(format!(
                        "{} on the dead-letter queue {}",
                        on_dlq.join(", "),
                        dlq.address()
                    ));
                }
            }
            if !missing.is_empty() {
                c.at(
                    RuleId::SqsWorkerPolicyMissingAction,
                    policy.holder,
                    None,
                    format!(
                        "this policy lets a worker receive from {address} but does not grant {}: the SQS adapter calls them (txinbox_sqs::iam: GetQueueAttributes, ReceiveMessage, ChangeMessageVisibility and DeleteMessage on the queue; GetQueueUrl when it resolves the dead-letter queue from the RedrivePolicy at connect, GetQueueAttributes in its start-up check, and SendMessage to forward a dead letter), and on AWS, where IAM is enforced, the worker fails with AccessDenied",
                        missing.join(" and ")
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn wildcards() {
        assert!(glob("sqs:*", "sqs:ReceiveMessage", true));
        assert!(glob("SQS:receive*", "sqs:ReceiveMessage", true));
        assert!(glob("*", "sqs:GetQueueUrl", true));
        assert!(!glob("sqs:Send*", "sqs:ReceiveMessage", true));
        assert!(glob(
            "arn:aws:sqs:*:*:orders*",
            "arn:aws:sqs:eu-west-1:1:orders-dlq.fifo",
            false
        ));
        assert!(!glob(
            "arn:aws:sqs:*:*:orders",
            "arn:aws:sqs:eu-west-1:1:orders-dlq.fifo",
            false
        ));
    }
}
