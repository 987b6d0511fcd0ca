//! The model the property tests of two stores share (feature `prop`): generated deliveries, effects and
//! effect transitions, the operator's asked consumers and tables, and the normalisers that make a store's
//! answers comparable with another's (dates as both keep them, a time the pipeline took from the wall clock
//! as the hour it is in, ids each store numbers its own way).
//!
//! What a test generates differently on purpose (text within a store's key limits, its dates) it says
//! through [`Values`]; every generator here draws its text and dates from there.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use txinbox_core::effects::{ClaimedEffect, Effect, EffectCount, EffectStore, Transition};
use txinbox_core::runtime::maintenance::Table;
use txinbox_core::store::ops::{
    ConsumerStats, EffectView, MessageStory, RejectionId, RejectionRow,
};
use txinbox_core::{
    CancellationToken, Handled, Handler, Inbox, InboxStore, Payload, ReceivedMessage,
};

use crate::NoopDelivery;

/// The values a test draws its own way: free text (a store's key limits decide which) and dates.
pub trait Values {
    /// Text from outside.
    fn text() -> impl Strategy<Value = String>;

    /// A date: by default [`time`].
    fn time() -> impl Strategy<Value = DateTime<Utc>> {
        time()
    }
}

/// No text, or [`Values::text`].
pub fn opt_text<V: Values>() -> impl Strategy<Value = Option<String>> {
    prop_oneof![2 => Just(None), 3 => V::text().prop_map(Some)]
}

/// A name or id a message or a handler gives: mostly one of a few plain ones (so that most deliveries are
/// applied and meet each other), sometimes any [`Values::text`].
pub fn field<V: Values>(plain: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(plain).prop_map(String::from),
        1 => V::text(),
    ]
}

/// No field, or a [`field`].
pub fn opt_field<V: Values>(
    plain: &'static [&'static str],
) -> impl Strategy<Value = Option<String>> {
    prop_oneof![3 => Just(None), 2 => field::<V>(plain).prop_map(Some)]
}

/// The plain message ids.
pub const IDS: &[&str] = &["a", "b", "evt-1"];

/// A date near the run's base (so that claims are due and purges meet rows) or at an edge.
pub fn time() -> impl Strategy<Value = DateTime<Utc>> {
    let base = base();
    prop_oneof![
        4 => hours().prop_map(move |h| base + chrono::Duration::hours(h)),
        1 => (hours(), 0u32..1_000_000_000).prop_map(move |(h, n)| {
            base + chrono::Duration::hours(h) + chrono::Duration::nanoseconds(i64::from(n))
        }),
        2 => prop::sample::select(edges()),
        1 => (-100_000_000_000i64..300_000_000_000, 0u32..1_000_000_000)
            .prop_map(|(s, n)| Utc.timestamp_opt(s, n).single().unwrap_or(DateTime::<Utc>::MIN_UTC)),
    ]
}

/// Ten minutes before the run's start, to the second. The pipeline writes its own times (`Utc::now()`,
/// plus a keep of whole hours): each is some whole hours and 10 to 50 minutes past this base, where no
/// generated date near it is (those are whole hours from it, to the second).
pub fn base() -> DateTime<Utc> {
    static BASE: std::sync::OnceLock<DateTime<Utc>> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let now = Utc::now() - chrono::Duration::minutes(10);
        now - chrono::Duration::nanoseconds(i64::from(now.timestamp_subsec_nanos()))
    })
}

/// A time the pipeline wrote (the run's wall clock, which differs between the two runs of a step), as the
/// whole hour after the base it is in; any other time as it is.
pub fn wall_clock_masked(t: DateTime<Utc>) -> DateTime<Utc> {
    let Some(off) = (t - base()).num_microseconds() else {
        return t;
    };
    let hour = 3_600_000_000i64;
    let within = off.rem_euclid(hour);
    if (5 * 60_000_000..55 * 60_000_000).contains(&within) {
        base() + chrono::Duration::microseconds(off - within)
    } else {
        t
    }
}

