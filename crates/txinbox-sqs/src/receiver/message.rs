//! The broker-neutral view of an SQS message, and the deduplication id AWS replaces on a move to a FIFO DLQ.

use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use chrono::{DateTime, TimeZone, Utc};
use txinbox_core::ReceivedMessage;

/// Whether a FIFO message's deduplication id is the one AWS puts in place of the producer's when it moves a
/// message to a FIFO dead-letter queue: the message's own id (SQS Developer Guide, dead-letter queue redrive:
/// "When a message is moved from a FIFO queue to a FIFO DLQ, the original message's deduplication ID will be
/// replaced with the original message's ID.").
pub fn deduplication_id_replaced(message_id: Option<&str>, dedup_id: Option<&str>) -> bool {
    matches!((message_id, dedup_id), (Some(m), Some(d)) if !m.is_empty() && m == d)
}

/// The broker-neutral view of an SQS message: attribute names lower-cased (of names that differ only in case,
/// the one already in lower case is kept, else the first by name), CloudEvents attributes kept as
/// attributes, `MessageDeduplicationId` as the producer id (unless AWS replaced it, see
/// [`deduplication_id_replaced`]), `MessageId` as the broker id,
/// `ApproximateReceiveCount` as the delivery count, `SentTimestamp` as the enqueue time and `MessageGroupId`
/// as the group.
pub fn received_message(m: &Message, received_at: DateTime<Utc>) -> ReceivedMessage {
    let sys = |k: MessageSystemAttributeName| m.attributes().and_then(|a| a.get(&k)).cloned();
    let mut rm = ReceivedMessage::new(m.body().unwrap_or_default().as_bytes().to_vec());
    if let Some(attrs) = m.message_attributes() {
        // SQS names are case-sensitive (AWS, `MessageAttributeNames`: "The name is case-sensitive and must be
        // unique among all attribute names for the message"): `ce-id` and `CE-ID` can both be on a message.
        // Read lower-cased, one of them must win the same way on every read (every redelivery, every
        // worker), or one message resolves two identities; the SDK's map iterates in a random order per map.
        // The name already in lower case (the CloudEvents spelling) wins, then the first of the others by name.
        let mut names: Vec<(bool, &String, &MessageAttributeValue)> = attrs
            .iter()
            .map(|(k, v)| (k.to_lowercase() != *k, k, v))
            .collect();
        names.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        for (_, k, v) in names {
            if let Some(s) = v.string_value() {
                rm.attributes
                    .entry(k.to_lowercase())
                    .or_insert_with(|| s.to_owned());
            }
        }
    }
    rm.broker_id = m.message_id().map(str::to_owned);
    rm.producer_id = sys(MessageSystemAttributeName::MessageDeduplicationId);
    if deduplication_id_replaced(rm.broker_id.as_deref(), rm.producer_id.as_deref()) {
        // AWS: "When a message is moved from a FIFO queue to a FIFO DLQ, the original message's deduplication
        // ID will be replaced with the original message's ID." The producer's id is gone: using the
        // replacement would give an applied message a new identity, so it is not an identity at all.
        metrics::counter!(crate::metrics::REPLACED_DEDUP_IDS).increment(1);
        tracing::warn!(
            message_id = rm.broker_id.as_deref().unwrap_or(""),
            "deduplication id replaced by the DLQ move (it equals the message id): not used as the identity; only ce-id survives this path"
        );
        rm.producer_id = None;
    }
    rm.delivery_count = sys(MessageSystemAttributeName::ApproximateReceiveCount)
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
    rm.enqueued_at = sys(MessageSystemAttributeName::SentTimestamp)
        .and_then(|t| t.parse::<i64>().ok())
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
    rm.received_at = received_at;
    rm.group_id = sys(MessageSystemAttributeName::MessageGroupId);
    rm
}
