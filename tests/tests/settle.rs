//! A settle that fails or whose answer is lost after COMMIT: the outcome stays applied, the failure is counted,
//! and whatever the broker redelivers is absorbed.

use std::time::Duration;

use txinbox::mem::{MemoryQueue, QueueState, SettleFault};
use txinbox::sqlx;
use txinbox::{Handled, HandlerError, Message, Outcome, Tx};
use txinbox_e2e::{sqlite_store, MetricTotals};
use txinbox_lab::lab::{lab_message, lab_processor, task_handler, LabEvent, CONSUMER};
use txinbox_lab::labdb::LabDb;

/// Applies the follow-up task, then panics before returning.
async fn boom(tx: Tx<sqlx::Sqlite>, msg: Message<LabEvent>) -> Result<Handled, HandlerError> {
    <sqlx::Sqlite as LabDb>::insert_task(tx, msg).await?;
    panic!("a bug in the handler");
}

#[tokio::test]
async fn failed_and_lost_acks_after_commit_are_absorbed() {
    let (metrics, _guard) = MetricTotals::install_local();
    let store = sqlite_store().await;
    <sqlx::Sqlite as LabDb>::create_tables(&store)
        .await
        .unwrap();
    let lab = lab_processor(
        store.clone(),
        task_handler::<txinbox::Store<sqlx::Sqlite>>(),
    );
    let q = MemoryQueue::default();
    q.send(lab_message(0));
    q.send(lab_message(1));

    // The ack fails outright: the message stays with the broker and comes back.
    q.inject_ack_fault(SettleFault::Fail);
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(lab.process_one(d).await, Outcome::Applied { .. }));
    // The ack takes effect but its answer is lost: nothing comes back.
    q.inject_ack_fault(SettleFault::DropResponse);
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(lab.process_one(d).await, Outcome::Applied { .. }));
    assert_eq!(
        metrics.counter("txinbox_settle_failures_total", &[("op", "ack")]),
        2
    );
    assert_eq!(
        q.state().in_flight,
        1,
        "only the failed ack left its message behind"
    );

    q.advance(Duration::from_secs(31));
    let again = q.receive_now(10);
    assert_eq!(again.len(), 1);
    for d in again {
        assert!(matches!(
            lab.process_one(d).await,
            Outcome::Duplicate { .. }
        ));
    }
    assert_eq!(q.state(), QueueState::default());
    assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 2);
    assert_eq!(
        <sqlx::Sqlite as LabDb>::count_tasks(&store).await.unwrap(),
        2
    );
}

#[tokio::test]
async fn a_panicking_handler_rolls_back_and_is_retried() {
    let (metrics, _guard) = MetricTotals::install_local();
    let store = sqlite_store().await;
    <sqlx::Sqlite as LabDb>::create_tables(&store)
        .await
        .unwrap();
    let q = MemoryQueue::default();
    q.send(lab_message(0));
    let panicking = lab_processor(store.clone(), boom);
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        panicking.process_one(d).await,
        Outcome::Retry { .. }
    ));
    assert_eq!(
        metrics.counter("txinbox_retries_total", &[("reason", "handler_panic")]),
        1
    );
    assert_eq!(
        <sqlx::Sqlite as LabDb>::count_tasks(&store).await.unwrap(),
        0,
        "rolled back"
    );
    assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 0);
    // Released (visibility 0 with the lab's zero backoff): the fixed handler applies it once.
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        lab_processor(
            store.clone(),
            task_handler::<txinbox::Store<sqlx::Sqlite>>()
        )
        .process_one(d)
        .await,
        Outcome::Applied { .. }
    ));
    assert_eq!(
        <sqlx::Sqlite as LabDb>::count_tasks(&store).await.unwrap(),
        1
    );
}
