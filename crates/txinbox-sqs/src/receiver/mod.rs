//! Receiving, settling and the visibility heartbeat.

mod deleter;
mod delivery;
mod message;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName, QueueAttributeName};
use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use txinbox_core::{BrokerError, BrokerErrorKind, Receiver};

use crate::dlq;
use crate::error::sdk_error;
use crate::options::SqsOptions;
use crate::options::MAX_VISIBILITY;

pub(crate) use deleter::delete_one;
use deleter::{run_deleter, DeleteRequest};
pub use delivery::{SqsDelivery, SqsLease};
pub use message::{deduplication_id_replaced, received_message};

/// What every delivery of one receiver shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) client: aws_sdk_sqs::Client,
    pub(crate) queue_url: String,
    pub(crate) opts: SqsOptions,
    pub(crate) dead_letter_queue: Option<String>,
    deletes: mpsc::UnboundedSender<DeleteRequest>,
    /// Whether the queue is FIFO: only there does a message group mean an order (in a standard queue, a
    /// group makes a fair queue, whose messages of one group may be processed in parallel).
    pub(crate) fifo: bool,
}

impl Shared {
    /// The group a message of this queue must keep the order of: its `MessageGroupId` on a FIFO queue.
    pub(crate) fn ordered_group(&self, m: &Message) -> Option<String> {
        if self.fifo {
            group_of(m)
        } else {
            None
        }
    }

    /// Sets the visibility of a message the receiver holds to `seconds` from now.
    async fn held_visibility(&self, m: &Message, seconds: i32) -> Result<(), BrokerError> {
        self.client
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(m.receipt_handle().unwrap_or_default())
            .visibility_timeout(seconds)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("ChangeMessageVisibility", e))
    }
}

/// FIFO groups whose delivery, handed out by one receiver (one receive loop: each [`fork`](Receiver::fork) has
/// its own), was released or left to its visibility timeout since that receiver's last receive: the message
/// comes back, so the messages of its group that receiver holds must not go before it. Only the receiver that
/// handed the delivery out can hold its group's later messages (it holds a message only while it has one of
/// its group out), so the notice goes to it alone: shared by every fork, it was taken by whichever received
/// first, and lost when that one held nothing of the group.
#[derive(Debug, Clone, Default)]
pub(crate) struct Returning(Arc<std::sync::Mutex<Vec<String>>>);

impl Returning {
    /// Notes that the delivery of FIFO group `group` comes back.
    pub(crate) fn push(&self, group: Option<&str>) {
        if let Some(g) = group {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(g.to_owned());
        }
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Forgets the notices of `group`.
    fn discard(&self, group: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|g| g != group);
    }
}

/// Receives from one SQS queue (FIFO or standard) and hands out [`SqsDelivery`]s.
///
/// Deletes of settled deliveries go through one background task that sends a `DeleteMessageBatch` when
/// several are ready at once and a `DeleteMessage` otherwise.
///
/// FIFO group order is kept: SQS may return several messages of one group in one batch; the receiver hands
/// out only the first and holds the others until the one before settles, so a worker with any concurrency
/// processes a group in order. A held message's visibility is extended in the background every third of it
/// (as a delivery's lease is), however long the one before it takes and whether or not the worker receives
/// meanwhile: run out in the receiver, it would be received again, one more receive toward the queue's
/// `maxReceiveCount`, and a group whose messages each outlast the visibility timeout would send its later
/// messages to the dead-letter queue unprocessed.
///
/// A receive may ask for more than one `ReceiveMessage` returns ([`SqsOptions::batch_size`], at most 10): when
/// the last receive came back full (the queue has a backlog) the receiver sends as many calls as it takes at
/// once, one long poll and the others without a wait, and hands out what they brought together (at most
/// [`MAX_CALLS_PER_RECEIVE`] calls; each delivery's visibility is counted from when its own call was sent).
/// Otherwise it sends one call, so an idle queue costs one long poll per wait.
#[derive(Debug)]
pub struct SqsReceiver {
    shared: Arc<Shared>,
    /// Messages received while an earlier message of their group was in flight, in arrival order, each with
    /// the task that extends its visibility while it is held.
    held: VecDeque<Held>,
    /// What keeps each FIFO group busy here: its last delivery handed out, or a message of it left to SQS
    /// (see [`Busy`]).
    in_flight: HashMap<String, Busy>,
    /// The groups of this receiver's deliveries that come back.
    returning: Returning,
    /// Whether the last receive came back full: the next may send several calls at once.
    backlog: bool,
}

