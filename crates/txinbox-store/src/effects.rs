//! The effects and the maintenance of the sqlx stores: claimed, finished and purged with the backend's SQL; the runner and every
//! decision are the core's ([`txinbox_core::effects::EffectRunner`]).

use chrono::{DateTime, Utc};
use txinbox_core::effects::{ClaimedEffect, EffectCount, EffectStore, TransitionColumns};
use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};

use crate::backend::Backend;
use crate::error::StoreError;
use crate::store::Store;

impl<DB: Backend> EffectStore for Store<DB> {
    type Error = sqlx::Error;

    async fn claim_effects(
        &self,
        holder: &str,
        destinations: &[String],
        now: DateTime<Utc>,
        claim_until: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<ClaimedEffect>, sqlx::Error> {
        // A destination with a NUL is no effect's (the pipeline refuses control characters in one): it
        // claims nothing, on PostgreSQL, whose text refused it, as on SQLite.
        if destinations.iter().any(|d| d.contains('\0')) {
            let named: Vec<String> = destinations
                .iter()
                .filter(|d| !d.contains('\0'))
                .cloned()
                .collect();
            return DB::claim_effects(self.pool(), holder, &named, now, claim_until, limit).await;
        }
        DB::claim_effects(self.pool(), holder, destinations, now, claim_until, limit).await
    }

    async fn release_claim(&self, holder: &str, now: DateTime<Utc>) -> Result<u64, sqlx::Error> {
        DB::release_claim(self.pool(), holder, now).await
    }

    async fn finish_effect(
        &self,
        id: i64,
        holder: &str,
        transition: &TransitionColumns<'_>,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        DB::finish_effect(self.pool(), id, holder, transition, now).await
    }

    async fn store_clock(&self) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        DB::clock(self.pool()).await
    }

    async fn purge_done_effects(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        // Partitioned effects leave with their partition, never row by row.
        if self.partitioned().await?.is_some_and(|l| l.effects) {
            return Ok(0);
        }
        DB::purge_done_effects(self.pool(), before, limit).await
    }

    async fn effect_counts(&self) -> Result<Vec<EffectCount>, sqlx::Error> {
        DB::effect_counts(self.pool()).await
    }

    async fn find_effect(&self, key: &str) -> Result<Option<ClaimedEffect>, sqlx::Error> {
        // No effect's key holds a NUL (PostgreSQL's text cannot): none is found, on SQLite too.
        if key.contains('\0') {
            return Ok(None);
        }
        DB::find_effect(self.pool(), key).await
    }

    async fn find_effects(&self, key: &str) -> Result<Vec<ClaimedEffect>, sqlx::Error> {
        if key.contains('\0') {
            return Ok(Vec::new());
        }
        DB::find_effects(self.pool(), key).await
    }

    async fn mark_compensated(
        &self,
        id: i64,
        note: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        DB::mark_compensated(self.pool(), id, note, now).await
    }
}

impl<DB: Backend> MaintenanceStore for Store<DB> {
    type Error = StoreError;

    async fn clock(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(DB::clock(self.pool()).await?)
    }

    async fn purge_batch(
        &self,
        table: Table,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        // Partitioned tables go away whole, in `rotate_partitions`: never row by row.
        if let Some(layout) = self.partitioned().await? {
            if matches!(table, Table::Markers | Table::Rejections)
                || (table == Table::Effects && layout.effects)
            {
                return Ok(Vec::new());
            }
        }
        Ok(DB::purge_batch(self.pool(), table, before, limit).await?)
    }

    async fn rotate_partitions(
        &self,
        now: DateTime<Utc>,
        opts: &txinbox_core::runtime::maintenance::MaintenanceOptions,
    ) -> Result<Option<txinbox_core::runtime::maintenance::PartitionRotation>, StoreError> {
        let r = DB::rotate_partitions(self.pool(), now, opts).await;
        self.layout_handle().invalidate();
        r
    }

    async fn table_stats(
        &self,
        table: Table,
        consumer: &str,
    ) -> Result<(i64, Option<DateTime<Utc>>), StoreError> {
        // No consumer's name holds a NUL: it has no rows, on PostgreSQL (which refused it) as on SQLite.
        if consumer.contains('\0') {
            return Ok((0, None));
        }
        let (n, oldest) = DB::table_stats(self.pool(), table, consumer).await?;
        if table != Table::Markers {
            return Ok((n, oldest));
        }
        // With the markers a converted inbox keeps in its frozen row-by-row table (they decide duplicates).
        let (legacy, legacy_oldest) = DB::legacy_markers(self.pool(), consumer).await?;
        let oldest = match (oldest, legacy_oldest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok((n + legacy, oldest))
    }
}
