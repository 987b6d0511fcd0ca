//! The end-to-end line: `--e2e-messages` new messages through a [`Worker`] (batch commit `--batch`,
//! `--e2e-in-flight` in flight) from a broker into the inbox on PostgreSQL, at a round trip of
//! `--e2e-round-trip-ms` on every broker request.
//!
//! The brokers (`--e2e-broker`, one line each, in the order given):
//! * `memory`: the in-memory broker, whose receive, settle and renewal each wait the round trip (on its own
//!   deadline thread, so that the wait is exact);
//! * `servicebus`: the Service Bus adapter over REST against the Service Bus emulator, started in this process
//!   on a runtime of its own, every data-plane request delayed by the round trip (the emulator's `delay`
//!   fault); the line adds the requests the adapter sent per message, as the emulator counted them;
//! * `sqs`: the SQS adapter against an SQS server (`--sqs-endpoint`: `builtin`, the benchmark's own in this
//!   process, or an emulator's URL, moto or LocalStack) through a latency proxy of our own (half the round trip
//!   each way); the line adds the requests per message, as the proxy counted them.
//!
//! The producer keeps at most a few thousand messages waiting in the broker, as a steady stream does, so that
//! the broker's own memory does not hide the worker's.

mod proxy;
mod servicebus;
mod sqs;
mod sqs_server;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use txinbox_core::{CancellationToken, Delivery, OutcomeKind, Receiver, Worker, WorkerOptions};
use txinbox_lab::lab::LabError;

use crate::fixture::{bench_inbox, bench_store, drop_schema, CONSUMER};
use crate::BenchArgs;

/// The broker of an end-to-end line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum E2eBroker {
    /// The in-memory broker with a simulated round trip.
    Memory,
    /// The Service Bus adapter (REST) against the in-process emulator, each request delayed by the round trip.
    Servicebus,
    /// The SQS adapter against an SQS server (`--sqs-endpoint builtin` or an emulator's URL) behind a latency
    /// proxy.
    Sqs,
}

/// Runs the end-to-end line of each `--e2e-broker`.
/// A listener on a free loopback port and its `http://` URL, for the benchmark's own servers (`what` names
/// the server in the error).
pub(crate) async fn loopback_listener(
    what: &str,
) -> Result<(tokio::net::TcpListener, std::net::SocketAddr), LabError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| LabError::Usage(format!("{what} cannot listen: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| LabError::Usage(format!("{what}'s address: {e}")))?;
    Ok((listener, addr))
}

pub(crate) async fn run(args: &BenchArgs) -> Result<(), LabError> {
    if args.e2e_messages == 0 {
        return Ok(());
    }
    for broker in &args.e2e_broker {
        match broker {
            E2eBroker::Memory => memory(args).await?,
            E2eBroker::Servicebus => servicebus::run(args).await?,
            E2eBroker::Sqs => sqs::run(args).await?,
        }
    }
    Ok(())
}

/// What the end-to-end run needs of a broker: a way in and a way out.
pub(crate) trait Feed: Clone + Send + Sync + 'static {
    /// The worker's receiver.
    type Receiver: Receiver;
    /// Puts these messages (id, body) in the queue, in order.
    fn send_all(&self, batch: Vec<(String, String)>) -> impl Future<Output = ()> + Send;
    /// The most messages the producer keeps waiting (default: 2,000, or 20 per place in flight).
    fn depth(&self, in_flight: usize) -> u64 {
        2_000.max(in_flight as u64 * 20)
    }
    /// Messages sent and not settled yet.
    fn waiting(&self) -> u64;
    /// A receiver for one worker.
    fn receiver(&self) -> impl Future<Output = Result<Self::Receiver, LabError>> + Send;
}

/// What one end-to-end run measured.
pub(crate) struct Run {
    pub(crate) line: String,
    pub(crate) applied: u64,
}

