//! Connecting and migrating.

use std::time::Duration;

use std::sync::Arc;

use sqlx::{Database, TransactionManager};
use txinbox_core::effects::NewEffect;
use txinbox_core::{Commit, Identity, InboxStore, MarkerInsert, MarkerRow, Rejection};

use crate::backend::Backend;
use crate::conns::KeptConnections;
use crate::error::StoreError;
use crate::partitions::{Layout, LayoutState};
use crate::tx::{conn, open, placed, statement_failed, Placed, Tx};

/// How long a connection is kept for the next delivery by default.
const DEFAULT_KEEP_IDLE: Duration = Duration::from_millis(500);

/// A migrated connection pool for the inbox: the [`InboxStore`] of PostgreSQL and SQLite.
pub struct Store<DB: Backend> {
    pool: sqlx::Pool<DB>,
    conns: Arc<KeptConnections<DB>>,
    layout: Arc<Layout>,
    /// The readiness check's own connection, outside the pool (see [`crate::health`]).
    pub(crate) probe: Arc<tokio::sync::Mutex<Option<DB::Connection>>>,
}

// Manual: a derive would require `DB: Clone`, which the database marker types are not.
impl<DB: Backend> Clone for Store<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            conns: self.conns.clone(),
            layout: self.layout.clone(),
            probe: self.probe.clone(),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Store<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &<DB as Backend>::NAME)
            .field("keep_connections", &self.conns.keep_idle())
            .finish()
    }
}

/// What a store does with its schema when it opens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Migrations {
    /// Apply the migrations this build knows (default). Idempotent, one migrator at a time across
    /// processes, quiet on an up-to-date database.
    #[default]
    Apply,
    /// Apply nothing; refuse to open unless the database already has this build's schema (your own migration
    /// tool applied [`Store::migration_sql`]): [`StoreError::SchemaTooOld`] / [`StoreError::SchemaTooNew`].
    Verify,
    /// Touch nothing and check nothing.
    Skip,
}

/// How a store connects: pool size, PostgreSQL schema, migrations.
///
/// ```no_run
/// # async fn demo() -> Result<(), txinbox_store::StoreError> {
/// use txinbox_store::{Migrations, Store, StoreOptions};
/// let store = Store::<sqlx::Postgres>::connect_with(
///     "postgres://app@db/app",
///     StoreOptions::new().max_connections(16).schema("inbox").migrations(Migrations::Verify),
/// )
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "StoreOptions do nothing until given to Store::connect_with"]
pub struct StoreOptions {
    /// Pool size (default 10; an in-memory SQLite database always has one connection).
    pub max_connections: u32,
    /// PostgreSQL schema for the inbox's tables (default: the connection's `search_path`, usually
    /// `public`). Created if missing when migrations are applied. Ignored by SQLite.
    pub schema: Option<String>,
    /// What to do with the schema (default [`Migrations::Apply`]).
    pub migrations: Migrations,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            schema: None,
            migrations: Migrations::Apply,
        }
    }
}

impl StoreOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the pool size.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }
    /// Puts the inbox's tables in this PostgreSQL schema (ASCII letters, digits and `_`; the name as spelt,
    /// capitals kept, as if quoted).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }
    /// Sets what the store does with its schema.
    pub fn migrations(mut self, m: Migrations) -> Self {
        self.migrations = m;
        self
    }
}

impl<DB: Backend> Store<DB> {
    /// Wraps an existing pool and applies the migrations.
    pub async fn from_pool(pool: sqlx::Pool<DB>) -> Result<Self, StoreError> {
        Self::from_pool_with(pool, Migrations::Apply).await
    }

    /// Wraps an existing pool, doing `migrations` with the schema.
    pub async fn from_pool_with(
        pool: sqlx::Pool<DB>,
        migrations: Migrations,
    ) -> Result<Self, StoreError> {
        match migrations {
            Migrations::Apply => DB::migrate(&pool).await?,
            Migrations::Verify => {
                let found = DB::schema_version(&pool).await?.unwrap_or(0);
                let known = crate::backend::latest_version();
                if found < known {
                    return Err(StoreError::SchemaTooOld {
                        found,
                        required: known,
                    });
                }
                if found > known {
                    return Err(StoreError::SchemaTooNew { found, known });
                }
            }
            Migrations::Skip => {}
        }
        Ok(Self::new_unchecked(pool))
    }

