//! A settle that fails or whose answer is lost after COMMIT: the outcome stays applied, the failure is counted,
//! and whatever the broker redelivers is absorbed.

use std::time::Duration;

use txinbox::mem::{MemoryQueue, QueueState, SettleFault};
use txinbox::Outcome;
use txinbox_cli::lab::{lab_inbox, lab_message, task_handler, CONSUMER};
use txinbox_cli::labdb::LabDb;
use txinbox_e2e::{sqlite_store, MetricTotals};

#[tokio::test]
async fn failed_and_lost_acks_after_commit_are_absorbed() {
    let (metrics, _guard) = MetricTotals::install_local();
    let store = sqlite_store().await;
    let pool = store.pool().clone();
    <sqlx::Sqlite as LabDb>::create_tables(&pool).await.unwrap();
    let inbox = lab_inbox(pool.clone());
    let h = task_handler::<sqlx::Sqlite>();
    let q = MemoryQueue::default();
    q.send(lab_message(0));
    q.send(lab_message(1));

    // The ack fails outright: the message stays with the broker and comes back.
    q.inject_ack_fault(SettleFault::Fail);
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        inbox.process(d, &h).await,
        Outcome::Applied { .. }
    ));
    // The ack takes effect but its answer is lost: nothing comes back.
    q.inject_ack_fault(SettleFault::DropResponse);
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        inbox.process(d, &h).await,
        Outcome::Applied { .. }
    ));
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
        assert_eq!(inbox.process(d, &h).await, Outcome::Duplicate);
    }
    assert_eq!(q.state(), QueueState::default());
    assert_eq!(
        txinbox_store::inspect::inbox_rows(&pool, CONSUMER)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        <sqlx::Sqlite as LabDb>::count_tasks(&pool).await.unwrap(),
        2
    );
}

#[tokio::test]
async fn a_panicking_handler_rolls_back_and_is_retried() {
    let (metrics, _guard) = MetricTotals::install_local();
    let store = sqlite_store().await;
    let pool = store.pool().clone();
    <sqlx::Sqlite as LabDb>::create_tables(&pool).await.unwrap();
    let inbox = lab_inbox(pool.clone());
    let q = MemoryQueue::default();
    q.send(lab_message(0));
    let boom = txinbox_store::handler_fn::<sqlx::Sqlite, _>(|tx, msg| {
        Box::pin(async move {
            <sqlx::Sqlite as LabDb>::insert_task(tx, msg).await?;
            panic!("a bug in the handler");
        })
    });
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        inbox.process(d, &boom).await,
        Outcome::Retry { .. }
    ));
    assert_eq!(
        metrics.counter("txinbox_retries_total", &[("reason", "handler_panic")]),
        1
    );
    assert_eq!(
        <sqlx::Sqlite as LabDb>::count_tasks(&pool).await.unwrap(),
        0,
        "rolled back"
    );
    assert_eq!(
        txinbox_store::inspect::inbox_rows(&pool, CONSUMER)
            .await
            .unwrap(),
        0
    );
    // Released (visibility 0 with the lab's zero backoff): the fixed handler applies it once.
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        inbox.process(d, &task_handler::<sqlx::Sqlite>()).await,
        Outcome::Applied { .. }
    ));
    assert_eq!(
        <sqlx::Sqlite as LabDb>::count_tasks(&pool).await.unwrap(),
        1
    );
}
