//! Shutdown with a long poll in flight, against the emulator: a message the broker locked for a receive
//! still in flight when the stop signal came is handed back (unlocked) and received again at once, not after
//! its 60 s lock.
//!
//! The receive is wrapped so that its answer comes back only after the stop signal, once the broker locked the
//! message: the window of a real network in which the stop signal finds a poll that already holds a message
//! (the emulator, like hyper, drops a long poll whose client went away, so the window cannot be opened from
//! the client side alone). The window is held open by events, not by a delay a loaded machine could outlast.

use std::time::{Duration, Instant};

use txinbox_core::{BrokerError, CancellationToken, Delivery, Receiver, Worker};
use txinbox_servicebus::{ServiceBusDelivery, ServiceBusReceiver};

use crate::common::*;

/// A receiver that, once the broker handed it messages, cancels `locked` and answers only when `release` is
/// cancelled.
struct SlowAnswer {
    inner: ServiceBusReceiver,
    locked: CancellationToken,
    release: CancellationToken,
}

impl Receiver for SlowAnswer {
    type Delivery = ServiceBusDelivery;
    async fn receive(&mut self, max: usize) -> Result<Vec<ServiceBusDelivery>, BrokerError> {
        let got = self.inner.receive(max).await?;
        if !got.is_empty() {
            self.locked.cancel();
            self.release.cancelled().await;
        }
        Ok(got)
    }
}

#[tokio::test]
async fn a_message_received_after_the_stop_signal_is_received_again_at_once() {
    let emu = Emu::shared().await;
    let client = emu.client();
    let q = emu.queue(serde_json::json!({"lockDuration": "PT1M"})).await;
    let store = pg().await;
    let effects = Effects::default();
    let opts = fast_options(Duration::from_secs(60)).wait(Duration::from_secs(5));
    let stop = CancellationToken::new();
    let (locked, release) = (CancellationToken::new(), CancellationToken::new());
    let receiver = SlowAnswer {
        inner: ServiceBusReceiver::new(&client, &q, opts).unwrap(),
        locked: locked.clone(),
        release: release.clone(),
    };
    // The poll's answer is let go as the stop signal is given (at the end of the shutdown future), so that it
    // comes back after the signal.
    let signal = stop.clone();
    let shutdown = async move {
        signal.cancelled().await;
        release.cancel();
    };
    let worker = tokio::spawn(
        Worker::new(receiver, inbox(&store).bind_handler(effects.clone())).run_until(shutdown),
    );
    // The worker's long poll is under way; a message arrives and is locked for it; the stop signal comes
    // before the poll's answer does.
    tokio::time::sleep(Duration::from_millis(500)).await;
    publish(&client, &event(&q, "evt-stop", "{}")).await;
    tokio::time::timeout(Duration::from_secs(20), locked.cancelled())
        .await
        .expect("the worker's poll got the message");
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(20), worker)
        .await
        .expect("the worker stops")
        .unwrap();
    assert_eq!(
        report.total(),
        0,
        "nothing processed after the stop signal: {report}"
    );
    assert_eq!(effects.calls(), 0);
    let started = Instant::now();
    let mut again =
        ServiceBusReceiver::new(&client, &q, fast_options(Duration::from_secs(60))).unwrap();
    let got = again.receive_one(Duration::from_secs(5)).await.unwrap();
    let d = got.expect("received again before the 60 s lock would have run out");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        d.message().delivery_count,
        2,
        "the stopped worker's poll had it once"
    );
    d.ack().await.unwrap();
}
