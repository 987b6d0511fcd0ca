//! The runner's options, its report, and why a compensation did not happen.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::EffectState;
use crate::error::BoxError;

/// Why an operator's compensation did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompensateError {
    /// No effect has this key.
    #[error("no effect has the key {0}")]
    NotFound(String),
    /// Only a done effect can be undone.
    #[error("effect {key} is {state}, not done: nothing to undo")]
    NotDone {
        /// The key.
        key: String,
        /// Its state.
        state: EffectState,
    },
    /// Another effect of the key is not finished (pending, in flight, uncertain, needs attention): a re-send's
    /// on the partitioned PostgreSQL layout, which may still run or may have happened, and would do at the
    /// destination again what the compensation undoes. Nothing was undone; compensate once it is finished.
    #[error("effect {key} has a row not finished (id {id}, {state}): it may still run or may have happened at the destination; nothing was undone, compensate once it is done or failed")]
    Unfinished {
        /// The key.
        key: String,
        /// The unfinished row's id (the oldest of them).
        id: i64,
        /// Its state.
        state: EffectState,
    },
    /// This runner has no executor for the effect's destination.
    #[error("no executor is registered for destination {0:?}")]
    NoExecutor(String),
    /// The executor did not say it undid it: the destination refused, its answer was lost (the source says
    /// which, and whether it may have undone it), or there is no compensation. The effect stays done in the store.
    #[error("the destination did not confirm it undid effect {key}: {source}")]
    Refused {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The store failed.
    #[error("store error: {0}")]
    Store(#[source] BoxError),
    /// The compensation stopped after the destination had undone some of the key's done effects (a key with
    /// several, see [`EffectRunner::compensate`](super::EffectRunner::compensate)): `rows` says, for every done
    /// effect of the key, oldest first, whether it was undone at the destination and whether it was marked
    /// compensated; `source` is why it stopped (the destination's refusal, or the store's failure to mark one).
    #[error("effect {key} was compensated only in part ({source}): {}", CompensatedRow::list(.rows))]
    Incomplete {
        /// The key.
        key: String,
        /// Every done effect of the key, oldest first, and what the compensation did to it.
        rows: Vec<CompensatedRow>,
        /// Why the compensation stopped.
        #[source]
        source: BoxError,
    },
}

/// One done effect of a key and what a compensation that stopped midway did to it
/// ([`CompensateError::Incomplete`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompensatedRow {
    /// Its row id.
    pub id: i64,
    /// Its destination.
    pub destination: String,
    /// The destination's reference.
    pub reference: Option<String>,
    /// What was done to it.
    pub outcome: RowOutcome,
}

impl CompensatedRow {
    fn list(rows: &[CompensatedRow]) -> String {
        let rows: Vec<String> = rows.iter().map(ToString::to_string).collect();
        rows.join("; ")
    }
}

impl fmt::Display for CompensatedRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "id {} (destination {:?}, reference ",
            self.id, self.destination
        )?;
        match &self.reference {
            Some(r) => write!(f, "{r:?}")?,
            None => f.write_str("none")?,
        }
        write!(f, ") {}", self.outcome)
    }
}

/// What a compensation did to one done effect ([`CompensatedRow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RowOutcome {
    /// Undone at the destination and marked compensated.
    UndoneAndMarked,
    /// Undone at the destination but not marked compensated: the store failed to mark it (the error's
    /// source), or it was no longer done when marked (another compensation marked it, or the purge removed it).
    /// Its row may still say done although the destination has undone it.
    UndoneNotMarked,
    /// The destination did not confirm it undid it (the error's source): it refused (still done at the
    /// destination), or its answer was lost (it may have undone it). Still done in the store.
    Refused,
    /// Not asked: the compensation stopped at an earlier effect. Still done, at the destination and in the store.
    NotTried,
}

impl fmt::Display for RowOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UndoneAndMarked => "undone at the destination and marked compensated",
            Self::UndoneNotMarked => "undone at the destination but NOT marked compensated",
            Self::Refused => {
                "refused by the destination or not confirmed undone, still done in the store"
            }
            Self::NotTried => "not asked, still done",
        })
    }
}

