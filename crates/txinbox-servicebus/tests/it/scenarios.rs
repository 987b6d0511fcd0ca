//! The scenario list shared with the SQS adapter.

use std::time::Duration;

use serde_json::json;
use txinbox_core::metrics as m;
use txinbox_core::{Outcome, Worker};
use txinbox_lab::faults::{crash_at, FaultPoint, Faults, FaultyStore};
use txinbox_servicebus::{
    dead_letter_queue_path, read_dead_letters, redrive, RedriveOptions, ServiceBusReceiver,
};

use crate::common::*;

const LOCK: Duration = Duration::from_secs(2);
/// The lock of a test that never waits for one to run out: long enough that no settle, renewal or commit of a
/// loaded machine comes after it (a 2 s lock lapsed when each complete was held back 2.5 s).
const KEPT_LOCK: Duration = Duration::from_secs(5);

/// The inbox lab over the broker: N messages, each delivered K times, give exactly N inbox rows and N effects.
#[tokio::test]
async fn lab_n_messages_delivered_k_times_give_n_rows_and_n_effects() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    let store = pg().await;
    let (n, k) = (12, 3);
    for copy in 0..k {
        publish_meetings(&client, &q, n).await;
        assert_eq!(
            emu.counts(&q).await.0,
            (n * (copy + 1)) as u64,
            "no duplicate detection on this queue"
        );
    }
    let receiver = fast_receiver(&client, &q, KEPT_LOCK);
    let opts = txinbox_core::WorkerOptions::default().concurrency(4);
    let done = until(Duration::from_secs(60), || async {
        emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= n
    });
    let report = Worker::new(receiver, inbox(&store).bind_handler(Effects::default()))
        .options(opts)
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(inbox_rows(&store).await, n);
    assert_eq!(effects(&store).await, (n, n));
    assert_eq!(emu.counts(&q).await, (0, 0));
    assert_eq!(report.count(txinbox_core::OutcomeKind::Applied), n as u64);
    assert_eq!(
        report.count(txinbox_core::OutcomeKind::Duplicate),
        (n * (k - 1)) as u64
    );
    assert_eq!(metrics.counter(m::APPLIED, &[]), n as u64);
    assert_eq!(metrics.counter(m::DUPLICATES, &[]), (n * (k - 1)) as u64);
}

/// Service Bus drops a resend inside its duplicate-detection window; outside it, the inbox recognises it.
#[tokio::test]
async fn broker_dedup_inside_the_window_inbox_dedup_outside() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S", "requiresDuplicateDetection": true, "duplicateDetectionHistoryTimeWindow": 3000})).await;
    let store = pg().await;
    let ev = event(&q, "evt-window", "{\"meeting\":184}");
    publish(&client, &ev).await;
    publish(&client, &ev).await;
    assert_eq!(
        emu.counts(&q).await.0,
        1,
        "the broker dropped the resend inside its window"
    );

    let run = |expect_effects: i64| {
        let receiver = fast_receiver(&client, &q, KEPT_LOCK);
        let opts = txinbox_core::WorkerOptions::default().concurrency(8);
        let store = store.clone();
        let emu = emu.clone();
        let q = q.clone();
        async move {
            let done = until(Duration::from_secs(30), || async {
                emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= expect_effects
            });
            Worker::new(receiver, inbox(&store).bind_handler(Effects::default()))
                .options(opts)
                .run_until(async {
                    done.await;
                })
                .await
        }
    };
    let first = run(1).await;
    assert_eq!(first.count(txinbox_core::OutcomeKind::Applied), 1);

    tokio::time::sleep(Duration::from_millis(3500)).await;
    publish(&client, &ev).await;
    assert_eq!(
        emu.counts(&q).await.0,
        1,
        "outside the window the broker accepts the resend"
    );
    let second = run(1).await;
    assert_eq!(
        second.count(txinbox_core::OutcomeKind::Duplicate),
        1,
        "the inbox absorbs what the broker let through"
    );

    assert_eq!(inbox_rows(&store).await, 1);
    assert_eq!(effects(&store).await, (1, 1));
    assert_eq!(emu.counts(&q).await, (0, 0));
    assert_eq!(metrics.counter(m::DUPLICATES, &[]), 1);
}

