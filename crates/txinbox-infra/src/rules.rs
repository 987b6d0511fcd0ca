//! The rules. See [`RuleId`] for what each one checks; the semantics of
//! unset attributes follow the providers' defaults (documented per rule in
//! the crate docs).

use std::collections::{BTreeMap, BTreeSet};

use hcl::Value;

use crate::duration::{human, parse_iso8601_seconds};
use crate::terraform::{referenced_resource, Module, Resolved, Resource};
use crate::{RuleId, SqsIdentity, Violation, WorkerSettings};

/// SQS's visibility timeout when `visibility_timeout_seconds` is unset.
const SQS_DEFAULT_VISIBILITY: u64 = 30;
/// SQS's retention when `message_retention_seconds` is unset.
const SQS_DEFAULT_RETENTION: u64 = 345_600;
/// Service Bus's lock duration when `lock_duration` is unset.
const SB_DEFAULT_LOCK: u64 = 60;

pub(crate) fn as_bool(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_u64(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(crate) fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

pub(crate) struct Checker<'a> {
    pub(crate) module: &'a Module,
    pub(crate) settings: &'a WorkerSettings,
    out: Vec<Violation>,
    pub(crate) advice: Vec<String>,
}

impl Checker<'_> {
    pub(crate) fn report(
        &mut self,
        rule: RuleId,
        resource: &Resource,
        file: usize,
        line: usize,
        message: String,
    ) {
        self.out.push(Violation {
            rule,
            file: self.module.files[file].path.clone(),
            line,
            resource: resource.address(),
            message,
        });
    }

    /// Reports what is missing (no resource to point at): on `line` of the file `file`, under the name
    /// `what`.
    pub(crate) fn report_missing(
        &mut self,
        rule: RuleId,
        file: usize,
        line: usize,
        what: String,
        message: String,
    ) {
        self.out.push(Violation {
            rule,
            file: self.module.files[file].path.clone(),
            line,
            resource: what,
            message,
        });
    }

    /// Reports on the resource's attribute line, or its block line.
    pub(crate) fn at(
        &mut self,
        rule: RuleId,
        resource: &Resource,
        line: Option<usize>,
        message: String,
    ) {
        let line = line.unwrap_or(resource.at.line);
        self.report(rule, resource, resource.at.file, line, message);
    }

    pub(crate) fn unknown(
        &mut self,
        rule: RuleId,
        resource: &Resource,
        key: &str,
        line: usize,
        why: &str,
    ) {
        self.at(
            rule,
            resource,
            Some(line),
            format!("{key} cannot be resolved statically ({why}); set it to a literal or a variable with a default so the guarantee can be checked"),
        );
    }

    /// `FILE:LINE` of a resource, for advice.
    pub(crate) fn place(&self, resource: &Resource) -> String {
        format!(
            "{}:{}",
            self.module.files[resource.at.file].path.display(),
            resource.at.line
        )
    }
}

/// A redrive policy: on the queue or in an `aws_sqs_queue_redrive_policy`.
struct Redrive<'a> {
    holder: &'a Resource,
    resolved: Resolved,
}

/// What a readable redrive policy says.
struct RedriveTarget {
    /// The dead-letter queue's address when it is a queue of what was read.
    dlq: Option<String>,
    max_receive_count: Option<u64>,
    has_target: bool,
}

/// The address of the queue of `module` an ARN (or placeholder) names.
fn queue_by_arn(module: &Module, arn: &str) -> Option<String> {
    if let Some(address) = referenced_resource(arn) {
        return Some(address.to_owned());
    }
    let name = arn.rsplit(':').next()?;
    module
        .resources
        .iter()
        .filter(|r| r.kind == "aws_sqs_queue" && r.mode.is_empty())
        .find(|q| {
            let known = |key| match module.resolve(q, key) {
                Resolved::Known {
                    value: Value::String(s),
                    ..
                } => Some(s),
                _ => None,
            };
            known("arn").is_some_and(|a| a == arn) || known("name").is_some_and(|n| n == name)
        })
        .map(Resource::address)
}

