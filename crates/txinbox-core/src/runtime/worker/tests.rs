//! The worker around processors and adapters whose code panics.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio_util::sync::CancellationToken;

use crate::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
use crate::broker::Delivery;
use crate::pipeline::outcome::{Outcome, OutcomeKind};

use super::{Processor, Worker, WorkerOptions};

/// A processor whose first `panics` calls panic before settling (a bug in a user's own pipeline), quoting a
/// signed endpoint; every later delivery is acknowledged.
struct PanicsFirst {
    panics: u32,
    calls: AtomicU32,
}

impl PanicsFirst {
    fn new(panics: u32) -> Self {
        Self {
            panics,
            calls: AtomicU32::new(0),
        }
    }
}

impl<D: Delivery> Processor<D> for PanicsFirst {
    fn consumer(&self) -> &str {
        "panics"
    }
    async fn process(&self, delivery: D, _stop: CancellationToken) -> Outcome {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.panics {
            panic!("processor bug calling https://ns.servicebus.windows.net/q?sig=S3CRET&se=1");
        }
        let _ = delivery.ack().await;
        Outcome::Applied {
            result_reference: None,
        }
    }
}

/// `txinbox_worker_handed_back_total` by reason, as the debugging recorder counted it.
fn handed_back(snap: &Snapshotter, reason: &str) -> u64 {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(k, _, _, v)| match v {
            DebugValue::Counter(n)
                if k.key().name() == crate::metrics::WORKER_HANDED_BACK
                    && k.key()
                        .labels()
                        .any(|l| l.key() == "reason" && l.value() == reason) =>
            {
                Some(n)
            }
            _ => None,
        })
        .sum()
}

/// A queue whose visibility timeout outlasts any test: a message comes back within the test only if it was
/// handed back.
fn long_visibility() -> MemoryQueue {
    MemoryQueue::new(
        QueueOptions::default()
            .visibility_timeout(Duration::from_secs(3600))
            .wait(Duration::from_millis(20)),
    )
}

/// A processor that panics before settling its delivery hands it back at once (released with no delay,
/// counted `processor_panicked` in `txinbox_worker_handed_back_total` and in the report), rather than leaving
/// it locked until its visibility timeout (seen failing so: the message still in flight, an hour to go). AWS
/// (SQS Developer Guide, visibility timeout): "Once the timeout period expires, the message returns to a
/// subsequent receive request unless you delete it from the queue first"; `ChangeMessageVisibility`: "The
/// minimum is 0 seconds". Microsoft (`ServiceBusReceiver.AbandonMessageAsync`): "This will make the message
/// available again for immediate processing as the lock on the message held by the receiver will be
/// released".
#[tokio::test(flavor = "current_thread")]
async fn a_processor_that_panics_hands_its_delivery_back_at_once() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let q = long_visibility();
    q.send(OutgoingMessage::new(b"{}".to_vec()));
    let report = Worker::new(q.receiver(), PanicsFirst::new(1))
        .run_until_idle()
        .await;
    // Handed back at once, received again, then acknowledged: nothing is left in the queue, nothing waited an
    // hour for its visibility timeout.
    assert_eq!(q.state(), Default::default(), "{report}");
    assert_eq!(
        (
            report.count(OutcomeKind::Retry),
            report.count(OutcomeKind::Applied)
        ),
        (1, 1),
        "{report}"
    );
    assert_eq!(report.handed_back, 1, "{report}");
    assert_eq!(handed_back(&snap, "processor_panicked"), 1);
}

