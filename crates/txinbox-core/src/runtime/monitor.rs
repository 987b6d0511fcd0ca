//! One object that runs a consumer's parts under one shutdown: the worker, the effect runner, the maintenance
//! and the health endpoint, and returns one report whose exit status a process can use.
//!
//! ```no_run
//! use txinbox_core::runtime::monitor::Monitor;
//! use txinbox_core::{EffectRunner, EffectStore, LeasedDelivery, Processor, Receiver, Worker};
//!
//! async fn serve<R, P, S>(worker: Worker<R, P>, effects: EffectRunner<S>) -> std::process::ExitCode
//! where
//!     R: Receiver,
//!     P: Processor<LeasedDelivery<R::Delivery>>,
//!     S: EffectStore,
//! {
//!     let report = Monitor::new()
//!         .worker(worker)
//!         .effects(effects)
//!         .run_until(txinbox_core::shutdown_signal())
//!         .await;
//!     println!("{report}");
//!     report.exit_code() // 3 the worker gave up, 4 it (or a part) was abandoned at shutdown, 5 a part panicked
//! }
//! ```
//!
//! When the shutdown future resolves, or the worker stops by itself (it gave up on receives a retry cannot fix,
//! or ran out of work with [`Worker::run_until_idle`](super::worker::Worker::run_until_idle)'s semantics),
//! every part is stopped: the worker drains (commit, then settle), the effect runner finishes the effects it
//! claimed (for up to 20 s, then gives up what is still in flight to its next holder's reconciliation), the
//! maintenance ends its pass, the health endpoint closes.
//!
//! Every part is bounded the way the worker bounds its own work: from the stop signal, the shutdown timeout
//! ([`Monitor::shutdown_timeout`]; by default the longest [`WorkerOptions::shutdown_timeout`] of the
//! workers), then [`SHUTDOWN_GRACE`], then [`PART_REPORT_WAIT`] for a part that bounds itself to exactly that
//! (the worker, the effect runner) to hand in its report. A part still running then ignored the stop (a call
//! that does not answer): its task is aborted (dropped where it waits, as a SIGKILL would), it is logged and
//! named in [`MonitorReport::abandoned_parts`], and the report is not [`ok`](MonitorReport::ok) (exit status
//! [`EXIT_ABANDONED`]). The monitor therefore returns at the latest `shutdown_timeout + SHUTDOWN_GRACE +
//! PART_REPORT_WAIT` after the stop signal.
//!
//! A part whose task panics (a bug) stops the others, as a worker that gives up does: they stop as on the
//! shutdown, each with its report. The panicking part is logged by name (its panic message is what the panic
//! hook printed; the monitor repeats none of it, since a message may carry a connection string) and named in
//! [`MonitorReport::panicked_parts`], and the report is not [`ok`](MonitorReport::ok) (exit status
//! [`EXIT_PANICKED`]).
//!
//! [`WorkerOptions::shutdown_timeout`]: crate::WorkerOptions::shutdown_timeout

use std::fmt;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::broker::Receiver;
use crate::effects::{EffectReport, EffectRunner, EffectStore};
use crate::runtime::maintenance::{Maintenance, MaintenanceStore};
use crate::runtime::worker::{
    LeasedDelivery, Processor, Worker, WorkerOptions, WorkerReport, SHUTDOWN_GRACE,
};

type Part<T> = Box<dyn FnOnce(CancellationToken) -> BoxFuture<'static, T> + Send>;

/// How long past the shutdown grace ([`SHUTDOWN_GRACE`] after the shutdown deadline) the monitor still waits for
/// its parts (1 s): the worker and the effect runner bound themselves to that grace, counted from the moment
/// they see the stop, and this lets them hand in their report (the deliveries a worker abandoned, the effects a
/// runner gave up) before a part still running is abandoned. See the [module docs](self).
pub const PART_REPORT_WAIT: Duration = Duration::from_secs(1);