/// COMMIT, then the process dies before the complete: the lock lapses, the redelivery is a duplicate.
#[tokio::test]
async fn commit_then_crash_before_complete_is_absorbed() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT2S"})).await;
    let store = pg().await;
    publish(&client, &event(&q, "evt-crash", "{\"meeting\":1}")).await;
    let mut receiver = fast_receiver(&client, &q, LOCK);
    let inbox = inbox(&store);
    let handler = Effects::default();

    let first = receive_next(&mut receiver).await;
    assert_eq!(first.lock_token().map(str::len), Some(36));
    let faults = Faults::new();
    let faulty = txinbox_core::Inbox::new(
        FaultyStore::new(store.clone(), faults.clone()),
        txinbox_core::IdentityPolicy::new(txinbox_core::ConsumerName::new(CONSUMER).unwrap()),
    )
    .bind_handler(handler.clone());
    let crashed = crash_at(&faulty, &faults, first, FaultPoint::AfterCommit).await;
    assert!(crashed.is_err(), "simulated crash after COMMIT");
    assert_eq!(effects(&store).await, (1, 1));
    let state = emu.state(&q).await;
    assert_eq!(
        state["lockedMessageCount"], 1,
        "not completed: still locked"
    );

    let again = receiver
        .receive_one(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("redelivered after the lock");
    assert_eq!(txinbox_core::Delivery::message(&again).delivery_count, 2);
    assert!(matches!(
        inbox.process(again, &handler).await,
        Outcome::Duplicate { .. }
    ));

    assert_eq!(inbox_rows(&store).await, 1);
    assert_eq!(effects(&store).await, (1, 1));
    assert_eq!(handler.calls(), 1);
    assert_eq!(emu.counts(&q).await, (0, 0));
    assert_eq!(metrics.counter(m::DUPLICATES, &[]), 1);
}

/// A handler slower than the lock keeps the message: renewals, no second delivery.
#[tokio::test]
async fn slow_handler_is_kept_locked_by_renewal() {
    let (_recorder, metrics) = Metrics::install();
    // A 5 s lock: a renewal slowed by a loaded machine still has over 3 s before the lock ends.
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    let store = pg().await;
    publish(&client, &event(&q, "evt-slow", "{\"meeting\":2}")).await;
    let handler = Effects::slow(Duration::from_secs(12));
    let receiver = fast_receiver(&client, &q, Duration::from_secs(5));
    let opts = txinbox_core::WorkerOptions::default().concurrency(2);
    let done = until(Duration::from_secs(40), || async {
        emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= 1
    });
    let report = Worker::new(receiver, inbox(&store).bind_handler(handler.clone()))
        .options(opts)
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(report.count(txinbox_core::OutcomeKind::Applied), 1);
    assert_eq!(report.leases_lost, 0);
    assert_eq!(handler.calls(), 1);
    assert_eq!(metrics.counter(m::RECEIVED, &[]), 1, "no second delivery");
    assert!(
        metrics.counter(m::LEASE_RENEWALS, &[]) >= 5,
        "renewed every third of the 5 s lock for 12 s"
    );
    assert_eq!(metrics.counter(m::LEASE_LOST, &[]), 0);
    assert_eq!(inbox_rows(&store).await, 1);
    assert_eq!(effects(&store).await, (1, 1));
    assert_eq!(emu.counts(&q).await, (0, 0));
}

