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
//! adapter with its default options against `--sqs-endpoint` (`builtin`: an SQS server of the benchmark's own,
//! in this process, that answers at once; or an emulator's URL, moto or LocalStack), a FIFO queue of
//! `--sqs-groups` message groups (64) reached through a latency proxy of our own (half the round trip each
//! way), its line starting with the requests per message the proxy counted. Each line gives
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

use std::sync::Arc;

use txinbox_lab::lab::LabError;

mod args;
mod dynamodb;
mod e2e;
mod fixture;
mod partitions;
mod pgbench;
mod purge;
mod rate;
mod shards;
mod throughput;
pub use args::BenchArgs;
pub use e2e::E2eBroker;

use fixture::{bench_inbox, bench_store, drop_schema};
use pgbench::pgbench_script;
use purge::purge_impact;
use throughput::Bench;

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
