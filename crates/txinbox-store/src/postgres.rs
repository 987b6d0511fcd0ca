//! PostgreSQL backend.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgConnection, PgPool, Postgres, Row};
use txinbox_core::{ExistingMarker, Identity, MarkerInsert, MarkerRow, OutboxMessage, Rejection};

use crate::backend::{pending_outbox_from_row, Backend, MIGRATIONS};
use crate::error::StoreError;
use txinbox_core::outbox::PendingOutbox;

/// The conditional insert. Without a conflict target, `ON CONFLICT DO NOTHING` covers both the primary key and
/// the business-key index; a concurrent insert of the same key waits for the other transaction and then
/// either conflicts (it committed) or proceeds (it rolled back).
pub(crate) const INSERT_MARKER: &str = "INSERT INTO txinbox_inbox (consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) ON CONFLICT DO NOTHING";

/// The marker insert, for the benchmark's pgbench reference (which must run exactly the inbox's SQL).
#[doc(hidden)]
pub fn insert_marker_sql() -> &'static str {
    INSERT_MARKER
}

const HOLDER: &str = "SELECT message_id, payload_hash, processed_at, (source = $2 AND message_id = $3) AS same_identity, result_reference FROM txinbox_inbox WHERE consumer_name = $1 AND ((source = $2 AND message_id = $3) OR ($4::text IS NOT NULL AND business_key = $4)) ORDER BY same_identity DESC LIMIT 1";

fn add<'q, T>(args: &mut PgArguments, value: T) -> Result<(), sqlx::Error>
where
    T: sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + 'q,
{
    args.add(value).map_err(sqlx::Error::Encode)
}

impl Backend for Postgres {
    const NAME: &'static str = "postgres";

