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

/// An outbox row waiting to be relayed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PendingOutbox {
    /// Row id.
    pub id: i64,
    /// The message.
    pub message: OutboxMessage,
    /// Relay attempts so far.
    pub attempts: i32,
}

impl PendingOutbox {
    /// A row as a store reads it.
    pub fn new(id: i64, message: OutboxMessage, attempts: i32) -> Self {
        Self {
            id,
            message,
            attempts,
        }
    }
}

/// Where outbox rows wait: what the relay needs from a store.
pub trait OutboxStore: Send + Sync {
    /// The driver's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Up to `limit` rows not yet relayed, oldest first.
    fn pending_outbox(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<PendingOutbox>, Self::Error>> + Send;

    /// Marks a row relayed (`error` is `None`) or records a failed attempt.
    fn finish_outbox(
        &self,
        id: i64,
        now: chrono::DateTime<chrono::Utc>,
        error: Option<&str>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// What one relay pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Rows published and marked relayed.
    pub relayed: u64,
    /// Rows whose publish failed (left pending, attempt recorded).
    pub failed: u64,
}

impl RelayReport {
    /// A report of `relayed` and `failed` rows.
    pub fn new(relayed: u64, failed: u64) -> Self {
        Self { relayed, failed }
    }
}

/// Publishes up to `limit` pending outbox rows with `publisher`, oldest first. A row is marked relayed only
/// after its publish succeeded; a crash in between republishes it, which the consumer's inbox absorbs since
/// the message id is stable.
pub async fn relay<S: OutboxStore, P: Publisher>(
    store: &S,
    publisher: &P,
    limit: i64,
) -> Result<RelayReport, S::Error> {
    let mut report = RelayReport::default();
    for row in store.pending_outbox(limit).await? {
        match publisher.publish(&row.message).await {
            Ok(()) => {
                store
                    .finish_outbox(row.id, chrono::Utc::now(), None)
                    .await?;
                report.relayed += 1;
                metrics::counter!(crate::metrics::OUTBOX_RELAYED, "consumer" => row.message.source.clone()).increment(1);
            }
            Err(e) => {
                tracing::warn!(id = row.id, attempts = row.attempts + 1, error = %e, "outbox publish failed; will retry");
                store
                    .finish_outbox(row.id, chrono::Utc::now(), Some(&e.to_string()))
                    .await?;
                report.failed += 1;
            }
        }
    }
    Ok(report)
}
