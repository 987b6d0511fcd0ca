//! Test support shared by the txinbox test suites: the PostgreSQL they must have, fresh stores, polling,
//! metric totals, deliveries whose settles do nothing or never arrive, a hook in front of the AWS SDKs' HTTP
//! requests, and the binaries a test starts.
//!
//! The inbox lab, the failure windows and the crash injection they use are `txinbox-lab`.
//!
//! The suites never skip: without the services the README test command provides (`bash scripts/test.sh`),
//! these helpers panic and say how to run the tests.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use txinbox_store::Store;

#[cfg(feature = "prop")]
pub mod prop;

/// The PostgreSQL URL for tests, from `TXINBOX_TEST_PG_URL`.
///
/// # Panics
/// When the variable is missing.
pub fn pg_url() -> String {
    std::env::var("TXINBOX_TEST_PG_URL").unwrap_or_else(|_| {
        panic!("TXINBOX_TEST_PG_URL is not set: run the tests with `bash scripts/test.sh` (it brings up PostgreSQL), or set it to a reachable postgres:// URL")
    })
}

/// A fresh, migrated PostgreSQL store in its own schema (`t_<uuid>`), with up to `max_connections`.
///
/// # Panics
/// When PostgreSQL is not reachable.
pub async fn pg_store(max_connections: u32) -> Store<sqlx::Postgres> {
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    Store::<sqlx::Postgres>::connect_in_schema(&pg_url(), &schema, max_connections)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at TXINBOX_TEST_PG_URL is not reachable: {e}"))
}

/// A fresh, migrated in-memory SQLite store.
pub async fn sqlite_store() -> Store<sqlx::Sqlite> {
    Store::<sqlx::Sqlite>::connect("sqlite::memory:")
        .await
        .unwrap_or_else(|e| panic!("in-memory SQLite failed: {e}"))
}

/// Polls `check` every 50 ms until it returns true; panics naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One series: name, sorted labels, total (counter sum or histogram sample count).
type Series = (String, Vec<(String, String)>, u64);

/// Running totals of the metrics a debugging recorder saw.
///
/// The debugging recorder's snapshots drain what they report, so every read folds the new snapshot into the
/// totals of earlier reads.
pub struct MetricTotals {
    snap: Snapshotter,
    seen: Mutex<Vec<Series>>,
}

impl MetricTotals {
    /// Totals over `snap`.
    pub fn new(snap: Snapshotter) -> Self {
        Self {
            snap,
            seen: Mutex::new(Vec::new()),
        }
    }

    /// Installs a recorder for the current thread (use a current-thread runtime) for as long as the guard
    /// lives.
    pub fn install_local() -> (Self, metrics::LocalRecorderGuard<'static>) {
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        let totals = Self::new(recorder.snapshotter());
        (totals, metrics::set_default_local_recorder(recorder))
    }

    fn total(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for (k, _, _, v) in self.snap.snapshot().into_vec() {
            let n = match v {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(h) => h.len() as u64,
                DebugValue::Gauge(_) => continue,
            };
            let key_name = k.key().name().to_owned();
            let mut ls: Vec<(String, String)> = k
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            ls.sort();
            match seen
                .iter_mut()
                .find(|(sn, sl, _)| *sn == key_name && *sl == ls)
            {
                Some(entry) => entry.2 += n,
                None => seen.push((key_name, ls, n)),
            }
        }
        seen.iter()
            .filter(|(n, ls, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, v)| *v)
            .sum()
    }

    /// The total of counter `name` over the series carrying every label in `labels`.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.total(name, labels)
    }

    /// The number of samples histogram `name` recorded.
    pub fn histogram_samples(&self, name: &str) -> u64 {
        self.total(name, &[])
    }
}

/// A delivery whose settles do nothing and cost nothing: for measuring or testing the inbox and the database
/// alone (the outcomes are read from what `process` returns, not from a broker).
#[derive(Debug)]
pub struct NoopDelivery(pub txinbox_core::ReceivedMessage);

impl txinbox_core::Delivery for NoopDelivery {
    fn message(&self) -> &txinbox_core::ReceivedMessage {
        &self.0
    }
    async fn ack(self) -> Result<(), txinbox_core::BrokerError> {
        Ok(())
    }
    async fn release(self, _: Duration) -> Result<(), txinbox_core::BrokerError> {
        Ok(())
    }
    async fn dead_letter(
        self,
        _: txinbox_core::DeadLetter,
    ) -> Result<(), txinbox_core::BrokerError> {
        Ok(())
    }
    fn lease(&self) -> Option<std::sync::Arc<dyn txinbox_core::Lease>> {
        None
    }
}

/// A delivery whose settles never reach the broker, as when the process dies after COMMIT and before the
/// settle: the message stays locked (its lease is still the broker's) until its lock or visibility runs out,
/// then comes back.
#[derive(Debug)]
pub struct NeverSettled<D>(pub D);

