//! What the end-to-end tests of the example binaries share (`examples_smoke.rs`, `readiness.rs`,
//! `agent_chaos.rs`): the built binaries as real processes with their output in files, SIGTERM and SIGKILL,
//! moto's endpoint (an outside service: `TXINBOX_SQS_ENDPOINT`, set by `scripts/test.sh`), a Prometheus server,
//! a TCP proxy that can cut a service away from a worker, the report a worker prints on its way out, and reads
//! of a worker's SQLite file.
//!
//! Nothing here skips: a missing binary, service or variable panics with the command that provides it. Every
//! wait is bounded by a deadline, which only guards against a hang; no test asserts on a duration.
#![allow(dead_code, missing_docs)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use txinbox::sqlx::{self, Connection};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// `target/debug/<name>`, next to this test's own directory (`target/debug/deps`): the workspace's binaries
/// as `cargo build --workspace --all-targets` (scripts/test.sh) leaves them.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug, two levels above the test executable");
    let bin = dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build the workspace first with `cargo build --workspace --all-targets --locked` \
         (scripts/test.sh does, before the tests)",
        bin.display()
    );
    bin
}

/// moto's endpoint, from `TXINBOX_SQS_ENDPOINT`.
///
/// # Panics
/// When the variable is not set: moto is an outside service that `scripts/test.sh` starts.
pub fn sqs_endpoint() -> String {
    std::env::var("TXINBOX_SQS_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "TXINBOX_SQS_ENDPOINT is not set: run the tests with `bash scripts/test.sh` (it starts moto for SQS \
             and exports it), or `eval \"$(bash scripts/moto.sh start)\"` first"
        )
    })
}

/// The environment of an example that talks to SQS at `endpoint` (dummy credentials: moto takes anything).
pub fn sqs_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL_SQS", endpoint.to_owned()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

/// An SDK client for moto at `endpoint`.
pub fn sqs_client(endpoint: &str) -> txinbox_sqs::aws_sdk_sqs::Client {
    txinbox_sqs::emulator_client(endpoint)
}

/// The URL of the queue `name` (`.fifo` included).
pub async fn sqs_queue_url(c: &txinbox_sqs::aws_sdk_sqs::Client, name: &str) -> String {
    c.get_queue_url()
        .queue_name(name)
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "queue {name}: {}",
                txinbox_sqs::aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        })
        .queue_url
        .unwrap_or_else(|| panic!("queue {name}: no URL"))
}

/// Messages in an SQS queue, visible or in flight.
pub async fn sqs_messages(c: &txinbox_sqs::aws_sdk_sqs::Client, url: &str) -> u64 {
    use txinbox_sqs::aws_sdk_sqs::types::QueueAttributeName as A;
    let attrs = c
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "attributes of {url}: {}",
                txinbox_sqs::aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        })
        .attributes
        .unwrap_or_default();
    let n = |k: A| {
        attrs
            .get(&k)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    n(A::ApproximateNumberOfMessages) + n(A::ApproximateNumberOfMessagesNotVisible)
}

/// `prefix-` and 12 random hex digits.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A SAS key for an emulator of this run (never a real one).
pub fn random_key() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// `127.0.0.1:<a port that was free a moment ago>`.
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// A temporary directory for a test's files (databases, settings, logs), removed when dropped unless
/// `TXINBOX_KEEP_WORK` is set (its path is printed either way).
pub struct WorkDir(PathBuf);

