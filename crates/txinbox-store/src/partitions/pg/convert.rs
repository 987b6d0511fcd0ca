//! Converting an inbox to the partitioned layout, and reading the layout's status.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, Row};

use super::insert::load;
use super::{
    buckets, create_in_new, default_partition, with_partition_key, CREATE_INBOX, EFFECTS,
    EFFECTS_OPEN, INBOX, LAYOUT_TABLE, REJECTIONS,
};
use crate::error::StoreError;
use crate::partitions::{bucket_of, PartitionOptions, PartitionReport, PartitionStatus};
use crate::store::Store;

/// Rebuilds `table` (an id from `{table}_id_seq` and its rows) partitioned by `column`: the new table beside
/// it, with the same columns and defaults, partitions from its oldest row's bucket (or the one before now's)
/// to `high`, every row copied, then put in its place with the sequence, the old table's own indexes (a
/// unique one with `column` added to its key) and the statements of `extra`. Returns the first bucket, the
/// partitions created and the rows copied.
#[allow(clippy::too_many_arguments)]
async fn repartition(
    conn: &mut PgConnection,
    table: &str,
    column: &str,
    extra: &str,
    now: DateTime<Utc>,
    high: DateTime<Utc>,
    width: i64,
) -> Result<(DateTime<Utc>, u32, u64), sqlx::Error> {
    let oldest: Option<DateTime<Utc>> =
        sqlx::query_scalar(&format!("SELECT min({column}) FROM {table}"))
            .fetch_one(&mut *conn)
            .await?;
    // From the bucket before now's: a transaction that began before now's bucket (its `now()`, which dates
    // its rows, in the one before) and writes after the conversion finds a partition for its row.
    let since = now - chrono::Duration::seconds(width);
    let low = bucket_of(oldest.map_or(since, |o| o.min(since)), width);
    let new = format!("{table}_new");
    let create = format!("CREATE TABLE {new} (LIKE {table} INCLUDING DEFAULTS, PRIMARY KEY (id, {column})) PARTITION BY RANGE ({column})");
    sqlx::Executor::execute(&mut *conn, create.as_str()).await?;
    let mut created = 0;
    for b in buckets(low, high, width) {
        create_in_new(&mut *conn, &new, table, b, width).await?;
        created += 1;
    }
    let copied = sqlx::query(&format!("INSERT INTO {new} SELECT * FROM {table}"))
        .execute(&mut *conn)
        .await?
        .rows_affected();
    // The old table's indexes, made again on the new one once it has the name (and they theirs) back.
    let defs: Vec<(String, bool)> = sqlx::query_as("SELECT pg_get_indexdef(ix.indexrelid), ix.indisunique FROM pg_index ix WHERE ix.indrelid = to_regclass($1) AND NOT ix.indisprimary ORDER BY ix.indexrelid")
        .bind(table)
        .fetch_all(&mut *conn)
        .await?;
    let mut indexes = Vec::with_capacity(defs.len() + 1);
    for (def, unique) in defs {
        indexes.push(if unique {
            with_partition_key(&def, column).ok_or_else(|| {
                sqlx::Error::Protocol(format!("cannot read the index definition {def:?}"))
            })?
        } else {
            def
        });
    }
    if !extra.is_empty() {
        indexes.push(extra.to_owned());
    }
    let swap = format!(
        "ALTER SEQUENCE {table}_id_seq OWNED BY NONE;
DROP TABLE {table};
ALTER TABLE {new} RENAME TO {table};
ALTER INDEX {new}_pkey RENAME TO {table}_pkey;
ALTER SEQUENCE {table}_id_seq OWNED BY {table}.id;
{};",
        indexes.join(";\n")
    );
    sqlx::raw_sql(&swap).execute(&mut *conn).await?;
    Ok((low, created, copied))
}

