//! The partitioned layout of the PostgreSQL store: copies on both sides of a partition boundary meet one
//! marker under the unique constraint; a copy of a dropped partition is refused, one without a partition yet
//! is released; the rotation creates ahead and drops whole partitions (no row deleted); the markers of the
//! row-by-row layout stay duplicates after the conversion until their table is dropped.

use chrono::{DateTime, Duration as Cd, TimeZone, Utc};
use sqlx::Connection;
use std::time::Duration;
use txinbox_core::runtime::maintenance::{
    Maintenance, MaintenanceOptions, MaintenanceStore, PartitionRotation, Table,
};
use txinbox_core::{
    ConsumerName, Identity, IdentityPolicy, InboxStore, MarkerInsert, MarkerRow, ReceivedMessage,
};
use txinbox_store::{PartitionOptions, Store, StoreError, StoreOptions};

const DAY: i64 = 86_400;

mod common;
use common::Schema;

// What this file's tests add to the shared schema.
impl Schema {
    /// A fresh schema converted to partitions of a day, markers kept two days.
    async fn kept_two_days() -> Self {
        let s = Self::new().await;
        let _ = s
            .store
            .partition(&PartitionOptions::new().keep(Duration::from_secs(2 * DAY as u64)))
            .await
            .unwrap();
        s
    }

    /// Partitions of `parent` attached now.
    async fn partitions(&self, parent: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass($1)")
            .bind(parent)
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }

    async fn markers(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM txinbox_inbox")
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }
}

impl Schema {
    /// A store on this schema whose database clock is 10 days behind the host's: a `now()` of the schema's own,
    /// found before `pg_catalog`'s on the connection's `search_path`.
    async fn clock_behind_by_ten_days(&self) -> Store<sqlx::Postgres> {
        self.clock_moved("-").await
    }

    /// [`Schema::clock_behind_by_ten_days`], the database's clock 10 days ahead of the host's.
    async fn clock_ahead_by_ten_days(&self) -> Store<sqlx::Postgres> {
        self.clock_moved("+").await
    }

    /// A store on this schema whose database clock is `pg_catalog.now() {sign} 10 days`.
    async fn clock_moved(&self, sign: &str) -> Store<sqlx::Postgres> {
        sqlx::query(&format!(
            "CREATE FUNCTION \"{}\".now() RETURNS timestamptz LANGUAGE sql STABLE AS 'SELECT pg_catalog.now() {sign} interval ''10 days'''",
            self.name
        ))
        .execute(self.store.pool())
        .await
        .unwrap();
        let base = txinbox_testkit::pg_url();
        let sep = if base.contains('?') { '&' } else { '?' };
        Store::<sqlx::Postgres>::connect(
            &format!(
                "{base}{sep}options=-csearch_path%3D{}%2Cpg_catalog",
                self.name
            ),
            1,
        )
        .await
        .unwrap()
    }
}

/// One rotation of `s`'s partitions at `at`, with the maintenance's default keeps.
async fn rotate(s: &Schema, at: DateTime<Utc>) -> PartitionRotation {
    s.store
        .rotate_partitions(at, &MaintenanceOptions::default())
        .await
        .unwrap()
        .expect("a partitioned store rotates")
}

fn identity(id: &str, business_key: Option<&str>) -> Identity {
    let mut m = ReceivedMessage::new(b"{}".to_vec());
    m.attributes.insert("ce-id".into(), id.into());
    m.attributes.insert("ce-source".into(), "crm".into());
    let mut i = IdentityPolicy::new(ConsumerName::new("c").unwrap())
        .resolve(&m)
        .unwrap();
    if let Some(k) = business_key {
        i.set_business_key(k.into()).unwrap();
    }
    i
}

/// `id` as a message whose CloudEvents `time` is `at`.
fn timed(id: &Identity, at: DateTime<Utc>) -> Identity {
    let mut id = id.clone();
    id.event_time = Some(at);
    id
}

/// Inserts one marker of an event of time `origin` in its own transaction, committed when inserted.
async fn insert(
    store: &Store<sqlx::Postgres>,
    id: &Identity,
    hash: &str,
    origin: DateTime<Utc>,
) -> MarkerInsert {
    insert_at(store, id, hash, origin, Utc::now()).await
}

/// [`insert`] by a worker whose clock reads `now`.
async fn insert_at(
    store: &Store<sqlx::Postgres>,
    id: &Identity,
    hash: &str,
    origin: DateTime<Utc>,
    now: DateTime<Utc>,
) -> MarkerInsert {
    let id = &timed(id, origin);
    let row = MarkerRow::new(id, hash, now, now, now + Cd::days(30), 1).origin_at(origin);
    let tx = store.begin().await.unwrap();
    let answer = store.insert_marker(&tx, &row).await.unwrap();
    if answer == MarkerInsert::Inserted {
        store.commit(tx).await.unwrap();
    } else {
        store.rollback(tx, false).await.unwrap();
    }
    answer
}

/// The end of today's bucket (UTC midnight).
fn next_midnight() -> DateTime<Utc> {
    let s = (Utc::now().timestamp().div_euclid(DAY) + 1) * DAY;
    Utc.timestamp_opt(s, 0).unwrap()
}

#[tokio::test]
async fn copies_on_both_sides_of_a_boundary_meet_one_marker_in_one_partition() {
    let s = Schema::new().await;
    let r = s.store.partition(&PartitionOptions::new()).await.unwrap();
    assert!(!r.already && !r.legacy_kept, "{r:?}");
    // The 30 days back a live copy may come from (keep 30 days), today, 3 ahead.
    assert_eq!(s.partitions("txinbox_inbox").await, 30 + 1 + 3);
    let again = s.store.partition(&PartitionOptions::new()).await.unwrap();
    assert!(again.already);

    let boundary = next_midnight();
    let origin = boundary - Cd::seconds(1);
    let id = identity("evt-1", Some("task:1"));
    assert_eq!(
        insert(&s.store, &id, "h1", origin).await,
        MarkerInsert::Inserted
    );
    // A copy that arrives after the boundary (processed a day later) carries the same origin: the same
    // partition, where the primary key refuses it.
    let copy = insert(&s.store, &id, "h1", origin).await;
    let MarkerInsert::Conflict(Some(holder)) = copy else {
        panic!("the copy after the boundary was not refused: {copy:?}")
    };
    assert!(holder.is_same_message("h1"));
    // The same id with another payload: the holder tells the collision.
    let MarkerInsert::Conflict(Some(holder)) = insert(&s.store, &id, "h2", origin).await else {
        panic!("no conflict for the same id")
    };
    assert!(holder.same_identity && !holder.is_same_message("h2"));
    // Another id with the same business key, in the same bucket: the business-key index refuses it.
    let other = identity("evt-2", Some("task:1"));
    let MarkerInsert::Conflict(Some(holder)) =
        insert(&s.store, &other, "h3", origin - Cd::hours(3)).await
    else {
        panic!("no business-key conflict")
    };
    assert!(!holder.same_identity);
    assert_eq!(holder.message_id, "evt-1");
    // What the layout does not cover (documented): the same id with an origin in another bucket is a
    // different row. Every copy of one message carries one origin, so this is only a producer's re-send
    // without a CloudEvents `time`.
    assert_eq!(
        insert(&s.store, &id, "h1", boundary + Cd::seconds(1)).await,
        MarkerInsert::Inserted
    );
    assert_eq!(s.markers().await, 2);
    s.drop().await;
}

