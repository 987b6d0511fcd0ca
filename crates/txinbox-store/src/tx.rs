//! The open transaction a handler writes through: `sqlx::query(..).execute(&tx)`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::{Database, Describe, Either, Execute, Executor, TransactionManager};
use txinbox_core::Identity;

use crate::backend::Backend;

/// The inbox's open transaction on a sqlx store.
///
/// A handler gets a clone and runs its business change through `&tx` like through any sqlx executor:
/// `sqlx::query("INSERT ..").bind(..).execute(&tx).await?`. The inbox keeps the other clone and commits after
/// the handler returns; a clone kept past that point (a task the handler spawned) gets an error
/// (`sqlx::Error::Protocol`, not transient) instead of a connection, from the moment the handler has returned:
/// in a batch too, where the transaction stays open for the handlers after it and a late write would otherwise
/// commit with them, even when its own delivery was rolled back and released.
/// Dropping the last clone of an uncommitted transaction rolls it back.
///
/// A statement that fails in PostgreSQL aborts the transaction: a handler that ignores the error and returns
/// `Ok` gets its delivery released as a store error (`record result`), never acknowledged with nothing
/// committed (unless it rolled back to a savepoint of its own first). A statement whose failure makes SQLite
/// roll the whole transaction back (`INSERT OR ROLLBACK`, `RAISE(ROLLBACK)`, `SQLITE_FULL` and a few other
/// errors in some statements) ends the transaction for the inbox too: every later statement through the `Tx`
/// is refused (SQLite would run it in a transaction of its own and commit it at once), and nothing of the
/// transaction commits. The refusal is transient when the failure was (`SQLITE_BUSY`), else permanent.
pub struct Tx<DB: Backend> {
    inner: Arc<tokio::sync::Mutex<Option<Open<DB>>>>,
    /// Whose turn it is to write: moved on once a handler has returned (its result recorded, or its writes
    /// rolled back to its savepoint), so that a clone that handler kept writes nothing more in a batch's
    /// transaction, which stays open for the handlers after it.
    turn: Arc<AtomicU64>,
    /// The turn a handler's handle was made in (every clone of the inbox's own handle, which has `None`).
    mine: Option<u64>,
}

impl<DB: Backend> Clone for Tx<DB> {
    /// A clone of the inbox's handle is the handler's, good until the handler has returned; a clone of a
    /// handler's handle is good as long as that one.
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            turn: self.turn.clone(),
            mine: Some(
                self.mine
                    .unwrap_or_else(|| self.turn.load(Ordering::SeqCst)),
            ),
        }
    }
}

impl<DB: Backend> fmt::Debug for Tx<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx")
            .field("backend", &<DB as Backend>::NAME)
            .finish()
    }
}

/// A connection with an open transaction; dropping it queues the rollback (a no-op after COMMIT), which the
/// pool flushes before the connection serves anyone else. With it, the markers the transaction placed in a
/// partitioned layout ([`Placed`]), and whether a statement the handler ran through the [`Tx`] failed in the
/// database since the transaction began or last rolled back to its savepoint ([`statement_failed`]); and, when
/// a failed statement ended the transaction in the database ([`Backend::transaction_lost`]), why.
pub(crate) struct Open<DB: Backend>(Option<PoolConnection<DB>>, Placed, bool, Option<Lost>);

/// Why the database ended a transaction the inbox still holds: the failed statement's message, and whether
/// that failure was transient.
#[derive(Clone)]
pub(crate) struct Lost {
    why: String,
    transient: bool,
}

impl Lost {
    /// The error every later use of the transaction gets: transient (an I/O error, so the delivery is retried)
    /// when the failure was, else a permanent one.
    fn error(&self) -> sqlx::Error {
        let msg = format!(
            "the database rolled the inbox transaction back after a failed statement ({}): nothing written in it commits, and no statement runs after it",
            self.why
        );
        if self.transient {
            sqlx::Error::Io(std::io::Error::other(msg))
        } else {
            sqlx::Error::Protocol(msg)
        }
    }
}

/// The markers a transaction inserted in the partitioned layout, each with its partition's bucket, in the
/// order they went in, not yet given their result; and how many there were at the latest savepoint. An
/// identity may have a marker in several buckets, each another message's (a re-send with another event
/// time): a result reference goes to the marker of its own delivery, in its bucket.
#[derive(Default)]
pub(crate) struct Placed {
    markers: Vec<(String, String, String, DateTime<Utc>)>,
    at_savepoint: usize,
}