/// In a batch the default `process_batch` goes through in order, a panic hands back only what was not settled:
/// the delivery acknowledged before it stays acknowledged, the one that panicked and the one after it come back
/// at once.
#[tokio::test(flavor = "current_thread")]
async fn a_panic_in_a_batch_hands_back_only_what_was_not_settled() {
    /// Acknowledges the first delivery of each batch, panics on the second.
    struct SecondPanics(AtomicU32);

    impl<D: Delivery> Processor<D> for SecondPanics {
        fn consumer(&self) -> &str {
            "batch"
        }
        async fn process(&self, delivery: D, _stop: CancellationToken) -> Outcome {
            if self.0.fetch_add(1, Ordering::SeqCst) == 1 {
                panic!("the second one panics");
            }
            let _ = delivery.ack().await;
            Outcome::Applied {
                result_reference: None,
            }
        }
    }

    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let q = long_visibility();
    for i in 0..3 {
        q.send(OutgoingMessage::new(format!("{i}").into_bytes()));
    }
    let report = Worker::new(q.receiver(), SecondPanics(AtomicU32::new(0)))
        .options(WorkerOptions::default().batch_commit(3).batch_size(3))
        .run_until_idle()
        .await;
    // 1 acknowledged, 2 handed back (received again and acknowledged): the queue is empty.
    assert_eq!(q.state(), Default::default(), "{report}");
    assert_eq!(report.handed_back, 2, "{report}");
    assert_eq!(handed_back(&snap, "processor_panicked"), 2);
}

/// Keeps the error events' `panic` fields.
#[derive(Default)]
struct Errors(Mutex<Vec<String>>, AtomicU32);

struct PanicField<'a>(&'a mut Option<String>);

impl tracing::field::Visit for PanicField<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "panic" {
            *self.0 = Some(format!("{value:?}"));
        }
    }
}

impl tracing::Subscriber for &'static Errors {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(u64::from(self.1.fetch_add(1, Ordering::SeqCst)) + 1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() != tracing::Level::ERROR {
            return;
        }
        let mut panic = None;
        event.record(&mut PanicField(&mut panic));
        if let Some(p) = panic {
            self.0.lock().unwrap().push(p);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The processor's panic is logged at error with its message, its secrets masked.
#[tokio::test(flavor = "current_thread")]
async fn a_processor_panic_is_logged_with_its_message() {
    let errors: &'static Errors = Box::leak(Box::default());
    let _guard = tracing::subscriber::set_default(errors);
    let q = long_visibility();
    q.send(OutgoingMessage::new(b"{}".to_vec()));
    let _ = Worker::new(q.receiver(), PanicsFirst::new(1))
        .run_until_idle()
        .await;
    let logged = errors.0.lock().unwrap().clone();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0].contains("processor bug calling"), "{logged:?}");
    assert!(
        !logged[0].contains("S3CRET"),
        "a secret in a log line: {logged:?}"
    );
}

/// What a test delivery's adapter code does wrong.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// `Delivery::lease` panics.
    Lease,
    /// `Lease::duration` panics.
    Duration,
}

/// A delivery of the in-memory queue whose adapter code panics as `Bug` says.
struct Buggy(crate::broker::mem::MemoryDelivery, Bug);

/// A lease whose `duration` panics; its renewals are the in-memory queue's.
struct DurationPanics(Arc<dyn crate::broker::Lease>);

impl crate::broker::Lease for DurationPanics {
    fn duration(&self) -> Duration {
        panic!("the adapter's lease duration panicked")
    }
    fn expires_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.0.expires_at()
    }
    fn renew(
        &self,
        by: Duration,
    ) -> futures::future::BoxFuture<'_, Result<chrono::DateTime<chrono::Utc>, crate::BrokerError>>
    {
        self.0.renew(by)
    }
}

impl Delivery for Buggy {
    fn message(&self) -> &crate::ReceivedMessage {
        self.0.message()
    }
    async fn ack(self) -> Result<(), crate::BrokerError> {
        self.0.ack().await
    }
    async fn release(self, delay: Duration) -> Result<(), crate::BrokerError> {
        self.0.release(delay).await
    }
    async fn dead_letter(self, why: crate::DeadLetter) -> Result<(), crate::BrokerError> {
        self.0.dead_letter(why).await
    }
    fn lease(&self) -> Option<Arc<dyn crate::broker::Lease>> {
        match self.1 {
            Bug::Lease => panic!("the adapter's lease panicked"),
            Bug::Duration => Some(Arc::new(DurationPanics(self.0.lease()?))),
        }
    }
}

