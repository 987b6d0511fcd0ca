//! The failure windows of the pattern, reproduced with the in-memory broker against a real store.
//!
//! Each window runs on a fresh database and checks, against expected values written here, the inbox rows,
//! the business effects, the broker state, the outcomes and the metrics the window must leave. The windows of
//! one delivery at a time are in `delivery`, those of batch mode in `batch`; the external-call windows
//! ([`external`]) run the effect runner against the local CRM API in the shapes public APIs answer in.
//!
//! Metrics are captured with a thread-local recorder, so run the windows on a current-thread runtime.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::LocalBoxFuture;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::Semaphore;
use txinbox_core::broker::mem::{MemoryQueue, QueueOptions, QueueState};
use txinbox_core::{EffectState, Handled, Handler, HandlerError, Message};

use crate::lab::{with_fresh, LabError, LabEvent, OnFresh, Target, CONSUMER};
use crate::labdb::LabStore;

mod batch;
mod delivery;
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
    /// Partitioned layout: copies that arrive after their first copy's partition boundary (a redelivery, and a
    /// producer's re-send with the event's CloudEvents `time`) meet its marker in its partition.
    CopyAfterPartitionBoundary,
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

    /// The windows of the partitioned layout only (`lab --windows --partitioned`).
    pub const PARTITIONED: [Window; 1] = [Window::CopyAfterPartitionBoundary];

    /// The failure windows of batch mode
    /// ([`WorkerOptions::batch_commit`](txinbox_core::WorkerOptions::batch_commit)): `lab --windows --batch N`.
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
            Window::CopyAfterPartitionBoundary => "copy_after_partition_boundary",
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

