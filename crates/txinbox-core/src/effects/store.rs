//! The store contract of effects: what a runner claims, what it records, and what a store must do with it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::EffectState;

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
    /// When it was recorded, on the store's clock. As a runner hands a claimed effect to its executor, on the
    /// runner's host's clock instead (moved by as much as the two differ, see
    /// [`EffectStore::store_clock`]): `Utc::now() - created_at` is then the effect's age by the store's clock,
    /// as an executor reads it (how long a destination still keeps its key).
    pub created_at: DateTime<Utc>,
    /// The destination's reference, once done (`None` on a claim).
    pub reference: Option<String>,
    /// A call may have happened that no confirmation has ruled out since (an uncertain answer, a key in
    /// progress, a holder that died mid-call): such an effect is never marked failed, since its earlier call
    /// may have done it; a refusal then needs attention.
    pub maybe_happened: bool,
    /// SHA-256 (hex) of the request body of the first recorded call under this key, as the executor reported
    /// it ([`EffectExecutor::request_hash`](super::EffectExecutor::request_hash)): evidence when the
    /// destination says the key was used with another body.
    pub sent_hash: Option<String>,
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
        /// An earlier call may have happened (see [`ClaimedEffect::maybe_happened`]).
        maybe_happened: bool,
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
        /// Executions, this one included.
        attempts: i32,
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
    /// Sets [`ClaimedEffect::maybe_happened`] (`None` leaves it).
    pub maybe_happened: Option<bool>,
    /// The hash of this call's request body, kept only if none is recorded yet (the first call's).
    pub sent_hash: Option<&'a str>,
}

/// The most bytes of an error a transition records (an effect's `last_error`): a longer one (an executor's
/// error that carries a whole answer) is cut to this on a character boundary. The log line of the transition
/// keeps it whole.
pub const MAX_ERROR_LEN: usize = 4096;

/// The longest request body hash a transition records: a longer value is no digest (a SHA-256 in hex is 64
/// bytes) and is not recorded, as if the executor had given none.
pub const MAX_SENT_HASH_LEN: usize = 128;

/// The longest destination's reference a transition records: a longer value is no identifier a destination
/// hands out (ids, URLs and resource names are well under it) and is not recorded, as if the destination had
/// given none; the transition's log line (a warning) says so, with the reference's length and its start. Recorded, it would make the finish of an effect
/// that happened too large for a store's item (DynamoDB's 400 KB), and the effect would stay in flight, to run
/// again once its claim ends.
pub const MAX_REFERENCE_LEN: usize = 8192;

impl<'a> TransitionColumns<'a> {
    /// The same columns, recording `hash` as the first call's request body hash if none is recorded yet (not
    /// when it is longer than [`MAX_SENT_HASH_LEN`]).
    pub fn sent_hash(mut self, hash: Option<&'a str>) -> Self {
        self.sent_hash = hash.filter(|h| h.len() <= MAX_SENT_HASH_LEN);
        self
    }
}

impl Transition {
    /// The columns this transition sets; its error cut to [`MAX_ERROR_LEN`] bytes, its reference left out when
    /// longer than [`MAX_REFERENCE_LEN`].
    pub fn columns(&self) -> TransitionColumns<'_> {
        let columns = self.columns_whole();
        TransitionColumns {
            error: columns.error.map(|e| crate::time::cut(e, MAX_ERROR_LEN)),
            reference: columns.reference.filter(|r| r.len() <= MAX_REFERENCE_LEN),
            ..columns
        }
    }

    fn columns_whole(&self) -> TransitionColumns<'_> {
        let base = TransitionColumns {
            state: self.state(),
            attempts: None,
            reconciliations: None,
            next_at: None,
            reference: None,
            error: None,
            finished: false,
            maybe_happened: None,
            sent_hash: None,
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
                maybe_happened,
            } => TransitionColumns {
                attempts: Some(*attempts),
                reconciliations: Some(*reconciliations),
                next_at: Some(*next_at),
                error: Some(error),
                maybe_happened: Some(*maybe_happened),
                ..base
            },
            Transition::Uncertain {
                next_at,
                error,
                attempts,
                reconciliations,
            } => TransitionColumns {
                attempts: Some(*attempts),
                reconciliations: Some(*reconciliations),
                next_at: Some(*next_at),
                error: Some(error),
                maybe_happened: Some(true),
                ..base
            },
            Transition::Failed { error, attempts } => TransitionColumns {
                attempts: Some(*attempts),
                error: Some(error),
                finished: true,
                maybe_happened: Some(false),
                ..base
            },
            Transition::NeedsAttention {
                error,
                attempts,
                reconciliations,
            } => TransitionColumns {
                attempts: Some(*attempts),
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
    /// How many of them have no reference from the destination (meaningful for `done`: the destination said
    /// it did it, or a confirmation found it, without a reference to show for it).
    pub without_reference: i64,
}

