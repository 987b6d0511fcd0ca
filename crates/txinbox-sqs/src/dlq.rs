//! Explicit forwards to the dead-letter queue.

use std::collections::HashMap;

use aws_sdk_sqs::types::MessageAttributeValue;
use txinbox_core::{DeadLetter, ReceivedMessage};

use crate::error::SqsError;

/// Message attribute carrying the dead-letter reason code on forwarded dead letters.
pub const REASON_ATTRIBUTE: &str = "txinbox-dlq-reason";
/// Message attribute carrying the dead-letter detail on forwarded dead letters.
pub const DETAIL_ATTRIBUTE: &str = "txinbox-dlq-detail";
/// SQS accepts at most this many message attributes per message.
pub const MAX_MESSAGE_ATTRIBUTES: usize = 10;
/// Longest detail written to [`DETAIL_ATTRIBUTE`] (bytes).
pub const MAX_DETAIL_LEN: usize = 1024;

/// Whether a queue URL names a FIFO queue.
pub fn is_fifo(queue_url: &str) -> bool {
    queue_url.ends_with(".fifo")
}

pub(crate) fn string_attribute(value: &str) -> Result<MessageAttributeValue, SqsError> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .map_err(|e| SqsError::DeadLetter {
            detail: format!("cannot build a message attribute: {e}"),
        })
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The attributes of a dead-letter copy: every original attribute (identity first), then the reason and the
/// detail as far as SQS's 10-attribute limit allows. Identity attributes are never dropped for the reason.
pub(crate) fn dead_letter_attributes(
    raw: &HashMap<String, MessageAttributeValue>,
    why: &DeadLetter,
) -> Result<HashMap<String, MessageAttributeValue>, SqsError> {
    let mut attrs: HashMap<String, MessageAttributeValue> = raw
        .iter()
        .filter(|(k, _)| {
            !k.eq_ignore_ascii_case(REASON_ATTRIBUTE) && !k.eq_ignore_ascii_case(DETAIL_ATTRIBUTE)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if attrs.len() < MAX_MESSAGE_ATTRIBUTES && !why.reason.is_empty() {
        attrs.insert(REASON_ATTRIBUTE.into(), string_attribute(&why.reason)?);
    } else {
        tracing::error!(reason = %why.reason, detail = %why.detail, "no room for the dead-letter reason attribute (10 attributes already); the reason is only in this log");
    }
    if attrs.len() < MAX_MESSAGE_ATTRIBUTES && !why.detail.is_empty() {
        attrs.insert(
            DETAIL_ATTRIBUTE.into(),
            string_attribute(truncate(&why.detail, MAX_DETAIL_LEN))?,
        );
    }
    Ok(attrs)
}

/// Sends a copy of a received message to `dlq_url` with all its message attributes, its FIFO group and
/// deduplication id, and the reason. The caller deletes the original only after this returned `Ok`.
pub(crate) async fn forward(
    client: &aws_sdk_sqs::Client,
    dlq_url: &str,
    body: &str,
    raw: &HashMap<String, MessageAttributeValue>,
    msg: &ReceivedMessage,
    why: &DeadLetter,
) -> Result<(), SqsError> {
    let attrs = dead_letter_attributes(raw, why)?;
    let mut send = client
        .send_message()
        .queue_url(dlq_url)
        .message_body(body)
        .set_message_attributes(Some(attrs));
    if is_fifo(dlq_url) {
        // Same group and deduplication id as the original: a forward retried after a failed delete is
        // dropped by the DLQ's deduplication instead of making a second copy. A redrive inside the 5-minute
        // window gives the message a new deduplication id (see `redrive`), so a second failure is not lost.
        let group = msg.group_id.clone().unwrap_or_else(|| "txinbox-dlq".into());
        let dedup = msg
            .producer_id
            .clone()
            .or_else(|| msg.broker_id.as_ref().map(|id| format!("dlq-{id}")))
            .ok_or(SqsError::DeadLetter {
                detail: "the message has neither a deduplication id nor a message id".into(),
            })?;
        send = send.message_group_id(group).message_deduplication_id(dedup);
    }
    send.send()
        .await
        .map_err(|e| SqsError::from_sdk("SendMessage", e))?;
    Ok(())
}

/// The URL of the dead-letter queue named by a `RedrivePolicy` attribute, if any.
pub(crate) async fn queue_url_of_redrive_policy(
    client: &aws_sdk_sqs::Client,
    policy: &str,
) -> Result<Option<String>, SqsError> {
    let Some(arn) = serde_json::from_str::<serde_json::Value>(policy)
        .ok()
        .and_then(|v| v.get("deadLetterTargetArn")?.as_str().map(str::to_owned))
    else {
        return Ok(None);
    };
    // arn:aws:sqs:<region>:<account>:<name>
    let parts: Vec<&str> = arn.split(':').collect();
    let (Some(account), Some(name)) = (parts.get(4), parts.get(5)) else {
        return Ok(None);
    };
    let out = client
        .get_queue_url()
        .queue_name(*name)
        .queue_owner_aws_account_id(*account)
        .send()
        .await
        .map_err(|e| SqsError::from_sdk("GetQueueUrl", e))?;
    Ok(out.queue_url().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_is_added_without_dropping_identity() {
        let mut raw = HashMap::new();
        for i in 0..9 {
            raw.insert(format!("ce-x{i}"), string_attribute("v").unwrap());
        }
        let why = DeadLetter::new("payload_collision", "é".repeat(2000));
        let a = dead_letter_attributes(&raw, &why).unwrap();
        assert_eq!(a.len(), 10);
        assert_eq!(
            a[REASON_ATTRIBUTE].string_value(),
            Some("payload_collision")
        );
        assert!(!a.contains_key(DETAIL_ATTRIBUTE));

        let raw: HashMap<_, _> = [("ce-id".to_string(), string_attribute("e1").unwrap())].into();
        let a = dead_letter_attributes(&raw, &why).unwrap();
        assert_eq!(a.len(), 3);
        let detail = a[DETAIL_ATTRIBUTE].string_value().unwrap();
        assert!(detail.len() <= MAX_DETAIL_LEN && detail.starts_with('é'));
    }
}
