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
//! A second property holds each store to itself: deliveries decided as one batch get the outcomes the same
//! deliveries get one after the other.
//!
//! PostgreSQL runs in a schema of its own for the run, dropped at the end; SQLite in memory, fresh for each
//! case. 64 cases by default; `TXINBOX_PROP_CASES` sets another number (a longer search by hand).
//! Below the properties, a deterministic test of each disagreement they found that has no other home.

use std::time::Duration;

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use txinbox_core::effects::{idempotency_key, EffectStore};
use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
use txinbox_core::{
    ConsumerName, HandlerError, IdentityPolicy, Inbox, InboxStore, MarkerInsert, Message,
    ReceivedMessage, RetentionPolicy,
};
use txinbox_store::ops::RejectionFilter;
use txinbox_store::{Backend, Store, StoreOptions};
use txinbox_testkit::prop::{
    asked_consumer, claimed, counts, delivered, fx, handled, identity, kept, kept_opt, limit,
    marker_row, msg, opt_text, picked, process_all, received, rejection, stats, story, table, time,
    tr, Fx, Msg, Outcome, Seen, Tr, Values,
};

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

/// The test's values: [`text`], and the shared model's dates.
struct Hostile;

impl Values for Hostile {
    fn text() -> impl Strategy<Value = String> {
        text()
    }
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
        8 => (prop::collection::vec(msg::<Hostile>(duration()), 1..4), any::<bool>(), opt_text::<Hostile>(), prop::collection::vec(fx::<Hostile>(prop::collection::vec(any::<u8>(), 0..16)), 0..3))
            .prop_map(|(msgs, batch, result_reference, effects)| Op::Deliver { msgs, batch, result_reference, effects }),
        2 => (msg::<Hostile>(duration()), time(), time()).prop_map(|(msg, processed_at, retention_until)| Op::Mark { msg, processed_at, retention_until }),
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
        3 => (any::<usize>(), prop_oneof![3 => Just(None), 1 => text().prop_map(Some)], tr::<Hostile>(), opt_text::<Hostile>(), time())
            .prop_map(|(pick, holder, tr, sent_hash, now)| Op::Finish { pick, holder, tr, sent_hash, now }),
        1 => (any::<usize>(), text(), time()).prop_map(|(pick, note, now)| Op::Compensate { pick, note, now }),
        1 => (table(), time(), limit()).prop_map(|(table, before, limit)| Op::Purge { table, before, limit }),
        1 => (time(), limit()).prop_map(|(before, limit)| Op::PurgeDone { before, limit }),
        1 => (prop::option::of(asked_consumer::<Hostile>()), time()).prop_map(|(consumer, now)| Op::Stats { consumer, now }),
        1 => (asked_consumer::<Hostile>(), text(), opt_text::<Hostile>()).prop_map(|(consumer, message_id, source)| Op::Show { consumer, message_id, source }),
        1 => (
            prop::option::of(asked_consumer::<Hostile>()),
            prop_oneof![Just(None), Just(Some("payload_collision".to_owned())), opt_text::<Hostile>()],
            prop::option::of(time()),
            prop::option::of(time()),
            limit(),
        )
            .prop_map(|(consumer, kind, since, until, limit)| Op::Rejections { consumer, kind, since, until, limit }),
        1 => Just(Op::EffectCounts),
        1 => (table(), asked_consumer::<Hostile>()).prop_map(|(table, consumer)| Op::TableStats { table, consumer }),
        1 => (any::<usize>(), opt_text::<Hostile>()).prop_map(|(pick, key)| Op::FindEffect { pick, key }),
        1 => asked_consumer::<Hostile>().prop_map(|consumer| Op::InboxRows { consumer }),
    ]
}

// ---------------------------------------------------------------------------------------------------------
// Observable outcomes, as values comparable across backends.

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

fn outcome<T: std::fmt::Debug>(r: Result<T, sqlx::Error>) -> Outcome {
    match r {
        Ok(v) => Outcome::ok(format!("{v:?}")),
        Err(e) => Outcome::error(kind(&e), &e),
    }
}