/// A renewal fails (404): the lock is counted lost, the message comes back to another slot while the first
/// handler still runs, and the unique constraint makes the second copy a duplicate.
#[tokio::test]
async fn failed_renewal_is_a_lost_lock_and_the_redelivery_is_absorbed() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT2S"})).await;
    let store = pg().await;
    publish(&client, &event(&q, "evt-renew", "{\"meeting\":3}")).await;
    let handler = Effects::slow(Duration::from_secs(6));
    let receiver = fast_receiver(&client, &q, LOCK);
    let opts = txinbox_core::WorkerOptions::default().concurrency(2);

    let inject = async {
        // Break the next renewal of this lock (the URI is unique: queue, sequence number, lock token).
        let mut locked = serde_json::Value::Null;
        for _ in 0..100 {
            locked = emu.state(&q).await["messages"][0].clone();
            if locked["state"] == "locked" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(locked["state"], "locked", "the worker took the message");
        let suffix = format!(
            "/{q}/messages/{}/{}",
            locked["sequenceNumber"],
            locked["lockToken"].as_str().unwrap()
        );
        emu.fault(json!({"kind": "status", "status": 404, "method": "POST", "path_suffix": suffix, "count": 1}))
            .await;
    };
    let done = until(Duration::from_secs(40), || async {
        emu.counts(&q).await.0 == 0
            && effects(&store).await.0 >= 1
            && metrics.counter(m::DUPLICATES, &[]) >= 1
    });
    let (report, ()) = tokio::join!(
        Worker::new(receiver, inbox(&store).bind_handler(handler.clone()))
            .options(opts)
            .run_until(async {
                done.await;
            }),
        inject
    );
    assert!(report.leases_lost >= 1, "{report:?}");
    assert!(metrics.counter(m::LEASE_LOST, &[]) >= 1);
    assert_eq!(report.count(txinbox_core::OutcomeKind::Applied), 1);
    assert_eq!(
        report.count(txinbox_core::OutcomeKind::Duplicate),
        1,
        "the redelivery was absorbed"
    );
    assert_eq!(
        metrics.counter(m::SETTLE_FAILURES, &[("op", "ack")]),
        1,
        "the first copy's complete found its lock gone"
    );
    assert_eq!(handler.calls(), 1);
    assert_eq!(inbox_rows(&store).await, 1);
    assert_eq!(effects(&store).await, (1, 1));
    assert_eq!(emu.counts(&q).await, (0, 0));
}

/// A poison message (permanent error, abandon strategy) reaches `$DeadLetterQueue` after MaxDeliveryCount;
/// the good message beside it is applied.
#[tokio::test]
async fn poison_reaches_the_dead_letter_queue_after_max_delivery_count() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT2S", "maxDeliveryCount": 3})).await;
    let store = pg().await;
    publish(&client, &event(&q, "evt-poison", "{\"meeting\":4}")).await;
    publish(&client, &event(&q, "evt-good", "{\"meeting\":5}")).await;
    let handler = Effects::default();
    handler.fail("evt-poison", Fail::Permanent);
    let receiver = fast_receiver(&client, &q, LOCK);
    let opts = txinbox_core::WorkerOptions::default().concurrency(8);
    let done = until(Duration::from_secs(40), || async {
        emu.counts(&q).await == (0, 1)
    });
    let report = Worker::new(receiver, inbox(&store).bind_handler(handler.clone()))
        .options(opts)
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(report.count(txinbox_core::OutcomeKind::Applied), 1);
    assert_eq!(
        report.count(txinbox_core::OutcomeKind::DeadLettered),
        3,
        "abandoned on each of the 3 deliveries"
    );
    assert_eq!(
        metrics.counter(m::DEAD_LETTERS, &[("reason", "handler_permanent")]),
        3
    );
    let state = emu.state(&q).await;
    let dead = &state["deadLetterMessages"][0];
    assert_eq!(dead["messageId"], "evt-poison");
    assert_eq!(dead["deadLetterReason"], "MaxDeliveryCountExceeded");
    assert_eq!(dead["properties"]["ce-id"], "evt-poison");

    let read = read_dead_letters(
        &client,
        &dead_letter_queue_path(&q),
        10,
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].reason.as_deref(), Some("MaxDeliveryCountExceeded"));
    assert_eq!(read[0].message.producer_id.as_deref(), Some("evt-poison"));
    assert_eq!(read[0].message.attribute("ce-source"), Some("crm/meetings"));
    assert_eq!(emu.counts(&q).await, (0, 1), "reading does not remove");

    assert_eq!(inbox_rows(&store).await, 1);
    assert_eq!(effects(&store).await, (1, 1));
}

