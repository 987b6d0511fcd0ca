//! The DynamoDB store (on DynamoDB Local) and the SQLite store (in memory) give the same observable outcome
//! for the same operations: a generated sequence of deliveries through the pipeline (one by one or as a
//! batch, each store drawing its own: a batch decides as its deliveries one after the other would; markers,
//! result references, effects, and the rejections of collisions and business duplicates),
//! markers written through the store's own insert with any dates, effect claims, finishes and compensations,
//! purges, and the operator queries the DynamoDB store answers (stats, show, rejections, effect counts,
//! table figures, an effect by its key), with hostile values (text with NUL, control characters, U+FFFD,
//! the last code points, empty and long strings; result references and effect payloads on both sides of
//! DynamoDB's 400 KB item; deliveries of 95 to 101 effects, around its 100 actions; operator keys past its
//! 2048-byte key; integers at their extremes; dates at the epoch, before it, at year 1, past year 9999 and
//! at the ends of chrono's range). Each step must give the same `Ok`/`Err` (error kinds, not messages) and
//! the same values read back: text as given, or with U+FFFD for a NUL (the SQL stores' documented form); a
//! date as both stores keep it (years 1 to 9999, to the microsecond); a time the pipeline took from the wall
//! clock as the hour it is in.
//!
//! Where the two stores are documented to differ, the property compares against the difference:
//!
//! * **Expiry is the clock's on DynamoDB** (`docs/dynamodb.md`, "Retention by TTL"): an item past its
//!   `expires_at` is absent from that second on, and the maintenance's purge deletes nothing. SQLite is
//!   therefore compared as the maintenance leaves it when it runs at the wall clock before every step
//!   (markers past `retention_until`, done effects finished more than `effects_keep` ago, evidence older than
//!   `rejections_keep`), and a generated purge must delete nothing on DynamoDB (`purge_batch` no row,
//!   `purge_done_effects` 0) and is not run on SQLite.
//! * **Conditions are checked at commit on DynamoDB** (`MarkerInsert::Inserted`: "or will be checked at
//!   commit"), so DynamoDB runs the handler of a copy whose marker is held, which SQLite never runs. That
//!   is no difference in the outcome: a delivery whose effects the pipeline refuses after the handler ran (a
//!   field empty, too long or with a control character; two of one name) is decided by the marker or
//!   business key that holds it on both (the pipeline asks the store, `InboxStore::holder_of`, before it
//!   dead-letters), and one without a holder is dead-lettered (`handler_permanent`) on both; a transaction
//!   DynamoDB refuses as a whole (over the service's limits, `DynamoError::Limit`) likewise (the store
//!   reads the holder after the refusal), where SQLite's handler fails for good in its place (a permanent
//!   error once its marker is placed). A marker inserted through the store's API answers at commit on
//!   DynamoDB, and that answer is compared with SQLite's insert.
//! * **Every operator query names its key on DynamoDB** (`docs/operations.md`): stats and rejections of one
//!   consumer (the rejections of every consumer are refused with `DynamoError::NeedsKey`), a message's story
//!   with its source, and with `--effect NAME` only the effects so named (by idempotency key).
//! * **Which of several effects due at the same instant a claim smaller than their number takes** is each
//!   store's choice (SQLite by row id, DynamoDB by the effect's hashed id): a claim whose limit would cut
//!   through such a tie claims to its end on both.
//!
//! Each case runs on a DynamoDB table of its own, created for it and deleted after it, and a fresh SQLite in
//! memory. 24 cases by default; `TXINBOX_PROP_CASES` sets another number (a longer search by hand).
//! DynamoDB Local's endpoint comes from `TXINBOX_DYNAMODB_ENDPOINT` (`scripts/dynamodb.sh`); the test fails
//! without it. Below the property, a deterministic test of each disagreement it found.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use txinbox_core::effects::{idempotency_key, Effect, EffectStore};
use txinbox_core::pipeline::identity::Identity;
use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
use txinbox_core::store::ops::MessageStory;
use txinbox_core::store::{Commit, MarkerInsert};
use txinbox_core::{
    CancellationToken, ConsumerName, Handled, HandlerError, IdentityPolicy, Inbox, InboxStore,
    MarkerRow, Message, ReceivedMessage, RetentionPolicy,
};
use txinbox_dynamodb::ops::RejectionFilter;
use txinbox_dynamodb::{
    DynamoError, DynamoOptions, DynamoStore, DynamoTx, EFFECT_FINISH_ROOM, MAX_ITEM_BYTES,
};
use txinbox_store::Store;
use txinbox_testkit::prop::{
    asked_consumer, counts, delivered_as, field, fx, handled, identity, kept, kept_opt, limit,
    marker_row, msg, opt_text, picked, process_all, received, rejection, stats, stored, table,
    time, tr, Fx, Msg, Outcome, Seen, Tr, Values, IDS,
};
use txinbox_testkit::NoopDelivery;

mod common;

type Lite = Store<sqlx::Sqlite>;

// ---------------------------------------------------------------------------------------------------------
// Generated values.

/// Text from outside: a few plain values (so that steps meet each other's rows), the empty string, short
/// strings of awkward characters, long strings (past DynamoDB's 2048-byte key), and anything.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec!["a", "b", "evt-1", "x y"]).prop_map(String::from),
        1 => Just(String::new()),
        2 => prop::collection::vec(
            prop::sample::select(vec![
                'a', '\0', '\u{1}', '\t', '\u{1f}', '\u{7f}', '\u{85}', '\u{fffd}', '\u{ffff}',
                '\u{fffe}', '\u{10ffff}', '\u{2028}', 'é', '\\', '\'', '"', '%', '_', '#', ':',
            ]),
            1..8,
        )
        .prop_map(|v| v.into_iter().collect()),
        1 => (1usize..4000, prop::sample::select(vec!["x", "é", "\u{10ffff}", "\0"]))
            .prop_map(|(n, s)| s.repeat(n)),
        1 => any::<String>(),
    ]
}

/// The test's values: [`text`], and the shared model's dates.
struct Hostile;

impl Values for Hostile {
    fn text() -> impl Strategy<Value = String> {
        text()
    }
}

/// A length on either side of DynamoDB's 400 KB item, with room for the rest of the item: well below
/// (the rest of the store's item fits beside it, and an effect's item leaves `EFFECT_FINISH_ROOM` for what
/// its finish writes: a reference of this test's longest text, a bounded error, a hash) or well above.
fn big_len() -> impl Strategy<Value = usize> {
    prop_oneof![360_000usize..390_000, 412_000usize..430_000]
}

/// Whether a value of `len` bytes makes the store's item exceed what DynamoDB takes (see [`big_len`]: no
/// length this test makes falls between 390,000 bytes and 400 KB less `EFFECT_FINISH_ROOM`, nor between that
/// and 412,000 bytes).
fn over_item(len: usize) -> bool {
    const _: () = assert!(390_000 < MAX_ITEM_BYTES - EFFECT_FINISH_ROOM - 1_000);
    len > 405_000
}

/// The pipeline's retention. Not zero: a marker that expires at the wall-clock second it is written is
/// absent from the next second on DynamoDB and from the next microsecond on the SQL stores (each exact to
/// its own unit), so whether a step a moment later meets it is a matter of timing.
fn keep() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (1u64..100).prop_map(|h| Duration::from_secs(h * 3600)),
        Just(Duration::from_secs(u64::MAX)),
        Just(Duration::MAX),
        Just(Duration::from_secs(400 * 365 * 86_400 * 100)),
    ]
}

/// An effect's payload: short, or (seldom) on either side of DynamoDB's 400 KB item.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        12 => prop::collection::vec(any::<u8>(), 0..16),
        1 => big_len().prop_map(|n| vec![0xa5u8; n]),
    ]
}

/// Around DynamoDB's 100 actions a transaction: `n` effects of distinct names, grouped or not (the group's
/// tail item is one more action). At exactly 99 with the group a business key alone decides whether a
/// delivery fits, so the deliveries of one operation may fall on both sides.
fn many_effects() -> impl Strategy<Value = Vec<Fx>> {
    (95usize..=101, any::<bool>()).prop_map(|(n, grouped)| {
        (0..n)
            .map(|i| Fx {
                name: format!("m{i}"),
                destination: if i % 2 == 0 { "d1" } else { "d2" }.to_owned(),
                payload: vec![i as u8],
                metadata: Vec::new(),
                external_ref: None,
                group: grouped.then(|| "g".to_owned()),
            })
            .collect()
    })
}

