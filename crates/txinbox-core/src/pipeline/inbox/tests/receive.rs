//! Lingering batches across receives, and several receive loops sharing the places out of the queue.

use super::prefetch::{slow_processor, stop_at_gauges};
use super::*;

/// A queue of these options holding `n` events (`evt-0`, `evt-1`, ...), each for its own opportunity.
fn queue_of(opts: crate::broker::mem::QueueOptions, n: usize) -> MemoryQueue {
    let q = MemoryQueue::new(opts);
    for i in 0..n {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    q
}

/// A store with savepoints and a queue (long polls of `wait`) holding `n` events, `evt-0` on.
fn batch_setup(wait: Duration, n: usize) -> (MemStore, MemoryQueue) {
    let store = MemStore::default();
    store.state().savepoints = true;
    (
        store,
        queue_of(crate::broker::mem::QueueOptions::default().wait(wait), n),
    )
}

/// Six messages, each receive bringing one (`batch_size(1)`), batch commit 3: without a linger every receive
/// is its own transaction; with one, three receives fill one transaction, and every message is applied once.
#[tokio::test]
async fn a_linger_gathers_the_deliveries_of_several_receives_into_one_transaction() {
    use crate::{OutcomeKind, Worker, WorkerOptions};
    for (linger, transactions) in [(Duration::ZERO, 6), (Duration::from_secs(1), 2)] {
        let (store, q) = batch_setup(Duration::from_millis(20), 6);
        let report = Worker::new(q.receiver(), processor(&store))
            .options(
                WorkerOptions::default()
                    .batch_size(1)
                    .batch_commit(3)
                    .batch_linger(linger),
            )
            .run_until_idle()
            .await;
        assert_eq!(report.count(OutcomeKind::Applied), 6, "{report}");
        assert_eq!(report.total(), 6, "{report}");
        assert_eq!(store.state().begins, transactions, "linger {linger:?}");
        assert_eq!(store.state().effects.len(), 6);
        assert_eq!(q.state(), QueueState::default());
    }
}

/// A [`Receiver`](crate::Receiver) that counts the receives that have returned.
struct CountingReceiver {
    inner: crate::broker::mem::MemoryReceiver,
    returned: Arc<std::sync::atomic::AtomicUsize>,
}

impl CountingReceiver {
    /// A counting receiver on `q`, and its count.
    fn on(q: &MemoryQueue) -> (Self, Arc<std::sync::atomic::AtomicUsize>) {
        let returned = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = Self {
            inner: q.receiver(),
            returned: returned.clone(),
        };
        (r, returned)
    }
}

impl crate::Receiver for CountingReceiver {
    type Delivery = crate::broker::mem::MemoryDelivery;
    async fn receive(&mut self, max: usize) -> Result<Vec<Self::Delivery>, crate::BrokerError> {
        let r = self.inner.receive(max).await;
        self.returned
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        r
    }
}

/// Three messages, then nothing: the next receive long-polls for three seconds. A linger of 50 ms ends while
/// that receive still waits, and the batch is applied then, in one transaction, without waiting for it.
#[tokio::test]
async fn a_linger_ends_at_its_deadline_while_the_next_receive_still_waits() {
    use crate::{OutcomeKind, Worker, WorkerOptions};
    use std::sync::atomic::Ordering::SeqCst;
    let (store, q) = batch_setup(Duration::from_secs(3), 3);
    let (receiver, returned) = CountingReceiver::on(&q);
    let (store2, returned2) = (store.clone(), returned.clone());
    let report = Worker::new(receiver, processor(&store))
        .options(
            WorkerOptions::default()
                .batch_commit(10)
                .batch_linger(Duration::from_millis(50))
                .shutdown_receive_wait(Some(Duration::ZERO)),
        )
        .run_until(async move {
            while store2.state().effects.len() < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Applied while the second receive was still in its long poll.
            assert_eq!(returned2.load(SeqCst), 1, "receives returned");
        })
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 3, "{report}");
    assert_eq!(store.state().begins, 1, "one transaction");
    assert_eq!(returned.load(SeqCst), 1);
    assert_eq!(q.state(), QueueState::default());
}

