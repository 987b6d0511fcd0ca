//! The worker runtime: receive with bounded concurrency, keep leases alive, process through the inbox, and
//! shut down gracefully.
//!
//! Shutdown: when the shutdown future resolves (the stop signal) the worker stops receiving and lets in-flight
//! deliveries finish (commit, then settle) until the shutdown deadline, [`WorkerOptions::shutdown_timeout`]
//! after the signal. Everything the stop waits for counts in that time, the long poll in flight below
//! included. At the deadline the worker signals the processors to stop: a delivery that has not committed
//! rolls back and is released with no delay (outcome [`Outcome::Interrupted`]; never acknowledged, it is
//! received again); one that has committed goes on to settle. Those last rollbacks and settles (and the
//! hand-back below) are the only work past the deadline, and they have [`SHUTDOWN_GRACE`] (5 s) to answer:
//! what has not answered by then (a hung database connection or broker call) is abandoned, each task dropped
//! where it waits, and counted in [`WorkerReport::abandoned`]. That is what a SIGKILL does, and the inbox is
//! built for it: uncommitted work is rolled back and received again, work committed but not acknowledged is
//! received again and found as a duplicate. The process should exit once the worker returns: its exit closes
//! the connections the abandoned work held, which is when their databases roll it back. A worker therefore returns at the latest `shutdown_timeout +
//! SHUTDOWN_GRACE` after the signal: set the timeout at least that much under its orchestrator's grace period
//! (Kubernetes sends SIGKILL 30 s after SIGTERM by default).
//!
//! A receive (long poll) still in flight when shutdown begins is let finish, at most until the deadline (and
//! for at most [`WorkerOptions::shutdown_receive_wait`] when set); whatever it brought is handed back to the
//! broker ([`Delivery::release`] with no delay: SQS visibility 0, Service Bus unlock), so another worker
//! receives those messages at once instead of after their lock or visibility timeout. A poll still running at
//! the deadline is dropped: what the broker hands it then waits for its lock or visibility timeout. An idle
//! worker therefore takes up to the long-poll wait (or the shutdown timeout, if shorter) to stop. A worker that
//! gives up on receives (below) stops the same way, its deadline counted from the moment it gives up. Every
//! delivery handed back unapplied at shutdown is counted in `txinbox_worker_handed_back_total{consumer, reason}`
//! ([`WORKER_HANDED_BACK`](crate::metrics::WORKER_HANDED_BACK)): `receive_in_flight` (what that receive brought),
//! `waiting_for_slot` (prefetched, below), `surplus` (a receive's extra deliveries, below); a release that fails
//! counts in `txinbox_settle_failures_total{op="release"}` (for the first and the last, instead of as handed
//! back).
//!
//! A processor that panics (a bug in a [`Processor`] of one's own, or in what it runs outside the inbox's own
//! containment) is said at error with the panic's message and its deliveries are counted `retry`; those it had
//! not settled are handed back to the broker ([`Delivery::release`], counted `processor_panicked`), while the
//! worker goes on, rather than held until their lock or visibility timeout: at once on a message's first
//! delivery, from its second on after [`WorkerOptions::panic_backoff`] (1 s, doubling with the broker's
//! delivery count up to 60 s by default), and at once again while the worker stops. Each such hand-back is one
//! more receive toward the queue's maximum receive count: a message whose every processing panics ends in the
//! dead-letter queue, and on a queue without one it comes back at most once a `panic_backoff` maximum instead
//! of straight into the same panic.
//!
//! Receive errors: the pause after a failed receive doubles from [`WorkerOptions::receive_error_backoff`] up
//! to [`WorkerOptions::receive_error_backoff_max`], with jitter (each pause is drawn between half and all of
//! it). While it pauses the worker is live and not ready ([`health`](crate::runtime::health)), however long
//! the pause. The worker logs once when receives start failing, once when the kind of error changes and once when
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
//! (released with no delay, outcome [`Outcome::Interrupted`]) rather than applied during the drain. A receive
//! that brings more deliveries than it asked for (an adapter ignoring its `max`) is said at warn; the extra
//! deliveries wait, leases kept and counted as `waiting`, and take the next free places before the loop
//! receives again, so the worker is past its bound by at most that one receive's overshoot. They are not handed
//! back: each would be received again and counted again toward the queue's maximum receive count (SQS
//! `maxReceiveCount`, Service Bus `MaxDeliveryCount`), then dead-lettered without being applied. At shutdown the
//! ones still waiting are handed back, unapplied.
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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::{Delivery, Receiver};
use crate::pipeline::outcome::Outcome;

