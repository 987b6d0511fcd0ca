//! Batch mode on SQLite and PostgreSQL: the failure windows of batch mode (a crash before BEGIN, mid-batch, after
//! COMMIT before any settle, two batches sharing a message, a batch of mixed failures beside good messages,
//! shutdown with batches in flight), each on a fresh database, with batches of 10 and of 3; and a FIFO group
//! whose earlier message fails holds its later one back; and a batch decides each delivery as the same
//! deliveries one after the other would, every kind of conflict inside the batch included.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions, QueueState};
use txinbox_core::{
    BrokerError, CancellationToken, DeadLetter, Delivery, Handled, Handler, HandlerError, Lease,
    Message, Outcome, OutcomeKind, ReceivedMessage, Worker, WorkerOptions,
};
use txinbox_lab::lab::{lab_message, lab_processor, LabEvent, Target};
use txinbox_lab::labdb::LabDb;
use txinbox_lab::windows::{run_on_batch, Window};
use txinbox_store::{Store, Tx};
use txinbox_testkit::NoopDelivery;

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
    let p = txinbox_lab::lab::lab_inbox(store.clone())
        .retry_backoff(Duration::from_secs(7))
        .bind_handler(FailFirstOfGroup)
        .business_key(txinbox_lab::lab::followup_business_key);
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
    let p = lab_processor(store.clone(), txinbox_lab::lab::task_handler::<Store<DB>>());
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

/// A lab event with its own id, opportunity and meeting (so its payload and business key are chosen).
fn event(id: &str, opportunity: u32, meeting: u32) -> ReceivedMessage {
    let body = serde_json::json!({
        "opportunity": format!("oportunidade_{opportunity}"),
        "meeting": format!("reuniao_{meeting}"),
        "action": "criar_tarefa_followup",
    });
    let out = OutgoingMessage::new(body.to_string()).cloudevent(
        txinbox_lab::lab::SOURCE,
        id,
        "crm.meeting.ended",
    );
    let mut msg = ReceivedMessage::new(out.body);
    msg.attributes = out.attributes;
    msg
}

/// The follow-up task, counting its calls per message id; `fail` ids fail (retryable) every time.
#[derive(Clone)]
struct Counting {
    calls: Arc<Mutex<Vec<String>>>,
    fail: &'static [&'static str],
}

impl<DB: LabDb> Handler<Store<DB>, LabEvent> for Counting {
    type Output = Handled;
    async fn handle(&self, tx: Tx<DB>, msg: Message<LabEvent>) -> Result<Handled, HandlerError> {
        self.calls
            .lock()
            .unwrap()
            .push(msg.identity.message_id.clone());
        if self.fail.contains(&msg.identity.message_id.as_str()) {
            return Err(HandlerError::retry(std::io::Error::other(
                "CRM not reachable",
            )));
        }
        DB::insert_task(tx, msg).await
    }
}

/// Already applied before the batch: `evt-a` (opportunity 1, meeting 1) and `evt-b` (2, 2).
fn applied_before() -> Vec<ReceivedMessage> {
    vec![event("evt-a", 1, 1), event("evt-b", 2, 2)]
}

/// A batch holding every kind of conflict, inside the batch and with what was applied before.
fn mixed_batch() -> Vec<ReceivedMessage> {
    vec![
        event("evt-a", 1, 1),  // duplicate of an applied message
        event("evt-b", 2, 99), // same id, other payload: collision with an applied message
        event("evt-c", 3, 3),  // new
        event("evt-d", 3, 3),  // other id, business key of evt-c in this batch
        event("evt-c", 3, 3),  // evt-c again in this batch
        event("evt-e", 1, 1),  // business key of an applied message
        event("evt-f", 6, 6),  // new
        event("evt-c", 3, 4),  // evt-c with another payload, in this batch
        event("evt-g", 7, 7),  // new
    ]
}

