//! The SQLite store's claim of due effects holds the database's write lock for one transaction, which
//! always ends: a claim given up half way (its future dropped: a runner's task aborted) never hands the pool
//! a connection that still holds the lock.

use std::future::Future;
use std::task::{Context, Poll};

use chrono::Utc;
use sqlx::ConnectOptions;
use txinbox_core::effects::EffectStore;
use txinbox_store::{Store, StoreOptions};

#[tokio::test]
async fn a_claim_dropped_half_way_leaves_no_transaction_on_a_pooled_connection() {
    let path = std::env::temp_dir().join(format!(
        "txinbox-claims-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let url = format!("sqlite:{}", path.display());
    let store = Store::<sqlx::Sqlite>::connect_with(&url, StoreOptions::new().max_connections(1))
        .await
        .unwrap();
    let now = Utc::now();
    let t = now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    sqlx::query("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at) VALUES ('c', 'm', 'k', 'n', 'd', x'00', '{}', 'k', 'pending', ?1, ?1, ?1)")
        .bind(&t)
        .execute(store.pool())
        .await
        .unwrap();

    // Another connection, which never waits for a lock: it tells whether someone holds the write lock.
    let mut other = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .busy_timeout(std::time::Duration::ZERO)
        .connect()
        .await
        .unwrap();
    // Poll the claim until it holds the write lock (its transaction is open), then drop it.
    let destinations = vec!["d".to_owned()];
    {
        let claim = store.claim_effects(
            "runner",
            &destinations,
            now,
            now + chrono::Duration::minutes(1),
            10,
        );
        let mut claim = std::pin::pin!(claim);
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Poll::Ready(r) = claim.as_mut().poll(&mut cx) {
                // Finished before it was seen holding the lock (a claim that runs on its own): nothing to drop.
                r.unwrap();
                break;
            }
            if !write_lock_free(&mut other).await {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the claim never took the write lock"
            );
            tokio::task::yield_now().await;
        }
    }
    // The claim's transaction ends on its own: the write lock is let go.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !write_lock_free(&mut other).await {
        assert!(
            std::time::Instant::now() < deadline,
            "a pooled connection still holds the database's write lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Rolled back as nobody would run it (or, dropped between its last check and its COMMIT, claimed).
    let (state, by): (String, Option<String>) =
        sqlx::query_as("SELECT state, claimed_by FROM txinbox_effects WHERE idempotency_key = 'k'")
            .fetch_one(&mut other)
            .await
            .unwrap();
    assert!(
        state == "pending" || (state == "in_flight" && by.as_deref() == Some("runner")),
        "{state} {by:?}"
    );
    // What the pool's connection writes now is committed: another connection sees it.
    sqlx::query("UPDATE txinbox_effects SET attempts = 7 WHERE idempotency_key = 'k'")
        .execute(store.pool())
        .await
        .unwrap();
    let attempts: i64 =
        sqlx::query_scalar("SELECT attempts FROM txinbox_effects WHERE idempotency_key = 'k'")
            .fetch_one(&mut other)
            .await
            .unwrap();
    assert_eq!(attempts, 7);
    drop(other);
    store.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// Whether `conn` can take the database's write lock at once (it lets it go again).
async fn write_lock_free(conn: &mut sqlx::SqliteConnection) -> bool {
    use sqlx::Connection;
    match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => {
            tx.rollback().await.unwrap();
            true
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("5") => false,
        Err(e) => panic!("{e}"),
    }
}

/// A claim lasts `claim_until - now` between the times as the store keeps them, on SQLite as on PostgreSQL:
/// a `now` at the last instant of year 9999 and an end past it (a runner's "for ever") lasted their raw
/// difference here and nothing on PostgreSQL, so the effect was held on one store and claimable again
/// on the other (`prop_backends::sqlite_and_postgres_agree_on_hostile_operations`, seen failing so).
#[tokio::test]
async fn a_claim_between_times_past_year_9999_lasts_nothing() {
    let store = Store::<sqlx::Sqlite>::connect("sqlite::memory:")
        .await
        .unwrap();
    let t = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    sqlx::query("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at) VALUES ('c', 'm', 'k', 'n', 'd', x'00', '{}', 'k', 'pending', ?1, ?1, ?1)")
        .bind(&t)
        .execute(store.pool())
        .await
        .unwrap();
    let destinations = vec!["d".to_owned()];
    let last = chrono::DateTime::<Utc>::MAX_UTC;
    let end_of_9999 = chrono::DateTime::parse_from_rfc3339("9999-12-31T23:59:59.999999999Z")
        .unwrap()
        .with_timezone(&Utc);
    let first = store
        .claim_effects("runner", &destinations, end_of_9999, last, 1)
        .await
        .unwrap();
    assert_eq!(first.len(), 1, "due");
    // The claim lasted nothing: its end is already past, and the effect can be claimed again at once.
    let until: String = sqlx::query_scalar("SELECT claim_until FROM txinbox_effects")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let until = chrono::DateTime::parse_from_rfc3339(&until).unwrap();
    assert!(until <= Utc::now(), "held until {until}");
    store.close().await;
}
