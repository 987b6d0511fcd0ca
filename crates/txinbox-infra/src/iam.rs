//! `sqs-worker-policy-missing-action`: the IAM policy of a worker grants every action the SQS adapter calls,
//! on the queue and on its dead-letter queue.

use hcl::Value;

use crate::rules::{Checker, SqsTopology};
use crate::terraform::{placeholder, referenced_resource, Module, Resolved, Resource};
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
    /// `Sid` (`sid`): a statement of an override document replaces the one of the same sid.
    pub(crate) sid: Option<String>,
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
    /// Why its `actions` or `resources` cannot be resolved statically (a variable without a default, ...):
    /// it is then read as covering every action (resource) and only ever makes a grant uncertain, never
    /// a clean pass nor a violation.
    pub(crate) unresolved: Option<String>,
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

/// Whether a policy grants an action on a resource, as far as what was read tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Grant {
    /// An Allow statement covers it and no Deny statement without a condition does.
    Granted,
    /// Not granted (no Allow covers it, or a Deny without a condition does).
    Refused,
    /// A statement whose actions or resources cannot be resolved statically may grant (an Allow) or
    /// deny (a Deny) it: why.
    Unresolved(String),
    /// Only an Allow with a `Condition` covers it (which statement): whether it holds depends on the
    /// request, so the grant is not taken as sure.
    Conditional(String),
}

impl Grant {
    /// Granted, surely or under a condition: the policy is read as meant to grant it.
    pub(crate) fn meant(&self) -> bool {
        matches!(self, Grant::Granted | Grant::Conditional(_))
    }
}

/// Whether `policy` lets its holder call `action` on what `names` recognises: an Allow statement covers it and
/// no Deny statement without a condition does. AWS IAM: "If policies that apply to a request include an
/// `Allow` statement and a `Deny` statement, the `Deny` statement trumps the `Allow` statement. The request is
/// explicitly denied." A Deny with a condition (`aws:SecureTransport`, ...) is not taken as denying, since
/// whether it applies depends on the request; an Allow with a condition is not taken as surely granting
/// either ([`Grant::Conditional`]). A statement that cannot be resolved makes the answer
/// [`Grant::Unresolved`] where it would decide it.
pub(crate) fn grant(policy: &Policy<'_>, action: &str, names: impl Fn(&str) -> bool) -> Grant {
    let covers = |s: &Statement| s.covers_action(action) && s.covers_resource(&names);
    let denies = |s: &&Statement| !s.allow && !s.conditional && covers(s);
    if policy
        .statements
        .iter()
        .filter(denies)
        .any(|s| s.unresolved.is_none())
    {
        return Grant::Refused;
    }
    let maybe_denied = policy.statements.iter().filter(denies).find_map(|s| {
        s.unresolved
            .as_ref()
            .map(|why| format!("a Deny statement may refuse it: {why}"))
    });
    let allows = |s: &&Statement| s.allow && covers(s);
    if policy
        .statements
        .iter()
        .filter(allows)
        .any(|s| s.unresolved.is_none() && !s.conditional)
    {
        return maybe_denied.map_or(Grant::Granted, Grant::Unresolved);
    }
    // An Allow with a condition may not grant at runtime: neither a sure grant nor a refusal.
    if let Some(s) = policy
        .statements
        .iter()
        .filter(allows)
        .find(|s| s.unresolved.is_none())
    {
        let which = s.sid.as_ref().map_or_else(
            || "a statement".to_owned(),
            |sid| format!("statement {sid:?}"),
        );
        return maybe_denied.map_or(Grant::Conditional(which), Grant::Unresolved);
    }
    match policy
        .statements
        .iter()
        .filter(allows)
        .find_map(|s| s.unresolved.clone())
    {
        Some(why) => Grant::Unresolved(format!("an Allow statement may grant it: {why}")),
        None => Grant::Refused,
    }
}

/// Whether `policy` surely lets its holder call `action` on what `names` recognises ([`Grant::Granted`]).
pub(crate) fn allows(policy: &Policy<'_>, action: &str, names: impl Fn(&str) -> bool) -> bool {
    grant(policy, action, names) == Grant::Granted
}

