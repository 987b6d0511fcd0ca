//! Scenarios against moto (SQS) and PostgreSQL / SQLite. Each test makes a fresh FIFO queue pair and a fresh
//! schema, and asserts inbox rows, business effects, queue and DLQ contents, and metrics where relevant.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::sync::oneshot;
use txinbox_core::{metrics as m, Delivery, Outcome, Receiver, Worker, WorkerReport};
use txinbox_lab::faults::{crash_at, FaultPoint, Faults};
use txinbox_sqs::{SqsOptions, SqsReceiver};

const LONG: Duration = Duration::from_secs(60);

/// Runs a worker in the background; `stop()` shuts it down and returns its report.
struct Running {
    stop: oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<WorkerReport>,
}

impl Running {
    fn start<P>(receiver: SqsReceiver, processor: P, opts: txinbox_core::WorkerOptions) -> Self
    where
        P: txinbox_core::Processor<txinbox_core::LeasedDelivery<txinbox_sqs::SqsDelivery>>,
    {
        let (stop, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(Worker::new(receiver, processor).options(opts).run_until(
            async move {
                let _ = rx.await;
            },
        ));
        Self { stop, handle }
    }

    async fn stop(self) -> WorkerReport {
        let _ = self.stop.send(());
        self.handle.await.expect("worker task")
    }
}

/// Receives until `n` deliveries arrived; panics after `timeout`.
async fn receive_until(
    r: &mut SqsReceiver,
    n: usize,
    timeout: Duration,
) -> Vec<txinbox_sqs::SqsDelivery> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out: {} of {n} deliveries",
            got.len()
        );
        got.extend(r.receive(10).await.unwrap());
    }
    got
}

/// Sends message `i` of `range` to `url`, all in the group `one-group`: the follow-up of opportunity `o{i}`,
/// `ce-id` `evt-{i}`, deduplication id `d-{i}`.
async fn send_in_one_group(c: &aws_sdk_sqs::Client, url: &str, range: std::ops::Range<usize>) {
    for i in range {
        send(
            c,
            url,
            &body(&format!("o{i}"), "m", json!({})),
            Some(&format!("evt-{i}")),
            &format!("d-{i}"),
            "one-group",
        )
        .await;
    }
}

