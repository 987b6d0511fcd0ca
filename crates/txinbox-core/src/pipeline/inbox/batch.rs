//! Batch apply: the deliveries of one receive in one database transaction, each isolated from the others.
//!
//! ```text
//! validate, identity, fingerprint of every delivery (bad input: dead-letter, never in the transaction)
//! BEGIN
//!   INSERT every marker (one statement on PostgreSQL) .. a refused one is remembered; decided after COMMIT
//!                                                        as alone (duplicate, collision, business duplicate)
//!   for each inserted delivery, in receive order:
//!     handler(tx, message)  Ok -> result and effect rows, kept
//!                           Err / panic / store error -> the first pass gives up (below)
//! COMMIT  (one WAL flush for the batch)
//!   done ....... every kept delivery is applied; settle all (ack / release / dead-letter) at once
//!   failed ..... nothing of the transaction is settled as applied: its deliveries are released
//!
//! a handler failed: ROLLBACK; that delivery keeps its failure (decided as alone); the others again:
//! BEGIN
//!   for each delivery, in receive order:
//!     SAVEPOINT
//!     INSERT marker ... conflict ........ remembered; decided after COMMIT as alone
//!     handler(tx, message)  Ok  -> result and effect rows, kept
//!                           Err / panic / store error -> ROLLBACK TO SAVEPOINT, decided as alone
//! COMMIT
//! ```
//!
//! The first pass costs one round trip per handler statement plus three (BEGIN, the markers, COMMIT); the
//! savepoint pass two more per delivery (the savepoint and its own marker insert), and runs only when a
//! handler of the batch failed. A delivery of a FIFO group whose earlier message in the batch is released is
//! released with it (same delay), so the group's order holds.

use std::collections::HashMap;

use futures::future::join_all;

use super::*;
use std::time::Duration;

use chrono::Utc;
use tracing::Instrument;

use super::decide::*;
use crate::broker::Delivery;
use crate::metrics as m;
use crate::pipeline::handler::{Handler, Payload};
use crate::pipeline::identity::Identity;
use crate::pipeline::outcome::Outcome;
use crate::store::{Commit, ExistingMarker, InboxStore, MarkerInsert, MarkerRow};
use crate::CancellationToken;

