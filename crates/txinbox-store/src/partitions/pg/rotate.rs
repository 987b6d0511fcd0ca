//! The rotation: partitions created ahead of now, whole partitions dropped past their retention.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres, Row};
use txinbox_core::runtime::maintenance::{MaintenanceOptions, PartitionRotation, Table};

use super::{
    attach_new, buckets, default_partition, partition_bucket, partition_name, EFFECTS, INBOX,
    REJECTIONS,
};
use crate::error::StoreError;
use crate::partitions::{bucket_of, ROTATION_LOCK};

/// The partitioned tables' layouts.
const LAYOUTS: &str =
    "SELECT tbl, width_secs, ahead, keep_secs, low, high, legacy FROM txinbox_partition_layout";

/// Creates the partitions ahead of `now` and drops whole the ones past their retention (markers: the
/// layout's keep; evidence: `rejections_keep`), and the frozen legacy table once its last marker
/// expired: one node at a time (a session advisory lock per schema; another node's pass is `skipped`). `None` for a
/// row-by-row database. The maintenance runs it before each pass.
pub(crate) async fn rotate_partitions(
    pool: &PgPool,
    now: DateTime<Utc>,
    opts: &MaintenanceOptions,
) -> Result<Option<PartitionRotation>, StoreError> {
    {
        let mut conn = pool.acquire().await?;
        // Whether this database is partitioned at all (no rotation lock for a row-by-row one), from the
        // catalog: the layout itself is read only once the lock is held.
        let partitioned: bool =
            sqlx::query_scalar("SELECT to_regclass('txinbox_partition_layout') IS NOT NULL")
                .fetch_one(&mut *conn)
                .await?;
        if !partitioned {
            return Ok(None);
        }
        // A default partition made by hand would take the rows of a bucket without a partition (and fail the
        // creation of one whose rows it holds): refused before anything is changed.
        if let Some(refused) = default_partition(&mut conn).await? {
            return Err(refused);
        }
        let mut report = PartitionRotation::default();
        // From the lock's request to its release, the connection is closed if this future is dropped (a
        // maintenance pass cut at shutdown): the lock lives as long as the session, and a pooled connection
        // that kept it would make every other node skip its rotation for as long as it lives.
        let mut held = Held(Some(conn));
        let conn = held.conn()?;
        let locked: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext(current_schema()))")
                .bind(ROTATION_LOCK)
                .fetch_one(&mut *conn)
                .await?;
        if !locked {
            held.release();
            report.skipped = true;
            return Ok(Some(report));
        }
        // The layout as the node that held the lock last left it: read before the lock, it could predate
        // another node's pass, and this one would create again the partitions that pass dropped (below its
        // `low`), where a late copy of a message whose marker went with them would be applied again.
        let done = match sqlx::query(LAYOUTS).fetch_all(&mut *conn).await {
            Ok(layouts) if layouts.is_empty() => Ok(false),
            Ok(layouts) => rotate(&mut *conn, &layouts, now, opts, &mut report)
                .await
                .map(|()| true),
            Err(e) => Err(e),
        };
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1, hashtext(current_schema()))")
            .bind(ROTATION_LOCK)
            .execute(&mut *conn)
            .await;
        if unlocked.is_ok() {
            held.release();
        }
        Ok(done?.then_some(report))
    }
}

/// A connection that may hold the rotation's session lock: closed when dropped, unless released back to the
/// pool once the lock is known to be let go.
struct Held(Option<PoolConnection<Postgres>>);

impl Held {
    /// The connection (there from its creation until `release` or drop, which take `self`).
    fn conn(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        self.0
            .as_deref_mut()
            .ok_or_else(|| sqlx::Error::Protocol("the rotation's connection is gone".into()))
    }

    /// Hands the connection back to the pool: it holds no lock.
    fn release(mut self) {
        drop(self.0.take());
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            // Closing the session lets its advisory locks go.
            drop(c.detach());
        }
    }
}