fn result_reference() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        12 => opt_text::<Hostile>(),
        1 => big_len().prop_map(|n| Some("r".repeat(n))),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Deliver {
        msgs: Vec<Msg>,
        /// As one batch on DynamoDB.
        batch: bool,
        /// As one batch on SQLite: drawn apart from `batch`, since either store's batch decides as its
        /// deliveries one after the other would.
        lite_batch: bool,
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
        consumer: String,
        now: DateTime<Utc>,
    },
    Show {
        consumer: String,
        message_id: String,
        source: String,
        names: Option<Vec<String>>,
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
}

/// An operation: deliveries most often, and the effects' claims and finishes nearly as often (a claim that
/// meets effects recorded, finished and compensated takes several steps).
impl Op {
    /// The step as SQLite takes it: a delivery as one batch or not as `lite_batch` says.
    fn on_lite(&self) -> Op {
        match self.clone() {
            Op::Deliver {
                msgs,
                lite_batch,
                result_reference,
                effects,
                ..
            } => Op::Deliver {
                msgs,
                batch: lite_batch,
                lite_batch,
                result_reference,
                effects,
            },
            other => other,
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (
            prop::collection::vec(msg::<Hostile>(keep()), 1..4),
            (any::<bool>(), any::<bool>()),
            result_reference(),
            prop_oneof![12 => prop::collection::vec(fx::<Hostile>(payload()), 0..3), 1 => many_effects()],
        )
            .prop_map(|(msgs, (batch, lite_batch), result_reference, effects)| Op::Deliver { msgs, batch, lite_batch, result_reference, effects }),
        2 => (msg::<Hostile>(keep()), time(), time()).prop_map(|(msg, processed_at, retention_until)| Op::Mark { msg, processed_at, retention_until }),
        6 => (
            prop_oneof![3 => Just("runner".to_owned()), 1 => text()],
            prop_oneof![
                3 => Just(vec!["d1".to_owned(), "d2".to_owned()]),
                1 => prop::collection::vec(prop_oneof![Just("d1".to_owned()), Just("d2".to_owned()), text()], 0..3),
            ],
            time(),
            time(),
            limit(),
        )
            .prop_map(|(holder, destinations, now, until, limit)| Op::Claim { holder, destinations, now, until, limit }),
        6 => (any::<usize>(), prop_oneof![3 => Just(None), 1 => text().prop_map(Some)], tr::<Hostile>(), opt_text::<Hostile>(), time())
            .prop_map(|(pick, holder, tr, sent_hash, now)| Op::Finish { pick, holder, tr, sent_hash, now }),
        2 => (any::<usize>(), text(), time()).prop_map(|(pick, note, now)| Op::Compensate { pick, note, now }),
        1 => (table(), time(), limit()).prop_map(|(table, before, limit)| Op::Purge { table, before, limit }),
        1 => (time(), limit()).prop_map(|(before, limit)| Op::PurgeDone { before, limit }),
        1 => (asked_consumer::<Hostile>(), time()).prop_map(|(consumer, now)| Op::Stats { consumer, now }),
        2 => (
            asked_consumer::<Hostile>(),
            field::<Hostile>(IDS),
            field::<Hostile>(&["s", "x y"]),
            prop::option::of(prop::collection::vec(field::<Hostile>(&["a", "b", "c"]), 0..3)),
        )
            .prop_map(|(consumer, message_id, source, names)| Op::Show { consumer, message_id, source, names }),
        1 => (
            prop_oneof![1 => Just(None), 4 => asked_consumer::<Hostile>().prop_map(Some)],
            prop_oneof![Just(None), Just(Some("payload_collision".to_owned())), Just(Some("business_duplicate".to_owned())), opt_text::<Hostile>()],
            prop::option::of(time()),
            prop::option::of(time()),
            limit(),
        )
            .prop_map(|(consumer, kind, since, until, limit)| Op::Rejections { consumer, kind, since, until, limit }),
        2 => Just(Op::EffectCounts),
        1 => (table(), asked_consumer::<Hostile>()).prop_map(|(table, consumer)| Op::TableStats { table, consumer }),
        1 => (any::<usize>(), opt_text::<Hostile>()).prop_map(|(pick, key)| Op::FindEffect { pick, key }),
    ]
}

// ---------------------------------------------------------------------------------------------------------
// Observable outcomes, as values comparable across stores.

/// A value's debug text with every NUL as U+FFFD (the SQL stores keep free text so; DynamoDB as given).
fn debug_text<T: std::fmt::Debug>(v: &T) -> String {
    nul_as_fffd(&format!("{v:?}"))
}

/// A debug text with every escaped NUL (`\0`) as U+FFFD.
fn nul_as_fffd(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('\u{fffd}'),
            Some(n) => {
                out.push('\\');
                out.push(n);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn ok<T: std::fmt::Debug>(v: T) -> Outcome {
    Outcome::ok(debug_text(&v))
}

fn lite_out<T: std::fmt::Debug>(r: Result<T, sqlx::Error>) -> Outcome {
    match r {
        Ok(v) => ok(v),
        Err(e) => Outcome::error(
            format!("error (transient: {})", txinbox_store::is_transient(&e)),
            &e,
        ),
    }
}

fn dyn_out<T: std::fmt::Debug>(r: Result<T, DynamoError>) -> Outcome {
    match r {
        Ok(v) => ok(v),
        Err(e) => Outcome::error(
            match &e {
                DynamoError::NeedsKey(_) => "needs a key".to_owned(),
                other => format!("error (transient: {})", other.is_transient()),
            },
            &e,
        ),
    }
}

fn claimed(e: &txinbox_core::effects::ClaimedEffect) -> String {
    nul_as_fffd(&txinbox_testkit::prop::claimed(e))
}

/// A message's story as [`txinbox_testkit::prop::story`] writes it, its rejections in the order of their
/// time and kind.
fn story(s: MessageStory) -> MessageStory {
    let mut s = txinbox_testkit::prop::story(s);
    s.rejections
        .sort_by(|a, b| (a.recorded_at, &a.kind).cmp(&(b.recorded_at, &b.kind)));
    s
}

// ---------------------------------------------------------------------------------------------------------
// Running the operations.

/// The store's keeps (DynamoDB's defaults), which the SQLite side's maintenance applies.
fn dynamo_options() -> DynamoOptions {
    DynamoOptions::default()
}

/// SQLite as the maintenance leaves it when it runs at the wall clock: DynamoDB's items are absent from
/// their `expires_at` on.
async fn expire(lite: &Lite) -> Result<(), sqlx::Error> {
    expire_at(lite, Utc::now()).await
}

/// SQLite as the maintenance leaves it when it runs at `now`.
async fn expire_at(lite: &Lite, now: DateTime<Utc>) -> Result<(), sqlx::Error> {
    let o = dynamo_options();
    for (table, before) in [
        (Table::Markers, now),
        (
            Table::Effects,
            txinbox_core::time::before(now, o.effects_keep),
        ),
        (
            Table::Rejections,
            txinbox_core::time::before(now, o.rejections_keep),
        ),
    ] {
        while !lite
            .purge_batch(table, before, 1000)
            .await
            .map_err(|e| match e {
                txinbox_store::StoreError::Database(e) => e,
                other => sqlx::Error::Protocol(other.to_string()),
            })?
            .is_empty()
        {}
    }
    Ok(())
}

/// A delivery's outcome without what names the store (a store error's text).
fn delivered(o: txinbox_core::Outcome) -> String {
    delivered_as(o, debug_text)
}

/// Whether DynamoDB refuses the delivery's transaction as a whole, before it is sent: over the service's
/// limits (more than 100 actions: the marker, the business key item, each effect and each group's tail
/// item; an item over 400 KB: the marker or the business key item with the result reference, an effect with
/// its payload). Such a delivery is decided by the marker it meets, as on SQLite; without one it is
/// dead-lettered (`handler_permanent`), which SQLite's handler answers for it.
fn over_limits(id: &Identity, result_reference: &Option<String>, effects: &[Fx]) -> bool {
    let groups: HashSet<&String> = effects.iter().filter_map(|f| f.group.as_ref()).collect();
    let actions = 1 + usize::from(id.business_key.is_some()) + effects.len() + groups.len();
    actions > txinbox_dynamodb::MAX_ACTIONS
        || result_reference
            .as_ref()
            .is_some_and(|r| over_item(r.len()))
        || effects.iter().any(|f| over_item(f.payload.len()))
}

/// The effects' keys of the deliveries the pipeline can resolve.
fn keys_of(msgs: &[Msg], effects: &[Fx]) -> Vec<String> {
    let mut keys = Vec::new();
    for m in msgs {
        let policy = IdentityPolicy::new(ConsumerName::new(msgs[0].consumer).unwrap());
        if let Ok(identity) = policy.resolve(&received(m)) {
            for f in effects {
                keys.push(idempotency_key(&identity, &f.name));
            }
        }
    }
    keys
}

/// The SQLite text of a time (the store's own form: `stored`, RFC 3339 with microseconds).
fn lite_ts(t: DateTime<Utc>) -> String {
    stored(t).to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The limit a claim runs with on both stores: the one asked, or, when it would cut through effects due at
/// the same instant (which each store orders its own way), the end of that tie. Read from SQLite's rows, due
/// by the host's clock, which decides on both stores (`EffectStore::claim_effects`), whatever the claim's `now`.
async fn claim_limit(lite: &Lite, destinations: &[String], limit: i64) -> Result<i64, sqlx::Error> {
    let dests = serde_json::to_string(destinations).unwrap();
    let due: Vec<(i64, String, String, String, Option<String>)> = sqlx::query_as("SELECT id, idempotency_key, state, next_attempt_at, claim_until FROM txinbox_effects e WHERE destination IN (SELECT value FROM json_each(?1)) AND ((state IN ('pending', 'uncertain') AND next_attempt_at <= ?2) OR (state = 'in_flight' AND claim_until < ?2)) AND (group_key IS NULL OR NOT EXISTS (SELECT 1 FROM txinbox_effects o WHERE o.consumer_name = e.consumer_name AND o.group_key = e.group_key AND o.id < e.id AND o.state NOT IN ('done', 'failed') AND o.state <> 'compensated')) ORDER BY next_attempt_at, id")
        .bind(dests)
        .bind(lite_ts(Utc::now()))
        .fetch_all(lite.pool())
        .await?;
    let wanted = limit.max(1);
    if wanted as usize >= due.len() {
        return Ok(limit);
    }
    // SQLite's order: by due time, then row id. DynamoDB's: by the time it fell due (an expired claim's
    // end for an effect in flight), then its hashed id, as the text of the `due` index's sort key.
    let lite_order: Vec<i64> = due.iter().map(|d| d.0).collect();
    let mut dyn_order: Vec<(String, i64)> = due
        .iter()
        .map(|(id, key, state, next_at, claim_until)| {
            let at = if state == "in_flight" {
                claim_until.clone().unwrap_or_default()
            } else {
                next_at.clone()
            };
            // The `due` index's sort key, compared as text.
            (
                format!("{at}#{}", txinbox_dynamodb::layout::effect_id(key)),
                *id,
            )
        })
        .collect();
    dyn_order.sort();
    let dyn_order: Vec<i64> = dyn_order.into_iter().map(|d| d.1).collect();
    let mut n = wanted as usize;
    while n < due.len() {
        let a: BTreeSet<i64> = lite_order[..n].iter().copied().collect();
        let b: BTreeSet<i64> = dyn_order[..n].iter().copied().collect();
        if a == b {
            break;
        }
        n += 1;
    }
    Ok(if n == wanted as usize {
        limit
    } else {
        n as i64
    })
}

fn masked_insert(answer: MarkerInsert) -> MarkerInsert {
    match answer {
        MarkerInsert::Conflict(Some(mut h)) => {
            h.processed_at = kept(h.processed_at);
            MarkerInsert::Conflict(Some(h))
        }
        other => other,
    }
}

/// The idempotency keys of the effects named `names` of one message, as `--effect NAME` asks for them.
fn named_keys(consumer: &str, source: &str, message_id: &str, names: &[String]) -> Vec<String> {
    let Ok(consumer) = ConsumerName::new(consumer) else {
        return Vec::new();
    };
    let identity = Identity {
        consumer,
        source: source.to_owned(),
        message_id: message_id.to_owned(),
        origin: txinbox_core::pipeline::identity::IdOrigin::ProducerId,
        event_type: None,
        contract_version: None,
        tenant_id: None,
        business_key: None,
        event_time: None,
    };
    names
        .iter()
        .map(|n| idempotency_key(&identity, n))
        .collect()
}

/// What the two stores answer each their own way: SQLite's expiry before every step, the handler its
/// deliveries run, an answer's error kind, and the operations whose arguments or documented answers differ
/// (a marker's insert, the purges, the operator queries).
trait Side: EffectStore + MaintenanceStore {
    /// An answer of this store as an outcome.
    fn out<T: std::fmt::Debug>(r: Result<T, <Self as EffectStore>::Error>) -> Outcome;

    /// An answer of this store's maintenance as an outcome.
    fn maintenance_out<T: std::fmt::Debug>(
        r: Result<T, <Self as MaintenanceStore>::Error>,
    ) -> Outcome;

    /// Before every step.
    async fn prepare(&self) -> Result<(), Outcome>;

    async fn deliver(
        &self,
        msgs: &[Msg],
        batch: bool,
        result_reference: &Option<String>,
        effects: &[Fx],
    ) -> Vec<String>;

    /// A marker through the store's own insert (DynamoDB's answered at commit).
    async fn mark(&self, row: &MarkerRow<'_>) -> Outcome;

    /// `Purge`, `PurgeDone`, `Stats`, `Show` and `Rejections`.
    async fn own(&self, op: &Op) -> Outcome;
}

/// One operation on one store. `claim` is the limit a claim runs with ([`claim_limit`], from SQLite's rows
/// before the step).
async fn step<S: Side>(store: &S, seen: &mut Seen, op: &Op, claim: i64) -> Outcome {
    if let Err(o) = store.prepare().await {
        return o;
    }
    match op {
        Op::Deliver {
            msgs,
            batch,
            result_reference,
            effects,
            ..
        } => {
            seen.keys.extend(keys_of(msgs, effects));
            ok(store.deliver(msgs, *batch, result_reference, effects).await)
        }
        Op::Mark {
            msg,
            processed_at,
            retention_until,
        } => {
            let Some(identity) = identity(msg) else {
                return ok("refused before the store");
            };
            store
                .mark(&marker_row(msg, &identity, *processed_at, *retention_until))
                .await
        }
        Op::Claim {
            holder,
            destinations,
            now,
            until,
            ..
        } => {
            seen.holder = holder.clone();
            let r = store
                .claim_effects(holder, destinations, *now, *until, claim)
                .await
                .inspect(|v| {
                    seen.claimed = v.iter().map(|e| e.key.clone()).collect();
                    seen.claimed.sort();
                })
                .map(|v| {
                    let mut v: Vec<String> = v.iter().map(claimed).collect();
                    v.sort();
                    v
                });
            S::out(r)
        }
        Op::Finish {
            pick,
            holder,
            tr,
            sent_hash,
            now,
        } => {
            let from = if seen.claimed.is_empty() {
                &seen.keys
            } else {
                &seen.claimed
            };
            let Some(id) = picked(store, from, *pick).await else {
                return ok("no effect");
            };
            let holder = holder.clone().unwrap_or_else(|| seen.holder.clone());
            let t = tr.transition();
            let cols = t.columns().sent_hash(sent_hash.as_deref());
            S::out(store.finish_effect(id, &holder, &cols, *now).await)
        }
        Op::Compensate { pick, note, now } => {
            let Some(id) = picked(store, &seen.keys, *pick).await else {
                return ok("no effect");
            };
            S::out(store.mark_compensated(id, note, *now).await)
        }
        Op::EffectCounts => S::out(store.effect_counts().await.map(counts)),
        Op::TableStats { table, consumer } => S::maintenance_out(
            store
                .table_stats(*table, consumer)
                .await
                .map(|(n, t)| (n, kept_opt(t))),
        ),
        Op::FindEffect { pick, key } => {
            let Some(key) = find_key(seen, *pick, key) else {
                return ok("no effect");
            };
            S::out(
                store
                    .find_effect(&key)
                    .await
                    .map(|e| e.as_ref().map(claimed)),
            )
        }
        own => store.own(own).await,
    }
}

impl Side for Lite {
    fn out<T: std::fmt::Debug>(r: Result<T, sqlx::Error>) -> Outcome {
        lite_out(r)
    }

    fn maintenance_out<T: std::fmt::Debug>(r: Result<T, txinbox_store::StoreError>) -> Outcome {
        match r {
            Err(txinbox_store::StoreError::Database(e)) => lite_out::<T>(Err(e)),
            Err(other) => Outcome::error("error (the store's own)".to_owned(), &other),
            Ok(v) => ok(v),
        }
    }

    async fn prepare(&self) -> Result<(), Outcome> {
        expire(self).await.map_err(|e| lite_out::<()>(Err(e)))
    }

    async fn deliver(
        &self,
        msgs: &[Msg],
        batch: bool,
        result_reference: &Option<String>,
        effects: &[Fx],
    ) -> Vec<String> {
        let first = &msgs[0];
        let policy = IdentityPolicy::new(ConsumerName::new(first.consumer).unwrap());
        let run: Vec<ReceivedMessage> = msgs.iter().map(received).collect();
        let inbox =
            Inbox::new(self.clone(), policy).retention(RetentionPolicy::default().keep(first.keep));
        let h = handled(result_reference, effects);
        let (reference, fx) = (result_reference.clone(), effects.to_vec());
        // A transaction DynamoDB refuses as a whole: the handler fails for good, once the marker is placed.
        let handler = move |_tx: txinbox_store::Tx<sqlx::Sqlite>, m: Message<serde_json::Value>| {
            let h = h.clone();
            let refused = over_limits(&m.identity, &reference, &fx);
            async move {
                if refused {
                    return Err(HandlerError::permanent(std::io::Error::other(
                        "over DynamoDB's limits",
                    )));
                }
                Ok::<_, HandlerError>(h)
            }
        };
        let outcomes = process_all(inbox, handler, run, batch).await;
        outcomes.into_iter().map(delivered).collect()
    }

    async fn mark(&self, row: &MarkerRow<'_>) -> Outcome {
        let r = async {
            let tx = self.begin().await?;
            let answer = masked_insert(self.insert_marker(&tx, row).await?);
            self.commit(tx).await?;
            Ok(answer)
        }
        .await;
        lite_out(r)
    }

    async fn own(&self, op: &Op) -> Outcome {
        let lite = self;
        match op {
            // DynamoDB's purge deletes nothing (the TTL does, and the steps' expiry is the clock's): not
            // run here.
            Op::Purge { .. } => ok((0usize, Vec::<String>::new())),
            Op::PurgeDone { .. } => ok(Vec::<u64>::new()),
            Op::Stats { consumer, now } => lite_out(
                lite.consumer_stats(Some(consumer), *now)
                    .await
                    .map(|v| v.into_iter().map(stats).collect::<Vec<_>>()),
            ),
            Op::Show {
                consumer,
                message_id,
                source,
                names,
            } => lite_out(
                lite.message_story(consumer, message_id, Some(source))
                    .await
                    .map(|mut s| {
                        if let Some(names) = names {
                            let keys = named_keys(consumer, source, message_id, names);
                            s.effects.retain(|e| keys.contains(&e.key));
                        }
                        story(s)
                    }),
            ),
            Op::Rejections {
                consumer,
                kind,
                since,
                until,
                limit,
            } => {
                if consumer.is_none() {
                    return Outcome {
                        answer: Err("needs a key".into()),
                        detail: String::new(),
                    };
                }
                lite_out(
                    lite.rejections(&filter(consumer, kind, since, until, *limit))
                        .await
                        .map(|v| v.into_iter().map(rejection).collect::<Vec<_>>()),
                )
            }
            other => unreachable!("answered by `step`: {other:?}"),
        }
    }
}

impl Side for DynamoStore {
    fn out<T: std::fmt::Debug>(r: Result<T, DynamoError>) -> Outcome {
        dyn_out(r)
    }

    fn maintenance_out<T: std::fmt::Debug>(r: Result<T, DynamoError>) -> Outcome {
        dyn_out(r)
    }

    async fn prepare(&self) -> Result<(), Outcome> {
        Ok(())
    }

    async fn deliver(
        &self,
        msgs: &[Msg],
        batch: bool,
        result_reference: &Option<String>,
        effects: &[Fx],
    ) -> Vec<String> {
        let first = &msgs[0];
        let policy = IdentityPolicy::new(ConsumerName::new(first.consumer).unwrap());
        let inbox =
            Inbox::new(self.clone(), policy).retention(RetentionPolicy::default().keep(first.keep));
        let h = handled(result_reference, effects);
        let handler = move |_tx: DynamoTx, _m: Message<serde_json::Value>| {
            let h = h.clone();
            async move { Ok::<_, HandlerError>(h) }
        };
        let received: Vec<ReceivedMessage> = msgs.iter().map(received).collect();
        // Written out, not `process_all`: one more future around DynamoDB's overflows the compiler's query
        // depth (clippy's layout of this body).
        let outcomes = if batch {
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
        outcomes.into_iter().map(delivered).collect()
    }

    async fn mark(&self, row: &MarkerRow<'_>) -> Outcome {
        let r = async {
            let tx = self.begin().await?;
            match self.insert_marker(&tx, row).await? {
                MarkerInsert::Inserted => {}
                other => return Ok(Ok(masked_insert(other))),
            }
            // DynamoDB answers at commit.
            Ok(match self.commit(tx).await? {
                Commit::Done => Ok(MarkerInsert::Inserted),
                Commit::Conflict(h) => Ok(masked_insert(MarkerInsert::Conflict(h))),
                other => Err(format!("{other:?}")),
            })
        }
        .await;
        match r {
            Ok(Err(refused)) => Outcome {
                answer: Err("refused at commit".into()),
                detail: refused,
            },
            Ok(Ok(answer)) => ok(answer),
            Err(e) => dyn_out::<()>(Err(e)),
        }
    }

    async fn own(&self, op: &Op) -> Outcome {
        let store = self;
        match op {
            Op::Purge {
                table,
                before,
                limit,
            } => dyn_out(
                store
                    .purge_batch(*table, *before, *limit)
                    .await
                    .map(|v| (v.len(), v)),
            ),
            Op::PurgeDone { before, limit } => {
                dyn_out(store.purge_done_effects(*before, *limit).await.map(|n| {
                    if n == 0 {
                        Vec::new()
                    } else {
                        vec![n]
                    }
                }))
            }
            Op::Stats { consumer, now } => dyn_out(
                store
                    .consumer_stats(consumer, *now)
                    .await
                    .map(|s| vec![stats(s)]),
            ),
            Op::Show {
                consumer,
                message_id,
                source,
                names,
            } => dyn_out(
                store
                    .message_story(consumer, message_id, source, names.as_deref())
                    .await
                    .map(story),
            ),
            Op::Rejections {
                consumer,
                kind,
                since,
                until,
                limit,
            } => dyn_out(
                store
                    .rejections(&filter(consumer, kind, since, until, *limit))
                    .await
                    .map(|v| v.into_iter().map(rejection).collect::<Vec<_>>()),
            ),
            other => unreachable!("answered by `step`: {other:?}"),
        }
    }
}

fn filter(
    consumer: &Option<String>,
    kind: &Option<String>,
    since: &Option<DateTime<Utc>>,
    until: &Option<DateTime<Utc>>,
    limit: i64,
) -> RejectionFilter {
    let mut f = RejectionFilter::new().limit(limit);
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
    f
}

fn find_key(seen: &Seen, pick: usize, key: &Option<String>) -> Option<String> {
    match key {
        Some(k) => Some(k.clone()),
        None if seen.keys.is_empty() => None,
        None => Some(seen.keys[pick % seen.keys.len()].clone()),
    }
}

fn endpoint() -> String {
    std::env::var("TXINBOX_DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!("TXINBOX_DYNAMODB_ENDPOINT is not set: start DynamoDB Local with `eval \"$(bash scripts/dynamodb.sh start)\"` (scripts/test.sh does)")
    })
}

async fn fresh_table(client: &Client) -> String {
    let name = format!("txinbox-prop-{}", uuid::Uuid::new_v4().simple());
    DynamoStore::create_table(client, &name)
        .await
        .unwrap_or_else(|e| panic!("DynamoDB Local at TXINBOX_DYNAMODB_ENDPOINT: {e}"));
    name
}

async fn drop_table(client: &Client, name: &str) {
    client
        .delete_table()
        .table_name(name)
        .send()
        .await
        .unwrap_or_else(|e| panic!("deleting table {name}: {e:?}"));
}

/// One case on a table of its own, deleted afterwards whatever the case did (a panic included).
async fn run_case(client: Client, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let table = fresh_table(&client).await;
    let case = tokio::spawn({
        let (client, table) = (client.clone(), table.clone());
        async move {
            let store = DynamoStore::open(client, table, dynamo_options())
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let lite = Lite::connect("sqlite::memory:")
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let (mut seen_lite, mut seen_dyn) = (Seen::default(), Seen::default());
            let mut result = Ok(());
            for (i, op) in ops.iter().enumerate() {
                // The claim's limit as SQLite's rows decide it, before the step changes them.
                let claim = match op {
                    Op::Claim {
                        destinations,
                        limit,
                        ..
                    } => {
                        expire(&lite)
                            .await
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        claim_limit(&lite, destinations, *limit)
                            .await
                            .map_err(|e| TestCaseError::fail(e.to_string()))?
                    }
                    _ => 0,
                };
                let a = step(&lite, &mut seen_lite, &op.on_lite(), claim).await;
                let b = step(&store, &mut seen_dyn, op, claim).await;
                if a != b {
                    result = Err(TestCaseError::fail(format!(
                        "step {i} of {}: {op:?}\n  SQLite:   {a:?}\n  DynamoDB: {b:?}",
                        ops.len()
                    )));
                    break;
                }
            }
            lite.close().await;
            result
        }
    })
    .await;
    drop_table(&client, &table).await;
    match case {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(TestCaseError::fail(e.to_string())),
    }
}

#[test]
fn sqlite_and_dynamodb_agree_on_hostile_operations() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = txinbox_dynamodb::emulator_client(&endpoint());
    let cases = std::env::var("TXINBOX_PROP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..24), |ops| {
        rt.block_on(run_case(client.clone(), ops))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------------------
// What the property found, one by one.

/// A store for a test of its own: SQLite in memory, or DynamoDB Local on a fresh table (deleted by
/// [`done_with`]).
async fn lite_store() -> Lite {
    Lite::connect("sqlite::memory:").await.unwrap()
}

async fn dynamo_store() -> DynamoStore {
    let client = txinbox_dynamodb::emulator_client(&endpoint());
    let table = fresh_table(&client).await;
    DynamoStore::open(client, table, dynamo_options())
        .await
        .unwrap()
}

trait DoneWith {
    async fn done_with(self);
}

impl DoneWith for Lite {
    async fn done_with(self) {
        self.close().await;
    }
}

impl DoneWith for DynamoStore {
    async fn done_with(self) {
        drop_table(self.client(), self.table()).await;
    }
}

fn copy(id: &str, business_key: Option<&str>) -> NoopDelivery {
    let mut m = ReceivedMessage::new(b"{}".to_vec());
    m.attributes.insert("ce-id".into(), id.into());
    m.attributes.insert("ce-source".into(), "s".into());
    if let Some(k) = business_key {
        m.attributes.insert("ce-businesskey".into(), k.into());
    }
    NoopDelivery(m)
}

/// A copy of a message, or a message of the same business key, refused within the batch that applies the
/// holder answers the result reference the holder recorded, as it would alone (`Inbox::process_batch`: "Each
/// delivery gets the outcome it would get ... alone"); the batch answered none (the holder read when the
/// markers went in, before its handler ran) on the stores that keep the batch whole, SQLite's and
/// DynamoDB's.
macro_rules! refused_within_the_batch {
    ($store:expr, $tx:ty) => {{
        let store = $store;
        let inbox = Inbox::new(
            store.clone(),
            IdentityPolicy::new(ConsumerName::new("c").unwrap()),
        );
        let handler = |_tx: $tx, m: Message<serde_json::Value>| async move {
            Ok::<_, HandlerError>(Handled::reference(format!("ref-{}", m.identity.message_id)))
        };
        let outcomes = inbox
            .bind_handler(handler)
            .process_batch(
                vec![
                    copy("a", None),
                    copy("a", None),
                    copy("b", Some("k")),
                    copy("c", Some("k")),
                ],
                &CancellationToken::new(),
            )
            .await;
        assert_eq!(
            outcomes.into_iter().map(delivered).collect::<Vec<_>>(),
            [
                "Applied { result_reference: Some(\"ref-a\") }",
                "Duplicate { result_reference: Some(\"ref-a\") }",
                "Applied { result_reference: Some(\"ref-b\") }",
                "BusinessDuplicate { holder_message_id: \"b\", result_reference: Some(\"ref-b\") }",
            ]
        );
        store.done_with().await;
    }};
}

#[tokio::test]
async fn a_delivery_refused_within_its_batch_answers_the_holders_reference_on_sqlite() {
    refused_within_the_batch!(lite_store().await, txinbox_store::Tx<sqlx::Sqlite>);
}

#[tokio::test]
async fn a_delivery_refused_within_its_batch_answers_the_holders_reference_on_dynamodb() {
    refused_within_the_batch!(dynamo_store().await, DynamoTx);
}

/// An effect's metadata keeps every key, the empty one included: DynamoDB refuses an empty key in a map
/// attribute (`ValidationException`), so a message whose handler recorded one was dead-lettered
/// (`handler_permanent`) on DynamoDB where SQLite applied it.
macro_rules! metadata_with_an_empty_key {
    ($store:expr, $tx:ty) => {{
        let store = $store;
        let policy = IdentityPolicy::new(ConsumerName::new("c").unwrap());
        let delivery = copy("a", None);
        let identity = policy.resolve(&delivery.0).unwrap();
        let inbox = Inbox::new(store.clone(), policy);
        let handler = |_tx: $tx, _m: Message<serde_json::Value>| async move {
            Ok::<_, HandlerError>(
                Handled::done().effect(
                    Effect::new("notify", "d1", b"x".to_vec())
                        .metadata("", "empty key")
                        .metadata("k", ""),
                ),
            )
        };
        let outcome = inbox.process(delivery, &handler).await;
        assert_eq!(delivered(outcome), "Applied { result_reference: None }");
        let e = store
            .find_effect(&idempotency_key(&identity, "notify"))
            .await
            .unwrap()
            .expect("the effect was recorded");
        assert_eq!(
            e.metadata.into_iter().collect::<Vec<_>>(),
            [
                (String::new(), "empty key".to_owned()),
                ("k".to_owned(), String::new())
            ]
        );
        store.done_with().await;
    }};
}

#[tokio::test]
async fn an_effects_metadata_keeps_an_empty_key_on_sqlite() {
    metadata_with_an_empty_key!(lite_store().await, txinbox_store::Tx<sqlx::Sqlite>);
}

#[tokio::test]
async fn an_effects_metadata_keeps_an_empty_key_on_dynamodb() {
    metadata_with_an_empty_key!(dynamo_store().await, DynamoTx);
}

/// A delivery applied by `store` for consumer `c`, message `id`, with the effects `handled` records.
async fn apply<S>(store: &S, id: &str, handled: Handled) -> String
where
    S: InboxStore + Clone,
    S::Tx: Clone + Send + Sync + 'static,
{
    let inbox = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("c").unwrap()),
    );
    let handler = move |_tx: S::Tx, _m: Message<serde_json::Value>| {
        let h = handled.clone();
        async move { Ok::<_, HandlerError>(h) }
    };
    delivered(inbox.process(copy(id, None), &handler).await)
}

/// Dates past year 9999 or before year 1 are kept as the last or first instant of that range, as the SQL
/// stores keep them: DynamoDB wrote them as they came (`+10000-01-01T...`, which sorts before `2026-...`
/// as text and does not parse back as RFC 3339), so a claim at such a `now` found nothing due, and a marker
/// written with such dates could not be read back.
macro_rules! dates_past_the_four_digit_years {
    ($store:expr) => {{
        let store = $store;
        let far = Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(
            apply(
                &store,
                "a",
                Handled::done().effect(Effect::new("n", "d1", vec![]))
            )
            .await,
            "Applied { result_reference: None }"
        );
        let claimed = store
            .claim_effects("runner", &["d1".to_owned()], far, far, 10)
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "the effect is due at any later date");
        let mut m = ReceivedMessage::new(b"{}".to_vec());
        m.attributes.insert("ce-id".into(), "m".into());
        m.attributes.insert("ce-source".into(), "s".into());
        let identity = IdentityPolicy::new(ConsumerName::new("c").unwrap())
            .resolve(&m)
            .unwrap();
        let ancient = DateTime::<Utc>::MIN_UTC;
        let row = MarkerRow::new(&identity, "h", ancient, far, DateTime::<Utc>::MAX_UTC, 1);
        let tx = store.begin().await.unwrap();
        assert_eq!(
            store.insert_marker(&tx, &row).await.unwrap(),
            MarkerInsert::Inserted
        );
        assert!(matches!(store.commit(tx).await.unwrap(), Commit::Done));
        let story = show(&store, "c", "m", "s").await;
        assert_eq!(story.markers.len(), 1);
        let last = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap()
            + chrono::Duration::microseconds(999_999);
        let first = Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap();
        let marker = &story.markers[0];
        assert_eq!(
            (
                marker.received_at,
                marker.processed_at,
                marker.retention_until
            ),
            (first, last, last)
        );
        store.done_with().await;
    }};
}

/// A message's story, through each store's own query.
trait Show {
    async fn story(&self, consumer: &str, id: &str, source: &str) -> MessageStory;
}

impl Show for Lite {
    async fn story(&self, consumer: &str, id: &str, source: &str) -> MessageStory {
        self.message_story(consumer, id, Some(source))
            .await
            .unwrap()
    }
}

impl Show for DynamoStore {
    async fn story(&self, consumer: &str, id: &str, source: &str) -> MessageStory {
        self.message_story(consumer, id, source, None)
            .await
            .unwrap()
    }
}

async fn show<S: Show>(store: &S, consumer: &str, id: &str, source: &str) -> MessageStory {
    store.story(consumer, id, source).await
}

#[tokio::test]
async fn dates_past_the_four_digit_years_are_kept_at_their_edge_on_sqlite() {
    dates_past_the_four_digit_years!(lite_store().await);
}

#[tokio::test]
async fn dates_past_the_four_digit_years_are_kept_at_their_edge_on_dynamodb() {
    dates_past_the_four_digit_years!(dynamo_store().await);
}

/// A claim with a limit of zero or less claims one effect, as the SQL stores read it (a limit at least 1,
/// as every purge batch too): DynamoDB claimed none, so a runner configured with a batch of 0 never ran an
/// effect there.
macro_rules! a_claim_below_one {
    ($store:expr) => {{
        let store = $store;
        let fx = |n: &str| Effect::new(n, "d1", vec![]);
        assert_eq!(
            apply(&store, "a", Handled::done().effect(fx("x")).effect(fx("y"))).await,
            "Applied { result_reference: None }"
        );
        let now = Utc::now() + chrono::Duration::hours(1);
        let until = now + chrono::Duration::hours(1);
        // Two effects due: one for each claim, then none left.
        for (limit, expected) in [(0, 1), (-1, 1), (i64::MIN, 0)] {
            let claimed = store
                .claim_effects(
                    &format!("runner{limit}"),
                    &["d1".to_owned()],
                    now,
                    until,
                    limit,
                )
                .await
                .unwrap();
            assert_eq!(claimed.len(), expected, "limit {limit}");
        }
        store.done_with().await;
    }};
}

#[tokio::test]
async fn a_claim_with_a_limit_below_one_claims_one_effect_on_sqlite() {
    a_claim_below_one!(lite_store().await);
}

#[tokio::test]
async fn a_claim_with_a_limit_below_one_claims_one_effect_on_dynamodb() {
    a_claim_below_one!(dynamo_store().await);
}

/// The story of a message of a consumer no message can have (an invalid consumer name), with its effects
/// asked by name, is empty, as on SQLite: DynamoDB answered an error (`Corrupt`, "consumer name is not
/// valid") to an operator's query that only had nothing to find.
#[tokio::test]
async fn the_story_of_an_invalid_consumers_message_by_effect_names_is_empty_on_dynamodb() {
    let store = dynamo_store().await;
    let lite = lite_store().await;
    let names = ["notify".to_owned()];
    for consumer in ["", "no spaces allowed", "\0"] {
        let story = store
            .message_story(consumer, "a", "s", Some(&names))
            .await
            .unwrap();
        let expected = lite.message_story(consumer, "a", Some("s")).await.unwrap();
        assert_eq!(story, expected);
        assert!(!story.found(), "{story:?}");
    }
    store.done_with().await;
    lite.done_with().await;
}

/// The rejections of every consumer are refused with `NeedsKey` whatever the time bounds (the query's
/// documented error): an empty range (`since` at or after `until`) answered an empty list instead.
#[tokio::test]
async fn the_rejections_of_every_consumer_need_a_key_even_in_an_empty_range_on_dynamodb() {
    let store = dynamo_store().await;
    let t = Utc::now();
    for (since, until) in [
        (t, t),
        (t, t - chrono::Duration::hours(1)),
        (t - chrono::Duration::hours(1), t),
    ] {
        let f = RejectionFilter::new().since(since).until(until);
        let r = store.rejections(&f).await;
        assert!(
            matches!(r, Err(DynamoError::NeedsKey(_))),
            "{since} .. {until}: {r:?}"
        );
    }
    store.done_with().await;
}

/// A consumer's figures at the ends of chrono's range answer, as on SQLite (the last hour saturates):
/// DynamoDB's `now - 1 hour` panicked at the earliest date (`DateTime - TimeDelta overflowed`).
#[tokio::test]
async fn a_consumers_stats_at_the_earliest_date_answer_on_dynamodb() {
    let store = dynamo_store().await;
    assert_eq!(
        apply(&store, "a", Handled::done()).await,
        "Applied { result_reference: None }"
    );
    let s = store
        .consumer_stats("c", DateTime::<Utc>::MIN_UTC)
        .await
        .unwrap();
    assert_eq!((s.inbox_rows, s.rows_last_hour), (1, 1));
    store.done_with().await;
}

/// A consumer's figures count the markers not yet expired by the clock, whatever `now` the caller gives
/// (the reference of the last hour and of the effect lag), as every other query and SQLite's maintenance
/// count them: DynamoDB left out a marker whose retention ends before that `now`, so figures asked for a
/// later `now` missed live markers (and for an earlier one counted expired ones).
#[tokio::test]
async fn a_consumers_stats_count_the_markers_live_by_the_clock_on_dynamodb() {
    let store = dynamo_store().await;
    let inbox = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("c").unwrap()),
    )
    .retention(RetentionPolicy::default().keep(Duration::from_secs(3600)));
    let handler = |_tx: DynamoTx, _m: Message<serde_json::Value>| async move {
        Ok::<_, HandlerError>(Handled::done())
    };
    assert_eq!(
        delivered(inbox.process(copy("a", None), &handler).await),
        "Applied { result_reference: None }"
    );
    for now in [
        Utc::now() + chrono::Duration::days(2),
        DateTime::<Utc>::MAX_UTC,
    ] {
        let s = store.consumer_stats("c", now).await.unwrap();
        assert_eq!((s.inbox_rows, s.rows_last_hour), (1, 0), "{now}");
    }
    store.done_with().await;
}

/// A broker's delivery count past `i32::MAX` is kept as `i32::MAX`, as the SQL stores keep it (their
/// INTEGER column): DynamoDB kept it whole, so the same message showed another count there.
#[tokio::test]
async fn a_delivery_count_past_i32_is_kept_as_i32_max_on_dynamodb() {
    let store = dynamo_store().await;
    let mut m = ReceivedMessage::new(b"{}".to_vec());
    m.attributes.insert("ce-id".into(), "m".into());
    m.attributes.insert("ce-source".into(), "s".into());
    let id = IdentityPolicy::new(ConsumerName::new("c").unwrap())
        .resolve(&m)
        .unwrap();
    let now = Utc::now();
    let row = MarkerRow::new(
        &id,
        "h",
        now,
        now,
        now + chrono::Duration::hours(1),
        u32::MAX,
    );
    let tx = store.begin().await.unwrap();
    assert_eq!(
        store.insert_marker(&tx, &row).await.unwrap(),
        MarkerInsert::Inserted
    );
    assert!(matches!(store.commit(tx).await.unwrap(), Commit::Done));
    let story = show(&store, "c", "m", "s").await;
    assert_eq!(story.markers.len(), 1);
    assert_eq!(story.markers[0].delivery_count, i64::from(i32::MAX));
    store.done_with().await;
}

/// Operator queries and claims whose key would be longer than DynamoDB takes (2048 bytes for a partition
/// key: a consumer, source, message id or destination of kilobytes, which no stored item can have) find
/// nothing, as on SQLite: DynamoDB refused them (`ValidationException`, "Hash primary key values must be
/// under 2048 bytes") and the query failed.
#[tokio::test]
async fn queries_with_keys_longer_than_dynamodb_takes_find_nothing_on_dynamodb() {
    let store = dynamo_store().await;
    let lite = lite_store().await;
    let long = "x".repeat(3000);
    let story = store.message_story(&long, "a", "s", None).await.unwrap();
    assert_eq!(
        story,
        lite.message_story(&long, "a", Some("s")).await.unwrap()
    );
    let story = store.message_story("c", &long, &long, None).await.unwrap();
    assert!(!story.found());
    let now = Utc::now();
    let stats = store.consumer_stats(&long, now).await.unwrap();
    assert_eq!(
        stats,
        lite.consumer_stats(Some(&long), now).await.unwrap()[0]
    );
    let f = RejectionFilter::new().consumer(&long);
    assert_eq!(store.rejections(&f).await.unwrap(), []);
    for table in Table::ALL {
        assert_eq!(
            store.table_stats(table, &long).await.unwrap(),
            (0, None),
            "{table}"
        );
    }
    let claimed = store
        .claim_effects("runner", &[long.clone(), "d1".to_owned()], now, now, 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 0);
    store.done_with().await;
    lite.done_with().await;
}

/// A claim takes the effects that fell due first across all its destinations, as on SQLite: DynamoDB filled
/// the claim from its first destination before it looked at the next, so a destination listed later waited
/// behind every effect due at the one before it, however much older its own were.
macro_rules! oldest_across_destinations {
    ($store:expr) => {{
        let store = $store;
        assert_eq!(
            apply(
                &store,
                "a",
                Handled::done().effect(Effect::new("n", "d2", vec![]))
            )
            .await,
            "Applied { result_reference: None }"
        );
        assert_eq!(
            apply(
                &store,
                "b",
                Handled::done().effect(Effect::new("n", "d1", vec![]))
            )
            .await,
            "Applied { result_reference: None }"
        );
        let now = Utc::now() + chrono::Duration::hours(1);
        let until = now + chrono::Duration::hours(1);
        let dests = ["d1".to_owned(), "d2".to_owned()];
        let first = store
            .claim_effects("r", &dests, now, until, 1)
            .await
            .unwrap();
        assert_eq!(
            first
                .iter()
                .map(|e| (e.message_id.as_str(), e.destination.as_str()))
                .collect::<Vec<_>>(),
            [("a", "d2")]
        );
        let second = store
            .claim_effects("r", &dests, now, until, 1)
            .await
            .unwrap();
        assert_eq!(
            second
                .iter()
                .map(|e| (e.message_id.as_str(), e.destination.as_str()))
                .collect::<Vec<_>>(),
            [("b", "d1")]
        );
        store.done_with().await;
    }};
}

#[tokio::test]
async fn a_claim_takes_the_oldest_effects_across_its_destinations_on_sqlite() {
    oldest_across_destinations!(lite_store().await);
}

#[tokio::test]
async fn a_claim_takes_the_oldest_effects_across_its_destinations_on_dynamodb() {
    oldest_across_destinations!(dynamo_store().await);
}

/// An effect done longer ago than the effects' keep is gone for every query and for a compensation, as
/// the maintenance leaves the SQL stores (its `expires_at` has passed: absent from that second on, before
/// the TTL deletes it): DynamoDB still counted it in the effect gauges, found it by its key and let an
/// operator compensate it, where its message's story no longer showed it.
macro_rules! done_past_the_keep {
    ($store:expr, $expire:expr) => {{
        let store = $store;
        let policy = IdentityPolicy::new(ConsumerName::new("c").unwrap());
        let identity = policy.resolve(&copy("a", None).0).unwrap();
        assert_eq!(
            apply(
                &store,
                "a",
                Handled::done().effect(Effect::new("n", "d1", vec![]))
            )
            .await,
            "Applied { result_reference: None }"
        );
        let id = common::done_long_ago(&store, "d1").await;
        $expire(&store, id).await;
        let key = idempotency_key(&identity, "n");
        assert_eq!(store.effect_counts().await.unwrap(), []);
        assert!(store.find_effect(&key).await.unwrap().is_none());
        assert!(!store
            .mark_compensated(id, "undo", Utc::now())
            .await
            .unwrap());
        assert_eq!(
            store.table_stats(Table::Effects, "c").await.unwrap(),
            (0, None)
        );
        assert!(show(&store, "c", "a", "s").await.effects.is_empty());
        store.done_with().await;
    }};
}

#[tokio::test]
async fn an_effect_done_past_the_keep_is_gone_on_sqlite_after_the_maintenance() {
    done_past_the_keep!(lite_store().await, |s: &Lite, _id| {
        let s = s.clone();
        // SQLite stamps `finished_at` from its own clock (the host's), whatever time the runner passes: the
        // maintenance runs a day past the effects' keep instead.
        let past_the_keep = Utc::now()
            + chrono::Duration::from_std(dynamo_options().effects_keep).unwrap()
            + chrono::Duration::days(1);
        async move { expire_at(&s, past_the_keep).await.unwrap() }
    });
}

#[tokio::test]
async fn an_effect_done_past_the_keep_is_gone_on_dynamodb() {
    done_past_the_keep!(dynamo_store().await, common::expire_done_effect);
}

/// A copy of a message applied before, whose business key an earlier message of its batch takes, is a
/// plain duplicate of its own marker, as it would be alone (a store answers the holder of the message's own
/// identity before the business key's): DynamoDB, which refuses it within the batch without reading the
/// table, answered a business duplicate of the other message.
macro_rules! a_copy_whose_key_its_batch_takes {
    ($store:expr, $tx:ty) => {{
        let store = $store;
        let inbox = Inbox::new(
            store.clone(),
            IdentityPolicy::new(ConsumerName::new("c").unwrap()),
        );
        let handler = |_tx: $tx, m: Message<serde_json::Value>| async move {
            Ok::<_, HandlerError>(Handled::reference(format!("ref-{}", m.identity.message_id)))
        };
        assert_eq!(
            delivered(inbox.process(copy("a", None), &handler).await),
            "Applied { result_reference: Some(\"ref-a\") }"
        );
        let outcomes = inbox
            .bind_handler(handler)
            .process_batch(
                vec![copy("b", Some("k")), copy("a", Some("k"))],
                &CancellationToken::new(),
            )
            .await;
        assert_eq!(
            outcomes.into_iter().map(delivered).collect::<Vec<_>>(),
            [
                "Applied { result_reference: Some(\"ref-b\") }",
                "Duplicate { result_reference: Some(\"ref-a\") }",
            ]
        );
        store.done_with().await;
    }};
}

#[tokio::test]
async fn a_copy_whose_business_key_its_batch_takes_is_a_duplicate_of_its_marker_on_sqlite() {
    a_copy_whose_key_its_batch_takes!(lite_store().await, txinbox_store::Tx<sqlx::Sqlite>);
}

#[tokio::test]
async fn a_copy_whose_business_key_its_batch_takes_is_a_duplicate_of_its_marker_on_dynamodb() {
    a_copy_whose_key_its_batch_takes!(dynamo_store().await, DynamoTx);
}

/// One claim holds an effect once, even when the claim it takes ends before `now` (so that the effect is
/// due again the moment it is claimed): DynamoDB's claim found the claimed effect again under its new sort
/// key in a later page of the `due` index and claimed it a second time, so the runner got it twice in one
/// batch (two calls at once of one effect), where SQLite claims each effect it selected once.
macro_rules! claimed_once_per_claim {
    ($store:expr) => {{
        let store = $store;
        let mut handled = Handled::done();
        for i in 0..20 {
            handled = handled.effect(Effect::new(format!("m{i}"), "d1", vec![i]).group("g"));
        }
        assert_eq!(
            apply(&store, "a", handled).await,
            "Applied { result_reference: None }"
        );
        let now = Utc::now() + chrono::Duration::hours(8);
        let until = now - chrono::Duration::hours(7);
        let claimed = store
            .claim_effects("r", &["d1".to_owned()], now, until, 2)
            .await
            .unwrap();
        let names: Vec<&str> = claimed.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            ["m0"],
            "only the group's first is due, and it is claimed once"
        );
        store.done_with().await;
    }};
}