/// Where the first pass of a batch ended.
enum FirstPass<T, E> {
    /// Every delivery written or conflicted: commit.
    Written,
    /// Stopped while a handler ran.
    Interrupted,
    /// The marker inserts failed.
    StoreFailed(&'static str, E),
    /// The store answered another number of marker inserts than it was given.
    Miscounted(String),
    /// A handler failed: roll back, keep its failure (with its delivery), apply `again` under savepoints.
    GaveUp {
        failed: Box<(usize, Failure<E>, Prepared<()>)>,
        again: Vec<(usize, Again<T>)>,
    },
}

/// A delivery to apply again after the first pass gave up.
enum Again<T> {
    /// Not reached by the first pass: its body is still here.
    Fresh(Prepared<T>),
    /// Handled (or conflicted) and rolled back: its body is parsed again.
    Spent(Prepared<()>),
}

impl<T> Again<T> {
    fn identity(&self) -> &Identity {
        match self {
            Again::Fresh(p) => &p.identity,
            Again::Spent(p) => &p.identity,
        }
    }
}

/// Whether two deliveries carry the same message (consumer, source, id) or the same business key of the same
/// tenant (no tenant and an empty one being one, as in the stores): the one's marker, committed, holds the
/// other.
fn shares(a: &Identity, b: &Identity) -> bool {
    let same_message =
        a.consumer == b.consumer && a.source == b.source && a.message_id == b.message_id;
    let same_key = a.consumer == b.consumer
        && a.business_slot().is_some()
        && a.business_slot() == b.business_slot();
    same_message || same_key
}

/// Every delivery not decided yet decided by `f`.
fn finish(slots: Vec<Slot>, f: &dyn Fn() -> Decision) -> Vec<Decision> {
    slots
        .into_iter()
        .map(|s| match s {
            Slot::Decided(d) => d,
            _ => f(),
        })
        .collect()
}

/// The FIFO groups a batch released a message of: each with the earliest such message's position in the
/// batch and its delay.
type Held = HashMap<String, (usize, Duration)>;

/// The delay of the delivery at position `i` when an earlier message of its FIFO group was released (`held`):
/// it is released with that message. A message ahead of the released one is not held back.
fn behind(held: &Held, i: usize, msg: &crate::ReceivedMessage) -> Option<Duration> {
    let (at, delay) = held.get(msg.group_id.as_ref()?)?;
    (*at < i).then_some(*delay)
}

/// When `d`, the decision of the delivery at position `i`, releases it: its FIFO group's later messages in the
/// batch are held back behind it (the earliest released message of a group counts).
fn hold(held: &mut Held, i: usize, msg: &crate::ReceivedMessage, d: &Decision) {
    if let (Decision::Release(_, delay), Some(g)) = (d, &msg.group_id) {
        let at = held.entry(g.clone()).or_insert((i, *delay));
        if i < at.0 {
            *at = (i, *delay);
        }
    }
}

/// Where one delivery of a batch stands.
enum Slot {
    /// Decided; settle this way.
    Decided(Decision),
    /// Written in the batch transaction; applied at COMMIT.
    Written(Done),
    /// Its marker conflicted in the batch transaction; decided after COMMIT.
    Conflicted(Prepared<()>, Option<ExistingMarker>),
    /// Validated, not yet in the transaction.
    Pending,
}

impl<S: InboxStore> Inbox<S> {
    /// Applies `deliveries` (those of one receive, in receive order) in one transaction, then settles them
    /// all; returns their outcomes in the same order. Each delivery gets the outcome it would get from
    /// [`Inbox::process_until`] alone: the markers go in with one [`InboxStore::insert_markers`], the
    /// handlers run one after the other, and when one fails the batch is applied again without it, each
    /// delivery under a savepoint (the repository's `docs/batching.md` draws it). A store without savepoints
    /// gets one transaction per delivery in that case.
    pub async fn process_batch<D, T, H>(
        &self,
        deliveries: Vec<D>,
        handler: &H,
        stop: &CancellationToken,
    ) -> Vec<Outcome>
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        self.run_batch(deliveries, handler, None, stop).await
    }

