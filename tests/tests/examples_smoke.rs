//! The example producers and workers as real processes (the binaries of `target/debug`), stopped with SIGTERM
//! the way an orchestrator stops them, each checked by the report it prints on its way out:
//!
//! * SQS FIFO (moto, `TXINBOX_SQS_ENDPOINT`): the resend is dropped by the FIFO deduplication window, the same
//!   follow-up under another event id is a business duplicate, one is applied; the original event, put in the
//!   DLQ, is moved back by `txinbox sqs redrive` with its identity and recognised as already applied;
//! * SIGTERM in the middle of a batch (SQLite): nothing lost, nothing applied twice, between two workers;
//! * the worker hosted in a web service (`hosted-service`, PostgreSQL): SIGTERM drains the worker, then closes
//!   the server, then the pool; two runs apply every event once;
//! * a real Prometheus scrapes the SQS worker: every query of `ops/dashboard.json` has data, the series this run
//!   produces are real ones, and no alert of `ops/alerts.yml` fires on the healthy worker;
//! * Service Bus (our emulator, started in this process): duplicate detection drops the resend, the other id is
//!   a business duplicate; an event in the poison queue, resubmitted by `txinbox servicebus redrive` with its
//!   MessageId, is refused as a repeated follow-up.
//!
//! The tests run one at a time (each starts several processes; the machine may have two cores).

mod common_procs;

use std::path::Path;
use std::time::Duration;

