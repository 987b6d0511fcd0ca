//! The failure windows of the pattern, reproduced with the in-memory broker against a real store.
//!
//! Each window runs on a fresh database and checks, against expected values written here, the inbox rows,
//! the business effects, the broker state, the outcomes and the metrics the window must leave. The
//! external-call windows ([`external`]) run the effect runner against the local CRM API in the shapes public
//! APIs answer in.
//!
//! Metrics are captured with a thread-local recorder, so run the windows on a current-thread runtime.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use txinbox_core::broker::mem::{MemoryQueue, QueueOptions, QueueState};
use txinbox_core::{
    metrics as m, Delivery, Handled, Handler, HandlerError, Message, OutcomeKind, RetentionPolicy,
    Worker, WorkerOptions,
};
use txinbox_store::{Store, Tx};

use crate::faults::{crash_at, FaultPoint, Faults, FaultyStore};
use crate::lab::{
    lab_inbox, lab_message, lab_processor, task_handler, with_fresh, LabError, LabEvent, Target,
    CONSUMER,
};
use crate::labdb::LabDb;
use txinbox_core::EffectState;

pub mod external;

/// A failure window of the pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// An external call (through an effect) done and its answer lost, at a destination that honours the
    /// `Idempotency-Key`.
    ExternalCallAnswerLost,
    /// The same at a destination without idempotency support: only the confirmation query (by external
    /// reference) prevents the repeat.
    ExternalCallAnswerLostNoIdempotency,
    /// The call never reached the destination (a gateway's 502 without forwarding), and the confirmation, a
    /// search answering 200 with an empty list, finds nothing: called again, one task, done.
    ExternalCallNeverReached,
    /// A slow destination following the IETF draft answers 409 to the repeat of a key it is still processing:
    /// not final, never failed; done once it finishes, one task.
    ExternalCallKeyInProgress,
    /// Crash after receive, before BEGIN.
    BeforeTransaction,
    /// Crash after the marker insert, before the business change.
    AfterInsertBeforeChange,
    /// Crash after the business change, before COMMIT.
    AfterChangeBeforeCommit,
    /// Crash after COMMIT, before the settle.
    AfterCommitBeforeSettle,
    /// The lock is lost while the handler runs; the broker redelivers to another worker.
    LockLostDuringWork,
    /// Two copies delivered at once.
    TwoConcurrentDeliveries,
    /// Poisoned to the DLQ by max receive count after a lost settle, then redriven.
    AfterDlqRedrive,
    /// The same id with another payload.
    SameIdOtherPayload,
    /// Another id asking for the same business action.
    OtherIdSameBusinessAction,
    /// Redelivered after the marker's retention expired.
    AfterRetentionExpired,
    /// The worker is shut down with deliveries in flight.
    ShutdownMidFlight,
    /// Batch mode: a crash after receive, before the batch's BEGIN.
    BatchBeforeTransaction,
    /// Batch mode: a crash mid-batch (some deliveries written, the next one in its handler), before COMMIT.
    BatchCrashMidBatch,
    /// Batch mode: a crash after the batch's COMMIT, before any settle: every delivery comes back as a
    /// duplicate.
    BatchAfterCommitBeforeSettle,
    /// Batch mode: two batches in flight at once share a message.
    BatchTwoShareAMessage,
    /// Batch mode: one batch holds a payload collision, a business duplicate, a retryable handler error, a
    /// panic and a permanent handler error beside good messages.
    BatchMixedFailures,
    /// Batch mode: the worker (batch commit) is shut down with batches in flight.
    BatchShutdownMidFlight,
}

impl Window {
    /// Every window, in the order the pattern lists them.
    pub const ALL: [Window; 15] = [
        Window::BeforeTransaction,
        Window::AfterInsertBeforeChange,
        Window::AfterChangeBeforeCommit,
        Window::AfterCommitBeforeSettle,
        Window::LockLostDuringWork,
        Window::TwoConcurrentDeliveries,
        Window::AfterDlqRedrive,
        Window::SameIdOtherPayload,
        Window::OtherIdSameBusinessAction,
        Window::AfterRetentionExpired,
        Window::ShutdownMidFlight,
        Window::ExternalCallAnswerLost,
        Window::ExternalCallAnswerLostNoIdempotency,
        Window::ExternalCallNeverReached,
        Window::ExternalCallKeyInProgress,
    ];

    /// The failure windows of batch mode ([`WorkerOptions::batch_commit`]): `lab --windows --batch N`.
    pub const BATCH: [Window; 6] = [
        Window::BatchBeforeTransaction,
        Window::BatchCrashMidBatch,
        Window::BatchAfterCommitBeforeSettle,
        Window::BatchTwoShareAMessage,
        Window::BatchMixedFailures,
        Window::BatchShutdownMidFlight,
    ];

