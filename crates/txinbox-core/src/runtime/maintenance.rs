//! Retention that runs itself: removes expired inbox markers, evidence rows past their own retention and
//! finished effects, in bounded batches with a pause between them and a time budget per run, so it never holds
//! a lock the applying transactions wait on for long. The worker process runs it in the background
//! ([`Maintenance::run_until`]); operators run one pass with `txinbox inbox purge`.
//!
//! What is kept and for how long:
//!
//! | table | removed when | default |
//! |---|---|---|
//! | markers (`txinbox_inbox`) | their `retention_until` has passed (set from the inbox's [`crate::RetentionPolicy`]) | 30 days |
//! | evidence (`txinbox_rejections`) | recorded longer ago than [`MaintenanceOptions::rejections_keep`] | 90 days |
//! | effects (`txinbox_effects`) | done or compensated longer ago than [`MaintenanceOptions::effects_keep`]; failed and needs-attention ones stay for an operator | 7 days |
//!
//! The marker keeps only the key and minimal metadata (the payload is never stored); the evidence keeps a hash
//! and a detail, not the payload.
//!
//! In the background ([`Maintenance::run_until`]) each pass is bounded: a pass still running
//! [`PASS_OVERRUN`] past its time budget ([`MaintenanceOptions::pass_timeout`]: a store call that does not
//! answer) is given up, logged and counted in `txinbox_maintenance_failed_passes_total{reason="timeout"}`, and
//! the next pass runs [`MaintenanceOptions::every`] later as after any other pass. A pass stopped by a store
//! error is counted there too (`reason="store_error"`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

/// How long past its time budget ([`MaintenanceOptions::budget`]) a background pass may run before it is given up
/// (60 s): the budget is checked between batches, so a pass may overrun it by its last batch, the partition
/// rotation and the row counts it publishes, all short statements; a pass still running then has a store call
/// that does not answer. See [`MaintenanceOptions::pass_timeout`].
pub const PASS_OVERRUN: Duration = Duration::from_secs(60);

/// A table the maintenance cleans.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Table {
    /// `txinbox_inbox`: the markers.
    Markers,
    /// `txinbox_rejections`: evidence of collisions and business duplicates.
    Rejections,
    /// `txinbox_effects`: external effects.
    Effects,
}

impl Table {
    /// Every table, in the order a pass cleans them.
    pub const ALL: [Table; 3] = [Table::Markers, Table::Rejections, Table::Effects];

    /// The metric label (`markers`, `rejections`, `effects`).
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Markers => "markers",
            Table::Rejections => "rejections",
            Table::Effects => "effects",
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the maintenance needs from a store.
pub trait MaintenanceStore: Clone + Send + Sync + 'static {
    /// The driver's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Deletes up to `limit` rows of `table` that expired before `before` (markers: `retention_until`;
    /// rejections: `recorded_at`; effects: done or compensated, `finished_at`), in a short transaction of its
    /// own that skips rows another transaction holds; returns the consumer of each deleted row.
    fn purge_batch(
        &self,
        table: Table,
        before: DateTime<Utc>,
        limit: i64,
    ) -> impl std::future::Future<Output = Result<Vec<String>, Self::Error>> + Send;

    /// Rows of `table` for `consumer` and the time of the oldest (markers: `processed_at`; rejections:
    /// `recorded_at`; effects: `created_at`), with bounded queries.
    fn table_stats(
        &self,
        table: Table,
        consumer: &str,
    ) -> impl std::future::Future<Output = Result<(i64, Option<DateTime<Utc>>), Self::Error>> + Send;

    /// The store's own clock, read now, where every node reads the same one (PostgreSQL's `now()`): a pass
    /// decides what has expired by it, so that a node whose host clock runs ahead never removes a marker
    /// whose message can still come back, as the database counts its retention. `None` (the default): the
    /// host's clock.
    fn clock(
        &self,
    ) -> impl std::future::Future<Output = Result<Option<DateTime<Utc>>, Self::Error>> + Send {
        async { Ok(None) }
    }

    /// For a store whose tables are partitioned by time (the PostgreSQL store's partitioned layout): creates
    /// the partitions ahead of `now` and drops whole the ones past their retention (evidence: older than
    /// [`MaintenanceOptions::rejections_keep`]; effects: older than [`MaintenanceOptions::effects_keep`] and
    /// all finished), one node at a time. `None` (the default) for a store without partitions, whose expired
    /// rows [`MaintenanceStore::purge_batch`] deletes.
    fn rotate_partitions(
        &self,
        now: DateTime<Utc>,
        opts: &MaintenanceOptions,
    ) -> impl std::future::Future<Output = Result<Option<PartitionRotation>, Self::Error>> + Send
    {
        let _ = (now, opts);
        async { Ok(None) }
    }
}

