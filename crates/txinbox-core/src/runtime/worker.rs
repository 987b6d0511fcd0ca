//! The worker runtime: receive with bounded concurrency, keep leases alive, process through the inbox, and
//! shut down gracefully.
//!
//! Shutdown: when the shutdown future resolves the worker stops receiving and lets in-flight deliveries finish
//! (commit, then settle) for up to [`WorkerOptions::shutdown_timeout`]. Past that deadline it signals the
//! processors to stop: a delivery that has not committed rolls back and is released; one that has committed
//! always goes on to settle. The worker never stops between COMMIT and settle.
//!
//! A receive (long poll) still in flight when shutdown begins is let finish (it lasts at most the adapter's
//! long-poll wait, and never longer than [`WorkerOptions::shutdown_timeout`] or
//! [`WorkerOptions::shutdown_receive_wait`]); whatever it brought is handed straight back to the broker
//! ([`Delivery::release`] with no delay: SQS visibility 0, Service Bus unlock), so another worker receives
//! those messages at once instead of after their lock or visibility timeout. An idle worker therefore takes up
//! to the long-poll wait to stop.
//!
//! Receive errors: the pause after a failed receive doubles from [`WorkerOptions::receive_error_backoff`] up
//! to [`WorkerOptions::receive_error_backoff_max`], with jitter (each pause is drawn between half and all of
//! it). The worker logs once when receives start failing, once when the kind of error changes and once when
//! they recover, never once per retry; every failure is counted in `txinbox_receive_errors_total{consumer,
//! kind}`. When receives keep failing with an error a retry cannot fix (unauthorized, entity not found,
//! configuration: a key rotated, a permission removed, a queue deleted) for
//! [`WorkerOptions::give_up_after`], the worker stops as on shutdown and says why in
//! [`WorkerReport::gave_up`]: a process should then exit non-zero so that its supervisor sees it.
//!
//! Receive ahead ([`WorkerOptions::prefetch`]): by default the worker asks the broker only for as many
//! messages as it has free slots, so a slot is held from the receive request to the settle's answer and at
//! most [`WorkerOptions::concurrency`] messages are out of the queue at once; each slot then spends two broker
//! round trips (receive and settle) beside the work. With a prefetch of `n` the worker receives up to `n`
//! more while its slots are busy: those deliveries wait for a slot with their leases kept alive, so that a
//! slot freed by a settle finds its next delivery already received. Up to `concurrency + n` messages are then
//! out of the queue (invisible on SQS, locked on Service Bus), at most `concurrency` of them being applied or
//! settled. When shutdown begins, a prefetched delivery still waiting for its slot is handed back at once
//! (released with no delay, outcome [`Outcome::Interrupted`]) rather than applied during the drain.
//!
//! Receive loops ([`WorkerOptions::receive_loops`]): one loop has one receive in flight at a time, so against a
//! distant broker slots freed during a receive wait for the next one. Several loops (each on a
//! [`Receiver::fork`] of the receiver) share the same places out of the queue and the same slots: more
//! receives in flight, not more messages out of the queue. One loop at a time waits for places, and takes
//! every free one (up to [`WorkerOptions::batch_size`]), so the places a settled batch frees go to one
//! receive rather than to several receives of one message each.
//!
//! Batch commit ([`WorkerOptions::batch_commit`]) applies the deliveries of a receive in one transaction; with
//! [`WorkerOptions::batch_linger`] a batch that one receive did not fill waits a little for the next receives
//! (never for a receive to be cut short; at shutdown it goes at once).
//!
//! Messages of one FIFO group are not serialised here: an adapter whose broker can hand out several messages
//! of a group at once (SQS FIFO in one batch) holds the later ones back itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::{Delivery, Receiver};
use crate::error::{BrokerError, BrokerErrorKind};
use crate::pipeline::outcome::{Outcome, OutcomeKind};
use crate::runtime::lease::{keep_alive, LeaseGuard, LeaseOptions};

/// A delivery handed to a [`Processor`] by the [`Worker`]: it stops the lease keeper the moment a settle
/// begins, so a renewal racing with the settle is never mistaken for a lost lock.
pub struct LeasedDelivery<D> {
    inner: D,
    stop_lease: Option<CancellationToken>,
}

impl<D> LeasedDelivery<D> {
    fn stop(&self) {
        if let Some(t) = &self.stop_lease {
            t.cancel();
        }
    }
}