    async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
        let mut tx = pool.begin().await?;
        // A start on an up-to-date database is quiet: no "relation already exists, skipping" notices.
        sqlx::query("SET LOCAL client_min_messages TO warning")
            .execute(&mut *tx)
            .await?;
        // One migrator at a time across processes.
        sqlx::query("SELECT pg_advisory_xact_lock(7418230911)")
            .execute(&mut *tx)
            .await?;
        sqlx::Executor::execute(&mut *tx, "CREATE TABLE IF NOT EXISTS txinbox_schema_version (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
            .await?;
        let current: Option<i64> =
            sqlx::query_scalar("SELECT max(version) FROM txinbox_schema_version")
                .fetch_one(&mut *tx)
                .await?;
        let current = current.unwrap_or(0);
        let known = crate::backend::latest_version();
        if current > known {
            return Err(StoreError::SchemaTooNew {
                found: current,
                known,
            });
        }
        for m in MIGRATIONS {
            let (version, name, pg) = (m.version, m.name, m.postgres);
            if version <= current {
                continue;
            }
            sqlx::Executor::execute(&mut *tx, pg)
                .await
                .map_err(|source| StoreError::Migration { version, source })?;
            sqlx::query("INSERT INTO txinbox_schema_version (version, name) VALUES ($1, $2)")
                .bind(version)
                .bind(name)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn schema_version(pool: &PgPool) -> Result<Option<i64>, sqlx::Error> {
        let exists: bool =
            sqlx::query_scalar("SELECT to_regclass('txinbox_schema_version') IS NOT NULL")
                .fetch_one(pool)
                .await?;
        if !exists {
            return Ok(None);
        }
        let v: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM txinbox_schema_version")
            .fetch_one(pool)
            .await?;
        Ok(Some(v.unwrap_or(0)))
    }

    fn migration_sql(m: &crate::backend::Migration) -> &'static str {
        m.postgres
    }

    async fn insert_marker(
        conn: &mut PgConnection,
        row: &MarkerRow<'_>,
    ) -> Result<MarkerInsert, sqlx::Error> {
        let id = row.identity;
        // The arguments are sized once: thirteen parameters would otherwise regrow the buffers as they go.
        let mut args = PgArguments::default();
        args.reserve(13, 256);
        add(&mut args, id.consumer.as_str())?;
        add(&mut args, &id.source)?;
        add(&mut args, &id.message_id)?;
        add(&mut args, &id.event_type)?;
        add(&mut args, &id.business_key)?;
        add(&mut args, row.payload_hash)?;
        add(&mut args, &id.contract_version)?;
        add(&mut args, &id.tenant_id)?;
        add(&mut args, row.received_at)?;
        add(&mut args, row.processed_at)?;
        add(&mut args, row.retention_until)?;
        add(&mut args, id.origin.as_str())?;
        add(
            &mut args,
            i32::try_from(row.delivery_count).unwrap_or(i32::MAX),
        )?;
        let done = sqlx::query_with(INSERT_MARKER, args)
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
            Some(r) => Some(ExistingMarker::new(
                r.try_get(3)?,
                r.try_get(0)?,
                r.try_get(1)?,
                r.try_get(2)?,
                r.try_get(4)?,
            )),
            None => None,
        }))
    }

    async fn set_result_reference(
        conn: &mut PgConnection,
        id: &Identity,
        reference: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE txinbox_inbox SET result_reference = $4 WHERE consumer_name = $1 AND source = $2 AND message_id = $3")
            .bind(id.consumer.as_str())
            .bind(&id.source)
            .bind(&id.message_id)
            .bind(reference)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn insert_outbox(
        conn: &mut PgConnection,
        m: &OutboxMessage,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        let attrs = serde_json::to_string(&m.attributes).unwrap_or_else(|_| "{}".into());
        sqlx::query("INSERT INTO txinbox_outbox (destination, source, message_id, event_type, group_id, body, attributes, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
            .bind(&m.destination)
            .bind(&m.source)
            .bind(&m.message_id)
            .bind(&m.event_type)
            .bind(&m.group_id)
            .bind(&m.body)
            .bind(attrs)
            .bind(now)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn record_rejection(pool: &PgPool, r: &Rejection<'_>) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO txinbox_rejections (consumer_name, source, message_id, kind, business_key, payload_hash, conflicts_with, detail, recorded_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .bind(r.identity.consumer.as_str())
            .bind(&r.identity.source)
            .bind(&r.identity.message_id)
            .bind(r.kind.as_str())
            .bind(&r.identity.business_key)
            .bind(r.payload_hash)
            .bind(r.conflicts_with)
            .bind(r.detail)
            .bind(r.recorded_at)
            .execute(pool)
            .await?;
        Ok(())
    }

    async fn purge_expired(
        pool: &PgPool,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let r = sqlx::query("DELETE FROM txinbox_inbox WHERE ctid IN (SELECT ctid FROM txinbox_inbox WHERE retention_until < $1 LIMIT $2)")
            .bind(now)
            .bind(limit)
            .execute(pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn count_markers(pool: &PgPool, consumer: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT count(*) FROM txinbox_inbox WHERE consumer_name = $1")
            .bind(consumer)
            .fetch_one(pool)
            .await
    }

    async fn pending_outbox(pool: &PgPool, limit: i64) -> Result<Vec<PendingOutbox>, sqlx::Error> {
        let rows = sqlx::query("SELECT id, destination, source, message_id, event_type, group_id, body, attributes, attempts FROM txinbox_outbox WHERE relayed_at IS NULL ORDER BY id LIMIT $1")
            .bind(limit)
            .fetch_all(pool)
            .await?;
        rows.iter().map(pending_outbox_from_row).collect()
    }

    async fn finish_outbox(
        pool: &PgPool,
        id: i64,
        now: DateTime<Utc>,
        error: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        let q = match error {
            None => sqlx::query("UPDATE txinbox_outbox SET relayed_at = $2, attempts = attempts + 1, last_error = NULL WHERE id = $1").bind(id).bind(now),
            Some(e) => sqlx::query("UPDATE txinbox_outbox SET attempts = attempts + 1, last_error = $2 WHERE id = $1").bind(id).bind(e.to_owned()),
        };
        q.execute(pool).await?;
        Ok(())
    }
}
