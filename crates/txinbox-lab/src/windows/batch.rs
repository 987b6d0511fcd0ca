//! The failure windows of batch mode ([`txinbox_core::WorkerOptions::batch_commit`]): a crash before the
//! batch's BEGIN, in a handler mid-batch, after its COMMIT before any settle; two batches in flight sharing a
//! message; a batch mixing every kind of failure with good messages; a shutdown with batches in flight.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use txinbox_core::broker::mem::{MemoryQueue, QueueState};
use txinbox_core::{
    metrics as m, Delivery, Handled, Handler, HandlerError, Message, OutcomeKind, Worker,
    WorkerOptions,
};

use super::{
    one, queue, rows, second_copy_waits, Checks, Expected, Gated, Window, PAST_VISIBILITY,
};
use crate::faults::{FaultPoint, Faults, FaultyStore};
use crate::lab::{lab_message, lab_processor, task_handler, LabError, LabEvent};
use crate::labdb::LabStore;

/// Runs a batch window on `store` (fresh, migrated, with the lab's tables) with batches of `batch` deliveries
/// (at least 2): the queue it leaves, the outcome line and what to expect.
pub(crate) async fn run<S: LabStore>(
    store: S,
    w: Window,
    batch: usize,
    c: &mut Checks,
) -> Result<(MemoryQueue, String, Expected), LabError> {
    let p = lab_processor(store.clone(), task_handler::<S>());
    // The same inbox and handler on a store that can crash at an armed point.
    let faults = Faults::new();
    let faulty = lab_processor(
        FaultyStore::new(store.clone(), faults.clone()),
        task_handler::<S>(),
    );
    Ok(match w {
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
            c.eq("inbox rows after the crash", rows(&store).await?, 0);
            c.eq("effects after the crash", store.count_tasks().await?, 0);
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
            c.eq("inbox rows after the crash", rows(&store).await?, 0);
            c.eq("effects after the crash", store.count_tasks().await?, 0);
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
            c.eq("inbox rows after the crash", rows(&store).await?, n as i64);
            c.eq(
                "effects after the crash",
                store.count_tasks().await?,
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
            // The second batch reaches its first marker insert, the shared message's, and blocks on the first
            // batch's key (PostgreSQL), or runs its handler up to the gate (a store that decides at commit).
            if let Some(there) = second_copy_waits(&store, &gated).await? {
                c.eq(
                    "second batch waits on the first before it commits",
                    there,
                    true,
                );
            }
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
                rows(&store).await?,
                1 + good as i64,
            );
            c.eq(
                "no write of a failed delivery kept",
                store.count_tasks().await?,
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
            // Every delivery of the batch is received before the shutdown (one slot per message) and the
            // deadline is generous: the whole batch commits, none is left for the next worker.
            c.eq("graceful: applied", first, n);
            c.eq("graceful: queue drained", q.state(), QueueState::default());
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
            // The two messages make one batch, hung in a handler: both interrupted, released, not lost.
            c.eq("deadline: interrupted", interrupted, 2);
            c.eq("deadline: released, nothing lost", q.state().visible, 2);
            c.eq("deadline: nothing in flight", q.state().in_flight, 0);
            c.eq(
                "deadline: nothing of the batch committed",
                rows(&store).await?,
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
            c.eq("restart: applied", restart.count(OutcomeKind::Applied), 2);
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
                    vec![(m::APPLIED, (n + 2) as u64), (m::INTERRUPTED, 2)],
                ),
            )
        }
        _ => {
            return Err(LabError::Usage(format!(
                "{} is not a batch window",
                w.name()
            )))
        }
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

impl<S: LabStore> Handler<S, LabEvent> for HaltAt {
    type Output = Handled;
    async fn handle(&self, tx: S::Tx, msg: Message<LabEvent>) -> Result<Handled, HandlerError> {
        let k = self
            .entered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let done = S::insert_task(tx, msg).await?;
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

impl<S: LabStore> Handler<S, LabEvent> for Flaky {
    type Output = Handled;
    async fn handle(&self, tx: S::Tx, msg: Message<LabEvent>) -> Result<Handled, HandlerError> {
        let id = msg.identity.message_id.clone();
        let first = msg.raw.delivery_count <= 1;
        let done = S::insert_task(tx, msg).await?;
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
    // `release_holds` is left to the trait's default on purpose, not forwarded: this release never reaches the
    // wrapped delivery's broker (the process dies there).
}

impl<D> HaltingDelivery<D> {
    async fn halt(self) -> Result<(), txinbox_core::BrokerError> {
        self.halted.cancel();
        std::future::pending().await
    }
}
