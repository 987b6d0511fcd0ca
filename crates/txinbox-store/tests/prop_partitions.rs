//! PostgreSQL's partitioned layout and its row-by-row layout give the same observable outcome for the same
//! generated operations, except where `docs/partitions.md` says the partitioned layout differs, and there
//! the property asserts the documented outcome.
//!
//! Each case converts a fresh schema to partitions of an hour (3 ahead, markers kept 6 hours; the inbox keeps
//! its markers 6 hours too) beside a fresh row-by-row schema, both dropped at the end, and draws a few events
//! (an id, a source, a business key, an event time near the partitions' boundaries: at a bucket's start, a
//! second or a nanosecond before its end, in the middle; or none, or not RFC 3339). Some cases deliver a
//! few copies before the conversion, whose markers stay in the frozen row-by-row table. The operations:
//!
//! * deliveries of copies of those events through the pipeline, one by one or as a batch (each layout drawing
//!   its own), with a result reference and effects: every copy carries its event's time written another way
//!   (another offset, fractions, lower case, spaces) and its own receive and enqueue times on either side of a
//!   boundary, so the partition key must be derived identically from every copy; a copy may carry another
//!   payload (a collision), and events may share a business key (a business duplicate);
//! * copies the layouts answer differently by design: the partitioned layout refuses a copy without an event
//!   time (`no_event_time`), one whose bucket was dropped (`retention_expired`) or lies past any partition
//!   the maintenance makes by now (`event_time_in_future`), and releases one whose partition the maintenance
//!   has not made yet (a maintenance behind); for these the property asserts that answer, and the
//!   row-by-row run gets the operation without those copies (nothing of them was written);
//! * a copy of an event, or another message with its business key, whose event time lies in another bucket
//!   (a re-send with another `time`): a new message there, as documented; the property asserts it is applied
//!   and takes what it wrote away again from both layouts, so that what follows compares again;
//! * effect claims, finishes and compensations; a maintenance pass (the rotation, and the purges that are the
//!   rotation's on partitions); the operator queries (stats, show, rejections, effect counts, table figures,
//!   an effect by its key, the inbox's rows);
//! * at the end, retention: the partitioned layout drops partitions at a time ahead of now and the row-by-row
//!   one purges rows; a copy of every event then gets the same answer from both while both keep its marker,
//!   `retention_expired` from the partitioned layout when its bucket went, and the answer it had before from
//!   the partitioned layout while that keeps a marker the row-by-row purge took.
//!
//! Each step compares `Ok`/`Err` (error kinds) and the values read back; a time the pipeline took from the
//! wall clock is read as such. 12 cases by default; `TXINBOX_PROP_CASES` sets another number (a longer search
//! by hand). Below the property, a deterministic test of each disagreement it found.

use std::time::Duration;

use chrono::{DateTime, FixedOffset, TimeZone, Utc};
use futures::FutureExt;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use txinbox_core::effects::{idempotency_key, Effect, EffectStore, Transition};
use txinbox_core::runtime::maintenance::{MaintenanceOptions, MaintenanceStore, Table};
use txinbox_core::{
    ConsumerName, Handled, HandlerError, IdentityPolicy, Inbox, Message, ReceivedMessage,
    RetentionPolicy,
};
use txinbox_store::ops::RejectionFilter;
use txinbox_store::{PartitionOptions, Store, StoreOptions};
use txinbox_testkit::prop::{claimed_as, counts_as, delivered, picked, process_all, Outcome};

type Pg = Store<sqlx::Postgres>;

/// One partition's width (an hour), the partitions made ahead, and how long markers are kept (by both the
/// layout and the inbox).
const WIDTH: i64 = 3600;
const AHEAD: u32 = 3;
const KEEP_HOURS: i64 = 6;

fn keep() -> Duration {
    Duration::from_secs(KEEP_HOURS as u64 * 3600)
}

fn hours(h: i64) -> chrono::Duration {
    chrono::Duration::hours(h)
}

/// The start of the hour bucket of `t`.
fn bucket(t: DateTime<Utc>) -> DateTime<Utc> {
    Utc.timestamp_opt(t.timestamp().div_euclid(WIDTH) * WIDTH, 0)
        .unwrap()
}

// ---------------------------------------------------------------------------------------------------------
// Generated values.

/// Where in its bucket a time lies.
#[derive(Clone, Copy, Debug)]
enum Off {
    Start,
    Second,
    Half,
    LastSecond,
    LastNano,
}

impl Off {
    fn at(self, bucket: DateTime<Utc>) -> DateTime<Utc> {
        bucket
            + match self {
                Off::Start => chrono::Duration::zero(),
                Off::Second => chrono::Duration::seconds(1),
                Off::Half => chrono::Duration::seconds(WIDTH / 2),
                Off::LastSecond => chrono::Duration::seconds(WIDTH - 1),
                Off::LastNano => chrono::Duration::nanoseconds(WIDTH * 1_000_000_000 - 1),
            }
    }
}

fn off() -> impl Strategy<Value = Off> {
    prop::sample::select(vec![
        Off::Start,
        Off::Second,
        Off::Half,
        Off::LastSecond,
        Off::LastNano,
    ])
}

/// An event's CloudEvents `time`: none, a text that is not RFC 3339, or a time in the bucket `k` buckets
/// from the conversion's (the layout keeps 6 back, makes 3 ahead, refuses past those).
#[derive(Clone, Debug)]
enum When {
    None,
    Bad(&'static str),
    At(i64, Off),
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        1 => Just(When::None),
        1 => prop::sample::select(vec!["yesterday", "2026-13-01T00:00:00Z", "", "1700000000"]).prop_map(When::Bad),
        10 => (-8i64..=6, off()).prop_map(|(k, o)| When::At(k, o)),
    ]
}

/// An event a producer sends, possibly more than once.
#[derive(Clone, Debug)]
struct Event {
    id: &'static str,
    source: &'static str,
    tenant: Option<&'static str>,
    key: Option<&'static str>,
    event_type: Option<&'static str>,
    when: When,
}

