//! The benchmark behind `txinbox-bench`: what the inbox costs on PostgreSQL. It lives in its own crate and
//! binary, out of the library users depend on and out of the operator's `txinbox` command.
//!
//! At each concurrency, for `--seconds` each, it measures:
//! * `bare`: the handler alone in a transaction (`BEGIN; INSERT business row; COMMIT`);
//! * `inbox`: the same handler through [`txinbox_core::Inbox`] (identity, fingerprint, marker insert, handler,
//!   COMMIT, settle on a no-op delivery so that no broker cost is counted);
//! * `inbox_dup`: the inbox on a stream where 9 of 10 deliveries are duplicates of applied messages;
//! * `pgbench_inbox`: `pgbench -M prepared` running exactly the SQL the inbox issues on the apply path
//!   (`BEGIN`, the marker insert (the store's marker insert), the business insert, `COMMIT`),
//!   the measure of what the database itself allows.
//!
//! With `--batch B` (default 10) each concurrency also gets a batch line:
//! * `inbox_batchB`: the same handler through [`txinbox_core::Inbox::process_batch`], B new messages per
//!   transaction (the markers in one statement, the business insert per message, one COMMIT);
//! * `pgbench_batchB`: pgbench running exactly that batched SQL, in messages per second;
//! * `batch/bare` (targets 1.2 at c=8) and `batch/pgbench_batch` (target 0.80);
//! * in its `#` line, the same batched SQL through sqlx alone, and pgbench on the SQL of the batch's savepoint
//!   pass (`pgbench_batchB_savepoint_sql`: a savepoint, the marker insert and the business insert per
//!   message, what every batch sent before the first pass and what a batch with a failing handler sends again).
//!
//! Then an end-to-end line per broker of `--e2e-broker` (`memory` by default, `servicebus`; `--e2e-messages`,
//! default 100,000; 0 skips them): the messages go through a [`txinbox_core::Worker`] with batch commit B and
//! `--e2e-in-flight` deliveries in flight, from the broker with a round trip of `--e2e-round-trip-ms` on every
//! receive, settle and lease renewal, into the inbox on PostgreSQL. `memory` is the in-memory broker with a
//! simulated round trip; `servicebus` is the Service Bus adapter over REST, with its default options, against
//! the Service Bus emulator started in this process, every data-plane request delayed by the round trip, and
//! its line starts with the requests the adapter sent per message (`peek_locks_per_msg`,
//! `completes_per_msg`, `abandons_per_msg`, `renewals_per_msg`) as the emulator counted them; `sqs` is the SQS
//! adapter with its default options against the SQS emulator at `--sqs-endpoint` (moto), a FIFO queue of 64
//! message groups reached through a latency proxy of our own (half the round trip each way), its line
//! starting with the requests per message the proxy counted. Each line gives
//! messages per second applied (until the last message is settled), and the process's resident memory (VmRSS)
//! at the start, after the first tenth, at the end and at its highest; the `memory` line adds the most
//! messages the broker saw in flight at once (`queue_in_flight_max`: received and not yet settled, round trips
//! included) and how long the simulated round trips lasted on average, as the waiting calls saw them
//! (`broker_round_trip_ms_measured`). With `--e2e-prefetch P`
//! the worker receives up to P deliveries ahead of a free slot: `--e2e-in-flight` then bounds the deliveries
//! being applied or settled, and up to in-flight + P are out of the queue. With `--e2e-rate R` the producer
//! sends a steady R messages per second instead of keeping a backlog, and `--e2e-linger-ms L` lets a batch
//! one receive did not fill wait up to L ms for the next: `messages_per_apply_call` then shows how full the
//! transactions were, and `latency_ms_p50` / `latency_ms_p99` / `latency_ms_max` what the wait costs each
//! message: the time from its send to the answer of its settle (receive, linger, apply and settle round trips;
//! with a backlog instead of a steady rate it is mostly time spent waiting in the queue).
//!
//! With `--shards URL,URL,...` it measures instead the worker over shards, one database per URL (see the
//! `shards` module): one database against all of them, and the others' rate while one is unavailable.
//!
//! Figures are messages (or transactions) per second, each the median of `--rounds` rounds; a round runs
//! every measurement once, one after the other (`inbox` and `pgbench_inbox` back to back, in alternating
//! order), so that a slow minute of a shared machine falls on all of them alike. The target is `inbox/pgbench >= 0.80`. A `#` line per concurrency adds the same
//! statements sent through sqlx without the inbox (what the client library costs), the ratio of each round,
//! and the client CPU per operation (user + system microseconds, read from `/proc`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use txinbox_core::{
    CancellationToken, ConsumerName, Handler, HandlerError, IdentityPolicy, Inbox, InboxProcessor,
    Message, Raw, ReceivedMessage,
};
use txinbox_lab::lab::LabError;
use txinbox_store::{Store, Tx};
use txinbox_testkit::NoopDelivery;

mod dynamodb;
mod e2e;
mod partitions;
mod shards;
pub use e2e::E2eBroker;

/// The inbox the benchmark measures, bound to its handler.
type BenchInbox<H> = InboxProcessor<Store<sqlx::Postgres>, Raw, H>;

