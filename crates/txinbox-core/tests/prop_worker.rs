//! The worker in a hostile environment: receive errors back off exponentially with jitter and a cap, a
//! persistent error (a key rotated, a permission removed, a queue deleted) makes the worker give up after
//! `give_up_after`, a transient one never does, and a long poll in flight at shutdown hands back what it
//! brought so that it is received again at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio_util::sync::CancellationToken;
use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
use txinbox_core::runtime::worker::{is_persistent_receive_error, receive_backoff};
use txinbox_core::{
    BrokerError, BrokerErrorKind, Delivery, Outcome, Processor, Receiver, Worker, WorkerOptions,
};

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Each pause lies between half and all of the doubled first pause, never above the cap; the
    /// un-jittered pause never shrinks while failures go on.
    #[test]
    fn backoff_doubles_jitters_and_is_capped(
        first_ms in 1u64..5_000,
        max_ms in 1u64..120_000,
        failures in 1u32..200,
        unit in 0.0f64..1.0,
    ) {
        let (first, max) = (Duration::from_millis(first_ms), Duration::from_millis(max_ms));
        let cap = max.max(first);
        let full = receive_backoff(first, max, failures, 1.0);
        let pause = receive_backoff(first, max, failures, unit);
        prop_assert!(full <= cap);
        prop_assert!(pause <= full && pause >= full / 2 - Duration::from_nanos(1));
        prop_assert!(receive_backoff(first, max, failures + 1, 1.0) >= full);
        if failures == 1 {
            prop_assert_eq!(full, first.min(cap));
        }
    }
}

/// A cap "for ever" (`Duration::MAX`) is a pause, never a panic converting it through seconds as a float.
#[test]
fn the_longest_pauses_do_not_overflow() {
    for unit in [0.0, 0.5, 0.999, 1.0] {
        for failures in [1, 2, 64, u32::MAX] {
            let pause = receive_backoff(Duration::MAX, Duration::MAX, failures, unit);
            assert!(
                pause >= Duration::MAX / 2 - Duration::from_secs(1),
                "{pause:?}"
            );
            let pause = receive_backoff(Duration::from_secs(1), Duration::MAX, failures, unit);
            assert!(pause >= Duration::from_millis(500), "{pause:?}");
        }
    }
}

#[test]
fn only_errors_a_retry_cannot_fix_are_persistent() {
    use BrokerErrorKind::*;
    for k in [Unauthorized, EntityNotFound, Configuration] {
        assert!(is_persistent_receive_error(k), "{k:?}");
    }
    for k in [
        Throttled,
        OutcomeUnknown,
        ServerError,
        LockLost,
        Rejected,
        Protocol,
    ] {
        assert!(!is_persistent_receive_error(k), "{k:?}");
    }
}

/// A receiver whose every receive fails with `kind`, counting the calls.
struct Failing {
    kind: BrokerErrorKind,
    calls: Arc<AtomicU64>,
}

impl Receiver for Failing {
    type Delivery = txinbox_core::broker::mem::MemoryDelivery;
    async fn receive(&mut self, _max: usize) -> Result<Vec<Self::Delivery>, BrokerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(BrokerError::new(
            self.kind,
            "receive",
            "HTTP 401 on crm-events (the key in the connection string is not accepted)",
        ))
    }
}

/// Acknowledges every delivery, counting them.
struct Ack(Arc<AtomicU64>);

impl<D: Delivery> Processor<D> for Ack {
    fn consumer(&self) -> &str {
        "prop-worker"
    }
    async fn process(&self, delivery: D, _stop: CancellationToken) -> Outcome {
        self.0.fetch_add(1, Ordering::SeqCst);
        let _ = delivery.ack().await;
        Outcome::Applied {
            result_reference: None,
        }
    }
}

fn fast() -> WorkerOptions {
    WorkerOptions::default()
        .receive_error_backoff(Duration::from_millis(10))
        .receive_error_backoff_max(Duration::from_millis(80))
}

#[tokio::test]
async fn a_persistent_receive_error_makes_the_worker_give_up_with_a_reason() {
    let calls = Arc::new(AtomicU64::new(0));
    let receiver = Failing {
        kind: BrokerErrorKind::Unauthorized,
        calls: calls.clone(),
    };
    let report = tokio::time::timeout(
        Duration::from_secs(10),
        Worker::new(receiver, Ack(Arc::new(AtomicU64::new(0))))
            .options(fast().give_up_after(Some(Duration::from_millis(500))))
            .run_until(std::future::pending()),
    )
    .await
    .expect("the worker gives up by itself");
    let why = report.gave_up.clone().expect("a reason");
    assert!(
        why.contains("unauthorized") && why.contains("HTTP 401"),
        "{why}"
    );
    assert!(!why.contains('\n'), "one line: {why}");
    assert!(report.to_string().contains("gave_up="), "{report}");
    // Exponential backoff: 10, 20, 40, 80, 80, ... ms (jittered down to half) over 500 ms is at most ~20
    // receives; a fixed 10 ms pause would make about 50.
    let n = calls.load(Ordering::SeqCst);
    assert_eq!(report.receive_errors, n);
    assert!((4..=25).contains(&n), "{n} receives in 500 ms");
}

