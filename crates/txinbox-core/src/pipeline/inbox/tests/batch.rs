//! Batches: one transaction for several deliveries, savepoints, conflicts found at commit.

use super::*;

/// A typed handler that fails (retryable) for opportunity `fail` after writing its effect.
fn failing_processor(
    store: &MemStore,
) -> InboxProcessor<MemStore, Meeting, impl Handler<MemStore, Meeting>> {
    inbox(store)
        .bind(|tx: MemTx, msg: Message<Meeting>| async move {
            tx.write(format!("task-{}", msg.body.opportunity));
            if msg.body.opportunity == "fail" {
                return Err(HandlerError::retry(std::io::Error::other("busy")));
            }
            Ok(Handled::reference(format!("task-{}", msg.body.opportunity)))
        })
        .business_key(|m: &Meeting| Some(format!("followup:{}:{}", m.opportunity, m.meeting)))
}

fn labels(o: &[Outcome]) -> Vec<&'static str> {
    o.iter().map(Outcome::label).collect()
}

/// The counter `name` summed over its labels, as `snap` sees it now.
fn counter_total(snap: &metrics_util::debugging::Snapshotter, name: &str) -> u64 {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == name)
        .map(|(.., v)| match v {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

/// A batch whose handlers all succeed is one transaction with no savepoint: the markers in one call, then
/// the handlers.
#[tokio::test]
async fn a_batch_is_one_transaction_without_savepoints_when_every_handler_succeeds() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().savepoints = true;
    let p = failing_processor(&store);
    for (id, opportunity) in [("evt-1", "2481"), ("evt-2", "2482"), ("evt-3", "2483")] {
        q.send(event(id, opportunity));
    }
    let o = p
        .process_batch(q.receive_now(3), &CancellationToken::new())
        .await;
    assert_eq!(labels(&o), ["applied", "applied", "applied"]);
    assert_eq!(store.state().begins, 1, "one transaction");
    assert_eq!(store.state().savepoints_opened, 0);
    assert_eq!(
        store.state().effects,
        ["task-2481", "task-2482", "task-2483"]
    );
    assert_eq!(q.state(), QueueState::default());
}

/// A handler that fails ends the first pass: rolled back, its failure kept (counted once), and the others
/// applied again in a second transaction, each under a savepoint.
#[tokio::test(flavor = "current_thread")]
async fn a_batch_is_one_transaction_and_a_failure_undoes_only_its_own_writes() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().savepoints = true;
    let p = failing_processor(&store);
    q.send(event("evt-1", "2481"));
    q.send(event("evt-2", "fail"));
    q.send(event("evt-3", "2483"));
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let o = p
        .process_batch(q.receive_now(3), &CancellationToken::new())
        .await;
    assert_eq!(labels(&o), ["applied", "retry", "applied"]);
    assert_eq!(
        store.state().begins,
        2,
        "the first pass, then the savepoint pass"
    );
    assert_eq!(
        store.state().savepoints_opened,
        2,
        "one per delivery applied again"
    );
    let retries: u64 = counter_total(&snap, m::RETRIES);
    assert_eq!(retries, 1, "the failure counted once");
    assert_eq!(store.state().effects, ["task-2481", "task-2483"]);
    assert_eq!(store.state().markers.len(), 2);
    // The retry is released with the inbox's backoff; the others are acknowledged.
    assert_eq!(
        q.state(),
        QueueState {
            delayed: 1,
            ..QueueState::default()
        }
    );
}

#[tokio::test]
async fn a_store_without_savepoints_gets_one_transaction_per_delivery_of_a_batch() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    let p = failing_processor(&store);
    q.send(event("evt-1", "2481"));
    q.send(event("evt-2", "fail"));
    q.send(event("evt-1", "2481"));
    let o = p
        .process_batch(q.receive_now(3), &CancellationToken::new())
        .await;
    assert_eq!(labels(&o), ["applied", "retry", "duplicate"]);
    // The first pass gave up at the failure; the savepoint pass's BEGIN learned there are no savepoints; then
    // one transaction per delivery still to decide.
    assert_eq!(store.state().begins, 1 + 1 + 2);
    assert_eq!(store.state().effects, ["task-2481"]);
}