#[tokio::test]
async fn a_claim_holds_each_effect_once_on_sqlite() {
    claimed_once_per_claim!(lite_store().await);
}

#[tokio::test]
async fn a_claim_holds_each_effect_once_on_dynamodb() {
    claimed_once_per_claim!(dynamo_store().await);
}

/// A copy of a message of its batch whose business key an earlier message of the batch takes is a plain
/// duplicate of that copy's message, as it would be alone (the holder of the identity before the business
/// key's, whichever came first in the batch): DynamoDB answered the first of the batch it met, a business
/// duplicate of the key's holder.
macro_rules! a_copy_within_its_batch_whose_key_is_taken {
    ($store:expr, $tx:ty) => {{
        let store = $store;
        let inbox = Inbox::new(
            store.clone(),
            IdentityPolicy::new(ConsumerName::new("c").unwrap()),
        );
        let handler = |_tx: $tx, m: Message<serde_json::Value>| async move {
            Ok::<_, HandlerError>(Handled::reference(format!("ref-{}", m.identity.message_id)))
        };
        let outcomes = inbox
            .bind_handler(handler)
            .process_batch(
                vec![copy("b", Some("k")), copy("a", None), copy("a", Some("k"))],
                &CancellationToken::new(),
            )
            .await;
        assert_eq!(
            outcomes.into_iter().map(delivered).collect::<Vec<_>>(),
            [
                "Applied { result_reference: Some(\"ref-b\") }",
                "Applied { result_reference: Some(\"ref-a\") }",
                "Duplicate { result_reference: Some(\"ref-a\") }",
            ]
        );
        store.done_with().await;
    }};
}

