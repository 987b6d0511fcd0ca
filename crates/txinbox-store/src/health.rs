//! The store as a readiness check: the database answers a ping within the check's timeout.

use txinbox_core::runtime::health::{CheckFuture, HealthCheck};

use crate::backend::Backend;
use crate::store::Store;

/// Readiness depends on the database: a connection from the pool answers a ping. The error says what failed
/// (`pool timed out`, `connection refused`, ...) and never holds the URL.
impl<DB: Backend> HealthCheck for Store<DB> {
    fn check(&self) -> CheckFuture<'_> {
        Box::pin(async move {
            use sqlx::Connection;
            let mut conn = self
                .pool()
                .acquire()
                .await
                .map_err(|e| format!("no connection: {}", redact(&e)))?;
            conn.ping()
                .await
                .map_err(|e| format!("no answer: {}", redact(&e)))
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
