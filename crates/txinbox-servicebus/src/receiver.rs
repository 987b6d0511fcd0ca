//! Peek-lock receive, complete after COMMIT, abandon, lock renewal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_core::StatusCode;
use azure_messaging_servicebus::prelude::QueueClient;
use azure_messaging_servicebus::service_bus::PeekLockResponse;
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use txinbox_core::{
    BrokerError, BrokerErrorKind, DeadLetter, Delivery, Lease, ReceivedMessage, Receiver,
};

use crate::config::ServiceBusClient;
use crate::dlq::Forwarder;
use crate::error::{
    client_error, AmbiguousSettle, ServiceBusError, SettleMayHaveApplied, SettleNotRetried,
    UnexpectedStatus,
};
use crate::options::{DeadLetterStrategy, ServiceBusOptions};
use crate::wire::{self, BrokerProperties, ResponseHeaders};

/// A message under a peek-lock, as read from one `201` answer.
pub(crate) struct Locked {
    pub(crate) response: PeekLockResponse,
    pub(crate) headers: ResponseHeaders,
    pub(crate) props: BrokerProperties,
    pub(crate) message: ReceivedMessage,
    pub(crate) locked_until: DateTime<Utc>,
}

impl Locked {
    /// Custom properties as received (strings still quoted), for re-sending.
    pub(crate) fn raw_properties(&self) -> BTreeMap<String, String> {
        wire::raw_custom_properties(&self.headers)
    }
    pub(crate) fn content_type(&self) -> Option<String> {
        self.headers.get("content-type").map(str::to_owned)
    }
}

/// One peek-lock request: `Ok(None)` on 204 (nothing within `wait`). The crate returns `Ok` whatever the
/// status, so the status is checked here.
pub(crate) async fn peek_lock(
    client: &QueueClient,
    entity: &str,
    wait: Duration,
    lock_duration: Duration,
) -> Result<Option<Locked>, BrokerError> {
    let wait = Duration::from_secs(wait.as_secs());
    let response = client
        .peek_lock_message2(Some(wait))
        .await
        .map_err(|e| client_error("receive", e))?;
    let status = *response.status();
    let headers: ResponseHeaders = match response.custom_properties::<ResponseHeaders>() {
        Ok(h) => h,
        Err(never) => match never {},
    };
    match status {
        StatusCode::NoContent => return Ok(None),
        StatusCode::Created | StatusCode::Ok => {}
        other => {
            let status = u16::from(other);
            // A receive holds no lock: its 404 is the entity's (Microsoft's earlier Peek-Lock reference: "404
            // Subscription never existed."), a lasting failure, not a lost lock.
            let kind = match status {
                404 => BrokerErrorKind::EntityNotFound,
                _ => BrokerErrorKind::of_http_status(status),
            };
            return Err(BrokerError::new(
                kind,
                "receive",
                UnexpectedStatus {
                    entity: entity.to_owned(),
                    status,
                },
            )
            .with_retry_after(wire::retry_after(&headers)));
        }
    }
    let received_at = Utc::now();
    let (message, props) =
        wire::received_message(&headers, response.body().into_bytes(), entity, received_at)?;
    // The service's LockedUntilUtc is read on its clock: it may say earlier (a shorter LockDuration, or whole
    // seconds), never later than the lock duration from now, which bounds it when the service's clock is ahead.
    let computed = received_at + chrono::Duration::from_std(lock_duration).unwrap_or_default();
    let locked_until = props
        .locked_until()
        .map_or(computed, |until| until.min(computed));
    Ok(Some(Locked {
        response,
        headers,
        props,
        message,
        locked_until,
    }))
}

/// A lock the broker grants shorter than this is taken as clock skew, not as the queue's LockDuration.
const MIN_GRANTED_LOCK: Duration = Duration::from_secs(1);

/// Which crate call a settle makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SettleOp {
    Complete,
    Abandon,
    Renew,
}

impl SettleOp {
    fn name(self) -> &'static str {
        match self {
            SettleOp::Complete => "complete",
            SettleOp::Abandon => "abandon",
            SettleOp::Renew => "renew-lock",
        }
    }
}

/// The next attempt of a settle is sent at least this long before the lock ends, so that it reaches the
/// service while the lock lasts.
pub const SETTLE_LOCK_MARGIN: Duration = Duration::from_secs(1);

