//! An in-memory broker with real at-least-once semantics, for tests, the lab and demos.
//!
//! It behaves like an SQS FIFO queue: a received message is invisible for the visibility timeout and comes
//! back when the timeout expires or when it is released; every receive raises its receive count; a message
//! received more than `max_receive_count` times moves to the dead-letter list; messages of one group are
//! handed out one at a time; a settle can be made to fail or to lose its response. Time can be advanced by
//! hand ([`MemoryQueue::advance`]) so tests of expiry are deterministic.
//!
//! Not a production broker: it lives in one process and keeps nothing on disk.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::broker::message::ReceivedMessage;
use crate::broker::{DeadLetter, Delivery, Lease, Receiver};
use crate::error::{BrokerError, BrokerErrorKind};

mod delivery;
#[cfg(test)]
mod tests;
mod timer;

pub use delivery::{MemoryDelivery, MemoryReceiver};
use timer::exact_delay;

/// A message to send.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutgoingMessage {
    /// Body.
    pub body: Vec<u8>,
    /// Attributes (lower-case names).
    pub attributes: BTreeMap<String, String>,
    /// Producer-set id (like SQS `MessageDeduplicationId`).
    pub producer_id: Option<String>,
    /// Group (like SQS `MessageGroupId`).
    pub group_id: Option<String>,
}

impl OutgoingMessage {
    /// A message with `body` and nothing else.
    pub fn new(body: impl Into<Vec<u8>>) -> Self {
        Self {
            body: body.into(),
            ..Self::default()
        }
    }
    /// Sets the producer id.
    pub fn producer_id(mut self, id: impl Into<String>) -> Self {
        self.producer_id = Some(id.into());
        self
    }
    /// Sets the group.
    pub fn group(mut self, g: impl Into<String>) -> Self {
        self.group_id = Some(g.into());
        self
    }
    /// Adds an attribute (the name is lower-cased).
    pub fn attribute(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.attributes.insert(k.into().to_lowercase(), v.into());
        self
    }
    /// Sets CloudEvents identity attributes (`ce-id`, `ce-source`, `ce-type`, `ce-specversion`).
    pub fn cloudevent(self, source: &str, id: &str, event_type: &str) -> Self {
        self.attribute(crate::pipeline::identity::ce::SPECVERSION, "1.0")
            .attribute(crate::pipeline::identity::ce::SOURCE, source)
            .attribute(crate::pipeline::identity::ce::ID, id)
            .attribute(crate::pipeline::identity::ce::TYPE, event_type)
    }
}

/// Queue settings.
#[derive(Clone, Debug)]
pub struct QueueOptions {
    /// How long a received message stays invisible (default 30 s).
    pub visibility_timeout: Duration,
    /// Receives after which a message moves to the dead-letter list (default 5; `None`: never).
    pub max_receive_count: Option<u32>,
    /// How long a receive waits for a message (default 0: return at once).
    pub wait: Duration,
    /// A simulated network round trip added to every call a worker makes on the queue: each receive, ack,
    /// release, dead-letter and lease renewal takes this long (default zero). Benchmarks set it so that their
    /// figures include what a broker over a network costs; [`MemoryQueue::receive_now`] and the queue's own
    /// inspection methods never wait.
    pub round_trip: Duration,
}

impl QueueOptions {
    /// Sets the visibility timeout.
    pub fn visibility_timeout(mut self, d: Duration) -> Self {
        self.visibility_timeout = d;
        self
    }
    /// Sets the receive count after which a message is dead-lettered (`None`: never).
    pub fn max_receive_count(mut self, n: Option<u32>) -> Self {
        self.max_receive_count = n;
        self
    }
    /// Sets how long a receive waits for a message.
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }
    /// Sets the simulated round trip of every call on the queue.
    pub fn round_trip(mut self, d: Duration) -> Self {
        self.round_trip = d;
        self
    }
}

impl Default for QueueOptions {
    fn default() -> Self {
        Self {
            visibility_timeout: Duration::from_secs(30),
            max_receive_count: Some(5),
            wait: Duration::ZERO,
            round_trip: Duration::ZERO,
        }
    }
}

/// A fault injected into the next ack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleFault {
    /// The ack fails and does nothing.
    Fail,
    /// The ack takes effect but its response is lost: the caller sees an error.
    DropResponse,
}

/// Counts of a queue's messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueState {
    /// Messages that can be received now.
    pub visible: usize,
    /// Messages received and not settled whose visibility has not expired.
    pub in_flight: usize,
    /// Messages waiting for a future visibility (released with a delay) are counted here too.
    pub delayed: usize,
    /// Dead-lettered messages.
    pub dead_lettered: usize,
}

impl std::fmt::Display for QueueState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "visible={} in_flight={} dlq={}",
            self.visible + self.delayed,
            self.in_flight,
            self.dead_lettered
        )
    }
}