/// The epoch, the years 1 and 9999, past them and the ends of chrono's range.
///
/// # Panics
/// Never: the dates are constants.
pub fn edges() -> Vec<DateTime<Utc>> {
    let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
    vec![
        DateTime::<Utc>::UNIX_EPOCH,
        DateTime::<Utc>::UNIX_EPOCH - chrono::Duration::nanoseconds(1),
        DateTime::<Utc>::UNIX_EPOCH - chrono::Duration::seconds(1),
        at("1999-12-31T23:59:59.9999995Z"),
        at("2000-01-01T00:00:00Z"),
        at("0001-01-01T00:00:00Z"),
        at("9999-12-31T23:59:59.999999999Z"),
        at("9999-12-31T23:00:00-05:00"),
        Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap(),
        Utc.with_ymd_and_hms(-4714, 11, 24, 0, 0, 0).unwrap(),
        Utc.with_ymd_and_hms(-4713, 11, 24, 0, 0, 0).unwrap(),
        Utc.with_ymd_and_hms(200_000, 12, 31, 23, 59, 59).unwrap(),
        DateTime::<Utc>::MIN_UTC,
        DateTime::<Utc>::MAX_UTC,
    ]
}

/// Whole hours before or after the run's start, never zero.
pub fn hours() -> impl Strategy<Value = i64> {
    prop_oneof![-48i64..0, 1i64..49]
}

/// A query's limit: small, at the integers' edges, or any.
pub fn limit() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => -2i64..5,
        1 => prop::sample::select(vec![i64::MIN, i64::MIN + 1, -1, 0, i64::from(i32::MAX), i64::MAX]),
        1 => any::<i64>(),
    ]
}

/// An effect's counter: small, at the edges, or any.
pub fn int32() -> impl Strategy<Value = i32> {
    prop_oneof![3 => 0i32..5, 1 => prop::sample::select(vec![i32::MIN, -1, i32::MAX]), 1 => any::<i32>()]
}

/// A delivery as a broker hands it out: identity attributes, body, the broker's times and count. The
/// pipeline resolves and checks it as for any message (a value it refuses never reaches a store).
#[derive(Clone, Debug)]
pub struct Msg {
    /// The consumer it is delivered to.
    pub consumer: &'static str,
    /// `ce-id`.
    pub id: String,
    /// `ce-source`.
    pub source: String,
    /// `ce-type`.
    pub event_type: Option<String>,
    /// `ce-tenantid`.
    pub tenant: Option<String>,
    /// `ce-businesskey`.
    pub business_key: Option<String>,
    /// `ce-contractversion`.
    pub contract: Option<String>,
    /// `ce-time`.
    pub event_time: Option<String>,
    /// The payload.
    pub body: &'static str,
    /// When the broker handed it out.
    pub received_at: DateTime<Utc>,
    /// When the broker took it.
    pub enqueued_at: Option<DateTime<Utc>>,
    /// How long the pipeline keeps its marker.
    pub keep: Duration,
    /// The broker's delivery count.
    pub delivery_count: u32,
}

/// A [`Msg`], kept by the pipeline for `keep`.
pub fn msg<V: Values>(keep: impl Strategy<Value = Duration>) -> impl Strategy<Value = Msg> {
    (
        (
            prop::sample::select(vec!["c", "d"]),
            field::<V>(IDS),
            field::<V>(&["s", "x y"]),
            opt_field::<V>(&["t"]),
            opt_field::<V>(&["acme", ""]),
            opt_field::<V>(&["k1", "k2"]),
            opt_field::<V>(&["v1"]),
        ),
        (
            prop_oneof![
                Just(None),
                V::time().prop_map(|t| Some(t.to_rfc3339())),
                opt_text::<V>()
            ],
            prop::sample::select(vec!["{\"v\":1}", "{\"v\":2}"]),
            V::time(),
            prop::option::of(V::time()),
            keep,
            prop_oneof![3 => 1u32..4, 1 => prop::sample::select(vec![0, i32::MAX as u32, i32::MAX as u32 + 1, u32::MAX])],
        ),
    )
        .prop_map(
            |(
                (consumer, id, source, event_type, tenant, business_key, contract),
                (event_time, body, received_at, enqueued_at, keep, delivery_count),
            )| Msg {
                consumer,
                id,
                source,
                event_type,
                tenant,
                business_key,
                contract,
                event_time,
                body,
                received_at,
                enqueued_at,
                keep,
                delivery_count,
            },
        )
}

