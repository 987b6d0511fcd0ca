//! SQLite and PostgreSQL give the same observable outcome for the same operations: a generated sequence of
//! deliveries through the pipeline (one by one or as a batch: markers, result references, effects, and the
//! rejections of collisions and business duplicates), markers written through the store's own insert with
//! any dates, effect claims, finishes and compensations, purges and operator queries (stats, show,
//! rejections, effect counts, table figures, an effect by its key), with hostile values (text with NUL,
//! control characters, U+FFFD, the last code points, empty and long strings; integers at their extremes,
//! negative limits; durations of zero and "for ever"; dates at the epoch, before it, at year 1, past year
//! 9999 and at the ends of chrono's range), run through each store's public API. Each step must give the
//! same `Ok`/`Err` (error kinds, not messages) and the same values read back: text as given, or with the
//! documented U+FFFD for a NUL; a date as both stores keep it (years 1 to 9999, to the microsecond); a
//! time the pipeline took from the wall clock as the hour it is in.
//!
//! PostgreSQL runs in a schema of its own for the run, dropped at the end; SQLite in memory, fresh for each
//! case. 64 cases by default; `TXINBOX_PROP_CASES` sets another number (a longer search by hand).
//! Below the property, a deterministic test of each disagreement it found that has no other home.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use txinbox_core::effects::{idempotency_key, Effect, EffectStore, Transition};
use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
use txinbox_core::{
    CancellationToken, ConsumerName, Handled, HandlerError, IdentityPolicy, Inbox, InboxStore,
    MarkerInsert, MarkerRow, Message, ReceivedMessage, RetentionPolicy,
};
use txinbox_store::ops::RejectionFilter;
use txinbox_store::{Backend, Store, StoreOptions};
use txinbox_testkit::NoopDelivery;

// ---------------------------------------------------------------------------------------------------------
// Generated values.

/// Text from outside: a few plain values (so that steps meet each other's rows), the empty string, short
/// strings of awkward characters, long strings, and anything.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec!["a", "b", "evt-1", "x y"]).prop_map(String::from),
        1 => Just(String::new()),
        2 => prop::collection::vec(
            prop::sample::select(vec![
                'a', '\0', '\u{1}', '\t', '\u{1f}', '\u{7f}', '\u{85}', '\u{fffd}', '\u{ffff}',
                '\u{fffe}', '\u{10ffff}', '\u{2028}', 'é', '\\', '\'', '"', '%', '_',
            ]),
            1..8,
        )
        .prop_map(|v| v.into_iter().collect()),
        1 => (1usize..4000, prop::sample::select(vec!["x", "é", "\u{10ffff}", "\0"]))
            .prop_map(|(n, s)| s.repeat(n)),
        1 => any::<String>(),
    ]
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    prop_oneof![2 => Just(None), 3 => text().prop_map(Some)]
}

/// A name or id a message or a handler gives: mostly one of a few plain ones (so that most deliveries are
/// applied and meet each other), sometimes any [`text`].
fn field(plain: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(plain).prop_map(String::from),
        1 => text(),
    ]
}

fn opt_field(plain: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
    prop_oneof![3 => Just(None), 2 => field(plain).prop_map(Some)]
}

const IDS: &[&str] = &["a", "b", "evt-1"];

/// A date near the run's base (so that claims are due and purges meet rows) or at an edge.
fn time() -> impl Strategy<Value = DateTime<Utc>> {
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
fn base() -> DateTime<Utc> {
    static BASE: std::sync::OnceLock<DateTime<Utc>> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let now = Utc::now() - chrono::Duration::minutes(10);
        now - chrono::Duration::nanoseconds(i64::from(now.timestamp_subsec_nanos()))
    })
}