#[tokio::test]
async fn a_copy_within_its_batch_whose_business_key_is_taken_is_a_duplicate_on_sqlite() {
    a_copy_within_its_batch_whose_key_is_taken!(
        lite_store().await,
        txinbox_store::Tx<sqlx::Sqlite>
    );
}

#[tokio::test]
async fn a_copy_within_its_batch_whose_business_key_is_taken_is_a_duplicate_on_dynamodb() {
    a_copy_within_its_batch_whose_key_is_taken!(dynamo_store().await, DynamoTx);
}

/// A copy of a message applied before, whose handler's transaction DynamoDB would refuse as a whole (more
/// than 100 actions; a result reference that makes the marker an item over 400 KB), is decided by the
/// marker it meets, as on SQLite, which finds the marker before the handler runs: a duplicate with the
/// holder's reference, a payload collision, a business duplicate; alone and in a batch. DynamoDB, which
/// decides duplicates at commit, dead-lettered each (`handler_permanent`), the message processed all the
/// same. A message that has no marker yet still fails there (`fresh`: what each store answers).
macro_rules! a_refused_copy_of_an_applied_message {
    ($store:expr, $tx:ty, $fresh:expr) => {{
        let store = $store;
        let inbox = Inbox::new(
            store.clone(),
            IdentityPolicy::new(ConsumerName::new("c").unwrap()),
        );
        // 0: a plain answer; 1: 100 effects (101 actions with the marker); 2: a 410 KB result reference.
        let mode = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let m = mode.clone();
        let handler = move |_tx: $tx, msg: Message<serde_json::Value>| {
            let mode = m.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                Ok::<_, HandlerError>(match mode {
                    0 => Handled::reference(format!("ref-{}", msg.identity.message_id)),
                    1 => (0..100).fold(Handled::reference("too-many"), |h, i| {
                        h.effect(Effect::new(format!("e{i}"), "d1", vec![]))
                    }),
                    _ => Handled::reference("r".repeat(410 * 1024)),
                })
            }
        };
        let set = |v: usize| mode.store(v, std::sync::atomic::Ordering::SeqCst);
        let mut other = copy("a", None);
        other.0.body = br#"{"other":1}"#.to_vec();
        let mut outcomes = Vec::new();
        for (m, delivery) in [
            (0, copy("a", None)),
            (0, copy("b", Some("k"))),
            (1, copy("a", None)),
            (1, other),
            (1, copy("c", Some("k"))),
            (2, copy("a", None)),
            (2, copy("c", Some("k"))),
        ] {
            set(m);
            let outcome = delivered(inbox.process(delivery, &handler).await);
            // A collision's hashes are the copies' own (the same on both stores).
            outcomes.push(match outcome.split_once(" {") {
                Some(("PayloadCollision", _)) => "PayloadCollision".to_owned(),
                _ => outcome,
            });
        }
        set(1);
        let batch = inbox
            .clone()
            .bind_handler(handler.clone())
            .process_batch(
                vec![copy("a", None), copy("c", Some("k"))],
                &CancellationToken::new(),
            )
            .await;
        outcomes.extend(batch.into_iter().map(delivered));
        assert_eq!(
            outcomes,
            [
                "Applied { result_reference: Some(\"ref-a\") }",
                "Applied { result_reference: Some(\"ref-b\") }",
                "Duplicate { result_reference: Some(\"ref-a\") }",
                "PayloadCollision",
                "BusinessDuplicate { holder_message_id: \"b\", result_reference: Some(\"ref-b\") }",
                "Duplicate { result_reference: Some(\"ref-a\") }",
                "BusinessDuplicate { holder_message_id: \"b\", result_reference: Some(\"ref-b\") }",
                "Duplicate { result_reference: Some(\"ref-a\") }",
                "BusinessDuplicate { holder_message_id: \"b\", result_reference: Some(\"ref-b\") }",
            ]
        );
        let fresh = delivered(inbox.process(copy("d", None), &handler).await);
        assert_eq!(fresh, $fresh);
        store.done_with().await;
    }};
}

