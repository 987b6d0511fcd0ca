//! The Service Bus adapter in batch mode (`WorkerOptions::batch_commit`): the real adapter through the real
//! `azure_messaging_servicebus` crate against the emulator (`txinbox-sb-emulator`, started in this test process)
//! and real PostgreSQL. The deliveries of one receive are applied in one transaction and completed after its
//! COMMIT.
//!
//! ```sh
//! TXINBOX_TEST_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p txinbox-servicebus --test it batch::
//! ```

use std::time::Duration;

use serde_json::json;
use txinbox_core::{metrics as m, Delivery, OutcomeKind, Receiver, Worker, WorkerOptions};
use txinbox_servicebus::ServiceBusReceiver;
use txinbox_testkit::NeverSettled;

use crate::common::*;

const LOCK: Duration = Duration::from_secs(2);
/// The lock of a test that never waits for one to run out: long enough that no settle, renewal or commit of a
/// loaded machine comes after it (a 2 s lock lapsed when each complete was held back 2.5 s).
const KEPT_LOCK: Duration = Duration::from_secs(5);

/// N messages delivered K times through a worker with batch commit: N inbox rows, N effects, the copies
/// duplicates.
#[tokio::test]
async fn lab_over_service_bus_in_batch_mode() {
    let (_recorder, metrics) = Metrics::install();
    let emu = Emu::shared().await;
    let client = emu.client();
    let q = emu.queue(json!({"lockDuration": "PT5S"})).await;
    let store = pg().await;
    let (n, k) = (24, 2);
    for _ in 0..k {
        publish_meetings(&client, &q, n).await;
    }
    let receiver = ServiceBusReceiver::new(&client, &q, fast_options(KEPT_LOCK)).unwrap();
    let done = until(Duration::from_secs(60), || async {
        emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= n
    });
    let report = Worker::new(receiver, inbox(&store).bind_handler(Effects::default()))
        .options(WorkerOptions::default().concurrency(16).batch_commit(10))
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(inbox_rows(&store).await, n);
    assert_eq!(effects(&store).await, (n, n));
    assert_eq!(emu.counts(&q).await, (0, 0));
    assert_eq!(report.count(OutcomeKind::Applied), n as u64, "{report}");
    assert_eq!(
        report.count(OutcomeKind::Duplicate),
        (n * (k - 1)) as u64,
        "{report}"
    );
    assert_eq!(metrics.counter(m::APPLIED, &[]), n as u64);
}