    pub(crate) async fn run_batch<D, T, H>(
        &self,
        deliveries: Vec<D>,
        handler: &H,
        key: Option<&TypedKeyFn<T>>,
        stop: &CancellationToken,
    ) -> Vec<Outcome>
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        if deliveries.len() <= 1 {
            let mut out = Vec::with_capacity(1);
            for d in deliveries {
                out.push(self.run(d, handler, key, stop).await);
            }
            return out;
        }
        let span = tracing::info_span!(
            "txinbox.batch",
            consumer = %self.consumer,
            size = deliveries.len(),
            applied = tracing::field::Empty,
        );
        async move {
            let slots = self.decide_batch(&deliveries, handler, key, stop).await;
            let applied = slots
                .iter()
                .filter(|d| matches!(d, Decision::Ack(Outcome::Applied { .. })))
                .count();
            tracing::Span::current().record("applied", applied);
            // Every decision is final now (the COMMIT, if any, is behind us): settle them all at once.
            join_all(
                deliveries
                    .into_iter()
                    .zip(slots)
                    .map(|(d, decision)| self.settle(d, decision)),
            )
            .await
        }
        .instrument(span)
        .await
    }

    /// The decisions of a batch, one per delivery, in order.
    async fn decide_batch<D, T, H>(
        &self,
        deliveries: &[D],
        handler: &H,
        key: Option<&TypedKeyFn<T>>,
        stop: &CancellationToken,
    ) -> Vec<Decision>
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        let mut slots: Vec<Slot> = Vec::with_capacity(deliveries.len());
        let mut work: Vec<(usize, Prepared<T>)> = Vec::with_capacity(deliveries.len());
        for (i, d) in deliveries.iter().enumerate() {
            let msg = d.message();
            metrics::counter!(m::RECEIVED, "consumer" => self.label()).increment(1);
            if msg
                .attribute(crate::broker::dead_letter::REDRIVEN_FROM)
                .is_some()
            {
                metrics::counter!(m::REDRIVEN, "consumer" => self.label()).increment(1);
            }
            if stop.is_cancelled() {
                // Stopped before it starts (prefetched at shutdown, or past the deadline): handed back
                // unread, as one delivery is; not dead-lettered for its input.
                slots.push(Slot::Pending);
                continue;
            }
            let slot = match self.prepare::<T>(msg, key) {
                Err(bad) => Slot::Decided(self.bad_input(bad)),
                Ok(p) => match self.refuse_if_expired(msg, &p.identity) {
                    Some(refused) => Slot::Decided(refused),
                    None => {
                        work.push((i, p));
                        Slot::Pending
                    }
                },
            };
            slots.push(slot);
        }
        if work.is_empty() || stop.is_cancelled() {
            return finish(slots, &|| self.interrupted());
        }
        let tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(e) => return finish(slots, &|| self.store_retry("begin", &e)),
        };
        let (work, held) = match self
            .first_pass(&tx, &mut slots, work, deliveries, handler, stop)
            .await
        {
            FirstPass::Written => {
                return self
                    .commit_batch(tx, slots, deliveries, handler, key, stop)
                    .await
            }
            FirstPass::Interrupted => {
                let _ = self.store.rollback(tx, false).await;
                return finish(slots, &|| self.interrupted());
            }
            FirstPass::StoreFailed(op, e) => {
                let _ = self.store.rollback(tx, false).await;
                return finish(slots, &|| self.store_retry(op, &e));
            }
            FirstPass::Miscounted(why) => {
                let _ = self.store.rollback(tx, false).await;
                return finish(slots, &|| self.store_retry_msg("insert markers", &why));
            }
            FirstPass::GaveUp { failed, again } => {
                let _ = self.store.rollback(tx, false).await;
                let (i, failure, prepared) = *failed;
                let received_at = deliveries[i].message().received_at;
                // Another delivery of the batch carrying its message or business key may commit and hold it
                // (a store that checks its markers at commit ran both handlers): the failure is then decided
                // after the batch's COMMIT, as one delivery after the other decides it. Meanwhile it holds
                // its FIFO group back as the failure would.
                if again
                    .iter()
                    .any(|(_, e)| shares(e.identity(), &prepared.identity))
                {
                    slots[i] = Slot::Decided(self.provisional(&failure));
                    let (work, held) = self.again(slots.as_mut_slice(), again, deliveries);
                    let mut decisions = if work.is_empty() || stop.is_cancelled() {
                        finish(slots, &|| self.interrupted())
                    } else {
                        self.with_savepoints(slots, work, held, deliveries, handler, key, stop)
                            .await
                    };
                    decisions[i] = self.decide_failure(failure, &prepared, received_at).await;
                    return decisions;
                }
                let decision = self.decide_failure(failure, &prepared, received_at).await;
                slots[i] = Slot::Decided(decision);
                self.again(slots.as_mut_slice(), again, deliveries)
            }
        };
        if work.is_empty() || stop.is_cancelled() {
            return finish(slots, &|| self.interrupted());
        }
        self.with_savepoints(slots, work, held, deliveries, handler, key, stop)
            .await
    }

    /// What a failure of the first pass releases (its FIFO group held back behind it) before it is decided,
    /// neither counted nor logged: its decision comes after the batch's COMMIT.
    fn provisional(&self, f: &Failure<S::Error>) -> Decision {
        let delay = match f {
            Failure::Handler(e) => self.retry_of(e).map(|a| a.unwrap_or(self.retry_backoff)),
            Failure::Panicked | Failure::Store(..) => Some(self.retry_backoff),
            Failure::Refused(Decision::Release(_, d)) => Some(*d),
            Failure::Refused(_) => None,
        };
        match delay {
            Some(d) => Decision::Release(Outcome::Interrupted, d),
            None => Decision::Ack(Outcome::Interrupted),
        }
    }

    /// The deliveries to apply again after the first pass gave up, and the FIFO groups held back.
    fn again<D: Delivery, T: Payload>(
        &self,
        slots: &mut [Slot],
        again: Vec<(usize, Again<T>)>,
        deliveries: &[D],
    ) -> (Vec<(usize, Prepared<T>)>, Held) {
        // Every group a decided delivery released (this failure, a marker not placed) holds its later
        // messages back in the savepoint pass (not its earlier ones: they go ahead of it, as alone).
        let mut held = HashMap::new();
        for (j, slot) in slots.iter().enumerate() {
            if let Slot::Decided(d) = slot {
                hold(&mut held, j, deliveries[j].message(), d);
            }
        }
        let mut work = Vec::with_capacity(again.len());
        for (j, entry) in again {
            match entry {
                Again::Fresh(p) => work.push((j, p)),
                Again::Spent(p) => match self.prepared_again(deliveries[j].message(), p) {
                    Ok(p) => work.push((j, p)),
                    Err(bad) => slots[j] = Slot::Decided(self.bad_input(bad)),
                },
            }
        }
        (work, held)
    }

    /// The first pass of a batch, in `tx`: every marker in one call ([`InboxStore::insert_markers`]: one
    /// statement on PostgreSQL), then the handlers one after the other with no savepoint between them. When
    /// every handler succeeds (the usual case) the batch costs one round trip per handler statement plus
    /// three. When one fails, the pass gives up: the caller rolls back, keeps that delivery's failure, and
    /// applies the others again, each under its own savepoint ([`Inbox::with_savepoints`]), so that each
    /// gets the outcome it would get alone. A handler before the failed one has then run twice, the first
    /// time rolled back: handlers keep every effect in the transaction (or record it as an effect), as a
    /// retried delivery already requires.
    async fn first_pass<D, T, H>(
        &self,
        tx: &S::Tx,
        slots: &mut [Slot],
        work: Vec<(usize, Prepared<T>)>,
        deliveries: &[D],
        handler: &H,
        stop: &CancellationToken,
    ) -> FirstPass<T, S::Error>
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        let answers = {
            let now = Utc::now();
            let rows: Vec<MarkerRow<'_>> = work
                .iter()
                .map(|(i, p)| self.marker_row(p, deliveries[*i].message(), now))
                .collect();
            self.store.insert_markers(tx, &rows).await
        };
        let answers = match answers {
            Ok(a) if a.len() == work.len() => a,
            Ok(a) => {
                return FirstPass::Miscounted(format!(
                    "the store answered {} of {} marker inserts",
                    a.len(),
                    work.len()
                ))
            }
            Err(e) => return FirstPass::StoreFailed("insert markers", e),
        };
        // FIFO groups whose message this pass released (a marker it could not place).
        let mut released: HashMap<String, Duration> = HashMap::new();
        let mut rest = work.into_iter().zip(answers);
        while let Some(((i, prepared), answer)) = rest.next() {
            let msg = deliveries[i].message();
            let behind = msg.group_id.as_ref().and_then(|g| released.get(g)).copied();
            match answer {
                MarkerInsert::Inserted => {}
                MarkerInsert::Conflict(holder) => {
                    slots[i] = Slot::Conflicted(prepared.spent(), holder);
                    continue;
                }
                // Nothing of it was written: decided here, the batch goes on.
                other => {
                    let decision = self.unplaced(&prepared.identity, other);
                    if let (Decision::Release(_, delay), Some(g)) = (&decision, &msg.group_id) {
                        released.entry(g.clone()).or_insert(*delay);
                    }
                    slots[i] = Slot::Decided(decision);
                    continue;
                }
            }
            let (failure, prepared) = if let Some(delay) = behind {
                // Its marker is in, behind a message of its group this pass released: the pass gives up
                // (its writes rolled back) and this delivery is held back with that message.
                (Failure::Refused(self.held_back(delay)), prepared.spent())
            } else {
                let item_span = tracing::info_span!(
                    "txinbox.process",
                    consumer = %self.consumer,
                    message_id = %prepared.identity.message_id,
                    delivery_count = msg.delivery_count,
                );
                match self
                    .handle(tx, prepared, msg, handler, stop)
                    .instrument(item_span)
                    .await
                {
                    Handling::Done(done) => {
                        slots[i] = Slot::Written(done);
                        continue;
                    }
                    Handling::Interrupted => return FirstPass::Interrupted,
                    Handling::Failed(f, p) => (f, p),
                }
            };
            tracing::debug!(
                consumer = %self.consumer,
                "a handler of the batch failed: the batch is rolled back and its other deliveries applied again, each under a savepoint"
            );
            // What this pass wrote is undone: those deliveries start again, with the ones not reached yet.
            let mut again = Vec::with_capacity(slots.len());
            for (j, slot) in slots.iter_mut().enumerate().take(i) {
                match std::mem::replace(slot, Slot::Pending) {
                    Slot::Written(done) => again.push((j, Again::Spent(done.prepared))),
                    Slot::Conflicted(p, _) => again.push((j, Again::Spent(p))),
                    other => *slot = other,
                }
            }
            again.extend(rest.map(|((j, p), _)| (j, Again::Fresh(p))));
            return FirstPass::GaveUp {
                failed: Box::new((i, failure, prepared)),
                again,
            };
        }
        FirstPass::Written
    }

    /// The savepoint pass: `work` in a new transaction, each delivery under its own savepoint, so that one
    /// delivery's failure undoes only its own writes. `held`: FIFO groups already released in this batch.
    #[allow(clippy::too_many_arguments)]
    async fn with_savepoints<D, T, H>(
        &self,
        mut slots: Vec<Slot>,
        work: Vec<(usize, Prepared<T>)>,
        mut held: Held,
        deliveries: &[D],
        handler: &H,
        key: Option<&TypedKeyFn<T>>,
        stop: &CancellationToken,
    ) -> Vec<Decision>
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        let tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(e) => return finish(slots, &|| self.store_retry("begin", &e)),
        };
        // The first savepoint also tells whether the store has savepoints at all.
        match self.store.savepoint(&tx).await {
            Ok(true) => {}
            Ok(false) => {
                // No savepoints: one transaction per delivery, in receive order.
                let _ = self.store.rollback(tx, true).await;
                return self
                    .one_by_one(slots, work, held, deliveries, handler, stop)
                    .await;
            }
            Err(e) => {
                let _ = self.store.rollback(tx, false).await;
                return finish(slots, &|| self.store_retry("savepoint", &e));
            }
        }
        let mut first = true;
        for (i, prepared) in work {
            let msg = deliveries[i].message();
            if let Some(delay) = behind(&held, i, msg) {
                slots[i] = Slot::Decided(self.held_back(delay));
                continue;
            }
            let opened = if first {
                Ok(true)
            } else {
                self.store.savepoint(&tx).await
            };
            match opened {
                Ok(true) => {}
                Ok(false) => {
                    // A store that had savepoints a moment ago: end the batch safely.
                    let _ = self.store.rollback(tx, false).await;
                    return finish(slots, &|| {
                        self.store_retry_msg("savepoint", "the store stopped answering savepoints")
                    });
                }
                Err(e) => {
                    let _ = self.store.rollback(tx, false).await;
                    return finish(slots, &|| self.store_retry("savepoint", &e));
                }
            }
            first = false;
            let item_span = tracing::info_span!(
                "txinbox.process",
                consumer = %self.consumer,
                message_id = %prepared.identity.message_id,
                delivery_count = msg.delivery_count,
            );
            let step = self
                .apply(&tx, prepared, msg, handler, stop)
                .instrument(item_span)
                .await;
            let failed = match step {
                Step::Applied(done) => {
                    slots[i] = Slot::Written(done);
                    continue;
                }
                // Nothing was written: no rollback needed.
                Step::Conflict(p, holder) => {
                    slots[i] = Slot::Conflicted(p, holder);
                    continue;
                }
                Step::Failed(decision) => Err(decision),
                Step::Unhandled(p, f) => Ok((p, f)),
                Step::Interrupted => {
                    let _ = self.store.rollback(tx, false).await;
                    return finish(slots, &|| self.interrupted());
                }
            };
            if let Err(e) = self.store.rollback_to_savepoint(&tx).await {
                // The transaction is lost with this delivery's writes: nothing of it is kept.
                let _ = self.store.rollback(tx, false).await;
                slots[i] = Slot::Decided(match failed {
                    Err(decision) => decision,
                    Ok((_, f)) => self.failed(f),
                });
                return finish(slots, &|| self.store_retry("rollback to savepoint", &e));
            }
            let failed = match failed {
                Err(decision) => decision,
                // A holder found after a permanent failure is a conflict, decided after COMMIT like the
                // others (its evidence in a transaction of its own).
                Ok((p, f)) => match self.holder_after_failure(&f, &p).await {
                    Ok(Some(holder)) => {
                        slots[i] = Slot::Conflicted(p, Some(holder));
                        continue;
                    }
                    Ok(None) => self.failed(f),
                    Err(release) => release,
                },
            };
            hold(&mut held, i, msg, &failed);
            slots[i] = Slot::Decided(failed);
        }
        self.commit_batch(tx, slots, deliveries, handler, key, stop)
            .await
    }

    /// The one COMMIT of a batch, then every delivery's decision.
    async fn commit_batch<D, T, H>(
        &self,
        tx: S::Tx,
        slots: Vec<Slot>,
        deliveries: &[D],
        handler: &H,
        key: Option<&TypedKeyFn<T>>,
        stop: &CancellationToken,
    ) -> Vec<Decision>
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        if stop.is_cancelled() {
            let _ = self.store.rollback(tx, false).await;
            return finish(slots, &|| self.interrupted());
        }
        match self.store.commit(tx).await {
            Ok(Commit::Done) => {}
            // A store that checks its conditions (or the handler's writes) at commit cannot say which
            // delivery failed them: nothing was written, so each delivery of the transaction is applied again
            // on its own.
            // What each delivery already resolved is kept (its identity is not resolved again, which counts
            // and logs), and a FIFO group's later messages are held back behind a released one, as in the
            // savepoint pass.
            Ok(Commit::Conflict(_) | Commit::HandlerFailed(_)) => {
                let mut held: HashMap<String, Duration> = HashMap::new();
                let mut out = Vec::with_capacity(slots.len());
                for (i, s) in slots.into_iter().enumerate() {
                    let msg = deliveries[i].message();
                    let behind = msg.group_id.as_ref().and_then(|g| held.get(g)).copied();
                    let d = match (s, behind) {
                        (Slot::Decided(d), _) => d,
                        (_, Some(delay)) => self.held_back(delay),
                        (
                            Slot::Written(Done { prepared, .. }) | Slot::Conflicted(prepared, _),
                            _,
                        ) => match self.prepared_again::<T>(msg, prepared) {
                            Err(bad) => self.bad_input(bad),
                            Ok(_) if stop.is_cancelled() => self.interrupted(),
                            Ok(p) => self.decide_prepared(p, msg, handler, stop).await,
                        },
                        (Slot::Pending, _) => self.decide(msg, handler, key, stop).await,
                    };
                    if let (Decision::Release(_, delay), Some(g)) = (&d, &msg.group_id) {
                        held.entry(g.clone()).or_insert(*delay);
                    }
                    out.push(d);
                }
                return out;
            }
            // The COMMIT's fate is unknown: release; the redelivery finds the markers or applies them.
            Err(e) => return finish(slots, &|| self.store_retry("commit", &e)),
        }
        // A delivery refused by a marker of this very batch read its holder before the holder's handler
        // recorded its result reference: it gets the reference the holder committed, as it would alone.
        let written: Vec<(&Identity, &Option<String>)> = slots
            .iter()
            .filter_map(|s| match s {
                Slot::Written(done) => Some((&done.prepared.identity, &done.result_reference)),
                _ => None,
            })
            .collect();
        let held_by_batch: Vec<Option<Option<String>>> = slots
            .iter()
            .map(|s| match s {
                Slot::Conflicted(p, Some(h)) => written
                    .iter()
                    .find(|(w, _)| holds(w, &p.identity, h))
                    .map(|(_, r)| (*r).clone()),
                _ => None,
            })
            .collect();
        let mut out = Vec::with_capacity(slots.len());
        for (i, s) in slots.into_iter().enumerate() {
            let msg = deliveries[i].message();
            out.push(match s {
                Slot::Decided(d) => d,
                Slot::Written(done) => self.applied(msg, done.result_reference),
                Slot::Conflicted(p, mut holder) => {
                    if let (Some(h), Some(reference)) = (holder.as_mut(), &held_by_batch[i]) {
                        h.result_reference = reference.clone();
                    }
                    self.conflict(&p, holder, msg.received_at).await
                }
                Slot::Pending => self.interrupted(),
            });
        }
        out
    }

    /// A store without savepoints: each validated delivery in its own transaction, in receive order (a
    /// released one still holds its FIFO group's later ones back).
    async fn one_by_one<D, T, H>(
        &self,
        mut slots: Vec<Slot>,
        work: Vec<(usize, Prepared<T>)>,
        mut held: Held,
        deliveries: &[D],
        handler: &H,
        stop: &CancellationToken,
    ) -> Vec<Decision>
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        for (i, prepared) in work {
            let msg = deliveries[i].message();
            if let Some(delay) = behind(&held, i, msg) {
                slots[i] = Slot::Decided(self.held_back(delay));
                continue;
            }
            let d = if stop.is_cancelled() {
                self.interrupted()
            } else {
                self.decide_prepared(prepared, msg, handler, stop).await
            };
            hold(&mut held, i, msg, &d);
            slots[i] = Slot::Decided(d);
        }
        slots
            .into_iter()
            .map(|s| match s {
                Slot::Decided(d) => d,
                _ => self.interrupted(),
            })
            .collect()
    }

    pub(super) fn store_retry_msg(&self, op: &'static str, why: &str) -> Decision {
        metrics::counter!(m::RETRIES, "consumer" => self.label(), "reason" => "store").increment(1);
        tracing::warn!(op, why, "store error: rolled back, released for redelivery");
        Decision::Release(
            Outcome::Retry {
                reason: format!("{op}: {why}"),
            },
            self.retry_backoff,
        )
    }
}

impl<S: InboxStore> Inbox<S> {
    /// A delivery behind an earlier message of its FIFO group that this batch released: released too, with
    /// the same delay, so that the group is applied in order; counted as the retry it is.
    fn held_back(&self, delay: Duration) -> Decision {
        metrics::counter!(m::RETRIES, "consumer" => self.label(), "reason" => "fifo_group")
            .increment(1);
        Decision::Release(
            Outcome::Retry {
                reason: "an earlier message of its FIFO group in this batch was released".into(),
            },
            delay,
        )
    }
}

/// Whether `written`, a delivery of the batch whose marker went in, is the holder `h` that refused
/// `refused`: the same message (consumer, source, id), or the same business key of the same tenant (no tenant
/// and an empty one being one, as in the stores).
fn holds(written: &Identity, refused: &Identity, h: &ExistingMarker) -> bool {
    if written.message_id != h.message_id {
        return false;
    }
    if h.same_identity {
        written.source == refused.source && written.message_id == refused.message_id
    } else {
        refused.business_slot().is_some() && written.business_slot() == refused.business_slot()
    }
}