mod options;
mod receive;
mod report;
#[cfg(test)]
mod tests;

pub use options::{
    WorkerOptions, MAX_BATCH_COMMIT, MAX_BATCH_LINGER, MAX_RECEIVE_LOOPS, SHUTDOWN_GRACE,
};
pub use receive::{is_persistent_receive_error, receive_backoff};
pub use report::WorkerReport;

use receive::{Dispatch, Holding, LoopContext, Stopping};

/// A delivery handed to a [`Processor`] by the [`Worker`]: it stops the lease keeper the moment a settle
/// begins, so a renewal racing with the settle is never mistaken for a lost lock. Dropped unsettled (its
/// processor panicked), it goes back to the worker, which hands it back to the broker (at once the first time, see
/// [`WorkerOptions::panic_backoff`]).
pub struct LeasedDelivery<D> {
    /// `None` only once it was taken to be settled (the wrapper is then on its way out).
    inner: Option<D>,
    stop_lease: Option<CancellationToken>,
    /// Where the delivery goes when the wrapper is dropped unsettled.
    unsettled: Option<Unsettled<D>>,
}

/// The deliveries of one processing task dropped unsettled by its processor.
pub(crate) type Unsettled<D> = Arc<std::sync::Mutex<Vec<D>>>;

impl<D> LeasedDelivery<D> {
    fn new(
        inner: D,
        stop_lease: Option<CancellationToken>,
        unsettled: Option<Unsettled<D>>,
    ) -> Self {
        Self {
            inner: Some(inner),
            stop_lease,
            unsettled,
        }
    }

    fn stop(&self) {
        if let Some(t) = &self.stop_lease {
            t.cancel();
        }
    }

    /// The delivery, taken out to be settled: the lease keeper stops, and nothing goes back to the worker.
    fn settling(mut self, op: &'static str) -> Result<D, crate::BrokerError> {
        self.stop();
        // Never `None`: settling consumes the wrapper, and only settling takes the delivery out.
        self.inner.take().ok_or_else(|| {
            crate::BrokerError::new(
                crate::BrokerErrorKind::Rejected,
                op,
                "the delivery was already settled",
            )
        })
    }
}

impl<D> Drop for LeasedDelivery<D> {
    fn drop(&mut self) {
        if let (Some(d), Some(unsettled)) = (self.inner.take(), &self.unsettled) {
            unsettled.lock().unwrap_or_else(|p| p.into_inner()).push(d);
        }
    }
}

