//! `txinbox inbox`: an operator's read-only view of the inbox on the workers' store URL: per-consumer
//! statistics, one message's story, and the rejections. Human tables by default, one JSON document with
//! `--json`. Exit codes: 0 ok, 1 nothing found (`show`, `stats --consumer`), 2 usage or store error (one line
//! on stderr, naming only the URL's scheme).
//!
//! On a DynamoDB store (`dynamodb://TABLE`) every query goes through a key, never a scan: `stats` and
//! `rejections` need `--consumer` (no index lists consumers) and `show` needs `--source` (part of the marker's
//! key); see `txinbox_dynamodb::ops` for what each reads.
//!
//! To add a command: a variant of [`InboxCommand`] with its `clap::Args` struct, and its arm in
//! [`ReadCommand::run_on`] (read-only commands) or in [`run`] (a command that opens the store itself).

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use txinbox_core::store::ops::{ConsumerStats, MessageStory, RejectionFilter, RejectionRow};
use txinbox_dynamodb::DynamoStore;
use txinbox_store::{Backend, Migrations, Store};

mod print;

use crate::out::outln;

use print::{print_json, print_rejections, print_stats, print_story};

/// `txinbox inbox ...`: the operator's commands on the workers' store.
#[derive(Debug, clap::Subcommand)]
pub enum InboxCommand {
    /// The read-only commands.
    #[command(flatten)]
    Read(ReadCommand),
    /// One maintenance pass: expired markers, old evidence, done effects, in bounded batches with a pause
    /// between them and a time budget. Exit 0: nothing expired left; 3: the budget stopped it first.
    Purge(crate::purge::PurgeArgs),
    /// PostgreSQL: convert the inbox to the partitioned layout (retention drops whole partitions instead of
    /// deleting rows; one transaction, idempotent; refused on a URL without the inbox), or print the layout
    /// with `--status`.
    Partition(crate::partition::PartitionArgs),
}

/// The read-only `txinbox inbox` commands.
#[derive(Debug, clap::Subcommand)]
pub enum ReadCommand {
    /// Per consumer: inbox rows, oldest and newest processed_at, rows in the last hour, rejections by kind,
    /// effects by state and the effect lag (age of the oldest effect waiting to run). With `--consumer`, exits
    /// 1 when the store holds nothing of it (no marker, rejection or effect: a typo?).
    Stats(StatsArgs),
    /// One message's story: its marker, rejections and effects. Exits 1 when the store knows nothing of it.
    Show(ShowArgs),
    /// Rejections (payload collisions and business duplicates), newest first.
    Rejections(RejectionsArgs),
}

/// The store and output format every `txinbox inbox` command takes. The store is opened read-only (DynamoDB:
/// only reads are sent; AWS settings from the standard chain, `AWS_ENDPOINT_URL_DYNAMODB` for an emulator). With
/// `--config` on shards the command runs on each shard in turn, under a `shard NAME:` heading.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// The store: `--store URL`, or `--config FILE` [`--shard NAME`].
    #[command(flatten)]
    pub store: crate::targets::StoreArgs,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `txinbox inbox stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    #[command(flatten)]
    common: Common,
    /// Only this consumer (default: every consumer found; required on DynamoDB).
    #[arg(long)]
    consumer: Option<String>,
}

/// Arguments of `txinbox inbox show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    #[command(flatten)]
    common: Common,
    /// The consumer.
    #[arg(long)]
    consumer: String,
    /// The message id.
    #[arg(long)]
    message_id: String,
    /// The message's source (default: any source; required on DynamoDB, where it is part of the marker's
    /// key).
    #[arg(long)]
    source: Option<String>,
    /// Only the effects of these names (repeatable). On DynamoDB each is one read by its key, where without
    /// it every effect shard is read.
    #[arg(long = "effect", value_name = "NAME")]
    effects: Vec<String>,
}

