//! The pipeline's decisions, without a database: an in-memory store that checks its unique keys at COMMIT
//! (as a DynamoDB `TransactWriteItems` would), so both conflict paths of the pipeline are exercised.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::*;
use crate::broker::mem::{MemoryQueue, OutgoingMessage, QueueState};
use crate::pipeline::handler::Raw;
use crate::pipeline::handler::{Handled, HandlerError, Message};
use crate::pipeline::identity::IdentityPolicy;
use crate::pipeline::outcome::Outcome;
use crate::store::{Commit, ExistingMarker, InboxStore, MarkerInsert, MarkerRow, Rejection};
use crate::{ConsumerName, Identity};

#[derive(Clone, Debug)]
struct Row {
    message_id: String,
    business_key: Option<String>,
    hash: String,
    processed_at: DateTime<Utc>,
    result_reference: Option<String>,
}

#[derive(Default, Debug)]
struct State {
    /// (consumer, source, message_id) -> row.
    markers: HashMap<(String, String, String), Row>,
    /// Business effects written by handlers.
    effects: Vec<String>,
    rejections: Vec<(&'static str, String)>,
    begins: u32,
    fail_begin: bool,
    /// Whether the store answers savepoints (batch mode); off: one transaction per delivery.
    savepoints: bool,
    /// Savepoints opened.
    savepoints_opened: u32,
}

#[derive(Clone, Default, Debug)]
struct MemStore(Arc<Mutex<State>>);

/// A transaction: what it will write, applied at commit under the unique keys' checks.
#[derive(Clone, Debug, Default)]
struct MemTx(Arc<Mutex<Pending>>);

#[derive(Debug, Default)]
struct Pending {
    markers: Vec<((String, String, String), Row)>,
    effects: Vec<String>,
    /// Savepoints: (markers, effects) written before each.
    marks: Vec<(usize, usize)>,
}

impl MemTx {
    fn write(&self, effect: impl Into<String>) {
        self.0.lock().unwrap().effects.push(effect.into());
    }
}

#[derive(Debug, thiserror::Error)]
#[error("memory store unavailable")]
struct Unavailable;

impl MemStore {
    fn holder(
        st: &State,
        key: &(String, String, String),
        bkey: &Option<String>,
    ) -> Option<ExistingMarker> {
        if let Some(r) = st.markers.get(key) {
            return Some(ExistingMarker::new(
                true,
                r.message_id.clone(),
                r.hash.clone(),
                r.processed_at,
                r.result_reference.clone(),
            ));
        }
        let bkey = bkey.as_ref()?;
        st.markers
            .iter()
            .find(|((c, _, _), r)| *c == key.0 && r.business_key.as_ref() == Some(bkey))
            .map(|(_, r)| {
                ExistingMarker::new(
                    false,
                    r.message_id.clone(),
                    r.hash.clone(),
                    r.processed_at,
                    r.result_reference.clone(),
                )
            })
    }
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }
}

impl InboxStore for MemStore {
    type Tx = MemTx;
    type Error = Unavailable;

