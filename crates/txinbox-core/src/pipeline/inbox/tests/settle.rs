//! A settle that fails after the decision: the outcome stays what was decided, the failure is a settle failure.

use super::*;
use crate::broker::mem::{MemoryDelivery, MemoryReceiver};
use crate::broker::{DeadLetter, Delivery, Lease, ReceivedMessage};
use crate::BrokerError;

/// A delivery whose settles panic (a bug in a broker adapter), as `panics` says: `ack`, `dead_letter`.
struct PanickySettle {
    inner: MemoryDelivery,
    panics: &'static str,
}

impl Delivery for PanickySettle {
    fn message(&self) -> &ReceivedMessage {
        self.inner.message()
    }
    async fn ack(self) -> Result<(), BrokerError> {
        if self.panics == "ack" {
            panic!("the adapter's ack panicked");
        }
        self.inner.ack().await
    }
    async fn release(self, delay: Duration) -> Result<(), BrokerError> {
        self.inner.release(delay).await
    }
    async fn dead_letter(self, why: DeadLetter) -> Result<(), BrokerError> {
        if self.panics == "dead_letter" {
            panic!("the adapter's dead-letter panicked");
        }
        self.inner.dead_letter(why).await
    }
    fn lease(&self) -> Option<Arc<dyn Lease>> {
        self.inner.lease()
    }
}

/// A receiver whose deliveries' acks panic.
struct PanickyAcks(MemoryReceiver);

impl crate::Receiver for PanickyAcks {
    type Delivery = PanickySettle;

    async fn receive(&mut self, max: usize) -> Result<Vec<PanickySettle>, BrokerError> {
        let got = self.0.receive(max).await?;
        Ok(got
            .into_iter()
            .map(|inner| PanickySettle {
                inner,
                panics: "ack",
            })
            .collect())
    }
}

/// An ack that panics after COMMIT: the delivery was applied (its change and its marker committed), only the
/// broker's settle failed. The worker's report says applied, and the metrics count a settle failure, as for an
/// ack that returns an error; no retry, which would say the change was rolled back.
#[tokio::test(flavor = "current_thread")]
async fn an_ack_that_panics_after_commit_is_applied_with_a_settle_failure() {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker};
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemStore::default();
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    q.send(event("evt-1", "op-1"));
    let report = Worker::new(PanickyAcks(q.receiver()), processor(&store))
        .run_until_idle()
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 1, "{report}");
    assert_eq!(report.count(OutcomeKind::Retry), 0, "{report}");
    assert_eq!(store.state().effects, vec!["task-op-1".to_owned()]);
    let counted = counters(&snap);
    let m = crate::metrics::SETTLE_FAILURES;
    assert_eq!(count(&counted, m, &[("op", "ack")]), 1, "{counted:?}");
    assert_eq!(count(&counted, crate::metrics::APPLIED, &[]), 1);
    assert_eq!(
        count(&counted, crate::metrics::RETRIES, &[]),
        0,
        "{counted:?}"
    );
    // Never acknowledged: the message comes back after its visibility timeout, to be found a duplicate.
    assert_eq!(q.state().in_flight, 1);
}

/// A dead-letter that panics leaves the outcome dead-lettered, counted as a settle failure.
#[tokio::test(flavor = "current_thread")]
async fn a_dead_letter_that_panics_is_a_settle_failure() {
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemStore::default();
    let q = MemoryQueue::default();
    q.send(OutgoingMessage::new("not json").cloudevent("urn:crm", "evt-1", "crm.meeting.ended"));
    let inner = q.receive_now(1).pop().expect("a delivery");
    let outcome = processor(&store)
        .process_one(PanickySettle {
            inner,
            panics: "dead_letter",
        })
        .await;
    assert!(
        matches!(&outcome, Outcome::DeadLettered { reason, .. } if reason == "invalid_json"),
        "{outcome:?}"
    );
    let counted = counters(&snap);
    let m = crate::metrics::SETTLE_FAILURES;
    assert_eq!(
        count(&counted, m, &[("op", "dead_letter")]),
        1,
        "{counted:?}"
    );
}