#[tokio::test]
async fn concurrent_copies_are_decided_by_the_unique_constraint() {
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let origin = Utc::now();
    let id = timed(&identity("evt-c", None), origin);
    let now = Utc::now();
    let row = MarkerRow::new(&id, "h", now, now, now + Cd::days(30), 1).origin_at(origin);
    let (t1, t2) = (
        s.store.begin().await.unwrap(),
        s.store.begin().await.unwrap(),
    );
    assert_eq!(
        s.store.insert_marker(&t1, &row).await.unwrap(),
        MarkerInsert::Inserted
    );
    // The second insert waits on the first transaction's row, then is refused once it commits.
    let second = {
        let (store, row_id) = (s.store.clone(), id.clone());
        tokio::spawn(async move {
            let now = Utc::now();
            let row =
                MarkerRow::new(&row_id, "h", now, now, now + Cd::days(30), 1).origin_at(origin);
            let a = store.insert_marker(&t2, &row).await.unwrap();
            store.rollback(t2, false).await.unwrap();
            a
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!second.is_finished(), "the second insert did not wait");
    s.store.commit(t1).await.unwrap();
    let a = second.await.unwrap();
    assert!(matches!(a, MarkerInsert::Conflict(Some(_))), "{a:?}");
    assert_eq!(s.markers().await, 1);
    s.drop().await;
}

#[tokio::test]
async fn outside_the_partitions_nothing_is_written_and_the_answer_says_why() {
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let id = identity("evt-old", None);
    let a = insert(&s.store, &id, "h", Utc::now() - Cd::days(40)).await;
    let MarkerInsert::Expired(why) = a else {
        panic!("an origin older than the kept partitions: {a:?}")
    };
    assert!(why.contains("dropped by retention"), "{why}");
    let a = insert(
        &s.store,
        &identity("evt-future", None),
        "h",
        Utc::now() + Cd::days(9),
    )
    .await;
    let MarkerInsert::Refused { reason, detail } = a else {
        panic!("an origin past any partition the maintenance makes by now: {a:?}")
    };
    assert_eq!(reason, "event_time_in_future", "{detail}");
    // Two days on with no maintenance pass since (the partitions still end 4 days from the conversion), an
    // origin 3 days ahead of that clock is one the maintenance would have made: released, not refused.
    let later = Utc::now() + Cd::days(2);
    let a = insert_at(
        &s.store,
        &identity("evt-behind", None),
        "h",
        later + Cd::days(3),
        later,
    )
    .await;
    let MarkerInsert::Unplaced(why) = a else {
        panic!("an origin past the partitions made so far: {a:?}")
    };
    assert!(why.contains("no partition yet"), "{why}");
    assert_eq!(s.markers().await, 0);
    // A batch with one of each: the others are written, each answer in its place.
    let now = Utc::now();
    let (a, b, c) = (
        timed(&identity("b-1", None), now),
        timed(&identity("b-2", None), now - Cd::days(40)),
        timed(&identity("b-3", None), now + Cd::days(9)),
    );
    let rows = [
        MarkerRow::new(&a, "h", now, now, now, 1).origin_at(now),
        MarkerRow::new(&b, "h", now, now, now, 1).origin_at(now - Cd::days(40)),
        MarkerRow::new(&c, "h", now, now, now, 1).origin_at(now + Cd::days(9)),
    ];
    let tx = s.store.begin().await.unwrap();
    let answers = s.store.insert_markers(&tx, &rows).await.unwrap();
    s.store.commit(tx).await.unwrap();
    assert_eq!(answers[0], MarkerInsert::Inserted);
    assert!(
        matches!(answers[1], MarkerInsert::Expired(_)),
        "{answers:?}"
    );
    assert!(
        matches!(&answers[2], MarkerInsert::Refused { reason, .. } if reason == "event_time_in_future"),
        "{answers:?}"
    );
    assert_eq!(s.markers().await, 1);
    s.drop().await;
}

#[tokio::test]
async fn the_rotation_creates_ahead_and_drops_whole_partitions_never_rows() {
    let s = Schema::kept_two_days().await;
    assert_eq!(s.partitions("txinbox_inbox").await, 2 + 1 + 3);
    let origin = Utc::now();
    let id = identity("evt-r", None);
    assert_eq!(
        insert(&s.store, &id, "h", origin).await,
        MarkerInsert::Inserted
    );
    // The maintenance, five days later: the partitions of the buckets whose end is more than the keep ago
    // go whole; the markers' purge deletes no row.
    let later = origin + Cd::days(5);
    let report = Maintenance::new(s.store.clone())
        .run_once_at(later, &mut |_| {})
        .await;
    assert_eq!(report.error, None);
    let p = report
        .partitions
        .clone()
        .expect("a partitioned store rotates");
    assert!(p.dropped[&Table::Markers] >= 3, "{p:?}");
    assert!(p.created[&Table::Markers] >= 1, "{p:?}");
    assert!(p.ends[&Table::Markers] >= later + Cd::days(3));
    assert_eq!(report.removed_from(Table::Markers), 0);
    assert_eq!(s.markers().await, 0, "the marker went with its partition");
    // A copy of the message now: its partition is gone, so it is refused, never applied again.
    let a = insert(&s.store, &id, "h", origin).await;
    assert!(matches!(a, MarkerInsert::Expired(_)), "{a:?}");
    // A second pass finds nothing more to drop; a purge of markers deletes nothing row by row.
    let again = rotate(&s, later).await;
    assert_eq!(again.dropped[&Table::Markers], 0);
    assert!(s
        .store
        .purge_batch(Table::Markers, later, 1000)
        .await
        .unwrap()
        .is_empty());
    // No detached or orphaned partition table is left behind.
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND relkind = 'r' AND relname LIKE 'txinbox_inbox_p%' AND NOT relispartition",
    )
    .fetch_one(s.store.pool())
    .await
    .unwrap();
    assert_eq!(tables, 0);
    s.drop().await;
}

/// A maintenance down for longer than the partitions ahead cover: markers of the buckets past the end are
/// released as unplaced meanwhile, and the first rotation after it creates every bucket from the oldest kept
/// one, those it missed included, so their copies apply once they come back (it created from now's bucket
/// only, and a copy of a missed bucket then failed on insert, retried until dead-lettered).
#[tokio::test]
async fn after_a_maintenance_outage_the_rotation_creates_the_buckets_it_missed() {
    let s = Schema::kept_two_days().await;
    let today = next_midnight() - Cd::days(1);
    // Partitions from today - 2 to today + 3; an event of today + 4 has none yet.
    let missed = today + Cd::days(4) + Cd::hours(12);
    let id = identity("evt-late", None);
    // A worker whose clock reads that time, the maintenance down since today.
    let a = insert_at(&s.store, &id, "h", missed, missed).await;
    assert!(matches!(a, MarkerInsert::Unplaced(_)), "{a:?}");
    // The maintenance comes back six days later.
    let back = today + Cd::days(6) + Cd::hours(1);
    let r = rotate(&s, back).await;
    assert!(r.created[&Table::Markers] >= 2, "{r:?}");
    assert_eq!(
        insert(&s.store, &id, "h", missed).await,
        MarkerInsert::Inserted,
        "the missed bucket has its partition"
    );
    // Every bucket from the oldest kept one to the end exists, each once.
    let buckets: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass('txinbox_inbox') ORDER BY 1",
    )
    .fetch_all(s.store.pool())
    .await
    .unwrap();
    let expected: Vec<String> = (4..10)
        .map(|d| {
            format!(
                "txinbox_inbox_p{}",
                (today + Cd::days(d)).format("%Y%m%dt%H%M%S")
            )
        })
        .collect();
    assert_eq!(buckets, expected);
    s.drop().await;
}

/// A keep too long for a date ("for ever") drops nothing and fails nothing.
#[tokio::test]
async fn a_keep_of_for_ever_drops_nothing() {
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let opts = MaintenanceOptions::default()
        .rejections_keep(Duration::MAX)
        .effects_keep(Duration::MAX);
    let before = s.partitions("txinbox_rejections").await;
    let p = s
        .store
        .rotate_partitions(Utc::now() + Cd::days(40), &opts)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.dropped[&Table::Rejections], 0, "{p:?}");
    assert_eq!(p.dropped[&Table::Effects], 0, "{p:?}");
    assert!(s.partitions("txinbox_rejections").await >= before);
    let report = Maintenance::new(s.store.clone())
        .options(opts)
        .run_once_at(Utc::now() + Cd::days(40), &mut |_| {})
        .await;
    assert_eq!(report.error, None);
    s.drop().await;
}

