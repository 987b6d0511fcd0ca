//! The partitioned layout of the PostgreSQL store: retention that drops whole partitions.
//!
//! In the row-by-row layout (the default) the maintenance deletes expired markers, evidence and done effects
//! in batches. In the partitioned layout `txinbox_inbox`, `txinbox_rejections` and `txinbox_effects` are
//! partitioned by time, one partition per [`PartitionOptions::width`]; the maintenance
//! ([`txinbox_core::MaintenanceStore::rotate_partitions`]) creates partitions ahead and drops a partition whole
//! once everything in it is past its retention (`DETACH PARTITION ... CONCURRENTLY`, then `DROP TABLE`): no
//! `DELETE`, no dead tuples.
//!
//! **Duplicates are still decided by a unique constraint.** A unique index covers one partition, so a marker's
//! partition key must be the same in every copy of its message: it is the bucket of the event's own time, its
//! CloudEvents `time` ([`txinbox_core::Identity::event_time`]), which the producer sends in every copy,
//! redelivered, redriven or re-sent. The broker's enqueue time is not: an SQS redrive makes the message new,
//! with a new enqueue time. A message without an event time is therefore dead-lettered `no_event_time`
//! ([`txinbox_core::MarkerInsert::Refused`]) unless the layout was converted with
//! [`PartitionOptions::broker_time`], which places it by its enqueue time and accepts that a redriven or
//! re-sent copy across a partition boundary is not recognised; one whose broker tells no enqueue time either
//! is dead-lettered all the same (its receive time differs per delivery).
//!
//! **No marker disappears while a copy can still come back.** A partition of markers is dropped once its end
//! plus [`PartitionOptions::keep`] has passed; the store records first that its buckets are gone, and a copy
//! whose bucket is gone is refused ([`txinbox_core::MarkerInsert::Expired`], dead-lettered
//! `retention_expired`), never applied again. A marker whose partition does not exist yet is released
//! ([`txinbox_core::MarkerInsert::Unplaced`], `txinbox_partition_missing_total`); there is no default
//! partition, and one made by hand is refused
//! ([`StoreError::DefaultPartition`](crate::StoreError::DefaultPartition)). One whose origin time lies past
//! any partition the maintenance makes by now (more than [`PartitionOptions::ahead`] buckets past the
//! worker's clock's) is refused as bad input ([`txinbox_core::MarkerInsert::Refused`], dead-lettered
//! `event_time_in_future`).
//!
//! [`Store::partition`](crate::Store::partition) converts an existing inbox in one transaction: its markers
//! stay in a frozen `txinbox_inbox_legacy` that every insert also looks up until its last marker expires (a
//! table nothing is inserted into is read without a race); evidence and effects are copied. The repository's
//! `docs/partitions.md` gives the whole argument, the settings and what each costs.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};

/// How often an inserting store reads the layout's range again (partitions created or dropped since).
const REFRESH: Duration = Duration::from_secs(10);

/// The first key of the session advisory lock one rotating node holds; the second is `hashtext` of the inbox's
/// schema, so that inboxes in different schemas of one database rotate independently
/// (`pg_try_advisory_lock(741823091, hashtext(current_schema()))`; in `pg_locks`: `classid = 741823091`,
/// `objsubid = 2`).
#[cfg(feature = "postgres")]
const ROTATION_LOCK: i32 = 741_823_091;

/// How the partitioned layout is laid out ([`Store::partition`](crate::Store::partition)).
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "PartitionOptions do nothing until given to Store::partition"]
pub struct PartitionOptions {
    /// The time one partition covers (default 1 day; from 1 minute to 31 days).
    pub width: Duration,
    /// Partitions kept ahead of now (default 3).
    pub ahead: u32,
    /// How long a marker is kept past its origin time: a partition is dropped when its end is older than
    /// this. Set it to the inbox's `RetentionPolicy::keep` (default 30 days, the same default).
    pub keep: Duration,
    /// Place a message without a CloudEvents `time` by its broker's enqueue time instead of refusing it
    /// (default false: such a message is dead-lettered `no_event_time`). The enqueue time is the same in
    /// every redelivery of one broker message, but not in a redriven or re-sent copy (an SQS redrive gives
    /// the message a new enqueue time): such a copy whose time falls in another partition is not recognised.
    /// A message without an enqueue time either (a broker adapter that tells none) is still dead-lettered
    /// `no_event_time`: its receive time differs per delivery.
    pub broker_time: bool,
}