#[tokio::test]
async fn a_transient_receive_error_never_makes_the_worker_give_up() {
    let calls = Arc::new(AtomicU64::new(0));
    let receiver = Failing {
        kind: BrokerErrorKind::Throttled,
        calls: calls.clone(),
    };
    let report = Worker::new(receiver, Ack(Arc::new(AtomicU64::new(0))))
        .options(fast().give_up_after(Some(Duration::from_millis(100))))
        .run_until(tokio::time::sleep(Duration::from_millis(600)))
        .await;
    assert_eq!(report.gave_up, None);
    assert!(report.receive_errors >= 3, "{report}");
}

/// A receiver whose answer, once the broker handed messages out, comes back only when `release` is cancelled
/// (never, if nothing cancels it): the window in which a stop signal finds a receive in flight that already
/// holds messages, held open by an event rather than by a delay that a loaded machine could outlast.
struct SlowAnswer {
    inner: txinbox_core::broker::mem::MemoryReceiver,
    release: CancellationToken,
}

impl Receiver for SlowAnswer {
    type Delivery = txinbox_core::broker::mem::MemoryDelivery;
    async fn receive(&mut self, max: usize) -> Result<Vec<Self::Delivery>, BrokerError> {
        let got = self.inner.receive(max).await?;
        if !got.is_empty() {
            self.release.cancelled().await;
        }
        Ok(got)
    }
}

/// Waits (at most 10 s) until the long poll holds `n` messages of `queue`.
async fn until_in_flight(queue: &MemoryQueue, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while queue.state().in_flight != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the long poll never held {n} message(s): {:?}",
            queue.state()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_long_poll_in_flight_at_shutdown_hands_back_what_it_brought() {
    let queue = MemoryQueue::new(QueueOptions {
        visibility_timeout: Duration::from_secs(300),
        wait: Duration::from_secs(5),
        ..QueueOptions::default()
    });
    let processed = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    // The answer comes back only once the stop signal has been given (the shutdown future has ended),
    // however slow the machine.
    let release = CancellationToken::new();
    let receiver = SlowAnswer {
        inner: queue.receiver(),
        release: release.clone(),
    };
    let signal = stop.clone();
    let worker = tokio::spawn(
        Worker::new(receiver, Ack(processed.clone()))
            .options(fast())
            .run_until(async move {
                signal.cancelled().await;
                release.cancel();
            }),
    );
    // The worker is in its long poll; a message arrives and is handed to it (invisible for 300 s from now
    // on); the stop signal comes before the answer does.
    tokio::time::sleep(Duration::from_millis(200)).await;
    queue.send(OutgoingMessage::new("m1").producer_id("p1"));
    until_in_flight(&queue, 1).await;
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the worker stops")
        .expect("no panic");
    assert_eq!(
        processed.load(Ordering::SeqCst),
        0,
        "nothing processed after stop"
    );
    assert_eq!(report.total(), 0);
    let state = queue.state();
    assert_eq!(
        (state.visible, state.in_flight),
        (1, 0),
        "handed back at once, not left invisible for 300 s: {state:?}"
    );
    // And another worker receives it at once.
    let again = queue.receive_now(10);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].message().delivery_count, 2);
}

#[tokio::test]
async fn a_zero_shutdown_receive_wait_stops_at_once_and_leaves_the_poll_s_message_to_its_timeout() {
    let queue = MemoryQueue::new(QueueOptions {
        visibility_timeout: Duration::from_secs(300),
        wait: Duration::from_secs(5),
        ..QueueOptions::default()
    });
    let stop = CancellationToken::new();
    // The answer never comes back: a worker that waited for it would wait its whole 20 s shutdown timeout.
    let receiver = SlowAnswer {
        inner: queue.receiver(),
        release: CancellationToken::new(),
    };
    let worker = tokio::spawn(
        Worker::new(receiver, Ack(Arc::new(AtomicU64::new(0))))
            .options(fast().shutdown_receive_wait(Some(Duration::ZERO)))
            .run_until(stop.clone().cancelled_owned()),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    queue.send(OutgoingMessage::new("m1").producer_id("p1"));
    until_in_flight(&queue, 1).await;
    let stopping = tokio::time::Instant::now();
    stop.cancel();
    let _report = tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the worker stops")
        .expect("no panic");
    // Well under the 20 s the answer would have been waited for, with room for a loaded machine.
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopping.elapsed()
    );
    assert_eq!(
        queue.state().in_flight,
        1,
        "the dropped poll's message waits for its timeout"
    );
}

