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

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use azure_messaging_servicebus::prelude::QueueClient;
use azure_messaging_servicebus::service_bus::{SendMessageOptions, SettableBrokerProperties};
use chrono::{DateTime, SecondsFormat, Utc};
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
/// new lock is kept, so the read moves on to the messages behind it). The read ends at an empty receive, at
/// `max`, or when more messages in a row came round again than it has read (one of them came round twice, a
/// lock apart, with no new message in between). Before each receive, the locks held past half their length, or
/// that may end within twice the slowest receive so far, are renewed (LockedUntilUtc is in whole seconds: a
/// lock past the end it was read with is still renewed), so a read whose receives outlast the lock still
/// reaches the messages behind those it holds (which would otherwise come first, by sequence number, and take
/// every receive).
pub async fn read_dead_letters(
    client: &ServiceBusClient,
    path: &str,
    max: usize,
    wait: Duration,
) -> Result<Vec<DeadLetteredMessage>, BrokerError> {
    let queue = client.queue_client(path);
    let mut sweep = Sweep::default();
    let mut out = Vec::new();
    let mut result = Ok(());
    while out.len() < max {
        // Reading removes nothing: whatever the run has looked at can come round again.
        match sweep.next(&queue, path, wait, 0).await {
            Ok(Sighting::New(locked)) => {
                out.push(DeadLetteredMessage::of(locked.message.clone()));
                sweep.hold(*locked);
            }
            Ok(Sighting::Again) => {}
            Ok(Sighting::Done) => break,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    sweep.release(path).await;
    result.map(|()| out)
}

/// One pass over a dead-letter entity that looks at each message once: what a read or a redrive has seen
/// and the locks it holds.
///
/// A pass that lasts longer than the entity's lock meets again the messages it looked at and left in place
/// once their lock lapses (Microsoft, Peek-Lock Message: "When the lock expires, the message becomes
/// available to other receivers"). Such a message is known by its sequence number (from BrokerProperties,
/// else its lock URI, which tells nothing apart but never merges two messages); its new lock is held, so the
/// next receive moves on to the messages behind it. The pass ends at an empty receive, or when more messages
/// in a row came round again than the pass has left in place: then one of them came round twice, a whole
/// lock apart, with no new message in between, and everything left has been looked at.
#[derive(Default)]
pub(crate) struct Sweep {
    held: Vec<Held>,
    seen: HashSet<String>,
    repeats_in_a_row: usize,
    slowest_receive: Duration,
}

/// What [`Sweep::next`] received.
pub(crate) enum Sighting {
    /// A message this pass has not looked at; the caller holds it ([`Sweep::hold`]) or settles it.
    New(Box<Locked>),
    /// One looked at already; its new lock is held.
    Again,
    /// Everything left has been looked at (or the receive came back empty).
    Done,
}

impl Sweep {
    /// Renews the held locks, receives the next message and says whether it is new. `removed` is how many of
    /// the messages looked at this pass has taken out of the entity (completed), which cannot come round.
    pub(crate) async fn next(
        &mut self,
        queue: &QueueClient,
        path: &str,
        wait: Duration,
        removed: usize,
    ) -> Result<Sighting, BrokerError> {
        renew_held(&mut self.held, path, self.slowest_receive).await;
        let started = std::time::Instant::now();
        let received = peek_lock(queue, path, wait, Duration::from_secs(60)).await;
        let took = started.elapsed();
        let Some(locked) = received? else {
            return Ok(Sighting::Done);
        };
        // A receive that came back with a message never waited for one: how long it took is how long the
        // next one may take, which the held locks must outlast.
        self.slowest_receive = self.slowest_receive.max(took);
        let key = locked.message.broker_id.clone().unwrap_or_else(|| {
            locked
                .headers
                .get("location")
                .unwrap_or_default()
                .to_owned()
        });
        if self.seen.insert(key) {
            self.repeats_in_a_row = 0;
            return Ok(Sighting::New(Box::new(locked)));
        }
        self.held.push(Held::of(locked));
        self.repeats_in_a_row += 1;
        if self.repeats_in_a_row > self.seen.len().saturating_sub(removed) {
            return Ok(Sighting::Done);
        }
        Ok(Sighting::Again)
    }

    /// Keeps a message's lock until [`Sweep::release`], renewed as the pass goes on.
    pub(crate) fn hold(&mut self, locked: Locked) {
        self.held.push(Held::of(locked));
    }

    /// Abandons every held lock, so the messages are available again at once.
    pub(crate) async fn release(self, path: &str) {
        for h in &self.held {
            if let Err(e) = settle(&h.locked.response, SettleOp::Abandon, path, 2, h.until).await {
                tracing::info!(path, error = %e, "releasing a held dead letter failed; it comes back when its lock ends");
            }
        }
    }
}

/// A lock a [`Sweep`] holds, and what it knows of its end.
struct Held {
    locked: Locked,
    /// The lock's length as first read: LockedUntilUtc less the receive's time. LockedUntilUtc comes in whole
    /// seconds (RFC 1123), so this is short of the entity's LockDuration by up to a second, and may be zero:
    /// the lock is renewed early, never late.
    length: chrono::Duration,
    /// When the lock ends at the earliest (the whole seconds of LockedUntilUtc, then the renewals' starts plus
    /// `length`).
    until: DateTime<Utc>,
    /// A renewal failed (the lock lapsed, or the message is gone): not tried again; a lapsed message comes
    /// round again and is known by its sequence number.
    lost: bool,
}

impl Held {
    fn of(locked: Locked) -> Self {
        let until = locked.locked_until;
        let length = (until - locked.message.received_at).max(chrono::Duration::zero());
        Self {
            locked,
            length,
            until,
            lost: false,
        }
    }
}

/// Renews each held lock that has run past half its length, or that may end within twice `next_receive` (the
/// slowest receive so far), so that what a long read or redrive holds stays hidden from its own receives and
/// the messages behind it are reached (Microsoft, Renew-Lock for a Message: "Renews the lock on an already
/// locked message."). The end is known to a second only (LockedUntilUtc is RFC 1123), so a lock past its
/// earliest end is still renewed: the service says whether it lapsed. A lock whose renewal fails is left.
async fn renew_held(held: &mut [Held], path: &str, next_receive: Duration) {
    let ahead =
        chrono::Duration::from_std(next_receive.saturating_mul(2)).unwrap_or(chrono::Duration::MAX);
    for h in held.iter_mut().filter(|h| !h.lost) {
        let now = Utc::now();
        let lead = ahead.max(h.length / 2);
        if now.checked_add_signed(lead).is_some_and(|t| t < h.until) {
            continue;
        }
        match settle(&h.locked.response, SettleOp::Renew, path, 1, h.until).await {
            // The renewal's start: the lock runs at least `length` from there.
            Ok(()) => h.until = now + h.length,
            Err(e) => {
                h.lost = true;
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