/// A store that checks its keys at COMMIT refuses the whole batch without saying which delivery: each is
/// applied again on its own and gets the outcome it gets alone.
#[tokio::test]
async fn a_conflict_found_at_commit_reapplies_the_batch_one_by_one() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().savepoints = true;
    let p = processor(&store);
    q.send(event("evt-1", "2481"));
    assert!(matches!(one(&q, &p).await, Outcome::Applied { .. }));
    q.send(event("evt-1", "2481"));
    q.send(event("evt-3", "2483"));
    q.send(event("evt-4", "2484"));
    let o = p
        .process_batch(q.receive_now(3), &CancellationToken::new())
        .await;
    assert_eq!(labels(&o), ["duplicate", "applied", "applied"]);
    // The first delivery's, the refused batch's, then one per delivery.
    assert_eq!(store.state().begins, 1 + 1 + 3);
    assert_eq!(
        store.state().effects,
        ["task-2481", "task-2483", "task-2484"]
    );
    assert_eq!(q.state(), QueueState::default());
}

/// Bad input in a batch is dead-lettered without entering the transaction; the rest applies.
#[tokio::test]
async fn bad_input_in_a_batch_never_enters_the_transaction() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().savepoints = true;
    let p = processor(&store);
    q.send(event("evt-1", "2481"));
    q.send(OutgoingMessage::new("not json").cloudevent("urn:crm", "evt-bad", "crm.meeting.ended"));
    q.send(event("evt-3", "2483"));
    let o = p
        .process_batch(q.receive_now(3), &CancellationToken::new())
        .await;
    assert_eq!(labels(&o), ["applied", "dead_lettered", "applied"]);
    assert_eq!(store.state().begins, 1);
    assert_eq!(q.dead_letters().len(), 1);
}

/// A batch stopped (shutdown deadline) before COMMIT rolls back whole: every delivery interrupted and released.
#[tokio::test]
async fn a_batch_stopped_before_commit_rolls_back_whole() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().savepoints = true;
    let stop = CancellationToken::new();
    let s = stop.clone();
    let p = inbox(&store).bind(move |tx: MemTx, msg: Message<Meeting>| {
        let s = s.clone();
        async move {
            tx.write(format!("task-{}", msg.body.opportunity));
            if msg.body.opportunity == "2482" {
                // The deadline passes while this handler runs.
                s.cancel();
                std::future::pending::<()>().await;
            }
            Ok(Handled::done())
        }
    });
    q.send(event("evt-1", "2481"));
    q.send(event("evt-2", "2482"));
    q.send(event("evt-3", "2483"));
    let o = p.process_batch(q.receive_now(3), &stop).await;
    assert_eq!(labels(&o), ["interrupted", "interrupted", "interrupted"]);
    assert!(store.state().effects.is_empty());
    assert!(store.state().markers.is_empty());
    assert_eq!(q.state().visible, 3);
}

/// A business-key function that panics on one message (an index past the end of a hostile body) dead-letters
/// that message as bad input; its batch-mates are applied and nothing is left unsettled.
#[tokio::test]
async fn a_business_key_function_that_panics_dead_letters_its_message_only() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().savepoints = true;
    let p = inbox(&store)
        .bind(|tx: MemTx, msg: Message<Meeting>| async move {
            tx.write(format!("task-{}", msg.body.opportunity));
            Ok(())
        })
        .business_key(|m: &Meeting| {
            let digits: Vec<char> = m.opportunity.chars().collect();
            Some(format!("followup:{}:{}", digits[3], m.meeting))
        });
    // Alone, through the identity policy's key function too.
    let policy_key = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("crm").unwrap()).business_key(|m| {
            let body: serde_json::Value =
                serde_json::from_slice(&m.body).map_err(|e| e.to_string())?;
            Ok(Some(body["opportunity"].as_str().unwrap().to_owned()))
        }),
    )
    .bind(|_tx: MemTx, _msg: Message<Meeting>| async move { Ok(()) });
    q.send(
        OutgoingMessage::new(r#"{"opportunity":7,"meeting":"184"}"#)
            .cloudevent("urn:crm", "evt-0", "t"),
    );
    let o = policy_key
        .process_one(q.receive_now(1).pop().unwrap())
        .await;
    assert!(
        matches!(&o, Outcome::DeadLettered { reason, .. } if reason == "invalid_business_key"),
        "{o:?}"
    );
    q.send(event("evt-1", "2481"));
    q.send(event("evt-2", "24"));
    q.send(event("evt-3", "2483"));
    let o = p
        .process_batch(q.receive_now(3), &CancellationToken::new())
        .await;
    assert_eq!(labels(&o), ["applied", "dead_lettered", "applied"]);
    match &o[1] {
        Outcome::DeadLettered { reason, detail } => {
            assert_eq!(reason, "invalid_business_key");
            assert!(detail.contains("panicked"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        q.state(),
        QueueState {
            dead_lettered: 2,
            ..QueueState::default()
        }
    );
}

/// A batch refused at COMMIT is applied again one delivery at a time from what it already resolved: a
/// delivery identified by its broker id is counted (and warned about) once, not once per pass.
#[tokio::test(flavor = "current_thread")]
async fn a_batch_refused_at_commit_resolves_each_identity_once() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().savepoints = true;
    let p = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("crm").unwrap()).allow_broker_id(true),
    )
    .bind(|tx: MemTx, msg: Message<Meeting>| async move {
        tx.write(format!("task-{}", msg.body.opportunity));
        Ok(())
    });
    q.send(event("evt-1", "2481"));
    assert!(matches!(one(&q, &p).await, Outcome::Applied { .. }));
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    q.send(event("evt-1", "2481"));
    q.send(OutgoingMessage::new(
        r#"{"opportunity":"2490","meeting":"184"}"#,
    ));
    let o = p
        .process_batch(q.receive_now(2), &CancellationToken::new())
        .await;
    assert_eq!(labels(&o), ["duplicate", "applied"]);
    let fallbacks: u64 = counter_total(&snap, m::IDENTITY_BROKER_FALLBACK);
    assert_eq!(fallbacks, 1, "one delivery identified by its broker id");
    assert_eq!(store.state().effects, ["task-2481", "task-2490"]);
}