/// What keeps a FIFO group busy in a receiver: SQS hands out no later message of the group while one is in
/// flight, and neither does the receiver. AWS (SQS Developer Guide, "Interleaving multiple ordered message
/// groups"): "When a message with a specific MessageGroupId is being processed and is invisible, no other
/// consumer can process messages from that same group until the visibility timeout expires or the message is
/// deleted."
#[derive(Debug)]
enum Busy {
    /// The group's last delivery handed out: busy until it settles or its visibility has run out however late
    /// SQS started it ([`SqsLease::latest_end`]; what is held of the group then goes back to SQS, behind it).
    /// Dropped unsettled (its processing panicked or was abandoned), it is no longer renewed, and SQS holds
    /// the message in flight until that end all the same: the lease is kept here for it.
    Delivery(Arc<SqsLease>),
    /// A message of the group the receiver did not hand out and left to SQS: one that came without a receipt
    /// handle (it can be neither settled nor extended), or a held one whose visibility could not be extended.
    /// SQS keeps it in flight until at latest `until`, then hands it out again, first of its group: until then
    /// the group's later messages wait here, and then what is held of the group goes back to SQS, behind it.
    LeftToSqs { until: DateTime<Utc> },
}

/// Most `ReceiveMessage` calls one receive sends at once (100 messages).
pub const MAX_CALLS_PER_RECEIVE: usize = 10;

impl SqsReceiver {
    /// A receiver on `queue_url`. Checks the options (an invalid one is a
    /// [`Configuration`](BrokerErrorKind::Configuration) error whose source is the
    /// [`SqsError`](crate::SqsError)) and that the queue exists; when no dead-letter queue is
    /// configured, it is discovered from the queue's `RedrivePolicy`. Call within a Tokio runtime.
    pub async fn connect(
        client: aws_sdk_sqs::Client,
        queue_url: impl Into<String>,
        opts: SqsOptions,
    ) -> Result<Self, BrokerError> {
        opts.validate()
            .map_err(|e| e.broker(BrokerErrorKind::Configuration, "connect"))?;
        let queue_url = queue_url.into();
        let attrs = client
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .send()
            .await
            .map_err(|e| sdk_error("GetQueueAttributes", e))?;
        let dead_letter_queue = match &opts.dead_letter_queue {
            Some(url) => Some(url.clone()),
            None => match attrs
                .attributes()
                .and_then(|a| a.get(&QueueAttributeName::RedrivePolicy))
            {
                Some(policy) => dlq::queue_url_of_redrive_policy(&client, policy).await?,
                None => None,
            },
        };
        if dead_letter_queue.is_none() {
            tracing::warn!(queue_url, "no dead-letter queue: payload collisions and permanent errors are released and reach a DLQ only through the queue's maxReceiveCount");
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_deleter(client.clone(), queue_url.clone(), rx));
        Ok(Self {
            shared: Arc::new(Shared {
                client,
                fifo: crate::dlq::is_fifo(&queue_url),
                queue_url,
                opts,
                dead_letter_queue,
                deletes: tx,
            }),
            held: VecDeque::new(),
            in_flight: HashMap::new(),
            returning: Returning::default(),
            backlog: false,
        })
    }

    /// The queue URL.
    pub fn queue_url(&self) -> &str {
        &self.shared.queue_url
    }

    /// The dead-letter queue explicit forwards go to, if any.
    pub fn dead_letter_queue(&self) -> Option<&str> {
        self.shared.dead_letter_queue.as_deref()
    }

    /// The options.
    pub fn options(&self) -> &SqsOptions {
        &self.shared.opts
    }
}

impl Receiver for SqsReceiver {
    type Delivery = SqsDelivery;

    /// A receiver on the same queue sharing the client and the background deleter, with its own held-back
    /// messages: SQS hands a FIFO group's next message to no receive while one of the group is in flight, so
    /// each loop holds back only what its own receives brought.
    fn fork(&self) -> Option<Self> {
        Some(Self {
            shared: self.shared.clone(),
            held: VecDeque::new(),
            in_flight: HashMap::new(),
            returning: Returning::default(),
            backlog: false,
        })
    }

