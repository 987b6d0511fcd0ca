//! The worker around the inbox: prefetch, shutdown with deliveries held, the gauges of what it holds.

use super::*;

type Running = Arc<(
    std::sync::atomic::AtomicUsize,
    std::sync::atomic::AtomicUsize,
)>;

/// A handler that takes `work` and records how many handlers ran at once, at most.
pub(super) fn slow_processor(
    store: &MemStore,
    work: Duration,
    running: Running,
) -> InboxProcessor<MemStore, Meeting, impl Handler<MemStore, Meeting>> {
    use std::sync::atomic::Ordering::SeqCst;
    inbox(store).bind(move |tx: MemTx, msg: Message<Meeting>| {
        let running = running.clone();
        async move {
            let now = running.0.fetch_add(1, SeqCst) + 1;
            running.1.fetch_max(now, SeqCst);
            tokio::time::sleep(work).await;
            running.0.fetch_sub(1, SeqCst);
            tx.write(format!("task-{}", msg.body.opportunity));
            Ok(Handled::done())
        }
    })
}

/// Runs `n` messages through a worker of concurrency 4 with `prefetch`; returns (most handlers at once, most
/// messages the queue saw in flight at once, the report).
async fn run_with_prefetch(n: usize, prefetch: usize) -> (usize, usize, crate::WorkerReport) {
    use crate::broker::mem::QueueOptions;
    use crate::{Worker, WorkerOptions};
    let store = MemStore::default();
    let q = MemoryQueue::new(
        QueueOptions::default()
            .wait(Duration::from_millis(20))
            .round_trip(Duration::from_millis(5))
            // Shorter than a prefetched delivery waits for its slot (up to three handlers' work, 720 ms): only
            // the lease keeper keeps it. It renews every third (200 ms), so a renewal would have to be late by
            // 400 ms for the lease to lapse: a loaded machine's scheduling does not do that (with 150 ms and
            // 60 ms of work, a renewal 100 ms late under the test command's load lost eight leases).
            .visibility_timeout(Duration::from_millis(600)),
    );
    for i in 0..n {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let running: Running = Arc::default();
    let report = Worker::new(
        q.receiver(),
        slow_processor(&store, Duration::from_millis(240), running.clone()),
    )
    .options(
        WorkerOptions::default()
            .concurrency(4)
            .batch_size(10)
            .prefetch(prefetch),
    )
    .run_until_idle()
    .await;
    assert_eq!(store.state().effects.len(), n, "{report}");
    assert_eq!(q.state(), QueueState::default(), "{report}");
    let most = running.1.load(std::sync::atomic::Ordering::SeqCst);
    (most, q.in_flight_max(), report)
}

/// Without prefetch a receive asks only for free slots: the queue never sees more than `concurrency` in
/// flight. With it, up to `concurrency + prefetch` are out of the queue, still at most `concurrency` handlers
/// run at once, and the waiting deliveries keep their leases (no redelivery, no lost lease).
#[tokio::test]
async fn prefetch_receives_ahead_within_its_bound_and_keeps_the_leases() {
    use crate::OutcomeKind;
    let (handlers, held, report) = run_with_prefetch(40, 0).await;
    assert!(handlers <= 4 && held <= 4, "{handlers} {held}");
    assert_eq!(report.count(OutcomeKind::Applied), 40);

    let (handlers, held, report) = run_with_prefetch(40, 12).await;
    assert!(handlers <= 4, "{handlers} handlers at once");
    assert!(held > 4 && held <= 16, "{held} in flight at once");
    assert_eq!(report.count(OutcomeKind::Applied), 40, "{report}");
    assert_eq!(report.total(), 40, "no redelivery: {report}");
    assert_eq!(report.leases_lost, 0);
}

/// A batch larger than the worker's concurrency (prefetch lets a receive bring more than the slots) takes
/// every slot and still runs.
#[tokio::test]
async fn a_batch_larger_than_the_concurrency_takes_every_slot() {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker, WorkerOptions};
    let store = MemStore::default();
    store.state().savepoints = true;
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    for i in 0..30 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let report = Worker::new(q.receiver(), processor(&store))
        .options(
            WorkerOptions::default()
                .concurrency(2)
                .prefetch(10)
                .batch_size(10)
                .batch_commit(10),
        )
        .run_until_idle()
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 30, "{report}");
    assert_eq!(q.state(), QueueState::default());
}

