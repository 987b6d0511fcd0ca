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

use tokio::process::{Child, Command};
use tokio::time::Instant;
use txinbox::sqlx::{self, Connection};

mod chaos;
mod pg;
mod prometheus;
mod proxy;
mod sqs;

// Each test binary uses some of these.
#[allow(unused_imports)]
pub use {chaos::*, pg::*, prometheus::*, proxy::*, sqs::*};

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