fn read_redrive(module: &Module, value: &Value) -> Result<RedriveTarget, String> {
    let Value::String(text) = value else {
        return Err(format!(
            "redrive_policy is {}, not a JSON string",
            show(value)
        ));
    };
    let json: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("redrive_policy is not valid JSON ({e})"))?;
    let target = json
        .get("deadLetterTargetArn")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty());
    let max = json.get("maxReceiveCount").and_then(|v| match v {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    });
    Ok(RedriveTarget {
        dlq: target.and_then(|arn| queue_by_arn(module, arn)),
        max_receive_count: max,
        has_target: target.is_some(),
    })
}

/// Runs every rule on a loaded module.
pub(crate) fn check(module: &Module, settings: &WorkerSettings) -> (Vec<Violation>, Vec<String>) {
    let mut checker = Checker {
        module,
        settings,
        out: Vec::new(),
        advice: module.notes.clone(),
    };
    check_sqs(&mut checker);
    for queue in module
        .resources
        .iter()
        .filter(|r| r.kind == "azurerm_servicebus_queue")
    {
        check_servicebus_queue(&mut checker, queue);
    }
    crate::roles::check(&mut checker);
    crate::dynamodb::check(&mut checker);
    let mut out = checker.out;
    out.sort_by(|a, b| (&a.file, a.line, a.rule).cmp(&(&b.file, b.line, b.rule)));
    (out, checker.advice)
}

fn queue_of(module: &Module, resource: &Resource) -> Option<String> {
    match module.resolve(resource, "queue_url") {
        Resolved::Known {
            value: Value::String(s),
            ..
        } => referenced_resource(&s).map(str::to_owned).or_else(|| {
            // A plan's known URL: https://sqs.REGION.amazonaws.com/ACCOUNT/NAME
            let name = s.rsplit('/').next()?;
            module
                .resources
                .iter()
                .filter(|r| r.kind == "aws_sqs_queue" && r.mode.is_empty())
                .find(|q| {
                    matches!(module.resolve(q, "url"), Resolved::Known { value: Value::String(u), .. } if u == s)
                        || matches!(module.resolve(q, "name"), Resolved::Known { value: Value::String(n), .. } if n == name)
                })
                .map(Resource::address)
        }),
        Resolved::Unknown { references, .. } => references
            .iter()
            .find(|r| r.contains("aws_sqs_queue."))
            .map(|r| strip_attr(r)),
        Resolved::Known { .. } | Resolved::Missing => None,
    }
}

/// `aws_sqs_queue.dlq` of a plan reference `aws_sqs_queue.dlq.arn` (references list both forms).
fn strip_attr(reference: &str) -> String {
    let parts: Vec<&str> = reference.split('.').collect();
    // module.M.KIND.NAME[.ATTR] or KIND.NAME[.ATTR]
    let mut n = 0;
    let mut i = 0;
    while i + 1 < parts.len() && parts[i] == "module" {
        i += 2;
        n += 2;
    }
    n += if parts.get(i) == Some(&"data") { 3 } else { 2 };
    parts[..n.min(parts.len())].join(".")
}

/// The queues of an SQS module: which are dead-letter queues, which redrive policy each source has.
pub(crate) struct SqsTopology<'a> {
    pub(crate) queues: Vec<&'a Resource>,
    redrives: Vec<(String, Redrive<'a>)>,
    pub(crate) dlqs: BTreeSet<String>,
    /// Source queue address -> its dead-letter queue's address, where known.
    pub(crate) dlq_of: BTreeMap<String, String>,
}