/// A time the pipeline wrote (the run's wall clock, which differs between the two runs of a step), as the
/// whole hour after the base it is in; any other time as it is.
fn wall_clock_masked(t: DateTime<Utc>) -> DateTime<Utc> {
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

fn edges() -> Vec<DateTime<Utc>> {
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
fn hours() -> impl Strategy<Value = i64> {
    prop_oneof![-48i64..0, 1i64..49]
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        (0u64..100).prop_map(|h| Duration::from_secs(h * 3600)),
        Just(Duration::from_secs(u64::MAX)),
        Just(Duration::MAX),
        Just(Duration::from_secs(400 * 365 * 86_400 * 100)),
    ]
}

fn limit() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => -2i64..5,
        1 => prop::sample::select(vec![i64::MIN, i64::MIN + 1, -1, 0, i64::from(i32::MAX), i64::MAX]),
        1 => any::<i64>(),
    ]
}

fn int32() -> impl Strategy<Value = i32> {
    prop_oneof![3 => 0i32..5, 1 => prop::sample::select(vec![i32::MIN, -1, i32::MAX]), 1 => any::<i32>()]
}

/// A delivery as a broker hands it out: identity attributes, body, the broker's times and count. The
/// pipeline resolves and checks it as for any message (a value it refuses never reaches a store).
#[derive(Clone, Debug)]
struct Msg {
    consumer: &'static str,
    id: String,
    source: String,
    event_type: Option<String>,
    tenant: Option<String>,
    business_key: Option<String>,
    contract: Option<String>,
    event_time: Option<String>,
    body: &'static str,
    received_at: DateTime<Utc>,
    enqueued_at: Option<DateTime<Utc>>,
    keep: Duration,
    delivery_count: u32,
}

