//! The inbox transaction.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use tracing::Instrument;
use txinbox_core::metrics as m;
use txinbox_core::{
    BadInput, CancellationToken, DeadLetter, Delivery, FingerprintSpec, HandlerError, Identity,
    IdentityPolicy, Outcome, Processor, RetentionPolicy,
};

use crate::backend::{Backend, MarkerInsert, MarkerRow, Rejection};
use crate::conns::KeptConnections;
use crate::handler::{Handled, Handler, Inbound};

/// What bodies a consumer accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyFormat {
    /// Any bytes.
    #[default]
    Any,
    /// UTF-8 text.
    Utf8,
    /// A JSON document (parsed once and handed to the handler).
    Json,
}

/// Validation applied before the transaction opens. A violation dead-letters the message with a reason.
#[derive(Clone, Debug)]
pub struct InputRules {
    /// Largest body accepted (default 256 KiB, the SQS and Service Bus Standard limit).
    pub max_payload_bytes: usize,
    /// Body format (default any bytes).
    pub body: BodyFormat,
    /// Contract versions accepted; empty accepts any (default).
    pub contract_versions: Vec<String>,
    /// Whether a message without a contract version is refused when `contract_versions` is set (default true).
    pub require_contract_version: bool,
}

impl Default for InputRules {
    fn default() -> Self {
        Self {
            max_payload_bytes: 256 * 1024,
            body: BodyFormat::Any,
            contract_versions: Vec::new(),
            require_contract_version: true,
        }
    }
}

impl InputRules {
    /// Sets the largest body accepted.
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }
    /// Sets the body format.
    pub fn body(mut self, f: BodyFormat) -> Self {
        self.body = f;
        self
    }
    /// Accept only these contract versions.
    pub fn contract_versions<I, S>(mut self, v: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.contract_versions = v.into_iter().map(Into::into).collect();
        self
    }
}

/// A point in the inbox transaction where a fault test can simulate a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultPoint {
    /// After receive, before BEGIN.
    BeforeTransaction,
    /// After the marker insert, before the handler's business change.
    AfterMarkerInsert,
    /// After the business change, before COMMIT.
    AfterBusinessChange,
    /// After COMMIT, before the settle.
    AfterCommit,
}

/// A simulated crash: the process "died" at the point; the transaction was dropped (rolled back) unless the
/// point is after COMMIT, and the delivery was dropped unsettled, as a dead process leaves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("simulated crash at {0:?}")]
pub struct Crashed(pub FaultPoint);

/// The inbox of one consumer on one database.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use txinbox_core::{ConsumerName, IdentityPolicy, mem::MemoryQueue, Worker};
/// use txinbox_store::{handler_fn, db_error, Handled, Inbox, Store};
///
/// let store = Store::<sqlx::Sqlite>::connect("sqlite::memory:").await?;
/// sqlx::query("CREATE TABLE tasks (id TEXT PRIMARY KEY)").execute(store.pool()).await?;
/// let inbox = Inbox::new(store.pool().clone(), IdentityPolicy::new(ConsumerName::new("crm")?));
/// let handler = handler_fn::<sqlx::Sqlite, _>(|tx, msg| Box::pin(async move {
///     sqlx::query("INSERT INTO tasks (id) VALUES (?1)")
///         .bind(&msg.identity.message_id)
///         .execute(&mut *tx).await.map_err(db_error)?;
///     Ok(Handled::reference(msg.identity.message_id.clone()))
/// }));
/// let queue = MemoryQueue::default();
/// Worker::new(queue.receiver(), inbox.bind(handler))
///     .run_until(txinbox_core::shutdown_signal())
///     .await;
/// # Ok(()) }
/// ```
pub struct Inbox<DB: Backend> {
    pool: sqlx::Pool<DB>,
    policy: IdentityPolicy,
    fingerprint: FingerprintSpec,
    retention: RetentionPolicy,
    rules: InputRules,
    retry_backoff: Duration,
    consumer: Arc<str>,
    conns: Arc<KeptConnections<DB>>,
}

