//! The effect runner: claims due effects, runs or reconciles them through their executors, records the truth.
//!
//! The claim and the work on it count from one instant: the moment the runner asks for the claim, before the
//! claim call. The claim lasts until `claim_for` plus the longest
//! [`reconcile_after`](super::EffectExecutor::reconcile_after) of the runner's destinations after it; the work on
//! every effect of the claim (its confirmation, its call and the record of its result) ends `claim_for` after it,
//! so a claim call that is slow to answer eats into the work's time, never into the claim's margin. An effect is
//! not started once that deadline has passed (the claim answered too late: it is counted in `claims_lost` and
//! its claim is left to expire), and work still running at the deadline is given up (also `claims_lost`,
//! nothing recorded: its next holder reconciles it). The runner therefore never works on an effect past its
//! claim, and no two runners ever hold one effect's work at once.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::gauges::publish_shard_gauges;
use super::{BoxError, CompensateError, CompensatedRow, EffectOptions, EffectReport, RowOutcome};
use super::{
    ClaimedEffect, Confirmation, EffectExecutor, EffectState, EffectStore, Execution, Transition,
};

/// How many times a finish is sent before its error is taken (see [`EffectRunner::finish`]).
const FINISH_TRIES: u32 = 3;

/// Done effects deleted per purge statement (see [`EffectRunner::run_until`]).
const PURGE_BATCH: i64 = 500;

/// How long a pass in progress when the runner is asked to stop may go on ([`EffectRunner::run_until`]): 20 s,
/// a worker's default `shutdown_timeout`. Past it the effects still in flight are given up as an effect whose work
/// outlasts `claim_for` is (counted in `claims_lost`, left in flight for their next holder to reconcile), so a
/// runner beside a worker stops within the orchestrator's grace period however long its calls.
pub(crate) const STOP_WAIT: Duration = Duration::from_secs(20);

/// How long the effect gauges are given at the stop ([`EffectRunner::run_until`]): the worker's
/// [`SHUTDOWN_GRACE`](crate::runtime::worker::SHUTDOWN_GRACE) (5 s). Not published then, they keep their last
/// values.
pub(crate) const STOP_GAUGES_WAIT: Duration = crate::runtime::worker::SHUTDOWN_GRACE;

/// How a purge ended.
#[derive(Debug, PartialEq, Eq)]
enum Purged {
    /// Nothing past the retention left, or a store error (tried again at the next housekeeping).
    Done,
    /// The runner was asked to stop: the rest is for its next run.
    Stopped,
}

/// Runs the effects of a store through the executors registered per destination.
#[must_use = "an EffectRunner does nothing until run_until or run_until_idle is awaited"]
pub struct EffectRunner<S: EffectStore> {
    store: S,
    executors: HashMap<String, Arc<dyn EffectExecutor>>,
    destinations: Vec<String>,
    opts: EffectOptions,
    holder: String,
    /// How many claims this runner asked for: each claim's holder name is `holder#N`.
    claims: std::sync::atomic::AtomicU64,
}

impl<S: EffectStore> fmt::Debug for EffectRunner<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EffectRunner")
            .field("destinations", &self.destinations)
            .field("holder", &self.holder)
            .field("options", &self.opts)
            .finish()
    }
}

