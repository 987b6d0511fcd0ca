//! The receive loops: places out of the queue, receives, lingering batches, dispatch to slots, receive errors
//! and the hand-back at shutdown.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::{Delivery, Receiver};
use crate::error::{BrokerError, BrokerErrorKind};
use crate::pipeline::outcome::Outcome;
use crate::runtime::lease::{keep_delivery_alive, panic_text, LeaseGuard};

use super::report::Tally;
use super::{LeasedDelivery, Processor, WorkerOptions};

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
    let full = crate::time::doubled(first, max, failures);
    // `mul_f64` goes through seconds as a float, which rounds a pause near `Duration::MAX` above it (a panic):
    // half of it, plus a share of the other half that cannot exceed it.
    let unit = unit.clamp(0.0, 1.0);
    if unit == 1.0 {
        return full;
    }
    let half = full / 2;
    let rest = full - half;
    half + Duration::try_from_secs_f64(rest.as_secs_f64() * unit).map_or(rest, |d| d.min(rest))
}

/// A random draw in `0.0..1.0` for the jitter (std's per-process random hash keys; no RNG dependency).
pub(super) fn jitter_unit() -> f64 {
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
pub(super) struct Failing {
    pub(super) failures: u32,
    pub(super) kind: BrokerErrorKind,
    pub(super) since: Instant,
    /// When the first error a retry cannot fix came, in this run of failures.
    pub(super) persistent_since: Option<Instant>,
}

/// What the receive loops of one worker share.
pub(super) struct LoopContext<'a, P> {
    pub(super) opts: &'a WorkerOptions,
    pub(super) out_of_queue: &'a Arc<Semaphore>,
    /// Held by the loop waiting for places out of the queue (see [`LoopContext::take_places`]).
    pub(super) places_gate: &'a tokio::sync::Mutex<()>,
    pub(super) dispatch: &'a Dispatch<P>,
    pub(super) health: Option<&'a crate::runtime::health::Health>,
    pub(super) stopping: &'a Stopping,
    pub(super) until_idle: bool,
}

/// The worker's stop: the signal every receive loop watches, and the deadline it sets.
pub(super) struct Stopping {
    token: CancellationToken,
    /// `shutdown_timeout` after the stop was signalled: the receive loops' exit and the drain end by then.
    deadline: std::sync::OnceLock<Instant>,
    timeout: Duration,
}

impl Stopping {
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            token: CancellationToken::new(),
            deadline: std::sync::OnceLock::new(),
            timeout,
        }
    }

    /// Signals the stop (the shutdown, or a loop that gives up): the deadline starts now.
    pub(super) fn stop(&self) {
        self.deadline();
        self.token.cancel();
    }

    pub(super) fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// A token cancelled with the stop signal.
    pub(super) fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// When the drain ends: `shutdown_timeout` after the stop was signalled (or, when the loops ended by
    /// themselves, after this was first asked).
    pub(super) fn deadline(&self) -> Instant {
        *self.deadline.get_or_init(|| {
            Instant::now()
                .checked_add(self.timeout)
                .unwrap_or_else(far_future)
        })
    }

    /// When the worker stops waiting: [`SHUTDOWN_GRACE`](super::SHUTDOWN_GRACE) after the deadline.
    pub(super) fn abandon_at(&self) -> Instant {
        let deadline = self.deadline();
        deadline
            .checked_add(super::SHUTDOWN_GRACE)
            .unwrap_or(deadline)
    }
}

/// An instant too far away to matter (about 30 years), for a timeout too large to add to now.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

