//! One broken copy of a sample per rule: each fails with its own rule id,
//! message, file and line, and nothing else.

mod common;

use common::{aws_sample, azure_sample, copy_of, TempDir};
use txinbox_infra::{check_dir, run_cli, CheckError, RuleId, Violation, WorkerSettings};

/// Checks `dir` and returns its only violation.
fn only_violation(dir: &TempDir, settings: &WorkerSettings) -> Violation {
    let report = check_dir(dir.path(), settings).unwrap();
    assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
    report.violations.into_iter().next().unwrap()
}

fn assert_violation(v: &Violation, rule: RuleId, file: &str, line: usize, message: &str) {
    assert_eq!(v.rule, rule, "{v}");
    assert_eq!(v.file.file_name().unwrap(), file, "{v}");
    assert_eq!(v.line, line, "{v}");
    assert!(
        v.message.contains(message),
        "{:?} does not contain {message:?}",
        v.message
    );
}

const REDRIVE: &str = "  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq.arn
    maxReceiveCount     = var.max_receive_count
  })
";

#[test]
fn fifo_queue_without_redrive_policy() {
    let dir = copy_of(&aws_sample(), "no-redrive");
    dir.edit("main.tf", REDRIVE, "");
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", r#"resource "aws_sqs_queue" "main""#);
    assert_violation(
        &v,
        RuleId::SqsFifoMissingRedrive,
        "main.tf",
        line,
        "FIFO queue has no redrive_policy",
    );
    assert_eq!(v.resource, "aws_sqs_queue.main");
    assert!(v.to_string().ends_with(&format!(
        "main.tf:{line}: [sqs-fifo-missing-redrive] aws_sqs_queue.main: {}",
        v.message
    )));
}