impl<DB: Backend> Clone for Inbox<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            policy: self.policy.clone(),
            fingerprint: self.fingerprint.clone(),
            retention: self.retention.clone(),
            rules: self.rules.clone(),
            retry_backoff: self.retry_backoff,
            consumer: self.consumer.clone(),
            conns: self.conns.clone(),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Inbox<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("backend", &<DB as Backend>::NAME)
            .field("policy", &self.policy)
            .field("retention", &self.retention)
            .field("rules", &self.rules)
            .field("keep_connections", &self.conns.keep_idle())
            .finish()
    }
}

/// How long a connection is kept for the next delivery by default.
const DEFAULT_KEEP_IDLE: Duration = Duration::from_millis(500);

/// What the transaction works on.
struct Work<'a> {
    msg: &'a txinbox_core::ReceivedMessage,
    identity: &'a Identity,
    hash: &'a str,
    json: Option<&'a serde_json::Value>,
}

/// How the transaction ended.
enum TxEnd {
    /// Committed (clean) or rolled back by dropping it on a failure (not clean).
    Decided { decision: Decision, clean: bool },
    /// The marker insert conflicted; the transaction was rolled back (cleanly unless the rollback failed).
    Conflict {
        holder: Option<crate::backend::ExistingMarker>,
        clean: bool,
    },
}

/// Where a delivery ended inside the transaction, before settling.
enum Decision {
    Ack(Outcome),
    Release(Outcome, Duration),
    DeadLetter(Outcome, DeadLetter),
}

impl<DB: Backend> Inbox<DB> {
    /// An inbox on `pool` (migrated, see [`crate::Store`]) resolving identities with `policy`.
    pub fn new(pool: sqlx::Pool<DB>, policy: IdentityPolicy) -> Self {
        let consumer: Arc<str> = policy.consumer().as_str().into();
        Self {
            pool,
            policy,
            fingerprint: FingerprintSpec::default(),
            retention: RetentionPolicy::default(),
            rules: InputRules::default(),
            retry_backoff: Duration::from_secs(5),
            consumer,
            conns: KeptConnections::new(DEFAULT_KEEP_IDLE),
        }
    }

