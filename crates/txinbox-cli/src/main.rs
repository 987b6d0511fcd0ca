//! `txinbox`: the lab, the failure windows and operator tools.

// Standard output goes through `out` (a closed pipe ends the command quietly), never `println!`.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use redrive::{ServiceBusProgress, SqsProgress};
use txinbox_lab::lab::{run_lab_on, Target};
use txinbox_lab::windows;

use out::{out, outln};

mod effects;
mod inbox;
mod out;
mod partition;
mod purge;
mod redrive;
mod targets;
#[cfg(test)]
mod testing;

#[derive(Parser)]
#[command(
    name = "txinbox",
    version,
    about = "Transactional inbox for SQS and Service Bus consumers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The inbox lab: N logical messages delivered K times each through the in-memory broker into the inbox.
    Lab {
        /// Logical messages (1 to 100000, and at most 100000 deliveries with `--copies`: every delivery is
        /// queued in memory before the run and applied in a transaction of its own, so 100000 already take a
        /// minute or more; the lab shows duplicates dropped with far fewer).
        /// Not with `--windows`, whose windows choose their own messages.
        #[arg(long, default_value_t = 2, value_parser = lab_count, conflicts_with = "windows")]
        messages: usize,
        /// Copies delivered of each message (1 to 100000; see `--messages` for the bound on both). Not with
        /// `--windows`.
        #[arg(long, default_value_t = 2, value_parser = lab_count, conflicts_with = "windows")]
        copies: usize,
        /// Store URL: `sqlite::memory:` (default), `sqlite:path.db`, `postgres://...` (a fresh schema per run)
        /// or `dynamodb://TABLE` (a fresh table `TABLE-lab-...` per run, deleted after it;
        /// `AWS_ENDPOINT_URL_DYNAMODB` for an emulator). Only this flag names one: TXINBOX_STORE_URL, the
        /// workers' store for the operator commands, is not read (the lab would create schemas or tables
        /// there).
        #[arg(long, default_value = "sqlite::memory:")]
        store: String,
        /// Run the failure windows of the pattern instead, one row each; exits non-zero if any fails.
        #[arg(long)]
        windows: bool,
        /// With `--windows`: the failure windows of batch mode too, with batches of N deliveries applied in one
        /// transaction (2 to 64).
        #[arg(long, requires = "windows")]
        batch: Option<usize>,
        /// On PostgreSQL: convert each fresh schema to the partitioned layout first (retention by dropping
        /// whole partitions); with `--windows`, its own window (a copy after its first copy's partition
        /// boundary) runs too.
        #[arg(long)]
        partitioned: bool,
    },
    /// Amazon SQS operator tools.
    Sqs {
        #[command(subcommand)]
        command: SqsCommand,
    },
    /// Azure Service Bus operator tools.
    Servicebus {
        #[command(subcommand)]
        command: ServiceBusCommand,
    },
    /// External effects: run them (an operator's pass, or a runner process of its own) and count them by
    /// state.
    Effects {
        #[command(subcommand)]
        command: EffectsCommand,
    },
    /// The inbox for an operator (read-only): per-consumer statistics, one message's story, the rejections.
    Inbox {
        #[command(subcommand)]
        command: inbox::InboxCommand,
    },
    /// Print the inbox's schema as one SQL script for your own migration tool (then open the store with
    /// `Migrations::Verify`).
    Schema {
        /// `postgres` or `sqlite`.
        #[arg(long, value_parser = ["postgres", "sqlite"])]
        backend: String,
    },
    /// Check Terraform for settings that break the inbox's guarantees (DLQ, deduplication, visibility, lock,
    /// retention path, the worker's IAM actions and roles). Exits 1 on a violation, 2 on an error.
    CheckInfra {
        /// The Terraform folder (its *.tf files and local modules), or a plan in JSON (`terraform show -json
        /// tfplan > plan.json`), which also covers registry modules.
        dir: std::path::PathBuf,
        /// Worker settings (TOML: [inbox], [sqs], [servicebus]); defaults are the adapters' defaults.
        #[arg(long)]
        config: Option<std::path::PathBuf>,
        /// A variables file, as `terraform plan -var-file` (repeatable; after terraform.tfvars and
        /// *.auto.tfvars, later files win).
        #[arg(long = "var-file")]
        var_file: Vec<std::path::PathBuf>,
    },
}