impl<D: Delivery> Delivery for LeasedDelivery<D> {
    fn message(&self) -> &crate::ReceivedMessage {
        self.inner.message()
    }
    async fn ack(self) -> Result<(), crate::BrokerError> {
        self.stop();
        self.inner.ack().await
    }
    async fn release(self, delay: Duration) -> Result<(), crate::BrokerError> {
        self.stop();
        self.inner.release(delay).await
    }
    async fn dead_letter(self, why: crate::DeadLetter) -> Result<(), crate::BrokerError> {
        self.stop();
        self.inner.dead_letter(why).await
    }
    fn lease(&self) -> Option<Arc<dyn crate::Lease>> {
        self.inner.lease()
    }
}

/// Processes one delivery to a known outcome, settling it. Implemented by the store's inbox.
pub trait Processor<D: Delivery>: Send + Sync + 'static {
    /// The consumer name (metric label).
    fn consumer(&self) -> &str;

    /// Process and settle `delivery`. When `stop` is cancelled before COMMIT, roll back, release the delivery
    /// and return [`Outcome::Interrupted`]; after COMMIT, ignore it and settle.
    fn process(&self, delivery: D, stop: CancellationToken)
        -> impl Future<Output = Outcome> + Send;

    /// Called once when a worker starts, before its first receive: a processor registers its metrics here
    /// (at zero, so that a monitoring system sees the first event as an increase).
    fn started(&self) {}

    /// Process and settle the deliveries one receive brought together (in receive order), returning their
    /// outcomes in the same order. The default processes them one after the other; the inbox applies them
    /// in one transaction ([`WorkerOptions::batch_commit`]). `stop` means what it means for
    /// [`Processor::process`].
    fn process_batch(
        &self,
        deliveries: Vec<D>,
        stop: CancellationToken,
    ) -> impl Future<Output = Vec<Outcome>> + Send {
        async move {
            let mut out = Vec::with_capacity(deliveries.len());
            for d in deliveries {
                out.push(self.process(d, stop.clone()).await);
            }
            out
        }
    }
}

/// The largest [`WorkerOptions::batch_commit`]: PostgreSQL keeps up to 64 subtransactions of a transaction in
/// shared memory; past that, every other session's snapshot pays for it.
pub const MAX_BATCH_COMMIT: usize = 64;

/// The longest [`WorkerOptions::batch_linger`]: past a second, a larger receive
/// ([`WorkerOptions::batch_size`]) gathers a batch better than waiting does.
pub const MAX_BATCH_LINGER: Duration = Duration::from_secs(1);

/// The most [`WorkerOptions::receive_loops`].
pub const MAX_RECEIVE_LOOPS: usize = 16;

/// Worker settings.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Deliveries processed at once (default 8).
    pub concurrency: usize,
    /// Most deliveries asked for in one receive (default 10, the SQS maximum).
    pub batch_size: usize,
    /// How long in-flight deliveries may run after shutdown begins (default 30 s).
    pub shutdown_timeout: Duration,
    /// What the lease keeper cannot learn from a lease (the maximum total hold). The cadence and the
    /// extension come from each delivery's [`Lease::duration`](crate::Lease::duration): renewed every third of
    /// it, so the defaults fit any visibility timeout or lock duration.
    pub lease: LeaseOptions,
    /// Pause after a failed receive (default 1 s).
    pub receive_error_backoff: Duration,
    /// Deliveries received ahead of a free slot, at most (default 0: a receive asks only for free slots). See
    /// [`WorkerOptions::prefetch`].
    pub prefetch: usize,
    /// Receive loops, each with one receive in flight at a time (default 1). See
    /// [`WorkerOptions::receive_loops`].
    pub receive_loops: usize,
    /// Most deliveries of one receive applied in one database transaction (default 1: one transaction per
    /// delivery). See [`WorkerOptions::batch_commit`].
    pub batch_commit: usize,
    /// How long a batch that is not full waits for the following receives to fill it (default zero: a batch
    /// is what one receive brought). See [`WorkerOptions::batch_linger`].
    pub batch_linger: Duration,
    /// Longest pause between failed receives: the pause doubles from
    /// [`receive_error_backoff`](Self::receive_error_backoff) up to this (default 30 s).
    pub receive_error_backoff_max: Duration,
    /// How long receives may keep failing with an error a retry cannot fix (unauthorized, entity not found,
    /// configuration) before the worker stops and reports it in [`WorkerReport::gave_up`] (default 5 min;
    /// `None`: never give up).
    pub give_up_after: Option<Duration>,
    /// How long a receive (long poll) still in flight at shutdown is waited for, so that what it brings is
    /// handed back at once (default `None`: until it ends, at most the adapter's long-poll wait and never
    /// longer than [`shutdown_timeout`](Self::shutdown_timeout)). An idle worker therefore takes up to the
    /// long-poll wait (20 s by default) to stop. `Some(Duration::ZERO)` stops at once and drops the poll:
    /// messages the broker hands to it then wait for their visibility timeout or lock.
    pub shutdown_receive_wait: Option<Duration>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            concurrency: 8,
            batch_size: 10,
            shutdown_timeout: Duration::from_secs(30),
            lease: LeaseOptions::default(),
            receive_error_backoff: Duration::from_secs(1),
            prefetch: 0,
            receive_loops: 1,
            batch_commit: 1,
            batch_linger: Duration::ZERO,
            receive_error_backoff_max: Duration::from_secs(30),
            give_up_after: Some(Duration::from_secs(300)),
            shutdown_receive_wait: None,
        }
    }
}