/// A delivery held behind an earlier message of its FIFO group that the batch released is released too, and
/// counted as a retry like it.
#[tokio::test(flavor = "current_thread")]
async fn a_delivery_held_behind_its_group_is_counted_as_a_retry() {
    let store = MemStore::default();
    store.state().savepoints = true;
    let p = failing_processor(&store);
    // Two queues, so that one batch holds two messages of one group (a queue hands out one at a time).
    let (a, b) = (MemoryQueue::default(), MemoryQueue::default());
    a.send(event("evt-1", "fail").group("opp"));
    b.send(event("evt-2", "2482").group("opp"));
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut batch = a.receive_now(1);
    batch.extend(b.receive_now(1));
    let o = p.process_batch(batch, &CancellationToken::new()).await;
    assert_eq!(labels(&o), ["retry", "retry"]);
    let retries: u64 = counter_total(&snap, m::RETRIES);
    assert_eq!(retries, 2, "both released for a retry");
    assert!(store.state().effects.is_empty());
}

/// A marker the store cannot place yet releases its delivery in the first pass: the later messages of its
/// FIFO group in the batch are released with it (none applied ahead of it), the others applied.
#[tokio::test]
async fn a_delivery_released_in_the_first_pass_holds_its_group_back() {
    let store = MemStore::default();
    store.state().savepoints = true;
    store.state().unplaced.push("evt-1".into());
    let p = failing_processor(&store);
    // Two queues, so that one batch holds two messages of one group (a queue hands out one at a time).
    let (a, b) = (MemoryQueue::default(), MemoryQueue::default());
    a.send(event("evt-1", "2481").group("opp"));
    b.send(event("evt-2", "2482").group("opp"));
    b.send(event("evt-3", "2483"));
    let mut batch = a.receive_now(1);
    batch.extend(b.receive_now(2));
    assert_eq!(batch.len(), 3);
    let o = p.process_batch(batch, &CancellationToken::new()).await;
    assert_eq!(labels(&o), ["retry", "retry", "applied"]);
    assert_eq!(store.state().effects, ["task-2483"]);
    assert_eq!(store.state().markers.len(), 1);
}

/// In a batch, a held copy whose handler fails for good is decided by its holder wherever its failure is
/// met: in the first pass (the batch gives up on it), in the savepoint pass (decided after COMMIT), and one
/// by one on a store without savepoints. Before, each was dead-lettered (`handler_permanent`).
#[tokio::test]
async fn a_held_copy_whose_handler_fails_for_good_in_a_batch_is_decided_by_its_holder() {
    use std::sync::atomic::{AtomicU8, Ordering};
    for savepoints in [true, false] {
        let (store, q) = (MemStore::default(), MemoryQueue::default());
        store.state().answers_holders = true;
        store.state().savepoints = savepoints;
        let mode = Arc::new(AtomicU8::new(0));
        let p = failing_for_good(&store, mode.clone());
        q.send(event("evt-1", "2481"));
        assert_eq!(
            labels(
                &p.process_batch(q.receive_now(1), &CancellationToken::new())
                    .await
            ),
            ["applied"]
        );
        mode.store(1, Ordering::SeqCst);
        // The copy fails first (the first pass gives up), then a new message, then a business duplicate.
        q.send(event("evt-1", "2481"));
        q.send(event("evt-4", "4444"));
        q.send(event("evt-2", "2481"));
        let o = p
            .process_batch(q.receive_now(3), &CancellationToken::new())
            .await;
        assert_eq!(
            labels(&o),
            ["duplicate", "dead_lettered", "business_duplicate"],
            "savepoints: {savepoints}"
        );
        assert_eq!(
            o[0],
            Outcome::Duplicate {
                result_reference: Some("task-2481".into())
            }
        );
        assert_eq!(store.state().effects, ["task-2481"]);
        assert_eq!(store.state().holder_reads, 3);
    }
}

