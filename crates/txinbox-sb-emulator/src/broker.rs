//! The broker state: queues, their messages and dead-letter sub-queues, and the rules for locks,
//! delivery counts, expiry and duplicate detection. Everything here is synchronous and runs under
//! one mutex; time is passed in as a [`tokio::time::Instant`].

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use hyper::body::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::{QueueProperties, QueuePropertiesOutput};
use crate::faults::FaultRule;
use crate::wire::{self, PropertyValue, SenderProperties, TimeToLive};

/// The longest entity path [doc QUOTA].
const MAX_ENTITY_PATH_LEN: usize = 260;
/// Largest single application property, and all of them together [doc QUOTA].
const MAX_PROPERTY_BYTES: usize = 32 * 1024;
const MAX_ALL_PROPERTIES_BYTES: usize = 64 * 1024;

/// The dead-letter sub-queue's path segment [doc DLQ]; matched in any case.
pub(crate) const DEAD_LETTER_SEGMENT: &str = "$deadletterqueue";

/// Errors of data-plane operations, each with its documented status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DataError {
    /// 400 [doc SEND, PEEK, PROPS].
    BadRequest(String),
    /// 403: quota exceeded or message too large [doc SEND].
    QuotaExceeded(String),
    /// 404: no message with that MessageId/SequenceNumber and LockToken [doc DEL, UNLOCK, RENEW].
    LockNotFound,
    /// 410: the queue does not exist [doc SEND, PEEK, DEL].
    EntityNotFound(String),
}

impl DataError {
    pub(crate) fn status(&self) -> u16 {
        match self {
            DataError::BadRequest(_) => 400,
            DataError::QuotaExceeded(_) => 403,
            DataError::LockNotFound => 404,
            DataError::EntityNotFound(_) => 410,
        }
    }

    pub(crate) fn detail(&self) -> String {
        match self {
            DataError::BadRequest(d) | DataError::QuotaExceeded(d) => d.clone(),
            DataError::LockNotFound => {
                "The lock supplied is invalid. Either the lock expired, or the message has already been removed from the queue.".into()
            }
            DataError::EntityNotFound(path) => format!("The messaging entity '{path}' could not be found."),
        }
    }
}

/// Maps the emulator's monotonic clock to UTC for the dates it reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    base_instant: Instant,
    base_utc: DateTime<Utc>,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            base_instant: Instant::now(),
            base_utc: Utc::now(),
        }
    }

    pub(crate) fn utc(&self, at: Instant) -> DateTime<Utc> {
        let since = at.saturating_duration_since(self.base_instant);
        chrono::Duration::from_std(since)
            .ok()
            .and_then(|d| self.base_utc.checked_add_signed(d))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    fn instant_of(&self, t: DateTime<Utc>, now: Instant) -> Instant {
        let ahead = (t - self.utc(now)).to_std().unwrap_or(Duration::ZERO);
        now.checked_add(ahead)
            .unwrap_or(now + Duration::from_secs(100 * 365 * 86_400))
    }
}

/// A message handed to [`Broker::send`].
#[derive(Debug, Clone)]
pub(crate) struct IncomingMessage {
    pub body: Bytes,
    pub content_type: Option<String>,
    pub sender: SenderProperties,
    pub properties: Vec<(String, PropertyValue)>,
}

#[derive(Debug, Clone)]
struct Lock {
    token: Uuid,
    until: Instant,
}

#[derive(Debug, Clone)]
struct Message {
    sequence_number: i64,
    message_id: String,
    body: Bytes,
    content_type: Option<String>,
    sender: SenderProperties,
    properties: Vec<(String, PropertyValue)>,
    /// Effective TTL; `None` never expires.
    ttl: Option<Duration>,
    enqueued_at: Instant,
    visible_at: Instant,
    /// How many times the message was handed out.
    delivery_count: u32,
    lock: Option<Lock>,
}

impl Message {
    fn expires_at(&self) -> Option<Instant> {
        self.ttl.and_then(|ttl| self.enqueued_at.checked_add(ttl))
    }

    fn is_expired(&self, now: Instant) -> bool {
        self.expires_at().is_some_and(|at| at <= now)
    }

    fn is_receivable(&self, now: Instant) -> bool {
        self.lock.is_none() && self.visible_at <= now
    }
}

/// Which sub-queue of a queue an address names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SubQueue {
    Active,
    DeadLetter,
}

