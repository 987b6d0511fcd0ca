//! Checks the Terraform of SQS FIFO and Azure Service Bus queues, and of the
//! DynamoDB store's inbox table, against the txinbox worker's settings, and
//! reports every setting that breaks one of the inbox's guarantees (which no
//! general-purpose scanner checks).
//!
//! This is the library behind `txinbox check-infra DIR|PLAN.json [--config FILE] [--var-file FILE]...`
//! (see `docs/check-infra.md`).
//!
//! ```
//! use std::path::Path;
//! use txinbox_infra::{check_dir, WorkerSettings};
//!
//! let dir = std::env::temp_dir().join(format!("txinbox-infra-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! std::fs::write(
//!     dir.join("main.tf"),
//!     r#"resource "aws_sqs_queue" "main" {
//!   name                       = "orders.fifo"
//!   fifo_queue                 = true
//!   visibility_timeout_seconds = 30
//! }
//! "#,
//! )
//! .unwrap();
//!
//! let report = check_dir(&dir, &WorkerSettings::default()).unwrap();
//! let rules: Vec<&str> = report.violations.iter().map(|v| v.rule.as_str()).collect();
//! // No dead-letter queue, and 30 s < 2 x the 20 s heartbeat.
//! assert_eq!(rules, ["sqs-fifo-missing-redrive", "sqs-visibility-timeout-too-short"]);
//! assert_eq!(report.violations[1].line, 4);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```
//!
//! # What is read
//!
//! A directory ([`Input::Dir`]), as Terraform reads a root module: every
//! `*.tf` file directly in it (`*.tf.json` is not read), then
//! `terraform.tfvars`, `*.auto.tfvars` in name order and the `-var-file`s
//! given, later values winning. `var.x` resolves to the variable's value from
//! those files or else its `default`; `local.x` to the local's value;
//! `jsonencode` is evaluated; a resource's computed attributes
//! (`aws_sqs_queue.NAME.arn`, `azurerm_servicebus_queue.NAME.id`,
//! `data.aws_iam_policy_document.NAME.json`, ...) resolve to placeholders
//! naming the resource, so redrive policies, IAM statements and role scopes
//! can be followed. A `module` call with a local `source` (`./...`,
//! `../...`) is read recursively: its inputs are evaluated in the caller and
//! replace the module's defaults, its resources are addressed
//! `module.NAME.KIND.NAME`, and its outputs resolve as `module.NAME.OUTPUT`.
//! `count` and `for_each` on a module call or a resource are not expanded (one
//! instance is read; `KIND.NAME[0]` of a resource with `count` refers to it). A registry or remote module is never fetched (no network): it is
//! named in the report's advice, and its resources are checked through a
//! plan.
//!
//! A plan ([`Input::Plan`]): the output of `terraform show -json PLAN`, whose
//! resources Terraform has already expanded from every module (registry ones
//! included), variable and `count`/`for_each`: the `values` of
//! `planned_values.root_module.resources[]` and `child_modules[]`, the
//! attributes `resource_changes[].change.after_unknown` marks as known only
//! after apply, and for those the `references` of their expressions in
//! `configuration` (so a first plan's redrive policy still names its
//! dead-letter queue).
//!
//! A value that cannot be resolved statically (a variable without
//! default, another function, another resource's attribute) is reported as a
//! violation of the rule that needs it, because the guarantee cannot be
//! verified.
//!
//! Lines come from the byte spans that hcl-rs's parser (`hcl::edit`) records
//! for every block and attribute: a violation points at the offending
//! attribute's line (where it uses `var.x`, the message also names the file
//! and line of the variable's value), or at the resource block's first line
//! when the attribute is missing. In a plan, lines point into the JSON
//! (useful when it is pretty-printed, e.g. `terraform show -json tfplan | jq .`).
//!
//! # Rules
//!
//! | id | fires when |
//! | --- | --- |
//! | `sqs-fifo-missing-redrive` | an `aws_sqs_queue` with `fifo_queue = true` that is not itself a dead-letter queue has no `redrive_policy` (on the queue or in an `aws_sqs_queue_redrive_policy`), or the policy has no `deadLetterTargetArn` or no `maxReceiveCount >= 1`, or names a queue of this module that is not FIFO. A queue is a dead-letter queue when a redrive policy names it or it has a redrive allow policy. |
//! | `sqs-content-based-deduplication` | a FIFO queue has `content_based_deduplication = true` while `sqs.producers_send_deduplication_id` is true (the default). Unset means false. |
//! | `sqs-visibility-timeout-too-short` | a queue that is not a dead-letter queue has `visibility_timeout_seconds < 2 ×` the worker's heartbeat interval (a third of the settings' `sqs.visibility_timeout_seconds`, 20 s by default); unset means SQS's 30 s. |
//! | `sqs-retention-exceeds-inbox` | the longest redelivery path of a queue is longer than `inbox.retention_seconds`: its `message_retention_seconds` + its dead-letter queue's + `inbox.redrive_grace_seconds` (an operator's time to redrive); without a dead-letter queue, its own retention. Unset means SQS's 4 days. |
//! | `sqs-identity-lost-on-dlq-move` | `sqs.identity = "deduplication-id"` and a FIFO queue has a dead-letter queue: AWS replaces the deduplication id on the move. With the default `"cloudevents"` this is advice (producers must set `ce-id`), not a violation. |
//! | `sqs-worker-policy-missing-action` | an IAM policy (`data "aws_iam_policy_document"` statements, with those of its `source_policy_documents` and `override_policy_documents` merged in by `sid`, or the JSON `policy` of `aws_iam_policy`, `aws_iam_role_policy`, `aws_iam_user_policy`, `aws_iam_group_policy`) that allows `sqs:ReceiveMessage` on a queue does not allow each of [`SQS_WORKER_QUEUE_ACTIONS`] on it and each of [`SQS_WORKER_DLQ_ACTIONS`] on its dead-letter queue (also one given by a literal ARN; wildcards `*`/`?` in actions and resources, also around a queue's ARN reference as in `"${aws_sqs_queue.q.arn}*"`, and `NotAction`/`NotResource` honoured; a statement whose actions or resources cannot be resolved statically gives advice, not a violation, where it decides; a `Deny` statement of the policy without a condition overrides its `Allow`; an action granted only by an `Allow` with a condition is advice, not a violation; conditions are not evaluated). |
//! | `servicebus-duplicate-detection-off` | an `azurerm_servicebus_queue` has `requires_duplicate_detection` unset or false. |
//! | `servicebus-duplicate-window-default` | duplicate detection is on but `duplicate_detection_history_time_window` is unset ("left to the default") or not an ISO 8601 duration. |
//! | `servicebus-lock-duration-too-short` | `lock_duration < 2 ×` the worker's lock renewal interval (a third of `servicebus.lock_duration_seconds`, 20 s by default); unset means Service Bus's `PT1M`. |
//! | `servicebus-no-dead-lettering-on-expiry` | `dead_lettering_on_message_expiration` is unset or false. |
//! | `servicebus-ttl-exceeds-inbox` | `default_message_ttl` is unset (Service Bus keeps messages practically forever) or longer than `inbox.retention_seconds`. |
//! | `servicebus-retention-path-exceeds-inbox` | a queue's `default_message_ttl` + its poison queue's + `inbox.redrive_grace_seconds` is longer than `inbox.retention_seconds`. The poison queue is `servicebus.dead_letter_to`, or else the queue named `{queue}-poison` when declared. |
//! | `servicebus-worker-role-missing` | a principal with `Azure Service Bus Data Receiver` (or Data Owner) on a queue (or its namespace) has no `Azure Service Bus Data Sender` (or Data Owner) on the queue's poison queue; or `servicebus.dead_letter_to` names a queue that is not declared. |
//! | `dynamodb-inbox-table-missing` | the settings' `store.url` is `dynamodb://TABLE` and no `aws_dynamodb_table` has the name `TABLE`. |
//! | `dynamodb-key-schema` | the inbox table's `hash_key` is not `pk`, its `attribute` `pk` is not of type `S`, or it has a `range_key`. |
//! | `dynamodb-index-mismatch` | the inbox table has no `global_secondary_index` `by_consumer` (hash `gsi1pk`, range `gsi1sk`, both `S`, projection `ALL`) or `due` (hash `gsi2pk`, range `gsi2sk`, both `S`, projection `KEYS_ONLY`), or one with other keys, key types or projection. |
//! | `dynamodb-ttl-off` | the inbox table has no `ttl` block, or its `enabled` is not true, or its `attribute_name` is not `expires_at`. |
//! | `dynamodb-pitr-off` | the inbox table has no `point_in_time_recovery` block with `enabled = true`. |
//! | `dynamodb-encryption-off` | the inbox table has no `server_side_encryption` block with `enabled = true` (a KMS key: the customer-managed `kms_key_arn`, else the AWS managed key). |
//! | `dynamodb-worker-policy-missing-action` | an IAM policy that allows `dynamodb:PutItem` on the inbox table does not allow each of [`DYNAMODB_WORKER_TABLE_ACTIONS`] on it and each of [`DYNAMODB_WORKER_INDEX_ACTIONS`] on its indexes `by_consumer` and `due` (`TABLE_ARN/index/NAME`). |
//! | `dynamodb-worker-policy-too-broad` | such a policy allows, on the inbox table or its indexes, a DynamoDB action that is not one of those (`dynamodb:*`, `dynamodb:Scan`, `BatchWriteItem`, `UpdateTable`, `UpdateTimeToLive`, `DeleteTable`, ...; an action pattern `*` counts). |
//!
//! The inbox table is the `aws_dynamodb_table` named by the settings' `store.url` (`dynamodb://TABLE`); with
//! another store, every `aws_dynamodb_table` that declares an index `by_consumer` or `due` is checked as one.
//!
//! Advice (not violations) is printed as `advice: ...` lines: producers must
//! carry `ce-id`; a registry module was not read; a first plan's redrive
//! policy is known only after apply; no IAM policy or role assignment for a
//! queue (no IAM policy writing the inbox table) was found, so the worker's
//! permissions were not checked; no DynamoDB table read is the inbox's.
//!
//! ISO 8601 durations count a year as 365 days and a month as 30 days.

