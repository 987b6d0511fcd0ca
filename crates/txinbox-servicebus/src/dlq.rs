//! Dead letters.
//!
//! Service Bus REST cannot dead-letter explicitly. The adapter therefore offers two strategies
//! ([`DeadLetterStrategy`](crate::DeadLetterStrategy)):
//!
//! * **Forward** (recommended): a copy goes to a configured application queue, then the original is completed.
//!   The copy keeps the MessageId, body, content type, Label/CorrelationId/SessionId/ReplyTo/To/PartitionKey,
//!   and every custom property as received (CloudEvents `ce-*` included, so the identity survives), and adds:
//!
//!   | property | value |
//!   |---|---|
//!   | [`dead_letter::REASON`] `txinbox-dlq-reason` | the inbox's reason code (`payload_collision`, `handler_permanent`, `no_identity`, ...) |
//!   | [`dead_letter::DETAIL`] `txinbox-dlq-detail` | human-readable detail (at most [`dead_letter::MAX_DETAIL_LEN`] = 1 KiB, control characters as spaces) |
//!   | [`SOURCE_PROPERTY`] `txinbox-dlq-source` | the queue the message came from |
//!   | [`SEQUENCE_PROPERTY`] `txinbox-dlq-sequence-number` | its SequenceNumber there |
//!   | [`DELIVERY_COUNT_PROPERTY`] `txinbox-dlq-delivery-count` | its DeliveryCount when forwarded |
//!   | [`ENQUEUED_AT_PROPERTY`] `txinbox-dlq-enqueued-at` | its original EnqueuedTimeUtc (RFC 3339), used by the redrive's duplicate-detection check |
//!   | [`FORWARDED_AT_PROPERTY`] `txinbox-dlq-forwarded-at` | when it was forwarded (RFC 3339) |
//!
//! * **Abandon until MaxDeliveryCount**: the broker moves the message to `{queue}/$DeadLetterQueue` with
//!   `DeadLetterReason: MaxDeliveryCountExceeded`.
//!
//! Either way the messages can be read with [`read_dead_letters`] and moved back with [`crate::redrive()`].

use std::collections::HashMap;
use std::time::Duration;

use azure_messaging_servicebus::prelude::QueueClient;
use azure_messaging_servicebus::service_bus::{SendMessageOptions, SettableBrokerProperties};
use chrono::{SecondsFormat, Utc};
use txinbox_core::dead_letter::{self, MAX_DETAIL_LEN};
use txinbox_core::{BrokerError, BrokerErrorKind, DeadLetter, ReceivedMessage};

use crate::config::ServiceBusClient;
use crate::error::send_error;
use crate::receiver::{peek_lock, settle, Locked, SettleOp};
use crate::wire::{self, quote_property};

/// Custom property with the source queue.
pub const SOURCE_PROPERTY: &str = "txinbox-dlq-source";
/// Custom property with the source SequenceNumber.
pub const SEQUENCE_PROPERTY: &str = "txinbox-dlq-sequence-number";
/// Custom property with the DeliveryCount when forwarded.
pub const DELIVERY_COUNT_PROPERTY: &str = "txinbox-dlq-delivery-count";
/// Custom property with the original EnqueuedTimeUtc (RFC 3339).
pub const ENQUEUED_AT_PROPERTY: &str = "txinbox-dlq-enqueued-at";
/// Custom property with the forwarding time (RFC 3339).
pub const FORWARDED_AT_PROPERTY: &str = "txinbox-dlq-forwarded-at";
/// The broker's dead-letter reason (an application property on `$DeadLetterQueue` messages).
pub const BROKER_REASON_PROPERTY: &str = "deadletterreason";
/// The broker's dead-letter description.
pub const BROKER_DESCRIPTION_PROPERTY: &str = "deadlettererrordescription";

/// The send options that re-send a locked message: MessageId and system properties intact, custom properties
/// as received (typed values keep their wire form), minus `drop(name)`, plus `extra`.
pub(crate) fn resend_options(
    locked: &Locked,
    drop: impl Fn(&str) -> bool,
    extra: impl IntoIterator<Item = (String, String)>,
) -> SendMessageOptions {
    let p = &locked.props;
    let mut custom: HashMap<String, String> = locked
        .raw_properties()
        .into_iter()
        .filter(|(k, _)| !drop(k))
        .collect();
    custom.extend(extra);
    SendMessageOptions {
        content_type: locked.content_type(),
        broker_properties: Some(SettableBrokerProperties {
            message_id: p.message_id.clone(),
            correlation_id: p.correlation_id.clone(),
            session_id: p.session_id.clone(),
            label: p.label.clone(),
            reply_to: p.reply_to.clone(),
            to: p.to.clone(),
            reply_to_session_id: p.reply_to_session_id.clone(),
            partition_key: p.partition_key.clone(),
            ..SettableBrokerProperties::default()
        }),
        custom_properties: Some(custom),
    }
}