/// The ARN pattern an unresolved `actions`/`resources` is read as: it may cover anything.
const ANYTHING: &str = "*";

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
                    sid: s.get("Sid").and_then(|v| v.as_str()).map(str::to_owned),
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
                    unresolved: None,
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
        sid: map.get("sid").and_then(Value::as_str).map(str::to_owned),
        allow: map.get("effect").and_then(Value::as_str) != Some("Deny"),
        actions,
        not_actions,
        resources,
        not_resources,
        conditional: map.get("condition").is_some_and(|c| {
            !matches!(c, Value::Null) && c.as_array().is_none_or(|a| !a.is_empty())
        }),
        unresolved: None,
    })
}

/// How deep `source_policy_documents`/`override_policy_documents` are followed (documents built on
/// documents): past it, the document is reported as unresolved.
const MAX_DOCUMENT_DEPTH: usize = 4;

/// The statements of a `data "aws_iam_policy_document"`, merged as the AWS provider documents it: the
/// statements of `source_policy_documents` first ("Statements defined in source_policy_documents must have
/// unique sids"), the document's own statements replacing a source statement of the same `sid`, then each of
/// `override_policy_documents` in order ("statements with non-blank sids will override statements with the
/// same sid from earlier documents in the list. Statements with non-blank sids will also override statements
/// with the same sid from source_policy_documents. Non-overriding statements will be added to the exported
/// document"). A document given as another `aws_iam_policy_document` of what was read is followed; one given
/// as JSON is read; any other is unresolved (it may allow or deny anything).
fn document_statements(module: &Module, r: &Resource, depth: usize) -> Vec<Statement> {
    let sources = merged_documents(module, r, "source_policy_documents", depth);
    let own = own_statements(module, r);
    let overrides = merged_documents(module, r, "override_policy_documents", depth);
    let mut statements: Vec<Statement> = sources.into_iter().flatten().collect();
    merge(&mut statements, own);
    for document in overrides {
        merge(&mut statements, document);
    }
    statements
}

/// Adds `later` to `statements`, a statement with a non-blank `sid` replacing the one of the same `sid`.
fn merge(statements: &mut Vec<Statement>, later: Vec<Statement>) {
    for statement in later {
        match statement
            .sid
            .as_deref()
            .filter(|sid| !sid.is_empty())
            .and_then(|sid| {
                statements
                    .iter()
                    .position(|s| s.sid.as_deref() == Some(sid))
            }) {
            Some(i) => statements[i] = statement,
            None => statements.push(statement),
        }
    }
}

/// A document that cannot be read: an Allow and a Deny of anything, both unresolved.
fn unresolved_document(why: String) -> Vec<Statement> {
    [true, false]
        .into_iter()
        .map(|allow| Statement {
            sid: None,
            allow,
            actions: vec![ANYTHING.to_owned()],
            not_actions: false,
            resources: vec![ANYTHING.to_owned()],
            not_resources: false,
            conditional: false,
            unresolved: Some(why.clone()),
        })
        .collect()
}