/// The outcomes of `batch` on a fresh store that already applied [`applied_before`], either as one batch or
/// one delivery after the other; with the inbox rows, the tasks, and the handler's calls.
async fn outcomes<DB: LabDb>(
    store: Store<DB>,
    batch: Vec<ReceivedMessage>,
    fail: &'static [&'static str],
    as_batch: bool,
) -> (Vec<String>, i64, i64, Vec<String>) {
    DB::create_tables(&store).await.unwrap();
    let handler = Counting {
        calls: Arc::default(),
        fail,
    };
    let p = txinbox_lab::lab::lab_processor(store.clone(), handler.clone());
    for m in applied_before() {
        assert_eq!(p.process_one(NoopDelivery(m)).await.label(), "applied");
    }
    handler.calls.lock().unwrap().clear();
    let out = if as_batch {
        let deliveries = batch.into_iter().map(NoopDelivery).collect();
        p.process_batch(deliveries, &CancellationToken::new()).await
    } else {
        let mut out = Vec::new();
        for m in batch {
            out.push(p.process_one(NoopDelivery(m)).await);
        }
        out
    };
    let calls = handler.calls.lock().unwrap().clone();
    (
        out.iter().map(|o| o.label().to_owned()).collect(),
        store.inbox_rows("crm-followup").await.unwrap(),
        DB::count_tasks(&store).await.unwrap(),
        calls,
    )
}

/// A batch decides each delivery as the same deliveries one after the other would: every conflict inside the
/// batch and with earlier messages, with every handler succeeding (the first pass alone: each handler runs
/// once) and with one failing (the savepoint pass: the handlers before it run twice, it runs once).
async fn batch_decides_as_one_after_another<DB: LabDb>(fresh: impl Fn() -> BoxStore<DB>) {
    let want = [
        "duplicate",
        "payload_collision",
        "applied",
        "business_duplicate",
        "duplicate",
        "business_duplicate",
        "applied",
        "payload_collision",
        "applied",
    ];
    let alone = outcomes(fresh().await, mixed_batch(), &[], false).await;
    let batched = outcomes(fresh().await, mixed_batch(), &[], true).await;
    assert_eq!(alone.0, want);
    assert_eq!(batched.0, alone.0);
    assert_eq!((batched.1, batched.2), (5, 5), "inbox rows and tasks");
    assert_eq!((alone.1, alone.2), (5, 5));
    assert_eq!(batched.3, ["evt-c", "evt-f", "evt-g"], "each handler once");

    // evt-f fails: retried alone; in the batch too, and the others still apply.
    let alone = outcomes(fresh().await, mixed_batch(), &["evt-f"], false).await;
    let batched = outcomes(fresh().await, mixed_batch(), &["evt-f"], true).await;
    let mut want_fail = want;
    want_fail[6] = "retry";
    assert_eq!(alone.0, want_fail);
    assert_eq!(batched.0, alone.0);
    assert_eq!((batched.1, batched.2), (4, 4), "inbox rows and tasks");
    // The first pass ran evt-c and evt-f, gave up at evt-f; the savepoint pass ran evt-c and evt-g.
    assert_eq!(batched.3, ["evt-c", "evt-f", "evt-c", "evt-g"]);

    // The first message new and failing: its business key goes to the next message carrying it, alone and
    // in the batch alike.
    let first_fails = || {
        vec![
            event("evt-c", 3, 3),
            event("evt-d", 3, 3),
            event("evt-c", 3, 3),
            event("evt-g", 7, 7),
        ]
    };
    let alone = outcomes(fresh().await, first_fails(), &["evt-c"], false).await;
    let batched = outcomes(fresh().await, first_fails(), &["evt-c"], true).await;
    // evt-d takes the business key evt-c could not keep; the copy of evt-c then meets evt-d's key.
    assert_eq!(
        alone.0,
        ["retry", "applied", "business_duplicate", "applied"]
    );
    assert_eq!(batched.0, alone.0);
    assert_eq!((batched.1, batched.2), (alone.1, alone.2));
}

type BoxStore<DB> = futures::future::BoxFuture<'static, Store<DB>>;

