//! SQLite backend. Timestamps are stored as fixed-width RFC 3339 UTC text so that they compare in order.

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool};
use txinbox_core::runtime::maintenance::Table;
use txinbox_core::{ExistingMarker, Identity, MarkerInsert, MarkerRow, Rejection};

use crate::backend::{
    claimed_from_row, kept_time, metadata_json, text, Backend, AFTER_CLAIMED, CLAIMED_COLUMNS,
    MIGRATIONS,
};
use crate::error::StoreError;
use txinbox_core::effects::{
    ClaimedEffect, EffectCount, EffectState, NewEffect, TransitionColumns,
};

/// The effects runner's purge: done effects finished before ?1, at most ?2 (index `txinbox_effects_finished`).
pub(crate) const PURGE_DONE_EFFECTS: &str = "DELETE FROM txinbox_effects WHERE id IN (SELECT id FROM txinbox_effects WHERE state = 'done' AND finished_at < ?1 LIMIT ?2)";

/// Gives back the effects of one claim (?1 its holder name, unique to the claim; ?2 the runner's now, ?3 the
/// host's clock, where a claim given back in flight ends), as PostgreSQL's `RELEASE_CLAIM` does.
pub(crate) const RELEASE_CLAIM: &str = "UPDATE txinbox_effects SET state = claimed_from, claimed_by = CASE WHEN claimed_from = 'in_flight' THEN claimed_by END, claim_until = CASE WHEN claimed_from = 'in_flight' THEN ?3 END, updated_at = ?2 WHERE claimed_by = ?1 AND state = 'in_flight' AND claimed_from IN ('pending', 'uncertain', 'in_flight')";

/// Maintenance's purge: effects done or compensated before ?1, at most ?2 (index
/// `txinbox_effects_finished`).
pub(crate) const PURGE_FINISHED_EFFECTS: &str = "DELETE FROM txinbox_effects WHERE id IN (SELECT id FROM txinbox_effects WHERE state IN ('done', 'compensated') AND finished_at < ?1 LIMIT ?2) RETURNING consumer_name";

/// The conditional insert; `ON CONFLICT DO NOTHING` covers the primary key and the business-key index.
pub(crate) const INSERT_MARKER: &str = "INSERT INTO txinbox_inbox (consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) ON CONFLICT DO NOTHING";

const HOLDER: &str = "SELECT message_id, payload_hash, processed_at, (source = ?2 AND message_id = ?3) AS same_identity, result_reference FROM txinbox_inbox WHERE consumer_name = ?1 AND ((source = ?2 AND message_id = ?3) OR (?4 IS NOT NULL AND business_key = ?4 AND COALESCE(tenant_id, '') = COALESCE(?5, ''))) ORDER BY same_identity DESC LIMIT 1";