/// Runs a consumer's worker, effect runner, maintenance and health endpoint under one shutdown. See the
/// [module docs](self).
#[must_use = "a Monitor does nothing until run_until is awaited"]
#[derive(Default)]
pub struct Monitor {
    /// Each worker, named `worker CONSUMER`.
    workers: Vec<(String, Part<WorkerReport>)>,
    effects: Vec<Part<EffectReport>>,
    maintenance: Vec<Part<()>>,
    others: Vec<(&'static str, Part<()>)>,
    /// The longest shutdown timeout of the workers.
    workers_timeout: Option<Duration>,
    /// Set by [`Monitor::shutdown_timeout`].
    shutdown_timeout: Option<Duration>,
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor")
            .field(
                "workers",
                &self.workers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("effects", &self.effects.len())
            .field("maintenance", &self.maintenance.len())
            .field(
                "others",
                &self.others.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            )
            .field("shutdown_timeout", &self.timeout())
            .finish()
    }
}

/// What the parts of a [`Monitor`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use = "a MonitorReport says whether the worker gave up: use exit_code() for the process's exit"]
#[non_exhaustive]
pub struct MonitorReport {
    /// The first worker's report (`None` without a worker).
    pub worker: Option<WorkerReport>,
    /// Every worker's report, in the order they were given (several consumers in one process).
    pub workers: Vec<WorkerReport>,
    /// The effect runners' report, summed over the runners (`None` without one).
    pub effects: Option<EffectReport>,
    /// The parts still running past the monitor's bound (the shutdown timeout after the stop signal, then
    /// [`SHUTDOWN_GRACE`] and [`PART_REPORT_WAIT`]: see the [module docs](self)), whose tasks were aborted:
    /// `worker CONSUMER`, `effects`, `maintenance` (numbered from 1 when there are several: `effects 2`),
    /// `health`, or the name given to [`Monitor::part`]. An abandoned worker's entry in
    /// [`workers`](Self::workers) is empty (its report was lost with it); an abandoned effect runner is not in
    /// [`effects`](Self::effects).
    pub abandoned_parts: Vec<String>,
    /// The parts whose task panicked (named as in [`abandoned_parts`](Self::abandoned_parts)): a bug, which
    /// stopped every other part. A panicked worker's entry in [`workers`](Self::workers) is empty; a panicked
    /// effect runner is not in [`effects`](Self::effects).
    pub panicked_parts: Vec<String>,
}

impl MonitorReport {
    /// Whether every part ended as asked: `false` when a worker gave up, when a worker abandoned deliveries
    /// at shutdown ([`WorkerReport::abandoned`]: still in flight past the shutdown grace, a store or broker call
    /// that did not answer), or when a part was abandoned ([`abandoned_parts`](Self::abandoned_parts): still
    /// running past the monitor's bound). Abandoned deliveries are not lost (they come back after their lock or
    /// visibility timeout), but the shutdown did not settle them, and a hung call is worth a look. `false` too
    /// when a part panicked ([`panicked_parts`](Self::panicked_parts)).
    pub fn ok(&self) -> bool {
        self.workers
            .iter()
            .all(|w| w.gave_up.is_none() && w.abandoned == 0)
            && self.abandoned_parts.is_empty()
            && self.panicked_parts.is_empty()
    }