impl<S: EffectStore> EffectRunner<S> {
    /// A runner on `store` with no executor yet; its holder name is unique to this process and runner.
    pub fn new(store: S) -> Self {
        Self {
            store,
            executors: HashMap::new(),
            destinations: Vec::new(),
            opts: EffectOptions::default(),
            holder: format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()),
            claims: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Registers `executor` for `destination`. The runner claims only effects of destinations it has an
    /// executor for.
    pub fn executor(
        mut self,
        destination: impl Into<String>,
        executor: impl EffectExecutor,
    ) -> Self {
        let d = destination.into();
        if !self.destinations.contains(&d) {
            self.destinations.push(d.clone());
        }
        self.executors.insert(d, Arc::new(executor));
        self
    }

    /// Sets the options.
    pub fn options(mut self, opts: EffectOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Labels this runner's effect gauges with `shard` (keeping its other options).
    pub fn shard(mut self, shard: impl Into<String>) -> Self {
        self.opts.shard = Some(shard.into());
        self
    }

    /// This runner's name. Each claim it makes holds its effects under a name of its own, this one followed by
    /// `#` and the claim's number (`4242-0f3a…#17`, the `claimed_by` of an effect in flight): a finish or a
    /// give-back applies only to the claim that made it, so a late finish of an earlier claim (sent before that
    /// claim ran out, arriving after this runner claimed the effect again) is refused instead of being taken
    /// for the later claim's result.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// An operator's compensation: undoes the done effect with idempotency key `key` through its destination's
    /// executor ([`EffectExecutor::compensate`]) and marks it compensated. Nothing is undone twice: a
    /// compensated effect is no longer done.
    ///
    /// A key with several effects (the partitioned PostgreSQL layout: a re-send in another bucket of event time
    /// records its effects again, see [`EffectStore::find_effects`]) is one effect at the destination, which
    /// deduplicates on the key: every done one is undone, oldest first, with one call per destination,
    /// reference and external reference among them (the re-send's call was answered with the first's result,
    /// so both hold one reference and the destination is asked once), and each is marked compensated. Failed
    /// ones are left as they are; when none is done, the newest's state is the answer. While one is not
    /// finished (pending, in flight, uncertain, needs attention: it may still run, or may have happened, and
    /// would do again what the compensation undoes), nothing is undone: [`CompensateError::Unfinished`].
    ///
    /// Each is marked compensated as soon as the destination has undone it. The compensation stops at the first
    /// refusal of the destination or failure of the store; if the destination had undone any by then, the
    /// error is [`CompensateError::Incomplete`], which says for every done effect of the key whether it was
    /// undone at the destination and marked compensated, undone but not marked (its row may still say done),
    /// refused, or not asked (so the operator knows the destination's state); when none was undone, it is
    /// [`CompensateError::Refused`] (or [`CompensateError::Store`]).
    pub async fn compensate(&self, key: &str) -> Result<EffectState, CompensateError> {
        let store_err = |e: S::Error| CompensateError::Store(Box::new(e));
        let all = self.store.find_effects(key).await.map_err(store_err)?;
        let newest = all
            .last()
            .ok_or_else(|| CompensateError::NotFound(key.to_owned()))?;
        let done: Vec<&ClaimedEffect> = all
            .iter()
            .filter(|e| e.claimed_from == EffectState::Done)
            .collect();
        if done.is_empty() {
            return Err(CompensateError::NotDone {
                key: key.to_owned(),
                state: newest.claimed_from,
            });
        }
        // A row of the key that may still run or may have happened (a re-send's, on the partitioned layout)
        // would do again at the destination what this undoes: nothing is undone until it is finished.
        if let Some(open) = all.iter().find(|e| !e.claimed_from.is_finished()) {
            return Err(CompensateError::Unfinished {
                key: key.to_owned(),
                id: open.id,
                state: open.claimed_from,
            });
        }
        // Every executor first: nothing is undone when one of them is missing.
        let mut execs = Vec::with_capacity(done.len());
        for e in &done {
            let exec = self
                .executors
                .get(&e.destination)
                .ok_or_else(|| CompensateError::NoExecutor(e.destination.clone()))?;
            execs.push(exec);
        }
        // What was done to each done effect, oldest first: told in full if the compensation stops midway.
        let mut rows: Vec<CompensatedRow> = done
            .iter()
            .map(|e| CompensatedRow {
                id: e.id,
                destination: e.destination.clone(),
                reference: e.reference.clone(),
                outcome: RowOutcome::NotTried,
            })
            .collect();
        let stopped = |rows: Vec<CompensatedRow>, source: BoxError| {
            if rows.iter().any(|r| {
                matches!(
                    r.outcome,
                    RowOutcome::UndoneAndMarked | RowOutcome::UndoneNotMarked
                )
            }) {
                CompensateError::Incomplete {
                    key: key.to_owned(),
                    rows,
                    source,
                }
            } else {
                CompensateError::Refused {
                    key: key.to_owned(),
                    source,
                }
            }
        };
        let mut undone: Vec<(&str, Option<&str>, &str)> = Vec::new();
        for (i, (e, exec)) in done.iter().zip(execs).enumerate() {
            let at_destination = (
                e.destination.as_str(),
                e.reference.as_deref(),
                e.external_ref.as_str(),
            );
            if !undone.contains(&at_destination) {
                if let Err(source) = exec.compensate(e).await {
                    rows[i].outcome = RowOutcome::Refused;
                    return Err(stopped(rows, source));
                }
                undone.push(at_destination);
            }
            // Undone at the destination (by this call or by an earlier one for the same reference): from here
            // on an error says so.
            rows[i].outcome = RowOutcome::UndoneNotMarked;
            let note = format!("compensated by holder {}", self.holder);
            match self.mark_compensated(e, &note).await {
                Ok(true) => rows[i].outcome = RowOutcome::UndoneAndMarked,
                Ok(false) => tracing::warn!(
                    key,
                    id = e.id,
                    "effect changed state during its compensation: undone at the destination, not marked here"
                ),
                Err(err) => {
                    tracing::error!(key, id = e.id, destination = %e.destination, reference = ?e.reference, "effect undone at the destination but not marked compensated: the store failed");
                    return Err(stopped(rows, Box::new(err)));
                }
            }
            tracing::warn!(key, id = e.id, destination = %e.destination, reference = ?e.reference, "effect compensated");
        }
        Ok(EffectState::Compensated)
    }

    /// Runs until `shutdown` resolves: claims due effects, runs them, records the results, purges done ones
    /// past their retention, and publishes the effect gauges. The effects of a pass in progress when shutdown
    /// comes are finished first (their calls are not cut off mid-way) for up to 20 s; what is still in
    /// flight then is given up (counted in `claims_lost`): nothing is recorded for it, it stays in flight until
    /// its claim ends, and its next holder asks the destination before any new call, as after a runner killed
    /// mid-call. The purge (every 20 passes, in batches of 500) goes on until nothing past the retention is left,
    /// unless shutdown comes first: it stops then, its batch in flight dropped (what it deleted stays deleted,
    /// nothing else is touched), and what is left is purged by the next run. At the stop the runner only
    /// publishes the gauges, for up to 5 s (they keep their last values if the store does not answer): it
    /// returns at the latest 25 s after the stop, as a worker with the default `shutdown_timeout` does.
    pub async fn run_until(
        &self,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> EffectReport {
        // Fused: once resolved (in the purge or in the loop), it is never polled again.
        let shutdown = futures::FutureExt::fuse(shutdown);
        tokio::pin!(shutdown);
        let mut report = EffectReport::default();
        let mut passes: u64 = 0;
        loop {
            // Cancelled `STOP_WAIT` after a stop that comes during the pass: the work still in flight is given up.
            let cut = CancellationToken::new();
            let pass = self.run_pass_until(&cut);
            tokio::pin!(pass);
            let mut stopped = false;
            let pass = tokio::select! {
                p = &mut pass => p,
                _ = &mut shutdown => {
                    stopped = true;
                    match tokio::time::timeout(STOP_WAIT, &mut pass).await {
                        Ok(p) => p,
                        Err(_) => {
                            cut.cancel();
                            pass.await
                        }
                    }
                }
            };
            let idle = pass.claimed == 0;
            report.add(&pass);
            // The shutdown future has resolved and, fused, is never polled again: stop now.
            if stopped {
                break;
            }
            if passes % 20 == 0 {
                if self.purge(Some(&mut shutdown)).await == Purged::Stopped {
                    break;
                }
                // The gauges while the runner runs (`txinbox_effects`, the oldest pending effect's age):
                // every 20 passes, with the purge, and once more at the stop.
                self.publish_gauges().await;
            }
            passes += 1;
            if idle {
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(self.opts.idle_poll) => {}
                }
            } else if futures::FutureExt::now_or_never(&mut shutdown).is_some() {
                break;
            }
        }
        if tokio::time::timeout(STOP_GAUGES_WAIT, self.publish_gauges())
            .await
            .is_err()
        {
            tracing::warn!(
                wait_s = STOP_GAUGES_WAIT.as_secs(),
                "reading effect counts did not answer at the stop: the effect gauges keep their last values"
            );
        }
        report
    }

    /// Runs passes until nothing is due now (effects waiting for a backoff stay for a later pass), then
    /// purges every done effect past its retention and publishes the gauges. For tests, the lab and the
    /// `txinbox effects run --once` command.
    pub async fn run_until_idle(&self) -> EffectReport {
        let mut report = EffectReport::default();
        loop {
            let pass = self.run_pass().await;
            let idle = pass.claimed == 0;
            report.add(&pass);
            if idle {
                break;
            }
        }
        self.purge(None::<&mut std::future::Pending<()>>).await;
        self.publish_gauges().await;
        report
    }

    /// Purges done effects past their retention, `PURGE_BATCH` at a time, until a batch is not full, a
    /// store error, or `stop` resolves (checked during each batch: the batch in flight is dropped). The
    /// retention is counted back from the store's clock ([`EffectStore::store_clock`]), where the claims and
    /// the due times are counted, else the host's; a store that cannot tell its time is not purged this time.
    async fn purge<F>(&self, mut stop: Option<&mut F>) -> Purged
    where
        F: std::future::Future<Output = ()> + Unpin,
    {
        let clock = self.store.store_clock();
        let clock = match stop.as_deref_mut() {
            Some(stop) => tokio::select! {
                biased;
                _ = stop => return Purged::Stopped,
                r = clock => r,
            },
            None => clock.await,
        };
        let now = match clock {
            Ok(now) => now.unwrap_or_else(Utc::now),
            Err(e) => {
                tracing::warn!(error = %e, "reading the store's clock failed: no done effect purged");
                return Purged::Done;
            }
        };
        let before = crate::time::before(now, self.opts.done_retention);
        loop {
            let batch = self.store.purge_done_effects(before, PURGE_BATCH);
            let purged = match stop.as_deref_mut() {
                Some(stop) => tokio::select! {
                    biased;
                    _ = stop => return Purged::Stopped,
                    r = batch => r,
                },
                None => batch.await,
            };
            match purged {
                Ok(n) if n >= PURGE_BATCH as u64 => continue,
                Ok(_) => return Purged::Done,
                Err(e) => {
                    tracing::warn!(error = %e, "purging done effects failed");
                    return Purged::Done;
                }
            }
        }
    }

    /// Publishes the effect gauges, the oldest pending effect's age counted on the store's clock (on which it
    /// was recorded) where it has one.
    async fn publish_gauges(&self) {
        let now = match self.store.store_clock().await {
            Ok(now) => now.unwrap_or_else(Utc::now),
            Err(e) => {
                tracing::warn!(error = %e, "reading the store's clock failed: the effect ages are counted on this host's clock");
                Utc::now()
            }
        };
        match self.store.effect_counts().await {
            Ok(counts) => publish_shard_gauges(&counts, self.opts.shard.as_deref(), now),
            Err(e) => tracing::warn!(error = %e, "reading effect counts failed"),
        }
    }

    /// One pass: claim a batch and run it, concurrently within the batch.
    pub async fn run_pass(&self) -> EffectReport {
        self.run_pass_until(&CancellationToken::new()).await
    }

    /// One pass whose work in flight is given up when `cut` is cancelled (counted in `claims_lost`): nothing is
    /// recorded for an effect cut mid-call, so it stays in flight until its claim ends and its next holder
    /// reconciles it, as after a runner killed mid-call.
    async fn run_pass_until(&self, cut: &CancellationToken) -> EffectReport {
        let mut report = EffectReport::default();
        // The claim's expiry and the work's deadline count from this one instant, before the claim call (see the
        // module docs): a slow claim call shortens the work, never the margin the claim keeps over it.
        let asked = tokio::time::Instant::now();
        let now = Utc::now();
        // A claim outlasts the holder's work on it (at most `claim_for`, below) by the longest time a
        // destination's answers lag behind its writes: a holder that dies mid-call leaves the effect to the
        // next holder, which asks the destination no sooner than that after the call.
        let lag = self
            .executors
            .values()
            .map(|x| x.reconcile_after())
            .max()
            .unwrap_or_default();
        let until = crate::time::after(now, self.opts.claim_for.saturating_add(lag));
        // This claim's own name: what it holds is finished or given back under it, and under no other claim's.
        let n = self
            .claims
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(1);
        let holder = format!("{}#{n}", self.holder);
        let holder = holder.as_str();
        let claim =
            self.store
                .claim_effects(holder, &self.destinations, now, until, self.opts.batch);
        let claimed = match tokio::select! {
            r = claim => r,
            // A claim cut off may have been recorded: its effects are reconciled once it ends.
            _ = cut.cancelled() => return report,
        } {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "claiming effects failed");
                report.store_errors += 1;
                // The claim may have applied and lost its answer: what it took would stay in flight under
                // this holder, never run, until the claim ends, then be taken for possibly started. Given
                // back now, each effect to the state it was claimed from (nothing, if it did not apply).
                match self.store.release_claim(holder, now).await {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(
                        released = n,
                        "a claim whose answer was lost had applied: its effects are given back, due again"
                    ),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "giving back a claim whose answer was lost failed: what it may hold is reconciled once it expires"
                    ),
                }
                return report;
            }
        };
        report.claimed = claimed.len() as u64;
        // Their creation times as this host's clock reads them (see `ClaimedEffect::created_at`).
        let claimed = tokio::select! {
            c = self.on_runner_clock(claimed) => c,
            // Nothing started: the claims expire and their next holder takes the effects.
            _ = cut.cancelled() => {
                report.claims_lost = report.claimed;
                return report;
            }
        };
        // Each effect's work ends `claim_for` after the claim was asked for, `lag` before the claim does: past
        // it, the work is given up (a call may have gone out), and the effect stays in flight until its claim
        // ends, then is reconciled by its next holder. The same holds for the work still in flight when the
        // runner, asked to stop, stops waiting (`cut`).
        let deadline = asked
            .checked_add(self.opts.claim_for)
            .unwrap_or_else(far_future);
        if !claimed.is_empty() && tokio::time::Instant::now() >= deadline {
            // The claim answered with no time left for any work: nothing is started, the claims expire and
            // their next holder takes the effects (as possibly started, so it asks the destination first).
            tracing::warn!(
                claimed = claimed.len(),
                claim_for = ?self.opts.claim_for,
                "the claim call answered after claim_for: no effect started, the claims are left to expire"
            );
            report.claims_lost += claimed.len() as u64;
            return report;
        }
        let results = futures::future::join_all(claimed.iter().map(|e| async move {
            let run = tokio::select! {
                r = tokio::time::timeout_at(deadline, self.run_one(e, holder)) => r,
                _ = cut.cancelled() => {
                    tracing::warn!(key = %e.key, destination = %e.destination, wait_s = STOP_WAIT.as_secs(), "the runner stopped with an effect's work in flight: given up, its next holder reconciles it");
                    return None;
                }
            };
            if run.is_err() {
                tracing::warn!(key = %e.key, destination = %e.destination, claim_for = ?self.opts.claim_for, "an effect's work outlasted claim_for (counted from the claim's request): given up, its next holder reconciles it");
            }
            Some(run)
        }))
        .await;
        for r in results {
            match r {
                Some(Ok(Ok(Some(state)))) => *report.transitions.entry(state).or_default() += 1,
                Some(Ok(Ok(None)) | Err(_)) | None => report.claims_lost += 1,
                Some(Ok(Err(()))) => report.store_errors += 1,
            }
        }
        report
    }

    /// `claimed` with each creation time moved from the store's clock onto this host's, by as much as they
    /// differ now ([`EffectStore::store_clock`]): an executor counts an effect's age as `Utc::now() -
    /// created_at` (an HTTP destination repeats a call whose answer was lost only while the destination still
    /// keeps its key: Stripe, "You can remove keys from the system automatically after they're at least 24
    /// hours old. We generate a new request if a key is reused after the original is pruned."), which is then
    /// its age by the store's clock, however far this host's runs from it. A store without a clock of its own
    /// leaves them as they are; one that cannot tell its time too, with a warning.
    async fn on_runner_clock(&self, mut claimed: Vec<ClaimedEffect>) -> Vec<ClaimedEffect> {
        if claimed.is_empty() {
            return claimed;
        }
        let store_now = match self.store.store_clock().await {
            Ok(Some(t)) => t,
            Ok(None) => return claimed,
            Err(e) => {
                tracing::warn!(error = %e, "reading the store's clock failed: the claimed effects' ages are counted on this host's clock");
                return claimed;
            }
        };
        let ahead = Utc::now().signed_duration_since(store_now);
        for e in &mut claimed {
            e.created_at = e.created_at.checked_add_signed(ahead).unwrap_or(
                if ahead < chrono::TimeDelta::zero() {
                    DateTime::<Utc>::MIN_UTC
                } else {
                    DateTime::<Utc>::MAX_UTC
                },
            );
        }
        claimed
    }

    /// Runs one effect claimed under `holder` to its next state; `Ok(None)` when the claim was lost meanwhile.
    async fn run_one(&self, e: &ClaimedEffect, holder: &str) -> Result<Option<EffectState>, ()> {
        let Some(exec) = self.executors.get(&e.destination) else {
            // Not claimable: the claim filters on registered destinations.
            return Ok(None);
        };
        let labels = [
            ("consumer", e.consumer.clone()),
            ("destination", e.destination.clone()),
        ];
        let mut reconciliations = e.reconciliations;
        // A holder that died mid-call may have called: until a confirmation rules it out, never "failed".
        let maybe_happened = e.maybe_happened || e.needs_reconciliation();
        if e.needs_reconciliation() {
            reconciliations += 1;
            let answer = exec.confirm(e).await;
            let outcome = match &answer {
                Confirmation::Done { .. } => "done",
                Confirmation::NotFound => "not_found",
                Confirmation::Repeat => "repeat",
                Confirmation::Unknown { .. } => "unknown",
                Confirmation::NotAnswered { .. } => "not_answered",
            };
            metrics::counter!(
                crate::metrics::EFFECT_RECONCILIATIONS,
                labels_with(&labels, "outcome", outcome)
            )
            .increment(1);
            tracing::info!(key = %e.key, destination = %e.destination, from = %e.claimed_from, outcome, "effect reconciled");
            match answer {
                Confirmation::Done { reference } => {
                    // Found at the destination: at least one call reached it, whatever the count recorded
                    // (a holder killed after its call never recorded it).
                    let t = Transition::Done {
                        reference,
                        attempts: e.attempts.max(1),
                        reconciliations,
                    };
                    return self.finish(e, holder, t, None).await;
                }
                // Not proof: a search that lags behind the writes answers "not found" for what the call
                // created a moment ago. The call goes out again, but the flag stays: a refusal of it (a 422
                // "already exists") cannot then mean that nothing happened.
                Confirmation::NotFound => {}
                Confirmation::Repeat => {}
                Confirmation::Unknown { error } => {
                    return self
                        .undecided(e, holder, error, reconciliations, None)
                        .await
                }
                // A destination that asks to be asked later is not asked before it said; its refusal to
                // answer counts as a reconciliation that did not decide.
                Confirmation::NotAnswered { error, retry_after } => {
                    return self
                        .undecided(e, holder, error, reconciliations, retry_after)
                        .await
                }
            }
        }
        let attempts = e.attempts + 1;
        let sent_hash = exec.request_hash(e);
        let result = exec.execute(e).await;
        let result_label = match &result {
            Execution::Done { .. } => "done",
            Execution::NotSent { .. } => "not_sent",
            Execution::Rejected { .. } => "rejected",
            Execution::InProgress { .. } => "in_progress",
            Execution::Uncertain { .. } => "uncertain",
        };
        metrics::counter!(
            crate::metrics::EFFECT_EXECUTIONS,
            labels_with(&labels, "result", result_label)
        )
        .increment(1);
        let t = self.decide(
            e,
            result,
            attempts,
            reconciliations,
            maybe_happened,
            exec.reconcile_after(),
        );
        self.finish(e, holder, t, sent_hash.as_deref()).await
    }

    /// A confirmation that did not decide: uncertain again after a backoff (no sooner than `retry_after`), or
    /// needs attention at the reconciliation limit.
    async fn undecided(
        &self,
        e: &ClaimedEffect,
        holder: &str,
        error: crate::error::BoxError,
        reconciliations: i32,
        retry_after: Option<Duration>,
    ) -> Result<Option<EffectState>, ()> {
        let t = if reconciliations >= self.opts.max_reconciliations {
            Transition::NeedsAttention {
                error: error.to_string(),
                attempts: e.attempts,
                reconciliations,
            }
        } else {
            let now = Utc::now();
            Transition::Uncertain {
                next_at: self
                    .backoff(now, reconciliations)
                    .max(crate::time::after(now, retry_after.unwrap_or_default())),
                error: error.to_string(),
                attempts: e.attempts,
                reconciliations,
            }
        };
        self.finish(e, holder, t, None).await
    }

    /// The transition an execution leads to. `maybe_happened`: an earlier call may have happened and no
    /// confirmation ruled it out, so a refusal or the attempt limit cannot mean "nothing happened".
    fn decide(
        &self,
        e: &ClaimedEffect,
        result: Execution,
        attempts: i32,
        reconciliations: i32,
        maybe_happened: bool,
        reconcile_after: Duration,
    ) -> Transition {
        let now = Utc::now();
        let at_limit = attempts >= self.opts.max_attempts;
        let later = |d: Duration| crate::time::after(now, d);
        match result {
            Execution::Done { reference } => Transition::Done {
                reference,
                attempts,
                reconciliations,
            },
            Execution::NotSent { error, .. } if at_limit && maybe_happened => {
                Transition::NeedsAttention {
                    error: format!(
                        "{attempts} attempts; the last one reached nobody, an earlier one may have done it: {error}"
                    ),
                    attempts,
                    reconciliations,
                }
            }
            Execution::NotSent { error, .. } if at_limit => Transition::Failed {
                error: format!("{attempts} attempts, none reached the destination: {error}"),
                attempts,
            },
            // Nothing reached the destination this time, but an earlier call may have: ask it again before
            // the next call, which may come after the destination has forgotten the key.
            Execution::NotSent { error, retry_after } if maybe_happened => Transition::Uncertain {
                next_at: self.backoff(now, attempts).max(later(retry_after.unwrap_or_default())),
                error: format!("not sent, and an earlier call may have done it: {error}"),
                attempts,
                reconciliations,
            },
            Execution::NotSent { error, retry_after } => Transition::Retry {
                next_at: self.backoff(now, attempts).max(later(retry_after.unwrap_or_default())),
                error: error.to_string(),
                attempts,
                reconciliations,
                maybe_happened,
            },
            Execution::Rejected { error } if maybe_happened => Transition::NeedsAttention {
                error: format!(
                    "refused, but an earlier call under key {} may have done it: {error}",
                    e.key
                ),
                attempts,
                reconciliations,
            },
            Execution::Rejected { error } => Transition::Failed {
                error: error.to_string(),
                attempts,
            },
            // It may have happened: never failed (that could hide a done effect), but after the attempt
            // limit an operator must look.
            Execution::InProgress { error, .. } | Execution::Uncertain { error } if at_limit => {
                Transition::NeedsAttention {
                    error: format!("{attempts} attempts, the last one not final: {error}"),
                    attempts,
                    reconciliations,
                }
            }
            Execution::InProgress { error, retry_after } => Transition::Uncertain {
                // The destination is working on it: come back after a backoff, and ask before calling.
                next_at: self.backoff(now, attempts)
                    .max(later(retry_after.unwrap_or_default()))
                    .max(later(reconcile_after)),
                error: format!("key in progress at the destination: {error}"),
                attempts,
                reconciliations,
            },
            Execution::Uncertain { error } => Transition::Uncertain {
                // A first lost answer is reconciled on the next pass (once the destination can answer for
                // it); a destination that keeps losing them (a 5xx on every call) is backed off like a
                // failing one.
                next_at: if attempts <= 1 {
                    later(reconcile_after)
                } else {
                    self.backoff(now, attempts - 1).max(later(reconcile_after))
                },
                error: error.to_string(),
                attempts,
                reconciliations,
            },
        }
    }

    /// When attempt `n` may run again, counted from `from`.
    fn backoff(&self, from: DateTime<Utc>, n: i32) -> DateTime<Utc> {
        crate::time::after(from, self.opts.backoff_for(n))
    }

    async fn finish(
        &self,
        e: &ClaimedEffect,
        holder: &str,
        t: Transition,
        sent_hash: Option<&str>,
    ) -> Result<Option<EffectState>, ()> {
        let state = t.state();
        let columns = t.columns().sent_hash(sent_hash);
        // A finish that fails is sent again, the same columns at the same `now`, a few times within the work's
        // deadline: one that never reached the database (a pool timeout) would otherwise drop an outcome the
        // runner knows, and leave the effect in flight for its next holder to reconcile (and, at a
        // destination with neither a key nor a confirmation, to need attention). One that applied and lost
        // its answer is recognised by reading the effect (`own_write`).
        let now = Utc::now();
        let mut tries = 1;
        let recorded = loop {
            match self.store.finish_effect(e.id, holder, &columns, now).await {
                Err(err) if tries < FINISH_TRIES => {
                    tracing::warn!(key = %e.key, error = %err, "recording the effect's result failed; sending it again");
                    tries += 1;
                }
                // Not held any more after a failed attempt: that attempt may have applied and lost its answer.
                // The effect as it is now tells: out of flight, in the state and with the attempts this write
                // set, it holds this write (a holder that took it since left it in flight or wrote its own
                // outcome over it), never a lost claim.
                Ok(false) if tries > 1 => break self.own_write(e, &columns).await,
                r => break r,
            }
        };
        match recorded {
            Ok(true) => {
                match &t {
                    Transition::Done { reference, .. }
                        if columns.reference.is_none() && reference.is_some() =>
                    {
                        let whole = reference.as_deref().unwrap_or_default();
                        let (len, start) = (whole.len(), crate::time::cut(whole, 256));
                        tracing::warn!(key = %e.key, destination = %e.destination, reference_start = ?start, len, max = super::MAX_REFERENCE_LEN, "effect done; the destination's reference is longer than any identifier and is not recorded")
                    }
                    Transition::Done { reference, .. } => {
                        tracing::info!(key = %e.key, destination = %e.destination, reference = ?reference, "effect done")
                    }
                    Transition::Retry { error, next_at, .. } => {
                        tracing::warn!(key = %e.key, destination = %e.destination, %error, %next_at, "effect not sent; pending again")
                    }
                    Transition::Uncertain { error, next_at, .. } => {
                        tracing::warn!(key = %e.key, destination = %e.destination, %error, %next_at, "effect uncertain: its answer was lost; reconciling before any retry")
                    }
                    Transition::Failed { error, .. } => {
                        tracing::error!(key = %e.key, destination = %e.destination, %error, "effect failed")
                    }
                    Transition::NeedsAttention { error, .. } => {
                        tracing::error!(key = %e.key, destination = %e.destination, %error, "effect needs attention: reconciliation could not decide")
                    }
                }
                Ok(Some(state))
            }
            Ok(false) => {
                tracing::warn!(key = %e.key, "effect's claim expired meanwhile; its new holder reconciles it");
                Ok(None)
            }
            Err(err) => {
                tracing::warn!(key = %e.key, error = %err, "recording the effect's result failed; its claim will expire and it will be reconciled");
                Err(())
            }
        }
    }
}

