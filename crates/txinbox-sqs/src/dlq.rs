//! Explicit forwards to the dead-letter queue.

use std::collections::HashMap;

use aws_sdk_sqs::types::MessageAttributeValue;
use txinbox_core::dead_letter::{self, DETAIL, REASON};
use txinbox_core::{BrokerError, BrokerErrorKind, DeadLetter, ReceivedMessage};

use crate::error::sdk_error;

/// SQS accepts at most this many message attributes per message.
pub const MAX_MESSAGE_ATTRIBUTES: usize = 10;

/// Whether a queue URL names a FIFO queue.
pub fn is_fifo(queue_url: &str) -> bool {
    queue_url.ends_with(".fifo")
}

pub(crate) fn string_attribute(value: &str) -> Result<MessageAttributeValue, BrokerError> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .map_err(|e| BrokerError::new(BrokerErrorKind::Configuration, "SendMessage", e))
}

/// The attributes of a dead-letter copy: every original attribute (identity first, earlier dead-letter
/// bookkeeping dropped), then the reason and the detail ([`txinbox_core::dead_letter`]) as far as SQS's
/// 10-attribute limit allows. Identity attributes are never dropped for the reason.
pub(crate) fn dead_letter_attributes(
    raw: &HashMap<String, MessageAttributeValue>,
    why: &DeadLetter,
) -> Result<HashMap<String, MessageAttributeValue>, BrokerError> {
    let mut attrs: HashMap<String, MessageAttributeValue> = raw
        .iter()
        .filter(|(k, _)| !dead_letter::is_bookkeeping(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if attrs.len() < MAX_MESSAGE_ATTRIBUTES && !why.reason.is_empty() {
        attrs.insert(REASON.into(), string_attribute(&why.reason)?);
    } else {
        tracing::error!(reason = %why.reason, detail = %why.detail, "no room for the dead-letter reason attribute (10 attributes already); the reason is only in this log");
    }
    if attrs.len() < MAX_MESSAGE_ATTRIBUTES && !why.detail.is_empty() {
        attrs.insert(
            DETAIL.into(),
            string_attribute(dead_letter::truncate_detail(&why.detail))?,
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
    dedup_id: Option<&str>,
    why: &DeadLetter,
) -> Result<(), BrokerError> {
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
        let dedup = dedup_id
            .map(str::to_owned)
            .or_else(|| msg.broker_id.as_ref().map(|id| format!("dlq-{id}")))
            .ok_or_else(|| {
                BrokerError::new(
                    BrokerErrorKind::Protocol,
                    "SendMessage",
                    "cannot dead-letter: the message has neither a deduplication id nor a message id",
                )
            })?;
        send = send.message_group_id(group).message_deduplication_id(dedup);
    }
    send.send().await.map_err(|e| sdk_error("SendMessage", e))?;
    Ok(())
}

/// The URL of the dead-letter queue named by a `RedrivePolicy` attribute, if any.
pub(crate) async fn queue_url_of_redrive_policy(
    client: &aws_sdk_sqs::Client,
    policy: &str,
) -> Result<Option<String>, BrokerError> {
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
        .map_err(|e| sdk_error("GetQueueUrl", e))?;
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
        assert_eq!(a[REASON].string_value(), Some("payload_collision"));
        assert!(!a.contains_key(DETAIL));

        let raw: HashMap<_, _> = [("ce-id".to_string(), string_attribute("e1").unwrap())].into();
        let a = dead_letter_attributes(&raw, &why).unwrap();
        assert_eq!(a.len(), 3);
        let detail = a[DETAIL].string_value().unwrap();
        assert!(detail.len() <= dead_letter::MAX_DETAIL_LEN && detail.starts_with('é'));
    }
}