impl<D: txinbox_core::Delivery> txinbox_core::Delivery for NeverSettled<D> {
    fn message(&self) -> &txinbox_core::ReceivedMessage {
        self.0.message()
    }
    async fn ack(self) -> Result<(), txinbox_core::BrokerError> {
        Ok(())
    }
    async fn release(self, _: Duration) -> Result<(), txinbox_core::BrokerError> {
        Ok(())
    }
    async fn dead_letter(
        self,
        _: txinbox_core::DeadLetter,
    ) -> Result<(), txinbox_core::BrokerError> {
        Ok(())
    }
    fn lease(&self) -> Option<std::sync::Arc<dyn txinbox_core::Lease>> {
        self.0.lease()
    }
    // `release_holds` is left to the trait's default (`false`) on purpose, not forwarded: this release returns
    // at once without reaching the broker, whatever the wrapped delivery's release would do.
}

/// A binary started by a test: its stdout piped for the line it prints when ready, killed and reaped when the
/// test ends (a failing assertion never leaves it running).
pub mod child {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};

    /// A running child process, killed when dropped.
    #[derive(Debug)]
    pub struct Running {
        child: Option<Child>,
        stdout: Option<ChildStdout>,
    }

    impl Running {
        /// Starts `command` with stdout piped and stderr discarded.
        ///
        /// # Panics
        /// When the binary cannot start.
        pub fn spawn(command: &mut Command) -> Self {
            let mut child = command
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("the binary {command:?} starts: {e}"));
            let stdout = child.stdout.take();
            Self {
                child: Some(child),
                stdout,
            }
        }

        /// The first line the child prints, without its line ending.
        ///
        /// # Panics
        /// When stdout is closed before a line, or was already read.
        pub async fn first_line(&mut self) -> String {
            let stdout = self.stdout.take().expect("the first line is read once");
            let line = tokio::task::spawn_blocking(move || {
                let mut line = String::new();
                BufReader::new(stdout).read_line(&mut line).map(|_| line)
            })
            .await
            .expect("the reader task")
            .expect("a line on stdout");
            line.trim_end().to_owned()
        }

        /// The first line with `prefix` removed.
        ///
        /// # Panics
        /// When the first line does not start with `prefix`.
        pub async fn first_line_after(&mut self, prefix: &str) -> String {
            let line = self.first_line().await;
            line.strip_prefix(prefix)
                .unwrap_or_else(|| panic!("the first line {line:?} does not start with {prefix:?}"))
                .to_owned()
        }

        /// Sends SIGTERM and waits for the exit.
        ///
        /// # Panics
        /// When `kill` cannot run or the child cannot be waited for.
        pub async fn sigterm(mut self) -> ExitStatus {
            let mut child = self.child.take().expect("the child");
            let sent = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .expect("kill runs");
            assert!(sent.success(), "kill -TERM {} failed", child.id());
            tokio::task::spawn_blocking(move || child.wait())
                .await
                .expect("the waiter task")
                .expect("the exit status")
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            if let Some(child) = self.child.as_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The AWS SDKs' HTTP client with a hook in front of every request: the test doubles of a documented service
/// behaviour an emulator lacks (an answer lost after the commit, one receive at a time) are written as hooks.
pub mod sdk_http {
    use std::sync::Arc;

    use aws_smithy_runtime_api::client::http::{HttpClient, HttpConnectorSettings};
    pub use aws_smithy_runtime_api::client::http::{
        HttpConnector, HttpConnectorFuture, SharedHttpClient, SharedHttpConnector,
    };
    pub use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
    pub use aws_smithy_runtime_api::client::result::ConnectorError;
    use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;

    type Hook = dyn Fn(HttpRequest, &SharedHttpConnector) -> HttpConnectorFuture + Send + Sync;

    /// `inner`, with `hook` called for every request and given the connector `inner` would have sent it to
    /// (`connector.call(request)`, with [`HttpConnector`] in scope, sends it on).
    pub fn with_hook(
        inner: SharedHttpClient,
        hook: impl Fn(HttpRequest, &SharedHttpConnector) -> HttpConnectorFuture + Send + Sync + 'static,
    ) -> SharedHttpClient {
        SharedHttpClient::new(Hooked {
            inner,
            hook: Arc::new(hook),
        })
    }

    #[derive(Clone)]
    struct Hooked {
        inner: SharedHttpClient,
        hook: Arc<Hook>,
    }

    struct Conn {
        inner: SharedHttpConnector,
        hook: Arc<Hook>,
    }

    impl std::fmt::Debug for Hooked {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Hooked")
                .field("inner", &self.inner)
                .finish()
        }
    }

    impl std::fmt::Debug for Conn {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Conn").field("inner", &self.inner).finish()
        }
    }

    impl HttpConnector for Conn {
        fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
            (self.hook)(request, &self.inner)
        }
    }

    impl HttpClient for Hooked {
        fn http_connector(
            &self,
            settings: &HttpConnectorSettings,
            components: &RuntimeComponents,
        ) -> SharedHttpConnector {
            SharedHttpConnector::new(Conn {
                inner: self.inner.http_connector(settings, components),
                hook: self.hook.clone(),
            })
        }
    }
}