    /// The window's name.
    pub fn name(self) -> &'static str {
        match self {
            Window::BatchBeforeTransaction => "batch_before_transaction",
            Window::BatchCrashMidBatch => "batch_crash_mid_batch",
            Window::BatchAfterCommitBeforeSettle => "batch_after_commit_before_settle",
            Window::BatchTwoShareAMessage => "batch_two_share_a_message",
            Window::BatchMixedFailures => "batch_mixed_failures",
            Window::BatchShutdownMidFlight => "batch_shutdown_mid_flight",
            Window::BeforeTransaction => "before_transaction",
            Window::AfterInsertBeforeChange => "after_insert_before_change",
            Window::AfterChangeBeforeCommit => "after_change_before_commit",
            Window::AfterCommitBeforeSettle => "after_commit_before_settle",
            Window::LockLostDuringWork => "lock_lost_during_work",
            Window::TwoConcurrentDeliveries => "two_concurrent_deliveries",
            Window::AfterDlqRedrive => "after_dlq_redrive",
            Window::SameIdOtherPayload => "same_id_other_payload",
            Window::OtherIdSameBusinessAction => "other_id_same_business_action",
            Window::AfterRetentionExpired => "after_retention_expired",
            Window::ShutdownMidFlight => "shutdown_mid_flight",
            Window::ExternalCallAnswerLost => "external_call_answer_lost",
            Window::ExternalCallAnswerLostNoIdempotency => "external_call_no_idempotency",
            Window::ExternalCallNeverReached => "external_call_never_reached",
            Window::ExternalCallKeyInProgress => "external_call_key_in_progress",
        }
    }
}

/// What one window left behind.
#[derive(Clone, Debug)]
pub struct WindowRow {
    /// The window.
    pub window: Window,
    /// Inbox rows at the end.
    pub inbox_rows: i64,
    /// Business effects at the end.
    pub business_effects: i64,
    /// Broker state at the end.
    pub broker: QueueState,
    /// The outcomes in order (`crashed > duplicate`, ...).
    pub outcome: String,
    /// Non-zero txinbox counters recorded during the window, by metric name.
    pub signals: BTreeMap<String, u64>,
    /// Rejection evidence rows recorded (payload collisions + business duplicates).
    pub rejections: i64,
    /// Each expectation that did not hold.
    pub failures: Vec<String>,
}

impl WindowRow {
    /// Whether every expectation held.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
    /// A counter's value (0 when absent).
    pub fn signal(&self, name: &str) -> u64 {
        self.signals.get(name).copied().unwrap_or(0)
    }
}

impl fmt::Display for WindowRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let signals: Vec<String> = self
            .signals
            .iter()
            .map(|(k, v)| {
                format!(
                    "{}={v}",
                    k.trim_start_matches("txinbox_").trim_end_matches("_total")
                )
            })
            .collect();
        write!(
            f,
            "{:<31} inbox_rows={:<2} business_effects={:<2} broker[{}] outcome={} signals[{}] {}",
            self.window.name(),
            self.inbox_rows,
            self.business_effects,
            self.broker,
            self.outcome,
            signals.join(" "),
            if self.ok() {
                "ok".to_owned()
            } else {
                format!("FAIL ({})", self.failures.join("; "))
            }
        )
    }
}

/// Runs every window on fresh databases of `target`.
pub async fn run_all(target: &Target) -> Result<Vec<WindowRow>, LabError> {
    let mut rows = Vec::new();
    for w in Window::ALL {
        rows.push(run_on(target, w).await?);
    }
    Ok(rows)
}

/// Runs one window on a fresh database of `target` (a batch window with batches of
/// [`DEFAULT_BATCH`]).
pub async fn run_on(target: &Target, w: Window) -> Result<WindowRow, LabError> {
    run_on_batch(target, w, DEFAULT_BATCH).await
}

/// The batch size of the batch windows unless one is given.
pub const DEFAULT_BATCH: usize = 10;

/// Runs every window, then the batch windows with batches of `batch` deliveries (at least 2; the mixed
/// window uses at least 6), on fresh databases of `target`.
pub async fn run_all_batch(target: &Target, batch: usize) -> Result<Vec<WindowRow>, LabError> {
    if !(2..=txinbox_core::runtime::worker::MAX_BATCH_COMMIT).contains(&batch) {
        return Err(LabError::Usage(format!(
            "--batch must be 2 to {}",
            txinbox_core::runtime::worker::MAX_BATCH_COMMIT
        )));
    }
    let mut rows = run_all(target).await?;
    for w in Window::BATCH {
        rows.push(run_on_batch(target, w, batch).await?);
    }
    Ok(rows)
}

/// Runs one window on a fresh database of `target`, a batch window with batches of `batch` deliveries.
pub async fn run_on_batch(target: &Target, w: Window, batch: usize) -> Result<WindowRow, LabError> {
    with_fresh(
        target,
        move |store| Box::pin(run_window_batch::<sqlx::Sqlite>(store, w, batch)),
        move |store| Box::pin(run_window_batch::<sqlx::Postgres>(store, w, batch)),
    )
    .await
}

/// What a window must leave: inbox rows, business effects, the broker's state, rejection evidence rows, and
/// counters by name.
pub(crate) type Expected = (i64, i64, QueueState, i64, Vec<(&'static str, u64)>);

/// The expectations that did not hold.
pub(crate) struct Checks {
    failures: Vec<String>,
}

impl Checks {
    pub(crate) fn eq<T: PartialEq + fmt::Debug>(&mut self, what: &str, actual: T, expected: T) {
        if actual != expected {
            self.failures
                .push(format!("{what}: got {actual:?}, expected {expected:?}"));
        }
    }
}

fn counters(snap: &Snapshotter) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (key, _, _, value) in snap.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            let name = key.key().name().to_owned();
            if name.starts_with("txinbox_") && n > 0 {
                *out.entry(name).or_default() += n;
            }
        }
    }
    out
}

pub(crate) fn queue(max_receive_count: Option<u32>) -> MemoryQueue {
    MemoryQueue::new(QueueOptions {
        visibility_timeout: Duration::from_secs(30),
        max_receive_count,
        wait: Duration::from_millis(20),
        ..QueueOptions::default()
    })
}