/// The maintenance's calls answer the store's error: the database's, read as [`outcome`] reads it (both
/// backends answer the same error for the same operation).
fn maintenance_outcome<T: std::fmt::Debug>(r: Result<T, txinbox_store::StoreError>) -> Outcome {
    outcome(r.map_err(|e| match e {
        txinbox_store::StoreError::Database(e) => e,
        other => {
            panic!("the maintenance answered a store error that is not the database's: {other}")
        }
    }))
}

// ---------------------------------------------------------------------------------------------------------
// Running the operations.

/// The most batches a purge step runs (a batch purges at least one row; a case writes fewer rows).
const PURGE_BATCHES: usize = 200;

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
            let handled = handled(result_reference, effects);
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
            let outcomes = process_all(inbox, handler, received, *batch).await;
            outcome(Ok(outcomes.into_iter().map(delivered).collect::<Vec<_>>()))
        }
        Op::Mark {
            msg,
            processed_at,
            retention_until,
        } => {
            let Some(identity) = identity(msg) else {
                return outcome(Ok("refused before the store"));
            };
            let row = marker_row(msg, &identity, *processed_at, *retention_until);
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
                    Err(e) => return maintenance_outcome::<()>(Err(e)),
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
        Op::EffectCounts => outcome(store.effect_counts().await.map(counts)),
        Op::TableStats { table, consumer } => maintenance_outcome(
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
    let result = runner().run(&prop::collection::vec(op(), 1..24), |ops| {
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

/// Deliveries (and markers written before them) only: what a batch decides.
fn delivery_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::collection::vec(msg::<Hostile>(duration()), 1..7), opt_text::<Hostile>(), prop::collection::vec(fx::<Hostile>(prop::collection::vec(any::<u8>(), 0..16)), 0..3))
            .prop_map(|(msgs, result_reference, effects)| Op::Deliver { msgs, batch: true, result_reference, effects }),
        1 => (msg::<Hostile>(duration()), time(), time()).prop_map(|(msg, processed_at, retention_until)| Op::Mark { msg, processed_at, retention_until }),
    ]
}

/// Runs `ops` on two stores of one kind, each delivery as one batch on the first and one after the other on
/// the second.
async fn run_batch_case<DB: Backend>(
    batched: &Store<DB>,
    alone: &Store<DB>,
    ops: &[Op],
) -> Result<(), TestCaseError>
where
    Store<DB>: Ops,
{
    let (mut seen_batched, mut seen_alone) = (Seen::default(), Seen::default());
    for (i, op) in ops.iter().enumerate() {
        let one_by_one = match op.clone() {
            Op::Deliver {
                msgs,
                result_reference,
                effects,
                ..
            } => Op::Deliver {
                msgs,
                batch: false,
                result_reference,
                effects,
            },
            other => other,
        };
        let a = step(batched, &mut seen_batched, op).await;
        let b = step(alone, &mut seen_alone, &one_by_one).await;
        prop_assert_eq!(&a, &b, "step {} of {}: {:?}", i, ops.len(), op);
    }
    Ok(())
}

/// The property's runner: `TXINBOX_PROP_CASES` cases (64 by default), no failure files.
fn runner() -> TestRunner {
    let cases = std::env::var("TXINBOX_PROP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// A batch decides each of its deliveries as the same deliveries one after the other would
/// ([`WorkerOptions::batch_commit`](txinbox_core::WorkerOptions::batch_commit)): the same outcomes, result
/// references and rejections, for generated deliveries of hostile messages (copies of one message, one
/// business key under several ids, tenants empty and absent, markers written before with any dates), on
/// SQLite, fresh in memory for each case. Seen failing first: a copy of a message of the same batch was
/// answered its holder's result reference as the handler gave it (a NUL in it), where one after the other it
/// is answered the reference as the store keeps it (U+FFFD).
#[test]
fn a_batch_decides_as_its_deliveries_one_after_the_other_on_sqlite() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let result = runner().run(&prop::collection::vec(delivery_op(), 1..8), |ops| {
        rt.block_on(async {
            let fresh = || async {
                Store::<sqlx::Sqlite>::connect("sqlite::memory:")
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))
            };
            let (batched, alone) = (fresh().await?, fresh().await?);
            let r = run_batch_case(&batched, &alone, &ops).await;
            batched.close().await;
            alone.close().await;
            r
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// [`a_batch_decides_as_its_deliveries_one_after_the_other_on_sqlite`] on PostgreSQL, whose batch inserts
/// its markers in one statement: two schemas of their own for the run, emptied before each case and dropped
/// at the end.
#[test]
fn a_batch_decides_as_its_deliveries_one_after_the_other_on_postgres() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let schemas = [0, 1].map(|_| format!("t_prop_{}", uuid::Uuid::new_v4().simple()));
    let stores = schemas.clone().map(|schema| {
        rt.block_on(Store::<sqlx::Postgres>::connect_with(
            &txinbox_testkit::pg_url(),
            StoreOptions::new().schema(&schema).max_connections(2),
        ))
        .unwrap_or_else(|e| panic!("PostgreSQL at TXINBOX_TEST_PG_URL is not reachable: {e}"))
    });
    let result = runner().run(&prop::collection::vec(delivery_op(), 1..8), |ops| {
        rt.block_on(async {
            for store in &stores {
                sqlx::query(
                    "TRUNCATE txinbox_inbox, txinbox_rejections, txinbox_effects RESTART IDENTITY",
                )
                .execute(store.pool())
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            run_batch_case(&stores[0], &stores[1], &ops).await
        })
    });
    rt.block_on(async {
        use sqlx::Connection;
        for store in &stores {
            store.close().await;
        }
        let mut c = sqlx::PgConnection::connect(&txinbox_testkit::pg_url())
            .await
            .unwrap();
        for schema in &schemas {
            sqlx::Executor::execute(&mut c, format!("DROP SCHEMA \"{schema}\" CASCADE").as_str())
                .await
                .unwrap();
        }
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

/// A result reference with a NUL in it is answered as every store keeps it (U+FFFD for the NUL), by the
/// delivery that applied it and by its copy, in a batch as one after the other: in a batch the copy was
/// answered the reference as the handler gave it, and alone as the store kept it.
macro_rules! nul_in_a_result_reference {
    ($fresh:expr) => {{
        let msg = || {
            let mut m = ReceivedMessage::new(b"{}".to_vec());
            m.attributes.insert("ce-id".into(), "m".into());
            m.attributes.insert("ce-source".into(), "s".into());
            m
        };
        for batch in [true, false] {
            let store = $fresh;
            let inbox = Inbox::new(store, IdentityPolicy::new(ConsumerName::new("c").unwrap()));
            let handler = |_tx, _m: Message<serde_json::Value>| async {
                Ok::<_, HandlerError>(txinbox_core::Handled::reference("task\0-1"))
            };
            let answers: Vec<String> = process_all(inbox, handler, vec![msg(), msg()], batch)
                .await
                .into_iter()
                .map(|o| format!("{o:?}"))
                .collect();
            assert_eq!(
                answers,
                [
                    "Applied { result_reference: Some(\"task\u{fffd}-1\") }",
                    "Duplicate { result_reference: Some(\"task\u{fffd}-1\") }"
                ],
                "in a batch: {batch}"
            );
        }
    }};
}

#[tokio::test]
async fn a_nul_in_a_result_reference_is_answered_as_kept_on_sqlite() {
    nul_in_a_result_reference!(txinbox_testkit::sqlite_store().await);
}

#[tokio::test]
async fn a_nul_in_a_result_reference_is_answered_as_kept_on_postgres() {
    nul_in_a_result_reference!(txinbox_testkit::pg_store(2).await);
}