#[tokio::test]
async fn markers_of_the_row_by_row_layout_stay_duplicates_until_their_table_expires() {
    let s = Schema::new().await;
    let id = identity("evt-legacy", Some("task:legacy"));
    // Written in the row-by-row layout.
    assert_eq!(
        insert(&s.store, &id, "h", Utc::now()).await,
        MarkerInsert::Inserted
    );
    sqlx::query("INSERT INTO txinbox_rejections (consumer_name, source, message_id, kind, business_key, payload_hash, conflicts_with, detail, recorded_at) VALUES ('c', 'crm', 'x', 'payload_collision', NULL, 'h', 'evt', 'd', now())")
        .execute(s.store.pool())
        .await
        .unwrap();
    let r = s.store.partition(&PartitionOptions::new()).await.unwrap();
    assert!(r.legacy_kept && r.rejections_copied == 1, "{r:?}");
    // A copy after the conversion, whatever its origin: the frozen table holds its marker.
    let a = insert(&s.store, &id, "h", Utc::now()).await;
    assert!(
        matches!(&a, MarkerInsert::Conflict(Some(h)) if h.is_same_message("h")),
        "{a:?}"
    );
    // Another id with its business key too.
    let a = insert(
        &s.store,
        &identity("evt-other", Some("task:legacy")),
        "h2",
        Utc::now(),
    )
    .await;
    assert!(
        matches!(&a, MarkerInsert::Conflict(Some(h)) if !h.same_identity),
        "{a:?}"
    );
    // Rotation before the legacy markers expire keeps the table; after, drops it.
    let p = rotate(&s, Utc::now()).await;
    assert!(!p.legacy_dropped);
    let p = rotate(&s, Utc::now() + Cd::days(31)).await;
    assert!(p.legacy_dropped);
    let gone: bool = sqlx::query_scalar("SELECT to_regclass('txinbox_inbox_legacy') IS NULL")
        .fetch_one(s.store.pool())
        .await
        .unwrap();
    assert!(gone);
    // The evidence row was copied into the partitioned table.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM txinbox_rejections")
        .fetch_one(s.store.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    s.drop().await;
}

#[tokio::test]
async fn options_the_layout_cannot_use_are_refused_with_one_line() {
    let s = Schema::new().await;
    for (opts, says) in [
        (
            PartitionOptions::new().width(Duration::from_secs(10)),
            "width",
        ),
        (PartitionOptions::new().ahead(0), "ahead"),
        (PartitionOptions::new().keep(Duration::ZERO), "keep"),
    ] {
        let e = s.store.partition(&opts).await.unwrap_err().to_string();
        assert!(e.contains(says) && !e.contains('\n'), "{e}");
    }
    assert!(!s.store.is_partitioned().await.unwrap());
    s.drop().await;
}

// Current-thread runtime: the windows capture metrics with a thread-local recorder.
#[tokio::test(flavor = "current_thread")]
async fn every_failure_window_holds_on_the_partitioned_layout() {
    use txinbox_lab::lab::Target;
    use txinbox_lab::windows::{run_all_batch, Window};
    let target = Target::Postgres(txinbox_testkit::pg_url())
        .partitioned()
        .unwrap();
    let rows = run_all_batch(&target, 10).await.unwrap();
    let mut failed = Vec::new();
    for r in &rows {
        println!("{r}");
        if !r.ok() {
            failed.push(r.to_string());
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
    let boundary = rows
        .iter()
        .find(|r| r.window == Window::CopyAfterPartitionBoundary)
        .expect("the partitioned layout's own window ran");
    assert_eq!((boundary.inbox_rows, boundary.business_effects), (2, 2));
    let retention = rows
        .iter()
        .find(|r| r.window == Window::AfterRetentionExpired)
        .unwrap();
    assert_eq!(
        retention.inbox_rows, 0,
        "the marker went with its partition: {retention}"
    );
    assert_eq!(
        rows.len(),
        Window::ALL.len() + Window::PARTITIONED.len() + Window::BATCH.len()
    );
}

/// Through the pipeline: a delivery the broker enqueued just now whose event `time` lies in a dropped
/// partition is dead-lettered `retention_expired` (an earlier copy's marker may have gone with it); one whose
/// `time` lies past the partitions made so far while the maintenance is behind is released for a retry and
/// counted; one whose `time` lies past any partition the maintenance makes by now (its `ahead` past today) is
/// dead-lettered `event_time_in_future`, never released for good; none writes anything.
#[tokio::test(flavor = "current_thread")]
async fn the_pipeline_refuses_an_expired_bucket_and_releases_a_missing_one() {
    use txinbox_core::broker::mem::{MemoryQueue, QueueOptions};
    use txinbox_lab::labdb::LabStore;
    let (metrics, _guard) = txinbox_testkit::MetricTotals::install_local();
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    s.store.create_tables().await.unwrap();
    let p = txinbox_lab::lab::lab_processor(
        s.store.clone(),
        txinbox_lab::lab::task_handler::<Store<sqlx::Postgres>>(),
    );
    let q = MemoryQueue::new(QueueOptions::default());
    let at = |days: i64| (Utc::now() + Cd::days(days)).to_rfc3339();
    q.send(txinbox_lab::lab::lab_message(0).attribute("ce-time", at(-40)));
    let o = p.process_one(q.receive_now(1).pop().unwrap()).await;
    assert_eq!(o.label(), "dead_lettered");
    assert!(o.to_string().contains("retention_expired"), "{o}");
    // Default layout: buckets of a day, 3 ahead, so partitions exist to the end of today + 3 days. Past
    // them, by a producer's wrong clock, a retry would wait days for a partition: dead-lettered.
    q.send(txinbox_lab::lab::lab_message(1).attribute("ce-time", at(9)));
    let o = p.process_one(q.receive_now(1).pop().unwrap()).await;
    let txinbox_core::Outcome::DeadLettered { reason, detail } = &o else {
        panic!("not dead-lettered: {o}")
    };
    assert_eq!(reason, "event_time_in_future", "{detail}");
    // The maintenance behind (the layout's partitions end with today, as read by a worker that opens now):
    // a time within its `ahead` waits for the partition the next pass makes.
    sqlx::query(
        "UPDATE txinbox_partition_layout SET high = date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 day' WHERE tbl = 'txinbox_inbox'",
    )
    .execute(s.store.pool())
    .await
    .unwrap();
    let behind = Store::<sqlx::Postgres>::connect_with(
        &txinbox_testkit::pg_url(),
        StoreOptions::new().schema(&s.name).max_connections(2),
    )
    .await
    .unwrap();
    let pb = txinbox_lab::lab::lab_processor(
        behind.clone(),
        txinbox_lab::lab::task_handler::<Store<sqlx::Postgres>>(),
    );
    q.send(txinbox_lab::lab::lab_message(3).attribute("ce-time", at(2)));
    let o = pb.process_one(q.receive_now(1).pop().unwrap()).await;
    let txinbox_core::Outcome::Retry { reason } = &o else {
        panic!("not released: {o}")
    };
    assert!(reason.contains("no partition yet"), "{reason}");
    behind.close().await;
    assert_eq!(
        metrics.counter(
            "txinbox_partition_missing_total",
            &[("consumer", "crm-followup")]
        ),
        1
    );
    assert_eq!(
        metrics.counter(
            "txinbox_retention_expired_total",
            &[("consumer", "crm-followup")]
        ),
        1
    );
    assert_eq!(s.markers().await, 0);
    assert_eq!(s.store.count_tasks().await.unwrap(), 0);
    // An event `time` that is not RFC 3339 is no event time: the layout cannot place the message, which is
    // dead-lettered with its reason, nothing written (a queue of its own: the released delivery above is
    // visible again on the first).
    let q = MemoryQueue::new(QueueOptions::default());
    q.send(txinbox_lab::lab::lab_message(2).attribute("ce-time", "yesterday"));
    let o = p.process_one(q.receive_now(1).pop().unwrap()).await;
    let txinbox_core::Outcome::DeadLettered { reason, detail } = &o else {
        panic!("not dead-lettered: {o}")
    };
    assert_eq!(reason, "no_event_time", "{detail}");
    assert_eq!(s.markers().await, 0);
    // Converted with broker time allowed, the same message is placed by its enqueue time and applied.
    let t = Schema::new().await;
    let _ = t
        .store
        .partition(&PartitionOptions::new().broker_time(true))
        .await
        .unwrap();
    t.store.create_tables().await.unwrap();
    let p = txinbox_lab::lab::lab_processor(
        t.store.clone(),
        txinbox_lab::lab::task_handler::<Store<sqlx::Postgres>>(),
    );
    q.send(txinbox_lab::lab::lab_message(2).attribute("ce-time", "yesterday"));
    let o = p.process_one(q.receive_now(1).pop().unwrap()).await;
    assert_eq!(o.label(), "applied", "{o}");
    t.drop().await;
    s.drop().await;
}

/// An effect row written straight into the table, created at `created`, in `state`, finished at `finished`.
async fn effect_row(
    store: &Store<sqlx::Postgres>,
    key: &str,
    state: &str,
    created: DateTime<Utc>,
    finished: Option<DateTime<Utc>>,
) -> i64 {
    sqlx::query_scalar("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at, finished_at) VALUES ('c', $1, $1, 'crm', 'crm', '\\x00', '{}', $1, $2, $3, $3, $3, $4) RETURNING id")
        .bind(key)
        .bind(state)
        .bind(created)
        .bind(finished)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn effects_leave_with_their_partition_once_every_one_is_finished() {
    let s = Schema::new().await;
    // One effect from before the conversion: copied into the partitioned table, its id sequence kept.
    let old = Utc::now() - Cd::days(2);
    let before = effect_row(&s.store, "k-before", "done", old, Some(old)).await;
    let before_idx: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'txinbox_effects' ORDER BY 1",
    )
    .fetch_all(s.store.pool())
    .await
    .unwrap();
    let r = s.store.partition(&PartitionOptions::new()).await.unwrap();
    assert_eq!(r.effects_copied, 1, "{r:?}");
    // Every index of the row-by-row table is there again under its name, the unique one with the partition
    // key added, plus the index of the effects not done.
    let after_idx: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'txinbox_effects' ORDER BY 1",
    )
    .fetch_all(s.store.pool())
    .await
    .unwrap();
    let names: Vec<&str> = after_idx.iter().map(|(n, _)| n.as_str()).collect();
    for n in &before_idx {
        assert!(names.contains(&n.as_str()), "{n} missing from {names:?}");
    }
    assert!(names.contains(&"txinbox_effects_open"), "{names:?}");
    let unique = after_idx
        .iter()
        .find(|(n, _)| n == "txinbox_effects_idempotency_key_key")
        .map(|(_, d)| d.as_str())
        .unwrap_or_default();
    assert!(unique.contains("(idempotency_key, created_at)"), "{unique}");
    assert_eq!(s.partitions("txinbox_effects").await, 3 + 3);
    let created = Utc::now();
    let after = effect_row(&s.store, "k-after", "failed", created, None).await;
    assert!(
        after > before,
        "the id sequence goes on: {before} then {after}"
    );
    // The idempotency key's unique index holds with its creation time (the store's insert does nothing).
    let dup = sqlx::query("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at) VALUES ('c', 'm', 'k-after', 'crm', 'crm', '\\x00', '{}', 'r', 'pending', $1, $1, $1) ON CONFLICT DO NOTHING")
        .bind(created)
        .execute(s.store.pool())
        .await
        .unwrap();
    assert_eq!(dup.rows_affected(), 0);
    // Eight days on (effects kept 7): the partition of two days ago holds only a done effect and goes; today's
    // holds a failed one, kept for an operator.
    let later = Utc::now() + Cd::days(8);
    let p = rotate(&s, later).await;
    assert!(p.dropped[&Table::Effects] >= 1, "{p:?}");
    assert_eq!(p.held[&Table::Effects], 1, "{p:?}");
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM txinbox_effects ORDER BY id")
        .fetch_all(s.store.pool())
        .await
        .unwrap();
    assert_eq!(ids, vec![after]);
    // No row by row either: the effects' purge deletes nothing on the partitioned layout.
    use txinbox_core::effects::EffectStore;
    assert_eq!(s.store.purge_done_effects(later, 100).await.unwrap(), 0);
    // Once an operator's retry made it done long enough ago, its partition goes too.
    sqlx::query("UPDATE txinbox_effects SET state = 'done', finished_at = $1")
        .bind(Utc::now())
        .execute(s.store.pool())
        .await
        .unwrap();
    let p = rotate(&s, later).await;
    assert_eq!(
        (p.dropped[&Table::Effects], p.held[&Table::Effects]),
        (1, 0),
        "{p:?}"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM txinbox_effects")
        .fetch_one(s.store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0);
    s.drop().await;
}

/// A transaction that began in the bucket before the conversion's (its `now()`, which dates its evidence and
/// its effects, just before midnight) and writes after the conversion finds a partition: the conversion makes
/// the bucket before now's too. Empty evidence and effects tables were partitioned from now's bucket only, and
/// such a write failed with "no partition of relation ... found for row" (seen as a test inserting an effect
/// dated five minutes back, run just after midnight).
#[tokio::test]
async fn a_write_dated_just_before_the_conversions_bucket_finds_a_partition() {
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let midnight = Utc::now()
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc();
    let just_before = midnight - Cd::seconds(1);
    effect_row(&s.store, "k-late", "pending", just_before, None).await;
    sqlx::query("INSERT INTO txinbox_rejections (consumer_name, source, message_id, kind, payload_hash, conflicts_with, detail, recorded_at) VALUES ('c', 's', 'm', 'payload_collision', 'h', 'h2', 'd', $1)")
        .bind(just_before)
        .execute(s.store.pool())
        .await
        .expect("the evidence of the bucket before the conversion's has a partition");
    for (table, dated) in [
        ("txinbox_effects", "created_at"),
        ("txinbox_rejections", "recorded_at"),
    ] {
        let n: i64 =
            sqlx::query_scalar(&format!("SELECT count(*) FROM {table} WHERE {dated} < $1"))
                .bind(midnight)
                .fetch_one(s.store.pool())
                .await
                .unwrap();
        assert_eq!(n, 1, "{table}");
    }
    s.drop().await;
}

/// One node rotates at a time: while another session holds the rotation's lock of this schema, a pass does
/// nothing and says so; once it is released, the pass rotates. The lock of another schema does not stop it.
#[tokio::test]
async fn one_node_rotates_at_a_time() {
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let mut other = sqlx::PgConnection::connect(&txinbox_testkit::pg_url())
        .await
        .unwrap();
    let held: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(741823091, hashtext($1))")
        .bind(&s.name)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(held);
    let elsewhere = Schema::new().await;
    let _ = elsewhere
        .store
        .partition(&PartitionOptions::new())
        .await
        .unwrap();
    let p = rotate(&elsewhere, Utc::now()).await;
    assert!(
        !p.skipped,
        "another schema's rotation waited for this one's lock: {p:?}"
    );
    elsewhere.drop().await;
    let later = Utc::now() + Cd::days(40);
    let p = rotate(&s, later).await;
    assert!(p.skipped && p.dropped.is_empty(), "{p:?}");
    assert_eq!(s.partitions("txinbox_inbox").await, 30 + 1 + 3);
    sqlx::query("SELECT pg_advisory_unlock(741823091, hashtext($1))")
        .bind(&s.name)
        .execute(&mut other)
        .await
        .unwrap();
    let p = rotate(&s, later).await;
    assert!(!p.skipped && p.dropped[&Table::Markers] > 0, "{p:?}");
    s.drop().await;
}

/// A store that last read the row-by-row layout (a maintenance started before the conversion, not restarted)
/// purges by retention row by row: it deletes the expired marker only, never a marker of another partition
/// that sits at the same place in its own table.
#[tokio::test]
async fn a_row_by_row_purge_on_partitions_deletes_only_expired_markers() {
    let s = Schema::new().await;
    let now = Utc::now();
    // The maintenance's store reads the row-by-row layout.
    assert!(s
        .store
        .purge_batch(Table::Markers, now, 100)
        .await
        .unwrap()
        .is_empty());
    // Another process converts the inbox.
    let converter = Store::<sqlx::Postgres>::connect_with(
        &txinbox_testkit::pg_url(),
        StoreOptions::new().schema(&s.name).max_connections(1),
    )
    .await
    .unwrap();
    let _ = converter
        .partition(&PartitionOptions::new().keep(Duration::from_secs(2 * DAY as u64)))
        .await
        .unwrap();
    // Yesterday's event, past its retention; today's, kept for 30 days: each the first row of its partition.
    for (id, origin, until) in [
        ("expired", now - Cd::days(1), now - Cd::hours(1)),
        ("live", now, now + Cd::days(30)),
    ] {
        let id = timed(&identity(id, None), origin);
        let row = MarkerRow::new(&id, "h", now, now, until, 1).origin_at(origin);
        let tx = converter.begin().await.unwrap();
        assert_eq!(
            converter.insert_marker(&tx, &row).await.unwrap(),
            MarkerInsert::Inserted
        );
        converter.commit(tx).await.unwrap();
    }
    converter.close().await;
    let purged = s.store.purge_batch(Table::Markers, now, 100).await.unwrap();
    assert!(purged.len() <= 1, "{purged:?}");
    let left: Vec<String> = sqlx::query_scalar("SELECT message_id FROM txinbox_inbox")
        .fetch_all(s.store.pool())
        .await
        .unwrap();
    assert!(
        left.iter().any(|m| m == "live"),
        "the live marker is kept: {left:?}"
    );
    s.drop().await;
}

/// A rotation given up half way (the maintenance's pass cut at shutdown, or a node that stops rotating but
/// keeps its store) lets its lock go: another node rotates again, instead of skipping for as long as the
/// pooled connection that held the lock lives.
#[tokio::test]
async fn a_rotation_dropped_half_way_lets_its_lock_go() {
    use std::future::Future;
    use std::task::{Context, Poll};
    let s = Schema::kept_two_days().await;
    let opts = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(
        &txinbox_testkit::pg_url(),
    )
    .unwrap()
    .options([("search_path", format!("\"{}\"", s.name))]);
    let connect = || async { sqlx::ConnectOptions::connect(&opts).await.unwrap() };
    // Another session holds the layout's rows: the rotation waits in its update of `high`, lock held.
    let mut blocker = connect().await;
    let mut hold = blocker.begin().await.unwrap();
    sqlx::query("SELECT tbl FROM txinbox_partition_layout FOR UPDATE")
        .fetch_all(&mut *hold)
        .await
        .unwrap();
    let mut probe = connect().await;
    {
        let maintenance = MaintenanceOptions::default();
        let rotation = s.store.rotate_partitions(Utc::now(), &maintenance);
        let mut rotation = std::pin::pin!(rotation);
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Poll::Ready(r) = rotation.as_mut().poll(&mut cx) {
                panic!("the rotation finished while the layout was held: {r:?}");
            }
            if rotation_lock_held(&mut probe).await {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the rotation never took its lock"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    hold.rollback().await.unwrap();
    // Another node takes the lock.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mine: bool = sqlx::query_scalar(
            "SELECT pg_try_advisory_lock(741823091, hashtext(current_schema()))",
        )
        .fetch_one(&mut probe)
        .await
        .unwrap();
        if mine {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the dropped rotation's lock is still held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((probe, blocker));
    s.drop().await;
}

/// Whether a session holds the rotation's lock of `conn`'s schema.
async fn rotation_lock_held(conn: &mut sqlx::PgConnection) -> bool {
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 741823091 AND objid::int = hashtext(current_schema()) AND granted")
        .fetch_one(conn)
        .await
        .unwrap()
        > 0
}

/// A batch whose rows meet each other, on the partitioned layout: the first row is refused by a marker
/// already there (its business key), the second, of the first row's identity, goes in. The first is answered
/// with the marker it met, as one insert after the other names it, never with the batch's later row.
#[tokio::test]
async fn a_batch_row_refused_before_a_later_one_names_the_holder_it_met() {
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let now = Utc::now();
    let (holder, keyed, plain) = (
        timed(&identity("a", Some("k")), now),
        timed(&identity("b", Some("k")), now),
        timed(&identity("b", None), now),
    );
    assert_eq!(
        insert(&s.store, &holder, "h", now).await,
        MarkerInsert::Inserted
    );
    let tx = s.store.begin().await.unwrap();
    let rows = [
        MarkerRow::new(&keyed, "h", now, now, now + Cd::days(30), 1).origin_at(now),
        MarkerRow::new(&plain, "h", now, now, now + Cd::days(30), 1).origin_at(now),
    ];
    let answers = s.store.insert_markers(&tx, &rows).await.unwrap();
    s.store.commit(tx).await.unwrap();
    match &answers[..] {
        [MarkerInsert::Conflict(Some(h)), MarkerInsert::Inserted] => {
            assert!(!h.same_identity, "{h:?}");
            assert_eq!(h.message_id, "a");
        }
        other => panic!("{other:?}"),
    }
    s.drop().await;
}

/// A re-send of an event with its id and another `time` in another bucket is another message on the
/// partitioned layout (documented), and each keeps its own result reference: the second's handler wrote its
/// reference on every marker of the identity, the first message's in its own partition too, so a later copy
/// of the first was answered with the re-send's result (found by the layouts' property test).
#[tokio::test]
async fn a_result_reference_goes_to_the_marker_of_its_own_partition() {
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let now = Utc::now();
    let (first, resent) = (now, now - Cd::days(1));
    let id = identity("evt-ref", None);
    for (origin, reference) in [(first, "first"), (resent, "resent")] {
        let id = timed(&id, origin);
        let row = MarkerRow::new(&id, "h", now, now, now + Cd::days(30), 1).origin_at(origin);
        let tx = s.store.begin().await.unwrap();
        assert_eq!(
            s.store.insert_marker(&tx, &row).await.unwrap(),
            MarkerInsert::Inserted
        );
        s.store
            .record_result(&tx, &id, Some(reference), &[])
            .await
            .unwrap();
        s.store.commit(tx).await.unwrap();
    }
    let refs: Vec<Option<String>> =
        sqlx::query_scalar("SELECT result_reference FROM txinbox_inbox ORDER BY origin_bucket")
            .fetch_all(s.store.pool())
            .await
            .unwrap();
    assert_eq!(refs, [Some("resent".to_owned()), Some("first".to_owned())]);
    s.drop().await;
}

/// What an operator and the maintenance read of consumer `c`'s markers and of message `evt-frozen`: the
/// inbox's rows, the table figures, the stats' rows, the consumers listed, the message's markers with and
/// without its source.
async fn marker_figures(store: &Store<sqlx::Postgres>) -> (i64, i64, i64, usize, usize, usize) {
    let now = Utc::now();
    let stats = store.consumer_stats(Some("c"), now).await.unwrap();
    (
        store.inbox_rows("c").await.unwrap(),
        store.table_stats(Table::Markers, "c").await.unwrap().0,
        stats[0].inbox_rows,
        store.consumer_stats(None, now).await.unwrap().len(),
        store
            .message_story("c", "evt-frozen", None)
            .await
            .unwrap()
            .markers
            .len(),
        store
            .message_story("c", "evt-frozen", Some("crm"))
            .await
            .unwrap()
            .markers
            .len(),
    )
}

/// The markers of the row-by-row layout stay in the frozen table after the conversion and still decide
/// duplicates: the operator queries (stats, show, the inbox's rows) and the maintenance's table figures count
/// them too, where they read the partitioned table alone and showed no marker for a message whose copies
/// were refused as duplicates (found by the layouts' property test).
#[tokio::test]
async fn markers_of_the_frozen_table_are_in_the_operator_figures() {
    let s = Schema::new().await;
    let id = identity("evt-frozen", None);
    assert_eq!(
        insert(&s.store, &id, "h", Utc::now()).await,
        MarkerInsert::Inserted
    );
    assert_eq!(marker_figures(&s.store).await, (1, 1, 1, 1, 1, 1));
    let r = s.store.partition(&PartitionOptions::new()).await.unwrap();
    assert!(r.legacy_kept, "{r:?}");
    assert_eq!(marker_figures(&s.store).await, (1, 1, 1, 1, 1, 1));
    assert_eq!(
        insert(&s.store, &identity("evt-new", None), "h", Utc::now()).await,
        MarkerInsert::Inserted
    );
    assert_eq!(marker_figures(&s.store).await, (2, 2, 2, 1, 1, 1));
    // Once the frozen table is dropped (its last marker expired), only the partitioned table counts.
    let p = rotate(&s, Utc::now() + Cd::days(31)).await;
    assert!(p.legacy_dropped, "{p:?}");
    assert_eq!(marker_figures(&s.store).await.4, 0);
    s.drop().await;
}

/// A copy of a message applied after the conversion, now carrying a business key a marker of the frozen
/// row-by-row table holds: the message's own marker answers it (a duplicate of itself), as the row-by-row
/// layout's holder lookup puts a marker of the same identity before one of the business key; the frozen
/// table was looked up first and answered with its business-key holder, so the copy was a business duplicate
/// of another message, with that message's result (found by the layouts' property test).
#[tokio::test]
async fn a_copy_meets_its_own_marker_before_a_frozen_business_key() {
    let s = Schema::new().await;
    assert_eq!(
        insert(&s.store, &identity("a", Some("k1")), "h", Utc::now()).await,
        MarkerInsert::Inserted
    );
    let r = s.store.partition(&PartitionOptions::new()).await.unwrap();
    assert!(r.legacy_kept, "{r:?}");
    let origin = Utc::now();
    assert_eq!(
        insert(&s.store, &identity("evt-1", None), "h", origin).await,
        MarkerInsert::Inserted
    );
    let a = insert(&s.store, &identity("evt-1", Some("k1")), "h", origin).await;
    let MarkerInsert::Conflict(Some(h)) = &a else {
        panic!("the copy was not refused: {a:?}")
    };
    assert!(
        h.same_identity && h.message_id == "evt-1" && h.is_same_message("h"),
        "{h:?}"
    );
    // A new message with that business key still meets the frozen table's holder.
    let b = insert(&s.store, &identity("evt-2", Some("k1")), "h", origin).await;
    assert!(
        matches!(&b, MarkerInsert::Conflict(Some(h)) if !h.same_identity && h.message_id == "a"),
        "{b:?}"
    );
    s.drop().await;
}

/// A destination that counts the compensations it is asked for, by reference.
#[derive(Clone, Default)]
struct Undo(std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>);

impl txinbox_core::effects::EffectExecutor for Undo {
    fn execute<'a>(
        &'a self,
        _: &'a txinbox_core::effects::ClaimedEffect,
    ) -> txinbox_core::effects::BoxFuture<'a, txinbox_core::effects::Execution> {
        Box::pin(async { unreachable!("no effect is run here") })
    }
    fn confirm<'a>(
        &'a self,
        _: &'a txinbox_core::effects::ClaimedEffect,
    ) -> txinbox_core::effects::BoxFuture<'a, txinbox_core::effects::Confirmation> {
        Box::pin(async { unreachable!("no effect is confirmed here") })
    }
    fn compensate<'a>(
        &'a self,
        e: &'a txinbox_core::effects::ClaimedEffect,
    ) -> txinbox_core::effects::BoxFuture<'a, Result<(), txinbox_core::effects::BoxError>> {
        self.0.lock().unwrap().push(e.reference.clone());
        Box::pin(async { Ok(()) })
    }
}