/// A copy of a message applied before whose handler returns a permanent error, or records effects the
/// pipeline refuses after the handler ran (an empty name; two of one name), is decided by what holds its
/// marker or business key, as on SQLite, which finds the marker before the handler runs: a duplicate with
/// the holder's reference, a payload collision, a business duplicate; alone and in a batch. DynamoDB, which
/// decides duplicates at commit, runs that copy's handler, and the pipeline dead-lettered it
/// (`handler_permanent`), the message applied all the same. A message without a marker is dead-lettered on
/// both.
macro_rules! a_held_copy_whose_handler_fails_for_good {
    ($store:expr, $tx:ty) => {{
        let store = $store;
        let inbox = Inbox::new(
            store.clone(),
            IdentityPolicy::new(ConsumerName::new("c").unwrap()),
        );
        // 0: a plain answer; 1: a permanent error; 2: an effect without a name; 3: two effects of one name.
        let mode = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let m = mode.clone();
        let handler = move |_tx: $tx, msg: Message<serde_json::Value>| {
            let mode = m.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                let reference = Handled::reference(format!("ref-{}", msg.identity.message_id));
                match mode {
                    0 => Ok(reference),
                    1 => Err(HandlerError::permanent(std::io::Error::other("for good"))),
                    2 => Ok(reference.effect(Effect::new("", "d1", vec![]))),
                    _ => Ok(reference
                        .effect(Effect::new("e", "d1", vec![]))
                        .effect(Effect::new("e", "d2", vec![]))),
                }
            }
        };
        let set = |v: usize| mode.store(v, std::sync::atomic::Ordering::SeqCst);
        let label = |o| {
            let o = delivered(o);
            // A collision's hashes are the copies' own (the same on both stores).
            match o.split_once(" {") {
                Some(("PayloadCollision", _)) => "PayloadCollision".to_owned(),
                _ => o,
            }
        };
        let other = || {
            let mut other = copy("a", None);
            other.0.body = br#"{"other":1}"#.to_vec();
            other
        };
        set(0);
        for d in [copy("a", None), copy("b", Some("k"))] {
            inbox.process(d, &handler).await;
        }
        let held = [
            "Duplicate { result_reference: Some(\"ref-a\") }",
            "PayloadCollision",
            "BusinessDuplicate { holder_message_id: \"b\", result_reference: Some(\"ref-b\") }",
            "dead-lettered: handler_permanent",
        ];
        for fails in 1..=3 {
            set(fails);
            let mut alone = Vec::new();
            for d in [copy("a", None), other(), copy("c", Some("k")), copy(&format!("d{fails}"), None)] {
                alone.push(label(inbox.process(d, &handler).await));
            }
            assert_eq!(alone, held, "alone, mode {fails}");
            let batch = inbox
                .clone()
                .bind_handler(handler.clone())
                .process_batch(
                    vec![copy("a", None), other(), copy("c", Some("k")), copy(&format!("e{fails}"), None)],
                    &CancellationToken::new(),
                )
                .await;
            assert_eq!(
                batch.into_iter().map(label).collect::<Vec<_>>(),
                held,
                "in a batch, mode {fails}"
            );
        }
        store.done_with().await;
    }};
}