impl<S: EffectStore> EffectRunner<S> {
    /// Marks `e` compensated; a mark that fails is sent again (as a finish is, [`FINISH_TRIES`] in all, at the
    /// same `now`). A try that finds the effect no longer done after a failed one reads it: compensated, the
    /// failed one applied and lost its answer, and the mark is this one's (never "undone but not marked").
    async fn mark_compensated(&self, e: &ClaimedEffect, note: &str) -> Result<bool, S::Error> {
        let now = Utc::now();
        let mut tries = 1;
        loop {
            match self.store.mark_compensated(e.id, note, now).await {
                Err(err) if tries < FINISH_TRIES => {
                    tracing::warn!(key = %e.key, id = e.id, error = %err, "marking the effect compensated failed; sending it again");
                    tries += 1;
                }
                Ok(false) if tries > 1 => {
                    let now = self.store.find_effects(&e.key).await?;
                    return Ok(now
                        .iter()
                        .any(|x| x.id == e.id && x.claimed_from == EffectState::Compensated));
                }
                r => return r,
            }
        }
    }

    /// Whether effect `e` is as a finish writing `columns` left it: out of flight, in its state, with its
    /// attempts (when it sets them); `false` when it cannot be read.
    async fn own_write(
        &self,
        e: &ClaimedEffect,
        columns: &super::TransitionColumns<'_>,
    ) -> Result<bool, S::Error> {
        let now = self.store.find_effects(&e.key).await?;
        Ok(now.iter().any(|x| {
            x.id == e.id
                && x.claimed_from == columns.state
                && columns.attempts.is_none_or(|a| a == x.attempts)
        }))
    }
}