fn event() -> impl Strategy<Value = Event> {
    (
        prop::sample::select(vec!["a", "b", "evt-1", "x y"]),
        prop::sample::select(vec!["s", "crm"]),
        prop::option::of(prop::sample::select(vec!["acme", ""])),
        prop::option::of(prop::sample::select(vec!["k1", "k2"])),
        prop::option::of(Just("t")),
        when(),
    )
        .prop_map(|(id, source, tenant, key, event_type, when)| Event {
            id,
            source,
            tenant,
            key,
            event_type,
            when,
        })
}

/// The events of a case, such that messages the row-by-row layout sees as one (one identity) or as business
/// duplicates (one business key) lie in one bucket, as the copies of one message do: a business key over
/// several buckets is a documented difference, exercised by [`Op::Resend`].
fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec(event(), 1..5).prop_map(|mut v| {
        for i in 0..v.len() {
            let (before, rest) = v.split_at_mut(i);
            let e = &mut rest[0];
            let When::At(k, o) = e.when else { continue };
            let mut k = k;
            if let Some(j) = before
                .iter()
                .find(|j| j.id == e.id && j.source == e.source && matches!(j.when, When::At(..)))
            {
                if let When::At(jk, _) = j.when {
                    k = jk;
                }
            } else if let Some(j) = before.iter().find(|j| {
                e.key.is_some()
                    && j.key == e.key
                    && j.tenant.unwrap_or("") == e.tenant.unwrap_or("")
                    && matches!(j.when, When::At(..))
            }) {
                if let When::At(jk, _) = j.when {
                    k = jk;
                }
            }
            e.when = When::At(k, o);
            if before.iter().any(|j| {
                e.key.is_some()
                    && j.key == e.key
                    && j.tenant.unwrap_or("") == e.tenant.unwrap_or("")
                    && matches!(j.when, When::At(jk, _) if jk != k)
            }) {
                e.key = None;
            }
        }
        v
    })
}

/// One copy of an event as a broker hands it out.
#[derive(Clone, Debug)]
struct Copy {
    event: usize,
    /// How the event's time is written in this copy.
    format: u8,
    /// Another payload under the same identity.
    collides: bool,
    /// Received in the bucket `.0` buckets from the conversion's.
    received: (i64, Off),
    /// Enqueued this long before it was received (hours; 7 is past the retention).
    enqueued: Option<i64>,
    delivery_count: u32,
}

fn copy() -> impl Strategy<Value = Copy> {
    (
        any::<usize>(),
        0u8..6,
        prop::bool::weighted(0.15),
        (-2i64..=2, off()),
        prop::option::of(prop::sample::select(vec![0i64, 1, 7])),
        1u32..4,
    )
        .prop_map(
            |(event, format, collides, received, enqueued, delivery_count)| Copy {
                event,
                format,
                collides,
                received,
                enqueued,
                delivery_count,
            },
        )
}

/// An effect a handler records.
#[derive(Clone, Debug)]
struct Fx {
    name: &'static str,
    destination: &'static str,
    payload: Vec<u8>,
    external_ref: Option<&'static str>,
    group: Option<&'static str>,
}

fn fx() -> impl Strategy<Value = Fx> {
    (
        prop::sample::select(vec!["a", "b", "c"]),
        prop::sample::select(vec!["d1", "d2"]),
        prop::collection::vec(any::<u8>(), 0..8),
        prop::option::of(Just("ref-1")),
        prop::option::of(Just("g")),
    )
        .prop_map(|(name, destination, payload, external_ref, group)| Fx {
            name,
            destination,
            payload,
            external_ref,
            group,
        })
}

#[derive(Clone, Debug)]
enum Tr {
    Done(Option<String>),
    Retry(i64, bool),
    Uncertain(i64),
    Failed,
    NeedsAttention,
}

fn tr() -> impl Strategy<Value = Tr> {
    prop_oneof![
        2 => prop::option::of(Just("r".to_owned())).prop_map(Tr::Done),
        1 => (rel_hours(), any::<bool>()).prop_map(|(h, m)| Tr::Retry(h, m)),
        1 => rel_hours().prop_map(Tr::Uncertain),
        1 => Just(Tr::Failed),
        1 => Just(Tr::NeedsAttention),
    ]
}

impl Tr {
    fn transition(&self, start: DateTime<Utc>) -> Transition {
        match self.clone() {
            Tr::Done(reference) => Transition::Done {
                reference,
                attempts: 1,
                reconciliations: 0,
            },
            Tr::Retry(h, maybe_happened) => Transition::Retry {
                next_at: start + hours(h),
                error: "e".into(),
                attempts: 1,
                reconciliations: 0,
                maybe_happened,
            },
            Tr::Uncertain(h) => Transition::Uncertain {
                next_at: start + hours(h),
                error: "u".into(),
                attempts: 1,
                reconciliations: 1,
            },
            Tr::Failed => Transition::Failed {
                error: "f".into(),
                attempts: 2,
            },
            Tr::NeedsAttention => Transition::NeedsAttention {
                error: "n".into(),
                attempts: 2,
                reconciliations: 1,
            },
        }
    }
}

/// Whole hours from the case's start, never zero: before or after every time the pipeline writes.
fn rel_hours() -> impl Strategy<Value = i64> {
    prop_oneof![-30i64..0, 1i64..30]
}

fn consumer() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["c", "d"])
}