async fn queue_empty(c: &aws_sdk_sqs::Client, url: &str) -> bool {
    counts(c, url).await == (0, 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inbox_lab_over_sqs_two_identities_delivered_twice() {
    // The inbox lab: SQLite, four deliveries, two identities each sent twice (new dedup id each time so the
    // broker delivers both copies; the inbox recognises the second by its CloudEvents id).
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let store = sqlite_store().await;
    let consumer = unique("lab");
    for (id, opp, meeting) in [
        ("evt-1", "oportunidade_2481", "reuniao_184"),
        ("evt-2", "oportunidade_2482", "reuniao_185"),
    ] {
        for copy in 0..2 {
            send(
                &c,
                &q.url,
                &body(opp, meeting, json!({})),
                Some(id),
                &format!("{id}-copy{copy}"),
                opp,
            )
            .await;
        }
    }
    let receiver = fast_receiver(c.clone(), &q, 30).await;
    let inbox = txinbox_core::Inbox::new(store.clone(), policy(&consumer));
    let opts = txinbox_core::WorkerOptions::default();
    let w = Running::start(
        receiver,
        inbox.bind_handler(sqlite_handler(Arc::new(AtomicI64::new(0)))),
        opts,
    );
    let pool = store.pool().clone();
    wait_until(LONG, "4 deliveries settled", || async {
        queue_empty(&c, &q.url).await
            && sqlx::query_scalar::<_, i64>("SELECT count(*) FROM followup_tasks")
                .fetch_one(&pool)
                .await
                .unwrap()
                == 2
    })
    .await;
    let report = w.stop().await;
    assert_eq!(
        (
            report.total(),
            report.count(txinbox_core::OutcomeKind::Applied),
            report.count(txinbox_core::OutcomeKind::Duplicate)
        ),
        (4, 2, 2),
        "{report:?}"
    );
    let rows = store.inbox_rows(&consumer).await.unwrap();
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM followup_tasks")
        .fetch_one(store.pool())
        .await
        .unwrap();
    println!(
        "deliveries={} accepted={} duplicates={} inbox_rows={rows} business_effects={effects}",
        report.total(),
        report.count(txinbox_core::OutcomeKind::Applied),
        report.count(txinbox_core::OutcomeKind::Duplicate)
    );
    assert_eq!((rows, effects), (2, 2));
    assert_eq!(counts(&c, &q.dlq).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifo_window_drops_the_resend_and_the_inbox_drops_a_new_dedup_id() {
    metrics_init();
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let store = pg_store().await;
    let consumer = unique("window");
    let b = body("o1", "m1", json!({}));
    // Same dedup id twice inside the 5-minute window: SQS keeps one.
    send(&c, &q.url, &b, Some("evt-w"), "dedup-1", "g1").await;
    send(&c, &q.url, &b, Some("evt-w"), "dedup-1", "g1").await;
    assert_eq!(
        counts(&c, &q.url).await,
        (1, 0),
        "the broker drops the resend"
    );
    // Same CloudEvents id, new dedup id: SQS delivers it, the inbox drops it.
    send(&c, &q.url, &b, Some("evt-w"), "dedup-2", "g1").await;
    assert_eq!(counts(&c, &q.url).await.0, 2);

    let receiver = fast_receiver(c.clone(), &q, 30).await;
    let opts = txinbox_core::WorkerOptions::default();
    let w = Running::start(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(Arc::new(AtomicI64::new(0)))),
        opts,
    );
    wait_until(LONG, "both copies settled", || async {
        queue_empty(&c, &q.url).await
    })
    .await;
    let report = w.stop().await;
    assert_eq!(
        (
            report.count(txinbox_core::OutcomeKind::Applied),
            report.count(txinbox_core::OutcomeKind::Duplicate)
        ),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (1, 1)
    );
    assert_eq!(counter(m::DUPLICATES, &[("consumer", &consumer)]), 1);
    assert_eq!(counts(&c, &q.dlq).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_then_crash_before_delete_is_absorbed_on_redelivery() {
    metrics_init();
    let c = client().await;
    let q = queue_pair(&c, 5, 2).await;
    let store = pg_store().await;
    let consumer = unique("crash");
    send(
        &c,
        &q.url,
        &body("o1", "m1", json!({})),
        Some("evt-c"),
        "d-c",
        "g",
    )
    .await;
    let mut receiver = fast_receiver(c.clone(), &q, 2).await;
    let inbox = pg_inbox(&store, &consumer);
    let handler = pg_handler(Arc::new(AtomicI64::new(0)));
    let first = receiver
        .receive(10)
        .await
        .unwrap()
        .pop()
        .expect("a delivery");
    assert_eq!(first.message().delivery_count, 1);
    let faults = Faults::new();
    let faulty = faulty_pg_inbox(&store, &consumer, &faults)
        .bind_handler(pg_handler(Arc::new(AtomicI64::new(0))));
    let crashed = crash_at(&faulty, &faults, first, FaultPoint::AfterCommit).await;
    assert!(crashed.is_err(), "the fault point fires after COMMIT");
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (1, 1),
        "committed"
    );
    assert_eq!(
        counts(&c, &q.url).await,
        (0, 1),
        "the settle was lost: still in flight"
    );

    // The visibility timeout (2 s) runs out and SQS redelivers.
    let mut again = receive_until(&mut receiver, 1, Duration::from_secs(20)).await;
    let second = again.pop().unwrap();
    assert_eq!(second.message().delivery_count, 2);
    assert!(matches!(
        inbox.process(second, &handler).await,
        Outcome::Duplicate { .. }
    ));
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (1, 1)
    );
    wait_until(Duration::from_secs(10), "queue empty", || async {
        queue_empty(&c, &q.url).await
    })
    .await;
    assert_eq!(counts(&c, &q.dlq).await, (0, 0));
    assert_eq!(counter(m::DUPLICATES, &[("consumer", &consumer)]), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeat_keeps_a_slow_handler_invisible_with_no_second_delivery() {
    metrics_init();
    let c = client().await;
    let q = queue_pair(&c, 5, 5).await;
    let store = pg_store().await;
    let consumer = unique("slow");
    // The handler takes 12 s; the visibility timeout is 5 s; the heartbeat renews every ~1.7 s, and a renewal
    // slowed by a loaded machine still has over 3 s before the message would show again.
    send(
        &c,
        &q.url,
        &body("o1", "m1", json!({"sleep_ms": 12000})),
        Some("evt-s"),
        "d-s",
        "g",
    )
    .await;
    let receiver = fast_receiver(c.clone(), &q, 3).await;
    let opts = txinbox_core::WorkerOptions::default();
    let calls = Arc::new(AtomicI64::new(0));
    let w = Running::start(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(calls.clone())),
        opts,
    );
    wait_until(LONG, "the slow message applied", || async {
        pg_effects(&store).await == 1 && queue_empty(&c, &q.url).await
    })
    .await;
    // Give a (wrong) second delivery time to show up before asserting it never did.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let report = w.stop().await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the handler ran once: no second delivery"
    );
    assert_eq!(
        (
            report.total(),
            report.count(txinbox_core::OutcomeKind::Applied),
            report.leases_lost
        ),
        (1, 1, 0),
        "{report:?}"
    );
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (1, 1)
    );
    assert!(
        counter(m::LEASE_RENEWALS, &[("consumer", &consumer)]) >= 3,
        "renewed while the handler ran"
    );
    assert_eq!(counter(m::LEASE_LOST, &[("consumer", &consumer)]), 0);
    assert_eq!(counts(&c, &q.dlq).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeat_stopped_message_reappears_and_the_inbox_absorbs_it() {
    metrics_init();
    let c = client().await;
    let q = queue_pair(&c, 10, 2).await;
    let store = pg_store().await;
    let consumer = unique("stopped");
    // Heartbeat every ~0.66 s but for at most 1 s in total: it stops, the 2 s visibility runs out while the
    // 7 s handler still runs, and a second copy is handed to the same worker (concurrency 8).
    send(
        &c,
        &q.url,
        &body("o1", "m1", json!({"sleep_ms": 7000})),
        Some("evt-h"),
        "d-h",
        "g",
    )
    .await;
    let opts = fast_options(2, &q.dlq);
    let receiver = SqsReceiver::connect(c.clone(), &q.url, opts).await.unwrap();
    let wopts = txinbox_core::WorkerOptions::default()
        .lease(txinbox_core::LeaseOptions::default().max_total(Duration::from_secs(1)));
    let calls = Arc::new(AtomicI64::new(0));
    let w = Running::start(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(calls.clone())),
        wopts,
    );
    wait_until(Duration::from_secs(90), "every copy settled", || async {
        pg_effects(&store).await == 1 && queue_empty(&c, &q.url).await
    })
    .await;
    let report = w.stop().await;
    // Copies reappear every 2 s while the first runs; each blocks on the first's marker insert and then ends
    // as a duplicate, without calling the handler.
    assert_eq!(
        report.count(txinbox_core::OutcomeKind::Applied),
        1,
        "{report:?}"
    );
    let dups = report.count(txinbox_core::OutcomeKind::Duplicate);
    assert!(dups >= 1, "at least one redelivery absorbed: {report:?}");
    assert_eq!(report.total(), 1 + dups, "{report:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the business handler ran once"
    );
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (1, 1)
    );
    assert_eq!(counter(m::DUPLICATES, &[("consumer", &consumer)]), dups);
    assert_eq!(
        counter(m::LEASE_RENEWALS, &[("consumer", &consumer)]),
        0,
        "the heartbeat had stopped"
    );
    assert_eq!(counts(&c, &q.dlq).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_extension_is_counted_as_a_lost_lease() {
    metrics_init();
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let consumer = unique("lost");
    send(
        &c,
        &q.url,
        &body("o1", "m1", json!({})),
        Some("evt-l"),
        "d-l",
        "g",
    )
    .await;
    let mut receiver = fast_receiver(c.clone(), &q, 30).await;
    let d = receiver
        .receive(1)
        .await
        .unwrap()
        .pop()
        .expect("a delivery");
    let lease = d.lease().expect("SQS deliveries have a lease");
    let before = lease.expires_at().unwrap();
    let renewed = lease
        .renew(Duration::from_secs(40))
        .await
        .expect("renewal while held");
    assert!(renewed > before);
    // Someone else deletes the message (an operator, a purge): the receipt is no longer valid.
    c.delete_message()
        .queue_url(&q.url)
        .receipt_handle(d.receipt_handle())
        .send()
        .await
        .unwrap();
    let err = lease
        .renew(Duration::from_secs(40))
        .await
        .expect_err("renewing a deleted message fails");
    assert_eq!(
        err.kind(),
        txinbox_core::BrokerErrorKind::LockLost,
        "{err:?}"
    );
    // The keeper renews every third of the 30 s visibility timeout.
    let guard = txinbox_core::runtime::lease::keep_alive(
        lease,
        txinbox_core::LeaseOptions::default(),
        consumer.clone(),
    );
    wait_until(Duration::from_secs(20), "the keeper to notice", || async {
        guard.lost()
    })
    .await;
    assert_eq!(counter(m::LEASE_LOST, &[("consumer", &consumer)]), 1);
    assert_eq!(counts(&c, &q.url).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_reaches_the_dlq_after_max_receive_count() {
    let c = client().await;
    let q = queue_pair(&c, 2, 2).await;
    let store = pg_store().await;
    let consumer = unique("poison");
    send(
        &c,
        &q.url,
        &body("o1", "m1", json!({"fail": "retry"})),
        Some("evt-p"),
        "d-p",
        "g",
    )
    .await;
    let receiver = fast_receiver(c.clone(), &q, 2).await;
    let opts = txinbox_core::WorkerOptions::default();
    let calls = Arc::new(AtomicI64::new(0));
    let w = Running::start(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(calls.clone())),
        opts,
    );
    wait_until(LONG, "the poison message in the DLQ", || async {
        counts(&c, &q.dlq).await.0 == 1
    })
    .await;
    let report = w.stop().await;
    assert!(
        report.count(txinbox_core::OutcomeKind::Retry) >= 2,
        "{report:?}"
    );
    assert_eq!(report.count(txinbox_core::OutcomeKind::Applied), 0);
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (0, 0),
        "rolled back each time"
    );
    assert_eq!(counts(&c, &q.url).await, (0, 0));
    let dead = drain(&c, &q.dlq).await;
    assert_eq!(dead.len(), 1);
    let a = dead[0].message_attributes().unwrap();
    assert_eq!(a["ce-id"].string_value(), Some("evt-p"), "identity kept");
    assert_eq!(a["ce-source"].string_value(), Some("crm/meetings"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redrive_after_some_were_applied_keeps_identity() {
    let c = client().await;
    // maxReceiveCount 1: a message seen once and not deleted moves to the DLQ on its next receive.
    let q = queue_pair(&c, 1, 2).await;
    let store = pg_store().await;
    let consumer = unique("redrive");
    for i in 1..=4 {
        send(
            &c,
            &q.url,
            &body(&format!("o{i}"), "m", json!({})),
            Some(&format!("evt-r{i}")),
            &format!("d-r{i}"),
            &format!("g{i}"),
        )
        .await;
    }
    // A fifth message whose identity is its dedup id (no CloudEvents attributes; the consumer opted in), which
    // the handler refuses: the consumer forwards it to the DLQ itself, with its deduplication id. (Moved there
    // by the broker instead, it would lose that id on AWS, which replaces a FIFO dead letter's deduplication id
    // with its message id, while moto keeps it: `dlq_identity.rs` covers that path.)
    send(
        &c,
        &q.url,
        &body("o5", "m", json!({"fail": "permanent"})),
        None,
        "d-r5",
        "g5",
    )
    .await;
    let opts = fast_options(2, &q.dlq).deduplication_id_identity(true);
    let mut receiver = SqsReceiver::connect(c.clone(), &q.url, opts).await.unwrap();
    let inbox = pg_inbox(&store, &consumer);
    let got = receive_until(&mut receiver, 5, Duration::from_secs(20)).await;
    // Two commit and crash before the delete; two crash before the transaction; the fifth is dead-lettered.
    let faults = Faults::new();
    let faulty = faulty_pg_inbox(&store, &consumer, &faults)
        .bind_handler(pg_handler(Arc::new(AtomicI64::new(0))));
    for d in got {
        if d.message().attribute("ce-id").is_none() {
            let handler = pg_handler(Arc::new(AtomicI64::new(0)));
            match inbox.process(d, &handler).await {
                Outcome::DeadLettered { reason, .. } => assert_eq!(reason, "handler_permanent"),
                other => panic!("expected the fifth dead-lettered, got {other:?}"),
            }
            continue;
        }
        let applied = ["evt-r1", "evt-r2"].contains(&d.message().attribute("ce-id").unwrap_or(""));
        let at = if applied {
            FaultPoint::AfterCommit
        } else {
            FaultPoint::BeforeTransaction
        };
        assert!(crash_at(&faulty, &faults, d, at).await.is_err());
    }
    assert_eq!(pg_effects(&store).await, 2);
    // After the visibility timeout the next receive moves the other four to the DLQ, where the fifth is.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while counts(&c, &q.dlq).await.0 < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for all five in the DLQ"
        );
        assert!(
            receiver.receive(10).await.unwrap().is_empty(),
            "maxReceiveCount 1: nothing comes back"
        );
    }
    drop(receiver);

    let mut moved_events = 0;
    let mut progress = |e: txinbox_core::RedriveEvent<'_>, _: &txinbox_core::RedriveReport| {
        moved_events += usize::from(matches!(e, txinbox_core::RedriveEvent::Moved(_)));
    };
    let report = redrive_back(&c, &q, &mut progress).await;
    assert_eq!(moved_events, 4);
    assert_eq!(report.initially_visible, Some(5), "{report:?}");
    assert_eq!(
        (report.moved, report.new_dedup_id, report.deferred),
        (4, 4, 1),
        "{report:?}"
    );
    assert_eq!(
        counts(&c, &q.dlq).await,
        (0, 1),
        "the dedup-identity message stays in the DLQ (deferred)"
    );

    let receiver = fast_receiver(c.clone(), &q, 2).await;
    let opts = txinbox_core::WorkerOptions::default();
    let w = Running::start(
        receiver,
        inbox.bind_handler(pg_handler(Arc::new(AtomicI64::new(0)))),
        opts,
    );
    wait_until(LONG, "the redriven messages settled", || async {
        queue_empty(&c, &q.url).await && pg_effects(&store).await == 4
    })
    .await;
    let report = w.stop().await;
    assert_eq!(
        (
            report.count(txinbox_core::OutcomeKind::Applied),
            report.count(txinbox_core::OutcomeKind::Duplicate)
        ),
        (2, 2),
        "the inbox recognises what was applied: {report:?}"
    );
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (4, 4)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payload_collision_is_forwarded_to_the_dlq_with_evidence() {
    metrics_init();
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let store = pg_store().await;
    let consumer = unique("collision");
    send(
        &c,
        &q.url,
        &body("o1", "m1", json!({"note": "first"})),
        Some("evt-x"),
        "d-x1",
        "g",
    )
    .await;
    send(
        &c,
        &q.url,
        &body("o1", "m1", json!({"note": "changed"})),
        Some("evt-x"),
        "d-x2",
        "g",
    )
    .await;
    let receiver = fast_receiver(c.clone(), &q, 30).await;
    let opts = txinbox_core::WorkerOptions::default();
    let w = Running::start(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(Arc::new(AtomicI64::new(0)))),
        opts,
    );
    wait_until(LONG, "collision forwarded", || async {
        queue_empty(&c, &q.url).await && counts(&c, &q.dlq).await.0 == 1
    })
    .await;
    let report = w.stop().await;
    assert_eq!(
        (
            report.count(txinbox_core::OutcomeKind::Applied),
            report.count(txinbox_core::OutcomeKind::PayloadCollision)
        ),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (1, 1)
    );
    let evidence: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM txinbox_rejections WHERE kind = 'payload_collision'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(evidence, 1);
    let dead = drain(&c, &q.dlq).await;
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert!(
        d.body().unwrap().contains("changed"),
        "the colliding payload is kept"
    );
    let a = d.message_attributes().unwrap();
    assert_eq!(a["ce-id"].string_value(), Some("evt-x"));
    assert_eq!(a["ce-source"].string_value(), Some("crm/meetings"));
    assert_eq!(a["ce-type"].string_value(), Some("meeting.ended"));
    assert_eq!(
        a["txinbox-dlq-reason"].string_value(),
        Some("payload_collision")
    );
    assert!(a["txinbox-dlq-detail"]
        .string_value()
        .unwrap()
        .contains("evt-x"));
    let sys = d.attributes().unwrap();
    use aws_sdk_sqs::types::MessageSystemAttributeName as S;
    assert_eq!(sys[&S::MessageDeduplicationId], "d-x2", "dedup id kept");
    assert_eq!(sys[&S::MessageGroupId], "g", "group kept");
    assert!(
        counter(
            txinbox_sqs::metrics::DLQ_FORWARDS,
            &[("reason", "payload_collision")]
        ) >= 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_on_one_queue_with_duplicates_apply_each_message_once() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let store = pg_store().await;
    let consumer = unique("pair");
    let n = 12;
    for i in 0..n {
        for copy in 0..2 {
            send(
                &c,
                &q.url,
                &body(&format!("o{i}"), "m", json!({})),
                Some(&format!("evt-{i}")),
                &format!("d-{i}-{copy}"),
                &format!("g{i}-{copy}"),
            )
            .await;
        }
    }
    let inbox = pg_inbox(&store, &consumer);
    let mut workers = Vec::new();
    for _ in 0..2 {
        let receiver =
            SqsReceiver::connect(c.clone(), &q.url, fast_options(30, &q.dlq).batch_size(5))
                .await
                .unwrap();
        let opts = txinbox_core::WorkerOptions::default();
        workers.push(Running::start(
            receiver,
            inbox
                .clone()
                .bind_handler(pg_handler(Arc::new(AtomicI64::new(0)))),
            opts,
        ));
    }
    wait_until(LONG, "all copies settled", || async {
        queue_empty(&c, &q.url).await && pg_effects(&store).await == n
    })
    .await;
    let mut applied = 0;
    let mut duplicates = 0;
    for w in workers {
        let r = w.stop().await;
        applied += r.count(txinbox_core::OutcomeKind::Applied);
        duplicates += r.count(txinbox_core::OutcomeKind::Duplicate);
    }
    assert_eq!((applied, duplicates), (n as u64, n as u64));
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (n, n)
    );
    let per_message: i64 = sqlx::query_scalar("SELECT count(*) FROM (SELECT message_id FROM followup_tasks GROUP BY message_id HAVING count(*) > 1) x")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(per_message, 0, "exactly one effect per message");
    assert_eq!(counts(&c, &q.dlq).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifo_group_order_is_kept_for_one_group() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let store = pg_store().await;
    let consumer = unique("order");
    for i in 1..=8 {
        // Earlier messages are slower, so a concurrent worker would finish them last.
        let sleep = (9 - i) * 60;
        send(
            &c,
            &q.url,
            &body(&format!("o{i}"), "m", json!({"sleep_ms": sleep})),
            Some(&format!("evt-{i}")),
            &format!("d-{i}"),
            "one-group",
        )
        .await;
    }
    let receiver = fast_receiver(c.clone(), &q, 30).await;
    let opts = txinbox_core::WorkerOptions::default();
    let w = Running::start(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(Arc::new(AtomicI64::new(0)))),
        opts,
    );
    wait_until(LONG, "all applied", || async {
        pg_effects(&store).await == 8 && queue_empty(&c, &q.url).await
    })
    .await;
    let report = w.stop().await;
    assert_eq!(report.count(txinbox_core::OutcomeKind::Applied), 8);
    let order: Vec<String> =
        sqlx::query_scalar("SELECT opportunity FROM followup_tasks ORDER BY position")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let expected: Vec<String> = (1..=8).map(|i| format!("o{i}")).collect();
    assert_eq!(order, expected);
    assert_eq!(pg_rows(&store, &consumer).await, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_mid_batch_loses_nothing_and_duplicates_nothing() {
    let c = client().await;
    let q = queue_pair(&c, 5, 3).await;
    let store = pg_store().await;
    let consumer = unique("sigterm");
    let n = 20;
    for i in 0..n {
        send(
            &c,
            &q.url,
            &body(&format!("o{i}"), "m", json!({"sleep_ms": 400})),
            Some(&format!("evt-{i}")),
            &format!("d-{i}"),
            &format!("g{i}"),
        )
        .await;
    }
    let calls = Arc::new(AtomicI64::new(0));
    let receiver = fast_receiver(c.clone(), &q, 3).await;
    let opts = txinbox_core::WorkerOptions::default().concurrency(4);
    let w = Running::start(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(calls.clone())),
        opts,
    );
    // Stop (as SIGTERM would through `shutdown_signal`) while a batch is in flight.
    wait_until(LONG, "a batch in flight", || async {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    let first = w.stop().await;
    assert!(first.total() < n as u64, "stopped mid-way: {first:?}");
    assert_eq!(
        first.count(txinbox_core::OutcomeKind::Interrupted),
        0,
        "in-flight deliveries finished within the shutdown timeout"
    );
    // A new instance takes over and drains the queue.
    let receiver = fast_receiver(c.clone(), &q, 3).await;
    let opts = txinbox_core::WorkerOptions::default();
    let w = Running::start(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(calls.clone())),
        opts,
    );
    wait_until(LONG, "all messages applied", || async {
        pg_effects(&store).await == n && queue_empty(&c, &q.url).await
    })
    .await;
    let second = w.stop().await;
    assert_eq!(
        first.count(txinbox_core::OutcomeKind::Applied)
            + second.count(txinbox_core::OutcomeKind::Applied),
        n as u64,
        "{first:?} {second:?}"
    );
    assert_eq!(
        (pg_rows(&store, &consumer).await, pg_effects(&store).await),
        (n, n)
    );
    assert_eq!(counts(&c, &q.dlq).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publisher_sends_one_identity_the_inbox_resolves() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let store = pg_store().await;
    let consumer = unique("publish");
    let publisher = txinbox_sqs::SqsPublisher::new(c.clone()).default_queue(&q.url);
    let mut msg = txinbox_core::OutboxMessage {
        destination: String::new(),
        source: "crm/meetings".into(),
        message_id: "evt-pub-1".into(),
        event_type: "meeting.ended".into(),
        group_id: Some("oportunidade_2481".into()),
        body: body("oportunidade_2481", "reuniao_184", json!({})).into_bytes(),
        attributes: Default::default(),
    };
    msg.attributes
        .insert("ce-tenantid".into(), "jupiter".into());
    txinbox_core::Publisher::publish(&publisher, &msg)
        .await
        .unwrap();
    txinbox_core::Publisher::publish(&publisher, &msg)
        .await
        .unwrap();
    assert_eq!(
        counts(&c, &q.url).await.0,
        1,
        "the republish inside 5 minutes is dropped by SQS"
    );
    let mut receiver = fast_receiver(c.clone(), &q, 30).await;
    let d = receiver
        .receive(10)
        .await
        .unwrap()
        .pop()
        .expect("one delivery");
    let rm = d.message();
    assert_eq!(rm.attribute("ce-id"), Some("evt-pub-1"));
    assert_eq!(rm.attribute("ce-tenantid"), Some("jupiter"));
    assert_eq!(rm.group_id.as_deref(), Some("oportunidade_2481"));
    assert_eq!(
        d.deduplication_id(),
        Some(txinbox_sqs::deduplication_id("crm/meetings", "evt-pub-1").as_str())
    );
    assert_eq!(
        rm.producer_id, None,
        "not an identity unless the consumer opts in"
    );
    let inbox = pg_inbox(&store, &consumer);
    assert!(matches!(
        inbox
            .process(d, &pg_handler(Arc::new(AtomicI64::new(0))))
            .await,
        Outcome::Applied { .. }
    ));
    let (id, tenant): (String, Option<String>) =
        sqlx::query_as("SELECT message_id, tenant_id FROM txinbox_inbox")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(
        (id.as_str(), tenant.as_deref()),
        ("evt-pub-1", Some("jupiter"))
    );
    assert_eq!(pg_effects(&store).await, 1);
    assert_eq!(counts(&c, &q.url).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_queue_is_entity_not_found_and_options_are_checked() {
    let c = client().await;
    let bad = SqsReceiver::connect(
        c.clone(),
        "http://127.0.0.1:1/000000000000/nope.fifo",
        SqsOptions::default().batch_size(11),
    )
    .await;
    let bad = bad.expect_err("batch size 11 is refused");
    assert_eq!(bad.kind(), txinbox_core::BrokerErrorKind::Configuration);
    assert!(matches!(
        std::error::Error::source(&bad).and_then(|s| s.downcast_ref::<txinbox_sqs::SqsError>()),
        Some(txinbox_sqs::SqsError::InvalidOptions { .. })
    ));
    let url = format!("{}/123456789012/{}.fifo", endpoint(), unique("missing"));
    let err = SqsReceiver::connect(c, url, SqsOptions::default())
        .await
        .expect_err("no such queue");
    assert_eq!(err.kind(), txinbox_core::BrokerErrorKind::EntityNotFound);
}

/// A receive may ask for more than one `ReceiveMessage` returns (10): once a receive came back full, the next
/// sends its calls at once (one long poll, the others without a wait) and hands out all they brought; every
/// delivery is settled as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receive_over_ten_is_sent_as_concurrent_calls_once_the_queue_has_a_backlog() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    send_one_per_group(&c, &q.url, 0..25, "evt-").await;
    let mut r = fast_receiver(c.clone(), &q, 30).await;
    // No backlog known yet: one call, at most 10.
    let first = r.receive(25).await.unwrap();
    assert_eq!(first.len(), 10);
    // It came back full: three calls at once (10 + 10 + 5) bring the other 15.
    let second = r.receive(25).await.unwrap();
    assert_eq!(
        second.len(),
        15,
        "one receive of 25 through concurrent calls"
    );
    let mut ids: Vec<_> = first
        .iter()
        .chain(&second)
        .map(|d| d.message().attribute("ce-id").unwrap().to_owned())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 25, "each message handed out once");
    ack_all(first.into_iter().chain(second)).await;
    wait_until(LONG, "the queue empty", || async {
        queue_empty(&c, &q.url).await
    })
    .await;
}

/// A worker of three receive loops (three receivers forked from one, each with its own receives in flight)
/// on two FIFO groups whose earlier messages are slower: SQS hands a group's next message to no receive while
/// one of the group is in flight, so each group is still applied in order, every message once, and the queue
/// ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn receive_loops_keep_each_fifo_group_in_order() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let store = pg_store().await;
    let consumer = unique("loops");
    for i in 1..=6 {
        for g in ["a", "b"] {
            let id = format!("evt-{g}{i}");
            send(
                &c,
                &q.url,
                &body(&format!("{g}{i}"), "m", json!({"sleep_ms": (7 - i) * 40})),
                Some(&id),
                &id,
                &format!("group-{g}"),
            )
            .await;
        }
    }
    let receiver = fast_receiver(c.clone(), &q, 30).await;
    let w = Running::start(
        receiver,
        pg_inbox(&store, &consumer).bind_handler(pg_handler(Arc::new(AtomicI64::new(0)))),
        txinbox_core::WorkerOptions::default()
            .concurrency(4)
            .batch_size(2)
            .receive_loops(3),
    );
    wait_until(LONG, "all applied", || async {
        pg_effects(&store).await == 12 && queue_empty(&c, &q.url).await
    })
    .await;
    let report = w.stop().await;
    assert_eq!(
        report.count(txinbox_core::OutcomeKind::Applied),
        12,
        "{report}"
    );
    assert_eq!(report.total(), 12, "{report}");
    let order: Vec<String> =
        sqlx::query_scalar("SELECT opportunity FROM followup_tasks ORDER BY position")
            .fetch_all(store.pool())
            .await
            .unwrap();
    for g in ["a", "b"] {
        let group: Vec<&String> = order.iter().filter(|o| o.starts_with(g)).collect();
        let expected: Vec<String> = (1..=6).map(|i| format!("{g}{i}")).collect();
        assert_eq!(group, expected.iter().collect::<Vec<_>>(), "group {g}");
    }
    assert_eq!(pg_rows(&store, &consumer).await, 12);
}

/// A FIFO group's first message released (a retry after a transient failure) while the receiver holds the
/// group's next one: the held one goes back to SQS rather than out, so the released message comes back and
/// is handed out first. AWS: "Messages within the same message group are always processed one at a time, in
/// strict order", and "Inflight messages block delivery of available messages within the same message
/// group". The receiver handed out the held message as soon as the first was settled, release or not, and
/// the group's order was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_fifo_message_comes_back_before_the_later_ones_of_its_group() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    send_in_one_group(&c, &q.url, 1..3).await;
    let mut r = fast_receiver(c.clone(), &q, 30).await;
    let id = |d: &txinbox_sqs::SqsDelivery| {
        d.message()
            .attribute("ce-id")
            .unwrap_or_default()
            .to_owned()
    };
    let mut first = receive_until(&mut r, 1, LONG).await;
    assert_eq!(first.len(), 1, "the second of the group is held");
    assert_eq!(id(&first[0]), "evt-1");
    first
        .pop()
        .unwrap()
        .release(Duration::from_secs(2))
        .await
        .unwrap();
    let next = receive_until(&mut r, 1, LONG).await;
    assert_eq!(
        next.iter().map(id).collect::<Vec<_>>(),
        ["evt-1"],
        "the released message first"
    );
}

/// A standard queue whose producer sets `MessageGroupId` (a fair queue): the messages of one group are
/// handed out together, not one at a time. AWS: "In standard queues, using MessageGroupId enables fair
/// queues [...] messages with the same MessageGroupId can be processed in parallel." The receiver held all
/// but one back, as for a FIFO queue, and a busy tenant's held messages timed out in the receiver, counted
/// receives and could reach the dead-letter queue without being processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standard_queue_s_message_groups_are_not_held_back() {
    let c = client().await;
    let url = c
        .create_queue()
        .queue_name(unique("fair"))
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_owned();
    for i in 1..=3 {
        c.send_message()
            .queue_url(&url)
            .message_body(body(&format!("o{i}"), "m", json!({})))
            .message_group_id("tenant-a")
            .send()
            .await
            .unwrap();
    }
    let mut r = SqsReceiver::connect(
        c.clone(),
        &url,
        SqsOptions::default().wait(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let got = receive_until(&mut r, 3, LONG).await;
    assert_eq!(got.len(), 3);
    assert!(got
        .iter()
        .all(|d| d.message().group_id.as_deref() == Some("tenant-a")));
}

/// A receive sent as several calls (a backlog): the long poll can wait its whole wait while the calls beside it
/// answer at once, and a message's visibility runs from its own call. Each delivery's lease says so: it was
/// counted from the end of the slowest call, later than the truth by up to the whole wait, so a renewal could
/// come after SQS had made the message visible to other receivers again. Here the long poll is held back by
/// 3 s before it reaches moto, then waits 2 s on an empty queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_message_s_visibility_runs_from_its_own_call() {
    let c = client().await;
    let slow = hooked(&c, |request, connector| {
        let long_poll = json_body(&request)["WaitTimeSeconds"]
            .as_i64()
            .is_some_and(|w| w > 0);
        let connector = connector.clone();
        HttpConnectorFuture::new(async move {
            if long_poll {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            connector.call(request).await
        })
    });
    let q = queue_pair(&c, 5, 30).await;
    send_one_per_group(&c, &q.url, 0..15, "evt-").await;
    let mut r = SqsReceiver::connect(
        slow,
        &q.url,
        fast_options(30, &q.dlq).wait(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let first = r.receive(25).await.unwrap();
    assert_eq!(first.len(), 10, "one call, full: the queue has a backlog");
    let started = chrono::Utc::now();
    let second = r.receive(25).await.unwrap();
    assert_eq!(
        second.len(),
        5,
        "the calls that do not wait brought the rest"
    );
    for d in &second {
        let expires = expires_at(d);
        assert!(
            expires <= started + chrono::Duration::seconds(32),
            "the lease runs from its own call: expires {expires}, receive started {started}"
        );
    }
    ack_all(first.into_iter().chain(second)).await;
}

/// The times (on the wall clock) at which requests went out.
type SentAt = Arc<std::sync::Mutex<Vec<chrono::DateTime<chrono::Utc>>>>;

/// The last time in `sent`; fails the test saying `what` when there is none.
fn last_sent(sent: &SentAt, what: &str) -> chrono::DateTime<chrono::Utc> {
    *sent.lock().unwrap().last().expect(what)
}

/// When the lease of `d` ends.
fn expires_at(d: &txinbox_sqs::SqsDelivery) -> chrono::DateTime<chrono::Utc> {
    d.lease().unwrap().expires_at().unwrap()
}

/// Acknowledges each of `deliveries`.
async fn ack_all(deliveries: impl IntoIterator<Item = txinbox_sqs::SqsDelivery>) {
    for d in deliveries {
        d.ack().await.unwrap();
    }
}

/// The times (on the wall clock) at which `op` requests passed through, and a client whose `op` answers reach the
/// adapter `delay` after moto gave them (a slow network, or an answer the SDK had to wait for).
fn answers_late(
    c: &aws_sdk_sqs::Client,
    op: &'static str,
    delay: Duration,
) -> (aws_sdk_sqs::Client, SentAt) {
    let sent: SentAt = Arc::default();
    let seen = sent.clone();
    let late = hooked(c, move |request, connector| {
        let late = operation(&request) == Some(op);
        if late {
            seen.lock().unwrap().push(chrono::Utc::now());
        }
        let connector = connector.clone();
        HttpConnectorFuture::new(async move {
            let answer = connector.call(request).await;
            if late {
                tokio::time::sleep(delay).await;
            }
            answer
        })
    });
    (late, sent)
}

/// AWS (SQS Developer Guide, visibility timeout): "The visibility timeout begins when Amazon SQS returns a
/// message", which is before its answer reaches the receiver, and after the `ReceiveMessage` call was sent.
/// The lease counted its visibility from when the answer arrived, so after a slow answer (here 3 s late) the
/// worker believed it held the message for 3 s after SQS had made it visible to other receivers again. It
/// counts from when the call was sent, the latest time SQS can be known to have started it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_counts_from_when_its_receive_was_sent_not_from_the_answer() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    send_one_per_group(&c, &q.url, 0..1, "evt-").await;
    let (late, sent) = answers_late(&c, "ReceiveMessage", Duration::from_secs(3));
    let mut r = fast_receiver(late, &q, 30).await;
    let got = receive_until(&mut r, 1, LONG).await;
    let last_sent = last_sent(&sent, "a ReceiveMessage went out");
    let expires = expires_at(&got[0]);
    assert!(
        expires <= last_sent + chrono::Duration::seconds(30),
        "the lease runs from the request, not the answer: expires {expires}, request sent {last_sent}"
    );
    ack_all(got).await;
}

/// A FIFO message held behind the one before it in its group is extended (`ChangeMessageVisibility`) when it
/// has waited half its visibility. AWS (`ChangeMessageVisibility`): "the 10 seconds begin to count from the
/// time that you make the ChangeMessageVisibility call". The held message's visibility was counted from when
/// the extension's answer arrived (here 2 s late), so its lease ended 2 s after SQS's; it counts from when the
/// call was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_s_extension_counts_from_when_it_was_sent() {
    let c = client().await;
    let q = queue_pair(&c, 5, 10).await;
    send_in_one_group(&c, &q.url, 1..3).await;
    let (late, sent) = answers_late(&c, "ChangeMessageVisibility", Duration::from_secs(2));
    let mut r = fast_receiver(late, &q, 10).await;
    let mut first = receive_until(&mut r, 1, LONG).await;
    assert_eq!(first.len(), 1, "the second of the group is held");
    // Past half the 10 s visibility (the held one is extended when handed out), well before its end.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    first.pop().unwrap().ack().await.unwrap();
    let next = r.receive(1).await.unwrap();
    assert_eq!(next.len(), 1, "the held message is handed out");
    let extended = last_sent(&sent, "the held message was extended");
    let expires = expires_at(&next[0]);
    assert!(
        expires <= extended + chrono::Duration::seconds(10),
        "the extension runs from the request, not the answer: expires {expires}, request sent {extended}"
    );
    ack_all(next).await;
}

/// A message published to a FIFO queue without a group goes in a group of its own, named after its id. AWS
/// (`SendMessage`, `MessageGroupId`): "The length of MessageGroupId is 128 characters. Valid values:
/// alphanumeric characters and punctuation (!\"#$%&'()*+,-./:;<=>?@[\]^_`{|}~)." An id SQS would not take
/// as a group (longer than 128 characters, a space, a letter outside ASCII) was sent as the group all the same,
/// and SQS refused the send, every time (moto does not check, so the test reads the group sent): the group is
/// then derived from the id, as the deduplication id always is; an id SQS takes stays the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_a_group_gets_a_group_sqs_accepts_whatever_its_id() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    let publisher = txinbox_sqs::SqsPublisher::new(c.clone()).default_queue(&q.url);
    let long = format!("pedido nº 42/{}", "x".repeat(150));
    for id in ["evt-own-group", long.as_str()] {
        let msg = txinbox_core::OutboxMessage {
            destination: String::new(),
            source: "crm/orders".into(),
            message_id: id.into(),
            event_type: "order.placed".into(),
            group_id: None,
            body: body(id, "m", json!({})).into_bytes(),
            attributes: Default::default(),
        };
        txinbox_core::Publisher::publish(&publisher, &msg)
            .await
            .unwrap();
    }
    let mut receiver = fast_receiver(c.clone(), &q, 30).await;
    let got = receive_until(&mut receiver, 2, LONG).await;
    let group_of = |id: &str| {
        got.iter()
            .find(|d| d.message().attribute("ce-id") == Some(id))
            .and_then(|d| d.message().group_id.clone())
            .expect("received, with a group")
    };
    assert_eq!(group_of("evt-own-group"), "evt-own-group");
    let derived = group_of(&long);
    assert!(
        !derived.is_empty()
            && derived.len() <= 128
            && derived
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b.is_ascii_punctuation()),
        "a group SQS refuses: {derived:?}"
    );
    ack_all(got).await;
}

/// The dead-letter queue refuses the copy a dead letter sends because of what the copy adds: its reason and
/// its detail (up to 1 KiB) on a message already near the maximum size (AWS, `SendMessage`, as SQS answers it:
/// "One or more parameters are invalid. Reason: Message must be shorter than 262144 bytes."; moto checks the
/// body alone, so a transport in front of it refuses every copy carrying the reason). The forward failed at
/// every try and the message came back once per visibility timeout, its handler run again each time; the copy
/// now goes with the message's own attributes, and the original is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_copy_refused_for_its_reason_is_forwarded_without_it() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    send(
        &c,
        &q.url,
        &body("o1", "m1", json!({})),
        Some("evt-too-big"),
        "d-1",
        "g-1",
    )
    .await;
    let refusals = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let refused = refusals.clone();
    let refusing = answering(&c, move |request| {
        let with_reason = operation(request) == Some("SendMessage")
            && json_body(request)["MessageAttributes"]
                .get("txinbox-dlq-reason")
                .is_some();
        with_reason.then(|| {
            refused.fetch_add(1, Ordering::SeqCst);
            sqs_error(
                400,
                "InvalidParameterValue",
                "One or more parameters are invalid. Reason: Message must be shorter than 262144 bytes.",
            )
        })
    });
    let mut r = fast_receiver(refusing, &q, 30).await;
    let d = receive_until(&mut r, 1, LONG).await.pop().unwrap();
    d.dead_letter(txinbox_core::DeadLetter::new(
        "permanent_error",
        "the CRM refused the task",
    ))
    .await
    .expect("forwarded without the reason, then deleted");
    assert_eq!(
        refusals.load(Ordering::SeqCst),
        1,
        "the copy with the reason"
    );
    let copies = drain(&c, &q.dlq).await;
    assert_eq!(copies.len(), 1);
    let attrs = copies[0].message_attributes().cloned().unwrap_or_default();
    assert_eq!(
        attrs.get("ce-id").and_then(|v| v.string_value()),
        Some("evt-too-big"),
        "the identity kept"
    );
    assert!(!attrs.contains_key("txinbox-dlq-reason"));
    assert_eq!(counts(&c, &q.url).await, (0, 0), "the original deleted");
}

/// Two dead letters of one FIFO group: the first's identity is its deduplication id and it is still inside
/// the 5-minute window, so the redrive leaves it in the DLQ for a later run; the second carries `ce-id` and
/// could go now under a new deduplication id. It went, and reached the queue before the message it follows
/// (AWS: "Messages within the same message group are always processed one at a time, in strict order"). It
/// now waits with it: both deferred, nothing sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_does_not_move_a_message_ahead_of_a_deferred_one_of_its_group() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    send(
        &c,
        &q.dlq,
        &body("o1", "m", json!({})),
        None,
        "d-first",
        "g",
    )
    .await;
    send(
        &c,
        &q.dlq,
        &body("o2", "m", json!({})),
        Some("evt-second"),
        "d-second",
        "g",
    )
    .await;
    let report = redrive_back(&c, &q, &mut ()).await;
    assert_eq!(
        (report.moved, report.deferred),
        (0, 2),
        "the second waits with the first: {report:?}"
    );
    assert_eq!(
        counts(&c, &q.url).await,
        (0, 0),
        "nothing reached the queue"
    );
    assert_eq!(total(&c, &q.dlq).await, 2, "both stay in the DLQ");
}