#[derive(Debug)]
struct Stored {
    seq: u64,
    msg: OutgoingMessage,
    enqueued_at: DateTime<Utc>,
    receive_count: u32,
    invisible_until: Option<DateTime<Utc>>,
    /// Set while received; `None` when released.
    receipt: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    offset: chrono::Duration,
    /// Set by [`MemoryQueue::freeze_clock`]: the wall-clock instant the queue's time stays at.
    frozen: Option<DateTime<Utc>>,
    next_seq: u64,
    next_receipt: u64,
    messages: VecDeque<Stored>,
    dead: Vec<(OutgoingMessage, DeadLetter)>,
    faults: VecDeque<SettleFault>,
    in_flight_max: usize,
    /// Simulated round trips waited, and their total length as the callers saw it.
    trips: u64,
    trips_total: Duration,
}

impl State {
    fn now(&self) -> DateTime<Utc> {
        self.frozen.unwrap_or_else(Utc::now) + self.offset
    }
}

#[derive(Debug)]
struct Inner {
    opts: QueueOptions,
    state: Mutex<State>,
    notify: Notify,
}

/// A handle to one in-memory queue. Clones share the queue.
#[derive(Clone, Debug)]
pub struct MemoryQueue {
    inner: Arc<Inner>,
}

impl Default for MemoryQueue {
    fn default() -> Self {
        Self::new(QueueOptions::default())
    }
}

fn to_chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

