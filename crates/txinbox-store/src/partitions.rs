//! The partitioned layout of the PostgreSQL store: retention that drops whole partitions.
//!
//! In the row-by-row layout (the default) the maintenance deletes expired markers and evidence in batches:
//! each batch competes with the applying transactions and leaves dead tuples for vacuum. In the partitioned
//! layout `txinbox_inbox`, `txinbox_rejections` and `txinbox_effects` are partitioned by time, one partition per
//! [`PartitionOptions::width`] (one day by default); the maintenance creates partitions ahead and drops a
//! whole partition once everything in it is past its retention (`DETACH PARTITION ... CONCURRENTLY`, then
//! `DROP TABLE`): no row-by-row `DELETE`, no dead tuples, no lock the applying transactions wait on.
//!
//! ## Why duplicates are still decided by a unique constraint
//!
//! A PostgreSQL unique index covers one partition, so the partition of a marker must be the same for every
//! copy of its message, or two copies would each find their partition empty. The partition key,
//! `origin_bucket`, is the start of the bucket of the message's **origin time**
//! ([`txinbox_core::MarkerRow::origin_at`]), a time every copy carries unchanged:
//!
//! 1. the CloudEvents `time` of the event (`ce-time`, or `time` in a structured body): the producer's, sent
//!    in every copy, redelivered, redriven or sent again;
//! 2. else the broker's first enqueue time (SQS `SentTimestamp`, Service Bus `EnqueuedTimeUtc`), which every
//!    redelivery of one broker message carries.
//!
//! The primary key is `(consumer_name, source, message_id, origin_bucket)` and the business-key index
//! `(consumer_name, tenant, business_key, origin_bucket)`: two copies with the same origin bucket meet in one
//! partition, where the unique index decides, exactly as in the row-by-row layout. The arrival time plays no
//! part: a copy that arrives a day after its first copy, across any number of partition boundaries, lands in
//! the first copy's partition.
//!
//! What the layout does not cover, and the row-by-row layout does: a message sent **again** by its producer
//! without a CloudEvents `time` gets a new broker enqueue time; if the two sends fall in different buckets,
//! the second is not recognised. Send `ce-time` (every copy then shares its bucket), or keep the row-by-row
//! layout. Likewise a business key is unique per bucket of origin time: two different messages with one
//! business key are caught when their origin times fall in the same bucket (widen the bucket, or keep the
//! row-by-row layout, when business keys must be unique over longer).
//!
//! ## Why no marker disappears while a copy can still come back
//!
//! A partition is dropped only once `bucket end + keep <= now` ([`PartitionOptions::keep`], set it to the
//! inbox's [`txinbox_core::RetentionPolicy::keep`]). Before the drop the store records that buckets before
//! its end are gone (`txinbox_partition_layout.low`); a copy whose bucket is before `low` is refused as
//! [`txinbox_core::MarkerInsert::Expired`] (dead-lettered `retention_expired`), never applied again, and an
//! insert that raced the drop fails on the missing partition and is retried, then refused. A copy whose
//! partition exists finds every marker of its bucket, because partitions are removed whole.
//!
//! A marker whose bucket has no partition yet (the maintenance is behind, or an origin time in the future
//! beyond [`PartitionOptions::ahead`]) is [`txinbox_core::MarkerInsert::Unplaced`]: released and retried,
//! counted in `txinbox_partition_missing_total` (alert `TxinboxPartitionMissing`); nothing is written.
//!
//! ## Converting an existing inbox
//!
//! [`Store::partition`](crate::Store::partition) (`txinbox inbox partition`) renames the existing `txinbox_inbox` to
//! `txinbox_inbox_legacy` and creates the partitioned table in its place, in one transaction. The legacy
//! table is frozen (nothing is inserted into it any more), so reading it is not a race: until its last
//! marker expires, every insert first looks its identity and business key up there, and a copy found there
//! is a duplicate as before. The maintenance drops the legacy table when its last marker's
//! `retention_until` has passed. Evidence rows and effects are copied into their partitioned tables in the
//! same transaction. Stop the workers for the conversion (or restart them after it: a worker that still
//! writes the row-by-row layout fails its inserts, which are retried, and reloads the layout).
//!
//! Effects are partitioned by `created_at` (the commit of the message that recorded them, so a partition stops
//! receiving rows once its time has passed) and leave with their partition once its end is older than
//! `effects_keep` and every effect in it is done (or compensated) and finished longer ago than that: a failed or
//! needs-attention effect holds its partition for an operator (counted as `held`). A partitioned unique index
//! must hold the partition key, so the idempotency key is unique with its `created_at`: it no longer refuses a
//! second row by itself; the marker, in the same transaction, is what refuses a second copy of a message. Their
//! rows are copied into the partitioned table by the conversion.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};

/// How often an inserting store reads the layout's range again (partitions created or dropped since).
const REFRESH: Duration = Duration::from_secs(10);

