//! Redrive that keeps identity: moves messages from a dead-letter queue back to a queue with their
//! CloudEvents attributes, FIFO group and deduplication id, deleting each from the DLQ only after its send
//! succeeded.
//!
//! SQS's own `StartMessageMoveTask` is not used: it re-sends messages with a new `MessageId` (fine when the
//! identity is in CloudEvents attributes or the deduplication id, fatal for consumers that opted into the
//! broker id), and it cannot skip messages that are still inside the FIFO deduplication window.
//!
//! The 5-minute FIFO deduplication window matters here: a send whose deduplication id was used on the target
//! queue less than 5 minutes ago is accepted and silently dropped. So a message whose DLQ copy is younger than
//! 5 minutes keeps its identity another way: when its identity is in CloudEvents (`ce-id` attribute or a
//! structured CloudEvents body) it is sent with the deduplication id `redrive-<DLQ MessageId>` (stable across
//! reruns, so a rerun after a failed DLQ delete is itself deduplicated); when the deduplication id *is* its
//! identity it is left in the DLQ and reported as deferred, to be moved by a later run; the later messages of
//! its FIFO group in that run are deferred with it, so none reaches the queue ahead of it.

use std::time::Duration;

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use chrono::{TimeZone, Utc};
pub use txinbox_core::broker::redrive::RedriveOptions;
use txinbox_core::broker::redrive::{RedriveEvent, RedriveItem, RedriveProgress, RedriveReport};
use txinbox_core::{dead_letter, BrokerError, BrokerErrorKind};

use crate::dlq::is_fifo;
use crate::error::sdk_error;
use crate::receiver::delete_one;

/// SQS FIFO's deduplication interval.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(300);

/// The visibility timeout [`redrive`]'s receives give the dead letters they return.
pub const RECEIVE_VISIBILITY: Duration = Duration::from_secs(60);

/// `txinbox sqs redrive --from DLQ_URL --to QUEUE_URL [--max N]`: moves up to `opts.max` messages (all when
/// `None`) from `from` to `to`, telling `progress` as it goes (`&mut ()` for nothing). See the
/// [module docs](self) for the identity rules.
///
/// The report fills `moved`, `new_dedup_id`, `deferred`, `identity_lost` and `initially_visible`. On an error
/// the redrive stops and returns it; the last report `progress` saw says what was moved before.
pub async fn redrive(
    client: &aws_sdk_sqs::Client,
    from: &str,
    to: &str,
    opts: &RedriveOptions,
    progress: &mut dyn RedriveProgress,
) -> Result<RedriveReport, BrokerError> {
    redrive_with_visibility(client, from, to, opts, RECEIVE_VISIBILITY, progress).await
}

/// [`redrive`], its receives giving the dead letters they return the visibility timeout `visibility`
/// (whole seconds, at most 12 hours) instead of [`RECEIVE_VISIBILITY`].
pub async fn redrive_with_visibility(
    client: &aws_sdk_sqs::Client,
    from: &str,
    to: &str,
    opts: &RedriveOptions,
    visibility: Duration,
    progress: &mut dyn RedriveProgress,
) -> Result<RedriveReport, BrokerError> {
    let mut report = RedriveReport::default();
    let visibility = visibility.min(Duration::from_secs(43_200));
    let result = run(client, from, to, opts, visibility, progress, &mut report).await;
    progress.event(
        RedriveEvent::Finished {
            error: result.as_ref().err(),
        },
        &report,
    );
    result.map(|()| report)
}