/// Arguments of `txinbox inbox rejections`.
#[derive(Debug, clap::Args)]
pub struct RejectionsArgs {
    #[command(flatten)]
    common: Common,
    /// Only this consumer's (required on DynamoDB).
    #[arg(long)]
    consumer: Option<String>,
    /// Only this kind.
    #[arg(long, value_parser = ["payload_collision", "business_duplicate"])]
    kind: Option<String>,
    /// Recorded at or after this time (RFC 3339, e.g. 2026-12-01T10:00:00Z).
    #[arg(long, value_parser = parse_time)]
    since: Option<DateTime<Utc>>,
    /// Recorded before this time (RFC 3339); after `--since`.
    #[arg(long, value_parser = parse_time)]
    until: Option<DateTime<Utc>>,
    /// At most this many rows.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=txinbox_store::ops::MAX_REJECTIONS))]
    limit: i64,
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("expected an RFC 3339 time such as 2026-12-01T10:00:00Z: {e}"))
}

impl ReadCommand {
    fn common(&self) -> &Common {
        match self {
            ReadCommand::Stats(a) => &a.common,
            ReadCommand::Show(a) => &a.common,
            ReadCommand::Rejections(a) => &a.common,
        }
    }

    /// Runs a read-only command on an open store; `Ok(false)` when nothing was found.
    async fn run_on(&self, store: &Ops) -> Result<bool, String> {
        let json = self.common().json;
        match self {
            ReadCommand::Stats(a) => {
                let now = Utc::now();
                let stats = store.stats(a.consumer.as_deref(), now).await?;
                if json {
                    print_json(&serde_json::json!({ "measured_at": now, "consumers": stats }))?;
                } else {
                    print_stats(&stats);
                }
                // A consumer named that the store knows nothing of (a typo, another store): nothing matched.
                Ok(a.consumer.is_none() || stats.iter().any(|s| !knows_nothing(s)))
            }
            ReadCommand::Show(a) => {
                let mut story = store
                    .story(&a.consumer, &a.message_id, a.source.as_deref(), &a.effects)
                    .await?;
                mask_kept_errors(&mut story);
                let found = story.found();
                if json {
                    let mut doc = serde_json::to_value(&story).map_err(|e| e.to_string())?;
                    if let Some(o) = doc.as_object_mut() {
                        o.insert("found".into(), found.into());
                    }
                    print_json(&doc)?;
                } else {
                    print_story(&story);
                }
                Ok(found)
            }
            ReadCommand::Rejections(a) => {
                let mut f = RejectionFilter::new().limit(a.limit);
                if let Some(c) = &a.consumer {
                    f = f.consumer(c);
                }
                if let Some(k) = &a.kind {
                    f = f.kind(k);
                }
                if let Some(t) = a.since {
                    f = f.since(t);
                }
                if let Some(t) = a.until {
                    f = f.until(t);
                }
                let rows = store.rejections(&f).await?;
                if json {
                    print_json(&serde_json::json!({
                        "count": rows.len(),
                        "limit": f.limit,
                        "rejections": rows,
                    }))?;
                } else {
                    print_rejections(&rows);
                }
                Ok(true)
            }
        }
    }
}

