//! What each database backend provides: its SQL, and nothing of the pipeline's policy. Implemented for [`sqlx::Postgres`] and [`sqlx::Sqlite`] (each behind
//! its feature); the trait is sealed.

use std::future::Future;

use chrono::{DateTime, Utc};
use txinbox_core::outbox::PendingOutbox;
use txinbox_core::{Identity, MarkerInsert, MarkerRow, OutboxMessage, Rejection};

use crate::error::StoreError;

mod sealed {
    pub trait Sealed {}
}
#[cfg(feature = "postgres")]
impl sealed::Sealed for sqlx::Postgres {}
#[cfg(feature = "sqlite")]
impl sealed::Sealed for sqlx::Sqlite {}

/// A database the inbox runs on.
pub trait Backend: sqlx::Database + sealed::Sealed {
    /// `postgres` or `sqlite`.
    const NAME: &'static str;

    /// Applies the store's migrations (idempotent; safe when several processes start at once).
    fn migrate(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The schema version recorded in `txinbox_schema_version`; `None` when the table does not exist.
    fn schema_version(
        pool: &sqlx::Pool<Self>,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;

    /// This backend's migration SQL (from the `MIGRATIONS` table below).
    fn migration_sql(m: &Migration) -> &'static str;

    /// Inserts the marker unless a unique constraint refuses it; on conflict reads the holder.
    fn insert_marker(
        conn: &mut Self::Connection,
        row: &MarkerRow<'_>,
    ) -> impl Future<Output = Result<MarkerInsert, sqlx::Error>> + Send;

    /// Stores the handler's result reference on the marker (same transaction).
    fn set_result_reference(
        conn: &mut Self::Connection,
        identity: &Identity,
        reference: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Writes an outbox row (same transaction).
    fn insert_outbox(
        conn: &mut Self::Connection,
        msg: &OutboxMessage,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Records a rejection (own transaction).
    fn record_rejection(
        pool: &sqlx::Pool<Self>,
        r: &Rejection<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Deletes up to `limit` markers whose retention ended before `now`; returns how many.
    fn purge_expired(
        pool: &sqlx::Pool<Self>,
        now: DateTime<Utc>,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Counts the markers of `consumer`.
    fn count_markers(
        pool: &sqlx::Pool<Self>,
        consumer: &str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// Up to `limit` outbox rows not yet relayed, oldest first.
    fn pending_outbox(
        pool: &sqlx::Pool<Self>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<PendingOutbox>, sqlx::Error>> + Send;

    /// Marks an outbox row relayed, or records a failed attempt.
    fn finish_outbox(
        pool: &sqlx::Pool<Self>,
        id: i64,
        now: DateTime<Utc>,
        error: Option<&str>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// Reads a row of `SELECT id, destination, source, message_id, event_type, group_id, body, attributes,
/// attempts FROM txinbox_outbox` (the same on every backend).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn pending_outbox_from_row<'r, R>(r: &'r R) -> Result<PendingOutbox, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let attrs: String = r.try_get(7)?;
    Ok(PendingOutbox::new(
        r.try_get(0)?,
        OutboxMessage {
            destination: r.try_get(1)?,
            source: r.try_get(2)?,
            message_id: r.try_get(3)?,
            event_type: r.try_get(4)?,
            group_id: r.try_get(5)?,
            body: r.try_get(6)?,
            attributes: serde_json::from_str(&attrs)
                .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        },
        r.try_get(8)?,
    ))
}

/// One migration shipped with this build.
#[derive(Debug)]
pub struct Migration {
    /// Its version (recorded in `txinbox_schema_version`).
    pub version: i64,
    /// Its name.
    pub name: &'static str,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) postgres: &'static str,
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) sqlite: &'static str,
}

/// Migrations shipped with this build, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "inbox",
    postgres: include_str!("../migrations/postgres/0001_inbox.sql"),
    sqlite: include_str!("../migrations/sqlite/0001_inbox.sql"),
}];

/// The latest schema version this build knows.
pub(crate) fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}
