//! One queue's rules: lapsed locks, delivery counts, expiry, dead-lettering and duplicate detection.

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;
use uuid::Uuid;

use super::{Clock, IncomingMessage, Message, Queue, SubQueue};
use crate::config::QueueProperties;
use crate::wire::{PropertyValue, TimeToLive};

impl Queue {
    pub(super) fn new(path: String, props: QueueProperties) -> Self {
        Self {
            path,
            props,
            next_sequence_number: 1,
            active: BTreeMap::new(),
            dead_letter: BTreeMap::new(),
            duplicate_history: HashMap::new(),
            next_due: None,
        }
    }

    /// Something may become due at `at`: [`Queue::maintain`] looks again no later than then.
    pub(super) fn due(&mut self, at: Option<Instant>) {
        if let Some(at) = at {
            self.next_due = Some(self.next_due.map_or(at, |d| d.min(at)));
        }
    }

    pub(super) fn sub(&mut self, sub: SubQueue) -> &mut BTreeMap<i64, Message> {
        match sub {
            SubQueue::Active => &mut self.active,
            SubQueue::DeadLetter => &mut self.dead_letter,
        }
    }

    /// Applies everything the clock has made due; returns whether anything changed.
    pub(super) fn maintain(&mut self, now: Instant) -> bool {
        if self.next_due.is_none_or(|due| now < due) {
            return false;
        }
        let mut changed = false;
        let lapsed: Vec<i64> = self
            .active
            .values()
            .filter(|m| m.lock.as_ref().is_some_and(|l| l.until <= now))
            .map(|m| m.sequence_number)
            .collect();
        for seq in lapsed {
            // A lapsed lock counts like an abandon [doc DLQ, LOCKS].
            self.release(seq, now);
            changed = true;
        }
        let expired: Vec<i64> = self
            .active
            .values()
            .filter(|m| m.lock.is_none() && m.is_expired(now))
            .map(|m| m.sequence_number)
            .collect();
        for seq in expired {
            self.expire(seq);
            changed = true;
        }
        for m in self.dead_letter.values_mut() {
            if m.lock.as_ref().is_some_and(|l| l.until <= now) {
                m.lock = None;
                changed = true;
            }
        }
        // The next lock end or expiry (a scheduled message's appearance too, which makes it early, never late).
        self.next_due = self.next_event(now);
        changed
    }

    /// When the next lock lapses, scheduled message appears or message expires.
    pub(super) fn next_event(&self, now: Instant) -> Option<Instant> {
        let active = self.active.values().filter_map(|m| match &m.lock {
            Some(lock) => Some(lock.until),
            None if m.visible_at > now => Some(m.visible_at),
            None => m.expires_at(),
        });
        let dead = self
            .dead_letter
            .values()
            .filter_map(|m| m.lock.as_ref().map(|l| l.until));
        active.chain(dead).min()
    }

    /// Releases the lock of an active message after an abandon or a lapsed lock.
    ///
    /// DeliveryCount "is incremented whenever a message has been delivered under a peek-lock but
    /// has been either explicitly abandoned or the lock has expired"; past MaxDeliveryCount the
    /// broker moves it to the DLQ with `MaxDeliveryCountExceeded` [doc DLQ]. Here the count is
    /// raised when the message is handed out, so the next delivery reports 1, 2, … and a message
    /// is delivered at most MaxDeliveryCount times. An expired message whose lock is
    /// released expires at once [doc TTL].
    pub(super) fn release(&mut self, seq: i64, now: Instant) {
        let max = self.props.max_delivery_count;
        let Some(message) = self.active.get_mut(&seq) else {
            return;
        };
        message.lock = None;
        let expires_at = message.expires_at();
        if message.delivery_count >= max {
            let description =
                format!("Message could not be consumed after {max} delivery attempts.");
            self.dead_letter_message(seq, "MaxDeliveryCountExceeded", &description);
        } else if expires_at.is_some_and(|at| at <= now) {
            self.expire(seq);
        } else {
            self.due(expires_at);
        }
    }

    /// Expiry: dropped, or dead-lettered with `TTLExpiredException` when
    /// DeadLetteringOnMessageExpiration is on [doc TTL, DLQ].
    fn expire(&mut self, seq: i64) {
        if self.props.dead_lettering_on_message_expiration {
            self.dead_letter_message(
                seq,
                "TTLExpiredException",
                "The message expired and was dead lettered.",
            );
        } else {
            self.active.remove(&seq);
        }
    }

    /// Moves a message to the DLQ; the reason and description become the application properties
    /// `DeadLetterReason` and `DeadLetterErrorDescription` [doc DLQ, TTL].
    fn dead_letter_message(&mut self, seq: i64, reason: &str, description: &str) {
        if let Some(mut message) = self.active.remove(&seq) {
            message.lock = None;
            message.properties.retain(|(name, _)| {
                !name.eq_ignore_ascii_case("DeadLetterReason")
                    && !name.eq_ignore_ascii_case("DeadLetterErrorDescription")
            });
            message.properties.push((
                "DeadLetterReason".into(),
                PropertyValue::String(reason.into()),
            ));
            message.properties.push((
                "DeadLetterErrorDescription".into(),
                PropertyValue::String(description.into()),
            ));
            self.dead_letter.insert(seq, message);
        }
    }

    pub(super) fn enqueue(&mut self, incoming: IncomingMessage, now: Instant, clock: &Clock) {
        let message_id = match &incoming.sender.message_id {
            Some(id) => {
                if self.props.requires_duplicate_detection {
                    // A send whose MessageId was seen within the window is acknowledged (201) and
                    // dropped [doc DUP].
                    let window = self.props.duplicate_detection_history_time_window;
                    self.duplicate_history.retain(|_, first_seen| {
                        now.saturating_duration_since(*first_seen) < window
                    });
                    if self.duplicate_history.contains_key(id) {
                        tracing::debug!(queue = %self.path, message_id = %id, "duplicate dropped");
                        return;
                    }
                    self.duplicate_history.insert(id.clone(), now);
                }
                id.clone()
            }
            // A service-generated MessageId: 32 hex digits, no dashes [doc PEEK example].
            None => Uuid::new_v4().simple().to_string(),
        };
        // The queue's DefaultMessageTimeToLive applies when the message sets none and caps a longer
        // one [doc TTL].
        let ttl = match (
            incoming.sender.time_to_live,
            self.props.default_message_time_to_live,
        ) {
            (Some(TimeToLive::Finite(own)), Some(default)) => Some(own.min(default)),
            (Some(TimeToLive::Finite(own)), None) => Some(own),
            (Some(TimeToLive::Unbounded) | None, default) => default,
        };
        // A scheduled message becomes visible (and is enqueued) at its time [doc SUPPORT, PROPS].
        let visible_at = incoming
            .sender
            .scheduled_enqueue_time_utc
            .map_or(now, |t| clock.instant_of(t, now));
        let seq = self.next_sequence_number;
        self.next_sequence_number += 1;
        self.due(ttl.and_then(|ttl| visible_at.checked_add(ttl)));
        self.active.insert(
            seq,
            Message {
                sequence_number: seq,
                message_id,
                body: incoming.body,
                content_type: incoming
                    .content_type
                    .or(incoming.sender.content_type.clone()),
                sender: incoming.sender,
                properties: incoming.properties,
                ttl,
                enqueued_at: visible_at,
                visible_at,
                delivery_count: 0,
                lock: None,
            },
        );
    }
}
