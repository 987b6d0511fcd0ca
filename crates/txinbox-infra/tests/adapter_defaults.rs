//! `WorkerSettings::default()` describes the adapters' defaults: this ties each value to the adapter's own
//! (and the renewal intervals to the worker's derivation), so a change on one side fails here.

use std::time::Duration;

use txinbox_core::runtime::lease::renewal_interval;
use txinbox_core::LeaseOptions;
use txinbox_infra::WorkerSettings;
use txinbox_servicebus::ServiceBusOptions;
use txinbox_sqs::SqsOptions;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn sqs_settings_are_the_adapters_defaults() {
    let s = WorkerSettings::default().sqs;
    let o = SqsOptions::default();
    assert_eq!(s.batch_size as usize, o.batch_size);
    assert_eq!(secs(s.wait_time_seconds), o.wait);
    assert_eq!(secs(s.visibility_timeout_seconds), o.visibility_timeout);
    assert_eq!(
        s.heartbeat_interval(),
        renewal_interval(o.visibility_timeout)
    );
    assert_eq!(
        secs(s.max_extension_seconds),
        LeaseOptions::default().max_total
    );
}

#[test]
fn servicebus_settings_are_the_adapters_defaults() {
    let s = WorkerSettings::default().servicebus;
    let o = ServiceBusOptions::default();
    assert_eq!(secs(s.lock_duration_seconds), o.lock_duration);
    assert_eq!(s.lock_renewal_interval(), renewal_interval(o.lock_duration));
}

#[test]
fn declared_iam_actions_and_roles_are_the_adapters() {
    assert_eq!(
        txinbox_infra::SQS_WORKER_QUEUE_ACTIONS,
        txinbox_sqs::iam::QUEUE_ACTIONS
    );
    assert_eq!(
        txinbox_infra::SQS_WORKER_DLQ_ACTIONS,
        txinbox_sqs::iam::DLQ_ACTIONS
    );
    assert_eq!(
        txinbox_infra::SERVICEBUS_WORKER_QUEUE_ROLES,
        txinbox_servicebus::roles::QUEUE_ROLES
    );
    assert_eq!(
        txinbox_infra::SERVICEBUS_WORKER_POISON_ROLES,
        txinbox_servicebus::roles::POISON_QUEUE_ROLES
    );
    assert_eq!(
        txinbox_infra::POISON_QUEUE_SUFFIX,
        txinbox_servicebus::roles::POISON_QUEUE_SUFFIX
    );
}

#[test]
fn dynamodb_worker_actions_are_the_stores() {
    assert_eq!(
        txinbox_infra::DYNAMODB_WORKER_TABLE_ACTIONS,
        txinbox_dynamodb::IAM_TABLE_ACTIONS
    );
    assert_eq!(
        txinbox_infra::DYNAMODB_WORKER_INDEX_ACTIONS,
        txinbox_dynamodb::IAM_INDEX_ACTIONS
    );
}
