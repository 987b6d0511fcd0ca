//! Read-only queries for an operator: per-consumer statistics, one message's story, and the rejections
//! (`txinbox inbox stats|show|rejections`).
//!
//! Every query is bounded by an index (migration 3 adds the ones the inbox did not have): a consumer's rows
//! are counted on `txinbox_inbox (consumer_name, processed_at)` (an index-only scan), a message is found by
//! its primary key (without its source, by a skip scan over the consumer's sources), rejections are read
//! newest first from `txinbox_rejections (consumer_name, recorded_at, id)` or `(recorded_at, id)`, and effects
//! from `txinbox_effects (consumer_name, message_id)` and `(consumer_name, state, created_at)`. Consumers are
//! listed with a skip scan over each table's leading `consumer_name` column, never a full scan.
//!
//! The methods are inherent to [`Store<sqlx::Postgres>`](crate::Store) and [`Store<sqlx::Sqlite>`](crate::Store)
//! (each behind its feature). They only read: a connection opened read-only (PostgreSQL's
//! `default_transaction_read_only`) serves them. The results are [`serde::Serialize`], with stable field
//! names, for machine-readable output; times are RFC 3339 UTC.

// Without a backend feature only the result types remain.
#![cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The rejection kinds the inbox records, in the order they are reported.
pub const REJECTION_KINDS: [&str; 2] = ["payload_collision", "business_duplicate"];

/// Effect states counted as waiting to run: the oldest of them is the effect lag.
pub const WAITING_EFFECT_STATES: [&str; 3] = ["pending", "in_flight", "uncertain"];

/// The most consumers listed by [`ConsumerStats`] queries without a consumer (a bound on the skip scan).
pub const MAX_CONSUMERS: i64 = 10_000;

/// The most rows [`RejectionFilter::limit`] accepts.
pub const MAX_REJECTIONS: i64 = 10_000;

/// One consumer's figures: inbox rows, growth, rejections and effects.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// The consumer's name.
    pub consumer: String,
    /// Its markers (an exact count).
    pub inbox_rows: i64,
    /// The oldest marker's `processed_at`; `None` without markers.
    pub oldest_processed_at: Option<DateTime<Utc>>,
    /// The newest marker's `processed_at`; `None` without markers.
    pub newest_processed_at: Option<DateTime<Utc>>,
    /// Markers processed in the hour before [`ConsumerStats::measured_at`] (the growth per hour).
    pub rows_last_hour: i64,
    /// Rejections by kind: `payload_collision` and `business_duplicate` are always present (0 when none).
    pub rejections: BTreeMap<String, i64>,
    /// The newest rejection's time; `None` without rejections.
    pub last_rejection_at: Option<DateTime<Utc>>,
    /// Effects by state: every state of [`txinbox_core::effects::EffectState::ALL`] is present (0 when none).
    pub effects: BTreeMap<String, i64>,
    /// The oldest effect still waiting to run (`pending`, `in_flight` or `uncertain`): its `created_at`.
    pub oldest_pending_effect_at: Option<DateTime<Utc>>,
    /// The effect lag: seconds from [`ConsumerStats::oldest_pending_effect_at`] to
    /// [`ConsumerStats::measured_at`]; `None` when no effect waits.
    pub effect_lag_seconds: Option<f64>,
    /// When the figures were taken.
    pub measured_at: DateTime<Utc>,
}

impl ConsumerStats {
    fn empty(consumer: String, now: DateTime<Utc>) -> Self {
        Self {
            consumer,
            inbox_rows: 0,
            oldest_processed_at: None,
            newest_processed_at: None,
            rows_last_hour: 0,
            rejections: REJECTION_KINDS
                .iter()
                .map(|k| ((*k).to_owned(), 0))
                .collect(),
            last_rejection_at: None,
            effects: txinbox_core::effects::EffectState::ALL
                .iter()
                .map(|s| (s.as_str().to_owned(), 0))
                .collect(),
            oldest_pending_effect_at: None,
            effect_lag_seconds: None,
            measured_at: now,
        }
    }
}

