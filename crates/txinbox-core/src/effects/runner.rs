//! The effect runner: claims due effects, runs or reconciles them through their executors, records the truth.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::gauges::publish_shard_gauges;
use super::{
    ClaimedEffect, Confirmation, EffectExecutor, EffectState, EffectStore, Execution, Transition,
};
use super::{CompensateError, EffectOptions, EffectReport};

/// Runs the effects of a store through the executors registered per destination.
#[must_use = "an EffectRunner does nothing until run_until or run_until_idle is awaited"]
pub struct EffectRunner<S: EffectStore> {
    store: S,
    executors: HashMap<String, Arc<dyn EffectExecutor>>,
    destinations: Vec<String>,
    opts: EffectOptions,
    holder: String,
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

    /// The holder name this runner claims under.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// An operator's compensation: undoes the done effect with idempotency key `key` through its destination's
    /// executor ([`EffectExecutor::compensate`]) and marks it compensated. Nothing is undone twice: a
    /// compensated effect is no longer done.
    pub async fn compensate(&self, key: &str) -> Result<EffectState, CompensateError> {
        let store_err = |e: S::Error| CompensateError::Store(Box::new(e));
        let e = self
            .store
            .find_effect(key)
            .await
            .map_err(store_err)?
            .ok_or_else(|| CompensateError::NotFound(key.to_owned()))?;
        if e.claimed_from != EffectState::Done {
            return Err(CompensateError::NotDone {
                key: key.to_owned(),
                state: e.claimed_from,
            });
        }
        let exec = self
            .executors
            .get(&e.destination)
            .ok_or_else(|| CompensateError::NoExecutor(e.destination.clone()))?;
        exec.compensate(&e)
            .await
            .map_err(|source| CompensateError::Refused {
                key: key.to_owned(),
                source,
            })?;
        let note = format!("compensated by holder {}", self.holder);
        if !self
            .store
            .mark_compensated(e.id, &note, Utc::now())
            .await
            .map_err(store_err)?
        {
            tracing::warn!(key, "effect changed state during its compensation");
        }
        tracing::warn!(key, destination = %e.destination, reference = ?e.reference, "effect compensated");
        Ok(EffectState::Compensated)
    }

    /// Runs until `shutdown` resolves: claims due effects, runs them, records the results, purges done ones
    /// past their retention, and publishes the effect gauges. An effect claimed when shutdown comes is
    /// finished first (its call is not cut off mid-way).
    pub async fn run_until(
        &self,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> EffectReport {
        tokio::pin!(shutdown);
        let mut report = EffectReport::default();
        let mut passes: u64 = 0;
        loop {
            let pass = self.run_pass().await;
            let idle = pass.claimed == 0;
            report.add(&pass);
            if passes % 20 == 0 {
                self.housekeeping().await;
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
        self.housekeeping().await;
        report
    }

    /// Runs passes until nothing is due now (effects waiting for a backoff stay for a later pass), then
    /// publishes the gauges. For tests, the lab and the `txinbox effects run --once` command.
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
        self.housekeeping().await;
        report
    }

    /// Purges done effects past their retention (bounded batches) and publishes the gauges.
    async fn housekeeping(&self) {
        let before = crate::time::before(Utc::now(), self.opts.done_retention);
        loop {
            match self.store.purge_done_effects(before, 500).await {
                Ok(n) if n >= 500 => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "purging done effects failed");
                    break;
                }
            }
        }
        match self.store.effect_counts().await {
            Ok(counts) => publish_shard_gauges(&counts, self.opts.shard.as_deref()),
            Err(e) => tracing::warn!(error = %e, "reading effect counts failed"),
        }
    }

    /// One pass: claim a batch and run it, concurrently within the batch.
    pub async fn run_pass(&self) -> EffectReport {
        let mut report = EffectReport::default();
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
        let claimed = match self
            .store
            .claim_effects(
                &self.holder,
                &self.destinations,
                now,
                until,
                self.opts.batch,
            )
            .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "claiming effects failed");
                report.store_errors += 1;
                return report;
            }
        };
        report.claimed = claimed.len() as u64;
        // Each effect's work is bounded by `claim_for`: past it, the work is given up (a call may have gone
        // out), and the effect stays in flight until its claim ends, then is reconciled by its next holder.
        let results = futures::future::join_all(claimed.iter().map(|e| async move {
            let run = tokio::time::timeout(self.opts.claim_for, self.run_one(e)).await;
            if run.is_err() {
                tracing::warn!(key = %e.key, destination = %e.destination, claim_for = ?self.opts.claim_for, "an effect's work outlasted claim_for: given up, its next holder reconciles it");
            }
            run
        }))
        .await;
        for r in results {
            match r {
                Ok(Ok(Some(state))) => *report.transitions.entry(state).or_default() += 1,
                Ok(Ok(None)) | Err(_) => report.claims_lost += 1,
                Ok(Err(())) => report.store_errors += 1,
            }
        }
        report
    }

    /// Runs one claimed effect to its next state; `Ok(None)` when the claim was lost meanwhile.
    async fn run_one(&self, e: &ClaimedEffect) -> Result<Option<EffectState>, ()> {
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
        let mut maybe_happened = e.maybe_happened || e.needs_reconciliation();
        if e.needs_reconciliation() {
            reconciliations += 1;
            let answer = exec.confirm(e).await;
            let outcome = match &answer {
                Confirmation::Done { .. } => "done",
                Confirmation::NotFound => "not_found",
                Confirmation::Repeat => "repeat",
                Confirmation::Unknown { .. } => "unknown",
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
                    return self.finish(e, t, None).await;
                }
                Confirmation::NotFound => maybe_happened = false,
                Confirmation::Repeat => {}
                Confirmation::Unknown { error } => {
                    let t = if reconciliations >= self.opts.max_reconciliations {
                        Transition::NeedsAttention {
                            error: error.to_string(),
                            attempts: e.attempts,
                            reconciliations,
                        }
                    } else {
                        Transition::Uncertain {
                            next_at: self.backoff(Utc::now(), reconciliations),
                            error: error.to_string(),
                            attempts: e.attempts,
                            reconciliations,
                        }
                    };
                    return self.finish(e, t, None).await;
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
        self.finish(e, t, sent_hash.as_deref()).await
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
        t: Transition,
        sent_hash: Option<&str>,
    ) -> Result<Option<EffectState>, ()> {
        let state = t.state();
        let columns = t.columns().sent_hash(sent_hash);
        match self
            .store
            .finish_effect(e.id, &self.holder, &columns, Utc::now())
            .await
        {
            Ok(true) => {
                match &t {
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
