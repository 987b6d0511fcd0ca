//! `--purge-impact N --partitioned`: what retention costs the applying worker on the partitioned layout, where
//! expired markers go with their whole partition (`DETACH PARTITION ... CONCURRENTLY`, then `DROP TABLE`).
//!
//! A fresh schema is converted (day-wide partitions, markers kept 30 days). Each retention cycle loads N expired
//! markers into the oldest partition still kept (then vacuums it and checkpoints, so that the load's
//! background work does not fall in the windows), then measures the inbox's apply rate at the highest
//! `--concurrency` without a drop, in a window that opens with the maintenance's rotation at the moment that
//! partition expires (its drop), and without again; and the sizes: the markers' partitions other than the
//! live one, before the load, after it and after the drop, and their dead tuples. One line per cycle.

use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
use txinbox_lab::lab::LabError;
use txinbox_store::{PartitionOptions, Store};

use crate::{bench_inbox, bench_store, drop_schema, expect, measure, message, BenchArgs};

/// Bytes of the markers' partitions whose bucket ends before `live` (every partition but the live and future
/// ones), and their dead tuples.
async fn old_partitions(
    store: &Store<sqlx::Postgres>,
    live: DateTime<Utc>,
) -> Result<(i64, i64), LabError> {
    let row: (Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT sum(pg_total_relation_size(c.oid))::bigint, sum(coalesce(s.n_dead_tup, 0))::bigint FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE i.inhparent = to_regclass('txinbox_inbox') AND to_timestamp(substr(c.relname::text, length('txinbox_inbox_p') + 1), 'YYYYMMDD\"t\"HH24MISS') < $1",
    )
    .bind(live)
    .fetch_one(store.pool())
    .await?;
    Ok((row.0.unwrap_or(0), row.1.unwrap_or(0)))
}

pub(crate) async fn purge_impact(args: &BenchArgs, rows: i64) -> Result<(), LabError> {
    if !(1..=25).contains(&args.cycles) || rows < 1 {
        return Err(LabError::Usage(
            "--cycles must be 1 to 25 and --purge-impact at least 1".into(),
        ));
    }
    let c = args.concurrency.iter().copied().max().unwrap_or(8).max(1);
    let secs = args.seconds.max(1);
    let (schema, store) = bench_store(&args.store, c as u32 + 4).await?;
    let opts = PartitionOptions::new();
    let _ = store.partition(&opts).await?;
    let status = store
        .partition_status()
        .await?
        .ok_or_else(|| LabError::Usage("the schema was not partitioned".into()))?;
    let width = chrono::Duration::from_std(status.width).unwrap_or(chrono::Duration::days(1));
    let keep = chrono::Duration::from_std(status.keep).unwrap_or(chrono::Duration::days(30));
    let live = txinbox_bucket(Utc::now(), width);
    println!(
        "# purge impact, partitioned layout: {rows} expired markers per cycle, {} cycles; apply rate at c={c}, {secs}s per window; width {}s, keep {}s",
        args.cycles,
        width.num_seconds(),
        keep.num_seconds()
    );
    let inbox = Arc::new(bench_inbox(&store)?);
    let window = |tag: String| {
        let ib = inbox.clone();
        measure(c, secs, move |t, i| {
            let ib = ib.clone();
            let tag = tag.clone();
            Box::pin(async move {
                let m = message(&format!("{tag}-{t}-{i}"), i);
                expect(&ib, m, "applied").await
            })
        })
    };
    for k in 0..args.cycles {
        let bucket = status.low + width * k as i32;
        let (empty_bytes, _) = old_partitions(&store, live).await?;
        let loaded = Instant::now();
        sqlx::query("INSERT INTO txinbox_inbox (consumer_name, source, message_id, payload_hash, received_at, processed_at, retention_until, id_origin, origin_bucket) SELECT 'expired', '', 'm-' || g, 'h', $2, $2, $2 + $3 * interval '1 second', 'producer_id', $2 FROM generate_series(1, $1) g")
            .bind(rows)
            .bind(bucket)
            .bind(keep.num_seconds() as f64)
            .execute(store.pool())
            .await?;
        let load_seconds = loaded.elapsed().as_secs_f64();
        // The load's own aftermath is not the drop's cost: the loaded partition is vacuumed (an insert-only
        // table that size would be autovacuumed during the windows) and a checkpoint flushes its pages first.
        let part = partition_name(bucket);
        sqlx::Executor::execute(
            store.pool(),
            format!("VACUUM (FREEZE, ANALYZE) {part}").as_str(),
        )
        .await?;
        sqlx::Executor::execute(store.pool(), "ANALYZE txinbox_inbox").await?;
        sqlx::Executor::execute(store.pool(), "CHECKPOINT").await?;
        let (loaded_bytes, _) = old_partitions(&store, live).await?;
        let before = window(format!("before-{k}")).await?;
        // The maintenance's rotation at the moment this partition's last marker expires: it drops exactly it.
        let at = bucket + width + keep + chrono::Duration::seconds(1);
        let rotating = store.clone();
        let drop = tokio::spawn(async move {
            let started = Instant::now();
            let r = rotating
                .rotate_partitions(at, &txinbox_core::MaintenanceOptions::default())
                .await;
            (r, started.elapsed())
        });
        let during = window(format!("during-{k}")).await?;
        let (rotation, drop_time) = drop.await.map_err(|e| LabError::Usage(e.to_string()))?;
        let rotation = rotation?
            .ok_or_else(|| LabError::Usage("the store did not rotate its partitions".into()))?;
        let after = window(format!("after-{k}")).await?;
        let (dropped_bytes, dead) = old_partitions(&store, live).await?;
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM txinbox_inbox WHERE consumer_name = 'expired'",
        )
        .fetch_one(store.pool())
        .await?;
        let baseline = (before.per_sec + after.per_sec) / 2.0;
        println!(
            "purge_impact_partitioned cycle={} markers={rows} load_seconds={load_seconds:.0} apply_before={:.0} apply_during_drop={:.0} apply_after={:.0} during/without={:.2} partitions_dropped={} drop_seconds={:.2} expired_left={left} old_partition_bytes empty={} loaded={} after_drop={} dead_tuples={dead}",
            k + 1,
            before.per_sec,
            during.per_sec,
            after.per_sec,
            during.per_sec / baseline,
            rotation.dropped.get(&Table::Markers).copied().unwrap_or(0),
            drop_time.as_secs_f64(),
            empty_bytes,
            loaded_bytes,
            dropped_bytes,
        );
    }
    store.close().await;
    drop_schema(&args.store, &schema).await;
    Ok(())
}

/// The markers' partition of the bucket starting at `bucket` (the store's naming).
fn partition_name(bucket: DateTime<Utc>) -> String {
    format!("txinbox_inbox_p{}", bucket.format("%Y%m%dt%H%M%S"))
}

/// The start of the bucket of `at`.
fn txinbox_bucket(at: DateTime<Utc>, width: chrono::Duration) -> DateTime<Utc> {
    let w = width.num_seconds().max(1);
    DateTime::from_timestamp(at.timestamp().div_euclid(w) * w, 0).unwrap_or(at)
}
