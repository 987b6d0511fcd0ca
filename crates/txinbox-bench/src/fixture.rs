//! What the PostgreSQL measurements share: the bench schema and inbox, its messages, its SQL through sqlx.

use txinbox_core::{
    ConsumerName, Handler, HandlerError, IdentityPolicy, Inbox, InboxProcessor, Message, Raw,
    ReceivedMessage,
};
use txinbox_lab::lab::LabError;
use txinbox_store::{Store, Tx};
use txinbox_testkit::NoopDelivery;

/// The inbox the benchmark measures, bound to its handler.
pub(crate) type BenchInbox<H> = InboxProcessor<Store<sqlx::Postgres>, Raw, H>;

pub(crate) const CONSUMER: &str = "bench";
pub(crate) const BUSINESS_INSERT: &str =
    "INSERT INTO bench_tasks (task_id, message_id) VALUES ($1, $2)";

pub(crate) fn message(id: &str, n: u64) -> ReceivedMessage {
    let mut m = ReceivedMessage::new(
        format!("{{\"opportunity\":\"o-{n}\",\"meeting\":\"m-{n}\"}}").into_bytes(),
    );
    m.attributes.insert("ce-id".into(), id.to_owned());
    m.attributes.insert("ce-source".into(), "urn.bench".into());
    m.attributes.insert("ce-type".into(), "bench.event".into());
    m
}

pub(crate) async fn reset(pool: &sqlx::PgPool) -> Result<(), LabError> {
    sqlx::Executor::execute(pool, "TRUNCATE txinbox_inbox, bench_tasks").await?;
    Ok(())
}

/// The handler's business row, outside the inbox.
/// The store's marker insert through sqlx, with the values the inbox would bind for a bench message.
pub(crate) async fn marker_insert(conn: &mut sqlx::PgConnection, id: &str) -> Result<(), String> {
    let now = chrono::Utc::now();
    sqlx::query(txinbox_store::postgres::insert_marker_sql())
        .bind(CONSUMER)
        .bind("urn.bench")
        .bind(id)
        .bind(Some("bench.event"))
        .bind(None::<String>)
        .bind("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
        .bind(None::<String>)
        .bind(None::<String>)
        .bind(now)
        .bind(now)
        .bind(now + chrono::Duration::days(30))
        .bind("cloudevents_attributes")
        .bind(1i32)
        .execute(conn)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The store's batch marker insert through sqlx, with the values the inbox would bind for bench messages.
pub(crate) async fn marker_inserts(
    conn: &mut sqlx::PgConnection,
    ids: &[String],
) -> Result<(), String> {
    let now = chrono::Utc::now();
    let n = ids.len();
    let text = |v: Option<&'static str>| vec![v; n];
    sqlx::query(txinbox_store::postgres::insert_markers_sql())
        .bind(text(Some(CONSUMER)))
        .bind(text(Some("urn.bench")))
        .bind(ids)
        .bind(text(Some("bench.event")))
        .bind(text(None))
        .bind(text(Some(
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        )))
        .bind(text(None))
        .bind(text(None))
        .bind(vec![now; n])
        .bind(vec![now; n])
        .bind(vec![now + chrono::Duration::days(30); n])
        .bind(text(Some("cloudevents_attributes")))
        .bind(vec![1i32; n])
        .fetch_all(conn)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

pub(crate) async fn business_insert(conn: &mut sqlx::PgConnection, id: &str) -> Result<(), String> {
    sqlx::query(BUSINESS_INSERT)
        .bind(format!("t-{id}"))
        .bind(id)
        .execute(conn)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Processes `m` through the inbox and checks its outcome.
pub(crate) async fn expect<H: Handler<Store<sqlx::Postgres>, Raw>>(
    inbox: &BenchInbox<H>,
    m: ReceivedMessage,
    want: &str,
) -> Result<(), String> {
    let o = inbox.process_one(NoopDelivery(m)).await;
    if o.label() == want {
        Ok(())
    } else {
        Err(format!("unexpected outcome {o}, wanted {want}"))
    }
}

/// A fresh schema on `url` with the inbox's tables and the handler's `bench_tasks`; dropped by [`drop_schema`].
pub(crate) async fn bench_store(
    url: &str,
    connections: u32,
) -> Result<(String, Store<sqlx::Postgres>), LabError> {
    let schema = format!("txinbox_bench_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_in_schema(url, &schema, connections).await?;
    sqlx::Executor::execute(
        store.pool(),
        "CREATE TABLE bench_tasks (task_id TEXT NOT NULL, message_id TEXT NOT NULL)",
    )
    .await?;
    Ok((schema, store))
}

/// Runs `body` on a fresh [`bench_store`] of `connections`, then closes the store and drops its schema,
/// whether `body` ended well or not.
pub(crate) async fn in_bench_schema<T>(
    url: &str,
    connections: u32,
    body: impl AsyncFnOnce(&Store<sqlx::Postgres>) -> Result<T, LabError>,
) -> Result<T, LabError> {
    let (schema, store) = bench_store(url, connections).await?;
    let result = body(&store).await;
    store.close().await;
    drop_schema(url, &schema).await;
    result
}

/// Drops a schema [`bench_store`] made (best effort: the benchmark's figures are already printed).
pub(crate) async fn drop_schema(url: &str, schema: &str) {
    if let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(url).await {
        let _ = sqlx::Executor::execute(
            &mut conn,
            format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str(),
        )
        .await;
    }
}

/// The inbox every measurement runs: consumer `bench`, the handler inserting one `bench_tasks` row.
pub(crate) fn bench_inbox(
    store: &Store<sqlx::Postgres>,
) -> Result<BenchInbox<impl Handler<Store<sqlx::Postgres>, Raw>>, LabError> {
    let consumer = ConsumerName::new(CONSUMER).map_err(|e| LabError::Usage(e.to_string()))?;
    Ok(
        Inbox::new(store.clone(), IdentityPolicy::new(consumer)).bind(
            |tx: Tx<sqlx::Postgres>, msg: Message<Raw>| async move {
                sqlx::query(BUSINESS_INSERT)
                    .bind(format!("t-{}", msg.identity.message_id))
                    .bind(&msg.identity.message_id)
                    .execute(&tx)
                    .await?;
                Ok::<_, HandlerError>(())
            },
        ),
    )
}