pub(crate) fn ts(t: DateTime<Utc>) -> String {
    // Stored as text, compared as text: only four-digit years sort in time order ("+262143-..." sorts
    // before "2026-..."). A date beyond (a keep of "for ever") is kept as the last instant of year 9999,
    // one before year 1 as its first (`kept_time`, PostgreSQL's dates too).
    kept_time(t).to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn parse_ts(s: &str) -> Result<DateTime<Utc>, sqlx::Error> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// The claim of [`Backend::claim_effects`] in one `BEGIN IMMEDIATE` transaction (the write lock up front: one
/// claimer at a time, so no effect is claimed twice), rolled back when `reply`'s receiver is gone. The host's
/// clock, read once the write lock is held, decides which effects are due, which claims expired and when this
/// one ends (it lasts `claim_until - now`): one file, one host, one clock for all its runners.
async fn claim_in_transaction(
    pool: &SqlitePool,
    holder: &str,
    dests: &str,
    now: DateTime<Utc>,
    claim_until: DateTime<Utc>,
    limit: i64,
    reply: &tokio::sync::oneshot::Sender<Result<Vec<ClaimedEffect>, sqlx::Error>>,
) -> Result<Vec<ClaimedEffect>, sqlx::Error> {
    use sqlx::Connection;
    let mut conn = pool.acquire().await?;
    // A sqlx transaction: a failed COMMIT rolls back too.
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let clock = Utc::now();
    // The claim lasts `claim_until - now` between the times as the store keeps them (`claim_end` reads them so),
    // as on PostgreSQL: a `now` and an end both past year 9999 last nothing.
    let ends = txinbox_core::effects::claim_end(clock, now, claim_until);
    let due: Vec<(i64, String)> = sqlx::query_as("SELECT id, state FROM txinbox_effects e WHERE destination IN (SELECT value FROM json_each(?1)) AND ((state IN ('pending', 'uncertain') AND next_attempt_at <= ?4) OR (state = 'in_flight' AND claim_until < ?4)) AND (group_key IS NULL OR NOT EXISTS (SELECT 1 FROM txinbox_effects o WHERE o.consumer_name = e.consumer_name AND o.group_key = e.group_key AND o.id < e.id AND o.state NOT IN ('done', 'failed') AND o.state <> 'compensated')) ORDER BY next_attempt_at, id LIMIT ?3")
        .bind(dests)
        .bind(ts(now))
        .bind(limit.max(1))
        .bind(ts(clock))
        .fetch_all(&mut *tx)
        .await?;
    let mut out = Vec::with_capacity(due.len());
    for (id, from) in due {
        let sql = format!("UPDATE txinbox_effects SET state = 'in_flight', claimed_by = ?2, claim_until = ?3, updated_at = ?4, claimed_from = state WHERE id = ?1 RETURNING {CLAIMED_COLUMNS}, created_at");
        let r = sqlx::query(&sql)
            .bind(id)
            .bind(holder)
            .bind(ts(ends))
            .bind(ts(now))
            .fetch_one(&mut *tx)
            .await?;
        let created: String = r.try_get(AFTER_CLAIMED)?;
        out.push(claimed_from_row(&r, &from, parse_ts(&created)?)?);
    }
    if reply.is_closed() {
        // Nobody would run what this claims: it stays due instead of held until its claim expires.
        tx.rollback().await?;
        return Ok(Vec::new());
    }
    tx.commit().await?;
    Ok(out)
}

impl Backend for Sqlite {
    const NAME: &'static str = "sqlite";

    /// Nothing beyond the ping: the check's own connection to an in-memory database is another, empty
    /// database, and a file has no grants.
    async fn unready(_conn: &mut SqliteConnection) -> Result<Option<String>, sqlx::Error> {
        Ok(None)
    }

    async fn migrate(pool: &SqlitePool) -> Result<(), StoreError> {
        use sqlx::Connection;
        let mut conn = pool.acquire().await?;
        // IMMEDIATE takes the write lock up front: one migrator at a time. A sqlx transaction, so that a
        // failed COMMIT or a dropped future rolls back instead of leaving the write lock on a pooled
        // connection.
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let conn = &mut *tx;
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
        match result {
            Ok(()) => Ok(tx.commit().await?),
            Err(e) => {
                tx.rollback().await?;
                Err(e)
            }
        }
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
            // PostgreSQL's INTEGER column, and so the count both stores keep: at most i32::MAX.
            .bind(i32::try_from(row.delivery_count).unwrap_or(i32::MAX))
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
            .bind(&id.tenant_id)
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

    async fn insert_markers(
        conn: &mut SqliteConnection,
        rows: &[MarkerRow<'_>],
    ) -> Result<Vec<MarkerInsert>, sqlx::Error> {
        // In process: one statement per row costs no round trip.
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(Self::insert_marker(&mut *conn, row).await?);
        }
        Ok(out)
    }

    async fn set_result_reference(
        conn: &mut SqliteConnection,
        id: &Identity,
        reference: &str,
        _bucket: Option<DateTime<Utc>>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE txinbox_inbox SET result_reference = ?4 WHERE consumer_name = ?1 AND source = ?2 AND message_id = ?3")
            .bind(id.consumer.as_str())
            .bind(&id.source)
            .bind(&id.message_id)
            .bind(text(reference))
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn insert_effect(
        conn: &mut SqliteConnection,
        e: &NewEffect<'_>,
    ) -> Result<(), sqlx::Error> {
        let fx = e.effect;
        sqlx::query("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, group_key, state, next_attempt_at, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'pending', ?10, ?10, ?10) ON CONFLICT (idempotency_key) DO NOTHING")
            .bind(e.consumer)
            .bind(e.message_id)
            .bind(&e.key)
            .bind(&fx.name)
            .bind(&fx.destination)
            .bind(&fx.payload)
            .bind(metadata_json(e))
            .bind(fx.external_ref.as_deref().unwrap_or(&e.key))
            .bind(&fx.group)
            .bind(ts(e.created_at))
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn savepoint(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(conn, crate::backend::SAVEPOINT).await?;
        Ok(())
    }

    async fn rollback_to_savepoint(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(conn, crate::backend::ROLLBACK_TO_SAVEPOINT).await?;
        Ok(())
    }

    async fn transaction_usable(_: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        // A failed statement that did not end the transaction (`transaction_lost`) undid itself only.
        Ok(())
    }

    async fn clock(_: &SqlitePool) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        // One file on one host: the host's clock is the store's.
        Ok(None)
    }

    async fn transaction_lost(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
        // SQLite has no statement that reads whether a transaction is open; BEGIN inside one is refused.
        match sqlx::Executor::execute(&mut *conn, "BEGIN").await {
            // The transaction was rolled back: the BEGIN opened another, which stays open until the Tx ends.
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(e))
                if e.message()
                    .contains("cannot start a transaction within a transaction") =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
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
            .bind(text(r.detail))
            .bind(ts(r.recorded_at))
            .execute(pool)
            .await?;
        Ok(())
    }

    async fn count_markers(pool: &SqlitePool, consumer: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT count(*) FROM txinbox_inbox WHERE consumer_name = ?1")
            .bind(consumer)
            .fetch_one(pool)
            .await
    }

    async fn claim_effects(
        pool: &SqlitePool,
        holder: &str,
        destinations: &[String],
        now: DateTime<Utc>,
        claim_until: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<ClaimedEffect>, sqlx::Error> {
        // The claim's transaction runs in a task of its own, to its COMMIT or ROLLBACK, whatever becomes of
        // this future: dropped half way (a runner's task aborted), it would hand the pool a connection in
        // an open transaction holding the database's write lock (every other writer busy; that
        // connection's later writes, an effect's finish among them, never committed). A claim whose caller
        // is gone before its COMMIT rolls back.
        let (pool, holder) = (pool.clone(), text(holder).into_owned());
        let dests = serde_json::to_string(destinations).unwrap_or_else(|_| "[]".into());
        let (reply, answer) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let r =
                claim_in_transaction(&pool, &holder, &dests, now, claim_until, limit, &reply).await;
            let _ = reply.send(r);
        });
        answer.await.unwrap_or_else(|_| {
            Err(sqlx::Error::Protocol(
                "the effect claim's task ended without an answer".into(),
            ))
        })
    }

    async fn release_claim(
        pool: &SqlitePool,
        holder: &str,
        now: DateTime<Utc>,
    ) -> Result<u64, sqlx::Error> {
        let r = sqlx::query(RELEASE_CLAIM)
            .bind(text(holder))
            .bind(ts(now))
            .bind(ts(Utc::now()))
            .execute(pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn finish_effect(
        pool: &SqlitePool,
        id: i64,
        holder: &str,
        t: &TransitionColumns<'_>,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        // The finish time on the host's clock too, the store's, as PostgreSQL's `now()`: the purges count the
        // retention from it on that clock.
        let done = sqlx::query("UPDATE txinbox_effects SET state = ?3, attempts = COALESCE(?4, attempts), reconciliations = COALESCE(?5, reconciliations), next_attempt_at = COALESCE(?6, next_attempt_at), result_reference = COALESCE(?7, result_reference), last_error = ?8, claimed_by = NULL, claim_until = NULL, updated_at = ?9, finished_at = CASE WHEN ?10 THEN ?13 ELSE finished_at END, maybe_happened = COALESCE(?11, maybe_happened), sent_hash = COALESCE(sent_hash, ?12) WHERE id = ?1 AND claimed_by = ?2 AND state = 'in_flight'")
            .bind(id)
            .bind(text(holder))
            .bind(t.state.as_str())
            .bind(t.attempts)
            .bind(t.reconciliations)
            // A due time is kept on the host's clock, as the claim reads it: as long after it as the runner
            // asked (`next_at - now`, by the runner's clock).
            .bind(
                t.next_at
                    .map(|at| ts(txinbox_core::effects::claim_end(Utc::now(), now, at))),
            )
            .bind(t.reference.map(text))
            .bind(t.error.map(text))
            .bind(ts(now))
            .bind(t.finished)
            .bind(t.maybe_happened)
            .bind(t.sent_hash.map(text))
            .bind(ts(Utc::now()))
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_done_effects(
        pool: &SqlitePool,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let r = sqlx::query(PURGE_DONE_EFFECTS)
            .bind(ts(before))
            .bind(limit.max(1))
            .execute(pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn find_effect(
        pool: &SqlitePool,
        key: &str,
    ) -> Result<Option<ClaimedEffect>, sqlx::Error> {
        let sql = format!("SELECT {CLAIMED_COLUMNS}, state, created_at, result_reference FROM txinbox_effects WHERE idempotency_key = ?1 ORDER BY created_at DESC, id DESC LIMIT 1");
        let Some(r) = sqlx::query(&sql).bind(key).fetch_optional(pool).await? else {
            return Ok(None);
        };
        let state: String = r.try_get(AFTER_CLAIMED)?;
        let created: String = r.try_get(AFTER_CLAIMED + 1)?;
        let mut e = claimed_from_row(&r, &state, parse_ts(&created)?)?;
        e.reference = r.try_get(AFTER_CLAIMED + 2)?;
        Ok(Some(e))
    }

    async fn find_effects(pool: &SqlitePool, key: &str) -> Result<Vec<ClaimedEffect>, sqlx::Error> {
        let sql = format!("SELECT {CLAIMED_COLUMNS}, state, created_at, result_reference FROM txinbox_effects WHERE idempotency_key = ?1 ORDER BY created_at, id");
        let rows = sqlx::query(&sql).bind(key).fetch_all(pool).await?;
        rows.iter()
            .map(|r| {
                let state: String = r.try_get(AFTER_CLAIMED)?;
                let created: String = r.try_get(AFTER_CLAIMED + 1)?;
                let mut e = claimed_from_row(r, &state, parse_ts(&created)?)?;
                e.reference = r.try_get(AFTER_CLAIMED + 2)?;
                Ok(e)
            })
            .collect()
    }

    async fn mark_compensated(
        pool: &SqlitePool,
        id: i64,
        note: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let r = sqlx::query("UPDATE txinbox_effects SET state = 'compensated', last_error = ?2, updated_at = ?3 WHERE id = ?1 AND state = 'done'")
            .bind(id)
            .bind(text(note))
            .bind(ts(now))
            .execute(pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn purge_batch(
        pool: &SqlitePool,
        table: Table,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<String>, sqlx::Error> {
        let sql = match table {
            Table::Markers => "DELETE FROM txinbox_inbox WHERE rowid IN (SELECT rowid FROM txinbox_inbox WHERE retention_until < ?1 LIMIT ?2) RETURNING consumer_name",
            Table::Rejections => "DELETE FROM txinbox_rejections WHERE id IN (SELECT id FROM txinbox_rejections WHERE recorded_at < ?1 ORDER BY id LIMIT ?2) RETURNING consumer_name",
            Table::Effects => PURGE_FINISHED_EFFECTS,
            _ => return Ok(Vec::new()),
        };
        sqlx::query_scalar(sql)
            .bind(ts(before))
            .bind(limit.max(1))
            .fetch_all(pool)
            .await
    }

    async fn table_stats(
        pool: &SqlitePool,
        table: Table,
        consumer: &str,
    ) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error> {
        let sql = match table {
            Table::Markers => {
                "SELECT count(*), min(processed_at) FROM txinbox_inbox WHERE consumer_name = ?1"
            }
            Table::Rejections => {
                "SELECT count(*), min(recorded_at) FROM txinbox_rejections WHERE consumer_name = ?1"
            }
            Table::Effects => {
                "SELECT count(*), min(created_at) FROM txinbox_effects WHERE consumer_name = ?1"
            }
            _ => return Ok((0, None)),
        };
        let (n, oldest): (i64, Option<String>) =
            sqlx::query_as(sql).bind(consumer).fetch_one(pool).await?;
        Ok((n, oldest.as_deref().map(parse_ts).transpose()?))
    }

    async fn effect_counts(pool: &SqlitePool) -> Result<Vec<EffectCount>, sqlx::Error> {
        let rows: Vec<(String, String, String, i64, Option<String>, i64)> = sqlx::query_as("SELECT consumer_name, destination, state, count(*), min(created_at), SUM(CASE WHEN result_reference IS NULL THEN 1 ELSE 0 END) FROM txinbox_effects GROUP BY consumer_name, destination, state")
            .fetch_all(pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for (consumer, destination, state, count, oldest, without_reference) in rows {
            let Some(state) = EffectState::parse(&state) else {
                continue;
            };
            out.push(EffectCount {
                consumer,
                destination,
                state,
                count,
                oldest: oldest.as_deref().map(parse_ts).transpose()?,
                without_reference,
            });
        }
        Ok(out)
    }
}
