//! Batch apply: the deliveries of one receive in one database transaction, each under its own savepoint.
//!
//! ```text
//! validate, identity, fingerprint of every delivery (bad input: dead-letter, never in the transaction)
//! BEGIN
//!   for each delivery, in receive order:
//!     SAVEPOINT
//!     INSERT marker ... conflict ........ remembered; decided after COMMIT as alone (duplicate, collision,
//!                                          business duplicate, with its evidence row)
//!     handler(tx, message)  Ok  -> result and effect rows, kept
//!                           Err / panic / store error -> ROLLBACK TO SAVEPOINT, decided as alone
//! COMMIT  (one WAL flush for the batch)
//!   done ....... every kept delivery is applied; settle all (ack / release / dead-letter) at once
//!   failed ..... nothing of the transaction is settled as applied: its deliveries are released
//! ```
//!
//! A delivery of a FIFO group whose earlier message in the batch is released is released with it (same
//! delay), so the group's order holds.

use std::collections::HashMap;

use futures::future::join_all;

use super::*;

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
    /// Applies `deliveries` (those of one receive, in receive order) in one transaction, each isolated under
    /// a savepoint, then settles them all; returns their outcomes in the same order. Each delivery gets the
    /// outcome it would get from [`Inbox::process_until`] alone. A store without savepoints gets one
    /// transaction per delivery.
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
        let finish = |slots: Vec<Slot>, f: &dyn Fn() -> Decision| -> Vec<Decision> {
            slots
                .into_iter()
                .map(|s| match s {
                    Slot::Decided(d) => d,
                    _ => f(),
                })
                .collect()
        };
        if work.is_empty() {
            return finish(slots, &|| self.interrupted());
        }
        if stop.is_cancelled() {
            return finish(slots, &|| self.interrupted());
        }
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
                    .one_by_one(slots, work, deliveries, handler, stop)
                    .await;
            }
            Err(e) => {
                let _ = self.store.rollback(tx, false).await;
                return finish(slots, &|| self.store_retry("savepoint", &e));
            }
        }
        // Receive-order groups held back behind an earlier message released in this batch: (delay).
        let mut held: HashMap<String, Duration> = HashMap::new();
        let mut first = true;
        for (i, prepared) in work {
            let msg = deliveries[i].message();
            if let Some(delay) = msg.group_id.as_ref().and_then(|g| held.get(g)) {
                slots[i] = Slot::Decided(held_back(*delay));
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
                Step::Failed(decision) => decision,
                Step::Interrupted => {
                    let _ = self.store.rollback(tx, false).await;
                    return finish(slots, &|| self.interrupted());
                }
            };
            if let Err(e) = self.store.rollback_to_savepoint(&tx).await {
                // The transaction is lost with this delivery's writes: nothing of it is kept.
                let _ = self.store.rollback(tx, false).await;
                slots[i] = Slot::Decided(failed);
                return finish(slots, &|| self.store_retry("rollback to savepoint", &e));
            }
            if let (Decision::Release(_, delay), Some(g)) = (&failed, &msg.group_id) {
                held.insert(g.clone(), *delay);
            }
            slots[i] = Slot::Decided(failed);
        }
        if stop.is_cancelled() {
            let _ = self.store.rollback(tx, false).await;
            return finish(slots, &|| self.interrupted());
        }
        match self.store.commit(tx).await {
            Ok(Commit::Done) => {}
            // A store that checks its conditions at commit cannot say which delivery failed them: nothing
            // was written, so each delivery of the transaction is applied again on its own.
            Ok(Commit::Conflict(_)) => {
                let mut out = Vec::with_capacity(slots.len());
                for (i, s) in slots.into_iter().enumerate() {
                    out.push(match s {
                        Slot::Decided(d) => d,
                        _ => {
                            self.decide(deliveries[i].message(), handler, key, stop)
                                .await
                        }
                    });
                }
                return out;
            }
            // The COMMIT's fate is unknown: release; the redelivery finds the markers or applies them.
            Err(e) => return finish(slots, &|| self.store_retry("commit", &e)),
        }
        let mut out = Vec::with_capacity(slots.len());
        for (i, s) in slots.into_iter().enumerate() {
            let msg = deliveries[i].message();
            out.push(match s {
                Slot::Decided(d) => d,
                Slot::Written(done) => self.applied(msg, done.result_reference),
                Slot::Conflicted(p, holder) => self.conflict(&p, holder, msg.received_at).await,
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
        deliveries: &[D],
        handler: &H,
        stop: &CancellationToken,
    ) -> Vec<Decision>
    where
        D: Delivery,
        T: Payload,
        H: Handler<S, T>,
    {
        let mut held: HashMap<String, Duration> = HashMap::new();
        for (i, prepared) in work {
            let msg = deliveries[i].message();
            if let Some(delay) = msg.group_id.as_ref().and_then(|g| held.get(g)) {
                slots[i] = Slot::Decided(held_back(*delay));
                continue;
            }
            let d = if stop.is_cancelled() {
                self.interrupted()
            } else {
                self.decide_prepared(prepared, msg, handler, stop).await
            };
            if let (Decision::Release(_, delay), Some(g)) = (&d, &msg.group_id) {
                held.insert(g.clone(), *delay);
            }
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

    fn store_retry_msg(&self, op: &'static str, why: &str) -> Decision {
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

/// A delivery behind an earlier message of its FIFO group that this batch released: released too, with the
/// same delay, so that the group is applied in order.
fn held_back(delay: Duration) -> Decision {
    Decision::Release(
        Outcome::Retry {
            reason: "an earlier message of its FIFO group in this batch was released".into(),
        },
        delay,
    )
}
