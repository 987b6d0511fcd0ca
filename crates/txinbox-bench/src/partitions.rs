//! `--purge-impact N --partitioned`: what retention costs the applying worker on the partitioned layout, where
//! expired markers go with their whole partition (`DETACH PARTITION ... CONCURRENTLY`, then `DROP TABLE`).
//!
//! A fresh schema is converted (day-wide partitions, markers kept 30 days). Each retention cycle loads N expired
//! markers into the oldest partition still kept (then vacuums it and checkpoints, so that the load's
//! background work does not fall in the windows), then measures the inbox's apply rate at the highest
//! `--concurrency` without a drop, in a window that opens with the maintenance's rotation at the moment that
//! partition expires (its drop), and without again; and the sizes: the markers' partitions other than the
//! live one, before the load, after it and after the drop, and their dead tuples. One line per cycle. In the
//! drop's window the applies are also counted per 100 ms slot: `drop_slots/other_slots` is the rate in the
//! slots the drop overlapped against the window's other slots, `window/other_slots` the whole window's rate
//! against its slots outside the drop (the drop's cost as a share of the window, read apart from the drift
//! between windows), and `after_drop/before_drop` the slots after the drop against those before it (below 1
//! when the cost outlasts the drop). With `--controls` each cycle also runs the same three windows with a
//! rotation that drops nothing: their `middle/without` is the drift between windows on the machine, their
//! `window/other_slots` what the in-window figure reads when nothing is dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
use txinbox_lab::lab::LabError;
use txinbox_store::{PartitionOptions, Store};

use crate::fixture::{bench_inbox, expect, in_bench_schema, message};
use crate::rate::measure;
use crate::BenchArgs;

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
    in_bench_schema(&args.store, c as u32 + 4, async |store| {
        cycles(args, rows, c, store).await
    })
    .await
}

async fn cycles(
    args: &BenchArgs,
    rows: i64,
    c: usize,
    store: &Store<sqlx::Postgres>,
) -> Result<(), LabError> {
    let secs = args.seconds.max(1);
    let opts = PartitionOptions::new().width(Duration::from_secs(args.width_hours.max(1) * 3600));
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
    let inbox = Arc::new(bench_inbox(store)?);
    let window = |tag: String| {
        let ib = inbox.clone();
        measure(c, secs, move |t, i| {
            let ib = ib.clone();
            let tag = tag.clone();
            Box::pin(async move {
                let mut m = message(&format!("{tag}-{t}-{i}"), i);
                // The layout places a marker by its event's CloudEvents time.
                m.attributes
                    .insert("ce-time".into(), Utc::now().to_rfc3339());
                expect(&ib, m, "applied").await
            })
        })
    };
    for k in 0..args.cycles {
        let bucket = status.low + width * k as i32;
        let (empty_bytes, _) = old_partitions(store, live).await?;
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
        let (loaded_bytes, _) = old_partitions(store, live).await?;
        let control_first = args.controls && k % 2 == 0;
        // The control's rotation runs a second before this cycle's partition expires: the earlier ones are
        // gone, this one is not due. (Not at the present moment: a run of hourly partitions that crosses an
        // hour would see the oldest partition expire for real and drop it in the control.)
        let quiet = bucket + width + keep - chrono::Duration::seconds(1);
        if control_first {
            control(&window, &inbox, c, secs, k, store, quiet).await?;
        }
        let before = window(format!("before-{k}")).await?;
        // The maintenance's rotation at the moment this partition's last marker expires (it drops exactly
        // it), started a quarter into the window; applies counted per 100 ms slot.
        let at = bucket + width + keep + chrono::Duration::seconds(1);
        let during = drop_window(&inbox, c, secs, &format!("during-{k}"), store, at).await?;
        let rotation = during.rotation;
        let dropped = rotation.dropped.get(&Table::Markers).copied().unwrap_or(0);
        if dropped != 1 {
            return Err(LabError::Usage(format!(
                "cycle {} dropped {dropped} marker partitions, not its one",
                k + 1
            )));
        }
        let after = window(format!("after-{k}")).await?;
        let (dropped_bytes, dead) = old_partitions(store, live).await?;
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM txinbox_inbox WHERE consumer_name = 'expired'",
        )
        .fetch_one(store.pool())
        .await?;
        let baseline = (before.per_sec + after.per_sec) / 2.0;
        println!(
            "purge_impact_partitioned cycle={} markers={rows} load_seconds={load_seconds:.0} apply_before={:.0} apply_during_drop={:.0} apply_after={:.0} during/without={:.2} window/other_slots={:.3} drop_slots/other_slots={:.2} after_drop/before_drop={:.2} partitions_dropped={} drop_seconds={:.2} expired_left={left} old_partition_bytes empty={} loaded={} after_drop={} dead_tuples={dead}",
            k + 1,
            before.per_sec,
            during.per_sec,
            after.per_sec,
            during.per_sec / baseline,
            during.per_sec / during.other_slots,
            during.drop_slots / during.other_slots,
            during.after_before,
            dropped,
            during.drop_time.as_secs_f64(),
            empty_bytes,
            loaded_bytes,
            dropped_bytes,
        );
        if args.controls && !control_first {
            control(&window, &inbox, c, secs, k, store, quiet).await?;
        }
    }
    Ok(())
}