impl Default for PartitionOptions {
    fn default() -> Self {
        Self {
            width: Duration::from_secs(86_400),
            ahead: 3,
            keep: Duration::from_secs(30 * 86_400),
            broker_time: false,
        }
    }
}

impl PartitionOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the time one partition covers.
    pub fn width(mut self, width: Duration) -> Self {
        self.width = width;
        self
    }
    /// Sets how many partitions are kept ahead of now.
    pub fn ahead(mut self, n: u32) -> Self {
        self.ahead = n;
        self
    }
    /// Sets how long markers are kept past their origin time.
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }
    /// Places messages without a CloudEvents `time` by their broker enqueue time (see
    /// [`PartitionOptions::broker_time`]).
    pub fn broker_time(mut self, allow: bool) -> Self {
        self.broker_time = allow;
        self
    }

    /// Refuses options the layout cannot use, with one line.
    pub fn check(&self) -> Result<(), String> {
        let w = self.width.as_secs();
        if !(60..=31 * 86_400).contains(&w) || self.width.subsec_nanos() != 0 {
            return Err(format!(
                "partition width {}s must be whole seconds from 60 s to 31 days",
                self.width.as_secs_f64()
            ));
        }
        if self.ahead == 0 || self.ahead > 366 {
            return Err(format!(
                "partitions ahead {} must be from 1 to 366",
                self.ahead
            ));
        }
        if self.keep.as_secs() == 0 || self.keep.as_secs() > 10 * 366 * 86_400 {
            return Err(format!(
                "partition keep {}s must be from 1 s to 10 years",
                self.keep.as_secs()
            ));
        }
        Ok(())
    }
}

/// What [`Store::partition`](crate::Store::partition) did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a PartitionReport says what the conversion did"]
pub struct PartitionReport {
    /// The layout was already partitioned: nothing was changed.
    pub already: bool,
    /// Partitions created (markers and evidence).
    pub created: u32,
    /// The existing markers stay in the frozen `txinbox_inbox_legacy` until they expire (false when there
    /// were none: the old table was dropped).
    pub legacy_kept: bool,
    /// Evidence rows copied into the partitioned table.
    pub rejections_copied: u64,
    /// Effects copied into the partitioned table.
    pub effects_copied: u64,
}

/// The partitioned layout of a database as it is now ([`Store::partition_status`](crate::Store::partition_status)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionStatus {
    /// The time one partition covers.
    pub width: Duration,
    /// Partitions kept ahead of now.
    pub ahead: u32,
    /// How long markers are kept past their origin time.
    pub keep: Duration,
    /// Markers whose origin time is before this are refused (their partitions were dropped).
    pub low: DateTime<Utc>,
    /// Markers whose origin time is at or after this have no partition yet.
    pub high: DateTime<Utc>,
    /// Partitions of the markers' table.
    pub marker_partitions: u32,
    /// Partitions of the evidence table.
    pub rejection_partitions: u32,
    /// Partitions of the effects table.
    pub effect_partitions: u32,
    /// The frozen table of the row-by-row layout is still checked for duplicates.
    pub legacy: bool,
    /// Messages without a CloudEvents `time` are placed by their broker time ([`PartitionOptions::broker_time`]).
    pub broker_time: bool,
}

impl std::fmt::Display for PartitionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        write!(
            f,
            "partitioned: width={}s keep={}s ahead={} origin={} markers from {} to {} ({} partitions) rejections {} partitions effects {} partitions{}",
            self.width.as_secs(),
            self.keep.as_secs(),
            self.ahead,
            if self.broker_time {
                "event-time-or-broker-time"
            } else {
                "event-time"
            },
            secs(self.low),
            secs(self.high),
            self.marker_partitions,
            self.rejection_partitions,
            self.effect_partitions,
            if self.legacy {
                "; the row-by-row table is kept until its last marker expires"
            } else {
                ""
            }
        )
    }
}