/// A receiver of the in-memory queue whose deliveries are [`Buggy`].
struct BuggyReceiver(crate::broker::mem::MemoryReceiver, Bug);

impl crate::Receiver for BuggyReceiver {
    type Delivery = Buggy;
    async fn receive(&mut self, max: usize) -> Result<Vec<Buggy>, crate::BrokerError> {
        let bug = self.1;
        Ok(self
            .0
            .receive(max)
            .await?
            .into_iter()
            .map(|d| Buggy(d, bug))
            .collect())
    }
}

/// `txinbox_lease_lost_total`, as the debugging recorder counted it.
fn leases_lost(snap: &Snapshotter) -> u64 {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(k, _, _, v)| match v {
            DebugValue::Counter(n) if k.key().name() == crate::metrics::LEASE_LOST => Some(n),
            _ => None,
        })
        .sum()
}

/// A delivery whose lease cannot be kept because the adapter's `Delivery::lease` or `Lease::duration` panics
/// (called by the worker as the delivery arrives, outside the lease keeper's task) is processed with its lease
/// counted lost (`WorkerReport::leases_lost`, `txinbox_lease_lost_total`), as a lease keeper that panics is;
/// the worker goes on (seen failing so: the panic ended the worker's run).
#[tokio::test(flavor = "current_thread")]
async fn a_lease_or_duration_that_panics_is_a_lost_lease_not_a_crash() {
    for bug in [Bug::Lease, Bug::Duration] {
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let q = long_visibility();
        q.send(OutgoingMessage::new(b"{}".to_vec()));
        let report = Worker::new(BuggyReceiver(q.receiver(), bug), PanicsFirst::new(0))
            .run_until_idle()
            .await;
        assert_eq!(q.state(), Default::default(), "{report}");
        assert_eq!(
            (report.count(OutcomeKind::Applied), report.leases_lost),
            (1, 1),
            "{report}"
        );
        assert_eq!(leases_lost(&snap), 1);
    }
}

/// [`long_visibility`] without a dead-letter queue: a message is kept however often it is received (an SQS
/// queue without a redrive policy). Its clock stands still ([`MemoryQueue::freeze_clock`]).
fn without_dead_letters() -> MemoryQueue {
    let q = MemoryQueue::new(
        QueueOptions::default()
            .visibility_timeout(Duration::from_secs(3600))
            .wait(Duration::from_millis(20))
            .max_receive_count(None),
    );
    q.freeze_clock();
    q
}

/// A processor every call of which panics before settling (a message that trips a bug each time), counting
/// its calls.
struct AlwaysPanics(Arc<AtomicU32>);

impl<D: Delivery> Processor<D> for AlwaysPanics {
    fn consumer(&self) -> &str {
        "always-panics"
    }
    async fn process(&self, _delivery: D, _stop: CancellationToken) -> Outcome {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("this message trips a bug every time");
    }
}

