//! The operator queries on PostgreSQL: its rows, its parameters, and the methods of `Store<Postgres>`.

use super::queries::{consumer_stats, message_story, ops_methods, rejections};
use super::rows::{Cols, OpsDb};
use super::sql::Param;
use super::*;
use chrono::{DateTime, Utc};
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
    async fn query(&self, sql: &str, params: &[Param]) -> Result<Vec<PgRow>, sqlx::Error> {
        let mut q = sqlx::query(sql);
        for p in params {
            q = match p {
                Param::Text(s) => q.bind(s.clone()),
                // Dates as the stores keep them (`kept_time`), as SQLite compares them.
                Param::Time(t) => q.bind(crate::backend::kept_time(*t)),
                Param::Int(n) => q.bind(*n),
            };
        }
        q.fetch_all(self.pool()).await
    }

    async fn fetch_legacy(&self, sql: &str, params: &[Param]) -> Result<Vec<PgRow>, sqlx::Error> {
        if !crate::partitions::has_legacy(self.pool()).await? {
            return Ok(Vec::new());
        }
        // The frozen table has the row-by-row table's columns; the marker queries name no other table
        // whose name begins like it.
        let legacy = sql.replace("txinbox_inbox", "txinbox_inbox_legacy");
        match self.fetch(&legacy, params).await {
            // Dropped since (its last marker expired).
            Err(e) if crate::partitions::is_missing_legacy(&e) => Ok(Vec::new()),
            r => r,
        }
    }
}

/// Operator queries on PostgreSQL (see [`crate::ops`]).
impl crate::Store<sqlx::Postgres> {
    ops_methods!();
}
