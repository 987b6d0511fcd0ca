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
//! re-sent copy across a partition boundary is not recognised.
//!
//! **No marker disappears while a copy can still come back.** A partition of markers is dropped once its end
//! plus [`PartitionOptions::keep`] has passed; the store records first that its buckets are gone, and a copy
//! whose bucket is gone is refused ([`txinbox_core::MarkerInsert::Expired`], dead-lettered
//! `retention_expired`), never applied again. A marker whose partition does not exist yet is released
//! ([`txinbox_core::MarkerInsert::Unplaced`], `txinbox_partition_missing_total`); there is no default
//! partition.
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
mod pg {
    use super::*;
    use crate::error::StoreError;
    use crate::postgres::{holder_in, inserted_rows, marker_arrays};
    use crate::store::Store;
    use sqlx::{PgConnection, PgPool, Postgres, Row};
    use txinbox_core::runtime::maintenance::{MaintenanceOptions, PartitionRotation, Table};
    use txinbox_core::{MarkerInsert, MarkerRow};

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

    /// The markers' parent table and the evidence's.
    const INBOX: &str = "txinbox_inbox";
    const REJECTIONS: &str = "txinbox_rejections";
    const EFFECTS: &str = "txinbox_effects";
    const LEGACY: &str = "txinbox_inbox_legacy";

    const LAYOUT_TABLE: &str = "CREATE TABLE IF NOT EXISTS txinbox_partition_layout (tbl TEXT PRIMARY KEY, width_secs BIGINT NOT NULL, ahead INTEGER NOT NULL, keep_secs BIGINT NOT NULL, low TIMESTAMPTZ NOT NULL, high TIMESTAMPTZ NOT NULL, legacy BOOLEAN NOT NULL DEFAULT FALSE, broker_time BOOLEAN NOT NULL DEFAULT FALSE)";

    /// The partitioned markers' table: the row-by-row columns and `origin_bucket`, in every unique key.
    const CREATE_INBOX: &str = "
ALTER TABLE txinbox_inbox RENAME TO txinbox_inbox_legacy;
ALTER INDEX txinbox_inbox_pkey RENAME TO txinbox_inbox_legacy_pkey;
ALTER INDEX txinbox_inbox_tenant_business_key RENAME TO txinbox_inbox_legacy_business_key;
ALTER INDEX txinbox_inbox_retention RENAME TO txinbox_inbox_legacy_retention;
ALTER INDEX txinbox_inbox_processed RENAME TO txinbox_inbox_legacy_processed;
CREATE TABLE txinbox_inbox (
    LIKE txinbox_inbox_legacy INCLUDING DEFAULTS,
    origin_bucket TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (consumer_name, source, message_id, origin_bucket)
) PARTITION BY RANGE (origin_bucket);
CREATE UNIQUE INDEX txinbox_inbox_tenant_business_key
    ON txinbox_inbox (consumer_name, (COALESCE(tenant_id, '')), business_key, origin_bucket) WHERE business_key IS NOT NULL;
CREATE INDEX txinbox_inbox_processed ON txinbox_inbox (consumer_name, processed_at);
";

    /// The index of the effects that hold their partition back (not done), which the row-by-row layout has no
    /// use for.
    const EFFECTS_OPEN: &str =
        "CREATE INDEX txinbox_effects_open ON txinbox_effects (created_at) WHERE state <> 'done'";