    fn name(&self) -> &'static str {
        "memory"
    }
    async fn begin(&self) -> Result<MemTx, Unavailable> {
        let mut st = self.state();
        st.begins += 1;
        if st.fail_begin {
            return Err(Unavailable);
        }
        Ok(MemTx::default())
    }
    async fn insert_marker(
        &self,
        tx: &MemTx,
        row: &MarkerRow<'_>,
    ) -> Result<MarkerInsert, Unavailable> {
        let id = row.identity;
        let key = (
            id.consumer.as_str().to_owned(),
            id.source.clone(),
            id.message_id.clone(),
        );
        let row = Row {
            message_id: id.message_id.clone(),
            // Unique per consumer and tenant, as the stores' index (no tenant = the tenant '').
            business_key: id
                .business_key
                .as_ref()
                .map(|k| format!("{}\u{0}{k}", id.tenant_id.as_deref().unwrap_or(""))),
            hash: row.payload_hash.to_owned(),
            processed_at: row.processed_at,
            result_reference: None,
        };
        // Deferred: the keys are checked at commit.
        tx.0.lock().unwrap().markers.push((key, row));
        Ok(MarkerInsert::Inserted)
    }
    async fn record_result(
        &self,
        tx: &MemTx,
        _: &Identity,
        r: Option<&str>,
        _: &[crate::effects::NewEffect<'_>],
    ) -> Result<(), Unavailable> {
        if let Some((_, row)) = tx.0.lock().unwrap().markers.last_mut() {
            row.result_reference = r.map(str::to_owned);
        }
        Ok(())
    }
    async fn commit(&self, tx: MemTx) -> Result<Commit, Unavailable> {
        let pending = std::mem::take(&mut *tx.0.lock().unwrap());
        let mut st = self.state();
        let before = st.markers.clone();
        for (key, row) in pending.markers {
            if let Some(holder) = Self::holder(&st, &key, &row.business_key) {
                // All or nothing: a conflict anywhere writes nothing.
                st.markers = before;
                return Ok(Commit::Conflict(Some(holder)));
            }
            st.markers.insert(key, row);
        }
        st.effects.extend(pending.effects);
        Ok(Commit::Done)
    }
    async fn savepoint(&self, tx: &MemTx) -> Result<bool, Unavailable> {
        {
            let mut st = self.state();
            if !st.savepoints {
                return Ok(false);
            }
            st.savepoints_opened += 1;
        }
        let mut p = tx.0.lock().unwrap();
        let mark = (p.markers.len(), p.effects.len());
        p.marks.push(mark);
        Ok(true)
    }
    async fn rollback_to_savepoint(&self, tx: &MemTx) -> Result<(), Unavailable> {
        let mut p = tx.0.lock().unwrap();
        let (m, e) = p.marks.last().copied().unwrap_or_default();
        p.markers.truncate(m);
        p.effects.truncate(e);
        Ok(())
    }
    async fn rollback(&self, tx: MemTx, _: bool) -> Result<(), Unavailable> {
        *tx.0.lock().unwrap() = Pending::default();
        Ok(())
    }
    async fn record_rejection(&self, r: &Rejection<'_>) -> Result<(), Unavailable> {
        self.state()
            .rejections
            .push((r.kind.as_str(), r.identity.message_id.clone()));
        Ok(())
    }
    fn is_transient(_: &Unavailable) -> bool {
        true
    }
    fn classify(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
        e.downcast_ref::<Unavailable>().map(|_| true)
    }
}

#[derive(Debug, serde::Deserialize)]
struct Meeting {
    opportunity: String,
    meeting: String,
}

fn event(id: &str, opportunity: &str) -> OutgoingMessage {
    OutgoingMessage::new(format!(
        r#"{{"opportunity":"{opportunity}","meeting":"184"}}"#
    ))
    .cloudevent("urn:crm", id, "crm.meeting.ended")
}

fn inbox(store: &MemStore) -> Inbox<MemStore> {
    Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new("crm").unwrap()),
    )
    .retry_backoff(Duration::from_secs(7))
}

/// A typed handler writing one effect and returning its reference.
fn processor(
    store: &MemStore,
) -> InboxProcessor<MemStore, Meeting, impl Handler<MemStore, Meeting>> {
    inbox(store)
        .bind(|tx: MemTx, msg: Message<Meeting>| async move {
            tx.write(format!("task-{}", msg.body.opportunity));
            Ok(Handled::reference(format!("task-{}", msg.body.opportunity)))
        })
        .business_key(|m: &Meeting| Some(format!("followup:{}:{}", m.opportunity, m.meeting)))
}