#[tokio::test]
async fn batch_decides_as_one_after_another_on_sqlite() {
    batch_decides_as_one_after_another(|| Box::pin(txinbox_testkit::sqlite_store())).await;
}

#[tokio::test]
async fn batch_decides_as_one_after_another_on_postgres() {
    batch_decides_as_one_after_another(|| Box::pin(txinbox_testkit::pg_store(4))).await;
}

/// The outcomes' labels of the lab's messages `ids` (ids of their own, event times 10, 11, ...) through
/// `handler` on `store`, as one batch or one after the other.
async fn in_order<S, H>(store: &S, handler: H, ids: &[&str], as_batch: bool) -> Vec<&'static str>
where
    S: txinbox_core::InboxStore,
    H: Handler<S, LabEvent>,
{
    let messages = ids
        .iter()
        .enumerate()
        .map(|(i, id)| event(id, 10 + i as u32, 10 + i as u32));
    let p = txinbox_lab::lab::lab_processor(store.clone(), handler);
    let out = if as_batch {
        p.process_batch(
            messages.map(NoopDelivery).collect(),
            &CancellationToken::new(),
        )
        .await
    } else {
        let mut out = Vec::new();
        for m in messages {
            out.push(p.process_one(NoopDelivery(m)).await);
        }
        out
    };
    out.iter().map(|o| o.label()).collect()
}

/// The follow-up task, except for `evt-s`: its handler runs a statement that fails, ignores the error and
/// returns `Ok` with no result reference (so that the inbox writes nothing more for it before COMMIT).
#[derive(Clone, Copy)]
struct SwallowsAnError;

macro_rules! swallows_an_error {
    ($db:ty) => {
        impl Handler<Store<$db>, LabEvent> for SwallowsAnError {
            type Output = Handled;
            async fn handle(
                &self,
                tx: Tx<$db>,
                msg: Message<LabEvent>,
            ) -> Result<Handled, HandlerError> {
                if msg.identity.message_id != "evt-s" {
                    return <$db as LabDb>::insert_task(tx, msg).await;
                }
                let failed = sqlx::query("SELECT missing FROM txinbox_no_such_table")
                    .execute(&tx)
                    .await;
                assert!(failed.is_err(), "the statement fails");
                Ok(Handled::done())
            }
        }
    };
}
swallows_an_error!(sqlx::Postgres);
swallows_an_error!(sqlx::Sqlite);

/// A handler that ignores a failed statement and returns `Ok`: on PostgreSQL that statement aborted the
/// transaction, whose COMMIT then rolls back without an error. Its delivery is released (the store error it
/// is, `record result`), never acknowledged as applied, and in a batch the other deliveries apply, as one
/// after the other: whatever the order, every `applied` outcome has its marker and its task. Before, on
/// PostgreSQL, the delivery was acknowledged as applied with nothing committed; in a batch where it came last
/// every delivery of the batch was (`["applied", "applied", "applied"]`, no marker, no task), and where it came
/// first the next handler's statement met the aborted transaction and its delivery was dead-lettered
/// (`handler_permanent`). SQLite keeps a transaction open after a failed statement: the delivery applies.
async fn a_handler_that_ignores_a_failed_statement<DB: LabDb>(
    fresh: impl Fn() -> BoxStore<DB>,
    swallowed: &str,
) where
    SwallowsAnError: Handler<Store<DB>, LabEvent>,
{
    for order in [
        ["evt-1", "evt-2", "evt-s"],
        ["evt-s", "evt-1", "evt-2"],
        ["evt-1", "evt-s", "evt-2"],
    ] {
        for as_batch in [false, true] {
            let store = fresh().await;
            DB::create_tables(&store).await.unwrap();
            let labels = in_order(&store, SwallowsAnError, &order, as_batch).await;
            let want: Vec<&str> = order
                .iter()
                .map(|id| if *id == "evt-s" { swallowed } else { "applied" })
                .collect();
            assert_eq!(labels, want, "{order:?}, batch: {as_batch}");
            let applied = labels.iter().filter(|l| **l == "applied").count() as i64;
            assert_eq!(
                store.inbox_rows("crm-followup").await.unwrap(),
                applied,
                "{order:?}, batch: {as_batch}: a marker per applied delivery"
            );
            let tasks = applied - i64::from(swallowed == "applied");
            assert_eq!(DB::count_tasks(&store).await.unwrap(), tasks);
        }
    }
}

