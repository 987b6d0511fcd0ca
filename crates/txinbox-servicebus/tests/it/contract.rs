//! The core's broker contract on Service Bus: failures are `txinbox_core::BrokerError`s whose source chain
//! reaches the `azure_core` error (or the status the adapter checked), and a lease says its duration so a
//! worker with default options keeps a slow message locked.

use std::error::Error as _;
use std::time::Duration;

use serde_json::json;
use txinbox_core::metrics as m;
use txinbox_core::{BrokerErrorKind, Delivery, Receiver, Worker};
use txinbox_servicebus::error::UnexpectedStatus;
use txinbox_servicebus::{ServiceBusOptions, ServiceBusPublisher, ServiceBusReceiver};

use crate::common::*;

/// A throttled send carries the service's `Retry-After`, so that the outbox sends again no sooner (it waits
/// the longer of its backoff and `retry_after()`); a hostile or buggy one is bounded at 30 s, as on receive.
#[tokio::test]
async fn a_throttled_send_keeps_the_service_s_retry_after() {
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    let send = format!("/{q}/messages");
    let publisher = ServiceBusPublisher::new(client.clone());
    for (asked, kept) in [(7, 7), (999_999, 30)] {
        emu.fault(json!({"kind": "status", "status": 429, "retry_after_seconds": asked, "method": "POST", "path_suffix": send}))
            .await;
        let err = publisher
            .send(&event(&q, "evt-throttled", "{}"))
            .await
            .expect_err("throttled");
        assert_eq!(err.kind(), BrokerErrorKind::Throttled, "{err}");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(kept)), "{err}");
    }
    assert_eq!(emu.counts(&q).await, (0, 0), "nothing was sent");
}

/// A send answered 403 is refused, not unauthorized: Microsoft, Send Message and Send Message Batch, "403 Quota
/// exceeded or message too large." (an authorization failure is "401 Authorization failure."). A message over
/// the queue's MaxMessageSizeInKilobytes (the Standard tier's 256 KB), larger than any tier's message can be
/// (`ALWAYS_FITS_BODY`), is Rejected, not retryable, and says no word about credentials; a wrong key stays
/// Unauthorized. (A smaller body's 403 is the entity's quota, retried: `error`'s unit tests.)
#[tokio::test]
async fn a_send_answered_403_is_rejected_not_unauthorized() {
    let (emu, client, q) =
        emu_queue(json!({"lockDuration": "PT5S", "maxMessageSizeInKilobytes": 256})).await;
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(300 * 1024));
    let err = ServiceBusPublisher::new(client.clone())
        .send(&event(&q, "evt-too-large", &big))
        .await
        .expect_err("the message is larger than the queue takes");
    assert_eq!(err.kind(), BrokerErrorKind::Rejected, "{err}");
    assert_eq!(err.operation(), "send");
    assert!(!err.is_retryable());
    let azure = err
        .find_source::<azure_core::Error>()
        .expect("the azure_core error is in the chain");
    assert!(
        matches!(azure.kind(), azure_core::error::ErrorKind::HttpResponse { status, .. } if u16::from(*status) == 403),
        "{azure:?}"
    );
    assert_eq!(emu.counts(&q).await, (0, 0), "nothing was sent");
}

#[tokio::test]
async fn failures_are_broker_errors_down_to_the_client_error() {
    let Received { emu, q, d, .. } = publish_and_receive(Duration::from_secs(1), "evt-chain").await;

    // A lock that lapsed: the renewal's 404 is a lost lock whose source is the azure_core error.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let err = d
        .lease()
        .unwrap()
        .renew(Duration::from_secs(1))
        .await
        .expect_err("the lock lapsed");
    assert_eq!(err.kind(), BrokerErrorKind::LockLost, "{err}");
    assert_eq!(err.operation(), "renew-lock");
    let azure = err
        .source()
        .and_then(|s| s.downcast_ref::<azure_core::Error>())
        .expect("the source is the azure_core error, not a string");
    assert!(
        matches!(azure.kind(), azure_core::error::ErrorKind::HttpResponse { status, .. } if u16::from(*status) == 404),
        "{azure:?}"
    );

    // A wrong SAS key: unauthorized on receive (the adapter checks the status itself) and on send.
    let wrong = emu.wrong_key_client();
    let mut refused = fast_receiver(&wrong, &q, Duration::from_secs(2));
    let err = refused.receive(1).await.expect_err("the key is wrong");
    assert_eq!(err.kind(), BrokerErrorKind::Unauthorized, "{err}");
    assert_eq!(err.operation(), "receive");
    assert!(!err.is_retryable());
    let status = err
        .find_source::<UnexpectedStatus>()
        .expect("the checked status is the source");
    assert_eq!(status.status, 401);
    assert!(!err.to_string().contains(&emu.key), "no key in the error");

    let err = ServiceBusPublisher::new(wrong.clone())
        .send(&event(&q, "evt-refused", "{}"))
        .await
        .expect_err("the key is wrong");
    assert_eq!(err.kind(), BrokerErrorKind::Unauthorized, "{err}");
    assert_eq!(err.operation(), "send");
    assert!(
        err.find_source::<azure_core::Error>().is_some(),
        "the azure_core error is in the chain: {err:?}"
    );
    assert!(!err.to_string().contains(&emu.key), "no key in the error");
}