    async fn receive(&mut self, max: usize) -> Result<Vec<SqsDelivery>, BrokerError> {
        let per_call = self.shared.opts.batch_size.clamp(1, 10);
        let n = max.clamp(1, per_call * MAX_CALLS_PER_RECEIVE);
        let now = Utc::now();
        // A group whose delivery is still out but whose visibility has run out (its heartbeat failed): SQS
        // makes that message visible again, and hands it out first once the messages of its group held here
        // go back; handed out from here, they could be applied before it, its handler still running. So too
        // a group whose message left to SQS (no receipt handle, an extension that failed) comes back now.
        let mut ran_out = Vec::new();
        self.in_flight.retain(|group, busy| {
            let end = match busy {
                Busy::Delivery(l) if l.settled.load(Ordering::SeqCst) => return false,
                Busy::Delivery(l) => l.latest_end(),
                Busy::LeftToSqs { until } => *until,
            };
            let out = end > now;
            if !out {
                ran_out.push(group.clone());
            }
            out
        });
        for g in &ran_out {
            self.returning.push(Some(g));
        }
        self.give_back_returning_groups().await;
        let mut out = self.release_held(n).await;
        if !out.is_empty() {
            return Ok(out);
        }
        let s = self.shared.clone();
        // While messages are held, poll briefly so they are handed out soon after their predecessor settles.
        let wait = if self.held.is_empty() {
            s.opts.wait
        } else {
            s.opts.wait.min(Duration::from_secs(1))
        };
        // One long poll; with a backlog, the rest of `n` in calls that do not wait, all at once.
        let calls = if self.backlog {
            n.div_ceil(per_call)
        } else {
            1
        };
        let asks = (0..calls).map(|i| {
            let ask = (n - i * per_call).min(per_call);
            let wait = if i == 0 { wait } else { Duration::ZERO };
            let s = s.clone();
            // Each call's own time: a message's visibility and its 12 h ceiling run from when the call that
            // brought it was sent, not from the slowest call of the receive (the long poll can wait its whole
            // wait while the calls beside it answered at once).
            async move { timed(receive_call(&s, ask, wait)).await }
        });
        let answers = futures::future::join_all(asks).await;
        let mut first_error = None;
        let mut got = Vec::new();
        let mut full = false;
        for (received, a) in answers {
            match a {
                Ok(a) => {
                    let msgs = a.messages.unwrap_or_default();
                    full |= msgs.len() >= per_call;
                    got.extend(msgs.into_iter().map(|m| (m, received)));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a ReceiveMessage call of a receive failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        self.backlog = full;
        if let Some(e) = first_error {
            if got.is_empty() {
                return Err(e);
            }
            // What the other calls brought is handed out; the next receive reports a lasting failure.
            tracing::warn!(queue_url = %s.queue_url, error = %e, received = got.len(), "one ReceiveMessage call of a receive failed");
        }
        for (m, received) in got {
            let group = s.ordered_group(&m);
            if let Some(g) = &group {
                self.free_if_settled(g);
            }
            if group
                .as_ref()
                .is_some_and(|g| self.in_flight.contains_key(g))
            {
                self.held.push_back(Held::new(s.clone(), m, received));
                continue;
            }
            self.hand_out(m, received, &mut out);
        }
        Ok(out)
    }

    /// `GetQueueAttributes` on the queue (it exists; the credentials are accepted and allowed to read it) and
    /// on the dead-letter queue explicit forwards go to; then the dead-letter path: a dead-letter queue (set,
    /// or the queue's `RedrivePolicy`), else refused ([`Configuration`](BrokerErrorKind::Configuration), a
    /// [`SqsError::NoDeadLetterPath`](crate::SqsError::NoDeadLetterPath)) unless
    /// [`SqsOptions::allow_no_dead_letter`]. Takes no message.
    async fn check(&mut self) -> Result<(), BrokerError> {
        let s = self.shared.clone();
        // One attribute of `url`, read as the start-up check: its failure names the queue's role and URL.
        let read = |role: &'static str, url: String, name: QueueAttributeName| {
            let client = s.client.clone();
            async move {
                client
                    .get_queue_attributes()
                    .queue_url(&url)
                    .attribute_names(name)
                    .send()
                    .await
                    .map_err(|e| {
                        let e = sdk_error("GetQueueAttributes", e);
                        let kind = e.kind();
                        let why = crate::SqsError::Unusable {
                            role,
                            queue_url: url.clone(),
                            error: e.to_string(),
                        };
                        BrokerError::new(kind, "start-up check", why)
                    })
            }
        };
        let attrs = read(
            "queue",
            s.queue_url.clone(),
            QueueAttributeName::RedrivePolicy,
        )
        .await?;
        let redrive_policy = attrs
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::RedrivePolicy))
            .is_some_and(|p| !p.trim().is_empty());
        if let Some(dlq) = &s.dead_letter_queue {
            read(
                "dead-letter queue",
                dlq.clone(),
                QueueAttributeName::QueueArn,
            )
            .await?;
        } else if !redrive_policy {
            if !s.opts.allow_no_dead_letter {
                return Err(crate::SqsError::NoDeadLetterPath {
                    queue_url: s.queue_url.clone(),
                }
                .broker(BrokerErrorKind::Configuration, "start-up check"));
            }
            tracing::warn!(queue_url = %s.queue_url, "no dead-letter path (allowed by SqsOptions::allow_no_dead_letter): a payload collision or a permanent error comes back once per visibility timeout, forever");
        }
        Ok(())
    }
}

