//! The store as a readiness check: its own connection answers a ping, whether the pool is busy or not; a
//! database that is not there fails the check, naming what failed and never the URL.

use std::time::Duration;

use txinbox_core::runtime::health::HealthCheck;
use txinbox_store::{Store, StoreOptions};

/// Open connections of this test's application name.
async fn backends(name: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&txinbox_testkit::pg_url())
        .await
        .unwrap();
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(name)
        .fetch_one(&mut c)
        .await
        .unwrap()
}

/// Every connection of the pool in use (a rotation's long `DETACH ... CONCURRENTLY`, or as many
/// transactions as connections): the check still answers at once, on a connection of its own, and keeps
/// that one connection from one check to the next. It took a connection from the pool, and a busy pool
/// made a healthy shard look down.
#[tokio::test]
async fn a_busy_pool_is_not_a_database_that_is_down() {
    let name = format!("txinbox-health-{}", uuid::Uuid::new_v4().simple());
    let base = txinbox_testkit::pg_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}application_name={name}");
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_with(
        &url,
        StoreOptions::new().max_connections(1).schema(&schema),
    )
    .await
    .unwrap();
    let held = store.pool().acquire().await.unwrap();
    for _ in 0..3 {
        let r = tokio::time::timeout(Duration::from_secs(5), store.check()).await;
        assert_eq!(r, Ok(Ok(())));
    }
    assert_eq!(
        backends(&name).await,
        2,
        "the pool's one connection and the check's one"
    );
    drop(held);
    store.close().await;
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&base).await.unwrap();
    sqlx::Executor::execute(&mut c, format!("DROP SCHEMA \"{schema}\" CASCADE").as_str())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_busy_sqlite_pool_is_not_a_database_that_is_down() {
    let dir =
        std::env::temp_dir().join(format!("txinbox-health-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("inbox.db").display());
    let store = Store::<sqlx::Sqlite>::connect_with(&url, StoreOptions::new().max_connections(1))
        .await
        .unwrap();
    let held = store.pool().acquire().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), store.check()).await;
    assert_eq!(r, Ok(Ok(())));
    drop(held);
    store.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Nothing listens: the check fails with the driver's reason, and the URL's password is not in it.
#[tokio::test]
async fn a_database_that_is_not_there_fails_the_check_without_its_url() {
    let store = Store::<sqlx::Postgres>::connect_lazy_with(
        "postgres://inbox:s3cret-pw@127.0.0.1:1/none",
        StoreOptions::new(),
    )
    .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), store.check())
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.starts_with("no connection:"), "{e}");
    assert!(!e.contains("s3cret"), "{e}");
}

/// A database that answers while the inbox cannot write there: its INSERT grant revoked, the session
/// read-only (a standby after a failover), or its table dropped. The check fails, saying which, where a ping
/// passed and every delivery then failed on the inbox's own statements and was released again and again.
#[tokio::test]
async fn a_database_that_answers_but_cannot_take_markers_fails_the_check() {
    use sqlx::Connection;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (schema, role) = (format!("t_{id}"), format!("txinbox_h_{id}"));
    let base = txinbox_testkit::pg_url();
    // The schema migrated by the owner; the worker's role granted what the inbox uses, as an operator would.
    let owner = Store::<sqlx::Postgres>::connect_with(
        &base,
        StoreOptions::new().max_connections(1).schema(&schema),
    )
    .await
    .unwrap();
    owner.close().await;
    let mut admin = sqlx::PgConnection::connect(&base).await.unwrap();
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT USAGE ON SCHEMA \"{schema}\" TO {role}"),
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" TO {role}"
        ),
    ] {
        sqlx::Executor::execute(&mut admin, sql.as_str())
            .await
            .unwrap();
    }
    let opts: sqlx::postgres::PgConnectOptions = base.parse().unwrap();
    let url = format!(
        "postgres://{role}@{}:{}/{}",
        opts.get_host(),
        opts.get_port(),
        opts.get_database().unwrap_or("test")
    );
    let worker = || {
        Store::<sqlx::Postgres>::connect_lazy_with(
            &url,
            StoreOptions::new().max_connections(1).schema(&schema),
        )
        .unwrap()
    };
    let store = worker();
    assert_eq!(store.check().await, Ok(()), "granted, writable, there");

    // A grant taken away.
    let revoke = format!("REVOKE INSERT ON \"{schema}\".txinbox_inbox FROM {role}");
    sqlx::Executor::execute(&mut admin, revoke.as_str())
        .await
        .unwrap();
    assert_eq!(
        store.check().await,
        Err("no INSERT privilege on txinbox_inbox".to_owned())
    );
    let grant = format!("GRANT INSERT ON \"{schema}\".txinbox_inbox TO {role}");
    sqlx::Executor::execute(&mut admin, grant.as_str())
        .await
        .unwrap();
    assert_eq!(
        store.check().await,
        Ok(()),
        "granted again, without a restart"
    );

    // Read-only sessions (as on a standby): a new connection of the role.
    let read_only = format!("ALTER ROLE {role} SET default_transaction_read_only = on");
    sqlx::Executor::execute(&mut admin, read_only.as_str())
        .await
        .unwrap();
    let fresh = worker();
    let e = fresh.check().await.unwrap_err();
    assert!(e.starts_with("the database is read-only"), "{e}");
    fresh.close().await;

    // The table dropped.
    let drop = format!("DROP TABLE \"{schema}\".txinbox_inbox CASCADE");
    sqlx::Executor::execute(&mut admin, drop.as_str())
        .await
        .unwrap();
    let e = store.check().await.unwrap_err();
    assert!(
        e.starts_with("the inbox's table:") && e.contains("txinbox_inbox"),
        "{e}"
    );

    store.close().await;
    for sql in [
        format!("DROP SCHEMA \"{schema}\" CASCADE"),
        format!("DROP OWNED BY {role}"),
        format!("DROP ROLE {role}"),
    ] {
        sqlx::Executor::execute(&mut admin, sql.as_str())
            .await
            .unwrap();
    }
}