/// The session advisory lock one rotating node holds.
#[cfg(feature = "postgres")]
const ROTATION_LOCK: i64 = 7_418_230_912;

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
}

impl Default for PartitionOptions {
    fn default() -> Self {
        Self {
            width: Duration::from_secs(86_400),
            ahead: 3,
            keep: Duration::from_secs(30 * 86_400),
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
}

impl std::fmt::Display for PartitionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        write!(
            f,
            "partitioned: width={}s keep={}s ahead={} markers from {} to {} ({} partitions) rejections {} partitions effects {} partitions{}",
            self.width.as_secs(),
            self.keep.as_secs(),
            self.ahead,
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
    /// Whether the frozen row-by-row table still holds markers to check.
    pub(crate) legacy: bool,
    /// Whether the effects are partitioned too (their done rows leave with their partition).
    pub(crate) effects: bool,
}

impl LayoutState {
    /// The start of the bucket of `at`.
    pub(crate) fn bucket(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        bucket_of(at, self.width)
    }
}

/// The start of the `width`-second bucket of `at` (buckets start at the Unix epoch, UTC).
pub(crate) fn bucket_of(at: DateTime<Utc>, width: i64) -> DateTime<Utc> {
    let s = at.timestamp().div_euclid(width) * width;
    Utc.timestamp_opt(s, 0).single().unwrap_or(at)
}

/// The partition of `parent` for the bucket starting at `bucket`.
pub(crate) fn partition_name(parent: &str, bucket: DateTime<Utc>) -> String {
    format!("{parent}_p{}", bucket.format("%Y%m%dt%H%M%S"))
}

/// The bucket a partition of `parent` covers, from its name.
pub(crate) fn partition_bucket(parent: &str, name: &str) -> Option<DateTime<Utc>> {
    let rest = name.strip_prefix(parent)?.strip_prefix("_p")?;
    chrono::NaiveDateTime::parse_from_str(rest, "%Y%m%dt%H%M%S")
        .ok()
        .map(|t| t.and_utc())
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
mod pg {
    use super::*;
    use crate::error::StoreError;
    use crate::store::Store;
    use sqlx::postgres::PgArguments;
    use sqlx::{Arguments, PgConnection, PgPool, Postgres, Row};
    use txinbox_core::runtime::maintenance::{MaintenanceOptions, PartitionRotation, Table};
    use txinbox_core::{ExistingMarker, MarkerInsert, MarkerRow};

    /// The markers' parent table and the evidence's.
    const INBOX: &str = "txinbox_inbox";
    const REJECTIONS: &str = "txinbox_rejections";
    const EFFECTS: &str = "txinbox_effects";
    const LEGACY: &str = "txinbox_inbox_legacy";

    const LAYOUT_TABLE: &str = "CREATE TABLE IF NOT EXISTS txinbox_partition_layout (tbl TEXT PRIMARY KEY, width_secs BIGINT NOT NULL, ahead INTEGER NOT NULL, keep_secs BIGINT NOT NULL, low TIMESTAMPTZ NOT NULL, high TIMESTAMPTZ NOT NULL, legacy BOOLEAN NOT NULL DEFAULT FALSE)";

    /// The partitioned markers' table: the row-by-row columns and `origin_bucket`, in every unique key.
    const CREATE_INBOX: &str = "
ALTER TABLE txinbox_inbox RENAME TO txinbox_inbox_legacy;
ALTER INDEX txinbox_inbox_pkey RENAME TO txinbox_inbox_legacy_pkey;
ALTER INDEX txinbox_inbox_tenant_business_key RENAME TO txinbox_inbox_legacy_business_key;
ALTER INDEX txinbox_inbox_retention RENAME TO txinbox_inbox_legacy_retention;
ALTER INDEX txinbox_inbox_processed RENAME TO txinbox_inbox_legacy_processed;
CREATE TABLE txinbox_inbox (
    consumer_name    TEXT        NOT NULL,
    source           TEXT        NOT NULL DEFAULT '',
    message_id       TEXT        NOT NULL,
    event_type       TEXT,
    business_key     TEXT,
    payload_hash     TEXT        NOT NULL,
    contract_version TEXT,
    tenant_id        TEXT,
    received_at      TIMESTAMPTZ NOT NULL,
    processed_at     TIMESTAMPTZ NOT NULL,
    result_reference TEXT,
    retention_until  TIMESTAMPTZ NOT NULL,
    id_origin        TEXT        NOT NULL,
    delivery_count   INTEGER     NOT NULL DEFAULT 1,
    origin_bucket    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (consumer_name, source, message_id, origin_bucket)
) PARTITION BY RANGE (origin_bucket);
CREATE UNIQUE INDEX txinbox_inbox_tenant_business_key
    ON txinbox_inbox (consumer_name, (COALESCE(tenant_id, '')), business_key, origin_bucket) WHERE business_key IS NOT NULL;
CREATE INDEX txinbox_inbox_processed ON txinbox_inbox (consumer_name, processed_at);
";

    /// The partitioned evidence table; the rows of the old one are copied in, then it is dropped.
    const CREATE_REJECTIONS: &str = "
ALTER TABLE txinbox_rejections RENAME TO txinbox_rejections_legacy;
ALTER INDEX txinbox_rejections_pkey RENAME TO txinbox_rejections_legacy_pkey;
ALTER INDEX txinbox_rejections_consumer_time RENAME TO txinbox_rejections_legacy_consumer_time;
ALTER INDEX txinbox_rejections_time RENAME TO txinbox_rejections_legacy_time;
ALTER INDEX txinbox_rejections_message RENAME TO txinbox_rejections_legacy_message;
ALTER TABLE txinbox_rejections_legacy ALTER COLUMN id DROP DEFAULT;
CREATE TABLE txinbox_rejections (
    id             BIGINT      NOT NULL DEFAULT nextval('txinbox_rejections_id_seq'),
    consumer_name  TEXT        NOT NULL,
    source         TEXT        NOT NULL,
    message_id     TEXT        NOT NULL,
    kind           TEXT        NOT NULL,
    business_key   TEXT,
    payload_hash   TEXT        NOT NULL,
    conflicts_with TEXT        NOT NULL,
    detail         TEXT        NOT NULL,
    recorded_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (id, recorded_at)
) PARTITION BY RANGE (recorded_at);
ALTER SEQUENCE txinbox_rejections_id_seq OWNED BY txinbox_rejections.id;
CREATE INDEX txinbox_rejections_consumer_time ON txinbox_rejections (consumer_name, recorded_at, id);
CREATE INDEX txinbox_rejections_time ON txinbox_rejections (recorded_at, id);
CREATE INDEX txinbox_rejections_message ON txinbox_rejections (consumer_name, message_id);
";

    /// The partitioned effects table, built beside the old one (`txinbox_effects_new`), filled, then put in its
    /// place; its indexes are created after the rename, under the row-by-row names.
    const CREATE_EFFECTS: &str = "
CREATE TABLE txinbox_effects_new (
    id               BIGINT      NOT NULL DEFAULT nextval('txinbox_effects_id_seq'),
    consumer_name    TEXT        NOT NULL,
    message_id       TEXT        NOT NULL,
    idempotency_key  TEXT        NOT NULL,
    name             TEXT        NOT NULL,
    destination      TEXT        NOT NULL,
    payload          BYTEA       NOT NULL,
    metadata         TEXT        NOT NULL,
    external_ref     TEXT        NOT NULL,
    group_key        TEXT,
    state            TEXT        NOT NULL,
    attempts         INTEGER     NOT NULL DEFAULT 0,
    reconciliations  INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at  TIMESTAMPTZ NOT NULL,
    claimed_by       TEXT,
    claim_until      TIMESTAMPTZ,
    result_reference TEXT,
    last_error       TEXT,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    finished_at      TIMESTAMPTZ,
    maybe_happened   BOOLEAN     NOT NULL DEFAULT FALSE,
    sent_hash        TEXT,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
";

    /// The effects' columns, for the copy.
    const EFFECT_COLUMNS: &str = "id, consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, group_key, state, attempts, reconciliations, next_attempt_at, claimed_by, claim_until, result_reference, last_error, created_at, updated_at, finished_at, maybe_happened, sent_hash";

    /// The partitioned effects table in place of the old one, with the row-by-row indexes, the idempotency key
    /// unique per partition, and an index of the rows that hold a partition back (not done).
    const SWAP_EFFECTS: &str = "
ALTER SEQUENCE txinbox_effects_id_seq OWNED BY NONE;
DROP TABLE txinbox_effects;
ALTER TABLE txinbox_effects_new RENAME TO txinbox_effects;
ALTER SEQUENCE txinbox_effects_id_seq OWNED BY txinbox_effects.id;
CREATE UNIQUE INDEX txinbox_effects_idempotency_key ON txinbox_effects (idempotency_key, created_at);
CREATE INDEX txinbox_effects_due ON txinbox_effects (next_attempt_at, id) WHERE state IN ('pending', 'uncertain');
CREATE INDEX txinbox_effects_claims ON txinbox_effects (claim_until) WHERE state = 'in_flight';
CREATE INDEX txinbox_effects_groups ON txinbox_effects (consumer_name, group_key, id)
    WHERE group_key IS NOT NULL AND state NOT IN ('done', 'failed');
CREATE INDEX txinbox_effects_done ON txinbox_effects (finished_at) WHERE state = 'done';
CREATE INDEX txinbox_effects_ref ON txinbox_effects (external_ref);
CREATE INDEX txinbox_effects_message ON txinbox_effects (consumer_name, message_id);
CREATE INDEX txinbox_effects_state ON txinbox_effects (consumer_name, state, created_at);
CREATE INDEX txinbox_effects_open ON txinbox_effects (created_at) WHERE state <> 'done';
";

    /// The batch marker insert of the partitioned layout: the row-by-row one with `origin_bucket`.
    const INSERT_MARKERS: &str = "INSERT INTO txinbox_inbox (consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count, origin_bucket) SELECT consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count, origin_bucket FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::timestamptz[], $10::timestamptz[], $11::timestamptz[], $12::text[], $13::int4[], $14::timestamptz[]) WITH ORDINALITY AS t(consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count, origin_bucket, ord) ORDER BY ord ON CONFLICT DO NOTHING RETURNING consumer_name, source, message_id, payload_hash, business_key, tenant_id";

    /// The holder of a refused marker, in its own partition.
    const HOLDER: &str = "SELECT message_id, payload_hash, processed_at, (source = $2 AND message_id = $3) AS same_identity, result_reference FROM txinbox_inbox WHERE origin_bucket = $6 AND consumer_name = $1 AND ((source = $2 AND message_id = $3) OR ($4::text IS NOT NULL AND business_key = $4 AND COALESCE(tenant_id, '') = COALESCE($5::text, ''))) ORDER BY same_identity DESC LIMIT 1";

    /// A marker of the frozen row-by-row table with this identity or business key.
    const LEGACY_HOLDER: &str = "SELECT message_id, payload_hash, processed_at, (source = $2 AND message_id = $3) AS same_identity, result_reference FROM txinbox_inbox_legacy WHERE consumer_name = $1 AND ((source = $2 AND message_id = $3) OR ($4::text IS NOT NULL AND business_key = $4 AND COALESCE(tenant_id, '') = COALESCE($5::text, ''))) ORDER BY same_identity DESC LIMIT 1";

    /// Reads the layout: `None` for row-by-row. Never fails on a missing table (it may run inside the
    /// inbox transaction, which an error would abort).
    pub(crate) async fn load(conn: &mut PgConnection) -> Result<Option<LayoutState>, sqlx::Error> {
        let exists: bool =
            sqlx::query_scalar("SELECT to_regclass('txinbox_partition_layout') IS NOT NULL")
                .fetch_one(&mut *conn)
                .await?;
        if !exists {
            return Ok(None);
        }
        let row = sqlx::query("SELECT width_secs, low, high, legacy, EXISTS (SELECT 1 FROM txinbox_partition_layout WHERE tbl = 'txinbox_effects') FROM txinbox_partition_layout WHERE tbl = 'txinbox_inbox'")
            .fetch_optional(&mut *conn)
            .await?;
        Ok(match row {
            None => None,
            Some(r) => Some(LayoutState {
                width: r.try_get(0)?,
                low: r.try_get(1)?,
                high: r.try_get(2)?,
                legacy: r.try_get(3)?,
                effects: r.try_get(4)?,
            }),
        })
    }

    /// Whether `e` says a row has no partition (23514 on a partitioned insert) or a column the layout
    /// requires was not written (23502: a row-by-row insert into the partitioned table).
    pub(crate) fn is_layout_error(e: &sqlx::Error) -> bool {
        match e {
            sqlx::Error::Database(db) => match db.code().as_deref() {
                Some("23514") => db.message().contains("no partition"),
                Some("23502") => db.message().contains("origin_bucket"),
                Some("42P01") => db.message().contains(LEGACY),
                _ => false,
            },
            _ => false,
        }
    }

    fn add<'q, T>(args: &mut PgArguments, value: T) -> Result<(), sqlx::Error>
    where
        T: sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + 'q,
    {
        args.add(value).map_err(sqlx::Error::Encode)
    }

    async fn holder(
        conn: &mut PgConnection,
        sql: &str,
        row: &MarkerRow<'_>,
        bucket: Option<DateTime<Utc>>,
    ) -> Result<Option<ExistingMarker>, sqlx::Error> {
        let id = row.identity;
        let mut q = sqlx::query(sql)
            .bind(id.consumer.as_str())
            .bind(&id.source)
            .bind(&id.message_id)
            .bind(&id.business_key)
            .bind(&id.tenant_id);
        if let Some(b) = bucket {
            q = q.bind(b);
        }
        Ok(match q.fetch_optional(&mut *conn).await? {
            Some(r) => Some(ExistingMarker::new(
                r.try_get(3)?,
                r.try_get(0)?,
                r.try_get(1)?,
                r.try_get(2)?,
                r.try_get(4)?,
            )),
            None => None,
        })
    }

    /// The marker inserts of the partitioned layout, in `state`'s range: a row outside it is answered
    /// without a write; a row whose identity or business key the frozen legacy table holds is a conflict.
    pub(crate) async fn insert_markers(
        conn: &mut PgConnection,
        rows: &[MarkerRow<'_>],
        state: &LayoutState,
    ) -> Result<Vec<MarkerInsert>, sqlx::Error> {
        let mut out: Vec<Option<MarkerInsert>> = Vec::with_capacity(rows.len());
        let buckets: Vec<DateTime<Utc>> = rows.iter().map(|r| state.bucket(r.origin_at)).collect();
        for (row, bucket) in rows.iter().zip(&buckets) {
            let answer = if *bucket < state.low {
                Some(MarkerInsert::Expired(format!(
                    "origin time {} is in the partition of {}, dropped by retention (partitions from {} are kept)",
                    row.origin_at.to_rfc3339(),
                    bucket.to_rfc3339(),
                    state.low.to_rfc3339()
                )))
            } else if *bucket >= state.high {
                Some(MarkerInsert::Unplaced(format!(
                    "no partition yet for origin time {} (partitions end at {})",
                    row.origin_at.to_rfc3339(),
                    state.high.to_rfc3339()
                )))
            } else if state.legacy {
                holder(&mut *conn, LEGACY_HOLDER, row, None)
                    .await?
                    .map(|h| MarkerInsert::Conflict(Some(h)))
            } else {
                None
            };
            out.push(answer);
        }
        let todo: Vec<usize> = (0..rows.len()).filter(|i| out[*i].is_none()).collect();
        if !todo.is_empty() {
            let column =
                |f: for<'r> fn(&'r MarkerRow<'r>) -> Option<&'r str>| -> Vec<Option<&str>> {
                    todo.iter().map(|i| f(&rows[*i])).collect()
                };
            let times = |f: fn(&MarkerRow<'_>) -> DateTime<Utc>| -> Vec<DateTime<Utc>> {
                todo.iter().map(|i| f(&rows[*i])).collect()
            };
            let mut args = PgArguments::default();
            add(&mut args, column(|r| Some(r.identity.consumer.as_str())))?;
            add(&mut args, column(|r| Some(&r.identity.source)))?;
            add(&mut args, column(|r| Some(&r.identity.message_id)))?;
            add(&mut args, column(|r| r.identity.event_type.as_deref()))?;
            add(&mut args, column(|r| r.identity.business_key.as_deref()))?;
            add(&mut args, column(|r| Some(r.payload_hash)))?;
            add(
                &mut args,
                column(|r| r.identity.contract_version.as_deref()),
            )?;
            add(&mut args, column(|r| r.identity.tenant_id.as_deref()))?;
            add(&mut args, times(|r| r.received_at))?;
            add(&mut args, times(|r| r.processed_at))?;
            add(&mut args, times(|r| r.retention_until))?;
            add(&mut args, column(|r| Some(r.identity.origin.as_str())))?;
            add(
                &mut args,
                todo.iter()
                    .map(|i| i32::try_from(rows[*i].delivery_count).unwrap_or(i32::MAX))
                    .collect::<Vec<_>>(),
            )?;
            add(
                &mut args,
                todo.iter().map(|i| buckets[*i]).collect::<Vec<_>>(),
            )?;
            let returned = sqlx::query_with(INSERT_MARKERS, args)
                .fetch_all(&mut *conn)
                .await?;
            let mut inserted = vec![false; rows.len()];
            for r in &returned {
                let (consumer, source, message_id, hash): (&str, &str, &str, &str) =
                    (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?);
                let (business_key, tenant): (Option<&str>, Option<&str>) =
                    (r.try_get(4)?, r.try_get(5)?);
                let found = todo.iter().copied().find(|i| {
                    let (row, id) = (&rows[*i], rows[*i].identity);
                    !inserted[*i]
                        && id.consumer.as_str() == consumer
                        && id.source == source
                        && id.message_id == message_id
                        && row.payload_hash == hash
                        && id.business_key.as_deref() == business_key
                        && id.tenant_id.as_deref() == tenant
                });
                match found {
                    Some(i) => inserted[i] = true,
                    None => {
                        return Err(sqlx::Error::Protocol(format!(
                            "the batch marker insert returned a row that is not in the batch (message id {message_id})"
                        )))
                    }
                }
            }
            for i in todo {
                out[i] = Some(if inserted[i] {
                    MarkerInsert::Inserted
                } else {
                    MarkerInsert::Conflict(
                        holder(&mut *conn, HOLDER, &rows[i], Some(buckets[i])).await?,
                    )
                });
            }
        }
        Ok(out
            .into_iter()
            .map(|a| a.unwrap_or(MarkerInsert::Inserted))
            .collect())
    }

    /// The buckets from `from` (inclusive) to `to` (exclusive).
    fn buckets(from: DateTime<Utc>, to: DateTime<Utc>, width: i64) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut b = from;
        while b < to {
            out.push(b);
            b += chrono::Duration::seconds(width);
        }
        out
    }

    fn rfc(t: DateTime<Utc>) -> String {
        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    }

    /// Creates the partition of `parent` for `bucket` in a transaction that just created `parent`.
    async fn create_in_new(
        conn: &mut PgConnection,
        parent: &str,
        bucket: DateTime<Utc>,
        width: i64,
    ) -> Result<(), sqlx::Error> {
        let sql = format!(
            "CREATE TABLE {} PARTITION OF {parent} FOR VALUES FROM ('{}') TO ('{}')",
            partition_name(parent, bucket),
            rfc(bucket),
            rfc(bucket + chrono::Duration::seconds(width))
        );
        sqlx::Executor::execute(&mut *conn, sql.as_str()).await?;
        Ok(())
    }

    /// Creates the partition of `parent` for `bucket` beside the live table: an empty table attached with
    /// `ATTACH PARTITION`, which holds only a SHARE UPDATE EXCLUSIVE lock on `parent` (inserts go on).
    async fn attach_new(
        conn: &mut PgConnection,
        parent: &str,
        bucket: DateTime<Utc>,
        width: i64,
    ) -> Result<(), sqlx::Error> {
        let name = partition_name(parent, bucket);
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {name} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        );
        sqlx::Executor::execute(&mut *conn, create.as_str()).await?;
        let attach = format!(
            "ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES FROM ('{}') TO ('{}')",
            rfc(bucket),
            rfc(bucket + chrono::Duration::seconds(width))
        );
        sqlx::Executor::execute(&mut *conn, attach.as_str()).await?;
        Ok(())
    }

    impl Store<Postgres> {
        /// Converts this database's inbox to the partitioned layout ([`crate::partitions`]): one transaction,
        /// one converter at a time; idempotent (a partitioned database is left as it is). Workers should be
        /// stopped, or restarted after it.
        pub async fn partition(
            &self,
            opts: &PartitionOptions,
        ) -> Result<PartitionReport, StoreError> {
            opts.check().map_err(StoreError::Partitions)?;
            let width = opts.width.as_secs() as i64;
            let keep = opts.keep.as_secs() as i64;
            let mut tx = self.pool().begin().await?;
            sqlx::query("SET LOCAL client_min_messages TO warning")
                .execute(&mut *tx)
                .await?;
            sqlx::query("SELECT pg_advisory_xact_lock(7418230911)")
                .execute(&mut *tx)
                .await?;
            sqlx::Executor::execute(&mut *tx, LAYOUT_TABLE).await?;
            let exists: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM txinbox_partition_layout WHERE tbl = 'txinbox_inbox')",
            )
            .fetch_one(&mut *tx)
            .await?;
            if exists {
                return Ok(PartitionReport {
                    already: true,
                    created: 0,
                    legacy_kept: false,
                    rejections_copied: 0,
                    effects_copied: 0,
                });
            }
            let now = Utc::now();
            let w = chrono::Duration::seconds(width);
            // Markers: a partition for every bucket a live copy may still fall in, back to `keep` ago.
            let low = bucket_of(now - chrono::Duration::seconds(keep), width);
            let high = bucket_of(now, width) + w * (opts.ahead as i32 + 1);
            sqlx::Executor::execute(&mut *tx, CREATE_INBOX).await?;
            let mut created = 0;
            for b in buckets(low, high, width) {
                create_in_new(&mut tx, INBOX, b, width).await?;
                created += 1;
            }
            let legacy: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM txinbox_inbox_legacy)")
                    .fetch_one(&mut *tx)
                    .await?;
            if !legacy {
                sqlx::Executor::execute(&mut *tx, "DROP TABLE txinbox_inbox_legacy").await?;
            }
            // Evidence: partitions back to the oldest row, whose rows are copied in.
            let oldest: Option<DateTime<Utc>> =
                sqlx::query_scalar("SELECT min(recorded_at) FROM txinbox_rejections")
                    .fetch_one(&mut *tx)
                    .await?;
            let rlow = bucket_of(oldest.map_or(now, |o| o.min(now)), width);
            sqlx::Executor::execute(&mut *tx, CREATE_REJECTIONS).await?;
            for b in buckets(rlow, high, width) {
                create_in_new(&mut tx, REJECTIONS, b, width).await?;
                created += 1;
            }
            let copied = sqlx::query("INSERT INTO txinbox_rejections SELECT id, consumer_name, source, message_id, kind, business_key, payload_hash, conflicts_with, detail, recorded_at FROM txinbox_rejections_legacy")
                .execute(&mut *tx)
                .await?
                .rows_affected();
            sqlx::Executor::execute(&mut *tx, "DROP TABLE txinbox_rejections_legacy").await?;
            // Effects: partitions back to the oldest effect, whose rows are copied in.
            let oldest: Option<DateTime<Utc>> =
                sqlx::query_scalar("SELECT min(created_at) FROM txinbox_effects")
                    .fetch_one(&mut *tx)
                    .await?;
            let elow = bucket_of(oldest.map_or(now, |o| o.min(now)), width);
            sqlx::Executor::execute(&mut *tx, CREATE_EFFECTS).await?;
            for b in buckets(elow, high, width) {
                let sql = format!(
                    "CREATE TABLE {} PARTITION OF txinbox_effects_new FOR VALUES FROM ('{}') TO ('{}')",
                    partition_name(EFFECTS, b),
                    rfc(b),
                    rfc(b + w)
                );
                sqlx::Executor::execute(&mut *tx, sql.as_str()).await?;
                created += 1;
            }
            let copy = format!(
                "INSERT INTO txinbox_effects_new ({EFFECT_COLUMNS}) SELECT {EFFECT_COLUMNS} FROM txinbox_effects"
            );
            let effects_copied = sqlx::query(&copy).execute(&mut *tx).await?.rows_affected();
            sqlx::raw_sql(SWAP_EFFECTS).execute(&mut *tx).await?;
            for (tbl, low) in [(INBOX, low), (REJECTIONS, rlow), (EFFECTS, elow)] {
                sqlx::query("INSERT INTO txinbox_partition_layout (tbl, width_secs, ahead, keep_secs, low, high, legacy) VALUES ($1, $2, $3, $4, $5, $6, $7)")
                    .bind(tbl)
                    .bind(width)
                    .bind(opts.ahead as i32)
                    .bind(keep)
                    .bind(low)
                    .bind(high)
                    .bind(tbl == INBOX && legacy)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            self.layout_handle().invalidate();
            Ok(PartitionReport {
                already: false,
                created,
                legacy_kept: legacy,
                rejections_copied: copied,
                effects_copied,
            })
        }

        /// The partitioned layout as it is now; `None` for a row-by-row database.
        pub async fn partition_status(&self) -> Result<Option<PartitionStatus>, StoreError> {
            let mut conn = self.pool().acquire().await?;
            if load(&mut conn).await?.is_none() {
                return Ok(None);
            }
            let r = sqlx::query("SELECT l.width_secs, l.ahead, l.keep_secs, l.low, l.high, l.legacy, (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('txinbox_inbox')), (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('txinbox_rejections')), (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('txinbox_effects')) FROM txinbox_partition_layout l WHERE l.tbl = 'txinbox_inbox'")
                .fetch_one(&mut *conn)
                .await?;
            let secs = |v: i64| Duration::from_secs(v.max(0) as u64);
            Ok(Some(PartitionStatus {
                width: secs(r.try_get(0)?),
                ahead: r.try_get::<i32, _>(1)?.max(0) as u32,
                keep: secs(r.try_get(2)?),
                low: r.try_get(3)?,
                high: r.try_get(4)?,
                legacy: r.try_get(5)?,
                marker_partitions: r.try_get::<i64, _>(6)?.max(0) as u32,
                rejection_partitions: r.try_get::<i64, _>(7)?.max(0) as u32,
                effect_partitions: r.try_get::<i64, _>(8)?.max(0) as u32,
            }))
        }

        /// Whether this database's inbox has the partitioned layout.
        pub async fn is_partitioned(&self) -> Result<bool, StoreError> {
            let mut conn = self.pool().acquire().await?;
            let state = load(&mut conn).await?;
            self.layout_handle().set(state);
            Ok(state.is_some())
        }
    }

    /// Creates the partitions ahead of `now` and drops whole the ones past their retention (markers: the
    /// layout's keep; evidence: `rejections_keep`), and the frozen legacy table once its last marker
    /// expired: one node at a time (a session advisory lock; another node's pass is `skipped`). `None` for a
    /// row-by-row database. The maintenance runs it before each pass.
    pub(crate) async fn rotate_partitions(
        pool: &PgPool,
        now: DateTime<Utc>,
        opts: &MaintenanceOptions,
    ) -> Result<Option<PartitionRotation>, sqlx::Error> {
        {
            let mut conn = pool.acquire().await?;
            let layouts = match sqlx::query("SELECT tbl, width_secs, ahead, keep_secs, low, high, legacy FROM txinbox_partition_layout")
                .fetch_all(&mut *conn)
                .await
            {
                Ok(r) => r,
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            };
            if layouts.is_empty() {
                return Ok(None);
            }
            let mut report = PartitionRotation::default();
            let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(ROTATION_LOCK)
                .fetch_one(&mut *conn)
                .await?;
            if !locked {
                report.skipped = true;
                return Ok(Some(report));
            }
            let done = rotate(&mut conn, &layouts, now, opts, &mut report).await;
            let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(ROTATION_LOCK)
                .execute(&mut *conn)
                .await;
            if unlocked.is_err() {
                // The lock lives as long as the session: do not give this connection back with it.
                conn.detach();
            }
            done?;
            Ok(Some(report))
        }
    }

    async fn rotate(
        conn: &mut PgConnection,
        layouts: &[sqlx::postgres::PgRow],
        now: DateTime<Utc>,
        opts: &MaintenanceOptions,
        report: &mut PartitionRotation,
    ) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(&mut *conn, "SET client_min_messages TO warning").await?;
        for l in layouts {
            let tbl: String = l.try_get(0)?;
            let (width, ahead, keep): (i64, i32, i64) =
                (l.try_get(1)?, l.try_get(2)?, l.try_get(3)?);
            let low: DateTime<Utc> = l.try_get(4)?;
            let since =
                |d: Duration| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
            let (table, parent, keep) = match tbl.as_str() {
                INBOX => (Table::Markers, INBOX, chrono::Duration::seconds(keep)),
                REJECTIONS => (Table::Rejections, REJECTIONS, since(opts.rejections_keep)),
                EFFECTS => (Table::Effects, EFFECTS, since(opts.effects_keep)),
                _ => continue,
            };
            let w = chrono::Duration::seconds(width);
            // Detaches a crash left half done are finished, and tables detached but not dropped are dropped.
            let parts = sqlx::query("SELECT c.relname::text, i.inhdetachpending FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)")
                .bind(parent)
                .fetch_all(&mut *conn)
                .await?;
            let mut attached = Vec::new();
            for p in &parts {
                let (name, pending): (String, bool) = (p.try_get(0)?, p.try_get(1)?);
                if pending {
                    let sql = format!("ALTER TABLE {parent} DETACH PARTITION {name} FINALIZE");
                    sqlx::Executor::execute(&mut *conn, sql.as_str()).await?;
                    sqlx::Executor::execute(&mut *conn, format!("DROP TABLE {name}").as_str())
                        .await?;
                } else if let Some(b) = partition_bucket(parent, &name) {
                    attached.push(b);
                }
            }
            let orphans: Vec<String> = sqlx::query_scalar("SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND c.relkind = 'r' AND NOT c.relispartition AND starts_with(c.relname::text, $1)")
                .bind(format!("{parent}_p"))
                .fetch_all(&mut *conn)
                .await?;
            for name in orphans {
                if partition_bucket(parent, &name).is_some() {
                    sqlx::Executor::execute(&mut *conn, format!("DROP TABLE {name}").as_str())
                        .await?;
                }
            }
            // Ahead: every bucket from now's to `ahead` past it.
            let target = bucket_of(now, width) + w * (ahead + 1);
            let mut created = 0;
            for b in buckets(bucket_of(now, width).max(low), target, width) {
                if !attached.contains(&b) {
                    attach_new(&mut *conn, parent, b, width).await?;
                    attached.push(b);
                    created += 1;
                }
            }
            let high = attached.iter().max().map_or(target, |b| *b + w);
            sqlx::query("UPDATE txinbox_partition_layout SET high = $2 WHERE tbl = $1")
                .bind(parent)
                .bind(high)
                .execute(&mut *conn)
                .await?;
            report.created.insert(table, created);
            report.ends.insert(table, high);
            // Behind: whole partitions past their retention, oldest first. `low` moves first, so a store
            // refuses a copy of a dropped bucket before the partition goes.
            attached.sort();
            let (mut dropped, mut held) = (0, 0);
            for b in attached.iter().copied() {
                if b + w + keep > now {
                    break;
                }
                let name = partition_name(parent, b);
                if table == Table::Effects {
                    // Effects leave with their partition only when every one is finished and was finished
                    // longer ago than the keep: a failed or needs-attention effect holds it for an operator.
                    let check = format!("SELECT EXISTS (SELECT 1 FROM {name} WHERE state <> 'done' AND (state <> 'compensated' OR finished_at IS NULL OR finished_at >= $1)) OR EXISTS (SELECT 1 FROM {name} WHERE state = 'done' AND finished_at >= $1)");
                    let busy: bool = sqlx::query_scalar(&check)
                        .bind(now - keep)
                        .fetch_one(&mut *conn)
                        .await?;
                    if busy {
                        held += 1;
                        continue;
                    }
                } else {
                    // `low` first: a store that reads it refuses a copy of this bucket before the partition
                    // goes.
                    sqlx::query(
                        "UPDATE txinbox_partition_layout SET low = GREATEST(low, $2) WHERE tbl = $1",
                    )
                    .bind(parent)
                    .bind(b + w)
                    .execute(&mut *conn)
                    .await?;
                }
                let detach = format!("ALTER TABLE {parent} DETACH PARTITION {name} CONCURRENTLY");
                sqlx::Executor::execute(&mut *conn, detach.as_str()).await?;
                sqlx::Executor::execute(&mut *conn, format!("DROP TABLE {name}").as_str()).await?;
                dropped += 1;
            }
            report.dropped.insert(table, dropped);
            report.held.insert(table, held);
            if table == Table::Markers {
                let legacy: bool = l.try_get(6)?;
                if legacy {
                    let live: bool = sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM txinbox_inbox_legacy WHERE retention_until >= $1)",
                    )
                    .bind(now)
                    .fetch_one(&mut *conn)
                    .await?;
                    if !live {
                        // The flag first: a store that reads it stops looking there before the table goes.
                        sqlx::query(
                            "UPDATE txinbox_partition_layout SET legacy = FALSE WHERE tbl = $1",
                        )
                        .bind(parent)
                        .execute(&mut *conn)
                        .await?;
                        sqlx::Executor::execute(
                            &mut *conn,
                            "DROP TABLE IF EXISTS txinbox_inbox_legacy",
                        )
                        .await?;
                        report.legacy_dropped = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// The layout of `pool`'s database, for a store that opens.
    #[allow(dead_code)]
    pub(crate) async fn load_pool(pool: &PgPool) -> Result<Option<LayoutState>, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        load(&mut conn).await
    }
}