#[derive(Subcommand)]
enum EffectsCommand {
    /// Claim due effects and run them through HTTP destinations, reconciling uncertain ones first; until
    /// SIGTERM, or once with `--once`. Prints `EffectReport ...` at the end.
    Run(Box<effects::RunArgs>),
    /// Undo one done effect (an operator's compensation) through its destination, and mark it compensated.
    Compensate(effects::CompensateArgs),
    /// Every effect with one idempotency key, oldest first: its id, destination, state, creation, message and
    /// the destination's reference (several on the partitioned PostgreSQL layout after a re-send in another
    /// bucket of event time). Exits 1 when no effect has the key.
    Show(effects::ShowArgs),
    /// Effects by consumer, destination and state, with the oldest of each. On DynamoDB it reads the 8 effect
    /// shards of the `by_consumer` index: every effect item of the table.
    Stats {
        /// The store, or the settings file (each shard of `[store.shards]` in turn).
        #[command(flatten)]
        store: targets::StoreArgs,
    },
}

#[derive(Subcommand)]
enum SqsCommand {
    /// Move messages from a dead-letter queue back to a queue with their identity intact (CloudEvents
    /// attributes, FIFO group and deduplication ids), deleting each from the DLQ only after its send
    /// succeeded. `--from` must be a dead-letter queue: one that some queue's RedrivePolicy names (asked with
    /// ListDeadLetterSourceQueues: IAM `sqs:ListDeadLetterSourceQueues` on it), unless `--from-any-queue`.
    /// Credentials and endpoint come from the standard AWS chain (AWS_ENDPOINT_URL_SQS for an emulator).
    /// Exits 3 when messages whose identity was lost were left in the DLQ, 2 on an error.
    Redrive {
        /// The dead-letter queue URL. A queue that no queue's RedrivePolicy names as its dead-letter queue is
        /// refused (a mistyped URL naming a live queue would drain it into `--to`), unless `--from-any-queue`.
        #[arg(long)]
        from: String,
        /// The queue URL to move the messages to.
        #[arg(long)]
        to: String,
        /// Move at most this many messages.
        #[arg(long)]
        max: Option<usize>,
        /// Move from `--from` though no queue names it as its dead-letter queue (a queue used as one by hand,
        /// a dead-letter queue whose source queues were deleted), and without asking ListDeadLetterSourceQueues.
        #[arg(long)]
        from_any_queue: bool,
    },
}

#[derive(Subcommand)]
enum ServiceBusCommand {
    /// Resubmit dead-lettered messages to a queue with their MessageId and properties intact, completing each
    /// in the source only after its send succeeded. `--from` must be a dead-letter subqueue or the queue's
    /// poison queue, unless `--from-any-queue`. The namespace comes from SERVICEBUS_CONNECTION_STRING (SAS) or SERVICEBUS_NAMESPACE
    /// (Azure AD), plus SERVICEBUS_ENDPOINT for an emulator. Exits 3 when a message was sent but could not be
    /// completed in the source (it is in both: run it again), 2 on an error.
    Redrive {
        /// The target queue; the source defaults to its `$DeadLetterQueue`.
        #[arg(long)]
        queue: String,
        /// Another source: a dead-letter subqueue, `<queue>/$DeadLetterQueue` or
        /// `<topic>/Subscriptions/<subscription>/$DeadLetterQueue` (any case; Microsoft: "You can access the
        /// dead-letter queue by using the following syntax: <queue path>/$deadletterqueue <topic
        /// path>/Subscriptions/<subscription path>/$deadletterqueue"), or the poison queue the worker forwards
        /// dead letters to (`[servicebus] dead_letter_to` of `--config`, else `<queue>-poison`). Any other path is
        /// refused (a mistyped name of a live queue would drain it into `--queue`), unless `--from-any-queue`.
        #[arg(long)]
        from: Option<String>,
        /// Move from a `--from` that is neither a dead-letter subqueue nor the queue's poison queue (a queue used
        /// as one by hand, another queue's poison queue).
        #[arg(long)]
        from_any_queue: bool,
        /// Move at most this many messages.
        #[arg(long)]
        max: Option<usize>,
        /// The target's duplicate-detection window in seconds (`az servicebus queue show ... --query
        /// duplicateDetectionHistoryTimeWindow`; 0 when the target has no duplicate detection): messages still
        /// inside it are deferred, because the broker would accept and drop them silently, and the dead letter
        /// would then be completed. Required unless `--config` gives it.
        #[arg(long)]
        dedup_window_secs: Option<u64>,
        /// The workers' settings file: its `[servicebus] duplicate_detection_window_seconds` (which check-infra
        /// holds to the Terraform) when `--dedup-window-secs` is not given; a file that does not set it is
        /// refused (its default, 600 s, is not known to be the target's).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
        /// How long to wait for more messages before stopping.
        #[arg(long, default_value_t = 2)]
        wait_secs: u64,
    },
}

