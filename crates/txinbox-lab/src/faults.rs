//! Simulated crashes for the failure windows, kept out of the production path: a store and a delivery that
//! wrap the real ones and, at the armed point, stop forever, as a process that died there would. The caller
//! then drops the pipeline's future ([`crash_at`]): the open transaction rolls back with it (its connection
//! goes back to the pool), and the delivery is dropped unsettled, so the broker redelivers it after its lock
//! or visibility timeout.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use txinbox_core::effects::NewEffect;
use txinbox_core::{
    BrokerError, Commit, DeadLetter, Delivery, ExistingMarker, Handler, Identity, InboxProcessor,
    InboxStore, Lease, MarkerInsert, MarkerRow, Outcome, Payload, ReceivedMessage, Rejection,
};

/// A point in the inbox transaction where a fault test can simulate a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultPoint {
    /// After receive, before BEGIN.
    BeforeTransaction,
    /// After the marker insert, before the handler's business change.
    AfterMarkerInsert,
    /// After the business change, before COMMIT.
    AfterBusinessChange,
    /// After COMMIT, before the settle.
    AfterCommit,
}

/// A simulated crash: the process "died" at the point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("simulated crash at {0:?}")]
pub struct Crashed(pub FaultPoint);

/// The armed point, shared by a [`FaultyStore`] and the [`FaultyDelivery`]s of one run.
#[derive(Debug, Default)]
pub struct Faults {
    armed: Mutex<Option<FaultPoint>>,
    crashed: Mutex<CancellationToken>,
}

impl Faults {
    /// Nothing armed.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Arms `point`: the next pass through it crashes (once); the token is cancelled when it does.
    pub fn arm(&self, point: FaultPoint) -> CancellationToken {
        *self.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some(point);
        let fresh = CancellationToken::new();
        *self.crashed.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        fresh
    }

    /// Stops forever when `here` is armed (and disarms it), after announcing the crash.
    async fn at(&self, here: FaultPoint) {
        let hit = {
            let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
            if *armed == Some(here) {
                *armed = None;
                true
            } else {
                false
            }
        };
        if hit {
            tracing::warn!(at = ?here, "simulated crash");
            self.crashed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .cancel();
            std::future::pending::<()>().await;
        }
    }
}

/// A store that crashes at the armed point.
#[derive(Clone, Debug)]
pub struct FaultyStore<S> {
    inner: S,
    faults: Arc<Faults>,
}

impl<S> FaultyStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, faults: Arc<Faults>) -> Self {
        Self { inner, faults }
    }
}

impl<S: InboxStore> InboxStore for FaultyStore<S> {
    type Tx = S::Tx;
    type Error = S::Error;

