//! Store errors.

/// An error from the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database returned an error.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed.
    #[error("migration {version} failed: {source}")]
    Migration {
        /// The migration version.
        version: i64,
        /// The cause.
        #[source]
        source: sqlx::Error,
    },
    /// The database has migrations newer than this build knows.
    #[error("database schema version {found} is newer than this build's {known}")]
    SchemaTooNew {
        /// Version in the database.
        found: i64,
        /// Latest version this build knows.
        known: i64,
    },
    /// The database's schema is older than this build needs and migrations were not to be applied
    /// ([`crate::Migrations::Verify`]): apply [`crate::Store::migration_sql`] with your migration tool.
    #[error("database schema version {found} is older than this build's {required}: apply the txinbox migrations (Store::migration_sql) or let the store apply them")]
    SchemaTooOld {
        /// Version in the database (0 when the version table is missing).
        found: i64,
        /// The version this build needs.
        required: i64,
    },
    /// Bad configuration (consumer name, URL, ...).
    #[error("invalid configuration: {0}")]
    Config(#[source] txinbox_core::BadInput),
    /// Partitioned layout options the layout cannot use ([`crate::partitions::PartitionOptions::check`]).
    #[error("invalid partition options: {0}")]
    Partitions(String),
    /// A table of the partitioned layout has a default partition (one made by hand: the layout makes none).
    /// A row of a bucket without its partition would land there instead of being released and retried (a
    /// marker there is out of reach of its bucket's unique index, and no rotation drops it), and creating the
    /// partition of a bucket it holds rows of fails; the rotation and the layout's status refuse it.
    #[error("{table} has a default partition {partition}, which the partitioned layout refuses (rows of a bucket without a partition land there, out of their bucket's unique index, never dropped): detach it (ALTER TABLE {table} DETACH PARTITION {partition}), move its rows into {table} once the rotation has made their partitions (INSERT INTO {table} SELECT * FROM {partition}), then drop it")]
    DefaultPartition {
        /// The partitioned table (`txinbox_inbox`, `txinbox_rejections` or `txinbox_effects`).
        table: String,
        /// The default partition, as SQL names it (quoted when it must be).
        partition: String,
    },
    /// A store URL is neither `sqlite:` nor `postgres://`, or names a backend not compiled in.
    #[error("unsupported store URL scheme {scheme:?} (expected sqlite: or postgres://)")]
    UnsupportedUrl {
        /// The scheme found (never the whole URL, which may hold a password).
        scheme: String,
    },
}

impl StoreError {
    /// Whether a retry may succeed (connection trouble, serialization failure, deadlock, busy database).
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Database(e) => is_transient(e),
            _ => false,
        }
    }
}

/// Whether a sqlx error is transient: I/O, pool timeout, serialization failure, deadlock, lock timeout,
/// SQLite busy/locked.
pub fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => matches!(
            db.code().as_deref(),
            // PostgreSQL: serialization_failure, deadlock_detected, lock_not_available, admin shutdown,
            // cannot_connect_now, too_many_connections.
            Some("40001" | "40P01" | "55P03" | "57P01" | "57P03" | "53300")
            // SQLite: SQLITE_BUSY (5), SQLITE_LOCKED (6) and their extended codes.
            | Some("5" | "6" | "261" | "517" | "262")
        ),
        _ => false,
    }
}
