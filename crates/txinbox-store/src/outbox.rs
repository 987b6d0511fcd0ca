//! Outbox relay: publishes the rows handlers wrote in their transactions, after COMMIT.

use chrono::Utc;
use txinbox_core::Publisher;

use crate::backend::Backend;
use crate::error::StoreError;

/// What one relay pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Rows published and marked relayed.
    pub relayed: u64,
    /// Rows whose publish failed (left pending, attempt recorded).
    pub failed: u64,
}

/// Publishes up to `limit` pending outbox rows with `publisher`, oldest first. A row is marked relayed only
/// after its publish succeeded; a crash in between republishes it, which the consumer's inbox absorbs since
/// the message id is stable.
pub async fn relay_outbox<DB: Backend, P: Publisher>(
    pool: &sqlx::Pool<DB>,
    publisher: &P,
    limit: i64,
) -> Result<RelayReport, StoreError> {
    let mut report = RelayReport::default();
    for row in DB::pending_outbox(pool, limit).await? {
        match publisher.publish(&row.message).await {
            Ok(()) => {
                DB::finish_outbox(pool, row.id, Utc::now(), None).await?;
                report.relayed += 1;
                metrics::counter!(txinbox_core::metrics::OUTBOX_RELAYED, "consumer" => row.message.source.clone()).increment(1);
            }
            Err(e) => {
                tracing::warn!(id = row.id, attempts = row.attempts + 1, error = %e, "outbox publish failed; will retry");
                DB::finish_outbox(pool, row.id, Utc::now(), Some(&e.to_string())).await?;
                report.failed += 1;
            }
        }
    }
    Ok(report)
}