/// When a claim asked for at `now` until `claim_until` (the runner's clock) ends, counted from `clock` (the
/// store's): `clock + (claim_until - now)`, or the earliest or latest date there is when that is out of range.
/// A claim ending before `now` (`claim_until < now`) has ended when it begins. `now` and `claim_until` are read
/// as every store keeps a time (years 1 to 9999, whole microseconds), so a claim asked for at the last instant
/// of year 9999 until any time past it lasts nothing, on every store.
///
/// ```
/// use chrono::{Duration, TimeZone, Utc};
/// let runner = Utc.with_ymd_and_hms(2030, 1, 1, 12, 0, 0).unwrap();
/// let store = runner - Duration::hours(2);
/// let end = txinbox_core::effects::claim_end(store, runner, runner + Duration::seconds(60));
/// assert_eq!(end, store + Duration::seconds(60));
/// ```
pub fn claim_end(
    clock: DateTime<Utc>,
    now: DateTime<Utc>,
    claim_until: DateTime<Utc>,
) -> DateTime<Utc> {
    let lasts = crate::time::kept(claim_until).signed_duration_since(crate::time::kept(now));
    clock
        .checked_add_signed(lasts)
        .unwrap_or(if lasts < chrono::TimeDelta::zero() {
            DateTime::<Utc>::MIN_UTC
        } else {
            DateTime::<Utc>::MAX_UTC
        })
}

