//! Observable outcomes, as values comparable across stores.

use chrono::{DateTime, TimeZone, Utc};
use txinbox_core::effects::{ClaimedEffect, EffectCount};
use txinbox_core::store::ops::{
    ConsumerStats, EffectView, MessageStory, RejectionId, RejectionRow,
};

use super::*;

/// A date as both stores keep it: years 1 to 9999, to the microsecond (rounded down); a time the pipeline
/// wrote as the hour it is in ([`wall_clock_masked`]).
pub fn kept(t: DateTime<Utc>) -> DateTime<Utc> {
    stored(wall_clock_masked(t))
}

/// A time a store keeps on its own clock, [`kept`]: a claim's end or a due time a finish wrote is the store's
/// clock (PostgreSQL's, the host's) plus what the runner asked, so two stores asked one after the other keep
/// it microseconds apart, however far from the wall clock it lands (a claim of thousands of years). It is
/// rounded to the minute, unless the stores keep it at the first or last instant they keep (years 1 and
/// 9999), which both reach exactly.
pub fn kept_on_store_clock(t: DateTime<Utc>) -> DateTime<Utc> {
    let (first, last) = (
        stored(DateTime::<Utc>::MIN_UTC),
        stored(DateTime::<Utc>::MAX_UTC),
    );
    let at = stored(t);
    if at == first || at == last {
        return kept(t);
    }
    // To the nearest minute, in microseconds (chrono's `duration_round` counts in nanoseconds, which end in
    // 2262).
    let minute = 60_000_000i64;
    let micros = at.timestamp_micros();
    let rounded = (micros + minute / 2).div_euclid(minute) * minute;
    DateTime::<Utc>::from_timestamp_micros(rounded).unwrap_or(at)
}

/// A date as the stores keep it (years 1 to 9999, to the microsecond, rounded down).
///
/// # Panics
/// Never: the bounds are constants.
pub fn stored(t: DateTime<Utc>) -> DateTime<Utc> {
    let first = Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap();
    let last = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap()
        + chrono::Duration::microseconds(999_999);
    let t = t.clamp(first, last);
    t - chrono::Duration::nanoseconds(i64::from(t.timestamp_subsec_nanos() % 1000))
}

/// [`kept`], when there is a date.
pub fn kept_opt(t: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    t.map(kept)
}

/// An outcome: `Ok` with the value's normalized debug text, or the error's kind. `detail` is the error
/// message, shown when the outcomes differ but not compared.
#[derive(Debug)]
pub struct Outcome {
    /// The value's text, or the error's kind.
    pub answer: Result<String, String>,
    /// The error's message (shown, never compared).
    pub detail: String,
}

impl PartialEq for Outcome {
    fn eq(&self, other: &Self) -> bool {
        self.answer == other.answer
    }
}

impl Outcome {
    /// `Ok` with this text.
    pub fn ok(text: String) -> Self {
        Outcome {
            answer: Ok(text),
            detail: String::new(),
        }
    }

    /// An error of this kind, with (the start of) its message as the detail.
    pub fn error(kind: String, e: &impl std::fmt::Display) -> Self {
        Outcome {
            answer: Err(kind),
            detail: e.to_string().chars().take(300).collect(),
        }
    }
}

/// A delivery's outcome without what names the store (a retry's reason, a dead letter's detail); any
/// other outcome as `other` writes it.
pub fn delivered_as(
    o: txinbox_core::Outcome,
    other: impl FnOnce(&txinbox_core::Outcome) -> String,
) -> String {
    use txinbox_core::Outcome as O;
    match o {
        O::Retry { .. } => "retry".into(),
        O::DeadLettered { reason, .. } => format!("dead-lettered: {reason}"),
        o => other(&o),
    }
}

/// [`delivered_as`] with any other outcome as its debug text.
pub fn delivered(o: txinbox_core::Outcome) -> String {
    delivered_as(o, |o| format!("{o:?}"))
}

/// A claimed effect, its creation time as `created` writes it.
pub fn claimed_as(e: &ClaimedEffect, created: impl FnOnce(DateTime<Utc>) -> String) -> String {
    format!(
        "{}|{}|{}|{}|{}|{:?}|{:?}|{}|{:?}|{}|{}|{}|{:?}|{}|{:?}",
        e.key,
        e.consumer,
        e.message_id,
        e.name,
        e.destination,
        e.payload,
        e.metadata,
        e.external_ref,
        e.claimed_from,
        e.attempts,
        e.reconciliations,
        created(e.created_at),
        e.reference,
        e.maybe_happened,
        e.sent_hash
    )
}

