//! One delivery through the inbox: duplicates, collisions, business keys, bad input, handler and store failures.

use super::*;

#[tokio::test]
async fn a_duplicate_is_acked_and_carries_the_first_result_reference() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let p = processor(&store);
    q.send(event("evt-1", "2481"));
    q.send(event("evt-1", "2481"));
    assert_eq!(
        one(&q, &p).await,
        Outcome::Applied {
            result_reference: Some("task-2481".into())
        }
    );
    assert_eq!(
        one(&q, &p).await,
        Outcome::Duplicate {
            result_reference: Some("task-2481".into())
        }
    );
    assert_eq!(store.state().effects, vec!["task-2481"]);
    assert_eq!(q.state(), QueueState::default());
}

#[tokio::test]
async fn same_id_other_payload_is_a_collision_with_evidence_and_dead_lettered() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let p = processor(&store);
    q.send(event("evt-1", "2481"));
    q.send(event("evt-1", "9999"));
    one(&q, &p).await;
    let o = one(&q, &p).await;
    assert!(matches!(o, Outcome::PayloadCollision { .. }), "{o:?}");
    assert_eq!(
        store.state().rejections,
        vec![("payload_collision", "evt-1".to_owned())]
    );
    assert_eq!(store.state().effects.len(), 1);
    assert_eq!(q.dead_letters()[0].1.reason, "payload_collision");
}

#[tokio::test]
async fn the_typed_business_key_catches_another_id_for_the_same_action() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let p = processor(&store);
    q.send(event("evt-1", "2481"));
    q.send(event("evt-2", "2481"));
    one(&q, &p).await;
    let o = one(&q, &p).await;
    assert_eq!(
        o,
        Outcome::BusinessDuplicate {
            holder_message_id: "evt-1".into(),
            result_reference: Some("task-2481".into())
        }
    );
    assert_eq!(
        store.state().rejections,
        vec![("business_duplicate", "evt-2".to_owned())]
    );
    assert_eq!(store.state().effects.len(), 1);
    assert_eq!(
        q.state(),
        QueueState::default(),
        "a business duplicate is acked"
    );
}

#[tokio::test]
async fn a_body_that_is_not_the_type_is_bad_input_and_opens_no_transaction() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let p = processor(&store);
    q.send(OutgoingMessage::new(r#"{"opportunity":42}"#).cloudevent("urn:crm", "evt-1", "t"));
    q.send(OutgoingMessage::new("not json").cloudevent("urn:crm", "evt-2", "t"));
    for _ in 0..2 {
        let o = one(&q, &p).await;
        assert!(
            matches!(&o, Outcome::DeadLettered { reason, .. } if reason == "invalid_json"),
            "{o:?}"
        );
    }
    assert_eq!(store.state().begins, 0);
    assert_eq!(q.state().dead_lettered, 2);
}

/// Delivers a fresh message through `p`, expects a retry released for exactly `backoff` seconds, then clears
/// the queue. The queue's clock is frozen: a 1 ms margin against the wall clock fails on a loaded machine.
async fn released_after<H: Handler<MemStore, Raw>>(
    q: &MemoryQueue,
    p: &InboxProcessor<MemStore, Raw, H>,
    backoff: u64,
) {
    q.freeze_clock();
    q.send(event("evt-x", "1"));
    let d = q.receive_now(1).pop().unwrap();
    let o = p.process_one(d).await;
    assert!(matches!(o, Outcome::Retry { .. }), "{o:?}");
    assert_eq!(q.state().delayed, 1, "released with a delay");
    q.advance(Duration::from_secs(backoff) - Duration::from_millis(1));
    assert!(q.receive_now(1).is_empty(), "not visible before {backoff}s");
    q.advance(Duration::from_millis(2));
    let again = q.receive_now(1);
    assert_eq!(again.len(), 1, "visible after {backoff}s");
    for d in again {
        d.ack().await.unwrap();
    }
}

#[tokio::test]
async fn handler_errors_map_to_retry_or_dead_letter() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let permanent = inbox(&store).bind(|_tx: MemTx, _m: Message<Raw>| async move {
        Err::<(), _>(HandlerError::permanent("opportunity is closed"))
    });
    let after = inbox(&store).bind(|_tx: MemTx, _m: Message<Raw>| async move {
        Err::<(), _>(HandlerError::retry_after("busy", Duration::from_secs(2)))
    });
    // An error through `?` that the store does not know: retried with the inbox's backoff.
    let unknown = inbox(&store).bind(|_tx: MemTx, _m: Message<Raw>| async move {
        std::fs::read("/nonexistent/txinbox")?;
        Ok(())
    });
    // An error the store classifies as its own transient failure: retried.
    let store_err = inbox(&store)
        .bind(|_tx: MemTx, _m: Message<Raw>| async move { Err::<(), _>(Unavailable.into()) });
    q.send(event("evt-1", "1"));
    let d = q.receive_now(1).pop().unwrap();
    assert!(
        matches!(permanent.process_one(d).await, Outcome::DeadLettered { reason, .. } if reason == "handler_permanent")
    );
    released_after(&q, &after, 2).await;
    released_after(&q, &unknown, 7).await;
    released_after(&q, &store_err, 7).await;
    assert!(store.state().markers.is_empty());
}