const PAST_VISIBILITY: Duration = Duration::from_secs(31);

/// A handler that announces it has started (the marker is inserted) and waits for a permit before applying.
#[derive(Clone)]
struct Gated {
    entered: Arc<Semaphore>,
    gate: Arc<Semaphore>,
}

impl Gated {
    fn new() -> Self {
        Self {
            entered: Arc::new(Semaphore::new(0)),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
    async fn wait_entered(&self, n: u32) {
        if let Ok(p) = self.entered.acquire_many(n).await {
            p.forget();
        }
    }
    fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

impl<DB: LabDb> Handler<Store<DB>, LabEvent> for Gated {
    type Output = Handled;
    async fn handle(&self, tx: Tx<DB>, msg: Message<LabEvent>) -> Result<Handled, HandlerError> {
        self.entered.add_permits(1);
        if let Ok(p) = self.gate.acquire().await {
            p.forget();
        }
        DB::insert_task(tx, msg).await
    }
}

pub(crate) fn one<D>(mut v: Vec<D>, what: &str) -> Result<D, LabError> {
    v.pop()
        .ok_or_else(|| LabError::Usage(format!("expected a delivery: {what}")))
}

/// Runs window `w` on `pool` (fresh and migrated) and checks its expectations.
pub async fn run_window<DB: LabDb>(store: Store<DB>, w: Window) -> Result<WindowRow, LabError> {
    run_window_batch(store, w, DEFAULT_BATCH).await
}

/// Runs window `w` on `pool` (fresh and migrated), a batch window with batches of `batch` deliveries, and
/// checks its expectations.
pub async fn run_window_batch<DB: LabDb>(
    store: Store<DB>,
    w: Window,
    batch: usize,
) -> Result<WindowRow, LabError> {
    let batch = batch.max(2);
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    DB::create_tables(&store).await?;
    let p = lab_processor(store.clone(), task_handler::<DB>());
    // The same inbox and handler on a store that can crash at an armed point.
    let faults = Faults::new();
    let faulty = lab_processor(
        FaultyStore::new(store.clone(), faults.clone()),
        task_handler::<DB>(),
    );
    let mut c = Checks {
        failures: Vec::new(),
    };
    let rows = |s: Store<DB>| async move { s.inbox_rows(CONSUMER).await };

    let (q, outcome, expect) = match w {
        Window::BeforeTransaction
        | Window::AfterInsertBeforeChange
        | Window::AfterChangeBeforeCommit
        | Window::AfterCommitBeforeSettle => {
            let (point, mid, second) = match w {
                Window::BeforeTransaction => (FaultPoint::BeforeTransaction, 0, "applied"),
                Window::AfterInsertBeforeChange => (FaultPoint::AfterMarkerInsert, 0, "applied"),
                Window::AfterChangeBeforeCommit => (FaultPoint::AfterBusinessChange, 0, "applied"),
                _ => (FaultPoint::AfterCommit, 1, "duplicate"),
            };
            let q = queue(Some(5));
            q.send(lab_message(0));
            let d = one(q.receive_now(1), "first delivery")?;
            let crashed = crash_at(&faulty, &faults, d, point).await;
            c.eq("first attempt crashed", crashed.is_err(), true);
            // What the crash left: a rolled-back transaction leaves nothing; a commit leaves marker and effect.
            c.eq(
                "inbox rows after the crash",
                rows(store.clone()).await?,
                mid,
            );
            c.eq(
                "effects after the crash",
                DB::count_tasks(&store).await?,
                mid,
            );
            c.eq("message still held by the broker", q.state().in_flight, 1);
            q.advance(PAST_VISIBILITY);
            let d = one(q.receive_now(1), "redelivery")?;
            c.eq("redelivery count", d.message().delivery_count, 2);
            let o = p.process_one(d).await;
            c.eq("redelivery outcome", o.label(), second);
            let mut expect = vec![(m::APPLIED, 1)];
            if point == FaultPoint::AfterCommit {
                expect.push((m::DUPLICATES, 1));
            } else {
                expect.push((m::APPLIED_AFTER_REDELIVERY, 1));
            }
            (
                q,
                format!("crashed({point:?}) > {}", o.label()),
                (1, 1, QueueState::default(), 0, expect),
            )
        }
        Window::LockLostDuringWork => {
            let q = queue(Some(5));
            q.send(lab_message(0));
            let a = one(q.receive_now(1), "first delivery")?;
            let lease = a
                .lease()
                .ok_or_else(|| LabError::Usage("memory deliveries have leases".into()))?;
            let gated = Gated::new();
            let pa = lab_processor(store.clone(), gated.clone());
            let ta = tokio::spawn(async move { pa.process_one(a).await });
            gated.wait_entered(1).await;
            // The lease keeper renews every 5 ms (a lease that says 15 ms); the broker's clock jumps past the
            // lock: the next renewal fails.
            let keeper = txinbox_core::runtime::lease::keep_alive(
                Arc::new(QuickLease(lease)),
                txinbox_core::LeaseOptions::default(),
                CONSUMER.into(),
            );
            q.advance(Duration::from_secs(120));
            while !keeper.lost() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let b = one(q.receive_now(1), "redelivery to a second worker")?;
            let pb = lab_processor(store.clone(), gated.clone());
            let tb = tokio::spawn(async move { pb.process_one(b).await });
            gated.open(2);
            let oa = ta.await.map_err(|e| LabError::Usage(e.to_string()))?;
            let ob = tb.await.map_err(|e| LabError::Usage(e.to_string()))?;
            c.eq("first worker", oa.label(), "applied");
            c.eq("second worker", ob.label(), "duplicate");
            (
                q,
                format!("{} (lock lost, ack refused) | {}", oa.label(), ob.label()),
                (
                    1,
                    1,
                    QueueState::default(),
                    0,
                    vec![
                        (m::APPLIED, 1),
                        (m::DUPLICATES, 1),
                        (m::LEASE_LOST, 1),
                        (m::SETTLE_FAILURES, 1),
                        // The lock-lost race is a concurrent conflict: counted by the worker whose ack
                        // was refused.
                        (m::CONCURRENT_CONFLICTS, 1),
                    ],
                ),
            )
        }
        Window::TwoConcurrentDeliveries => {
            let q = queue(Some(5));
            q.send(lab_message(0));
            q.send(lab_message(0));
            let mut both = q.receive_now(2);
            let b = one(both.split_off(1), "second copy")?;
            let a = one(both, "first copy")?;
            let gated = Gated::new();
            let pa = lab_processor(store.clone(), gated.clone());
            let ta = tokio::spawn(async move { pa.process_one(a).await });
            gated.wait_entered(1).await;
            let pb = lab_processor(store.clone(), gated.clone());
            let tb = tokio::spawn(async move { pb.process_one(b).await });
            // Give the second copy time to reach the marker insert and block on the first's key.
            tokio::time::sleep(Duration::from_millis(50)).await;
            gated.open(2);
            let oa = ta.await.map_err(|e| LabError::Usage(e.to_string()))?;
            let ob = tb.await.map_err(|e| LabError::Usage(e.to_string()))?;
            c.eq("first copy", oa.label(), "applied");
            c.eq("second copy", ob.label(), "duplicate");
            (
                q,
                format!("{} | {}", oa.label(), ob.label()),
                (
                    1,
                    1,
                    QueueState::default(),
                    0,
                    vec![
                        (m::APPLIED, 1),
                        (m::DUPLICATES, 1),
                        (m::CONCURRENT_CONFLICTS, 1),
                    ],
                ),
            )
        }
        Window::AfterDlqRedrive => {
            let q = queue(Some(1));
            q.send(lab_message(0));
            let d = one(q.receive_now(1), "first delivery")?;
            let crashed = crash_at(&faulty, &faults, d, FaultPoint::AfterCommit).await;
            c.eq("first attempt crashed after commit", crashed.is_err(), true);
            q.advance(PAST_VISIBILITY);
            c.eq(
                "no redelivery: max receive count reached",
                q.receive_now(1).len(),
                0,
            );
            c.eq("dead-lettered by the broker", q.state().dead_lettered, 1);
            c.eq("redriven", q.redrive(10), 1);
            let d = one(q.receive_now(1), "redriven copy")?;
            let o = p.process_one(d).await;
            c.eq("redriven copy", o.label(), "duplicate");
            (
                q,
                format!(
                    "crashed(AfterCommit) > dlq(max_receive_count) > redrive > {}",
                    o.label()
                ),
                (
                    1,
                    1,
                    QueueState::default(),
                    0,
                    vec![(m::APPLIED, 1), (m::DUPLICATES, 1), (m::REDRIVEN, 1)],
                ),
            )
        }
        Window::SameIdOtherPayload => {
            let q = queue(Some(5));
            q.send(lab_message(0).attribute("x-note", "quantidade 10"));
            let mut altered = lab_message(0);
            let mut body: serde_json::Value =
                serde_json::from_slice(&altered.body).unwrap_or_default();
            body["quantity"] = serde_json::json!(12);
            altered.body = body.to_string().into_bytes();
            q.send(altered);
            let a = one(q.receive_now(1), "first")?;
            let oa = p.process_one(a).await;
            let b = one(q.receive_now(1), "second")?;
            let ob = p.process_one(b).await;
            c.eq("first", oa.label(), "applied");
            c.eq("second", ob.label(), "payload_collision");
            let dl = q.dead_letters();
            c.eq(
                "dead-letter reason",
                dl.first().map(|(_, why)| why.reason.clone()),
                Some("payload_collision".to_owned()),
            );
            c.eq(
                "dead-letter keeps the identity",
                dl.first()
                    .and_then(|(msg, _)| msg.attributes.get("ce-id").cloned()),
                Some("evt-482".to_owned()),
            );
            (
                q,
                format!("{} | {} > dlq", oa.label(), ob.label()),
                (
                    1,
                    1,
                    QueueState {
                        dead_lettered: 1,
                        ..QueueState::default()
                    },
                    1,
                    vec![
                        (m::APPLIED, 1),
                        (m::PAYLOAD_COLLISIONS, 1),
                        (m::DEAD_LETTERS, 1),
                    ],
                ),
            )
        }
        Window::OtherIdSameBusinessAction => {
            let q = queue(Some(5));
            q.send(lab_message(0));
            q.send(lab_message(0).attribute("ce-id", "evt-republished-after-timeout"));
            let a = one(q.receive_now(1), "first")?;
            let oa = p.process_one(a).await;
            let b = one(q.receive_now(1), "second")?;
            let ob = p.process_one(b).await;
            c.eq("first", oa.label(), "applied");
            c.eq("second", ob.label(), "business_duplicate");
            (
                q,
                format!("{} | {}", oa.label(), ob.label()),
                (
                    1,
                    1,
                    QueueState::default(),
                    1,
                    vec![(m::APPLIED, 1), (m::BUSINESS_DUPLICATES, 1)],
                ),
            )
        }
        Window::AfterRetentionExpired => {
            let keep = Duration::from_secs(3600);
            let retention = RetentionPolicy::default().keep(keep);
            let faulty = lab_inbox(FaultyStore::new(store.clone(), faults.clone()))
                .retention(retention.clone())
                .bind_handler(task_handler::<DB>())
                .business_key(crate::lab::followup_business_key);
            let p = lab_inbox(store.clone())
                .retention(retention)
                .bind_handler(task_handler::<DB>())
                .business_key(crate::lab::followup_business_key);
            let q = queue(Some(5));
            q.send(lab_message(0));
            let d = one(q.receive_now(1), "first")?;
            let crashed = crash_at(&faulty, &faults, d, FaultPoint::AfterCommit).await;
            c.eq("first attempt crashed after commit", crashed.is_err(), true);
            // Two hours later: the marker's retention ended and the purge ran; then the message comes back.
            let later = chrono::Utc::now() + chrono::Duration::hours(2);
            let purge = txinbox_core::Maintenance::new(store.clone())
                .run_once_at(later, &mut |_| {})
                .await;
            c.eq(
                "markers purged",
                purge.removed_from(txinbox_core::runtime::maintenance::Table::Markers),
                1,
            );
            q.advance(Duration::from_secs(7200));
            let d = one(q.receive_now(1), "late redelivery")?;
            let o = p.process_one(d).await;
            c.eq("late redelivery refused", o.label(), "dead_lettered");
            (
                q,
                format!("crashed(AfterCommit) > purge > {o}"),
                (
                    0,
                    1,
                    QueueState {
                        dead_lettered: 1,
                        ..QueueState::default()
                    },
                    0,
                    vec![
                        (m::APPLIED, 1),
                        (m::RETENTION_PURGED, 1),
                        (m::RETENTION_EXPIRED, 1),
                        (m::DEAD_LETTERS, 1),
                    ],
                ),
            )
        }
        Window::ShutdownMidFlight => {
            let q = queue(Some(5));
            for i in 0..3 {
                q.send(lab_message(i));
            }
            // Phase 1: shutdown while deliveries are in the handler; the deadline is generous: all commit and ack.
            let gated = Gated::new();
            let g = gated.clone();
            let graceful = Worker::new(q.receiver(), lab_processor(store.clone(), gated.clone()))
                .options(
                    WorkerOptions::default()
                        .concurrency(3)
                        .shutdown_timeout(Duration::from_secs(30)),
                )
                .run_until(async move {
                    g.wait_entered(1).await;
                    g.open(16);
                })
                .await;
            c.eq("graceful: applied", graceful.count(OutcomeKind::Applied), 3);
            c.eq("graceful: queue drained", q.state(), QueueState::default());
            // Phase 2: the deadline passes while the handler hangs: roll back and release, never lose.
            for i in 3..5 {
                q.send(lab_message(i));
            }
            let stuck = Gated::new();
            let s = stuck.clone();
            let forced = Worker::new(q.receiver(), lab_processor(store.clone(), stuck.clone()))
                .options(
                    WorkerOptions::default()
                        .concurrency(2)
                        .shutdown_timeout(Duration::from_millis(50)),
                )
                .run_until(async move { s.wait_entered(1).await })
                .await;
            c.eq(
                "deadline: interrupted",
                forced.count(OutcomeKind::Interrupted),
                2,
            );
            c.eq("deadline: released, nothing lost", q.state().visible, 2);
            c.eq("deadline: nothing committed", rows(store.clone()).await?, 3);
            // Phase 3: the next worker takes over.
            let q2 = q.clone();
            let restart = Worker::new(q.receiver(), p.clone())
                .run_until(async move {
                    while q2.state() != QueueState::default() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await;
            stuck.open(16);
            c.eq("restart: applied", restart.count(OutcomeKind::Applied), 2);
            (
                q,
                format!(
                    "graceful: applied x{} | deadline: interrupted x{} > restart: applied x{}",
                    graceful.count(OutcomeKind::Applied),
                    forced.count(OutcomeKind::Interrupted),
                    restart.count(OutcomeKind::Applied)
                ),
                (
                    5,
                    5,
                    QueueState::default(),
                    0,
                    vec![(m::APPLIED, 5), (m::INTERRUPTED, 2)],
                ),
            )
        }
        Window::BatchBeforeTransaction => {
            let n = batch;
            let q = queue(Some(5));
            for i in 0..n {
                q.send(lab_message(i));
            }
            let ds = q.receive_now(n);
            c.eq("one receive", ds.len(), n);
            let crashed = faults.arm(FaultPoint::BeforeTransaction);
            let never = CancellationToken::new();
            let run = faulty.process_batch(ds, &never);
            let first = tokio::select! {
                biased;
                _ = crashed.cancelled() => "crashed(BeforeTransaction)".to_owned(),
                o = run => format!("not crashed: {}", labels(&o)),
            };
            c.eq("inbox rows after the crash", rows(store.clone()).await?, 0);
            c.eq("effects after the crash", DB::count_tasks(&store).await?, 0);
            c.eq("messages still held by the broker", q.state().in_flight, n);
            q.advance(PAST_VISIBILITY);
            let ds = q.receive_now(n);
            let o = p.process_batch(ds, &CancellationToken::new()).await;
            c.eq("redelivered batch", count(&o, "applied"), n);
            (
                q,
                format!("batch of {n}: {first} > {}", labels(&o)),
                (
                    n as i64,
                    n as i64,
                    QueueState::default(),
                    0,
                    vec![
                        (m::APPLIED, n as u64),
                        (m::APPLIED_AFTER_REDELIVERY, n as u64),
                    ],
                ),
            )
        }
        Window::BatchCrashMidBatch => {
            let n = batch;
            let q = queue(Some(5));
            for i in 0..n {
                q.send(lab_message(i));
            }
            let ds = q.receive_now(n);
            // The process dies while the handler of the delivery in the middle runs, the ones before it
            // written in the open transaction.
            let halt = HaltAt::new(n / 2);
            let hp = lab_processor(store.clone(), halt.clone());
            let never = CancellationToken::new();
            let run = hp.process_batch(ds, &never);
            let first = tokio::select! {
                biased;
                _ = halt.halted.cancelled() => format!("crashed(in handler {} of {n})", n / 2 + 1),
                o = run => format!("not crashed: {}", labels(&o)),
            };
            c.eq("handlers entered", halt.entered(), n / 2 + 1);
            c.eq("inbox rows after the crash", rows(store.clone()).await?, 0);
            c.eq("effects after the crash", DB::count_tasks(&store).await?, 0);
            c.eq("messages still held by the broker", q.state().in_flight, n);
            q.advance(PAST_VISIBILITY);
            let ds = q.receive_now(n);
            let o = p.process_batch(ds, &CancellationToken::new()).await;
            c.eq("redelivered batch", count(&o, "applied"), n);
            (
                q,
                format!("batch of {n}: {first} > {}", labels(&o)),
                (
                    n as i64,
                    n as i64,
                    QueueState::default(),
                    0,
                    vec![
                        (m::APPLIED, n as u64),
                        (m::APPLIED_AFTER_REDELIVERY, n as u64),
                    ],
                ),
            )
        }
        Window::BatchAfterCommitBeforeSettle => {
            let n = batch;
            let q = queue(Some(5));
            for i in 0..n {
                q.send(lab_message(i));
            }
            let halted = CancellationToken::new();
            let ds: Vec<_> = q
                .receive_now(n)
                .into_iter()
                .map(|d| HaltingDelivery {
                    inner: d,
                    halted: halted.clone(),
                })
                .collect();
            let never = CancellationToken::new();
            let run = p.process_batch(ds, &never);
            let first = tokio::select! {
                biased;
                _ = halted.cancelled() => "crashed(AfterCommit, before any settle)".to_owned(),
                o = run => format!("not crashed: {}", labels(&o)),
            };
            c.eq(
                "inbox rows after the crash",
                rows(store.clone()).await?,
                n as i64,
            );
            c.eq(
                "effects after the crash",
                DB::count_tasks(&store).await?,
                n as i64,
            );
            c.eq("messages still held by the broker", q.state().in_flight, n);
            q.advance(PAST_VISIBILITY);
            let ds = q.receive_now(n);
            let o = p.process_batch(ds, &CancellationToken::new()).await;
            c.eq(
                "redelivered batch: all duplicates",
                count(&o, "duplicate"),
                n,
            );
            (
                q,
                format!("batch of {n}: {first} > {}", labels(&o)),
                (
                    n as i64,
                    n as i64,
                    QueueState::default(),
                    0,
                    vec![(m::APPLIED, n as u64), (m::DUPLICATES, n as u64)],
                ),
            )
        }
        Window::BatchTwoShareAMessage => {
            let n = batch;
            let q = queue(Some(5));
            for i in 0..n {
                q.send(lab_message(i));
            }
            // The second batch begins with another copy of the first batch's last message.
            q.send(lab_message(n - 1));
            for i in n..2 * n - 1 {
                q.send(lab_message(i));
            }
            let a = q.receive_now(n);
            let b = q.receive_now(n);
            c.eq("two receives of a batch each", (a.len(), b.len()), (n, n));
            let gated = Gated::new();
            let pa = lab_processor(store.clone(), gated.clone());
            let pb = lab_processor(store.clone(), gated.clone());
            let ta =
                tokio::spawn(async move { pa.process_batch(a, &CancellationToken::new()).await });
            gated.wait_entered(1).await;
            let tb =
                tokio::spawn(async move { pb.process_batch(b, &CancellationToken::new()).await });
            // Give the second batch time to reach its marker inserts (and block on the first's keys).
            tokio::time::sleep(Duration::from_millis(50)).await;
            gated.open(4 * n);
            let oa = ta.await.map_err(|e| LabError::Usage(e.to_string()))?;
            let ob = tb.await.map_err(|e| LabError::Usage(e.to_string()))?;
            let all: Vec<_> = oa.iter().chain(&ob).cloned().collect();
            c.eq("applied", count(&all, "applied"), 2 * n - 1);
            c.eq("duplicates", count(&all, "duplicate"), 1);
            (
                q,
                format!("batch A: {} | batch B: {}", labels(&oa), labels(&ob)),
                (
                    (2 * n - 1) as i64,
                    (2 * n - 1) as i64,
                    QueueState::default(),
                    0,
                    vec![(m::APPLIED, (2 * n - 1) as u64), (m::DUPLICATES, 1)],
                ),
            )
        }
        Window::BatchMixedFailures => {
            let n = batch.max(6);
            let good = n - 5;
            let q = queue(Some(5));
            q.send(lab_message(0));
            let o0 = p.process_one(one(q.receive_now(1), "first")?).await;
            c.eq("applied alone first", o0.label(), "applied");
            let mut altered = lab_message(0);
            let mut body: serde_json::Value =
                serde_json::from_slice(&altered.body).unwrap_or_default();
            body["quantity"] = serde_json::json!(12);
            altered.body = body.to_string().into_bytes();
            q.send(altered);
            q.send(lab_message(0).attribute("ce-id", "evt-republished-after-timeout"));
            for i in 1..=3 + good {
                q.send(lab_message(i));
            }
            let ds = q.receive_now(n);
            c.eq("one receive", ds.len(), n);
            let fp = lab_processor(store.clone(), Flaky);
            let o = fp.process_batch(ds, &CancellationToken::new()).await;
            let want: Vec<&str> = [
                "payload_collision",
                "business_duplicate",
                "retry",
                "retry",
                "dead_lettered",
            ]
            .into_iter()
            .chain(std::iter::repeat_n("applied", good))
            .collect();
            c.eq(
                "outcomes in receive order",
                o.iter().map(|x| x.label()).collect::<Vec<_>>(),
                want,
            );
            c.eq(
                "after the batch: its good messages and the first",
                rows(store.clone()).await?,
                1 + good as i64,
            );
            c.eq(
                "no write of a failed delivery kept",
                DB::count_tasks(&store).await?,
                1 + good as i64,
            );
            let released = q.receive_now(n);
            c.eq("released: the retry and the panic", released.len(), 2);
            let o2 = fp.process_batch(released, &CancellationToken::new()).await;
            c.eq("redelivered", count(&o2, "applied"), 2);
            let reasons: Vec<String> = q
                .dead_letters()
                .into_iter()
                .map(|(_, why)| why.reason)
                .collect();
            c.eq(
                "dead-letter reasons",
                reasons,
                vec![
                    "payload_collision".to_owned(),
                    "handler_permanent".to_owned(),
                ],
            );
            (
                q,
                format!("applied | batch of {n}: {} > {}", labels(&o), labels(&o2)),
                (
                    3 + good as i64,
                    3 + good as i64,
                    QueueState {
                        dead_lettered: 2,
                        ..QueueState::default()
                    },
                    2,
                    vec![
                        (m::APPLIED, 3 + good as u64),
                        (m::PAYLOAD_COLLISIONS, 1),
                        (m::BUSINESS_DUPLICATES, 1),
                        (m::DEAD_LETTERS, 2),
                        (m::RETRIES, 2),
                        (m::APPLIED_AFTER_REDELIVERY, 2),
                    ],
                ),
            )
        }
        Window::BatchShutdownMidFlight => {
            let q = queue(Some(5));
            let n = batch;
            for i in 0..n {
                q.send(lab_message(i));
            }
            let opts = |concurrency: usize, timeout: Duration| {
                WorkerOptions::default()
                    .concurrency(concurrency)
                    .batch_size(n.min(10))
                    .batch_commit(n)
                    .shutdown_timeout(timeout)
            };
            // Phase 1: shutdown while a batch is in its handlers; the deadline is generous: all commit and ack.
            let gated = Gated::new();
            let g = gated.clone();
            let graceful = Worker::new(q.receiver(), lab_processor(store.clone(), gated.clone()))
                .options(opts(n, Duration::from_secs(30)))
                .run_until(async move {
                    g.wait_entered(1).await;
                    g.open(4 * n);
                })
                .await;
            let first = graceful.count(OutcomeKind::Applied) as usize;
            c.eq("graceful: nothing left in flight", q.state().in_flight, 0);
            // Phase 2: the deadline passes while a handler hangs: the batch rolls back and is released.
            for i in n..n + 2 {
                q.send(lab_message(i));
            }
            let stuck = Gated::new();
            let s = stuck.clone();
            let forced = Worker::new(q.receiver(), lab_processor(store.clone(), stuck.clone()))
                .options(opts(n, Duration::from_millis(50)))
                .run_until(async move { s.wait_entered(1).await })
                .await;
            let interrupted = forced.count(OutcomeKind::Interrupted);
            c.eq("deadline: nothing in flight", q.state().in_flight, 0);
            c.eq(
                "deadline: nothing of the batch committed",
                rows(store.clone()).await?,
                first as i64,
            );
            // Phase 3: the next worker (batch mode) takes over.
            let q2 = q.clone();
            let restart = Worker::new(q.receiver(), p.clone())
                .options(opts(n, Duration::from_secs(30)))
                .run_until(async move {
                    while q2.state() != QueueState::default() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await;
            stuck.open(4 * n);
            let total = first as u64 + restart.count(OutcomeKind::Applied);
            c.eq("every message applied once", total, (n + 2) as u64);
            c.eq("the hung batch was interrupted", interrupted >= 1, true);
            (
                q,
                format!(
                    "graceful: applied x{first} | deadline: interrupted x{interrupted} > restart: applied x{}",
                    restart.count(OutcomeKind::Applied)
                ),
                (
                    (n + 2) as i64,
                    (n + 2) as i64,
                    QueueState::default(),
                    0,
                    vec![(m::APPLIED, (n + 2) as u64), (m::INTERRUPTED, interrupted)],
                ),
            )
        }
        Window::ExternalCallAnswerLost
        | Window::ExternalCallAnswerLostNoIdempotency
        | Window::ExternalCallNeverReached
        | Window::ExternalCallKeyInProgress => external::run(store.clone(), w, &mut c).await?,
    };

    let (exp_rows, exp_effects, exp_broker, exp_rejections, exp_signals) = expect;
    let inbox_rows = rows(store.clone()).await?;
    let business_effects = DB::count_tasks(&store).await?;
    let broker = q.state();
    let rejections = DB::count_rejections(&store, "payload_collision").await?
        + DB::count_rejections(&store, "business_duplicate").await?;
    c.eq("inbox rows", inbox_rows, exp_rows);
    c.eq("business effects", business_effects, exp_effects);
    c.eq("broker", broker, exp_broker);
    c.eq("rejection evidence rows", rejections, exp_rejections);
    let signals = counters(&snap);
    for (name, n) in exp_signals {
        c.eq(name, signals.get(name).copied().unwrap_or(0), n);
    }
    Ok(WindowRow {
        window: w,
        inbox_rows,
        business_effects,
        broker,
        outcome,
        signals,
        rejections,
        failures: c.failures,
    })
}

/// `applied x3 duplicate x1` style summary of a batch's outcomes, in first-seen order.
fn labels(o: &[txinbox_core::Outcome]) -> String {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for x in o {
        match seen.iter_mut().find(|(l, _)| *l == x.label()) {
            Some((_, n)) => *n += 1,
            None => seen.push((x.label(), 1)),
        }
    }
    seen.iter()
        .map(|(l, n)| format!("{l} x{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn count(o: &[txinbox_core::Outcome], label: &str) -> usize {
    o.iter().filter(|x| x.label() == label).count()
}

/// A handler that writes the task, and hangs forever in the handler of delivery number `at` (0-based),
/// announcing it: the process died there.
#[derive(Clone)]
struct HaltAt {
    at: usize,
    entered: Arc<std::sync::atomic::AtomicUsize>,
    halted: CancellationToken,
}

impl HaltAt {
    fn new(at: usize) -> Self {
        Self {
            at,
            entered: Arc::default(),
            halted: CancellationToken::new(),
        }
    }
    fn entered(&self) -> usize {
        self.entered.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl<DB: LabDb> Handler<Store<DB>, LabEvent> for HaltAt {
    type Output = Handled;
    async fn handle(&self, tx: Tx<DB>, msg: Message<LabEvent>) -> Result<Handled, HandlerError> {
        let k = self
            .entered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let done = DB::insert_task(tx, msg).await?;
        if k == self.at {
            tracing::warn!("simulated crash in a handler mid-batch");
            self.halted.cancel();
            std::future::pending::<()>().await;
        }
        Ok(done)
    }
}

/// A handler that writes its task and then, on a first delivery, fails: `evt-483` with a retryable error,
/// `evt-484` with a panic; `evt-485` fails permanently on every delivery. Others apply.
#[derive(Clone, Copy)]
struct Flaky;

impl<DB: LabDb> Handler<Store<DB>, LabEvent> for Flaky {
    type Output = Handled;
    async fn handle(&self, tx: Tx<DB>, msg: Message<LabEvent>) -> Result<Handled, HandlerError> {
        let id = msg.identity.message_id.clone();
        let first = msg.raw.delivery_count <= 1;
        let done = DB::insert_task(tx, msg).await?;
        match id.as_str() {
            "evt-483" if first => Err(HandlerError::retry(std::io::Error::other(
                "the CRM timed out (first delivery)",
            ))),
            "evt-484" if first => panic!("the handler panicked (first delivery)"),
            "evt-485" => Err(HandlerError::permanent(std::io::Error::other(
                "the opportunity is closed",
            ))),
            _ => Ok(done),
        }
    }
}

/// A delivery whose every settle is where the process dies: it announces it and never returns.
struct HaltingDelivery<D> {
    inner: D,
    halted: CancellationToken,
}

impl<D: Delivery> Delivery for HaltingDelivery<D> {
    fn message(&self) -> &txinbox_core::ReceivedMessage {
        self.inner.message()
    }
    async fn ack(self) -> Result<(), txinbox_core::BrokerError> {
        self.halt().await
    }
    async fn release(self, _: Duration) -> Result<(), txinbox_core::BrokerError> {
        self.halt().await
    }
    async fn dead_letter(
        self,
        _: txinbox_core::DeadLetter,
    ) -> Result<(), txinbox_core::BrokerError> {
        self.halt().await
    }
    fn lease(&self) -> Option<Arc<dyn txinbox_core::Lease>> {
        self.inner.lease()
    }
}

impl<D> HaltingDelivery<D> {
    async fn halt(self) -> Result<(), txinbox_core::BrokerError> {
        self.halted.cancel();
        std::future::pending().await
    }
}

/// A lease that reports a 15 ms duration, so the keeper renews every 5 ms, and renews the lease it wraps by
/// 30 s.
struct QuickLease(Arc<dyn txinbox_core::Lease>);

impl txinbox_core::Lease for QuickLease {
    fn duration(&self) -> Duration {
        Duration::from_millis(15)
    }
    fn expires_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.0.expires_at()
    }
    fn renew(
        &self,
        _by: Duration,
    ) -> futures::future::BoxFuture<
        '_,
        Result<chrono::DateTime<chrono::Utc>, txinbox_core::BrokerError>,
    > {
        self.0.renew(Duration::from_secs(30))
    }
}

/// The states a runner's pass led to, `done` or `uncertain+pending`.
pub(crate) fn states(r: &txinbox_core::EffectReport) -> String {
    let s: Vec<&str> = EffectState::ALL
        .into_iter()
        .filter(|st| r.count(*st) > 0)
        .map(EffectState::as_str)
        .collect();
    if s.is_empty() {
        "nothing".into()
    } else {
        s.join("+")
    }
}
