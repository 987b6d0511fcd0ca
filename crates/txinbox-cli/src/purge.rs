//! `txinbox inbox purge`: one maintenance pass (retention) for operators, with progress on a terminal.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::out::outln;
use crate::targets::fail;

use txinbox_core::runtime::maintenance::Table;
use txinbox_core::{Maintenance, MaintenanceOptions, MaintenanceReport, MaintenanceStore};

/// Arguments of `txinbox inbox purge`.
#[derive(Debug, clap::Args)]
pub struct PurgeArgs {
    /// The store (`--store URL`: `sqlite:path.db`, `postgres://...` or `dynamodb://TABLE`, where nothing is
    /// deleted, the TTL does it), or the workers' settings file (`--config FILE`: each shard of
    /// `[store.shards]` in turn, or `--shard NAME`).
    #[command(flatten)]
    pub store: crate::targets::StoreArgs,
    /// Rows deleted per statement.
    #[arg(long, default_value_t = 1000)]
    pub batch: i64,
    /// Milliseconds to pause between two batches (the applying transactions get the database back).
    #[arg(long, default_value_t = 50)]
    pub pause_ms: u64,
    /// Longest time this pass may take, in seconds; what is left waits for the next pass (exit code 3).
    #[arg(long, default_value_t = 600)]
    pub budget_secs: u64,
    /// Days evidence rows (collisions, business duplicates) are kept.
    #[arg(long, default_value_t = 90)]
    pub rejections_keep_days: u64,
    /// Days done and compensated effects are kept.
    #[arg(long, default_value_t = 7)]
    pub effects_keep_days: u64,
    /// Print one JSON document instead of a line.
    #[arg(long)]
    pub json: bool,
}

/// Runs one pass on each store named (one, or each shard in turn): exit 0 when nothing expired is left, 3 when
/// the time budget stopped a pass first, 2 on an error.
pub fn run(args: &PurgeArgs) -> ExitCode {
    let (rt, targets) = match crate::targets::runtime_and_targets(&args.store) {
        Ok(v) => v,
        Err(e) => return fail(&e),
    };
    if args.json && targets.len() > 1 {
        return fail("--json prints one document: with several shards, name one with --shard");
    }
    // A shard that cannot be purged is named on stderr; the others still get their pass.
    let (mut budget_exhausted, mut failed) = (false, false);
    for t in &targets {
        if let (Some(shard), false) = (&t.shard, args.json) {
            outln!("shard {shard}:");
        }
        let report = match rt.block_on(one_pass(&t.url, args, chrono::Utc::now())) {
            Ok(r) => r,
            Err(e) => {
                crate::targets::target_failed(t, &e);
                failed = true;
                continue;
            }
        };
        if let Some(e) = &report.error {
            crate::targets::target_failed(t, &format!("purge stopped: {e} ({report})"));
            failed = true;
            continue;
        }
        print_report(&report, args.json);
        budget_exhausted |= report.budget_exhausted;
    }
    if failed {
        ExitCode::from(2)
    } else if budget_exhausted {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}

/// One pass on the store at `url`, at the store's clock: PostgreSQL's server clock, else `host_now`, this
/// host's (SQLite's file is on it; on DynamoDB the pass deletes nothing). The store is opened as it is: never
/// created nor migrated, and refused without the inbox's schema (a mistyped URL would otherwise get a fresh,
/// empty inbox, and the pass would report nothing expired with exit code 0).
async fn one_pass(
    url: &str,
    args: &PurgeArgs,
    host_now: DateTime<Utc>,
) -> Result<MaintenanceReport, String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = crate::inbox::postgres_as_is(url, "txinbox-purge", 2).await?;
        pass(store, args, host_now).await
    } else if url.starts_with("sqlite:") {
        let store = crate::inbox::sqlite_as_is(url, 2).await?;
        pass(store, args, host_now).await
    } else if url.starts_with("dynamodb://") {
        let store = txinbox_dynamodb::DynamoStore::connect(url)
            .await
            .map_err(|e| format!("store (dynamodb): {e}"))?;
        crate::out::errln!("note: on DynamoDB expiry is the TTL's (expires_at): expired items are absent to the store from that second on and DynamoDB deletes them in the background; this pass deletes nothing");
        pass(store, args, host_now).await
    } else {
        Err(format!(
            "unsupported store URL scheme {} (expected sqlite:, postgres:// or dynamodb://)",
            crate::inbox::shown_scheme(url)
        ))
    }
}