/// Runs every window on fresh databases of `target` (and, on the partitioned layout, its own windows).
pub async fn run_all(target: &Target) -> Result<Vec<WindowRow>, LabError> {
    let mut rows = Vec::new();
    for w in Window::ALL {
        rows.push(run_on(target, w).await?);
    }
    if target.is_partitioned() {
        for w in Window::PARTITIONED {
            rows.push(run_on(target, w).await?);
        }
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
    check_batch(batch)?;
    let mut rows = run_all(target).await?;
    for w in Window::BATCH {
        rows.push(run_on_batch(target, w, batch).await?);
    }
    Ok(rows)
}

/// A batch windows' batch size: 2 to [`MAX_BATCH_COMMIT`](txinbox_core::runtime::worker::MAX_BATCH_COMMIT),
/// what a worker commits at most in one transaction; [`LabError::Usage`] otherwise, before any store is
/// created (a window sends twice its batch through the in-memory broker, so an unbounded one would allocate
/// without limit).
fn check_batch(batch: usize) -> Result<(), LabError> {
    if (2..=txinbox_core::runtime::worker::MAX_BATCH_COMMIT).contains(&batch) {
        Ok(())
    } else {
        Err(LabError::Usage(format!(
            "--batch must be 2 to {}",
            txinbox_core::runtime::worker::MAX_BATCH_COMMIT
        )))
    }
}

/// Runs one window on a fresh database of `target`, a batch window with batches of `batch` deliveries (2 to
/// [`MAX_BATCH_COMMIT`](txinbox_core::runtime::worker::MAX_BATCH_COMMIT), else [`LabError::Usage`] before
/// any store is created).
pub async fn run_on_batch(target: &Target, w: Window, batch: usize) -> Result<WindowRow, LabError> {
    check_batch(batch)?;
    struct Run(Window, usize);
    impl OnFresh for Run {
        type Output = WindowRow;
        fn run<S: LabStore>(
            self,
            store: S,
        ) -> LocalBoxFuture<'static, Result<WindowRow, LabError>> {
            Box::pin(run_window_batch(store, self.0, self.1))
        }
    }
    with_fresh(target, Run(w, batch)).await
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

pub(crate) const PAST_VISIBILITY: Duration = Duration::from_secs(31);

/// A handler that announces it has started (the marker is inserted) and waits for a permit before applying.
#[derive(Clone)]
pub(crate) struct Gated {
    entered: Arc<Semaphore>,
    gate: Arc<Semaphore>,
}

impl Gated {
    pub(crate) fn new() -> Self {
        Self {
            entered: Arc::new(Semaphore::new(0)),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
    pub(crate) async fn wait_entered(&self, n: u32) {
        if let Ok(p) = self.entered.acquire_many(n).await {
            p.forget();
        }
    }
    pub(crate) fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

impl<S: LabStore> Handler<S, LabEvent> for Gated {
    type Output = Handled;
    async fn handle(&self, tx: S::Tx, msg: Message<LabEvent>) -> Result<Handled, HandlerError> {
        self.entered.add_permits(1);
        if let Ok(p) = self.gate.acquire().await {
            p.forget();
        }
        S::insert_task(tx, msg).await
    }
}

/// How long a window waits to see a second copy reach the place it means it to be when the first commits.
const SECOND_COPY_WAIT: Duration = Duration::from_secs(10);

/// Waits, the first copy (or batch) held at the gate of `gated`, until the second is where the window means it
/// to be when the first commits, so that it finds neither the first's marker committed nor its own way free:
/// on PostgreSQL its marker insert waits on the first's uncommitted marker (`pg_locks`); on a store that
/// decides at commit (DynamoDB) it has entered its handler and waits at the gate. Returns whether it got there
/// within 10 s, or `None` where the store cannot tell (SQLite, whose wait is inside its busy handler): there
/// the second is given 50 ms to get there, and may find the first's marker committed instead (the counts are
/// the same either way).
pub(crate) async fn second_copy_waits<S: LabStore>(
    store: &S,
    gated: &Gated,
) -> Result<Option<bool>, LabError> {
    if store.decides_at_commit() {
        let entered = tokio::time::timeout(SECOND_COPY_WAIT, gated.wait_entered(1)).await;
        return Ok(Some(entered.is_ok()));
    }
    let start = tokio::time::Instant::now();
    loop {
        match store.sessions_waiting_on_markers().await? {
            None => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                return Ok(None);
            }
            Some(n) if n > 0 => return Ok(Some(true)),
            Some(_) if start.elapsed() >= SECOND_COPY_WAIT => return Ok(Some(false)),
            Some(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// The lab consumer's inbox rows.
pub(crate) async fn rows<S: LabStore>(store: &S) -> Result<i64, LabError> {
    store.count_markers(CONSUMER).await
}

pub(crate) fn one<D>(mut v: Vec<D>, what: &str) -> Result<D, LabError> {
    v.pop()
        .ok_or_else(|| LabError::Usage(format!("expected a delivery: {what}")))
}

/// Runs window `w` on `pool` (fresh and migrated) and checks its expectations.
pub async fn run_window<S: LabStore>(store: S, w: Window) -> Result<WindowRow, LabError> {
    run_window_batch(store, w, DEFAULT_BATCH).await
}

/// Runs window `w` on `pool` (fresh and migrated), a batch window with batches of `batch` deliveries (2 to
/// [`MAX_BATCH_COMMIT`](txinbox_core::runtime::worker::MAX_BATCH_COMMIT), else [`LabError::Usage`] before
/// the tables are created), and checks its expectations.
pub async fn run_window_batch<S: LabStore>(
    store: S,
    w: Window,
    batch: usize,
) -> Result<WindowRow, LabError> {
    check_batch(batch)?;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    store.create_tables().await?;
    let mut c = Checks {
        failures: Vec::new(),
    };

    let (q, outcome, expect) = match w {
        Window::BeforeTransaction
        | Window::AfterInsertBeforeChange
        | Window::AfterChangeBeforeCommit
        | Window::AfterCommitBeforeSettle
        | Window::LockLostDuringWork
        | Window::TwoConcurrentDeliveries
        | Window::AfterDlqRedrive
        | Window::SameIdOtherPayload
        | Window::OtherIdSameBusinessAction
        | Window::AfterRetentionExpired
        | Window::ShutdownMidFlight
        | Window::CopyAfterPartitionBoundary => delivery::run(store.clone(), w, &mut c).await?,
        Window::BatchBeforeTransaction
        | Window::BatchCrashMidBatch
        | Window::BatchAfterCommitBeforeSettle
        | Window::BatchTwoShareAMessage
        | Window::BatchMixedFailures
        | Window::BatchShutdownMidFlight => batch::run(store.clone(), w, batch, &mut c).await?,
        Window::ExternalCallAnswerLost
        | Window::ExternalCallAnswerLostNoIdempotency
        | Window::ExternalCallNeverReached
        | Window::ExternalCallKeyInProgress => external::run(store.clone(), w, &mut c).await?,
    };

    let (exp_rows, exp_effects, exp_broker, exp_rejections, exp_signals) = expect;
    let inbox_rows = rows(&store).await?;
    let business_effects = store.count_tasks().await?;
    let broker = q.state();
    let rejections = store.count_rejections("payload_collision").await?
        + store.count_rejections("business_duplicate").await?;
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