pub(crate) fn sqs_topology(module: &Module) -> SqsTopology<'_> {
    let queues: Vec<&Resource> = module
        .resources
        .iter()
        .filter(|r| r.kind == "aws_sqs_queue" && r.mode.is_empty())
        .collect();
    let mut redrives: Vec<(String, Redrive<'_>)> = Vec::new();
    let mut dlqs = BTreeSet::new();
    // A plan shows an unset policy as "".
    let set = |resolved: &Resolved| match resolved {
        Resolved::Missing => false,
        Resolved::Known {
            value: Value::String(s),
            ..
        } => !s.is_empty(),
        Resolved::Known {
            value: Value::Null, ..
        } => false,
        _ => true,
    };
    for queue in &queues {
        if set(&module.resolve(queue, "redrive_allow_policy")) {
            dlqs.insert(queue.address());
        }
        let resolved = module.resolve(queue, "redrive_policy");
        if set(&resolved) {
            redrives.push((
                queue.address(),
                Redrive {
                    holder: queue,
                    resolved,
                },
            ));
        }
    }
    for resource in module.resources.iter().filter(|r| r.mode.is_empty()) {
        match resource.kind.as_str() {
            "aws_sqs_queue_redrive_policy" => {
                if let Some(address) = queue_of(module, resource) {
                    let resolved = module.resolve(resource, "redrive_policy");
                    redrives.push((
                        address,
                        Redrive {
                            holder: resource,
                            resolved,
                        },
                    ));
                }
            }
            "aws_sqs_queue_redrive_allow_policy" => {
                if let Some(address) = queue_of(module, resource) {
                    dlqs.insert(address);
                }
            }
            _ => {}
        }
    }
    let mut dlq_of = BTreeMap::new();
    for (source, redrive) in &redrives {
        let dlq = match &redrive.resolved {
            Resolved::Known { value, .. } => read_redrive(module, value).ok().and_then(|t| t.dlq),
            // A plan: the policy is known after apply; its references name the dead-letter queue.
            Resolved::Unknown { references, .. } => references
                .iter()
                .find(|r| r.contains("aws_sqs_queue.") && !r.contains("redrive"))
                .map(|r| strip_attr(r))
                .filter(|a| queues.iter().any(|q| q.address() == *a)),
            Resolved::Missing => None,
        };
        if let Some(dlq) = dlq {
            dlqs.insert(dlq.clone());
            dlq_of.insert(source.clone(), dlq);
        }
    }
    SqsTopology {
        queues,
        redrives,
        dlqs,
        dlq_of,
    }
}

fn check_sqs(c: &mut Checker<'_>) {
    let module = c.module;
    let topology = sqs_topology(module);
    let queues = &topology.queues;

    let is_fifo = |queue: &Resource| match module.resolve(queue, "fifo_queue") {
        Resolved::Missing => false,
        Resolved::Known { value, .. } => as_bool(&value).unwrap_or(true),
        // Unknown: check it as a FIFO queue rather than miss a violation.
        Resolved::Unknown { .. } => true,
    };

    for queue in queues {
        let address = queue.address();
        let fifo = is_fifo(queue);
        let is_dlq = topology.dlqs.contains(&address);
        if fifo && !is_dlq {
            check_redrive(
                c,
                queue,
                topology
                    .redrives
                    .iter()
                    .filter(|(n, _)| *n == address)
                    .map(|(_, r)| r),
                queues,
                &is_fifo,
            );
            if let Some(dlq) = topology.dlq_of.get(&address) {
                check_identity(c, queue, dlq, &topology);
            }
        }
        if fifo && c.settings.sqs.producers_send_deduplication_id {
            check_content_dedup(c, queue);
        }
        if !is_dlq {
            check_visibility(c, queue);
            let dlq = topology
                .dlq_of
                .get(&address)
                .and_then(|d| queues.iter().find(|q| q.address() == *d).copied());
            check_retention_path(c, queue, dlq);
        }
    }
    crate::iam::check(c, &topology);
}