/// Attempts of one FIFO `ReceiveMessage` call whose answer did not come (the first included).
const RECEIVE_ATTEMPTS: u32 = 3;

/// One `ReceiveMessage` call. On a FIFO queue it carries a `ReceiveRequestAttemptId` of its own and, when no
/// answer comes (a transport failure, a timeout) or SQS answers a server error, is sent again with the same
/// id, at most [`RECEIVE_ATTEMPTS`] times. AWS (`ReceiveMessage`): "If a networking issue occurs after a
/// ReceiveMessage action, and instead of a response you receive a generic error, it is possible to retry the
/// same action with an identical ReceiveRequestAttemptId to retrieve the same set of messages, even if their
/// visibility timeout has not yet expired." Without it the messages a lost answer brought stay in flight for
/// their visibility timeout, and hold back their groups. The SDK's own retries are off for these calls, since
/// it would also resend a throttled call with the same id, which SQS refuses ("The receiveRequestAttemptId is
/// not valid anymore since the receive call is not retryable"): a throttled receive is returned (the worker
/// backs off) and the next receive has a new id. A standard queue ignores the id and keeps the SDK's retries.
async fn receive_call(
    s: &Shared,
    ask: usize,
    wait: Duration,
) -> Result<aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput, BrokerError> {
    let call = || {
        s.client
            .receive_message()
            .queue_url(&s.queue_url)
            .max_number_of_messages(ask as i32)
            .wait_time_seconds(wait.as_secs() as i32)
            .visibility_timeout(secs(s.opts.visibility_timeout))
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
    };
    if !s.fifo {
        return call()
            .send()
            .await
            .map_err(|e| sdk_error("ReceiveMessage", e));
    }
    let attempt_id = uuid::Uuid::new_v4().to_string();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let r = call()
            .receive_request_attempt_id(&attempt_id)
            .customize()
            .config_override(
                aws_sdk_sqs::config::Builder::default()
                    .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled()),
            )
            .send()
            .await
            .map_err(|e| sdk_error("ReceiveMessage", e));
        match r {
            Err(e)
                if attempt < RECEIVE_ATTEMPTS
                    && matches!(
                        e.kind(),
                        BrokerErrorKind::OutcomeUnknown | BrokerErrorKind::ServerError
                    ) =>
            {
                tracing::debug!(error = %e, attempt, "ReceiveMessage got no answer; sending it again with the same ReceiveRequestAttemptId");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
            r => return r,
        }
    }
}

fn group_of(m: &Message) -> Option<String> {
    m.attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .cloned()
}

/// A message held behind an earlier one of its FIFO group, and the task extending its visibility meanwhile.
#[derive(Debug)]
struct Held {
    message: Message,
    /// When its times run from, moved on by each extension.
    received: Arc<std::sync::Mutex<Received>>,
    /// Stops the extensions (dropped: stops them too).
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    keeper: Option<tokio::task::JoinHandle<()>>,
}

impl Held {
    fn new(shared: Arc<Shared>, message: Message, received: Received) -> Self {
        let times = Arc::new(std::sync::Mutex::new(received));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let receipt = message.receipt_handle().unwrap_or_default().to_owned();
        let keeper = tokio::spawn(keep_held(shared, receipt, times.clone(), stopped));
        Self {
            message,
            received: times,
            stop: Some(stop),
            keeper: Some(keeper),
        }
    }