impl<D: Delivery> Delivery for LeasedDelivery<D> {
    fn message(&self) -> &crate::ReceivedMessage {
        static SETTLED: std::sync::OnceLock<crate::ReceivedMessage> = std::sync::OnceLock::new();
        match &self.inner {
            Some(d) => d.message(),
            // Not reached: a wrapper whose delivery was taken out can no longer be borrowed.
            None => SETTLED.get_or_init(crate::ReceivedMessage::default),
        }
    }
    async fn ack(self) -> Result<(), crate::BrokerError> {
        self.settling("ack")?.ack().await
    }
    async fn release(self, delay: Duration) -> Result<(), crate::BrokerError> {
        self.settling("release")?.release(delay).await
    }
    async fn dead_letter(self, why: crate::DeadLetter) -> Result<(), crate::BrokerError> {
        self.settling("dead_letter")?.dead_letter(why).await
    }
    fn lease(&self) -> Option<Arc<dyn crate::Lease>> {
        self.inner.as_ref().and_then(|d| d.lease())
    }
    fn release_holds(&self) -> bool {
        self.inner.as_ref().is_some_and(|d| d.release_holds())
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

    /// The largest message body this processor accepts, when it refuses a larger one itself without reading
    /// it or touching its store (the inbox: [`InputRules::max_payload_bytes`](crate::InputRules), dead-lettered
    /// `payload_too_large`). What reads the message before the processor does (the
    /// [shard router](crate::runtime::shards)) hands a larger body to it unread. `None` (the default): no
    /// limit known, the message is read whatever its size.
    fn max_payload_bytes(&self) -> Option<usize> {
        None
    }

    /// Called once when a worker starts, before its first receive: a processor registers its metrics here
    /// (at zero, so that a monitoring system sees the first event as an increase).
    fn started(&self) {}

    /// Why no worker can run this processor, when it was put together in a way that cannot work (the
    /// [shards](crate::runtime::shards) of two consumers): the worker then refuses to start, receiving nothing,
    /// and returns at once with this line in [`WorkerReport::gave_up`]. `None` (the default): it can run.
    fn refused(&self) -> Option<String> {
        None
    }

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

/// A worker: one receiver (forked for each further [`WorkerOptions::receive_loops`]), one processor.
#[must_use = "a Worker does nothing until run_until or run_until_idle is awaited"]
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

    /// Reports the worker's liveness and readiness on `health` (see [`crate::runtime::health`]).
    pub fn health(mut self, health: crate::runtime::health::Health) -> Self {
        self.health = Some(health);
        self
    }

    /// Replaces the options.
    pub fn options(mut self, opts: WorkerOptions) -> Self {
        self.opts = opts;
        self
    }

    /// How long this worker may take to stop, counted from the stop signal
    /// ([`WorkerOptions::shutdown_timeout`]): the [`Monitor`](crate::Monitor) bounds its parts by it.
    pub(crate) fn shutdown_timeout(&self) -> Duration {
        self.opts.shutdown_timeout
    }

    /// The consumer name its processor reports (the [`Monitor`](crate::Monitor) names the worker's part by it).
    pub(crate) fn consumer(&self) -> &str {
        self.processor.consumer()
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
        if let Some(why) = self.processor.refused() {
            tracing::error!(
                consumer = self.processor.consumer(),
                "the worker refuses to start: {why}"
            );
            if let Some(h) = &self.health {
                h.worker_stopped();
            }
            return WorkerReport {
                gave_up: Some(why),
                ..WorkerReport::default()
            };
        }
        // `out_of_queue`: messages out of the queue (from the receive request to the settle's answer); `slots`:
        // deliveries being applied or settled. Without prefetch the two are the same number, and a delivery
        // never waits for its slot.
        // A semaphore holds at most MAX_PERMITS (2^61 on 64 bits): more is "no limit" in practice.
        let out_of_queue = Arc::new(Semaphore::new(
            self.opts
                .concurrency
                .saturating_add(self.opts.prefetch)
                .min(Semaphore::MAX_PERMITS),
        ));
        let consumer = self.processor.consumer().to_owned();
        // Signalled by the shutdown, or by a loop that gives up: every loop stops receiving, and the
        // shutdown deadline starts.
        let stopping = Stopping::new(self.opts.shutdown_timeout);
        let dispatch = Dispatch {
            processor: self.processor.clone(),
            slots: Arc::new(Semaphore::new(
                self.opts.concurrency.min(Semaphore::MAX_PERMITS),
            )),
            concurrency: self.opts.concurrency,
            stop: CancellationToken::new(),
            // Cancelled at the stop signal (or when the receives end by themselves): a delivery still waiting
            // for its slot is handed back unapplied.
            draining: stopping.token(),
            abandon: CancellationToken::new(),
            report: Arc::default(),
            consumer: consumer.clone(),
            tracker: TaskTracker::new(),
            opts: Arc::new(self.opts.clone()),
        };
        let mut receivers = vec![self.receiver];
        let loops = self.opts.get_receive_loops();
        while receivers.len() < loops {
            match receivers[0].fork() {
                Some(r) => receivers.push(r),
                // Asked for by name: say that it cannot be had. Chosen by the worker: one loop is all this
                // receiver offers.
                None if self.opts.receive_loops.is_some() => {
                    tracing::warn!(
                        consumer,
                        receive_loops = loops,
                        "this receiver cannot fork (Receiver::fork): running one receive loop"
                    );
                    break;
                }
                None => break,
            }
        }
        self.processor.started();
        for state in [Holding::WAITING, Holding::PROCESSING] {
            metrics::gauge!(crate::metrics::WORKER_DELIVERIES, "consumer" => consumer.clone(), "state" => state)
                .set(0.0);
        }
        for reason in receive::HandedBack::ALL {
            metrics::counter!(crate::metrics::WORKER_HANDED_BACK, "consumer" => consumer.clone(), "reason" => reason)
                .increment(0);
        }
        let health = self.health.take();
        if let Some(h) = &health {
            h.worker_started();
        }
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
        // The shutdown only starts the stop: the loops end by themselves once they see it.
        let signal = async {
            shutdown.await;
            // Not ready from the signal on, also while a long poll in flight is let finish.
            if let Some(h) = &health {
                h.worker_stopping();
            }
            stopping.stop();
            std::future::pending::<()>().await
        };
        // Once stopped (the signal, or a loop that gave up), the loops have until the end of the grace: past it
        // a hand-back still waiting for the broker is dropped, its messages back after their lock or
        // visibility timeout.
        let bound = async {
            stopping.cancelled().await;
            tokio::time::sleep_until(stopping.abandon_at()).await
        };
        tokio::select! {
            _ = &mut loops => {}
            _ = bound => tracing::warn!(
                consumer,
                "the receive loops did not end by the end of the shutdown grace (a broker call not answering): dropped"
            ),
            _ = signal => {}
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
        // `shutdown_timeout` from the stop signal, the loops' exit (a long poll let finish) included.
        if tokio::time::timeout_at(stopping.deadline(), tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                consumer,
                in_flight = tracker.len(),
                "shutdown deadline reached: uncommitted deliveries roll back and are released"
            );
            dispatch.stop.cancel();
            // The rollbacks and settles have SHUTDOWN_GRACE to answer. Past it, what has not answered (a hung
            // database connection or broker call: the store's begin, insert and commit and the broker's settle
            // are not raced against the stop) is abandoned: each task is dropped where it waits, exactly what a
            // SIGKILL does, which the inbox is built for. A delivery that had not committed is rolled back by
            // its database when the connection goes (the process exiting after the worker returns) and, never
            // settled, is received again after its lock or
            // visibility timeout; one that had committed but was not acknowledged is received again the same
            // way and found as a duplicate. Nothing is lost and nothing is applied twice; the report says how
            // many were abandoned instead of the worker waiting for the orchestrator's SIGKILL.
            if tokio::time::timeout_at(stopping.abandon_at(), tracker.wait())
                .await
                .is_err()
            {
                let abandoned = dispatch
                    .report
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .abandon();
                dispatch.abandon.cancel();
                metrics::counter!(crate::metrics::DELIVERIES_ABANDONED, "consumer" => consumer.clone())
                    .increment(abandoned);
                tracing::warn!(
                    consumer,
                    abandoned,
                    grace_s = SHUTDOWN_GRACE.as_secs(),
                    "deliveries still in flight past the shutdown grace are abandoned: received again after their lock or visibility timeout (a committed one as a duplicate)"
                );
            }
        }
        if let Some(h) = &health {
            h.worker_stopped();
        }
        let r = dispatch
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .report
            .clone();
        r
    }
}

/// Resolves on Ctrl-C or, on Unix, SIGTERM: pass it to [`Worker::run_until`].
///
/// Called inside a Tokio runtime, it installs its signal handlers at once, not when the future is first
/// polled; until then, SIGTERM and Ctrl-C keep their default action (the process ends). Where it is called
/// is the choice: in the call to `run_until` (`worker.run_until(shutdown_signal())`), a SIGTERM during the
/// program's start-up (connecting to the store, checking the broker) ends the process at once, with nothing
/// received yet; called before that start-up, the signal is kept, the start-up runs to its end (a connection
/// that hangs delays the stop by its timeout) and the worker stops as soon as it runs and returns its report.
/// Called outside a runtime, it installs them at its first poll.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let install = || {
            (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            )
        };
        let now = tokio::runtime::Handle::try_current().is_ok().then(install);
        async move {
            match now.unwrap_or_else(install) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (Ok(mut term), Err(_)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                (Err(_), _) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