    /// Applies the migrations this build knows (what opening with [`Migrations::Apply`] does): for a store
    /// opened lazily or with [`Migrations::Skip`].
    pub async fn migrate(&self) -> Result<(), StoreError> {
        DB::migrate(&self.pool).await
    }

    /// The whole schema of this build as one SQL script for your own migration tool (sqlx migrate, Flyway,
    /// Terraform): every migration, each followed by its row in `txinbox_schema_version`, so that a store
    /// opened with [`Migrations::Verify`] accepts the result. Run it in one transaction.
    pub fn migration_sql() -> String {
        let mut out = format!(
            "-- txinbox schema for {}, version {}\nCREATE TABLE IF NOT EXISTS txinbox_schema_version (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at {} NOT NULL DEFAULT {});\n",
            <DB as Backend>::NAME,
            crate::backend::latest_version(),
            if <DB as Backend>::NAME == "postgres" { "TIMESTAMPTZ" } else { "TEXT" },
            if <DB as Backend>::NAME == "postgres" { "now()" } else { "CURRENT_TIMESTAMP" },
        );
        for m in crate::backend::MIGRATIONS {
            out.push_str(&format!("\n-- {:04}_{}\n", m.version, m.name));
            out.push_str(DB::migration_sql(m).trim_end());
            out.push_str(&format!(
                "\nINSERT INTO txinbox_schema_version (version, name) VALUES ({}, '{}');\n",
                m.version, m.name
            ));
        }
        out
    }