/// The lease reports the broker's lock when it is shorter than the configured one. `LockedUntilUtc` is
/// RFC 1123, whole seconds: the granted lock reads up to a second short (3 s reads as 2 to 3 s, never below the
/// adapter's 1 s floor for a granted lock; 2 s could read below it on a slow run).
#[tokio::test]
async fn the_lease_says_the_lock_the_broker_granted() {
    let (_, client, q) = emu_queue(json!({"lockDuration": "PT3S"})).await;
    publish(&client, &event(&q, "evt-granted", "{}")).await;
    // Configured 60 s (the default), granted 3 s.
    let opts = ServiceBusOptions::default().wait(Duration::from_secs(1));
    let d = receive_next(&mut ServiceBusReceiver::new(&client, &q, opts).unwrap()).await;
    let duration = d.lease().unwrap().duration();
    assert!(
        duration <= Duration::from_secs(3) && duration >= Duration::from_secs(1),
        "{duration:?}"
    );
    d.ack().await.unwrap();
}

/// A release whose backoff is longer than what is left of the lock: nothing renews the lock while it is held,
/// so the hold ends before the lock does and the abandon finds it. Microsoft: "When the lock expires, the
/// message becomes available to other receivers." The hold slept its whole delay, and the abandon found
/// no lock (`LockLost`).
#[tokio::test]
async fn a_release_longer_than_the_lock_abandons_before_the_lock_ends() {
    let (_, client, q) = emu_queue(json!({"lockDuration": "PT3S"})).await;
    publish(&client, &event(&q, "evt-hold", "{}")).await;
    let opts = ServiceBusOptions::default()
        .wait(Duration::from_secs(1))
        .max_release_delay(Duration::from_secs(10));
    let mut receiver = ServiceBusReceiver::new(&client, &q, opts).unwrap();
    let d = receive_next(&mut receiver).await;
    d.release(Duration::from_secs(10))
        .await
        .expect("abandoned while the lock was held");
    let again = receive_next(&mut receiver).await;
    assert_eq!(again.message().delivery_count, 2);
    again.ack().await.unwrap();
}

/// A handler that runs 2.4 times the lock duration, with default worker options: renewed, applied once. A 5 s
/// lock leaves a renewal slowed by a loaded machine over 3 s before the lock ends.
#[tokio::test]
async fn default_worker_options_keep_a_slow_message_locked() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    let store = pg().await;
    publish(&client, &event(&q, "evt-contract", "{\"meeting\":3}")).await;
    let handler = Effects::slow(Duration::from_secs(12));
    let receiver = fast_receiver(&client, &q, Duration::from_secs(5));
    let done = until(Duration::from_secs(40), || async {
        emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= 1
    });
    // No `.options(..)`: the defaults, whatever the lock duration.
    let report = Worker::new(receiver, inbox(&store).bind_handler(handler.clone()))
        .run_until(async {
            done.await;
            // Leave time for a (wrong) second delivery to show before stopping.
            tokio::time::sleep(Duration::from_secs(3)).await;
        })
        .await;
    assert_eq!(
        (
            report.total(),
            report.count(txinbox_core::OutcomeKind::Applied),
            report.leases_lost
        ),
        (1, 1, 0),
        "{report:?}"
    );
    assert_eq!(handler.calls(), 1);
    assert_eq!(metrics.counter(m::RECEIVED, &[]), 1, "no second delivery");
    assert!(
        metrics.counter(m::LEASE_RENEWALS, &[]) >= 4,
        "renewed every third of the 5 s lock for 12 s"
    );
    assert_eq!(metrics.counter(m::LEASE_LOST, &[]), 0);
    assert_eq!(effects(&store).await, (1, 1));
    assert_eq!(emu.counts(&q).await, (0, 0));
}