/// The documents of `r`'s `key` (`source_policy_documents`, `override_policy_documents`), each as its
/// statements (source documents all together, as one).
fn merged_documents(module: &Module, r: &Resource, key: &str, depth: usize) -> Vec<Vec<Statement>> {
    let place = |line: usize| format!("{}:{line}", module.files[r.at.file].name());
    let items = match module.resolve(r, key) {
        Resolved::Missing => return Vec::new(),
        Resolved::Known {
            value: Value::Array(items),
            line,
            ..
        } => items.into_iter().map(|v| (v, line)).collect::<Vec<_>>(),
        Resolved::Known { line, .. } => {
            return vec![unresolved_document(format!(
                "{}: {key} of {} is not a list",
                place(line),
                r.address()
            ))]
        }
        Resolved::Unknown { line, why, .. } => {
            return vec![unresolved_document(format!(
                "{}: {key} of {} cannot be resolved statically ({why})",
                place(line),
                r.address()
            ))]
        }
    };
    let documents = items.into_iter().map(|(item, line)| {
        let unreadable = |what: &str| {
            unresolved_document(format!(
                "{}: {key} of {} names {what}, which is not read",
                place(line),
                r.address()
            ))
        };
        let Some(text) = item.as_str() else {
            return unreadable("a document that is not a string");
        };
        match crate::terraform::referenced(text) {
            Some((address, "json")) => match module.resources.iter().find(|d| {
                d.mode == "data." && d.kind == "aws_iam_policy_document" && d.address() == address
            }) {
                Some(_) if depth >= MAX_DOCUMENT_DEPTH => unreadable(&format!(
                    "{address}, past {MAX_DOCUMENT_DEPTH} documents deep"
                )),
                Some(d) => document_statements(module, d, depth + 1),
                None => unreadable(address),
            },
            Some((address, _)) => unreadable(address),
            None => json_statements(text)
                .unwrap_or_else(|| unreadable("a document that is not a JSON policy")),
        }
    });
    if key == "source_policy_documents" {
        vec![documents.flatten().collect()]
    } else {
        documents.collect()
    }
}

/// The statements written in `r` itself (`statement` blocks, or a plan's `statement` list).
fn own_statements(module: &Module, r: &Resource) -> Vec<Statement> {
    let mut statements = Vec::new();
    // A `dynamic "statement"` counts when its for_each is known and not empty (its content's
    // references to the iterator are not known: the statement is unresolved); an unknown for_each is
    // left out.
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
        let mut unresolved = None;
        // An unresolved list is read as covering everything (see `Statement::unresolved`).
        let mut listed = |key: &str| match module.resolve_attr(r.scope, block.attrs.get(key)) {
            Resolved::Known { value, .. } => strings(&value),
            Resolved::Missing => Vec::new(),
            Resolved::Unknown { line, why, .. } => {
                unresolved.get_or_insert_with(|| {
                    format!(
                        "{}:{line}: {key} of {} cannot be resolved statically ({why})",
                        module.files[r.at.file].name(),
                        r.address()
                    )
                });
                vec![ANYTHING.to_owned()]
            }
        };
        let not_actions =
            !block.attrs.contains_key("actions") && block.attrs.contains_key("not_actions");
        let not_resources =
            !block.attrs.contains_key("resources") && block.attrs.contains_key("not_resources");
        let actions = if not_actions {
            listed("not_actions")
        } else {
            listed("actions")
        };
        let resources = if not_resources {
            listed("not_resources")
        } else {
            listed("resources")
        };
        // Unresolved: a NotAction/NotResource list is read as covering everything too (the statement
        // may then cover anything, which only ever makes a grant uncertain).
        let any = || vec![ANYTHING.to_owned()];
        let (actions, not_actions, resources, not_resources) = match unresolved {
            Some(_) => (
                if not_actions { any() } else { actions },
                false,
                if not_resources { any() } else { resources },
                false,
            ),
            None => (actions, not_actions, resources, not_resources),
        };
        statements.push(Statement {
            sid: get("sid").and_then(|v| v.as_str().map(str::to_owned)),
            allow: get("effect")
                .and_then(|v| v.as_str().map(str::to_owned))
                .as_deref()
                != Some("Deny"),
            actions,
            not_actions,
            resources,
            not_resources,
            conditional: block.children.iter().any(|c| c == "condition"),
            unresolved,
        });
    }
    if let Resolved::Known {
        value: Value::Array(items),
        ..
    } = module.resolve(r, "statement")
    {
        statements.extend(items.iter().filter_map(object_statement));
    }
    statements
}

