//! Readiness and liveness of the example workers, as an orchestrator sees them: each worker runs as a real
//! process from a settings file with `[worker] health_addr`, on PostgreSQL (a database of its own) and its
//! broker, and both are taken away under it and given back. For each broker:
//!
//! ```text
//! ready (200, "ok database") -> PostgreSQL gone: /readyz 503 "fail database", /livez still 200
//!                            -> PostgreSQL back: 200
//!                            -> broker gone: 503 "fail queue", /livez still 200
//!                            -> broker back: 200
//!                            -> SIGTERM: the worker exits 0
//! ```
//!
//! PostgreSQL (`txinbox_e2e::pg_url()`) and moto (`TXINBOX_SQS_ENDPOINT`) are shared outside services, so the
//! worker reaches each through a TCP proxy in this process: taking the service away closes the proxy's port and
//! every connection through it, which is what a client sees of a stopped server, without stopping a service
//! other tests use. The Service Bus emulator runs in this process: it is really stopped (its port closed, its
//! connections dropped, its state lost) and started again on the same port, its queue created again as a
//! redeploy would.

mod common_procs;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common_procs::*;
use txinbox_sb_emulator::{Emulator, EmulatorHandle};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Polls `http://{addr}/{path}` (at most 60 s) until it answers `code` with a body holding `text`.
async fn expect(worker: &mut Proc, addr: SocketAddr, path: &str, code: u16, text: &str) {
    let client = http();
    let deadline = Deadline::after(Duration::from_secs(60));
    let url = format!("http://{addr}/{path}");
    loop {
        let got = get(&client, &url).await;
        if let Some((c, body)) = &got {
            if *c == code && body.contains(text) {
                return;
            }
        }
        worker.assert_running();
        assert!(
            !deadline.passed(),
            "{url}: expected {code} with {text:?}, last answer {got:?}\n{}",
            worker.tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Ready, then PostgreSQL taken away (not ready, still live) and given back (ready).
async fn database_goes_and_comes_back(worker: &mut Proc, health: SocketAddr, pg: &mut Proxy) {
    expect(worker, health, "readyz", 200, "ok database").await;
    expect(worker, health, "livez", 200, "").await;
    println!("readiness: {} ready", worker.name);
    pg.cut().await;
    expect(worker, health, "readyz", 503, "fail database").await;
    expect(worker, health, "livez", 200, "").await;
    println!(
        "readiness: {}: PostgreSQL gone -> not ready, live",
        worker.name
    );
    pg.restore().await;
    expect(worker, health, "readyz", 200, "").await;
    println!("readiness: {}: PostgreSQL back -> ready", worker.name);
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_worker_readiness_follows_postgres_and_sqs() {
    let _one = ONE_AT_A_TIME.lock().await;
    let work = WorkDir::new("txinbox-readiness-sqs");
    let dir = work.path();
    let endpoint = sqs_endpoint();
    let moto = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut sqs = Proxy::start(&moto).await;
    let through_proxy = format!("http://{}", sqs.addr());
    let env = sqs_env(&through_proxy);
    let q = unique("crm-ready");
    run(
        dir,
        "producer",
        "sqs-producer",
        &["--queue-name", &q, "--create", "--times", "1"],
        &env,
    )
    .await;
    // The queue's URL as moto names it, with the proxy's address in front.
    let url = sqs_queue_url(&sqs_client(&endpoint), &format!("{q}.fifo")).await;
    let path = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(_, path)| path.to_owned())
        .expect("a queue URL with a path");
    let queue_url = format!("{through_proxy}/{path}");

    let database = PgDatabase::create("readiness").await;
    let mut pg = Proxy::start(&pg_host_port(&txinbox_e2e::pg_url())).await;
    let health = free_addr();
    let config = work.join("sqs.toml");
    write(
        &config,
        &format!(
            "[worker]\nconsumer = \"crm-ready\"\nhealth_addr = \"{health}\"\n\n[sqs]\nqueue_url = \"{queue_url}\"\nwait_time_seconds = 1\n"
        ),
    );
    // The password-free URL still goes through the environment, as the settings docs advise for a real one.
    let mut worker_env = env.clone();
    worker_env.extend([
        ("TXINBOX_STORE__URL", database.url(Some(pg.addr()))),
        ("TXINBOX_STORE__MAX_CONNECTIONS", "4".into()),
        ("RUST_LOG", "info".into()),
    ]);
    let config = config.display().to_string();
    let mut worker = Proc::spawn(
        dir,
        "sqs",
        "sqs-crm-worker",
        &["--config", &config],
        &worker_env,
    );

    database_goes_and_comes_back(&mut worker, health, &mut pg).await;
    sqs.cut().await;
    expect(&mut worker, health, "readyz", 503, "fail queue").await;
    expect(&mut worker, health, "livez", 200, "").await;
    println!("readiness: sqs: SQS gone -> not ready, live");
    sqs.restore().await;
    expect(&mut worker, health, "readyz", 200, "").await;
    println!("readiness: sqs: SQS back -> ready");
    worker.stop_cleanly().await;
    database.drop_now().await;
    println!("readiness: sqs ok");
}

/// Starts the emulator on `addr` and creates the worker's queue (and its poison queue) through the example
/// producer, which also publishes one event.
async fn start_service_bus(
    dir: &Path,
    addr: &str,
    key: &str,
    env: &[(&str, String)],
    round: u32,
) -> EmulatorHandle {
    let emulator = Emulator::builder()
        .namespace("ready")
        .sas_key("RootManageSharedAccessKey", key)
        .start(addr)
        .await
        .unwrap_or_else(|e| panic!("the Service Bus emulator does not start on {addr}: {e}"));
    run(
        dir,
        &format!("producer-{round}"),
        "servicebus-producer",
        &["--queue", "crm-ready", "--create-on-emulator"],
        env,
    )
    .await;
    emulator
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servicebus_worker_readiness_follows_postgres_and_service_bus() {
    let _one = ONE_AT_A_TIME.lock().await;
    let work = WorkDir::new("txinbox-readiness-sb");
    let dir = work.path();
    let key = random_key();
    let sb_addr = free_addr().to_string();
    let env = vec![
        (
            "SERVICEBUS_CONNECTION_STRING",
            format!(
                "Endpoint=sb://ready.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={key}"
            ),
        ),
        ("SERVICEBUS_ENDPOINT", format!("http://{sb_addr}")),
    ];
    let emulator = start_service_bus(dir, &sb_addr, &key, &env, 1).await;

    let database = PgDatabase::create("readiness").await;
    let mut pg = Proxy::start(&pg_host_port(&txinbox_e2e::pg_url())).await;
    let health = free_addr();
    let config = work.join("sb.toml");
    write(
        &config,
        &format!(
            "[worker]\nconsumer = \"crm-ready\"\nhealth_addr = \"{health}\"\n\n[servicebus]\nqueue = \"crm-ready\"\ndead_letter_to = \"crm-ready-poison\"\n"
        ),
    );
    let mut worker_env = env.clone();
    worker_env.extend([
        ("TXINBOX_STORE__URL", database.url(Some(pg.addr()))),
        ("TXINBOX_STORE__MAX_CONNECTIONS", "4".into()),
        ("RUST_LOG", "info".into()),
    ]);
    let config = config.display().to_string();
    let mut worker = Proc::spawn(
        dir,
        "servicebus",
        "servicebus-crm-worker",
        &["--config", &config],
        &worker_env,
    );

    database_goes_and_comes_back(&mut worker, health, &mut pg).await;
    emulator.shutdown().await;
    expect(&mut worker, health, "readyz", 503, "fail queue").await;
    expect(&mut worker, health, "livez", 200, "").await;
    println!("readiness: servicebus: Service Bus gone -> not ready, live");
    let emulator = start_service_bus(dir, &sb_addr, &key, &env, 2).await;
    expect(&mut worker, health, "readyz", 200, "").await;
    println!("readiness: servicebus: Service Bus back -> ready");
    worker.stop_cleanly().await;
    emulator.shutdown().await;
    database.drop_now().await;
    println!("readiness: servicebus ok");
}