/// What one rotation of a partitioned store did ([`MaintenanceStore::rotate_partitions`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionRotation {
    /// Partitions created ahead, by table.
    pub created: BTreeMap<Table, u32>,
    /// Partitions dropped whole (past their retention), by table.
    pub dropped: BTreeMap<Table, u32>,
    /// Partitions past their retention kept because a row in them must stay (an effect not done, for an
    /// operator), by table.
    pub held: BTreeMap<Table, u32>,
    /// Where the newest partition of each table ends: a marker whose origin time is later has no partition
    /// and is released ([`crate::MarkerInsert::Unplaced`]).
    pub ends: BTreeMap<Table, DateTime<Utc>>,
    /// Another node held the rotation's lock: this one did nothing.
    pub skipped: bool,
    /// The frozen table of the row-by-row layout was dropped (its last marker had expired).
    pub legacy_dropped: bool,
}

/// How the maintenance runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "MaintenanceOptions do nothing until given to a Maintenance"]
pub struct MaintenanceOptions {
    /// Rows deleted per statement (default 1,000).
    pub batch: i64,
    /// Pause between two batches (default 50 ms): the applying transactions get the database back.
    pub pause: Duration,
    /// Longest time one pass may take (default 30 s); what is left waits for the next pass.
    pub budget: Duration,
    /// Time between two passes when running in the background (default 5 min).
    pub every: Duration,
    /// How long evidence rows are kept (default 90 days).
    pub rejections_keep: Duration,
    /// How long done and compensated effects are kept (default 7 days).
    pub effects_keep: Duration,
    /// Consumers whose rows left and oldest row are published as gauges after each pass (default none).
    pub consumers: Vec<String>,
    /// The shard this store is ([`crate::runtime::shards`]), added as a `shard` label to the gauges, so that
    /// the maintenances of several shards of one consumer publish one series each (default none).
    pub shard: Option<String>,
}

impl Default for MaintenanceOptions {
    fn default() -> Self {
        Self {
            batch: 1000,
            pause: Duration::from_millis(50),
            budget: Duration::from_secs(30),
            every: Duration::from_secs(300),
            rejections_keep: Duration::from_secs(90 * 24 * 3600),
            effects_keep: Duration::from_secs(7 * 24 * 3600),
            consumers: Vec::new(),
            shard: None,
        }
    }
}

impl MaintenanceOptions {
    /// Sets the batch size.
    pub fn batch(mut self, n: i64) -> Self {
        self.batch = n.max(1);
        self
    }
    /// Sets the pause between batches.
    pub fn pause(mut self, d: Duration) -> Self {
        self.pause = d;
        self
    }
    /// Sets the time budget of one pass.
    pub fn budget(mut self, d: Duration) -> Self {
        self.budget = d;
        self
    }
    /// Sets the time between passes.
    pub fn every(mut self, d: Duration) -> Self {
        self.every = d;
        self
    }
    /// Sets how long evidence rows are kept.
    pub fn rejections_keep(mut self, d: Duration) -> Self {
        self.rejections_keep = d;
        self
    }
    /// Sets how long done effects are kept.
    pub fn effects_keep(mut self, d: Duration) -> Self {
        self.effects_keep = d;
        self
    }
    /// Labels the gauges with `shard` (one maintenance per shard of a worker).
    pub fn shard(mut self, shard: impl Into<String>) -> Self {
        self.shard = Some(shard.into());
        self
    }
    /// Publishes the gauges of `consumer` after each pass.
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumers.push(consumer.into());
        self
    }
    /// How long one background pass ([`Maintenance::run_until`]) may take before it is given up, its store call
    /// in flight dropped: the [`budget`](Self::budget) plus [`PASS_OVERRUN`] (default 90 s). What that pass did
    /// not remove is purged by the next one.
    pub fn pass_timeout(&self) -> Duration {
        self.budget.saturating_add(PASS_OVERRUN)
    }
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a MaintenanceReport says what the pass removed"]
pub struct MaintenanceReport {
    /// Rows removed, by table and consumer.
    pub removed: BTreeMap<(Table, String), u64>,
    /// Statements run.
    pub batches: u64,
    /// Whether the pass stopped on its time budget with rows maybe left.
    pub budget_exhausted: bool,
    /// How long the pass took.
    pub elapsed: Duration,
    /// Store errors met (the pass stops at the first).
    pub error: Option<String>,
    /// What the partition rotation did, for a partitioned store.
    pub partitions: Option<PartitionRotation>,
}

