//! The broker's operations: queue management, send, receive, lock operations and the control API's views.

use std::collections::HashMap;

use tokio::time::Instant;
use uuid::Uuid;

use super::address::parse_entity;
use super::delivery::delivery;
use super::state::queue_state;
use super::{
    validate_queue_path, Address, Broker, Clock, DataError, IncomingMessage, Lock, LockOperation,
    Message, Queue, QueueState, ReceiveMode, ReceiveOutcome, SubQueue,
};
use crate::config::QueueProperties;

/// Largest single application property, and all of them together [doc QUOTA].
const MAX_PROPERTY_BYTES: usize = 32 * 1024;
const MAX_ALL_PROPERTIES_BYTES: usize = 64 * 1024;

impl Broker {
    pub(crate) fn new(initial_queues: Vec<(String, QueueProperties)>) -> Self {
        let mut broker = Self {
            clock: Clock::new(),
            queues: HashMap::new(),
            initial_queues,
            faults: Vec::new(),
        };
        broker.reset();
        broker
    }

    /// Back to the start-up configuration: the configured queues, empty; no faults.
    pub(crate) fn reset(&mut self) {
        self.queues.clear();
        self.faults.clear();
        for (path, props) in self.initial_queues.clone() {
            self.queues
                .insert(path.to_ascii_lowercase(), Queue::new(path, props));
        }
    }

    /// Creates a queue, or replaces the properties of an existing one (keeping its messages).
    /// Returns whether it was created.
    pub(crate) fn put_queue(&mut self, path: &str, props: QueueProperties) -> Result<bool, String> {
        validate_queue_path(path)?;
        props.validate()?;
        let key = path.to_ascii_lowercase();
        if let Some(queue) = self.queues.get_mut(&key) {
            queue.props = props;
            return Ok(false);
        }
        self.queues.insert(key, Queue::new(path.to_string(), props));
        Ok(true)
    }

    pub(crate) fn queue_properties(&self, path: &str) -> Option<QueueProperties> {
        self.queues
            .get(&path.to_ascii_lowercase())
            .map(|q| q.props.clone())
    }

    pub(crate) fn delete_queue(&mut self, path: &str) -> bool {
        self.queues.remove(&path.to_ascii_lowercase()).is_some()
    }

    fn queue_mut(&mut self, address: &Address) -> Result<&mut Queue, DataError> {
        self.queues
            .get_mut(&address.queue_key)
            .ok_or_else(|| DataError::EntityNotFound(address.queue_key.clone()))
    }

    /// Send or batch send: all messages are checked before any is enqueued [doc SEND, BATCH].
    pub(crate) fn send(
        &mut self,
        entity: &str,
        batch: Vec<IncomingMessage>,
        now: Instant,
    ) -> Result<(), DataError> {
        let address = parse_entity(entity)?;
        let clock = self.clock;
        let queue = self.queue_mut(&address)?;
        if address.sub == SubQueue::DeadLetter {
            // Only the broker puts messages into a DLQ [doc DLQ]; the status is [inference].
            return Err(DataError::BadRequest(
                "Messages cannot be sent to a dead-letter queue.".into(),
            ));
        }
        queue.maintain(now);
        let limit = queue.props.max_message_size_in_kilobytes as usize * 1024;
        for message in &batch {
            if queue.props.requires_session && message.sender.session_id.is_none() {
                return Err(DataError::BadRequest(format!(
                    "The queue '{}' requires sessions: the message must have a SessionId.",
                    queue.path
                )));
            }
            let mut all_properties = 0;
            for (name, value) in &message.properties {
                let size = name.len() + value.approximate_size();
                if size > MAX_PROPERTY_BYTES {
                    return Err(DataError::QuotaExceeded(format!(
                        "The property '{name}' is larger than 32 KB."
                    )));
                }
                all_properties += size;
            }
            if all_properties > MAX_ALL_PROPERTIES_BYTES {
                return Err(DataError::QuotaExceeded(
                    "The message's properties are larger than 64 KB.".into(),
                ));
            }
            if message.body.len() + all_properties > limit {
                return Err(DataError::QuotaExceeded(format!(
                    "The message is larger than the maximum message size of {limit} bytes."
                )));
            }
        }
        for message in batch {
            queue.enqueue(message, now, &clock);
        }
        Ok(())
    }