/// A prefetch or a concurrency too large for a semaphore (read from a settings file, or `usize::MAX` for "no
/// limit") runs the worker instead of panicking at its start.
#[tokio::test]
async fn the_largest_concurrency_and_prefetch_run() {
    for opts in [
        fast().prefetch(usize::MAX),
        fast().concurrency(usize::MAX).prefetch(usize::MAX),
    ] {
        let queue = MemoryQueue::new(QueueOptions {
            wait: Duration::from_millis(10),
            ..QueueOptions::default()
        });
        queue.send(OutgoingMessage::new("m1").producer_id("p1"));
        let applied = Arc::new(AtomicU64::new(0));
        let _ = opts.get_receive_loops();
        let report = tokio::time::timeout(
            Duration::from_secs(30),
            Worker::new(queue.receiver(), Ack(applied.clone()))
                .options(opts)
                .run_until_idle(),
        )
        .await
        .expect("the worker stops once the queue is idle");
        assert_eq!(report.outcomes.values().sum::<u64>(), 1);
        assert_eq!(applied.load(Ordering::SeqCst), 1);
    }
}

/// Panics on the message `boom` (a hand-written `Deserialize`, a router: the user's code outside the handler).
struct PanicsOn(Arc<AtomicU64>);

impl<D: Delivery> Processor<D> for PanicsOn {
    fn consumer(&self) -> &str {
        "prop-worker"
    }
    async fn process(&self, delivery: D, _stop: CancellationToken) -> Outcome {
        assert!(delivery.message().body != b"boom", "a processor panicked");
        self.0.fetch_add(1, Ordering::SeqCst);
        let _ = delivery.ack().await;
        Outcome::Applied {
            result_reference: None,
        }
    }
}

/// A processor that panics before settling its delivery has it handed back at once (not left to its visibility
/// timeout, here 300 s): the worker says so, counts each panic as a retry and a hand-back, and goes on with the
/// others. A message it always panics on comes back until the queue's maximum receive count (5) moves it to
/// the dead-letter queue, as a broker's redrive policy or `MaxDeliveryCount` does; here at once each time, the
/// panic backoff turned off (`panic_backoff(0, 0)`: by default it is handed back after 1, 2 and 4 s from its
/// second delivery on, the worker's own tests check that).
#[tokio::test]
async fn a_processor_that_panics_is_reported_and_the_worker_goes_on() {
    let queue = MemoryQueue::new(QueueOptions {
        wait: Duration::from_millis(10),
        visibility_timeout: Duration::from_secs(300),
        ..QueueOptions::default()
    });
    queue.send(OutgoingMessage::new("boom").producer_id("p1"));
    queue.send(OutgoingMessage::new("fine").producer_id("p2"));
    let applied = Arc::new(AtomicU64::new(0));
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        Worker::new(queue.receiver(), PanicsOn(applied.clone()))
            .options(fast().panic_backoff(Duration::ZERO, Duration::ZERO))
            .run_until_idle(),
    )
    .await
    .expect("the worker stops once the queue is idle");
    assert_eq!(applied.load(Ordering::SeqCst), 1);
    assert_eq!(
        report.outcomes.get(&txinbox_core::OutcomeKind::Applied),
        Some(&1)
    );
    assert_eq!(
        report.outcomes.get(&txinbox_core::OutcomeKind::Retry),
        Some(&5),
        "{report}"
    );
    assert_eq!(report.handed_back, 5, "{report}");
    let state = queue.state();
    assert_eq!(
        (state.in_flight, state.dead_lettered),
        (0, 1),
        "handed back each time, dead-lettered past its receive count: {state}"
    );
}

/// A receiver whose every receive waits until the test lets it answer (empty): a long poll in flight.
struct HeldPoll(Arc<tokio::sync::Notify>);

impl Receiver for HeldPoll {
    type Delivery = txinbox_core::broker::mem::MemoryDelivery;
    async fn receive(&mut self, _max: usize) -> Result<Vec<Self::Delivery>, BrokerError> {
        self.0.notified().await;
        Ok(Vec::new())
    }
}

/// From the stop signal on, readiness says `stopping` (a load balancer or a rollout stops counting on the
/// worker at once), also while the long poll in flight is let finish.
#[tokio::test]
async fn readiness_turns_false_at_the_stop_signal_while_the_poll_finishes() {
    use txinbox_core::runtime::health::Health;
    let answer = Arc::new(tokio::sync::Notify::new());
    let health = Health::new();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(HeldPoll(answer.clone()), Ack(Arc::new(AtomicU64::new(0))))
            .options(fast().shutdown_timeout(Duration::from_secs(60)))
            .health(health.clone())
            .run_until(stop.clone().cancelled_owned()),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !health.readiness().await.ok {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.cancel();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = health.readiness().await;
        if !r.ok {
            assert!(r.to_string().contains("fail worker: stopping"), "{r}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still ready with the stop signal given: {r}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !worker.is_finished(),
        "the poll in flight is still waited for"
    );
    answer.notify_one();
    let _report = tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the worker stops once the poll answered")
        .expect("no panic");
}