impl MaintenanceReport {
    /// Rows removed from `table`, all consumers.
    pub fn removed_from(&self, table: Table) -> u64 {
        self.removed
            .iter()
            .filter(|((t, _), _)| *t == table)
            .map(|(_, n)| n)
            .sum()
    }
}

impl fmt::Display for MaintenanceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "purged markers={} rejections={} effects={} batches={} seconds={:.1}{}",
            self.removed_from(Table::Markers),
            self.removed_from(Table::Rejections),
            self.removed_from(Table::Effects),
            self.batches,
            self.elapsed.as_secs_f64(),
            if self.budget_exhausted {
                " (time budget reached: the rest waits for the next pass)"
            } else {
                ""
            }
        )?;
        if let Some(p) = &self.partitions {
            let sum = |m: &BTreeMap<Table, u32>| m.values().sum::<u32>();
            if p.skipped {
                write!(f, " partitions: another node rotates them")?;
            } else {
                write!(
                    f,
                    " partitions created={} dropped={} held={}{}",
                    sum(&p.created),
                    sum(&p.dropped),
                    sum(&p.held),
                    if p.legacy_dropped {
                        " (the row-by-row layout's frozen table dropped)"
                    } else {
                        ""
                    }
                )?;
            }
        }
        Ok(())
    }
}

/// Runs the retention of a store.
#[derive(Debug, Clone)]
#[must_use = "a Maintenance does nothing until run"]
pub struct Maintenance<S> {
    store: S,
    opts: MaintenanceOptions,
}

impl<S: MaintenanceStore> Maintenance<S> {
    /// Maintenance of `store` with the default options.
    pub fn new(store: S) -> Self {
        Self {
            store,
            opts: MaintenanceOptions::default(),
        }
    }

    /// Sets the options.
    pub fn options(mut self, opts: MaintenanceOptions) -> Self {
        self.opts = opts;
        self
    }

