//! Building what a receive hands to the HTTP layer: body, `BrokerProperties` and custom properties.

use std::time::Duration;

use serde_json::{Map, Value};

use super::{Clock, Delivery, Lock, Message};
use crate::wire;

/// Builds the receive response parts. BrokerProperties always carries every field the crate
/// requires (DeliveryCount, LockToken and LockedUntilUtc on peek-lock, MessageId, SequenceNumber,
/// State, TimeToLive) plus EnqueuedTimeUtc and EnqueuedSequenceNumber 0, like [doc PEEK]'s example;
/// receive-and-delete leaves out LockToken and LockedUntilUtc [doc RAD]. Dates are RFC 1123 `GMT`
/// and TimeToLive is seconds [doc PROPS]; numbers stay within the crate's i32/i64.
pub(super) fn delivery(
    message: &Message,
    lock: Option<&Lock>,
    location_path: &str,
    clock: &Clock,
) -> Delivery {
    let mut props = Map::new();
    let count = i32::try_from(message.delivery_count).unwrap_or(i32::MAX);
    props.insert("DeliveryCount".into(), Value::from(count));
    props.insert("EnqueuedSequenceNumber".into(), Value::from(0));
    props.insert(
        "EnqueuedTimeUtc".into(),
        Value::from(wire::format_http_date(clock.utc(message.enqueued_at))),
    );
    if let Some(lock) = lock {
        props.insert("LockToken".into(), Value::from(lock.token.to_string()));
        props.insert(
            "LockedUntilUtc".into(),
            Value::from(wire::format_http_date(clock.utc(lock.until))),
        );
    }
    props.insert("MessageId".into(), Value::from(message.message_id.clone()));
    props.insert(
        "SequenceNumber".into(),
        Value::from(message.sequence_number),
    );
    props.insert("State".into(), Value::from("Active"));
    props.insert("TimeToLive".into(), Value::from(ttl_seconds(message.ttl)));
    // The other settable properties come back when they were set [doc PROPS, "Req, Res"].
    let s = &message.sender;
    for (name, value) in [
        ("Label", &s.label),
        ("CorrelationId", &s.correlation_id),
        ("SessionId", &s.session_id),
        ("ReplyTo", &s.reply_to),
        ("To", &s.to),
        ("ReplyToSessionId", &s.reply_to_session_id),
        ("PartitionKey", &s.partition_key),
    ] {
        if let Some(value) = value {
            props.insert(name.into(), Value::from(value.clone()));
        }
    }
    if let Some(t) = s.scheduled_enqueue_time_utc {
        props.insert(
            "ScheduledEnqueueTimeUtc".into(),
            Value::from(wire::format_http_date(t)),
        );
    }
    Delivery {
        body: message.body.clone(),
        content_type: message.content_type.clone(),
        broker_properties: wire::ascii_json(&Value::Object(props)),
        // Custom properties come back as headers, strings quoted [doc PEEK, RAD].
        properties: message
            .properties
            .iter()
            .map(|(name, value)| (name.clone(), value.to_header()))
            .collect(),
        // The lock URI names the sequence number and the lock token [doc PEEK].
        lock_path: lock.map(|l| {
            format!(
                "/{location_path}/messages/{}/{}",
                message.sequence_number, l.token
            )
        }),
    }
}

fn ttl_seconds(ttl: Option<Duration>) -> f64 {
    ttl.map_or(wire::TIME_SPAN_MAX_SECONDS, |d| d.as_secs_f64())
}