    /// The message and its times, once its extensions have stopped (one in flight is let finish, so the
    /// times say when the last extension that may have reached SQS was sent).
    async fn take(mut self) -> (Message, Received) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.await;
        }
        let received = *self.received.lock().unwrap_or_else(|p| p.into_inner());
        (
            std::mem::replace(&mut self.message, Message::builder().build()),
            received,
        )
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(keeper) = self.keeper.take() {
            keeper.abort();
        }
    }
}

/// Extends the visibility of a held message by the visibility timeout every third of it, as a delivery's
/// lease keeper does, until stopped, until SQS says the receipt is gone, or until its 12 h ceiling leaves less
/// than a whole visibility timeout (the message then comes back by itself, and the receiver leaves it to SQS).
/// A transient failure is tried again while the visibility lasts.
async fn keep_held(
    shared: Arc<Shared>,
    receipt: String,
    times: Arc<std::sync::Mutex<Received>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let vt = shared.opts.visibility_timeout;
    let get = || *times.lock().unwrap_or_else(|p| p.into_inner());
    let mut next = tokio::time::Instant::from_std(get().visible_from) + vt / 3;
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        let current = get();
        let by = visibility_allowed(current.at.elapsed(), vt);
        if by < vt || current.visible_from.elapsed() + Duration::from_secs(1) >= vt {
            return;
        }
        // SQS counts the new visibility from when the call reaches it (see `release_held`).
        let asked = Instant::now();
        let r = shared
            .client
            .change_message_visibility()
            .queue_url(&shared.queue_url)
            .receipt_handle(&receipt)
            .visibility_timeout(secs(by))
            .send()
            .await
            .map_err(|e| sdk_error("ChangeMessageVisibility", e));
        match r {
            Ok(_) => {
                let mut t = times.lock().unwrap_or_else(|p| p.into_inner());
                t.visible_from = asked;
                t.visible_by = Instant::now();
                next = tokio::time::Instant::from_std(asked) + vt / 3;
            }
            Err(e) if e.is_retryable() => {
                tracing::debug!(error = %e, "cannot extend a held message yet; trying again");
                next = tokio::time::Instant::now() + (vt / 6).min(Duration::from_secs(1));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot extend a held message; leaving it to SQS");
                return;
            }
        }
    }
}

impl SqsReceiver {
    /// Frees `group` when its delivery settled after this receive looked at the groups in flight (during its long
    /// poll) and nothing of the group is held: the poll can bring back the very message that delivery released
    /// (a retry's backoff shorter than the poll's wait), which is then first of its group. Held here behind its
    /// own earlier delivery, it went back to SQS at the next receive and came back once more: a receive counted
    /// toward `maxReceiveCount` with no attempt made, so a message reached the dead-letter queue after fewer
    /// attempts than the queue allows. The release's notice goes with it: nothing of the group was held before
    /// it, and what the same poll brings behind the message is held behind it, not given back.
    fn free_if_settled(&mut self, group: &str) {
        let settled = matches!(
            self.in_flight.get(group),
            Some(Busy::Delivery(l)) if l.settled.load(Ordering::SeqCst)
        );
        if settled
            && !self
                .held
                .iter()
                .any(|h| group_of(&h.message).as_deref() == Some(group))
        {
            self.in_flight.remove(group);
            self.returning.discard(group);
        }
    }

    /// The held messages of a group whose delivery was released (or left to its visibility timeout) go back
    /// to SQS at once: that message comes back, and SQS hands out none of its group before it. AWS: "Inflight
    /// messages block delivery of available messages within the same message group." Handing them out here
    /// would let a later message of the group go first.
    async fn give_back_returning_groups(&mut self) {
        let groups = self.returning.take();
        if groups.is_empty() {
            return;
        }
        let mut kept = VecDeque::with_capacity(self.held.len());
        for held in std::mem::take(&mut self.held) {
            if !group_of(&held.message).is_some_and(|g| groups.contains(&g)) {
                kept.push_back(held);
                continue;
            }
            // Its extension stopped first: one landing after the give-back would hide it again.
            let (m, _) = held.take().await;
            if let Err(e) = self.shared.held_visibility(&m, 0).await {
                // It comes back when its visibility runs out, behind the message of its group that returns.
                tracing::warn!(error = %e, "cannot give back a held message; it returns with its visibility timeout");
            }
        }
        self.held = kept;
    }