pub(crate) fn policies<'a>(c: &Checker<'a>) -> Vec<Policy<'a>> {
    let module = c.module;
    let mut out = Vec::new();
    for r in &module.resources {
        if r.mode == "data." && r.kind == "aws_iam_policy_document" {
            let statements = document_statements(module, r, 0);
            out.push(Policy {
                holder: r,
                statements,
            });
        } else if r.mode.is_empty() && POLICY_RESOURCES.contains(&r.kind.as_str()) {
            let unresolved = |line: usize, why: &str| Policy {
                holder: r,
                statements: unresolved_document(format!(
                    "{}:{line}: policy of {} {why}",
                    module.files[r.at.file].name(),
                    r.address()
                )),
            };
            match module.resolve(r, "policy") {
                Resolved::Known {
                    value: Value::String(text),
                    line,
                    ..
                } => {
                    // A reference to a policy document: the document is read as its own policy.
                    if referenced_resource(&text).is_none() {
                        out.push(match json_statements(&text) {
                            Some(statements) => Policy {
                                holder: r,
                                statements,
                            },
                            None => unresolved(line, "is not a JSON policy document"),
                        });
                    }
                }
                Resolved::Known { line, .. } => {
                    out.push(unresolved(line, "is not a JSON policy document"));
                }
                // A plan's policy known only after apply from a policy document: the document is read.
                Resolved::Unknown { references, .. }
                    if references
                        .iter()
                        .any(|r| r.contains("aws_iam_policy_document.")) => {}
                // Anything else cannot be read: it may allow or deny anything (advice where it decides).
                Resolved::Unknown { line, why, .. } => {
                    out.push(unresolved(
                        line,
                        &format!("cannot be resolved statically ({why})"),
                    ));
                }
                Resolved::Missing => {}
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

fn known_string(c: &Checker<'_>, resource: &Resource, key: &str) -> Option<String> {
    match c.module.resolve(resource, key) {
        Resolved::Known {
            value: Value::String(s),
            ..
        } if referenced_resource(&s).is_none() => Some(s),
        _ => None,
    }
}

/// Whether a policy's resource pattern names `resource`'s ARN followed by `suffix` (`/index/NAME` for a
/// DynamoDB index, empty otherwise): its ARN placeholder (also inside a pattern, `"${aws_sqs_queue.q.arn}*"`),
/// its known ARN, or a literal ARN pattern `arn:PARTITION:SERVICE:REGION:ACCOUNT:{prefix}NAME{suffix}`
/// matched on the service and the name (the region and the account are not known statically). AWS IAM: "You
/// can use wildcard characters (* and ?) within the individual segments of an ARN (the parts separated by
/// colons)"; `*` also matches `*`.
pub(crate) fn names_arn(
    c: &Checker<'_>,
    pattern: &str,
    resource: &Resource,
    service: &str,
    prefix: &str,
    suffix: &str,
) -> bool {
    if glob(
        pattern,
        &format!("{}{suffix}", placeholder(&resource.address(), "arn")),
        false,
    ) {
        return true;
    }
    if let Some(arn) = known_string(c, resource, "arn") {
        if glob(pattern, &format!("{arn}{suffix}"), false) {
            return true;
        }
    }
    let parts: Vec<&str> = pattern.splitn(6, ':').collect();
    known_string(c, resource, "name").is_some_and(|name| {
        parts.len() == 6
            && parts[0] == "arn"
            && glob(parts[2], service, false)
            && glob(parts[5], &format!("{prefix}{name}{suffix}"), false)
    })
}

/// The actions of `needed` that `policy` does not grant on what `names` recognises, and those it may or may
/// not grant (a statement that cannot be resolved decides, or only an Allow with a condition grants it), each
/// with its [`Grant`].
pub(crate) fn lacking<'n>(
    policy: &Policy<'_>,
    needed: &[&'n str],
    names: impl Fn(&str) -> bool,
) -> (Vec<&'n str>, Vec<(&'n str, Grant)>) {
    let mut refused = Vec::new();
    let mut uncertain = Vec::new();
    for action in needed {
        match grant(policy, action, &names) {
            Grant::Granted => {}
            Grant::Refused => refused.push(*action),
            other => uncertain.push((*action, other)),
        }
    }
    (refused, uncertain)
}

/// Advice for the actions a worker's policy may not grant: `uncertain` from [`lacking`], on `on`.
pub(crate) fn uncertain_advice(
    c: &mut Checker<'_>,
    policy: &Policy<'_>,
    on: &str,
    uncertain: &[(&str, Grant)],
) {
    for conditional in [false, true] {
        let mut actions = Vec::new();
        let mut whys: Vec<&str> = Vec::new();
        for (action, grant) in uncertain {
            match grant {
                Grant::Conditional(why) if conditional => {
                    actions.push(*action);
                    whys.push(why);
                }
                Grant::Unresolved(why) if !conditional => {
                    actions.push(*action);
                    whys.push(why);
                }
                _ => {}
            }
        }
        if actions.is_empty() {
            continue;
        }
        whys.dedup();
        let (place, address) = (c.place(policy.holder), policy.holder.address());
        c.advice.push(if conditional {
            format!(
                "{place}: {address}: this policy grants {} on {on} only under a condition ({}): check it holds for the worker's requests, the worker calls them",
                actions.join(", "),
                whys.join("; ")
            )
        } else {
            format!(
                "{place}: {address}: whether this policy grants {} on {on} is not known statically ({}); check it does, the worker calls them",
                actions.join(", "),
                whys.join("; ")
            )
        });
    }
}

/// Whether a policy resource pattern names `queue`.
fn names_queue(c: &Checker<'_>, pattern: &str, queue: &Resource) -> bool {
    names_arn(c, pattern, queue, "sqs", "", "")
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
        // A dead-letter queue given as a literal ARN (it lives elsewhere): the worker's actions on it are
        // checked against that ARN, with the same wildcards.
        let external = topology.external_dlq.get(&address);
        let receive = |p: &Policy<'_>| grant(p, "sqs:ReceiveMessage", |r| names_queue(c, r, queue));
        let workers: Vec<&Policy<'_>> = policies.iter().filter(|p| receive(p).meant()).collect();
        let maybe: Vec<(&Policy<'_>, String)> = policies
            .iter()
            .filter_map(|p| match receive(p) {
                Grant::Unresolved(why) => Some((p, why)),
                _ => None,
            })
            .collect();
        for (policy, why) in &maybe {
            uncertain_advice(
                c,
                policy,
                &address,
                &[("sqs:ReceiveMessage", Grant::Unresolved(why.clone()))],
            );
        }
        if workers.is_empty() {
            if !policies.is_empty() && maybe.is_empty() {
                c.advice.push(format!(
                    "{}: {address}: no IAM policy in what was read grants sqs:ReceiveMessage on this queue, so the worker's permissions are not checked (the worker needs {} on it{})",
                    c.place(queue),
                    SQS_WORKER_QUEUE_ACTIONS.join(", "),
                    if dlq.is_some() || external.is_some() { format!(" and {} on its dead-letter queue", SQS_WORKER_DLQ_ACTIONS.join(", ")) } else { String::new() }
                ));
            }
            continue;
        }
        for policy in workers {
            let mut missing = Vec::new();
            let (on_queue, uncertain) = lacking(policy, &SQS_WORKER_QUEUE_ACTIONS, |r| {
                names_queue(c, r, queue)
            });
            uncertain_advice(c, policy, &address, &uncertain);
            if !on_queue.is_empty() {
                missing.push(format!("{} on {address}", on_queue.join(", ")));
            }
            let on_dlq = match (dlq, external) {
                (Some(dlq), _) => Some((
                    format!("the dead-letter queue {}", dlq.address()),
                    lacking(policy, &SQS_WORKER_DLQ_ACTIONS, |r| names_queue(c, r, dlq)),
                )),
                (None, Some(arn)) => Some((
                    format!("the dead-letter queue {arn}"),
                    lacking(policy, &SQS_WORKER_DLQ_ACTIONS, |r| glob(r, arn, false)),
                )),
                (None, None) => None,
            };
            if let Some((shown, (on_dlq, uncertain))) = on_dlq {
                uncertain_advice(c, policy, &shown, &uncertain);
                if !on_dlq.is_empty() {
                    missing.push(format!("{} on {shown}", on_dlq.join(", ")));
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
