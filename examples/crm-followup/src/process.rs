//! The process around the agent: the flags both workers share, exit codes, logging, metrics.

use txinbox::settings::WorkerSettings;
use txinbox::MonitorReport;

use crate::Error;

/// The flags both example workers share (`#[command(flatten)]`): the settings file and the overrides that are
/// not about a broker. Each worker adds its broker's own. Its `Debug` masks the URLs' passwords and query values.
#[derive(clap::Args)]
pub struct CommonArgs {
    /// The settings file (the one `txinbox check-infra --config` reads). Without it: the defaults and the
    /// `TXINBOX_<SECTION>__<KEY>` environment overrides.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Print the values the worker would run with (`key=value`) and exit without connecting.
    #[arg(long)]
    pub print_config: bool,
    /// The store: `sqlite:crm.db`, `postgres://user@host/db` or `dynamodb://TABLE` (`[store] url`).
    #[arg(long)]
    pub store: Option<String>,
    /// The consumer name, part of every inbox key (`[worker] consumer`).
    #[arg(long)]
    pub consumer: Option<String>,
    /// Messages processed at once (`[worker] concurrency`).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Serve Prometheus metrics (`GET /metrics`) here, e.g. `127.0.0.1:9464` (`[worker] metrics_addr`).
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Serve `GET /livez` and `GET /readyz` here, e.g. `127.0.0.1:8080` (`[worker] health_addr`).
    #[arg(long)]
    pub health_addr: Option<String>,
    /// Run the maintenance every this many seconds beside the worker (`[worker] purge_interval_seconds`).
    #[arg(long)]
    pub purge_interval_secs: Option<u64>,
    /// Stop when receives keep failing this many seconds with an error a retry cannot fix (a key rotated, a
    /// permission removed, the queue deleted), so that the supervisor sees it (`[worker]
    /// give_up_after_seconds`; 0: never).
    #[arg(long)]
    pub give_up_after_secs: Option<u64>,
    /// The external CRM's base URL (e.g. `txinbox-crm-api`'s): each follow-up task is also created there,
    /// through an effect with its idempotency key, run beside the worker.
    #[arg(long, env = "TXINBOX_CRM_URL")]
    pub crm_url: Option<String>,
}

impl std::fmt::Debug for CommonArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use txinbox::error::redact_url;
        f.debug_struct("CommonArgs")
            .field("config", &self.config)
            .field("print_config", &self.print_config)
            .field("store", &self.store.as_deref().map(redact_url))
            .field("consumer", &self.consumer)
            .field("concurrency", &self.concurrency)
            .field("metrics_addr", &self.metrics_addr)
            .field("health_addr", &self.health_addr)
            .field("purge_interval_secs", &self.purge_interval_secs)
            .field("give_up_after_secs", &self.give_up_after_secs)
            .field("crm_url", &self.crm_url.as_deref().map(redact_url))
            .finish()
    }
}

impl CommonArgs {
    /// The settings: the file (or the defaults), then the environment, then these flags. The caller applies
    /// its broker's flags on top.
    pub fn settings(&self) -> Result<WorkerSettings, Error> {
        let mut s = match &self.config {
            Some(path) => WorkerSettings::load(path)?,
            None => WorkerSettings::from_env()?,
        };
        set(&mut s.worker.metrics_addr, &self.metrics_addr);
        set(&mut s.worker.health_addr, &self.health_addr);
        if let Some(v) = &self.store {
            // A worker on shards never uses `[store] url`: the flag would be ignored without a word.
            if !s.store.shards.is_empty() {
                return Err(
                    "--store with a settings file that has [store.shards]: the worker runs on each shard's url; remove --store, or use a file without shards".into(),
                );
            }
            s.store.url.clone_from(v);
        }
        if let Some(v) = &self.consumer {
            s.worker.consumer.clone_from(v);
        }
        if let Some(v) = self.concurrency {
            s.worker.concurrency = v.max(1);
        }
        if self.purge_interval_secs.is_some() {
            s.worker.purge_interval_seconds = self.purge_interval_secs;
        }
        if let Some(v) = self.give_up_after_secs {
            s.worker.give_up_after_seconds = v;
        }
        Ok(s)
    }
}

/// Sets `to` when a flag gave `from`.
pub fn set(to: &mut Option<String>, from: &Option<String>) {
    if from.is_some() {
        to.clone_from(from);
    }
}

/// A worker that stopped because its receives kept failing with an error a retry cannot fix.
#[derive(Debug)]
pub struct GaveUp(pub String);

impl std::fmt::Display for GaveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gave up: {}", self.0)
    }
}

