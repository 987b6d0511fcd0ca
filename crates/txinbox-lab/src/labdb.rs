//! The lab's business table: one row per business effect (a follow-up task in the CRM), and what the lab
//! reads of a store ([`LabStore`]).
//!
//! The table has no unique constraint of its own on purpose: if the inbox let a redelivery through, the lab
//! would see a second row. On the SQL stores the statements use `$N` placeholders, which PostgreSQL and
//! SQLite both accept, so one function serves both backends ([`LabDb`]); on DynamoDB a task is an item of
//! the inbox's own table under a key prefix of the lab's, put with no condition.

use futures::future::BoxFuture;
use sqlx::{Database, Decode, Encode, Executor, IntoArguments, Type};
use txinbox_core::effects::EffectStore;
use txinbox_core::runtime::maintenance::MaintenanceStore;
use txinbox_core::{Handled, HandlerError, InboxStore, Message};
use txinbox_dynamodb::aws_sdk_dynamodb::types::{AttributeValue, Put, Select};
use txinbox_dynamodb::{DynamoError, DynamoStore, DynamoTx};
use txinbox_store::{Backend, Store, Tx};

use crate::lab::{LabError, LabEvent};

/// A store the lab and the failure windows run on: the inbox, its effects and its maintenance, plus the
/// lab's business table and the counts the windows check.
pub trait LabStore: InboxStore + EffectStore + MaintenanceStore {
    /// Creates the business table if missing.
    fn create_tables(&self) -> BoxFuture<'_, Result<(), LabError>>;
    /// Inserts one follow-up task (the business effect) in the inbox transaction.
    fn insert_task(
        tx: Self::Tx,
        msg: Message<LabEvent>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>>;
    /// Counts the business effects.
    fn count_tasks(&self) -> BoxFuture<'_, Result<i64, LabError>>;
    /// The state and result reference of the (one) effect recorded.
    fn effect_state(&self) -> BoxFuture<'_, Result<(String, Option<String>), LabError>>;
    /// Counts the evidence rows of a kind (`payload_collision`, `business_duplicate`).
    fn count_rejections<'a>(&'a self, kind: &'a str) -> BoxFuture<'a, Result<i64, LabError>>;
    /// Counts a consumer's inbox rows (markers) present in the store, expired or not.
    fn count_markers<'a>(&'a self, consumer: &'a str) -> BoxFuture<'a, Result<i64, LabError>>;
    /// Whether the maintenance deletes expired markers itself (`true` on the SQL stores); `false` where the
    /// database's TTL deletes them later (DynamoDB), the store's conditions treating them as absent from the
    /// moment they expire.
    fn purges_expired_markers(&self) -> bool {
        true
    }
    /// Whether the store decides the marker at COMMIT (DynamoDB: one `TransactWriteItems` carries it), so
    /// that a second copy runs its handler before its commit is refused; `false` where the marker insert
    /// waits on the first copy's row (the SQL stores).
    fn decides_at_commit(&self) -> bool {
        false
    }
    /// Whether expired markers go away with whole partitions (the PostgreSQL store's partitioned layout): the
    /// maintenance deletes no row, and its pass reports the partitions it dropped.
    fn drops_partitions(&self) -> bool {
        false
    }
    /// How many sessions that hold the inbox's marker table wait on a lock: a copy whose marker insert waits
    /// on another copy's uncommitted marker (PostgreSQL, `pg_locks`). `None` where the store cannot tell:
    /// SQLite waits inside its busy handler (or for the pool's connection), and a store that decides at
    /// commit (DynamoDB) takes no lock.
    fn sessions_waiting_on_markers(&self) -> BoxFuture<'_, Result<Option<i64>, LabError>> {
        Box::pin(async { Ok(None) })
    }
}