/// Sends dead letters to an application queue.
pub(crate) struct Forwarder {
    client: QueueClient,
    source: String,
    destination: String,
}

impl Forwarder {
    pub(crate) fn new(client: &ServiceBusClient, source: &str, destination: &str) -> Self {
        let destination = destination.trim_matches('/').to_owned();
        Self {
            client: client.queue_client(&destination),
            source: source.to_owned(),
            destination,
        }
    }

    /// Sends the copy (complete is the caller's, after this succeeded).
    pub(crate) async fn forward(
        &self,
        locked: &Locked,
        why: &DeadLetter,
    ) -> Result<(), BrokerError> {
        let now = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
        let m = &locked.message;
        let mut extra = vec![
            (
                dead_letter::REASON.to_owned(),
                quote_property(&why.reason, 128),
            ),
            (
                dead_letter::DETAIL.to_owned(),
                quote_property(dead_letter::truncate_detail(&why.detail), MAX_DETAIL_LEN),
            ),
            (
                SOURCE_PROPERTY.to_owned(),
                quote_property(&self.source, 300),
            ),
            (
                DELIVERY_COUNT_PROPERTY.to_owned(),
                m.delivery_count.to_string(),
            ),
            (FORWARDED_AT_PROPERTY.to_owned(), quote_property(&now, 64)),
        ];
        if let Some(seq) = locked.props.sequence_number {
            extra.push((SEQUENCE_PROPERTY.to_owned(), seq.to_string()));
        }
        // A message forwarded twice keeps the first enqueue time.
        let enqueued = m
            .attribute(ENQUEUED_AT_PROPERTY)
            .map(str::to_owned)
            .or_else(|| {
                m.enqueued_at
                    .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
            });
        if let Some(t) = enqueued {
            extra.push((ENQUEUED_AT_PROPERTY.to_owned(), quote_property(&t, 64)));
        }
        let options = resend_options(
            locked,
            |k| dead_letter::is_bookkeeping(k) && k != ENQUEUED_AT_PROPERTY,
            extra,
        );
        let body = m.body_str().ok_or_else(|| {
            BrokerError::new(
                BrokerErrorKind::Rejected,
                "dead-letter-forward",
                "the body is not UTF-8 (the crate sends text only)",
            )
        })?;
        self.client
            .send_message(body, Some(options))
            .await
            .map_err(|e| send_error("dead-letter-forward", e, body.len()))?;
        metrics::counter!(crate::metrics::DLQ_FORWARDS, "reason" => why.reason.clone())
            .increment(1);
        tracing::warn!(
            source = %self.source,
            destination = %self.destination,
            message_id = ?m.producer_id,
            reason = %why.reason,
            "forwarded to the dead-letter destination"
        );
        Ok(())
    }
}

/// A dead-lettered message as read from a `$DeadLetterQueue` or a forward destination.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DeadLetteredMessage {
    /// The message (MessageId in `producer_id`, custom properties in `attributes`).
    pub message: ReceivedMessage,
    /// The reason: `txinbox-dlq-reason` for forwarded copies, else the broker's `DeadLetterReason`.
    pub reason: Option<String>,
    /// The detail: `txinbox-dlq-detail`, else the broker's `DeadLetterErrorDescription`.
    pub detail: Option<String>,
}

impl DeadLetteredMessage {
    fn of(message: ReceivedMessage) -> Self {
        let get = |a: &str, b: &str| {
            message
                .attribute(a)
                .or_else(|| message.attribute(b))
                .map(str::to_owned)
        };
        Self {
            reason: get(dead_letter::REASON, BROKER_REASON_PROPERTY),
            detail: get(dead_letter::DETAIL, BROKER_DESCRIPTION_PROPERTY),
            message,
        }
    }
}