#[tokio::test]
async fn a_handler_that_ignores_a_failed_statement_on_postgres() {
    a_handler_that_ignores_a_failed_statement(|| Box::pin(txinbox_testkit::pg_store(4)), "retry")
        .await;
}

/// The follow-up task, each handler writing through a `Tx` kept by an earlier one (the late write of a task
/// that handler spawned) and noting whether that write went through; `evt-a`'s handler keeps a clone of its
/// `Tx`, and fails on its second run; `evt-b`'s fails on its first.
struct KeepsItsTx<DB: txinbox_store::backend::Backend> {
    kept: Arc<Mutex<Option<Tx<DB>>>>,
    late_writes: Arc<Mutex<Vec<bool>>>,
    runs: Arc<Mutex<Vec<String>>>,
}

impl<DB: txinbox_store::backend::Backend> Clone for KeepsItsTx<DB> {
    fn clone(&self) -> Self {
        Self {
            kept: self.kept.clone(),
            late_writes: self.late_writes.clone(),
            runs: self.runs.clone(),
        }
    }
}

macro_rules! keeps_its_tx {
    ($db:ty) => {
        impl Handler<Store<$db>, LabEvent> for KeepsItsTx<$db> {
            type Output = Handled;
            async fn handle(
                &self,
                tx: Tx<$db>,
                msg: Message<LabEvent>,
            ) -> Result<Handled, HandlerError> {
                let id = msg.identity.message_id.clone();
                let run = {
                    let mut runs = self.runs.lock().unwrap();
                    runs.push(id.clone());
                    runs.iter().filter(|r| **r == id).count()
                };
                let kept = self.kept.lock().unwrap().clone();
                if let Some(kept) = kept {
                    let late = sqlx::query("INSERT INTO lab_tasks (task_id, message_id, business_key, created_at) VALUES ('late', 'evt-a', NULL, 'late')")
                        .execute(&kept)
                        .await;
                    self.late_writes.lock().unwrap().push(late.is_ok());
                }
                if id == "evt-a" {
                    *self.kept.lock().unwrap() = Some(tx.clone());
                }
                match (id.as_str(), run) {
                    ("evt-a", 2) | ("evt-b", 1) => {
                        Err(HandlerError::retry(format!("{id} fails on run {run}")))
                    }
                    _ => <$db as LabDb>::insert_task(tx, msg).await,
                }
            }
        }
    };
}
keeps_its_tx!(sqlx::Postgres);
keeps_its_tx!(sqlx::Sqlite);