#[tokio::test]
async fn a_held_copy_whose_handler_fails_for_good_is_decided_by_its_marker_on_sqlite() {
    a_held_copy_whose_handler_fails_for_good!(lite_store().await, txinbox_store::Tx<sqlx::Sqlite>);
}

#[tokio::test]
async fn a_held_copy_whose_handler_fails_for_good_is_decided_by_its_marker_on_dynamodb() {
    a_held_copy_whose_handler_fails_for_good!(dynamo_store().await, DynamoTx);
}

#[tokio::test]
async fn a_refused_copy_of_an_applied_message_is_decided_by_its_marker_on_sqlite() {
    a_refused_copy_of_an_applied_message!(
        lite_store().await,
        txinbox_store::Tx<sqlx::Sqlite>,
        "Applied { result_reference: Some(\"too-many\") }"
    );
}

#[tokio::test]
async fn a_refused_copy_of_an_applied_message_is_decided_by_its_marker_on_dynamodb() {
    a_refused_copy_of_an_applied_message!(
        dynamo_store().await,
        DynamoTx,
        "dead-lettered: handler_permanent"
    );
}

/// A claim asked for at the last instant of year 9999 until a time past it lasts the difference between the
/// two as the stores keep them (both the last instant of year 9999, to the microsecond): nothing, as on
/// PostgreSQL and SQLite. DynamoDB counted the raw difference (some 260,000 years) and held the effect for
/// good, where the SQL stores let the next claim take it.
macro_rules! a_claim_between_times_past_year_9999 {
    ($store:expr) => {{
        let store = $store;
        assert_eq!(
            apply(
                &store,
                "a",
                Handled::done().effect(Effect::new("n", "d1", vec![]))
            )
            .await,
            "Applied { result_reference: None }"
        );
        let dests = ["d1".to_owned()];
        let end_of_9999 = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap()
            + chrono::Duration::nanoseconds(999_999_999);
        let first = store
            .claim_effects("r", &dests, end_of_9999, DateTime::<Utc>::MAX_UTC, 10)
            .await
            .unwrap();
        assert_eq!(first.len(), 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = Utc::now();
        let second = store
            .claim_effects("r2", &dests, now, now + chrono::Duration::seconds(60), 10)
            .await
            .unwrap();
        assert_eq!(
            second.len(),
            1,
            "a claim that lasts nothing has ended: the next claim takes the effect"
        );
        store.done_with().await;
    }};
}

#[tokio::test]
async fn a_claim_between_times_past_year_9999_lasts_nothing_on_sqlite() {
    a_claim_between_times_past_year_9999!(lite_store().await);
}

#[tokio::test]
async fn a_claim_between_times_past_year_9999_lasts_nothing_on_dynamodb() {
    a_claim_between_times_past_year_9999!(dynamo_store().await);
}