/// A message whose every processing panics is handed back at once the first time only: from its second
/// delivery on it is released after [`WorkerOptions::panic_backoff`], doubling with each delivery up to the
/// maximum, so that it does not come straight back into the same panic (seen failing so: with the queue's
/// clock stopped, the worker received and panicked on it without pause, over and over, until the test's bound
/// cut it off). Each hand-back is still one more receive toward the queue's maximum receive count.
#[tokio::test(flavor = "current_thread")]
async fn a_message_that_panics_again_is_handed_back_after_a_growing_delay() {
    let q = without_dead_letters();
    q.send(OutgoingMessage::new(b"{}".to_vec()));
    let calls = Arc::new(AtomicU32::new(0));
    let opts =
        WorkerOptions::default().panic_backoff(Duration::from_secs(1), Duration::from_secs(4));
    let run = || async {
        let worker = Worker::new(q.receiver(), AlwaysPanics(calls.clone())).options(opts.clone());
        tokio::time::timeout(Duration::from_secs(10), worker.run_until_idle())
            .await
            .map(|report| report.handed_back)
    };
    // Delivery 1 handed back at once, delivery 2 after 1 s: the queue's clock stands still, so the worker
    // then finds nothing.
    assert_eq!(run().await, Ok(2));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!((q.state().delayed, q.state().visible), (1, 0));
    // Each later delivery is held back twice as long as the one before, at most 4 s: 2 s, 4 s, 4 s.
    for (n, delay) in [(3, 1000), (4, 2000), (5, 4000), (6, 4000)] {
        q.advance(Duration::from_millis(delay - 1));
        assert_eq!(
            run().await,
            Ok(0),
            "delivery {n}, 1 ms before its delay ends"
        );
        q.advance(Duration::from_millis(1));
        assert_eq!(run().await, Ok(1), "delivery {n}");
        assert_eq!(calls.load(Ordering::SeqCst), n);
        assert_eq!(q.state().delayed, 1, "delivery {n}");
    }
}

/// The delay of a panicking message's hand-back, by its delivery count.
#[test]
fn the_panic_backoff_starts_at_the_second_delivery_and_doubles_up_to_its_maximum() {
    let opts = WorkerOptions::default();
    assert_eq!(
        (opts.get_panic_backoff(), opts.get_panic_backoff_max()),
        (Duration::from_secs(1), Duration::from_secs(60))
    );
    let delays: Vec<u64> = (0..10)
        .map(|n| opts.panic_release_delay(n).as_secs())
        .collect();
    assert_eq!(delays, [0, 0, 1, 2, 4, 8, 16, 32, 60, 60]);
    assert_eq!(opts.panic_release_delay(u32::MAX), Duration::from_secs(60));
    // A maximum below the first pause is the first pause; zero turns the backoff off.
    let flat =
        WorkerOptions::default().panic_backoff(Duration::from_secs(5), Duration::from_secs(1));
    assert_eq!(flat.panic_release_delay(9), Duration::from_secs(5));
    let off = WorkerOptions::default().panic_backoff(Duration::ZERO, Duration::ZERO);
    assert_eq!(off.panic_release_delay(9), Duration::ZERO);
}

/// Once the worker is stopping, a delivery its processor panicked on is handed back at once whatever its
/// delivery count: a release with a delay may hold its caller for the delay (Service Bus over REST), past the
/// shutdown deadline.
#[tokio::test(flavor = "current_thread")]
async fn a_panic_while_the_worker_stops_hands_the_delivery_back_at_once() {
    /// Panics on every call; on the second, first signals the worker's stop and lets it begin.
    struct StopsThenPanics(Arc<AtomicU32>, Arc<tokio::sync::Notify>);

    impl<D: Delivery> Processor<D> for StopsThenPanics {
        fn consumer(&self) -> &str {
            "stops-then-panics"
        }
        async fn process(&self, _delivery: D, _stop: CancellationToken) -> Outcome {
            if self.0.fetch_add(1, Ordering::SeqCst) == 1 {
                self.1.notify_one();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            panic!("this message trips a bug every time");
        }
    }

    let q = without_dead_letters();
    q.send(OutgoingMessage::new(b"{}".to_vec()));
    let (calls, stop) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let signal = stop.clone();
    let report = Worker::new(q.receiver(), StopsThenPanics(calls.clone(), stop))
        .options(
            WorkerOptions::default()
                .panic_backoff(Duration::from_secs(60), Duration::from_secs(60)),
        )
        .run_until(async move { signal.notified().await })
        .await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "{report}");
    assert_eq!(report.handed_back, 2, "{report}");
    // The second delivery would have waited 60 s: handed back at once, it can be received now.
    assert_eq!((q.state().visible, q.state().delayed), (1, 0), "{report}");
}
