//! One binary for either broker (`crm-worker`, the CRM agent on a `BoxReceiver`): the settings file names the
//! broker, and a file that names both, or neither, is refused at start with one line. On the Service Bus
//! emulator (in this process) it applies each follow-up once and stops cleanly on SIGTERM; on SQS (moto,
//! `TXINBOX_SQS_ENDPOINT`) it does the same through the same worker.

mod common_procs;

use std::path::Path;
use std::time::Duration;

use common_procs::*;
use txinbox_sb_emulator::Emulator;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn settings(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write the settings file");
    p.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settings_file_naming_both_brokers_or_neither_is_refused_with_one_line() {
    let _one = ONE_AT_A_TIME.lock().await;
    let work = WorkDir::new("txinbox-crm-worker-refused");
    let dir = work.path();
    for (name, text, says) in [
        (
            "both.toml",
            "[sqs]\nqueue_url = \"http://127.0.0.1:1/000000000000/q.fifo\"\n[servicebus]\nqueue = \"q\"\n",
            "both [sqs] queue_url and [servicebus] queue are set",
        ),
        ("neither.toml", "[worker]\nconsumer = \"crm\"\n", "no queue"),
    ] {
        let file = settings(dir, name, text);
        let mut p = Proc::spawn(dir, name, "crm-worker", &["--config", &file], &[]);
        let status = p.wait(Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(2), "{name}: {}", p.tail());
        let err: Vec<String> = p
            .output()
            .lines()
            .filter(|l| l.starts_with("crm-worker:"))
            .map(str::to_owned)
            .collect();
        assert_eq!(err.len(), 1, "{name}: one line: {}", p.tail());
        assert!(err[0].contains(says), "{name}: {}", err[0]);
    }
}

/// Publishes two follow-ups, one of them twice under another id (a business duplicate), runs `crm-worker` with
/// `config` until it has applied both, stops it with SIGTERM and checks its report.
async fn two_follow_ups(dir: &Path, name: &str, config: &str, db: &Path, env: &[(&str, String)]) {
    let mut w = Proc::spawn(
        dir,
        name,
        "crm-worker",
        &["--config", config],
        &with_log(env),
    );
    let deadline = Deadline::after(Duration::from_secs(60));
    loop {
        let tasks = sqlite_pair(
            db,
            "SELECT count(*), count(DISTINCT opportunity) FROM crm_followup_tasks",
        )
        .await;
        if tasks == (2, 2) && w.output().contains("business duplicate") {
            break;
        }
        w.assert_running();
        assert!(
            !deadline.passed(),
            "{name}: not applied after 60 s:\n{}",
            w.tail()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    w.stop_cleanly().await;
    let report = report_line(&w.stdout());
    assert_eq!(report_count(&report, "applied"), 2, "{name}: {report}");
    assert_eq!(
        report_count(&report, "business_duplicate"),
        1,
        "{name}: {report}"
    );
}

fn with_log(env: &[(&str, String)]) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> =
        env.iter().map(|(k, v)| (leak(k), v.clone())).collect();
    out.push(("RUST_LOG", "info".into()));
    out
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_binary_runs_on_service_bus_or_sqs_as_its_settings_say() {
    let _one = ONE_AT_A_TIME.lock().await;
    let work = WorkDir::new("txinbox-crm-worker");
    let dir = work.path();

    // Service Bus, on the emulator in this process.
    let key = random_key();
    let emulator = Emulator::builder()
        .namespace("txinbox-crm-worker")
        .sas_key("RootManageSharedAccessKey", &key)
        .start("127.0.0.1:0")
        .await
        .expect("the Service Bus emulator starts");
    let sb_env = vec![
        (
            "SERVICEBUS_CONNECTION_STRING",
            format!(
                "Endpoint=sb://txinbox-crm-worker.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={key}"
            ),
        ),
        ("SERVICEBUS_ENDPOINT", emulator.base_url()),
    ];
    let q = unique("crm-worker");
    for args in [
        vec![
            "--queue",
            q.as_str(),
            "--create-on-emulator",
            "--opportunity",
            "op_1",
            "--meeting",
            "m_1",
        ],
        vec![
            "--queue",
            q.as_str(),
            "--opportunity",
            "op_2",
            "--meeting",
            "m_2",
        ],
        vec![
            "--queue",
            q.as_str(),
            "--opportunity",
            "op_2",
            "--meeting",
            "m_2",
            "--id",
            "evt-again",
        ],
    ] {
        run(dir, "sb-producer", "servicebus-producer", &args, &sb_env).await;
    }
    let store = work.sqlite_url("sb.db");
    let config = settings(
        dir,
        "servicebus.toml",
        &format!("[store]\nurl = \"{store}\"\n[servicebus]\nqueue = \"{q}\"\ndead_letter_to = \"{q}-poison\"\n"),
    );
    two_follow_ups(
        dir,
        "crm-worker-servicebus",
        &config,
        &dir.join("sb.db"),
        &sb_env,
    )
    .await;
    emulator.shutdown().await;

    // SQS, on moto.
    let endpoint = sqs_endpoint();
    let sqs_env = sqs_env(&endpoint);
    let q = unique("crm-worker");
    for args in [
        vec![
            "--queue-name",
            q.as_str(),
            "--create",
            "--opportunity",
            "op_1",
            "--meeting",
            "m_1",
        ],
        vec![
            "--queue-name",
            q.as_str(),
            "--opportunity",
            "op_2",
            "--meeting",
            "m_2",
        ],
        vec![
            "--queue-name",
            q.as_str(),
            "--opportunity",
            "op_2",
            "--meeting",
            "m_2",
            "--id",
            "evt-again",
        ],
    ] {
        run(dir, "sqs-producer", "sqs-producer", &args, &sqs_env).await;
    }
    let url = sqs_queue_url(&sqs_client(&endpoint), &format!("{q}.fifo")).await;
    let store = work.sqlite_url("sqs.db");
    let config = settings(
        dir,
        "sqs.toml",
        &format!(
            "[store]\nurl = \"{store}\"\n[sqs]\nqueue_url = \"{url}\"\nwait_time_seconds = 1\n"
        ),
    );
    two_follow_ups(
        dir,
        "crm-worker-sqs",
        &config,
        &dir.join("sqs.db"),
        &sqs_env,
    )
    .await;
}
