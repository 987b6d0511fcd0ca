//! The CRM follow-up agent as an SQS FIFO worker: each `meeting.ended` event creates one follow-up task,
//! once, whatever SQS redelivers. The inbox marker and the task commit in one transaction; the message is
//! deleted only after COMMIT.
//!
//! ```text
//! sqs-crm-worker [--config worker.toml] [--print-config]
//!                [--queue-url URL] [--dlq-url URL] [--store sqlite:crm.db | --store postgres://...]
//!                [--consumer crm-followup] [--concurrency 8] [--visibility-timeout 60]
//!                [--metrics-addr 127.0.0.1:9464] [--health-addr 127.0.0.1:8080] [--purge-interval-secs 60]
//!                [--crm-url URL]
//! ```
//!
//! Settings come from the file `txinbox check-infra --config` checks (`[worker]`, `[store]`, `[inbox]`,
//! `[sqs]`), then the `TXINBOX_<SECTION>__<KEY>` environment overrides, then these flags: the last one wins.
//! `--print-config` prints the values the worker would run with and exits. AWS credentials and region come from
//! the standard AWS chain; `AWS_ENDPOINT_URL_SQS` points it at moto. SIGTERM or Ctrl-C stops receiving, lets
//! in-flight messages finish (commit, then delete) and exits.

use std::path::PathBuf;

use clap::Parser;
use txinbox::settings::WorkerSettings;
use txinbox::Receiver as _;
use txinbox_sqs::{SqsOptions, SqsReceiver};

#[derive(Debug, Parser)]
#[command(about = "CRM follow-up worker on SQS FIFO with the txinbox inbox")]
struct Args {
    /// The settings file (the one `txinbox check-infra --config` reads). Without it: the defaults and the
    /// `TXINBOX_<SECTION>__<KEY>` environment overrides.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the values the worker would run with (`key=value`) and exit without connecting.
    #[arg(long)]
    print_config: bool,
    /// The SQS queue URL (`[sqs] queue_url`).
    #[arg(long)]
    queue_url: Option<String>,
    /// The dead-letter queue URL (`[sqs] dead_letter_queue_url`; default: the queue's RedrivePolicy target).
    #[arg(long)]
    dlq_url: Option<String>,
    /// The store: `sqlite:crm.db` or `postgres://user@host/db` (`[store] url`).
    #[arg(long)]
    store: Option<String>,
    /// The consumer name, part of every inbox key (`[worker] consumer`).
    #[arg(long)]
    consumer: Option<String>,
    /// Messages processed at once (`[worker] concurrency`).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Visibility timeout in seconds, renewed every third of it (`[sqs] visibility_timeout_seconds`).
    #[arg(long)]
    visibility_timeout: Option<u64>,
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
    /// Accept a queue with no dead-letter path (no RedrivePolicy and no `--dlq-url`): a payload collision or
    /// a permanent error then comes back once per visibility timeout, forever. Refused at start otherwise.
    #[arg(long)]
    allow_no_dead_letter: bool,
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
        set(&mut s.sqs.queue_url, &self.queue_url);
        set(&mut s.sqs.dead_letter_queue_url, &self.dlq_url);
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
        if let Some(v) = self.visibility_timeout {
            s.sqs.visibility_timeout_seconds = v;
            s.sqs.heartbeat_interval_seconds = None;
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
            eprintln!("sqs-crm-worker: {line}");
            std::process::ExitCode::from(CANNOT_START)
        }
    }
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
    let mut agent = crm_followup::AgentOptions::from_settings(&settings, args.crm_url.clone());
    if let Some(secs) = args.give_up_after_secs {
        agent.worker = agent
            .worker
            .give_up_after((secs > 0).then(|| std::time::Duration::from_secs(secs)));
    }
    if args.print_config {
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
    println!("{report}");
    match report.gave_up {
        Some(why) => Err(format!("gave up: {why}").into()),
        None => Ok(()),
    }
}