    /// The process's exit status, so that a supervisor sees what [`ok`](Self::ok) says: success,
    /// [`EXIT_GAVE_UP`] (3) when a worker gave up (receives kept failing with an error a retry cannot fix), else
    /// [`EXIT_PANICKED`] (5) when a part panicked, else [`EXIT_ABANDONED`] (4) when a worker abandoned
    /// deliveries or a part was abandoned at shutdown.
    pub fn exit_code(&self) -> std::process::ExitCode {
        if self.workers.iter().any(|w| w.gave_up.is_some()) {
            std::process::ExitCode::from(EXIT_GAVE_UP)
        } else if !self.panicked_parts.is_empty() {
            std::process::ExitCode::from(EXIT_PANICKED)
        } else if self.ok() {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::from(EXIT_ABANDONED)
        }
    }
}

/// The exit status of a process whose worker gave up ([`MonitorReport::exit_code`]).
pub const EXIT_GAVE_UP: u8 = 3;

/// The exit status of a process one of whose parts panicked ([`MonitorReport::exit_code`],
/// [`MonitorReport::panicked_parts`]).
pub const EXIT_PANICKED: u8 = 5;

/// The exit status of a process whose worker abandoned deliveries at shutdown, past the shutdown grace
/// ([`MonitorReport::exit_code`], [`WorkerReport::abandoned`]), or one of whose parts was abandoned, still
/// running past the monitor's bound ([`MonitorReport::abandoned_parts`]).
pub const EXIT_ABANDONED: u8 = 4;

impl fmt::Display for MonitorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for line in self
            .workers
            .iter()
            .map(ToString::to_string)
            .chain(self.effects.as_ref().map(ToString::to_string))
        {
            if !first {
                f.write_str("\n")?;
            }
            f.write_str(&line)?;
            first = false;
        }
        if !self.abandoned_parts.is_empty() {
            if !first {
                f.write_str("\n")?;
            }
            write!(
                f,
                "abandoned parts (still running past the shutdown grace, aborted): {}",
                self.abandoned_parts.join(", ")
            )?;
            first = false;
        }
        if !self.panicked_parts.is_empty() {
            if !first {
                f.write_str("\n")?;
            }
            write!(f, "panicked parts: {}", self.panicked_parts.join(", "))?;
        }
        Ok(())
    }
}

impl Monitor {
    /// A monitor with no part yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A worker. Each call adds one: several consumers in one process, each with its own consumer name and
    /// queue, on one store or on stores of their own, under one shutdown (a worker that gives up stops them
    /// all).
    pub fn worker<R, P>(mut self, worker: Worker<R, P>) -> Self
    where
        R: Receiver,
        P: Processor<LeasedDelivery<R::Delivery>>,
    {
        let timeout = worker.shutdown_timeout();
        self.workers_timeout = Some(self.workers_timeout.map_or(timeout, |t| t.max(timeout)));
        let name = format!("worker {}", worker.consumer());
        self.workers.push((
            name,
            Box::new(move |stop: CancellationToken| {
                worker.run_until(stop.cancelled_owned()).boxed()
            }),
        ));
        self
    }

