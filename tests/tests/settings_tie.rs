//! One configuration: a worker started from a settings file runs with exactly the values `txinbox check-infra`
//! validated from that file. Both real binaries read the same file with the same environment:
//!
//! * `txinbox check-infra --config worker.toml infra/...` passes on the sample;
//! * `sqs-crm-worker` / `servicebus-crm-worker --config worker.toml --print-config` print the values read back
//!   from the options they would run with (visibility or lock duration, the renewal cadence, the retention, the
//!   dead-letter target), which are the file's;
//! * one environment override (`TXINBOX_<SECTION>__<KEY>`) changes both: check-infra now reports the
//!   violation that value causes, and the worker prints that value.
//!
//! The binaries come from `cargo build --workspace` (the test command builds them first).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn binary(name: &str) -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let p = dir.join("debug").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` first (scripts/test.sh does)",
        p.display()
    );
    p
}

/// Runs `bin args` with `env` (and without any other `TXINBOX_*` setting override); exit code and stdout.
fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(binary(bin));
    c.args(args).current_dir(root());
    for (k, _) in std::env::vars() {
        if k.starts_with("TXINBOX_") && k.contains("__") {
            c.env_remove(k);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run the binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// `key=value` lines.
/// `bin [--config file] --print-config` with `env`, which must succeed; the values it printed.
fn print_config(bin: &str, file: Option<&str>, env: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut args = file.map_or_else(Vec::new, |f| vec!["--config", f]);
    args.push("--print-config");
    let (code, out) = run(bin, &args, env);
    assert_eq!(code, 0, "{bin}: {out}");
    values(&out)
}

fn values(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn settings_file(text: &str) -> (tempdir::Dir, String) {
    let dir = tempdir::Dir::new();
    let path = dir.0.join("worker.toml");
    std::fs::write(&path, text).unwrap();
    let p = path.display().to_string();
    (dir, p)
}

mod tempdir {
    /// A temporary folder removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let p = std::env::temp_dir().join(format!("txinbox-tie-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn the_sqs_worker_runs_with_what_check_infra_validated() {
    let (_dir, file) = settings_file(
        "[inbox]\nretention_seconds = 3456000\n\n[sqs]\nqueue_url = \"http://127.0.0.1:9/123456789012/txinbox-orders.fifo\"\ndead_letter_queue_url = \"http://127.0.0.1:9/123456789012/txinbox-orders-dlq.fifo\"\nvisibility_timeout_seconds = 60\n",
    );
    let (code, out) = run(
        "txinbox",
        &["check-infra", "--config", &file, "infra/aws-sqs-fifo"],
        &[],
    );
    assert_eq!(code, 0, "check-infra passes on the sample: {out}");
    let v = print_config("sqs-crm-worker", Some(&file), &[]);
    assert_eq!(v["visibility_timeout_seconds"], "60");
    assert_eq!(
        v["renew_every_seconds"], "20",
        "the cadence check-infra assumed"
    );
    assert_eq!(v["retention_seconds"], "3456000");
    assert_eq!(
        v["dead_letter_queue_url"],
        "http://127.0.0.1:9/123456789012/txinbox-orders-dlq.fifo"
    );

    // One override, seen by both: a visibility timeout of 150 s is renewed every 50 s, and the sample's 60 s
    // queue visibility is then too short; a retention of one day no longer covers the redelivery path.
    let env = [
        ("TXINBOX_SQS__VISIBILITY_TIMEOUT_SECONDS", "150"),
        ("TXINBOX_INBOX__RETENTION_SECONDS", "86400"),
    ];
    let (code, out) = run(
        "txinbox",
        &["check-infra", "--config", &file, "infra/aws-sqs-fifo"],
        &env,
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("sqs-visibility-timeout-too-short"), "{out}");
    assert!(out.contains("86400"), "{out}");
    let v = print_config("sqs-crm-worker", Some(&file), &env);
    assert_eq!(v["visibility_timeout_seconds"], "150");
    assert_eq!(v["renew_every_seconds"], "50");
    assert_eq!(v["retention_seconds"], "86400");
}

/// The delivery pipeline's keys (`[worker] receive_max`, `prefetch`, `batch_commit`, `batch_linger_ms`, `receive_loops`) reach the worker, from the
/// file and from an override; without them the worker runs the library's defaults.
#[test]
fn the_worker_runs_the_pipeline_the_settings_say() {
    let (_dir, file) = settings_file(
        "[worker]\nconcurrency = 32\nreceive_max = 20\nprefetch = 32\nreceive_loops = 2\n\n[sqs]\nqueue_url = \"http://127.0.0.1:9/123456789012/txinbox-orders.fifo\"\ndead_letter_queue_url = \"http://127.0.0.1:9/123456789012/txinbox-orders-dlq.fifo\"\n",
    );
    let env = [
        ("TXINBOX_WORKER__BATCH_COMMIT", "10"),
        ("TXINBOX_WORKER__BATCH_LINGER_MS", "25"),
    ];
    let v = print_config("sqs-crm-worker", Some(&file), &env);
    assert_eq!(
        (
            &*v["concurrency"],
            &*v["receive_max"],
            &*v["prefetch"],
            &*v["batch_commit"],
            &*v["batch_linger_ms"],
            &*v["receive_loops"]
        ),
        ("32", "20", "32", "10", "25", "2")
    );
    let v = print_config("servicebus-crm-worker", None, &[]);
    assert_eq!(
        (
            &*v["prefetch"],
            &*v["batch_commit"],
            &*v["batch_linger_ms"],
            &*v["receive_loops"]
        ),
        ("0", "1", "0", "1")
    );
}

#[test]
fn the_service_bus_worker_runs_with_what_check_infra_validated() {
    let (_dir, file) = settings_file(
        "[inbox]\nretention_seconds = 3456000\n\n[servicebus]\nqueue = \"txinbox-orders\"\ndead_letter_to = \"txinbox-orders-poison\"\nlock_duration_seconds = 60\n",
    );
    let (code, out) = run(
        "txinbox",
        &["check-infra", "--config", &file, "infra/azure-servicebus"],
        &[],
    );
    assert_eq!(code, 0, "check-infra passes on the sample: {out}");
    let v = print_config("servicebus-crm-worker", Some(&file), &[]);
    assert_eq!(v["queue"], "txinbox-orders");
    assert_eq!(v["lock_duration_seconds"], "60");
    assert_eq!(v["renew_every_seconds"], "20");
    assert_eq!(v["retention_seconds"], "3456000");
    assert_eq!(v["dead_letter_to"], "txinbox-orders-poison");

    // A dead-letter target the Terraform does not declare, and a lock renewed every 50 s: both see it.
    let env = [
        ("TXINBOX_SERVICEBUS__DEAD_LETTER_TO", "orders-elsewhere"),
        ("TXINBOX_SERVICEBUS__LOCK_DURATION_SECONDS", "150"),
    ];
    let (code, out) = run(
        "txinbox",
        &["check-infra", "--config", &file, "infra/azure-servicebus"],
        &env,
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("orders-elsewhere"), "{out}");
    assert!(out.contains("servicebus-lock-duration-too-short"), "{out}");
    let v = print_config("servicebus-crm-worker", Some(&file), &env);
    assert_eq!(v["dead_letter_to"], "orders-elsewhere");
    assert_eq!(v["lock_duration_seconds"], "150");
    assert_eq!(v["renew_every_seconds"], "50");
}

#[test]
fn a_bad_settings_file_stops_both_with_the_key_named() {
    let (_dir, file) = settings_file("[sqs]\nvisibilty_timeout_seconds = 60\n");
    let (code, out) = run(
        "txinbox",
        &["check-infra", "--config", &file, "infra/aws-sqs-fifo"],
        &[],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("visibilty_timeout_seconds"), "{out}");
    let (code, out) = run(
        "sqs-crm-worker",
        &["--config", &file, "--print-config"],
        &[],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("visibilty_timeout_seconds"), "{out}");
    assert_eq!(out.trim().lines().count(), 1, "one line: {out}");
}
