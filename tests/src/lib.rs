//! End-to-end and fault tests across the txinbox crates (see `tests/`), against real PostgreSQL and SQLite.
//! Their support (the PostgreSQL they must have, fresh stores, metric totals) is `txinbox-testkit`.

pub use txinbox_testkit::{pg_store, pg_url, sqlite_store, wait_until, MetricTotals};