impl<P> LoopContext<'_, P> {
    /// Waits for at least one place out of the queue and takes every free one, up to `most`: the places a
    /// settle frees go to one receive. One loop at a time waits (`places_gate`): the semaphore hands released
    /// places to its waiters one each, which would split a settled batch's places over as many receives of
    /// one message. `None` when the semaphore is closed.
    pub(super) async fn take_places(
        &self,
        most: usize,
    ) -> Option<Vec<tokio::sync::OwnedSemaphorePermit>> {
        let _turn = self.places_gate.lock().await;
        let first = match self.out_of_queue.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return None,
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                // Every place holds a delivery in progress: the loop is busy, not stuck (see Health). The
                // guard ends the wait however it ends, this future dropped by the loop's select included.
                let _waiting = WaitingForPlace::new(self.health);
                self.out_of_queue.clone().acquire_owned().await.ok()?
            }
        };
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
    pub(super) async fn receive<R>(&self, mut receiver: R)
    where
        R: Receiver,
        P: Processor<LeasedDelivery<R::Delivery>>,
    {
        let (opts, dispatch, stopping) = (self.opts, self.dispatch, self.stopping);
        let consumer = dispatch.consumer.as_str();
        let report = &dispatch.report;
        let mut pending = Lingering::<R::Delivery>::new(consumer);
        // What a receive brought beyond what it asked for (an adapter ignoring `max`), waiting for places.
        let mut surplus = Surplus::<R::Delivery>::new(consumer);
        let mut idle_receives = 0u32;
        let mut failing: Option<Failing> = None;
        'receiving: loop {
            let most = match surplus.len() {
                0 => opts.batch_size,
                n => n.min(opts.batch_size),
            };
            let mut permits = tokio::select! {
                biased;
                _ = stopping.cancelled() => break,
                _ = sleep_until(pending.until) => {
                    dispatch.spawn(pending.take());
                    continue;
                }
                p = self.take_places(most) => match p { Some(p) => p, None => break },
            };
            if !surplus.is_empty() {
                // The surplus takes the places before any new receive: nothing more comes out of the queue
                // until it is placed, and none of it goes back to the broker to be received again.
                let placed = surplus.take(permits);
                for batch in pending.add(placed, opts.batch_commit, opts.batch_linger) {
                    dispatch.spawn(batch);
                }
                continue;
            }
            // Idle means two receives in a row brought nothing while nothing was in flight when they began: a
            // delivery that settles during a receive may free messages the broker or the adapter holds back (a
            // FIFO group's next one), which only a following receive sees.
            let nothing_in_flight = dispatch.tracker.is_empty() && pending.batch.is_empty();
            let asked = permits.len();
            let receive = receiver.receive(asked);
            tokio::pin!(receive);
            let received = loop {
                tokio::select! {
                    biased;
                    _ = stopping.cancelled() => {
                        // Let the long poll finish and hand back what it brought, so that those messages are
                        // received again at once rather than after their lock or visibility timeout; never past
                        // the shutdown deadline, which counts from the signal.
                        let left = stopping.deadline().saturating_duration_since(Instant::now());
                        let wait = opts.shutdown_receive_wait.map_or(left, |w| w.min(left));
                        dispatch.spawn(pending.take());
                        let brought = received_at_stop(receive, wait, consumer, report).await;
                        dispatch.hand_back(brought, HandedBack::RECEIVE_IN_FLIGHT);
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
                Ok(mut deliveries) => {
                    // A receiver that brought more than it was asked for (an adapter ignoring `max`): the extra
                    // deliveries have no place out of the queue. They wait, leases kept, and take the next
                    // places before any further receive, so the worker is never past its bound by more than
                    // this one receive's overshoot. Handed back instead, each would be received again (and
                    // counted again toward the queue's maximum receive count, then dead-lettered unapplied).
                    if deliveries.len() > asked {
                        let extra = deliveries.split_off(asked);
                        tracing::warn!(
                            consumer,
                            asked,
                            extra = extra.len(),
                            "the receiver brought more deliveries than it was asked for: the extra ones wait for places before the next receive"
                        );
                        surplus.hold(extra.into_iter().map(|d| arrive(d, None, opts, consumer)));
                    }
                    // Each lease is kept alive from the moment its delivery arrives.
                    let arrived = deliveries
                        .into_iter()
                        .map(|delivery| arrive(delivery, permits.pop(), opts, consumer));
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
                        .report
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
                                    .report
                                    .gave_up
                                    .get_or_insert(why);
                                // The worker stops as on shutdown: its other loops too.
                                stopping.stop();
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
                    // Waiting on purpose, however long the pause: live meanwhile (a restart would not bring
                    // the broker back, only churn), not ready (the last receive failed).
                    if let Some(h) = self.health {
                        h.worker_backing_off(pause);
                    }
                    tokio::select! {
                        _ = stopping.cancelled() => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
        // A batch still lingering is processed now, like every delivery received before the stop; a surplus
        // that never had places goes back to the broker, unapplied.
        dispatch.spawn(pending.take());
        dispatch.hand_back(surplus.drain(), HandedBack::SURPLUS);
    }
}

/// A delivery as it arrives: its lease kept alive from now on, with its place out of the queue if it has one.
fn arrive<D: Delivery>(
    delivery: D,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    opts: &WorkerOptions,
    consumer: &str,
) -> Received<D> {
    Received {
        guard: keep_delivery_alive(&delivery, &opts.lease, consumer),
        permit,
        delivery,
    }
}

/// The deliveries a receive brought beyond what it asked for, waiting (leases kept) for places out of the
/// queue before the loop receives again; counted as `waiting` in `txinbox_worker_deliveries`.
struct Surplus<D> {
    held: std::collections::VecDeque<Received<D>>,
    waiting: metrics::Gauge,
}

impl<D> Surplus<D> {
    fn new(consumer: &str) -> Self {
        Self {
            held: std::collections::VecDeque::new(),
            waiting: metrics::gauge!(crate::metrics::WORKER_DELIVERIES, "consumer" => consumer.to_owned(), "state" => Holding::WAITING),
        }
    }

    fn len(&self) -> usize {
        self.held.len()
    }

    fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    fn hold(&mut self, extra: impl IntoIterator<Item = Received<D>>) {
        let before = self.held.len();
        self.held.extend(extra);
        self.waiting.increment((self.held.len() - before) as f64);
    }

    /// As many held deliveries as there are `permits`, in the order they arrived, each with its place.
    fn take(&mut self, permits: Vec<tokio::sync::OwnedSemaphorePermit>) -> Vec<Received<D>> {
        let n = permits.len().min(self.held.len());
        self.waiting.decrement(n as f64);
        self.held
            .drain(..n)
            .zip(permits)
            .map(|(r, permit)| Received {
                permit: Some(permit),
                ..r
            })
            .collect()
    }

    /// Everything still held, its leases no longer kept.
    fn drain(&mut self) -> Vec<D> {
        self.waiting.decrement(self.held.len() as f64);
        self.held.drain(..).map(|r| r.delivery).collect()
    }
}

/// Resolves at `at`, never when `None`.
pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A received delivery, its lease kept alive from the moment it arrived, and its place among the messages
/// out of the queue.
pub(super) struct Received<D> {
    pub(super) delivery: D,
    pub(super) guard: Option<LeaseGuard>,
    pub(super) permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A batch that one receive did not fill, waiting for the next receives until its linger ends; its
/// deliveries are counted as `waiting` in `txinbox_worker_deliveries`.
pub(super) struct Lingering<D> {
    pub(super) batch: Vec<Received<D>>,
    /// When the batch goes, full or not; `None` while it is empty.
    pub(super) until: Option<Instant>,
    pub(super) waiting: metrics::Gauge,
}

impl<D> Lingering<D> {
    pub(super) fn new(consumer: &str) -> Self {
        Self {
            batch: Vec::new(),
            until: None,
            waiting: metrics::gauge!(crate::metrics::WORKER_DELIVERIES, "consumer" => consumer.to_owned(), "state" => Holding::WAITING),
        }
    }

    /// Adds what a receive brought and returns the batches to process now: every full one (`full`
    /// deliveries) and, without a linger, the rest. What is left waits until `linger` after its first
    /// delivery arrived.
    pub(super) fn add(
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
    pub(super) fn take(&mut self) -> Vec<Received<D>> {
        self.until = None;
        self.waiting.decrement(self.batch.len() as f64);
        std::mem::take(&mut self.batch)
    }
}

/// A receive loop waiting for a place out of the queue, told to the health while it lives.
struct WaitingForPlace<'a>(Option<&'a crate::runtime::health::Health>);

impl<'a> WaitingForPlace<'a> {
    fn new(health: Option<&'a crate::runtime::health::Health>) -> Self {
        if let Some(h) = health {
            h.worker_waiting_for_place(true);
        }
        Self(health)
    }
}

impl Drop for WaitingForPlace<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.0 {
            h.worker_waiting_for_place(false);
        }
    }
}

/// What the tasks processing received deliveries share.
pub(super) struct Dispatch<P> {
    pub(super) processor: Arc<P>,
    pub(super) slots: Arc<Semaphore>,
    pub(super) concurrency: usize,
    pub(super) stop: CancellationToken,
    pub(super) draining: CancellationToken,
    /// Cancelled when the worker gives up waiting, [`SHUTDOWN_GRACE`](super::SHUTDOWN_GRACE) after the
    /// shutdown deadline: every processing task drops its work where it is.
    pub(super) abandon: CancellationToken,
    pub(super) report: Arc<Mutex<Tally>>,
    pub(super) consumer: String,
    pub(super) tracker: TaskTracker,
    /// The worker's options, shared by its processing tasks: the delay of a hand-back after a panic
    /// ([`WorkerOptions::panic_backoff`](super::WorkerOptions::panic_backoff)).
    pub(super) opts: Arc<super::WorkerOptions>,
}

impl<P> Dispatch<P> {
    /// Processes one delivery, or several in one transaction, in a task of its own: waits for their slots
    /// (one per delivery, at most all of them), processes, counts the outcomes, and lets the deliveries' places
    /// out of the queue go once they are settled.
    pub(super) fn spawn<D: Delivery>(&self, received: Vec<Received<D>>)
    where
        P: Processor<LeasedDelivery<D>>,
    {
        if received.is_empty() {
            return;
        }
        let processor = self.processor.clone();
        let slots = self.slots.clone();
        let (all, stop, draining) = (self.concurrency, self.stop.clone(), self.draining.clone());
        let abandon = self.abandon.clone();
        let report = self.report.clone();
        let consumer = self.consumer.clone();
        let opts = self.opts.clone();
        let n = received.len();
        // Counted before the task runs, so that a worker abandoning it before its first poll counts it too.
        report.lock().unwrap_or_else(|p| p.into_inner()).in_flight += n as u64;
        let work = async move {
            let slot = take_slots(&slots, n, all, &consumer, &stop, &draining).await;
            let (mut leased, mut guards, mut permits) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            // What the processor drops unsettled (it panicked) comes back here, to be handed back.
            let unsettled = super::Unsettled::default();
            for r in received {
                leased.push(LeasedDelivery::new(
                    r.delivery,
                    r.guard.as_ref().map(|g| g.stopper()),
                    Some(unsettled.clone()),
                ));
                guards.push(r.guard);
                permits.push(r.permit);
            }
            let processed = std::panic::AssertUnwindSafe(async {
                match <[_; 1]>::try_from(leased) {
                    Ok([one]) => vec![processor.process(one, slot.stop.clone()).await],
                    Err(batch) => processor.process_batch(batch, slot.stop.clone()).await,
                }
            });
            // The processing future, and with it what the processor still holds, is dropped by the end of this
            // statement: a delivery it had not settled is then in `unsettled`.
            let processed = futures::FutureExt::catch_unwind(processed).await;
            let (outcomes, panicked) = match processed {
                Ok(outcomes) => (outcomes, Vec::new()),
                Err(panic) => {
                    metrics::counter!(crate::metrics::RETRIES, "consumer" => consumer.clone(), "reason" => "panic")
                        .increment(n as u64);
                    let unsettled =
                        std::mem::take(&mut *unsettled.lock().unwrap_or_else(|p| p.into_inner()));
                    // The user's code (a processor of their own, a body type, a router) panicked: what it had not
                    // settled is handed back to the broker at once (below), rather than held until its lock or
                    // visibility timeout. Said, with the panic's message, and counted. Dropped, an SQS message
                    // waits out its visibility ("Once the timeout period expires, the message returns to a
                    // subsequent receive request unless you delete it from the queue first"), released it comes
                    // back now (`ChangeMessageVisibility`: "The minimum is 0 seconds"; Service Bus abandon: "This
                    // will make the message available again for immediate processing as the lock on the message
                    // held by the receiver will be released"). From a message's second delivery on, it is handed
                    // back after a delay growing with its delivery count (`WorkerOptions::panic_backoff`), so that
                    // a message that panics every time does not come straight back into the same panic.
                    tracing::error!(
                        consumer,
                        deliveries = n,
                        unsettled = unsettled.len(),
                        panic = %panic_text(panic.as_ref()),
                        "processing panicked (a bug in the processor): the deliveries it had not settled are handed back to the broker (at once the first time, then after the panic backoff)"
                    );
                    let outcomes = (0..n)
                        .map(|_| Outcome::Retry {
                            reason: "processing panicked".into(),
                        })
                        .collect();
                    (outcomes, unsettled)
                }
            };
            let lost = guards.iter().flatten().filter(|g| g.lost()).count() as u64;
            // The lease keepers stop before the hand-back, so that a renewal racing with it is not a lost lease.
            drop(guards);
            // Stopping, the worker hands them back at once: a delayed release may hold its caller (Service Bus
            // over REST) past the shutdown deadline.
            let stopping = draining.is_cancelled();
            let delay_of = |d: &D| match stopping {
                true => Duration::ZERO,
                false => opts.panic_release_delay(d.message().delivery_count),
            };
            let panicked = release_after(
                panicked,
                delay_of,
                &consumer,
                HandedBack::PROCESSOR_PANICKED,
            )
            .await;
            // Still waiting for a slot when the stop came: given to the processor to be released unapplied.
            let released = match slot.permit {
                Some(_) => 0,
                None => outcomes
                    .iter()
                    .filter(|o| matches!(o, Outcome::Interrupted))
                    .count(),
            };
            count_handed_back(&consumer, HandedBack::WAITING_FOR_SLOT, released);
            let mut t = report.lock().unwrap_or_else(|p| p.into_inner());
            // Abandoned meanwhile (it answered too late): already counted in `abandoned`, never twice.
            if !t.closed {
                t.in_flight = t.in_flight.saturating_sub(n as u64);
                t.report.handed_back += (released + panicked) as u64;
                for o in outcomes {
                    *t.report.outcomes.entry(o.kind()).or_default() += 1;
                }
                t.report.leases_lost += lost;
            }
            drop(t);
            drop((slot, permits));
        };
        self.tracker.spawn(async move {
            tokio::select! {
                biased;
                // Dropped where it waits, as a SIGKILL would stop it (see `Worker::run`): the worker counted
                // these deliveries in `abandoned` before it cancelled the token.
                _ = abandon.cancelled() => {}
                _ = work => {}
            }
        });
    }
}

impl<P> Dispatch<P> {
    /// Hands back to the broker (released with no delay, unapplied) deliveries the worker stopped with and
    /// never gave to the processor (`reason`: what the receive in flight at the stop brought, a receive's surplus
    /// that never had places), in a task the shutdown waits for. They count as in flight until the releases
    /// answer, so that a hand-back still unanswered past the shutdown grace is counted abandoned.
    pub(super) fn hand_back<D: Delivery>(&self, deliveries: Vec<D>, reason: &'static str) {
        if deliveries.is_empty() {
            return;
        }
        let n = deliveries.len() as u64;
        self.report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .in_flight += n;
        let consumer = self.consumer.clone();
        let abandon = self.abandon.clone();
        let report = self.report.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                biased;
                // Counted in `abandoned` by the worker before it cancelled the token.
                _ = abandon.cancelled() => {}
                released = release_now(deliveries, &consumer, reason) => {
                    let mut t = report.lock().unwrap_or_else(|p| p.into_inner());
                    if !t.closed {
                        t.in_flight = t.in_flight.saturating_sub(n);
                        t.report.handed_back += released as u64;
                    }
                }
            }
        });
    }
}