/// A receive hands out several locked messages: one long poll, then `timeout=0` requests, sent all at once
/// once a receive came back full. Every message is handed out once, under its own lock, and completes.
#[tokio::test]
async fn a_full_receive_sends_its_follow_up_requests_at_once_and_each_message_is_locked_once() {
    let (emu, client, q) = emu_queue(json!({})).await;
    publish_events(&client, &q, 20).await;
    let opts = fast_options(Duration::from_secs(30)).batch_size(8);
    let mut receiver = ServiceBusReceiver::new(&client, &q, opts).unwrap();
    // First receive: sequential follow-ups; full (8), so the next two send theirs at once.
    let mut got = Vec::new();
    for expect in [8, 8, 4] {
        let batch = receiver.receive(8).await.unwrap();
        assert_eq!(batch.len(), expect);
        got.extend(batch);
    }
    let mut ids: Vec<_> = got
        .iter()
        .map(|d| d.message().attribute("ce-id").unwrap().to_owned())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20, "each message handed out once");
    assert_eq!(emu.counts(&q).await.0, 20, "all still in the queue, locked");
    for d in got {
        d.ack().await.unwrap();
    }
    assert_eq!(emu.counts(&q).await.0, 0);
}

/// A receive after a full one sends all its requests at once with no wait (one round trip); when they all come
/// back empty (the queue has just run dry) it still long-polls: a message sent while it waits is handed out,
/// where an empty batch at once would have sent the worker into another round of requests.
#[tokio::test]
async fn a_receive_after_a_full_one_on_a_queue_run_dry_still_long_polls() {
    let (emu, client, q) = emu_queue(json!({})).await;
    publish_events(&client, &q, 4).await;
    let opts = fast_options(Duration::from_secs(30))
        .wait(Duration::from_secs(10))
        .batch_size(4);
    let mut receiver = ServiceBusReceiver::new(&client, &q, opts).unwrap();
    let first = receiver.receive(4).await.unwrap();
    assert_eq!(
        first.len(),
        4,
        "full: the next receive sends its requests at once"
    );
    let started = std::time::Instant::now();
    let waiting = tokio::spawn(async move {
        let got = receiver.receive(4).await;
        (receiver, got)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "an empty queue is long-polled, not answered empty at once"
    );
    publish(&client, &event(&q, "evt-late", "{}")).await;
    let (_receiver, got) = waiting.await.unwrap();
    let got = got.unwrap();
    assert_eq!(got.len(), 1, "the message sent during the long poll");
    assert_eq!(got[0].message().attribute("ce-id"), Some("evt-late"));
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "handed out when it arrived, not at the end of the 10 s wait"
    );
    for d in first.into_iter().chain(got) {
        d.ack().await.unwrap();
    }
    assert_eq!(emu.counts(&q).await.0, 0);
}

/// By default the adapter caps nothing the worker asks for: a receive of 12 on a backlog of 20 locks 12 (it
/// used to stop at 8, the old default of `batch_size`, silently below the worker's `[worker] receive_max`); an
/// explicit `batch_size` still caps it.
#[tokio::test]
async fn by_default_a_receive_locks_what_the_worker_asks_for() {
    let (emu, client, q) = emu_queue(json!({})).await;
    publish_events(&client, &q, 20).await;
    let mut receiver = fast_receiver(&client, &q, Duration::from_secs(30));
    let first = receiver.receive(12).await.unwrap();
    assert_eq!(first.len(), 12);
    let mut capped = ServiceBusReceiver::new(
        &client,
        &q,
        fast_options(Duration::from_secs(30)).batch_size(5),
    )
    .unwrap();
    let second = capped.receive(12).await.unwrap();
    assert_eq!(second.len(), 5);
    for d in first.into_iter().chain(second) {
        d.ack().await.unwrap();
    }
    assert_eq!(emu.counts(&q).await.0, 3);
}

/// One worker of three receive loops (the receiver forked twice, sharing the HTTP client) on ten messages
/// published twice: each message is applied once and its copy is a duplicate, whichever loop locked it; the
/// queue ends empty.
#[tokio::test]
async fn receive_loops_on_forked_receivers_apply_each_message_once() {
    let (emu, client, q) = emu_queue(json!({})).await;
    let store = pg().await;
    let n = 10;
    publish_each_twice(&client, &q, n).await;
    let receiver = fast_receiver(&client, &q, Duration::from_secs(30));
    let done = until(Duration::from_secs(60), || async {
        emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= n
    });
    let report = Worker::new(receiver, inbox(&store).bind_handler(Effects::default()))
        .options(
            txinbox_core::WorkerOptions::default()
                .concurrency(6)
                .batch_size(2)
                .receive_loops(3),
        )
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(
        (
            report.count(txinbox_core::OutcomeKind::Applied),
            report.count(txinbox_core::OutcomeKind::Duplicate)
        ),
        (n as u64, n as u64),
        "{report}"
    );
    assert_eq!(effects(&store).await, (n, n));
    assert_eq!(emu.counts(&q).await, (0, 0));
}