    /// Sets the payload fingerprint (volatile fields to exclude).
    pub fn fingerprint(mut self, spec: FingerprintSpec) -> Self {
        self.fingerprint = spec;
        self
    }
    /// Sets the retention policy.
    pub fn retention(mut self, r: RetentionPolicy) -> Self {
        self.retention = r;
        self
    }
    /// Sets the input rules.
    pub fn input_rules(mut self, r: InputRules) -> Self {
        self.rules = r;
        self
    }
    /// Sets the delay before a retryable failure is redelivered (default 5 s).
    pub fn retry_backoff(mut self, d: Duration) -> Self {
        self.retry_backoff = d;
        self
    }
    /// How long a connection that just ended a transaction cleanly is kept for the next delivery before it
    /// goes back to the pool (default 500 ms; zero hands every connection back at once).
    ///
    /// sqlx's pool tests each connection it takes back with a round trip to the database; keeping the
    /// connection between deliveries saves that round trip on a busy consumer. The rules:
    ///
    /// * only a connection whose transaction ended without error (COMMIT, or a duplicate's ROLLBACK) is kept;
    ///   after any failure it goes back to the pool, which tests it;
    /// * kept connections stay checked out of the pool, so its limit still bounds the inbox, and the pool's
    ///   last connection is never kept: the application still gets one without waiting;
    /// * a connection idle for longer than `idle` goes back to the pool; a closed pool gets them back within
    ///   about 100 ms (`Pool::close` does not wait for them);
    /// * a `BEGIN` that fails because the connection died while it waited is tried once more on a fresh one.
    pub fn keep_connections(mut self, idle: Duration) -> Self {
        self.conns.release_all();
        self.conns = KeptConnections::new(idle);
        self
    }
    /// How many connections the inbox keeps for its next deliveries right now.
    pub fn kept_connections(&self) -> usize {
        self.conns.kept()
    }
    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }
    /// The consumer name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The `consumer` metric label, sharing the name's allocation.
    fn label(&self) -> metrics::SharedString {
        metrics::SharedString::from_shared(self.consumer.clone())
    }

    /// Binds a handler, giving a [`Processor`] for a [`txinbox_core::Worker`].
    pub fn bind<H: Handler<DB>>(self, handler: H) -> InboxProcessor<DB, H> {
        InboxProcessor {
            inbox: self,
            handler: Arc::new(handler),
        }
    }

    /// Processes one delivery to a known outcome and settles it: ack after COMMIT (applied, duplicate,
    /// business duplicate), release (retry), dead-letter (bad input, collision, permanent error).
    pub async fn process<D: Delivery, H: Handler<DB> + ?Sized>(
        &self,
        delivery: D,
        handler: &H,
    ) -> Outcome {
        self.process_until(delivery, handler, &CancellationToken::new())
            .await
    }

    /// Like [`Inbox::process`]; when `stop` is cancelled before COMMIT the transaction rolls back, the delivery
    /// is released and the outcome is [`Outcome::Interrupted`].
    pub async fn process_until<D: Delivery, H: Handler<DB> + ?Sized>(
        &self,
        delivery: D,
        handler: &H,
        stop: &CancellationToken,
    ) -> Outcome {
        match self.process_with_fault(delivery, handler, stop, None).await {
            Ok(o) => o,
            Err(Crashed(_)) => unreachable_crash(),
        }
    }

    /// For fault tests: processes like [`Inbox::process_until`] but simulates a crash at `fault`.
    pub async fn process_with_fault<D: Delivery, H: Handler<DB> + ?Sized>(
        &self,
        delivery: D,
        handler: &H,
        stop: &CancellationToken,
        fault: Option<FaultPoint>,
    ) -> Result<Outcome, Crashed> {
        let msg = delivery.message();
        let span = tracing::info_span!(
            "txinbox.process",
            consumer = %self.consumer,
            message_id = tracing::field::Empty,
            delivery_count = msg.delivery_count,
            outcome = tracing::field::Empty,
        );
        async move {
            let consumer = self.label();
            metrics::counter!(m::RECEIVED, "consumer" => consumer.clone()).increment(1);
            let decision = self.decide(&delivery, handler, stop, fault).await?;
            let outcome = self.settle(delivery, decision).await;
            tracing::Span::current().record("outcome", outcome.label());
            Ok(outcome)
        }
        .instrument(span)
        .await
    }

    async fn decide<D: Delivery, H: Handler<DB> + ?Sized>(
        &self,
        delivery: &D,
        handler: &H,
        stop: &CancellationToken,
        fault: Option<FaultPoint>,
    ) -> Result<Decision, Crashed> {
        let msg = delivery.message();
        let consumer = self.label();
        if stop.is_cancelled() {
            return Ok(self.interrupted());
        }
        let (identity, json) = match self.validate(msg) {
            Ok(v) => v,
            Err(bad) => return Ok(self.bad_input(bad)),
        };
        tracing::Span::current().record("message_id", identity.message_id.as_str());
        if self.retention.refuse_older_than_retention {
            if let Some(enq) = msg.enqueued_at {
                // Age on the broker's own timeline (receive time minus enqueue time).
                let age = msg
                    .received_at
                    .signed_duration_since(enq)
                    .to_std()
                    .unwrap_or_default();
                if age > self.retention.keep {
                    metrics::counter!(m::RETENTION_EXPIRED, "consumer" => consumer.clone())
                        .increment(1);
                    tracing::warn!(message_id = %identity.message_id, enqueued_at = %enq, "delivery is older than the inbox retention; its marker may be gone, refusing to apply it again");
                    return Ok(self.dead_letter(
                        "retention_expired",
                        format!(
                            "enqueued at {enq}, older than the inbox retention of {}s",
                            self.retention.keep.as_secs()
                        ),
                    ));
                }
            }
        }
        // A body already parsed for the handler is not parsed again.
        let hash = match &json {
            Some(v) => self.fingerprint.fingerprint_json(v),
            None => self.fingerprint.fingerprint(&msg.body),
        };
        crash_if(fault, FaultPoint::BeforeTransaction)?;

        let mut conn = match self.conns.take(&self.pool).await {
            Ok(c) => c,
            Err(e) => return Ok(self.store_retry("begin", &e)),
        };
        let work = Work {
            msg,
            identity: &identity,
            hash: &hash,
            json: json.as_ref(),
        };
        let mut retried = false;
        let end = loop {
            match sqlx::Connection::begin(&mut *conn).await {
                Ok(tx) => break self.in_transaction(tx, &work, handler, stop, fault).await?,
                // A connection may have died while it waited (server restart): nothing happened yet, so
                // once more on a fresh one.
                Err(e) if !retried => {
                    tracing::debug!(error = %e, "BEGIN failed; trying once more on a fresh connection");
                    retried = true;
                }
                Err(e) => return Ok(self.store_retry("begin", &e)),
            }
            conn = match self.pool.acquire().await {
                Ok(c) => c,
                Err(e) => return Ok(self.store_retry("begin", &e)),
            };
        };
        // A connection whose transaction ended cleanly serves the next delivery; any other goes back to the
        // pool, which tests it (and flushes the rollback its dropped transaction queued).
        match end {
            TxEnd::Decided { decision, clean } => {
                if clean {
                    self.conns.put(conn, &self.pool);
                }
                Ok(decision)
            }
            TxEnd::Conflict { holder, clean } => {
                // A plain duplicate ends here; a collision or business duplicate records its evidence on a
                // pool connection, so this one goes back first.
                let plain_duplicate = holder.as_ref().is_some_and(|h| h.is_same_message(&hash));
                if clean && plain_duplicate {
                    self.conns.put(conn, &self.pool);
                } else {
                    drop(conn);
                }
                Ok(self
                    .conflict(&identity, &hash, holder, msg.received_at)
                    .await)
            }
        }
    }

    /// The transaction: marker, handler, result and outbox rows, COMMIT.
    async fn in_transaction<H: Handler<DB> + ?Sized>(
        &self,
        mut tx: sqlx::Transaction<'_, DB>,
        work: &Work<'_>,
        handler: &H,
        stop: &CancellationToken,
        fault: Option<FaultPoint>,
    ) -> Result<TxEnd, Crashed> {
        let consumer = self.label();
        let msg = work.msg;
        let failed = |decision| {
            Ok(TxEnd::Decided {
                decision,
                clean: false,
            })
        };
        let started = Utc::now();
        let row = MarkerRow {
            identity: work.identity,
            payload_hash: work.hash,
            received_at: msg.received_at,
            processed_at: started,
            retention_until: started
                + chrono::Duration::from_std(self.retention.keep).unwrap_or(chrono::Duration::MAX),
            delivery_count: msg.delivery_count,
        };
        match DB::insert_marker(&mut tx, &row).await {
            Ok(MarkerInsert::Inserted) => {}
            Ok(MarkerInsert::Conflict(holder)) => {
                let clean = tx.rollback().await.is_ok();
                return Ok(TxEnd::Conflict { holder, clean });
            }
            Err(e) => return failed(self.store_retry("insert marker", &e)),
        }
        crash_if(fault, FaultPoint::AfterMarkerInsert)?;

        let inbound = Inbound {
            message: msg,
            identity: work.identity,
            json: work.json,
        };
        // A panicking handler is contained: the transaction rolls back and the delivery is retried.
        let guarded =
            std::panic::AssertUnwindSafe(handler.handle(&mut tx, &inbound)).catch_unwind();
        let handled = tokio::select! {
            biased;
            r = guarded => match r {
                Ok(r) => r,
                Err(_) => {
                    metrics::counter!(m::RETRIES, "consumer" => consumer, "reason" => "handler_panic").increment(1);
                    tracing::error!("handler panicked: rolled back, released for redelivery");
                    return failed(Decision::Release(
                        Outcome::Retry { reason: "handler panicked".into() },
                        self.retry_backoff,
                    ));
                }
            },
            _ = stop.cancelled() => return failed(self.interrupted()),
        };
        let handled = match handled {
            Ok(h) => h,
            Err(HandlerError::Retryable { source, after }) => {
                metrics::counter!(m::RETRIES, "consumer" => consumer, "reason" => "handler")
                    .increment(1);
                tracing::warn!(error = %source, "handler failed, retryable: rolled back, released for redelivery");
                return failed(Decision::Release(
                    Outcome::Retry {
                        reason: source.to_string(),
                    },
                    after.unwrap_or(self.retry_backoff),
                ));
            }
            Err(HandlerError::Permanent { source }) => {
                tracing::error!(error = %source, "handler failed permanently: rolled back, dead-lettering");
                return failed(self.dead_letter("handler_permanent", source.to_string()));
            }
            Err(other) => return failed(self.dead_letter("handler_permanent", other.to_string())),
        };
        crash_if(fault, FaultPoint::AfterBusinessChange)?;
        if let Err(e) = self.finish_in_tx(&mut tx, work.identity, &handled).await {
            return failed(self.store_retry("record result", &e));
        }
        if stop.is_cancelled() {
            return failed(self.interrupted());
        }
        if let Err(e) = tx.commit().await {
            // The COMMIT's fate is unknown: release; the redelivery finds the marker or applies it.
            return failed(self.store_retry("commit", &e));
        }
        let secs = (Utc::now() - msg.received_at)
            .num_microseconds()
            .unwrap_or(0) as f64
            / 1e6;
        metrics::histogram!(m::RECEIVE_TO_COMMIT, "consumer" => consumer.clone())
            .record(secs.max(0.0));
        metrics::counter!(m::APPLIED, "consumer" => consumer.clone()).increment(1);
        if msg.delivery_count > 1 {
            metrics::counter!(m::APPLIED_AFTER_REDELIVERY, "consumer" => consumer).increment(1);
        }
        crash_if(fault, FaultPoint::AfterCommit)?;
        Ok(TxEnd::Decided {
            decision: Decision::Ack(Outcome::Applied {
                result_reference: handled.result_reference,
            }),
            clean: true,
        })
    }

    async fn finish_in_tx(
        &self,
        conn: &mut DB::Connection,
        identity: &Identity,
        handled: &Handled,
    ) -> Result<(), sqlx::Error> {
        if let Some(r) = &handled.result_reference {
            DB::set_result_reference(conn, identity, r).await?;
        }
        let now = Utc::now();
        for o in &handled.outbox {
            DB::insert_outbox(conn, o, now).await?;
        }
        Ok(())
    }

    fn validate(
        &self,
        msg: &txinbox_core::ReceivedMessage,
    ) -> Result<(Identity, Option<serde_json::Value>), BadInput> {
        if msg.body.len() > self.rules.max_payload_bytes {
            return Err(BadInput::PayloadTooLarge {
                size: msg.body.len(),
                limit: self.rules.max_payload_bytes,
            });
        }
        // The body's format first: the business-key function may read the body.
        let json = match self.rules.body {
            BodyFormat::Any => None,
            BodyFormat::Utf8 => {
                std::str::from_utf8(&msg.body).map_err(BadInput::NotUtf8)?;
                None
            }
            BodyFormat::Json => {
                std::str::from_utf8(&msg.body).map_err(BadInput::NotUtf8)?;
                Some(serde_json::from_slice(&msg.body).map_err(BadInput::InvalidJson)?)
            }
        };
        let identity = self.policy.resolve(msg)?;
        if !self.rules.contract_versions.is_empty() {
            let ok = match &identity.contract_version {
                Some(v) => self.rules.contract_versions.iter().any(|s| s == v),
                None => !self.rules.require_contract_version,
            };
            if !ok {
                return Err(BadInput::UnsupportedContractVersion {
                    found: identity.contract_version.clone(),
                    supported: self.rules.contract_versions.clone(),
                });
            }
        }
        Ok((identity, json))
    }

    fn bad_input(&self, bad: BadInput) -> Decision {
        let consumer = self.label();
        match &bad {
            BadInput::NoIdentity { .. } | BadInput::InvalidIdentityField { .. } => {
                metrics::counter!(m::UNKNOWN_IDENTITY, "consumer" => consumer).increment(1)
            }
            BadInput::UnsupportedContractVersion { .. } => {
                metrics::counter!(m::CONTRACT_VERSION_FAILURES, "consumer" => consumer).increment(1)
            }
            _ => {}
        }
        tracing::warn!(reason = bad.reason(), error = %bad, "bad input: dead-lettering");
        self.dead_letter(bad.reason(), bad.to_string())
    }

    fn dead_letter(&self, reason: &str, detail: String) -> Decision {
        Decision::DeadLetter(
            Outcome::DeadLettered {
                reason: reason.to_owned(),
                detail: detail.clone(),
            },
            DeadLetter::new(reason, detail),
        )
    }

    fn interrupted(&self) -> Decision {
        metrics::counter!(m::INTERRUPTED, "consumer" => self.label()).increment(1);
        tracing::warn!("shutdown deadline before COMMIT: rolled back, releasing");
        Decision::Release(Outcome::Interrupted, Duration::ZERO)
    }

    fn store_retry(&self, op: &'static str, e: &sqlx::Error) -> Decision {
        metrics::counter!(m::RETRIES, "consumer" => self.label(), "reason" => "store").increment(1);
        tracing::warn!(op, error = %e, transient = crate::error::is_transient(e), "store error: rolled back, released for redelivery");
        Decision::Release(
            Outcome::Retry {
                reason: format!("{op}: {e}"),
            },
            self.retry_backoff,
        )
    }

    async fn conflict(
        &self,
        identity: &Identity,
        hash: &str,
        holder: Option<crate::backend::ExistingMarker>,
        received_at: chrono::DateTime<Utc>,
    ) -> Decision {
        let consumer = self.label();
        let Some(holder) = holder else {
            // The conflicting row vanished between the insert and the read (retention purge): try again.
            metrics::counter!(m::RETRIES, "consumer" => consumer, "reason" => "conflict_vanished")
                .increment(1);
            return Decision::Release(
                Outcome::Retry {
                    reason: "conflicting marker vanished".into(),
                },
                Duration::ZERO,
            );
        };
        // The holder began its transaction after this delivery arrived: both were in flight together.
        if holder.processed_at >= received_at {
            metrics::counter!(m::CONCURRENT_CONFLICTS, "consumer" => consumer.clone()).increment(1);
        }
        if holder.is_same_message(hash) {
            metrics::counter!(m::DUPLICATES, "consumer" => consumer).increment(1);
            tracing::info!(message_id = %identity.message_id, "duplicate: already applied, no effect");
            return Decision::Ack(Outcome::Duplicate);
        }
        let (kind, outcome, detail) = if holder.same_identity {
            metrics::counter!(m::PAYLOAD_COLLISIONS, "consumer" => consumer).increment(1);
            tracing::error!(message_id = %identity.message_id, stored_hash = %holder.payload_hash, received_hash = %hash, "payload collision: same id, other content; not applied, dead-lettering for investigation");
            (
                "payload_collision",
                Outcome::PayloadCollision {
                    stored_hash: holder.payload_hash.clone(),
                    received_hash: hash.to_owned(),
                },
                format!(
                    "message id {} was applied with payload hash {}; this copy has {}",
                    identity.message_id, holder.payload_hash, hash
                ),
            )
        } else {
            metrics::counter!(m::BUSINESS_DUPLICATES, "consumer" => consumer).increment(1);
            tracing::warn!(message_id = %identity.message_id, holder = %holder.message_id, business_key = ?identity.business_key, "business duplicate: another message applied this business key; no effect");
            (
                "business_duplicate",
                Outcome::BusinessDuplicate {
                    holder_message_id: holder.message_id.clone(),
                },
                format!(
                    "business key {:?} already applied by message {}",
                    identity.business_key, holder.message_id
                ),
            )
        };
        let conflicts_with = if holder.same_identity {
            &holder.payload_hash
        } else {
            &holder.message_id
        };
        let rej = Rejection {
            identity,
            kind,
            payload_hash: hash,
            conflicts_with,
            detail: &detail,
            recorded_at: Utc::now(),
        };
        if let Err(e) = DB::record_rejection(&self.pool, &rej).await {
            // Without the evidence row, do not settle: the redelivery will try to record it again.
            return self.store_retry("record rejection", &e);
        }
        match outcome {
            Outcome::PayloadCollision { .. } => Decision::DeadLetter(
                Outcome::PayloadCollision {
                    stored_hash: holder.payload_hash,
                    received_hash: hash.to_owned(),
                },
                DeadLetter::new("payload_collision", detail),
            ),
            other => Decision::Ack(other),
        }
    }

    async fn settle<D: Delivery>(&self, delivery: D, decision: Decision) -> Outcome {
        let consumer = self.label();
        let (op, result, outcome) = match decision {
            Decision::Ack(o) => ("ack", delivery.ack().await, o),
            Decision::Release(o, after) => ("release", delivery.release(after).await, o),
            Decision::DeadLetter(o, why) => {
                metrics::counter!(m::DEAD_LETTERS, "consumer" => consumer.clone(), "reason" => why.reason.clone()).increment(1);
                ("dead_letter", delivery.dead_letter(why).await, o)
            }
        };
        if let Err(e) = result {
            metrics::counter!(m::SETTLE_FAILURES, "consumer" => consumer, "op" => op).increment(1);
            tracing::warn!(op, error = %e, outcome = outcome.label(), "settle failed; the broker will redeliver and the inbox absorbs it");
        }
        outcome
    }

    /// Deletes markers whose retention ended, in batches of `batch`; returns how many were deleted and sets
    /// the `txinbox_inbox_rows` gauge for this consumer.
    pub async fn purge_expired(&self, batch: i64) -> Result<u64, crate::StoreError> {
        self.purge_expired_at(Utc::now(), batch).await
    }

    /// Like [`Inbox::purge_expired`] with an explicit clock: deletes markers whose retention ended before
    /// `now`.
    pub async fn purge_expired_at(
        &self,
        now: chrono::DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, crate::StoreError> {
        let mut total = 0;
        loop {
            let n = DB::purge_expired(&self.pool, now, batch.max(1)).await?;
            total += n;
            if n < batch.max(1) as u64 {
                break;
            }
        }
        let rows = DB::count_markers(&self.pool, &self.consumer).await?;
        metrics::counter!(m::RETENTION_PURGED, "consumer" => self.label()).increment(total);
        metrics::gauge!(m::INBOX_ROWS, "consumer" => self.label()).set(rows as f64);
        Ok(total)
    }
}