fn servicebus(command: ServiceBusCommand) -> ExitCode {
    let rt = match runtime(Flavor::MultiThread) {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    match command {
        ServiceBusCommand::Redrive {
            queue,
            from,
            from_any_queue,
            max,
            dedup_window_secs,
            config,
            wait_secs,
        } => rt.block_on(async {
            let from = from.unwrap_or_else(|| txinbox_servicebus::dead_letter_queue_path(&queue));
            if redrive::same_servicebus_entity(&from, &queue) {
                return targets::fail(&format!(
                    "--from {from} is the target queue itself: each message sent back would be received again and moved for ever; give the dead-letter queue or the poison queue to move from"
                ));
            }
            let window = match redrive::servicebus_dedup_window(dedup_window_secs, config.as_deref())
            {
                Ok(w) => w,
                Err(e) => return targets::fail(&e),
            };
            if !from_any_queue {
                let checked = redrive::servicebus_poison_queue(&queue, config.as_deref()).and_then(
                    |poison| redrive::servicebus_source_is_a_dead_letter_queue(&from, &poison),
                );
                if let Err(refused) = checked {
                    return targets::fail(&refused);
                }
            }
            let client =
                match txinbox_servicebus::ServiceBusConfig::from_env().and_then(|c| c.connect()) {
                    Ok(c) => c,
                    Err(e) => return fail(&e),
                };
            let opts = txinbox_servicebus::RedriveOptions::default()
                .max(max)
                .wait(std::time::Duration::from_secs(wait_secs))
                .duplicate_detection_window(window);
            let mut progress = ServiceBusProgress::new(std::io::stderr(), &from, &queue);
            let result =
                txinbox_servicebus::redrive(&client, &from, &queue, &opts, &mut progress).await;
            match progress.finish(result) {
                Ok(r) => {
                    outln!(
                        "moved={} deferred={} complete_failed={}",
                        r.moved,
                        r.deferred,
                        r.settle_failed
                    );
                    redrive_exit(&r)
                }
                Err(e) => fail(&e),
            }
        }),
    }
}

fn sqs(command: SqsCommand) -> ExitCode {
    let rt = match runtime(Flavor::MultiThread) {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    match command {
        SqsCommand::Redrive {
            from,
            to,
            max,
            from_any_queue,
        } => rt.block_on(async {
            use std::io::IsTerminal;
            if redrive::same_sqs_queue(&from, &to) {
                return targets::fail(&format!(
                    "--from and --to name the same queue ({to}): each message sent back would be received again and moved for ever; --from is the dead-letter queue"
                ));
            }
            let client = txinbox_sqs::client_from_env().await;
            if !from_any_queue {
                if let Err(refused) = redrive::sqs_source_is_a_dead_letter_queue(&client, &from).await {
                    return targets::fail(&refused);
                }
            }
            let opts = txinbox_sqs::RedriveOptions::default().max(max);
            let mut progress =
                SqsProgress::new(std::io::stderr(), max, std::io::stderr().is_terminal());
            let result = txinbox_sqs::redrive(&client, &from, &to, &opts, &mut progress).await;
            match progress.finish(result) {
                Ok(r) => {
                    // Every count every time: a script finds each field on every run.
                    outln!(
                        "moved={} new_dedup_id={} deferred={} initially_visible={} identity_lost={}",
                        r.moved,
                        r.new_dedup_id,
                        r.deferred,
                        r.initially_visible.unwrap_or(0),
                        r.identity_lost
                    );
                    redrive_exit(&r)
                }
                Err(e) => fail(&e),
            }
        }),
    }
}

/// The exit status of a redrive that ran to its end: 3, with a line on stderr for each thing left for an
/// operator (the command did not do all it was asked), else 0.
fn redrive_exit(report: &txinbox_core::broker::redrive::RedriveReport) -> ExitCode {
    for left in redrive::left_for_an_operator(report) {
        crate::out::errln!("warning: {left}");
    }
    ExitCode::from(redrive::exit_status(report))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TXINBOX_LOG")
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Lab {
            messages,
            copies,
            store,
            windows,
            batch,
            partitioned,
        } => {
            // Before anything is opened (each count's own bound is its value parser's).
            let deliveries = messages.saturating_mul(copies);
            if deliveries > MAX_LAB_DELIVERIES {
                return targets::fail(&format!(
                    "--messages {messages} with --copies {copies} make {deliveries} deliveries, more than the {MAX_LAB_DELIVERIES} one lab run makes at most"
                ));
            }
            let target = match Target::parse(&store) {
                Ok(t) if partitioned => match t.partitioned() {
                    Ok(t) => t,
                    Err(e) => return fail(&e),
                },
                Ok(t) => t,
                Err(e) => return fail(&e),
            };
            // Current-thread runtime: the windows capture metrics with a thread-local recorder.
            let rt = match runtime(Flavor::CurrentThread) {
                Ok(rt) => rt,
                Err(e) => return fail(&e),
            };
            if windows {
                let run = async {
                    match batch {
                        Some(n) => windows::run_all_batch(&target, n).await,
                        None => windows::run_all(&target).await,
                    }
                };
                match rt.block_on(run) {
                    Ok(rows) => {
                        let mut ok = true;
                        for r in &rows {
                            outln!("{r}");
                            ok &= r.ok();
                        }
                        if ok {
                            ExitCode::SUCCESS
                        } else {
                            ExitCode::FAILURE
                        }
                    }
                    Err(e) => fail(&e),
                }
            } else {
                let r = rt.block_on(run_lab_on(&target, messages, copies));
                match r {
                    Ok(report) => {
                        outln!("{report}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(&e),
                }
            }
        }
        Command::Sqs { command } => sqs(command),
        Command::Servicebus { command } => servicebus(command),
        Command::CheckInfra {
            dir,
            config,
            var_file,
        } => check_infra(&dir, config.as_deref(), var_file),
        Command::Inbox { command } => inbox::run(command),
        Command::Effects { command } => {
            let rt = match runtime(Flavor::MultiThread) {
                Ok(rt) => rt,
                Err(e) => return fail(&e),
            };
            let targets = match &command {
                EffectsCommand::Run(a) => {
                    match a.store_url().and_then(|u| a.effects().map(|_| u)) {
                        Ok(url) => vec![targets::StoreTarget { shard: None, url }],
                        Err(e) => return targets::fail(&e),
                    }
                }
                EffectsCommand::Compensate(a) => match a.store_url() {
                    Ok(url) => vec![targets::StoreTarget { shard: None, url }],
                    Err(e) => return targets::fail(&e),
                },
                EffectsCommand::Show(a) => vec![targets::StoreTarget {
                    shard: None,
                    url: a.store.clone(),
                }],
                EffectsCommand::Stats { store } => match store.targets() {
                    Ok(t) => t,
                    Err(e) => return targets::fail(&e),
                },
            };
            // A shard that cannot be read is named on stderr; the others still are.
            let (failed, found) = rt.block_on(async {
                let (mut failed, mut found) = (false, false);
                for t in &targets {
                    if let Some(shard) = &t.shard {
                        outln!("shard {shard}:");
                    }
                    match effects_on(&t.url, &command).await {
                        Ok(f) => found |= f,
                        Err(e) => {
                            targets::target_failed(t, &e);
                            failed = true;
                        }
                    }
                }
                (failed, found)
            });
            if failed {
                ExitCode::from(2)
            } else if !found {
                // `effects show` of a key no effect has: nothing found, as `inbox show`.
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Schema { backend } => {
            if backend == "postgres" {
                out!(
                    "{}",
                    txinbox_store::Store::<sqlx::Postgres>::migration_sql()
                );
            } else {
                out!("{}", txinbox_store::Store::<sqlx::Sqlite>::migration_sql());
            }
            ExitCode::SUCCESS
        }
    }
}

/// Opens the store at `url` and runs one `txinbox effects` command on it; `Ok(false)` when it found nothing
/// (`show`). The store is opened as it is, as `inbox purge` opens it: never created nor migrated, and refused
/// without the inbox's schema (a mistyped URL would otherwise get a fresh, empty store, and the command would
/// answer as if on it with exit code 0).
async fn effects_on(url: &str, command: &EffectsCommand) -> Result<bool, String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = inbox::postgres_as_is(url, "txinbox-effects", 8).await?;
        effects_command(store, command, true).await
    } else if url.starts_with("sqlite:") {
        let store = inbox::sqlite_as_is(url, 8).await?;
        effects_command(store, command, true).await
    } else if url.starts_with("dynamodb://") {
        // The standard AWS chain (`AWS_ENDPOINT_URL_DYNAMODB` for an emulator); the table is checked.
        let store = txinbox_dynamodb::DynamoStore::connect(url)
            .await
            .map_err(|e| format!("store (dynamodb): {e}"))?;
        // Counting the effects would read every effect item of the table: not after each `run --once`.
        effects_command(store, command, false).await
    } else {
        Err(format!(
            "unsupported store URL scheme {} (expected sqlite:, postgres:// or dynamodb://)",
            crate::inbox::shown_scheme(url)
        ))
    }
}

/// Runs one `txinbox effects` command on an open store; `Ok(false)` when it found nothing (`show`).
/// `cheap_counts`: the store counts its effects by state in one query (see [`effects::run`]).
async fn effects_command<S: txinbox_core::effects::EffectStore>(
    store: S,
    command: &EffectsCommand,
    cheap_counts: bool,
) -> Result<bool, String> {
    match command {
        EffectsCommand::Run(a) => effects::run(store, a, cheap_counts).await.map(|()| true),
        EffectsCommand::Compensate(a) => effects::compensate(store, a).await.map(|()| true),
        EffectsCommand::Show(a) => effects::show(store, a).await,
        EffectsCommand::Stats { .. } => effects::stats(store).await.map(|()| true),
    }
}

/// The most deliveries (`--messages` × `--copies`) one `txinbox lab` run makes. Every delivery is queued in
/// the in-memory broker before the run starts and applied in a transaction of its own: 100,000 deliveries took
/// about 150 MB and 80 s on SQLite in memory (a debug build), plenty for a lab, where an unbounded count would
/// allocate without limit or run for hours.
const MAX_LAB_DELIVERIES: usize = 100_000;

/// A `--messages` or `--copies` count: 1 to [`MAX_LAB_DELIVERIES`].
fn lab_count(s: &str) -> Result<usize, String> {
    let bound = || format!("must be at least 1 and at most {MAX_LAB_DELIVERIES}");
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_LAB_DELIVERIES).contains(&n) => Ok(n),
        Ok(_) => Err(bound()),
        Err(e) => Err(format!("{e} ({})", bound())),
    }
}

/// Which Tokio runtime a command runs on.
enum Flavor {
    MultiThread,
    CurrentThread,
}

fn runtime(flavor: Flavor) -> std::io::Result<tokio::runtime::Runtime> {
    match flavor {
        Flavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    }
    .enable_all()
    .build()
}

fn check_infra(
    dir: &std::path::Path,
    config: Option<&std::path::Path>,
    var_files: Vec<std::path::PathBuf>,
) -> ExitCode {
    let input = var_files
        .into_iter()
        .fold(txinbox_infra::Input::detect(dir), |input, file| {
            input.var_file(file)
        });
    match txinbox_infra::run(&input, config, &mut out::Stdout::lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => fail(&e),
    }
}

/// Prints the error and its sources, its secrets masked and its control characters escaped (an error can quote
/// outside input: a Terraform file's line, a settings value), and exits 2.
fn fail(e: &dyn std::error::Error) -> ExitCode {
    let mut msg = format!("error: {}", crate::out::escaped(&e.to_string()));
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(&format!(
            "\n  caused by: {}",
            crate::out::escaped(&s.to_string())
        ));
        src = s.source();
    }
    crate::out::errln!("{}", targets::redact(&msg));
    ExitCode::from(2)
}
