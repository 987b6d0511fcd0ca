//! The lab's business table on each backend: one row per business effect (a follow-up task in the CRM).
//!
//! The table has no unique constraint of its own on purpose: if the inbox let a redelivery through, the lab
//! would see a second row.

use futures::future::BoxFuture;
use sqlx::{Postgres, Sqlite};
use txinbox_core::HandlerError;
use txinbox_store::{db_error, Backend, Handled, Inbound};

/// A backend the lab can run on.
pub trait LabDb: Backend {
    /// Creates the business table if missing.
    fn create_tables(pool: &sqlx::Pool<Self>) -> BoxFuture<'_, Result<(), sqlx::Error>>;
    /// Inserts one follow-up task (the business effect) in the inbox transaction.
    fn insert_task<'a>(
        conn: &'a mut Self::Connection,
        msg: &'a Inbound<'a>,
    ) -> BoxFuture<'a, Result<Handled, HandlerError>>;
    /// Counts the business effects.
    fn count_tasks(pool: &sqlx::Pool<Self>) -> BoxFuture<'_, Result<i64, sqlx::Error>>;
    /// Counts rows in the rejections table of a kind.
    fn count_rejections<'a>(
        pool: &'a sqlx::Pool<Self>,
        kind: &'a str,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>>;
}

macro_rules! lab_db {
    ($db:ty, $insert:literal, $rej:literal) => {
        impl LabDb for $db {
            fn create_tables(pool: &sqlx::Pool<Self>) -> BoxFuture<'_, Result<(), sqlx::Error>> {
                Box::pin(async move {
                    sqlx::query("CREATE TABLE IF NOT EXISTS lab_tasks (task_id TEXT NOT NULL, message_id TEXT NOT NULL, business_key TEXT, created_at TEXT NOT NULL)")
                        .execute(pool)
                        .await?;
                    Ok(())
                })
            }

            fn insert_task<'a>(
                conn: &'a mut Self::Connection,
                msg: &'a Inbound<'a>,
            ) -> BoxFuture<'a, Result<Handled, HandlerError>> {
                Box::pin(async move {
                    let task_id = format!("task-{}", uuid::Uuid::new_v4().simple());
                    sqlx::query($insert)
                        .bind(&task_id)
                        .bind(&msg.identity.message_id)
                        .bind(&msg.identity.business_key)
                        .bind(chrono::Utc::now().to_rfc3339())
                        .execute(&mut *conn)
                        .await
                        .map_err(db_error)?;
                    Ok(Handled::reference(task_id))
                })
            }

            fn count_tasks(pool: &sqlx::Pool<Self>) -> BoxFuture<'_, Result<i64, sqlx::Error>> {
                Box::pin(async move { sqlx::query_scalar("SELECT count(*) FROM lab_tasks").fetch_one(pool).await })
            }

            fn count_rejections<'a>(pool: &'a sqlx::Pool<Self>, kind: &'a str) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
                Box::pin(async move { sqlx::query_scalar($rej).bind(kind).fetch_one(pool).await })
            }
        }
    };
}

lab_db!(
    Postgres,
    "INSERT INTO lab_tasks (task_id, message_id, business_key, created_at) VALUES ($1, $2, $3, $4)",
    "SELECT count(*) FROM txinbox_rejections WHERE kind = $1"
);
lab_db!(
    Sqlite,
    "INSERT INTO lab_tasks (task_id, message_id, business_key, created_at) VALUES (?1, ?2, ?3, ?4)",
    "SELECT count(*) FROM txinbox_rejections WHERE kind = ?1"
);