impl Placed {
    /// A marker of `identity` went in, in the partition of `bucket`.
    pub(crate) fn push(&mut self, identity: &Identity, bucket: DateTime<Utc>) {
        self.markers.push((
            identity.consumer.as_str().to_owned(),
            identity.source.clone(),
            identity.message_id.clone(),
            bucket,
        ));
    }

    /// The bucket of the first marker of `identity` not given its result yet, now given it (the handlers run
    /// in the order the markers went in); `None` when there is none (the row-by-row layout).
    pub(crate) fn take(&mut self, identity: &Identity) -> Option<DateTime<Utc>> {
        let i = self.markers.iter().position(|(c, s, m, _)| {
            c == identity.consumer.as_str() && *s == identity.source && *m == identity.message_id
        })?;
        Some(self.markers.remove(i).3)
    }

    /// A savepoint was opened.
    pub(crate) fn savepoint(&mut self) {
        self.at_savepoint = self.markers.len();
    }

    /// The transaction rolled back to its latest savepoint: the markers placed since are gone.
    pub(crate) fn rolled_back(&mut self) {
        self.markers.truncate(self.at_savepoint);
    }
}

impl<DB: Backend> Drop for Open<DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.0.as_mut() {
            <DB as Database>::TransactionManager::start_rollback(conn);
        }
    }
}

/// The message of the error a `Tx` used after its transaction ended returns.
pub(crate) const ENDED: &str =
    "the inbox transaction has ended (a handler kept its Tx past its return)";

/// A programming error, not a transient one: a retry would meet it again, so `?` in a handler dead-letters.
fn ended() -> sqlx::Error {
    sqlx::Error::Protocol(ENDED.into())
}

impl<DB: Backend> Tx<DB> {
    pub(crate) fn new(conn: PoolConnection<DB>) -> Self {
        Self {
            inner: Arc::new(tokio::sync::Mutex::new(Some(Open(
                Some(conn),
                Placed::default(),
                false,
                None,
            )))),
            turn: Arc::new(AtomicU64::new(0)),
            mine: None,
        }
    }

    /// Takes the connection out, ending this handle and every clone of it.
    pub(crate) async fn take(&self) -> Result<PoolConnection<DB>, sqlx::Error> {
        let open = self.inner.lock().await.take();
        open.and_then(|mut o| o.0.take()).ok_or_else(ended)
    }

    /// The error of a transaction the database ended after a failed statement, if it did: such a transaction
    /// must not commit.
    pub(crate) async fn lost(&self) -> Option<sqlx::Error> {
        let g = self.inner.lock().await;
        g.as_ref().and_then(|o| o.3.as_ref()).map(Lost::error)
    }

    /// Locks the transaction for one statement; [`conn`] gives its connection.
    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, Option<Open<DB>>> {
        self.inner.lock().await
    }

    /// The handler whose turn it was has returned: the handles it holds write nothing more.
    pub(crate) fn end_turn(&self) {
        self.turn.fetch_add(1, Ordering::SeqCst);
    }