/// A parsed entity path: the queue and the sub-queue.
struct Address {
    queue_key: String,
    /// The entity path as the Location header spells it: lower case, as in [doc PEEK]'s example.
    location_path: String,
    sub: SubQueue,
}

fn parse_entity(entity_path: &str) -> Result<Address, DataError> {
    let trimmed = entity_path.trim_matches('/');
    let (queue, sub) = match trimmed.rsplit_once('/') {
        Some((queue, last)) if last.eq_ignore_ascii_case(DEAD_LETTER_SEGMENT) => {
            (queue, SubQueue::DeadLetter)
        }
        _ => (trimmed, SubQueue::Active),
    };
    if queue.is_empty() {
        return Err(DataError::BadRequest(
            "The request URI names no entity.".into(),
        ));
    }
    Ok(Address {
        queue_key: queue.to_ascii_lowercase(),
        location_path: trimmed.to_ascii_lowercase(),
        sub,
    })
}

/// Checks an entity path for the control API: segments of letters, digits, `.`, `-`, `_`, at most
/// 260 characters [doc QUOTA], and no segment the router reserves (`messages`, `$…`).
pub(crate) fn validate_queue_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.len() > MAX_ENTITY_PATH_LEN {
        return Err(format!(
            "an entity path has 1 to {MAX_ENTITY_PATH_LEN} characters"
        ));
    }
    for segment in path.split('/') {
        if segment.is_empty() {
            return Err("an entity path has no empty segment".into());
        }
        if !segment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(format!(
                "segment {segment:?} may hold only letters, digits, '.', '-' and '_'"
            ));
        }
        if segment.eq_ignore_ascii_case("messages") {
            return Err("an entity path may not contain a 'messages' segment".into());
        }
    }
    Ok(())
}

#[derive(Debug)]
struct Queue {
    path: String,
    props: QueueProperties,
    next_sequence_number: i64,
    active: BTreeMap<i64, Message>,
    dead_letter: BTreeMap<i64, Message>,
    /// MessageId → when it was first accepted [doc DUP].
    duplicate_history: HashMap<String, Instant>,
    /// No lock lapses and no message expires before this instant (`None`: nothing is due ever), so
    /// [`Queue::maintain`] looks at the messages only from then on instead of on every request. Lowered
    /// whenever a lock is granted or a message could start to expire; it may be early, never late.
    next_due: Option<Instant>,
}

/// What a successful receive hands to the HTTP layer.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub body: Bytes,
    pub content_type: Option<String>,
    /// The `BrokerProperties` header, ASCII-only JSON.
    pub broker_properties: String,
    /// Custom properties as (header name, header value).
    pub properties: Vec<(String, String)>,
    /// For peek-lock: `/{entity}/messages/{sequenceNumber}/{lockToken}`.
    pub lock_path: Option<String>,
}

/// The outcome of a receive attempt.
#[derive(Debug)]
pub(crate) enum ReceiveOutcome {
    Delivered(Box<Delivery>),
    /// Nothing receivable now; `next_event` is when that may change on its own.
    Empty {
        next_event: Option<Instant>,
    },
}

/// How a receive takes the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReceiveMode {
    PeekLock,
    ReceiveAndDelete,
}

/// An operation on a lock URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockOperation {
    Complete,
    Abandon,
    Renew,
}