/// Runs a `txinbox inbox` command: 0 ok, 1 nothing found (`show`; `stats --consumer C` where no store holds
/// anything of C), 2 a store error.
pub fn run(command: InboxCommand) -> ExitCode {
    let command = match command {
        InboxCommand::Read(c) => c,
        InboxCommand::Purge(args) => return crate::purge::run(&args),
        InboxCommand::Partition(args) => return crate::partition::run(&args),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return error(&e.to_string()),
    };
    if let ReadCommand::Rejections(RejectionsArgs {
        since: Some(since),
        until: Some(until),
        ..
    }) = &command
    {
        if since >= until {
            return error(&format!(
                "--since {} is not before --until {}: nothing can match (--since is the earliest time kept, --until the first one left out)",
                since.to_rfc3339(),
                until.to_rfc3339()
            ));
        }
    }
    let result = rt.block_on(async {
        let targets = command.common().store.targets()?;
        if command.common().json && targets.len() > 1 {
            return Err(
                "--json prints one document: with several shards, name one with --shard".into(),
            );
        }
        // A message lives in one shard: `show` finds it when any shard knows it. A shard that cannot be read
        // is named on stderr and the others are still read.
        let (mut found, mut failed) = (false, false);
        for t in &targets {
            if let Some(shard) = &t.shard {
                if !command.common().json {
                    outln!("shard {shard}:");
                }
            }
            let read = async {
                let store = Ops::open(&t.url).await?;
                let r = command.run_on(&store).await;
                store.close().await;
                r
            };
            match read.await {
                Ok(f) => found |= f,
                Err(e) => {
                    crate::targets::target_failed(t, &e);
                    failed = true;
                }
            }
        }
        Ok::<(bool, bool), String>((found, failed))
    });
    if let (Ok((false, false)), ReadCommand::Stats(a)) = (&result, &command) {
        if let Some(c) = &a.consumer {
            crate::out::errln!(
                "nothing matched: no marker, rejection or effect of consumer {c:?} in {}",
                if command.common().store.config.is_some() {
                    "any store named"
                } else {
                    "this store"
                }
            );
        }
    }
    match result {
        // `show` found the message: the answer, whatever another shard said.
        Ok((true, _)) if matches!(command, ReadCommand::Show(_)) => ExitCode::SUCCESS,
        Ok((_, true)) => ExitCode::from(2),
        Ok((true, false)) => ExitCode::SUCCESS,
        Ok((false, false)) => ExitCode::from(1),
        Err(e) => error(&e),
    }
}

/// Whether the figures of a consumer hold nothing at all: no marker, no rejection, no effect.
fn knows_nothing(s: &ConsumerStats) -> bool {
    s.inbox_rows == 0
        && s.rejections.values().all(|n| *n == 0)
        && s.effects.values().all(|n| *n == 0)
}

/// One line on stderr, its secrets masked, exit code 2.
fn error(msg: &str) -> ExitCode {
    crate::targets::fail(msg)
}

/// A store opened for the operator's queries.
enum Ops {
    Postgres(Store<sqlx::Postgres>),
    Sqlite(Store<sqlx::Sqlite>),
    Dynamo(DynamoStore),
}

/// The one line a DynamoDB store answers a query that names no consumer.
const DYNAMO_NEEDS_CONSUMER: &str = "needs --consumer on a DynamoDB store: no index lists the consumers (a consumer's items are found through its own partitions of the by_consumer index), and a scan of the table is never made";

