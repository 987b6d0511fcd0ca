//! `WorkerOptions::shutdown_timeout` counts from the stop signal: the receive loops' exit (a long poll still
//! in flight) and the in-flight deliveries' drain end within it, so a worker stops inside an orchestrator's
//! grace period (Kubernetes: SIGKILL 30 s after SIGTERM) however long its broker's long poll. On tokio's
//! paused clock: the durations are the ones a real worker runs with, and nothing waits for them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
use txinbox_core::{Delivery, Outcome, OutcomeKind, Processor, Worker, WorkerOptions};

/// A handler that never finishes by itself: it honours the worker's stop as the inbox does before COMMIT
/// (rolls back, releases with no delay, [`Outcome::Interrupted`]).
struct Blocks(Arc<tokio::sync::Notify>);

impl<D: Delivery> Processor<D> for Blocks {
    fn consumer(&self) -> &str {
        "shutdown-deadline"
    }
    async fn process(&self, delivery: D, stop: CancellationToken) -> Outcome {
        self.0.notify_one();
        stop.cancelled().await;
        let _ = delivery.release(Duration::ZERO).await;
        Outcome::Interrupted
    }
}

/// A delivery in flight and a long poll in flight when the signal comes: the worker returns
/// `shutdown_timeout` after the signal (the delivery had all of it), not after the poll's end plus
/// `shutdown_timeout`; the delivery is released, never acknowledged.
#[tokio::test(start_paused = true)]
async fn the_shutdown_timeout_counts_from_the_signal_not_from_the_end_of_the_long_poll() {
    let poll_wait = Duration::from_secs(20);
    let timeout = Duration::from_secs(30);
    let queue = MemoryQueue::new(QueueOptions {
        wait: poll_wait,
        visibility_timeout: Duration::from_secs(300),
        ..QueueOptions::default()
    });
    queue.send(OutgoingMessage::new("m1").producer_id("p1"));
    let started = Arc::new(tokio::sync::Notify::new());
    let stop = CancellationToken::new();
    // Two places, receives of one, one loop: once the message is in its handler, the loop long-polls for
    // the second place.
    let worker = tokio::spawn(
        Worker::new(queue.receiver(), Blocks(started.clone()))
            .options(
                WorkerOptions::default()
                    .concurrency(2)
                    .batch_size(1)
                    .receive_loops(1)
                    .shutdown_timeout(timeout),
            )
            .run_until(stop.clone().cancelled_owned()),
    );
    started.notified().await;
    // Well into the next long poll (it ends 20 s after it began, empty).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let signalled = Instant::now();
    stop.cancel();
    let report = worker.await.expect("no panic");
    let took = signalled.elapsed();
    assert!(
        took >= timeout,
        "the delivery in flight had the whole shutdown timeout: stopped {took:?} after the signal"
    );
    assert!(
        took < timeout + Duration::from_secs(1),
        "stopped {took:?} after the signal: the shutdown timeout ({timeout:?}) began when the long poll ended"
    );
    assert_eq!(report.count(OutcomeKind::Interrupted), 1, "{report}");
    let state = queue.state();
    assert_eq!(
        (state.visible, state.in_flight),
        (1, 0),
        "released at the deadline, not acknowledged: {state:?}"
    );
}

/// A long poll in flight at the signal is waited for only until the deadline: a broker whose poll outlasts
/// `shutdown_timeout` does not hold the worker past it, nor does it eat into the drain of what is in flight.
#[tokio::test(start_paused = true)]
async fn a_long_poll_longer_than_the_shutdown_timeout_is_cut_at_the_deadline() {
    let timeout = Duration::from_secs(5);
    let queue = MemoryQueue::new(QueueOptions {
        wait: Duration::from_secs(20),
        visibility_timeout: Duration::from_secs(300),
        ..QueueOptions::default()
    });
    queue.send(OutgoingMessage::new("m1").producer_id("p1"));
    let started = Arc::new(tokio::sync::Notify::new());
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(queue.receiver(), Blocks(started.clone()))
            .options(
                WorkerOptions::default()
                    .concurrency(2)
                    .batch_size(1)
                    .receive_loops(1)
                    .shutdown_timeout(timeout),
            )
            .run_until(stop.clone().cancelled_owned()),
    );
    started.notified().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let signalled = Instant::now();
    stop.cancel();
    let report = worker.await.expect("no panic");
    let took = signalled.elapsed();
    assert!(
        took <= timeout,
        "stopped {took:?} after the signal, past the shutdown timeout ({timeout:?})"
    );
    assert_eq!(report.count(OutcomeKind::Interrupted), 1, "{report}");
    assert_eq!(queue.state().visible, 1, "released, not acknowledged");
}