/// The identity on the path to the FIFO dead-letter queue: AWS replaces the deduplication id on the move.
fn check_identity(c: &mut Checker<'_>, queue: &Resource, dlq: &str, topology: &SqsTopology<'_>) {
    const AWS: &str = "AWS: \"When a message is moved from a FIFO queue to a FIFO DLQ, the original message's deduplication ID will be replaced with the original message's ID.\"";
    let line = topology
        .redrives
        .iter()
        .find(|(n, _)| *n == queue.address())
        .and_then(|(_, r)| match &r.resolved {
            Resolved::Known { line, .. } | Resolved::Unknown { line, .. } => Some(*line),
            Resolved::Missing => None,
        });
    match c.settings.sqs.identity {
        SqsIdentity::DeduplicationId => c.at(
            RuleId::SqsIdentityLostOnDlqMove,
            queue,
            line,
            format!("sqs.identity = \"deduplication-id\" but this FIFO queue moves messages to the FIFO dead-letter queue {dlq} after maxReceiveCount receives. {AWS} A message applied whose delete was lost would come back from a redrive without its identity (the worker refuses it as identity_lost): producers must set ce-id and ce-source on every message, and sqs.identity = \"cloudevents\""),
        ),
        // "cloudevents" (and any tier that survives the move): advice for producers.
        _ => c.advice.push(format!(
            "{}: {}: producers must set ce-id and ce-source on every message: the identity must not rest on the MessageDeduplicationId, which does not survive the move to the dead-letter queue {dlq}. {AWS}",
            c.place(queue),
            queue.address()
        )),
    }
}
fn check_redrive<'a>(
    c: &mut Checker<'_>,
    queue: &Resource,
    mut policies: impl Iterator<Item = &'a Redrive<'a>>,
    queues: &[&Resource],
    is_fifo: &dyn Fn(&Resource) -> bool,
) {
    const RULE: RuleId = RuleId::SqsFifoMissingRedrive;
    let Some(redrive) = policies.next() else {
        c.at(
            RULE,
            queue,
            None,
            "FIFO queue has no redrive_policy (nor an aws_sqs_queue_redrive_policy): a message whose handler always fails is received again and again until retention drops it, blocking its message group, instead of moving to a dead-letter queue after maxReceiveCount receives".to_owned(),
        );
        return;
    };
    let holder = redrive.holder;
    let (value, line) = match &redrive.resolved {
        Resolved::Known { value, line, .. } => (value, *line),
        Resolved::Unknown { references, .. }
            if references
                .iter()
                .any(|r| queues.iter().any(|q| strip_attr(r) == q.address())) =>
        {
            // A plan before the dead-letter queue exists: its ARN is known only after apply.
            let dlq = references
                .iter()
                .map(|r| strip_attr(r))
                .find(|a| queues.iter().any(|q| q.address() == *a))
                .unwrap_or_default();
            if let Some(dlq_queue) = queues.iter().find(|q| q.address() == dlq) {
                if !is_fifo(dlq_queue) {
                    c.report(RULE, holder, holder.at.file, holder.at.line, format!("dead-letter queue {dlq} is not a FIFO queue; the dead-letter queue of a FIFO queue must be FIFO"));
                }
            }
            c.advice.push(format!(
                "{}: {}: redrive_policy is known only after apply (it names {dlq}); its maxReceiveCount is checked on a plan made once the dead-letter queue exists",
                c.place(holder),
                holder.address()
            ));
            return;
        }
        Resolved::Unknown { line, why, .. } => {
            c.report(RULE, holder, holder.at.file, *line, format!("redrive_policy cannot be resolved statically ({why}), so the dead-letter queue cannot be checked"));
            return;
        }
        Resolved::Missing => return,
    };
    let module = c.module;
    let mut problem = |message: String| c.report(RULE, holder, holder.at.file, line, message);
    match read_redrive(module, value) {
        Err(why) => problem(why),
        Ok(target) if !target.has_target => {
            problem("redrive_policy has no deadLetterTargetArn: failed messages never reach a dead-letter queue".to_owned());
        }
        Ok(target) => {
            match target.max_receive_count {
                Some(n) if n >= 1 => {}
                _ => problem("redrive_policy has no maxReceiveCount of at least 1: SQS cannot move a failing message to the dead-letter queue".to_owned()),
            }
            if let Some(dlq) = target.dlq {
                if let Some(dlq_queue) = queues.iter().find(|q| q.address() == dlq) {
                    if !is_fifo(dlq_queue) {
                        problem(format!("dead-letter queue {dlq} is not a FIFO queue; the dead-letter queue of a FIFO queue must be FIFO"));
                    }
                }
            }
        }
    }
}

