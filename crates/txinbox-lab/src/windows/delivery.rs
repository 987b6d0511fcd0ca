//! The per-delivery windows: a crash at each point of the pipeline, a lock lost while the handler runs, two
//! copies at once, a redrive from the DLQ, a payload collision, a business duplicate, a redelivery after the
//! marker's retention, and a shutdown with deliveries in flight.

use std::sync::Arc;
use std::time::Duration;

use txinbox_core::broker::mem::MemoryQueue;
use txinbox_core::broker::mem::QueueState;
use txinbox_core::{metrics as m, Delivery, OutcomeKind, RetentionPolicy, Worker, WorkerOptions};

use super::{
    one, queue, rows, second_copy_waits, Checks, Expected, Gated, Window, PAST_VISIBILITY,
};
use crate::faults::{crash_at, FaultPoint, Faults, FaultyStore};
use crate::lab::{
    followup_business_key, lab_inbox, lab_message, lab_processor, task_handler, LabError, CONSUMER,
};
use crate::labdb::LabStore;

/// Runs a per-delivery window on `store` (fresh, migrated, with the lab's tables): the queue it leaves, the
/// outcome line and what to expect.
pub(crate) async fn run<S: LabStore>(
    store: S,
    w: Window,
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
            c.eq("inbox rows after the crash", rows(&store).await?, mid);
            c.eq("effects after the crash", store.count_tasks().await?, mid);
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
            // The first worker finishes first. On a SQL store the second waits on the first's marker row
            // meanwhile; on a store that decides at commit it runs its handler and waits at the gate.
            if let Some(there) = second_copy_waits(&store, &gated).await? {
                c.eq(
                    "second worker waits on the first before it commits",
                    there,
                    true,
                );
            }
            gated.open(1);
            let oa = ta.await.map_err(|e| LabError::Usage(e.to_string()))?;
            gated.open(1);
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
            // The second copy reaches the marker insert and blocks on the first's key (PostgreSQL), or runs
            // its handler up to the gate (a store that decides at commit), before the first goes on.
            if let Some(there) = second_copy_waits(&store, &gated).await? {
                c.eq(
                    "second copy waits on the first before it commits",
                    there,
                    true,
                );
            }
            gated.open(1);
            let oa = ta.await.map_err(|e| LabError::Usage(e.to_string()))?;
            gated.open(1);
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
                .bind_handler(task_handler::<S>())
                .business_key(followup_business_key);
            let p = lab_inbox(store.clone())
                .retention(retention)
                .bind_handler(task_handler::<S>())
                .business_key(followup_business_key);
            let q = queue(Some(5));
            q.send(lab_message(0));
            let d = one(q.receive_now(1), "first")?;
            let crashed = crash_at(&faulty, &faults, d, FaultPoint::AfterCommit).await;
            c.eq("first attempt crashed after commit", crashed.is_err(), true);
            // Two hours later: the marker's retention ended and the purge ran; then the message comes back.
            let later = chrono::Utc::now() + chrono::Duration::hours(2);
            let before = rows(&store).await?;
            let purge = txinbox_core::Maintenance::new(store.clone())
                .run_once_at(later, &mut |_| {})
                .await;
            // On DynamoDB the TTL deletes expired markers, later and at no write cost: the maintenance deletes
            // nothing, the marker stays until then, and its condition already treats it as absent. In the
            // partitioned layout the marker goes with its whole partition: no row is deleted.
            let drops = store.drops_partitions();
            let gone = i64::from(store.purges_expired_markers() || drops);
            c.eq("markers gone", before - rows(&store).await?, gone);
            c.eq(
                "markers deleted row by row",
                purge.removed_from(txinbox_core::runtime::maintenance::Table::Markers) as i64,
                i64::from(store.purges_expired_markers() && !drops),
            );
            if drops {
                let dropped = purge
                    .partitions
                    .as_ref()
                    .and_then(|p| {
                        p.dropped
                            .get(&txinbox_core::runtime::maintenance::Table::Markers)
                    })
                    .copied()
                    .unwrap_or(0);
                c.eq("the marker's partition dropped", dropped >= 1, true);
            }
            q.advance(Duration::from_secs(7200));
            let d = one(q.receive_now(1), "late redelivery")?;
            let o = p.process_one(d).await;
            c.eq("late redelivery refused", o.label(), "dead_lettered");
            let mut signals = vec![
                (m::APPLIED, 1),
                (m::RETENTION_EXPIRED, 1),
                (m::DEAD_LETTERS, 1),
            ];
            if store.purges_expired_markers() && !drops {
                signals.push((m::RETENTION_PURGED, 1));
            }
            (
                q,
                if drops {
                    format!("crashed(AfterCommit) > partition dropped > {o}")
                } else if store.purges_expired_markers() {
                    format!("crashed(AfterCommit) > purge > {o}")
                } else {
                    format!("crashed(AfterCommit) > expiry left to the TTL > {o}")
                },
                (
                    1 - gone,
                    1,
                    QueueState {
                        dead_lettered: 1,
                        ..QueueState::default()
                    },
                    0,
                    signals,
                ),
            )
        }
        Window::CopyAfterPartitionBoundary => {
            if !store.drops_partitions() {
                return Err(LabError::Usage(
                    "copy_after_partition_boundary runs on the partitioned layout only (--partitioned)"
                        .into(),
                ));
            }
            let q = queue(Some(5));
            // The next partition boundary of the lab's layout (hour-wide partitions).
            let width = crate::lab::lab_partition_options().width.as_secs() as i64;
            let now = q.now();
            let boundary = chrono::DateTime::<chrono::Utc>::from_timestamp(
                (now.timestamp().div_euclid(width) + 1) * width,
                0,
            )
            .ok_or_else(|| LabError::Usage("time out of range".into()))?;
            // A: an event whose CloudEvents `time` is one second before the boundary. B: an event of this
            // window's start (before the boundary). Not the lab's own event time, which is taken once per
            // process: a process that began in the hour before `now` would put B's marker in a partition
            // that is past its keep at this boundary, and the maintenance would rightly drop it.
            let event_time = (boundary - chrono::Duration::seconds(1)).to_rfc3339();
            let a = || lab_message(0).attribute("ce-time", event_time.clone());
            q.send(a());
            q.send(lab_message(1).attribute("ce-time", now.to_rfc3339()));
            for what in ["first copy of A", "first copy of B"] {
                let d = one(q.receive_now(1), what)?;
                let crashed = crash_at(&faulty, &faults, d, FaultPoint::AfterCommit).await;
                c.eq("first copy crashed after COMMIT", crashed.is_err(), true);
            }
            c.eq("inbox rows before the boundary", rows(&store).await?, 2);
            // Past the boundary (and the visibility timeout): the maintenance creates the partitions of the
            // new hour and drops those past their keep; the first copies' partition stays.
            q.advance((boundary - now).to_std().unwrap_or_default() + Duration::from_secs(60));
            let pass = txinbox_core::Maintenance::new(store.clone())
                .run_once_at(q.now(), &mut |_| {})
                .await;
            c.eq("maintenance error", pass.error.clone(), None);
            let mut labels = Vec::new();
            for what in [
                "redelivery of A after the boundary",
                "redelivery of B after the boundary",
            ] {
                let d = one(q.receive_now(1), what)?;
                c.eq(
                    "arrives after the boundary",
                    d.message().received_at >= boundary,
                    true,
                );
                let o = p.process_one(d).await;
                c.eq(what, o.label(), "duplicate");
                labels.push(o.label());
            }
            // The producer sends A again after the boundary: a new broker message (new enqueue time), the
            // same event id and `time`.
            q.send(a());
            let d = one(q.receive_now(1), "A sent again")?;
            let o = p.process_one(d).await;
            c.eq("A sent again after the boundary", o.label(), "duplicate");
            labels.push(o.label());
            (
                q,
                format!(
                    "crashed(AfterCommit) x2 > boundary > {}",
                    labels.join(" > ")
                ),
                (
                    2,
                    2,
                    QueueState::default(),
                    0,
                    vec![(m::APPLIED, 2), (m::DUPLICATES, 3)],
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
            c.eq("deadline: nothing committed", rows(&store).await?, 3);
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
        _ => {
            return Err(LabError::Usage(format!(
                "{} is not a per-delivery window",
                w.name()
            )))
        }
    })
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