/// A marker: every column of a `txinbox_inbox` row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MarkerView {
    /// The consumer.
    pub consumer: String,
    /// The message's source (`''` when the identity has none).
    pub source: String,
    /// The message id.
    pub message_id: String,
    /// The event type.
    pub event_type: Option<String>,
    /// The business key (unique per consumer).
    pub business_key: Option<String>,
    /// The payload's fingerprint.
    pub payload_hash: String,
    /// The contract version.
    pub contract_version: Option<String>,
    /// The tenant.
    pub tenant_id: Option<String>,
    /// When the delivery that applied the message was received.
    pub received_at: DateTime<Utc>,
    /// When it was applied (the transaction's time).
    pub processed_at: DateTime<Utc>,
    /// The handler's result reference.
    pub result_reference: Option<String>,
    /// Until when the marker is kept.
    pub retention_until: DateTime<Utc>,
    /// Where the message id came from (`cloudevents`, `broker`, ...).
    pub id_origin: String,
    /// The broker's delivery count of the applied delivery.
    pub delivery_count: i64,
}

/// A rejection: a payload collision or a business duplicate, with its evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RejectionRow {
    /// The row's id.
    pub id: i64,
    /// The consumer.
    pub consumer: String,
    /// The rejected message's source.
    pub source: String,
    /// The rejected message's id.
    pub message_id: String,
    /// `payload_collision` or `business_duplicate`.
    pub kind: String,
    /// The rejected message's business key.
    pub business_key: Option<String>,
    /// The rejected message's payload hash.
    pub payload_hash: String,
    /// The stored hash (a collision) or the holder's message id (a business duplicate).
    pub conflicts_with: String,
    /// Free detail.
    pub detail: String,
    /// When it was recorded.
    pub recorded_at: DateTime<Utc>,
}

/// An effect of a message (its payload is not shown).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EffectView {
    /// The row's id.
    pub id: i64,
    /// The idempotency key.
    pub key: String,
    /// The effect's name.
    pub name: String,
    /// The destination.
    pub destination: String,
    /// The reference the destination knows it by.
    pub external_ref: String,
    /// The ordered group, if any.
    pub group_key: Option<String>,
    /// The state (`pending`, `in_flight`, `done`, ...).
    pub state: String,
    /// Calls made.
    pub attempts: i64,
    /// Reconciliations made.
    pub reconciliations: i64,
    /// When it is due next.
    pub next_attempt_at: DateTime<Utc>,
    /// The runner holding its claim.
    pub claimed_by: Option<String>,
    /// Until when the claim holds.
    pub claim_until: Option<DateTime<Utc>>,
    /// The destination's reference of the done effect.
    pub reference: Option<String>,
    /// The last error (or a compensation's note).
    pub last_error: Option<String>,
    /// When it was recorded (the inbox transaction).
    pub created_at: DateTime<Utc>,
    /// Its last change.
    pub updated_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
}

/// Everything the store knows of one message of one consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MessageStory {
    /// The consumer asked about.
    pub consumer: String,
    /// The message id asked about.
    pub message_id: String,
    /// The source asked about (`None`: any source).
    pub source: Option<String>,
    /// Its markers (one per source with this message id; usually zero or one).
    pub markers: Vec<MarkerView>,
    /// Its rejections, oldest first.
    pub rejections: Vec<RejectionRow>,
    /// Its effects, in the order they were recorded (effects have no source: all of the message id's).
    pub effects: Vec<EffectView>,
}

impl MessageStory {
    /// Whether the store knows anything of the message.
    pub fn found(&self) -> bool {
        !(self.markers.is_empty() && self.rejections.is_empty() && self.effects.is_empty())
    }
}

/// Which rejections to list, newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectionFilter {
    /// Only this consumer's.
    pub consumer: Option<String>,
    /// Only this kind (`payload_collision` or `business_duplicate`).
    pub kind: Option<String>,
    /// Recorded at or after.
    pub since: Option<DateTime<Utc>>,
    /// Recorded before.
    pub until: Option<DateTime<Utc>>,
    /// At most this many (1 to [`MAX_REJECTIONS`]; default 50).
    pub limit: i64,
}

impl Default for RejectionFilter {
    fn default() -> Self {
        Self {
            consumer: None,
            kind: None,
            since: None,
            until: None,
            limit: 50,
        }
    }
}