async fn run(
    client: &aws_sdk_sqs::Client,
    from: &str,
    to: &str,
    opts: &RedriveOptions,
    visibility: Duration,
    progress: &mut dyn RedriveProgress,
    report: &mut RedriveReport,
) -> Result<(), BrokerError> {
    report.initially_visible = Some(
        client
            .get_queue_attributes()
            .queue_url(from)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .map_err(|e| sdk_error("GetQueueAttributes", e))?
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
    );
    let target_fifo = is_fifo(to);
    let limit = opts.max.unwrap_or(usize::MAX);
    // FIFO groups one of whose messages this run left in the DLQ for a later run (deferred): their later
    // messages wait with it, or they would reach the queue before it. AWS: "Messages within the same message
    // group are always processed one at a time, in strict order".
    let mut waiting_groups: std::collections::HashSet<String> = std::collections::HashSet::new();
    // The dead letters this run left in the DLQ (deferred, identity lost), by MessageId. A receive hides each
    // for `visibility` only (AWS, ReceiveMessage's VisibilityTimeout: "If the message is not deleted or its
    // visibility timeout is not extended before the timeout expires, it becomes visible again and can be
    // retrieved by other consumers."), so a pass that lasts longer receives them again: each is decided once,
    // and the run ends when a receive brings nothing it has not decided, and either every one it left came
    // back since it last decided a message, or `visibility` passed since then (by when each it left, unless
    // someone else took it, was visible again).
    let mut left: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut back: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut last_decided = std::time::Instant::now();
    progress.event(RedriveEvent::Started, report);
    'outer: while report.moved < limit {
        let ask = (limit - report.moved).min(10);
        let out = client
            .receive_message()
            .queue_url(from)
            .max_number_of_messages(ask as i32)
            .wait_time_seconds(opts.wait.as_secs().min(20) as i32)
            .visibility_timeout(visibility.as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| sdk_error("ReceiveMessage", e))?;
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        let mut decided = false;
        for m in messages {
            if report.moved >= limit {
                break 'outer;
            }
            if let Some(id) = m.message_id().filter(|id| left.contains(*id)) {
                tracing::debug!(
                    dlq_message_id = id,
                    "received again: this run already left it in the DLQ"
                );
                back.insert(id.to_owned());
                continue;
            }
            decided = true;
            let receipt = m.receipt_handle().ok_or_else(|| {
                BrokerError::new(
                    BrokerErrorKind::Protocol,
                    "ReceiveMessage",
                    "SQS returned a message without a receipt handle",
                )
            })?;
            let sys =
                |k: MessageSystemAttributeName| m.attributes().and_then(|a| a.get(&k)).cloned();
            let position = m.message_id().unwrap_or_default();
            let attrs =
                redriven_attributes(m.message_attributes().cloned().unwrap_or_default(), from);
            let mut send = client
                .send_message()
                .queue_url(to)
                .message_body(m.body().unwrap_or_default())
                .set_message_attributes((!attrs.is_empty()).then_some(attrs.clone()));
            let original = sys(MessageSystemAttributeName::MessageDeduplicationId);
            let identity_in_attributes = identity_elsewhere(&m, &attrs);
            if identity_lost(&m, original.as_deref(), identity_in_attributes) {
                // AWS replaced the producer's deduplication id with the message id on the move to the DLQ, and
                // it was the message's only identity: sent back, the message would be applied again under a
                // new one. It stays in the DLQ for an operator.
                report.identity_lost += 1;
                left.extend(m.message_id().map(str::to_owned));
                tracing::error!(dlq_message_id = position, "left in the DLQ: its identity was its deduplication id, which AWS replaced on the move to the DLQ; redriving it would apply it again under a new identity (producers must send ce-id)");
                progress.event(
                    RedriveEvent::IdentityLost {
                        item: RedriveItem::new(position, position),
                    },
                    report,
                );
                continue;
            }
            if target_fifo {
                let group = sys(MessageSystemAttributeName::MessageGroupId);
                if let Some(g) = group.as_ref().filter(|g| waiting_groups.contains(*g)) {
                    report.deferred += 1;
                    left.extend(m.message_id().map(str::to_owned));
                    tracing::warn!(dlq_message_id = position, group = %g, "deferred: an earlier message of its group stays in the DLQ until a later run; run the redrive again later");
                    let sent = sys(MessageSystemAttributeName::SentTimestamp)
                        .and_then(|t| t.parse::<i64>().ok())
                        .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
                    progress.event(
                        RedriveEvent::Deferred {
                            item: RedriveItem::new(
                                original.as_deref().unwrap_or(position),
                                position,
                            ),
                            enqueued_ago: sent.map(|t| Utc::now() - t),
                            window: DEDUP_WINDOW,
                        },
                        report,
                    );
                    continue;
                }
                let sent = sys(MessageSystemAttributeName::SentTimestamp)
                    .and_then(|t| t.parse::<i64>().ok())
                    .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
                let in_window = sent.is_none_or(|sent| {
                    (Utc::now() - sent).to_std().unwrap_or_default()
                        < DEDUP_WINDOW + Duration::from_secs(10)
                });
                let dedup = match (original.clone(), in_window, identity_in_attributes) {
                    (Some(orig), false, _) => orig,
                    (Some(orig), true, false) => {
                        report.deferred += 1;
                        left.extend(m.message_id().map(str::to_owned));
                        if let Some(g) = &group {
                            waiting_groups.insert(g.clone());
                        }
                        tracing::warn!(dlq_message_id = position, "deferred: its deduplication id is its identity and is still inside the 5-minute FIFO window; run the redrive again later");
                        progress.event(
                            RedriveEvent::Deferred {
                                item: RedriveItem::new(&orig, position),
                                enqueued_ago: sent.map(|t| Utc::now() - t),
                                window: DEDUP_WINDOW,
                            },
                            report,
                        );
                        continue;
                    }
                    (_, _, _) => {
                        report.new_dedup_id += 1;
                        format!("redrive-{}", m.message_id().unwrap_or(receipt))
                    }
                };
                let group = group.unwrap_or_else(|| "txinbox-redrive".into());
                send = send.message_group_id(group).message_deduplication_id(dedup);
            }
            send.send().await.map_err(|e| sdk_error("SendMessage", e))?;
            // Only after the send: a failure here leaves a copy in both queues, which the inbox absorbs.
            delete_one(client, from, receipt).await?;
            report.moved += 1;
            let id = original.unwrap_or_default();
            report.moved_ids.push(id.clone());
            metrics::counter!(txinbox_core::metrics::REDRIVE_MOVED, "queue" => to.to_owned())
                .increment(1);
            progress.event(RedriveEvent::Moved(RedriveItem::new(&id, position)), report);
        }
        if decided {
            back.clear();
            last_decided = std::time::Instant::now();
        } else if back.len() >= left.len() || last_decided.elapsed() >= visibility {
            // Only what this run left came back: the rest of the DLQ is what it decided to leave.
            break;
        }
    }
    Ok(())
}