/// `n` deliveries counted in `txinbox_worker_deliveries{consumer, state}` while this lives.
pub(super) struct Holding {
    pub(super) consumer: String,
    pub(super) state: &'static str,
    pub(super) n: f64,
}

impl Holding {
    pub(super) const WAITING: &'static str = "waiting";
    pub(super) const PROCESSING: &'static str = "processing";

    pub(super) fn new(consumer: &str, state: &'static str, n: usize) -> Self {
        let h = Self {
            consumer: consumer.to_owned(),
            state,
            n: n as f64,
        };
        h.gauge().increment(h.n);
        h
    }

    pub(super) fn gauge(&self) -> metrics::Gauge {
        metrics::gauge!(crate::metrics::WORKER_DELIVERIES, "consumer" => self.consumer.clone(), "state" => self.state)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.gauge().decrement(self.n);
    }
}

/// The processing slots of a received delivery or batch, counted in `txinbox_worker_deliveries` while held.
pub(super) struct Slot {
    /// `None` when the stop was signalled before a slot was free.
    pub(super) permit: Option<tokio::sync::OwnedSemaphorePermit>,
    pub(super) _processing: Holding,
    /// What the processor is given: the worker's stop token, or, when no slot was taken, the cancelled
    /// `draining` token, so that what it was given is released at once without being applied.
    pub(super) stop: CancellationToken,
}