mod duration;
mod dynamodb;
mod error;
mod iam;
mod plan;
mod report;
mod roles;
mod rules;
mod settings;
mod shape;
mod terraform;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use dynamodb::{DYNAMODB_WORKER_INDEX_ACTIONS, DYNAMODB_WORKER_TABLE_ACTIONS};
pub use error::{CheckError, HclError};
pub use iam::{SQS_WORKER_DLQ_ACTIONS, SQS_WORKER_QUEUE_ACTIONS};
pub use report::{Report, RuleId, Violation};
pub use roles::{
    POISON_QUEUE_SUFFIX, SERVICEBUS_WORKER_POISON_ROLES, SERVICEBUS_WORKER_QUEUE_ROLES,
};
pub use settings::{
    load as load_settings, InboxSettings, ServiceBusSettings, SettingsError, SqsIdentity,
    SqsSettings, WorkerSettings,
};

/// What to check: a Terraform directory (with variables files) or a plan in JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Input {
    /// A directory of `*.tf` files, read as Terraform reads a root module: `terraform.tfvars`, then
    /// `*.auto.tfvars`, then `var_files` in order (later values win); local modules are read.
    Dir {
        /// The directory.
        dir: PathBuf,
        /// `-var-file`s, in the order given.
        var_files: Vec<PathBuf>,
    },
    /// The output of `terraform show -json PLAN`.
    Plan(PathBuf),
}

