//! The SQS queue rules: redrive, identity on the DLQ move, content deduplication, visibility, retention.

use std::time::Duration;

use super::topology::{read_redrive, sqs_topology, strip_attr, Redrive, SqsTopology};
use super::{as_bool, as_u64, show, Checker};
use crate::duration::{exact, human, redelivery_path};
use crate::terraform::{Resolved, Resource};
use crate::{RuleId, SqsIdentity};

/// SQS's visibility timeout when `visibility_timeout_seconds` is unset.
const SQS_DEFAULT_VISIBILITY: u64 = 30;
/// SQS's retention when `message_retention_seconds` is unset.
const SQS_DEFAULT_RETENTION: u64 = 345_600;

pub(super) fn check_sqs(c: &mut Checker<'_>) {
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
            // The dead-letter queue may live elsewhere (another state, a literal ARN): the move replaces the
            // deduplication id all the same.
            if let Some(dlq) = topology
                .dlq_of
                .get(&address)
                .or_else(|| topology.external_dlq.get(&address))
            {
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
            if let Some(arn) = topology.external_dlq.get(&address) {
                c.advice.push(format!(
                    "{}: {address}: its dead-letter queue {arn} is not in what was read, so the longest redelivery path (this queue's retention + that queue's + inbox.redrive_grace_seconds) is not checked against inbox.retention_seconds; check the two together",
                    c.place(queue)
                ));
            }
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
            } else if let Some(arn) = target.external {
                // AWS: "The name of a FIFO queue must end with the .fifo suffix."
                let name = arn.rsplit([':', '/']).next().unwrap_or_default();
                if !name.ends_with(".fifo") {
                    problem(format!("dead-letter queue {arn} is not a FIFO queue (a FIFO queue's name ends in .fifo); the dead-letter queue of a FIFO queue must be FIFO"));
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
    // Exact, not in whole seconds: a third of a 50 s visibility timeout is 16.666 s, so a queue's 33 s is
    // short of two heartbeats (33.333 s) though 33 >= 2 x 16.
    let heartbeat = c.settings.sqs.heartbeat_interval();
    let minimum = heartbeat.saturating_mul(2);
    let Some((seconds, line, shown)) = sqs_seconds(c, queue, RULE, KEY, SQS_DEFAULT_VISIBILITY)
    else {
        return;
    };
    if Duration::from_secs(seconds) < minimum {
        c.at(RULE, queue, line, format!(
            "{shown} is shorter than 2 x the worker's heartbeat interval (2 x {} = {}): a message can become visible to another consumer before the heartbeat extends it, so two handlers run it at once",
            exact(heartbeat),
            exact(minimum)
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
        if redelivery_path(own, None, grace) > inbox {
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
    let path = redelivery_path(own, Some(dead), grace);
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
