//! The control API's view of a queue: [`QueueState`] and [`MessageView`].

use serde::Serialize;
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::{Clock, Message, Queue};
use crate::config::QueuePropertiesOutput;
use crate::wire::{self, PropertyValue};

/// The state of one queue, as `GET /$emulator/queues/{path}` reports it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct QueueState {
    /// The entity path as created.
    pub path: String,
    /// The queue's properties.
    pub properties: QueuePropertiesOutput,
    /// Messages in the queue, locked or not (not scheduled, not dead-lettered), as the service counts them.
    pub active_message_count: usize,
    /// Active messages that can be received now.
    pub available_message_count: usize,
    /// Active messages under a peek-lock.
    pub locked_message_count: usize,
    /// Messages waiting for their ScheduledEnqueueTimeUtc.
    pub scheduled_message_count: usize,
    /// Messages in `{path}/$DeadLetterQueue`.
    pub dead_letter_message_count: usize,
    /// The queue's messages in sequence-number order.
    pub messages: Vec<MessageView>,
    /// The dead-letter sub-queue's messages in sequence-number order.
    pub dead_letter_messages: Vec<MessageView>,
}

/// One message as the control API reports it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageView {
    /// SequenceNumber.
    pub sequence_number: i64,
    /// MessageId.
    pub message_id: String,
    /// `available`, `locked` or `scheduled`.
    pub state: &'static str,
    /// Times handed out so far (what the next delivery reports, minus one).
    pub delivery_count: u32,
    /// The body, as UTF-8 (lossy).
    pub body: String,
    /// Content-Type given by the sender.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// CorrelationId.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// SessionId.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// ReplyTo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// To.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// PartitionKey.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
    /// Effective TimeToLive in seconds; absent when the message never expires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_to_live_seconds: Option<f64>,
    /// EnqueuedTimeUtc (RFC 1123).
    pub enqueued_time_utc: String,
    /// When the message expires (RFC 1123), if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at_utc: Option<String>,
    /// ScheduledEnqueueTimeUtc, if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduled_enqueue_time_utc: Option<String>,
    /// The current lock token, if locked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_token: Option<String>,
    /// LockedUntilUtc (RFC 1123), if locked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked_until_utc: Option<String>,
    /// Application properties, including DeadLetterReason / DeadLetterErrorDescription.
    pub properties: Map<String, Value>,
    /// DeadLetterReason, for dead-lettered messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter_reason: Option<String>,
    /// DeadLetterErrorDescription, for dead-lettered messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter_error_description: Option<String>,
}

pub(super) fn queue_state(queue: &Queue, now: Instant, clock: &Clock) -> QueueState {
    let view = |m: &Message| {
        let property = |name: &str| {
            m.properties
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| match v {
                    PropertyValue::String(s) => Some(s.clone()),
                    _ => None,
                })
        };
        MessageView {
            sequence_number: m.sequence_number,
            message_id: m.message_id.clone(),
            state: if m.lock.is_some() {
                "locked"
            } else if m.visible_at > now {
                "scheduled"
            } else {
                "available"
            },
            delivery_count: m.delivery_count,
            body: String::from_utf8_lossy(&m.body).into_owned(),
            content_type: m.content_type.clone(),
            label: m.sender.label.clone(),
            correlation_id: m.sender.correlation_id.clone(),
            session_id: m.sender.session_id.clone(),
            reply_to: m.sender.reply_to.clone(),
            to: m.sender.to.clone(),
            partition_key: m.sender.partition_key.clone(),
            time_to_live_seconds: m.ttl.map(|d| d.as_secs_f64()),
            enqueued_time_utc: wire::format_http_date(clock.utc(m.enqueued_at)),
            expires_at_utc: m.expires_at().map(|t| wire::format_http_date(clock.utc(t))),
            scheduled_enqueue_time_utc: m
                .sender
                .scheduled_enqueue_time_utc
                .map(wire::format_http_date),
            lock_token: m.lock.as_ref().map(|l| l.token.to_string()),
            locked_until_utc: m
                .lock
                .as_ref()
                .map(|l| wire::format_http_date(clock.utc(l.until))),
            properties: m
                .properties
                .iter()
                .map(|(n, v)| (n.clone(), v.to_json()))
                .collect(),
            dead_letter_reason: property("DeadLetterReason"),
            dead_letter_error_description: property("DeadLetterErrorDescription"),
        }
    };
    let messages: Vec<MessageView> = queue.active.values().map(view).collect();
    let count = |state: &str| messages.iter().filter(|m| m.state == state).count();
    QueueState {
        path: queue.path.clone(),
        properties: queue.props.to_output(),
        active_message_count: count("available") + count("locked"),
        available_message_count: count("available"),
        locked_message_count: count("locked"),
        scheduled_message_count: count("scheduled"),
        dead_letter_message_count: queue.dead_letter.len(),
        dead_letter_messages: queue.dead_letter.values().map(view).collect(),
        messages,
    }
}
