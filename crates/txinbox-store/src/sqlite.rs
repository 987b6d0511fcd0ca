//! SQLite backend. Timestamps are stored as fixed-width RFC 3339 UTC text so that they compare in order.

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool};
use txinbox_core::{ExistingMarker, Identity, MarkerInsert, MarkerRow, OutboxMessage, Rejection};

use crate::backend::{pending_outbox_from_row, Backend, MIGRATIONS};
use crate::error::StoreError;
use txinbox_core::outbox::PendingOutbox;

/// The conditional insert; `ON CONFLICT DO NOTHING` covers the primary key and the business-key index.
pub(crate) const INSERT_MARKER: &str = "INSERT INTO txinbox_inbox (consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) ON CONFLICT DO NOTHING";

const HOLDER: &str = "SELECT message_id, payload_hash, processed_at, (source = ?2 AND message_id = ?3) AS same_identity, result_reference FROM txinbox_inbox WHERE consumer_name = ?1 AND ((source = ?2 AND message_id = ?3) OR (?4 IS NOT NULL AND business_key = ?4)) ORDER BY same_identity DESC LIMIT 1";

pub(crate) fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn parse_ts(s: &str) -> Result<DateTime<Utc>, sqlx::Error> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

impl Backend for Sqlite {
    const NAME: &'static str = "sqlite";

    async fn migrate(pool: &SqlitePool) -> Result<(), StoreError> {
        let mut conn = pool.acquire().await?;
        // IMMEDIATE takes the write lock up front: one migrator at a time.
        sqlx::Executor::execute(&mut *conn, "BEGIN IMMEDIATE").await?;
        let result = async {
            sqlx::Executor::execute(&mut *conn, "CREATE TABLE IF NOT EXISTS txinbox_schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)")
                .await?;
            let current: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM txinbox_schema_version")
                .fetch_one(&mut *conn)
                .await?;
            let current = current.unwrap_or(0);
            let known = crate::backend::latest_version();
            if current > known {
                return Err(StoreError::SchemaTooNew { found: current, known });
            }
            for m in MIGRATIONS {
                let (version, name, lite) = (m.version, m.name, m.sqlite);
                if version <= current {
                    continue;
                }
                sqlx::Executor::execute(&mut *conn, lite)
                    .await
                    .map_err(|source| StoreError::Migration { version, source })?;
                sqlx::query("INSERT INTO txinbox_schema_version (version, name) VALUES (?1, ?2)")
                    .bind(version)
                    .bind(name)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        }
        .await;
        let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
        sqlx::Executor::execute(&mut *conn, end).await?;
        result
    }

    async fn schema_version(pool: &SqlitePool) -> Result<Option<i64>, sqlx::Error> {
        let exists: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'txinbox_schema_version'",
        )
        .fetch_one(pool)
        .await?;
        if exists == 0 {
            return Ok(None);
        }
        let v: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM txinbox_schema_version")
            .fetch_one(pool)
            .await?;
        Ok(Some(v.unwrap_or(0)))
    }

    fn migration_sql(m: &crate::backend::Migration) -> &'static str {
        m.sqlite
    }

    async fn insert_marker(
        conn: &mut SqliteConnection,
        row: &MarkerRow<'_>,
    ) -> Result<MarkerInsert, sqlx::Error> {
        let id = row.identity;
        let done = sqlx::query(INSERT_MARKER)
            .bind(id.consumer.as_str())
            .bind(&id.source)
            .bind(&id.message_id)
            .bind(&id.event_type)
            .bind(&id.business_key)
            .bind(row.payload_hash)
            .bind(&id.contract_version)
            .bind(&id.tenant_id)
            .bind(ts(row.received_at))
            .bind(ts(row.processed_at))
            .bind(ts(row.retention_until))
            .bind(id.origin.as_str())
            .bind(i64::from(row.delivery_count))
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 1 {
            return Ok(MarkerInsert::Inserted);
        }
        let holder = sqlx::query(HOLDER)
            .bind(id.consumer.as_str())
            .bind(&id.source)
            .bind(&id.message_id)
            .bind(&id.business_key)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(MarkerInsert::Conflict(match holder {
            Some(r) => {
                let at: String = r.try_get(2)?;
                Some(ExistingMarker::new(
                    r.try_get(3)?,
                    r.try_get(0)?,
                    r.try_get(1)?,
                    parse_ts(&at)?,
                    r.try_get(4)?,
                ))
            }
            None => None,
        }))
    }

    async fn set_result_reference(
        conn: &mut SqliteConnection,
        id: &Identity,
        reference: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE txinbox_inbox SET result_reference = ?4 WHERE consumer_name = ?1 AND source = ?2 AND message_id = ?3")
            .bind(id.consumer.as_str())
            .bind(&id.source)
            .bind(&id.message_id)
            .bind(reference)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn insert_outbox(
        conn: &mut SqliteConnection,
        m: &OutboxMessage,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        let attrs = serde_json::to_string(&m.attributes).unwrap_or_else(|_| "{}".into());
        sqlx::query("INSERT INTO txinbox_outbox (destination, source, message_id, event_type, group_id, body, attributes, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")
            .bind(&m.destination)
            .bind(&m.source)
            .bind(&m.message_id)
            .bind(&m.event_type)
            .bind(&m.group_id)
            .bind(&m.body)
            .bind(attrs)
            .bind(ts(now))
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn record_rejection(pool: &SqlitePool, r: &Rejection<'_>) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO txinbox_rejections (consumer_name, source, message_id, kind, business_key, payload_hash, conflicts_with, detail, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")
            .bind(r.identity.consumer.as_str())
            .bind(&r.identity.source)
            .bind(&r.identity.message_id)
            .bind(r.kind.as_str())
            .bind(&r.identity.business_key)
            .bind(r.payload_hash)
            .bind(r.conflicts_with)
            .bind(r.detail)
            .bind(ts(r.recorded_at))
            .execute(pool)
            .await?;
        Ok(())
    }

    async fn purge_expired(
        pool: &SqlitePool,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let r = sqlx::query("DELETE FROM txinbox_inbox WHERE rowid IN (SELECT rowid FROM txinbox_inbox WHERE retention_until < ?1 LIMIT ?2)")
            .bind(ts(now))
            .bind(limit)
            .execute(pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn count_markers(pool: &SqlitePool, consumer: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT count(*) FROM txinbox_inbox WHERE consumer_name = ?1")
            .bind(consumer)
            .fetch_one(pool)
            .await
    }

    async fn pending_outbox(
        pool: &SqlitePool,
        limit: i64,
    ) -> Result<Vec<PendingOutbox>, sqlx::Error> {
        let rows = sqlx::query("SELECT id, destination, source, message_id, event_type, group_id, body, attributes, attempts FROM txinbox_outbox WHERE relayed_at IS NULL ORDER BY id LIMIT ?1")
            .bind(limit)
            .fetch_all(pool)
            .await?;
        rows.iter().map(pending_outbox_from_row).collect()
    }

    async fn finish_outbox(
        pool: &SqlitePool,
        id: i64,
        now: DateTime<Utc>,
        error: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        let q = match error {
            None => sqlx::query("UPDATE txinbox_outbox SET relayed_at = ?2, attempts = attempts + 1, last_error = NULL WHERE id = ?1").bind(id).bind(ts(now)),
            Some(e) => sqlx::query("UPDATE txinbox_outbox SET attempts = attempts + 1, last_error = ?2 WHERE id = ?1").bind(id).bind(e.to_owned()),
        };
        q.execute(pool).await?;
        Ok(())
    }
}
