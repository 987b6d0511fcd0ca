//! External effects as governed units: what a handler wants done outside the database (create a task in a CRM,
//! send an e-mail, charge a card, publish to a broker), recorded in the inbox transaction and run after COMMIT.
//!
//! ```text
//! pending ──claim──▶ in flight ──answer──▶ done (the destination's reference kept)
//!                       │  └──error, nothing sent──▶ pending (backoff; attempt limit ──▶ failed, evidence kept)
//!                       └──answer lost / timeout / holder died──▶ uncertain
//! uncertain ──reconcile (ask the destination by key or reference)──▶ done | run again with the SAME key
//!                                                                  | uncertain (backoff) ──limit──▶ needs attention
//! ```
//!
//! * **The intent** ([`Effect`]) commits with the marker and the business change, or not at all.
//! * **The idempotency key** ([`idempotency_key`]) is derived from the message identity and the effect's name:
//!   the same on every redelivery and every retry, sent to the destination (HTTP: the `Idempotency-Key`
//!   header), and stored with the effect.
//! * **The runner** ([`EffectRunner`]) claims due effects (a claim expires when its holder dies; on PostgreSQL
//!   several runners never hold one effect at once), runs them through the [`EffectExecutor`] registered for
//!   their destination, and records the result.
//! * **A lost answer is uncertain, never silently pending.** An uncertain effect, and one whose holder died
//!   mid-call, is **reconciled before any retry**: the executor's confirmation query asks the destination by
//!   key or external reference; found means done, not found means run again with the same key, no answer
//!   means uncertain again (with backoff) and, after a limit, needs attention.
//! * Each effect has its own backoff and attempt limit, so a failing one never blocks the others; order is
//!   kept only within a [group](Effect::group) the user names.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};

use crate::error::BoxError;
use crate::identity::Identity;

/// What a handler wants done outside the database, recorded in the inbox transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Effect {
    /// The effect's name within the message (`crm.create_task`): part of the idempotency key, so one message
    /// may ask for several effects.
    pub name: String,
    /// The destination: the name an [`EffectExecutor`] is registered under.
    pub destination: String,
    /// What to send (an HTTP body, a message body).
    pub payload: Vec<u8>,
    /// Extra fields the executor reads (HTTP headers, a message's attributes).
    pub metadata: BTreeMap<String, String>,
    /// A reference the destination can be searched by (default: the idempotency key).
    pub external_ref: Option<String>,
    /// Effects of one group run in the order they were recorded, one at a time (default: none, no order).
    pub group: Option<String>,
}

impl Effect {
    /// An effect `name` for `destination` with `payload`.
    pub fn new(
        name: impl Into<String>,
        destination: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            name: name.into(),
            destination: destination.into(),
            payload: payload.into(),
            metadata: BTreeMap::new(),
            external_ref: None,
            group: None,
        }
    }

    /// An effect whose payload is `value` as JSON.
    pub fn json<T: serde::Serialize>(
        name: impl Into<String>,
        destination: impl Into<String>,
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self::new(name, destination, serde_json::to_vec(value)?))
    }

    /// Sets a metadata field.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Sets the reference the destination can be searched by.
    pub fn external_ref(mut self, r: impl Into<String>) -> Self {
        self.external_ref = Some(r.into());
        self
    }

    /// Runs this effect in order with the others of `group`.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }
}

/// The idempotency key of effect `name` of the message `identity`: 32 hex digits of SHA-256 over the consumer,
/// the source, the message id and the name. The same on every redelivery of the message and every retry of the
/// effect; different for another consumer, message or effect. Safe in an HTTP header.
pub fn idempotency_key(identity: &Identity, name: &str) -> String {
    let mut h = Sha256::new();
    for part in [
        identity.consumer.as_str(),
        identity.source.as_str(),
        identity.message_id.as_str(),
        name,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(32);
    for b in &digest[..16] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// An effect as the store writes it in the inbox transaction.
#[derive(Debug)]
#[non_exhaustive]
pub struct NewEffect<'a> {
    /// The consumer whose message asked for it.
    pub consumer: &'a str,
    /// The message id.
    pub message_id: &'a str,
    /// Its idempotency key.
    pub key: String,
    /// The intent.
    pub effect: &'a Effect,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
}

/// The state of an effect, with names an operator understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum EffectState {
    /// Recorded, waiting for its turn (or for its backoff after a call that sent nothing).
    Pending,
    /// Claimed by a runner, being executed or reconciled.
    InFlight,
    /// The destination did it; its reference is kept.
    Done,
    /// A call may have had an effect and its answer was lost: reconciled before any retry.
    Uncertain,
    /// The destination refused it, or every attempt failed: evidence kept, not retried.
    Failed,
    /// Reconciliation could not decide within its limit: an operator must look.
    NeedsAttention,
    /// Done, then undone by an operator's compensation.
    Compensated,
}

