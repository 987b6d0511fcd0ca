//! PostgreSQL backend.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgConnection, PgPool, Postgres, Row};
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

/// The effects runner's purge: done effects finished before $1, at most $2 (index `txinbox_effects_finished`).
pub(crate) const PURGE_DONE_EFFECTS: &str = "DELETE FROM txinbox_effects WHERE id IN (SELECT id FROM txinbox_effects WHERE state = 'done' AND finished_at < $1 LIMIT $2)";

/// Gives back the effects of one claim ($1 its holder name, unique to the claim; $2 the runner's now): each to
/// the state it was claimed from, one claimed from an expired claim to in flight with its claim ended at the
/// database's clock (due at once, and reconciled first). Only rows still held by that very claim.
pub(crate) const RELEASE_CLAIM: &str = "UPDATE txinbox_effects SET state = claimed_from, claimed_by = CASE WHEN claimed_from = 'in_flight' THEN claimed_by END, claim_until = CASE WHEN claimed_from = 'in_flight' THEN now() END, updated_at = $2 WHERE claimed_by = $1 AND state = 'in_flight' AND claimed_from IN ('pending', 'uncertain', 'in_flight')";

/// The instant `param` (an interval of microseconds only: no day or month, whose length the session's time
/// zone would decide; see [`lasting`]) after the database's clock (`now()`, the statement's start): within the
/// dates the store keeps (years 1 to 9999, as `kept_time`), never "timestamp out of range"; NULL for NULL.
fn after_db_clock(param: &str) -> String {
    format!("CASE WHEN {param}::interval < '0001-01-01 00:00:00+00'::timestamptz - now() THEN '0001-01-01 00:00:00+00'::timestamptz WHEN {param}::interval > '9999-12-31 23:59:59.999999+00'::timestamptz - now() THEN '9999-12-31 23:59:59.999999+00'::timestamptz ELSE now() + {param}::interval END")
}

/// Maintenance's purge: effects done or compensated before $1, at most $2 (index
/// `txinbox_effects_finished`).
pub(crate) const PURGE_FINISHED_EFFECTS: &str = "DELETE FROM txinbox_effects WHERE id IN (SELECT id FROM txinbox_effects WHERE state IN ('done', 'compensated') AND finished_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING consumer_name";

/// The conditional insert. Without a conflict target, `ON CONFLICT DO NOTHING` covers both the primary key and
/// the business-key index; a concurrent insert of the same key waits for the other transaction and then
/// either conflicts (it committed) or proceeds (it rolled back).
pub(crate) const INSERT_MARKER: &str = "INSERT INTO txinbox_inbox (consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) ON CONFLICT DO NOTHING";

/// The marker inserts of a batch as one statement: the rows as arrays, inserted in their order (`ORDER BY
/// ord`: a row refused by an earlier one of the same batch is refused as it would be one after the other),
/// with the columns that tell which rows went in.
pub(crate) const INSERT_MARKERS: &str = "INSERT INTO txinbox_inbox (consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count) SELECT consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::timestamptz[], $10::timestamptz[], $11::timestamptz[], $12::text[], $13::int4[]) WITH ORDINALITY AS t(consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, retention_until, id_origin, delivery_count, ord) ORDER BY ord ON CONFLICT DO NOTHING RETURNING consumer_name, source, message_id, payload_hash, business_key, tenant_id";

/// The batch's marker insert, for the benchmark's pgbench reference (which must run exactly the inbox's SQL).
#[doc(hidden)]
pub fn insert_markers_sql() -> &'static str {
    INSERT_MARKERS
}

/// The savepoint of one delivery of a batch's savepoint pass, for the benchmark's pgbench figure of it.
#[doc(hidden)]
pub fn savepoint_sql() -> &'static str {
    crate::backend::SAVEPOINT
}

/// The marker insert, for the benchmark's pgbench reference (which must run exactly the inbox's SQL).
#[doc(hidden)]
pub fn insert_marker_sql() -> &'static str {
    INSERT_MARKER
}