fn crash_if(fault: Option<FaultPoint>, here: FaultPoint) -> Result<(), Crashed> {
    if fault == Some(here) {
        tracing::warn!(at = ?here, "simulated crash");
        return Err(Crashed(here));
    }
    Ok(())
}

fn unreachable_crash() -> Outcome {
    // process_until passes no fault, so crash_if never fires; keep a known outcome rather than a panic.
    Outcome::Interrupted
}

/// An [`Inbox`] bound to a handler: the [`Processor`] a [`txinbox_core::Worker`] runs.
pub struct InboxProcessor<DB: Backend, H> {
    inbox: Inbox<DB>,
    handler: Arc<H>,
}

impl<DB: Backend, H> InboxProcessor<DB, H> {
    /// The inbox.
    pub fn inbox(&self) -> &Inbox<DB> {
        &self.inbox
    }
}

impl<DB: Backend, D: Delivery, H: Handler<DB>> Processor<D> for InboxProcessor<DB, H> {
    fn consumer(&self) -> &str {
        self.inbox.consumer()
    }

    fn process(
        &self,
        delivery: D,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = Outcome> + Send {
        let inbox = self.inbox.clone();
        let handler = self.handler.clone();
        async move { inbox.process_until(delivery, &*handler, &stop).await }.boxed()
    }
}
