//! The CRM follow-up agent on the broker its settings file names: `[sqs] queue_url` for SQS FIFO, or
//! `[servicebus] queue` for Azure Service Bus (exactly one). One binary, one worker: the receiver is chosen at
//! run time and held as a [`txinbox::broker::BoxReceiver`].
//!
//! ```text
//! crm-worker --config worker.toml [--print-config] [--store ...] [--consumer ...] [--concurrency N]
//!            [--metrics-addr ADDR] [--health-addr ADDR] [--purge-interval-secs N] [--crm-url URL]
//! ```
//!
//! Credentials come from where each example worker takes them: the AWS chain (`AWS_ENDPOINT_URL_SQS` for moto)
//! for SQS; `SERVICEBUS_CONNECTION_STRING`, or `SERVICEBUS_NAMESPACE` / `[servicebus] namespace` for Azure AD
//! (`SERVICEBUS_ENDPOINT` for the emulator), for Service Bus. A file that names both brokers, or neither, is
//! refused at start with one line.

use clap::Parser;
use txinbox::broker::{BoxReceiver, Receiver as _};
use txinbox::servicebus::{ServiceBusConfig, ServiceBusOptions, ServiceBusReceiver};
use txinbox::settings::WorkerSettings;
use txinbox::sqs::{SqsOptions, SqsReceiver};

#[derive(Debug, Parser)]
#[command(
    about = "CRM follow-up worker on SQS FIFO or Azure Service Bus, as its settings file says"
)]
struct Args {
    #[command(flatten)]
    common: crm_followup::CommonArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    crm_followup::init_logging();
    crm_followup::exit("crm-worker", run(Args::parse()).await)
}

/// The broker a settings file names.
enum Broker {
    Sqs(String),
    ServiceBus(String),
}

fn broker(s: &WorkerSettings) -> Result<Broker, crm_followup::Error> {
    match (&s.sqs.queue_url, &s.servicebus.queue) {
        (Some(url), None) => Ok(Broker::Sqs(url.clone())),
        (None, Some(queue)) => Ok(Broker::ServiceBus(queue.clone())),
        (Some(_), Some(_)) => Err(
            "both [sqs] queue_url and [servicebus] queue are set: one worker consumes one queue"
                .into(),
        ),
        (None, None) => Err(
            "no queue: set [sqs] queue_url (SQS FIFO) or [servicebus] queue (Azure Service Bus)"
                .into(),
        ),
    }
}

async fn run(args: Args) -> Result<(), crm_followup::Error> {
    let settings = args.common.settings()?;
    let broker = broker(&settings)?;
    let agent = crm_followup::AgentOptions::from_settings(&settings, args.common.crm_url.clone());
    if args.common.print_config {
        match &broker {
            Broker::Sqs(url) => println!("broker=sqs\nqueue_url={url}"),
            Broker::ServiceBus(queue) => println!("broker=servicebus\nqueue={queue}"),
        }
        print!("{}", agent.describe());
        return Ok(());
    }
    if let Some(addr) = settings.metrics_addr() {
        crm_followup::serve_metrics(addr)?;
    }
    let receiver = match broker {
        Broker::Sqs(url) => {
            let opts = SqsOptions::from_settings(&settings.sqs);
            opts.validate()?;
            let client = txinbox::sqs::client_from_env().await;
            let mut r = SqsReceiver::connect(client, &url, opts)
                .await
                .map_err(|e| format!("cannot use queue {url}: {e}"))?;
            r.check().await?;
            tracing::info!(queue_url = %url, "worker starting on SQS");
            BoxReceiver::new(r)
        }
        Broker::ServiceBus(queue) => {
            let opts = ServiceBusOptions::from_settings(&settings.servicebus)
                .batch_size(settings.worker_options().get_batch_size());
            opts.validate()?;
            let config = match (
                std::env::var_os("SERVICEBUS_CONNECTION_STRING"),
                std::env::var_os("SERVICEBUS_NAMESPACE"),
                &settings.servicebus.namespace,
            ) {
                (None, None, Some(ns)) => ServiceBusConfig::default_azure_credential(ns.clone())?,
                _ => ServiceBusConfig::from_env()?,
            };
            let client = config.connect()?;
            let mut r = ServiceBusReceiver::new(&client, &queue, opts)?;
            r.check().await?;
            tracing::info!(namespace = client.namespace(), queue = %queue, "worker starting on Service Bus");
            BoxReceiver::new(r)
        }
    };
    let report = crm_followup::run(receiver, agent).await?;
    crm_followup::finish(&report)
}