/// Ten messages; a worker of concurrency 1 and prefetch 5 whose handler takes `work`, stopped once it holds
/// six (one being applied, five waiting for the slot), with `deadline` to drain. Returns the report, the
/// effects written and the queue's (visible, in flight) after the worker stopped.
async fn stop_with_prefetch(
    work: Duration,
    deadline: Duration,
) -> (crate::WorkerReport, usize, (usize, usize)) {
    use crate::broker::mem::QueueOptions;
    use crate::{Worker, WorkerOptions};
    let store = MemStore::default();
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    for i in 0..10 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let worker = Worker::new(q.receiver(), slow_processor(&store, work, Arc::default())).options(
        WorkerOptions::default()
            .concurrency(1)
            .prefetch(5)
            .shutdown_timeout(deadline)
            .shutdown_receive_wait(Some(Duration::ZERO)),
    );
    let q2 = q.clone();
    let report = worker
        .run_until(async move {
            while q2.state().in_flight < 6 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    let effects = store.state().effects.len();
    let s = q.state();
    (report, effects, (s.visible, s.in_flight))
}

/// A handler that never ends: at the shutdown deadline it is rolled back and released; the prefetched
/// deliveries behind it were released when shutdown began. None is applied, none is left to its visibility
/// timeout.
#[tokio::test]
async fn at_the_deadline_the_running_delivery_and_the_prefetched_ones_are_released() {
    use crate::OutcomeKind;
    let (report, effects, queue) =
        stop_with_prefetch(Duration::from_secs(3600), Duration::from_millis(200)).await;
    assert_eq!(report.count(OutcomeKind::Interrupted), 6, "{report}");
    assert_eq!(effects, 0);
    assert_eq!(queue, (10, 0));
}

/// When shutdown begins, the delivery being applied finishes (applied, settled) and the prefetched ones still
/// waiting for a slot are handed back at once, unapplied, long before the shutdown deadline.
#[tokio::test]
async fn at_shutdown_prefetched_deliveries_waiting_for_a_slot_are_handed_back() {
    use crate::OutcomeKind;
    let (report, effects, queue) =
        stop_with_prefetch(Duration::from_millis(300), Duration::from_secs(3600)).await;
    assert_eq!(report.count(OutcomeKind::Applied), 1, "{report}");
    assert_eq!(report.count(OutcomeKind::Interrupted), 5, "{report}");
    assert_eq!(effects, 1);
    assert_eq!(queue, (9, 0));
}

/// `txinbox_worker_deliveries` (processing, waiting) from the debugging recorder. A snapshot swaps each gauge
/// to zero: the values are the sums of the snapshots, kept in `sums`.
fn gauges(
    snap: &metrics_util::debugging::Snapshotter,
    sums: &mut HashMap<String, f64>,
) -> (f64, f64) {
    use metrics_util::debugging::DebugValue;
    for (key, _, _, value) in snap.snapshot().into_vec() {
        if let (DebugValue::Gauge(v), true) =
            (value, key.key().name() == crate::metrics::WORKER_DELIVERIES)
        {
            let state = key.key().labels().find(|l| l.key() == "state").unwrap();
            *sums.entry(state.value().to_owned()).or_default() += v.into_inner();
        }
    }
    let get = |s: &str| sums.get(s).copied().unwrap_or(f64::NAN);
    (get("processing"), get("waiting"))
}

/// Runs `worker` until `txinbox_worker_deliveries` reads `want` (processing, waiting), then stops it; returns
/// what the gauges read once it stopped.
pub(super) async fn stop_at_gauges<R, P>(
    worker: crate::Worker<R, P>,
    snap: &metrics_util::debugging::Snapshotter,
    want: (f64, f64),
) -> (f64, f64)
where
    R: crate::Receiver,
    P: crate::Processor<crate::LeasedDelivery<R::Delivery>>,
{
    let sums = Arc::new(Mutex::new(HashMap::new()));
    let (s2, sums2) = (snap.clone(), sums.clone());
    let _report = worker
        .run_until(async move {
            while gauges(&s2, &mut sums2.lock().unwrap()) != want {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
    let after = gauges(snap, &mut sums.lock().unwrap());
    after
}

/// `txinbox_worker_deliveries{state}` counts the deliveries waiting for a slot and those holding one while
/// the worker runs, and returns to zero when it stops.
#[tokio::test(flavor = "current_thread")]
async fn the_worker_counts_the_deliveries_it_holds_by_state() {
    use crate::broker::mem::QueueOptions;
    use crate::{Worker, WorkerOptions};
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemStore::default();
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    for i in 0..10 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let worker = Worker::new(
        q.receiver(),
        slow_processor(&store, Duration::from_secs(3600), Arc::default()),
    )
    .options(
        WorkerOptions::default()
            .concurrency(2)
            .prefetch(4)
            .shutdown_timeout(Duration::from_millis(100))
            .shutdown_receive_wait(Some(Duration::ZERO)),
    );
    // Stop once the worker holds two handlers and four deliveries behind them.
    assert_eq!(stop_at_gauges(worker, &snap, (2.0, 4.0)).await, (0.0, 0.0));
}

/// A receiver that answers every receive with up to `extra` more deliveries than it was asked for (an adapter
/// that ignores `max`).
struct Greedy {
    inner: crate::broker::mem::MemoryReceiver,
    extra: usize,
}

impl crate::Receiver for Greedy {
    type Delivery = crate::broker::mem::MemoryDelivery;

    async fn receive(&mut self, max: usize) -> Result<Vec<Self::Delivery>, crate::BrokerError> {
        self.inner.receive(max + self.extra).await
    }
}

/// A receive that brings more deliveries than it asked for never takes the worker past its bound: the extra
/// ones wait for places and take them before any further receive (never held while further receives bring
/// more), at most `concurrency` handlers run, and every message is applied once and received once. Handing
/// the extra ones back to the broker instead made each be received again: counted toward the queue's maximum
/// receive count, a message handed back often enough was dead-lettered without ever being applied.
#[tokio::test]
async fn a_receive_that_brings_more_than_asked_stays_within_the_bound() {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker, WorkerOptions};
    let store = MemStore::default();
    // A second receive of any message dead-letters it: each is received exactly once.
    let q = MemoryQueue::new(
        QueueOptions::default()
            .wait(Duration::from_millis(20))
            .max_receive_count(Some(1)),
    );
    for i in 0..30 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let running: Running = Arc::default();
    let report = Worker::new(
        Greedy {
            inner: q.receiver(),
            extra: 5,
        },
        slow_processor(&store, Duration::from_millis(30), running.clone()),
    )
    .options(WorkerOptions::default().concurrency(2).batch_size(10))
    .run_until_idle()
    .await;
    assert_eq!(
        report.count(OutcomeKind::Applied),
        30,
        "{report} {}",
        q.state()
    );
    assert_eq!(store.state().effects.len(), 30);
    assert_eq!(q.state(), QueueState::default(), "{report}");
    assert!(
        running.1.load(std::sync::atomic::Ordering::SeqCst) <= 2,
        "handlers at once"
    );
    // The queue counts what the receive took out before the worker saw it: one receive's overshoot (the 2
    // asked for and 5 more), never more than that piling up while the extra ones wait.
    assert!(
        q.in_flight_max() <= 2 + 5,
        "{} messages out of the queue at once with concurrency 2",
        q.in_flight_max()
    );
}

/// The extra deliveries of a receive that brought more than it asked for are counted as waiting while they
/// wait for places; at shutdown they go back to the broker unapplied, as the gauges and the queue show.
#[tokio::test(flavor = "current_thread")]
async fn a_receives_extra_deliveries_wait_counted_and_go_back_at_shutdown() {
    use crate::broker::mem::QueueOptions;
    use crate::{Worker, WorkerOptions};
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemStore::default();
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    for i in 0..10 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let worker = Worker::new(
        Greedy {
            inner: q.receiver(),
            extra: 5,
        },
        slow_processor(&store, Duration::from_secs(3600), Arc::default()),
    )
    .options(
        WorkerOptions::default()
            .concurrency(1)
            .shutdown_timeout(Duration::from_millis(100))
            .shutdown_receive_wait(Some(Duration::ZERO)),
    );
    // One handler running, the five extra deliveries of its receive waiting behind it.
    assert_eq!(stop_at_gauges(worker, &snap, (1.0, 5.0)).await, (0.0, 0.0));
    assert!(store.state().effects.is_empty());
    let s = q.state();
    assert_eq!(
        (s.visible, s.in_flight, s.dead_lettered),
        (10, 0, 0),
        "{s}: every message back in the queue, none left to its visibility timeout"
    );
}

/// `txinbox_worker_handed_back_total` by reason: (receive_in_flight, surplus, waiting_for_slot).
fn handed_back(counted: &Counted) -> (u64, u64, u64) {
    let by = |reason| {
        count(
            counted,
            crate::metrics::WORKER_HANDED_BACK,
            &[("reason", reason)],
        )
    };
    (
        by("receive_in_flight"),
        by("surplus"),
        by("waiting_for_slot"),
    )
}

/// A queue of ten events.
fn ten_events() -> MemoryQueue {
    let q = MemoryQueue::new(
        crate::broker::mem::QueueOptions::default().wait(Duration::from_millis(20)),
    );
    for i in 0..10 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    q
}

/// A worker of concurrency 1 on `q` through `wrap` of a [`Greedy`] receiver bringing 5 more than asked, whose
/// handler never ends, stopped once 6 messages are out of the queue (one running, five extra waiting), with
/// `shutdown_timeout`.
async fn stop_a_greedy_worker<R: crate::Receiver>(
    q: &MemoryQueue,
    wrap: impl FnOnce(Greedy) -> R,
    shutdown_timeout: Duration,
) -> crate::WorkerReport {
    let q2 = q.clone();
    crate::Worker::new(
        wrap(Greedy {
            inner: q.receiver(),
            extra: 5,
        }),
        slow_processor(
            &MemStore::default(),
            Duration::from_secs(3600),
            Arc::default(),
        ),
    )
    .options(
        crate::WorkerOptions::default()
            .concurrency(1)
            .shutdown_timeout(shutdown_timeout)
            .shutdown_receive_wait(Some(Duration::ZERO)),
    )
    .run_until(async move {
        while q2.state().in_flight < 6 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// The extra deliveries of a receive that brought more than it asked for, still waiting for places at
/// shutdown, are handed back to the broker and counted as such (`reason="surplus"`): they have no outcome, and
/// each is one more receive toward the queue's maximum receive count.
#[tokio::test(flavor = "current_thread")]
async fn a_receives_surplus_handed_back_at_shutdown_is_counted() {
    use crate::OutcomeKind;
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let q = ten_events();
    // One receive asks for 1 and brings 6: one handler running (it never ends), five extra waiting.
    let report = stop_a_greedy_worker(&q, |g| g, Duration::from_millis(100)).await;
    // The running one is interrupted at the deadline: an outcome of its own, not a hand-back.
    assert_eq!(report.count(OutcomeKind::Interrupted), 1, "{report}");
    assert_eq!(report.total(), 1, "{report}");
    assert_eq!(report.handed_back, 5, "{report}");
    let counted = counters(&snap);
    assert_eq!(handed_back(&counted), (0, 5, 0), "{counted:?}");
    let s = q.state();
    assert_eq!((s.visible, s.in_flight), (10, 0), "{s}");
}

/// The prefetched deliveries still waiting for a slot when shutdown begins are handed back, counted as such
/// (`reason="waiting_for_slot"`) beside their outcome (interrupted); the one being applied is not.
#[tokio::test(flavor = "current_thread")]
async fn prefetched_deliveries_handed_back_at_shutdown_are_counted() {
    use crate::OutcomeKind;
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (report, effects, queue) =
        stop_with_prefetch(Duration::from_millis(300), Duration::from_secs(3600)).await;
    assert_eq!(report.count(OutcomeKind::Applied), 1, "{report}");
    assert_eq!(report.count(OutcomeKind::Interrupted), 5, "{report}");
    assert_eq!((effects, queue), (1, (9, 0)));
    assert_eq!(report.handed_back, 5, "{report}");
    let counted = counters(&snap);
    assert_eq!(handed_back(&counted), (0, 0, 5), "{counted:?}");
}

/// A receiver whose every receive takes 10 s before it takes what the queue holds.
struct Late(crate::broker::mem::MemoryReceiver);

impl crate::Receiver for Late {
    type Delivery = crate::broker::mem::MemoryDelivery;

    async fn receive(&mut self, max: usize) -> Result<Vec<Self::Delivery>, crate::BrokerError> {
        tokio::time::sleep(Duration::from_secs(10)).await;
        self.0.receive(max).await
    }
}

/// What the receive in flight at shutdown brings is handed back at once, counted as such
/// (`reason="receive_in_flight"`): those deliveries have no outcome.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn what_the_receive_in_flight_at_shutdown_brings_is_counted_handed_back() {
    use crate::{Worker, WorkerOptions};
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemStore::default();
    let q = MemoryQueue::default();
    for i in 0..3 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    // Stopped at 1 s, while the first receive waits until 10 s (inside the shutdown timeout, 20 s).
    let report = Worker::new(Late(q.receiver()), processor(&store))
        .options(WorkerOptions::default().concurrency(4))
        .run_until(tokio::time::sleep(Duration::from_secs(1)))
        .await;
    assert_eq!(report.total(), 0, "{report}");
    assert_eq!(report.handed_back, 3, "{report}");
    assert!(store.state().effects.is_empty());
    let counted = counters(&snap);
    assert_eq!(handed_back(&counted), (3, 0, 0), "{counted:?}");
    let s = q.state();
    assert_eq!((s.visible, s.in_flight), (3, 0), "{s}");
}

/// A delivery whose release never answers (a broker call that hangs).
struct ReleaseHangs(crate::broker::mem::MemoryDelivery);

impl crate::Delivery for ReleaseHangs {
    fn message(&self) -> &crate::ReceivedMessage {
        crate::Delivery::message(&self.0)
    }
    async fn ack(self) -> Result<(), crate::BrokerError> {
        crate::Delivery::ack(self.0).await
    }
    async fn release(self, _: Duration) -> Result<(), crate::BrokerError> {
        std::future::pending().await
    }
    async fn dead_letter(self, why: crate::DeadLetter) -> Result<(), crate::BrokerError> {
        crate::Delivery::dead_letter(self.0, why).await
    }
    fn lease(&self) -> Option<Arc<dyn crate::Lease>> {
        crate::Delivery::lease(&self.0)
    }
}

/// A receiver whose deliveries' releases never answer.
struct ReleasesHang<R>(R);

impl<R: crate::Receiver<Delivery = crate::broker::mem::MemoryDelivery>> crate::Receiver
    for ReleasesHang<R>
{
    type Delivery = ReleaseHangs;

    async fn receive(&mut self, max: usize) -> Result<Vec<ReleaseHangs>, crate::BrokerError> {
        Ok(self
            .0
            .receive(max)
            .await?
            .into_iter()
            .map(ReleaseHangs)
            .collect())
    }
}

/// A hand-back of a receive's surplus that never answers is abandoned past the shutdown grace and counted in
/// `WorkerReport::abandoned`, beside the delivery interrupted at the deadline whose release hangs too: the
/// report does not say everything answered.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_surplus_hand_back_that_never_answers_is_counted_abandoned() {
    let q = ten_events();
    let report = stop_a_greedy_worker(&q, ReleasesHang, Duration::from_secs(1)).await;
    assert_eq!(report.abandoned, 6, "{report}");
    assert_eq!(report.total(), 0, "{report}");
}

/// What the receive in flight at shutdown brought, its hand-back never answering, is abandoned past the
/// shutdown grace and counted in `WorkerReport::abandoned`.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_receive_in_flight_hand_back_that_never_answers_is_counted_abandoned() {
    use crate::{Worker, WorkerOptions};
    let store = MemStore::default();
    let q = MemoryQueue::default();
    for i in 0..3 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    // Stopped at 1 s; the receive answers at 10 s, inside the shutdown timeout (20 s).
    let report = Worker::new(ReleasesHang(Late(q.receiver())), processor(&store))
        .options(WorkerOptions::default().concurrency(4))
        .run_until(tokio::time::sleep(Duration::from_secs(1)))
        .await;
    assert_eq!(report.abandoned, 3, "{report}");
    assert_eq!(report.total(), 0, "{report}");
}

/// A receiver whose receive fails after 10 s.
struct FailsLate;

impl crate::Receiver for FailsLate {
    type Delivery = crate::broker::mem::MemoryDelivery;

    async fn receive(&mut self, _: usize) -> Result<Vec<Self::Delivery>, crate::BrokerError> {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Err(crate::BrokerError::new(
            crate::BrokerErrorKind::ServerError,
            "receive",
            "HTTP 503",
        ))
    }
}

/// The receive in flight at shutdown that fails is a failed receive like any other: in the report and in
/// `txinbox_receive_errors_total`.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_receive_in_flight_at_shutdown_that_fails_is_counted() {
    use crate::Worker;
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemStore::default();
    // Stopped at 1 s; the receive fails at 10 s, inside the shutdown timeout (20 s).
    let report = Worker::new(FailsLate, processor(&store))
        .run_until(tokio::time::sleep(Duration::from_secs(1)))
        .await;
    assert_eq!(report.receive_errors, 1, "{report}");
    let counted = counters(&snap);
    assert_eq!(
        count(&counted, crate::metrics::RECEIVE_ERRORS, &[]),
        1,
        "{counted:?}"
    );
}
