//! The SQS adapter in batch mode (`WorkerOptions::batch_commit`) against moto and PostgreSQL: the messages of
//! one `ReceiveMessage` applied in one transaction, deleted after its COMMIT.
//!
//! ```sh
//! eval "$(bash scripts/moto.sh start)"
//! TXINBOX_TEST_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p txinbox-sqs --test batch
//! ```

mod common;

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::json;
use txinbox_core::{CancellationToken, OutcomeKind, Receiver, Worker, WorkerOptions};
use txinbox_sqs::SqsReceiver;
use txinbox_testkit::NeverSettled;

const LONG: Duration = Duration::from_secs(60);

async fn receive_n(r: &mut SqsReceiver, n: usize) -> Vec<txinbox_sqs::SqsDelivery> {
    let deadline = tokio::time::Instant::now() + LONG;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n}",
            got.len()
        );
        got.extend(r.receive(n - got.len()).await.unwrap());
    }
    got
}

/// Copies, a payload collision, a business duplicate and a poison message among good ones, through a worker
/// with batch commit: each decided as alone, one effect per applied message, the collision and the poison in
/// the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_in_batch_mode_decides_each_message_as_alone() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let store = pg_store().await;
    let consumer = unique("batch");
    // (opportunity, extra body, ce-id, dedup id, group):
    // group g0: evt-0, a copy (new dedup id), then another payload under evt-0: applied, duplicate, collision;
    // group g1: evt-1, then evt-1b asking for the same follow-up: applied, business duplicate.
    let changed = json!({"note": "changed"});
    for (opp, extra, id, dedup, group) in [
        ("o0", json!({}), "evt-0", "d-0", "g0"),
        ("o0", json!({}), "evt-0", "d-0-copy", "g0"),
        ("o0", changed, "evt-0", "d-0-other", "g0"),
        ("o1", json!({}), "evt-1", "d-1", "g1"),
        ("o1", json!({}), "evt-1b", "d-1b", "g1"),
    ] {
        send(&c, &q.url, &body(opp, "m", extra), Some(id), dedup, group).await;
    }
    // A poison message and good ones in groups of their own.
    send(
        &c,
        &q.url,
        &body("o9", "m", json!({"fail": "permanent"})),
        Some("evt-9"),
        "d-9",
        "g9",
    )
    .await;
    send_one_per_group(&c, &q.url, 2..8, "d-").await;
    let receiver = fast_receiver(c.clone(), &q, 30).await;
    let processor =
        pg_inbox(&store, &consumer).bind_handler(pg_handler(Arc::new(AtomicI64::new(0))));
    let (c2, url, dlq) = (c.clone(), q.url.clone(), q.dlq.clone());
    let report = Worker::new(receiver, processor)
        .options(WorkerOptions::default().concurrency(16).batch_commit(10))
        .run_until(async move {
            wait_until(LONG, "all settled, two in the DLQ", || async {
                counts(&c2, &url).await == (0, 0) && counts(&c2, &dlq).await.0 == 2
            })
            .await;
        })
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 8, "{report}");
    assert_eq!(report.count(OutcomeKind::Duplicate), 1, "{report}");
    assert_eq!(report.count(OutcomeKind::PayloadCollision), 1, "{report}");
    assert_eq!(report.count(OutcomeKind::BusinessDuplicate), 1, "{report}");
    assert_eq!(report.count(OutcomeKind::DeadLettered), 1, "{report}");
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (8, 8)
    );
    let reasons: Vec<String> = drain(&c, &q.dlq)
        .await
        .into_iter()
        .filter_map(|m| {
            m.message_attributes?
                .get("txinbox-dlq-reason")?
                .string_value
                .clone()
        })
        .collect();
    let mut reasons = reasons;
    reasons.sort();
    assert_eq!(reasons, ["handler_permanent", "payload_collision"]);
}

/// A crash after a batch's COMMIT and before its deletes: after the visibility timeout every message of the
/// batch comes back and is a duplicate; one effect each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_then_crash_before_the_deletes_of_a_batch_is_absorbed() {
    let c = client().await;
    let q = queue_pair(&c, 5, 2).await;
    let store = pg_store().await;
    let consumer = unique("crash");
    let n = 8;
    send_one_per_group(&c, &q.url, 0..n, "d-").await;
    let mut r = fast_receiver(c.clone(), &q, 2).await;
    let batch: Vec<_> = receive_n(&mut r, n)
        .await
        .into_iter()
        .map(NeverSettled)
        .collect();
    let o = pg_inbox(&store, &consumer)
        .bind_handler(pg_handler(Arc::new(AtomicI64::new(0))))
        .process_batch(batch, &CancellationToken::new())
        .await;
    assert!(o.iter().all(|x| x.label() == "applied"), "{o:?}");
    assert_eq!(pg_effects(&store).await, n as i64);
    let (c2, url) = (c.clone(), q.url.clone());
    let report = Worker::new(
        r,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(Arc::new(AtomicI64::new(0)))),
    )
    .options(WorkerOptions::default().batch_commit(10))
    .run_until(async move {
        wait_until(LONG, "redelivered and deleted", || async {
            counts(&c2, &url).await == (0, 0)
        })
        .await;
    })
    .await;
    assert_eq!(report.count(OutcomeKind::Duplicate), n as u64, "{report}");
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (n as i64, n as i64)
    );
}

/// One FIFO group in batch mode: applied in the group's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifo_group_order_is_kept_in_batch_mode() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let store = pg_store().await;
    let consumer = unique("order");
    for i in 1..=8 {
        send(
            &c,
            &q.url,
            &body(&format!("o{i}"), "m", json!({"sleep_ms": (9 - i) * 20})),
            Some(&format!("evt-{i}")),
            &format!("d-{i}"),
            "one-group",
        )
        .await;
    }
    let receiver = fast_receiver(c.clone(), &q, 30).await;
    let (c2, url) = (c.clone(), q.url.clone());
    let report = Worker::new(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(Arc::new(AtomicI64::new(0)))),
    )
    .options(WorkerOptions::default().batch_commit(10))
    .run_until(async move {
        wait_until(LONG, "all applied", || async {
            counts(&c2, &url).await == (0, 0)
        })
        .await;
    })
    .await;
    assert_eq!(report.count(OutcomeKind::Applied), 8, "{report}");
    let order: Vec<String> =
        sqlx::query_scalar("SELECT opportunity FROM followup_tasks ORDER BY position")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let expected: Vec<String> = (1..=8).map(|i| format!("o{i}")).collect();
    assert_eq!(order, expected);
}