impl EffectState {
    /// Every state.
    pub const ALL: [EffectState; 7] = [
        EffectState::Pending,
        EffectState::InFlight,
        EffectState::Done,
        EffectState::Uncertain,
        EffectState::Failed,
        EffectState::NeedsAttention,
        EffectState::Compensated,
    ];

    /// The stored name (`pending`, `in_flight`, `done`, `uncertain`, `failed`, `needs_attention`).
    pub fn as_str(self) -> &'static str {
        match self {
            EffectState::Pending => "pending",
            EffectState::InFlight => "in_flight",
            EffectState::Done => "done",
            EffectState::Uncertain => "uncertain",
            EffectState::Failed => "failed",
            EffectState::NeedsAttention => "needs_attention",
            EffectState::Compensated => "compensated",
        }
    }

    /// The state stored as `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl fmt::Display for EffectState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An effect a runner claimed.
#[derive(Clone, Debug)]
pub struct ClaimedEffect {
    /// Row id.
    pub id: i64,
    /// The consumer whose message asked for it.
    pub consumer: String,
    /// The message id.
    pub message_id: String,
    /// Its idempotency key.
    pub key: String,
    /// The effect's name.
    pub name: String,
    /// Its destination.
    pub destination: String,
    /// What to send.
    pub payload: Vec<u8>,
    /// Extra fields.
    pub metadata: BTreeMap<String, String>,
    /// The reference the destination can be searched by.
    pub external_ref: String,
    /// Its state before this claim: `Uncertain`, or `InFlight` of a holder whose claim expired, means the
    /// effect may already have happened and is reconciled first.
    pub claimed_from: EffectState,
    /// Executions so far.
    pub attempts: i32,
    /// Reconciliations so far.
    pub reconciliations: i32,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
    /// The destination's reference, once done (`None` on a claim).
    pub reference: Option<String>,
}

impl ClaimedEffect {
    /// Whether the effect may already have happened, so the destination must be asked before a call.
    pub fn needs_reconciliation(&self) -> bool {
        matches!(
            self.claimed_from,
            EffectState::Uncertain | EffectState::InFlight
        )
    }
}

/// What a runner records for a claimed effect.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transition {
    /// Done, with the destination's reference.
    Done {
        /// The destination's reference (the created task's id).
        reference: Option<String>,
        /// Executions, this one included.
        attempts: i32,
        /// Reconciliations, this one included.
        reconciliations: i32,
    },
    /// Nothing reached the destination: pending again at `next_at`.
    Retry {
        /// When to try again.
        next_at: DateTime<Utc>,
        /// Why.
        error: String,
        /// Executions, this one included.
        attempts: i32,
        /// Reconciliations, this one included.
        reconciliations: i32,
    },
    /// May have happened: reconcile at `next_at`.
    Uncertain {
        /// When to reconcile.
        next_at: DateTime<Utc>,
        /// Why.
        error: String,
        /// Executions, this one included.
        attempts: i32,
        /// Reconciliations, this one included.
        reconciliations: i32,
    },
    /// Refused or out of attempts: kept with the evidence, not retried.
    Failed {
        /// Why.
        error: String,
        /// Executions, this one included.
        attempts: i32,
    },
    /// Reconciliation could not decide: an operator must look.
    NeedsAttention {
        /// Why.
        error: String,
        /// Reconciliations, this one included.
        reconciliations: i32,
    },
}

/// A transition as a store writes it: the new state and the columns it sets (`None` leaves a column as it is).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransitionColumns<'a> {
    /// The new state.
    pub state: EffectState,
    /// Executions so far.
    pub attempts: Option<i32>,
    /// Reconciliations so far.
    pub reconciliations: Option<i32>,
    /// When the effect is next due.
    pub next_at: Option<DateTime<Utc>>,
    /// The destination's reference.
    pub reference: Option<&'a str>,
    /// The last error (cleared by `Done`).
    pub error: Option<&'a str>,
    /// Whether the effect is finished (done or failed): `finished_at` is set.
    pub finished: bool,
}