/// Waits for `n` processing slots (at most `all`, the worker's concurrency) for a received delivery or batch,
/// counted as `waiting` meanwhile. Gives up when the stop is signalled first (`draining`); a slot free at
/// once is taken even then (without prefetch a delivery never waits for its slot).
pub(super) async fn take_slots(
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
        permit,
        _processing: Holding::new(consumer, Holding::PROCESSING, n),
    }
}

/// One line: what kept failing and for how long (the error's own text never holds a secret).
pub(super) fn give_up_reason(e: &BrokerError, limit: Duration) -> String {
    format!(
        "receives failed for {}s with an error a retry cannot fix ({}): {e}",
        limit.as_secs(),
        e.kind().as_str()
    )
}

/// Waits (at most `limit`) for a receive that was in flight when shutdown began and returns what it brought, to
/// be handed back ([`Dispatch::hand_back`]); nothing when it failed (counted as a failed receive in `report` and
/// `txinbox_receive_errors_total`) or did not answer in time.
pub(super) async fn received_at_stop<D: Delivery>(
    receive: impl Future<Output = Result<Vec<D>, BrokerError>>,
    limit: Duration,
    consumer: &str,
    report: &Mutex<Tally>,
) -> Vec<D> {
    if limit.is_zero() {
        // Dropped on purpose (`WorkerOptions::shutdown_receive_wait` zero).
        return Vec::new();
    }
    match tokio::time::timeout(limit, receive).await {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => {
            // Nothing was received (or it is not known what): whatever the broker locked comes back after its
            // timeout. The error's text may quote an endpoint: masked.
            metrics::counter!(crate::metrics::RECEIVE_ERRORS, "consumer" => consumer.to_owned(), "kind" => e.kind().as_str())
                .increment(1);
            report
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .report
                .receive_errors += 1;
            tracing::warn!(
                consumer,
                kind = e.kind().as_str(),
                error = %crate::error::redact_secrets(&e.to_string()),
                "the receive in flight at shutdown failed; what it may have locked comes back after its timeout"
            );
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(
                consumer,
                "the receive in flight at shutdown did not finish in time; what it brings stays locked until its timeout"
            );
            Vec::new()
        }
    }
}