/// An instant too far away to matter (about 30 years), for a `claim_for` too large to add to now.
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

fn labels_with(
    base: &[(&'static str, String); 2],
    k: &'static str,
    v: &'static str,
) -> Vec<metrics::Label> {
    vec![
        metrics::Label::new(base[0].0, base[0].1.clone()),
        metrics::Label::new(base[1].0, base[1].1.clone()),
        metrics::Label::new(k, v),
    ]
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::effects::{EffectCount, TransitionColumns};

    /// An effect store with nothing to claim and `backlog` done effects past their retention, each purge
    /// batch taking a second; counts the purge calls.
    #[derive(Clone, Default)]
    struct Backlog {
        backlog: Arc<AtomicU64>,
        purges: Arc<AtomicU64>,
        counts: Arc<AtomicU64>,
    }

    impl EffectStore for Backlog {
        type Error = std::convert::Infallible;
        async fn claim_effects(
            &self,
            _: &str,
            _: &[String],
            _: DateTime<Utc>,
            _: DateTime<Utc>,
            _: i64,
        ) -> Result<Vec<ClaimedEffect>, Self::Error> {
            Ok(Vec::new())
        }
        async fn finish_effect(
            &self,
            _: i64,
            _: &str,
            _: &TransitionColumns<'_>,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            Ok(false)
        }
        async fn purge_done_effects(
            &self,
            _: DateTime<Utc>,
            limit: i64,
        ) -> Result<u64, Self::Error> {
            self.purges.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(1)).await;
            let limit = limit as u64;
            let left = self.backlog.load(Ordering::SeqCst);
            let n = left.min(limit);
            self.backlog.store(left - n, Ordering::SeqCst);
            Ok(n)
        }
        async fn effect_counts(&self) -> Result<Vec<EffectCount>, Self::Error> {
            self.counts.fetch_add(1, Ordering::SeqCst);
            Ok(Vec::new())
        }
        async fn find_effect(&self, _: &str) -> Result<Option<ClaimedEffect>, Self::Error> {
            Ok(None)
        }
        async fn mark_compensated(
            &self,
            _: i64,
            _: &str,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            Ok(false)
        }
    }

    /// A store whose clock is 10 days ahead of this host's, with one pending effect recorded an hour ago by it.
    #[derive(Clone)]
    struct AheadClock(DateTime<Utc>);

    impl EffectStore for AheadClock {
        type Error = std::convert::Infallible;
        async fn store_clock(&self) -> Result<Option<DateTime<Utc>>, Self::Error> {
            Ok(Some(self.0))
        }
        async fn claim_effects(
            &self,
            _: &str,
            _: &[String],
            _: DateTime<Utc>,
            _: DateTime<Utc>,
            _: i64,
        ) -> Result<Vec<ClaimedEffect>, Self::Error> {
            Ok(Vec::new())
        }
        async fn finish_effect(
            &self,
            _: i64,
            _: &str,
            _: &TransitionColumns<'_>,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            Ok(false)
        }
        async fn purge_done_effects(&self, _: DateTime<Utc>, _: i64) -> Result<u64, Self::Error> {
            Ok(0)
        }
        async fn effect_counts(&self) -> Result<Vec<EffectCount>, Self::Error> {
            Ok(vec![EffectCount {
                consumer: "c".into(),
                destination: "crm".into(),
                state: EffectState::Pending,
                count: 1,
                oldest: Some(self.0 - chrono::Duration::hours(1)),
                without_reference: 1,
            }])
        }
        async fn find_effect(&self, _: &str) -> Result<Option<ClaimedEffect>, Self::Error> {
            Ok(None)
        }
        async fn mark_compensated(
            &self,
            _: i64,
            _: &str,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            Ok(false)
        }
    }

    /// The age of the oldest pending effect (`txinbox_effect_oldest_pending_seconds`, the relay lag an alert
    /// watches) is counted on the store's clock, on which the effect was recorded: a runner whose host ran 10
    /// days behind the database published 0 for an effect waiting an hour (and one ahead, days for a fresh one).
    #[tokio::test]
    async fn the_oldest_pending_age_is_counted_on_the_store_s_clock() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let store = AheadClock(Utc::now() + chrono::Duration::days(10));
        let _ = EffectRunner::new(store).run_until_idle().await;
        let age: Vec<f64> = snap
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, _, _, _)| k.key().name() == crate::metrics::EFFECT_OLDEST_PENDING)
            .filter_map(|(_, _, _, v)| match v {
                DebugValue::Gauge(g) => Some(g.into_inner()),
                _ => None,
            })
            .collect();
        assert!(
            age.len() == 1 && (3590.0..3700.0).contains(&age[0]),
            "an hour by the store's clock: {age:?}"
        );
    }

    /// The effect gauges are published while the runner runs (every 20 passes, with the purge), not only at
    /// its stop: a dashboard of a running consumer shows its effects.
    #[tokio::test(start_paused = true)]
    async fn the_gauges_are_published_while_the_runner_runs() {
        let store = Backlog::default();
        let runner = EffectRunner::new(store.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let counts = store.counts.clone();
        let watch = tokio::spawn(async move {
            // Idle passes, one per `idle_poll`: long enough for two rounds of 20.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            let before_stop = counts.load(Ordering::SeqCst);
            let _ = stop.send(());
            before_stop
        });
        let _ = runner
            .run_until(async {
                let _ = stopped.await;
            })
            .await;
        let before_stop = watch.await.unwrap();
        assert!(
            before_stop >= 2,
            "the gauges were read {before_stop} times before the stop"
        );
    }

    /// A backlog of done effects far larger than one purge can delete before the stop: the runner stops
    /// purging when asked to stop and returns, the rest left for its next run.
    #[tokio::test(start_paused = true)]
    async fn the_purge_stops_when_the_runner_is_asked_to_stop() {
        let store = Backlog::default();
        store.backlog.store(u64::MAX, Ordering::SeqCst);
        let runner = EffectRunner::new(store.clone());
        let stop_after = Duration::from_secs(10);
        // Bounded, so that a purge that ignores the stop fails here instead of hanging the test.
        let report = tokio::time::timeout(
            Duration::from_secs(600),
            runner.run_until(tokio::time::sleep(stop_after)),
        )
        .await
        .expect("the runner stopped: its purge does not go on past the stop");
        assert_eq!(report.claimed, 0, "{report}");
        let purges = store.purges.load(Ordering::SeqCst);
        assert!(
            (1..=11).contains(&purges),
            "purged up to the stop (a batch a second for 10 s), not beyond: {purges} batches"
        );
        assert!(store.backlog.load(Ordering::SeqCst) > 0, "the rest is left");
    }

    /// Without a stop the purge goes on until nothing past the retention is left, however many batches
    /// that takes.
    #[tokio::test(start_paused = true)]
    async fn the_purge_goes_on_until_the_backlog_is_gone_while_the_runner_runs() {
        let store = Backlog::default();
        let backlog = 50 * PURGE_BATCH as u64 + 7;
        store.backlog.store(backlog, Ordering::SeqCst);
        let runner = EffectRunner::new(store.clone());
        let report = runner
            .run_until(tokio::time::sleep(Duration::from_secs(3600)))
            .await;
        assert_eq!(report.claimed, 0, "{report}");
        assert_eq!(store.backlog.load(Ordering::SeqCst), 0);
        assert!(store.purges.load(Ordering::SeqCst) >= 51);
        // `run_until_idle` (`txinbox effects run --once`) purges it all too.
        store.backlog.store(backlog, Ordering::SeqCst);
        let _ = runner.run_until_idle().await;
        assert_eq!(store.backlog.load(Ordering::SeqCst), 0);
    }

    /// An effect store with one due effect (claimed once) whose effect counts may never answer; records what
    /// the runner finished.
    #[derive(Clone, Default)]
    struct OneEffect {
        claimed: Arc<std::sync::atomic::AtomicBool>,
        finished: Arc<AtomicU64>,
        counts_hang: bool,
    }

    impl EffectStore for OneEffect {
        type Error = std::convert::Infallible;
        async fn claim_effects(
            &self,
            _: &str,
            _: &[String],
            _: DateTime<Utc>,
            _: DateTime<Utc>,
            _: i64,
        ) -> Result<Vec<ClaimedEffect>, Self::Error> {
            if self.claimed.swap(true, Ordering::SeqCst) {
                return Ok(Vec::new());
            }
            Ok(vec![ClaimedEffect {
                id: 1,
                consumer: "c".into(),
                message_id: "m1".into(),
                key: "k1".into(),
                name: "n".into(),
                destination: "slow".into(),
                payload: Vec::new(),
                metadata: Default::default(),
                external_ref: "r1".into(),
                claimed_from: EffectState::Pending,
                attempts: 0,
                reconciliations: 0,
                created_at: Utc::now(),
                reference: None,
                maybe_happened: false,
                sent_hash: None,
            }])
        }
        async fn finish_effect(
            &self,
            _: i64,
            _: &str,
            _: &TransitionColumns<'_>,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            self.finished.fetch_add(1, Ordering::SeqCst);
            Ok(true)
        }
        async fn purge_done_effects(&self, _: DateTime<Utc>, _: i64) -> Result<u64, Self::Error> {
            Ok(0)
        }
        async fn effect_counts(&self) -> Result<Vec<EffectCount>, Self::Error> {
            if self.counts_hang {
                std::future::pending::<()>().await;
            }
            Ok(Vec::new())
        }
        async fn find_effect(&self, _: &str) -> Result<Option<ClaimedEffect>, Self::Error> {
            Ok(None)
        }
        async fn mark_compensated(
            &self,
            _: i64,
            _: &str,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            Ok(false)
        }
    }

    /// A destination whose call takes `takes` (an HTTP request to a slow destination).
    struct Slow {
        takes: Duration,
        calls: Arc<AtomicU64>,
    }

    impl EffectExecutor for Slow {
        fn execute<'a>(
            &'a self,
            _: &'a ClaimedEffect,
        ) -> futures::future::BoxFuture<'a, Execution> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(self.takes).await;
                Execution::Done { reference: None }
            })
        }
        fn confirm<'a>(
            &'a self,
            _: &'a ClaimedEffect,
        ) -> futures::future::BoxFuture<'a, Confirmation> {
            Box::pin(async { Confirmation::NotFound })
        }
    }

    /// Runs `store` with a destination whose call takes `takes`, stopping once the call has begun; returns the
    /// report and how long after the stop the runner returned.
    async fn stop_mid_call(store: OneEffect, takes: Duration) -> (EffectReport, Duration) {
        let calls = Arc::new(AtomicU64::new(0));
        let runner = EffectRunner::new(store).executor(
            "slow",
            Slow {
                takes,
                calls: calls.clone(),
            },
        );
        let stop = CancellationToken::new();
        let stopped_at = Arc::new(std::sync::Mutex::new(None));
        let (s, at) = (stop.clone(), stopped_at.clone());
        let c = calls.clone();
        let stopper = async move {
            while c.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            *at.lock().unwrap() = Some(tokio::time::Instant::now());
            s.cancel();
        };
        // Bounded, so that a runner that waits without limit fails here instead of hanging the test.
        let (report, ()) = tokio::time::timeout(
            Duration::from_secs(3600),
            futures::future::join(runner.run_until(stop.cancelled_owned()), stopper),
        )
        .await
        .expect("the runner returned");
        let took = stopped_at.lock().unwrap().expect("stopped").elapsed();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        (report, took)
    }

    /// A call in flight at the stop is let finish when it ends within the stop's wait: its result is recorded.
    #[tokio::test(start_paused = true)]
    async fn a_call_in_flight_at_the_stop_is_finished_and_recorded() {
        let store = OneEffect::default();
        let (report, took) = stop_mid_call(store.clone(), Duration::from_secs(3)).await;
        assert_eq!(report.count(EffectState::Done), 1, "{report}");
        assert_eq!(store.finished.load(Ordering::SeqCst), 1);
        assert!(took < STOP_WAIT, "returned {took:?} after the stop");
    }

    /// A call that outlasts the stop's wait (up to `claim_for`, 60 s) is given up at it: nothing recorded (the
    /// effect stays in flight for its next holder to reconcile), counted in `claims_lost`; and gauges whose
    /// store never answers do not hold the runner either.
    #[tokio::test(start_paused = true)]
    async fn a_call_outlasting_the_stop_wait_is_given_up_and_nothing_is_recorded() {
        let store = OneEffect {
            counts_hang: true,
            ..OneEffect::default()
        };
        let (report, took) = stop_mid_call(store.clone(), Duration::from_secs(55)).await;
        assert_eq!(report.claims_lost, 1, "{report}");
        assert!(report.transitions.is_empty(), "{report}");
        assert_eq!(
            store.finished.load(Ordering::SeqCst),
            0,
            "nothing is recorded for a call cut off"
        );
        assert!(
            took <= STOP_WAIT + STOP_GAUGES_WAIT,
            "returned {took:?} after the stop, past its wait and the gauges' ({:?})",
            STOP_WAIT + STOP_GAUGES_WAIT
        );
    }

    /// A store whose claim call takes `takes` to answer (a slow database) and hands out one effect; records when
    /// the claim it granted expires and when a result was recorded, on the paused clock.
    #[derive(Clone)]
    struct SlowClaim {
        takes: Duration,
        claimed: Arc<std::sync::atomic::AtomicBool>,
        expires_at: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
        finished_at: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
    }

    impl EffectStore for SlowClaim {
        type Error = std::convert::Infallible;
        async fn claim_effects(
            &self,
            _: &str,
            _: &[String],
            now: DateTime<Utc>,
            until: DateTime<Utc>,
            _: i64,
        ) -> Result<Vec<ClaimedEffect>, Self::Error> {
            // The claim is granted from `now` (the runner's) for `until - now`: on the test's clock, it ends
            // that long after the call began, however long the call takes to answer.
            let length = (until - now)
                .to_std()
                .expect("a claim ends after it begins");
            *self.expires_at.lock().unwrap() = Some(tokio::time::Instant::now() + length);
            tokio::time::sleep(self.takes).await;
            if self.claimed.swap(true, Ordering::SeqCst) {
                return Ok(Vec::new());
            }
            let store = OneEffect::default();
            store
                .claim_effects("", &[], now, until, 1)
                .await
                .map(|mut v| {
                    v[0].destination = "slow".into();
                    v
                })
        }
        async fn finish_effect(
            &self,
            _: i64,
            _: &str,
            _: &TransitionColumns<'_>,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            *self.finished_at.lock().unwrap() = Some(tokio::time::Instant::now());
            Ok(true)
        }
        async fn purge_done_effects(&self, _: DateTime<Utc>, _: i64) -> Result<u64, Self::Error> {
            Ok(0)
        }
        async fn effect_counts(&self) -> Result<Vec<EffectCount>, Self::Error> {
            Ok(Vec::new())
        }
        async fn find_effect(&self, _: &str) -> Result<Option<ClaimedEffect>, Self::Error> {
            Ok(None)
        }
        async fn mark_compensated(
            &self,
            _: i64,
            _: &str,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            Ok(false)
        }
    }

    /// Records when the work on an effect ended: the call answered, or was given up (dropped).
    struct Ends(Arc<std::sync::Mutex<Option<tokio::time::Instant>>>);

    impl Drop for Ends {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(tokio::time::Instant::now());
        }
    }

    /// A destination whose call takes `takes`, recording when the call ended or was given up.
    struct SlowCall {
        takes: Duration,
        ended_at: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
    }

    impl EffectExecutor for SlowCall {
        fn execute<'a>(
            &'a self,
            _: &'a ClaimedEffect,
        ) -> futures::future::BoxFuture<'a, Execution> {
            let ends = Ends(self.ended_at.clone());
            Box::pin(async move {
                let _ends = ends;
                tokio::time::sleep(self.takes).await;
                Execution::Done { reference: None }
            })
        }
        fn confirm<'a>(
            &'a self,
            _: &'a ClaimedEffect,
        ) -> futures::future::BoxFuture<'a, Confirmation> {
            Box::pin(async { Confirmation::NotFound })
        }
    }

    /// A claim call that takes half of `claim_for` to answer: the work on the effect it claimed counts from the
    /// claim's request, as the claim does, so it is given up by the claim's end (nothing recorded, counted in
    /// `claims_lost`) instead of running, and recording, past it, when another runner may hold the effect.
    #[tokio::test(start_paused = true)]
    async fn the_work_on_an_effect_ends_before_its_claim_however_slow_the_claim_call() {
        let claim_for = Duration::from_secs(60);
        let store = SlowClaim {
            takes: Duration::from_secs(30),
            claimed: Arc::default(),
            expires_at: Arc::default(),
            finished_at: Arc::default(),
        };
        let ended_at = Arc::new(std::sync::Mutex::new(None));
        let runner = EffectRunner::new(store.clone())
            .executor(
                "slow",
                SlowCall {
                    takes: Duration::from_secs(45),
                    ended_at: ended_at.clone(),
                },
            )
            .options(EffectOptions::default().claim_for(claim_for));
        let report = runner.run_pass().await;
        assert_eq!(report.claimed, 1, "{report}");
        let expires_at = store.expires_at.lock().unwrap().expect("claimed");
        let ended_at = ended_at.lock().unwrap().expect("the call began");
        assert!(
            ended_at <= expires_at,
            "the call ran {:?} past its claim",
            ended_at - expires_at
        );
        if let Some(at) = *store.finished_at.lock().unwrap() {
            assert!(
                at <= expires_at,
                "a result recorded {:?} past the claim",
                at - expires_at
            );
        }
        assert_eq!(report.claims_lost, 1, "{report}");
    }

    /// A claim call that answers after `claim_for` has gone by: no effect of it is started.
    #[tokio::test(start_paused = true)]
    async fn no_effect_starts_when_the_claim_call_answers_after_claim_for() {
        let store = SlowClaim {
            takes: Duration::from_secs(61),
            claimed: Arc::default(),
            expires_at: Arc::default(),
            finished_at: Arc::default(),
        };
        let ended_at = Arc::new(std::sync::Mutex::new(None));
        let runner = EffectRunner::new(store.clone())
            .executor(
                "slow",
                SlowCall {
                    takes: Duration::from_secs(1),
                    ended_at: ended_at.clone(),
                },
            )
            .options(EffectOptions::default().claim_for(Duration::from_secs(60)));
        let report = runner.run_pass().await;
        assert_eq!(report.claimed, 1, "{report}");
        assert_eq!(report.claims_lost, 1, "{report}");
        assert!(ended_at.lock().unwrap().is_none(), "no call began");
        assert!(store.finished_at.lock().unwrap().is_none());
    }

    /// Two done effects of one key (the partitioned PostgreSQL layout), each with its own reference; records
    /// the ids marked compensated, and fails the marking of `fail_mark` with a store error.
    #[derive(Clone, Default)]
    struct TwoDone {
        marked: Arc<std::sync::Mutex<Vec<i64>>>,
        fail_mark: Option<i64>,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the store is down")]
    struct Down;

    impl EffectStore for TwoDone {
        type Error = Down;
        async fn claim_effects(
            &self,
            _: &str,
            _: &[String],
            _: DateTime<Utc>,
            _: DateTime<Utc>,
            _: i64,
        ) -> Result<Vec<ClaimedEffect>, Self::Error> {
            Ok(Vec::new())
        }
        async fn finish_effect(
            &self,
            _: i64,
            _: &str,
            _: &TransitionColumns<'_>,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            Ok(false)
        }
        async fn purge_done_effects(&self, _: DateTime<Utc>, _: i64) -> Result<u64, Self::Error> {
            Ok(0)
        }
        async fn effect_counts(&self) -> Result<Vec<EffectCount>, Self::Error> {
            Ok(Vec::new())
        }
        async fn find_effect(&self, key: &str) -> Result<Option<ClaimedEffect>, Self::Error> {
            Ok(self.find_effects(key).await?.pop())
        }
        async fn find_effects(&self, key: &str) -> Result<Vec<ClaimedEffect>, Self::Error> {
            let marked = self.marked.lock().unwrap().clone();
            Ok([1, 2]
                .into_iter()
                .map(|id| ClaimedEffect {
                    id,
                    consumer: "c".into(),
                    message_id: format!("m{id}"),
                    key: key.into(),
                    name: "n".into(),
                    destination: "crm".into(),
                    payload: Vec::new(),
                    metadata: Default::default(),
                    external_ref: key.into(),
                    claimed_from: if marked.contains(&id) {
                        EffectState::Compensated
                    } else {
                        EffectState::Done
                    },
                    attempts: 1,
                    reconciliations: 0,
                    created_at: Utc::now(),
                    reference: Some(format!("r-{id}")),
                    maybe_happened: false,
                    sent_hash: None,
                })
                .collect())
        }
        async fn mark_compensated(
            &self,
            id: i64,
            _: &str,
            _: DateTime<Utc>,
        ) -> Result<bool, Self::Error> {
            if self.fail_mark == Some(id) {
                return Err(Down);
            }
            self.marked.lock().unwrap().push(id);
            Ok(true)
        }
    }

    /// A destination that undoes its first compensation and refuses every later one.
    #[derive(Default)]
    struct UndoesOnce {
        undone: Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl EffectExecutor for UndoesOnce {
        fn execute<'a>(
            &'a self,
            _: &'a ClaimedEffect,
        ) -> futures::future::BoxFuture<'a, Execution> {
            Box::pin(async { Execution::Done { reference: None } })
        }
        fn confirm<'a>(
            &'a self,
            _: &'a ClaimedEffect,
        ) -> futures::future::BoxFuture<'a, Confirmation> {
            Box::pin(async { Confirmation::NotFound })
        }
        fn compensate<'a>(
            &'a self,
            effect: &'a ClaimedEffect,
        ) -> futures::future::BoxFuture<'a, Result<(), crate::error::BoxError>> {
            Box::pin(async move {
                let mut undone = self.undone.lock().unwrap();
                if !undone.is_empty() {
                    return Err("503 Service Unavailable".into());
                }
                undone.push(effect.reference.clone().unwrap_or_default());
                Ok(())
            })
        }
    }

    fn row(id: i64, outcome: super::super::RowOutcome) -> super::super::CompensatedRow {
        super::super::CompensatedRow {
            id,
            destination: "crm".into(),
            reference: Some(format!("r-{id}")),
            outcome,
        }
    }

    /// A key with two done effects whose second compensation the destination refuses: the error says the first
    /// was undone and marked compensated (it is), the second refused and still done, so the operator knows the
    /// destination's state.
    #[tokio::test]
    async fn a_compensation_refused_midway_says_what_it_undid_and_marked() {
        use super::super::RowOutcome;
        let store = TwoDone::default();
        let dest = UndoesOnce::default();
        let undone = dest.undone.clone();
        let runner = EffectRunner::new(store.clone()).executor("crm", dest);
        let err = runner
            .compensate("k")
            .await
            .expect_err("the second was refused");
        assert_eq!(*undone.lock().unwrap(), vec!["r-1".to_owned()]);
        assert_eq!(
            *store.marked.lock().unwrap(),
            vec![1],
            "the undone one is marked"
        );
        let text = err.to_string();
        let CompensateError::Incomplete { key, rows, source } = err else {
            panic!("not an Incomplete: {text}");
        };
        assert_eq!(key, "k");
        assert_eq!(
            rows,
            vec![
                row(1, RowOutcome::UndoneAndMarked),
                row(2, RowOutcome::Refused)
            ]
        );
        assert!(source.to_string().contains("503"), "{source}");
        assert!(
            text.contains("id 1 (destination \"crm\", reference \"r-1\") undone at the destination and marked compensated")
                && text.contains("id 2 (destination \"crm\", reference \"r-2\") refused by the destination"),
            "{text}"
        );
    }

    /// The first done effect undone but its marking failed (store error): the error says it was undone but not
    /// marked, and the second was not asked.
    #[tokio::test]
    async fn an_undone_effect_the_store_could_not_mark_is_said_undone_not_marked() {
        use super::super::RowOutcome;
        let store = TwoDone {
            fail_mark: Some(1),
            ..TwoDone::default()
        };
        let dest = UndoesOnce::default();
        let undone = dest.undone.clone();
        let runner = EffectRunner::new(store.clone()).executor("crm", dest);
        let err = runner.compensate("k").await.expect_err("the store failed");
        assert_eq!(*undone.lock().unwrap(), vec!["r-1".to_owned()]);
        assert!(store.marked.lock().unwrap().is_empty());
        let text = err.to_string();
        let CompensateError::Incomplete { rows, source, .. } = err else {
            panic!("not an Incomplete: {text}");
        };
        assert_eq!(
            rows,
            vec![
                row(1, RowOutcome::UndoneNotMarked),
                row(2, RowOutcome::NotTried)
            ]
        );
        assert_eq!(source.to_string(), "the store is down");
        assert!(text.contains("NOT marked compensated"), "{text}");
    }
}
