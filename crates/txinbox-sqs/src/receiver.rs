//! Receiving, settling and the visibility heartbeat.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageAttributeValue, MessageSystemAttributeName,
    QueueAttributeName,
};
use chrono::{DateTime, TimeZone, Utc};
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};
use txinbox_core::{
    BrokerError, BrokerErrorKind, DeadLetter, Delivery, Lease, ReceivedMessage, Receiver,
};

use crate::dlq;
use crate::error::{sdk_error, BatchEntryError};
use crate::options::{SqsOptions, MAX_VISIBILITY};

/// What every delivery of one receiver shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) client: aws_sdk_sqs::Client,
    pub(crate) queue_url: String,
    pub(crate) opts: SqsOptions,
    pub(crate) dead_letter_queue: Option<String>,
    deletes: mpsc::UnboundedSender<DeleteRequest>,
}

#[derive(Debug)]
struct DeleteRequest {
    receipt: String,
    reply: oneshot::Sender<Result<(), BrokerError>>,
}

/// Receives from one SQS queue (FIFO or standard) and hands out [`SqsDelivery`]s.
///
/// Deletes of settled deliveries go through one background task that sends a `DeleteMessageBatch` when
/// several are ready at once and a `DeleteMessage` otherwise.
///
/// FIFO group order is kept: SQS may return several messages of one group in one batch; the receiver hands
/// out only the first and holds the others (renewing their visibility when needed) until the one before
/// settles, so a worker with any concurrency processes a group in order.
///
/// A receive may ask for more than one `ReceiveMessage` returns ([`SqsOptions::batch_size`], at most 10): when
/// the last receive came back full (the queue has a backlog) the receiver sends as many calls as it takes at
/// once, one long poll and the others without a wait, and hands out what they brought together (at most
/// [`MAX_CALLS_PER_RECEIVE`] calls). Otherwise it sends one call, so an idle queue costs one long poll per
/// wait.
#[derive(Debug)]
pub struct SqsReceiver {
    shared: Arc<Shared>,
    /// Messages received while an earlier message of their group was in flight, in arrival order.
    held: VecDeque<(Message, Instant)>,
    /// The last delivery handed out per group; the group is busy until it settles, is dropped unsettled (a
    /// crash) or its visibility runs out.
    in_flight: HashMap<String, Weak<SqsLease>>,
    /// Whether the last receive came back full: the next may send several calls at once.
    backlog: bool,
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
                queue_url,
                opts,
                dead_letter_queue,
                deletes: tx,
            }),
            held: VecDeque::new(),
            in_flight: HashMap::new(),
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
            backlog: false,
        })
    }

    async fn receive(&mut self, max: usize) -> Result<Vec<SqsDelivery>, BrokerError> {
        let per_call = self.shared.opts.batch_size.clamp(1, 10);
        let n = max.clamp(1, per_call * MAX_CALLS_PER_RECEIVE);
        let now = Utc::now();
        self.in_flight.retain(|_, lease| {
            lease
                .upgrade()
                .is_some_and(|l| !l.settled.load(Ordering::SeqCst) && l.current() > now)
        });
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
            s.client
                .receive_message()
                .queue_url(&s.queue_url)
                .max_number_of_messages(ask as i32)
                .wait_time_seconds(wait.as_secs() as i32)
                .visibility_timeout(secs(s.opts.visibility_timeout))
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
        });
        let answers = futures::future::join_all(asks).await;
        let received = Instant::now();
        let mut first_error = None;
        let mut got = Vec::new();
        let mut full = false;
        for a in answers {
            match a {
                Ok(a) => {
                    let msgs = a.messages.unwrap_or_default();
                    full |= msgs.len() >= per_call;
                    got.extend(msgs);
                }
                Err(e) => {
                    let e = sdk_error("ReceiveMessage", e);
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
        for m in got {
            let group = group_of(&m);
            if group
                .as_ref()
                .is_some_and(|g| self.in_flight.contains_key(g))
            {
                self.held.push_back((m, received));
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

fn group_of(m: &Message) -> Option<String> {
    m.attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .cloned()
}

impl SqsReceiver {
    fn hand_out(&mut self, m: Message, received: Instant, out: &mut Vec<SqsDelivery>) {
        let group = group_of(&m);
        match SqsDelivery::from_message(self.shared.clone(), m, received, Utc::now()) {
            Ok(d) => {
                if let Some(g) = group {
                    self.in_flight.insert(g, Arc::downgrade(&d.lease));
                }
                out.push(d);
            }
            Err(e) => {
                tracing::warn!(error = %e, "skipping a message SQS returned without a receipt handle")
            }
        }
    }

    /// Hands out held messages whose group is free, first of each group only, at most `n`.
    async fn release_held(&mut self, n: usize) -> Vec<SqsDelivery> {
        let mut out = Vec::new();
        let vt = self.shared.opts.visibility_timeout;
        let mut i = 0;
        while i < self.held.len() && out.len() < n {
            let group = group_of(&self.held[i].0);
            if group
                .as_ref()
                .is_some_and(|g| self.in_flight.contains_key(g))
            {
                i += 1;
                continue;
            }
            let Some((m, received)) = self.held.remove(i) else {
                break;
            };
            let waited = received.elapsed();
            if waited + Duration::from_secs(1) >= vt {
                // Its visibility ran out while held: SQS hands it out again, still first of its group.
                tracing::warn!(
                    group = group.as_deref().unwrap_or(""),
                    "held message's visibility expired; leaving it to SQS"
                );
                continue;
            }
            let mut received = received;
            if waited >= vt / 2 {
                let r = self
                    .shared
                    .client
                    .change_message_visibility()
                    .queue_url(&self.shared.queue_url)
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .visibility_timeout(secs(vt))
                    .send()
                    .await;
                if let Err(e) = r {
                    tracing::warn!(error = %sdk_error("ChangeMessageVisibility", e), "cannot extend a held message; leaving it to SQS");
                    continue;
                }
                received = Instant::now();
            }
            self.hand_out(m, received, &mut out);
        }
        out
    }
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

/// Whether a FIFO message's deduplication id is the one AWS puts in place of the producer's when it moves a
/// message to a FIFO dead-letter queue: the message's own id (SQS Developer Guide, dead-letter queue redrive:
/// "When a message is moved from a FIFO queue to a FIFO DLQ, the original message's deduplication ID will be
/// replaced with the original message's ID.").
pub fn deduplication_id_replaced(message_id: Option<&str>, dedup_id: Option<&str>) -> bool {
    matches!((message_id, dedup_id), (Some(m), Some(d)) if !m.is_empty() && m == d)
}

/// The broker-neutral view of an SQS message: attribute names lower-cased, CloudEvents attributes kept as
/// attributes, `MessageDeduplicationId` as the producer id (unless AWS replaced it, see
/// [`deduplication_id_replaced`]), `MessageId` as the broker id,
/// `ApproximateReceiveCount` as the delivery count, `SentTimestamp` as the enqueue time and `MessageGroupId`
/// as the group.
pub fn received_message(m: &Message, received_at: DateTime<Utc>) -> ReceivedMessage {
    let sys = |k: MessageSystemAttributeName| m.attributes().and_then(|a| a.get(&k)).cloned();
    let mut rm = ReceivedMessage::new(m.body().unwrap_or_default().as_bytes().to_vec());
    if let Some(attrs) = m.message_attributes() {
        for (k, v) in attrs {
            if let Some(s) = v.string_value() {
                rm.attributes.insert(k.to_lowercase(), s.to_owned());
            }
        }
    }
    rm.broker_id = m.message_id().map(str::to_owned);
    rm.producer_id = sys(MessageSystemAttributeName::MessageDeduplicationId);
    if deduplication_id_replaced(rm.broker_id.as_deref(), rm.producer_id.as_deref()) {
        // AWS: "When a message is moved from a FIFO queue to a FIFO DLQ, the original message's deduplication
        // ID will be replaced with the original message's ID." The producer's id is gone: using the
        // replacement would give an applied message a new identity, so it is not an identity at all.
        metrics::counter!(crate::metrics::REPLACED_DEDUP_IDS).increment(1);
        tracing::warn!(
            message_id = rm.broker_id.as_deref().unwrap_or(""),
            "deduplication id replaced by the DLQ move (it equals the message id): not used as the identity; only ce-id survives this path"
        );
        rm.producer_id = None;
    }
    rm.delivery_count = sys(MessageSystemAttributeName::ApproximateReceiveCount)
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
    rm.enqueued_at = sys(MessageSystemAttributeName::SentTimestamp)
        .and_then(|t| t.parse::<i64>().ok())
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
    rm.received_at = received_at;
    rm.group_id = sys(MessageSystemAttributeName::MessageGroupId);
    rm
}

/// One received SQS message and its receipt handle. Settling consumes it: `ack` deletes (after COMMIT, as
/// the inbox calls it), `release` sets the visibility to the backoff, `dead_letter` forwards a copy to the
/// dead-letter queue and then deletes.
#[derive(Debug)]
pub struct SqsDelivery {
    shared: Arc<Shared>,
    message: ReceivedMessage,
    body: String,
    receipt: String,
    raw_attributes: HashMap<String, MessageAttributeValue>,
    /// The deduplication id SQS returned (unless AWS replaced it): a forward to the DLQ carries it, whether or
    /// not it is the identity.
    dedup_id: Option<String>,
    lease: Arc<SqsLease>,
}

impl SqsDelivery {
    fn from_message(
        shared: Arc<Shared>,
        m: Message,
        received: Instant,
        now: DateTime<Utc>,
    ) -> Result<Self, BrokerError> {
        let receipt = m
            .receipt_handle()
            .ok_or_else(|| {
                BrokerError::new(
                    BrokerErrorKind::Protocol,
                    "ReceiveMessage",
                    "SQS returned a message without a receipt handle",
                )
            })?
            .to_owned();
        let mut message = received_message(&m, now);
        let dedup_id = message.producer_id.clone();
        if !shared.opts.deduplication_id_identity {
            // Not an identity unless the consumer opted in: it does not survive the DLQ path (see
            // `SqsOptions::deduplication_id_identity`).
            message.producer_id = None;
        }
        let expires =
            now + chrono::Duration::from_std(shared.opts.visibility_timeout).unwrap_or_default();
        let lease = Arc::new(SqsLease {
            client: shared.client.clone(),
            queue_url: shared.queue_url.clone(),
            receipt: receipt.clone(),
            received,
            duration: shared.opts.visibility_timeout,
            expires: Mutex::new(expires),
            settled: AtomicBool::new(false),
        });
        Ok(Self {
            body: m.body.unwrap_or_default(),
            raw_attributes: m.message_attributes.unwrap_or_default(),
            shared,
            message,
            receipt,
            dedup_id,
            lease,
        })
    }

    /// The `MessageDeduplicationId` SQS returned, unless AWS replaced it on a move to a FIFO DLQ (see
    /// [`deduplication_id_replaced`]). It is the message's identity only when the consumer opted in with
    /// [`SqsOptions::deduplication_id_identity`](crate::SqsOptions::deduplication_id_identity).
    pub fn deduplication_id(&self) -> Option<&str> {
        self.dedup_id.as_deref()
    }

    /// The receipt handle of this delivery.
    pub fn receipt_handle(&self) -> &str {
        &self.receipt
    }

    /// The message attributes as SQS returned them (names and data types untouched).
    pub fn raw_attributes(&self) -> &HashMap<String, MessageAttributeValue> {
        &self.raw_attributes
    }

    async fn delete(&self) -> Result<(), BrokerError> {
        let (reply, rx) = oneshot::channel();
        let req = DeleteRequest {
            receipt: self.receipt.clone(),
            reply,
        };
        if self.shared.deletes.send(req).is_err() {
            // The batching task is gone (its runtime is shutting down): delete directly.
            return delete_one(&self.shared.client, &self.shared.queue_url, &self.receipt).await;
        }
        match rx.await {
            Ok(r) => r,
            Err(_) => delete_one(&self.shared.client, &self.shared.queue_url, &self.receipt).await,
        }
    }

    async fn set_visibility(&self, d: Duration) -> Result<(), BrokerError> {
        self.shared
            .client
            .change_message_visibility()
            .queue_url(&self.shared.queue_url)
            .receipt_handle(&self.receipt)
            .visibility_timeout(secs(d.min(MAX_VISIBILITY)))
            .send()
            .await
            .map_err(|e| sdk_error("ChangeMessageVisibility", e))?;
        Ok(())
    }
}

impl Delivery for SqsDelivery {
    fn message(&self) -> &ReceivedMessage {
        &self.message
    }

    async fn ack(self) -> Result<(), BrokerError> {
        self.lease.settled.store(true, Ordering::SeqCst);
        self.delete().await
    }

    async fn release(self, delay: Duration) -> Result<(), BrokerError> {
        self.lease.settled.store(true, Ordering::SeqCst);
        self.set_visibility(delay).await
    }

    async fn dead_letter(self, why: DeadLetter) -> Result<(), BrokerError> {
        self.lease.settled.store(true, Ordering::SeqCst);
        let Some(dlq_url) = self.shared.dead_letter_queue.clone() else {
            // Without a DLQ to forward to, leave the message to its visibility timeout: it comes back at most
            // once per timeout (never in a hot loop) until the queue's maxReceiveCount, if any, moves it.
            return Err(BrokerError::new(
                BrokerErrorKind::Configuration,
                "dead-letter",
                format!(
                    "no dead-letter queue configured; left to its visibility timeout, the queue's maxReceiveCount decides ({}: {})",
                    why.reason, why.detail
                ),
            ));
        };
        dlq::forward(
            &self.shared.client,
            &dlq_url,
            &self.body,
            &self.raw_attributes,
            &self.message,
            self.dedup_id.as_deref(),
            &why,
        )
        .await?;
        metrics::counter!(crate::metrics::DLQ_FORWARDS, "reason" => why.reason.clone())
            .increment(1);
        tracing::warn!(
            reason = %why.reason,
            message_id = self.message.broker_id.as_deref().unwrap_or(""),
            "forwarded to the dead-letter queue with its identity attributes; deleting the original"
        );
        // If this delete fails the message comes back; its next forward carries the same deduplication id, so
        // the DLQ keeps one copy.
        self.delete().await
    }

    fn lease(&self) -> Option<Arc<dyn Lease>> {
        Some(self.lease.clone())
    }
}

/// The visibility timeout of one delivery as a renewable lease (`ChangeMessageVisibility`).
#[derive(Debug)]
pub struct SqsLease {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    receipt: String,
    received: Instant,
    duration: Duration,
    expires: Mutex<DateTime<Utc>>,
    settled: AtomicBool,
}

impl SqsLease {
    fn current(&self) -> DateTime<Utc> {
        *self.expires.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Lease for SqsLease {
    /// The visibility timeout set on the receive ([`SqsOptions::visibility_timeout`]).
    fn duration(&self) -> Duration {
        self.duration
    }

    fn expires_at(&self) -> Option<DateTime<Utc>> {
        Some(self.current())
    }

    fn renew(&self, by: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
        Box::pin(async move {
            // A settled delivery has nothing left to extend (and its receipt may be gone).
            if self.settled.load(Ordering::SeqCst) {
                return Ok(self.current());
            }
            let left = MAX_VISIBILITY.saturating_sub(self.received.elapsed());
            let by = by.min(left);
            if by < Duration::from_secs(1) {
                return Err(BrokerError::new(
                    BrokerErrorKind::LockLost,
                    "ChangeMessageVisibility",
                    "SQS's 12 h visibility ceiling for this receive is reached",
                ));
            }
            let asked = Utc::now();
            let r = self
                .client
                .change_message_visibility()
                .queue_url(&self.queue_url)
                .receipt_handle(&self.receipt)
                .visibility_timeout(secs(by))
                .send()
                .await;
            match r {
                Ok(_) => {
                    let until = asked + chrono::Duration::from_std(by).unwrap_or_default();
                    *self.expires.lock().unwrap_or_else(|p| p.into_inner()) = until;
                    Ok(until)
                }
                // Settled while the call was in flight: the failure says nothing about the lease.
                Err(_) if self.settled.load(Ordering::SeqCst) => Ok(self.current()),
                Err(e) => Err(sdk_error("ChangeMessageVisibility", e)),
            }
        })
    }
}

pub(crate) async fn delete_one(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    receipt: &str,
) -> Result<(), BrokerError> {
    client
        .delete_message()
        .queue_url(queue_url)
        .receipt_handle(receipt)
        .send()
        .await
        .map_err(|e| sdk_error("DeleteMessage", e))?;
    Ok(())
}

/// Deletes settled deliveries: one `DeleteMessage` when one is waiting, a `DeleteMessageBatch` of up to 10
/// when several are. Failed batch entries are counted, logged and retried once with `DeleteMessage`; an
/// entry that still fails returns its error to the delivery's `ack` (the message is then redelivered and
/// absorbed by the inbox).
async fn run_deleter(
    client: aws_sdk_sqs::Client,
    queue_url: String,
    mut rx: mpsc::UnboundedReceiver<DeleteRequest>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < 10 {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        if batch.len() == 1 {
            let req = batch.remove(0);
            let r = delete_one(&client, &queue_url, &req.receipt).await;
            let _ = req.reply.send(r);
            continue;
        }
        delete_batch(&client, &queue_url, batch).await;
    }
}

async fn delete_batch(client: &aws_sdk_sqs::Client, queue_url: &str, batch: Vec<DeleteRequest>) {
    let mut entries = Vec::with_capacity(batch.len());
    for (i, req) in batch.iter().enumerate() {
        match DeleteMessageBatchRequestEntry::builder()
            .id(i.to_string())
            .receipt_handle(&req.receipt)
            .build()
        {
            Ok(e) => entries.push(e),
            Err(e) => tracing::error!(error = %e, "cannot build a DeleteMessageBatch entry"),
        }
    }
    let result = client
        .delete_message_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await;
    let mut replies: Vec<Option<DeleteRequest>> = batch.into_iter().map(Some).collect();
    let mut retry: Vec<DeleteRequest> = Vec::new();
    match result {
        Ok(out) => {
            for ok in out.successful() {
                if let Some(req) = ok
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| replies.get_mut(i)?.take())
                {
                    let _ = req.reply.send(Ok(()));
                }
            }
            for failed in out.failed() {
                let Some(req) = failed
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| replies.get_mut(i)?.take())
                else {
                    continue;
                };
                metrics::counter!(crate::metrics::DELETE_BATCH_ENTRY_FAILURES, "code" => failed.code().to_owned())
                    .increment(1);
                let entry = BatchEntryError {
                    code: failed.code().to_owned(),
                    message: failed.message().unwrap_or_default().to_owned(),
                    sender_fault: failed.sender_fault(),
                };
                let kind = entry.kind();
                let err = BrokerError::new(kind, "DeleteMessageBatch", entry);
                if kind == BrokerErrorKind::LockLost {
                    tracing::warn!(error = %err, "batch delete entry failed: receipt no longer valid; the redelivery will be absorbed by the inbox");
                    let _ = req.reply.send(Err(err));
                } else {
                    tracing::warn!(error = %err, "batch delete entry failed; retrying it with DeleteMessage");
                    retry.push(req);
                }
            }
        }
        Err(e) => {
            let err = sdk_error("DeleteMessageBatch", e);
            tracing::warn!(error = %err, "DeleteMessageBatch failed; retrying each with DeleteMessage");
        }
    }
    // Entries the batch did not settle (whole call failed, unlisted ids, retryable entry failures).
    retry.extend(replies.into_iter().flatten());
    for req in retry {
        let r = delete_one(client, queue_url, &req.receipt).await;
        if let Err(e) = &r {
            tracing::warn!(error = %e, "delete failed; the message will be redelivered and absorbed by the inbox");
        }
        let _ = req.reply.send(r);
    }
}
