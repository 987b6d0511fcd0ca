//! The decisions of one delivery: validate, resolve the identity, insert the marker, run the handler, read a
//! refused marker (duplicate, payload collision, business duplicate), and settle only after COMMIT.

use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use tracing::Instrument;

use crate::broker::message::ReceivedMessage;
use crate::broker::{DeadLetter, Delivery};
use crate::effects::NewEffect;
use crate::error::BadInput;
use crate::metrics as m;
use crate::pipeline::handler::{Handled, Handler, HandlerError, Message, Payload};
use crate::pipeline::identity::{IdOrigin, Identity};
use crate::pipeline::outcome::Outcome;
use crate::store::{Commit, ExistingMarker, InboxStore, MarkerInsert, MarkerRow};
use crate::CancellationToken;

use super::ending::dead_letter;
use super::{BodyFormat, Inbox, TypedKeyFn};

/// Where a delivery ended before settling.
#[derive(Debug)]
pub(super) enum Decision {
    Ack(Outcome),
    Release(Outcome, Duration),
    DeadLetter(Outcome, DeadLetter),
}

/// Where the work of one delivery inside a transaction ended.
pub(super) enum Step<E> {
    /// Marker, business change and result written; waiting for COMMIT.
    Applied(Done),
    /// A unique constraint refused the marker (nothing written).
    Conflict(Prepared<()>, Option<ExistingMarker>),
    /// Roll back (the delivery's writes) and settle this way.
    Failed(Decision),
    /// The handler's part failed after the marker went in: roll back (the delivery's writes), then decide
    /// it ([`Inbox::holder_after_failure`], [`Inbox::failed`]).
    Unhandled(Prepared<()>, Failure<E>),
    /// Stopped (shutdown deadline) while the handler ran.
    Interrupted,
}

/// Where the handler's part of one delivery ended (its marker already in).
pub(super) enum Handling<E> {
    /// Business change and result written; waiting for COMMIT.
    Done(Done),
    /// Roll back; not yet counted (see [`Inbox::failed`]). The delivery, its body spent.
    Failed(Failure<E>, Prepared<()>),
    /// Stopped (shutdown deadline) while the handler ran.
    Interrupted,
}

/// What went wrong in the transaction, as it happened.
pub(super) enum Failure<E> {
    /// The handler returned an error.
    Handler(HandlerError),
    /// The handler panicked.
    Panicked,
    /// The handler's answer cannot be kept (two effects of one name): settle this way.
    Refused(Decision),
    /// A statement of the inbox's own failed.
    Store(&'static str, E),
}

/// A delivery written in an open transaction.
pub(super) struct Done {
    pub(super) result_reference: Option<String>,
    pub(super) prepared: Prepared<()>,
}

/// A delivery that passed validation.
pub(super) struct Prepared<T> {
    pub(super) identity: Identity,
    pub(super) hash: String,
    /// The broker handed this message out before ([`ReceivedMessage::delivery_count`] over 1).
    pub(super) redelivered: bool,
    pub(super) body: T,
}

impl<T> Prepared<T> {
    /// Without its body (the handler took it, or will never get it).
    pub(super) fn spent(self) -> Prepared<()> {
        Prepared {
            identity: self.identity,
            hash: self.hash,
            redelivered: self.redelivered,
            body: (),
        }
    }
}

impl<S: InboxStore> Inbox<S> {
    pub(super) async fn run<D, T, H>(
        &self,
        delivery: D,
        handler: &H,
        key: Option<&TypedKeyFn<T>>,
        stop: &CancellationToken,
    ) -> Outcome
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        let span = tracing::info_span!(
            "txinbox.process",
            consumer = %self.consumer,
            message_id = tracing::field::Empty,
            delivery_count = delivery.message().delivery_count,
            outcome = tracing::field::Empty,
        );
        async move {
            metrics::counter!(m::RECEIVED, "consumer" => self.label()).increment(1);
            if delivery
                .message()
                .attribute(crate::broker::dead_letter::REDRIVEN_FROM)
                .is_some()
            {
                metrics::counter!(m::REDRIVEN, "consumer" => self.label()).increment(1);
            }
            let decision = self.decide(delivery.message(), handler, key, stop).await;
            let outcome = self.settle(delivery, decision).await;
            tracing::Span::current().record("outcome", outcome.label());
            outcome
        }
        .instrument(span)
        .await
    }