/// A redrive pass that lasts longer than the visibility timeout of its receives: what it left in the DLQ
/// (a message deferred inside the 5-minute window) becomes visible again and comes back to its receives (AWS,
/// ReceiveMessage's VisibilityTimeout: "If the message is not deleted or its visibility timeout is not extended
/// before the timeout expires, it becomes visible again and can be retrieved by other consumers."). It was counted and told again on every receive, and the run went on for as long as it came back.
/// Each dead letter is now decided once: told once, counted once, and the run ends when only what it left comes
/// back. A visibility timeout of 0 puts every receive after the first past the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_longer_than_its_visibility_timeout_counts_each_message_once() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    send_without_ce_id(&c, &q.dlq, "deferred").await;
    send_one_per_group(&c, &q.dlq, 0..3, "d-").await;
    let mut progress = ToldOnce::default();
    let report = redrive_back_past_visibility(&c, &q, &mut progress).await;
    let told = progress.0;
    assert_eq!(
        (report.moved, report.deferred, report.identity_lost),
        (3, 1, 0),
        "{report:?}"
    );
    assert_eq!(told.len(), 4, "each told once: {told:?}");
    assert_eq!(counts(&c, &q.url).await, (3, 0), "the three moved");
    assert_eq!(total(&c, &q.dlq).await, 1, "the deferred one stays");
}