#[derive(Clone, Debug)]
enum Op {
    Deliver {
        consumer: &'static str,
        copies: Vec<Copy>,
        /// As one batch on the partitioned layout.
        batch: bool,
        /// As one batch on the row-by-row layout: drawn apart from `batch`, since either layout's batch
        /// decides as its deliveries one after the other would.
        row_batch: bool,
        reference: Option<String>,
        effects: Vec<Fx>,
    },
    /// A copy of an event (or, `same_id` false, another message with its business key) whose event time is
    /// `shift` buckets from the event's.
    Resend {
        consumer: &'static str,
        event: usize,
        same_id: bool,
        shift: i64,
        reference: Option<String>,
    },
    /// The maintenance behind: the layout's partitions end `.0` buckets after the conversion's, as a store
    /// reads them.
    Behind(i64),
    /// A maintenance pass now.
    Maintain,
    Claim {
        destinations: Vec<String>,
        now: i64,
        limit: i64,
    },
    Finish {
        pick: usize,
        tr: Tr,
        now: i64,
    },
    Compensate {
        pick: usize,
        now: i64,
    },
    Stats {
        consumer: Option<&'static str>,
        now: i64,
    },
    Show {
        consumer: &'static str,
        event: usize,
        with_source: bool,
    },
    Rejections {
        consumer: Option<&'static str>,
        kind: Option<&'static str>,
        limit: i64,
    },
    EffectCounts,
    TableStats {
        table: Table,
        consumer: &'static str,
    },
    FindEffect {
        pick: usize,
    },
    InboxRows {
        consumer: &'static str,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (consumer(), prop::collection::vec(copy(), 1..5), (any::<bool>(), any::<bool>()), prop::option::of(prop::sample::select(vec!["ref-a".to_owned(), "ref-b".to_owned()])), prop::collection::vec(fx(), 0..3))
            .prop_map(|(consumer, copies, (batch, row_batch), reference, effects)| Op::Deliver { consumer, copies, batch, row_batch, reference, effects }),
        2 => (consumer(), any::<usize>(), any::<bool>(), prop::sample::select(vec![-2i64, -1, 1, 2]), prop::option::of(Just("ref-resent".to_owned())))
            .prop_map(|(consumer, event, same_id, shift, reference)| Op::Resend { consumer, event, same_id, shift, reference }),
        1 => (1i64..=3).prop_map(Op::Behind),
        1 => Just(Op::Maintain),
        3 => (
            prop_oneof![3 => Just(vec!["d1".to_owned(), "d2".to_owned()]), 1 => Just(vec!["d1".to_owned()])],
            prop::sample::select(vec![-1i64, 1, 3]),
            prop::sample::select(vec![1i64, 2, 100]),
        )
            .prop_map(|(destinations, now, limit)| Op::Claim { destinations, now, limit }),
        3 => (any::<usize>(), tr(), prop::sample::select(vec![-1i64, 1, 3]))
            .prop_map(|(pick, tr, now)| Op::Finish { pick, tr, now }),
        1 => (any::<usize>(), prop::sample::select(vec![-1i64, 1])).prop_map(|(pick, now)| Op::Compensate { pick, now }),
        1 => (prop::option::of(consumer()), prop::sample::select(vec![-1i64, 1, 3])).prop_map(|(consumer, now)| Op::Stats { consumer, now }),
        2 => (consumer(), any::<usize>(), any::<bool>()).prop_map(|(consumer, event, with_source)| Op::Show { consumer, event, with_source }),
        1 => (
            prop::option::of(consumer()),
            prop::option::of(prop::sample::select(vec!["payload_collision", "business_duplicate"])),
            prop::sample::select(vec![1i64, 100]),
        )
            .prop_map(|(consumer, kind, limit)| Op::Rejections { consumer, kind, limit }),
        1 => Just(Op::EffectCounts),
        1 => (prop::sample::select(Table::ALL.to_vec()), consumer()).prop_map(|(table, consumer)| Op::TableStats { table, consumer }),
        1 => any::<usize>().prop_map(|pick| Op::FindEffect { pick }),
        1 => consumer().prop_map(|consumer| Op::InboxRows { consumer }),
    ]
}

/// A case: the events, whether the maintenance starts behind, the operations, and how far ahead of now the
/// final retention runs (hours: before or after the markers' 6 hours).
#[derive(Clone, Debug)]
struct Case {
    events: Vec<Event>,
    /// Deliveries before the conversion, whose markers stay in the frozen row-by-row table.
    before: Vec<Op>,
    behind: Option<i64>,
    ops: Vec<Op>,
    retention_at: i64,
}

fn case() -> impl Strategy<Value = Case> {
    let delivery = op().prop_filter("a delivery", |o| matches!(o, Op::Deliver { .. }));
    (
        events(),
        prop_oneof![2 => Just(Vec::new()), 1 => prop::collection::vec(delivery, 1..3)],
        prop::option::of(1i64..=3),
        prop::collection::vec(op(), 1..20),
        prop::sample::select(vec![0i64, 2, 9, 14]),
    )
        .prop_map(|(events, before, behind, ops, retention_at)| Case {
            events,
            before,
            behind,
            ops,
            retention_at,
        })
}

// ---------------------------------------------------------------------------------------------------------
// Observable outcomes.

/// What one case knows: the conversion's bucket, when the case started, the effects' keys the handlers were
/// asked to record and the last claim's keys.
struct World {
    s0: DateTime<Utc>,
    start: DateTime<Utc>,
    keys: Vec<String>,
    claimed: Vec<String>,
}

impl World {
    /// A time read back: one the pipeline took from the wall clock during the case (or that plus the
    /// retention) as such, any other as it is.
    fn kept(&self, t: DateTime<Utc>) -> String {
        let (from, to) = (
            self.start - chrono::Duration::minutes(1),
            Utc::now() + chrono::Duration::minutes(1),
        );
        if (from..to).contains(&t) {
            "wall clock".into()
        } else if (from..to).contains(&(t - hours(KEEP_HOURS))) {
            "wall clock + keep".into()
        } else {
            t.to_rfc3339()
        }
    }

    fn kept_opt(&self, t: Option<DateTime<Utc>>) -> Option<String> {
        t.map(|t| self.kept(t))
    }

    /// A claim's end, or a due time a finish wrote: the database's clock plus the claim's length (the delay) on
    /// PostgreSQL, so two stores asked one after the other keep it a few microseconds apart. Within a day of the
    /// wall clock, its distance from it in whole minutes (the claims and delays here are whole hours); else as
    /// [`kept`](Self::kept).
    fn kept_claim_end(&self, t: Option<DateTime<Utc>>) -> Option<String> {
        t.map(|t| {
            let from_now = t - Utc::now();
            if from_now.num_hours().abs() < 24 {
                format!(
                    "wall clock {:+} min",
                    (from_now.num_seconds() as f64 / 60.0).round() as i64
                )
            } else {
                self.kept(t)
            }
        })
    }
}