#[tokio::test]
async fn a_panicking_handler_is_retried_and_nothing_is_written() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let p = inbox(&store).bind(|tx: MemTx, _m: Message<Raw>| async move {
        tx.write("half");
        if tx.0.lock().is_ok() {
            panic!("handler bug");
        }
        Ok(())
    });
    q.send(event("evt-1", "1"));
    let o = p.process_one(q.receive_now(1).pop().unwrap()).await;
    assert!(matches!(o, Outcome::Retry { .. }), "{o:?}");
    assert!(store.state().effects.is_empty());
    assert!(store.state().markers.is_empty());
}

#[tokio::test]
async fn a_store_that_cannot_begin_releases_for_a_retry() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().fail_begin = true;
    let p = processor(&store);
    q.send(event("evt-1", "1"));
    let o = one(&q, &p).await;
    assert!(
        matches!(&o, Outcome::Retry { reason } if reason.starts_with("begin")),
        "{o:?}"
    );
    assert_eq!(q.state().delayed, 1);
}

#[tokio::test]
async fn a_delivery_older_than_the_retention_is_refused() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let p = inbox(&store)
        .retention(RetentionPolicy::default().keep(Duration::from_secs(60)))
        .bind(|_tx: MemTx, _m: Message<Raw>| async move { Ok(()) });
    q.send(event("evt-1", "1"));
    q.advance(Duration::from_secs(120));
    let o = p.process_one(q.receive_now(1).pop().unwrap()).await;
    assert!(
        matches!(&o, Outcome::DeadLettered { reason, .. } if reason == "retention_expired"),
        "{o:?}"
    );
    assert_eq!(store.state().begins, 0);
}

/// A retention too long for a date ("for ever") keeps the marker until the latest date there is: the
/// delivery applies (adding it to the processing time overflowed and panicked).
#[tokio::test]
async fn a_retention_of_for_ever_applies() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let p = inbox(&store)
        .retention(RetentionPolicy::default().keep(Duration::MAX))
        .bind(|_tx: MemTx, _m: Message<Raw>| async move { Ok(()) });
    q.send(event("evt-1", "1"));
    let o = p.process_one(q.receive_now(1).pop().unwrap()).await;
    assert!(matches!(&o, Outcome::Applied { .. }), "{o:?}");
}

#[tokio::test]
async fn a_stop_before_commit_rolls_back_and_releases() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let stop = CancellationToken::new();
    let s2 = stop.clone();
    let p = inbox(&store).bind(move |tx: MemTx, _m: Message<Raw>| {
        let s2 = s2.clone();
        async move {
            tx.write("never");
            s2.cancel();
            std::future::pending::<()>().await;
            Ok(())
        }
    });
    q.send(event("evt-1", "1"));
    let o = p
        .process_one_until(q.receive_now(1).pop().unwrap(), &stop)
        .await;
    assert_eq!(o, Outcome::Interrupted);
    assert!(store.state().effects.is_empty());
    assert_eq!(q.state().visible, 1, "released at once");
}

#[tokio::test]
async fn a_worker_runs_until_the_queue_is_idle() {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker};
    let store = MemStore::default();
    let q = MemoryQueue::new(QueueOptions {
        wait: Duration::from_millis(20),
        ..QueueOptions::default()
    });
    for i in 0..5 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    q.send(event("evt-0", "op-0"));
    let report = Worker::new(q.receiver(), processor(&store))
        .run_until_idle()
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 5);
    assert_eq!(report.count(OutcomeKind::Duplicate), 1);
    assert_eq!(store.state().effects.len(), 5);
    assert_eq!(q.state(), QueueState::default());
}

