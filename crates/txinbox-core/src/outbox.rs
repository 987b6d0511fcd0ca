//! Outbox: messages to publish, written in the same transaction as the inbox marker and the business change,
//! and relayed to a broker after COMMIT by the store's relay.

use std::collections::BTreeMap;
use std::future::Future;

use crate::error::BrokerError;

/// One message to publish. Its `message_id` becomes the identity the consumer's inbox sees (CloudEvents `id`
/// with `source`, SQS `MessageDeduplicationId`, Service Bus `MessageId`), so a republish is recognised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    /// Where to publish (a queue URL or name the publisher understands).
    pub destination: String,
    /// CloudEvents `source`.
    pub source: String,
    /// The message id, stable across republishing.
    pub message_id: String,
    /// CloudEvents `type`.
    pub event_type: String,
    /// FIFO group.
    pub group_id: Option<String>,
    /// Body (JSON by convention).
    pub body: Vec<u8>,
    /// Extra attributes.
    pub attributes: BTreeMap<String, String>,
}

impl OutboxMessage {
    /// The CloudEvents binary-mode attributes (plus `attributes`) a publisher should put on the message.
    pub fn wire_attributes(&self) -> BTreeMap<String, String> {
        use crate::identity::ce;
        let mut a = self.attributes.clone();
        a.insert(ce::SPECVERSION.into(), "1.0".into());
        a.insert(ce::ID.into(), self.message_id.clone());
        a.insert(ce::SOURCE.into(), self.source.clone());
        a.insert(ce::TYPE.into(), self.event_type.clone());
        a
    }
}

/// Publishes outbox messages to a broker. Publishing the same message twice must be harmless downstream:
/// the identity is the consumer's inbox key.
pub trait Publisher: Send + Sync {
    /// Publish one message.
    fn publish(&self, msg: &OutboxMessage) -> impl Future<Output = Result<(), BrokerError>> + Send;
}

impl Publisher for crate::mem::MemoryQueue {
    async fn publish(&self, msg: &OutboxMessage) -> Result<(), BrokerError> {
        let mut out =
            crate::mem::OutgoingMessage::new(msg.body.clone()).producer_id(&msg.message_id);
        out.attributes = msg.wire_attributes();
        out.group_id = msg.group_id.clone();
        self.send(out);
        Ok(())
    }
}