    fn name(&self) -> &'static str {
        self.inner.name()
    }
    async fn begin(&self) -> Result<S::Tx, S::Error> {
        self.faults.at(FaultPoint::BeforeTransaction).await;
        self.inner.begin().await
    }
    async fn insert_marker(
        &self,
        tx: &S::Tx,
        row: &MarkerRow<'_>,
    ) -> Result<MarkerInsert, S::Error> {
        let r = self.inner.insert_marker(tx, row).await?;
        if r == MarkerInsert::Inserted {
            self.faults.at(FaultPoint::AfterMarkerInsert).await;
        }
        Ok(r)
    }
    async fn insert_markers(
        &self,
        tx: &S::Tx,
        rows: &[MarkerRow<'_>],
    ) -> Result<Vec<MarkerInsert>, S::Error> {
        let r = self.inner.insert_markers(tx, rows).await?;
        if r.contains(&MarkerInsert::Inserted) {
            self.faults.at(FaultPoint::AfterMarkerInsert).await;
        }
        Ok(r)
    }
    async fn record_result(
        &self,
        tx: &S::Tx,
        identity: &Identity,
        result_reference: Option<&str>,
        effects: &[NewEffect<'_>],
    ) -> Result<(), S::Error> {
        self.faults.at(FaultPoint::AfterBusinessChange).await;
        self.inner
            .record_result(tx, identity, result_reference, effects)
            .await
    }
    async fn commit(&self, tx: S::Tx) -> Result<Commit, S::Error> {
        self.inner.commit(tx).await
    }
    async fn rollback(&self, tx: S::Tx, clean_end: bool) -> Result<(), S::Error> {
        self.inner.rollback(tx, clean_end).await
    }
    async fn record_rejection(&self, r: &Rejection<'_>) -> Result<(), S::Error> {
        self.inner.record_rejection(r).await
    }
    async fn savepoint(&self, tx: &S::Tx) -> Result<bool, S::Error> {
        self.inner.savepoint(tx).await
    }
    async fn rollback_to_savepoint(&self, tx: &S::Tx) -> Result<(), S::Error> {
        self.inner.rollback_to_savepoint(tx).await
    }
    // Forwarded, not left to the trait's default: the default answers `None`, and a store that decides
    // duplicates at commit (DynamoDB) would then dead-letter, in the lab only, a held copy whose handler failed
    // for good, where the worker acknowledges it as a duplicate.
    async fn holder_of(&self, identity: &Identity) -> Result<Option<ExistingMarker>, S::Error> {
        self.inner.holder_of(identity).await
    }
    fn is_transient(e: &S::Error) -> bool {
        S::is_transient(e)
    }
    fn classify(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
        S::classify(e)
    }
}

/// A delivery whose settle crashes when [`FaultPoint::AfterCommit`] is armed.
pub struct FaultyDelivery<D> {
    inner: D,
    faults: Arc<Faults>,
}

impl<D: Delivery> FaultyDelivery<D> {
    /// Wraps `inner`.
    pub fn new(inner: D, faults: Arc<Faults>) -> Self {
        Self { inner, faults }
    }
}

impl<D: Delivery> Delivery for FaultyDelivery<D> {
    fn message(&self) -> &ReceivedMessage {
        self.inner.message()
    }
    async fn ack(self) -> Result<(), BrokerError> {
        self.faults.at(FaultPoint::AfterCommit).await;
        self.inner.ack().await
    }
    async fn release(self, delay: std::time::Duration) -> Result<(), BrokerError> {
        self.faults.at(FaultPoint::AfterCommit).await;
        self.inner.release(delay).await
    }
    async fn dead_letter(self, why: DeadLetter) -> Result<(), BrokerError> {
        self.faults.at(FaultPoint::AfterCommit).await;
        self.inner.dead_letter(why).await
    }
    fn lease(&self) -> Option<Arc<dyn Lease>> {
        self.inner.lease()
    }
    fn release_holds(&self) -> bool {
        self.inner.release_holds()
    }
}

/// Processes `delivery` through `processor` (whose store is a [`FaultyStore`] sharing `faults`) with `point`
/// armed. When the crash fires, the pipeline's future is dropped where it stopped, as a dead process leaves
/// it, and the result is `Err(Crashed)`; a delivery that never reaches the point ends with its outcome.
pub async fn crash_at<S, T, H, D>(
    processor: &InboxProcessor<FaultyStore<S>, T, H>,
    faults: &Arc<Faults>,
    delivery: D,
    point: FaultPoint,
) -> Result<Outcome, Crashed>
where
    S: InboxStore,
    T: Payload,
    H: Handler<FaultyStore<S>, T>,
    D: Delivery,
{
    let crashed = faults.arm(point);
    let run = processor.process_one(FaultyDelivery::new(delivery, faults.clone()));
    tokio::select! {
        biased;
        _ = crashed.cancelled() => Err(Crashed(point)),
        o = run => Ok(o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use txinbox_core::{ConsumerName, IdOrigin};

    /// A store that decides duplicates at commit: it answers a holder for every identity, as DynamoDB's
    /// strongly consistent read of a held marker does.
    #[derive(Clone)]
    struct HoldsEverything;

    impl InboxStore for HoldsEverything {
        type Tx = ();
        type Error = std::io::Error;
        fn name(&self) -> &'static str {
            "holds-everything"
        }
        async fn begin(&self) -> Result<(), Self::Error> {
            Ok(())
        }
        async fn insert_marker(
            &self,
            _: &(),
            _: &MarkerRow<'_>,
        ) -> Result<MarkerInsert, Self::Error> {
            Ok(MarkerInsert::Inserted)
        }
        async fn record_result(
            &self,
            _: &(),
            _: &Identity,
            _: Option<&str>,
            _: &[NewEffect<'_>],
        ) -> Result<(), Self::Error> {
            Ok(())
        }
        async fn commit(&self, _: ()) -> Result<Commit, Self::Error> {
            Ok(Commit::Done)
        }
        async fn rollback(&self, _: (), _: bool) -> Result<(), Self::Error> {
            Ok(())
        }
        async fn record_rejection(&self, _: &Rejection<'_>) -> Result<(), Self::Error> {
            Ok(())
        }
        async fn holder_of(
            &self,
            identity: &Identity,
        ) -> Result<Option<ExistingMarker>, Self::Error> {
            Ok(Some(ExistingMarker::new(
                true,
                identity.message_id.clone(),
                "hash".into(),
                chrono::DateTime::UNIX_EPOCH,
                Some("task-1".into()),
            )))
        }
        fn is_transient(_: &Self::Error) -> bool {
            false
        }
    }

    /// The lab's wrapper answers the holder its store answers: with the trait's default (`None`) a held copy
    /// whose handler failed for good was dead-lettered in the lab on DynamoDB, and acknowledged by the worker.
    #[tokio::test]
    async fn the_faulty_store_answers_its_stores_holder() {
        let store = FaultyStore::new(HoldsEverything, Faults::new());
        let identity = Identity {
            consumer: ConsumerName::new("lab").unwrap(),
            source: "lab".into(),
            message_id: "m-1".into(),
            origin: IdOrigin::ProducerId,
            event_type: None,
            contract_version: None,
            tenant_id: None,
            business_key: None,
            event_time: None,
        };
        let holder = store.holder_of(&identity).await.unwrap();
        assert_eq!(
            holder.map(|h| (h.message_id, h.result_reference)),
            Some(("m-1".to_owned(), Some("task-1".to_owned())))
        );
    }

    /// A delivery whose release holds its caller for the delay, as Service Bus's over REST does.
    struct HoldingRelease(ReceivedMessage);

    impl Delivery for HoldingRelease {
        fn message(&self) -> &ReceivedMessage {
            &self.0
        }
        async fn ack(self) -> Result<(), BrokerError> {
            Ok(())
        }
        async fn release(self, _: std::time::Duration) -> Result<(), BrokerError> {
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

    /// The lab's delivery wrapper says what its delivery says of its release: one that holds its caller (the
    /// shard router settles it in the background) is not taken for one that returns at once.
    #[test]
    fn the_faulty_delivery_answers_whether_its_release_holds() {
        let d = FaultyDelivery::new(
            HoldingRelease(ReceivedMessage::new(b"{}".to_vec())),
            Faults::new(),
        );
        assert!(d.release_holds());
    }
}
