//! Reading rows of either backend: typed column reads, the store the queries run on, and the result rows.

use chrono::{DateTime, Utc};

use super::sql::Param;
use super::{EffectView, MarkerView, RejectionId, RejectionRow};

/// Typed reads of a result row; SQLite's times are RFC 3339 text, PostgreSQL's are `timestamptz`.
pub(super) trait Cols {
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
pub(super) trait OpsDb {
    type Row: Cols;
    /// Runs `sql` with `params`.
    async fn query(&self, sql: &str, params: &[Param]) -> Result<Vec<Self::Row>, sqlx::Error>;

    /// The rows of `sql` with `params`; none when a text parameter holds a NUL: no stored name or id has one
    /// (PostgreSQL's text cannot hold it, and the pipeline refuses it in every identity field), so nothing
    /// matches, on SQLite as on PostgreSQL, which refused the parameter itself.
    async fn fetch(&self, sql: &str, params: &[Param]) -> Result<Vec<Self::Row>, sqlx::Error> {
        if params
            .iter()
            .any(|p| matches!(p, Param::Text(s) if s.contains('\0')))
        {
            return Ok(Vec::new());
        }
        self.query(sql, params).await
    }

    /// The rows of `sql`, a query of the markers' table, run on the frozen row-by-row table a converted
    /// inbox keeps until its last marker expires ([`crate::partitions`]): its markers still decide
    /// duplicates, so an operator sees them. None without that table.
    async fn fetch_legacy(
        &self,
        sql: &str,
        params: &[Param],
    ) -> Result<Vec<Self::Row>, sqlx::Error> {
        let _ = (sql, params);
        Ok(Vec::new())
    }
}

pub(super) fn marker_from<R: Cols>(r: &R) -> Result<MarkerView, sqlx::Error> {
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

pub(super) fn rejection_from<R: Cols>(r: &R) -> Result<RejectionRow, sqlx::Error> {
    Ok(RejectionRow {
        id: RejectionId::Number(r.int(0)?),
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

pub(super) fn effect_from<R: Cols>(r: &R) -> Result<EffectView, sqlx::Error> {
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