/// The longest a settle waits before its next attempt, whatever the service's `Retry-After` says.
pub const MAX_SETTLE_WAIT: Duration = Duration::from_secs(30);

/// How long a settle waits before the attempt after `attempt`: the service's `Retry-After` when it sent one
/// and it is longer, else the adapter's own backoff (400 ms, 800 ms, … 6.4 s). `Err(wait)` when it must not
/// wait: the wait would end less than [`SETTLE_LOCK_MARGIN`] before the lock does (`lock_left`), so the next
/// attempt would find no lock after the worker sat idle (Microsoft, Peek-Lock Message: "When the lock expires,
/// the message becomes available to other receivers"), or it is longer than [`MAX_SETTLE_WAIT`] (a hostile or
/// buggy `Retry-After`, a lock end read from a clock far ahead of ours).
fn settle_wait(
    attempt: u32,
    retry_after: Option<Duration>,
    lock_left: Duration,
) -> Result<Duration, Duration> {
    let wait =
        Duration::from_millis(200 * 2u64.pow(attempt.min(5))).max(retry_after.unwrap_or_default());
    if wait > MAX_SETTLE_WAIT || wait.saturating_add(SETTLE_LOCK_MARGIN) > lock_left {
        Err(wait)
    } else {
        Ok(wait)
    }
}

/// The error of a settle whose attempt `attempt` failed with `source` after an earlier attempt that may have
/// applied (`earlier`, its kind): the outcome is unknown, with [`AmbiguousSettle`] as its source.
fn ambiguous(
    op: SettleOp,
    attempt: u32,
    earlier: BrokerErrorKind,
    source: BrokerError,
) -> BrokerError {
    BrokerError::new(
        BrokerErrorKind::OutcomeUnknown,
        op.name(),
        AmbiguousSettle {
            attempt,
            earlier,
            source,
        },
    )
}

/// Runs one settle (or renewal) on the lock URI, retrying throttling, 5xx and lost answers with a short
/// backoff while the lock lasts. For a complete or abandon, a 404 after an attempt that may have applied is
/// reported as ambiguous, not as a lost lock: that attempt may have worked, and the missing lock be its doing;
/// so is any other failure after it that is not retried (a 401 or 410: Microsoft, Delete Message, "401
/// Authorization failure.", "410 Specified queue or subscription doesn't exist.", say nothing of the earlier
/// attempt).
/// An attempt may have applied when its answer was lost or when it was answered with a server error (a 500
/// says nothing about whether the change was made; 429 and 503 are refusals). A renewal's 404 is always a lost
/// lock: a renewal removes no lock, so whatever an earlier attempt did, there is no lock now (Microsoft,
/// `RenewMessageLockAsync`: "The lock for the message has expired or the message has already been completed.
/// The Reason will be set to MessageLockLost in this case."). A retry whose wait [`settle_wait`] refuses is
/// not made: the settle fails with the attempt's kind and [`SettleNotRetried`] as its source, and the message
/// comes back when its lock ends (the inbox absorbs that redelivery). A complete or abandon given up so, or
/// after its last attempt, when an earlier attempt may have applied, is ambiguous too; and when the attempt it
/// gave up on was answered with a server error, its outcome is unknown ([`SettleMayHaveApplied`]).
pub(crate) async fn settle(
    response: &PeekLockResponse,
    op: SettleOp,
    entity: &str,
    attempts: u32,
    locked_until: DateTime<Utc>,
) -> Result<(), BrokerError> {
    // The kind of the last failed attempt that may have applied.
    let mut may_have_applied: Option<BrokerErrorKind> = None;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let r = match op {
            SettleOp::Complete => response.delete_message().await.map(drop),
            SettleOp::Abandon => response.unlock_message().await,
            SettleOp::Renew => response.renew_message_lock().await,
        };
        let e = match r {
            Ok(()) => return Ok(()),
            Err(e) => client_error(op.name(), e),
        };
        if !e.is_retryable() {
            // After an attempt that may have applied, a failure that is not retried leaves the outcome
            // unknown: a 404 is probably that attempt's doing, and a refusal (401, 403, 410) is about this
            // request only, not about what the earlier one did.
            return Err(match may_have_applied {
                Some(earlier) => ambiguous(op, attempt, earlier, e),
                None => e,
            });
        }
        let lock_left = (locked_until - Utc::now()).to_std().unwrap_or_default();
        let backoff = match (
            attempt >= attempts,
            settle_wait(attempt, e.retry_after(), lock_left),
        ) {
            (false, Ok(backoff)) => backoff,
            (_, wait) => {
                let e = match wait {
                    Ok(_) => e,
                    Err(wait) => {
                        let after = e.retry_after();
                        BrokerError::new(
                            e.kind(),
                            op.name(),
                            SettleNotRetried {
                                attempt,
                                wait,
                                lock_left,
                                source: e,
                            },
                        )
                        .with_retry_after(after)
                    }
                };
                // Given up after an attempt that may have applied: whatever this one said, the outcome is unknown;
                // so it is when this one was answered with a server error, which may have applied too.
                return Err(match may_have_applied {
                    Some(earlier) if e.kind() != BrokerErrorKind::OutcomeUnknown => {
                        ambiguous(op, attempt, earlier, e)
                    }
                    None if op != SettleOp::Renew && e.kind() == BrokerErrorKind::ServerError => {
                        let after = e.retry_after();
                        BrokerError::new(
                            BrokerErrorKind::OutcomeUnknown,
                            op.name(),
                            SettleMayHaveApplied { attempt, source: e },
                        )
                        .with_retry_after(after)
                    }
                    _ => e,
                });
            }
        };
        // A renewal removes no lock, so its 404 is a lost lock whatever an earlier attempt did.
        if op != SettleOp::Renew
            && matches!(
                e.kind(),
                BrokerErrorKind::OutcomeUnknown | BrokerErrorKind::ServerError
            )
        {
            may_have_applied = Some(e.kind());
        }
        metrics::counter!(crate::metrics::SETTLE_RETRIES, "op" => op.name(), "kind" => e.kind().as_str())
            .increment(1);
        tracing::info!(op = op.name(), entity, attempt, error = %e, "retrying");
        tokio::time::sleep(backoff).await;
    }
}