/// Arguments of `txinbox-bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// PostgreSQL URL (the benchmark works in its own schema, dropped at the end), or `dynamodb://TABLE` for
    /// the DynamoDB store's lines (in tables `TABLE-<random>` and `TABLE-<random>-tasks`, deleted at the end).
    #[arg(long, env = "TXINBOX_BENCH_STORE_URL")]
    pub store: String,
    /// The DynamoDB endpoint of a `dynamodb://` store (DynamoDB Local: `eval "$(bash scripts/dynamodb.sh
    /// start)"` exports it); unset: the standard AWS configuration chain.
    #[arg(long, env = "TXINBOX_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Concurrency levels, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub concurrency: Vec<usize>,
    /// Rounds per concurrency. Each round runs every measurement once, in turn; the figures printed are the
    /// medians over the rounds, so that the drift of a shared machine falls on all of them alike.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// The pgbench binary.
    #[arg(long, default_value = "pgbench")]
    pub pgbench: String,
    /// Instead of the throughput lines: what a retention purge costs the applying worker. Loads this many
    /// expired markers, then measures the inbox's apply rate at the highest `--concurrency` without a purge,
    /// during a purge (the maintenance with its default batch and pause), and without again.
    #[arg(long)]
    pub purge_impact: Option<i64>,
    /// With `--purge-impact N`: on the partitioned layout (`txinbox inbox partition`), where the expired
    /// markers go with their whole partition: each of `--cycles` retention cycles loads N expired markers into
    /// the oldest partition and measures the apply rate without, during and after its drop, and the sizes.
    #[arg(long, requires = "purge_impact")]
    pub partitioned: bool,
    /// With `--partitioned`: retention cycles (1 to 25).
    #[arg(long, default_value_t = 5, requires = "partitioned")]
    pub cycles: u32,
    /// With `--partitioned`: hours one partition covers (the N expired markers of a cycle fill one partition:
    /// `--purge-impact 416667 --width-hours 1` is a day of ten million markers in hourly partitions).
    #[arg(long, default_value_t = 24, requires = "partitioned")]
    pub width_hours: u64,
    /// Messages per transaction of the batch lines and of the end-to-end worker (2 to 64; 1 skips the batch
    /// lines and runs the end-to-end worker without batch commit).
    #[arg(long, default_value_t = 10)]
    pub batch: usize,
    /// Messages of the end-to-end run through the worker and the in-memory broker (0 skips it).
    #[arg(long, default_value_t = 100_000)]
    pub e2e_messages: u64,
    /// Simulated broker round trip of the end-to-end run, in milliseconds.
    #[arg(long, default_value_t = 10)]
    pub e2e_round_trip_ms: u64,
    /// Deliveries in flight in the end-to-end run (the worker's concurrency).
    #[arg(long, default_value_t = 32)]
    pub e2e_in_flight: usize,
    /// Most messages one receive of the end-to-end run asks for (10, the SQS maximum, by default; a Service
    /// Bus receive may lock more).
    #[arg(long, default_value_t = 10)]
    pub e2e_receive_max: usize,
    /// Workers (receive loops) in the end-to-end process sharing the in-flight deliveries; each has one
    /// receive in flight at a time.
    #[arg(long, default_value_t = 1)]
    pub e2e_receivers: usize,
    /// Receive loops of each end-to-end worker ([`txinbox_core::WorkerOptions::receive_loops`]): receives in
    /// flight at once sharing the worker's in-flight deliveries (unset: the worker's default, enough for every
    /// in-flight place to be in a receive).
    #[arg(long)]
    pub e2e_receive_loops: Option<usize>,
    /// Deliveries the end-to-end worker receives ahead of a free slot ([`txinbox_core::WorkerOptions::prefetch`];
    /// 0: a receive asks only for free slots, so `--e2e-in-flight` bounds everything out of the queue).
    #[arg(long, default_value_t = 0)]
    pub e2e_prefetch: usize,
    /// Messages per second the end-to-end producer sends, a steady stream (0: it keeps a backlog waiting, so
    /// that the worker's own rate is measured).
    #[arg(long, default_value_t = 0)]
    pub e2e_rate: u64,
    /// How long a batch of the end-to-end worker that one receive did not fill waits for the next receives,
    /// in milliseconds ([`txinbox_core::WorkerOptions::batch_linger`]; 0: a batch is what one receive brought).
    #[arg(long, default_value_t = 0)]
    pub e2e_linger_ms: u64,
    /// The brokers of the end-to-end lines, comma-separated, one line each: `memory` (the in-memory broker
    /// with a simulated round trip), `servicebus` (the Service Bus adapter against the in-process emulator,
    /// each request delayed by the round trip), `sqs` (the SQS adapter against `--sqs-endpoint` behind a
    /// latency proxy).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "memory")]
    pub e2e_broker: Vec<E2eBroker>,
    /// The SQS emulator of `--e2e-broker sqs` (moto: `eval "$(bash scripts/moto.sh start)"` exports it).
    #[arg(long, env = "TXINBOX_SQS_ENDPOINT")]
    pub sqs_endpoint: Option<String>,
    /// Only the end-to-end lines.
    #[arg(long)]
    pub e2e_only: bool,
    /// Instead of the throughput lines: the worker over shards, one PostgreSQL URL each (two or more,
    /// comma-separated; `scripts/pg-shards.sh` makes three): one database against all of them, and the others'
    /// rate while one is unavailable. `--store` is not used.
    #[arg(long, value_delimiter = ',')]
    pub shards: Vec<String>,
}

const CONSUMER: &str = "bench";
const BUSINESS_INSERT: &str = "INSERT INTO bench_tasks (task_id, message_id) VALUES ($1, $2)";