/// The partitioned layout as an inserting store last read it (the range of buckets with a partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutState {
    /// Seconds one bucket covers.
    pub(crate) width: i64,
    /// Buckets before this one are dropped.
    pub(crate) low: DateTime<Utc>,
    /// Buckets from this one on have no partition yet.
    pub(crate) high: DateTime<Utc>,
    /// Partitions the maintenance keeps ahead of now's: buckets from `ahead + 1` past now's on are past any
    /// partition it makes.
    pub(crate) ahead: i32,
    /// Whether the frozen row-by-row table still holds markers to check.
    pub(crate) legacy: bool,
    /// Whether the effects are partitioned too (their done rows leave with their partition).
    pub(crate) effects: bool,
    /// Whether a message without an event time is placed by its broker time (else refused).
    pub(crate) broker_time: bool,
}

impl LayoutState {
    /// The start of the bucket of `at`.
    pub(crate) fn bucket(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        bucket_of(at, self.width)
    }

    /// The first bucket past those the maintenance creates by `now` (its `ahead` past now's): a marker
    /// placed there waits for no partition it will make in time; its event time is wrong.
    #[cfg(feature = "postgres")]
    pub(crate) fn horizon(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let buckets = i64::from(self.ahead.max(0)) + 1;
        self.bucket(now) + chrono::Duration::seconds(self.width.saturating_mul(buckets))
    }
}

/// The start of the `width`-second bucket of `at` (buckets start at the Unix epoch, UTC).
pub(crate) fn bucket_of(at: DateTime<Utc>, width: i64) -> DateTime<Utc> {
    let s = at.timestamp().div_euclid(width) * width;
    Utc.timestamp_opt(s, 0).single().unwrap_or(at)
}

/// What a store knows of its layout: nothing yet, row-by-row, or partitioned (with the range it last read).
#[derive(Debug, Default)]
pub(crate) struct Layout {
    inner: Mutex<Known>,
}

#[derive(Debug, Default)]
enum Known {
    /// Not read yet (a lazy store), or to read again.
    #[default]
    Unknown,
    /// Row-by-row.
    Rows,
    /// Partitioned, as read at this instant.
    Partitioned(LayoutState, Instant),
}

impl Layout {
    /// The partitioned state to insert with: `Ok(None)` for row-by-row; `Err(())` when it must be read.
    pub fn current(&self) -> Result<Option<LayoutState>, ()> {
        match &*self.inner.lock().unwrap_or_else(|p| p.into_inner()) {
            Known::Unknown => Err(()),
            Known::Rows => Ok(None),
            Known::Partitioned(s, at) if at.elapsed() < REFRESH => Ok(Some(*s)),
            Known::Partitioned(..) => Err(()),
        }
    }

    /// Records what was read.
    pub fn set(&self, state: Option<LayoutState>) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = match state {
            Some(s) => Known::Partitioned(s, Instant::now()),
            None => Known::Rows,
        };
    }

    /// Reads it again at the next insert (an insert met a partition or column it did not expect).
    pub fn invalidate(&self) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Known::Unknown;
    }

    /// Whether the last read found the partitioned layout.
    pub fn is_partitioned(&self) -> bool {
        matches!(
            &*self.inner.lock().unwrap_or_else(|p| p.into_inner()),
            Known::Partitioned(..)
        )
    }

    /// Whether the last read is older than `age`.
    pub fn older_than(&self, age: Duration) -> bool {
        match &*self.inner.lock().unwrap_or_else(|p| p.into_inner()) {
            Known::Partitioned(_, at) => at.elapsed() >= age,
            _ => true,
        }
    }
}

#[cfg(feature = "postgres")]
pub(crate) use pg::*;

#[cfg(feature = "postgres")]
mod pg;

#[cfg(all(test, feature = "postgres"))]
mod tests;