/// Receives from one queue (or `topic/subscriptions/name`) with peek-lock.
///
/// One receive makes one long poll of [`ServiceBusOptions::wait`]; when it brings a message, further
/// requests with `timeout=0` collect what is waiting, up to the worker's batch. REST has no batch receive.
pub struct ServiceBusReceiver {
    client: QueueClient,
    entity: String,
    opts: ServiceBusOptions,
    forwarder: Option<Arc<Forwarder>>,
    lock_warned: bool,
    /// A message the start-up check locked, handed out by the next receive.
    checked: Option<ServiceBusDelivery>,
    /// Whether the last receive came back full: the next sends its follow-up requests at once.
    backlog: bool,
}

impl std::fmt::Debug for ServiceBusReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBusReceiver")
            .field("entity", &self.entity)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl ServiceBusReceiver {
    /// A receiver on `queue` of `client`'s namespace.
    pub fn new(
        client: &ServiceBusClient,
        queue: impl Into<String>,
        opts: ServiceBusOptions,
    ) -> Result<Self, ServiceBusError> {
        opts.validate()?;
        let entity = queue.into().trim_matches('/').to_owned();
        if entity.is_empty() {
            return Err(ServiceBusError::Config {
                detail: "the queue path is empty".into(),
            });
        }
        let forwarder = match &opts.dead_letter {
            DeadLetterStrategy::Forward { destination } => {
                Some(Arc::new(Forwarder::new(client, &entity, destination)))
            }
            DeadLetterStrategy::AbandonUntilMaxDelivery => None,
        };
        Ok(Self {
            client: client.queue_client(&entity),
            entity,
            opts,
            forwarder,
            lock_warned: false,
            checked: None,
            backlog: false,
        })
    }

    /// The entity path.
    pub fn entity(&self) -> &str {
        &self.entity
    }

    /// The options.
    pub fn options(&self) -> &ServiceBusOptions {
        &self.opts
    }

    /// One peek-lock request; `Ok(None)` when nothing arrived within `wait`.
    pub async fn receive_one(
        &mut self,
        wait: Duration,
    ) -> Result<Option<ServiceBusDelivery>, BrokerError> {
        let Some(locked) =
            peek_lock(&self.client, &self.entity, wait, self.opts.lock_duration).await?
        else {
            return Ok(None);
        };
        Ok(Some(self.delivery(locked)))
    }

    /// The receive of a queue with a backlog (the last receive came back full): `want` peek-lock requests at
    /// once, none of them waiting, each locking one message, so that the receive costs one round trip, not two
    /// (a long poll among them would hold the messages the others locked until it ends). When all come back
    /// empty (the queue has just run dry) the ordinary receive follows: one long poll. A request that fails is
    /// logged and the messages the others locked are handed out; when every one fails, the first error is
    /// returned.
    async fn receive_all_at_once(
        &mut self,
        want: usize,
    ) -> Result<Vec<ServiceBusDelivery>, BrokerError> {
        let (client, entity, lock) = (&self.client, &self.entity, self.opts.lock_duration);
        let locks = futures::future::join_all(
            (0..want).map(|_| peek_lock(client, entity, Duration::ZERO, lock)),
        )
        .await;
        let mut out = Vec::with_capacity(want);
        let mut first_error = None;
        for l in locks {
            match l {
                Ok(Some(locked)) => {
                    let d = self.delivery(locked);
                    out.push(d);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(entity = %self.entity, error = %e, "receive failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        self.backlog = out.len() >= want;
        match first_error {
            Some(e) if out.is_empty() => {
                if let Some(after) = e.retry_after() {
                    tokio::time::sleep(after.min(Duration::from_secs(30))).await;
                }
                Err(e)
            }
            _ => Ok(out),
        }
    }

    /// The delivery of a locked message.
    fn delivery(&mut self, locked: Locked) -> ServiceBusDelivery {
        // The lease lasts the configured lock duration, or less when the broker's lock says so: a queue whose
        // LockDuration is shorter than configured is still renewed in time.
        let granted = (locked.locked_until - locked.message.received_at)
            .to_std()
            .unwrap_or_default();
        let mut lock_duration = self.opts.lock_duration;
        if granted >= MIN_GRANTED_LOCK && granted + Duration::from_secs(1) < lock_duration {
            lock_duration = granted;
            if !self.lock_warned {
                self.lock_warned = true;
                tracing::warn!(
                    entity = %self.entity,
                    granted_ms = granted.as_millis() as u64,
                    configured_ms = self.opts.lock_duration.as_millis() as u64,
                    "the broker's lock is shorter than ServiceBusOptions::lock_duration; renewing by the broker's (set lock_duration to the queue's LockDuration)"
                );
            }
        }
        ServiceBusDelivery::new(
            locked,
            self.entity.clone(),
            lock_duration,
            &self.opts,
            self.forwarder.clone(),
        )
    }
}

impl Receiver for ServiceBusReceiver {
    type Delivery = ServiceBusDelivery;

    /// A receiver on the same queue sharing the HTTP client and the dead-letter forwarder.
    fn fork(&self) -> Option<Self> {
        Some(Self {
            client: self.client.clone(),
            entity: self.entity.clone(),
            opts: self.opts.clone(),
            forwarder: self.forwarder.clone(),
            lock_warned: self.lock_warned,
            checked: None,
            backlog: false,
        })
    }

    async fn receive(&mut self, max: usize) -> Result<Vec<ServiceBusDelivery>, BrokerError> {
        let want = max.min(self.opts.batch_size);
        if self.backlog && want > 1 && self.checked.is_none() {
            let got = self.receive_all_at_once(want).await?;
            if !got.is_empty() {
                return Ok(got);
            }
        }
        let checked = match self.checked.take() {
            Some(d) => d.renewed_for_hand_out().await,
            None => None,
        };
        let first = match checked {
            Some(d) => Ok(Some(d)),
            None => self.receive_one(self.opts.wait).await,
        };
        let first = match first {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(Vec::new()),
            Err(e) => {
                if let Some(after) = e.retry_after() {
                    // Honour the service's Retry-After before the worker asks again.
                    tokio::time::sleep(after.min(Duration::from_secs(30))).await;
                }
                return Err(e);
            }
        };
        let mut out = vec![first];
        // One after another while messages keep coming.
        while out.len() < want {
            match self.receive_one(Duration::ZERO).await {
                Ok(Some(d)) => out.push(d),
                Ok(None) => break,
                Err(e) => {
                    // What is locked already is handed out; the next receive reports a lasting failure.
                    tracing::warn!(entity = %self.entity, error = %e, "follow-up receive failed");
                    break;
                }
            }
        }
        self.backlog = out.len() >= want;
        Ok(out)
    }

    /// One peek-lock with no wait on the queue: a 401/403 ([`Unauthorized`](BrokerErrorKind::Unauthorized):
    /// the key or the role is not accepted) or a 404 or 410 ([`EntityNotFound`](BrokerErrorKind::EntityNotFound))
    /// fails the check, as does no answer. A message it locks is handed out by the next receive (no delivery
    /// count spent) with its lock renewed first; when that lock has lapsed meanwhile (or cannot be renewed) it is
    /// not handed out, and the receive gets the message again with a lock of its own. The dead-letter path always exists on Service Bus: the forward destination when one is
    /// set (REST cannot check a send without sending; a missing destination shows at the first forward, a
    /// `txinbox_settle_failures_total{op="dead_letter"}`), else the broker's `$DeadLetterQueue` after
    /// MaxDeliveryCount.
    async fn check(&mut self) -> Result<(), BrokerError> {
        if self.checked.is_some() {
            return Ok(());
        }
        let got = self.receive_one(Duration::ZERO).await.map_err(|e| {
            BrokerError::new(
                e.kind(),
                "start-up check",
                StartupCheck {
                    entity: self.entity.clone(),
                    error: e.to_string(),
                },
            )
        })?;
        self.checked = got;
        Ok(())
    }
}

/// The start-up check of a queue failed; says which queue and what was wrong (the failed call's error, whose
/// kind the check's error keeps), without a secret.
#[derive(Debug, thiserror::Error)]
#[error("cannot use queue {entity:?}: {error}")]
struct StartupCheck {
    entity: String,
    error: String,
}

/// The lock of one delivery, shared with its lease.
pub(crate) struct LockState {
    pub(crate) locked: Locked,
    pub(crate) entity: String,
    pub(crate) lock_duration: Duration,
    pub(crate) attempts: u32,
    pub(crate) until: Mutex<DateTime<Utc>>,
}

impl LockState {
    pub(crate) fn until(&self) -> DateTime<Utc> {
        *self.until.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) async fn settle(&self, op: SettleOp) -> Result<(), BrokerError> {
        settle(
            &self.locked.response,
            op,
            &self.entity,
            self.attempts,
            self.until(),
        )
        .await
    }
}

/// One received copy of a message under a peek-lock. Settled by the inbox: complete after COMMIT, abandon to
/// retry, forward-and-complete or abandon to dead-letter (see [`DeadLetterStrategy`]).
pub struct ServiceBusDelivery {
    state: Arc<LockState>,
    max_release_delay: Duration,
    forwarder: Option<Arc<Forwarder>>,
}

impl std::fmt::Debug for ServiceBusDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBusDelivery")
            .field("entity", &self.state.entity)
            .field("message_id", &self.state.locked.message.producer_id)
            .field("sequence_number", &self.state.locked.props.sequence_number)
            .field("delivery_count", &self.state.locked.message.delivery_count)
            .finish_non_exhaustive()
    }
}

impl ServiceBusDelivery {
    fn new(
        locked: Locked,
        entity: String,
        lock_duration: Duration,
        opts: &ServiceBusOptions,
        forwarder: Option<Arc<Forwarder>>,
    ) -> Self {
        let until = locked.locked_until;
        Self {
            state: Arc::new(LockState {
                locked,
                entity,
                lock_duration,
                attempts: opts.settle_attempts,
                until: Mutex::new(until),
            }),
            max_release_delay: opts.max_release_delay,
            forwarder,
        }
    }

    /// `BrokerProperties` as received.
    pub fn broker_properties(&self) -> &BrokerProperties {
        &self.state.locked.props
    }

    /// The lock token, if the service sent one.
    pub fn lock_token(&self) -> Option<&str> {
        self.state.locked.props.lock_token.as_deref()
    }

    /// The lock URI (`Location`) as the service sent it.
    pub fn lock_location(&self) -> &str {
        self.state
            .locked
            .headers
            .get("location")
            .unwrap_or_default()
    }

    /// When the lock ends, as far as the adapter knows: `LockedUntilUtc`, but never later than the lock duration
    /// after the receive (the service's clock may be ahead of ours), then computed after each renewal.
    pub fn locked_until(&self) -> DateTime<Utc> {
        self.state.until()
    }

    /// The message the start-up check locked, made ready for the worker: its lock renewed, so that it lasts
    /// the lease's whole duration from now, as the worker's lease keeper counts it (the check's lock has been
    /// running since the check, and would otherwise end before the keeper's first renewal). `None` when the lock
    /// has lapsed or the renewal fails: the message is not handed out, since its complete would
    /// find no lock (Microsoft, Peek-Lock Message: "When the lock expires, the message becomes available to
    /// other receivers"); the next receive gets it again, with a lock of its own. No delivery is spent by the
    /// renewal (Microsoft, Renew-Lock for a Message: "Renews the lock on an already locked message."); one the
    /// check's lapsed lock spent is the broker's to count.
    async fn renewed_for_hand_out(self) -> Option<Self> {
        // Past its end by our reckoning (`LockedUntilUtc` is whole seconds, so the lock may last a little
        // longer; a renewal then finds it, or answers 404).
        if self.state.until() <= Utc::now() {
            tracing::info!(
                entity = %self.state.entity,
                message_id = ?self.state.locked.message.producer_id,
                "the lock the start-up check took has lapsed; the message is received again"
            );
            return None;
        }
        let lease = ServiceBusLease {
            state: self.state.clone(),
        };
        match lease.renew(self.state.lock_duration).await {
            Ok(_) => Some(self),
            Err(e) => {
                tracing::info!(
                    entity = %self.state.entity,
                    message_id = ?self.state.locked.message.producer_id,
                    error = %e,
                    "the lock the start-up check took could not be renewed; the message is received again"
                );
                if e.kind() != BrokerErrorKind::LockLost {
                    // Still locked, perhaps: released now rather than hidden until its lock ends.
                    if let Err(a) = self.state.settle(SettleOp::Abandon).await {
                        tracing::debug!(error = %a, "releasing the start-up check's message failed; it comes back when its lock ends");
                    }
                }
                None
            }
        }
    }

    /// Completes the message (only the inbox should, after COMMIT).
    pub async fn complete(self) -> Result<(), BrokerError> {
        self.state.settle(SettleOp::Complete).await
    }

    /// Abandons the message: the broker makes it available again at once and counts the delivery.
    pub async fn abandon(self) -> Result<(), BrokerError> {
        self.state.settle(SettleOp::Abandon).await
    }
}

impl Delivery for ServiceBusDelivery {
    fn message(&self) -> &ReceivedMessage {
        &self.state.locked.message
    }

    async fn ack(self) -> Result<(), BrokerError> {
        self.complete().await
    }

    /// REST abandon has no delay: the backoff is served by keeping the lock for `delay`, at most
    /// [`ServiceBusOptions::max_release_delay`], then abandoning. Nothing renews the lock while it is kept (the
    /// lease keeper stops when the delivery is settled), so the hold also ends a second before the lock does:
    /// Microsoft, "When the lock expires, the message becomes available to other receivers", and the abandon
    /// would then find no lock.
    async fn release(self, delay: Duration) -> Result<(), BrokerError> {
        let lock_left = (self.state.until() - chrono::Utc::now())
            .to_std()
            .unwrap_or_default()
            .saturating_sub(Duration::from_secs(1));
        let hold = delay.min(self.max_release_delay).min(lock_left);
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        self.abandon().await
    }

    /// `true` unless [`ServiceBusOptions::max_release_delay`] is zero: a release holds the lock (and its
    /// caller) up to that long.
    fn release_holds(&self) -> bool {
        !self.max_release_delay.is_zero()
    }

    async fn dead_letter(self, why: DeadLetter) -> Result<(), BrokerError> {
        let Some(forwarder) = self.forwarder.clone() else {
            tracing::warn!(
                entity = %self.state.entity,
                message_id = ?self.state.locked.message.producer_id,
                delivery_count = self.state.locked.message.delivery_count,
                reason = %why.reason,
                detail = %why.detail,
                "dead-lettering by abandon: the broker moves the message to $DeadLetterQueue after MaxDeliveryCount"
            );
            return self.abandon().await;
        };
        if let Err(e) = forwarder.forward(&self.state.locked, &why).await {
            tracing::error!(entity = %self.state.entity, error = %e, "forward to the dead-letter destination failed; abandoning (the broker dead-letters after MaxDeliveryCount)");
            if let Err(a) = self.state.settle(SettleOp::Abandon).await {
                tracing::warn!(error = %a, "abandon after a failed forward failed too; the lock will lapse");
            }
            return Err(e);
        }
        self.complete().await
    }

    fn lease(&self) -> Option<Arc<dyn Lease>> {
        Some(Arc::new(ServiceBusLease {
            state: self.state.clone(),
        }))
    }
}

/// The peek-lock of a delivery, renewed by the worker's lease keeper.
pub struct ServiceBusLease {
    state: Arc<LockState>,
}

impl std::fmt::Debug for ServiceBusLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBusLease")
            .field("entity", &self.state.entity)
            .field("until", &self.state.until())
            .finish()
    }
}