use common_procs::*;
use txinbox::sqlx::{self, Connection};
use txinbox_crm_api::CrmApi;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts a worker, waits (at most 60 s) until its log shows `wait_for` (the last outcome expected, in FIFO
/// order), stops it with SIGTERM and checks that it exited 0, logged its clean stop, and that its report holds
/// every `outcome=n` of `expected`. Returns the report.
async fn run_worker(
    dir: &Path,
    name: &str,
    bin: &str,
    args: &[&str],
    envs: &[(&str, String)],
    wait_for: &str,
    expected: &[(&str, u64)],
) -> String {
    let mut w = Proc::spawn(dir, name, bin, args, envs);
    let deadline = Deadline::after(Duration::from_secs(60));
    while !w.output().contains(wait_for) {
        w.assert_running();
        assert!(
            !deadline.passed(),
            "{name}: no {wait_for:?} in its log after 60 s:\n{}",
            w.tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    w.stop_cleanly().await;
    let report = report_line(&w.stdout());
    assert!(!report.is_empty(), "{name}: no WorkerReport:\n{}", w.tail());
    for (outcome, n) in expected {
        assert_eq!(
            report_count(&report, outcome),
            *n,
            "{name}: expected {outcome}={n} in: {report}"
        );
    }
    assert!(
        w.output().contains("worker stopped"),
        "{name}: no clean stop after SIGTERM:\n{}",
        w.tail()
    );
    println!("examples-smoke: {name} ok: {report}");
    report
}

fn with(
    envs: &[(&'static str, String)],
    more: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let mut all = envs.to_vec();
    all.extend(more.iter().map(|(k, v)| (*k, (*v).to_owned())));
    all
}

/// Publishes the 24 events `op_i`/`m_i` to a new FIFO queue `q` (and its DLQ) through the example producer.
async fn publish_24(dir: &Path, q: &str, env: &[(&str, String)]) {
    for i in 0..24 {
        let (op, m) = (format!("op_{i}"), format!("m_{i}"));
        let mut args = vec!["--queue-name", q, "--opportunity", &op, "--meeting", &m];
        if i == 0 {
            args.push("--create");
        }
        run(
            dir,
            &format!("producer-{q}-{i}"),
            "sqs-producer",
            &args,
            env,
        )
        .await;
    }
}

/// Tasks of the CRM follow-up table in a worker's SQLite file, and distinct messages among them.
async fn sqlite_tasks(db: &Path) -> (i64, i64) {
    sqlite_pair(
        db,
        "SELECT count(*), count(DISTINCT message_id) FROM crm_followup_tasks",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_examples_resend_business_duplicate_and_redrive_keep_one_follow_up() {
    let _one = ONE_AT_A_TIME.lock().await;
    let endpoint = sqs_endpoint();
    let env = sqs_env(&endpoint);
    let work = WorkDir::new("txinbox-smoke-sqs");
    let dir = work.path();
    let q = unique("crm-smoke");
    run(
        dir,
        "producer-twice",
        "sqs-producer",
        &["--queue-name", &q, "--create", "--times", "2"],
        &env,
    )
    .await;
    let other = format!("evt-other-{q}");
    run(
        dir,
        "producer-other",
        "sqs-producer",
        &["--queue-name", &q, "--id", &other],
        &env,
    )
    .await;
    let c = sqs_client(&endpoint);
    let queue_url = sqs_queue_url(&c, &format!("{q}.fifo")).await;
    let dlq_url = sqs_queue_url(&c, &format!("{q}-dlq.fifo")).await;
    let store = work.sqlite_url("sqs.db");
    let worker_env = with(&env, &[("RUST_LOG", "info")]);
    let worker_args = ["--queue-url", queue_url.as_str(), "--store", store.as_str()];
    run_worker(
        dir,
        "sqs",
        "sqs-crm-worker",
        &worker_args,
        &worker_env,
        "business duplicate",
        &[("applied", 1), ("business_duplicate", 1)],
    )
    .await;

    // The original event lands in the DLQ; `txinbox sqs redrive` moves it back with its identity.
    let dlq_name = format!("{q}-dlq");
    run(
        dir,
        "producer-dlq",
        "sqs-producer",
        &["--queue-name", &dlq_name],
        &env,
    )
    .await;
    let moved = run(
        dir,
        "sqs-redrive",
        "txinbox",
        &["sqs", "redrive", "--from", &dlq_url, "--to", &queue_url],
        &env,
    )
    .await;
    assert!(moved.starts_with("moved=1 "), "sqs redrive: {moved}");
    run_worker(
        dir,
        "sqs-after-redrive",
        "sqs-crm-worker",
        &worker_args,
        &worker_env,
        "duplicate: already applied",
        &[("duplicate", 1)],
    )
    .await;
}

/// 24 events in 24 groups (so up to 8 run at once); the worker is stopped with SIGTERM as soon as the first
/// task exists, then a second worker drains the queue (messages the first had received come back after their
/// 6 s visibility timeout). The two reports add up to 24 applied; the task table holds 24 rows for 24 messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_worker_stopped_by_sigterm_mid_batch_loses_nothing_and_doubles_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let endpoint = sqs_endpoint();
    let env = sqs_env(&endpoint);
    let work = WorkDir::new("txinbox-smoke-sigterm");
    let dir = work.path();
    let q = unique("crm-sigterm");
    publish_24(dir, &q, &env).await;
    let url = sqs_queue_url(&sqs_client(&endpoint), &format!("{q}.fifo")).await;
    let db = work.join("sigterm.db");
    let store = work.sqlite_url("sigterm.db");
    let args = [
        "--queue-url",
        url.as_str(),
        "--store",
        store.as_str(),
        "--visibility-timeout",
        "6",
    ];
    let env = with(&env, &[("RUST_LOG", "info")]);

    let mut first = Proc::spawn(dir, "sigterm1", "sqs-crm-worker", &args, &env);
    let deadline = Deadline::after(Duration::from_secs(60));
    while sqlite_tasks(&db).await.0 < 1 {
        first.assert_running();
        assert!(!deadline.passed(), "no task after 60 s:\n{}", first.tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.stop_cleanly().await;
    let applied_first = report_count(&report_line(&first.stdout()), "applied");

    let mut second = Proc::spawn(dir, "sigterm2", "sqs-crm-worker", &args, &env);
    let deadline = Deadline::after(Duration::from_secs(60));
    loop {
        let (n, _) = sqlite_tasks(&db).await;
        if n >= 24 {
            break;
        }
        second.assert_running();
        assert!(
            !deadline.passed(),
            "{n} of 24 tasks after 60 s:\n{}",
            second.tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let a (wrong) second effect show up before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    second.stop_cleanly().await;
    let applied_second = report_count(&report_line(&second.stdout()), "applied");

    assert_eq!(
        sqlite_tasks(&db).await,
        (24, 24),
        "SIGTERM mid-batch: (tasks, distinct messages)"
    );
    assert_eq!(
        applied_first + applied_second,
        24,
        "SIGTERM mid-batch: applied {applied_first} + {applied_second}"
    );
    println!(
        "examples-smoke: sqs SIGTERM mid-batch ok: first worker applied {applied_first}, second {applied_second}, 24 tasks"
    );
}

/// `(tasks, distinct messages)` the hosted service's own route `GET /tasks` shows (through the shared pool).
async fn hosted_tasks(
    client: &reqwest::Client,
    addr: std::net::SocketAddr,
) -> Option<(usize, usize)> {
    let (code, body) = get(client, &format!("http://{addr}/tasks")).await?;
    if code != 200 {
        return None;
    }
    let tasks: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
    let distinct: std::collections::BTreeSet<String> = tasks
        .iter()
        .map(|t| t["message_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    Some((tasks.len(), distinct.len()))
}

/// Runs the hosted service until `GET /tasks` shows `until` tasks, stops it with SIGTERM, checks that it
/// exited 0 and closed its server after the drain, and returns its report's `applied`.
async fn hosted_run(
    dir: &Path,
    name: &str,
    until: usize,
    config: &Path,
    env: &[(&str, String)],
) -> u64 {
    let addr = free_addr();
    let (config, listen) = (config.display().to_string(), addr.to_string());
    let mut p = Proc::spawn(
        dir,
        name,
        "hosted-service",
        &[
            "--config",
            &config,
            "--listen",
            &listen,
            "--handler-delay-ms",
            "300",
        ],
        env,
    );
    let client = http();
    let deadline = Deadline::after(Duration::from_secs(60));
    loop {
        p.assert_running();
        let n = hosted_tasks(&client, addr).await.map_or(0, |(n, _)| n);
        if n >= until {
            break;
        }
        assert!(
            !deadline.passed(),
            "{name}: only {n} tasks after 60 s:\n{}",
            p.tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    p.stop_cleanly().await;
    assert!(
        p.output().contains("server closed; closing the pool"),
        "{name}: the server did not close after the drain:\n{}",
        p.tail()
    );
    report_count(&report_line(&p.stdout()), "applied")
}

/// The worker hosted in a web service (examples/hosted-service, axum): one pool, one shutdown. 24 events; the
/// handler takes 300 ms; SIGTERM once the application's own route shows a first task, i.e. in the middle of a
/// batch. The service drains the worker (commit, then delete), closes its server after that and exits 0; a
/// second run finishes the queue. 24 tasks for 24 messages, the two reports' `applied` add up to 24, and the
/// first run did not apply them all. PostgreSQL: a database of its own, dropped afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosted_service_drains_its_worker_before_its_server_on_sigterm_mid_batch() {
    let _one = ONE_AT_A_TIME.lock().await;
    let endpoint = sqs_endpoint();
    let env = sqs_env(&endpoint);
    let work = WorkDir::new("txinbox-smoke-hosted");
    let dir = work.path();
    let database = PgDatabase::create("hosted_smoke").await;
    let pg = database.url(None);
    let q = unique("crm-hosted");
    publish_24(dir, &q, &env).await;
    let url = sqs_queue_url(&sqs_client(&endpoint), &format!("{q}.fifo")).await;
    let config = work.join("hosted.toml");
    std::fs::write(
        &config,
        format!(
            "[worker]\nconsumer = \"crm-hosted\"\nconcurrency = 4\n\n[sqs]\nqueue_url = \"{url}\"\nwait_time_seconds = 1\nvisibility_timeout_seconds = 6\n"
        ),
    )
    .expect("write hosted.toml");
    let env = with(
        &env,
        &[("TXINBOX_STORE__URL", pg.as_str()), ("RUST_LOG", "info")],
    );
    let first = hosted_run(dir, "hosted1", 1, &config, &env).await;
    let second = hosted_run(dir, "hosted2", 24, &config, &env).await;
    let mut c = sqlx::PgConnection::connect(&pg)
        .await
        .expect("the hosted service's database");
    let rows: (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT message_id) FROM crm_followup_tasks")
            .fetch_one(&mut c)
            .await
            .expect("count the tasks");
    let _ = c.close().await;
    database.drop_now().await;
    assert_eq!(rows, (24, 24), "hosted service: (tasks, distinct messages)");
    assert!(
        first < 24,
        "hosted service: the first run applied all 24 before its SIGTERM (not mid-batch)"
    );
    assert_eq!(
        first + second,
        24,
        "hosted service: applied {first} + {second}"
    );
    println!(
        "examples-smoke: hosted service SIGTERM mid-batch ok: first run applied {first}, second {second}, 24 tasks"
    );
}

/// The series the scraped run must have for the consumer (real ones, not a dashboard's `or on() vector(0)`).
const REQUIRED_SERIES: &[&str] = &[
    "txinbox_received_total",
    "txinbox_applied_total",
    "txinbox_business_duplicates_total",
    "txinbox_receive_to_commit_seconds_bucket",
    "txinbox_inbox_rows",
    "txinbox_retention_purged_total",
    "txinbox_effects",
    "txinbox_effect_oldest_pending_seconds",
    "txinbox_effect_executions_total",
    "txinbox_worker_deliveries",
];

/// `(panel title, expr)` of every target of every panel of `ops/dashboard.json` (rows' nested panels included),
/// with `$consumer` and `$__rate_interval` filled in.
fn dashboard_queries(consumer: &str) -> Vec<(String, String)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str().filter(|e| !e.is_empty()) {
                    out.push((
                        p["title"].as_str().unwrap_or("?").to_owned(),
                        expr.to_owned(),
                    ));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let text =
        std::fs::read_to_string(root().join("ops/dashboard.json")).expect("ops/dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&text).expect("ops/dashboard.json is JSON");
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out.into_iter()
        .map(|(t, e)| {
            (
                t,
                e.replace("$__rate_interval", "1m")
                    .replace("$consumer", consumer),
            )
        })
        .collect()
}

/// `None` when the query returns data whose every value is a finite number, else what is wrong.
async fn problem(prom: &Prometheus, client: &reqwest::Client, expr: &str) -> Option<String> {
    match prom.query(client, expr).await {
        Err(e) => Some(format!("error: {e}")),
        Ok(r) if r.is_empty() => Some("no data".into()),
        Ok(r) => {
            let bad: Vec<String> = r
                .iter()
                .filter(|s| {
                    !s["value"][1]
                        .as_str()
                        .and_then(|v| v.parse::<f64>().ok())
                        .is_some_and(f64::is_finite)
                })
                .map(|s| format!("{} {}", s["metric"], s["value"][1]))
                .collect();
            (!bad.is_empty()).then(|| format!("non-finite values: {bad:?}"))
        }
    }
}

/// Every dashboard query has finite data, and every required series exists for `consumer`; retried until all
/// pass or `wait` has passed (the scrapes and rate windows fill in). A quantile over a rate window with no
/// observation in it is NaN, which an idle worker shows too: while some query fails, `traffic` sends one more
/// event every 10 s, so a slow run (the test command's processes side by side) still has traffic in its
/// windows.
async fn check_dashboard<F, Fut>(prom: &Prometheus, consumer: &str, wait: Duration, mut traffic: F)
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut checks = dashboard_queries(consumer);
    assert!(checks.len() >= 2, "ops/dashboard.json has no queries");
    checks.extend(REQUIRED_SERIES.iter().map(|m| {
        (
            format!("required series {m}"),
            format!("{m}{{consumer=\"{consumer}\"}}"),
        )
    }));
    let client = http();
    let deadline = Deadline::after(wait);
    let mut sent = 0;
    let mut next_traffic = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut failures = Vec::new();
        for (title, expr) in &checks {
            if let Some(p) = problem(prom, &client, expr).await {
                failures.push(format!("panel {title:?}: {p}\n    {expr}"));
            }
        }
        if failures.is_empty() {
            println!(
                "examples-smoke: {} dashboard queries have data",
                checks.len()
            );
            return;
        }
        assert!(
            !deadline.passed(),
            "a dashboard query has no data ({sent} more events sent while checking):\n{}",
            failures.join("\n")
        );
        if tokio::time::Instant::now() >= next_traffic {
            sent += 1;
            traffic(sent).await;
            next_traffic = tokio::time::Instant::now() + Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Prometheus scrapes a real worker: the SQS worker runs with `--metrics-addr`, the inbox retention every second
/// and an external CRM (so the effect series exist); events come in two batches so every counter has a before
/// and an after. Every query of ops/dashboard.json returns data, the series this run produces are real, and no
/// alert fires on this healthy run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_worker_every_dashboard_query_has_data_and_no_alert_fires() {
    let _one = ONE_AT_A_TIME.lock().await;
    let endpoint = sqs_endpoint();
    let env = sqs_env(&endpoint);
    let work = WorkDir::new("txinbox-smoke-metrics");
    let dir = work.path();
    let crm = CrmApi::builder().start().await.expect("the CRM API starts");
    let metrics_addr = free_addr();
    let prom = Prometheus::start(dir, metrics_addr).await;
    let q = unique("crm-metrics");
    run(
        dir,
        "producer-1",
        "sqs-producer",
        &[
            "--queue-name",
            &q,
            "--create",
            "--opportunity",
            "op_metrics_1",
            "--meeting",
            "m_1",
        ],
        &env,
    )
    .await;
    let url = sqs_queue_url(&sqs_client(&endpoint), &format!("{q}.fifo")).await;
    let (store, crm_url, metrics) = (
        work.sqlite_url("metrics.db"),
        crm.url(),
        metrics_addr.to_string(),
    );
    let mut worker = Proc::spawn(
        dir,
        "metrics",
        "sqs-crm-worker",
        &[
            "--queue-url",
            &url,
            "--store",
            &store,
            "--crm-url",
            &crm_url,
            "--metrics-addr",
            &metrics,
            "--purge-interval-secs",
            "1",
        ],
        &with(&env, &[("RUST_LOG", "info")]),
    );
    // The first batch applied and scraped: the target is up and the applied counter is above zero in
    // Prometheus (the worker registers its counters at zero when it starts).
    let client = http();
    let deadline = Deadline::after(Duration::from_secs(60));
    loop {
        worker.assert_running();
        let up = prom.targets(&client).await.contains("\"health\":\"up\"");
        if up
            && prom
                .query(
                    &client,
                    "txinbox_applied_total{consumer=\"crm-followup\"} > 0",
                )
                .await
                .is_ok_and(|r| !r.is_empty())
        {
            break;
        }
        assert!(
            !deadline.passed(),
            "prometheus never scraped the worker's first batch at {metrics_addr}: {}\n{}",
            prom.targets(&client).await,
            worker.tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let base = [
        "--queue-name",
        q.as_str(),
        "--opportunity",
        "op_metrics_2",
        "--meeting",
        "m_2",
    ];
    run(
        dir,
        "producer-2",
        "sqs-producer",
        &[&base[..], &["--times", "2"]].concat(),
        &env,
    )
    .await;
    let other = format!("evt-metrics-other-{q}");
    run(
        dir,
        "producer-3",
        "sqs-producer",
        &[&base[..], &["--id", other.as_str()]].concat(),
        &env,
    )
    .await;
    let deadline = Deadline::after(Duration::from_secs(60));
    while !worker.output().contains("business duplicate") {
        worker.assert_running();
        assert!(
            !deadline.passed(),
            "the metrics worker did not see the second batch:\n{}",
            worker.tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    check_dashboard(&prom, "crm-followup", Duration::from_secs(90), |n| {
        let id = format!("evt-metrics-more-{n}-{q}");
        let opportunity = format!("op_metrics_more_{n}");
        let (env, q) = (env.clone(), q.clone());
        async move {
            run(
                dir,
                "producer-more",
                "sqs-producer",
                &[
                    "--queue-name",
                    q.as_str(),
                    "--opportunity",
                    &opportunity,
                    "--meeting",
                    "m_more",
                    "--id",
                    &id,
                ],
                &env,
            )
            .await;
        }
    })
    .await;
    let firing = prom
        .query(&client, "ALERTS{alertstate=\"firing\"}")
        .await
        .expect("query the alerts");
    assert!(
        firing.is_empty(),
        "alerts fire on a healthy worker: {firing:?}"
    );
    worker.stop_cleanly().await;
    prom.stop().await;
    crm.shutdown().await;
    println!("examples-smoke: prometheus scraped sqs-crm-worker; every dashboard query has data, no alert fires");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servicebus_examples_resend_business_duplicate_and_redrive_keep_one_follow_up() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (emulator, env) = service_bus("txinbox-smoke").await;
    let work = WorkDir::new("txinbox-smoke-servicebus");
    let dir = work.path();
    let q = unique("crm-smoke");
    let poison = format!("{q}-poison");
    run(
        dir,
        "producer-twice",
        "servicebus-producer",
        &["--queue", &q, "--create-on-emulator", "--times", "2"],
        &env,
    )
    .await;
    let other = format!("evt-other-{q}");
    run(
        dir,
        "producer-other",
        "servicebus-producer",
        &["--queue", &q, "--id", &other],
        &env,
    )
    .await;
    let store = work.sqlite_url("servicebus.db");
    let worker_args = [
        "--queue",
        q.as_str(),
        "--dead-letter-to",
        poison.as_str(),
        "--store",
        store.as_str(),
    ];
    let worker_env = with(&env, &[("RUST_LOG", "info")]);
    run_worker(
        dir,
        "servicebus",
        "servicebus-crm-worker",
        &worker_args,
        &worker_env,
        "business duplicate",
        &[("applied", 1), ("business_duplicate", 1)],
    )
    .await;

    // A third event for the same follow-up sits in the poison queue; `txinbox servicebus redrive` resubmits it
    // with its MessageId and the inbox refuses the repeated follow-up. It never reached the target queue, so
    // that queue's duplicate-detection window cannot hold it: no deferral (`--dedup-window-secs 0`).
    let poisoned = format!("evt-poisoned-{q}");
    run(
        dir,
        "producer-poison",
        "servicebus-producer",
        &["--queue", &poison, "--id", &poisoned],
        &env,
    )
    .await;
    let moved = run(
        dir,
        "servicebus-redrive",
        "txinbox",
        &[
            "servicebus",
            "redrive",
            "--queue",
            &q,
            "--from",
            &poison,
            "--wait-secs",
            "1",
            "--dedup-window-secs",
            "0",
        ],
        &env,
    )
    .await;
    assert!(moved.starts_with("moved=1 "), "servicebus redrive: {moved}");
    run_worker(
        dir,
        "servicebus-after-redrive",
        "servicebus-crm-worker",
        &worker_args,
        &worker_env,
        "business duplicate",
        &[("business_duplicate", 1)],
    )
    .await;
    emulator.shutdown().await;
}