impl MemoryQueue {
    /// A new empty queue.
    pub fn new(opts: QueueOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                opts,
                state: Mutex::new(State::default()),
                notify: Notify::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The simulated network round trip of one call.
    async fn round_trip(&self) {
        let rt = self.inner.opts.round_trip;
        if !rt.is_zero() {
            let start = std::time::Instant::now();
            exact_delay(rt).await;
            let took = start.elapsed();
            let mut s = self.lock();
            s.trips += 1;
            s.trips_total += took;
        }
    }

    /// Sends a message.
    pub fn send(&self, msg: OutgoingMessage) {
        let mut s = self.lock();
        s.next_seq += 1;
        let stored = Stored {
            seq: s.next_seq,
            msg,
            enqueued_at: s.now(),
            receive_count: 0,
            invisible_until: None,
            receipt: None,
        };
        s.messages.push_back(stored);
        drop(s);
        self.inner.notify.notify_waiters();
    }

    /// Moves the queue's clock forward (visibility expiry, delays).
    pub fn advance(&self, d: Duration) {
        let mut s = self.lock();
        s.offset += to_chrono(d);
        drop(s);
        self.inner.notify.notify_waiters();
    }

    /// Stops the queue's clock from following the wall clock: from now on only [`MemoryQueue::advance`]
    /// moves it. A test that checks a delay to the millisecond needs this, since the wall clock moves on
    /// between a release and the receive that follows it, by more than a millisecond on a loaded machine.
    pub fn freeze_clock(&self) {
        let mut s = self.lock();
        if s.frozen.is_none() {
            s.frozen = Some(Utc::now());
        }
    }

    /// The queue's current time (wall clock, or the instant [`MemoryQueue::freeze_clock`] kept, plus what
    /// [`MemoryQueue::advance`] added).
    pub fn now(&self) -> DateTime<Utc> {
        self.lock().now()
    }

    /// Makes the next ack fail in the given way.
    pub fn inject_ack_fault(&self, fault: SettleFault) {
        self.lock().faults.push_back(fault);
    }

    /// Counts of the queue's messages.
    pub fn state(&self) -> QueueState {
        let s = self.lock();
        let now = s.now();
        let mut st = QueueState {
            dead_lettered: s.dead.len(),
            ..QueueState::default()
        };
        for m in &s.messages {
            match (m.invisible_until, m.receipt) {
                (Some(t), Some(_)) if t > now => st.in_flight += 1,
                (Some(t), None) if t > now => st.delayed += 1,
                _ => st.visible += 1,
            }
        }
        st
    }

    /// The most messages in flight at once since the queue was made: what its consumers held out of the
    /// queue at their busiest (received, not yet settled, visibility not expired). A message is in flight from
    /// the moment a receive takes it until its settle reaches the queue, round trips included.
    pub fn in_flight_max(&self) -> usize {
        self.lock().in_flight_max
    }

    /// How long the simulated round trips lasted on average, as the calls waiting on them saw it (from the
    /// start of the wait to the task running again); `None` before the first, or with no round trip set.
    pub fn round_trip_mean(&self) -> Option<Duration> {
        let s = self.lock();
        (s.trips > 0).then(|| {
            let nanos = s.trips_total.as_nanos() / u128::from(s.trips);
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        })
    }

    /// The dead-lettered messages with their reasons.
    pub fn dead_letters(&self) -> Vec<(OutgoingMessage, DeadLetter)> {
        self.lock().dead.clone()
    }

    /// Moves up to `max` dead-lettered messages back to the queue, identity attributes intact, receive count
    /// reset. Returns how many moved.
    pub fn redrive(&self, max: usize) -> usize {
        let mut s = self.lock();
        let n = max.min(s.dead.len());
        let moved: Vec<_> = s.dead.drain(..n).collect();
        for (mut msg, _) in moved {
            msg.attributes.insert(
                crate::broker::dead_letter::REDRIVEN_FROM.to_owned(),
                "memory-dlq".to_owned(),
            );
            s.next_seq += 1;
            let stored = Stored {
                seq: s.next_seq,
                msg,
                enqueued_at: s.now(),
                receive_count: 0,
                invisible_until: None,
                receipt: None,
            };
            s.messages.push_back(stored);
        }
        drop(s);
        metrics::counter!(crate::metrics::REDRIVE_MOVED, "queue" => "memory").increment(n as u64);
        self.inner.notify.notify_waiters();
        n
    }

    /// Receives up to `max` messages now, without waiting.
    pub fn receive_now(&self, max: usize) -> Vec<MemoryDelivery> {
        let mut s = self.lock();
        let now = s.now();
        let vt = to_chrono(self.inner.opts.visibility_timeout);
        let mut out = Vec::new();
        let mut in_flight = 0;
        let mut busy_groups: HashSet<String> = HashSet::new();
        for m in &s.messages {
            if m.receipt.is_some() && m.invisible_until.is_some_and(|t| t > now) {
                in_flight += 1;
                busy_groups.extend(m.msg.group_id.clone());
            }
        }
        let mut i = 0;
        while i < s.messages.len() && out.len() < max {
            let visible = s.messages[i].invisible_until.is_none_or(|t| t <= now);
            let group = s.messages[i].msg.group_id.clone();
            if !visible || group.as_ref().is_some_and(|g| busy_groups.contains(g)) {
                if let Some(g) = group {
                    busy_groups.insert(g);
                }
                i += 1;
                continue;
            }
            if let Some(max_rc) = self.inner.opts.max_receive_count {
                if s.messages[i].receive_count >= max_rc {
                    if let Some(m) = s.messages.remove(i) {
                        let why = DeadLetter::new(
                            "max_receive_count_exceeded",
                            format!("received {} times", m.receive_count),
                        );
                        s.dead.push((m.msg, why));
                    }
                    continue;
                }
            }
            s.next_receipt += 1;
            let receipt = s.next_receipt;
            let m = &mut s.messages[i];
            m.receive_count += 1;
            m.receipt = Some(receipt);
            m.invisible_until = Some(now + vt);
            if let Some(g) = &m.msg.group_id {
                busy_groups.insert(g.clone());
            }
            let mut rm = ReceivedMessage::new(m.msg.body.clone());
            rm.attributes = m.msg.attributes.clone();
            rm.producer_id = m.msg.producer_id.clone();
            rm.broker_id = Some(format!("mem-{}", m.seq));
            rm.delivery_count = m.receive_count;
            rm.enqueued_at = Some(m.enqueued_at);
            rm.received_at = now;
            rm.group_id = m.msg.group_id.clone();
            out.push(MemoryDelivery {
                queue: self.clone(),
                seq: m.seq,
                receipt,
                message: rm,
                expires: Arc::new(Mutex::new(now + vt)),
            });
            i += 1;
        }
        // In flight only grows on a receive: its high-water mark is reached right after one.
        s.in_flight_max = s.in_flight_max.max(in_flight + out.len());
        out
    }

    /// A [`Receiver`] on this queue that waits up to the queue's `wait` for messages.
    pub fn receiver(&self) -> MemoryReceiver {
        MemoryReceiver {
            queue: self.clone(),
        }
    }

    /// Runs `f` on the received message identified by `seq`/`receipt` if the receipt is still current and
    /// unexpired; otherwise the lock is lost.
    fn with_current<T>(
        &self,
        seq: u64,
        receipt: u64,
        f: impl FnOnce(&mut State, usize, DateTime<Utc>) -> T,
    ) -> Result<T, BrokerError> {
        let mut s = self.lock();
        let now = s.now();
        let idx = s.messages.iter().position(|m| m.seq == seq);
        match idx {
            Some(i)
                if s.messages[i].receipt == Some(receipt)
                    && s.messages[i].invisible_until.is_some_and(|t| t > now) =>
            {
                Ok(f(&mut s, i, now))
            }
            _ => Err(BrokerError::new(
                BrokerErrorKind::LockLost,
                "settle",
                format!("receipt {receipt} for message {seq} is no longer current"),
            )),
        }
    }
}