fn check_content_dedup(c: &mut Checker<'_>, queue: &Resource) {
    const RULE: RuleId = RuleId::SqsContentBasedDeduplication;
    const KEY: &str = "content_based_deduplication";
    match c.module.resolve(queue, KEY) {
        Resolved::Missing => {}
        Resolved::Unknown { line, why, .. } => c.unknown(RULE, queue, KEY, line, &why),
        Resolved::Known {
            value,
            line,
            origin,
        } => {
            if as_bool(&value) != Some(false) {
                c.at(RULE, queue, Some(line), format!(
                    "content_based_deduplication = {}{origin} but producers send an explicit MessageDeduplicationId (sqs.producers_send_deduplication_id): a send without the id is deduplicated by a hash of its body, so two distinct messages with the same body within 5 minutes are silently dropped and the inbox no longer keys on the producer's id; set it to false",
                    show(&value)
                ));
            }
        }
    }
}

/// Resolves a whole-seconds SQS attribute (`default` when unset) as (value, line, how to show it). When it
/// cannot be known statically or is not a whole number of seconds, reports that under `rule` and gives None.
fn sqs_seconds(
    c: &mut Checker<'_>,
    queue: &Resource,
    rule: RuleId,
    key: &str,
    default: u64,
) -> Option<(u64, Option<usize>, String)> {
    match c.module.resolve(queue, key) {
        Resolved::Missing => Some((
            default,
            None,
            format!("{key} is not set (SQS default {default} s)"),
        )),
        Resolved::Unknown { line, why, .. } => {
            c.unknown(rule, queue, key, line, &why);
            None
        }
        Resolved::Known {
            value,
            line,
            origin,
        } => match as_u64(&value) {
            Some(s) => Some((s, Some(line), format!("{key} = {s}{origin}"))),
            None => {
                c.at(
                    rule,
                    queue,
                    Some(line),
                    format!(
                        "{key} = {}{origin} is not a whole number of seconds",
                        show(&value)
                    ),
                );
                None
            }
        },
    }
}

fn check_visibility(c: &mut Checker<'_>, queue: &Resource) {
    const RULE: RuleId = RuleId::SqsVisibilityTimeoutTooShort;
    const KEY: &str = "visibility_timeout_seconds";
    let heartbeat = c.settings.sqs.heartbeat_interval().as_secs();
    let minimum = heartbeat.saturating_mul(2);
    let Some((seconds, line, shown)) = sqs_seconds(c, queue, RULE, KEY, SQS_DEFAULT_VISIBILITY)
    else {
        return;
    };
    if seconds < minimum {
        c.at(RULE, queue, line, format!(
            "{shown} is shorter than 2 x the worker's heartbeat interval (2 x {heartbeat} s = {minimum} s): a message can become visible to another consumer before the heartbeat extends it, so two handlers run it at once"
        ));
    }
}