/// A re-send in another bucket is another message there (documented) and records its effects again: a second
/// effect row with the first's idempotency key (the key's unique index holds the creation time). A look-up by
/// the key returned either row, as the scan met them (the older one); it is now the newest by creation time,
/// `find_effects` lists both, oldest first, and an operator's compensation undoes the one effect the destination
/// holds for the key once and marks both rows compensated (it marked one, leaving the other done).
#[tokio::test]
async fn two_effects_of_one_key_are_found_newest_first_and_compensated_once() {
    use txinbox_core::effects::{EffectRunner, EffectState, EffectStore};
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let now = Utc::now();
    let first = effect_row(&s.store, "k-two", "done", now - Cd::minutes(5), Some(now)).await;
    let resent = effect_row(&s.store, "k-two", "done", now, Some(now)).await;
    // The destination deduplicated the re-send's call on the key: both rows hold the first's task.
    sqlx::query("UPDATE txinbox_effects SET result_reference = 'task-1'")
        .execute(s.store.pool())
        .await
        .unwrap();
    let found = s.store.find_effect("k-two").await.unwrap().unwrap();
    assert_eq!(found.id, resent, "the newest of the key's effects");
    let all: Vec<i64> = s
        .store
        .find_effects("k-two")
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(all, [first, resent]);
    let undo = Undo::default();
    let runner = EffectRunner::new(s.store.clone()).executor("crm", undo.clone());
    assert_eq!(
        runner.compensate("k-two").await.unwrap(),
        EffectState::Compensated
    );
    assert_eq!(*undo.0.lock().unwrap(), [Some("task-1".to_owned())]);
    let states: Vec<String> = sqlx::query_scalar("SELECT state FROM txinbox_effects ORDER BY id")
        .fetch_all(s.store.pool())
        .await
        .unwrap();
    assert_eq!(states, ["compensated", "compensated"]);
    s.drop().await;
}

