//! The worker's lease keeping around the inbox.

use super::*;
use crate::broker::mem::{MemoryDelivery, MemoryReceiver};
use crate::broker::{DeadLetter, Delivery, Lease, ReceivedMessage};
use crate::BrokerError;

/// A lease whose renewal panics (a bug in an adapter).
struct PanickyLease;

impl Lease for PanickyLease {
    fn duration(&self) -> Duration {
        Duration::from_secs(3)
    }
    fn expires_at(&self) -> Option<DateTime<Utc>> {
        None
    }
    fn renew(
        &self,
        _: Duration,
    ) -> futures::future::BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
        panic!("the adapter's renewal panicked")
    }
}

/// A delivery whose lease is a [`PanickyLease`].
struct WithPanickyLease(MemoryDelivery);

impl Delivery for WithPanickyLease {
    fn message(&self) -> &ReceivedMessage {
        self.0.message()
    }
    async fn ack(self) -> Result<(), BrokerError> {
        self.0.ack().await
    }
    async fn release(self, delay: Duration) -> Result<(), BrokerError> {
        self.0.release(delay).await
    }
    async fn dead_letter(self, why: DeadLetter) -> Result<(), BrokerError> {
        self.0.dead_letter(why).await
    }
    fn lease(&self) -> Option<Arc<dyn Lease>> {
        Some(Arc::new(PanickyLease))
    }
}

struct PanickyLeases(MemoryReceiver);

impl crate::Receiver for PanickyLeases {
    type Delivery = WithPanickyLease;

    async fn receive(&mut self, max: usize) -> Result<Vec<WithPanickyLease>, BrokerError> {
        Ok(self
            .0
            .receive(max)
            .await?
            .into_iter()
            .map(WithPanickyLease)
            .collect())
    }
}

/// A lease keeper that panics while the handler runs leaves the lease unrenewed: the worker's report counts
/// the lease lost (the message may be received again meanwhile), and so does `txinbox_lease_lost_total`.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lease_keeper_that_panics_is_a_lost_lease_in_the_report() {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker};
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemStore::default();
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    q.send(event("evt-1", "op-1"));
    // The handler takes 2 s: the renewal due at 1 s (a third of the 3 s lease) panics while it runs.
    let report = Worker::new(
        PanickyLeases(q.receiver()),
        super::prefetch::slow_processor(&store, Duration::from_secs(2), Arc::default()),
    )
    .run_until_idle()
    .await;
    assert_eq!(report.count(OutcomeKind::Applied), 1, "{report}");
    assert_eq!(report.leases_lost, 1, "{report}");
    let counted = counters(&snap);
    assert_eq!(
        count(&counted, crate::metrics::LEASE_LOST, &[]),
        1,
        "{counted:?}"
    );
}