impl Store<Postgres> {
    /// Converts this database's inbox to the partitioned layout ([`crate::partitions`]): one transaction,
    /// one converter at a time; idempotent (a partitioned database is left as it is). Workers should be
    /// stopped, or restarted after it. The partitions are laid out from the database's clock, not this host's.
    pub async fn partition(&self, opts: &PartitionOptions) -> Result<PartitionReport, StoreError> {
        opts.check().map_err(StoreError::Partitions)?;
        let width = opts.width.as_secs() as i64;
        let keep = opts.keep.as_secs() as i64;
        let mut tx = self.pool().begin().await?;
        crate::postgres::schema_change(&mut tx).await?;
        sqlx::Executor::execute(&mut *tx, LAYOUT_TABLE).await?;
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM txinbox_partition_layout WHERE tbl = 'txinbox_inbox')",
        )
        .fetch_one(&mut *tx)
        .await?;
        if exists {
            return Ok(PartitionReport {
                already: true,
                created: 0,
                legacy_kept: false,
                rejections_copied: 0,
                effects_copied: 0,
            });
        }
        // The three tables are copied, then the old ones dropped: a write committed between the copy and
        // the drop would go with the old table (an effects runner's `done`, evidence recorded, neither of
        // which touches the markers). Every writer waits from here to the commit; in the order an inbox
        // transaction takes them (markers, then effects), so that none deadlocks with it.
        sqlx::Executor::execute(
            &mut *tx,
            "LOCK TABLE txinbox_inbox, txinbox_rejections, txinbox_effects IN ACCESS EXCLUSIVE MODE",
        )
        .await?;
        // The database's clock, as the rotation, the claims and the due times read it: a converter on a host
        // whose clock is off would count live buckets as dropped, or make none for the database's today.
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *tx)
            .await?;
        let w = chrono::Duration::seconds(width);
        // Markers: a partition for every bucket a live copy may still fall in, back to `keep` ago.
        let low = bucket_of(now - chrono::Duration::seconds(keep), width);
        let high = bucket_of(now, width) + w * (opts.ahead as i32 + 1);
        sqlx::Executor::execute(&mut *tx, CREATE_INBOX).await?;
        let mut created = 0;
        for b in buckets(low, high, width) {
            create_in_new(&mut tx, INBOX, INBOX, b, width).await?;
            created += 1;
        }
        let legacy: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM txinbox_inbox_legacy)")
            .fetch_one(&mut *tx)
            .await?;
        if !legacy {
            sqlx::Executor::execute(&mut *tx, "DROP TABLE txinbox_inbox_legacy").await?;
        }
        // Evidence and effects: partitions back to their oldest row, every row copied in.
        let (rlow, n, copied) =
            repartition(&mut tx, REJECTIONS, "recorded_at", "", now, high, width).await?;
        created += n;
        let (elow, n, effects_copied) = repartition(
            &mut tx,
            EFFECTS,
            "created_at",
            EFFECTS_OPEN,
            now,
            high,
            width,
        )
        .await?;
        created += n;
        for (tbl, low) in [(INBOX, low), (REJECTIONS, rlow), (EFFECTS, elow)] {
            sqlx::query("INSERT INTO txinbox_partition_layout (tbl, width_secs, ahead, keep_secs, low, high, legacy, broker_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
                .bind(tbl)
                .bind(width)
                .bind(opts.ahead as i32)
                .bind(keep)
                .bind(low)
                .bind(high)
                .bind(tbl == INBOX && legacy)
                .bind(opts.broker_time)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.layout_handle().invalidate();
        Ok(PartitionReport {
            already: false,
            created,
            legacy_kept: legacy,
            rejections_copied: copied,
            effects_copied,
        })
    }

    /// The partitioned layout as it is now; `None` for a row-by-row database. A default partition made by
    /// hand on one of its tables is refused ([`StoreError::DefaultPartition`]).
    pub async fn partition_status(&self) -> Result<Option<PartitionStatus>, StoreError> {
        let mut conn = self.pool().acquire().await?;
        if load(&mut conn).await?.is_none() {
            return Ok(None);
        }
        if let Some(refused) = default_partition(&mut conn).await? {
            return Err(refused);
        }
        let r = sqlx::query("SELECT l.width_secs, l.ahead, l.keep_secs, l.low, l.high, l.legacy, l.broker_time, (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('txinbox_inbox')), (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('txinbox_rejections')), (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('txinbox_effects')) FROM txinbox_partition_layout l WHERE l.tbl = 'txinbox_inbox'")
            .fetch_one(&mut *conn)
            .await?;
        let secs = |v: i64| Duration::from_secs(v.max(0) as u64);
        Ok(Some(PartitionStatus {
            width: secs(r.try_get(0)?),
            ahead: r.try_get::<i32, _>(1)?.max(0) as u32,
            keep: secs(r.try_get(2)?),
            low: r.try_get(3)?,
            high: r.try_get(4)?,
            legacy: r.try_get(5)?,
            broker_time: r.try_get(6)?,
            marker_partitions: r.try_get::<i64, _>(7)?.max(0) as u32,
            rejection_partitions: r.try_get::<i64, _>(8)?.max(0) as u32,
            effect_partitions: r.try_get::<i64, _>(9)?.max(0) as u32,
        }))
    }

    /// Whether this database's inbox has the partitioned layout; one with a default partition made by hand
    /// is refused ([`StoreError::DefaultPartition`]).
    pub async fn is_partitioned(&self) -> Result<bool, StoreError> {
        let mut conn = self.pool().acquire().await?;
        let state = load(&mut conn).await?;
        if state.is_some() {
            if let Some(refused) = default_partition(&mut conn).await? {
                return Err(refused);
            }
        }
        self.layout_handle().set(state);
        Ok(state.is_some())
    }
}