/// The longest redelivery path of a queue: a message may wait in the queue its whole retention, then in the
/// dead-letter queue its whole retention, then for an operator's redrive (`inbox.redrive_grace_seconds`);
/// the inbox must remember its marker for all of it.
fn check_retention_path(c: &mut Checker<'_>, queue: &Resource, dlq: Option<&Resource>) {
    const RULE: RuleId = RuleId::SqsRetentionExceedsInbox;
    const KEY: &str = "message_retention_seconds";
    let inbox = c.settings.inbox.retention_seconds;
    let grace = c.settings.inbox.redrive_grace_seconds;
    let Some((own, own_line, own_shown)) = sqs_seconds(c, queue, RULE, KEY, SQS_DEFAULT_RETENTION)
    else {
        return;
    };
    let Some(dlq) = dlq else {
        if own > inbox {
            c.at(RULE, queue, own_line, format!(
                "{own_shown}: the queue keeps messages longer than the inbox keeps processed markers (inbox.retention_seconds = {}); a message redelivered after the inbox forgot its id would be processed again as new",
                human(inbox)
            ));
        }
        return;
    };
    let Some((dead, dead_line, dead_shown)) = sqs_seconds(c, dlq, RULE, KEY, SQS_DEFAULT_RETENTION)
    else {
        return;
    };
    let path = own.saturating_add(dead).saturating_add(grace);
    if path > inbox {
        // Reported on the longer of the two retentions (the one to shorten first), naming the other.
        let (at, line, other) = if own > dead {
            let dead_at = format!(
                "{}:{}",
                c.module.files[dlq.at.file].name(),
                dead_line.unwrap_or(dlq.at.line)
            );
            (
                queue,
                own_line,
                format!(
                    "dead-letter queue {} {dead_shown} (at {dead_at})",
                    dlq.address()
                ),
            )
        } else {
            let own_at = format!(
                "{}:{}",
                c.module.files[queue.at.file].name(),
                own_line.unwrap_or(queue.at.line)
            );
            (
                dlq,
                dead_line,
                format!("queue {} {own_shown} (at {own_at})", queue.address()),
            )
        };
        let this = if own > dead { &own_shown } else { &dead_shown };
        c.at(RULE, at, line, format!(
            "{this}: the longest redelivery path is {}, longer than the inbox keeps processed markers (inbox.retention_seconds = {}): queue retention + dead-letter queue retention + the operator's redrive grace (inbox.redrive_grace_seconds = {}), with the {other}; a message applied whose delete was lost, moved to the dead-letter queue and redriven at the end of that path would be processed again as new. Shorten a retention or keep markers longer",
            human(path),
            human(inbox),
            human(grace),
        ));
    }
}

/// A duration in seconds, its line, and how to show it.
type Found = (u64, usize, String);
/// The line and message of a duration that cannot be used.
type Unusable = (usize, String);

/// Reads an ISO 8601 duration attribute: `Ok(Some((seconds, line, shown)))`,
/// `Ok(None)` when missing, `Err((line, message))` when unusable.
pub(crate) fn duration(
    module: &Module,
    queue: &Resource,
    key: &str,
) -> Result<Option<Found>, Unusable> {
    match module.resolve(queue, key) {
        Resolved::Missing => Ok(None),
        Resolved::Unknown { line, why, .. } => Err((line, format!("{key} cannot be resolved statically ({why}); set it to a literal or a variable with a default so the guarantee can be checked"))),
        Resolved::Known { value, line, origin } => {
            let parsed = match &value {
                Value::String(s) => parse_iso8601_seconds(s),
                _ => None,
            };
            match parsed {
                Some(seconds) => Ok(Some((seconds, line, format!("{key} = {}{origin}", show(&value))))),
                None => Err((line, format!("{key} = {}{origin} is not an ISO 8601 duration such as \"PT1M\"", show(&value)))),
            }
        }
    }
}

