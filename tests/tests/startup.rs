//! The example workers started in a hostile environment, as real processes (the binaries `cargo build` puts
//! under `target/debug`) against moto, the Service Bus emulator and PostgreSQL: a wrong key, a missing queue
//! or an unreachable database makes each exit non-zero by itself (it does not retry for ever) with one line on
//! stderr naming what is wrong and no secret; a queue deleted under a running worker makes it give up after
//! `--give-up-after-secs` and exit non-zero the same way. How long a worker takes to get there is not asserted
//! (a timing is a benchmark): a hang guard kills it after 120 s.
//!
//! Needs `TXINBOX_SQS_ENDPOINT` (`eval "$(bash scripts/moto.sh start)"`), as the test command sets it; the
//! Service Bus emulator runs in this test process.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use txinbox_sb_emulator::Emulator;

/// A database nobody listens on, with a password that must never be printed.
const UNREACHABLE_DB: &str = "postgres://crm:n0t-a-real-pw@127.0.0.1:1/crm";
const DB_PASSWORD: &str = "n0t-a-real-pw";

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start moto (`eval \"$(bash scripts/moto.sh start)\"`) as scripts/test.sh does")
    })
}

/// The namespace the emulator signs for, and its SAS rule.
const SB_NAMESPACE: &str = "txinbox-startup";
const SB_KEY_NAME: &str = "RootManageSharedAccessKey";

/// The Service Bus emulator every test of this binary shares: its URL and its SAS key (made for this run).
struct ServiceBus {
    url: String,
    key: String,
}

/// Started by the first test that asks, on a thread and a runtime of its own that live as long as the test
/// binary (the tests here are plain `#[test]`s, with no runtime to run a server on).
fn service_bus() -> &'static ServiceBus {
    static SERVICE_BUS: OnceLock<ServiceBus> = OnceLock::new();
    SERVICE_BUS.get_or_init(|| {
        let key = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let sas_key = key.clone();
        let (ready, started) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("sb-emulator".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("sb-emulator")
                    .enable_all()
                    .build()
                    .expect("the emulator's runtime");
                runtime.block_on(async move {
                    let started = Emulator::builder()
                        .namespace(SB_NAMESPACE)
                        .sas_key(SB_KEY_NAME, sas_key)
                        .start("127.0.0.1:0")
                        .await;
                    match started {
                        Ok(emulator) => {
                            let _ = ready.send(Ok(emulator.base_url()));
                            // The handle stops the server when dropped: keep it for the life of the binary.
                            std::future::pending::<()>().await;
                            drop(emulator);
                        }
                        Err(e) => {
                            let _ = ready.send(Err(e.to_string()));
                        }
                    }
                });
            })
            .expect("the emulator's thread");
        let url = started
            .recv()
            .expect("the emulator's thread ended before it started")
            .unwrap_or_else(|e| panic!("the Service Bus emulator does not start: {e}"));
        ServiceBus { url, key }
    })
}

/// `target/debug/<name>`: next to this test's own directory (`target/debug/deps`).
fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/debug");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build the examples first (`cargo build --workspace`)",
        bin.display()
    );
    bin
}

struct Exit {
    code: Option<i32>,
    stderr: String,
    took: Duration,
}

/// How long a worker may run before the test kills it: a guard against a hang, far above what a debug build
/// takes to start and give up on a loaded machine (the unreachable database: the pool's 10 s acquire timeout).
const HANG_GUARD: Duration = Duration::from_secs(120);

/// Runs `bin` with `args` and `envs`, killing it after [`HANG_GUARD`].
fn run(bin: &str, args: &[&str], envs: &[(&str, String)]) -> Exit {
    let started = Instant::now();
    let mut cmd = Command::new(binary(bin));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env("RUST_LOG", "warn");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn");
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if started.elapsed() > HANG_GUARD {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    Exit {
        code,
        stderr,
        took: started.elapsed(),
    }
}

/// Exited non-zero by itself (not killed by the hang guard); stderr's one line from the worker names `what`;
/// no secret anywhere in it.
fn assert_refused(bin: &str, e: &Exit, what: &[&str], secrets: &[&str]) {
    assert!(
        e.code.is_some_and(|c| c != 0),
        "{bin} exit {:?} after {:?}: {}",
        e.code,
        e.took,
        e.stderr
    );
    let prefix = format!("{bin}: ");
    let lines: Vec<&str> = e
        .stderr
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .collect();
    assert_eq!(lines.len(), 1, "one line from {bin}: {}", e.stderr);
    for w in what {
        assert!(lines[0].contains(w), "{:?} not in {:?}", w, lines[0]);
    }
    for s in secrets {
        assert!(!e.stderr.contains(s), "a secret in {bin}'s stderr");
    }
}

fn sqs_env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL_SQS", var("TXINBOX_SQS_ENDPOINT")),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

fn sb_env(key: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "SERVICEBUS_CONNECTION_STRING",
            format!(
                "Endpoint=sb://{SB_NAMESPACE}.servicebus.windows.net/;SharedAccessKeyName={SB_KEY_NAME};SharedAccessKey={key}"
            ),
        ),
        ("SERVICEBUS_ENDPOINT", service_bus().url.clone()),
    ]
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

