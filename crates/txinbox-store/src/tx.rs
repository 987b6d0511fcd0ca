//! The open transaction a handler writes through: `sqlx::query(..).execute(&tx)`.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::{Database, Describe, Either, Execute, Executor, TransactionManager};

use crate::backend::Backend;

/// The inbox's open transaction on a sqlx store.
///
/// A handler gets a clone and runs its business change through `&tx` like through any sqlx executor:
/// `sqlx::query("INSERT ..").bind(..).execute(&tx).await?`. The inbox keeps the other clone and commits after
/// the handler returns; a clone kept past that point gets an error (`sqlx::Error::Protocol`, not transient) instead of a
/// connection.
/// Dropping the last clone of an uncommitted transaction rolls it back.
pub struct Tx<DB: Backend> {
    inner: Arc<tokio::sync::Mutex<Option<Open<DB>>>>,
}

impl<DB: Backend> Clone for Tx<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
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
/// pool flushes before the connection serves anyone else.
pub(crate) struct Open<DB: Backend>(Option<PoolConnection<DB>>);

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
            inner: Arc::new(tokio::sync::Mutex::new(Some(Open(Some(conn))))),
        }
    }

    /// Takes the connection out, ending this handle and every clone of it.
    pub(crate) async fn take(&self) -> Result<PoolConnection<DB>, sqlx::Error> {
        let open = self.inner.lock().await.take();
        open.and_then(|mut o| o.0.take()).ok_or_else(ended)
    }

    /// Locks the transaction for one statement; [`conn`] gives its connection.
    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, Option<Open<DB>>> {
        self.inner.lock().await
    }
}

/// The connection of a locked transaction, or the error of one that has ended.
pub(crate) fn conn<DB: Backend>(
    guard: &mut Option<Open<DB>>,
) -> Result<&mut DB::Connection, sqlx::Error> {
    match guard.as_mut().and_then(|o| o.0.as_mut()) {
        Some(c) => Ok(&mut **c),
        None => Err(ended()),
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
        Box::pin(async move { conn(&mut *self.lock().await)?.execute(query).await })
    }

    fn fetch_all<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Vec<DB::Row>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        Box::pin(async move { conn(&mut *self.lock().await)?.fetch_all(query).await })
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<DB::Row>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, DB>,
    {
        Box::pin(async move { conn(&mut *self.lock().await)?.fetch_optional(query).await })
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
            conn(&mut *self.lock().await)?
                .fetch_many(query)
                .try_collect::<Vec<_>>()
                .await
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
            conn(&mut *self.lock().await)?
                .prepare_with(sql, parameters)
                .await
        })
    }

    fn describe<'e, 'q: 'e>(self, sql: &'q str) -> BoxFuture<'e, Result<Describe<DB>, sqlx::Error>>
    where
        'c: 'e,
    {
        Box::pin(async move { conn(&mut *self.lock().await)?.describe(sql).await })
    }
}
