//! The operator queries on SQLite: its rows, its parameters (times as text), the methods of `Store<Sqlite>`.

use super::queries::{consumer_stats, message_story, ops_methods, rejections};
use super::rows::{Cols, OpsDb};
use super::sql::Param;
use super::*;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

// SQLite's stored form of a time: the store's own (`crate::sqlite::ts`), so that a parameter compares with
// the stored times in time order even past year 9999 (which it stores as its last instant).
use crate::sqlite::ts;

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
    async fn query(&self, sql: &str, params: &[Param]) -> Result<Vec<SqliteRow>, sqlx::Error> {
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