/// The message a broker hands out for `m`.
pub fn received(m: &Msg) -> ReceivedMessage {
    let mut r = ReceivedMessage::new(m.body.as_bytes().to_vec());
    r.attributes.insert("ce-id".into(), m.id.clone());
    r.attributes.insert("ce-source".into(), m.source.clone());
    for (k, v) in [
        ("ce-type", &m.event_type),
        ("ce-tenantid", &m.tenant),
        ("ce-businesskey", &m.business_key),
        ("ce-contractversion", &m.contract),
        ("ce-time", &m.event_time),
    ] {
        if let Some(v) = v {
            r.attributes.insert(k.into(), v.clone());
        }
    }
    r.received_at = m.received_at;
    r.enqueued_at = m.enqueued_at;
    r.delivery_count = m.delivery_count;
    r
}

/// An effect a handler records (the pipeline dead-letters a message with one it refuses).
#[derive(Clone, Debug)]
pub struct Fx {
    /// Its name within the message.
    pub name: String,
    /// Where it goes.
    pub destination: String,
    /// What it sends.
    pub payload: Vec<u8>,
    /// Its metadata, in order.
    pub metadata: Vec<(String, String)>,
    /// Its external reference.
    pub external_ref: Option<String>,
    /// Its group.
    pub group: Option<String>,
}