    /// `def` (a `CREATE UNIQUE INDEX` of `pg_get_indexdef`) with `column` added to its key, as a unique index of
    /// a partitioned table must hold the partition key.
    pub(super) fn with_partition_key(def: &str, column: &str) -> Option<String> {
        let open = def.find(" USING ")? + def[def.find(" USING ")?..].find('(')?;
        let mut depth = 0;
        for (i, c) in def[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        let at = open + i;
                        return Some(format!("{}, {column}{}", &def[..at], &def[at..]));
                    }
                }
                _ => {}
            }
        }
        None
    }

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
        let row = sqlx::query("SELECT width_secs, low, high, legacy, EXISTS (SELECT 1 FROM txinbox_partition_layout WHERE tbl = 'txinbox_effects'), broker_time FROM txinbox_partition_layout WHERE tbl = 'txinbox_inbox'")
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
                broker_time: r.try_get(5)?,
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
            let answer = if row.identity.event_time.is_none() && !state.broker_time {
                Some(MarkerInsert::Refused {
                    reason: "no_event_time".into(),
                    detail: "the inbox's partitioned layout places each marker by its event's CloudEvents time, and this message has none (or not RFC 3339): set ce-time on the event, or convert with broker time allowed".into(),
                })
            } else if *bucket < state.low {
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
                holder_in(&mut *conn, LEGACY_HOLDER, row.identity, None)
                    .await?
                    .map(|h| MarkerInsert::Conflict(Some(h)))
            } else {
                None
            };
            out.push(answer);
        }
        let todo: Vec<usize> = (0..rows.len()).filter(|i| out[*i].is_none()).collect();
        if !todo.is_empty() {
            let batch: Vec<&MarkerRow<'_>> = todo.iter().map(|i| &rows[*i]).collect();
            let placed: Vec<DateTime<Utc>> = todo.iter().map(|i| buckets[*i]).collect();
            let returned = sqlx::query_with(INSERT_MARKERS, marker_arrays(&batch, Some(&placed))?)
                .fetch_all(&mut *conn)
                .await?;
            let inserted = inserted_rows(&returned, &batch)?;
            for (k, i) in todo.into_iter().enumerate() {
                out[i] = Some(if inserted[k] {
                    MarkerInsert::Inserted
                } else {
                    MarkerInsert::Conflict(
                        holder_in(&mut *conn, HOLDER, rows[i].identity, Some(buckets[i])).await?,
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
        named: &str,
        bucket: DateTime<Utc>,
        width: i64,
    ) -> Result<(), sqlx::Error> {
        let sql = format!(
            "CREATE TABLE {} PARTITION OF {parent} FOR VALUES FROM ('{}') TO ('{}')",
            partition_name(named, bucket),
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

    /// Rebuilds `table` (an id from `{table}_id_seq` and its rows) partitioned by `column`: the new table beside
    /// it, with the same columns and defaults, partitions from its oldest row's bucket to `high`, every row
    /// copied, then put in its place with the sequence, the old table's own indexes (a unique one with `column`
    /// added to its key) and the statements of `extra`. Returns the first bucket, the partitions created and
    /// the rows copied.
    #[allow(clippy::too_many_arguments)]
    async fn repartition(
        conn: &mut PgConnection,
        table: &str,
        column: &str,
        extra: &str,
        now: DateTime<Utc>,
        high: DateTime<Utc>,
        width: i64,
    ) -> Result<(DateTime<Utc>, u32, u64), sqlx::Error> {
        let oldest: Option<DateTime<Utc>> =
            sqlx::query_scalar(&format!("SELECT min({column}) FROM {table}"))
                .fetch_one(&mut *conn)
                .await?;
        let low = bucket_of(oldest.map_or(now, |o| o.min(now)), width);
        let new = format!("{table}_new");
        let create = format!("CREATE TABLE {new} (LIKE {table} INCLUDING DEFAULTS, PRIMARY KEY (id, {column})) PARTITION BY RANGE ({column})");
        sqlx::Executor::execute(&mut *conn, create.as_str()).await?;
        let mut created = 0;
        for b in buckets(low, high, width) {
            create_in_new(&mut *conn, &new, table, b, width).await?;
            created += 1;
        }
        let copied = sqlx::query(&format!("INSERT INTO {new} SELECT * FROM {table}"))
            .execute(&mut *conn)
            .await?
            .rows_affected();
        // The old table's indexes, made again on the new one once it has the name (and they theirs) back.
        let defs: Vec<(String, bool)> = sqlx::query_as("SELECT pg_get_indexdef(ix.indexrelid), ix.indisunique FROM pg_index ix WHERE ix.indrelid = to_regclass($1) AND NOT ix.indisprimary ORDER BY ix.indexrelid")
            .bind(table)
            .fetch_all(&mut *conn)
            .await?;
        let mut indexes = Vec::with_capacity(defs.len() + 1);
        for (def, unique) in defs {
            indexes.push(if unique {
                with_partition_key(&def, column).ok_or_else(|| {
                    sqlx::Error::Protocol(format!("cannot read the index definition {def:?}"))
                })?
            } else {
                def
            });
        }
        if !extra.is_empty() {
            indexes.push(extra.to_owned());
        }
        let swap = format!(
            "ALTER SEQUENCE {table}_id_seq OWNED BY NONE;
DROP TABLE {table};
ALTER TABLE {new} RENAME TO {table};
ALTER INDEX {new}_pkey RENAME TO {table}_pkey;
ALTER SEQUENCE {table}_id_seq OWNED BY {table}.id;
{};",
            indexes.join(";\n")
        );
        sqlx::raw_sql(&swap).execute(&mut *conn).await?;
        Ok((low, created, copied))
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
            crate::postgres::schema_change(&mut tx).await?;
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
                create_in_new(&mut tx, INBOX, INBOX, b, width).await?;
                created += 1;
            }
            let legacy: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM txinbox_inbox_legacy)")
                    .fetch_one(&mut *tx)
                    .await?;
            if !legacy {
                sqlx::Executor::execute(&mut *tx, "DROP TABLE txinbox_inbox_legacy").await?;
            }
            // Evidence and effects: partitions back to their oldest row, every row copied in.
            let (rlow, n, copied) =
                repartition(&mut tx, REJECTIONS, "recorded_at", "", now, high, width).await?;
            created += n;
            let (elow, n, effects_copied) = repartition(
                &mut tx,
                EFFECTS,
                "created_at",
                EFFECTS_OPEN,
                now,
                high,
                width,
            )
            .await?;
            created += n;
            for (tbl, low) in [(INBOX, low), (REJECTIONS, rlow), (EFFECTS, elow)] {
                sqlx::query("INSERT INTO txinbox_partition_layout (tbl, width_secs, ahead, keep_secs, low, high, legacy, broker_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
                    .bind(tbl)
                    .bind(width)
                    .bind(opts.ahead as i32)
                    .bind(keep)
                    .bind(low)
                    .bind(high)
                    .bind(tbl == INBOX && legacy)
                    .bind(opts.broker_time)
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
            let r = sqlx::query("SELECT l.width_secs, l.ahead, l.keep_secs, l.low, l.high, l.legacy, l.broker_time, (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('txinbox_inbox')), (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('txinbox_rejections')), (SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('txinbox_effects')) FROM txinbox_partition_layout l WHERE l.tbl = 'txinbox_inbox'")
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
                broker_time: r.try_get(6)?,
                marker_partitions: r.try_get::<i64, _>(7)?.max(0) as u32,
                rejection_partitions: r.try_get::<i64, _>(8)?.max(0) as u32,
                effect_partitions: r.try_get::<i64, _>(9)?.max(0) as u32,
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
    /// expired: one node at a time (a session advisory lock per schema; another node's pass is `skipped`). `None` for a
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
            let locked: bool =
                sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext(current_schema()))")
                    .bind(ROTATION_LOCK)
                    .fetch_one(&mut *conn)
                    .await?;
            if !locked {
                report.skipped = true;
                return Ok(Some(report));
            }
            let done = rotate(&mut conn, &layouts, now, opts, &mut report).await;
            let unlocked = sqlx::query("SELECT pg_advisory_unlock($1, hashtext(current_schema()))")
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
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    #[test]
    fn a_unique_index_gets_the_partition_key_after_its_own_columns() {
        let def = "CREATE UNIQUE INDEX k ON s.t USING btree (consumer_name, COALESCE(tenant_id, ''::text), business_key) WHERE (business_key IS NOT NULL)";
        assert_eq!(
            super::pg::with_partition_key(def, "created_at").unwrap(),
            "CREATE UNIQUE INDEX k ON s.t USING btree (consumer_name, COALESCE(tenant_id, ''::text), business_key, created_at) WHERE (business_key IS NOT NULL)"
        );
        assert_eq!(
            super::pg::with_partition_key("CREATE UNIQUE INDEX k ON t", "c"),
            None
        );
    }
}