    /// One pass at `now`: each table in turn, batch after batch with a pause between them, until nothing
    /// expired is left or the time budget runs out. `progress` is told after each batch (for a terminal).
    pub async fn run_once_at(
        &self,
        now: DateTime<Utc>,
        progress: &mut (dyn FnMut(&MaintenanceReport) + Send),
    ) -> MaintenanceReport {
        let started = Instant::now();
        let mut report = MaintenanceReport::default();
        // A keep too long for a date (`Duration::MAX` for "for ever") keeps everything.
        let since = |d: Duration| crate::time::before(now, d);
        match self.store.rotate_partitions(now, &self.opts).await {
            Ok(p) => report.partitions = p,
            Err(e) => {
                tracing::warn!(error = %e, "maintenance: partition rotation failed");
                report.error = Some(e.to_string());
            }
        }
        'tables: for table in Table::ALL {
            let before = match table {
                Table::Markers => now,
                Table::Rejections => since(self.opts.rejections_keep),
                Table::Effects => since(self.opts.effects_keep),
            };
            loop {
                if started.elapsed() >= self.opts.budget {
                    report.budget_exhausted = true;
                    break 'tables;
                }
                let consumers = match self.store.purge_batch(table, before, self.opts.batch).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(%table, error = %e, "maintenance: purge failed");
                        report.error = Some(e.to_string());
                        break 'tables;
                    }
                };
                report.batches += 1;
                let n = consumers.len() as i64;
                for consumer in consumers {
                    *report.removed.entry((table, consumer)).or_default() += 1;
                }
                report.elapsed = started.elapsed();
                progress(&report);
                if n < self.opts.batch {
                    break;
                }
                tokio::time::sleep(self.opts.pause).await;
            }
        }
        report.elapsed = started.elapsed();
        self.publish(&report).await;
        report
    }

    /// One pass now: at the store's clock ([`MaintenanceStore::clock`]) where it has one, else the host's. A
    /// store that cannot tell its time is not purged by this pass (the report's `error` says why).
    pub async fn run_once(&self) -> MaintenanceReport {
        match self.store.clock().await {
            Ok(now) => {
                self.run_once_at(now.unwrap_or_else(Utc::now), &mut |_| {})
                    .await
            }
            Err(e) => {
                tracing::warn!(error = %e, "maintenance: reading the store's clock failed; nothing purged");
                MaintenanceReport {
                    error: Some(e.to_string()),
                    ..MaintenanceReport::default()
                }
            }
        }
    }

    /// A pass every [`MaintenanceOptions::every`] until `shutdown` resolves. A pass in progress is dropped at
    /// once, with its store call in flight: what that batch did not remove is purged by the next pass. A pass
    /// that outlasts [`MaintenanceOptions::pass_timeout`] (a store call that does not answer) is dropped the same
    /// way, logged and counted in `txinbox_maintenance_failed_passes_total{reason="timeout"}`, and the next pass
    /// runs as after any other: a hung call never stops the retention for good.
    pub async fn run_until(&self, shutdown: impl std::future::Future<Output = ()> + Send) {
        tokio::pin!(shutdown);
        // Registered at zero, so a first failure shows as an increase.
        for reason in [FAILED_TIMEOUT, FAILED_STORE_ERROR] {
            self.failed_pass(reason, 0);
        }
        let timeout = self.opts.pass_timeout();
        loop {
            let pass = tokio::time::timeout(timeout, self.run_once());
            tokio::select! {
                _ = &mut shutdown => return,
                r = pass => match r {
                    Ok(r) => {
                        if r.error.is_some() {
                            self.failed_pass(FAILED_STORE_ERROR, 1);
                        }
                        tracing::info!(%r, "maintenance pass");
                    }
                    Err(_) => {
                        self.failed_pass(FAILED_TIMEOUT, 1);
                        tracing::warn!(
                            timeout_s = timeout.as_secs(),
                            every_s = self.opts.every.as_secs(),
                            "maintenance pass given up: still running past its budget and the overrun (a store call not answering); the next pass runs as usual"
                        );
                    }
                },
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(self.opts.every) => {}
            }
        }
    }

    /// Adds `n` to `txinbox_maintenance_failed_passes_total{reason}`, once per consumer the options name
    /// (their `consumer` label, so that the alert reaches the consumer's owner; no `consumer` label when
    /// they name none), with the shard's label.
    fn failed_pass(&self, reason: &'static str, n: u64) {
        let mut consumers: Vec<Option<&str>> = self
            .opts
            .consumers
            .iter()
            .map(|c| Some(c.as_str()))
            .collect();
        if consumers.is_empty() {
            consumers.push(None);
        }
        for consumer in consumers {
            let mut labels = vec![metrics::Label::new("reason", reason)];
            if let Some(c) = consumer {
                labels.push(metrics::Label::new("consumer", c.to_owned()));
            }
            metrics::counter!(
                crate::metrics::MAINTENANCE_FAILED,
                shard_labels(labels, self.opts.shard.as_deref())
            )
            .increment(n);
        }
    }

    async fn publish(&self, report: &MaintenanceReport) {
        use crate::metrics as m;
        for ((table, consumer), n) in &report.removed {
            metrics::counter!(m::MAINTENANCE_REMOVED, "table" => table.as_str(), "consumer" => consumer.clone())
                .increment(*n);
            if *table == Table::Markers {
                metrics::counter!(m::RETENTION_PURGED, "consumer" => consumer.clone())
                    .increment(*n);
            }
        }
        metrics::histogram!(m::MAINTENANCE_DURATION).record(report.elapsed.as_secs_f64());
        if let Some(p) = report.partitions.as_ref().filter(|p| !p.skipped) {
            let shard = self.opts.shard.as_deref();
            for (table, n) in &p.created {
                metrics::counter!(
                    m::PARTITIONS_CREATED,
                    shard_labels(vec![metrics::Label::new("table", table.as_str())], shard)
                )
                .increment(u64::from(*n));
            }
            for (table, n) in &p.dropped {
                metrics::counter!(
                    m::PARTITIONS_DROPPED,
                    shard_labels(vec![metrics::Label::new("table", table.as_str())], shard)
                )
                .increment(u64::from(*n));
            }
            // The partitions are the store's; the gauge is published for each consumer the maintenance
            // publishes for, so that an alert routes to the consumer's owner.
            let consumers: Vec<Option<&String>> = if self.opts.consumers.is_empty() {
                vec![None]
            } else {
                self.opts.consumers.iter().map(Some).collect()
            };
            for (table, end) in &p.ends {
                for consumer in &consumers {
                    let mut labels = vec![metrics::Label::new("table", table.as_str())];
                    if let Some(c) = consumer {
                        labels.push(metrics::Label::new("consumer", (*c).clone()));
                    }
                    metrics::gauge!(m::PARTITIONS_END, shard_labels(labels, shard))
                        .set(end.timestamp() as f64);
                }
            }
        }
        let now = Utc::now();
        for consumer in &self.opts.consumers {
            // Registered at zero, so a first purge shows as an increase.
            metrics::counter!(m::RETENTION_PURGED, "consumer" => consumer.clone()).increment(0);
            for table in Table::ALL {
                metrics::counter!(m::MAINTENANCE_REMOVED, "table" => table.as_str(), "consumer" => consumer.clone())
                    .increment(0);
                match self.store.table_stats(table, consumer).await {
                    Ok((rows, oldest)) => {
                        let shard = self.opts.shard.as_deref();
                        let labels = shard_labels(
                            vec![
                                metrics::Label::new("table", table.as_str()),
                                metrics::Label::new("consumer", consumer.clone()),
                            ],
                            shard,
                        );
                        metrics::gauge!(m::MAINTENANCE_ROWS, labels.clone()).set(rows as f64);
                        if table == Table::Markers {
                            let labels = shard_labels(
                                vec![metrics::Label::new("consumer", consumer.clone())],
                                shard,
                            );
                            metrics::gauge!(m::INBOX_ROWS, labels).set(rows as f64);
                        }
                        let age = oldest
                            .map_or(0.0, |t| (now - t).num_milliseconds().max(0) as f64 / 1e3);
                        metrics::gauge!(m::MAINTENANCE_OLDEST, labels).set(age);
                    }
                    Err(e) => {
                        tracing::warn!(%table, consumer, error = %e, "maintenance: reading row counts failed")
                    }
                }
            }
        }
    }
}