fn sqlite(name: &str) -> String {
    let dir = std::env::temp_dir().join(unique("txinbox-startup"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    format!("sqlite:{}", dir.join(name).display())
}

/// A FIFO queue with its DLQ and redrive policy, made by the example producer (which sends one event).
fn sqs_queue() -> String {
    let name = unique("startup");
    let out = Command::new(binary("sqs-producer"))
        .args(["--queue-name", &name, "--create"])
        .envs(sqs_env())
        .output()
        .expect("sqs-producer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("{}/123456789012/{name}.fifo", var("TXINBOX_SQS_ENDPOINT"))
}

/// A queue on the emulator, made by the example producer (which sends one event).
fn sb_queue() -> String {
    let name = unique("startup");
    let out = Command::new(binary("servicebus-producer"))
        .args(["--queue", &name, "--create-on-emulator"])
        .envs(sb_env(&service_bus().key))
        .output()
        .expect("servicebus-producer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    name
}

#[test]
fn sqs_worker_with_a_missing_queue_exits_with_one_line() {
    let gone = format!(
        "{}/123456789012/{}.fifo",
        var("TXINBOX_SQS_ENDPOINT"),
        unique("gone")
    );
    let e = run(
        "sqs-crm-worker",
        &["--queue-url", &gone, "--store", &sqlite("w.db")],
        &sqs_env(),
    );
    assert_refused(
        "sqs-crm-worker",
        &e,
        &["cannot use queue", &gone, "not found"],
        &[],
    );
}

#[test]
fn sqs_worker_with_an_unreachable_database_exits_with_one_line() {
    let q = sqs_queue();
    let e = run(
        "sqs-crm-worker",
        &["--queue-url", &q, "--store", UNREACHABLE_DB],
        &sqs_env(),
    );
    assert_refused("sqs-crm-worker", &e, &["database"], &[DB_PASSWORD]);
}

#[test]
fn servicebus_worker_with_a_wrong_key_exits_with_one_line() {
    let q = sb_queue();
    let wrong = "d3Jvbmcta2V5LWZvci10aGUtc3RhcnR1cC10ZXN0";
    let e = run(
        "servicebus-crm-worker",
        &["--queue", &q, "--store", &sqlite("w.db")],
        &sb_env(wrong),
    );
    assert_refused(
        "servicebus-crm-worker",
        &e,
        &["unauthorized", &q, "401"],
        &[wrong, &service_bus().key],
    );
}

#[test]
fn servicebus_worker_with_a_missing_queue_exits_with_one_line() {
    let gone = unique("gone");
    let key = service_bus().key.clone();
    let e = run(
        "servicebus-crm-worker",
        &["--queue", &gone, "--store", &sqlite("w.db")],
        &sb_env(&key),
    );
    assert_refused("servicebus-crm-worker", &e, &["not found", &gone], &[&key]);
}

#[test]
fn servicebus_worker_with_an_unreachable_database_exits_with_one_line() {
    let q = sb_queue();
    let key = service_bus().key.clone();
    let e = run(
        "servicebus-crm-worker",
        &["--queue", &q, "--store", UNREACHABLE_DB],
        &sb_env(&key),
    );
    assert_refused(
        "servicebus-crm-worker",
        &e,
        &["database"],
        &[DB_PASSWORD, &key],
    );
}

/// Deletes a queue through the emulator's control API (plain HTTP/1.1).
fn delete_sb_queue(name: &str) {
    let url = &service_bus().url;
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(host).expect("emulator");
    write!(
        s,
        "DELETE /$emulator/queues/{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 2"), "delete queue: {answer}");
}

/// `GET /readyz` on `addr` answers 200 (plain HTTP/1.1); `false` while nothing listens there or it answers
/// something else.
fn ready(addr: &str) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if write!(
        s,
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

#[test]
fn servicebus_worker_gives_up_when_its_queue_disappears_later() {
    let q = sb_queue();
    let key = service_bus().key.clone();
    let db = sqlite("w.db");
    let health = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .to_string();
    let mut cmd = Command::new(binary("servicebus-crm-worker"));
    cmd.args(["--queue", &q, "--store", &db, "--give-up-after-secs", "3"])
        .args(["--health-addr", &health])
        .envs(sb_env(&key))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    // Running: ready, i.e. its start-up checks passed and a receive succeeded. Waited for, not slept on: a debug
    // build on a loaded machine may still be starting after a few seconds, and a queue deleted then makes it
    // fail its start (exit 2), not give up (exit 3).
    let ready_by = Instant::now() + Duration::from_secs(60);
    while !ready(&health) {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("the worker exited ({status}) before it was ready");
        }
        if Instant::now() > ready_by {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the worker was not ready after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Counted from before the delete: the worker's failures begin once the queue is gone, which may be well
    // before the emulator's answer to the delete reaches this test on a loaded machine.
    let started = Instant::now();
    delete_sb_queue(&q);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > HANG_GUARD {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the worker never gave up ({HANG_GUARD:?})");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(3),
        "gave up after {took:?}, before --give-up-after-secs"
    );
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("stdout");
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    let e = Exit {
        code: status.code(),
        stderr,
        took,
    };
    assert_eq!(
        e.code,
        Some(3),
        "a worker that gave up exits 3 (2 is for one that could not start)"
    );
    assert_refused(
        "servicebus-crm-worker",
        &e,
        &["gave up", "entity_not_found", &q],
        &[&key],
    );
    // Receives failed several times in those 3 s (backing off), and were logged once: one line per state
    // change, not one per retry.
    assert!(stdout.contains("receive_errors="), "the report: {stdout}");
    let failing = stdout
        .lines()
        .filter(|l| l.contains("receives failing"))
        .count();
    assert_eq!(failing, 1, "{stdout}");
    let errors: u64 = stdout
        .split("receive_errors=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("receive_errors in the report");
    assert!(errors >= 2, "{stdout}");
}