    fn new_unchecked(pool: sqlx::Pool<DB>) -> Self {
        Self {
            pool,
            conns: KeptConnections::new(DEFAULT_KEEP_IDLE),
            layout: Arc::new(Layout::default()),
            probe: Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    /// What this store knows of its layout (read at the first insert, again every few seconds when
    /// partitioned, and after an insert met a layout it did not expect).
    pub(crate) fn layout_handle(&self) -> &Layout {
        &self.layout
    }

    /// The partitioned layout to insert with, read on `conn` when not known or stale.
    async fn layout_on(
        &self,
        conn: &mut DB::Connection,
    ) -> Result<Option<LayoutState>, sqlx::Error> {
        match self.layout.current() {
            Ok(s) => Ok(s),
            Err(()) => {
                let s = DB::load_layout(conn).await?;
                self.layout.set(s);
                Ok(s)
            }
        }
    }

    /// The marker inserts in whichever layout the database has; with the partitioned layout, the markers
    /// that went in are noted in `placed` with their buckets.
    async fn insert_rows(
        &self,
        conn: &mut DB::Connection,
        placed: &mut Placed,
        rows: &[MarkerRow<'_>],
    ) -> Result<Vec<MarkerInsert>, sqlx::Error> {
        let answer = match self.layout_on(conn).await? {
            None => DB::insert_markers(conn, rows).await,
            Some(mut state) => {
                // A row outside the range read: the range may have moved since (partitions created or
                // dropped); read it again, at most once a second.
                let outside = rows.iter().any(|r| {
                    let b = state.bucket(r.origin_at);
                    b < state.low || b >= state.high
                });
                if outside && self.layout.older_than(Duration::from_secs(1)) {
                    self.layout.invalidate();
                    if let Some(s) = self.layout_on(conn).await? {
                        state = s;
                    }
                }
                let answers = DB::insert_markers_partitioned(conn, rows, &state).await;
                if let Ok(answers) = &answers {
                    for (row, answer) in rows.iter().zip(answers) {
                        if *answer == MarkerInsert::Inserted {
                            placed.push(row.identity, state.bucket(row.origin_at));
                        }
                    }
                }
                answers
            }
        };
        self.noticed(answer)
    }

    /// `answer`, after reading the layout again at the next insert when it says the layout changed.
    fn noticed<T>(&self, answer: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if let Err(e) = &answer {
            if DB::is_layout_error(e) {
                self.layout.invalidate();
            }
        }
        answer
    }

    /// Whether the database had the partitioned layout when this store last read it ([`crate::partitions`];
    /// `false` before its first read: [`Store::is_partitioned`] reads it now).
    pub fn partitioned_as_last_read(&self) -> bool {
        self.layout.is_partitioned()
    }

    /// Whether the database has the partitioned layout (for the maintenance, which drops partitions
    /// instead of deleting rows).
    pub(crate) async fn partitioned(&self) -> Result<Option<LayoutState>, sqlx::Error> {
        if let Ok(s) = self.layout.current() {
            return Ok(s);
        }
        let mut c = self.pool.acquire().await?;
        let s = DB::load_layout(&mut c).await?;
        self.layout.set(s);
        Ok(s)
    }

    /// The pool, for your own queries.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// How long a connection that just ended a transaction cleanly is kept for the next delivery before it
    /// goes back to the pool (default 500 ms; zero hands every connection back at once).
    ///
    /// sqlx's pool tests each connection it takes back with a round trip to the database; keeping the
    /// connection between deliveries saves that round trip on a busy consumer. The rules:
    ///
    /// * only a connection whose transaction ended without error (COMMIT, or a duplicate's ROLLBACK) is kept;
    ///   after any failure it goes back to the pool, which tests it;
    /// * kept connections stay checked out of the pool, so its limit still bounds the inbox, and the pool's
    ///   last connection is never kept: the application still gets one without waiting;
    /// * a connection idle for longer than `idle` goes back to the pool; a closed pool gets them back within
    ///   about 100 ms (`Pool::close` does not wait for them);
    /// * a `BEGIN` that fails because the connection died while it waited is tried once more on a fresh one.
    pub fn keep_connections(mut self, idle: Duration) -> Self {
        self.conns.release_all();
        self.conns = KeptConnections::new(idle);
        self
    }

    /// How many connections are kept for the next deliveries right now.
    pub fn kept_connections(&self) -> usize {
        self.conns.kept()
    }

    /// Counts the inbox rows of `consumer`.
    pub async fn inbox_rows(&self, consumer: &str) -> Result<i64, sqlx::Error> {
        // No consumer's name holds a NUL: it has no rows, on PostgreSQL (which refused it) as on SQLite.
        if consumer.contains('\0') {
            return Ok(0);
        }
        // With the markers a converted inbox keeps in its frozen row-by-row table (they decide duplicates).
        let (legacy, _) = DB::legacy_markers(&self.pool, consumer).await?;
        Ok(DB::count_markers(&self.pool, consumer).await? + legacy)
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
        Self::connect_with(url, StoreOptions::new().max_connections(8)).await
    }

    /// Connects to a `sqlite:` URL with `options` (see [`Store::connect`]).
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
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
            .max_connections(if memory {
                1
            } else {
                options.max_connections.max(1)
            })
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
        Self::from_pool_with(pool, options.migrations).await
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

/// Refuses a schema name the store cannot use: 1 to 63 ASCII letters, digits and underscores.
#[cfg(feature = "postgres")]
fn check_schema(schema: &str) -> Result<(), StoreError> {
    if schema.is_empty()
        || schema.len() > 63
        || !schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(StoreError::Config(
            txinbox_core::BadInput::InvalidIdentityField {
                field: "schema",
                reason: "must be 1 to 63 ASCII letters, digits and underscores",
            },
        ));
    }
    Ok(())
}

/// `opts` with every connection's `search_path` set to `schema`, quoted: the schema is created quoted, and
/// PostgreSQL folds an unquoted name in `search_path` to lower case (`Inbox` would name `inbox`).
#[cfg(feature = "postgres")]
fn in_schema(
    opts: sqlx::postgres::PgConnectOptions,
    schema: &str,
) -> Result<sqlx::postgres::PgConnectOptions, StoreError> {
    check_schema(schema)?;
    Ok(opts.options([("search_path", format!("\"{schema}\""))]))
}

#[cfg(feature = "postgres")]
impl Store<sqlx::Postgres> {
    /// Connects to a `postgres://` URL with up to `max_connections` connections and migrates.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_with(url, StoreOptions::new().max_connections(max_connections)).await
    }

    /// Connects with every connection's `search_path` set to `schema` (created if missing) and migrates
    /// there (the same as [`StoreOptions::schema`]).
    pub async fn connect_in_schema(
        url: &str,
        schema: &str,
        max_connections: u32,
    ) -> Result<Self, StoreError> {
        Self::connect_with(
            url,
            StoreOptions::new()
                .max_connections(max_connections)
                .schema(schema),
        )
        .await
    }

    /// A store whose pool connects on first use: nothing is connected, checked or migrated now. For a shard that
    /// cannot be reached when the worker starts ([`txinbox_core::runtime::shards`]): its deliveries are released
    /// until it answers; then call [`Store::migrate`] (the schema named in `options` must already exist).
    pub fn connect_lazy_with(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
        let mut opts = crate::pg_connect_options(url)?;
        if let Some(schema) = &options.schema {
            opts = in_schema(opts, schema)?;
        }
        Ok(Self::new_unchecked(
            pg_pool_options(options.max_connections).connect_lazy_with(opts),
        ))
    }

    /// Connects to a `postgres://` URL with `options`: pool size, the schema the inbox's tables live in
    /// (every connection's `search_path` is set to it), and what to do with migrations.
    pub async fn connect_with(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
        use sqlx::Connection;
        let mut opts = crate::pg_connect_options(url)?;
        if let Some(schema) = &options.schema {
            check_schema(schema)?;
            if options.migrations == Migrations::Apply {
                // Under the migrations' lock: `CREATE SCHEMA IF NOT EXISTS` is not safe against itself
                // (two stores opening at once in a new schema, one failed on pg_namespace's unique index).
                let mut conn = sqlx::PgConnection::connect_with(&opts).await?;
                let mut tx = conn.begin().await?;
                crate::postgres::schema_change(&mut tx).await?;
                sqlx::Executor::execute(
                    &mut *tx,
                    format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"").as_str(),
                )
                .await?;
                tx.commit().await?;
                conn.close().await?;
            }
            opts = in_schema(opts, schema)?;
        }
        let pool = pg_pool_options(options.max_connections)
            .connect_with(opts)
            .await?;
        Self::from_pool_with(pool, options.migrations).await
    }
}

impl<DB: Backend> InboxStore for Store<DB> {
    type Tx = Tx<DB>;
    type Error = sqlx::Error;