/// A default partition added by hand to any of the three tables is refused, by the rotation and by the
/// layout's status, with one line that names the table and the partition and says what to do; nothing is
/// created meanwhile. Without the refusal an empty default let the rotation go on, while it swallowed the
/// rows of every bucket without a partition (a marker there is out of its bucket's unique index, and never
/// dropped), and one holding a row of a bucket to create failed every rotation with PostgreSQL's own error.
/// Detached, and its rows moved back, the rotation goes on.
#[tokio::test]
async fn a_default_partition_added_by_hand_is_refused_with_what_to_do() {
    for (parent, with_row) in [
        ("txinbox_inbox", false),
        ("txinbox_rejections", false),
        ("txinbox_effects", true),
    ] {
        let s = Schema::kept_two_days().await;
        let by_hand = format!("{parent}_by_hand");
        sqlx::Executor::execute(
            s.store.pool(),
            format!("CREATE TABLE {by_hand} PARTITION OF {parent} DEFAULT").as_str(),
        )
        .await
        .unwrap();
        // An effect of a bucket that has no partition yet: it lands in the default one.
        let at = Utc::now() + Cd::days(if with_row { 10 } else { 0 });
        if with_row {
            effect_row(&s.store, "k-default", "pending", at, None).await;
        }
        let before = (
            s.partitions("txinbox_inbox").await,
            s.partitions("txinbox_rejections").await,
            s.partitions("txinbox_effects").await,
        );
        let e = s
            .store
            .rotate_partitions(at, &MaintenanceOptions::default())
            .await
            .expect_err("a rotation beside a default partition");
        let line = e.to_string();
        assert!(!line.contains('\n'), "{line}");
        match &e {
            StoreError::DefaultPartition { table, partition } => {
                assert_eq!(
                    (table.as_str(), partition.as_str()),
                    (parent, by_hand.as_str())
                );
            }
            other => panic!("{parent}: not the refusal: {other:?} ({line})"),
        }
        assert!(
            line.contains(&format!("ALTER TABLE {parent} DETACH PARTITION {by_hand}")),
            "{line}"
        );
        let after = (
            s.partitions("txinbox_inbox").await,
            s.partitions("txinbox_rejections").await,
            s.partitions("txinbox_effects").await,
        );
        assert_eq!(
            before, after,
            "{parent}: the refused rotation changed nothing"
        );
        let status = s.store.partition_status().await;
        assert!(
            matches!(&status, Err(StoreError::DefaultPartition { table, .. }) if table == parent),
            "{status:?}"
        );
        // What the line says to do: detached, the rotation goes on; its rows then go back in.
        sqlx::Executor::execute(
            s.store.pool(),
            format!("ALTER TABLE {parent} DETACH PARTITION {by_hand}").as_str(),
        )
        .await
        .unwrap();
        rotate(&s, at).await;
        let moved = sqlx::query(&format!("INSERT INTO {parent} SELECT * FROM {by_hand}"))
            .execute(s.store.pool())
            .await
            .unwrap();
        assert_eq!(moved.rows_affected(), u64::from(with_row), "{parent}");
        assert!(s.store.partition_status().await.unwrap().is_some());
        s.drop().await;
    }
}