/// An [`Fx`] with a payload of `payload`; one over 1000 bytes comes without metadata (the rest of a store's
/// item stays small).
pub fn fx<V: Values>(payload: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Fx> {
    (
        field::<V>(&["a", "b", "c"]),
        field::<V>(&["d1", "d2"]),
        payload,
        prop::collection::vec((V::text(), V::text()), 0..3),
        opt_field::<V>(&["ref-1"]),
        opt_field::<V>(&["g"]),
    )
        .prop_map(
            |(name, destination, payload, metadata, external_ref, group)| {
                let metadata = if payload.len() > 1000 {
                    Vec::new()
                } else {
                    metadata
                };
                Fx {
                    name,
                    destination,
                    payload,
                    metadata,
                    external_ref,
                    group,
                }
            },
        )
}

/// What a handler answers: the result reference and the effects.
pub fn handled(result_reference: &Option<String>, effects: &[Fx]) -> Handled {
    let mut handled = match result_reference {
        Some(r) => Handled::reference(r),
        None => Handled::done(),
    };
    for f in effects {
        let mut e = Effect::new(&f.name, &f.destination, f.payload.clone());
        for (k, v) in &f.metadata {
            e = e.metadata(k, v);
        }
        if let Some(r) = &f.external_ref {
            e = e.external_ref(r);
        }
        if let Some(g) = &f.group {
            e = e.group(g);
        }
        handled = handled.effect(e);
    }
    handled
}

/// An effect's transition, with any values.
#[derive(Clone, Debug)]
pub enum Tr {
    /// Reference, attempts, reconciliations.
    Done(Option<String>, i32, i32),
    /// Next attempt, error, attempts, reconciliations, maybe happened.
    Retry(DateTime<Utc>, String, i32, i32, bool),
    /// Next attempt, error, attempts, reconciliations.
    Uncertain(DateTime<Utc>, String, i32, i32),
    /// Error, attempts.
    Failed(String, i32),
    /// Error, attempts, reconciliations.
    NeedsAttention(String, i32, i32),
}

/// A [`Tr`].
pub fn tr<V: Values>() -> impl Strategy<Value = Tr> {
    prop_oneof![
        2 => (opt_text::<V>(), int32(), int32()).prop_map(|(r, a, c)| Tr::Done(r, a, c)),
        1 => (V::time(), V::text(), int32(), int32(), any::<bool>()).prop_map(|(t, e, a, c, m)| Tr::Retry(t, e, a, c, m)),
        1 => (V::time(), V::text(), int32(), int32()).prop_map(|(t, e, a, c)| Tr::Uncertain(t, e, a, c)),
        1 => (V::text(), int32()).prop_map(|(e, a)| Tr::Failed(e, a)),
        1 => (V::text(), int32(), int32()).prop_map(|(e, a, c)| Tr::NeedsAttention(e, a, c)),
    ]
}

impl Tr {
    /// The store's transition.
    pub fn transition(&self) -> Transition {
        match self.clone() {
            Tr::Done(reference, attempts, reconciliations) => Transition::Done {
                reference,
                attempts,
                reconciliations,
            },
            Tr::Retry(next_at, error, attempts, reconciliations, maybe_happened) => {
                Transition::Retry {
                    next_at,
                    error,
                    attempts,
                    reconciliations,
                    maybe_happened,
                }
            }
            Tr::Uncertain(next_at, error, attempts, reconciliations) => Transition::Uncertain {
                next_at,
                error,
                attempts,
                reconciliations,
            },
            Tr::Failed(error, attempts) => Transition::Failed { error, attempts },
            Tr::NeedsAttention(error, attempts, reconciliations) => Transition::NeedsAttention {
                error,
                attempts,
                reconciliations,
            },
        }
    }
}

/// A consumer an operator asks about: one of the test's, or anything.
pub fn asked_consumer<V: Values>() -> impl Strategy<Value = String> {
    prop_oneof![3 => prop::sample::select(vec!["c", "d"]).prop_map(String::from), 1 => V::text()]
}

/// One of the maintenance's tables.
pub fn table() -> impl Strategy<Value = Table> {
    prop::sample::select(Table::ALL.to_vec())
}

// ---------------------------------------------------------------------------------------------------------
// Observable outcomes, as values comparable across stores.

/// A date as both stores keep it: years 1 to 9999, to the microsecond (rounded down); a time the pipeline
/// wrote as the hour it is in ([`wall_clock_masked`]).
pub fn kept(t: DateTime<Utc>) -> DateTime<Utc> {
    stored(wall_clock_masked(t))
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
    e.next_attempt_at = kept(e.next_attempt_at);
    e.claim_until = kept_opt(e.claim_until);
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

/// The effect counts, each as a line, sorted.
pub fn counts(v: Vec<EffectCount>) -> Vec<String> {
    let mut v: Vec<String> = v
        .into_iter()
        .map(|c| {
            format!(
                "{}|{}|{:?}|{}|{:?}|{}",
                c.consumer,
                c.destination,
                c.state,
                c.count,
                kept_opt(c.oldest),
                c.without_reference
            )
        })
        .collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------------------------------------
// Running the operations.

/// What one store remembers between steps: the effects' keys it was asked to record, and the last claim's
/// holder and keys.
#[derive(Default)]
pub struct Seen {
    /// The effects' keys the handlers were asked to record.
    pub keys: Vec<String>,
    /// The last claim's holder.
    pub holder: String,
    /// The last claim's keys.
    pub claimed: Vec<String>,
}

/// The id, in this store, of the effect `pick` designates among `keys`.
pub async fn picked<S: EffectStore>(store: &S, keys: &[String], pick: usize) -> Option<i64> {
    if keys.is_empty() {
        return None;
    }
    let key = &keys[pick % keys.len()];
    store.find_effect(key).await.ok().flatten().map(|e| e.id)
}

/// Delivers `msgs` through `inbox` to `handler`, as one batch or one by one, and answers their outcomes.
pub async fn process_all<S, T, H>(
    inbox: Inbox<S>,
    handler: H,
    msgs: Vec<ReceivedMessage>,
    batch: bool,
) -> Vec<txinbox_core::Outcome>
where
    S: InboxStore,
    T: Payload,
    H: Handler<S, T>,
{
    if batch {
        inbox
            .bind_handler(handler)
            .process_batch(
                msgs.into_iter().map(NoopDelivery).collect(),
                &CancellationToken::new(),
            )
            .await
    } else {
        let mut out = Vec::new();
        for m in msgs {
            out.push(inbox.process(NoopDelivery(m), &handler).await);
        }
        out
    }
}