/// A store that checks its markers at commit runs the handler of a copy whose marker is held. When that
/// handler fails for good, or records effects the pipeline refuses, the pipeline asks the store for the
/// holder (`InboxStore::holder_of`) and decides the copy by it, as a conflict found at commit: a duplicate
/// with the holder's reference, a payload collision, a business duplicate. A success and a retryable
/// failure never ask; a message without a holder is dead-lettered; a holder that cannot be read for now
/// releases the copy. Before, each held copy was dead-lettered (`handler_permanent`).
#[tokio::test]
async fn a_held_copy_whose_handler_fails_for_good_is_decided_by_its_holder() {
    use std::sync::atomic::{AtomicU8, Ordering};
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().answers_holders = true;
    let mode = Arc::new(AtomicU8::new(0));
    let p = failing_for_good(&store, mode.clone());
    let reads = || store.state().holder_reads;
    q.send(event("evt-1", "2481"));
    assert_eq!(
        one(&q, &p).await,
        Outcome::Applied {
            result_reference: Some("task-2481".into())
        }
    );
    for fails in [1, 2] {
        mode.store(fails, Ordering::SeqCst);
        q.send(event("evt-1", "2481"));
        assert_eq!(
            one(&q, &p).await,
            Outcome::Duplicate {
                result_reference: Some("task-2481".into())
            },
            "mode {fails}"
        );
        q.send(event("evt-1", "9999"));
        let o = one(&q, &p).await;
        assert!(matches!(o, Outcome::PayloadCollision { .. }), "{o:?}");
        q.send(event("evt-2", "2481"));
        assert_eq!(
            one(&q, &p).await,
            Outcome::BusinessDuplicate {
                holder_message_id: "evt-1".into(),
                result_reference: Some("task-2481".into())
            }
        );
        q.send(event("evt-3", "5555"));
        let o = one(&q, &p).await;
        assert!(
            matches!(&o, Outcome::DeadLettered { reason, .. } if reason == "handler_permanent"),
            "{o:?}"
        );
    }
    assert_eq!(reads(), 8, "one read per permanent failure");
    mode.store(3, Ordering::SeqCst);
    q.send(event("evt-1", "2481"));
    assert!(matches!(one(&q, &p).await, Outcome::Retry { .. }));
    assert_eq!(reads(), 8, "a retryable failure is not looked up");
    mode.store(1, Ordering::SeqCst);
    store.state().fail_holder_reads = true;
    q.send(event("evt-1", "2481"));
    assert!(matches!(one(&q, &p).await, Outcome::Retry { .. }));
    assert_eq!(reads(), 9);
    assert_eq!(store.state().effects, ["task-2481"]);
    assert_eq!(
        store.state().rejections,
        [
            ("payload_collision", "evt-1".to_owned()),
            ("business_duplicate", "evt-2".to_owned()),
            ("payload_collision", "evt-1".to_owned()),
            ("business_duplicate", "evt-2".to_owned()),
        ]
    );
}

/// A redelivered copy (the broker handed it out before) whose handler fails for a retry, or panics, is
/// asked about too: on a store that checks its markers at commit such a copy of an applied message was
/// released again and again, its handler failing each time, until the broker's delivery limit dead-lettered
/// it; the SQL stores acknowledge it as a duplicate without running the handler. A first delivery's
/// retryable failure is not asked about (its redelivery is), and a redelivered copy nobody holds keeps its
/// retry.
#[tokio::test]
async fn a_redelivered_held_copy_whose_handler_keeps_failing_is_decided_by_its_holder() {
    use std::sync::atomic::{AtomicU8, Ordering};
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().answers_holders = true;
    let mode = Arc::new(AtomicU8::new(0));
    let p = failing_for_good(&store, mode.clone());
    let reads = || store.state().holder_reads;
    q.send(event("evt-1", "2481"));
    assert_eq!(
        one(&q, &p).await,
        Outcome::Applied {
            result_reference: Some("task-2481".into())
        }
    );
    // 3: a retryable error; 4: a panic.
    for fails in [3, 4] {
        mode.store(fails, Ordering::SeqCst);
        q.send(event("evt-1", "2481"));
        let before = reads();
        let o = one(&q, &p).await;
        assert!(matches!(o, Outcome::Retry { .. }), "mode {fails}: {o:?}");
        assert_eq!(
            reads(),
            before,
            "mode {fails}: a first delivery is not looked up"
        );
        q.advance(Duration::from_secs(60));
        assert_eq!(
            one(&q, &p).await,
            Outcome::Duplicate {
                result_reference: Some("task-2481".into())
            },
            "mode {fails}: its redelivery is decided by the holder"
        );
        assert_eq!(reads(), before + 1);
    }
    mode.store(3, Ordering::SeqCst);
    q.send(event("evt-5", "5555"));
    assert!(matches!(one(&q, &p).await, Outcome::Retry { .. }));
    q.advance(Duration::from_secs(60));
    let before = reads();
    assert!(matches!(one(&q, &p).await, Outcome::Retry { .. }));
    assert_eq!(
        reads(),
        before + 1,
        "asked, nobody holds it: its retry stands"
    );
    assert_eq!(store.state().effects, ["task-2481"]);
}

/// A store that answers no holder (the trait's default, the SQL stores) keeps a permanent failure as it
/// was: dead-lettered.
#[tokio::test]
async fn a_permanent_failure_stands_when_the_store_answers_no_holder() {
    use std::sync::atomic::AtomicU8;
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let p = failing_for_good(&store, Arc::new(AtomicU8::new(1)));
    q.send(event("evt-1", "2481"));
    let o = one(&q, &p).await;
    assert!(
        matches!(&o, Outcome::DeadLettered { reason, .. } if reason == "handler_permanent"),
        "{o:?}"
    );
}