/// A handler's `Tx` kept past its return writes nothing more. In a batch the transaction stays open for the
/// handlers after it: `evt-b` fails, the batch is applied again under savepoints, where `evt-a` fails in turn
/// and is rolled back to its savepoint, and `evt-c` runs in the same transaction. A write through the `Tx`
/// `evt-a` kept (a task it spawned) then went in with `evt-c` and was committed, although `evt-a` was released
/// and will write again on its retry (before: the writes through the kept `Tx` went through but the one in
/// the transaction `evt-a`'s first run had ended, `[true, false, true]`). Every `applied` outcome has its marker and its task, nothing else.
async fn a_tx_kept_past_its_handler_writes_nothing<DB: LabDb>(fresh: impl Fn() -> BoxStore<DB>)
where
    KeepsItsTx<DB>: Handler<Store<DB>, LabEvent>,
{
    let store = fresh().await;
    DB::create_tables(&store).await.unwrap();
    let handler = KeepsItsTx::<DB> {
        kept: Arc::default(),
        late_writes: Arc::default(),
        runs: Arc::default(),
    };
    let labels = in_order(&store, handler.clone(), &["evt-a", "evt-b", "evt-c"], true).await;
    assert_eq!(labels, ["retry", "retry", "applied"]);
    assert_eq!(
        *handler.runs.lock().unwrap(),
        ["evt-a", "evt-b", "evt-a", "evt-c"],
        "the first pass gives up at evt-b; the savepoint pass runs evt-a and evt-c"
    );
    let late = handler.late_writes.lock().unwrap().clone();
    assert_eq!(
        late.len(),
        3,
        "every handler after evt-a's first run wrote through its Tx"
    );
    assert!(
        late.iter().all(|ok| !ok),
        "a write through a Tx kept past its handler went through: {late:?}"
    );
    assert_eq!(store.inbox_rows("crm-followup").await.unwrap(), 1);
    assert_eq!(
        DB::count_tasks(&store).await.unwrap(),
        1,
        "a task per applied delivery"
    );
}

#[tokio::test]
async fn a_tx_kept_past_its_handler_writes_nothing_on_postgres() {
    a_tx_kept_past_its_handler_writes_nothing(|| Box::pin(txinbox_testkit::pg_store(4))).await;
}

#[tokio::test]
async fn a_tx_kept_past_its_handler_writes_nothing_on_sqlite() {
    a_tx_kept_past_its_handler_writes_nothing(|| Box::pin(txinbox_testkit::sqlite_store())).await;
}

/// The follow-up task, except for `evt-r`: its handler runs a statement that makes SQLite roll back the whole
/// transaction (`INSERT OR ROLLBACK` meeting a unique key; SQLite does the same on `SQLITE_FULL`, `SQLITE_IOERR`,
/// `SQLITE_BUSY` or `SQLITE_NOMEM` in some statements, and on `RAISE(ROLLBACK)` in a trigger), ignores the error,
/// then, when `.0`, goes on to write its task (returning its error), else returns `Ok` at once.
#[derive(Clone, Copy)]
struct RollsBackAndGoesOn(bool);

impl Handler<Store<sqlx::Sqlite>, LabEvent> for RollsBackAndGoesOn {
    type Output = Handled;
    async fn handle(
        &self,
        tx: Tx<sqlx::Sqlite>,
        msg: Message<LabEvent>,
    ) -> Result<Handled, HandlerError> {
        if msg.identity.message_id == "evt-r" {
            let failed = sqlx::query("INSERT OR ROLLBACK INTO lab_unique (k) VALUES ('taken')")
                .execute(&tx)
                .await;
            assert!(failed.is_err(), "the statement fails");
            if !self.0 {
                return Ok(Handled::done());
            }
        }
        <sqlx::Sqlite as LabDb>::insert_task(tx, msg).await
    }
}