impl Ops {
    /// Opens `url` read-only, without touching the schema (a PostgreSQL session with
    /// `default_transaction_read_only`, a SQLite file opened read-only). Errors never hold the URL.
    async fn open(url: &str) -> Result<Self, String> {
        let err = |e: &dyn std::fmt::Display| format!("store ({}): {e}", scheme(url));
        let ops = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ops::Postgres(postgres_opened(url, "txinbox-inbox", true, 2).await?)
        } else if url.starts_with("sqlite:") {
            Ops::Sqlite(sqlite_opened(url, true, 1).await?)
        } else if url.starts_with("dynamodb://") {
            // The standard AWS chain (`AWS_ENDPOINT_URL_DYNAMODB` for an emulator); the table is checked.
            Ops::Dynamo(DynamoStore::connect(url).await.map_err(|e| err(&e))?)
        } else {
            return Err(format!(
                "unsupported store URL scheme {} (expected sqlite:, postgres:// or dynamodb://)",
                shown_scheme(url)
            ));
        };
        Ok(ops)
    }

    async fn stats(
        &self,
        consumer: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ConsumerStats>, String> {
        let q = |e: &dyn std::fmt::Display| format!("query: {e}");
        let rows: Vec<ConsumerStats> = match self {
            Ops::Postgres(s) => s.consumer_stats(consumer, now).await.map_err(|e| q(&e))?,
            Ops::Sqlite(s) => s.consumer_stats(consumer, now).await.map_err(|e| q(&e))?,
            Ops::Dynamo(s) => {
                let c = consumer.ok_or_else(|| format!("inbox stats {DYNAMO_NEEDS_CONSUMER}"))?;
                vec![s.consumer_stats(c, now).await.map_err(|e| q(&e))?]
            }
        };
        Ok(rows)
    }

    async fn story(
        &self,
        consumer: &str,
        message_id: &str,
        source: Option<&str>,
        effects: &[String],
    ) -> Result<MessageStory, String> {
        let q = |e: &dyn std::fmt::Display| format!("query: {e}");
        let mut story: MessageStory = match self {
            Ops::Postgres(s) => s
                .message_story(consumer, message_id, source)
                .await
                .map_err(|e| q(&e))?,
            Ops::Sqlite(s) => s
                .message_story(consumer, message_id, source)
                .await
                .map_err(|e| q(&e))?,
            Ops::Dynamo(s) => {
                let source = source.ok_or(
                    "inbox show needs --source on a DynamoDB store: the marker's key is consumer, source and message id (a rejection of the message names its source); without it the consumer's whole marker partition would be read",
                )?;
                let names = (!effects.is_empty()).then_some(effects);
                return s
                    .message_story(consumer, message_id, source, names)
                    .await
                    .map_err(|e| q(&e));
            }
        };
        if !effects.is_empty() {
            story.effects.retain(|e| effects.contains(&e.name));
        }
        Ok(story)
    }

    async fn rejections(&self, f: &RejectionFilter) -> Result<Vec<RejectionRow>, String> {
        let q = |e: &dyn std::fmt::Display| format!("query: {e}");
        Ok(match self {
            Ops::Postgres(s) => s.rejections(f).await.map_err(|e| q(&e))?,
            Ops::Sqlite(s) => s.rejections(f).await.map_err(|e| q(&e))?,
            Ops::Dynamo(s) => {
                if f.consumer.is_none() {
                    return Err(format!("inbox rejections {DYNAMO_NEEDS_CONSUMER}"));
                }
                s.rejections(f).await.map_err(|e| q(&e))?
            }
        })
    }

    async fn close(&self) {
        match self {
            Ops::Postgres(s) => s.close().await,
            Ops::Sqlite(s) => s.close().await,
            Ops::Dynamo(_) => {}
        }
    }
}

/// The URL's scheme only (the URL may hold a password).
fn scheme(url: &str) -> &str {
    txinbox_core::error::url_scheme(url).unwrap_or("no scheme")
}

/// `url`'s scheme quoted for an error (`"mysql"`), or that it has none: what does not start with one (a libpq
/// `host=... password=...` string, a bare password) is never quoted.
pub(crate) fn shown_scheme(url: &str) -> String {
    match txinbox_core::error::url_scheme(url) {
        Some(s) => format!("{s:?}"),
        None => "(none: not a URL)".into(),
    }
}

/// The PostgreSQL store at `url` as it is, in a pool of `max_connections`: connected at once (a refused
/// connection is an error now, not after the pool's timeout), its schema neither created nor migrated, and
/// refused without the inbox's tables (a mistyped URL would otherwise be answered as an empty inbox, or
/// migrated). Errors name the scheme, never the URL.
pub(crate) async fn postgres_as_is(
    url: &str,
    application_name: &str,
    max_connections: u32,
) -> Result<Store<sqlx::Postgres>, String> {
    postgres_opened(url, application_name, false, max_connections).await
}

/// The SQLite store at `url` as it is, in a pool of `max_connections`: never created (a mistyped path is an
/// error, not a new empty file) nor migrated, and refused without the inbox's tables (an in-memory database
/// never has them). Errors name the scheme, never the URL.
pub(crate) async fn sqlite_as_is(
    url: &str,
    max_connections: u32,
) -> Result<Store<sqlx::Sqlite>, String> {
    sqlite_opened(url, false, max_connections).await
}

/// [`sqlite_as_is`], the file opened read-only when `read_only`.
async fn sqlite_opened(
    url: &str,
    read_only: bool,
    max_connections: u32,
) -> Result<Store<sqlx::Sqlite>, String> {
    use std::str::FromStr;
    let err = |e: &dyn std::fmt::Display| format!("store ({}): {e}", scheme(url));
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .map_err(|e| err(&e))?
        .create_if_missing(false)
        .read_only(read_only)
        .busy_timeout(Duration::from_secs(5))
        .foreign_keys(true);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(max_connections.max(1))
        .connect_with(opts)
        .await
        .map_err(|e| err(&e))?;
    checked_store(pool).await.map_err(|e| err(&e))
}

