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
//!     report.exit_code() // 3 when the worker gave up, 4 when it abandoned deliveries at shutdown
//! }
//! ```
//!
//! When the shutdown future resolves, or the worker stops by itself (it gave up on receives a retry cannot fix,
//! or ran out of work with [`Worker::run_until_idle`](super::worker::Worker::run_until_idle)'s semantics),
//! every part is stopped: the worker drains (commit, then settle), the effect runner finishes the effects it
//! claimed (for up to 20 s, then gives up what is still in flight to its next holder's reconciliation), the
//! maintenance ends its pass, the health endpoint closes.

use std::fmt;
use std::future::Future;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::broker::Receiver;
use crate::effects::{EffectReport, EffectRunner, EffectStore};
use crate::runtime::maintenance::{Maintenance, MaintenanceStore};
use crate::runtime::worker::{LeasedDelivery, Processor, Worker, WorkerReport};

type Part<T> = Box<dyn FnOnce(CancellationToken) -> BoxFuture<'static, T> + Send>;

/// Runs a consumer's worker, effect runner, maintenance and health endpoint under one shutdown. See the
/// [module docs](self).
#[must_use = "a Monitor does nothing until run_until is awaited"]
#[derive(Default)]
pub struct Monitor {
    workers: Vec<Part<WorkerReport>>,
    effects: Vec<Part<EffectReport>>,
    maintenance: Vec<Part<()>>,
    others: Vec<(&'static str, Part<()>)>,
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor")
            .field("workers", &self.workers.len())
            .field("effects", &self.effects.len())
            .field("maintenance", &self.maintenance.len())
            .field(
                "others",
                &self.others.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            )
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
}

impl MonitorReport {
    /// Whether every part ended as asked: `false` when a worker gave up, or when a worker abandoned deliveries
    /// at shutdown ([`WorkerReport::abandoned`]: still in flight past the shutdown grace, a store or broker call
    /// that did not answer). Abandoned deliveries are not lost (they come back after their lock or visibility
    /// timeout), but the shutdown did not settle them, and a hung call is worth a look.
    pub fn ok(&self) -> bool {
        self.workers
            .iter()
            .all(|w| w.gave_up.is_none() && w.abandoned == 0)
    }

    /// The process's exit status, so that a supervisor sees what [`ok`](Self::ok) says: success,
    /// [`EXIT_GAVE_UP`] (3) when a worker gave up (receives kept failing with an error a retry cannot fix), else
    /// [`EXIT_ABANDONED`] (4) when a worker abandoned deliveries at shutdown.
    pub fn exit_code(&self) -> std::process::ExitCode {
        if self.workers.iter().any(|w| w.gave_up.is_some()) {
            std::process::ExitCode::from(EXIT_GAVE_UP)
        } else if self.ok() {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::from(EXIT_ABANDONED)
        }
    }
}

/// The exit status of a process whose worker gave up ([`MonitorReport::exit_code`]).
pub const EXIT_GAVE_UP: u8 = 3;

/// The exit status of a process whose worker abandoned deliveries at shutdown, past the shutdown grace
/// ([`MonitorReport::exit_code`], [`WorkerReport::abandoned`]).
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
        self.workers.push(Box::new(move |stop: CancellationToken| {
            worker.run_until(stop.cancelled_owned()).boxed()
        }));
        self
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
    /// returns what they did.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> MonitorReport {
        let stop = CancellationToken::new();
        // Each part is a task of its own: parts polled side by side in one task would share its cooperative
        // budget, and a busy first part would starve the next (seen with two workers under `join_all`); as
        // tasks they also spread over a multi-threaded runtime's threads.
        let workers: Vec<_> = self
            .workers
            .into_iter()
            .map(|w| {
                let s = stop.clone();
                let run = tokio::spawn(w(stop.clone()));
                // A worker that stops by itself (it gave up) stops the others too.
                async move {
                    let report = run.await.unwrap_or_else(|e| WorkerReport {
                        gave_up: Some(format!("the worker's task ended abnormally: {e}")),
                        ..WorkerReport::default()
                    });
                    s.cancel();
                    report
                }
            })
            .collect();
        let effects: Vec<_> = self
            .effects
            .into_iter()
            .map(|e| tokio::spawn(e(stop.clone())))
            .collect();
        let maintenance: Vec<_> = self
            .maintenance
            .into_iter()
            .map(|m| tokio::spawn(m(stop.clone())))
            .collect();
        let others: Vec<_> = self
            .others
            .into_iter()
            .map(|(_, p)| tokio::spawn(p(stop.clone())))
            .collect();
        let signal = {
            let s = stop.clone();
            async move {
                tokio::select! {
                    _ = shutdown => s.cancel(),
                    _ = s.cancelled() => {}
                }
            }
        };
        let (workers, effects, _, _, _) = tokio::join!(
            futures::future::join_all(workers),
            async {
                if effects.is_empty() {
                    return None;
                }
                let mut sum = EffectReport::default();
                for r in futures::future::join_all(effects).await {
                    match r {
                        Ok(r) => sum.add(&r),
                        Err(e) => {
                            tracing::error!(error = %e, "an effect runner's task ended abnormally")
                        }
                    }
                }
                Some(sum)
            },
            futures::future::join_all(maintenance),
            futures::future::join_all(others),
            signal,
        );
        for w in &workers {
            if let Some(why) = &w.gave_up {
                tracing::error!(reason = %why, "a worker gave up; every part stopped");
            }
        }
        MonitorReport {
            worker: workers.first().cloned(),
            workers,
            effects,
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
}