/// Why a worker handed deliveries back unapplied: the `reason` label of `txinbox_worker_handed_back_total`.
pub(super) struct HandedBack;

impl HandedBack {
    /// Brought by the receive in flight when the worker stopped.
    pub(super) const RECEIVE_IN_FLIGHT: &'static str = "receive_in_flight";
    /// Brought by a receive beyond what it asked for, still waiting for a place when the worker stopped.
    pub(super) const SURPLUS: &'static str = "surplus";
    /// Received ahead (prefetch) or in a lingering batch, still waiting for a slot when the worker stopped.
    pub(super) const WAITING_FOR_SLOT: &'static str = "waiting_for_slot";
    /// Left unsettled by a processor that panicked (a bug in it): handed back at once, while the worker runs.
    pub(super) const PROCESSOR_PANICKED: &'static str = "processor_panicked";
    /// Every reason, each series registered at zero when a worker starts.
    pub(super) const ALL: [&'static str; 4] = [
        Self::RECEIVE_IN_FLIGHT,
        Self::SURPLUS,
        Self::WAITING_FOR_SLOT,
        Self::PROCESSOR_PANICKED,
    ];
}

/// Counts `n` deliveries handed back for `reason` in `txinbox_worker_handed_back_total`.
pub(super) fn count_handed_back(consumer: &str, reason: &'static str, n: usize) {
    if n > 0 {
        metrics::counter!(crate::metrics::WORKER_HANDED_BACK, "consumer" => consumer.to_owned(), "reason" => reason)
            .increment(n as u64);
    }
}