    /// Sets the shutdown timeout the monitor bounds its parts by: a part still running this long after the stop
    /// signal, then [`SHUTDOWN_GRACE`] and [`PART_REPORT_WAIT`], is abandoned (see the [module docs](self)).
    /// Default: the longest [`WorkerOptions::shutdown_timeout`] of the workers given, or its default (20 s)
    /// without one. A value below a worker's own shutdown timeout cuts that worker's drain short (it is then
    /// abandoned, its report lost).
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = Some(d);
        self
    }

    /// The shutdown timeout in force (see [`Monitor::shutdown_timeout`]).
    fn timeout(&self) -> Duration {
        self.shutdown_timeout
            .or(self.workers_timeout)
            .unwrap_or_else(|| WorkerOptions::default().get_shutdown_timeout())
    }

    /// An effect runner, beside the worker. Each call adds one (one per store when the worker runs
    /// [shards](crate::runtime::shards)); their reports are summed.
    pub fn effects<S: EffectStore>(mut self, runner: EffectRunner<S>) -> Self {
        self.effects.push(Box::new(move |stop: CancellationToken| {
            async move { runner.run_until(stop.cancelled_owned()).await }.boxed()
        }));
        self
    }

    /// A maintenance (retention purges), beside the worker. Each call adds one (one per store when the worker
    /// runs [shards](crate::runtime::shards)).
    pub fn maintenance<S: MaintenanceStore>(mut self, maintenance: Maintenance<S>) -> Self {
        self.maintenance
            .push(Box::new(move |stop: CancellationToken| {
                async move { maintenance.run_until(stop.cancelled_owned()).await }.boxed()
            }));
        self
    }

    /// Serves `GET /livez` and `GET /readyz` of `health` on `listener` (feature `health-server`) until shutdown.
    /// Give the same `health` to the worker ([`Worker::health`](super::worker::Worker::health)) so that
    /// readiness follows its receives.
    #[cfg(feature = "health-server")]
    pub fn health_server(
        self,
        listener: tokio::net::TcpListener,
        health: crate::runtime::health::Health,
    ) -> Self {
        self.part("health", move |stop: CancellationToken| {
            crate::runtime::health::serve(listener, health, stop.cancelled_owned())
        })
    }

    /// Any other part of the consumer (a metrics exporter, a server of your own): `part(stop)` runs until `stop`
    /// is cancelled.
    pub fn part<F, Fut>(mut self, name: &'static str, part: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.others
            .push((name, Box::new(move |stop| part(stop).boxed())));
        self
    }

    /// Runs every part until `shutdown` resolves or the worker stops by itself, then stops them all and
    /// returns what they did. A part still running past the bound (see the [module docs](self)) is abandoned.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> MonitorReport {
        let stop = CancellationToken::new();
        let bound = Bound {
            stop: stop.clone(),
            stopped_at: OnceLock::new(),
            limit: self
                .timeout()
                .saturating_add(SHUTDOWN_GRACE)
                .saturating_add(PART_REPORT_WAIT),
        };
        let bound = &bound;
        // Each part is a task of its own: parts polled side by side in one task would share its cooperative
        // budget, and a busy first part would starve the next (seen with two workers under `join_all`); as
        // tasks they also spread over a multi-threaded runtime's threads.
        let workers: Vec<_> = self
            .workers
            .into_iter()
            .map(|(name, w)| {
                let run = tokio::spawn(w(stop.clone()));
                // A worker that stops by itself (it gave up) stops the others too.
                async move {
                    let ended = bound.watch(&name, run).await;
                    bound.stop();
                    (name, ended)
                }
            })
            .collect();
        let effects = spawn_named("effects", self.effects, &stop);
        let maintenance = spawn_named("maintenance", self.maintenance, &stop);
        let others: Vec<_> = self
            .others
            .into_iter()
            .map(|(name, p)| (name.to_owned(), tokio::spawn(p(stop.clone()))))
            .collect();
        let signal = async {
            tokio::select! {
                _ = shutdown => bound.stop(),
                _ = stop.cancelled() => {}
            }
        };
        let (workers, effects, maintenance, others, ()) = tokio::join!(
            futures::future::join_all(workers),
            bound.watch_all(effects),
            bound.watch_all(maintenance),
            bound.watch_all(others),
            signal,
        );
        let mut abandoned_parts = Vec::new();
        let mut panicked_parts = Vec::new();
        let workers: Vec<WorkerReport> = workers
            .into_iter()
            .map(|(name, ended)| match ended {
                Ended::Done(report) => report,
                Ended::Panicked => {
                    panicked_parts.push(name);
                    WorkerReport::default()
                }
                Ended::Abandoned => {
                    abandoned_parts.push(name);
                    WorkerReport::default()
                }
            })
            .collect();
        let effects = (!effects.is_empty()).then(|| {
            let mut sum = EffectReport::default();
            for (ended, name) in effects {
                match ended {
                    Ended::Done(r) => sum.add(&r),
                    Ended::Panicked => panicked_parts.push(name),
                    Ended::Abandoned => abandoned_parts.push(name),
                }
            }
            sum
        });
        for (ended, name) in maintenance.into_iter().chain(others) {
            match ended {
                Ended::Done(()) => {}
                Ended::Panicked => panicked_parts.push(name),
                Ended::Abandoned => abandoned_parts.push(name),
            }
        }
        for w in &workers {
            if let Some(why) = &w.gave_up {
                tracing::error!(reason = %why, "a worker gave up; every part stopped");
            }
        }
        MonitorReport {
            worker: workers.first().cloned(),
            workers,
            effects,
            abandoned_parts,
            panicked_parts,
        }
    }
}

/// Spawns each part of one kind, named `kind`, or `kind 1`, `kind 2`... when there are several.
fn spawn_named<T: Send + 'static>(
    kind: &str,
    parts: Vec<Part<T>>,
    stop: &CancellationToken,
) -> Vec<(String, JoinHandle<T>)> {
    let several = parts.len() > 1;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let name = if several {
                format!("{kind} {}", i + 1)
            } else {
                kind.to_owned()
            };
            (name, tokio::spawn(p(stop.clone())))
        })
        .collect()
}

/// How a part's task ended.
enum Ended<T> {
    /// It returned.
    Done(T),
    /// It panicked (or its task was cancelled by the runtime).
    Panicked,
    /// It was still running past the bound and was aborted.
    Abandoned,
}