    fn hand_out(&mut self, m: Message, received: Received, out: &mut Vec<SqsDelivery>) {
        let group = self.shared.ordered_group(&m);
        let returning = self.returning.clone();
        match SqsDelivery::from_message(self.shared.clone(), returning, m, received, Utc::now()) {
            Ok(d) => {
                if let Some(g) = group {
                    self.in_flight.insert(g, Busy::Delivery(d.lease.clone()));
                }
                out.push(d);
            }
            Err(e) => {
                // It cannot be settled, but SQS holds it in flight all the same, and its group behind it.
                tracing::warn!(error = %e, group = group.as_deref().unwrap_or(""), "skipping a message SQS returned without a receipt handle; it comes back after its visibility timeout");
                self.left_to_sqs(group, received);
            }
        }
    }

    /// Marks the FIFO group `group` busy until the visibility of its message left to SQS, whose times are
    /// `received`, has run out at the latest (counted from when the answer that started it arrived).
    fn left_to_sqs(&mut self, group: Option<String>, received: Received) {
        let Some(g) = group else {
            return;
        };
        let vt =
            chrono::Duration::from_std(self.shared.opts.visibility_timeout).unwrap_or_default();
        let since = chrono::Duration::from_std(received.visible_by.elapsed()).unwrap_or_default();
        let until = Utc::now() - since + vt;
        self.in_flight.insert(g, Busy::LeftToSqs { until });
    }

    /// Hands out held messages whose group is free, first of each group only, at most `n`.
    async fn release_held(&mut self, n: usize) -> Vec<SqsDelivery> {
        let mut out = Vec::new();
        let vt = self.shared.opts.visibility_timeout;
        let mut i = 0;
        while i < self.held.len() && out.len() < n {
            let group = self.shared.ordered_group(&self.held[i].message);
            if group
                .as_ref()
                .is_some_and(|g| self.in_flight.contains_key(g))
            {
                i += 1;
                continue;
            }
            let Some(held) = self.held.remove(i) else {
                break;
            };
            let (m, received) = held.take().await;
            let waited = received.visible_from.elapsed();
            if waited + Duration::from_secs(1) >= vt {
                // Its visibility ran out while held: SQS hands it out again, still first of its group.
                tracing::warn!(
                    group = group.as_deref().unwrap_or(""),
                    "held message's visibility expired; leaving it to SQS"
                );
                self.left_to_sqs(group, received);
                continue;
            }
            let mut received = received;
            // Normally extended while held (`keep_held`); this covers a held message whose extension failed.
            if waited >= vt / 2 {
                // Within SQS's ceiling, which counts from the receive, not from this extension. Less than a
                // whole visibility timeout left: handed out, its lease would say it lasts the whole of it
                // (and the worker's lease keeper counts it so) after SQS had made it visible again. Left to
                // SQS, as `keep_held` leaves it, it comes back by itself, to a new receive and a new ceiling.
                // AWS (`ChangeMessageVisibility`): "If you attempt to set the VisibilityTimeout to an amount
                // more than the maximum time left, Amazon SQS returns an error. It will not automatically
                // recalculate and increase the timeout to the maximum time remaining."
                let by = visibility_allowed(received.at.elapsed(), vt);
                if by < Duration::from_secs(vt.as_secs()) {
                    tracing::warn!(
                        group = group.as_deref().unwrap_or(""),
                        "held message reached SQS's 12 h visibility ceiling; leaving it to SQS"
                    );
                    self.left_to_sqs(group, received);
                    continue;
                }
                // SQS counts the new visibility from when the call reaches it: after it was sent, before
                // its answer arrives (AWS, `ChangeMessageVisibility`: "the 10 seconds begin to count from
                // the time that you make the ChangeMessageVisibility call").
                let asked = Instant::now();
                if let Err(e) = self.shared.held_visibility(&m, secs(by)).await {
                    tracing::warn!(error = %e, "cannot extend a held message; leaving it to SQS");
                    self.left_to_sqs(group, received);
                    continue;
                }
                received.visible_from = asked;
                received.visible_by = Instant::now();
            }
            self.hand_out(m, received, &mut out);
        }
        out
    }
}

