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

use clap::Parser;
use txinbox::broker::Receiver as _;
use txinbox::settings::WorkerSettings;
use txinbox_servicebus::{ServiceBusConfig, ServiceBusOptions, ServiceBusReceiver};

#[derive(Debug, Parser)]
#[command(about = "CRM follow-up worker on Azure Service Bus with the txinbox inbox")]
struct Args {
    #[command(flatten)]
    common: crm_followup::CommonArgs,
    /// The queue path (`[servicebus] queue`; default `crm-events`).
    #[arg(long)]
    queue: Option<String>,
    /// Forward payload collisions and permanent errors to this queue (`[servicebus] dead_letter_to`; else:
    /// abandon until MaxDeliveryCount, and the broker moves the message to `{queue}/$DeadLetterQueue`).
    #[arg(long)]
    dead_letter_to: Option<String>,
    /// The queue's LockDuration in seconds, renewed every third of it (`[servicebus] lock_duration_seconds`).
    #[arg(long)]
    lock_duration_secs: Option<u64>,
}

impl Args {
    /// The settings: file, then environment, then the flags.
    fn settings(&self) -> Result<WorkerSettings, crm_followup::Error> {
        let mut s = self.common.settings()?;
        crm_followup::set(&mut s.servicebus.queue, &self.queue);
        crm_followup::set(&mut s.servicebus.dead_letter_to, &self.dead_letter_to);
        if let Some(v) = self.lock_duration_secs {
            s.servicebus.lock_duration_seconds = v.max(1);
            s.servicebus.lock_renewal_interval_seconds = None;
        }
        Ok(s)
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    crm_followup::init_logging();
    crm_followup::exit("servicebus-crm-worker", run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), crm_followup::Error> {
    let settings = args.settings()?;
    let queue = settings
        .servicebus
        .queue
        .clone()
        .unwrap_or_else(|| "crm-events".into());
    // A receive locks as many messages as the worker asks for (`[worker] receive_max`).
    let opts = ServiceBusOptions::from_settings(&settings.servicebus)
        .batch_size(settings.worker_options().get_batch_size());
    opts.validate()?;
    let agent = crm_followup::AgentOptions::from_settings(&settings, args.common.crm_url.clone());
    if args.common.print_config {
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
        (None, None, Some(ns)) => ServiceBusConfig::default_azure_credential(ns.clone())?,
        _ => ServiceBusConfig::from_env()?,
    };
    let client = config.connect()?;
    let mut receiver = ServiceBusReceiver::new(&client, &queue, opts)?;
    // The key and the queue must be usable before the first receive (a locked message is kept for it).
    receiver.check().await?;
    tracing::info!(namespace = client.namespace(), queue = %queue, "worker starting");
    let report = crm_followup::run(receiver, agent).await?;
    crm_followup::finish(&report)
}