/// A FIFO message held behind the one before it in its group stays invisible however long that one is
/// processed (its lease renewed by the worker's keeper, for up to `lease.max_total`), even when no receive is
/// called meanwhile (every place of the worker is busy: the worker receives only for a free place). The held
/// message was extended only when handed out, so a predecessor slower than the visibility timeout let it run
/// out in the receiver: SQS counted a receive for nothing, the receiver dropped it and received it again, and
/// a group whose messages each take longer than the visibility timeout sent its later messages to the
/// dead-letter queue unprocessed. AWS (`RedrivePolicy`): "maxReceiveCount – The number of times a message is
/// delivered to the source queue before being moved to the dead-letter queue."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_stays_invisible_while_the_one_before_it_outlasts_the_visibility() {
    let c = client().await;
    let q = queue_pair(&c, 5, 2).await;
    send_in_one_group(&c, &q.url, 1..3).await;
    let mut r = fast_receiver(c.clone(), &q, 2).await;
    let mut first = receive_until(&mut r, 1, LONG).await;
    assert_eq!(first.len(), 1, "the second of the group is held");
    let first = first.pop().unwrap();
    assert_eq!(first.message().attribute("ce-id"), Some("evt-1"));
    // The first's handler runs for three of its 2 s visibility timeouts, its lease renewed as the worker's
    // keeper renews it; no receive is called meanwhile.
    let lease = first.lease().expect("an SQS delivery has a lease");
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        lease
            .renew(Duration::from_secs(2))
            .await
            .expect("the first's renewal");
    }
    first.ack().await.unwrap();
    let next = receive_until(&mut r, 1, LONG).await;
    assert_eq!(next[0].message().attribute("ce-id"), Some("evt-2"));
    assert_eq!(
        next[0].message().delivery_count,
        1,
        "the held message's visibility ran out in the receiver: SQS handed it out again"
    );
    ack_all(next).await;
}

