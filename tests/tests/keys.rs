//! Keys that mean what they say, on SQLite and PostgreSQL:
//!
//! * the identity is per consumer: two consumer names apply the same message independently (consumer A applied
//!   it, consumer B still applies it once, and B's redelivery is B's duplicate);
//! * a business key is unique per consumer **and tenant**: two tenants asking for the same business action both
//!   apply, the same tenant asking twice (another message id) is a business duplicate, and messages without a
//!   tenant keep the per-consumer uniqueness they had;
//! * a store created by an earlier version (schema version 3, the business key unique per consumer only) is
//!   migrated in place: its markers stay and the tenant rule holds afterwards.

use std::time::Duration;

use txinbox::mem::{MemoryDelivery, MemoryQueue, OutgoingMessage};
use txinbox::sqlx;
use txinbox::sqlx::Connection;
use txinbox::{ConsumerName, IdentityPolicy, Inbox, Message, Outcome, OutcomeKind, Store};
use txinbox_e2e::{pg_store, pg_url, sqlite_store};

/// The typed body: book a follow-up call for an account.
#[derive(Clone, Debug, serde::Deserialize)]
struct BookCall {
    account: String,
}

/// The business key: one follow-up call per account (the same text in every tenant).
fn call_key(b: &BookCall) -> Option<String> {
    Some(format!("book_call:{}", b.account))
}

/// Message `id` asking to book a call for `account`, in `tenant` when given (the CloudEvents `tenantid`
/// extension, `ce-tenantid`).
fn book(id: &str, account: &str, tenant: Option<&str>) -> OutgoingMessage {
    let body = serde_json::json!({ "account": account });
    let m = OutgoingMessage::new(body.to_string()).cloudevent("crm", id, "book_call");
    match tenant {
        Some(t) => m.attribute("ce-tenantid", t),
        None => m,
    }
}

fn deliver(q: &MemoryQueue, m: OutgoingMessage) -> MemoryDelivery {
    q.send(m);
    q.receive_now(1).pop().expect("the message just sent")
}

/// A consumer named `$name` on `$store` that writes one `calls` row per application, tagged with its name
/// (a macro: the transaction's type is inferred per backend).
macro_rules! consumer {
    ($store:expr, $name:expr) => {{
        let name: &'static str = $name;
        Inbox::new(
            $store.clone(),
            IdentityPolicy::new(ConsumerName::new(name).unwrap()),
        )
        .retry_backoff(Duration::from_secs(5))
        .bind(move |tx, msg: Message<BookCall>| async move {
            sqlx::query("INSERT INTO calls (consumer, account, message_id) VALUES ($1, $2, $3)")
                .bind(name.to_owned())
                .bind(msg.body.account.clone())
                .bind(msg.id().to_owned())
                .execute(&tx)
                .await?;
            Ok(())
        })
        .business_key(call_key)
    }};
}