/// Reads up to `max` dead-lettered messages from `path` (`queue/$DeadLetterQueue` from
/// [`crate::dead_letter_queue_path`], or a forward destination) without removing them.
///
/// REST has no browse: each message is peek-locked, and all are abandoned at the end, which raises
/// their DeliveryCount in the dead-letter queue (messages there are never dead-lettered again) and hides them
/// from other readers while this runs.
///
/// Each message is returned once. When the read lasts longer than the entity's lock, the first locks lapse and
/// the messages come round again (Microsoft, Peek-Lock Message: "When the lock expires, the message becomes
/// available to other receivers"): a message whose sequence number was read already is not returned again (its
/// new lock is kept, so the read moves on to the messages behind it), and one that comes round a third time
/// ends the read, a whole pass over what is left having been made since it was first read. Before each receive,
/// the locks held past half their length are renewed, so a read whose receives outlast the lock still reaches
/// the messages behind those it holds (which would otherwise come first, by sequence number, and take every
/// receive).
pub async fn read_dead_letters(
    client: &ServiceBusClient,
    path: &str,
    max: usize,
    wait: Duration,
) -> Result<Vec<DeadLetteredMessage>, BrokerError> {
    let queue = client.queue_client(path);
    let mut locks = Vec::new();
    let mut out = Vec::new();
    let mut seen: HashMap<String, u32> = HashMap::new();
    let mut result = Ok(());
    while out.len() < max {
        renew_held(&mut locks, path).await;
        match peek_lock(&queue, path, wait, Duration::from_secs(60)).await {
            Ok(Some(locked)) => {
                // The sequence number (from BrokerProperties, else the lock URI); the lock URI itself when
                // neither says one, which tells nothing apart but never merges two messages.
                let key = locked.message.broker_id.clone().unwrap_or_else(|| {
                    locked
                        .headers
                        .get("location")
                        .unwrap_or_default()
                        .to_owned()
                });
                let times = seen.entry(key).or_default();
                *times += 1;
                match *times {
                    1 => {}
                    2 => {
                        locks.push(locked);
                        continue;
                    }
                    _ => {
                        locks.push(locked);
                        break;
                    }
                }
                out.push(DeadLetteredMessage::of(locked.message.clone()));
                locks.push(locked);
            }
            Ok(None) => break,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    for locked in &locks {
        if let Err(e) = settle(
            &locked.response,
            SettleOp::Abandon,
            path,
            2,
            locked.locked_until,
        )
        .await
        {
            tracing::warn!(path, error = %e, "could not abandon a dead letter after reading it; it comes back when its lock ends");
        }
    }
    result.map(|()| out)
}

/// Renews each held lock that has run past half its length (its length read as the time from the receive to
/// its LockedUntilUtc), so that what a long read or redrive holds stays hidden from its own receives and the
/// messages behind it are reached (Microsoft, Renew-Lock for a Message: "Renews the lock on an already locked
/// message."). A lock already lapsed, or whose renewal fails, is left: the message comes round again and is
/// known by its sequence number.
pub(crate) async fn renew_held(held: &mut [Locked], path: &str) {
    for locked in held.iter_mut() {
        let now = Utc::now();
        let length = locked.locked_until - locked.message.received_at;
        if length <= chrono::Duration::zero()
            || locked.locked_until <= now
            || now < locked.locked_until - length / 2
        {
            continue;
        }
        match settle(
            &locked.response,
            SettleOp::Renew,
            path,
            1,
            locked.locked_until,
        )
        .await
        {
            Ok(()) => {
                // A held copy only (what was returned or sent was taken before): the renewal's start.
                locked.message.received_at = now;
                locked.locked_until = now + length;
            }
            Err(e) => {
                tracing::debug!(path, error = %e, "renewing a held dead letter failed; it may come round again");
            }
        }
    }
}

/// Whether a custom property is dead-letter bookkeeping that a redrive drops.
pub(crate) fn is_dead_letter_property(name: &str) -> bool {
    dead_letter::is_bookkeeping(name)
        || name == BROKER_REASON_PROPERTY
        || name == BROKER_DESCRIPTION_PROPERTY
}

/// The original enqueue time of a dead letter: `txinbox-dlq-enqueued-at` on forwarded copies, else its
/// EnqueuedTimeUtc (a `$DeadLetterQueue` message keeps the original).
pub(crate) fn original_enqueued_at(m: &ReceivedMessage) -> Option<chrono::DateTime<Utc>> {
    m.attribute(ENQUEUED_AT_PROPERTY)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(wire::unquote(t)).ok())
        .map(|t| t.with_timezone(&Utc))
        .or(m.enqueued_at)
}
