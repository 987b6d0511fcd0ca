//! The command-line arguments of `txinbox-bench` ([`BenchArgs`]).

use crate::E2eBroker;

/// Arguments of `txinbox-bench`. Its `Debug` masks the URLs' passwords and query values.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// PostgreSQL URL (the benchmark works in its own schema, dropped at the end), or `dynamodb://TABLE` for
    /// the DynamoDB store's lines (in tables `TABLE-<random>` and `TABLE-<random>-tasks`, deleted at the end;
    /// see `--dynamodb-single-table`).
    #[arg(long, env = "TXINBOX_BENCH_STORE_URL")]
    pub store: String,
    /// The DynamoDB endpoint of a `dynamodb://` store (DynamoDB Local: `eval "$(bash scripts/dynamodb.sh
    /// start)"` exports it); unset: the standard AWS configuration chain.
    #[arg(long, env = "TXINBOX_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,
    /// With a `dynamodb://` store: the business items in the inbox's own table (a single-table design,
    /// keyed `pk` beside the markers) instead of a table of their own.
    #[arg(long)]
    pub dynamodb_single_table: bool,
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
    /// With `--partitioned`: each cycle also runs a control, the same three windows with the maintenance's
    /// rotation in the middle one at a moment when nothing has expired (it drops nothing), so that the spread
    /// of `middle/without` there shows the drift between windows the drop's figure stands against. Odd
    /// cycles run the control first, even ones the drop first.
    #[arg(long, requires = "partitioned")]
    pub controls: bool,
    /// Messages per transaction of the batch lines and of the end-to-end worker (2 to 64, at most 50 with a
    /// `dynamodb://` store; 1 skips the batch lines and runs the end-to-end worker without batch commit).
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
    /// The SQS endpoint of `--e2e-broker sqs`: `builtin`, the benchmark's own SQS server started in this process
    /// (answers at once: the line measures the adapter), or an emulator's URL (moto:
    /// `eval "$(bash scripts/moto.sh start)"` exports it; LocalStack), which the line then measures too.
    #[arg(long, env = "TXINBOX_SQS_ENDPOINT")]
    pub sqs_endpoint: Option<String>,
    /// Message groups of `--e2e-broker sqs`'s FIFO queue, the messages spread over them in turn: SQS hands out no
    /// message of a group while an earlier one of it is in flight, and the adapter hands a group's messages to
    /// the worker one after another, so fewer groups than places in flight leave places empty.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub sqs_groups: u64,
    /// How long `--sqs-endpoint builtin` remembers a deduplication id (SQS: 5 minutes). The server runs in the
    /// benchmark's process and keeps about 200 bytes a message for this long, which the RSS figures count:
    /// a short window (1) keeps the broker's memory out of the worker's figures (the benchmark sends no message
    /// twice).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub sqs_dedup_window_secs: u64,
    /// Only the end-to-end lines.
    #[arg(long)]
    pub e2e_only: bool,
    /// Instead of the throughput lines: the worker over shards, one PostgreSQL URL each (two or more,
    /// comma-separated; `scripts/pg-shards.sh` makes three): one database against all of them, and the others'
    /// rate while one is unavailable. `--store` is not used.
    #[arg(long, value_delimiter = ',')]
    pub shards: Vec<String>,
}

// Debug for a log line: the stores' URLs without their passwords or query values.
impl std::fmt::Debug for BenchArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use txinbox_core::error::redact_url;
        f.debug_struct("BenchArgs")
            .field("store", &redact_url(&self.store))
            .field(
                "dynamodb_endpoint",
                &self.dynamodb_endpoint.as_deref().map(redact_url),
            )
            .field("dynamodb_single_table", &self.dynamodb_single_table)
            .field("seconds", &self.seconds)
            .field("concurrency", &self.concurrency)
            .field("rounds", &self.rounds)
            .field("pgbench", &self.pgbench)
            .field("purge_impact", &self.purge_impact)
            .field("partitioned", &self.partitioned)
            .field("cycles", &self.cycles)
            .field("width_hours", &self.width_hours)
            .field("controls", &self.controls)
            .field("batch", &self.batch)
            .field("e2e_messages", &self.e2e_messages)
            .field("e2e_round_trip_ms", &self.e2e_round_trip_ms)
            .field("e2e_in_flight", &self.e2e_in_flight)
            .field("e2e_receive_max", &self.e2e_receive_max)
            .field("e2e_receivers", &self.e2e_receivers)
            .field("e2e_receive_loops", &self.e2e_receive_loops)
            .field("e2e_prefetch", &self.e2e_prefetch)
            .field("e2e_rate", &self.e2e_rate)
            .field("e2e_linger_ms", &self.e2e_linger_ms)
            .field("e2e_broker", &self.e2e_broker)
            .field(
                "sqs_endpoint",
                &self.sqs_endpoint.as_deref().map(redact_url),
            )
            .field("sqs_groups", &self.sqs_groups)
            .field("sqs_dedup_window_secs", &self.sqs_dedup_window_secs)
            .field("e2e_only", &self.e2e_only)
            .field(
                "shards",
                &self
                    .shards
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: super::BenchArgs,
    }

    #[test]
    fn debug_of_the_arguments_masks_the_stores_passwords() {
        let cli = Cli::try_parse_from([
            "bench",
            "--store",
            "postgres://bench:s3cretpw@db/bench",
            "--shards",
            "postgres://a:s3creta@db1/x,postgres://b:s3cretb@db2/x",
        ])
        .unwrap();
        let shown = format!("{:?}", cli.args);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("postgres://bench:***@db/bench"), "{shown}");
        assert!(shown.contains("postgres://b:***@db2/x"), "{shown}");
    }
}
