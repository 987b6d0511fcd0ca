//! The CRM follow-up agent as an Azure Service Bus worker: each `meeting.ended` event creates one follow-up
//! task, once, whatever Service Bus redelivers. The inbox marker and the task commit in one transaction; the
//! message is completed only after COMMIT; its lock is renewed while the handler runs.
//!
//! ```text
//! servicebus-crm-worker [--config worker.toml] [--print-config]
//!                       [--queue crm-events] [--dead-letter-to crm-events-poison]
//!                       [--store sqlite:crm.db | --store postgres://...] [--consumer crm-followup]
//!                       [--concurrency 8] [--lock-duration-secs 60] [--metrics-addr 127.0.0.1:9464]
//!                       [--health-addr 127.0.0.1:8080] [--purge-interval-secs 60] [--crm-url URL]
//! ```
//!
//! Settings come from the file `txinbox check-infra --config` checks (`[worker]`, `[store]`, `[inbox]`,
//! `[servicebus]`), then the `TXINBOX_<SECTION>__<KEY>` environment overrides, then these flags: the last one
//! wins. `--print-config` prints the values the worker would run with and exits.
//!
//! Connection (never printed): `SERVICEBUS_CONNECTION_STRING` (SAS), or `SERVICEBUS_NAMESPACE` (else
//! `[servicebus] namespace`) for Azure AD (managed identity, workload identity, `az login`);
//! `SERVICEBUS_ENDPOINT` points it at the emulator. SIGTERM or Ctrl-C stops receiving, lets in-flight messages
//! finish (commit, then complete) and exits.

use std::path::PathBuf;

use clap::Parser;
use txinbox::settings::WorkerSettings;
use txinbox::Receiver as _;
use txinbox_servicebus::{ServiceBusConfig, ServiceBusOptions, ServiceBusReceiver};

#[derive(Debug, Parser)]
#[command(about = "CRM follow-up worker on Azure Service Bus with the txinbox inbox")]
struct Args {
    /// The settings file (the one `txinbox check-infra --config` reads). Without it: the defaults and the
    /// `TXINBOX_<SECTION>__<KEY>` environment overrides.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the values the worker would run with (`key=value`) and exit without connecting.
    #[arg(long)]
    print_config: bool,
    /// The queue path (`[servicebus] queue`; default `crm-events`).
    #[arg(long)]
    queue: Option<String>,
    /// Forward payload collisions and permanent errors to this queue (`[servicebus] dead_letter_to`; else:
    /// abandon until MaxDeliveryCount, and the broker moves the message to `{queue}/$DeadLetterQueue`).
    #[arg(long)]
    dead_letter_to: Option<String>,
    /// The store: `sqlite:crm.db` or `postgres://user@host/db` (`[store] url`).
    #[arg(long)]
    store: Option<String>,
    /// The consumer name, part of every inbox key (`[worker] consumer`).
    #[arg(long)]
    consumer: Option<String>,
    /// Messages processed at once (`[worker] concurrency`).
    #[arg(long)]
    concurrency: Option<usize>,
    /// The queue's LockDuration in seconds, renewed every third of it (`[servicebus] lock_duration_seconds`).
    #[arg(long)]
    lock_duration_secs: Option<u64>,
    /// Serve Prometheus metrics (`GET /metrics`) here, e.g. `127.0.0.1:9464` (`[worker] metrics_addr`).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Serve `GET /livez` and `GET /readyz` here, e.g. `127.0.0.1:8080` (`[worker] health_addr`).
    #[arg(long)]
    health_addr: Option<String>,
    /// Run the maintenance every this many seconds beside the worker (`[worker] purge_interval_seconds`).
    #[arg(long)]
    purge_interval_secs: Option<u64>,
    /// The external CRM's base URL (e.g. `txinbox-crm-api`'s): each follow-up task is also created there,
    /// through an effect with its idempotency key, run beside the worker.
    #[arg(long, env = "TXINBOX_CRM_URL")]
    crm_url: Option<String>,
    /// Stop when receives keep failing this many seconds with an error a retry cannot fix (a key rotated, a
    /// permission removed, the queue deleted), so that the supervisor sees it (0: never; default 300).
    #[arg(long, env = "TXINBOX_GIVE_UP_AFTER_SECS")]
    give_up_after_secs: Option<u64>,
}