impl WorkDir {
    pub fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&dir).expect("create the work directory");
        println!("work directory: {}", dir.display());
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// `sqlite:<dir>/<name>`.
    pub fn sqlite_url(&self, name: &str) -> String {
        format!("sqlite:{}", self.join(name).display())
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if std::env::var_os("TXINBOX_KEEP_WORK").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A deadline: a guard against a hang, never the thing a test asserts.
#[derive(Clone, Copy)]
pub struct Deadline(Instant);

impl Deadline {
    pub fn after(d: Duration) -> Self {
        Self(Instant::now() + d)
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.0
    }
}

/// A process of the test, started from a built binary. Its stdout and stderr go to `<dir>/<name>.out` and
/// `<dir>/<name>.err`, readable while it runs. Still running when dropped: killed (SIGKILL).
pub struct Proc {
    pub name: String,
    child: Child,
    out: PathBuf,
    err: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Starts `bin` (a binary of `target/debug`) with `args` and `envs` added to this process's environment.
    pub fn spawn(
        dir: &Path,
        name: &str,
        bin: &str,
        args: &[&str],
        envs: &[(&str, String)],
    ) -> Self {
        Self::spawn_path(dir, name, &binary(bin), args, envs)
    }

    /// Starts the executable at `path`.
    pub fn spawn_path(
        dir: &Path,
        name: &str,
        path: &Path,
        args: &[&str],
        envs: &[(&str, String)],
    ) -> Self {
        let out = dir.join(format!("{name}.out"));
        let err = dir.join(format!("{name}.err"));
        let file = |p: &Path| std::fs::File::create(p).expect("create a log file");
        let mut cmd = Command::new(path);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(file(&out))
            .stderr(file(&err))
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));
        Self {
            name: name.to_owned(),
            child,
            out,
            err,
            status: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("the process runs")
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Stdout, then stderr.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout(), self.stderr())
    }

    /// The last lines of both, for a failure message.
    pub fn tail(&self) -> String {
        let last = |s: String| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        format!(
            "--- {} stdout (end) ---\n{}\n--- {} stderr (end) ---\n{}",
            self.name,
            last(self.stdout()),
            self.name,
            last(self.stderr())
        )
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait().expect("wait for the process") {
            Some(status) => {
                self.status = Some(status);
                false
            }
            None => true,
        }
    }

    /// Panics (with its output) unless it is still running.
    pub fn assert_running(&mut self) {
        if !self.running() {
            panic!(
                "{} exited ({:?}) while it should run:\n{}",
                self.name,
                self.status,
                self.tail()
            );
        }
    }

    /// Waits for it to exit (at most `within`, else SIGKILL and a panic).
    pub async fn wait(&mut self, within: Duration) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => {
                let status = status.expect("wait for the process");
                self.status = Some(status);
                status
            }
            Err(_) => {
                let _ = self.child.kill().await;
                panic!(
                    "{} did not exit within {within:?}:\n{}",
                    self.name,
                    self.tail()
                );
            }
        }
    }

    /// SIGTERM (`kill -TERM <pid>`, as an orchestrator stops it), then waits for the exit (at most 60 s).
    pub async fn sigterm(&mut self) -> ExitStatus {
        self.assert_running();
        let pid = self.pid().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill -TERM");
        assert!(status.success(), "kill -TERM {pid} failed");
        self.wait(Duration::from_secs(60)).await
    }

    /// SIGTERM, and a panic with its output unless it exits 0.
    pub async fn stop_cleanly(&mut self) {
        let status = self.sigterm().await;
        assert!(
            status.success(),
            "{} exited with {status} after SIGTERM:\n{}",
            self.name,
            self.tail()
        );
    }

    /// SIGKILL (kill -9), and waits for it.
    pub async fn sigkill(&mut self) {
        if self.running() {
            let _ = self.child.start_kill();
        }
        self.wait(Duration::from_secs(30)).await;
    }
}

/// Runs `bin` to its end (at most 60 s) and returns its stdout; panics with its output unless it exits 0.
pub async fn run(
    dir: &Path,
    name: &str,
    bin: &str,
    args: &[&str],
    envs: &[(&str, String)],
) -> String {
    let mut p = Proc::spawn(dir, name, bin, args, envs);
    let status = p.wait(Duration::from_secs(60)).await;
    assert!(
        status.success(),
        "{bin} {args:?} exited with {status}:\n{}",
        p.tail()
    );
    p.stdout()
}