/// `reason` of a background pass given up past [`MaintenanceOptions::pass_timeout`].
const FAILED_TIMEOUT: &str = "timeout";
/// `reason` of a pass stopped by a store error.
const FAILED_STORE_ERROR: &str = "store_error";

/// `labels`, with `shard` added when there is one.
pub(crate) fn shard_labels(
    mut labels: Vec<metrics::Label>,
    shard: Option<&str>,
) -> Vec<metrics::Label> {
    if let Some(s) = shard {
        labels.push(metrics::Label::new("shard", s.to_owned()));
    }
    labels
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A store whose first purge call never answers (a hung connection); every later one finds nothing to
    /// remove. Counts the purge calls.
    #[derive(Clone, Default)]
    struct HangsOnce {
        purges: Arc<AtomicU64>,
    }

    impl MaintenanceStore for HangsOnce {
        type Error = std::io::Error;
        async fn purge_batch(
            &self,
            _: Table,
            _: DateTime<Utc>,
            _: i64,
        ) -> Result<Vec<String>, Self::Error> {
            if self.purges.fetch_add(1, Ordering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            Ok(Vec::new())
        }
        async fn table_stats(
            &self,
            _: Table,
            _: &str,
        ) -> Result<(i64, Option<DateTime<Utc>>), Self::Error> {
            Ok((0, None))
        }
    }

    /// A pass whose store call hangs while the maintenance runs (not at its stop) is given up at its timeout,
    /// counted as a failed pass, and the next passes run.
    #[tokio::test(start_paused = true)]
    async fn a_pass_whose_store_call_hangs_is_given_up_and_the_next_pass_runs() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let store = HangsOnce::default();
        let opts = MaintenanceOptions::default()
            .every(Duration::from_secs(60))
            .consumer("crm-followup")
            .consumer("billing")
            .shard("s1");
        // Long enough for the hung pass's timeout and two passes after it.
        let runs_for = opts.pass_timeout() + 3 * opts.every;
        Maintenance::new(store.clone())
            .options(opts)
            .run_until(tokio::time::sleep(runs_for))
            .await;
        let purges = store.purges.load(Ordering::SeqCst);
        assert!(
            // The hung call, then at least two full passes (one call per table each).
            purges > 2 * Table::ALL.len() as u64,
            "passes after the hung one purged: {purges} purge calls"
        );
        let failed: Vec<_> = snap
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == crate::metrics::MAINTENANCE_FAILED)
            .map(|(k, _, _, v)| {
                let mut labels: Vec<_> = k
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                (labels, v)
            })
            .filter(|(_, v)| *v != metrics_util::debugging::DebugValue::Counter(0))
            .collect();
        let mut failed = failed;
        failed.sort_by(|a, b| a.0.cmp(&b.0));
        // One series per consumer the maintenance serves, so that the alert reaches each consumer's owner.
        let series = |consumer: &str| {
            (
                vec![
                    format!("consumer={consumer}"),
                    "reason=timeout".to_owned(),
                    "shard=s1".to_owned(),
                ],
                metrics_util::debugging::DebugValue::Counter(1),
            )
        };
        assert_eq!(failed, vec![series("billing"), series("crm-followup")]);
    }
}