/// One receive's batch holds a payload collision, a permanent handler error and a retryable one beside good
/// messages: the good ones commit together, the collision and the poison go to the poison queue with their
/// reasons, the retry is abandoned and applied on its redelivery, and no write of a failed message is kept.
#[tokio::test]
async fn a_batch_with_a_collision_and_handler_errors_beside_good_messages() {
    let (_recorder, metrics) = Metrics::install();
    let emu = Emu::shared().await;
    let client = emu.client();
    let q = emu.queue(json!({"lockDuration": "PT5S"})).await;
    let poison = emu.queue(json!({})).await;
    let store = pg().await;
    let handler = Effects::default();
    handler.fail("evt-broken", Fail::Permanent);
    handler.fail("evt-busy", Fail::Retryable);
    let opts = || fast_options(KEPT_LOCK).dead_letter_to(&poison);
    // The first copy of evt-collide is applied alone.
    publish(
        &client,
        &event(&q, "evt-collide", "{\"meeting\":6,\"note\":\"first\"}"),
    )
    .await;
    let mut r = ServiceBusReceiver::new(&client, &q, opts()).unwrap();
    let first = r.receive(10).await.unwrap();
    let o = inbox(&store)
        .bind_handler(handler.clone())
        .process_batch(first, &txinbox_core::CancellationToken::new())
        .await;
    assert_eq!(o.iter().map(|x| x.label()).collect::<Vec<_>>(), ["applied"]);

    publish(
        &client,
        &event(&q, "evt-collide", "{\"meeting\":6,\"note\":\"second\"}"),
    )
    .await;
    publish(&client, &event(&q, "evt-broken", "{\"meeting\":7}")).await;
    publish(&client, &event(&q, "evt-busy", "{\"meeting\":8}")).await;
    for i in 0..5 {
        publish(
            &client,
            &event(
                &q,
                &format!("evt-good-{i}"),
                &format!("{{\"meeting\":{}}}", 10 + i),
            ),
        )
        .await;
    }
    // One receive's worth, applied as one batch.
    let mut batch = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while batch.len() < 8 && tokio::time::Instant::now() < deadline {
        batch.extend(r.receive(8 - batch.len()).await.unwrap());
    }
    assert_eq!(batch.len(), 8);
    let ids: Vec<String> = batch
        .iter()
        .map(|d| {
            d.message()
                .attribute("ce-id")
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    let o = inbox(&store)
        .bind_handler(handler.clone())
        .process_batch(batch, &txinbox_core::CancellationToken::new())
        .await;
    let by_id = |id: &str| {
        ids.iter()
            .position(|x| x == id)
            .map(|i| o[i].label())
            .unwrap_or("missing")
    };
    assert_eq!(by_id("evt-collide"), "payload_collision");
    assert_eq!(by_id("evt-broken"), "dead_lettered");
    assert_eq!(by_id("evt-busy"), "retry");
    assert_eq!(o.iter().filter(|x| x.label() == "applied").count(), 5);
    assert_eq!(inbox_rows(&store).await, 6);
    assert_eq!(effects(&store).await, (6, 6));
    // The retry comes back and is applied once the dependency heals.
    handler.heal();
    let done = until(Duration::from_secs(30), || async {
        emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= 7
    });
    let report = Worker::new(r, inbox(&store).bind_handler(handler.clone()))
        .options(WorkerOptions::default().batch_commit(10))
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 1, "{report}");
    assert_eq!(inbox_rows(&store).await, 7);
    assert_eq!(effects(&store).await, (7, 7));
    assert_eq!(emu.counts(&q).await, (0, 0));
    assert_eq!(emu.counts(&poison).await.0, 2);
    let state = emu.state(&poison).await;
    let mut reasons: Vec<String> = state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            m["properties"]["txinbox-dlq-reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    reasons.sort();
    assert_eq!(reasons, ["handler_permanent", "payload_collision"]);
    assert_eq!(metrics.counter(m::PAYLOAD_COLLISIONS, &[]), 1);
}

/// A crash after the batch's COMMIT and before any complete: the locks run out, every message comes back and
/// is a duplicate; one effect each.
#[tokio::test]
async fn commit_then_crash_before_complete_of_a_batch_is_absorbed() {
    let emu = Emu::shared().await;
    let client = emu.client();
    let q = emu.queue(json!({"lockDuration": "PT2S"})).await;
    let store = pg().await;
    let n = 6;
    publish_meetings(&client, &q, n as i64).await;
    let mut r = ServiceBusReceiver::new(&client, &q, fast_options(LOCK)).unwrap();
    let mut batch = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while batch.len() < n && tokio::time::Instant::now() < deadline {
        batch.extend(r.receive(n - batch.len()).await.unwrap());
    }
    assert_eq!(batch.len(), n);
    // The process dies between COMMIT and the completes: no settle reaches the broker.
    let unsettled: Vec<_> = batch.into_iter().map(NeverSettled).collect();
    let o = inbox(&store)
        .bind_handler(Effects::default())
        .process_batch(unsettled, &txinbox_core::CancellationToken::new())
        .await;
    assert!(o.iter().all(|x| x.label() == "applied"), "{o:?}");
    assert_eq!(effects(&store).await, (n as i64, n as i64));
    let done = until(Duration::from_secs(30), || async {
        emu.counts(&q).await == (0, 0)
    });
    let report = Worker::new(r, inbox(&store).bind_handler(Effects::default()))
        .options(WorkerOptions::default().batch_commit(10))
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(report.count(OutcomeKind::Duplicate), n as u64, "{report}");
    assert_eq!(inbox_rows(&store).await, n as i64);
    assert_eq!(effects(&store).await, (n as i64, n as i64));
}