impl Lease for ServiceBusLease {
    /// The lock duration: [`ServiceBusOptions::lock_duration`], or the broker's when its first lock was shorter.
    fn duration(&self) -> Duration {
        self.state.lock_duration
    }

    fn expires_at(&self) -> Option<DateTime<Utc>> {
        Some(self.state.until())
    }

    /// Renews the lock. Service Bus extends it by the queue's LockDuration whatever `by` says, and its answer
    /// carries no new expiry, so the expiry is computed as the time the request was sent plus
    /// the lease's [`duration`](Lease::duration) (a lower bound).
    fn renew(&self, _by: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
        Box::pin(async move {
            let sent = Utc::now();
            self.state.settle(SettleOp::Renew).await?;
            let until =
                sent + chrono::Duration::from_std(self.state.lock_duration).unwrap_or_default();
            *self.state.until.lock().unwrap_or_else(|p| p.into_inner()) = until;
            Ok(until)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// The service's Retry-After is waited only when the next attempt still leaves a second of the lock, and
    /// never past the adapter's longest wait.
    #[test]
    fn a_retry_waits_at_most_until_shortly_before_the_lock_ends() {
        // Within the lock: the service's wait, else the adapter's backoff.
        assert_eq!(settle_wait(1, Some(S(2)), S(10)), Ok(S(2)));
        assert_eq!(settle_wait(1, None, S(10)), Ok(Duration::from_millis(400)));
        assert_eq!(
            settle_wait(2, Some(Duration::from_millis(100)), S(10)),
            Ok(Duration::from_millis(800))
        );
        // A wait that would end less than SETTLE_LOCK_MARGIN before the lock does is not made.
        assert_eq!(
            settle_wait(1, Some(S(4)), Duration::from_millis(4500)),
            Err(S(4))
        );
        assert_eq!(
            settle_wait(1, None, Duration::from_millis(1200)),
            Err(Duration::from_millis(400))
        );
        assert_eq!(settle_wait(1, Some(S(4)), S(5)), Ok(S(4)));
    }

    /// A Retry-After longer than MAX_SETTLE_WAIT is never waited, whatever the lock seems to allow (its end
    /// read from a service clock far ahead of ours, or a Retry-After of 999999).
    #[test]
    fn a_hostile_retry_after_is_never_waited() {
        assert_eq!(
            settle_wait(1, Some(S(999_999)), S(1_000_000)),
            Err(S(999_999))
        );
        assert_eq!(settle_wait(1, Some(S(3600)), S(7200)), Err(S(3600)));
        assert_eq!(settle_wait(1, Some(S(31)), S(300)), Err(S(31)));
        assert_eq!(settle_wait(1, Some(MAX_SETTLE_WAIT), S(300)), Ok(S(30)));
        assert_eq!(
            settle_wait(1, Some(Duration::MAX), S(300)),
            Err(Duration::MAX)
        );
    }

    #[test]
    fn sequence_numbers_come_from_lock_uris() {
        assert_eq!(
            wire::sequence_from_location(
                "https://ns.servicebus.windows.net/q/messages/2/7da9cfd5-40d5-4bb1-8d64-ec5a52e1c547"
            )
            .as_deref(),
            Some("2")
        );
        assert_eq!(wire::sequence_from_location("nonsense"), None);
    }
}