/// Converted with broker time allowed, a message with neither a CloudEvents `time` nor a broker enqueue time
/// (a broker adapter that tells none) is dead-lettered `no_event_time`, nothing written, as without the
/// option: its receive time differs per delivery, and placed by it, a redelivery a day later went to another
/// partition, out of reach of the first copy's marker, and both copies applied.
#[tokio::test(flavor = "current_thread")]
async fn with_broker_time_a_message_without_any_origin_time_is_dead_lettered() {
    use txinbox_core::broker::mem::{MemoryQueue, QueueOptions};
    use txinbox_lab::labdb::LabStore;
    let s = Schema::new().await;
    let _ = s
        .store
        .partition(&PartitionOptions::new().broker_time(true))
        .await
        .unwrap();
    s.store.create_tables().await.unwrap();
    let p = txinbox_lab::lab::lab_processor(
        s.store.clone(),
        txinbox_lab::lab::task_handler::<Store<sqlx::Postgres>>(),
    );
    let q = MemoryQueue::new(QueueOptions::default());
    let mut sent = txinbox_lab::lab::lab_message(5);
    sent.attributes.remove("ce-time");
    q.send(sent);
    let mut m = txinbox_core::Delivery::message(&q.receive_now(1).pop().unwrap()).clone();
    assert_eq!(m.attributes.get("ce-time"), None);
    m.enqueued_at = None;
    // The first delivery yesterday, its redelivery today: two receive times, two buckets.
    for received in [Utc::now() - Cd::days(1), Utc::now()] {
        m.received_at = received;
        let o = p
            .process_one(txinbox_testkit::NoopDelivery(m.clone()))
            .await;
        let txinbox_core::Outcome::DeadLettered { reason, detail } = &o else {
            panic!("not dead-lettered: {o}")
        };
        assert_eq!(reason, "no_event_time", "{detail}");
    }
    assert_eq!(s.markers().await, 0);
    assert_eq!(s.store.count_tasks().await.unwrap(), 0);
    s.drop().await;
}