impl WorkerOptions {
    /// Sets the concurrency (at least 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }
    /// Sets the receive batch size (at least 1).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }
    /// Sets the shutdown timeout.
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }
    /// Sets the lease options.
    pub fn lease(mut self, lease: LeaseOptions) -> Self {
        self.lease = lease;
        self
    }
    /// Sets the first pause after a failed receive (it doubles up to
    /// [`receive_error_backoff_max`](Self::receive_error_backoff_max) while receives keep failing).
    pub fn receive_error_backoff(mut self, d: Duration) -> Self {
        self.receive_error_backoff = d;
        self
    }
    /// Applies up to `n` deliveries of one receive in one database transaction (1 to 64; 1, the default,
    /// turns batching off): every marker in one statement, then the handlers; when a handler fails, that
    /// delivery keeps its failure and the others are applied again, each under its own savepoint. Each
    /// delivery still gets the outcome it would get alone; all are settled after the one COMMIT. Fewer commits
    /// (one WAL flush for the batch) against a longer transaction: see the crate's `docs/batching.md` for the
    /// trade-off.
    pub fn batch_commit(mut self, n: usize) -> Self {
        self.batch_commit = n.clamp(1, MAX_BATCH_COMMIT);
        self
    }
    /// With [`batch_commit`](Self::batch_commit) above 1, lets a batch that one receive did not fill wait up to
    /// `d` (from its first delivery's arrival) for the following receives to fill it, at most
    /// [`MAX_BATCH_LINGER`] (default zero: a batch is what one receive brought). Worth it when messages
    /// arrive a few at a time: fewer, larger transactions for up to `d` more latency per message. The
    /// deliveries' leases are kept alive while they wait; a receive still waiting (long poll) when the linger
    /// ends is not cut short (what it brings goes to the next batch); at shutdown a waiting batch is processed
    /// at once.
    pub fn batch_linger(mut self, d: Duration) -> Self {
        self.batch_linger = d.min(MAX_BATCH_LINGER);
        self
    }
    /// Receives up to `n` deliveries ahead of a free slot (default 0). They wait for a slot with their leases
    /// kept alive, so a slot freed by a settle does not wait a receive round trip for its next delivery; up to
    /// `concurrency + n` messages are then out of the queue at once (invisible or locked), at most
    /// `concurrency` being applied or settled. Worth it when the broker's round trip is long beside the work
    /// (see the crate's `docs/batching.md`); a prefetched message waits longer before it is applied, so keep
    /// `n` well under what the lease allows (a lease is renewed while it waits, up to
    /// [`LeaseOptions::max_total`]).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }
    /// Runs `n` receive loops (at least 1, at most [`MAX_RECEIVE_LOOPS`]; default 1), each with one receive in
    /// flight at a time, sharing the worker's places out of the queue (`concurrency + prefetch`) and its
    /// slots: when the broker is far away, one loop waits a round trip per receive while slots sit free, and
    /// several fill them sooner without taking more messages out of the queue. The further loops receive
    /// through [`Receiver::fork`]; a receiver that cannot fork runs one loop (logged).
    pub fn receive_loops(mut self, n: usize) -> Self {
        self.receive_loops = n.clamp(1, MAX_RECEIVE_LOOPS);
        self
    }
    /// Sets the longest pause between failed receives (at least the first pause).
    pub fn receive_error_backoff_max(mut self, d: Duration) -> Self {
        self.receive_error_backoff_max = d;
        self
    }
    /// Sets how long receives may keep failing with an error a retry cannot fix before the worker gives up
    /// (`None`: never).
    pub fn give_up_after(mut self, d: Option<Duration>) -> Self {
        self.give_up_after = d;
        self
    }
    /// Sets how long a receive in flight at shutdown is waited for (`None`: until it ends, within the
    /// shutdown timeout; zero: dropped at once).
    pub fn shutdown_receive_wait(mut self, d: Option<Duration>) -> Self {
        self.shutdown_receive_wait = d;
        self
    }
}