impl std::error::Error for GaveUp {}

/// A worker that stopped with deliveries abandoned past its shutdown grace ([`txinbox::WorkerReport::abandoned`]):
/// they come back from the broker (a committed one as a duplicate), but the stop was not clean.
#[derive(Debug)]
pub struct Abandoned(pub u64);

impl std::fmt::Display for Abandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "abandoned {} deliveries still in flight past the shutdown grace (received again after their lock or visibility timeout)",
            self.0
        )
    }
}

impl std::error::Error for Abandoned {}

/// A part beside the worker (the effect runner, the maintenance, the health endpoint) that panicked (a bug) or
/// was still running past the shutdown's bound and was abandoned ([`MonitorReport::panicked_parts`],
/// [`MonitorReport::abandoned_parts`]).
#[derive(Debug)]
pub struct PartsFailed {
    /// The parts that panicked.
    pub panicked: Vec<String>,
    /// The parts abandoned at shutdown.
    pub abandoned: Vec<String>,
}

impl std::fmt::Display for PartsFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sep = "";
        if !self.panicked.is_empty() {
            write!(f, "panicked: {}", self.panicked.join(", "))?;
            sep = "; ";
        }
        if !self.abandoned.is_empty() {
            write!(
                f,
                "{sep}abandoned at shutdown (still running past the grace): {}",
                self.abandoned.join(", ")
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for PartsFailed {}

/// Exit code of a worker that could not start (bad settings, a queue or database it cannot use).
pub const EXIT_CANNOT_START: u8 = 2;
/// Exit code of a worker that ran and gave up ([`GaveUp`]), as `Monitor`'s.
pub const EXIT_GAVE_UP: u8 = 3;
/// Exit code of a worker that abandoned deliveries or a part at shutdown ([`Abandoned`], [`PartsFailed`]
/// without a panic), as `Monitor`'s.
pub const EXIT_ABANDONED: u8 = 4;
/// Exit code of a worker one of whose parts panicked ([`PartsFailed`]), as `Monitor`'s.
pub const EXIT_PANICKED: u8 = 5;

/// The process's exit: `0`, or one line on stderr naming what is wrong (the errors never carry a secret) and
/// [`EXIT_GAVE_UP`], [`EXIT_PANICKED`], [`EXIT_ABANDONED`] or [`EXIT_CANNOT_START`].
pub fn exit(program: &str, result: Result<(), Error>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let line = e
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            eprintln!("{program}: {line}");
            std::process::ExitCode::from(if e.downcast_ref::<GaveUp>().is_some() {
                EXIT_GAVE_UP
            } else if let Some(p) = e.downcast_ref::<PartsFailed>() {
                if p.panicked.is_empty() {
                    EXIT_ABANDONED
                } else {
                    EXIT_PANICKED
                }
            } else if e.downcast_ref::<Abandoned>().is_some() {
                EXIT_ABANDONED
            } else {
                EXIT_CANNOT_START
            })
        }
    }
}

/// Logs to stdout through `tracing-subscriber`, at `RUST_LOG` (default `info`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
}

/// The consumer's end: the worker's report on stdout, and [`GaveUp`] when it stopped on persistent receive
/// errors, else [`PartsFailed`] when a part beside it panicked or was abandoned at shutdown, else [`Abandoned`]
/// when it abandoned deliveries at shutdown: the order of [`MonitorReport::exit_code`].
pub fn finish(report: &MonitorReport) -> Result<(), Error> {
    let worker = report.worker.clone().unwrap_or_default();
    println!("{worker}");
    let parts = PartsFailed {
        panicked: report.panicked_parts.clone(),
        abandoned: report.abandoned_parts.clone(),
    };
    match &worker.gave_up {
        Some(why) => Err(GaveUp(why.clone()).into()),
        None if !parts.panicked.is_empty() || !parts.abandoned.is_empty() => Err(parts.into()),
        None if worker.abandoned > 0 => Err(Abandoned(worker.abandoned).into()),
        None => Ok(()),
    }
}

