//! The generated values: text, dates, limits, messages, effects and their transitions.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use txinbox_core::effects::{Effect, Transition};
use txinbox_core::pipeline::identity::Identity;
use txinbox_core::runtime::maintenance::Table;
use txinbox_core::{ConsumerName, Handled, IdentityPolicy, MarkerRow, ReceivedMessage};

use super::*;

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

/// The identity the pipeline resolves for `m` (for its first consumer), when it takes it.
pub fn identity(m: &Msg) -> Option<Identity> {
    let consumer = ConsumerName::new(m.consumer).ok()?;
    IdentityPolicy::new(consumer).resolve(&received(m)).ok()
}

/// The marker a store's own insert writes for `msg`, with these dates.
pub fn marker_row<'a>(
    msg: &Msg,
    identity: &'a Identity,
    processed_at: DateTime<Utc>,
    retention_until: DateTime<Utc>,
) -> MarkerRow<'a> {
    MarkerRow::new(
        identity,
        msg.body,
        msg.received_at,
        processed_at,
        retention_until,
        msg.delivery_count,
    )
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