async fn rotate(
    conn: &mut PgConnection,
    layouts: &[sqlx::postgres::PgRow],
    now: DateTime<Utc>,
    opts: &MaintenanceOptions,
    report: &mut PartitionRotation,
) -> Result<(), sqlx::Error> {
    sqlx::Executor::execute(&mut *conn, "SET client_min_messages TO warning").await?;
    for l in layouts {
        let tbl: String = l.try_get(0)?;
        let (width, ahead, keep): (i64, i32, i64) = (l.try_get(1)?, l.try_get(2)?, l.try_get(3)?);
        let low: DateTime<Utc> = l.try_get(4)?;
        let since = |d: Duration| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
        let (table, parent, keep) = match tbl.as_str() {
            INBOX => (Table::Markers, INBOX, chrono::Duration::seconds(keep)),
            REJECTIONS => (Table::Rejections, REJECTIONS, since(opts.rejections_keep)),
            EFFECTS => (Table::Effects, EFFECTS, since(opts.effects_keep)),
            _ => continue,
        };
        let w = chrono::Duration::seconds(width);
        // Effects finished before this have been kept long enough.
        let cutoff = now
            .checked_sub_signed(keep)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        // Detaches a crash left half done are finished, and tables detached but not dropped are dropped.
        let parts = sqlx::query("SELECT c.relname::text, i.inhdetachpending FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)")
            .bind(parent)
            .fetch_all(&mut *conn)
            .await?;
        let mut attached = Vec::new();
        for p in &parts {
            let (name, pending): (String, bool) = (p.try_get(0)?, p.try_get(1)?);
            let Some(b) = partition_bucket(parent, &name) else {
                // Not one of the rotation's (an operator's own table, detached for archiving, say): left
                // as it is. The names the rotation acts on are its own, letters and digits only, so they
                // go into the statements below as they are.
                continue;
            };
            if pending {
                let sql = format!("ALTER TABLE {parent} DETACH PARTITION {name} FINALIZE");
                sqlx::Executor::execute(&mut *conn, sql.as_str()).await?;
                if !drop_detached(&mut *conn, table, parent, &name, b, width, cutoff).await? {
                    attached.push(b);
                }
            } else {
                attached.push(b);
            }
        }
        let orphans: Vec<String> = sqlx::query_scalar("SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND c.relkind = 'r' AND NOT c.relispartition AND starts_with(c.relname::text, $1)")
            .bind(format!("{parent}_p"))
            .fetch_all(&mut *conn)
            .await?;
        for name in orphans {
            if let Some(b) = partition_bucket(parent, &name) {
                if !drop_detached(&mut *conn, table, parent, &name, b, width, cutoff).await? {
                    attached.push(b);
                }
            }
        }
        // Ahead: every bucket from now's to `ahead` past it. For markers, from `low`: a marker is placed by
        // its event's time, so every bucket between `low` and the end must exist, including those a
        // maintenance that was down for longer than `width x ahead` did not create in time (their
        // markers were released as unplaced meanwhile; without their partitions they would fail on
        // insert once `high` moved past them). Evidence and effects are placed by the time of their
        // commit: from now's bucket.
        let target = bucket_of(now, width) + w * (ahead + 1);
        let from = if table == Table::Markers {
            low
        } else {
            bucket_of(now, width).max(low)
        };
        let mut created = 0;
        for b in buckets(from, target, width) {
            if !attached.contains(&b) {
                attach_new(&mut *conn, parent, b, width).await?;
                attached.push(b);
                created += 1;
            }
        }
        let high = attached.iter().max().map_or(target, |b| *b + w);
        sqlx::query("UPDATE txinbox_partition_layout SET high = $2 WHERE tbl = $1")
            .bind(parent)
            .bind(high)
            .execute(&mut *conn)
            .await?;
        report.created.insert(table, created);
        report.ends.insert(table, high);
        // Behind: whole partitions past their retention, oldest first. `low` moves first, so a store
        // refuses a copy of a dropped bucket before the partition goes.
        attached.sort();
        let (mut dropped, mut held) = (0, 0);
        for b in attached.iter().copied() {
            // A keep too long for a date (`Duration::MAX` for "for ever") never expires anything.
            if (b + w).checked_add_signed(keep).is_none_or(|end| end > now) {
                break;
            }
            let name = partition_name(parent, b);
            if table == Table::Effects {
                // Effects leave with their partition only when every one is finished and was finished
                // longer ago than the keep: a failed or needs-attention effect holds it for an operator.
                if effects_busy(&mut *conn, &name, cutoff).await? {
                    held += 1;
                    continue;
                }
            } else {
                // `low` first: a store that reads it refuses a copy of this bucket before the partition
                // goes.
                sqlx::query(
                    "UPDATE txinbox_partition_layout SET low = GREATEST(low, $2) WHERE tbl = $1",
                )
                .bind(parent)
                .bind(b + w)
                .execute(&mut *conn)
                .await?;
            }
            let detach = format!("ALTER TABLE {parent} DETACH PARTITION {name} CONCURRENTLY");
            sqlx::Executor::execute(&mut *conn, detach.as_str()).await?;
            if drop_detached(&mut *conn, table, parent, &name, b, width, cutoff).await? {
                dropped += 1;
            } else {
                held += 1;
            }
        }
        report.dropped.insert(table, dropped);
        report.held.insert(table, held);
        if table == Table::Markers {
            let legacy: bool = l.try_get(6)?;
            if legacy {
                let live: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM txinbox_inbox_legacy WHERE retention_until >= $1)",
                )
                .bind(now)
                .fetch_one(&mut *conn)
                .await?;
                if !live {
                    // The flag first: a store that reads it stops looking there before the table goes.
                    sqlx::query(
                        "UPDATE txinbox_partition_layout SET legacy = FALSE WHERE tbl = $1",
                    )
                    .bind(parent)
                    .execute(&mut *conn)
                    .await?;
                    sqlx::Executor::execute(
                        &mut *conn,
                        "DROP TABLE IF EXISTS txinbox_inbox_legacy",
                    )
                    .await?;
                    report.legacy_dropped = true;
                }
            }
        }
    }
    Ok(())
}