/// Releases `deliveries` with no delay (handed back unapplied, counted for `reason`), logging each release that
/// fails or panics (counted as a failed settle instead). Returns how many were handed back.
async fn release_now<D: Delivery>(
    deliveries: Vec<D>,
    consumer: &str,
    reason: &'static str,
) -> usize {
    release_after(deliveries, |_| Duration::ZERO, consumer, reason).await
}

/// [`release_now`], each delivery released after `delay_of` it.
async fn release_after<D: Delivery>(
    deliveries: Vec<D>,
    delay_of: impl Fn(&D) -> Duration,
    consumer: &str,
    reason: &'static str,
) -> usize {
    use futures::FutureExt;
    if deliveries.is_empty() {
        return 0;
    }
    let n = deliveries.len();
    let results = futures::future::join_all(
        deliveries
            .into_iter()
            // The call itself inside the future: an adapter's release may panic before its future does.
            .map(|d| {
                let delay = delay_of(&d);
                std::panic::AssertUnwindSafe(async move { d.release(delay).await }).catch_unwind()
            }),
    )
    .await;
    let mut failed = 0;
    for result in results {
        match result {
            Ok(Ok(())) => continue,
            // Not handed back: the message stays locked until its lock or visibility timeout, then comes back.
            Ok(Err(e)) => tracing::warn!(
                consumer,
                kind = e.kind().as_str(),
                error = %crate::error::redact_secrets(&e.to_string()),
                "handing back a message failed; it comes back after its lock or visibility timeout"
            ),
            Err(_) => tracing::error!(
                consumer,
                "handing back a message panicked (a bug in the broker adapter's release); it comes back after its lock or visibility timeout"
            ),
        }
        failed += 1;
    }
    count_handed_back(consumer, reason, n - failed);
    if failed > 0 {
        metrics::counter!(crate::metrics::SETTLE_FAILURES, "consumer" => consumer.to_owned(), "op" => "release")
            .increment(failed as u64);
    }
    tracing::info!(
        consumer,
        reason,
        handed_back = n - failed,
        failed,
        "messages handed back to the broker"
    );
    n - failed
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::broker::{DeadLetter, Lease, ReceivedMessage};

    /// A delivery whose hand-back fails with an error quoting a signed endpoint.
    struct ReleaseFails(ReceivedMessage);

    fn refused() -> BrokerError {
        BrokerError::new(
            BrokerErrorKind::ServerError,
            "abandon",
            "HTTP 503 from https://ns.servicebus.windows.net/q/messages/1?sig=S3CRET&se=1",
        )
    }

    impl Delivery for ReleaseFails {
        fn message(&self) -> &ReceivedMessage {
            &self.0
        }
        async fn ack(self) -> Result<(), BrokerError> {
            Ok(())
        }
        async fn release(self, _: Duration) -> Result<(), BrokerError> {
            Err(refused())
        }
        async fn dead_letter(self, _: DeadLetter) -> Result<(), BrokerError> {
            Ok(())
        }
        fn lease(&self) -> Option<Arc<dyn Lease>> {
            None
        }
    }

    /// A delivery whose release holds its caller for the delay, as Service Bus's over REST does.
    struct HoldsOnRelease(ReceivedMessage);

    impl Delivery for HoldsOnRelease {
        fn message(&self) -> &ReceivedMessage {
            &self.0
        }
        async fn ack(self) -> Result<(), BrokerError> {
            Ok(())
        }
        async fn release(self, _: Duration) -> Result<(), BrokerError> {
            Ok(())
        }
        async fn dead_letter(self, _: DeadLetter) -> Result<(), BrokerError> {
            Ok(())
        }
        fn lease(&self) -> Option<Arc<dyn Lease>> {
            None
        }
        fn release_holds(&self) -> bool {
            true
        }
    }

    /// The worker's wrapper says what its delivery says of its release: the shard router settles a release
    /// that holds its caller in the background, and the worker's deliveries are all wrapped.
    #[test]
    fn a_leased_delivery_answers_whether_its_release_holds() {
        let d = LeasedDelivery::new(
            HoldsOnRelease(ReceivedMessage::new(b"{}".to_vec())),
            None,
            None,
        );
        assert!(d.release_holds());
    }

    /// Keeps the warnings' `error` fields.
    #[derive(Default)]
    struct Warnings(Mutex<Vec<String>>, AtomicU64);

    struct ErrorField<'a>(&'a mut Option<String>);

    impl tracing::field::Visit for ErrorField<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "error" {
                *self.0 = Some(format!("{value:?}"));
            }
        }
    }

    impl tracing::Subscriber for &'static Warnings {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(self.1.fetch_add(1, Ordering::SeqCst) + 1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() != tracing::Level::WARN {
                return;
            }
            let mut error = None;
            event.record(&mut ErrorField(&mut error));
            if let Some(e) = error {
                self.0.lock().unwrap().push(e);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// What the worker does with a receive in flight at its stop: waits for it, then releases what it brought.
    async fn hand_back<D: Delivery>(
        receive: impl Future<Output = Result<Vec<D>, BrokerError>>,
        limit: Duration,
        consumer: &str,
    ) {
        let brought = received_at_stop(receive, limit, consumer, &Mutex::default()).await;
        release_now(brought, consumer, HandedBack::RECEIVE_IN_FLIGHT).await;
    }

    /// A delivery whose release panics (a bug in an adapter).
    struct ReleasePanics(ReceivedMessage);

    impl Delivery for ReleasePanics {
        fn message(&self) -> &ReceivedMessage {
            &self.0
        }
        async fn ack(self) -> Result<(), BrokerError> {
            Ok(())
        }
        async fn release(self, _: Duration) -> Result<(), BrokerError> {
            panic!("the adapter's release panicked")
        }
        async fn dead_letter(self, _: DeadLetter) -> Result<(), BrokerError> {
            Ok(())
        }
        fn lease(&self) -> Option<Arc<dyn Lease>> {
            None
        }
    }

    /// A delivery whose release panics in the call itself, before its future (a hand-written adapter).
    struct ReleaseCallPanics(ReceivedMessage);

    impl Delivery for ReleaseCallPanics {
        fn message(&self) -> &ReceivedMessage {
            &self.0
        }
        async fn ack(self) -> Result<(), BrokerError> {
            Ok(())
        }
        fn release(self, _: Duration) -> impl Future<Output = Result<(), BrokerError>> + Send {
            if !self.0.body.is_empty() {
                panic!("the adapter's release call panicked");
            }
            async { Ok(()) }
        }
        async fn dead_letter(self, _: DeadLetter) -> Result<(), BrokerError> {
            Ok(())
        }
        fn lease(&self) -> Option<Arc<dyn Lease>> {
            None
        }
    }

    /// A release that panics in the call itself, not in its future, is a failed release like one whose future
    /// panics (seen failing so: the panic escaped the hand-back).
    #[tokio::test(flavor = "current_thread")]
    async fn a_release_call_that_panics_is_a_failed_release() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let panics = async {
            Ok(vec![ReleaseCallPanics(ReceivedMessage::new(
                b"{}".to_vec(),
            ))])
        };
        hand_back(panics, Duration::from_secs(1), "c").await;
        let failed: u64 = snap
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Counter(n) if key.key().name() == crate::metrics::SETTLE_FAILURES => {
                    Some(n)
                }
                _ => None,
            })
            .sum();
        assert_eq!(failed, 1);
    }

    /// A hand-back that fails or panics is not counted handed back (the message stays locked until its lock or
    /// visibility timeout) but as a failed release; a panic does not escape into the receive loop.
    #[tokio::test(flavor = "current_thread")]
    async fn a_hand_back_that_fails_or_panics_is_a_failed_release_not_a_hand_back() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let fails = async { Ok(vec![ReleaseFails(ReceivedMessage::default())]) };
        hand_back(fails, Duration::from_secs(1), "c").await;
        let panics = async { Ok(vec![ReleasePanics(ReceivedMessage::default())]) };
        hand_back(panics, Duration::from_secs(1), "c").await;
        let (mut handed_back, mut failed) = (0, 0);
        for (key, _, _, value) in snap.snapshot().into_vec() {
            if let DebugValue::Counter(n) = value {
                match key.key().name() {
                    crate::metrics::WORKER_HANDED_BACK => handed_back += n,
                    crate::metrics::SETTLE_FAILURES => failed += n,
                    _ => {}
                }
            }
        }
        assert_eq!((handed_back, failed), (0, 2));
    }

    /// A message received after the stop whose hand-back fails is said at warn, with the error (its secret
    /// masked), not dropped quietly; so is a receive in flight at the stop that fails.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_hand_back_at_shutdown_is_logged_with_its_error() {
        let warnings: &'static Warnings = Box::leak(Box::default());
        let _guard = tracing::subscriber::set_default(warnings);
        let received = async { Ok(vec![ReleaseFails(ReceivedMessage::default())]) };
        hand_back(received, Duration::from_secs(1), "c").await;
        let failed = async { Err::<Vec<ReleaseFails>, _>(refused()) };
        hand_back(failed, Duration::from_secs(1), "c").await;
        let logged = warnings.0.lock().unwrap().clone();
        assert_eq!(logged.len(), 2, "{logged:?}");
        for line in &logged {
            assert!(line.contains("HTTP 503"), "{line}");
            assert!(!line.contains("S3CRET"), "a secret in a log line: {line}");
        }
    }
}