impl RejectionFilter {
    /// Every consumer, every kind, the 50 newest.
    pub fn new() -> Self {
        Self::default()
    }
    /// Only this consumer's.
    pub fn consumer(mut self, c: impl Into<String>) -> Self {
        self.consumer = Some(c.into());
        self
    }
    /// Only this kind.
    pub fn kind(mut self, k: impl Into<String>) -> Self {
        self.kind = Some(k.into());
        self
    }
    /// Recorded at or after `t`.
    pub fn since(mut self, t: DateTime<Utc>) -> Self {
        self.since = Some(t);
        self
    }
    /// Recorded before `t`.
    pub fn until(mut self, t: DateTime<Utc>) -> Self {
        self.until = Some(t);
        self
    }
    /// At most `n` rows (clamped to 1..=[`MAX_REJECTIONS`]).
    pub fn limit(mut self, n: i64) -> Self {
        self.limit = n.clamp(1, MAX_REJECTIONS);
        self
    }
}

// ---------------------------------------------------------------------------------------------------------
// The SQL, written once with `$N` placeholders (SQLite gets `?N`).

/// The consumers of a table, by a skip scan over its index led by `consumer_name`.
fn consumers_sql(table: &str) -> String {
    format!(
        "WITH RECURSIVE c(name) AS (\
         SELECT min(consumer_name) FROM {table} \
         UNION ALL \
         SELECT (SELECT min(consumer_name) FROM {table} WHERE consumer_name > c.name) FROM c WHERE c.name IS NOT NULL) \
         SELECT name FROM c WHERE name IS NOT NULL LIMIT $1"
    )
}

const INBOX_STATS: &str = "SELECT count(*), min(processed_at), max(processed_at), count(CASE WHEN processed_at >= $2 THEN 1 END) FROM txinbox_inbox WHERE consumer_name = $1";
const REJECTION_STATS: &str = "SELECT kind, count(*), max(recorded_at) FROM txinbox_rejections WHERE consumer_name = $1 GROUP BY kind";
const EFFECT_STATS: &str = "SELECT state, count(*), min(created_at) FROM txinbox_effects WHERE consumer_name = $1 GROUP BY state";

const MARKER_COLUMNS: &str = "i.consumer_name, i.source, i.message_id, i.event_type, i.business_key, i.payload_hash, i.contract_version, i.tenant_id, i.received_at, i.processed_at, i.result_reference, i.retention_until, i.id_origin, i.delivery_count";
const REJECTION_COLUMNS: &str = "id, consumer_name, source, message_id, kind, business_key, payload_hash, conflicts_with, detail, recorded_at";
const EFFECT_COLUMNS: &str = "id, idempotency_key, name, destination, external_ref, group_key, state, attempts, reconciliations, next_attempt_at, claimed_by, claim_until, result_reference, last_error, created_at, updated_at, finished_at";

fn marker_sql(with_source: bool) -> String {
    if with_source {
        format!("SELECT {MARKER_COLUMNS} FROM txinbox_inbox i WHERE i.consumer_name = $1 AND i.message_id = $2 AND i.source = $3")
    } else {
        // The consumer's sources by a skip scan over the primary key, then one primary-key probe each.
        format!(
            "WITH RECURSIVE s(source) AS (\
             SELECT min(source) FROM txinbox_inbox WHERE consumer_name = $1 \
             UNION ALL \
             SELECT (SELECT min(source) FROM txinbox_inbox WHERE consumer_name = $1 AND source > s.source) FROM s WHERE s.source IS NOT NULL) \
             SELECT {MARKER_COLUMNS} FROM s JOIN txinbox_inbox i ON i.consumer_name = $1 AND i.source = s.source AND i.message_id = $2 \
             ORDER BY i.source"
        )
    }
}

// A message's rejections and effects are few: they are sorted after the query, since an ORDER BY here would
// tempt SQLite (without ANALYZE statistics) into the consumer's time-ordered index instead of the message's.
fn message_rejections_sql(with_source: bool) -> String {
    format!(
        "SELECT {REJECTION_COLUMNS} FROM txinbox_rejections WHERE consumer_name = $1 AND message_id = $2{}",
        if with_source { " AND source = $3" } else { "" }
    )
}

fn message_effects_sql() -> String {
    format!(
        "SELECT {EFFECT_COLUMNS} FROM txinbox_effects WHERE consumer_name = $1 AND message_id = $2"
    )
}

/// A bound parameter.
#[derive(Clone, Debug)]
enum Param {
    Text(String),
    Time(DateTime<Utc>),
    Int(i64),
}