    fn name(&self) -> &'static str {
        <DB as Backend>::NAME
    }

    async fn begin(&self) -> Result<Tx<DB>, sqlx::Error> {
        let mut c = self.conns.take(&self.pool).await?;
        let mut retried = false;
        loop {
            match <DB as Database>::TransactionManager::begin(&mut *c, None).await {
                Ok(()) => return Ok(Tx::new(c)),
                // A connection may have died while it waited (server restart): nothing happened yet, so
                // once more on a fresh one.
                Err(e) if !retried => {
                    tracing::debug!(error = %e, "BEGIN failed; trying once more on a fresh connection");
                    retried = true;
                }
                Err(e) => return Err(e),
            }
            c = self.pool.acquire().await?;
        }
    }

    async fn insert_marker(
        &self,
        tx: &Tx<DB>,
        row: &MarkerRow<'_>,
    ) -> Result<MarkerInsert, sqlx::Error> {
        let mut g = tx.lock().await;
        if let Ok(None) = self.layout.current() {
            // Row-by-row (the default): the single-row statement.
            return self.noticed(DB::insert_marker(conn(&mut g)?, row).await);
        }
        let (c, placed) = open(&mut g)?;
        let mut answers = self
            .insert_rows(c, placed, std::slice::from_ref(row))
            .await?;
        answers
            .pop()
            .ok_or_else(|| sqlx::Error::Protocol("no answer for the marker insert".into()))
    }