/// A prefetched delivery still waiting for its slot when the signal comes is handed back at once (released,
/// `interrupted`), not when the long poll in flight ends, nor applied in a slot the drain frees meanwhile.
#[tokio::test(start_paused = true)]
async fn a_prefetched_delivery_is_handed_back_at_the_signal_while_a_long_poll_is_in_flight() {
    let queue = MemoryQueue::new(QueueOptions {
        wait: Duration::from_secs(20),
        visibility_timeout: Duration::from_secs(300),
        ..QueueOptions::default()
    });
    queue.send(OutgoingMessage::new("m1").producer_id("p1"));
    queue.send(OutgoingMessage::new("m2").producer_id("p2"));
    let started = Arc::new(tokio::sync::Notify::new());
    let stop = CancellationToken::new();
    // One slot, two more places: one receive brings both messages (one applied, one waiting for the slot),
    // then the loop long-polls for the third place.
    let worker = tokio::spawn(
        Worker::new(queue.receiver(), Blocks(started.clone()))
            .options(
                WorkerOptions::default()
                    .concurrency(1)
                    .prefetch(2)
                    .receive_loops(1)
                    .shutdown_timeout(Duration::from_secs(30)),
            )
            .run_until(stop.clone().cancelled_owned()),
    );
    started.notified().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(queue.state().in_flight, 2, "one applied, one prefetched");
    stop.cancel();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let state = queue.state();
    assert_eq!(
        (state.visible, state.in_flight),
        (1, 1),
        "the prefetched delivery is handed back at the signal: {state:?}"
    );
    let report = worker.await.expect("no panic");
    assert_eq!(report.count(OutcomeKind::Interrupted), 2, "{report}");
}

/// A processor whose store or broker call never answers (a hung database connection, a settle the broker never
/// answers), whatever the stop: message `ok` is acknowledged, any other hangs after its handler starts.
struct Hangs(Arc<tokio::sync::Notify>);

impl<D: Delivery> Processor<D> for Hangs {
    fn consumer(&self) -> &str {
        "shutdown-deadline"
    }
    async fn process(&self, delivery: D, _stop: CancellationToken) -> Outcome {
        if delivery.message().body == b"ok" {
            let _ = delivery.ack().await;
            return Outcome::Applied {
                result_reference: None,
            };
        }
        self.0.notify_one();
        std::future::pending::<()>().await;
        unreachable!("a hung call never answers")
    }
}