fn msg() -> impl Strategy<Value = Msg> {
    (
        (
            prop::sample::select(vec!["c", "d"]),
            field(IDS),
            field(&["s", "x y"]),
            opt_field(&["t"]),
            opt_field(&["acme", ""]),
            opt_field(&["k1", "k2"]),
            opt_field(&["v1"]),
        ),
        (
            prop_oneof![
                Just(None),
                time().prop_map(|t| Some(t.to_rfc3339())),
                opt_text()
            ],
            prop::sample::select(vec!["{\"v\":1}", "{\"v\":2}"]),
            time(),
            prop::option::of(time()),
            duration(),
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

/// An effect a handler records (the pipeline dead-letters a message with one it refuses).
#[derive(Clone, Debug)]
struct Fx {
    name: String,
    destination: String,
    payload: Vec<u8>,
    metadata: Vec<(String, String)>,
    external_ref: Option<String>,
    group: Option<String>,
}

fn fx() -> impl Strategy<Value = Fx> {
    (
        field(&["a", "b", "c"]),
        field(&["d1", "d2"]),
        prop::collection::vec(any::<u8>(), 0..16),
        prop::collection::vec((text(), text()), 0..3),
        opt_field(&["ref-1"]),
        opt_field(&["g"]),
    )
        .prop_map(
            |(name, destination, payload, metadata, external_ref, group)| Fx {
                name,
                destination,
                payload,
                metadata,
                external_ref,
                group,
            },
        )
}

#[derive(Clone, Debug)]
enum Tr {
    Done(Option<String>, i32, i32),
    Retry(DateTime<Utc>, String, i32, i32, bool),
    Uncertain(DateTime<Utc>, String, i32, i32),
    Failed(String, i32),
    NeedsAttention(String, i32, i32),
}

fn tr() -> impl Strategy<Value = Tr> {
    prop_oneof![
        2 => (opt_text(), int32(), int32()).prop_map(|(r, a, c)| Tr::Done(r, a, c)),
        1 => (time(), text(), int32(), int32(), any::<bool>()).prop_map(|(t, e, a, c, m)| Tr::Retry(t, e, a, c, m)),
        1 => (time(), text(), int32(), int32()).prop_map(|(t, e, a, c)| Tr::Uncertain(t, e, a, c)),
        1 => (text(), int32()).prop_map(|(e, a)| Tr::Failed(e, a)),
        1 => (text(), int32(), int32()).prop_map(|(e, a, c)| Tr::NeedsAttention(e, a, c)),
    ]
}

impl Tr {
    fn transition(&self) -> Transition {
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
fn asked_consumer() -> impl Strategy<Value = String> {
    prop_oneof![3 => prop::sample::select(vec!["c", "d"]).prop_map(String::from), 1 => text()]
}

fn table() -> impl Strategy<Value = Table> {
    prop::sample::select(Table::ALL.to_vec())
}

#[derive(Clone, Debug)]
enum Op {
    Deliver {
        msgs: Vec<Msg>,
        batch: bool,
        result_reference: Option<String>,
        effects: Vec<Fx>,
    },
    /// A marker written through the store's own API, with any dates.
    Mark {
        msg: Msg,
        processed_at: DateTime<Utc>,
        retention_until: DateTime<Utc>,
    },
    Claim {
        holder: String,
        destinations: Vec<String>,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: i64,
    },
    Finish {
        pick: usize,
        holder: Option<String>,
        tr: Tr,
        sent_hash: Option<String>,
        now: DateTime<Utc>,
    },
    Compensate {
        pick: usize,
        note: String,
        now: DateTime<Utc>,
    },
    Purge {
        table: Table,
        before: DateTime<Utc>,
        limit: i64,
    },
    PurgeDone {
        before: DateTime<Utc>,
        limit: i64,
    },
    Stats {
        consumer: Option<String>,
        now: DateTime<Utc>,
    },
    Show {
        consumer: String,
        message_id: String,
        source: Option<String>,
    },
    Rejections {
        consumer: Option<String>,
        kind: Option<String>,
        since: Option<DateTime<Utc>>,
        until: Option<DateTime<Utc>>,
        limit: i64,
    },
    EffectCounts,
    TableStats {
        table: Table,
        consumer: String,
    },
    FindEffect {
        pick: usize,
        key: Option<String>,
    },
    InboxRows {
        consumer: String,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (prop::collection::vec(msg(), 1..4), any::<bool>(), opt_text(), prop::collection::vec(fx(), 0..3))
            .prop_map(|(msgs, batch, result_reference, effects)| Op::Deliver { msgs, batch, result_reference, effects }),
        2 => (msg(), time(), time()).prop_map(|(msg, processed_at, retention_until)| Op::Mark { msg, processed_at, retention_until }),
        3 => (
            prop_oneof![3 => Just("runner".to_owned()), 1 => text()],
            prop_oneof![
                3 => Just(vec!["d1".to_owned(), "d2".to_owned()]),
                1 => prop::collection::vec(prop_oneof![Just("d1".to_owned()), text()], 0..3),
            ],
            time(),
            time(),
            limit(),
        )
            .prop_map(|(holder, destinations, now, until, limit)| Op::Claim { holder, destinations, now, until, limit }),
        3 => (any::<usize>(), prop_oneof![3 => Just(None), 1 => text().prop_map(Some)], tr(), opt_text(), time())
            .prop_map(|(pick, holder, tr, sent_hash, now)| Op::Finish { pick, holder, tr, sent_hash, now }),
        1 => (any::<usize>(), text(), time()).prop_map(|(pick, note, now)| Op::Compensate { pick, note, now }),
        1 => (table(), time(), limit()).prop_map(|(table, before, limit)| Op::Purge { table, before, limit }),
        1 => (time(), limit()).prop_map(|(before, limit)| Op::PurgeDone { before, limit }),
        1 => (prop::option::of(asked_consumer()), time()).prop_map(|(consumer, now)| Op::Stats { consumer, now }),
        1 => (asked_consumer(), text(), opt_text()).prop_map(|(consumer, message_id, source)| Op::Show { consumer, message_id, source }),
        1 => (
            prop::option::of(asked_consumer()),
            prop_oneof![Just(None), Just(Some("payload_collision".to_owned())), opt_text()],
            prop::option::of(time()),
            prop::option::of(time()),
            limit(),
        )
            .prop_map(|(consumer, kind, since, until, limit)| Op::Rejections { consumer, kind, since, until, limit }),
        1 => Just(Op::EffectCounts),
        1 => (table(), asked_consumer()).prop_map(|(table, consumer)| Op::TableStats { table, consumer }),
        1 => (any::<usize>(), opt_text()).prop_map(|(pick, key)| Op::FindEffect { pick, key }),
        1 => asked_consumer().prop_map(|consumer| Op::InboxRows { consumer }),
    ]
}

// ---------------------------------------------------------------------------------------------------------
// Observable outcomes, as values comparable across backends.

/// A date as both stores keep it: SQLite's range (years 1 to 9999), to the microsecond (rounded down); a
/// time the pipeline wrote as the hour it is in ([`wall_clock_masked`]).
fn kept(t: DateTime<Utc>) -> DateTime<Utc> {
    let t = wall_clock_masked(t);
    let first = Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap();
    let last = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap()
        + chrono::Duration::microseconds(999_999);
    let t = t.clamp(first, last);
    t - chrono::Duration::nanoseconds(i64::from(t.timestamp_subsec_nanos() % 1000))
}

fn kept_opt(t: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    t.map(kept)
}

/// An error's kind: the sqlx variant, and whether a retry may succeed.
fn kind(e: &sqlx::Error) -> String {
    let variant = match e {
        sqlx::Error::Database(_) => "database",
        sqlx::Error::Encode(_) => "encode",
        sqlx::Error::Decode(_) => "decode",
        sqlx::Error::ColumnDecode { .. } => "column decode",
        sqlx::Error::Protocol(_) => "protocol",
        sqlx::Error::RowNotFound => "row not found",
        sqlx::Error::TypeNotFound { .. } => "type not found",
        sqlx::Error::ColumnIndexOutOfBounds { .. } => "column index",
        sqlx::Error::ColumnNotFound(_) => "column not found",
        sqlx::Error::Io(_) => "io",
        sqlx::Error::PoolTimedOut => "pool timed out",
        sqlx::Error::PoolClosed => "pool closed",
        _ => "other",
    };
    format!("{variant} (transient: {})", txinbox_store::is_transient(e))
}

/// An outcome: `Ok` with the value's normalized debug text, or the error's kind. `detail` is the error
/// message, shown when the outcomes differ but not compared.
#[derive(Debug)]
struct Outcome {
    answer: Result<String, String>,
    // Read in a failure's message (the Debug output), never compared.
    #[allow(dead_code)]
    detail: String,
}

impl PartialEq for Outcome {
    fn eq(&self, other: &Self) -> bool {
        self.answer == other.answer
    }
}

fn outcome<T: std::fmt::Debug>(r: Result<T, sqlx::Error>) -> Outcome {
    match r {
        Ok(v) => Outcome {
            answer: Ok(format!("{v:?}")),
            detail: String::new(),
        },
        Err(e) => Outcome {
            answer: Err(kind(&e)),
            detail: e.to_string().chars().take(300).collect(),
        },
    }
}

fn claimed(e: &txinbox_core::effects::ClaimedEffect) -> String {
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
        kept(e.created_at),
        e.reference,
        e.maybe_happened,
        e.sent_hash
    )
}

fn stats(mut s: txinbox_store::ops::ConsumerStats) -> txinbox_store::ops::ConsumerStats {
    s.oldest_processed_at = kept_opt(s.oldest_processed_at);
    s.newest_processed_at = kept_opt(s.newest_processed_at);
    s.last_rejection_at = kept_opt(s.last_rejection_at);
    s.oldest_pending_effect_at = kept_opt(s.oldest_pending_effect_at);
    // The lag is measured from the oldest date kept.
    s.effect_lag_seconds = s.effect_lag_seconds.map(|_| 0.0);
    s
}

fn rejection(mut r: txinbox_store::ops::RejectionRow) -> txinbox_store::ops::RejectionRow {
    // Ids are each table's own sequence: a statement PostgreSQL refused may have used one.
    r.id = txinbox_store::ops::RejectionId::Number(0);
    r.recorded_at = kept(r.recorded_at);
    r
}

fn effect_view(mut e: txinbox_store::ops::EffectView) -> txinbox_store::ops::EffectView {
    e.id = 0;
    e.next_attempt_at = kept(e.next_attempt_at);
    e.claim_until = kept_opt(e.claim_until);
    e.created_at = kept(e.created_at);
    e.updated_at = kept(e.updated_at);
    e.finished_at = kept_opt(e.finished_at);
    e
}

fn story(mut s: txinbox_store::ops::MessageStory) -> txinbox_store::ops::MessageStory {
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

// ---------------------------------------------------------------------------------------------------------
// Running the operations.

/// The most batches a purge step runs (a batch purges at least one row; a case writes fewer rows).
const PURGE_BATCHES: usize = 200;

/// What one backend remembers between steps: the effects' keys it was asked to record, and the last
/// claim's holder and keys.
#[derive(Default)]
struct Seen {
    keys: Vec<String>,
    holder: String,
    claimed: Vec<String>,
}

/// The operator queries are inherent methods of each backend's store.
trait Ops {
    async fn stats(&self, c: Option<&str>, now: DateTime<Utc>) -> Outcome;
    async fn show(&self, c: &str, id: &str, source: Option<&str>) -> Outcome;
    async fn rejections(&self, f: &RejectionFilter) -> Outcome;
}

macro_rules! ops_for {
    ($db:ty) => {
        impl Ops for Store<$db> {
            async fn stats(&self, c: Option<&str>, now: DateTime<Utc>) -> Outcome {
                outcome(
                    self.consumer_stats(c, now)
                        .await
                        .map(|v| v.into_iter().map(stats).collect::<Vec<_>>()),
                )
            }
            async fn show(&self, c: &str, id: &str, source: Option<&str>) -> Outcome {
                outcome(self.message_story(c, id, source).await.map(story))
            }
            async fn rejections(&self, f: &RejectionFilter) -> Outcome {
                outcome(
                    Store::<$db>::rejections(self, f)
                        .await
                        .map(|v| v.into_iter().map(rejection).collect::<Vec<_>>()),
                )
            }
        }
    };
}
ops_for!(sqlx::Sqlite);
ops_for!(sqlx::Postgres);

fn received(m: &Msg) -> ReceivedMessage {
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

/// A delivery's outcome without what names the backend (a store error's text).
fn delivered(o: txinbox_core::Outcome) -> String {
    use txinbox_core::Outcome as O;
    match o {
        O::Retry { .. } => "retry".into(),
        O::DeadLettered { reason, .. } => format!("dead-lettered: {reason}"),
        other => format!("{other:?}"),
    }
}

async fn step<DB: Backend>(store: &Store<DB>, seen: &mut Seen, op: &Op) -> Outcome
where
    Store<DB>: Ops,
{
    match op {
        Op::Deliver {
            msgs,
            batch,
            result_reference,
            effects,
        } => {
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
            // One consumer for the whole call: the first message's.
            let first = &msgs[0];
            let policy = IdentityPolicy::new(ConsumerName::new(first.consumer).unwrap());
            let received: Vec<ReceivedMessage> = msgs.iter().map(received).collect();
            for r in &received {
                if let Ok(identity) = policy.resolve(r) {
                    for f in effects {
                        seen.keys.push(idempotency_key(&identity, &f.name));
                    }
                }
            }
            let inbox = Inbox::new(store.clone(), policy)
                .retention(RetentionPolicy::default().keep(first.keep));
            let handler = move |_tx: txinbox_store::Tx<DB>, _m: Message<serde_json::Value>| {
                let h = handled.clone();
                async move { Ok::<_, HandlerError>(h) }
            };
            let outcomes = if *batch {
                inbox
                    .bind_handler(handler)
                    .process_batch(
                        received.into_iter().map(NoopDelivery).collect(),
                        &CancellationToken::new(),
                    )
                    .await
            } else {
                let mut out = Vec::new();
                for r in received {
                    out.push(inbox.process(NoopDelivery(r), &handler).await);
                }
                out
            };
            outcome(Ok(outcomes.into_iter().map(delivered).collect::<Vec<_>>()))
        }
        Op::Mark {
            msg,
            processed_at,
            retention_until,
        } => {
            let policy = IdentityPolicy::new(ConsumerName::new(msg.consumer).unwrap());
            let Ok(identity) = policy.resolve(&received(msg)) else {
                return outcome(Ok("refused before the store"));
            };
            let row = MarkerRow::new(
                &identity,
                msg.body,
                msg.received_at,
                *processed_at,
                *retention_until,
                msg.delivery_count,
            );
            let r = async {
                let tx = store.begin().await?;
                let answer = match store.insert_marker(&tx, &row).await? {
                    MarkerInsert::Conflict(Some(mut h)) => {
                        h.processed_at = kept(h.processed_at);
                        MarkerInsert::Conflict(Some(h))
                    }
                    other => other,
                };
                store.commit(tx).await?;
                Ok(format!("{answer:?}"))
            }
            .await;
            outcome(r)
        }
        Op::Claim {
            holder,
            destinations,
            now,
            until,
            limit,
        } => {
            seen.holder = holder.clone();
            let r = store
                .claim_effects(holder, destinations, *now, *until, *limit)
                .await
                .inspect(|v| seen.claimed = v.iter().map(|e| e.key.clone()).collect())
                .map(|v| {
                    let mut v: Vec<String> = v.iter().map(claimed).collect();
                    v.sort();
                    v
                });
            outcome(r)
        }
        Op::Finish {
            pick,
            holder,
            tr,
            sent_hash,
            now,
        } => {
            // One of the last claim's effects, when it claimed any.
            let from = if seen.claimed.is_empty() {
                &seen.keys
            } else {
                &seen.claimed
            };
            let Some(id) = picked(store, from, *pick).await else {
                return outcome(Ok("no effect"));
            };
            let holder = holder.clone().unwrap_or_else(|| seen.holder.clone());
            let t = tr.transition();
            let cols = t.columns().sent_hash(sent_hash.as_deref());
            outcome(store.finish_effect(id, &holder, &cols, *now).await)
        }
        Op::Compensate { pick, note, now } => {
            let Some(id) = picked(store, &seen.keys, *pick).await else {
                return outcome(Ok("no effect"));
            };
            outcome(store.mark_compensated(id, note, *now).await)
        }
        // Which expired rows a batch smaller than their number purges is each database's choice: the
        // purge runs to its end, batch after batch, as the maintenance does; every batch's answer is kept.
        Op::Purge {
            table,
            before,
            limit,
        } => {
            let (mut consumers, mut batches) = (Vec::new(), 0);
            for _ in 0..PURGE_BATCHES {
                match store.purge_batch(*table, *before, *limit).await {
                    Ok(v) if v.is_empty() => break,
                    Ok(v) => {
                        consumers.extend(v);
                        batches += 1;
                    }
                    Err(e) => return outcome::<()>(Err(e)),
                }
            }
            consumers.sort();
            outcome(Ok((batches, consumers)))
        }
        Op::PurgeDone { before, limit } => {
            let mut all = Vec::new();
            for _ in 0..PURGE_BATCHES {
                match store.purge_done_effects(*before, *limit).await {
                    Ok(0) => break,
                    Ok(n) => all.push(n),
                    Err(e) => return outcome::<()>(Err(e)),
                }
            }
            outcome(Ok(all))
        }
        Op::Stats { consumer, now } => store.stats(consumer.as_deref(), *now).await,
        Op::Show {
            consumer,
            message_id,
            source,
        } => store.show(consumer, message_id, source.as_deref()).await,
        Op::Rejections {
            consumer,
            kind,
            since,
            until,
            limit,
        } => {
            let mut f = RejectionFilter::new().limit(*limit);
            if let Some(c) = consumer {
                f = f.consumer(c);
            }
            if let Some(k) = kind {
                f = f.kind(k);
            }
            if let Some(t) = since {
                f = f.since(*t);
            }
            if let Some(t) = until {
                f = f.until(*t);
            }
            store.rejections(&f).await
        }
        Op::EffectCounts => outcome(store.effect_counts().await.map(|v| {
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
        })),
        Op::TableStats { table, consumer } => outcome(
            store
                .table_stats(*table, consumer)
                .await
                .map(|(n, t)| (n, kept_opt(t))),
        ),
        Op::FindEffect { pick, key } => {
            let key = match key {
                Some(k) => k.clone(),
                None if seen.keys.is_empty() => return outcome(Ok("no effect")),
                None => seen.keys[pick % seen.keys.len()].clone(),
            };
            outcome(
                store
                    .find_effect(&key)
                    .await
                    .map(|e| e.as_ref().map(claimed)),
            )
        }
        Op::InboxRows { consumer } => outcome(store.inbox_rows(consumer).await),
    }
}

/// The id, in this store, of the effect `pick` designates among `keys`.
async fn picked<DB: Backend>(store: &Store<DB>, keys: &[String], pick: usize) -> Option<i64> {
    if keys.is_empty() {
        return None;
    }
    let key = &keys[pick % keys.len()];
    store.find_effect(key).await.ok().flatten().map(|e| e.id)
}

async fn run_case(pg: &Store<sqlx::Postgres>, ops: &[Op]) -> Result<(), TestCaseError> {
    sqlx::query("TRUNCATE txinbox_inbox, txinbox_rejections, txinbox_effects RESTART IDENTITY")
        .execute(pg.pool())
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let lite = Store::<sqlx::Sqlite>::connect("sqlite::memory:")
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let (mut seen_lite, mut seen_pg) = (Seen::default(), Seen::default());
    for (i, op) in ops.iter().enumerate() {
        let a = step(&lite, &mut seen_lite, op).await;
        let b = step(pg, &mut seen_pg, op).await;
        prop_assert_eq!(&a, &b, "step {} of {}: {:?}", i, ops.len(), op);
    }
    lite.close().await;
    Ok(())
}

#[test]
fn sqlite_and_postgres_agree_on_hostile_operations() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let schema = format!("t_prop_{}", uuid::Uuid::new_v4().simple());
    let pg = rt
        .block_on(Store::<sqlx::Postgres>::connect_with(
            &txinbox_testkit::pg_url(),
            StoreOptions::new().schema(&schema).max_connections(2),
        ))
        .unwrap_or_else(|e| panic!("PostgreSQL at TXINBOX_TEST_PG_URL is not reachable: {e}"));
    let cases = std::env::var("TXINBOX_PROP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..24), |ops| {
        rt.block_on(run_case(&pg, &ops))
    });
    rt.block_on(async {
        pg.close().await;
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&txinbox_testkit::pg_url())
            .await
            .unwrap();
        sqlx::Executor::execute(&mut c, format!("DROP SCHEMA \"{schema}\" CASCADE").as_str())
            .await
            .unwrap();
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------------------
// What the property found, one by one.

/// A broker's delivery count past `i32::MAX` is kept as `i32::MAX` (PostgreSQL's INTEGER column) on SQLite
/// too, where SQLite kept it whole: the same message showed two counts.
macro_rules! counted_past_i32 {
    ($store:expr) => {{
        use txinbox_core::{InboxStore, MarkerInsert, MarkerRow};
        let store = $store;
        let mut m = ReceivedMessage::new(b"{}".to_vec());
        m.attributes.insert("ce-id".into(), "m".into());
        m.attributes.insert("ce-source".into(), "s".into());
        let id = IdentityPolicy::new(ConsumerName::new("c").unwrap())
            .resolve(&m)
            .unwrap();
        let now = Utc::now();
        let row = MarkerRow::new(&id, "h", now, now, now, u32::MAX);
        let tx = store.begin().await.unwrap();
        assert_eq!(
            store.insert_marker(&tx, &row).await.unwrap(),
            MarkerInsert::Inserted
        );
        store.commit(tx).await.unwrap();
        let story = store.message_story("c", "m", None).await.unwrap();
        assert_eq!(story.markers.len(), 1);
        assert_eq!(story.markers[0].delivery_count, i64::from(i32::MAX));
    }};
}

#[tokio::test]
async fn a_delivery_count_past_i32_is_kept_as_i32_max_on_sqlite() {
    counted_past_i32!(txinbox_testkit::sqlite_store().await);
}

#[tokio::test]
async fn a_delivery_count_past_i32_is_kept_as_i32_max_on_postgres() {
    counted_past_i32!(txinbox_testkit::pg_store(2).await);
}

/// A batch whose first row is refused for a business key another message holds, and whose later row (the
/// same identity, without that key) goes in: the first row's holder is the other message, as one insert
/// after the other finds it, on PostgreSQL as on SQLite, where PostgreSQL's one statement read the holder
/// after the whole batch went in and named the later row (a plain duplicate).
macro_rules! batch_meeting_itself {
    ($store:expr) => {{
        use txinbox_core::{InboxStore, MarkerInsert, MarkerRow};
        let store = $store;
        let identity = |id: &str, key: Option<&str>| {
            let mut m = ReceivedMessage::new(b"{}".to_vec());
            m.attributes.insert("ce-id".into(), id.into());
            m.attributes.insert("ce-source".into(), "s".into());
            if let Some(k) = key {
                m.attributes.insert("ce-businesskey".into(), k.into());
            }
            IdentityPolicy::new(ConsumerName::new("c").unwrap())
                .resolve(&m)
                .unwrap()
        };
        let now = Utc::now();
        let (holder, keyed, plain) = (
            identity("a", Some("k")),
            identity("b", Some("k")),
            identity("b", None),
        );
        let tx = store.begin().await.unwrap();
        let row = MarkerRow::new(&holder, "h", now, now, now, 1);
        assert_eq!(
            store.insert_marker(&tx, &row).await.unwrap(),
            MarkerInsert::Inserted
        );
        store.commit(tx).await.unwrap();
        let tx = store.begin().await.unwrap();
        let rows = [
            MarkerRow::new(&keyed, "h", now, now, now, 1),
            MarkerRow::new(&plain, "h", now, now, now, 1),
        ];
        let answers = store.insert_markers(&tx, &rows).await.unwrap();
        store.commit(tx).await.unwrap();
        match &answers[..] {
            [MarkerInsert::Conflict(Some(h)), MarkerInsert::Inserted] => {
                assert!(!h.same_identity, "{h:?}");
                assert_eq!(h.message_id, "a");
            }
            other => panic!("{other:?}"),
        }
    }};
}

#[tokio::test]
async fn a_batch_row_refused_before_a_later_one_names_the_holder_it_met_on_sqlite() {
    batch_meeting_itself!(txinbox_testkit::sqlite_store().await);
}

#[tokio::test]
async fn a_batch_row_refused_before_a_later_one_names_the_holder_it_met_on_postgres() {
    batch_meeting_itself!(txinbox_testkit::pg_store(2).await);
}