    async fn insert_markers(
        &self,
        tx: &Tx<DB>,
        rows: &[MarkerRow<'_>],
    ) -> Result<Vec<MarkerInsert>, sqlx::Error> {
        let mut g = tx.lock().await;
        let (c, placed) = open(&mut g)?;
        self.insert_rows(c, placed, rows).await
    }

    async fn record_result(
        &self,
        tx: &Tx<DB>,
        identity: &Identity,
        result_reference: Option<&str>,
        effects: &[NewEffect<'_>],
    ) -> Result<(), sqlx::Error> {
        // The handler has returned: a clone of its Tx it kept writes nothing more (in a batch, the
        // transaction stays open for the next handlers).
        tx.end_turn();
        let mut g = tx.lock().await;
        if statement_failed(&mut g, false)? {
            // The handler returned Ok after a statement of its own failed: a transaction that failure
            // aborted (PostgreSQL) would roll back at COMMIT without an error. Refused here, the delivery is
            // released (a batch's other deliveries apply without it) rather than acknowledged unwritten.
            DB::transaction_usable(conn(&mut g)?).await.map_err(|e| {
                sqlx::Error::Protocol(format!(
                    "a statement of the handler failed and the handler returned Ok; the transaction cannot commit: {e}"
                ))
            })?;
            statement_failed(&mut g, true)?;
        }
        // The bucket of this delivery's marker, when the layout placed it in a partition.
        let bucket = placed(&mut g)?.take(identity);
        let c = conn(&mut g)?;
        if let Some(r) = result_reference {
            DB::set_result_reference(c, identity, r, bucket).await?;
        }
        for e in effects {
            DB::insert_effect(c, e).await?;
        }
        Ok(())
    }

    async fn commit(&self, tx: Tx<DB>) -> Result<Commit, sqlx::Error> {
        if let Some(e) = tx.lost().await {
            // The database ended the transaction after a failed statement: nothing of it may commit (the
            // transaction open now holds nothing of the inbox's), and dropping it rolls it back.
            return Err(e);
        }
        let mut c = tx.take().await?;
        match <DB as Database>::TransactionManager::commit(&mut c).await {
            Ok(()) => {
                // A connection whose transaction ended cleanly serves the next delivery.
                self.conns.put(c, &self.pool);
                Ok(Commit::Done)
            }
            Err(e) => {
                // Back to the pool, which tests it (and flushes the queued rollback).
                <DB as Database>::TransactionManager::start_rollback(&mut c);
                Err(e)
            }
        }
    }

    async fn rollback(&self, tx: Tx<DB>, clean_end: bool) -> Result<(), sqlx::Error> {
        let mut c = tx.take().await?;
        if clean_end {
            <DB as Database>::TransactionManager::rollback(&mut c).await?;
            self.conns.put(c, &self.pool);
        } else {
            <DB as Database>::TransactionManager::start_rollback(&mut c);
        }
        Ok(())
    }

    async fn record_rejection(&self, r: &Rejection<'_>) -> Result<(), sqlx::Error> {
        DB::record_rejection(&self.pool, r).await
    }

    async fn savepoint(&self, tx: &Tx<DB>) -> Result<bool, sqlx::Error> {
        let mut g = tx.lock().await;
        DB::savepoint(conn(&mut g)?).await?;
        placed(&mut g)?.savepoint();
        Ok(true)
    }

    async fn rollback_to_savepoint(&self, tx: &Tx<DB>) -> Result<(), sqlx::Error> {
        // The handler has returned and its writes go: a clone of its Tx it kept writes nothing more.
        tx.end_turn();
        let mut g = tx.lock().await;
        DB::rollback_to_savepoint(conn(&mut g)?).await?;
        placed(&mut g)?.rolled_back();
        statement_failed(&mut g, true)?;
        Ok(())
    }

    fn is_transient(e: &sqlx::Error) -> bool {
        crate::error::is_transient(e)
    }

    fn classify(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
        e.downcast_ref::<sqlx::Error>()
            .map(crate::error::is_transient)
    }
}