/// A control of cycle `k`: the drop's three windows with a rotation in the middle one that drops nothing (it
/// runs at `quiet`, when no kept partition has expired), printed as one line.
async fn control<W, F, H>(
    window: &W,
    inbox: &Arc<crate::fixture::BenchInbox<H>>,
    c: usize,
    secs: u64,
    k: u32,
    store: &Store<sqlx::Postgres>,
    quiet: DateTime<Utc>,
) -> Result<(), LabError>
where
    W: Fn(String) -> F,
    F: std::future::Future<Output = Result<crate::rate::Rate, LabError>>,
    H: txinbox_core::Handler<Store<sqlx::Postgres>, txinbox_core::Raw> + Send + Sync + 'static,
{
    let before = window(format!("control-before-{k}")).await?;
    let middle = drop_window(inbox, c, secs, &format!("control-{k}"), store, quiet).await?;
    let after = window(format!("control-after-{k}")).await?;
    let dropped: u32 = middle.rotation.dropped.values().sum();
    if dropped != 0 {
        return Err(LabError::Usage(format!(
            "the control of cycle {} dropped {dropped} partition(s): it would measure a drop",
            k + 1
        )));
    }
    println!(
        "purge_impact_control cycle={} apply_before={:.0} apply_middle={:.0} apply_after={:.0} middle/without={:.2} window/other_slots={:.3} after_rotation/before_rotation={:.2} partitions_dropped={dropped} rotation_seconds={:.2}",
        k + 1,
        before.per_sec,
        middle.per_sec,
        after.per_sec,
        middle.per_sec / ((before.per_sec + after.per_sec) / 2.0),
        middle.per_sec / middle.other_slots,
        middle.after_before,
        middle.drop_time.as_secs_f64(),
    );
    Ok(())
}

/// The window in which a partition is dropped.
struct DropWindow {
    /// Applies per second over the whole window.
    per_sec: f64,
    /// Applies per second in the 100 ms slots the drop overlapped.
    drop_slots: f64,
    /// Applies per second in the window's other slots.
    other_slots: f64,
    /// Applies per second in the slots after the drop against the slots before it: below 1 when the drop's
    /// cost outlasts it (which `other_slots` would then hide).
    after_before: f64,
    /// How long the rotation took.
    drop_time: std::time::Duration,
    /// What it did.
    rotation: txinbox_core::runtime::maintenance::PartitionRotation,
}

/// `secs` seconds of applies at concurrency `c`, the rotation at `at` started a quarter into them; the
/// applies counted per 100 ms slot, so that the drop's own cost is read within one window (against the
/// slots it did not overlap), apart from the drift between windows.
async fn drop_window<H>(
    inbox: &Arc<crate::fixture::BenchInbox<H>>,
    c: usize,
    secs: u64,
    tag: &str,
    store: &Store<sqlx::Postgres>,
    at: DateTime<Utc>,
) -> Result<DropWindow, LabError>
where
    H: txinbox_core::Handler<Store<sqlx::Postgres>, txinbox_core::Raw> + Send + Sync + 'static,
{
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..c {
        let (ib, done, stop, tag) = (inbox.clone(), done.clone(), stop.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut m = message(&format!("{tag}-{t}-{i}"), i);
                m.attributes
                    .insert("ce-time".into(), Utc::now().to_rfc3339());
                expect(&ib, m, "applied").await?;
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        }));
    }
    let sampler = {
        let (done, stop) = (done.clone(), stop.clone());
        tokio::spawn(async move {
            let mut samples = vec![(0.0f64, 0u64)];
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
            tick.tick().await;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                samples.push((start.elapsed().as_secs_f64(), done.load(Ordering::Relaxed)));
            }
            samples
        })
    };
    let total = std::time::Duration::from_secs(secs.max(1));
    tokio::time::sleep(total / 4).await;
    let from = start.elapsed().as_secs_f64();
    let rotation = store
        .rotate_partitions(at, &txinbox_core::MaintenanceOptions::default())
        .await?;
    let to = start.elapsed().as_secs_f64();
    if let Some(rest) = total.checked_sub(start.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await
            .map_err(|e| LabError::Usage(e.to_string()))?
            .map_err(LabError::Usage)?;
    }
    let samples = sampler.await.map_err(|e| LabError::Usage(e.to_string()))?;
    let per_sec = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    // Slots before the drop, overlapping it, after it: (applies, seconds).
    let mut slots = [(0u64, 0f64); 3];
    for w in samples.windows(2) {
        let ((t0, n0), (t1, n1)) = (w[0], w[1]);
        let i = if t1 <= from {
            0
        } else if t0 >= to {
            2
        } else {
            1
        };
        slots[i].0 += n1 - n0;
        slots[i].1 += t1 - t0;
    }
    let rate = |(n, s): (u64, f64)| if s > 0.0 { n as f64 / s } else { 0.0 };
    let other = (slots[0].0 + slots[2].0, slots[0].1 + slots[2].1);
    Ok(DropWindow {
        per_sec,
        drop_slots: rate(slots[1]),
        other_slots: rate(other),
        after_before: rate(slots[2]) / rate(slots[0]),
        drop_time: std::time::Duration::from_secs_f64(to - from),
        rotation: rotation
            .ok_or_else(|| LabError::Usage("the store did not rotate its partitions".into()))?,
    })
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
