//! Inserting markers in the partitioned layout: reading the layout, placing each marker in its partition.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use txinbox_core::{MarkerInsert, MarkerRow};

use super::LEGACY;
use crate::partitions::LayoutState;
use crate::postgres::{holder_in, inserted_rows, marker_arrays};

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
    let row = sqlx::query("SELECT width_secs, low, high, legacy, EXISTS (SELECT 1 FROM txinbox_partition_layout WHERE tbl = 'txinbox_effects'), broker_time, ahead FROM txinbox_partition_layout WHERE tbl = 'txinbox_inbox'")
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
            ahead: r.try_get(6)?,
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
        // Without an event time, the broker's enqueue time when allowed; never the receive time
        // (`MarkerRow::origin_at`'s last resort), which differs per delivery: two copies would meet in no
        // partition.
        let answer = if row.identity.event_time.is_none() && !state.broker_time {
            Some(MarkerInsert::Refused {
                reason: "no_event_time".into(),
                detail: "the inbox's partitioned layout places each marker by its event's CloudEvents time, and this message has none (or not RFC 3339): set ce-time on the event, or convert with broker time allowed".into(),
            })
        } else if row.identity.event_time.is_none() && row.enqueued_at.is_none() {
            Some(MarkerInsert::Refused {
                reason: "no_event_time".into(),
                detail: "the inbox's partitioned layout places a marker by its event's CloudEvents time, else by its broker's enqueue time, and this message has neither (a CloudEvents time missing or not RFC 3339, a broker that tells no enqueue time): set ce-time on the event".into(),
            })
        } else if *bucket < state.low {
            Some(MarkerInsert::Expired(format!(
                "origin time {} is in the partition of {}, dropped by retention (partitions from {} are kept)",
                row.origin_at.to_rfc3339(),
                bucket.to_rfc3339(),
                state.low.to_rfc3339()
            )))
        } else if *bucket >= state.high {
            let horizon = state.horizon(row.processed_at);
            Some(if *bucket >= horizon {
                MarkerInsert::Refused {
                    reason: "event_time_in_future".into(),
                    detail: format!(
                        "event time {} is past the partitions the maintenance creates ahead of now (to {}): the producer's clock or the event's time is wrong, and a retry would wait for a partition made only when that time comes",
                        row.origin_at.to_rfc3339(),
                        horizon.to_rfc3339()
                    ),
                }
            } else {
                MarkerInsert::Unplaced(format!(
                    "no partition yet for origin time {} (partitions end at {})",
                    row.origin_at.to_rfc3339(),
                    state.high.to_rfc3339()
                ))
            })
        } else if state.legacy {
            match holder_in(&mut *conn, LEGACY_HOLDER, row.identity, None).await? {
                // The frozen table holds the business key only: a marker of the same identity in this
                // partition comes first, as the row-by-row holder lookup puts one before the other.
                Some(h) if !h.same_identity => {
                    let own = holder_in(&mut *conn, HOLDER, row.identity, Some(*bucket))
                        .await?
                        .filter(|o| o.same_identity);
                    Some(MarkerInsert::Conflict(Some(own.unwrap_or(h))))
                }
                other => other.map(|h| MarkerInsert::Conflict(Some(h))),
            }
        } else {
            None
        };
        out.push(answer);
    }
    let todo: Vec<usize> = (0..rows.len()).filter(|i| out[*i].is_none()).collect();
    // Rows that meet each other go in one after the other, each refused one answered with the holder it met
    // (`postgres::rows_meet`); the others in one statement.
    let statements: Vec<Vec<usize>> = if crate::postgres::rows_meet(todo.iter().map(|i| &rows[*i]))
    {
        todo.into_iter().map(|i| vec![i]).collect()
    } else if todo.is_empty() {
        Vec::new()
    } else {
        vec![todo]
    };
    for todo in statements {
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