macro_rules! key_tests {
    ($backend:ident, $db:ty, $store:expr) => {
        mod $backend {
            use super::*;

            type Db = $db;

            async fn setup() -> Store<Db> {
                let store: Store<Db> = $store;
                sqlx::query(
                    "CREATE TABLE calls (consumer TEXT NOT NULL, account TEXT NOT NULL, message_id TEXT NOT NULL)",
                )
                .execute(store.pool())
                .await
                .unwrap();
                store
            }

            /// The `calls` rows: (consumer, account, message id), sorted.
            async fn calls(store: &Store<Db>) -> Vec<(String, String, String)> {
                sqlx::query_as(
                    "SELECT consumer, account, message_id FROM calls ORDER BY consumer, account, message_id",
                )
                .fetch_all(store.pool())
                .await
                .unwrap()
            }

            /// Inbox rows per consumer: (consumer, message id, tenant), sorted.
            async fn markers(store: &Store<Db>) -> Vec<(String, String, Option<String>)> {
                sqlx::query_as(
                    "SELECT consumer_name, message_id, tenant_id FROM txinbox_inbox ORDER BY consumer_name, message_id, tenant_id",
                )
                .fetch_all(store.pool())
                .await
                .unwrap()
            }

            fn row(c: &str, a: &str, id: &str) -> (String, String, String) {
                (c.into(), a.into(), id.into())
            }

            #[tokio::test]
            async fn two_consumers_apply_the_same_message_independently() {
                let store = setup().await;
                let a = consumer!(store, "crm-followup");
                let b = consumer!(store, "analytics");
                let q = MemoryQueue::default();
                let msg = || book("evt-1", "acme", None);

                assert!(matches!(a.process_one(deliver(&q, msg())).await, Outcome::Applied { .. }));
                // A applied it: B has not, and applies it once.
                assert!(matches!(b.process_one(deliver(&q, msg())).await, Outcome::Applied { .. }));
                assert_eq!(b.process_one(deliver(&q, msg())).await.kind(), OutcomeKind::Duplicate);
                assert_eq!(a.process_one(deliver(&q, msg())).await.kind(), OutcomeKind::Duplicate);

                assert_eq!(
                    calls(&store).await,
                    vec![row("analytics", "acme", "evt-1"), row("crm-followup", "acme", "evt-1")]
                );
                assert_eq!(
                    markers(&store).await,
                    vec![
                        ("analytics".into(), "evt-1".into(), None),
                        ("crm-followup".into(), "evt-1".into(), None)
                    ]
                );
                let st = q.state();
                assert_eq!(
                    (st.visible, st.in_flight, st.delayed, st.dead_lettered),
                    (0, 0, 0, 0),
                    "every delivery acknowledged after its commit"
                );
            }

            #[tokio::test]
            async fn a_business_key_is_unique_per_consumer_and_tenant() {
                let store = setup().await;
                let c = consumer!(store, "crm-followup");
                let q = MemoryQueue::default();

                // Two tenants ask for the same business action: both apply.
                let t1 = c.process_one(deliver(&q, book("evt-1", "acme", Some("tenant-1")))).await;
                let t2 = c.process_one(deliver(&q, book("evt-2", "acme", Some("tenant-2")))).await;
                assert!(matches!(t1, Outcome::Applied { .. }), "{t1:?}");
                assert!(matches!(t2, Outcome::Applied { .. }), "{t2:?}");
                // The same tenant asks again under another message id: a business duplicate of evt-1.
                match c.process_one(deliver(&q, book("evt-3", "acme", Some("tenant-1")))).await {
                    Outcome::BusinessDuplicate { holder_message_id, .. } => {
                        assert_eq!(holder_message_id, "evt-1")
                    }
                    other => panic!("expected a business duplicate of evt-1, got {other:?}"),
                }
                // Messages without a tenant: unique per consumer among themselves, as before, and apart from
                // every tenant's.
                let n1 = c.process_one(deliver(&q, book("evt-4", "acme", None))).await;
                assert!(matches!(n1, Outcome::Applied { .. }), "{n1:?}");
                match c.process_one(deliver(&q, book("evt-5", "acme", None))).await {
                    Outcome::BusinessDuplicate { holder_message_id, .. } => {
                        assert_eq!(holder_message_id, "evt-4")
                    }
                    other => panic!("expected a business duplicate of evt-4, got {other:?}"),
                }

                assert_eq!(
                    calls(&store).await,
                    vec![
                        row("crm-followup", "acme", "evt-1"),
                        row("crm-followup", "acme", "evt-2"),
                        row("crm-followup", "acme", "evt-4")
                    ]
                );
                assert_eq!(
                    markers(&store).await,
                    vec![
                        ("crm-followup".into(), "evt-1".into(), Some("tenant-1".into())),
                        ("crm-followup".into(), "evt-2".into(), Some("tenant-2".into())),
                        ("crm-followup".into(), "evt-4".into(), None)
                    ]
                );
                let rejected: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM txinbox_rejections WHERE kind = 'business_duplicate'",
                )
                .fetch_one(store.pool())
                .await
                .unwrap();
                assert_eq!(rejected, 2, "one evidence row per business duplicate");
            }
        }
    };
}

