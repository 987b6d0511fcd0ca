//! The CRM follow-up agent as an SQS FIFO worker: each `meeting.ended` event creates one follow-up task,
//! once, whatever SQS redelivers. The inbox marker and the task commit in one transaction; the message is
//! deleted only after COMMIT.
//!
//! ```text
//! sqs-crm-worker [--config worker.toml] [--print-config]
//!                [--queue-url URL] [--dlq-url URL] [--store sqlite:crm.db | postgres://... | dynamodb://TABLE]
//!                [--consumer crm-followup] [--concurrency 8] [--visibility-timeout 60]
//!                [--metrics-addr 127.0.0.1:9464] [--health-addr 127.0.0.1:8080] [--purge-interval-secs 60]
//!                [--crm-url URL]
//! ```
//!
//! Settings come from the file `txinbox check-infra --config` checks (`[worker]`, `[store]`, `[inbox]`,
//! `[sqs]`), then the `TXINBOX_<SECTION>__<KEY>` environment overrides, then these flags: the last one wins.
//! `--print-config` prints the values the worker would run with and exits. AWS credentials and region come from
//! the standard AWS chain; `AWS_ENDPOINT_URL_SQS` points it at moto, and `AWS_ENDPOINT_URL_DYNAMODB` a
//! `dynamodb://TABLE` store at DynamoDB Local. SIGTERM or Ctrl-C stops receiving, lets in-flight messages
//! finish (commit, then delete) and exits.

use clap::Parser;
use txinbox::broker::Receiver as _;
use txinbox::settings::WorkerSettings;
use txinbox_sqs::{SqsOptions, SqsReceiver};

#[derive(Debug, Parser)]
#[command(about = "CRM follow-up worker on SQS FIFO with the txinbox inbox")]
struct Args {
    #[command(flatten)]
    common: crm_followup::CommonArgs,
    /// The SQS queue URL (`[sqs] queue_url`).
    #[arg(long)]
    queue_url: Option<String>,
    /// The dead-letter queue URL (`[sqs] dead_letter_queue_url`; default: the queue's RedrivePolicy target).
    #[arg(long)]
    dlq_url: Option<String>,
    /// Visibility timeout in seconds, renewed every third of it (`[sqs] visibility_timeout_seconds`).
    #[arg(long)]
    visibility_timeout: Option<u64>,
    /// Accept a queue with no dead-letter path (no RedrivePolicy and no `--dlq-url`): a payload collision or
    /// a permanent error then comes back once per visibility timeout, forever. Refused at start otherwise.
    #[arg(long)]
    allow_no_dead_letter: bool,
}

impl Args {
    /// The settings: file, then environment, then the flags.
    fn settings(&self) -> Result<WorkerSettings, crm_followup::Error> {
        let mut s = self.common.settings()?;
        crm_followup::set(&mut s.sqs.queue_url, &self.queue_url);
        crm_followup::set(&mut s.sqs.dead_letter_queue_url, &self.dlq_url);
        if let Some(v) = self.visibility_timeout {
            s.sqs.visibility_timeout_seconds = v;
            s.sqs.heartbeat_interval_seconds = None;
        }
        Ok(s)
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    crm_followup::init_logging();
    crm_followup::exit("sqs-crm-worker", run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), crm_followup::Error> {
    let settings = args.settings()?;
    let queue_url = settings
        .sqs
        .queue_url
        .clone()
        .ok_or("no queue: set [sqs] queue_url, TXINBOX_SQS__QUEUE_URL or --queue-url")?;
    let sqs =
        SqsOptions::from_settings(&settings.sqs).allow_no_dead_letter(args.allow_no_dead_letter);
    sqs.validate()?;
    let agent = crm_followup::AgentOptions::from_settings(&settings, args.common.crm_url.clone());
    if args.common.print_config {
        print!(
            "queue_url={queue_url}\ndead_letter_queue_url={}\nvisibility_timeout_seconds={}\nrenew_every_seconds={}\nbatch_size={}\nwait_time_seconds={}\ndeduplication_id_identity={}\n{}",
            sqs.dead_letter_queue.as_deref().unwrap_or(""),
            sqs.visibility_timeout.as_secs(),
            txinbox::lease::renewal_interval(sqs.visibility_timeout).as_secs_f64(),
            sqs.batch_size,
            sqs.wait.as_secs(),
            sqs.deduplication_id_identity,
            agent.describe(),
        );
        return Ok(());
    }
    if let Some(addr) = settings.metrics_addr() {
        crm_followup::serve_metrics(addr)?;
    }
    let client = txinbox_sqs::client_from_env().await;
    let mut receiver = SqsReceiver::connect(client, &queue_url, sqs)
        .await
        .map_err(|e| format!("cannot use queue {queue_url}: {e}"))?;
    // The queue, its dead-letter path and the database must be usable before the first receive.
    receiver.check().await?;
    let report = crm_followup::run(receiver, agent).await?;
    crm_followup::finish(&report)
}
