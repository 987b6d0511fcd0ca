//! What each database backend provides: its SQL, and nothing of the pipeline's policy. Implemented for [`sqlx::Postgres`] and [`sqlx::Sqlite`] (each behind
//! its feature); the trait is sealed.

use std::future::Future;

use chrono::{DateTime, Utc};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use txinbox_core::effects::EffectState;
use txinbox_core::effects::{ClaimedEffect, EffectCount, NewEffect, TransitionColumns};
#[allow(unused_imports)]
use txinbox_core::runtime::maintenance::MaintenanceStore;
use txinbox_core::runtime::maintenance::{MaintenanceOptions, PartitionRotation, Table};

use crate::partitions::LayoutState;
use txinbox_core::{Identity, MarkerInsert, MarkerRow, Rejection};

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

    /// Whether the inbox can write on this connection, beyond answering: `Some(why)` when it cannot (the
    /// readiness check's second step, after the ping). An error is the database's (a missing table).
    fn unready(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send;

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

    /// Inserts the markers of a batch in order, each unless a unique constraint refuses it; reads the holder
    /// of each refused one (see [`txinbox_core::InboxStore::insert_markers`]).
    fn insert_markers(
        conn: &mut Self::Connection,
        rows: &[MarkerRow<'_>],
    ) -> impl Future<Output = Result<Vec<MarkerInsert>, sqlx::Error>> + Send;

    /// Stores the handler's result reference on the marker (same transaction): the one of the partition
    /// starting at `bucket` when the layout is partitioned (an identity may have a marker in each of several
    /// buckets, each another message's), else the identity's.
    fn set_result_reference(
        conn: &mut Self::Connection,
        identity: &Identity,
        reference: &str,
        bucket: Option<DateTime<Utc>>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Writes an effect intent (same transaction).
    fn insert_effect(
        conn: &mut Self::Connection,
        e: &NewEffect<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Opens the savepoint of one delivery of a batch (same transaction).
    fn savepoint(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Rolls back to the latest savepoint, keeping the transaction open.
    fn rollback_to_savepoint(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Whether the open transaction can still commit after a statement of the handler failed: an error when
    /// the failure aborted it (PostgreSQL, unless the handler rolled back to a savepoint of its own).
    fn transaction_usable(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Whether the statement that just failed ended the open transaction. SQLite rolls the whole transaction
    /// back on some failures (`INSERT OR ROLLBACK`, `RAISE(ROLLBACK)`, and `SQLITE_FULL`, `SQLITE_IOERR`,
    /// `SQLITE_BUSY` or `SQLITE_NOMEM` in some statements) and runs every later statement in a transaction of
    /// its own, committed at once; when it did, this opens a transaction again (one that is never committed),
    /// so that nothing after the failure commits on its own. PostgreSQL: never (an aborted transaction refuses
    /// every statement until it ends).
    fn transaction_lost(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// The database's clock, when every node reads the same one (PostgreSQL's `now()`); `None` where the store
    /// is on one host and its clock is that host's (SQLite).
    fn clock(
        pool: &sqlx::Pool<Self>,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>, sqlx::Error>> + Send;

    /// Records a rejection (own transaction).
    fn record_rejection(
        pool: &sqlx::Pool<Self>,
        r: &Rejection<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Counts the markers of `consumer`.
    fn count_markers(
        pool: &sqlx::Pool<Self>,
        consumer: &str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// Claims due effects (see [`txinbox_core::effects::EffectStore::claim_effects`]); a `limit` below one
    /// is one (here and in the purges: a negative LIMIT is an error on PostgreSQL and none on SQLite). The
    /// holder's name is free text (a NUL is kept as U+FFFD), here and in [`Backend::finish_effect`]. The
    /// claim lasts `claim_until - now`, counted from the database's clock (PostgreSQL's server, SQLite's
    /// host), which also decides which claims expired ([`txinbox_core::effects::claim_end`]).
    fn claim_effects(
        pool: &sqlx::Pool<Self>,
        holder: &str,
        destinations: &[String],
        now: DateTime<Utc>,
        claim_until: DateTime<Utc>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<ClaimedEffect>, sqlx::Error>> + Send;

    /// Gives back the effects the claim named `holder` took (see
    /// [`txinbox_core::effects::EffectStore::release_claim`]): each returns to the state the claim kept in
    /// `claimed_from`; one taken from an expired claim stays in flight, its claim ended at the database's
    /// clock (due at once).
    fn release_claim(
        pool: &sqlx::Pool<Self>,
        holder: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Records a transition if `holder` still holds the claim.
    fn finish_effect(
        pool: &sqlx::Pool<Self>,
        id: i64,
        holder: &str,
        t: &TransitionColumns<'_>,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Deletes up to `limit` done effects finished before `before`.
    fn purge_done_effects(
        pool: &sqlx::Pool<Self>,
        before: DateTime<Utc>,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The effect with this key, as it is now; of several (the partitioned layout), the newest by creation, then id.
    fn find_effect(
        pool: &sqlx::Pool<Self>,
        key: &str,
    ) -> impl Future<Output = Result<Option<ClaimedEffect>, sqlx::Error>> + Send;

    /// Every effect with this key, as it is now, oldest first (by creation, then id).
    fn find_effects(
        pool: &sqlx::Pool<Self>,
        key: &str,
    ) -> impl Future<Output = Result<Vec<ClaimedEffect>, sqlx::Error>> + Send;

    /// Marks a done effect compensated.
    fn mark_compensated(
        pool: &sqlx::Pool<Self>,
        id: i64,
        note: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Deletes up to `limit` expired rows of `table` (see [`txinbox_core::runtime::maintenance::MaintenanceStore`]);
    /// returns the consumer of each deleted row.
    fn purge_batch(
        pool: &sqlx::Pool<Self>,
        table: Table,
        before: DateTime<Utc>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send;

    /// The markers of `consumer` in the frozen row-by-row table of a converted inbox, and the oldest one's
    /// processing time ([`crate::partitions`]; only PostgreSQL has one): none without it.
    fn legacy_markers(
        pool: &sqlx::Pool<Self>,
        consumer: &str,
    ) -> impl Future<Output = Result<(i64, Option<DateTime<Utc>>), sqlx::Error>> + Send {
        let _ = (pool, consumer);
        async { Ok((0, None)) }
    }

    /// Rows of `table` for `consumer`, and the time of the oldest.
    fn table_stats(
        pool: &sqlx::Pool<Self>,
        table: Table,
        consumer: &str,
    ) -> impl Future<Output = Result<(i64, Option<DateTime<Utc>>), sqlx::Error>> + Send;

    /// Effects by consumer, destination and state.
    fn effect_counts(
        pool: &sqlx::Pool<Self>,
    ) -> impl Future<Output = Result<Vec<EffectCount>, sqlx::Error>> + Send;

    /// The partitioned layout ([`crate::partitions`]), when the database has one (only PostgreSQL can).
    /// Never fails on a missing table: it may run inside the inbox transaction.
    fn load_layout(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<Option<LayoutState>, sqlx::Error>> + Send {
        let _ = conn;
        async { Ok(None) }
    }

    /// Inserts markers in the partitioned layout (see [`Backend::insert_markers`]).
    fn insert_markers_partitioned(
        conn: &mut Self::Connection,
        rows: &[MarkerRow<'_>],
        layout: &LayoutState,
    ) -> impl Future<Output = Result<Vec<MarkerInsert>, sqlx::Error>> + Send {
        let _ = (conn, rows, layout);
        async {
            Err(sqlx::Error::Protocol(
                "only a PostgreSQL store has a partitioned layout".into(),
            ))
        }
    }

    /// Whether `e` says the layout changed under the store (a partition dropped or missing, the table
    /// converted): the store reads its layout again.
    fn is_layout_error(e: &sqlx::Error) -> bool {
        let _ = e;
        false
    }

    /// Creates and drops partitions (see [`MaintenanceStore::rotate_partitions`]).
    fn rotate_partitions(
        pool: &sqlx::Pool<Self>,
        now: DateTime<Utc>,
        opts: &MaintenanceOptions,
    ) -> impl Future<Output = Result<Option<PartitionRotation>, StoreError>> + Send {
        let _ = (pool, now, opts);
        async { Ok(None) }
    }
}

/// The columns of a claimed effect, in this order, after `RETURNING` or `SELECT`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const CLAIMED_COLUMNS: &str = "id, consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, attempts, reconciliations, maybe_happened, sent_hash";

/// How many [`CLAIMED_COLUMNS`] there are: the index of the first column after them.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const AFTER_CLAIMED: usize = 13;

/// Reads the [`CLAIMED_COLUMNS`] of a row; `from` is the state before the claim, `created_at` its time.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn claimed_from_row<'r, R>(
    r: &'r R,
    from: &str,
    created_at: DateTime<Utc>,
) -> Result<ClaimedEffect, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database>,
{
    let metadata: String = r.try_get(7)?;
    Ok(ClaimedEffect {
        id: r.try_get(0)?,
        consumer: r.try_get(1)?,
        message_id: r.try_get(2)?,
        key: r.try_get(3)?,
        name: r.try_get(4)?,
        destination: r.try_get(5)?,
        payload: r.try_get(6)?,
        metadata: serde_json::from_str(&metadata).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        external_ref: r.try_get(8)?,
        attempts: r.try_get(9)?,
        reconciliations: r.try_get(10)?,
        claimed_from: EffectState::parse(from)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown effect state {from:?}").into()))?,
        created_at,
        reference: None,
        maybe_happened: r.try_get(11)?,
        sent_hash: r.try_get(12)?,
    })
}

/// A date as both stores keep it: within years 1 to 9999, to the microsecond (rounded down). A date past
/// the last instant of year 9999 (a keep of "for ever") is that instant, one before year 1 its first.
/// SQLite's dates are text, in time order only with four-digit years; PostgreSQL keeps the same dates, so
/// that both compare and read back alike (it refused a date before 4713 BC, "timestamp out of range", and
/// rounded one before 2000 towards 2000).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn kept_time(t: DateTime<Utc>) -> DateTime<Utc> {
    txinbox_core::time::kept(t)
}

/// Free text from outside (a destination's reference, an executor's error or request hash, a note) as the
/// stores keep it ([`txinbox_core::store::kept_text`]): a NUL character, which PostgreSQL's `text` refuses (so
/// the write failed on every try) and SQLite keeps, is U+FFFD on both.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn text(s: &str) -> std::borrow::Cow<'_, str> {
    txinbox_core::store::kept_text(s)
}

/// The metadata column of an effect.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn metadata_json(e: &NewEffect<'_>) -> String {
    serde_json::to_string(&e.effect.metadata).unwrap_or_else(|_| "{}".into())
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

/// The savepoint of one delivery of a batch. One name, stacked: PostgreSQL and SQLite both roll back to the
/// latest savepoint of a name and keep it (no `RELEASE`: COMMIT releases them all, one round trip fewer per
/// delivery).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const SAVEPOINT: &str = "SAVEPOINT txinbox_delivery";

/// Undoes one delivery of a batch.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT txinbox_delivery";

/// Migrations shipped with this build, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "inbox",
        postgres: include_str!("../migrations/postgres/0001_inbox.sql"),
        sqlite: include_str!("../migrations/sqlite/0001_inbox.sql"),
    },
    Migration {
        version: 2,
        name: "effects",
        postgres: include_str!("../migrations/postgres/0002_effects.sql"),
        sqlite: include_str!("../migrations/sqlite/0002_effects.sql"),
    },
    Migration {
        version: 3,
        name: "operations",
        postgres: include_str!("../migrations/postgres/0003_operations.sql"),
        sqlite: include_str!("../migrations/sqlite/0003_operations.sql"),
    },
    Migration {
        version: 4,
        name: "tenant_business_key",
        postgres: include_str!("../migrations/postgres/0004_tenant_business_key.sql"),
        sqlite: include_str!("../migrations/sqlite/0004_tenant_business_key.sql"),
    },
    Migration {
        version: 5,
        name: "effect_truth",
        postgres: include_str!("../migrations/postgres/0005_effect_truth.sql"),
        sqlite: include_str!("../migrations/sqlite/0005_effect_truth.sql"),
    },
    Migration {
        version: 6,
        name: "finished_effects",
        postgres: include_str!("../migrations/postgres/0006_finished_effects.sql"),
        sqlite: include_str!("../migrations/sqlite/0006_finished_effects.sql"),
    },
    Migration {
        version: 7,
        name: "claimed_from",
        postgres: include_str!("../migrations/postgres/0007_claimed_from.sql"),
        sqlite: include_str!("../migrations/sqlite/0007_claimed_from.sql"),
    },
];

/// The latest schema version this build knows.
pub(crate) fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}