/// Sends the messages, runs the workers until every message is settled, and measures.
pub(crate) async fn drive<F: Feed>(args: &BenchArgs, feed: F) -> Result<Run, LabError> {
    let n = args.e2e_messages;
    let in_flight = args.e2e_in_flight;
    let (schema, store) = bench_store(&args.store, in_flight as u32 + 1).await?;
    let timing = Arc::new(Timing::default());
    let latency = Arc::new(Latency::new());
    let processor = Timed {
        inner: bench_inbox(&store)?,
        timing: timing.clone(),
        latency: latency.clone(),
    };
    let sent = Arc::new(AtomicU64::new(0));
    // Producer: keeps the queue fed, never more than `depth` waiting; or, with `--e2e-rate`, a steady stream
    // of that many messages per second.
    let depth = feed.depth(in_flight);
    let rate = args.e2e_rate;
    let producer = {
        let (feed, sent) = (feed.clone(), sent.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            let mut next = 0u64;
            while next < n {
                let due = if rate > 0 {
                    ((start.elapsed().as_secs_f64() * rate as f64) as u64).min(n)
                } else if feed.waiting() < depth {
                    (next + depth / 4).min(n)
                } else {
                    next
                };
                if next < due {
                    let batch = (next..due)
                        .map(|k| {
                            let body =
                                format!("{{\"opportunity\":\"o-{k}\",\"meeting\":\"m-{k}\"}}");
                            (format!("e2e-{k}"), body)
                        })
                        .collect();
                    feed.send_all(batch).await;
                    next = due;
                }
                sent.store(next, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    // Memory sampler: start, after the first tenth, end, highest.
    let rss_start = rss_kib();
    let rss_max = Arc::new(AtomicU64::new(rss_start.unwrap_or(0)));
    let rss_warm = Arc::new(AtomicU64::new(0));
    let stop_sampler = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (feed, sent, max, warm, stop) = (
            feed.clone(),
            sent.clone(),
            rss_max.clone(),
            rss_warm.clone(),
            stop_sampler.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Some(kib) = rss_kib() {
                    max.fetch_max(kib, Ordering::Relaxed);
                    let done = sent.load(Ordering::Relaxed).saturating_sub(feed.waiting());
                    if done >= n / 10 && warm.load(Ordering::Relaxed) == 0 {
                        warm.store(kib, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let started = Instant::now();
    // When the last message was settled: the run's end. The workers stop after it, once their receives in
    // flight come back (a long poll of the broker's wait on an empty queue), which is not counted.
    let finished: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    // `--e2e-receivers` workers in this process share the in-flight deliveries, each with its receive loops.
    let receivers = args.e2e_receivers.clamp(1, in_flight);
    let mut workers = Vec::with_capacity(receivers);
    let mut receive_loops = 1;
    for r in 0..receivers {
        let share = in_flight / receivers + usize::from(r < in_flight % receivers);
        let (f, s, done) = (feed.clone(), sent.clone(), finished.clone());
        let mut opts = WorkerOptions::default()
            .concurrency(share)
            .prefetch(args.e2e_prefetch / receivers)
            .batch_size(args.e2e_receive_max)
            .batch_commit(args.batch)
            .batch_linger(Duration::from_millis(args.e2e_linger_ms));
        if let Some(n) = args.e2e_receive_loops {
            opts = opts.receive_loops(n);
        }
        receive_loops = opts.get_receive_loops();
        let worker = Worker::new(feed.receiver().await?, processor.clone()).options(opts);
        workers.push(tokio::spawn(worker.run_until(async move {
            loop {
                if s.load(Ordering::Relaxed) >= n && f.waiting() == 0 {
                    done.get_or_init(Instant::now);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })));
    }
    let mut report = txinbox_core::WorkerReport::default();
    for w in workers {
        report.merge(w.await.map_err(|e| LabError::Usage(e.to_string()))?);
    }
    let secs = finished
        .get()
        .map_or_else(|| started.elapsed(), |at| *at - started)
        .as_secs_f64();
    stop_sampler.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    let _ = producer.await;
    let rss_end = rss_kib();
    // The sampler's last look may come before the end's: the highest is the higher of the two.
    if let Some(end) = rss_end {
        rss_max.fetch_max(end, Ordering::Relaxed);
    }
    let applied = report.count(OutcomeKind::Applied);
    let rows = store.inbox_rows(CONSUMER).await?;
    let mib =
        |k: Option<u64>| k.map_or_else(|| "?".to_owned(), |k| format!("{:.1}", k as f64 / 1024.0));
    let ms = |q: Option<f64>| q.map_or_else(|| "?".to_owned(), |q| format!("{q:.1}"));
    let warm = Some(rss_warm.load(Ordering::Relaxed)).filter(|k| *k > 0);
    let growth = match (warm, rss_end) {
        (Some(w), Some(e)) => format!("{:+.1}%", (e as f64 - w as f64) / w as f64 * 100.0),
        _ => "?".to_owned(),
    };
    let line = format!(
        "batch_commit={} in_flight={in_flight} prefetch={} linger_ms={} rate={rate} apply_settle_ms_mean={:.1} messages_per_apply_call={:.1} latency_ms_p50={} latency_ms_p99={} latency_ms_max={:.1} receivers={receivers} receive_loops={receive_loops} receive_max={} broker_round_trip_ms={} messages={n} applied={applied} inbox_rows={rows} seconds={secs:.1} msgs_per_s={:.0} rss_mib start={} after_first_tenth={} end={} max={} end_vs_first_tenth={growth} ({report})",
        args.batch,
        args.e2e_prefetch,
        args.e2e_linger_ms,
        timing.mean_ms(),
        applied as f64 / timing.calls.load(Ordering::Relaxed).max(1) as f64,
        ms(latency.quantile_ms(0.50)),
        ms(latency.quantile_ms(0.99)),
        latency.max_ms(),
        args.e2e_receive_max,
        args.e2e_round_trip_ms,
        applied as f64 / secs,
        mib(rss_start),
        mib(warm),
        mib(rss_end),
        mib(Some(rss_max.load(Ordering::Relaxed)).filter(|k| *k > 0)),
    );
    store.close().await;
    drop_schema(&args.store, &schema).await;
    if applied != n || rows != n as i64 {
        return Err(LabError::Usage(format!(
            "end-to-end run: {applied} applied and {rows} inbox rows of {n} messages"
        )));
    }
    Ok(Run { line, applied })
}

/// The in-memory broker as a [`Feed`].
#[derive(Clone)]
struct Memory(txinbox_core::broker::mem::MemoryQueue);

impl Feed for Memory {
    type Receiver = txinbox_core::broker::mem::MemoryReceiver;
    async fn send_all(&self, batch: Vec<(String, String)>) {
        use txinbox_core::broker::mem::OutgoingMessage;
        for (id, body) in batch {
            self.0
                .send(OutgoingMessage::new(body).cloudevent("urn.bench", &id, "bench.event"));
        }
    }
    fn waiting(&self) -> u64 {
        let s = self.0.state();
        (s.visible + s.in_flight + s.delayed) as u64
    }
    async fn receiver(&self) -> Result<Self::Receiver, LabError> {
        Ok(self.0.receiver())
    }
}

/// The line of the in-memory broker: `queue_in_flight_max` is the most messages it saw received and not
/// settled at once (round trips included), `broker_round_trip_ms_measured` how long its round trips lasted.
async fn memory(args: &BenchArgs) -> Result<(), LabError> {
    use txinbox_core::broker::mem::{MemoryQueue, QueueOptions};
    let queue = MemoryQueue::new(
        QueueOptions::default()
            .round_trip(Duration::from_millis(args.e2e_round_trip_ms))
            .wait(Duration::from_millis(20))
            .visibility_timeout(Duration::from_secs(30)),
    );
    let run = drive(args, Memory(queue.clone())).await?;
    println!(
        "e2e worker broker=memory queue_in_flight_max={} broker_round_trip_ms_measured={} {}",
        queue.in_flight_max(),
        queue.round_trip_mean().map_or_else(
            || "?".to_owned(),
            |d| format!("{:.2}", d.as_secs_f64() * 1e3)
        ),
        run.line
    );
    Ok(())
}

/// Resident memory of this process in KiB (`VmRSS` of `/proc/self/status`); `None` off Linux.
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// How long the end-to-end worker's processor calls took (apply and settle of one batch or delivery).
#[derive(Default)]
struct Timing {
    calls: AtomicU64,
    nanos: AtomicU64,
}

impl Timing {
    fn record(&self, since: Instant) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.nanos
            .fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
    fn mean_ms(&self) -> f64 {
        let calls = self.calls.load(Ordering::Relaxed).max(1);
        self.nanos.load(Ordering::Relaxed) as f64 / calls as f64 / 1e6
    }
}

/// The end-to-end latency of each message, from its send to the answer of its settle, in a histogram whose
/// buckets grow by 2 % from 0.1 ms (allocated once, so that it does not move the memory figures).
struct Latency {
    buckets: Vec<AtomicU64>,
    max_us: AtomicU64,
}

impl Latency {
    const GROWTH: f64 = 1.02;
    const FIRST_US: f64 = 100.0;
    const BUCKETS: usize = 800;

    fn new() -> Self {
        Self {
            buckets: (0..Self::BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max_us: AtomicU64::new(0),
        }
    }

    fn record(&self, since_send: chrono::TimeDelta) {
        let us = since_send.num_microseconds().unwrap_or(i64::MAX).max(0) as u64;
        self.max_us.fetch_max(us, Ordering::Relaxed);
        let i = if (us as f64) < Self::FIRST_US {
            0
        } else {
            ((us as f64 / Self::FIRST_US).ln() / Self::GROWTH.ln()) as usize + 1
        };
        self.buckets[i.min(Self::BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// The upper bound of the bucket holding quantile `q`, in milliseconds (2 % wide: an upper estimate), never
    /// above the largest latency recorded.
    fn quantile_ms(&self, q: f64) -> Option<f64> {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        let i = counts.iter().position(|c| {
            seen += c;
            seen >= rank
        })?;
        Some((Self::FIRST_US * Self::GROWTH.powi(i as i32) / 1000.0).min(self.max_ms()))
    }

    fn max_ms(&self) -> f64 {
        self.max_us.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

/// A processor that times its inner one's calls and each message's latency (clones share both).
#[derive(Clone)]
struct Timed<P> {
    inner: P,
    timing: Arc<Timing>,
    latency: Arc<Latency>,
}

impl<P> Timed<P> {
    /// Records the latency of messages sent at `sent`, settled now.
    fn settled(&self, sent: &[Option<chrono::DateTime<chrono::Utc>>]) {
        let now = chrono::Utc::now();
        for s in sent.iter().flatten() {
            self.latency.record(now - *s);
        }
    }
}

impl<D: Delivery, P: txinbox_core::Processor<D>> txinbox_core::Processor<D> for Timed<P> {
    fn consumer(&self) -> &str {
        self.inner.consumer()
    }
    async fn process(&self, delivery: D, stop: CancellationToken) -> txinbox_core::Outcome {
        let t = Instant::now();
        let sent = [delivery.message().enqueued_at];
        let o = self.inner.process(delivery, stop).await;
        self.timing.record(t);
        self.settled(&sent);
        o
    }
    fn max_payload_bytes(&self) -> Option<usize> {
        self.inner.max_payload_bytes()
    }
    fn started(&self) {
        self.inner.started()
    }
    fn refused(&self) -> Option<String> {
        self.inner.refused()
    }
    async fn process_batch(
        &self,
        deliveries: Vec<D>,
        stop: CancellationToken,
    ) -> Vec<txinbox_core::Outcome> {
        let t = Instant::now();
        let sent: Vec<_> = deliveries.iter().map(|d| d.message().enqueued_at).collect();
        let o = self.inner.process_batch(deliveries, stop).await;
        self.timing.record(t);
        self.settled(&sent);
        o
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use txinbox_core::{CancellationToken, Outcome, Processor};
    use txinbox_testkit::NoopDelivery;

    /// A processor that answers every defaulted method of [`Processor`] with something else than the default.
    struct Limited;

    impl Processor<NoopDelivery> for Limited {
        fn consumer(&self) -> &str {
            "limited"
        }
        async fn process(&self, _: NoopDelivery, _: CancellationToken) -> Outcome {
            Outcome::Interrupted
        }
        fn max_payload_bytes(&self) -> Option<usize> {
            Some(4096)
        }
        fn refused(&self) -> Option<String> {
            Some("limited refuses".to_owned())
        }
    }

    /// The timing wrapper answers for its processor: its body limit (what the shard router reads before
    /// routing) and its refusal, not the trait's defaults.
    #[test]
    fn the_timed_processor_answers_as_its_processor() {
        let t = super::Timed {
            inner: Limited,
            timing: Arc::default(),
            latency: Arc::new(super::Latency::new()),
        };
        assert_eq!(Processor::<NoopDelivery>::consumer(&t), "limited");
        assert_eq!(Processor::<NoopDelivery>::max_payload_bytes(&t), Some(4096));
        assert_eq!(
            Processor::<NoopDelivery>::refused(&t).as_deref(),
            Some("limited refuses")
        );
    }

    /// A quantile is the upper bound of the bucket holding it: at or above the true value, at most 2 % over.
    #[test]
    fn latency_quantiles_bound_the_true_value_within_one_bucket() {
        let l = super::Latency::new();
        assert_eq!(l.quantile_ms(0.5), None);
        for ms in 1..=1000 {
            l.record(chrono::TimeDelta::milliseconds(ms));
        }
        for (q, truth) in [(0.5, 500.0), (0.99, 990.0), (1.0, 1000.0)] {
            let got = l.quantile_ms(q).unwrap();
            assert!(
                got >= truth && got <= truth * super::Latency::GROWTH,
                "q={q}: {got} for {truth}"
            );
        }
        assert_eq!(l.max_ms(), 1000.0);
        assert_eq!(
            l.quantile_ms(1.0),
            Some(1000.0),
            "no quantile above the largest latency"
        );
        // Below the first bucket's bound, and far beyond the last: counted, not lost.
        l.record(chrono::TimeDelta::microseconds(5));
        l.record(chrono::TimeDelta::days(3650));
        assert_eq!(l.quantile_ms(0.0001), Some(0.1));
        let total: u64 = l
            .buckets
            .iter()
            .map(|b| b.load(super::Ordering::Relaxed))
            .sum();
        assert_eq!(total, 1002);
    }
}