/// A FIFO message whose visibility ran out while its delivery is still out (its heartbeat failed, its handler
/// still running): the later message of its group the receiver holds is not handed out ahead of it, it goes
/// back to SQS, and the first comes back first. AWS: "Inflight messages block delivery of available messages
/// within the same message group": while the receiver holds the second (kept invisible while held), SQS
/// hands out neither, so handing the second out would let it be applied before the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_goes_back_behind_a_first_whose_visibility_ran_out() {
    let c = client().await;
    let q = queue_pair(&c, 5, 2).await;
    send_in_one_group(&c, &q.url, 1..3).await;
    let mut r = fast_receiver(c.clone(), &q, 2).await;
    let mut first = receive_until(&mut r, 1, LONG).await;
    assert_eq!(first.len(), 1, "the second of the group is held");
    let stale = first.pop().unwrap();
    assert_eq!(stale.message().attribute("ce-id"), Some("evt-1"));
    // Never renewed: its 2 s visibility runs out while it is still out.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let next = receive_until(&mut r, 1, LONG).await;
    assert_eq!(
        next[0].message().attribute("ce-id"),
        Some("evt-1"),
        "the first of the group comes back first"
    );
    ack_all(next).await;
    drop(stale);
}

/// Two receive loops (forks of one receiver): the one that handed out a FIFO group's first message holds the
/// group's next one; the first is released (a retry). The held message must go back to SQS so the released
/// one comes back first (AWS: "Inflight messages block delivery of available messages within the same
/// message group"), whichever loop receives next. The notice that the group returns was shared by every fork
/// and taken by the first to receive: taken by a loop holding nothing of the group, it was lost, and the loop
/// holding the next message handed it out ahead of the retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_fifo_message_comes_back_first_whichever_receive_loop_runs_next() {
    let c = client().await;
    let q = queue_pair(&c, 5, 30).await;
    send_in_one_group(&c, &q.url, 1..3).await;
    let mut a = fast_receiver(c.clone(), &q, 30).await;
    let mut b = a.fork().expect("an SQS receiver forks");
    let mut first = receive_until(&mut a, 1, LONG).await;
    assert_eq!(first.len(), 1, "the second of the group is held");
    let first = first.pop().unwrap();
    assert_eq!(first.message().attribute("ce-id"), Some("evt-1"));
    first.release(Duration::from_secs(2)).await.unwrap();
    // The other loop receives first: SQS has nothing of the group for it (the first is invisible for its
    // retry delay, the second held by `a`).
    let other = b.receive(10).await.unwrap();
    assert!(other.is_empty(), "nothing of the group for the other loop");
    let next = receive_until(&mut a, 1, LONG).await;
    assert_eq!(
        next[0].message().attribute("ce-id"),
        Some("evt-1"),
        "the released message first"
    );
    ack_all(next).await;
}