    pub(super) async fn decide<T: Payload, H: Handler<S, T>>(
        &self,
        msg: &ReceivedMessage,
        handler: &H,
        key: Option<&TypedKeyFn<T>>,
        stop: &CancellationToken,
    ) -> Decision {
        if stop.is_cancelled() {
            return self.interrupted();
        }
        let prepared = match self.prepare::<T>(msg, key) {
            Ok(p) => p,
            Err(bad) => return self.bad_input(bad),
        };
        tracing::Span::current().record("message_id", prepared.identity.message_id.as_str());
        if let Some(refused) = self.refuse_if_expired(msg, &prepared.identity) {
            return refused;
        }
        self.decide_prepared(prepared, msg, handler, stop).await
    }

    /// The transaction of one validated delivery: BEGIN, marker, handler, result, COMMIT.
    pub(super) async fn decide_prepared<T: Payload, H: Handler<S, T>>(
        &self,
        prepared: Prepared<T>,
        msg: &ReceivedMessage,
        handler: &H,
        stop: &CancellationToken,
    ) -> Decision {
        let tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(e) => return self.store_retry("begin", &e),
        };
        match self.apply(&tx, prepared, msg, handler, stop).await {
            Step::Applied(done) => {
                if stop.is_cancelled() {
                    let _ = self.store.rollback(tx, false).await;
                    return self.interrupted();
                }
                match self.store.commit(tx).await {
                    Ok(Commit::Done) => self.applied(msg, done.result_reference),
                    Ok(Commit::Conflict(holder)) => {
                        self.conflict(&done.prepared, holder, msg.received_at).await
                    }
                    Ok(Commit::HandlerFailed(e)) => self.handler_failed(e),
                    // The COMMIT's fate is unknown: release; the redelivery finds the marker or applies it.
                    Err(e) => self.store_retry("commit", &e),
                }
            }
            Step::Conflict(prepared, holder) => {
                // A plain duplicate ends here cleanly; a collision or business duplicate records its
                // evidence in a transaction of its own, so this one ends first.
                let plain = holder
                    .as_ref()
                    .is_some_and(|h| h.is_same_message(&prepared.hash));
                let _ = self.store.rollback(tx, plain).await;
                self.conflict(&prepared, holder, msg.received_at).await
            }
            Step::Failed(decision) => {
                let _ = self.store.rollback(tx, false).await;
                decision
            }
            Step::Unhandled(prepared, failure) => {
                let _ = self.store.rollback(tx, false).await;
                self.decide_failure(failure, &prepared, msg.received_at)
                    .await
            }
            Step::Interrupted => {
                let _ = self.store.rollback(tx, false).await;
                self.interrupted()
            }
        }
    }

    /// The marker insert, the handler and its result in `tx` (or, in a batch, under the delivery's
    /// savepoint). Rolling back after anything but [`Step::Applied`] is the caller's.
    pub(super) async fn apply<T: Payload, H: Handler<S, T>>(
        &self,
        tx: &S::Tx,
        prepared: Prepared<T>,
        msg: &ReceivedMessage,
        handler: &H,
        stop: &CancellationToken,
    ) -> Step<S::Error> {
        let inserted = {
            let row = self.marker_row(&prepared, msg, Utc::now());
            self.store.insert_marker(tx, &row).await
        };
        match inserted {
            Ok(MarkerInsert::Inserted) => {}
            Ok(MarkerInsert::Conflict(holder)) => return Step::Conflict(prepared.spent(), holder),
            Ok(other) => return Step::Failed(self.unplaced(&prepared.identity, other)),
            Err(e) => return Step::Failed(self.store_retry("insert marker", &e)),
        }
        match self.handle(tx, prepared, msg, handler, stop).await {
            Handling::Done(done) => Step::Applied(done),
            Handling::Failed(f, p) => Step::Unhandled(p, f),
            Handling::Interrupted => Step::Interrupted,
        }
    }

    /// The decision for a marker the store could not place ([`MarkerInsert::Expired`],
    /// [`MarkerInsert::Unplaced`] or [`MarkerInsert::Refused`]); nothing of the delivery was written.
    pub(super) fn unplaced(&self, identity: &Identity, answer: MarkerInsert) -> Decision {
        match answer {
            MarkerInsert::Expired(why) => {
                metrics::counter!(m::RETENTION_EXPIRED, "consumer" => self.label()).increment(1);
                tracing::warn!(message_id = %identity.message_id, reason = %why, "the marker's partition is past the inbox retention; an earlier copy's marker may be gone, refusing to apply it again");
                dead_letter("retention_expired", why)
            }
            MarkerInsert::Refused { reason, detail } => {
                tracing::warn!(message_id = %identity.message_id, reason = %reason, detail = %detail, "the store cannot hold this message's marker: dead-lettered");
                dead_letter(&reason, detail)
            }
            MarkerInsert::Unplaced(why) => {
                metrics::counter!(m::PARTITION_MISSING, "consumer" => self.label()).increment(1);
                tracing::error!(message_id = %identity.message_id, reason = %why, "no partition for the marker: released for a retry (is the maintenance running?)");
                Decision::Release(Outcome::Retry { reason: why }, self.retry_backoff)
            }
            // Inserted and Conflict are decided by the callers.
            other => self.store_retry_msg("insert marker", &format!("unexpected answer {other:?}")),
        }
    }

    /// The marker row of a validated delivery, written at `now`.
    pub(super) fn marker_row<'p, T>(
        &self,
        prepared: &'p Prepared<T>,
        msg: &ReceivedMessage,
        now: chrono::DateTime<Utc>,
    ) -> MarkerRow<'p> {
        MarkerRow {
            identity: &prepared.identity,
            payload_hash: &prepared.hash,
            received_at: msg.received_at,
            processed_at: now,
            retention_until: crate::time::after(now, self.retention.keep),
            delivery_count: msg.delivery_count,
            origin_at: prepared
                .identity
                .event_time
                .or(msg.enqueued_at)
                .unwrap_or(msg.received_at),
            enqueued_at: msg.enqueued_at,
        }
    }

    /// The handler and its result in `tx`, once the delivery's marker is in. A failure is handed back as it
    /// happened, neither counted nor logged yet: [`Inbox::failed`] does both, once, whichever pass of a
    /// batch met it.
    pub(super) async fn handle<T: Payload, H: Handler<S, T>>(
        &self,
        tx: &S::Tx,
        prepared: Prepared<T>,
        msg: &ReceivedMessage,
        handler: &H,
        stop: &CancellationToken,
    ) -> Handling<S::Error> {
        let Prepared {
            identity,
            hash,
            redelivered,
            body,
        } = prepared;
        let message = Message {
            body,
            identity,
            raw: msg.clone(),
        };
        // The delivery without its body, handed back with a failure or kept for the COMMIT.
        let spent = Prepared {
            identity: message.identity.clone(),
            hash,
            redelivered,
            body: (),
        };
        // A panicking handler is contained: the transaction rolls back and the delivery is retried.
        let guarded =
            std::panic::AssertUnwindSafe(handler.handle(tx.clone(), message)).catch_unwind();
        let handled = tokio::select! {
            biased;
            r = guarded => r,
            _ = stop.cancelled() => return Handling::Interrupted,
        };
        let handled: Handled = match handled {
            Ok(Ok(h)) => h.into(),
            Ok(Err(e)) => return Handling::Failed(Failure::Handler(e), spent),
            Err(_) => return Handling::Failed(Failure::Panicked, spent),
        };
        let now = Utc::now();
        let identity = &spent.identity;
        let mut effects = Vec::with_capacity(handled.effects.len());
        let mut refused = None;
        for e in &handled.effects {
            if let Err(why) = check_effect(e) {
                refused = Some(format!("the handler recorded an effect whose {why}"));
                break;
            }
            let key = crate::effects::idempotency_key(identity, &e.name);
            if effects.iter().any(|n: &NewEffect<'_>| n.key == key) {
                refused = Some(format!("the handler recorded two effects named {:?}: an effect's name must be unique within its message", e.name));
                break;
            }
            effects.push(NewEffect {
                consumer: &self.consumer,
                message_id: &identity.message_id,
                key,
                effect: e,
                created_at: now,
            });
        }
        // The reference as every store keeps it, so that this delivery's outcome says what a copy of it, or a
        // business duplicate, is later answered (in a batch, the copies that meet this marker are answered
        // with this value).
        let result_reference =
            handled
                .result_reference
                .map(|r| match crate::store::kept_text(&r) {
                    std::borrow::Cow::Owned(kept) => kept,
                    // Kept as given: no copy.
                    std::borrow::Cow::Borrowed(_) => r,
                });
        let recorded = match refused {
            Some(why) => Err(Failure::Refused(dead_letter("handler_permanent", why))),
            None => self
                .store
                .record_result(tx, identity, result_reference.as_deref(), &effects)
                .await
                .map_err(|e| Failure::Store("record result", e)),
        };
        drop(effects);
        if let Err(f) = recorded {
            return Handling::Failed(f, spent);
        }
        Handling::Done(Done {
            result_reference,
            prepared: spent,
        })
    }

    /// A failure of the handler's part of `p` (its writes rolled back) as the decision it leads to: a
    /// permanent one of a copy whose message is held is decided by its holder
    /// ([`Inbox::holder_after_failure`]), as a commit-time conflict is; any other as [`Inbox::failed`] decides
    /// it.
    pub(super) async fn decide_failure(
        &self,
        f: Failure<S::Error>,
        p: &Prepared<()>,
        received_at: chrono::DateTime<Utc>,
    ) -> Decision {
        match self.holder_after_failure(&f, p).await {
            Ok(Some(holder)) => self.conflict(p, Some(holder), received_at).await,
            Ok(None) => self.failed(f),
            Err(release) => release,
        }
    }

    /// The holder of `p`'s message when `f` would dead-letter it after its handler ran (the handler's
    /// permanent error, effects the pipeline refuses), or would release a copy the broker handed out before
    /// (a retryable error or a panic of a redelivered copy): a store that checks its markers at commit ran the
    /// handler of a copy whose marker is held, which a store that inserts the marker first never runs; left
    /// to its failure, such a copy would be dead-lettered, or released until the broker's delivery limit
    /// dead-letters it, although its message was applied. A first delivery's retryable failure is not asked
    /// about (its redelivery is): the read is paid on the retry path of a redelivered copy only. Asked of
    /// [`InboxStore::holder_of`] on these paths only (its default answers `None` without a round trip).
    /// `Ok(None)`: the failure stands. `Err`: the store could not tell for now (a transient error): the
    /// delivery is released, and its redelivery decides it; a store error that is not transient leaves the
    /// failure standing.
    pub(super) async fn holder_after_failure(
        &self,
        f: &Failure<S::Error>,
        p: &Prepared<()>,
    ) -> Result<Option<ExistingMarker>, Decision> {
        // What failed, for the log: read only when it is written.
        let why: &(dyn std::fmt::Display + Sync) = match f {
            Failure::Handler(e) if p.redelivered || self.retry_of(e).is_none() => e,
            Failure::Panicked if p.redelivered => &"the handler panicked",
            Failure::Refused(Decision::DeadLetter(_, dl)) => &dl.detail,
            _ => return Ok(None),
        };
        match self.store.holder_of(&p.identity).await {
            Ok(Some(holder)) => {
                tracing::debug!(message_id = %p.identity.message_id, failure = %why, "the handler's part failed, but the message's marker or business key is held: decided by its holder");
                Ok(Some(holder))
            }
            Ok(None) => Ok(None),
            Err(e) if S::is_transient(&e) => {
                tracing::warn!(message_id = %p.identity.message_id, failure = %why, "the handler's part failed; whether the message's marker is held could not be read for now: released");
                Err(self.store_retry("read the marker's holder", &e))
            }
            Err(e) => {
                tracing::warn!(message_id = %p.identity.message_id, error = %e, "whether the message's marker is held could not be read: the handler's failure stands");
                Ok(None)
            }
        }
    }

    /// A failure of the work in the transaction, counted and logged, as the decision it leads to.
    pub(super) fn failed(&self, f: Failure<S::Error>) -> Decision {
        match f {
            Failure::Handler(e) => self.handler_failed(e),
            Failure::Panicked => {
                metrics::counter!(m::RETRIES, "consumer" => self.label(), "reason" => "handler_panic")
                    .increment(1);
                tracing::error!("handler panicked: rolled back, released for redelivery");
                Decision::Release(
                    Outcome::Retry {
                        reason: "handler panicked".into(),
                    },
                    self.retry_backoff,
                )
            }
            Failure::Refused(decision) => decision,
            Failure::Store(op, e) => self.store_retry(op, &e),
        }
    }

    /// A delivery whose transaction committed: counted and acknowledged.
    pub(super) fn applied(
        &self,
        msg: &ReceivedMessage,
        result_reference: Option<String>,
    ) -> Decision {
        let consumer = self.label();
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
        Decision::Ack(Outcome::Applied { result_reference })
    }

    /// Validation, identity and fingerprint: everything decided before the transaction opens.
    pub(super) fn prepare<T: Payload>(
        &self,
        msg: &ReceivedMessage,
        key: Option<&TypedKeyFn<T>>,
    ) -> Result<Prepared<T>, BadInput> {
        if msg.body.len() > self.rules.max_payload_bytes {
            return Err(BadInput::PayloadTooLarge {
                size: msg.body.len(),
                limit: self.rules.max_payload_bytes,
            });
        }
        // The body's format first: the business-key function may read the body.
        let json = self.body_json::<T>(msg)?;
        let mut identity = self.policy.resolve(msg)?;
        let body = body_of::<T>(msg, json.as_ref(), identity.origin)?;
        if let Some(f) = key {
            if let Some(k) = crate::pipeline::identity::contain_key_panic(|| f(&body))? {
                identity.set_business_key(k)?;
            }
        }
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
        // A body already parsed is not parsed again.
        let hash = match &json {
            Some(v) => self.fingerprint.fingerprint_json(v),
            None => self.fingerprint.fingerprint(&msg.body),
        };
        Ok(Prepared {
            identity,
            hash,
            redelivered: msg.delivery_count > 1,
            body,
        })
    }

    /// The body as JSON when the handler's type or the input rules want JSON (checked UTF-8 first); the
    /// UTF-8 check alone when the rules want text.
    pub(super) fn body_json<T: Payload>(
        &self,
        msg: &ReceivedMessage,
    ) -> Result<Option<serde_json::Value>, BadInput> {
        if T::JSON || self.rules.body == BodyFormat::Json {
            std::str::from_utf8(&msg.body).map_err(BadInput::NotUtf8)?;
            return serde_json::from_slice(&msg.body)
                .map(Some)
                .map_err(BadInput::InvalidJson);
        }
        if self.rules.body == BodyFormat::Utf8 {
            std::str::from_utf8(&msg.body).map_err(BadInput::NotUtf8)?;
        }
        Ok(None)
    }

    /// A delivery's body for the handler once more (a batch that gave up its first pass applies it again):
    /// what [`Inbox::prepare`] made of it, without resolving the identity again (which counts and logs).
    pub(super) fn prepared_again<T: Payload>(
        &self,
        msg: &ReceivedMessage,
        p: Prepared<()>,
    ) -> Result<Prepared<T>, BadInput> {
        let json = self.body_json::<T>(msg)?;
        let body = body_of::<T>(msg, json.as_ref(), p.identity.origin)?;
        Ok(Prepared {
            identity: p.identity,
            hash: p.hash,
            redelivered: p.redelivered,
            body,
        })
    }

    /// A delivery older than the retention may have lost its marker: refuse it rather than apply it again.
    pub(super) fn refuse_if_expired(
        &self,
        msg: &ReceivedMessage,
        identity: &Identity,
    ) -> Option<Decision> {
        if !self.retention.refuse_older_than_retention {
            return None;
        }
        let enq = msg.enqueued_at?;
        // Age on the broker's own timeline (receive time minus enqueue time).
        let age = msg
            .received_at
            .signed_duration_since(enq)
            .to_std()
            .unwrap_or_default();
        if age <= self.retention.keep {
            return None;
        }
        metrics::counter!(m::RETENTION_EXPIRED, "consumer" => self.label()).increment(1);
        tracing::warn!(message_id = %identity.message_id, enqueued_at = %enq, "delivery is older than the inbox retention; its marker may be gone, refusing to apply it again");
        Some(dead_letter(
            "retention_expired",
            format!(
                "enqueued at {enq}, older than the inbox retention of {}s",
                self.retention.keep.as_secs()
            ),
        ))
    }
}

