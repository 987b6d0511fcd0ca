//! The shipped samples pass every rule, and mirror the worker's defaults.

mod common;

use common::{aws_sample, azure_sample};
use txinbox_infra::{check_dir, run_cli, WorkerSettings};

#[test]
fn aws_sample_has_no_violation() {
    let report = check_dir(&aws_sample(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.sqs_queues, 2);
    assert_eq!(report.servicebus_queues, 0);
    assert_eq!(report.files.len(), 5);
}

#[test]
fn azure_sample_has_no_violation() {
    let report = check_dir(&azure_sample(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.servicebus_queues, 1);
    assert_eq!(report.sqs_queues, 0);
}

#[test]
fn run_cli_on_the_samples_reports_ok() {
    for dir in [aws_sample(), azure_sample()] {
        let mut out = Vec::new();
        assert!(run_cli(&dir, None, &mut out).unwrap());
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with("check-infra: ok, no violation in "),
            "{out}"
        );
        assert_eq!(out.lines().count(), 1, "{out}");
    }
}

/// `variable "NAME" { default = ... }` of a sample.
fn default_of(dir: &std::path::Path, name: &str) -> hcl::Value {
    let text = std::fs::read_to_string(dir.join("variables.tf")).unwrap();
    let body: hcl::Body = hcl::from_str(&text).unwrap();
    let block = body
        .blocks()
        .find(|b| b.identifier() == "variable" && b.labels()[0].as_str() == name)
        .unwrap_or_else(|| panic!("variable {name} is missing"));
    let default = block
        .body()
        .attributes()
        .find(|a| a.key() == "default")
        .unwrap_or_else(|| panic!("variable {name} has no default"));
    hcl::Value::from(default.expr().clone())
}

#[test]
fn aws_sample_defaults_are_the_sqs_adapter_defaults() {
    let s = WorkerSettings::default().sqs;
    let dir = aws_sample();
    let n = |name| default_of(&dir, name).as_u64().unwrap();
    assert_eq!(
        n("visibility_timeout_seconds"),
        s.visibility_timeout_seconds
    );
    assert_eq!(n("message_retention_seconds"), s.queue_retention_seconds);
    assert_eq!(n("dlq_message_retention_seconds"), s.dlq_retention_seconds);
    assert_eq!(n("receive_wait_time_seconds"), s.wait_time_seconds);
    assert_eq!(n("max_receive_count"), u64::from(s.max_receive_count));
}

#[test]
fn azure_sample_defaults_are_the_servicebus_adapter_defaults() {
    let dir = azure_sample();
    let s = |name| default_of(&dir, name).as_str().unwrap().to_owned();
    assert_eq!(s("lock_duration"), "PT1M");
    assert_eq!(s("duplicate_detection_history_time_window"), "PT10M");
    assert_eq!(s("default_message_ttl"), "P14D");
    assert_eq!(
        default_of(&dir, "max_delivery_count").as_u64().unwrap(),
        u64::from(WorkerSettings::default().servicebus.max_delivery_count)
    );
    let main = std::fs::read_to_string(dir.join("main.tf")).unwrap();
    assert!(main.contains("requires_duplicate_detection            = true"));
    assert!(main.contains("dead_lettering_on_message_expiration = true"));
    // Current azurerm (v4/v5) argument names only.
    for old in [
        "enable_partitioning",
        "enable_express",
        "enable_batched_operations",
        "zone_redundant",
    ] {
        assert!(!main.contains(old), "{old} is a removed azurerm argument");
    }
    assert!(main.contains("partitioning_enabled"));
}

#[test]
fn worker_defaults_are_the_documented_ones() {
    let s = WorkerSettings::default();
    assert_eq!(s.inbox.retention_seconds, 2_592_000);
    assert_eq!(
        (
            s.sqs.batch_size,
            s.sqs.wait_time_seconds,
            s.sqs.visibility_timeout_seconds
        ),
        (10, 20, 60)
    );
    assert_eq!(
        (
            s.sqs.heartbeat_interval_seconds,
            s.sqs.max_extension_seconds
        ),
        (20, 7_200)
    );
    assert_eq!(
        (
            s.sqs.queue_retention_seconds,
            s.sqs.dlq_retention_seconds,
            s.sqs.max_receive_count
        ),
        (345_600, 1_209_600, 5)
    );
    assert!(s.sqs.producers_send_deduplication_id);
    let b = s.servicebus;
    assert_eq!(
        (
            b.lock_duration_seconds,
            b.lock_renewal_interval_seconds,
            b.max_delivery_count
        ),
        (60, 20, 10)
    );
    assert_eq!(
        (
            b.duplicate_detection_window_seconds,
            b.default_message_ttl_seconds
        ),
        (600, 1_209_600)
    );
    assert!(b.dead_lettering_on_message_expiration);
}
