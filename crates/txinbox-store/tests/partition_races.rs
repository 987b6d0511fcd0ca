//! The partitioned layout beside writers that do not wait for it: an effects runner's update or a recorded
//! piece of evidence committed while the conversion copies the tables is in the partitioned table after it,
//! and an effect committed into a partition while the rotation detaches it is never dropped with it.

use chrono::{DateTime, Duration as Cd, Utc};
use sqlx::Connection;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use txinbox_core::runtime::maintenance::{MaintenanceOptions, MaintenanceStore, Table};
use txinbox_store::{PartitionOptions, Store};

mod common;
use common::Schema;

// What this file's tests add to the shared schema.
impl Schema {
    /// Another session on this schema (another node's worker).
    async fn session(&self) -> sqlx::PgConnection {
        let opts = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(
            &txinbox_testkit::pg_url(),
        )
        .unwrap()
        .options([("search_path", format!("\"{}\"", self.name))]);
        sqlx::ConnectOptions::connect(&opts).await.unwrap()
    }

    /// Waits until a session waits for `pid`'s transaction (a lock it holds, or its end), or `ended` says the
    /// waiting step ended first; `what` names the waiting step, for the failure.
    async fn until_blocked_by(&self, pid: i32, ended: &AtomicBool, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
            )
            .bind(pid)
            .fetch_one(self.store.pool())
            .await
            .unwrap();
            if waiting > 0 || ended.load(Ordering::SeqCst) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} never waited for the other session"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Runs `op` until it waits for the transaction of `pid`, then `then`, and returns what `op` returned.
async fn while_blocked<T>(
    s: &Schema,
    pid: i32,
    what: &str,
    op: impl Future<Output = T>,
    then: impl Future<Output = ()>,
) -> T {
    let ended = AtomicBool::new(false);
    let op = async {
        let r = op.await;
        ended.store(true, Ordering::SeqCst);
        r
    };
    let driver = async {
        s.until_blocked_by(pid, &ended, what).await;
        then.await;
    };
    futures::future::join(op, driver).await.0
}