/// The `WorkerReport ...` line a worker prints on its way out (empty when there is none).
pub fn report_line(stdout: &str) -> String {
    stdout
        .lines()
        .find(|l| l.contains("WorkerReport"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The count `key=n` of a report line (0 when the report has no such outcome).
pub fn report_count(report: &str, key: &str) -> u64 {
    report
        .split_whitespace()
        .find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
        .map_or(0, |n| n.parse().expect("a count"))
}

/// Runs `sql` (one row of two integers) on the SQLite file at `path`, read-only; `(0, 0)` while the file or
/// its table does not exist yet.
pub async fn sqlite_pair(path: &Path, sql: &str) -> (i64, i64) {
    let url = format!("sqlite:{}?mode=ro", path.display());
    let Ok(mut c) = sqlx::SqliteConnection::connect(&url).await else {
        return (0, 0);
    };
    let row = sqlx::query_as::<_, (i64, i64)>(sql)
        .fetch_one(&mut c)
        .await
        .unwrap_or((0, 0));
    let _ = c.close().await;
    row
}

/// `state=count` of `txinbox_effects` in the SQLite file at `path`, in state order (empty before the table
/// exists).
pub async fn sqlite_effect_states(path: &Path) -> String {
    let url = format!("sqlite:{}?mode=ro", path.display());
    let Ok(mut c) = sqlx::SqliteConnection::connect(&url).await else {
        return String::new();
    };
    let rows = sqlx::query_as::<_, (String, i64)>(
        "SELECT state, count(*) FROM txinbox_effects GROUP BY state ORDER BY state",
    )
    .fetch_all(&mut c)
    .await
    .unwrap_or_default();
    let _ = c.close().await;
    rows.iter()
        .map(|(s, n)| format!("{s}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// An HTTP client for the workers' endpoints, Prometheus and the hosted service (5 s per request).
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client")
}

/// `GET url`: the status code and the body, or `None` when nothing answered.
pub async fn get(client: &reqwest::Client, url: &str) -> Option<(u16, String)> {
    let r = client.get(url).send().await.ok()?;
    let code = r.status().as_u16();
    Some((code, r.text().await.ok()?))
}

/// `postgres_url` with its database replaced by `db` and its host and port by `addr` (when given).
pub fn pg_url_with(postgres_url: &str, addr: Option<SocketAddr>, db: &str) -> String {
    let (base, query) = match postgres_url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (postgres_url, None),
    };
    let (scheme, rest) = base
        .split_once("://")
        .unwrap_or_else(|| panic!("not a postgres:// URL: {postgres_url}"));
    let (authority, _) = rest.split_once('/').unwrap_or((rest, ""));
    let authority = match addr {
        None => authority.to_owned(),
        Some(a) => {
            let (userinfo, _hostport) = match authority.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, authority),
            };
            match userinfo {
                Some(u) => format!("{u}@{a}"),
                None => a.to_string(),
            }
        }
    };
    let mut url = format!("{scheme}://{authority}/{db}");
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
}

/// The `host:port` a `postgres://` URL names (5432 when it names no port).
pub fn pg_host_port(postgres_url: &str) -> String {
    let rest = postgres_url
        .split_once("://")
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("not a postgres:// URL: {postgres_url}"));
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    assert!(
        !hostport.is_empty(),
        "the PostgreSQL URL names no host (a Unix socket?): {postgres_url}; these tests need host:port"
    );
    if hostport
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        hostport.to_owned()
    } else {
        format!("{hostport}:5432")
    }
}

/// A database of its own on the PostgreSQL of `txinbox_e2e::pg_url()`, dropped (`WITH (FORCE)`) with
/// [`PgDatabase::drop_now`].
pub struct PgDatabase {
    pub name: String,
    admin_url: String,
}

impl PgDatabase {
    pub async fn create(prefix: &str) -> Self {
        let admin_url = txinbox_e2e::pg_url();
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut c = sqlx::PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at TXINBOX_TEST_PG_URL is not reachable: {e}"));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        let _ = c.close().await;
        Self { name, admin_url }
    }

    /// Its URL (through `addr` when given).
    pub fn url(&self, addr: Option<SocketAddr>) -> String {
        pg_url_with(&self.admin_url, addr, &self.name)
    }

    pub async fn drop_now(self) {
        if let Ok(mut c) = sqlx::PgConnection::connect(&self.admin_url).await {
            let _ = sqlx::query(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut c)
            .await;
            let _ = c.close().await;
        }
    }
}

/// A TCP proxy on a loopback port in front of `upstream`, in this process: [`Proxy::cut`] closes the port and
/// every connection through it (what a client sees of a stopped server), [`Proxy::restore`] opens the same
/// port again.
pub struct Proxy {
    addr: SocketAddr,
    upstream: String,
    task: Option<JoinHandle<()>>,
}

impl Proxy {
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let mut p = Self {
            addr,
            upstream: upstream.to_owned(),
            task: None,
        };
        p.serve(listener);
        p
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn serve(&mut self, listener: TcpListener) {
        let upstream = self.upstream.clone();
        self.task = Some(tokio::spawn(async move {
            // Dropping the set (when this task is aborted) aborts every connection: their sockets close.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((mut client, _)) = accepted else { continue };
                        let upstream = upstream.clone();
                        connections.spawn(async move {
                            if let Ok(mut server) = TcpStream::connect(&upstream).await {
                                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                            }
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        }));
    }

    /// Closes the port and every open connection.
    pub async fn cut(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }

    /// Opens the same port again.
    pub async fn restore(&mut self) {
        assert!(self.task.is_none(), "the proxy is not cut");
        let deadline = Deadline::after(Duration::from_secs(30));
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if !deadline.passed() => {
                    println!("proxy: rebinding {}: {e}; again", self.addr);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("cannot listen on {} again: {e}", self.addr),
            }
        };
        self.serve(listener);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// A throwaway Prometheus server (the `prometheus` binary on `PATH`, which `scripts/prometheus.sh install`
/// provides) scraping one target every second with `ops/alerts.yml` loaded, its config and TSDB in `dir`.
/// Killed when dropped.
pub struct Prometheus {
    pub url: String,
    proc: Proc,
}

/// The `prometheus` executable on `PATH`, found the way `scripts/prometheus.sh` finds it (`command -v`).
pub fn prometheus_binary() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "prometheus is not on PATH: install it with `bash scripts/prometheus.sh install` \
                 (scripts/test.sh does, through `scripts/prometheus.sh rules`, before the tests)"
            )
        })
}