/// [`postgres_as_is`], its sessions read-only (`default_transaction_read_only`) when `read_only`.
async fn postgres_opened(
    url: &str,
    application_name: &str,
    read_only: bool,
    max_connections: u32,
) -> Result<Store<sqlx::Postgres>, String> {
    let err = |e: &dyn std::fmt::Display| format!("store ({}): {e}", scheme(url));
    // Not sqlx's own reading: it logs an unknown query parameter with its value.
    let mut opts = txinbox_store::pg_connect_options(url)
        .map_err(|e| err(&e))?
        .application_name(application_name);
    if read_only {
        opts = opts.options([("default_transaction_read_only", "on")]);
    }
    // One connection first: the pool retries a refused connection until its acquire timeout, while an
    // operator wants the error at once.
    let probe = <sqlx::PgConnection as sqlx::Connection>::connect_with(&opts)
        .await
        .map_err(|e| err(&e))?;
    let _ = sqlx::Connection::close(probe).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(opts)
        .await
        .map_err(|e| err(&e))?;
    checked_store(pool).await.map_err(|e| err(&e))
}

/// The store on `pool`, its schema left as it is and checked.
async fn checked_store<DB: Backend>(pool: sqlx::Pool<DB>) -> Result<Store<DB>, String> {
    let store = Store::from_pool_with(pool, Migrations::Skip)
        .await
        .map_err(|e| e.to_string())?;
    check_schema(&store).await?;
    Ok(store)
}

/// Refuses a database without the inbox's tables; warns when the operator indexes (migration 3) are missing.
async fn check_schema<DB: Backend>(store: &Store<DB>) -> Result<(), String> {
    match DB::schema_version(store.pool())
        .await
        .map_err(|e| e.to_string())?
    {
        None | Some(0) => {
            Err("no txinbox schema at this store URL (txinbox_schema_version is missing)".into())
        }
        Some(v) if v < 3 => {
            crate::out::errln!("warning: schema version {v}: the operator indexes of migration 3 are missing, queries may scan whole tables (start a worker of this version to migrate)");
            Ok(())
        }
        Some(_) => Ok(()),
    }
}

/// The effects' `last_error` as they are shown: with the secrets of the URLs they quote masked
/// ([`redact_secrets`](txinbox_core::error::redact_secrets)). An error kept by an older runner quotes its
/// destination's URL whole, a webhook's token in its path or an API key in its query.
fn mask_kept_errors(story: &mut MessageStory) {
    for e in &mut story.effects {
        if let Some(error) = &mut e.last_error {
            *error = txinbox_core::error::redact_secrets(error);
        }
    }
}

#[cfg(test)]
mod kept_error_tests {
    use super::*;

    #[test]
    fn a_kept_error_is_shown_without_the_token_of_its_url() {
        let now = chrono::Utc::now();
        let effect = txinbox_core::store::ops::EffectView {
            id: 1,
            key: "k".into(),
            name: "notify".into(),
            destination: "slack".into(),
            external_ref: "r".into(),
            group_key: None,
            state: "failed".into(),
            attempts: 1,
            reconciliations: 0,
            next_attempt_at: now,
            claimed_by: None,
            claim_until: None,
            reference: None,
            last_error: Some(
                "https://hooks.slack.com/services/T0/B0/SECRETtoken1 answered 404: no_service"
                    .into(),
            ),
            created_at: now,
            updated_at: now,
            finished_at: None,
        };
        let mut story = MessageStory {
            consumer: "c".into(),
            message_id: "m".into(),
            source: None,
            markers: Vec::new(),
            rejections: Vec::new(),
            effects: vec![effect],
        };
        mask_kept_errors(&mut story);
        assert_eq!(
            story.effects[0].last_error.as_deref(),
            Some("https://hooks.slack.com/services/***/***/*** answered 404: no_service")
        );
    }
}
