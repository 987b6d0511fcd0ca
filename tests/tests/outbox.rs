//! The outbox: messages to publish are effects written in the inbox transaction and published after COMMIT by
//! the effect runner; a republish is absorbed downstream because the message id is stable. Also checks the
//! stored result reference.

use std::collections::BTreeMap;

use txinbox::effects::PublishEffect;
use txinbox::mem::{MemoryQueue, QueueState};
use txinbox::sqlx;
use txinbox::{
    ConsumerName, EffectRunner, EffectState, Handled, HandlerError, IdentityPolicy, Inbox, Message,
    OutboxMessage, Outcome, Raw, Store, Tx,
};
use txinbox_e2e::{pg_store, sqlite_store};
use txinbox_lab::lab::{lab_message, lab_processor, LabEvent};
use txinbox_lab::labdb::LabDb;

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

async fn run<DB: LabDb, F>(store: Store<DB>, stored_reference: impl Fn(sqlx::Pool<DB>) -> F)
where
    F: std::future::Future<Output = Option<String>>,
{
    DB::create_tables(&store).await.unwrap();
    let pool = store.pool().clone();
    let publish = lab_processor(
        store.clone(),
        |tx: Tx<DB>, msg: Message<LabEvent>| async move {
            let id = msg.identity.message_id.clone();
            let done = DB::insert_task(tx, msg).await?;
            Ok::<_, HandlerError>(done.publish(followup_created(&id)))
        },
    );
    let rollback = lab_processor(
        store.clone(),
        |_tx: Tx<DB>, msg: Message<LabEvent>| async move {
            // Asks to publish, then fails: the outbox row must roll back with everything else.
            let _ = Handled::done().publish(followup_created(&msg.identity.message_id));
            Err::<Handled, _>(HandlerError::retry("CRM unavailable"))
        },
    );
    let q = MemoryQueue::default();
    q.send(lab_message(0));
    q.send(lab_message(1));
    let d = q.receive_now(1).pop().unwrap();
    let applied = publish.process_one(d).await;
    let task_ref = match applied {
        Outcome::Applied {
            result_reference: Some(r),
        } => r,
        other => panic!("{other:?}"),
    };
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        rollback.process_one(d).await,
        Outcome::Retry { .. }
    ));

    let stored = stored_reference(pool.clone()).await;
    assert_eq!(
        stored,
        Some(task_ref),
        "the result reference is stored with the marker"
    );

    // The runner publishes one message (the rolled-back one never existed); a second run publishes nothing.
    let downstream = MemoryQueue::default();
    let runner =
        EffectRunner::new(store.clone()).executor("crm-events", PublishEffect(downstream.clone()));
    let first_run = runner.run_until_idle().await;
    assert_eq!(
        (first_run.claimed, first_run.count(EffectState::Done)),
        (1, 1),
        "{first_run}"
    );
    let second_run = runner.run_until_idle().await;
    assert_eq!(second_run.claimed, 0, "{second_run}");
    let got = downstream.receive_now(10);
    assert_eq!(got.len(), 1);
    let m = txinbox::broker::Delivery::message(&got[0]);
    assert_eq!(m.attribute("ce-id"), Some("task-created-for-evt-482"));
    assert_eq!(m.attribute("ce-source"), Some("urn:txinbox:crm-followup"));
    assert_eq!(m.group_id.as_deref(), Some("opportunity-2481"));

    // The downstream consumer's inbox absorbs a republish of the same outbox message.
    let consumer = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("crm-notifier").unwrap()),
    );
    let count = |_tx: Tx<DB>, _msg: Message<Raw>| async { Ok::<_, HandlerError>(Handled::done()) };
    let first = got.into_iter().next().unwrap();
    let pending = txinbox::OutboxMessage {
        ..followup_created("evt-482")
    };
    txinbox::effects::Publisher::publish(&downstream, &pending)
        .await
        .unwrap();
    assert!(matches!(
        consumer.process(first, &count).await,
        Outcome::Applied { .. }
    ));
    let again = downstream.receive_now(1).pop().unwrap();
    assert!(matches!(
        consumer.process(again, &count).await,
        Outcome::Duplicate { .. }
    ));
    assert_eq!(downstream.state(), QueueState::default());
}

#[tokio::test]
async fn outbox_rows_commit_with_the_change_and_relay_after_commit_on_sqlite() {
    run(sqlite_store().await, |p| async move {
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
    run(pg_store(2).await, |p| async move {
        sqlx::query_scalar(
            "SELECT result_reference FROM txinbox_inbox WHERE message_id = 'evt-482'",
        )
        .fetch_one(&p)
        .await
        .unwrap()
    })
    .await;
}