/// Whether a receive error is one a retry cannot fix: the worker gives up on it after
/// [`WorkerOptions::give_up_after`].
pub fn is_persistent_receive_error(kind: BrokerErrorKind) -> bool {
    matches!(
        kind,
        BrokerErrorKind::Unauthorized
            | BrokerErrorKind::EntityNotFound
            | BrokerErrorKind::Configuration
    )
}

/// The pause after the `failures`-th failed receive in a row (1 = the first): `first` doubled per failure up
/// to `max`, then a random point between half and all of it (`unit` in `0.0..1.0` is the random draw).
pub fn receive_backoff(first: Duration, max: Duration, failures: u32, unit: f64) -> Duration {
    let max = max.max(first);
    let doubled = first.saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(31)));
    let full = doubled.min(max);
    full.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
}

/// A random draw in `0.0..1.0` for the jitter (std's per-process random hash keys; no RNG dependency).
fn jitter_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Receives failing in a row, for the state-change log lines and the give-up clock.
struct Failing {
    failures: u32,
    kind: BrokerErrorKind,
    since: Instant,
    /// When the first error a retry cannot fix came, in this run of failures.
    persistent_since: Option<Instant>,
}

/// What a worker did, by outcome label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Count per outcome label (`applied`, `duplicate`, ...).
    pub outcomes: BTreeMap<OutcomeKind, u64>,
    /// Failed receives.
    pub receive_errors: u64,
    /// Leases lost while a handler ran.
    pub leases_lost: u64,
    /// Why the worker gave up (receives kept failing with an error a retry cannot fix for
    /// [`WorkerOptions::give_up_after`]): `None` when it stopped on shutdown or when idle. A process should
    /// exit non-zero when this is set.
    pub gave_up: Option<String>,
}

impl WorkerReport {
    /// Count for one outcome label.
    pub fn count(&self, kind: OutcomeKind) -> u64 {
        self.outcomes.get(&kind).copied().unwrap_or(0)
    }
    /// Total deliveries processed.
    pub fn total(&self) -> u64 {
        self.outcomes.values().sum()
    }
}

/// `WorkerReport applied=3 duplicate=1 receive_errors=0 leases_lost=0`: every outcome seen, then the
/// worker's own counts, one line.
impl std::fmt::Display for WorkerReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerReport")?;
        for (kind, n) in &self.outcomes {
            write!(f, " {kind}={n}")?;
        }
        write!(
            f,
            " receive_errors={} leases_lost={}",
            self.receive_errors, self.leases_lost
        )?;
        if let Some(why) = &self.gave_up {
            write!(f, " gave_up={why:?}")?;
        }
        Ok(())
    }
}

/// A worker: one receiver (forked for each further [`WorkerOptions::receive_loops`]), one processor.
pub struct Worker<R, P> {
    receiver: R,
    processor: Arc<P>,
    opts: WorkerOptions,
    health: Option<crate::runtime::health::Health>,
}

