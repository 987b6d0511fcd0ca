//! The outbox: rows written in the inbox transaction, relayed after COMMIT; a republish after a relay crash is
//! absorbed downstream because the message id is stable. Also checks the stored result reference.

use std::collections::BTreeMap;

use txinbox::mem::{MemoryQueue, QueueState};
use txinbox::{ConsumerName, HandlerError, IdentityPolicy, OutboxMessage, Outcome};
use txinbox_cli::lab::{lab_inbox, lab_message};
use txinbox_cli::labdb::LabDb;
use txinbox_e2e::{pg_store, sqlite_store};
use txinbox_store::{handler_fn, relay_outbox, Handled, Inbox, RelayReport};

fn followup_created(id: &str) -> OutboxMessage {
    OutboxMessage {
        destination: "crm-events".into(),
        source: "urn:txinbox:crm-followup".into(),
        message_id: format!("task-created-for-{id}"),
        event_type: "crm.task.created".into(),
        group_id: Some("opportunity-2481".into()),
        body: br#"{"task":"follow-up"}"#.to_vec(),
        attributes: BTreeMap::new(),
    }
}

async fn run<DB: LabDb, F>(pool: sqlx::Pool<DB>, stored_reference: impl Fn(sqlx::Pool<DB>) -> F)
where
    F: std::future::Future<Output = Option<String>>,
{
    DB::create_tables(&pool).await.unwrap();
    let inbox = lab_inbox(pool.clone());
    let publish = handler_fn::<DB, _>(|tx, msg| {
        Box::pin(async move {
            let done = DB::insert_task(tx, msg).await?;
            Ok::<_, HandlerError>(done.publish(followup_created(&msg.identity.message_id)))
        })
    });
    let rollback = handler_fn::<DB, _>(|_, msg| {
        Box::pin(async move {
            // Asks to publish, then fails: the outbox row must roll back with everything else.
            let _ = Handled::done().publish(followup_created(&msg.identity.message_id));
            Err(HandlerError::retry("CRM unavailable"))
        })
    });
    let q = MemoryQueue::default();
    q.send(lab_message(0));
    q.send(lab_message(1));
    let d = q.receive_now(1).pop().unwrap();
    let applied = inbox.process(d, &publish).await;
    let task_ref = match applied {
        Outcome::Applied {
            result_reference: Some(r),
        } => r,
        other => panic!("{other:?}"),
    };
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        inbox.process(d, &rollback).await,
        Outcome::Retry { .. }
    ));

    let stored = stored_reference(pool.clone()).await;
    assert_eq!(
        stored,
        Some(task_ref),
        "the result reference is stored with the marker"
    );

    // Relay: one row (the rolled-back one never existed); a second relay publishes nothing more.
    let downstream = MemoryQueue::default();
    assert_eq!(
        relay_outbox(&pool, &downstream, 10).await.unwrap(),
        RelayReport {
            relayed: 1,
            failed: 0
        }
    );
    assert_eq!(
        relay_outbox(&pool, &downstream, 10).await.unwrap(),
        RelayReport::default()
    );
    let got = downstream.receive_now(10);
    assert_eq!(got.len(), 1);
    let m = txinbox::Delivery::message(&got[0]);
    assert_eq!(m.attribute("ce-id"), Some("task-created-for-evt-482"));
    assert_eq!(m.attribute("ce-source"), Some("urn:txinbox:crm-followup"));
    assert_eq!(m.group_id.as_deref(), Some("opportunity-2481"));

    // The downstream consumer's inbox absorbs a republish of the same outbox message.
    let consumer = Inbox::new(
        pool.clone(),
        IdentityPolicy::new(ConsumerName::new("crm-notifier").unwrap()),
    );
    let count =
        handler_fn::<DB, _>(|_, _| Box::pin(async { Ok::<_, HandlerError>(Handled::done()) }));
    let first = got.into_iter().next().unwrap();
    let pending = txinbox::OutboxMessage {
        ..followup_created("evt-482")
    };
    txinbox::Publisher::publish(&downstream, &pending)
        .await
        .unwrap();
    assert!(matches!(
        consumer.process(first, &count).await,
        Outcome::Applied { .. }
    ));
    let again = downstream.receive_now(1).pop().unwrap();
    assert_eq!(consumer.process(again, &count).await, Outcome::Duplicate);
    assert_eq!(downstream.state(), QueueState::default());
}

#[tokio::test]
async fn outbox_rows_commit_with_the_change_and_relay_after_commit_on_sqlite() {
    run(sqlite_store().await.pool().clone(), |p| async move {
        sqlx::query_scalar(
            "SELECT result_reference FROM txinbox_inbox WHERE message_id = 'evt-482'",
        )
        .fetch_one(&p)
        .await
        .unwrap()
    })
    .await;
}

#[tokio::test]
async fn outbox_rows_commit_with_the_change_and_relay_after_commit_on_postgres() {
    run(pg_store(2).await.pool().clone(), |p| async move {
        sqlx::query_scalar(
            "SELECT result_reference FROM txinbox_inbox WHERE message_id = 'evt-482'",
        )
        .fetch_one(&p)
        .await
        .unwrap()
    })
    .await;
}