    /// Locks the transaction for one of a handler's statements: the error of an ended transaction when this
    /// handle's handler has returned.
    async fn lock_for_handler(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Open<DB>>>, sqlx::Error> {
        let g = self.inner.lock().await;
        match self.mine {
            Some(turn) if turn != self.turn.load(Ordering::SeqCst) => Err(ended()),
            _ => Ok(g),
        }
    }
}

/// The markers a locked transaction placed, or the error of one that has ended.
pub(crate) fn placed<DB: Backend>(
    guard: &mut Option<Open<DB>>,
) -> Result<&mut Placed, sqlx::Error> {
    match guard.as_mut() {
        Some(Open(_, _, _, Some(lost))) => Err(lost.error()),
        Some(o) if o.0.is_some() => Ok(&mut o.1),
        _ => Err(ended()),
    }
}

/// The connection of a locked transaction and the markers it placed, or the error of one that has ended.
pub(crate) fn open<DB: Backend>(
    guard: &mut Option<Open<DB>>,
) -> Result<(&mut DB::Connection, &mut Placed), sqlx::Error> {
    match guard.as_mut() {
        Some(Open(_, _, _, Some(lost))) => Err(lost.error()),
        Some(Open(Some(c), placed, _, None)) => Ok((&mut **c, placed)),
        _ => Err(ended()),
    }
}

/// Whether a statement the handler ran through the [`Tx`] failed in the database since the transaction began
/// or last rolled back to its savepoint: on PostgreSQL such a failure aborts the transaction, whose COMMIT
/// then rolls back without an error, so a handler that ignored the error and returned `Ok` would have its
/// delivery (and, in a batch, every other one) acknowledged with nothing written. `clear`: forget it (the
/// transaction was found usable, or rolled back to its savepoint).
pub(crate) fn statement_failed<DB: Backend>(
    guard: &mut Option<Open<DB>>,
    clear: bool,
) -> Result<bool, sqlx::Error> {
    match guard.as_mut() {
        Some(o) if o.0.is_some() => {
            let failed = o.2;
            o.2 = failed && !clear;
            Ok(failed)
        }
        _ => Err(ended()),
    }
}

/// `r`, the answer to a handler's statement, noted in the locked transaction when the database refused it;
/// with the transaction marked lost when that failure ended it in the database.
async fn noted<DB: Backend, T>(
    guard: &mut Option<Open<DB>>,
    r: Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    if let (Err(e @ sqlx::Error::Database(_)), Some(o)) = (&r, guard.as_mut()) {
        o.2 = true;
        if let Some(c) = o.0.as_mut() {
            let lost = match DB::transaction_lost(c).await {
                Ok(false) => None,
                Ok(true) => Some(e.to_string()),
                // Not knowing is taken as lost: committing what may be half autocommitted is worse.
                Err(probe) => Some(format!(
                    "{e}; asking whether the transaction survived failed: {probe}"
                )),
            };
            o.3 = lost.map(|why| Lost {
                why,
                transient: crate::error::is_transient(e),
            });
        }
    }
    r
}

/// The connection of a locked transaction, or the error of one that has ended.
pub(crate) fn conn<DB: Backend>(
    guard: &mut Option<Open<DB>>,
) -> Result<&mut DB::Connection, sqlx::Error> {
    match guard.as_mut() {
        Some(Open(_, _, _, Some(lost))) => Err(lost.error()),
        Some(Open(Some(c), ..)) => Ok(&mut **c),
        _ => Err(ended()),
    }
}

impl<'c, DB> Executor<'c> for &'c Tx<DB>
where
    DB: Backend,
    for<'x> &'x mut DB::Connection: Executor<'x, Database = DB>,
{
    type Database = DB;

    fn execute<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<DB::QueryResult, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        Box::pin(async move {
            let mut g = self.lock_for_handler().await?;
            let r = conn(&mut g)?.execute(query).await;
            noted(&mut g, r).await
        })
    }

    fn fetch_all<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Vec<DB::Row>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        Box::pin(async move {
            let mut g = self.lock_for_handler().await?;
            let r = conn(&mut g)?.fetch_all(query).await;
            noted(&mut g, r).await
        })
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<DB::Row>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        Box::pin(async move {
            let mut g = self.lock_for_handler().await?;
            let r = conn(&mut g)?.fetch_optional(query).await;
            noted(&mut g, r).await
        })
    }

    /// Streams are gathered while the connection is held, then handed out: a handler's queries are small.
    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<DB::QueryResult, DB::Row>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        let all = async move {
            let mut g = self.lock_for_handler().await?;
            let r = conn(&mut g)?
                .fetch_many(query)
                .try_collect::<Vec<_>>()
                .await;
            noted(&mut g, r).await
        };
        stream::once(all)
            .map(|r| match r {
                Ok(items) => stream::iter(items.into_iter().map(Ok)).left_stream(),
                Err(e) => stream::once(async { Err(e) }).right_stream(),
            })
            .flatten()
            .boxed()
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [DB::TypeInfo],
    ) -> BoxFuture<'e, Result<<DB as Database>::Statement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        Box::pin(async move {
            let mut g = self.lock_for_handler().await?;
            let r = conn(&mut g)?.prepare_with(sql, parameters).await;
            noted(&mut g, r).await
        })
    }

    fn describe<'e, 'q: 'e>(self, sql: &'q str) -> BoxFuture<'e, Result<Describe<DB>, sqlx::Error>>
    where
        'c: 'e,
    {
        Box::pin(async move {
            let mut g = self.lock_for_handler().await?;
            let r = conn(&mut g)?.describe(sql).await;
            noted(&mut g, r).await
        })
    }
}
