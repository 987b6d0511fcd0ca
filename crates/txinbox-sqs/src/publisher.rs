//! Publishing with one identity: `MessageGroupId`, `MessageDeduplicationId` and the CloudEvents attributes are
//! all derived from the [`OutboxMessage`]'s `source` and `message_id`.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use txinbox_core::{BrokerError, BrokerErrorKind, OutboxMessage, Publisher};

use crate::dlq::{is_fifo, string_attribute, MAX_MESSAGE_ATTRIBUTES};
use crate::error::{sdk_error, SqsError};

/// The `MessageDeduplicationId` of a message: the hex SHA-256 of `source`, a NUL byte and `message_id`.
/// Always valid for SQS (64 characters from its allowed set), and two sources that happen to use the same id
/// within 5 minutes do not swallow each other's messages.
pub fn deduplication_id(source: &str, message_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update([0u8]);
    h.update(message_id.as_bytes());
    hex::encode(h.finalize())
}

/// Whether SQS takes `id` as a `MessageGroupId`. AWS (`SendMessage`, `MessageGroupId`): "The length of
/// MessageGroupId is 128 characters. Valid values: alphanumeric characters and punctuation", the punctuation
/// listed being ASCII's 32 characters (`u8::is_ascii_punctuation`).
fn valid_group_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b.is_ascii_punctuation())
}

/// The FIFO group of a message published without one: its `message_id` when SQS takes it as a group, else
/// its [`deduplication_id`] (64 hex characters, always taken). Either way a group of its own.
fn own_group(source: &str, message_id: &str) -> String {
    if valid_group_id(message_id) {
        message_id.to_owned()
    } else {
        deduplication_id(source, message_id)
    }
}

/// Publishes [`OutboxMessage`]s to SQS. A message goes to its `destination` (a queue URL), or to the default
/// queue when the destination is empty.
///
/// On a FIFO queue the group is the message's `group_id` or, when it has none, a group of its own (no ordering
/// constraint): its `message_id`, or [`deduplication_id`] when the id is not a group SQS takes (over 128
/// characters, or a character other than ASCII letters, digits and punctuation); the deduplication id is
/// [`deduplication_id`]. The CloudEvents binary-mode attributes
/// (`ce-specversion`, `ce-id`, `ce-source`, `ce-type`) and the message's own attributes are message
/// attributes, so the consumer's inbox resolves the same identity after any retry, dead-letter or redrive.
#[derive(Clone, Debug)]
pub struct SqsPublisher {
    client: aws_sdk_sqs::Client,
    default_queue: Option<String>,
}

impl SqsPublisher {
    /// A publisher with no default queue.
    pub fn new(client: aws_sdk_sqs::Client) -> Self {
        Self {
            client,
            default_queue: None,
        }
    }

    /// Sends messages with an empty `destination` to `queue_url`.
    pub fn default_queue(mut self, queue_url: impl Into<String>) -> Self {
        self.default_queue = Some(queue_url.into());
        self
    }

    /// Sends one message; returns the SQS `MessageId`.
    ///
    /// A message SQS cannot take (no destination, a body that is not UTF-8, too many attributes) is a
    /// [`Rejected`](BrokerErrorKind::Rejected) error whose source is the [`SqsError`].
    pub async fn send(&self, msg: &OutboxMessage) -> Result<String, BrokerError> {
        let invalid = |detail: String| {
            SqsError::InvalidOptions { detail }.broker(BrokerErrorKind::Rejected, "SendMessage")
        };
        let url = if msg.destination.is_empty() {
            self.default_queue.as_deref().ok_or_else(|| {
                invalid("the message has no destination and the publisher no default queue".into())
            })?
        } else {
            msg.destination.as_str()
        };
        let body = std::str::from_utf8(&msg.body)
            .map_err(|e| invalid(format!("SQS bodies are text; this body is not UTF-8: {e}")))?;
        let mut attrs = HashMap::new();
        for (k, v) in msg.wire_attributes() {
            // SQS refuses empty attribute values; an absent attribute means the same to the consumer.
            if !v.is_empty() {
                attrs.insert(k, string_attribute(&v)?);
            }
        }
        if attrs.len() > MAX_MESSAGE_ATTRIBUTES {
            return Err(invalid(format!(
                "{} message attributes, SQS accepts at most {MAX_MESSAGE_ATTRIBUTES}",
                attrs.len()
            )));
        }
        let mut send = self
            .client
            .send_message()
            .queue_url(url)
            .message_body(body)
            .set_message_attributes(Some(attrs));
        if is_fifo(url) {
            send = send
                .message_group_id(
                    msg.group_id
                        .clone()
                        .unwrap_or_else(|| own_group(&msg.source, &msg.message_id)),
                )
                .message_deduplication_id(deduplication_id(&msg.source, &msg.message_id));
        }
        let out = send.send().await.map_err(|e| sdk_error("SendMessage", e))?;
        Ok(out.message_id().unwrap_or_default().to_owned())
    }
}

impl Publisher for SqsPublisher {
    async fn publish(&self, msg: &OutboxMessage) -> Result<(), BrokerError> {
        self.send(msg).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deduplication_id_is_stable_valid_and_source_scoped() {
        let a = deduplication_id("crm", "evt-1");
        assert_eq!(a, deduplication_id("crm", "evt-1"));
        assert_ne!(a, deduplication_id("billing", "evt-1"));
        assert_ne!(deduplication_id("a", "bc"), deduplication_id("ab", "c"));
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
