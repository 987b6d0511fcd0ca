//! `--purge-impact N`: the apply rate without a retention purge, during one and without again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use txinbox_lab::lab::LabError;
use txinbox_store::Store;

use crate::fixture::{bench_inbox, expect, in_bench_schema, message};
use crate::rate::measure;
use crate::BenchArgs;

/// `--purge-impact N`: N expired markers (another consumer's), then the apply rate without a purge, during the
/// maintenance's purge of them, and without again; prints one `purge_impact` line.
pub(super) async fn purge_impact(args: &BenchArgs, rows: i64) -> Result<(), LabError> {
    let c = args.concurrency.iter().copied().max().unwrap_or(8).max(1);
    in_bench_schema(&args.store, c as u32 + 4, async |store| {
        measure_purge(args, rows, c, store).await
    })
    .await
}

async fn measure_purge(
    args: &BenchArgs,
    rows: i64,
    c: usize,
    store: &Store<sqlx::Postgres>,
) -> Result<(), LabError> {
    use txinbox_core::runtime::maintenance::Table;
    use txinbox_core::{Maintenance, MaintenanceOptions};
    let secs = args.seconds.max(1);
    let pool = store.pool().clone();
    let loaded = Instant::now();
    sqlx::query("INSERT INTO txinbox_inbox (consumer_name, source, message_id, payload_hash, received_at, processed_at, retention_until, id_origin) SELECT 'expired', '', 'm-' || g, 'h', now() - interval '40 days', now() - interval '40 days', now() - interval '10 days', 'producer_id' FROM generate_series(1, $1) g")
        .bind(rows)
        .execute(&pool)
        .await?;
    sqlx::Executor::execute(&pool, "ANALYZE txinbox_inbox").await?;
    println!(
        "# purge impact: {rows} expired markers loaded in {:.1}s; apply rate at c={c}, {secs}s per window",
        loaded.elapsed().as_secs_f64()
    );
    let inbox = Arc::new(bench_inbox(store)?);
    let window = |tag: &'static str| {
        let ib = inbox.clone();
        measure(c, secs, move |t, i| {
            let ib = ib.clone();
            Box::pin(async move {
                let m = message(&format!("{tag}-{t}-{i}"), i);
                expect(&ib, m, "applied").await
            })
        })
    };
    let before = window("before").await?;
    let maintenance = Maintenance::new(store.clone())
        .options(MaintenanceOptions::default().budget(Duration::from_secs(3600)));
    let purge = tokio::spawn(async move { maintenance.run_once().await });
    let during = window("during").await?;
    let purge_running_at_end = !purge.is_finished();
    let report = purge.await.map_err(|e| LabError::Usage(e.to_string()))?;
    let after = window("after").await?;
    let baseline = (before.per_sec + after.per_sec) / 2.0;
    println!(
        "purge_impact markers={rows} apply_before={:.0} apply_during_purge={:.0} apply_after={:.0} during/without={:.2} purged={} purge_seconds={:.1} batches={} purge_covered_the_window={}",
        before.per_sec,
        during.per_sec,
        after.per_sec,
        during.per_sec / baseline,
        report.removed_from(Table::Markers),
        report.elapsed.as_secs_f64(),
        report.batches,
        purge_running_at_end
    );
    Ok(())
}