fn check_servicebus_queue(c: &mut Checker<'_>, queue: &Resource) {
    let module = c.module;
    let settings = c.settings;

    // Duplicate detection, and its window.
    const DD: &str = "requires_duplicate_detection";
    match module.resolve(queue, DD) {
        Resolved::Missing => c.at(RuleId::ServiceBusDuplicateDetectionOff, queue, None, format!(
            "{DD} is not set (Service Bus default: false): the broker does not drop a producer's resend of the same MessageId, so every retry reaches the worker; set it to true (it cannot be changed after the queue is created)"
        )),
        Resolved::Unknown { line, why, .. } => c.unknown(RuleId::ServiceBusDuplicateDetectionOff, queue, DD, line, &why),
        Resolved::Known { value, line, origin } => {
            if as_bool(&value) == Some(true) {
                const WINDOW: &str = "duplicate_detection_history_time_window";
                match duration(module, queue, WINDOW) {
                    Ok(Some(_)) => {}
                    Ok(None) => c.at(RuleId::ServiceBusDuplicateWindowDefault, queue, None, format!(
                        "{DD} = true but {WINDOW} is left to the provider's default: set the window explicitly (the worker expects PT{}S) so that it is reviewed and cannot change with the provider",
                        settings.servicebus.duplicate_detection_window_seconds
                    )),
                    Err((line, message)) => c.at(RuleId::ServiceBusDuplicateWindowDefault, queue, Some(line), message),
                }
            } else {
                c.at(RuleId::ServiceBusDuplicateDetectionOff, queue, Some(line), format!(
                    "{DD} = {}{origin}: the broker does not drop a producer's resend of the same MessageId, so every retry reaches the worker; set it to true (it cannot be changed after the queue is created)",
                    show(&value)
                ));
            }
        }
    }

    // Lock duration against the renewal interval.
    const LOCK: &str = "lock_duration";
    let renewal = settings.servicebus.lock_renewal_interval().as_secs();
    let minimum = renewal.saturating_mul(2);
    let lock = match duration(module, queue, LOCK) {
        Ok(Some(found)) => Some(found),
        Ok(None) => Some((
            SB_DEFAULT_LOCK,
            queue.at.line,
            format!("{LOCK} is not set (Service Bus default PT1M)"),
        )),
        Err((line, message)) => {
            c.at(
                RuleId::ServiceBusLockDurationTooShort,
                queue,
                Some(line),
                message,
            );
            None
        }
    };
    if let Some((seconds, line, shown)) = lock {
        if seconds < minimum {
            c.at(RuleId::ServiceBusLockDurationTooShort, queue, Some(line), format!(
                "{shown} is {}, shorter than 2 x the worker's lock renewal interval (2 x {renewal} s = {minimum} s): the lock can expire before it is renewed and the message is delivered to another receiver while the handler still runs",
                human(seconds)
            ));
        }
    }

    // Dead-lettering on expiry.
    const DLX: &str = "dead_lettering_on_message_expiration";
    match module.resolve(queue, DLX) {
        Resolved::Missing => c.at(RuleId::ServiceBusNoDeadLetteringOnExpiry, queue, None, format!(
            "{DLX} is not set (Service Bus default: false): a message that expires before the worker completes it is dropped silently instead of kept in the dead-letter queue"
        )),
        Resolved::Unknown { line, why, .. } => c.unknown(RuleId::ServiceBusNoDeadLetteringOnExpiry, queue, DLX, line, &why),
        Resolved::Known { value, line, origin } => {
            if as_bool(&value) != Some(true) {
                c.at(RuleId::ServiceBusNoDeadLetteringOnExpiry, queue, Some(line), format!(
                    "{DLX} = {}{origin}: a message that expires before the worker completes it is dropped silently instead of kept in the dead-letter queue",
                    show(&value)
                ));
            }
        }
    }

    // Time to live against the inbox retention.
    const TTL: &str = "default_message_ttl";
    let inbox = settings.inbox.retention_seconds;
    match duration(module, queue, TTL) {
        Ok(None) => c.at(RuleId::ServiceBusTtlExceedsInbox, queue, None, format!(
            "{TTL} is not set (Service Bus default: practically forever), longer than the inbox keeps processed markers (inbox.retention_seconds = {}): a message redelivered after the inbox forgot its id would be processed again as new",
            human(inbox)
        )),
        Ok(Some((seconds, line, shown))) if seconds > inbox => c.at(RuleId::ServiceBusTtlExceedsInbox, queue, Some(line), format!(
            "{shown} is {}, longer than the inbox keeps processed markers (inbox.retention_seconds = {}): a message redelivered after the inbox forgot its id would be processed again as new",
            human(seconds),
            human(inbox)
        )),
        Ok(Some(_)) => {}
        Err((line, message)) => c.at(RuleId::ServiceBusTtlExceedsInbox, queue, Some(line), message),
    }
}
