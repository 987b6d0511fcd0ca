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

/// `text` with each character SQS refuses in a message body or a string attribute written as `\u{HEX}`.
/// Amazon SQS API Reference, SendMessage: "The following Unicode characters are allowed: #x9 | #xA | #xD |
/// #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF. Any characters not included in this list will be
/// rejected."; MessageAttributeValue: "For string data types, the Value attribute has the same restrictions on
/// the content as the message body." A dead letter's reason and detail carry text from outside (a handler's
/// error, a parser's message quoting the body): unescaped, one NUL in it would make SQS refuse the forward.
pub(crate) fn sqs_text(text: &str) -> std::borrow::Cow<'_, str> {
    fn allowed(c: char) -> bool {
        matches!(c, '\t' | '\n' | '\r')
            || ('\u{20}'..='\u{D7FF}').contains(&c)
            || ('\u{E000}'..='\u{FFFD}').contains(&c)
            || c >= '\u{10000}'
    }
    if text.chars().all(allowed) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if allowed(c) {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The attributes of a dead-letter copy: every original attribute (identity first, earlier dead-letter
/// bookkeeping dropped), then the reason and the detail ([`txinbox_core::dead_letter`]) as far as SQS's
/// 10-attribute limit allows. Identity attributes are never dropped for the reason.
pub(crate) fn dead_letter_attributes(
    raw: &HashMap<String, MessageAttributeValue>,
    why: &DeadLetter,
) -> Result<HashMap<String, MessageAttributeValue>, BrokerError> {
    let mut attrs = own_attributes(raw);
    if attrs.len() < MAX_MESSAGE_ATTRIBUTES && !why.reason.is_empty() {
        attrs.insert(REASON.into(), string_attribute(&sqs_text(&why.reason))?);
    } else {
        tracing::error!(reason = %why.reason, detail = %why.detail, "no room for the dead-letter reason attribute (10 attributes already); the reason is only in this log");
    }
    if attrs.len() < MAX_MESSAGE_ATTRIBUTES && !why.detail.is_empty() {
        attrs.insert(
            DETAIL.into(),
            string_attribute(dead_letter::truncate_detail(&sqs_text(&why.detail)))?,
        );
    }
    Ok(attrs)
}

/// Sends a copy of a received message to `dlq_url` with all its message attributes, its FIFO group and
/// deduplication id, and the reason. The caller deletes the original only after this returned `Ok`.
///
/// A copy SQS refuses ([`Rejected`](BrokerErrorKind::Rejected)) with the reason attributes is sent once more
/// with the message's own attributes only (the reason then only in the log): the message was accepted with
/// them, and the reason and detail (up to 1 KiB) are what the copy adds, so a message near its queue's
/// maximum size (AWS, `SendMessage`: "Message must be shorter than ... bytes"), or a dead-letter queue whose
/// `MaximumMessageSize` is smaller, would be refused at every try and come back once per visibility timeout,
/// its handler run again each time, forever when the queue has no `RedrivePolicy`.
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
    let own = own_attributes(raw);
    if attrs.len() == own.len() {
        return send_copy(client, dlq_url, body, attrs, msg, dedup_id).await;
    }
    match send_copy(client, dlq_url, body, attrs, msg, dedup_id).await {
        Err(e) if e.kind() == BrokerErrorKind::Rejected => {
            tracing::error!(error = %e, reason = %why.reason, detail = %why.detail, "the dead-letter queue refused the copy with its reason attributes; sending it with the message's own attributes only (the reason is only in this log)");
            send_copy(client, dlq_url, body, own, msg, dedup_id).await
        }
        r => r,
    }
}

/// A message's own attributes, without earlier dead-letter bookkeeping.
fn own_attributes(
    raw: &HashMap<String, MessageAttributeValue>,
) -> HashMap<String, MessageAttributeValue> {
    raw.iter()
        .filter(|(k, _)| !dead_letter::is_bookkeeping(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// One `SendMessage` of the copy with `attrs`, in the message's group and with its deduplication id on a FIFO
/// dead-letter queue.
async fn send_copy(
    client: &aws_sdk_sqs::Client,
    dlq_url: &str,
    body: &str,
    attrs: HashMap<String, MessageAttributeValue>,
    msg: &ReceivedMessage,
    dedup_id: Option<&str>,
) -> Result<(), BrokerError> {
    let mut send = client
        .send_message()
        .queue_url(dlq_url)
        .message_body(body)
        .set_message_attributes((!attrs.is_empty()).then_some(attrs));
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

    /// moto accepts any character in a string attribute; SQS does not (SendMessage: "The following Unicode
    /// characters are allowed: #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF. Any
    /// characters not included in this list will be rejected.", which MessageAttributeValue applies to string
    /// values). A detail quoting hostile text must still be forwarded: what SQS would refuse is escaped.
    #[test]
    fn a_detail_with_characters_sqs_refuses_is_escaped_and_the_rest_kept() {
        let allowed = |c: char| {
            matches!(c, '\t' | '\n' | '\r')
                || ('\u{20}'..='\u{D7FF}').contains(&c)
                || ('\u{E000}'..='\u{FFFD}').contains(&c)
                || c >= '\u{10000}'
        };
        let why = DeadLetter::new(
            "invalid_json",
            "bad \0 byte \u{1}\u{1f}\u{7f}\u{fffe}\u{ffff} kept: \t\n\r é \u{fffd} \u{10ffff}",
        );
        let a = dead_letter_attributes(&HashMap::new(), &why).unwrap();
        let detail = a[DETAIL].string_value().unwrap();
        assert!(detail.chars().all(allowed), "{detail:?}");
        assert_eq!(
            detail,
            "bad \\u{0} byte \\u{1}\\u{1f}\u{7f}\\u{fffe}\\u{ffff} kept: \t\n\r é \u{fffd} \u{10ffff}"
        );
        // A reason from outside (a handler's own) is escaped the same way.
        let why = DeadLetter::new("mine\0", "");
        let a = dead_letter_attributes(&HashMap::new(), &why).unwrap();
        assert_eq!(a[REASON].string_value(), Some("mine\\u{0}"));
        // A detail long with escapes is still cut to the limit, on a character boundary.
        let why = DeadLetter::new("r", "\0".repeat(2000));
        let a = dead_letter_attributes(&HashMap::new(), &why).unwrap();
        let detail = a[DETAIL].string_value().unwrap();
        assert!(detail.len() <= dead_letter::MAX_DETAIL_LEN && detail.starts_with("\\u{0}"));
    }
}