impl Prometheus {
    pub async fn start(dir: &Path, target: SocketAddr) -> Self {
        let bin = prometheus_binary();
        let dir = dir.join("prometheus");
        std::fs::create_dir_all(&dir).expect("the Prometheus directory");
        std::fs::copy(root().join("ops/alerts.yml"), dir.join("alerts.yml"))
            .expect("copy ops/alerts.yml");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - alerts.yml\n\
                 scrape_configs:\n  - job_name: txinbox\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
                 static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .expect("write the Prometheus config");
        let listen = free_addr();
        let args = [
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={listen}"),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut proc = Proc::spawn_path(&dir, "prometheus", &bin, &args, &[]);
        let url = format!("http://{listen}");
        let client = http();
        let deadline = Deadline::after(Duration::from_secs(30));
        loop {
            if let Some((200, _)) = get(&client, &format!("{url}/-/ready")).await {
                break;
            }
            proc.assert_running();
            assert!(
                !deadline.passed(),
                "prometheus did not become ready on {listen}:\n{}",
                proc.tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("prometheus at {url} scraping {target}");
        Self { url, proc }
    }

    /// `GET /api/v1/query`: the result vector, or what went wrong.
    pub async fn query(
        &self,
        client: &reqwest::Client,
        expr: &str,
    ) -> Result<Vec<serde_json::Value>, String> {
        let r = client
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: serde_json::Value =
            serde_json::from_str(&r.text().await.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("query failed: {body}"));
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// `GET /api/v1/targets`, as text.
    pub async fn targets(&self, client: &reqwest::Client) -> String {
        get(client, &format!("{}/api/v1/targets", self.url))
            .await
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    pub async fn stop(mut self) {
        self.proc.sigterm().await;
    }
}

/// splitmix64: random moments, replayable from a printed seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration in `[lo, hi)` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

/// The seed of a chaos run: `TXINBOX_CHAOS_SEED` replays one, else the clock. Printed.
pub fn chaos_seed() -> u64 {
    let seed = std::env::var("TXINBOX_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64)
        });
    println!("TXINBOX_CHAOS_SEED={seed}");
    seed
}

/// What the test asks of a broker: messages it dead-lettered so far.
pub trait DeadLetters {
    async fn count(&self) -> u64;
}

pub struct SqsDlq {
    pub client: txinbox_sqs::aws_sdk_sqs::Client,
    pub url: String,
}

impl DeadLetters for SqsDlq {
    async fn count(&self) -> u64 {
        sqs_messages(&self.client, &self.url).await
    }
}

pub struct ServiceBusDlq<'a> {
    pub emulator: &'a txinbox_sb_emulator::EmulatorHandle,
    pub queue: String,
}

impl DeadLetters for ServiceBusDlq<'_> {
    async fn count(&self) -> u64 {
        let dead = self
            .emulator
            .queue_state(&self.queue)
            .map_or(0, |s| s.dead_letter_message_count);
        let poison = self
            .emulator
            .queue_state(&format!("{}-poison", self.queue))
            .map_or(0, |s| s.active_message_count + s.dead_letter_message_count);
        (dead + poison) as u64
    }
}

/// An emulator in this process, with a SAS rule, and the environment the examples read to reach it.
pub async fn service_bus(
    namespace: &str,
) -> (
    txinbox_sb_emulator::EmulatorHandle,
    Vec<(&'static str, String)>,
) {
    let key = random_key();
    let emulator = txinbox_sb_emulator::Emulator::builder()
        .namespace(namespace)
        .sas_key("RootManageSharedAccessKey", &key)
        .start("127.0.0.1:0")
        .await
        .expect("the Service Bus emulator starts");
    let env = vec![
        (
            "SERVICEBUS_CONNECTION_STRING",
            format!(
                "Endpoint=sb://{namespace}.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={key}"
            ),
        ),
        ("SERVICEBUS_ENDPOINT", emulator.base_url()),
    ];
    (emulator, env)
}
