//! Shutdown with a long poll in flight, against moto: a message that reaches the poll after the stop
//! signal is handed back (`ChangeMessageVisibility` 0) and received again at once, not after its 60 s
//! visibility timeout.
//!
//! The stop signal comes once the receiver says its poll has begun, and the poll waits 20 s (the most SQS
//! allows): the message sent after the signal reaches a poll still in flight however slow moto's answers.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tokio_util::sync::CancellationToken;
use txinbox_core::{BrokerError, Receiver, Worker};
use txinbox_sqs::{SqsDelivery, SqsReceiver};

/// A receiver that cancels `polling` as each of its receives begins.
struct SaysWhenPolling {
    inner: SqsReceiver,
    polling: CancellationToken,
}

impl Receiver for SaysWhenPolling {
    type Delivery = SqsDelivery;
    async fn receive(&mut self, max: usize) -> Result<Vec<SqsDelivery>, BrokerError> {
        self.polling.cancel();
        self.inner.receive(max).await
    }
    fn fork(&self) -> Option<Self> {
        Some(Self {
            inner: self.inner.fork()?,
            polling: self.polling.clone(),
        })
    }
}

#[tokio::test]
async fn a_message_received_after_the_stop_signal_is_received_again_at_once() {
    let c = client().await;
    let q = queue_pair(&c, 5, 60).await;
    let store = sqlite_store().await;
    let calls = Arc::new(AtomicI64::new(0));
    let opts = fast_options(60, &q.dlq).wait(Duration::from_secs(20));
    let polling = CancellationToken::new();
    let receiver = SaysWhenPolling {
        inner: SqsReceiver::connect(c.clone(), &q.url, opts).await.unwrap(),
        polling: polling.clone(),
    };
    let inbox = txinbox_core::Inbox::new(store.clone(), policy("sqs-shutdown"))
        .bind_handler(sqlite_handler(calls.clone()));
    let stop = CancellationToken::new();
    let worker =
        tokio::spawn(Worker::new(receiver, inbox).run_until(stop.clone().cancelled_owned()));
    // The worker's first long poll (20 s) is under way on an empty queue; the stop signal comes, then a
    // message, which SQS hands to that poll.
    tokio::time::timeout(Duration::from_secs(20), polling.cancelled())
        .await
        .expect("the worker polls");
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(
        &c,
        &q.url,
        &body("o1", "m1", serde_json::json!({})),
        Some("e-stop"),
        "d-stop",
        "g1",
    )
    .await;
    let report = tokio::time::timeout(Duration::from_secs(40), worker)
        .await
        .expect("the worker stops within its long poll")
        .unwrap();
    assert_eq!(
        report.total(),
        0,
        "nothing processed after the stop signal: {report}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // Received again at once: well inside the 60 s visibility timeout it would otherwise wait.
    let started = Instant::now();
    let mut got = Vec::new();
    while got.is_empty() && started.elapsed() < Duration::from_secs(10) {
        got = c
            .receive_message()
            .queue_url(&q.url)
            .wait_time_seconds(1)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
    }
    assert_eq!(
        got.len(),
        1,
        "the message came back before its visibility timeout"
    );
    let count = got[0]
        .attributes()
        .and_then(|a| {
            a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
        })
        .cloned();
    assert_eq!(
        count.as_deref(),
        Some("2"),
        "the stopped worker's poll had received it once"
    );
}