/// The conversion lays the partitions out from the database's clock, as the rotation, the claims and the due
/// times are read: it took the clock of the host it ran on (an operator's `txinbox inbox partition`), so a host
/// whose clock was days off the database's made the markers' range from its own now: ahead, the buckets of the
/// last days of the keep were counted as dropped, and copies of their messages refused while their markers were
/// still kept; behind, no partition reached the database's today, and every delivery was released until a
/// rotation. Here the database's clock is 10 days behind the host's (a `now()` of the schema's own, found before
/// `pg_catalog`'s on the `search_path`), and the range follows it.
#[tokio::test]
async fn the_conversion_lays_partitions_out_by_the_database_s_clock() {
    let s = Schema::new().await;
    let behind = s.clock_behind_by_ten_days().await;
    let db_now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(behind.pool())
        .await
        .unwrap();
    assert!(
        db_now < Utc::now() - Cd::days(9),
        "the schema's clock is behind: {db_now}"
    );
    let _ = behind.partition(&PartitionOptions::new()).await.unwrap();
    let status = behind
        .partition_status()
        .await
        .unwrap()
        .expect("partitioned");
    behind.close().await;
    s.drop().await;
    // A day wide, 3 ahead, kept 30 days: from the bucket of 30 days before the database's now to 4 buckets
    // past its bucket.
    assert!(
        status.high > db_now && status.high <= db_now + Cd::days(4),
        "{status} (database's now {db_now})"
    );
    assert!(status.low <= db_now - Cd::days(30), "{status}");
}

/// The workers' maintenance decides which markers have expired by the database's clock, not by its host's: a
/// worker whose clock ran ahead purged markers the database still counted as kept, while copies of their
/// messages could still come back (and were then applied again). Here the database's clock is 10 days behind
/// the host's (a `now()` of the schema's own, found before `pg_catalog`'s on the `search_path`), and a marker
/// whose retention ended an hour ago by the host's clock stays (seen failing without `MaintenanceStore::clock`:
/// the pass removed it); past its retention by the database's clock, it goes.
#[tokio::test]
async fn the_maintenance_purges_markers_by_the_database_s_clock() {
    let s = Schema::new().await;
    let behind = s.clock_behind_by_ten_days().await;
    let host_now = Utc::now();
    // Kept 30 days from its processing: until an hour ago by the host's clock.
    let id = identity("evt-clock", None);
    let processed = host_now - Cd::days(30) - Cd::hours(1);
    assert_eq!(
        insert_at(&behind, &id, "h", processed, processed).await,
        MarkerInsert::Inserted
    );
    let report = Maintenance::new(behind.clone()).run_once().await;
    assert_eq!(report.error, None);
    let left = |store: Store<sqlx::Postgres>| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM txinbox_inbox")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    assert_eq!(
        (
            report.removed_from(Table::Markers),
            left(behind.clone()).await
        ),
        (0, 1),
        "the database's clock says the marker is kept for 10 days more"
    );
    // A pass at a time past its retention removes it.
    let report = Maintenance::new(behind.clone())
        .run_once_at(host_now + Cd::days(1), &mut |_| {})
        .await;
    assert_eq!(
        (
            report.removed_from(Table::Markers),
            left(behind.clone()).await
        ),
        (1, 0)
    );
    behind.close().await;
    s.drop().await;
}

/// The effects runner's purge of done effects decides what is past `done_retention` by the database's clock, as
/// the claims and the maintenance do: it took its host's clock, so a runner whose host ran days ahead of the
/// database removed done effects the database still keeps (the evidence an operator's compensation and a
/// re-recorded key are answered from). Here the database's clock is 10 days behind the host's: an effect
/// finished 8 days ago by the host's clock finished in the database's future and stays; one finished 18 days
/// ago by the host's (8 by the database's) goes.
#[tokio::test]
async fn the_effects_runner_purges_done_effects_by_the_database_s_clock() {
    use txinbox_core::effects::{EffectOptions, EffectRunner};
    let s = Schema::new().await;
    let behind = s.clock_behind_by_ten_days().await;
    let host_now = Utc::now();
    let kept = host_now - Cd::days(8);
    let expired = host_now - Cd::days(18);
    effect_row(&behind, "k-kept", "done", kept, Some(kept)).await;
    effect_row(&behind, "k-expired", "done", expired, Some(expired)).await;
    let runner = EffectRunner::new(behind.clone())
        .options(EffectOptions::default().done_retention(Duration::from_secs(7 * DAY as u64)));
    let _ = runner.run_until_idle().await;
    let left: Vec<String> =
        sqlx::query_scalar("SELECT idempotency_key FROM txinbox_effects ORDER BY id")
            .fetch_all(behind.pool())
            .await
            .unwrap();
    behind.close().await;
    s.drop().await;
    assert_eq!(
        left,
        ["k-kept"],
        "kept 7 days from its finish by the database's clock, 10 days behind the host's"
    );
}

/// A done effect's `finished_at` is the database's clock, which the purges (the runner's, the maintenance's)
/// count the retention on: it was the runner's host's, so an effect done by a runner whose host ran days behind
/// the database was past its retention when it was done, and purged at once. Here the database's clock is 10
/// days ahead of the host's and the runner keeps done effects 7 days: the effect it has just done stays.
#[tokio::test]
async fn an_effect_done_by_a_runner_whose_clock_is_behind_is_kept_its_retention() {
    use txinbox_core::effects::{EffectOptions, EffectRunner};
    let s = Schema::new().await;
    let ahead = s.clock_ahead_by_ten_days().await;
    let db_now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(ahead.pool())
        .await
        .unwrap();
    effect_row(&ahead, "k-run", "pending", db_now - Cd::hours(1), None).await;
    let runner = EffectRunner::new(ahead.clone())
        .executor("crm", Ages::default())
        .options(EffectOptions::default().done_retention(Duration::from_secs(7 * DAY as u64)));
    let report = runner.run_until_idle().await;
    let left: Vec<(String, Option<DateTime<Utc>>)> =
        sqlx::query_as("SELECT state, finished_at FROM txinbox_effects")
            .fetch_all(ahead.pool())
            .await
            .unwrap();
    ahead.close().await;
    s.drop().await;
    assert_eq!(report.claimed, 1, "{report:?}");
    assert_eq!(
        left.len(),
        1,
        "the effect just done is kept 7 days: {left:?}"
    );
    let finished = left[0].1.expect("finished");
    assert!(
        finished >= db_now - Cd::minutes(1),
        "finished at {finished}, the database's clock {db_now}"
    );
}