fn print_report(report: &MaintenanceReport, json: bool) {
    if json {
        outln!("{}", report_json(report));
    } else {
        outln!("{report}");
    }
}

/// The report as one JSON document: every count the line has, and the removals by consumer.
fn report_json(report: &MaintenanceReport) -> serde_json::Value {
    let by_table = |m: &std::collections::BTreeMap<Table, u32>| {
        m.iter()
            .map(|(t, n)| (t.as_str(), *n))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let removed: Vec<_> = report
        .removed
        .iter()
        .map(|((t, c), n)| serde_json::json!({"table": t.as_str(), "consumer": c, "removed": n}))
        .collect();
    serde_json::json!({
        "removed": removed,
        "markers": report.removed_from(Table::Markers),
        "rejections": report.removed_from(Table::Rejections),
        "effects": report.removed_from(Table::Effects),
        "batches": report.batches,
        "seconds": report.elapsed.as_secs_f64(),
        "budget_exhausted": report.budget_exhausted,
        "partitions": report.partitions.as_ref().map(|p| serde_json::json!({
            "skipped": p.skipped,
            "created": by_table(&p.created),
            "dropped": by_table(&p.dropped),
            "held": by_table(&p.held),
            "legacy_dropped": p.legacy_dropped,
        })),
    })
}

/// One pass, bounded as the worker bounds its background passes ([`MaintenanceOptions::pass_timeout`]: the
/// budget plus 60 s): a store call that never answers (a lock held by another session, a hung connection) ends
/// the command with an error instead of holding it, and a cron job behind it, for ever.
async fn pass<S: MaintenanceStore>(
    store: S,
    args: &PurgeArgs,
    now: DateTime<Utc>,
) -> Result<MaintenanceReport, String> {
    // Saturating, not `as u32`: a day count past u32 would wrap to a short keep and delete recent rows; a
    // keep too long for a date keeps everything.
    let days = |n: u64| Duration::from_secs(n.saturating_mul(24 * 3600));
    let options = MaintenanceOptions::default()
        .batch(args.batch)
        .pause(Duration::from_millis(args.pause_ms))
        .budget(Duration::from_secs(args.budget_secs.max(1)))
        .rejections_keep(days(args.rejections_keep_days))
        .effects_keep(days(args.effects_keep_days));
    let timeout = options.pass_timeout();
    // The store's clock decides what expired where it has one (PostgreSQL's server clock), not this host's: a
    // host whose clock runs ahead (an operator's laptop, a cron container) would purge markers whose copies can
    // still come back, and drop partitions early, as the workers' maintenance would.
    let now = store
        .clock()
        .await
        .map_err(|e| format!("store: reading its clock: {e}"))?
        .unwrap_or(now);
    let m = Maintenance::new(store).options(options);
    let tty = std::io::stderr().is_terminal();
    let report = tokio::time::timeout(
        timeout,
        m.run_once_at(now, &mut |r: &MaintenanceReport| {
            if tty {
                let mut e = std::io::stderr().lock();
                let _ = write!(e, "\r{r}   ");
                let _ = e.flush();
            }
        }),
    )
    .await;
    if tty {
        crate::out::errln!();
    }
    report.map_err(|_| {
        format!(
            "the pass did not end within {} s (its budget plus 60 s): a store call did not answer (a lock held by another session, a hung connection); nothing after it ran",
            timeout.as_secs()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use txinbox_core::runtime::maintenance::PartitionRotation;

    /// A store whose every purge call never answers (a lock another session holds).
    #[derive(Clone)]
    struct Hangs;

    impl MaintenanceStore for Hangs {
        type Error = std::io::Error;
        async fn purge_batch(
            &self,
            _: Table,
            _: chrono::DateTime<chrono::Utc>,
            _: i64,
        ) -> Result<Vec<String>, Self::Error> {
            std::future::pending().await
        }
        async fn table_stats(
            &self,
            _: Table,
            _: &str,
        ) -> Result<(i64, Option<chrono::DateTime<chrono::Utc>>), Self::Error> {
            Ok((0, None))
        }
    }

    /// `txinbox inbox purge` on a store whose call never answers ends with an error at the pass's bound (the
    /// budget plus 60 s); it waited for ever.
    #[tokio::test(start_paused = true)]
    async fn a_pass_whose_store_call_never_answers_ends_at_its_bound() {
        let args = PurgeArgs {
            store: Default::default(),
            batch: 1000,
            pause_ms: 50,
            budget_secs: 5,
            rejections_keep_days: 90,
            effects_keep_days: 7,
            json: false,
        };
        let start = tokio::time::Instant::now();
        let e = pass(Hangs, &args, Utc::now()).await.unwrap_err();
        assert_eq!(start.elapsed(), Duration::from_secs(65), "{e}");
        assert!(e.contains("did not end within 65 s"), "{e}");
    }

    /// An operator's host whose clock runs ahead of the database's (a laptop, a cron container) purged, on
    /// PostgreSQL, the markers whose retention had not passed yet by the database's clock: a copy of such a
    /// message still in the queue or the dead-letter queue was then applied again as new. The pass keeps
    /// them: on PostgreSQL the database's clock says what expired (the markers of the worker hosts, the
    /// effects' claims and due times are on it too), whatever the operator's host says.
    #[tokio::test]
    async fn a_pass_from_a_host_whose_clock_is_ahead_keeps_markers_the_database_has_not_expired() {
        let crate::testing::PgSchema {
            base,
            schema,
            admin,
            store,
            ..
        } = crate::testing::PgSchema::new().await;
        // A marker with a day of retention left, and one that expired an hour ago, by the database's clock.
        sqlx::query("INSERT INTO txinbox_inbox (consumer_name, source, message_id, payload_hash, received_at, processed_at, retention_until, id_origin) VALUES ('c', '', 'live', 'h', now(), now(), now() + interval '1 day', 'producer_id'), ('c', '', 'expired', 'h', now(), now(), now() - interval '1 hour', 'producer_id')")
            .execute(store.pool())
            .await
            .unwrap();
        store.close().await;
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
        let args = PurgeArgs {
            store: Default::default(),
            batch: 1000,
            pause_ms: 0,
            budget_secs: 60,
            rejections_keep_days: 90,
            effects_keep_days: 7,
            json: false,
        };
        // This host's clock two days ahead of the database's.
        let report = one_pass(&url, &args, Utc::now() + chrono::Duration::days(2)).await;
        let left: Result<Vec<String>, _> = sqlx::query_scalar(&format!(
            "SELECT message_id FROM {schema}.txinbox_inbox ORDER BY message_id"
        ))
        .fetch_all(&admin)
        .await;
        crate::testing::PgSchema::drop_schema(&schema, admin).await;
        let report = report.unwrap();
        assert_eq!(left.unwrap(), ["live"], "{report}");
        assert_eq!(report.removed_from(Table::Markers), 1, "{report}");
    }

    #[test]
    fn the_json_report_has_the_partitions_held_the_line_shows() {
        let mut rotation = PartitionRotation::default();
        rotation.dropped.insert(Table::Markers, 2);
        rotation.held.insert(Table::Effects, 1);
        let mut report = MaintenanceReport::default();
        report.partitions = Some(rotation);
        assert!(report.to_string().contains("held=1"), "{report}");
        let doc = report_json(&report);
        assert_eq!(doc["partitions"]["held"]["effects"], 1, "{doc}");
        assert_eq!(doc["partitions"]["dropped"]["markers"], 2, "{doc}");
    }
}