impl<DB: LabDb> LabStore for Store<DB> {
    fn drops_partitions(&self) -> bool {
        self.partitioned_as_last_read()
    }
    fn create_tables(&self) -> BoxFuture<'_, Result<(), LabError>> {
        Box::pin(async move { Ok(DB::create_tables(self).await?) })
    }
    fn insert_task(
        tx: Tx<DB>,
        msg: Message<LabEvent>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        DB::insert_task(tx, msg)
    }
    fn count_tasks(&self) -> BoxFuture<'_, Result<i64, LabError>> {
        Box::pin(async move { Ok(DB::count_tasks(self).await?) })
    }
    fn effect_state(&self) -> BoxFuture<'_, Result<(String, Option<String>), LabError>> {
        Box::pin(async move { Ok(DB::effect_state(self).await?) })
    }
    fn count_rejections<'a>(&'a self, kind: &'a str) -> BoxFuture<'a, Result<i64, LabError>> {
        Box::pin(async move { Ok(DB::count_rejections(self, kind).await?) })
    }
    fn count_markers<'a>(&'a self, consumer: &'a str) -> BoxFuture<'a, Result<i64, LabError>> {
        Box::pin(async move { Ok(self.inbox_rows(consumer).await?) })
    }
    fn sessions_waiting_on_markers(&self) -> BoxFuture<'_, Result<Option<i64>, LabError>> {
        Box::pin(async move { Ok(DB::sessions_waiting_on_markers(self).await?) })
    }
}

/// The key prefix of the lab's tasks in the inbox's table.
const TASK_PREFIX: &str = "lab#task#";

/// The items of the lab's (fresh, small) table that match `filter`: a `Scan`, which the lab can afford and a
/// production reader never needs (the operator commands go through keys and indexes).
async fn scan_count(
    store: &DynamoStore,
    filter: &str,
    values: &[(&str, &str)],
) -> Result<i64, LabError> {
    let mut count = 0i64;
    let mut start = None;
    loop {
        let mut req = store
            .client()
            .scan()
            .table_name(store.table())
            .consistent_read(true)
            .select(Select::Count)
            .filter_expression(filter)
            .set_exclusive_start_key(start);
        for (k, v) in values {
            req = req.expression_attribute_values(*k, AttributeValue::S((*v).to_owned()));
        }
        let out = req
            .send()
            .await
            .map_err(|e| DynamoError::from_sdk("Scan", e))?;
        count += i64::from(out.count());
        start = out.last_evaluated_key().cloned();
        if start.is_none() {
            return Ok(count);
        }
    }
}

impl LabStore for DynamoStore {
    fn create_tables(&self) -> BoxFuture<'_, Result<(), LabError>> {
        // The tasks live in the inbox's table, under the lab's prefix.
        Box::pin(async { Ok(()) })
    }
    fn insert_task(
        tx: DynamoTx,
        msg: Message<LabEvent>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        Box::pin(async move {
            let task_id = format!("task-{}", uuid::Uuid::new_v4().simple());
            let mut put = Put::builder()
                .table_name(tx.inbox_table())
                .item("pk", AttributeValue::S(format!("{TASK_PREFIX}{task_id}")))
                .item("kind", AttributeValue::S("lab_task".into()))
                .item(
                    "message_id",
                    AttributeValue::S(msg.identity.message_id.clone()),
                )
                .item(
                    "created_at",
                    AttributeValue::S(chrono::Utc::now().to_rfc3339()),
                );
            if let Some(k) = &msg.identity.business_key {
                put = put.item("business_key", AttributeValue::S(k.clone()));
            }
            let put = put.build().map_err(HandlerError::permanent)?;
            tx.put(put)?;
            Ok(Handled::reference(task_id))
        })
    }
    fn count_tasks(&self) -> BoxFuture<'_, Result<i64, LabError>> {
        Box::pin(scan_count(self, "kind = :k", &[(":k", "lab_task")]))
    }
    fn effect_state(&self) -> BoxFuture<'_, Result<(String, Option<String>), LabError>> {
        Box::pin(async move {
            let out = self
                .client()
                .scan()
                .table_name(self.table())
                .consistent_read(true)
                .filter_expression("kind = :k")
                .expression_attribute_values(":k", AttributeValue::S("effect".into()))
                .send()
                .await
                .map_err(|e| DynamoError::from_sdk("Scan", e))?;
            let item = out
                .items()
                .first()
                .ok_or_else(|| LabError::Usage("no effect recorded".into()))?;
            let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
            Ok((text("state").unwrap_or_default(), text("result_reference")))
        })
    }
    fn count_rejections<'a>(&'a self, kind: &'a str) -> BoxFuture<'a, Result<i64, LabError>> {
        Box::pin(async move {
            scan_count(
                self,
                "kind = :k AND begins_with(pk, :r)",
                &[(":k", kind), (":r", "r#")],
            )
            .await
        })
    }
    fn count_markers<'a>(&'a self, consumer: &'a str) -> BoxFuture<'a, Result<i64, LabError>> {
        Box::pin(async move {
            scan_count(
                self,
                "kind = :k AND consumer = :c",
                &[(":k", "marker"), (":c", consumer)],
            )
            .await
        })
    }
    fn purges_expired_markers(&self) -> bool {
        false
    }
    fn decides_at_commit(&self) -> bool {
        true
    }
}

