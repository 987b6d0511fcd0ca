//! The schema under the user's control: applied by the store (default), verified after the team's own
//! migration tool applied the exported script, or refused when missing; in a schema of the user's choice.

use sqlx::Connection;
use txinbox_store::{Migrations, Store, StoreError, StoreOptions};

fn schema() -> String {
    format!("t_{}", uuid::Uuid::new_v4().simple())
}

async fn drop_schema(schema: &str) {
    let mut c = sqlx::PgConnection::connect(&txinbox_testkit::pg_url())
        .await
        .unwrap();
    sqlx::Executor::execute(
        &mut c,
        format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn verify_refuses_a_database_without_the_schema_then_accepts_the_exported_script() {
    let url = txinbox_testkit::pg_url();
    let s = schema();
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::Executor::execute(&mut c, format!("CREATE SCHEMA \"{s}\"").as_str())
        .await
        .unwrap();
    let verify = StoreOptions::new()
        .schema(&s)
        .migrations(Migrations::Verify);
    let err = Store::<sqlx::Postgres>::connect_with(&url, verify.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::SchemaTooOld {
                found: 0,
                required: 7
            }
        ),
        "{err}"
    );
    // The team's own tool runs the exported script, in one transaction, in its schema.
    let script = Store::<sqlx::Postgres>::migration_sql();
    let mut tx = c.begin().await.unwrap();
    sqlx::Executor::execute(
        &mut *tx,
        format!("SET LOCAL search_path TO \"{s}\"").as_str(),
    )
    .await
    .unwrap();
    sqlx::raw_sql(&script).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let store = Store::<sqlx::Postgres>::connect_with(&url, verify)
        .await
        .expect("the exported script is this build's schema");
    assert_eq!(store.inbox_rows("anyone").await.unwrap(), 0);
    store.close().await;
    drop_schema(&s).await;
}

#[tokio::test]
async fn the_tables_go_in_the_chosen_schema_and_a_second_start_changes_nothing() {
    let url = txinbox_testkit::pg_url();
    let s = schema();
    let opts = StoreOptions::new().schema(&s).max_connections(2);
    let first = Store::<sqlx::Postgres>::connect_with(&url, opts.clone())
        .await
        .unwrap();
    first.close().await;
    let second = Store::<sqlx::Postgres>::connect_with(&url, opts)
        .await
        .unwrap();
    let (tables, versions): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name LIKE 'txinbox_%'), (SELECT count(*) FROM txinbox_schema_version)",
    )
    .bind(&s)
    .fetch_one(second.pool())
    .await
    .unwrap();
    assert_eq!(
        tables, 5,
        "inbox, rejections, the retired outbox, effects and the version table"
    );
    assert_eq!(
        versions, 7,
        "one row per migration (inbox, effects, operations, tenant business key, effect truth, finished effects, claimed from): the second start applied nothing again"
    );
    second.close().await;
    drop_schema(&s).await;
}

#[tokio::test]
async fn a_bad_schema_name_is_a_typed_error() {
    let err = Store::<sqlx::Postgres>::connect_with(
        &txinbox_testkit::pg_url(),
        StoreOptions::new().schema("inbox; DROP TABLE x"),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
}

#[tokio::test]
async fn sqlite_accepts_its_exported_script_under_verify() {
    let dir = std::env::temp_dir().join(format!(
        "txinbox-schema-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let url = format!("sqlite:{}", dir.display());
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&dir)
        .create_if_missing(true);
    let mut c = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
    sqlx::raw_sql(&Store::<sqlx::Sqlite>::migration_sql())
        .execute(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
    let store = Store::<sqlx::Sqlite>::connect_with(
        &url,
        StoreOptions::new().migrations(Migrations::Verify),
    )
    .await
    .expect("verified");
    store.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", dir.display()));
    }
}

#[tokio::test]
async fn a_schema_name_with_capitals_is_the_schema_created_and_used() {
    let url = txinbox_testkit::pg_url();
    let s = format!("T_{}", uuid::Uuid::new_v4().simple());
    let opts = StoreOptions::new().schema(&s).max_connections(2);
    let store = Store::<sqlx::Postgres>::connect_with(&url, opts.clone())
        .await
        .expect("the store opens in the schema it created");
    let (tables, current): (i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name = 'txinbox_inbox'), current_schema()::text",
    )
    .bind(&s)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(tables, 1, "the inbox's table is in {s}");
    assert_eq!(current, s, "the connections' search_path is {s}, as spelt");
    store.close().await;
    // A lazy store names the same schema.
    let lazy = Store::<sqlx::Postgres>::connect_lazy_with(&url, opts).unwrap();
    let current: String = sqlx::query_scalar("SELECT current_schema()::text")
        .fetch_one(lazy.pool())
        .await
        .unwrap();
    assert_eq!(current, s);
    lazy.close().await;
    drop_schema(&s).await;
}

#[tokio::test]
async fn a_lazy_store_refuses_a_bad_schema_name() {
    let err = Store::<sqlx::Postgres>::connect_lazy_with(
        &txinbox_testkit::pg_url(),
        StoreOptions::new().schema("inbox, public"),
    )
    .unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
}

#[tokio::test]
async fn stores_opening_at_once_in_a_new_schema_all_open() {
    let url = txinbox_testkit::pg_url();
    let s = schema();
    let opens = (0..8).map(|_| {
        let (url, opts) = (
            url.clone(),
            StoreOptions::new().schema(&s).max_connections(1),
        );
        tokio::spawn(async move { Store::<sqlx::Postgres>::connect_with(&url, opts).await })
    });
    for r in futures::future::join_all(opens).await {
        let store = r
            .unwrap()
            .expect("every replica opens: one creates the schema, the others find it");
        store.close().await;
    }
    drop_schema(&s).await;
}

#[tokio::test]
async fn a_pool_size_of_zero_opens_a_pool_of_one_on_sqlite() {
    let path =
        std::env::temp_dir().join(format!("txinbox-pool-{}.db", uuid::Uuid::new_v4().simple()));
    let mut opts = StoreOptions::new();
    // The field is public: a size of zero set on it is taken as one, as the setter does (sqlx's
    // pool panics on a capacity of zero).
    opts.max_connections = 0;
    let store = Store::<sqlx::Sqlite>::connect_with(&format!("sqlite:{}", path.display()), opts)
        .await
        .expect("the store opens");
    assert_eq!(store.pool().options().get_max_connections(), 1);
    store.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
