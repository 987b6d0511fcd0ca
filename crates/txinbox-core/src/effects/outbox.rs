//! Outbox: messages to publish, written in the same transaction as the inbox marker and the business change,
//! as effects ([`OutboxMessage::into_effect`]), and published after COMMIT by the effect runner through a
//! [`PublishEffect`].

use std::collections::BTreeMap;
use std::future::Future;

use futures::future::BoxFuture;

use crate::effects::{ClaimedEffect, Confirmation, Effect, EffectExecutor, Execution};
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
        use crate::pipeline::identity::ce;
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

impl Publisher for crate::broker::mem::MemoryQueue {
    async fn publish(&self, msg: &OutboxMessage) -> Result<(), BrokerError> {
        let mut out =
            crate::broker::mem::OutgoingMessage::new(msg.body.clone()).producer_id(&msg.message_id);
        out.attributes = msg.wire_attributes();
        out.group_id = msg.group_id.clone();
        self.send(out);
        Ok(())
    }
}

/// The metadata keys of a publish effect.
mod meta {
    pub const SOURCE: &str = "source";
    pub const MESSAGE_ID: &str = "message_id";
    pub const EVENT_TYPE: &str = "event_type";
    pub const GROUP_ID: &str = "group_id";
    pub const ATTRIBUTE: &str = "attr.";
}

impl OutboxMessage {
    /// This message as an effect for its destination: published after COMMIT by a [`PublishEffect`]
    /// registered under the destination's name. The effect's name is `publish:<message id>`, so its
    /// idempotency key follows the consuming message and this message's id.
    pub fn into_effect(self) -> Effect {
        let mut e = Effect::new(
            format!("publish:{}", self.message_id),
            self.destination,
            self.body,
        )
        .metadata(meta::SOURCE, self.source)
        .metadata(meta::MESSAGE_ID, self.message_id.clone())
        .metadata(meta::EVENT_TYPE, self.event_type)
        .external_ref(self.message_id);
        if let Some(g) = self.group_id {
            e = e.metadata(meta::GROUP_ID, g);
        }
        for (k, v) in self.attributes {
            e = e.metadata(format!("{}{k}", meta::ATTRIBUTE), v);
        }
        e
    }

    /// The message a publish effect carries.
    pub fn from_effect(e: &ClaimedEffect) -> Self {
        let get = |k: &str| e.metadata.get(k).cloned().unwrap_or_default();
        Self {
            destination: e.destination.clone(),
            source: get(meta::SOURCE),
            message_id: get(meta::MESSAGE_ID),
            event_type: get(meta::EVENT_TYPE),
            group_id: e.metadata.get(meta::GROUP_ID).cloned(),
            body: e.payload.clone(),
            attributes: e
                .metadata
                .iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix(meta::ATTRIBUTE)
                        .map(|k| (k.to_owned(), v.clone()))
                })
                .collect(),
        }
    }
}

/// Publishes the messages handlers recorded with [`crate::Handled::publish`]: the effect executor of a broker
/// destination.
///
/// A publish is idempotent by its message id: the broker deduplicates it (SQS FIFO's deduplication id, Service
/// Bus's MessageId) and the consumer's own inbox absorbs a copy past the broker's window. So an uncertain publish
/// is reconciled by publishing again with the same id: the confirmation answers [`Confirmation::Repeat`], and the
/// executor sends again.
#[derive(Clone, Debug)]
pub struct PublishEffect<P>(pub P);

impl<P: Publisher + 'static> EffectExecutor for PublishEffect<P> {
    fn execute<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        Box::pin(async move {
            let msg = OutboxMessage::from_effect(effect);
            match self.0.publish(&msg).await {
                Ok(()) => Execution::Done {
                    reference: Some(msg.message_id),
                },
                // No answer, the broker's own failure (a 5xx: "the request may have been processed"), or an
                // answer that could not be read (the request reached the broker): the message may be on the
                // queue, so the effect is never failed for it.
                Err(e)
                    if matches!(
                        e.kind(),
                        crate::BrokerErrorKind::OutcomeUnknown
                            | crate::BrokerErrorKind::ServerError
                            | crate::BrokerErrorKind::Protocol
                    ) =>
                {
                    Execution::Uncertain { error: e.into() }
                }
                // Throttled: refused, nothing sent; again no sooner than the broker asked.
                Err(e) if e.is_retryable() => Execution::NotSent {
                    retry_after: e.retry_after(),
                    error: e.into(),
                },
                Err(e) => Execution::Rejected { error: e.into() },
            }
        })
    }

    fn confirm<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
        Box::pin(async { Confirmation::Repeat })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::effects::EffectState;
    use crate::BrokerErrorKind;

    /// A broker that fails every publish with `kind` (and `Retry-After` 7 s).
    struct Fails(BrokerErrorKind);

    impl Publisher for Fails {
        async fn publish(&self, _: &OutboxMessage) -> Result<(), BrokerError> {
            Err(
                BrokerError::new(self.0, "SendMessage", std::io::Error::other("failed"))
                    .with_retry_after(Some(Duration::from_secs(7))),
            )
        }
    }

    fn effect() -> ClaimedEffect {
        ClaimedEffect {
            id: 1,
            consumer: "c".into(),
            message_id: "m".into(),
            key: "k".into(),
            name: "publish:out-1".into(),
            destination: "events".into(),
            payload: b"{}".to_vec(),
            metadata: [("message_id".to_owned(), "out-1".to_owned())].into(),
            external_ref: "out-1".into(),
            claimed_from: EffectState::Pending,
            attempts: 0,
            reconciliations: 0,
            created_at: chrono::Utc::now(),
            reference: None,
            maybe_happened: false,
            sent_hash: None,
        }
    }

    // A broker's 5xx on a send (SQS's InternalError, Service Bus's 500) may have enqueued the message: read as
    // not sent, ten of them marked the effect failed with the message possibly published. A throttled send was
    // retried at the runner's backoff, sooner than the broker asked.
    #[tokio::test]
    async fn a_publish_the_broker_may_have_taken_is_uncertain_and_a_throttled_one_waits() {
        let e = effect();
        for kind in [
            BrokerErrorKind::ServerError,
            BrokerErrorKind::OutcomeUnknown,
        ] {
            let r = PublishEffect(Fails(kind)).execute(&e).await;
            assert!(matches!(r, Execution::Uncertain { .. }), "{kind:?}: {r:?}");
        }
        match PublishEffect(Fails(BrokerErrorKind::Throttled))
            .execute(&e)
            .await
        {
            Execution::NotSent { retry_after, .. } => {
                assert_eq!(retry_after, Some(Duration::from_secs(7)))
            }
            other => panic!("{other:?}"),
        }
        let r = PublishEffect(Fails(BrokerErrorKind::Unauthorized))
            .execute(&e)
            .await;
        assert!(matches!(r, Execution::Rejected { .. }), "{r:?}");
    }

    // A broker answer the publisher could not read (`BrokerErrorKind::Protocol`: "The broker's answer could not
    // be understood (... an unreadable body)") answers a request that reached the broker, which may have enqueued
    // the message: read as a refusal, the effect was failed with the message possibly published.
    #[tokio::test]
    async fn a_publish_whose_answer_could_not_be_read_is_uncertain() {
        let r = PublishEffect(Fails(BrokerErrorKind::Protocol))
            .execute(&effect())
            .await;
        assert!(matches!(r, Execution::Uncertain { .. }), "{r:?}");
    }
}