/// Whether the message carries its identity outside the deduplication id: a `ce-id` attribute or a structured
/// CloudEvents body.
fn identity_elsewhere(
    m: &aws_sdk_sqs::types::Message,
    attrs: &std::collections::HashMap<String, aws_sdk_sqs::types::MessageAttributeValue>,
) -> bool {
    attrs
        .keys()
        .any(|k| k.eq_ignore_ascii_case(txinbox_core::pipeline::identity::ce::ID))
        || structured_cloudevent(m.body().unwrap_or_default())
}

/// Whether a dead letter's only identity was lost on the way to the DLQ: AWS replaced its deduplication id
/// with its message id, and it has no `ce-id`.
fn identity_lost(m: &aws_sdk_sqs::types::Message, dedup_id: Option<&str>, elsewhere: bool) -> bool {
    crate::receiver::deduplication_id_replaced(m.message_id(), dedup_id) && !elsewhere
}

fn structured_cloudevent(body: &str) -> bool {
    if !body.trim_start().starts_with('{') {
        return false;
    }
    serde_json::from_str::<serde_json::Value>(body).is_ok_and(|v| {
        v.get("specversion").is_some() && v.get("id").is_some() && v.get("source").is_some()
    })
}

/// The attributes a redriven copy carries: the message's own, less the dead-letter bookkeeping, and where it
/// came from when there is room. A message that reached the DLQ with 10 attributes of its own (moved there by
/// `maxReceiveCount`, or forwarded without room for its reason) has none: AWS, "Each message can have up to
/// 10 attributes", and an 11th would make SQS refuse the send and the redrive stop at this message every
/// time.
fn redriven_attributes(
    mut attrs: std::collections::HashMap<String, aws_sdk_sqs::types::MessageAttributeValue>,
    from: &str,
) -> std::collections::HashMap<String, aws_sdk_sqs::types::MessageAttributeValue> {
    attrs.retain(|k, _| !dead_letter::is_bookkeeping(k));
    if attrs.len() < crate::dlq::MAX_MESSAGE_ATTRIBUTES {
        if let Ok(v) = aws_sdk_sqs::types::MessageAttributeValue::builder()
            .data_type("String")
            .string_value(from)
            .build()
        {
            attrs.insert(dead_letter::REDRIVEN_FROM.to_owned(), v);
        }
    }
    attrs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redriven_copy_never_carries_more_than_ten_attributes() {
        let value = || {
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value("v")
                .build()
                .unwrap()
        };
        let full: std::collections::HashMap<_, _> =
            (0..10).map(|i| (format!("a{i}"), value())).collect();
        let out = redriven_attributes(full, "dlq-url");
        assert_eq!(out.len(), 10);
        assert!(!out.contains_key(dead_letter::REDRIVEN_FROM));
        let few: std::collections::HashMap<_, _> =
            (0..3).map(|i| (format!("a{i}"), value())).collect();
        let out = redriven_attributes(few, "dlq-url");
        assert_eq!(out.len(), 4);
        assert_eq!(
            out[dead_letter::REDRIVEN_FROM].string_value(),
            Some("dlq-url")
        );
    }

    #[test]
    fn structured_cloudevents_bodies_are_recognised() {
        assert!(structured_cloudevent(
            r#"{"specversion":"1.0","id":"e","source":"s"}"#
        ));
        assert!(!structured_cloudevent(r#"{"id":"e"}"#));
        assert!(!structured_cloudevent("plain"));
    }
}

#[cfg(test)]
mod identity_tests {
    use std::collections::HashMap;

    use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};

    use super::*;

    /// A dead letter as AWS leaves it after a move from a FIFO queue to a FIFO DLQ: "the original message's
    /// deduplication ID will be replaced with the original message's ID" (SQS Developer Guide). moto does not
    /// do this, so the shape is built here.
    fn moved_by_aws(id: &str, body: &str) -> Message {
        Message::builder()
            .message_id(id)
            .body(body)
            .attributes(MessageSystemAttributeName::MessageDeduplicationId, id)
            .build()
    }

    fn ce_id(v: &str) -> HashMap<String, MessageAttributeValue> {
        let a = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(v)
            .build()
            .unwrap();
        HashMap::from([("ce-id".to_owned(), a)])
    }

    #[test]
    fn a_dead_letter_whose_only_identity_was_its_replaced_dedup_id_is_not_redriven() {
        let m = moved_by_aws("6f1c-aws-message-id", r#"{"opportunity":"2481"}"#);
        let dedup = Some("6f1c-aws-message-id");
        assert!(identity_lost(
            &m,
            dedup,
            identity_elsewhere(&m, &HashMap::new())
        ));
    }

    #[test]
    fn a_dead_letter_with_its_ce_id_or_a_structured_cloudevent_keeps_its_identity() {
        let m = moved_by_aws("6f1c", "{}");
        assert!(!identity_lost(
            &m,
            Some("6f1c"),
            identity_elsewhere(&m, &ce_id("evt-1"))
        ));
        let structured = moved_by_aws(
            "6f1c",
            r#"{"specversion":"1.0","id":"evt-1","source":"urn:crm","type":"t"}"#,
        );
        assert!(!identity_lost(
            &structured,
            Some("6f1c"),
            identity_elsewhere(&structured, &HashMap::new())
        ));
    }

    #[test]
    fn a_producer_dedup_id_that_survived_is_not_mistaken_for_a_replaced_one() {
        let m = Message::builder()
            .message_id("6f1c")
            .body("{}")
            .attributes(
                MessageSystemAttributeName::MessageDeduplicationId,
                "evt-482",
            )
            .build();
        assert!(!identity_lost(&m, Some("evt-482"), false));
        assert!(!identity_lost(&m, None, false));
    }

    #[test]
    fn the_consumer_never_takes_a_replaced_dedup_id_as_the_identity() {
        let m = moved_by_aws("6f1c", "{}");
        let rm = crate::received_message(&m, chrono::Utc::now());
        assert_eq!(rm.producer_id, None, "not an identity");
        assert_eq!(rm.broker_id.as_deref(), Some("6f1c"));
        let kept = Message::builder()
            .message_id("6f1c")
            .body("{}")
            .attributes(
                MessageSystemAttributeName::MessageDeduplicationId,
                "evt-482",
            )
            .build();
        assert_eq!(
            crate::received_message(&kept, chrono::Utc::now())
                .producer_id
                .as_deref(),
            Some("evt-482")
        );
    }
}