key_tests!(sqlite, sqlx::Sqlite, sqlite_store().await);
key_tests!(postgres, sqlx::Postgres, pg_store(4).await);

/// The schema script up to and including version 3 (what a database created by the previous release holds).
fn script_up_to_v3<DB: txinbox::store::Backend>() -> String {
    let all = Store::<DB>::migration_sql();
    let cut = all
        .find("\n-- 0004_")
        .expect("this build ships migration 4 after 3");
    all[..cut].to_owned()
}

/// What must hold once a store holding a version-3 marker (tenant-1's `book_call:acme`, message `evt-old`) was
/// opened by this release: version 4 applied, tenant-2 may ask for the same action, tenant-1 may not, the old
/// marker kept.
macro_rules! after_migration {
    ($store:expr) => {{
        let store = &$store;
        sqlx::query("CREATE TABLE calls (consumer TEXT NOT NULL, account TEXT NOT NULL, message_id TEXT NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        let version: i64 = sqlx::query_scalar("SELECT max(version) FROM txinbox_schema_version")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(version, 7, "every later migration applied in place");
        let c = consumer!(store, "crm-followup");
        let q = MemoryQueue::default();
        // tenant-2 asks for the same action: it applies now (the old index refused it).
        let t2 = c
            .process_one(deliver(&q, book("evt-2", "acme", Some("tenant-2"))))
            .await;
        assert!(matches!(t2, Outcome::Applied { .. }), "{t2:?}");
        // tenant-1 asks again: the old marker still holds the key.
        match c
            .process_one(deliver(&q, book("evt-3", "acme", Some("tenant-1"))))
            .await
        {
            Outcome::BusinessDuplicate {
                holder_message_id, ..
            } => assert_eq!(holder_message_id, "evt-old"),
            other => panic!("expected a business duplicate of evt-old, got {other:?}"),
        }
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM txinbox_inbox")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(rows, 2, "the old marker and evt-2's");
    }};
}

#[tokio::test]
async fn a_version_3_postgres_store_is_migrated_and_keeps_its_markers() {
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&pg_url()).await.unwrap();
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .unwrap();
    {
        let opts: sqlx::postgres::PgConnectOptions = pg_url().parse().unwrap();
        let mut conn = sqlx::PgConnection::connect_with(&opts.options([("search_path", &schema)]))
            .await
            .unwrap();
        sqlx::raw_sql(&script_up_to_v3::<sqlx::Postgres>())
            .execute(&mut conn)
            .await
            .unwrap();
        // A marker the old release wrote: tenant-1's follow-up call for acme.
        sqlx::query("INSERT INTO txinbox_inbox (consumer_name, source, message_id, business_key, payload_hash, tenant_id, received_at, processed_at, retention_until, id_origin) VALUES ('crm-followup', 'crm', 'evt-old', 'book_call:acme', 'h', 'tenant-1', now(), now(), now() + interval '7 days', 'cloudevents')")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    // The new release opens it (Migrations::Apply, the default): version 4 is applied in place.
    let store = Store::<sqlx::Postgres>::connect_in_schema(&pg_url(), &schema, 2)
        .await
        .unwrap();
    after_migration!(store);
    store.close().await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&admin)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_version_3_sqlite_store_is_migrated_and_keeps_its_markers() {
    let dir = std::env::temp_dir().join(format!("txinbox-keys-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}?mode=rwc", dir.join("inbox.db").display());
    {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::raw_sql(&script_up_to_v3::<sqlx::Sqlite>())
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO txinbox_inbox (consumer_name, source, message_id, business_key, payload_hash, tenant_id, received_at, processed_at, retention_until, id_origin) VALUES ('crm-followup', 'crm', 'evt-old', 'book_call:acme', 'h', 'tenant-1', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', '2999-01-01T00:00:00Z', 'cloudevents')")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
    let store = Store::<sqlx::Sqlite>::connect(&url).await.unwrap();
    after_migration!(store);
    store.close().await;
    std::fs::remove_dir_all(&dir).ok();
}
