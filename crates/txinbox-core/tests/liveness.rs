//! Liveness while receives fail: a worker backing off on purpose is live however long its pause
//! (`receive_error_backoff_max` above the health's live timeout included), not ready; a loop that does not turn
//! after its pause is not live. On tokio's paused clock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use txinbox_core::broker::mem::MemoryDelivery;
use txinbox_core::runtime::health::Health;
use txinbox_core::{
    BrokerError, BrokerErrorKind, Delivery, Outcome, Processor, Receiver, Worker, WorkerOptions,
};

/// The first receive fails (the broker is down); the next one never answers (a stuck loop).
struct DownThenStuck(Arc<AtomicU32>);

impl Receiver for DownThenStuck {
    type Delivery = MemoryDelivery;
    async fn receive(&mut self, _max: usize) -> Result<Vec<MemoryDelivery>, BrokerError> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(BrokerError::new(
                BrokerErrorKind::ServerError,
                "receive",
                "HTTP 503 (the broker is down)",
            ));
        }
        std::future::pending().await
    }
}

struct Never;

impl<D: Delivery> Processor<D> for Never {
    fn consumer(&self) -> &str {
        "liveness"
    }
    async fn process(&self, _delivery: D, _stop: CancellationToken) -> Outcome {
        unreachable!("nothing is received")
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_backing_off_longer_than_the_live_timeout_is_live_and_not_ready() {
    let live_timeout = Duration::from_secs(120);
    let backoff = Duration::from_secs(600);
    let health = Health::new().live_timeout(live_timeout);
    let receives = Arc::new(AtomicU32::new(0));
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(DownThenStuck(receives.clone()), Never)
            .health(health.clone())
            .options(
                WorkerOptions::default()
                    .receive_loops(1)
                    .receive_error_backoff(backoff)
                    .receive_error_backoff_max(backoff),
            )
            .run_until(stop.clone().cancelled_owned()),
    );
    // The pause after the failed receive lasts between half and all of 10 min: at 4 min the worker is still in
    // it, silent for twice the live timeout.
    tokio::time::sleep(Duration::from_secs(240)).await;
    assert_eq!(receives.load(Ordering::SeqCst), 1, "backing off");
    let live = health.liveness();
    assert!(live.ok, "backing off on purpose is live: {live}");
    let ready = health.readiness().await;
    assert!(!ready.ok, "the last receive failed: {ready}");
    // The pause is over by 10 min and the next receive never answers: past the live timeout after the end of
    // the pause, the loop is stuck.
    tokio::time::sleep(Duration::from_secs(600 - 240) + live_timeout + Duration::from_secs(10))
        .await;
    assert_eq!(receives.load(Ordering::SeqCst), 2, "the next receive hangs");
    let live = health.liveness();
    assert!(
        !live.ok,
        "a loop that does not turn after its pause is not live: {live}"
    );
    stop.cancel();
    let _ = worker.await;
}
