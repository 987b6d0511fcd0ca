//! Connecting and migrating.

use std::time::Duration;

use crate::backend::Backend;
use crate::error::StoreError;

/// A migrated connection pool for the inbox.
#[derive(Debug)]
pub struct Store<DB: Backend> {
    pool: sqlx::Pool<DB>,
}

// Manual: a derive would require `DB: Clone`, which the database marker types are not.
impl<DB: Backend> Clone for Store<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
        }
    }
}

impl<DB: Backend> Store<DB> {
    /// Wraps an existing pool and applies the migrations.
    pub async fn from_pool(pool: sqlx::Pool<DB>) -> Result<Self, StoreError> {
        DB::migrate(&pool).await?;
        Ok(Self { pool })
    }

    /// The pool: give it to [`crate::Inbox::new`] and use it for your own queries.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// Closes the pool, waiting for connections in use to come back.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(feature = "sqlite")]
impl Store<sqlx::Sqlite> {
    /// Connects to a `sqlite:` URL (`sqlite::memory:` or `sqlite:path.db`; the file is created if
    /// missing), in WAL mode with a 5 s busy timeout, and migrates. An in-memory database lives in one
    /// connection, so its pool has one connection.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
        use std::str::FromStr;
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let memory = url.contains(":memory:") || url.contains("mode=memory");
        let opts = if memory {
            opts
        } else {
            opts.journal_mode(SqliteJournalMode::Wal)
        };
        let pool = SqlitePoolOptions::new()
            .max_connections(if memory { 1 } else { 8 })
            // No ping before each acquire: a broken connection fails that delivery's transaction, which
            // is then retried.
            .test_before_acquire(false)
            // An in-memory database dies with its last connection: keep it.
            .idle_timeout(if memory {
                None
            } else {
                Some(Duration::from_secs(600))
            })
            .max_lifetime(if memory {
                None
            } else {
                Some(Duration::from_secs(1800))
            })
            .connect_with(opts)
            .await?;
        Self::from_pool(pool).await
    }
}

/// The pool settings of [`Store::<sqlx::Postgres>::connect`]. Connections are not pinged before each acquire
/// (sqlx's default costs one more round trip per transaction): when a connection died while idle, the inbox
/// sees its `BEGIN` fail and begins once more on a fresh connection.
#[cfg(feature = "postgres")]
fn pg_pool_options(max_connections: u32) -> sqlx::postgres::PgPoolOptions {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(false)
}

#[cfg(feature = "postgres")]
impl Store<sqlx::Postgres> {
    /// Connects to a `postgres://` URL with up to `max_connections` connections and migrates.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        use sqlx::postgres::PgConnectOptions;
        use std::str::FromStr;
        let opts = PgConnectOptions::from_str(url)?;
        let pool = pg_pool_options(max_connections).connect_with(opts).await?;
        Self::from_pool(pool).await
    }

    /// Connects with every connection's `search_path` set to `schema` (created if missing) and migrates
    /// there. Tests use it to give each test its own schema.
    pub async fn connect_in_schema(
        url: &str,
        schema: &str,
        max_connections: u32,
    ) -> Result<Self, StoreError> {
        use sqlx::postgres::PgConnectOptions;
        use sqlx::Connection;
        use std::str::FromStr;
        if schema.is_empty()
            || !schema
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(StoreError::Config(
                txinbox_core::BadInput::InvalidIdentityField {
                    field: "schema",
                    reason: "must be non-empty ASCII letters, digits and underscores",
                },
            ));
        }
        let opts = PgConnectOptions::from_str(url)?;
        let mut conn = sqlx::PgConnection::connect_with(&opts).await?;
        sqlx::Executor::execute(
            &mut conn,
            format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"").as_str(),
        )
        .await?;
        conn.close().await?;
        let pool = pg_pool_options(max_connections)
            .connect_with(opts.options([("search_path", schema)]))
            .await?;
        Self::from_pool(pool).await
    }
}