/// When a received message's times run from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Received {
    /// When the `ReceiveMessage` call that brought it was sent: SQS's 12 h ceiling on its visibility counts
    /// from its receive, however often it is extended, and the receive happened after this (the answer
    /// arrives later still, after a slow round trip possibly much later). AWS (`ChangeMessageVisibility`):
    /// "The maximum is 12 hours", "you can't extend the timeout of a message in an existing queue to more
    /// than a total visibility timeout of 12 hours", "If you try to extend the visibility timeout beyond
    /// the maximum, your request is rejected".
    pub(super) at: Instant,
    /// Where its current visibility is counted from: when the `ReceiveMessage` call was sent, or the last
    /// `ChangeMessageVisibility` while it was held. AWS (SQS Developer Guide, visibility timeout): "The
    /// visibility timeout begins when Amazon SQS returns a message", which is after the call was sent and
    /// before its answer arrives (a slow answer, a FIFO receive sent again with the same attempt id, arrive
    /// much later): counted from the answer, the lease would end after SQS had made the message visible to
    /// other receivers again. Counted from the request, it ends up to one round trip (for a long poll, up to
    /// its wait) before SQS's.
    pub(super) visible_from: Instant,
    /// The latest its current visibility can have started: when the answer that started it arrived. Only
    /// whether SQS may still hold the message invisible (its FIFO group busy) is counted from here.
    pub(super) visible_by: Instant,
}

impl Received {
    /// A receive sent at `sent` whose answer arrived at `answered`: its ceiling and its visibility count
    /// from `sent`.
    pub(super) fn new(sent: Instant, answered: Instant) -> Self {
        Self {
            at: sent,
            visible_from: sent,
            visible_by: answered,
        }
    }
}

/// Runs one `ReceiveMessage` call (with the attempts a FIFO receive sends again) and says when it was sent:
/// where the visibility, and the 12 h ceiling, of what it brings count from.
async fn timed<T>(call: impl std::future::Future<Output = T>) -> (Received, T) {
    let sent = Instant::now();
    let answer = call.await;
    (Received::new(sent, Instant::now()), answer)
}

/// How far short of SQS's 12 h ceiling the last extension stops: SQS counts the new visibility from when
/// the `ChangeMessageVisibility` call reaches it, later than when it was sent, and rejects one that
/// reaches beyond the ceiling.
const CEILING_MARGIN: Duration = Duration::from_secs(60);

