//! The broker-neutral view of a received message.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

/// A message as the adapters hand it to the inbox: the body, its attributes and the broker's metadata.
///
/// Attribute names are lower-case (Service Bus lower-cases custom property names on the wire; the SQS adapter
/// lower-cases to match), so look them up with [`ReceivedMessage::attribute`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReceivedMessage {
    /// The raw body.
    pub body: Vec<u8>,
    /// Message attributes / custom properties, names lower-case.
    pub attributes: BTreeMap<String, String>,
    /// The producer-set broker id (SQS FIFO `MessageDeduplicationId`, Service Bus `MessageId`).
    pub producer_id: Option<String>,
    /// The broker-assigned id (SQS `MessageId`, Service Bus sequence number).
    pub broker_id: Option<String>,
    /// How many times the broker has handed this message out, this delivery included (1 = first).
    pub delivery_count: u32,
    /// When the broker first accepted the message, if it says.
    pub enqueued_at: Option<DateTime<Utc>>,
    /// When this delivery was received by the adapter.
    pub received_at: DateTime<Utc>,
    /// FIFO group (SQS `MessageGroupId`, Service Bus `SessionId`).
    pub group_id: Option<String>,
}

impl ReceivedMessage {
    /// A message with `body`, received now, delivery count 1 and nothing else set.
    pub fn new(body: Vec<u8>) -> Self {
        Self {
            body,
            attributes: BTreeMap::new(),
            producer_id: None,
            broker_id: None,
            delivery_count: 1,
            enqueued_at: None,
            received_at: Utc::now(),
            group_id: None,
        }
    }

    /// Looks an attribute up by its lower-case name.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).map(String::as_str)
    }

    /// The body as UTF-8 text, if it is.
    pub fn body_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }
}