impl<R, P> Worker<R, P>
where
    R: Receiver,
    P: Processor<LeasedDelivery<R::Delivery>>,
{
    /// A worker with default options.
    pub fn new(receiver: R, processor: P) -> Self {
        Self {
            receiver,
            processor: Arc::new(processor),
            opts: WorkerOptions::default(),
            health: None,
        }
    }

    /// Reports the worker's liveness and readiness on `health` (see [`crate::health`]).
    pub fn health(mut self, health: crate::runtime::health::Health) -> Self {
        self.health = Some(health);
        self
    }

    /// Replaces the options.
    pub fn options(mut self, opts: WorkerOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Runs until `shutdown` resolves, then drains as described in the module docs.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> WorkerReport {
        self.run(shutdown, false).await
    }

    /// Runs until the queue is idle: two receives in a row (full long polls) bring nothing while no delivery
    /// is in flight; then stops like a shutdown and returns the report. For tests and batch jobs. Messages
    /// released with a delay longer than that (a retry backoff) are left for the next run.
    pub async fn run_until_idle(self) -> WorkerReport {
        self.run(std::future::pending(), true).await
    }

    async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
        until_idle: bool,
    ) -> WorkerReport {
        // `out_of_queue`: messages out of the queue (from the receive request to the settle's answer); `slots`:
        // deliveries being applied or settled. Without prefetch the two are the same number, and a delivery
        // never waits for its slot.
        let out_of_queue = Arc::new(Semaphore::new(
            self.opts.concurrency.saturating_add(self.opts.prefetch),
        ));
        let consumer = self.processor.consumer().to_owned();
        let dispatch = Dispatch {
            processor: self.processor.clone(),
            slots: Arc::new(Semaphore::new(self.opts.concurrency)),
            concurrency: self.opts.concurrency,
            stop: CancellationToken::new(),
            // Cancelled when the receives end: a delivery still waiting for its slot is handed back unapplied.
            draining: CancellationToken::new(),
            report: Arc::default(),
            consumer: consumer.clone(),
            tracker: TaskTracker::new(),
        };
        let mut receivers = vec![self.receiver];
        while receivers.len() < self.opts.receive_loops {
            match receivers[0].fork() {
                Some(r) => receivers.push(r),
                None => {
                    tracing::warn!(
                        consumer,
                        receive_loops = self.opts.receive_loops,
                        "this receiver cannot fork (Receiver::fork): running one receive loop"
                    );
                    break;
                }
            }
        }
        self.processor.started();
        for state in [Holding::WAITING, Holding::PROCESSING] {
            metrics::gauge!(crate::metrics::WORKER_DELIVERIES, "consumer" => consumer.clone(), "state" => state)
                .set(0.0);
        }
        let health = self.health.take();
        if let Some(h) = &health {
            h.worker_started();
        }
        // Cancelled by the shutdown, or by a loop that gives up: every loop stops receiving.
        let stopping = CancellationToken::new();
        let places_gate = tokio::sync::Mutex::new(());
        let ctx = LoopContext {
            opts: &self.opts,
            out_of_queue: &out_of_queue,
            places_gate: &places_gate,
            dispatch: &dispatch,
            health: health.as_ref(),
            stopping: &stopping,
            until_idle,
        };
        let loops = futures::future::join_all(receivers.into_iter().map(|r| ctx.receive(r)));
        tokio::pin!(loops);
        tokio::select! {
            _ = &mut loops => {}
            _ = shutdown => {
                stopping.cancel();
                loops.await;
            }
        }
        let tracker = &dispatch.tracker;
        tracing::info!(
            consumer,
            in_flight = tracker.len(),
            "worker stopping: no more receives"
        );
        if let Some(h) = &health {
            h.worker_stopping();
        }
        dispatch.draining.cancel();
        tracker.close();
        if tokio::time::timeout(self.opts.shutdown_timeout, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                consumer,
                in_flight = tracker.len(),
                "shutdown deadline reached: uncommitted deliveries roll back and are released"
            );
            dispatch.stop.cancel();
            tracker.wait().await;
        }
        if let Some(h) = &health {
            h.worker_stopped();
        }
        let r = dispatch
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        r
    }
}

/// What the receive loops of one worker share.
struct LoopContext<'a, P> {
    opts: &'a WorkerOptions,
    out_of_queue: &'a Arc<Semaphore>,
    /// Held by the loop waiting for places out of the queue (see [`LoopContext::take_places`]).
    places_gate: &'a tokio::sync::Mutex<()>,
    dispatch: &'a Dispatch<P>,
    health: Option<&'a crate::runtime::health::Health>,
    stopping: &'a CancellationToken,
    until_idle: bool,
}