/// Deliveries whose store or broker call hangs past the deadline do not hold the worker: it returns
/// `SHUTDOWN_GRACE` after the deadline, counts them in `abandoned` (no outcome for them), and they stay out
/// of the queue until their visibility timeout, as after a SIGKILL. A delivery that finished before keeps its
/// outcome.
#[tokio::test(start_paused = true)]
async fn deliveries_hung_past_the_deadline_are_abandoned_after_the_grace() {
    use txinbox_core::runtime::worker::SHUTDOWN_GRACE;
    let timeout = Duration::from_secs(10);
    let queue = MemoryQueue::new(QueueOptions {
        wait: Duration::from_secs(1),
        visibility_timeout: Duration::from_secs(300),
        ..QueueOptions::default()
    });
    queue.send(OutgoingMessage::new("h1").producer_id("p1"));
    queue.send(OutgoingMessage::new("ok").producer_id("p2"));
    queue.send(OutgoingMessage::new("h2").producer_id("p3"));
    let started = Arc::new(tokio::sync::Notify::new());
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(queue.receiver(), Hangs(started.clone()))
            .options(
                WorkerOptions::default()
                    .concurrency(3)
                    .receive_loops(1)
                    .shutdown_timeout(timeout),
            )
            .run_until(stop.clone().cancelled_owned()),
    );
    started.notified().await;
    started.notified().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let signalled = Instant::now();
    stop.cancel();
    // Bounded, so that a worker waiting without limit fails here instead of hanging the test.
    let report = tokio::time::timeout(Duration::from_secs(3600), worker)
        .await
        .expect("the worker returned: it does not wait for a hung call without limit")
        .expect("no panic");
    let took = signalled.elapsed();
    assert!(
        took <= timeout + SHUTDOWN_GRACE,
        "stopped {took:?} after the signal, past the shutdown timeout ({timeout:?}) and its grace"
    );
    assert_eq!(report.abandoned, 2, "{report}");
    assert_eq!(report.count(OutcomeKind::Applied), 1, "{report}");
    assert_eq!(
        report.total(),
        1,
        "an abandoned delivery has no outcome: {report}"
    );
    assert!(report.to_string().contains(" abandoned=2"), "{report}");
    let state = queue.state();
    assert_eq!(
        (state.visible, state.in_flight),
        (0, 2),
        "abandoned, never settled: back after their visibility timeout, as after a SIGKILL: {state:?}"
    );
}

/// A delivery whose release the broker never answers.
struct ReleaseHangs(txinbox_core::broker::mem::MemoryDelivery);

impl Delivery for ReleaseHangs {
    fn message(&self) -> &txinbox_core::ReceivedMessage {
        self.0.message()
    }
    async fn ack(self) -> Result<(), txinbox_core::BrokerError> {
        self.0.ack().await
    }
    async fn release(self, _delay: Duration) -> Result<(), txinbox_core::BrokerError> {
        std::future::pending().await
    }
    async fn dead_letter(
        self,
        why: txinbox_core::DeadLetter,
    ) -> Result<(), txinbox_core::BrokerError> {
        self.0.dead_letter(why).await
    }
    fn lease(&self) -> Option<Arc<dyn txinbox_core::Lease>> {
        None
    }
}

/// A receiver whose receives take 2 s and whose deliveries' releases hang.
struct SlowReceiver<R>(R);

impl txinbox_core::Receiver for SlowReceiver<txinbox_core::broker::mem::MemoryReceiver> {
    type Delivery = ReleaseHangs;
    async fn receive(
        &mut self,
        max: usize,
    ) -> Result<Vec<ReleaseHangs>, txinbox_core::BrokerError> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(self
            .0
            .receive(max)
            .await?
            .into_iter()
            .map(ReleaseHangs)
            .collect())
    }
}

/// What a receive in flight at the signal brings is handed back; a broker that never answers that release
/// does not hold the worker past the deadline and its grace either.
#[tokio::test(start_paused = true)]
async fn a_hand_back_the_broker_never_answers_ends_with_the_grace() {
    use txinbox_core::runtime::worker::SHUTDOWN_GRACE;
    let timeout = Duration::from_secs(10);
    let queue = MemoryQueue::new(QueueOptions {
        wait: Duration::ZERO,
        visibility_timeout: Duration::from_secs(300),
        ..QueueOptions::default()
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(
            SlowReceiver(queue.receiver()),
            Blocks(Arc::new(tokio::sync::Notify::new())),
        )
        .options(
            WorkerOptions::default()
                .receive_loops(1)
                .shutdown_timeout(timeout),
        )
        .run_until(stop.clone().cancelled_owned()),
    );
    // The first receive is in flight (it ends at 2 s); the message arrives meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    queue.send(OutgoingMessage::new("m1").producer_id("p1"));
    let signalled = Instant::now();
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(3600), worker)
        .await
        .expect("the worker returned: it does not wait for a hung release without limit")
        .expect("no panic");
    let took = signalled.elapsed();
    assert!(
        took <= timeout + SHUTDOWN_GRACE,
        "stopped {took:?} after the signal, past the shutdown timeout ({timeout:?}) and its grace"
    );
    assert_eq!(report.total(), 0, "handed back, never processed: {report}");
    assert_eq!(
        queue.state().in_flight,
        1,
        "never released: back after its visibility timeout"
    );
}