async fn one(
    q: &MemoryQueue,
    p: &InboxProcessor<MemStore, Meeting, impl Handler<MemStore, Meeting>>,
) -> Outcome {
    let d = q.receive_now(1).pop().expect("a delivery");
    p.process_one(d).await
}

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
/// the queue.
async fn released_after<H: Handler<MemStore, Raw>>(
    q: &MemoryQueue,
    p: &InboxProcessor<MemStore, Raw, H>,
    backoff: u64,
) {
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

// ---- batch mode ------------------------------------------------------------------------------------------

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
    let retries: u64 = snap
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == m::RETRIES)
        .map(|(.., v)| match v {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
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

// ---- receive ahead (prefetch) ------------------------------------------------------------------------------

type Running = Arc<(
    std::sync::atomic::AtomicUsize,
    std::sync::atomic::AtomicUsize,
)>;

/// A handler that takes `work` and records how many handlers ran at once, at most.
fn slow_processor(
    store: &MemStore,
    work: Duration,
    running: Running,
) -> InboxProcessor<MemStore, Meeting, impl Handler<MemStore, Meeting>> {
    use std::sync::atomic::Ordering::SeqCst;
    inbox(store).bind(move |tx: MemTx, msg: Message<Meeting>| {
        let running = running.clone();
        async move {
            let now = running.0.fetch_add(1, SeqCst) + 1;
            running.1.fetch_max(now, SeqCst);
            tokio::time::sleep(work).await;
            running.0.fetch_sub(1, SeqCst);
            tx.write(format!("task-{}", msg.body.opportunity));
            Ok(Handled::done())
        }
    })
}

/// Runs `n` messages through a worker of concurrency 4 with `prefetch`; returns (most handlers at once, most
/// messages the queue saw in flight at once, the report).
async fn run_with_prefetch(n: usize, prefetch: usize) -> (usize, usize, crate::WorkerReport) {
    use crate::broker::mem::QueueOptions;
    use crate::{Worker, WorkerOptions};
    let store = MemStore::default();
    let q = MemoryQueue::new(
        QueueOptions::default()
            .wait(Duration::from_millis(20))
            .round_trip(Duration::from_millis(5))
            // Shorter than a prefetched delivery waits for its slot (up to three handlers' work, 720 ms): only
            // the lease keeper keeps it. It renews every third (200 ms), so a renewal would have to be late by
            // 400 ms for the lease to lapse: a loaded machine's scheduling does not do that (with 150 ms and
            // 60 ms of work, a renewal 100 ms late under the test command's load lost eight leases).
            .visibility_timeout(Duration::from_millis(600)),
    );
    for i in 0..n {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let running: Running = Arc::default();
    let report = Worker::new(
        q.receiver(),
        slow_processor(&store, Duration::from_millis(240), running.clone()),
    )
    .options(
        WorkerOptions::default()
            .concurrency(4)
            .batch_size(10)
            .prefetch(prefetch),
    )
    .run_until_idle()
    .await;
    assert_eq!(store.state().effects.len(), n, "{report}");
    assert_eq!(q.state(), QueueState::default(), "{report}");
    let most = running.1.load(std::sync::atomic::Ordering::SeqCst);
    (most, q.in_flight_max(), report)
}

/// Without prefetch a receive asks only for free slots: the queue never sees more than `concurrency` in
/// flight. With it, up to `concurrency + prefetch` are out of the queue, still at most `concurrency` handlers
/// run at once, and the waiting deliveries keep their leases (no redelivery, no lost lease).
#[tokio::test]
async fn prefetch_receives_ahead_within_its_bound_and_keeps_the_leases() {
    use crate::OutcomeKind;
    let (handlers, held, report) = run_with_prefetch(40, 0).await;
    assert!(handlers <= 4 && held <= 4, "{handlers} {held}");
    assert_eq!(report.count(OutcomeKind::Applied), 40);

    let (handlers, held, report) = run_with_prefetch(40, 12).await;
    assert!(handlers <= 4, "{handlers} handlers at once");
    assert!(held > 4 && held <= 16, "{held} in flight at once");
    assert_eq!(report.count(OutcomeKind::Applied), 40, "{report}");
    assert_eq!(report.total(), 40, "no redelivery: {report}");
    assert_eq!(report.leases_lost, 0);
}

/// A batch larger than the worker's concurrency (prefetch lets a receive bring more than the slots) takes
/// every slot and still runs.
#[tokio::test]
async fn a_batch_larger_than_the_concurrency_takes_every_slot() {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker, WorkerOptions};
    let store = MemStore::default();
    store.state().savepoints = true;
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    for i in 0..30 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let report = Worker::new(q.receiver(), processor(&store))
        .options(
            WorkerOptions::default()
                .concurrency(2)
                .prefetch(10)
                .batch_size(10)
                .batch_commit(10),
        )
        .run_until_idle()
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 30, "{report}");
    assert_eq!(q.state(), QueueState::default());
}

/// Ten messages; a worker of concurrency 1 and prefetch 5 whose handler takes `work`, stopped once it holds
/// six (one being applied, five waiting for the slot), with `deadline` to drain. Returns the report, the
/// effects written and the queue's (visible, in flight) after the worker stopped.
async fn stop_with_prefetch(
    work: Duration,
    deadline: Duration,
) -> (crate::WorkerReport, usize, (usize, usize)) {
    use crate::broker::mem::QueueOptions;
    use crate::{Worker, WorkerOptions};
    let store = MemStore::default();
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    for i in 0..10 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let worker = Worker::new(q.receiver(), slow_processor(&store, work, Arc::default())).options(
        WorkerOptions::default()
            .concurrency(1)
            .prefetch(5)
            .shutdown_timeout(deadline)
            .shutdown_receive_wait(Some(Duration::ZERO)),
    );
    let q2 = q.clone();
    let report = worker
        .run_until(async move {
            while q2.state().in_flight < 6 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    let effects = store.state().effects.len();
    let s = q.state();
    (report, effects, (s.visible, s.in_flight))
}

/// A handler that never ends: at the shutdown deadline it is rolled back and released; the prefetched
/// deliveries behind it were released when shutdown began. None is applied, none is left to its visibility
/// timeout.
#[tokio::test]
async fn at_the_deadline_the_running_delivery_and_the_prefetched_ones_are_released() {
    use crate::OutcomeKind;
    let (report, effects, queue) =
        stop_with_prefetch(Duration::from_secs(3600), Duration::from_millis(200)).await;
    assert_eq!(report.count(OutcomeKind::Interrupted), 6, "{report}");
    assert_eq!(effects, 0);
    assert_eq!(queue, (10, 0));
}

/// When shutdown begins, the delivery being applied finishes (applied, settled) and the prefetched ones still
/// waiting for a slot are handed back at once, unapplied, long before the shutdown deadline.
#[tokio::test]
async fn at_shutdown_prefetched_deliveries_waiting_for_a_slot_are_handed_back() {
    use crate::OutcomeKind;
    let (report, effects, queue) =
        stop_with_prefetch(Duration::from_millis(300), Duration::from_secs(3600)).await;
    assert_eq!(report.count(OutcomeKind::Applied), 1, "{report}");
    assert_eq!(report.count(OutcomeKind::Interrupted), 5, "{report}");
    assert_eq!(effects, 1);
    assert_eq!(queue, (9, 0));
}

/// `txinbox_worker_deliveries` (processing, waiting) from the debugging recorder. A snapshot swaps each gauge
/// to zero: the values are the sums of the snapshots, kept in `sums`.
fn gauges(
    snap: &metrics_util::debugging::Snapshotter,
    sums: &mut HashMap<String, f64>,
) -> (f64, f64) {
    use metrics_util::debugging::DebugValue;
    for (key, _, _, value) in snap.snapshot().into_vec() {
        if let (DebugValue::Gauge(v), true) =
            (value, key.key().name() == crate::metrics::WORKER_DELIVERIES)
        {
            let state = key.key().labels().find(|l| l.key() == "state").unwrap();
            *sums.entry(state.value().to_owned()).or_default() += v.into_inner();
        }
    }
    let get = |s: &str| sums.get(s).copied().unwrap_or(f64::NAN);
    (get("processing"), get("waiting"))
}

/// Runs `worker` until `txinbox_worker_deliveries` reads `want` (processing, waiting), then stops it; returns
/// what the gauges read once it stopped.
async fn stop_at_gauges<R, P>(
    worker: crate::Worker<R, P>,
    snap: &metrics_util::debugging::Snapshotter,
    want: (f64, f64),
) -> (f64, f64)
where
    R: crate::Receiver,
    P: crate::Processor<crate::LeasedDelivery<R::Delivery>>,
{
    let sums = Arc::new(Mutex::new(HashMap::new()));
    let (s2, sums2) = (snap.clone(), sums.clone());
    let _report = worker
        .run_until(async move {
            while gauges(&s2, &mut sums2.lock().unwrap()) != want {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
    let after = gauges(snap, &mut sums.lock().unwrap());
    after
}

/// `txinbox_worker_deliveries{state}` counts the deliveries waiting for a slot and those holding one while
/// the worker runs, and returns to zero when it stops.
#[tokio::test(flavor = "current_thread")]
async fn the_worker_counts_the_deliveries_it_holds_by_state() {
    use crate::broker::mem::QueueOptions;
    use crate::{Worker, WorkerOptions};
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemStore::default();
    let q = MemoryQueue::new(QueueOptions::default().wait(Duration::from_millis(20)));
    for i in 0..10 {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    let worker = Worker::new(
        q.receiver(),
        slow_processor(&store, Duration::from_secs(3600), Arc::default()),
    )
    .options(
        WorkerOptions::default()
            .concurrency(2)
            .prefetch(4)
            .shutdown_timeout(Duration::from_millis(100))
            .shutdown_receive_wait(Some(Duration::ZERO)),
    );
    // Stop once the worker holds two handlers and four deliveries behind them.
    assert_eq!(stop_at_gauges(worker, &snap, (2.0, 4.0)).await, (0.0, 0.0));
}

// ---- batch linger ----------------------------------------------------------------------------------------

/// A store with savepoints and a queue (long polls of `wait`) holding `n` events, `evt-0` on.
/// A queue of these options holding `n` events (`evt-0`, `evt-1`, ...), each for its own opportunity.
fn queue_of(opts: crate::broker::mem::QueueOptions, n: usize) -> MemoryQueue {
    let q = MemoryQueue::new(opts);
    for i in 0..n {
        q.send(event(&format!("evt-{i}"), &format!("op-{i}")));
    }
    q
}

fn batch_setup(wait: Duration, n: usize) -> (MemStore, MemoryQueue) {
    let store = MemStore::default();
    store.state().savepoints = true;
    (
        store,
        queue_of(crate::broker::mem::QueueOptions::default().wait(wait), n),
    )
}

/// Six messages, each receive bringing one (`batch_size(1)`), batch commit 3: without a linger every receive
/// is its own transaction; with one, three receives fill one transaction, and every message is applied once.
#[tokio::test]
async fn a_linger_gathers_the_deliveries_of_several_receives_into_one_transaction() {
    use crate::{OutcomeKind, Worker, WorkerOptions};
    for (linger, transactions) in [(Duration::ZERO, 6), (Duration::from_secs(1), 2)] {
        let (store, q) = batch_setup(Duration::from_millis(20), 6);
        let report = Worker::new(q.receiver(), processor(&store))
            .options(
                WorkerOptions::default()
                    .batch_size(1)
                    .batch_commit(3)
                    .batch_linger(linger),
            )
            .run_until_idle()
            .await;
        assert_eq!(report.count(OutcomeKind::Applied), 6, "{report}");
        assert_eq!(report.total(), 6, "{report}");
        assert_eq!(store.state().begins, transactions, "linger {linger:?}");
        assert_eq!(store.state().effects.len(), 6);
        assert_eq!(q.state(), QueueState::default());
    }
}

/// A [`Receiver`](crate::Receiver) that counts the receives that have returned.
struct CountingReceiver {
    inner: crate::broker::mem::MemoryReceiver,
    returned: Arc<std::sync::atomic::AtomicUsize>,
}

impl CountingReceiver {
    /// A counting receiver on `q`, and its count.
    fn on(q: &MemoryQueue) -> (Self, Arc<std::sync::atomic::AtomicUsize>) {
        let returned = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = Self {
            inner: q.receiver(),
            returned: returned.clone(),
        };
        (r, returned)
    }
}

impl crate::Receiver for CountingReceiver {
    type Delivery = crate::broker::mem::MemoryDelivery;
    async fn receive(&mut self, max: usize) -> Result<Vec<Self::Delivery>, crate::BrokerError> {
        let r = self.inner.receive(max).await;
        self.returned
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        r
    }
}

/// Three messages, then nothing: the next receive long-polls for three seconds. A linger of 50 ms ends while
/// that receive still waits, and the batch is applied then, in one transaction, without waiting for it.
#[tokio::test]
async fn a_linger_ends_at_its_deadline_while_the_next_receive_still_waits() {
    use crate::{OutcomeKind, Worker, WorkerOptions};
    use std::sync::atomic::Ordering::SeqCst;
    let (store, q) = batch_setup(Duration::from_secs(3), 3);
    let (receiver, returned) = CountingReceiver::on(&q);
    let (store2, returned2) = (store.clone(), returned.clone());
    let report = Worker::new(receiver, processor(&store))
        .options(
            WorkerOptions::default()
                .batch_commit(10)
                .batch_linger(Duration::from_millis(50))
                .shutdown_receive_wait(Some(Duration::ZERO)),
        )
        .run_until(async move {
            while store2.state().effects.len() < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Applied while the second receive was still in its long poll.
            assert_eq!(returned2.load(SeqCst), 1, "receives returned");
        })
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 3, "{report}");
    assert_eq!(store.state().begins, 1, "one transaction");
    assert_eq!(returned.load(SeqCst), 1);
    assert_eq!(q.state(), QueueState::default());
}

/// A batch still lingering when shutdown begins is processed at once (applied and settled), not dropped to
/// wait for its visibility timeout, and not kept waiting for the receive in flight: whether the worker was
/// waiting for a free place (concurrency 3: the three lingering deliveries hold every one), or for its next
/// receive, dropped at shutdown (wait zero) or let finish (a long poll of two seconds).
#[tokio::test]
async fn at_shutdown_a_lingering_batch_is_processed_at_once() {
    use crate::{OutcomeKind, Worker, WorkerOptions};
    use std::sync::atomic::Ordering::SeqCst;
    for (concurrency, receive_wait) in [
        (3, Some(Duration::ZERO)),
        (8, Some(Duration::ZERO)),
        (8, None),
    ] {
        let (store, q) = batch_setup(Duration::from_secs(2), 3);
        let (receiver, returned) = CountingReceiver::on(&q);
        // How many receives had returned when the batch was applied.
        let (store2, returned2) = (store.clone(), returned.clone());
        let applied_after = tokio::spawn(async move {
            while store2.state().effects.len() < 3 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            returned2.load(SeqCst)
        });
        let q2 = q.clone();
        let report = Worker::new(receiver, processor(&store))
            .options(
                WorkerOptions::default()
                    .concurrency(concurrency)
                    .batch_commit(10)
                    .batch_linger(Duration::from_secs(1))
                    .shutdown_receive_wait(receive_wait),
            )
            .run_until(async move {
                while q2.state().in_flight < 3 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await;
        let case = format!("concurrency {concurrency}, receive wait {receive_wait:?}");
        assert_eq!(report.count(OutcomeKind::Applied), 3, "{case}: {report}");
        assert_eq!(
            applied_after.await.unwrap(),
            1,
            "{case}: receives returned first"
        );
        assert_eq!(store.state().begins, 1, "{case}: one transaction");
        assert_eq!(q.state(), QueueState::default(), "{case}");
    }
}

/// Deliveries of a lingering batch are counted as `waiting` until the batch goes.
#[tokio::test(flavor = "current_thread")]
async fn a_lingering_batch_is_counted_as_waiting() {
    use crate::{Worker, WorkerOptions};
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (store, q) = batch_setup(Duration::from_millis(20), 3);
    let worker = Worker::new(q.receiver(), processor(&store)).options(
        WorkerOptions::default()
            .batch_commit(10)
            .batch_linger(Duration::from_secs(1))
            .shutdown_receive_wait(Some(Duration::ZERO)),
    );
    assert_eq!(stop_at_gauges(worker, &snap, (0.0, 3.0)).await, (0.0, 0.0));
    assert_eq!(store.state().effects.len(), 3, "applied at shutdown");
}

// ---- receive loops ---------------------------------------------------------------------------------------

/// A receiver that counts the receives in flight at once, at most (forks share the count); one that does not
/// `fork` stands for an adapter that cannot.
#[derive(Clone)]
struct ConcurrentReceives {
    inner: crate::broker::mem::MemoryReceiver,
    forks: bool,
    /// (in flight now, most at once)
    at_once: Arc<(
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    )>,
    /// How many messages each receive asked for, in order.
    asked: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl ConcurrentReceives {
    fn new(q: &MemoryQueue, forks: bool) -> Self {
        Self {
            inner: q.receiver(),
            forks,
            at_once: Arc::default(),
            asked: Arc::default(),
        }
    }
}

impl crate::Receiver for ConcurrentReceives {
    type Delivery = crate::broker::mem::MemoryDelivery;
    async fn receive(&mut self, max: usize) -> Result<Vec<Self::Delivery>, crate::BrokerError> {
        use std::sync::atomic::Ordering::SeqCst;
        self.asked.lock().unwrap().push(max);
        let now = self.at_once.0.fetch_add(1, SeqCst) + 1;
        self.at_once.1.fetch_max(now, SeqCst);
        let r = self.inner.receive(max).await;
        self.at_once.0.fetch_sub(1, SeqCst);
        r
    }
    fn fork(&self) -> Option<Self> {
        self.forks.then(|| self.clone())
    }
}

/// Forty messages through a worker of `opts` (concurrency 8) on a queue whose receives wait and take 20 ms,
/// until idle: every message is applied once and the queue never sees more than the 8 places out of it.
/// Returns the receiver's counts.
async fn forty_through(opts: crate::WorkerOptions, forks: bool) -> ConcurrentReceives {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker};
    let store = MemStore::default();
    let q = queue_of(
        QueueOptions::default()
            .wait(Duration::from_millis(20))
            .round_trip(Duration::from_millis(20)),
        40,
    );
    let receiver = ConcurrentReceives::new(&q, forks);
    let seen = receiver.clone();
    let report = Worker::new(receiver, processor(&store))
        .options(opts.clone().concurrency(8))
        .run_until_idle()
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 40, "{opts:?}: {report}");
    assert_eq!(report.total(), 40, "{opts:?}: {report}");
    assert_eq!(q.state(), QueueState::default());
    assert!(q.in_flight_max() <= 8, "{opts:?}: {}", q.in_flight_max());
    seen
}

/// Receives asking for two messages: one receive loop has one receive in flight at a time; four have up to
/// four, and the queue still never sees more than the 8 places out of it. A receiver that cannot fork runs one
/// loop.
#[tokio::test]
async fn receive_loops_share_the_places_out_of_the_queue() {
    use std::sync::atomic::Ordering::SeqCst;
    for (loops, forks) in [(1, true), (4, true), (4, false)] {
        let opts = crate::WorkerOptions::default()
            .batch_size(2)
            .receive_loops(loops);
        let most = forty_through(opts, forks).await.at_once.1.load(SeqCst);
        if loops == 1 || !forks {
            assert_eq!(most, 1);
        } else {
            assert!(most > 1 && most <= loops, "{most} receives at once");
        }
    }
}

/// Four receive loops asking for 4 messages per receive and committing them as one batch: the places a settled
/// batch frees go to one receive of 4, never split over several receives of one message each (which would
/// cost a receive call and a transaction per message).
#[tokio::test]
async fn the_places_a_settle_frees_go_to_one_receive() {
    let opts = crate::WorkerOptions::default()
        .batch_size(4)
        .batch_commit(4)
        .receive_loops(4);
    let asked = forty_through(opts, true)
        .await
        .asked
        .lock()
        .unwrap()
        .clone();
    assert!(asked.len() >= 10, "{asked:?}");
    assert!(
        asked.iter().all(|&n| n == 4),
        "every receive asks for a whole batch's places: {asked:?}"
    );
}

/// Stopped while its loops receive and its slots are busy, a worker of two receive loops leaves nothing
/// locked: every message is applied or back in the queue.
#[tokio::test]
async fn a_worker_of_several_receive_loops_stops_cleanly() {
    use crate::broker::mem::QueueOptions;
    use crate::{OutcomeKind, Worker, WorkerOptions};
    let store = MemStore::default();
    let q = queue_of(
        QueueOptions::default()
            .wait(Duration::from_millis(200))
            .round_trip(Duration::from_millis(5)),
        20,
    );
    let store2 = store.clone();
    let report = Worker::new(
        q.receiver(),
        slow_processor(&store, Duration::from_millis(100), Arc::default()),
    )
    .options(
        WorkerOptions::default()
            .concurrency(4)
            .prefetch(4)
            .batch_size(2)
            .receive_loops(2),
    )
    .run_until(async move {
        while store2.state().effects.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    let applied = report.count(OutcomeKind::Applied) as usize;
    let s = q.state();
    assert!(applied >= 1, "{report}");
    assert_eq!(s.in_flight, 0, "nothing left locked: {s:?} {report}");
    assert_eq!(applied + s.visible, 20, "{s:?} {report}");
    assert_eq!(store.state().effects.len(), applied);
}