fn rejections_sql(f: &RejectionFilter) -> (String, Vec<Param>) {
    let mut clauses = Vec::new();
    let mut params = Vec::new();
    let mut push = |clause: &str, p: Param| {
        params.push(p);
        clauses.push(format!("{clause} ${}", params.len()));
    };
    if let Some(c) = &f.consumer {
        push("consumer_name =", Param::Text(c.clone()));
    }
    if let Some(k) = &f.kind {
        push("kind =", Param::Text(k.clone()));
    }
    if let Some(t) = f.since {
        push("recorded_at >=", Param::Time(t));
    }
    if let Some(t) = f.until {
        push("recorded_at <", Param::Time(t));
    }
    params.push(Param::Int(f.limit.clamp(1, MAX_REJECTIONS)));
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (
        format!(
            "SELECT {REJECTION_COLUMNS} FROM txinbox_rejections{filter} ORDER BY recorded_at DESC, id DESC LIMIT ${}",
            params.len()
        ),
        params,
    )
}

// ---------------------------------------------------------------------------------------------------------
// Reading rows of either backend.

/// Typed reads of a result row; SQLite's times are RFC 3339 text, PostgreSQL's are `timestamptz`.
trait Cols {
    fn text(&self, i: usize) -> Result<String, sqlx::Error>;
    fn opt_text(&self, i: usize) -> Result<Option<String>, sqlx::Error>;
    fn int(&self, i: usize) -> Result<i64, sqlx::Error>;
    fn opt_time(&self, i: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error>;
    fn time(&self, i: usize) -> Result<DateTime<Utc>, sqlx::Error> {
        self.opt_time(i)?
            .ok_or_else(|| sqlx::Error::Decode(format!("column {i} is NULL").into()))
    }
}

/// A store the operator queries run on.
trait OpsDb {
    type Row: Cols;
    async fn fetch(&self, sql: &str, params: &[Param]) -> Result<Vec<Self::Row>, sqlx::Error>;
}

fn marker_from<R: Cols>(r: &R) -> Result<MarkerView, sqlx::Error> {
    Ok(MarkerView {
        consumer: r.text(0)?,
        source: r.text(1)?,
        message_id: r.text(2)?,
        event_type: r.opt_text(3)?,
        business_key: r.opt_text(4)?,
        payload_hash: r.text(5)?,
        contract_version: r.opt_text(6)?,
        tenant_id: r.opt_text(7)?,
        received_at: r.time(8)?,
        processed_at: r.time(9)?,
        result_reference: r.opt_text(10)?,
        retention_until: r.time(11)?,
        id_origin: r.text(12)?,
        delivery_count: r.int(13)?,
    })
}

fn rejection_from<R: Cols>(r: &R) -> Result<RejectionRow, sqlx::Error> {
    Ok(RejectionRow {
        id: r.int(0)?,
        consumer: r.text(1)?,
        source: r.text(2)?,
        message_id: r.text(3)?,
        kind: r.text(4)?,
        business_key: r.opt_text(5)?,
        payload_hash: r.text(6)?,
        conflicts_with: r.text(7)?,
        detail: r.text(8)?,
        recorded_at: r.time(9)?,
    })
}

fn effect_from<R: Cols>(r: &R) -> Result<EffectView, sqlx::Error> {
    Ok(EffectView {
        id: r.int(0)?,
        key: r.text(1)?,
        name: r.text(2)?,
        destination: r.text(3)?,
        external_ref: r.text(4)?,
        group_key: r.opt_text(5)?,
        state: r.text(6)?,
        attempts: r.int(7)?,
        reconciliations: r.int(8)?,
        next_attempt_at: r.time(9)?,
        claimed_by: r.opt_text(10)?,
        claim_until: r.opt_time(11)?,
        reference: r.opt_text(12)?,
        last_error: r.opt_text(13)?,
        created_at: r.time(14)?,
        updated_at: r.time(15)?,
        finished_at: r.opt_time(16)?,
    })
}

async fn consumer_stats<S: OpsDb>(
    db: &S,
    consumer: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Vec<ConsumerStats>, sqlx::Error> {
    let consumers: Vec<String> = match consumer {
        Some(c) => vec![c.to_owned()],
        None => {
            let mut all = std::collections::BTreeSet::new();
            for table in ["txinbox_inbox", "txinbox_rejections", "txinbox_effects"] {
                for r in db
                    .fetch(&consumers_sql(table), &[Param::Int(MAX_CONSUMERS)])
                    .await?
                {
                    all.insert(r.text(0)?);
                }
            }
            all.into_iter().take(MAX_CONSUMERS as usize).collect()
        }
    };
    let hour_ago = now - chrono::Duration::hours(1);
    let mut out = Vec::with_capacity(consumers.len());
    for c in consumers {
        let mut s = ConsumerStats::empty(c.clone(), now);
        let name = Param::Text(c);
        if let Some(r) = db
            .fetch(INBOX_STATS, &[name.clone(), Param::Time(hour_ago)])
            .await?
            .first()
        {
            s.inbox_rows = r.int(0)?;
            s.oldest_processed_at = r.opt_time(1)?;
            s.newest_processed_at = r.opt_time(2)?;
            s.rows_last_hour = r.int(3)?;
        }
        for r in db
            .fetch(REJECTION_STATS, std::slice::from_ref(&name))
            .await?
        {
            s.rejections.insert(r.text(0)?, r.int(1)?);
            s.last_rejection_at = s.last_rejection_at.max(r.opt_time(2)?);
        }
        for r in db.fetch(EFFECT_STATS, std::slice::from_ref(&name)).await? {
            let state = r.text(0)?;
            let oldest = r.opt_time(2)?;
            if WAITING_EFFECT_STATES.contains(&state.as_str()) {
                if let Some(t) = oldest {
                    s.oldest_pending_effect_at =
                        Some(s.oldest_pending_effect_at.map_or(t, |o| o.min(t)));
                }
            }
            s.effects.insert(state, r.int(1)?);
        }
        s.effect_lag_seconds = s
            .oldest_pending_effect_at
            .map(|t| (now - t).num_milliseconds().max(0) as f64 / 1000.0);
        out.push(s);
    }
    Ok(out)
}

async fn message_story<S: OpsDb>(
    db: &S,
    consumer: &str,
    message_id: &str,
    source: Option<&str>,
) -> Result<MessageStory, sqlx::Error> {
    let mut params = vec![
        Param::Text(consumer.to_owned()),
        Param::Text(message_id.to_owned()),
    ];
    if let Some(s) = source {
        params.push(Param::Text(s.to_owned()));
    }
    let markers = db
        .fetch(&marker_sql(source.is_some()), &params)
        .await?
        .iter()
        .map(marker_from)
        .collect::<Result<_, _>>()?;
    let mut rejections: Vec<RejectionRow> = db
        .fetch(&message_rejections_sql(source.is_some()), &params)
        .await?
        .iter()
        .map(rejection_from)
        .collect::<Result<_, _>>()?;
    rejections.sort_by_key(|r| (r.recorded_at, r.id));
    let mut effects: Vec<EffectView> = db
        .fetch(&message_effects_sql(), &params[..2])
        .await?
        .iter()
        .map(effect_from)
        .collect::<Result<_, _>>()?;
    effects.sort_by_key(|e| e.id);
    Ok(MessageStory {
        consumer: consumer.to_owned(),
        message_id: message_id.to_owned(),
        source: source.map(str::to_owned),
        markers,
        rejections,
        effects,
    })
}

async fn rejections<S: OpsDb>(
    db: &S,
    filter: &RejectionFilter,
) -> Result<Vec<RejectionRow>, sqlx::Error> {
    let (sql, params) = rejections_sql(filter);
    db.fetch(&sql, &params)
        .await?
        .iter()
        .map(rejection_from)
        .collect()
}

/// The inherent methods, the same on both backends.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! ops_methods {
    () => {
        /// Per-consumer figures (one consumer, or every consumer found in the inbox, rejection and effect
        /// tables); `now` is the reference of the last hour and of the effect lag.
        pub async fn consumer_stats(
            &self,
            consumer: Option<&str>,
            now: DateTime<Utc>,
        ) -> Result<Vec<ConsumerStats>, sqlx::Error> {
            consumer_stats(self, consumer, now).await
        }

        /// One message's story: its markers (one per source unless `source` is given), rejections and
        /// effects. Check [`MessageStory::found`].
        pub async fn message_story(
            &self,
            consumer: &str,
            message_id: &str,
            source: Option<&str>,
        ) -> Result<MessageStory, sqlx::Error> {
            message_story(self, consumer, message_id, source).await
        }

        /// Rejections matching `filter`, newest first.
        pub async fn rejections(
            &self,
            filter: &RejectionFilter,
        ) -> Result<Vec<RejectionRow>, sqlx::Error> {
            rejections(self, filter).await
        }
    };
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use sqlx::postgres::PgRow;
    use sqlx::Row;

    impl Cols for PgRow {
        fn text(&self, i: usize) -> Result<String, sqlx::Error> {
            self.try_get(i)
        }
        fn opt_text(&self, i: usize) -> Result<Option<String>, sqlx::Error> {
            self.try_get(i)
        }
        fn int(&self, i: usize) -> Result<i64, sqlx::Error> {
            // count(*) and ids are BIGINT; attempts and delivery counts are INTEGER.
            self.try_get::<i64, _>(i)
                .or_else(|_| self.try_get::<i32, _>(i).map(i64::from))
        }
        fn opt_time(&self, i: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
            self.try_get(i)
        }
    }

    impl OpsDb for crate::Store<sqlx::Postgres> {
        type Row = PgRow;
        async fn fetch(&self, sql: &str, params: &[Param]) -> Result<Vec<PgRow>, sqlx::Error> {
            let mut q = sqlx::query(sql);
            for p in params {
                q = match p {
                    Param::Text(s) => q.bind(s.clone()),
                    Param::Time(t) => q.bind(*t),
                    Param::Int(n) => q.bind(*n),
                };
            }
            q.fetch_all(self.pool()).await
        }
    }

    /// Operator queries on PostgreSQL (see [`crate::ops`]).
    impl crate::Store<sqlx::Postgres> {
        ops_methods!();
    }
}

#[cfg(feature = "sqlite")]
mod lite {
    use super::*;
    use chrono::SecondsFormat;
    use sqlx::sqlite::SqliteRow;
    use sqlx::Row;

