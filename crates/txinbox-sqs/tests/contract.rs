//! The core's broker contract on SQS, against moto and PostgreSQL: failures are `txinbox_core::BrokerError`s
//! whose source chain reaches the SDK's `SdkError`, and a lease says its duration so a worker with default
//! options keeps a slow message invisible.

mod common;

use std::error::Error as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::operation::get_queue_attributes::GetQueueAttributesError;
use aws_sdk_sqs::operation::receive_message::ReceiveMessageError;
use common::*;
use serde_json::json;
use txinbox_core::{metrics as m, BrokerErrorKind, Receiver, Worker};
use txinbox_sqs::{SqsOptions, SqsReceiver};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_is_entity_not_found_down_to_the_sdk_error() {
    let c = client().await;

    // Building a receiver on a queue that does not exist.
    let url = format!("{}/123456789012/{}.fifo", endpoint(), unique("absent"));
    let err = SqsReceiver::connect(c.clone(), url, SqsOptions::default())
        .await
        .expect_err("no such queue");
    assert_eq!(err.kind(), BrokerErrorKind::EntityNotFound, "{err}");
    assert_eq!(err.operation(), "GetQueueAttributes");
    assert!(!err.is_retryable());
    let sdk = err
        .find_source::<SdkError<GetQueueAttributesError, HttpResponse>>()
        .expect("the SDK error is in the source chain");
    assert!(sdk.as_service_error().is_some(), "{sdk:?}");

    // A receiver whose queue is deleted under it: the Receiver call itself returns the core error.
    let q = queue_pair(&c, 5, 30).await;
    let mut receiver = fast_receiver(c.clone(), &q, 30).await;
    c.delete_queue().queue_url(&q.url).send().await.unwrap();
    let err = receiver.receive(1).await.expect_err("the queue is gone");
    assert_eq!(err.kind(), BrokerErrorKind::EntityNotFound, "{err}");
    assert_eq!(err.operation(), "ReceiveMessage");
    let top = err.source().expect("a source");
    let sdk = top
        .downcast_ref::<SdkError<ReceiveMessageError, HttpResponse>>()
        .expect("the source is the SDK's error, not a string");
    assert!(sdk.as_service_error().is_some(), "{sdk:?}");
    assert!(err
        .to_string()
        .starts_with("ReceiveMessage failed (entity not found)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn default_worker_options_keep_a_slow_message_invisible() {
    metrics_init();
    let c = client().await;
    // A 5 s visibility timeout and a 12 s handler: the lease says 5 s, so the keeper renews every ~1.7 s, and a
    // renewal slowed by a loaded machine still has over 3 s before the message would show again.
    let q = queue_pair(&c, 5, 5).await;
    let store = pg_store().await;
    let consumer = unique("contract-slow");
    send(
        &c,
        &q.url,
        &body("o1", "m1", json!({"sleep_ms": 12000})),
        Some("evt-contract"),
        "d-contract",
        "g",
    )
    .await;
    let receiver = fast_receiver(c.clone(), &q, 5).await;
    let calls = Arc::new(AtomicI64::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // No `.options(..)`: the defaults, whatever the visibility timeout.
    let worker = tokio::spawn(
        Worker::new(
            receiver,
            pg_inbox(&store, &consumer).bind_handler(pg_handler(calls.clone())),
        )
        .run_until(async {
            let _ = stopped.await;
        }),
    );
    wait_until(
        Duration::from_secs(60),
        "the slow message applied",
        || async { pg_effects(&store).await == 1 && counts(&c, &q.url).await == (0, 0) },
    )
    .await;
    // Leave time for a (wrong) second delivery to show before asserting there was none.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _ = stop.send(());
    let report = worker.await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no second delivery");
    assert_eq!(
        (
            report.total(),
            report.count(txinbox_core::OutcomeKind::Applied),
            report.leases_lost
        ),
        (1, 1, 0),
        "{report:?}"
    );
    assert!(
        counter(m::LEASE_RENEWALS, &[("consumer", &consumer)]) >= 4,
        "renewed every third of the 5 s visibility for 12 s"
    );
    assert_eq!(counter(m::LEASE_LOST, &[("consumer", &consumer)]), 0);
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (1, 1)
    );
    assert_eq!(counts(&c, &q.dlq).await, (0, 0));
}