fn kind(e: &sqlx::Error) -> String {
    let variant = match e {
        sqlx::Error::Database(d) => return format!("database {:?}", d.code()),
        sqlx::Error::Protocol(_) => "protocol",
        sqlx::Error::RowNotFound => "row not found",
        sqlx::Error::Decode(_) | sqlx::Error::ColumnDecode { .. } => "decode",
        _ => "other",
    };
    format!("{variant} (transient: {})", txinbox_store::is_transient(e))
}

fn outcome<T: std::fmt::Debug>(r: Result<T, sqlx::Error>) -> Outcome {
    match r {
        Ok(v) => Outcome::ok(format!("{v:?}")),
        Err(e) => Outcome::error(kind(&e), &e),
    }
}

/// The maintenance's calls answer the store's error: the database's, read as [`outcome`] reads it.
fn maintenance_outcome<T: std::fmt::Debug>(r: Result<T, txinbox_store::StoreError>) -> Outcome {
    outcome(r.map_err(|e| match e {
        txinbox_store::StoreError::Database(e) => e,
        other => {
            panic!("the maintenance answered a store error that is not the database's: {other}")
        }
    }))
}

fn claimed(w: &World, e: &txinbox_core::effects::ClaimedEffect) -> String {
    claimed_as(e, |t| w.kept(t))
}

fn stats(w: &World, s: &txinbox_store::ops::ConsumerStats) -> String {
    format!(
        "{}|{}|{:?}|{:?}|{}|{:?}|{:?}|{:?}|{:?}",
        s.consumer,
        s.inbox_rows,
        w.kept_opt(s.oldest_processed_at),
        w.kept_opt(s.newest_processed_at),
        s.rows_last_hour,
        s.rejections,
        w.kept_opt(s.last_rejection_at),
        s.effects,
        w.kept_opt(s.oldest_pending_effect_at),
    )
}

fn rejection(w: &World, r: &txinbox_store::ops::RejectionRow) -> String {
    format!(
        "{}|{}|{}|{}|{:?}|{}|{}|{}|{}",
        r.consumer,
        r.source,
        r.message_id,
        r.kind,
        r.business_key,
        r.payload_hash,
        r.conflicts_with,
        r.detail,
        w.kept(r.recorded_at)
    )
}

fn story(w: &World, s: &txinbox_store::ops::MessageStory) -> String {
    let mut markers: Vec<String> = s
        .markers
        .iter()
        .map(|m| {
            format!(
                "{}|{}|{}|{:?}|{:?}|{}|{:?}|{:?}|{}|{}|{:?}|{}|{}|{}",
                m.consumer,
                m.source,
                m.message_id,
                m.event_type,
                m.business_key,
                m.payload_hash,
                m.contract_version,
                m.tenant_id,
                w.kept(m.received_at),
                w.kept(m.processed_at),
                m.result_reference,
                w.kept(m.retention_until),
                m.id_origin,
                m.delivery_count
            )
        })
        .collect();
    markers.sort();
    let mut rejections: Vec<String> = s.rejections.iter().map(|r| rejection(w, r)).collect();
    rejections.sort();
    let mut effects: Vec<String> = s
        .effects
        .iter()
        .map(|e| {
            format!(
                "{}|{}|{}|{}|{:?}|{}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{}|{}|{:?}",
                e.key,
                e.name,
                e.destination,
                e.external_ref,
                e.group_key,
                e.state,
                e.attempts,
                e.reconciliations,
                w.kept_claim_end(Some(e.next_attempt_at))
                    .unwrap_or_default(),
                e.claimed_by,
                w.kept_claim_end(e.claim_until),
                e.reference,
                e.last_error,
                w.kept(e.created_at),
                w.kept(e.updated_at),
                w.kept_opt(e.finished_at),
            )
        })
        .collect();
    effects.sort();
    format!("{markers:?} {rejections:?} {effects:?}")
}

// ---------------------------------------------------------------------------------------------------------
// The partitioned layout's own answers (docs/partitions.md).

/// The range of buckets the partitioned store has partitions for, as it reads it.
#[derive(Clone, Copy, Debug)]
struct Range {
    low: DateTime<Utc>,
    high: DateTime<Utc>,
}

async fn range(p: &Pg) -> Range {
    let s = p
        .partition_status()
        .await
        .unwrap()
        .expect("the partitioned schema is partitioned");
    Range {
        low: s.low,
        high: s.high,
    }
}