/// A payload collision and a permanent error are forwarded to the configured dead-letter queue with identity,
/// reason and evidence, then completed.
#[tokio::test]
async fn payload_collision_and_permanent_error_are_forwarded_with_evidence() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT2S"})).await;
    let poison = emu.queue(json!({})).await;
    let store = pg().await;
    let handler = Effects::default();
    handler.fail("evt-broken", Fail::Permanent);
    let run = |expect_poison: u64| {
        let receiver =
            ServiceBusReceiver::new(&client, &q, fast_options(LOCK).dead_letter_to(&poison))
                .unwrap();
        let opts = txinbox_core::WorkerOptions::default().concurrency(8);
        let (store, emu, q, poison, handler) = (
            store.clone(),
            emu.clone(),
            q.clone(),
            poison.clone(),
            handler.clone(),
        );
        async move {
            let done = until(Duration::from_secs(30), || async {
                emu.counts(&q).await.0 == 0 && emu.counts(&poison).await.0 >= expect_poison
            });
            Worker::new(receiver, inbox(&store).bind_handler(handler))
                .options(opts)
                .run_until(async {
                    done.await;
                })
                .await
        }
    };
    publish(
        &client,
        &event(&q, "evt-collide", "{\"meeting\":6,\"note\":\"first\"}"),
    )
    .await;
    assert_eq!(run(0).await.count(txinbox_core::OutcomeKind::Applied), 1);

    publish(
        &client,
        &event(&q, "evt-collide", "{\"meeting\":6,\"note\":\"second\"}"),
    )
    .await;
    publish(&client, &event(&q, "evt-broken", "{\"meeting\":7}")).await;
    let report = run(2).await;
    assert_eq!(report.count(txinbox_core::OutcomeKind::PayloadCollision), 1);
    assert_eq!(report.count(txinbox_core::OutcomeKind::DeadLettered), 1);

    let state = emu.state(&poison).await;
    let msgs = state["messages"].as_array().unwrap();
    let find = |id: &str| {
        msgs.iter()
            .find(|m| m["messageId"] == id)
            .unwrap_or_else(|| panic!("{id} in {state}"))
    };
    let collided = find("evt-collide");
    assert_eq!(collided["body"], "{\"meeting\":6,\"note\":\"second\"}");
    let p = &collided["properties"];
    assert_eq!(p["txinbox-dlq-reason"], "payload_collision");
    assert!(
        p["txinbox-dlq-detail"]
            .as_str()
            .unwrap()
            .contains("payload hash"),
        "{p}"
    );
    assert_eq!(p["txinbox-dlq-source"], q.as_str());
    assert_eq!(p["ce-id"], "evt-collide");
    assert_eq!(p["ce-source"], "crm/meetings");
    assert!(p["txinbox-dlq-enqueued-at"].is_string());
    assert_eq!(collided["contentType"], "application/json");
    let broken = find("evt-broken");
    assert_eq!(
        broken["properties"]["txinbox-dlq-reason"],
        "handler_permanent"
    );
    assert_eq!(broken["properties"]["txinbox-dlq-delivery-count"], 1);

    let rejections: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM txinbox_rejections WHERE kind = 'payload_collision'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(rejections, 1, "the evidence is kept in the store too");
    assert_eq!(inbox_rows(&store).await, 1);
    assert_eq!(effects(&store).await, (1, 1));
    let body: String = sqlx::query_scalar("SELECT body FROM effects")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(body.contains("first"));
    assert_eq!(emu.counts(&q).await, (0, 0));
    assert_eq!(metrics.counter(m::PAYLOAD_COLLISIONS, &[]), 1);
    assert_eq!(
        metrics.counter(
            txinbox_servicebus::metrics::DLQ_FORWARDS,
            &[("reason", "payload_collision")]
        ),
        1
    );
    assert_eq!(
        metrics.counter(
            txinbox_servicebus::metrics::DLQ_FORWARDS,
            &[("reason", "handler_permanent")]
        ),
        1
    );
}