const HOLDER: &str = "SELECT message_id, payload_hash, processed_at, (source = $2 AND message_id = $3) AS same_identity, result_reference FROM txinbox_inbox WHERE consumer_name = $1 AND ((source = $2 AND message_id = $3) OR ($4::text IS NOT NULL AND business_key = $4 AND COALESCE(tenant_id, '') = COALESCE($5::text, ''))) ORDER BY same_identity DESC LIMIT 1";

/// The row holding `id`'s identity or business key, as a conflicting marker insert left it.
async fn holder(
    conn: &mut PgConnection,
    id: &Identity,
) -> Result<Option<ExistingMarker>, sqlx::Error> {
    holder_in(conn, HOLDER, id, None).await
}

/// The row holding `id`'s identity or business key, read with `sql` (this module's [`HOLDER`] or a
/// partitioned layout's, whose sixth parameter is the marker's partition key `bucket`).
pub(crate) async fn holder_in(
    conn: &mut PgConnection,
    sql: &str,
    id: &Identity,
    bucket: Option<DateTime<Utc>>,
) -> Result<Option<ExistingMarker>, sqlx::Error> {
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

/// The parameters of a batch marker insert ([`INSERT_MARKERS`], or the partitioned layout's with `buckets`
/// as its fourteenth array): one array per column, the rows in order.
pub(crate) fn marker_arrays(
    rows: &[&MarkerRow<'_>],
    buckets: Option<&[DateTime<Utc>]>,
) -> Result<PgArguments, sqlx::Error> {
    let column = |f: for<'r> fn(&'r MarkerRow<'r>) -> Option<&'r str>| -> Vec<Option<&str>> {
        rows.iter().map(|r| f(r)).collect()
    };
    let times = |f: fn(&MarkerRow<'_>) -> DateTime<Utc>| -> Vec<DateTime<Utc>> {
        rows.iter().map(|r| kept_time(f(r))).collect()
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
        rows.iter()
            .map(|r| i32::try_from(r.delivery_count).unwrap_or(i32::MAX))
            .collect::<Vec<_>>(),
    )?;
    if let Some(b) = buckets {
        add(&mut args, b.to_vec())?;
    }
    Ok(args)
}

/// Which of `rows` a batch marker insert wrote, from the rows it returned (`consumer_name, source,
/// message_id, payload_hash, business_key, tenant_id`). Each returned row is the first row of the batch with
/// its values not matched yet: rows with the same values are tried in order, and a later one goes in only
/// where the earlier one could not, which values alike cannot.
pub(crate) fn inserted_rows(
    returned: &[sqlx::postgres::PgRow],
    rows: &[&MarkerRow<'_>],
) -> Result<Vec<bool>, sqlx::Error> {
    let mut inserted = vec![false; rows.len()];
    for r in returned {
        let (consumer, source, message_id, hash): (&str, &str, &str, &str) =
            (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?);
        let (business_key, tenant): (Option<&str>, Option<&str>) = (r.try_get(4)?, r.try_get(5)?);
        let found = rows.iter().enumerate().position(|(i, row)| {
            let id = row.identity;
            !inserted[i]
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
    Ok(inserted)
}

/// Whether two of `rows` meet under the inbox's unique constraints (one consumer, and one identity or one
/// business key of one tenant), as [`HOLDER`] finds them. Such rows go in one after the other (the row-by-row
/// layout here, the partitioned one in `partitions::pg`): one statement reads each refused row's holder after
/// every row went in, and would name a later row of the batch, which one insert after the other had not met
/// yet (a business duplicate answered as a plain duplicate).
pub(crate) fn rows_meet<'r, 'a: 'r>(rows: impl IntoIterator<Item = &'r MarkerRow<'a>>) -> bool {
    let mut seen = std::collections::HashSet::new();
    rows.into_iter().any(|r| {
        let id = r.identity;
        let consumer = id.consumer.as_str();
        let by_key = id
            .business_key
            .as_deref()
            .is_some_and(|k| !seen.insert((consumer, 1, id.tenant_id.as_deref().unwrap_or(""), k)));
        !seen.insert((consumer, 0, id.source.as_str(), id.message_id.as_str())) || by_key
    })
}

/// Opens a change of the inbox's schema in `tx`: one changer at a time across processes (a transaction
/// advisory lock), and quiet on what already exists (no "relation already exists, skipping" notices).
pub(crate) async fn schema_change(tx: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SET LOCAL client_min_messages TO warning")
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT pg_advisory_xact_lock(7418230911)")
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// How long from `now` to `until` (the runner's clock: a claim's end, a due time), as an interval of
/// microseconds (negative for a time before `now`), between dates the store keeps (so it fits).
fn lasting(now: DateTime<Utc>, until: DateTime<Utc>) -> sqlx::postgres::types::PgInterval {
    let lasts = kept_time(until).signed_duration_since(kept_time(now));
    sqlx::postgres::types::PgInterval {
        months: 0,
        days: 0,
        microseconds: lasts
            .num_microseconds()
            .unwrap_or(if lasts < chrono::TimeDelta::zero() {
                i64::MIN
            } else {
                i64::MAX
            }),
    }
}

fn add<'q, T>(args: &mut PgArguments, value: T) -> Result<(), sqlx::Error>
where
    T: sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + 'q,
{
    args.add(value).map_err(sqlx::Error::Encode)
}

impl Backend for Postgres {
    const NAME: &'static str = "postgres";

    async fn unready(conn: &mut PgConnection) -> Result<Option<String>, sqlx::Error> {
        // `has_table_privilege` resolves the name through the connection's `search_path` (the store's schema)
        // and fails on a table that is not there; given a list of privileges it answers whether *any* is held,
        // so each is asked alone.
        sqlx::query_scalar(
            "SELECT CASE \
               WHEN current_setting('transaction_read_only') = 'on' THEN 'the database is read-only (transaction_read_only is on: a standby, or default_transaction_read_only)' \
               WHEN NOT has_table_privilege('txinbox_inbox', 'INSERT') THEN 'no INSERT privilege on txinbox_inbox' \
               WHEN NOT has_table_privilege('txinbox_inbox', 'SELECT') THEN 'no SELECT privilege on txinbox_inbox' \
             END",
        )
        .fetch_one(conn)
        .await
    }

    async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
        let mut tx = pool.begin().await?;
        schema_change(&mut tx).await?;
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
        add(&mut args, kept_time(row.received_at))?;
        add(&mut args, kept_time(row.processed_at))?;
        add(&mut args, kept_time(row.retention_until))?;
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
        Ok(MarkerInsert::Conflict(holder(conn, id).await?))
    }

    async fn insert_markers(
        conn: &mut PgConnection,
        rows: &[MarkerRow<'_>],
    ) -> Result<Vec<MarkerInsert>, sqlx::Error> {
        // Rows of the batch that meet each other go in one after the other (`rows_meet`).
        if rows_meet(rows) {
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                out.push(Self::insert_marker(&mut *conn, row).await?);
            }
            return Ok(out);
        }
        let rows: Vec<&MarkerRow<'_>> = rows.iter().collect();
        let returned = sqlx::query_with(INSERT_MARKERS, marker_arrays(&rows, None)?)
            .fetch_all(&mut *conn)
            .await?;
        let inserted = inserted_rows(&returned, &rows)?;
        let mut out = Vec::with_capacity(rows.len());
        for (row, inserted) in rows.iter().zip(inserted) {
            out.push(if inserted {
                MarkerInsert::Inserted
            } else {
                MarkerInsert::Conflict(holder(conn, row.identity).await?)
            });
        }
        Ok(out)
    }

    async fn set_result_reference(
        conn: &mut PgConnection,
        id: &Identity,
        reference: &str,
        bucket: Option<DateTime<Utc>>,
    ) -> Result<(), sqlx::Error> {
        // Partitioned: the marker of this transaction's partition, never another bucket's message.
        let sql = match bucket {
            None => "UPDATE txinbox_inbox SET result_reference = $4 WHERE consumer_name = $1 AND source = $2 AND message_id = $3",
            Some(_) => "UPDATE txinbox_inbox SET result_reference = $4 WHERE consumer_name = $1 AND source = $2 AND message_id = $3 AND origin_bucket = $5",
        };
        let mut q = sqlx::query(sql)
            .bind(id.consumer.as_str())
            .bind(&id.source)
            .bind(&id.message_id)
            .bind(text(reference));
        if let Some(b) = bucket {
            q = q.bind(b);
        }
        q.execute(conn).await?;
        Ok(())
    }

    async fn insert_effect(conn: &mut PgConnection, e: &NewEffect<'_>) -> Result<(), sqlx::Error> {
        let fx = e.effect;
        // Recorded, and due, at the database's clock (`now()`, the transaction's start), on which the claims
        // decide what is due and the partitioned layout lays the effects' partitions out: the worker's clock
        // (`e.created_at`) may run ahead of it by more than the partitions made ahead, or behind.
        sqlx::query("INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, group_key, state, next_attempt_at, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', now(), now(), now()) ON CONFLICT DO NOTHING")
            .bind(e.consumer)
            .bind(e.message_id)
            .bind(&e.key)
            .bind(&fx.name)
            .bind(&fx.destination)
            .bind(&fx.payload)
            .bind(metadata_json(e))
            .bind(fx.external_ref.as_deref().unwrap_or(&e.key))
            .bind(&fx.group)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn savepoint(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(conn, crate::backend::SAVEPOINT).await?;
        Ok(())
    }

    async fn rollback_to_savepoint(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(conn, crate::backend::ROLLBACK_TO_SAVEPOINT).await?;
        Ok(())
    }

    async fn transaction_usable(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        // An aborted transaction refuses every statement (25P02) until it ends or rolls back to a savepoint.
        sqlx::Executor::execute(conn, "SELECT 1").await?;
        Ok(())
    }

    async fn transaction_lost(_: &mut PgConnection) -> Result<bool, sqlx::Error> {
        Ok(false)
    }

    async fn clock(pool: &PgPool) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        Ok(Some(
            sqlx::query_scalar("SELECT now()").fetch_one(pool).await?,
        ))
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
            .bind(text(r.detail))
            .bind(kept_time(r.recorded_at))
            .execute(pool)
            .await?;
        Ok(())
    }

    async fn count_markers(pool: &PgPool, consumer: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT count(*) FROM txinbox_inbox WHERE consumer_name = $1")
            .bind(consumer)
            .fetch_one(pool)
            .await
    }

    async fn claim_effects(
        pool: &PgPool,
        holder: &str,
        destinations: &[String],
        now: DateTime<Utc>,
        claim_until: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<ClaimedEffect>, sqlx::Error> {
        // One statement: the due rows are locked and skipped by any other claimer (SKIP LOCKED), then
        // marked in flight under this holder; `due.state` is the state before the claim. The database's clock
        // decides which effects are due, which claims expired and when this one ends (it lasts `claim_until -
        // now`): every runner of the database agrees on who holds an effect and when it is due, whatever its
        // host's clock says.
        let claim_end = after_db_clock("$4");
        let sql = format!(
            "WITH due AS (SELECT id, state FROM txinbox_effects e WHERE destination = ANY($2) AND ((state IN ('pending', 'uncertain') AND next_attempt_at <= now()) OR (state = 'in_flight' AND claim_until < now())) AND (group_key IS NULL OR NOT EXISTS (SELECT 1 FROM txinbox_effects o WHERE o.consumer_name = e.consumer_name AND o.group_key = e.group_key AND o.id < e.id AND o.state NOT IN ('done', 'failed') AND o.state <> 'compensated')) ORDER BY next_attempt_at, id LIMIT $5 FOR UPDATE SKIP LOCKED) \
             UPDATE txinbox_effects t SET state = 'in_flight', claimed_by = $1, claim_until = {claim_end}, updated_at = $3, claimed_from = due.state FROM due WHERE t.id = due.id \
             RETURNING {}, due.state, t.created_at",
            CLAIMED_COLUMNS
                .split(", ")
                .map(|c| format!("t.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let rows = sqlx::query(&sql)
            .bind(text(holder))
            .bind(destinations)
            .bind(kept_time(now))
            .bind(lasting(now, claim_until))
            .bind(limit.max(1))
            .fetch_all(pool)
            .await?;
        rows.iter()
            .map(|r| {
                let from: String = r.try_get(AFTER_CLAIMED)?;
                claimed_from_row(r, &from, r.try_get(AFTER_CLAIMED + 1)?)
            })
            .collect()
    }

    async fn release_claim(
        pool: &PgPool,
        holder: &str,
        now: DateTime<Utc>,
    ) -> Result<u64, sqlx::Error> {
        let r = sqlx::query(RELEASE_CLAIM)
            .bind(text(holder))
            .bind(kept_time(now))
            .execute(pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn finish_effect(
        pool: &PgPool,
        id: i64,
        holder: &str,
        t: &TransitionColumns<'_>,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        // A due time is kept on the database's clock, as the claim reads it: as long after it as the runner
        // asked (`next_at - now`, by the runner's clock). The finish time too, which the purges (the runner's
        // and the maintenance's) count the retention from on that clock: a runner whose host ran behind the
        // database would otherwise finish effects already past their retention.
        let next_at = after_db_clock("$6");
        let sql = format!("UPDATE txinbox_effects SET state = $3, attempts = COALESCE($4, attempts), reconciliations = COALESCE($5, reconciliations), next_attempt_at = COALESCE({next_at}, next_attempt_at), result_reference = COALESCE($7, result_reference), last_error = $8, claimed_by = NULL, claim_until = NULL, updated_at = $9, finished_at = CASE WHEN $10 THEN now() ELSE finished_at END, maybe_happened = COALESCE($11, maybe_happened), sent_hash = COALESCE(sent_hash, $12) WHERE id = $1 AND claimed_by = $2 AND state = 'in_flight'");
        let done = sqlx::query(&sql)
            .bind(id)
            .bind(text(holder))
            .bind(t.state.as_str())
            .bind(t.attempts)
            .bind(t.reconciliations)
            .bind(t.next_at.map(|at| lasting(now, at)))
            .bind(t.reference.map(text))
            .bind(t.error.map(text))
            .bind(kept_time(now))
            .bind(t.finished)
            .bind(t.maybe_happened)
            .bind(t.sent_hash.map(text))
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_done_effects(
        pool: &PgPool,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let r = sqlx::query(PURGE_DONE_EFFECTS)
            .bind(kept_time(before))
            .bind(limit.max(1))
            .execute(pool)
            .await?;
        Ok(r.rows_affected())
    }

    async fn find_effect(pool: &PgPool, key: &str) -> Result<Option<ClaimedEffect>, sqlx::Error> {
        let sql = format!("SELECT {CLAIMED_COLUMNS}, state, created_at, result_reference FROM txinbox_effects WHERE idempotency_key = $1 ORDER BY created_at DESC, id DESC LIMIT 1");
        let Some(r) = sqlx::query(&sql).bind(key).fetch_optional(pool).await? else {
            return Ok(None);
        };
        let state: String = r.try_get(AFTER_CLAIMED)?;
        let mut e = claimed_from_row(&r, &state, r.try_get(AFTER_CLAIMED + 1)?)?;
        e.reference = r.try_get(AFTER_CLAIMED + 2)?;
        Ok(Some(e))
    }

    async fn find_effects(pool: &PgPool, key: &str) -> Result<Vec<ClaimedEffect>, sqlx::Error> {
        let sql = format!("SELECT {CLAIMED_COLUMNS}, state, created_at, result_reference FROM txinbox_effects WHERE idempotency_key = $1 ORDER BY created_at, id");
        let rows = sqlx::query(&sql).bind(key).fetch_all(pool).await?;
        rows.iter()
            .map(|r| {
                let state: String = r.try_get(AFTER_CLAIMED)?;
                let mut e = claimed_from_row(r, &state, r.try_get(AFTER_CLAIMED + 1)?)?;
                e.reference = r.try_get(AFTER_CLAIMED + 2)?;
                Ok(e)
            })
            .collect()
    }

    async fn mark_compensated(
        pool: &PgPool,
        id: i64,
        note: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let r = sqlx::query("UPDATE txinbox_effects SET state = 'compensated', last_error = $2, updated_at = $3 WHERE id = $1 AND state = 'done'")
            .bind(id)
            .bind(text(note))
            .bind(kept_time(now))
            .execute(pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn purge_batch(
        pool: &PgPool,
        table: Table,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<String>, sqlx::Error> {
        // One short statement per batch; SKIP LOCKED: a row another transaction holds is left for later,
        // so the purge never waits on an applying transaction (nor one on the purge for long). A row is
        // named by its table and its place in it: a place alone repeats in every partition of a partitioned
        // inbox (a store that last read the row-by-row layout purges one), and would delete live markers.
        let sql = match table {
            Table::Markers => "WITH doomed AS (SELECT tableoid, ctid FROM txinbox_inbox WHERE retention_until < $1 LIMIT $2 FOR UPDATE SKIP LOCKED) DELETE FROM txinbox_inbox t USING doomed d WHERE t.ctid = d.ctid AND t.tableoid = d.tableoid RETURNING t.consumer_name",
            Table::Rejections => "DELETE FROM txinbox_rejections WHERE id IN (SELECT id FROM txinbox_rejections WHERE recorded_at < $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING consumer_name",
            Table::Effects => PURGE_FINISHED_EFFECTS,
            _ => return Ok(Vec::new()),
        };
        sqlx::query_scalar(sql)
            .bind(kept_time(before))
            .bind(limit.max(1))
            .fetch_all(pool)
            .await
    }

    async fn table_stats(
        pool: &PgPool,
        table: Table,
        consumer: &str,
    ) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error> {
        let sql = match table {
            Table::Markers => {
                "SELECT count(*), min(processed_at) FROM txinbox_inbox WHERE consumer_name = $1"
            }
            Table::Rejections => {
                "SELECT count(*), min(recorded_at) FROM txinbox_rejections WHERE consumer_name = $1"
            }
            Table::Effects => {
                "SELECT count(*), min(created_at) FROM txinbox_effects WHERE consumer_name = $1"
            }
            _ => return Ok((0, None)),
        };
        sqlx::query_as(sql).bind(consumer).fetch_one(pool).await
    }

    async fn legacy_markers(
        pool: &PgPool,
        consumer: &str,
    ) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error> {
        crate::partitions::legacy_markers(pool, consumer).await
    }

    async fn load_layout(
        conn: &mut PgConnection,
    ) -> Result<Option<crate::partitions::LayoutState>, sqlx::Error> {
        crate::partitions::load(conn).await
    }

    async fn insert_markers_partitioned(
        conn: &mut PgConnection,
        rows: &[MarkerRow<'_>],
        layout: &crate::partitions::LayoutState,
    ) -> Result<Vec<MarkerInsert>, sqlx::Error> {
        crate::partitions::insert_markers(conn, rows, layout).await
    }

    fn is_layout_error(e: &sqlx::Error) -> bool {
        crate::partitions::is_layout_error(e)
    }

    async fn rotate_partitions(
        pool: &PgPool,
        now: DateTime<Utc>,
        opts: &txinbox_core::runtime::maintenance::MaintenanceOptions,
    ) -> Result<Option<txinbox_core::runtime::maintenance::PartitionRotation>, StoreError> {
        crate::partitions::rotate_partitions(pool, now, opts).await
    }

    async fn effect_counts(pool: &PgPool) -> Result<Vec<EffectCount>, sqlx::Error> {
        let rows = sqlx::query("SELECT consumer_name, destination, state, count(*), min(created_at), count(*) FILTER (WHERE result_reference IS NULL) FROM txinbox_effects GROUP BY consumer_name, destination, state")
            .fetch_all(pool)
            .await?;
        rows.iter()
            .filter_map(|r| {
                let state: String = match r.try_get(2) {
                    Ok(s) => s,
                    Err(e) => return Some(Err(e)),
                };
                let state = EffectState::parse(&state)?;
                Some((|| {
                    Ok(EffectCount {
                        consumer: r.try_get(0)?,
                        destination: r.try_get(1)?,
                        state,
                        count: r.try_get(3)?,
                        oldest: r.try_get(4)?,
                        without_reference: r.try_get(5)?,
                    })
                })())
            })
            .collect()
    }
}
