//! The worker settings the Terraform is checked against: the worker's own settings file
//! ([`txinbox_core::settings`]), read by the same code as the workers, with the same
//! `TXINBOX_<SECTION>__<KEY>` environment overrides, so that check-infra validates the values a worker
//! runs with.
//!
//! The rules read `inbox.retention_seconds`, `inbox.redrive_grace_seconds`, the SQS heartbeat interval (a
//! third of `sqs.visibility_timeout_seconds`, as the worker renews), `sqs.producers_send_deduplication_id`,
//! `sqs.identity`, the Service Bus lock renewal interval (a third of `servicebus.lock_duration_seconds`) and
//! `servicebus.dead_letter_to`.

use std::path::Path;

pub use txinbox_core::settings::{
    InboxSettings, ServiceBusSettings, SettingsError, SqsIdentity, SqsSettings, WorkerSettings,
};

use crate::CheckError;

/// Loads the settings file as a worker does ([`WorkerSettings::load`]: the file, then the process's
/// `TXINBOX_<SECTION>__<KEY>` overrides).
///
/// # Errors
///
/// [`CheckError::Config`] naming the file, with the [`SettingsError`] (which names the key or variable).
pub fn load(path: &Path) -> Result<WorkerSettings, CheckError> {
    WorkerSettings::load(path).map_err(|source| CheckError::Config {
        path: path.to_path_buf(),
        source: Box::new(source),
    })
}