/// Whether the effects' partition (or detached table) `name` holds an effect that keeps it: one not finished,
/// or finished at `cutoff` or later.
async fn effects_busy(
    conn: &mut PgConnection,
    name: &str,
    cutoff: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let check = format!("SELECT EXISTS (SELECT 1 FROM {name} WHERE state <> 'done' AND (state <> 'compensated' OR finished_at IS NULL OR finished_at >= $1)) OR EXISTS (SELECT 1 FROM {name} WHERE state = 'done' AND finished_at >= $1)");
    sqlx::query_scalar(&check)
        .bind(cutoff)
        .fetch_one(&mut *conn)
        .await
}

/// Drops `name`, a partition of `parent` for `bucket` now detached; true when dropped. A detached table of
/// effects is looked at once more first, and attached back if an effect keeps it: the look before the
/// detach saw only committed rows, and `DETACH ... CONCURRENTLY` waits for the transactions that use the
/// table, so an effect committed meanwhile into that partition is in it now, and would go with it.
async fn drop_detached(
    conn: &mut PgConnection,
    table: Table,
    parent: &str,
    name: &str,
    bucket: DateTime<Utc>,
    width: i64,
    cutoff: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    if table == Table::Effects && effects_busy(&mut *conn, name, cutoff).await? {
        let attach = format!(
            "ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES FROM ('{}') TO ('{}')",
            super::rfc(bucket),
            super::rfc(bucket + chrono::Duration::seconds(width))
        );
        sqlx::Executor::execute(&mut *conn, attach.as_str()).await?;
        return Ok(false);
    }
    sqlx::Executor::execute(&mut *conn, format!("DROP TABLE {name}").as_str()).await?;
    Ok(true)
}
