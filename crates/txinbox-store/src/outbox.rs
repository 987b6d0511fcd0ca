//! The outbox rows of the sqlx stores; the relay itself is the core's ([`txinbox_core::outbox::relay`]).

use chrono::{DateTime, Utc};
use txinbox_core::outbox::{OutboxStore, PendingOutbox, RelayReport};
use txinbox_core::Publisher;

use crate::backend::Backend;
use crate::error::StoreError;
use crate::store::Store;

impl<DB: Backend> OutboxStore for Store<DB> {
    type Error = sqlx::Error;

    async fn pending_outbox(&self, limit: i64) -> Result<Vec<PendingOutbox>, sqlx::Error> {
        DB::pending_outbox(self.pool(), limit).await
    }

    async fn finish_outbox(
        &self,
        id: i64,
        now: DateTime<Utc>,
        error: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        DB::finish_outbox(self.pool(), id, now, error).await
    }
}

/// Relays up to `limit` pending outbox rows of the store on `pool` (see [`txinbox_core::outbox::relay`]).
pub async fn relay_outbox<DB: Backend, P: Publisher>(
    pool: &sqlx::Pool<DB>,
    publisher: &P,
    limit: i64,
) -> Result<RelayReport, StoreError> {
    let store = Store::from_pool_with(pool.clone(), crate::Migrations::Skip).await?;
    Ok(txinbox_core::outbox::relay(&store, publisher, limit).await?)
}