impl Queue {
    fn new(path: String, props: QueueProperties) -> Self {
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
    fn due(&mut self, at: Option<Instant>) {
        if let Some(at) = at {
            self.next_due = Some(self.next_due.map_or(at, |d| d.min(at)));
        }
    }

    fn sub(&mut self, sub: SubQueue) -> &mut BTreeMap<i64, Message> {
        match sub {
            SubQueue::Active => &mut self.active,
            SubQueue::DeadLetter => &mut self.dead_letter,
        }
    }

    /// Applies everything the clock has made due; returns whether anything changed.
    fn maintain(&mut self, now: Instant) -> bool {
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
    fn next_event(&self, now: Instant) -> Option<Instant> {
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
    fn release(&mut self, seq: i64, now: Instant) {
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

    fn enqueue(&mut self, incoming: IncomingMessage, now: Instant, clock: &Clock) {
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

/// All broker state behind the emulator's mutex.
#[derive(Debug)]
pub(crate) struct Broker {
    pub clock: Clock,
    queues: HashMap<String, Queue>,
    initial_queues: Vec<(String, QueueProperties)>,
    pub faults: Vec<FaultRule>,
}

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

/// Builds the receive response parts. BrokerProperties always carries every field the crate
/// requires (DeliveryCount, LockToken and LockedUntilUtc on peek-lock, MessageId, SequenceNumber,
/// State, TimeToLive) plus EnqueuedTimeUtc and EnqueuedSequenceNumber 0, like [doc PEEK]'s example;
/// receive-and-delete leaves out LockToken and LockedUntilUtc [doc RAD]. Dates are RFC 1123 `GMT`
/// and TimeToLive is seconds [doc PROPS]; numbers stay within the crate's i32/i64.
fn delivery(
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

fn queue_state(queue: &Queue, now: Instant, clock: &Clock) -> QueueState {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str) -> IncomingMessage {
        IncomingMessage {
            body: Bytes::from_static(b"hello"),
            content_type: None,
            sender: SenderProperties {
                message_id: Some(id.into()),
                ..SenderProperties::default()
            },
            properties: Vec::new(),
        }
    }

    fn lock_of(outcome: ReceiveOutcome) -> (String, String) {
        let ReceiveOutcome::Delivered(d) = outcome else {
            panic!("expected a message")
        };
        let path = d.lock_path.expect("peek-lock has a lock path");
        let mut parts = path.rsplit('/');
        let token = parts.next().unwrap().to_string();
        let seq = parts.next().unwrap().to_string();
        (seq, token)
    }

    #[test]
    fn lapsed_locks_raise_the_delivery_count_and_dead_letter() {
        let mut broker = Broker::new(vec![(
            "q".into(),
            QueueProperties::default()
                .lock_duration(Duration::from_secs(1))
                .max_delivery_count(2),
        )]);
        let t0 = Instant::now();
        broker.send("q", vec![message("m")], t0).unwrap();
        let (seq, token) = lock_of(broker.receive("q", ReceiveMode::PeekLock, t0).unwrap());
        // Hidden while locked.
        assert!(
            matches!(broker.receive("q", ReceiveMode::PeekLock, t0).unwrap(), ReceiveOutcome::Empty { next_event: Some(at) } if at == t0 + Duration::from_secs(1))
        );
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            broker.lock_operation("q", &seq, &token, LockOperation::Complete, t1),
            Err(DataError::LockNotFound)
        );
        let ReceiveOutcome::Delivered(d) = broker.receive("q", ReceiveMode::PeekLock, t1).unwrap()
        else {
            panic!("expected redelivery")
        };
        assert!(d.broker_properties.contains("\"DeliveryCount\":2"));
        let t2 = t1 + Duration::from_secs(1);
        let state = broker.queue_state("q", t2).unwrap();
        assert_eq!(state.active_message_count, 0);
        assert_eq!(state.dead_letter_message_count, 1);
        assert_eq!(
            state.dead_letter_messages[0].dead_letter_reason.as_deref(),
            Some("MaxDeliveryCountExceeded")
        );
    }

    #[test]
    fn ttl_is_capped_and_expired_messages_are_dead_lettered_when_enabled() {
        let mut broker = Broker::new(vec![(
            "q".into(),
            QueueProperties::default()
                .default_message_time_to_live(Duration::from_secs(5))
                .dead_lettering_on_message_expiration(true),
        )]);
        let t0 = Instant::now();
        let mut long = message("long");
        long.sender.time_to_live = Some(TimeToLive::Finite(Duration::from_secs(3600)));
        broker.send("q", vec![long], t0).unwrap();
        let state = broker.queue_state("q", t0).unwrap();
        assert_eq!(state.messages[0].time_to_live_seconds, Some(5.0));
        let state = broker
            .queue_state("q", t0 + Duration::from_secs(5))
            .unwrap();
        assert_eq!(
            state.dead_letter_messages[0].dead_letter_reason.as_deref(),
            Some("TTLExpiredException")
        );
    }

    /// The queue looks at its messages only when something may be due; every way a lock or an
    /// expiry comes into being must make it look in time.
    #[test]
    fn renewed_locks_hold_and_abandoned_messages_still_expire_on_time() {
        let mut broker = Broker::new(vec![(
            "q".into(),
            QueueProperties::default()
                .lock_duration(Duration::from_secs(2))
                .default_message_time_to_live(Duration::from_secs(10))
                .dead_lettering_on_message_expiration(true),
        )]);
        let t0 = Instant::now();
        let at = |secs: f64| t0 + Duration::from_secs_f64(secs);
        broker
            .send("q", vec![message("a"), message("b")], t0)
            .unwrap();
        let (seq_a, token_a) = lock_of(broker.receive("q", ReceiveMode::PeekLock, t0).unwrap());
        let (seq_b, token_b) =
            lock_of(broker.receive("q", ReceiveMode::PeekLock, at(1.0)).unwrap());
        broker
            .lock_operation("q", &seq_a, &token_a, LockOperation::Abandon, at(1.0))
            .unwrap();
        broker
            .lock_operation("q", &seq_b, &token_b, LockOperation::Renew, at(2.0))
            .unwrap();
        // b's first lock would have ended at 3 s; the renewal holds it to 4 s.
        let state = broker.queue_state("q", at(3.5)).unwrap();
        assert_eq!(state.locked_message_count, 1);
        broker
            .lock_operation("q", &seq_b, &token_b, LockOperation::Complete, at(3.5))
            .unwrap();
        // a, abandoned and never touched again, expires at 10 s.
        let state = broker.queue_state("q", at(9.9)).unwrap();
        assert_eq!(
            (
                state.available_message_count,
                state.dead_letter_message_count
            ),
            (1, 0)
        );
        let state = broker.queue_state("q", at(10.0)).unwrap();
        assert_eq!(
            (state.active_message_count, state.dead_letter_message_count),
            (0, 1)
        );
        // A lock named by MessageId instead of SequenceNumber is still found.
        let (_, token) = lock_of(
            broker
                .receive("q/$deadletterqueue", ReceiveMode::PeekLock, at(10.0))
                .unwrap(),
        );
        broker
            .lock_operation(
                "q/$deadletterqueue",
                "a",
                &token,
                LockOperation::Complete,
                at(10.0),
            )
            .unwrap();
        assert_eq!(
            broker
                .queue_state("q", at(10.0))
                .unwrap()
                .dead_letter_message_count,
            0
        );
    }

    /// A lock may outlast its message's time to live; once abandoned, the message expires at its own time.
    #[test]
    fn a_message_abandoned_under_a_long_lock_expires_on_time() {
        let mut broker = Broker::new(vec![(
            "q".into(),
            QueueProperties::default()
                .lock_duration(Duration::from_secs(5))
                .dead_lettering_on_message_expiration(true),
        )]);
        let t0 = Instant::now();
        let at = |secs: f64| t0 + Duration::from_secs_f64(secs);
        let with_ttl = |id: &str, secs: f64| {
            let mut m = message(id);
            m.sender.time_to_live = Some(TimeToLive::Finite(Duration::from_secs_f64(secs)));
            m
        };
        broker
            .send("q", vec![with_ttl("a", 4.5), with_ttl("b", 1.0)], t0)
            .unwrap();
        let (seq, token) = lock_of(broker.receive("q", ReceiveMode::PeekLock, t0).unwrap());
        // b expires; a is locked to 5 s, past its expiry.
        let state = broker.queue_state("q", at(2.0)).unwrap();
        assert_eq!(
            (state.locked_message_count, state.dead_letter_message_count),
            (1, 1)
        );
        broker
            .lock_operation("q", &seq, &token, LockOperation::Abandon, at(3.0))
            .unwrap();
        let state = broker.queue_state("q", at(4.6)).unwrap();
        assert_eq!(
            (state.active_message_count, state.dead_letter_message_count),
            (0, 2)
        );
    }

    #[test]
    fn entity_paths_split_the_dead_letter_segment() {
        let a = parse_entity("Orders/$DeadLetterQueue").unwrap();
        assert_eq!(
            (a.queue_key.as_str(), a.sub),
            ("orders", SubQueue::DeadLetter)
        );
        let a = parse_entity("a/b/c").unwrap();
        assert_eq!((a.queue_key.as_str(), a.sub), ("a/b/c", SubQueue::Active));
        assert!(parse_entity("/").is_err());
        assert!(validate_queue_path("t/subscriptions/s").is_ok());
        assert!(validate_queue_path("a/messages").is_err());
        assert!(validate_queue_path("a//b").is_err());
        assert!(validate_queue_path("$emulator").is_err());
    }
}
