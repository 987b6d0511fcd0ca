//! Batch mode on SQLite and PostgreSQL: the failure windows of batch mode (a crash before BEGIN, mid-batch, after
//! COMMIT before any settle, two batches sharing a message, a batch of mixed failures beside good messages,
//! shutdown with batches in flight), each on a fresh database, with batches of 10 and of 3; and a FIFO group
//! whose earlier message fails holds its later one back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use txinbox_core::mem::{MemoryQueue, QueueOptions, QueueState};
use txinbox_core::{
    BrokerError, CancellationToken, DeadLetter, Delivery, Handled, Handler, HandlerError, Lease,
    Message, OutcomeKind, ReceivedMessage, Worker, WorkerOptions,
};
use txinbox_store::{Store, Tx};
use txinbox_testkit::lab::{lab_message, lab_processor, LabEvent, Target};
use txinbox_testkit::labdb::LabDb;
use txinbox_testkit::windows::{run_on_batch, Window};

async fn windows_on(target: Target, batch: usize) {
    let mut failed = Vec::new();
    for w in Window::BATCH {
        let row = run_on_batch(&target, w, batch)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", w.name()));
        println!("{row}");
        if !row.ok() {
            failed.push(row.to_string());
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

// Current-thread runtimes: the windows capture metrics with a thread-local recorder.
#[tokio::test(flavor = "current_thread")]
async fn batch_windows_on_sqlite() {
    windows_on(Target::Sqlite("sqlite::memory:".into()), 10).await;
    windows_on(Target::Sqlite("sqlite::memory:".into()), 3).await;
}

#[tokio::test(flavor = "current_thread")]
async fn batch_windows_on_sqlite_file() {
    let dir = std::env::temp_dir().join(format!("txinbox-batch-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("lab.db").display());
    windows_on(Target::Sqlite(url), 10).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "current_thread")]
async fn batch_windows_on_postgres() {
    windows_on(Target::Postgres(txinbox_testkit::pg_url()), 10).await;
    windows_on(Target::Postgres(txinbox_testkit::pg_url()), 3).await;
}

/// Fails the first delivery of `evt-482` (retryable); every other delivery applies.
#[derive(Clone, Copy)]
struct FailFirstOfGroup;

impl<DB: LabDb> Handler<Store<DB>, LabEvent> for FailFirstOfGroup {
    type Output = Handled;
    async fn handle(&self, tx: Tx<DB>, msg: Message<LabEvent>) -> Result<Handled, HandlerError> {
        if msg.identity.message_id == "evt-482" && msg.raw.delivery_count == 1 {
            return Err(HandlerError::retry(std::io::Error::other("not yet")));
        }
        DB::insert_task(tx, msg).await
    }
}

/// A delivery that records how it was settled.
struct Recorded {
    msg: ReceivedMessage,
    log: Arc<Mutex<Vec<String>>>,
}

impl Recorded {
    fn new(i: usize, group: &str, log: &Arc<Mutex<Vec<String>>>) -> Self {
        let out = lab_message(i);
        let mut msg = ReceivedMessage::new(out.body);
        msg.attributes = out.attributes;
        msg.group_id = Some(group.to_owned());
        Self {
            msg,
            log: log.clone(),
        }
    }
    fn note(&self, what: String) {
        let id = self.msg.attribute("ce-id").unwrap_or_default().to_owned();
        self.log.lock().unwrap().push(format!("{id}:{what}"));
    }
}

impl Delivery for Recorded {
    fn message(&self) -> &ReceivedMessage {
        &self.msg
    }
    async fn ack(self) -> Result<(), BrokerError> {
        self.note("ack".into());
        Ok(())
    }
    async fn release(self, delay: Duration) -> Result<(), BrokerError> {
        self.note(format!("release({}s)", delay.as_secs()));
        Ok(())
    }
    async fn dead_letter(self, _: DeadLetter) -> Result<(), BrokerError> {
        self.note("dead_letter".into());
        Ok(())
    }
    fn lease(&self) -> Option<Arc<dyn Lease>> {
        None
    }
}

/// A FIFO group whose earlier message the batch releases holds its later messages of the batch back (an SQS
/// receive may hand out several messages of one group): they are released with the same delay, never
/// applied ahead of it; other groups are not held.
async fn fifo_group_held_back<DB: LabDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let batch = vec![
        Recorded::new(0, "g", &log),
        Recorded::new(1, "h", &log),
        Recorded::new(2, "g", &log),
        Recorded::new(3, "g", &log),
    ];
    let p = txinbox_testkit::lab::lab_inbox(store.clone())
        .retry_backoff(Duration::from_secs(7))
        .bind_handler(FailFirstOfGroup)
        .business_key(txinbox_testkit::lab::followup_business_key);
    let o = p.process_batch(batch, &CancellationToken::new()).await;
    let labels: Vec<_> = o.iter().map(|x| x.label()).collect();
    assert_eq!(labels, ["retry", "applied", "retry", "retry"]);
    let mut settled = log.lock().unwrap().clone();
    settled.sort();
    assert_eq!(
        settled,
        [
            "evt-482:release(7s)",
            "evt-483:ack",
            "evt-484:release(7s)",
            "evt-485:release(7s)"
        ]
    );
    assert_eq!(store.inbox_rows("crm-followup").await.unwrap(), 1);
    assert_eq!(DB::count_tasks(&store).await.unwrap(), 1);
}

#[tokio::test]
async fn fifo_group_held_back_on_sqlite() {
    fifo_group_held_back(txinbox_testkit::sqlite_store().await).await;
}

#[tokio::test]
async fn fifo_group_held_back_on_postgres() {
    fifo_group_held_back(txinbox_testkit::pg_store(4).await).await;
}

#[tokio::test(flavor = "current_thread")]
async fn worker_in_batch_mode_applies_each_message_once_on_sqlite() {
    worker_applies_once(txinbox_testkit::sqlite_store().await).await;
}

#[tokio::test(flavor = "current_thread")]
async fn worker_in_batch_mode_applies_each_message_once_on_postgres() {
    worker_applies_once(txinbox_testkit::pg_store(8).await).await;
}

/// 200 messages, each sent twice, through a worker with batch commit 10 and 32 in flight: each applied once,
/// the copies duplicates, the business table one row per message.
async fn worker_applies_once<DB: LabDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let q = MemoryQueue::new(QueueOptions {
        wait: Duration::from_millis(10),
        ..QueueOptions::default()
    });
    for _ in 0..2 {
        for i in 0..200 {
            q.send(lab_message(i));
        }
    }
    let p = lab_processor(store.clone(), txinbox_testkit::lab::task_handler::<DB>());
    let q2 = q.clone();
    let report = Worker::new(q.receiver(), p)
        .options(WorkerOptions::default().concurrency(32).batch_commit(10))
        .run_until(async move {
            while q2.state() != QueueState::default() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 200, "{report}");
    assert_eq!(report.count(OutcomeKind::Duplicate), 200, "{report}");
    assert_eq!(store.inbox_rows("crm-followup").await.unwrap(), 200);
    assert_eq!(DB::count_tasks(&store).await.unwrap(), 200);
}