async fn pid(conn: &mut sqlx::PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// An effect row written straight into the table, created at `created`, in `state`.
async fn effect_row(store: &Store<sqlx::Postgres>, key: &str, state: &str, created: DateTime<Utc>) {
    sqlx::query("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at) VALUES ('c', $1, $1, 'crm', 'crm', '\\x00', '{}', $1, $2, $3, $3, $3)")
        .bind(key)
        .bind(state)
        .bind(created)
        .execute(store.pool())
        .await
        .unwrap();
}

/// An effects runner that finishes an effect while the inbox is converted (its transaction touches the
/// effects alone, so the conversion's lock on the markers does not stop it): its update is in the partitioned
/// table afterwards. Had the conversion copied the effects before the runner committed and dropped the old
/// table after, the effect would be pending again and run a second time.
#[tokio::test]
async fn an_effect_finished_during_the_conversion_stays_finished() {
    let s = Schema::new().await;
    effect_row(&s.store, "k", "pending", Utc::now()).await;
    let mut runner = s.session().await;
    let runner_pid = pid(&mut runner).await;
    let mut tx = runner.begin().await.unwrap();
    sqlx::query("UPDATE txinbox_effects SET state = 'done', finished_at = now() WHERE idempotency_key = 'k'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let r = while_blocked(
        &s,
        runner_pid,
        "the conversion",
        s.store.partition(&PartitionOptions::new()),
        async { tx.commit().await.unwrap() },
    )
    .await
    .unwrap();
    assert_eq!(r.effects_copied, 1, "{r:?}");
    let state: Vec<String> = sqlx::query_scalar("SELECT state FROM txinbox_effects")
        .fetch_all(s.store.pool())
        .await
        .unwrap();
    assert_eq!(state, vec!["done"], "the runner's update was lost");
    drop(runner);
    s.drop().await;
}

/// Evidence recorded while the inbox is converted (its own transaction, beside no marker) is in the
/// partitioned table afterwards, never lost with the old table.
#[tokio::test]
async fn evidence_recorded_during_the_conversion_is_kept() {
    let s = Schema::new().await;
    let mut worker = s.session().await;
    let worker_pid = pid(&mut worker).await;
    let mut tx = worker.begin().await.unwrap();
    sqlx::query("INSERT INTO txinbox_rejections (consumer_name, source, message_id, kind, business_key, payload_hash, conflicts_with, detail, recorded_at) VALUES ('c', 'crm', 'm1', 'payload_collision', NULL, 'h', 'm0', 'd', now())")
        .execute(&mut *tx)
        .await
        .unwrap();
    let r = while_blocked(
        &s,
        worker_pid,
        "the conversion",
        s.store.partition(&PartitionOptions::new()),
        async { tx.commit().await.unwrap() },
    )
    .await
    .unwrap();
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM txinbox_rejections")
        .fetch_one(s.store.pool())
        .await
        .unwrap();
    assert_eq!(kept, 1, "the evidence recorded meanwhile was lost: {r:?}");
    drop(worker);
    s.drop().await;
}

/// An effect committed into a partition while the rotation detaches it (a transaction that began before
/// the rotation looked, its effect created by a clock that lags, or just before the bucket ended with a
/// short keep) is not dropped with it: the rotation looks again once the partition is detached, and puts a
/// partition that holds an effect not done back.
#[tokio::test]
async fn an_effect_committed_while_its_partition_is_detached_is_not_dropped() {
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let created = Utc::now();
    let mut worker = s.session().await;
    let worker_pid = pid(&mut worker).await;
    let mut tx = worker.begin().await.unwrap();
    sqlx::query("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at) VALUES ('c', 'm', 'k', 'crm', 'crm', '\\x00', '{}', 'k', 'pending', $1, $1, $1)")
        .bind(created)
        .execute(&mut *tx)
        .await
        .unwrap();
    // Past the effects' keep: the partition of today looks empty to the rotation (the effect is not
    // committed), which detaches it and waits for the worker's transaction.
    let later = created + Cd::days(9);
    // DETACH ... CONCURRENTLY waits for the transactions that use the table (their own lock), not for a
    // lock on it.
    let maintenance = MaintenanceOptions::default();
    let p = while_blocked(
        &s,
        worker_pid,
        "the rotation",
        s.store.rotate_partitions(later, &maintenance),
        async { tx.commit().await.unwrap() },
    )
    .await
    .unwrap()
    .unwrap();
    let left: Vec<String> = sqlx::query_scalar("SELECT state FROM txinbox_effects")
        .fetch_all(s.store.pool())
        .await
        .unwrap();
    assert_eq!(left, vec!["pending"], "a pending effect was dropped: {p:?}");
    assert_eq!(p.held[&Table::Effects], 1, "{p:?}");
    drop(worker);
    s.drop().await;
}

/// The rotation reads the layout only under its lock. Read before it, the layout could predate another node's
/// pass that moved `low` and dropped partitions; this pass would then create them again, and a late copy of a
/// message whose marker went with them could be written there and applied again. Shown by holding the layout
/// table: the rotation waits for it with its lock already held.
#[tokio::test]
async fn the_rotation_reads_the_layout_under_its_lock() {
    let s = Schema::new().await;
    let _ = s.store.partition(&PartitionOptions::new()).await.unwrap();
    let mut other = s.session().await;
    let other_pid = pid(&mut other).await;
    let mut tx = other.begin().await.unwrap();
    sqlx::query("LOCK TABLE txinbox_partition_layout IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let maintenance = MaintenanceOptions::default();
    let lock_held = std::sync::Mutex::new(None);
    let p = while_blocked(
        &s,
        other_pid,
        "the rotation",
        s.store.rotate_partitions(Utc::now(), &maintenance),
        async {
            // The rotation's lock: (741823091, hashtext(schema)), as pg_locks shows a two-key advisory lock.
            let held: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 \
                 AND classid::bigint = 741823091 \
                 AND objid::bigint = (hashtext($1)::bigint + 4294967296) % 4294967296",
            )
            .bind(&s.name)
            .fetch_one(s.store.pool())
            .await
            .unwrap();
            *lock_held.lock().unwrap() = Some(held);
            tx.commit().await.unwrap();
        },
    )
    .await
    .unwrap();
    assert_eq!(
        lock_held.into_inner().unwrap(),
        Some(1),
        "the rotation waited for the layout without its lock"
    );
    assert!(p.is_some_and(|p| !p.skipped), "the pass ran");
    drop(other);
    s.drop().await;
}