impl Transition {
    /// The columns this transition sets.
    pub fn columns(&self) -> TransitionColumns<'_> {
        let base = TransitionColumns {
            state: self.state(),
            attempts: None,
            reconciliations: None,
            next_at: None,
            reference: None,
            error: None,
            finished: false,
        };
        match self {
            Transition::Done {
                reference,
                attempts,
                reconciliations,
            } => TransitionColumns {
                attempts: Some(*attempts),
                reconciliations: Some(*reconciliations),
                reference: reference.as_deref(),
                finished: true,
                ..base
            },
            Transition::Retry {
                next_at,
                error,
                attempts,
                reconciliations,
            }
            | Transition::Uncertain {
                next_at,
                error,
                attempts,
                reconciliations,
            } => TransitionColumns {
                attempts: Some(*attempts),
                reconciliations: Some(*reconciliations),
                next_at: Some(*next_at),
                error: Some(error),
                ..base
            },
            Transition::Failed { error, attempts } => TransitionColumns {
                attempts: Some(*attempts),
                error: Some(error),
                finished: true,
                ..base
            },
            Transition::NeedsAttention {
                error,
                reconciliations,
            } => TransitionColumns {
                reconciliations: Some(*reconciliations),
                error: Some(error),
                ..base
            },
        }
    }

    /// The state this transition leads to.
    pub fn state(&self) -> EffectState {
        match self {
            Transition::Done { .. } => EffectState::Done,
            Transition::Retry { .. } => EffectState::Pending,
            Transition::Uncertain { .. } => EffectState::Uncertain,
            Transition::Failed { .. } => EffectState::Failed,
            Transition::NeedsAttention { .. } => EffectState::NeedsAttention,
        }
    }
}

/// Effects of one consumer, destination and state, for the gauges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectCount {
    /// The consumer.
    pub consumer: String,
    /// The destination.
    pub destination: String,
    /// The state.
    pub state: EffectState,
    /// How many.
    pub count: i64,
    /// When the oldest of them was recorded.
    pub oldest: Option<DateTime<Utc>>,
}

/// Where effects wait: what the runner needs from a store.
pub trait EffectStore: Clone + Send + Sync + 'static {
    /// The driver's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Claims up to `limit` due effects for `destinations` on behalf of `holder` until `claim_until`: pending
    /// and uncertain ones whose time has come, and in-flight ones whose holder's claim expired. Within a group
    /// only the oldest unfinished effect is due. No effect is held by two holders at once.
    fn claim_effects(
        &self,
        holder: &str,
        destinations: &[String],
        now: DateTime<Utc>,
        claim_until: DateTime<Utc>,
        limit: i64,
    ) -> impl std::future::Future<Output = Result<Vec<ClaimedEffect>, Self::Error>> + Send;

    /// Records `transition` for effect `id` if `holder` still holds its claim; `false` when it does not (the
    /// claim expired and another holder took the effect: this result is dropped, that holder reconciles).
    fn finish_effect(
        &self,
        id: i64,
        holder: &str,
        transition: &Transition,
        now: DateTime<Utc>,
    ) -> impl std::future::Future<Output = Result<bool, Self::Error>> + Send;

    /// Deletes up to `limit` done effects finished before `before`; returns how many.
    fn purge_done_effects(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> impl std::future::Future<Output = Result<u64, Self::Error>> + Send;

    /// Effects by consumer, destination and state.
    fn effect_counts(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<EffectCount>, Self::Error>> + Send;

    /// The effect with idempotency key `key` as it is now (`claimed_from` is its current state, `reference`
    /// the destination's), if any.
    fn find_effect(
        &self,
        key: &str,
    ) -> impl std::future::Future<Output = Result<Option<ClaimedEffect>, Self::Error>> + Send;

    /// Marks a done effect compensated, keeping `note`; `false` when it is not done (any more).
    fn mark_compensated(
        &self,
        id: i64,
        note: &str,
        now: DateTime<Utc>,
    ) -> impl std::future::Future<Output = Result<bool, Self::Error>> + Send;
}

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
    /// This runner has no executor for the effect's destination.
    #[error("no executor is registered for destination {0:?}")]
    NoExecutor(String),
    /// The executor could not undo it (or has no compensation).
    #[error("the destination did not undo effect {key}: {source}")]
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
}

