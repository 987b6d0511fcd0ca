//! The store as a readiness check: the database answers a ping within the check's timeout and, on
//! PostgreSQL, the inbox can write its markers there.

use txinbox_core::runtime::health::{CheckFuture, HealthCheck};

use crate::backend::Backend;
use crate::store::Store;

/// Readiness depends on the database: the check's own connection, opened outside the pool and kept
/// between checks, answers a ping. A pool that is busy (every connection in a transaction, or held by a
/// rotation's `DETACH ... CONCURRENTLY`) is not a database that is down, so the check never waits for one.
/// A connection whose ping fails, or whose check was given up on (a timeout drops the check mid-ping), is
/// dropped, and the next check opens a new one. The error says what failed and never holds the URL: a
/// database that does not answer fails with `no connection: ...` (`connection refused`, ...) or `no answer:
/// ...`, one that answers with another reason (below).
///
/// On PostgreSQL a database that answers is not enough: the check then fails when the inbox's statements
/// would (`the inbox's table: ... relation "txinbox_inbox" does not exist`, `no INSERT privilege on
/// txinbox_inbox`, `the database is read-only ...`: a table dropped or not migrated yet, a grant revoked, a
/// standby after a failover), so readiness and a shard's probe say so instead of every delivery failing and
/// being released. SQLite stops at the ping.
impl<DB: Backend> HealthCheck for Store<DB> {
    fn check(&self) -> CheckFuture<'_> {
        Box::pin(async move {
            use sqlx::{ConnectOptions, Connection};
            let mut slot = self.probe.lock().await;
            // Out of the slot while in use: a check dropped mid-ping leaves nothing half used behind.
            let mut conn = match slot.take() {
                Some(c) => c,
                None => self
                    .pool()
                    .connect_options()
                    .connect()
                    .await
                    .map_err(|e| format!("no connection: {}", redact(&e)))?,
            };
            conn.ping()
                .await
                .map_err(|e| format!("no answer: {}", redact(&e)))?;
            // A connection that answered stays for the next check whatever the inbox's table says.
            let unready = DB::unready(&mut conn).await;
            *slot = Some(conn);
            match unready {
                Ok(None) => Ok(()),
                Ok(Some(why)) => Err(why),
                Err(e) => Err(format!("the inbox's table: {}", redact(&e))),
            }
        })
    }
}

/// sqlx's error text, which for connection failures is the driver's (an I/O error, a server message); a
/// configuration error could quote the URL, so it is reduced to its kind.
fn redact(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Configuration(_) => "invalid configuration".into(),
        other => other.to_string(),
    }
}