impl Args {
    /// The settings: file, then environment, then these flags.
    fn settings(&self) -> Result<WorkerSettings, crm_followup::Error> {
        let mut s = match &self.config {
            Some(path) => WorkerSettings::load(path)?,
            None => WorkerSettings::from_env()?,
        };
        let set = |to: &mut Option<String>, from: &Option<String>| {
            if from.is_some() {
                to.clone_from(from);
            }
        };
        set(&mut s.servicebus.queue, &self.queue);
        set(&mut s.servicebus.dead_letter_to, &self.dead_letter_to);
        set(&mut s.worker.metrics_addr, &self.metrics_addr);
        set(&mut s.worker.health_addr, &self.health_addr);
        if let Some(v) = &self.store {
            s.store.url.clone_from(v);
        }
        if let Some(v) = &self.consumer {
            s.worker.consumer.clone_from(v);
        }
        if let Some(v) = self.concurrency {
            s.worker.concurrency = v.max(1);
        }
        if let Some(v) = self.lock_duration_secs {
            s.servicebus.lock_duration_seconds = v.max(1);
            s.servicebus.lock_renewal_interval_seconds = None;
        }
        if self.purge_interval_secs.is_some() {
            s.worker.purge_interval_seconds = self.purge_interval_secs;
        }
        Ok(s)
    }
}

/// Exit code of a worker that could not start (bad settings, a queue or database it cannot use).
const CANNOT_START: u8 = 2;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line naming what is wrong (the errors never carry a secret).
            let line = e
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            eprintln!("servicebus-crm-worker: {line}");
            std::process::ExitCode::from(CANNOT_START)
        }
    }
}

async fn run(args: Args) -> Result<(), crm_followup::Error> {
    let settings = args.settings()?;
    let queue = settings
        .servicebus
        .queue
        .clone()
        .unwrap_or_else(|| "crm-events".into());
    let opts = ServiceBusOptions::from_settings(&settings.servicebus);
    opts.validate()?;
    let mut agent = crm_followup::AgentOptions::from_settings(&settings, args.crm_url.clone());
    if let Some(secs) = args.give_up_after_secs {
        agent.worker = agent
            .worker
            .give_up_after((secs > 0).then(|| std::time::Duration::from_secs(secs)));
    }
    if args.print_config {
        let dead_letter = match &opts.dead_letter {
            txinbox_servicebus::DeadLetterStrategy::Forward { destination } => destination.clone(),
            _ => String::new(),
        };
        print!(
            "queue={queue}\ndead_letter_to={dead_letter}\nlock_duration_seconds={}\nrenew_every_seconds={}\n{}",
            opts.lock_duration.as_secs(),
            txinbox::lease::renewal_interval(opts.lock_duration).as_secs_f64(),
            agent.describe(),
        );
        return Ok(());
    }
    if let Some(addr) = settings.metrics_addr() {
        crm_followup::serve_metrics(addr)?;
    }
    let config = match (
        std::env::var_os("SERVICEBUS_CONNECTION_STRING"),
        std::env::var_os("SERVICEBUS_NAMESPACE"),
        &settings.servicebus.namespace,
    ) {
        // `[servicebus] namespace` takes the Terraform output `namespace_fqdn` or the bare name.
        (None, None, Some(ns)) => ServiceBusConfig::default_azure_credential(
            ns.trim_end_matches(".servicebus.windows.net").to_owned(),
        )?,
        _ => ServiceBusConfig::from_env()?,
    };
    let client = config.connect()?;
    let mut receiver = ServiceBusReceiver::new(&client, &queue, opts)?;
    // The key and the queue must be usable before the first receive (a locked message is kept for it).
    receiver.check().await?;
    tracing::info!(namespace = client.namespace(), queue = %queue, "worker starting");
    let report = crm_followup::run(receiver, agent).await?;
    println!("{report}");
    match report.gave_up {
        Some(why) => Err(format!("gave up: {why}").into()),
        None => Ok(()),
    }
}
