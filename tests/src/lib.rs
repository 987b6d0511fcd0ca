//! Support for the end-to-end tests: the PostgreSQL the README test command provides, a fresh schema per
//! test, and a metrics recorder per test.
//!
//! The tests never skip: without `TXINBOX_TEST_PG_URL` they fail and say how to run them.

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// The PostgreSQL URL for tests, from `TXINBOX_TEST_PG_URL`.
///
/// # Panics
/// When the variable is missing: run the tests with `scripts/test.sh`, which provides PostgreSQL.
pub fn pg_url() -> String {
    std::env::var("TXINBOX_TEST_PG_URL").unwrap_or_else(|_| {
        panic!("TXINBOX_TEST_PG_URL is not set: run the tests with `bash scripts/test.sh` (it brings up PostgreSQL), or set it to a reachable postgres:// URL")
    })
}

/// A fresh migrated store in its own schema.
pub async fn pg_store(max_connections: u32) -> txinbox_store::Store<sqlx::Postgres> {
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    txinbox_store::Store::<sqlx::Postgres>::connect_in_schema(&pg_url(), &schema, max_connections)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at TXINBOX_TEST_PG_URL is not reachable: {e}"))
}

/// A fresh migrated in-memory SQLite store.
pub async fn sqlite_store() -> txinbox_store::Store<sqlx::Sqlite> {
    txinbox_store::Store::<sqlx::Sqlite>::connect("sqlite::memory:")
        .await
        .expect("in-memory SQLite")
}

/// One recorded series: name, labels, value (counter total or histogram sample count).
type Series = (String, Vec<(String, String)>, u64);

/// A per-test metrics recorder (thread-local: use it from a current-thread runtime).
///
/// The debugging recorder's snapshots drain what they report, so every read is added to what earlier reads
/// saw.
pub struct Metrics {
    snap: Snapshotter,
    seen: std::cell::RefCell<Vec<Series>>,
    _recorder: &'static DebuggingRecorder,
}

impl Metrics {
    /// Installs a recorder for the current thread for as long as the returned guard lives.
    pub fn install() -> (Self, metrics::LocalRecorderGuard<'static>) {
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        let snap = recorder.snapshotter();
        let guard = metrics::set_default_local_recorder(recorder);
        (
            Self {
                snap,
                seen: Default::default(),
                _recorder: recorder,
            },
            guard,
        )
    }

    fn collect(&self) {
        let mut seen = self.seen.borrow_mut();
        for (k, _, _, v) in self.snap.snapshot().into_vec() {
            let n = match v {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(h) => h.len() as u64,
                DebugValue::Gauge(_) => continue,
            };
            let name = k.key().name().to_owned();
            let labels: Vec<(String, String)> = k
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            match seen
                .iter_mut()
                .find(|(sn, sl, _)| *sn == name && *sl == labels)
            {
                Some(entry) => entry.2 += n,
                None => seen.push((name, labels, n)),
            }
        }
    }

    fn sum(&self, name: &str, label: Option<(&str, &str)>) -> u64 {
        self.collect();
        self.seen
            .borrow()
            .iter()
            .filter(|(n, _, _)| n == name)
            .filter(|(_, labels, _)| match label {
                None => true,
                Some((l, v)) => labels.iter().any(|(k, x)| k == l && x == v),
            })
            .map(|(_, _, v)| *v)
            .sum()
    }

    /// Sum of a counter over all label sets, optionally only where `label` has `value`.
    pub fn counter(&self, name: &str, label: Option<(&str, &str)>) -> u64 {
        self.sum(name, label)
    }

    /// Number of samples recorded in a histogram.
    pub fn histogram_samples(&self, name: &str) -> u64 {
        self.sum(name, None)
    }
}