    /// SQLite's stored form of a time (fixed-width RFC 3339 UTC, so that text order is time order).
    fn ts(t: DateTime<Utc>) -> String {
        t.to_rfc3339_opts(SecondsFormat::Micros, true)
    }

    impl Cols for SqliteRow {
        fn text(&self, i: usize) -> Result<String, sqlx::Error> {
            self.try_get(i)
        }
        fn opt_text(&self, i: usize) -> Result<Option<String>, sqlx::Error> {
            self.try_get(i)
        }
        fn int(&self, i: usize) -> Result<i64, sqlx::Error> {
            self.try_get(i)
        }
        fn opt_time(&self, i: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
            let s: Option<String> = self.try_get(i)?;
            s.map(|s| {
                DateTime::parse_from_rfc3339(&s)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))
            })
            .transpose()
        }
    }

    impl OpsDb for crate::Store<sqlx::Sqlite> {
        type Row = SqliteRow;
        async fn fetch(&self, sql: &str, params: &[Param]) -> Result<Vec<SqliteRow>, sqlx::Error> {
            // `$N` is PostgreSQL's placeholder; SQLite numbers them `?N`.
            let sql = sql.replace('$', "?");
            let mut q = sqlx::query(&sql);
            for p in params {
                q = match p {
                    Param::Text(s) => q.bind(s.clone()),
                    Param::Time(t) => q.bind(ts(*t)),
                    Param::Int(n) => q.bind(*n),
                };
            }
            q.fetch_all(self.pool()).await
        }
    }

    /// Operator queries on SQLite (see [`crate::ops`]).
    impl crate::Store<sqlx::Sqlite> {
        ops_methods!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_filters_build_bounded_sql() {
        let (sql, params) = rejections_sql(&RejectionFilter::new());
        assert!(
            sql.ends_with("ORDER BY recorded_at DESC, id DESC LIMIT $1"),
            "{sql}"
        );
        assert_eq!(params.len(), 1);
        let f = RejectionFilter::new()
            .consumer("c")
            .kind("payload_collision")
            .since(Utc::now())
            .until(Utc::now())
            .limit(1_000_000);
        let (sql, params) = rejections_sql(&f);
        assert!(
            sql.contains(
                "WHERE consumer_name = $1 AND kind = $2 AND recorded_at >= $3 AND recorded_at < $4"
            ),
            "{sql}"
        );
        assert!(matches!(params.last(), Some(Param::Int(MAX_REJECTIONS))));
    }
}
