//! Concurrency on PostgreSQL: the unique constraint is the only arbiter.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use txinbox::mem::{MemoryQueue, QueueOptions, QueueState};
use txinbox::sqlx;
use txinbox::{
    Handled, Handler, HandlerError, Message, Outcome, OutcomeKind, PgStore, Tx, Worker,
    WorkerOptions,
};
use txinbox_e2e::pg_store;
use txinbox_lab::lab::{lab_message, lab_processor, task_handler, LabEvent, CONSUMER};
use txinbox_lab::labdb::LabDb;

/// Eight consumers, each on its own pool (separate connections), each delivering the same 40 messages in its
/// own order: exactly one effect per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_consumers_on_separate_connections_apply_each_message_once() {
    const MESSAGES: usize = 40;
    const CONSUMERS: usize = 8;
    let first = pg_store(2).await;
    <sqlx::Postgres as LabDb>::create_tables(&first)
        .await
        .unwrap();
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(first.pool())
        .await
        .unwrap();
    let mut runs = Vec::new();
    let mut queues = Vec::new();
    for c in 0..CONSUMERS {
        let store = PgStore::connect_in_schema(&txinbox_e2e::pg_url(), &schema, 2)
            .await
            .unwrap();
        let q = MemoryQueue::new(QueueOptions {
            wait: Duration::from_millis(10),
            ..QueueOptions::default()
        });
        // A different order per consumer makes the races real.
        for k in 0..MESSAGES {
            q.send(lab_message((k * (c + 3) + c) % MESSAGES));
        }
        queues.push(q.clone());
        let processor = lab_processor(store, task_handler::<txinbox::Store<sqlx::Postgres>>());
        runs.push(tokio::spawn(async move {
            let q2 = q.clone();
            Worker::new(q.receiver(), processor)
                .options(WorkerOptions::default().concurrency(2))
                .run_until(async move {
                    while q2.state() != QueueState::default() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await
        }));
    }
    let mut applied = 0;
    let mut duplicates = 0;
    for r in runs {
        let report = r.await.unwrap();
        assert_eq!(report.total(), MESSAGES as u64, "{report:?}");
        applied += report.count(OutcomeKind::Applied);
        duplicates += report.count(OutcomeKind::Duplicate);
    }
    assert_eq!(applied, MESSAGES as u64);
    assert_eq!(duplicates, (MESSAGES * (CONSUMERS - 1)) as u64);
    let rows = first.inbox_rows(CONSUMER).await.unwrap();
    let effects = <sqlx::Postgres as LabDb>::count_tasks(&first)
        .await
        .unwrap();
    assert_eq!((rows, effects), (MESSAGES as i64, MESSAGES as i64));
    let per_message: Vec<i64> =
        sqlx::query_scalar("SELECT count(*) FROM lab_tasks GROUP BY message_id")
            .fetch_all(first.pool())
            .await
            .unwrap();
    assert!(per_message.iter().all(|&n| n == 1), "{per_message:?}");
    for q in queues {
        assert_eq!(q.state(), QueueState::default());
    }
}

/// Announces it entered, waits for a permit, then fails (retryable) when the message says so, else applies.
#[derive(Clone)]
struct Gated {
    entered: Arc<Semaphore>,
    gate: Arc<Semaphore>,
}

impl Handler<PgStore, LabEvent> for Gated {
    type Output = Handled;

    async fn handle(
        &self,
        tx: Tx<sqlx::Postgres>,
        msg: Message<LabEvent>,
    ) -> Result<Handled, HandlerError> {
        self.entered.add_permits(1);
        self.gate.acquire().await.unwrap().forget();
        if msg.raw.attribute("x-fail").is_some() {
            return Err(HandlerError::retry(
                "the first delivery's dependency timed out",
            ));
        }
        <sqlx::Postgres as LabDb>::insert_task(tx, msg).await
    }
}

/// Waits until a backend of this schema is blocked on a lock while inserting the marker.
async fn wait_for_blocked_insert(pool: &sqlx::PgPool) {
    for _ in 0..500 {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO txinbox_inbox%' AND datname = current_database()",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if blocked > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the second delivery never blocked on the first one's marker");
}

async fn race(first_fails: bool) -> (Outcome, Outcome, i64, i64) {
    let store = pg_store(4).await;
    <sqlx::Postgres as LabDb>::create_tables(&store)
        .await
        .unwrap();
    let q = MemoryQueue::default();
    let first = if first_fails {
        lab_message(0).attribute("x-fail", "1")
    } else {
        lab_message(0)
    };
    q.send(first);
    q.send(lab_message(0));
    let mut got = q.receive_now(2);
    let b = got.pop().unwrap();
    let a = got.pop().unwrap();
    let h = Gated {
        entered: Arc::new(Semaphore::new(0)),
        gate: Arc::new(Semaphore::new(0)),
    };
    let processor = lab_processor(store.clone(), h.clone());
    let pa = processor.clone();
    let ta = tokio::spawn(async move { pa.process_one(a).await });
    h.entered.acquire().await.unwrap().forget();
    let pb = processor.clone();
    let tb = tokio::spawn(async move { pb.process_one(b).await });
    // The second delivery is now blocked inside PostgreSQL on the first one's uncommitted key.
    wait_for_blocked_insert(store.pool()).await;
    assert!(!tb.is_finished());
    h.gate.add_permits(2);
    let oa = ta.await.unwrap();
    let ob = tb.await.unwrap();
    let rows = store.inbox_rows(CONSUMER).await.unwrap();
    let effects = <sqlx::Postgres as LabDb>::count_tasks(&store)
        .await
        .unwrap();
    (oa, ob, rows, effects)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_racing_delivery_waits_then_sees_duplicate() {
    let (a, b, rows, effects) = race(false).await;
    assert!(matches!(a, Outcome::Applied { .. }), "{a:?}");
    assert!(matches!(b, Outcome::Duplicate { .. }), "{b:?}");
    assert_eq!((rows, effects), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_racing_delivery_proceeds_when_the_first_rolls_back() {
    let (a, b, rows, effects) = race(true).await;
    assert!(matches!(a, Outcome::Retry { .. }), "{a:?}");
    assert!(matches!(b, Outcome::Applied { .. }), "{b:?}");
    assert_eq!((rows, effects), (1, 1));
}