/// What the partitioned layout answers a copy without writing, where it differs from the row-by-row layout:
/// `None` when the copy is decided as in the row-by-row layout (refused before any store, or placed in its
/// partition); else the outcomes the documentation gives, one per bucket the worker's clock was in during
/// the step (the horizon of `event_time_in_future` is counted from it).
fn own_answer(
    consumer: &str,
    msg: &ReceivedMessage,
    r: Range,
    clocks: &[DateTime<Utc>],
) -> Option<Vec<String>> {
    let policy = IdentityPolicy::new(ConsumerName::new(consumer).unwrap());
    let identity = policy.resolve(msg).ok()?;
    if let Some(enq) = msg.enqueued_at {
        if (msg.received_at - enq).to_std().unwrap_or_default() > keep() {
            return None;
        }
    }
    let Some(at) = identity.event_time else {
        return Some(vec!["dead-lettered: no_event_time".into()]);
    };
    let b = bucket(at);
    if b < r.low {
        return Some(vec!["dead-lettered: retention_expired".into()]);
    }
    if b < r.high {
        return None;
    }
    Some(
        clocks
            .iter()
            .map(|c| {
                if b >= bucket(*c) + chrono::Duration::seconds(WIDTH * (i64::from(AHEAD) + 1)) {
                    "dead-lettered: event_time_in_future".into()
                } else {
                    "retry".into()
                }
            })
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------------------
// Running the operations.

fn time_text(at: DateTime<Utc>, format: u8) -> String {
    use chrono::SecondsFormat::{AutoSi, Nanos};
    let secs = if at.timestamp_subsec_nanos() == 0 {
        AutoSi
    } else {
        Nanos
    };
    match format {
        0 => at.to_rfc3339_opts(secs, true),
        1 => at
            .with_timezone(&FixedOffset::east_opt(2 * 3600).unwrap())
            .to_rfc3339_opts(secs, false),
        2 => at
            .with_timezone(&FixedOffset::west_opt(5 * 3600 + 1800).unwrap())
            .to_rfc3339_opts(secs, false),
        3 => at.to_rfc3339_opts(Nanos, true).to_lowercase(),
        4 => format!(" {} ", at.to_rfc3339_opts(secs, false)),
        _ => at
            .with_timezone(&FixedOffset::east_opt(14 * 3600).unwrap())
            .to_rfc3339_opts(Nanos, false),
    }
}

/// The event time of `e` shifted by `shift` buckets, in the case whose conversion's bucket is `s0`.
fn event_time(s0: DateTime<Utc>, e: &Event, shift: i64, format: u8) -> Option<String> {
    match &e.when {
        When::None => None,
        When::Bad(s) => Some((*s).to_owned()),
        When::At(k, o) => Some(time_text(
            o.at(s0 + chrono::Duration::seconds(WIDTH * (k + shift))),
            format,
        )),
    }
}

#[allow(clippy::too_many_arguments)]
fn message(
    e: &Event,
    id: &str,
    time: Option<String>,
    body: &str,
    received_at: DateTime<Utc>,
    enqueued_at: Option<DateTime<Utc>>,
    delivery_count: u32,
) -> ReceivedMessage {
    let mut r = ReceivedMessage::new(body.as_bytes().to_vec());
    r.attributes.insert("ce-id".into(), id.to_owned());
    r.attributes.insert("ce-source".into(), e.source.to_owned());
    for (k, v) in [
        ("ce-type", e.event_type),
        ("ce-tenantid", e.tenant),
        ("ce-businesskey", e.key),
    ] {
        if let Some(v) = v {
            r.attributes.insert(k.into(), v.to_owned());
        }
    }
    if let Some(t) = time {
        r.attributes.insert("ce-time".into(), t);
    }
    r.received_at = received_at;
    r.enqueued_at = enqueued_at;
    r.delivery_count = delivery_count;
    r
}

fn copy_message(w: &World, events: &[Event], c: &Copy) -> ReceivedMessage {
    let e = &events[c.event % events.len()];
    let received = c
        .received
        .1
        .at(w.s0 + chrono::Duration::seconds(WIDTH * c.received.0));
    message(
        e,
        e.id,
        event_time(w.s0, e, 0, c.format),
        if c.collides { "{\"v\":2}" } else { "{\"v\":1}" },
        received,
        c.enqueued.map(|h| received - hours(h)),
        c.delivery_count,
    )
}

fn handled(reference: &Option<String>, effects: &[Fx]) -> Handled {
    let mut h = match reference {
        Some(r) => Handled::reference(r),
        None => Handled::done(),
    };
    for f in effects {
        let mut e = Effect::new(f.name, f.destination, f.payload.clone());
        if let Some(r) = f.external_ref {
            e = e.external_ref(r);
        }
        if let Some(g) = f.group {
            e = e.group(g);
        }
        h = h.effect(e);
    }
    h
}

/// Delivers `msgs` to `consumer` through the pipeline, as a batch or one by one.
async fn deliver(
    store: &Pg,
    consumer: &str,
    msgs: Vec<ReceivedMessage>,
    batch: bool,
    h: &Handled,
) -> Vec<String> {
    if msgs.is_empty() {
        return Vec::new();
    }
    let policy = IdentityPolicy::new(ConsumerName::new(consumer).unwrap());
    let inbox =
        Inbox::new(store.clone(), policy).retention(RetentionPolicy::default().keep(keep()));
    let h = h.clone();
    let handler = move |_tx: txinbox_store::Tx<sqlx::Postgres>, _m: Message<serde_json::Value>| {
        let h = h.clone();
        async move { Ok::<_, HandlerError>(h) }
    };
    let outcomes = process_all(inbox, handler, msgs, batch).await;
    outcomes.into_iter().map(delivered).collect()
}

/// Delivers `msgs` to both layouts: the partitioned store gets them all; where it gives its own documented
/// answer (see [`own_answer`]) that answer is checked and the row-by-row store does not get the copy; every
/// other copy must be answered alike.
async fn deliver_both(
    r: &Pg,
    p: &Pg,
    consumer: &str,
    msgs: Vec<ReceivedMessage>,
    (batch, row_batch): (bool, bool),
    h: &Handled,
) -> Result<Vec<String>, TestCaseError> {
    let layout = range(p).await;
    let before = Utc::now();
    let got_p = deliver(p, consumer, msgs.clone(), batch, h).await;
    let clocks = [before, Utc::now()];
    let own: Vec<Option<Vec<String>>> = msgs
        .iter()
        .map(|m| own_answer(consumer, m, layout, &clocks))
        .collect();
    let rest: Vec<ReceivedMessage> = msgs
        .iter()
        .zip(&own)
        .filter(|(_, o)| o.is_none())
        .map(|(m, _)| m.clone())
        .collect();
    let got_r = deliver(r, consumer, rest, row_batch, h).await;
    let mut got_r = got_r.into_iter();
    let mut out = Vec::new();
    for (i, (p_answer, own)) in got_p.into_iter().zip(own).enumerate() {
        match own {
            Some(expected) => prop_assert!(
                expected.contains(&p_answer),
                "copy {} of {}: the partitioned layout answered {:?}, documented {:?} (layout {:?})",
                i,
                msgs.len(),
                p_answer,
                expected,
                layout
            ),
            None => {
                let r_answer = got_r.next().unwrap_or_default();
                prop_assert_eq!(
                    &p_answer,
                    &r_answer,
                    "copy {} of {}: partitioned against row-by-row",
                    i,
                    msgs.len()
                );
            }
        }
        out.push(p_answer);
    }
    Ok(out)
}

async fn exec(pool: &sqlx::PgPool, sql: &str, binds: &[&str], at: Option<DateTime<Utc>>) {
    let mut q = sqlx::query(sql);
    for b in binds {
        q = q.bind(*b);
    }
    if let Some(t) = at {
        q = q.bind(t);
    }
    q.execute(pool).await.unwrap();
}

/// Whether the frozen row-by-row table of `p` holds a marker of `consumer` with this identity or `e`'s
/// business key.
async fn in_legacy(p: &Pg, consumer: &str, e: &Event, id: &str) -> bool {
    in_legacy_by(p, consumer, e, id, true).await
}

/// Whether the frozen row-by-row table of `p` holds a marker of `consumer` with this identity, or (`by_key`)
/// `e`'s business key.
async fn in_legacy_by(p: &Pg, consumer: &str, e: &Event, id: &str, by_key: bool) -> bool {
    let kept: bool = sqlx::query_scalar("SELECT to_regclass('txinbox_inbox_legacy') IS NOT NULL")
        .fetch_one(p.pool())
        .await
        .unwrap();
    kept && sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM txinbox_inbox_legacy WHERE consumer_name = $1 AND ((source = $2 AND message_id = $3) OR ($6 AND business_key = $4 AND COALESCE(tenant_id, '') = COALESCE($5, ''))))")
        .bind(consumer)
        .bind(e.source)
        .bind(id)
        .bind(e.key)
        .bind(e.tenant)
        .bind(by_key)
        .fetch_one(p.pool())
        .await
        .unwrap()
}

async fn max_rejection(store: &Pg) -> i64 {
    sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM txinbox_rejections")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// One operation on both layouts; `Err` when they disagree, or the partitioned layout does not give its
/// documented answer.
async fn step(
    w: &mut World,
    events: &[Event],
    r: &Pg,
    p: &Pg,
    op: &Op,
) -> Result<(), TestCaseError> {
    let at = |h: i64| w.start + hours(h);
    let (a, b) = match op {
        Op::Deliver {
            consumer,
            copies,
            batch,
            row_batch,
            reference,
            effects,
        } => {
            let msgs: Vec<ReceivedMessage> =
                copies.iter().map(|c| copy_message(w, events, c)).collect();
            let policy = IdentityPolicy::new(ConsumerName::new(*consumer).unwrap());
            for m in &msgs {
                if let Ok(identity) = policy.resolve(m) {
                    for f in effects {
                        w.keys.push(idempotency_key(&identity, f.name));
                    }
                }
            }
            let h = handled(reference, effects);
            deliver_both(r, p, consumer, msgs, (*batch, *row_batch), &h).await?;
            return Ok(());
        }
        Op::Resend {
            consumer,
            event,
            same_id,
            shift,
            reference,
        } => {
            let e = &events[event % events.len()];
            if !matches!(e.when, When::At(..)) || (!same_id && e.key.is_none()) {
                return Ok(());
            }
            let id = if *same_id { e.id } else { "other" };
            let now = Utc::now();
            let m = message(
                e,
                id,
                event_time(w.s0, e, *shift, 0),
                "{\"v\":1}",
                now,
                Some(now),
                1,
            );
            let layout = range(p).await;
            let h = handled(reference, &[]);
            let clock = Utc::now();
            let got_p = deliver(p, consumer, vec![m.clone()], false, &h).await;
            if let Some(expected) = own_answer(consumer, &m, layout, &[clock, Utc::now()]) {
                prop_assert!(
                    expected.contains(&got_p[0]),
                    "a re-send in another bucket: the partitioned layout answered {:?}, documented {:?}",
                    got_p[0],
                    expected
                );
                return Ok(());
            }
            if in_legacy(p, consumer, e, id).await {
                // A marker from before the conversion holds the identity or the business key: found in the
                // frozen table whatever the bucket, as documented, so both layouts refuse alike.
                let got_r = deliver(r, consumer, vec![m], false, &h).await;
                prop_assert_eq!(
                    &got_p,
                    &got_r,
                    "a re-send meeting a marker from before the conversion"
                );
                return Ok(());
            }
            // Documented: another bucket, another message; nothing of the event's marker is read or changed.
            prop_assert_eq!(
                &got_p[0],
                &format!(
                    "{:?}",
                    txinbox_core::Outcome::Applied {
                        result_reference: reference.clone()
                    }
                ),
                "a re-send in another bucket is a new message on the partitioned layout"
            );
            let evidence = max_rejection(r).await;
            let got_r = deliver(r, consumer, vec![m.clone()], false, &h).await;
            // What the re-send wrote is taken away again, so that the layouts compare from here on.
            let placed = bucket(
                DateTime::parse_from_rfc3339(m.attributes["ce-time"].trim())
                    .unwrap()
                    .with_timezone(&Utc),
            );
            exec(p.pool(), "DELETE FROM txinbox_inbox WHERE consumer_name = $1 AND source = $2 AND message_id = $3 AND origin_bucket = $4", &[consumer, e.source, id], Some(placed)).await;
            if got_r[0].starts_with("Applied") {
                exec(r.pool(), "DELETE FROM txinbox_inbox WHERE consumer_name = $1 AND source = $2 AND message_id = $3", &[consumer, e.source, id], None).await;
            }
            sqlx::query("DELETE FROM txinbox_rejections WHERE id > $1")
                .bind(evidence)
                .execute(r.pool())
                .await
                .unwrap();
            return Ok(());
        }
        Op::Behind(j) => {
            let high = w.s0 + chrono::Duration::seconds(WIDTH * j);
            sqlx::query(
                "UPDATE txinbox_partition_layout SET high = least(high, $1) WHERE tbl = 'txinbox_inbox'",
            )
            .bind(high)
            .execute(p.pool())
            .await
            .unwrap();
            prop_assert!(p.is_partitioned().await.unwrap());
            return Ok(());
        }
        Op::Maintain => {
            // Now, or the end of the conversion's hour when the clock passed it during the case: a partition
            // the conversion made goes only 7 hours after its end, so the pass drops nothing, as the
            // row-by-row purges delete nothing (every time the case wrote is within the retention).
            let now = Utc::now().min(w.s0 + chrono::Duration::seconds(WIDTH - 1));
            let opts = MaintenanceOptions::default();
            let (ra, pa) = (
                r.rotate_partitions(now, &opts).await,
                p.rotate_partitions(now, &opts).await,
            );
            prop_assert!(matches!(ra, Ok(None)), "{:?}", ra);
            prop_assert!(matches!(&pa, Ok(Some(x)) if !x.skipped), "{:?}", pa);
            let mut a = Vec::new();
            let mut b = Vec::new();
            for table in [Table::Markers, Table::Rejections] {
                a.push(maintenance_outcome(
                    r.purge_batch(table, now - hours(KEEP_HOURS), 1000).await,
                ));
                b.push(maintenance_outcome(
                    p.purge_batch(table, now - hours(KEEP_HOURS), 1000).await,
                ));
            }
            (a, b)
        }
        Op::Claim {
            destinations,
            now,
            limit,
        } => {
            let (now, until) = (at(*now), at(*now + 1));
            let a = r
                .claim_effects("runner", destinations, now, until, *limit)
                .await;
            let b = p
                .claim_effects("runner", destinations, now, until, *limit)
                .await;
            if let Ok(v) = &b {
                w.claimed = v.iter().map(|e| e.key.clone()).collect();
            }
            let show = |x: Result<Vec<txinbox_core::effects::ClaimedEffect>, sqlx::Error>| {
                outcome(x.map(|v| {
                    let mut v: Vec<String> = v.iter().map(|e| claimed(w, e)).collect();
                    v.sort();
                    v
                }))
            };
            (vec![show(a)], vec![show(b)])
        }
        Op::Finish { pick, tr, now } => {
            let from = if w.claimed.is_empty() {
                &w.keys
            } else {
                &w.claimed
            };
            let (ia, ib) = (picked(r, from, *pick).await, picked(p, from, *pick).await);
            prop_assert_eq!(ia.is_some(), ib.is_some());
            let (Some(ia), Some(ib)) = (ia, ib) else {
                return Ok(());
            };
            let t = tr.transition(w.start);
            let cols = t.columns();
            (
                vec![outcome(
                    r.finish_effect(ia, "runner", &cols, at(*now)).await,
                )],
                vec![outcome(
                    p.finish_effect(ib, "runner", &cols, at(*now)).await,
                )],
            )
        }
        Op::Compensate { pick, now } => {
            let (ia, ib) = (
                picked(r, &w.keys, *pick).await,
                picked(p, &w.keys, *pick).await,
            );
            prop_assert_eq!(ia.is_some(), ib.is_some());
            let (Some(ia), Some(ib)) = (ia, ib) else {
                return Ok(());
            };
            (
                vec![outcome(r.mark_compensated(ia, "undone", at(*now)).await)],
                vec![outcome(p.mark_compensated(ib, "undone", at(*now)).await)],
            )
        }
        Op::Stats { consumer, now } => {
            let q = |s: &Pg| {
                let s = s.clone();
                let now = at(*now);
                let c = *consumer;
                async move { s.consumer_stats(c, now).await }
            };
            let (a, b) = (q(r).await, q(p).await);
            let show = |x: Result<Vec<txinbox_store::ops::ConsumerStats>, sqlx::Error>| {
                outcome(x.map(|v| v.iter().map(|s| stats(w, s)).collect::<Vec<_>>()))
            };
            (vec![show(a)], vec![show(b)])
        }
        Op::Show {
            consumer,
            event,
            with_source,
        } => {
            let e = &events[event % events.len()];
            let source = with_source.then_some(e.source);
            let (a, b) = (
                r.message_story(consumer, e.id, source).await,
                p.message_story(consumer, e.id, source).await,
            );
            (
                vec![outcome(a.map(|s| story(w, &s)))],
                vec![outcome(b.map(|s| story(w, &s)))],
            )
        }
        Op::Rejections {
            consumer,
            kind,
            limit,
        } => {
            let mut f = RejectionFilter::new().limit(*limit);
            if let Some(c) = consumer {
                f = f.consumer(*c);
            }
            if let Some(k) = kind {
                f = f.kind(*k);
            }
            let show = |x: Result<Vec<txinbox_store::ops::RejectionRow>, sqlx::Error>| {
                outcome(x.map(|v| v.iter().map(|r| rejection(w, r)).collect::<Vec<_>>()))
            };
            (
                vec![show(r.rejections(&f).await)],
                vec![show(p.rejections(&f).await)],
            )
        }
        Op::EffectCounts => {
            let show = |x: Result<Vec<txinbox_core::effects::EffectCount>, sqlx::Error>| {
                outcome(x.map(|v| counts_as(v, |t| w.kept_opt(t))))
            };
            (
                vec![show(r.effect_counts().await)],
                vec![show(p.effect_counts().await)],
            )
        }
        Op::TableStats { table, consumer } => {
            let show = |x: Result<(i64, Option<DateTime<Utc>>), txinbox_store::StoreError>| {
                maintenance_outcome(x.map(|(n, t)| (n, w.kept_opt(t))))
            };
            (
                vec![show(r.table_stats(*table, consumer).await)],
                vec![show(p.table_stats(*table, consumer).await)],
            )
        }
        Op::FindEffect { pick } => {
            if w.keys.is_empty() {
                return Ok(());
            }
            let key = w.keys[pick % w.keys.len()].clone();
            let show = |x: Result<Option<txinbox_core::effects::ClaimedEffect>, sqlx::Error>| {
                outcome(x.map(|e| e.as_ref().map(|e| claimed(w, e))))
            };
            (
                vec![show(r.find_effect(&key).await)],
                vec![show(p.find_effect(&key).await)],
            )
        }
        Op::InboxRows { consumer } => (
            vec![outcome(r.inbox_rows(consumer).await)],
            vec![outcome(p.inbox_rows(consumer).await)],
        ),
    };
    prop_assert_eq!(a, b, "partitioned against row-by-row");
    Ok(())
}

/// The final retention, `ahead` hours from now: the partitioned layout drops partitions, the row-by-row one
/// purges rows. Before it every event is delivered to both (its marker in where the partitioned layout
/// places it). After it a copy of each gets: `retention_expired` from the partitioned layout once its
/// partition went; the same answer from both layouts while both keep its marker; and, from the partitioned
/// layout while it keeps a marker the row-by-row purge took, the answer the row-by-row layout gave a copy
/// just before its purge (a marker from before the conversion goes with the frozen table, once the last of
/// them expired, as the row-by-row purge takes it: the same answer from both again).
async fn retention(
    w: &World,
    events: &[Event],
    r: &Pg,
    p: &Pg,
    ahead: i64,
) -> Result<(), TestCaseError> {
    let h = handled(&Some("ref-kept".into()), &[]);
    let copy = |e: &Event| {
        let now = Utc::now();
        message(
            e,
            e.id,
            event_time(w.s0, e, 0, 0),
            "{\"v\":1}",
            now,
            Some(now),
            2,
        )
    };
    for e in events {
        deliver_both(r, p, "c", vec![copy(e)], (false, false), &h).await?;
    }
    // The row-by-row layout keeps a marker 6 hours past its write (all of this case's): a retention 9 or more
    // hours ahead takes them all, one 2 or fewer none.
    let rows_purged = ahead > KEEP_HOURS;
    // Markers from before the conversion: the frozen table goes once the last of them expires, as the
    // row-by-row purge takes them.
    let mut frozen = Vec::new();
    for e in events {
        frozen.push(in_legacy_by(p, "c", e, e.id, false).await);
    }
    let at = Utc::now() + hours(ahead);
    let rotated = p
        .rotate_partitions(at, &MaintenanceOptions::default())
        .await;
    prop_assert!(
        matches!(&rotated, Ok(Some(x)) if !x.skipped),
        "{:?}",
        rotated
    );
    let layout = range(p).await;
    // What the row-by-row layout answers, before its purge, a copy of each event the partitioned layout now
    // places (it gets no other, as in every step).
    let mut before = Vec::new();
    for e in events {
        let m = copy(e);
        before.push(
            if rows_purged && own_answer("c", &m, layout, &[Utc::now()]).is_none() {
                deliver(r, "c", vec![m], false, &h).await.remove(0)
            } else {
                String::new()
            },
        );
    }
    loop {
        let purged = r.purge_batch(Table::Markers, at, 1000).await.unwrap();
        if purged.is_empty() {
            break;
        }
    }
    for (i, e) in events.iter().enumerate() {
        let m = copy(e);
        let own = own_answer("c", &m, layout, &[Utc::now()]);
        if own.is_none() && rows_purged && !frozen[i] {
            // The partitioned layout still holds what the row-by-row purge took (the row-by-row layout applies
            // the copy again, as documented past its retention).
            let got = deliver(p, "c", vec![m], false, &h).await;
            prop_assert_eq!(
                &got[0],
                &before[i],
                "a copy within the partition's retention, against the row-by-row answer before its purge"
            );
        } else {
            deliver_both(r, p, "c", vec![m], (false, false), &h).await?;
        }
    }
    Ok(())
}

async fn connect(schema: &str) -> Pg {
    Store::<sqlx::Postgres>::connect_with(
        &txinbox_testkit::pg_url(),
        StoreOptions::new().schema(schema).max_connections(3),
    )
    .await
    .unwrap_or_else(|e| panic!("PostgreSQL at TXINBOX_TEST_PG_URL is not reachable: {e}"))
}

async fn drop_schemas(names: &[String]) {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&txinbox_testkit::pg_url())
        .await
        .unwrap();
    for n in names {
        sqlx::Executor::execute(
            &mut c,
            format!("DROP SCHEMA IF EXISTS \"{n}\" CASCADE").as_str(),
        )
        .await
        .unwrap();
    }
}

async fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let names = [format!("t_pr_{id}"), format!("t_pp_{id}")];
    let (r, p) = (connect(&names[0]).await, connect(&names[1]).await);
    let result = std::panic::AssertUnwindSafe(async {
        let mut w = World {
            s0: bucket(Utc::now()),
            start: Utc::now(),
            keys: Vec::new(),
            claimed: Vec::new(),
        };
        // Before the conversion both layouts are row-by-row: the same answers.
        for (i, op) in case.before.iter().enumerate() {
            let Op::Deliver {
                consumer,
                copies,
                batch,
                row_batch,
                reference,
                effects,
            } = op
            else {
                continue;
            };
            let msgs: Vec<ReceivedMessage> = copies
                .iter()
                .map(|c| copy_message(&w, &case.events, c))
                .collect();
            let h = handled(reference, effects);
            let policy = IdentityPolicy::new(ConsumerName::new(*consumer).unwrap());
            for m in &msgs {
                if let Ok(identity) = policy.resolve(m) {
                    for f in effects {
                        w.keys.push(idempotency_key(&identity, f.name));
                    }
                }
            }
            let a = deliver(&r, consumer, msgs.clone(), *row_batch, &h).await;
            let b = deliver(&p, consumer, msgs, *batch, &h).await;
            prop_assert_eq!(a, b, "before the conversion, delivery {}", i);
        }
        let _ = p
            .partition(
                &PartitionOptions::new()
                    .width(Duration::from_secs(WIDTH as u64))
                    .ahead(AHEAD)
                    .keep(keep()),
            )
            .await
            .unwrap();
        if let Some(j) = case.behind {
            step(&mut w, &case.events, &r, &p, &Op::Behind(j)).await?;
        }
        for (i, op) in case.ops.iter().enumerate() {
            step(&mut w, &case.events, &r, &p, op)
                .await
                .map_err(|e| TestCaseError::fail(format!("step {i}: {op:?}: {e}")))?;
        }
        retention(&w, &case.events, &r, &p, case.retention_at)
            .await
            .map_err(|e| TestCaseError::fail(format!("retention: {e}")))
    })
    .catch_unwind()
    .await
    .unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Err(TestCaseError::fail(format!("panicked: {why}")))
    });
    r.close().await;
    p.close().await;
    drop_schemas(&names).await;
    result
}

#[test]
fn the_partitioned_layout_agrees_with_the_row_by_row_layout() {
    // Fails loudly without PostgreSQL.
    let _ = txinbox_testkit::pg_url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cases = std::env::var("TXINBOX_PROP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(), |c| rt.block_on(run_case(&c)));
    if let Err(e) = result {
        panic!("{e}");
    }
}