/// A backend the lab can run on: every sqlx store backend whose driver binds and reads what the lab's
/// statements use (PostgreSQL and SQLite). The bounds are spelled here once.
pub trait LabDb: Backend {
    /// Creates the business table if missing.
    fn create_tables(store: &Store<Self>) -> BoxFuture<'_, Result<(), sqlx::Error>>;
    /// Inserts one follow-up task (the business effect) in the inbox transaction.
    fn insert_task(
        tx: Tx<Self>,
        msg: Message<LabEvent>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>>;
    /// Counts the business effects.
    fn count_tasks(store: &Store<Self>) -> BoxFuture<'_, Result<i64, sqlx::Error>>;
    /// The state and result reference of the (one) effect recorded.
    fn effect_state(
        store: &Store<Self>,
    ) -> BoxFuture<'_, Result<(String, Option<String>), sqlx::Error>>;
    /// Counts rows in the rejections table of a kind.
    fn count_rejections<'a>(
        store: &'a Store<Self>,
        kind: &'a str,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>>;
    /// See [`LabStore::sessions_waiting_on_markers`].
    fn sessions_waiting_on_markers(
        store: &Store<Self>,
    ) -> BoxFuture<'_, Result<Option<i64>, sqlx::Error>>;
}

impl<DB> LabDb for DB
where
    DB: Backend,
    for<'c> &'c Tx<DB>: Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> Option<String>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB>,
    for<'r> Option<String>: Decode<'r, DB>,
    for<'r> (String, Option<String>): sqlx::FromRow<'r, DB::Row>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    fn create_tables(store: &Store<Self>) -> BoxFuture<'_, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query("CREATE TABLE IF NOT EXISTS lab_tasks (task_id TEXT NOT NULL, message_id TEXT NOT NULL, business_key TEXT, created_at TEXT NOT NULL)")
                .execute(store.pool())
                .await?;
            Ok(())
        })
    }

    fn insert_task(
        tx: Tx<Self>,
        msg: Message<LabEvent>,
    ) -> BoxFuture<'static, Result<Handled, HandlerError>> {
        Box::pin(async move {
            let task_id = format!("task-{}", uuid::Uuid::new_v4().simple());
            sqlx::query("INSERT INTO lab_tasks (task_id, message_id, business_key, created_at) VALUES ($1, $2, $3, $4)")
                .bind(task_id.clone())
                .bind(msg.identity.message_id.clone())
                .bind(msg.identity.business_key.clone())
                .bind(chrono::Utc::now().to_rfc3339())
                .execute(&tx)
                .await?;
            Ok(Handled::reference(task_id))
        })
    }

    fn count_tasks(store: &Store<Self>) -> BoxFuture<'_, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar("SELECT count(*) FROM lab_tasks")
                .fetch_one(store.pool())
                .await
        })
    }

    fn effect_state(
        store: &Store<Self>,
    ) -> BoxFuture<'_, Result<(String, Option<String>), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_as(
                "SELECT state, result_reference FROM txinbox_effects ORDER BY id LIMIT 1",
            )
            .fetch_one(store.pool())
            .await
        })
    }

    fn count_rejections<'a>(
        store: &'a Store<Self>,
        kind: &'a str,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar("SELECT count(*) FROM txinbox_rejections WHERE kind = $1")
                .bind(kind)
                .fetch_one(store.pool())
                .await
        })
    }

    fn sessions_waiting_on_markers(
        store: &Store<Self>,
    ) -> BoxFuture<'_, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            if <Self as Backend>::NAME != "postgres" {
                return Ok(None);
            }
            // A session holding a lock on this schema's marker table (the insert's, on the partitioned table
            // too) with a lock not granted: a marker insert waiting on another transaction's row. The table is
            // named through the store's search_path, so the sessions of other schemas do not count.
            sqlx::query_scalar("SELECT count(DISTINCT w.pid) FROM pg_locks w WHERE NOT w.granted AND w.pid IN (SELECT h.pid FROM pg_locks h WHERE h.granted AND h.relation = to_regclass('txinbox_inbox'))")
                .fetch_one(store.pool())
                .await
                .map(Some)
        })
    }
}