/// Redrive after some dead letters had already been applied (committed, never completed): the redriven
/// copies of those are duplicates, the others are applied; MessageIds intact; duplicate-detection window held.
#[tokio::test]
async fn redrive_after_some_were_applied() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT2S", "maxDeliveryCount": 1})).await;
    let store = pg().await;
    let ids = ["evt-a", "evt-b", "evt-c", "evt-d"];
    for id in ids {
        publish(&client, &event(&q, id, &format!("{{\"id\":\"{id}\"}}"))).await;
    }
    let inbox = inbox(&store);
    let handler = Effects::default();
    handler.fail("evt-c", Fail::Retryable);
    handler.fail("evt-d", Fail::Retryable);
    let mut receiver = fast_receiver(&client, &q, LOCK);
    for _ in ids {
        let d = receive_next(&mut receiver).await;
        let id = txinbox_core::Delivery::message(&d)
            .producer_id
            .clone()
            .unwrap();
        if id == "evt-a" || id == "evt-b" {
            // Applied, then the process dies before the complete.
            let faults = Faults::new();
            let faulty = txinbox_core::Inbox::new(
                FaultyStore::new(store.clone(), faults.clone()),
                txinbox_core::IdentityPolicy::new(
                    txinbox_core::ConsumerName::new(CONSUMER).unwrap(),
                ),
            )
            .bind_handler(handler.clone());
            let r = crash_at(&faulty, &faults, d, FaultPoint::AfterCommit).await;
            assert!(r.is_err());
        } else {
            assert!(matches!(
                inbox.process(d, &handler).await,
                Outcome::Retry { .. }
            ));
        }
    }
    assert!(
        until(Duration::from_secs(15), || async {
            emu.counts(&q).await == (0, 4)
        })
        .await,
        "all four dead-lettered after MaxDeliveryCount 1: {}",
        emu.state(&q).await
    );
    assert_eq!(effects(&store).await, (2, 2));
    handler.heal();

    let dlq = dead_letter_queue_path(&q);
    let mut progress = String::new();
    let mut out = |e: txinbox_core::RedriveEvent<'_>, _: &txinbox_core::RedriveReport| {
        progress.push_str(&format!("{e:?}\n"));
    };
    let held = redrive(
        &client,
        &dlq,
        &q,
        &RedriveOptions::default().wait(Duration::from_secs(1)),
        &mut out,
    )
    .await
    .unwrap();
    assert_eq!(
        (held.moved, held.deferred),
        (0, 4),
        "inside the 10-minute window nothing moves"
    );
    assert_eq!(emu.counts(&q).await, (0, 4));

    let no_window = RedriveOptions::default()
        .wait(Duration::from_secs(1))
        .duplicate_detection_window(Duration::ZERO);
    let one = redrive(&client, &dlq, &q, &no_window.clone().max(Some(1)), &mut out)
        .await
        .unwrap();
    assert_eq!(one.moved, 1);
    let rest = redrive(&client, &dlq, &q, &no_window, &mut out)
        .await
        .unwrap();
    assert_eq!(rest.moved, 3);
    let mut moved: Vec<String> = one.moved_ids.into_iter().chain(rest.moved_ids).collect();
    moved.sort();
    assert_eq!(moved, ids, "MessageIds intact");
    assert_eq!(emu.counts(&q).await, (4, 0));
    let redriven = emu.state(&q).await;
    for m in redriven["messages"].as_array().unwrap() {
        assert_eq!(m["properties"]["ce-id"], m["messageId"]);
        assert!(m["properties"].get("DeadLetterReason").is_none(), "{m}");
        assert!(m["properties"]["txinbox-redriven-from"].is_string());
    }
    assert!(progress.contains("Moved("), "{progress}");
    assert!(
        !progress.contains(&emu.key),
        "no key in the progress output"
    );
    assert_eq!(
        metrics.counter(m::REDRIVE_MOVED, &[("queue", q.as_str())]),
        4
    );

    let receiver = fast_receiver(&client, &q, LOCK);
    let opts = txinbox_core::WorkerOptions::default().concurrency(8);
    let done = until(Duration::from_secs(30), || async {
        emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= 4
    });
    let report = Worker::new(receiver, inbox.bind_handler(handler))
        .options(opts)
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(
        report.count(txinbox_core::OutcomeKind::Duplicate),
        2,
        "evt-a and evt-b were applied before"
    );
    assert_eq!(report.count(txinbox_core::OutcomeKind::Applied), 2);
    assert_eq!(
        metrics.counter(m::REDRIVEN, &[("consumer", CONSUMER)]),
        4,
        "the inbox counts the redriven deliveries under its consumer"
    );
    assert_eq!(inbox_rows(&store).await, 4);
    assert_eq!(effects(&store).await, (4, 4));
    assert_eq!(emu.counts(&q).await, (0, 0));
}