impl Input {
    /// A directory without extra variables files.
    pub fn dir(dir: impl Into<PathBuf>) -> Self {
        Input::Dir {
            dir: dir.into(),
            var_files: Vec::new(),
        }
    }

    /// Adds a `-var-file` (a directory input only; a plan has its variables resolved).
    pub fn var_file(mut self, file: impl Into<PathBuf>) -> Self {
        if let Input::Dir { var_files, .. } = &mut self {
            var_files.push(file.into());
        }
        self
    }

    /// A directory, or a plan when `path` is a file (`terraform show -json PLAN > plan.json`).
    pub fn detect(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        if path.is_file() {
            Input::Plan(path)
        } else {
            Input::dir(path)
        }
    }

    fn path(&self) -> &Path {
        match self {
            Input::Dir { dir, .. } => dir,
            Input::Plan(file) => file,
        }
    }
}

/// Checks `input` against `settings`.
///
/// # Errors
///
/// [`CheckError::Io`] when a directory or a file cannot be read,
/// [`CheckError::Parse`] (with the file) when a file is not valid HCL,
/// [`CheckError::Plan`] when a plan file is not a plan in JSON,
/// [`CheckError::NoTerraformFiles`] when a directory (or a local module's) has no `*.tf` file and
/// [`CheckError::NoQueues`] when no queue (nor DynamoDB table) is declared. Violations are not
/// errors: they are in the [`Report`].
pub fn check(input: &Input, settings: &WorkerSettings) -> Result<Report, CheckError> {
    let module = match input {
        Input::Dir { dir, var_files } => terraform::Module::load(dir, var_files)?,
        Input::Plan(file) => terraform::Module::load_plan(file)?,
    };
    let count = |kind: &str| {
        module
            .resources
            .iter()
            .filter(|r| r.mode.is_empty() && r.kind == kind)
            .count()
    };
    let sqs_queues = count("aws_sqs_queue");
    let servicebus_queues = count("azurerm_servicebus_queue");
    let dynamodb_tables = count("aws_dynamodb_table");
    if sqs_queues + servicebus_queues + dynamodb_tables == 0 {
        return Err(CheckError::NoQueues {
            dir: input.path().to_path_buf(),
        });
    }
    let (violations, advice) = rules::check(&module, settings);
    Ok(Report {
        files: module.files.iter().map(|f| f.path.clone()).collect(),
        sqs_queues,
        servicebus_queues,
        dynamodb_tables,
        violations,
        advice,
    })
}

