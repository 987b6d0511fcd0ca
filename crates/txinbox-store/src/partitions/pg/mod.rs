//! The partitioned layout on PostgreSQL: partition names, the tables' DDL, and the creation of partitions.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::StoreError;

mod convert;
mod insert;
mod rotate;

pub(crate) use insert::{insert_markers, is_layout_error, load};

/// Whether the frozen row-by-row table of a converted inbox is still there ([`crate::partitions`]): its
/// markers decide duplicates until the last expires, and the operator's figures count them.
pub(crate) async fn has_legacy(pool: &sqlx::PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT to_regclass('txinbox_inbox_legacy') IS NOT NULL")
        .fetch_one(pool)
        .await
}

/// Whether `e` says the frozen table is gone (dropped by the maintenance since it was found).
pub(crate) fn is_missing_legacy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") && d.message().contains(LEGACY))
}

/// The markers of `consumer` in the frozen table, and the oldest one's processing time; none without it.
pub(crate) async fn legacy_markers(
    pool: &sqlx::PgPool,
    consumer: &str,
) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error> {
    if !has_legacy(pool).await? {
        return Ok((0, None));
    }
    match sqlx::query_as(
        "SELECT count(*), min(processed_at) FROM txinbox_inbox_legacy WHERE consumer_name = $1",
    )
    .bind(consumer)
    .fetch_one(pool)
    .await
    {
        Err(e) if is_missing_legacy(&e) => Ok((0, None)),
        r => r,
    }
}
pub(crate) use rotate::rotate_partitions;

/// The first of the layout's tables (markers, evidence, effects) that has a default partition, refused: the
/// layout makes none ([`StoreError::DefaultPartition`]).
pub(crate) async fn default_partition(
    conn: &mut PgConnection,
) -> Result<Option<StoreError>, sqlx::Error> {
    let found: Option<(String, String)> = sqlx::query_as("SELECT t.tbl, p.partdefid::regclass::text FROM unnest($1::text[]) WITH ORDINALITY AS t(tbl, n) JOIN pg_partitioned_table p ON p.partrelid = to_regclass(t.tbl) WHERE p.partdefid <> 0 ORDER BY t.n LIMIT 1")
        .bind([INBOX, REJECTIONS, EFFECTS])
        .fetch_optional(&mut *conn)
        .await?;
    Ok(found.map(|(table, partition)| StoreError::DefaultPartition { table, partition }))
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