/// The visibility SQS accepts now for a message whose `ReceiveMessage` call was sent `since_receive` ago:
/// at most `wanted`, in whole seconds, ending [`CEILING_MARGIN`] before the 12 h ceiling (zero when
/// nothing is left).
pub(super) fn visibility_allowed(since_receive: Duration, wanted: Duration) -> Duration {
    let left = MAX_VISIBILITY
        .saturating_sub(since_receive)
        .saturating_sub(CEILING_MARGIN);
    Duration::from_secs(wanted.min(left).as_secs())
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

/// What the unit tests of the receiver and of its deliveries share: moto and a queue to receive from.
#[cfg(test)]
pub(crate) mod test_support {
    use aws_sdk_sqs::types::QueueAttributeName;

    /// A client of moto (`TXINBOX_SQS_ENDPOINT`, see `scripts/moto.sh`).
    pub(crate) fn moto() -> aws_sdk_sqs::Client {
        let endpoint = std::env::var("TXINBOX_SQS_ENDPOINT").expect(
            "TXINBOX_SQS_ENDPOINT is not set: start moto with `eval \"$(bash scripts/moto.sh start)\"`",
        );
        crate::emulator_client(&endpoint)
    }

    /// A fresh FIFO queue `{prefix}-<random>.fifo` holding one message (`{}`, group `g-1`): its URL.
    pub(crate) async fn fifo_queue_with_one_message(
        c: &aws_sdk_sqs::Client,
        prefix: &str,
    ) -> String {
        let name = format!(
            "{prefix}-{}.fifo",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let url = c
            .create_queue()
            .queue_name(name)
            .attributes(QueueAttributeName::FifoQueue, "true")
            .send()
            .await
            .expect("create queue")
            .queue_url
            .expect("queue url");
        c.send_message()
            .queue_url(&url)
            .message_body("{}")
            .message_group_id("g-1")
            .message_deduplication_id("d-1")
            .send()
            .await
            .expect("send");
        url
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{fifo_queue_with_one_message, moto};
    use super::*;
    use txinbox_core::Delivery;

    const H: Duration = Duration::from_secs(3600);
    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn the_last_extension_stops_short_of_the_ceiling() {
        // Far from the ceiling: the whole extension, in whole seconds.
        assert_eq!(
            visibility_allowed(H, Duration::from_millis(60_900)),
            Duration::from_secs(60)
        );
        // Near it: what is left, less the margin for the ChangeMessageVisibility call's own trip.
        assert_eq!(
            visibility_allowed(MAX_VISIBILITY - 5 * MIN, 10 * MIN),
            4 * MIN
        );
        // Within the margin: nothing (the lease ends; a call would be rejected).
        assert_eq!(
            visibility_allowed(MAX_VISIBILITY - Duration::from_secs(30), 10 * MIN),
            Duration::ZERO
        );
        assert_eq!(
            visibility_allowed(MAX_VISIBILITY + H, 10 * MIN),
            Duration::ZERO
        );
    }

    #[test]
    fn a_release_near_the_ceiling_is_capped_at_the_time_left() {
        // A 2 h backoff 11 h after the receive: what is left under the ceiling, not a flat 12 h.
        assert_eq!(visibility_allowed(11 * H, 2 * H), 59 * MIN);
        assert_eq!(
            visibility_allowed(Duration::ZERO, 13 * H),
            11 * H + 59 * MIN
        );
    }

    #[tokio::test]
    async fn the_ceiling_counts_from_when_the_receive_was_sent() {
        let before = Instant::now();
        let (received, ()) = timed(tokio::time::sleep(Duration::from_millis(50))).await;
        let start = received.at;
        let after = Instant::now();
        assert!(start >= before, "the start is not before the call");
        assert!(
            after.duration_since(start) >= Duration::from_millis(50),
            "the ceiling starts at the answer, not at the request: {:?} before the end",
            after.duration_since(start)
        );
        assert_eq!(
            received.visible_from, received.at,
            "the visibility counts from the request too"
        );
        assert!(
            received.visible_by >= received.visible_from + Duration::from_millis(50),
            "the latest start is the answer"
        );
    }

    /// Receives the message of `url` with its attributes and a visibility of `vt` seconds, when it is there.
    async fn raw_receive(c: &aws_sdk_sqs::Client, url: &str, vt: i32) -> Option<Message> {
        c.receive_message()
            .queue_url(url)
            .visibility_timeout(vt)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .expect("receive")
            .messages
            .unwrap_or_default()
            .pop()
    }

    /// A message held behind its group's delivery until less than a visibility timeout is left under SQS's
    /// 12 h ceiling (its extension while held failed): AWS (`ChangeMessageVisibility`): "If you attempt to set
    /// the VisibilityTimeout to an amount more than the maximum time left, Amazon SQS returns an error. It will
    /// not automatically recalculate and increase the timeout to the maximum time remaining." The receiver
    /// extended it by what was left and handed it out with a lease of a whole visibility timeout: the worker
    /// believed it held the message after SQS had made it visible again. It leaves it to SQS instead, as the
    /// heartbeat of a held message does, and the message comes back by itself (a new receive, a new ceiling).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_message_the_ceiling_cuts_short_is_not_handed_out_with_a_whole_lease() {
        let c = moto();
        let url = fifo_queue_with_one_message(&c, "held").await;
        let vt = Duration::from_secs(6);
        let m = raw_receive(&c, &url, 6).await.expect("the message");
        let mut r = SqsReceiver::connect(
            c.clone(),
            &url,
            SqsOptions::default()
                .visibility_timeout(vt)
                .wait(Duration::from_secs(1))
                .allow_no_dead_letter(true),
        )
        .await
        .expect("connect");
        // Held for 3.5 s of its 6 s (past half: extended on release), 4 s (and the last-minute margin) short
        // of its receive's ceiling: at most 3 s can be added.
        let now = Instant::now();
        let received = Received {
            at: now
                .checked_sub(MAX_VISIBILITY - CEILING_MARGIN - Duration::from_secs(4))
                .expect("an instant 12 h back"),
            visible_from: now - Duration::from_millis(3500),
            visible_by: now - Duration::from_millis(3500),
        };
        r.held
            .push_back(Held::new(r.shared.clone(), m.clone(), received));
        let first = r.receive(10).await.expect("receive");
        // When SQS hands the message out again, no lease of it may still say it is held.
        let mut again = None;
        for _ in 0..30 {
            if let Some(m) = raw_receive(&c, &url, 30).await {
                again = Some((m, Utc::now()));
                break;
            }
        }
        let (back, seen) = again.expect("the message comes back to SQS");
        assert_eq!(back.message_id(), m.message_id());
        for d in &first {
            let end = d.lease().and_then(|l| l.expires_at()).expect("an end");
            assert!(
                end <= seen,
                "handed out with a lease until {end}, but SQS handed the message out again at {seen}"
            );
        }
        for d in first {
            let _ = d.release(Duration::ZERO).await;
        }
    }
}