#[test]
fn redrive_policy_without_max_receive_count() {
    let dir = copy_of(&aws_sample(), "no-max-receive");
    dir.edit(
        "main.tf",
        "    maxReceiveCount     = var.max_receive_count\n",
        "",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", "redrive_policy = jsonencode");
    assert_violation(
        &v,
        RuleId::SqsFifoMissingRedrive,
        "main.tf",
        line,
        "no maxReceiveCount",
    );
}

#[test]
fn redrive_policy_to_a_standard_queue() {
    let dir = copy_of(&aws_sample(), "standard-dlq");
    let main = dir.read("main.tf");
    // Make the DLQ a standard queue (the first fifo_queue line is the DLQ's).
    dir.write("main.tf", &main.replacen("  fifo_queue                        = true\n  content_based_deduplication       = false\n", "", 1));
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", "redrive_policy = jsonencode");
    assert_violation(
        &v,
        RuleId::SqsFifoMissingRedrive,
        "main.tf",
        line,
        "aws_sqs_queue.dlq is not a FIFO queue",
    );
}

#[test]
fn redrive_in_a_separate_resource_counts() {
    let dir = copy_of(&aws_sample(), "separate-redrive");
    dir.edit("main.tf", REDRIVE, "");
    dir.write(
        "redrive.tf",
        "resource \"aws_sqs_queue_redrive_policy\" \"main\" {\n  queue_url = aws_sqs_queue.main.id\n  redrive_policy = <<-EOT\n    {\"deadLetterTargetArn\": \"${aws_sqs_queue.dlq.arn}\", \"maxReceiveCount\": 5}\n  EOT\n}\n",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

#[test]
fn content_based_deduplication_with_explicit_ids() {
    let dir = copy_of(&aws_sample(), "content-dedup");
    dir.edit(
        "main.tf",
        "from the body.\n  content_based_deduplication       = false",
        "from the body.\n  content_based_deduplication       = true",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", "content_based_deduplication       = true");
    assert_violation(
        &v,
        RuleId::SqsContentBasedDeduplication,
        "main.tf",
        line,
        "content_based_deduplication = true but producers send an explicit MessageDeduplicationId",
    );

    // Producers without explicit ids: content-based deduplication is what they need.
    let mut settings = WorkerSettings::default();
    settings.sqs.producers_send_deduplication_id = false;
    assert!(check_dir(dir.path(), &settings).unwrap().is_clean());
}

#[test]
fn visibility_timeout_shorter_than_two_heartbeats() {
    let dir = copy_of(&aws_sample(), "visibility");
    let var_line = dir.line_of("variables.tf", "default     = 60");
    dir.edit("variables.tf", "default     = 60", "default     = 30");
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", "= var.visibility_timeout_seconds");
    assert_violation(
        &v,
        RuleId::SqsVisibilityTimeoutTooShort,
        "main.tf",
        line,
        "visibility_timeout_seconds = 30",
    );
    assert!(
        v.message.contains(&format!(
            "(var.visibility_timeout_seconds, set at variables.tf:{var_line})"
        )),
        "{}",
        v.message
    );
    assert!(v.message.contains("2 x 20 s = 40 s"), "{}", v.message);
}

#[test]
fn visibility_timeout_checked_against_configured_heartbeat() {
    let dir = copy_of(&aws_sample(), "heartbeat");
    // The worker renews every third of its visibility timeout: 31 s.
    dir.write("worker.toml", "[sqs]\nvisibility_timeout_seconds = 93\n");
    let mut out = Vec::new();
    let clean = run_cli(dir.path(), Some(&dir.path().join("worker.toml")), &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(!clean);
    assert!(out.contains("[sqs-visibility-timeout-too-short] aws_sqs_queue.main: visibility_timeout_seconds = 60"), "{out}");
    assert!(out.contains("2 x 31 s = 62 s"), "{out}");
    assert!(
        out.ends_with("check-infra: 1 violation in ")
            || out.contains("\ncheck-infra: 1 violation in "),
        "{out}"
    );
}

#[test]
fn visibility_timeout_unset_means_sqs_default() {
    let dir = copy_of(&aws_sample(), "visibility-unset");
    dir.edit(
        "main.tf",
        "  visibility_timeout_seconds        = var.visibility_timeout_seconds\n",
        "",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", r#"resource "aws_sqs_queue" "main""#);
    assert_violation(
        &v,
        RuleId::SqsVisibilityTimeoutTooShort,
        "main.tf",
        line,
        "visibility_timeout_seconds is not set (SQS default 30 s)",
    );
}

#[test]
fn dlq_retention_longer_than_inbox_retention() {
    let dir = copy_of(&aws_sample(), "retention");
    // The inbox keeps markers 7 days: the 14-day DLQ outlives them.
    dir.write("worker.toml", "[inbox]\nretention_seconds = 604800\n");
    let settings = txinbox_infra::load_settings(&dir.path().join("worker.toml")).unwrap();
    let v = only_violation(&dir, &settings);
    let line = dir.line_of("main.tf", "= var.dlq_message_retention_seconds");
    assert_violation(
        &v,
        RuleId::SqsRetentionExceedsInbox,
        "main.tf",
        line,
        "message_retention_seconds = 1209600 (var.dlq_message_retention_seconds",
    );
    assert!(v.message.contains("the longest redelivery path is 2160000 s = 25 d, longer than the inbox keeps processed markers (inbox.retention_seconds = 604800 s = 7 d): queue retention + dead-letter queue retention + the operator's redrive grace (inbox.redrive_grace_seconds = 604800 s = 7 d), with the queue aws_sqs_queue.main message_retention_seconds = 345600"), "{}", v.message);
    assert_eq!(v.resource, "aws_sqs_queue.dlq");
}

/// Each retention is within the inbox's on its own, but the path through both (plus the redrive grace) is
/// not: the broken copy fails, the sample (4 d + 14 d + 7 d <= 30 d) passes.
#[test]
fn retention_path_longer_than_inbox_retention_though_each_queue_fits() {
    let dir = copy_of(&aws_sample(), "retention-path");
    dir.write(
        "terraform.tfvars",
        "dlq_message_retention_seconds = 1209600
message_retention_seconds = 1209600
",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", "= var.dlq_message_retention_seconds");
    assert_violation(&v, RuleId::SqsRetentionExceedsInbox, "main.tf", line, "the longest redelivery path is 3024000 s = 35 d, longer than the inbox keeps processed markers (inbox.retention_seconds = 2592000 s = 30 d)");

    // The redrive grace is a worker setting: a team that redrives within a day fits.
    let settings =
        WorkerSettings::from_toml_str("[inbox]\nredrive_grace_seconds = 86400\n").unwrap();
    assert!(check_dir(dir.path(), &settings).unwrap().is_clean());
    // A too-long grace breaks the sample itself.
    let settings =
        WorkerSettings::from_toml_str("[inbox]\nredrive_grace_seconds = 1036801\n").unwrap();
    let v = only_violation(&copy_of(&aws_sample(), "grace"), &settings);
    assert_eq!(v.rule, RuleId::SqsRetentionExceedsInbox);
    assert!(
        v.message
            .contains("inbox.redrive_grace_seconds = 1036801 s = 12.0 d"),
        "{}",
        v.message
    );
}

#[test]
fn queue_retention_from_tfvars_longer_than_inbox_retention() {
    let dir = copy_of(&aws_sample(), "retention-tfvars");
    dir.write("terraform.tfvars", "message_retention_seconds = 3000000\n");
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", "= var.message_retention_seconds");
    assert_violation(&v, RuleId::SqsRetentionExceedsInbox, "main.tf", line, "message_retention_seconds = 3000000 (var.message_retention_seconds, set at terraform.tfvars:1): the longest redelivery path is 4814400 s = 55.7 d");
    assert_eq!(v.resource, "aws_sqs_queue.main");
}

/// The first line of the Azure sample's main queue.
const SB_MAIN: &str = r#"resource "azurerm_servicebus_queue" "main""#;

#[test]
fn servicebus_queue_without_duplicate_detection() {
    let dir = copy_of(&azure_sample(), "sb-dedup-off");
    dir.edit_after(
        "main.tf",
        SB_MAIN,
        "requires_duplicate_detection            = true",
        "requires_duplicate_detection            = false",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_after("main.tf", SB_MAIN, "requires_duplicate_detection");
    assert_violation(
        &v,
        RuleId::ServiceBusDuplicateDetectionOff,
        "main.tf",
        line,
        "requires_duplicate_detection = false",
    );
    assert_eq!(v.resource, "azurerm_servicebus_queue.main");
}

#[test]
fn servicebus_duplicate_window_left_to_default() {
    let dir = copy_of(&azure_sample(), "sb-window");
    dir.edit(
        "main.tf",
        "  duplicate_detection_history_time_window = var.duplicate_detection_history_time_window\n",
        "",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", r#"resource "azurerm_servicebus_queue" "main""#);
    assert_violation(
        &v,
        RuleId::ServiceBusDuplicateWindowDefault,
        "main.tf",
        line,
        "duplicate_detection_history_time_window is left to the provider's default",
    );
}

#[test]
fn servicebus_lock_duration_shorter_than_two_renewals() {
    let dir = copy_of(&azure_sample(), "sb-lock");
    dir.edit(
        "variables.tf",
        "default     = \"PT1M\"",
        "default     = \"PT30S\"",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", "lock_duration      = var.lock_duration");
    assert_violation(
        &v,
        RuleId::ServiceBusLockDurationTooShort,
        "main.tf",
        line,
        "lock_duration = \"PT30S\" (var.lock_duration, set at variables.tf:",
    );
    assert!(
        v.message.contains(
            "is 30 s, shorter than 2 x the worker's lock renewal interval (2 x 20 s = 40 s)"
        ),
        "{}",
        v.message
    );
}

#[test]
fn servicebus_without_dead_lettering_on_expiry() {
    let dir = copy_of(&azure_sample(), "sb-dlx");
    dir.edit_after(
        "main.tf",
        SB_MAIN,
        "  dead_lettering_on_message_expiration = true\n",
        "",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", r#"resource "azurerm_servicebus_queue" "main""#);
    assert_violation(
        &v,
        RuleId::ServiceBusNoDeadLetteringOnExpiry,
        "main.tf",
        line,
        "dead_lettering_on_message_expiration is not set (Service Bus default: false)",
    );
}

#[test]
fn servicebus_ttl_longer_than_inbox_retention() {
    let dir = copy_of(&azure_sample(), "sb-ttl");
    dir.edit(
        "variables.tf",
        "default     = \"P14D\"",
        "default     = \"P45D\"",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    let rules: Vec<RuleId> = report.violations.iter().map(|v| v.rule).collect();
    // The queue on its own, and the path through its poison queue (45 d + 7 d + the 7-day grace).
    assert_eq!(
        rules,
        [
            RuleId::ServiceBusTtlExceedsInbox,
            RuleId::ServiceBusRetentionPathExceedsInbox
        ]
    );
    assert!(report.violations[1]
        .message
        .contains("the longest redelivery path is 5097600 s = 59 d"));
    let v = report.violations[0].clone();
    let line = dir.line_of(
        "main.tf",
        "default_message_ttl                  = var.default_message_ttl",
    );
    assert_violation(
        &v,
        RuleId::ServiceBusTtlExceedsInbox,
        "main.tf",
        line,
        "default_message_ttl = \"P45D\" (var.default_message_ttl, set at variables.tf:",
    );
    assert!(
        v.message
            .contains("is 3888000 s = 45 d, longer than the inbox keeps processed markers"),
        "{}",
        v.message
    );
}

#[test]
fn servicebus_ttl_unset_is_forever() {
    let dir = copy_of(&azure_sample(), "sb-ttl-unset");
    dir.edit(
        "main.tf",
        "  default_message_ttl                  = var.default_message_ttl\n",
        "",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", r#"resource "azurerm_servicebus_queue" "main""#);
    assert_violation(
        &v,
        RuleId::ServiceBusTtlExceedsInbox,
        "main.tf",
        line,
        "default_message_ttl is not set (Service Bus default: practically forever)",
    );
}

#[test]
fn every_rule_has_a_distinct_id_and_a_broken_copy() {
    let ids: std::collections::BTreeSet<&str> = RuleId::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(ids.len(), RuleId::ALL.len());
    assert_eq!(
        RuleId::SqsRetentionExceedsInbox.to_string(),
        "sqs-retention-exceeds-inbox"
    );
}

#[test]
fn unresolvable_value_is_a_violation() {
    let dir = copy_of(&azure_sample(), "sb-unknown");
    dir.edit(
        "main.tf",
        "lock_duration      = var.lock_duration",
        "lock_duration      = var.no_such_variable",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", "var.no_such_variable");
    assert_violation(
        &v,
        RuleId::ServiceBusLockDurationTooShort,
        "main.tf",
        line,
        "lock_duration cannot be resolved statically",
    );
}

#[test]
fn invalid_duration_is_a_violation() {
    let dir = copy_of(&azure_sample(), "sb-bad-duration");
    dir.edit(
        "variables.tf",
        "default     = \"PT10M\"",
        "default     = \"10 minutes\"",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::ServiceBusDuplicateWindowDefault);
    assert!(
        v.message.contains("is not an ISO 8601 duration"),
        "{}",
        v.message
    );
}

#[test]
fn bad_hcl_is_a_parse_error_naming_the_file() {
    let dir = copy_of(&aws_sample(), "bad-hcl");
    dir.write(
        "broken.tf",
        "resource \"aws_sqs_queue\" \"x\" {\n  name = \n}\n",
    );
    let err = check_dir(dir.path(), &WorkerSettings::default()).unwrap_err();
    assert!(
        matches!(&err, CheckError::Parse { file, .. } if file.ends_with("broken.tf")),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("broken.tf is not valid HCL"),
        "{err}"
    );
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("line 2, column"), "{source}");
}

/// A variables file holds secrets (`db_password = "..."`): a parse error names the file, the line and the
/// column and what was expected, never the line's text, in its message and down its chain.
#[test]
fn a_parse_error_never_quotes_the_line_it_stops_at() {
    for (file, text) in [
        ("terraform.tfvars", "sas_key = \"SECRETxyz123\" x\n"),
        (
            "broken.tf",
            "resource \"aws_sqs_queue\" \"x\" {\n  name = \"SECRETxyz123\" x\n}\n",
        ),
    ] {
        let dir = copy_of(&aws_sample(), "parse-secret");
        dir.write(file, text);
        let err = check_dir(dir.path(), &WorkerSettings::default()).unwrap_err();
        let mut shown = vec![err.to_string(), format!("{err:?}")];
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            shown.push(s.to_string());
            shown.push(format!("{s:?}"));
            source = s.source();
        }
        for s in &shown {
            assert!(!s.contains("SECRETxyz123"), "{file}: {s}");
        }
        assert!(
            shown[0].contains(&format!("{file} is not valid HCL")),
            "{}",
            shown[0]
        );
        let line = if file.ends_with(".tf") { 2 } else { 1 };
        assert!(
            shown[2].contains(&format!("line {line}, column")),
            "{file}: {}",
            shown[2]
        );
    }
}

#[test]
fn unbalanced_brackets_are_refused_before_parsing_naming_file_and_line() {
    let dir = copy_of(&aws_sample(), "unbalanced");
    dir.write(
        "broken.tf",
        "resource \"aws_sqs_queue\" \"x\" {\n  name = \"x\"\n",
    );
    let err = check_dir(dir.path(), &WorkerSettings::default()).unwrap_err();
    assert!(
        matches!(&err, CheckError::Shape { file, line: 1, .. } if file.ends_with("broken.tf")),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("broken.tf:1 is not valid HCL: `{` is never closed"),
        "{err}"
    );
}

#[test]
fn empty_or_queueless_directory_is_an_error() {
    let dir = TempDir::new("empty");
    let err = check_dir(dir.path(), &WorkerSettings::default()).unwrap_err();
    assert!(
        matches!(err, CheckError::NoTerraformFiles { .. }),
        "{err:?}"
    );

    dir.write("main.tf", "variable \"x\" {\n  default = 1\n}\n");
    let err = check_dir(dir.path(), &WorkerSettings::default()).unwrap_err();
    assert!(matches!(err, CheckError::NoQueues { .. }), "{err:?}");

    let err = check_dir(&dir.path().join("missing"), &WorkerSettings::default()).unwrap_err();
    assert!(matches!(err, CheckError::Io { .. }), "{err:?}");
}

#[test]
fn config_with_unknown_key_is_an_error() {
    let dir = TempDir::new("config");
    dir.write("worker.toml", "[sqs]\nheartbeat_interval = 20\n");
    let mut out = Vec::new();
    let err = run_cli(
        &aws_sample(),
        Some(&dir.path().join("worker.toml")),
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(err, CheckError::Config { .. }), "{err:?}");
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("heartbeat_interval"), "{source}");
    assert!(out.is_empty());
}

/// Issue: `SqsReceiver::connect` calls GetQueueUrl on the DLQ; a policy without it fails on AWS.
#[test]
fn worker_policy_without_get_queue_url_on_the_dlq() {
    let dir = copy_of(&aws_sample(), "iam");
    dir.edit(
        "iam.tf",
        r#"actions   = ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"]"#,
        r#"actions   = ["sqs:SendMessage", "sqs:GetQueueAttributes"]"#,
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("iam.tf", r#"data "aws_iam_policy_document" "worker""#);
    assert_violation(
        &v,
        RuleId::SqsWorkerPolicyMissingAction,
        "iam.tf",
        line,
        "this policy lets a worker receive from aws_sqs_queue.main but does not grant sqs:GetQueueUrl on the dead-letter queue aws_sqs_queue.dlq",
    );
    assert_eq!(v.resource, "data.aws_iam_policy_document.worker");
}

#[test]
fn worker_policy_without_delete_on_the_queue_and_wildcards() {
    let dir = copy_of(&aws_sample(), "iam-delete");
    dir.edit("iam.tf", "      \"sqs:DeleteMessage\",\n", "");
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::SqsWorkerPolicyMissingAction);
    assert!(
        v.message
            .contains("does not grant sqs:DeleteMessage on aws_sqs_queue.main"),
        "{}",
        v.message
    );

    // A wildcard grants them all; a JSON policy (aws_iam_policy with jsonencode) is read too.
    let dir = copy_of(&aws_sample(), "iam-json");
    dir.write(
        "iam.tf",
        r#"resource "aws_iam_policy" "worker" {
  name = "worker"
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      { Effect = "Allow", Action = ["sqs:ReceiveMessage", "sqs:Delete*", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"], Resource = aws_sqs_queue.main.arn },
      { Effect = "Allow", Action = "sqs:SendMessage", Resource = [aws_sqs_queue.dlq.arn] },
    ]
  })
}
"#,
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.resource, "aws_iam_policy.worker");
    assert!(
        v.message.contains(
            "does not grant sqs:GetQueueUrl, sqs:GetQueueAttributes on the dead-letter queue"
        ),
        "{}",
        v.message
    );
    let text = dir
        .read("iam.tf")
        .replace(r#"Action = "sqs:SendMessage""#, r#"Action = "sqs:*""#);
    dir.write("iam.tf", &text);
    assert!(check_dir(dir.path(), &WorkerSettings::default())
        .unwrap()
        .is_clean());
}

/// The worker's identity must send to the poison queue it forwards dead letters to.
#[test]
fn worker_without_data_sender_on_the_poison_queue() {
    let dir = copy_of(&azure_sample(), "sb-roles");
    let main = dir.read("main.tf");
    let start = main
        .find(r#"resource "azurerm_role_assignment" "worker_poison_sender""#)
        .unwrap();
    let end = start + main[start..].find("}\n").unwrap() + 2;
    dir.write("main.tf", &format!("{}{}", &main[..start], &main[end..]));
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of(
        "main.tf",
        r#"resource "azurerm_role_assignment" "worker_receiver""#,
    );
    assert_violation(
        &v,
        RuleId::ServiceBusWorkerRoleMissing,
        "main.tf",
        line,
        "principal var.worker_principal_id receives from azurerm_servicebus_queue.main (Azure Service Bus Data Receiver) but has no Azure Service Bus Data Sender on its poison queue azurerm_servicebus_queue.poison",
    );

    // A namespace-wide Data Sender covers the poison queue.
    let text = dir.read("main.tf")
        + r#"
resource "azurerm_role_assignment" "worker_namespace_sender" {
  scope                = azurerm_servicebus_namespace.main.id
  role_definition_name = "Azure Service Bus Data Sender"
  principal_id         = var.worker_principal_id
}
"#;
    dir.write("main.tf", &text);
    assert!(check_dir(dir.path(), &WorkerSettings::default())
        .unwrap()
        .is_clean());
}

#[test]
fn configured_poison_queue_must_be_declared() {
    let dir = copy_of(&azure_sample(), "sb-dead-letter-to");
    let settings =
        WorkerSettings::from_toml_str("[servicebus]\ndead_letter_to = \"orders-dead\"\n").unwrap();
    let report = check_dir(dir.path(), &settings).unwrap();
    let rules: Vec<RuleId> = report.violations.iter().map(|v| v.rule).collect();
    assert_eq!(
        rules,
        [RuleId::ServiceBusWorkerRoleMissing],
        "{:#?}",
        report.violations
    );
    assert!(report.violations[0]
        .message
        .contains(r#"the worker forwards dead letters to "orders-dead" (servicebus.dead_letter_to) but no azurerm_servicebus_queue of that name is declared"#));
}

/// The Service Bus path: queue TTL + poison queue TTL + redrive grace.
#[test]
fn servicebus_retention_path_through_the_poison_queue() {
    let dir = copy_of(&azure_sample(), "sb-path");
    dir.write("terraform.tfvars", "poison_message_ttl = \"P14D\"\n");
    let v = only_violation(&dir, &WorkerSettings::default());
    let line = dir.line_of("main.tf", "= var.poison_message_ttl");
    assert_violation(
        &v,
        RuleId::ServiceBusRetentionPathExceedsInbox,
        "main.tf",
        line,
        "the longest redelivery path is 3024000 s = 35 d, longer than the inbox keeps processed markers",
    );
    assert_eq!(v.resource, "azurerm_servicebus_queue.poison");
}

/// A worker policy written with literal ARNs (as when the queues live in another state) names the queues by
/// their names.
#[test]
fn worker_policy_with_literal_arns() {
    let dir = copy_of(&aws_sample(), "iam-literal");
    let text = dir
        .read("iam.tf")
        .replace(
            "resources = [aws_sqs_queue.main.arn]",
            r#"resources = ["arn:aws:sqs:eu-west-1:123456789012:txinbox-orders.fifo"]"#,
        )
        .replace(
            "resources = [aws_sqs_queue.dlq.arn]",
            r#"resources = ["arn:aws:sqs:*:123456789012:txinbox-orders-dlq*"]"#,
        );
    dir.write("iam.tf", &text);
    assert!(check_dir(dir.path(), &WorkerSettings::default())
        .unwrap()
        .is_clean());
    // The DLQ statement names another queue: the worker cannot use its DLQ.
    dir.write(
        "iam.tf",
        &text.replace("txinbox-orders-dlq*", "other-dlq.fifo"),
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::SqsWorkerPolicyMissingAction);
    assert!(v.message.contains("does not grant sqs:SendMessage, sqs:GetQueueUrl, sqs:GetQueueAttributes on the dead-letter queue aws_sqs_queue.dlq"), "{}", v.message);
}

/// An explicit Deny in the worker's policy overrides its Allow (AWS IAM: "the `Deny` statement trumps the
/// `Allow` statement"); a Deny under a condition may not apply and is not taken as denying.
#[test]
fn worker_policy_with_a_deny_of_a_needed_action() {
    let dir = copy_of(&aws_sample(), "iam-deny");
    let deny = r#"
  statement {
    sid       = "NoDelete"
    effect    = "Deny"
    actions   = ["sqs:DeleteMessage"]
    resources = ["*"]
  }
"#;
    dir.edit(
        "iam.tf",
        "    resources = [aws_sqs_queue.dlq.arn]\n  }\n",
        &format!("    resources = [aws_sqs_queue.dlq.arn]\n  }}\n{deny}"),
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::SqsWorkerPolicyMissingAction, "{v}");
    assert_eq!(v.resource, "data.aws_iam_policy_document.worker");
    assert!(
        v.message
            .contains("does not grant sqs:DeleteMessage on aws_sqs_queue.main"),
        "{}",
        v.message
    );

    // Under a condition the Deny may not apply to the worker's requests: not a finding.
    dir.edit(
        "iam.tf",
        "    resources = [\"*\"]\n  }\n",
        "    resources = [\"*\"]\n    condition {\n      test     = \"Bool\"\n      variable = \"aws:SecureTransport\"\n      values   = [\"false\"]\n    }\n  }\n",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

/// `NotAction` matches every action but those listed: an Allow with it grants the others, a Deny with it
/// denies them; a JSON policy's Deny is read as the document's is.
#[test]
fn worker_policy_with_not_action() {
    let dir = copy_of(&aws_sample(), "iam-not-action");
    dir.write(
        "iam.tf",
        r#"resource "aws_iam_policy" "worker" {
  name = "worker"
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      { Effect = "Allow", NotAction = ["sqs:DeleteMessage", "iam:*"], Resource = "*" },
    ]
  })
}
"#,
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::SqsWorkerPolicyMissingAction, "{v}");
    assert!(
        v.message
            .contains("does not grant sqs:DeleteMessage on aws_sqs_queue.main"),
        "{}",
        v.message
    );

    // Allow everything, then deny every SQS action but ReceiveMessage on the queue.
    let text = dir.read("iam.tf").replace(
        r#"{ Effect = "Allow", NotAction = ["sqs:DeleteMessage", "iam:*"], Resource = "*" },"#,
        r#"{ Effect = "Allow", Action = "sqs:*", Resource = "*" },
      { Effect = "Deny", NotAction = "sqs:ReceiveMessage", Resource = aws_sqs_queue.main.arn },"#,
    );
    dir.write("iam.tf", &text);
    let v = only_violation(&dir, &WorkerSettings::default());
    assert!(
        v.message.contains("does not grant sqs:DeleteMessage, sqs:ChangeMessageVisibility, sqs:GetQueueAttributes on aws_sqs_queue.main"),
        "{}",
        v.message
    );
    assert!(
        !v.message
            .contains("on the dead-letter queue aws_sqs_queue.dlq"),
        "{}",
        v.message
    );
}

/// A queue whose redrive allow policy is `denyAll` is no dead-letter queue (AWS: "No source queues can
/// specify this queue as the dead-letter queue"): it is checked as a queue, here for its missing redrive.
#[test]
fn queue_that_denies_all_redrive_is_checked_as_a_queue() {
    let dir = copy_of(&aws_sample(), "deny-all");
    dir.edit(
        "main.tf",
        "  redrive_policy = jsonencode({\n    deadLetterTargetArn = aws_sqs_queue.dlq.arn\n    maxReceiveCount     = var.max_receive_count\n  })\n",
        "  redrive_allow_policy = jsonencode({ redrivePermission = \"denyAll\" })\n",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    let line = dir.line_of("main.tf", r#"resource "aws_sqs_queue" "main""#);
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.rule == RuleId::SqsFifoMissingRedrive
                && v.resource == "aws_sqs_queue.main"
                && v.line == line),
        "{:#?}",
        report.violations
    );

    // The same in its own resource.
    dir.edit(
        "main.tf",
        "  redrive_allow_policy = jsonencode({ redrivePermission = \"denyAll\" })\n",
        "",
    );
    dir.write(
        "deny.tf",
        "resource \"aws_sqs_queue_redrive_allow_policy\" \"main\" {\n  queue_url            = aws_sqs_queue.main.id\n  redrive_allow_policy = jsonencode({ redrivePermission = \"denyAll\" })\n}\n",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.rule == RuleId::SqsFifoMissingRedrive && v.resource == "aws_sqs_queue.main"),
        "{:#?}",
        report.violations
    );
}

/// An argument set to null is omitted (Terraform: "If you set an argument of a resource or module to null,
/// Terraform behaves as though you had completely omitted it"): the provider's default applies, as in a plan.
#[test]
fn argument_set_to_null_is_the_default() {
    // SQS's default content_based_deduplication is false: fine with producers' own ids.
    let dir = copy_of(&aws_sample(), "null-dedup");
    dir.edit_after(
        "main.tf",
        r#"resource "aws_sqs_queue" "main""#,
        "content_based_deduplication       = false",
        "content_based_deduplication       = var.kms_master_key_id == null ? null : false",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);

    // Service Bus's default lock duration is PT1M, twice the default renewal interval and more.
    let dir = copy_of(&azure_sample(), "null-lock");
    dir.edit(
        "main.tf",
        "  lock_duration      = var.lock_duration\n",
        "  lock_duration      = null\n",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

/// The heartbeat is a third of the worker's visibility timeout, exactly: 50 s gives 16.666 s, two of them
/// 33.333 s, so a queue's 33 s is short (in whole seconds, 33 >= 2 x 16 let it pass). The same for the
/// Service Bus lock renewal.
#[test]
fn visibility_and_lock_compared_to_exact_intervals() {
    let dir = copy_of(&aws_sample(), "heartbeat-exact");
    dir.edit("variables.tf", "default     = 60", "default     = 33");
    let settings =
        WorkerSettings::from_toml_str("[sqs]\nvisibility_timeout_seconds = 50\n").unwrap();
    let v = only_violation(&dir, &settings);
    assert_eq!(v.rule, RuleId::SqsVisibilityTimeoutTooShort, "{v}");
    assert!(
        v.message.contains("visibility_timeout_seconds = 33"),
        "{}",
        v.message
    );
    assert!(
        v.message.contains("(2 x 16.666 s = 33.333 s)"),
        "{}",
        v.message
    );
    // 34 s is enough.
    dir.edit("variables.tf", "default     = 33", "default     = 34");
    let report = check_dir(dir.path(), &settings).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);

    let dir = copy_of(&azure_sample(), "lock-exact");
    dir.edit(
        "variables.tf",
        "default     = \"PT1M\"",
        "default     = \"PT33S\"",
    );
    let settings =
        WorkerSettings::from_toml_str("[servicebus]\nlock_duration_seconds = 50\n").unwrap();
    let v = only_violation(&dir, &settings);
    assert_eq!(v.rule, RuleId::ServiceBusLockDurationTooShort, "{v}");
    assert!(
        v.message.contains("(2 x 16.666 s = 33.333 s)"),
        "{}",
        v.message
    );
}

/// A lock duration with a fraction of a second is compared as it is: PT39.5S is short of 2 x 20 s (rounded up
/// to 40 s it passed); a time to live is still rounded up (PT0.5S past the retention is past it).
#[test]
fn fractional_lock_duration_is_not_rounded_up() {
    let dir = copy_of(&azure_sample(), "lock-fraction");
    dir.edit(
        "variables.tf",
        "default     = \"PT1M\"",
        "default     = \"PT39.5S\"",
    );
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::ServiceBusLockDurationTooShort, "{v}");
    assert!(
        v.message.contains(
            "is 39.500 s, shorter than 2 x the worker's lock renewal interval (2 x 20 s = 40 s)"
        ),
        "{}",
        v.message
    );
    dir.edit(
        "variables.tf",
        "default     = \"PT39.5S\"",
        "default     = \"PT40S\"",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

/// A dead-letter queue in another state (a literal ARN): the move to it replaces the deduplication id all the
/// same, and a FIFO queue's dead-letter queue must be FIFO, whose name ends in .fifo.
#[test]
fn dead_letter_queue_given_by_a_literal_arn() {
    let dir = copy_of(&aws_sample(), "external-dlq");
    dir.edit(
        "main.tf",
        "    deadLetterTargetArn = aws_sqs_queue.dlq.arn\n",
        "    deadLetterTargetArn = \"arn:aws:sqs:eu-west-1:123456789012:orders-dlq.fifo\"\n",
    );
    // The worker's policy names that queue (its actions on it are checked, see below).
    dir.edit(
        "iam.tf",
        "resources = [aws_sqs_queue.dlq.arn]",
        "resources = [\"arn:aws:sqs:eu-west-1:123456789012:orders-dlq.fifo\"]",
    );
    let settings =
        WorkerSettings::from_toml_str("[sqs]\nidentity = \"deduplication-id\"\n").unwrap();
    let v = only_violation(&dir, &settings);
    assert_eq!(v.rule, RuleId::SqsIdentityLostOnDlqMove, "{v}");
    assert!(
        v.message
            .contains("arn:aws:sqs:eu-west-1:123456789012:orders-dlq.fifo"),
        "{}",
        v.message
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report.advice.iter().any(|a| a.contains(
            "its dead-letter queue arn:aws:sqs:eu-west-1:123456789012:orders-dlq.fifo is not in what was read"
        )),
        "{:#?}",
        report.advice
    );

    // Not a FIFO queue.
    dir.edit("main.tf", "orders-dlq.fifo\"", "orders-dlq\"");
    dir.edit("iam.tf", "orders-dlq.fifo\"", "orders-dlq\"");
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::SqsFifoMissingRedrive, "{v}");
    assert!(
        v.message.contains(
            "dead-letter queue arn:aws:sqs:eu-west-1:123456789012:orders-dlq is not a FIFO queue"
        ),
        "{}",
        v.message
    );
}

/// A Resource given as an ARN pattern names the queue (AWS IAM: "You can use wildcard characters (* and ?)
/// within the individual segments of an ARN"): `"${aws_sqs_queue.main.arn}*"`, `arn:aws:sqs:*:*:NAME`, `*`.
#[test]
fn worker_policy_with_arn_patterns() {
    let dir = copy_of(&aws_sample(), "iam-arn-pattern");
    dir.edit(
        "iam.tf",
        "resources = [aws_sqs_queue.main.arn]\n  }\n\n  statement {\n    sid       = \"ForwardToDeadLetterQueue\"",
        "resources = [\"${aws_sqs_queue.main.arn}*\"]\n  }\n\n  statement {\n    sid       = \"ForwardToDeadLetterQueue\"",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        !report.advice.iter().any(|a| a.contains("no IAM policy")),
        "{:#?}",
        report.advice
    );
    // The pattern is read as naming the queue: a missing action on it is found.
    dir.edit("iam.tf", "      \"sqs:DeleteMessage\",\n", "");
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::SqsWorkerPolicyMissingAction, "{v}");
    assert!(
        v.message
            .contains("does not grant sqs:DeleteMessage on aws_sqs_queue.main"),
        "{}",
        v.message
    );
    for pattern in [r#""arn:aws:sqs:*:*:txinbox-orders.fifo""#, r#""*""#] {
        let text = dir
            .read("iam.tf")
            .replace(r#""${aws_sqs_queue.main.arn}*""#, pattern);
        let dir = copy_of(&aws_sample(), "iam-arn-pattern-2");
        dir.write("iam.tf", &text);
        let v = only_violation(&dir, &WorkerSettings::default());
        assert!(
            v.message
                .contains("does not grant sqs:DeleteMessage on aws_sqs_queue.main"),
            "{pattern}: {}",
            v.message
        );
    }
}

/// A Resource that cannot be resolved statically (a variable without a default) may or may not name the
/// queue: neither a violation nor a clean pass, but advice saying what is not known.
#[test]
fn worker_policy_with_an_unresolved_resource() {
    let dir = copy_of(&aws_sample(), "iam-unresolved");
    dir.edit(
        "iam.tf",
        "resources = [aws_sqs_queue.dlq.arn]",
        "resources = [var.dlq_arn]",
    );
    let text = dir.read("variables.tf") + "\nvariable \"dlq_arn\" {\n  type = string\n}\n";
    dir.write("variables.tf", &text);
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report.advice.iter().any(|a| a.contains(
            "data.aws_iam_policy_document.worker: whether this policy grants sqs:SendMessage, sqs:GetQueueUrl, sqs:GetQueueAttributes on the dead-letter queue aws_sqs_queue.dlq is not known statically (an Allow statement may grant it: iam.tf:"
        ) && a.contains("resources of data.aws_iam_policy_document.worker cannot be resolved statically")),
        "{:#?}",
        report.advice
    );

    // A Deny whose resource cannot be resolved makes a granted action uncertain, not refused.
    dir.edit(
        "iam.tf",
        "resources = [var.dlq_arn]",
        "resources = [aws_sqs_queue.dlq.arn]",
    );
    dir.edit(
        "iam.tf",
        "    resources = [aws_sqs_queue.dlq.arn]\n  }\n",
        "    resources = [aws_sqs_queue.dlq.arn]\n  }\n  statement {\n    effect    = \"Deny\"\n    actions   = [\"sqs:DeleteMessage\"]\n    resources = [var.dlq_arn]\n  }\n",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report.advice.iter().any(|a| a.contains(
            "whether this policy grants sqs:DeleteMessage on aws_sqs_queue.main is not known statically (a Deny statement may refuse it"
        )),
        "{:#?}",
        report.advice
    );
}

/// A dead-letter queue given as a literal ARN: the worker's actions on it are checked against that ARN.
#[test]
fn worker_policy_on_a_dead_letter_queue_given_by_a_literal_arn() {
    let dir = copy_of(&aws_sample(), "external-dlq-iam");
    let arn = "arn:aws:sqs:eu-west-1:123456789012:orders-dlq.fifo";
    dir.edit(
        "main.tf",
        "    deadLetterTargetArn = aws_sqs_queue.dlq.arn\n",
        &format!("    deadLetterTargetArn = \"{arn}\"\n"),
    );
    // The policy still names the sample's own dead-letter queue, not the one the queue moves messages to.
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::SqsWorkerPolicyMissingAction, "{v}");
    assert!(
        v.message.contains(&format!(
            "does not grant sqs:SendMessage, sqs:GetQueueUrl, sqs:GetQueueAttributes on the dead-letter queue {arn}"
        )),
        "{}",
        v.message
    );
    // Named by the same ARN, or by a pattern matching it: clean.
    for resource in [
        format!("\"{arn}\""),
        "\"arn:aws:sqs:*:123456789012:orders-dlq*\"".to_owned(),
    ] {
        let text = dir.read("iam.tf").replace(
            "resources = [aws_sqs_queue.dlq.arn]",
            &format!("resources = [{resource}]"),
        );
        let other = copy_of(&aws_sample(), "external-dlq-iam-2");
        other.write("main.tf", &dir.read("main.tf"));
        other.write("iam.tf", &text);
        let report = check_dir(other.path(), &WorkerSettings::default()).unwrap();
        assert!(report.is_clean(), "{resource}: {:#?}", report.violations);
    }
}

/// `source_policy_documents` and `override_policy_documents` are merged as the AWS provider documents it:
/// source statements first, the document's own replacing a source statement of the same sid, override
/// statements replacing any of the same sid; a document that cannot be read is advice.
#[test]
fn worker_policy_merged_from_source_and_override_documents() {
    let dir = copy_of(&aws_sample(), "iam-merge");
    let base = r#"
data "aws_iam_policy_document" "base" {
  statement {
    sid       = "NoDelete"
    effect    = "Deny"
    actions   = ["sqs:DeleteMessage"]
    resources = ["*"]
  }
}
"#;
    let text = dir.read("iam.tf").replacen(
        "data \"aws_iam_policy_document\" \"worker\" {\n",
        "data \"aws_iam_policy_document\" \"worker\" {\n  source_policy_documents = [data.aws_iam_policy_document.base.json]\n",
        1,
    ) + base;
    dir.write("iam.tf", &text);
    // The Deny merged in from the source document refuses DeleteMessage.
    let v = only_violation(&dir, &WorkerSettings::default());
    assert_eq!(v.rule, RuleId::SqsWorkerPolicyMissingAction, "{v}");
    assert_eq!(v.resource, "data.aws_iam_policy_document.worker");
    assert!(
        v.message
            .contains("does not grant sqs:DeleteMessage on aws_sqs_queue.main"),
        "{}",
        v.message
    );

    // The document's own statement of the same sid replaces the source's.
    let own = text.replacen(
        "  statement {\n    sid       = \"ForwardToDeadLetterQueue\"",
        "  statement {\n    sid       = \"NoDelete\"\n    actions   = [\"sqs:ListQueues\"]\n    resources = [\"*\"]\n  }\n\n  statement {\n    sid       = \"ForwardToDeadLetterQueue\"",
        1,
    );
    dir.write("iam.tf", &own);
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);

    // An override document's statement replaces the document's own of the same sid.
    let overridden = text
        .replace(
            "source_policy_documents = [data.aws_iam_policy_document.base.json]",
            "override_policy_documents = [data.aws_iam_policy_document.base.json]",
        )
        .replace(
            "sid       = \"NoDelete\"",
            "sid       = \"ConsumeMainQueue\"",
        );
    dir.write("iam.tf", &overridden);
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    // The worker's ConsumeMainQueue is replaced by the Deny: no policy receives from the queue any more.
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report.advice.iter().any(|a| a.contains(
            "aws_sqs_queue.main: no IAM policy in what was read grants sqs:ReceiveMessage on this queue"
        )),
        "{:#?}",
        report.advice
    );

    // A JSON override document without a sid is added: its Deny counts.
    let json = text.replace(
        "source_policy_documents = [data.aws_iam_policy_document.base.json]",
        r#"override_policy_documents = [jsonencode({ Statement = [{ Effect = "Deny", Action = "sqs:GetQueueUrl", Resource = "*" }] })]"#,
    );
    dir.write("iam.tf", &json);
    let v = only_violation(&dir, &WorkerSettings::default());
    assert!(
        v.message
            .contains("does not grant sqs:GetQueueUrl on the dead-letter queue aws_sqs_queue.dlq"),
        "{}",
        v.message
    );

    // A document that cannot be read: advice, not a violation nor a clean pass.
    let unknown = text.replace(
        "source_policy_documents = [data.aws_iam_policy_document.base.json]",
        "source_policy_documents = [var.base_policy]",
    );
    dir.write("iam.tf", &unknown);
    dir.write(
        "variables.tf",
        &(dir.read("variables.tf") + "\nvariable \"base_policy\" {\n  type = string\n}\n"),
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report.advice.iter().any(|a| a.contains(
            "source_policy_documents of data.aws_iam_policy_document.worker cannot be resolved statically"
        )),
        "{:#?}",
        report.advice
    );
}

/// An Allow with a condition may not grant at runtime: the actions only it grants are advice ("granted only
/// under a condition"), neither a clean pass nor a violation.
#[test]
fn worker_policy_granting_under_a_condition() {
    let dir = copy_of(&aws_sample(), "iam-conditional-allow");
    dir.edit(
        "iam.tf",
        "    resources = [aws_sqs_queue.dlq.arn]\n  }\n",
        "    resources = [aws_sqs_queue.dlq.arn]\n    condition {\n      test     = \"StringEquals\"\n      variable = \"aws:PrincipalTag/team\"\n      values   = [\"orders\"]\n    }\n  }\n",
    );
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report.advice.iter().any(|a| a.contains(
            "data.aws_iam_policy_document.worker: this policy grants sqs:SendMessage, sqs:GetQueueUrl, sqs:GetQueueAttributes on the dead-letter queue aws_sqs_queue.dlq only under a condition (statement \"ForwardToDeadLetterQueue\"): check it holds for the worker's requests"
        )),
        "{:#?}",
        report.advice
    );
}

/// A policy whose JSON cannot be resolved statically (a variable without a default inside `jsonencode`) may
/// grant or refuse anything: advice saying so, not silence.
#[test]
fn worker_policy_that_cannot_be_resolved() {
    let dir = copy_of(&aws_sample(), "iam-unresolved-policy");
    dir.write(
        "iam.tf",
        r#"resource "aws_iam_policy" "worker" {
  name = "worker"
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      { Effect = "Allow", Action = "sqs:*", Resource = [aws_sqs_queue.main.arn, var.dlq_arn] },
    ]
  })
}
"#,
    );
    let text = dir.read("variables.tf") + "\nvariable \"dlq_arn\" {\n  type = string\n}\n";
    dir.write("variables.tf", &text);
    let report = check_dir(dir.path(), &WorkerSettings::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report.advice.iter().any(|a| a.contains(
            "aws_iam_policy.worker: whether this policy grants sqs:ReceiveMessage on aws_sqs_queue.main is not known statically"
        ) && a.contains("policy of aws_iam_policy.worker cannot be resolved statically")),
        "{:#?}",
        report.advice
    );
}

/// A value quoted from the Terraform (here a dead-letter queue's literal ARN) reaches the CI log with its
/// control characters escaped: an ESC sequence, a carriage return or a line break in a pull request's string
/// can neither rewrite the log's line nor forge a line of the report (a fake "check-infra: ok").
#[test]
fn quoted_values_are_written_with_control_characters_escaped() {
    let dir = copy_of(&aws_sample(), "hostile-arn");
    dir.edit(
        "main.tf",
        "    deadLetterTargetArn = aws_sqs_queue.dlq.arn\n",
        "    deadLetterTargetArn = \"arn:aws:sqs:eu-west-1:123456789012:dlq\\u001b[2K\\rcheck-infra: ok, no violation\\n\\u0007x\\u202e\"\n",
    );
    let mut out = Vec::new();
    let clean = run_cli(dir.path(), None, &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(!clean, "{out}");
    assert!(
        !out.contains(['\u{1b}', '\r', '\u{7}', '\u{202e}']),
        "{out:?}"
    );
    assert!(
        out.contains(
            r"dlq\u{1b}[2K\rcheck-infra: ok, no violation\n\u{7}x\u{202e} is not a FIFO queue"
        ),
        "{out}"
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[..lines.len() - 1]
            .iter()
            .all(|l| !l.starts_with("check-infra:") && !l.starts_with('\u{7}')),
        "{out}"
    );
    assert!(
        lines[lines.len() - 1].starts_with("check-infra: 2 violations in "),
        "{out}"
    );
}