/// Serves Prometheus metrics (`GET /metrics`) on `addr` through `metrics-exporter-prometheus`, with buckets for
/// the histograms, and registers the metric descriptions.
pub fn serve_metrics(addr: std::net::SocketAddr) -> Result<(), Error> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    const SECONDS: &[f64] = &[
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ];
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Full(txinbox::metrics::RECEIVE_TO_COMMIT.to_owned()),
            SECONDS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(txinbox::metrics::MAINTENANCE_DURATION.to_owned()),
            SECONDS,
        )?
        .install()?;
    txinbox::metrics::describe();
    tracing::info!(%addr, "serving Prometheus metrics on /metrics");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--store` with a settings file that has shards is refused with one line (never the URL), where the worker
    /// would have run on the shards and ignored it.
    #[test]
    fn store_flag_with_a_sharded_settings_file_is_refused() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            common: CommonArgs,
        }
        let dir =
            std::env::temp_dir().join(format!("crm-followup-store-flag-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("worker.toml");
        std::fs::write(
            &file,
            "[store.shards.eu-1]\nurl = \"postgres://crm@db-eu-1/crm\"\nrest = true\n",
        )
        .unwrap();
        let config = file.display().to_string();
        let parse = |extra: &[&str]| {
            let mut args = vec!["crm-worker", "--config", &config];
            args.extend_from_slice(extra);
            <Cli as clap::Parser>::try_parse_from(args)
                .unwrap()
                .common
                .settings()
        };
        let e = parse(&["--store", "postgres://crm:s3cretpw@db/crm"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--store") && e.contains("[store.shards]"), "{e}");
        assert!(!e.contains("s3cretpw"), "{e}");
        assert_eq!(parse(&[]).unwrap().store.shards.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The flags' `Debug` shows the store's and the CRM's URLs without their password or query values.
    #[test]
    fn debug_of_the_flags_masks_the_urls_secrets() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            common: CommonArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([
            "crm-worker",
            "--store",
            "postgres://crm:s3cretpw@db/crm",
            "--crm-url",
            "https://u:s3cretcrm@crm.example/v1?api_key=s3cretkey",
        ])
        .unwrap();
        let shown = format!("{:?}", cli.common);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("postgres://crm:***@db/crm"), "{shown}");
        assert!(shown.contains("crm.example"), "{shown}");
    }

    /// A worker that abandoned deliveries at shutdown does not end as a clean stop; one that gave up says so
    /// first.
    #[test]
    #[allow(clippy::field_reassign_with_default)] // the reports are #[non_exhaustive]
    fn a_worker_that_abandoned_deliveries_ends_with_its_own_error() {
        let mut report = MonitorReport::default();
        assert!(finish(&report).is_ok());
        let mut worker = txinbox::WorkerReport::default();
        worker.abandoned = 2;
        report.worker = Some(worker.clone());
        report.workers = vec![worker.clone()];
        let e = finish(&report).unwrap_err();
        assert!(
            matches!(e.downcast_ref::<Abandoned>(), Some(Abandoned(2))),
            "{e}"
        );
        assert_eq!(exit_status(e), EXIT_ABANDONED);
        worker.gave_up = Some("no queue".into());
        report.worker = Some(worker.clone());
        report.workers = vec![worker];
        let e = finish(&report).unwrap_err();
        assert!(e.downcast_ref::<GaveUp>().is_some(), "{e}");
    }

    /// A part beside the worker that panicked or was abandoned makes the process fail with the monitor's
    /// status, though the worker itself stopped cleanly.
    #[test]
    #[allow(clippy::field_reassign_with_default)] // the reports are #[non_exhaustive]
    fn a_part_that_panicked_or_was_abandoned_ends_with_the_monitors_status() {
        let mut report = MonitorReport::default();
        report.worker = Some(txinbox::WorkerReport::default());
        report.panicked_parts = vec!["effects".into()];
        let e = finish(&report).unwrap_err();
        assert!(e.to_string().contains("panicked: effects"), "{e}");
        assert_eq!(exit_status(e), EXIT_PANICKED);
        assert_eq!(
            report.exit_code(),
            std::process::ExitCode::from(EXIT_PANICKED),
            "the example agrees with the monitor"
        );

        report.panicked_parts.clear();
        report.abandoned_parts = vec!["maintenance".into()];
        let e = finish(&report).unwrap_err();
        assert!(e.to_string().contains("maintenance"), "{e}");
        assert_eq!(exit_status(e), EXIT_ABANDONED);
        assert_eq!(
            report.exit_code(),
            std::process::ExitCode::from(EXIT_ABANDONED),
            "the example agrees with the monitor"
        );
    }

    /// The status `exit` gives an error, read back through a process's exit code.
    fn exit_status(e: Error) -> u8 {
        let code = exit("test", Err(e));
        [
            0u8,
            EXIT_CANNOT_START,
            EXIT_GAVE_UP,
            EXIT_ABANDONED,
            EXIT_PANICKED,
        ]
        .into_iter()
        .find(|c| std::process::ExitCode::from(*c) == code)
        .expect("a known exit status")
    }
}