/// A message of a FIFO group is held back only behind an earlier message of its group that the batch
/// released, never behind a later one: the earlier message applies, as one delivery after the other would.
/// Before, the savepoint pass held back every message of a group that had a released message anywhere in the
/// batch (`["retry", "retry", "applied"]`): a message ahead of a failing one was released each time with it.
#[tokio::test]
async fn a_later_message_released_does_not_hold_back_an_earlier_one_of_its_group() {
    for savepoints in [true, false] {
        let store = MemStore::default();
        store.state().savepoints = savepoints;
        let p = failing_processor(&store);
        // Two queues, so that one batch holds two messages of one group (a queue hands out one at a time).
        let (a, b) = (MemoryQueue::default(), MemoryQueue::default());
        a.send(event("evt-1", "2481").group("opp"));
        b.send(event("evt-2", "fail").group("opp"));
        b.send(event("evt-3", "2483"));
        let mut batch = a.receive_now(1);
        batch.extend(b.receive_now(2));
        assert_eq!(batch.len(), 3);
        let o = p.process_batch(batch, &CancellationToken::new()).await;
        assert_eq!(
            labels(&o),
            ["applied", "retry", "applied"],
            "savepoints: {savepoints}"
        );
        assert_eq!(store.state().effects, ["task-2481", "task-2483"]);
    }
}

/// A batch handed over with its stop already signalled (prefetched deliveries at shutdown, a batch whose slot
/// came after the deadline) is handed back whole, as one delivery is: nothing is validated, dead-lettered or
/// applied. Before, a delivery with bad input was dead-lettered (`["dead_lettered", "interrupted"]`) while
/// alone it is released (`interrupted`).
#[tokio::test]
async fn a_batch_stopped_before_it_starts_hands_every_delivery_back() {
    let (store, q) = (MemStore::default(), MemoryQueue::default());
    store.state().savepoints = true;
    let p = processor(&store);
    let stop = CancellationToken::new();
    stop.cancel();
    q.send(OutgoingMessage::new("not json").cloudevent("urn:crm", "evt-bad", "crm.meeting.ended"));
    let alone = p
        .process_one_until(q.receive_now(1).pop().unwrap(), &stop)
        .await;
    assert_eq!(alone.label(), "interrupted");
    q.send(event("evt-1", "2481"));
    let o = p.process_batch(q.receive_now(2), &stop).await;
    assert_eq!(labels(&o), ["interrupted", "interrupted"]);
    assert_eq!(store.state().begins, 0);
    assert!(q.dead_letters().is_empty());
    assert_eq!(q.state().visible, 2);
}

/// On a store that checks its markers at commit, the two copies of one message in a batch both run their
/// handler in the first pass. When the second copy fails for good there, it is decided by its holder once the
/// first copy has committed (a duplicate), as one delivery after the other decides it. Before, it was decided
/// before the batch's other deliveries were applied again, found no holder and was dead-lettered
/// (`["applied", "dead_lettered"]`) although its message was applied.
#[tokio::test]
async fn a_copy_failing_for_good_beside_its_message_in_the_batch_is_a_duplicate() {
    use std::sync::atomic::{AtomicU32, Ordering};
    for as_batch in [false, true] {
        let (store, q) = (MemStore::default(), MemoryQueue::default());
        store.state().answers_holders = true;
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        // The second call fails for good (the second copy's, in either order of work).
        let p = inbox(&store).bind(move |tx: MemTx, msg: Message<Meeting>| {
            let call = c.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if call == 2 {
                    return Err(HandlerError::permanent(std::io::Error::other(
                        "the task exists",
                    )));
                }
                tx.write(format!("task-{}", msg.body.opportunity));
                Ok(Handled::reference(format!("task-{}", msg.body.opportunity)))
            }
        });
        q.send(event("evt-1", "2481"));
        q.send(event("evt-1", "2481"));
        let o = if as_batch {
            p.process_batch(q.receive_now(2), &CancellationToken::new())
                .await
        } else {
            let mut o = Vec::new();
            for d in q.receive_now(2) {
                o.push(p.process_one(d).await);
            }
            o
        };
        assert_eq!(labels(&o), ["applied", "duplicate"], "batch: {as_batch}");
        assert_eq!(store.state().effects, ["task-2481"]);
        assert!(q.dead_letters().is_empty());
    }
}