/// A batch still lingering when shutdown begins is processed at once (applied and settled), not dropped to
/// wait for its visibility timeout, and not kept waiting for the receive in flight: whether the worker was
/// waiting for a free place (concurrency 3: the three lingering deliveries hold every one), or for its next
/// receive, dropped at shutdown (wait zero) or let finish (a long poll of two seconds).
#[tokio::test]
async fn at_shutdown_a_lingering_batch_is_processed_at_once() {
    use crate::{OutcomeKind, Worker, WorkerOptions};
    use std::sync::atomic::Ordering::SeqCst;
    for (concurrency, receive_wait) in [
        (3, Some(Duration::ZERO)),
        (8, Some(Duration::ZERO)),
        (8, None),
    ] {
        let (store, q) = batch_setup(Duration::from_secs(2), 3);
        let (receiver, returned) = CountingReceiver::on(&q);
        // How many receives had returned when the batch was applied.
        let (store2, returned2) = (store.clone(), returned.clone());
        let applied_after = tokio::spawn(async move {
            while store2.state().effects.len() < 3 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            returned2.load(SeqCst)
        });
        let q2 = q.clone();
        let report = Worker::new(receiver, processor(&store))
            .options(
                WorkerOptions::default()
                    .concurrency(concurrency)
                    .batch_commit(10)
                    .batch_linger(Duration::from_secs(1))
                    .shutdown_receive_wait(receive_wait),
            )
            .run_until(async move {
                while q2.state().in_flight < 3 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await;
        let case = format!("concurrency {concurrency}, receive wait {receive_wait:?}");
        assert_eq!(report.count(OutcomeKind::Applied), 3, "{case}: {report}");
        assert_eq!(
            applied_after.await.unwrap(),
            1,
            "{case}: receives returned first"
        );
        assert_eq!(store.state().begins, 1, "{case}: one transaction");
        assert_eq!(q.state(), QueueState::default(), "{case}");
    }
}

/// Deliveries of a lingering batch are counted as `waiting` until the batch goes.
#[tokio::test(flavor = "current_thread")]
async fn a_lingering_batch_is_counted_as_waiting() {
    use crate::{Worker, WorkerOptions};
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (store, q) = batch_setup(Duration::from_millis(20), 3);
    let worker = Worker::new(q.receiver(), processor(&store)).options(
        WorkerOptions::default()
            .batch_commit(10)
            .batch_linger(Duration::from_secs(1))
            .shutdown_receive_wait(Some(Duration::ZERO)),
    );
    assert_eq!(stop_at_gauges(worker, &snap, (0.0, 3.0)).await, (0.0, 0.0));
    assert_eq!(store.state().effects.len(), 3, "applied at shutdown");
}

// ---- receive loops ---------------------------------------------------------------------------------------

/// A receiver that counts the receives in flight at once, at most (forks share the count); one that does not
/// `fork` stands for an adapter that cannot.
#[derive(Clone)]
struct ConcurrentReceives {
    inner: crate::broker::mem::MemoryReceiver,
    forks: bool,
    /// (in flight now, most at once)
    at_once: Arc<(
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    )>,
    /// How many messages each receive asked for, in order.
    asked: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl ConcurrentReceives {
    fn new(q: &MemoryQueue, forks: bool) -> Self {
        Self {
            inner: q.receiver(),
            forks,
            at_once: Arc::default(),
            asked: Arc::default(),
        }
    }
}

impl crate::Receiver for ConcurrentReceives {
    type Delivery = crate::broker::mem::MemoryDelivery;
    async fn receive(&mut self, max: usize) -> Result<Vec<Self::Delivery>, crate::BrokerError> {
        use std::sync::atomic::Ordering::SeqCst;
        self.asked.lock().unwrap().push(max);
        let now = self.at_once.0.fetch_add(1, SeqCst) + 1;
        self.at_once.1.fetch_max(now, SeqCst);
        let r = self.inner.receive(max).await;
        self.at_once.0.fetch_sub(1, SeqCst);
        r
    }
    fn fork(&self) -> Option<Self> {
        self.forks.then(|| self.clone())
    }
}

/// Forty messages through a worker of `opts` (concurrency 8) on a queue whose receives wait and take 20 ms,
/// until idle: every message is applied once and the queue never sees more than the 8 places out of it.
/// Returns the receiver's counts.
async fn forty_through(opts: crate::WorkerOptions, forks: bool) -> ConcurrentReceives {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker};
    let store = MemStore::default();
    let q = queue_of(
        QueueOptions::default()
            .wait(Duration::from_millis(20))
            .round_trip(Duration::from_millis(20)),
        40,
    );
    let receiver = ConcurrentReceives::new(&q, forks);
    let seen = receiver.clone();
    let report = Worker::new(receiver, processor(&store))
        .options(opts.clone().concurrency(8))
        .run_until_idle()
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 40, "{opts:?}: {report}");
    assert_eq!(report.total(), 40, "{opts:?}: {report}");
    assert_eq!(q.state(), QueueState::default());
    assert!(q.in_flight_max() <= 8, "{opts:?}: {}", q.in_flight_max());
    seen
}

/// Receives asking for two messages: one receive loop has one receive in flight at a time; four have up to
/// four, and the queue still never sees more than the 8 places out of it. A receiver that cannot fork runs one
/// loop.
#[tokio::test]
async fn receive_loops_share_the_places_out_of_the_queue() {
    use std::sync::atomic::Ordering::SeqCst;
    for (loops, forks) in [(1, true), (4, true), (4, false)] {
        let opts = crate::WorkerOptions::default()
            .batch_size(2)
            .receive_loops(loops);
        let most = forty_through(opts, forks).await.at_once.1.load(SeqCst);
        if loops == 1 || !forks {
            assert_eq!(most, 1);
        } else {
            assert!(most > 1 && most <= loops, "{most} receives at once");
        }
    }
}

/// Four receive loops asking for 4 messages per receive and committing them as one batch: the places a settled
/// batch frees go to one receive of 4, never split over several receives of one message each (which would
/// cost a receive call and a transaction per message).
#[tokio::test]
async fn the_places_a_settle_frees_go_to_one_receive() {
    let opts = crate::WorkerOptions::default()
        .batch_size(4)
        .batch_commit(4)
        .receive_loops(4);
    let asked = forty_through(opts, true)
        .await
        .asked
        .lock()
        .unwrap()
        .clone();
    assert!(asked.len() >= 10, "{asked:?}");
    assert!(
        asked.iter().all(|&n| n == 4),
        "every receive asks for a whole batch's places: {asked:?}"
    );
}

/// Stopped while its loops receive and its slots are busy, a worker of two receive loops leaves nothing
/// locked: every message is applied or back in the queue.
#[tokio::test]
async fn a_worker_of_several_receive_loops_stops_cleanly() {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker, WorkerOptions};
    let store = MemStore::default();
    let q = queue_of(
        QueueOptions::default()
            .wait(Duration::from_millis(200))
            .round_trip(Duration::from_millis(5)),
        20,
    );
    let store2 = store.clone();
    let report = Worker::new(
        q.receiver(),
        slow_processor(&store, Duration::from_millis(100), Arc::default()),
    )
    .options(
        WorkerOptions::default()
            .concurrency(4)
            .prefetch(4)
            .batch_size(2)
            .receive_loops(2),
    )
    .run_until(async move {
        while store2.state().effects.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    let applied = report.count(OutcomeKind::Applied) as usize;
    let s = q.state();
    assert!(applied >= 1, "{report}");
    assert_eq!(s.in_flight, 0, "nothing left locked: {s:?} {report}");
    assert_eq!(applied + s.visible, 20, "{s:?} {report}");
    assert_eq!(store.state().effects.len(), applied);
}

/// A worker whose every slot holds a delivery still being applied is busy, not stuck: its receive loop waits
/// for a free place and stays live however long the handler takes (a lease is renewed that long), so a
/// liveness probe does not restart it in the middle of the work.
#[tokio::test]
async fn a_worker_waiting_for_a_free_slot_is_live() {
    use crate::runtime::health::Health;
    use crate::{Worker, WorkerOptions};
    let store = MemStore::default();
    let q = MemoryQueue::new(
        crate::broker::mem::QueueOptions::default().wait(Duration::from_millis(5)),
    );
    q.send(event("evt-1", "2481"));
    let started = Arc::new(tokio::sync::Notify::new());
    let finish = Arc::new(tokio::sync::Notify::new());
    let (s, f) = (started.clone(), finish.clone());
    let p = inbox(&store).bind(move |tx: MemTx, msg: Message<Meeting>| {
        let (s, f) = (s.clone(), f.clone());
        async move {
            s.notify_one();
            f.notified().await;
            tx.write(format!("task-{}", msg.body.opportunity));
            Ok(())
        }
    });
    let live_timeout = Duration::from_millis(20);
    let health = Health::new().live_timeout(live_timeout);
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(q.receiver(), p)
            .options(WorkerOptions::default().concurrency(1))
            .health(health.clone())
            .run_until(stop.clone().cancelled_owned()),
    );
    started.notified().await;
    // Well past the live timeout while the one slot is busy.
    let busy_since = std::time::Instant::now();
    while busy_since.elapsed() < live_timeout * 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let live = health.liveness();
    assert!(live.ok, "{live}");
    finish.notify_one();
    while store.state().effects.is_empty() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stop.cancel();
    let report = worker.await.unwrap();
    assert_eq!(report.outcomes.get(&crate::OutcomeKind::Applied), Some(&1));
}