/// What an execution did.
#[derive(Debug)]
#[non_exhaustive]
pub enum Execution {
    /// The destination did it (or had done it under this key).
    Done {
        /// Its reference (the created task's id).
        reference: Option<String>,
    },
    /// Nothing reached the destination (connection refused, DNS, a 503 before the body was read): safe to
    /// retry after a backoff.
    NotSent {
        /// Why.
        error: BoxError,
    },
    /// The destination refused it for good (a 4xx): not retried.
    Rejected {
        /// Why.
        error: BoxError,
    },
    /// The call may have had an effect and its answer was lost (timeout, connection reset, 5xx after the body
    /// was sent): reconciled before any retry.
    Uncertain {
        /// Why.
        error: BoxError,
    },
}

/// What the destination says about an effect when asked by key or reference.
#[derive(Debug)]
#[non_exhaustive]
pub enum Confirmation {
    /// It happened; here is its reference.
    Done {
        /// Its reference.
        reference: Option<String>,
    },
    /// It did not happen: run it again, with the same key.
    NotFound,
    /// No answer: still uncertain.
    Unknown {
        /// Why.
        error: BoxError,
    },
}

/// Runs effects of one destination and answers for them. `execute` must send the idempotency key when the
/// destination honours one; `confirm` is the confirmation query (by key or external reference) that makes a
/// lost answer recoverable: without one the executor answers [`Confirmation::Unknown`] and an uncertain effect
/// ends in needs attention.
pub trait EffectExecutor: Send + Sync + 'static {
    /// Runs the effect.
    fn execute<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Execution>;

    /// Asks the destination whether the effect happened.
    fn confirm<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation>;

    /// Undoes a done effect (an operator's compensation); unsupported unless the executor says otherwise.
    fn compensate<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Result<(), BoxError>> {
        let _ = effect;
        Box::pin(async { Err("this destination has no compensation".into()) })
    }
}

/// How a runner runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EffectOptions {
    /// Effects claimed per pass (default 32).
    pub batch: i64,
    /// How long a claim lasts before another runner may take the effect as uncertain (default 60 s; longer
    /// than any call).
    pub claim_for: Duration,
    /// Executions before an effect that never reached the destination is failed (default 10).
    pub max_attempts: i32,
    /// Reconciliations without an answer before an effect needs attention (default 10).
    pub max_reconciliations: i32,
    /// First backoff; doubled each attempt up to `max_backoff` (default 1 s).
    pub backoff: Duration,
    /// Longest backoff (default 5 min).
    pub max_backoff: Duration,
    /// How long done effects are kept (default 7 days).
    pub done_retention: Duration,
    /// Pause when nothing is due (default 500 ms).
    pub idle_poll: Duration,
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
        }
    }
}

impl EffectOptions {
    /// Sets the claim batch.
    pub fn batch(mut self, n: i64) -> Self {
        self.batch = n.max(1);
        self
    }
    /// Sets the claim duration.
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

    fn backoff_for(&self, n: i32) -> Duration {
        let shift = n.clamp(1, 20) as u32 - 1;
        self.backoff
            .checked_mul(1u32 << shift)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

/// What one runner did, by resulting state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EffectReport {
    /// Effects claimed.
    pub claimed: u64,
    /// Transitions recorded, by the state they led to.
    pub transitions: BTreeMap<EffectState, u64>,
    /// Results dropped because the claim had expired and another holder took the effect.
    pub claims_lost: u64,
    /// Store errors met (the pass goes on with the next effect; the claim expires and is reconciled).
    pub store_errors: u64,
}

impl EffectReport {
    /// Transitions to `state`.
    pub fn count(&self, state: EffectState) -> u64 {
        self.transitions.get(&state).copied().unwrap_or(0)
    }
    fn add(&mut self, other: &EffectReport) {
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

/// Runs the effects of a store through the executors registered per destination.
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
        let before = Utc::now()
            - chrono::Duration::from_std(self.opts.done_retention).unwrap_or(chrono::Duration::MAX);
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
            Ok(counts) => publish_gauges(&counts),
            Err(e) => tracing::warn!(error = %e, "reading effect counts failed"),
        }
    }