fn message(id: &str, n: u64) -> ReceivedMessage {
    let mut m = ReceivedMessage::new(
        format!("{{\"opportunity\":\"o-{n}\",\"meeting\":\"m-{n}\"}}").into_bytes(),
    );
    m.attributes.insert("ce-id".into(), id.to_owned());
    m.attributes.insert("ce-source".into(), "urn.bench".into());
    m.attributes.insert("ce-type".into(), "bench.event".into());
    m
}

/// A throughput figure and the client CPU it took.
#[derive(Clone, Copy)]
struct Rate {
    /// Operations per second.
    per_sec: f64,
    /// Client CPU per operation in microseconds, (user, system), when the platform tells.
    cpu_us: Option<[f64; 2]>,
}

fn cpu_per_op(before: Option<[u64; 2]>, after: Option<[u64; 2]>, ops: f64) -> Option<[f64; 2]> {
    let (b, a) = (before?, after?);
    // Linux reports /proc CPU times in USER_HZ, 100 per second on every mainstream architecture.
    let us = |i: usize| a[i].saturating_sub(b[i]) as f64 * 10_000.0 / ops;
    (ops > 0.0).then(|| [us(0), us(1)])
}

async fn measure<F>(concurrency: usize, seconds: u64, op: F) -> Result<Rate, LabError>
where
    F: Fn(usize, u64) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = cpu_ticks().map(|c| c.0);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let (op, done, stop) = (op.clone(), done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                op(t, i).await?;
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await
            .map_err(|e| LabError::Usage(e.to_string()))?
            .map_err(LabError::Usage)?;
    }
    let ops = done.load(Ordering::Relaxed) as f64;
    Ok(Rate {
        per_sec: ops / start.elapsed().as_secs_f64(),
        cpu_us: cpu_per_op(cpu_before, cpu_ticks().map(|c| c.0), ops),
    })
}

/// CPU time used so far, in clock ticks: (this process, its waited-for children), each as (user, system).
/// Linux only; `None` elsewhere. Used to report the client's CPU per transaction next to the throughput
/// figures.
fn cpu_ticks() -> Option<([u64; 2], [u64; 2])> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    (f.len() == 4).then(|| ([f[0], f[1]], [f[2], f[3]]))
}

async fn reset(pool: &sqlx::PgPool) -> Result<(), LabError> {
    sqlx::Executor::execute(pool, "TRUNCATE txinbox_inbox, bench_tasks").await?;
    Ok(())
}

