//! The plans of the purges that run in batches over large tables: each reads an index, on both backends.
//! A batch that reads the whole table instead costs a full scan per batch.

use chrono::Utc;

use crate::Store;

/// The index every effects purge must read.
const FINISHED: &str = "txinbox_effects_finished";

#[tokio::test]
async fn the_effects_purges_read_the_finished_index_on_sqlite() {
    let store = Store::<sqlx::Sqlite>::connect("sqlite::memory:")
        .await
        .unwrap();
    for sql in [
        crate::sqlite::PURGE_DONE_EFFECTS,
        crate::sqlite::PURGE_FINISHED_EFFECTS,
    ] {
        let rows: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {sql}"))
                .bind(Utc::now().to_rfc3339())
                .bind(500_i64)
                .fetch_all(store.pool())
                .await
                .unwrap();
        let plan: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
        assert!(
            plan.iter().any(|d| d.contains(FINISHED)),
            "{sql}\n{plan:#?}"
        );
    }
}

#[tokio::test]
async fn the_effects_purges_read_the_finished_index_on_postgres() {
    let url = std::env::var("TXINBOX_TEST_PG_URL").unwrap_or_else(|_| {
        panic!("TXINBOX_TEST_PG_URL is not set: run the tests with `bash scripts/test.sh`")
    });
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_in_schema(&url, &schema, 1)
        .await
        .unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    // An empty table is read whole whatever its indexes: forbid that, so the plan shows what the index allows.
    sqlx::Executor::execute(&mut *conn, "SET enable_seqscan = off")
        .await
        .unwrap();
    for sql in [
        crate::postgres::PURGE_DONE_EFFECTS,
        crate::postgres::PURGE_FINISHED_EFFECTS,
    ] {
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {sql}"))
            .bind(Utc::now())
            .bind(500_i64)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        assert!(
            plan.iter().any(|l| l.contains(FINISHED)),
            "{sql}\n{}",
            plan.join("\n")
        );
    }
    sqlx::Executor::execute(&mut *conn, "RESET enable_seqscan")
        .await
        .unwrap();
    drop(conn);
    sqlx::Executor::execute(
        store.pool(),
        format!("DROP SCHEMA \"{schema}\" CASCADE").as_str(),
    )
    .await
    .unwrap();
}