/// How a runner runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "EffectOptions do nothing until given to an EffectRunner"]
pub struct EffectOptions {
    /// Effects claimed per pass (default 32).
    pub batch: i64,
    /// How long a claim lasts before another runner may take the effect as uncertain (default 60 s; longer
    /// than any call), plus the longest `reconcile_after` of the runner's destinations. The runner's work on a
    /// claim ends `claim_for` after it asked for the claim, by its own monotonic clock. The claim's end is
    /// counted by the store's clock ([`EffectStore::claim_effects`](super::EffectStore::claim_effects)):
    /// PostgreSQL's server clock, SQLite's host clock, on DynamoDB the clock of each runner's host, which must
    /// stay within `reconcile_after` of the others'. Due times (backoffs, `reconcile_after`) are kept on the
    /// same clock.
    pub claim_for: Duration,
    /// Executions before an effect that never reached the destination is failed (default 10).
    pub max_attempts: i32,
    /// Reconciliations without an answer before an effect needs attention (default 10).
    pub max_reconciliations: i32,
    /// First backoff; doubled each attempt up to `max_backoff` (default 1 s; a `max_backoff` below it is
    /// taken as it).
    pub backoff: Duration,
    /// Longest backoff (default 5 min).
    pub max_backoff: Duration,
    /// How long done effects are kept (default 7 days). The maintenance removes done and compensated effects
    /// too, after [`MaintenanceOptions::effects_keep`](crate::runtime::maintenance::MaintenanceOptions::effects_keep):
    /// where both run, a done effect goes at the shorter of the two.
    pub done_retention: Duration,
    /// Pause when nothing is due (default 500 ms).
    pub idle_poll: Duration,
    /// The shard this runner's store is ([`crate::runtime::shards`]), added as a `shard` label to the effect
    /// gauges, so that the runners of several shards of one consumer publish one series each (default none).
    pub shard: Option<String>,
}

impl Default for EffectOptions {
    fn default() -> Self {
        Self {
            batch: 32,
            claim_for: Duration::from_secs(60),
            max_attempts: 10,
            max_reconciliations: 10,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            done_retention: Duration::from_secs(7 * 24 * 3600),
            idle_poll: Duration::from_millis(500),
            shard: None,
        }
    }
}

impl EffectOptions {
    /// Sets the claim batch.
    pub fn batch(mut self, n: i64) -> Self {
        self.batch = n.max(1);
        self
    }
    /// Sets the claim duration (see [`EffectOptions::claim_for`](#structfield.claim_for): whose clock counts it).
    pub fn claim_for(mut self, d: Duration) -> Self {
        self.claim_for = d;
        self
    }
    /// Sets the attempt limit.
    pub fn max_attempts(mut self, n: i32) -> Self {
        self.max_attempts = n.max(1);
        self
    }
    /// Sets the reconciliation limit.
    pub fn max_reconciliations(mut self, n: i32) -> Self {
        self.max_reconciliations = n.max(1);
        self
    }
    /// Sets the first and the longest backoff.
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = max.max(first);
        self
    }
    /// Sets how long done effects are kept.
    pub fn done_retention(mut self, d: Duration) -> Self {
        self.done_retention = d;
        self
    }
    /// Sets the pause when nothing is due.
    pub fn idle_poll(mut self, d: Duration) -> Self {
        self.idle_poll = d;
        self
    }
    /// Labels the effect gauges with `shard` (one runner per shard of a worker).
    pub fn shard(mut self, shard: impl Into<String>) -> Self {
        self.shard = Some(shard.into());
        self
    }

    /// The retry delay after the `n`-th attempt (1 = the first).
    pub(super) fn backoff_for(&self, n: i32) -> Duration {
        crate::time::doubled(self.backoff, self.max_backoff, n.max(1).unsigned_abs())
    }
}

/// What one runner did, by resulting state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "an EffectReport says what the runner did"]
pub struct EffectReport {
    /// Effects claimed.
    pub claimed: u64,
    /// Transitions recorded, by the state they led to.
    pub transitions: BTreeMap<EffectState, u64>,
    /// Results dropped because the claim had expired and another holder took the effect, or work given up
    /// because it outlasted `claim_for` (the effect's next holder reconciles it).
    pub claims_lost: u64,
    /// Store errors met (the pass goes on with the next effect; the claim expires and is reconciled).
    pub store_errors: u64,
}

impl EffectReport {
    /// Transitions to `state`.
    pub fn count(&self, state: EffectState) -> u64 {
        self.transitions.get(&state).copied().unwrap_or(0)
    }
    pub(crate) fn add(&mut self, other: &EffectReport) {
        self.claimed += other.claimed;
        self.claims_lost += other.claims_lost;
        self.store_errors += other.store_errors;
        for (k, v) in &other.transitions {
            *self.transitions.entry(*k).or_default() += v;
        }
    }
}

impl fmt::Display for EffectReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EffectReport claimed={}", self.claimed)?;
        for (k, v) in &self.transitions {
            write!(f, " {k}={v}")?;
        }
        write!(
            f,
            " claims_lost={} store_errors={}",
            self.claims_lost, self.store_errors
        )
    }
}