/// A dead letter whose body is not UTF-8 (another producer's binary message) cannot be received through the
/// REST crate, which reads bodies as text: the redrive stops on it with a `Protocol` error, and the message
/// stays locked for its lock duration, so a run started within it moves the messages behind it.
#[tokio::test]
async fn redrive_stops_on_a_body_that_is_not_text_and_a_second_run_moves_the_others() {
    let (emu, client, from) = emu_queue(json!({"lockDuration": "PT60S"})).await;
    let to = emu.queue(json!({})).await;
    // The binary message first, so that the redrive meets it before the text one.
    let sent = reqwest::Client::new()
        .post(format!("{}/{from}/messages", emu.url))
        .bearer_auth(&emu.bearer)
        .header("Content-Type", "application/octet-stream")
        .header("BrokerProperties", r#"{"MessageId":"evt-binary"}"#)
        .body(vec![0xff_u8, 0xfe, 0x00, 0x80])
        .send()
        .await
        .unwrap();
    assert!(sent.status().is_success(), "{}", sent.status());
    publish(&client, &event(&from, "evt-text", r#"{"id":"evt-text"}"#)).await;
    let opts = RedriveOptions::default()
        .wait(Duration::from_secs(1))
        .duplicate_detection_window(Duration::ZERO);
    let err = redrive(&client, &from, &to, &opts, &mut ())
        .await
        .expect_err("the binary body cannot be read");
    assert_eq!(err.kind(), txinbox_core::BrokerErrorKind::Protocol, "{err}");
    assert_eq!(emu.counts(&to).await, (0, 0), "nothing moved");
    let second = redrive(&client, &from, &to, &opts, &mut ())
        .await
        .expect("the binary message is still locked: the second run moves the one behind it");
    assert_eq!(second.moved_ids, ["evt-text"]);
    assert_eq!(emu.counts(&to).await, (1, 0));
    let left = emu.state(&from).await;
    assert_eq!(left["messages"][0]["messageId"], "evt-binary", "{left}");
    assert_eq!(left["activeMessageCount"], 1, "{left}");
}

/// Two worker instances on one queue, every message sent twice: exactly one effect per message.
#[tokio::test]
async fn two_workers_with_duplicates_make_one_effect_per_message() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    let store = pg().await;
    let n = 10;
    publish_each_twice(&client, &q, n).await;
    let worker = || {
        let receiver = fast_receiver(&client, &q, KEPT_LOCK);
        let opts = txinbox_core::WorkerOptions::default().concurrency(3);
        let (emu, q, store) = (emu.clone(), q.clone(), store.clone());
        async move {
            let done = until(Duration::from_secs(60), || async {
                emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= n
            });
            Worker::new(receiver, inbox(&store).bind_handler(Effects::default()))
                .options(opts)
                .run_until(async {
                    done.await;
                })
                .await
        }
    };
    let (a, b) = tokio::join!(worker(), worker());
    assert_eq!(
        a.count(txinbox_core::OutcomeKind::Applied) + b.count(txinbox_core::OutcomeKind::Applied),
        n as u64
    );
    assert_eq!(
        a.count(txinbox_core::OutcomeKind::Duplicate)
            + b.count(txinbox_core::OutcomeKind::Duplicate),
        n as u64
    );
    assert_eq!(inbox_rows(&store).await, n);
    assert_eq!(effects(&store).await, (n, n));
    assert_eq!(emu.counts(&q).await, (0, 0));
    assert_eq!(metrics.counter(m::APPLIED, &[]), n as u64);
}

/// Shutdown while handlers run: the uncommitted ones roll back and are abandoned; a restart finishes the
/// job. Nothing lost, nothing doubled.
#[tokio::test]
async fn shutdown_mid_flight_loses_nothing_and_duplicates_nothing() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT2S"})).await;
    let store = pg().await;
    let n = 6;
    publish_events(&client, &q, n).await;
    let slow = Effects::slow(Duration::from_millis(1500));
    let receiver = fast_receiver(&client, &q, LOCK);
    let opts = txinbox_core::WorkerOptions::default()
        .concurrency(3)
        .shutdown_timeout(Duration::from_millis(300));
    let in_flight = until(Duration::from_secs(20), || async { slow.calls() >= 3 });
    let first = Worker::new(receiver, inbox(&store).bind_handler(slow.clone()))
        .options(opts)
        .run_until(async {
            in_flight.await;
        })
        .await;
    assert!(
        first.count(txinbox_core::OutcomeKind::Interrupted) >= 1,
        "{first:?}"
    );
    assert!(metrics.counter(m::INTERRUPTED, &[]) >= 1);
    let after_first = effects(&store).await.0;
    assert_eq!(
        inbox_rows(&store).await,
        after_first,
        "no marker without its effect"
    );

    let receiver = fast_receiver(&client, &q, LOCK);
    let opts = txinbox_core::WorkerOptions::default().concurrency(3);
    let done = until(Duration::from_secs(40), || async {
        emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= n
    });
    let _report = Worker::new(receiver, inbox(&store).bind_handler(Effects::default()))
        .options(opts)
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(inbox_rows(&store).await, n);
    assert_eq!(effects(&store).await, (n, n));
    assert_eq!(emu.counts(&q).await, (0, 0));
}