    /// One receive attempt (the HTTP layer loops for long polling).
    pub(crate) fn receive(
        &mut self,
        entity: &str,
        mode: ReceiveMode,
        now: Instant,
    ) -> Result<ReceiveOutcome, DataError> {
        let address = parse_entity(entity)?;
        let clock = self.clock;
        let queue = self.queue_mut(&address)?;
        if queue.props.requires_session && address.sub == SubQueue::Active {
            // REST has no session receiver [doc SUPPORT]; the status is [inference].
            return Err(DataError::BadRequest(
                "The queue requires sessions, and sessions cannot be received over REST.".into(),
            ));
        }
        queue.maintain(now);
        let lock_duration = queue.props.lock_duration;
        let sub = queue.sub(address.sub);
        // Sequence-number order; the service promises no FIFO without sessions [doc SESS].
        let Some(seq) = sub
            .values()
            .find(|m| m.is_receivable(now))
            .map(|m| m.sequence_number)
        else {
            let next_event = queue.next_event(now);
            return Ok(ReceiveOutcome::Empty { next_event });
        };
        let delivery = match mode {
            ReceiveMode::PeekLock => {
                // Peek-lock hides the message until LockedUntilUtc = now + LockDuration [doc PEEK, LOCKS].
                let lock = Lock {
                    token: Uuid::new_v4(),
                    until: now + lock_duration,
                };
                let Some(message) = sub.get_mut(&seq) else {
                    return Ok(ReceiveOutcome::Empty { next_event: None });
                };
                message.delivery_count = message.delivery_count.saturating_add(1);
                message.lock = Some(lock.clone());
                let delivery = delivery(message, Some(&lock), &address.location_path, &clock);
                queue.due(Some(lock.until));
                delivery
            }
            ReceiveMode::ReceiveAndDelete => {
                // Receive-and-delete removes the message as it is read [doc RAD].
                let Some(mut message) = sub.remove(&seq) else {
                    return Ok(ReceiveOutcome::Empty { next_event: None });
                };
                message.delivery_count = message.delivery_count.saturating_add(1);
                delivery(&message, None, &address.location_path, &clock)
            }
        };
        Ok(ReceiveOutcome::Delivered(Box::new(delivery)))
    }

    /// Complete (DELETE), abandon (PUT) or renew (POST) on `{entity}/messages/{id}/{lockToken}`,
    /// where `id` is the SequenceNumber or the MessageId [doc DEL, UNLOCK, RENEW].
    pub(crate) fn lock_operation(
        &mut self,
        entity: &str,
        id: &str,
        lock_token: &str,
        operation: LockOperation,
        now: Instant,
    ) -> Result<(), DataError> {
        let address = parse_entity(entity)?;
        let queue = self.queue_mut(&address)?;
        queue.maintain(now);
        let lock_duration = queue.props.lock_duration;
        // An unknown, lapsed or already used lock token answers 404 [doc DEL, UNLOCK, RENEW].
        let token = Uuid::parse_str(lock_token).map_err(|_| DataError::LockNotFound)?;
        let sub = queue.sub(address.sub);
        let holds = |m: &Message| m.lock.as_ref().is_some_and(|l| l.token == token);
        // The id is the SequenceNumber (what the Location header carries) or the MessageId: the first
        // is one lookup, the second a search.
        let by_sequence = id
            .parse::<i64>()
            .ok()
            .and_then(|seq| sub.get(&seq))
            .filter(|m| holds(m) && m.sequence_number.to_string() == id);
        let seq = match by_sequence {
            Some(m) => m.sequence_number,
            None => sub
                .values()
                .find(|m| holds(m) && (m.sequence_number.to_string() == id || m.message_id == id))
                .map(|m| m.sequence_number)
                .ok_or(DataError::LockNotFound)?,
        };
        match operation {
            LockOperation::Complete => {
                sub.remove(&seq);
            }
            LockOperation::Renew => {
                // Renew extends the lock to now + LockDuration [doc RENEW, LOCKS].
                if let Some(lock) = sub.get_mut(&seq).and_then(|m| m.lock.as_mut()) {
                    lock.until = now + lock_duration;
                }
            }
            LockOperation::Abandon => match address.sub {
                SubQueue::Active => queue.release(seq, now),
                // A DLQ message is never dead-lettered again and never expires [doc DLQ].
                SubQueue::DeadLetter => {
                    if let Some(m) = queue.dead_letter.get_mut(&seq) {
                        m.lock = None;
                    }
                }
            },
        }
        Ok(())
    }

    /// The control API's view of one queue.
    pub(crate) fn queue_state(&mut self, path: &str, now: Instant) -> Option<QueueState> {
        let clock = self.clock;
        let queue = self.queues.get_mut(&path.to_ascii_lowercase())?;
        queue.maintain(now);
        Some(queue_state(queue, now, &clock))
    }

    /// A summary of every queue.
    pub(crate) fn all_queue_states(&mut self, now: Instant) -> Vec<QueueState> {
        let clock = self.clock;
        let mut states: Vec<QueueState> = self
            .queues
            .values_mut()
            .map(|queue| {
                queue.maintain(now);
                queue_state(queue, now, &clock)
            })
            .collect();
        states.sort_by(|a, b| a.path.cmp(&b.path));
        states
    }
}