/// The monitor's stop and the bound it sets on every part: `limit` after the stop signal.
struct Bound {
    stop: CancellationToken,
    /// When the stop was signalled (the shutdown, or a worker that stopped by itself).
    stopped_at: OnceLock<Instant>,
    limit: Duration,
}

impl Bound {
    /// Signals the stop: the bound starts now (if it has not already).
    fn stop(&self) {
        self.stopped_at.get_or_init(Instant::now);
        self.stop.cancel();
    }

    /// Waits for every part of `parts` ([`Bound::watch`]), each with its name.
    async fn watch_all<T>(&self, parts: Vec<(String, JoinHandle<T>)>) -> Vec<(Ended<T>, String)> {
        futures::future::join_all(
            parts
                .into_iter()
                .map(|(name, run)| async move { (self.watch(&name, run).await, name) }),
        )
        .await
    }

    /// Waits for the part `name` to end, at most until `limit` after the stop signal: past it, its task is
    /// aborted (dropped where it waits, as a SIGKILL would drop it).
    async fn watch<T>(&self, name: &str, mut run: JoinHandle<T>) -> Ended<T> {
        let past = async {
            self.stop.cancelled().await;
            let at = *self.stopped_at.get_or_init(Instant::now);
            match at.checked_add(self.limit) {
                Some(end) => tokio::time::sleep_until(end).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut run => match r {
                Ok(v) => Ended::Done(v),
                Err(e) => {
                    // Neither the panic's message nor the error's (which quotes it): it may carry a secret, and
                    // the panic hook has printed it already.
                    tracing::error!(
                        part = name,
                        panicked = e.is_panic(),
                        "a part's task ended abnormally (a panic: a bug); every part is stopped"
                    );
                    // The others stop as on the shutdown.
                    self.stop();
                    Ended::Panicked
                }
            },
            () = past => {
                run.abort();
                tracing::error!(
                    part = name,
                    limit_s = self.limit.as_secs(),
                    "a part still running past the shutdown deadline and its grace ignored the stop (a call not answering): abandoned, its task aborted"
                );
                Ended::Abandoned
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::broker::mem::{MemoryDelivery, MemoryQueue, OutgoingMessage};
    use crate::broker::Delivery;
    use crate::error::{BrokerError, BrokerErrorKind};
    use crate::pipeline::outcome::Outcome;
    use crate::runtime::worker::WorkerOptions;

    /// Acknowledges every delivery, counting them.
    struct Ack(Arc<AtomicU64>);

    impl<D: Delivery> Processor<D> for Ack {
        fn consumer(&self) -> &str {
            "monitor"
        }
        async fn process(&self, delivery: D, _stop: CancellationToken) -> Outcome {
            self.0.fetch_add(1, Ordering::SeqCst);
            let _ = delivery.ack().await;
            Outcome::Applied {
                result_reference: None,
            }
        }
    }

    /// A receiver whose every receive is refused (a key rotated).
    struct Refused;

    impl Receiver for Refused {
        type Delivery = MemoryDelivery;
        async fn receive(&mut self, _max: usize) -> Result<Vec<MemoryDelivery>, BrokerError> {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Err(BrokerError::new(
                BrokerErrorKind::Unauthorized,
                "receive",
                "HTTP 401 (the key is not accepted)",
            ))
        }
    }

    /// A part that records that it ran and that it was stopped.
    fn watched(
        ran: Arc<AtomicBool>,
        stopped: Arc<AtomicBool>,
    ) -> impl FnOnce(CancellationToken) -> BoxFuture<'static, ()> {
        move |stop: CancellationToken| {
            async move {
                ran.store(true, Ordering::SeqCst);
                stop.cancelled().await;
                stopped.store(true, Ordering::SeqCst);
            }
            .boxed()
        }
    }

    #[tokio::test]
    async fn a_worker_that_gives_up_stops_every_part_and_exits_non_zero() {
        let (ran, stopped) = (Arc::default(), Arc::default());
        let worker = Worker::new(Refused, Ack(Arc::default())).options(
            WorkerOptions::default()
                .receive_error_backoff(Duration::from_millis(5))
                .receive_error_backoff_max(Duration::from_millis(10))
                .give_up_after(Some(Duration::from_millis(50))),
        );
        let report = Monitor::new()
            .worker(worker)
            .part("watched", watched(Arc::clone(&ran), Arc::clone(&stopped)))
            .run_until(std::future::pending())
            .await;
        assert!(!report.ok());
        assert_eq!(
            report.exit_code(),
            std::process::ExitCode::from(EXIT_GAVE_UP)
        );
        assert!(
            report.worker.as_ref().unwrap().gave_up.is_some(),
            "{report}"
        );
        assert!(ran.load(Ordering::SeqCst) && stopped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn shutdown_drains_the_worker_and_stops_every_part() {
        let q = MemoryQueue::default();
        for i in 0..5 {
            q.send(OutgoingMessage::new(format!("m{i}")));
        }
        let seen = Arc::new(AtomicU64::new(0));
        let (ran, stopped) = (Arc::default(), Arc::default());
        let q2 = q.clone();
        let report = Monitor::new()
            .worker(Worker::new(q.receiver(), Ack(Arc::clone(&seen))))
            .part("watched", watched(Arc::clone(&ran), Arc::clone(&stopped)))
            .run_until(async move {
                while q2.state().visible + q2.state().in_flight > 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await;
        assert!(report.ok(), "{report}");
        assert_eq!(report.exit_code(), std::process::ExitCode::SUCCESS);
        assert_eq!(seen.load(Ordering::SeqCst), 5);
        assert_eq!(report.worker.as_ref().unwrap().total(), 5, "{report}");
        assert!(stopped.load(Ordering::SeqCst));
        assert!(report.effects.is_none());
    }

    #[tokio::test]
    async fn several_workers_run_under_one_shutdown_each_with_its_report() {
        let (a, b) = (MemoryQueue::default(), MemoryQueue::default());
        for i in 0..3 {
            a.send(OutgoingMessage::new(format!("a{i}")));
        }
        for i in 0..4 {
            b.send(OutgoingMessage::new(format!("b{i}")));
        }
        let seen = Arc::new(AtomicU64::new(0));
        let (a2, b2) = (a.clone(), b.clone());
        let report = Monitor::new()
            .worker(Worker::new(a.receiver(), Ack(Arc::clone(&seen))))
            .worker(Worker::new(b.receiver(), Ack(Arc::clone(&seen))))
            .run_until(async move {
                while a2.state().visible
                    + a2.state().in_flight
                    + b2.state().visible
                    + b2.state().in_flight
                    > 0
                {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await;
        assert!(report.ok(), "{report}");
        assert_eq!(report.workers.len(), 2);
        assert_eq!(report.workers[0].total(), 3, "{report}");
        assert_eq!(report.workers[1].total(), 4, "{report}");
        assert_eq!(report.worker.as_ref().map(WorkerReport::total), Some(3));
        assert_eq!(seen.load(Ordering::SeqCst), 7);
    }

    /// Never answers, whatever the stop (a hung store or broker call).
    struct Hangs;

    impl<D: Delivery> Processor<D> for Hangs {
        fn consumer(&self) -> &str {
            "monitor-hangs"
        }
        async fn process(&self, _delivery: D, _stop: CancellationToken) -> Outcome {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_abandons_deliveries_at_shutdown_is_not_ok_and_counts_them() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let q = MemoryQueue::new(crate::broker::mem::QueueOptions {
            wait: Duration::from_secs(1),
            visibility_timeout: Duration::from_secs(300),
            ..Default::default()
        });
        q.send(OutgoingMessage::new("m1"));
        q.send(OutgoingMessage::new("m2"));
        let q2 = q.clone();
        let report = Monitor::new()
            .worker(
                Worker::new(q.receiver(), Hangs)
                    .options(WorkerOptions::default().shutdown_timeout(Duration::from_secs(5))),
            )
            .run_until(async move {
                while q2.state().in_flight < 2 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await;
        assert_eq!(report.worker.as_ref().unwrap().abandoned, 2, "{report}");
        assert!(!report.ok(), "{report}");
        assert_eq!(
            report.exit_code(),
            std::process::ExitCode::from(EXIT_ABANDONED)
        );
        let abandoned: Vec<_> = snap
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == crate::metrics::DELIVERIES_ABANDONED)
            .map(|(k, _, _, v)| {
                (
                    k.key()
                        .labels()
                        .map(|l| l.value().to_owned())
                        .collect::<Vec<_>>(),
                    v,
                )
            })
            .collect();
        assert_eq!(
            abandoned,
            vec![(
                vec!["monitor-hangs".to_owned()],
                metrics_util::debugging::DebugValue::Counter(2)
            )]
        );
    }

    /// A part that ignores its stop (a call that never answers).
    fn deaf() -> impl FnOnce(CancellationToken) -> BoxFuture<'static, ()> {
        |_stop: CancellationToken| std::future::pending().boxed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_part_that_ignores_the_stop_is_abandoned_past_the_grace_and_the_report_is_not_ok() {
        // A receive waits (a long poll), so that the paused clock moves while the worker has nothing to do.
        let q = MemoryQueue::new(crate::broker::mem::QueueOptions {
            wait: Duration::from_secs(1),
            ..Default::default()
        });
        let (ran, stopped) = (Arc::default(), Arc::default());
        let timeout = Duration::from_secs(3);
        let signalled = Arc::new(std::sync::Mutex::new(None));
        let at = Arc::clone(&signalled);
        let monitor = Monitor::new()
            .worker(
                Worker::new(q.receiver(), Ack(Arc::default()))
                    .options(WorkerOptions::default().shutdown_timeout(timeout)),
            )
            .part("deaf", deaf())
            .part("watched", watched(Arc::clone(&ran), Arc::clone(&stopped)))
            .run_until(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                *at.lock().unwrap() = Some(Instant::now());
            });
        // Bounded, so that a monitor waiting for the deaf part without limit fails here instead of hanging.
        let report = tokio::time::timeout(Duration::from_secs(3600), monitor)
            .await
            .expect("the monitor returned: a part that ignores the stop does not hold it");
        let took = signalled.lock().unwrap().expect("signalled").elapsed();
        assert_eq!(report.abandoned_parts, vec!["deaf".to_owned()], "{report}");
        assert!(!report.ok(), "{report}");
        assert_eq!(
            report.exit_code(),
            std::process::ExitCode::from(EXIT_ABANDONED)
        );
        assert!(
            took <= timeout + SHUTDOWN_GRACE + PART_REPORT_WAIT,
            "returned {took:?} after the signal"
        );
        // The other parts stopped as asked, the worker with its report.
        assert!(ran.load(Ordering::SeqCst) && stopped.load(Ordering::SeqCst));
        let worker = report.worker.as_ref().expect("the worker's report");
        assert!(
            worker.gave_up.is_none() && worker.abandoned == 0,
            "{report}"
        );
        assert!(report.to_string().contains("abandoned parts"), "{report}");
    }

    /// An effect store whose claim panics (a bug), with a connection string in its message.
    #[derive(Clone)]
    struct PanicsOnClaim;

    impl EffectStore for PanicsOnClaim {
        type Error = std::convert::Infallible;
        async fn claim_effects(
            &self,
            _: &str,
            _: &[String],
            _: chrono::DateTime<chrono::Utc>,
            _: chrono::DateTime<chrono::Utc>,
            _: i64,
        ) -> Result<Vec<crate::effects::ClaimedEffect>, Self::Error> {
            panic!("lost postgres://txinbox:hunter2@db.internal/app")
        }
        async fn finish_effect(
            &self,
            _: i64,
            _: &str,
            _: &crate::effects::TransitionColumns<'_>,
            _: chrono::DateTime<chrono::Utc>,
        ) -> Result<bool, Self::Error> {
            Ok(false)
        }
        async fn purge_done_effects(
            &self,
            _: chrono::DateTime<chrono::Utc>,
            _: i64,
        ) -> Result<u64, Self::Error> {
            Ok(0)
        }
        async fn effect_counts(&self) -> Result<Vec<crate::effects::EffectCount>, Self::Error> {
            Ok(Vec::new())
        }
        async fn find_effect(
            &self,
            _: &str,
        ) -> Result<Option<crate::effects::ClaimedEffect>, Self::Error> {
            Ok(None)
        }
        async fn mark_compensated(
            &self,
            _: i64,
            _: &str,
            _: chrono::DateTime<chrono::Utc>,
        ) -> Result<bool, Self::Error> {
            Ok(false)
        }
    }

    /// A destination the panicking store never lets the runner call.
    struct Unused;

    impl crate::effects::EffectExecutor for Unused {
        fn execute<'a>(
            &'a self,
            _: &'a crate::effects::ClaimedEffect,
        ) -> BoxFuture<'a, crate::effects::Execution> {
            unreachable!("nothing is claimed")
        }
        fn confirm<'a>(
            &'a self,
            _: &'a crate::effects::ClaimedEffect,
        ) -> BoxFuture<'a, crate::effects::Confirmation> {
            unreachable!("nothing is claimed")
        }
    }

    /// A queue whose receive waits (a long poll), so that the paused clock moves while a worker has nothing to
    /// do.
    fn waiting_queue() -> MemoryQueue {
        MemoryQueue::new(crate::broker::mem::QueueOptions {
            wait: Duration::from_secs(1),
            ..Default::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_effect_runner_stops_every_part_and_the_report_is_not_ok() {
        let q = waiting_queue();
        q.send(OutgoingMessage::new("m1"));
        let seen = Arc::new(AtomicU64::new(0));
        let (ran, stopped) = (Arc::default(), Arc::default());
        let monitor = Monitor::new()
            .worker(Worker::new(q.receiver(), Ack(Arc::clone(&seen))))
            .effects(EffectRunner::new(PanicsOnClaim).executor("crm", Unused))
            .part("watched", watched(Arc::clone(&ran), Arc::clone(&stopped)))
            .run_until(std::future::pending());
        // Bounded, so that a monitor that goes on without its effect runner fails here instead of hanging.
        let report = tokio::time::timeout(Duration::from_secs(3600), monitor)
            .await
            .expect("the panic stopped every part");
        assert_eq!(
            report.panicked_parts,
            vec!["effects".to_owned()],
            "{report}"
        );
        assert!(report.abandoned_parts.is_empty(), "{report}");
        assert!(!report.ok(), "{report}");
        assert_eq!(
            report.exit_code(),
            std::process::ExitCode::from(EXIT_PANICKED)
        );
        // The other parts stopped as on a shutdown: the watched part saw its stop, the worker drained with
        // its report.
        assert!(ran.load(Ordering::SeqCst) && stopped.load(Ordering::SeqCst));
        let worker = report.worker.as_ref().expect("the worker's report");
        assert!(
            worker.gave_up.is_none() && worker.abandoned == 0,
            "{report}"
        );
        assert!(!report.to_string().contains("hunter2"), "{report}");
    }

    /// A receiver that panics (a bug), with a connection string in its message.
    struct PanicsOnReceive;

    impl Receiver for PanicsOnReceive {
        type Delivery = MemoryDelivery;
        async fn receive(&mut self, _max: usize) -> Result<Vec<MemoryDelivery>, BrokerError> {
            panic!("lost postgres://txinbox:hunter2@db.internal/app")
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_worker_is_named_without_its_message_and_stops_every_part() {
        let (ran, stopped) = (Arc::default(), Arc::default());
        let report = Monitor::new()
            .worker(Worker::new(PanicsOnReceive, Ack(Arc::default())))
            .part("watched", watched(Arc::clone(&ran), Arc::clone(&stopped)))
            .run_until(std::future::pending())
            .await;
        assert_eq!(
            report.panicked_parts,
            vec!["worker monitor".to_owned()],
            "{report}"
        );
        assert!(!report.ok(), "{report}");
        assert_eq!(
            report.exit_code(),
            std::process::ExitCode::from(EXIT_PANICKED)
        );
        assert!(ran.load(Ordering::SeqCst) && stopped.load(Ordering::SeqCst));
        assert!(!report.to_string().contains("hunter2"), "{report}");
        assert!(!format!("{report:?}").contains("hunter2"), "{report:?}");
    }
}
