//! The lab's business table: one row per business effect (a follow-up task in the CRM).
//!
//! The table has no unique constraint of its own on purpose: if the inbox let a redelivery through, the lab
//! would see a second row. The statements use `$N` placeholders, which PostgreSQL and SQLite both accept, so
//! one function serves both backends.

use futures::future::BoxFuture;
use sqlx::{Database, Decode, Encode, Executor, IntoArguments, Type};
use txinbox_core::{Handled, HandlerError, Message};
use txinbox_store::{Backend, Store, Tx};

use crate::lab::LabEvent;

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
}