/// A key whose re-send (another bucket of event time, the partitioned layout's own case) recorded its effect
/// again, that second row not finished yet: the compensation undid the done row and left the other, which then
/// ran (or was being run, or may have happened) and did at the destination again what the operator had just
/// undone, the key reporting compensated. On the row-by-row layout a key has one row, and an unfinished one is
/// refused (not done: nothing to undo). Now a key with a row that may still run or may have happened is refused
/// as a whole, naming that row, before anything is undone; once it is finished, the compensation undoes it too.
#[tokio::test]
async fn a_key_with_an_unfinished_re_send_is_not_compensated_half_way() {
    use txinbox_core::effects::{CompensateError, EffectRunner, EffectState};
    for open in ["pending", "in_flight", "uncertain", "needs_attention"] {
        let s = Schema::new().await;
        let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
        let now = Utc::now();
        let done = effect_row(&s.store, "k-open", "done", now - Cd::minutes(5), Some(now)).await;
        let resent = effect_row(&s.store, "k-open", open, now, None).await;
        sqlx::query("UPDATE txinbox_effects SET result_reference = 'task-1' WHERE id = $1")
            .bind(done)
            .execute(s.store.pool())
            .await
            .unwrap();
        let undo = Undo::default();
        let runner = EffectRunner::new(s.store.clone()).executor("crm", undo.clone());
        let answer = runner.compensate("k-open").await;
        let states = |store: Store<sqlx::Postgres>| async move {
            sqlx::query_scalar::<_, String>("SELECT state FROM txinbox_effects ORDER BY id")
                .fetch_all(store.pool())
                .await
                .unwrap()
        };
        let after = states(s.store.clone()).await;
        let asked = undo.0.lock().unwrap().clone();
        assert!(
            matches!(&answer, Err(CompensateError::Unfinished { id, state, .. }) if *id == resent && state.as_str() == open),
            "{open}: {answer:?}, rows {after:?}"
        );
        let told = answer.unwrap_err().to_string();
        assert!(told.contains(open) && !told.contains('\n'), "{told}");
        assert_eq!(after, ["done", open], "nothing changed ({open})");
        assert!(asked.is_empty(), "nothing undone ({open}): {asked:?}");
        // Once the re-send is done (the destination answered it with the first call's task), both go.
        sqlx::query("UPDATE txinbox_effects SET state = 'done', result_reference = 'task-1', finished_at = now() WHERE id = $1")
            .bind(resent)
            .execute(s.store.pool())
            .await
            .unwrap();
        assert_eq!(
            runner.compensate("k-open").await.unwrap(),
            EffectState::Compensated
        );
        assert_eq!(
            states(s.store.clone()).await,
            ["compensated", "compensated"]
        );
        assert_eq!(*undo.0.lock().unwrap(), [Some("task-1".to_owned())]);
        s.drop().await;
    }
}

/// An effect a worker records takes its creation time, and so its first due time, from the database's clock, on
/// which the claims decide what is due and the partitioned layout lays out the effects' partitions: it took the
/// worker host's clock, so a worker whose host ran days ahead of the database recorded effects no runner claimed
/// until the database's clock caught up (row by row), or could not record them at all, past the last partition
/// made ahead (partitioned: every such message released, again and again). Here the database's clock is 10 days
/// behind the host's: the message is applied and its effect is due, and run, at once.
#[tokio::test]
async fn an_effect_recorded_by_a_worker_whose_clock_is_ahead_is_due_at_once() {
    use txinbox_core::effects::{Effect, EffectRunner};
    use txinbox_core::{Handled, HandlerError, Inbox, Message};
    for partitioned in [false, true] {
        let s = Schema::new().await;
        let behind = s.clock_behind_by_ten_days().await;
        if partitioned {
            let _ = behind.partition(&PartitionOptions::new()).await.unwrap();
        }
        let db_now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(behind.pool())
            .await
            .unwrap();
        let mut m = ReceivedMessage::new(b"{}".to_vec());
        m.attributes.insert("ce-id".into(), "evt-fx".into());
        m.attributes.insert("ce-source".into(), "crm".into());
        m.attributes.insert("ce-time".into(), db_now.to_rfc3339());
        let inbox = Inbox::new(
            behind.clone(),
            IdentityPolicy::new(ConsumerName::new("c").unwrap()),
        );
        let handler = |_: txinbox_store::Tx<sqlx::Postgres>, _: Message<serde_json::Value>| async {
            Ok::<_, HandlerError>(Handled::done().effect(Effect::new(
                "crm.task",
                "crm",
                b"{}".to_vec(),
            )))
        };
        let outcome = txinbox_testkit::prop::process_all(inbox, handler, vec![m], false).await;
        let outcome = txinbox_testkit::prop::delivered(outcome.into_iter().next().unwrap());
        let report = EffectRunner::new(behind.clone())
            .executor("crm", Ages::default())
            .run_until_idle()
            .await;
        let rows: Vec<(String, DateTime<Utc>)> =
            sqlx::query_as("SELECT state, created_at FROM txinbox_effects")
                .fetch_all(behind.pool())
                .await
                .unwrap();
        behind.close().await;
        s.drop().await;
        assert_eq!(
            (report.claimed, rows.len()),
            (1, 1),
            "partitioned {partitioned}: {outcome}, {rows:?} (the database's now {db_now})"
        );
        assert_eq!(rows[0].0, "done", "partitioned {partitioned}");
        assert!(
            rows[0].1 < db_now + Cd::minutes(1),
            "created at {} by the database's clock {db_now}",
            rows[0].1
        );
    }
}

/// A destination that does every effect, under one reference, and notes each one's age as an executor counts it (`Utc::now() -
/// created_at`, as the HTTP executor decides whether the destination still keeps the key of a call whose answer
/// was lost, and so whether to repeat it).
#[derive(Clone, Default)]
struct Ages(std::sync::Arc<std::sync::Mutex<Vec<Cd>>>);

impl txinbox_core::effects::EffectExecutor for Ages {
    fn execute<'a>(
        &'a self,
        e: &'a txinbox_core::effects::ClaimedEffect,
    ) -> txinbox_core::effects::BoxFuture<'a, txinbox_core::effects::Execution> {
        self.0.lock().unwrap().push(Utc::now() - e.created_at);
        Box::pin(async {
            txinbox_core::effects::Execution::Done {
                reference: Some("task-1".into()),
            }
        })
    }
    fn confirm<'a>(
        &'a self,
        _: &'a txinbox_core::effects::ClaimedEffect,
    ) -> txinbox_core::effects::BoxFuture<'a, txinbox_core::effects::Confirmation> {
        Box::pin(async { unreachable!("no effect is reconciled here") })
    }
}

/// An executor counts a claimed effect's age on the store's clock, on which it was recorded: it counted it from
/// its runner's host's clock, so behind the database by days an effect recorded 2 days ago was -8 days old, and
/// an HTTP destination that keeps keys a day (Stripe: "You can remove keys from the system automatically after
/// they're at least 24 hours old. We generate a new request if a key is reused after the original is pruned.")
/// had a call whose answer was lost repeated as its own confirmation, under a key it may have forgotten: a second
/// object. Here the database's clock is 10 days ahead of the host's; the stored creation time is left as it is.
#[tokio::test]
async fn an_executor_counts_an_effect_s_age_on_the_database_s_clock() {
    use txinbox_core::effects::EffectRunner;
    let s = Schema::new().await;
    let ahead = s.clock_ahead_by_ten_days().await;
    let db_now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(ahead.pool())
        .await
        .unwrap();
    let created = db_now - Cd::days(2);
    effect_row(&ahead, "k-age", "pending", created, None).await;
    let ages = Ages::default();
    let report = EffectRunner::new(ahead.clone())
        .executor("crm", ages.clone())
        .run_until_idle()
        .await;
    let stored: DateTime<Utc> = sqlx::query_scalar("SELECT created_at FROM txinbox_effects")
        .fetch_one(ahead.pool())
        .await
        .unwrap();
    ahead.close().await;
    s.drop().await;
    assert_eq!(report.claimed, 1, "{report:?}");
    let seen = ages.0.lock().unwrap().clone();
    assert!(
        seen.len() == 1
            && seen[0] > Cd::days(2) - Cd::minutes(1)
            && seen[0] < Cd::days(2) + Cd::minutes(1),
        "two days old by the database's clock: {seen:?}"
    );
    assert_eq!(stored, created);
}