/// Checks the Terraform directory `dir` against `settings` (see [`check`]).
///
/// # Errors
///
/// Those of [`check`].
pub fn check_dir(dir: &Path, settings: &WorkerSettings) -> Result<Report, CheckError> {
    check(&Input::dir(dir), settings)
}

/// Checks a plan in JSON (`terraform show -json PLAN > plan.json`) against `settings` (see [`check`]).
///
/// # Errors
///
/// Those of [`check`].
pub fn check_plan(file: &Path, settings: &WorkerSettings) -> Result<Report, CheckError> {
    check(&Input::Plan(file.to_path_buf()), settings)
}

/// What `txinbox check-infra PATH [--config FILE]` does: loads the settings
/// (defaults, or the worker's settings file with its environment overrides, as a worker loads it), checks `path` (a directory, or a plan JSON file),
/// writes one line per violation (`FILE:LINE: [RULE] RESOURCE: MESSAGE`, control characters escaped), one `advice: ...` line per
/// advice, and a summary to `out`, and returns `Ok(true)` when there is no violation.
///
/// The CLI should exit 0 on `Ok(true)`, 1 on `Ok(false)` and 2 on `Err`
/// (printing the error with its sources).
///
/// # Errors
///
/// Those of [`load_settings`] and [`check`], and
/// [`CheckError::Output`] when `out` cannot be written.
pub fn run_cli(
    path: &Path,
    config: Option<&Path>,
    out: &mut impl Write,
) -> Result<bool, CheckError> {
    run(&Input::detect(path), config, out)
}

/// [`run_cli`] with an explicit [`Input`] (e.g. a directory with `-var-file`s).
///
/// # Errors
///
/// Those of [`run_cli`].
pub fn run(input: &Input, config: Option<&Path>, out: &mut impl Write) -> Result<bool, CheckError> {
    let settings = match config {
        Some(path) => settings::load(path)?,
        // As a worker without a file: the defaults with the environment's overrides.
        None => WorkerSettings::from_env().map_err(|source| CheckError::Config {
            path: "<environment>".into(),
            source: Box::new(source),
        })?,
    };
    let report = check(input, &settings)?;
    write_report(&report, input.path(), out).map_err(CheckError::Output)?;
    Ok(report.is_clean())
}

fn write_report(report: &Report, dir: &Path, out: &mut impl Write) -> std::io::Result<()> {
    for violation in &report.violations {
        writeln!(out, "{violation}")?;
    }
    for advice in &report.advice {
        writeln!(out, "advice: {}", report::escaped(advice))?;
    }
    let n = report.violations.len();
    let tables = match report.dynamodb_tables {
        0 => String::new(),
        n => format!(", {n} DynamoDB table{}", plural(n)),
    };
    writeln!(
        out,
        "check-infra: {} in {} ({} file{}, {} SQS queue{}, {} Service Bus queue{}{tables})",
        if n == 0 {
            "ok, no violation".to_owned()
        } else {
            format!("{n} violation{}", if n == 1 { "" } else { "s" })
        },
        report::escaped(&dir.display().to_string()),
        report.files.len(),
        plural(report.files.len()),
        report.sqs_queues,
        plural(report.sqs_queues),
        report.servicebus_queues,
        plural(report.servicebus_queues),
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