/// A claimed effect, its creation time [`kept`].
pub fn claimed(e: &ClaimedEffect) -> String {
    claimed_as(e, |t| kept(t).to_string())
}

/// A consumer's figures with their dates [`kept`] and no lag.
pub fn stats(mut s: ConsumerStats) -> ConsumerStats {
    s.oldest_processed_at = kept_opt(s.oldest_processed_at);
    s.newest_processed_at = kept_opt(s.newest_processed_at);
    s.last_rejection_at = kept_opt(s.last_rejection_at);
    s.oldest_pending_effect_at = kept_opt(s.oldest_pending_effect_at);
    // The lag is measured from the oldest date kept.
    s.effect_lag_seconds = s.effect_lag_seconds.map(|_| 0.0);
    s
}

/// A rejection with its date [`kept`] and no id.
pub fn rejection(mut r: RejectionRow) -> RejectionRow {
    // Ids are each store's own: a table's sequence (a statement a store refused may have used one), an
    // evidence item's UUID.
    r.id = RejectionId::Number(0);
    r.recorded_at = kept(r.recorded_at);
    r
}

/// An effect with its dates [`kept`] and no id.
pub fn effect_view(mut e: EffectView) -> EffectView {
    e.id = 0;
    e.next_attempt_at = kept_on_store_clock(e.next_attempt_at);
    e.claim_until = e.claim_until.map(kept_on_store_clock);
    e.created_at = kept(e.created_at);
    e.updated_at = kept(e.updated_at);
    e.finished_at = kept_opt(e.finished_at);
    e
}

/// A message's story with its dates kept, its ids zero and its effects in key order.
pub fn story(mut s: MessageStory) -> MessageStory {
    for m in &mut s.markers {
        m.received_at = kept(m.received_at);
        m.processed_at = kept(m.processed_at);
        m.retention_until = kept(m.retention_until);
    }
    s.rejections = s.rejections.into_iter().map(rejection).collect();
    s.effects = s.effects.into_iter().map(effect_view).collect();
    s.effects.sort_by(|a, b| a.key.cmp(&b.key));
    s
}

/// The effect counts, each as a line, sorted; the oldest date as `oldest` writes it.
pub fn counts_as<T: std::fmt::Debug>(
    v: Vec<EffectCount>,
    oldest: impl Fn(Option<DateTime<Utc>>) -> T,
) -> Vec<String> {
    let mut v: Vec<String> = v
        .into_iter()
        .map(|c| {
            format!(
                "{}|{}|{:?}|{}|{:?}|{}",
                c.consumer,
                c.destination,
                c.state,
                c.count,
                oldest(c.oldest),
                c.without_reference
            )
        })
        .collect();
    v.sort();
    v
}

/// The effect counts, each as a line, sorted, the oldest date [`kept`].
pub fn counts(v: Vec<EffectCount>) -> Vec<String> {
    counts_as(v, kept_opt)
}

#[cfg(test)]
mod store_clock_tests {
    use super::*;

    /// Found by DynamoDB's prop_backends: a claim until 9104 asked of SQLite, then of DynamoDB, ended 0.8 ms
    /// apart, and the two stories differed by that alone.
    #[test]
    fn times_on_two_stores_clocks_a_moment_apart_compare_equal_however_far_ahead() {
        // Whole hours and 57 minutes past the run's base: no time the pipeline wrote, so not masked.
        let a = base()
            + chrono::Duration::days(365 * 7078)
            + chrono::Duration::minutes(57)
            + chrono::Duration::microseconds(672_352);
        let b = a + chrono::Duration::microseconds(772);
        assert_eq!(kept_on_store_clock(a), kept_on_store_clock(b));
        let near = Utc::now() + chrono::Duration::hours(2);
        assert_eq!(
            kept_on_store_clock(near),
            kept_on_store_clock(near + chrono::Duration::microseconds(500))
        );
        // The last instant the stores keep is reached exactly, however it was asked.
        let last = kept_on_store_clock(DateTime::<Utc>::MAX_UTC);
        assert_eq!(last, stored(DateTime::<Utc>::MAX_UTC));
        assert_ne!(kept_on_store_clock(a), last);
    }
}