/// Where effects wait: what the runner needs from a store.
pub trait EffectStore: Clone + Send + Sync + 'static {
    /// The driver's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Claims up to `limit` due effects for `destinations` on behalf of `holder`: pending and uncertain ones
    /// that are due, and in-flight ones whose claim expired. Within a group only the
    /// oldest unfinished effect is due (done, failed and compensated ones are finished). No effect is held by
    /// two holders at once.
    ///
    /// `holder` names this one claim: a finish ([`finish_effect`](Self::finish_effect)) or a give-back
    /// ([`release_claim`](Self::release_claim)) under it applies only to what this claim holds, so a runner
    /// claims each time under a name of its own (its own name and the claim's number: see
    /// [`EffectRunner::holder`](super::EffectRunner::holder)), and a late finish of an earlier claim of the
    /// same runner never lands on a later one.
    ///
    /// **Whose clock.** `now` and `claim_until` are the runner's: the claim lasts `claim_until - now`. Which
    /// effects are due, which claims expired and when the new one ends are decided by the store's clock
    /// ([`claim_end`]: the claim ends that long after the store's clock, a claim has expired once the store's
    /// clock is past its end, and an effect is due once the store's clock reaches its due time, which
    /// [`finish_effect`](Self::finish_effect) keeps on that clock too), so that two runners whose hosts' clocks
    /// differ do not disagree on who holds an effect, nor reconcile an uncertain one before the
    /// `reconcile_after` its destination asked for:
    ///
    /// * PostgreSQL: the database server's clock (`now()`, the statement's start), the same for every runner of
    ///   one database however far their hosts' clocks drift.
    /// * SQLite: the clock of the host the store runs on (one file, one host: every runner of it reads that
    ///   clock).
    /// * DynamoDB: no server clock can be read in a condition; the clock of the runner's host decides, and the
    ///   hosts of the runners of one table must keep their clocks within a bound of one another (see the
    ///   DynamoDB store's docs): a runner whose clock is ahead of the holder's by more than a claim's margin
    ///   over its work (`reconcile_after`) takes an effect over while its holder may still be calling.
    ///
    /// `now` is kept as the effect's `updated_at`. An effect recorded by a worker is due from its
    /// `created_at`, which the store stamps on its clock (PostgreSQL: `now()`, the recording transaction's
    /// start; SQLite: the host's; DynamoDB: the worker host's).
    fn claim_effects(
        &self,
        holder: &str,
        destinations: &[String],
        now: DateTime<Utc>,
        claim_until: DateTime<Utc>,
        limit: i64,
    ) -> impl std::future::Future<Output = Result<Vec<ClaimedEffect>, Self::Error>> + Send;

    /// Gives back what the claim made under `holder` (one claim's name, see
    /// [`claim_effects`](Self::claim_effects)) took, after that claim returned an error: a claim whose write
    /// applied and whose answer was lost (the connection dropped after its COMMIT) holds effects the runner
    /// never ran. Each returns to the state it was claimed from (pending, uncertain; one taken from an expired
    /// claim stays in flight, its claim ended, by the store's clock, so it is due at once), so it is claimed
    /// again at once and one that was never called is not taken for possibly started. Only effects still held
    /// by that very claim are touched; returns how many. `now` is the runner's clock. The default gives back
    /// nothing (the claim's effects are then reconciled once it expires): a store whose claim recognises its
    /// own lost answer needs no more.
    fn release_claim(
        &self,
        holder: &str,
        now: DateTime<Utc>,
    ) -> impl std::future::Future<Output = Result<u64, Self::Error>> + Send {
        let _ = (holder, now);
        async { Ok(0) }
    }

    /// Records a transition (its [columns](Transition::columns)) for effect `id` if the claim named `holder`
    /// still holds it; `false` when it does not (the claim expired and another claim took the effect, of
    /// another runner or of the same one: this result is dropped, that claim reconciles). The runner sends a finish that failed again, with the same columns and
    /// `now`; when one whose first write applied and lost its answer answers `false`, the runner reads the
    /// effect and takes it as its own write if it is out of flight in the state and with the attempts it wrote.
    /// A due time (`next_at`) is kept on the store's clock, as [`claim_effects`](Self::claim_effects) reads it:
    /// `next_at - now` (the runner's clock) after the store's. So is a finished effect's finish time, which the
    /// purges count the retention from on the store's clock ([`store_clock`](Self::store_clock)).
    fn finish_effect(
        &self,
        id: i64,
        holder: &str,
        transition: &TransitionColumns<'_>,
        now: DateTime<Utc>,
    ) -> impl std::future::Future<Output = Result<bool, Self::Error>> + Send;

    /// The store's own clock, read now, where every runner reads the same one (PostgreSQL's `now()`): the
    /// runner's purge ([`purge_done_effects`](Self::purge_done_effects)) counts `done_retention` back from it,
    /// as the claims count due times and claims on it, so that a runner whose host's clock runs ahead never
    /// removes a done effect the database still keeps. `None` (the default): the runner's host's clock (SQLite,
    /// one host; DynamoDB, which has no clock to read). Named apart from
    /// [`MaintenanceStore::clock`](crate::runtime::maintenance::MaintenanceStore::clock), which a store
    /// implementing both answers alike, so that a caller with both traits in scope is never ambiguous.
    fn store_clock(
        &self,
    ) -> impl std::future::Future<Output = Result<Option<DateTime<Utc>>, Self::Error>> + Send {
        async { Ok(None) }
    }

    /// Deletes up to `limit` done effects finished before `before` (the runner counts it back from
    /// [`store_clock`](Self::store_clock)); returns how many.
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
    /// the destination's), if any. Where a key has several effects (see [`find_effects`](Self::find_effects)),
    /// the newest: the latest created, of those the highest id.
    fn find_effect(
        &self,
        key: &str,
    ) -> impl std::future::Future<Output = Result<Option<ClaimedEffect>, Self::Error>> + Send;

    /// Every effect with idempotency key `key`, oldest first (by creation, then id), as
    /// [`find_effect`](Self::find_effect) reads each. One, or none, in a store whose key is unique; the
    /// partitioned PostgreSQL layout may keep more than one: a re-send of a message in another bucket of event
    /// time is another message there and records its effects again under the same keys. The default reads
    /// [`find_effect`](Self::find_effect).
    fn find_effects(
        &self,
        key: &str,
    ) -> impl std::future::Future<Output = Result<Vec<ClaimedEffect>, Self::Error>> + Send {
        async move { Ok(self.find_effect(key).await?.into_iter().collect()) }
    }

    /// Marks a done effect compensated, keeping `note`; `false` when it is not done (any more).
    fn mark_compensated(
        &self,
        id: i64,
        note: &str,
        now: DateTime<Utc>,
    ) -> impl std::future::Future<Output = Result<bool, Self::Error>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transition_records_a_bounded_error_and_only_a_hash_that_can_be_one() {
        let long = "\u{10ffff}".repeat(2000) + "tail";
        let t = Transition::Failed {
            error: long.clone(),
            attempts: 1,
        };
        let error = t.columns().error.unwrap();
        assert!(error.len() <= MAX_ERROR_LEN, "{} bytes", error.len());
        assert!(
            error.len() > MAX_ERROR_LEN - 4,
            "cut at the boundary before the limit"
        );
        assert!(long.starts_with(error));
        let short = Transition::Failed {
            error: "refused: 422".into(),
            attempts: 1,
        };
        assert_eq!(short.columns().error, Some("refused: 422"));

        let digest = "a".repeat(64);
        assert_eq!(
            short.columns().sent_hash(Some(&digest)).sent_hash,
            Some(digest.as_str())
        );
        let not_a_digest = "a".repeat(MAX_SENT_HASH_LEN + 1);
        assert_eq!(
            short.columns().sent_hash(Some(&not_a_digest)).sent_hash,
            None
        );
    }

    /// A destination's reference is recorded up to [`MAX_REFERENCE_LEN`] bytes; a longer one (a hostile or
    /// broken destination's answer) is not recorded at all, rather than cut into an identifier that names
    /// something else, and the effect is still done.
    #[test]
    fn a_done_transition_records_a_reference_only_up_to_its_bound() {
        let done = |reference: String| Transition::Done {
            reference: Some(reference),
            attempts: 1,
            reconciliations: 0,
        };
        let longest = "r".repeat(MAX_REFERENCE_LEN);
        let kept = done(longest.clone());
        assert_eq!(kept.columns().reference, Some(longest.as_str()));
        let too_long = done("r".repeat(MAX_REFERENCE_LEN + 1));
        let columns = too_long.columns();
        assert_eq!(
            (columns.reference, columns.state, columns.finished),
            (None, EffectState::Done, true)
        );
    }

    #[test]
    fn a_claim_lasts_the_difference_between_its_times_as_stores_keep_them() {
        let clock = Utc::now();
        let end_of_9999 = crate::time::kept(DateTime::<Utc>::MAX_UTC);
        assert_eq!(
            end_of_9999.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            "9999-12-31T23:59:59.999999000Z"
        );
        let last_nano = end_of_9999 + chrono::Duration::nanoseconds(999);
        assert_eq!(claim_end(clock, last_nano, DateTime::<Utc>::MAX_UTC), clock);
        let minute = chrono::Duration::minutes(1);
        assert_eq!(claim_end(clock, clock, clock + minute), clock + minute);
        // From year 1 to a time past year 9999: 9,999 years, counted from a clock too close to chrono's end.
        let late_clock = DateTime::<Utc>::MAX_UTC - chrono::Duration::days(1);
        assert_eq!(
            claim_end(
                late_clock,
                DateTime::<Utc>::MIN_UTC,
                DateTime::<Utc>::MAX_UTC
            ),
            DateTime::<Utc>::MAX_UTC,
            "out of range: the latest date there is"
        );
    }
}