/// SQLite rolls a whole transaction back on some failed statements and runs the statements after it each in a
/// transaction of its own, committed at once ("autocommit mode"). A handler that ignored such a failure and
/// went on wrote its task outside the inbox's transaction: committed without its marker, written again by
/// every redelivery (before: a task per attempt, the delivery released at COMMIT, "cannot commit - no
/// transaction is active"; in a batch the other deliveries' markers went with the rollback while their tasks
/// did not). Now the statements after such a failure are refused, with the failure's own class (a unique key
/// here: permanent, so the handler that returns the refusal is dead-lettered), nothing of the transaction
/// commits, and a handler that returns `Ok` has its delivery released; in a batch the others apply without
/// it. Every `applied` outcome has its marker and its task, and nothing else is written.
#[tokio::test]
async fn a_statement_sqlite_answers_with_a_rollback_ends_the_transaction() {
    for (goes_on, outcome) in [(true, "dead_lettered"), (false, "retry")] {
        for order in [
            ["evt-1", "evt-2", "evt-r"],
            ["evt-r", "evt-1", "evt-2"],
            ["evt-1", "evt-r", "evt-2"],
        ] {
            for as_batch in [false, true] {
                let store = txinbox_testkit::sqlite_store().await;
                <sqlx::Sqlite as LabDb>::create_tables(&store)
                    .await
                    .unwrap();
                sqlx::query("CREATE TABLE lab_unique (k TEXT PRIMARY KEY)")
                    .execute(store.pool())
                    .await
                    .unwrap();
                sqlx::query("INSERT INTO lab_unique (k) VALUES ('taken')")
                    .execute(store.pool())
                    .await
                    .unwrap();
                let labels = in_order(&store, RollsBackAndGoesOn(goes_on), &order, as_batch).await;
                let want: Vec<&str> = order
                    .iter()
                    .map(|id| if *id == "evt-r" { outcome } else { "applied" })
                    .collect();
                assert_eq!(
                    labels, want,
                    "{order:?}, batch: {as_batch}, goes on: {goes_on}"
                );
                assert_eq!(
                    store.inbox_rows("crm-followup").await.unwrap(),
                    2,
                    "{order:?}, batch: {as_batch}: a marker per applied delivery"
                );
                assert_eq!(
                <sqlx::Sqlite as LabDb>::count_tasks(&store).await.unwrap(),
                2,
                "{order:?}, batch: {as_batch}: a task per applied delivery, none written outside the transaction"
            );
            }
        }
    }
}

#[tokio::test]
async fn a_handler_that_ignores_a_failed_statement_on_sqlite() {
    a_handler_that_ignores_a_failed_statement(
        || Box::pin(txinbox_testkit::sqlite_store()),
        "applied",
    )
    .await;
}

/// Two messages of one business key, the first with an empty tenant (`ce-tenantid: ""`) and the second with
/// none: the stores keep them in one tenant, so the second is a business duplicate of the first. In one batch
/// it gets the result reference its holder committed, as it does one after the other (seen failing so on
/// SQLite and PostgreSQL: `result_reference: None` in the batch, the batch taking the two tenants for two).
async fn an_empty_tenant_and_none_hold_one_business_key_in_a_batch<DB: LabDb>(
    fresh: impl Fn() -> BoxStore<DB>,
) {
    let with_empty_tenant = {
        let mut m = event("evt-t1", 8, 8);
        m.attributes.insert("ce-tenantid".into(), String::new());
        m
    };
    let pair = || vec![with_empty_tenant.clone(), event("evt-t2", 8, 8)];
    for as_batch in [false, true] {
        let store = fresh().await;
        DB::create_tables(&store).await.unwrap();
        let handler = Counting {
            calls: Arc::default(),
            fail: &[],
        };
        let p = lab_processor(store.clone(), handler);
        let out = if as_batch {
            let deliveries = pair().into_iter().map(NoopDelivery).collect();
            p.process_batch(deliveries, &CancellationToken::new()).await
        } else {
            let mut out = Vec::new();
            for m in pair() {
                out.push(p.process_one(NoopDelivery(m)).await);
            }
            out
        };
        match &out[..] {
            [Outcome::Applied {
                result_reference: Some(task),
            }, Outcome::BusinessDuplicate {
                holder_message_id,
                result_reference,
            }] => assert_eq!(
                (holder_message_id.as_str(), result_reference.as_deref()),
                ("evt-t1", Some(task.as_str())),
                "in a batch: {as_batch}"
            ),
            other => panic!("in a batch: {as_batch}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_empty_tenant_and_none_hold_one_business_key_in_a_batch_on_sqlite() {
    an_empty_tenant_and_none_hold_one_business_key_in_a_batch(|| {
        Box::pin(txinbox_testkit::sqlite_store())
    })
    .await;
}

#[tokio::test]
async fn an_empty_tenant_and_none_hold_one_business_key_in_a_batch_on_postgres() {
    an_empty_tenant_and_none_hold_one_business_key_in_a_batch(|| {
        Box::pin(txinbox_testkit::pg_store(4))
    })
    .await;
}
