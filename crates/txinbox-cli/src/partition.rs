//! `txinbox inbox partition`: converts a PostgreSQL inbox to the partitioned layout (retention by dropping whole
//! partitions), or with `--status` prints its layout.

use std::process::ExitCode;
use std::time::Duration;

use crate::out::outln;
use crate::targets::fail;

use txinbox_store::{PartitionOptions, Store};

/// Arguments of `txinbox inbox partition`.
#[derive(Debug, clap::Args)]
pub struct PartitionArgs {
    /// The store (`--store postgres://...`), or the workers' settings file (`--config FILE`: each shard of
    /// `[store.shards]` in turn, or `--shard NAME`).
    #[command(flatten)]
    pub store: crate::targets::StoreArgs,
    /// Hours one partition covers (1 to 744).
    #[arg(long, default_value_t = 24)]
    pub width_hours: u64,
    /// Partitions created ahead of now.
    #[arg(long, default_value_t = 3)]
    pub ahead: u32,
    /// Days a marker is kept past its origin time: the inbox's retention (default: with `--config`, its
    /// `[inbox] retention_seconds`, which a shorter `--keep-days` is refused against; else 30 days, the
    /// inbox's default).
    #[arg(long)]
    pub keep_days: Option<u64>,
    /// Place a message without a CloudEvents `time` by its broker's enqueue time instead of dead-lettering it
    /// (`no_event_time`). A redriven or re-sent copy gets a new enqueue time: across a partition boundary it is
    /// then not recognised as a copy.
    #[arg(long)]
    pub allow_broker_time: bool,
    /// Print the layout and change nothing.
    #[arg(long)]
    pub status: bool,
}

/// Converts (or reports) each store named: exit 0 when each is partitioned, 2 on an error.
pub fn run(args: &PartitionArgs) -> ExitCode {
    let (rt, targets) = match crate::targets::runtime_and_targets(&args.store) {
        Ok(v) => v,
        Err(e) => return fail(&e),
    };
    // The workers' retention, from their settings file: a marker must outlive every copy of its message.
    let workers_keep = match &args.store.config {
        Some(path) => match txinbox_core::settings::WorkerSettings::load(path) {
            Ok(s) => Some(s.retention().keep),
            Err(e) => return fail(&e.to_string()),
        },
        None => None,
    };
    let keep = match (args.keep_days, workers_keep) {
        (Some(days), _) => Duration::from_secs(days.saturating_mul(86_400)),
        (None, Some(keep)) => keep,
        (None, None) => txinbox_core::RetentionPolicy::default().keep,
    };
    if let (Some(days), Some(workers)) = (args.keep_days, workers_keep) {
        if !args.status && keep < workers {
            return fail(&format!(
                "--keep-days {days} is shorter than the workers' retention ([inbox] retention_seconds = {}): partitions of markers would be dropped while copies of their messages can still come back (each then dead-lettered retention_expired, never applied); give --keep-days {} or more, or leave it out to keep the file's",
                workers.as_secs(),
                workers.as_secs().div_ceil(86_400)
            ));
        }
    }
    let opts = PartitionOptions::new()
        .width(Duration::from_secs(args.width_hours.saturating_mul(3600)))
        .ahead(args.ahead)
        .keep(keep)
        .broker_time(args.allow_broker_time);
    if let Err(e) = opts.check() {
        return fail(&e);
    }
    // A shard that cannot be converted is named on stderr; the others still are.
    let mut failed = false;
    for t in &targets {
        if let Some(shard) = &t.shard {
            outln!("shard {shard}:");
        }
        match rt.block_on(one(&t.url, &opts, args.status)) {
            Ok(line) => outln!("{line}"),
            Err(e) => {
                crate::targets::target_failed(t, &e);
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

async fn one(url: &str, opts: &PartitionOptions, status_only: bool) -> Result<String, String> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(format!(
            "the partitioned layout is PostgreSQL's; store URL scheme {} has none",
            crate::inbox::shown_scheme(url)
        ));
    }
    // The store as it is, refused without the inbox: a mistyped database or search_path would otherwise get
    // a new partitioned inbox, reported as converted, while the inbox meant stays row by row. A conversion
    // then migrates an older schema first, as a worker would; `--status` changes nothing.
    let as_is = crate::inbox::postgres_as_is(url, "txinbox-partition", 2).await?;
    let store = if status_only {
        as_is
    } else {
        as_is.close().await;
        Store::<sqlx::Postgres>::connect(url, 2)
            .await
            .map_err(|e| format!("store (postgres): {e}"))?
    };
    let mut out = String::new();
    if !status_only {
        let r = store
            .partition(opts)
            .await
            .map_err(|e| format!("conversion failed, nothing changed in this store: {e}"))?;
        out = if r.already {
            "already partitioned: nothing changed\n".to_owned()
        } else {
            format!(
                "converted: {} partitions created, {} evidence rows and {} effects copied{}\n",
                r.created,
                r.rejections_copied,
                r.effects_copied,
                if r.legacy_kept {
                    "; the existing markers stay in txinbox_inbox_legacy, checked for duplicates until they expire (restart the workers)"
                } else {
                    ""
                }
            )
        };
    }
    let status = store
        .partition_status()
        .await
        .map_err(|e| format!("store (postgres): {e}"))?;
    store.close().await;
    out.push_str(&match status {
        Some(s) => s.to_string(),
        None => "row-by-row (not partitioned)".to_owned(),
    });
    Ok(out)
}
