//! Unit tests of the SQL the operator queries build.

use chrono::Utc;

use super::sql::{rejections_sql, Param};
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