    /// One pass: claim a batch and run it, concurrently within the batch.
    pub async fn run_pass(&self) -> EffectReport {
        let mut report = EffectReport::default();
        let now = Utc::now();
        let until =
            now + chrono::Duration::from_std(self.opts.claim_for).unwrap_or(chrono::Duration::MAX);
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
        let results = futures::future::join_all(claimed.iter().map(|e| self.run_one(e))).await;
        for r in results {
            match r {
                Ok(Some(state)) => *report.transitions.entry(state).or_default() += 1,
                Ok(None) => report.claims_lost += 1,
                Err(()) => report.store_errors += 1,
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
        if e.needs_reconciliation() {
            reconciliations += 1;
            let answer = exec.confirm(e).await;
            let outcome = match &answer {
                Confirmation::Done { .. } => "done",
                Confirmation::NotFound => "not_found",
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
                    return self
                        .finish(
                            e,
                            Transition::Done {
                                reference,
                                attempts: e.attempts,
                                reconciliations,
                            },
                        )
                        .await;
                }
                Confirmation::NotFound => {}
                Confirmation::Unknown { error } => {
                    let t = if reconciliations >= self.opts.max_reconciliations {
                        Transition::NeedsAttention {
                            error: error.to_string(),
                            reconciliations,
                        }
                    } else {
                        Transition::Uncertain {
                            next_at: Utc::now() + self.backoff(reconciliations),
                            error: error.to_string(),
                            attempts: e.attempts,
                            reconciliations,
                        }
                    };
                    return self.finish(e, t).await;
                }
            }
        }
        let attempts = e.attempts + 1;
        let result = exec.execute(e).await;
        let result_label = match &result {
            Execution::Done { .. } => "done",
            Execution::NotSent { .. } => "not_sent",
            Execution::Rejected { .. } => "rejected",
            Execution::Uncertain { .. } => "uncertain",
        };
        metrics::counter!(
            crate::metrics::EFFECT_EXECUTIONS,
            labels_with(&labels, "result", result_label)
        )
        .increment(1);
        let t = match result {
            Execution::Done { reference } => Transition::Done {
                reference,
                attempts,
                reconciliations,
            },
            Execution::NotSent { error } if attempts >= self.opts.max_attempts => {
                Transition::Failed {
                    error: format!("{attempts} attempts, none reached the destination: {error}"),
                    attempts,
                }
            }
            Execution::NotSent { error } => Transition::Retry {
                next_at: Utc::now() + self.backoff(attempts),
                error: error.to_string(),
                attempts,
                reconciliations,
            },
            Execution::Rejected { error } => Transition::Failed {
                error: error.to_string(),
                attempts,
            },
            // It may have happened: never failed (that could hide a done effect), but after the attempt
            // limit an operator must look.
            Execution::Uncertain { error } if attempts >= self.opts.max_attempts => {
                Transition::NeedsAttention {
                    error: format!("{attempts} attempts, the last one's answer lost: {error}"),
                    reconciliations,
                }
            }
            Execution::Uncertain { error } => Transition::Uncertain {
                // A first lost answer is reconciled on the next pass; a destination that keeps losing them
                // (a 5xx on every call) is backed off like a failing one.
                next_at: if attempts <= 1 {
                    Utc::now()
                } else {
                    Utc::now() + self.backoff(attempts - 1)
                },
                error: error.to_string(),
                attempts,
                reconciliations,
            },
        };
        self.finish(e, t).await
    }

    fn backoff(&self, n: i32) -> chrono::Duration {
        chrono::Duration::from_std(self.opts.backoff_for(n)).unwrap_or(chrono::Duration::MAX)
    }

    async fn finish(&self, e: &ClaimedEffect, t: Transition) -> Result<Option<EffectState>, ()> {
        let state = t.state();
        match self
            .store
            .finish_effect(e.id, &self.holder, &t, Utc::now())
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

/// Sets the effect gauges from `counts`: effects per consumer, destination and state (zero for a state with
/// none), and the age of the oldest pending effect (the relay lag).
pub fn publish_gauges(counts: &[EffectCount]) {
    let mut pairs: Vec<(&str, &str)> = counts
        .iter()
        .map(|c| (c.consumer.as_str(), c.destination.as_str()))
        .collect();
    pairs.sort();
    pairs.dedup();
    let now = Utc::now();
    for (consumer, destination) in pairs {
        for state in EffectState::ALL {
            let c = counts.iter().find(|c| {
                c.consumer == consumer && c.destination == destination && c.state == state
            });
            metrics::gauge!(crate::metrics::EFFECTS, "consumer" => consumer.to_owned(), "destination" => destination.to_owned(), "state" => state.as_str())
                .set(c.map_or(0.0, |c| c.count as f64));
            if state == EffectState::Pending {
                let age = c
                    .and_then(|c| c.oldest)
                    .map_or(0.0, |t| (now - t).num_milliseconds().max(0) as f64 / 1e3);
                metrics::gauge!(crate::metrics::EFFECT_OLDEST_PENDING, "consumer" => consumer.to_owned(), "destination" => destination.to_owned())
                    .set(age);
            }
        }
    }
}
