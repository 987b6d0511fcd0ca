//! Unit tests of the operator queries' sort keys.

use chrono::{DateTime, Utc};

use super::rows::sk_time;
use crate::layout as l;

#[test]
fn sort_keys_give_their_time_and_bound_as_text() {
    let t = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.000006Z")
        .unwrap()
        .with_timezone(&Utc);
    let sk = format!("{}#{}", l::ts(t), "abc");
    assert_eq!(sk_time(&sk), Some(t));
    // `recorded_at >= since` and `recorded_at < until` as text comparisons of the sort key.
    assert!(sk.as_str() >= l::ts(t).as_str());
    assert!(sk.as_str() > l::ts(t).as_str(), "until == t excludes t");
    assert!(sk.as_str() < l::ts(t + chrono::Duration::microseconds(1)).as_str());
}