impl<P> LoopContext<'_, P> {
    /// Waits for at least one place out of the queue and takes every free one, up to `most`: the places a
    /// settle frees go to one receive. One loop at a time waits (`places_gate`): the semaphore hands released
    /// places to its waiters one each, which would split a settled batch's places over as many receives of
    /// one message. `None` when the semaphore is closed.
    async fn take_places(&self, most: usize) -> Option<Vec<tokio::sync::OwnedSemaphorePermit>> {
        let _turn = self.places_gate.lock().await;
        let first = self.out_of_queue.clone().acquire_owned().await.ok()?;
        let mut permits = vec![first];
        while permits.len() < most {
            match self.out_of_queue.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        Some(permits)
    }

    /// One receive loop: takes places out of the queue, receives, hands what arrived to the dispatch (alone,
    /// in batches, lingering), backs off on errors; until the worker stops, the queue is idle (`until_idle`),
    /// or receives have failed for good (then it stops the other loops too).
    async fn receive<R>(&self, mut receiver: R)
    where
        R: Receiver,
        P: Processor<LeasedDelivery<R::Delivery>>,
    {
        let (opts, dispatch, stopping) = (self.opts, self.dispatch, self.stopping);
        let consumer = dispatch.consumer.as_str();
        let report = &dispatch.report;
        let mut pending = Lingering::<R::Delivery>::new(consumer);
        let mut idle_receives = 0u32;
        let mut failing: Option<Failing> = None;
        'receiving: loop {
            let mut permits = tokio::select! {
                biased;
                _ = stopping.cancelled() => break,
                _ = sleep_until(pending.until) => {
                    dispatch.spawn(pending.take());
                    continue;
                }
                p = self.take_places(opts.batch_size) => match p { Some(p) => p, None => break },
            };
            // Idle means two receives in a row brought nothing while nothing was in flight when they began: a
            // delivery that settles during a receive may free messages the broker or the adapter holds back (a
            // FIFO group's next one), which only a following receive sees.
            let nothing_in_flight = dispatch.tracker.is_empty() && pending.batch.is_empty();
            let receive = receiver.receive(permits.len());
            tokio::pin!(receive);
            let received = loop {
                tokio::select! {
                    biased;
                    _ = stopping.cancelled() => {
                        // Let the long poll finish and hand back what it brought, so that those messages are
                        // received again at once rather than after their lock or visibility timeout.
                        let wait = opts
                            .shutdown_receive_wait
                            .map_or(opts.shutdown_timeout, |w| w.min(opts.shutdown_timeout));
                        dispatch.spawn(pending.take());
                        hand_back(receive, wait, consumer).await;
                        break 'receiving;
                    }
                    r = &mut receive => break r,
                    // The linger ends while the receive waits: the batch goes, the receive is not cut short.
                    _ = sleep_until(pending.until) => dispatch.spawn(pending.take()),
                }
            };
            if let Some(h) = self.health {
                match &received {
                    Ok(_) => h.receive_succeeded(),
                    Err(e) => h.receive_failed(e),
                }
            }
            match (&received, failing.take()) {
                (Ok(_), Some(f)) => tracing::info!(
                    consumer,
                    failures = f.failures,
                    failing_for_ms = f.since.elapsed().as_millis() as u64,
                    "receives recovered"
                ),
                (_, f) => failing = f,
            }
            let idle_receive = nothing_in_flight && matches!(&received, Ok(d) if d.is_empty());
            idle_receives = if idle_receive { idle_receives + 1 } else { 0 };
            match received {
                Ok(_) if self.until_idle && idle_receives >= 2 => break,
                Ok(deliveries) => {
                    // Each lease is kept alive from the moment its delivery arrives.
                    let arrived = deliveries.into_iter().map(|delivery| Received {
                        guard: delivery
                            .lease()
                            .map(|l| keep_alive(l, opts.lease.clone(), consumer.to_owned())),
                        permit: permits.pop(),
                        delivery,
                    });
                    // Without batch commit every delivery is a full batch of one: none lingers.
                    for batch in pending.add(arrived, opts.batch_commit, opts.batch_linger) {
                        dispatch.spawn(batch);
                    }
                }
                Err(e) => {
                    // A failed receive does not hold a lingering batch back through its pause.
                    dispatch.spawn(pending.take());
                    let kind = e.kind();
                    metrics::counter!(crate::metrics::RECEIVE_ERRORS, "consumer" => consumer.to_owned(), "kind" => kind.as_str())
                        .increment(1);
                    report
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .receive_errors += 1;
                    let now = Instant::now();
                    let f = failing.get_or_insert(Failing {
                        failures: 0,
                        kind,
                        since: now,
                        persistent_since: None,
                    });
                    f.failures += 1;
                    if f.failures == 1 || f.kind != kind {
                        // One line per state change (failing, or failing differently), not per retry.
                        tracing::warn!(consumer, kind = kind.as_str(), error = %e, "receives failing; backing off");
                        f.kind = kind;
                    }
                    if is_persistent_receive_error(kind) {
                        let since = *f.persistent_since.get_or_insert(now);
                        if let Some(limit) = opts.give_up_after {
                            if now.duration_since(since) >= limit {
                                let why = give_up_reason(&e, limit);
                                tracing::error!(consumer, kind = kind.as_str(), error = %e, "{why}");
                                report
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .gave_up
                                    .get_or_insert(why);
                                // The worker stops as on shutdown: its other loops too.
                                stopping.cancel();
                                break;
                            }
                        }
                    }
                    let pause = receive_backoff(
                        opts.receive_error_backoff,
                        opts.receive_error_backoff_max,
                        f.failures,
                        jitter_unit(),
                    )
                    .max(
                        e.retry_after()
                            .unwrap_or_default()
                            .min(opts.receive_error_backoff_max),
                    );
                    tokio::select! {
                        _ = stopping.cancelled() => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
        // A batch still lingering is processed now, like every delivery received before the stop.
        dispatch.spawn(pending.take());
    }
}

/// Resolves at `at`, never when `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A received delivery, its lease kept alive from the moment it arrived, and its place among the messages
/// out of the queue.
struct Received<D> {
    delivery: D,
    guard: Option<LeaseGuard>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A batch that one receive did not fill, waiting for the next receives until its linger ends; its
/// deliveries are counted as `waiting` in `txinbox_worker_deliveries`.
struct Lingering<D> {
    batch: Vec<Received<D>>,
    /// When the batch goes, full or not; `None` while it is empty.
    until: Option<Instant>,
    waiting: metrics::Gauge,
}

impl<D> Lingering<D> {
    fn new(consumer: &str) -> Self {
        Self {
            batch: Vec::new(),
            until: None,
            waiting: metrics::gauge!(crate::metrics::WORKER_DELIVERIES, "consumer" => consumer.to_owned(), "state" => Holding::WAITING),
        }
    }

    /// Adds what a receive brought and returns the batches to process now: every full one (`full`
    /// deliveries) and, without a linger, the rest. What is left waits until `linger` after its first
    /// delivery arrived.
    fn add(
        &mut self,
        arrived: impl IntoIterator<Item = Received<D>>,
        full: usize,
        linger: Duration,
    ) -> Vec<Vec<Received<D>>> {
        let before = self.batch.len();
        self.batch.extend(arrived);
        let whole = self.batch.len() / full * full;
        let mut ready = Vec::with_capacity(whole / full + 1);
        let mut drained = self.batch.drain(..whole);
        while drained.len() > 0 {
            ready.push(drained.by_ref().take(full).collect());
        }
        drop(drained);
        if linger.is_zero() && !self.batch.is_empty() {
            ready.push(std::mem::take(&mut self.batch));
        }
        if self.batch.is_empty() {
            self.until = None;
        } else if self.until.is_none() || !ready.is_empty() {
            // What is left arrived with this receive: its linger starts now.
            self.until = Some(Instant::now() + linger);
        }
        let (now, before) = (self.batch.len() as f64, before as f64);
        if now > before {
            self.waiting.increment(now - before);
        } else {
            self.waiting.decrement(before - now);
        }
        ready
    }

    /// The batch, full or not, to process now.
    fn take(&mut self) -> Vec<Received<D>> {
        self.until = None;
        self.waiting.decrement(self.batch.len() as f64);
        std::mem::take(&mut self.batch)
    }
}

/// What the tasks processing received deliveries share.
struct Dispatch<P> {
    processor: Arc<P>,
    slots: Arc<Semaphore>,
    concurrency: usize,
    stop: CancellationToken,
    draining: CancellationToken,
    report: Arc<Mutex<WorkerReport>>,
    consumer: String,
    tracker: TaskTracker,
}

impl<P> Dispatch<P> {
    /// Processes one delivery, or several in one transaction, in a task of its own: waits for their slots
    /// (one per delivery, at most all of them), processes, counts the outcomes, and lets the deliveries' places
    /// out of the queue go once they are settled.
    fn spawn<D: Delivery>(&self, received: Vec<Received<D>>)
    where
        P: Processor<LeasedDelivery<D>>,
    {
        if received.is_empty() {
            return;
        }
        let processor = self.processor.clone();
        let slots = self.slots.clone();
        let (all, stop, draining) = (self.concurrency, self.stop.clone(), self.draining.clone());
        let report = self.report.clone();
        let consumer = self.consumer.clone();
        self.tracker.spawn(async move {
            let n = received.len();
            let slot = take_slots(&slots, n, all, &consumer, &stop, &draining).await;
            let (mut leased, mut guards, mut permits) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for r in received {
                leased.push(LeasedDelivery {
                    inner: r.delivery,
                    stop_lease: r.guard.as_ref().map(|g| g.stopper()),
                });
                guards.push(r.guard);
                permits.push(r.permit);
            }
            let outcomes = match <[_; 1]>::try_from(leased) {
                Ok([one]) => vec![processor.process(one, slot.stop.clone()).await],
                Err(batch) => processor.process_batch(batch, slot.stop.clone()).await,
            };
            let lost = guards.iter().flatten().filter(|g| g.lost()).count() as u64;
            drop(guards);
            let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
            for o in outcomes {
                *r.outcomes.entry(o.kind()).or_default() += 1;
            }
            r.leases_lost += lost;
            drop((slot, permits));
        });
    }
}

/// `n` deliveries counted in `txinbox_worker_deliveries{consumer, state}` while this lives.
struct Holding {
    consumer: String,
    state: &'static str,
    n: f64,
}

impl Holding {
    const WAITING: &'static str = "waiting";
    const PROCESSING: &'static str = "processing";

    fn new(consumer: &str, state: &'static str, n: usize) -> Self {
        let h = Self {
            consumer: consumer.to_owned(),
            state,
            n: n as f64,
        };
        h.gauge().increment(h.n);
        h
    }

    fn gauge(&self) -> metrics::Gauge {
        metrics::gauge!(crate::metrics::WORKER_DELIVERIES, "consumer" => self.consumer.clone(), "state" => self.state)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.gauge().decrement(self.n);
    }
}

/// The processing slots of a received delivery or batch, counted in `txinbox_worker_deliveries` while held.
struct Slot {
    /// `None` when the worker stopped receiving before a slot was free.
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    _processing: Holding,
    /// What the processor is given: the worker's stop token, or, when no slot was taken, the cancelled
    /// `draining` token, so that what it was given is released at once without being applied.
    stop: CancellationToken,
}

/// Waits for `n` processing slots (at most `all`, the worker's concurrency) for a received delivery or batch,
/// counted as `waiting` meanwhile. Gives up when the worker stops receiving first (`draining`); a slot free at
/// once is taken even then (without prefetch a delivery never waits for its slot).
async fn take_slots(
    slots: &Arc<Semaphore>,
    n: usize,
    all: usize,
    consumer: &str,
    stop: &CancellationToken,
    draining: &CancellationToken,
) -> Slot {
    let waiting = Holding::new(consumer, Holding::WAITING, n);
    let permits = u32::try_from(n.clamp(1, all.max(1))).unwrap_or(u32::MAX);
    let permit = tokio::select! {
        biased;
        p = slots.clone().acquire_many_owned(permits) => p.ok(),
        _ = draining.cancelled() => None,
    };
    drop(waiting);
    Slot {
        stop: if permit.is_some() {
            stop.clone()
        } else {
            draining.clone()
        },
        _permit: permit,
        _processing: Holding::new(consumer, Holding::PROCESSING, n),
    }
}

/// One line: what kept failing and for how long (the error's own text never holds a secret).
fn give_up_reason(e: &BrokerError, limit: Duration) -> String {
    format!(
        "receives failed for {}s with an error a retry cannot fix ({}): {e}",
        limit.as_secs(),
        e.kind().as_str()
    )
}

/// Waits (at most `limit`) for a receive that was in flight when shutdown began and releases what it brought
/// with no delay.
async fn hand_back<D: Delivery>(
    receive: impl Future<Output = Result<Vec<D>, BrokerError>>,
    limit: Duration,
    consumer: &str,
) {
    if limit.is_zero() {
        // Dropped on purpose (`WorkerOptions::shutdown_receive_wait` zero).
        return;
    }
    let deliveries = match tokio::time::timeout(limit, receive).await {
        Ok(Ok(d)) => d,
        Ok(Err(_)) => return,
        Err(_) => {
            tracing::warn!(
                consumer,
                "the receive in flight at shutdown did not finish in time; what it brings stays locked until its timeout"
            );
            return;
        }
    };
    if deliveries.is_empty() {
        return;
    }
    let n = deliveries.len();
    let results =
        futures::future::join_all(deliveries.into_iter().map(|d| d.release(Duration::ZERO))).await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    tracing::info!(
        consumer,
        handed_back = n - failed,
        failed,
        "messages received after the stop signal handed back to the broker"
    );
}

/// Resolves on Ctrl-C or, on Unix, SIGTERM: pass it to [`Worker::run_until`].
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