/// The pgbench script: one message per transaction (`batch` 0), or `batch` messages per transaction as
/// [`txinbox_core::Inbox::process_batch`] sends them when every handler succeeds (the store's one statement
/// for all the markers, then each message's business insert), or with `savepoints` as its savepoint pass
/// sends them (per message a savepoint, the marker insert and the business insert).
fn pgbench_script(
    dir: &std::path::Path,
    batch: usize,
    savepoints: bool,
) -> Result<std::path::PathBuf, LabError> {
    let mut script = String::from("\\set n random(1, 9000000000000000000)\nBEGIN;\n");
    if batch == 0 {
        let (marker, business) = pgbench_statements("");
        script.push_str(&format!("{marker};\n{business};\n"));
    } else if !savepoints {
        script.push_str(&format!("{};\n", pgbench_batch_markers(batch)));
    }
    for k in 0..batch {
        let (marker, business) = pgbench_statements(&format!("-{k}"));
        if savepoints {
            script.push_str(&format!(
                "{};\n{marker};\n",
                txinbox_store::postgres::savepoint_sql()
            ));
        }
        script.push_str(&format!("{business};\n"));
    }
    script.push_str("COMMIT;\n");
    let path = dir.join(format!(
        "txinbox-bench-{}.sql",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&path, script)
        .map_err(|e| LabError::Usage(format!("cannot write the pgbench script: {e}")))?;
    Ok(path)
}

/// The store's batch marker insert of `batch` messages (ids ending in `-0` .. `-{batch-1}`), with the arrays
/// written out as the values the inbox binds.
fn pgbench_batch_markers(batch: usize) -> String {
    let array = |value: &dyn Fn(usize) -> String| -> String {
        let items: Vec<String> = (0..batch).map(value).collect();
        format!("ARRAY[{}]", items.join(", "))
    };
    let same = |v: &'static str| move |_: usize| v.to_owned();
    let columns: [(&str, String); 13] = [
        ("$1::", array(&same("'bench'"))),
        ("$2::", array(&same("'urn.bench'"))),
        ("$3::", array(&|k| pgbench_id(&format!("-{k}")))),
        ("$4::", array(&same("'bench.event'"))),
        ("$5::", array(&same("NULL"))),
        (
            "$6::",
            array(&same(
                "'9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'",
            )),
        ),
        ("$7::", array(&same("NULL"))),
        ("$8::", array(&same("NULL"))),
        ("$9::", array(&same("now()"))),
        ("$10::", array(&same("now()"))),
        ("$11::", array(&same("now() + interval '30 days'"))),
        ("$12::", array(&same("'cloudevents_attributes'"))),
        ("$13::", array(&same("1"))),
    ];
    let mut sql = txinbox_store::postgres::insert_markers_sql().to_owned();
    for (param, value) in columns {
        sql = sql.replace(param, &format!("{value}::"));
    }
    sql
}

/// A bench message id in pgbench, ending in `suffix`.
fn pgbench_id(suffix: &str) -> String {
    format!("'pgb-' || CAST(:client_id AS text) || '-' || CAST(:n AS text) || '{suffix}'")
}

/// The marker insert and the business insert of one message, ids ending in `suffix`.
fn pgbench_statements(suffix: &str) -> (String, String) {
    let id = pgbench_id(suffix);
    // Exactly the statements the inbox sends on the apply path, with values of the same shape.
    let marker = txinbox_store::postgres::insert_marker_sql()
        .replace("$10", "now()")
        .replace("$11", "now() + interval '30 days'")
        .replace("$12", "'cloudevents_attributes'")
        .replace("$13", "1")
        .replace("$1,", "'bench',")
        .replace("$2,", "'urn.bench',")
        .replace("$3,", &format!("{id},"))
        .replace("$4,", "'bench.event',")
        .replace("$5,", "NULL,")
        .replace(
            "$6,",
            "'9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08',",
        )
        .replace("$7,", "NULL,")
        .replace("$8,", "NULL,")
        .replace("$9,", "now(),");
    let business = BUSINESS_INSERT
        .replace(
            "$1",
            &format!("'t-' || CAST(:client_id AS text) || '-' || CAST(:n AS text) || '{suffix}'"),
        )
        .replace("$2", &id);
    (marker, business)
}

fn run_pgbench(
    args: &BenchArgs,
    url: &str,
    script: &std::path::Path,
    c: usize,
) -> Result<Rate, LabError> {
    let cpu_before = cpu_ticks().map(|c| c.1);
    let jobs = c.clamp(1, 2);
    let out = std::process::Command::new(&args.pgbench)
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &c.to_string(),
            "-j",
            &jobs.to_string(),
        ])
        .args(["-T", &args.seconds.to_string(), "-f"])
        .arg(script)
        .arg(url)
        .output()
        .map_err(|e| {
            LabError::Usage(format!(
                "cannot run {}: {e} (it ships with PostgreSQL)",
                args.pgbench
            ))
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(LabError::Usage(format!(
            "pgbench failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| l.contains("error"))
                .collect::<Vec<_>>()
                .join(" | ")
        )));
    }
    let field = |prefix: &str| -> Option<f64> {
        stdout.lines().find_map(|l| {
            l.trim()
                .strip_prefix(prefix)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
    };
    let per_sec =
        field("tps = ").ok_or_else(|| LabError::Usage("pgbench printed no tps line".into()))?;
    let ops = field("number of transactions actually processed: ").unwrap_or(0.0);
    Ok(Rate {
        per_sec,
        cpu_us: cpu_per_op(cpu_before, cpu_ticks().map(|c| c.1), ops),
    })
}

/// The handler's business row, outside the inbox.
/// The store's marker insert through sqlx, with the values the inbox would bind for a bench message.
async fn marker_insert(conn: &mut sqlx::PgConnection, id: &str) -> Result<(), String> {
    let now = chrono::Utc::now();
    sqlx::query(txinbox_store::postgres::insert_marker_sql())
        .bind(CONSUMER)
        .bind("urn.bench")
        .bind(id)
        .bind(Some("bench.event"))
        .bind(None::<String>)
        .bind("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
        .bind(None::<String>)
        .bind(None::<String>)
        .bind(now)
        .bind(now)
        .bind(now + chrono::Duration::days(30))
        .bind("cloudevents_attributes")
        .bind(1i32)
        .execute(conn)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The store's batch marker insert through sqlx, with the values the inbox would bind for bench messages.
async fn marker_inserts(conn: &mut sqlx::PgConnection, ids: &[String]) -> Result<(), String> {
    let now = chrono::Utc::now();
    let n = ids.len();
    let text = |v: Option<&'static str>| vec![v; n];
    sqlx::query(txinbox_store::postgres::insert_markers_sql())
        .bind(text(Some(CONSUMER)))
        .bind(text(Some("urn.bench")))
        .bind(ids)
        .bind(text(Some("bench.event")))
        .bind(text(None))
        .bind(text(Some(
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        )))
        .bind(text(None))
        .bind(text(None))
        .bind(vec![now; n])
        .bind(vec![now; n])
        .bind(vec![now + chrono::Duration::days(30); n])
        .bind(text(Some("cloudevents_attributes")))
        .bind(vec![1i32; n])
        .fetch_all(conn)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

async fn business_insert(conn: &mut sqlx::PgConnection, id: &str) -> Result<(), String> {
    sqlx::query(BUSINESS_INSERT)
        .bind(format!("t-{id}"))
        .bind(id)
        .execute(conn)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Processes `m` through the inbox and checks its outcome.
async fn expect<H: Handler<Store<sqlx::Postgres>, Raw>>(
    inbox: &BenchInbox<H>,
    m: ReceivedMessage,
    want: &str,
) -> Result<(), String> {
    let o = inbox.process_one(NoopDelivery(m)).await;
    if o.label() == want {
        Ok(())
    } else {
        Err(format!("unexpected outcome {o}, wanted {want}"))
    }
}

/// The figures of one round at one concurrency.
#[derive(Clone, Copy)]
struct Round {
    bare: Rate,
    inbox: Rate,
    dup: Rate,
    same_sql: Rate,
    pgbench: Rate,
    /// `inbox_batchB` and `pgbench_batchB`, in messages per second.
    batch: Option<(Rate, Rate)>,
    /// The batched SQL through sqlx alone, in messages per second.
    same_sql_batch: Option<Rate>,
    /// pgbench on the savepoint pass's SQL, in messages per second.
    pgbench_savepoints: Option<Rate>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median over the rounds of one measurement: throughput and client CPU.
fn median_rate<R>(rounds: &[R], pick: fn(&R) -> Rate) -> Rate {
    let cpu: Option<Vec<[f64; 2]>> = rounds.iter().map(|r| pick(r).cpu_us).collect();
    Rate {
        per_sec: median(rounds.iter().map(|r| pick(r).per_sec).collect()),
        cpu_us: cpu.map(|c| {
            [
                median(c.iter().map(|x| x[0]).collect()),
                median(c.iter().map(|x| x[1]).collect()),
            ]
        }),
    }
}

/// What every measurement shares.
struct Bench<H> {
    args: BenchArgs,
    pool: sqlx::PgPool,
    inbox: Arc<BenchInbox<H>>,
    pg_url: String,
    script: std::path::PathBuf,
    /// The batch's pgbench scripts: the first pass's SQL (the reference), the savepoint pass's.
    batch_script: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// A rate of batches as a rate of messages.
fn per_message(r: Rate, batch: usize) -> Rate {
    let b = batch as f64;
    Rate {
        per_sec: r.per_sec * b,
        cpu_us: r.cpu_us.map(|[u, s]| [u / b, s / b]),
    }
}

impl<H: Handler<Store<sqlx::Postgres>, Raw>> Bench<H> {
    /// `BEGIN; business insert; COMMIT` through sqlx.
    async fn bare(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let p = self.pool.clone();
        measure(c, self.args.seconds, move |t, i| {
            let p = p.clone();
            Box::pin(async move {
                let mut tx = p.begin().await.map_err(|e| e.to_string())?;
                let id = format!("bare-{c}-{round}-{t}-{i}");
                business_insert(&mut tx, &id).await?;
                tx.commit().await.map_err(|e| e.to_string())
            })
        })
        .await
    }

    /// The same handler through the inbox, every delivery a new message.
    async fn inbox(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let ib = self.inbox.clone();
        measure(c, self.args.seconds, move |t, i| {
            let ib = ib.clone();
            Box::pin(async move {
                let m = message(&format!("in-{c}-{round}-{t}-{i}"), i);
                expect(&ib, m, "applied").await
            })
        })
        .await
    }

    /// The inbox on a stream where 9 of 10 deliveries repeat one of 1000 applied messages.
    async fn dup(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        for n in 0..1000u64 {
            let m = message(&format!("dup-{n}"), n);
            expect(&self.inbox, m, "applied")
                .await
                .map_err(|e| LabError::Usage(format!("preparing the duplicate stream: {e}")))?;
        }
        let ib = self.inbox.clone();
        measure(c, self.args.seconds, move |t, i| {
            let ib = ib.clone();
            Box::pin(async move {
                let (m, want) = if i % 10 == 0 {
                    (message(&format!("new-{c}-{round}-{t}-{i}"), i), "applied")
                } else {
                    let n = (i * 7919 + t as u64 * 104_729) % 1000;
                    (message(&format!("dup-{n}"), n), "duplicate")
                };
                expect(&ib, m, want).await
            })
        })
        .await
    }

    /// The inbox's statements through sqlx without the inbox: what the client library itself costs.
    async fn same_sql(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let p = self.pool.clone();
        measure(c, self.args.seconds, move |t, i| {
            let p = p.clone();
            Box::pin(async move {
                let mut tx = p.begin().await.map_err(|e| e.to_string())?;
                let id = format!("sql-{c}-{round}-{t}-{i}");
                marker_insert(&mut tx, &id).await?;
                business_insert(&mut tx, &id).await?;
                tx.commit().await.map_err(|e| e.to_string())
            })
        })
        .await
    }

    async fn pgbench(&self, c: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        run_pgbench(&self.args, &self.pg_url, &self.script, c)
    }

    /// Batches of `--batch` new messages through [`InboxProcessor::process_batch`], in messages per second.
    async fn inbox_batch(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let ib = self.inbox.clone();
        let b = self.args.batch;
        let r = measure(c, self.args.seconds, move |t, i| {
            let ib = ib.clone();
            Box::pin(async move {
                let batch: Vec<NoopDelivery> = (0..b)
                    .map(|k| NoopDelivery(message(&format!("ib-{c}-{round}-{t}-{i}-{k}"), i)))
                    .collect();
                let out = ib.process_batch(batch, &CancellationToken::new()).await;
                match out.iter().find(|o| o.label() != "applied") {
                    None => Ok(()),
                    Some(o) => Err(format!("unexpected outcome {o} in a batch, wanted applied")),
                }
            })
        })
        .await?;
        Ok(per_message(r, b))
    }

    /// The batched SQL through sqlx without the inbox (`BEGIN`, the markers in one statement, per message the
    /// business insert, `COMMIT`), in messages per second: what the client library costs on its own.
    async fn same_sql_batch(&self, c: usize, round: usize) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let p = self.pool.clone();
        let b = self.args.batch;
        let r = measure(c, self.args.seconds, move |t, i| {
            let p = p.clone();
            Box::pin(async move {
                let mut tx = p.begin().await.map_err(|e| e.to_string())?;
                let ids: Vec<String> = (0..b)
                    .map(|k| format!("sqlb-{c}-{round}-{t}-{i}-{k}"))
                    .collect();
                marker_inserts(&mut tx, &ids).await?;
                for id in &ids {
                    business_insert(&mut tx, id).await?;
                }
                tx.commit().await.map_err(|e| e.to_string())
            })
        })
        .await?;
        Ok(per_message(r, b))
    }

    /// pgbench on the batched SQL, in messages per second.
    async fn pgbench_batch(&self, c: usize, script: &std::path::Path) -> Result<Rate, LabError> {
        reset(&self.pool).await?;
        let r = run_pgbench(&self.args, &self.pg_url, script, c)?;
        Ok(per_message(r, self.args.batch))
    }

    async fn round(&self, c: usize, round: usize) -> Result<Round, LabError> {
        // The two figures of the target run back to back, in alternating order from round to round, so that
        // neither always follows the other.
        let (inbox, pgbench) = if round % 2 == 0 {
            let inbox = self.inbox(c, round).await?;
            (inbox, self.pgbench(c).await?)
        } else {
            let pgbench = self.pgbench(c).await?;
            (self.inbox(c, round).await?, pgbench)
        };
        let batch = match &self.batch_script {
            None => None,
            Some((script, _)) if round % 2 == 0 => {
                let ib = self.inbox_batch(c, round).await?;
                Some((ib, self.pgbench_batch(c, script).await?))
            }
            Some((script, _)) => {
                let pgb = self.pgbench_batch(c, script).await?;
                Some((self.inbox_batch(c, round).await?, pgb))
            }
        };
        let (same_sql_batch, pgbench_savepoints) = match &self.batch_script {
            Some((_, savepoints)) => (
                Some(self.same_sql_batch(c, round).await?),
                Some(self.pgbench_batch(c, savepoints).await?),
            ),
            None => (None, None),
        };
        Ok(Round {
            inbox,
            pgbench,
            batch,
            same_sql_batch,
            pgbench_savepoints,
            bare: self.bare(c, round).await?,
            dup: self.dup(c, round).await?,
            same_sql: self.same_sql(c, round).await?,
        })
    }

    async fn concurrency(&self, c: usize) -> Result<(), LabError> {
        let mut rounds = Vec::with_capacity(self.args.rounds);
        for round in 0..self.args.rounds {
            rounds.push(self.round(c, round).await?);
        }
        let bare = median_rate(&rounds, |r| r.bare);
        let inbox = median_rate(&rounds, |r| r.inbox);
        let dup = median_rate(&rounds, |r| r.dup);
        let same_sql = median_rate(&rounds, |r| r.same_sql);
        let pgb = median_rate(&rounds, |r| r.pgbench);
        println!(
            "c={c} bare={:.0} inbox={:.0} inbox_dup={:.0} pgbench_inbox={:.0} inbox/bare={:.2} inbox/pgbench={:.2}",
            bare.per_sec,
            inbox.per_sec,
            dup.per_sec,
            pgb.per_sec,
            inbox.per_sec / bare.per_sec,
            inbox.per_sec / pgb.per_sec
        );
        let us = |r: Rate| {
            r.cpu_us
                .map_or_else(|| "?".to_owned(), |[u, s]| format!("{u:.0}+{s:.0}"))
        };
        let per_round: Vec<String> = rounds
            .iter()
            .map(|r| format!("{:.2}", r.inbox.per_sec / r.pgbench.per_sec))
            .collect();
        println!(
            "#   c={c} sqlx_same_sql={:.0} inbox/sqlx_same_sql={:.2} sqlx_same_sql/pgbench={:.2} inbox/pgbench_per_round=[{}] client_cpu_us_per_op(user+sys): bare={} inbox={} sqlx_same_sql={} pgbench={}",
            same_sql.per_sec,
            inbox.per_sec / same_sql.per_sec,
            same_sql.per_sec / pgb.per_sec,
            per_round.join(" "),
            us(bare),
            us(inbox),
            us(same_sql),
            us(pgb)
        );
        if self.batch_script.is_some() {
            let b = self.args.batch;
            let ib = median_rate(&rounds, |r| r.batch.map_or(r.inbox, |(i, _)| i));
            let pgbb = median_rate(&rounds, |r| r.batch.map_or(r.pgbench, |(_, p)| p));
            println!(
                "c={c} bare={:.0} inbox_batch{b}={:.0} pgbench_batch{b}={:.0} batch/bare={:.2} batch/pgbench_batch={:.2}",
                bare.per_sec,
                ib.per_sec,
                pgbb.per_sec,
                ib.per_sec / bare.per_sec,
                ib.per_sec / pgbb.per_sec
            );
            let per_round: Vec<String> = rounds
                .iter()
                .filter_map(|r| {
                    let (i, p) = r.batch?;
                    Some(format!(
                        "{:.2}:{:.2}",
                        i.per_sec / r.bare.per_sec,
                        i.per_sec / p.per_sec
                    ))
                })
                .collect();
            let sqlb = median_rate(&rounds, |r| r.same_sql_batch.unwrap_or(r.same_sql));
            let pgsp = median_rate(&rounds, |r| r.pgbench_savepoints.unwrap_or(r.pgbench));
            println!(
                "#   c={c} sqlx_same_sql_batch{b}={:.0} inbox_batch/sqlx_same_sql_batch={:.2} sqlx_same_sql_batch/pgbench_batch={:.2} pgbench_batch{b}_savepoint_sql={:.0} inbox_batch/pgbench_savepoint_sql={:.2} per_round(batch/bare:batch/pgbench_batch)=[{}] client_cpu_us_per_msg(user+sys): inbox_batch{b}={} sqlx_same_sql_batch{b}={} pgbench_batch{b}={}",
                sqlb.per_sec,
                ib.per_sec / sqlb.per_sec,
                sqlb.per_sec / pgbb.per_sec,
                pgsp.per_sec,
                ib.per_sec / pgsp.per_sec,
                per_round.join(" "),
                us(ib),
                us(sqlb),
                us(pgbb)
            );
        }
        Ok(())
    }
}

/// Runs the benchmark and prints one line per concurrency.
pub async fn run(args: BenchArgs) -> Result<(), LabError> {
    if !args.shards.is_empty() {
        if !(1..=txinbox_core::runtime::worker::MAX_BATCH_COMMIT).contains(&args.batch) {
            return Err(LabError::Usage(format!(
                "--batch must be 1 to {}",
                txinbox_core::runtime::worker::MAX_BATCH_COMMIT
            )));
        }
        return shards::run(&args).await;
    }
    if let Some(table) = args.store.strip_prefix("dynamodb://") {
        if args.seconds == 0 || args.rounds == 0 || args.concurrency.contains(&0) {
            return Err(LabError::Usage(
                "--seconds, --rounds and every --concurrency must be at least 1".into(),
            ));
        }
        txinbox_dynamodb::table_from_url(&args.store)
            .map_err(|e| LabError::Usage(e.to_string()))?;
        return dynamodb::run(&args, table).await;
    }
    if !(args.store.starts_with("postgres://") || args.store.starts_with("postgresql://")) {
        return Err(LabError::Usage(
            "bench needs a postgres:// or dynamodb:// store URL".into(),
        ));
    }
    if let Some(rows) = args.purge_impact {
        if args.partitioned {
            return partitions::purge_impact(&args, rows).await;
        }
        return purge_impact(&args, rows).await;
    }
    if args.seconds == 0 || args.rounds == 0 || args.concurrency.contains(&0) {
        return Err(LabError::Usage(
            "--seconds, --rounds and every --concurrency must be at least 1".into(),
        ));
    }
    if !(1..=txinbox_core::runtime::worker::MAX_BATCH_COMMIT).contains(&args.batch) {
        return Err(LabError::Usage(format!(
            "--batch must be 1 to {}",
            txinbox_core::runtime::worker::MAX_BATCH_COMMIT
        )));
    }
    if args.e2e_in_flight == 0 || args.e2e_receive_max == 0 {
        return Err(LabError::Usage(
            "--e2e-in-flight and --e2e-receive-max must be at least 1".into(),
        ));
    }
    if args.e2e_only {
        return e2e::run(&args).await;
    }
    let max_c = args.concurrency.iter().copied().max().unwrap_or(1) as u32;
    let (schema, store) = bench_store(&args.store, max_c + 1).await?;
    let pool = store.pool().clone();
    let sep = if args.store.contains('?') { '&' } else { '?' };
    // The library's sqlx is built without TLS and talks plaintext; pgbench must use the same transport, or
    // its TLS encryption (sslmode=prefer by default) would slow the reference down.
    let pg_url = format!(
        "{}{sep}sslmode=disable&options=-csearch_path%3D{schema}",
        args.store
    );
    let script = pgbench_script(&std::env::temp_dir(), 0, false)?;
    let batch_script = if args.batch > 1 {
        Some((
            pgbench_script(&std::env::temp_dir(), args.batch, false)?,
            pgbench_script(&std::env::temp_dir(), args.batch, true)?,
        ))
    } else {
        None
    };
    let inbox = Arc::new(bench_inbox(&store)?);
    println!(
        "# txinbox bench: PostgreSQL, {}s per figure, median of {} rounds, messages or transactions per second; target inbox/pgbench >= 0.80",
        args.seconds, args.rounds
    );
    let store_url = args.store.clone();
    let bench = Bench {
        args,
        pool,
        inbox,
        pg_url,
        script,
        batch_script,
    };
    let mut result = Ok(());
    for &c in &bench.args.concurrency {
        result = bench.concurrency(c).await;
        if result.is_err() {
            break;
        }
    }
    let _ = std::fs::remove_file(&bench.script);
    if let Some((first, savepoints)) = &bench.batch_script {
        let _ = std::fs::remove_file(first);
        let _ = std::fs::remove_file(savepoints);
    }
    store.close().await;
    drop_schema(&store_url, &schema).await;
    result?;
    e2e::run(&bench.args).await
}

/// A fresh schema on `url` with the inbox's tables and the handler's `bench_tasks`; dropped by [`drop_schema`].
async fn bench_store(
    url: &str,
    connections: u32,
) -> Result<(String, Store<sqlx::Postgres>), LabError> {
    let schema = format!("txinbox_bench_{}", uuid::Uuid::new_v4().simple());
    let store = Store::<sqlx::Postgres>::connect_in_schema(url, &schema, connections).await?;
    sqlx::Executor::execute(
        store.pool(),
        "CREATE TABLE bench_tasks (task_id TEXT NOT NULL, message_id TEXT NOT NULL)",
    )
    .await?;
    Ok((schema, store))
}

/// Drops a schema [`bench_store`] made (best effort: the benchmark's figures are already printed).
async fn drop_schema(url: &str, schema: &str) {
    if let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(url).await {
        let _ = sqlx::Executor::execute(
            &mut conn,
            format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE").as_str(),
        )
        .await;
    }
}

/// The inbox every measurement runs: consumer `bench`, the handler inserting one `bench_tasks` row.
fn bench_inbox(
    store: &Store<sqlx::Postgres>,
) -> Result<BenchInbox<impl Handler<Store<sqlx::Postgres>, Raw>>, LabError> {
    let consumer = ConsumerName::new(CONSUMER).map_err(|e| LabError::Usage(e.to_string()))?;
    Ok(
        Inbox::new(store.clone(), IdentityPolicy::new(consumer)).bind(
            |tx: Tx<sqlx::Postgres>, msg: Message<Raw>| async move {
                sqlx::query(BUSINESS_INSERT)
                    .bind(format!("t-{}", msg.identity.message_id))
                    .bind(&msg.identity.message_id)
                    .execute(&tx)
                    .await?;
                Ok::<_, HandlerError>(())
            },
        ),
    )
}

/// `--purge-impact N`: N expired markers (another consumer's), then the apply rate without a purge, during the
/// maintenance's purge of them, and without again; prints one `purge_impact` line.
async fn purge_impact(args: &BenchArgs, rows: i64) -> Result<(), LabError> {
    use txinbox_core::runtime::maintenance::Table;
    use txinbox_core::{Maintenance, MaintenanceOptions};
    let c = args.concurrency.iter().copied().max().unwrap_or(8).max(1);
    let secs = args.seconds.max(1);
    let (schema, store) = bench_store(&args.store, c as u32 + 4).await?;
    let pool = store.pool().clone();
    let loaded = Instant::now();
    sqlx::query("INSERT INTO txinbox_inbox (consumer_name, source, message_id, payload_hash, received_at, processed_at, retention_until, id_origin) SELECT 'expired', '', 'm-' || g, 'h', now() - interval '40 days', now() - interval '40 days', now() - interval '10 days', 'producer_id' FROM generate_series(1, $1) g")
        .bind(rows)
        .execute(&pool)
        .await?;
    sqlx::Executor::execute(&pool, "ANALYZE txinbox_inbox").await?;
    println!(
        "# purge impact: {rows} expired markers loaded in {:.1}s; apply rate at c={c}, {secs}s per window",
        loaded.elapsed().as_secs_f64()
    );
    let inbox = Arc::new(bench_inbox(&store)?);
    let window = |tag: &'static str| {
        let ib = inbox.clone();
        measure(c, secs, move |t, i| {
            let ib = ib.clone();
            Box::pin(async move {
                let m = message(&format!("{tag}-{t}-{i}"), i);
                expect(&ib, m, "applied").await
            })
        })
    };
    let before = window("before").await?;
    let maintenance = Maintenance::new(store.clone())
        .options(MaintenanceOptions::default().budget(Duration::from_secs(3600)));
    let purge = tokio::spawn(async move { maintenance.run_once().await });
    let during = window("during").await?;
    let purge_running_at_end = !purge.is_finished();
    let report = purge.await.map_err(|e| LabError::Usage(e.to_string()))?;
    let after = window("after").await?;
    let baseline = (before.per_sec + after.per_sec) / 2.0;
    println!(
        "purge_impact markers={rows} apply_before={:.0} apply_during_purge={:.0} apply_after={:.0} during/without={:.2} purged={} purge_seconds={:.1} batches={} purge_covered_the_window={}",
        before.per_sec,
        during.per_sec,
        after.per_sec,
        during.per_sec / baseline,
        report.removed_from(Table::Markers),
        report.elapsed.as_secs_f64(),
        report.batches,
        purge_running_at_end
    );
    store.close().await;
    drop_schema(&args.store, &schema).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The pgbench script is the store's own statement with every parameter given a value of the same shape:
    /// a placeholder left over would mean the statement changed under the benchmark.
    #[test]
    fn the_pgbench_script_binds_every_parameter_of_the_store_statement() {
        let script = script_of(0, false);
        assert!(!script.contains('$'), "{script}");
        assert!(script.contains("ON CONFLICT DO NOTHING"), "{script}");
        assert_eq!(script.matches("INSERT INTO").count(), 2, "{script}");
        assert!(!script.contains("SAVEPOINT"), "{script}");
    }

    /// The batched script sends what a batch's first pass sends: the store's one statement for every marker
    /// (each of its thirteen arrays of ten values), then each message's business insert, one COMMIT, every
    /// message id distinct.
    #[test]
    fn the_batched_pgbench_script_sends_what_a_batch_sends() {
        let script = script_of(10, false);
        assert!(!script.contains('$'), "{script}");
        assert!(!script.contains("SAVEPOINT"), "{script}");
        assert_eq!(script.matches("unnest(ARRAY[").count(), 1, "{script}");
        assert_eq!(script.matches("ARRAY[").count(), 13, "{script}");
        assert_eq!(script.matches("INSERT INTO txinbox_inbox").count(), 1);
        assert_eq!(script.matches("INSERT INTO bench_tasks").count(), 10);
        assert_eq!(script.matches("COMMIT").count(), 1, "{script}");
        for k in 0..10 {
            // In the markers' array of ids, and twice in its business insert (task id, message id).
            assert_eq!(script.matches(&format!("|| '-{k}'")).count(), 3, "{script}");
        }
    }

    /// The savepoint pass's script: per message the store's savepoint, its marker insert and the business
    /// insert, one COMMIT.
    #[test]
    fn the_savepoint_pgbench_script_sends_what_the_savepoint_pass_sends() {
        let script = script_of(10, true);
        assert!(!script.contains('$'), "{script}");
        assert_eq!(script.matches("SAVEPOINT txinbox_delivery").count(), 10);
        assert_eq!(script.matches("INSERT INTO").count(), 20, "{script}");
        assert_eq!(script.matches("COMMIT").count(), 1, "{script}");
        for k in 0..10 {
            assert_eq!(script.matches(&format!("|| '-{k}'")).count(), 3, "{script}");
        }
    }

    fn script_of(batch: usize, savepoints: bool) -> String {
        let path = super::pgbench_script(&std::env::temp_dir(), batch, savepoints).unwrap();
        let script = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        script
    }
}