/// The handler's body of a message: a structured CloudEvent carries the payload in `data`.
pub(super) fn body_of<T: Payload>(
    msg: &ReceivedMessage,
    json: Option<&serde_json::Value>,
    origin: IdOrigin,
) -> Result<T, BadInput> {
    let data = match (json, origin) {
        (Some(v), IdOrigin::CloudEventsBody) => v.get("data"),
        (Some(v), _) => Some(v),
        (None, _) => None,
    };
    T::from_delivery(msg, data)
}

/// Whether an effect's names can be stored and indexed by every store: its name and destination non-empty,
/// these and its external reference and group at most [`MAX_ID_LEN`](crate::pipeline::identity::MAX_ID_LEN)
/// bytes without control characters. PostgreSQL refuses a NUL in text and an index entry over about 2.7 KB,
/// on every delivery of the message: refused here, the message is dead-lettered with the reason instead of
/// being released for ever.
fn check_effect(e: &crate::effects::Effect) -> Result<(), String> {
    use crate::pipeline::identity::{fits_id_field, MAX_ID_LEN};
    let fields = [
        ("name", Some(e.name.as_str())),
        ("destination", Some(e.destination.as_str())),
        ("external reference", e.external_ref.as_deref()),
        ("group", e.group.as_deref()),
    ];
    for (field, value) in fields {
        let Some(v) = value else { continue };
        if v.is_empty() || !fits_id_field(v) {
            return Err(format!(
                "{field} is not 1 to {MAX_ID_LEN} bytes without control characters (it has {} bytes): {:?}",
                v.len(),
                v.chars().take(64).collect::<String>()
            ));
        }
    }
    Ok(())
}
